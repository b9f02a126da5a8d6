//! Third-party clients against weir: kcat (librdkafka 2.0.2 in Debian) with every
//! compression codec, and the round-trip scripts in `tests/compat/` for confluent-kafka,
//! kafka-python, aiokafka and kafkajs. The clients are installed by
//! `tests/install-deps.sh` (part of the README's test command); a missing client fails the
//! test with that hint rather than skipping it.

use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};

use crate::harness::{repo_root, TestBroker};

fn require(tool: &str) {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "{tool} is not installed: run tests/install-deps.sh (the README's test command does)"
    );
}

/// `timeout SECS kcat ...`, without cargo's LD_LIBRARY_PATH: it points at the librdkafka
/// that the `rdkafka` crate built (no zstd), which would shadow the system one kcat needs.
fn kcat(secs: &str) -> Command {
    let mut c = Command::new("timeout");
    c.arg(secs).arg("kcat").env_remove("LD_LIBRARY_PATH");
    c
}

fn kcat_round_trip(bootstrap: &str, topic: &str, codec: &str, n: usize) {
    let mut child = kcat("60")
        .args([
            "-P",
            "-b",
            bootstrap,
            "-t",
            topic,
            "-K",
            "\t",
            "-z",
            codec,
            "-H",
            "run=weir",
            "-H",
            &format!("codec={codec}"),
            "-X",
            "acks=all",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kcat");
    {
        let mut stdin = std::io::BufWriter::new(child.stdin.take().unwrap());
        for i in 0..n {
            if writeln!(stdin, "key-{i}\tvalue-{i}-{codec}").is_err() {
                break; // kcat exited: its stderr below says why
            }
        }
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kcat produce ({codec}) failed: {err}");
    assert!(
        !err.contains("ERROR") && !err.to_lowercase().contains("fail"),
        "kcat produce ({codec}): {err}"
    );

    let out = kcat("60")
        .args([
            "-C",
            "-b",
            bootstrap,
            "-t",
            topic,
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            "%p\t%o\t%k\t%h\t%s\n",
        ])
        .output()
        .expect("kcat consume");
    assert!(
        out.status.success(),
        "kcat consume ({codec}): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut last_index: HashMap<String, i64> = HashMap::new();
    let mut last_offset: HashMap<String, i64> = HashMap::new();
    let mut seen = vec![false; n];
    for line in text.lines() {
        let f: Vec<&str> = line.splitn(5, '\t').collect();
        assert_eq!(f.len(), 5, "bad line {line:?}");
        let (p, o, k, h, v) = (f[0], f[1].parse::<i64>().unwrap(), f[2], f[3], f[4]);
        let i: usize = k.strip_prefix("key-").unwrap().parse().unwrap();
        assert_eq!(v, format!("value-{i}-{codec}"));
        assert_eq!(h, format!("run=weir,codec={codec}"));
        assert!(!seen[i], "duplicate {i}");
        seen[i] = true;
        // Per-partition order: input order and offsets both increase.
        if let Some(prev) = last_index.insert(p.to_string(), i as i64) {
            assert!(prev < i as i64, "partition {p} out of order");
        }
        if let Some(prev) = last_offset.insert(p.to_string(), o) {
            assert_eq!(prev + 1, o, "partition {p} offsets not contiguous");
        }
    }
    assert!(
        seen.iter().all(|s| *s),
        "{codec}: {} of {n} records came back",
        seen.iter().filter(|s| **s).count()
    );
    assert_eq!(
        last_index.len(),
        3,
        "keyed records spread over the 3 partitions"
    );
}

#[test]
fn kcat_round_trips_with_every_compression() {
    require("kcat");
    let b = TestBroker::start_with(&["num.partitions=3"]);
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
        kcat_round_trip(&b.bootstrap, &format!("kcat-{codec}"), codec, 10_000);
    }
}

#[test]
fn kcat_sees_no_protocol_error_on_a_mostly_empty_topic() {
    require("kcat");
    let b = TestBroker::start_with(&["num.partitions=3"]);
    let mut child = kcat("30")
        .args(["-P", "-b", &b.bootstrap, "-t", "sparse", "-p", "1"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"only one\n")
        .unwrap();
    assert!(child.wait().unwrap().success());
    let out = kcat("30")
        .args([
            "-C",
            "-b",
            &b.bootstrap,
            "-t",
            "sparse",
            "-o",
            "beginning",
            "-e",
            "-d",
            "fetch,protocol",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stdout.trim(), "only one");
    for bad in [
        "Protocol parse failure",
        "_BAD_MSG",
        "unable to decode",
        "Underflow",
    ] {
        assert!(!stderr.contains(bad), "kcat logged {bad}:\n{stderr}");
    }
}

/// Runs `cmd args` from the repository root (at most 120 s); (success, stdout+stderr).
pub fn script(cmd: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new("timeout")
        .arg("120")
        .arg(cmd)
        .args(args)
        .current_dir(repo_root())
        .output()
        .expect("spawn script");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn python_clients_round_trip() {
    require("python3");
    let b = TestBroker::start_with(&["num.partitions=3"]);
    for client in ["confluent-kafka", "kafka-python", "aiokafka"] {
        let topic = format!("py-{client}");
        let (ok, text) = script(
            "python3",
            &[
                "tests/compat/roundtrip.py",
                &b.bootstrap,
                &topic,
                "1000",
                client,
            ],
        );
        assert!(
            ok && text.contains(&format!("{client} ok 1000/1000")),
            "{client}: {text}"
        );
    }
}

#[test]
fn kafkajs_round_trip() {
    require("node");
    let b = TestBroker::start_with(&["num.partitions=3"]);
    let (ok, text) = script(
        "node",
        &[
            "tests/compat/roundtrip.js",
            &b.bootstrap,
            "js-topic",
            "1000",
        ],
    );
    assert!(ok && text.contains("kafkajs ok"), "kafkajs: {text}");
}
