//! Transaction metadata in the compacted internal topic `__transaction_state`, in Kafka's
//! own record formats (`TransactionLogKey` v0, `TransactionLogValue` v0; Kafka's
//! `TransactionLog`), so a Kafka tool reading the topic understands it.
//!
//! Owns: the key/value encodings, which partition holds a transactional id
//! (`abs(java_hash(transactional_id)) % transaction.state.log.num.partitions`, as Kafka),
//! creating the topic on first use (compacted, `transaction.state.log.*`), appending one
//! record per state change and replaying a partition when its coordinator is elected.
//!
//! Never does: decide a state transition (the coordinator does), or decode anything it
//! did not write: a record it cannot parse is skipped with a warning.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::cluster::Metadata;
use crate::config::TransactionSettings;
use crate::group::store::java_string_hash;
use crate::internal_topic::{InternalTopic, InternalTopicError, InternalTopicSpec};
use crate::replica::ReplicaManager;

/// The internal topic holding transaction metadata.
pub(crate) const TRANSACTION_STATE_TOPIC: &str = "__transaction_state";

/// A transaction's state (Kafka's `TransactionState`, with its log codes and the names
/// DescribeTransactions and ListTransactions report).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TxnState {
    /// No transaction open (after InitProducerId).
    Empty,
    /// Partitions were added; records may be written.
    Ongoing,
    /// EndTxn(commit) was logged: markers are being written.
    PrepareCommit,
    /// EndTxn(abort), a timeout or a fencing was logged: markers are being written.
    PrepareAbort,
    /// Every COMMIT marker is written.
    CompleteCommit,
    /// Every ABORT marker is written.
    CompleteAbort,
    /// Expired (a tombstone follows).
    Dead,
    /// Kafka's state while an epoch bump fences a producer; weir logs PrepareAbort with the
    /// bumped epoch instead, and only reads this code.
    PrepareEpochFence,
}

impl TxnState {
    /// The one-byte code in `TransactionLogValue`.
    pub fn code(self) -> i8 {
        match self {
            TxnState::Empty => 0,
            TxnState::Ongoing => 1,
            TxnState::PrepareCommit => 2,
            TxnState::PrepareAbort => 3,
            TxnState::CompleteCommit => 4,
            TxnState::CompleteAbort => 5,
            TxnState::Dead => 6,
            TxnState::PrepareEpochFence => 7,
        }
    }

    fn from_code(code: i8) -> Option<TxnState> {
        Some(match code {
            0 => TxnState::Empty,
            1 => TxnState::Ongoing,
            2 => TxnState::PrepareCommit,
            3 => TxnState::PrepareAbort,
            4 => TxnState::CompleteCommit,
            5 => TxnState::CompleteAbort,
            6 => TxnState::Dead,
            7 => TxnState::PrepareEpochFence,
            _ => return None,
        })
    }

    /// The name Kafka's admin APIs report ("Ongoing", "PrepareCommit", ...).
    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
            TxnState::Dead => "Dead",
            TxnState::PrepareEpochFence => "PrepareEpochFence",
        }
    }

    /// Parses a name as [`TxnState::name`] gives it.
    pub fn parse(name: &str) -> Option<TxnState> {
        (0..=7)
            .filter_map(TxnState::from_code)
            .find(|s| s.name() == name)
    }
}

/// One transactional id's metadata as logged (Kafka's `TransactionLogValue` v0 fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TxnRecord {
    /// The producer id the transactional id holds.
    pub producer_id: i64,
    /// Its current epoch.
    pub producer_epoch: i16,
    /// `transaction.timeout.ms` the producer asked for.
    pub timeout_ms: i32,
    /// The state.
    pub state: TxnState,
    /// The partitions of the ongoing (or completing) transaction.
    pub partitions: BTreeSet<(String, i32)>,
    /// When this state was entered (ms since the epoch, broker clock).
    pub last_update_ms: i64,
    /// When the transaction began (its first AddPartitionsToTxn), -1 when none is open.
    pub start_ms: i64,
}

/// Java's `Utils.abs(hash) % n`: the `__transaction_state` partition of an id.
pub(crate) fn partition_for(transactional_id: &str, partitions: i32) -> i32 {
    (java_string_hash(transactional_id) & 0x7fff_ffff) % partitions.max(1)
}

fn put_string(buf: &mut BytesMut, s: &str) {
    // Transactional ids are refused above i16::MAX bytes before anything is stored, and
    // topic names are at most 249 bytes: nothing is cut.
    let len = s.len().min(i16::MAX as usize);
    buf.put_i16(len as i16);
    buf.put_slice(&s.as_bytes()[..len]);
}

fn get_string(buf: &mut Bytes) -> Option<String> {
    if buf.remaining() < 2 {
        return None;
    }
    let len = usize::try_from(buf.get_i16()).ok()?;
    if buf.remaining() < len {
        return None;
    }
    String::from_utf8(buf.split_to(len).to_vec()).ok()
}

/// `TransactionLogKey` v0: version 0, then the transactional id.
pub(crate) fn encode_key(transactional_id: &str) -> Bytes {
    let mut buf = BytesMut::with_capacity(4 + transactional_id.len());
    buf.put_i16(0);
    put_string(&mut buf, transactional_id);
    buf.freeze()
}

/// `TransactionLogValue` v0.
pub(crate) fn encode_value(r: &TxnRecord) -> Bytes {
    let mut buf = BytesMut::with_capacity(64);
    buf.put_i16(0);
    buf.put_i64(r.producer_id);
    buf.put_i16(r.producer_epoch);
    buf.put_i32(r.timeout_ms);
    buf.put_i8(r.state.code());
    let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (t, p) in &r.partitions {
        topics.entry(t).or_default().push(*p);
    }
    buf.put_i32(topics.len() as i32);
    for (topic, partitions) in topics {
        put_string(&mut buf, topic);
        buf.put_i32(partitions.len() as i32);
        for p in partitions {
            buf.put_i32(p);
        }
    }
    buf.put_i64(r.last_update_ms);
    buf.put_i64(r.start_ms);
    buf.freeze()
}

fn decode_key(key: &Bytes) -> Option<String> {
    let mut k = key.clone();
    if k.remaining() < 2 || k.get_i16() != 0 {
        return None;
    }
    get_string(&mut k)
}

fn decode_value(value: &Bytes) -> Option<TxnRecord> {
    let mut v = value.clone();
    if v.remaining() < 2 + 8 + 2 + 4 + 1 + 4 {
        return None;
    }
    // v0 and v1 share these fields (v1 adds tagged fields after them).
    let version = v.get_i16();
    if !(0..=1).contains(&version) {
        return None;
    }
    let producer_id = v.get_i64();
    let producer_epoch = v.get_i16();
    let timeout_ms = v.get_i32();
    let state = TxnState::from_code(v.get_i8())?;
    let mut partitions = BTreeSet::new();
    let topics = v.get_i32();
    for _ in 0..topics.max(0) {
        let topic = get_string(&mut v)?;
        if v.remaining() < 4 {
            return None;
        }
        let n = v.get_i32();
        if v.remaining() < 4 * usize::try_from(n.max(0)).ok()? {
            return None;
        }
        for _ in 0..n.max(0) {
            partitions.insert((topic.clone(), v.get_i32()));
        }
    }
    if v.remaining() < 16 {
        return None;
    }
    Some(TxnRecord {
        producer_id,
        producer_epoch,
        timeout_ms,
        state,
        partitions,
        last_update_ms: v.get_i64(),
        start_ms: v.get_i64(),
    })
}

/// The transaction state topic: where each id's records go, and the writes.
#[derive(Debug)]
pub(crate) struct TxnStore {
    topic: InternalTopic,
}

impl TxnStore {
    /// A store over the broker's owners. Nothing is created until first use.
    pub(crate) fn new(
        metadata: Arc<Metadata>,
        replicas: Arc<ReplicaManager>,
        settings: TransactionSettings,
    ) -> TxnStore {
        let spec = InternalTopicSpec {
            partitions: settings.state_log_num_partitions,
            replication_factor: settings.state_log_replication_factor,
            configs: BTreeMap::from([
                (
                    "segment.bytes".to_string(),
                    settings.state_log_segment_bytes.to_string(),
                ),
                (
                    "min.insync.replicas".to_string(),
                    settings.state_log_min_isr.to_string(),
                ),
            ]),
        };
        TxnStore {
            topic: InternalTopic::new(TRANSACTION_STATE_TOPIC, spec, metadata, replicas),
        }
    }

    /// Creates `__transaction_state` if missing; returns its partition count.
    ///
    /// Errors: [`InternalTopicError::Create`] when metadata or logs cannot be written.
    pub(crate) fn ensure_topic(&self) -> Result<i32, InternalTopicError> {
        self.topic.ensure()
    }

    /// The partition count, if the topic exists.
    pub(crate) fn partitions(&self) -> Option<i32> {
        self.topic.partitions()
    }

    /// Appends `record` (`None`: a tombstone, the id expired) for `transactional_id` to
    /// its partition, as one batch. Returns the offset of the record.
    ///
    /// Errors: [`InternalTopicError`] when the topic cannot be created or the append
    /// fails; clients then see COORDINATOR_NOT_AVAILABLE (15).
    pub(crate) fn append(
        &self,
        transactional_id: &str,
        record: Option<&TxnRecord>,
    ) -> Result<(), InternalTopicError> {
        let partitions = self.topic.ensure()?;
        let pair = (encode_key(transactional_id), record.map(encode_value));
        self.topic
            .append(partition_for(transactional_id, partitions), &[pair])
    }

    /// The ids partition `index` holds: the last record per key wins, tombstones remove.
    ///
    /// Errors: the partition cannot be read (I/O), as a message.
    pub(crate) fn load_partition(&self, index: i32) -> Result<BTreeMap<String, TxnRecord>, String> {
        let records = self.topic.replay_one(index).map_err(|e| e.to_string())?;
        let mut out = BTreeMap::new();
        for r in records {
            let Some(id) = decode_key(&r.key) else {
                tracing::warn!(
                    partition = r.partition,
                    offset = r.offset,
                    "unparseable key in {TRANSACTION_STATE_TOPIC}; skipped"
                );
                continue;
            };
            match r.value.as_ref().map(decode_value) {
                None => {
                    out.remove(&id);
                }
                Some(Some(v)) => {
                    out.insert(id, v);
                }
                Some(None) => tracing::warn!(
                    partition = r.partition,
                    offset = r.offset,
                    "unparseable value in {TRANSACTION_STATE_TOPIC}; skipped"
                ),
            }
        }
        Ok(out)
    }

    /// Partition `index`, when hosted here.
    pub(crate) fn partition(&self, index: i32) -> Option<Arc<crate::replica::Partition>> {
        self.topic.partition(index)
    }

    /// The leader epoch of partition `index` when this broker leads it.
    pub(crate) fn leader_epoch_here(&self, index: i32) -> Option<i32> {
        self.topic.leader_epoch_here(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_in_kafkas_layout() {
        let r = TxnRecord {
            producer_id: 7,
            producer_epoch: 3,
            timeout_ms: 60_000,
            state: TxnState::Ongoing,
            partitions: BTreeSet::from([("a".into(), 0), ("a".into(), 2), ("b".into(), 1)]),
            last_update_ms: 1_700_000_000_000,
            start_ms: 1_699_999_999_000,
        };
        let v = encode_value(&r);
        // version, pid, epoch, timeout, state, then 2 topics.
        assert_eq!(&v[..2], &[0, 0]);
        assert_eq!(v[16], 1);
        assert_eq!(&v[17..21], &2i32.to_be_bytes());
        assert_eq!(decode_value(&v), Some(r));
        assert_eq!(decode_key(&encode_key("tx-1")), Some("tx-1".into()));
        assert_eq!(decode_value(&Bytes::from_static(&[0, 0, 1])), None);
        for code in 0..=7 {
            let s = TxnState::from_code(code).unwrap();
            assert_eq!(TxnState::parse(s.name()), Some(s));
        }
    }

    #[test]
    fn partition_matches_kafka() {
        assert_eq!(partition_for("polygenelubricants", 50), 0);
        assert_eq!(partition_for("a", 50), 97 % 50);
    }
}
