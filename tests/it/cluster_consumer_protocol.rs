//! KIP-848's consumer group protocol across a coordinator failover: three `weir`
//! processes, two confluent-kafka consumer-protocol members (tests/compat/group_member.py
//! `--group-protocol consumer`, committing each record), the group's coordinator killed
//! with -9 while records are produced. The members find the new coordinator (the new
//! leader of the group's `__consumer_offsets` partition), rejoin (weir keeps no members
//! in `__consumer_offsets`: UNKNOWN_MEMBER_ID, then epoch 0) and between them read every
//! acknowledged record; a record is read twice only at or above the commits acknowledged
//! before the kill.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kafka_protocol::messages::{FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::producer::FutureRecord;

use crate::cluster_fixture::{keyed_key, keyed_value, produce_keyed, ThreeNodes};
use crate::groups::{covers, Member};
use crate::harness::{decode, poll_for, wait_until, RawConn};

const TOPIC: &str = "failover";
const GROUP: &str = "failover-group";
const PARTITIONS: i32 = 6;

/// The group's coordinator as node `id` names it (FindCoordinator v3, raw frame).
fn coordinator_seen_by(nodes: &ThreeNodes, id: i32) -> Result<i32, String> {
    let mut conn = RawConn::connect(&nodes.bootstrap(id));
    let req = FindCoordinatorRequest::default()
        .with_key(StrBytes::from_static_str(GROUP))
        .with_key_type(0);
    let body = conn.request(&req, 3, 11).ok_or("no answer")?;
    let r: FindCoordinatorResponse = decode(body, 3);
    if r.error_code == 0 {
        Ok(r.node_id.0)
    } else {
        Err(format!("node {id}: error {}", r.error_code))
    }
}

/// `(partition, offset, record index)` of every record a member read, in order.
fn reads(m: &Member) -> Vec<(i32, i64, usize)> {
    m.lines()
        .iter()
        .filter_map(|l| l.strip_prefix("record "))
        .map(|r| {
            let mut it = r.splitn(3, ' ');
            let p = it.next().unwrap().parse().unwrap();
            let o = it.next().unwrap().parse().unwrap();
            let v = it.next().unwrap_or("");
            let i = v
                .strip_prefix('r')
                .and_then(|i| i.parse().ok())
                .unwrap_or_else(|| panic!("a keyed value: {r:?}"));
            (p, o, i)
        })
        .collect()
}

/// The highest offset committed per partition in the first `n` lines of a member.
fn commits_in(lines: &[String]) -> BTreeMap<i32, i64> {
    let mut out: BTreeMap<i32, i64> = BTreeMap::new();
    for l in lines {
        if let Some(c) = l.strip_prefix("committed ") {
            let (p, o) = c.split_once(' ').unwrap();
            let (p, o): (i32, i64) = (p.parse().unwrap(), o.parse().unwrap());
            let e = out.entry(p).or_default();
            *e = (*e).max(o);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_protocol_members_survive_the_coordinators_kill_9() {
    let mut nodes = ThreeNodes::start(&[
        "group.consumer.heartbeat.interval.ms=500",
        "group.consumer.session.timeout.ms=6000",
        "group.initial.rebalance.delay.ms=0",
        "broker.session.timeout.ms=1500",
        "broker.heartbeat.interval.ms=300",
    ]);
    let created = crate::rdkafka_client::admin(&nodes.bootstrap(1))
        .create_topics(
            &[NewTopic::new(TOPIC, PARTITIONS, TopicReplication::Fixed(3))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(20))),
        )
        .await
        .expect("create_topics");
    for r in created {
        r.expect("topic created");
    }
    const FIRST: usize = 600;
    const MORE: usize = 1200;
    produce_keyed(&nodes.bootstrap_all(), TOPIC, FIRST, Some(PARTITIONS))
        .await
        .assert_all_acked(FIRST);

    let bootstrap = nodes.bootstrap_all();
    let members: Vec<Member> = (0..2)
        .map(|_| {
            Member::spawn(
                "confluent-kafka",
                &bootstrap,
                TOPIC,
                GROUP,
                &["--group-protocol", "consumer"],
            )
        })
        .collect();
    let refs: Vec<&Member> = members.iter().collect();
    wait_until(
        "two members share the 6 partitions and read the first 600",
        90,
        || {
            let read: BTreeSet<usize> = members
                .iter()
                .flat_map(|m| reads(m).into_iter().map(|r| r.2))
                .collect();
            covers(&refs, PARTITIONS)
                && members
                    .iter()
                    .all(|m| m.assignment().is_some_and(|a| a.len() == 3))
                && read.len() >= FIRST
        },
    );
    let coordinator = poll_for("every node names the same coordinator", 30, || {
        let seen: Vec<Result<i32, String>> =
            (1..=3).map(|id| coordinator_seen_by(&nodes, id)).collect();
        match seen.first() {
            Some(Ok(c)) if seen.iter().all(|s| s.as_ref() == Ok(c)) => Ok(*c),
            _ => Err(format!("{seen:?}")),
        }
    });
    eprintln!("the group's coordinator is node {coordinator}");

    // Produce the rest, paced over about 3 s, through a producer bootstrapped to the
    // nodes that survive; kill the coordinator one second in.
    let survivors: Vec<i32> = (1..=3).filter(|id| *id != coordinator).collect();
    let producer_bootstrap = survivors
        .iter()
        .map(|id| nodes.bootstrap(*id))
        .collect::<Vec<_>>()
        .join(",");
    let producing = tokio::spawn(async move {
        let p = crate::rdkafka_client::producer(
            &producer_bootstrap,
            &[("acks", "all"), ("message.timeout.ms", "60000")],
        );
        let mut deliveries = Vec::with_capacity(MORE);
        for i in FIRST..FIRST + MORE {
            let (key, value) = (keyed_key(i), keyed_value(i));
            let record = FutureRecord::to(TOPIC)
                .key(&key)
                .payload(&value)
                .partition(i as i32 % PARTITIONS);
            deliveries.push((
                i,
                p.send_result(record).map_err(|(e, _)| e).expect("queued"),
            ));
            if i % 8 == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let mut acked = BTreeSet::new();
        let mut failed = Vec::new();
        for (i, d) in deliveries {
            match d.await {
                Ok(Ok(_)) => {
                    acked.insert(i);
                }
                Ok(Err((e, _))) => failed.push((i, e.to_string())),
                Err(_) => failed.push((i, "cancelled".to_string())),
            }
        }
        (acked, failed)
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    // What each member had printed before the kill: its commits then were acknowledged
    // by the coordinator about to die.
    let before_kill: Vec<Vec<String>> = members.iter().map(|m| m.lines()).collect();
    let killed_at = Instant::now();
    let log = nodes.kill9(coordinator);
    assert!(!log.contains("panicked"), "node {coordinator}:\n{log}");
    let (mut acked, failed) = producing.await.expect("the producer task");
    acked.extend(0..FIRST);
    eprintln!(
        "coordinator {coordinator} killed; {} acknowledged, {} not: {:?}",
        acked.len(),
        failed.len(),
        failed.first()
    );
    let new_coordinator = poll_for("the survivors name a new coordinator", 30, || {
        let seen: Vec<Result<i32, String>> = survivors
            .iter()
            .map(|id| coordinator_seen_by(&nodes, *id))
            .collect();
        match seen.first() {
            Some(Ok(c)) if *c != coordinator && seen.iter().all(|s| s.as_ref() == Ok(c)) => Ok(*c),
            _ => Err(format!("{seen:?}")),
        }
    });
    eprintln!(
        "node {new_coordinator} coordinates after {:?}",
        killed_at.elapsed()
    );

    poll_for(
        "the members read every acknowledged record after the failover",
        120,
        || {
            let read: BTreeSet<usize> = members
                .iter()
                .flat_map(|m| reads(m).into_iter().map(|r| r.2))
                .collect();
            let missing: Vec<&usize> = acked.iter().filter(|i| !read.contains(i)).collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "{} missing, first {:?}; assignments {:?}",
                    missing.len(),
                    missing.first(),
                    members.iter().map(|m| m.assignment()).collect::<Vec<_>>()
                ))
            }
        },
    );
    eprintln!("all read {:?} after the kill", killed_at.elapsed());
    // Proves an absence: a record read twice would come right behind (a sleep, not a poll).
    std::thread::sleep(Duration::from_secs(2));

    // Lost, duplicated; a duplicate only at or above the commits acknowledged before the
    // kill (the new coordinator must have every one of them).
    let mut count: BTreeMap<(i32, i64), usize> = BTreeMap::new();
    let mut index_read: BTreeSet<usize> = BTreeSet::new();
    for m in &members {
        for (p, o, i) in reads(m) {
            assert_eq!(
                i as i32 % PARTITIONS,
                p,
                "record {i} read from partition {p}"
            );
            *count.entry((p, o)).or_default() += 1;
            index_read.insert(i);
        }
    }
    // Records a producer retry wrote twice (at two offsets): at-least-once production.
    let mut offsets_of: BTreeMap<usize, BTreeSet<(i32, i64)>> = BTreeMap::new();
    for m in &members {
        for (p, o, i) in reads(m) {
            offsets_of.entry(i).or_default().insert((p, o));
        }
    }
    let written_twice = offsets_of.values().filter(|o| o.len() > 1).count();
    let lost: Vec<&usize> = acked.iter().filter(|i| !index_read.contains(i)).collect();
    let duplicated: Vec<(&(i32, i64), &usize)> = count.iter().filter(|(_, n)| **n > 1).collect();
    let not_acked: Vec<&usize> = index_read.iter().filter(|i| !acked.contains(i)).collect();
    let mut committed_before: BTreeMap<i32, i64> = BTreeMap::new();
    for lines in &before_kill {
        for (p, o) in commits_in(lines) {
            let e = committed_before.entry(p).or_default();
            *e = (*e).max(o);
        }
    }
    eprintln!(
        "acknowledged {}, read {} distinct, lost {}, duplicated {}, read but not acknowledged {}, \
         written twice by the producer {written_twice}; commits acknowledged before the kill \
         {committed_before:?}",
        acked.len(),
        index_read.len(),
        lost.len(),
        duplicated.len(),
        not_acked.len()
    );
    assert!(lost.is_empty(), "lost {}: {lost:?}", lost.len());
    for ((p, o), n) in &duplicated {
        let floor = committed_before.get(p).copied().unwrap_or(0);
        assert!(
            *o >= floor,
            "record {p}/{o} read {n} times, below the commit {floor} acknowledged before the kill"
        );
    }
    // Both members carry on after the failover: each commits again, and the partitions
    // are shared by the two of them.
    for (m, before) in members.iter().zip(&before_kill) {
        let after = &m.lines()[before.len()..];
        assert!(
            after.iter().any(|l| l.starts_with("committed ")),
            "a member committed nothing after the kill: {after:?}"
        );
    }
    assert!(
        covers(&refs, PARTITIONS),
        "{:?}",
        members.iter().map(|m| m.assignment()).collect::<Vec<_>>()
    );
    // The new coordinator holds the commits of the end of every partition (300 records
    // each, plus any a producer retry wrote twice over the failover: it is not idempotent).
    let reader: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", nodes.bootstrap_all())
        .set("group.id", GROUP)
        .create()
        .expect("consumer");
    let ends: Vec<i64> = (0..PARTITIONS)
        .map(|p| {
            rdkafka::consumer::Consumer::fetch_watermarks(
                &reader,
                TOPIC,
                p,
                Duration::from_secs(10),
            )
            .expect("watermarks")
            .1
        })
        .collect();
    eprintln!("partition ends {ends:?}");
    poll_for(
        "the group's commits reach the end of every partition",
        30,
        || {
            let mut tpl = rdkafka::TopicPartitionList::new();
            for p in 0..PARTITIONS {
                tpl.add_partition(TOPIC, p);
            }
            let got = rdkafka::consumer::Consumer::committed_offsets(
                &reader,
                tpl,
                Duration::from_secs(5),
            )
            .map_err(|e| e.to_string())?;
            let offsets: Vec<rdkafka::Offset> = got.elements().iter().map(|e| e.offset()).collect();
            let at_end = offsets
                .iter()
                .zip(&ends)
                .all(|(o, end)| *o == rdkafka::Offset::Offset(*end));
            if at_end {
                Ok(())
            } else {
                Err(format!("committed {offsets:?}, ends {ends:?}"))
            }
        },
    );
    nodes.assert_no_panic();
    drop(members);
}
