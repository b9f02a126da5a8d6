//! Issue 13: DescribeLogDirs (35) reports sizes. A real broker; `weir log-dirs describe`
//! (kafka-log-dirs.sh's JSON) and kafka-python's `KafkaAdminClient.describe_log_dirs()`
//! both report each partition's size, which grows as records are produced and equals the
//! bytes of the partition's `.log` files on disk.
//!
//! Issue 15: several `log.dirs`. Partitions are spread to the dir with the fewest, found
//! again in their dir at restart, every dir is locked, a partition in two dirs stops the
//! start, deletes reach every dir; DescribeLogDirs reports each dir with its own
//! partitions; AlterReplicaLogDirs (34) moves a partition while a librdkafka producer
//! writes to it; a full tmpfs log dir goes offline alone (KIP-112).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rdkafka::producer::FutureRecord;

use crate::harness::{wait_until, weir_bin, TestBroker};
use crate::rdkafka_client::{admin, create_topic, producer, read_partition, Writer};
use rdkafka::admin::AdminOptions;
use rdkafka::Offset;

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

/// Partition directories (`<topic>-<n>`, no suffix) of `topic` in `dir`.
fn partitions_in(dir: &Path, topic: &str) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| {
                    n.strip_prefix(&format!("{topic}-"))
                        .is_some_and(|rest| rest.parse::<i32>().is_ok())
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Partition directories (`<name>-<n>`) of any topic in `dir`.
fn all_partitions_in(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| {
            n.rsplit_once('-')
                .is_some_and(|(_, i)| i.parse::<i32>().is_ok())
        })
        .count()
}

/// `log.dirs=<root>/a,<root>/b,<root>/c` and those paths.
fn three_dirs(root: &Path) -> (String, [std::path::PathBuf; 3]) {
    let dirs = [root.join("a"), root.join("b"), root.join("c")];
    let list = dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(",");
    (format!("log.dirs={list}"), dirs)
}

/// `broker::run` with `log.dirs` = `dirs`: the error it stops with (it must not serve).
/// On a thread of its own, with a runtime of its own.
fn start_error(dirs: &str) -> String {
    let dirs = dirs.to_string();
    std::thread::spawn(move || start_error_on_this_thread(&dirs))
        .join()
        .expect("start thread")
}

fn start_error_on_this_thread(dirs: &str) -> String {
    let mut raw = weir::config::RawConfig::default();
    raw.set("listeners", "PLAINTEXT://127.0.0.1:0").unwrap();
    raw.set("log.dirs", dirs).unwrap();
    raw.set("admin.listeners", "").unwrap();
    let config = weir::config::BrokerConfig::from_raw(raw).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let err = rt
        .block_on(async {
            let listeners = weir::broker::bind(&config).await.unwrap();
            let (_tx, rx) = tokio::sync::watch::channel(false);
            tokio::time::timeout(
                Duration::from_secs(30),
                weir::broker::run(config, listeners, rx),
            )
            .await
            .expect("the broker refuses to start, it does not serve")
        })
        .unwrap_err();
    format!("{err:#}")
}

async fn send(p: &rdkafka::producer::FutureProducer, topic: &str, partition: i32, value: &str) {
    p.send(
        FutureRecord::to(topic)
            .partition(partition)
            .key("k")
            .payload(value),
        Duration::from_secs(30),
    )
    .await
    .expect("delivered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_spread_over_every_log_dir_and_are_found_there_after_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let (dirs_override, dirs) = three_dirs(tmp.path());
    let b = TestBroker::start_in(tmp.path(), &[&dirs_override]);
    create_topic(&b.bootstrap, "spread", 6, &[]).await;
    // Fewest partitions first (internal topics the broker made count too): the dirs stay
    // balanced within one partition, and the topic's six are spread over all three.
    let placed: Vec<Vec<String>> = dirs.iter().map(|d| partitions_in(d, "spread")).collect();
    assert!(placed.iter().all(|p| !p.is_empty()), "{placed:?}");
    assert_eq!(placed.iter().map(Vec::len).sum::<usize>(), 6, "{placed:?}");
    let hosted: Vec<usize> = dirs.iter().map(|d| all_partitions_in(d)).collect();
    assert!(
        hosted.iter().max().unwrap() - hosted.iter().min().unwrap() <= 1,
        "{hosted:?} {placed:?}"
    );
    // Broker-level files only in the metadata dir (the first), a lock in every one.
    assert!(dirs[0].join("__cluster_metadata").is_dir());
    for d in &dirs[1..] {
        assert!(!d.join("__cluster_metadata").exists(), "{}", d.display());
    }
    for d in &dirs {
        assert!(d.join(".lock").is_file(), "{}", d.display());
    }
    let p = producer(&b.bootstrap, &[("acks", "all")]);
    for partition in 0..6 {
        send(&p, "spread", partition, &format!("v{partition}")).await;
    }
    drop(p);
    // Another weir on any one of the dirs is refused, naming it.
    let other = tmp.path().join("other");
    let err = start_error(&format!("{},{}", other.display(), dirs[1].display()));
    assert!(
        err.contains("in use by another weir process")
            && err.contains(&dirs[1].display().to_string()),
        "{err}"
    );
    b.stop();

    // After a restart every partition is found in its dir, with its record.
    let b = TestBroker::start_in(tmp.path(), &[&dirs_override]);
    for partition in 0..6 {
        let got = read_partition(&b.bootstrap, "spread", partition, Offset::Beginning, 1);
        assert_eq!(got.len(), 1, "partition {partition}");
        assert_eq!(
            got[0].1.as_deref(),
            Some(format!("v{partition}").as_bytes())
        );
    }
    let placed_again: Vec<Vec<String>> = dirs.iter().map(|d| partitions_in(d, "spread")).collect();
    assert_eq!(placed_again, placed);
    // A delete reaches every dir.
    admin(&b.bootstrap)
        .delete_topics(&["spread"], &AdminOptions::new())
        .await
        .expect("delete_topics")
        .into_iter()
        .for_each(|r| {
            r.expect("deleted");
        });
    wait_until("every dir lost the deleted topic's directories", 30, || {
        dirs.iter().all(|d| {
            std::fs::read_dir(d)
                .unwrap()
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .all(|n| !n.starts_with("spread-"))
        })
    });
    b.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_in_two_log_dirs_stops_the_start() {
    let tmp = tempfile::tempdir().unwrap();
    let (dirs_override, dirs) = three_dirs(tmp.path());
    let b = TestBroker::start_in(tmp.path(), &[&dirs_override]);
    create_topic(&b.bootstrap, "twice", 1, &[]).await;
    b.stop();
    assert_eq!(partitions_in(&dirs[0], "twice"), ["twice-0"]);
    // A stale copy of the partition in a second dir: which one is current cannot be told.
    std::fs::create_dir_all(dirs[2].join("twice-0")).unwrap();
    for entry in std::fs::read_dir(dirs[0].join("twice-0")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(
            entry.path(),
            dirs[2].join("twice-0").join(entry.file_name()),
        )
        .unwrap();
    }
    let list = dirs_override.strip_prefix("log.dirs=").unwrap();
    let err = start_error(list);
    assert!(err.contains("Duplicate log directories found"), "{err}");
    assert!(
        err.contains(&dirs[2].join("twice-0").display().to_string()),
        "{err}"
    );
    // Nothing was removed: both copies are still there for the operator.
    assert!(dirs[0].join("twice-0").is_dir() && dirs[2].join("twice-0").is_dir());
}

/// A log dir as `weir log-dirs describe` shows it: path, error, `(partition, size,
/// isFuture)` sorted.
type DirSeen = (String, Option<String>, Vec<(String, i64, bool)>);

/// `weir log-dirs describe`: each log dir of broker 1 with `(partition, size, isFuture)`.
fn cli_dirs(bootstrap: &str, topic: &str) -> Vec<DirSeen> {
    let out = Command::new("timeout")
        .arg("30")
        .arg(weir_bin())
        .args(["log-dirs", "describe", "--bootstrap-server", bootstrap])
        .args(["--broker-list", "1", "--topic-list", topic])
        .output()
        .expect("weir log-dirs describe");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let json: serde_json::Value =
        serde_json::from_str(text.lines().nth(2).expect("JSON line")).expect("JSON");
    json["brokers"][0]["logDirs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let mut parts: Vec<(String, i64, bool)> = d["partitions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    (
                        p["partition"].as_str().unwrap().to_string(),
                        p["size"].as_i64().unwrap(),
                        p["isFuture"].as_bool().unwrap(),
                    )
                })
                .collect();
            parts.sort();
            (
                d["logDir"].as_str().unwrap().to_string(),
                d["error"].as_str().map(str::to_string),
                parts,
            )
        })
        .collect()
}

/// `weir log-dirs move ... --wait`: the exit status and output.
fn cli_move(bootstrap: &str, topic: &str, partition: i32, dir: &str) -> (bool, String) {
    let out = Command::new("timeout")
        .arg("60")
        .arg(weir_bin())
        .args(["log-dirs", "move", "--bootstrap-server", bootstrap])
        .args([
            "--topic",
            topic,
            "--partition",
            &partition.to_string(),
            "--dir",
            dir,
        ])
        .args(["--broker", "1"])
        .args(["--wait", "--timeout-ms", "50000"])
        .output()
        .expect("weir log-dirs move");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_log_dirs_reports_each_dir_with_its_own_partitions() {
    let tmp = tempfile::tempdir().unwrap();
    let (dirs_override, dirs) = three_dirs(tmp.path());
    let b = TestBroker::start_in(tmp.path(), &[&dirs_override]);
    create_topic(&b.bootstrap, TOPIC, 3, &[]).await;
    let p = producer(&b.bootstrap, &[("acks", "all"), ("linger.ms", "0")]);
    for (partition, n) in [(0, 30), (1, 60), (2, 90)] {
        for i in 0..n {
            send(&p, TOPIC, partition, &format!("value {i}")).await;
        }
    }
    let seen = cli_dirs(&b.bootstrap, TOPIC);
    assert_eq!(seen.len(), 3, "{seen:?}");
    let mut listed = 0;
    for (i, (dir, error, parts)) in seen.iter().enumerate() {
        assert_eq!(
            Path::new(dir).canonicalize().unwrap(),
            dirs[i].canonicalize().unwrap()
        );
        assert_eq!(*error, None);
        let on_disk: Vec<(String, i64, bool)> = partitions_in(&dirs[i], TOPIC)
            .into_iter()
            .map(|name| {
                let bytes: i64 = std::fs::read_dir(dirs[i].join(&name))
                    .unwrap()
                    .map(|e| e.unwrap().path())
                    .filter(|p| p.extension().is_some_and(|e| e == "log"))
                    .map(|p| std::fs::metadata(p).unwrap().len() as i64)
                    .sum();
                assert!(bytes > 0);
                (name, bytes, false)
            })
            .collect();
        assert_eq!(
            *parts, on_disk,
            "dir {dir}: its own partitions, sizes as on disk"
        );
        listed += parts.len();
    }
    assert_eq!(listed, 3);
    assert!(
        seen.iter().filter(|d| !d.2.is_empty()).count() >= 2,
        "{seen:?}"
    );
    // kafka-python: three dirs, each naming only its own partition.
    let script = r#"
import json, sys
from kafka import KafkaAdminClient
admin = KafkaAdminClient(bootstrap_servers=sys.argv[1], request_timeout_ms=20000)
out = []
for d in admin.describe_log_dirs()[0]["log_dirs"]:
    parts = sorted(p["partition_index"] for t in d["topics"] if t["name"] == sys.argv[2] for p in t["partitions"])
    out.append([d["log_dir"], d["error_code"], parts])
print(json.dumps(out))
admin.close()
"#;
    let out = Command::new("timeout")
        .args(["60", "python3", "-c", script, &b.bootstrap, TOPIC])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).expect("JSON");
    let dirs_seen: Vec<(String, i64, Vec<i64>)> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d[0].as_str().unwrap().to_string(),
                d[1].as_i64().unwrap(),
                d[2].as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_i64().unwrap())
                    .collect(),
            )
        })
        .collect();
    assert_eq!(dirs_seen.len(), 3, "{dirs_seen:?}");
    for (i, (dir, code, parts)) in dirs_seen.iter().enumerate() {
        assert_eq!(
            Path::new(dir).canonicalize().unwrap(),
            dirs[i].canonicalize().unwrap()
        );
        let on_disk: Vec<i64> = partitions_in(&dirs[i], TOPIC)
            .iter()
            .map(|n| n.rsplit_once('-').unwrap().1.parse().unwrap())
            .collect();
        assert_eq!((*code, parts.clone()), (0, on_disk), "dir {dir}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_moves_to_another_log_dir_while_a_producer_writes() {
    const MOVING: &str = "moving";
    let tmp = tempfile::tempdir().unwrap();
    let (dirs_override, dirs) = three_dirs(tmp.path());
    // Small segments: the move copies many closed segments while the producer appends.
    let b = TestBroker::start_in(tmp.path(), &[&dirs_override]);
    create_topic(&b.bootstrap, MOVING, 1, &[("segment.bytes", "65536")]).await;
    let from = dirs
        .iter()
        .position(|d| partitions_in(d, MOVING) == [format!("{MOVING}-0")])
        .expect("placed in one dir");
    let to = (from + 1) % 3;
    let writer = Writer::spawn(&b.bootstrap, MOVING, 1_000_000, |i| {
        (
            format!("k{i}"),
            format!("{i:08} {}", "x".repeat(200)),
            Some(0),
        )
    });
    wait_until("a few segments are written", 30, || {
        std::fs::read_dir(dirs[from].join(format!("{MOVING}-0")))
            .map(|e| {
                e.filter(|e| {
                    e.as_ref()
                        .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "log"))
                })
                .count()
                    >= 5
            })
            .unwrap_or(false)
    });
    let dest = dirs[to].display().to_string();
    let high_watermark_before = crate::rdkafka_client::high_watermark(&b.bootstrap, MOVING, 0);
    let (ok, text) = cli_move(&b.bootstrap, MOVING, 0, &dest);
    assert!(ok, "{text}");
    let high_watermark_after = crate::rdkafka_client::high_watermark(&b.bootstrap, MOVING, 0);
    // The producer went on during the move (not a proof of overlap, a sign of it).
    eprintln!("moved at offsets {high_watermark_before}..{high_watermark_after}");
    assert!(
        text.contains(&format!("Moved {MOVING}-0 on broker 1 to {dest}")),
        "{text}"
    );
    // Writes go on after the move, to the new files.
    let new_dir = dirs[to].join(format!("{MOVING}-0"));
    let size = |d: &Path| -> u64 {
        std::fs::read_dir(d)
            .map(|e| {
                e.filter_map(|e| e.ok()?.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    };
    let moved_size = size(&new_dir);
    wait_until("the producer writes to the new dir", 30, || {
        size(&new_dir) > moved_size
    });
    let (written, delivered) = tokio::task::spawn_blocking(move || writer.stop())
        .await
        .unwrap();
    assert!(delivered, "every record delivered");
    assert!(written as i64 > high_watermark_after);
    eprintln!("{written} records written");
    assert_eq!(partitions_in(&dirs[to], MOVING), [format!("{MOVING}-0")]);
    wait_until("the old copy is removed", 30, || {
        std::fs::read_dir(&dirs[from])
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .all(|n| !n.starts_with(&format!("{MOVING}-0")))
    });
    let seen = cli_dirs(&b.bootstrap, MOVING);
    assert_eq!(seen[from].2, []);
    assert_eq!(seen[to].2.len(), 1);
    assert_eq!(seen[to].2[0].0, format!("{MOVING}-0"));
    let check = move |bootstrap: &str| {
        let got = read_partition(bootstrap, MOVING, 0, Offset::Beginning, written);
        assert_eq!(got.len(), written, "every record once");
        for (i, m) in got.iter().enumerate() {
            let v = String::from_utf8(m.1.clone().unwrap()).unwrap();
            assert_eq!(
                &v[..8],
                format!("{i:08}"),
                "record {i} in order, exactly once"
            );
            assert_eq!(m.2, i as i64);
        }
    };
    let bootstrap = b.bootstrap.clone();
    tokio::task::spawn_blocking(move || check(&bootstrap))
        .await
        .unwrap();
    // Errors as Kafka's: an unknown dir, a partition not hosted.
    let (ok, text) = cli_move(&b.bootstrap, MOVING, 0, "/no/such/dir");
    assert!(!ok && text.contains("LOG_DIR_NOT_FOUND (57)"), "{text}");
    let (ok, text) = cli_move(&b.bootstrap, MOVING, 7, &dest);
    assert!(
        !ok && text.contains("UNKNOWN_TOPIC_OR_PARTITION (3)"),
        "{text}"
    );
    b.stop();
    // A restart keeps the partition in its new dir, every record there.
    let b = TestBroker::start_in(tmp.path(), &[&dirs_override]);
    assert_eq!(partitions_in(&dirs[to], MOVING), [format!("{MOVING}-0")]);
    assert_eq!(partitions_in(&dirs[from], MOVING), Vec::<String>::new());
    let bootstrap = b.bootstrap.clone();
    tokio::task::spawn_blocking(move || check(&bootstrap))
        .await
        .unwrap();
}

/// Unmounts a test's tmpfs (lazily: a file still open does not keep it).
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Error codes of ListOffsets (latest) and Fetch for partition `partition` of `topic`.
fn list_and_fetch_errors(bootstrap: &str, topic: &str, partition: i32) -> (i16, i16) {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::{
        BrokerId, FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse, TopicName,
    };
    use kafka_protocol::protocol::StrBytes;
    let name = || TopicName(StrBytes::from_string(topic.to_string()));
    let mut conn = crate::harness::RawConn::connect(bootstrap);
    let list = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(name())
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(partition)
                .with_timestamp(-1)])]);
    let body = conn.request(&list, 1, 1).expect("ListOffsets answer");
    let r: ListOffsetsResponse = crate::harness::decode(body, 1);
    let list_error = r.topics[0].partitions[0].error_code;
    let fetch = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(name())
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(0)
                .with_partition_max_bytes(1 << 20)])]);
    let body = conn.request(&fetch, 4, 2).expect("Fetch answer");
    let r: FetchResponse = crate::harness::decode(body, 4);
    (list_error, r.responses[0].partitions[0].error_code)
}

/// KIP-112: a log dir that fails takes only its own partitions offline. The failure is
/// the one users meet most, a full disk: the second dir is a 2 MiB tmpfs filled by
/// 64 KiB records until one fails (ENOSPC). Where a tmpfs cannot be mounted (no
/// CAP_SYS_ADMIN), the dir fails another real way instead, said on stderr: the
/// partition's directory is replaced by a plain file under the running broker (a disk
/// pulled or a directory removed by hand), so the next segment roll (256 KiB segments)
/// fails (ENOTDIR). Either way: the produce fails, DescribeLogDirs reports that dir with
/// KafkaStorageError, ListOffsets and Fetch answer 56 on its partition and 0 on the
/// other dir's, which still takes and serves records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_log_dir_goes_offline_and_only_its_partitions_with_it() {
    const FULL: &str = "filling";
    let tmp = tempfile::tempdir().unwrap();
    let (big, small) = (tmp.path().join("big"), tmp.path().join("small"));
    std::fs::create_dir_all(&big).unwrap();
    std::fs::create_dir_all(&small).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(&small)
        .output();
    let _unmount = if mounted.as_ref().is_ok_and(|o| o.status.success()) {
        Some(Mounted(small.clone()))
    } else {
        eprintln!(
            "a_full_log_dir_goes_offline...: cannot mount a tmpfs ({mounted:?}); the dir \
             fails by its partition directory replaced with a file instead"
        );
        None
    };
    let list = format!("log.dirs={},{}", big.display(), small.display());
    let b = TestBroker::start_in(tmp.path(), &[&list]);
    create_topic(&b.bootstrap, FULL, 4, &[("segment.bytes", "262144")]).await;
    let index = |n: &String| -> i32 { n.rsplit_once('-').unwrap().1.parse().unwrap() };
    let healthy = index(&partitions_in(&big, FULL)[0]);
    let filled = index(&partitions_in(&small, FULL)[0]);
    if _unmount.is_none() {
        let dir = small.join(format!("{FULL}-{filled}"));
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::write(&dir, b"not a directory").unwrap();
    }
    // Fill the 2 MiB dir: 64 KiB records to partition 1 until one fails (ENOSPC).
    let p = producer(
        &b.bootstrap,
        &[
            ("acks", "all"),
            ("linger.ms", "0"),
            ("message.timeout.ms", "5000"),
        ],
    );
    let value = "y".repeat(64 * 1024);
    let mut failed = None;
    for _ in 0..100 {
        let r = p
            .send(
                FutureRecord::to(FULL)
                    .partition(filled)
                    .key("k")
                    .payload(&value),
                Duration::from_secs(10),
            )
            .await;
        if let Err((e, _)) = r {
            failed = Some(e);
            break;
        }
    }
    assert!(failed.is_some(), "6 MiB went into a failed log dir");
    // The dir is offline: DescribeLogDirs says so; its partition answers 56 to ListOffsets
    // and Fetch; the other dir's partition works on.
    let seen = cli_dirs(&b.bootstrap, FULL);
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].1, None, "{seen:?}");
    assert_eq!(seen[1].1.as_deref(), Some("KafkaStorageError"), "{seen:?}");
    assert_eq!(seen[1].2, []);
    let bootstrap = b.bootstrap.clone();
    let errors = tokio::task::spawn_blocking(move || {
        (
            list_and_fetch_errors(&bootstrap, FULL, filled),
            list_and_fetch_errors(&bootstrap, FULL, healthy),
        )
    })
    .await
    .unwrap();
    assert_eq!(errors, ((56, 56), (0, 0)));
    send(&p, FULL, healthy, "still here").await;
    let bootstrap = b.bootstrap.clone();
    let got = tokio::task::spawn_blocking(move || {
        read_partition(&bootstrap, FULL, healthy, Offset::Beginning, 1)
    })
    .await
    .unwrap();
    assert_eq!(got[0].1.as_deref(), Some(&b"still here"[..]));
    drop(p);
    b.stop();
}

/// Copies the files of directory `from` into a new directory `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_a_stop_interrupted_leaves_exactly_one_copy() {
    const T: &str = "interrupted";
    let tmp = tempfile::tempdir().unwrap();
    let (dirs_override, dirs) = three_dirs(tmp.path());
    let b = TestBroker::start_in(tmp.path(), &[&dirs_override]);
    create_topic(&b.bootstrap, T, 1, &[]).await;
    let p = producer(&b.bootstrap, &[("acks", "all")]);
    for i in 0..20 {
        send(&p, T, 0, &format!("r{i}")).await;
    }
    drop(p);
    b.stop();
    let from = dirs
        .iter()
        .position(|d| partitions_in(d, T) == [format!("{T}-0")])
        .unwrap();
    let to = (from + 1) % 3;
    let source = dirs[from].join(format!("{T}-0"));
    let id = "0123456789abcdef0123456789abcdef";
    let future = dirs[to].join(format!("{T}-0.{id}-future"));
    let read_all = |bootstrap: String| {
        std::thread::spawn(move || read_partition(&bootstrap, T, 0, Offset::Beginning, 20))
            .join()
            .unwrap()
    };

    // Stopped before the commit: the source is kept, the (partial) copy discarded.
    copy_dir(&source, &future);
    std::fs::remove_file(future.join("00000000000000000000.log")).unwrap();
    let b = TestBroker::start_in(tmp.path(), &[&dirs_override]);
    assert_eq!(read_all(b.bootstrap.clone()).len(), 20);
    assert!(source.is_dir() && !dirs[to].join(format!("{T}-0")).exists());
    wait_until("the uncommitted copy is removed", 30, || !future.exists());
    b.stop();

    // Stopped between the two renames (source renamed away, copy not yet in place): the
    // copy, complete, becomes the partition.
    copy_dir(&source, &future);
    std::fs::rename(&source, dirs[from].join(format!("{T}-0.{id}-delete"))).unwrap();
    let b = TestBroker::start_in(tmp.path(), &[&dirs_override]);
    let got = read_all(b.bootstrap.clone());
    assert_eq!(got.len(), 20);
    assert_eq!(got[19].1.as_deref(), Some(&b"r19"[..]));
    assert_eq!(partitions_in(&dirs[to], T), [format!("{T}-0")]);
    assert!(!source.exists() && !future.exists());
    wait_until("the old copy is removed", 30, || {
        !dirs[from].join(format!("{T}-0.{id}-delete")).exists()
    });
    b.stop();
}
