//! Transactions, the partition side (KIP-98): transactional batches produced with the
//! raw protocol (producer ids from a transactional InitProducerId, partitions added with
//! AddPartitionsToTxn as KIP-890 requires), ended by
//! WriteTxnMarkers COMMIT or ABORT, one left open. Then real consumers: librdkafka with
//! `isolation.level=read_committed` reads exactly the committed records and stops at the
//! last stable offset (the open transaction), `read_uncommitted` reads everything;
//! committing the open transaction lets read_committed go on. ListOffsets latest with
//! isolation_level 1 is the last stable offset. One aborted transaction is interleaved with
//! another producer's committed records, and one spans a segment roll: a raw Fetch of the
//! first segment carries it in `aborted_transactions`. Fencing answers
//! INVALID_PRODUCER_EPOCH and TRANSACTION_COORDINATOR_FENCED; a client's control batch is
//! INVALID_RECORD. confluent-kafka and kafka-python read_committed consumers
//! (tests/compat/read_committed.py) read the same committed records. DescribeProducers
//! (KIP-664) lists the producers with their open transaction.
//!
//! Every wait is bounded; a sleep only proves that nothing more arrives.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::describe_producers_request::TopicRequest;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, TransactionalId,
};
use kafka_protocol::messages::{
    BrokerId, DescribeProducersRequest, DescribeProducersResponse, FetchRequest, FetchResponse,
    InitProducerIdRequest, InitProducerIdResponse, ListOffsetsRequest, ListOffsetsResponse,
    ProduceRequest, ProduceResponse, ProducerId, TopicName, WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::harness::{decode, repo_root, RawConn, TestBroker};
use crate::rdkafka_client::create_topic;

fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

/// Per test thread and producer id (each test has a broker of its own, whose ids start
/// alike), the transactional id the producer got its id with and the partitions already
/// added to its transaction (`produce` adds them, KIP-890 asks).
type Producers = Vec<((std::thread::ThreadId, i64), String, Vec<String>)>;
static PRODUCERS: std::sync::Mutex<Producers> = std::sync::Mutex::new(Vec::new());

/// A fresh producer id and epoch: InitProducerId v2 for a new transactional id (its
/// coordinator found first, which creates `__transaction_state`), with the longest
/// timeout, so the coordinator never ends these transactions: the tests end them with
/// WriteTxnMarkers, as a coordinator would.
fn init_producer_id(conn: &mut RawConn) -> (i64, i16) {
    let id = format!("txlog-{}", uuid::Uuid::new_v4());
    let find = FindCoordinatorRequest::default()
        .with_key(StrBytes::from_string(id.clone()))
        .with_key_type(1);
    let f: FindCoordinatorResponse = decode(conn.request(&find, 2, 1).unwrap(), 2);
    assert_eq!(f.error_code, 0);
    let request = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(StrBytes::from_string(id.clone()))))
        .with_transaction_timeout_ms(900_000);
    let r: InitProducerIdResponse = decode(conn.request(&request, 2, 1).unwrap(), 2);
    assert_eq!(r.error_code, 0);
    PRODUCERS.lock().unwrap().push((
        (std::thread::current().id(), r.producer_id.0),
        id,
        Vec::new(),
    ));
    (r.producer_id.0, r.producer_epoch)
}

/// The transactional id of a transactional batch's producer, after adding `topic`'s
/// partition 0 to its transaction (AddPartitionsToTxn v3) the first time.
fn transactional_id_for(conn: &mut RawConn, topic: &str, records: &Bytes) -> Option<String> {
    let transactional = records.len() > 61 && records[22] & 0x10 != 0 && records[22] & 0x20 == 0;
    if !transactional {
        return None;
    }
    let producer_id = i64::from_be_bytes(records[43..51].try_into().unwrap());
    let producer_epoch = i16::from_be_bytes(records[51..53].try_into().unwrap());
    let mut producers = PRODUCERS.lock().unwrap();
    let me = (std::thread::current().id(), producer_id);
    let (_, id, added) = producers.iter_mut().find(|(p, _, _)| *p == me)?;
    if !added.iter().any(|t| t == topic) {
        let request = AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(StrBytes::from_string(id.clone())))
            .with_v3_and_below_producer_id(ProducerId(producer_id))
            .with_v3_and_below_producer_epoch(producer_epoch)
            .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(topic_name(topic))
                .with_partitions(vec![0])]);
        let r: AddPartitionsToTxnResponse = decode(conn.request(&request, 3, 4).unwrap(), 3);
        assert_eq!(
            r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code,
            0
        );
        added.push(topic.to_string());
    }
    Some(id.clone())
}

/// One batch of `values` (key = value), transactional or not, from `producer` (id,
/// epoch) at `sequence` (a producer id of -1 for a plain batch).
pub(crate) fn batch(
    producer: (i64, i16),
    sequence: i32,
    transactional: bool,
    values: &[&str],
) -> Bytes {
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            transactional,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: producer.0,
            producer_epoch: producer.1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: if producer.0 < 0 {
                -1
            } else {
                sequence + i as i32
            },
            timestamp: 1_700_000_000_000,
            key: Some(Bytes::copy_from_slice(v.as_bytes())),
            value: Some(Bytes::copy_from_slice(v.as_bytes())),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        records.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    buf.freeze()
}

/// Produces `records` (v7, acks=all) to partition 0 of `topic`; the error code and base
/// offset.
fn produce(conn: &mut RawConn, topic: &str, records: Bytes) -> (i16, i64) {
    let transactional_id = transactional_id_for(conn, topic, &records);
    let request = ProduceRequest::default()
        .with_transactional_id(transactional_id.map(|t| TransactionalId(StrBytes::from_string(t))))
        .with_acks(-1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(topic_name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(records))])]);
    let r: ProduceResponse = decode(conn.request(&request, 7, 2).unwrap(), 7);
    let p = &r.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

/// WriteTxnMarkers v1 for `producer` on partition 0 of `topic`; the partition's error.
fn write_marker(
    conn: &mut RawConn,
    topic: &str,
    producer: (i64, i16),
    commit: bool,
    coordinator_epoch: i32,
) -> i16 {
    let request =
        WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
            .with_producer_id(ProducerId(producer.0))
            .with_producer_epoch(producer.1)
            .with_transaction_result(commit)
            .with_coordinator_epoch(coordinator_epoch)
            .with_topics(vec![WritableTxnMarkerTopic::default()
                .with_name(topic_name(topic))
                .with_partition_indexes(vec![0])])]);
    let r: WriteTxnMarkersResponse = decode(conn.request(&request, 1, 3).unwrap(), 1);
    assert_eq!(r.markers[0].producer_id.0, producer.0);
    r.markers[0].topics[0].partitions[0].error_code
}

/// ListOffsets v5 latest (-1) of partition 0 with `isolation_level`.
fn latest(conn: &mut RawConn, topic: &str, isolation_level: i8) -> i64 {
    let request = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_isolation_level(isolation_level)
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(topic_name(topic))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(0)
                .with_timestamp(-1)])]);
    let r: ListOffsetsResponse = decode(conn.request(&request, 5, 4).unwrap(), 5);
    let p = &r.topics[0].partitions[0];
    assert_eq!(p.error_code, 0);
    p.offset
}

/// DescribeProducers v0 of partition 0: per producer id, (epoch, last sequence,
/// coordinator epoch, current transaction start offset), by id.
fn describe_producers(conn: &mut RawConn, topic: &str) -> Vec<(i64, i32, i32, i32, i64)> {
    let request = DescribeProducersRequest::default().with_topics(vec![TopicRequest::default()
        .with_name(topic_name(topic))
        .with_partition_indexes(vec![0])]);
    let r: DescribeProducersResponse = decode(conn.request(&request, 0, 7).unwrap(), 0);
    let p = &r.topics[0].partitions[0];
    assert_eq!(p.error_code, 0);
    p.active_producers
        .iter()
        .map(|s| {
            (
                s.producer_id.0,
                s.producer_epoch,
                s.last_sequence,
                s.coordinator_epoch,
                s.current_txn_start_offset,
            )
        })
        .collect()
}

/// The values a librdkafka consumer with `isolation_level` reads from the beginning of
/// partition 0 until it has `expected` of them, then for 2 s more (to prove that nothing
/// else comes: the one sleep-like wait here).
pub(crate) fn consume(
    bootstrap: &str,
    topic: &str,
    isolation_level: &str,
    expected: usize,
) -> Vec<String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "txlog-no-commits")
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation_level)
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut quiet_until: Option<Instant> = None;
    loop {
        let now = Instant::now();
        assert!(
            now < deadline,
            "{isolation_level}: {} of {expected} records: {out:?}",
            out.len()
        );
        if quiet_until.is_some_and(|q| now >= q) {
            return out;
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                out.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned())
            }
            Some(Err(e)) => panic!("consumer error: {e}"),
            None => {}
        }
        if out.len() >= expected && quiet_until.is_none() {
            quiet_until = Some(Instant::now() + Duration::from_secs(2));
        }
    }
}

/// The values a Python `client` with `isolation` reads (tests/compat/read_committed.py).
fn consume_python(
    bootstrap: &str,
    topic: &str,
    isolation: &str,
    expected: usize,
    client: &str,
) -> String {
    let out = std::process::Command::new("timeout")
        .arg("60")
        .arg("python3")
        .args([
            "tests/compat/read_committed.py",
            bootstrap,
            topic,
            isolation,
            &expected.to_string(),
            client,
        ])
        .current_dir(repo_root())
        .output()
        .expect("spawn python3");
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success(),
        "{client}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_committed_consumers_see_committed_records_up_to_the_last_stable_offset() {
    let b = TestBroker::start();
    const TOPIC: &str = "txlog";
    create_topic(&b.bootstrap, TOPIC, 1, &[]).await;
    let bootstrap = b.bootstrap.clone();
    tokio::task::spawn_blocking(move || {
        let mut conn = RawConn::connect(&bootstrap);
        let a = init_producer_id(&mut conn);
        let bp = init_producer_id(&mut conn);
        let c = init_producer_id(&mut conn);
        // A (to commit) and B (to abort) interleaved, then C left open, then a plain one.
        assert_eq!(
            produce(&mut conn, TOPIC, batch(a, 0, true, &["a1"])),
            (0, 0)
        );
        assert_eq!(
            produce(&mut conn, TOPIC, batch(bp, 0, true, &["b1"])),
            (0, 1)
        );
        assert_eq!(
            produce(&mut conn, TOPIC, batch(a, 1, true, &["a2"])),
            (0, 2)
        );
        assert_eq!(
            produce(&mut conn, TOPIC, batch(bp, 1, true, &["b2"])),
            (0, 3)
        );
        assert_eq!(write_marker(&mut conn, TOPIC, a, true, 0), 0); // 4
        assert_eq!(write_marker(&mut conn, TOPIC, bp, false, 0), 0); // 5
        assert_eq!(
            produce(&mut conn, TOPIC, batch(c, 0, true, &["c1"])),
            (0, 6)
        );
        assert_eq!(
            produce(&mut conn, TOPIC, batch((-1, -1), 0, false, &["p1"])),
            (0, 7)
        );
        assert_eq!(latest(&mut conn, TOPIC, 1), 6, "the LSO: C's first offset");
        // KIP-664: A and B ended by markers of coordinator epoch 0, C open since 6.
        assert_eq!(
            describe_producers(&mut conn, TOPIC),
            [
                (a.0, i32::from(a.1), 1, 0, -1),
                (bp.0, i32::from(bp.1), 1, 0, -1),
                (c.0, i32::from(c.1), 0, -1, 6)
            ]
        );
        assert_eq!(latest(&mut conn, TOPIC, 0), 8, "the high watermark");

        assert_eq!(
            consume(&bootstrap, TOPIC, "read_committed", 2),
            ["a1", "a2"]
        );
        for client in ["confluent-kafka", "kafka-python"] {
            assert_eq!(
                consume_python(&bootstrap, TOPIC, "read_committed", 2, client),
                format!("{client} values a1,a2")
            );
        }
        assert_eq!(
            consume(&bootstrap, TOPIC, "read_uncommitted", 6),
            ["a1", "b1", "a2", "b2", "c1", "p1"]
        );

        // Fencing: an older coordinator epoch, then an older producer epoch.
        assert_eq!(write_marker(&mut conn, TOPIC, a, true, -1), 52);
        assert_eq!(write_marker(&mut conn, TOPIC, (c.0, c.1 - 1), true, 0), 47);
        // A marker for another partition that does not exist.
        assert_eq!(write_marker(&mut conn, "no-such-topic", c, true, 0), 3);
        // A client may not write a control batch.
        let mut control = batch(c, 1, true, &["x"]).to_vec();
        control[22] |= 0x20;
        let crc = crc32c::crc32c(&control[21..]);
        control[17..21].copy_from_slice(&crc.to_be_bytes());
        assert_eq!(produce(&mut conn, TOPIC, Bytes::from(control)).0, 87);

        assert_eq!(write_marker(&mut conn, TOPIC, c, true, 0), 0); // 8
        assert_eq!(latest(&mut conn, TOPIC, 1), 9);
        assert_eq!(
            consume(&bootstrap, TOPIC, "read_committed", 4),
            ["a1", "a2", "c1", "p1"]
        );
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_transaction_across_a_segment_roll_is_reported_and_skipped() {
    let b = TestBroker::start();
    const TOPIC: &str = "txlog-roll";
    create_topic(&b.bootstrap, TOPIC, 1, &[("segment.bytes", "600")]).await;
    let bootstrap = b.bootstrap.clone();
    tokio::task::spawn_blocking(move || {
        let mut conn = RawConn::connect(&bootstrap);
        let aborted = init_producer_id(&mut conn);
        let committed = init_producer_id(&mut conn);
        let mut expected = Vec::new();
        for i in 0..12 {
            let (error, _) = produce(
                &mut conn,
                TOPIC,
                batch(aborted, i, true, &[&format!("aborted-{i}")]),
            );
            assert_eq!(error, 0);
            let value = format!("committed-{i}");
            let (error, _) = produce(&mut conn, TOPIC, batch(committed, i, true, &[&value]));
            assert_eq!(error, 0);
            expected.push(value);
        }
        assert_eq!(write_marker(&mut conn, TOPIC, committed, true, 3), 0);
        assert_eq!(write_marker(&mut conn, TOPIC, aborted, false, 3), 0);
        let end = latest(&mut conn, TOPIC, 1);
        assert_eq!(end, latest(&mut conn, TOPIC, 0));
        assert_eq!(end, 26);

        // A read_committed Fetch of the first segment gets the aborted transaction,
        // whose marker is in a later segment.
        let request = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_max_bytes(1 << 20)
            .with_isolation_level(1)
            .with_topics(vec![FetchTopic::default()
                .with_topic(topic_name(TOPIC))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(0)
                    .with_fetch_offset(0)
                    .with_partition_max_bytes(1 << 20)])]);
        let r: FetchResponse = decode(conn.request(&request, 11, 5).unwrap(), 11);
        let p = &r.responses[0].partitions[0];
        assert_eq!(p.error_code, 0);
        assert_eq!((p.high_watermark, p.last_stable_offset), (26, 26));
        let returned = p.records.as_ref().map_or(0, |r| r.len());
        assert!(
            returned > 0 && returned <= 600,
            "one segment: {returned} bytes"
        );
        let list: Vec<(i64, i64)> = p
            .aborted_transactions
            .as_ref()
            .expect("read_committed gets a list")
            .iter()
            .map(|t| (t.producer_id.0, t.first_offset))
            .collect();
        assert_eq!(list, [(aborted.0, 0)]);
        // read_uncommitted: no list.
        let r: FetchResponse = decode(
            conn.request(&request.clone().with_isolation_level(0), 11, 6)
                .unwrap(),
            11,
        );
        let p = &r.responses[0].partitions[0];
        assert!(p.aborted_transactions.as_ref().is_none_or(|l| l.is_empty()));

        assert_eq!(consume(&bootstrap, TOPIC, "read_committed", 12), expected);
        assert_eq!(consume(&bootstrap, TOPIC, "read_uncommitted", 24).len(), 24);
    })
    .await
    .unwrap();
}
