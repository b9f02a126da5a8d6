//! WriteTxnMarkers (key 27), v1 (flexible). Protocol guide "WriteTxnMarkers"; KIP-98.
//! v0 is not offered: the kafka-protocol crate has no codec for it (Kafka 4.0 removed it,
//! KIP-896), and every coordinator since Kafka 2.4 sends v1. Sent by a transaction coordinator to the leaders of a transaction's
//! partitions to end it: each marker names a producer id and epoch, COMMIT or ABORT
//! (`transaction_result` true is COMMIT), the coordinator epoch and the partitions.
//!
//! Per marker and partition, on its leader: `ReplicaManager::append_txn_marker` writes the
//! control batch (ending the producer's transaction there; an ABORT also indexes the
//! aborted range for read_committed consumers); once every marker of the request is
//! appended, each is waited for until the high watermark passes it (Kafka appends markers
//! with acks=all), all under one deadline of `TXN_MARKER_TIMEOUT_MS` (5 s) from the
//! start of the waits.
//!
//! Errors returned per partition: UNKNOWN_TOPIC_OR_PARTITION (3) when the metadata has
//! no such partition; NOT_LEADER_OR_FOLLOWER (6) when another broker leads it (or
//! leadership moved during the wait); NOT_ENOUGH_REPLICAS (19) when the ISR is below
//! `min.insync.replicas` (nothing written); NOT_ENOUGH_REPLICAS_AFTER_APPEND (20);
//! REQUEST_TIMED_OUT (7); INVALID_PRODUCER_EPOCH (47) for a producer epoch older than the
//! partition knows; TRANSACTION_COORDINATOR_FENCED (52) for a coordinator epoch older
//! than the last marker's for that producer; KAFKA_STORAGE_ERROR (56).

use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kafka_protocol::messages::{WriteTxnMarkersRequest, WriteTxnMarkersResponse};
use tokio::time::Instant;

use crate::replica::{AppendedMarker, TXN_MARKER_TIMEOUT_MS};

use super::Context;

/// One partition after the append step: its index, and what to wait on or the error
/// code already known.
type PartitionStep = (i32, Result<AppendedMarker, i16>);

/// Handles a WriteTxnMarkers request.
pub(super) async fn handle(
    ctx: &Context,
    request: WriteTxnMarkersRequest,
    _version: i16,
) -> WriteTxnMarkersResponse {
    // Step 1: append every marker, keeping what each partition answered or must wait on.
    let mut appended: Vec<Vec<Vec<PartitionStep>>> = Vec::new();
    for marker in &request.markers {
        let mut topics = Vec::with_capacity(marker.topics.len());
        for topic in &marker.topics {
            let name = topic.name.0.as_str();
            let mut partitions = Vec::with_capacity(topic.partition_indexes.len());
            for &index in &topic.partition_indexes {
                let result = super::leader_partition(ctx, name, index)
                    .and_then(|_| {
                        ctx.replicas.append_txn_marker(
                            name,
                            index,
                            marker.producer_id.0,
                            marker.producer_epoch,
                            marker.transaction_result,
                            marker.coordinator_epoch,
                        )
                    })
                    .map_err(|e| e.code());
                partitions.push((index, result));
            }
            topics.push(partitions);
        }
        appended.push(topics);
    }
    // Step 2: wait for each to be replicated, under one deadline.
    let deadline = Instant::now() + std::time::Duration::from_millis(TXN_MARKER_TIMEOUT_MS);
    let mut markers = Vec::with_capacity(request.markers.len());
    for (marker, topics) in request.markers.iter().zip(appended) {
        let mut topic_results = Vec::with_capacity(topics.len());
        for (topic, partitions) in marker.topics.iter().zip(topics) {
            let name = topic.name.0.as_str();
            let mut results = Vec::with_capacity(partitions.len());
            for (index, result) in partitions {
                let error_code = match result {
                    Err(code) => code,
                    Ok(appended) => {
                        let left_ms = deadline
                            .saturating_duration_since(Instant::now())
                            .as_millis() as u64;
                        match ctx
                            .replicas
                            .wait_txn_marker(name, &appended, left_ms.max(1))
                            .await
                        {
                            Ok(()) => {
                                // On `__consumer_offsets` the marker completes the
                                // producer's transactional offset commits there.
                                if name == crate::group::OFFSETS_TOPIC {
                                    ctx.groups.complete_txn(
                                        index,
                                        marker.producer_id.0,
                                        marker.transaction_result,
                                    );
                                }
                                0
                            }
                            Err(e) => e.code(),
                        }
                    }
                };
                results.push(
                    WritableTxnMarkerPartitionResult::default()
                        .with_partition_index(index)
                        .with_error_code(error_code),
                );
            }
            topic_results.push(
                WritableTxnMarkerTopicResult::default()
                    .with_name(topic.name.clone())
                    .with_partitions(results),
            );
        }
        markers.push(
            WritableTxnMarkerResult::default()
                .with_producer_id(marker.producer_id)
                .with_topics(topic_results),
        );
    }
    WriteTxnMarkersResponse::default().with_markers(markers)
}
