//! The HTTP produce endpoint, in the shape of Confluent REST Proxy v3's "produce records"
//! (`ProduceAction`), so an edge device without a Kafka client — or a REST Proxy client —
//! can feed a topic.
//!
//! Routes: `POST /topics/{topic}/records` and REST Proxy's own path
//! `POST /v3/clusters/{cluster_id}/topics/{topic}/records` (`cluster_id` must be this
//! broker's, else 404).
//!
//! Request body: one record object, several concatenated (REST Proxy's streaming mode;
//! whitespace or newlines between them), or a JSON array of them:
//!
//! ```json
//! {"partition_id": 1,                                   // optional
//!  "headers": [{"name": "h", "value": "<base64>"}],     // optional; value may be null
//!  "key":   {"type": "STRING", "data": "user-17"},      // optional; absent = null key
//!  "value": {"type": "JSON",   "data": {"a": 1}},       // optional; absent = null value
//!  "timestamp": "2024-05-01T12:00:00.123Z"}             // optional RFC 3339; default now
//! ```
//!
//! `type` is `BINARY` (`data` is base64), `STRING` (`data` is a string, stored as UTF-8)
//! or `JSON` (`data` is any JSON, stored as its text exactly as sent); absent means `JSON`.
//! `data` null or absent is a null key or value. The schema-registry formats (`AVRO`,
//! `PROTOBUF`, `JSONSCHEMA`, `subject`, `schema_id`, ...) are refused: weir has no schema
//! registry. Unknown fields are ignored.
//!
//! Records without `partition_id` go where the topic's partitioner puts them (its
//! `partitioner` setting, else Kafka's default murmur2), through [`crate::ingest`]; all
//! records of one request are written in one call (one batch per partition, split at
//! `max.message.bytes`). The topic is auto-created when `auto.create.topics.enable` is on.
//!
//! Response: one result per record, in order. A success is
//! `{"error_code":200,"cluster_id":..,"topic_name":..,"partition_id":..,"offset":..,
//! "timestamp":"<RFC 3339>","key":{"type":..,"size":..},"value":{..}}` (`key`/`value`
//! only when the request had them; `size` is -1 for null, as Kafka's `RecordMetadata`);
//! a failure is `{"error_code":<HTTP status>,"message":..}`. A body holding one record
//! (or one error, e.g. an unknown topic) is answered with that object alone and its status
//! as the HTTP status; otherwise the HTTP status is 200 and the answer is a JSON array
//! (for an array body) or one object per line (for a stream, as REST Proxy streams them).
//! In a stream, a malformed object ends the stream: the records before it are written,
//! and its 400 is the last line.
//!
//! Status codes: 400 malformed JSON, bad base64, unknown `type`, bad timestamp, invalid or
//! internal topic name, empty body; 404 unknown topic (auto-creation off), partition out
//! of range, or another cluster id; 413 a body over `socket.request.max.bytes` (the bound
//! a Kafka Produce frame has too) or a record over `max.message.bytes`; 422 a record the
//! broker refuses (the topic's partitioner trapped, timed out or answered out of range on
//! it; a keyless record on a compacted topic); 500 the topic's partitioner cannot be
//! loaded (its setting is wrong) or the log cannot be written.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use bytes::Bytes;
use kafka_protocol::ResponseError;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::{AdminState, ApiError};
use crate::ingest::{Appended, IngestError};
use crate::plugin::{Header, Record};

/// `POST /topics/{topic}/records`.
pub(crate) async fn produce(
    State(state): State<Arc<AdminState>>,
    Path(topic): Path<String>,
    request: Request,
) -> Response {
    produce_to(&state, &topic, request).await
}

/// `POST /v3/clusters/{cluster_id}/topics/{topic}/records`.
pub(crate) async fn produce_v3(
    State(state): State<Arc<AdminState>>,
    Path((cluster_id, topic)): Path<(String, String)>,
    request: Request,
) -> Response {
    if cluster_id != state.metadata.cluster_id() {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            format!("Cluster {cluster_id} not found."),
        )
        .into_response();
    }
    produce_to(&state, &topic, request).await
}

async fn produce_to(state: &AdminState, topic: &str, request: Request) -> Response {
    let limit_bytes = state.config.socket_request_max_bytes;
    let body = match read_body(request, limit_bytes).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = state.ingest.topic(topic) {
        return ingest_error(&e).into_response();
    }
    let (parsed, array) = parse_body(&body);
    // Records that parsed, with their positions among the answers.
    let mut records = Vec::new();
    let mut partitions = Vec::new();
    let mut formats = Vec::new();
    let mut answers: Vec<Option<Value>> = Vec::with_capacity(parsed.len());
    for item in parsed {
        match item {
            Ok(p) => {
                records.push(p.record);
                partitions.push(p.partition);
                formats.push((answers.len(), p.key_type, p.value_type));
                answers.push(None);
            }
            Err(e) => answers.push(Some(error_json(&e))),
        }
    }
    if answers.is_empty() {
        return ApiError::new(StatusCode::BAD_REQUEST, "no records in the request body")
            .into_response();
    }
    if !records.is_empty() {
        let results = match state.ingest.append_each(topic, &records, &partitions).await {
            Ok(r) => r,
            Err(e) => return ingest_error(&e).into_response(),
        };
        let cluster_id = state.metadata.cluster_id();
        for ((result, record), (at, key_type, value_type)) in
            results.into_iter().zip(&records).zip(formats)
        {
            answers[at] = Some(match result {
                Ok(appended) => {
                    success_json(cluster_id, topic, &appended, record, key_type, value_type)
                }
                Err(e) => error_json(&ingest_error(&e)),
            });
        }
    }
    let answers: Vec<Value> = answers
        .into_iter()
        .map(|a| {
            a.unwrap_or_else(|| {
                error_json(&ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "record not answered",
                ))
            })
        })
        .collect();
    respond(answers, array)
}

/// The answer: one object alone with its status, an array, or one object per line.
fn respond(mut answers: Vec<Value>, array: bool) -> Response {
    if answers.len() == 1 && !array {
        let answer = answers.remove(0);
        let status = answer
            .get("error_code")
            .and_then(Value::as_u64)
            .and_then(|c| u16::try_from(c).ok())
            .and_then(|c| StatusCode::from_u16(c).ok())
            .unwrap_or(StatusCode::OK);
        return (status, axum::Json(answer)).into_response();
    }
    if array {
        return (StatusCode::OK, axum::Json(Value::Array(answers))).into_response();
    }
    let mut text = String::new();
    for a in &answers {
        text.push_str(&a.to_string());
        text.push('\n');
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        text,
    )
        .into_response()
}

/// Reads the whole body, refusing more than `limit_bytes` (413) — from `Content-Length`
/// before reading anything when the client sends it.
async fn read_body(request: Request, limit_bytes: usize) -> Result<Bytes, ApiError> {
    let too_large = |n: String| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body of {n} bytes exceeds socket.request.max.bytes {limit_bytes}"),
        )
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared {
        if n > limit_bytes as u64 {
            return Err(too_large(n.to_string()));
        }
    }
    let body: Body = request.into_body();
    axum::body::to_bytes(body, limit_bytes)
        .await
        .map_err(|_| too_large("more than that".to_string()))
}

/// One record of the body, decoded.
struct Parsed {
    record: Record,
    partition: Option<i32>,
    key_type: Option<Format>,
    value_type: Option<Format>,
}

/// How `data` is turned into bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Binary,
    String,
    Json,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::Binary => "BINARY",
            Format::String => "STRING",
            Format::Json => "JSON",
        }
    }
}

/// A record object as sent (REST Proxy v3's `ProduceRequest`).
#[derive(Deserialize)]
struct RecordIn<'a> {
    #[serde(default)]
    partition_id: Option<i32>,
    #[serde(default)]
    headers: Option<Vec<HeaderIn>>,
    #[serde(default, borrow)]
    key: Option<DataIn<'a>>,
    #[serde(default, borrow)]
    value: Option<DataIn<'a>>,
    #[serde(default)]
    timestamp: Option<String>,
}

#[derive(Deserialize)]
struct HeaderIn {
    name: String,
    #[serde(default)]
    value: Option<String>,
}

/// A key or value as sent: `type`, `data`, and the schema-registry fields weir refuses.
#[derive(Deserialize)]
struct DataIn<'a> {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default, borrow)]
    data: Option<&'a RawValue>,
    #[serde(default)]
    subject: Option<Value>,
    #[serde(default)]
    subject_name_strategy: Option<Value>,
    #[serde(default)]
    schema_id: Option<Value>,
    #[serde(default)]
    schema_version: Option<Value>,
    #[serde(default)]
    schema: Option<Value>,
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, message)
}

/// Splits the body into record objects: a JSON array, or a stream of concatenated
/// objects (a malformed one ends the stream with its error). Returns each record or its
/// error, and whether the body was an array.
fn parse_body(body: &[u8]) -> (Vec<Result<Parsed, ApiError>>, bool) {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'[') {
        return match serde_json::from_slice::<Vec<&RawValue>>(body) {
            Ok(items) => (
                items
                    .into_iter()
                    .map(|raw| {
                        serde_json::from_str::<RecordIn<'_>>(raw.get())
                            .map_err(|e| bad(format!("Error processing JSON: {e}")))
                            .and_then(decode_record)
                    })
                    .collect(),
                true,
            ),
            Err(e) => (vec![Err(bad(format!("Error processing JSON: {e}")))], false),
        };
    }
    let mut out = Vec::new();
    for item in serde_json::Deserializer::from_slice(body).into_iter::<RecordIn<'_>>() {
        match item {
            Ok(r) => out.push(decode_record(r)),
            Err(e) => {
                out.push(Err(bad(format!("Error processing JSON: {e}"))));
                break;
            }
        }
    }
    (out, false)
}

fn decode_record(r: RecordIn<'_>) -> Result<Parsed, ApiError> {
    let (key, key_type) = decode_data("key", r.key.as_ref())?;
    let (value, value_type) = decode_data("value", r.value.as_ref())?;
    let mut headers = Vec::new();
    for h in r.headers.unwrap_or_default() {
        let value = match h.value {
            Some(v) => Some(Bytes::from(decode_base64(&v).map_err(|e| {
                bad(format!("header {:?}: value is not base64: {e}", h.name))
            })?)),
            None => None,
        };
        headers.push(Header { key: h.name, value });
    }
    let timestamp_ms = match r.timestamp {
        Some(t) => parse_rfc3339_ms(&t)
            .ok_or_else(|| bad(format!("timestamp {t:?} is not an RFC 3339 date-time")))?,
        None => now_ms(),
    };
    Ok(Parsed {
        record: Record {
            key,
            value,
            headers,
            timestamp_ms,
        },
        partition: r.partition_id,
        key_type,
        value_type,
    })
}

/// The bytes of a key or value and the format used (`None` when the field was absent).
fn decode_data(
    field: &str,
    data: Option<&DataIn<'_>>,
) -> Result<(Option<Bytes>, Option<Format>), ApiError> {
    let Some(d) = data else {
        return Ok((None, None));
    };
    let registry = [
        ("subject", d.subject.is_some()),
        ("subject_name_strategy", d.subject_name_strategy.is_some()),
        ("schema_id", d.schema_id.is_some()),
        ("schema_version", d.schema_version.is_some()),
        ("schema", d.schema.is_some()),
    ];
    if let Some((name, _)) = registry.iter().find(|(_, set)| *set) {
        return Err(bad(format!(
            "{field}: `{name}` needs a schema registry, which weir does not have"
        )));
    }
    let format = match d.kind.as_deref() {
        None | Some("JSON") => Format::Json,
        Some("BINARY") => Format::Binary,
        Some("STRING") => Format::String,
        Some(t @ ("AVRO" | "PROTOBUF" | "JSONSCHEMA")) => {
            return Err(bad(format!(
                "{field}: type {t} needs a schema registry, which weir does not have \
                 (use BINARY, STRING or JSON)"
            )))
        }
        Some(t) => {
            return Err(bad(format!(
                "{field}: unknown type {t:?} (BINARY, STRING or JSON)"
            )))
        }
    };
    let raw = match d.data {
        Some(raw) if raw.get().trim() != "null" => raw,
        _ => return Ok((None, Some(format))),
    };
    let bytes = match format {
        Format::Json => Bytes::copy_from_slice(raw.get().trim().as_bytes()),
        Format::String | Format::Binary => {
            let text: String = serde_json::from_str(raw.get()).map_err(|_| {
                bad(format!(
                    "{field}: data of type {} must be a JSON string",
                    format.name()
                ))
            })?;
            if format == Format::String {
                Bytes::from(text.into_bytes())
            } else {
                Bytes::from(
                    decode_base64(&text)
                        .map_err(|e| bad(format!("{field}: data is not base64: {e}")))?,
                )
            }
        }
    };
    Ok((Some(bytes), Some(format)))
}

/// Standard base64 (RFC 4648, padded or not), as Jackson reads `byte[]`.
fn decode_base64(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
    use base64::engine::DecodePaddingMode;
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    LENIENT.decode(text.trim())
}

fn success_json(
    cluster_id: &str,
    topic: &str,
    appended: &Appended,
    record: &Record,
    key_type: Option<Format>,
    value_type: Option<Format>,
) -> Value {
    let size = |b: &Option<Bytes>| b.as_ref().map_or(-1, |b| b.len() as i64);
    let mut out = json!({
        "error_code": 200,
        "cluster_id": cluster_id,
        "topic_name": topic,
        "partition_id": appended.partition,
        "offset": appended.offset,
        "timestamp": format_rfc3339_ms(appended.timestamp_ms),
    });
    if let Some(t) = key_type {
        out["key"] = json!({"type": t.name(), "size": size(&record.key)});
    }
    if let Some(t) = value_type {
        out["value"] = json!({"type": t.name(), "size": size(&record.value)});
    }
    out
}

fn error_json(e: &ApiError) -> Value {
    json!({"error_code": e.status.as_u16(), "message": e.message})
}

/// The HTTP answer for an ingest error (see the module docs for the table).
fn ingest_error(e: &IngestError) -> ApiError {
    let status = match e.error {
        ResponseError::UnknownTopicOrPartition => StatusCode::NOT_FOUND,
        ResponseError::InvalidTopicException | ResponseError::InvalidRequest => {
            StatusCode::BAD_REQUEST
        }
        ResponseError::MessageTooLarge | ResponseError::RecordListTooLarge => {
            StatusCode::PAYLOAD_TOO_LARGE
        }
        ResponseError::InvalidRecord => StatusCode::UNPROCESSABLE_ENTITY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    ApiError::new(status, e.message.clone())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Milliseconds since the Unix epoch of an RFC 3339 date-time
/// (`2024-05-01T12:00:00.123456Z`, `...+02:00`; `t`/`z`, a space separator and ISO 8601's
/// `+0200` accepted;
/// digits past milliseconds truncated; a leap second 60 read as 59), parsed by `jiff`.
/// `None` when it is not one (an offset is required: a date-time without one names no
/// instant).
pub(crate) fn parse_rfc3339_ms(text: &str) -> Option<i64> {
    let ts: jiff::Timestamp = text.trim().parse().ok()?;
    Some(ts.as_millisecond())
}

/// `ms` since the Unix epoch as RFC 3339 in UTC with milliseconds
/// (`2024-05-01T12:00:00.123Z`), as REST Proxy writes timestamps. Instants outside
/// jiff's range (about years -9999..=9999) are written as its nearest bound.
pub(crate) fn format_rfc3339_ms(ms: i64) -> String {
    let ts = jiff::Timestamp::from_millisecond(ms).unwrap_or(if ms < 0 {
        jiff::Timestamp::MIN
    } else {
        jiff::Timestamp::MAX
    });
    format!("{ts:.3}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_and_refuses_what_is_not_one() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339_ms("2021-02-05T19:14:42.274Z"),
            Some(1_612_552_482_274)
        );
        assert_eq!(
            parse_rfc3339_ms("2021-02-05T21:14:42.274999+02:00"),
            Some(1_612_552_482_274)
        );
        assert_eq!(parse_rfc3339_ms("1969-12-31T23:59:59.9Z"), Some(-100));
        // ISO 8601's offset without a colon is accepted too (jiff's parser).
        assert_eq!(
            parse_rfc3339_ms("2021-02-05T19:14:42+0200"),
            Some(1_612_545_282_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2024-02-29T00:00:00z"),
            Some(1_709_164_800_000)
        );
        for bad in [
            "",
            "2021-02-05",
            "2021-02-30T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2021-13-01T00:00:00Z",
            "2021-02-05T24:00:00Z",
            "2021-02-05T19:14:42",
            "2021-02-05T19:14:42.Z",
            "2021-02-05T19:14:42Zjunk",
            "２０２１-02-05T19:14:42Z",
            "+021-02-05T19:14:42Z",
        ] {
            assert_eq!(parse_rfc3339_ms(bad), None, "{bad:?}");
        }
        for ms in [
            0,
            -1,
            1_612_552_482_274,
            // jiff's last instant (9999-12-30T22:00:00.999Z: its range leaves room for
            // any UTC offset).
            253_402_207_200_999,
            -62_135_596_800_000,
        ] {
            assert_eq!(parse_rfc3339_ms(&format_rfc3339_ms(ms)), Some(ms), "{ms}");
        }
        assert_eq!(format_rfc3339_ms(i64::MAX), "9999-12-30T22:00:00.999Z");
        assert_eq!(
            format_rfc3339_ms(1_612_552_482_274),
            "2021-02-05T19:14:42.274Z"
        );
    }

    #[test]
    fn bodies_parse_as_streams_or_arrays() {
        let (items, array) = parse_body(
            br#"{"value":{"type":"STRING","data":"a"}} {"key":{"type":"BINARY","data":"AAE="},"value":{"data":{"x":[1, 2]}}}
            {"partition_id":2,"headers":[{"name":"h","value":"aGk="},{"name":"n","value":null}]}"#,
        );
        assert!(!array);
        let items: Vec<Parsed> = items.into_iter().map(|i| i.ok().unwrap()).collect();
        assert_eq!(items[0].record.value.as_deref(), Some(&b"a"[..]));
        assert_eq!(items[1].record.key.as_deref(), Some(&[0u8, 1][..]));
        assert_eq!(
            items[1].record.value.as_deref(),
            Some(&br#"{"x":[1, 2]}"#[..])
        );
        assert_eq!(items[1].value_type, Some(Format::Json));
        assert_eq!(items[2].partition, Some(2));
        assert_eq!(
            items[2].record.headers[0].value.as_deref(),
            Some(&b"hi"[..])
        );
        assert_eq!(items[2].record.headers[1].value, None);
        assert_eq!(items[2].key_type, None);

        let (items, array) =
            parse_body(br#" [{"value":{"data":1}}, {"key":{"type":"AVRO","data":1}}]"#);
        assert!(array);
        assert!(items[0].is_ok());
        assert!(items[1]
            .as_ref()
            .err()
            .unwrap()
            .message
            .contains("schema registry"));

        // A malformed object ends a stream; what came before stands.
        let (items, _) =
            parse_body(br#"{"value":{"data":1}} {"value": nope} {"value":{"data":2}}"#);
        assert_eq!(items.len(), 2);
        assert!(items[0].is_ok());
        assert_eq!(
            items[1].as_ref().err().unwrap().status,
            StatusCode::BAD_REQUEST
        );

        for bad in [
            &br#"{"key":{"type":"BINARY","data":"!!"}}"#[..],
            br#"{"key":{"type":"STRING","data":5}}"#,
            br#"{"key":{"type":"NOPE","data":"x"}}"#,
            br#"{"timestamp":"yesterday"}"#,
            br#"{"headers":[{"name":"h","value":"%%"}]}"#,
            br#"{"partition_id":"one"}"#,
        ] {
            let (items, _) = parse_body(bad);
            assert_eq!(items.len(), 1);
            let e = items.into_iter().next().unwrap().err().unwrap();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{}", e.message);
        }
    }
}
