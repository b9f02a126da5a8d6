//! DeleteGroups (key 42), v0–v2. Protocol guide "DeleteGroups"; KIP-229.
//!
//! Errors returned per group: GROUP_ID_NOT_FOUND (69), NON_EMPTY_GROUP (68) while it has
//! members, COORDINATOR_NOT_AVAILABLE (15) when the deletion cannot be written or the
//! group's coordinator is fenced, NOT_COORDINATOR (16) on a broker that does not
//! coordinate the group (`find_coordinator.rs`).

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::{DeleteGroupsRequest, DeleteGroupsResponse};

use super::Context;

/// Handles a DeleteGroups request.
pub(super) fn handle(
    ctx: &Context,
    request: DeleteGroupsRequest,
    _version: i16,
) -> DeleteGroupsResponse {
    // A name listed twice gets one result, as Kafka (it collects the names into a set).
    let mut seen = std::collections::HashSet::new();
    let results = request
        .groups_names
        .into_iter()
        .filter(|g| seen.insert(g.0.clone()))
        .map(|g| {
            let error = super::find_coordinator::check_coordinator(ctx, g.0.as_str())
                .err()
                .or_else(|| ctx.groups.delete_group(g.0.as_str()));
            DeletableGroupResult::default()
                .with_group_id(g)
                .with_error_code(error.map_or(0, |e| e.code()))
        })
        .collect();
    DeleteGroupsResponse::default().with_results(results)
}
