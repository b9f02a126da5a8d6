//! The consumer protocol (KIP-848) through the coordinator: joins, incremental
//! revocation before assignment, epochs and fencing, sessions, static members, commits,
//! conversion from and to classic groups, reload. Virtual time (`start_paused`).

use std::collections::BTreeSet;

use super::consumer::{HeartbeatRequest, HeartbeatResult, Partitions};
use super::tests::{fixture, open_in};
use super::*;

fn join(group: &str, member: &str, topics: &[&str]) -> HeartbeatRequest {
    HeartbeatRequest {
        group_id: group.into(),
        member_id: member.into(),
        member_epoch: 0,
        rebalance_timeout_ms: 30_000,
        subscribed_topic_names: Some(topics.iter().map(|t| t.to_string()).collect()),
        owned: Some(Vec::new()),
        client_id: "c".into(),
        client_host: "/127.0.0.1".into(),
        ..HeartbeatRequest::default()
    }
}

/// A heartbeat at `epoch` saying the member holds `owned` partitions of "t".
fn beat(
    c: &GroupCoordinator,
    group: &str,
    member: &str,
    epoch: i32,
    owned: &[i32],
) -> HeartbeatResult {
    let id = c.metadata.image().topic("t").unwrap().id;
    c.consumer_heartbeat(&HeartbeatRequest {
        group_id: group.into(),
        member_id: member.into(),
        member_epoch: epoch,
        rebalance_timeout_ms: -1,
        owned: Some(vec![(id, owned.to_vec())]),
        ..HeartbeatRequest::default()
    })
}

/// The partitions of "t" in an answer's assignment.
fn parts(c: &GroupCoordinator, r: &HeartbeatResult) -> Option<BTreeSet<i32>> {
    let id = c.metadata.image().topic("t").unwrap().id;
    r.assignment.as_ref().map(|a| {
        a.iter()
            .filter(|(t, _)| *t == id)
            .flat_map(|(_, p)| p.iter().copied())
            .collect()
    })
}

fn set(p: &[i32]) -> Option<BTreeSet<i32>> {
    Some(p.iter().copied().collect())
}

#[tokio::test(start_paused = true)]
async fn a_second_member_gets_partitions_only_after_the_first_revokes_them() {
    let f = fixture(0);
    let c = &f.coord;
    let a = c.consumer_heartbeat(&join("g", "A", &["t"]));
    assert_eq!(a.error, None);
    assert_eq!(a.member_epoch, 1);
    assert_eq!(parts(c, &a), set(&[0, 1, 2, 3]));
    assert_eq!(c.list()[0].group_type, "consumer");
    assert_eq!(c.list()[0].state_name, "Stable");

    let b = c.consumer_heartbeat(&join("g", "B", &["t"]));
    assert_eq!(b.error, None);
    // B's partitions are still A's: B is at the new epoch with nothing yet.
    assert_eq!(b.member_epoch, 2);
    assert_eq!(parts(c, &b), set(&[]));
    assert_eq!(c.list()[0].state_name, "Reconciling");

    // A is told to give up two partitions first, keeping its epoch.
    let a = beat(c, "g", "A", 1, &[0, 1, 2, 3]);
    assert_eq!(a.error, None);
    assert_eq!(a.member_epoch, 1);
    let kept = parts(c, &a).unwrap();
    assert_eq!(kept.len(), 2);
    // Until A acknowledges, B gets nothing.
    let b = beat(c, "g", "B", 2, &[]);
    assert_eq!(b.member_epoch, 2);
    assert!(parts(c, &b).is_none_or(|p| p.is_empty()));
    // A acknowledges: it moves to the new epoch with what it kept...
    let kept: Vec<i32> = kept.into_iter().collect();
    let a = beat(c, "g", "A", 1, &kept);
    assert_eq!(a.member_epoch, 2);
    // ...and B gets the rest.
    let b = beat(c, "g", "B", 2, &[]);
    let theirs = parts(c, &b).unwrap();
    assert_eq!(theirs.len(), 2);
    assert!(theirs.iter().all(|p| !kept.contains(p)));
    let theirs: Vec<i32> = theirs.into_iter().collect();
    let b = beat(c, "g", "B", 2, &theirs);
    assert_eq!(b.assignment, None, "nothing changed: no assignment sent");
    assert_eq!(c.list()[0].state_name, "Stable");
    let d = c.consumer_describe("g").unwrap();
    assert_eq!(
        (d.group_epoch, d.assignment_epoch, d.state),
        (2, 2, "Stable")
    );
    assert_eq!(d.assignor_name, "uniform");
    for m in &d.members {
        assert_eq!(m.member_epoch, 2);
        assert_eq!(m.assignment, m.target_assignment);
    }
}

#[tokio::test(start_paused = true)]
async fn wrong_epochs_and_unknown_members_are_fenced() {
    let f = fixture(0);
    let c = &f.coord;
    let a = c.consumer_heartbeat(&join("g", "A", &["t"]));
    assert_eq!(a.member_epoch, 1);
    assert_eq!(
        beat(c, "g", "A", 5, &[0, 1, 2, 3]).error,
        Some(ResponseError::FencedMemberEpoch)
    );
    assert_eq!(
        beat(c, "g", "nobody", 1, &[]).error,
        Some(ResponseError::UnknownMemberId)
    );
    assert_eq!(
        beat(c, "other", "A", 1, &[]).error,
        Some(ResponseError::UnknownMemberId)
    );
    let mut bad = join("g", "C", &["t"]);
    bad.server_assignor = Some("sticky".into());
    assert_eq!(
        c.consumer_heartbeat(&bad).error,
        Some(ResponseError::UnsupportedAssignor)
    );
    let mut bad = join("g", "C", &[]);
    bad.subscribed_topic_names = None;
    assert_eq!(
        c.consumer_heartbeat(&bad).error,
        Some(ResponseError::InvalidRequest)
    );
    let mut bad = join("g", "C", &[]);
    bad.subscribed_topic_regex = Some("(".into());
    assert_eq!(
        c.consumer_heartbeat(&bad).error,
        Some(ResponseError::InvalidRegularExpression)
    );
    // A partial epoch-0 heartbeat of a known member (librdkafka sends those when its
    // subscription changes quickly) rejoins it, subscription unchanged.
    let partial = HeartbeatRequest {
        group_id: "g".into(),
        member_id: "A".into(),
        member_epoch: 0,
        rebalance_timeout_ms: -1,
        ..HeartbeatRequest::default()
    };
    let r = c.consumer_heartbeat(&partial);
    assert_eq!(r.error, None);
    assert_eq!(parts(c, &r), set(&[0, 1, 2, 3]));
    for (instance, rack) in [(Some(" "), None), (None, Some(""))] {
        let mut bad = join("g", "C", &["t"]);
        bad.instance_id = instance.map(str::to_string);
        bad.rack_id = rack.map(str::to_string);
        let r = c.consumer_heartbeat(&bad);
        assert_eq!(r.error, Some(ResponseError::InvalidRequest), "{r:?}");
    }
    // A refused join leaves no group behind.
    let mut bad = join("z", "C", &[]);
    bad.subscribed_topic_names = None;
    assert_eq!(
        c.consumer_heartbeat(&bad).error,
        Some(ResponseError::InvalidRequest)
    );
    assert_eq!(c.group_type("z"), None);
    let mut bad = join("", "C", &["t"]);
    bad.group_id.clear();
    assert_eq!(
        c.consumer_heartbeat(&bad).error,
        Some(ResponseError::InvalidRequest)
    );
}

#[tokio::test(start_paused = true)]
async fn a_silent_member_is_removed_after_its_session_and_the_other_gets_everything() {
    let f = fixture(0);
    let c = &f.coord;
    c.consumer_heartbeat(&join("g", "A", &["t"]));
    c.consumer_heartbeat(&join("g", "B", &["t"]));
    let a = beat(c, "g", "A", 1, &[0, 1, 2, 3]);
    let kept: Vec<i32> = parts(c, &a).unwrap().into_iter().collect();
    beat(c, "g", "A", 1, &kept);
    for _ in 0..10 {
        tokio::time::advance(Duration::from_secs(5)).await;
        let a = beat(
            c,
            "g",
            "A",
            c.consumer_describe("g").unwrap().members[0].member_epoch,
            &kept,
        );
        assert_eq!(a.error, None);
        c.expire(Instant::now());
    }
    let d = c.consumer_describe("g").unwrap();
    assert_eq!(d.members.len(), 1, "B timed out");
    let epoch = d.members[0].member_epoch;
    let a = beat(c, "g", "A", epoch, &kept);
    assert_eq!(parts(c, &a), set(&[0, 1, 2, 3]));
    assert!(a.member_epoch > epoch);
}

#[tokio::test(start_paused = true)]
async fn a_static_member_coming_back_keeps_its_partitions_without_a_rebalance() {
    let f = fixture(0);
    let c = &f.coord;
    let mut a = join("g", "A1", &["t"]);
    a.instance_id = Some("a".into());
    let r = c.consumer_heartbeat(&a);
    assert_eq!(parts(c, &r), set(&[0, 1, 2, 3]));
    // Another incarnation while the first is active: refused.
    let mut a2 = a.clone();
    a2.member_id = "A2".into();
    assert_eq!(
        c.consumer_heartbeat(&a2).error,
        Some(ResponseError::UnreleasedInstanceId)
    );
    // The first leaves for a while (-2), the second takes over its partitions.
    let mut leave = a.clone();
    leave.member_epoch = -2;
    assert_eq!(c.consumer_heartbeat(&leave).member_epoch, -2);
    let epoch = c.consumer_describe("g").unwrap().group_epoch;
    let r = c.consumer_heartbeat(&a2);
    assert_eq!(r.error, None);
    assert_eq!(parts(c, &r), set(&[0, 1, 2, 3]));
    assert_eq!(
        c.consumer_describe("g").unwrap().group_epoch,
        epoch,
        "no rebalance"
    );
    // The old incarnation is fenced.
    assert_eq!(
        beat(c, "g", "A1", 1, &[]).error,
        Some(ResponseError::UnknownMemberId)
    );
}

#[tokio::test(start_paused = true)]
async fn commits_check_the_member_epoch() {
    let f = fixture(0);
    let c = &f.coord;
    let a = c.consumer_heartbeat(&join("g", "A", &["t"]));
    let commit = |epoch: i32, member: &str| CommitRequest {
        group_id: "g".into(),
        generation_id: epoch,
        member_id: member.into(),
        group_instance_id: None,
        offsets: vec![OffsetToCommit {
            topic: "t".into(),
            partition: 0,
            offset: 7,
            leader_epoch: -1,
            metadata: None,
        }],
    };
    assert_eq!(c.commit(&commit(a.member_epoch, "A")), vec![None]);
    assert_eq!(
        c.commit(&commit(a.member_epoch + 1, "A")),
        vec![Some(ResponseError::StaleMemberEpoch)]
    );
    assert_eq!(
        c.commit(&commit(a.member_epoch, "B")),
        vec![Some(ResponseError::UnknownMemberId)]
    );
    // OffsetFetch v9 checks the same; -1 (an admin) is not checked.
    assert_eq!(c.validate_offset_fetch("g", "A", a.member_epoch), Ok(()));
    assert_eq!(
        c.validate_offset_fetch("g", "A", a.member_epoch + 1),
        Err(ResponseError::StaleMemberEpoch)
    );
    assert_eq!(c.validate_offset_fetch("g", "", -1), Ok(()));
    // A commit outside group management is refused while members are in.
    assert_eq!(
        c.commit(&commit(-1, "")),
        vec![Some(ResponseError::UnknownMemberId)]
    );
}

#[tokio::test(start_paused = true)]
async fn groups_convert_between_protocols_when_empty_and_keep_their_offsets() {
    let f = fixture(0);
    let c = &f.coord;
    // A classic member commits and leaves.
    let joined = c.join(super::tests::join_req("g", "", b"m")).await;
    assert_eq!(joined.error, None);
    let synced = c
        .sync(super::tests::sync_req(
            "g",
            joined.generation_id,
            &joined.member_id,
        ))
        .await;
    assert_eq!(synced.error, None);
    let commit = CommitRequest {
        group_id: "g".into(),
        generation_id: joined.generation_id,
        member_id: joined.member_id.clone(),
        group_instance_id: None,
        offsets: vec![OffsetToCommit {
            topic: "t".into(),
            partition: 1,
            offset: 42,
            leader_epoch: -1,
            metadata: None,
        }],
    };
    assert_eq!(c.commit(&commit), vec![None]);
    // While it is in, the consumer protocol is refused: its metadata ("m") is not the
    // consumer embedded protocol, so the group cannot be upgraded with it inside.
    assert_eq!(
        c.consumer_heartbeat(&join("g", "A", &["t"])).error,
        Some(ResponseError::GroupIdNotFound)
    );
    c.leave("g", &[(joined.member_id.clone(), None)]).unwrap();
    // Empty: a consumer-protocol member converts it, offsets kept.
    let a = c.consumer_heartbeat(&join("g", "A", &["t"]));
    assert_eq!(a.error, None);
    assert!(a.member_epoch > joined.generation_id);
    assert_eq!(c.group_type("g"), Some("consumer"));
    let fetched = c.fetch_offsets("g", Some(&[("t".into(), vec![1])]));
    assert_eq!(fetched[0].1[0].1.as_ref().map(|o| o.offset), Some(42));
    // Nor can such a classic member join while the consumer member is in.
    assert_eq!(
        c.join(super::tests::join_req("g", "", b"m")).await.error,
        Some(ResponseError::InconsistentGroupProtocol)
    );
    // The group and its kind come back after a restart (members rejoin).
    let dir = f.dir;
    drop(f.coord);
    let c = open_in(dir.path(), 0);
    assert_eq!(c.group_type("g"), Some("consumer"));
    let fetched = c.fetch_offsets("g", Some(&[("t".into(), vec![1])]));
    assert_eq!(fetched[0].1[0].1.as_ref().map(|o| o.offset), Some(42));
    assert_eq!(
        beat(&c, "g", "A", a.member_epoch, &[]).error,
        Some(ResponseError::UnknownMemberId)
    );
    let again = c.consumer_heartbeat(&join("g", "A", &["t"]));
    assert!(again.member_epoch > a.member_epoch, "epochs never go back");
    // Back to classic once empty.
    let mut leave = join("g", "A", &["t"]);
    leave.member_epoch = -1;
    assert_eq!(c.consumer_heartbeat(&leave).member_epoch, -1);
    let joined = c.join(super::tests::join_req("g", "", b"m")).await;
    assert_eq!(joined.error, None);
    assert_eq!(c.group_type("g"), Some("classic"));
    let fetched = c.fetch_offsets("g", Some(&[("t".into(), vec![1])]));
    assert_eq!(fetched[0].1[0].1.as_ref().map(|o| o.offset), Some(42));
}

#[tokio::test(start_paused = true)]
async fn a_regex_subscription_takes_every_matching_topic() {
    let f = fixture(0);
    let c = &f.coord;
    let mut r = join("g", "A", &[]);
    r.subscribed_topic_names = None;
    r.subscribed_topic_regex = Some("t|u".into());
    let a = c.consumer_heartbeat(&r);
    assert_eq!(a.error, None);
    let total: usize = a.assignment.unwrap().iter().map(|(_, p)| p.len()).sum();
    assert_eq!(total, 6, "t (4) and u (2)");
}

/// Hostile regexes are refused at once (the regex is compiled under the coordinator's
/// lock): 10 MB of `a|` (7 s to compile, debug build, before the length bound), a short
/// one whose program is huge; a regex of many topic names under the bound is taken.
#[tokio::test(start_paused = true)]
async fn huge_regexes_are_refused_quickly() {
    let f = fixture(0);
    let c = &f.coord;
    let with_regex = |re: String| {
        let mut r = join("g", "A", &[]);
        r.subscribed_topic_names = None;
        r.subscribed_topic_regex = Some(re);
        r
    };
    for (what, re) in [
        ("10 MB of a|", "a|".repeat(5 << 20)),
        ("a huge program", r"(?:\w{1000}){1000}".to_string()),
    ] {
        let started = std::time::Instant::now();
        let r = c.consumer_heartbeat(&with_regex(re));
        let took = started.elapsed();
        assert_eq!(
            r.error,
            Some(ResponseError::InvalidRegularExpression),
            "{what}"
        );
        assert!(
            took < std::time::Duration::from_secs(1),
            "{what}: refused after {took:?}"
        );
        assert!(
            r.error_message.as_ref().is_some_and(|m| m.len() < 1024),
            "{what}: a short message"
        );
    }
    // 2500 names in an alternation (about 27 KB), `t` among them: taken.
    let names: Vec<String> = (0..2500).map(|i| format!("topic-{i:04}")).collect();
    let r = c.consumer_heartbeat(&with_regex(format!("t|{}", names.join("|"))));
    let short = |m: &Option<String>| {
        m.as_deref()
            .map(|m| m.chars().take(200).collect::<String>())
    };
    assert_eq!(r.error, None, "{:?}", short(&r.error_message));
    let total: usize = r.assignment.unwrap().iter().map(|(_, p)| p.len()).sum();
    assert_eq!(total, 4, "t's 4 partitions");
    let r = c.consumer_heartbeat(&with_regex(r"[\w.-]+".to_string()));
    assert_eq!(r.error, None, "{:?}", short(&r.error_message));
}

/// A ConsumerProtocolSubscription v1 of topic "t" saying the member owns `owned`.
fn subscription(owned: &[i32]) -> Bytes {
    use kafka_protocol::messages::consumer_protocol_subscription::TopicPartition;
    use kafka_protocol::messages::{ConsumerProtocolSubscription, TopicName};
    use kafka_protocol::protocol::{Encodable, StrBytes};
    let s = ConsumerProtocolSubscription::default()
        .with_topics(vec![StrBytes::from_static_str("t")])
        .with_owned_partitions(vec![TopicPartition::default()
            .with_topic(TopicName(StrBytes::from_static_str("t")))
            .with_partitions(owned.to_vec())]);
    let mut buf = bytes::BytesMut::new();
    buf.extend_from_slice(&1i16.to_be_bytes());
    s.encode(&mut buf, 1).unwrap();
    buf.freeze()
}

fn classic_join(member: &str, owned: &[i32]) -> JoinRequest {
    JoinRequest {
        protocols: vec![("range".into(), subscription(owned))],
        ..super::tests::join_req("g", member, b"")
    }
}

/// The partitions of "t" in a SyncGroup assignment.
fn synced_parts(r: &SyncResult) -> BTreeSet<i32> {
    let a = consumer::decode_assignment(&r.assignment).expect("a consumer protocol assignment");
    a.get("t").cloned().unwrap_or_default()
}

/// KIP-848's online migration: a classic group with a member becomes a consumer-protocol
/// group when a consumer-protocol member joins; the classic member stays, is told to
/// rejoin, and gets its share by JoinGroup/SyncGroup at the member epoch; its commits
/// keep working; when the consumer-protocol member leaves, the group is classic again
/// and rebalances, the classic member's offsets kept.
#[tokio::test(start_paused = true)]
async fn a_classic_group_with_members_migrates_online_and_back() {
    let f = fixture(0);
    let c = &f.coord;
    // A stable classic group: one member holding all four partitions.
    let j = c.join(classic_join("", &[])).await;
    assert_eq!(j.error, None);
    assert_eq!(j.leader_id, j.member_id);
    let m1 = j.member_id.clone();
    let all: Partitions = [("t".to_string(), (0..4).collect())].into();
    let mut sync = super::tests::sync_req("g", j.generation_id, &m1);
    sync.assignments = vec![(m1.clone(), consumer::encode_assignment(&all, 1))];
    let s = c.sync(sync).await;
    assert_eq!(synced_parts(&s), (0..4).collect());
    let g1 = j.generation_id;

    // A consumer-protocol member joins: the group is upgraded with the classic member in
    // it, which keeps its partitions until it rejoins.
    let a = c.consumer_heartbeat(&join("g", "A", &["t"]));
    assert_eq!(a.error, None, "{a:?}");
    assert_eq!(c.group_type("g"), Some("consumer"));
    assert_eq!(
        parts(c, &a),
        set(&[]),
        "the classic member still holds everything"
    );
    let d = c.consumer_describe("g").unwrap();
    assert_eq!(d.members.len(), 2);
    assert!(d
        .members
        .iter()
        .any(|m| m.member_id == m1 && m.classic && m.member_epoch == g1));

    // The classic member commits at its generation, then is told to rejoin.
    let commit = CommitRequest {
        group_id: "g".into(),
        generation_id: g1,
        member_id: m1.clone(),
        group_instance_id: None,
        offsets: vec![OffsetToCommit {
            topic: "t".into(),
            partition: 3,
            offset: 7,
            leader_epoch: -1,
            metadata: None,
        }],
    };
    assert_eq!(c.commit(&commit), vec![None]);
    assert_eq!(
        c.heartbeat("g", g1, &m1, None),
        Some(ResponseError::RebalanceInProgress)
    );
    // An eager member rejoins owning nothing: answered at once at the new epoch.
    let j = c.join(classic_join(&m1, &[])).await;
    assert_eq!(j.error, None, "{j:?}");
    assert_eq!(j.member_id, m1);
    assert_eq!(j.generation_id, a.member_epoch);
    assert_eq!(j.protocol_name.as_deref(), Some("range"));
    assert!(
        j.members.is_empty() && j.leader_id.is_empty(),
        "the broker assigns"
    );
    let s = c
        .sync(super::tests::sync_req("g", j.generation_id, &m1))
        .await;
    assert_eq!(s.error, None);
    let mine = synced_parts(&s);
    assert_eq!(mine.len(), 2, "{mine:?}");
    assert_eq!(c.heartbeat("g", j.generation_id, &m1, None), None);
    // A stale generation is ILLEGAL_GENERATION for a classic member, as classic clients
    // expect.
    let mut stale = commit.clone();
    stale.generation_id = g1;
    assert_eq!(
        c.commit(&stale),
        vec![Some(ResponseError::IllegalGeneration)]
    );
    // The consumer-protocol member gets the other two.
    let a2 = beat(c, "g", "A", a.member_epoch, &[]);
    let theirs = parts(c, &a2).unwrap();
    assert_eq!(theirs.len(), 2);
    assert!(theirs.is_disjoint(&mine));

    // It leaves: the group goes back to the classic protocol and rebalances.
    let mut leave = join("g", "A", &["t"]);
    leave.member_epoch = -1;
    assert_eq!(c.consumer_heartbeat(&leave).error, None);
    assert_eq!(c.group_type("g"), Some("classic"));
    let hb = c.heartbeat("g", j.generation_id, &m1, None);
    assert_eq!(hb, Some(ResponseError::RebalanceInProgress));
    let j = c.join(classic_join(&m1, &[])).await;
    assert_eq!(j.error, None, "{j:?}");
    assert_eq!(j.leader_id, m1);
    assert!(
        j.generation_id > a2.member_epoch,
        "generations never go back"
    );
    let fetched = c.fetch_offsets("g", Some(&[("t".into(), vec![3])]));
    assert_eq!(fetched[0].1[0].1.as_ref().map(|o| o.offset), Some(7));
}

/// With `group.consumer.migration.policy=disabled` a classic group with members is not
/// upgraded (GROUP_ID_NOT_FOUND, as before online migration) and stays as it was.
#[tokio::test(start_paused = true)]
async fn no_online_upgrade_when_the_policy_is_disabled() {
    let dir = tempfile::tempdir().unwrap();
    let c = super::tests::open_with(dir.path(), |s| {
        s.consumer.migration_policy = crate::config::MigrationPolicy::Disabled;
    });
    let j = c.join(classic_join("", &[])).await;
    assert_eq!(j.error, None);
    let r = c.consumer_heartbeat(&join("g", "A", &["t"]));
    assert_eq!(r.error, Some(ResponseError::GroupIdNotFound));
    assert!(r.error_message.unwrap_or_default().contains("disabled"));
    assert_eq!(c.group_type("g"), Some("classic"));
    assert_eq!(c.heartbeat("g", j.generation_id, &j.member_id, None), None);
}

/// Every truncation of a subscription, and bytes that are none, are refused without a
/// panic: INCONSISTENT_GROUP_PROTOCOL from a JoinGroup to a consumer-protocol group.
#[tokio::test(start_paused = true)]
async fn malformed_subscriptions_of_classic_members_are_refused() {
    let full = subscription(&[1]);
    for n in 0..full.len() {
        let _ = consumer::decode_subscription(&full[..n]);
    }
    assert!(consumer::decode_subscription(&full).is_some());
    assert_eq!(
        consumer::decode_subscription(&[0xff, 0xff, 0, 0]),
        None,
        "negative version"
    );
    assert_eq!(
        consumer::decode_assignment(&[0, 0, 0x7f, 0xff, 0xff, 0xff]),
        None
    );
    let f = fixture(0);
    let c = &f.coord;
    assert_eq!(c.consumer_heartbeat(&join("g", "A", &["t"])).error, None);
    let mut bad = classic_join("", &[]);
    bad.protocols = vec![("range".into(), full.slice(..full.len() - 3))];
    assert_eq!(
        c.join(bad).await.error,
        Some(ResponseError::InconsistentGroupProtocol)
    );
    let mut other_type = classic_join("", &[]);
    other_type.protocol_type = "connect".into();
    assert_eq!(
        c.join(other_type).await.error,
        Some(ResponseError::InconsistentGroupProtocol)
    );
    assert_eq!(
        c.consumer_describe("g").unwrap().members.len(),
        1,
        "nothing joined"
    );
}

/// The subscribed topics' metadata is not rebuilt by every heartbeat, but a change is
/// still noticed at the next one: a steady member's heartbeats keep the group epoch; a
/// subscribed topic that grows bumps it and the new partitions are assigned.
#[tokio::test(start_paused = true)]
async fn a_subscribed_topic_that_grows_bumps_the_group_epoch() {
    let f = fixture(0);
    let c = &f.coord;
    let a = c.consumer_heartbeat(&join("g", "A", &["t"]));
    assert_eq!(parts(c, &a), set(&[0, 1, 2, 3]));
    for _ in 0..3 {
        let steady = beat(c, "g", "A", a.member_epoch, &[0, 1, 2, 3]);
        assert_eq!(steady.member_epoch, a.member_epoch, "nothing changed");
    }
    c.metadata.add_partitions("t", 6, &[]).unwrap();
    let grown = beat(c, "g", "A", a.member_epoch, &[0, 1, 2, 3]);
    assert!(grown.member_epoch > a.member_epoch, "{grown:?}");
    assert_eq!(parts(c, &grown), set(&[0, 1, 2, 3, 4, 5]));
}

/// A consumer-protocol member from before a coordinator restart whose group came back
/// classic (a classic member rejoined first) is UNKNOWN_MEMBER_ID, so it rejoins with
/// epoch 0 and upgrades the group, not GROUP_ID_NOT_FOUND, which librdkafka takes as fatal.
/// When the group cannot be upgraded, GROUP_ID_NOT_FOUND says why.
#[tokio::test(start_paused = true)]
async fn a_member_from_before_a_restart_rejoins_a_group_that_came_back_classic() {
    let f = fixture(0);
    let c = &f.coord;
    let j = c.join(classic_join("", &[])).await;
    assert_eq!(j.error, None);
    assert_eq!(c.group_type("g"), Some("classic"));
    let stale = beat(c, "g", "A", 7, &[0, 1]);
    assert_eq!(
        stale.error,
        Some(ResponseError::UnknownMemberId),
        "{stale:?}"
    );
    let rejoined = c.consumer_heartbeat(&join("g", "A", &["t"]));
    assert_eq!(rejoined.error, None);
    assert_eq!(c.group_type("g"), Some("consumer"));

    let dir = tempfile::tempdir().unwrap();
    let c = super::tests::open_with(dir.path(), |s| {
        s.consumer.migration_policy = crate::config::MigrationPolicy::Downgrade;
    });
    assert_eq!(c.join(classic_join("", &[])).await.error, None);
    let refused = beat(&c, "g", "A", 7, &[0, 1]);
    assert_eq!(refused.error, Some(ResponseError::GroupIdNotFound));
    assert!(refused
        .error_message
        .unwrap_or_default()
        .contains("disabled"));
}
