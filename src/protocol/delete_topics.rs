//! DeleteTopics (key 20), v1–v6. Protocol guide "DeleteTopics"; KIP-516 (by topic id, v6).
//!
//! Removes the topic from the metadata (`cluster::Metadata::delete_topic`); the replica
//! manager closes its partitions and deletes their directories.
//!
//! Errors returned per topic: UNKNOWN_TOPIC_OR_PARTITION (3), TOPIC_DELETION_DISABLED (73)
//! when `delete.topic.enable=false`, UNKNOWN_TOPIC_ID (100), INVALID_TOPIC_EXCEPTION (17) for internal topics, UNKNOWN_SERVER_ERROR (-1) when
//! the files cannot be removed.

use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{DeleteTopicsRequest, DeleteTopicsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use uuid::Uuid;

use super::Context;
use crate::cluster::is_internal_topic;

fn delete_one(ctx: &Context, name: Option<String>, id: Uuid) -> DeletableTopicResult {
    let meta = match &name {
        Some(n) => ctx.metadata.topic(n),
        None => ctx.metadata.topic_by_id(id),
    };
    let out = DeletableTopicResult::default()
        .with_name(name.clone().map(|n| TopicName(StrBytes::from_string(n))))
        .with_topic_id(id);
    let Some(meta) = meta else {
        let e = if name.is_some() {
            ResponseError::UnknownTopicOrPartition
        } else {
            ResponseError::UnknownTopicId
        };
        return out.with_error_code(e.code());
    };
    let out = out
        .with_name(Some(TopicName(StrBytes::from_string(meta.name.clone()))))
        .with_topic_id(meta.id);
    if is_internal_topic(&meta.name) {
        // The group coordinator holds it open; deleting it would lose every commit.
        return out
            .with_error_code(ResponseError::InvalidTopicException.code())
            .with_error_message(Some(StrBytes::from_string(format!(
                "Cannot delete internal topic {}",
                meta.name
            ))));
    }
    if !ctx.config.delete_topic_enable {
        return out.with_error_code(ResponseError::TopicDeletionDisabled.code());
    }
    let result = ctx.metadata.delete_topic(meta.id);
    if ctx.metadata.image().topic_by_id(meta.id).is_none() {
        // Gone from the metadata (even when its directories could not all be removed):
        // its committed offsets go too.
        ctx.groups.on_topic_deleted(&meta.name);
    }
    match result {
        Ok(_) => out,
        Err(e) => {
            tracing::error!(topic = %meta.name, error = %e, "delete topic failed");
            let code = match e.error {
                // Deleted meanwhile by another request, asked for by name.
                ResponseError::UnknownTopicId if name.is_some() => {
                    ResponseError::UnknownTopicOrPartition
                }
                other => other,
            };
            out.with_error_code(code.code())
                .with_error_message(Some(StrBytes::from_string(e.message)))
        }
    }
}

/// Handles a DeleteTopics request.
pub(super) fn handle(
    ctx: &Context,
    request: DeleteTopicsRequest,
    version: i16,
) -> DeleteTopicsResponse {
    let responses = if version >= 6 {
        request
            .topics
            .into_iter()
            .map(|t| delete_one(ctx, t.name.map(|n| n.0.as_str().to_string()), t.topic_id))
            .collect()
    } else {
        request
            .topic_names
            .into_iter()
            .map(|n| delete_one(ctx, Some(n.0.as_str().to_string()), Uuid::nil()))
            .map(|r| r.with_topic_id(Uuid::nil()))
            .collect()
    };
    DeleteTopicsResponse::default().with_responses(responses)
}
