//! Log compaction (`cleanup.policy=compact`): keep only the latest record of each key, as
//! Kafka's `LogCleaner` does.
//!
//! Owns: the offset map (key → latest offset), the rewrite of closed segments with only
//! the records that survive, the swap of a rewritten segment into place, the dirty-ratio
//! trigger and the cleaner checkpoint (`cleaner-offset-checkpoint` in the partition
//! directory: the first offset not yet compacted), and the cleaner's I/O throttle. Never
//! does: touch the active segment, change the offset of a record, decide when to run (the
//! replica manager's retention tick does), take a lock, or anything about requests.
//!
//! Three steps, so the partition is locked only briefly (Kafka's cleaner likewise works
//! on its own copy and swaps under the log's lock):
//!
//! 1. [`PartitionLog::plan_compaction`] (exclusive lock, cheap): is a run due, and a
//!    snapshot of every segment — its offsets, its size then and its open file.
//! 2. [`CompactionPlan::prepare`] (no lock; throttled by `log.cleaner.io.max.bytes.per.second`
//!    through [`CleanerThrottle`]): the offset map over the snapshots and the compacted
//!    copies with their indexes, under `.cleaned` names. Fetches (shared lock) and
//!    produces (exclusive, briefly) go on meanwhile.
//! 3. [`PartitionLog::install_compaction`] (exclusive lock, short): checks that the
//!    planned segments are still the log's — retention, truncation or a config change
//!    may have got there first, and then it discards the copies and changes nothing —
//!    and swaps the copies in. [`PartitionLog::compact`] runs the three in one go.
//!
//! Rules, per record of a cleanable closed segment (Kafka's `LogCleaner` and KIP-58):
//!
//! - a record without a key is removed (Kafka's cleaner drops them; a compacted topic
//!   refuses them on produce anyway);
//! - a record whose key has a record at a higher offset anywhere in the log — closed
//!   segments, segments not yet cleanable, or the active segment — is removed;
//! - a tombstone (null value) that is the latest of its key stays until its batch's
//!   maxTimestamp is more than `delete.retention.ms` old, then it is removed too;
//! - a closed segment holding a record newer than `min.compaction.lag.ms` is not cleaned,
//!   nor any segment after it (KIP-58: a record stays readable uncompacted that long);
//! - control batches (transaction markers) are kept as they are, always. Kafka removes a
//!   marker once the data of its transaction is gone and `delete.retention.ms` has
//!   passed; keeping it longer is safe (a read_committed consumer only needs markers of
//!   data it can still read, and a marker without data is skipped by every client), it
//!   only costs its ~80 bytes per transaction and partition;
//! - records of an aborted transaction (a transactional batch inside the range of an
//!   entry of the aborted transaction indexes for its producer) are removed and never
//!   enter the offset map, so they never shadow a committed record of the same key;
//! - records of a transaction not yet decided (at or after its producer's ongoing
//!   transaction's first offset) never enter the offset map either, and nothing at or
//!   after the first offset of the earliest ongoing transaction is cleaned: the cleanable
//!   segments end before it (Kafka cleans only up to the first unstable offset).
//!
//! Batches keep their offsets: a batch that loses some records is rewritten with the same
//! baseOffset, lastOffsetDelta, baseTimestamp, producer id/epoch and baseSequence and the
//! kept records' bytes unchanged (their offset and timestamp deltas still hold), so every
//! surviving record keeps its absolute offset and consumers see gaps, as with Kafka. Its
//! recordCount, maxTimestamp (CreateTime: the kept records' largest) and CRC are
//! recomputed. A rewritten batch is written **uncompressed** (whatever codec it had); a
//! batch that keeps all its records is copied byte for byte, compression included. A batch
//! that loses every record is dropped, idempotent or not (Kafka keeps the last batch of
//! each producer for its sequence numbers; weir reloads producer state from the active
//! segment and its snapshot, which compaction never touches, so this is not needed here).
//!
//! Crash safety: each rewritten segment is written to `<base>.log.cleaned`, and its
//! indexes to `<base>.index.cleaned` and `<base>.timeindex.cleaned`, all fsynced, before
//! the install; there, per segment, its old indexes are removed, the directory synced, the
//! `.log.cleaned` file renamed over `<base>.log` (the one atomic step), the directory
//! synced, and the cleaned indexes renamed in (a crash between leaves no index, which is
//! rebuilt on open). Segments are swapped oldest first, so after a crash the compacted segments are a prefix
//! and a tombstone never goes before the older values it hides. On open, leftover
//! `.cleaned` (and `.swap`, never written by weir) files are removed and missing indexes
//! rebuilt. A segment that compaction empties is deleted (its offsets become a gap),
//! except the first one, which stays empty so the log start offset does not move.
//!
//! Limits: the offset map holds at most [`OFFSET_MAP_MAX_BYTES`] of keys (Kafka's
//! `log.cleaner.dedupe.buffer.size` default); keys seen after it is full are simply kept
//! everywhere. A batch is decompressed into at most [`MAX_DECOMPRESSED_BATCH_BYTES`]; a
//! larger one is kept whole. Corrupt data (CRC, header, or record layout as the walker in
//! `records` checks it, headers included) aborts the run
//! with [`LogError::Corrupt`] in the prepare step, before anything is swapped. The
//! prepared copies of a run take up to the cleanable bytes again on disk until installed.
//!
//! Single node: the offset map covers up to the log end offset, which is the high
//! watermark here. With replication it must stop at the high watermark, or an
//! uncommitted record that is later truncated could have removed the value it replaced.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::batch::{
    BatchHeader, Compression, ATTRIBUTES_AT, BATCH_HEADER_BYTES, BATCH_LENGTH_AT, COMPRESSION_MASK,
    CRC_AT, LOG_OVERHEAD_BYTES, MAX_TIMESTAMP_AT, RECORD_COUNT_AT,
};
use super::codec::{self, DecompressError};
use super::records::{RecordView, Records, MAX_DECOMPRESSED_BATCH_BYTES};
use super::segment::{cleaned_path_of, io_error, remove_if_exists, Segment, SegmentSnapshot};
use super::{LogError, PartitionLog};

/// The cleaner checkpoint file in the partition directory: one decimal offset, the first
/// offset not yet compacted (Kafka keeps one such file per log dir).
pub(crate) const CHECKPOINT_FILE: &str = "cleaner-offset-checkpoint";

/// Most bytes of keys (plus a per-entry overhead of [`MAP_ENTRY_OVERHEAD_BYTES`]) the
/// offset map holds: Kafka's `log.cleaner.dedupe.buffer.size` default, 128 MiB.
pub(super) const OFFSET_MAP_MAX_BYTES: usize = 128 << 20;
/// Bytes counted per offset map entry on top of its key (hash table slot and offset).
const MAP_ENTRY_OVERHEAD_BYTES: usize = 48;
/// A rewritten segment must stay addressable by 32-bit index positions.
const MAX_SEGMENT_BYTES: u64 = i32::MAX as u64;

/// What one [`PartitionLog::compact`] (or [`PartitionLog::install_compaction`]) call did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CompactionStats {
    /// True when a cleaning pass ran; false when the policy has no `compact`, no closed
    /// segment is cleanable, or the dirty ratio is below `min.cleanable.dirty.ratio`.
    pub cleaned: bool,
    /// Dirty bytes / cleanable closed bytes before the run (0.0 when nothing is cleanable).
    pub dirty_ratio: f64,
    /// Closed segments replaced by a compacted copy.
    pub segments_rewritten: usize,
    /// Closed segments deleted because compaction emptied them.
    pub segments_deleted: usize,
    /// Records removed (superseded, expired tombstones, keyless).
    pub records_removed: u64,
    /// Bytes of the cleanable closed segments before the run.
    pub bytes_before: u64,
    /// Bytes of the same offsets after it.
    pub bytes_after: u64,
    /// The cleaner checkpoint after the call: offsets below it are compacted.
    pub first_dirty_offset: i64,
    /// True when a prepared run was refused at install because the log changed meanwhile
    /// (see [`PartitionLog::install_compaction`]); nothing was changed.
    pub discarded: bool,
}

impl CompactionStats {
    /// `bytes_before - bytes_after` (0 if a rewrite grew, e.g. a decompressed batch).
    pub fn bytes_removed(&self) -> u64 {
        self.bytes_before.saturating_sub(self.bytes_after)
    }
}

/// Key → offset of its latest record, bounded by [`OFFSET_MAP_MAX_BYTES`].
#[derive(Debug, Default)]
struct OffsetMap {
    latest: HashMap<Box<[u8]>, i64>,
    bytes: usize,
    /// The first offset whose key was not added because the map was full.
    full_at: Option<i64>,
}

impl OffsetMap {
    fn put(&mut self, key: &[u8], offset: i64) {
        if let Some(latest) = self.latest.get_mut(key) {
            *latest = (*latest).max(offset);
            return;
        }
        let cost = key.len() + MAP_ENTRY_OVERHEAD_BYTES;
        if self.bytes + cost > OFFSET_MAP_MAX_BYTES {
            self.full_at.get_or_insert(offset);
            return;
        }
        self.bytes += cost;
        self.latest.insert(key.into(), offset);
    }

    fn get(&self, key: &[u8]) -> Option<i64> {
        self.latest.get(key).copied()
    }
}

/// Walks the records section of a batch (`records` = decompressed bytes), `count`
/// records, with the record walker. Errors: what is malformed, naming the record, for
/// [`LogError::Corrupt`].
fn parse_records(records: &[u8], count: i32) -> Result<Vec<RecordView<'_>>, String> {
    Records::new(records, count)
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())
}

/// The records of a stored batch (`bytes`, whole): borrowed when uncompressed, else
/// decompressed. `Ok(None)`: larger than [`MAX_DECOMPRESSED_BATCH_BYTES`] (the caller
/// keeps the batch whole). Errors: corrupt.
fn batch_records<'a>(
    bytes: &'a [u8],
    header: &BatchHeader,
) -> Result<Option<Cow<'a, [u8]>>, String> {
    let codec = header.compression().ok_or_else(|| {
        format!(
            "compression codec bits {}",
            header.attributes & COMPRESSION_MASK
        )
    })?;
    let section = &bytes[BATCH_HEADER_BYTES..];
    if codec == Compression::None {
        return Ok(Some(Cow::Borrowed(section)));
    }
    match codec::decompress(codec, section, MAX_DECOMPRESSED_BATCH_BYTES) {
        Ok(records) => Ok(Some(Cow::Owned(records))),
        Err(DecompressError::TooLarge) => Ok(None),
        Err(DecompressError::Bad(why)) => Err(format!(
            "{} records do not decompress: {why}",
            codec::name(codec)
        )),
    }
}

/// What to do with one batch.
#[derive(Debug, PartialEq, Eq)]
enum Filtered {
    /// Every record stays: copy the stored bytes.
    Unchanged,
    /// No record stays (`n` removed).
    Dropped(u64),
    /// Some stay: write these bytes instead (`n` removed).
    Rewritten(Vec<u8>, u64),
}

/// Applies `keep(offset, record)` to each record of one stored batch (`bytes`, whole).
/// Errors: corrupt records.
fn filter_batch(
    bytes: &[u8],
    header: &BatchHeader,
    mut keep: impl FnMut(i64, &RecordView<'_>) -> bool,
) -> Result<Filtered, String> {
    if header.is_control() {
        return Ok(Filtered::Unchanged);
    }
    let Some(records) = batch_records(bytes, header)? else {
        tracing::warn!(
            base_offset = header.base_offset,
            "batch decompresses beyond the cleaner's limit; kept whole"
        );
        return Ok(Filtered::Unchanged);
    };
    let views = parse_records(&records, header.record_count)?;
    let kept: Vec<&RecordView<'_>> = views
        .iter()
        .filter(|r| keep(header.base_offset + i64::from(r.offset_delta), r))
        .collect();
    let removed = (views.len() - kept.len()) as u64;
    if removed == 0 {
        return Ok(Filtered::Unchanged);
    }
    if kept.is_empty() {
        return Ok(Filtered::Dropped(removed));
    }
    let body_bytes: usize = kept.iter().map(|r| r.raw.len()).sum();
    let mut out = Vec::with_capacity(BATCH_HEADER_BYTES + body_bytes);
    out.extend_from_slice(&bytes[..BATCH_HEADER_BYTES]);
    for r in &kept {
        out.extend_from_slice(r.raw);
    }
    let batch_length = i32::try_from(out.len() - LOG_OVERHEAD_BYTES)
        .map_err(|_| "rewritten batch larger than 2 GiB".to_string())?;
    out[BATCH_LENGTH_AT..BATCH_LENGTH_AT + 4].copy_from_slice(&batch_length.to_be_bytes());
    let attributes = header.attributes & !COMPRESSION_MASK;
    out[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&attributes.to_be_bytes());
    out[RECORD_COUNT_AT..RECORD_COUNT_AT + 4].copy_from_slice(&(kept.len() as i32).to_be_bytes());
    if !header.is_log_append_time() && header.base_timestamp >= 0 {
        let max_delta = kept.iter().map(|r| r.timestamp_delta).max().unwrap_or(0);
        let max_timestamp = header.base_timestamp.saturating_add(max_delta);
        out[MAX_TIMESTAMP_AT..MAX_TIMESTAMP_AT + 8].copy_from_slice(&max_timestamp.to_be_bytes());
    }
    let crc = crc32c::crc32c(&out[ATTRIBUTES_AT..]);
    out[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
    Ok(Filtered::Rewritten(out, removed))
}

fn corrupt(path: &Path, position: u64, reason: String) -> LogError {
    LogError::Corrupt {
        path: path.to_path_buf(),
        position,
        reason,
    }
}

/// What the cleaner knows of transactions when planning: per producer, the first offset
/// of its ongoing transaction and the ranges of its aborted ones.
#[derive(Debug, Default)]
struct TxnView {
    ongoing: HashMap<i64, i64>,
    aborted: HashMap<i64, Vec<(i64, i64)>>,
}

/// Where a batch stands with respect to transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxnStatus {
    /// Not transactional, or of a committed transaction: an ordinary batch.
    Committed,
    /// Of an aborted transaction: its records go.
    Aborted,
    /// Of a transaction still open: kept, and out of the offset map.
    Undecided,
}

impl TxnView {
    fn status(&self, header: &BatchHeader) -> TxnStatus {
        if !header.is_transactional() || header.is_control() {
            return TxnStatus::Committed;
        }
        let offset = header.base_offset;
        if self
            .aborted
            .get(&header.producer_id)
            .is_some_and(|ranges| ranges.iter().any(|(f, l)| *f <= offset && offset <= *l))
        {
            return TxnStatus::Aborted;
        }
        if self
            .ongoing
            .get(&header.producer_id)
            .is_some_and(|first| offset >= *first)
        {
            return TxnStatus::Undecided;
        }
        TxnStatus::Committed
    }
}

/// Adds every keyed record of `segment` to `map` (not those of aborted or undecided
/// transactions); every batch read goes through `throttle`.
fn add_to_map(
    segment: &SegmentSnapshot,
    txns: &TxnView,
    map: &mut OffsetMap,
    throttle: &mut CleanerThrottle,
) -> Result<(), LogError> {
    segment.for_each_batch(|position, bytes| {
        throttle.observe(bytes.len());
        let header = BatchHeader::parse(bytes);
        if header.is_control() || txns.status(&header) != TxnStatus::Committed {
            return Ok(());
        }
        let fail = |reason: String| corrupt(segment.log_path(), position, reason);
        let Some(records) = batch_records(bytes, &header).map_err(fail)? else {
            // Kept whole when cleaning; leaving its keys out only keeps more.
            return Ok(());
        };
        for r in parse_records(&records, header.record_count).map_err(fail)? {
            if let Some(key) = r.key {
                map.put(key, header.base_offset + i64::from(r.offset_delta));
            }
        }
        Ok(())
    })
}

/// What cleaning one segment produced.
enum SegmentOutcome {
    /// Nothing to remove, or the copy would be too large: the segment stays.
    Unchanged,
    /// A compacted copy, fsynced, at `path`, of `bytes` bytes.
    Rewritten {
        path: PathBuf,
        bytes: u64,
        records_removed: u64,
    },
}

/// The keep rule of the module doc, for one record at `offset` in a batch with `header`.
struct Rules<'a> {
    map: &'a OffsetMap,
    txns: &'a TxnView,
    now_ms: i64,
    delete_retention_ms: i64,
}

impl Rules<'_> {
    fn keep(&self, header: &BatchHeader, offset: i64, record: &RecordView<'_>) -> bool {
        match self.txns.status(header) {
            TxnStatus::Aborted => return false,
            // Not reached: cleanable segments end before any open transaction.
            TxnStatus::Undecided => return true,
            TxnStatus::Committed => {}
        }
        let Some(key) = record.key else {
            return false;
        };
        if self.map.get(key).is_some_and(|latest| latest > offset) {
            return false;
        }
        if record.value.is_none() {
            let ts = header.max_timestamp;
            return !(ts >= 0 && self.now_ms.saturating_sub(ts) > self.delete_retention_ms);
        }
        true
    }
}

/// Writes the compacted copy of `segment` to `<base>.log.cleaned` in `dir` (removed again
/// when nothing changes or on error).
fn clean_segment(
    dir: &Path,
    segment: &SegmentSnapshot,
    rules: &Rules<'_>,
    throttle: &mut CleanerThrottle,
) -> Result<SegmentOutcome, LogError> {
    let path = cleaned_path_of(dir, segment.base_offset, "log");
    let result = write_cleaned(segment, rules, throttle, &path);
    match result {
        Ok(SegmentOutcome::Unchanged) | Err(_) => {
            remove_if_exists(&path)?;
        }
        Ok(SegmentOutcome::Rewritten { .. }) => {}
    }
    result
}

fn write_cleaned(
    segment: &SegmentSnapshot,
    rules: &Rules<'_>,
    throttle: &mut CleanerThrottle,
    path: &Path,
) -> Result<SegmentOutcome, LogError> {
    let file = File::create(path).map_err(io_error("create", path))?;
    let mut out = BufWriter::new(file);
    let mut written = 0u64;
    let mut records_removed = 0u64;
    let mut too_big = false;
    segment.for_each_batch(|position, bytes| {
        throttle.observe(bytes.len());
        let header = BatchHeader::parse(bytes);
        let filtered = filter_batch(bytes, &header, |offset, r| rules.keep(&header, offset, r))
            .map_err(|reason| corrupt(segment.log_path(), position, reason))?;
        let keep: &[u8] = match &filtered {
            Filtered::Unchanged => bytes,
            Filtered::Dropped(n) => {
                records_removed += n;
                &[]
            }
            Filtered::Rewritten(new, n) => {
                records_removed += n;
                new
            }
        };
        if written + keep.len() as u64 > MAX_SEGMENT_BYTES {
            too_big = true;
        }
        if !too_big {
            out.write_all(keep).map_err(io_error("write", path))?;
            written += keep.len() as u64;
        }
        Ok(())
    })?;
    if too_big {
        tracing::warn!(
            segment = %segment.log_path().display(),
            "compacted copy would exceed 2 GiB (decompressed batches); segment left as it is"
        );
        return Ok(SegmentOutcome::Unchanged);
    }
    if records_removed == 0 {
        return Ok(SegmentOutcome::Unchanged);
    }
    let file = out
        .into_inner()
        .map_err(|e| io_error("write", path)(e.into_error()))?;
    file.sync_all().map_err(io_error("fsync", path))?;
    Ok(SegmentOutcome::Rewritten {
        path: path.to_path_buf(),
        bytes: written,
        records_removed,
    })
}

/// Removes the cleaner's files of the segment at `base_offset` (best effort: a leftover
/// is removed when the log is next opened).
fn remove_cleaned_files(dir: &Path, base_offset: i64) {
    for extension in ["log", "index", "timeindex"] {
        let path = cleaned_path_of(dir, base_offset, extension);
        if let Err(e) = remove_if_exists(&path) {
            tracing::warn!(error = %e, "could not remove the cleaner's file");
        }
    }
}

/// Kafka's `log.cleaner.io.max.bytes.per.second`: bounds the rate at which
/// [`CompactionPlan::prepare`] reads segment bytes (offset map and cleaning passes
/// together) by sleeping the thread that runs it, which holds no lock meanwhile. Reading
/// never gets ahead of the rate by more than `THROTTLE_MIN_SLEEP`; time spent not reading
/// is credited for at most `THROTTLE_MAX_CREDIT` (Kafka's `Throttler` checks every
/// 300 ms, so a run shorter than that is not throttled at all there; here even a small run
/// keeps to the rate, which is also what lets a test make a compaction long). One throttle
/// is meant to be shared by the compactions a cleaner runs in turn.
#[derive(Debug)]
pub struct CleanerThrottle {
    max_bytes_per_second: f64,
    period_start: Instant,
    bytes_in_period: u64,
}

/// The shortest sleep [`CleanerThrottle`] takes (shorter debts wait for the next batch).
pub(super) const THROTTLE_MIN_SLEEP: Duration = Duration::from_millis(10);
/// The most idle time [`CleanerThrottle`] credits to later reads.
pub(super) const THROTTLE_MAX_CREDIT: Duration = Duration::from_millis(300);

impl CleanerThrottle {
    /// A throttle at `max_bytes_per_second` (Kafka's default, `f64::MAX`, never sleeps; a
    /// value that is not a positive number is taken as that default — the config registry
    /// refuses such values before they get here).
    pub fn new(max_bytes_per_second: f64) -> CleanerThrottle {
        let max_bytes_per_second = if max_bytes_per_second > 0.0 {
            max_bytes_per_second
        } else {
            f64::MAX
        };
        CleanerThrottle {
            max_bytes_per_second,
            period_start: Instant::now(),
            bytes_in_period: 0,
        }
    }

    /// No limit (Kafka's default).
    pub fn unlimited() -> CleanerThrottle {
        CleanerThrottle::new(f64::MAX)
    }

    /// Counts `bytes` just read and sleeps until reading them was allowed.
    fn observe(&mut self, bytes: usize) {
        self.bytes_in_period += bytes as u64;
        let elapsed_secs = self.period_start.elapsed().as_secs_f64();
        let allowed_at_secs = self.bytes_in_period as f64 / self.max_bytes_per_second;
        let ahead_secs = allowed_at_secs - elapsed_secs;
        if ahead_secs >= THROTTLE_MIN_SLEEP.as_secs_f64() {
            // At most an hour per batch: even a 1 byte/s limit and a 2 GiB batch end.
            std::thread::sleep(Duration::from_secs_f64(ahead_secs.min(3600.0)));
        } else if -ahead_secs > THROTTLE_MAX_CREDIT.as_secs_f64() {
            self.period_start = Instant::now();
            self.bytes_in_period = 0;
        }
    }
}

/// Step (a) of a compaction, taken by [`PartitionLog::plan_compaction`] under the
/// partition's lock: whether one is due, and if so a snapshot of every segment (the
/// closed ones to clean, and all of them as the offset map's input, each up to its size
/// then). [`CompactionPlan::prepare`] does the expensive part from it with no lock held.
#[derive(Debug)]
pub struct CompactionPlan {
    dir: PathBuf,
    now_ms: i64,
    delete_retention_ms: i64,
    index_interval_bytes: u32,
    /// Every segment when planned, oldest first; empty when no compaction is due.
    segments: Vec<SegmentSnapshot>,
    /// `segments[..cleanable]` are cleaned (at least one when due).
    cleanable: usize,
    stats: CompactionStats,
    /// Transactions when planned.
    txns: TxnView,
}

impl CompactionPlan {
    /// Whether a cleaning pass is due (see [`PartitionLog::compact`]); when not,
    /// [`CompactionPlan::prepare`] and [`PartitionLog::install_compaction`] do nothing.
    pub fn is_due(&self) -> bool {
        self.cleanable > 0
    }

    /// The dirty ratio, the bytes to clean and the checkpoint when planned.
    pub fn stats(&self) -> &CompactionStats {
        &self.stats
    }

    /// Step (b), run with no lock on the partition: builds the offset map over every
    /// planned segment and writes the compacted copy of each cleanable one, with its
    /// indexes, under `.cleaned` names (fsynced), reading at most as fast as `throttle`
    /// allows. Touches none of the log's own files, so reads and appends go on meanwhile;
    /// records appended after planning are not in the map (they only keep more until the
    /// next run).
    ///
    /// Errors: `Corrupt` (bad data in a planned segment), `Io`; the files written so far
    /// are removed and the log is as it was.
    pub fn prepare(self, throttle: &mut CleanerThrottle) -> Result<PreparedCompaction, LogError> {
        let mut prepared = PreparedCompaction {
            plan: self,
            copies: Vec::new(),
            full_at: None,
        };
        if !prepared.plan.is_due() {
            return Ok(prepared);
        }
        let plan = &prepared.plan;
        let mut map = OffsetMap::default();
        for segment in &plan.segments {
            add_to_map(segment, &plan.txns, &mut map, throttle)?;
        }
        let rules = Rules {
            map: &map,
            txns: &plan.txns,
            now_ms: plan.now_ms,
            delete_retention_ms: plan.delete_retention_ms,
        };
        let mut copies = Vec::with_capacity(plan.cleanable);
        for (i, segment) in plan.segments[..plan.cleanable].iter().enumerate() {
            let copy = match clean_segment(&plan.dir, segment, &rules, throttle)? {
                SegmentOutcome::Unchanged => PreparedSegment::Unchanged,
                SegmentOutcome::Rewritten {
                    path,
                    bytes,
                    records_removed,
                } if bytes == 0 && i > 0 => {
                    remove_if_exists(&path)?;
                    PreparedSegment::Emptied { records_removed }
                }
                SegmentOutcome::Rewritten {
                    path,
                    records_removed,
                    ..
                } => {
                    let opened = Segment::open_cleaned(
                        &plan.dir,
                        &path,
                        segment.base_offset,
                        segment.next_offset,
                        plan.index_interval_bytes,
                        plan.now_ms,
                    );
                    let cleaned = match opened {
                        Ok(cleaned) => cleaned,
                        Err(e) => {
                            remove_cleaned_files(&plan.dir, segment.base_offset);
                            return Err(e);
                        }
                    };
                    PreparedSegment::Rewritten {
                        copy: CleanedCopy {
                            dir: plan.dir.clone(),
                            base_offset: segment.base_offset,
                            segment: Some(Box::new(cleaned)),
                        },
                        records_removed,
                    }
                }
            };
            copies.push(copy);
        }
        prepared.copies = copies;
        prepared.full_at = map.full_at;
        Ok(prepared)
    }
}

/// A compacted copy of one segment on disk under its `.cleaned` names; its files are
/// removed when it is dropped without having been installed.
#[derive(Debug)]
struct CleanedCopy {
    dir: PathBuf,
    base_offset: i64,
    /// `None` once installed. Boxed: a `Segment` is large beside the other outcomes.
    segment: Option<Box<Segment>>,
}

impl CleanedCopy {
    fn into_segment(mut self) -> Segment {
        *self
            .segment
            .take()
            .expect("a prepared copy is installed once")
    }
}

impl Drop for CleanedCopy {
    fn drop(&mut self) {
        if self.segment.take().is_some() {
            remove_cleaned_files(&self.dir, self.base_offset);
        }
    }
}

/// What step (b) prepared for one cleanable segment.
#[derive(Debug)]
enum PreparedSegment {
    /// Nothing to remove: the segment stays.
    Unchanged,
    /// Every record goes: the segment is deleted (never the first one, which is rewritten
    /// empty instead so the log start offset stays).
    Emptied { records_removed: u64 },
    /// A compacted copy to swap in.
    Rewritten {
        copy: CleanedCopy,
        records_removed: u64,
    },
}

/// Step (b)'s result, for [`PartitionLog::install_compaction`]. Dropping it without
/// installing removes the prepared files.
#[derive(Debug)]
pub struct PreparedCompaction {
    plan: CompactionPlan,
    /// One per cleanable segment, in order.
    copies: Vec<PreparedSegment>,
    /// The first offset whose key did not fit the offset map.
    full_at: Option<i64>,
}

impl PreparedCompaction {
    /// The plan it was prepared from.
    pub fn plan(&self) -> &CompactionPlan {
        &self.plan
    }
}

/// The checkpoint in `dir`, if the file exists and holds an offset (a bad file is
/// ignored with a warning: the next run then treats the whole log as dirty).
pub(crate) fn read_checkpoint(dir: &Path) -> Result<Option<i64>, LogError> {
    let path = dir.join(CHECKPOINT_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => match text.trim().parse::<i64>() {
            Ok(offset) if offset >= 0 => Ok(Some(offset)),
            _ => {
                tracing::warn!(file = %path.display(), "unreadable cleaner checkpoint; ignored");
                Ok(None)
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error("read", &path)(e)),
    }
}

fn write_checkpoint(dir: &Path, offset: i64) -> Result<(), LogError> {
    let path = dir.join(CHECKPOINT_FILE);
    let tmp = dir.join(format!("{CHECKPOINT_FILE}.tmp"));
    std::fs::write(&tmp, format!("{offset}\n")).map_err(io_error("write", &tmp))?;
    std::fs::rename(&tmp, &path).map_err(io_error("rename", &tmp))
}

impl PartitionLog {
    /// Compacts the log once if it is due (Kafka's `LogCleaner`; see the module doc of
    /// `log::compact` for the rules): [`PartitionLog::plan_compaction`],
    /// [`CompactionPlan::prepare`] without a throttle and
    /// [`PartitionLog::install_compaction`] in one go, for a caller that holds the log
    /// exclusively anyway. `now_ms` is the wall clock, used for `delete.retention.ms` and
    /// `min.compaction.lag.ms`.
    ///
    /// Due when `cleanup.policy` has `compact` and, over the cleanable closed segments
    /// (all closed ones up to the first with a record newer than `min.compaction.lag.ms`
    /// or reaching the first offset of an ongoing transaction),
    /// the bytes at or above the cleaner checkpoint are at least
    /// `min.cleanable.dirty.ratio` of the total. Then every cleanable segment is rewritten
    /// against an offset map of the whole log (active segment included) and swapped in, and
    /// the checkpoint moves to the first segment not cleaned. Offsets never change; the
    /// log start and end offsets stay; reads skip the gaps.
    ///
    /// Errors: `Corrupt` (bad data found; the run stops, no segment is changed), `Io`.
    pub fn compact(&mut self, now_ms: i64) -> Result<CompactionStats, LogError> {
        let plan = self.plan_compaction(now_ms);
        let prepared = plan.prepare(&mut CleanerThrottle::unlimited())?;
        self.install_compaction(prepared)
    }

    /// Step (a) of a compaction, cheap, under the partition's exclusive lock: decides
    /// whether one is due (see [`PartitionLog::compact`]) and snapshots what step (b),
    /// [`CompactionPlan::prepare`], reads. `now_ms` is the wall clock.
    pub fn plan_compaction(&mut self, now_ms: i64) -> CompactionPlan {
        let leo = self.log_end_offset();
        if self.first_dirty_offset < self.log_start_offset || self.first_dirty_offset > leo {
            self.first_dirty_offset = self.log_start_offset;
        }
        let mut plan = CompactionPlan {
            dir: self.dir.clone(),
            now_ms,
            delete_retention_ms: self.config.delete_retention_ms,
            index_interval_bytes: self.config.index_interval_bytes,
            segments: Vec::new(),
            cleanable: 0,
            stats: CompactionStats {
                first_dirty_offset: self.first_dirty_offset,
                ..CompactionStats::default()
            },
            txns: TxnView::default(),
        };
        if !self.config.cleanup_policy.compact {
            return plan;
        }
        let ongoing = self.ongoing_txns();
        // Kafka cleans only below the first unstable offset.
        let first_unstable = ongoing.values().copied().min().unwrap_or(i64::MAX);
        let lag_ms = self.config.min_compaction_lag_ms;
        let closed = self.segments.len() - 1;
        let mut end = 0;
        while end < closed {
            let newest_ms = self.segments[end].max_timestamp_ms;
            if lag_ms > 0 && newest_ms >= 0 && now_ms.saturating_sub(newest_ms) < lag_ms {
                break;
            }
            if self.segments[end].next_offset > first_unstable {
                break;
            }
            end += 1;
        }
        let cleanable = &self.segments[..end];
        let total: u64 = cleanable.iter().map(|s| s.size_bytes).sum();
        let dirty: u64 = cleanable
            .iter()
            .filter(|s| s.next_offset > self.first_dirty_offset)
            .map(|s| s.size_bytes)
            .sum();
        if total == 0 || dirty == 0 {
            return plan;
        }
        plan.stats.dirty_ratio = dirty as f64 / total as f64;
        if plan.stats.dirty_ratio < self.config.min_cleanable_dirty_ratio {
            return plan;
        }
        let aborted = match self.all_aborted_txns() {
            Ok(aborted) => aborted,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot read the aborted transaction indexes; compaction skipped");
                return plan;
            }
        };
        for entry in aborted {
            plan.txns
                .aborted
                .entry(entry.producer_id)
                .or_default()
                .push((entry.first_offset, entry.last_offset));
        }
        // Each snapshot holds its `.log` open until the plan is done (outside the
        // descriptor cache's bound: one partition's segments at a time).
        let snapshots = match self
            .segments
            .iter()
            .map(Segment::snapshot)
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(snapshots) => snapshots,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot open the segments to compact; compaction skipped");
                return plan;
            }
        };
        plan.txns.ongoing = ongoing;
        plan.stats.bytes_before = total;
        plan.segments = snapshots;
        plan.cleanable = end;
        plan
    }

    /// Step (c), short, under the partition's exclusive lock: if the planned segments are
    /// still the ones in the log (same segments, the cleanable ones unchanged, none of the
    /// others cut; `cleanup.policy` still has `compact`), swaps the prepared copies in,
    /// oldest first, crash-safely (see the module doc), deletes the emptied ones and moves
    /// the cleaner checkpoint. If retention, truncation, another compaction or a config
    /// change got there first, it changes nothing and returns stats with `cleaned: false`
    /// and `discarded: true` (the prepared files are removed).
    ///
    /// Errors: `Io` (the segments swapped before it are complete compactions).
    pub fn install_compaction(
        &mut self,
        prepared: PreparedCompaction,
    ) -> Result<CompactionStats, LogError> {
        let mut prepared = prepared;
        let plan = &prepared.plan;
        let mut stats = plan.stats.clone();
        if !plan.is_due() {
            return Ok(stats);
        }
        if !self.plan_still_holds(plan) {
            tracing::info!(
                dir = %self.dir.display(),
                "log changed while a compaction was prepared (retention, truncation, \
                 another compaction or a config change); discarded"
            );
            stats.discarded = true;
            stats.first_dirty_offset = self.first_dirty_offset;
            return Ok(stats);
        }
        let mut checkpoint = plan.segments[plan.cleanable].base_offset;
        let copies = std::mem::take(&mut prepared.copies);
        let mut i = 0;
        for copy in copies {
            match copy {
                PreparedSegment::Unchanged => {
                    stats.bytes_after += self.segments[i].size_bytes;
                    i += 1;
                }
                PreparedSegment::Emptied { records_removed } => {
                    assert!(i > 0, "the first segment is rewritten, never deleted");
                    stats.records_removed += records_removed;
                    let emptied = self.segments.remove(i);
                    self.segments[i - 1].next_offset = emptied.next_offset;
                    emptied.delete_files()?;
                    stats.segments_deleted += 1;
                }
                PreparedSegment::Rewritten {
                    copy,
                    records_removed,
                } => {
                    stats.records_removed += records_removed;
                    let cleaned = copy.into_segment();
                    let bytes = cleaned.size_bytes;
                    self.segments[i].replace_with(cleaned)?;
                    stats.bytes_after += bytes;
                    stats.segments_rewritten += 1;
                    i += 1;
                }
            }
        }
        if let Some(full_at) = prepared.full_at {
            tracing::warn!(
                dir = %self.dir.display(),
                offset = full_at,
                "cleaner offset map full; keys from here on were not deduplicated"
            );
            checkpoint = checkpoint.min(full_at);
        }
        self.first_dirty_offset = checkpoint;
        write_checkpoint(&self.dir, checkpoint)?;
        stats.first_dirty_offset = checkpoint;
        stats.cleaned = true;
        Ok(stats)
    }

    /// Whether the segments `plan` read are still the log's: the same `Segment` values
    /// (ids) at the same places, the cleanable ones with the size and offsets planned, the
    /// others (the active one then) at least as long as planned (appends only add).
    fn plan_still_holds(&self, plan: &CompactionPlan) -> bool {
        self.config.cleanup_policy.compact
            && plan.segments.iter().enumerate().all(|(i, planned)| {
                self.segments.get(i).is_some_and(|s| {
                    s.id == planned.id
                        && s.base_offset == planned.base_offset
                        && if i < plan.cleanable {
                            s.size_bytes == planned.size_bytes
                                && s.next_offset == planned.next_offset
                        } else {
                            s.size_bytes >= planned.size_bytes
                        }
                })
            })
    }

    /// The cleaner checkpoint: offsets below it were compacted by the last run.
    pub fn first_dirty_offset(&self) -> i64 {
        self.first_dirty_offset
    }
}
