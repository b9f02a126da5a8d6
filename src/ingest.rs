//! Records the broker writes itself: transform outputs, dead-letter records, the HTTP
//! produce endpoint and (later) connector source records.
//!
//! [`Ingest::append`] takes plain records for one topic, chooses each record's partition
//! (the caller's choice, else the topic's partitioner: Kafka's default — murmur2 of the key,
//! keyless records spread), encodes one record batch (magic 2, uncompressed, CreateTime)
//! per partition and appends it through the replica manager, as a Produce with acks=1
//! would. The topic is auto-created when `auto.create.topics.enable` allows.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::BytesMut;
use kafka_protocol::records::{
    Compression, Record as KafkaRecord, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use kafka_protocol::ResponseError;

use crate::cluster::{is_internal_topic, TopicMeta};
use crate::log::split_batches;
use crate::plugin::Record;
use crate::protocol::{topics, Context};

/// Why records could not be written: the Kafka error a Produce would have got, and a
/// message for logs and HTTP bodies.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message} (Kafka error {})", error.code())]
pub struct IngestError {
    /// The Kafka error code (UNKNOWN_TOPIC_OR_PARTITION, INVALID_TOPIC_EXCEPTION,
    /// MESSAGE_TOO_LARGE, KAFKA_STORAGE_ERROR, ...).
    pub error: ResponseError,
    /// What went wrong, naming the topic and partition.
    pub message: String,
}

/// Where one record went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// Partition index.
    pub partition: i32,
    /// The record's offset.
    pub offset: i64,
}

/// Writes records into the broker's own logs (see the module docs).
#[derive(Debug)]
pub struct Ingest {
    ctx: Context,
    /// Round-robin counter for keyless records (Kafka's default spreads them).
    next_keyless: AtomicU32,
}

impl Ingest {
    /// An ingest path over the broker's owners.
    pub fn new(ctx: Context) -> Ingest {
        Ingest {
            ctx,
            next_keyless: AtomicU32::new(0),
        }
    }

    /// The broker's owners this path writes through.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The topic, auto-created when the broker allows it.
    ///
    /// Errors: INVALID_TOPIC_EXCEPTION (17) for an internal or invalid name,
    /// UNKNOWN_TOPIC_OR_PARTITION (3) when it does not exist and auto-creation is off.
    pub fn topic(&self, topic: &str) -> Result<TopicMeta, IngestError> {
        if is_internal_topic(topic) {
            return Err(IngestError {
                error: ResponseError::InvalidTopicException,
                message: format!("cannot write to internal topic {topic}"),
            });
        }
        topics::get_or_auto_create(&self.ctx, topic, true).map_err(|e| IngestError {
            error: e.error,
            message: format!("topic {topic}: {}", e.message),
        })
    }

    /// Kafka's default partition for a record: murmur2 of the key (masked positive, mod
    /// `partitions`) — the same as the Java client, librdkafka's `murmur2_random` and the
    /// `murmur2` plugin —, keyless records round-robin. `partitions` ≥ 1.
    pub fn default_partition(&self, key: Option<&[u8]>, partitions: i32) -> i32 {
        let n = partitions.max(1);
        match key {
            Some(k) => (murmur2(k) & 0x7fff_ffff) % n,
            None => (self.next_keyless.fetch_add(1, Ordering::Relaxed) % n as u32) as i32,
        }
    }

    /// Appends `records` to `topic`: each to `partition` when given, else to the
    /// partition the topic's partitioner chooses. One batch per partition, in record order.
    /// Returns where each record went, in input order.
    ///
    /// Errors: [`IngestError`] from [`Ingest::topic`]; UNKNOWN_TOPIC_OR_PARTITION for a
    /// partition out of range; MESSAGE_TOO_LARGE for a batch over `max.message.bytes`;
    /// INVALID_RECORD for a keyless record on a compacted topic; the log's error
    /// (KAFKA_STORAGE_ERROR) when the append fails. Partitions written before a failure
    /// stay written.
    pub fn append(
        &self,
        topic: &str,
        partition: Option<i32>,
        records: &[Record],
    ) -> Result<Vec<Appended>, IngestError> {
        let meta = self.topic(topic)?;
        let mut by_partition: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
        for (i, r) in records.iter().enumerate() {
            let p = match partition {
                Some(p) => p,
                None => self.default_partition(r.key.as_deref(), meta.partitions),
            };
            by_partition.entry(p).or_default().push(i);
        }
        let mut out = vec![
            Appended {
                partition: -1,
                offset: -1
            };
            records.len()
        ];
        for (p, indexes) in by_partition {
            let batch: Vec<&Record> = indexes.iter().map(|&i| &records[i]).collect();
            let base = self.append_batch(&meta, p, &batch)?;
            for (n, &i) in indexes.iter().enumerate() {
                out[i] = Appended {
                    partition: p,
                    offset: base + n as i64,
                };
            }
        }
        Ok(out)
    }

    /// Encodes `records` as one batch and appends it to partition `index` of `meta`.
    /// Returns the base offset.
    fn append_batch(
        &self,
        meta: &TopicMeta,
        index: i32,
        records: &[&Record],
    ) -> Result<i64, IngestError> {
        let topic = &meta.name;
        let fail = |error: ResponseError, message: String| IngestError {
            error,
            message: format!("{topic}-{index}: {message}"),
        };
        let partition = self.ctx.replicas.partition(topic, index).ok_or_else(|| {
            fail(
                ResponseError::UnknownTopicOrPartition,
                format!("no partition {index} (the topic has {})", meta.partitions),
            )
        })?;
        let settings = partition.settings();
        if settings.require_keys && records.iter().any(|r| r.key.is_none()) {
            return Err(fail(
                ResponseError::InvalidRecord,
                "Compacted topic cannot accept message without key".into(),
            ));
        }
        let encoded: Vec<KafkaRecord> = records
            .iter()
            .enumerate()
            .map(|(i, r)| KafkaRecord {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: -1,
                timestamp: r.timestamp_ms,
                key: r.key.clone(),
                value: r.value.clone(),
                headers: r
                    .headers
                    .iter()
                    .map(|h| (h.key.clone().into(), h.value.clone()))
                    .collect(),
            })
            .collect();
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &encoded,
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .map_err(|e| fail(ResponseError::CorruptMessage, format!("cannot encode: {e}")))?;
        if buf.len() > settings.max_message_bytes {
            return Err(fail(
                ResponseError::MessageTooLarge,
                format!(
                    "record batch of {} bytes exceeds max.message.bytes {}",
                    buf.len(),
                    settings.max_message_bytes
                ),
            ));
        }
        let batches = split_batches(buf.freeze())
            .map_err(|e| fail(ResponseError::CorruptMessage, e.to_string()))?;
        let info = self
            .ctx
            .replicas
            .append(&partition, batches)
            .map_err(|e| fail(crate::protocol::produce::log_error_code(&e), e.to_string()))?;
        Ok(info.base_offset)
    }
}

/// Kafka's murmur2 (the Java client's `Utils.murmur2`, seed 0x9747b28c), as a signed
/// 32-bit value. Partitioners mask it with `0x7fffffff` before taking the modulus.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

#[cfg(test)]
mod tests {
    use super::murmur2;

    /// Vectors from the Java client's `UtilsTest.testMurmur2`.
    #[test]
    fn murmur2_matches_the_java_client() {
        let cases: &[(&[u8], i32)] = &[
            (b"21", -973932308),
            (b"foobar", -790332482),
            (b"a-little-bit-long-string", -985981536),
            (b"a-little-bit-longer-string", -1486304829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58897971,
            ),
            (b"abc", 479470107),
        ];
        for (input, want) in cases {
            assert_eq!(
                murmur2(input),
                *want,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }
}
