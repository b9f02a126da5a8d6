//! Heartbeat (key 12), v0–v4. Protocol guide "Heartbeat"; KIP-345 (v3: group.instance.id).
//!
//! Errors returned: see [`crate::group::GroupCoordinator::heartbeat`] — REBALANCE_IN_PROGRESS
//! (27) tells a member to rejoin.
//! NOT_COORDINATOR (16) first on a broker that does not coordinate the group
//! (`find_coordinator.rs`), COORDINATOR_NOT_AVAILABLE (15) when its coordinator is fenced.

use kafka_protocol::messages::{HeartbeatRequest, HeartbeatResponse};

use super::Context;

/// Handles a Heartbeat request.
pub(super) fn handle(ctx: &Context, request: HeartbeatRequest, _version: i16) -> HeartbeatResponse {
    if let Err(e) = super::find_coordinator::check_coordinator(ctx, request.group_id.0.as_str()) {
        return HeartbeatResponse::default().with_error_code(e.code());
    }
    let error = ctx.groups.heartbeat(
        request.group_id.0.as_str(),
        request.generation_id,
        request.member_id.as_str(),
        request.group_instance_id.as_ref().map(|s| s.as_str()),
    );
    HeartbeatResponse::default().with_error_code(error.map_or(0, |e| e.code()))
}
