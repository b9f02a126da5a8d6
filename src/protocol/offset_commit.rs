//! OffsetCommit (key 8), v0–v9. Protocol guide "OffsetCommit"; KIP-320 (v6: leader epoch),
//! KIP-345 (v7: group.instance.id). v0 and v1 are decoded by `legacy` (the
//! `kafka-protocol` crate has no codec for them; Kafka 4.0 removed them, KIP-896, 3.x
//! serves them). `retention_time_ms` (v2–v4) is ignored: `offsets.retention.minutes` applies, as in
//! Kafka since 2.1 (KIP-211).
//!
//! Errors returned per partition: see [`crate::group::GroupCoordinator::commit`].
//! NOT_COORDINATOR (16) first on a broker that does not coordinate the group
//! (`find_coordinator.rs`), COORDINATOR_NOT_AVAILABLE (15) when its coordinator is fenced.

use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::{OffsetCommitRequest, OffsetCommitResponse};

use super::Context;
use crate::group::{CommitRequest, OffsetToCommit};

/// Once any offset of `errors` was accepted (`None`), waits until the group's
/// `__consumer_offsets` partition is on every in-sync replica
/// ([`crate::group::GroupCoordinator::await_replicated`]); its error replaces each
/// acceptance when it is not. OffsetCommit and TxnOffsetCommit answer so.
pub(super) async fn await_replicated(
    ctx: &Context,
    group_id: &str,
    errors: &mut [Option<kafka_protocol::ResponseError>],
) {
    if errors.iter().any(Option::is_none) {
        if let Err(e) = ctx.groups.await_replicated(group_id).await {
            for ok in errors.iter_mut().filter(|e| e.is_none()) {
                *ok = Some(e);
            }
        }
    }
}

/// Handles an OffsetCommit request: answered once the commit is on every in-sync replica
/// of the group's `__consumer_offsets` partition
/// ([`crate::group::GroupCoordinator::await_replicated`]).
pub(super) async fn handle(
    ctx: &Context,
    request: OffsetCommitRequest,
    _version: i16,
) -> OffsetCommitResponse {
    let offsets = request
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| OffsetToCommit {
                topic: t.name.0.to_string(),
                partition: p.partition_index,
                offset: p.committed_offset,
                leader_epoch: p.committed_leader_epoch,
                metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
            })
        })
        .collect();
    let req = CommitRequest {
        group_id: request.group_id.0.to_string(),
        generation_id: request.generation_id_or_member_epoch,
        member_id: request.member_id.to_string(),
        group_instance_id: request.group_instance_id.as_ref().map(|s| s.to_string()),
        offsets,
    };
    let mut errors = match super::find_coordinator::check_coordinator(ctx, &req.group_id) {
        Ok(()) => ctx.groups.commit(&req),
        Err(e) => req.offsets.iter().map(|_| Some(e)).collect(),
    };
    await_replicated(ctx, &req.group_id, &mut errors).await;
    let mut errors = errors.into_iter();
    let topics = request
        .topics
        .into_iter()
        .map(|t| {
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(errors.next().flatten().map_or(0, |e| e.code()))
                })
                .collect();
            OffsetCommitResponseTopic::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    OffsetCommitResponse::default().with_topics(topics)
}
