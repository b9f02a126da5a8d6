//! LeaveGroup (key 13), v0–v5. Protocol guide "LeaveGroup"; KIP-345 (v3: a batch of members
//! by member id and/or group.instance.id), KIP-800 (v5: reason).
//!
//! Errors returned: INVALID_GROUP_ID (24) for the request; per member UNKNOWN_MEMBER_ID (25)
//! or FENCED_INSTANCE_ID (82). Before v3 the one member's error is the response's.
//! NOT_COORDINATOR (16) first on a broker that does not coordinate the group
//! (`find_coordinator.rs`), COORDINATOR_NOT_AVAILABLE (15) when its coordinator is fenced.

use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{LeaveGroupRequest, LeaveGroupResponse};

use super::Context;

/// Handles a LeaveGroup request.
pub(super) fn handle(
    ctx: &Context,
    request: LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
    if let Err(e) = super::find_coordinator::check_coordinator(ctx, request.group_id.0.as_str()) {
        return LeaveGroupResponse::default().with_error_code(e.code());
    }
    let members: Vec<(String, Option<String>)> = if version >= 3 {
        request
            .members
            .iter()
            .map(|m| {
                (
                    m.member_id.to_string(),
                    m.group_instance_id.as_ref().map(|s| s.to_string()),
                )
            })
            .collect()
    } else {
        vec![(request.member_id.to_string(), None)]
    };
    match ctx.groups.leave(request.group_id.0.as_str(), &members) {
        Err(e) => LeaveGroupResponse::default().with_error_code(e.code()),
        Ok(errors) if version < 3 => LeaveGroupResponse::default()
            .with_error_code(errors.first().copied().flatten().map_or(0, |e| e.code())),
        Ok(errors) => LeaveGroupResponse::default().with_members(
            request
                .members
                .into_iter()
                .zip(errors)
                .map(|(m, e)| {
                    MemberResponse::default()
                        .with_member_id(m.member_id)
                        .with_group_instance_id(m.group_instance_id)
                        .with_error_code(e.map_or(0, |e| e.code()))
                })
                .collect(),
        ),
    }
}
