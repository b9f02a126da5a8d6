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

use crate::harness::{decode, RawConn, TestBroker};

fn one_record_batch(value_bytes: usize) -> BytesMut {
    let r = Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: -1,
        timestamp: 1_700_000_000_000,
        key: None,
        value: Some(Bytes::from(vec![b'x'; value_bytes])),
        headers: Default::default(),
    };
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        [&r],
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    buf
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
            c.read_frame().is_none(),
            "{name}: expected the connection to be closed"
        );
        still_serves(&b.bootstrap);
    }
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
    let r = Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: -1,
        timestamp: 1_700_000_000_000,
        key: None,
        value: Some(Bytes::from_static(b"zstd, please")),
        headers: Default::default(),
    };
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        [&r],
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::Zstd,
        },
    )
    .unwrap();
    let records = buf.freeze();
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
        c.read_frame().is_none(),
        "expected the stalled connection to be closed"
    );
    still_serves(&b.bootstrap);
}

#[test]
fn two_brokers_cannot_share_a_log_dir() {
    let b = TestBroker::start();
    let mut raw = weir::config::RawConfig::default();
    raw.set("listeners", "PLAINTEXT://127.0.0.1:0").unwrap();
    raw.set("log.dirs", b.data_dir.to_str().unwrap()).unwrap();
    let config = weir::config::BrokerConfig::from_raw(raw).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let err = rt
        .block_on(async {
            let listeners = weir::broker::bind(&config).await.unwrap();
            let (_tx, rx) = tokio::sync::watch::channel(false);
            weir::broker::run(config, listeners, rx).await
        })
        .unwrap_err();
    assert!(
        err.to_string().contains("in use by another weir process"),
        "{err:#}"
    );
    still_serves(&b.bootstrap);
}
