//! TxnOffsetCommit (key 28), v0–v5. Protocol guide "TxnOffsetCommit"; KIP-98, KIP-447
//! (v3: generation, member id and group.instance.id, checked as OffsetCommit checks them),
//! KIP-890 (v4 may answer TRANSACTION_ABORTABLE, which weir never does; v5: the group's
//! `__consumer_offsets` partition is added to the producer's transaction here, as the
//! producer sends no AddOffsetsToTxn).
//!
//! Sent to the group's coordinator; the offsets are logged as part of the producer's
//! transaction and become visible to OffsetFetch only with its COMMIT marker
//! (`group::GroupCoordinator::txn_commit`, `complete_txn`). Answered once they are on
//! every in-sync replica of the group's `__consumer_offsets` partition.
//!
//! Errors returned per partition: see `GroupCoordinator::txn_commit`; NOT_COORDINATOR
//! (16) first on a broker that does not coordinate the group.

use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{TxnOffsetCommitRequest, TxnOffsetCommitResponse};

use kafka_protocol::ResponseError;

use super::Context;
use crate::group::store::partition_for;
use crate::group::{OffsetToCommit, TxnCommitRequest, OFFSETS_TOPIC};

/// v5 (KIP-890 part 2): the producer sent no AddOffsetsToTxn, so the group's
/// `__consumer_offsets` partition is added to its transaction here, as a partition leader
/// adds a Produce v12's partition (`txn::TransactionCoordinator::verify_write`).
///
/// Errors: those of `verify_write`, with a coordinator out of reach as
/// COORDINATOR_NOT_AVAILABLE (15) (Kafka's `CoordinatorOperationExceptionHelper`).
async fn add_offsets_partition(
    ctx: &Context,
    transactional_id: &str,
    req: &TxnCommitRequest,
) -> Result<(), ResponseError> {
    let Some(partitions) = ctx.metadata.topic(OFFSETS_TOPIC).map(|t| t.partitions) else {
        return Err(ResponseError::CoordinatorNotAvailable);
    };
    ctx.txn
        .verify_write(
            transactional_id,
            (req.producer_id, req.producer_epoch),
            OFFSETS_TOPIC,
            partition_for(&req.group_id, partitions),
            true,
        )
        .await
        .map_err(|e| match e {
            ResponseError::NotEnoughReplicas => ResponseError::CoordinatorNotAvailable,
            other => other,
        })
}

/// Handles a TxnOffsetCommit request.
pub(super) async fn handle(
    ctx: &Context,
    request: TxnOffsetCommitRequest,
    version: i16,
) -> TxnOffsetCommitResponse {
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
    let req = TxnCommitRequest {
        group_id: request.group_id.0.to_string(),
        producer_id: request.producer_id.0,
        producer_epoch: request.producer_epoch,
        generation_id: request.generation_id,
        member_id: request.member_id.to_string(),
        group_instance_id: request.group_instance_id.as_ref().map(|s| s.to_string()),
        offsets,
    };
    let checked = super::find_coordinator::check_coordinator(ctx, &req.group_id);
    let added = match checked {
        Ok(()) if version >= 5 => {
            add_offsets_partition(ctx, request.transactional_id.0.as_str(), &req).await
        }
        other => other,
    };
    let mut errors = match added {
        Ok(()) => ctx.groups.txn_commit(&req),
        Err(e) => req.offsets.iter().map(|_| Some(e)).collect(),
    };
    super::offset_commit::await_replicated(ctx, &req.group_id, &mut errors).await;
    let mut errors = errors.into_iter();
    let topics = request
        .topics
        .into_iter()
        .map(|t| {
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    TxnOffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(errors.next().flatten().map_or(0, |e| e.code()))
                })
                .collect();
            TxnOffsetCommitResponseTopic::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    TxnOffsetCommitResponse::default().with_topics(topics)
}
