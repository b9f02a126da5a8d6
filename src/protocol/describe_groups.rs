//! DescribeGroups (key 15), v0–v6. Protocol guide "DescribeGroups"; KIP-345 (v4:
//! group.instance.id), KIP-430 (v3: authorized operations — not computed: no ACLs, the
//! field keeps its "not requested" default), KIP-1043 (v6: error message, and
//! GROUP_ID_NOT_FOUND for a group that does not exist).
//!
//! A consumer-protocol group (KIP-848) is not described here, as Kafka: GROUP_ID_NOT_FOUND
//! (v6+) with a message saying so; ConsumerGroupDescribe describes it.
//! Before v6 an unknown group is described as state "Dead" with no error, as Kafka does.
//! Member metadata and assignment are filled only for Stable groups (Kafka's `summary`).
//! Per group: NOT_COORDINATOR (16) on a broker that does not coordinate the group
//! (`find_coordinator.rs`), COORDINATOR_NOT_AVAILABLE (15) when its coordinator is fenced.

use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::{DescribeGroupsRequest, DescribeGroupsResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::Context;
use crate::group::GroupState;

/// Handles a DescribeGroups request.
pub(super) fn handle(
    ctx: &Context,
    request: DescribeGroupsRequest,
    version: i16,
) -> DescribeGroupsResponse {
    let groups = request
        .groups
        .into_iter()
        .map(|id| {
            let out = DescribedGroup::default().with_group_id(id.clone());
            if let Err(e) = super::find_coordinator::check_coordinator(ctx, id.0.as_str()) {
                return out.with_error_code(e.code());
            }
            let Some(d) = ctx.groups.describe(id.0.as_str()) else {
                let out = out
                    .with_group_state(StrBytes::from_static_str(GroupState::Dead.name()))
                    .with_protocol_type(StrBytes::default())
                    .with_protocol_data(StrBytes::default());
                let message = match ctx.groups.group_type(id.0.as_str()) {
                    Some(kind) => format!(
                        "Group {} is not a classic group (it is a {kind} group).",
                        id.0.as_str()
                    ),
                    None => format!("Group {} not found.", id.0.as_str()),
                };
                return if version >= 6 {
                    out.with_error_code(ResponseError::GroupIdNotFound.code())
                        .with_error_message(Some(StrBytes::from_string(message)))
                } else {
                    out
                };
            };
            let members = d
                .members
                .into_iter()
                .map(|m| {
                    let out = DescribedGroupMember::default()
                        .with_member_id(StrBytes::from_string(m.member_id))
                        .with_client_id(StrBytes::from_string(m.client_id))
                        .with_client_host(StrBytes::from_string(m.client_host))
                        .with_member_metadata(m.metadata)
                        .with_member_assignment(m.assignment);
                    if version >= 4 {
                        out.with_group_instance_id(m.group_instance_id.map(StrBytes::from_string))
                    } else {
                        out
                    }
                })
                .collect();
            out.with_group_state(StrBytes::from_static_str(d.state.name()))
                .with_protocol_type(StrBytes::from_string(d.protocol_type))
                .with_protocol_data(StrBytes::from_string(d.protocol))
                .with_members(members)
        })
        .collect();
    DescribeGroupsResponse::default().with_groups(groups)
}
