//! Committed offsets and group records in the compacted internal topic
//! `__consumer_offsets`, in Kafka's own record formats (Kafka's `GroupMetadataManager`,
//! `OffsetCommitKey`/`OffsetCommitValue`/`GroupMetadataKey`/`GroupMetadataValue` schemas).
//!
//! Owns: the key/value encodings, which partition holds a group
//! (`abs(java_hash(group_id)) % offsets.topic.num.partitions`, as Kafka), creating the topic
//! on first use, appending records (one uncompressed batch per commit, so a commit is
//! all-or-nothing), and replaying the topic at start-up.
//!
//! Never does: decide whether a commit is allowed (the coordinator does), or decode
//! anything it did not write: a record it cannot parse is skipped with a warning.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::cluster::Metadata;
use crate::config::GroupSettings;
use crate::internal_topic::{InternalTopic, InternalTopicError, InternalTopicSpec};
use crate::replica::{now_ms, ReplicaManager};

/// The internal topic holding committed offsets and group metadata.
pub(crate) const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// One committed offset, as stored and as OffsetFetch returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    /// The committed offset: the next record the group will read.
    pub offset: i64,
    /// The leader epoch the client saw (-1 when unknown; OffsetCommit v6+, KIP-320).
    pub leader_epoch: i32,
    /// The client's metadata string, kept verbatim.
    pub metadata: String,
    /// When the commit was written (ms since the epoch).
    pub commit_timestamp_ms: i64,
}

/// What replaying `__consumer_offsets` found for one group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LoadedGroup {
    /// Committed offsets by (topic, partition).
    pub offsets: BTreeMap<(String, i32), CommittedOffset>,
    /// Protocol type of the last completed generation ("consumer"), if a group record exists.
    pub protocol_type: Option<String>,
    /// The last generation written.
    pub generation_id: i32,
    /// Offsets committed in transactions with no marker yet, by producer id
    /// (TxnOffsetCommit; they count once the COMMIT marker is written).
    pub pending: BTreeMap<i64, BTreeMap<(String, i32), CommittedOffset>>,
    /// The group epoch of a consumer-protocol group (KIP-848's `ConsumerGroupMetadata`
    /// record), if the group is one.
    pub consumer_group_epoch: Option<i32>,
}

/// A record to append: key bytes and value bytes (`None` is a tombstone).
#[derive(Debug, Clone)]
pub(crate) struct StoreRecord {
    key: Bytes,
    value: Option<Bytes>,
}

/// Java's `String.hashCode` over UTF-16 code units, so a group lands on the same
/// partition of `__consumer_offsets` as on a Kafka broker.
pub(crate) fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)))
}

/// The `__consumer_offsets` partition of `group_id` (Kafka's `partitionFor`: `Utils.abs`,
/// which maps `i32::MIN` to 0, then modulo).
pub(crate) fn partition_for(group_id: &str, partitions: i32) -> i32 {
    (java_string_hash(group_id) & 0x7fff_ffff) % partitions.max(1)
}

/// The broker coordinating `group_id` in `image`: the leader of its `__consumer_offsets`
/// partition ([`partition_for`]), -1 when that partition has none; `None` while the topic
/// does not exist (the broker asked creates it on first use). FindCoordinator and the
/// connect runtime's sinks both ask it.
pub(crate) fn coordinator_in(image: &crate::cluster::MetadataImage, group_id: &str) -> Option<i32> {
    let topic = image.topic(OFFSETS_TOPIC)?;
    Some(
        topic
            .partition(partition_for(group_id, topic.partitions))
            .map_or(-1, |p| p.leader),
    )
}

/// Writes a Kafka string (int16 length). The coordinator refuses group ids and metadata
/// longer than `i16::MAX` bytes before anything is stored (INVALID_GROUP_ID,
/// OFFSET_METADATA_TOO_LARGE) and topic names are at most 249 bytes, so keys are never cut;
/// only the informational fields of a group record (protocol type and name, leader id,
/// which come from clients) may be, at a character boundary.
fn put_string(buf: &mut BytesMut, s: &str) {
    let mut len = s.len().min(i16::MAX as usize);
    while !s.is_char_boundary(len) {
        len -= 1;
    }
    buf.put_i16(len as i16);
    buf.put_slice(&s.as_bytes()[..len]);
}

fn put_nullable_string(buf: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => put_string(buf, s),
        None => buf.put_i16(-1),
    }
}

fn get_string(buf: &mut Bytes) -> Option<String> {
    get_nullable_string(buf)?
}

fn get_nullable_string(buf: &mut Bytes) -> Option<Option<String>> {
    if buf.remaining() < 2 {
        return None;
    }
    let len = buf.get_i16();
    if len < 0 {
        return Some(None);
    }
    let len = len as usize;
    if buf.remaining() < len {
        return None;
    }
    let bytes = buf.split_to(len);
    Some(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

/// Key of an offset commit: version 1, group, topic, partition.
fn offset_key(group: &str, topic: &str, partition: i32) -> Bytes {
    let mut b = BytesMut::with_capacity(8 + group.len() + topic.len());
    b.put_i16(1);
    put_string(&mut b, group);
    put_string(&mut b, topic);
    b.put_i32(partition);
    b.freeze()
}

/// Value of an offset commit: version 3, offset, leader epoch, metadata, commit timestamp.
fn offset_value(c: &CommittedOffset) -> Bytes {
    let mut b = BytesMut::with_capacity(24 + c.metadata.len());
    b.put_i16(3);
    b.put_i64(c.offset);
    b.put_i32(c.leader_epoch);
    put_string(&mut b, &c.metadata);
    b.put_i64(c.commit_timestamp_ms);
    b.freeze()
}

/// Key of a group record: version 2, group.
fn group_key(group: &str) -> Bytes {
    let mut b = BytesMut::with_capacity(4 + group.len());
    b.put_i16(2);
    put_string(&mut b, group);
    b.freeze()
}

/// Value of a group record: version 3 with no members (see ARCHITECTURE.md: members are
/// not restored after a restart; they rejoin), protocol type, generation, protocol,
/// leader, state timestamp.
fn group_value(
    protocol_type: &str,
    generation_id: i32,
    protocol: Option<&str>,
    leader: Option<&str>,
) -> Bytes {
    let mut b = BytesMut::with_capacity(64);
    b.put_i16(3);
    put_string(&mut b, protocol_type);
    b.put_i32(generation_id);
    put_nullable_string(&mut b, protocol);
    put_nullable_string(&mut b, leader);
    b.put_i64(now_ms());
    b.put_i32(0);
    b.freeze()
}

/// Key of a consumer-protocol group's metadata record (KIP-848 `ConsumerGroupMetadataKey`):
/// version 3, group.
fn consumer_group_key(group: &str) -> Bytes {
    let mut b = BytesMut::with_capacity(4 + group.len());
    b.put_i16(3);
    put_string(&mut b, group);
    b.freeze()
}

impl StoreRecord {
    /// A consumer-protocol group's metadata (`ConsumerGroupMetadataValue` v0, a flexible
    /// version: the group epoch, then no tagged fields).
    pub(crate) fn consumer_group(group: &str, group_epoch: i32) -> StoreRecord {
        let mut v = BytesMut::with_capacity(7);
        v.put_i16(0);
        v.put_i32(group_epoch);
        v.put_u8(0);
        StoreRecord {
            key: consumer_group_key(group),
            value: Some(v.freeze()),
        }
    }

    /// Removes a consumer-protocol group's metadata (deleted, or converted to classic).
    pub(crate) fn consumer_group_tombstone(group: &str) -> StoreRecord {
        StoreRecord {
            key: consumer_group_key(group),
            value: None,
        }
    }

    /// An offset commit.
    pub(crate) fn offset(
        group: &str,
        topic: &str,
        partition: i32,
        c: &CommittedOffset,
    ) -> StoreRecord {
        StoreRecord {
            key: offset_key(group, topic, partition),
            value: Some(offset_value(c)),
        }
    }

    /// Removes an offset commit (tombstone).
    pub(crate) fn offset_tombstone(group: &str, topic: &str, partition: i32) -> StoreRecord {
        StoreRecord {
            key: offset_key(group, topic, partition),
            value: None,
        }
    }

    /// The group's metadata after a completed rebalance (or when it becomes empty).
    pub(crate) fn group(
        group: &str,
        protocol_type: &str,
        generation_id: i32,
        protocol: Option<&str>,
        leader: Option<&str>,
    ) -> StoreRecord {
        StoreRecord {
            key: group_key(group),
            value: Some(group_value(protocol_type, generation_id, protocol, leader)),
        }
    }

    /// Removes the group (DeleteGroups, or an empty group whose offsets all expired).
    pub(crate) fn group_tombstone(group: &str) -> StoreRecord {
        StoreRecord {
            key: group_key(group),
            value: None,
        }
    }
}

/// One decoded record of the offsets topic.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Decoded {
    Offset {
        group: String,
        topic: String,
        partition: i32,
        value: Option<CommittedOffset>,
    },
    Group {
        group: String,
        value: Option<(String, i32)>,
    },
    ConsumerGroup {
        group: String,
        epoch: Option<i32>,
    },
}

fn decode_record(key: &Bytes, value: Option<&Bytes>) -> Option<Decoded> {
    let mut k = key.clone();
    if k.remaining() < 2 {
        return None;
    }
    match k.get_i16() {
        0 | 1 => {
            let group = get_string(&mut k)?;
            let topic = get_string(&mut k)?;
            if k.remaining() < 4 {
                return None;
            }
            let partition = k.get_i32();
            let value = match value {
                None => None,
                Some(v) => {
                    let mut v = v.clone();
                    if v.remaining() < 10 {
                        return None;
                    }
                    let version = v.get_i16();
                    let offset = v.get_i64();
                    let leader_epoch = if version >= 3 {
                        if v.remaining() < 4 {
                            return None;
                        }
                        v.get_i32()
                    } else {
                        -1
                    };
                    let metadata = get_string(&mut v)?;
                    let commit_timestamp_ms = if v.remaining() >= 8 { v.get_i64() } else { -1 };
                    Some(CommittedOffset {
                        offset,
                        leader_epoch,
                        metadata,
                        commit_timestamp_ms,
                    })
                }
            };
            Some(Decoded::Offset {
                group,
                topic,
                partition,
                value,
            })
        }
        2 => {
            let group = get_string(&mut k)?;
            let value = match value {
                None => None,
                Some(v) => {
                    let mut v = v.clone();
                    if v.remaining() < 2 {
                        return None;
                    }
                    let _version = v.get_i16();
                    let protocol_type = get_string(&mut v)?;
                    if v.remaining() < 4 {
                        return None;
                    }
                    Some((protocol_type, v.get_i32()))
                }
            };
            Some(Decoded::Group { group, value })
        }
        3 => {
            let group = get_string(&mut k)?;
            let epoch = match value {
                None => None,
                Some(v) => {
                    let mut v = v.clone();
                    if v.remaining() < 6 {
                        return None;
                    }
                    let _version = v.get_i16();
                    Some(v.get_i32())
                }
            };
            Some(Decoded::ConsumerGroup { group, epoch })
        }
        _ => None,
    }
}

/// The offsets topic: where each group's records go, and the writes.
#[derive(Debug)]
pub(crate) struct OffsetStore {
    topic: InternalTopic,
}

impl OffsetStore {
    /// A store over the broker's owners. Nothing is created until first use.
    pub(crate) fn new(
        metadata: Arc<Metadata>,
        replicas: Arc<ReplicaManager>,
        settings: GroupSettings,
    ) -> OffsetStore {
        let spec = InternalTopicSpec {
            partitions: settings.offsets_topic_num_partitions,
            replication_factor: settings.offsets_topic_replication_factor,
            configs: BTreeMap::from([(
                "segment.bytes".to_string(),
                settings.offsets_topic_segment_bytes.to_string(),
            )]),
        };
        OffsetStore {
            topic: InternalTopic::new(OFFSETS_TOPIC, spec, metadata, replicas),
        }
    }

    /// Creates `__consumer_offsets` if missing (compacted, `offsets.topic.num.partitions`
    /// partitions, `offsets.topic.segment.bytes` segments), as Kafka does on the first
    /// FindCoordinator. Returns the partition count.
    ///
    /// Errors: [`InternalTopicError::Create`] when metadata or logs cannot be written.
    pub(crate) fn ensure_topic(&self) -> Result<i32, InternalTopicError> {
        self.topic.ensure()
    }

    /// Appends `records` for `group_id` as one batch (all or nothing) to the group's
    /// partition (`partition_for`).
    ///
    /// Errors: [`InternalTopicError`] when the topic cannot be created or the append
    /// fails; clients then see COORDINATOR_NOT_AVAILABLE (15), as Kafka answers when
    /// the offsets topic cannot be written.
    pub(crate) fn append(
        &self,
        group_id: &str,
        records: &[StoreRecord],
    ) -> Result<(), InternalTopicError> {
        self.append_as(group_id, records, None)
    }

    /// As [`OffsetStore::append`], as one transactional batch of producer
    /// `(producer_id, producer_epoch)` when given (TxnOffsetCommit).
    ///
    /// Errors: as [`OffsetStore::append`].
    pub(crate) fn append_as(
        &self,
        group_id: &str,
        records: &[StoreRecord],
        producer: Option<(i64, i16)>,
    ) -> Result<(), InternalTopicError> {
        if records.is_empty() {
            return Ok(());
        }
        let partitions = self.topic.ensure()?;
        let pairs: Vec<(Bytes, Option<Bytes>)> = records
            .iter()
            .map(|r| (r.key.clone(), r.value.clone()))
            .collect();
        self.topic
            .append_as(partition_for(group_id, partitions), &pairs, producer)
    }

    /// Replays every partition of `__consumer_offsets` (if it exists): the last record per
    /// key wins, tombstones remove. Records it cannot parse are skipped with a warning.
    ///
    /// Errors: a partition log that cannot be read (I/O), as a message.
    pub(crate) fn load(&self) -> Result<BTreeMap<String, LoadedGroup>, String> {
        let mut out = BTreeMap::new();
        for index in 0..self.topic.partitions().unwrap_or(0) {
            out.extend(self.load_partition(index)?);
        }
        Ok(out)
    }

    /// As [`OffsetStore::load`], for the groups of partition `index` alone (a
    /// coordinator's election, Kafka's `GroupMetadataManager.loadGroupsForPartition`).
    ///
    /// Errors: the partition cannot be read (I/O), as a message.
    pub(crate) fn load_partition(
        &self,
        index: i32,
    ) -> Result<BTreeMap<String, LoadedGroup>, String> {
        let replayed = self
            .topic
            .replay_one_transactional(index)
            .map_err(|e| e.to_string())?;
        let mut groups = groups_of(replayed.records);
        for record in replayed.pending {
            if let Some(Decoded::Offset {
                group,
                topic,
                partition,
                value: Some(v),
            }) = decode_record(&record.key, record.value.as_ref())
            {
                groups
                    .entry(group)
                    .or_default()
                    .pending
                    .entry(record.producer_id)
                    .or_default()
                    .insert((topic, partition), v);
            }
        }
        Ok(groups)
    }

    /// Partition `index` of `__consumer_offsets`, when hosted here.
    pub(crate) fn partition(&self, index: i32) -> Option<Arc<crate::replica::Partition>> {
        self.topic.partition(index)
    }

    /// The partitions of `__consumer_offsets` this broker leads now, with their leader
    /// epochs.
    pub(crate) fn led_partitions(&self) -> Vec<(i32, i32)> {
        let partitions = self.topic.partitions().unwrap_or(0);
        (0..partitions)
            .filter_map(|i| Some((i, self.topic.leader_epoch_here(i)?)))
            .collect()
    }

    /// The partition count of `__consumer_offsets`, `group_id`'s partition and its leader
    /// epoch when this broker's replica leads it (`None`: no topic yet).
    pub(crate) fn leadership_of(&self, group_id: &str) -> Option<(i32, i32, Option<i32>)> {
        let partitions = self.topic.partitions()?;
        let index = partition_for(group_id, partitions);
        Some((partitions, index, self.topic.leader_epoch_here(index)))
    }
}

/// The groups `records` (replayed in offset order) leave: the last record per key wins,
/// tombstones remove; unparseable records are skipped with a warning.
fn groups_of(records: Vec<crate::internal_topic::ReplayedRecord>) -> BTreeMap<String, LoadedGroup> {
    let mut groups: BTreeMap<String, LoadedGroup> = BTreeMap::new();
    for record in records {
        match decode_record(&record.key, record.value.as_ref()) {
            Some(d) => apply(&mut groups, d),
            None => tracing::warn!(
                partition = record.partition,
                offset = record.offset,
                "unparseable record in {OFFSETS_TOPIC}; skipped"
            ),
        }
    }
    groups.retain(|_, g| {
        g.protocol_type.is_some() || g.consumer_group_epoch.is_some() || !g.offsets.is_empty()
    });
    groups
}

fn apply(groups: &mut BTreeMap<String, LoadedGroup>, d: Decoded) {
    match d {
        Decoded::Offset {
            group,
            topic,
            partition,
            value,
        } => {
            let g = groups.entry(group).or_default();
            match value {
                Some(v) => {
                    g.offsets.insert((topic, partition), v);
                }
                None => {
                    g.offsets.remove(&(topic, partition));
                }
            }
        }
        Decoded::Group { group, value } => match value {
            Some((protocol_type, generation_id)) => {
                let g = groups.entry(group).or_default();
                g.protocol_type = Some(protocol_type);
                g.generation_id = generation_id;
            }
            None => {
                if let Some(g) = groups.get_mut(&group) {
                    // A group converted to the consumer protocol keeps its offsets.
                    g.protocol_type = None;
                    g.generation_id = 0;
                }
            }
        },
        Decoded::ConsumerGroup { group, epoch } => {
            if let Some(g) = groups.get_mut(&group) {
                g.consumer_group_epoch = epoch;
            } else if let Some(epoch) = epoch {
                groups.entry(group).or_default().consumer_group_epoch = Some(epoch);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_matches_kafka() {
        // Java: "my-group".hashCode() == 1016911470? Computed independently below.
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("a"), 97);
        assert_eq!(java_string_hash("ab"), 97 * 31 + 98);
        // "polygenelubricants".hashCode() == Integer.MIN_VALUE: Utils.abs maps it to 0.
        assert_eq!(java_string_hash("polygenelubricants"), i32::MIN);
        assert_eq!(partition_for("polygenelubricants", 50), 0);
        assert!((0..50).contains(&partition_for("any-group", 50)));
    }

    #[test]
    fn records_round_trip() {
        let c = CommittedOffset {
            offset: 42,
            leader_epoch: 3,
            metadata: "meta ✓".into(),
            commit_timestamp_ms: 1_700_000_000_000,
        };
        let r = StoreRecord::offset("g", "t", 7, &c);
        assert_eq!(
            decode_record(&r.key, r.value.as_ref()),
            Some(Decoded::Offset {
                group: "g".into(),
                topic: "t".into(),
                partition: 7,
                value: Some(c)
            })
        );
        let t = StoreRecord::offset_tombstone("g", "t", 7);
        assert!(matches!(
            decode_record(&t.key, t.value.as_ref()),
            Some(Decoded::Offset { value: None, .. })
        ));
        let g = StoreRecord::group("g", "consumer", 5, Some("range"), Some("m-1"));
        assert_eq!(
            decode_record(&g.key, g.value.as_ref()),
            Some(Decoded::Group {
                group: "g".into(),
                value: Some(("consumer".into(), 5))
            })
        );
        assert_eq!(decode_record(&Bytes::from_static(&[0, 9]), None), None);
        assert_eq!(
            decode_record(&Bytes::from_static(&[0, 1, 0, 5, b'a']), None),
            None
        );
    }
}
