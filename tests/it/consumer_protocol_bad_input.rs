//! Hostile ConsumerGroupHeartbeat (KIP-848) frames: each gets Kafka's error (or is served
//! within bounds), and the broker (the `weir` binary, so its log can be read and its memory
//! measured) keeps serving: a confluent-kafka consumer-protocol member of another group
//! goes on reading, fresh joins are answered, and the log shows no panic.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kafka_protocol::messages::consumer_group_heartbeat_request::TopicPartitions;
use kafka_protocol::messages::{
    ApiVersionsRequest, ApiVersionsResponse, ConsumerGroupDescribeRequest,
    ConsumerGroupDescribeResponse, ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse,
    GroupId, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::groups::{create_topic, produce, Member};
use crate::harness::{decode, poll_for, wait_until, BinaryBroker, RawConn};

const INVALID_REQUEST: i16 = 42;
const UNSUPPORTED_VERSION: i16 = 35;
const UNKNOWN_MEMBER_ID: i16 = 25;
const GROUP_MAX_SIZE_REACHED: i16 = 81;
const FENCED_MEMBER_EPOCH: i16 = 110;
const UNSUPPORTED_ASSIGNOR: i16 = 112;
const INVALID_REGULAR_EXPRESSION: i16 = 128;

/// Short heartbeats and sessions keep the tests fast.
const FAST_GROUPS: [&str; 3] = [
    "group.consumer.heartbeat.interval.ms=500",
    "group.consumer.session.timeout.ms=6000",
    "group.initial.rebalance.delay.ms=0",
];

fn broker(dir: &std::path::Path, more: &[&str]) -> BinaryBroker {
    let mut overrides: Vec<&str> = FAST_GROUPS.to_vec();
    overrides.extend_from_slice(more);
    BinaryBroker::spawn(dir, 0, &overrides)
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// A join (member epoch 0) as librdkafka sends it: a rebalance timeout, the subscription,
/// no owned partitions; v1 names the member itself.
fn join(group: &str, member_id: &str, topic: &str) -> ConsumerGroupHeartbeatRequest {
    ConsumerGroupHeartbeatRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_member_id(s(member_id))
        .with_member_epoch(0)
        .with_rebalance_timeout_ms(30_000)
        .with_subscribed_topic_names(Some(vec![TopicName(s(topic))]))
        .with_topic_partitions(Some(vec![]))
}

/// One heartbeat on its own connection; panics when the broker closes it or does not
/// answer within the connection's 10 s read timeout.
fn heartbeat(
    bootstrap: &str,
    req: &ConsumerGroupHeartbeatRequest,
    version: i16,
) -> ConsumerGroupHeartbeatResponse {
    let mut c = RawConn::connect(bootstrap);
    heartbeat_on(&mut c, req, version)
}

fn heartbeat_on(
    c: &mut RawConn,
    req: &ConsumerGroupHeartbeatRequest,
    version: i16,
) -> ConsumerGroupHeartbeatResponse {
    decode(
        c.request(req, version, 7)
            .expect("ConsumerGroupHeartbeat answered, not a closed connection"),
        version,
    )
}

/// The broker still serves: ApiVersions answers, a fresh consumer-protocol join of a new
/// group (by raw frame) is accepted, the long-lived real member reads one more record,
/// and the broker's log shows no panic.
struct Probe {
    topic: String,
    member: Member,
    produced: usize,
    joins: usize,
}

impl Probe {
    /// A confluent-kafka consumer-protocol member of group `probe` reading the 2-partition
    /// topic `probe`, which holds 10 records it has read.
    fn start(b: &BinaryBroker) -> Probe {
        let topic = "probe".to_string();
        create_topic(&b.bootstrap, &topic, 2);
        produce(&b.bootstrap, &topic, 2, 10, "probe");
        let member = Member::spawn(
            "confluent-kafka",
            &b.bootstrap,
            &topic,
            "probe",
            &["--group-protocol", "consumer"],
        );
        wait_until("the probe member reads the first 10 records", 60, || {
            member.records().len() >= 10
        });
        Probe {
            topic,
            member,
            produced: 10,
            joins: 0,
        }
    }

    fn check(&mut self, b: &BinaryBroker, after: &str) {
        let mut c = RawConn::connect(&b.bootstrap);
        let r: ApiVersionsResponse = decode(
            c.request(&ApiVersionsRequest::default(), 3, 1)
                .unwrap_or_else(|| panic!("after {after}: ApiVersions not answered")),
            3,
        );
        assert_eq!(r.error_code, 0, "after {after}");
        self.joins += 1;
        let group = format!("fresh-{}", self.joins);
        let member_id = format!("fresh-member-{}", self.joins);
        let r = heartbeat(&b.bootstrap, &join(&group, &member_id, &self.topic), 1);
        assert_eq!(r.error_code, 0, "after {after}: a fresh join {r:?}");
        assert_eq!(r.member_epoch, 1, "after {after}: {r:?}");
        // Leave again, so the fresh groups do not hold members.
        let leave = ConsumerGroupHeartbeatRequest::default()
            .with_group_id(GroupId(s(&group)))
            .with_member_id(s(&member_id))
            .with_member_epoch(-1);
        assert_eq!(heartbeat(&b.bootstrap, &leave, 1).error_code, 0);
        produce(&b.bootstrap, &self.topic, 2, 2, after);
        self.produced += 2;
        let want = self.produced;
        poll_for(
            &format!("after {after}: the probe member reads {want} records"),
            60,
            || {
                let n = self.member.records().len();
                if n >= want {
                    Ok(())
                } else {
                    Err(format!("{n} read; lines {:?}", self.member.lines()))
                }
            },
        );
        let log = b.stderr_text();
        assert!(!log.contains("panicked"), "after {after}:\n{log}");
    }

    /// At the end: a new confluent-kafka member of another group reads every record.
    fn finish(mut self, b: &BinaryBroker) {
        let fresh = Member::spawn(
            "confluent-kafka",
            &b.bootstrap,
            &self.topic,
            "probe-final",
            &["--group-protocol", "consumer"],
        );
        let want = self.produced;
        wait_until("a new member of another group reads everything", 60, || {
            fresh.records().len() >= want
        });
        let read: BTreeSet<(i32, i64)> = fresh.records().into_iter().collect();
        assert_eq!(read.len(), want, "records read twice or skipped");
        self.member.close();
    }
}

/// A broker's resident set size in kB (`VmRSS` of /proc/PID/status).
fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS")
}

/// Requests missing what their epoch needs get INVALID_REQUEST (42), an unknown assignor
/// UNSUPPORTED_ASSIGNOR (112), an epoch ahead of the member's FENCED_MEMBER_EPOCH (110);
/// owned partitions of topic ids nobody knows are ignored. Kafka's
/// `throwIfConsumerGroupHeartbeatRequestIsInvalid` and `consumerGroupHeartbeat`.
#[test]
fn malformed_heartbeats_get_kafkas_errors() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path(), &[]);
    let mut probe = Probe::start(&b);
    create_topic(&b.bootstrap, "bad-hb", 3);

    // Empty group id, v0 and v1.
    for v in [0, 1] {
        let r = heartbeat(&b.bootstrap, &join("", "m", "bad-hb"), v);
        assert_eq!(r.error_code, INVALID_REQUEST, "empty group id v{v}: {r:?}");
        assert_eq!(r.member_epoch, -1, "{r:?}");
    }
    probe.check(&b, "an empty group id");

    // Epoch 0 without a subscription (no names, no regex).
    let r = heartbeat(
        &b.bootstrap,
        &join("bad-g", "m1", "bad-hb").with_subscribed_topic_names(None),
        1,
    );
    assert_eq!(r.error_code, INVALID_REQUEST, "no subscription: {r:?}");
    probe.check(&b, "a join without a subscription");

    // Epoch 0 owning partitions.
    let owned = vec![TopicPartitions::default()
        .with_topic_id(uuid::Uuid::new_v4())
        .with_partitions(vec![0, 1])];
    let r = heartbeat(
        &b.bootstrap,
        &join("bad-g", "m1", "bad-hb").with_topic_partitions(Some(owned)),
        1,
    );
    assert_eq!(
        r.error_code, INVALID_REQUEST,
        "a join owning partitions: {r:?}"
    );
    // (Kafka also refuses a join with null owned partitions or no rebalance timeout; weir
    // takes them as "unchanged", for librdkafka's partial epoch-0 heartbeats: see
    // `validate` in src/group/consumer.rs.)
    probe.check(&b, "a join owning partitions");

    // Epoch -2 (static leave) without an instance id; epochs below -2.
    let r = heartbeat(
        &b.bootstrap,
        &ConsumerGroupHeartbeatRequest::default()
            .with_group_id(GroupId(s("bad-g")))
            .with_member_id(s("m1"))
            .with_member_epoch(-2),
        1,
    );
    assert_eq!(
        r.error_code, INVALID_REQUEST,
        "epoch -2, no instance: {r:?}"
    );
    for epoch in [-3, i32::MIN] {
        let r = heartbeat(
            &b.bootstrap,
            &ConsumerGroupHeartbeatRequest::default()
                .with_group_id(GroupId(s("bad-g")))
                .with_member_id(s("m1"))
                .with_member_epoch(epoch),
            1,
        );
        assert_eq!(r.error_code, INVALID_REQUEST, "epoch {epoch}: {r:?}");
    }
    // A non-zero epoch without a member id.
    let r = heartbeat(
        &b.bootstrap,
        &join("bad-g", "", "bad-hb").with_member_epoch(3),
        1,
    );
    assert_eq!(
        r.error_code, INVALID_REQUEST,
        "epoch 3, no member id: {r:?}"
    );
    probe.check(&b, "epoch -2 without an instance id");

    // An assignor the broker does not have.
    for name in ["sticky-deluxe", "", "UNIFORM"] {
        let r = heartbeat(
            &b.bootstrap,
            &join("bad-g", "m1", "bad-hb").with_server_assignor(Some(s(name))),
            1,
        );
        assert_eq!(
            r.error_code, UNSUPPORTED_ASSIGNOR,
            "assignor {name:?}: {r:?}"
        );
    }
    probe.check(&b, "an unknown assignor");

    // None of the refused joins made a member: the group does not exist.
    let mut c = RawConn::connect(&b.bootstrap);
    let d: ConsumerGroupDescribeResponse = decode(
        c.request(
            &ConsumerGroupDescribeRequest::default().with_group_ids(vec![GroupId(s("bad-g"))]),
            0,
            2,
        )
        .expect("described"),
        0,
    );
    assert_eq!(d.groups[0].members.len(), 0, "{d:?}");

    // A real member (raw): joins, then sends owned partitions of random topic ids, then
    // an epoch far ahead.
    let r = heartbeat(&b.bootstrap, &join("bad-g", "m1", "bad-hb"), 1);
    assert_eq!(r.error_code, 0, "{r:?}");
    let epoch = r.member_epoch;
    let assigned = r.assignment.clone().expect("an assignment on join");
    let random: Vec<TopicPartitions> = (0..50)
        .map(|i| {
            TopicPartitions::default()
                .with_topic_id(uuid::Uuid::new_v4())
                .with_partitions(vec![i, i + 1, i32::MAX, -1])
        })
        .collect();
    let hb = |epoch: i32, owned: Option<Vec<TopicPartitions>>| {
        ConsumerGroupHeartbeatRequest::default()
            .with_group_id(GroupId(s("bad-g")))
            .with_member_id(s("m1"))
            .with_member_epoch(epoch)
            .with_topic_partitions(owned)
    };
    let r = heartbeat(&b.bootstrap, &hb(epoch, Some(random.clone())), 1);
    assert_eq!(r.error_code, 0, "owned partitions of unknown topics: {r:?}");
    assert_eq!(r.member_epoch, epoch, "{r:?}");
    // The member still has its partitions (the answer carries them: what it said it owns
    // is not what it has).
    let again = r
        .assignment
        .clone()
        .expect("the assignment, as owned differs");
    assert_eq!(
        again.topic_partitions.len(),
        assigned.topic_partitions.len(),
        "{r:?}"
    );
    // The previous epoch with foreign partitions is fenced (not a subset of its own).
    if epoch > 1 {
        let r = heartbeat(&b.bootstrap, &hb(epoch - 1, Some(random.clone())), 1);
        assert_eq!(r.error_code, FENCED_MEMBER_EPOCH, "{r:?}");
    }
    probe.check(&b, "owned partitions of random topic ids");
    for future in [epoch + 1, 1_000_000, i32::MAX] {
        let r = heartbeat(&b.bootstrap, &hb(future, None), 1);
        assert_eq!(r.error_code, FENCED_MEMBER_EPOCH, "epoch {future}: {r:?}");
    }
    // A heartbeat of a member that is not in the group.
    let r = heartbeat(
        &b.bootstrap,
        &hb(1, None).with_member_id(s("never-joined")),
        1,
    );
    assert_eq!(r.error_code, UNKNOWN_MEMBER_ID, "{r:?}");
    probe.check(&b, "an epoch far in the future");
    probe.finish(&b);
    let log = b.terminate();
    assert!(!log.contains("panicked"), "{log}");
}

/// Regular expressions: one that does not compile, a 10 MB one (`a|a|...`) and one whose
/// program would be huge get INVALID_REGULAR_EXPRESSION (128) within seconds, and while
/// the broker refuses the big one, another group's heartbeats are answered at once (the
/// regex is not compiled under the coordinator's lock).
#[test]
fn bad_and_huge_regexes_are_refused_quickly() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path(), &[]);
    let mut probe = Probe::start(&b);

    let rx = |group: &str, re: String| {
        join(group, "rx-member", "unused")
            .with_subscribed_topic_names(None)
            .with_subscribed_topic_regex(Some(StrBytes::from_string(re)))
    };
    for bad in ["[", "(", "a{2,1}", "(?P<x", "\\"] {
        let r = heartbeat(&b.bootstrap, &rx("rx-bad", bad.to_string()), 1);
        assert_eq!(r.error_code, INVALID_REGULAR_EXPRESSION, "{bad:?}: {r:?}");
    }
    probe.check(&b, "a regex that does not compile");

    // A member of another group heartbeats every 100 ms while the huge regexes go in; its
    // slowest answer is measured.
    let other = join("rx-other", "other-member", "probe");
    let r = heartbeat(&b.bootstrap, &other, 1);
    assert_eq!(r.error_code, 0, "{r:?}");
    let other_epoch = r.member_epoch;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let stop = stop.clone();
        let bootstrap = b.bootstrap.clone();
        std::thread::spawn(move || {
            let mut c = RawConn::connect(&bootstrap);
            let mut slowest = Duration::ZERO;
            let hb = ConsumerGroupHeartbeatRequest::default()
                .with_group_id(GroupId(s("rx-other")))
                .with_member_id(s("other-member"))
                .with_member_epoch(other_epoch);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                let r = heartbeat_on(&mut c, &hb, 1);
                slowest = slowest.max(t.elapsed());
                assert_eq!(r.error_code, 0, "the other group's heartbeat: {r:?}");
                std::thread::sleep(Duration::from_millis(100));
            }
            slowest
        })
    };

    let huge = "a|".repeat(5 * 1024 * 1024);
    let cases = [
        ("10 MB of `a|`", huge),
        (
            "a program over the size limit",
            "(?:\\w{1000}){1000}".to_string(),
        ),
        (
            "a deeply nested group",
            "(".repeat(10_000) + &")".repeat(10_000),
        ),
    ];
    for (what, re) in cases {
        let t = Instant::now();
        let r = heartbeat(&b.bootstrap, &rx("rx-huge", re), 1);
        let took = t.elapsed();
        let message: Option<String> = r
            .error_message
            .as_deref()
            .map(|m| m.chars().take(200).collect());
        eprintln!("{what}: answered in {took:?}: {} {message:?}", r.error_code);
        assert_eq!(
            r.error_code, INVALID_REGULAR_EXPRESSION,
            "{what}: {message:?}"
        );
        assert!(
            took < Duration::from_secs(3),
            "{what}: refused only after {took:?}"
        );
        probe.check(&b, what);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let slowest = watcher.join().expect("the other group's heartbeats");
    eprintln!("the other group's slowest heartbeat: {slowest:?}");
    assert!(
        slowest < Duration::from_secs(1),
        "another group's heartbeat waited {slowest:?} behind a huge regex"
    );
    probe.finish(&b);
    let log = b.terminate();
    assert!(!log.contains("panicked"), "{log}");
}

/// 100,000 subscribed topic names of 200 bytes (a 20 MB heartbeat): answered, the broker's
/// memory stays bounded (a few times the request, not growing per heartbeat), and other
/// clients are served meanwhile.
#[test]
fn a_hundred_thousand_subscribed_topics_are_served_within_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path(), &[]);
    let mut probe = Probe::start(&b);
    let before = rss_kb(b.pid());
    let names: Vec<TopicName> = (0..100_000)
        .map(|i| TopicName(StrBytes::from_string(format!("{i:0>200}"))))
        .collect();
    let req = join("many-topics", "many-member", "unused")
        .with_subscribed_topic_names(Some(names.clone()));
    let t = Instant::now();
    let r = heartbeat(&b.bootstrap, &req, 1);
    eprintln!("100,000 topics: answered in {:?}: {r:?}", t.elapsed());
    assert_eq!(r.error_code, 0, "{r:?}");
    let epoch = r.member_epoch;
    probe.check(&b, "100,000 subscribed topics");
    // The same subscription again (a full heartbeat), five times: no growth per heartbeat.
    // The same subscription again (full heartbeats), 15 times: memory levels off (what
    // the first five leave, the next ten do not add to).
    let again = req
        .clone()
        .with_member_epoch(epoch)
        .with_rebalance_timeout_ms(-1);
    let mut seen = Vec::new();
    for i in 0..15 {
        let r = heartbeat(&b.bootstrap, &again, 1);
        assert_eq!(r.error_code, 0, "{r:?}");
        seen.push(rss_kb(b.pid()));
        if i == 4 {
            probe.check(&b, "100,000 subscribed topics, six times");
        }
    }
    let after = *seen.last().unwrap();
    eprintln!("RSS before {before} kB, after each heartbeat {seen:?} kB");
    assert!(
        after < seen[4] + 100 * 1024,
        "RSS goes on growing with the same subscription: {seen:?} kB"
    );
    assert!(
        after < before + 400 * 1024,
        "RSS grew from {before} kB to {after} kB for one 20 MB subscription"
    );
    probe.check(&b, "100,000 subscribed topics, 16 times");
    let leave = ConsumerGroupHeartbeatRequest::default()
        .with_group_id(GroupId(s("many-topics")))
        .with_member_id(s("many-member"))
        .with_member_epoch(-1);
    assert_eq!(heartbeat(&b.bootstrap, &leave, 1).error_code, 0);
    probe.finish(&b);
    let log = b.terminate();
    assert!(!log.contains("panicked"), "{log}");
}

/// A member id of 100 KB: the broker answers (Kafka bounds nothing but the string
/// encoding), keeps serving, and the member can heartbeat and leave.
#[test]
fn a_100_kb_member_id_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path(), &[]);
    let mut probe = Probe::start(&b);
    let long_id = "m".repeat(100 * 1024);
    let r = heartbeat(&b.bootstrap, &join("long-id", &long_id, "probe"), 1);
    eprintln!("100 KB member id: error {}", r.error_code);
    if r.error_code == 0 {
        assert_eq!(r.member_id.as_deref(), Some(long_id.as_str()));
        let hb = ConsumerGroupHeartbeatRequest::default()
            .with_group_id(GroupId(s("long-id")))
            .with_member_id(s(&long_id))
            .with_member_epoch(r.member_epoch);
        assert_eq!(heartbeat(&b.bootstrap, &hb, 1).error_code, 0);
        let mut c = RawConn::connect(&b.bootstrap);
        let d: ConsumerGroupDescribeResponse = decode(
            c.request(
                &ConsumerGroupDescribeRequest::default()
                    .with_group_ids(vec![GroupId(s("long-id"))]),
                0,
                2,
            )
            .expect("described"),
            0,
        );
        assert_eq!(d.groups[0].members.len(), 1);
        assert_eq!(
            heartbeat(&b.bootstrap, &hb.with_member_epoch(-1), 1).error_code,
            0
        );
    } else {
        assert_eq!(r.error_code, INVALID_REQUEST, "{r:?}");
    }
    probe.check(&b, "a 100 KB member id");
    // v0 with a 100 KB member id and a non-zero epoch: an unknown member.
    let r = heartbeat(
        &b.bootstrap,
        &join("long-id", &long_id, "probe").with_member_epoch(5),
        0,
    );
    assert_eq!(r.error_code, UNKNOWN_MEMBER_ID, "{r:?}");
    probe.finish(&b);
    let log = b.terminate();
    assert!(!log.contains("panicked"), "{log}");
}

/// group.consumer.max.size=3: the 4th join of a group is GROUP_MAX_SIZE_REACHED (81), the
/// three members keep heartbeating, a known member rejoining is not refused, and another
/// group is not affected.
#[test]
fn group_consumer_max_size_refuses_the_fourth_member() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path(), &["group.consumer.max.size=3"]);
    let mut probe = Probe::start(&b);
    create_topic(&b.bootstrap, "capped", 4);
    let mut epochs = Vec::new();
    for i in 0..3 {
        let r = heartbeat(&b.bootstrap, &join("capped", &format!("c{i}"), "capped"), 1);
        assert_eq!(r.error_code, 0, "member {i}: {r:?}");
        epochs.push(r.member_epoch);
    }
    let r = heartbeat(&b.bootstrap, &join("capped", "c3", "capped"), 1);
    assert_eq!(r.error_code, GROUP_MAX_SIZE_REACHED, "{r:?}");
    // v0 (the coordinator names the member) too.
    let r = heartbeat(&b.bootstrap, &join("capped", "", "capped"), 0);
    assert_eq!(r.error_code, GROUP_MAX_SIZE_REACHED, "v0: {r:?}");
    // A member of the three rejoining (epoch 0, its own id) is not a 4th.
    let r = heartbeat(&b.bootstrap, &join("capped", "c1", "capped"), 1);
    assert_eq!(r.error_code, 0, "c1 rejoining: {r:?}");
    probe.check(&b, "a 4th member refused");
    // A real member of a full group is refused too (it logs the error and retries).
    let refused = Member::spawn(
        "confluent-kafka",
        &b.bootstrap,
        "capped",
        "capped",
        &["--group-protocol", "consumer"],
    );
    // Proves an absence: the refused member gets nothing (a sleep, not a poll).
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        refused.assignment().is_none_or(|a| a.is_empty()),
        "a 4th member got partitions: {:?}",
        refused.lines()
    );
    // One leaves: the next join fits.
    let leave = ConsumerGroupHeartbeatRequest::default()
        .with_group_id(GroupId(s("capped")))
        .with_member_id(s("c0"))
        .with_member_epoch(-1);
    assert_eq!(heartbeat(&b.bootstrap, &leave, 1).error_code, 0);
    drop(refused);
    let r = heartbeat(&b.bootstrap, &join("capped", "c4", "capped"), 1);
    assert_eq!(r.error_code, 0, "a join after a leave: {r:?}");
    probe.check(&b, "a join after a leave");
    probe.finish(&b);
    let log = b.terminate();
    assert!(!log.contains("panicked"), "{log}");
}

/// group.coordinator.rebalance.protocols=classic: ApiVersions lists neither
/// ConsumerGroupHeartbeat (68) nor ConsumerGroupDescribe (69), and a heartbeat gets
/// UNSUPPORTED_VERSION (35); classic groups still work.
#[test]
fn classic_only_broker_neither_lists_nor_serves_the_consumer_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(
        dir.path(),
        &["group.coordinator.rebalance.protocols=classic"],
    );
    let mut c = RawConn::connect(&b.bootstrap);
    let r: ApiVersionsResponse = decode(
        c.request(&ApiVersionsRequest::default(), 3, 1)
            .expect("ApiVersions"),
        3,
    );
    let keys: BTreeSet<i16> = r.api_keys.iter().map(|k| k.api_key).collect();
    assert!(keys.contains(&11), "JoinGroup listed: {keys:?}");
    assert!(
        !keys.contains(&68) && !keys.contains(&69),
        "consumer protocol listed: {keys:?}"
    );
    create_topic(&b.bootstrap, "classic-only", 2);
    for v in [0, 1] {
        let r = heartbeat(&b.bootstrap, &join("g", "m", "classic-only"), v);
        assert_eq!(r.error_code, UNSUPPORTED_VERSION, "v{v}: {r:?}");
    }
    let mut c = RawConn::connect(&b.bootstrap);
    let d: ConsumerGroupDescribeResponse = decode(
        c.request(
            &ConsumerGroupDescribeRequest::default().with_group_ids(vec![GroupId(s("g"))]),
            0,
            2,
        )
        .expect("ConsumerGroupDescribe answered"),
        0,
    );
    assert_eq!(d.groups[0].error_code, UNSUPPORTED_VERSION, "{d:?}");
    // A classic member reads.
    produce(&b.bootstrap, "classic-only", 2, 10, "c");
    let m = Member::spawn(
        "confluent-kafka",
        &b.bootstrap,
        "classic-only",
        "classic-g",
        &[],
    );
    wait_until("a classic member reads", 60, || m.records().len() >= 10);
    let log = b.terminate();
    assert!(!log.contains("panicked"), "{log}");
}

/// A static member's replacement (epoch 0, the away member's instance id) that names
/// itself with the id of another, active member: the group must still give every
/// partition to someone (no partition left out of the target assignment).
#[test]
fn a_static_replacement_reusing_another_members_id_leaves_no_partition_unassigned() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path(), &[]);
    create_topic(&b.bootstrap, "coll", 4);
    let owned_of = |r: &ConsumerGroupHeartbeatResponse| -> Vec<TopicPartitions> {
        r.assignment
            .as_ref()
            .map(|a| {
                a.topic_partitions
                    .iter()
                    .map(|t| {
                        TopicPartitions::default()
                            .with_topic_id(t.topic_id)
                            .with_partitions(t.partitions.clone())
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let beat = |id: &str, epoch: i32, owned: &[TopicPartitions], instance: Option<&str>| {
        heartbeat(
            &b.bootstrap,
            &ConsumerGroupHeartbeatRequest::default()
                .with_group_id(GroupId(s("coll")))
                .with_member_id(s(id))
                .with_member_epoch(epoch)
                .with_instance_id(instance.map(s))
                .with_topic_partitions(Some(owned.to_vec())),
            1,
        )
    };
    // A (dynamic) takes all 4; S (static "s") joins; A gives 2 up; S takes them.
    let a = heartbeat(&b.bootstrap, &join("coll", "A", "coll"), 1);
    assert_eq!(a.error_code, 0, "{a:?}");
    let mut a_owned = owned_of(&a);
    let mut a_epoch = a.member_epoch;
    let s1 = heartbeat(
        &b.bootstrap,
        &join("coll", "S1", "coll").with_instance_id(Some(s("s"))),
        1,
    );
    assert_eq!(s1.error_code, 0, "{s1:?}");
    let mut s_epoch = s1.member_epoch;
    let mut s_owned = owned_of(&s1);
    for _ in 0..6 {
        let r = beat("A", a_epoch, &a_owned, None);
        assert_eq!(r.error_code, 0, "A: {r:?}");
        a_epoch = r.member_epoch;
        if r.assignment.is_some() {
            a_owned = owned_of(&r);
        }
        let r = beat("S1", s_epoch, &s_owned, Some("s"));
        assert_eq!(r.error_code, 0, "S1: {r:?}");
        s_epoch = r.member_epoch;
        if r.assignment.is_some() {
            s_owned = owned_of(&r);
        }
    }
    let count = |o: &[TopicPartitions]| o.iter().map(|t| t.partitions.len()).sum::<usize>();
    assert_eq!((count(&a_owned), count(&s_owned)), (2, 2), "settled 2 + 2");
    // S leaves for now (epoch -2); its replacement names itself "A".
    let r = beat("S1", -2, &s_owned, Some("s"));
    assert_eq!(r.error_code, 0, "{r:?}");
    let r = heartbeat(
        &b.bootstrap,
        &join("coll", "A", "coll").with_instance_id(Some(s("s"))),
        1,
    );
    eprintln!("the replacement named A: {r:?}");
    // Whatever the answer, after the members heartbeat on (the real A rejoining if it is
    // fenced) every partition is in some member's target assignment.
    let targeted = |d: &ConsumerGroupDescribeResponse| -> BTreeSet<i32> {
        d.groups[0]
            .members
            .iter()
            .flat_map(|m| m.target_assignment.topic_partitions.iter())
            .flat_map(|t| t.partitions.iter().copied())
            .collect()
    };
    let describe = || -> ConsumerGroupDescribeResponse {
        let mut c = RawConn::connect(&b.bootstrap);
        decode(
            c.request(
                &ConsumerGroupDescribeRequest::default().with_group_ids(vec![GroupId(s("coll"))]),
                0,
                2,
            )
            .expect("described"),
            0,
        )
    };
    let r = beat("A", a_epoch, &a_owned, None);
    eprintln!("the real A heartbeats: {r:?}");
    if r.error_code != 0 {
        let r = heartbeat(&b.bootstrap, &join("coll", "A", "coll"), 1);
        eprintln!("the real A rejoins: {r:?}");
    }
    let d = describe();
    assert_eq!(
        targeted(&d),
        (0..4).collect::<BTreeSet<i32>>(),
        "a partition is in no member's target: {d:?}"
    );
    let log = b.terminate();
    assert!(!log.contains("panicked"), "{log}");
}
