//! Issue 13: ISR replication between `weir` processes on 127.0.0.1 — followers copy the
//! leader's log, acks=all waits for the ISR, a killed leader is replaced from the ISR with
//! nothing acknowledged lost, and it catches up and rejoins when it returns.
//!
//! Every node is a `BinaryBroker` (killed on drop); every wait is bounded.

use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};

use crate::cluster_fixture::{kcat_produce, keyed_key, keyed_value, read_keyed, ThreeNodes};
use crate::harness::poll_for;
use crate::rdkafka_client::admin;

/// One partition as `weir topic describe` prints it: leader, replicas, ISR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Described {
    pub(crate) leader: i32,
    pub(crate) replicas: Vec<i32>,
    pub(crate) isr: Vec<i32>,
}

/// `weir topic describe TOPIC` through `bootstrap`, parsed (kafka-topics.sh's layout);
/// `Err` with the output when it fails or does not parse.
pub(crate) fn describe(bootstrap: &str, topic: &str) -> Result<Vec<Described>, String> {
    // Short: right after a kill the client may first try the dead broker; callers poll.
    let out = Command::new("timeout")
        .arg("10")
        .arg(crate::harness::weir_bin())
        .args(["topic", "describe", topic, "-b", bootstrap])
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if !out.status.success() {
        return Err(format!(
            "{:?}: {text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let mut rows = Vec::new();
    for row in text.lines().skip(1) {
        let fields: Vec<&str> = row.split('\t').collect();
        let value = |name: &str| -> Result<Vec<i32>, String> {
            let field = fields
                .iter()
                .find_map(|f| f.strip_prefix(name))
                .ok_or_else(|| format!("no {name} in {row:?}"))?;
            if field.is_empty() || field == "none" {
                return Ok(Vec::new());
            }
            field
                .split(',')
                .map(|id| id.trim().parse().map_err(|_| format!("{row:?}")))
                .collect()
        };
        let leader = value("Leader: ")?;
        rows.push(Described {
            leader: leader.first().copied().unwrap_or(-1),
            replicas: value("Replicas: ")?,
            isr: value("Isr: ")?,
        });
    }
    Ok(rows)
}

/// `weir topic describe --<flag> -b bootstrap`'s lines (kafka-topics.sh's
/// `--under-replicated-partitions` / `--unavailable-partitions`: partition lines only).
fn describe_only(bootstrap: &str, flag: &str) -> Vec<String> {
    let out = Command::new("timeout")
        .arg("30")
        .arg(crate::harness::weir_bin())
        .args(["topic", "describe", flag, "-b", bootstrap])
        .output()
        .expect("weir topic describe");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Creates `topic` with `partitions` partitions, replication factor 3 and `configs`
/// through a real admin client.
pub(crate) async fn create_rf3(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    configs: &[(&str, &str)],
) {
    let mut t = NewTopic::new(topic, partitions, TopicReplication::Fixed(3));
    for (k, v) in configs {
        t = t.set(k, v);
    }
    create_topic(bootstrap, t).await;
}

/// Creates `topic` through a real admin client (20 s operation timeout); fails the test
/// unless it was created.
pub(crate) async fn create_topic(bootstrap: &str, topic: NewTopic<'_>) {
    let created = admin(bootstrap)
        .create_topics(
            &[topic],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(20))),
        )
        .await
        .expect("create_topics");
    for r in created {
        r.expect("topic created");
    }
}

/// Issue 13, test 1 (the seeds' own): three brokers, a topic with replication factor 3,
/// kcat produces 10,000 records with acks=all; kill -9 the partition's leader: `weir topic
/// describe` through a survivor shows a new leader from the ISR and the ISR without the
/// killed broker; a consumer from the beginning reads all 10,000 exactly once; the old
/// leader restarted over its data catches up and is back in the ISR.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_from_the_isr_and_no_acknowledged_record_is_lost() {
    const RECORDS: usize = 10_000;
    let mut nodes = ThreeNodes::start(&[
        "broker.session.timeout.ms=1500",
        "broker.heartbeat.interval.ms=300",
    ]);
    create_rf3(&nodes.bootstrap(1), "replicated", 1, &[]).await;
    let before = poll_for(
        "replicated is described with 3 in-sync replicas",
        20,
        || match describe(&nodes.bootstrap(1), "replicated")?.as_slice() {
            [p] if p.isr.len() == 3 && p.leader > 0 => Ok(p.clone()),
            other => Err(format!("{other:?}")),
        },
    );
    kcat_produce(&nodes.bootstrap_all(), "replicated", RECORDS);

    let old = before.leader;
    nodes.kill9(old);
    let killed_at = Instant::now();
    let survivor = (1..=3).find(|id| *id != old).unwrap();
    let survivors: Vec<i32> = (1..=3).filter(|id| *id != old).collect();
    nodes.wait_for_brokers(survivor, &survivors, 30);
    let after = poll_for(
        "a new leader from the ISR, without the killed one",
        30,
        || match describe(&nodes.bootstrap(survivor), "replicated")?.as_slice() {
            [p] if p.leader > 0 && p.leader != old && !p.isr.contains(&old) => Ok(p.clone()),
            other => Err(format!("{other:?}")),
        },
    );
    eprintln!(
        "leader {old} killed; {after:?} after {:?}",
        killed_at.elapsed()
    );
    assert!(before.isr.contains(&after.leader), "{before:?} → {after:?}");
    assert_eq!(after.isr.len(), 2, "{after:?}");
    let under = describe_only(&nodes.bootstrap(survivor), "--under-replicated-partitions");
    assert!(
        under.len() == 1 && under[0].contains("Topic: replicated\tPartition: 0"),
        "{under:?}"
    );
    let unavailable = describe_only(&nodes.bootstrap(survivor), "--unavailable-partitions");
    assert!(unavailable.is_empty(), "{unavailable:?}");

    let read = read_keyed(&nodes.bootstrap(survivor), "replicated", 1, RECORDS);
    read.assert_exactly(&(0..RECORDS).collect());

    // The old leader comes back: it truncates to the new leader's log by epoch, catches
    // up and rejoins the ISR.
    nodes.restart(old);
    poll_for(
        "the restarted broker is back in the ISR",
        60,
        || match describe(&nodes.bootstrap(survivor), "replicated")?.as_slice() {
            [p] if p.isr.contains(&old) && p.isr.len() == 3 => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    let under = describe_only(&nodes.bootstrap(survivor), "--under-replicated");
    assert!(under.is_empty(), "{under:?}");
    // Each replica holds every record: kill the leader of now; the new one (from the
    // ISR, possibly the returned broker) serves all 10,000.
    let leader_now = describe(&nodes.bootstrap(old), "replicated").unwrap()[0].leader;
    nodes.kill9(leader_now);
    let reader = (1..=3).find(|id| *id != leader_now).unwrap();
    poll_for(
        "a leader other than the one just killed",
        30,
        || match describe(&nodes.bootstrap(reader), "replicated")?.as_slice() {
            [p] if p.leader > 0 && p.leader != leader_now => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    let read = read_keyed(&nodes.bootstrap(reader), "replicated", 1, RECORDS);
    read.assert_exactly(&(0..RECORDS).collect());
    nodes.assert_no_panic();
}

/// Produces records `range` (`keyed_key(i)`, `keyed_value(i)`) to partition 0 of `topic`
/// through a librdkafka producer with `config` (acks, timeouts, retries); returns the
/// indexes acknowledged and the errors of the others.
pub(crate) async fn produce_range(
    bootstrap: &str,
    topic: &str,
    range: std::ops::Range<usize>,
    config: &[(&str, &str)],
) -> (std::collections::BTreeSet<usize>, Vec<String>) {
    use rdkafka::producer::FutureRecord;
    let p = crate::rdkafka_client::producer(bootstrap, config);
    let mut deliveries = Vec::new();
    for i in range {
        let (key, value) = (keyed_key(i), keyed_value(i));
        let record = FutureRecord::to(topic)
            .key(&key)
            .payload(&value)
            .partition(0);
        deliveries.push((
            i,
            p.send_result(record).map_err(|(e, _)| e).expect("queued"),
        ));
    }
    let (mut acked, mut failed) = (std::collections::BTreeSet::new(), Vec::new());
    for (i, d) in deliveries {
        match d.await {
            Ok(Ok(_)) => {
                acked.insert(i);
            }
            Ok(Err((e, _))) => failed.push(e.to_string()),
            Err(_) => failed.push("cancelled".into()),
        }
    }
    (acked, failed)
}

/// acks=all, retried by librdkafka within its 30 s message timeout.
const ACKS_ALL: &[(&str, &str)] = &[("acks", "all")];

/// Issue 13, test 3: `min.insync.replicas=2` on a replication-factor-3 topic of a 5-node
/// cluster (so the quorum survives two nodes down). With both followers killed the ISR
/// shrinks to the leader: acks=all gets NOT_ENOUGH_REPLICAS and nothing it sent is ever
/// read; acks=1 still succeeds; one follower back, caught up and in the ISR: acks=all
/// works again. Every acknowledged record is read back exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_all_needs_min_insync_replicas_and_resumes_when_a_replica_returns() {
    let mut nodes = ThreeNodes::start_n(
        5,
        &[
            "broker.session.timeout.ms=1500",
            "broker.heartbeat.interval.ms=300",
        ],
    );
    create_rf3(
        &nodes.bootstrap(1),
        "guarded",
        1,
        &[("min.insync.replicas", "2")],
    )
    .await;
    let placed = poll_for(
        "guarded is described with 3 in-sync replicas",
        20,
        || match describe(&nodes.bootstrap(1), "guarded")?.as_slice() {
            [p] if p.isr.len() == 3 && p.leader > 0 => Ok(p.clone()),
            other => Err(format!("{other:?}")),
        },
    );
    let leader = placed.leader;
    let followers: Vec<i32> = placed
        .replicas
        .iter()
        .copied()
        .filter(|r| *r != leader)
        .collect();
    let (mut acked, failed) =
        produce_range(&nodes.bootstrap(leader), "guarded", 0..100, ACKS_ALL).await;
    assert!(failed.is_empty(), "{failed:?}");

    for f in &followers {
        nodes.kill9(*f);
    }
    // As the leader itself sees it: `topic describe` may be answered by another broker,
    // whose metadata image can be ahead of the leader's (a voter learns of a commit at
    // the next heartbeat), and then the leader still takes the batch and answers
    // NOT_ENOUGH_REPLICAS_AFTER_APPEND.
    crate::replication_divergence::wait_partition(
        &nodes,
        leader,
        "guarded",
        "the ISR is the leader alone, as the leader sees it",
        |p| p.isr == vec![leader] && p.leader == leader,
    );
    // acks=all: refused before anything is written (no retries, so librdkafka reports
    // the broker's NOT_ENOUGH_REPLICAS rather than retrying it until a timeout), never
    // NOT_ENOUGH_REPLICAS_AFTER_APPEND (written, then refused).
    let (refused_acked, refused) = produce_range(
        &nodes.bootstrap(leader),
        "guarded",
        100..110,
        &[("acks", "all"), ("retries", "0")],
    )
    .await;
    assert!(refused_acked.is_empty(), "{refused_acked:?}");
    assert!(
        refused
            .iter()
            .all(|e| e.contains("NotEnoughReplicas") && !e.contains("AfterAppend")),
        "{refused:?}"
    );
    // acks=1 still works.
    let (ones, failed) = produce_range(
        &nodes.bootstrap(leader),
        "guarded",
        110..210,
        &[("acks", "1")],
    )
    .await;
    assert!(failed.is_empty(), "{failed:?}");
    acked.extend(ones);

    // One follower back: it catches up, joins the ISR, and acks=all works again.
    nodes.restart(followers[0]);
    poll_for(
        "the returning follower is back in the ISR",
        60,
        || match describe(&nodes.bootstrap(leader), "guarded")?.as_slice() {
            [p] if p.isr.len() == 2 && p.isr.contains(&followers[0]) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    let (again, failed) =
        produce_range(&nodes.bootstrap(leader), "guarded", 210..310, ACKS_ALL).await;
    assert!(failed.is_empty(), "{failed:?}");
    acked.extend(again);

    let read = read_keyed(&nodes.bootstrap(leader), "guarded", 1, acked.len());
    read.assert_exactly(&acked);
    nodes.assert_no_panic();
}

/// The broker FindCoordinator (v3, through `bootstrap`) names for `group`, once it names
/// one.
fn coordinator_of(bootstrap: &str, group: &str) -> Result<i32, String> {
    use kafka_protocol::messages::{FindCoordinatorRequest, FindCoordinatorResponse};
    use kafka_protocol::protocol::StrBytes;
    let req = FindCoordinatorRequest::default()
        .with_key(StrBytes::from_string(group.to_string()))
        .with_key_type(0);
    let mut conn = crate::harness::RawConn::connect(bootstrap);
    let r: FindCoordinatorResponse =
        crate::harness::decode(conn.request(&req, 3, 41).ok_or("no answer")?, 3);
    if r.error_code == 0 {
        Ok(r.node_id.0)
    } else {
        Err(format!("error {}", r.error_code))
    }
}

/// Issue 13, test 5: a librdkafka consumer group reads a replication-factor-3 topic and
/// commits; the broker coordinating the group (the leader of its `__consumer_offsets`
/// partition) is killed with -9. The partition's new leader loads the group's offsets:
/// the committed offsets read through a survivor are the ones committed before the kill,
/// and the same consumer goes on to read every record and commits through the new
/// coordinator (after rejoining: members are not carried over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_keeps_consuming_when_its_coordinator_is_killed() {
    use crate::cluster_fixture::produce_keyed;
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    use rdkafka::{Message, TopicPartitionList};

    const GROUP: &str = "failover-group";
    const RECORDS: usize = 3000;
    let mut nodes = ThreeNodes::start(&[
        "broker.session.timeout.ms=1500",
        "broker.heartbeat.interval.ms=300",
        "group.initial.rebalance.delay.ms=0",
    ]);
    create_rf3(&nodes.bootstrap(1), "work", 3, &[]).await;
    produce_keyed(&nodes.bootstrap_all(), "work", RECORDS, Some(3))
        .await
        .assert_all_acked(RECORDS);

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", nodes.bootstrap_all())
        .set("group.id", GROUP)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("consumer");
    consumer.subscribe(&["work"]).expect("subscribe");
    let mut read: std::collections::BTreeMap<usize, usize> = Default::default();
    let mut poll_until = |want: usize, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while read.len() < want {
            assert!(
                Instant::now() < deadline,
                "{what}: {} of {want} read",
                read.len()
            );
            if let Some(m) = consumer.poll(Duration::from_millis(100)) {
                let Ok(m) = m else { continue }; // a retriable error during the failover
                let value = String::from_utf8_lossy(m.payload().unwrap_or_default()).to_string();
                let i: usize = value[1..].parse().expect("a keyed value");
                *read.entry(i).or_default() += 1;
            }
        }
    };
    poll_until(RECORDS / 3, "before the kill");
    consumer
        .commit_consumer_state(CommitMode::Sync)
        .expect("commit");
    let committed_before = consumer
        .committed(Duration::from_secs(10))
        .expect("committed offsets");
    let coordinator = coordinator_of(&nodes.bootstrap(1), GROUP).expect("a coordinator");
    nodes.kill9(coordinator);
    let survivor = (1..=3).find(|id| *id != coordinator).unwrap();

    // The new coordinator (another broker) answers with the offsets committed before.
    let moved = poll_for(
        "another broker coordinates the group",
        30,
        || match coordinator_of(&nodes.bootstrap(survivor), GROUP) {
            Ok(c) if c != coordinator => Ok(c),
            other => Err(format!("{other:?}")),
        },
    );
    let reader: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", nodes.bootstrap(survivor))
        .set("group.id", GROUP)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut wanted = TopicPartitionList::new();
    for part in 0..3 {
        wanted.add_partition("work", part);
    }
    let after = reader
        .committed_offsets(wanted, Duration::from_secs(20))
        .expect("committed offsets from the new coordinator");
    eprintln!("coordinator {coordinator} killed, {moved} took over; committed {after:?}");
    for part in 0..3 {
        let offset = |tpl: &TopicPartitionList| {
            tpl.find_partition("work", part)
                .expect("partition")
                .offset()
        };
        assert_eq!(
            offset(&after),
            offset(&committed_before),
            "partition {part}"
        );
    }

    // The consumer goes on through the new coordinator and reads everything.
    poll_until(RECORDS, "after the kill");
    let duplicated = read.values().filter(|n| **n > 1).count();
    eprintln!(
        "read {} distinct records, {duplicated} more than once",
        read.len()
    );
    assert_eq!(read.len(), RECORDS);
    // The new coordinator loaded the group Empty (weir keeps no members across a
    // coordinator move, as across a restart): the consumer's first commit there gets
    // UNKNOWN_MEMBER_ID, it rejoins in its poll, and commits.
    poll_for("a commit through the new coordinator", 30, || {
        let _ = consumer.poll(Duration::from_millis(200));
        consumer
            .commit_consumer_state(CommitMode::Sync)
            .map_err(|e| e.to_string())
    });
    nodes.assert_no_panic();
}

/// A broker down while a topic is deleted keeps that topic's directories; when a topic of
/// the same name is created again with a replica there, the old directory must not come
/// back as the new topic's log (its records at the new topic's offsets). Each partition
/// directory names its topic id (`partition.metadata`, KIP-516), and a directory of
/// another id is removed before the log is opened. Found by a tester: before, a consumer
/// read the deleted topic's 100 records at offsets 0–99 of the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_created_again_never_reads_the_deleted_ones_records_from_a_broker_that_missed_the_delete(
) {
    const TOPIC: &str = "reborn";
    let mut nodes = ThreeNodes::start(&[
        "broker.session.timeout.ms=1500",
        "broker.heartbeat.interval.ms=300",
    ]);
    // Node 3 leads: the one that misses the delete.
    let create = |bootstrap: String| async move {
        let t = NewTopic::new(TOPIC, 1, TopicReplication::Variable(&[&[3, 1, 2]]));
        create_topic(&bootstrap, t).await;
    };
    create(nodes.bootstrap(1)).await;
    poll_for("reborn led by 3 with 3 in sync", 30, || {
        match describe(&nodes.bootstrap(1), TOPIC)?.as_slice() {
            [p] if p.leader == 3 && p.isr.len() == 3 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    let (old, failed) = produce_range(&nodes.bootstrap_all(), TOPIC, 0..100, ACKS_ALL).await;
    assert!(failed.is_empty() && old.len() == 100, "{failed:?}");

    // Node 3 is down while the topic is deleted; its directory stays.
    nodes.kill9(3);
    nodes.wait_for_brokers(1, &[1, 2], 30);
    let deleted = admin(&nodes.bootstrap(1))
        .delete_topics(&[TOPIC], &AdminOptions::new())
        .await
        .expect("delete_topics");
    assert!(deleted.iter().all(|r| r.is_ok()), "{deleted:?}");
    // Nodes 1 and 2 apply the delete from the metadata as a single node does (issue 15):
    // the directory is renamed `<topic>-0.<uuid>-delete`, then removed in the background.
    for n in [1, 2] {
        let dir = nodes.log_dir(n).to_path_buf();
        poll_for(&format!("node {n} removed {TOPIC}-0"), 30, || {
            let names: Vec<String> = std::fs::read_dir(&dir)
                .map_err(|e| e.to_string())?
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with(TOPIC))
                .collect();
            if names.is_empty() {
                Ok(())
            } else {
                Err(format!("{names:?}"))
            }
        });
    }
    nodes.restart(3);
    nodes.wait_for_brokers(3, &[1, 2, 3], 30);
    assert!(nodes.log_dir(3).join(format!("{TOPIC}-0")).is_dir());

    create(nodes.bootstrap(1)).await;
    poll_for(
        "the new reborn led by 3 with 3 in sync",
        30,
        || match describe(&nodes.bootstrap(1), TOPIC)?.as_slice() {
            [p] if p.leader == 3 && p.isr.len() == 3 => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    let (new, failed) = produce_range(&nodes.bootstrap_all(), TOPIC, 1000..1030, ACKS_ALL).await;
    assert!(failed.is_empty() && new.len() == 30, "{failed:?}");
    read_keyed(&nodes.bootstrap_all(), TOPIC, 1, new.len()).assert_exactly(&new);
    assert!(
        nodes
            .node(3)
            .stderr_text()
            .contains("removed a stray partition directory"),
        "node 3 does not say it removed the stray directory"
    );
    // The stray directory was renamed `-delete` and is removed in the background.
    let dir = nodes.log_dir(3).to_path_buf();
    poll_for("node 3 removed the renamed stray directory", 30, || {
        let left: Vec<String> = std::fs::read_dir(&dir)
            .map_err(|e| e.to_string())?
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with("-delete"))
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    });
    nodes.assert_no_panic();
}
