//! Host↔guest cost of a transform call, per record, for batches of 1, 100 and 1000
//! records with 100-byte values (and 8-byte keys), through the identity component
//! (`plugins/fixtures/identity`). Baseline in the same run: the same records copied in
//! plain Rust (each key and value into a fresh buffer), the least a copying transform
//! costs without a sandbox.
//!
//! What a transform call includes: encoding the batch into one buffer ("weir batch v1"),
//! the async call into the guest (copying the buffer in), the guest parsing it and
//! writing the output buffer, copying that out, checking and indexing it (`OutputBatch`),
//! and reading each output value in place.
//!
//! Run: `cargo bench --bench plugins` (builds the guests first). Prints ns/record.

#[path = "../tests/it/guests.rs"]
mod guests;

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use weir::plugin::{BatchContext, PluginHost, PluginHostConfig, Record};

/// Measure each case for at least this long.
const MEASURE: Duration = Duration::from_millis(1500);

fn records(n: usize) -> Vec<Record> {
    (0..n)
        .map(|i| Record {
            key: Some(Bytes::from(format!("key{:05}", i % 100_000).into_bytes())),
            value: Some(Bytes::from(vec![b'x'; 100])),
            headers: Vec::new(),
            timestamp_ms: 1_700_000_000_000 + i as i64,
        })
        .collect()
}

/// Runs `f` (one batch) repeatedly for `MEASURE`; returns ns per record.
fn per_record(batch: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..10 {
        f();
    }
    let started = Instant::now();
    let mut calls = 0u64;
    while started.elapsed() < MEASURE {
        f();
        calls += 1;
    }
    started.elapsed().as_nanos() as f64 / (calls as f64 * batch as f64)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let wasm = guests::guest("identity");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let host = PluginHost::new(PluginHostConfig::default())?;
    let mut transform = runtime.block_on(host.load_transform(&wasm, &[]))?;
    let context = BatchContext {
        topic: "bench".into(),
        partition: 0,
        base_offset: 0,
    };
    println!("plugins: identity transform, 100-byte values, 8-byte keys (ns per record)");
    println!(
        "{:>6} {:>12} {:>12} {:>8}",
        "batch", "wasm", "plain copy", "ratio"
    );
    for batch in [1usize, 100, 1000] {
        let input = records(batch);
        // Check once that the identity really is one.
        let out = runtime
            .block_on(transform.apply(&context, &input))?
            .to_vec();
        assert_eq!(out.len(), batch);
        assert_eq!(out[batch - 1].record, input[batch - 1]);

        // Each output value is read, as a consumer of the outputs would.
        let wasm_ns = per_record(batch, || {
            let out = runtime.block_on(transform.apply(&context, black_box(&input)));
            let bytes: usize = out
                .map(|o| o.iter().map(|r| r.value.map_or(0, <[u8]>::len)).sum())
                .unwrap_or(0);
            black_box(bytes);
        });
        let plain_ns = per_record(batch, || {
            let out: Vec<Record> = black_box(&input)
                .iter()
                .map(|r| Record {
                    key: r.key.as_deref().map(Bytes::copy_from_slice),
                    value: r.value.as_deref().map(Bytes::copy_from_slice),
                    headers: r.headers.clone(),
                    timestamp_ms: r.timestamp_ms,
                })
                .collect();
            black_box(out);
        });
        println!(
            "{batch:>6} {wasm_ns:>12.1} {plain_ns:>12.1} {:>7.1}x",
            wasm_ns / plain_ns
        );
    }
    Ok(())
}
