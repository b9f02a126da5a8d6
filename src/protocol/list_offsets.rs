//! ListOffsets (key 2), v1–v8. Protocol guide "ListOffsets"; KIP-79 (by timestamp),
//! KIP-734 (-3: max timestamp, v7+), KIP-405 (-4: earliest local, v8+, the log start here).
//!
//! `timestamp` -1 answers the high watermark (latest), -2 the log start offset (earliest),
//! -3 the offset and timestamp of the record with the largest timestamp, -4 the log start;
//! a timestamp ≥ 0 answers the first offset whose timestamp is at or after it, through the
//! time index, across segments; none → offset -1, timestamp -1. With `isolation_level` 1
//! (read_committed, v2+, KIP-98) latest is the last stable offset and -3 and timestamp
//! answers must lie below it, as Kafka's `fetchOffsetForTimestamp` bounds them.
//!
//! Errors returned per partition: UNKNOWN_TOPIC_OR_PARTITION (3), NOT_LEADER_OR_FOLLOWER
//! (6) when another broker leads the partition, KAFKA_STORAGE_ERROR (56),
//! INVALID_REQUEST (42) for other negative timestamps.

use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};
use kafka_protocol::ResponseError;

use crate::replica::FetchIsolation;

use super::Context;

/// Latest (-1).
pub(super) const LATEST_TIMESTAMP: i64 = -1;
/// Earliest (-2).
pub(super) const EARLIEST_TIMESTAMP: i64 = -2;
/// Max timestamp (-3, KIP-734).
pub(super) const MAX_TIMESTAMP: i64 = -3;
/// Earliest local (-4, KIP-405).
pub(super) const EARLIEST_LOCAL_TIMESTAMP: i64 = -4;

/// Handles a ListOffsets request.
pub(super) fn handle(
    ctx: &Context,
    request: ListOffsetsRequest,
    version: i16,
) -> ListOffsetsResponse {
    // isolation_level exists from v2; 1 is READ_COMMITTED.
    let isolation = if version >= 2 && request.isolation_level == 1 {
        FetchIsolation::ReadCommitted
    } else {
        FetchIsolation::HighWatermark
    };
    let topics = request
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.0.as_str().to_string();
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    let out = ListOffsetsPartitionResponse::default()
                        .with_partition_index(p.partition_index)
                        .with_timestamp(-1)
                        .with_offset(-1)
                        .with_leader_epoch(if version >= 4 { 0 } else { -1 });
                    let partition = match super::leader_partition(ctx, &name, p.partition_index) {
                        Ok(p) => p,
                        Err(e) => return out.with_error_code(e.code()),
                    };
                    let found = match p.timestamp {
                        LATEST_TIMESTAMP => {
                            let offsets = partition.offsets();
                            let latest = match isolation {
                                FetchIsolation::ReadCommitted => offsets.last_stable_offset,
                                _ => offsets.high_watermark,
                            };
                            Ok(Some((latest, -1)))
                        }
                        EARLIEST_TIMESTAMP | EARLIEST_LOCAL_TIMESTAMP => {
                            Ok(Some((partition.offsets().log_start_offset, -1)))
                        }
                        MAX_TIMESTAMP => partition.max_timestamp(isolation).map_err(|e| {
                            tracing::error!(topic = %name, partition = p.partition_index, error = %e, "max timestamp lookup failed");
                            e.kafka_error()
                        }),
                        ts if ts >= 0 => partition.offset_for_timestamp(ts, isolation).map_err(|e| {
                            tracing::error!(topic = %name, partition = p.partition_index, error = %e, "time index lookup failed");
                            e.kafka_error()
                        }),
                        _ => Err(ResponseError::InvalidRequest),
                    };
                    match found {
                        Ok(Some((offset, timestamp))) => out.with_offset(offset).with_timestamp(timestamp),
                        Ok(None) => out,
                        Err(e) => out.with_error_code(e.code()),
                    }
                })
                .collect();
            ListOffsetsTopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    ListOffsetsResponse::default().with_topics(topics)
}
