//! Transaction metadata in the compacted internal topic `__transaction_state`, in Kafka's
//! own record formats (`TransactionLogKey` v0, `TransactionLogValue` v0, or v1 with its
//! tagged fields when a transaction uses KIP-890 part 2; Kafka's `TransactionLog`), so a
//! Kafka tool reading the topic understands it.
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

/// One transactional id's metadata as logged (Kafka's `TransactionLogValue` fields).
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
    /// The transaction version of the request that last changed the state (KIP-890:
    /// 2 after an EndTxn v5, which bumps the epoch per transaction; 0 before). v1 tag 2.
    pub client_transaction_version: i16,
    /// The producer id this one replaced when its epoch ran out at an EndTxn v5, -1 when
    /// none (so a retry of that EndTxn is known). v1 tag 0.
    pub previous_producer_id: i64,
    /// While an EndTxn v5 completes on an exhausted epoch: the producer id the
    /// transactional id moves to at completion, -1 otherwise. v1 tag 1.
    pub next_producer_id: i64,
}

impl TxnRecord {
    /// A record with the tagged fields at their defaults (a v0 record).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn v0(
        producer_id: i64,
        producer_epoch: i16,
        timeout_ms: i32,
        state: TxnState,
        partitions: BTreeSet<(String, i32)>,
        last_update_ms: i64,
        start_ms: i64,
    ) -> TxnRecord {
        TxnRecord {
            producer_id,
            producer_epoch,
            timeout_ms,
            state,
            partitions,
            last_update_ms,
            start_ms,
            client_transaction_version: 0,
            previous_producer_id: -1,
            next_producer_id: -1,
        }
    }

    /// Whether the v1 tagged fields hold anything (then the record is written as v1).
    fn has_tagged_fields(&self) -> bool {
        self.client_transaction_version != 0
            || self.previous_producer_id != -1
            || self.next_producer_id != -1
    }
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

/// `TransactionLogValue`: v0 when the tagged fields are at their defaults, else v1
/// (flexible: compact strings and arrays, then tags 0 `PreviousProducerId`, 1
/// `NextProducerId`, 2 `ClientTransactionVersion`).
pub(crate) fn encode_value(r: &TxnRecord) -> Bytes {
    let flexible = r.has_tagged_fields();
    let mut buf = BytesMut::with_capacity(64);
    buf.put_i16(i16::from(flexible));
    buf.put_i64(r.producer_id);
    buf.put_i16(r.producer_epoch);
    buf.put_i32(r.timeout_ms);
    buf.put_i8(r.state.code());
    let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (t, p) in &r.partitions {
        topics.entry(t).or_default().push(*p);
    }
    if flexible {
        put_uvarint(&mut buf, topics.len() as u64 + 1);
    } else {
        buf.put_i32(topics.len() as i32);
    }
    for (topic, partitions) in topics {
        if flexible {
            put_uvarint(&mut buf, topic.len() as u64 + 1);
            buf.put_slice(topic.as_bytes());
            put_uvarint(&mut buf, partitions.len() as u64 + 1);
        } else {
            put_string(&mut buf, topic);
            buf.put_i32(partitions.len() as i32);
        }
        for p in partitions {
            buf.put_i32(p);
        }
        if flexible {
            put_uvarint(&mut buf, 0); // the topic entry's tagged fields: none
        }
    }
    buf.put_i64(r.last_update_ms);
    buf.put_i64(r.start_ms);
    if flexible {
        let mut tags: Vec<(u64, Vec<u8>)> = Vec::new();
        if r.previous_producer_id != -1 {
            tags.push((0, r.previous_producer_id.to_be_bytes().to_vec()));
        }
        if r.next_producer_id != -1 {
            tags.push((1, r.next_producer_id.to_be_bytes().to_vec()));
        }
        if r.client_transaction_version != 0 {
            tags.push((2, r.client_transaction_version.to_be_bytes().to_vec()));
        }
        put_uvarint(&mut buf, tags.len() as u64);
        for (tag, value) in tags {
            put_uvarint(&mut buf, tag);
            put_uvarint(&mut buf, value.len() as u64);
            buf.put_slice(&value);
        }
    }
    buf.freeze()
}

fn put_uvarint(buf: &mut BytesMut, mut n: u64) {
    while n >= 0x80 {
        buf.put_u8((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    buf.put_u8(n as u8);
}

fn get_uvarint(buf: &mut Bytes) -> Option<u64> {
    let mut n = 0u64;
    for shift in (0..64).step_by(7) {
        if !buf.has_remaining() {
            return None;
        }
        let b = buf.get_u8();
        n |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(n);
        }
    }
    None
}

/// A compact length (`n + 1` as an unsigned varint; 0 is null, read as empty).
fn get_compact_len(buf: &mut Bytes) -> Option<usize> {
    usize::try_from(get_uvarint(buf)?.saturating_sub(1)).ok()
}

/// Reads a tagged-field section: its (tag, value bytes) pairs.
fn get_tagged_fields(buf: &mut Bytes) -> Option<Vec<(u64, Bytes)>> {
    let count = get_uvarint(buf)?;
    let mut out = Vec::new();
    for _ in 0..count {
        let tag = get_uvarint(buf)?;
        let len = usize::try_from(get_uvarint(buf)?).ok()?;
        if buf.remaining() < len {
            return None;
        }
        out.push((tag, buf.split_to(len)));
    }
    Some(out)
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
    if v.remaining() < 2 + 8 + 2 + 4 + 1 + 1 {
        return None;
    }
    let version = v.get_i16();
    if !(0..=1).contains(&version) {
        return None;
    }
    let flexible = version >= 1;
    let producer_id = v.get_i64();
    let producer_epoch = v.get_i16();
    let timeout_ms = v.get_i32();
    let state = TxnState::from_code(v.get_i8())?;
    let mut partitions = BTreeSet::new();
    let topics = if flexible {
        get_compact_len(&mut v)?
    } else {
        if v.remaining() < 4 {
            return None;
        }
        usize::try_from(v.get_i32().max(0)).ok()?
    };
    for _ in 0..topics {
        let (topic, n) = if flexible {
            let len = get_compact_len(&mut v)?;
            if v.remaining() < len {
                return None;
            }
            let topic = String::from_utf8(v.split_to(len).to_vec()).ok()?;
            (topic, get_compact_len(&mut v)?)
        } else {
            let topic = get_string(&mut v)?;
            if v.remaining() < 4 {
                return None;
            }
            (topic, usize::try_from(v.get_i32().max(0)).ok()?)
        };
        if v.remaining() < 4usize.checked_mul(n)? {
            return None;
        }
        for _ in 0..n {
            partitions.insert((topic.clone(), v.get_i32()));
        }
        if flexible {
            get_tagged_fields(&mut v)?;
        }
    }
    if v.remaining() < 16 {
        return None;
    }
    let mut record = TxnRecord::v0(
        producer_id,
        producer_epoch,
        timeout_ms,
        state,
        partitions,
        v.get_i64(),
        v.get_i64(),
    );
    if flexible {
        for (tag, mut value) in get_tagged_fields(&mut v)? {
            match (tag, value.remaining()) {
                (0, 8) => record.previous_producer_id = value.get_i64(),
                (1, 8) => record.next_producer_id = value.get_i64(),
                (2, 2) => record.client_transaction_version = value.get_i16(),
                _ => {}
            }
        }
    }
    Some(record)
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
        let r = TxnRecord::v0(
            7,
            3,
            60_000,
            TxnState::Ongoing,
            BTreeSet::from([("a".into(), 0), ("a".into(), 2), ("b".into(), 1)]),
            1_700_000_000_000,
            1_699_999_999_000,
        );
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

    /// v1 (KIP-890 part 2's fields) as Kafka's generated `TransactionLogValue` writes it:
    /// compact arrays and strings, tagged fields in tag order at the end.
    #[test]
    fn a_record_with_tagged_fields_is_written_as_flexible_v1() {
        let mut r = TxnRecord::v0(
            7,
            4,
            60_000,
            TxnState::PrepareCommit,
            BTreeSet::from([("ab".into(), 1)]),
            10,
            5,
        );
        r.client_transaction_version = 2;
        r.next_producer_id = 9;
        let v = encode_value(&r);
        let expected: Vec<u8> = [
            &[0u8, 1][..],            // version 1
            &7i64.to_be_bytes(),      // producer id
            &4i16.to_be_bytes(),      // epoch
            &60_000i32.to_be_bytes(), // timeout
            &[2],                     // PrepareCommit
            &[2],                     // 1 topic (compact: n + 1)
            &[3, b'a', b'b'],         // "ab"
            &[2],                     // 1 partition
            &1i32.to_be_bytes(),      // partition 1
            &[0],                     // the topic's tagged fields: none
            &10i64.to_be_bytes(),     // last update
            &5i64.to_be_bytes(),      // start
            &[2],                     // 2 tagged fields
            &[1, 8],                  // tag 1 NextProducerId, 8 bytes
            &9i64.to_be_bytes(),
            &[2, 2], // tag 2 ClientTransactionVersion, 2 bytes
            &2i16.to_be_bytes(),
        ]
        .concat();
        assert_eq!(&v[..], &expected[..]);
        assert_eq!(decode_value(&v), Some(r.clone()));
        r.previous_producer_id = 3;
        r.partitions.clear();
        r.state = TxnState::CompleteCommit;
        assert_eq!(decode_value(&encode_value(&r)), Some(r));
        // Cut anywhere, it is refused, never misread.
        for cut in 0..v.len() {
            assert_eq!(decode_value(&v.slice(..cut)), None, "cut at {cut}");
        }
    }

    #[test]
    fn partition_matches_kafka() {
        assert_eq!(partition_for("polygenelubricants", 50), 0);
        assert_eq!(partition_for("a", 50), 97 % 50);
    }
}
