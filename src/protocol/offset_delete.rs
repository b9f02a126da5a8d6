//! OffsetDelete (key 47), v0. Protocol guide "OffsetDelete"; KIP-496.
//!
//! Errors returned: GROUP_ID_NOT_FOUND (69), NON_EMPTY_GROUP (68) (a non-consumer group
//! with members), COORDINATOR_NOT_AVAILABLE (15) for the request; per partition
//! GROUP_SUBSCRIBED_TO_TOPIC (86) while a member subscribes to the topic,
//! UNKNOWN_TOPIC_OR_PARTITION (3) for a partition that does not exist. First:
//! NOT_COORDINATOR (16) on a broker that does not coordinate the group
//! (`find_coordinator.rs`), COORDINATOR_NOT_AVAILABLE (15) when its coordinator is fenced.

use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::{OffsetDeleteRequest, OffsetDeleteResponse};
use kafka_protocol::ResponseError;

use super::Context;

/// Handles an OffsetDelete request.
pub(super) fn handle(
    ctx: &Context,
    request: OffsetDeleteRequest,
    _version: i16,
) -> OffsetDeleteResponse {
    if let Err(e) = super::find_coordinator::check_coordinator(ctx, request.group_id.0.as_str()) {
        return OffsetDeleteResponse::default().with_error_code(e.code());
    }
    let exists = |t: &str, p: i32| {
        ctx.metadata
            .topic(t)
            .is_some_and(|m| (0..m.partitions).contains(&p))
    };
    let wanted: Vec<(String, i32)> = request
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (t.name.0.to_string(), p.partition_index))
        })
        .filter(|(t, p)| exists(t, *p))
        .collect();
    let results = match ctx
        .groups
        .delete_offsets(request.group_id.0.as_str(), &wanted)
    {
        Ok(r) => r,
        Err(e) => return OffsetDeleteResponse::default().with_error_code(e.code()),
    };
    let mut results = results.into_iter();
    let topics = request
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.0.to_string();
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let error = if exists(&name, p.partition_index) {
                        results.next().flatten()
                    } else {
                        Some(ResponseError::UnknownTopicOrPartition)
                    };
                    OffsetDeleteResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(error.map_or(0, |e| e.code()))
                })
                .collect();
            OffsetDeleteResponseTopic::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    OffsetDeleteResponse::default().with_topics(topics)
}
