//! Cluster benchmark (issue 12): metadata at scale and controller failover, against real
//! `weir` processes on 127.0.0.1.
//!
//! ```text
//! cargo bench --bench cluster -- [--only metadata|failover] [--topics N] [--partitions N]
//!                                [--batch N] [--runs N]
//! benches/cluster.sh [same arguments]    (builds, then runs this with the release weir)
//! ```
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
//! Raft timing is weir's built-in one (`src/cluster/raft/mod.rs`: heartbeat 100 ms,
//! election timeout 500–1000 ms); weir has no config key for it. Every node runs with
//! its default settings otherwise.
//!
//! Environment: `WEIR_BIN` (the broker binary; default the `weir` cargo built with this
//! bench), `WEIR_BENCH_DIR` (where the run's temp dir goes, default /var/tmp), `KEEP=1`
//! (keep it: node logs `node-N.log`). Every node gets `WEIR_PARENT_PID` (it dies with
//! this program even on kill -9) and is killed when this program ends or panics. Every
//! wait is bounded; the whole run fails after [`RUN_BOUND`].

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, MetadataRequest, MetadataResponse, RequestHeader, ResponseHeader,
    TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};

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

// ------------------------------------------------------------------------ main

struct Args {
    only: Option<String>,
    topics: usize,
    partitions: i32,
    batch: usize,
    runs: usize,
}

fn parse_args() -> Args {
    let mut a = Args {
        only: None,
        topics: 1000,
        partitions: 3,
        batch: 100,
        runs: 20,
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
                assert!(
                    v == "metadata" || v == "failover",
                    "--only metadata|failover"
                );
                a.only = Some(v);
            }
            "--topics" => a.topics = num(&v),
            "--partitions" => a.partitions = num(&v) as i32,
            "--batch" => a.batch = num(&v).max(1),
            "--runs" => a.runs = num(&v).max(1),
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
    for d in ["meta-3", "meta-1", "failover"] {
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
    if a.only.as_deref() != Some("failover") {
        metadata_bench(&exe, &root, &a);
    }
    if a.only.as_deref() != Some("metadata") {
        failover_bench(&exe, &root, &a);
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
