//! SyncGroup (key 14), v0–v5. Protocol guide "SyncGroup"; KIP-345 (v3: group.instance.id),
//! KIP-559 (v5: protocol type/name).
//!
//! The leader's request carries every member's assignment; a follower's request waits
//! until the leader's has delivered it.
//!
//! Errors returned: see [`crate::group::GroupCoordinator::sync`].
//! NOT_COORDINATOR (16) first on a broker that does not coordinate the group
//! (`find_coordinator.rs`), COORDINATOR_NOT_AVAILABLE (15) when its coordinator is fenced.

use kafka_protocol::messages::{SyncGroupRequest, SyncGroupResponse};
use kafka_protocol::protocol::StrBytes;

use super::Context;
use crate::group::SyncRequest;

/// Handles a SyncGroup request.
pub(super) async fn handle(
    ctx: &Context,
    request: SyncGroupRequest,
    version: i16,
) -> SyncGroupResponse {
    if let Err(e) = super::find_coordinator::check_coordinator(ctx, request.group_id.0.as_str()) {
        return SyncGroupResponse::default().with_error_code(e.code());
    }
    let req = SyncRequest {
        group_id: request.group_id.0.to_string(),
        generation_id: request.generation_id,
        member_id: request.member_id.to_string(),
        group_instance_id: request.group_instance_id.map(|s| s.to_string()),
        protocol_type: request.protocol_type.map(|s| s.to_string()),
        protocol_name: request.protocol_name.map(|s| s.to_string()),
        assignments: request
            .assignments
            .into_iter()
            .map(|a| (a.member_id.to_string(), a.assignment))
            .collect(),
    };
    let r = ctx.groups.sync(req).await;
    let response = SyncGroupResponse::default()
        .with_error_code(r.error.map_or(0, |e| e.code()))
        .with_assignment(r.assignment);
    if version >= 5 {
        response
            .with_protocol_type(r.protocol_type.map(StrBytes::from_string))
            .with_protocol_name(r.protocol_name.map(StrBytes::from_string))
    } else {
        response
    }
}
