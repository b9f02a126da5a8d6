//! Reads and progress for the broker's own workers — sink connectors and async transforms,
//! which run on one broker of a cluster (the connect leader) while their input partitions
//! and their consumer group's coordinator may be on others.
//!
//! Owns: reading a partition from this broker's replica (to the high watermark) or, with
//! none here, from its leader with a consumer Fetch; fetching and committing a group's
//! offsets at its coordinator, here or on another broker (OffsetFetch / OffsetCommit
//! through [`PeerClients`]). A position below the log start (retention deleted it) moves
//! to the log start with a warning: Kafka's `auto.offset.reset=earliest`.
//!
//! Never does: decode records, decide what a worker does with them, retry (callers loop).

use bytes::Bytes;
use kafka_protocol::ResponseError;

use crate::cluster::Metadata;
use crate::group::store::coordinator_in;
use crate::group::{CommitRequest, GroupCoordinator, OffsetToCommit, OFFSETS_TOPIC};
use crate::log::LogError;
use crate::peer::PeerClients;
use crate::replica::{FetchIsolation, Partition, ReplicaManager};

/// The owners a worker reads and commits through (borrowed: build one per call site).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkerIo<'a> {
    /// The metadata image: leaders and coordinators.
    pub(crate) metadata: &'a Metadata,
    /// This broker's replicas.
    pub(crate) replicas: &'a ReplicaManager,
    /// This broker's group coordinator.
    pub(crate) groups: &'a GroupCoordinator,
    /// Connections to the other brokers.
    pub(crate) peers: &'a PeerClients,
}

impl WorkerIo<'_> {
    /// Up to `max_bytes` of record batches of `topic`-`p` from `position`: from this
    /// broker's replica (leader or follower) when it holds one, else from the
    /// partition's leader. `position` moves to the log start when retention deleted it.
    ///
    /// Errors: a message naming the partition: no leader, the leader cannot be reached
    /// or answers a Kafka error, or the local read fails.
    pub(crate) async fn read(
        &self,
        topic: &str,
        p: i32,
        position: &mut i64,
        max_bytes: usize,
    ) -> Result<Bytes, String> {
        match self.replicas.partition(topic, p) {
            Some(partition) => read_here(&partition, topic, p, position, max_bytes),
            None => self.read_from_leader(topic, p, position, max_bytes).await,
        }
    }

    /// The batches of `topic`-`p` from `position`, fetched from its leader.
    async fn read_from_leader(
        &self,
        topic: &str,
        p: i32,
        position: &mut i64,
        max_bytes: usize,
    ) -> Result<Bytes, String> {
        let leader = self
            .metadata
            .image()
            .leader_of(topic, p)
            .ok_or_else(|| format!("{topic}-{p} has no leader"))?;
        let max = i32::try_from(max_bytes).unwrap_or(i32::MAX);
        let fail = |(e, m): (ResponseError, String)| format!("{m}: Kafka error {e:?}");
        let mut fetched = self
            .peers
            .fetch_records(leader, topic, p, *position, max)
            .await
            .map_err(fail)?;
        if fetched.out_of_range && *position < fetched.log_start_offset {
            tracing::warn!(topic = %topic, partition = p, from = *position, to = fetched.log_start_offset, "position below the leader's log start (deleted by retention); skipping ahead");
            *position = fetched.log_start_offset;
            fetched = self
                .peers
                .fetch_records(leader, topic, p, *position, max)
                .await
                .map_err(fail)?;
        }
        if fetched.out_of_range {
            return Err(format!(
                "reading {topic}-{p} at {position} from broker {leader}: offset out of range (log start {})",
                fetched.log_start_offset
            ));
        }
        Ok(fetched.records)
    }

    /// The broker coordinating `group` when it is another one (`None`: this broker, or a
    /// single node).
    ///
    /// Errors: the group's `__consumer_offsets` partition has no leader.
    fn coordinator(&self, group: &str) -> Result<Option<i32>, String> {
        let image = self.metadata.image();
        match coordinator_in(&image, group) {
            None => Ok(None),
            Some(leader) if leader == image.node_id() => Ok(None),
            Some(leader) if leader >= 0 => Ok(Some(leader)),
            Some(_) => Err(format!(
                "group {group}'s {OFFSETS_TOPIC} partition has no leader (no coordinator)"
            )),
        }
    }

    /// The offset `group` committed for `topic`-`partition` (`None`: nothing committed),
    /// from its coordinator here or on another broker.
    ///
    /// Errors: the coordinator cannot be asked. Never read that as "nothing committed",
    /// which would process every record again.
    pub(crate) async fn committed_offset(
        &self,
        group: &str,
        topic: &str,
        partition: i32,
    ) -> Result<Option<i64>, String> {
        match self.coordinator(group)? {
            None => Ok(self
                .groups
                .fetch_offsets(group, Some(&[(topic.to_string(), vec![partition])]))
                .into_iter()
                .flat_map(|(_, parts)| parts)
                .find_map(|(_, c)| c.map(|c| c.offset))),
            Some(broker) => self
                .peers
                .fetch_committed(broker, group, topic, &[partition])
                .await
                .map(|offsets| offsets.into_iter().find_map(|(_, o)| o))
                .map_err(|(e, message)| {
                    format!("fetching the committed offsets of group {group}: Kafka error {e:?}: {message}")
                }),
        }
    }

    /// Commits `offsets` (topic, partition, next offset) for `group` (no generation: a
    /// worker's group has no members) at its coordinator. Returns each offset's Kafka
    /// error, in order (`None`: committed).
    ///
    /// Errors: the coordinator cannot be asked.
    pub(crate) async fn commit(
        &self,
        group: &str,
        offsets: &[(String, i32, i64)],
    ) -> Result<Vec<Option<ResponseError>>, String> {
        match self.coordinator(group)? {
            None => Ok(self.groups.commit(&CommitRequest {
                group_id: group.to_string(),
                generation_id: -1,
                member_id: String::new(),
                group_instance_id: None,
                offsets: offsets
                    .iter()
                    .map(|(topic, partition, offset)| OffsetToCommit {
                        topic: topic.clone(),
                        partition: *partition,
                        offset: *offset,
                        leader_epoch: -1,
                        metadata: None,
                    })
                    .collect(),
            })),
            Some(broker) => self
                .peers
                .commit_offsets(broker, group, offsets)
                .await
                .map_err(|(e, message)| {
                    format!("committing the offsets of group {group}: Kafka error {e:?}: {message}")
                }),
        }
    }
}

/// The batches of this broker's replica of `topic`-`p` from `position` (moved to the log
/// start when retention deleted it).
fn read_here(
    partition: &Partition,
    topic: &str,
    p: i32,
    position: &mut i64,
    max_bytes: usize,
) -> Result<Bytes, String> {
    let read = match partition.read(*position, max_bytes, FetchIsolation::HighWatermark) {
        Err(LogError::OffsetOutOfRange {
            log_start_offset, ..
        }) if *position < log_start_offset => {
            tracing::warn!(topic = %topic, partition = p, from = *position, to = log_start_offset, "position below the log start (deleted by retention); skipping ahead");
            *position = log_start_offset;
            partition.read(*position, max_bytes, FetchIsolation::HighWatermark)
        }
        other => other,
    };
    read.map(|r| r.bytes)
        .map_err(|e| format!("reading {topic}-{p} at {position}: {e}"))
}
