//! librdkafka (the `rdkafka` crate) against weir: produce with acks 0/1/all, idempotence,
//! fetch from the middle of the log, ListOffsets by time, admin round trips.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

use crate::harness::{decode, RawConn, TestBroker};

pub fn admin(bootstrap: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client")
}

pub async fn create_topic(bootstrap: &str, name: &str, partitions: i32, configs: &[(&str, &str)]) {
    let mut t = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        t = t.set(k, v);
    }
    let res = admin(bootstrap)
        .create_topics(&[t], &AdminOptions::new())
        .await
        .expect("create_topics");
    for r in res {
        r.expect("topic created");
    }
}

pub fn producer(bootstrap: &str, extra: &[(&str, &str)]) -> FutureProducer {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .set("message.timeout.ms", "30000");
    for (k, v) in extra {
        c.set(*k, *v);
    }
    c.create().expect("producer")
}

/// A consumed record: key, value, offset, headers.
pub type Msg = (
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    i64,
    Vec<(String, Vec<u8>)>,
);

/// Reads `count` messages from one partition starting at `offset`, without a group.
pub fn read_partition(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    offset: Offset,
    count: usize,
) -> Vec<Msg> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "unused-no-commits")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, offset).unwrap();
    consumer.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while out.len() < count && std::time::Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|x| (x.key.to_string(), x.value.unwrap_or_default().to_vec()))
                            .collect()
                    })
                    .unwrap_or_default();
                out.push((
                    m.key().map(<[u8]>::to_vec),
                    m.payload().map(<[u8]>::to_vec),
                    m.offset(),
                    headers,
                ))
            }
            Some(Err(e)) => panic!("consumer error: {e}"),
            None => {}
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_with_each_acks_setting_and_fetch_from_the_middle() {
    let b = TestBroker::start();
    create_topic(&b.bootstrap, "acks", 1, &[]).await;
    let mut expected = Vec::new();
    for acks in ["0", "1", "all"] {
        let p = producer(&b.bootstrap, &[("acks", acks)]);
        let mut futures = Vec::new();
        for i in 0..100 {
            let v = format!("acks={acks} #{i}");
            expected.push(v.clone());
            futures.push(
                p.send_result(
                    FutureRecord::to("acks")
                        .key(&format!("k{i}"))
                        .payload(&v)
                        .partition(0),
                )
                .unwrap(),
            );
        }
        for f in futures {
            let d = f.await.unwrap().expect("delivered");
            let (partition, offset) = (d.partition, d.offset);
            assert_eq!(partition, 0);
            if acks != "0" {
                assert!(offset >= 0);
            }
        }
    }
    let got = read_partition(&b.bootstrap, "acks", 0, Offset::Beginning, 300);
    let values: Vec<String> = got
        .iter()
        .map(|m| String::from_utf8(m.1.clone().unwrap()).unwrap())
        .collect();
    assert_eq!(values, expected);
    let offsets: Vec<i64> = got.iter().map(|m| m.2).collect();
    assert_eq!(offsets, (0..300).collect::<Vec<i64>>());

    // From the middle of the log (inside a batch): starts exactly there.
    let mid = read_partition(&b.bootstrap, "acks", 0, Offset::Offset(150), 10);
    assert_eq!(mid[0].2, 150);
    assert_eq!(
        String::from_utf8(mid[0].1.clone().unwrap()).unwrap(),
        expected[150]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_null_values_headers_round_trip() {
    let b = TestBroker::start();
    let p = producer(&b.bootstrap, &[("acks", "all")]);
    // Auto-created on first produce.
    let headers = rdkafka::message::OwnedHeaders::new()
        .insert(rdkafka::message::Header {
            key: "h1",
            value: Some("v1"),
        })
        .insert(rdkafka::message::Header {
            key: "h2",
            value: Some(""),
        });
    p.send(
        FutureRecord::<str, str>::to("kv").key("tomb").partition(0),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    p.send(
        FutureRecord::<str, str>::to("kv")
            .key("empty")
            .payload("")
            .partition(0),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    p.send(
        FutureRecord::<str, str>::to("kv")
            .payload("nokey")
            .headers(headers)
            .partition(0),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let got = read_partition(&b.bootstrap, "kv", 0, Offset::Beginning, 3);
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].0.as_deref(), Some(&b"tomb"[..]));
    assert_eq!(got[0].1, None, "a null value comes back null");
    assert_eq!(
        got[1].1.as_deref(),
        Some(&b""[..]),
        "an empty value comes back empty"
    );
    assert_eq!(got[2].0, None);
    assert_eq!(
        got[2].3,
        vec![
            ("h1".to_string(), b"v1".to_vec()),
            ("h2".to_string(), Vec::new())
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_producer_has_no_duplicates() {
    let b = TestBroker::start();
    create_topic(&b.bootstrap, "idem", 2, &[]).await;
    let p = producer(
        &b.bootstrap,
        &[("enable.idempotence", "true"), ("acks", "all")],
    );
    let mut futures = Vec::new();
    for i in 0..2000 {
        futures.push(
            p.send_result(
                FutureRecord::to("idem")
                    .key(&format!("k{i}"))
                    .payload(&format!("v{i}")),
            )
            .unwrap(),
        );
    }
    for f in futures {
        f.await.unwrap().expect("delivered");
    }
    let mut total = 0;
    for part in 0..2 {
        let n = high_watermark(&b.bootstrap, "idem", part);
        total += n;
        let got = read_partition(&b.bootstrap, "idem", part, Offset::Beginning, n as usize);
        let mut seen = std::collections::HashSet::new();
        for m in &got {
            assert!(seen.insert(m.1.clone()), "duplicate record");
        }
    }
    assert_eq!(total, 2000);
}

pub fn high_watermark(bootstrap: &str, topic: &str, partition: i32) -> i64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    consumer
        .fetch_watermarks(topic, partition, Duration::from_secs(10))
        .unwrap()
        .1
}

fn batch(pid: i64, epoch: i16, seq: i32, n: usize) -> Bytes {
    let records: Vec<(Option<Bytes>, Bytes)> = (0..n)
        .map(|i| {
            (
                Some(Bytes::from(format!("k{i}"))),
                Bytes::from(format!("v{i}")),
            )
        })
        .collect();
    idempotent_batch(pid, epoch, seq, records)
}

/// One uncompressed batch of idempotent producer `pid` at `epoch`, its records
/// (key, value) numbered from sequence `seq`: what a raw Produce test sends.
pub(crate) fn idempotent_batch(
    pid: i64,
    epoch: i16,
    seq: i32,
    records: Vec<(Option<Bytes>, Bytes)>,
) -> Bytes {
    idempotent_batch_at(pid, epoch, seq, records, weir::replica::now_ms())
}

/// [`idempotent_batch`] with every record's CreateTime `timestamp_ms`.
pub(crate) fn idempotent_batch_at(
    pid: i64,
    epoch: i16,
    seq: i32,
    records: Vec<(Option<Bytes>, Bytes)>,
    timestamp_ms: i64,
) -> Bytes {
    let records: Vec<Record> = records
        .into_iter()
        .enumerate()
        .map(|(i, (key, value))| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: pid,
            producer_epoch: epoch,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: seq + i as i32,
            timestamp: timestamp_ms,
            key,
            value: Some(value),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    buf.freeze()
}

fn produce_raw(conn: &mut RawConn, topic: &str, records: Bytes, corr: i32) -> (i16, i64) {
    produce_raw_within(conn, topic, records, 10_000, corr)
}

/// Produce v9 of `records` to partition 0 of `topic`, acks=all, `timeout_ms`: (error,
/// base offset).
pub(crate) fn produce_raw_within(
    conn: &mut RawConn,
    topic: &str,
    records: Bytes,
    timeout_ms: i32,
    corr: i32,
) -> (i16, i64) {
    let req = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(timeout_ms)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.into())))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(records))])]);
    let resp: ProduceResponse = decode(conn.request(&req, 9, corr).expect("response"), 9);
    let p = &resp.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

/// A new idempotent producer id from the broker `conn` is connected to (InitProducerId
/// v4 without a transactional id, request `corr`); fails the test on an error.
pub(crate) fn init_producer_id(conn: &mut RawConn, corr: i32) -> i64 {
    let init: InitProducerIdResponse = decode(
        conn.request(
            &InitProducerIdRequest::default()
                .with_transactional_id(None)
                .with_transaction_timeout_ms(60_000)
                .with_producer_id(kafka_protocol::messages::ProducerId(-1))
                .with_producer_epoch(-1),
            4,
            corr,
        )
        .expect("InitProducerId answered"),
        4,
    );
    assert_eq!(init.error_code, 0, "InitProducerId");
    init.producer_id.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicated_retry_is_answered_with_the_original_offset() {
    let b = TestBroker::start();
    create_topic(&b.bootstrap, "dup", 1, &[]).await;
    let mut conn = RawConn::connect(&b.bootstrap);
    let pid = init_producer_id(&mut conn, 1);
    assert!(pid >= 0);
    let b0 = batch(pid, 0, 0, 5);
    assert_eq!(produce_raw(&mut conn, "dup", b0.clone(), 2), (0, 0));
    let b1 = batch(pid, 0, 5, 5);
    assert_eq!(produce_raw(&mut conn, "dup", b1.clone(), 3), (0, 5));
    // The retry of the first batch: same offsets, nothing appended.
    assert_eq!(produce_raw(&mut conn, "dup", b0, 4), (0, 0));
    assert_eq!(produce_raw(&mut conn, "dup", b1, 5), (0, 5));
    assert_eq!(high_watermark(&b.bootstrap, "dup", 0), 10);
    // A gap in the sequence: OUT_OF_ORDER_SEQUENCE_NUMBER (45).
    let gap = batch(pid, 0, 20, 1);
    assert_eq!(produce_raw(&mut conn, "dup", gap, 6).0, 45);
    assert_eq!(high_watermark(&b.bootstrap, "dup", 0), 10);
}

/// Issue 15: producer state expires on the broker's clock. A batch stamped a day in the
/// past (CreateTime is the client's) from a producer that appended just now survives
/// many expiry checks, so its retry (same producer id, epoch and sequence, as a raw
/// Produce) is answered with its original offset and not appended twice. Before the
/// fix the first check (here the retention tick, then the expiry's) forgot the producer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_create_time_does_not_expire_a_producer_that_just_appended() {
    let b = TestBroker::start_with(&[
        "producer.id.expiration.ms=60000",
        "producer.id.expiration.check.interval.ms=100",
        "log.retention.check.interval.ms=100",
    ]);
    // retention.ms=-1: the day-old records themselves must stay.
    create_topic(&b.bootstrap, "old-ts", 1, &[("retention.ms", "-1")]).await;
    let mut conn = RawConn::connect(&b.bootstrap);
    let pid = init_producer_id(&mut conn, 1);
    let day_ago_ms = weir::replica::now_ms() - 86_400_000;
    let records = (0..3)
        .map(|i| (None, Bytes::from(format!("v{i}"))))
        .collect();
    let first = idempotent_batch_at(pid, 0, 0, records, day_ago_ms);
    assert_eq!(produce_raw(&mut conn, "old-ts", first.clone(), 2), (0, 0));
    // A sleep to prove an absence: about 20 expiry checks run and must not forget the
    // producer (its last append is 2 s old, far below 60 s).
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(produce_raw(&mut conn, "old-ts", first, 3), (0, 0));
    assert_eq!(high_watermark(&b.bootstrap, "old-ts", 0), 3);
    // The next batch in sequence still follows on.
    let next = batch(pid, 0, 3, 1);
    assert_eq!(produce_raw(&mut conn, "old-ts", next, 4), (0, 3));
    assert_eq!(high_watermark(&b.bootstrap, "old-ts", 0), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_offsets_by_timestamp_across_segments() {
    // Tiny segments so the timestamps span several of them.
    let b = TestBroker::start();
    create_topic(&b.bootstrap, "times", 1, &[("segment.bytes", "1024")]).await;
    let p = producer(&b.bootstrap, &[("linger.ms", "0")]);
    // Recent timestamps: records older than retention.ms (7 days) may be deleted at once.
    let base = weir::replica::now_ms() - 3_600_000;
    for i in 0..50i64 {
        p.send(
            FutureRecord::to("times")
                .key("k")
                .payload(&format!("value-{i:04}-{}", "x".repeat(60)))
                .partition(0)
                .timestamp(base + i * 1000),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    }
    let seg_files = std::fs::read_dir(b.data_dir.join("times-0"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "log")
        })
        .count();
    assert!(seg_files > 3, "expected several segments, got {seg_files}");
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &b.bootstrap)
        .set("group.id", "x")
        .create()
        .unwrap();
    let lookup = |ts: i64| -> Offset {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("times", 0, Offset::Offset(ts))
            .unwrap();
        let r = consumer
            .offsets_for_times(tpl, Duration::from_secs(10))
            .unwrap();
        let e = r.find_partition("times", 0).unwrap();
        e.offset()
    };
    assert_eq!(lookup(base), Offset::Offset(0));
    assert_eq!(lookup(base + 17_000), Offset::Offset(17));
    assert_eq!(lookup(base + 17_500), Offset::Offset(18));
    assert_eq!(lookup(base + 49_000), Offset::Offset(49));
    assert_eq!(lookup(base + 60_000), Offset::End);
}

/// A librdkafka idempotent producer writing record `i` = `record(i)` (key, value,
/// partition: `None` for the partitioner's choice) to `topic` on a thread of its own,
/// without pause, for `i` in `0..limit` or until [`Writer::stop`]. Fault tests run it
/// across broker kills; records it could not queue are tried again.
pub struct Writer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(usize, bool)>,
}

impl Writer {
    pub fn spawn(
        bootstrap: &str,
        topic: &str,
        limit: usize,
        record: impl Fn(usize) -> (String, String, Option<i32>) + Send + 'static,
    ) -> Writer {
        use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, bootstrap, topic) = (stop.clone(), bootstrap.to_string(), topic.to_string());
        let thread = std::thread::spawn(move || {
            let p: ThreadedProducer<rdkafka::producer::DefaultProducerContext> =
                ClientConfig::new()
                    .set("bootstrap.servers", &bootstrap)
                    .set("enable.idempotence", "true")
                    .set("linger.ms", "5")
                    .set("message.timeout.ms", "60000")
                    .create()
                    .expect("producer");
            let mut i = 0usize;
            while !flag.load(Ordering::Relaxed) && i < limit {
                let (k, v, partition) = record(i);
                let mut r = BaseRecord::to(&topic).key(&k).payload(&v);
                if let Some(partition) = partition {
                    r = r.partition(partition);
                }
                match p.send(r) {
                    Ok(()) => i += 1,
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
                if i.is_multiple_of(100) {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            (i, p.flush(Duration::from_secs(60)).is_ok())
        });
        Writer { stop, thread }
    }

    /// Stops writing, then [`Writer::finish`].
    pub fn stop(self) -> (usize, bool) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.finish()
    }

    /// Waits until the writer is done and flushed (at most 60 s): records queued, and
    /// whether every one was delivered.
    pub fn finish(self) -> (usize, bool) {
        self.thread.join().expect("the producer thread")
    }
}
