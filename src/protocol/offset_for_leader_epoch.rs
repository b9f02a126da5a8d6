//! OffsetForLeaderEpoch (key 23), v2–v4 (Kafka 4.0 removed v0–v1, KIP-896). Protocol
//! guide "OffsetForLeaderEpoch"; KIP-101 (followers truncate by leader epoch, not by high
//! watermark), KIP-279 (the answer names
//! the largest epoch at or below the one asked, with its end offset), KIP-320
//! (consumers validate their position after a leader change; `current_leader_epoch`,
//! v2+).
//!
//! Per partition: the leader answers, from its leader-epoch cache
//! (`leader-epoch-checkpoint`), the largest epoch at or below `leader_epoch` and the
//! offset where it ends (the start of the next epoch, or the log end offset for the
//! current one); -1/-1 when the log knows no such epoch (UNDEFINED, as Kafka).
//!
//! Errors returned per partition: UNKNOWN_TOPIC_OR_PARTITION (3), NOT_LEADER_OR_FOLLOWER
//! (6) when another broker leads the partition, FENCED_LEADER_EPOCH (74) /
//! UNKNOWN_LEADER_EPOCH (75) when `current_leader_epoch` is older / newer than the
//! partition's.

use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::{OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse};

use super::Context;

fn partition_error(partition: i32, error: kafka_protocol::ResponseError) -> EpochEndOffset {
    EpochEndOffset::default()
        .with_partition(partition)
        .with_error_code(error.code())
        .with_leader_epoch(-1)
        .with_end_offset(-1)
}

/// Handles an OffsetForLeaderEpoch request (from a follower, `replica_id` ≥ 0 from v3, or
/// a consumer).
pub(super) fn handle(
    ctx: &Context,
    request: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let topics = request
        .topics
        .into_iter()
        .map(|t| {
            let name = t.topic.0.as_str().to_string();
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    let partition = match super::leader_partition(ctx, &name, p.partition) {
                        Ok(partition) => partition,
                        Err(e) => return partition_error(p.partition, e),
                    };
                    if let Err(e) = partition.check_leader_epoch(p.current_leader_epoch) {
                        return partition_error(p.partition, e.kafka_error());
                    }
                    let end = partition.end_offset_for_epoch(p.leader_epoch);
                    EpochEndOffset::default()
                        .with_partition(p.partition)
                        .with_leader_epoch(end.leader_epoch)
                        .with_end_offset(end.end_offset)
                })
                .collect();
            OffsetForLeaderTopicResult::default()
                .with_topic(t.topic)
                .with_partitions(partitions)
        })
        .collect();
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}
