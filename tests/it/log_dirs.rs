//! Issue 13: DescribeLogDirs (35) reports sizes. A real broker; `weir log-dirs describe`
//! (kafka-log-dirs.sh's JSON) and kafka-python's `KafkaAdminClient.describe_log_dirs()`
//! both report each partition's size, which grows as records are produced and equals the
//! bytes of the partition's `.log` files on disk.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rdkafka::producer::FutureRecord;

use crate::harness::{weir_bin, TestBroker};
use crate::rdkafka_client::{create_topic, producer};

const TOPIC: &str = "sized";

/// Bytes of the `.log` segment files of `dir/TOPIC-partition`.
fn on_disk(dir: &Path, partition: i32) -> i64 {
    std::fs::read_dir(dir.join(format!("{TOPIC}-{partition}")))
        .expect("partition dir")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .map(|p| std::fs::metadata(p).unwrap().len() as i64)
        .sum()
}

/// `weir log-dirs describe --topic-list TOPIC`: the sizes of partitions 0 and 1, the log
/// dir and its error.
fn cli_sizes(bootstrap: &str) -> ([i64; 2], String, serde_json::Value) {
    let out = Command::new("timeout")
        .arg("30")
        .arg(weir_bin())
        .args(["log-dirs", "describe", "--bootstrap-server", bootstrap])
        .args(["--broker-list", "1", "--topic-list", TOPIC])
        .output()
        .expect("weir log-dirs describe");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[..2],
        [
            "Querying brokers for log directories information",
            "Received log directory information from brokers 1"
        ],
        "{text}"
    );
    let json: serde_json::Value = serde_json::from_str(lines[2]).expect("JSON");
    let dir = &json["brokers"][0]["logDirs"][0];
    let mut sizes = [-1, -1];
    for p in dir["partitions"].as_array().expect("partitions") {
        let name = p["partition"].as_str().unwrap();
        let index: usize = name.strip_prefix("sized-").unwrap().parse().unwrap();
        sizes[index] = p["size"].as_i64().unwrap();
        assert_eq!(p["offsetLag"], 0);
        assert_eq!(p["isFuture"], false);
    }
    (
        sizes,
        dir["logDir"].as_str().unwrap().to_string(),
        dir["error"].clone(),
    )
}

/// kafka-python's `describe_log_dirs()`: the sizes of partitions 0 and 1 of TOPIC.
fn kafka_python_sizes(bootstrap: &str) -> [i64; 2] {
    let script = r#"
import json, sys
from kafka import KafkaAdminClient
admin = KafkaAdminClient(bootstrap_servers=sys.argv[1], request_timeout_ms=20000)
print(json.dumps(admin.describe_log_dirs()))
admin.close()
"#;
    let out = Command::new("timeout")
        .args(["60", "python3", "-c", script, bootstrap])
        .output()
        .expect("python3");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_str(text.trim()).expect("JSON");
    let mut sizes = [-1, -1];
    for dir in json[0]["log_dirs"].as_array().expect("log_dirs") {
        assert_eq!(dir["error_code"], 0, "{dir}");
        for t in dir["topics"].as_array().unwrap() {
            if t["name"] != TOPIC {
                continue;
            }
            for p in t["partitions"].as_array().unwrap() {
                let i = p["partition_index"].as_u64().unwrap() as usize;
                sizes[i] = p["partition_size"].as_i64().unwrap();
            }
        }
    }
    sizes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_dirs_report_partition_sizes_that_match_the_disk() {
    let b = TestBroker::start();
    create_topic(&b.bootstrap, TOPIC, 2, &[]).await;
    let (before, dir, error) = cli_sizes(&b.bootstrap);
    assert_eq!(before, [0, 0]);
    assert!(error.is_null(), "{error}");
    assert_eq!(
        Path::new(&dir).canonicalize().unwrap(),
        b.data_dir.canonicalize().unwrap()
    );

    let p = producer(&b.bootstrap, &[("acks", "all"), ("linger.ms", "0")]);
    for (partition, n) in [(0, 200), (1, 50)] {
        for i in 0..n {
            let value = format!("value {i} {}", "x".repeat(i % 40));
            p.send(
                FutureRecord::to(TOPIC)
                    .partition(partition)
                    .key("k")
                    .payload(&value),
                Duration::from_secs(30),
            )
            .await
            .expect("delivered");
        }
    }
    let disk = [on_disk(&b.data_dir, 0), on_disk(&b.data_dir, 1)];
    assert!(disk[0] > disk[1] && disk[1] > 0, "{disk:?}");
    let (after, _, _) = cli_sizes(&b.bootstrap);
    assert_eq!(after, disk, "weir log-dirs describe against the .log files");
    let python = kafka_python_sizes(&b.bootstrap);
    assert_eq!(python, disk, "kafka-python against the .log files");
}
