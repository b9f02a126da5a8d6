//! Inline transforms on the produce path: what redacting every produced record costs.
//!
//! 1. **Broker side, no client** (`transform::apply::apply` on validated 1000-record
//!    batches of ~100-byte JSON values, uncompressed and lz4): the records are decoded,
//!    run through the `redact` component (`fields=email`) and re-encoded. Printed as ns
//!    per record next to `validate_records` on the same batch (what every produce pays
//!    already).
//! 2. **End to end**: an in-process broker and a librdkafka producer (acks=1, linger.ms=5,
//!    no compression) sending N records of ~100-byte JSON to a topic without a transform,
//!    then to one with an inline redact deployment (`POST /transforms` on the admin
//!    listener), alternating, twice each; records/s and the ratio inline / plain, measured
//!    in the same run.
//!
//! Run: `cargo bench --bench inline` (builds the guests first). `INLINE_BENCH_RECORDS`
//! sets N (default 200000). On a shared 2-CPU box the producer takes much of the CPU: the
//! end-to-end ratio is the figure to compare, not the absolute rates.

#[path = "../tests/it/guests.rs"]
mod guests;
// The integration tests' broker start (`TestBroker`), shared so benches measure the broker
// the tests run; the rest of the harness is unused here.
#[allow(dead_code)]
#[path = "../tests/it/harness.rs"]
mod harness;

use std::hint::black_box;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use weir::log::{split_batches, ValidatedBatch};
use weir::plugin::{PluginHost, PluginHostConfig};
use weir::protocol::records::{validate_records, RecordLimits};
use weir::transform::apply::{apply, Target};
use weir::transform::inline::InlineSlot;
use weir::transform::{Stats, Tolerance};

const MEASURE: Duration = Duration::from_millis(1500);

/// A 100-byte JSON value with an email (ids up to 7 digits).
fn value(i: usize) -> String {
    let bare = format!(r#"{{"id":{i:07},"email":"user{i:07}@example.com","note":""}}"#);
    let pad = 100usize.saturating_sub(bare.len());
    format!(
        r#"{{"id":{i:07},"email":"user{i:07}@example.com","note":"{}"}}"#,
        "x".repeat(pad)
    )
}

fn batch(n: usize, codec: kafka_protocol::records::Compression) -> ValidatedBatch {
    use kafka_protocol::records::{Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
    let records: Vec<Record> = (0..n)
        .map(|i| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: 7,
            producer_epoch: 0,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: i as i32,
            timestamp: 1_700_000_000_000 + i as i64,
            key: Some(Bytes::from(format!("key{i:05}"))),
            value: Some(Bytes::from(value(i))),
            headers: Default::default(),
        })
        .collect();
    let mut buf = bytes::BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: codec,
        },
    )
    .expect("encode");
    split_batches(buf.freeze()).expect("valid").remove(0)
}

fn per_record(n: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..5 {
        f();
    }
    let started = Instant::now();
    let mut calls = 0u64;
    while started.elapsed() < MEASURE {
        f();
        calls += 1;
    }
    started.elapsed().as_nanos() as f64 / (calls as f64 * n as f64)
}

fn broker_side(runtime: &tokio::runtime::Runtime) -> Result<(), Box<dyn std::error::Error>> {
    let host = PluginHost::new(PluginHostConfig::default())?;
    let transform = runtime.block_on(host.load_transform(
        &guests::guest("redact"),
        &[("fields".to_string(), "email".to_string())],
    ))?;
    let slot = InlineSlot {
        name: "redact".into(),
        version: "bench".into(),
        transform: tokio::sync::Mutex::new(transform),
        tolerance: Tolerance::None,
        dlq_topic: None,
        stats: Arc::new(Stats::default()),
    };
    println!("inline redact, broker side: 1000-record batches, ~100-byte JSON values (ns/record)");
    println!(
        "{:>6} {:>10} {:>14} {:>8}",
        "codec", "validate", "validate+apply", "ratio"
    );
    use kafka_protocol::records::Compression as C;
    for (name, codec) in [("none", C::None), ("lz4", C::Lz4), ("zstd", C::Zstd)] {
        let input = batch(1000, codec);
        let limits = RecordLimits::for_max_message_bytes(1 << 20);
        let target = Target {
            topic: "bench",
            partition: 0,
            compression: None,
            max_decompressed_bytes: limits.max_decompressed_bytes,
            max_message_bytes: 1 << 20,
        };
        let out = runtime
            .block_on(apply(&slot, target, vec![input.clone()]))
            .map_err(|r| r.message)?;
        assert_eq!(out.batches[0].record_count(), 1000);
        let validate_ns = per_record(1000, || {
            black_box(validate_records(black_box(&input), limits)).expect("valid");
        });
        let apply_ns = per_record(1000, || {
            black_box(validate_records(black_box(&input), limits)).expect("valid");
            let out = runtime.block_on(apply(&slot, target, vec![input.clone()]));
            black_box(out.map(|o| o.batches.len()).unwrap_or(0));
        });
        println!(
            "{name:>6} {validate_ns:>10.0} {apply_ns:>14.0} {:>7.1}x",
            apply_ns / validate_ns
        );
    }
    Ok(())
}

fn deploy_redact(admin: &str, topic: &str) -> Result<(), String> {
    let body = serde_json::json!({
        "name": "redact-bench",
        "wasm": guests::guest("redact").to_str().unwrap(),
        "input": topic,
        "outputs": [topic],
        "config": {"fields": "email"},
        "mode": "inline",
        "errors.tolerance": "none",
    })
    .to_string();
    let mut s = std::net::TcpStream::connect(admin).map_err(|e| e.to_string())?;
    write!(
        s,
        "POST /transforms HTTP/1.1\r\nHost: {admin}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    if out.starts_with("HTTP/1.1 2") {
        Ok(())
    } else {
        Err(out)
    }
}

async fn produce(bootstrap: &str, topic: &str, values: &[String]) -> f64 {
    let p: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "1")
        .set("linger.ms", "5")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        .set("message.timeout.ms", "120000")
        .create()
        .expect("producer");
    let started = Instant::now();
    let mut pending = Vec::with_capacity(values.len());
    for (i, v) in values.iter().enumerate() {
        let key = format!("key{:05}", i % 100_000);
        pending.push(
            p.send_result(FutureRecord::to(topic).key(&key).payload(v).partition(0))
                .expect("queue"),
        );
    }
    for f in pending {
        f.await.expect("delivered").expect("produced");
    }
    p.flush(Duration::from_secs(60)).expect("flush");
    values.len() as f64 / started.elapsed().as_secs_f64()
}

fn end_to_end(runtime: &tokio::runtime::Runtime) -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::var("INLINE_BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let dir = tempfile::tempdir()?;
    let broker = harness::TestBroker::start_in(dir.path(), &[]);
    let bootstrap = broker.bootstrap.clone();
    let admin = broker.admin_url.trim_start_matches("http://").to_string();
    let values: Vec<String> = (0..n).map(value).collect();
    if let Err(e) = deploy_redact(&admin, "inline") {
        println!("end to end: cannot deploy through POST /transforms (not merged yet?): {e}");
        broker.stop();
        return Ok(());
    }
    println!(
        "inline redact, end to end: {n} records of ~100-byte JSON, librdkafka acks=1 (records/s)"
    );
    let mut plain = Vec::new();
    let mut inline = Vec::new();
    for round in 0..2 {
        plain.push(runtime.block_on(produce(&bootstrap, &format!("plain{round}"), &values)));
        // The deployment is on topic `inline`; both rounds go there.
        inline.push(runtime.block_on(produce(&bootstrap, "inline", &values)));
    }
    let best = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
    println!(
        "{:>10} {:>12.0} (runs: {:.0?})",
        "plain",
        best(&plain),
        plain
    );
    println!(
        "{:>10} {:>12.0} (runs: {:.0?})",
        "inline",
        best(&inline),
        inline
    );
    println!("{:>10} {:>12.2}", "ratio", best(&inline) / best(&plain));
    broker.stop();
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    broker_side(&runtime)?;
    end_to_end(&runtime)?;
    Ok(())
}
