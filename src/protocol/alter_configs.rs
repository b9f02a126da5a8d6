//! AlterConfigs (key 33), v0–v2. Protocol guide "AlterConfigs"; KIP-133 (the API),
//! KIP-226 (dynamic broker configs).
//!
//! Topic resources (type 2): the request's configs *replace* the topic's whole set of
//! overrides, as Kafka does for this non-incremental API — a key not listed reverts to the
//! broker's value (a null value also means "not set"). Validated like CreateTopics (known
//! topic-level key, value of the key's type); `validate_only` validates and changes
//! nothing. The new set is persisted and applied to the live partitions at once (produce
//! settings now; log roll, retention and flush settings from their next use).
//!
//! Broker resources (type 4, KIP-226): name "" is the cluster default every broker
//! applies, "<this node id>" this broker alone. The request's configs replace that
//! resource's whole set of dynamic configs; each key must be dynamic
//! (`config::DYNAMIC_BROKER_KEYS`, per-broker keys such as `listeners` only on a broker)
//! with a valid value. The set is a metadata record (`cluster`), so every broker sees the
//! cluster default and a restart keeps it; topics without an override of their own
//! follow the log-level keys at once.
//!
//! Errors returned per resource: UNKNOWN_TOPIC_OR_PARTITION (3), INVALID_CONFIG (40),
//! INVALID_REQUEST (42) for a read-only, unknown or invalid broker key (Kafka answers
//! INVALID_REQUEST there too, KAFKA-13609), another broker's id, another resource type or
//! a resource named twice, UNKNOWN_SERVER_ERROR (-1) when the metadata cannot be written.

use std::collections::{BTreeMap, HashSet};

use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::{AlterConfigsRequest, AlterConfigsResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::Context;
use crate::config::check_dynamic_change;
use crate::topics::{self, TopicError};

/// Resource type: topic.
pub(super) const TOPIC: i8 = 2;
/// Resource type: broker.
pub(super) const BROKER: i8 = 4;

/// The error for a resource other than a topic or a broker, or a resource named twice;
/// `None` when the resource may be altered.
pub(super) fn refused_resource(
    resource_type: i8,
    name: &str,
    seen: &mut HashSet<(i8, String)>,
) -> Option<TopicError> {
    if !seen.insert((resource_type, name.to_string())) {
        return Some(TopicError::new(
            ResponseError::InvalidRequest,
            format!("Resource '{name}' of type {resource_type} appears more than once."),
        ));
    }
    match resource_type {
        TOPIC | BROKER => None,
        other => Some(TopicError::new(
            ResponseError::InvalidRequest,
            format!("Unsupported resource type {other}."),
        )),
    }
}

/// Replaces the dynamic configs of broker resource `name` ("" or this node's id) with
/// what `f` computes from the current ones, after checking them
/// ([`check_dynamic_change`]). Shared by AlterConfigs and IncrementalAlterConfigs.
///
/// Errors: INVALID_REQUEST (42) for another broker's id or a key refused (Kafka's
/// `ConfigAdminManager` wording), whatever `f` returns, UNKNOWN_SERVER_ERROR (-1) when
/// the metadata cannot be written.
pub(super) fn alter_broker(
    ctx: &Context,
    name: &str,
    validate_only: bool,
    f: impl FnOnce(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, TopicError>,
) -> Result<(), TopicError> {
    let me = ctx.metadata.image().node_id();
    if !name.is_empty() && name != me.to_string() {
        return Err(TopicError::new(
            ResponseError::InvalidRequest,
            format!("Unexpected broker id, expected {me}, but received {name}"),
        ));
    }
    let per_broker = !name.is_empty();
    ctx.metadata
        .alter_broker_configs(name, validate_only, |current| {
            let next = f(current)?;
            check_dynamic_change(&next, per_broker)
                .map_err(|e| TopicError::new(ResponseError::InvalidRequest, e.to_string()))?;
            Ok(next)
        })
}

/// The Kafka error code and message of a resource's outcome.
pub(super) fn outcome(result: Result<(), TopicError>) -> (i16, Option<StrBytes>) {
    match result {
        Ok(()) => (0, None),
        Err(e) => (e.error.code(), Some(StrBytes::from_string(e.message))),
    }
}

/// Handles an AlterConfigs request.
pub(super) fn handle(
    ctx: &Context,
    request: AlterConfigsRequest,
    _version: i16,
) -> AlterConfigsResponse {
    let mut seen = HashSet::new();
    let responses = request
        .resources
        .into_iter()
        .map(|r| {
            let name = r.resource_name.as_str();
            let result = match refused_resource(r.resource_type, name, &mut seen) {
                Some(e) => Err(e),
                None => {
                    // Later entries for the same key win, as Kafka's `Properties` do.
                    let configs: BTreeMap<String, String> = r
                        .configs
                        .iter()
                        .filter_map(|c| {
                            c.value
                                .as_ref()
                                .map(|v| (c.name.as_str().to_string(), v.as_str().to_string()))
                        })
                        .collect();
                    if r.resource_type == BROKER {
                        alter_broker(ctx, name, request.validate_only, |_| Ok(configs))
                    } else {
                        topics::alter_configs(&ctx.topics, name, request.validate_only, |_| {
                            Ok(configs)
                        })
                    }
                }
            };
            let (code, message) = outcome(result);
            AlterConfigsResourceResponse::default()
                .with_error_code(code)
                .with_error_message(message)
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone())
        })
        .collect();
    AlterConfigsResponse::default().with_responses(responses)
}
