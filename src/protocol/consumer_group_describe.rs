//! ConsumerGroupDescribe (key 69), v0–v1. KIP-848: a consumer-protocol group's epoch,
//! target assignment epoch, assignor and members with their epochs, assignments and
//! target assignments.
//!
//! Per group: GROUP_ID_NOT_FOUND (69) for an unknown group or a classic one (the admin
//! client then falls back to DescribeGroups, as with Kafka), NOT_COORDINATOR (16) on a
//! broker that does not coordinate it, INVALID_GROUP_ID (24) for an empty id,
//! UNSUPPORTED_VERSION (35) when `group.coordinator.rebalance.protocols` leaves out
//! `consumer` (then the API is not advertised either). Authorized
//! operations are not computed (no ACLs): the field keeps its "not requested" default.

use kafka_protocol::messages::consumer_group_describe_response::{
    Assignment, DescribedGroup, Member, TopicPartitions,
};
use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use uuid::Uuid;

use super::Context;

fn assignment(parts: Vec<(Uuid, String, Vec<i32>)>) -> Assignment {
    Assignment::default().with_topic_partitions(
        parts
            .into_iter()
            .map(|(id, name, p)| {
                TopicPartitions::default()
                    .with_topic_id(id)
                    .with_topic_name(TopicName(StrBytes::from_string(name)))
                    .with_partitions(p)
            })
            .collect(),
    )
}

/// Handles a ConsumerGroupDescribe request.
pub(super) fn handle(
    ctx: &Context,
    request: ConsumerGroupDescribeRequest,
    _version: i16,
) -> ConsumerGroupDescribeResponse {
    let groups = request
        .group_ids
        .into_iter()
        .map(|id| {
            let out = DescribedGroup::default().with_group_id(id.clone());
            let group = id.0.as_str();
            if !ctx.config.group.consumer_protocol_enabled {
                // As Kafka: every group UNSUPPORTED_VERSION (35) when
                // group.coordinator.rebalance.protocols leaves out `consumer`.
                return out.with_error_code(ResponseError::UnsupportedVersion.code());
            }
            if group.is_empty() {
                return out.with_error_code(ResponseError::InvalidGroupId.code());
            }
            if let Err(e) = super::find_coordinator::check_coordinator(ctx, group) {
                return out.with_error_code(e.code());
            }
            let d = match ctx.groups.consumer_describe(group) {
                Ok(d) => d,
                Err((e, message)) => {
                    return out
                        .with_error_code(e.code())
                        .with_error_message(Some(StrBytes::from_string(message)))
                }
            };
            let members = d
                .members
                .into_iter()
                .map(|m| {
                    Member::default()
                        .with_member_id(StrBytes::from_string(m.member_id))
                        .with_instance_id(m.instance_id.map(StrBytes::from_string))
                        .with_rack_id(m.rack_id.map(StrBytes::from_string))
                        .with_member_epoch(m.member_epoch)
                        .with_client_id(StrBytes::from_string(m.client_id))
                        .with_client_host(StrBytes::from_string(m.client_host))
                        .with_subscribed_topic_names(
                            m.subscribed_topic_names
                                .into_iter()
                                .map(|t| TopicName(StrBytes::from_string(t)))
                                .collect(),
                        )
                        .with_subscribed_topic_regex(
                            m.subscribed_topic_regex.map(StrBytes::from_string),
                        )
                        .with_assignment(assignment(m.assignment))
                        .with_target_assignment(assignment(m.target_assignment))
                        // KIP-1099: 0 a classic member (online migration), 1 a consumer one.
                        .with_member_type(if m.classic { 0 } else { 1 })
                })
                .collect();
            out.with_group_state(StrBytes::from_static_str(d.state))
                .with_group_epoch(d.group_epoch)
                .with_assignment_epoch(d.assignment_epoch)
                .with_assignor_name(StrBytes::from_string(d.assignor_name))
                .with_members(members)
        })
        .collect();
    ConsumerGroupDescribeResponse::default().with_groups(groups)
}
