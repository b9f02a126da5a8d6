//! DescribeProducers (key 61), v0 (flexible). Protocol guide "DescribeProducers";
//! KIP-664 (`kafka-transactions.sh describe-producers`).
//!
//! Per requested partition, on its leader: the producers its log knows (idempotent and
//! transactional, from the producer state the log keeps, `Partition::producer_summaries`),
//! each with its epoch, the last sequence and timestamp of its last batch (-1 when none is
//! kept, e.g. a producer only a marker named), the coordinator epoch of its last marker
//! (-1: none) and the first offset of its ongoing transaction (-1: none).
//!
//! Errors returned per partition: UNKNOWN_TOPIC_OR_PARTITION (3); NOT_LEADER_OR_FOLLOWER
//! (6) when another broker leads the partition.

use kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse,
};
use kafka_protocol::messages::{DescribeProducersRequest, DescribeProducersResponse, ProducerId};

use super::Context;

/// Handles a DescribeProducers request.
pub(super) fn handle(
    ctx: &Context,
    request: DescribeProducersRequest,
    _version: i16,
) -> DescribeProducersResponse {
    let topics = request
        .topics
        .into_iter()
        .map(|topic| {
            let name = topic.name.0.as_str().to_string();
            let partitions = topic
                .partition_indexes
                .iter()
                .map(|&index| {
                    let out = PartitionResponse::default()
                        .with_partition_index(index)
                        .with_error_message(None);
                    match super::leader_partition(ctx, &name, index) {
                        Err(e) => out.with_error_code(e.code()),
                        Ok(partition) => out.with_active_producers(
                            partition
                                .producer_summaries()
                                .into_iter()
                                .map(|p| {
                                    ProducerState::default()
                                        .with_producer_id(ProducerId(p.producer_id))
                                        .with_producer_epoch(i32::from(p.producer_epoch))
                                        .with_last_sequence(p.last_sequence)
                                        .with_last_timestamp(p.last_timestamp_ms)
                                        .with_coordinator_epoch(p.coordinator_epoch)
                                        .with_current_txn_start_offset(p.current_txn_start_offset)
                                })
                                .collect(),
                        ),
                    }
                })
                .collect();
            TopicResponse::default()
                .with_name(topic.name)
                .with_partitions(partitions)
        })
        .collect();
    DescribeProducersResponse::default().with_topics(topics)
}
