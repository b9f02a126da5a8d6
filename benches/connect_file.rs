//! File source throughput: the built-in `file-source` connector reading a file into a
//! topic, against `weir produce` of the same file, in the same run against the same
//! broker (release build).
//!
//! ```text
//! cargo bench --bench connect_file [-- LINES]
//! ```
//! 1. LINES (default 500,000) lines of ~100 bytes are written to a scratch file.
//! 2. **weir produce** (the baseline): `weir produce produced < FILE` as a child process
//!    (acks=all, librdkafka's batching); the time runs from the spawn to its exit (every
//!    record acknowledged).
//! 3. **file source**: the broker (the `weir` binary, release) starts with a
//!    `file-source` connector whose file does not exist yet; the file is moved into place
//!    (one rename) and the time runs from the rename to the topic's log end offset
//!    reaching LINES.
//!
//! Printed: lines/s of each and the ratio file source / weir produce.

#[path = "../tests/it/guests.rs"]
#[allow(dead_code)] // only build_workspace is used here
mod guests;
// The integration tests' broker start (`BinaryBroker`: the `weir` binary), shared so
// benches measure the broker the tests run; the rest of the harness is unused here.
#[allow(dead_code)]
#[path = "../tests/it/harness.rs"]
mod harness;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

/// The log end offset of partition 0 of `topic` (0 while it does not exist). A new
/// client each time: one created before the topic existed keeps answering "unknown topic".
fn log_end_offset(bootstrap: &str, topic: &str) -> i64 {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    c.fetch_watermarks(topic, 0, Duration::from_secs(5))
        .map(|(_, high)| high)
        .unwrap_or(0)
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(500_000);
    let plugins =
        guests::build_workspace(&Path::new(env!("CARGO_MANIFEST_DIR")).join("connectors"))
            .unwrap_or_else(|e| panic!("{e}"));
    let tmp = tempfile::tempdir().unwrap();
    let configs = tmp.path().join("configs");
    let input_dir = tmp.path().join("in");
    std::fs::create_dir_all(&configs).unwrap();
    std::fs::create_dir_all(&input_dir).unwrap();
    let staged = tmp.path().join("lines.txt");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&staged).unwrap());
        for i in 0..n {
            writeln!(f, "{i:010} {}", "x".repeat(89)).unwrap();
        }
    }
    let input = input_dir.join("lines.txt");
    std::fs::write(
        configs.join("source.toml"),
        format!(
            "name = \"bench-source\"\nconnector.class = \"file-source\"\nfile = \"{}\"\n\
             topic = \"sourced\"\n",
            input.display()
        ),
    )
    .unwrap();
    let broker = harness::BinaryBroker::spawn(
        &tmp.path().join("data"),
        0,
        &[
            &format!("connect.config.dir={}", configs.display()),
            &format!("connect.plugin.path={}", plugins.display()),
        ],
    );

    // Baseline: weir produce of the same file.
    let t0 = Instant::now();
    let status = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args([
            "produce",
            "produced",
            "--bootstrap-server",
            &broker.bootstrap,
        ])
        .stdin(std::fs::File::open(&staged).unwrap())
        .stdout(Stdio::null())
        .status()
        .expect("run weir produce");
    let produce_s = t0.elapsed().as_secs_f64();
    assert!(status.success(), "weir produce failed");
    assert_eq!(log_end_offset(&broker.bootstrap, "produced"), n as i64);

    // The connector: the file appears at once.
    let t0 = Instant::now();
    std::fs::rename(&staged, &input).unwrap();
    while log_end_offset(&broker.bootstrap, "sourced") < n as i64 {
        std::thread::sleep(Duration::from_millis(10));
    }
    let source_s = t0.elapsed().as_secs_f64();

    let produce_rate = n as f64 / produce_s;
    let source_rate = n as f64 / source_s;
    println!("lines: {n} of 100 bytes");
    println!("weir produce : {produce_rate:>12.0} lines/s ({produce_s:.2} s)");
    println!("file source  : {source_rate:>12.0} lines/s ({source_s:.2} s)");
    println!(
        "ratio file source / weir produce: {:.2}",
        source_rate / produce_rate
    );
}
