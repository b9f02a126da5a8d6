//! FindCoordinator (key 10), v0–v6. Protocol guide "FindCoordinator"; KIP-699 (v4+: batched
//! `coordinator_keys`).
//!
//! Every group's coordinator is this broker (one node). The first request creates
//! `__consumer_offsets`, as Kafka does.
//!
//! Errors returned per key: TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53) for a transactional
//! id (key type 1) — transactions are not implemented, and this is the answer Kafka gives a
//! client that may not use a transactional id, which clients treat as fatal (librdkafka's
//! `init_transactions()` fails at once instead of retrying the coordinator query until its
//! timeout); InitProducerId answers the same. INVALID_REQUEST (42) for any other key type;
//! COORDINATOR_NOT_AVAILABLE (15) when the offsets topic cannot be created.

use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::Context;

/// Key type of a consumer group.
const KEY_TYPE_GROUP: i8 = 0;
/// Key type of a transactional id.
const KEY_TYPE_TRANSACTION: i8 = 1;

fn find(ctx: &Context, key: StrBytes, key_type: i8) -> Coordinator {
    let out = Coordinator::default().with_key(key);
    let error = match key_type {
        KEY_TYPE_GROUP => ctx
            .groups
            .ensure_offsets_topic()
            .err()
            .map(|e| (e, "the offsets topic cannot be created".to_string())),
        KEY_TYPE_TRANSACTION => Some((
            ResponseError::TransactionalIdAuthorizationFailed,
            "transactions are not implemented by this broker".to_string(),
        )),
        _ => Some((
            ResponseError::InvalidRequest,
            format!("key type {key_type} is not supported: only consumer groups (0) have a coordinator here"),
        )),
    };
    match error {
        Some((e, message)) => out
            .with_node_id(BrokerId(-1))
            .with_host(StrBytes::from_static_str(""))
            .with_port(-1)
            .with_error_code(e.code())
            .with_error_message(Some(StrBytes::from_string(message))),
        None => out
            .with_node_id(BrokerId(ctx.metadata.node_id()))
            .with_host(StrBytes::from_string(ctx.advertised.host.clone()))
            .with_port(ctx.advertised.port),
    }
}

/// Handles a FindCoordinator request.
pub(super) fn handle(
    ctx: &Context,
    request: FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    if version >= 4 {
        let coordinators = request
            .coordinator_keys
            .into_iter()
            .map(|k| find(ctx, k, request.key_type))
            .collect();
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    let c = find(ctx, request.key, request.key_type);
    let response = FindCoordinatorResponse::default()
        .with_error_code(c.error_code)
        .with_node_id(c.node_id)
        .with_host(c.host)
        .with_port(c.port);
    if version >= 1 {
        response.with_error_message(c.error_message)
    } else {
        response
    }
}
