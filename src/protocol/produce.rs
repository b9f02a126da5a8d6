//! Produce (key 0), v3–v12. Protocol guide "Produce"; KIP-98 (idempotence), KIP-74,
//! KIP-110 (zstd needs v7+), KIP-467 (record_errors: filled, v8+, for the keyless records a
//! topic whose `cleanup.policy` contains `compact` refuses — the batch fails with
//! INVALID_RECORD and the client fails the other records with a local error of its own;
//! other errors are whole-batch), KIP-890 (v11 may answer TRANSACTION_ABORTABLE, which
//! weir never does; v12: the leader adds a transactional batch's partition to the
//! producer's transaction, part 2, instead of checking it was added, part 1).
//!
//! Per topic: find it (auto-creating it when enabled) and its inline transform. Per
//! partition (`produce_partition`), four steps, each a function:
//! 1. `validate`: the partition exists and this broker leads it (else
//!    NOT_LEADER_OR_FOLLOWER, 6: the client refreshes Metadata); the records field splits into record batches
//!    that are each whole (magic 2, length, CRC-32C), within `max.message.bytes`, of a
//!    codec the request version allows, and whose every record walks
//!    (`records::validate_records`: bounded decompression, every length, count and
//!    offset delta).
//! 2. `transform_inline`, when the topic has an inline transform (`transform::apply`):
//!    the records go through it and each batch is re-encoded at the same offsets.
//!    Batches are otherwise stored as sent: never re-encoded.
//! 3. `append` through the replica manager, then the transform's dead letters.
//! 4. `respond`: the partition's answer from the append's outcome.
//!
//! acks=0 does the work and sends nothing; acks=1 answers once the batch is in the
//! leader's log; acks=-1 (all) is refused with NOT_ENOUGH_REPLICAS (19) before anything
//! is written when the ISR is smaller than `min.insync.replicas`, else parks on the
//! partition's high watermark until it passes the batch (every in-sync replica has it),
//! or answers REQUEST_TIMED_OUT (7) at `timeout_ms`, NOT_ENOUGH_REPLICAS_AFTER_APPEND
//! (20) when the ISR shrank below `min.insync.replicas` meanwhile, or
//! NOT_LEADER_OR_FOLLOWER (6) when this broker stopped leading (Kafka's
//! `DelayedProduce`). On one node the ISR is the broker itself, so the append already
//! advanced the high watermark.
//!
//! Errors returned per partition: UNKNOWN_TOPIC_OR_PARTITION (3), CORRUPT_MESSAGE (2),
//! REQUEST_TIMED_OUT (7), MESSAGE_TOO_LARGE (10), INVALID_TOPIC_EXCEPTION (17; also for internal topics such as `__consumer_offsets`), INVALID_REQUIRED_ACKS (21),
//! OUT_OF_ORDER_SEQUENCE_NUMBER (45), INVALID_PRODUCER_EPOCH (47),
//! KAFKA_STORAGE_ERROR (56), UNSUPPORTED_COMPRESSION_TYPE (76), INVALID_RECORD (87; also
//! when an inline transform fails under `errors.tolerance=none`, with KIP-467 record errors
//! naming the record when the plugin did).

use std::sync::Arc;

use kafka_protocol::messages::produce_request::PartitionProduceData;
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::cluster::{is_internal_topic, TopicMeta};
use crate::log::{split_batches, AppendInfo, BatchError, Compression, LogError, ValidatedBatch};
use crate::replica::Partition;
use crate::topics;
use crate::transform::apply::{self as inline, Applied};
use crate::transform::inline::InlineSlot;

use super::records::{validate_records, RecordLimits, KEYLESS_RECORD};
use super::Context;

/// The longest acks=all wait honoured (a limit on every wait), 5 minutes.
const MAX_TIMEOUT_MS: i32 = 5 * 60 * 1000;

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

/// KIP-467 (v8+): the records of the batch an error names, so the client fails exactly
/// those with INVALID_RECORD; older versions carry the message only.
fn with_record_errors(
    response: PartitionProduceResponse,
    version: i16,
    record_errors: impl IntoIterator<Item = (i32, String)>,
) -> PartitionProduceResponse {
    if version < 8 {
        return response;
    }
    let errors: Vec<BatchIndexAndErrorMessage> = record_errors
        .into_iter()
        .map(|(i, message)| {
            BatchIndexAndErrorMessage::default()
                .with_batch_index(i)
                .with_batch_index_error_message(Some(StrBytes::from_string(message)))
        })
        .collect();
    if errors.is_empty() {
        return response;
    }
    response.with_record_errors(errors)
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
    client_id: &str,
) -> Option<ProduceResponse> {
    let acks = request.acks;
    let from_broker = crate::peer::is_broker_client(client_id, &ctx.metadata.image());
    // acks=all: one deadline for the whole request, as Kafka's DelayedProduce.
    let acks_all_deadline = (acks == -1).then(|| {
        tokio::time::Instant::now()
            + std::time::Duration::from_millis(request.timeout_ms.clamp(0, MAX_TIMEOUT_MS) as u64)
    });
    let transactional_id = request.transactional_id.as_ref().map(|t| t.0.to_string());
    let mut responses = Vec::with_capacity(request.topic_data.len());
    for topic in request.topic_data {
        let name = topic.name.0.as_str().to_string();
        let meta = topic_to_produce_to(ctx, &name, acks, from_broker);
        // One look-up per topic; an empty registry answers without hashing the name.
        let inline = meta.as_ref().ok().and_then(|_| ctx.inline.get(&name));
        let mut partitions = Vec::with_capacity(topic.partition_data.len());
        for data in topic.partition_data {
            partitions.push(match &meta {
                Ok(meta) => {
                    produce_partition(
                        ctx,
                        meta,
                        inline.as_deref(),
                        data,
                        version,
                        acks_all_deadline,
                        transactional_id.as_deref(),
                    )
                    .await
                }
                Err(e) => partition_error(data.index, *e, None),
            });
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

/// The topic a produce may write to, auto-created when enabled; the error every partition
/// of it gets otherwise.
/// `from_broker`: the request is another broker's forwarded write
/// ([`crate::peer::is_broker_client`]), which may append to the connect runtime's topics
/// (Kafka likewise lets its `__admin_client` write internal topics).
fn topic_to_produce_to(
    ctx: &Context,
    name: &str,
    acks: i16,
    from_broker: bool,
) -> Result<TopicMeta, ResponseError> {
    if is_internal_topic(name) && !(from_broker && crate::connect::store::is_connect_topic(name)) {
        // Kafka: "Cannot append to internal topic" — only the coordinators write there.
        Err(ResponseError::InvalidTopicException)
    } else if (-1..=1).contains(&acks) {
        topics::get_or_auto_create(&ctx.topics, name, true).map_err(|e| e.error)
    } else {
        Err(ResponseError::InvalidRequiredAcks)
    }
}

/// One partition of a Produce: validate → inline transform (when deployed) → append →
/// respond.
async fn produce_partition(
    ctx: &Context,
    topic: &TopicMeta,
    inline: Option<&InlineSlot>,
    data: PartitionProduceData,
    version: i16,
    acks_all_deadline: Option<tokio::time::Instant>,
    transactional_id: Option<&str>,
) -> PartitionProduceResponse {
    let index = data.index;
    let valid = match validate(ctx, topic, data, version) {
        Ok(v) => v,
        Err(refused) => return refused,
    };
    if let Err(e) =
        verify_transaction(ctx, transactional_id, &topic.name, index, &valid, version).await
    {
        let message = match e {
            ResponseError::InvalidTxnState if version >= 12 => {
                "the partition cannot be added to the producer's transaction (KIP-890)"
            }
            ResponseError::InvalidTxnState => {
                "the partition is not in the producer's transaction (KIP-890)"
            }
            ResponseError::OutOfOrderSequenceNumber => {
                "a transaction's first batch on a partition starts at sequence 0 (KIP-890)"
            }
            ResponseError::InvalidProducerIdMapping => {
                "transactional records of more than one producer, or of one its coordinator does not know"
            }
            _ => "the producer's transaction coordinator refused the write (KIP-890)",
        };
        return partition_error(index, e, Some(message.into()));
    }
    if acks_all_deadline.is_some() {
        let (isr, min_isr) = (
            valid.partition.isr_len(),
            valid.partition.settings().min_insync_replicas,
        );
        if isr < min_isr {
            // Kafka's `Partition.appendRecordsToLeader`: nothing is written.
            return partition_error(
                index,
                ResponseError::NotEnoughReplicas,
                Some(format!(
                    "{isr} in-sync replicas, fewer than min.insync.replicas {min_isr}"
                )),
            );
        }
    }
    let target = inline::Target {
        topic: &topic.name,
        partition: index,
        compression: valid.compression,
        max_decompressed_bytes: valid.limits.max_decompressed_bytes,
        max_message_bytes: valid.max_message_bytes,
    };
    let applied = match inline {
        None => Applied {
            batches: valid.batches,
            dead_letters: Vec::new(),
        },
        Some(slot) => match transform_inline(slot, target, valid.batches, version).await {
            Ok(applied) => applied,
            Err(refused) => return refused,
        },
    };
    let appended = append(ctx, &valid.partition, inline, target, applied).await;
    if let (Ok(info), Some(deadline)) = (&appended, acks_all_deadline) {
        let left_ms = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .as_millis() as u64;
        let refused = valid
            .partition
            .wait_for_high_watermark(info.last_offset, left_ms)
            .await
            .refusal();
        if let Some((error, message)) = refused {
            return partition_error(index, error, Some(message.into()));
        }
    }
    respond(&topic.name, index, appended)
}

/// KIP-890: the first transactional batch of a producer (at its epoch) on a partition is
/// accepted only when the producer's coordinator says the partition is in its open
/// transaction (part 1, Produce v3–v11), or has added it there (part 2, Produce v12: the
/// producer sends no AddPartitionsToTxn) (`txn::TransactionCoordinator::verify_write`);
/// later batches of the same transaction (the partition's log has it open at that epoch)
/// need no question.
///
/// Errors: INVALID_REQUEST (42) for transactional batches without a transactional id (as
/// Kafka), INVALID_PRODUCER_ID_MAPPING (49) for transactional batches of more than one
/// producer (id and epoch) in one partition's records, OUT_OF_ORDER_SEQUENCE_NUMBER (45)
/// for a v12 batch that starts the producer's transaction here at a sequence other than
/// 0, those of `verify_write` (INVALID_TXN_STATE 48, INVALID_PRODUCER_EPOCH 47,
/// INVALID_PRODUCER_ID_MAPPING 49, CONCURRENT_TRANSACTIONS 51, NOT_ENOUGH_REPLICAS 19).
async fn verify_transaction(
    ctx: &Context,
    transactional_id: Option<&str>,
    topic: &str,
    index: i32,
    valid: &Validated,
    version: i16,
) -> Result<(), ResponseError> {
    let Some(first) = valid.batches.iter().find(|b| b.is_transactional()) else {
        return Ok(());
    };
    let one_producer = valid
        .batches
        .iter()
        .filter(|b| b.is_transactional())
        .all(|b| {
            (b.producer_id(), b.producer_epoch()) == (first.producer_id(), first.producer_epoch())
        });
    if !one_producer {
        // Only the first one's would be checked (Kafka's ReplicaManager: "Transactional
        // records contained more than one producer ID").
        return Err(ResponseError::InvalidProducerIdMapping);
    }
    if valid
        .partition
        .has_ongoing_txn_at(first.producer_id(), first.producer_epoch())
    {
        return Ok(());
    }
    let Some(id) = transactional_id else {
        return Err(ResponseError::InvalidRequest);
    };
    let add = version >= 12;
    if add
        && first.base_sequence() != 0
        && valid
            .partition
            .expects_first_sequence(first.producer_id(), first.producer_epoch())
    {
        // A transaction's first batch here (the epoch is the transaction's under
        // transaction version 2, and sequences restart with it) must be sequence 0: a
        // later one arriving first (the first was refused, say with
        // CONCURRENT_TRANSACTIONS, and is being retried) would be written out of order.
        return Err(ResponseError::OutOfOrderSequenceNumber);
    }
    ctx.txn
        .verify_write(
            id,
            (first.producer_id(), first.producer_epoch()),
            topic,
            index,
            add,
        )
        .await
}

/// A partition's batches that passed `validate`, and the settings the later steps use
/// (one copy for the whole request: a concurrent AlterConfigs applies from the next).
struct Validated {
    partition: Arc<Partition>,
    batches: Vec<ValidatedBatch>,
    /// `max.message.bytes`.
    max_message_bytes: usize,
    /// The limits the records were checked against.
    limits: RecordLimits,
    /// The topic's `compression.type` when it names a codec.
    compression: Option<Compression>,
}

/// Step 1: the partition is hosted, its records field splits into whole batches (magic
/// 2, length, CRC-32C) within `max.message.bytes`, of a codec `version` allows, and every
/// record of every batch is valid (as Kafka's LogValidator, see `records`).
///
/// Errors, as the partition's response: UNKNOWN_TOPIC_OR_PARTITION (3), INVALID_RECORD
/// (87; with KIP-467 record errors for keyless records on a compacted topic),
/// CORRUPT_MESSAGE (2), MESSAGE_TOO_LARGE (10), UNSUPPORTED_COMPRESSION_TYPE (76).
// The error is the partition's finished answer, built once per partition: boxing it
// would cost an allocation on the refusal path to save a copy.
#[allow(clippy::result_large_err)]
fn validate(
    ctx: &Context,
    topic: &TopicMeta,
    data: PartitionProduceData,
    version: i16,
) -> Result<Validated, PartitionProduceResponse> {
    let name = &topic.name;
    let index = data.index;
    let partition =
        super::leader_partition(ctx, name, index).map_err(|e| partition_error(index, e, None))?;
    let Some(records) = data.records.filter(|r| !r.is_empty()) else {
        return Err(partition_error(
            index,
            ResponseError::InvalidRecord,
            Some("produce request with no record batches".into()),
        ));
    };
    // debug, not warn: the client gets the error and its message; a client sending bad
    // batches in a loop must not fill the log (issue 15). Kafka's ReplicaManager does not
    // log these record errors either.
    let batches = split_batches(records).map_err(|e| {
        tracing::debug!(topic = %name, partition = index, error = %e, "refused produce batch");
        partition_error(index, batch_error_code(&e), Some(e.to_string()))
    })?;
    let settings = partition.settings();
    let max = settings.max_message_bytes;
    if let Some(big) = batches.iter().find(|b| b.len() > max) {
        let msg = format!(
            "record batch of {} bytes exceeds max.message.bytes {max}",
            big.len()
        );
        tracing::debug!(topic = %name, partition = index, "{msg}");
        return Err(partition_error(
            index,
            ResponseError::MessageTooLarge,
            Some(msg),
        ));
    }
    if version < 7 && batches.iter().any(|b| b.compression() == Compression::Zstd) {
        return Err(partition_error(
            index,
            ResponseError::UnsupportedCompressionType,
            Some("zstd needs Produce v7+".into()),
        ));
    }
    let limits = RecordLimits {
        require_keys: settings.require_keys,
        ..RecordLimits::for_max_message_bytes(max)
    };
    if let Some(e) = batches
        .iter()
        .find_map(|b| validate_records(b, limits).err())
    {
        tracing::debug!(topic = %name, partition = index, error = %e, "refused produce batch");
        let response = partition_error(index, e.kafka_error(), Some(e.to_string()));
        let named = e.record_indexes().iter().map(|&i| {
            (
                i,
                format!("{KEYLESS_RECORD} in topic partition {name}-{index}."),
            )
        });
        return Err(with_record_errors(response, version, named));
    }
    Ok(Validated {
        partition,
        batches,
        max_message_bytes: max,
        limits,
        compression: settings.compression,
    })
}

/// Step 2, when the topic has an inline transform: its records go through `slot` and each
/// batch is re-encoded at the same offsets before anything is appended
/// (`transform::apply`).
///
/// Errors, as the partition's response: INVALID_RECORD (87) when the transform fails
/// under `errors.tolerance=none` (with KIP-467 record errors when the plugin named the
/// record), MESSAGE_TOO_LARGE (10), CORRUPT_MESSAGE (2).
async fn transform_inline(
    slot: &InlineSlot,
    target: inline::Target<'_>,
    batches: Vec<ValidatedBatch>,
    version: i16,
) -> Result<Applied, PartitionProduceResponse> {
    inline::apply(slot, target, batches)
        .await
        .map_err(|refused| {
            let response = partition_error(
                target.partition,
                refused.error,
                Some(refused.message.clone()),
            );
            with_record_errors(response, version, refused.record_errors)
        })
}

/// Step 3: appends `applied`'s batches through the replica manager (which checks
/// producer sequences and detects retried duplicates), then writes the inline
/// transform's dead letters at the offsets their batches got. A duplicate wrote nothing,
/// and its dead letters were written the first time.
///
/// Errors: the log's ([`LogError`]); the dead-letter write logs its own.
async fn append(
    ctx: &Context,
    partition: &Partition,
    inline: Option<&InlineSlot>,
    target: inline::Target<'_>,
    applied: Applied,
) -> Result<AppendInfo, LogError> {
    let Applied {
        batches,
        dead_letters,
    } = applied;
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
    let info = ctx.replicas.append(partition, batches)?;
    ctx.metrics.produced(target.topic, appended);
    let dlq = !dead_letters.is_empty() && !info.duplicate;
    if let Some(slot) = inline.filter(|_| dlq) {
        let bases: Vec<i64> = spans
            .iter()
            .scan(info.base_offset, |next, span| {
                let base = *next;
                *next += span;
                Some(base)
            })
            .collect();
        inline::write_dead_letters(&ctx.ingest, slot, target, dead_letters, &bases).await;
    }
    Ok(info)
}

/// Step 4: the partition's answer: where the batch went, or the append's error
/// (OUT_OF_ORDER_SEQUENCE_NUMBER 45, INVALID_PRODUCER_EPOCH 47, KAFKA_STORAGE_ERROR 56,
/// see [`LogError::kafka_error`]).
fn respond(
    topic: &str,
    index: i32,
    appended: Result<AppendInfo, LogError>,
) -> PartitionProduceResponse {
    match appended {
        Ok(info) => PartitionProduceResponse::default()
            .with_index(index)
            .with_base_offset(info.base_offset)
            .with_log_append_time_ms(info.log_append_time_ms)
            .with_log_start_offset(info.log_start_offset),
        Err(e) => {
            let code = e.kafka_error();
            if code == ResponseError::KafkaStorageError {
                tracing::error!(topic, partition = index, error = %e, "append failed");
            } else {
                tracing::debug!(topic, partition = index, error = %e, "append refused");
            }
            partition_error(index, code, Some(e.to_string()))
        }
    }
}
