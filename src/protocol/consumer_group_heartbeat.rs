//! ConsumerGroupHeartbeat (key 68), v0–v1. KIP-848 (the next-generation consumer group
//! protocol); v1 (KIP-1082): members name themselves and may subscribe by regex.
//!
//! Answered at once, never parked. Errors returned: see
//! [`crate::group::GroupCoordinator::consumer_heartbeat`]; NOT_COORDINATOR (16) first on a
//! broker that does not coordinate the group (`find_coordinator.rs`),
//! COORDINATOR_LOAD_IN_PROGRESS (14) while its groups load, UNSUPPORTED_VERSION (35) when
//! `group.coordinator.rebalance.protocols` leaves out `consumer` (then the API is not
//! advertised either).

use std::net::SocketAddr;

use kafka_protocol::messages::consumer_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::{ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::Context;
use crate::group::consumer::HeartbeatRequest;

/// Handles a ConsumerGroupHeartbeat request.
pub(super) fn handle(
    ctx: &Context,
    request: ConsumerGroupHeartbeatRequest,
    _version: i16,
    client_id: &str,
    peer: SocketAddr,
) -> ConsumerGroupHeartbeatResponse {
    let error = |e: ResponseError, message: Option<String>| {
        ConsumerGroupHeartbeatResponse::default()
            .with_error_code(e.code())
            .with_error_message(message.map(StrBytes::from_string))
            .with_member_epoch(-1)
    };
    if !ctx.config.group.consumer_protocol_enabled {
        return error(
            ResponseError::UnsupportedVersion,
            Some(
                "The consumer group protocol is disabled (group.coordinator.rebalance.protocols)."
                    .to_string(),
            ),
        );
    }
    // The request is checked before the coordinator is (as Kafka): an empty group id is
    // INVALID_REQUEST on every broker.
    if request.group_id.0.trim().is_empty() {
        return error(
            ResponseError::InvalidRequest,
            Some("GroupId can't be empty.".to_string()),
        );
    }
    if let Err(e) = super::find_coordinator::check_coordinator(ctx, request.group_id.0.as_str()) {
        return error(e, None);
    }
    let req = HeartbeatRequest {
        group_id: request.group_id.0.to_string(),
        member_id: request.member_id.to_string(),
        member_epoch: request.member_epoch,
        instance_id: request.instance_id.map(|s| s.to_string()),
        rack_id: request.rack_id.map(|s| s.to_string()),
        rebalance_timeout_ms: request.rebalance_timeout_ms,
        subscribed_topic_names: request
            .subscribed_topic_names
            .map(|names| names.into_iter().map(|n| n.0.to_string()).collect()),
        subscribed_topic_regex: request.subscribed_topic_regex.map(|s| s.to_string()),
        server_assignor: request.server_assignor.map(|s| s.to_string()),
        owned: request.topic_partitions.map(|tps| {
            tps.into_iter()
                .map(|tp| (tp.topic_id, tp.partitions))
                .collect()
        }),
        client_id: client_id.to_string(),
        client_host: format!("/{}", peer.ip()),
    };
    let r = ctx.groups.consumer_heartbeat(&req);
    if r.error == Some(ResponseError::InvalidRequest) {
        // A malformed heartbeat: one line per peer per 10 s.
        static WARNINGS: std::sync::OnceLock<crate::server::warn_limit::PeerWarnings> =
            std::sync::OnceLock::new();
        let warnings = WARNINGS.get_or_init(crate::server::warn_limit::PeerWarnings::new);
        if let Some(suppressed) = warnings.admit(peer.ip(), std::time::Instant::now()) {
            tracing::warn!(
                %peer,
                group = %req.group_id,
                member = %req.member_id,
                member_epoch = req.member_epoch,
                owned = ?req.owned.as_ref().map(Vec::len),
                names = ?req.subscribed_topic_names.as_ref().map(Vec::len),
                regex = ?req.subscribed_topic_regex,
                suppressed,
                "ConsumerGroupHeartbeat refused: {}",
                r.error_message.as_deref().unwrap_or("")
            );
        }
    }
    if let Some(e) = r.error {
        return error(e, r.error_message).with_member_id(r.member_id.map(StrBytes::from_string));
    }
    ConsumerGroupHeartbeatResponse::default()
        .with_member_id(r.member_id.map(StrBytes::from_string))
        .with_member_epoch(r.member_epoch)
        .with_heartbeat_interval_ms(r.heartbeat_interval_ms)
        .with_assignment(r.assignment.map(|parts| {
            Assignment::default().with_topic_partitions(
                parts
                    .into_iter()
                    .map(|(id, p)| {
                        TopicPartitions::default()
                            .with_topic_id(id)
                            .with_partitions(p)
                    })
                    .collect(),
            )
        }))
}
