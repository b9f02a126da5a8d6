//! Issue 13: preferred leader election. Three `weir` processes, a topic of 6 partitions
//! at replication factor 3; kill -9 a broker that is the preferred replica (first of the
//! assignment) of some partitions: they move to survivors; start it again over its data:
//! it catches up and is back in every ISR, but leads nothing (the imbalance). Then:
//!
//! - `weir partition elect-leaders --election-type preferred --all-topic-partitions`
//!   moves leadership back (`weir topic describe` shows every partition led by its
//!   preferred replica) and a second run finds nothing to do, while a confluent-kafka
//!   idempotent acks=all producer writes to every partition: every acknowledged record
//!   is read back once, at its offset;
//! - confluent-kafka's `AdminClient.elect_leaders` does the same for one partition, with
//!   Kafka's per-partition results (raw ElectLeaders frames check v0, null partitions
//!   and an unknown election type), and with `auto.leader.rebalance.enable=false` the
//!   imbalance stays;
//! - with `auto.leader.rebalance.enable` (the default) and a 2 s
//!   `leader.imbalance.check.interval.seconds`, leadership comes back by itself.
//!
//! Every wait is bounded; every process is stopped (`ThreeNodes`' drop kills the nodes,
//! `Script`'s drop the producer).

use std::collections::BTreeSet;
use std::process::{Command, Output};
use std::time::Duration;

use crate::cluster_fixture::ThreeNodes;
use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
use kafka_protocol::messages::{ElectLeadersRequest, ElectLeadersResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::harness::{decode, poll_for, repo_root, weir_bin, RawConn};
use crate::replication::{create_rf3, describe, Described};
use crate::replication_faults::{check, read_all, spawn_producer, ProducerLog};

const PARTITIONS: i32 = 6;

/// Overrides of every cluster here: short sessions (a killed broker is fenced within
/// 1.5 s) and a short imbalance check interval.
const BASE: [&str; 3] = [
    "broker.session.timeout.ms=1500",
    "broker.heartbeat.interval.ms=300",
    "leader.imbalance.check.interval.seconds=2",
];

/// `topic` described through every running node (polled past a node not answering).
fn partitions_of(nodes: &ThreeNodes, topic: &str) -> Result<Vec<Described>, String> {
    let d = describe(&nodes.bootstrap_all(), topic)?;
    if d.len() == PARTITIONS as usize {
        Ok(d)
    } else {
        Err(format!("{d:?}"))
    }
}

/// The indexes of the partitions not led by their preferred replica.
fn not_preferred(d: &[Described]) -> Vec<usize> {
    d.iter()
        .enumerate()
        .filter(|(_, p)| p.replicas.first() != Some(&p.leader))
        .map(|(i, _)| i)
        .collect()
}

/// Polls until every partition of `topic` has 3 in-sync replicas and (`balanced`) is
/// led by its preferred replica; returns the description.
fn wait_in_sync(nodes: &ThreeNodes, topic: &str, balanced: bool, what: &str) -> Vec<Described> {
    poll_for(what, 60, || {
        let d = partitions_of(nodes, topic)?;
        let synced = d.iter().all(|p| p.isr.len() == 3 && p.leader > 0);
        if synced && (!balanced || not_preferred(&d).is_empty()) {
            Ok(d)
        } else {
            Err(format!("{d:?}"))
        }
    })
}

/// Kills -9 the preferred replica of partition 0 (`victim`), waits until its partitions
/// are led by survivors, starts it again and waits until it is back in every ISR.
/// Returns the victim and the partitions it is the preferred replica of.
fn kill_and_restart_a_preferred_leader(nodes: &mut ThreeNodes, topic: &str) -> (i32, Vec<usize>) {
    let before = wait_in_sync(
        nodes,
        topic,
        true,
        "3 in sync, each led by its preferred replica",
    );
    let victim = before[0].replicas[0];
    let preferred: Vec<usize> = before
        .iter()
        .enumerate()
        .filter(|(_, p)| p.replicas[0] == victim)
        .map(|(i, _)| i)
        .collect();
    eprintln!("kill -9 broker {victim}, the preferred leader of partitions {preferred:?}");
    nodes.kill9(victim);
    let survivor = (1..=3).find(|id| *id != victim).unwrap();
    poll_for("its partitions led by survivors", 30, || {
        let d = describe(&nodes.bootstrap(survivor), topic)?;
        if d.len() == PARTITIONS as usize && d.iter().all(|p| p.leader > 0 && p.leader != victim) {
            Ok(())
        } else {
            Err(format!("{d:?}"))
        }
    });
    nodes.restart(victim);
    nodes.wait_for_brokers(survivor, &[1, 2, 3], 30);
    (victim, preferred)
}

/// `weir partition elect-leaders ARGS -b BOOTSTRAP`.
fn elect_cli(bootstrap: &str, args: &[&str]) -> Output {
    let out = Command::new("timeout")
        .arg("90")
        .arg(weir_bin())
        .args([
            "partition",
            "elect-leaders",
            "--bootstrap-server",
            bootstrap,
        ])
        .args(args)
        .output()
        .expect("weir partition elect-leaders");
    eprintln!(
        "weir partition elect-leaders {args:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// (a) and (d): see the module doc.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_moves_leadership_back_to_preferred_replicas_and_nothing_acknowledged_is_lost() {
    const TOPIC: &str = "elect";
    const PRODUCE_S: u64 = 40;
    let mut overrides = BASE.to_vec();
    overrides.push("auto.leader.rebalance.enable=false");
    let mut nodes = ThreeNodes::start(&overrides);
    create_rf3(
        &nodes.bootstrap(1),
        TOPIC,
        PARTITIONS,
        &[("min.insync.replicas", "2")],
    )
    .await;
    wait_in_sync(
        &nodes,
        TOPIC,
        true,
        "3 in sync, each led by its preferred replica",
    );

    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("producer.log");
    let mut producer = spawn_producer(
        &nodes.bootstrap_all(),
        TOPIC,
        PARTITIONS,
        PRODUCE_S,
        &out,
        None,
    );
    producer.wait_for_acks(&out, 1);

    let (victim, preferred) = kill_and_restart_a_preferred_leader(&mut nodes, TOPIC);
    let imbalanced = wait_in_sync(
        &nodes,
        TOPIC,
        false,
        "the restarted broker back in every ISR",
    );
    assert_eq!(not_preferred(&imbalanced), preferred, "{imbalanced:?}");

    // Usage errors first: exit code 2, nothing elected.
    let usage = elect_cli(&nodes.bootstrap_all(), &["--election-type", "preferred"]);
    assert_eq!(usage.status.code(), Some(2), "{usage:?}");

    let elected = elect_cli(
        &nodes.bootstrap_all(),
        &["--election-type", "preferred", "--all-topic-partitions"],
    );
    assert!(elected.status.success(), "{elected:?}");
    let text = stdout(&elected);
    let listed: Vec<&str> = text
        .strip_prefix("Successfully completed leader election (PREFERRED) for partitions ")
        .unwrap_or_else(|| panic!("{text}"))
        .trim_end()
        .split(", ")
        .filter(|n| n.starts_with(&format!("{TOPIC}-")))
        .collect();
    let names: Vec<String> = preferred.iter().map(|p| format!("{TOPIC}-{p}")).collect();
    assert_eq!(listed, names, "{text}");
    assert!(
        producer.0.try_wait().unwrap().is_none(),
        "the producer ended before the election: raise PRODUCE_S"
    );
    let after = partitions_of(&nodes, TOPIC).unwrap();
    assert!(not_preferred(&after).is_empty(), "{after:?}");
    for p in &preferred {
        assert_eq!(after[*p].leader, victim, "{after:?}");
    }

    let again = elect_cli(
        &nodes.bootstrap_all(),
        &["--election-type", "PREFERRED", "--all-topic-partitions"],
    );
    assert!(again.status.success(), "{again:?}");
    assert_eq!(
        stdout(&again),
        "Valid replica already elected for all partitions\n"
    );
    let one = elect_cli(
        &nodes.bootstrap_all(),
        &[
            "--election-type",
            "Unclean",
            "--topic",
            TOPIC,
            "--partition",
            "1",
        ],
    );
    assert!(one.status.success(), "{one:?}");
    assert_eq!(
        stdout(&one),
        format!("Valid replica already elected for partitions {TOPIC}-1\n")
    );
    let json = work.path().join("partitions.json");
    std::fs::write(
        &json,
        format!(r#"{{"partitions": [{{"topic": "{TOPIC}", "partition": 0}}, {{"topic": "{TOPIC}", "partition": 99}}]}}"#),
    )
    .unwrap();
    let bad = elect_cli(
        &nodes.bootstrap_all(),
        &[
            "--election-type",
            "preferred",
            "--path-to-json-file",
            json.to_str().unwrap(),
        ],
    );
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    let text = stdout(&bad);
    assert!(
        text.contains(&format!(
            "Valid replica already elected for partitions {TOPIC}-0\n"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "Error completing leader election (PREFERRED) for partition: {TOPIC}-99: UNKNOWN_TOPIC_OR_PARTITION"
        )),
        "{text}"
    );
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("1 replica(s) could not be elected"),
        "{bad:?}"
    );

    // Everything acknowledged across the election is there once, at its offset.
    let status = poll_for("the producer to finish", PRODUCE_S + 90, || {
        producer
            .0
            .try_wait()
            .map_err(|e| e.to_string())?
            .ok_or_else(String::new)
    });
    let summary = std::fs::read_to_string(out.with_extension("stdout")).unwrap_or_default();
    eprintln!("producer ({status}): {}", summary.trim());
    let produced = ProducerLog::parse(&std::fs::read_to_string(&out).unwrap());
    assert!(produced.done && status.success(), "{summary}");
    wait_in_sync(&nodes, TOPIC, true, "still balanced and in sync");
    let read = read_all(&nodes.bootstrap_all(), TOPIC, PARTITIONS);
    let v = check(&produced, &read, PARTITIONS);
    let failed: usize = produced.failed.values().map(BTreeSet::len).sum();
    eprintln!(
        "leader_election: acknowledged {}, failed {failed}, unanswered {}, read {}, lost {}, \
         duplicated {}, out of order {}, never sent {}, at another offset {}",
        v.acknowledged,
        produced.unanswered,
        v.read,
        v.lost.len(),
        v.duplicated.len(),
        v.out_of_order.len(),
        v.never_sent.len(),
        v.moved.len()
    );
    assert!(v.acknowledged > 0, "nothing was acknowledged");
    v.assert_clean();
    nodes.assert_no_panic();
}

/// confluent-kafka's `AdminClient.elect_leaders(ELECTION_TYPE, [TopicPartition(TOPIC,
/// P)])`; prints `P CODE` per partition of the result (0: elected, else the error code).
const ELECT_PY: &str = r#"
import sys
from confluent_kafka import TopicPartition, ElectionType
from confluent_kafka.admin import AdminClient
boot, kind, topic, parts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
admin = AdminClient({"bootstrap.servers": boot})
tps = [TopicPartition(topic, int(p)) for p in parts]
result = admin.elect_leaders(getattr(ElectionType, kind), tps).result(60)
for tp, err in sorted(result.items(), key=lambda kv: kv[0].partition):
    # A KafkaError per partition (the docs say KafkaException: take either).
    code = 0 if err is None else (err.code() if hasattr(err, "code") else err.args[0].code())
    print(tp.partition, code, flush=True)
"#;

/// (partition, error code) per partition of a confluent-kafka `elect_leaders` call.
fn elect_py(bootstrap: &str, kind: &str, topic: &str, partitions: &[usize]) -> Vec<(usize, i64)> {
    let out = Command::new("timeout")
        .arg("90")
        .arg("python3")
        .arg("-c")
        .arg(ELECT_PY)
        .args([bootstrap, kind, topic])
        .args(partitions.iter().map(|p| p.to_string()))
        .current_dir(repo_root())
        .output()
        .unwrap_or_else(|e| panic!("python3: {e} (tests/install-deps.sh installs it)"));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "elect_leaders {kind} {partitions:?}: {out:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .map(|l| {
            let (p, c) = l.split_once(' ').unwrap_or_else(|| panic!("{text}"));
            (p.parse().unwrap(), c.parse().unwrap())
        })
        .collect()
}

/// (b) and (c) without auto rebalance: see the module doc.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_client_elects_the_preferred_leader_and_without_auto_rebalance_the_imbalance_stays(
) {
    const TOPIC: &str = "elect-admin";
    let mut overrides = BASE.to_vec();
    overrides.push("auto.leader.rebalance.enable=false");
    let mut nodes = ThreeNodes::start(&overrides);
    create_rf3(&nodes.bootstrap(1), TOPIC, PARTITIONS, &[]).await;
    let (victim, preferred) = kill_and_restart_a_preferred_leader(&mut nodes, TOPIC);
    wait_in_sync(
        &nodes,
        TOPIC,
        false,
        "the restarted broker back in every ISR",
    );
    // Proving an absence: three check intervals (2 s each) pass, nothing moves.
    std::thread::sleep(Duration::from_secs(6));
    let still = partitions_of(&nodes, TOPIC).unwrap();
    assert_eq!(not_preferred(&still), preferred, "{still:?}");

    let (first, rest) = (preferred[0], &preferred[1..]);
    assert_eq!(
        elect_py(&nodes.bootstrap_all(), "PREFERRED", TOPIC, &[first]),
        [(first, 0)]
    );
    let after = partitions_of(&nodes, TOPIC).unwrap();
    assert_eq!(after[first].leader, victim, "{after:?}");
    assert_eq!(
        not_preferred(&after),
        rest,
        "only the one named moved: {after:?}"
    );
    // Again: ELECTION_NOT_NEEDED (84); an unclean election of a partition with a live
    // leader: the same; a partition that does not exist: UNKNOWN_TOPIC_OR_PARTITION (3).
    assert_eq!(
        elect_py(&nodes.bootstrap_all(), "PREFERRED", TOPIC, &[first, 99]),
        [(first, 84), (99, 3)]
    );
    assert_eq!(
        elect_py(&nodes.bootstrap_all(), "UNCLEAN", TOPIC, rest),
        rest.iter().map(|p| (*p, 84)).collect::<Vec<_>>()
    );

    // The wire, raw: an unknown election type is INVALID_REQUEST (42); v0 (no type) is a
    // preferred election; null partitions elect every partition that needs it and list
    // only those.
    let mut conn = RawConn::connect(&nodes.bootstrap(1));
    let named = |p: usize| {
        Some(vec![TopicPartitions::default()
            .with_topic(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_partitions(vec![p as i32])])
    };
    let mut ask = |request: ElectLeadersRequest, version: i16, corr: i32| {
        let r: ElectLeadersResponse =
            decode(conn.request(&request, version, corr).unwrap(), version);
        let codes: Vec<(String, i32, i16)> = r
            .replica_election_results
            .iter()
            .flat_map(|t| {
                t.partition_result
                    .iter()
                    .map(|p| (t.topic.0.to_string(), p.partition_id, p.error_code))
            })
            .filter(|(t, _, _)| t == TOPIC)
            .collect();
        (r.error_code, codes)
    };
    let t = |p: usize, code: i16| (TOPIC.to_string(), p as i32, code);
    let bad_type = ElectLeadersRequest::default()
        .with_election_type(5)
        .with_topic_partitions(named(first));
    assert_eq!(ask(bad_type, 2, 1), (42, vec![t(first, 42)]));
    let v0 = ElectLeadersRequest::default().with_topic_partitions(named(first));
    assert_eq!(ask(v0, 0, 2), (0, vec![t(first, 84)]));
    let all = ElectLeadersRequest::default()
        .with_topic_partitions(None)
        .with_timeout_ms(30_000);
    let elected: Vec<_> = rest.iter().map(|p| t(*p, 0)).collect();
    assert_eq!(ask(all, 1, 3), (0, elected));
    let balanced = partitions_of(&nodes, TOPIC).unwrap();
    assert!(not_preferred(&balanced).is_empty(), "{balanced:?}");
    nodes.assert_no_panic();
}

/// (c) with auto rebalance: see the module doc.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auto_leader_rebalance_leadership_returns_to_preferred_replicas_by_itself() {
    const TOPIC: &str = "elect-auto";
    let mut nodes = ThreeNodes::start(&BASE);
    create_rf3(&nodes.bootstrap(1), TOPIC, PARTITIONS, &[]).await;
    let (victim, preferred) = kill_and_restart_a_preferred_leader(&mut nodes, TOPIC);
    let back = wait_in_sync(
        &nodes,
        TOPIC,
        true,
        "leadership back on the preferred replicas",
    );
    for p in &preferred {
        assert_eq!(back[*p].leader, victim, "{back:?}");
    }
    let logged = nodes
        .running()
        .any(|(_, n)| n.stderr_text().contains("auto leader rebalance"));
    assert!(logged, "no node logged an auto leader rebalance");
    nodes.assert_no_panic();
}
