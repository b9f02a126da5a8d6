//! ListTransactions (key 66), v0–v1. KIP-664 (kafka-transactions.sh `list`); v1 adds the
//! duration filter (KIP-994: only transactions open longer than it).
//!
//! Lists the transactions this broker coordinates (admin clients ask every broker and
//! merge), filtered by state names, producer ids and, v1+, how long they have been open.
//! Unknown state names are echoed in `unknown_state_filters`, as Kafka.

use kafka_protocol::messages::list_transactions_response::TransactionState;
use kafka_protocol::messages::{
    ListTransactionsRequest, ListTransactionsResponse, ProducerId, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;

use super::Context;
use crate::replica::now_ms;
use crate::txn::TxnState;

/// Handles a ListTransactions request.
pub(super) fn handle(
    ctx: &Context,
    request: ListTransactionsRequest,
    version: i16,
) -> ListTransactionsResponse {
    let mut states = Vec::new();
    let mut unknown = Vec::new();
    for name in &request.state_filters {
        match TxnState::parse(name.as_str()) {
            Some(s) => states.push(s),
            None => unknown.push(name.clone()),
        }
    }
    let producers: Vec<i64> = request.producer_id_filters.iter().map(|p| p.0).collect();
    let min_open_ms = if version >= 1 {
        request.duration_filter
    } else {
        -1
    };
    let now = now_ms();
    let listed = ctx
        .txn
        .list()
        .into_iter()
        .filter(|d| states.is_empty() || states.contains(&d.state))
        .filter(|d| producers.is_empty() || producers.contains(&d.producer_id))
        .filter(|d| min_open_ms < 0 || (d.start_ms >= 0 && now - d.start_ms > min_open_ms))
        .map(|d| {
            TransactionState::default()
                .with_transactional_id(TransactionalId(StrBytes::from_string(d.transactional_id)))
                .with_producer_id(ProducerId(d.producer_id))
                .with_transaction_state(StrBytes::from_static_str(d.state.name()))
        })
        .collect();
    ListTransactionsResponse::default()
        .with_unknown_state_filters(unknown)
        .with_transaction_states(listed)
}
