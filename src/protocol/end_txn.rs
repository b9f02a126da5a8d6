//! EndTxn (key 26), v0–v4. Protocol guide "EndTxn"; KIP-98.
//!
//! Commits or aborts the producer's open transaction: the coordinator logs the decision,
//! writes the markers to every partition of the transaction and answers
//! (`txn::TransactionCoordinator::end_txn`). v5 (KIP-890 part 2's epoch bump per
//! transaction) is not offered: clients then keep their epoch, as before Kafka 4.0.
//!
//! Errors returned: NOT_COORDINATOR (16), COORDINATOR_LOAD_IN_PROGRESS (14),
//! INVALID_PRODUCER_ID_MAPPING (49), PRODUCER_FENCED (90; INVALID_PRODUCER_EPOCH 47
//! before v2), INVALID_TXN_STATE (48), CONCURRENT_TRANSACTIONS (51),
//! COORDINATOR_NOT_AVAILABLE (15).

use kafka_protocol::messages::{EndTxnRequest, EndTxnResponse};

use super::Context;

/// Handles an EndTxn request.
pub(super) async fn handle(ctx: &Context, request: EndTxnRequest, version: i16) -> EndTxnResponse {
    let result = ctx
        .txn
        .end_txn(
            request.transactional_id.0.as_str(),
            request.producer_id.0,
            request.producer_epoch,
            request.committed,
        )
        .await;
    EndTxnResponse::default().with_error_code(
        result
            .err()
            .map_or(0, |e| super::fenced_before(e, version, 2).code()),
    )
}
