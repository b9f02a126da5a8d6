//! Checkpoint files in Kafka's text format (`CheckpointFile`): the atomic write every
//! checkpoint of `log` shares, and the per-log-dir `replication-offset-checkpoint` (the
//! high watermark of every hosted partition, Kafka's `ReplicaManager.checkpointHighWatermarks`).
//!
//! ```text
//! 0              <- version
//! 2              <- number of entries
//! orders 0 120   <- "<topic> <partition> <high_watermark>"
//! orders 1 98
//! ```
//!
//! Owns: the file format and the write (temp file, fsync, rename, directory fsync, so a
//! crash leaves the old file or the new one, never a torn one). Never does: decide what
//! the high watermarks are (`replica.rs` passes them in) or when to write (the broker's
//! periodic task, `replica.high.watermark.checkpoint.interval.ms`, and clean shutdown).
//!
//! Reading is forgiving: a missing file is no entries; an unreadable or malformed one is
//! logged with `tracing::warn!` and read as no entries, so each partition falls back to
//! the behaviour without a checkpoint (see `replica::Partition`), never a failed start.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use super::segment::{io_error, sync_dir};
use super::LogError;

/// File name in the log directory (Kafka's `ReplicaManager.HighWatermarkFilename`).
pub const REPLICATION_OFFSET_CHECKPOINT_FILE: &str = "replication-offset-checkpoint";
/// The only format version of Kafka's offset checkpoint files.
const CHECKPOINT_VERSION: i32 = 0;

/// The high watermark of each partition, keyed by (topic, partition index); offsets are
/// record offsets, at least 0.
pub type HighWatermarks = BTreeMap<(String, i32), i64>;

/// Writes `text` as `dir/file_name` whole: temp file `file_name.tmp`, fsync, rename,
/// directory fsync. Errors: `LogError::Io` naming the step and path (the old file, if
/// any, is then still in place).
pub(crate) fn write_atomically(dir: &Path, file_name: &str, text: &str) -> Result<(), LogError> {
    let path = dir.join(file_name);
    let tmp = dir.join(format!("{file_name}.tmp"));
    std::fs::File::create(&tmp)
        .and_then(|mut file| {
            file.write_all(text.as_bytes())?;
            file.sync_all()
        })
        .map_err(io_error("write", &tmp))?;
    std::fs::rename(&tmp, &path).map_err(io_error("rename", &tmp))?;
    sync_dir(dir)
}

/// Writes `log_dir/replication-offset-checkpoint` with `high_watermarks` (the format of
/// the module doc, in key order), atomically. Errors: `LogError::Io`.
pub fn write_high_watermarks(
    log_dir: &Path,
    high_watermarks: &HighWatermarks,
) -> Result<(), LogError> {
    write_high_watermark_entries(
        log_dir,
        high_watermarks
            .iter()
            .map(|((topic, index), offset)| (topic.as_str(), *index, *offset)),
    )
}

/// Writes `log_dir/replication-offset-checkpoint` with the entries `(topic, partition,
/// high_watermark)`, in the order given (distinct partitions), atomically: what
/// [`write_high_watermarks`] does without a map of owned keys (the replica manager's
/// checkpoint borrows its partitions' names). The count line is the entries written.
/// Errors: `LogError::Io`.
pub fn write_high_watermark_entries<'a>(
    log_dir: &Path,
    entries: impl Iterator<Item = (&'a str, i32, i64)>,
) -> Result<(), LogError> {
    use std::fmt::Write as _;
    let mut lines = String::new();
    let mut count = 0usize;
    for (topic, index, offset) in entries {
        let _ = writeln!(lines, "{topic} {index} {offset}");
        count += 1;
    }
    let text = format!("{CHECKPOINT_VERSION}\n{count}\n{lines}");
    write_atomically(log_dir, REPLICATION_OFFSET_CHECKPOINT_FILE, &text)
}

/// Reads `log_dir/replication-offset-checkpoint`. A missing file gives no entries; an
/// unreadable or malformed one gives no entries and a `tracing::warn!` (callers then
/// behave as with no checkpoint). Never fails.
pub fn read_high_watermarks(log_dir: &Path) -> HighWatermarks {
    let path = log_dir.join(REPLICATION_OFFSET_CHECKPOINT_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => parse_high_watermarks(&text).unwrap_or_else(|| {
            tracing::warn!(file = %path.display(), "malformed high watermark checkpoint; ignored (leaders start at their log end offset)");
            HighWatermarks::new()
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => HighWatermarks::new(),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "unreadable high watermark checkpoint; ignored (leaders start at their log end offset)");
            HighWatermarks::new()
        }
    }
}

/// `None` unless version 0 with exactly the announced number of `topic partition offset`
/// lines (partition and offset non-negative, no duplicate partition). The count is only
/// compared, never used to allocate.
fn parse_high_watermarks(text: &str) -> Option<HighWatermarks> {
    let mut lines = text.lines();
    if lines.next()?.trim().parse::<i32>().ok()? != CHECKPOINT_VERSION {
        return None;
    }
    let count: usize = lines.next()?.trim().parse().ok()?;
    let mut entries = HighWatermarks::new();
    for line in lines.by_ref().take(count) {
        let mut fields = line.split_whitespace();
        let topic = fields.next()?;
        let index: i32 = fields.next()?.parse().ok()?;
        let offset: i64 = fields.next()?.parse().ok()?;
        if fields.next().is_some() || index < 0 || offset < 0 {
            return None;
        }
        if entries.insert((topic.to_string(), index), offset).is_some() {
            return None;
        }
    }
    if entries.len() != count || lines.any(|line| !line.trim().is_empty()) {
        return None;
    }
    Some(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's format, written and read back; a missing file is empty.
    #[test]
    fn high_watermarks_round_trip_in_kafkas_format() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read_high_watermarks(dir.path()).is_empty());
        let mut hws = HighWatermarks::new();
        hws.insert(("orders".into(), 1), 98);
        hws.insert(("orders".into(), 0), 120);
        hws.insert(("__consumer_offsets".into(), 7), 0);
        write_high_watermarks(dir.path(), &hws).unwrap();
        let path = dir.path().join(REPLICATION_OFFSET_CHECKPOINT_FILE);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "0\n3\n__consumer_offsets 7 0\norders 0 120\norders 1 98\n"
        );
        assert!(!dir
            .path()
            .join(format!("{REPLICATION_OFFSET_CHECKPOINT_FILE}.tmp"))
            .exists());
        assert_eq!(read_high_watermarks(dir.path()), hws);
        // Kafka's own file (which may end without a trailing newline) reads the same.
        std::fs::write(&path, "0\n1\nt 0 5").unwrap();
        assert_eq!(
            read_high_watermarks(dir.path()),
            HighWatermarks::from([(("t".to_string(), 0), 5)])
        );
    }

    /// A corrupt file is no checkpoint, never a panic or an error.
    #[test]
    fn a_malformed_checkpoint_reads_as_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(REPLICATION_OFFSET_CHECKPOINT_FILE);
        for bad in [
            "",
            "1\n0\n",
            "0\n2\nt 0 5\n",
            "0\n1\nt 0 5\nt 1 6\n",
            "0\n1\nt x 5\n",
            "0\n1\nt 0 -5\n",
            "0\n1\nt 0 5 9\n",
            "0\n2\nt 0 5\nt 0 6\n",
            "0\n18446744073709551616\n",
        ] {
            std::fs::write(&path, bad).unwrap();
            assert!(read_high_watermarks(dir.path()).is_empty(), "{bad:?}");
        }
        std::fs::write(&path, [0xff, 0xfe, 0x00]).unwrap();
        assert!(read_high_watermarks(dir.path()).is_empty());
    }
}
