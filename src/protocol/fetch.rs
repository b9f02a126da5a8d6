//! Fetch (key 1), v4–v16. Protocol guide "Fetch"; KIP-74 (response `max_bytes`, first batch
//! whole), KIP-227 (fetch sessions: never created, `session_id` 0 tells the client to send
//! full requests), KIP-516 (topic ids, v13+), KIP-392 (`preferred_read_replica` -1).
//!
//! Reads whole stored batches from each partition, up to `partition_max_bytes` per
//! partition and `max_bytes` per response; the first batch of the response is returned
//! whole even if larger, and never past the high watermark. If fewer than `min_bytes` are
//! ready, the request parks in the purgatory on the high watermarks of the partitions it
//! reads until one advances or `max_wait_ms` passes, then reads again. An empty partition gets a
//! zero-length record set, never null (older librdkafka fails on null).
//!
//! A fetch with a `replica_id` (v4–v14; `replica_state.replica_id` from v15) of 0 or more
//! is a follower's (Kafka's replica fetch, no other RPC): it reads up to the log end
//! offset, not the high watermark, records the follower's log end offset (which moves the
//! high watermark and may bring the follower back into the ISR,
//! `Partition::read_for_follower`) and parks on the log end offset instead.
//!
//! Errors returned per partition: OFFSET_OUT_OF_RANGE (1), UNKNOWN_TOPIC_OR_PARTITION (3),
//! NOT_LEADER_OR_FOLLOWER (6) when another broker leads the partition,
//! KAFKA_STORAGE_ERROR (56), FENCED_LEADER_EPOCH (74) / UNKNOWN_LEADER_EPOCH (75) when
//! `current_leader_epoch` (v9+) is older / newer than the partition's (KIP-320),
//! UNKNOWN_TOPIC_ID (100).

use bytes::Bytes;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::log::LogError;
use crate::purgatory::Wake;
use crate::replica::{FetchIsolation, ReplicaError};

use super::Context;

/// The longest `max_wait_ms` honoured (a limit on every wait).
const MAX_WAIT_MS_LIMIT: i32 = 5 * 60 * 1000;

fn partition_error(index: i32, error: ResponseError) -> PartitionData {
    PartitionData::default()
        .with_partition_index(index)
        .with_error_code(error.code())
        .with_high_watermark(-1)
        .with_last_stable_offset(-1)
        .with_log_start_offset(-1)
        .with_records(Some(Bytes::new()))
}

/// One pass over the requested partitions; returns the response and the bytes it holds.
/// Pushes onto `watches` the high watermark watch of every partition it read, taken
/// before the read, so the caller can park on exactly those partitions.
fn read_once(
    ctx: &Context,
    request: &FetchRequest,
    version: i16,
    watches: &mut Vec<watch::Receiver<i64>>,
) -> (Vec<FetchableTopicResponse>, usize) {
    let replica_id = replica_id(request, version);
    let now_ms = crate::replica::now_ms();
    // The request's max_bytes, capped by the broker's fetch.max.bytes (a request listing one
    // big partition many times must not make the broker build a response of any size).
    let mut remaining = (request.max_bytes.max(0) as usize).min(ctx.config.fetch_max_bytes);
    let mut total = 0usize;
    let mut topics = Vec::with_capacity(request.topics.len());
    for topic in &request.topics {
        let meta = if version >= 13 {
            ctx.metadata.topic_by_id(topic.topic_id)
        } else {
            ctx.metadata.topic(topic.topic.0.as_str())
        };
        let unknown = if version >= 13 {
            ResponseError::UnknownTopicId
        } else {
            ResponseError::UnknownTopicOrPartition
        };
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for p in &topic.partitions {
            let Some(meta) = &meta else {
                partitions.push(partition_error(p.partition, unknown));
                continue;
            };
            // Consumers and followers alike fetch from the leader.
            let partition = match super::leader_partition(ctx, &meta.name, p.partition) {
                Ok(partition) => partition,
                Err(e) => {
                    partitions.push(partition_error(p.partition, e));
                    continue;
                }
            };
            let current_leader_epoch = if version >= 9 {
                p.current_leader_epoch
            } else {
                -1
            };
            if let Err(e) = partition.check_leader_epoch(current_leader_epoch) {
                partitions.push(partition_error(p.partition, e.kafka_error()));
                continue;
            }
            watches.push(if replica_id >= 0 {
                partition.watch_log_end_offset()
            } else {
                partition.watch_high_watermark()
            });
            let limit = (p.partition_max_bytes.max(0) as usize).min(remaining);
            let first = total == 0;
            let read = if replica_id >= 0 {
                // A follower always records its fetch offset, even with no room for bytes.
                partition
                    .read_for_follower(
                        replica_id,
                        current_leader_epoch,
                        p.fetch_offset,
                        if limit == 0 && !first {
                            0
                        } else {
                            limit.max(1)
                        },
                        now_ms,
                    )
                    .map(Some)
            } else if limit == 0 && !first {
                Ok(None)
            } else {
                partition
                    .read(p.fetch_offset, limit.max(1), FetchIsolation::HighWatermark)
                    .map(Some)
                    .map_err(ReplicaError::from)
            };
            let offsets = match &read {
                Ok(Some(r)) => r.offsets,
                _ => partition.offsets(),
            };
            let data = PartitionData::default()
                .with_partition_index(p.partition)
                .with_high_watermark(offsets.high_watermark)
                .with_last_stable_offset(offsets.high_watermark)
                .with_log_start_offset(offsets.log_start_offset);
            match read {
                Ok(Some(r)) => {
                    let mut bytes = r.bytes;
                    // KIP-74: only the response's first batch may exceed the limits.
                    if !first && bytes.len() > limit {
                        bytes = Bytes::new();
                    }
                    total += bytes.len();
                    remaining = remaining.saturating_sub(bytes.len());
                    partitions.push(data.with_records(Some(bytes)));
                }
                Ok(None) => partitions.push(data.with_records(Some(Bytes::new()))),
                Err(ReplicaError::Log(LogError::OffsetOutOfRange { .. })) => partitions.push(
                    data.with_error_code(ResponseError::OffsetOutOfRange.code())
                        .with_records(Some(Bytes::new())),
                ),
                Err(e @ ReplicaError::Log(_)) => {
                    tracing::error!(topic = %meta.name, partition = p.partition, error = %e, "fetch read failed");
                    partitions.push(partition_error(p.partition, e.kafka_error()));
                }
                Err(e) => partitions.push(partition_error(p.partition, e.kafka_error())),
            }
        }
        let name = match (&meta, version >= 13) {
            (_, true) => TopicName::default(),
            (Some(m), false) => TopicName(StrBytes::from_string(m.name.clone())),
            (None, false) => topic.topic.clone(),
        };
        topics.push(
            FetchableTopicResponse::default()
                .with_topic(name)
                .with_topic_id(if version >= 13 {
                    topic.topic_id
                } else {
                    Default::default()
                })
                .with_partitions(partitions),
        );
    }
    (topics, total)
}

/// The fetching replica's broker id: 0 or more for a follower, -1 for a consumer
/// (`replica_id` until v14, `replica_state.replica_id` from v15, KIP-903).
fn replica_id(request: &FetchRequest, version: i16) -> i32 {
    if version >= 15 {
        request.replica_state.replica_id.0
    } else {
        request.replica_id.0
    }
}

fn has_error(topics: &[FetchableTopicResponse]) -> bool {
    topics
        .iter()
        .any(|t| t.partitions.iter().any(|p| p.error_code != 0))
}

/// Handles a Fetch request, long-polling per `max_wait_ms` / `min_bytes`.
pub(super) async fn handle(ctx: &Context, request: FetchRequest, version: i16) -> FetchResponse {
    let wait_ms = request.max_wait_ms.clamp(0, MAX_WAIT_MS_LIMIT) as u64;
    let deadline = Instant::now() + std::time::Duration::from_millis(wait_ms);
    let min_bytes = request.min_bytes.max(0) as usize;
    loop {
        let mut watches = Vec::new();
        let (topics, total) = read_once(ctx, &request, version, &mut watches);
        let now = Instant::now();
        if min_bytes == 0 || total >= min_bytes || now >= deadline || has_error(&topics) {
            return FetchResponse::default()
                .with_error_code(0)
                .with_session_id(0)
                .with_responses(topics);
        }
        let left_ms = (deadline - now).as_millis() as u64;
        if ctx
            .replicas
            .purgatory()
            .park(&mut watches, left_ms.max(1))
            .await
            == Wake::Deadline
            && Instant::now() < deadline
        {
            // The purgatory was full: answer now with what there is.
            return FetchResponse::default()
                .with_session_id(0)
                .with_responses(topics);
        }
    }
}

/// Counts the record bytes `response` returns per topic (`weir_bytes_out_total`). From v13
/// the response names topics by id only, so the name comes from the metadata (a topic
/// deleted meanwhile is not counted).
pub(super) fn count_bytes_out(ctx: &Context, response: &FetchResponse) {
    for topic in &response.responses {
        let bytes: usize = topic
            .partitions
            .iter()
            .map(|p| p.records.as_ref().map_or(0, |r| r.len()))
            .sum();
        if bytes == 0 {
            continue;
        }
        if !topic.topic.0.is_empty() {
            ctx.metrics.fetched(topic.topic.0.as_str(), bytes as u64);
        } else if let Some(meta) = ctx.metadata.topic_by_id(topic.topic_id) {
            ctx.metrics.fetched(&meta.name, bytes as u64);
        }
    }
}
