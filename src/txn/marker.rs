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
use crate::replica::{now_ms, ReplicaManager};

/// Longest a marker waits for the in-sync replicas of its partition (Kafka appends
/// markers with acks=-1).
pub(crate) const MARKER_REPLICATION_TIMEOUT_MS: u64 = 5000;

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
        let wait = Duration::from_millis(MARKER_REPLICATION_TIMEOUT_MS);
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
    /// replicas do not take it in [`MARKER_REPLICATION_TIMEOUT_MS`].
    pub(crate) async fn write_here(
        &self,
        topic: &str,
        index: i32,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
    ) -> Result<(), ResponseError> {
        let partition = match self.replicas.partition(topic, index) {
            Some(p) if p.is_leader() => p,
            Some(_) => return Err(ResponseError::NotLeaderOrFollower),
            None if self.metadata.image().partition(topic, index).is_some() => {
                return Err(ResponseError::NotLeaderOrFollower)
            }
            None => return Err(ResponseError::UnknownTopicOrPartition),
        };
        let info = partition
            .append_txn_marker(
                producer_id,
                producer_epoch,
                commit,
                coordinator_epoch,
                now_ms(),
            )
            .map_err(|e| e.kafka_error())?;
        if let Some((error, _)) = partition
            .wait_for_high_watermark(info.last_offset, MARKER_REPLICATION_TIMEOUT_MS)
            .await
            .refusal()
        {
            return Err(error);
        }
        if topic == OFFSETS_TOPIC {
            self.groups.complete_txn(index, producer_id, commit);
        }
        Ok(())
    }
}

// TEMPORARY until the partition layer lands (branch h-txlog): removed at its merge.
trait PendingMarkerAppend {
    fn append_txn_marker(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
        now_ms: i64,
    ) -> Result<crate::log::AppendInfo, crate::log::LogError>;
}

impl PendingMarkerAppend for crate::replica::Partition {
    fn append_txn_marker(
        &self,
        _producer_id: i64,
        _producer_epoch: i16,
        _commit: bool,
        _coordinator_epoch: i32,
        _now_ms: i64,
    ) -> Result<crate::log::AppendInfo, crate::log::LogError> {
        Err(crate::log::LogError::NotLeader)
    }
}
