//! HTTP sink throughput: records/s the built-in `http-sink` connector delivers to a local
//! HTTP server, against a baseline measured in the same run.
//!
//! - **Baseline**: a plain Rust loop POSTing the same batches (JSON arrays of
//!   `batch.size` records, ~100-byte values) the way the connector's host side does: a
//!   new TCP connection and one HTTP/1.1 request per batch, waiting for the response.
//! - **Connector**: an in-process broker with an `http-sink` (`http.request.mode=batch`)
//!   on a topic; N records are produced (librdkafka), and the time from the first to the
//!   last record the server receives is measured.
//!
//! Both talk to the same server (a thread per connection, counting the records of each
//! JSON array). Printed: records/s of each and the ratio connector / baseline.
//!
//! Last run (shared 2-CPU box, 50000 records, batches of 500): baseline 1.56 M records/s,
//! connector 95 k records/s, ratio 0.06. Not profiled yet; per batch the connector adds a
//! log read, lifting 500 records into the guest, a JSON parse and re-serialisation of each
//! value (to send JSON values as JSON), and hyper on the host side.
//!
//! Run: `cargo bench --bench http_sink` (builds the connectors first).
//! `HTTP_SINK_BENCH_RECORDS` sets N (default 100000), `HTTP_SINK_BENCH_BATCH` the batch
//! size (default 500).

#[path = "../tests/it/guests.rs"]
#[allow(dead_code)]
mod guests;
// The integration tests' broker start (`TestBroker`), shared so benches measure the broker
// the tests run; the rest of the harness is unused here.
#[allow(dead_code)]
#[path = "../tests/it/harness.rs"]
mod harness;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

/// A ~100-byte JSON value.
fn value(i: usize) -> String {
    let bare = format!(r#"{{"id":{i},"note":""}}"#);
    let pad = 100usize.saturating_sub(bare.len());
    format!(r#"{{"id":{i},"note":"{}"}}"#, "x".repeat(pad))
}

/// Counts records received (elements of each posted JSON array) and the times of the
/// first and last request.
#[derive(Default)]
struct Counter {
    records: AtomicU64,
    first_last: Mutex<Option<(Instant, Instant)>>,
}

fn serve(counter: Arc<Counter>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let c = counter.clone();
            std::thread::spawn(move || {
                let _ = handle(conn, &c);
            });
        }
    });
    port
}

fn handle(conn: TcpStream, c: &Counter) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut len = 0usize;
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; len];
    reader.read_exact(&mut body)?;
    let n = serde_json::from_slice::<Vec<serde_json::Value>>(&body)
        .map(|v| v.len())
        .unwrap_or(0);
    c.records.fetch_add(n as u64, Ordering::SeqCst);
    let now = Instant::now();
    {
        let mut fl = c.first_last.lock().unwrap();
        let first = fl.map(|(f, _)| f).unwrap_or(now);
        *fl = Some((first, now));
    }
    let mut conn = conn;
    conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
}

fn post(port: u16, body: &[u8]) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let head = format!(
        "POST /in HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    assert!(resp.starts_with(b"HTTP/1.1 200"));
}

fn main() {
    let n: usize = std::env::var("HTTP_SINK_BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let batch: usize = std::env::var("HTTP_SINK_BENCH_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let plugin_path = guests::build_workspace(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("connectors"),
    )
    .unwrap();
    let values: Vec<String> = (0..n).map(value).collect();

    // Baseline: the same batches, posted by a plain loop.
    let base = Arc::new(Counter::default());
    let port = serve(base.clone());
    let started = Instant::now();
    for chunk in values.chunks(batch) {
        let body = format!("[{}]", chunk.join(","));
        post(port, body.as_bytes());
    }
    let base_s = started.elapsed().as_secs_f64();
    assert_eq!(base.records.load(Ordering::SeqCst), n as u64);
    let base_rate = n as f64 / base_s;

    // The connector.
    let sink = Arc::new(Counter::default());
    let port = serve(sink.clone());
    let tmp = tempfile::tempdir().unwrap();
    let configs = tmp.path().join("configs");
    std::fs::create_dir_all(&configs).unwrap();
    std::fs::write(
        configs.join("bench.toml"),
        format!(
            "name = \"bench\"\nconnector.class = \"http-sink\"\ntopics = \"bench\"\n\
             http.url = \"http://127.0.0.1:{port}/in\"\nbatch.size = {batch}\n"
        ),
    )
    .unwrap();
    let broker = harness::TestBroker::start_in(
        &tmp.path().join("data"),
        &[
            &format!("connect.config.dir={}", configs.display()),
            &format!("connect.plugin.path={}", plugin_path.display()),
        ],
    );
    let bootstrap = broker.bootstrap.clone();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("linger.ms", "5")
        .create()
        .unwrap();
    // All records in the topic first, so the sink's rate is not the producer's.
    for v in &values {
        while producer
            .send(BaseRecord::<(), str>::to("bench").payload(v))
            .is_err()
        {
            producer.poll(Duration::from_millis(10));
        }
    }
    producer.flush(Duration::from_secs(60)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    while sink.records.load(Ordering::SeqCst) < n as u64 {
        assert!(
            Instant::now() < deadline,
            "the sink did not deliver everything"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (first, last) = sink.first_last.lock().unwrap().unwrap();
    // The first request's own time is not in first..last: count the records after it.
    let sink_s = last.duration_since(first).as_secs_f64().max(1e-9);
    let sink_rate = (n - batch.min(n)) as f64 / sink_s;
    broker.stop();

    println!("http sink: {n} records of ~100 B, batches of {batch}, one connection per request");
    println!("  baseline (plain Rust loop POSTing the batches): {base_rate:>12.0} records/s");
    println!("  http-sink connector (broker → component → wasi:http): {sink_rate:>12.0} records/s");
    println!("  ratio connector / baseline: {:.2}", sink_rate / base_rate);
}
