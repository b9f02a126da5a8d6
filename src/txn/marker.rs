//! Transaction markers: the COMMIT or ABORT control batch a transaction coordinator has
//! written to every partition of a completing transaction (KIP-98; protocol guide
//! "WriteTxnMarkers", "Control Batches").
//!
//! Owns: sending markers to partition leaders (this broker's partitions directly, the
//! others' as one WriteTxnMarkers request per leader), and what a marker written here
//! means beyond the log: on a `__consumer_offsets` partition it makes the offsets the
//! producer committed in the transaction visible, or drops them
//! (`GroupCoordinator::complete_txn`). The WriteTxnMarkers handler calls
//! [`MarkerWriter::write_here`] too, so both paths do the same.
//!
//! Never does: decide an outcome, or retry (the coordinator retries what is left).

use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kafka_protocol::messages::{ProducerId, TopicName, WriteTxnMarkersRequest};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::cluster::Metadata;
use crate::config::BrokerConfig;
use crate::group::{GroupCoordinator, OFFSETS_TOPIC};
use crate::peer::PeerClients;
use crate::replica::ReplicaManager;

/// Writes markers, here or at the partitions' leaders.
#[derive(Debug)]
pub(crate) struct MarkerWriter {
    metadata: Arc<Metadata>,
    replicas: Arc<ReplicaManager>,
    groups: Arc<GroupCoordinator>,
    peers: PeerClients,
}

impl MarkerWriter {
    /// A writer over the broker's owners.
    pub(crate) fn new(
        metadata: Arc<Metadata>,
        replicas: Arc<ReplicaManager>,
        groups: Arc<GroupCoordinator>,
        config: Arc<BrokerConfig>,
    ) -> MarkerWriter {
        MarkerWriter {
            peers: PeerClients::new(metadata.clone(), config),
            metadata,
            replicas,
            groups,
        }
    }

    /// Writes the marker of producer `producer_id` at `producer_epoch` (COMMIT when
    /// `commit`) to each of `partitions` at its leader, and returns the partitions that
    /// still need it (a leader that refused or could not be reached). A partition whose
    /// topic no longer exists needs none.
    pub(crate) async fn write(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
        partitions: Vec<(String, i32)>,
    ) -> Vec<(String, i32)> {
        let image = self.metadata.image();
        let me = self.metadata.node_id();
        let mut by_leader: std::collections::BTreeMap<i32, Vec<(String, i32)>> =
            std::collections::BTreeMap::new();
        let mut left = Vec::new();
        for (topic, index) in partitions {
            if image.topic(&topic).is_none() {
                continue; // deleted: nothing to mark
            }
            match image.leader_of(&topic, index) {
                Some(leader) if leader >= 0 => {
                    by_leader.entry(leader).or_default().push((topic, index))
                }
                _ => left.push((topic, index)),
            }
        }
        for (leader, partitions) in by_leader {
            if leader == me {
                for (topic, index) in partitions {
                    let written = self
                        .write_here(
                            &topic,
                            index,
                            producer_id,
                            producer_epoch,
                            commit,
                            coordinator_epoch,
                        )
                        .await;
                    if let Err(e) = written {
                        tracing::debug!(topic, partition = index, error = ?e, "marker not written here");
                        left.push((topic, index));
                    }
                }
                continue;
            }
            left.extend(
                self.write_remote(
                    leader,
                    producer_id,
                    producer_epoch,
                    commit,
                    coordinator_epoch,
                    partitions,
                )
                .await,
            );
        }
        left
    }

    /// AddPartitionsToTxn v4 for one partition, at `coordinator`: with `verify_only`
    /// (KIP-890 part 1: a partition leader asks before it accepts a transactional write)
    /// or without (part 2: the leader adds the partition for the producer).
    ///
    /// Errors: the coordinator's answer for the transaction or the partition
    /// (INVALID_TXN_STATE 48 when it is not in the transaction), NETWORK_EXCEPTION (13)
    /// when it cannot be asked.
    pub(crate) async fn verify_or_add_remote(
        &self,
        coordinator: i32,
        transactional_id: &str,
        (producer_id, producer_epoch): (i64, i16),
        topic: &str,
        partition: i32,
        verify_only: bool,
    ) -> Result<(), ResponseError> {
        use kafka_protocol::messages::add_partitions_to_txn_request::{
            AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
        };
        use kafka_protocol::messages::{AddPartitionsToTxnRequest, TransactionalId};
        let request = AddPartitionsToTxnRequest::default().with_transactions(vec![
            AddPartitionsToTxnTransaction::default()
                .with_transactional_id(TransactionalId(StrBytes::from_string(
                    transactional_id.to_string(),
                )))
                .with_producer_id(ProducerId(producer_id))
                .with_producer_epoch(producer_epoch)
                .with_verify_only(verify_only)
                .with_topics(vec![AddPartitionsToTxnTopic::default()
                    .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                    .with_partitions(vec![partition])]),
        ]);
        let wait = Duration::from_millis(crate::replica::TXN_MARKER_TIMEOUT_MS);
        let response = self
            .peers
            .call(coordinator, &request, 4, wait)
            .await
            .map_err(|(e, _)| e)?;
        if response.error_code != 0 {
            return Err(ResponseError::try_from_code(response.error_code)
                .unwrap_or(ResponseError::UnknownServerError));
        }
        let code = response
            .results_by_transaction
            .iter()
            .flat_map(|t| t.topic_results.iter())
            .flat_map(|t| t.results_by_partition.iter())
            .map(|p| p.partition_error_code)
            .find(|c| *c != 0);
        match code {
            None => Ok(()),
            Some(c) => {
                Err(ResponseError::try_from_code(c).unwrap_or(ResponseError::UnknownServerError))
            }
        }
    }

    /// One WriteTxnMarkers request to `leader`; returns the partitions it did not mark.
    async fn write_remote(
        &self,
        leader: i32,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
        partitions: Vec<(String, i32)>,
    ) -> Vec<(String, i32)> {
        let mut topics: std::collections::BTreeMap<String, Vec<i32>> = Default::default();
        for (t, p) in &partitions {
            topics.entry(t.clone()).or_default().push(*p);
        }
        let request =
            WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
                .with_producer_id(ProducerId(producer_id))
                .with_producer_epoch(producer_epoch)
                .with_transaction_result(commit)
                .with_coordinator_epoch(coordinator_epoch)
                .with_topics(
                    topics
                        .into_iter()
                        .map(|(t, ps)| {
                            WritableTxnMarkerTopic::default()
                                .with_name(TopicName(StrBytes::from_string(t)))
                                .with_partition_indexes(ps)
                        })
                        .collect(),
                )]);
        let wait = Duration::from_millis(crate::replica::TXN_MARKER_TIMEOUT_MS);
        let response = match self.peers.call(leader, &request, 1, wait).await {
            Ok(r) => r,
            Err((e, message)) => {
                tracing::debug!(leader, error = ?e, message, "WriteTxnMarkers not answered");
                return partitions;
            }
        };
        let mut done = std::collections::HashSet::new();
        for marker in response.markers {
            for topic in marker.topics {
                for p in topic.partitions {
                    let ok = p.error_code == 0
                        || (p.error_code == ResponseError::UnknownTopicOrPartition.code()
                            && self.metadata.image().topic(topic.name.as_str()).is_none());
                    if ok {
                        done.insert((topic.name.to_string(), p.partition_index));
                    }
                }
            }
        }
        partitions
            .into_iter()
            .filter(|p| !done.contains(p))
            .collect()
    }

    /// Writes one marker to a partition this broker leads and waits until every in-sync
    /// replica has it; on `__consumer_offsets` then completes the producer's transactional
    /// offset commits there.
    ///
    /// Errors: UNKNOWN_TOPIC_OR_PARTITION (3), NOT_LEADER_OR_FOLLOWER (6), the log's
    /// refusal (INVALID_PRODUCER_EPOCH 47, TRANSACTION_COORDINATOR_FENCED 52,
    /// KAFKA_STORAGE_ERROR 56), NOT_ENOUGH_REPLICAS (19) / REQUEST_TIMED_OUT (7) when the
    /// replicas do not take it in `replica::TXN_MARKER_TIMEOUT_MS`.
    pub(crate) async fn write_here(
        &self,
        topic: &str,
        index: i32,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
    ) -> Result<(), ResponseError> {
        self.replicas
            .write_txn_marker(
                topic,
                index,
                producer_id,
                producer_epoch,
                commit,
                coordinator_epoch,
            )
            .await?;
        if topic == OFFSETS_TOPIC {
            self.groups.complete_txn(index, producer_id, commit);
        }
        Ok(())
    }
}
