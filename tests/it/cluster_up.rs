//! `weir cluster up` (issue 12): the built binary starts three nodes as its children,
//! prints the bootstrap list first, serves keyed records end to end, stops every node on
//! SIGINT and exits 0; killed with SIGKILL it still takes its nodes with it (their
//! parent-death signal), and the same `--dir` restarts the same cluster on the same ports.
//! A node that cannot start fails the command with its log's tail.
//!
//! Every wait has a deadline; `ClusterUp`'s drop kills `cluster up` and every node pid it
//! printed, so a failing test leaves no process behind.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};
use rustix::process::{kill_process, Pid, Signal};

use crate::harness::{poll_for, wait_until};
use crate::rdkafka_client::{create_topic, producer};

/// How long `cluster up` may take to print its bootstrap line (it gives its nodes 30 s).
const STARTED_SECS: u64 = 60;

/// How long `cluster up` may take to exit after SIGINT (it gives its nodes 15 s of grace).
const STOPPED_SECS: u64 = 40;

/// `weir cluster up` as a child process of the test.
struct ClusterUp {
    child: Child,
    /// stdout, line by line (a bounded channel fed by a thread).
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
    /// The bootstrap list, its first line.
    bootstrap: String,
    /// Each node's pid, in node id order, as printed.
    node_pids: Vec<i32>,
}

impl ClusterUp {
    /// Runs `weir cluster up --dir DIR [--nodes N]` and reads what it prints until the
    /// line saying the nodes are up.
    fn start(dir: &std::path::Path, nodes: Option<u8>) -> ClusterUp {
        let mut cmd = Command::new(crate::harness::weir_bin());
        cmd.args(["cluster", "up", "--dir"]).arg(dir);
        if let Some(n) = nodes {
            cmd.args(["--nodes", &n.to_string()]);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn weir cluster up");
        let (tx, lines) = sync_channel(64);
        let out = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let err = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        let mut up = ClusterUp {
            child,
            lines,
            stderr,
            bootstrap: String::new(),
            node_pids: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(STARTED_SECS);
        up.bootstrap = up.next_line(deadline);
        loop {
            let line = up.next_line(deadline);
            if let Some(rest) = line.strip_prefix("# node ") {
                // "# node 2: pid 1234, admin http://..., log ..."
                let pid = rest
                    .split("pid ")
                    .nth(1)
                    .and_then(|s| s.split(',').next())
                    .and_then(|s| s.parse().ok())
                    .unwrap_or_else(|| panic!("no pid in {line:?}"));
                up.node_pids.push(pid);
            } else if line.contains("nodes up") {
                break;
            }
        }
        up
    }

    /// The next stdout line, failing the test (with stderr) at `deadline` or at EOF.
    fn next_line(&self, deadline: Instant) -> String {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(left) {
            Ok(line) => line,
            Err(e) => panic!(
                "no line from weir cluster up ({e}); its stderr:\n{}",
                self.stderr.lock().unwrap()
            ),
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_child(&self.child)
    }

    /// Waits (bounded) for `cluster up` to exit.
    fn wait_exit(&mut self, timeout_secs: u64) -> ExitStatus {
        let child = &mut self.child;
        poll_for("weir cluster up exits", timeout_secs, || {
            match child.try_wait().expect("try_wait") {
                Some(status) => Ok(status),
                None => Err("still running".to_string()),
            }
        })
    }
}

impl Drop for ClusterUp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for pid in &self.node_pids {
            if is_running(*pid) {
                if let Some(pid) = Pid::from_raw(*pid) {
                    let _ = kill_process(pid, Signal::KILL);
                }
            }
        }
    }
}

/// Whether process `pid` exists and is not a zombie (an orphan's reaping is not ours).
fn is_running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "PID (COMM) STATE ...": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// The node ids a node's own Metadata lists as brokers (asked of that node alone).
fn brokers_listed_by(address: &str) -> BTreeSet<i32> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", address)
        .create()
        .expect("consumer");
    let m = c
        .fetch_metadata(None, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("Metadata from {address}: {e}"));
    m.brokers().iter().map(|b| b.id()).collect()
}

/// A topic's partitions as one node's Metadata lists them: partition → (leader, replicas).
fn partitions_seen_by(address: &str, topic: &str) -> BTreeMap<i32, (i32, Vec<i32>)> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", address)
        .create()
        .expect("consumer");
    let Ok(m) = c.fetch_metadata(None, Duration::from_secs(5)) else {
        return BTreeMap::new();
    };
    m.topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions())
        .map(|p| (p.id(), (p.leader(), p.replicas().to_vec())))
        .collect()
}

/// Three nodes from `weir cluster up`: the bootstrap line comes first, every node answers
/// Metadata, 3000 keyed records over 6 partitions are all acknowledged and read back once
/// each, `weir topic describe` through another node shows the partitions in
/// kafka-topics.sh's layout, and SIGINT stops everything with exit code 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_up_runs_three_nodes_that_serve_records_and_stop_on_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let mut up = ClusterUp::start(dir.path(), Some(3));
    let addresses: Vec<String> = up.bootstrap.split(',').map(str::to_string).collect();
    assert_eq!(addresses.len(), 3, "bootstrap line {:?}", up.bootstrap);
    assert!(
        addresses.iter().all(|a| a.starts_with("127.0.0.1:")),
        "{addresses:?}"
    );
    assert_eq!(up.node_pids.len(), 3, "pids printed: {:?}", up.node_pids);
    assert!(up.node_pids.iter().all(|p| is_running(*p)));
    assert!(dir.path().join("cluster.toml").is_file());
    for id in 1..=3 {
        assert!(dir.path().join(format!("node-{id}")).is_dir());
        assert!(dir.path().join(format!("node-{id}.log")).is_file());
    }

    // Every node registered with the quorum before serving, so each node's Metadata lists
    // all three brokers (polled: a node applies the others' registrations as they commit).
    let all: BTreeSet<i32> = [1, 2, 3].into();
    poll_for("every node lists brokers 1, 2 and 3", 15, || {
        let listed: Vec<BTreeSet<i32>> = addresses.iter().map(|a| brokers_listed_by(a)).collect();
        if listed.iter().all(|l| *l == all) {
            Ok(())
        } else {
            Err(format!("brokers listed by nodes 1, 2, 3: {listed:?}"))
        }
    });
    // The whole bootstrap line: clients follow each partition's leader from Metadata.
    let client_bootstrap = up.bootstrap.clone();
    create_topic(&client_bootstrap, "orders", 6, &[]).await;
    // The topic is in every node's metadata (one quorum), with 6 partitions.
    for address in &addresses {
        poll_for("every node lists the 6 partitions", 10, || {
            let seen = partitions_seen_by(address, "orders");
            if seen.len() == 6 {
                Ok(())
            } else {
                Err(format!("{address} lists {seen:?}"))
            }
        });
    }

    // 3000 keyed records, acks=all; every acknowledged one must come back exactly once.
    const RECORDS: usize = 3000;
    let p = producer(&client_bootstrap, &[("acks", "all")]);
    let mut deliveries = Vec::with_capacity(RECORDS);
    for i in 0..RECORDS {
        let key = format!("key-{}", i % 97);
        let value = format!("{i}");
        let record = FutureRecord::to("orders").key(&key).payload(&value);
        deliveries.push((
            i,
            p.send_result(record).map_err(|(e, _)| e).expect("queued"),
        ));
    }
    let mut acked = BTreeSet::new();
    let mut failed = Vec::new();
    for (i, d) in deliveries {
        match d.await {
            Ok(Ok(_)) => {
                acked.insert(i);
            }
            Ok(Err((e, _))) => failed.push((i, e.to_string())),
            Err(_) => failed.push((i, "delivery future cancelled".to_string())),
        }
    }
    drop(p);
    assert!(
        failed.is_empty(),
        "{} of {RECORDS} not acknowledged, first: {:?}",
        failed.len(),
        failed.first()
    );
    assert_eq!(acked.len(), RECORDS);

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &client_bootstrap)
        .set("group.id", "cluster-up-test")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for part in 0..6 {
        tpl.add_partition_offset("orders", part, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).expect("assign");
    let mut seen: BTreeMap<usize, usize> = BTreeMap::new();
    let mut partitions_of_key: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < RECORDS && Instant::now() < deadline {
        let Some(msg) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let msg = msg.expect("consume");
        let value: usize = std::str::from_utf8(msg.payload().expect("value"))
            .expect("utf-8")
            .parse()
            .expect("a number");
        *seen.entry(value).or_default() += 1;
        let key = String::from_utf8(msg.key().expect("key").to_vec()).unwrap();
        partitions_of_key
            .entry(key)
            .or_default()
            .insert(msg.partition());
    }
    let lost: Vec<&usize> = acked.iter().filter(|i| !seen.contains_key(i)).collect();
    let duplicated: Vec<&usize> = seen
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(i, _)| i)
        .collect();
    eprintln!(
        "acknowledged {}, read {}, lost {}, duplicated {}",
        acked.len(),
        seen.len(),
        lost.len(),
        duplicated.len()
    );
    assert!(
        lost.is_empty(),
        "lost {} records, first {:?}",
        lost.len(),
        lost.first()
    );
    assert!(duplicated.is_empty(), "duplicated: {duplicated:?}");
    assert_eq!(seen.len(), RECORDS);
    // Keyed records: one key, one partition; 97 keys spread over more than one.
    assert!(partitions_of_key.values().all(|p| p.len() == 1));
    let used: BTreeSet<i32> = partitions_of_key.values().flatten().copied().collect();
    assert!(used.len() > 1, "every key in one partition: {used:?}");
    drop(consumer);

    // `weir topic describe` through another node than the one clients use: the
    // kafka-topics.sh layout, one line per partition, its leader among its replicas.
    let out = Command::new("timeout")
        .arg("60")
        .arg(crate::harness::weir_bin())
        .args(["topic", "describe", "orders", "-b", &addresses[1]])
        .output()
        .expect("weir topic describe");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let header = lines.next().expect("a header line");
    assert!(
        header.starts_with("Topic: orders\tTopicId: ")
            && header.contains("\tPartitionCount: 6\tReplicationFactor: 1\tConfigs: "),
        "{text}"
    );
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 6, "{text}");
    for (p, row) in rows.iter().enumerate() {
        let fields: Vec<&str> = row.split('\t').collect();
        let partition = format!("Partition: {p}");
        assert_eq!(
            fields[..3],
            ["", "Topic: orders", partition.as_str()],
            "{row}"
        );
        let value = |name: &str| -> Vec<i32> {
            let field = fields
                .iter()
                .find_map(|f| f.strip_prefix(name))
                .unwrap_or_else(|| panic!("no {name} in {row:?}"));
            field
                .split(',')
                .map(|id| id.parse().expect("an id"))
                .collect()
        };
        let (leader, replicas, isr) = (value("Leader: "), value("Replicas: "), value("Isr: "));
        assert_eq!(leader.len(), 1, "{row}");
        assert!((1..=3).contains(&leader[0]), "{row}");
        assert!(replicas.contains(&leader[0]), "{row}");
        assert!(isr.iter().all(|id| replicas.contains(id)), "{row}");
    }

    // SIGINT: every node stops, `cluster up` exits 0.
    kill_process(up.pid(), Signal::INT).expect("SIGINT");
    let status = up.wait_exit(STOPPED_SECS);
    assert!(
        status.success(),
        "{status}; stderr:\n{}",
        up.stderr.lock().unwrap()
    );
    for pid in &up.node_pids {
        assert!(!is_running(*pid), "node pid {pid} still runs");
    }
    for address in &addresses {
        assert!(
            TcpStream::connect(address).is_err(),
            "{address} still accepts connections"
        );
    }
}

/// SIGKILL to `cluster up` stops its nodes too (each asked for SIGTERM on its parent's
/// death); `cluster up` over the same dir then starts the same cluster on the same ports,
/// with the topic made before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_cluster_up_takes_its_nodes_along_and_the_same_dir_restarts_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut up = ClusterUp::start(dir.path(), Some(3));
    let first_node = up.bootstrap.split(',').next().unwrap().to_string();
    create_topic(&first_node, "kept", 2, &[]).await;

    up.child.kill().expect("SIGKILL");
    let _ = up.wait_exit(STOPPED_SECS);
    let pids = up.node_pids.clone();
    wait_until(
        "every node of the killed cluster up has stopped",
        30,
        || pids.iter().all(|p| !is_running(*p)),
    );
    let bootstrap = up.bootstrap.clone();
    drop(up);

    // No --nodes: the dir's cluster.toml says 3, and the same ports.
    let mut again = ClusterUp::start(dir.path(), None);
    assert_eq!(again.bootstrap, bootstrap);
    poll_for("node 1 lists the topic made before the restart", 10, || {
        let seen = partitions_seen_by(&first_node, "kept");
        if seen.len() == 2 {
            Ok(())
        } else {
            Err(format!("it lists {seen:?}"))
        }
    });
    kill_process(again.pid(), Signal::TERM).expect("SIGTERM");
    let status = again.wait_exit(STOPPED_SECS);
    assert!(status.success(), "{status}");
    for pid in &again.node_pids {
        assert!(!is_running(*pid), "node pid {pid} still runs");
    }
}

/// A node that cannot start (its Kafka port is taken) fails `cluster up` with exit code 1
/// and that node's log tail, and the other node is stopped.
#[test]
fn a_node_that_cannot_start_fails_cluster_up_with_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    let free: Vec<std::net::TcpListener> = (0..5)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let f: Vec<u16> = free
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect();
    drop(free);
    std::fs::write(
        dir.path().join("cluster.toml"),
        format!(
            "[[node]]\nid = 1\nkafka_port = {}\ncontroller_port = {}\nadmin_port = {}\n\n\
             [[node]]\nid = 2\nkafka_port = {taken_port}\ncontroller_port = {}\nadmin_port = {}\n",
            f[0], f[1], f[2], f[3], f[4]
        ),
    )
    .unwrap();
    let out = Command::new("timeout")
        .arg(STARTED_SECS.to_string())
        .arg(crate::harness::weir_bin())
        .args(["cluster", "up", "--dir"])
        .arg(dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("weir cluster up");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty(), "no bootstrap line: {:?}", out.stdout);
    assert!(
        stderr.contains("node 2 exited during start-up") && stderr.contains("node-2.log"),
        "{stderr}"
    );
    // The tail is node 2's own error: its port.
    assert!(stderr.contains(&taken_port.to_string()), "{stderr}");
    // Node 1 was stopped: its port refuses connections.
    assert!(TcpStream::connect(("127.0.0.1", f[0])).is_err());
    drop(taken);
}

/// What kafka-python's admin client (Metadata) sees of topic `argv[2]` through
/// bootstrap `argv[1]`, as JSON: the brokers, the topic's error code, and each partition's
/// leader and replicas.
const KAFKA_PYTHON_METADATA: &str = r#"
import json, sys
from kafka import KafkaAdminClient
def get(d, *names):
    for n in names:
        if n in d:
            return d[n]
    raise KeyError(f"none of {names} in {sorted(d)}")
a = KafkaAdminClient(bootstrap_servers=sys.argv[1].split(","), client_id="weir-cluster-test")
brokers = sorted(get(b, "node_id", "broker_id", "nodeId") for b in a.describe_cluster()["brokers"])
t = a.describe_topics([sys.argv[2]])[0]
parts = {
    str(get(p, "partition", "partition_index")): [
        get(p, "leader", "leader_id"),
        sorted(get(p, "replicas", "replica_nodes")),
    ]
    for p in t["partitions"]
}
print(json.dumps({"brokers": brokers, "error": t["error_code"], "partitions": parts}))
a.close()
"#;

/// Issue 12, test 1: `weir cluster up --nodes 3`; a topic of 6 partitions at
/// replication factor 3. librdkafka's and kafka-python's Metadata (each through one
/// node) list 3 brokers, leaders on all three, 3 replicas per partition; kcat produces
/// 30,000 keyed records (`-K:`, acks=all) from stdin and `kcat -C -e` reads every one
/// back, each once, its key matching its value. SIGINT stops the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_up_rf3_topic_seen_by_two_clients_and_kcat_moves_30000_records() {
    const RECORDS: usize = 30_000;
    let dir = tempfile::tempdir().unwrap();
    let mut up = ClusterUp::start(dir.path(), Some(3));
    let addresses: Vec<String> = up.bootstrap.split(',').map(str::to_string).collect();
    assert_eq!(addresses.len(), 3, "bootstrap line {:?}", up.bootstrap);
    let all: BTreeSet<i32> = [1, 2, 3].into();
    poll_for("every node lists brokers 1, 2 and 3", 15, || {
        let listed: Vec<BTreeSet<i32>> = addresses.iter().map(|a| brokers_listed_by(a)).collect();
        if listed.iter().all(|l| *l == all) {
            Ok(())
        } else {
            Err(format!("brokers listed by nodes 1, 2, 3: {listed:?}"))
        }
    });
    let created = crate::rdkafka_client::admin(&up.bootstrap)
        .create_topics(
            &[rdkafka::admin::NewTopic::new(
                "spread",
                6,
                rdkafka::admin::TopicReplication::Fixed(3),
            )],
            &rdkafka::admin::AdminOptions::new().operation_timeout(Some(Duration::from_secs(20))),
        )
        .await
        .expect("create_topics");
    for r in created {
        r.expect("topic created");
    }

    // librdkafka, through each node alone.
    for address in &addresses {
        let seen = poll_for("the node lists spread's 6 partitions", 10, || {
            let seen = partitions_seen_by(address, "spread");
            if seen.len() == 6 {
                Ok(seen)
            } else {
                Err(format!("{address} lists {seen:?}"))
            }
        });
        assert_eq!(brokers_listed_by(address), all);
        let leaders: BTreeSet<i32> = seen.values().map(|(l, _)| *l).collect();
        assert_eq!(leaders, all, "leaders on all three brokers: {seen:?}");
        for (p, (leader, replicas)) in &seen {
            let set: BTreeSet<i32> = replicas.iter().copied().collect();
            assert_eq!((replicas.len(), &set), (3, &all), "partition {p}: {seen:?}");
            assert!(set.contains(leader));
        }
    }

    // kafka-python, through node 2 alone.
    let out = Command::new("timeout")
        .args([
            "60",
            "python3",
            "-c",
            KAFKA_PYTHON_METADATA,
            &addresses[1],
            "spread",
        ])
        .output()
        .expect("python3");
    assert!(out.status.success(), "{out:?}");
    let seen: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    eprintln!("kafka-python: {seen}");
    assert_eq!(seen["brokers"], serde_json::json!([1, 2, 3]));
    assert_eq!(seen["error"], 0);
    let parts = seen["partitions"].as_object().expect("partitions");
    assert_eq!(parts.len(), 6, "{seen}");
    let mut leaders = BTreeSet::new();
    for (p, lr) in parts {
        leaders.insert(lr[0].as_i64().expect("leader"));
        assert_eq!(lr[1], serde_json::json!([1, 2, 3]), "partition {p}");
    }
    assert_eq!(leaders, BTreeSet::from([1, 2, 3]));

    // kcat: 30,000 keyed records from stdin, acks=all, then read back to the end.
    crate::cluster_fixture::kcat_produce(&up.bootstrap, "spread", RECORDS);
    let consumed = Command::new("timeout")
        .args([
            "120",
            "kcat",
            "-C",
            "-b",
            &addresses[2],
            "-t",
            "spread",
            "-e",
            "-q",
        ])
        .args(["-o", "beginning", "-f", "%p %k:%s\\n"])
        .output()
        .expect("kcat -C");
    assert!(consumed.status.success(), "{consumed:?}");
    let text = String::from_utf8(consumed.stdout).expect("utf-8");
    let mut seen: BTreeMap<usize, usize> = BTreeMap::new();
    let mut partitions_of_key: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for line in text.lines() {
        let (partition, record) = line.split_once(' ').expect("PARTITION KEY:VALUE");
        let (key, value) = record.split_once(':').expect("KEY:VALUE");
        let i: usize = value[1..].parse().unwrap_or_else(|_| panic!("{line:?}"));
        assert_eq!(key, format!("key-{}", i % 97), "{line:?}");
        *seen.entry(i).or_default() += 1;
        partitions_of_key.entry(key).or_default().insert(partition);
    }
    assert_eq!(text.lines().count(), RECORDS);
    assert_eq!(seen.len(), RECORDS, "every record read back");
    assert!(seen.values().all(|n| *n == 1), "a record read twice");
    assert!(partitions_of_key.values().all(|p| p.len() == 1));
    let used: BTreeSet<&str> = partitions_of_key.values().flatten().copied().collect();
    assert_eq!(used.len(), 6, "97 keys over all 6 partitions: {used:?}");

    kill_process(up.pid(), Signal::INT).expect("SIGINT");
    let status = up.wait_exit(STOPPED_SECS);
    assert!(status.success(), "{status}");
}
