//! The one store over the broker's own compacted topics: `__consumer_offsets` (groups)
//! and `__connect_offsets`, `__connect_status`, `__connect_state`, `__connect_configs`
//! (the connect runtime).
//!
//! An [`InternalTopic`] creates its topic on first use through the same path as a
//! client's CreateTopics (`cluster::Metadata::ensure_topic`: validated, all or nothing),
//! appends key/value records as one uncompressed batch per call (so a call is
//! all-or-nothing: a commit, a status change), and replays the topic at start-up.
//!
//! Owns: creation, the batch encoding of internal records, the replay loop. Never does:
//! interpret keys or values (each caller owns its format), or decide which partition a
//! record goes to (the caller names it: groups by Kafka's `partitionFor`, connect topics
//! have one partition).
//!
//! `ingest` does not use it: it writes users' topics, with partitioners and
//! `max.message.bytes` splitting, which no internal record needs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::cluster::{Metadata, NewTopic};
use crate::log::records::{StoredBatches, MAX_DECOMPRESSED_BATCH_BYTES};
use crate::log::{plain, split_batches};
use crate::peer::PeerClients;
use crate::replica::{now_ms, FetchIsolation, ReplicaManager};

/// Most bytes read per log read while replaying.
const REPLAY_READ_BYTES: usize = 1 << 20;

/// How an internal topic is created when it does not exist yet.
#[derive(Debug, Clone)]
pub(crate) struct InternalTopicSpec {
    /// Partition count (fixed at creation, as Kafka's).
    pub partitions: i32,
    /// Replicas per partition (`offsets.topic.replication.factor` for the offsets topic,
    /// Kafka Connect's default 3 for its topics), capped at the live brokers when the
    /// topic is created: a cluster smaller than it works as before, with a warning.
    pub replication_factor: i16,
    /// Topic configs beyond `cleanup.policy=compact`, which every internal topic has.
    pub configs: BTreeMap<String, String>,
}

/// Failures of an internal topic; each names the topic (and partition).
#[derive(Debug, thiserror::Error)]
pub(crate) enum InternalTopicError {
    /// The topic could not be created (metadata or partition logs).
    #[error("cannot create {topic}: {message}")]
    Create {
        /// The internal topic.
        topic: &'static str,
        /// Why (the CreateTopics path's message).
        message: String,
    },
    /// The append failed: the partition is not open, or the log refused (I/O).
    #[error("cannot append to {topic}-{partition}: {message}")]
    Append {
        /// The internal topic.
        topic: &'static str,
        /// Its partition.
        partition: i32,
        /// The log's error.
        message: String,
    },
    /// A replay read failed (I/O).
    #[error("cannot read {topic}-{partition} at offset {offset}: {message}")]
    Read {
        /// The internal topic.
        topic: &'static str,
        /// Its partition.
        partition: i32,
        /// Where the read started.
        offset: i64,
        /// The log's error.
        message: String,
    },
}

/// One record found by [`InternalTopic::replay`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ReplayedRecord {
    /// Partition it was read from.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its key (keyless records are not replayed: no internal record is keyless).
    pub key: Bytes,
    /// Its value; `None` is a tombstone.
    pub value: Option<Bytes>,
    /// The producer of a transactional record, -1 for others.
    pub producer_id: i64,
}

/// What [`InternalTopic::replay_one_transactional`] found in one partition.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ReplayedPartition {
    /// Non-transactional records in offset order, with each committed transaction's
    /// records placed at its COMMIT marker (where they took effect). Records of aborted
    /// transactions are left out.
    pub records: Vec<ReplayedRecord>,
    /// Records of transactions with no marker yet (their `producer_id` says whose).
    pub pending: Vec<ReplayedRecord>,
}

/// One compacted topic the broker owns. Cheap to clone (shares its owners).
#[derive(Debug, Clone)]
pub(crate) struct InternalTopic {
    name: &'static str,
    spec: InternalTopicSpec,
    metadata: Arc<Metadata>,
    replicas: Arc<ReplicaManager>,
    /// The partition count once the topic is known to exist.
    partitions: Arc<Mutex<Option<i32>>>,
    /// Set: an append to a partition another broker leads is forwarded to it.
    peers: Option<Arc<PeerClients>>,
}

impl InternalTopic {
    /// The topic `name` over the broker's owners, created per `spec` on first use.
    pub(crate) fn new(
        name: &'static str,
        spec: InternalTopicSpec,
        metadata: Arc<Metadata>,
        replicas: Arc<ReplicaManager>,
    ) -> InternalTopic {
        let existing = metadata.image().topic(name).map(|t| t.partitions);
        InternalTopic {
            name,
            spec,
            metadata,
            replicas,
            partitions: Arc::new(Mutex::new(existing)),
            peers: None,
        }
    }

    /// This topic, with appends to a partition another broker leads forwarded to that
    /// leader through `peers` (a Produce with acks=all), instead of refused. The connect
    /// runtime's topics are written so from whichever broker runs a connector; the groups'
    /// offsets topic never is (a coordinator leads its partition).
    pub(crate) fn forwarding(mut self, peers: Arc<PeerClients>) -> InternalTopic {
        self.peers = Some(peers);
        self
    }

    /// The partition count if the topic exists, without creating it (on a cluster
    /// another broker may have created it since this one started: the image says).
    pub(crate) fn partitions(&self) -> Option<i32> {
        let mut cached = self
            .partitions
            .lock()
            .expect("internal topic lock poisoned");
        if cached.is_none() {
            *cached = self.metadata.image().topic(self.name).map(|t| t.partitions);
        }
        *cached
    }

    /// Creates the topic (compacted, per the spec) unless it exists; returns its
    /// partition count.
    ///
    /// Errors: [`InternalTopicError::Create`] when metadata or logs cannot be written.
    pub(crate) fn ensure(&self) -> Result<i32, InternalTopicError> {
        let mut partitions = self
            .partitions
            .lock()
            .expect("internal topic lock poisoned");
        if let Some(n) = *partitions {
            return Ok(n);
        }
        let mut configs = self.spec.configs.clone();
        configs.insert("cleanup.policy".to_string(), "compact".to_string());
        // Kafka refuses to create the offsets topic until enough brokers exist; weir caps
        // (a single node must keep working with the default of 3).
        let live = crate::cluster::live_brokers(&self.metadata.image()).len();
        let wanted = self.spec.replication_factor.max(1);
        let replication_factor = wanted.min(i16::try_from(live).unwrap_or(i16::MAX).max(1));
        if self.metadata.topic(self.name).is_none() && replication_factor < wanted {
            tracing::warn!(
                topic = self.name,
                replication_factor,
                configured = wanted,
                live_brokers = live,
                "fewer live brokers than the internal topic's replication factor: creating it with fewer replicas"
            );
        }
        // A min.insync.replicas above the replicas the topic gets would refuse every
        // acks=all write: capped like the replication factor.
        if let Some(min_isr) = configs.get_mut("min.insync.replicas") {
            let capped = min_isr
                .parse::<i64>()
                .unwrap_or(1)
                .clamp(1, i64::from(replication_factor));
            *min_isr = capped.to_string();
        }
        let meta = self
            .metadata
            .ensure_topic(NewTopic {
                name: self.name.to_string(),
                partitions: self.spec.partitions,
                replication_factor,
                configs,
                assignment: Vec::new(),
            })
            .map_err(|e| InternalTopicError::Create {
                topic: self.name,
                message: e.message,
            })?;
        tracing::info!(
            partitions = meta.partitions,
            "internal topic {} ready",
            self.name
        );
        *partitions = Some(meta.partitions);
        Ok(meta.partitions)
    }

    /// Appends `records` (key, value; `None` = tombstone) to `partition` as one batch:
    /// all are appended or none. Creates the topic first if needed.
    ///
    /// Errors: [`InternalTopicError::Create`], or [`InternalTopicError::Append`] when the
    /// partition is not open or the log refuses.
    pub(crate) fn append(
        &self,
        partition: i32,
        records: &[(Bytes, Option<Bytes>)],
    ) -> Result<(), InternalTopicError> {
        self.append_as(partition, records, None)
    }

    /// As [`InternalTopic::append`], as one transactional batch of producer
    /// `(producer_id, producer_epoch)` when `transactional` is set (a transactional offset
    /// commit: its records count once the producer's COMMIT marker follows).
    ///
    /// Errors: as [`InternalTopic::append`]; the log's refusal of a fenced epoch
    /// (INVALID_PRODUCER_EPOCH) as an append failure.
    pub(crate) fn append_as(
        &self,
        partition: i32,
        records: &[(Bytes, Option<Bytes>)],
        transactional: Option<(i64, i16)>,
    ) -> Result<(), InternalTopicError> {
        self.append_inner(partition, records, transactional, None)
    }

    /// As [`InternalTopic::append_as`] for a record the producer of `transactional_id`
    /// writes itself in its transaction (an exactly-once source task's offsets): a
    /// forwarded append names the id, for the leader's KIP-890 check (the partition
    /// must have been added to the transaction first).
    ///
    /// Errors: as [`InternalTopic::append_as`].
    pub(crate) fn append_transactional(
        &self,
        partition: i32,
        records: &[(Bytes, Option<Bytes>)],
        producer: (i64, i16),
        transactional_id: &str,
    ) -> Result<(), InternalTopicError> {
        self.append_inner(partition, records, Some(producer), Some(transactional_id))
    }

    fn append_inner(
        &self,
        partition: i32,
        records: &[(Bytes, Option<Bytes>)],
        transactional: Option<(i64, i16)>,
        transactional_id: Option<&str>,
    ) -> Result<(), InternalTopicError> {
        if records.is_empty() {
            return Ok(());
        }
        self.ensure()?;
        let fail = |message: String| InternalTopicError::Append {
            topic: self.name,
            partition,
            message,
        };
        let hosted = self.replicas.partition(self.name, partition);
        let now = now_ms();
        let encoded: Vec<plain::Record> = records
            .iter()
            .enumerate()
            .map(|(i, (key, value))| {
                plain::record(
                    i as i64,
                    now,
                    Some(key.clone()),
                    value.clone(),
                    Default::default(),
                )
            })
            .collect();
        let batch = plain::encode_with(&encoded, transactional).map_err(fail)?;
        if let Some(peers) = &self.peers {
            if !hosted.as_ref().is_some_and(|p| p.is_leader()) {
                let Some(leader) = self.metadata.image().leader_of(self.name, partition) else {
                    return Err(fail("the partition has no leader".into()));
                };
                if leader != self.metadata.node_id() {
                    peers
                        .produce_blocking(leader, self.name, partition, batch, transactional_id)
                        .map_err(|(_, message)| fail(message))?;
                    return Ok(());
                }
            }
        }
        let target = hosted.ok_or_else(|| fail("partition is not open".into()))?;
        let batches = split_batches(batch).map_err(|e| fail(e.to_string()))?;
        let appended = self
            .replicas
            .append(&target, batches)
            .map_err(|e| fail(e.to_string()))?;
        if self.peers.is_some() {
            // On a cluster, as acks=all: a record only this leader holds is lost with it
            // (Kafka Connect writes its topics with acks=all too).
            wait_replicated(&target, appended.last_offset).map_err(fail)?;
        }
        Ok(())
    }

    /// Every keyed record of every partition, partition by partition, each in offset
    /// order; nothing when the topic does not exist. Control records are skipped.
    ///
    /// Errors: [`InternalTopicError::Read`] when a read fails (I/O). An undecodable
    /// batch ends that partition's replay with a warning (what precedes it is returned).
    pub(crate) fn replay(&self) -> Result<Vec<ReplayedRecord>, InternalTopicError> {
        let mut out = Vec::new();
        let Some(partitions) = self.partitions() else {
            return Ok(out);
        };
        for index in 0..partitions {
            let mut open = BTreeMap::new();
            self.replay_partition(index, &mut out, &mut open)?;
        }
        Ok(out)
    }

    /// The records of partition `index` as [`InternalTopic::replay`] reads them (a
    /// coordinator that just became the partition's leader loads it so).
    ///
    /// Errors: as [`InternalTopic::replay`].
    pub(crate) fn replay_one(&self, index: i32) -> Result<Vec<ReplayedRecord>, InternalTopicError> {
        Ok(self.replay_one_transactional(index)?.records)
    }

    /// As [`InternalTopic::replay_one`], with the records of still-open transactions
    /// apart (the group coordinator holds them until their marker).
    ///
    /// Errors: as [`InternalTopic::replay`].
    pub(crate) fn replay_one_transactional(
        &self,
        index: i32,
    ) -> Result<ReplayedPartition, InternalTopicError> {
        let mut out = Vec::new();
        let mut open: BTreeMap<i64, Vec<ReplayedRecord>> = BTreeMap::new();
        self.replay_partition(index, &mut out, &mut open)?;
        Ok(ReplayedPartition {
            records: out,
            pending: open.into_values().flatten().collect(),
        })
    }

    /// Partition `index`, when hosted here.
    pub(crate) fn partition(&self, index: i32) -> Option<Arc<crate::replica::Partition>> {
        self.replicas.partition(self.name, index)
    }

    /// The leader epoch of partition `index` when this broker leads it.
    pub(crate) fn leader_epoch_here(&self, index: i32) -> Option<i32> {
        match self.replicas.partition(self.name, index)?.replica_role() {
            crate::replica::ReplicaRole::Leader { leader_epoch, .. } => Some(leader_epoch),
            crate::replica::ReplicaRole::Follower { .. } => None,
        }
    }

    /// Replays partition `index` into `out`; records of transactions still open at its
    /// end are left in `open` by producer id.
    fn replay_partition(
        &self,
        index: i32,
        out: &mut Vec<ReplayedRecord>,
        open: &mut BTreeMap<i64, Vec<ReplayedRecord>>,
    ) -> Result<(), InternalTopicError> {
        let Some(partition) = self.replicas.partition(self.name, index) else {
            return Ok(());
        };
        let offsets = partition.offsets();
        let (mut offset, end) = (offsets.log_start_offset, offsets.log_end_offset);
        while offset < end {
            let read = partition
                .read(offset, REPLAY_READ_BYTES, FetchIsolation::LogEnd)
                .map_err(|e| InternalTopicError::Read {
                    topic: self.name,
                    partition: index,
                    offset,
                    message: e.to_string(),
                })?;
            if read.bytes.is_empty() {
                break;
            }
            let batches = StoredBatches::new(read.bytes, MAX_DECOMPRESSED_BATCH_BYTES)
                .collect::<Result<Vec<_>, _>>();
            let batches = match batches {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(
                        partition = index, offset, error = %e,
                        "unreadable batch in {}; replay of this partition stops here", self.name
                    );
                    break;
                }
            };
            let mut next = offset;
            for batch in batches {
                // The batch's span, not its last record: compaction may have removed
                // the tail, and a control batch has no records decoded.
                next = next.max(batch.base_offset + i64::from(batch.last_offset_delta) + 1);
                if batch.is_control {
                    // A marker: the producer's open records take effect (COMMIT, key
                    // type 1) or are dropped (ABORT, 0).
                    let commit = batch.control_type == Some(1);
                    let records = open.remove(&batch.producer_id).unwrap_or_default();
                    if commit {
                        out.extend(records);
                    }
                    continue;
                }
                for r in batch.records {
                    let record_offset = batch.base_offset + i64::from(r.offset_delta);
                    if record_offset < offset {
                        continue;
                    }
                    if let Some(key) = r.key {
                        let record = ReplayedRecord {
                            partition: index,
                            offset: record_offset,
                            key,
                            value: r.value,
                            producer_id: if batch.is_transactional {
                                batch.producer_id
                            } else {
                                -1
                            },
                        };
                        if batch.is_transactional {
                            open.entry(batch.producer_id).or_default().push(record);
                        } else {
                            out.push(record);
                        }
                    }
                }
            }
            if next <= offset {
                break;
            }
            offset = next;
        }
        Ok(())
    }
}

/// The metadata and replica manager of a broker's state in `dir`, as a (re)started
/// broker opens them: for tests of the stores built on [`InternalTopic`].
#[cfg(test)]
pub(crate) fn test_owners(dir: &std::path::Path) -> (Arc<Metadata>, Arc<ReplicaManager>) {
    let mut config = crate::config::BrokerConfig::defaults();
    config.set_single_dir(dir);
    let metadata = Arc::new(Metadata::open(dir, 1).unwrap());
    let replicas = ReplicaManager::open(
        Arc::new(config),
        &metadata,
        Arc::new(crate::purgatory::Purgatory::new(10)),
    )
    .unwrap();
    (metadata, replicas)
}

/// Waits (blocking this thread, at most [`crate::peer::FORWARD_TIMEOUT_MS`]) until the
/// high watermark of `partition`, led here, passes `last_offset`: every in-sync replica
/// has the batch. Outside a multi-threaded Tokio runtime it cannot wait and returns at
/// once (only unit tests append so, on one node).
///
/// Errors: the Kafka error acks=all would answer (REQUEST_TIMED_OUT,
/// NOT_ENOUGH_REPLICAS_AFTER_APPEND, NOT_LEADER_OR_FOLLOWER), as a message: the batch is
/// in this leader's log and may or may not survive it.
fn wait_replicated(partition: &crate::replica::Partition, last_offset: i64) -> Result<(), String> {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return Ok(());
    };
    if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
        return Ok(());
    }
    let timeout_ms = crate::peer::FORWARD_TIMEOUT_MS as u64;
    let waited = tokio::task::block_in_place(|| {
        handle.block_on(partition.wait_for_high_watermark(last_offset, timeout_ms))
    });
    match waited.refusal() {
        None => Ok(()),
        Some((error, why)) => Err(format!("appended but not replicated: {error:?}: {why}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The internal topic `name` (`partitions` partitions) over a broker's state in
    /// `dir`, as a (re)started broker builds it.
    fn topic_in(dir: &std::path::Path, name: &'static str, partitions: i32) -> InternalTopic {
        let (metadata, replicas) = test_owners(dir);
        let spec = InternalTopicSpec {
            partitions,
            replication_factor: 1,
            configs: BTreeMap::from([("segment.bytes".to_string(), "1048576".to_string())]),
        };
        InternalTopic::new(name, spec, metadata, replicas)
    }

    fn pair(k: &'static [u8], v: Option<&'static [u8]>) -> (Bytes, Option<Bytes>) {
        (Bytes::from_static(k), v.map(Bytes::from_static))
    }

    #[test]
    fn a_failed_creation_leaves_nothing_behind_and_a_retry_works() {
        let dir = tempfile::tempdir().unwrap();
        let topic = topic_in(dir.path(), "__connect_offsets", 1);
        // A file where the partition directory goes: its log cannot be created.
        let blocker = dir.path().join("__connect_offsets-0");
        std::fs::write(&blocker, "x").unwrap();
        let record = [pair(b"k", Some(b"v"))];
        let e = topic.append(0, &record).unwrap_err();
        assert!(
            matches!(
                e,
                InternalTopicError::Create {
                    topic: "__connect_offsets",
                    ..
                }
            ),
            "{e}"
        );
        assert!(topic.metadata.topic("__connect_offsets").is_none());
        assert!(topic.replicas.partition("__connect_offsets", 0).is_none());
        assert_eq!(topic.partitions(), None);
        std::fs::remove_file(&blocker).unwrap();
        topic.append(0, &record).unwrap();
        let meta = topic.metadata.topic("__connect_offsets").unwrap();
        assert_eq!(meta.configs["cleanup.policy"], "compact");
        assert_eq!(meta.configs["segment.bytes"], "1048576");
        let replayed = topic.replay().unwrap();
        assert_eq!(
            replayed,
            vec![ReplayedRecord {
                partition: 0,
                offset: 0,
                key: record[0].0.clone(),
                value: record[0].1.clone(),
                producer_id: -1,
            }]
        );
        // And it is there after a restart.
        drop(topic);
        assert_eq!(
            topic_in(dir.path(), "__connect_offsets", 1)
                .replay()
                .unwrap(),
            replayed
        );
    }

    #[test]
    fn replay_reads_every_partition_in_offset_order_with_tombstones() {
        let dir = tempfile::tempdir().unwrap();
        let topic = topic_in(dir.path(), "__consumer_offsets", 3);
        assert_eq!(topic.replay().unwrap(), Vec::new(), "no topic, nothing");
        topic
            .append(2, &[pair(b"a", Some(b"1")), pair(b"b", Some(b"2"))])
            .unwrap();
        topic.append(0, &[pair(b"c", Some(b"3"))]).unwrap();
        topic.append(2, &[pair(b"a", None)]).unwrap();
        assert_eq!(
            topic
                .append(3, &[pair(b"x", None)])
                .unwrap_err()
                .to_string(),
            "cannot append to __consumer_offsets-3: partition is not open"
        );
        drop(topic);
        let seen: Vec<(i32, i64, Bytes, Option<Bytes>)> =
            topic_in(dir.path(), "__consumer_offsets", 3)
                .replay()
                .unwrap()
                .into_iter()
                .map(|r| (r.partition, r.offset, r.key, r.value))
                .collect();
        let b = |s: &'static [u8]| Bytes::from_static(s);
        assert_eq!(
            seen,
            vec![
                (0, 0, b(b"c"), Some(b(b"3"))),
                (2, 0, b(b"a"), Some(b(b"1"))),
                (2, 1, b(b"b"), Some(b(b"2"))),
                (2, 2, b(b"a"), None),
            ]
        );
    }
}
