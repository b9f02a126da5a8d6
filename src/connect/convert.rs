//! Converters: how a connector's record keys and values are written to topics (sources)
//! and read back from them (sinks), Kafka Connect's `key.converter` / `value.converter`.
//!
//! A component exchanges bytes with the runtime: a line of a file, a Debezium envelope
//! as JSON, an HTTP body. The converter decides what those bytes become in the topic:
//!
//! | `*.converter` | source: connector bytes → topic | sink: topic → connector bytes |
//! |---|---|---|
//! | `bytes` (default), `org.apache.kafka.connect.converters.ByteArrayConverter` | unchanged | unchanged |
//! | `string`, `org.apache.kafka.connect.storage.StringConverter` | unchanged (UTF-8 is not checked: a line's bytes are kept) | unchanged |
//! | `json`, `org.apache.kafka.connect.json.JsonConverter`, `*.converter.schemas.enable=false` | JSON bytes unchanged; anything else becomes a JSON string | must be JSON; a JSON string is handed over as its text, other JSON unchanged |
//! | the same with `schemas.enable=true` (JsonConverter's default) | `{"schema": <inferred>, "payload": <value>}` | must be `{"schema", "payload"}`; the payload as above |
//!
//! The default is `bytes`, not Kafka Connect's JsonConverter: weir's components already
//! produce serialized data (a CDC connector's JSON envelope), which a second JSON layer
//! would only wrap. Null keys and values (tombstones) stay null both ways.
//!
//! Schemas are inferred from the JSON value as JsonConverter prints them: `string`,
//! `int64`, `double`, `boolean`, `array` (items from the first element, `string` when
//! empty), `struct` (fields in the object's order); a JSON null gets an optional
//! `string` schema. Every schema is `"optional": false` except that of a null.
//!
//! Errors: a sink record that does not convert (not JSON, no envelope) is a
//! [`ConvertError`]: under `errors.tolerance=none` it fails the task, under `all` the
//! record is skipped (and dead-lettered where a dead-letter topic is configured).

use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::{json, Value};

/// One `*.converter` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Converter {
    /// Bytes pass unchanged (ByteArrayConverter).
    Bytes,
    /// Bytes pass unchanged (StringConverter; weir keeps text as UTF-8 bytes).
    String,
    /// JsonConverter; `schemas` = `*.converter.schemas.enable`.
    Json {
        /// Wrap in / expect `{"schema", "payload"}`.
        schemas: bool,
    },
}

/// Why a record could not be converted: which side and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{side} converter: {message}")]
pub(crate) struct ConvertError {
    /// `key` or `value`.
    pub side: &'static str,
    /// What is wrong.
    pub message: String,
}

impl Converter {
    /// Reads `<side>.converter` and `<side>.converter.schemas.enable` from `keys`
    /// (`side` = `key` or `value`).
    ///
    /// Errors: an unknown converter or a `schemas.enable` other than true/false, as
    /// (key, message).
    pub(crate) fn from_keys(
        keys: &BTreeMap<String, String>,
        side: &str,
    ) -> Result<Converter, (String, String)> {
        let key = format!("{side}.converter");
        let schemas_key = format!("{key}.schemas.enable");
        let schemas = match keys.get(&schemas_key).map(|s| s.trim()) {
            None | Some("") | Some("true") => true,
            Some("false") => false,
            Some(other) => return Err((schemas_key, format!("`{other}`: expected true or false"))),
        };
        match keys.get(&key).map(|s| s.trim()).unwrap_or("") {
            "" | "bytes" | "org.apache.kafka.connect.converters.ByteArrayConverter" => {
                Ok(Converter::Bytes)
            }
            "string" | "org.apache.kafka.connect.storage.StringConverter" => Ok(Converter::String),
            "json" | "org.apache.kafka.connect.json.JsonConverter" => {
                Ok(Converter::Json { schemas })
            }
            other => Err((
                key,
                format!("`{other}`: expected bytes, string or json (or Kafka Connect's ByteArrayConverter, StringConverter, JsonConverter class names)"),
            )),
        }
    }

    /// Kafka Connect's class of this converter (the dead-letter header
    /// `__connect.errors.class.name` of a record it failed).
    pub(crate) fn class_name(self) -> &'static str {
        match self {
            Converter::Bytes => "org.apache.kafka.connect.converters.ByteArrayConverter",
            Converter::String => "org.apache.kafka.connect.storage.StringConverter",
            Converter::Json { .. } => "org.apache.kafka.connect.json.JsonConverter",
        }
    }

    /// True when data passes unchanged both ways (`bytes`, `string`).
    pub(crate) fn passes_through(self) -> bool {
        matches!(self, Converter::Bytes | Converter::String)
    }

    /// Source direction: what the connector's `data` becomes in the topic.
    pub(crate) fn to_topic(self, data: Option<Bytes>) -> Option<Bytes> {
        let data = data?;
        match self {
            Converter::Bytes | Converter::String => Some(data),
            Converter::Json { schemas } => {
                let parsed = serde_json::from_slice::<Value>(&data).ok();
                if !schemas {
                    return Some(match parsed {
                        Some(_) => data,
                        None => Bytes::from(
                            Value::String(String::from_utf8_lossy(&data).into_owned()).to_string(),
                        ),
                    });
                }
                let payload = parsed
                    .unwrap_or_else(|| Value::String(String::from_utf8_lossy(&data).into_owned()));
                let envelope = json!({"schema": schema_of(&payload), "payload": payload});
                Some(Bytes::from(envelope.to_string()))
            }
        }
    }

    /// Sink direction: what the connector gets for the topic's `data`.
    ///
    /// Errors: [`ConvertError`] (with `side`) for data a JSON converter cannot read.
    pub(crate) fn to_connector(
        self,
        side: &'static str,
        data: Option<Bytes>,
    ) -> Result<Option<Bytes>, ConvertError> {
        let Some(data) = data else {
            return Ok(None);
        };
        let fail = |message: String| ConvertError { side, message };
        match self {
            Converter::Bytes | Converter::String => Ok(Some(data)),
            Converter::Json { schemas } => {
                let value: Value =
                    serde_json::from_slice(&data).map_err(|e| fail(format!("not JSON ({e})")))?;
                let payload = if schemas {
                    match value {
                        Value::Object(mut o)
                            if o.len() == 2 && o.contains_key("schema") && o.contains_key("payload") =>
                        {
                            o.remove("payload").unwrap_or(Value::Null)
                        }
                        _ => {
                            return Err(fail(
                                "JsonConverter with schemas.enable requires \"schema\" and \"payload\" fields and may not contain additional fields; set schemas.enable=false for plain JSON".into(),
                            ))
                        }
                    }
                } else {
                    return Ok(Some(match value {
                        Value::String(s) => Bytes::from(s),
                        _ => data,
                    }));
                };
                Ok(match payload {
                    Value::Null => None,
                    Value::String(s) => Some(Bytes::from(s)),
                    other => Some(Bytes::from(other.to_string())),
                })
            }
        }
    }
}

/// JsonConverter's schema for a JSON value (see the module docs).
fn schema_of(v: &Value) -> Value {
    match v {
        Value::Null => json!({"type": "string", "optional": true}),
        Value::Bool(_) => json!({"type": "boolean", "optional": false}),
        Value::Number(n) if n.is_i64() || n.is_u64() => json!({"type": "int64", "optional": false}),
        Value::Number(_) => json!({"type": "double", "optional": false}),
        Value::String(_) => json!({"type": "string", "optional": false}),
        Value::Array(items) => json!({
            "type": "array",
            "items": items.first().map(schema_of).unwrap_or_else(|| json!({"type": "string", "optional": false})),
            "optional": false,
        }),
        Value::Object(fields) => json!({
            "type": "struct",
            "fields": fields.iter().map(|(k, v)| {
                let mut s = schema_of(v);
                if let Value::Object(o) = &mut s {
                    o.insert("field".into(), Value::String(k.clone()));
                }
                s
            }).collect::<Vec<_>>(),
            "optional": false,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn settings_take_short_names_and_kafka_class_names() {
        let k = keys(&[
            (
                "value.converter",
                "org.apache.kafka.connect.json.JsonConverter",
            ),
            ("value.converter.schemas.enable", "false"),
            ("key.converter", "string"),
        ]);
        assert_eq!(
            Converter::from_keys(&k, "value").unwrap(),
            Converter::Json { schemas: false }
        );
        assert_eq!(Converter::from_keys(&k, "key").unwrap(), Converter::String);
        assert_eq!(
            Converter::from_keys(&keys(&[]), "value").unwrap(),
            Converter::Bytes
        );
        let e = Converter::from_keys(&keys(&[("value.converter", "avro")]), "value").unwrap_err();
        assert_eq!(e.0, "value.converter");
    }

    #[test]
    fn json_with_schemas_round_trips_text_and_objects() {
        let c = Converter::Json { schemas: true };
        let line = c
            .to_topic(Some(Bytes::from_static(b"hello \xe2\x9c\x93")))
            .unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&line).unwrap(),
            json!({"schema": {"type": "string", "optional": false}, "payload": "hello ✓"})
        );
        assert_eq!(
            c.to_connector("value", Some(line)).unwrap().unwrap(),
            Bytes::from("hello ✓")
        );
        let obj = c
            .to_topic(Some(Bytes::from(
                r#"{"id":1,"name":"a","ok":true,"x":1.5}"#,
            )))
            .unwrap();
        let v: Value = serde_json::from_slice(&obj).unwrap();
        assert_eq!(v["schema"]["type"], "struct");
        assert_eq!(
            v["schema"]["fields"][0],
            json!({"type": "int64", "optional": false, "field": "id"})
        );
        assert_eq!(v["schema"]["fields"][3]["type"], "double");
        assert_eq!(
            serde_json::from_slice::<Value>(&c.to_connector("value", Some(obj)).unwrap().unwrap())
                .unwrap(),
            json!({"id": 1, "name": "a", "ok": true, "x": 1.5})
        );
        assert_eq!(c.to_topic(None), None);
        assert_eq!(c.to_connector("value", None).unwrap(), None);
    }

    #[test]
    fn json_without_schemas_and_bad_input() {
        let c = Converter::Json { schemas: false };
        assert_eq!(
            c.to_topic(Some(Bytes::from("plain"))).unwrap(),
            Bytes::from("\"plain\"")
        );
        assert_eq!(
            c.to_topic(Some(Bytes::from("[1,2]"))).unwrap(),
            Bytes::from("[1,2]")
        );
        assert_eq!(
            c.to_connector("value", Some(Bytes::from("\"plain\"")))
                .unwrap()
                .unwrap(),
            Bytes::from("plain")
        );
        let e = c
            .to_connector("value", Some(Bytes::from("not json")))
            .unwrap_err();
        assert_eq!(e.side, "value");
        let e = Converter::Json { schemas: true }
            .to_connector("key", Some(Bytes::from(r#"{"a":1}"#)))
            .unwrap_err();
        assert!(e.message.contains("schema"), "{e}");
        assert_eq!(
            Converter::Bytes
                .to_topic(Some(Bytes::from_static(b"\xff")))
                .unwrap(),
            Bytes::from_static(b"\xff")
        );
    }
}
