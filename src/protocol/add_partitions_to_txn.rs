//! AddPartitionsToTxn (key 24), v0–4. Protocol guide "AddPartitionsToTxn"; KIP-98; KIP-890
//! part 1 (v4: several transactions per request, and `verify_only`, which a partition
//! leader sends to ask whether a partition is in a transaction before it accepts a
//! transactional write); KIP-890 part 2 (v4 without `verify_only`: a partition leader
//! adds the partition for a producer that sends Produce v12 and no AddPartitionsToTxn).
//! v4 is for brokers; clients use v0–v3.
//!
//! Errors returned per partition: UNKNOWN_TOPIC_OR_PARTITION (3) for a partition the
//! metadata does not have (the others then get OPERATION_NOT_ATTEMPTED, 55, as Kafka), or
//! the coordinator's error for the whole transaction (`txn::TransactionCoordinator::
//! add_partitions`: NOT_COORDINATOR 16, CONCURRENT_TRANSACTIONS 51, PRODUCER_FENCED 90 —
//! INVALID_PRODUCER_EPOCH 47 before v2 —, INVALID_PRODUCER_ID_MAPPING 49); with
//! `verify_only`, INVALID_TXN_STATE (48) for a partition not in the transaction.

use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::{AddPartitionsToTxnRequest, AddPartitionsToTxnResponse};
use kafka_protocol::ResponseError;

use super::Context;

/// One transaction's request, whichever version carried it.
struct OneTxn {
    transactional_id: String,
    producer_id: i64,
    producer_epoch: i16,
    verify_only: bool,
    topics: Vec<AddPartitionsToTxnTopic>,
}

/// The result per topic of one transaction.
async fn add(ctx: &Context, txn: OneTxn, version: i16) -> Vec<AddPartitionsToTxnTopicResult> {
    let image = ctx.metadata.image();
    let partitions: Vec<(String, i32)> = txn
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (t.name.0.to_string(), *p)))
        .collect();
    let unknown: Vec<bool> = partitions
        .iter()
        .map(|(t, p)| image.partition(t, *p).is_none())
        .collect();
    let errors: Vec<Option<ResponseError>> = if unknown.iter().any(|u| *u) {
        unknown
            .iter()
            .map(|u| {
                Some(if *u {
                    ResponseError::UnknownTopicOrPartition
                } else {
                    ResponseError::OperationNotAttempted
                })
            })
            .collect()
    } else if txn.verify_only {
        match ctx.txn.verify_partitions(
            &txn.transactional_id,
            txn.producer_id,
            txn.producer_epoch,
            &partitions,
        ) {
            Ok(per) => per,
            Err(e) => vec![Some(e); partitions.len()],
        }
    } else {
        match ctx
            .txn
            .add_partitions(
                &txn.transactional_id,
                txn.producer_id,
                txn.producer_epoch,
                &partitions,
                // v4+ comes from partition leaders (KIP-890 part 2's add for a producer).
                version >= 4,
            )
            .await
        {
            Ok(()) => vec![None; partitions.len()],
            Err(e) => vec![Some(super::fenced_before(e, version, 2)); partitions.len()],
        }
    };
    let mut errors = errors.into_iter();
    txn.topics
        .into_iter()
        .map(|t| {
            let results = t
                .partitions
                .iter()
                .map(|p| {
                    AddPartitionsToTxnPartitionResult::default()
                        .with_partition_index(*p)
                        .with_partition_error_code(errors.next().flatten().map_or(0, |e| e.code()))
                })
                .collect();
            AddPartitionsToTxnTopicResult::default()
                .with_name(t.name)
                .with_results_by_partition(results)
        })
        .collect()
}

/// Handles an AddPartitionsToTxn request.
pub(super) async fn handle(
    ctx: &Context,
    request: AddPartitionsToTxnRequest,
    version: i16,
) -> AddPartitionsToTxnResponse {
    if version >= 4 {
        let mut results = Vec::with_capacity(request.transactions.len());
        for t in request.transactions {
            let id = t.transactional_id.clone();
            let topics = add(
                ctx,
                OneTxn {
                    transactional_id: t.transactional_id.0.to_string(),
                    producer_id: t.producer_id.0,
                    producer_epoch: t.producer_epoch,
                    verify_only: t.verify_only,
                    topics: t.topics,
                },
                version,
            )
            .await;
            results.push(
                AddPartitionsToTxnResult::default()
                    .with_transactional_id(id)
                    .with_topic_results(topics),
            );
        }
        return AddPartitionsToTxnResponse::default().with_results_by_transaction(results);
    }
    let topics = add(
        ctx,
        OneTxn {
            transactional_id: request.v3_and_below_transactional_id.0.to_string(),
            producer_id: request.v3_and_below_producer_id.0,
            producer_epoch: request.v3_and_below_producer_epoch,
            verify_only: false,
            topics: request.v3_and_below_topics,
        },
        version,
    )
    .await;
    AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(topics)
}
