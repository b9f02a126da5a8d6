//! ListGroups (key 16), v0–v5. Protocol guide "ListGroups"; KIP-518 (v4: states filter),
//! KIP-848 (v5: types filter; "classic" or "consumer").
//!
//! State names compare case-insensitively, as Kafka's `ConsumerGroupState.parse`.

use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{GroupId, ListGroupsRequest, ListGroupsResponse};
use kafka_protocol::protocol::StrBytes;

use super::Context;

/// Handles a ListGroups request.
pub(super) fn handle(
    ctx: &Context,
    request: ListGroupsRequest,
    version: i16,
) -> ListGroupsResponse {
    let states: Vec<String> = request
        .states_filter
        .iter()
        .map(|s| s.to_ascii_lowercase())
        .collect();
    let types: Vec<String> = request
        .types_filter
        .iter()
        .map(|s| s.to_ascii_lowercase())
        .collect();
    let groups = ctx
        .groups
        .list()
        .into_iter()
        .filter(|g| states.is_empty() || states.contains(&g.state_name.to_ascii_lowercase()))
        .filter(|g| types.is_empty() || types.iter().any(|t| t == g.group_type))
        .map(|g| {
            let mut out = ListedGroup::default()
                .with_group_id(GroupId(StrBytes::from_string(g.group_id)))
                .with_protocol_type(StrBytes::from_string(g.protocol_type));
            if version >= 4 {
                out = out.with_group_state(StrBytes::from_static_str(g.state_name));
            }
            if version >= 5 {
                out = out.with_group_type(StrBytes::from_static_str(g.group_type));
            }
            out
        })
        .collect();
    ListGroupsResponse::default().with_groups(groups)
}
