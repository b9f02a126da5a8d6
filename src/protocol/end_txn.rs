//! EndTxn (key 26), v0–v5. Protocol guide "EndTxn"; KIP-98; KIP-890 part 2 (v5).
//!
//! Commits or aborts the producer's open transaction: the coordinator logs the decision,
//! writes the markers to every partition of the transaction and answers
//! (`txn::TransactionCoordinator::end_txn`). v5 is transaction version 2: the epoch is
//! bumped per transaction and the answer carries the producer id and epoch the producer
//! goes on with (-1 on an error); v0–v4 keep the epoch.
//!
//! Errors returned: NOT_COORDINATOR (16), COORDINATOR_LOAD_IN_PROGRESS (14),
//! INVALID_PRODUCER_ID_MAPPING (49), PRODUCER_FENCED (90; INVALID_PRODUCER_EPOCH 47
//! before v2), INVALID_TXN_STATE (48), CONCURRENT_TRANSACTIONS (51),
//! COORDINATOR_NOT_AVAILABLE (15).

use kafka_protocol::messages::{EndTxnRequest, EndTxnResponse, ProducerId};

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
            version >= 5,
        )
        .await;
    let (error_code, (producer_id, producer_epoch)) = match result {
        Ok(next) => (0, next.unwrap_or((-1, -1))),
        Err(e) => (super::fenced_before(e, version, 2).code(), (-1, -1)),
    };
    EndTxnResponse::default()
        .with_error_code(error_code)
        .with_producer_id(ProducerId(producer_id))
        .with_producer_epoch(producer_epoch)
}
