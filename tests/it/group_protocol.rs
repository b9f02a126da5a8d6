//! The group APIs on the wire, with hand-made requests (the `kafka-protocol` codec): every
//! advertised version of every group API, the error codes a Kafka broker returns for bad
//! input, and the cases that tripped clients of other brokers (JoinGroup v0, a member id
//! never used, followers' SyncGroup before the leader's, OffsetCommit v2 / OffsetFetch v1).

use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::delete_groups_response::DeleteGroupsResponse;
use kafka_protocol::messages::describe_groups_request::DescribeGroupsRequest;
use kafka_protocol::messages::describe_groups_response::DescribeGroupsResponse;
use kafka_protocol::messages::find_coordinator_request::FindCoordinatorRequest;
use kafka_protocol::messages::find_coordinator_response::FindCoordinatorResponse;
use kafka_protocol::messages::heartbeat_request::HeartbeatRequest;
use kafka_protocol::messages::heartbeat_response::HeartbeatResponse;
use kafka_protocol::messages::join_group_request::{JoinGroupRequest, JoinGroupRequestProtocol};
use kafka_protocol::messages::join_group_response::JoinGroupResponse;
use kafka_protocol::messages::leave_group_request::{LeaveGroupRequest, MemberIdentity};
use kafka_protocol::messages::leave_group_response::LeaveGroupResponse;
use kafka_protocol::messages::list_groups_request::ListGroupsRequest;
use kafka_protocol::messages::list_groups_response::ListGroupsResponse;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_commit_response::OffsetCommitResponse;
use kafka_protocol::messages::offset_delete_request::{
    OffsetDeleteRequest, OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
};
use kafka_protocol::messages::offset_delete_response::OffsetDeleteResponse;
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequest, OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::offset_fetch_response::OffsetFetchResponse;
use kafka_protocol::messages::sync_group_request::{SyncGroupRequest, SyncGroupRequestAssignment};
use kafka_protocol::messages::sync_group_response::SyncGroupResponse;
use kafka_protocol::messages::{CreateTopicsRequest, DeleteGroupsRequest, GroupId, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::harness::{decode, RawConn, TestBroker};

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn group(v: &str) -> GroupId {
    GroupId(s(v))
}

fn create_topic(conn: &mut RawConn, name: &str, partitions: i32) {
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    let req = CreateTopicsRequest::default().with_topics(vec![CreatableTopic::default()
        .with_name(TopicName(s(name)))
        .with_num_partitions(partitions)
        .with_replication_factor(1)]);
    conn.request(&req, 5, 1).expect("CreateTopics answered");
}

fn join_request(version: i16, g: &str, member_id: &str, session_ms: i32) -> JoinGroupRequest {
    let mut r = JoinGroupRequest::default()
        .with_group_id(group(g))
        .with_session_timeout_ms(session_ms)
        .with_member_id(s(member_id))
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![JoinGroupRequestProtocol::default()
            .with_name(s("range"))
            .with_metadata(Bytes::from_static(b"subscription"))]);
    if version >= 1 {
        r = r.with_rebalance_timeout_ms(session_ms);
    }
    r
}

fn join(conn: &mut RawConn, version: i16, req: &JoinGroupRequest) -> JoinGroupResponse {
    decode(
        conn.request(req, version, 7).expect("JoinGroup answered"),
        version,
    )
}

/// A member of a one-member group, joined at `version` (v4+: MEMBER_ID_REQUIRED first).
fn join_alone(conn: &mut RawConn, version: i16, g: &str) -> JoinGroupResponse {
    let mut req = join_request(version, g, "", 10_000);
    let mut r = join(conn, version, &req);
    if version >= 4 {
        assert_eq!(r.error_code, 79, "v{version}: MEMBER_ID_REQUIRED first");
        assert!(!r.member_id.is_empty());
        req = req.with_member_id(r.member_id.clone());
        r = join(conn, version, &req);
    }
    assert_eq!(r.error_code, 0, "JoinGroup v{version}");
    r
}

fn sync(
    conn: &mut RawConn,
    version: i16,
    g: &str,
    generation: i32,
    member_id: &StrBytes,
    assignments: Vec<(StrBytes, &'static [u8])>,
) -> SyncGroupResponse {
    let mut req = SyncGroupRequest::default()
        .with_group_id(group(g))
        .with_generation_id(generation)
        .with_member_id(member_id.clone())
        .with_assignments(
            assignments
                .into_iter()
                .map(|(m, a)| {
                    SyncGroupRequestAssignment::default()
                        .with_member_id(m)
                        .with_assignment(Bytes::from_static(a))
                })
                .collect(),
        );
    if version >= 5 {
        req = req
            .with_protocol_type(Some(s("consumer")))
            .with_protocol_name(Some(s("range")));
    }
    decode(
        conn.request(&req, version, 8).expect("SyncGroup answered"),
        version,
    )
}

fn commit(
    conn: &mut RawConn,
    version: i16,
    g: &str,
    (generation, member_id): (i32, &StrBytes),
    topic: &str,
    offset: i64,
    metadata: &str,
) -> i16 {
    let mut p = OffsetCommitRequestPartition::default()
        .with_partition_index(0)
        .with_committed_offset(offset)
        .with_committed_metadata(Some(s(metadata)));
    if version >= 6 {
        p = p.with_committed_leader_epoch(0);
    }
    let req = OffsetCommitRequest::default()
        .with_group_id(group(g))
        .with_generation_id_or_member_epoch(generation)
        .with_member_id(member_id.clone())
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(s(topic)))
            .with_partitions(vec![p])]);
    let r: OffsetCommitResponse = decode(
        conn.request(&req, version, 9)
            .expect("OffsetCommit answered"),
        version,
    );
    r.topics[0].partitions[0].error_code
}

/// The committed offset and metadata of partition 0 of `topic`, fetched at `version`.
fn fetch_offset(conn: &mut RawConn, version: i16, g: &str, topic: &str) -> (i64, String) {
    let req = if version >= 8 {
        OffsetFetchRequest::default().with_groups(vec![OffsetFetchRequestGroup::default()
            .with_group_id(group(g))
            .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                .with_name(TopicName(s(topic)))
                .with_partition_indexes(vec![0])]))])
    } else {
        OffsetFetchRequest::default()
            .with_group_id(group(g))
            .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                .with_name(TopicName(s(topic)))
                .with_partition_indexes(vec![0])]))
    };
    let r: OffsetFetchResponse = decode(
        conn.request(&req, version, 10)
            .expect("OffsetFetch answered"),
        version,
    );
    if version >= 8 {
        let p = &r.groups[0].topics[0].partitions[0];
        assert_eq!(p.error_code, 0);
        (p.committed_offset, p.metadata.as_ref().unwrap().to_string())
    } else {
        let p = &r.topics[0].partitions[0];
        assert_eq!(p.error_code, 0);
        (p.committed_offset, p.metadata.as_ref().unwrap().to_string())
    }
}

fn heartbeat(conn: &mut RawConn, version: i16, g: &str, generation: i32, member: &StrBytes) -> i16 {
    let req = HeartbeatRequest::default()
        .with_group_id(group(g))
        .with_generation_id(generation)
        .with_member_id(member.clone());
    let r: HeartbeatResponse = decode(
        conn.request(&req, version, 11).expect("Heartbeat answered"),
        version,
    );
    r.error_code
}

fn describe(conn: &mut RawConn, version: i16, g: &str) -> DescribeGroupsResponse {
    let req = DescribeGroupsRequest::default().with_groups(vec![group(g)]);
    decode(
        conn.request(&req, version, 12)
            .expect("DescribeGroups answered"),
        version,
    )
}

/// Every version of every group API the broker advertises, on one-member groups: join,
/// sync, heartbeat, commit with metadata, fetch it back, describe, list, leave, delete.
/// (OffsetCommit v0–v1 and OffsetFetch v0 have no codec in the crate: the next test sends
/// them by hand.)
#[test]
fn every_advertised_version_of_the_group_apis_works() {
    let b = TestBroker::start_with(&["group.initial.rebalance.delay.ms=0"]);
    let mut conn = RawConn::connect(&b.bootstrap);
    create_topic(&mut conn, "versions", 1);
    for v in 0..=6i16 {
        let keys = if v >= 4 {
            vec![s("g"), s("h")]
        } else {
            Vec::new()
        };
        let req = FindCoordinatorRequest::default()
            .with_key(if v < 4 { s("g") } else { StrBytes::default() })
            .with_coordinator_keys(keys);
        let r: FindCoordinatorResponse = decode(conn.request(&req, v, 2).unwrap(), v);
        if v >= 4 {
            assert_eq!(r.coordinators.len(), 2);
            assert!(r
                .coordinators
                .iter()
                .all(|c| c.error_code == 0 && c.node_id.0 == 1));
        } else {
            assert_eq!((r.error_code, r.node_id.0), (0, 1), "FindCoordinator v{v}");
            assert_eq!(format!("127.0.0.1:{}", r.port), b.bootstrap);
        }
    }
    for v in 0..=9i16 {
        let g = format!("group-v{v}");
        let joined = join_alone(&mut conn, v, &g);
        assert_eq!(joined.leader, joined.member_id);
        assert_eq!(joined.members.len(), 1);
        assert_eq!(
            joined.members[0].metadata,
            Bytes::from_static(b"subscription")
        );
        assert_eq!(
            joined.protocol_name.as_ref().map(|p| p.to_string()),
            Some("range".into())
        );
        let sv = v.min(5);
        let synced = sync(
            &mut conn,
            sv,
            &g,
            joined.generation_id,
            &joined.member_id,
            vec![(joined.member_id.clone(), b"assignment")],
        );
        assert_eq!(synced.error_code, 0, "SyncGroup v{sv}");
        assert_eq!(synced.assignment, Bytes::from_static(b"assignment"));
        assert_eq!(
            heartbeat(
                &mut conn,
                v.min(4),
                &g,
                joined.generation_id,
                &joined.member_id
            ),
            0
        );
        let cv = v.clamp(2, 9);
        let meta = format!("meta-{v}");
        let e = commit(
            &mut conn,
            cv,
            &g,
            (joined.generation_id, &joined.member_id),
            "versions",
            100 + i64::from(v),
            &meta,
        );
        assert_eq!(e, 0, "OffsetCommit v{cv}");
        let fv = v.clamp(1, 9);
        assert_eq!(
            fetch_offset(&mut conn, fv, &g, "versions"),
            (100 + i64::from(v), meta),
            "OffsetFetch v{fv}"
        );
        let d = describe(&mut conn, v.min(6), &g);
        assert_eq!(d.groups[0].error_code, 0);
        assert_eq!(d.groups[0].group_state.to_string(), "Stable");
        assert_eq!(
            d.groups[0].members[0].member_assignment,
            Bytes::from_static(b"assignment")
        );
        let lv = v.min(5);
        let leave = if lv >= 3 {
            LeaveGroupRequest::default()
                .with_group_id(group(&g))
                .with_members(vec![
                    MemberIdentity::default().with_member_id(joined.member_id.clone())
                ])
        } else {
            LeaveGroupRequest::default()
                .with_group_id(group(&g))
                .with_member_id(joined.member_id.clone())
        };
        let r: LeaveGroupResponse = decode(conn.request(&leave, lv, 13).unwrap(), lv);
        assert_eq!(r.error_code, 0, "LeaveGroup v{lv}");
        if lv >= 3 {
            assert_eq!(r.members[0].error_code, 0);
        }
        assert_eq!(
            describe(&mut conn, 5, &g).groups[0].group_state.to_string(),
            "Empty"
        );
    }
    for v in 0..=5i16 {
        let mut req = ListGroupsRequest::default();
        if v >= 4 {
            req = req.with_states_filter(vec![s("empty")]);
        }
        let r: ListGroupsResponse = decode(conn.request(&req, v, 14).unwrap(), v);
        assert_eq!(r.error_code, 0);
        let names: Vec<String> = r.groups.iter().map(|g| g.group_id.0.to_string()).collect();
        for i in 0..=9 {
            assert!(
                names.contains(&format!("group-v{i}")),
                "ListGroups v{v}: {names:?}"
            );
        }
        if v >= 4 {
            assert!(r.groups.iter().all(|g| g.group_state.as_str() == "Empty"));
        }
    }
    let req = OffsetDeleteRequest::default()
        .with_group_id(group("group-v0"))
        .with_topics(vec![OffsetDeleteRequestTopic::default()
            .with_name(TopicName(s("versions")))
            .with_partitions(vec![
                OffsetDeleteRequestPartition::default().with_partition_index(0)
            ])]);
    let r: OffsetDeleteResponse = decode(conn.request(&req, 0, 15).unwrap(), 0);
    assert_eq!((r.error_code, r.topics[0].partitions[0].error_code), (0, 0));
    assert_eq!(fetch_offset(&mut conn, 1, "group-v0", "versions").0, -1);
    for v in 0..=2i16 {
        let g = format!("group-v{v}");
        let req = DeleteGroupsRequest::default().with_groups_names(vec![group(&g)]);
        let r: DeleteGroupsResponse = decode(conn.request(&req, v, 16).unwrap(), v);
        assert_eq!(r.results[0].error_code, 0, "DeleteGroups v{v}");
        let d = describe(&mut conn, 6, &g);
        assert_eq!(
            d.groups[0].error_code, 69,
            "deleted group is GROUP_ID_NOT_FOUND"
        );
    }
}

/// Issue case 7: bad input gets Kafka's error codes.
#[test]
fn bad_group_requests_get_kafkas_error_codes() {
    let b = TestBroker::start_with(&["group.initial.rebalance.delay.ms=0"]);
    let mut conn = RawConn::connect(&b.bootstrap);
    create_topic(&mut conn, "known", 1);
    // A consumer-protocol subscription (v0: topics ["known"], no user data).
    let subscription: &'static [u8] = b"\x00\x00\x00\x00\x00\x01\x00\x05known\xff\xff\xff\xff";
    let req =
        join_request(3, "bad", "", 10_000)
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(s("range"))
                .with_metadata(Bytes::from_static(subscription))]);
    let joined = join(&mut conn, 3, &req);
    assert_eq!(joined.error_code, 0);
    let generation = joined.generation_id;
    let member = joined.member_id.clone();
    let synced = sync(
        &mut conn,
        5,
        "bad",
        generation,
        &member,
        vec![(member.clone(), b"a")],
    );
    assert_eq!(synced.error_code, 0);
    // OffsetCommit for a topic that does not exist: UNKNOWN_TOPIC_OR_PARTITION.
    assert_eq!(
        commit(
            &mut conn,
            8,
            "bad",
            (generation, &member),
            "no-such-topic",
            1,
            ""
        ),
        3
    );
    // A wrong generation: ILLEGAL_GENERATION.
    assert_eq!(
        commit(
            &mut conn,
            8,
            "bad",
            (generation + 5, &member),
            "known",
            1,
            ""
        ),
        22
    );
    // An unknown member: UNKNOWN_MEMBER_ID.
    assert_eq!(
        commit(
            &mut conn,
            8,
            "bad",
            (generation, &s("ghost")),
            "known",
            1,
            ""
        ),
        25
    );
    // Metadata over offset.metadata.max.bytes (4096): OFFSET_METADATA_TOO_LARGE.
    assert_eq!(
        commit(
            &mut conn,
            8,
            "bad",
            (generation, &member),
            "known",
            1,
            &"m".repeat(5000)
        ),
        12
    );
    // JoinGroup without protocols: INCONSISTENT_GROUP_PROTOCOL.
    let r = join(
        &mut conn,
        5,
        &join_request(5, "bad2", "", 10_000).with_protocols(Vec::new()),
    );
    assert_eq!(r.error_code, 23);
    // A session timeout below group.min.session.timeout.ms: INVALID_SESSION_TIMEOUT.
    assert_eq!(
        join(&mut conn, 5, &join_request(5, "bad2", "", 10)).error_code,
        26
    );
    // An empty group id: INVALID_GROUP_ID.
    assert_eq!(
        join(&mut conn, 5, &join_request(5, "", "", 10_000)).error_code,
        24
    );
    // Heartbeat and SyncGroup with a wrong generation / unknown member.
    assert_eq!(heartbeat(&mut conn, 4, "bad", generation + 1, &member), 22);
    assert_eq!(heartbeat(&mut conn, 4, "bad", generation, &s("ghost")), 25);
    assert_eq!(heartbeat(&mut conn, 4, "nonexistent", 1, &s("ghost")), 25);
    assert_eq!(
        sync(&mut conn, 5, "bad", generation + 1, &member, vec![]).error_code,
        22
    );
    // DescribeGroups of an unknown group: Dead with no error before v6, GROUP_ID_NOT_FOUND
    // from v6 (KIP-1043).
    let d = describe(&mut conn, 5, "nonexistent");
    assert_eq!(
        (d.groups[0].error_code, d.groups[0].group_state.as_str()),
        (0, "Dead")
    );
    assert_eq!(
        describe(&mut conn, 6, "nonexistent").groups[0].error_code,
        69
    );
    // Deleting a group with members: NON_EMPTY_GROUP; an unknown one: GROUP_ID_NOT_FOUND.
    let req = DeleteGroupsRequest::default().with_groups_names(vec![group("bad"), group("nope")]);
    let r: DeleteGroupsResponse = decode(conn.request(&req, 2, 3).unwrap(), 2);
    let codes: Vec<i16> = r.results.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, vec![68, 69]);
    // OffsetDelete of a topic a member subscribes to: GROUP_SUBSCRIBED_TO_TOPIC.
    let req = OffsetDeleteRequest::default()
        .with_group_id(group("bad"))
        .with_topics(vec![OffsetDeleteRequestTopic::default()
            .with_name(TopicName(s("known")))
            .with_partitions(vec![
                OffsetDeleteRequestPartition::default().with_partition_index(0)
            ])]);
    let r: OffsetDeleteResponse = decode(conn.request(&req, 0, 4).unwrap(), 0);
    assert_eq!(
        (r.error_code, r.topics[0].partitions[0].error_code),
        (0, 86)
    );
    // A transactional id's coordinator is this broker (the leader of its
    // `__transaction_state` partition, created by this first request); a key type that
    // is neither a group (0) nor a transactional id (1) is INVALID_REQUEST.
    let req = FindCoordinatorRequest::default()
        .with_key(s("txn-id"))
        .with_key_type(1);
    let r: FindCoordinatorResponse = decode(conn.request(&req, 3, 5).unwrap(), 3);
    assert_eq!((r.error_code, r.node_id.0), (0, 1));
    let req = FindCoordinatorRequest::default()
        .with_key(s("other"))
        .with_key_type(2);
    let r: FindCoordinatorResponse = decode(conn.request(&req, 3, 6).unwrap(), 3);
    assert_eq!(r.error_code, 42);
    // None of this closed the connection or disturbed the member.
    assert_eq!(heartbeat(&mut conn, 4, "bad", generation, &member), 0);
}

/// JoinGroup v0 has no rebalance timeout: the session timeout serves as one. A member that
/// never rejoins is dropped after it and the rebalance completes.
#[test]
fn join_group_v0_uses_the_session_timeout_as_rebalance_timeout() {
    let b = TestBroker::start_with(&["group.initial.rebalance.delay.ms=0"]);
    let mut first = RawConn::connect(&b.bootstrap);
    let mut second = RawConn::connect(&b.bootstrap);
    let a = join(&mut first, 0, &join_request(0, "v0", "", 6000));
    assert_eq!((a.error_code, a.generation_id), (0, 1));
    // The second member starts a rebalance; the first never rejoins (nor heartbeats).
    let started = Instant::now();
    let r = join(&mut second, 0, &join_request(0, "v0", "", 6000));
    assert_eq!(r.error_code, 0);
    assert_eq!(r.generation_id, 2);
    assert_eq!(r.members.len(), 1, "the silent member was removed");
    assert_eq!(r.leader, r.member_id);
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// KIP-394: a client that receives MEMBER_ID_REQUIRED and never comes back does not hold
/// the rebalance hostage beyond its session timeout.
#[test]
fn a_member_id_never_used_does_not_hold_the_rebalance() {
    let b = TestBroker::start_with(&["group.initial.rebalance.delay.ms=0"]);
    let mut ghost = RawConn::connect(&b.bootstrap);
    let mut real = RawConn::connect(&b.bootstrap);
    let g = join(&mut ghost, 5, &join_request(5, "hostage", "", 6000));
    assert_eq!(g.error_code, 79);
    let first = join(&mut real, 5, &join_request(5, "hostage", "", 6000));
    assert_eq!(first.error_code, 79);
    let r = join(
        &mut real,
        5,
        &join_request(5, "hostage", "", 6000).with_member_id(first.member_id.clone()),
    );
    assert_eq!(r.error_code, 0);
    assert_eq!(r.members.len(), 1);
    assert_eq!(r.leader, first.member_id);
}

/// Followers' SyncGroup is answered only once the leader's has delivered the assignment —
/// never early with an empty one.
#[test]
fn follower_sync_waits_for_the_leader() {
    // 3 s: both joins land in the first generation even on a loaded machine (at 1 s one
    // once arrived after it had completed, and got generation 2).
    let b = TestBroker::start_with(&["group.initial.rebalance.delay.ms=3000"]);
    let bootstrap = b.bootstrap.clone();
    let follower_thread = std::thread::spawn(move || {
        let mut conn = RawConn::connect(&bootstrap);
        let j = join(&mut conn, 3, &join_request(3, "sync", "", 10_000));
        (conn, j)
    });
    let mut leader_conn = RawConn::connect(&b.bootstrap);
    let j1 = join(&mut leader_conn, 3, &join_request(3, "sync", "", 10_000));
    let (follower_conn, j2) = follower_thread.join().unwrap();
    assert_eq!((j1.error_code, j2.error_code), (0, 0));
    assert_eq!(j1.generation_id, j2.generation_id);
    let (mut leader, mut leader_join, mut follower, mut follower_join) =
        (leader_conn, j1, follower_conn, j2);
    if leader_join.members.is_empty() {
        std::mem::swap(&mut leader, &mut follower);
        std::mem::swap(&mut leader_join, &mut follower_join);
    }
    let generation = follower_join.generation_id;
    let follower_id = follower_join.member_id.clone();
    let waiting = std::thread::spawn(move || {
        let r = sync(&mut follower, 5, "sync", generation, &follower_id, vec![]);
        (Instant::now(), r)
    });
    // Proves an absence (the follower is not answered yet): a sleep, not a poll.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !waiting.is_finished(),
        "the follower was answered before the leader synced"
    );
    let leader_sent = Instant::now();
    let r = sync(
        &mut leader,
        5,
        "sync",
        generation,
        &leader_join.member_id,
        vec![
            (leader_join.member_id.clone(), b"for-leader"),
            (follower_join.member_id.clone(), b"for-follower"),
        ],
    );
    assert_eq!(r.assignment, Bytes::from_static(b"for-leader"));
    let (answered, f) = waiting.join().unwrap();
    assert!(answered >= leader_sent);
    assert_eq!(f.error_code, 0);
    assert_eq!(f.assignment, Bytes::from_static(b"for-follower"));
}

/// A request frame built by hand: header v1 (api key, version, correlation id, client id)
/// and `body`, for versions the `kafka-protocol` crate has no codec for.
fn raw_request(conn: &mut RawConn, key: i16, version: i16, body: &[u8]) -> bytes::Bytes {
    use bytes::{Buf, BufMut};
    let mut frame = bytes::BytesMut::new();
    frame.put_i16(key);
    frame.put_i16(version);
    frame.put_i32(77);
    frame.put_i16(3);
    frame.put_slice(b"old");
    frame.put_slice(body);
    let mut out = (frame.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&frame);
    conn.send_raw(&out);
    let mut response = bytes::Bytes::from(conn.read_frame().expect("answered"));
    assert_eq!(response.get_i32(), 77, "correlation id");
    response
}

fn put_str(b: &mut bytes::BytesMut, v: &str) {
    use bytes::BufMut;
    b.put_i16(v.len() as i16);
    b.put_slice(v.as_bytes());
}

fn get_str(b: &mut bytes::Bytes) -> String {
    use bytes::Buf;
    let n = b.get_i16() as usize;
    String::from_utf8(b.split_to(n).to_vec()).unwrap()
}

/// OffsetCommit v0 and v1 and OffsetFetch v0 (Kafka 3.x still serves them; old clients
/// send them) commit and read back offsets with their metadata strings.
#[test]
fn old_offset_commit_and_fetch_versions_keep_offsets_and_metadata() {
    use bytes::{Buf, BufMut};
    let b = TestBroker::start_with(&["group.initial.rebalance.delay.ms=0"]);
    let mut conn = RawConn::connect(&b.bootstrap);
    create_topic(&mut conn, "old", 2);
    for (version, partition) in [(0i16, 0i32), (1, 1)] {
        let mut body = bytes::BytesMut::new();
        put_str(&mut body, "old-group");
        if version == 1 {
            body.put_i32(-1); // generation: a commit outside group management
            put_str(&mut body, "");
        }
        body.put_i32(1);
        put_str(&mut body, "old");
        body.put_i32(1);
        body.put_i32(partition);
        body.put_i64(40 + i64::from(version));
        if version == 1 {
            body.put_i64(-1); // commit timestamp, ignored
        }
        put_str(&mut body, &format!("meta-v{version}"));
        let mut r = raw_request(&mut conn, 8, version, &body);
        assert_eq!(r.get_i32(), 1, "topics");
        assert_eq!(get_str(&mut r), "old");
        assert_eq!(r.get_i32(), 1, "partitions");
        assert_eq!(
            (r.get_i32(), r.get_i16()),
            (partition, 0),
            "OffsetCommit v{version}"
        );
    }
    let mut body = bytes::BytesMut::new();
    put_str(&mut body, "old-group");
    body.put_i32(1);
    put_str(&mut body, "old");
    body.put_i32(2);
    body.put_i32(0);
    body.put_i32(1);
    let mut r = raw_request(&mut conn, 9, 0, &body);
    assert_eq!(r.get_i32(), 1);
    assert_eq!(get_str(&mut r), "old");
    assert_eq!(r.get_i32(), 2);
    for (partition, offset, metadata) in [(0, 40, "meta-v0"), (1, 41, "meta-v1")] {
        assert_eq!(r.get_i32(), partition);
        assert_eq!(r.get_i64(), offset);
        assert_eq!(get_str(&mut r), metadata);
        assert_eq!(r.get_i16(), 0);
    }
    assert!(
        !r.has_remaining(),
        "OffsetFetch v0 has no top-level error code"
    );
    // The same offsets through the current API.
    assert_eq!(
        fetch_offset(&mut conn, 8, "old-group", "old"),
        (40, "meta-v0".into())
    );
    // A truncated v1 body closes that connection only.
    let mut bad = RawConn::connect(&b.bootstrap);
    let mut frame = bytes::BytesMut::new();
    frame.put_i16(8);
    frame.put_i16(1);
    frame.put_i32(1);
    frame.put_i16(-1);
    put_str(&mut frame, "g");
    frame.put_i32(i32::MAX);
    let mut out = (frame.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&frame);
    bad.send_raw(&out);
    assert!(bad.is_closed_by_broker());
    assert_eq!(fetch_offset(&mut conn, 1, "old-group", "old").0, 40);
}
