//! Produce (key 0), v3–v10. Protocol guide "Produce"; KIP-98 (idempotence), KIP-74,
//! KIP-110 (zstd needs v7+), KIP-467 (record_errors: filled, v8+, for the keyless records a
//! topic whose `cleanup.policy` contains `compact` refuses — the batch fails with
//! INVALID_RECORD and the client fails the other records with a local error of its own;
//! other errors are whole-batch).
//!
//! For each partition: find the topic (auto-creating it when enabled), split the records
//! field into record batches and validate each (magic 2, length, CRC-32C), check its size
//! against `max.message.bytes` and its codec against the request version, walk its records
//! (`records::validate_records`: bounded decompression, every length, count and offset
//! delta), then — when the topic has an inline transform (`transform::apply`) — run the
//! records through it and re-encode the batch at the same offsets, then append through the
//! replica manager. Batches are otherwise stored as sent: never re-encoded. acks=0 does the work and sends nothing; acks=1 and acks=-1 answer once the
//! batch is in the log (on one node the log is the whole ISR).
//!
//! Errors returned per partition: UNKNOWN_TOPIC_OR_PARTITION (3), CORRUPT_MESSAGE (2),
//! MESSAGE_TOO_LARGE (10), INVALID_TOPIC_EXCEPTION (17; also for internal topics such as `__consumer_offsets`), INVALID_REQUIRED_ACKS (21),
//! OUT_OF_ORDER_SEQUENCE_NUMBER (45), INVALID_PRODUCER_EPOCH (47),
//! KAFKA_STORAGE_ERROR (56), UNSUPPORTED_COMPRESSION_TYPE (76), INVALID_RECORD (87; also
//! when an inline transform fails under `errors.tolerance=none`, with KIP-467 record errors
//! naming the record when the plugin did).

use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::log::{split_batches, BatchError, Compression, LogError};

use crate::cluster::is_internal_topic;
use crate::transform::apply as inline;

use super::records::{validate_records, RecordLimits, KEYLESS_RECORD};
use super::{topics, Context};

fn partition_error(
    index: i32,
    error: ResponseError,
    message: Option<String>,
) -> PartitionProduceResponse {
    PartitionProduceResponse::default()
        .with_index(index)
        .with_error_code(error.code())
        .with_base_offset(-1)
        .with_log_append_time_ms(-1)
        .with_log_start_offset(-1)
        .with_error_message(message.map(StrBytes::from_string))
}

/// The Kafka error for a log failure.
pub fn log_error_code(e: &LogError) -> ResponseError {
    match e {
        LogError::OutOfOrderSequence { .. } => ResponseError::OutOfOrderSequenceNumber,
        LogError::InvalidProducerEpoch { .. } => ResponseError::InvalidProducerEpoch,
        LogError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
        _ => ResponseError::KafkaStorageError,
    }
}

fn batch_error_code(e: &BatchError) -> ResponseError {
    match e {
        BatchError::UnsupportedCompression { .. } => ResponseError::UnsupportedCompressionType,
        BatchError::InvalidRecord { .. } => ResponseError::InvalidRecord,
        _ => ResponseError::CorruptMessage,
    }
}

/// Handles a Produce request; `None` for acks=0 (no response is sent).
pub async fn handle(
    ctx: &Context,
    request: ProduceRequest,
    version: i16,
) -> Option<ProduceResponse> {
    let acks = request.acks;
    let mut responses = Vec::with_capacity(request.topic_data.len());
    for topic in request.topic_data {
        let name = topic.name.0.as_str().to_string();
        let meta = if is_internal_topic(&name) {
            // Kafka: "Cannot append to internal topic" — only the coordinators write there.
            Err(ResponseError::InvalidTopicException)
        } else if (-1..=1).contains(&acks) {
            topics::get_or_auto_create(ctx, &name, true).map_err(|e| e.error)
        } else {
            Err(ResponseError::InvalidRequiredAcks)
        };
        // One look-up per topic; an empty registry answers without hashing the name.
        let inline = meta.as_ref().ok().and_then(|_| ctx.inline.get(&name));
        let mut partitions = Vec::with_capacity(topic.partition_data.len());
        for pd in topic.partition_data {
            let index = pd.index;
            let meta = match &meta {
                Ok(m) => m,
                Err(e) => {
                    partitions.push(partition_error(index, *e, None));
                    continue;
                }
            };
            let Some(partition) = ctx.replicas.partition(&meta.name, index) else {
                partitions.push(partition_error(
                    index,
                    ResponseError::UnknownTopicOrPartition,
                    None,
                ));
                continue;
            };
            let Some(records) = pd.records.filter(|r| !r.is_empty()) else {
                partitions.push(partition_error(
                    index,
                    ResponseError::InvalidRecord,
                    Some("produce request with no record batches".into()),
                ));
                continue;
            };
            let batches = match split_batches(records) {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(topic = %name, partition = index, error = %e, "refused produce batch");
                    partitions.push(partition_error(
                        index,
                        batch_error_code(&e),
                        Some(e.to_string()),
                    ));
                    continue;
                }
            };
            // One copy for the whole request: a concurrent AlterConfigs applies from the next.
            let settings = partition.settings();
            let max = settings.max_message_bytes;
            if let Some(big) = batches.iter().find(|b| b.len() > max) {
                let msg = format!(
                    "record batch of {} bytes exceeds max.message.bytes {max}",
                    big.len()
                );
                tracing::debug!(topic = %name, partition = index, "{msg}");
                partitions.push(partition_error(
                    index,
                    ResponseError::MessageTooLarge,
                    Some(msg),
                ));
                continue;
            }
            if version < 7 && batches.iter().any(|b| b.compression() == Compression::Zstd) {
                partitions.push(partition_error(
                    index,
                    ResponseError::UnsupportedCompressionType,
                    Some("zstd needs Produce v7+".into()),
                ));
                continue;
            }
            // Every record of every batch, as Kafka's LogValidator (see `records`).
            let limits = RecordLimits {
                require_keys: settings.require_keys,
                ..RecordLimits::for_max_message_bytes(max)
            };
            if let Some(e) = batches
                .iter()
                .find_map(|b| validate_records(b, limits).err())
            {
                tracing::warn!(topic = %name, partition = index, error = %e, "refused produce batch");
                let mut response = partition_error(index, e.kafka_error(), Some(e.to_string()));
                if version >= 8 {
                    // KIP-467: the client fails exactly these records with INVALID_RECORD.
                    response = response.with_record_errors(
                        e.record_indexes()
                            .iter()
                            .map(|&i| {
                                BatchIndexAndErrorMessage::default()
                                    .with_batch_index(i)
                                    .with_batch_index_error_message(Some(StrBytes::from_string(
                                        format!(
                                            "{KEYLESS_RECORD} in topic partition {name}-{index}."
                                        ),
                                    )))
                            })
                            .collect(),
                    );
                }
                partitions.push(response);
                continue;
            }
            // Inline transform: the records are rewritten before anything is appended.
            let mut dead_letters = Vec::new();
            let target = inline::Target {
                topic: &name,
                partition: index,
                compression: settings.compression,
                max_decompressed_bytes: limits.max_decompressed_bytes,
                max_message_bytes: max,
            };
            let batches = match &inline {
                None => batches,
                Some(slot) => match inline::apply(slot, target, batches).await {
                    Ok(applied) => {
                        dead_letters = applied.dead_letters;
                        applied.batches
                    }
                    Err(refused) => {
                        let mut response =
                            partition_error(index, refused.error, Some(refused.message.clone()));
                        if version >= 8 && !refused.record_errors.is_empty() {
                            response = response.with_record_errors(
                                refused
                                    .record_errors
                                    .into_iter()
                                    .map(|(i, message)| {
                                        BatchIndexAndErrorMessage::default()
                                            .with_batch_index(i)
                                            .with_batch_index_error_message(Some(
                                                StrBytes::from_string(message),
                                            ))
                                    })
                                    .collect(),
                            );
                        }
                        partitions.push(response);
                        continue;
                    }
                },
            };
            // Offsets each batch spans (for the dead-letter headers): lastOffsetDelta + 1.
            let spans: Vec<i64> = if dead_letters.is_empty() {
                Vec::new()
            } else {
                batches
                    .iter()
                    .map(|b| i64::from(b.last_offset_delta()) + 1)
                    .collect()
            };
            let appended = crate::metrics::Appended::of(&batches);
            match ctx.replicas.append(&partition, batches) {
                Ok(info) => {
                    ctx.metrics.produced(&name, appended);
                    // A duplicate (a retry) wrote nothing: its dead letters were written
                    // the first time.
                    let dlq = !dead_letters.is_empty() && !info.duplicate;
                    if let Some(slot) = inline.as_ref().filter(|_| dlq) {
                        let bases: Vec<i64> = spans
                            .iter()
                            .scan(info.base_offset, |next, span| {
                                let base = *next;
                                *next += span;
                                Some(base)
                            })
                            .collect();
                        inline::write_dead_letters(ctx, slot, target, dead_letters, &bases).await;
                    }
                    partitions.push(
                        PartitionProduceResponse::default()
                            .with_index(index)
                            .with_base_offset(info.base_offset)
                            .with_log_append_time_ms(info.log_append_time_ms)
                            .with_log_start_offset(info.log_start_offset),
                    )
                }
                Err(e) => {
                    let code = log_error_code(&e);
                    if code == ResponseError::KafkaStorageError {
                        tracing::error!(topic = %name, partition = index, error = %e, "append failed");
                    } else {
                        tracing::debug!(topic = %name, partition = index, error = %e, "append refused");
                    }
                    partitions.push(partition_error(index, code, Some(e.to_string())));
                }
            }
        }
        responses.push(
            TopicProduceResponse::default()
                .with_name(topic.name)
                .with_partition_responses(partitions),
        );
    }
    if acks == 0 {
        return None;
    }
    Some(ProduceResponse::default().with_responses(responses))
}
