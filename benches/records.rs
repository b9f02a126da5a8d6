//! Micro-measurement of `weir::protocol::records::validate_records`, the per-record walk on
//! the produce path: `cargo bench --bench records` (release). Prints ns/record and µs/batch
//! for a batch of 1000 records of 100-byte values (null key, no headers) per codec; the
//! target is ≤ ~20 ns/record uncompressed. No assertions: a figure to read, not a test.
//! `RECORDS_CODECS=none,lz4` limits the run to those codecs (for `perf record`).

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use weir::log::{validate, ValidatedBatch};
use weir::protocol::records::{validate_records, RecordLimits};

const RECORDS: usize = 1000;
const VALUE_BYTES: usize = 100;

fn batch(codec: Compression) -> ValidatedBatch {
    let records: Vec<Record> = (0..RECORDS as i64)
        .map(|i| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i,
            sequence: (i - 1) as i32,
            timestamp: 1_700_000_000_000 + i,
            key: None,
            // Varied bytes so the codecs do some work.
            value: Some(Bytes::from(
                (0..VALUE_BYTES)
                    .map(|j| b'a' + ((i as usize * 7 + j * 13) % 26) as u8)
                    .collect::<Vec<u8>>(),
            )),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        records.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression: codec,
        },
    )
    .expect("encodes");
    let b = validate(buf.freeze()).expect("one valid batch");
    assert_eq!(b.record_count(), RECORDS as i32);
    b
}

fn main() {
    let limits = RecordLimits::for_max_message_bytes(1_048_588);
    for (name, codec) in [
        ("none", Compression::None),
        ("lz4", Compression::Lz4),
        ("snappy", Compression::Snappy),
        ("zstd", Compression::Zstd),
        ("gzip", Compression::Gzip),
    ] {
        if std::env::var("RECORDS_CODECS").is_ok_and(|only| !only.split(',').any(|c| c == name)) {
            continue;
        }
        let b = batch(codec);
        validate_records(&b, limits).expect("valid");
        let mut best = f64::MAX;
        // Best of 5 rounds of ~0.3 s: the machine is shared and noisy.
        for _ in 0..5 {
            let start = Instant::now();
            let mut n = 0u64;
            while start.elapsed() < Duration::from_millis(300) {
                for _ in 0..10 {
                    validate_records(black_box(&b), limits).expect("valid");
                }
                n += 10;
            }
            let per_batch = start.elapsed().as_nanos() as f64 / n as f64;
            best = best.min(per_batch);
        }
        println!(
            "records {name:>6}: {:>7.1} ns/record  {:>8.2} µs/batch of {RECORDS} x {VALUE_BYTES} B  ({} B on the wire)",
            best / RECORDS as f64,
            best / 1000.0,
            b.len()
        );
    }
}
