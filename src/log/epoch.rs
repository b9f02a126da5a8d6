//! Leader epoch cache of one partition (Kafka's `LeaderEpochFileCache`): which leader
//! epoch wrote which offsets, so a follower can find where its log diverged from the
//! leader's by epoch rather than by high watermark (KIP-101, and KIP-279's answer with the
//! epoch as well as the offset).
//!
//! Owns: the entries `(leader_epoch, start_offset)` — the first offset each epoch wrote —
//! strictly increasing in both; the OffsetsForLeaderEpoch lookup over them
//! ([`LeaderEpochCache::end_offset_for`]); the `leader-epoch-checkpoint` file in the
//! partition directory, Kafka's text format (`CheckpointFile`, version 0):
//!
//! ```text
//! 0              <- version
//! 2              <- number of entries
//! 0 0            <- "<epoch> <start_offset>", oldest first
//! 3 120
//! ```
//!
//! rewritten whole and atomically (temp file, fsync, rename, directory fsync) whenever the
//! entries change, which is rare: a new epoch, a truncation, retention.
//!
//! Never does: decide epochs (they come from the batches the log stores: the leader's
//! `AppendOptions::leader_epoch`, or the epoch a follower copies), read the segments (the
//! log rebuilds the cache from batch headers when the file is missing, see
//! `PartitionLog::open`), or lock (the `PartitionLog` owner does).
//!
//! Durability: the log assigns an epoch before it writes the batch that starts it, so a
//! crash leaves at worst an entry at or above the log end offset, which `open` drops
//! (Kafka's order, too). A checkpoint that could not be written is retried on the next
//! change or append rather than forgotten.

use std::path::{Path, PathBuf};

use super::checkpoint::write_atomically;
use super::segment::io_error;
use super::LogError;

/// File name in the partition directory (Kafka's `LeaderEpochCheckpointFile`).
pub(crate) const CHECKPOINT_FILE: &str = "leader-epoch-checkpoint";
/// The only checkpoint format version (Kafka writes 0).
const CHECKPOINT_VERSION: i32 = 0;
/// Kafka's `UNDEFINED_EPOCH`.
const UNDEFINED_EPOCH: i32 = -1;
/// Kafka's `UNDEFINED_EPOCH_OFFSET`.
const UNDEFINED_EPOCH_OFFSET: i64 = -1;

/// An OffsetsForLeaderEpoch answer for one partition (KIP-101, KIP-279): the largest
/// leader epoch the log holds that is at most the requested one, and the offset where it
/// ended (exclusive: the first offset of the next epoch, or the log end offset for the
/// latest epoch). Both are -1 (Kafka's `UNDEFINED_EPOCH` / `UNDEFINED_EPOCH_OFFSET`) when
/// the log cannot say; see [`PartitionLog::end_offset_for_epoch`](super::PartitionLog::end_offset_for_epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEndOffset {
    /// `leader_epoch` of the OffsetForLeaderEpoch response partition.
    pub leader_epoch: i32,
    /// `end_offset` of the OffsetForLeaderEpoch response partition.
    pub end_offset: i64,
}

impl EpochEndOffset {
    /// (-1, -1): no answer (empty cache, unknown or undefined epoch).
    pub const UNDEFINED: EpochEndOffset = EpochEndOffset {
        leader_epoch: UNDEFINED_EPOCH,
        end_offset: UNDEFINED_EPOCH_OFFSET,
    };
}

/// One cache entry: `epoch` wrote its first record at `start_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EpochEntry {
    pub(crate) epoch: i32,
    pub(crate) start_offset: i64,
}

/// The cache of one partition. See the module doc.
#[derive(Debug)]
pub(crate) struct LeaderEpochCache {
    dir: PathBuf,
    /// Strictly increasing in `epoch` and in `start_offset`.
    entries: Vec<EpochEntry>,
    /// The file does not hold `entries` (the last write failed).
    unpersisted: bool,
}

impl LeaderEpochCache {
    /// An empty cache for `dir`; nothing is written until it changes.
    pub(crate) fn empty(dir: &Path) -> LeaderEpochCache {
        LeaderEpochCache {
            dir: dir.to_path_buf(),
            entries: Vec::new(),
            unpersisted: false,
        }
    }

    /// Reads `dir/leader-epoch-checkpoint`. `Ok(None)` when it is missing, or unparsable
    /// (logged with `tracing::warn!`; the caller rebuilds it from the log).
    /// Errors: `Io` other than not-found.
    pub(crate) fn load(dir: &Path) -> Result<Option<LeaderEpochCache>, LogError> {
        let path = dir.join(CHECKPOINT_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                tracing::warn!(file = %path.display(), "leader epoch checkpoint is not text; rebuilding it");
                return Ok(None);
            }
            Err(e) => return Err(io_error("read", &path)(e)),
        };
        match parse(&text) {
            Some(entries) => Ok(Some(LeaderEpochCache {
                dir: dir.to_path_buf(),
                entries,
                unpersisted: false,
            })),
            None => {
                tracing::warn!(file = %path.display(), "unparsable leader epoch checkpoint; rebuilding it");
                Ok(None)
            }
        }
    }

    /// The entries, oldest first.
    pub(crate) fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    /// The newest epoch, if any.
    pub(crate) fn latest_epoch(&self) -> Option<i32> {
        self.entries.last().map(|e| e.epoch)
    }

    /// In memory only: adds `(epoch, start_offset)` when `epoch >= 0` and is newer than the
    /// latest entry. Entries starting at or after `start_offset` go first, so offsets stay
    /// strictly increasing (they can start there when retention moved the first entry up
    /// to the log end offset, or a leader assigned an epoch it never wrote; Kafka's
    /// `maybeTruncateNonMonotonicEntries`). Returns whether anything changed.
    pub(crate) fn push_if_newer(&mut self, epoch: i32, start_offset: i64) -> bool {
        if epoch < 0 || self.latest_epoch().is_some_and(|latest| epoch <= latest) {
            return false;
        }
        let keep = self
            .entries
            .partition_point(|e| e.start_offset < start_offset);
        if keep < self.entries.len() {
            tracing::debug!(
                dir = %self.dir.display(),
                epoch,
                start_offset,
                removed = ?&self.entries[keep..],
                "leader epoch entries without records replaced"
            );
            self.entries.truncate(keep);
        }
        self.entries.push(EpochEntry {
            epoch,
            start_offset,
        });
        true
    }

    /// [`LeaderEpochCache::push_if_newer`], then persists a change (Kafka's `assign`).
    /// Also retries a checkpoint write that failed before. Errors: `Io`.
    pub(crate) fn assign(&mut self, epoch: i32, start_offset: i64) -> Result<(), LogError> {
        if self.push_if_newer(epoch, start_offset) || self.unpersisted {
            self.persist()?;
        }
        Ok(())
    }

    /// OffsetsForLeaderEpoch (KIP-101, KIP-279), Kafka's `LeaderEpochFileCache.endOffsetFor`:
    ///
    /// - `requested` undefined (negative), or newer than every entry (empty cache
    ///   included): [`EpochEndOffset::UNDEFINED`];
    /// - `requested` is the latest epoch: `(requested, log_end_offset)`;
    /// - otherwise, with `higher` the first entry of a newer epoch: `(largest epoch <=
    ///   requested, higher.start_offset)`, or, when every entry is newer than `requested`
    ///   (retention removed the older ones), `(requested, higher.start_offset)`: the data
    ///   before it is gone, and the follower should replicate from there.
    pub(crate) fn end_offset_for(&self, requested: i32, log_end_offset: i64) -> EpochEndOffset {
        if requested < 0 {
            return EpochEndOffset::UNDEFINED;
        }
        if self.latest_epoch() == Some(requested) {
            return EpochEndOffset {
                leader_epoch: requested,
                end_offset: log_end_offset,
            };
        }
        let at_most = self.entries.partition_point(|e| e.epoch <= requested);
        let Some(higher) = self.entries.get(at_most) else {
            return EpochEndOffset::UNDEFINED;
        };
        let leader_epoch = match at_most.checked_sub(1) {
            Some(floor) => self.entries[floor].epoch,
            None => requested,
        };
        EpochEndOffset {
            leader_epoch,
            end_offset: higher.start_offset,
        }
    }

    /// Removes the entries starting at or after `end_offset` (the log was truncated to it;
    /// Kafka's `truncateFromEnd`) and persists a change. Errors: `Io`.
    pub(crate) fn truncate_from_end(&mut self, end_offset: i64) -> Result<(), LogError> {
        let keep = self
            .entries
            .partition_point(|e| e.start_offset < end_offset);
        if keep < self.entries.len() {
            self.entries.truncate(keep);
            self.persist()?;
        }
        Ok(())
    }

    /// The log start offset moved up to `start_offset`: entries wholly below it go and the
    /// one spanning it now starts there (Kafka's `truncateFromStart`); persists a change.
    /// Errors: `Io`.
    pub(crate) fn truncate_from_start(&mut self, start_offset: i64) -> Result<(), LogError> {
        let at_or_below = self
            .entries
            .partition_point(|e| e.start_offset <= start_offset);
        let Some(spanning) = at_or_below.checked_sub(1) else {
            return Ok(());
        };
        if spanning == 0 && self.entries[0].start_offset == start_offset {
            return Ok(());
        }
        let epoch = self.entries[spanning].epoch;
        self.entries.drain(..spanning);
        self.entries[0] = EpochEntry {
            epoch,
            start_offset,
        };
        self.persist()
    }

    /// Writes the checkpoint whole: temp file, fsync, rename, directory fsync.
    /// Errors: `Io` (the cache then retries on the next [`LeaderEpochCache::assign`]).
    pub(crate) fn persist(&mut self) -> Result<(), LogError> {
        self.unpersisted = true;
        write_atomically(
            &self.dir,
            CHECKPOINT_FILE,
            &format_checkpoint(&self.entries),
        )?;
        self.unpersisted = false;
        Ok(())
    }
}

fn format_checkpoint(entries: &[EpochEntry]) -> String {
    let mut text = format!("{CHECKPOINT_VERSION}\n{}\n", entries.len());
    for entry in entries {
        text.push_str(&format!("{} {}\n", entry.epoch, entry.start_offset));
    }
    text
}

/// Parses the checkpoint text; `None` unless it is version 0 with exactly the announced
/// number of well-formed entries, non-negative and strictly increasing in both fields. The
/// count is only compared, never used to allocate.
fn parse(text: &str) -> Option<Vec<EpochEntry>> {
    let mut lines = text.lines();
    if lines.next()?.trim().parse::<i32>().ok()? != CHECKPOINT_VERSION {
        return None;
    }
    let count: usize = lines.next()?.trim().parse().ok()?;
    let mut entries: Vec<EpochEntry> = Vec::new();
    for line in lines.by_ref().take(count) {
        let mut fields = line.split_whitespace();
        let epoch: i32 = fields.next()?.parse().ok()?;
        let start_offset: i64 = fields.next()?.parse().ok()?;
        if fields.next().is_some() || epoch < 0 || start_offset < 0 {
            return None;
        }
        if entries
            .last()
            .is_some_and(|last| epoch <= last.epoch || start_offset <= last.start_offset)
        {
            return None;
        }
        entries.push(EpochEntry {
            epoch,
            start_offset,
        });
    }
    if entries.len() != count || lines.any(|line| !line.trim().is_empty()) {
        return None;
    }
    Some(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache_with(dir: &Path, entries: &[(i32, i64)]) -> LeaderEpochCache {
        let mut cache = LeaderEpochCache::empty(dir);
        for &(epoch, start_offset) in entries {
            cache.assign(epoch, start_offset).unwrap();
        }
        cache
    }

    fn pairs(cache: &LeaderEpochCache) -> Vec<(i32, i64)> {
        cache
            .entries()
            .iter()
            .map(|e| (e.epoch, e.start_offset))
            .collect()
    }

    fn answer(leader_epoch: i32, end_offset: i64) -> EpochEndOffset {
        EpochEndOffset {
            leader_epoch,
            end_offset,
        }
    }

    /// Every branch of Kafka's `endOffsetFor`.
    #[test]
    fn end_offset_for_follows_kafka() {
        let dir = tempfile::tempdir().unwrap();
        let empty = LeaderEpochCache::empty(dir.path());
        assert_eq!(empty.end_offset_for(0, 10), EpochEndOffset::UNDEFINED);
        assert_eq!(empty.end_offset_for(-1, 10), EpochEndOffset::UNDEFINED);

        let cache = cache_with(dir.path(), &[(2, 6), (4, 10), (7, 15)]);
        let leo = 20;
        // The latest epoch ends at the log end offset.
        assert_eq!(cache.end_offset_for(7, leo), answer(7, 20));
        // An epoch in the cache ends where the next one starts.
        assert_eq!(cache.end_offset_for(2, leo), answer(2, 10));
        assert_eq!(cache.end_offset_for(4, leo), answer(4, 15));
        // An epoch between two entries: the one below it, ending where the next starts.
        assert_eq!(cache.end_offset_for(3, leo), answer(2, 10));
        assert_eq!(cache.end_offset_for(6, leo), answer(4, 15));
        // Older than every entry: the requested epoch, ending at the first entry's start.
        assert_eq!(cache.end_offset_for(1, leo), answer(1, 6));
        assert_eq!(cache.end_offset_for(0, leo), answer(0, 6));
        // Newer than every entry, or undefined: no answer.
        assert_eq!(cache.end_offset_for(8, leo), EpochEndOffset::UNDEFINED);
        assert_eq!(cache.end_offset_for(-1, leo), EpochEndOffset::UNDEFINED);
    }

    #[test]
    fn assign_keeps_both_fields_strictly_increasing() {
        let dir = tempfile::tempdir().unwrap();
        let mut cache = cache_with(dir.path(), &[(1, 0), (3, 10)]);
        // Older, equal or negative epochs are ignored.
        for (epoch, start) in [(2, 20), (3, 20), (-1, 30)] {
            cache.assign(epoch, start).unwrap();
        }
        assert_eq!(pairs(&cache), vec![(1, 0), (3, 10)]);
        // A newer epoch at an offset an entry already starts at replaces it.
        cache.assign(5, 10).unwrap();
        assert_eq!(pairs(&cache), vec![(1, 0), (5, 10)]);
        cache.assign(6, 12).unwrap();
        assert_eq!(pairs(&cache), vec![(1, 0), (5, 10), (6, 12)]);
        assert_eq!(cache.latest_epoch(), Some(6));
    }

    #[test]
    fn checkpoint_round_trips_in_kafkas_format() {
        let dir = tempfile::tempdir().unwrap();
        let written = cache_with(dir.path(), &[(0, 0), (3, 120)]);
        let text = std::fs::read_to_string(dir.path().join(CHECKPOINT_FILE)).unwrap();
        assert_eq!(text, "0\n2\n0 0\n3 120\n");
        let read = LeaderEpochCache::load(dir.path()).unwrap().unwrap();
        assert_eq!(read.entries(), written.entries());
        assert!(!dir.path().join(format!("{CHECKPOINT_FILE}.tmp")).exists());
    }

    #[test]
    fn unparsable_checkpoints_are_refused() {
        for text in [
            "",
            "1\n0\n",
            "0\n2\n0 0\n",
            "0\n1\n0 0\n3 5\n",
            "0\n2\n3 10\n2 20\n",
            "0\n2\n2 10\n3 10\n",
            "0\n1\n-2 0\n",
            "0\n1\n1 x\n",
            "0\n1\n1 2 3\n",
            "0\n99999999999999999999\n",
        ] {
            assert_eq!(parse(text), None, "{text:?}");
        }
        assert_eq!(parse("0\n0\n"), Some(vec![]));
    }

    #[test]
    fn truncate_from_end_and_from_start() {
        let dir = tempfile::tempdir().unwrap();
        let mut cache = cache_with(dir.path(), &[(1, 0), (2, 10), (4, 20), (5, 30)]);
        cache.truncate_from_end(20).unwrap();
        assert_eq!(pairs(&cache), vec![(1, 0), (2, 10)]);
        // Start inside epoch 2: epoch 1 goes, epoch 2 starts at the new log start.
        cache.truncate_from_start(15).unwrap();
        assert_eq!(pairs(&cache), vec![(2, 15)]);
        // Below the first entry, or exactly at it: nothing changes.
        cache.truncate_from_start(5).unwrap();
        cache.truncate_from_start(15).unwrap();
        assert_eq!(pairs(&cache), vec![(2, 15)]);
        // Exactly at a later entry: that one is kept as it is.
        let mut cache = cache_with(dir.path(), &[(1, 0), (2, 10), (4, 20)]);
        cache.truncate_from_start(10).unwrap();
        assert_eq!(pairs(&cache), vec![(2, 10), (4, 20)]);
        let reread = LeaderEpochCache::load(dir.path()).unwrap().unwrap();
        assert_eq!(pairs(&reread), vec![(2, 10), (4, 20)]);
    }
}
