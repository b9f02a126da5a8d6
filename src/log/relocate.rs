//! Moving a partition directory to another log dir (AlterReplicaLogDirs, KIP-113): the
//! file-system steps. The copy goes to `<dest>/<topic>-<partition>.<id>-future` (Kafka's
//! future log name, `LocalLog.logFutureDirName`) in passes ([`Copier::copy_pass`]); the
//! owner runs the early passes with no lock and the last one with the partition's writes
//! stopped, then [`Copier::commit`] swaps the copy in with two renames:
//!
//! 1. `<src>/<topic>-<partition>` → `<src>/<topic>-<partition>.<id>-delete` (the commit
//!    point: from here the future copy, complete and fsynced, is the partition),
//! 2. `<dest>/<topic>-<partition>.<id>-future` → `<dest>/<topic>-<partition>`,
//!
//! each made durable (the parent fsynced). A crash anywhere leaves exactly one copy that
//! start-up keeps ([`resolve_at_start`]): before step 1 the source is whole and the
//! future directory is discarded; between 1 and 2 there is no `<topic>-<partition>`
//! anywhere, a `-delete` of the same `<id>` proves the copy complete, and the future
//! directory is renamed into place (step 2 redone); after 2 the `-delete` directory is an
//! ordinary leftover. Two `<topic>-<partition>` directories never exist at once.
//!
//! What may change a file while the owner's early passes copy it, and how a pass sees it:
//! appends (the `.log` files grow: only the new tail is copied, up to the length taken
//! while appends were stopped; other files are copied again when their length or
//! modification time changed, or when that time was too recent to trust, [`RECENT`]),
//! retention (a file gone from the source goes from the copy), a truncation (the owner
//! passes `truncated`: every `.log` file is copied whole again). Compaction, which
//! rewrites closed segments in place, is kept off the partition by its owner while it
//! moves.
//!
//! Owns only the names and the file-system steps; who may write to the files meanwhile is
//! `replica.rs`'s concern.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::delete::{delete_dir_name_with, is_delete_dir};
use super::segment::{io_error, sync_dir};
use super::LogError;

/// The suffix of a partition's copy being made in another log dir (Kafka's
/// `LocalLog.FutureDirSuffix`).
pub const FUTURE_DIR_SUFFIX: &str = "-future";

/// A file modified this close to when its length was taken may change again without its
/// modification time moving (file systems keep it at a coarse clock's tick): it is copied
/// again by the next pass.
pub const RECENT: Duration = Duration::from_secs(2);

/// The log end offset of the copy in `future_dir` so far: the offset after the last
/// whole record batch of its newest `.log` file (a batch still being copied is not
/// counted), the file's base offset when it holds none yet, `None` when no `.log` file
/// was copied yet or the directory cannot be read. Reads only batch headers (offset and
/// length, then `lastOffsetDelta`), so it costs a few reads per batch of the newest
/// segment. What DescribeLogDirs' `offset_lag` of a future replica is measured against
/// (Kafka's `max(current LEO - future LEO, 0)`).
pub fn copied_log_end(future_dir: &Path) -> Option<i64> {
    use std::os::unix::fs::FileExt;
    let mut newest: Option<(i64, PathBuf)> = None;
    for entry in std::fs::read_dir(future_dir).ok()?.flatten() {
        let name = entry.file_name();
        let Some(base) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|stem| stem.parse::<i64>().ok())
        else {
            continue;
        };
        if newest.as_ref().is_none_or(|(b, _)| base > *b) {
            newest = Some((base, entry.path()));
        }
    }
    let (base, path) = newest?;
    let file = std::fs::File::open(&path).ok()?;
    let len = file.metadata().ok()?.len();
    // baseOffset (8) batchLength (4) partitionLeaderEpoch (4) magic (1) crc (4)
    // attributes (2) lastOffsetDelta (4): the first 27 bytes of a record batch.
    let mut header = [0u8; 27];
    let (mut position, mut end) = (0u64, base);
    while position + header.len() as u64 <= len {
        if file.read_exact_at(&mut header, position).is_err() {
            break;
        }
        let base_offset = i64::from_be_bytes(header[0..8].try_into().ok()?);
        let batch_length = i32::from_be_bytes(header[8..12].try_into().ok()?);
        let last_offset_delta = i32::from_be_bytes(header[23..27].try_into().ok()?);
        let size = 12 + u64::try_from(batch_length).ok()?;
        if batch_length < 49 || position + size > len {
            break;
        }
        end = base_offset
            .saturating_add(i64::from(last_offset_delta))
            .saturating_add(1);
        position += size;
    }
    Some(end)
}

/// Whether `name` (an entry of a log dir) is a future copy.
pub fn is_future_dir(name: &str) -> bool {
    name.ends_with(FUTURE_DIR_SUFFIX)
}

/// `(partition directory name, id)` of a future directory's name
/// (`<topic>-<partition>.<id>-future`); `None` for any other name.
pub fn parse_future_dir(name: &str) -> Option<(&str, &str)> {
    name.strip_suffix(FUTURE_DIR_SUFFIX)?.rsplit_once('.')
}

/// One file of the source directory as seen with the partition's writes stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileState {
    /// Length in bytes.
    pub len: u64,
    /// Last modification.
    pub modified: SystemTime,
}

/// What [`snapshot`] returns: each file's state, and when they were taken.
pub type Snapshot = (HashMap<OsString, FileState>, SystemTime);

/// The regular files of `dir` with their lengths and modification times, taken by the
/// owner while nothing writes to them ([`Copier::copy_pass`] copies up to these lengths),
/// with the time they were taken.
///
/// Errors: [`LogError::Io`]: `dir` cannot be listed.
pub fn snapshot(dir: &Path) -> Result<Snapshot, LogError> {
    let taken = SystemTime::now();
    let mut files = HashMap::new();
    for entry in std::fs::read_dir(dir).map_err(io_error("list", dir))? {
        let entry = entry.map_err(io_error("list", dir))?;
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        files.insert(
            entry.file_name(),
            FileState {
                len: meta.len(),
                modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            },
        );
    }
    Ok((files, taken))
}

/// A copy of one partition directory into another log dir, in passes.
#[derive(Debug)]
pub struct Copier {
    /// `<src log dir>/<topic>-<partition>`.
    source: PathBuf,
    /// `<dest log dir>/<topic>-<partition>.<id>-future`.
    future: PathBuf,
    /// `<dest log dir>/<topic>-<partition>`.
    target: PathBuf,
    /// The id in the future and (after commit) the source's `-delete` name.
    id: String,
    /// What each file was when last copied, and whether that state was recent.
    copied: HashMap<OsString, (FileState, bool)>,
}

impl Copier {
    /// Starts a copy of `source` (`<log dir>/<topic>-<partition>`) into `dest_log_dir`:
    /// creates the empty future directory there.
    ///
    /// Errors: [`LogError::Io`]: it cannot be created.
    pub fn new(source: &Path, dest_log_dir: &Path) -> Result<Copier, LogError> {
        let name = source
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let id = uuid::Uuid::new_v4().as_simple().to_string();
        let future = dest_log_dir.join(format!("{name}.{id}{FUTURE_DIR_SUFFIX}"));
        std::fs::create_dir_all(&future).map_err(io_error("create future directory", &future))?;
        Ok(Copier {
            source: source.to_path_buf(),
            target: dest_log_dir.join(&name),
            future,
            id,
            copied: HashMap::new(),
        })
    }

    /// The future directory.
    pub fn future_dir(&self) -> &Path {
        &self.future
    }

    /// Brings the copy up to `files` (a [`snapshot`] of the source taken at `taken`):
    /// copies what is new or changed (see the module doc), removes from the copy what the
    /// source no longer has, fsyncs what it wrote. `truncated`: the log was truncated
    /// since the last pass (every `.log` file is copied whole). A file gone from the
    /// source meanwhile is skipped (retention removed it; the next pass drops it). Returns
    /// the bytes copied.
    ///
    /// Errors: [`LogError::Io`] reading the source or writing the copy.
    pub fn copy_pass(
        &mut self,
        files: &HashMap<OsString, FileState>,
        taken: SystemTime,
        truncated: bool,
    ) -> Result<u64, LogError> {
        let mut bytes = 0;
        let stale: Vec<OsString> = self
            .copied
            .keys()
            .filter(|n| !files.contains_key(*n))
            .cloned()
            .collect();
        for name in stale {
            let path = self.future.join(&name);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error("remove", &path)(e)),
            }
            self.copied.remove(&name);
        }
        for (name, state) in files {
            let recent = taken
                .duration_since(state.modified)
                .map_or(true, |age| age < RECENT);
            let append_only = !truncated && Path::new(name).extension().is_some_and(|e| e == "log");
            let from = match self.copied.get(name) {
                Some((was, was_recent)) if was == state && !was_recent => continue,
                Some((was, _)) if append_only && was.len <= state.len => was.len,
                _ => 0,
            };
            match self.copy_file(name, from, state.len) {
                Ok(n) => bytes += n,
                Err(LogError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    self.copied.remove(name);
                    continue;
                }
                Err(e) => return Err(e),
            }
            self.copied.insert(name.clone(), (state.clone(), recent));
        }
        sync_dir(&self.future)?;
        Ok(bytes)
    }

    /// Copies bytes `from..len` of source file `name` into the copy (truncated to `len`
    /// first), then fsyncs it.
    fn copy_file(&self, name: &OsString, from: u64, len: u64) -> Result<u64, LogError> {
        let src_path = self.source.join(name);
        let dst_path = self.future.join(name);
        let mut src = std::fs::File::open(&src_path).map_err(io_error("open", &src_path))?;
        let mut dst = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&dst_path)
            .map_err(io_error("create", &dst_path))?;
        dst.set_len(from).map_err(io_error("truncate", &dst_path))?;
        src.seek(SeekFrom::Start(from))
            .map_err(io_error("seek", &src_path))?;
        dst.seek(SeekFrom::Start(from))
            .map_err(io_error("seek", &dst_path))?;
        let want = len.saturating_sub(from);
        let copied = std::io::copy(&mut (&mut src).take(want), &mut dst)
            .map_err(io_error("copy", &dst_path))?;
        if copied < want {
            // Shorter than when the length was taken: retention or a truncation is
            // racing this pass; the next pass (with writes stopped) sees the truth.
            dst.set_len(from + copied)
                .map_err(io_error("truncate", &dst_path))?;
        }
        dst.flush().map_err(io_error("write", &dst_path))?;
        dst.sync_all().map_err(io_error("fsync", &dst_path))?;
        Ok(copied)
    }

    /// Swaps the copy in (steps 1 and 2 of the module doc). The caller has stopped every
    /// writer of the source and run a last [`Copier::copy_pass`] with them stopped.
    /// Returns `(new partition directory, renamed source to remove later)`.
    ///
    /// Errors: [`LogError::Io`]. A failure at either step leaves the source in place under
    /// its own name (step 1 is undone when step 2 fails); the caller aborts.
    pub fn commit(&self) -> Result<(PathBuf, PathBuf), LogError> {
        let src_parent = self.source.parent().unwrap_or(Path::new("."));
        let name = self
            .source
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let renamed = src_parent.join(delete_dir_name_with(&name, &self.id));
        std::fs::rename(&self.source, &renamed)
            .map_err(io_error("rename for move", &self.source))?;
        sync_dir(src_parent)?;
        let dest_parent = self.target.parent().unwrap_or(Path::new("."));
        if let Err(e) = std::fs::rename(&self.future, &self.target) {
            // Step 1 undone: the source is the partition again.
            if let Err(back) = std::fs::rename(&renamed, &self.source) {
                tracing::error!(dir = %renamed.display(), error = %back, "cannot rename a moved partition's source back; a restart finishes the move");
            }
            return Err(io_error("rename future directory", &self.future)(e));
        }
        sync_dir(dest_parent)?;
        Ok((self.target.clone(), renamed))
    }

    /// Undoes a [`Copier::commit`] (or its first step): the copy back to its future name,
    /// the source back to its own name. For a log that cannot be opened from the copy.
    ///
    /// Errors: [`LogError::Io`]: a rename failed (start-up then keeps whichever copy the
    /// names say, [`resolve_at_start`]).
    pub fn undo_commit(&self, renamed_source: &Path) -> Result<(), LogError> {
        if self.target.exists() {
            std::fs::rename(&self.target, &self.future)
                .map_err(io_error("rename back", &self.target))?;
        }
        std::fs::rename(renamed_source, &self.source)
            .map_err(io_error("rename back", renamed_source))?;
        if let Some(p) = self.source.parent() {
            sync_dir(p)?;
        }
        Ok(())
    }

    /// Gives the copy up: removes the future directory.
    pub fn abort(self) {
        if let Err(e) = std::fs::remove_dir_all(&self.future) {
            tracing::warn!(dir = %self.future.display(), error = %e, "cannot remove the copy of an abandoned move; removed at the next start");
        }
    }
}

/// What start-up does with the future directories in `log_dirs` (module doc): renames
/// each committed one into place and returns the others (moves that never committed, or
/// of partitions deleted meanwhile) for removal. Runs before any partition is opened.
///
/// Errors: [`LogError::Io`]: a log dir cannot be listed, or a rename fails.
pub fn resolve_at_start(log_dirs: &[PathBuf]) -> Result<Vec<PathBuf>, LogError> {
    let mut names: Vec<(PathBuf, Vec<String>)> = Vec::new();
    for dir in log_dirs {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_error("list", dir)(e)),
        };
        let mut list = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_error("list", dir))?;
            if let Some(n) = entry.file_name().to_str() {
                list.push(n.to_string());
            }
        }
        names.push((dir.clone(), list));
    }
    let mut discard = Vec::new();
    for (dir, list) in &names {
        for future in list.iter().filter(|n| is_future_dir(n)) {
            let path = dir.join(future);
            let Some((partition, id)) = parse_future_dir(future) else {
                discard.push(path);
                continue;
            };
            let current = names.iter().any(|(_, l)| l.iter().any(|n| n == partition));
            let committed = names.iter().any(|(_, l)| {
                l.iter()
                    .any(|n| is_delete_dir(n) && *n == delete_dir_name_with(partition, id))
            });
            if !current && committed {
                let target = dir.join(partition);
                std::fs::rename(&path, &target).map_err(io_error("finish move", &path))?;
                sync_dir(dir)?;
                tracing::info!(dir = %target.display(), "finished a partition move a stop interrupted after its commit");
            } else {
                tracing::info!(dir = %path.display(), "discarding the copy of a partition move that did not commit");
                discard.push(path);
            }
        }
    }
    Ok(discard)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, bytes: &[u8]) {
        std::fs::write(path, bytes).unwrap();
    }

    fn pass(c: &mut Copier, src: &Path) -> u64 {
        let (files, taken) = snapshot(src).unwrap();
        c.copy_pass(&files, taken, false).unwrap()
    }

    /// Bytes of a record batch's frame: `base`, `count` records, `length` after the
    /// length field; the rest zeros (only headers are read).
    fn batch_frame(base: i64, count: i32, length: i32) -> Vec<u8> {
        let mut b = vec![0u8; 12 + length as usize];
        b[0..8].copy_from_slice(&base.to_be_bytes());
        b[8..12].copy_from_slice(&length.to_be_bytes());
        b[23..27].copy_from_slice(&(count - 1).to_be_bytes());
        b
    }

    #[test]
    fn the_copied_log_end_is_after_the_last_whole_batch_of_the_newest_segment() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(copied_log_end(dir.path()), None, "nothing copied yet");
        write(
            &dir.path().join("00000000000000000000.log"),
            &batch_frame(0, 10, 60),
        );
        write(&dir.path().join("00000000000000000010.log"), b"");
        assert_eq!(
            copied_log_end(dir.path()),
            Some(10),
            "the newest segment is empty"
        );
        let mut newest = batch_frame(10, 5, 60);
        newest.extend(batch_frame(15, 3, 80));
        let third = batch_frame(18, 4, 70);
        newest.extend_from_slice(&third[..40]);
        write(&dir.path().join("00000000000000000010.log"), &newest);
        assert_eq!(
            copied_log_end(dir.path()),
            Some(18),
            "a batch copied in part does not count"
        );
        write(&dir.path().join("00000000000000000010.index"), b"not a log");
        assert_eq!(copied_log_end(dir.path()), Some(18));
    }

    #[test]
    fn passes_copy_appends_and_drop_removed_files_then_commit_swaps() {
        let root = tempfile::tempdir().unwrap();
        let (a, b) = (root.path().join("a"), root.path().join("b"));
        std::fs::create_dir_all(a.join("t-0")).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let src = a.join("t-0");
        write(&src.join("00000000000000000000.log"), b"first");
        write(&src.join("00000000000000000000.index"), b"ix");
        let mut c = Copier::new(&src, &b).unwrap();
        assert_eq!(pass(&mut c, &src), 7);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(src.join("00000000000000000000.log"))
            .unwrap();
        f.write_all(b"+more").unwrap();
        std::fs::remove_file(src.join("00000000000000000000.index")).unwrap();
        pass(&mut c, &src);
        let future = c.future_dir().to_path_buf();
        assert_eq!(
            std::fs::read(future.join("00000000000000000000.log")).unwrap(),
            b"first+more"
        );
        assert!(!future.join("00000000000000000000.index").exists());
        let (target, renamed) = c.commit().unwrap();
        assert_eq!(target, b.join("t-0"));
        assert!(!src.exists() && target.is_dir() && renamed.is_dir());
        assert!(is_delete_dir(
            renamed.file_name().unwrap().to_str().unwrap()
        ));
    }

    #[test]
    fn start_up_keeps_exactly_one_copy_at_every_crash_point() {
        let root = tempfile::tempdir().unwrap();
        let (a, b) = (root.path().join("a"), root.path().join("b"));
        let dirs = [a.clone(), b.clone()];
        let setup = || {
            let _ = std::fs::remove_dir_all(&a);
            let _ = std::fs::remove_dir_all(&b);
            std::fs::create_dir_all(a.join("t-0")).unwrap();
            std::fs::create_dir_all(&b).unwrap();
            write(&a.join("t-0").join("00000000000000000000.log"), b"data");
            let mut c = Copier::new(&a.join("t-0"), &b).unwrap();
            pass(&mut c, &a.join("t-0"));
            c
        };
        // Crash before the commit: the source stays, the copy goes.
        let c = setup();
        let discard = resolve_at_start(&dirs).unwrap();
        assert_eq!(discard, vec![c.future_dir().to_path_buf()]);
        assert!(a.join("t-0").is_dir() && !b.join("t-0").exists());
        // Crash between the two renames: the copy is renamed into place.
        let c = setup();
        let renamed = a.join(delete_dir_name_with("t-0", &c.id));
        std::fs::rename(a.join("t-0"), &renamed).unwrap();
        assert!(resolve_at_start(&dirs).unwrap().is_empty());
        assert!(b.join("t-0").join("00000000000000000000.log").is_file());
        assert!(!a.join("t-0").exists() && renamed.is_dir());
        // After the commit: nothing to do (the -delete directory is a plain leftover).
        let c = setup();
        c.commit().unwrap();
        assert!(resolve_at_start(&dirs).unwrap().is_empty());
        assert!(b.join("t-0").is_dir() && !a.join("t-0").exists());
    }
}
