//! InitProducerId (key 22), v0–v4. Protocol guide "InitProducerId"; KIP-98 (idempotent
//! producer), KIP-360 (v3+: an existing producer id and epoch ask for an epoch bump).
//!
//! Idempotent producers only: every request gets a new producer id, unique across
//! restarts (see `cluster::Metadata::next_producer_id`), with epoch 0. As in Kafka, a
//! non-transactional producer that sends its old id and epoch (KIP-360) also gets a fresh
//! id: its sequence numbers then start again at 0.
//! Transactions are not implemented: a `transactional_id` gets
//! TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53), which clients report as fatal instead of
//! retrying forever.
//!
//! Errors returned: TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53), UNKNOWN_SERVER_ERROR (-1)
//! when the id block cannot be persisted.

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};
use kafka_protocol::ResponseError;

use super::Context;

/// Handles an InitProducerId request.
pub(super) fn handle(
    ctx: &Context,
    request: InitProducerIdRequest,
    _version: i16,
) -> InitProducerIdResponse {
    let fail = |e: ResponseError| {
        InitProducerIdResponse::default()
            .with_error_code(e.code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
    };
    if request.transactional_id.is_some() {
        return fail(ResponseError::TransactionalIdAuthorizationFailed);
    }
    match ctx.metadata.next_producer_id() {
        Ok(id) => InitProducerIdResponse::default()
            .with_producer_id(ProducerId(id))
            .with_producer_epoch(0),
        Err(e) => {
            tracing::error!(error = %e, "cannot allocate a producer id");
            fail(ResponseError::UnknownServerError)
        }
    }
}
