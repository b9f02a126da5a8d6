//! FindCoordinator (key 10), v0–v6. Protocol guide "FindCoordinator"; KIP-699 (v4+: batched
//! `coordinator_keys`).
//!
//! A group's coordinator is the broker leading its `__consumer_offsets` partition
//! (Kafka's `partitionFor`), at the endpoint it registered (this broker at the one it
//! advertises now; on a single node, always this broker). The first request creates
//! `__consumer_offsets`, as Kafka does. The group APIs answer NOT_COORDINATOR (16) on any
//! other broker ([`check_coordinator`]).
//!
//! A transactional id's coordinator (key type 1) is the leader of its `__transaction_state`
//! partition, found the same way; the first request creates that topic.
//!
//! Errors returned per key: INVALID_REQUEST (42) for any other key type;
//! COORDINATOR_NOT_AVAILABLE (15) when the internal topic cannot be created or the
//! partition has no live leader.

use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::Context;
use crate::group::store::coordinator_in;

/// The broker coordinating `group` as (id, host, port): the leader of its
/// `__consumer_offsets` partition; this broker while the topic does not exist (it creates
/// it on first use).
///
/// Errors: COORDINATOR_NOT_AVAILABLE (15) when that leader is fenced or unknown.
fn coordinator_of(ctx: &Context, group: &str) -> Result<(i32, String, i32), ResponseError> {
    endpoint_of(ctx, coordinator_in(&ctx.metadata.image(), group))
}

/// The endpoint of coordinator `leader` (`None`: the internal topic does not exist yet,
/// so this broker, which creates it).
///
/// Errors: COORDINATOR_NOT_AVAILABLE (15) when that broker is fenced, unknown or has no
/// endpoint on the request's listener (Kafka's `getAliveBrokerNode(id, listenerName)`).
fn endpoint_of(ctx: &Context, leader: Option<i32>) -> Result<(i32, String, i32), ResponseError> {
    let image = ctx.metadata.image();
    let me = image.node_id();
    let this = || (me, ctx.advertised.host.clone(), ctx.advertised.port);
    let Some(leader) = leader else {
        return Ok(this());
    };
    if leader == me {
        return Ok(this());
    }
    image
        .broker(leader)
        .filter(|b| b.is_active())
        .and_then(|b| super::metadata::endpoint_named(b, &ctx.listener_name))
        .map(|e| (leader, e.host.clone(), e.port))
        .ok_or(ResponseError::CoordinatorNotAvailable)
}

/// Whether this broker coordinates `group` (the group APIs' first check), with the
/// group's partition loaded for this leadership (`GroupCoordinator::ensure_loaded`).
///
/// Errors: NOT_COORDINATOR (16) when another broker does (the client asks
/// FindCoordinator again), COORDINATOR_NOT_AVAILABLE (15) as [`coordinator_of`],
/// COORDINATOR_LOAD_IN_PROGRESS (14) when the partition cannot be loaded.
pub(super) fn check_coordinator(ctx: &Context, group: &str) -> Result<(), ResponseError> {
    match coordinator_of(ctx, group)? {
        // Led here: its groups are loaded for this leadership first (a failover).
        (id, _, _) if id == ctx.metadata.node_id() => ctx.groups.ensure_loaded(group),
        _ => Err(ResponseError::NotCoordinator),
    }
}

/// Key type of a consumer group.
const KEY_TYPE_GROUP: i8 = 0;
/// Key type of a transactional id.
const KEY_TYPE_TRANSACTION: i8 = 1;

fn find(ctx: &Context, key: StrBytes, key_type: i8) -> Coordinator {
    let group = key.to_string();
    let out = Coordinator::default().with_key(key);
    let mut found = None;
    let error = match key_type {
        KEY_TYPE_GROUP => match ctx.groups.ensure_offsets_topic() {
            Err(e) => Some((e, "the offsets topic cannot be created".to_string())),
            Ok(()) => match coordinator_of(ctx, &group) {
                Ok(c) => {
                    found = Some(c);
                    None
                }
                Err(e) => Some((e, "the group's coordinator is not available".to_string())),
            },
        },
        KEY_TYPE_TRANSACTION => match ctx.txn.ensure_state_topic() {
            Err(e) => Some((e, "the transaction state topic cannot be created".to_string())),
            Ok(()) => match endpoint_of(ctx, ctx.txn.coordinator_of(&group)) {
                Ok(c) => {
                    found = Some(c);
                    None
                }
                Err(e) => Some((e, "the transaction coordinator is not available".to_string())),
            },
        },
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
        None => {
            let (id, host, port) = found.unwrap_or_else(|| {
                (
                    ctx.metadata.node_id(),
                    ctx.advertised.host.clone(),
                    ctx.advertised.port,
                )
            });
            out.with_node_id(BrokerId(id))
                .with_host(StrBytes::from_string(host))
                .with_port(port)
        }
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
