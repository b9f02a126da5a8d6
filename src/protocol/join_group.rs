//! JoinGroup (key 11), v0–v9. Protocol guide "JoinGroup"; KIP-62 (v1: rebalance timeout),
//! KIP-394 (v4: MEMBER_ID_REQUIRED), KIP-345 (v5: group.instance.id), KIP-559 (v7:
//! protocol type/name in the response), KIP-800 (v8: reason), KIP-814 (v9: skip_assignment).
//!
//! Decodes, hands the request to the group coordinator and waits (without a thread) until
//! the join phase of the rebalance completes. v0 has no rebalance timeout: the session
//! timeout serves as both, as Kafka does.
//!
//! Errors returned: see [`crate::group::GroupCoordinator::join`].
//! NOT_COORDINATOR (16) first on a broker that does not coordinate the group
//! (`find_coordinator.rs`), COORDINATOR_NOT_AVAILABLE (15) when its coordinator is fenced.

use std::net::SocketAddr;

use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::{JoinGroupRequest, JoinGroupResponse};
use kafka_protocol::protocol::StrBytes;

use super::Context;
use crate::group::JoinRequest;

/// Handles a JoinGroup request from `peer` (reported by DescribeGroups as "/ip").
pub(super) async fn handle(
    ctx: &Context,
    request: JoinGroupRequest,
    version: i16,
    client_id: &str,
    peer: SocketAddr,
) -> JoinGroupResponse {
    if let Err(e) = super::find_coordinator::check_coordinator(ctx, request.group_id.0.as_str()) {
        // Nullable only from v7; before that "" means none.
        let protocol_name = (version < 7).then(StrBytes::default);
        return JoinGroupResponse::default()
            .with_error_code(e.code())
            .with_generation_id(-1)
            .with_protocol_name(protocol_name)
            .with_member_id(request.member_id);
    }
    let req = JoinRequest {
        group_id: request.group_id.0.to_string(),
        member_id: request.member_id.to_string(),
        group_instance_id: request.group_instance_id.map(|s| s.to_string()),
        client_id: client_id.to_string(),
        client_host: format!("/{}", peer.ip()),
        session_timeout_ms: request.session_timeout_ms,
        rebalance_timeout_ms: if version >= 1 {
            request.rebalance_timeout_ms
        } else {
            request.session_timeout_ms
        },
        protocol_type: request.protocol_type.to_string(),
        protocols: request
            .protocols
            .into_iter()
            .map(|p| (p.name.to_string(), p.metadata))
            .collect(),
        require_known_member_id: version >= 4,
    };
    let r = ctx.groups.join(req).await;
    let members = r
        .members
        .into_iter()
        .map(|m| {
            let out = JoinGroupResponseMember::default()
                .with_member_id(StrBytes::from_string(m.member_id))
                .with_metadata(m.metadata);
            if version >= 5 {
                out.with_group_instance_id(m.group_instance_id.map(StrBytes::from_string))
            } else {
                out
            }
        })
        .collect();
    let protocol_name = match r.protocol_name {
        Some(p) => Some(StrBytes::from_string(p)),
        // Nullable only from v7; before that "" means none.
        None if version < 7 => Some(StrBytes::default()),
        None => None,
    };
    let mut response = JoinGroupResponse::default()
        .with_error_code(r.error.map_or(0, |e| e.code()))
        .with_generation_id(r.generation_id)
        .with_protocol_name(protocol_name)
        .with_leader(StrBytes::from_string(r.leader_id))
        .with_member_id(StrBytes::from_string(r.member_id))
        .with_members(members);
    if version >= 7 {
        response = response.with_protocol_type(r.protocol_type.map(StrBytes::from_string));
    }
    if version >= 9 {
        response = response.with_skip_assignment(r.skip_assignment);
    }
    response
}
