//! InitProducerId (key 22), v0–v4. Protocol guide "InitProducerId"; KIP-98 (idempotent and
//! transactional producers), KIP-360 (v3+: an existing producer id and epoch ask for an
//! epoch bump), KIP-588 (v4: PRODUCER_FENCED).
//!
//! Without a `transactional_id`: a new producer id, unique across restarts (see
//! `cluster::Metadata::next_producer_id`), with epoch 0. As in Kafka, a
//! non-transactional producer that sends its old id and epoch (KIP-360) also gets a fresh
//! id: its sequence numbers then start again at 0.
//! With one: the transaction coordinator's answer (`txn::TransactionCoordinator::
//! init_producer_id`): the id's producer id with a bumped epoch, fencing older producers.
//!
//! Errors returned: those of the coordinator (NOT_COORDINATOR 16,
//! CONCURRENT_TRANSACTIONS 51, INVALID_TRANSACTION_TIMEOUT 50, PRODUCER_FENCED 90 —
//! INVALID_PRODUCER_EPOCH 47 before v4, as Kafka maps it), UNKNOWN_SERVER_ERROR (-1) when
//! the id block cannot be persisted.

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};
use kafka_protocol::ResponseError;

use super::Context;

/// Handles an InitProducerId request.
pub(super) async fn handle(
    ctx: &Context,
    request: InitProducerIdRequest,
    version: i16,
) -> InitProducerIdResponse {
    let fail = |e: ResponseError| {
        InitProducerIdResponse::default()
            .with_error_code(super::fenced_before(e, version, 4).code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
    };
    if let Some(id) = request.transactional_id.as_ref().map(|t| t.0.to_string()) {
        let expected =
            (request.producer_id.0 >= 0).then_some((request.producer_id.0, request.producer_epoch));
        return match ctx
            .txn
            .init_producer_id(&id, request.transaction_timeout_ms, expected)
            .await
        {
            Ok((pid, epoch)) => InitProducerIdResponse::default()
                .with_producer_id(ProducerId(pid))
                .with_producer_epoch(epoch),
            Err(e) => fail(e),
        };
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
