//! Inline transforms on the produce path: the records of a produced batch go through the
//! topic's inline transform and the batch is re-encoded (`log::rewrite`) before it is
//! appended, so only transformed records reach the disk.
//!
//! Owns: decoding a partition's validated batches, calling the slot's transform once per
//! batch (`BatchContext { topic, partition, base_offset: -1 }`: offsets are assigned at
//! append), checking that the output is 1:1 or a filter (inline has nowhere to put a
//! second record at the same offset, nor a record for another topic), isolating failing
//! records under `errors.tolerance=all`, the re-encoding with the producer's codec (or the
//! topic's `compression.type` when it names one), the dead-letter records and the slot's
//! counters. Never does: append (the caller does, so sequence checks and duplicate
//! detection stay the log's), or deploy anything.
//!
//! Offsets and sequence numbers: each output record keeps the offset delta of its input
//! record and the batch keeps lastOffsetDelta, producer id/epoch and baseSequence, so the
//! batch occupies the offsets the client's batch would have; dropped records are gaps
//! (ARCHITECTURE.md, "Decisions").
//!
//! Failures (a plugin error, trap, timeout, memory limit, bad output, a fan-out or a route):
//! - `errors.tolerance=none`: the partition's produce fails with INVALID_RECORD (87) and
//!   the message; KIP-467 record errors name the record when one is known; nothing of the
//!   partition is appended.
//! - `errors.tolerance=all`: the failing records are dropped from the batch (gaps) and
//!   written to the dead-letter topic once the batch is appended. A plugin error naming a
//!   record marks that record and the rest of the batch is run again (up to
//!   [`MAX_NAMED_RETRIES`] times); a trap, memory limit or bad output is isolated by
//!   running the records one by one; a timeout fails the whole batch (running each record
//!   against a deadline of its own could hold the produce for the batch size × the
//!   deadline).

use std::collections::BTreeMap;
use std::time::Instant;

use kafka_protocol::ResponseError;

use super::inline::InlineSlot;
use super::Tolerance;
use crate::dead_letter::{self, plugin_error_kind};
use crate::ingest::Ingest;
use crate::log::rewrite::{decode_records, BatchBuilder};
use crate::log::{Compression, ValidatedBatch};
use crate::plugin::{BatchContext, OutputBatch, PluginError, Record, Transform};

/// Named plugin errors handled by re-running the rest of the batch; past this many in one
/// batch the remaining records are run one by one.
pub const MAX_NAMED_RETRIES: usize = 8;

/// What the produce path knows about the partition being written.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// Input topic.
    pub topic: &'a str,
    /// Partition index.
    pub partition: i32,
    /// The topic's `compression.type` when it names a codec; `None` keeps the producer's.
    pub compression: Option<Compression>,
    /// Cap on one batch's decompressed records (bytes), as record validation uses.
    pub max_decompressed_bytes: usize,
    /// `max.message.bytes`: a re-encoded batch above it is refused (MESSAGE_TOO_LARGE).
    pub max_message_bytes: usize,
}

/// Why a partition's produce is refused: the Kafka error, the message, and (KIP-467)
/// the records of the batch the error names, with a message each.
#[derive(Debug, Clone)]
pub struct Refused {
    /// INVALID_RECORD (87) for transform failures, MESSAGE_TOO_LARGE (10) for a re-encoded
    /// batch over `max.message.bytes`, CORRUPT_MESSAGE (2) for records that do not decode.
    pub error: ResponseError,
    /// For the response's error message and the log.
    pub message: String,
    /// (index of the record in its batch, message); empty when none is named.
    pub record_errors: Vec<(i32, String)>,
}

/// A record dropped under `errors.tolerance=all`, waiting for its batch's offset.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// Index of its batch among the partition's batches.
    pub batch: usize,
    /// Its offset delta in that batch.
    pub offset_delta: i32,
    /// The record as the producer sent it.
    pub record: Record,
    /// Kind of failure (a plugin error kind, `Route` or `FanOut`; the DLQ's
    /// `__connect.errors.exception.class.name`).
    pub kind: &'static str,
    /// Why it failed.
    pub message: String,
}

/// The transformed batches of one partition and the records for the dead-letter topic.
#[derive(Debug)]
pub struct Applied {
    /// Re-encoded batches, in order, ready for `ReplicaManager::append`.
    pub batches: Vec<ValidatedBatch>,
    /// Failing records (tolerance `all`), to write with [`write_dead_letters`] once the
    /// batches are appended.
    pub dead_letters: Vec<DeadLetter>,
}

/// Runs `batches` through `slot`'s transform and re-encodes them (see the module docs).
///
/// Errors: [`Refused`]: INVALID_RECORD (87) when the transform fails under
/// `errors.tolerance=none`; MESSAGE_TOO_LARGE (10) when a re-encoded batch exceeds
/// `max.message.bytes`; CORRUPT_MESSAGE (2) when records do not decode.
pub async fn apply(
    slot: &InlineSlot,
    target: Target<'_>,
    batches: Vec<ValidatedBatch>,
) -> Result<Applied, Refused> {
    let context = BatchContext {
        topic: target.topic.to_string(),
        partition: target.partition,
        base_offset: -1,
    };
    let mut out = Applied {
        batches: Vec::with_capacity(batches.len()),
        dead_letters: Vec::new(),
    };
    let mut transform = slot.transform.lock().await;
    for (batch_index, batch) in batches.into_iter().enumerate() {
        let decoded =
            decode_records(&batch, target.max_decompressed_bytes).map_err(|e| Refused {
                // Validation decoded these records with the same cap: not expected.
                error: ResponseError::CorruptMessage,
                message: format!("inline transform {}: {e}", slot.name),
                record_errors: Vec::new(),
            })?;
        let records: Vec<Record> = decoded.iter().cloned().map(Record::from).collect();
        let started = Instant::now();
        let outcome = run(&mut transform, &context, &records, slot.tolerance).await;
        let busy_ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let (kept, failed) = match outcome {
            Ok(r) => r,
            Err(refused) => {
                let failed = if refused.record_errors.is_empty() {
                    records.len() as u64
                } else {
                    refused.record_errors.len() as u64
                };
                slot.stats.record_call(records.len() as u64, 0, busy_ns);
                slot.stats
                    .errors
                    .fetch_add(failed, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(
                    transform = %slot.name, topic = target.topic, partition = target.partition,
                    "inline transform failed; produce refused: {}", refused.message
                );
                return Err(refused);
            }
        };
        let codec = target.compression.unwrap_or(batch.compression());
        let mut builder = BatchBuilder::new(&batch, codec);
        let mut records_out = 0u64;
        for (input, outputs) in &kept {
            let Some(source) = decoded.get(*input) else {
                continue;
            };
            for r in outputs.records() {
                builder
                    .push(
                        source.offset_delta,
                        r.timestamp_ms,
                        r.key,
                        r.value,
                        r.headers().map(|(k, v)| (k.as_bytes(), v)),
                    )
                    .map_err(|e| refused_invalid(slot, format!("{e}"), None))?;
                records_out += 1;
            }
        }
        slot.stats
            .record_call(records.len() as u64, records_out, busy_ns);
        if !failed.is_empty() {
            slot.stats
                .errors
                .fetch_add(failed.len() as u64, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(
                transform = %slot.name, topic = target.topic, partition = target.partition,
                records = failed.len(),
                "inline transform failed on records; dropped from the batch{}",
                if slot.dlq_topic.is_some() { " and sent to the dead-letter topic" } else { "" }
            );
        }
        for Failure {
            input,
            kind,
            message,
        } in failed
        {
            if let (Some(source), Some(record)) = (decoded.get(input), records.get(input)) {
                out.dead_letters.push(DeadLetter {
                    batch: batch_index,
                    offset_delta: source.offset_delta,
                    record: record.clone(),
                    kind,
                    message,
                });
            }
        }
        let rewritten = builder.finish().map_err(|e| Refused {
            error: ResponseError::CorruptMessage,
            message: format!(
                "inline transform {}: cannot re-encode the batch: {e}",
                slot.name
            ),
            record_errors: Vec::new(),
        })?;
        if rewritten.len() > target.max_message_bytes {
            return Err(Refused {
                error: ResponseError::MessageTooLarge,
                message: format!(
                    "inline transform {}: the transformed batch of {} bytes exceeds \
                     max.message.bytes {}",
                    slot.name,
                    rewritten.len(),
                    target.max_message_bytes
                ),
                record_errors: Vec::new(),
            });
        }
        out.batches.push(rewritten);
    }
    Ok(out)
}

/// The output records kept for each input index (input index → the call's output and
/// where in it), and the failing inputs.
type Outcome = (Vec<(usize, Outputs)>, Vec<Failure>);

/// A failing input record: its index in the batch, the kind of failure and why.
#[derive(Debug)]
struct Failure {
    input: usize,
    kind: &'static str,
    message: String,
}

impl Failure {
    fn plugin(input: usize, e: &PluginError) -> Failure {
        Failure {
            input,
            kind: plugin_error_kind(e),
            message: e.to_string(),
        }
    }
}

/// The output record of one input record (inline transforms are 1:1 or filter, so at most
/// one): the batch of the call that produced it and its position there.
#[derive(Debug, Clone)]
struct Outputs {
    batch: std::sync::Arc<OutputBatch>,
    /// Position of the output record in `batch` (found once, in [`check_output`]: looking
    /// it up per input by scanning the batch was quadratic in the batch size).
    position: usize,
}

impl Outputs {
    fn records(&self) -> impl Iterator<Item = crate::plugin::OutputRecord<'_>> {
        self.batch.get(self.position).into_iter()
    }
}

/// One transform call over `records` (`indexes` maps the call's input positions to the
/// batch's). Per input: its outputs, or why it failed (a fan-out or a route).
fn check_output(
    context: &BatchContext,
    output: OutputBatch,
    indexes: &[usize],
    kept: &mut Vec<(usize, Outputs)>,
    failed: &mut Vec<Failure>,
) {
    let output = std::sync::Arc::new(output);
    // Input index → (output count, a route's message, position of its first output).
    let mut per_input: BTreeMap<u32, (usize, Option<String>, usize)> = BTreeMap::new();
    for (position, r) in output.iter().enumerate() {
        let entry = per_input
            .entry(r.input_index)
            .or_insert((0, None, position));
        entry.0 += 1;
        if let Some(t) = r.topic.filter(|t| *t != context.topic) {
            entry.1.get_or_insert_with(|| {
                format!(
                    "routed to topic {t}: inline transforms are 1:1 or filter \
                     (deploy it in async mode to route)"
                )
            });
        }
    }
    for (call_index, (count, routed, position)) in per_input {
        let Some(&input) = indexes.get(call_index as usize) else {
            continue;
        };
        if let Some(message) = routed {
            failed.push(Failure {
                input,
                kind: "Route",
                message,
            });
        } else if count > 1 {
            failed.push(Failure {
                input,
                kind: "FanOut",
                message: format!(
                    "{count} output records for one input: inline transforms are 1:1 or \
                     filter (deploy it in async mode to fan out)"
                ),
            });
        } else {
            kept.push((
                input,
                Outputs {
                    batch: output.clone(),
                    position,
                },
            ));
        }
    }
}

/// Calls the transform on `records`, isolating failures under tolerance `all`. Returns
/// the kept outputs (in input order) and the failing inputs (in input order).
async fn run(
    transform: &mut Transform,
    context: &BatchContext,
    records: &[Record],
    tolerance: Tolerance,
) -> Result<Outcome, Refused> {
    let mut kept = Vec::new();
    let mut failed = Vec::new();
    let all: Vec<usize> = (0..records.len()).collect();
    let first = transform.apply(context, records).await;
    let error = match first {
        Ok(output) => {
            check_output(context, output, &all, &mut kept, &mut failed);
            if tolerance == Tolerance::None && !failed.is_empty() {
                return Err(refused_records(transform.name(), &failed));
            }
            return Ok((kept, failed));
        }
        Err(e) => e,
    };
    if tolerance == Tolerance::None {
        let named = match &error {
            PluginError::Failed {
                record_index: Some(i),
                ..
            } => Some(*i as i32),
            _ => None,
        };
        return Err(Refused {
            error: ResponseError::InvalidRecord,
            message: format!("inline transform: {error}"),
            record_errors: named
                .map(|i| vec![(i, error.to_string())])
                .unwrap_or_default(),
        });
    }
    // Tolerance `all`: find the failing records.
    let mut remaining = all;
    let mut error = error;
    let mut named_retries = 0;
    loop {
        match error {
            PluginError::Failed {
                record_index: Some(i),
                ..
            } if named_retries < MAX_NAMED_RETRIES && (i as usize) < remaining.len() => {
                named_retries += 1;
                let input = remaining.remove(i as usize);
                failed.push(Failure::plugin(input, &error));
                if remaining.is_empty() {
                    break;
                }
                let subset: Vec<Record> = remaining.iter().map(|&i| records[i].clone()).collect();
                match transform.apply(context, &subset).await {
                    Ok(output) => {
                        check_output(context, output, &remaining, &mut kept, &mut failed);
                        break;
                    }
                    Err(e) => error = e,
                }
            }
            PluginError::Timeout { .. } => {
                failed.extend(remaining.iter().map(|&i| Failure::plugin(i, &error)));
                break;
            }
            _ => {
                // One by one: a trap fails its call only (the instance is replaced).
                for &input in &remaining {
                    let one = std::slice::from_ref(&records[input]);
                    match transform.apply(context, one).await {
                        Ok(output) => {
                            check_output(context, output, &[input], &mut kept, &mut failed)
                        }
                        Err(e) => failed.push(Failure::plugin(input, &e)),
                    }
                }
                break;
            }
        }
    }
    kept.sort_by_key(|(i, _)| *i);
    failed.sort_by_key(|f| f.input);
    Ok((kept, failed))
}

fn refused_records(plugin: &str, failed: &[Failure]) -> Refused {
    let first = failed
        .first()
        .map(|f| f.message.as_str())
        .unwrap_or_default();
    Refused {
        error: ResponseError::InvalidRecord,
        message: format!("inline transform (plugin {plugin}): {first}"),
        record_errors: failed
            .iter()
            .map(|f| {
                (
                    i32::try_from(f.input).unwrap_or(i32::MAX),
                    f.message.clone(),
                )
            })
            .collect(),
    }
}

fn refused_invalid(slot: &InlineSlot, message: String, index: Option<i32>) -> Refused {
    Refused {
        error: ResponseError::InvalidRecord,
        message: format!("inline transform {}: {message}", slot.name),
        record_errors: index.map(|i| vec![(i, message)]).unwrap_or_default(),
    }
}

/// Writes `dead_letters` (from [`apply`]) to the slot's dead-letter topic, once their
/// batches are appended: `batch_base_offsets[i]` is the base offset batch `i` got. Each
/// keeps its key, value, timestamp and headers and gains the headers of
/// `crate::dead_letter` (stage `TRANSFORMATION`, the offset it would have had). Nothing
/// is written when the slot has no dead-letter topic (the records were counted in
/// `stats.errors`).
///
/// Errors are logged, not returned: the produce has succeeded by then.
pub async fn write_dead_letters(
    ingest: &Ingest,
    slot: &InlineSlot,
    target: Target<'_>,
    dead_letters: Vec<DeadLetter>,
    batch_base_offsets: &[i64],
) {
    let Some(dlq) = slot.dlq_topic.as_deref() else {
        return;
    };
    if dead_letters.is_empty() {
        return;
    }
    let plugin = slot.transform.lock().await.name().to_string();
    let letters: Vec<dead_letter::DeadLetter> = dead_letters
        .into_iter()
        .map(|d| dead_letter::DeadLetter {
            offset: batch_base_offsets
                .get(d.batch)
                .map(|base| base + i64::from(d.offset_delta))
                .unwrap_or(-1),
            record: d.record,
            topic: target.topic.to_string(),
            partition: target.partition,
            stage: dead_letter::Stage::Transformation,
            class_name: plugin.clone(),
            kind: d.kind,
            message: d.message,
        })
        .collect();
    let n = letters.len();
    let owner = dead_letter::Owner::Transform {
        name: &slot.name,
        version: &slot.version,
    };
    if let Err(e) = dead_letter::write(ingest, dlq, owner, letters).await {
        tracing::error!(
            transform = %slot.name, topic = target.topic, partition = target.partition,
            dead_letter_topic = dlq, records = n,
            "cannot write failing records to the dead-letter topic (they are dropped): {e}"
        );
    }
}
