//! CreatePartitions (key 37), v0–v3. Protocol guide "CreatePartitions"; KIP-195.
//!
//! Grows a topic to `count` partitions (never shrinks) through
//! `cluster::Metadata::add_partitions`; the replica manager opens the new partition logs.
//!
//! Errors returned per topic: UNKNOWN_TOPIC_OR_PARTITION (3), INVALID_PARTITIONS (37),
//! INVALID_REPLICA_ASSIGNMENT (39), INVALID_REQUEST (42) for a topic named twice,
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
    assignments: usize,
    validate_only: bool,
) -> Result<(), TopicError> {
    ctx.metadata.validate_add_partitions(name, count)?;
    // Validated, so the topic exists and `count` is above its partition count.
    let current = ctx.metadata.topic(name).map_or(0, |t| t.partitions);
    if assignments != 0 && assignments as i32 != count - current {
        return Err(TopicError::new(
            ResponseError::InvalidReplicaAssignment,
            "The assignment must name each new partition once.",
        ));
    }
    if validate_only {
        return Ok(());
    }
    ctx.metadata.add_partitions(name, count).map(|_| ())
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
            let assignments = t.assignments.as_ref().map_or(0, Vec::len);
            let result = if !seen.insert(name.clone()) {
                Err(TopicError::new(
                    ResponseError::InvalidRequest,
                    "Duplicate topic in request.",
                ))
            } else {
                grow(ctx, &name, t.count, assignments, request.validate_only)
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
