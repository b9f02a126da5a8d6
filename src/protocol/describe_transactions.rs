//! DescribeTransactions (key 65), v0. KIP-664 (hanging transactions, kafka-transactions.sh
//! `describe`).
//!
//! Each id is described by its coordinator; this broker answers NOT_COORDINATOR (16) for
//! the ids it does not coordinate (the admin client asks FindCoordinator first).
//!
//! Errors returned per id: NOT_COORDINATOR (16), COORDINATOR_LOAD_IN_PROGRESS (14),
//! TRANSACTIONAL_ID_NOT_FOUND (105).

use std::collections::BTreeMap;

use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
use kafka_protocol::messages::{
    DescribeTransactionsRequest, DescribeTransactionsResponse, ProducerId, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::Context;

/// Handles a DescribeTransactions request.
pub(super) fn handle(
    ctx: &Context,
    request: DescribeTransactionsRequest,
    _version: i16,
) -> DescribeTransactionsResponse {
    let states = request
        .transactional_ids
        .into_iter()
        .map(|id| {
            let out = TransactionState::default()
                .with_transactional_id(id.clone())
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1)
                .with_transaction_start_time_ms(-1);
            match ctx.txn.describe(id.0.as_str()) {
                Err(e) => out.with_error_code(e.code()),
                Ok(d) => {
                    let mut topics: BTreeMap<String, Vec<i32>> = BTreeMap::new();
                    for (t, p) in d.partitions {
                        topics.entry(t).or_default().push(p);
                    }
                    out.with_transaction_state(StrBytes::from_static_str(d.state.name()))
                        .with_transaction_timeout_ms(d.timeout_ms)
                        .with_transaction_start_time_ms(d.start_ms)
                        .with_producer_id(ProducerId(d.producer_id))
                        .with_producer_epoch(d.producer_epoch)
                        .with_topics(
                            topics
                                .into_iter()
                                .map(|(t, ps)| {
                                    TopicData::default()
                                        .with_topic(TopicName(StrBytes::from_string(t)))
                                        .with_partitions(ps)
                                })
                                .collect(),
                        )
                }
            }
        })
        .collect();
    DescribeTransactionsResponse::default().with_transaction_states(states)
}
