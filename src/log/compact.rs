//! Log compaction (`cleanup.policy=compact`): keep only the latest record of each key, as
//! Kafka's `LogCleaner` does.
//!
//! Owns: the offset map (key → latest offset), the rewrite of closed segments with only
//! the records that survive, the swap of a rewritten segment into place, the dirty-ratio
//! trigger and the cleaner checkpoint (`cleaner-offset-checkpoint` in the partition
//! directory: the first offset not yet compacted). Never does: touch the active segment,
//! change the offset of a record, decide when to run (the replica manager's retention tick
//! calls [`PartitionLog::compact`]), or anything about requests.
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
//! - control batches are kept as they are (weir refuses them on produce; none are expected).
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
//! Crash safety: each rewritten segment is written to `<base>.log.cleaned` and fsynced;
//! then its old indexes are removed, the `.cleaned` file is renamed over `<base>.log` (one
//! atomic rename) and the indexes are rebuilt from it (written to temp files, renamed).
//! Segments are swapped oldest first, so after a crash the compacted segments are a prefix
//! and a tombstone never goes before the older values it hides. On open, leftover
//! `.cleaned` (and `.swap`, never written by weir) files are removed and missing indexes
//! rebuilt. A segment that compaction empties is deleted (its offsets become a gap),
//! except the first one, which stays empty so the log start offset does not move.
//!
//! Limits: the offset map holds at most [`OFFSET_MAP_MAX_BYTES`] of keys (Kafka's
//! `log.cleaner.dedupe.buffer.size` default); keys seen after it is full are simply kept
//! everywhere. A batch is decompressed into at most [`MAX_DECOMPRESSED_BATCH_BYTES`]; a
//! larger one is kept whole. Corrupt data (CRC, header or record layout) aborts the run
//! with [`LogError::Corrupt`] before anything of the bad segment is swapped; segments
//! already swapped are valid compactions on their own. The run holds the partition's lock
//! (the caller's `&mut`): produce and fetch on that partition wait for it.
//!
//! Single node: the offset map covers up to the log end offset, which is the high
//! watermark here. With replication it must stop at the high watermark, or an
//! uncommitted record that is later truncated could have removed the value it replaced.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::batch::{
    read_varint, read_varlong, BatchHeader, Compression, ATTRIBUTES_AT, BATCH_HEADER_BYTES,
    BATCH_LENGTH_AT, COMPRESSION_MASK, CRC_AT, LOG_OVERHEAD_BYTES, MAX_TIMESTAMP_AT,
    RECORD_COUNT_AT,
};
use super::codec::{self, DecompressError};
use super::segment::{io_error, remove_if_exists, Segment};
use super::{LogError, PartitionLog};

/// The cleaner checkpoint file in the partition directory: one decimal offset, the first
/// offset not yet compacted (Kafka keeps one such file per log dir).
pub(crate) const CHECKPOINT_FILE: &str = "cleaner-offset-checkpoint";

/// Most bytes of keys (plus a per-entry overhead of [`MAP_ENTRY_OVERHEAD_BYTES`]) the
/// offset map holds: Kafka's `log.cleaner.dedupe.buffer.size` default, 128 MiB.
pub const OFFSET_MAP_MAX_BYTES: usize = 128 << 20;
/// Bytes counted per offset map entry on top of its key (hash table slot and offset).
const MAP_ENTRY_OVERHEAD_BYTES: usize = 48;
/// Largest decompressed records section the cleaner handles for one batch (8 × an 8 MiB
/// `max.message.bytes`); a batch beyond it is kept whole and its keys left out of the map.
pub const MAX_DECOMPRESSED_BATCH_BYTES: usize = 64 << 20;
/// A rewritten segment must stay addressable by 32-bit index positions.
const MAX_SEGMENT_BYTES: u64 = i32::MAX as u64;

/// What one [`PartitionLog::compact`] call did.
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

/// One record, as much of it as the cleaner needs.
#[derive(Debug, Clone, Copy)]
struct RecordView<'a> {
    offset_delta: i32,
    timestamp_delta: i64,
    key: Option<&'a [u8]>,
    tombstone: bool,
    /// The whole record as stored: length varint and body.
    raw: &'a [u8],
}

/// Parses the records section of a batch (`records` = decompressed bytes), `count`
/// records. Errors: what is malformed, for [`LogError::Corrupt`].
fn parse_records(records: &[u8], count: i32) -> Result<Vec<RecordView<'_>>, String> {
    let mut out = Vec::new();
    let mut cursor = records;
    for index in 0..count {
        let start = records.len() - cursor.len();
        let fail = |what: &str| format!("record {index}: {what}");
        let length = read_varint(&mut cursor).ok_or_else(|| fail("bad length varint"))?;
        let length = usize::try_from(length).map_err(|_| fail("negative length"))?;
        let mut body = cursor
            .get(..length)
            .ok_or_else(|| fail("length runs past the records"))?;
        cursor = &cursor[length..];
        let raw = &records[start..records.len() - cursor.len()];
        body = body.get(1..).ok_or_else(|| fail("no attributes"))?;
        let timestamp_delta = read_varlong(&mut body).ok_or_else(|| fail("bad timestampDelta"))?;
        let offset_delta = read_varint(&mut body).ok_or_else(|| fail("bad offsetDelta"))?;
        let key = nullable_bytes(&mut body).ok_or_else(|| fail("bad key"))?;
        let value = nullable_bytes(&mut body).ok_or_else(|| fail("bad value"))?;
        out.push(RecordView {
            offset_delta,
            timestamp_delta,
            key,
            tombstone: value.is_none(),
            raw,
        });
    }
    if !cursor.is_empty() {
        return Err(format!("{} bytes after record {count}", cursor.len()));
    }
    Ok(out)
}

/// A varint length (-1 = null) and that many bytes.
fn nullable_bytes<'a>(cursor: &mut &'a [u8]) -> Option<Option<&'a [u8]>> {
    let length = read_varint(cursor)?;
    if length == -1 {
        return Some(None);
    }
    let length = usize::try_from(length).ok()?;
    let bytes = cursor.get(..length)?;
    *cursor = &cursor[length..];
    Some(Some(bytes))
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

/// Adds every keyed record of `segment` to `map`.
fn add_to_map(segment: &Segment, map: &mut OffsetMap) -> Result<(), LogError> {
    segment.for_each_batch(|position, bytes| {
        let header = BatchHeader::parse(bytes);
        if header.is_control() {
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
    now_ms: i64,
    delete_retention_ms: i64,
}

impl Rules<'_> {
    fn keep(&self, header: &BatchHeader, offset: i64, record: &RecordView<'_>) -> bool {
        let Some(key) = record.key else {
            return false;
        };
        if self.map.get(key).is_some_and(|latest| latest > offset) {
            return false;
        }
        if record.tombstone {
            let ts = header.max_timestamp;
            return !(ts >= 0 && self.now_ms.saturating_sub(ts) > self.delete_retention_ms);
        }
        true
    }
}

/// Writes the compacted copy of `segment` to `<base>.log.cleaned` (removed again when
/// nothing changes or on error).
fn clean_segment(segment: &Segment, rules: &Rules<'_>) -> Result<SegmentOutcome, LogError> {
    let mut cleaned = segment.log_path().as_os_str().to_owned();
    cleaned.push(".cleaned");
    let path = PathBuf::from(cleaned);
    let result = write_cleaned(segment, rules, &path);
    match result {
        Ok(SegmentOutcome::Unchanged) | Err(_) => {
            remove_if_exists(&path)?;
        }
        Ok(SegmentOutcome::Rewritten { .. }) => {}
    }
    result
}

fn write_cleaned(
    segment: &Segment,
    rules: &Rules<'_>,
    path: &Path,
) -> Result<SegmentOutcome, LogError> {
    let file = File::create(path).map_err(io_error("create", path))?;
    let mut out = BufWriter::new(file);
    let mut written = 0u64;
    let mut records_removed = 0u64;
    let mut too_big = false;
    segment.for_each_batch(|position, bytes| {
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

fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error("fsync", dir))
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
    /// `log::compact` for the rules). `now_ms` is the wall clock, used for
    /// `delete.retention.ms` and `min.compaction.lag.ms`.
    ///
    /// Due when `cleanup.policy` has `compact` and, over the cleanable closed segments
    /// (all closed ones up to the first with a record newer than `min.compaction.lag.ms`),
    /// the bytes at or above the cleaner checkpoint are at least
    /// `min.cleanable.dirty.ratio` of the total. Then every cleanable segment is rewritten
    /// against an offset map of the whole log (active segment included) and swapped in, and
    /// the checkpoint moves to the first segment not cleaned. Offsets never change; the
    /// log start and end offsets stay; reads skip the gaps.
    ///
    /// Errors: `Corrupt` (bad data found; the run stops, nothing of that segment is
    /// changed), `Io`.
    pub fn compact(&mut self, now_ms: i64) -> Result<CompactionStats, LogError> {
        let leo = self.log_end_offset();
        if self.first_dirty_offset < self.log_start_offset || self.first_dirty_offset > leo {
            self.first_dirty_offset = self.log_start_offset;
        }
        let mut stats = CompactionStats {
            first_dirty_offset: self.first_dirty_offset,
            ..CompactionStats::default()
        };
        if !self.config.cleanup_policy.compact {
            return Ok(stats);
        }
        let lag_ms = self.config.min_compaction_lag_ms;
        let closed = self.segments.len() - 1;
        let mut end = 0;
        while end < closed {
            let newest_ms = self.segments[end].max_timestamp_ms;
            if lag_ms > 0 && newest_ms >= 0 && now_ms.saturating_sub(newest_ms) < lag_ms {
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
            return Ok(stats);
        }
        stats.dirty_ratio = dirty as f64 / total as f64;
        if stats.dirty_ratio < self.config.min_cleanable_dirty_ratio {
            return Ok(stats);
        }
        stats.bytes_before = total;

        let mut map = OffsetMap::default();
        for segment in &self.segments {
            add_to_map(segment, &mut map)?;
        }
        let rules = Rules {
            map: &map,
            now_ms,
            delete_retention_ms: self.config.delete_retention_ms,
        };
        let mut i = 0;
        while i < end {
            match clean_segment(&self.segments[i], &rules)? {
                SegmentOutcome::Unchanged => {
                    stats.bytes_after += self.segments[i].size_bytes;
                    i += 1;
                }
                SegmentOutcome::Rewritten {
                    path,
                    bytes,
                    records_removed,
                } => {
                    stats.records_removed += records_removed;
                    if bytes == 0 && i > 0 {
                        remove_if_exists(&path)?;
                        let emptied = self.segments.remove(i);
                        self.segments[i - 1].next_offset = emptied.next_offset;
                        emptied.delete_files()?;
                        stats.segments_deleted += 1;
                        end -= 1;
                    } else {
                        self.swap_in(i, &path)?;
                        stats.bytes_after += bytes;
                        stats.segments_rewritten += 1;
                        i += 1;
                    }
                }
            }
        }
        let mut checkpoint = self.segments[end].base_offset;
        if let Some(full_at) = map.full_at {
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

    /// Replaces closed segment `i` by the compacted copy at `cleaned` (see the module doc
    /// for the order of steps and what a crash between them leaves).
    fn swap_in(&mut self, i: usize, cleaned: &Path) -> Result<(), LogError> {
        let (base, next) = (self.segments[i].base_offset, self.segments[i].next_offset);
        let log_path = self.segments[i].log_path().to_path_buf();
        for extension in ["index", "timeindex"] {
            remove_if_exists(&super::segment::file_path(&self.dir, base, extension))?;
        }
        sync_dir(&self.dir)?;
        std::fs::rename(cleaned, &log_path).map_err(io_error("rename", cleaned))?;
        sync_dir(&self.dir)?;
        let now_ms = self.segments[i].created_ms;
        self.segments[i] = Segment::open_rewritten(
            &self.dir,
            base,
            next,
            self.config.index_interval_bytes,
            now_ms,
        )?;
        Ok(())
    }

    /// The cleaner checkpoint: offsets below it were compacted by the last run.
    pub fn first_dirty_offset(&self) -> i64 {
        self.first_dirty_offset
    }
}
