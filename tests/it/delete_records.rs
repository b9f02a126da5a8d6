//! Issue 15: DeleteRecords (key 21). librdkafka's admin `delete_records` moves the log
//! start offset; a consumer from the beginning then starts there, ListOffsets earliest
//! (`fetch_watermarks`) answers it, a raw Fetch below it is OFFSET_OUT_OF_RANGE, and all
//! of that holds after a restart. Offsets above the high watermark and unknown topics
//! get Kafka's error codes. On three nodes with replication factor 3 the followers take
//! the leader's new log start from their Fetch responses: after the leader is killed the
//! new leader answers the same earliest offset.
//!
//! Every wait is bounded; brokers stop on drop (or explicitly before a restart).

use std::time::{Duration, Instant};

use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, BrokerId, DeleteRecordsRequest,
    DeleteRecordsResponse, FetchRequest, FetchResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::AdminOptions;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};

use crate::harness::{decode, poll_for, wait_until, RawConn, TestBroker};
use crate::rdkafka_client::{admin, create_topic, producer};

const TOPIC: &str = "del-rec";

fn watermarks(bootstrap: &str, topic: &str) -> Result<(i64, i64), String> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .map_err(|e| e.to_string())?;
    c.fetch_watermarks(topic, 0, Duration::from_secs(10))
        .map_err(|e| e.to_string())
}

/// The offset of the first record a consumer assigned at Beginning of partition 0 reads
/// (at most 30 s).
fn first_offset_from_beginning(bootstrap: &str, topic: &str) -> i64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "del-rec-no-commits")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            Instant::now() < deadline,
            "no record read from the beginning"
        );
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            return m.offset();
        }
    }
}

/// librdkafka's DeleteRecords for partition 0 of `topic` at `offset`: the low watermark or
/// the per-partition error.
async fn delete_records(
    bootstrap: &str,
    topic: &str,
    offset: Offset,
) -> Result<i64, RDKafkaErrorCode> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, offset).unwrap();
    let out = admin(bootstrap)
        .delete_records(
            &tpl,
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("delete_records request");
    let elem = out
        .find_partition(topic, 0)
        .expect("partition in the answer");
    match elem.error() {
        Ok(()) => match elem.offset() {
            Offset::Offset(o) => Ok(o),
            other => panic!("low watermark {other:?}"),
        },
        Err(e) => Err(e
            .rdkafka_error_code()
            .unwrap_or_else(|| panic!("unexpected error {e:?}"))),
    }
}

fn raw_fetch_error(bootstrap: &str, topic: &str, offset: i64) -> (i16, i64) {
    let mut c = RawConn::connect(bootstrap);
    let req = FetchRequest::default()
        .with_max_wait_ms(0)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(1 << 20)])]);
    let resp: FetchResponse = decode(c.request(&req, 11, 1).unwrap(), 11);
    let part = &resp.responses[0].partitions[0];
    (part.error_code, part.log_start_offset)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_records_moves_the_log_start_durably() {
    let dir = tempfile::tempdir().unwrap();
    let b = TestBroker::start_in(dir.path(), &[]);
    // Small segments so whole segments fall below the new start and go.
    create_topic(&b.bootstrap, TOPIC, 1, &[("segment.bytes", "2048")]).await;
    let p = producer(&b.bootstrap, &[("linger.ms", "0")]);
    for i in 0..100 {
        p.send(
            FutureRecord::to(TOPIC)
                .key("k")
                .payload(&format!("{i:05}-{}", "x".repeat(60)))
                .partition(0),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    }
    let partition_dir = dir.path().join(format!("{TOPIC}-0"));
    let segments = || {
        std::fs::read_dir(&partition_dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "log")
            })
            .count()
    };
    let before = segments();
    assert!(before > 2, "small segments rolled: {before}");

    assert_eq!(
        delete_records(&b.bootstrap, TOPIC, Offset::Offset(57)).await,
        Ok(57)
    );
    assert!(segments() < before, "segments wholly below 57 deleted");
    assert_eq!(watermarks(&b.bootstrap, TOPIC).unwrap(), (57, 100));
    assert_eq!(first_offset_from_beginning(&b.bootstrap, TOPIC), 57);
    assert_eq!(raw_fetch_error(&b.bootstrap, TOPIC, 10), (1, 57));
    // Below the start: nothing changes, the answer is the start.
    assert_eq!(
        delete_records(&b.bootstrap, TOPIC, Offset::Offset(5)).await,
        Ok(57)
    );
    // Above the high watermark: OFFSET_OUT_OF_RANGE (1).
    assert_eq!(
        delete_records(&b.bootstrap, TOPIC, Offset::Offset(101)).await,
        Err(RDKafkaErrorCode::OffsetOutOfRange)
    );

    // Advertised in ApiVersions at the versions handled.
    let mut c = RawConn::connect(&b.bootstrap);
    let versions: ApiVersionsResponse =
        decode(c.request(&ApiVersionsRequest::default(), 3, 6).unwrap(), 3);
    let advertised = versions
        .api_keys
        .iter()
        .find(|a| a.api_key == ApiKey::DeleteRecords as i16)
        .map(|a| (a.min_version, a.max_version));
    assert_eq!(advertised, Some((0, 2)));
    // A raw request: unknown topic → 3; -1 → the high watermark.
    let req = DeleteRecordsRequest::default()
        .with_timeout_ms(1000)
        .with_topics(vec![
            DeleteRecordsTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("no-such-topic")))
                .with_partitions(vec![DeleteRecordsPartition::default()
                    .with_partition_index(0)
                    .with_offset(0)]),
            DeleteRecordsTopic::default()
                .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
                .with_partitions(vec![DeleteRecordsPartition::default()
                    .with_partition_index(0)
                    .with_offset(-1)]),
        ]);
    let resp: DeleteRecordsResponse = decode(c.request(&req, 2, 7).unwrap(), 2);
    assert_eq!(resp.topics[0].partitions[0].error_code, 3);
    assert_eq!(resp.topics[1].partitions[0].error_code, 0);
    assert_eq!(resp.topics[1].partitions[0].low_watermark, 100);
    // Back to a start inside a segment for the restart check: records 100..110.
    for i in 100..110 {
        p.send(
            FutureRecord::to(TOPIC)
                .key("k")
                .payload(&format!("{i:05}"))
                .partition(0),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    }
    assert_eq!(
        delete_records(&b.bootstrap, TOPIC, Offset::Offset(103)).await,
        Ok(103)
    );
    drop(p);
    b.stop();

    let b = TestBroker::start_in(dir.path(), &[]);
    let wm = poll_for("watermarks after the restart", 30, || {
        watermarks(&b.bootstrap, TOPIC)
    });
    assert_eq!(wm, (103, 110));
    assert_eq!(first_offset_from_beginning(&b.bootstrap, TOPIC), 103);
    assert_eq!(raw_fetch_error(&b.bootstrap, TOPIC, 100), (1, 103));
    b.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_take_the_leaders_log_start_offset() {
    use crate::cluster_fixture::{produce_keyed, ThreeNodes};
    use crate::metrics::scrape;
    use crate::replication::{create_rf3, describe};

    let mut nodes = ThreeNodes::start(&[]);
    let all = nodes.bootstrap_all();
    create_rf3(&all, TOPIC, 1, &[("min.insync.replicas", "2")]).await;
    produce_keyed(&all, TOPIC, 100, Some(1))
        .await
        .assert_all_acked(100);
    assert_eq!(
        delete_records(&all, TOPIC, Offset::Offset(60)).await,
        Ok(60)
    );
    let leader = describe(&all, TOPIC).unwrap()[0].leader;
    let partition = [("topic", TOPIC), ("partition", "0")];
    for (id, n) in nodes.running() {
        wait_until(&format!("node {id} log start at 60"), 30, || {
            scrape(&n.admin_url).get("weir_partition_log_start_offset", &partition) == Some(60.0)
        });
    }
    nodes.kill9(leader);
    let survivors: Vec<String> = nodes.running().map(|(id, _)| nodes.bootstrap(id)).collect();
    let survivors = survivors.join(",");
    poll_for("a new leader", 60, || {
        let d = describe(&survivors, TOPIC)?;
        match d[0].leader {
            l if l > 0 && l != leader => Ok(l),
            l => Err(format!("leader {l}")),
        }
    });
    let wm = poll_for("watermarks from the new leader", 60, || {
        let w = watermarks(&survivors, TOPIC)?;
        if w.1 == 100 {
            Ok(w)
        } else {
            Err(format!("{w:?}"))
        }
    });
    assert_eq!(wm, (60, 100));
    assert_eq!(first_offset_from_beginning(&survivors, TOPIC), 60);
    nodes.assert_no_panic();
}

/// Runs the `weir` binary with `args` under `timeout 60`; (exit code, stdout, stderr).
fn weir(args: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new("timeout")
        .arg("60")
        .arg(crate::harness::weir_bin())
        .args(args)
        .output()
        .expect("run weir");
    assert_ne!(out.status.code(), Some(124), "weir {args:?} timed out");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weir_topic_delete_records_prints_low_watermarks_and_errors() {
    let b = TestBroker::start();
    let bs = b.bootstrap.as_str();
    create_topic(bs, "cli-del", 2, &[]).await;
    let p = producer(bs, &[("linger.ms", "0")]);
    for i in 0..20 {
        p.send(
            FutureRecord::to("cli-del")
                .key("k")
                .payload(&format!("{i}"))
                .partition(i % 2),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    }
    let (code, out, err) = weir(&[
        "topic",
        "delete-records",
        "cli-del",
        "--partition",
        "0",
        "--offset",
        "4",
        "-b",
        bs,
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, "partition: cli-del-0\tlow_watermark: 4\n");
    assert_eq!(watermarks(bs, "cli-del").unwrap(), (4, 10));

    // kafka-delete-records.sh's JSON: -1 (everything) on partition 1, too far on 0.
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("offsets.json");
    std::fs::write(
        &json,
        r#"{"partitions": [{"topic": "cli-del", "partition": 1, "offset": -1},
                           {"topic": "cli-del", "partition": 0, "offset": 99}], "version": 1}"#,
    )
    .unwrap();
    let (code, out, err) = weir(&[
        "topic",
        "delete-records",
        "--offset-json-file",
        json.to_str().unwrap(),
        "-b",
        bs,
    ]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("partition: cli-del-1\tlow_watermark: 10\n"),
        "{out}"
    );
    assert!(
        out.contains("partition: cli-del-0\terror: OFFSET_OUT_OF_RANGE"),
        "{out}"
    );
    assert!(err.contains("failed for 1 of 2 partitions"), "{err}");
}

/// A consumer's Fetch parked on too few bytes (`min_bytes` above what the partition
/// holds) when DeleteRecords moves the log start past what it read: the answer must not
/// carry the deleted records. The park answers a quiet deadline with its first read
/// (issue 17), so the move of the log start wakes it and it reads again: the fetch offset
/// is now below the log start, OFFSET_OUT_OF_RANGE (1) with the new log start, at once
/// rather than at the 30 s deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_fetch_does_not_return_records_deleted_while_it_waited() {
    const PARKED: &str = "del-rec-parked";
    let b = TestBroker::start();
    create_topic(&b.bootstrap, PARKED, 1, &[]).await;
    let p = producer(&b.bootstrap, &[("linger.ms", "0")]);
    for i in 0..3 {
        p.send(
            FutureRecord::to(PARKED)
                .key("k")
                .payload(&format!("old-{i}"))
                .partition(0),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    }
    let bootstrap = b.bootstrap.clone();
    let parked = std::thread::spawn(move || {
        let mut c = RawConn::connect(&bootstrap);
        let req = FetchRequest::default()
            .with_max_wait_ms(30_000)
            .with_min_bytes(1 << 20)
            .with_max_bytes(1 << 20)
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_string(PARKED.to_string())))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(0)
                    .with_fetch_offset(0)
                    .with_partition_max_bytes(1 << 20)])]);
        let started = Instant::now();
        let resp: FetchResponse = decode(c.request(&req, 11, 1).unwrap(), 11);
        (resp, started.elapsed())
    });
    // The fetch has read the three records and parked by now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        delete_records(&b.bootstrap, PARKED, Offset::Offset(3)).await,
        Ok(3)
    );
    let (resp, waited) = parked.join().unwrap();
    let part = &resp.responses[0].partitions[0];
    assert_eq!(
        (part.error_code, part.log_start_offset),
        (1, 3),
        "the parked fetch read again after the delete"
    );
    assert!(
        part.records.as_ref().is_none_or(|r| r.is_empty()),
        "deleted records returned: {} bytes",
        part.records.as_ref().map_or(0, |r| r.len())
    );
    assert!(
        waited < Duration::from_secs(20),
        "answered at the deadline ({waited:?}), not when the log start moved"
    );
}
