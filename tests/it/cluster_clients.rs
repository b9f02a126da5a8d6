//! Issue 12, test 2 with the other clients: three `weir` processes, a topic of 6
//! partitions at replication factor 3 (each broker leads two), and confluent-kafka,
//! kafka-python and kafkajs bootstrapped to node 1 alone each produce to and read back
//! from every partition, so from the leaders on nodes 2 and 3 too, which they find in
//! Metadata (`tests/compat/roundtrip.py`, `tests/compat/roundtrip.js`); then kafka-python
//! and kafkajs whose cached leaders moved get NOT_LEADER_OR_FOLLOWER (6) and follow the
//! new ones (`tests/compat/stale_leader.py`, `tests/compat/stale_leader.js`). librdkafka
//! through the `rdkafka` crate is covered by `cluster_placement`. Every process is killed
//! at the end (`ThreeNodes`' drop).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::cluster_fixture::ThreeNodes;
use crate::harness::{poll_for, repo_root};
use crate::rdkafka_client::admin;

const TOPIC: &str = "followed";
const PARTITIONS: i32 = 6;
const RECORDS: &str = "1000";

/// A topic's partitions as Metadata lists them: index -> (leader, replicas).
type Partitions = BTreeMap<i32, (i32, Vec<i32>)>;

/// What `bootstrap`'s Metadata (librdkafka) says: the broker ids, and `TOPIC`'s partitions
/// as index -> (leader, replicas) when `with_topic`. Err while it does not answer or lists
/// the topic or a partition with an error.
fn metadata(bootstrap: &str, with_topic: bool) -> Result<(Vec<i32>, Partitions), String> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .map_err(|e| e.to_string())?;
    let m = c
        .fetch_metadata(with_topic.then_some(TOPIC), Duration::from_secs(5))
        .map_err(|e| e.to_string())?;
    let mut brokers: Vec<i32> = m.brokers().iter().map(|b| b.id()).collect();
    brokers.sort_unstable();
    let mut partitions = BTreeMap::new();
    for t in m.topics().iter().filter(|_| with_topic) {
        if let Some(e) = t.error() {
            return Err(format!("topic error {e:?}"));
        }
        for p in t.partitions() {
            if let Some(e) = p.error() {
                return Err(format!("partition {} error {e:?}", p.id()));
            }
            partitions.insert(p.id(), (p.leader(), p.replicas().to_vec()));
        }
    }
    Ok((brokers, partitions))
}

/// Each partition's high watermark, read by librdkafka from its leader (ListOffsets).
fn high_watermarks(bootstrap: &str) -> Vec<i64> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "cluster-clients-watermarks")
        .create()
        .expect("consumer");
    (0..PARTITIONS)
        .map(|p| {
            c.fetch_watermarks(TOPIC, p, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("watermarks of partition {p}: {e}"))
                .1
        })
        .collect()
}

/// Runs a client script (at most 120 s): (exit status success, stdout + stderr).
fn script(cmd: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new("timeout")
        .arg("120")
        .arg(cmd)
        .args(args)
        .current_dir(repo_root())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e} (tests/install-deps.sh installs it)"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Issue 12, test 2: a client bootstrapped to broker 1 only produces to and consumes from
/// partitions led by brokers 2 and 3 — confluent-kafka, kafka-python and kafkajs, each
/// 1000 keyed records with headers through all 6 partitions of a topic created
/// beforehand, every record read back at the offset it was acknowledged at; Metadata
/// (librdkafka) lists 3 brokers from every node and leaders on all three; every
/// partition's high watermark grows with each client's run. Then kafka-python and kafkajs
/// producers whose topic was re-created with other leaders are answered
/// NOT_LEADER_OR_FOLLOWER (6), refresh Metadata and get every record acknowledged by the
/// new leaders, which serve them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_js_clients_bootstrapped_to_one_node_follow_the_leaders() {
    // waits until every node lists brokers 1, 2, 3 (placement is over registered brokers)
    let cluster = ThreeNodes::start(&[]);
    let addr = |id: i32| cluster.bootstrap(id);
    for id in 1..=3 {
        let (brokers, _) = metadata(&addr(id), false).expect("Metadata (librdkafka)");
        assert_eq!(brokers, [1, 2, 3], "node {id}");
    }

    let created = admin(&addr(1))
        .create_topics(
            &[NewTopic::new(TOPIC, PARTITIONS, TopicReplication::Fixed(3))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(20))),
        )
        .await
        .expect("create_topics");
    for r in created {
        r.expect("topic created");
    }
    for id in 1..=3 {
        let (brokers, partitions) = poll_for(
            &format!("node {id} lists {TOPIC}'s {PARTITIONS} partitions"),
            15,
            || {
                let m = metadata(&addr(id), true)?;
                if m.1.len() == PARTITIONS as usize {
                    Ok(m)
                } else {
                    Err(format!("{m:?}"))
                }
            },
        );
        assert_eq!(brokers, [1, 2, 3], "node {id}");
        let leaders: BTreeSet<i32> = partitions.values().map(|(l, _)| *l).collect();
        assert_eq!(
            leaders,
            BTreeSet::from([1, 2, 3]),
            "node {id}: leaders on all three brokers: {partitions:?}"
        );
        for (p, (leader, replicas)) in &partitions {
            let distinct: BTreeSet<i32> = replicas.iter().copied().collect();
            assert_eq!(distinct, BTreeSet::from([1, 2, 3]), "partition {p}");
            assert!(replicas.contains(leader), "partition {p}: {replicas:?}");
        }
    }

    let boot = addr(1);
    let runs: [(&str, Vec<&str>); 3] = [
        (
            "python3",
            vec![
                "tests/compat/roundtrip.py",
                &boot,
                TOPIC,
                RECORDS,
                "confluent-kafka",
            ],
        ),
        (
            "python3",
            vec![
                "tests/compat/roundtrip.py",
                &boot,
                TOPIC,
                RECORDS,
                "kafka-python",
            ],
        ),
        (
            "node",
            vec![
                "tests/compat/roundtrip.js",
                &boot,
                TOPIC,
                RECORDS,
                "kafkajs",
            ],
        ),
    ];
    let mut before = high_watermarks(&boot);
    for (cmd, args) in runs {
        let client = args[4];
        let (ok, text) = script(cmd, &args);
        assert!(
            ok && text.contains(&format!("{client} ok {RECORDS}/{RECORDS}")),
            "{client} bootstrapped to node 1: {text}"
        );
        let after = high_watermarks(&boot);
        for p in 0..PARTITIONS as usize {
            assert!(
                after[p] > before[p],
                "{client} wrote nothing to partition {p}: {before:?} -> {after:?}"
            );
        }
        before = after;
    }

    // Leaders that move under a client: each script creates its topic, produces, then
    // re-creates the topic with every leader shifted by one broker and produces again with
    // the same client, whose cached leaders answer NOT_LEADER_OR_FOLLOWER (6). kafka-python
    // runs three times: the re-created topic can reach a broker's image only after that
    // broker tried to auto-create it for a Produce, which once answered -1 (a fatal error
    // for kafka-python) and was caught this way about one run in three.
    let scripts = [
        (
            "python3",
            "tests/compat/stale_leader.py",
            "kafka-python",
            "moved-py-1",
        ),
        (
            "python3",
            "tests/compat/stale_leader.py",
            "kafka-python",
            "moved-py-2",
        ),
        (
            "python3",
            "tests/compat/stale_leader.py",
            "kafka-python",
            "moved-py-3",
        ),
        (
            "node",
            "tests/compat/stale_leader.js",
            "kafkajs",
            "moved-js",
        ),
    ];
    for (cmd, file, client, topic) in scripts {
        let (ok, text) = script(cmd, &[file, &boot, topic, "1,2,3"]);
        assert!(
            ok && text.contains(&format!("{client} ok: 6 partitions")),
            "{client} after its leaders moved ({topic}): {text}{}",
            cluster
                .running()
                .map(|(_, n)| n.stderr_text())
                .filter(|t| t.contains("ERROR"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    cluster.assert_no_panic();
}
