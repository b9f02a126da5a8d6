//! Fetch semantics with raw requests (exact fields) and librdkafka: long polling, KIP-74,
//! offsets outside the log, empty partitions, LogAppendTime.

use std::time::{Duration, Instant};

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::message::{Message, Timestamp};
use rdkafka::producer::FutureRecord;
use rdkafka::Offset;

use crate::harness::{decode, RawConn, TestBroker};
use crate::rdkafka_client::{create_topic, producer, read_partition};

/// A consumer's Fetch of partition 0 of `topic` from `offset`, `max_bytes` for the
/// response and the partition alike, `min_bytes` 1.
fn fetch_request(topic: &str, offset: i64, max_wait_ms: i32, max_bytes: i32) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(max_bytes)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(max_bytes)])])
}

fn fetch(
    conn: &mut RawConn,
    topic: &str,
    offset: i64,
    max_wait_ms: i32,
    max_bytes: i32,
) -> FetchResponse {
    let req = fetch_request(topic, offset, max_wait_ms, max_bytes);
    decode(conn.request(&req, 11, 9).expect("a fetch response"), 11)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_waits_for_max_wait_or_a_produce() {
    let b = TestBroker::start();
    create_topic(&b.bootstrap, "idle", 1, &[]).await;
    let mut c = RawConn::connect(&b.bootstrap);
    // Idle: not answered before max_wait_ms (an idle consumer must not spin), and answered.
    let start = Instant::now();
    let r = fetch(&mut c, "idle", 0, 400, 1 << 20);
    assert!(
        start.elapsed() >= Duration::from_millis(380),
        "answered after {:?}",
        start.elapsed()
    );
    let p = &r.responses[0].partitions[0];
    assert_eq!(p.error_code, 0);
    assert_eq!(
        p.records.as_ref().map(|r| r.len()),
        Some(0),
        "empty, never null"
    );

    // A produce wakes a parked fetch long before its 20 s deadline.
    let bs = b.bootstrap.clone();
    let writer = tokio::spawn(async move {
        // Gives the fetch below time to park first; nothing outside the broker shows a
        // parked fetch to poll for. Were it not parked yet, the test would still pass
        // (the fetch would find the record at once): this only makes it test the wake-up.
        tokio::time::sleep(Duration::from_millis(300)).await;
        producer(&bs, &[])
            .send(
                FutureRecord::to("idle")
                    .key("k")
                    .payload("wake")
                    .partition(0),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    });
    let start = Instant::now();
    let r = tokio::task::spawn_blocking(move || fetch(&mut c, "idle", 0, 20_000, 1 << 20))
        .await
        .unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "not woken by the produce"
    );
    assert!(!r.responses[0].partitions[0]
        .records
        .as_ref()
        .unwrap()
        .is_empty());
    writer.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_batch_is_whole_and_out_of_range_offsets_are_errors() {
    let b = TestBroker::start();
    create_topic(&b.bootstrap, "big", 1, &[]).await;
    let p = producer(&b.bootstrap, &[("linger.ms", "0")]);
    for i in 0..3 {
        p.send(
            FutureRecord::to("big")
                .key("k")
                .payload(&format!("{i}-{}", "z".repeat(5000)))
                .partition(0),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    }
    let mut c = RawConn::connect(&b.bootstrap);
    // max_bytes 100 < one batch: the first batch still comes, whole (KIP-74), and only it.
    let r = fetch(&mut c, "big", 0, 0, 100);
    let p0 = &r.responses[0].partitions[0];
    let bytes = p0.records.clone().unwrap();
    let batch_len = u32::from_be_bytes(bytes[8..12].try_into().unwrap()) as usize + 12;
    assert!(batch_len > 5000);
    assert_eq!(bytes.len(), batch_len);
    assert_eq!(p0.high_watermark, 3);
    assert_eq!(p0.last_stable_offset, 3);
    assert_eq!(p0.log_start_offset, 0);
    // At the log end: empty, no error. Above it: OFFSET_OUT_OF_RANGE (1).
    let r = fetch(&mut c, "big", 3, 0, 1 << 20);
    assert_eq!(r.responses[0].partitions[0].error_code, 0);
    let r = fetch(&mut c, "big", 4, 0, 1 << 20);
    assert_eq!(r.responses[0].partitions[0].error_code, 1);
    let r = fetch(&mut c, "big", -5, 0, 1 << 20);
    assert_eq!(r.responses[0].partitions[0].error_code, 1);
    // Unknown topic: UNKNOWN_TOPIC_OR_PARTITION (3).
    let r = fetch(&mut c, "no-such-topic", 0, 0, 1 << 20);
    assert_eq!(r.responses[0].partitions[0].error_code, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_append_time_topics_stamp_batches_with_the_broker_clock() {
    let b = TestBroker::start();
    create_topic(
        &b.bootstrap,
        "lat",
        1,
        &[("message.timestamp.type", "LogAppendTime")],
    )
    .await;
    let before = weir::replica::now_ms();
    let p = producer(&b.bootstrap, &[]);
    let d = p
        .send(
            FutureRecord::to("lat")
                .key("k")
                .payload("v")
                .partition(0)
                .timestamp(1_000),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(d.offset, 0);
    let after = weir::replica::now_ms();
    let consumer_view = {
        use rdkafka::config::ClientConfig;
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &b.bootstrap)
            .set("group.id", "x")
            .create()
            .unwrap();
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition_offset("lat", 0, Offset::Beginning)
            .unwrap();
        c.assign(&tpl).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            assert!(Instant::now() < deadline);
            if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
                break m.timestamp();
            }
        }
    };
    match consumer_view {
        Timestamp::LogAppendTime(ts) => assert!(
            ts >= before && ts <= after,
            "{ts} not in [{before}, {after}]"
        ),
        other => panic!("expected LogAppendTime, got {other:?}"),
    }
    assert_eq!(
        read_partition(&b.bootstrap, "lat", 0, Offset::Beginning, 1).len(),
        1
    );
}

/// Bytes of record sets in the first topic of `r`.
fn record_bytes(r: &FetchResponse) -> usize {
    r.responses[0]
        .partitions
        .iter()
        .map(|p| p.records.as_ref().map_or(0, |x| x.len()))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_max_bytes_caps_what_a_request_can_ask_for() {
    let b = TestBroker::start_with(&["fetch.max.bytes=30000"]);
    create_topic(&b.bootstrap, "capped", 1, &[]).await;
    let p = producer(&b.bootstrap, &[("linger.ms", "0")]);
    for i in 0..20 {
        p.send(
            FutureRecord::to("capped")
                .key("k")
                .payload(&format!("{i}-{}", "c".repeat(5000)))
                .partition(0),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    }
    // The same partition listed 50 times, asking for 2 GB: the response stays near the cap.
    let mut c = RawConn::connect(&b.bootstrap);
    let part = FetchPartition::default()
        .with_partition(0)
        .with_fetch_offset(0)
        .with_partition_max_bytes(i32::MAX);
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(1)
        .with_max_bytes(i32::MAX)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_static_str("capped")))
            .with_partitions(vec![part; 50])]);
    let r: FetchResponse = decode(c.request(&req, 11, 3).unwrap(), 11);
    let total = record_bytes(&r);
    assert!(total > 0 && total <= 30_000, "{total} bytes of records");

    // A min_bytes beyond the cap counts as the cap (Kafka's fetchMinBytes), and whole
    // batches that stop short of it answer at once: the consumer is not parked until
    // max_wait_ms (30 s) for bytes the response could never hold. The bound tells an
    // answer at once from one at the deadline; it is not a speed check.
    let parked = req.with_min_bytes(i32::MAX).with_max_wait_ms(30_000);
    let started = std::time::Instant::now();
    let r: FetchResponse = decode(c.request(&parked, 11, 4).unwrap(), 11);
    let waited = started.elapsed();
    let total = record_bytes(&r);
    assert!(total > 0 && total <= 30_000, "{total} bytes of records");
    assert!(
        waited < Duration::from_secs(20),
        "answered after {waited:?}: parked until max_wait_ms"
    );
}

/// A Fetch of many partitions over several segments, with limits that cut batches: the
/// broker sending record sets from its files (`sendfile(2)`, the default) answers
/// byte for byte what the same broker copying them answers (restarted on the same log
/// dir with `fetch.sendfile.enable=false`), at Fetch v4 (non-flexible, names), v11, v12
/// (flexible) and v13 (topic ids), read_uncommitted and read_committed; every record set
/// is whole batches that decode; and the first broker did send sets from its files
/// (`weir_fetch_sendfile_bytes_total`), the second none (issue 17).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sendfile_answers_what_copying_answers() {
    let dir = tempfile::tempdir().unwrap();
    let sending = TestBroker::start_in(dir.path(), &["log.segment.bytes=60000"]);
    create_topic(&sending.bootstrap, "zc", 6, &[]).await;
    let p = producer(&sending.bootstrap, &[("linger.ms", "0")]);
    for i in 0..300 {
        p.send(
            FutureRecord::to("zc")
                .key("k")
                .payload(&format!("{i}-{}", "z".repeat(50 + i * 37 % 2000)))
                .partition((i % 6) as i32),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    }
    drop(p);
    let topic_id = topic_id(&sending.bootstrap, "zc");
    let request = |offset: i64, partition_max: i32, isolation: i8| {
        FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_min_bytes(1)
            .with_max_bytes(150_000)
            .with_isolation_level(isolation)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_static_str("zc")))
                .with_topic_id(topic_id)
                .with_partitions(
                    (0..6)
                        .map(|p| {
                            FetchPartition::default()
                                .with_partition(p)
                                .with_fetch_offset(offset)
                                .with_partition_max_bytes(partition_max)
                        })
                        .collect(),
                )])
    };
    let mut cases = Vec::new();
    for version in [4i16, 11, 12, 13] {
        for offset in [0i64, 7, 33] {
            for partition_max in [1, 3_000, 1 << 20] {
                for isolation in [0i8, 1] {
                    cases.push((version, offset, partition_max, isolation));
                }
            }
        }
    }
    let answers = |bootstrap: &str| -> Vec<bytes::Bytes> {
        let mut c = RawConn::connect(bootstrap);
        cases
            .iter()
            .map(|&(version, offset, partition_max, isolation)| {
                c.request(&request(offset, partition_max, isolation), version, 9)
                    .expect("a fetch response")
            })
            .collect()
    };
    let sent = answers(&sending.bootstrap);
    // The sets of 16 KiB or more went out of the files, not through memory.
    let sendfile_bytes = |admin_url: &str| {
        crate::metrics::scrape(admin_url).or_zero("weir_fetch_sendfile_bytes_total", &[])
    };
    assert!(
        sendfile_bytes(&sending.admin_url) > 0.0,
        "nothing sent from files"
    );
    drop(sending);
    let copying = TestBroker::start_in(
        dir.path(),
        &["log.segment.bytes=60000", "fetch.sendfile.enable=false"],
    );
    let copied = answers(&copying.bootstrap);
    assert_eq!(
        sendfile_bytes(&copying.admin_url),
        0.0,
        "sent from files while copying"
    );
    for (i, &(version, offset, partition_max, isolation)) in cases.iter().enumerate() {
        let case = format!(
            "v{version} offset {offset} partition_max {partition_max} isolation {isolation}"
        );
        assert_eq!(sent[i], copied[i], "{case}");
        let decoded: FetchResponse = decode(sent[i].clone(), version);
        let mut total = 0;
        for p in &decoded.responses[0].partitions {
            assert_eq!(p.error_code, 0, "{case}");
            let set = p.records.clone().unwrap_or_default();
            total += set.len();
            for batch in batch_ranges(&set) {
                assert!(batch.1 >= offset, "{case}: batch {batch:?}");
            }
        }
        assert!(total > 0, "{case}: nothing read");
    }
    assert_eq!(cases.len(), 72);
}

/// A parked Fetch of 200 partitions is answered once `min_bytes` is met over all of them
/// together, not by one partition's records alone, and well before `max_wait_ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_bytes_counts_every_partition_of_the_request() {
    let b = TestBroker::start();
    create_topic(&b.bootstrap, "wide", 200, &[]).await;
    let p = producer(&b.bootstrap, &[("linger.ms", "0")]);
    let send = |partition: i32| {
        let p = p.clone();
        async move {
            p.send(
                FutureRecord::to("wide")
                    .key("k")
                    .payload(&"m".repeat(1_000))
                    .partition(partition),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        }
    };
    // One record is about 1,070 bytes stored; min_bytes asks for more than one.
    let request = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(20_000)
        .with_min_bytes(1_500)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_static_str("wide")))
            .with_partitions(
                (0..200)
                    .map(|p| {
                        FetchPartition::default()
                            .with_partition(p)
                            .with_fetch_offset(0)
                            .with_partition_max_bytes(1 << 20)
                    })
                    .collect(),
            )]);
    let mut c = RawConn::connect(&b.bootstrap);
    let start = Instant::now();
    let fetch = tokio::task::spawn_blocking(move || {
        let r: FetchResponse = decode(c.request(&request, 11, 5).unwrap(), 11);
        (r, start.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    send(7).await;
    // One partition's record is not enough: still parked a while later.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !fetch.is_finished(),
        "answered with one record, below min_bytes"
    );
    send(150).await;
    let (r, elapsed) = fetch.await.unwrap();
    assert!(
        elapsed < Duration::from_secs(15),
        "answered after {elapsed:?}, not when min_bytes was met"
    );
    let with_records: Vec<i32> = r.responses[0]
        .partitions
        .iter()
        .filter(|p| p.records.as_ref().is_some_and(|r| !r.is_empty()))
        .map(|p| p.partition_index)
        .collect();
    assert_eq!(with_records, vec![7, 150]);
}

/// The id of `topic` from a Metadata v12 request.
fn topic_id(bootstrap: &str, topic: &str) -> uuid::Uuid {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{MetadataRequest, MetadataResponse};
    let mut c = RawConn::connect(bootstrap);
    let req = MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(topic.to_string()))))]));
    let resp: MetadataResponse = decode(c.request(&req, 12, 1).unwrap(), 12);
    resp.topics[0].topic_id
}

/// (base offset, last offset) of every whole batch in a record set, decoding each one
/// (CRC checked): a record set must be whole batches only.
fn batch_ranges(set: &bytes::Bytes) -> Vec<(i64, i64)> {
    let mut ranges = Vec::new();
    let mut rest = set.clone();
    while !rest.is_empty() {
        let len = 12 + i32::from_be_bytes(rest[8..12].try_into().unwrap()) as usize;
        assert!(len <= rest.len(), "a partial batch in a record set");
        let mut batch = rest.split_to(len);
        let base = i64::from_be_bytes(batch[0..8].try_into().unwrap());
        let delta = i32::from_be_bytes(batch[23..27].try_into().unwrap());
        let records = kafka_protocol::records::RecordBatchDecoder::decode(&mut batch)
            .expect("a batch that decodes");
        assert!(!records.records.is_empty());
        ranges.push((base, base + i64::from(delta)));
    }
    ranges
}

/// A consumer that keeps asking but stops reading its answers is closed after
/// `connections.max.idle.ms`: the broker's writer does not wait forever on a full socket,
/// holding the queued answers and the segment files they are sent from. The client gets
/// what the socket buffers held, then the end of the connection; a writer that waited for
/// the client sent all ~40 MB once it read again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_closed_after_connections_max_idle_ms() {
    let b = TestBroker::start_with(&["connections.max.idle.ms=1000"]);
    create_topic(&b.bootstrap, "unread", 1, &[]).await;
    let p = producer(&b.bootstrap, &[("linger.ms", "20")]);
    let value = "u".repeat(2_000);
    // Enqueued at once (send_result), then awaited: ~4 MB in a few batches.
    let deliveries: Vec<_> = (0..2_000)
        .map(|_| {
            p.send_result(FutureRecord::<(), _>::to("unread").payload(&value))
                .map_err(|(e, _)| e)
                .unwrap()
        })
        .collect();
    for delivery in deliveries {
        delivery.await.unwrap().unwrap();
    }
    drop(p);
    // 40 answers of 1 MiB each from ~4 MB of records: far more than loopback buffers hold.
    let request = fetch_request("unread", 0, 0, 1 << 20);
    let mut c = RawConn::connect(&b.bootstrap);
    for i in 0..40 {
        c.send_request(&request, 11, i);
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    // Drain: the bytes already in the socket buffers, then the end (or a reset).
    c.set_read_timeout(Duration::from_secs(5));
    let mut got = 0usize;
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        use std::io::Read;
        match c.stream().read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("after {got} bytes the connection is still open ({e})"),
        }
    }
    // Loopback buffers hold a few MiB; 40 answers are ~40 MiB.
    assert!(
        got < 20 << 20,
        "{got} bytes of 40 answers came: the connection was not cut when they stopped being read"
    );
    // The broker still serves others.
    let mut other = RawConn::connect(&b.bootstrap);
    let response = fetch(&mut other, "unread", 0, 0, 1 << 20);
    assert_eq!(response.responses[0].partitions[0].error_code, 0);
}
