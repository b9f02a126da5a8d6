//! Issue 13, test 2: a bounded Jepsen-style fault loop. Three `weir` processes with short
//! session and lag timeouts, a topic of 3 partitions at replication factor 3 with
//! `min.insync.replicas=2`; a confluent-kafka producer (acks=all, idempotent,
//! `tests/compat/fault_producer.py`) writes sequence-numbered records to every partition
//! while a seeded schedule kills (`kill -9`, then restart over its data), pauses
//! (SIGSTOP for longer than `replica.lag.time.max.ms`, then SIGCONT) or cuts off the
//! network (for as long; its process runs on) one broker at a time. Then every partition
//! is read from the beginning: each acknowledged record is there exactly once, at the
//! offset it was acknowledged at, in sequence order, and nothing is there that was never
//! sent.
//!
//! The seed is printed; `WEIR_FAULT_SEED=N` replays a schedule (the timing of the
//! brokers and the client is not replayed: a seed fixes which broker gets which fault
//! and for how long). A failed run keeps every broker's log (each incarnation) and the
//! producer's in a directory it names; `WEIR_FAULT_LOGS=DIR` keeps them there for any
//! run.
//!
//! Network cuts need each broker in a network namespace of its own (`netns::TestNet`:
//! root and iproute2's `ip`, which tests/install-deps.sh installs; CI runs as root).
//! Where namespaces cannot be made, the test says why and runs the schedule of kills and
//! pauses alone (a seed then gives the schedule it gave before cuts existed).
//!
//! Bounded: [`FAULTS`] faults, the producer sends for [`PRODUCE_S`] and flushes within
//! 45 s, every wait has a deadline. Every process is stopped at the end: a paused broker
//! gets SIGCONT ([`Paused`]'s drop) before `ThreeNodes`' drop kills it, the producer is
//! killed on drop ([`Script`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::cluster::raw_listed_brokers;
use crate::cluster_fixture::ThreeNodes;
use crate::harness::{poll_for, repo_root};
use crate::netns::TestNet;
use crate::replication::{create_rf3, describe};

const TOPIC: &str = "faults";
const PARTITIONS: i32 = 3;
/// Faults injected, one broker at a time.
const FAULTS: usize = 10;
/// How long the producer sends (the faults run meanwhile).
const PRODUCE_S: u64 = 55;
/// The seed when `WEIR_FAULT_SEED` is not set.
const DEFAULT_SEED: u64 = 13_002;
/// `replica.lag.time.max.ms` of the cluster: a pause lasts longer.
const LAG_TIME_MAX_MS: u64 = 3000;

/// splitmix64: a seeded generator small enough to carry here (no `rand` dependency).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// One fault of the schedule.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// kill -9, wait `down_ms`, start again over the same data.
    Kill { node: i32, down_ms: u64 },
    /// SIGSTOP, wait `paused_ms` (longer than `replica.lag.time.max.ms`), SIGCONT.
    Pause { node: i32, paused_ms: u64 },
    /// Cut off the network (`TestNet::cut`) for `cut_ms` (as long as a pause), then heal;
    /// the test checks that another node fenced it meanwhile.
    Cut { node: i32, cut_ms: u64 },
}

/// The schedule `seed` gives: [`FAULTS`] faults, each followed by a quiet gap (ms); with
/// `cuts`, a third of the faults (on average) are network cuts.
fn schedule(seed: u64, cuts: bool) -> Vec<(Fault, u64)> {
    let mut rng = Rng(seed);
    (0..FAULTS)
        .map(|_| {
            let node = rng.between(1, 3) as i32;
            let kind = rng.next() % if cuts { 3 } else { 2 };
            let fault = match kind {
                0 => Fault::Kill {
                    node,
                    down_ms: rng.between(500, 3000),
                },
                1 => Fault::Pause {
                    node,
                    paused_ms: rng.between(LAG_TIME_MAX_MS + 500, LAG_TIME_MAX_MS + 2500),
                },
                _ => Fault::Cut {
                    node,
                    cut_ms: rng.between(LAG_TIME_MAX_MS + 500, LAG_TIME_MAX_MS + 2500),
                },
            };
            (fault, rng.between(300, 1500))
        })
        .collect()
}

/// Sends `signal` (`STOP`, `CONT`) to `pid`.
fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// A paused broker: SIGCONT on drop, so a failing test never leaves a stopped process.
struct Paused(u32);

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-CONT")
            .arg(self.0.to_string())
            .status();
    }
}

/// The producer script, killed on drop.
pub(crate) struct Script(pub(crate) Child);

impl Script {
    /// Polls (at most 30 s) until the producer's outcome file `out` records at least `n`
    /// acknowledgements; fails the test if the producer exits first.
    pub(crate) fn wait_for_acks(&mut self, out: &Path, n: usize) {
        poll_for(
            &format!("the producer's first {n} acknowledgements"),
            30,
            || {
                let text = std::fs::read_to_string(out).unwrap_or_default();
                if ProducerLog::parse(&text).acked_count() >= n {
                    Ok(())
                } else if let Ok(Some(status)) = self.0.try_wait() {
                    panic!("the producer exited early ({status}): {text}")
                } else {
                    Err(String::new())
                }
            },
        );
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the producer wrote to its outcome file.
#[derive(Debug, Default)]
pub(crate) struct ProducerLog {
    /// partition → sequence → offset acknowledged.
    pub(crate) acked: BTreeMap<i32, BTreeMap<u64, i64>>,
    /// partition → sequences whose delivery failed.
    pub(crate) failed: BTreeMap<i32, BTreeSet<u64>>,
    /// partition → how many sequences were sent (0..sent).
    pub(crate) sent: BTreeMap<i32, u64>,
    /// Records neither acknowledged nor failed when the flush ended.
    pub(crate) unanswered: u64,
    /// The client's error callbacks (`E fatal|error text`).
    pub(crate) errors: Vec<String>,
    /// The file ended with `DONE`.
    pub(crate) done: bool,
    /// The first failure reasons seen, distinct.
    pub(crate) failure_reasons: BTreeSet<String>,
}

impl ProducerLog {
    pub(crate) fn parse(text: &str) -> ProducerLog {
        let mut log = ProducerLog::default();
        for line in text.lines() {
            let f: Vec<&str> = line.splitn(4, ' ').collect();
            match f.as_slice() {
                ["A", p, offset, seq] => {
                    log.acked
                        .entry(p.parse().unwrap())
                        .or_default()
                        .insert(seq.parse().unwrap(), offset.parse().unwrap());
                }
                ["F", p, seq, reason @ ..] => {
                    log.failed
                        .entry(p.parse().unwrap())
                        .or_default()
                        .insert(seq.parse().unwrap());
                    if log.failure_reasons.len() < 5 {
                        log.failure_reasons.insert(reason.join(" "));
                    }
                }
                ["E", ..] => log.errors.push(line.to_string()),
                ["SENT", p, n] => {
                    log.sent.insert(p.parse().unwrap(), n.parse().unwrap());
                }
                ["UNANSWERED", n] => log.unanswered = n.parse().unwrap(),
                ["DONE"] => log.done = true,
                _ => panic!("unexpected producer line {line:?}"),
            }
        }
        log
    }

    pub(crate) fn acked_count(&self) -> usize {
        self.acked.values().map(BTreeMap::len).sum()
    }
}

/// Every record of `topic` (`partitions` partitions) below each partition's high
/// watermark, read from the beginning by a librdkafka consumer (assigned, no commits):
/// partition → (offset, value) in offset order. At most 60 s.
pub(crate) fn read_all(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
) -> BTreeMap<i32, Vec<(i64, String)>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "replication-faults-no-commits")
        .set("enable.auto.commit", "false")
        // librdkafka 2.x caches a partition listed once with leader -1 (a moment of a
        // leader change) as a permanent error of `fetch_watermarks` until its next
        // metadata refresh (5 min by default): refresh each second instead.
        .set("topic.metadata.refresh.interval.ms", "1000")
        .create()
        .expect("consumer");
    let high: BTreeMap<i32, i64> = (0..partitions)
        .map(|p| {
            let (_, hw) = poll_for(&format!("partition {p}'s watermarks"), 30, || {
                consumer
                    .fetch_watermarks(topic, p, Duration::from_secs(5))
                    .map_err(|e| e.to_string())
            });
            (p, hw)
        })
        .collect();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).expect("assign");
    let mut out: BTreeMap<i32, Vec<(i64, String)>> = BTreeMap::new();
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while high
        .iter()
        .any(|(p, hw)| next.get(p).copied().unwrap_or(0) < *hw)
    {
        assert!(
            Instant::now() < deadline,
            "read {next:?} of high watermarks {high:?} in 60 s"
        );
        let Some(msg) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let msg = msg.expect("consume");
        let value = String::from_utf8_lossy(msg.payload().unwrap_or_default()).to_string();
        out.entry(msg.partition())
            .or_default()
            .push((msg.offset(), value));
        next.insert(msg.partition(), msg.offset() + 1);
    }
    eprintln!("read up to the high watermarks {high:?}");
    out
}

/// The checks' tallies over all partitions.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub(crate) acknowledged: usize,
    pub(crate) read: usize,
    pub(crate) lost: Vec<(i32, u64)>,
    pub(crate) duplicated: Vec<(i32, u64)>,
    pub(crate) out_of_order: Vec<(i32, i64, u64)>,
    pub(crate) never_sent: Vec<(i32, i64, String)>,
    /// Acknowledged at one offset, read at another.
    pub(crate) moved: Vec<(i32, u64, i64, i64)>,
    /// Read, sent, not acknowledged (its ack was lost or it failed after the append).
    pub(crate) unacknowledged_present: usize,
}

impl Verdict {
    /// Whether nothing acknowledged was lost, duplicated, read out of order or at another
    /// offset, and nothing never sent was read.
    pub(crate) fn clean(&self) -> bool {
        self.lost.is_empty()
            && self.duplicated.is_empty()
            && self.out_of_order.is_empty()
            && self.never_sent.is_empty()
            && self.moved.is_empty()
    }

    /// Fails the test unless [`Verdict::clean`], naming what went wrong.
    pub(crate) fn assert_clean(&self) {
        assert!(
            self.lost.is_empty(),
            "lost (partition, sequence): {:?}",
            self.lost
        );
        assert!(
            self.duplicated.is_empty(),
            "duplicated (partition, sequence): {:?}",
            self.duplicated
        );
        assert!(
            self.out_of_order.is_empty(),
            "out of order (partition, offset, sequence): {:?}",
            self.out_of_order
        );
        assert!(
            self.never_sent.is_empty(),
            "never sent: {:?}",
            self.never_sent
        );
        assert!(
            self.moved.is_empty(),
            "read at another offset than acknowledged (partition, sequence, acked, read): {:?}",
            self.moved
        );
    }
}

/// `p<partition>-s<sequence>` → (partition, sequence).
fn parse_value(value: &str) -> Option<(i32, u64)> {
    let (p, s) = value.strip_prefix('p')?.split_once("-s")?;
    Some((p.parse().ok()?, s.parse().ok()?))
}

/// Compares what `produced` says with what was `read` from its `partitions` partitions.
pub(crate) fn check(
    produced: &ProducerLog,
    read: &BTreeMap<i32, Vec<(i64, String)>>,
    partitions: i32,
) -> Verdict {
    let mut v = Verdict {
        acknowledged: produced.acked_count(),
        ..Verdict::default()
    };
    let empty = BTreeMap::new();
    for p in 0..partitions {
        let acked = produced.acked.get(&p).unwrap_or(&empty);
        let sent = produced.sent.get(&p).copied().unwrap_or(0);
        let mut seen: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
        let mut last: Option<u64> = None;
        for (offset, value) in read.get(&p).map(Vec::as_slice).unwrap_or_default() {
            v.read += 1;
            let seq = match parse_value(value) {
                Some((vp, seq)) if vp == p && seq < sent => seq,
                _ => {
                    v.never_sent.push((p, *offset, value.clone()));
                    continue;
                }
            };
            if last.is_some_and(|l| seq < l) {
                v.out_of_order.push((p, *offset, seq));
            }
            last = Some(last.map_or(seq, |l| l.max(seq)));
            seen.entry(seq).or_default().push(*offset);
        }
        for (seq, offsets) in &seen {
            if offsets.len() > 1 {
                v.duplicated.push((p, *seq));
            }
            match acked.get(seq) {
                None => v.unacknowledged_present += 1,
                Some(at) if !offsets.contains(at) => v.moved.push((p, *seq, *at, offsets[0])),
                Some(_) => {}
            }
        }
        for seq in acked.keys() {
            if !seen.contains_key(seq) {
                v.lost.push((p, *seq));
            }
        }
    }
    v
}

/// Writes every broker's stderr (each incarnation) and the producer's files under
/// `$WEIR_FAULT_LOGS` when set, else a new directory in the temp dir; returns it.
fn keep_logs(seed: u64, logs: &[(String, String)]) -> PathBuf {
    let dir = std::env::var_os("WEIR_FAULT_LOGS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::temp_dir().join(format!("weir-faults-{seed}-{}", std::process::id()))
        });
    std::fs::create_dir_all(&dir).expect("log dir");
    for (name, text) in logs {
        std::fs::write(dir.join(name), text).expect("write log");
    }
    dir
}

/// Waits until every running node lists brokers 1, 2 and 3 (the faulted one is back and
/// unfenced).
fn wait_all_listed(nodes: &ThreeNodes) {
    let ids: Vec<i32> = nodes.running().map(|(id, _)| id).collect();
    for id in ids {
        nodes.wait_for_brokers(id, &[1, 2, 3], 30);
    }
}

/// Runs `wait`; when it fails, prints the last 40 lines of every running node's stderr
/// before the failure goes on, so a failed CI run shows what the brokers saw.
fn or_dump<T>(nodes: &ThreeNodes, wait: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(wait)) {
        Ok(value) => value,
        Err(panic) => {
            for (id, n) in nodes.running() {
                let text = n.stderr_text();
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(40)..];
                eprintln!(
                    "--- node {id}, its last {} lines:\n{}",
                    tail.len(),
                    tail.join("\n")
                );
            }
            std::panic::resume_unwind(panic)
        }
    }
}

/// Starts the producer sending to `topic` (`partitions` partitions) for `seconds`, or
/// until the file `stop` exists, writing its outcome to `out`, its stdout and stderr
/// (librdkafka's log lines, many while brokers are down: a file, not a pipe nobody reads)
/// next to it.
pub(crate) fn spawn_producer(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    seconds: u64,
    out: &Path,
    stop: Option<&Path>,
) -> Script {
    let stdout = std::fs::File::create(out.with_extension("stdout")).unwrap();
    let stderr = std::fs::File::create(out.with_extension("stderr")).unwrap();
    let mut cmd = Command::new("python3");
    if let Some(stop) = stop {
        cmd.env("FAULT_PRODUCER_STOP_FILE", stop);
    }
    let child = cmd
        .arg("tests/compat/fault_producer.py")
        .arg(bootstrap)
        .arg(topic)
        .arg(partitions.to_string())
        .arg(seconds.to_string())
        .arg(out)
        .current_dir(repo_root())
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr))
        .spawn()
        .unwrap_or_else(|e| panic!("python3: {e} (tests/install-deps.sh installs it)"));
    Script(child)
}

/// Issue 13, test 2: see the module doc.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_records_survive_a_seeded_schedule_of_kills_pauses_and_cuts() {
    let started = Instant::now();
    let seed = std::env::var("WEIR_FAULT_SEED")
        .ok()
        .map(|s| s.parse::<u64>().expect("WEIR_FAULT_SEED is a u64"))
        .unwrap_or(DEFAULT_SEED);
    let net = TestNet::create(3);
    if let Err(why) = &net {
        eprintln!("replication_faults: no network cuts, namespaces cannot be made here: {why}");
    }
    let plan = schedule(seed, net.is_ok());
    eprintln!("replication_faults: seed {seed} (WEIR_FAULT_SEED={seed} replays the schedule)");
    eprintln!("schedule: {plan:?}");

    let lag = format!("replica.lag.time.max.ms={LAG_TIME_MAX_MS}");
    let overrides = [
        "broker.session.timeout.ms=1500",
        "broker.heartbeat.interval.ms=300",
        &lag,
    ];
    let mut nodes = match net {
        Ok(net) => ThreeNodes::start_on(net, 3, &overrides),
        Err(_) => ThreeNodes::start(&overrides),
    };
    create_rf3(
        &nodes.bootstrap(1),
        TOPIC,
        PARTITIONS,
        &[("min.insync.replicas", "2")],
    )
    .await;
    poll_for("every partition has 3 in-sync replicas", 30, || {
        let d = describe(&nodes.bootstrap(1), TOPIC)?;
        if d.len() == PARTITIONS as usize && d.iter().all(|p| p.isr.len() == 3 && p.leader > 0) {
            Ok(())
        } else {
            Err(format!("{d:?}"))
        }
    });

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

    // Every incarnation's stderr, for a failed run.
    let mut logs: Vec<(String, String)> = Vec::new();
    let mut incarnation = [1u32; 3];
    let faults_at = Instant::now();
    for (i, (fault, gap_ms)) in plan.iter().enumerate() {
        let t = faults_at.elapsed().as_secs_f64();
        match *fault {
            Fault::Kill { node, down_ms } => {
                eprintln!("[{t:6.1} s] fault {i}: kill -9 node {node}, down {down_ms} ms");
                let text = nodes.kill9(node);
                let k = &mut incarnation[(node - 1) as usize];
                logs.push((format!("node-{node}.{k}.log"), text));
                *k += 1;
                // The fault itself: the node stays down this long.
                std::thread::sleep(Duration::from_millis(down_ms));
                nodes.restart(node);
            }
            Fault::Pause { node, paused_ms } => {
                eprintln!("[{t:6.1} s] fault {i}: SIGSTOP node {node} for {paused_ms} ms");
                let pid = nodes.node(node).pid();
                signal(pid, "STOP");
                let paused = Paused(pid);
                // The fault itself: the node stays paused this long.
                std::thread::sleep(Duration::from_millis(paused_ms));
                drop(paused);
            }
            Fault::Cut { node, cut_ms } => {
                eprintln!("[{t:6.1} s] fault {i}: cut node {node} off for {cut_ms} ms");
                let cut_at = Instant::now();
                nodes.cut(node);
                // The cut is real: the others fence the node they no longer hear from.
                let other = if node == 1 { 2 } else { 1 };
                let b = nodes.bootstrap(other);
                or_dump(&nodes, || {
                    poll_for(&format!("node {other} to fence node {node}"), 20, || {
                        let ids: Vec<i32> =
                            raw_listed_brokers(&b)?.into_iter().map(|b| b.0).collect();
                        if ids.contains(&node) {
                            Err(format!("it lists {ids:?}"))
                        } else {
                            Ok(())
                        }
                    })
                });
                // The fault itself: the node runs on, unreachable, this long.
                std::thread::sleep(Duration::from_millis(cut_ms).saturating_sub(cut_at.elapsed()));
                nodes.heal(node);
            }
        }
        or_dump(&nodes, || wait_all_listed(&nodes));
        eprintln!(
            "[{:6.1} s] fault {i}: all three brokers listed again",
            faults_at.elapsed().as_secs_f64()
        );
        // A quiet gap before the next fault (part of the schedule).
        std::thread::sleep(Duration::from_millis(*gap_ms));
    }
    let faults_s = faults_at.elapsed().as_secs_f64();
    eprintln!("{FAULTS} faults in {faults_s:.1} s");

    let status = poll_for("the producer to finish", PRODUCE_S + 90, || {
        producer
            .0
            .try_wait()
            .map_err(|e| e.to_string())?
            .ok_or_else(String::new)
    });
    let summary = std::fs::read_to_string(out.with_extension("stdout")).unwrap_or_default();
    let stderr = std::fs::read_to_string(out.with_extension("stderr")).unwrap_or_default();
    eprintln!("producer ({status}): {}", summary.trim());
    let produced = ProducerLog::parse(&std::fs::read_to_string(&out).unwrap());

    // Settle: every replica back in the ISR, so each leader's high watermark is its log end.
    poll_for("every partition has 3 in-sync replicas again", 60, || {
        let d = describe(&nodes.bootstrap_all(), TOPIC)?;
        if d.len() == PARTITIONS as usize && d.iter().all(|p| p.isr.len() == 3 && p.leader > 0) {
            Ok(())
        } else {
            Err(format!("{d:?}"))
        }
    });
    let read = read_all(&nodes.bootstrap_all(), TOPIC, PARTITIONS);
    let v = check(&produced, &read, PARTITIONS);
    let failed: usize = produced.failed.values().map(BTreeSet::len).sum();
    let sent: u64 = produced.sent.values().sum();
    eprintln!(
        "replication_faults: seed {seed}, runs 1, faults {FAULTS} (kill -9 {}, SIGSTOP {}, \
         cut {}), \
         sent {sent}, acknowledged {}, failed {failed}, unanswered {}, read {}, lost {}, \
         duplicated {}, out of order {}, never sent {}, at another offset {}, \
         unacknowledged but present {}; faults took {faults_s:.1} s, the test {:.1} s",
        plan.iter()
            .filter(|(f, _)| matches!(f, Fault::Kill { .. }))
            .count(),
        plan.iter()
            .filter(|(f, _)| matches!(f, Fault::Pause { .. }))
            .count(),
        plan.iter()
            .filter(|(f, _)| matches!(f, Fault::Cut { .. }))
            .count(),
        v.acknowledged,
        produced.unanswered,
        v.read,
        v.lost.len(),
        v.duplicated.len(),
        v.out_of_order.len(),
        v.never_sent.len(),
        v.moved.len(),
        v.unacknowledged_present,
        started.elapsed().as_secs_f64(),
    );
    if !produced.failure_reasons.is_empty() {
        eprintln!("delivery failures: {:?}", produced.failure_reasons);
    }
    if !produced.errors.is_empty() {
        eprintln!(
            "client errors ({}), first: {:?}",
            produced.errors.len(),
            &produced.errors[..produced.errors.len().min(5)]
        );
    }

    let ok = produced.done && status.success() && v.clean();
    if !ok || std::env::var_os("WEIR_FAULT_LOGS").is_some() {
        for (id, n) in nodes.running() {
            logs.push((
                format!("node-{id}.{}.log", incarnation[(id - 1) as usize]),
                n.stderr_text(),
            ));
        }
        logs.push((
            "producer.log".into(),
            std::fs::read_to_string(&out).unwrap(),
        ));
        logs.push(("producer.stderr".into(), stderr.clone()));
        eprintln!("logs kept in {}", keep_logs(seed, &logs).display());
    }
    assert!(
        produced.done && status.success(),
        "the producer did not finish cleanly ({status}): {summary}{}",
        &stderr[stderr.len().saturating_sub(4000)..]
    );
    v.assert_clean();
    assert!(v.acknowledged > 0, "nothing was acknowledged");
    nodes.assert_no_panic();
}
