//! Inline transforms (issue 4, test 5): a transform deployed with `mode=inline` rewrites
//! produced batches before they are appended. Real librdkafka producers with each
//! compression codec and idempotence; the segment files on disk are read back (decoded by
//! kafka-protocol, and as raw bytes when uncompressed) to show that only redacted records
//! were stored; offsets and sequence numbers stay right (retries, filters leaving gaps);
//! transform failures follow `errors.tolerance` (INVALID_RECORD, or the dead-letter topic).
//!
//! Deployments go through the admin API (`POST /transforms`), spoken here over a plain
//! TCP socket (HTTP/1.1, `Connection: close`) to keep the test binary free of an HTTP
//! client.

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression as Codec, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions,
    TimestampType,
};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::FutureRecord;
use rdkafka::Offset;

use crate::guests::guest;
use crate::harness::{decode, BinaryBroker, RawConn, TestBroker};
use crate::rdkafka_client::{create_topic, high_watermark, producer, read_partition};

/// `POST {admin_url}{path}` with a JSON body; returns (HTTP status, body).
fn post_json(admin_url: &str, path: &str, body: &serde_json::Value) -> (u16, String) {
    let addr = admin_url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).expect("admin listener");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    (status, body)
}

/// Deploys `wasm` inline on `topic` with `config`; `dlq`: tolerance `all` to that topic.
fn deploy_inline(
    admin_url: &str,
    name: &str,
    wasm: &Path,
    topic: &str,
    config: &[(&str, &str)],
    dlq: Option<&str>,
) {
    let config: serde_json::Map<String, serde_json::Value> = config
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect();
    let mut body = serde_json::json!({
        "name": name,
        "wasm": wasm.to_str().unwrap(),
        "input": topic,
        "outputs": [topic],
        "config": config,
        "mode": "inline",
        "errors.tolerance": if dlq.is_some() { "all" } else { "none" },
    });
    if let Some(d) = dlq {
        body["errors.deadletterqueue.topic.name"] = serde_json::Value::from(d);
    }
    let (status, text) = post_json(admin_url, "/transforms", &body);
    assert!(
        (200..300).contains(&status),
        "deploy {name}: HTTP {status}: {text}"
    );
}

/// Every record stored in the partition's segment files, decoded by kafka-protocol (a
/// client's decoder, decompressing): (offset, value, batch codec).
fn records_on_disk(b: &TestBroker, topic: &str, partition: i32) -> Vec<(i64, Vec<u8>, Codec)> {
    let dir = b.data_dir.join(format!("{topic}-{partition}"));
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let mut bytes = Bytes::from(std::fs::read(&f).unwrap());
        for set in RecordBatchDecoder::decode_all(&mut bytes).unwrap() {
            for r in set.records {
                out.push((
                    r.offset,
                    r.value.map(|v| v.to_vec()).unwrap_or_default(),
                    set.compression,
                ));
            }
        }
    }
    out
}

/// Raw bytes of every segment file of the partition.
fn raw_segments(b: &TestBroker, topic: &str, partition: i32) -> Vec<u8> {
    let dir = b.data_dir.join(format!("{topic}-{partition}"));
    let mut all = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "log") {
            all.extend(std::fs::read(p).unwrap());
        }
    }
    all
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The test-5 scenario for one codec: an idempotent librdkafka producer with
/// `compression.type=codec` sends JSON records with an `email` field to a topic with an
/// inline redact deployment; what is on disk is redacted (in the codec asked for), offsets
/// are contiguous and a consumer reads every record redacted.
async fn inline_redact_with(codec: &str, expected: Codec) {
    const N: usize = 500;
    let b = TestBroker::start();
    let topic = format!("pii-{codec}");
    create_topic(&b.bootstrap, &topic, 1, &[]).await;
    deploy_inline(
        &b.admin_url,
        &format!("redact-{codec}"),
        &guest("redact"),
        &topic,
        &[("fields", "email")],
        None,
    );
    let p = producer(
        &b.bootstrap,
        &[
            ("compression.type", codec),
            ("enable.idempotence", "true"),
            ("acks", "all"),
            ("linger.ms", "20"),
        ],
    );
    let mut futures = Vec::new();
    for i in 0..N {
        let value = format!(
            r#"{{"id":{i},"email":"user{i}@example.com","note":"{}"}}"#,
            "x".repeat(40)
        );
        futures.push(
            p.send_result(
                FutureRecord::to(&topic)
                    .key(&format!("k{i}"))
                    .payload(&value)
                    .partition(0),
            )
            .unwrap(),
        );
    }
    let mut offsets = Vec::new();
    for f in futures {
        let offset = f.await.unwrap().unwrap().offset;
        offsets.push(offset);
    }
    assert_eq!(
        offsets,
        (0..N as i64).collect::<Vec<_>>(),
        "{codec}: offsets as produced"
    );
    assert_eq!(high_watermark(&b.bootstrap, &topic, 0), N as i64);

    // On disk: every record, redacted, in the producer's codec.
    let stored = records_on_disk(&b, &topic, 0);
    assert_eq!(stored.len(), N, "{codec}");
    for (i, (offset, value, stored_codec)) in stored.iter().enumerate() {
        assert_eq!(*offset, i as i64);
        assert_eq!(*stored_codec, expected, "{codec}: batch codec on disk");
        assert!(
            !contains(value, b"@example.com"),
            "{codec}: {}",
            String::from_utf8_lossy(value)
        );
        let json: serde_json::Value = serde_json::from_slice(value).unwrap();
        assert_eq!(json["email"], "***");
        assert_eq!(json["id"], i);
    }
    if expected == Codec::None {
        let raw = raw_segments(&b, &topic, 0);
        assert!(
            !contains(&raw, b"example.com"),
            "raw segment bytes hold an email"
        );
        assert!(contains(&raw, b"\"email\":\"***\""));
    }

    // A consumer reads every record, redacted, at the produced offsets.
    let read = read_partition(&b.bootstrap, &topic, 0, Offset::Beginning, N);
    assert_eq!(read.len(), N);
    for (i, (key, value, offset, _)) in read.iter().enumerate() {
        assert_eq!(*offset, i as i64);
        assert_eq!(key.as_deref(), Some(format!("k{i}").as_bytes()));
        let value = value.as_deref().unwrap();
        assert!(!contains(value, b"@example.com"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_redact_uncompressed_idempotent() {
    inline_redact_with("none", Codec::None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_redact_gzip_idempotent() {
    inline_redact_with("gzip", Codec::Gzip).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_redact_snappy_idempotent() {
    inline_redact_with("snappy", Codec::Snappy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_redact_lz4_idempotent() {
    inline_redact_with("lz4", Codec::Lz4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_redact_zstd_idempotent() {
    inline_redact_with("zstd", Codec::Zstd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_topics_compression_type_applies_to_rewritten_batches() {
    let b = TestBroker::start();
    create_topic(
        &b.bootstrap,
        "recompress",
        1,
        &[("compression.type", "zstd")],
    )
    .await;
    deploy_inline(
        &b.admin_url,
        "redact-rc",
        &guest("redact"),
        "recompress",
        &[("fields", "email")],
        None,
    );
    let p = producer(&b.bootstrap, &[("compression.type", "none")]);
    for i in 0..20 {
        p.send(
            FutureRecord::to("recompress")
                .key("k")
                .payload(&format!(r#"{{"email":"a{i}@example.com"}}"#)),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    }
    let stored = records_on_disk(&b, "recompress", 0);
    assert_eq!(stored.len(), 20);
    assert!(stored
        .iter()
        .all(|(_, v, c)| *c == Codec::Zstd && !contains(v, b"example")));
}

/// One raw idempotent batch: `n` JSON records with emails, sequence from `seq`.
fn raw_batch(pid: i64, seq: i32, n: usize, codec: Codec) -> Bytes {
    let records: Vec<Record> = (0..n)
        .map(|i| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: pid,
            producer_epoch: 0,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: seq + i as i32,
            timestamp: weir::replica::now_ms(),
            key: Some(Bytes::from(format!("k{}", seq as usize + i))),
            value: Some(Bytes::from(format!(
                r#"{{"email":"s{}@example.com"}}"#,
                seq as usize + i
            ))),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: codec,
        },
    )
    .unwrap();
    buf.freeze()
}

/// Produce v9 of one batch to partition 0: (error code, base offset).
fn produce_raw(conn: &mut RawConn, topic: &str, records: Bytes, corr: i32) -> (i16, i64) {
    let req = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.into())))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(records))])]);
    let resp: ProduceResponse = decode(conn.request(&req, 9, corr).expect("response"), 9);
    let p = &resp.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

fn init_producer_id(conn: &mut RawConn) -> i64 {
    let init: InitProducerIdResponse = decode(
        conn.request(
            &InitProducerIdRequest::default()
                .with_transactional_id(None)
                .with_transaction_timeout_ms(60_000)
                .with_producer_id(kafka_protocol::messages::ProducerId(-1))
                .with_producer_epoch(-1),
            4,
            1,
        )
        .unwrap(),
        4,
    );
    assert_eq!(init.error_code, 0);
    init.producer_id.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_batch_through_an_inline_transform_gets_its_original_offsets() {
    let b = TestBroker::start();
    create_topic(&b.bootstrap, "retry", 1, &[]).await;
    deploy_inline(
        &b.admin_url,
        "redact-retry",
        &guest("redact"),
        "retry",
        &[("fields", "email")],
        None,
    );
    let mut conn = RawConn::connect(&b.bootstrap);
    let pid = init_producer_id(&mut conn);
    let b0 = raw_batch(pid, 0, 5, Codec::Lz4);
    let b1 = raw_batch(pid, 5, 5, Codec::Zstd);
    assert_eq!(produce_raw(&mut conn, "retry", b0.clone(), 2), (0, 0));
    assert_eq!(produce_raw(&mut conn, "retry", b1.clone(), 3), (0, 5));
    // Retries (the producer did not see the answers): the original offsets, no new records.
    assert_eq!(produce_raw(&mut conn, "retry", b0, 4), (0, 0));
    assert_eq!(produce_raw(&mut conn, "retry", b1, 5), (0, 5));
    assert_eq!(high_watermark(&b.bootstrap, "retry", 0), 10);
    // The next sequence follows on; a gap in sequences is still refused (45).
    assert_eq!(
        produce_raw(&mut conn, "retry", raw_batch(pid, 10, 3, Codec::Gzip), 6),
        (0, 10)
    );
    assert_eq!(
        produce_raw(&mut conn, "retry", raw_batch(pid, 20, 1, Codec::None), 7).0,
        45
    );
    let stored = records_on_disk(&b, "retry", 0);
    assert_eq!(
        stored.iter().map(|r| r.0).collect::<Vec<_>>(),
        (0..13).collect::<Vec<_>>()
    );
    assert!(stored.iter().all(|(_, v, _)| !contains(v, b"example.com")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_idempotent_producers_through_an_inline_transform_lose_and_duplicate_nothing() {
    const N: usize = 300;
    let b = TestBroker::start();
    create_topic(&b.bootstrap, "two", 1, &[]).await;
    deploy_inline(
        &b.admin_url,
        "redact-two",
        &guest("redact"),
        "two",
        &[("fields", "email")],
        None,
    );
    let mut all = Vec::new();
    let producers: Vec<_> = ["gzip", "lz4"]
        .iter()
        .map(|c| {
            producer(
                &b.bootstrap,
                &[
                    ("compression.type", c),
                    ("enable.idempotence", "true"),
                    ("linger.ms", "2"),
                ],
            )
        })
        .collect();
    for i in 0..N {
        for (n, p) in producers.iter().enumerate() {
            all.push(
                p.send_result(
                    FutureRecord::to("two")
                        .key("k")
                        .payload(&format!(r#"{{"p":{n},"i":{i},"email":"x@example.com"}}"#))
                        .partition(0),
                )
                .unwrap(),
            );
        }
    }
    let mut offsets = Vec::new();
    for f in all {
        offsets.push(f.await.unwrap().unwrap().offset);
    }
    offsets.sort();
    assert_eq!(offsets, (0..2 * N as i64).collect::<Vec<_>>());
    let read = read_partition(&b.bootstrap, "two", 0, Offset::Beginning, 2 * N);
    assert_eq!(read.len(), 2 * N);
    let mut seen = std::collections::BTreeSet::new();
    for (_, v, _, _) in &read {
        let v: serde_json::Value = serde_json::from_slice(v.as_deref().unwrap()).unwrap();
        assert_eq!(v["email"], "***");
        assert!(
            seen.insert((v["p"].as_i64(), v["i"].as_i64())),
            "duplicate {v}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_filter_leaves_gaps_consumers_skip() {
    let b = TestBroker::start();
    create_topic(&b.bootstrap, "sieve", 1, &[]).await;
    deploy_inline(
        &b.admin_url,
        "keep-yes",
        &guest("filter"),
        "sieve",
        &[("field", "keep"), ("equals", "yes")],
        None,
    );
    let p = producer(
        &b.bootstrap,
        &[
            ("compression.type", "lz4"),
            ("enable.idempotence", "true"),
            ("linger.ms", "0"),
        ],
    );
    // 100 records, every third kept; then a batch of only dropped records; then kept ones.
    let mut kept = Vec::new();
    for i in 0..130i64 {
        let keep = if i < 100 {
            i % 3 == 0
        } else {
            (110..130).contains(&i) && i % 2 == 0
        };
        let value = format!(
            r#"{{"i":{i},"keep":"{}"}}"#,
            if keep { "yes" } else { "no" }
        );
        let offset = p
            .send(
                FutureRecord::to("sieve")
                    .key("k")
                    .payload(&value)
                    .partition(0),
                Duration::from_secs(10),
            )
            .await
            .unwrap()
            .offset;
        assert_eq!(offset, i, "every produced record is given its offset");
        if keep {
            kept.push(i);
        }
    }
    assert_eq!(high_watermark(&b.bootstrap, "sieve", 0), 130);
    let read = read_partition(&b.bootstrap, "sieve", 0, Offset::Beginning, kept.len());
    let offsets: Vec<i64> = read.iter().map(|m| m.2).collect();
    assert_eq!(offsets, kept, "consumers skip the gaps");
    // Reading from inside a gap starts at the next kept record.
    let from_gap = read_partition(&b.bootstrap, "sieve", 0, Offset::Offset(101), 1);
    assert_eq!(from_gap[0].2, 110);
    let stored: Vec<i64> = records_on_disk(&b, "sieve", 0)
        .iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(stored, kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_inline_transform_without_tolerance_refuses_the_produce() {
    let b = TestBroker::start();
    create_topic(&b.bootstrap, "strict", 1, &[]).await;
    deploy_inline(
        &b.admin_url,
        "hostile-strict",
        &guest("hostile"),
        "strict",
        &[],
        None,
    );
    let p = producer(&b.bootstrap, &[("linger.ms", "0"), ("retries", "0")]);
    let ok = p
        .send(
            FutureRecord::to("strict").key("k").payload("fine"),
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(ok.unwrap().offset, 0);
    let err = p
        .send(
            FutureRecord::to("strict").key("k").payload("panic"),
            Duration::from_secs(10),
        )
        .await
        .unwrap_err();
    println!("refused: {:?}", err.0);
    assert!(
        matches!(
            err.0,
            KafkaError::MessageProduction(RDKafkaErrorCode::InvalidRecord)
        ),
        "{:?}",
        err.0
    );
    assert_eq!(
        high_watermark(&b.bootstrap, "strict", 0),
        1,
        "nothing appended"
    );
    // The instance was replaced: the next record flows.
    let next = p
        .send(
            FutureRecord::to("strict").key("k").payload("after"),
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(next.unwrap().offset, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_records_go_to_the_dead_letter_topic_under_tolerance_all() {
    let b = TestBroker::start();
    create_topic(&b.bootstrap, "lenient", 1, &[]).await;
    create_topic(&b.bootstrap, "lenient-dlq", 1, &[]).await;
    deploy_inline(
        &b.admin_url,
        "hostile-dlq",
        &guest("hostile"),
        "lenient",
        &[],
        Some("lenient-dlq"),
    );
    // One batch of five, the third panics: raw, so the five are surely one batch.
    let mut conn = RawConn::connect(&b.bootstrap);
    let values = ["a", "b", "panic", "d", "e"];
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: -1,
            timestamp: weir::replica::now_ms(),
            key: Some(Bytes::from(format!("k{i}"))),
            value: Some(Bytes::from_static(v.as_bytes())),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Codec::Snappy,
        },
    )
    .unwrap();
    assert_eq!(produce_raw(&mut conn, "lenient", buf.freeze(), 2), (0, 0));
    assert_eq!(high_watermark(&b.bootstrap, "lenient", 0), 5);
    let read = read_partition(&b.bootstrap, "lenient", 0, Offset::Beginning, 4);
    let got: Vec<(i64, Vec<u8>)> = read.iter().map(|m| (m.2, m.1.clone().unwrap())).collect();
    assert_eq!(
        got,
        vec![
            (0, b"a".to_vec()),
            (1, b"b".to_vec()),
            (3, b"d".to_vec()),
            (4, b"e".to_vec())
        ]
    );
    let dlq = read_partition(&b.bootstrap, "lenient-dlq", 0, Offset::Beginning, 1);
    assert_eq!(dlq.len(), 1);
    let (key, value, _, headers) = &dlq[0];
    assert_eq!(key.as_deref(), Some(&b"k2"[..]));
    assert_eq!(value.as_deref(), Some(&b"panic"[..]));
    let header = |k: &str| {
        headers
            .iter()
            .find(|(name, _)| name == k)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_else(|| panic!("no header {k} in {headers:?}"))
    };
    println!("dead letter headers: {headers:?}");
    assert_eq!(header("__connect.errors.topic"), "lenient");
    assert_eq!(header("__connect.errors.partition"), "0");
    assert_eq!(header("__connect.errors.offset"), "2");
    assert!(header("__connect.errors.exception.message").contains("panic"));
    assert_eq!(header("__connect.errors.stage"), "TRANSFORMATION");
    assert_eq!(header("__connect.errors.class.name"), "hostile.wasm");
    assert_eq!(header("__connect.errors.exception.class.name"), "Trap");
    // The same headers as an async transform's dead letters (`transforms::`).
    assert_eq!(header("weir.errors.transform"), "hostile-dlq");
    assert_eq!(header("weir.errors.plugin.version").len(), 64);
}

// ---------------------------------------------------------------------------------------
// `transform::apply` without a broker: the slot as the produce path holds it.

mod direct {
    use std::sync::Arc;

    use bytes::{Bytes, BytesMut};
    use kafka_protocol::records::{
        Compression as Codec, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions,
        TimestampType,
    };
    use weir::log::{split_batches, ValidatedBatch};
    use weir::plugin::{PluginHost, PluginHostConfig};
    use weir::transform::apply::{apply, Target};
    use weir::transform::inline::InlineSlot;
    use weir::transform::{Stats, Tolerance};

    use crate::guests::guest;

    async fn slot(plugin: &str, config: &[(&str, &str)], tolerance: Tolerance) -> InlineSlot {
        let host = PluginHost::new(PluginHostConfig::default()).unwrap();
        let config: Vec<(String, String)> = config
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let transform = host.load_transform(&guest(plugin), &config).await.unwrap();
        InlineSlot {
            name: plugin.into(),
            version: "test".into(),
            transform: tokio::sync::Mutex::new(transform),
            tolerance,
            dlq_topic: Some("dlq".into()),
            stats: Arc::new(Stats::default()),
        }
    }

    fn batch(values: &[&str], codec: Codec) -> ValidatedBatch {
        let records: Vec<Record> = values
            .iter()
            .enumerate()
            .map(|(i, v)| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: -1,
                producer_id: 9,
                producer_epoch: 2,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: 40 + i as i32,
                timestamp: 1_000 + i as i64,
                key: Some(Bytes::from(format!("k{i}"))),
                value: Some(Bytes::from(v.to_string())),
                headers: Default::default(),
            })
            .collect();
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &records,
            &RecordEncodeOptions {
                version: 2,
                compression: codec,
            },
        )
        .unwrap();
        split_batches(buf.freeze()).unwrap().remove(0)
    }

    fn codec_name(c: weir::log::Compression) -> &'static str {
        weir::log::codec::name(c)
    }

    const TARGET: Target<'static> = Target {
        topic: "t",
        partition: 3,
        compression: None,
        max_decompressed_bytes: 8 << 20,
        max_message_bytes: 1 << 20,
    };

    fn decoded(b: &ValidatedBatch) -> Vec<(i64, i32, String)> {
        let mut bytes = b.to_bytes();
        RecordBatchDecoder::decode(&mut bytes)
            .unwrap()
            .records
            .into_iter()
            .map(|r| {
                (
                    r.offset,
                    r.sequence,
                    String::from_utf8(r.value.unwrap().to_vec()).unwrap(),
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn redact_rewrites_each_codec_keeping_offsets_and_sequences() {
        let s = slot("redact", &[("fields", "email")], Tolerance::None).await;
        for codec in [
            Codec::None,
            Codec::Gzip,
            Codec::Snappy,
            Codec::Lz4,
            Codec::Zstd,
        ] {
            let input = batch(
                &[r#"{"email":"a@x.org"}"#, r#"{"email":"b@x.org","n":1}"#],
                codec,
            );
            let out = apply(&s, TARGET, vec![input]).await.unwrap();
            assert!(out.dead_letters.is_empty());
            let b = &out.batches[0];
            assert_eq!(
                (b.producer_id(), b.producer_epoch(), b.base_sequence()),
                (9, 2, 40)
            );
            assert_eq!(b.last_offset_delta(), 1);
            assert_eq!(
                codec_name(b.compression()),
                format!("{codec:?}").to_lowercase()
            );
            assert_eq!(
                decoded(b),
                vec![
                    (0, 40, r#"{"email":"***"}"#.to_string()),
                    (1, 41, r#"{"email":"***","n":1}"#.to_string()),
                ]
            );
        }
        let stats = &s.stats;
        use std::sync::atomic::Ordering::Relaxed;
        assert_eq!(stats.records_in.load(Relaxed), 10);
        assert_eq!(stats.records_out.load(Relaxed), 10);
        assert_eq!(stats.errors.load(Relaxed), 0);
        assert!(stats.busy_ns.load(Relaxed) > 0);
    }

    #[tokio::test]
    async fn a_trap_under_tolerance_all_drops_only_its_record() {
        let s = slot("hostile", &[], Tolerance::All).await;
        let input = batch(&["a", "panic", "c", "d"], Codec::Lz4);
        let out = apply(&s, TARGET, vec![input]).await.unwrap();
        let b = &out.batches[0];
        assert_eq!(b.record_count(), 3);
        assert_eq!(b.last_offset_delta(), 3, "the batch keeps its offsets");
        assert_eq!(
            decoded(b)
                .iter()
                .map(|r| (r.0, r.2.as_str()))
                .collect::<Vec<_>>(),
            vec![(0, "a"), (2, "c"), (3, "d")]
        );
        assert_eq!(out.dead_letters.len(), 1);
        let d = &out.dead_letters[0];
        assert_eq!(d.offset_delta, 1);
        assert_eq!(d.record.value.as_deref(), Some(&b"panic"[..]));
        println!("dead letter message: {}", d.message);
        assert!(d.message.contains("panic"), "{}", d.message);
        assert_eq!(s.stats.errors.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_trap_under_tolerance_none_refuses_with_invalid_record() {
        let s = slot("hostile", &[], Tolerance::None).await;
        let input = batch(&["a", "panic"], Codec::None);
        let refused = apply(&s, TARGET, vec![input]).await.unwrap_err();
        println!("refused: {}", refused.message);
        assert_eq!(refused.error, kafka_protocol::ResponseError::InvalidRecord);
        assert!(refused.message.contains("panic"));
        // The instance was replaced: the next batch goes through.
        let out = apply(&s, TARGET, vec![batch(&["b"], Codec::None)])
            .await
            .unwrap();
        assert_eq!(out.batches[0].record_count(), 1);
    }

    #[tokio::test]
    async fn a_filter_that_drops_everything_keeps_an_empty_batch() {
        let s = slot(
            "filter",
            &[("field", "keep"), ("equals", "yes")],
            Tolerance::None,
        )
        .await;
        let input = batch(
            &[r#"{"keep":"no"}"#, r#"{"keep":"no"}"#, r#"{"keep":"no"}"#],
            Codec::Zstd,
        );
        let out = apply(&s, TARGET, vec![input]).await.unwrap();
        let b = &out.batches[0];
        assert_eq!(
            (b.record_count(), b.last_offset_delta(), b.base_sequence()),
            (0, 2, 40)
        );
        assert!(decoded(b).is_empty());
    }
}

/// A call stopped at its deadline is logged by the broker, once per plugin per 10 s
/// (the rest are counted in the next line): three spinning records produced one after
/// another, each refused with INVALID_RECORD, leave one warning naming the plugin (its
/// component file) and its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_stopped_at_its_deadline_is_logged_once_per_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let b = BinaryBroker::spawn(dir.path(), 0, &["plugin.call.timeout.ms=200"]);
    create_topic(&b.bootstrap, "spin-logged", 1, &[]).await;
    deploy_inline(
        &b.admin_url,
        "spinner",
        &guest("hostile"),
        "spin-logged",
        &[],
        None,
    );
    let p = producer(&b.bootstrap, &[("linger.ms", "0"), ("retries", "0")]);
    for _ in 0..3 {
        let result = p
            .send(
                FutureRecord::to("spin-logged").key("k").payload("spin"),
                Duration::from_secs(30),
            )
            .await;
        assert!(
            matches!(
                result,
                Err((
                    KafkaError::MessageProduction(RDKafkaErrorCode::InvalidRecord),
                    _
                ))
            ),
            "a spinning record is refused at its deadline: {:?}",
            result.map(|d| d.offset)
        );
    }
    let log = b.stderr_text();
    let stopped: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("plugin call stopped"))
        .collect();
    assert_eq!(stopped.len(), 1, "one line per 10 s: {log}");
    assert!(
        stopped[0].contains("WARN")
            && stopped[0].contains("plugin=\"hostile.wasm\"")
            && stopped[0].contains("exceeded its deadline of 200 ms"),
        "{}",
        stopped[0]
    );
    assert!(!log.contains("panicked"), "{log}");
}

/// A spinning inline transform holds its own produce until the call deadline, but not a
/// broker thread: with both of the broker's runtime threads' worth of spinning produces in
/// flight (two topics, so two guests run at once), a produce to a third topic is
/// acknowledged while both are still spinning (the guests yield at every epoch tick).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spinning_inline_transforms_do_not_stop_other_topics() {
    // TestBroker's runtime has 2 worker threads; a 5 s deadline leaves a wide window.
    let b = TestBroker::start_with(&["plugin.call.timeout.ms=5000"]);
    for t in ["spin-a", "spin-b", "plain"] {
        create_topic(&b.bootstrap, t, 1, &[]).await;
    }
    deploy_inline(
        &b.admin_url,
        "spin-a",
        &guest("hostile"),
        "spin-a",
        &[],
        None,
    );
    deploy_inline(
        &b.admin_url,
        "spin-b",
        &guest("hostile"),
        "spin-b",
        &[],
        None,
    );
    let spinning: Vec<_> = ["spin-a", "spin-b"]
        .into_iter()
        .map(|t| {
            let p = producer(&b.bootstrap, &[("linger.ms", "0"), ("retries", "0")]);
            tokio::spawn(async move {
                p.send(
                    FutureRecord::to(t).key("k").payload("spin"),
                    Duration::from_secs(30),
                )
                .await
                .map(|d| d.offset)
                .map_err(|(e, _)| e)
            })
        })
        .collect();
    // Let both produces reach their guests (setup only: nothing is asserted on time, and
    // a guest busy in a call shows nothing outside to poll for).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let p = producer(&b.bootstrap, &[("linger.ms", "0")]);
    let plain = p
        .send(
            FutureRecord::to("plain").key("k").payload("hello"),
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(plain.unwrap().offset, 0);
    assert!(
        spinning.iter().all(|h| !h.is_finished()),
        "the plain produce was acknowledged only after a spinning call ended"
    );
    for h in spinning {
        let result = h.await.unwrap();
        assert!(
            matches!(
                result,
                Err(KafkaError::MessageProduction(
                    RDKafkaErrorCode::InvalidRecord
                ))
            ),
            "a spinning record is refused at its deadline: {result:?}"
        );
    }
}
