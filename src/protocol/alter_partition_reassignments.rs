//! AlterPartitionReassignments (key 45), v0–v1. Protocol guide
//! "AlterPartitionReassignments"; KIP-455 (v1: KIP-860's
//! `allow_replication_factor_change`).
//!
//! Starts, replaces or cancels (null `replicas`) the reassignment of each partition
//! named, through `cluster::Metadata::alter_partition_reassignments`: one metadata change
//! through the quorum, proposed by whichever broker the client asked (as CreatePartitions
//! here; never NOT_CONTROLLER). The answer comes once the change is committed; the
//! reassignment then runs in the background (ListPartitionReassignments shows it) and
//! completes when the new replicas are in sync. `timeout_ms` is not waited on beyond the
//! commit.
//!
//! Errors per partition: INVALID_REPLICA_ASSIGNMENT (39) for an empty list, a broker
//! twice, or a broker not registered or fenced; UNKNOWN_TOPIC_OR_PARTITION (3);
//! NO_REASSIGNMENT_IN_PROGRESS (85) for cancelling nothing; INVALID_REPLICATION_FACTOR
//! (38) for a replication factor change with `allow_replication_factor_change` false
//! (v1); UNKNOWN_SERVER_ERROR (-1) when the change cannot be committed. The top-level
//! error is always NONE.

use kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::Context;
use crate::cluster::Reassignment;

/// Handles an AlterPartitionReassignments request.
pub(super) fn handle(
    ctx: &Context,
    request: AlterPartitionReassignmentsRequest,
    version: i16,
) -> AlterPartitionReassignmentsResponse {
    // v0 has no such field: a change of replication factor is allowed (Kafka's default).
    let allow_rf_change = version < 1 || request.allow_replication_factor_change;
    let wanted: Vec<Reassignment> = request
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| Reassignment {
                topic: t.name.0.as_str().to_string(),
                partition: p.partition_index,
                replicas: p.replicas.as_ref().map(|r| r.iter().map(|b| b.0).collect()),
            })
        })
        .collect();
    let mut results = ctx
        .metadata
        .alter_partition_reassignments(&wanted, allow_rf_change)
        .into_iter();
    let responses = request
        .topics
        .into_iter()
        .map(|t| {
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let out = ReassignablePartitionResponse::default()
                        .with_partition_index(p.partition_index);
                    match results.next() {
                        Some(Ok(())) => out,
                        Some(Err(e)) => out
                            .with_error_code(e.error.code())
                            .with_error_message(Some(StrBytes::from_string(e.message))),
                        // One result per partition: does not happen.
                        None => out.with_error_code(
                            kafka_protocol::ResponseError::UnknownServerError.code(),
                        ),
                    }
                })
                .collect();
            ReassignableTopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    AlterPartitionReassignmentsResponse::default()
        .with_allow_replication_factor_change(allow_rf_change)
        .with_responses(responses)
}
