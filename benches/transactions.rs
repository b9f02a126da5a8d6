//! Transactions benchmark (issue 14, "Benchmarks"): what a librdkafka client sees of
//! transactional produce and read_committed consume, each against its baseline in the
//! same run against the same broker (the release `weir` binary, one node, defaults).
//!
//! ```text
//! cargo bench --bench transactions [-- RECORDS [CONSUME_RECORDS]]
//! ```
//! 1. **Produce**: RECORDS (default 500,000) records of 100 B (no key) to a topic of one
//!    partition, a new topic per case, by one `rdkafka` producer (`linger.ms=5`,
//!    `batch.size=1000000`, `enable.idempotence=true`, so acks=all):
//!    - **idempotent** (the baseline): one record and a flush (untimed: the producer id
//!      and the connection, as `init_transactions` for the others), then send
//!      everything and flush;
//!    - **transactional** at 10, 100 and 1,000 records per transaction
//!      (`transactional.id` set): `begin_transaction`, send that many, flush,
//!      `commit_transaction` (librdkafka sends AddPartitionsToTxn 1 ms after the first
//!      record, on a timer, and the Produce after its answer; the commit sends EndTxn
//!      and waits for its answer), repeated.
//!
//!    The flush is librdkafka's `rd_kafka_flush`, called directly, as its own
//!    `rd_kafka_commit_transaction` does: the `rdkafka` crate's `flush` waits in 100 ms
//!    steps, one extra 100 ms per transaction (see [`flush`]).
//!
//!    The producer is created (and `init_transactions` done) before the clock starts; the
//!    time runs from the first send to the last flush or commit returning. The baseline
//!    runs three times first and three times last (to topics of their own, each run
//!    appending RECORDS), and the ratios are to the median of those six (their spread,
//!    printed, says how much the machine moved during the run).
//! 2. **Consume**: CONSUME_RECORDS (default 1,000,000) records of 100 B written to a topic
//!    of one partition in transactions of 100 records, of which every tenth is aborted
//!    (after its records are acknowledged, so they are in the log), then read from the
//!    beginning to the end of the partition (`enable.partition.eof`) by one consumer with
//!    manual assignment and `fetch.queue.backoff.ms=10` (see [`consume`]),
//!    `isolation.level=read_uncommitted` (the baseline: every record) and
//!    `read_committed` (the 90% committed), alternating, five times each; the figure is
//!    the median of each. The time runs from the first record read to the last.
//!
//! Printed per case: records/s, the ratio to the baseline, and the broker's and this
//! process's (the client's, librdkafka's threads) CPU µs per record (user+sys from
//! `/proc/PID/stat` over the case; both share the machine's cores). For each
//! transactional case also the broker's own time per request of AddPartitionsToTxn,
//! Produce and EndTxn (`weir_request_duration_seconds` from `GET /metrics`: frame in to
//! response encoded; requests per transaction and mean), the part of a transaction's
//! wall time spent inside the broker. The counts are checked: each produce topic's high
//! watermark is what was sent plus one marker per transaction, and each consumer reads
//! exactly the records it should. A run with the defaults takes ~3.5 minutes on a
//! shared 2-core machine, most of it the 50,000 transactions of the 10/txn case.

// The integration tests' broker start (`BinaryBroker`: the `weir` binary), shared so
// benches measure the broker the tests run; the rest of the harness is unused here.
#[allow(dead_code)]
#[path = "../tests/it/harness.rs"]
mod harness;

use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// Bytes of each record's value.
const RECORD_BYTES: usize = 100;
/// Records per transaction on the consume topic.
const CONSUME_TXN_RECORDS: usize = 100;
/// One transaction in this many is aborted on the consume topic.
const ABORT_EVERY: usize = 10;
/// Rounds of each consume case.
const CONSUME_ROUNDS: usize = 5;
/// Runs of the idempotent baseline before the transactional cases, and again after.
const BASELINE_RUNS: usize = 3;
/// The longest any client call or case may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// CPU seconds (user+sys) of process `pid` ("self" for this one) so far.
fn cpu_s(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = stat.rsplit_once(") ").unwrap().1;
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // CLK_TCK is 100 on Linux.
    ticks / 100.0
}

/// One measured case: its records, wall time and the CPU each side spent on it.
struct Measured {
    records: usize,
    wall_s: f64,
    broker_cpu_s: f64,
    client_cpu_s: f64,
}

impl Measured {
    fn rate(&self) -> f64 {
        self.records as f64 / self.wall_s
    }
}

/// Runs `f` and measures it: `f` returns its record count and its timed part (setup
/// outside that is not timed; the CPU of all of `f` is counted, so setup is kept light).
fn measure(broker_pid: &str, f: impl FnOnce() -> (usize, Duration)) -> Measured {
    let (b0, c0) = (cpu_s(broker_pid), cpu_s("self"));
    let (records, wall) = f();
    Measured {
        records,
        wall_s: wall.as_secs_f64(),
        broker_cpu_s: cpu_s(broker_pid) - b0,
        client_cpu_s: cpu_s("self") - c0,
    }
}

/// The APIs a transaction costs, whose broker-side time is printed per case.
const TXN_APIS: &[&str] = &["AddPartitionsToTxn", "Produce", "EndTxn"];

/// `(count, sum in seconds)` of `weir_request_duration_seconds` for each of [`TXN_APIS`],
/// from the broker's `GET /metrics` (`admin_url` is `http://127.0.0.1:PORT`).
fn api_times(admin_url: &str) -> Vec<(f64, f64)> {
    use std::io::{Read, Write};
    let addr = admin_url.trim_start_matches("http://");
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    write!(
        conn,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).unwrap();
    let value = |name: &str, api: &str| -> f64 {
        let prefix = format!("weir_request_duration_seconds_{name}{{api=\"{api}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map_or(0.0, |v| v.trim().parse().unwrap())
    };
    TXN_APIS
        .iter()
        .map(|api| (value("count", api), value("sum", api)))
        .collect()
}

/// "API n× mean µs" for each of [`TXN_APIS`] between two [`api_times`] snapshots, per
/// transaction.
fn api_breakdown(before: &[(f64, f64)], after: &[(f64, f64)], txns: usize) -> String {
    TXN_APIS
        .iter()
        .zip(before.iter().zip(after))
        .map(|(api, ((c0, s0), (c1, s1)))| {
            let n = c1 - c0;
            let mean_us = if n > 0.0 { (s1 - s0) * 1e6 / n } else { 0.0 };
            format!("{api} {:.2}/txn × {mean_us:.0} µs", n / txns as f64)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn create_topic(bootstrap: &str, topic: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let res = rt
        .block_on(admin.create_topics(
            &[NewTopic::new(topic, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        ))
        .unwrap();
    for r in res {
        r.unwrap_or_else(|(t, e)| panic!("create {t}: {e}"));
    }
}

/// The high watermark of partition 0 of `topic`.
fn high_watermark(bootstrap: &str, topic: &str) -> i64 {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    c.fetch_watermarks(topic, 0, Duration::from_secs(10))
        .unwrap()
        .1
}

/// An idempotent producer, transactional when `transactional_id` is given (then
/// initialised: InitProducerId done).
fn producer(
    bootstrap: &str,
    transactional_id: Option<&str>,
) -> ThreadedProducer<DefaultProducerContext> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        .set("enable.idempotence", "true");
    if let Some(id) = transactional_id {
        c.set("transactional.id", id);
    }
    let p: ThreadedProducer<DefaultProducerContext> = c.create().unwrap();
    if transactional_id.is_some() {
        p.init_transactions(CALL_TIMEOUT).unwrap();
    }
    p
}

/// Queues one record, waiting while the client's queue is full.
fn send(p: &ThreadedProducer<DefaultProducerContext>, topic: &str, value: &[u8]) {
    let mut r = BaseRecord::<(), [u8]>::to(topic).payload(value);
    loop {
        match p.send(r) {
            Ok(()) => return,
            Err((KafkaError::MessageProduction(_), back)) => {
                r = back;
                p.poll(Duration::from_millis(5));
            }
            Err((e, _)) => panic!("send to {topic}: {e}"),
        }
    }
}

/// librdkafka's own `rd_kafka_flush`: sends what is queued at once (linger.ms counts as
/// elapsed while it runs) and waits until every record is acknowledged and its delivery
/// report served (by the producer's polling thread), at most [`CALL_TIMEOUT`].
///
/// Why not the `rdkafka` crate's `flush` (which its `commit_transaction` also calls
/// first): when records are still in flight it calls `rd_kafka_flush` with no wait, then
/// polls the event queue for a whole 100 ms before it looks again, so each flush that has
/// to wait costs 100 ms and linger.ms is not cut short — ~100 ms per transaction at any
/// size in a first run, a client artefact (confluent-kafka, on the same librdkafka,
/// commits a 10-record transaction in ~1.5–2 ms on this broker). After this, the crate's
/// `flush` and `commit_transaction` find nothing in flight and go straight on, as
/// librdkafka's `rd_kafka_commit_transaction` does after its own `rd_kafka_flush`.
fn flush(p: &ThreadedProducer<DefaultProducerContext>) {
    let timeout_ms = CALL_TIMEOUT.as_millis() as i32;
    // SAFETY: the pointer is the live producer's handle (`p` outlives the call), and
    // `rd_kafka_flush` is thread-safe; in the event mode the crate uses it only waits for
    // the message count to reach zero while the polling thread serves the reports.
    #[allow(unsafe_code)]
    let err = unsafe { rdkafka::bindings::rd_kafka_flush(p.client().native_ptr(), timeout_ms) };
    assert_eq!(
        err,
        rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR,
        "flush"
    );
    assert_eq!(p.in_flight_count(), 0, "nothing in flight after a flush");
}

/// The idempotent baseline: `n` records to `topic`, then flush.
fn produce_idempotent(bootstrap: &str, topic: &str, n: usize) -> (usize, Duration) {
    let p = producer(bootstrap, None);
    let value = vec![b'x'; RECORD_BYTES];
    // One record first, untimed: the producer id (InitProducerId), the connection and the
    // topic's metadata, which `init_transactions` and the first transaction do for the
    // transactional cases; without it a run of 0.3 s took 0.6 s.
    send(&p, topic, &value);
    flush(&p);
    let t0 = Instant::now();
    for _ in 0..n {
        send(&p, topic, &value);
    }
    flush(&p);
    (n, t0.elapsed())
}

/// `n` records to `topic` in transactions of `per_txn`; transaction `i` is aborted when
/// `abort(i)` (after its records are acknowledged, so they are in the log).
fn produce_transactional(
    bootstrap: &str,
    topic: &str,
    n: usize,
    per_txn: usize,
    abort: impl Fn(usize) -> bool,
) -> (usize, Duration) {
    assert_eq!(n % per_txn, 0, "{n} records in transactions of {per_txn}");
    let p = producer(bootstrap, Some(&format!("bench-{topic}")));
    let value = vec![b'x'; RECORD_BYTES];
    let t0 = Instant::now();
    for i in 0..n / per_txn {
        p.begin_transaction().unwrap();
        for _ in 0..per_txn {
            send(&p, topic, &value);
        }
        flush(&p);
        if abort(i) {
            p.abort_transaction(CALL_TIMEOUT).unwrap();
        } else {
            p.commit_transaction(CALL_TIMEOUT).unwrap();
        }
    }
    (n, t0.elapsed())
}

/// Reads partition 0 of `topic` from the beginning to its end at `isolation_level`;
/// returns the records read and the time from the first to the last (the consumer's
/// start, ~0.5 s on this machine, and the wait for the end of the partition, up to
/// `fetch.wait.max.ms`, would otherwise be most of a 1-second read).
fn consume(bootstrap: &str, topic: &str, isolation_level: &str) -> (usize, Duration) {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "bench-consume")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", isolation_level)
        // librdkafka pauses fetching for fetch.queue.backoff.ms (1000) once its queue holds
        // queued.min.messages (100,000): a first run's rates of either level were
        // bimodal, ~1 s apart. A short backoff keeps that timer out of the figure.
        .set("fetch.queue.backoff.ms", "10")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    let t0 = Instant::now();
    c.assign(&tpl).unwrap();
    let mut n = 0;
    let (mut first, mut last) = (None, t0);
    loop {
        match c.poll(Duration::from_millis(100)) {
            Some(Ok(_)) => {
                last = Instant::now();
                first.get_or_insert(last);
                n += 1;
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {
                return (n, last - first.unwrap_or(last));
            }
            Some(Err(e)) => panic!("consume {topic} ({isolation_level}): {e}"),
            None => assert!(
                t0.elapsed() < CALL_TIMEOUT,
                "consume {topic} ({isolation_level}): no end after {n} records"
            ),
        }
    }
}

fn us_per_record(cpu_s: f64, records: usize) -> f64 {
    cpu_s * 1e6 / records as f64
}

fn row(case: &str, m: &Measured, baseline_rate: f64) {
    println!(
        "| {case} | {} | {:.2} | {:.0} | {:.2} | {:.2} | {:.2} |",
        m.records,
        m.wall_s,
        m.rate(),
        m.rate() / baseline_rate,
        us_per_record(m.broker_cpu_s, m.records),
        us_per_record(m.client_cpu_s, m.records)
    );
}

fn rates(runs: &[Measured]) -> String {
    runs.iter()
        .map(|m| format!("{:.0}", m.rate()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn median_by_rate(mut runs: Vec<Measured>) -> Measured {
    runs.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
    runs.swap_remove(runs.len() / 2)
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .map(|a| a.parse().expect("RECORDS and CONSUME_RECORDS are numbers"))
        .collect();
    let records = args.first().copied().unwrap_or(500_000);
    let consume_records = args.get(1).copied().unwrap_or(1_000_000);

    let tmp = tempfile::tempdir().unwrap();
    let broker = harness::BinaryBroker::spawn(&tmp.path().join("data"), 0, &[]);
    let bootstrap = broker.bootstrap.clone();
    let pid = broker.pid().to_string();
    println!(
        "weir {} (release), one node, defaults; {} CPUs; librdkafka {}; load average {}",
        harness::weir_bin().display(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        rdkafka::util::get_rdkafka_version().1,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );

    // 1. Produce.
    let per_txn_cases = [10, 100, 1000];
    let mut topics = vec!["idempotent-1".to_string()];
    topics.extend(per_txn_cases.iter().map(|k| format!("txn-{k}")));
    topics.push("idempotent-2".to_string());
    for t in &topics {
        create_topic(&bootstrap, t);
    }
    println!("produce {records} x {RECORD_BYTES} B, one partition, linger.ms=5, acks=all:");
    let idempotent = |topic: &str| {
        (0..BASELINE_RUNS)
            .map(|_| measure(&pid, || produce_idempotent(&bootstrap, topic, records)))
            .collect::<Vec<_>>()
    };
    let first = idempotent("idempotent-1");
    let mut txn = Vec::new();
    let mut breakdowns = Vec::new();
    for k in per_txn_cases {
        let topic = format!("txn-{k}");
        let before = api_times(&broker.admin_url);
        let m = measure(&pid, || {
            produce_transactional(&bootstrap, &topic, records, k, |_| false)
        });
        let after = api_times(&broker.admin_url);
        breakdowns.push(format!(
            "{k}/txn, broker time per request (weir_request_duration_seconds): {}",
            api_breakdown(&before, &after, records / k)
        ));
        txn.push((k, m));
    }
    let last = idempotent("idempotent-2");
    for t in ["idempotent-1", "idempotent-2"] {
        let expected = (BASELINE_RUNS * (records + 1)) as i64; // + the warm-up record
        assert_eq!(high_watermark(&bootstrap, t), expected, "{t}");
    }
    for k in per_txn_cases {
        let t = format!("txn-{k}");
        let markers = records / k;
        assert_eq!(
            high_watermark(&bootstrap, &t),
            (records + markers) as i64,
            "{t}: records plus one COMMIT marker per transaction"
        );
    }
    println!("idempotent runs before (records/s): {}", rates(&first));
    println!("idempotent runs after (records/s): {}", rates(&last));
    let baseline = median_by_rate(first.into_iter().chain(last).collect());
    let base = baseline.rate();
    println!();
    println!(
        "| case | records | s | records/s | / idempotent | broker µs CPU/rec | client µs CPU/rec |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    row(
        &format!("idempotent (median of {})", 2 * BASELINE_RUNS),
        &baseline,
        base,
    );
    for (k, m) in &txn {
        row(&format!("transactional, {k}/txn"), m, base);
    }
    println!();
    for b in &breakdowns {
        println!("{b}");
    }
    println!();

    // 2. Consume.
    let topic = "aborted-10pct";
    create_topic(&bootstrap, topic);
    let t0 = Instant::now();
    produce_transactional(
        &bootstrap,
        topic,
        consume_records,
        CONSUME_TXN_RECORDS,
        |i| i % ABORT_EVERY == ABORT_EVERY / 2,
    );
    let txns = consume_records / CONSUME_TXN_RECORDS;
    let aborted = (0..txns)
        .filter(|i| i % ABORT_EVERY == ABORT_EVERY / 2)
        .count();
    let committed_records = (txns - aborted) * CONSUME_TXN_RECORDS;
    assert_eq!(
        high_watermark(&bootstrap, topic),
        (consume_records + txns) as i64
    );
    println!(
        "consume: {consume_records} x {RECORD_BYTES} B in {txns} transactions of \
         {CONSUME_TXN_RECORDS}, {aborted} aborted (written in {:.1} s), one partition, \
         {CONSUME_ROUNDS} rounds each, alternating:",
        t0.elapsed().as_secs_f64()
    );
    let (mut uncommitted, mut committed) = (Vec::new(), Vec::new());
    for _ in 0..CONSUME_ROUNDS {
        let m = measure(&pid, || consume(&bootstrap, topic, "read_uncommitted"));
        assert_eq!(
            m.records, consume_records,
            "read_uncommitted reads every record"
        );
        uncommitted.push(m);
        let m = measure(&pid, || consume(&bootstrap, topic, "read_committed"));
        assert_eq!(
            m.records, committed_records,
            "read_committed reads the committed"
        );
        committed.push(m);
    }
    println!("read_uncommitted runs (records/s): {}", rates(&uncommitted));
    println!("read_committed runs (records/s): {}", rates(&committed));
    let (u, c) = (median_by_rate(uncommitted), median_by_rate(committed));
    println!();
    println!("| case (median of {CONSUME_ROUNDS}) | records read | s | records/s | / read_uncommitted | broker µs CPU/rec | client µs CPU/rec |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    row("read_uncommitted", &u, u.rate());
    row("read_committed", &c, u.rate());
    println!(
        "read_committed read {:.1}% of the records read_uncommitted read; \
         time read_committed / read_uncommitted: {:.2}",
        100.0 * c.records as f64 / u.records as f64,
        c.wall_s / u.wall_s
    );
    broker.terminate();
}
