//! Idempotent producer state of one partition (Kafka's `ProducerStateManager`).
//!
//! Owns: per producer id, the current epoch and the metadata of its last
//! [`MAX_BATCHES_PER_PRODUCER`] batches; the sequence/epoch checks a produce must pass
//! (KIP-98, with KIP-360's acceptance of unknown producers); the `.snapshot` file format.
//! Never does: transactions (ongoing transactions, markers, LSO), file I/O beyond reading
//! and writing one snapshot file, or assign offsets.
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
//! Snapshot format: `WPS2` stores `last_append_ms` (broker clock). `WPS1` snapshots
//! (before issue 15) stored the largest batch timestamp in that field; they are still
//! read, and their entries take the load time as their last append, for the reason
//! above.

use std::collections::{HashMap, VecDeque};
use std::path::Path;

use super::batch::BatchHeader;
use super::segment::io_error;
use super::LogError;

/// Kafka keeps the metadata of the last 5 batches per producer, so a producer with
/// `max.in.flight.requests.per.connection <= 5` can retry any of them.
pub(super) const MAX_BATCHES_PER_PRODUCER: usize = 5;
/// Snapshots written since issue 15: the time field is the broker's clock.
const SNAPSHOT_MAGIC: &[u8; 4] = b"WPS2";
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
            .or_insert_with(|| ProducerEntry {
                epoch: header.producer_epoch,
                batches: VecDeque::with_capacity(MAX_BATCHES_PER_PRODUCER),
                last_append_ms: now_ms,
            });
        if header.producer_epoch != entry.epoch {
            entry.epoch = header.producer_epoch;
            entry.batches.clear();
        }
        if entry.batches.len() == MAX_BATCHES_PER_PRODUCER {
            entry.batches.pop_front();
        }
        entry.batches.push_back(metadata);
        // max: the wall clock may step back; an entry's last append never does.
        entry.last_append_ms = entry.last_append_ms.max(now_ms);
    }

    /// Forgets producers whose last append (broker clock) is `expiration_ms` or more
    /// before `now_ms` (Kafka's `ProducerStateManager.removeExpiredProducers` with
    /// `producer.id.expiration.ms`); bounds the map. Returns how many were forgotten.
    pub(super) fn expire(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
        let before = self.producers.len();
        self.producers
            .retain(|_, e| now_ms.saturating_sub(e.last_append_ms) < expiration_ms);
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
    let (mut cursor, time_is_append_time) = match body.strip_prefix(SNAPSHOT_MAGIC.as_slice()) {
        Some(rest) => (rest, true),
        None => (body.strip_prefix(SNAPSHOT_MAGIC_V1.as_slice())?, false),
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
        state.producers.insert(
            id,
            ProducerEntry {
                epoch,
                batches,
                last_append_ms,
            },
        );
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
        let mut raw = std::fs::read(&path).unwrap();
        let body_len = raw.len() - 4;
        raw[..4].copy_from_slice(SNAPSHOT_MAGIC_V1);
        let crc = crc32c::crc32c(&raw[..body_len]).to_be_bytes();
        raw[body_len..].copy_from_slice(&crc);
        std::fs::write(&path, raw).unwrap();
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
}
