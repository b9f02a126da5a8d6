//! Cluster benchmark (issues 12 and 13): metadata at scale, controller failover, and
//! replication (partition failover, RF 3 vs RF 1 throughput, latency), against real
//! `weir` processes on 127.0.0.1.
//!
//! ```text
//! cargo bench --bench cluster -- [--only MODE[,MODE...]] [--topics N] [--partitions N]
//!                                [--batch N] [--runs N] [--records N] [--rounds N]
//!                                [--produce-partitions N] [--latency-secs N]
//! benches/cluster.sh [same arguments]    (builds, then runs this with the release weir)
//! ```
//! MODE: metadata, failover, replication, partition-failover (default: all four, in
//! that order).
//! 1. **Metadata**: `--topics` (default 1000) topics of `--partitions` (default 3)
//!    partitions, replication factor -1 (`default.replication.factor`, 1), created with
//!    raw CreateTopics v7 requests of `--batch` (default 100) topics each, one after the
//!    other on one connection, first on a 3-node cluster (through a node that does not
//!    lead the quorum: forwarded to the leader, as a client that picked any broker) and
//!    then on one node (`weir serve`, a cluster of one). Timed from the first request to
//!    (a) the last response and (b) the moment every node's Metadata v12 (all topics)
//!    lists all of them with `--partitions` partitions, no error and a leader each
//!    (polled every 50 ms after the last response). Printed: both times, topics/s, the
//!    3-node/1-node ratio, each batch's time (a cost that grows with the topic count
//!    shows there), each node's CPU and peak RSS.
//! 2. **Controller failover**, `--runs` (default 20) times on a fresh 3-node cluster:
//!    find the quorum leader (every node's Metadata names the same `controller_id` and
//!    that node's log says `quorum_leader=` itself), open a connection to a survivor
//!    (alternately the lower and the higher id), kill -9 the leader, and time from the
//!    kill until a CreateTopics (1 partition) sent on that connection answers error 0
//!    (an error answer is retried at once, a dropped connection is reopened). Then
//!    restart the killed node over its data dir and wait until it has rejoined (every node
//!    names the same controller, lists 3 brokers, and the restarted one lists the topic
//!    created during the failover) before the next run. Printed per run and as min, p50,
//!    p99 and max (nearest rank: with 20 runs p99 is the max).
//!
//! 3. **Replication** (issue 13): on a fresh 3-node cluster, topics `tp-rf1` (RF 1) and
//!    `tp-rf3` (RF 3, `min.insync.replicas` 2) of `--produce-partitions` (default 6)
//!    partitions; librdkafka's `rdkafka_performance` (`RDKAFKA_PERF`, a command line)
//!    produces `--records` (default 1,000,000) records of 100 B with acks=all
//!    (`linger.ms` 5, `batch.size` 1000000, no compression, records spread over every
//!    partition) to each, RF 1 then RF 3, `--rounds` (default 2) times, after a warm-up
//!    of 20,000 each. Printed: records/s (rdkafka_performance's own figure), the broker
//!    CPU (sum of the three processes' user+sys from /proc/PID/stat over the phase) per
//!    record, the RF 3 / RF 1 ratios. Then latency at half the best RF 3 rate
//!    (`rdkafka_performance -r`), for `--latency-secs` (default 10) seconds, RF 3 then RF
//!    1 at that same rate: per-record produce() → delivery report (`-l`), p50, p99
//!    (nearest rank), max.
//! 4. **Partition failover** (issue 13), `--runs` (default 20) times on a fresh 3-node
//!    cluster: topic `failover-rf3` (1 partition, RF 3, `min.insync.replicas` 2); a
//!    producer thread sends acks=all Produce v8 requests of one 100-byte record back to
//!    back, to the leader it finds in Metadata (asking the nodes in turn; after an error
//!    it asks again after 10 ms, so client-side metadata refresh costs one round trip).
//!    Each run waits until every node agrees on the leader and an ISR of 3 and the load
//!    reaches that leader, kill -9s the leader, and times from just before the signal to
//!    the first acks=all success answered by another broker; then restarts the killed node
//!    and waits until it is back in the ISR (every node lists an ISR of 3). Printed per run
//!    (with what the producer saw meanwhile) and as min, p50, p99, max (nearest rank),
//!    overall and split by whether the killed leader was also the active controller.
//!    With `WEIR_BIN_BASE` set, the same runs first with that broker on a cluster of its
//!    own (an A/B in one run), then the candidate/baseline ratios.
//!
//! Raft timing is weir's built-in one (`src/cluster/raft/mod.rs`: heartbeat 100 ms,
//! election timeout 500–1000 ms); weir has no config key for it. Every node runs with
//! its default settings otherwise.
//!
//! Environment: `WEIR_BIN` (the broker binary; default the `weir` cargo built with this
//! bench), `WEIR_BIN_BASE` (a baseline broker for partition failover's A/B),
//! `RDKAFKA_PERF` (the rdkafka_performance command; default `rdkafka_performance`), `WEIR_BENCH_DIR` (where the run's temp dir goes, default /var/tmp), `KEEP=1`
//! (keep it: node logs `node-N.log`). Every node gets `WEIR_PARENT_PID` (it dies with
//! this program even on kill -9) and is killed when this program ends or panics. Every
//! wait is bounded; the whole run fails after [`RUN_BOUND`].

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, MetadataRequest, MetadataResponse, ProduceRequest, RequestHeader,
    ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

type Result<T> = std::result::Result<T, String>;

/// The whole program fails after this long (a wait that never ends is a bug to report).
const RUN_BOUND: Duration = Duration::from_secs(1800);
/// Longest a node may take to start, or a restarted one to rejoin.
const START_BOUND: Duration = Duration::from_secs(60);
/// Longest the created topics may take to be visible everywhere after the last response.
const VISIBLE_BOUND: Duration = Duration::from_secs(300);
/// Longest a failover may take before the run is declared failed.
const FAILOVER_BOUND: Duration = Duration::from_secs(60);
/// Poll interval of every wait.
const POLL: Duration = Duration::from_millis(50);

const METADATA_VERSION: i16 = 12;
const CREATE_TOPICS_VERSION: i16 = 7;

// ------------------------------------------------------------------------ raw client

/// One Kafka connection, one request at a time.
struct Conn {
    stream: TcpStream,
    correlation: i32,
}

impl Conn {
    fn connect(port: u16, read_timeout: Duration) -> Result<Conn> {
        let stream =
            TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect :{port}: {e}"))?;
        stream.set_nodelay(true).ok();
        stream
            .set_read_timeout(Some(read_timeout))
            .map_err(|e| e.to_string())?;
        stream
            .set_write_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        Ok(Conn {
            stream,
            correlation: 0,
        })
    }

    fn request<R: Request>(&mut self, req: &R, version: i16) -> Result<R::Response> {
        self.correlation += 1;
        let key = ApiKey::try_from(R::KEY).map_err(|_| "api key".to_string())?;
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation)
            .with_client_id(Some(StrBytes::from_static_str("weir-bench-cluster")));
        let mut buf = BytesMut::new();
        header
            .encode(&mut buf, key.request_header_version(version))
            .map_err(|e| e.to_string())?;
        req.encode(&mut buf, version).map_err(|e| e.to_string())?;
        let mut frame = (buf.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&buf);
        self.stream
            .write_all(&frame)
            .map_err(|e| format!("write: {e}"))?;
        let mut len = [0u8; 4];
        self.stream
            .read_exact(&mut len)
            .map_err(|e| format!("read: {e}"))?;
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        self.stream
            .read_exact(&mut body)
            .map_err(|e| format!("read: {e}"))?;
        let mut body = Bytes::from(body);
        let h = ResponseHeader::decode(&mut body, key.response_header_version(version))
            .map_err(|e| e.to_string())?;
        if h.correlation_id != self.correlation {
            return Err(format!(
                "correlation id {} for {}",
                h.correlation_id, self.correlation
            ));
        }
        R::Response::decode(&mut body, version).map_err(|e| e.to_string())
    }
}

/// All topics' Metadata from the node on `port` (a fresh connection: cheap, and a node
/// that was just restarted is reached again).
fn metadata(port: u16) -> Result<MetadataResponse> {
    let mut c = Conn::connect(port, Duration::from_secs(10))?;
    c.request(
        &MetadataRequest::default().with_topics(None),
        METADATA_VERSION,
    )
}

fn creatable(name: &str, partitions: i32) -> CreatableTopic {
    CreatableTopic::default()
        .with_name(TopicName(StrBytes::from_string(name.to_string())))
        .with_num_partitions(partitions)
        .with_replication_factor(-1)
}

fn create_request(topics: Vec<CreatableTopic>, timeout: Duration) -> CreateTopicsRequest {
    CreateTopicsRequest::default()
        .with_topics(topics)
        .with_timeout_ms(timeout.as_millis() as i32)
}

// ------------------------------------------------------------------------ processes

/// Free loopback ports (bound and released: another process could take one between).
fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("addr").port())
        .collect()
}

struct Node {
    id: i32,
    kafka_port: u16,
    controller_port: u16,
    log: PathBuf,
    child: Option<Child>,
}

/// N `weir serve` processes; N = 1 is a plain single node (no voters), N > 1 combined
/// broker+controller nodes, all voters. Every process is killed on drop.
struct Cluster {
    exe: PathBuf,
    dir: PathBuf,
    voters: String,
    nodes: Vec<Node>,
}

impl Cluster {
    fn start(exe: &Path, dir: &Path, n: usize) -> Cluster {
        let ports = free_ports(2 * n);
        let nodes: Vec<Node> = (0..n)
            .map(|i| Node {
                id: i as i32 + 1,
                kafka_port: ports[2 * i],
                controller_port: ports[2 * i + 1],
                log: dir.join(format!("node-{}.log", i + 1)),
                child: None,
            })
            .collect();
        let voters = if n == 1 {
            String::new()
        } else {
            nodes
                .iter()
                .map(|n| format!("{}@127.0.0.1:{}", n.id, n.controller_port))
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut c = Cluster {
            exe: exe.to_path_buf(),
            dir: dir.to_path_buf(),
            voters,
            nodes,
        };
        for i in 0..n {
            c.spawn(i);
        }
        c
    }

    /// Starts node index `i` (again) over its data dir, on its ports.
    fn spawn(&mut self, i: usize) {
        let single = self.nodes.len() == 1;
        let n = &mut self.nodes[i];
        let data = self.dir.join(format!("node-{}", n.id));
        let mut args = vec!["serve".to_string()];
        let mut o = |s: String| {
            args.push("--override".into());
            args.push(s);
        };
        o(format!("log.dirs={}", data.display()));
        o("admin.listeners=".into());
        if single {
            o(format!("listeners=PLAINTEXT://127.0.0.1:{}", n.kafka_port));
        } else {
            o(format!("node.id={}", n.id));
            o(format!("controller.quorum.voters={}", self.voters));
            o("controller.listener.names=CONTROLLER".into());
            o(format!(
                "listeners=PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}",
                n.kafka_port, n.controller_port
            ));
        }
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&n.log)
            .expect("node log");
        let err = out.try_clone().expect("node log");
        let child = Command::new(&self.exe)
            .args(&args)
            .env("WEIR_PARENT_PID", std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.exe.display()));
        n.child = Some(child);
    }

    /// SIGKILL node index `i` and reap it; returns the instant just before the signal.
    fn kill9(&mut self, i: usize) -> Instant {
        let mut child = self.nodes[i].child.take().expect("running");
        let at = Instant::now();
        child.kill().expect("kill -9");
        child.wait().expect("reap");
        at
    }

    fn running(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|i| self.nodes[*i].child.is_some())
            .collect()
    }

    /// Panics (with the end of its log) if a node that should run has exited.
    fn check_alive(&mut self) {
        for n in &mut self.nodes {
            if let Some(c) = n.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    panic!(
                        "node {} exited ({status}); end of its log:\n{}",
                        n.id,
                        tail(&n.log)
                    );
                }
            }
        }
    }

    /// CPU seconds (user+sys) and peak RSS (MiB) of node index `i`.
    fn usage(&self, i: usize) -> Option<(f64, u64)> {
        let pid = self.nodes[i].child.as_ref()?.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let after = stat.rsplit_once(") ")?.1;
        let f: Vec<&str> = after.split_whitespace().collect();
        let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let hwm_kb: u64 = status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        // CLK_TCK is 100 on Linux.
        Some((ticks / 100.0, hwm_kb / 1024))
    }

    /// Polls until every running node answers Metadata, lists `brokers` brokers (any
    /// number when `None`) and names the same controller, which runs and whose log names
    /// itself as quorum leader (a single node: itself). Returns that controller's id.
    fn wait_settled(&mut self, brokers: Option<usize>, bound: Duration) -> i32 {
        let start = Instant::now();
        loop {
            self.check_alive();
            let seen = match self.settled(brokers) {
                Ok(id) => return id,
                Err(e) => e,
            };
            assert!(
                start.elapsed() < bound,
                "not settled after {bound:?}: {seen}"
            );
            std::thread::sleep(POLL);
        }
    }

    fn settled(&self, brokers: Option<usize>) -> Result<i32> {
        let mut controllers = Vec::new();
        for i in self.running() {
            let m = metadata(self.nodes[i].kafka_port)?;
            if brokers.is_some_and(|b| m.brokers.len() != b) {
                return Err(format!(
                    "node {} lists {} brokers",
                    self.nodes[i].id,
                    m.brokers.len()
                ));
            }
            controllers.push(m.controller_id.0);
        }
        let c = controllers[0];
        if controllers.iter().any(|x| *x != c) {
            return Err(format!("controllers named: {controllers:?}"));
        }
        let Some(node) = self.nodes.iter().find(|n| n.id == c && n.child.is_some()) else {
            return Err(format!("controller {c} is not a running node"));
        };
        if self.nodes.len() > 1 && logged_leader(&node.log) != Some(c) {
            return Err(format!(
                "node {c}'s log names quorum leader {:?}",
                logged_leader(&node.log)
            ));
        }
        Ok(c)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// The quorum leader a node's log names last (`quorum_leader=ID`), if any.
fn logged_leader(log: &Path) -> Option<i32> {
    let text = std::fs::read_to_string(log).ok()?;
    let (at, key) = text.rmatch_indices("quorum_leader=").next()?;
    text[at + key.len()..]
        .split(|c: char| !(c.is_ascii_digit() || c == '-'))
        .next()?
        .parse()
        .ok()
        .filter(|id: &i32| *id >= 0)
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

// ------------------------------------------------------------------------ metadata

struct Created {
    via: i32,
    leader: i32,
    responded: Duration,
    visible: Duration,
    batches: Vec<Duration>,
    /// Per node: id, CPU seconds over the phase, peak RSS MiB.
    usage: Vec<(i32, f64, u64)>,
}

/// How many of `prefix`-named topics the Metadata lists complete (`partitions`
/// partitions, no error, a leader each).
fn complete_topics(m: &MetadataResponse, prefix: &str, partitions: usize) -> usize {
    m.topics
        .iter()
        .filter(|t| {
            t.error_code == 0
                && t.name
                    .as_ref()
                    .is_some_and(|n| n.0.as_str().starts_with(prefix))
                && t.partitions.len() == partitions
                && t.partitions
                    .iter()
                    .all(|p| p.error_code == 0 && p.leader_id.0 >= 0)
        })
        .count()
}

fn create_many(exe: &Path, dir: &Path, nodes: usize, a: &Args) -> Created {
    let mut cluster = Cluster::start(exe, dir, nodes);
    let leader = cluster.wait_settled(Some(nodes), START_BOUND);
    let via = if nodes == 1 {
        0
    } else {
        (0..nodes).find(|i| cluster.nodes[*i].id != leader).unwrap()
    };
    let before: Vec<f64> = (0..nodes)
        .map(|i| cluster.usage(i).map_or(0.0, |u| u.0))
        .collect();
    let prefix = "bench-meta-";
    let names: Vec<String> = (0..a.topics).map(|i| format!("{prefix}{i:05}")).collect();
    let timeout = Duration::from_secs(600);
    let mut conn = Conn::connect(cluster.nodes[via].kafka_port, timeout).expect("connect");
    let mut batches = Vec::new();
    let start = Instant::now();
    for chunk in names.chunks(a.batch) {
        let t = Instant::now();
        let req = create_request(
            chunk.iter().map(|n| creatable(n, a.partitions)).collect(),
            timeout,
        );
        let resp = conn
            .request(&req, CREATE_TOPICS_VERSION)
            .unwrap_or_else(|e| {
                cluster.check_alive();
                panic!("CreateTopics: {e}")
            });
        for r in &resp.topics {
            assert_eq!(
                r.error_code,
                0,
                "CreateTopics {}: error {} {:?}",
                r.name.0.as_str(),
                r.error_code,
                r.error_message
            );
        }
        batches.push(t.elapsed());
        assert!(start.elapsed() < RUN_BOUND, "creation takes too long");
    }
    let responded = start.elapsed();
    let visible = loop {
        cluster.check_alive();
        let mut missing = Vec::new();
        for n in &cluster.nodes {
            match metadata(n.kafka_port) {
                Ok(m) => {
                    let have = complete_topics(&m, prefix, a.partitions as usize);
                    if have != a.topics {
                        missing.push(format!("node {}: {have}/{}", n.id, a.topics));
                    }
                }
                Err(e) => missing.push(format!("node {}: {e}", n.id)),
            }
        }
        if missing.is_empty() {
            break start.elapsed();
        }
        let seen = missing.join(", ");
        assert!(
            start.elapsed() < responded + VISIBLE_BOUND,
            "not visible everywhere {VISIBLE_BOUND:?} after the last response: {seen}"
        );
        std::thread::sleep(POLL);
    };
    let usage = (0..nodes)
        .map(|i| {
            let (cpu, rss) = cluster.usage(i).unwrap_or((0.0, 0));
            (cluster.nodes[i].id, cpu - before[i], rss)
        })
        .collect();
    Created {
        via: cluster.nodes[via].id,
        leader,
        responded,
        visible,
        batches,
        usage,
    }
}

fn metadata_bench(exe: &Path, root: &Path, a: &Args) {
    println!(
        "== metadata: {} topics x {} partitions (rf -1), CreateTopics v{CREATE_TOPICS_VERSION} of {} topics each",
        a.topics, a.partitions, a.batch
    );
    let three = create_many(exe, &root.join("meta-3"), 3, a);
    let one = create_many(exe, &root.join("meta-1"), 1, a);
    let row = |what: &str, c: &Created| {
        println!(
            "| {what} | node {} (quorum leader {}) | {:.2} s | {:.2} s | {:.0} |",
            c.via,
            c.leader,
            c.responded.as_secs_f64(),
            c.visible.as_secs_f64(),
            a.topics as f64 / c.visible.as_secs_f64()
        );
    };
    println!();
    println!("| cluster | created through | last CreateTopics answered | visible on every node | topics/s |");
    println!("|---|---|---:|---:|---:|");
    row("3 nodes", &three);
    row("1 node", &one);
    println!();
    println!(
        "3-node / 1-node time until visible everywhere: {:.2} (= 1-node topics/s / 3-node topics/s)",
        three.visible.as_secs_f64() / one.visible.as_secs_f64()
    );
    for (what, c) in [("3 nodes", &three), ("1 node", &one)] {
        let ms: Vec<String> = c
            .batches
            .iter()
            .map(|d| format!("{:.0}", d.as_secs_f64() * 1000.0))
            .collect();
        println!(
            "{what}: each batch of {} topics, ms: {}",
            a.batch,
            ms.join(" ")
        );
        let u: Vec<String> = c
            .usage
            .iter()
            .map(|(id, cpu, rss)| format!("node {id} {cpu:.2} s CPU, peak RSS {rss} MiB"))
            .collect();
        println!("{what}: {}", u.join("; "));
    }
    println!();
}

// ------------------------------------------------------------------------ failover

struct Failover {
    killed: i32,
    via: i32,
    new_leader: i32,
    took: Duration,
    attempts: usize,
    errors: Vec<String>,
    rejoined: Duration,
}

fn failover_bench(exe: &Path, root: &Path, a: &Args) {
    println!(
        "== controller failover: kill -9 the quorum leader of 3 nodes, {} runs",
        a.runs
    );
    let mut cluster = Cluster::start(exe, &root.join("failover"), 3);
    cluster.wait_settled(Some(3), START_BOUND);
    // Warm-up: one topic through every node (connections between nodes established).
    for i in 0..3 {
        let mut c = Conn::connect(cluster.nodes[i].kafka_port, Duration::from_secs(30)).unwrap();
        let r = c
            .request(
                &create_request(
                    vec![creatable(&format!("warm-{i}"), 1)],
                    Duration::from_secs(30),
                ),
                CREATE_TOPICS_VERSION,
            )
            .expect("warm-up CreateTopics");
        assert_eq!(r.topics[0].error_code, 0, "{:?}", r.topics[0].error_message);
    }
    let mut runs = Vec::new();
    for run in 0..a.runs {
        let leader = cluster.wait_settled(Some(3), START_BOUND);
        let li = (leader - 1) as usize;
        let survivors: Vec<usize> = (0..3).filter(|i| *i != li).collect();
        let vi = survivors[run % 2];
        let via = cluster.nodes[vi].id;
        let topic = format!("failover-{run:02}");
        let req = create_request(vec![creatable(&topic, 1)], Duration::from_secs(30));
        let port = cluster.nodes[vi].kafka_port;
        let mut conn = Some(Conn::connect(port, Duration::from_secs(30)).expect("connect"));
        let mut attempts = 0;
        let mut errors = Vec::new();
        let killed_at = cluster.kill9(li);
        let took = loop {
            assert!(
                killed_at.elapsed() < FAILOVER_BOUND,
                "run {run}: no CreateTopics success {FAILOVER_BOUND:?} after the kill: {errors:?}"
            );
            if conn.is_none() {
                match Conn::connect(port, Duration::from_secs(30)) {
                    Ok(c) => conn = Some(c),
                    Err(e) => {
                        errors.push(e);
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                }
            }
            let c = conn.as_mut().expect("connected");
            attempts += 1;
            match c.request(&req, CREATE_TOPICS_VERSION) {
                Ok(r) if r.topics.len() == 1 && r.topics[0].error_code == 0 => {
                    break killed_at.elapsed()
                }
                // Committed by an earlier attempt whose answer was an error.
                Ok(r) if r.topics.len() == 1 && r.topics[0].error_code == 36 && attempts > 1 => {
                    errors.push("36 (created by an earlier attempt)".into());
                    break killed_at.elapsed();
                }
                Ok(r) => errors.push(format!(
                    "{} {:?} at {:?}",
                    r.topics.first().map_or(-1, |t| t.error_code),
                    r.topics.first().and_then(|t| t.error_message.clone()),
                    killed_at.elapsed()
                )),
                Err(e) => {
                    errors.push(format!("{e} at {:?}", killed_at.elapsed()));
                    conn = None;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let new_leader = cluster.wait_settled(None, START_BOUND);
        // Restart the killed node; wait until it names the same controller, every node
        // lists 3 brokers, and it has applied the topic created without it.
        let restarted = Instant::now();
        cluster.spawn(li);
        let start = Instant::now();
        loop {
            cluster.check_alive();
            let ok = cluster.settled(Some(3)).is_ok()
                && metadata(cluster.nodes[li].kafka_port)
                    .map(|m| complete_topics(&m, &topic, 1) == 1)
                    .unwrap_or(false);
            if ok {
                break;
            }
            assert!(
                start.elapsed() < START_BOUND,
                "run {run}: node {leader} did not rejoin in {START_BOUND:?}: {:?}\n{}",
                cluster.settled(Some(3)),
                tail(&cluster.nodes[li].log)
            );
            std::thread::sleep(POLL);
        }
        let f = Failover {
            killed: leader,
            via,
            new_leader,
            took,
            attempts,
            errors,
            rejoined: restarted.elapsed(),
        };
        println!(
            "run {:2}: killed {} -> leader {}; CreateTopics through {} ok {:7.1} ms after the kill ({} attempt(s){}); restarted node rejoined in {:.2} s",
            run + 1,
            f.killed,
            f.new_leader,
            f.via,
            f.took.as_secs_f64() * 1000.0,
            f.attempts,
            if f.errors.is_empty() {
                String::new()
            } else {
                format!(", before: {}", f.errors.join("; "))
            },
            f.rejoined.as_secs_f64()
        );
        runs.push(f);
    }
    let mut ms: Vec<f64> = runs.iter().map(|r| r.took.as_secs_f64() * 1000.0).collect();
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let rank = |p: f64| ms[((p * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
    let mut rejoin: Vec<f64> = runs.iter().map(|r| r.rejoined.as_secs_f64()).collect();
    rejoin.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!();
    println!("| runs | min | p50 | p99 | max | mean |");
    println!("|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms |",
        ms.len(),
        ms[0],
        rank(0.50),
        rank(0.99),
        ms[ms.len() - 1],
        ms.iter().sum::<f64>() / ms.len() as f64
    );
    println!(
        "(nearest rank: p99 is the {}th of {} sorted runs{})",
        ((0.99 * ms.len() as f64).ceil() as usize).max(1),
        ms.len(),
        if ms.len() < 100 { ", i.e. the max" } else { "" }
    );
    println!(
        "restarted node rejoined (every node agrees on the controller, 3 brokers, caught up): min {:.2} s, median {:.2} s, max {:.2} s",
        rejoin[0],
        rejoin[(rejoin.len() - 1) / 2],
        rejoin[rejoin.len() - 1]
    );
    println!();
}

// ------------------------------------------------------------------------ replication

const PRODUCE_VERSION: i16 = 8;

/// A topic's partitions as a node's Metadata lists them: (index, leader or -1, ISR).
fn partitions_of(m: &MetadataResponse, topic: &str) -> Option<Vec<(i32, i32, Vec<i32>)>> {
    let t = m
        .topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))?;
    if t.error_code != 0 {
        return None;
    }
    Some(
        t.partitions
            .iter()
            .map(|p| {
                let leader = if p.error_code == 0 { p.leader_id.0 } else { -1 };
                (
                    p.partition_index,
                    leader,
                    p.isr_nodes.iter().map(|b| b.0).collect(),
                )
            })
            .collect(),
    )
}

/// Creates `name` through the first running node: `partitions` partitions, replication
/// factor `rf`, and `min.insync.replicas` when given.
fn create_replicated(
    cluster: &Cluster,
    name: &str,
    partitions: i32,
    rf: i16,
    min_isr: Option<i32>,
) {
    let mut t = creatable(name, partitions).with_replication_factor(rf);
    if let Some(m) = min_isr {
        t = t.with_configs(vec![CreatableTopicConfig::default()
            .with_name(StrBytes::from_static_str("min.insync.replicas"))
            .with_value(Some(StrBytes::from_string(m.to_string())))]);
    }
    let i = cluster.running()[0];
    let mut c =
        Conn::connect(cluster.nodes[i].kafka_port, Duration::from_secs(60)).expect("connect");
    let r = c
        .request(
            &create_request(vec![t], Duration::from_secs(30)),
            CREATE_TOPICS_VERSION,
        )
        .expect("CreateTopics");
    assert_eq!(
        r.topics[0].error_code, 0,
        "CreateTopics {name}: {:?}",
        r.topics[0].error_message
    );
}

/// Polls until every running node lists `topic` with `partitions` partitions, each led and
/// with `isr` ISR members, all nodes agreeing; returns each partition's leader.
fn wait_isr(cluster: &mut Cluster, topic: &str, partitions: usize, isr: usize) -> Vec<i32> {
    let start = Instant::now();
    loop {
        cluster.check_alive();
        let mut seen: Vec<String> = Vec::new();
        let mut views = Vec::new();
        for i in cluster.running() {
            match metadata(cluster.nodes[i].kafka_port).map(|m| partitions_of(&m, topic)) {
                Ok(Some(p)) => views.push(p),
                Ok(None) => seen.push(format!("node {}: no {topic}", cluster.nodes[i].id)),
                Err(e) => seen.push(format!("node {}: {e}", cluster.nodes[i].id)),
            }
        }
        if seen.is_empty() {
            let first = &views[0];
            let complete = first.len() == partitions
                && first.iter().all(|(_, l, s)| *l >= 0 && s.len() == isr);
            if complete && views.iter().all(|v| v == first) {
                return first.iter().map(|(_, l, _)| *l).collect();
            }
            seen.push(format!("{views:?}"));
        }
        assert!(
            start.elapsed() < START_BOUND,
            "{topic}: not {partitions} partition(s) with {isr} in sync on every node after {START_BOUND:?}: {seen:?}"
        );
        std::thread::sleep(POLL);
    }
}

/// One batch of `records` records of `size` bytes (no key, no idempotence).
fn batch_of(records: usize, size: usize) -> Bytes {
    let value = Bytes::from(vec![b'x'; size]);
    let recs: Vec<Record> = (0..records)
        .map(|i| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: i as i32 - 1,
            timestamp: 1_700_000_000_000,
            key: None,
            value: Some(value.clone()),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        recs.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .expect("encode batch");
    buf.freeze()
}

fn produce_request(topic: &str, partition: i32, batch: &Bytes) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(batch.clone()))])])
}

/// An acks=all produce answered with error 0: when, and by which broker.
struct Ack {
    at: Instant,
    broker: i32,
}

/// The failover bench's producer: acks=all Produce v8 requests of one 100-byte record to
/// partition 0 of `topic`, one after the other, until `stop`. It asks the nodes in turn
/// for the leader (Metadata), connects to it, and after any error (an error code, a
/// broken or refused connection) asks again after 10 ms: the client's metadata refresh
/// costs one Metadata round trip, not librdkafka's backoffs. Every success goes to `acks`;
/// every change of what went wrong to `errors`, with when.
fn producer_loop(
    nodes: Vec<(i32, u16)>,
    topic: String,
    stop: Arc<AtomicBool>,
    acks: mpsc::Sender<Ack>,
    errors: Arc<Mutex<Vec<(Instant, String)>>>,
) {
    let batch = batch_of(1, 100);
    let req = produce_request(&topic, 0, &batch);
    let mut conn: Option<(i32, Conn)> = None;
    let mut ask = 0usize;
    let note = |e: String| {
        let mut errs = errors.lock().unwrap();
        if errs.last().is_none_or(|(_, last)| *last != e) {
            errs.push((Instant::now(), e));
        }
    };
    while !stop.load(Ordering::Relaxed) {
        if conn.is_none() {
            ask += 1;
            let (_, port) = nodes[ask % nodes.len()];
            let leader = match metadata(port).map(|m| partitions_of(&m, &topic)) {
                Ok(Some(p)) if !p.is_empty() && p[0].1 >= 0 => p[0].1,
                Ok(_) => {
                    note("no leader listed".into());
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Err(_) => continue, // that node is down: ask the next one at once
            };
            let Some(&(_, lport)) = nodes.iter().find(|(id, _)| *id == leader) else {
                note(format!("leader {leader} unknown"));
                continue;
            };
            match Conn::connect(lport, Duration::from_secs(35)) {
                Ok(c) => conn = Some((leader, c)),
                Err(e) => {
                    note(format!(
                        "leader {leader}: {}",
                        e.split(": ").last().unwrap_or(&e)
                    ));
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            }
        }
        let (leader, c) = conn.as_mut().expect("connected");
        match c.request(&req, PRODUCE_VERSION) {
            Ok(r) => {
                let code = r
                    .responses
                    .first()
                    .and_then(|t| t.partition_responses.first())
                    .map_or(-1, |p| p.error_code);
                if code == 0 {
                    let _ = acks.send(Ack {
                        at: Instant::now(),
                        broker: *leader,
                    });
                } else {
                    note(format!("broker {leader}: error {code}"));
                    conn = None;
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            Err(e) => {
                note(format!(
                    "broker {leader}: {}",
                    e.split(": ").last().unwrap_or(&e)
                ));
                conn = None;
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

struct PartitionFailover {
    killed: i32,
    was_controller: bool,
    new_leader: i32,
    took: Duration,
    errors: Vec<String>,
    rejoined: Duration,
}

/// Nearest-rank percentile of sorted `v` (p in 0..=1).
fn rank(v: &[f64], p: f64) -> f64 {
    v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1]
}

fn partition_failover_bench(exe: &Path, dir: &Path, a: &Args) -> Vec<PartitionFailover> {
    println!(
        "== partition failover ({}): kill -9 the leader of an RF 3 partition (min.insync.replicas 2) under acks=all load, {} runs",
        exe.display(),
        a.runs
    );
    let mut cluster = Cluster::start(exe, dir, 3);
    cluster.wait_settled(Some(3), START_BOUND);
    let topic = "failover-rf3";
    create_replicated(&cluster, topic, 1, 3, Some(2));
    wait_isr(&mut cluster, topic, 1, 3);
    let nodes: Vec<(i32, u16)> = cluster.nodes.iter().map(|n| (n.id, n.kafka_port)).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let (tx, acks) = mpsc::channel();
    let producer = {
        let (stop, errors) = (stop.clone(), errors.clone());
        let topic = topic.to_string();
        std::thread::spawn(move || producer_loop(nodes, topic, stop, tx, errors))
    };
    let mut runs = Vec::new();
    for run in 0..a.runs {
        let controller = cluster.wait_settled(Some(3), START_BOUND);
        let leader = wait_isr(&mut cluster, topic, 1, 3)[0];
        // The load reaches the current leader before the kill.
        let start = Instant::now();
        loop {
            match acks.recv_timeout(START_BOUND) {
                Ok(ack) if ack.broker == leader && ack.at > start => break,
                Ok(_) => {}
                Err(e) => panic!("run {run}: no acks=all success from leader {leader}: {e}"),
            }
            assert!(start.elapsed() < START_BOUND, "run {run}: producer stuck");
        }
        let li = (leader - 1) as usize;
        errors.lock().unwrap().clear();
        let killed_at = cluster.kill9(li);
        let ack = loop {
            let left = FAILOVER_BOUND.saturating_sub(killed_at.elapsed());
            match acks.recv_timeout(left) {
                Ok(ack) if ack.broker != leader && ack.at > killed_at => break ack,
                Ok(_) => {}
                Err(e) => panic!(
                    "run {run}: no acks=all success {FAILOVER_BOUND:?} after killing {leader}: {e}; {:?}",
                    errors.lock().unwrap()
                ),
            }
        };
        let took = ack.at - killed_at;
        let errs: Vec<String> = errors
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _)| *at < ack.at)
            .map(|(at, e)| {
                format!(
                    "{e} @{:.0}ms",
                    at.saturating_duration_since(killed_at).as_secs_f64() * 1000.0
                )
            })
            .collect();
        let restarted = Instant::now();
        cluster.spawn(li);
        cluster.wait_settled(Some(3), START_BOUND);
        wait_isr(&mut cluster, topic, 1, 3);
        let f = PartitionFailover {
            killed: leader,
            was_controller: leader == controller,
            new_leader: ack.broker,
            took,
            errors: errs,
            rejoined: restarted.elapsed(),
        };
        println!(
            "run {:2}: killed leader {}{} -> new leader {}; first acks=all success {:7.1} ms after the kill; restarted node back in the ISR in {:.2} s; meanwhile: {}",
            run + 1,
            f.killed,
            if f.was_controller { " (also the active controller)" } else { "" },
            f.new_leader,
            f.took.as_secs_f64() * 1000.0,
            f.rejoined.as_secs_f64(),
            f.errors.join("; ")
        );
        runs.push(f);
    }
    stop.store(true, Ordering::Relaxed);
    drop(acks);
    let _ = producer.join();
    print_failover_table(&runs);
    runs
}

fn print_failover_table(runs: &[PartitionFailover]) {
    let row = |what: &str, sel: &dyn Fn(&PartitionFailover) -> bool| {
        let mut ms: Vec<f64> = runs
            .iter()
            .filter(|r| sel(r))
            .map(|r| r.took.as_secs_f64() * 1000.0)
            .collect();
        if ms.is_empty() {
            println!("| {what} | 0 | - | - | - | - |");
            return;
        }
        ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "| {what} | {} | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms |",
            ms.len(),
            ms[0],
            rank(&ms, 0.50),
            rank(&ms, 0.99),
            ms[ms.len() - 1]
        );
    };
    println!();
    println!("| killed | runs | min | p50 | p99 | max |");
    println!("|---|---:|---:|---:|---:|---:|");
    row("any leader", &|_| true);
    row("leader, not the controller", &|r| !r.was_controller);
    row("leader and active controller", &|r| r.was_controller);
    println!("(nearest rank; with fewer than 100 runs p99 is the max)");
    println!();
}

/// The rdkafka_performance command: `RDKAFKA_PERF` (split on spaces), else
/// `rdkafka_performance` on the PATH.
fn perf_command() -> Vec<String> {
    std::env::var("RDKAFKA_PERF")
        .unwrap_or_else(|_| "rdkafka_performance".into())
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// Runs rdkafka_performance with `args`; returns (records/s from its summary, output).
/// Panics when it fails or did not deliver all `records` without failures.
fn perf(args: &[String], records: u64) -> (f64, String) {
    let cmd = perf_command();
    let out = Command::new(&cmd[0])
        .args(&cmd[1..])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?} (set RDKAFKA_PERF): {e}"));
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let summary = text
        .lines()
        .rfind(|l| l.contains("messages produced"))
        .unwrap_or_else(|| panic!("rdkafka_performance {args:?}: no summary:\n{text}"));
    let num_before = |key: &str| -> Option<f64> {
        let at = summary.find(key)?;
        summary[..at]
            .split_whitespace()
            .last()?
            .trim_start_matches('(')
            .parse()
            .ok()
    };
    let delivered = num_before(" delivered").unwrap_or(0.0);
    let failed = summary
        .split("offset ")
        .nth(1)
        .and_then(|s| s.split(", ").nth(1))
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(-1.0);
    assert!(
        delivered as u64 == records && failed == 0.0,
        "rdkafka_performance {args:?}: {summary}"
    );
    let rate = num_before(" msgs/s").unwrap_or(0.0);
    (rate, summary.to_string())
}

/// Sum of the running nodes' CPU seconds.
fn cluster_cpu(cluster: &Cluster) -> f64 {
    cluster
        .running()
        .iter()
        .map(|i| cluster.usage(*i).map_or(0.0, |u| u.0))
        .sum()
}

/// p50, p99 (nearest rank) and max of a file of one latency (µs) per line, in ms.
fn latency_file(path: &Path) -> (usize, f64, f64, f64) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut v: Vec<f64> = text
        .lines()
        .filter_map(|l| l.trim().parse::<f64>().ok())
        .map(|us| us / 1000.0)
        .collect();
    assert!(!v.is_empty(), "no latencies in {}", path.display());
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v.len(), rank(&v, 0.50), rank(&v, 0.99), v[v.len() - 1])
}

fn replication_bench(exe: &Path, dir: &Path, a: &Args) {
    let p = a.produce_partitions;
    println!(
        "== replication throughput and latency: {} records of 100 B, acks=all, {p} partitions, RF 3 (min.insync.replicas 2) vs RF 1, {} round(s)",
        a.records, a.rounds
    );
    let mut cluster = Cluster::start(exe, dir, 3);
    cluster.wait_settled(Some(3), START_BOUND);
    create_replicated(&cluster, "tp-rf1", p, 1, None);
    create_replicated(&cluster, "tp-rf3", p, 3, Some(2));
    wait_isr(&mut cluster, "tp-rf1", p as usize, 1);
    let leaders = wait_isr(&mut cluster, "tp-rf3", p as usize, 3);
    println!("RF 3 partition leaders: {leaders:?}");
    let bootstrap = cluster
        .nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.kafka_port))
        .collect::<Vec<_>>()
        .join(",");
    let common = |topic: &str, count: u64| -> Vec<String> {
        [
            "-P",
            "-t",
            topic,
            "-b",
            bootstrap.as_str(),
            "-s",
            "100",
            "-a",
            "-1",
            "-X",
            "linger.ms=5",
            "-X",
            "batch.size=1000000",
            "-X",
            "compression.codec=none",
            "-X",
            "sticky.partitioning.linger.ms=0",
            "-q",
            "-c",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([count.to_string()])
        .collect()
    };
    // Warm-up: connections and metadata, both topics.
    for t in ["tp-rf1", "tp-rf3"] {
        perf(&common(t, 20_000), 20_000);
    }
    let mut rates: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut cpus: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    println!();
    println!("| round | topic | records/s | broker CPU (3 nodes) | µs CPU per record |");
    println!("|---:|---|---:|---:|---:|");
    for round in 0..a.rounds {
        for (k, t) in ["tp-rf1", "tp-rf3"].iter().enumerate() {
            let c0 = cluster_cpu(&cluster);
            let (rate, _) = perf(&common(t, a.records), a.records);
            let cpu = cluster_cpu(&cluster) - c0;
            cluster.check_alive();
            let us = cpu * 1e6 / a.records as f64;
            println!(
                "| {} | {} | {rate:.0} | {cpu:.2} s | {us:.2} |",
                round + 1,
                if k == 0 { "RF 1" } else { "RF 3" }
            );
            rates[k].push(rate);
            cpus[k].push(us);
        }
    }
    let best = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!();
    println!(
        "RF 3 / RF 1 records/s: {:.2} (means {:.0} / {:.0}; best {:.0} / {:.0}: {:.2}); per round: {}",
        mean(&rates[1]) / mean(&rates[0]),
        mean(&rates[1]),
        mean(&rates[0]),
        best(&rates[1]),
        best(&rates[0]),
        best(&rates[1]) / best(&rates[0]),
        rates[0]
            .iter()
            .zip(&rates[1])
            .map(|(r1, r3)| format!("{:.2}", r3 / r1))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "broker CPU per record (sum of 3 nodes): RF 3 {:.2} µs, RF 1 {:.2} µs, ratio {:.2}",
        mean(&cpus[1]),
        mean(&cpus[0]),
        mean(&cpus[1]) / mean(&cpus[0])
    );
    // Latency at half the best RF 3 rate, RF 3 then RF 1 at the same rate.
    let rate = (best(&rates[1]) / 2.0).max(100.0) as u64;
    let count = rate * a.latency_secs;
    println!();
    println!(
        "latency: {count} records at {rate} records/s (half the best RF 3 rate), produce() to delivery report (rdkafka_performance -l)"
    );
    println!("| topic | records | p50 | p99 | max | broker CPU per record |");
    println!("|---|---:|---:|---:|---:|---:|");
    for t in ["tp-rf3", "tp-rf1"] {
        let file = dir.join(format!("lat-{t}.txt"));
        let mut args = common(t, count);
        args.extend([
            "-r".to_string(),
            rate.to_string(),
            "-l".to_string(),
            "-A".to_string(),
            file.display().to_string(),
        ]);
        let c0 = cluster_cpu(&cluster);
        perf(&args, count);
        let cpu = cluster_cpu(&cluster) - c0;
        let (n, p50, p99, max) = latency_file(&file);
        println!(
            "| {} | {n} | {p50:.2} ms | {p99:.2} ms | {max:.2} ms | {:.2} µs |",
            if t == "tp-rf3" { "RF 3" } else { "RF 1" },
            cpu * 1e6 / count as f64
        );
    }
    println!();
}

// ------------------------------------------------------------------------ main

struct Args {
    only: Vec<String>,
    topics: usize,
    partitions: i32,
    batch: usize,
    runs: usize,
    records: u64,
    rounds: usize,
    produce_partitions: i32,
    latency_secs: u64,
}

impl Args {
    fn runs_mode(&self, mode: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|m| m == mode)
    }
}

const MODES: [&str; 4] = ["metadata", "failover", "partition-failover", "replication"];

fn parse_args() -> Args {
    let mut a = Args {
        only: Vec::new(),
        topics: 1000,
        partitions: 3,
        batch: 100,
        runs: 20,
        records: 1_000_000,
        rounds: 2,
        produce_partitions: 6,
        latency_secs: 10,
    };
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mut it = args.iter();
    while let Some(k) = it.next() {
        let v = it
            .next()
            .unwrap_or_else(|| panic!("{k} needs a value"))
            .clone();
        let num = |v: &str| -> usize {
            v.replace('_', "")
                .parse()
                .unwrap_or_else(|e| panic!("{k} {v}: {e}"))
        };
        match k.as_str() {
            "--only" => {
                for m in v.split(',') {
                    assert!(MODES.contains(&m), "--only {}[,...]", MODES.join("|"));
                    a.only.push(m.to_string());
                }
            }
            "--topics" => a.topics = num(&v),
            "--partitions" => a.partitions = num(&v) as i32,
            "--batch" => a.batch = num(&v).max(1),
            "--runs" => a.runs = num(&v).max(1),
            "--records" => a.records = num(&v).max(1000) as u64,
            "--rounds" => a.rounds = num(&v).max(1),
            "--produce-partitions" => a.produce_partitions = num(&v).max(1) as i32,
            "--latency-secs" => a.latency_secs = num(&v).max(1) as u64,
            _ => panic!("unknown argument {k}"),
        }
    }
    a
}

fn main() {
    let a = parse_args();
    let exe = std::env::var_os("WEIR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_weir")));
    assert!(exe.is_file(), "no broker binary {}", exe.display());
    let base = std::env::var_os("WEIR_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp"));
    std::fs::create_dir_all(&base).expect("bench dir");
    let root = base.join(format!(
        "weir-cluster-bench.{}.{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    ));
    let _remove = RunDir(root.clone());
    for d in [
        "meta-3",
        "meta-1",
        "failover",
        "partition-failover-base",
        "partition-failover",
        "replication",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    println!("broker: {}; run dir {}", exe.display(), root.display());
    // A bound on the whole run, even if a wait above is wrong: exit, which kills the
    // nodes through WEIR_PARENT_PID (their parent-death signal).
    std::thread::spawn(|| {
        std::thread::sleep(RUN_BOUND);
        eprintln!("cluster bench: still running after {RUN_BOUND:?}; giving up");
        std::process::exit(2);
    });
    let started = Instant::now();
    if a.runs_mode("metadata") {
        metadata_bench(&exe, &root, &a);
    }
    if a.runs_mode("failover") {
        failover_bench(&exe, &root, &a);
    }
    if a.runs_mode("replication") {
        replication_bench(&exe, &root.join("replication"), &a);
    }
    if a.runs_mode("partition-failover") {
        // A/B: the baseline broker first, when given, on a cluster of its own.
        let base = std::env::var_os("WEIR_BIN_BASE").map(PathBuf::from);
        let before = base.as_ref().map(|b| {
            assert!(b.is_file(), "no baseline broker binary {}", b.display());
            partition_failover_bench(b, &root.join("partition-failover-base"), &a)
        });
        let after = partition_failover_bench(&exe, &root.join("partition-failover"), &a);
        if let Some(before) = before {
            let p50 = |r: &[PartitionFailover]| {
                let mut ms: Vec<f64> = r.iter().map(|f| f.took.as_secs_f64()).collect();
                ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
                (rank(&ms, 0.5), rank(&ms, 0.99))
            };
            let (b50, b99) = p50(&before);
            let (a50, a99) = p50(&after);
            println!(
                "partition failover, candidate / baseline: p50 {a50:.2} s / {b50:.2} s = {:.2}; p99 {a99:.2} s / {b99:.2} s = {:.2}",
                a50 / b50,
                a99 / b99
            );
        }
    }
    println!("total {:.1} s", started.elapsed().as_secs_f64());
}

/// Removes the run's directory when dropped (the nodes are gone by then), unless `KEEP`
/// is set.
struct RunDir(PathBuf);

impl Drop for RunDir {
    fn drop(&mut self) {
        if std::env::var_os("KEEP").is_some() {
            println!("kept {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
