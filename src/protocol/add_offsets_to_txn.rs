//! AddOffsetsToTxn (key 25), v0–v3. Protocol guide "AddOffsetsToTxn"; KIP-98.
//!
//! Adds the group's `__consumer_offsets` partition (Kafka's `partitionFor`) to the
//! transaction, so its TxnOffsetCommit records get the transaction's marker. Creates the
//! offsets topic first when needed, as FindCoordinator for a group does.
//!
//! Errors returned: COORDINATOR_NOT_AVAILABLE (15) when the offsets topic cannot be
//! created, INVALID_GROUP_ID (24) for an empty group id, and the coordinator's errors as
//! AddPartitionsToTxn (PRODUCER_FENCED 90 is INVALID_PRODUCER_EPOCH 47 before v2).

use kafka_protocol::messages::{AddOffsetsToTxnRequest, AddOffsetsToTxnResponse};
use kafka_protocol::ResponseError;

use super::Context;
use crate::group::store::partition_for;
use crate::group::OFFSETS_TOPIC;

/// Handles an AddOffsetsToTxn request.
pub(super) async fn handle(
    ctx: &Context,
    request: AddOffsetsToTxnRequest,
    version: i16,
) -> AddOffsetsToTxnResponse {
    let answer = |e: Option<ResponseError>| {
        AddOffsetsToTxnResponse::default()
            .with_error_code(e.map_or(0, |e| super::fenced_before(e, version, 2).code()))
    };
    let group = request.group_id.0.to_string();
    if group.is_empty() {
        return answer(Some(ResponseError::InvalidGroupId));
    }
    if let Err(e) = ctx.groups.ensure_offsets_topic() {
        return answer(Some(e));
    }
    let Some(partitions) = ctx.metadata.topic(OFFSETS_TOPIC).map(|t| t.partitions) else {
        return answer(Some(ResponseError::CoordinatorNotAvailable));
    };
    let partition = (OFFSETS_TOPIC.to_string(), partition_for(&group, partitions));
    answer(
        ctx.txn
            .add_partitions(
                request.transactional_id.0.as_str(),
                request.producer_id.0,
                request.producer_epoch,
                &[partition],
                false,
            )
            .await
            .err(),
    )
}
