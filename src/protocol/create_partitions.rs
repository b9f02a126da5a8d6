//! CreatePartitions (key 37), v0–v3. Protocol guide "CreatePartitions"; KIP-195.
//!
//! Grows a topic to `count` partitions (never shrinks) through
//! `cluster::Metadata::add_partitions`: placed over the live brokers at the topic's
//! replication factor, or as `assignments` says; the replica manager opens the new
//! partition logs where hosted.
//!
//! Errors returned per topic: UNKNOWN_TOPIC_OR_PARTITION (3), INVALID_PARTITIONS (37),
//! INVALID_REPLICATION_FACTOR (38), INVALID_REPLICA_ASSIGNMENT (39), INVALID_REQUEST (42) for a topic named twice,
//! UNKNOWN_SERVER_ERROR (-1) when the metadata or logs cannot be written.

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::{CreatePartitionsRequest, CreatePartitionsResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::Context;
use crate::topics::TopicError;

fn grow(
    ctx: &Context,
    name: &str,
    count: i32,
    assignment: &[Vec<i32>],
    validate_only: bool,
) -> Result<(), TopicError> {
    if validate_only {
        return ctx
            .metadata
            .validate_add_partitions(name, count, assignment);
    }
    ctx.metadata
        .add_partitions(name, count, assignment)
        .map(|_| ())
}

/// Handles a CreatePartitions request.
pub(super) fn handle(
    ctx: &Context,
    request: CreatePartitionsRequest,
    _version: i16,
) -> CreatePartitionsResponse {
    let mut seen = std::collections::HashSet::new();
    let results = request
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.0.as_str().to_string();
            let assignment: Vec<Vec<i32>> = t
                .assignments
                .iter()
                .flatten()
                .map(|a| a.broker_ids.iter().map(|b| b.0).collect())
                .collect();
            let result = if !seen.insert(name.clone()) {
                Err(TopicError::new(
                    ResponseError::InvalidRequest,
                    "Duplicate topic in request.",
                ))
            } else {
                grow(ctx, &name, t.count, &assignment, request.validate_only)
            };
            let out = CreatePartitionsTopicResult::default().with_name(t.name);
            match result {
                Ok(()) => out,
                Err(e) => out
                    .with_error_code(e.error.code())
                    .with_error_message(Some(StrBytes::from_string(e.message))),
            }
        })
        .collect();
    CreatePartitionsResponse::default().with_results(results)
}
