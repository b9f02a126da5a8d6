//! SQLite CDC end-to-end latency: from a row committed to the database to its change
//! event readable by a Kafka consumer.
//!
//! An in-process broker runs the built-in `sqlite-cdc` connector (`snapshot.mode=never`)
//! on a WAL database; a writer thread (its own rusqlite connection, as another process
//! would have) inserts one row per millisecond — 1,000 changes/s — for `CDC_BENCH_SECS`
//! seconds (default 10), each row carrying the writer's wall-clock time in microseconds
//! taken just before its (autocommit) INSERT; an rdkafka consumer reads the topic and
//! subtracts that time from its own clock when the record arrives. Printed: p50, p99 and
//! max latency, and how many changes were paced late by the writer itself.
//!
//! The connector's `poll.interval.ms` (its idle wait after an empty poll) bounds the
//! latency from below: `CDC_BENCH_POLL_MS` sets it (default 10; the connector default is
//! 200).
//!
//! Run: `cargo bench --bench cdc` (builds the connectors first).

// Only `build_workspace` is used here (the connectors' workspace).
#[allow(dead_code)]
#[path = "../tests/it/guests.rs"]
mod guests;
// The integration tests' broker start (`TestBroker`), shared so benches measure the broker
// the tests run; the rest of the harness is unused here.
#[allow(dead_code)]
#[path = "../tests/it/harness.rs"]
mod harness;

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

fn env_u64(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let secs = env_u64("CDC_BENCH_SECS", 10);
    let poll_ms = env_u64("CDC_BENCH_POLL_MS", 10);
    let rate_per_s = 1_000u64;
    let plugins =
        guests::build_workspace(&Path::new(env!("CARGO_MANIFEST_DIR")).join("connectors"))
            .unwrap_or_else(|e| panic!("{e}"));
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let configs = tmp.path().join("configs");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&configs).unwrap();
    let db = tmp.path().join("bench.db");
    let writer = rusqlite::Connection::open(&db).unwrap();
    writer
        .execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
             CREATE TABLE events(id INTEGER PRIMARY KEY, committed_us INTEGER, payload TEXT);",
        )
        .unwrap();
    writer.busy_timeout(Duration::from_secs(30)).unwrap();
    std::fs::write(
        configs.join("bench.toml"),
        format!(
            "name = \"bench-cdc\"\nconnector.class = \"sqlite-cdc\"\ndatabase = \"{}\"\n\
             tables = \"events\"\ntopic.prefix = \"bench\"\nsnapshot.mode = \"never\"\n\
             poll.interval.ms = {poll_ms}\nbatch.size = 2000\n",
            db.display()
        ),
    )
    .unwrap();
    let broker = harness::TestBroker::start_in(
        &data,
        &[
            &format!("connect.config.dir={}", configs.display()),
            &format!("connect.plugin.path={}", plugins.display()),
        ],
    );
    let bootstrap = broker.bootstrap.clone();
    // Wait for the connector's triggers.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n: i64 = writer
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'events'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        if n > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the connector never installed its triggers"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // One warm-up row creates the topic; the consumer starts after it.
    writer
        .execute(
            "INSERT INTO events(committed_us, payload) VALUES (?1, 'warm-up')",
            [now_us()],
        )
        .unwrap();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "cdc-bench")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "100")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("bench.events", 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(Ok(_)) = consumer.poll(Duration::from_millis(100)) {
            break;
        }
        assert!(Instant::now() < deadline, "the warm-up row never arrived");
    }

    let total = secs * rate_per_s;
    let write = std::thread::spawn(move || {
        let start = Instant::now();
        let mut late = 0u64;
        for i in 0..total {
            let due = start + Duration::from_micros(i * 1_000_000 / rate_per_s);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            } else if now - due > Duration::from_millis(5) {
                late += 1;
            }
            writer
                .execute(
                    "INSERT INTO events(committed_us, payload) VALUES (?1, ?2)",
                    rusqlite::params![now_us(), format!("change {i}")],
                )
                .unwrap();
        }
        (late, start.elapsed())
    });
    let mut latencies_us: Vec<i64> = Vec::with_capacity(total as usize);
    let deadline = Instant::now() + Duration::from_secs(secs + 120);
    while (latencies_us.len() as u64) < total && Instant::now() < deadline {
        let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let arrived = now_us();
        let Some(v) = m.payload() else { continue };
        let v: serde_json::Value = serde_json::from_slice(v).unwrap();
        if v["after"]["payload"] == "warm-up" {
            continue;
        }
        if let Some(t) = v["after"]["committed_us"].as_i64() {
            latencies_us.push(arrived - t);
        }
    }
    let (late, took) = write.join().unwrap();
    broker.stop();
    latencies_us.sort_unstable();
    println!(
        "sqlite-cdc end-to-end latency (row committed -> readable by an rdkafka consumer), \
         {} changes at {rate_per_s}/s over {:.1} s, poll.interval.ms={poll_ms}:",
        latencies_us.len(),
        took.as_secs_f64()
    );
    println!(
        "  p50 {:.1} ms   p99 {:.1} ms   max {:.1} ms   (writer paced late >5 ms: {late})",
        percentile(&latencies_us, 0.50) as f64 / 1000.0,
        percentile(&latencies_us, 0.99) as f64 / 1000.0,
        latencies_us.last().copied().unwrap_or(0) as f64 / 1000.0,
    );
    assert_eq!(latencies_us.len() as u64, total, "every change arrived");
}
