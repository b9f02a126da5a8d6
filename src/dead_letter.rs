//! Dead-letter records: the one format and the one writer for records that a transform
//! (inline or async) or a connector could not handle (a sink's errant records, a source's
//! records their topic refuses) under `errors.tolerance=all`
//! with `errors.deadletterqueue.topic.name` set.
//!
//! A dead-letter record is the failing record as it was read (key, value, timestamp,
//! headers), with these headers appended (values are UTF-8 text). The `__connect.errors.*`
//! names and meanings are Kafka Connect's (KIP-298, `DeadLetterQueueReporter` with
//! `errors.deadletterqueue.context.headers.enable=true`), so tools that read a Connect
//! DLQ read weir's; the `weir.errors.*` ones carry what Connect has no name for.
//!
//! | header | value | written by |
//! |---|---|---|
//! | `__connect.errors.topic` | topic the record was read from (or produced to: inline, a source's refused record) | all |
//! | `__connect.errors.partition` | its partition, decimal | all |
//! | `__connect.errors.offset` | its offset, decimal (inline: the offset it would have had, now a gap; -1 when unknown) | all |
//! | `__connect.errors.stage` | Kafka Connect's stage: `TRANSFORMATION`, `KEY_CONVERTER`, `VALUE_CONVERTER`, `TASK_PUT`, `KAFKA_PRODUCE` (an async transform's output or a source's record could not be written) | all |
//! | `__connect.errors.class.name` | the component of that stage: a transform's component file (`redact.wasm`), a connector's `connector.class`, a converter's name | all |
//! | `__connect.errors.exception.class.name` | kind of failure: a plugin error kind (`Trap`, `Timeout`, `MemoryLimit`, `Failed`, `BadOutput`, ...), `FanOut`/`Route` (inline), `OutputWrite` (async), `ErrantRecord` (KIP-610 report), `DataException` (converter), `RecordTooLargeException`/`InvalidRecordException` (a source's record its topic refuses) | all |
//! | `__connect.errors.exception.message` | the failure's message | all |
//! | `__connect.errors.connector.name` | the connector's name | connectors |
//! | `weir.errors.transform` | the transform deployment's name | transforms |
//! | `weir.errors.plugin.version` | content hash (sha256, hex) of the transform component that failed | transforms |
//!
//! Owns: the header names and [`write`]. Never does: decide whether a record goes to the
//! dead-letter topic (`errors.tolerance` is the caller's) or retry a failed append.

use bytes::Bytes;

use crate::ingest::{Ingest, IngestError};
use crate::plugin::{Header, PluginError, Record};

/// The header names (see the module doc for each one's value).
pub(crate) mod headers {
    /// Source topic (Kafka Connect).
    pub(crate) const TOPIC: &str = "__connect.errors.topic";
    /// Source partition (Kafka Connect).
    pub(crate) const PARTITION: &str = "__connect.errors.partition";
    /// Source offset (Kafka Connect).
    pub(crate) const OFFSET: &str = "__connect.errors.offset";
    /// The failed stage (Kafka Connect's `Stage` names).
    pub(crate) const STAGE: &str = "__connect.errors.stage";
    /// The component executing that stage (Kafka Connect: its class).
    pub(crate) const CLASS_NAME: &str = "__connect.errors.class.name";
    /// Kind of failure (Kafka Connect: the exception's class).
    pub(crate) const EXCEPTION_CLASS_NAME: &str = "__connect.errors.exception.class.name";
    /// The failure's message (Kafka Connect).
    pub(crate) const EXCEPTION_MESSAGE: &str = "__connect.errors.exception.message";
    /// Connector name (Kafka Connect); sink connectors only.
    pub(crate) const CONNECTOR_NAME: &str = "__connect.errors.connector.name";
    /// Transform deployment name (weir); transforms only.
    pub(crate) const TRANSFORM: &str = "weir.errors.transform";
    /// Content hash of the transform component (weir); transforms only.
    pub(crate) const PLUGIN_VERSION: &str = "weir.errors.plugin.version";
}

/// Kafka Connect's stage of a failure (`org.apache.kafka.connect.runtime.errors.Stage`),
/// the value of [`headers::STAGE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// A transform (weir transform or a connector's SMT chain).
    Transformation,
    /// A sink's key converter.
    KeyConverter,
    /// A sink's value converter.
    ValueConverter,
    /// A sink's `put` (the sink reported the record errant, KIP-610).
    TaskPut,
    /// Writing a record to its topic (an async transform's output, a source's record).
    KafkaProduce,
}

impl Stage {
    /// Kafka Connect's name of the stage.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Stage::Transformation => "TRANSFORMATION",
            Stage::KeyConverter => "KEY_CONVERTER",
            Stage::ValueConverter => "VALUE_CONVERTER",
            Stage::TaskPut => "TASK_PUT",
            Stage::KafkaProduce => "KAFKA_PRODUCE",
        }
    }
}

/// Who sent the records to the dead-letter topic: one per [`write`] call.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Owner<'a> {
    /// A transform deployment (inline or async).
    Transform {
        /// Deployment name.
        name: &'a str,
        /// Content hash of the component (sha256, hex).
        version: &'a str,
    },
    /// A connector (a sink's errant records, a source's refused ones).
    Connector {
        /// Connector name.
        name: &'a str,
    },
}

/// One failing record and where and why it failed.
#[derive(Debug, Clone)]
pub(crate) struct DeadLetter {
    /// The record as it was read.
    pub record: Record,
    /// Topic it was read from.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset (-1 when unknown).
    pub offset: i64,
    /// The failed stage.
    pub stage: Stage,
    /// The component of that stage ([`headers::CLASS_NAME`]).
    pub class_name: String,
    /// Kind of failure ([`headers::EXCEPTION_CLASS_NAME`]; see [`plugin_error_kind`]).
    pub kind: &'static str,
    /// The failure's message.
    pub message: String,
}

/// Appends `letters` to the dead-letter topic `dlq` (auto-created as any topic the broker
/// writes), each with the headers of the module doc, in order, through `ingest`.
/// Returns how many were written.
///
/// Errors: [`IngestError`] from the append (the caller decides: a transform or sink task
/// fails, the produce path logs).
pub(crate) async fn write(
    ingest: &Ingest,
    dlq: &str,
    owner: Owner<'_>,
    letters: Vec<DeadLetter>,
) -> Result<usize, IngestError> {
    if letters.is_empty() {
        return Ok(0);
    }
    let records = records(owner, letters);
    ingest.append(dlq, None, &records).await?;
    Ok(records.len())
}

/// The dead-letter records of `letters` (each its record with the error headers), for a
/// caller that writes them itself (an exactly-once transform, in its transaction).
pub(crate) fn records(owner: Owner<'_>, letters: Vec<DeadLetter>) -> Vec<Record> {
    letters
        .into_iter()
        .map(|l| with_headers(l, owner))
        .collect()
}

/// The dead-letter record of `letter`: its record with the headers appended.
fn with_headers(letter: DeadLetter, owner: Owner<'_>) -> Record {
    let mut record = letter.record;
    let mut add = |key: &str, value: String| {
        record.headers.push(Header {
            key: key.to_string(),
            value: Some(Bytes::from(value)),
        })
    };
    add(headers::TOPIC, letter.topic);
    add(headers::PARTITION, letter.partition.to_string());
    add(headers::OFFSET, letter.offset.to_string());
    add(headers::STAGE, letter.stage.as_str().to_string());
    add(headers::CLASS_NAME, letter.class_name);
    add(headers::EXCEPTION_CLASS_NAME, letter.kind.to_string());
    add(headers::EXCEPTION_MESSAGE, letter.message);
    match owner {
        Owner::Transform { name, version } => {
            add(headers::TRANSFORM, name.to_string());
            add(headers::PLUGIN_VERSION, version.to_string());
        }
        Owner::Connector { name } => add(headers::CONNECTOR_NAME, name.to_string()),
    }
    record
}

/// The kind of a plugin failure, as [`headers::EXCEPTION_CLASS_NAME`] carries it: the
/// [`PluginError`] variant's name (`Trap`, `Timeout`, `MemoryLimit`, `Failed`, ...).
pub(crate) fn plugin_error_kind(e: &PluginError) -> &'static str {
    match e {
        PluginError::Read { .. } => "Read",
        PluginError::NotWasm { .. } => "NotWasm",
        PluginError::NotComponent { .. } => "NotComponent",
        PluginError::Compile { .. } => "Compile",
        PluginError::WrongWorld { .. } => "WrongWorld",
        PluginError::Open { .. } => "Open",
        PluginError::Timeout { .. } => "Timeout",
        PluginError::MemoryLimit { .. } => "MemoryLimit",
        PluginError::Trap { .. } => "Trap",
        PluginError::Failed { .. } => "Failed",
        PluginError::BadOutput { .. } => "BadOutput",
        PluginError::InvalidCall { .. } => "InvalidCall",
        PluginError::Host { .. } => "Host",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'a>(r: &'a Record, key: &str) -> Option<&'a str> {
        r.headers
            .iter()
            .find(|h| h.key == key)
            .and_then(|h| h.value.as_deref())
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    fn letter() -> DeadLetter {
        DeadLetter {
            record: Record {
                key: Some(Bytes::from_static(b"k")),
                value: None,
                headers: vec![Header {
                    key: "own".into(),
                    value: None,
                }],
                timestamp_ms: 7,
            },
            topic: "in".into(),
            partition: 2,
            offset: 41,
            stage: Stage::Transformation,
            class_name: "redact.wasm".into(),
            kind: "Trap",
            message: "boom".into(),
        }
    }

    #[test]
    fn a_transform_letter_keeps_the_record_and_names_the_deployment() {
        let owner = Owner::Transform {
            name: "scrub",
            version: "abc123",
        };
        let r = with_headers(letter(), owner);
        assert_eq!(r.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(r.timestamp_ms, 7);
        assert_eq!(
            r.headers[0].key, "own",
            "the record's own headers come first"
        );
        assert_eq!(header(&r, headers::TOPIC), Some("in"));
        assert_eq!(header(&r, headers::PARTITION), Some("2"));
        assert_eq!(header(&r, headers::OFFSET), Some("41"));
        assert_eq!(header(&r, headers::STAGE), Some("TRANSFORMATION"));
        assert_eq!(header(&r, headers::CLASS_NAME), Some("redact.wasm"));
        assert_eq!(header(&r, headers::EXCEPTION_CLASS_NAME), Some("Trap"));
        assert_eq!(header(&r, headers::EXCEPTION_MESSAGE), Some("boom"));
        assert_eq!(header(&r, headers::TRANSFORM), Some("scrub"));
        assert_eq!(header(&r, headers::PLUGIN_VERSION), Some("abc123"));
        assert_eq!(header(&r, headers::CONNECTOR_NAME), None);
    }

    #[test]
    fn a_connector_letter_names_the_connector_only() {
        let mut l = letter();
        l.stage = Stage::TaskPut;
        let r = with_headers(l, Owner::Connector { name: "to-db" });
        assert_eq!(header(&r, headers::STAGE), Some("TASK_PUT"));
        assert_eq!(header(&r, headers::CONNECTOR_NAME), Some("to-db"));
        assert_eq!(header(&r, headers::TRANSFORM), None);
        assert_eq!(header(&r, headers::PLUGIN_VERSION), None);
    }
}
