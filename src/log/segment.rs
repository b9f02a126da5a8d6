//! One log segment: `<base_offset:020>.log` with its `.index`, `.timeindex` and, when it
//! holds an ABORT marker, `.txnindex` (the aborted transaction index, format in `txn.rs`).
//!
//! Owns: appending validated batches to the file (page cache, no fsync here), keeping the
//! sparse indexes up to date (one code path for append and recovery scans), positional
//! reads, scanning and truncating a torn tail, and rebuilding missing or corrupt indexes.
//! The aborted transaction index is loaded on first use (closed segments) and appended to
//! or replaced by the partition log, which decides its entries; it is deleted and fsynced
//! with the segment.
//! Never does: assign offsets, decide when to roll or delete (the partition log does),
//! producer state, or anything about requests, or hold a file descriptor of its own: its
//! files live in a [`Slot`] of the process-wide descriptor cache (`fdcache.rs`), which may
//! close them whenever the segment is idle and reopens them on the next use.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use super::batch::{
    self, BatchHeader, ValidatedBatch, ATTRIBUTES_AT, BATCH_HEADER_BYTES, MAGIC_V2,
};
use super::fdcache::{self, IndexFile, Slot};
use super::index::{self, Indexes, OffsetEntry, TimeEntry, OFFSET_ENTRY_BYTES, TIME_ENTRY_BYTES};
use super::txn::{self, AbortedTxn, TxnMarker};
use super::LogError;

/// Bytes read at a time when scanning a segment sequentially and checking CRCs.
const SCAN_CHUNK_BYTES: usize = 1 << 20;
/// Bytes read at a time when only headers are wanted (big batches: one small read each).
const HEADER_SCAN_CHUNK_BYTES: usize = 4 << 10;
/// Batches at most this large are copied into one buffer so the append is one `write`.
const SINGLE_WRITE_MAX_BYTES: usize = 64 << 10;

/// File name of a segment file: the base offset zero-padded to 20 digits, as Kafka does.
pub(crate) fn file_path(dir: &Path, base_offset: i64, extension: &str) -> PathBuf {
    dir.join(format!("{base_offset:020}.{extension}"))
}

/// A process-wide unique id for each `Segment` value made: a segment replaced by another
/// (compaction's swap, truncation's reopen) gets a new id, so a compaction planned earlier
/// can tell whether the segments it read are still the ones in the log.
fn next_segment_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

pub(crate) fn io_error(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> LogError {
    let path = path.to_path_buf();
    move |source| LogError::Io { op, path, source }
}

/// Whole stored batches as a byte range of a segment's `.log` file, to be sent as they
/// are (a Fetch response's records through `sendfile(2)`, issue 17). Holds the file open:
/// a region stays readable after its segment is deleted or replaced, and the descriptor
/// cache's bound is soft for it (`fdcache.rs`).
#[derive(Debug, Clone)]
pub struct FileRegion {
    /// The segment's `.log` file.
    pub file: Arc<File>,
    /// Byte position of the first batch in the file.
    pub position: u64,
    /// Bytes of whole batches from `position` (never 0).
    pub len: usize,
    /// Base offset of the first batch.
    pub base_offset: i64,
    /// An offset no record of the region exceeds: the last batch's last offset, or one
    /// below the batch after it (Kafka's upper bound for collecting aborted
    /// transactions, which may reach into a gap compaction left).
    pub last_offset: i64,
}

impl FileRegion {
    /// The region's bytes, copied into memory (`pread`), for a listener or a caller that
    /// cannot send the file itself.
    ///
    /// Errors: `std::io::Error` of the read; `UnexpectedEof` when the file is shorter
    /// than the region (truncated since).
    pub fn read_to_bytes(&self) -> std::io::Result<Bytes> {
        let buffer = pread_up_to(&self.file, self.position, self.len)?;
        if buffer.len() < self.len {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(Bytes::from(buffer))
    }
}

/// Up to `len` bytes of `file` from byte `position`, fewer only at the end of the file. A
/// positional read (`pread`): it moves no shared file cursor, so any number of readers
/// run at once. Reads into the vector's spare capacity (rustix's `spare_capacity`), so a
/// fetch of a MiB does not zero a MiB first as `FileExt::read_at` into an initialised
/// buffer would.
fn pread_up_to(file: &File, position: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut buffer = Vec::with_capacity(len);
    while buffer.len() < len {
        let at = position + buffer.len() as u64;
        match rustix::io::pread(file, rustix::buffer::spare_capacity(&mut buffer), at) {
            Ok(0) => break,
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    buffer.truncate(len);
    Ok(buffer)
}

/// What a recovery scan of a tail found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecoveryReport {
    /// Bytes cut from the end of the `.log` file (0 if the tail was whole).
    pub truncated_bytes: u64,
    /// Why the cut was made, if one was.
    pub reason: Option<String>,
}

/// Index-writing state of the active segment (its index files are appended to through
/// the segment's [`Slot`]).
#[derive(Debug)]
struct Writers {
    bytes_since_last_index_entry: u64,
}

#[derive(Debug)]
pub(crate) struct Segment {
    /// See [`next_segment_id`].
    pub id: u64,
    pub base_offset: i64,
    /// One past the last offset stored (for closed segments: the next segment's base).
    pub next_offset: i64,
    pub size_bytes: u64,
    /// Largest batch maxTimestamp in the segment (-1 if none) and the base offset of the
    /// first batch that reached it.
    pub max_timestamp_ms: i64,
    pub offset_of_max_timestamp: i64,
    /// maxTimestamp of the first batch (drives `segment_ms`), if it has one.
    pub first_batch_timestamp_ms: Option<i64>,
    /// When this process created or opened the segment (fallback for `segment_ms`).
    pub created_ms: i64,
    log_path: PathBuf,
    /// The segment's open files, closed by the descriptor cache when idle. A
    /// [`SegmentSnapshot`] holds the `.log`'s handle itself while it reads unlocked.
    slot: Arc<Slot>,
    dir: PathBuf,
    indexes: OnceLock<Indexes>,
    writers: Option<Writers>,
    index_interval_bytes: u64,
    /// The aborted transaction index, loaded on first use (`<base>.txnindex`).
    aborted_txns: OnceLock<Vec<AbortedTxn>>,
}

/// A batch found by a scan: its position and header, and the bytes when they were read.
struct Scanned {
    position: u64,
    header: BatchHeader,
}

/// Sequential reader over a segment file in large chunks.
struct Scanner<'a> {
    file: &'a File,
    path: &'a Path,
    position: u64,
    end: u64,
    buffer: Vec<u8>,
    buffer_start: u64,
    chunk_bytes: usize,
}

enum Step {
    Batch(Scanned),
    End,
    Torn { position: u64, reason: String },
}

impl<'a> Scanner<'a> {
    fn new(file: &'a File, path: &'a Path, position: u64, end: u64) -> Scanner<'a> {
        Scanner {
            file,
            path,
            position,
            end,
            buffer: Vec::new(),
            buffer_start: 0,
            chunk_bytes: SCAN_CHUNK_BYTES,
        }
    }

    /// Makes `[position, position + len)` available in the buffer and returns it.
    fn load(&mut self, position: u64, len: usize) -> Result<&[u8], LogError> {
        let buffered_end = self.buffer_start + self.buffer.len() as u64;
        if position < self.buffer_start || position + len as u64 > buffered_end {
            let available = (self.end - position) as usize;
            let size = len.max(self.chunk_bytes).min(available);
            self.buffer.resize(size, 0);
            self.file
                .read_exact_at(&mut self.buffer, position)
                .map_err(io_error("read", self.path))?;
            self.buffer_start = position;
        }
        let start = (position - self.buffer_start) as usize;
        Ok(&self.buffer[start..start + len])
    }

    /// Next batch; with `verify` the whole batch is read and its CRC checked.
    fn next(&mut self, verify: bool) -> Result<Step, LogError> {
        let position = self.position;
        if position == self.end {
            return Ok(Step::End);
        }
        let left = self.end - position;
        if left < BATCH_HEADER_BYTES as u64 {
            return Ok(Step::Torn {
                position,
                reason: format!("{left} bytes left, less than a batch header"),
            });
        }
        let header = BatchHeader::parse(self.load(position, BATCH_HEADER_BYTES)?);
        let total = header.total_bytes();
        if total < BATCH_HEADER_BYTES as i64 || total as u64 > left {
            return Ok(Step::Torn {
                position,
                reason: format!("batchLength {} with {left} bytes left", header.batch_length),
            });
        }
        if header.magic != MAGIC_V2 {
            return Ok(Step::Torn {
                position,
                reason: format!("magic {}", header.magic),
            });
        }
        if position > u64::from(u32::MAX) {
            return Ok(Step::Torn {
                position,
                reason: "position beyond the 4 GiB an index entry can address".into(),
            });
        }
        if header.last_offset_delta < 0 {
            return Ok(Step::Torn {
                position,
                reason: format!("lastOffsetDelta {}", header.last_offset_delta),
            });
        }
        if verify {
            let bytes = self.load(position, total as usize)?;
            let computed = crc32c::crc32c(&bytes[ATTRIBUTES_AT..]);
            if computed != header.crc {
                return Ok(Step::Torn {
                    position,
                    reason: format!("crc {:#010x} stored, {computed:#010x} computed", header.crc),
                });
            }
        }
        self.position = position + total as u64;
        Ok(Step::Batch(Scanned { position, header }))
    }
}

impl Segment {
    /// Creates an empty segment (truncating stale files of the same name).
    pub(super) fn create(
        dir: &Path,
        base_offset: i64,
        index_interval_bytes: u32,
        now_ms: i64,
    ) -> Result<Segment, LogError> {
        let log_path = file_path(dir, base_offset, "log");
        // Truncated: a stale file of the same name (a crash mid-delete) holds nothing we
        // keep. Closed at once: the descriptor cache opens it on first use.
        OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&log_path)
            .map_err(io_error("create", &log_path))?;
        remove_if_exists(&file_path(dir, base_offset, "txnindex"))?;
        let mut segment = Segment {
            id: next_segment_id(),
            base_offset,
            next_offset: base_offset,
            size_bytes: 0,
            max_timestamp_ms: -1,
            offset_of_max_timestamp: base_offset,
            first_batch_timestamp_ms: None,
            created_ms: now_ms,
            slot: fdcache::slot_for(dir, base_offset, log_path.clone()),
            log_path,
            dir: dir.to_path_buf(),
            indexes: OnceLock::new(),
            writers: None,
            index_interval_bytes: u64::from(index_interval_bytes),
            aborted_txns: OnceLock::new(),
        };
        segment.write_index_files(&Indexes::default())?;
        segment.install_indexes(Indexes::default(), 0)?;
        Ok(segment)
    }

    /// Opens a closed segment, trusting its files: reads only the file sizes and the last
    /// time index entry. An index that is missing or has a torn entry is rebuilt now by
    /// scanning the segment; deeper checks happen when the index is first loaded.
    pub(super) fn open_closed(
        dir: &Path,
        base_offset: i64,
        next_offset: i64,
        index_interval_bytes: u32,
        now_ms: i64,
    ) -> Result<Segment, LogError> {
        let mut segment =
            Segment::open_file(dir, base_offset, next_offset, index_interval_bytes, now_ms)?;
        let size_bytes = segment.size_bytes;
        let offset_path = segment.offset_index_path();
        let time_path = segment.time_index_path();
        let offset_len = file_len(&offset_path)?;
        let time_len = file_len(&time_path)?;
        let sane = matches!(offset_len, Some(n) if n % OFFSET_ENTRY_BYTES == 0)
            && matches!(time_len, Some(n) if n % TIME_ENTRY_BYTES == 0 && (n > 0 || size_bytes == 0));
        if !sane {
            tracing::warn!(
                segment = %segment.log_path.display(),
                "index missing or torn on a closed segment; rebuilding it by scanning"
            );
            let indexes = segment.rebuild_indexes()?;
            segment.write_index_files(&indexes)?;
            segment.set_max_from(&indexes);
            let _ = segment.indexes.set(indexes);
            return Ok(segment);
        }
        if let Some(len) = time_len.filter(|n| *n >= TIME_ENTRY_BYTES) {
            let file = open_existing(&time_path)?;
            let mut raw = [0u8; TIME_ENTRY_BYTES as usize];
            file.read_exact_at(&mut raw, len - TIME_ENTRY_BYTES)
                .map_err(io_error("read", &time_path))?;
            let mut ts = [0u8; 8];
            ts.copy_from_slice(&raw[..8]);
            segment.max_timestamp_ms = i64::from_be_bytes(ts);
            let relative = u32::from_be_bytes([raw[8], raw[9], raw[10], raw[11]]);
            segment.offset_of_max_timestamp = base_offset + i64::from(relative);
        }
        Ok(segment)
    }

    /// The segment's `.log` file opened, sized, with nothing else known yet (indexes not
    /// loaded, no timestamps): the common first step of [`Segment::open_closed`] and
    /// [`Segment::recover`].
    fn open_file(
        dir: &Path,
        base_offset: i64,
        next_offset: i64,
        index_interval_bytes: u32,
        now_ms: i64,
    ) -> Result<Segment, LogError> {
        let log_path = file_path(dir, base_offset, "log");
        Segment::open_path(
            dir,
            log_path,
            base_offset,
            next_offset,
            index_interval_bytes,
            now_ms,
        )
    }

    /// [`Segment::open_file`] for a `.log` at `log_path` (the cleaner's copy has another
    /// name until it is renamed into place).
    fn open_path(
        dir: &Path,
        log_path: PathBuf,
        base_offset: i64,
        next_offset: i64,
        index_interval_bytes: u32,
        now_ms: i64,
    ) -> Result<Segment, LogError> {
        let size_bytes = std::fs::metadata(&log_path)
            .map_err(io_error("open", &log_path))?
            .len();
        Ok(Segment {
            id: next_segment_id(),
            base_offset,
            next_offset,
            size_bytes,
            max_timestamp_ms: -1,
            offset_of_max_timestamp: base_offset,
            first_batch_timestamp_ms: None,
            created_ms: now_ms,
            slot: fdcache::slot_for(dir, base_offset, log_path.clone()),
            log_path,
            dir: dir.to_path_buf(),
            indexes: OnceLock::new(),
            writers: None,
            index_interval_bytes: u64::from(index_interval_bytes),
            aborted_txns: OnceLock::new(),
        })
    }

    /// Opens the last segment and recovers its tail: starts at the last consistent offset
    /// index entry (or byte 0), validates each batch (length, magic, CRC-32C, offsets
    /// increasing), truncates the file at the first bad one, and rebuilds the index tails
    /// from the scan. Start-up cost is bounded by the bytes after the last index entry.
    pub(super) fn recover(
        dir: &Path,
        base_offset: i64,
        index_interval_bytes: u32,
        now_ms: i64,
    ) -> Result<(Segment, RecoveryReport), LogError> {
        Segment::recover_indexes(dir, base_offset, index_interval_bytes, now_ms, true)
    }

    /// [`Segment::recover`]; `index_expected` false when the caller removed the indexes
    /// itself (truncation), so their absence is not worth a warning.
    fn recover_indexes(
        dir: &Path,
        base_offset: i64,
        index_interval_bytes: u32,
        now_ms: i64,
        index_expected: bool,
    ) -> Result<(Segment, RecoveryReport), LogError> {
        let mut segment =
            Segment::open_file(dir, base_offset, base_offset, index_interval_bytes, now_ms)?;
        let file_bytes = segment.size_bytes;
        let offset_path = segment.offset_index_path();
        let time_path = segment.time_index_path();
        let mut offset_entries = match index::read_offset_index(&offset_path)
            .map_err(io_error("read", &offset_path))?
        {
            Some(loaded) => loaded.entries,
            None if index_expected => {
                tracing::warn!(index = %offset_path.display(), "offset index missing; rebuilding");
                Vec::new()
            }
            None => Vec::new(),
        };
        let valid = index::valid_offset_prefix(&offset_entries, file_bytes);
        offset_entries.truncate(valid);
        let mut time_entries = index::read_time_index(&time_path)
            .map_err(io_error("read", &time_path))?
            .map(|l| l.entries)
            .unwrap_or_default();
        let valid = index::valid_time_prefix(&time_entries);
        time_entries.truncate(valid);

        let log_path_copy = segment.log_path.clone();
        // Scan from the last offset index entry; if the batch it points at is itself bad,
        // drop that entry and start from the one before.
        loop {
            let start = offset_entries.last().copied();
            let (start_position, start_relative) =
                start.map_or((0, 0), |e| (u64::from(e.position), e.relative_offset));
            let expected = base_offset + i64::from(start_relative);
            let scan_file = segment.slot.log()?;
            let mut scanner = Scanner::new(&scan_file, &log_path_copy, start_position, file_bytes);
            let first = scanner.next(true)?;
            let first_ok = match &first {
                Step::Batch(s) => start.is_none() || s.header.base_offset == expected,
                Step::End => start.is_none(),
                Step::Torn { .. } => start.is_none(),
            };
            if !first_ok {
                offset_entries.pop();
                continue;
            }
            time_entries.retain(|e| start.is_some() && e.relative_offset < start_relative);
            let mut indexes = Indexes {
                offset: offset_entries,
                time: time_entries,
            };
            if let Some(last) = indexes.time.last() {
                segment.max_timestamp_ms = last.timestamp_ms;
                segment.offset_of_max_timestamp = base_offset + i64::from(last.relative_offset);
            }
            let mut bytes_since = 0u64;
            let mut next_offset = expected;
            let mut step = first;
            let (end, reason) = loop {
                match step {
                    Step::Batch(s) => {
                        if s.header.last_offset() - base_offset > i64::from(u32::MAX) {
                            break (
                                s.position,
                                Some(format!(
                                    "batch offsets {}..={} do not fit this segment",
                                    s.header.base_offset,
                                    s.header.last_offset()
                                )),
                            );
                        }
                        if s.header.base_offset < next_offset {
                            break (
                                s.position,
                                Some(format!(
                                    "batch base offset {} below expected {next_offset}",
                                    s.header.base_offset
                                )),
                            );
                        }
                        segment.track_batch(&mut indexes, &mut bytes_since, &s)?;
                        next_offset = s.header.last_offset() + 1;
                    }
                    Step::End => break (file_bytes, None),
                    Step::Torn { position, reason } => break (position, Some(reason)),
                }
                step = scanner.next(true)?;
            };
            drop(scanner);
            let truncated_bytes = file_bytes - end;
            if truncated_bytes > 0 {
                segment
                    .slot
                    .log()?
                    .set_len(end)
                    .map_err(io_error("truncate", &segment.log_path))?;
                tracing::warn!(
                    segment = %segment.log_path.display(),
                    truncated_bytes,
                    from_offset = next_offset,
                    from_position = end,
                    reason = reason.as_deref().unwrap_or(""),
                    "log recovery cut a torn or corrupt tail"
                );
            }
            segment.size_bytes = end;
            segment.next_offset = next_offset;
            segment.first_batch_timestamp_ms = segment.first_batch_timestamp()?;
            // Rewrite both index files: the consistent prefix plus the entries the scan added.
            segment.write_index_files(&indexes)?;
            segment.install_indexes(indexes, bytes_since)?;
            let report = RecoveryReport {
                truncated_bytes,
                reason: if truncated_bytes > 0 { reason } else { None },
            };
            return Ok((segment, report));
        }
    }

    /// Makes a compacted copy of a closed segment, written by the cleaner to
    /// `cleaned_path` (see [`cleaned_path_of`]) and fsynced, ready to take the segment's
    /// place: scans it and writes both indexes durably under their `.cleaned` names (temp
    /// file, fsync). Runs without any lock on the partition; nothing here touches the
    /// segment's own files. [`Segment::replace_with`] swaps it in.
    pub(super) fn open_cleaned(
        dir: &Path,
        cleaned_path: &Path,
        base_offset: i64,
        next_offset: i64,
        index_interval_bytes: u32,
        now_ms: i64,
    ) -> Result<Segment, LogError> {
        let mut segment = Segment::open_path(
            dir,
            cleaned_path.to_path_buf(),
            base_offset,
            next_offset,
            index_interval_bytes,
            now_ms,
        )?;
        let indexes = segment.rebuild_indexes()?;
        let (offset, time) = index::encode(&indexes);
        for (extension, bytes) in [("index", offset), ("timeindex", time)] {
            let path = cleaned_path_of(dir, base_offset, extension);
            let mut file = File::create(&path).map_err(io_error("create", &path))?;
            file.write_all(&bytes)
                .and_then(|()| file.sync_all())
                .map_err(io_error("write", &path))?;
        }
        segment.set_max_from(&indexes);
        let _ = segment.indexes.set(indexes);
        Ok(segment)
    }

    /// Puts `cleaned` (from [`Segment::open_cleaned`], same base offset) in this closed
    /// segment's place, crash-safely: removes this segment's indexes, syncs the directory,
    /// renames the cleaned `.log` over this one (the one atomic step), syncs the directory,
    /// then renames the cleaned indexes in. A crash before the `.log` rename leaves this
    /// segment whole (its indexes are rebuilt on open, the `.cleaned` files removed); after
    /// it, the compacted copy with no index (rebuilt on open) or a whole one. On success
    /// `self` is the compacted segment (with this one's `created_ms`).
    pub(super) fn replace_with(&mut self, mut cleaned: Segment) -> Result<(), LogError> {
        assert_eq!(
            (cleaned.base_offset, cleaned.next_offset),
            (self.base_offset, self.next_offset),
            "a compacted copy covers the offsets of the segment it replaces"
        );
        assert!(self.writers.is_none(), "only closed segments are compacted");
        for path in [self.offset_index_path(), self.time_index_path()] {
            remove_if_exists(&path)?;
        }
        sync_dir(&self.dir)?;
        std::fs::rename(&cleaned.log_path, &self.log_path)
            .map_err(io_error("rename", &cleaned.log_path))?;
        sync_dir(&self.dir)?;
        cleaned.log_path = self.log_path.clone();
        cleaned.slot.set_log_path(self.log_path.clone());
        for (extension, path) in [
            ("index", self.offset_index_path()),
            ("timeindex", self.time_index_path()),
        ] {
            let from = cleaned_path_of(&self.dir, self.base_offset, extension);
            std::fs::rename(&from, &path).map_err(io_error("rename", &from))?;
        }
        cleaned.created_ms = self.created_ms;
        *self = cleaned;
        Ok(())
    }

    /// This segment's `.log` as it is now (see [`SegmentSnapshot`]); the snapshot holds
    /// the open handle until dropped. Errors: `Io` (reopening it).
    pub(super) fn snapshot(&self) -> Result<SegmentSnapshot, LogError> {
        Ok(SegmentSnapshot {
            id: self.id,
            base_offset: self.base_offset,
            next_offset: self.next_offset,
            size_bytes: self.size_bytes,
            log: self.slot.log()?,
            log_path: self.log_path.clone(),
        })
    }

    fn offset_index_path(&self) -> PathBuf {
        file_path(&self.dir, self.base_offset, "index")
    }

    fn time_index_path(&self) -> PathBuf {
        file_path(&self.dir, self.base_offset, "timeindex")
    }

    /// Makes this the active segment: its index files are appended to from now on
    /// (opened by the slot when first written).
    fn install_indexes(&mut self, indexes: Indexes, bytes_since: u64) -> Result<(), LogError> {
        self.writers = Some(Writers {
            bytes_since_last_index_entry: bytes_since,
        });
        self.indexes = OnceLock::new();
        let _ = self.indexes.set(indexes);
        Ok(())
    }

    fn write_index_files(&self, indexes: &Indexes) -> Result<(), LogError> {
        let (offset, time) = index::encode(indexes);
        let offset_path = self.offset_index_path();
        let time_path = self.time_index_path();
        std::fs::write(&offset_path, offset).map_err(io_error("write", &offset_path))?;
        std::fs::write(&time_path, time).map_err(io_error("write", &time_path))?;
        Ok(())
    }

    fn set_max_from(&mut self, indexes: &Indexes) {
        if let Some(last) = indexes.time.last() {
            self.max_timestamp_ms = last.timestamp_ms;
            self.offset_of_max_timestamp = self.base_offset + i64::from(last.relative_offset);
        }
    }

    /// The one place index entries are decided, for appends and scans alike (Kafka's
    /// rule): before a batch, if more than `index_interval_bytes` were written since the
    /// last entry, add a time entry for the max timestamp so far (if it rose) and an offset
    /// entry for this batch's position.
    fn track_batch(
        &mut self,
        indexes: &mut Indexes,
        bytes_since: &mut u64,
        scanned: &Scanned,
    ) -> Result<(), LogError> {
        let header = &scanned.header;
        if *bytes_since > self.index_interval_bytes {
            self.maybe_append_time(indexes)?;
            let entry = OffsetEntry {
                relative_offset: self.relative(header.base_offset),
                position: u32::try_from(scanned.position)
                    .expect("segment positions fit u32: segment_bytes <= i32::MAX"),
            };
            if self.writers.is_some() {
                self.slot.with_index(IndexFile::Offset, "write", |f| {
                    index::write_offset_entry(f, entry)
                })?;
            }
            indexes.offset.push(entry);
            *bytes_since = 0;
        }
        *bytes_since += header.total_bytes() as u64;
        if header.max_timestamp > self.max_timestamp_ms {
            self.max_timestamp_ms = header.max_timestamp;
            self.offset_of_max_timestamp = header.base_offset;
        }
        Ok(())
    }

    /// Appends a time entry for the max timestamp so far if it is newer than the last one.
    fn maybe_append_time(&mut self, indexes: &mut Indexes) -> Result<(), LogError> {
        let last = indexes.time.last().map_or(-1, |e| e.timestamp_ms);
        if self.max_timestamp_ms > last {
            let entry = TimeEntry {
                timestamp_ms: self.max_timestamp_ms,
                relative_offset: self.relative(self.offset_of_max_timestamp),
            };
            if self.writers.is_some() {
                self.slot.with_index(IndexFile::Time, "write", |f| {
                    index::write_time_entry(f, entry)
                })?;
            }
            indexes.time.push(entry);
        }
        Ok(())
    }

    fn relative(&self, offset: i64) -> u32 {
        u32::try_from(offset - self.base_offset)
            .expect("relative offsets fit u32: the log rolls first")
    }

    /// True when another offset entry, or another time entry, would exceed
    /// `segment_index_bytes`.
    pub(super) fn index_full(&self, segment_index_bytes: u64) -> bool {
        self.indexes.get().is_some_and(|i| {
            (i.offset.len() as u64 + 1) * OFFSET_ENTRY_BYTES > segment_index_bytes
                || (i.time.len() as u64 + 1) * TIME_ENTRY_BYTES > segment_index_bytes
        })
    }

    /// Appends a batch whose header the log already rewrote (offsets assigned). `scratch`
    /// is a reusable buffer so small batches go out in one `write`.
    pub(super) fn append(
        &mut self,
        batch: &ValidatedBatch,
        scratch: &mut Vec<u8>,
    ) -> Result<(), LogError> {
        assert!(self.writers.is_some(), "append to a closed segment");
        assert!(
            batch.base_offset() >= self.next_offset,
            "offsets go forward: {} < {}",
            batch.base_offset(),
            self.next_offset
        );
        let position = self.size_bytes;
        let log = self.slot.log()?;
        let written = if batch.len() <= SINGLE_WRITE_MAX_BYTES {
            scratch.clear();
            scratch.extend_from_slice(batch.header());
            scratch.extend_from_slice(batch.records());
            (&*log).write_all(scratch)
        } else {
            (&*log)
                .write_all(batch.header())
                .and_then(|()| (&*log).write_all(batch.records()))
        };
        drop(log);
        if let Err(source) = written {
            // Undo a partial write so the file stays a sequence of whole batches.
            if let Ok(log) = self.slot.log() {
                let _ = log.set_len(position);
            }
            return Err(LogError::Io {
                op: "append",
                path: self.log_path.clone(),
                source,
            });
        }
        let header = BatchHeader::parse(batch.header());
        let mut indexes = self.indexes.take().expect("active segment has its indexes");
        let mut bytes_since = self
            .writers
            .as_ref()
            .map_or(0, |w| w.bytes_since_last_index_entry);
        let tracked = self.track_batch(
            &mut indexes,
            &mut bytes_since,
            &Scanned { position, header },
        );
        let _ = self.indexes.set(indexes);
        if let Some(w) = self.writers.as_mut() {
            w.bytes_since_last_index_entry = bytes_since;
        }
        tracked?;
        if self.size_bytes == 0 {
            self.first_batch_timestamp_ms = Some(header.max_timestamp).filter(|ts| *ts >= 0);
        }
        self.size_bytes += batch.len() as u64;
        self.next_offset = header.last_offset() + 1;
        Ok(())
    }

    /// Turns the active segment into a closed one: writes the final time index entry (so
    /// the last entry holds the segment's max timestamp, which `open_closed` trusts),
    /// closes the index writers and drops the in-memory indexes (reloaded lazily).
    pub(super) fn close(&mut self, fsync: bool) -> Result<(), LogError> {
        if let Some(mut indexes) = self.indexes.take() {
            self.maybe_append_time(&mut indexes)?;
        }
        if fsync {
            self.sync()?;
        }
        self.writers = None;
        self.slot.close_indexes();
        self.indexes = OnceLock::new();
        Ok(())
    }

    /// fsyncs the log and (for the active segment) both index files. A handle the
    /// descriptor cache closed is reopened: fsync flushes the inode's dirty pages, written
    /// through whichever descriptor (see `fdcache.rs`).
    pub(super) fn sync(&self) -> Result<(), LogError> {
        self.slot
            .log()?
            .sync_data()
            .map_err(io_error("fsync", &self.log_path))?;
        if self.writers.is_some() {
            self.slot
                .with_index(IndexFile::Offset, "fsync", |f| f.sync_data())?;
            self.slot
                .with_index(IndexFile::Time, "fsync", |f| f.sync_data())?;
            let txn_path = self.txn_index_path();
            if let Ok(file) = File::open(&txn_path) {
                file.sync_data().map_err(io_error("fsync", &txn_path))?;
            }
        }
        Ok(())
    }

    /// The indexes, loaded on first use for closed segments. A loaded index that fails its
    /// checks (torn entry, non-monotonic, position past the end) is rebuilt by a scan.
    fn indexes(&self) -> Result<&Indexes, LogError> {
        if let Some(indexes) = self.indexes.get() {
            return Ok(indexes);
        }
        let offset_path = self.offset_index_path();
        let time_path = self.time_index_path();
        let offset =
            index::read_offset_index(&offset_path).map_err(io_error("read", &offset_path))?;
        let time = index::read_time_index(&time_path).map_err(io_error("read", &time_path))?;
        let loaded = match (offset, time) {
            (Some(o), Some(t))
                if !o.trailing_bytes
                    && !t.trailing_bytes
                    && index::valid_offset_prefix(&o.entries, self.size_bytes)
                        == o.entries.len()
                    && index::valid_time_prefix(&t.entries) == t.entries.len() =>
            {
                Indexes {
                    offset: o.entries,
                    time: t.entries,
                }
            }
            _ => {
                tracing::warn!(
                    segment = %self.log_path.display(),
                    "index missing or corrupt; rebuilding it by scanning"
                );
                let rebuilt = self.rebuild_indexes()?;
                // Best effort: the in-memory copy is what serves reads.
                if let Err(e) = self.write_index_files(&rebuilt) {
                    tracing::warn!(error = %e, "could not rewrite rebuilt index");
                }
                rebuilt
            }
        };
        let _ = self.indexes.set(loaded);
        Ok(self.indexes.get().expect("just set"))
    }

    /// Scans the whole (closed) segment and recomputes both indexes. Batches are trusted
    /// as far as their headers are well formed; a bad header ends the scan.
    fn rebuild_indexes(&self) -> Result<Indexes, LogError> {
        let mut shadow = Segment {
            id: self.id,
            base_offset: self.base_offset,
            next_offset: self.base_offset,
            size_bytes: 0,
            max_timestamp_ms: -1,
            offset_of_max_timestamp: self.base_offset,
            first_batch_timestamp_ms: None,
            created_ms: self.created_ms,
            log_path: self.log_path.clone(),
            slot: Arc::clone(&self.slot),
            dir: self.dir.clone(),
            indexes: OnceLock::new(),
            writers: None,
            index_interval_bytes: self.index_interval_bytes,
            aborted_txns: OnceLock::new(),
        };
        let mut indexes = Indexes::default();
        let mut bytes_since = 0;
        let log = self.slot.log()?;
        let mut scanner = Scanner::new(&log, &self.log_path, 0, self.size_bytes);
        scanner.chunk_bytes = HEADER_SCAN_CHUNK_BYTES;
        let mut expected = self.base_offset;
        while let Step::Batch(s) = scanner.next(false)? {
            let fits = s.header.last_offset() - self.base_offset <= i64::from(u32::MAX);
            if s.header.base_offset < expected || !fits {
                tracing::warn!(
                    segment = %self.log_path.display(),
                    position = s.position,
                    "index rebuild stopped at a batch with unexpected offsets"
                );
                break;
            }
            shadow.track_batch(&mut indexes, &mut bytes_since, &s)?;
            expected = s.header.last_offset() + 1;
        }
        shadow.maybe_append_time(&mut indexes)?;
        Ok(indexes)
    }

    fn first_batch_timestamp(&self) -> Result<Option<i64>, LogError> {
        if self.size_bytes < BATCH_HEADER_BYTES as u64 {
            return Ok(None);
        }
        let header = self.header_at(&*self.slot.log()?, 0)?;
        Ok(Some(header.max_timestamp).filter(|ts| *ts >= 0))
    }

    fn header_at(&self, log: &File, position: u64) -> Result<BatchHeader, LogError> {
        let mut raw = [0u8; BATCH_HEADER_BYTES];
        log.read_exact_at(&mut raw, position)
            .map_err(io_error("read", &self.log_path))?;
        Ok(BatchHeader::parse(&raw))
    }

    fn corrupt(&self, position: u64, reason: String) -> LogError {
        LogError::Corrupt {
            path: self.log_path.clone(),
            position,
            reason,
        }
    }

    /// Position and header of the first batch whose last offset is >= `offset`, starting
    /// from the offset index; checks that headers carry the offsets the index promised
    /// (assert in pairs: write side is `append`). `None` if no batch in this segment has it.
    fn locate(&self, offset: i64) -> Result<Option<(u64, BatchHeader)>, LogError> {
        let relative = u32::try_from((offset - self.base_offset).max(0)).unwrap_or(u32::MAX);
        let start = self.indexes()?.lookup_offset(relative);
        let mut position = start.map_or(0, |e| u64::from(e.position));
        let mut expected = self.base_offset + start.map_or(0, |e| i64::from(e.relative_offset));
        let exact_first = start.is_some();
        let mut first = true;
        let log = self.slot.log()?;
        while position < self.size_bytes {
            if self.size_bytes - position < BATCH_HEADER_BYTES as u64 {
                return Err(self.corrupt(position, "partial batch header".into()));
            }
            let header = self.header_at(&log, position)?;
            let total = header.total_bytes();
            if header.magic != MAGIC_V2
                || total < BATCH_HEADER_BYTES as i64
                || position + total as u64 > self.size_bytes
            {
                return Err(self.corrupt(position, format!("bad header {header:?}")));
            }
            let offset_ok = if first && exact_first {
                header.base_offset == expected
            } else {
                header.base_offset >= expected
            };
            if !offset_ok {
                return Err(self.corrupt(
                    position,
                    format!(
                        "base offset {} where {expected} was expected",
                        header.base_offset
                    ),
                ));
            }
            if header.last_offset() >= offset {
                return Ok(Some((position, header)));
            }
            first = false;
            expected = header.last_offset() + 1;
            position += total as u64;
        }
        Ok(None)
    }

    /// Up to `len` bytes from byte `position`, fewer only at the end of the file
    /// ([`pread_up_to`], under the partition's shared lock).
    fn read_bytes_at(&self, position: u64, len: usize) -> Result<Vec<u8>, LogError> {
        pread_up_to(&*self.slot.log()?, position, len).map_err(io_error("read", &self.log_path))
    }

    /// Whole batches from the one containing `offset` (or the next one after a gap), at
    /// most `max_bytes` except that the first batch is always whole (KIP-74), only batches
    /// whose last offset is < `max_offset`. `None` when this segment has nothing at or
    /// after `offset`.
    pub(super) fn read(
        &self,
        offset: i64,
        max_bytes: usize,
        max_offset: i64,
    ) -> Result<Option<(Bytes, Option<i64>)>, LogError> {
        let Some((position, first)) = self.locate(offset)? else {
            return Ok(None);
        };
        if first.last_offset() >= max_offset {
            return Ok(Some((Bytes::new(), None)));
        }
        let available = (self.size_bytes - position) as usize;
        let want = (first.total_bytes() as usize).max(max_bytes).min(available);
        let mut buffer = self.read_bytes_at(position, want)?;
        if buffer.len() < want {
            return Err(self.corrupt(
                position + buffer.len() as u64,
                format!("segment ends {} bytes early", want - buffer.len()),
            ));
        }
        let mut end = 0usize;
        let mut expected = first.base_offset;
        while buffer.len() - end >= BATCH_HEADER_BYTES {
            let header = BatchHeader::parse(&buffer[end..]);
            let total = header.total_bytes();
            if header.base_offset < expected
                || total < BATCH_HEADER_BYTES as i64
                || header.magic != MAGIC_V2
            {
                return Err(self.corrupt(
                    position + end as u64,
                    format!("header {header:?} after offset {expected}"),
                ));
            }
            if end as u64 + total as u64 > want as u64 || header.last_offset() >= max_offset {
                break;
            }
            end += total as usize;
            expected = header.last_offset() + 1;
        }
        assert!(end > 0, "the first batch always fits: want >= its size");
        buffer.truncate(end);
        Ok(Some((Bytes::from(buffer), Some(first.base_offset))))
    }

    /// The same batches [`Segment::read`] would return, as a byte range of the `.log` file
    /// instead of a copy: from the batch holding `offset` (or the next one after a gap),
    /// at most `max_bytes` except that the first batch is always whole (KIP-74), only
    /// batches whose last offset is < `max_offset`. Reads batch headers only: the one at
    /// `offset`, the one holding `max_offset` when that is inside this segment, and, when
    /// `max_bytes` cuts the readable bytes short, those from the last offset index entry
    /// before the cut (at most `index.interval.bytes` of batches plus one). `Ok(None)` when
    /// this segment has nothing at or after `offset`; `Ok(Some(None))` when its first batch
    /// there reaches `max_offset`.
    ///
    /// Errors: `Corrupt` when a header does not carry the offsets the index promised or
    /// is malformed; `Io`.
    pub(super) fn read_region(
        &self,
        offset: i64,
        max_bytes: usize,
        max_offset: i64,
    ) -> Result<Option<Option<FileRegion>>, LogError> {
        let Some((position, first)) = self.locate(offset)? else {
            return Ok(None);
        };
        if first.last_offset() >= max_offset {
            return Ok(Some(None));
        }
        // Where the readable batches end (the batch holding `max_offset` is not readable),
        // and an offset no record before that end exceeds.
        let (bound, bound_last) = match max_offset < self.next_offset {
            true => match self.locate(max_offset)? {
                Some((at, header)) => (at, header.base_offset - 1),
                None => (self.size_bytes, self.next_offset - 1),
            },
            false => (self.size_bytes, self.next_offset - 1),
        };
        let first_end = position + first.total_bytes() as u64;
        let limit = position + (max_bytes as u64).max(first.total_bytes() as u64);
        let (end, last_offset) = if bound <= limit {
            (bound, bound_last)
        } else {
            self.last_batch_end(first_end, first.last_offset(), limit)?
        };
        Ok(Some(Some(FileRegion {
            file: self.slot.log()?,
            position,
            len: (end - position) as usize,
            base_offset: first.base_offset,
            last_offset,
        })))
    }

    /// The end of the last whole batch at or before byte `limit`, not before `first_end`
    /// (the end of a batch whose last offset is `first_last`), with an offset no record
    /// before it exceeds. The caller knows a batch starts at or after `first_end` and
    /// ends past `limit`, inside the segment. Starts from the offset index entry nearest
    /// below `limit` and reads headers in chunks of `HEADER_SCAN_CHUNK_BYTES`, so small
    /// batches cost a read per chunk, not one each.
    fn last_batch_end(
        &self,
        first_end: u64,
        first_last: i64,
        limit: u64,
    ) -> Result<(u64, i64), LogError> {
        let indexes = self.indexes()?;
        let below = indexes
            .offset
            .partition_point(|e| u64::from(e.position) <= limit);
        let (mut start, mut expected, mut exact) = (first_end, first_last + 1, false);
        if let Some(entry) = below.checked_sub(1).map(|i| indexes.offset[i]) {
            if u64::from(entry.position) > first_end {
                start = u64::from(entry.position);
                expected = self.base_offset + i64::from(entry.relative_offset);
                exact = true;
            }
        }
        let log = self.slot.log()?;
        let mut scanner = Scanner::new(&log, &self.log_path, start, self.size_bytes);
        scanner.chunk_bytes = HEADER_SCAN_CHUNK_BYTES;
        loop {
            let (position, header) = match scanner.next(false)? {
                Step::Batch(s) => (s.position, s.header),
                Step::End => {
                    return Err(self.corrupt(self.size_bytes, "no batch past the read limit".into()))
                }
                Step::Torn { position, reason } => return Err(self.corrupt(position, reason)),
            };
            let offset_ok = match exact {
                true => header.base_offset == expected,
                false => header.base_offset >= expected,
            };
            if !offset_ok {
                return Err(self.corrupt(
                    position,
                    format!("header {header:?} where offset {expected} was expected"),
                ));
            }
            if position + header.total_bytes() as u64 > limit {
                return Ok((position, header.base_offset - 1));
            }
            exact = false;
            expected = header.last_offset() + 1;
        }
    }

    /// First record at or after `target_ms` in this segment (see `PartitionLog::offset_for_timestamp`).
    pub(super) fn find_by_timestamp(&self, target_ms: i64) -> Result<Option<(i64, i64)>, LogError> {
        if self.max_timestamp_ms < target_ms {
            return Ok(None);
        }
        let start = self
            .indexes()?
            .lookup_time(target_ms)
            .map_or(self.base_offset, |e| {
                self.base_offset + i64::from(e.relative_offset)
            });
        let Some((mut position, _)) = self.locate(start)? else {
            return Ok(None);
        };
        let log = self.slot.log()?;
        while position < self.size_bytes {
            let header = self.header_at(&log, position)?;
            let total = header.total_bytes();
            if total < BATCH_HEADER_BYTES as i64 || position + total as u64 > self.size_bytes {
                return Err(self.corrupt(position, format!("bad header {header:?}")));
            }
            if header.max_timestamp >= target_ms {
                return Ok(Some(self.record_at_or_after(position, &header, target_ms)?));
            }
            position += total as u64;
        }
        Ok(None)
    }

    /// Offset and timestamp of the first record of the batch at `position` whose timestamp
    /// is >= `target_ms`: exact for uncompressed CreateTime batches, else the batch's base
    /// offset and maxTimestamp.
    fn record_at_or_after(
        &self,
        position: u64,
        header: &BatchHeader,
        target_ms: i64,
    ) -> Result<(i64, i64), LogError> {
        let batch_level = (header.base_offset, header.max_timestamp);
        if !header.is_uncompressed() || header.is_log_append_time() {
            return Ok(batch_level);
        }
        let mut bytes = vec![0u8; header.total_bytes() as usize];
        self.slot
            .log()?
            .read_exact_at(&mut bytes, position)
            .map_err(io_error("read", &self.log_path))?;
        Ok(batch::first_record_at_or_after(&bytes, target_ms).unwrap_or(batch_level))
    }

    /// Offset and timestamp of the record holding this segment's max timestamp.
    pub(super) fn max_timestamp_record(&self) -> Result<Option<(i64, i64)>, LogError> {
        if self.max_timestamp_ms < 0 {
            return Ok(None);
        }
        let Some((position, header)) = self.locate(self.offset_of_max_timestamp)? else {
            return Ok(None);
        };
        if header.max_timestamp != self.max_timestamp_ms {
            // Index and data disagree; fall back to a scan of the segment for the batch.
            return self.find_by_timestamp(self.max_timestamp_ms);
        }
        Ok(Some(self.record_at_or_after(
            position,
            &header,
            self.max_timestamp_ms,
        )?))
    }

    /// Calls `f` with every batch header from byte 0 (producer state rebuild).
    pub(super) fn for_each_header(&self, mut f: impl FnMut(&BatchHeader)) -> Result<(), LogError> {
        self.for_each_header_and_marker(|header, _| f(header))
    }

    /// [`Segment::for_each_header`], also giving, for a control batch, the transaction
    /// marker it holds (its records are read; control batches are tiny).
    pub(super) fn for_each_header_and_marker(
        &self,
        mut f: impl FnMut(&BatchHeader, Option<TxnMarker>),
    ) -> Result<(), LogError> {
        let log = self.slot.log()?;
        let mut scanner = Scanner::new(&log, &self.log_path, 0, self.size_bytes);
        scanner.chunk_bytes = HEADER_SCAN_CHUNK_BYTES;
        while let Step::Batch(s) = scanner.next(false)? {
            let marker = if s.header.is_control() {
                let bytes = scanner.load(s.position, s.header.total_bytes() as usize)?;
                txn::parse_marker(&s.header, &bytes[BATCH_HEADER_BYTES..])
            } else {
                None
            };
            f(&s.header, marker);
        }
        Ok(())
    }

    fn txn_index_path(&self) -> PathBuf {
        file_path(&self.dir, self.base_offset, "txnindex")
    }

    /// The aborted transactions whose ABORT marker is in this segment, oldest first
    /// (read from `<base>.txnindex` on first use; none when it does not exist).
    /// Errors: `Io`.
    pub(super) fn aborted_txns(&self) -> Result<&[AbortedTxn], LogError> {
        if let Some(entries) = self.aborted_txns.get() {
            return Ok(entries);
        }
        let entries = txn::read_index(&self.txn_index_path())?.unwrap_or_default();
        // Another reader may have loaded it meanwhile: same contents either way.
        let _ = self.aborted_txns.set(entries);
        Ok(self.aborted_txns.get().map_or(&[], |e| e.as_slice()))
    }

    /// Appends an entry to this segment's aborted transaction index (file and memory).
    /// Errors: `Io`.
    pub(super) fn append_aborted_txn(&mut self, entry: AbortedTxn) -> Result<(), LogError> {
        self.aborted_txns()?;
        txn::append_entry(&self.txn_index_path(), &entry)?;
        if let Some(entries) = self.aborted_txns.get_mut() {
            entries.push(entry);
        }
        Ok(())
    }

    /// Replaces this segment's aborted transaction index with `entries` when they differ
    /// from what it holds (recovery's rebuild). Returns whether it changed. Errors: `Io`.
    pub(super) fn set_aborted_txns(&mut self, entries: Vec<AbortedTxn>) -> Result<bool, LogError> {
        if self.aborted_txns()? == entries.as_slice() {
            return Ok(false);
        }
        txn::write_index(&self.txn_index_path(), &entries)?;
        self.aborted_txns = OnceLock::from(entries);
        Ok(true)
    }

    /// Truncates the segment so its last batch ends before `offset` (a batch containing
    /// `offset` goes entirely, as in Kafka), then rebuilds its indexes and makes it active.
    pub(super) fn truncate_to(&mut self, offset: i64, now_ms: i64) -> Result<(), LogError> {
        self.writers = None;
        self.slot.close_indexes();
        if let Some((position, _)) = self.locate(offset)? {
            self.slot
                .log()?
                .set_len(position)
                .map_err(io_error("truncate", &self.log_path))?;
            for path in [self.offset_index_path(), self.time_index_path()] {
                remove_if_exists(&path)?;
            }
        }
        let interval = u32::try_from(self.index_interval_bytes).unwrap_or(u32::MAX);
        let (recovered, _) =
            Segment::recover_indexes(&self.dir, self.base_offset, interval, now_ms, false)?;
        *self = recovered;
        Ok(())
    }

    /// Closes the segment's files as the descriptor cache's eviction does (tests).
    #[cfg(test)]
    pub(super) fn close_files(&self) {
        self.slot.close();
    }

    /// Descriptors the segment's slot holds open (tests).
    #[cfg(test)]
    pub(super) fn open_files(&self) -> usize {
        self.slot.open_count()
    }

    /// Last modification time of the `.log` file in ms (retention fallback for segments
    /// without timestamps).
    pub(super) fn modified_ms(&self) -> Result<i64, LogError> {
        let modified = std::fs::metadata(&self.log_path)
            .and_then(|m| m.modified())
            .map_err(io_error("stat", &self.log_path))?;
        Ok(modified
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64))
    }

    /// Deletes the segment's files: the `.log` first (the segment is gone once it is), then
    /// the indexes (the aborted transaction index too) and producer snapshot. Orphans left by a crash are removed on open.
    pub(super) fn delete_files(self) -> Result<(), LogError> {
        let dir = self.dir.clone();
        let base = self.base_offset;
        drop(self);
        for extension in ["log", "index", "timeindex", "txnindex", "snapshot"] {
            remove_if_exists(&file_path(&dir, base, extension))?;
        }
        Ok(())
    }
}

/// A segment's `.log` as it was when a compaction was planned: the offsets and size then,
/// and the segment's open file (shared), so a rename or delete of the segment meanwhile
/// does not disturb reading it. Read only with positional reads, without any lock on the
/// partition (the bytes below `size_bytes` of a segment never change in place: appends go
/// after them; compaction, retention and truncation replace or unlink whole files, or cut
/// the active segment's tail, which the compaction's install step then notices by the
/// segment's id).
#[derive(Debug)]
pub(crate) struct SegmentSnapshot {
    /// [`Segment::id`] of the segment this was taken from.
    pub id: u64,
    pub base_offset: i64,
    pub next_offset: i64,
    pub size_bytes: u64,
    log: Arc<File>,
    log_path: PathBuf,
}

impl SegmentSnapshot {
    /// Calls `f(position, batch bytes)` for every batch from byte 0 to `size_bytes`, each
    /// read whole and its CRC-32C and offsets checked (the read side of "assert in
    /// pairs"). Meant for the log cleaner. Errors: `Corrupt` at the first bad batch
    /// (nothing is truncated here), `Io`, or whatever `f` returns.
    pub(super) fn for_each_batch(
        &self,
        mut f: impl FnMut(u64, &[u8]) -> Result<(), LogError>,
    ) -> Result<(), LogError> {
        let mut scanner = Scanner::new(&self.log, &self.log_path, 0, self.size_bytes);
        let mut expected = self.base_offset;
        let corrupt = |position: u64, reason: String| LogError::Corrupt {
            path: self.log_path.clone(),
            position,
            reason,
        };
        loop {
            match scanner.next(true)? {
                Step::End => return Ok(()),
                Step::Torn { position, reason } => return Err(corrupt(position, reason)),
                Step::Batch(s) => {
                    if s.header.base_offset < expected {
                        return Err(corrupt(
                            s.position,
                            format!(
                                "base offset {} where at least {expected} was expected",
                                s.header.base_offset
                            ),
                        ));
                    }
                    expected = s.header.last_offset() + 1;
                    let bytes = scanner.load(s.position, s.header.total_bytes() as usize)?;
                    f(s.position, bytes)?;
                }
            }
        }
    }

    /// The `.log` file's path (when the snapshot was taken).
    pub(super) fn log_path(&self) -> &Path {
        &self.log_path
    }
}

/// Name of the cleaner's copy of a segment file (`extension` = `log`, `index` or
/// `timeindex`) before it is renamed into place: `<base>.<extension>.cleaned`. A leftover
/// one (a crash before the swap) is removed when the log is opened.
pub(crate) fn cleaned_path_of(dir: &Path, base_offset: i64, extension: &str) -> PathBuf {
    file_path(dir, base_offset, &format!("{extension}.cleaned"))
}

/// fsyncs a directory (after creating, renaming or removing files in it).
pub(crate) fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error("fsync", dir))
}

fn open_existing(path: &Path) -> Result<File, LogError> {
    OpenOptions::new()
        .read(true)
        .append(true)
        .open(path)
        .map_err(io_error("open", path))
}

fn file_len(path: &Path) -> Result<Option<u64>, LogError> {
    match std::fs::metadata(path) {
        Ok(m) => Ok(Some(m.len())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error("stat", path)(e)),
    }
}

pub(crate) fn remove_if_exists(path: &Path) -> Result<(), LogError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_error("remove", path)(e)),
    }
}
