//! Fetch (key 1), v4–v16. Protocol guide "Fetch"; KIP-74 (response `max_bytes`, first batch
//! whole), KIP-227 (fetch sessions: never created, `session_id` 0 tells the client to send
//! full requests), KIP-516 (topic ids, v13+), KIP-392 (`preferred_read_replica` -1).
//!
//! Reads whole stored batches from each partition, up to `partition_max_bytes` per
//! partition and `max_bytes` per response; the first batch of the response is returned
//! whole even if larger, and never past the high watermark.
//!
//! Transactions (KIP-98): with `isolation_level` 1 (read_committed) a consumer reads only
//! below the last stable offset and gets `aborted_transactions`: the (producer id, first
//! offset) of every aborted transaction overlapping the records returned, which the client
//! uses to drop their records (`Partition::read` with `FetchIsolation::ReadCommitted`).
//! Every response reports the real `last_stable_offset` (the high watermark when no
//! transaction is open). read_uncommitted (0) reads to the high watermark with an empty
//! `aborted_transactions`, as before. A parked read_committed fetch waits on the high
//! watermark like the others: the last stable offset only moves forward when the high
//! watermark does (a marker counts once replicated; see `replica.rs`).
//!
//! If fewer than `min_bytes` are
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
//! Reads from followers (KIP-392). A consumer's Fetch from v11 (which carries `rack_id`,
//! the client's `client.rack`) may be served by any replica this broker hosts, leader or
//! follower, as Kafka does: a follower reads up to its own high watermark (the leader's,
//! as its last fetch response gave it, capped at its log end offset), an offset between
//! that and its log end offset gets an empty record set, one past its log end offset
//! OFFSET_OUT_OF_RANGE (the client goes back to the leader); the same
//! `current_leader_epoch` checks as on the leader; records read so count in
//! `weir_follower_fetch_records_total`. With `replica.selector.class` set to the
//! rack-aware selector, a leader answering a consumer v11+ whose `rack_id` names another
//! rack than its own and an in-sync follower on an active broker in that rack holds the
//! fetch offset sets `preferred_read_replica` to that follower and returns no records for
//! the partition (the client moves to it; `replica::select_read_replica`), and answers at
//! once. Older versions and the leader selector keep consumers on the leader.
//!
//! Errors returned per partition: OFFSET_OUT_OF_RANGE (1), UNKNOWN_TOPIC_OR_PARTITION (3),
//! NOT_LEADER_OR_FOLLOWER (6) when another broker leads the partition (v4–v10) or this
//! broker hosts no replica of it (v11+),
//! KAFKA_STORAGE_ERROR (56), FENCED_LEADER_EPOCH (74) / UNKNOWN_LEADER_EPOCH (75) when
//! `current_leader_epoch` (v9+) is older / newer than the partition's (KIP-320),
//! UNKNOWN_TOPIC_ID (100).

use bytes::Bytes;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, ProducerId, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cluster::MetadataImage;
use crate::config::ReplicaSelector;
use crate::log::{stored_record_count, LogError};
use crate::purgatory::Wake;
use crate::replica::{
    select_read_replica, FetchIsolation, Partition, ReadReplicaCandidate, ReplicaError,
};

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
    // KIP-392: a consumer's Fetch v11+ may read a follower replica, and the leader may
    // send it to one in its rack.
    let from_any_replica = replica_id < 0 && version >= 11;
    let client_rack = request.rack_id.as_str();
    let select_by_rack = from_any_replica
        && ctx.config.replica_selector == ReplicaSelector::RackAware
        && !client_rack.is_empty();
    let mut image: Option<std::sync::Arc<MetadataImage>> = None;
    let now_ms = crate::replica::now_ms();
    // isolation_level (v4+): 1 is READ_COMMITTED.
    let isolation = if request.isolation_level == 1 {
        FetchIsolation::ReadCommitted
    } else {
        FetchIsolation::HighWatermark
    };
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
            // Followers fetch from the leader; consumers too before v11.
            let lookup = if from_any_replica {
                super::replica_partition(ctx, &meta.name, p.partition)
            } else {
                super::leader_partition(ctx, &meta.name, p.partition)
            };
            let partition = match lookup {
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
            let is_leader = partition.is_leader();
            if select_by_rack && is_leader {
                let image = image.get_or_insert_with(|| ctx.metadata.image());
                if let Some(preferred) =
                    preferred_read_replica(ctx, &partition, client_rack, p.fetch_offset, image)
                {
                    // Kafka's answer: no records, the offsets, the replica to go to.
                    let offsets = partition.offsets();
                    partitions.push(
                        PartitionData::default()
                            .with_partition_index(p.partition)
                            .with_high_watermark(offsets.high_watermark)
                            .with_last_stable_offset(offsets.last_stable_offset)
                            .with_log_start_offset(offsets.log_start_offset)
                            .with_preferred_read_replica(BrokerId(preferred))
                            .with_records(Some(Bytes::new())),
                    );
                    continue;
                }
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
                    .read(p.fetch_offset, limit.max(1), isolation)
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
                .with_last_stable_offset(offsets.last_stable_offset)
                .with_log_start_offset(offsets.log_start_offset);
            match read {
                Ok(Some(r)) => {
                    let mut bytes = r.bytes;
                    let mut aborted = r.aborted_transactions;
                    // KIP-74: only the response's first batch may exceed the limits.
                    if !first && bytes.len() > limit {
                        bytes = Bytes::new();
                        aborted = aborted.map(|_| Vec::new());
                    }
                    let data = match aborted {
                        Some(list) => data.with_aborted_transactions(Some(
                            list.iter()
                                .map(|t| {
                                    AbortedTransaction::default()
                                        .with_producer_id(ProducerId(t.producer_id))
                                        .with_first_offset(t.first_offset)
                                })
                                .collect(),
                        )),
                        None => data,
                    };
                    if replica_id < 0 && !is_leader {
                        ctx.metrics
                            .fetched_from_follower(&meta.name, stored_record_count(&bytes));
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

/// KIP-392 on the leader: the in-sync follower on an active broker in `client_rack` that
/// a consumer fetching `fetch_offset` should read from instead
/// ([`select_read_replica`]), or `None` to serve it here.
fn preferred_read_replica(
    ctx: &Context,
    partition: &Partition,
    client_rack: &str,
    fetch_offset: i64,
    image: &MetadataImage,
) -> Option<i32> {
    let candidates: Vec<(ReadReplicaCandidate, Option<&str>)> = partition
        .in_sync_followers()
        .into_iter()
        .filter_map(|c| {
            let broker = image.broker(c.broker_id).filter(|b| b.is_active())?;
            Some((c, broker.rack.as_deref()))
        })
        .collect();
    select_read_replica(
        client_rack,
        ctx.config.rack.as_deref(),
        fetch_offset,
        &candidates,
    )
}

/// Whether a partition of the response sends the consumer to another replica (KIP-392):
/// answered at once, as Kafka does.
fn has_preferred_replica(topics: &[FetchableTopicResponse]) -> bool {
    topics
        .iter()
        .any(|t| t.partitions.iter().any(|p| p.preferred_read_replica.0 >= 0))
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
        if min_bytes == 0
            || total >= min_bytes
            || now >= deadline
            || has_error(&topics)
            || has_preferred_replica(&topics)
        {
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
