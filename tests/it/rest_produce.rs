//! The HTTP produce endpoint (`POST /topics/{topic}/records`, REST Proxy v3's
//! `/v3/clusters/{id}/topics/{topic}/records`) driven with real HTTP requests, records
//! read back with librdkafka: key/value types, headers, timestamps, explicit partitions,
//! murmur2 placement like librdkafka's `murmur2_random`, the topic-level `partitioner`
//! setting (json-field) — and that it does not apply to Kafka produce —, and bad input
//! answered with REST Proxy's status codes while the broker keeps serving.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use base64::Engine as _;
use rdkafka::admin::{AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{json, Value};
use weir::plugin::{PluginHost, PluginHostConfig};

use crate::guests::guest;
use crate::harness::TestBroker;
use crate::rdkafka_client::{admin, create_topic, high_watermark, producer};

/// An HTTP answer.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: String,
}

impl Answer {
    /// The body as one JSON value.
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// The body as one JSON value per line (a streamed answer).
    fn lines(&self) -> Vec<Value> {
        self.body
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }
}

/// Sends raw request bytes to `base_url` (`http://HOST:PORT`) and reads the answer (the
/// request must say `Connection: close`).
fn http_raw(base_url: &str, request: &[u8]) -> Answer {
    let addr = base_url.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).expect("connect to the admin listener");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(request).expect("send request");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read answer");
    parse_answer(raw)
}

/// An HTTP/1.1 answer's status and (de-chunked) body.
fn parse_answer(raw: Vec<u8>) -> Answer {
    let text = String::from_utf8(raw).expect("UTF-8 answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("HTTP head");
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("status line in {head:?}"));
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Answer { status, body }
}

/// Decodes an HTTP/1.1 chunked body.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").expect("chunk size line");
        let size = usize::from_str_radix(size.trim(), 16).expect("hex chunk size");
        if size == 0 {
            return out;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
}

/// `POST base_url + path` with `body`.
pub(crate) fn post(base_url: &str, path: &str, body: &str) -> Answer {
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: weir\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    http_raw(base_url, request.as_bytes())
}

fn get(base_url: &str, path: &str) -> Answer {
    let request = format!("GET {path} HTTP/1.1\r\nHost: weir\r\nConnection: close\r\n\r\n");
    http_raw(base_url, request.as_bytes())
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A record as a consumer sees it: key, value, timestamp (ms), headers (null kept).
type Consumed = (
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<i64>,
    Vec<(String, Option<Vec<u8>>)>,
);

/// Reads `count` records of one partition from the beginning with librdkafka.
fn read(bootstrap: &str, topic: &str, partition: i32, count: usize) -> Vec<Consumed> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "rest-produce-reader")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Beginning)
        .unwrap();
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
                            .map(|x| (x.key.to_string(), x.value.map(<[u8]>::to_vec)))
                            .collect()
                    })
                    .unwrap_or_default();
                out.push((
                    m.key().map(<[u8]>::to_vec),
                    m.payload().map(<[u8]>::to_vec),
                    m.timestamp().to_millis(),
                    headers,
                ));
            }
            Some(Err(e)) => panic!("consumer error: {e}"),
            None => {}
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_each_type_with_headers_and_timestamps_are_read_back_by_a_kafka_client() {
    let b = TestBroker::start();
    create_topic(&b.bootstrap, "rest", 3, &[]).await;
    let body = [
        json!({
            "partition_id": 0,
            "key": {"type": "STRING", "data": "user-17"},
            "value": {"type": "JSON", "data": {"event": "click", "n": [1, 2.5, null]}},
            "headers": [{"name": "trace", "value": b64(b"abc")}, {"name": "empty", "value": null}],
            "timestamp": "2021-02-05T19:14:42.274Z",
        }),
        json!({
            "partition_id": 1,
            "key": {"type": "BINARY", "data": b64(&[0, 1, 2, 255])},
            "value": {"type": "BINARY", "data": b64(b"\x00raw\xff")},
            "timestamp": "2021-02-05T21:14:42.5+02:00",
        }),
        json!({"partition_id": 2, "value": {"type": "STRING", "data": "héllo"}}),
        // Type absent: JSON. Key absent and data null: null key, null value.
        json!({"partition_id": 2, "value": {"data": "text"}, "key": {"type": "STRING", "data": null}}),
    ];
    // A stream of concatenated objects (REST Proxy's streaming mode), one per line.
    let stream: String = body.iter().map(|r| format!("{r}\n")).collect();
    let before_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let answer = post(&b.admin_url, "/topics/rest/records", &stream);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let lines = answer.lines();
    eprintln!("{}", answer.body);
    assert_eq!(lines.len(), 4, "{}", answer.body);
    let cluster_id = get(&b.admin_url, "/").json()["kafka_cluster_id"].clone();
    assert!(cluster_id.is_string());
    assert_eq!(
        lines[0],
        json!({
            "error_code": 200, "cluster_id": cluster_id, "topic_name": "rest",
            "partition_id": 0, "offset": 0, "timestamp": "2021-02-05T19:14:42.274Z",
            "key": {"type": "STRING", "size": 7},
            "value": {"type": "JSON", "size": r#"{"event":"click","n":[1,2.5,null]}"#.len()},
        })
    );
    assert_eq!(lines[1]["partition_id"], 1);
    assert_eq!(lines[1]["timestamp"], "2021-02-05T19:14:42.500Z");
    assert_eq!(lines[1]["key"], json!({"type": "BINARY", "size": 4}));
    assert_eq!(lines[1]["value"], json!({"type": "BINARY", "size": 5}));
    assert_eq!(lines[2]["offset"], 0);
    assert_eq!(
        lines[2].get("key"),
        None,
        "no key in the request, none in the answer"
    );
    assert_eq!(lines[3]["offset"], 1);
    assert_eq!(lines[3]["key"], json!({"type": "STRING", "size": -1}));
    assert_eq!(lines[3]["value"], json!({"type": "JSON", "size": 6}));

    let p0 = read(&b.bootstrap, "rest", 0, 1);
    assert_eq!(p0.len(), 1);
    assert_eq!(p0[0].0.as_deref(), Some(&b"user-17"[..]));
    // JSON data is stored as the text sent (serde_json's compact form of the request here).
    assert_eq!(
        p0[0].1.as_deref(),
        Some(&br#"{"event":"click","n":[1,2.5,null]}"#[..])
    );
    assert_eq!(p0[0].2, Some(1_612_552_482_274));
    assert_eq!(
        p0[0].3,
        vec![
            ("trace".to_string(), Some(b"abc".to_vec())),
            ("empty".to_string(), None)
        ]
    );
    let p1 = read(&b.bootstrap, "rest", 1, 1);
    assert_eq!(p1[0].0.as_deref(), Some(&[0u8, 1, 2, 255][..]));
    assert_eq!(p1[0].1.as_deref(), Some(&b"\x00raw\xff"[..]));
    assert_eq!(p1[0].2, Some(1_612_552_482_500));
    let p2 = read(&b.bootstrap, "rest", 2, 2);
    assert_eq!(p2.len(), 2);
    assert_eq!(p2[0].0, None);
    assert_eq!(p2[0].1.as_deref(), Some("héllo".as_bytes()));
    assert!(
        p2[0].2.is_some_and(|t| t >= before_ms),
        "no timestamp: now, got {:?}",
        p2[0].2
    );
    assert_eq!(p2[1].0, None);
    assert_eq!(p2[1].1.as_deref(), Some(&br#""text""#[..]));

    // REST Proxy's own path, a JSON array body (answered with an array).
    let array = json!([
        {"partition_id": 1, "value": {"type": "STRING", "data": "via v3"}},
        {"partition_id": 1, "value": {"type": "STRING", "data": "again"}},
    ]);
    let cluster = cluster_id.as_str().unwrap();
    let answer = post(
        &b.admin_url,
        &format!("/v3/clusters/{cluster}/topics/rest/records"),
        &array.to_string(),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let results = answer.json();
    assert_eq!(results[0]["offset"], 1, "{results}");
    assert_eq!(results[1]["offset"], 2, "{results}");
    let p1 = read(&b.bootstrap, "rest", 1, 3);
    assert_eq!(p1[2].1.as_deref(), Some(&b"again"[..]));
    b.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_records_land_where_librdkafka_murmur2_random_puts_them() {
    const PARTITIONS: i32 = 7;
    const KEYS: usize = 200;
    let b = TestBroker::start();
    create_topic(&b.bootstrap, "http", PARTITIONS, &[]).await;
    create_topic(&b.bootstrap, "kafka", PARTITIONS, &[]).await;
    let keys: Vec<String> = (0..KEYS)
        .map(|i| format!("device-{i}-{}", i * 31))
        .collect();
    let body: Vec<Value> = keys
        .iter()
        .map(|k| json!({"key": {"type": "STRING", "data": k}, "value": {"type": "STRING", "data": "v"}}))
        .collect();
    let answer = post(
        &b.admin_url,
        "/topics/http/records",
        &Value::Array(body).to_string(),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let results = answer.json();
    let prod = producer(&b.bootstrap, &[("partitioner", "murmur2_random")]);
    let mut per_partition: HashMap<i64, usize> = HashMap::new();
    for (k, r) in keys.iter().zip(results.as_array().expect("array answer")) {
        assert_eq!(r["error_code"], 200, "{r}");
        let rec: FutureRecord<'_, str, str> =
            FutureRecord::to("kafka").key(k.as_str()).payload("v");
        let delivered = prod
            .send(rec, Duration::from_secs(10))
            .await
            .expect("delivered");
        assert_eq!(
            r["partition_id"],
            json!(delivered.partition),
            "key {k}: HTTP produce and librdkafka's murmur2_random disagree"
        );
        *per_partition.entry(delivered.partition as i64).or_default() += 1;
    }
    assert_eq!(
        per_partition.len(),
        PARTITIONS as usize,
        "{per_partition:?}"
    );

    // Keyless records spread.
    let body: String = (0..2 * PARTITIONS)
        .map(|i| {
            format!(
                "{}\n",
                json!({"value": {"type": "STRING", "data": i.to_string()}})
            )
        })
        .collect();
    let answer = post(&b.admin_url, "/topics/http/records", &body);
    let seen: std::collections::HashSet<String> = answer
        .lines()
        .iter()
        .map(|l| l["partition_id"].to_string())
        .collect();
    assert!(
        seen.len() > 1,
        "keyless records all on one partition: {seen:?}"
    );
    b.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_partitioner_setting_places_http_records_but_not_kafka_produce() {
    const PARTITIONS: u32 = 6;
    let b = TestBroker::start();
    let json_field = guest("json-field");
    let path = json_field.to_str().expect("UTF-8 path");
    create_topic(
        &b.bootstrap,
        "clicks",
        PARTITIONS as i32,
        &[
            ("partitioner", path),
            ("partitioner.config", "field=user_id"),
        ],
    )
    .await;
    // DescribeConfigs reports the setting as a topic override.
    let described = admin(&b.bootstrap)
        .describe_configs(&[ResourceSpecifier::Topic("clicks")], &AdminOptions::new())
        .await
        .expect("describe");
    let resource = described
        .into_iter()
        .next()
        .expect("one resource")
        .expect("described");
    let entry = resource.get("partitioner").expect("partitioner listed");
    assert_eq!(entry.value.as_deref(), Some(path));
    assert!(!entry.is_default);
    let entry = resource.get("partitioner.config").expect("config listed");
    assert_eq!(entry.value.as_deref(), Some("field=user_id"));

    // Where the plugin itself puts each record.
    let host = PluginHost::new(PluginHostConfig::default()).expect("plugin host");
    let config = [("field".to_string(), "user_id".to_string())];
    let mut plugin = host
        .load_partitioner_with(&json_field, &config)
        .await
        .expect("load json-field");
    let values: Vec<String> = (0..60)
        .map(|i| format!(r#"{{"user_id":"u-{}","n":{i}}}"#, i % 13))
        .collect();
    let mut want = Vec::new();
    for (i, v) in values.iter().enumerate() {
        let key = format!("k{i}");
        want.push(
            plugin
                .partition(Some(key.as_bytes()), Some(v.as_bytes()), PARTITIONS)
                .await
                .expect("partition") as i64,
        );
    }
    // The JSON values go in as text, so they are stored byte for byte as sent.
    let body: String = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            format!(
                r#"{{"key":{{"type":"STRING","data":"k{i}"}},"value":{{"type":"JSON","data":{v}}}}}"#
            ) + "\n"
        })
        .collect();
    let answer = post(&b.admin_url, "/topics/clicks/records", &body);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let got: Vec<i64> = answer
        .lines()
        .iter()
        .map(|l| l["partition_id"].as_i64().unwrap_or_else(|| panic!("{l}")))
        .collect();
    assert_eq!(got, want);
    assert!(
        want.iter().collect::<std::collections::HashSet<_>>().len() > 1,
        "all users on one partition: the test would not tell"
    );
    // Same user, same partition; and a consumer finds them there.
    for p in 0..PARTITIONS as i32 {
        let expected: Vec<&String> = values
            .iter()
            .zip(&want)
            .filter(|(_, w)| **w == p as i64)
            .map(|(v, _)| v)
            .collect();
        let read_back = read(&b.bootstrap, "clicks", p, expected.len());
        let read_values: Vec<String> = read_back
            .iter()
            .map(|r| String::from_utf8(r.1.clone().unwrap_or_default()).unwrap())
            .collect();
        assert_eq!(
            read_values,
            expected.into_iter().cloned().collect::<Vec<_>>(),
            "partition {p}"
        );
    }

    // A Kafka client's produce is placed by the client (here librdkafka's murmur2 of the
    // key), never by the topic's setting.
    let prod = producer(&b.bootstrap, &[("partitioner", "murmur2_random")]);
    let mut differs = 0;
    for (i, v) in values.iter().enumerate() {
        let key = format!("k{i}");
        let rec: FutureRecord<'_, str, str> = FutureRecord::to("clicks")
            .key(key.as_str())
            .payload(v.as_str());
        let delivered = prod
            .send(rec, Duration::from_secs(10))
            .await
            .expect("delivered");
        let murmur =
            (weir::ingest::murmur2::murmur2(key.as_bytes()) & 0x7fff_ffff) % PARTITIONS as i32;
        assert_eq!(delivered.partition, murmur, "key {key}");
        if i64::from(delivered.partition) != want[i] {
            differs += 1;
        }
    }
    assert!(differs > 0, "json-field and murmur2 agreed on every record");

    // Changing the setting (AlterConfigs) changes where HTTP records go: back to murmur2.
    let alter = AlterConfig::new(ResourceSpecifier::Topic("clicks")).set("partitioner", "");
    let r = admin(&b.bootstrap)
        .alter_configs(&[alter], &AdminOptions::new())
        .await
        .expect("alter");
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    let answer = post(
        &b.admin_url,
        "/topics/clicks/records",
        &json!({"key": {"type": "STRING", "data": "k0"}, "value": {"data": {"user_id": "u-0"}}})
            .to_string(),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let murmur = (weir::ingest::murmur2::murmur2(b"k0") & 0x7fff_ffff) % PARTITIONS as i32;
    assert_eq!(answer.json()["partition_id"], murmur);
    b.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_partitioner_fails_its_records_with_a_clear_error() {
    let b = TestBroker::start();
    let bad = guest("bad-partitioner");
    create_topic(
        &b.bootstrap,
        "bad",
        3,
        &[("partitioner", bad.to_str().unwrap())],
    )
    .await;
    // A partitioner naming a missing file is refused when set (tests/it/admin.rs); one
    // that goes away after is what this covers.
    let tmp = tempfile::tempdir().unwrap();
    let gone = tmp.path().join("partitioner.wasm");
    std::fs::copy(guest("murmur2"), &gone).unwrap();
    let gone_path = gone.to_str().unwrap().to_string();
    create_topic(&b.bootstrap, "missing", 3, &[("partitioner", &gone_path)]).await;
    std::fs::remove_file(&gone).unwrap();
    // bad-partitioner answers 0, out of range for key `oob`: that record alone fails (422).
    let body = [
        json!({"key": {"type": "STRING", "data": "fine"}, "value": {"data": 1}}),
        json!({"key": {"type": "STRING", "data": "oob"}, "value": {"data": 2}}),
        json!({"key": {"type": "STRING", "data": "fine"}, "value": {"data": 3}}),
    ];
    let stream: String = body.iter().map(|r| format!("{r}\n")).collect();
    let answer = post(&b.admin_url, "/topics/bad/records", &stream);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let lines = answer.lines();
    eprintln!("{}", answer.body);
    assert_eq!(lines[0]["error_code"], 200);
    assert_eq!(lines[0]["partition_id"], 0);
    assert_eq!(lines[1]["error_code"], 422);
    let msg = lines[1]["message"].as_str().unwrap();
    assert!(msg.contains("bad_partitioner.wasm"), "{msg}");
    assert!(
        msg.contains("partition 3 for a topic of 3 partitions"),
        "{msg}"
    );
    assert_eq!(lines[2]["error_code"], 200);
    assert_eq!(lines[2]["offset"], 1, "the failed record took no offset");

    // A partitioner that cannot be loaded: 500 naming the file; an explicit partition
    // does not need it.
    let answer = post(
        &b.admin_url,
        "/topics/missing/records",
        &json!({"value": {"data": 1}}).to_string(),
    );
    assert_eq!(answer.status, 500, "{}", answer.body);
    let msg = answer.json()["message"].as_str().unwrap().to_string();
    assert!(msg.contains(&gone_path), "{msg}");
    let answer = post(
        &b.admin_url,
        "/topics/missing/records",
        &json!({"partition_id": 2, "value": {"data": 1}}).to_string(),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.json()["partition_id"], 2);
    b.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_rest_proxy_status_codes_and_the_broker_keeps_serving() {
    let b = TestBroker::start_with(&[
        "auto.create.topics.enable=false",
        "socket.request.max.bytes=65536",
    ]);
    create_topic(&b.bootstrap, "t", 2, &[("max.message.bytes", "2000")]).await;
    let value = |v: &str| json!({"value": {"type": "STRING", "data": v}}).to_string();
    // (path, body, status, words of the message)
    let cases: Vec<(&str, String, u16, &str)> = vec![
        (
            "/topics/t/records",
            "{\"value\": ".into(),
            400,
            "Error processing JSON",
        ),
        (
            "/topics/t/records",
            "[{]".into(),
            400,
            "Error processing JSON",
        ),
        ("/topics/t/records", "".into(), 400, "no records"),
        (
            "/topics/t/records",
            json!({"value": {"type": "BINARY", "data": "not base64!"}}).to_string(),
            400,
            "base64",
        ),
        (
            "/topics/t/records",
            json!({"value": {"type": "AVRO", "data": 1}}).to_string(),
            400,
            "schema registry",
        ),
        (
            "/topics/t/records",
            json!({"timestamp": "yesterday", "value": {"data": 1}}).to_string(),
            400,
            "RFC 3339",
        ),
        (
            "/topics/t/records",
            json!({"partition_id": 7, "value": {"data": 1}}).to_string(),
            404,
            "no partition 7",
        ),
        ("/topics/nope/records", value("x"), 404, "does not host"),
        (
            "/topics/__consumer_offsets/records",
            value("x"),
            400,
            "internal topic",
        ),
        (
            "/topics/bad%2Fname/records",
            value("x"),
            400,
            "invalid topic name",
        ),
        (
            "/v3/clusters/not-this-one/topics/t/records",
            value("x"),
            404,
            "Cluster not-this-one not found",
        ),
        (
            "/topics/t/records",
            value(&"x".repeat(3000)),
            413,
            "max.message.bytes",
        ),
    ];
    for (path, body, status, words) in &cases {
        let answer = post(&b.admin_url, path, body);
        eprintln!("{path} {body:.40} -> {} {}", answer.status, answer.body);
        assert_eq!(answer.status, *status, "{path} {body}: {}", answer.body);
        let a = answer.json();
        assert_eq!(a["error_code"], *status, "{a}");
        let msg = a["message"].as_str().unwrap_or_default();
        assert!(msg.contains(words), "{path}: {msg:?} lacks {words:?}");
    }
    // A body over socket.request.max.bytes is refused from its Content-Length, before a
    // byte of it is read.
    let answer = http_raw(
        &b.admin_url,
        b"POST /topics/t/records HTTP/1.1\r\nHost: weir\r\nContent-Length: 1000000000\r\n\
          Connection: close\r\n\r\n",
    );
    assert_eq!(answer.status, 413, "{}", answer.body);
    assert!(
        answer.body.contains("socket.request.max.bytes"),
        "{}",
        answer.body
    );

    // In a stream, each record gets its own answer; a malformed object ends the stream.
    let stream = format!(
        "{}\n{}\n{}\n{{oops\n{}",
        value("a"),
        json!({"partition_id": 9, "value": {"data": 1}}),
        value("b"),
        value("never read")
    );
    let answer = post(&b.admin_url, "/topics/t/records", &stream);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let codes: Vec<Value> = answer
        .lines()
        .iter()
        .map(|l| l["error_code"].clone())
        .collect();
    assert_eq!(codes, vec![json!(200), json!(404), json!(200), json!(400)]);

    // Still serving, over HTTP and Kafka.
    let answer = post(&b.admin_url, "/topics/t/records", &value("after"));
    assert_eq!(answer.status, 200, "{}", answer.body);
    let prod = producer(&b.bootstrap, &[]);
    let rec: FutureRecord<'_, str, str> = FutureRecord::to("t").partition(0).payload("kafka");
    prod.send(rec, Duration::from_secs(10))
        .await
        .expect("Kafka produce after bad HTTP input");
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &b.bootstrap)
        .create()
        .unwrap();
    let (_, high0) = consumer
        .fetch_watermarks("t", 0, Duration::from_secs(10))
        .unwrap();
    let (_, high1) = consumer
        .fetch_watermarks("t", 1, Duration::from_secs(10))
        .unwrap();
    // "a", "b", "after" over HTTP and one Kafka record; nothing from the refused input.
    assert_eq!(high0 + high1, 4);
    b.stop();
}

/// Issue 15: request bodies in flight are bounded across all admin requests
/// (`admin.max.inflight.request.bytes`, here 10 MiB). Four HTTP produce requests of 4 MiB
/// each send their headers at once: two fit and wait for their bodies, the other two are
/// refused at once with 503 (a JSON error and Retry-After), before any body arrives.
/// Finishing the two bodies gets 200 with every record appended; the reservation is
/// returned, so the same large body fits again, and a small produce works after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_in_flight_are_bounded_across_admin_requests() {
    let b = TestBroker::start_with(&["admin.max.inflight.request.bytes=10485760"]);
    create_topic(&b.bootstrap, "big", 1, &[]).await;
    // 4 MiB (and a bit) of 4096 records of 1 KiB each.
    let record = json!({"value": {"type": "STRING", "data": "x".repeat(1000)}}).to_string();
    let body = format!("[{}]", vec![record; 4096].join(","));
    assert!(body.len() > 4 << 20 && body.len() < 5 << 20);
    let head = format!(
        "POST /topics/big/records HTTP/1.1\r\nHost: weir\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let addr = b.admin_url.trim_start_matches("http://").to_string();
    let (answers_tx, answers) = std::sync::mpsc::channel();
    let mut streams = Vec::new();
    for i in 0..4 {
        let mut s = TcpStream::connect(&addr).expect("connect to the admin listener");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        // Headers only: a refused request has no unread body bytes to reset its answer.
        s.write_all(head.as_bytes()).expect("send headers");
        let mut reader = s.try_clone().unwrap();
        let tx = answers_tx.clone();
        std::thread::spawn(move || {
            let mut raw = Vec::new();
            let _ = reader.read_to_end(&mut raw);
            let _ = tx.send((i, raw));
        });
        streams.push(s);
    }
    // Two fit (8 of 10 MiB) and cannot finish before their bodies: the first two answers
    // are the refusals.
    let mut refused = Vec::new();
    for _ in 0..2 {
        let (i, raw) = answers
            .recv_timeout(Duration::from_secs(30))
            .expect("two requests refused before any body was sent");
        let text = String::from_utf8_lossy(&raw).to_ascii_lowercase();
        assert!(text.contains("retry-after: 1\r\n"), "{text}");
        let answer = parse_answer(raw);
        assert_eq!(answer.status, 503, "{}", answer.body);
        let a = answer.json();
        assert_eq!(a["error_code"], 503, "{a}");
        assert!(
            a["message"]
                .as_str()
                .is_some_and(|m| m.contains("admin.max.inflight.request.bytes")),
            "{a}"
        );
        refused.push(i);
    }
    for (i, s) in streams.iter_mut().enumerate() {
        if !refused.contains(&i) {
            s.write_all(body.as_bytes()).expect("send body");
        }
    }
    for _ in 0..2 {
        let (i, raw) = answers
            .recv_timeout(Duration::from_secs(60))
            .expect("the accepted requests answered");
        assert!(!refused.contains(&i));
        let answer = parse_answer(raw);
        assert_eq!(answer.status, 200, "{:.300}", answer.body);
        assert_eq!(answer.json().as_array().map(Vec::len), Some(4096));
    }
    assert_eq!(high_watermark(&b.bootstrap, "big", 0), 2 * 4096);
    // Returned: the same body fits again, and a small one works.
    let again = post(&b.admin_url, "/topics/big/records", &body);
    assert_eq!(again.status, 200, "{:.300}", again.body);
    let small = post(
        &b.admin_url,
        "/topics/big/records",
        r#"{"value": {"type": "STRING", "data": "after"}}"#,
    );
    assert_eq!(small.status, 200, "{}", small.body);
    assert_eq!(small.json()["offset"], 3 * 4096, "{}", small.body);
    // One larger than the whole bound could never fit: 413.
    let huge = http_raw(
        &b.admin_url,
        b"POST /topics/big/records HTTP/1.1\r\nHost: weir\r\nContent-Length: 20000000\r\n\
          Connection: close\r\n\r\n",
    );
    assert_eq!(huge.status, 413, "{}", huge.body);
    assert!(
        huge.body.contains("admin.max.inflight.request.bytes"),
        "{}",
        huge.body
    );
}
