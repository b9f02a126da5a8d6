//! CreatePartitions (key 37), v0–v3. Protocol guide "CreatePartitions"; KIP-195.
//!
//! Grows a topic to `count` partitions (never shrinks), creating the new partition logs.
//!
//! Errors returned per topic: UNKNOWN_TOPIC_OR_PARTITION (3), INVALID_PARTITIONS (37),
//! INVALID_REPLICA_ASSIGNMENT (39), INVALID_REQUEST (42) for a topic named twice,
//! UNKNOWN_SERVER_ERROR (-1) when the metadata or logs cannot be written.

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::{CreatePartitionsRequest, CreatePartitionsResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::Context;
use crate::topics::{TopicError, MAX_PARTITIONS_PER_TOPIC};

fn grow(
    ctx: &Context,
    name: &str,
    count: i32,
    assignments: usize,
    validate_only: bool,
) -> Result<(), TopicError> {
    let Some(meta) = ctx.metadata.topic(name) else {
        return Err(TopicError::new(
            ResponseError::UnknownTopicOrPartition,
            format!("The topic '{name}' does not exist."),
        ));
    };
    if count <= meta.partitions {
        let msg = if count == meta.partitions {
            format!("Topic already has {count} partitions.")
        } else {
            format!(
                "Topic currently has {} partitions, which is higher than the requested {count}.",
                meta.partitions
            )
        };
        return Err(TopicError::new(ResponseError::InvalidPartitions, msg));
    }
    if count > MAX_PARTITIONS_PER_TOPIC {
        return Err(TopicError::new(
            ResponseError::InvalidPartitions,
            format!("At most {MAX_PARTITIONS_PER_TOPIC} partitions per topic."),
        ));
    }
    if assignments != 0 && assignments as i32 != count - meta.partitions {
        return Err(TopicError::new(
            ResponseError::InvalidReplicaAssignment,
            "The assignment must name each new partition once.",
        ));
    }
    if validate_only {
        return Ok(());
    }
    let from = meta.partitions;
    let updated = match ctx.metadata.set_partitions(name, count) {
        Ok(Some(m)) => m,
        Ok(None) => {
            return Err(TopicError::new(
                ResponseError::UnknownTopicOrPartition,
                "The topic was deleted meanwhile.",
            ))
        }
        Err(e) => {
            return Err(TopicError::new(
                ResponseError::UnknownServerError,
                e.to_string(),
            ))
        }
    };
    ctx.replicas
        .open_partitions(&updated, from)
        .map_err(|e| TopicError::new(ResponseError::UnknownServerError, e.to_string()))?;
    tracing::info!(topic = name, from, to = count, "added partitions");
    Ok(())
}

/// Handles a CreatePartitions request.
pub fn handle(
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
