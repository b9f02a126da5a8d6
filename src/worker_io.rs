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
//! With `read_committed` (sinks, exactly-once transforms) a read stops at the last stable
//! offset and leaves out the batches of aborted transactions ([`drop_aborted`], Kafka's
//! consumer rule), so a worker sees only committed records, as a read_committed
//! consumer does.
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
    /// partition's leader; to the high watermark, or with `read_committed` to the last
    /// stable offset without aborted transactions' batches. `position` moves to the log
    /// start when retention deleted it, and past what was left out when nothing else
    /// was read.
    ///
    /// Errors: a message naming the partition: no leader, the leader cannot be reached
    /// or answers a Kafka error, or the local read fails.
    pub(crate) async fn read(
        &self,
        topic: &str,
        p: i32,
        position: &mut i64,
        max_bytes: usize,
        read_committed: bool,
    ) -> Result<Bytes, String> {
        let (bytes, aborted) = match self.replicas.partition(topic, p) {
            Some(partition) => {
                read_here(&partition, topic, p, position, max_bytes, read_committed)?
            }
            None => {
                self.read_from_leader(topic, p, position, max_bytes, read_committed)
                    .await?
            }
        };
        drop_aborted(bytes, &aborted, position)
            .map_err(|e| format!("reading {topic}-{p} at {position}: {e}"))
    }

    /// The batches of `topic`-`p` from `position`, fetched from its leader.
    async fn read_from_leader(
        &self,
        topic: &str,
        p: i32,
        position: &mut i64,
        max_bytes: usize,
        read_committed: bool,
    ) -> Result<(Bytes, Vec<(i64, i64)>), String> {
        let leader = self
            .metadata
            .image()
            .leader_of(topic, p)
            .ok_or_else(|| format!("{topic}-{p} has no leader"))?;
        let max = i32::try_from(max_bytes).unwrap_or(i32::MAX);
        let fail = |(e, m): (ResponseError, String)| format!("{m}: Kafka error {e:?}");
        let mut fetched = self
            .peers
            .fetch_records(leader, topic, p, *position, max, read_committed)
            .await
            .map_err(fail)?;
        if fetched.out_of_range && *position < fetched.log_start_offset {
            tracing::warn!(topic = %topic, partition = p, from = *position, to = fetched.log_start_offset, "position below the leader's log start (deleted by retention); skipping ahead");
            *position = fetched.log_start_offset;
            fetched = self
                .peers
                .fetch_records(leader, topic, p, *position, max, read_committed)
                .await
                .map_err(fail)?;
        }
        if fetched.out_of_range {
            return Err(format!(
                "reading {topic}-{p} at {position} from broker {leader}: offset out of range (log start {})",
                fetched.log_start_offset
            ));
        }
        Ok((fetched.records, fetched.aborted))
    }

    /// The broker coordinating `group` when it is another one (`None`: this broker, or a
    /// single node).
    ///
    /// Errors: the group's `__consumer_offsets` partition has no leader.
    fn coordinator(&self, group: &str) -> Result<Option<i32>, String> {
        let remote = remote_group_coordinator(self.metadata, group)?;
        if remote.is_none() {
            // This broker coordinates the group: its partition of __consumer_offsets must
            // be loaded for this leadership first, as FindCoordinator makes sure for a
            // client. A runner moved here by a failover otherwise read what this broker
            // held before it led the partition (nothing, or older progress) and copied
            // records again.
            self.groups.ensure_loaded(group).map_err(|e| {
                format!("group {group}: its coordinator here is not ready: Kafka error {e:?}")
            })?;
        }
        Ok(remote)
    }

    /// The offset `group` committed for `topic`-`partition` (`None`: nothing committed),
    /// from its coordinator here or on another broker.
    ///
    /// Errors: the coordinator cannot be asked, or the offset was committed in a
    /// transaction that is still completing (read once it is stable, as KIP-447's
    /// `require_stable`). Never read that as "nothing committed", which would process
    /// every record again.
    pub(crate) async fn committed_offset(
        &self,
        group: &str,
        topic: &str,
        partition: i32,
    ) -> Result<Option<i64>, String> {
        match self.coordinator(group)? {
            None if self.groups.has_pending_txn_offset(group, topic, partition) => Err(format!(
                "group {group} has an offset of {topic}-{partition} in a transaction still completing (UNSTABLE_OFFSET_COMMIT)"
            )),
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
                offsets: OffsetToCommit::from_progress(offsets),
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

/// The broker coordinating `group` in `metadata`'s image when it is another one
/// (`None`: this broker, or a single node).
///
/// Errors: the group's `__consumer_offsets` partition has no leader.
pub(crate) fn remote_group_coordinator(
    metadata: &Metadata,
    group: &str,
) -> Result<Option<i32>, String> {
    let image = metadata.image();
    match coordinator_in(&image, group) {
        None => Ok(None),
        Some(leader) if leader == image.node_id() => Ok(None),
        Some(leader) if leader >= 0 => Ok(Some(leader)),
        Some(_) => Err(format!(
            "group {group}'s {OFFSETS_TOPIC} partition has no leader (no coordinator)"
        )),
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
    read_committed: bool,
) -> Result<(Bytes, Vec<(i64, i64)>), String> {
    let isolation = if read_committed {
        FetchIsolation::ReadCommitted
    } else {
        FetchIsolation::HighWatermark
    };
    let read = match partition.read(*position, max_bytes, isolation) {
        Err(LogError::OffsetOutOfRange {
            log_start_offset, ..
        }) if *position < log_start_offset => {
            tracing::warn!(topic = %topic, partition = p, from = *position, to = log_start_offset, "position below the log start (deleted by retention); skipping ahead");
            *position = log_start_offset;
            partition.read(*position, max_bytes, isolation)
        }
        other => other,
    };
    read.map(|r| {
        let aborted = r
            .aborted_transactions
            .unwrap_or_default()
            .iter()
            .map(|a| (a.producer_id, a.first_offset))
            .collect();
        (r.bytes, aborted)
    })
    .map_err(|e| format!("reading {topic}-{p} at {position}: {e}"))
}

/// `bytes` (whole stored batches read from `position`) without the data batches of the
/// `aborted` transactions (producer id, first offset): Kafka's consumer rule
/// (`CompletedFetch`'s aborted producer ids) — a producer's transactional batches are
/// dropped from its aborted transaction's first offset until its control batch (the
/// ABORT marker, kept: readers skip control batches and move past it). When everything
/// read is dropped, `position` moves past it (a long aborted transaction is skipped one
/// read at a time, never read forever).
///
/// Errors: a batch that does not decode (the bytes are the log's own: corruption).
pub(crate) fn drop_aborted(
    bytes: Bytes,
    aborted: &[(i64, i64)],
    position: &mut i64,
) -> Result<Bytes, String> {
    if aborted.is_empty() || bytes.is_empty() {
        return Ok(bytes);
    }
    let mut pending: Vec<(i64, i64)> = aborted.to_vec();
    // Smallest first offset last, to pop.
    pending.sort_by_key(|(_, first)| std::cmp::Reverse(*first));
    let mut active: std::collections::HashSet<i64> = Default::default();
    let mut kept = bytes::BytesMut::new();
    let mut read_to = *position;
    for b in crate::log::split_fetched(bytes).map_err(|e| e.to_string())? {
        while let Some(&(producer_id, first)) = pending.last() {
            if first > b.last_offset() {
                break;
            }
            active.insert(producer_id);
            pending.pop();
        }
        read_to = read_to.max(b.last_offset() + 1);
        if b.is_control() {
            active.remove(&b.producer_id());
        } else if b.is_transactional() && active.contains(&b.producer_id()) {
            continue;
        }
        kept.extend_from_slice(&b.to_bytes());
    }
    if kept.is_empty() {
        *position = read_to;
    }
    Ok(kept.freeze())
}

#[cfg(test)]
mod tests {
    use super::drop_aborted;
    use crate::log::plain;

    /// `n` records at offsets `base..base + n` as one stored batch of `producer`
    /// (transactional when given), or a control batch when `control`.
    fn batch(base: i64, n: i64, producer: Option<i64>, control: bool) -> bytes::Bytes {
        let records: Vec<plain::Record> = (0..n)
            .map(|i| plain::record(i, 0, None, Some(bytes::Bytes::from_static(b"v")), vec![]))
            .collect();
        let fields = producer.map(|producer_id| plain::ProducerFields {
            producer_id,
            producer_epoch: 0,
            base_sequence: -1,
            transactional: true,
        });
        let mut raw = plain::encode_as(&records, fields).unwrap().to_vec();
        raw[..8].copy_from_slice(&base.to_be_bytes());
        if control {
            // attributes: transactional (0x10) | control (0x20); the CRC covers them.
            raw[22] |= 0x30;
            let crc = crc32c::crc32c(&raw[21..]);
            raw[17..21].copy_from_slice(&crc.to_be_bytes());
        }
        bytes::Bytes::from(raw)
    }

    fn bases(bytes: bytes::Bytes) -> Vec<i64> {
        crate::log::split_fetched(bytes)
            .unwrap()
            .iter()
            .map(|b| b.base_offset())
            .collect()
    }

    #[test]
    fn aborted_batches_are_left_out_until_their_marker_and_committed_ones_kept() {
        // 0-1 plain, 2-3 producer 7 (aborted), 4-5 producer 8 (committed), 6 abort
        // marker of 7, 7-8 producer 7 again (a later transaction, not aborted).
        let mut all = Vec::new();
        for b in [
            batch(0, 2, None, false),
            batch(2, 2, Some(7), false),
            batch(4, 2, Some(8), false),
            batch(6, 1, Some(7), true),
            batch(7, 2, Some(7), false),
        ] {
            all.extend_from_slice(&b);
        }
        let all = bytes::Bytes::from(all);
        let mut position = 0;
        let kept = drop_aborted(all.clone(), &[(7, 2)], &mut position).unwrap();
        assert_eq!(bases(kept), [0, 4, 6, 7]);
        assert_eq!(
            position, 0,
            "something was kept: the reader moves the position"
        );
        // Nothing aborted listed: the bytes as read.
        let mut position = 0;
        assert_eq!(drop_aborted(all.clone(), &[], &mut position).unwrap(), all);
        // Everything read is aborted: the position moves past it.
        let mut position = 2;
        let only = batch(2, 2, Some(7), false);
        let kept = drop_aborted(only, &[(7, 2)], &mut position).unwrap();
        assert!(kept.is_empty());
        assert_eq!(position, 4);
    }
}
