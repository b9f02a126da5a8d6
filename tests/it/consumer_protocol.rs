//! KIP-848's consumer group protocol with real clients: confluent-kafka members
//! (tests/compat/group_member.py `--group-protocol consumer`, one process each, so a member
//! can be closed or restarted) and librdkafka from Rust with `group.protocol=consumer`;
//! raw frames for ConsumerGroupDescribe and ListGroups v5. The broker assigns (the
//! `uniform` assignor by default) and members reconcile incrementally: a member keeps
//! consuming the partitions it keeps while others move.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kafka_protocol::messages::consumer_group_describe_response::{Assignment, DescribedGroup};
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, GroupId, ListGroupsRequest,
    ListGroupsResponse,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use crate::groups::{covers, create_topic, produce, Member};
use crate::harness::{decode, poll_for, wait_until, RawConn, TestBroker};

/// Short heartbeats and sessions keep the tests fast; no initial delay for classic groups.
const FAST_GROUPS: [&str; 3] = [
    "group.consumer.heartbeat.interval.ms=500",
    "group.consumer.session.timeout.ms=6000",
    "group.initial.rebalance.delay.ms=0",
];

fn broker() -> TestBroker {
    TestBroker::start_with(&FAST_GROUPS)
}

/// A confluent-kafka member on the consumer protocol, with more options.
fn member(b: &TestBroker, topic: &str, group: &str, extra: &[&str]) -> Member {
    let mut args = vec!["--group-protocol", "consumer"];
    args.extend_from_slice(extra);
    Member::spawn("confluent-kafka", &b.bootstrap, topic, group, &args)
}

fn all(partitions: i32) -> BTreeSet<i32> {
    (0..partitions).collect()
}

/// Every assignment a member reported, in order (`assigned -` is the empty set).
fn assignment_history(m: &Member) -> Vec<BTreeSet<i32>> {
    m.lines()
        .iter()
        .filter_map(|l| l.strip_prefix("assigned "))
        .map(|a| {
            a.split(',')
                .filter(|p| *p != "-")
                .map(|p| p.parse().unwrap())
                .collect()
        })
        .collect()
}

/// The last `owned T:P,...` line of a `--pattern` member (`None` before the first).
fn owned(m: &Member) -> Option<BTreeSet<(String, i32)>> {
    m.lines()
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("owned "))
        .map(|o| {
            o.split(',')
                .filter(|tp| *tp != "-")
                .map(|tp| {
                    let (t, p) = tp.rsplit_once(':').unwrap();
                    (t.to_string(), p.parse().unwrap())
                })
                .collect()
        })
}

/// The values of the records a member read, in order.
fn values(m: &Member) -> Vec<String> {
    m.lines()
        .iter()
        .filter_map(|l| l.strip_prefix("record "))
        .map(|r| r.splitn(3, ' ').nth(2).unwrap_or("").to_string())
        .collect()
}

fn closed(m: &Member) -> bool {
    m.lines().iter().any(|l| l == "closed")
}

fn group_id(g: &str) -> GroupId {
    GroupId(StrBytes::from_string(g.to_string()))
}

/// ConsumerGroupDescribe of one group by raw frame.
fn describe(bootstrap: &str, group: &str, version: i16) -> DescribedGroup {
    let mut conn = RawConn::connect(bootstrap);
    let req = ConsumerGroupDescribeRequest::default().with_group_ids(vec![group_id(group)]);
    let r: ConsumerGroupDescribeResponse = decode(
        conn.request(&req, version, 1)
            .expect("ConsumerGroupDescribe answered"),
        version,
    );
    assert_eq!(r.groups.len(), 1, "one group asked, one described: {r:?}");
    r.groups.into_iter().next().unwrap()
}

/// The partitions of `topic` in a described assignment (any other topic fails the test).
fn partitions_of(a: &Assignment, topic: &str) -> BTreeSet<i32> {
    let mut parts = BTreeSet::new();
    for t in &a.topic_partitions {
        assert_eq!(t.topic_name.0.as_str(), topic, "assignment {a:?}");
        assert!(
            !t.topic_id.is_nil(),
            "an assigned topic without its id: {a:?}"
        );
        parts.extend(t.partitions.iter().copied());
    }
    parts
}

/// Polls ConsumerGroupDescribe until the group is Stable with `members` members, every
/// one at the assignment epoch (reconciled), and returns that description.
fn describe_stable(bootstrap: &str, group: &str, members: usize) -> DescribedGroup {
    poll_for(
        &format!("group {group} is Stable with {members} reconciled members"),
        60,
        || {
            let g = describe(bootstrap, group, 0);
            let settled = g.error_code == 0
                && g.group_state.as_str() == "Stable"
                && g.members.len() == members
                && g.members
                    .iter()
                    .all(|m| m.member_epoch == g.assignment_epoch);
            if settled {
                Ok(g)
            } else {
                Err(format!("last seen: {g:?}"))
            }
        },
    )
}

/// ListGroups v5 with a types filter (empty: every group).
fn list_groups(bootstrap: &str, types: &[&str]) -> Vec<ListedGroup> {
    let mut conn = RawConn::connect(bootstrap);
    let req = ListGroupsRequest::default().with_types_filter(
        types
            .iter()
            .map(|t| StrBytes::from_string(t.to_string()))
            .collect(),
    );
    let r: ListGroupsResponse = decode(conn.request(&req, 5, 2).expect("ListGroups answered"), 5);
    assert_eq!(r.error_code, 0, "ListGroups v5: {r:?}");
    r.groups
}

/// Two consumer-protocol members share 6 partitions, 3 each (uniform). When the second
/// joins, the first only gives partitions up (its assignment shrinks, never empties: it
/// keeps consuming what it keeps); every record is read; when the second closes the first
/// gets all 6 back and reads from them.
#[test]
fn two_consumer_protocol_members_share_partitions_incrementally() {
    let b = broker();
    create_topic(&b.bootstrap, "inc", 6);
    produce(&b.bootstrap, "inc", 6, 300, "first");
    let a = member(&b, "inc", "inc", &[]);
    wait_until("A alone owns all 6 partitions", 60, || {
        a.assignment() == Some(all(6))
    });
    wait_until("A reads the first 300 records", 60, || {
        a.records().len() >= 300
    });

    let mut m_b = member(&b, "inc", "inc", &[]);
    poll_for("A and B own 3 disjoint partitions each", 60, || {
        let (x, y) = (a.assignment(), m_b.assignment());
        let three = |s: &Option<BTreeSet<i32>>| s.as_ref().is_some_and(|s| s.len() == 3);
        if covers(&[&a, &m_b], 6) && three(&x) && three(&y) {
            Ok(())
        } else {
            Err(format!("A has {x:?}, B has {y:?}"))
        }
    });
    let history = assignment_history(&a);
    let full = history.iter().position(|s| *s == all(6)).unwrap();
    for w in history[full..].windows(2) {
        assert!(
            !w[1].is_empty() && w[1].is_subset(&w[0]),
            "A's assignment did not only shrink when B joined (not incremental): {history:?}"
        );
    }
    let kept = a.assignment().unwrap();
    let given = m_b.assignment().unwrap();
    let g = describe_stable(&b.bootstrap, "inc", 2);
    assert_eq!(g.assignor_name.as_str(), "uniform");

    produce(&b.bootstrap, "inc", 6, 300, "second");
    wait_until("A and B together read all 600 records", 60, || {
        let read: BTreeSet<(i32, i64)> = a.records().into_iter().chain(m_b.records()).collect();
        (0..6).all(|p| (0..100).all(|o| read.contains(&(p, o))))
    });
    let a_read = a.records();
    let b_read: BTreeSet<(i32, i64)> = m_b.records().into_iter().collect();
    for p in 0..6 {
        for o in 50..100 {
            if kept.contains(&p) {
                assert!(
                    a_read.contains(&(p, o)),
                    "A kept partition {p} but did not read {p}/{o}"
                );
            } else {
                assert!(b_read.contains(&(p, o)), "B did not read {p}/{o}");
                assert!(
                    !a_read.contains(&(p, o)),
                    "A read {p}/{o}, produced after it gave partition {p} up"
                );
            }
        }
    }
    let mut a_count: BTreeMap<(i32, i64), usize> = BTreeMap::new();
    for r in &a_read {
        *a_count.entry(*r).or_default() += 1;
    }
    for ((p, o), n) in &a_count {
        assert!(
            *n == 1 || !kept.contains(p),
            "A read {p}/{o} {n} times from a partition it never gave up"
        );
    }
    assert!(
        b_read.iter().all(|(p, _)| given.contains(p)),
        "B read outside its assignment {given:?}: {b_read:?}"
    );

    m_b.close();
    wait_until("A gets all 6 partitions back after B closes", 60, || {
        a.assignment() == Some(all(6))
    });
    let history = assignment_history(&a);
    assert!(
        history[full..].iter().all(|s| !s.is_empty()),
        "A's assignment emptied on the way: {history:?}"
    );
    produce(&b.bootstrap, "inc", 6, 60, "third");
    wait_until(
        "A reads the 60 new records from all 6 partitions",
        60,
        || {
            let read: BTreeSet<(i32, i64)> = a.records().into_iter().collect();
            (0..6).all(|p| (100..110).all(|o| read.contains(&(p, o))))
        },
    );
}

/// Offsets committed by a consumer-protocol member are where the next member of the group
/// starts: nothing before them is read again, nothing after them skipped.
#[test]
fn consumer_protocol_commits_survive_member_restart() {
    let b = broker();
    create_topic(&b.bootstrap, "resume", 2);
    produce(&b.bootstrap, "resume", 2, 100, "r");
    let mut first = member(&b, "resume", "resume", &["--max", "60"]);
    wait_until("the first member reads 60 records and closes", 60, || {
        closed(&first)
    });
    first.close();
    let commits = first.last_commits();
    // 50 records per partition: 60 reach both.
    assert_eq!(
        commits.keys().copied().collect::<BTreeSet<_>>(),
        all(2),
        "{commits:?}"
    );
    let first_read: BTreeSet<(i32, i64)> = first.records().into_iter().collect();
    let want_first: BTreeSet<(i32, i64)> = (0..2)
        .flat_map(|p| (0..commits[&p]).map(move |o| (p, o)))
        .collect();
    assert_eq!(
        first_read, want_first,
        "the first member's commits {commits:?}"
    );
    assert_eq!(first.records().len(), 60);

    // 20 more a partition: both have records after their commit (70 each now).
    produce(&b.bootstrap, "resume", 2, 40, "after");
    // `latest`: a commit the broker lost would make the member skip, not re-read.
    let second = member(&b, "resume", "resume", &["--reset", "latest"]);
    wait_until("the second member reads the other 80", 60, || {
        second.records().len() >= 80
    });
    // Proves an absence: a record read twice would come right behind (a sleep, not a poll).
    std::thread::sleep(Duration::from_secs(1));
    let read = second.records();
    for p in 0..2 {
        let first_read = read.iter().find(|r| r.0 == p).map(|r| r.1);
        assert_eq!(
            first_read,
            Some(commits[&p]),
            "partition {p} did not resume at its committed offset"
        );
    }
    let want: BTreeSet<(i32, i64)> = (0..2)
        .flat_map(|p| (commits[&p]..70).map(move |o| (p, o)))
        .collect();
    assert_eq!(read.len(), 80, "records read twice or skipped: {read:?}");
    assert_eq!(read.into_iter().collect::<BTreeSet<_>>(), want);
}

/// librdkafka from Rust with `group.protocol=consumer`: subscribe, read every record of a
/// 3-partition topic, commit, and find the commits with OffsetFetch, from the member itself
/// (member id and epoch) and from another consumer of the group.
#[test]
fn rdkafka_rust_consumer_protocol_subscribe_and_read() {
    let b = broker();
    create_topic(&b.bootstrap, "rust", 3);
    produce(&b.bootstrap, "rust", 3, 300, "rs");
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &b.bootstrap)
        .set("group.id", "rust-cg")
        .set("group.protocol", "consumer")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("a consumer with group.protocol=consumer");
    consumer.subscribe(&["rust"]).unwrap();
    let mut read: BTreeMap<(i32, i64), String> = BTreeMap::new();
    let mut errors: Vec<String> = Vec::new();
    poll_for("the Rust consumer reads all 300 records", 60, || {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let value = String::from_utf8_lossy(m.payload().unwrap_or_default()).to_string();
                assert_eq!(m.topic(), "rust");
                read.insert((m.partition(), m.offset()), value);
            }
            Some(Err(e)) => errors.push(e.to_string()),
            None => {}
        }
        if read.len() == 300 {
            Ok(())
        } else {
            Err(format!("{} read; errors: {errors:?}", read.len()))
        }
    });
    for ((p, o), value) in &read {
        assert_eq!(
            *value,
            format!("rs-{}", o * 3 + *p as i64),
            "record {p}/{o}"
        );
    }
    let assignment = consumer.assignment().unwrap();
    let mine: BTreeSet<i32> = assignment
        .elements()
        .iter()
        .map(|e| e.partition())
        .collect();
    assert_eq!(mine, all(3), "the only member owns every partition");
    consumer.commit_consumer_state(CommitMode::Sync).unwrap();

    let wanted = || {
        let mut tpl = TopicPartitionList::new();
        for p in 0..3 {
            tpl.add_partition("rust", p);
        }
        tpl
    };
    let check = |tpl: TopicPartitionList, who: &str| {
        for p in 0..3 {
            assert_eq!(
                tpl.find_partition("rust", p).unwrap().offset(),
                Offset::Offset(100),
                "partition {p}'s commit as {who} sees it"
            );
        }
    };
    check(
        consumer
            .committed_offsets(wanted(), Duration::from_secs(10))
            .unwrap(),
        "the member",
    );
    let other: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &b.bootstrap)
        .set("group.id", "rust-cg")
        .create()
        .unwrap();
    check(
        other
            .committed_offsets(wanted(), Duration::from_secs(10))
            .unwrap(),
        "another consumer",
    );
}

/// ConsumerGroupDescribe (v0 and v1) of a two-member group: Stable, epochs, the uniform
/// assignor, each member reconciled (epoch at the assignment epoch, target = current) and
/// the partitions split between them as the clients report. ListGroups v5 tells consumer
/// from classic groups, and filters by type.
#[test]
fn consumer_group_describe_shows_epochs_and_assignment() {
    let b = broker();
    create_topic(&b.bootstrap, "described", 6);
    let m1 = member(&b, "described", "cg", &[]);
    let m2 = member(&b, "described", "cg", &[]);
    let classic = Member::spawn(
        "confluent-kafka",
        &b.bootstrap,
        "described",
        "classic-g",
        &[],
    );
    wait_until(
        "the two members own 3 partitions each and the classic one all 6",
        60,
        || {
            covers(&[&m1, &m2], 6)
                && m1.assignment().is_some_and(|a| a.len() == 3)
                && covers(&[&classic], 6)
        },
    );

    let g = describe_stable(&b.bootstrap, "cg", 2);
    assert_eq!(g.group_id.0.as_str(), "cg");
    assert!(
        g.group_epoch >= 2,
        "two joins, group epoch {}",
        g.group_epoch
    );
    assert_eq!(g.assignment_epoch, g.group_epoch, "Stable: {g:?}");
    assert_eq!(g.assignor_name.as_str(), "uniform");
    let mut seen = BTreeSet::new();
    let mut described: Vec<BTreeSet<i32>> = Vec::new();
    let mut ids = BTreeSet::new();
    for m in &g.members {
        assert!(ids.insert(m.member_id.to_string()), "member ids: {g:?}");
        assert_eq!(m.member_epoch, g.assignment_epoch, "member {m:?}");
        assert_eq!(m.assignment, m.target_assignment, "member {m:?}");
        let topics: Vec<&str> = m
            .subscribed_topic_names
            .iter()
            .map(|t| t.0.as_str())
            .collect();
        assert_eq!(topics, ["described"], "member {m:?}");
        let parts = partitions_of(&m.assignment, "described");
        assert_eq!(parts.len(), 3, "member {m:?}");
        for p in &parts {
            assert!(seen.insert(*p), "partition {p} in two members: {g:?}");
        }
        described.push(parts);
    }
    assert_eq!(seen, all(6));
    let mut reported = vec![m1.assignment().unwrap(), m2.assignment().unwrap()];
    described.sort();
    reported.sort();
    assert_eq!(described, reported, "the broker's and the clients' view");

    // `weir group describe` shows the same: member epochs and target assignments
    // (--members), the group and target epochs (--state).
    let cli = |extra: &str| {
        let out = std::process::Command::new(crate::harness::weir_bin())
            .args([
                "group",
                "describe",
                "--bootstrap-server",
                &b.bootstrap,
                "cg",
                extra,
            ])
            .output()
            .expect("run weir group describe");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).expect("utf-8")
    };
    let members = cli("--members");
    let mut lines = members.lines();
    let header: Vec<&str> = lines.next().expect("header").split_whitespace().collect();
    assert_eq!(
        header,
        [
            "GROUP",
            "CONSUMER-ID",
            "GROUP-INSTANCE-ID",
            "HOST",
            "CLIENT-ID",
            "#PARTITIONS",
            "EPOCH",
            "ASSIGNMENT",
            "TARGET-ASSIGNMENT"
        ],
        "{members}"
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows.len(), 2, "{members}");
    for row in &rows {
        let m = g
            .members
            .iter()
            .find(|m| m.member_id.as_str() == row[1])
            .unwrap_or_else(|| panic!("{} not described: {members}", row[1]));
        assert_eq!(row[5], "3", "{members}");
        assert_eq!(row[6], m.member_epoch.to_string(), "{members}");
        let parts: Vec<String> = partitions_of(&m.assignment, "described")
            .iter()
            .map(i32::to_string)
            .collect();
        let expected = format!("described:{}", parts.join(","));
        assert_eq!(
            (row[7], row[8]),
            (expected.as_str(), expected.as_str()),
            "{members}"
        );
    }
    let state = cli("--state");
    let row: Vec<&str> = state
        .lines()
        .nth(1)
        .expect("a row")
        .split_whitespace()
        .collect();
    // GROUP, COORDINATOR (two words), ASSIGNMENT-STRATEGY, STATE, GROUP-EPOCH,
    // TARGET-ASSIGNMENT-EPOCH, #MEMBERS
    assert_eq!(
        (row[0], row[3], row[4], row[5], row[6], row[7]),
        (
            "cg",
            "uniform",
            "Stable",
            g.group_epoch.to_string().as_str(),
            g.assignment_epoch.to_string().as_str(),
            "2"
        ),
        "{state}"
    );

    let g1 = describe(&b.bootstrap, "cg", 1);
    assert_eq!(g1.error_code, 0);
    assert_eq!(g1.members.len(), 2);
    for m in &g1.members {
        assert_eq!(m.member_type, 1, "v1: a consumer-protocol member: {m:?}");
    }
    assert_eq!(
        describe(&b.bootstrap, "no-such-group", 0).error_code,
        69,
        "GROUP_ID_NOT_FOUND"
    );
    assert_eq!(
        describe(&b.bootstrap, "classic-g", 0).error_code,
        69,
        "GROUP_ID_NOT_FOUND for a classic group"
    );

    let find = |groups: &[ListedGroup], id: &str| -> Option<ListedGroup> {
        groups.iter().find(|g| g.group_id.0.as_str() == id).cloned()
    };
    let listed = list_groups(&b.bootstrap, &[]);
    let cg = find(&listed, "cg").expect("cg listed");
    assert_eq!(cg.group_type.as_str(), "consumer", "{cg:?}");
    assert_eq!(cg.protocol_type.as_str(), "consumer", "{cg:?}");
    assert_eq!(cg.group_state.as_str(), "Stable", "{cg:?}");
    let cl = find(&listed, "classic-g").expect("classic-g listed");
    assert_eq!(cl.group_type.as_str(), "classic", "{cl:?}");
    assert_eq!(cl.protocol_type.as_str(), "consumer", "{cl:?}");
    let consumers = list_groups(&b.bootstrap, &["consumer"]);
    assert!(find(&consumers, "cg").is_some() && find(&consumers, "classic-g").is_none());
    let classics = list_groups(&b.bootstrap, &["classic"]);
    assert!(find(&classics, "classic-g").is_some() && find(&classics, "cg").is_none());
}

/// An empty classic group becomes a consumer group when a consumer-protocol member joins,
/// and back when a classic member joins after it left; the committed offsets carry over
/// both ways (each member resumes exactly after the previous one's commits).
#[test]
fn empty_classic_group_converts_to_consumer_protocol_keeping_offsets() {
    let b = broker();
    create_topic(&b.bootstrap, "conv", 2);
    produce(&b.bootstrap, "conv", 2, 100, "one");
    // Stage 1: classic, 60 of the 100 (50 a partition: both get commits).
    let mut classic = Member::spawn(
        "confluent-kafka",
        &b.bootstrap,
        "conv",
        "conv",
        &["--max", "60"],
    );
    wait_until("the classic member reads 60 and closes", 60, || {
        closed(&classic)
    });
    classic.close();
    let c1 = classic.last_commits();
    assert_eq!(
        c1.keys().copied().collect::<BTreeSet<_>>(),
        all(2),
        "{c1:?}"
    );

    // Stage 2: the consumer protocol in the same group; 20 more a partition first, so that
    // both have records after their commit (70 each now), 80 left.
    produce(&b.bootstrap, "conv", 2, 40, "two");
    let mut modern = member(&b, "conv", "conv", &["--reset", "latest"]);
    wait_until("the consumer-protocol member reads the 80 left", 60, || {
        modern.records().len() >= 80
    });
    let g = describe(&b.bootstrap, "conv", 0);
    assert_eq!(g.error_code, 0, "a consumer group now: {g:?}");
    assert_eq!(g.members.len(), 1, "{g:?}");
    modern.close();
    let read = modern.records();
    assert_eq!(read.len(), 80, "records read twice or skipped: {read:?}");
    for p in 0..2 {
        let mine: Vec<i64> = read.iter().filter(|r| r.0 == p).map(|r| r.1).collect();
        let want: Vec<i64> = (c1[&p]..70).collect();
        assert_eq!(
            mine, want,
            "partition {p}: not resumed at the classic commit {}",
            c1[&p]
        );
    }
    let c2 = modern.last_commits();
    assert_eq!(c2, BTreeMap::from([(0, 70), (1, 70)]));

    // Stage 3: classic again; 50 more a partition.
    produce(&b.bootstrap, "conv", 2, 100, "three");
    let again = Member::spawn(
        "confluent-kafka",
        &b.bootstrap,
        "conv",
        "conv",
        &["--reset", "latest"],
    );
    wait_until("the classic member reads the 100 new records", 60, || {
        again.records().len() >= 100
    });
    let classics = list_groups(&b.bootstrap, &["classic"]);
    assert!(
        classics.iter().any(|g| g.group_id.0.as_str() == "conv"),
        "a classic group again: {classics:?}"
    );
    // Proves an absence: a record read twice would come right behind (a sleep, not a poll).
    std::thread::sleep(Duration::from_secs(1));
    let read = again.records();
    for p in 0..2 {
        let first_read = read.iter().find(|r| r.0 == p).map(|r| r.1);
        assert_eq!(
            first_read,
            Some(70),
            "partition {p} did not resume at the consumer-protocol member's commit"
        );
    }
    let want: BTreeSet<(i32, i64)> = (0..2)
        .flat_map(|p| (70..120).map(move |o| (p, o)))
        .collect();
    assert_eq!(read.len(), 100, "records read twice or skipped: {read:?}");
    assert_eq!(read.into_iter().collect::<BTreeSet<_>>(), want);
}

/// Static membership (KIP-345) on the consumer protocol: a static member that closes
/// (librdkafka leaves with member epoch -2) keeps its partitions in the group for the
/// session timeout; restarted with the same instance id it gets the same partitions back,
/// and the other member's assignment never changes.
#[test]
fn static_consumer_protocol_member_keeps_its_partitions() {
    // A session long enough for the restart of a Python process on a loaded machine.
    let b = TestBroker::start_with(&[
        "group.consumer.heartbeat.interval.ms=500",
        "group.consumer.session.timeout.ms=20000",
        "group.initial.rebalance.delay.ms=0",
    ]);
    create_topic(&b.bootstrap, "static", 4);
    let a = member(&b, "static", "s", &["--instance-id", "member-a"]);
    let mut m_b = member(&b, "static", "s", &["--instance-id", "member-b"]);
    wait_until("two static members own 2 partitions each", 60, || {
        covers(&[&a, &m_b], 4) && a.assignment().is_some_and(|s| s.len() == 2)
    });
    let g = describe_stable(&b.bootstrap, "s", 2);
    let instance = |m: &kafka_protocol::messages::consumer_group_describe_response::Member| {
        m.instance_id.as_ref().map(|i| i.to_string())
    };
    let mut instances: Vec<Option<String>> = g.members.iter().map(instance).collect();
    instances.sort();
    assert_eq!(
        instances,
        [Some("member-a".to_string()), Some("member-b".to_string())]
    );
    let before_a = a.assignment_changes();
    let a_parts = a.assignment().unwrap();
    let b_parts = m_b.assignment().unwrap();

    m_b.close();
    // The static member is still in the group, with its partitions, none moved to A.
    let g = describe(&b.bootstrap, "s", 0);
    let kept = g
        .members
        .iter()
        .find(|m| instance(m).as_deref() == Some("member-b"))
        .unwrap_or_else(|| panic!("member-b left the group at once on close: {g:?}"));
    assert_eq!(
        partitions_of(&kept.target_assignment, "static"),
        b_parts,
        "{g:?}"
    );
    let a_described = g
        .members
        .iter()
        .find(|m| instance(m).as_deref() == Some("member-a"))
        .unwrap();
    assert_eq!(
        partitions_of(&a_described.target_assignment, "static"),
        a_parts,
        "{g:?}"
    );

    let restarted = member(&b, "static", "s", &["--instance-id", "member-b"]);
    let first = poll_for(
        "the restarted member gets partitions",
        60,
        || match assignment_history(&restarted)
            .into_iter()
            .find(|s| !s.is_empty())
        {
            Some(s) => Ok(s),
            None => Err(format!("lines: {:?}", restarted.lines())),
        },
    );
    assert_eq!(first, b_parts, "the restarted static member's partitions");
    // Proves an absence: give a rebalance, if one were coming, time to reach the other
    // member (a sleep, not a poll).
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        a.assignment_changes(),
        before_a,
        "the other member's assignment changed: {:?}",
        assignment_history(&a)
    );
    assert_eq!(a.assignment(), Some(a_parts));
    assert!(covers(&[&a, &restarted], 4));
    describe_stable(&b.bootstrap, "s", 2);
}

/// A regex subscription (librdkafka sends `^rx.*` as subscribed_topic_regex; the broker
/// resolves it): the member gets the matching topic, then a matching topic created later,
/// and reads both; a topic that does not match is never assigned.
#[test]
fn regex_subscription_picks_up_new_topics() {
    let b = broker();
    create_topic(&b.bootstrap, "rx-one", 2);
    produce(&b.bootstrap, "rx-one", 2, 20, "one");
    let m = member(&b, "rx", "rxg", &["--pattern"]);
    let tps = |t: &str, n: i32| -> BTreeSet<(String, i32)> {
        (0..n).map(|p| (t.to_string(), p)).collect()
    };
    poll_for("the member owns rx-one's 2 partitions", 60, || {
        let o = owned(&m);
        if o == Some(tps("rx-one", 2)) {
            Ok(())
        } else {
            Err(format!("owns {o:?}"))
        }
    });
    wait_until("the member reads rx-one's 20 records", 60, || {
        values(&m).iter().filter(|v| v.starts_with("one-")).count() >= 20
    });
    let g = describe(&b.bootstrap, "rxg", 0);
    assert_eq!(g.members.len(), 1, "{g:?}");
    let regex = g.members[0]
        .subscribed_topic_regex
        .as_ref()
        .map(|r| r.to_string());
    assert!(
        regex.as_deref().is_some_and(|r| r.contains("^rx.*")),
        "the regex as described: {regex:?}"
    );

    create_topic(&b.bootstrap, "rx-two", 3);
    create_topic(&b.bootstrap, "other", 1);
    produce(&b.bootstrap, "rx-two", 3, 30, "two");
    produce(&b.bootstrap, "other", 1, 5, "other");
    let mut want = tps("rx-one", 2);
    want.extend(tps("rx-two", 3));
    poll_for(
        "the member also owns the new rx-two's 3 partitions",
        60,
        || {
            let o = owned(&m);
            if o.as_ref() == Some(&want) {
                Ok(())
            } else {
                Err(format!("owns {o:?}"))
            }
        },
    );
    wait_until("the member reads rx-two's 30 records", 60, || {
        values(&m).iter().filter(|v| v.starts_with("two-")).count() >= 30
    });
    let vals = values(&m);
    assert!(
        !vals.iter().any(|v| v.starts_with("other-")),
        "read a topic that does not match: {vals:?}"
    );
    assert!(
        m.lines()
            .iter()
            .filter_map(|l| l.strip_prefix("owned "))
            .all(|o| !o.contains("other:")),
        "assigned a topic that does not match"
    );
    let twos: BTreeSet<&String> = vals.iter().filter(|v| v.starts_with("two-")).collect();
    assert_eq!(twos.len(), 30, "rx-two's records: {twos:?}");
}

/// The member types ConsumerGroupDescribe v1 reports (0 classic, 1 consumer, KIP-1099),
/// sorted.
fn member_types(bootstrap: &str, group: &str) -> Vec<i8> {
    let g = describe(bootstrap, group, 1);
    assert_eq!(g.error_code, 0, "{g:?}");
    let mut types: Vec<i8> = g.members.iter().map(|m| m.member_type).collect();
    types.sort();
    types
}

/// Waits until `members` together have read offsets 0..`per_partition` of partitions
/// 0..4.
fn wait_all_read(members: &[&Member], per_partition: i64) {
    poll_for("every record is read", 60, || {
        let read: BTreeSet<(i32, i64)> = members.iter().flat_map(|m| m.records()).collect();
        let missing: Vec<(i32, i64)> = (0..4)
            .flat_map(|p| (0..per_partition).map(move |o| (p, o)))
            .filter(|r| !read.contains(r))
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("not read yet: {missing:?}"))
        }
    });
}

fn group_type_is(bootstrap: &str, group: &str, kind: &str) -> bool {
    list_groups(bootstrap, &[kind])
        .iter()
        .any(|g| g.group_id.0.as_str() == group)
}

/// KIP-848's online migration with real clients, a rolling restart each way, records
/// produced between every step. Up: a classic group of a confluent-kafka member (eager
/// `range`) and a kafka-python member; each in turn leaves and comes back as a
/// confluent-kafka consumer-protocol member. The first one back upgrades the group with
/// the remaining classic member inside it (which rebalances through JoinGroup/SyncGroup
/// with the broker assigning). Down: each consumer-protocol member in turn comes back as a
/// classic confluent-kafka member (`cooperative-sticky`); when the last consumer-protocol
/// member leaves, the group is classic again. Nothing is lost: every record is read, and
/// a record is read twice only if the commit after its first read failed.
#[test]
fn a_classic_group_migrates_online_as_members_restart_and_back() {
    let b = broker();
    create_topic(&b.bootstrap, "roll", 4);
    let classic =
        |client: &str, extra: &[&str]| Member::spawn(client, &b.bootstrap, "roll", "roll", extra);
    let step = |tag: &str| produce(&b.bootstrap, "roll", 4, 40, tag);
    let mut gone: Vec<Member> = Vec::new();

    let mut c1 = classic("confluent-kafka", &["--assignor", "range"]);
    let mut c2 = classic("kafka-python", &[]);
    wait_until("two classic members share the 4 partitions", 60, || {
        covers(&[&c1, &c2], 4)
    });
    assert!(group_type_is(&b.bootstrap, "roll", "classic"));
    step("classic");
    wait_all_read(&[&c1, &c2], 10);

    // Up, first member: the group becomes a consumer-protocol group with c2 in it.
    c1.close();
    gone.push(c1);
    let mut k1 = member(&b, "roll", "roll", &[]);
    poll_for("the upgraded group is shared by c2 and k1", 60, || {
        if covers(&[&c2, &k1], 4) && group_type_is(&b.bootstrap, "roll", "consumer") {
            Ok(())
        } else {
            Err(format!(
                "c2 {:?}, k1 {:?}",
                c2.assignment(),
                k1.assignment()
            ))
        }
    });
    describe_stable(&b.bootstrap, "roll", 2);
    assert_eq!(
        member_types(&b.bootstrap, "roll"),
        vec![0, 1],
        "one classic, one consumer member"
    );
    step("mixed-up");
    wait_all_read(&[&gone[0], &c2, &k1], 20);
    assert!(
        values(&c2).iter().any(|v| v.starts_with("mixed-up")),
        "the classic member in the consumer-protocol group read nothing"
    );

    // Up, second member: only consumer-protocol members left.
    c2.close();
    gone.push(c2);
    let k2 = member(&b, "roll", "roll", &[]);
    wait_until("k1 and k2 share the 4 partitions", 60, || {
        covers(&[&k1, &k2], 4)
    });
    describe_stable(&b.bootstrap, "roll", 2);
    assert_eq!(member_types(&b.bootstrap, "roll"), vec![1, 1]);
    step("consumer");
    wait_all_read(&[&gone[0], &gone[1], &k1, &k2], 30);

    // Down, first member: a classic member joins the consumer-protocol group.
    k1.close();
    gone.push(k1);
    let c3 = classic("confluent-kafka", &["--assignor", "cooperative-sticky"]);
    wait_until("k2 and c3 share the 4 partitions", 60, || {
        covers(&[&k2, &c3], 4)
    });
    describe_stable(&b.bootstrap, "roll", 2);
    assert_eq!(member_types(&b.bootstrap, "roll"), vec![0, 1]);
    step("mixed-down");
    wait_all_read(&[&gone[0], &gone[1], &gone[2], &k2, &c3], 40);
    assert!(
        values(&c3).iter().any(|v| v.starts_with("mixed-down")),
        "the classic member in the consumer-protocol group read nothing"
    );

    // Down, second member: the last consumer-protocol member leaves; classic again.
    let mut k2 = k2;
    k2.close();
    gone.push(k2);
    wait_until("the group is classic again", 30, || {
        group_type_is(&b.bootstrap, "roll", "classic")
    });
    let c4 = classic("confluent-kafka", &["--assignor", "cooperative-sticky"]);
    wait_until("c3 and c4 share the 4 partitions", 60, || {
        covers(&[&c3, &c4], 4)
    });
    step("classic-again");

    let everyone: Vec<&Member> = gone.iter().chain([&c3, &c4]).collect();
    wait_all_read(&everyone, 50);
    // A record read again after a read whose commit succeeded would be a lost commit:
    // count, per record, the reads followed by their successful commit (a member writes
    // "committed P O+1" right after "record P O" when the commit succeeds).
    let mut committed_reads: BTreeMap<(i32, i64), usize> = BTreeMap::new();
    for m in &everyone {
        let lines = m.lines();
        for w in lines.windows(2) {
            let Some(rest) = w[0].strip_prefix("record ") else {
                continue;
            };
            let mut it = rest.split(' ');
            let (p, o): (i32, i64) = (
                it.next().unwrap().parse().unwrap(),
                it.next().unwrap().parse().unwrap(),
            );
            let reads = committed_reads.entry((p, o)).or_default();
            if w[1] == format!("committed {p} {}", o + 1) {
                *reads += 1;
            }
        }
    }
    for ((p, o), n) in &committed_reads {
        assert!(*n <= 1, "{p}/{o} was read and committed {n} times");
    }
}

/// A directory holding `librdkafka.so.1` → the librdkafka that confluent-kafka's wheel
/// carries (2.12 or later, which speaks KIP-848). Debian's kcat links librdkafka 2.0.2,
/// which predates the consumer protocol; pointed at this one with LD_LIBRARY_PATH (the
/// same ABI, `.so.1`) it is a KIP-848 client, as a user would run it.
fn kip848_librdkafka_dir() -> tempfile::TempDir {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import confluent_kafka, glob, os; \
             print(glob.glob(os.path.dirname(confluent_kafka.__file__) + '.libs/librdkafka*.so*')[0])",
        ])
        .output()
        .expect("python3 (tests/install-deps.sh)");
    assert!(
        out.status.success(),
        "confluent-kafka's librdkafka not found: {out:?}"
    );
    let lib = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(&lib, dir.path().join("librdkafka.so.1")).unwrap();
    dir
}

/// kcat as a consumer-protocol member (`-G` with `-X group.protocol=consumer`): it gets
/// every partition from the broker's assignor, reads every record, and the group is a
/// consumer group that `weir group list --type` and ListGroups report as such.
#[test]
fn kcat_reads_as_a_consumer_protocol_member() {
    let b = broker();
    create_topic(&b.bootstrap, "kc", 4);
    produce(&b.bootstrap, "kc", 4, 80, "kcat");
    let lib = kip848_librdkafka_dir();
    let version = std::process::Command::new("kcat")
        .arg("-V")
        .env("LD_LIBRARY_PATH", lib.path())
        .output()
        .expect("kcat (tests/install-deps.sh)");
    let version = String::from_utf8_lossy(&version.stdout).to_string();
    assert!(
        !version.contains("librdkafka 2.0."),
        "kcat did not pick up the newer librdkafka: {version}"
    );
    let mut kcat = std::process::Command::new("timeout")
        .args(["60", "kcat", "-b", &b.bootstrap, "-G", "kcg", "-X"])
        .arg("group.protocol=consumer")
        .args(["-u", "-o", "beginning", "-f", "%p %o %s\n", "kc"])
        .env("LD_LIBRARY_PATH", lib.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("kcat");
    let stdout = kcat.stdout.take().unwrap();
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            sink.lock().unwrap().push(line);
        }
    });
    describe_stable(&b.bootstrap, "kcg", 1);
    let g = describe(&b.bootstrap, "kcg", 1);
    let member = &g.members[0];
    assert_eq!(member.member_type, 1, "a consumer-protocol member: {g:?}");
    assert_eq!(partitions_of(&member.assignment, "kc"), all(4));
    wait_until("kcat reads the 80 records", 60, || {
        lines.lock().unwrap().len() >= 80
    });
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["group", "list", "--type", "-b", &b.bootstrap])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        listed.lines().next(),
        Some("GROUP           STATE               TYPE"),
        "{listed}"
    );
    assert!(
        listed
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["kcg", "Stable", "consumer"]),
        "{listed}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["group", "list", "--type", "classic", "-b", &b.bootstrap])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("kcg"),
        "{out:?}"
    );
    // A live consumer-protocol group's offsets are not reset (kafka-consumer-groups.sh's
    // message; DescribeGroups alone calls such a group Dead).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args([
            "group",
            "reset-offsets",
            "kcg",
            "--topic",
            "kc",
            "--to-earliest",
            "--execute",
        ])
        .args(["-b", &b.bootstrap])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(
            "Assignments can only be reset if the group 'kcg' is inactive, but the current state is Stable."
        ),
        "{out:?}"
    );
    // SIGTERM (`timeout` passes it on): kcat leaves the group (epoch -1) and exits.
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &kcat.id().to_string()])
        .status();
    let _ = kcat.wait();
    let _ = reader.join();
    let read: BTreeSet<(i32, i64)> = lines
        .lock()
        .unwrap()
        .iter()
        .map(|l| {
            let mut it = l.split(' ');
            (
                it.next().unwrap().parse().unwrap(),
                it.next().unwrap().parse().unwrap(),
            )
        })
        .collect();
    let want: BTreeSet<(i32, i64)> = (0..4).flat_map(|p| (0..20).map(move |o| (p, o))).collect();
    assert_eq!(read, want);
    wait_until("kcat left the group", 30, || {
        describe(&b.bootstrap, "kcg", 0).members.is_empty()
    });
}

/// Two KIP-848 clients that share no code in one group: @platformatic/kafka (pure
/// JavaScript, tests/compat/kip848_member.mjs) and librdkafka (confluent-kafka). The
/// JavaScript member joins second: librdkafka's gives up 3 of its 6 partitions first,
/// then the JavaScript one takes them; when librdkafka's leaves, the JavaScript one gets
/// all 6 and reads on from the commits. Every record is read exactly once (each member
/// commits after every record; none is restarted). The JavaScript member never loses a
/// partition here: @platformatic/kafka 1.35 hands out records of a partition it was
/// revoked from when a Fetch sent before the revocation answers after it (FINDINGS.md).
#[test]
fn a_javascript_and_a_librdkafka_member_share_a_group() {
    let b = broker();
    create_topic(&b.bootstrap, "js", 6);
    produce(&b.bootstrap, "js", 6, 120, "first");
    let mut rd = member(&b, "js", "js", &[]);
    wait_until("librdkafka's member owns all 6 partitions", 60, || {
        rd.assignment() == Some(all(6))
    });
    let js = Member::spawn("platformatic", &b.bootstrap, "js", "js", &[]);
    poll_for("the two members own 3 disjoint partitions each", 60, || {
        let (x, y) = (js.assignment(), rd.assignment());
        let three = |s: &Option<BTreeSet<i32>>| s.as_ref().is_some_and(|s| s.len() == 3);
        if covers(&[&js, &rd], 6) && three(&x) && three(&y) {
            Ok(())
        } else {
            Err(format!("JavaScript {x:?}, librdkafka {y:?}"))
        }
    });
    let g = describe_stable(&b.bootstrap, "js", 2);
    assert_eq!(g.members.len(), 2);
    produce(&b.bootstrap, "js", 6, 120, "second");
    let read =
        |m: &[&Member]| -> BTreeSet<(i32, i64)> { m.iter().flat_map(|m| m.records()).collect() };
    wait_until("all 240 records are read", 60, || {
        read(&[&js, &rd]).len() == 240
    });
    rd.close();
    wait_until(
        "the JavaScript member gets all 6 after librdkafka's leaves",
        60,
        || js.assignment() == Some(all(6)),
    );
    produce(&b.bootstrap, "js", 6, 60, "third");
    wait_until("the 60 new records are read", 60, || {
        read(&[&js, &rd]).len() == 300
    });
    assert!(
        js.records().iter().any(|(_, o)| *o >= 40),
        "the JavaScript member read none of the third batch"
    );
    let mut times: BTreeMap<(i32, i64), usize> = BTreeMap::new();
    for r in js.records().into_iter().chain(rd.records()) {
        *times.entry(r).or_default() += 1;
    }
    let twice: Vec<_> = times.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "records read more than once: {twice:?}\nJavaScript: {:?}\nlibrdkafka: {:?}",
        js.lines(),
        rd.lines()
    );
}

/// A broker whose stderr is gone (a closed pipe here; a full disk under its log file
/// likewise) keeps serving groups: a log line it cannot write is dropped. Found by a
/// tryout on a full disk: tracing reported the failed write with `eprintln!`, which
/// panicked on the same stderr inside the group coordinator's lock, and every later group
/// request then failed ("lock poisoned"). A classic and a consumer-protocol member each
/// read their records after stderr closed, and ListGroups lists both groups.
#[test]
fn a_broker_whose_stderr_is_closed_keeps_serving_groups() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(crate::harness::weir_bin())
        .arg("serve")
        .args(["--override", "listeners=PLAINTEXT://127.0.0.1:0"])
        .arg("--override")
        .arg(format!("log.dirs={}", dir.path().display()))
        .args(["--override", "admin.listeners="])
        .args(FAST_GROUPS.iter().flat_map(|o| ["--override", o]))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn weir");
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a line").expect("readable");
    let bootstrap = first
        .strip_prefix("weir listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_string();
    std::thread::spawn(move || for _ in lines {});
    // From now on every log line meets a closed pipe (EPIPE).
    drop(child.stderr.take());
    create_topic(&bootstrap, "quiet", 2);
    produce(&bootstrap, "quiet", 2, 40, "q");
    let classic = Member::spawn("confluent-kafka", &bootstrap, "quiet", "quiet-classic", &[]);
    let modern = Member::spawn(
        "confluent-kafka",
        &bootstrap,
        "quiet",
        "quiet-consumer",
        &["--group-protocol", "consumer"],
    );
    wait_until("both members read the 40 records", 60, || {
        classic.records().len() >= 40 && modern.records().len() >= 40
    });
    let listed: BTreeSet<String> = list_groups(&bootstrap, &[])
        .into_iter()
        .map(|g| g.group_id.0.to_string())
        .collect();
    assert!(
        listed.contains("quiet-classic") && listed.contains("quiet-consumer"),
        "{listed:?}"
    );
    let g = describe(&bootstrap, "quiet-consumer", 0);
    assert_eq!(g.error_code, 0, "{g:?}");
    assert!(matches!(child.try_wait(), Ok(None)), "the broker exited");
    let _ = child.kill();
    let _ = child.wait();
}
