//! State-machine tests of the coordinator, on virtual time (`start_paused`) and a real
//! `__consumer_offsets` in a temporary directory.

use std::collections::BTreeMap;
use std::path::Path;

use super::*;
use crate::cluster::{Metadata, NewTopic};
use crate::config::BrokerConfig;
use crate::purgatory::Purgatory;

pub(super) struct Fixture {
    pub(super) dir: tempfile::TempDir,
    pub(super) coord: Arc<GroupCoordinator>,
}

fn settings(delay_ms: u64) -> GroupSettings {
    GroupSettings {
        initial_rebalance_delay_ms: delay_ms,
        min_session_timeout_ms: 10,
        max_session_timeout_ms: 1_000_000,
        max_size: 100,
        offsets_topic_num_partitions: 3,
        offsets_topic_segment_bytes: 1 << 20,
        offsets_topic_replication_factor: 3,
        offsets_retention_ms: 60_000,
        offsets_retention_check_interval_ms: 1000,
        offset_metadata_max_bytes: 16,
        consumer_protocol_enabled: true,
        consumer: crate::config::ConsumerGroupSettings {
            session_timeout_ms: 45_000,
            heartbeat_interval_ms: 5_000,
            max_size: 100,
            assignors: &[
                crate::config::AssignorKind::Uniform,
                crate::config::AssignorKind::Range,
            ],
            migration_policy: crate::config::MigrationPolicy::Bidirectional,
        },
    }
}

/// A coordinator over the broker state in `dir` (created with topics "t" (4 partitions)
/// and "u" (2) when new), as a restarted broker would build it.
pub(super) fn open_in(dir: &Path, delay_ms: u64) -> Arc<GroupCoordinator> {
    open_with(dir, |s| s.initial_rebalance_delay_ms = delay_ms)
}

/// [`open_in`] with no initial delay and settings changed by `change`.
pub(super) fn open_with(
    dir: &Path,
    change: impl FnOnce(&mut GroupSettings),
) -> Arc<GroupCoordinator> {
    let mut config = BrokerConfig::defaults();
    config.set_single_dir(dir);
    config.group = settings(0);
    change(&mut config.group);
    let config = Arc::new(config);
    let metadata = Arc::new(Metadata::open(dir, 1).unwrap());
    let replicas =
        ReplicaManager::open(config.clone(), &metadata, Arc::new(Purgatory::new(10))).unwrap();
    for (name, partitions) in [("t", 4), ("u", 2)] {
        metadata
            .ensure_topic(NewTopic {
                name: name.to_string(),
                partitions,
                replication_factor: 1,
                configs: BTreeMap::new(),
                assignment: Vec::new(),
            })
            .unwrap();
    }
    Arc::new(GroupCoordinator::open(metadata, replicas, config.group).unwrap())
}

pub(super) fn fixture(delay_ms: u64) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let coord = open_in(dir.path(), delay_ms);
    Fixture { dir, coord }
}

pub(super) fn join_req(group: &str, member_id: &str, metadata: &'static [u8]) -> JoinRequest {
    JoinRequest {
        group_id: group.into(),
        member_id: member_id.into(),
        group_instance_id: None,
        client_id: "client".into(),
        client_host: "/127.0.0.1".into(),
        session_timeout_ms: 10_000,
        rebalance_timeout_ms: 20_000,
        protocol_type: "consumer".into(),
        protocols: vec![
            ("range".into(), Bytes::from_static(metadata)),
            ("roundrobin".into(), Bytes::from_static(metadata)),
        ],
        require_known_member_id: false,
    }
}

pub(super) fn sync_req(group: &str, generation_id: i32, member_id: &str) -> SyncRequest {
    SyncRequest {
        group_id: group.into(),
        generation_id,
        member_id: member_id.into(),
        group_instance_id: None,
        protocol_type: None,
        protocol_name: None,
        assignments: Vec::new(),
    }
}

fn spawn_join(c: &Arc<GroupCoordinator>, req: JoinRequest) -> tokio::task::JoinHandle<JoinResult> {
    let c = c.clone();
    tokio::spawn(async move { c.join(req).await })
}

fn spawn_sync(c: &Arc<GroupCoordinator>, req: SyncRequest) -> tokio::task::JoinHandle<SyncResult> {
    let c = c.clone();
    tokio::spawn(async move { c.sync(req).await })
}

/// Lets spawned tasks run up to their next wait.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// Runs the initial rebalance delay (100 ms in these tests) out, extension included.
async fn finish_delay(c: &GroupCoordinator) {
    for _ in 0..3 {
        settle().await;
        tokio::time::advance(Duration::from_millis(100)).await;
        c.expire(Instant::now());
    }
    settle().await;
}

fn state(c: &GroupCoordinator, group: &str) -> GroupState {
    c.describe(group).map_or(GroupState::Dead, |d| d.state)
}

/// Two members join together (the initial delay run out); returns (leader's answer,
/// follower's answer).
async fn join_pair(
    c: &Arc<GroupCoordinator>,
    a: JoinRequest,
    b: JoinRequest,
) -> (JoinResult, JoinResult) {
    let ja = spawn_join(c, a);
    let jb = spawn_join(c, b);
    finish_delay(c).await;
    let (a, b) = (ja.await.unwrap(), jb.await.unwrap());
    assert_eq!(a.generation_id, b.generation_id);
    if a.members.is_empty() {
        (b, a)
    } else {
        (a, b)
    }
}

/// Two dynamic members join and sync; returns (leader, follower, generation).
async fn stable_pair(c: &Arc<GroupCoordinator>, group: &str) -> (JoinResult, JoinResult) {
    let (leader, follower) =
        join_pair(c, join_req(group, "", b"a"), join_req(group, "", b"b")).await;
    let mut s = sync_req(group, leader.generation_id, &leader.member_id);
    s.assignments = vec![
        (leader.member_id.clone(), Bytes::from_static(b"L")),
        (follower.member_id.clone(), Bytes::from_static(b"F")),
    ];
    assert_eq!(c.sync(s).await.assignment, Bytes::from_static(b"L"));
    let f = c
        .sync(sync_req(group, follower.generation_id, &follower.member_id))
        .await;
    assert_eq!(f.assignment, Bytes::from_static(b"F"));
    assert_eq!(state(c, group), GroupState::Stable);
    (leader, follower)
}

#[tokio::test(start_paused = true)]
async fn member_id_required_then_join_sync_and_stable() {
    let f = fixture(0);
    let c = &f.coord;
    let mut req = join_req("g", "", b"m");
    req.require_known_member_id = true;
    let first = c.join(req.clone()).await;
    assert_eq!(first.error, Some(ResponseError::MemberIdRequired));
    assert!(first.member_id.starts_with("client-"));
    req.member_id = first.member_id.clone();
    // With no initial delay, a lone member's join completes at once.
    let joined = c.join(req).await;
    assert_eq!(joined.error, None);
    assert_eq!(joined.generation_id, 1);
    assert_eq!(joined.leader_id, first.member_id);
    assert_eq!(joined.protocol_name.as_deref(), Some("range"));
    assert_eq!(joined.members.len(), 1);
    assert_eq!(joined.members[0].metadata, Bytes::from_static(b"m"));
    assert_eq!(state(c, "g"), GroupState::CompletingRebalance);
    let mut s = sync_req("g", 1, &first.member_id);
    s.assignments = vec![(first.member_id.clone(), Bytes::from_static(b"all"))];
    let synced = c.sync(s).await;
    assert_eq!(synced.error, None);
    assert_eq!(synced.assignment, Bytes::from_static(b"all"));
    assert_eq!(state(c, "g"), GroupState::Stable);
    assert_eq!(c.heartbeat("g", 1, &first.member_id, None), None);
    assert_eq!(
        c.heartbeat("g", 0, &first.member_id, None),
        Some(ResponseError::IllegalGeneration)
    );
    assert_eq!(
        c.heartbeat("g", 1, "nobody", None),
        Some(ResponseError::UnknownMemberId)
    );
    assert_eq!(
        c.heartbeat("other", 1, &first.member_id, None),
        Some(ResponseError::UnknownMemberId)
    );
}

#[tokio::test(start_paused = true)]
async fn follower_sync_waits_for_the_leader_assignment() {
    let f = fixture(100);
    let c = &f.coord;
    let (leader, follower) = join_pair(c, join_req("g", "", b"a"), join_req("g", "", b"b")).await;
    assert_eq!(leader.members.len(), 2);
    assert!(follower.members.is_empty());
    let follower_sync = spawn_sync(
        c,
        sync_req("g", follower.generation_id, &follower.member_id),
    );
    settle().await;
    assert!(
        !follower_sync.is_finished(),
        "follower answered before the leader synced"
    );
    let mut s = sync_req("g", leader.generation_id, &leader.member_id);
    s.assignments = vec![
        (leader.member_id.clone(), Bytes::from_static(b"L")),
        (follower.member_id.clone(), Bytes::from_static(b"F")),
    ];
    assert_eq!(c.sync(s).await.assignment, Bytes::from_static(b"L"));
    let got = follower_sync.await.unwrap();
    assert_eq!(got.error, None);
    assert_eq!(got.assignment, Bytes::from_static(b"F"));
}

#[tokio::test(start_paused = true)]
async fn bad_joins_get_kafka_errors() {
    let f = fixture(0);
    let c = &f.coord;
    let mut no_protocols = join_req("g", "", b"");
    no_protocols.protocols.clear();
    assert_eq!(
        c.join(no_protocols).await.error,
        Some(ResponseError::InconsistentGroupProtocol)
    );
    let mut bad_timeout = join_req("g", "", b"");
    bad_timeout.session_timeout_ms = 1;
    assert_eq!(
        c.join(bad_timeout).await.error,
        Some(ResponseError::InvalidSessionTimeout)
    );
    assert_eq!(
        c.join(join_req("", "", b"")).await.error,
        Some(ResponseError::InvalidGroupId)
    );
    assert_eq!(
        c.join(join_req("g", "made-up", b"")).await.error,
        Some(ResponseError::UnknownMemberId)
    );
    // A member with a protocol nobody else speaks cannot join a live group.
    let a = spawn_join(c, join_req("g", "", b"a"));
    settle().await;
    let mut other = join_req("g", "", b"x");
    other.protocols = vec![("sticky".into(), Bytes::new())];
    assert_eq!(
        c.join(other).await.error,
        Some(ResponseError::InconsistentGroupProtocol)
    );
    c.expire(Instant::now());
    assert_eq!(a.await.unwrap().error, None);
}

#[tokio::test(start_paused = true)]
async fn a_member_id_never_used_is_dropped_after_its_session_timeout() {
    let f = fixture(0);
    let c = &f.coord;
    let mut req = join_req("g", "", b"a");
    req.require_known_member_id = true;
    let a_id = c.join(req.clone()).await.member_id;
    // A second client gets a member id and never comes back.
    let ghost = c.join(req.clone()).await;
    assert_eq!(ghost.error, Some(ResponseError::MemberIdRequired));
    req.member_id = a_id;
    let a = spawn_join(c, req);
    settle().await;
    c.expire(Instant::now());
    settle().await;
    assert!(
        !a.is_finished(),
        "the join phase waits for the pending member"
    );
    tokio::time::advance(Duration::from_millis(10_001)).await;
    c.expire(Instant::now());
    let a = a.await.unwrap();
    assert_eq!(a.error, None);
    assert_eq!(a.members.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn session_timeout_removes_a_silent_member_and_rebalances() {
    let f = fixture(100);
    let c = &f.coord;
    let (leader, follower) = stable_pair(c, "g").await;
    for _ in 0..4 {
        tokio::time::advance(Duration::from_millis(3000)).await;
        assert_eq!(
            c.heartbeat("g", leader.generation_id, &leader.member_id, None),
            None
        );
        c.expire(Instant::now());
    }
    assert_eq!(state(c, "g"), GroupState::PreparingRebalance);
    assert_eq!(
        c.heartbeat("g", follower.generation_id, &follower.member_id, None),
        Some(ResponseError::UnknownMemberId)
    );
    assert_eq!(
        c.heartbeat("g", leader.generation_id, &leader.member_id, None),
        Some(ResponseError::RebalanceInProgress)
    );
    let rejoined = c.join(join_req("g", &leader.member_id, b"a")).await;
    assert_eq!(rejoined.error, None);
    assert_eq!(rejoined.generation_id, leader.generation_id + 1);
    assert_eq!(rejoined.members.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn leaving_members_empty_the_group_and_keep_its_offsets() {
    let f = fixture(100);
    let c = &f.coord;
    let (leader, follower) = stable_pair(c, "g").await;
    let commit = CommitRequest {
        group_id: "g".into(),
        generation_id: leader.generation_id,
        member_id: leader.member_id.clone(),
        group_instance_id: None,
        offsets: vec![OffsetToCommit {
            topic: "t".into(),
            partition: 0,
            offset: 5,
            leader_epoch: -1,
            metadata: Some("m".into()),
        }],
    };
    assert_eq!(c.commit(&commit), vec![None]);
    let left = c
        .leave(
            "g",
            &[(leader.member_id.clone(), None), ("nobody".into(), None)],
        )
        .unwrap();
    assert_eq!(left, vec![None, Some(ResponseError::UnknownMemberId)]);
    assert_eq!(state(c, "g"), GroupState::PreparingRebalance);
    assert_eq!(
        c.leave("g", &[(follower.member_id.clone(), None)]).unwrap(),
        vec![None]
    );
    assert_eq!(state(c, "g"), GroupState::Empty);
    let fetched = c.fetch_offsets("g", None);
    assert_eq!(fetched.len(), 1);
    assert_eq!(fetched[0].1[0].1.as_ref().unwrap().offset, 5);
    // The stale generation can no longer commit.
    assert_eq!(
        c.commit(&commit),
        vec![Some(ResponseError::UnknownMemberId)]
    );
}

#[tokio::test(start_paused = true)]
async fn static_member_restart_gets_its_assignment_without_a_rebalance() {
    let f = fixture(100);
    let c = &f.coord;
    let mut a = join_req("g", "", b"a");
    a.group_instance_id = Some("i-a".into());
    let mut b = join_req("g", "", b"b");
    b.group_instance_id = Some("i-b".into());
    let (leader, follower) = join_pair(c, a.clone(), b.clone()).await;
    let mut s = sync_req("g", leader.generation_id, &leader.member_id);
    s.assignments = vec![
        (leader.member_id.clone(), Bytes::from_static(b"L")),
        (follower.member_id.clone(), Bytes::from_static(b"F")),
    ];
    c.sync(s).await;
    let follower_instance = if follower.member_id.starts_with("i-a") {
        a
    } else {
        b
    };
    // The follower restarts: same instance id, no member id.
    let again = c.join(follower_instance.clone()).await;
    assert_eq!(again.error, None);
    assert_ne!(again.member_id, follower.member_id);
    assert_eq!(again.generation_id, follower.generation_id);
    assert_eq!(state(c, "g"), GroupState::Stable);
    let mut s = sync_req("g", again.generation_id, &again.member_id);
    s.group_instance_id = follower_instance.group_instance_id.clone();
    assert_eq!(c.sync(s).await.assignment, Bytes::from_static(b"F"));
    assert_eq!(
        c.heartbeat("g", leader.generation_id, &leader.member_id, None),
        None
    );
    // The old incarnation is fenced.
    assert_eq!(
        c.heartbeat(
            "g",
            follower.generation_id,
            &follower.member_id,
            follower_instance.group_instance_id.as_deref()
        ),
        Some(ResponseError::FencedInstanceId)
    );
}

#[tokio::test(start_paused = true)]
async fn initial_delay_waits_and_extends_while_members_arrive() {
    let f = fixture(3000);
    let c = &f.coord;
    let a = spawn_join(c, join_req("g", "", b"a"));
    settle().await;
    tokio::time::advance(Duration::from_millis(2000)).await;
    let b = spawn_join(c, join_req("g", "", b"b"));
    settle().await;
    tokio::time::advance(Duration::from_millis(1000)).await;
    c.expire(Instant::now());
    settle().await;
    assert!(
        !a.is_finished(),
        "a member joined during the delay: it is extended"
    );
    tokio::time::advance(Duration::from_millis(3000)).await;
    c.expire(Instant::now());
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    assert_eq!(a.generation_id, 1);
    assert_eq!(b.generation_id, 1);
    assert_eq!(a.members.len() + b.members.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn commits_are_checked_and_survive_a_restart() {
    let f = fixture(0);
    let c = &f.coord;
    let o = |topic: &str, partition, offset, metadata: &str| OffsetToCommit {
        topic: topic.into(),
        partition,
        offset,
        leader_epoch: 7,
        metadata: Some(metadata.into()),
    };
    let simple = CommitRequest {
        group_id: "simple".into(),
        generation_id: -1,
        member_id: String::new(),
        group_instance_id: None,
        offsets: vec![
            o("t", 0, 10, "meta-0"),
            o("t", 3, 30, ""),
            o("t", 4, 1, ""),
            o("nope", 0, 1, ""),
            o("u", 1, 5, "x".repeat(17).as_str()),
            o("u", 0, 11, "meta-u"),
        ],
    };
    assert_eq!(
        c.commit(&simple),
        vec![
            None,
            None,
            Some(ResponseError::UnknownTopicOrPartition),
            Some(ResponseError::UnknownTopicOrPartition),
            Some(ResponseError::OffsetMetadataTooLarge),
            None,
        ]
    );
    let mut wrong_generation = simple.clone();
    wrong_generation.group_id = "new-group".into();
    wrong_generation.generation_id = 3;
    assert_eq!(
        c.commit(&wrong_generation)[0],
        Some(ResponseError::IllegalGeneration)
    );
    let before = c.fetch_offsets("simple", None);
    drop(f.coord);
    let reopened = open_in(f.dir.path(), 0);
    let after = reopened.fetch_offsets("simple", None);
    assert_eq!(before, after);
    let t0 = &after[0].1[0];
    assert_eq!(t0.0, 0);
    let c0 = t0.1.as_ref().unwrap();
    assert_eq!(
        (c0.offset, c0.leader_epoch, c0.metadata.as_str()),
        (10, 7, "meta-0")
    );
    let listed = reopened.fetch_offsets("simple", Some(&[("t".into(), vec![0, 1])]));
    assert_eq!(listed[0].1[1], (1, None));
    assert_eq!(
        reopened.list(),
        vec![GroupListing {
            group_id: "simple".into(),
            protocol_type: String::new(),
            state: GroupState::Empty,
            state_name: "Empty",
            group_type: "classic",
        }]
    );
}

#[tokio::test(start_paused = true)]
async fn deletions_are_written_as_tombstones() {
    let f = fixture(0);
    let c = &f.coord;
    let commit = |group: &str| CommitRequest {
        group_id: group.into(),
        generation_id: -1,
        member_id: String::new(),
        group_instance_id: None,
        offsets: ["t", "u"]
            .iter()
            .map(|t| OffsetToCommit {
                topic: (*t).into(),
                partition: 1,
                offset: 9,
                leader_epoch: -1,
                metadata: None,
            })
            .collect(),
    };
    assert_eq!(c.commit(&commit("a")), vec![None, None]);
    assert_eq!(c.commit(&commit("b")), vec![None, None]);
    c.on_topic_deleted("u");
    assert_eq!(
        c.delete_offsets("b", &[("t".into(), 1)]).unwrap(),
        vec![None]
    );
    assert_eq!(c.delete_group("a"), None);
    assert_eq!(c.delete_group("a"), Some(ResponseError::GroupIdNotFound));
    assert_eq!(
        c.delete_offsets("a", &[("t".into(), 1)]),
        Err(ResponseError::GroupIdNotFound)
    );
    drop(f.coord);
    let reopened = open_in(f.dir.path(), 0);
    assert!(reopened.describe("a").is_none());
    assert_eq!(reopened.fetch_offsets("b", None), Vec::new());
}

#[tokio::test(start_paused = true)]
async fn delete_group_refuses_a_group_with_members() {
    let f = fixture(100);
    let c = &f.coord;
    stable_pair(c, "g").await;
    assert_eq!(c.delete_group("g"), Some(ResponseError::NonEmptyGroup));
}

#[tokio::test(start_paused = true)]
async fn offsets_of_an_empty_group_expire_after_retention() {
    let f = fixture(0);
    let c = &f.coord;
    let commit = CommitRequest {
        group_id: "old".into(),
        generation_id: -1,
        member_id: String::new(),
        group_instance_id: None,
        offsets: vec![OffsetToCommit {
            topic: "t".into(),
            partition: 0,
            offset: 1,
            leader_epoch: -1,
            metadata: None,
        }],
    };
    assert_eq!(c.commit(&commit), vec![None]);
    assert_eq!(c.expire_offsets(now_ms()), 0);
    assert_eq!(c.expire_offsets(now_ms() + 60_001), 1);
    assert!(
        c.describe("old").is_none(),
        "an empty group without offsets is removed"
    );
    drop(f.coord);
    assert!(open_in(f.dir.path(), 0).describe("old").is_none());
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_never_syncs_is_removed_after_the_rebalance_timeout() {
    let f = fixture(100);
    let c = &f.coord;
    let (leader, follower) = join_pair(c, join_req("g", "", b"a"), join_req("g", "", b"b")).await;
    let waiting = spawn_sync(
        c,
        sync_req("g", follower.generation_id, &follower.member_id),
    );
    settle().await;
    tokio::time::advance(Duration::from_millis(20_001)).await;
    c.expire(Instant::now());
    // The follower's parked SyncGroup is told to rejoin; the leader is gone.
    assert_eq!(
        waiting.await.unwrap().error,
        Some(ResponseError::RebalanceInProgress)
    );
    assert_eq!(
        c.heartbeat("g", leader.generation_id, &leader.member_id, None),
        Some(ResponseError::UnknownMemberId)
    );
    let again = c.join(join_req("g", &follower.member_id, b"b")).await;
    assert_eq!(again.error, None);
    assert_eq!(again.leader_id, follower.member_id);
}

#[tokio::test(start_paused = true)]
async fn many_protocols_and_overlong_group_ids_are_handled() {
    let f = fixture(0);
    let c = &f.coord;
    // 20,000 protocols (protocol selection is linear: it was quadratic, and a member with a
    // million protocols stalled the broker; the cost is a benchmark matter, the outcome is
    // checked here).
    let protocols: Vec<(String, Bytes)> = (0..20_000)
        .map(|i| (format!("p{i}"), Bytes::new()))
        .collect();
    let mut req = join_req("many", "", b"");
    req.protocols = protocols.clone();
    let first = c.join(req.clone()).await;
    assert_eq!(first.error, None);
    assert_eq!(first.protocol_name.as_deref(), Some("p0"));
    let mut rejoin = req.clone();
    rejoin.member_id = first.member_id.clone();
    rejoin.protocols.reverse();
    let again = spawn_join(c, rejoin);
    settle().await;
    let again = again.await.unwrap();
    assert_eq!(again.error, None);
    assert_eq!(again.protocol_name.as_deref(), Some("p19999"));
    // A group id longer than a Kafka string is refused everywhere it could be stored.
    let long = "g".repeat(40_000);
    assert_eq!(
        c.join(join_req(&long, "", b"")).await.error,
        Some(ResponseError::InvalidGroupId)
    );
    let commit = CommitRequest {
        group_id: long.clone(),
        generation_id: -1,
        member_id: String::new(),
        group_instance_id: None,
        offsets: vec![OffsetToCommit {
            topic: "t".into(),
            partition: 0,
            offset: 1,
            leader_epoch: -1,
            metadata: None,
        }],
    };
    assert_eq!(c.commit(&commit), vec![Some(ResponseError::InvalidGroupId)]);
    assert!(c.describe(&long).is_none());
    // An empty group id may commit, as Kafka allows for old clients.
    let mut empty = commit.clone();
    empty.group_id = String::new();
    assert_eq!(c.commit(&empty), vec![None]);
}
