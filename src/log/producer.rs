//! Idempotent producer state of one partition (Kafka's `ProducerStateManager`).
//!
//! Owns: per producer id, the current epoch and the metadata of its last
//! [`MAX_BATCHES_PER_PRODUCER`] batches; the sequence/epoch checks a produce must pass
//! (KIP-98, with KIP-360's acceptance of unknown producers); the `.snapshot` file format;
//! per producer the first offset of its ongoing transaction (`current_txn_first_offset`,
//! set by its first transactional batch when none is open, cleared by its marker) and the
//! last coordinator epoch seen in its markers; the transactions completed by a marker the
//! high watermark has not yet passed; and from those the first unstable offset the last
//! stable offset is computed from (Kafka's `ProducerStateManager.firstUnstableOffset`).
//! Never does: write markers or the aborted transaction index (the log does), file I/O
//! beyond reading and writing one snapshot file, or assign offsets.
//!
//! Transactions: leader and follower appends update this state from the same batch
//! headers (a follower sees the leader's transactional and control batches), and so does
//! the replay of the active segment at open. A transaction stays unstable until the high
//! watermark passes its marker (Kafka's `unreplicatedTxns`), so a read_committed consumer
//! never reads past a transaction whose outcome a leader change could still lose. A
//! producer with an ongoing transaction never expires. The completed-but-unreplicated
//! list is not in the snapshot: after a restart only the active segment's markers are
//! replayed into it (a marker of an earlier segment above the checkpointed high
//! watermark counts as stable: it was replicated or it was on a single node).
//!
//! Durability: on every segment roll the log writes `<new_base_offset:020>.snapshot` (the
//! state as of that offset); on open it loads the snapshot named after the active segment
//! and replays the active segment's batch headers. A missing or corrupt snapshot only
//! loses producers that appear in no batch of the active segment: they are then unknown,
//! and their next batch is accepted with any sequence.
//!
//! Expiry (Kafka `producer.id.expiration.ms`) is on the broker's wall clock: each entry
//! keeps `last_append_ms`, the broker's clock when its last batch was appended, never the
//! batch's own timestamp. A timestamp is the client's (CreateTime can be any age), so
//! expiring on it forgot a producer that had just written a batch stamped in the past,
//! and that batch's retry was appended twice (issue 15). Entries loaded from the log at
//! open (replayed batch headers) take the open time as their last append: the log does
//! not say when a batch was appended, and an early expiry is the harmful mistake (a
//! duplicate), a late one only keeps a few bytes for one more expiration period.
//!
//! Snapshot format: `WPS3` stores `last_append_ms` (broker clock) and, after each
//! producer's batches, `current_txn_first_offset i64` (-1: none) and
//! `coordinator_epoch i32` (-1: no marker seen). `WPS2` (before transactions) lacks the
//! last two: still read, with no transaction open. `WPS1` snapshots (before issue 15)
//! stored the largest batch timestamp in the time field; they are still read, and their
//! entries take the load time as their last append, for the reason above.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::Path;

use super::batch::BatchHeader;
use super::segment::io_error;
use super::LogError;

/// Kafka keeps the metadata of the last 5 batches per producer, so a producer with
/// `max.in.flight.requests.per.connection <= 5` can retry any of them.
pub(super) const MAX_BATCHES_PER_PRODUCER: usize = 5;
/// Snapshots written since transactions: `WPS2` plus the transaction fields.
const SNAPSHOT_MAGIC: &[u8; 4] = b"WPS3";
/// Snapshots written since issue 15: the time field is the broker's clock.
const SNAPSHOT_MAGIC_V2: &[u8; 4] = b"WPS2";
/// Snapshots from before: the time field is a batch timestamp (ignored; see the module
/// doc).
const SNAPSHOT_MAGIC_V1: &[u8; 4] = b"WPS1";

/// What one appended batch covered, kept to answer retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchMetadata {
    pub first_sequence: i32,
    pub last_sequence: i32,
    pub base_offset: i64,
    pub last_offset: i64,
    pub timestamp_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ProducerEntry {
    epoch: i16,
    batches: VecDeque<BatchMetadata>,
    /// The broker's wall clock (ms since the epoch) at this producer's last append.
    last_append_ms: i64,
    /// Offset of the first batch of its ongoing transaction; `None` when none is open.
    current_txn_first_offset: Option<i64>,
    /// The coordinator epoch of the last marker seen for it (-1: none).
    coordinator_epoch: i32,
}

impl ProducerEntry {
    fn new(epoch: i16, now_ms: i64) -> ProducerEntry {
        ProducerEntry {
            epoch,
            batches: VecDeque::with_capacity(MAX_BATCHES_PER_PRODUCER),
            last_append_ms: now_ms,
            current_txn_first_offset: None,
            coordinator_epoch: -1,
        }
    }
}

/// A transaction a marker ended (Kafka's `CompletedTxn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CompletedTxn {
    pub producer_id: i64,
    /// Its first offset; `None` when no transaction of the producer was known to be open
    /// (a marker with nothing to end, or state lost with a snapshot).
    pub first_offset: Option<i64>,
    /// The marker's offset.
    pub last_offset: i64,
    /// Whether it was aborted.
    pub aborted: bool,
}

/// One producer as DescribeProducers reports it (KIP-664).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerSummary {
    /// The producer id.
    pub producer_id: i64,
    /// Its current epoch.
    pub producer_epoch: i16,
    /// The last sequence of its last batch (-1: none kept).
    pub last_sequence: i32,
    /// maxTimestamp of its last batch (-1: none kept).
    pub last_timestamp_ms: i64,
    /// The coordinator epoch of its last marker (-1: none).
    pub coordinator_epoch: i32,
    /// First offset of its ongoing transaction (-1: none).
    pub current_txn_start_offset: i64,
}

/// Outcome of checking a batch from an idempotent producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SequenceCheck {
    /// Append it.
    Append,
    /// A retry of a batch already in the log: answer with its original offsets.
    Duplicate(BatchMetadata),
}

/// `baseSequence + lastOffsetDelta`, wrapping past `i32::MAX` to 0 as Kafka does.
pub(crate) fn last_sequence(base_sequence: i32, last_offset_delta: i32) -> i32 {
    let sum = i64::from(base_sequence) + i64::from(last_offset_delta);
    if sum > i64::from(i32::MAX) {
        (sum - i64::from(i32::MAX) - 1) as i32
    } else {
        sum as i32
    }
}

fn next_sequence(sequence: i32) -> i32 {
    if sequence == i32::MAX {
        0
    } else {
        sequence + 1
    }
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ProducerStateManager {
    producers: HashMap<i64, ProducerEntry>,
    /// Transactions a marker completed, as `(first_offset, marker_offset)`, kept until
    /// the high watermark passes the marker ([`ProducerStateManager::prune_replicated`]).
    unreplicated: Vec<(i64, i64)>,
    /// Every ongoing transaction as `(first_offset, producer_id)`: the entries'
    /// `current_txn_first_offset`s in order, so the first unstable offset a Fetch reads
    /// for every partition it names costs O(1), not a walk over every producer (Kafka's
    /// `ongoingTxns`). Changed only with those fields.
    ongoing: BTreeSet<(i64, i64)>,
}

impl ProducerStateManager {
    /// Checks a batch with `producer_id >= 0` and `base_sequence >= 0`.
    ///
    /// - unknown producer id: accepted with any sequence (KIP-360: its state may have
    ///   been lost to retention or expiry);
    /// - epoch below the known one: `InvalidProducerEpoch` (47);
    /// - same epoch and (first, last) sequence equal to one of the last 5 batches:
    ///   duplicate;
    /// - higher epoch: sequence must be 0, else `OutOfOrderSequence` (45);
    /// - same epoch: sequence must follow the last one (wrapping), else
    ///   `OutOfOrderSequence` (45).
    pub(super) fn check(
        &self,
        producer_id: i64,
        epoch: i16,
        base_sequence: i32,
        last_offset_delta: i32,
    ) -> Result<SequenceCheck, LogError> {
        let Some(entry) = self.producers.get(&producer_id) else {
            return Ok(SequenceCheck::Append);
        };
        if epoch < entry.epoch {
            return Err(LogError::InvalidProducerEpoch {
                producer_id,
                producer_epoch: epoch,
                current_epoch: entry.epoch,
            });
        }
        if epoch > entry.epoch {
            if base_sequence != 0 {
                return Err(LogError::OutOfOrderSequence {
                    producer_id,
                    producer_epoch: epoch,
                    base_sequence,
                    expected_sequence: 0,
                });
            }
            return Ok(SequenceCheck::Append);
        }
        let last = last_sequence(base_sequence, last_offset_delta);
        if let Some(original) = entry
            .batches
            .iter()
            .find(|b| b.first_sequence == base_sequence && b.last_sequence == last)
        {
            return Ok(SequenceCheck::Duplicate(*original));
        }
        let expected = entry
            .batches
            .back()
            .map_or(base_sequence, |b| next_sequence(b.last_sequence));
        if base_sequence != expected {
            return Err(LogError::OutOfOrderSequence {
                producer_id,
                producer_epoch: epoch,
                base_sequence,
                expected_sequence: expected,
            });
        }
        Ok(SequenceCheck::Append)
    }

    /// Records a batch appended at `now_ms` (the broker's wall clock; after `check`, or
    /// unchecked while replaying the log at open, with the open time).
    pub(super) fn update(&mut self, header: &BatchHeader, now_ms: i64) {
        if header.producer_id < 0 || header.base_sequence < 0 {
            return;
        }
        let metadata = BatchMetadata {
            first_sequence: header.base_sequence,
            last_sequence: last_sequence(header.base_sequence, header.last_offset_delta),
            base_offset: header.base_offset,
            last_offset: header.last_offset(),
            timestamp_ms: header.max_timestamp,
        };
        let entry = self
            .producers
            .entry(header.producer_id)
            .or_insert_with(|| ProducerEntry::new(header.producer_epoch, now_ms));
        if header.producer_epoch != entry.epoch {
            entry.epoch = header.producer_epoch;
            entry.batches.clear();
        }
        if header.is_transactional() && entry.current_txn_first_offset.is_none() {
            entry.current_txn_first_offset = Some(header.base_offset);
            self.ongoing
                .insert((header.base_offset, header.producer_id));
        }
        if entry.batches.len() == MAX_BATCHES_PER_PRODUCER {
            entry.batches.pop_front();
        }
        entry.batches.push_back(metadata);
        // max: the wall clock may step back; an entry's last append never does.
        entry.last_append_ms = entry.last_append_ms.max(now_ms);
    }

    /// Checks a data batch of `producer_id` against its transaction state (Kafka's
    /// `ProducerAppendInfo.appendDataBatch`): a non-transactional batch while the
    /// producer has a transaction open is `InvalidTxnState` (48).
    pub(super) fn check_txn_state(
        &self,
        producer_id: i64,
        transactional: bool,
    ) -> Result<(), LogError> {
        match self.producers.get(&producer_id) {
            Some(entry) if !transactional && entry.current_txn_first_offset.is_some() => {
                Err(LogError::InvalidTxnState { producer_id })
            }
            _ => Ok(()),
        }
    }

    /// Checks a marker the leader is about to write (Kafka's
    /// `ProducerAppendInfo.checkProducerEpoch` and `appendEndTxnMarker`): a producer epoch
    /// below the known one is `InvalidProducerEpoch` (47); a coordinator epoch below the
    /// last one seen for the producer is `TransactionCoordinatorFenced` (52). An unknown
    /// producer passes.
    pub(super) fn check_marker(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        coordinator_epoch: i32,
    ) -> Result<(), LogError> {
        let Some(entry) = self.producers.get(&producer_id) else {
            return Ok(());
        };
        if producer_epoch < entry.epoch {
            return Err(LogError::InvalidProducerEpoch {
                producer_id,
                producer_epoch,
                current_epoch: entry.epoch,
            });
        }
        if coordinator_epoch < entry.coordinator_epoch {
            return Err(LogError::TransactionCoordinatorFenced {
                producer_id,
                coordinator_epoch,
                current_coordinator_epoch: entry.coordinator_epoch,
            });
        }
        Ok(())
    }

    /// Records a marker (a control batch with `header`, saying `commit` with
    /// `coordinator_epoch`) appended at `now_ms`: ends the producer's ongoing transaction
    /// and remembers the coordinator epoch; a newer producer epoch in the marker becomes
    /// the producer's (its sequences restart). Returns the completed transaction.
    pub(super) fn complete_txn(
        &mut self,
        header: &BatchHeader,
        commit: bool,
        coordinator_epoch: i32,
        now_ms: i64,
    ) -> CompletedTxn {
        let entry = self
            .producers
            .entry(header.producer_id)
            .or_insert_with(|| ProducerEntry::new(header.producer_epoch, now_ms));
        if header.producer_epoch > entry.epoch {
            entry.epoch = header.producer_epoch;
            entry.batches.clear();
        }
        entry.coordinator_epoch = coordinator_epoch;
        entry.last_append_ms = entry.last_append_ms.max(now_ms);
        let first_offset = entry.current_txn_first_offset.take();
        let marker_offset = header.base_offset;
        if let Some(first) = first_offset {
            self.ongoing.remove(&(first, header.producer_id));
            self.unreplicated.push((first, marker_offset));
        }
        CompletedTxn {
            producer_id: header.producer_id,
            first_offset,
            last_offset: marker_offset,
            aborted: !commit,
        }
    }

    /// Whether `producer_id` has a transaction open on this partition.
    pub(super) fn has_ongoing_txn(&self, producer_id: i64) -> bool {
        self.producers
            .get(&producer_id)
            .is_some_and(|e| e.current_txn_first_offset.is_some())
    }

    /// Whether a batch of `producer_id` at `producer_epoch` must start at sequence 0: the
    /// producer is unknown here, or at an older epoch, or at this epoch with no batch yet
    /// (a marker raised it, as an EndTxn v5's does before the next transaction's first
    /// batch). KIP-890 part 2 (Kafka 4.1's KAFKA-18202), for the first batch of a
    /// transaction that a Produce v12 starts on the partition.
    pub(super) fn expects_first_sequence(&self, producer_id: i64, producer_epoch: i16) -> bool {
        self.producers.get(&producer_id).is_none_or(|e| {
            e.epoch < producer_epoch || (e.epoch == producer_epoch && e.batches.is_empty())
        })
    }

    /// Whether `producer_id` has a transaction open at `producer_epoch` (Kafka's
    /// `hasOngoingTransaction(producerId, producerEpoch)`): one at an older epoch is a
    /// transaction whose marker has not arrived yet, not the one a newer batch is in.
    pub(super) fn has_ongoing_txn_at(&self, producer_id: i64, producer_epoch: i16) -> bool {
        self.producers
            .get(&producer_id)
            .is_some_and(|e| e.epoch == producer_epoch && e.current_txn_first_offset.is_some())
    }

    /// The first offset of the earliest transaction that is not yet stable when the high
    /// watermark is `high_watermark`: ongoing ones, and completed ones whose marker is at
    /// or above it. `None` when every transaction is stable.
    pub(super) fn first_unstable_offset(&self, high_watermark: i64) -> Option<i64> {
        let ongoing = self.ongoing.first().map(|(first, _)| *first);
        let unreplicated = self
            .unreplicated
            .iter()
            .filter(|(_, marker)| *marker >= high_watermark)
            .map(|(first, _)| *first);
        ongoing.into_iter().chain(unreplicated).min()
    }

    /// The first offset of the earliest ongoing transaction (markers not counted), and of
    /// every ongoing transaction by producer: what the log cleaner must not clean past.
    pub(super) fn ongoing_txns(&self) -> HashMap<i64, i64> {
        self.ongoing
            .iter()
            .map(|(first, id)| (*id, *first))
            .collect()
    }

    /// The first offset of `producer_id`'s ongoing transaction, if one is open.
    #[cfg(test)]
    pub(super) fn txn_first_offset(&self, producer_id: i64) -> Option<i64> {
        self.producers
            .get(&producer_id)
            .and_then(|e| e.current_txn_first_offset)
    }

    /// Forgets the completed transactions whose marker is below `high_watermark`.
    pub(super) fn prune_replicated(&mut self, high_watermark: i64) {
        self.unreplicated
            .retain(|(_, marker)| *marker >= high_watermark);
    }

    /// Every known producer, by id.
    pub(super) fn summaries(&self) -> Vec<ProducerSummary> {
        let mut out: Vec<ProducerSummary> = self
            .producers
            .iter()
            .map(|(id, e)| ProducerSummary {
                producer_id: *id,
                producer_epoch: e.epoch,
                last_sequence: e.batches.back().map_or(-1, |b| b.last_sequence),
                last_timestamp_ms: e.batches.back().map_or(-1, |b| b.timestamp_ms),
                coordinator_epoch: e.coordinator_epoch,
                current_txn_start_offset: e.current_txn_first_offset.unwrap_or(-1),
            })
            .collect();
        out.sort_unstable_by_key(|s| s.producer_id);
        out
    }

    /// Forgets producers whose last append (broker clock) is `expiration_ms` or more
    /// before `now_ms` (Kafka's `ProducerStateManager.removeExpiredProducers` with
    /// `producer.id.expiration.ms`); bounds the map. A producer with a transaction open
    /// stays (Kafka's rule: its transaction must end first). Returns how many were
    /// forgotten.
    pub(super) fn expire(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
        let before = self.producers.len();
        self.producers.retain(|_, e| {
            e.current_txn_first_offset.is_some()
                || now_ms.saturating_sub(e.last_append_ms) < expiration_ms
        });
        before - self.producers.len()
    }

    /// How many producer ids are remembered.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.producers.len()
    }

    /// Writes the snapshot atomically (temp file + rename).
    pub(super) fn write_snapshot(&self, path: &Path) -> Result<(), LogError> {
        let mut out = Vec::with_capacity(8 + self.producers.len() * 64);
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&(self.producers.len() as u32).to_be_bytes());
        let mut ids: Vec<_> = self.producers.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let e = &self.producers[&id];
            out.extend_from_slice(&id.to_be_bytes());
            out.extend_from_slice(&e.epoch.to_be_bytes());
            out.extend_from_slice(&e.last_append_ms.to_be_bytes());
            out.push(e.batches.len() as u8);
            for b in &e.batches {
                out.extend_from_slice(&b.first_sequence.to_be_bytes());
                out.extend_from_slice(&b.last_sequence.to_be_bytes());
                out.extend_from_slice(&b.base_offset.to_be_bytes());
                out.extend_from_slice(&b.last_offset.to_be_bytes());
                out.extend_from_slice(&b.timestamp_ms.to_be_bytes());
            }
            out.extend_from_slice(&e.current_txn_first_offset.unwrap_or(-1).to_be_bytes());
            out.extend_from_slice(&e.coordinator_epoch.to_be_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_be_bytes());
        let tmp = path.with_extension("snapshot.tmp");
        std::fs::write(&tmp, &out).map_err(io_error("write", &tmp))?;
        std::fs::rename(&tmp, path).map_err(io_error("rename", path))?;
        Ok(())
    }

    /// Reads a snapshot; `Ok(None)` if it is missing or fails its checks (with a warning).
    /// `now_ms` (the broker's clock at open) becomes the last append of every entry of a
    /// `WPS1` snapshot (see the module doc).
    pub(super) fn read_snapshot(
        path: &Path,
        now_ms: i64,
    ) -> Result<Option<ProducerStateManager>, LogError> {
        let raw = match std::fs::read(path) {
            Ok(raw) => raw,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error("read", path)(e)),
        };
        let decoded = decode_snapshot(&raw, now_ms);
        if decoded.is_none() {
            tracing::warn!(snapshot = %path.display(), "corrupt producer snapshot ignored");
        }
        Ok(decoded)
    }
}

fn decode_snapshot(raw: &[u8], now_ms: i64) -> Option<ProducerStateManager> {
    let body_len = raw.len().checked_sub(4)?;
    let (body, crc) = raw.split_at(body_len);
    if crc32c::crc32c(body).to_be_bytes() != crc {
        return None;
    }
    let (mut cursor, time_is_append_time, has_txn_fields) =
        if let Some(rest) = body.strip_prefix(SNAPSHOT_MAGIC.as_slice()) {
            (rest, true, true)
        } else if let Some(rest) = body.strip_prefix(SNAPSHOT_MAGIC_V2.as_slice()) {
            (rest, true, false)
        } else {
            (
                body.strip_prefix(SNAPSHOT_MAGIC_V1.as_slice())?,
                false,
                false,
            )
        };
    let count = u32::from_be_bytes(take::<4>(&mut cursor)?);
    let mut state = ProducerStateManager::default();
    for _ in 0..count {
        let id = i64::from_be_bytes(take::<8>(&mut cursor)?);
        let epoch = i16::from_be_bytes(take::<2>(&mut cursor)?);
        let stored_ms = i64::from_be_bytes(take::<8>(&mut cursor)?);
        let last_append_ms = if time_is_append_time {
            stored_ms
        } else {
            now_ms
        };
        let n = take::<1>(&mut cursor)?[0] as usize;
        if n > MAX_BATCHES_PER_PRODUCER {
            return None;
        }
        let mut batches = VecDeque::with_capacity(MAX_BATCHES_PER_PRODUCER);
        for _ in 0..n {
            batches.push_back(BatchMetadata {
                first_sequence: i32::from_be_bytes(take::<4>(&mut cursor)?),
                last_sequence: i32::from_be_bytes(take::<4>(&mut cursor)?),
                base_offset: i64::from_be_bytes(take::<8>(&mut cursor)?),
                last_offset: i64::from_be_bytes(take::<8>(&mut cursor)?),
                timestamp_ms: i64::from_be_bytes(take::<8>(&mut cursor)?),
            });
        }
        let (current_txn_first_offset, coordinator_epoch) = if has_txn_fields {
            let first = i64::from_be_bytes(take::<8>(&mut cursor)?);
            let coordinator_epoch = i32::from_be_bytes(take::<4>(&mut cursor)?);
            ((first >= 0).then_some(first), coordinator_epoch)
        } else {
            (None, -1)
        };
        if let Some(first) = current_txn_first_offset {
            state.ongoing.insert((first, id));
        }
        let replaced = state.producers.insert(
            id,
            ProducerEntry {
                epoch,
                batches,
                last_append_ms,
                current_txn_first_offset,
                coordinator_epoch,
            },
        );
        // A snapshot naming an id twice (ours never do) keeps the last entry, and only
        // its transaction.
        if let Some(first) = replaced.and_then(|e| e.current_txn_first_offset) {
            if current_txn_first_offset != Some(first) {
                state.ongoing.remove(&(first, id));
            }
        }
    }
    cursor.is_empty().then_some(state)
}

fn take<const N: usize>(cursor: &mut &[u8]) -> Option<[u8; N]> {
    let (head, rest) = cursor.split_first_chunk::<N>()?;
    *cursor = rest;
    Some(*head)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(pid: i64, epoch: i16, seq: i32, base: i64, count: i32) -> BatchHeader {
        BatchHeader {
            base_offset: base,
            batch_length: 0,
            partition_leader_epoch: 0,
            magic: 2,
            crc: 0,
            attributes: 0,
            last_offset_delta: count - 1,
            base_timestamp: 10,
            max_timestamp: 10,
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: seq,
            record_count: count,
        }
    }

    #[test]
    fn sequence_wraps() {
        assert_eq!(last_sequence(i32::MAX, 0), i32::MAX);
        assert_eq!(last_sequence(i32::MAX, 1), 0);
        assert_eq!(last_sequence(i32::MAX - 1, 3), 1);
        let mut state = ProducerStateManager::default();
        state.update(&header(1, 0, i32::MAX - 1, 0, 2), 0);
        assert_eq!(state.check(1, 0, 0, 0).unwrap(), SequenceCheck::Append);
        assert!(state.check(1, 0, 1, 0).is_err());
    }

    #[test]
    fn only_last_five_batches_are_duplicates() {
        let mut state = ProducerStateManager::default();
        for i in 0..7 {
            state.update(&header(1, 0, i * 2, i64::from(i) * 2, 2), 0);
        }
        assert!(matches!(
            state.check(1, 0, 4, 1),
            Ok(SequenceCheck::Duplicate(_))
        ));
        // seq 0 and 2 fell out of the window: out of order now.
        assert!(matches!(
            state.check(1, 0, 2, 1),
            Err(LogError::OutOfOrderSequence { .. })
        ));
    }

    #[test]
    fn snapshot_round_trip_and_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("00000000000000000005.snapshot");
        let mut state = ProducerStateManager::default();
        state.update(&header(1, 3, 0, 0, 2), 100);
        state.update(&header(2, 0, 7, 2, 3), 200);
        state.write_snapshot(&path).unwrap();
        let loaded = ProducerStateManager::read_snapshot(&path, 999)
            .unwrap()
            .unwrap();
        assert_eq!(loaded, state);
        let mut raw = std::fs::read(&path).unwrap();
        raw[6] ^= 1;
        std::fs::write(&path, raw).unwrap();
        assert_eq!(
            ProducerStateManager::read_snapshot(&path, 999).unwrap(),
            None
        );
    }

    /// Issue 15: a batch stamped a day in the past (CreateTime is the client's) does not
    /// make its producer look idle; only the broker's clock at the append counts.
    #[test]
    fn expiry_runs_on_the_broker_clock_not_the_batch_timestamp() {
        const EXPIRATION_MS: i64 = 60_000;
        let now_ms = 1_700_000_000_000;
        let mut old = header(1, 0, 0, 0, 2);
        old.base_timestamp = now_ms - 86_400_000;
        old.max_timestamp = now_ms - 86_400_000;
        let mut state = ProducerStateManager::default();
        state.update(&old, now_ms);
        assert_eq!(state.expire(now_ms + EXPIRATION_MS - 1, EXPIRATION_MS), 0);
        // Still known: the retry is a duplicate with its original offsets.
        assert!(matches!(
            state.check(1, 0, 0, 1),
            Ok(SequenceCheck::Duplicate(BatchMetadata {
                base_offset: 0,
                ..
            }))
        ));
        // A later append restarts the idle time.
        state.update(&header(1, 0, 2, 2, 1), now_ms + 30_000);
        assert_eq!(state.expire(now_ms + EXPIRATION_MS, EXPIRATION_MS), 0);
        // Idle for the whole period on the broker's clock: forgotten.
        assert_eq!(
            state.expire(now_ms + 30_000 + EXPIRATION_MS, EXPIRATION_MS),
            1
        );
        assert_eq!(state.len(), 0);
        assert_eq!(state.check(1, 0, 0, 1).unwrap(), SequenceCheck::Append);
    }

    /// A `WPS1` snapshot (its time field a batch timestamp) still loads; its entries take
    /// the load time as their last append, so an old timestamp does not expire them.
    #[test]
    fn a_wps1_snapshot_loads_with_the_load_time_as_last_append() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("00000000000000000005.snapshot");
        let mut state = ProducerStateManager::default();
        state.update(&header(7, 2, 0, 0, 3), 10);
        state.write_snapshot(&path).unwrap();
        rewrite_as_pre_txn(&path, SNAPSHOT_MAGIC_V1);
        let load_ms = 5_000_000;
        let mut loaded = ProducerStateManager::read_snapshot(&path, load_ms)
            .unwrap()
            .unwrap();
        assert!(matches!(
            loaded.check(7, 2, 0, 2),
            Ok(SequenceCheck::Duplicate(_))
        ));
        assert_eq!(loaded.expire(load_ms + 999, 1_000), 0);
        assert_eq!(loaded.expire(load_ms + 1_000, 1_000), 1);
    }

    /// Rewrites a one-producer `WPS3` snapshot at `path` in the pre-transaction layout
    /// (no transaction fields) with `magic`.
    fn rewrite_as_pre_txn(path: &Path, magic: &[u8; 4]) {
        let raw = std::fs::read(path).unwrap();
        let body_len = raw.len() - 4;
        let mut old = raw[..body_len - 12].to_vec();
        old[..4].copy_from_slice(magic);
        let crc = crc32c::crc32c(&old).to_be_bytes();
        old.extend_from_slice(&crc);
        std::fs::write(path, old).unwrap();
    }

    fn txn_header(pid: i64, epoch: i16, seq: i32, base: i64, count: i32) -> BatchHeader {
        let mut h = header(pid, epoch, seq, base, count);
        h.attributes = 0x10;
        h
    }

    fn marker_header(pid: i64, epoch: i16, offset: i64) -> BatchHeader {
        let mut h = header(pid, epoch, -1, offset, 1);
        h.attributes = 0x30;
        h
    }

    /// The first transactional batch opens the transaction at its offset; later ones keep
    /// it; the marker ends it and keeps it unstable until the high watermark passes it.
    #[test]
    fn transactions_open_at_the_first_batch_and_end_at_the_marker() {
        let mut state = ProducerStateManager::default();
        state.update(&txn_header(1, 0, 0, 10, 2), 0);
        state.update(&txn_header(1, 0, 2, 12, 2), 0);
        state.update(&txn_header(2, 0, 0, 14, 1), 0);
        assert!(state.has_ongoing_txn(1) && state.has_ongoing_txn(2));
        assert_eq!(state.first_unstable_offset(100), Some(10));
        assert!(matches!(
            state.check_txn_state(1, false),
            Err(LogError::InvalidTxnState { producer_id: 1 })
        ));
        let done = state.complete_txn(&marker_header(1, 0, 15), false, 4, 0);
        assert_eq!(
            done,
            CompletedTxn {
                producer_id: 1,
                first_offset: Some(10),
                last_offset: 15,
                aborted: true
            }
        );
        assert!(!state.has_ongoing_txn(1));
        // Producer 2 is still open; producer 1's marker is not yet below the HW.
        assert_eq!(state.first_unstable_offset(15), Some(10));
        assert_eq!(state.first_unstable_offset(16), Some(14));
        state.complete_txn(&marker_header(2, 0, 16), true, 4, 0);
        assert_eq!(state.first_unstable_offset(17), None);
        state.prune_replicated(17);
        assert!(state.unreplicated.is_empty());
        // Fencing: an older coordinator epoch, an older producer epoch.
        assert!(matches!(
            state.check_marker(1, 0, 3),
            Err(LogError::TransactionCoordinatorFenced { .. })
        ));
        state.update(&txn_header(1, 1, 0, 17, 1), 0);
        assert!(matches!(
            state.check_marker(1, 0, 4),
            Err(LogError::InvalidProducerEpoch { .. })
        ));
        assert!(state.check_marker(1, 1, 4).is_ok());
        // An open transaction keeps its producer from expiring.
        assert_eq!(state.expire(i64::MAX, 1), 1);
        assert!(state.has_ongoing_txn(1));
    }

    /// `WPS3` keeps the open transaction and the coordinator epoch; `WPS2` (before
    /// transactions) still loads, with none open.
    #[test]
    fn snapshots_keep_transactions_and_old_ones_still_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("00000000000000000005.snapshot");
        let mut state = ProducerStateManager::default();
        state.update(&txn_header(3, 1, 0, 2, 2), 50);
        state.complete_txn(&marker_header(3, 1, 4), true, 9, 50);
        state.update(&txn_header(3, 1, 2, 5, 1), 60);
        state.write_snapshot(&path).unwrap();
        let loaded = ProducerStateManager::read_snapshot(&path, 0)
            .unwrap()
            .unwrap();
        assert_eq!(loaded.txn_first_offset(3), Some(5));
        assert_eq!(loaded.first_unstable_offset(100), Some(5));
        assert_eq!(loaded.summaries()[0].coordinator_epoch, 9);
        assert!(loaded.check_marker(3, 1, 8).is_err());
        rewrite_as_pre_txn(&path, SNAPSHOT_MAGIC_V2);
        let old = ProducerStateManager::read_snapshot(&path, 0)
            .unwrap()
            .unwrap();
        assert!(!old.has_ongoing_txn(3));
        assert!(matches!(old.check(3, 1, 3, 0), Ok(SequenceCheck::Append)));
        assert!(matches!(
            old.check(3, 1, 2, 0),
            Ok(SequenceCheck::Duplicate(_))
        ));
    }

    proptest::proptest! {
        /// The ordered set of ongoing transactions always agrees with the producers'
        /// own `current_txn_first_offset`s: the first unstable offset is their minimum
        /// (with no unreplicated marker above the high watermark), through opens,
        /// markers, expiry and a snapshot round trip.
        #[test]
        fn ongoing_set_matches_the_producers(
            steps in proptest::collection::vec((0i64..6, proptest::bool::ANY), 1..60)
        ) {
            let mut state = ProducerStateManager::default();
            let mut offset = 0i64;
            for (pid, open) in steps {
                if open {
                    state.update(&txn_header(pid, 0, 0, offset, 1), offset);
                } else {
                    state.complete_txn(&marker_header(pid, 0, offset), true, 0, offset);
                }
                offset += 1;
                state.expire(offset, 3);
                let expected = state
                    .producers
                    .values()
                    .filter_map(|e| e.current_txn_first_offset)
                    .min();
                proptest::prop_assert_eq!(state.first_unstable_offset(i64::MAX), expected);
                let by_producer: HashMap<i64, i64> = state
                    .producers
                    .iter()
                    .filter_map(|(id, e)| e.current_txn_first_offset.map(|f| (*id, f)))
                    .collect();
                proptest::prop_assert_eq!(state.ongoing_txns(), by_producer);
            }
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("00000000000000000000.snapshot");
            state.write_snapshot(&path).unwrap();
            let loaded = ProducerStateManager::read_snapshot(&path, 0).unwrap().unwrap();
            proptest::prop_assert_eq!(&loaded.ongoing, &state.ongoing);
        }
    }
}
