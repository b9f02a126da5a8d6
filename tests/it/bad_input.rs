//! Bad input: each case gets Kafka's error (or the connection is closed) and the broker
//! keeps serving other clients.

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiVersionsRequest, ApiVersionsResponse, ProduceRequest, ProduceResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

use crate::harness::{decode, BinaryBroker, RawConn, TestBroker};
use crate::rdkafka_client::{high_watermark, producer};

/// One batch of records with these keys and values, encoded by kafka-protocol with
/// `codec`, timestamped now (an old timestamp would let retention.ms delete them mid-test).
fn encode_batch(kvs: Vec<(Option<Bytes>, Option<Bytes>)>, codec: Compression) -> BytesMut {
    let now_ms = weir::replica::now_ms();
    let records: Vec<Record> = kvs
        .into_iter()
        .zip(0i64..)
        .map(|((key, value), i)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i,
            // constant offset - sequence: one batch for all records
            sequence: (i - 1) as i32,
            timestamp: now_ms + i,
            key,
            value,
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
    .unwrap();
    buf
}

fn one_record_batch(value_bytes: usize) -> BytesMut {
    encode_batch(
        vec![(None, Some(Bytes::from(vec![b'x'; value_bytes])))],
        Compression::None,
    )
}

fn produce(conn: &mut RawConn, topic: &str, records: Bytes) -> i16 {
    let req = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.into())))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(records))])]);
    let resp: ProduceResponse = decode(conn.request(&req, 8, 7).expect("a response"), 8);
    resp.responses[0].partition_responses[0].error_code
}

fn still_serves(bootstrap: &str) {
    let mut c = RawConn::connect(bootstrap);
    let r: ApiVersionsResponse = decode(
        c.request(&ApiVersionsRequest::default(), 3, 1)
            .expect("ApiVersions answered"),
        3,
    );
    assert_eq!(r.error_code, 0);
}

#[test]
fn produce_errors_are_kafkas() {
    let b = TestBroker::start();
    let mut c = RawConn::connect(&b.bootstrap);
    // A good one first (auto-creates the topic).
    assert_eq!(
        produce(&mut c, "bad-input", one_record_batch(10).freeze()),
        0
    );
    // 2 MB with the default message.max.bytes (1048588): MESSAGE_TOO_LARGE (10).
    assert_eq!(
        produce(&mut c, "bad-input", one_record_batch(2 << 20).freeze()),
        10
    );
    // A flipped byte in the records: CORRUPT_MESSAGE (2).
    let mut corrupt = one_record_batch(100);
    let last = corrupt.len() - 5;
    corrupt[last] ^= 0xff;
    assert_eq!(produce(&mut c, "bad-input", corrupt.freeze()), 2);
    // An illegal topic name: INVALID_TOPIC_EXCEPTION (17).
    assert_eq!(
        produce(&mut c, "bad/name", one_record_batch(10).freeze()),
        17
    );
    // The same connection still works.
    assert_eq!(
        produce(&mut c, "bad-input", one_record_batch(10).freeze()),
        0
    );
}

#[test]
fn malformed_frames_close_only_their_connection() {
    let b = TestBroker::start();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("unknown API key", {
            let mut f = vec![0, 0, 0, 10];
            f.extend_from_slice(&[0x03, 0xe7, 0, 0, 0, 0, 0, 1, 0, 0]);
            f
        }),
        ("frame shorter than its header", vec![0, 0, 0, 3, 0, 18, 0]),
        ("frame claiming 2 GB", vec![0x7f, 0xff, 0xff, 0xff, 0, 18]),
        ("negative frame size", vec![0xff, 0xff, 0xff, 0xf0]),
        ("garbage body", {
            // Metadata v1 whose topic array claims 1e9 entries.
            let mut f = vec![0, 0, 0, 14, 0, 3, 0, 1, 0, 0, 0, 9, 0, 0];
            f.extend_from_slice(&[0x3b, 0x9a, 0xca, 0x00]);
            f
        }),
    ];
    for (name, bytes) in cases {
        let mut c = RawConn::connect(&b.bootstrap);
        c.send_raw(&bytes);
        assert!(
            c.is_closed_by_broker(),
            "{name}: expected the connection to be closed"
        );
        still_serves(&b.bootstrap);
    }
}

/// Issue 15: 1000 bad frames from one client (each closes its connection, so 1000
/// connections from one IP; half name an unknown API, half claim 2 GB) log at most one
/// warning line per 10 s, not 1000, and the broker (the binary, whose stderr is the log)
/// goes on serving a real client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warnings_for_bad_frames_are_rate_limited_per_peer() {
    let dir = tempfile::tempdir().unwrap();
    let b = BinaryBroker::spawn(dir.path(), 0, &[]);
    let unknown_api: &[u8] = &[0, 0, 0, 10, 0x03, 0xe7, 0, 0, 0, 0, 0, 1, 0, 0];
    let two_gb: &[u8] = &[0x7f, 0xff, 0xff, 0xff, 0, 18];
    let started = std::time::Instant::now();
    for i in 0..1000 {
        let mut c = RawConn::connect(&b.bootstrap);
        c.send_raw(if i % 2 == 0 { unknown_api } else { two_gb });
        assert!(
            c.is_closed_by_broker(),
            "bad frame {i}: connection not closed"
        );
    }
    // Each started 10 s window may log one line.
    let windows = started.elapsed().as_secs() / 10 + 1;
    let p = producer(&b.bootstrap, &[]);
    p.send(
        rdkafka::producer::FutureRecord::to("after-bad-frames")
            .key("k")
            .payload("v"),
        std::time::Duration::from_secs(10),
    )
    .await
    .expect("a real client's record is acknowledged");
    assert_eq!(high_watermark(&b.bootstrap, "after-bad-frames", 0), 1);
    let log = b.terminate();
    let warned = log
        .lines()
        .filter(|l| l.contains("closing connection"))
        .count() as u64;
    assert!(
        (1..=windows).contains(&warned),
        "{warned} warning lines for 1000 bad frames in {windows} 10 s windows:\n{log}"
    );
}

#[test]
fn api_versions_too_new_gets_error_35_in_a_v0_body_and_the_client_retries() {
    let b = TestBroker::start();
    let mut c = RawConn::connect(&b.bootstrap);
    // ApiVersions v9: header v2 (flexible), a body the broker cannot know.
    let mut body = vec![0, 18, 0, 9, 0, 0, 0, 42, 0, 4, b't', b'e', b's', b't', 0];
    body.extend_from_slice(&[0, 0, 0]);
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    c.send_raw(&frame);
    let resp = c.read_frame().expect("an answer, not a disconnect");
    assert_eq!(&resp[0..4], &42i32.to_be_bytes());
    let v0: ApiVersionsResponse = decode(Bytes::from(resp[4..].to_vec()), 0);
    assert_eq!(v0.error_code, 35);
    let av = v0
        .api_keys
        .iter()
        .find(|k| k.api_key == 18)
        .expect("ApiVersions listed");
    assert_eq!((av.min_version, av.max_version), (0, 4));
    // Same connection, supported version: works.
    let r: ApiVersionsResponse =
        decode(c.request(&ApiVersionsRequest::default(), 3, 43).unwrap(), 3);
    assert_eq!(r.error_code, 0);
    assert!(r
        .api_keys
        .iter()
        .any(|k| k.api_key == 0 && k.max_version >= 9));
}

#[test]
fn zstd_needs_produce_v7() {
    let b = TestBroker::start();
    let mut c = RawConn::connect(&b.bootstrap);
    let records = encode_batch(
        vec![(None, Some(Bytes::from_static(b"zstd, please")))],
        Compression::Zstd,
    )
    .freeze();
    let send = |c: &mut RawConn, version: i16| -> i16 {
        let req = ProduceRequest::default()
            .with_acks(1)
            .with_timeout_ms(5000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_static_str("zstd")))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(records.clone()))])]);
        let resp: ProduceResponse = decode(c.request(&req, version, 11).unwrap(), version);
        resp.responses[0].partition_responses[0].error_code
    };
    // UNSUPPORTED_COMPRESSION_TYPE (76) below v7 (KIP-110), accepted from v7.
    assert_eq!(send(&mut c, 6), 76);
    assert_eq!(send(&mut c, 7), 0);
}

#[test]
fn a_connection_stalled_inside_a_frame_is_closed_after_connections_max_idle_ms() {
    let b = TestBroker::start_with(&["connections.max.idle.ms=300"]);
    let mut c = RawConn::connect(&b.bootstrap);
    // Half a frame, then nothing: the broker must not keep the slot forever.
    c.send_raw(&[0, 0, 0, 100, 0, 18]);
    assert!(
        c.is_closed_by_broker(),
        "expected the stalled connection to be closed"
    );
    still_serves(&b.bootstrap);
}

#[test]
fn two_brokers_cannot_share_a_log_dir() {
    let b = TestBroker::start();
    // Answering means the first broker's `run` is past taking the lock (the harness
    // returns once the port is bound, which is before that).
    still_serves(&b.bootstrap);
    let mut raw = weir::config::RawConfig::default();
    raw.set("listeners", "PLAINTEXT://127.0.0.1:0").unwrap();
    raw.set("log.dirs", b.data_dir.to_str().unwrap()).unwrap();
    raw.set("admin.listeners", "").unwrap();
    let config = weir::config::BrokerConfig::from_raw(raw).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let err = rt
        .block_on(async {
            let listeners = weir::broker::bind(&config).await.unwrap();
            let (_tx, rx) = tokio::sync::watch::channel(false);
            // Bounded: a second broker that wrongly got the lock would serve forever.
            tokio::time::timeout(
                std::time::Duration::from_secs(30),
                weir::broker::run(config, listeners, rx),
            )
            .await
            .expect("the second broker refuses to start, it does not serve")
        })
        .unwrap_err();
    assert!(
        err.to_string().contains("in use by another weir process"),
        "{err:#}"
    );
    still_serves(&b.bootstrap);
}

// ---- Record-level validation (src/protocol/records.rs) -----------------------------------
// Batches whose header and CRC are fine but whose records a consumer cannot parse: Kafka's
// LogValidator refuses each with CORRUPT_MESSAGE (2) or INVALID_RECORD (87), and so must
// weir, or the batch sits in the log and jams every consumer at its offset.

const ATTRIBUTES_AT: usize = 21;
const LAST_OFFSET_DELTA_AT: usize = 23;
const RECORD_COUNT_AT: usize = 57;
const BATCH_HEADER: usize = 61;

/// One batch of `n` records ("k0"/"v0", "k1"/"v1", ...) encoded with `codec`.
fn records_batch(n: usize, codec: Compression) -> Vec<u8> {
    let kvs = (0..n)
        .map(|i| {
            (
                Some(Bytes::from(format!("k{i}"))),
                Some(Bytes::from(format!("v{i}"))),
            )
        })
        .collect();
    encode_batch(kvs, codec).to_vec()
}

fn fix_crc(batch: &mut [u8]) {
    let crc = crc32c::crc32c(&batch[ATTRIBUTES_AT..]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
}

/// `template`'s header over `body`, with codec bits `codec`, batchLength and CRC fixed.
fn with_records(template: &[u8], codec: u8, body: &[u8]) -> Vec<u8> {
    let mut out = template[..BATCH_HEADER].to_vec();
    out.extend_from_slice(body);
    let len = (out.len() - 12) as i32;
    out[8..12].copy_from_slice(&len.to_be_bytes());
    out[ATTRIBUTES_AT + 1] = (out[ATTRIBUTES_AT + 1] & !0x07) | codec;
    fix_crc(&mut out);
    out
}

fn put_varint(out: &mut Vec<u8>, v: i64) {
    let mut raw = ((v << 1) ^ (v >> 63)) as u64;
    while raw >= 0x80 {
        out.push((raw as u8 & 0x7f) | 0x80);
        raw >>= 7;
    }
    out.push(raw as u8);
}

/// A one-record batch whose record is `length`-prefixed `fields` (length = fields' size
/// when `None`).
fn one_raw_record(length: Option<i64>, fields: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    put_varint(&mut body, length.unwrap_or(fields.len() as i64));
    body.extend_from_slice(fields);
    with_records(&records_batch(1, Compression::None), 0, &body)
}

/// Record fields: attributes 0, timestampDelta 0, `offset_delta`, key length `key_len`
/// followed by `key`, value "v", then `tail` (header count and headers).
fn fields(offset_delta: i64, key_len: i64, key: &[u8], tail: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8, 0];
    put_varint(&mut f, offset_delta);
    put_varint(&mut f, key_len);
    f.extend_from_slice(key);
    f.extend_from_slice(&[2, b'v']);
    f.extend_from_slice(tail);
    f
}

/// Error code and message of a Produce v8 of `records` to partition 0 of `topic`.
fn produce_with_message(conn: &mut RawConn, topic: &str, records: Vec<u8>) -> (i16, String) {
    let req = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.into())))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(Bytes::from(records)))])]);
    let resp: ProduceResponse = decode(conn.request(&req, 8, 21).expect("a response"), 8);
    let p = &resp.responses[0].partition_responses[0];
    (
        p.error_code,
        p.error_message
            .as_ref()
            .map(|m| m.as_str().to_string())
            .unwrap_or_default(),
    )
}

/// The log end offset of partition 0 of `topic` (ListOffsets v5, latest).
fn log_end_offset(conn: &mut RawConn, topic: &str) -> i64 {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::{BrokerId, ListOffsetsRequest, ListOffsetsResponse};
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(StrBytes::from_string(topic.into())))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(0)
                .with_timestamp(-1)])]);
    let resp: ListOffsetsResponse = decode(conn.request(&req, 5, 22).expect("a response"), 5);
    let p = &resp.topics[0].partitions[0];
    assert_eq!(p.error_code, 0);
    p.offset
}

/// A gzip batch of one record whose value is 150 MB of zeros: ~150 KB on the wire.
fn gzip_bomb() -> Vec<u8> {
    use std::io::Write;
    let value_len: usize = 150 << 20;
    let mut head = vec![0u8, 0, 0, 1]; // attributes, timestampDelta, offsetDelta, null key
    put_varint(&mut head, value_len as i64);
    let mut records = Vec::new();
    put_varint(&mut records, (head.len() + value_len + 1) as i64);
    records.extend_from_slice(&head);
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(&records).unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..150 {
        e.write_all(&zeros).unwrap();
    }
    e.write_all(&[0]).unwrap(); // header count
    let gz = e.finish().unwrap();
    assert!(gz.len() < 200_000, "bomb is {} bytes", gz.len());
    with_records(&records_batch(1, Compression::None), 1, &gz)
}

#[test]
fn batches_with_unparseable_records_are_refused_and_consumers_keep_reading() {
    let b = TestBroker::start();
    let topic = "bad-records";
    let mut c = RawConn::connect(&b.bootstrap);
    assert_eq!(
        produce_with_message(&mut c, topic, records_batch(3, Compression::None)),
        (0, String::new())
    );
    assert_eq!(log_end_offset(&mut c, topic), 3);

    let mut cases: Vec<(&str, Vec<u8>, i16)> = Vec::new();
    // recordCount 1,000,000 (lastOffsetDelta 999,999) over one record.
    let mut count = records_batch(1, Compression::None);
    count[LAST_OFFSET_DELTA_AT..LAST_OFFSET_DELTA_AT + 4]
        .copy_from_slice(&999_999i32.to_be_bytes());
    count[RECORD_COUNT_AT..RECORD_COUNT_AT + 4].copy_from_slice(&1_000_000i32.to_be_bytes());
    fix_crc(&mut count);
    cases.push(("recordCount 1e6, one record", count, 87));
    // gzip flag over a body that is not gzip.
    let plain = records_batch(2, Compression::None);
    cases.push((
        "gzip flag, plain body",
        with_records(&plain, 1, &plain[BATCH_HEADER..]),
        2,
    ));
    // A control batch (bit 5) from a client, and a transactional one (bit 4) without a
    // producer id (KIP-98: both INVALID_RECORD).
    for (name, bit) in [
        ("control batch", 0x20u8),
        ("transactional batch without a producer id", 0x10),
    ] {
        let mut batch = records_batch(1, Compression::None);
        batch[ATTRIBUTES_AT + 1] |= bit;
        fix_crc(&mut batch);
        cases.push((name, batch, 87));
    }
    // Key lengths 1,000,000, -7 and 2^40.
    for (name, key_len) in [
        ("key length 1e6", 1_000_000i64),
        ("key length -7", -7),
        ("key length 2^40", 1 << 40),
    ] {
        cases.push((
            name,
            one_raw_record(None, &fields(0, key_len, b"k", &[0])),
            2,
        ));
    }
    // Record lengths 0, 1 and -1.
    let good_fields = fields(0, -1, b"", &[0]);
    for (name, length) in [
        ("record length 0", 0i64),
        ("record length 1", 1),
        ("record length -1", -1),
    ] {
        cases.push((name, one_raw_record(Some(length), &good_fields), 2));
    }
    // A header count of 1e9.
    let mut tail = Vec::new();
    put_varint(&mut tail, 1_000_000_000);
    cases.push((
        "header count 1e9",
        one_raw_record(None, &fields(0, -1, b"", &tail)),
        2,
    ));
    // Offset deltas 0, 2.
    let mut two = Vec::new();
    for delta in [0, 2] {
        let f = fields(delta, -1, b"", &[0]);
        put_varint(&mut two, f.len() as i64);
        two.extend_from_slice(&f);
    }
    cases.push((
        "offset deltas 0, 2",
        with_records(&records_batch(2, Compression::None), 0, &two),
        87,
    ));
    // A ~150 KB gzip batch expanding to 150 MB.
    cases.push(("gzip bomb", gzip_bomb(), 2));

    for (name, batch, want) in cases {
        let (code, message) = produce_with_message(&mut c, topic, batch);
        assert_eq!(code, want, "{name}: {message}");
        assert!(!message.is_empty(), "{name}: an error message");
        assert_eq!(log_end_offset(&mut c, topic), 3, "{name}: nothing appended");
    }
    let (_, control) = {
        let mut batch = records_batch(1, Compression::None);
        batch[ATTRIBUTES_AT + 1] |= 0x20;
        fix_crc(&mut batch);
        produce_with_message(&mut c, topic, batch)
    };
    assert!(
        control.contains("not allowed to write control records"),
        "{control}"
    );

    // Valid batches of every codec still go in, on the same connection.
    let mut expected = 3;
    for codec in [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        let (code, message) = produce_with_message(&mut c, topic, records_batch(4, codec));
        assert_eq!(code, 0, "{codec:?}: {message}");
        expected += 4;
        assert_eq!(log_end_offset(&mut c, topic), expected);
    }

    // librdkafka reads the whole partition from offset 0: nothing in it jams a consumer.
    let msgs = crate::rdkafka_client::read_partition(
        &b.bootstrap,
        topic,
        0,
        rdkafka::Offset::Beginning,
        expected as usize,
    );
    assert_eq!(
        msgs.len(),
        expected as usize,
        "{:?}",
        msgs.iter().map(|m| (m.2, m.1.clone())).collect::<Vec<_>>()
    );
    for (i, m) in msgs.iter().enumerate() {
        assert_eq!(m.2, i as i64);
        let n = if i < 3 { i } else { (i - 3) % 4 };
        assert_eq!(m.1.as_deref(), Some(format!("v{n}").as_bytes()));
    }
}

/// A request answered right before an acks=0 Produce on the same connection is sent at
/// once, not held until the connection's next answer: 200 times in a row, an ApiVersions
/// request and an acks=0 Produce go out in one write, and the ApiVersions answer must
/// arrive within 3 s each time (a buffered answer used to wait when the acks=0 request
/// was queued behind it before the writer looked).
#[test]
fn an_answer_before_an_acks_0_produce_is_not_held_back() {
    use kafka_protocol::messages::{ApiKey, RequestHeader};
    use kafka_protocol::protocol::Encodable;
    let b = TestBroker::start();
    let mut c = RawConn::connect(&b.bootstrap);
    let frame = |key: ApiKey, version: i16, correlation_id: i32, body: &dyn Fn(&mut BytesMut)| {
        let mut buf = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("acks0")))
            .encode(&mut buf, key.request_header_version(version))
            .unwrap();
        body(&mut buf);
        let mut out = (buf.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(&buf);
        out
    };
    let records = one_record_batch(10).freeze();
    for i in 0..200 {
        let mut bytes = frame(ApiKey::ApiVersions, 3, 2 * i, &|buf| {
            ApiVersionsRequest::default().encode(buf, 3).unwrap()
        });
        bytes.extend(frame(ApiKey::Produce, 8, 2 * i + 1, &|buf| {
            ProduceRequest::default()
                .with_acks(0)
                .with_timeout_ms(5000)
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(TopicName(StrBytes::from_static_str("acks0")))
                    .with_partition_data(vec![PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(records.clone()))])])
                .encode(buf, 8)
                .unwrap()
        }));
        c.send_raw(&bytes);
        c.set_read_timeout(std::time::Duration::from_secs(3));
        let answer = c
            .read_frame()
            .unwrap_or_else(|| panic!("round {i}: no ApiVersions answer within 3 s"));
        let correlation_id = i32::from_be_bytes(answer[0..4].try_into().unwrap());
        assert_eq!(correlation_id, 2 * i, "round {i}");
    }
}
