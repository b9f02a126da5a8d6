//! Sparse offset and time indexes of one segment, in Kafka's on-disk format.
//!
//! Owns: the entry encodings (`.index`: relative offset u32 + file position u32;
//! `.timeindex`: timestamp i64 + relative offset u32; big-endian, appended, never
//! preallocated), loading them with validity checks, and lookups. Never does: decide when
//! an entry is due (the segment does), scan log files, or know about batches.

use std::fs::File;
use std::io::Write;
use std::path::Path;

/// Bytes per `.index` entry.
pub(super) const OFFSET_ENTRY_BYTES: u64 = 8;
/// Bytes per `.timeindex` entry.
pub(super) const TIME_ENTRY_BYTES: u64 = 12;

/// One `.index` entry: the batch whose base offset is `base + relative_offset` starts at
/// byte `position` of the `.log` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OffsetEntry {
    pub relative_offset: u32,
    pub position: u32,
}

/// One `.timeindex` entry: every batch before the one with base offset
/// `base + relative_offset` has a maxTimestamp < `timestamp_ms`, and that batch reached it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimeEntry {
    pub timestamp_ms: i64,
    pub relative_offset: u32,
}

/// Both indexes of a segment, in memory.
#[derive(Debug, Default, Clone)]
pub(crate) struct Indexes {
    pub offset: Vec<OffsetEntry>,
    pub time: Vec<TimeEntry>,
}

impl Indexes {
    /// Largest offset entry with `relative_offset <= target`.
    pub(super) fn lookup_offset(&self, target_relative: u32) -> Option<OffsetEntry> {
        let n = self
            .offset
            .partition_point(|e| e.relative_offset <= target_relative);
        n.checked_sub(1).map(|i| self.offset[i])
    }

    /// Largest time entry with `timestamp_ms <= target_ms`.
    pub(super) fn lookup_time(&self, target_ms: i64) -> Option<TimeEntry> {
        let n = self.time.partition_point(|e| e.timestamp_ms <= target_ms);
        n.checked_sub(1).map(|i| self.time[i])
    }
}

/// Raw contents of an index file: the entries that decoded and whether bytes were left
/// over (a torn last entry).
pub(crate) struct Loaded<T> {
    pub entries: Vec<T>,
    pub trailing_bytes: bool,
}

/// Reads a `.index` file; `Ok(None)` when it does not exist.
pub(crate) fn read_offset_index(path: &Path) -> std::io::Result<Option<Loaded<OffsetEntry>>> {
    let raw = match std::fs::read(path) {
        Ok(raw) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let entries = raw
        .chunks_exact(OFFSET_ENTRY_BYTES as usize)
        .map(|c| OffsetEntry {
            relative_offset: u32::from_be_bytes([c[0], c[1], c[2], c[3]]),
            position: u32::from_be_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect();
    Ok(Some(Loaded {
        entries,
        trailing_bytes: !(raw.len() as u64).is_multiple_of(OFFSET_ENTRY_BYTES),
    }))
}

/// Reads a `.timeindex` file; `Ok(None)` when it does not exist.
pub(crate) fn read_time_index(path: &Path) -> std::io::Result<Option<Loaded<TimeEntry>>> {
    let raw = match std::fs::read(path) {
        Ok(raw) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let entries = raw
        .chunks_exact(TIME_ENTRY_BYTES as usize)
        .map(|c| {
            let mut ts = [0u8; 8];
            ts.copy_from_slice(&c[..8]);
            TimeEntry {
                timestamp_ms: i64::from_be_bytes(ts),
                relative_offset: u32::from_be_bytes([c[8], c[9], c[10], c[11]]),
            }
        })
        .collect();
    Ok(Some(Loaded {
        entries,
        trailing_bytes: !(raw.len() as u64).is_multiple_of(TIME_ENTRY_BYTES),
    }))
}

/// Number of leading offset entries that are consistent: strictly increasing relative
/// offsets and positions, every position inside a log of `log_bytes`.
pub(crate) fn valid_offset_prefix(entries: &[OffsetEntry], log_bytes: u64) -> usize {
    let mut previous: Option<OffsetEntry> = None;
    for (i, e) in entries.iter().enumerate() {
        let ordered = previous
            .is_none_or(|p| e.relative_offset > p.relative_offset && e.position > p.position);
        if !ordered || u64::from(e.position) >= log_bytes || e.position == 0 {
            return i;
        }
        previous = Some(*e);
    }
    entries.len()
}

/// Number of leading time entries that are consistent: strictly increasing timestamps
/// (all >= 0) and non-decreasing relative offsets.
pub(crate) fn valid_time_prefix(entries: &[TimeEntry]) -> usize {
    let mut previous: Option<TimeEntry> = None;
    for (i, e) in entries.iter().enumerate() {
        let ordered = previous.is_none_or(|p| {
            e.timestamp_ms > p.timestamp_ms && e.relative_offset >= p.relative_offset
        });
        if !ordered || e.timestamp_ms < 0 {
            return i;
        }
        previous = Some(*e);
    }
    entries.len()
}

/// Appends one `.index` entry (page cache only).
pub(crate) fn write_offset_entry(file: &mut File, entry: OffsetEntry) -> std::io::Result<()> {
    let mut raw = [0u8; OFFSET_ENTRY_BYTES as usize];
    raw[..4].copy_from_slice(&entry.relative_offset.to_be_bytes());
    raw[4..].copy_from_slice(&entry.position.to_be_bytes());
    file.write_all(&raw)
}

/// Appends one `.timeindex` entry (page cache only).
pub(crate) fn write_time_entry(file: &mut File, entry: TimeEntry) -> std::io::Result<()> {
    let mut raw = [0u8; TIME_ENTRY_BYTES as usize];
    raw[..8].copy_from_slice(&entry.timestamp_ms.to_be_bytes());
    raw[8..].copy_from_slice(&entry.relative_offset.to_be_bytes());
    file.write_all(&raw)
}

/// Encodes whole index contents (used when rewriting a rebuilt index).
pub(crate) fn encode(indexes: &Indexes) -> (Vec<u8>, Vec<u8>) {
    let mut offset = Vec::with_capacity(indexes.offset.len() * OFFSET_ENTRY_BYTES as usize);
    for e in &indexes.offset {
        offset.extend_from_slice(&e.relative_offset.to_be_bytes());
        offset.extend_from_slice(&e.position.to_be_bytes());
    }
    let mut time = Vec::with_capacity(indexes.time.len() * TIME_ENTRY_BYTES as usize);
    for e in &indexes.time {
        time.extend_from_slice(&e.timestamp_ms.to_be_bytes());
        time.extend_from_slice(&e.relative_offset.to_be_bytes());
    }
    (offset, time)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_pick_largest_not_above() {
        let indexes = Indexes {
            offset: vec![
                OffsetEntry {
                    relative_offset: 10,
                    position: 100,
                },
                OffsetEntry {
                    relative_offset: 20,
                    position: 200,
                },
            ],
            time: vec![
                TimeEntry {
                    timestamp_ms: 5,
                    relative_offset: 3,
                },
                TimeEntry {
                    timestamp_ms: 9,
                    relative_offset: 12,
                },
            ],
        };
        assert_eq!(indexes.lookup_offset(9), None);
        assert_eq!(indexes.lookup_offset(10).map(|e| e.position), Some(100));
        assert_eq!(indexes.lookup_offset(25).map(|e| e.position), Some(200));
        assert_eq!(indexes.lookup_time(4), None);
        assert_eq!(indexes.lookup_time(8).map(|e| e.relative_offset), Some(3));
        assert_eq!(
            indexes.lookup_time(100).map(|e| e.relative_offset),
            Some(12)
        );
    }

    #[test]
    fn prefixes_stop_at_inconsistency() {
        let entries = [
            OffsetEntry {
                relative_offset: 1,
                position: 10,
            },
            OffsetEntry {
                relative_offset: 2,
                position: 5,
            },
        ];
        assert_eq!(valid_offset_prefix(&entries, 100), 1);
        assert_eq!(valid_offset_prefix(&entries[..1], 10), 0);
        let time = [
            TimeEntry {
                timestamp_ms: 3,
                relative_offset: 1,
            },
            TimeEntry {
                timestamp_ms: 3,
                relative_offset: 2,
            },
        ];
        assert_eq!(valid_time_prefix(&time), 1);
    }
}
