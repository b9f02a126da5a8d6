//! DeleteRecords (key 21), v0–v2 (v2 flexible). Protocol guide "DeleteRecords"; KIP-107;
//! `kafka-delete-records.sh`. Kafka's `ReplicaManager.deleteRecords` →
//! `Partition.deleteRecordsOnLeader`.
//!
//! Per partition, on its leader: the log start offset moves up to `offset` (-1: the high
//! watermark), segments wholly below it are deleted, and the answer's `low_watermark` is
//! the log start offset after the call (an offset below it changes nothing and answers
//! the current start). The new start is durable before the answer
//! (`log-start-offset-checkpoint`). Followers move theirs from their next Fetch
//! response; unlike Kafka the answer does not wait for them (no DeleteRecords purgatory),
//! so `low_watermark` is the leader's, and `timeout_ms` is not used.
//!
//! Errors returned per partition: OFFSET_OUT_OF_RANGE (1) for an offset above the high
//! watermark or negative other than -1; NOT_LEADER_OR_FOLLOWER (6) when another broker
//! leads the partition; UNKNOWN_TOPIC_OR_PARTITION (3); KAFKA_STORAGE_ERROR (56) when the
//! checkpoint or a segment delete fails. `low_watermark` is -1 with an error.

use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};

use super::Context;

/// Handles a DeleteRecords request.
pub(super) fn handle(
    ctx: &Context,
    request: DeleteRecordsRequest,
    _version: i16,
) -> DeleteRecordsResponse {
    let topics = request
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.0.as_str().to_string();
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    let out = DeleteRecordsPartitionResult::default()
                        .with_partition_index(p.partition_index)
                        .with_low_watermark(-1);
                    let partition = match super::leader_partition(ctx, &name, p.partition_index)
                    {
                        Ok(partition) => partition,
                        Err(e) => return out.with_error_code(e.code()),
                    };
                    match partition.delete_records_on_leader(p.offset) {
                        Ok(low_watermark) => out.with_low_watermark(low_watermark),
                        Err(e) => {
                            tracing::info!(topic = %name, partition = p.partition_index, offset = p.offset, error = %e, "DeleteRecords refused");
                            out.with_error_code(e.kafka_error().code())
                        }
                    }
                })
                .collect();
            DeleteRecordsTopicResult::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    DeleteRecordsResponse::default().with_topics(topics)
}
