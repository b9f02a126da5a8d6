//! Transform pipeline benchmark: an async identity transform against a plain
//! consume → produce copy, measured in the same run against the same in-process broker
//! (release build).
//!
//! ```text
//! cargo bench --bench pipeline [-- RECORDS]
//! ```
//! 1. RECORDS (default 300,000) records of 100 B with 8-byte keys are produced to `in`
//!    (2 partitions).
//! 2. **Plain copy** (the baseline): one librdkafka consumer reads `in` from the start
//!    (manual assignment) and one librdkafka producer writes every record to `copy-out`
//!    (`linger.ms=5`); the time runs from the first poll to the last delivery report.
//! 3. **Identity pipeline**: the `identity` component deployed in `async` mode from `in`
//!    to `ident-out` through the admin API; the time runs from the deploy request to
//!    `ident-out` holding RECORDS records (its log end offsets, read with librdkafka).
//!
//! 4. **Exactly-once pipeline**: the same with `processing.guarantee = "exactly_once"` to
//!    `eos-out` (a transaction per chunk of up to 1,000 records per partition).
//!
//! Steps 3 and 4 end when the deployment's `input_lag` is 0 with its output full.
//! Printed: records/s of each, the ratio pipeline / copy (the issue's target: ≥ 0.5) and
//! exactly-once / at-least-once.

#[path = "../tests/it/guests.rs"]
mod guests;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

// The integration tests' broker start (`TestBroker`), shared so benches measure the broker
// the tests run; the rest of the harness is unused here.
#[allow(dead_code)]
#[path = "../tests/it/harness.rs"]
mod harness;

const PARTITIONS: i32 = 2;

fn create_topic(bootstrap: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let results = rt
        .block_on(admin.create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        ))
        .unwrap();
    for r in results {
        r.unwrap();
    }
}

fn producer(bootstrap: &str) -> ThreadedProducer<DefaultProducerContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .unwrap()
}

fn send(p: &ThreadedProducer<DefaultProducerContext>, mut r: BaseRecord<'_, [u8], [u8]>) {
    loop {
        match p.send(r) {
            Ok(()) => return,
            Err((_, back)) => {
                r = back;
                p.poll(Duration::from_millis(5));
            }
        }
    }
}

fn produce_input(bootstrap: &str, n: usize) {
    let p = producer(bootstrap);
    let value = [b'v'; 100];
    for i in 0..n {
        let key = (i as u64).to_be_bytes();
        send(&p, BaseRecord::to("in").key(&key[..]).payload(&value[..]));
    }
    p.flush(Duration::from_secs(300)).unwrap();
}

/// Consume `in` from the start and produce every record to `copy-out`; seconds taken.
fn plain_copy(bootstrap: &str, n: usize) -> f64 {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "bench-copy")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset("in", p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let p = producer(bootstrap);
    let t0 = Instant::now();
    let mut copied = 0;
    while copied < n {
        match c.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let mut r = BaseRecord::to("copy-out");
                if let Some(k) = m.key() {
                    r = r.key(k);
                }
                if let Some(v) = m.payload() {
                    r = r.payload(v);
                }
                send(&p, r);
                copied += 1;
            }
            Some(Err(e)) => panic!("consume: {e}"),
            None => {}
        }
    }
    p.flush(Duration::from_secs(300)).unwrap();
    t0.elapsed().as_secs_f64()
}

/// Sum of the log end offsets of `topic`'s partitions (0 for a topic not there yet).
fn log_end(c: &BaseConsumer, topic: &str) -> i64 {
    (0..PARTITIONS)
        .map(|p| {
            c.fetch_watermarks(topic, p, Duration::from_secs(5))
                .map(|(_, high)| high)
                .unwrap_or(0)
        })
        .sum()
}

/// One HTTP/1.1 request with a JSON body; returns (status, body).
fn http(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    (status, body.to_string())
}

/// Deploys the identity transform `name` from `in` to `out` with `guarantee`
/// (`processing.guarantee`) and waits until its progress covers every record (status
/// `input_lag` 0 once `out` holds at least RECORDS offsets: exactly-once outputs also
/// hold transaction markers); seconds.
fn identity_pipeline(
    b: &harness::TestBroker,
    admin: std::net::SocketAddr,
    n: usize,
    name: &str,
    out: &str,
    guarantee: &str,
) -> f64 {
    let wasm = guests::guest("identity");
    let watcher: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &b.bootstrap)
        .create()
        .unwrap();
    let spec = serde_json::json!({
        "name": name,
        "wasm": wasm,
        "input": "in",
        "outputs": [out],
        "processing.guarantee": guarantee,
    });
    let t0 = Instant::now();
    let (status, body) = http(admin, "POST", "/transforms", &spec.to_string());
    assert_eq!(status, 201, "deploy: {body}");
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        assert!(Instant::now() < deadline, "the pipeline did not finish");
        if log_end(&watcher, out) >= n as i64 {
            let (_, body) = http(admin, "GET", &format!("/transforms/{name}"), "");
            let status: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            if status["input_lag"] == 0 {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    t0.elapsed().as_secs_f64()
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(300_000);
    let dir = tempfile::tempdir().unwrap();
    let b = harness::TestBroker::start_in(dir.path(), &[]);
    let admin: std::net::SocketAddr = b
        .admin_url
        .trim_start_matches("http://")
        .parse()
        .expect("the admin listener's address");
    for t in ["in", "copy-out", "ident-out", "eos-out"] {
        create_topic(&b.bootstrap, t, PARTITIONS);
    }
    produce_input(&b.bootstrap, n);
    let copy_s = plain_copy(&b.bootstrap, n);
    let pipe_s = identity_pipeline(&b, admin, n, "bench-identity", "ident-out", "at_least_once");
    let eos_s = identity_pipeline(
        &b,
        admin,
        n,
        "bench-identity-eos",
        "eos-out",
        "exactly_once",
    );
    let rate = |s: f64| n as f64 / s;
    println!("pipeline: {n} records of 100 B, {PARTITIONS} partitions");
    println!(
        "  plain consume→produce copy : {:>10.0} records/s ({copy_s:.2} s)",
        rate(copy_s)
    );
    println!(
        "  async identity transform   : {:>10.0} records/s ({pipe_s:.2} s)",
        rate(pipe_s)
    );
    println!(
        "  exactly-once transform     : {:>10.0} records/s ({eos_s:.2} s)",
        rate(eos_s)
    );
    println!("  ratio transform / copy     : {:.2}", copy_s / pipe_s);
    println!(
        "  ratio exactly-once / at-least-once transform: {:.2}",
        pipe_s / eos_s
    );
    b.stop();
}
