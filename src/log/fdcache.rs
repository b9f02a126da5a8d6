//! The process-wide cache of segment file descriptors: every partition's segments share
//! one bound (`log.open.files.max`), so a broker can host far more partitions than its
//! `RLIMIT_NOFILE` allows open files (issue 15: 10,000 partitions used to fail at about
//! 6,500 with three descriptors held per partition).
//!
//! Owns: each segment's [`Slot`] (its `.log`, and for the active segment its `.index`
//! and `.timeindex` opened for appending), which may be closed at any time and is
//! reopened on demand; the count of descriptors held open by all slots, the bound, and
//! the evictions. Never does: decide what is written (the segment does), or hold any
//! other file (checkpoints, `.txnindex`, producer snapshots and directory handles are
//! opened for one operation and closed: they are not long-lived).
//!
//! Design:
//! - **CLOCK (second chance).** A use of a slot stores `true` in its `referenced` flag (one
//!   atomic store) after locking only that slot; the global lock is taken only when a
//!   slot opens a file. Then, while more descriptors are open than the bound, the hand
//!   sweeps the ring of open slots: a referenced slot loses its flag and is passed over, an
//!   unreferenced one is closed (all its descriptors) and leaves the ring. The sweep visits
//!   at most twice the ring, so an opener never waits long.
//! - **No lock-order deadlock.** The opener holds its slot's lock, then the global one;
//!   the sweep holds the global lock and only `try_lock`s slots, passing over a busy one
//!   (busy means in use: it should stay open anyway).
//! - **Closing loses nothing.** Appends go through `write(2)` on an `O_APPEND` handle, so
//!   the bytes are in the page cache (the inode's, not the descriptor's) when the call
//!   returns; closing a descriptor discards no dirty page. An fsync through a handle
//!   reopened later flushes the inode's dirty pages whichever descriptor wrote them, and
//!   since Linux 4.16 a writeback error nobody has seen yet is reported to the first
//!   fsync after a reopen too (errseq "report once"). Positions are not descriptor state
//!   either: reads are positional (`pread`) and appends go to the end.
//! - **Soft bound.** [`Slot::log`] hands out an `Arc<File>`: a read (or a compaction
//!   snapshot) keeps its descriptor until done even if the slot is closed meanwhile, so
//!   the descriptors really open are at most the bound plus the reads and compactions in
//!   flight (each holds one) plus the segments of Fetch responses waiting to be sent
//!   (a `FileRegion` holds its file until the socket writer has sent it, issue 17). The sweep also passes over slots locked at that instant.
//!   The broker leaves the rest of `RLIMIT_NOFILE` to sockets and transient files.
//! - **Reopened by path, checked by inode.** An open descriptor follows its file through
//!   a rename; a path does not. The slot remembers the `.log`'s device and inode and
//!   refuses a reopen that finds another file there (a deleted partition's directory is
//!   renamed away and the topic may be created again under the same name; the partition
//!   already refuses every operation after a delete, this is the second fence). The
//!   cleaner's copy keeps its inode when renamed into place (`Slot::set_log_path`).
//! - The ring holds `Weak` references: a segment dropped (deleted, replaced) closes its
//!   files and gives back its count at once; its dead entry is removed by the next sweep
//!   or compaction of the ring (kept at most about twice the live entries).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError, Weak};

use super::segment::io_error;
use super::LogError;

/// The bound until [`configure`] sets one (unit tests, tools opening logs directly).
const DEFAULT_MAX_OPEN: usize = 4096;
/// The ring is compacted (dead entries dropped) when it grows past this many entries, or
/// twice its live entries after the last compaction, whichever is larger.
const RING_COMPACT_MIN: usize = 1024;
/// Fewest descriptors the cache may use, whatever is configured: one active segment's
/// three files plus a reader.
pub const MIN_OPEN: usize = 4;

/// The three files a slot may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IndexFile {
    /// `<base>.index`.
    Offset,
    /// `<base>.timeindex`.
    Time,
}

/// Descriptor counts of the cache, for `/metrics` and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFileStats {
    /// Segment descriptors the cache holds open now (reads in flight may hold a few
    /// more: see the module doc).
    pub open: usize,
    /// The bound (`log.open.files.max`).
    pub max_open: usize,
    /// Slots closed by the sweep since the process started.
    pub evictions: u64,
}

/// A bound on open segment descriptors shared by every slot that names it.
#[derive(Debug)]
pub(crate) struct FdCache {
    max_open: AtomicUsize,
    open: AtomicUsize,
    evictions: AtomicU64,
    clock: Mutex<Clock>,
}

#[derive(Debug)]
struct Clock {
    ring: Vec<Weak<Slot>>,
    hand: usize,
    compact_at: usize,
}

static GLOBAL: FdCache = FdCache::new(DEFAULT_MAX_OPEN);

/// The process' cache, used by every segment.
pub(crate) fn global() -> &'static FdCache {
    &GLOBAL
}

/// Sets the process-wide bound (`log.open.files.max`, at least [`MIN_OPEN`]); the next
/// open closes idle slots down to it.
pub fn configure(max_open: usize) {
    GLOBAL
        .max_open
        .store(max_open.max(MIN_OPEN), Ordering::Relaxed);
}

/// The process-wide cache's figures now.
pub fn stats() -> OpenFileStats {
    GLOBAL.stats()
}

/// `RLIMIT_NOFILE` of this process before and after [`raise_nofile_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NofileLimit {
    /// The soft limit found at start-up (`None`: unlimited).
    pub soft_before: Option<u64>,
    /// The soft limit now.
    pub soft: Option<u64>,
    /// The hard limit.
    pub hard: Option<u64>,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (what a broker serving many
/// partitions and connections needs; the JVM does the same for Kafka with
/// `-XX:+MaxFDLimit`). An unlimited hard limit is left alone (Linux refuses an
/// unlimited soft `NOFILE`). Errors: the `getrlimit`/`setrlimit` failure.
pub fn raise_nofile_limit() -> std::io::Result<NofileLimit> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let limit = getrlimit(Resource::Nofile);
    let soft_before = limit.current;
    if limit.maximum.is_some() && limit.current != limit.maximum {
        setrlimit(
            Resource::Nofile,
            rustix::process::Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            },
        )?;
    }
    let now = getrlimit(Resource::Nofile);
    Ok(NofileLimit {
        soft_before,
        soft: now.current,
        hard: now.maximum,
    })
}

/// The bound `log.open.files.max = 0` stands for: half the soft `RLIMIT_NOFILE` (the
/// other half for sockets, the metadata log, plugins and files opened for one
/// operation), at least [`MIN_OPEN`]; 1,048,576 when unlimited.
pub fn derived_max_open(soft_nofile: Option<u64>) -> usize {
    let soft = soft_nofile.unwrap_or(2 << 20);
    usize::try_from(soft / 2)
        .unwrap_or(usize::MAX)
        .max(MIN_OPEN)
}

impl FdCache {
    pub(crate) const fn new(max_open: usize) -> FdCache {
        FdCache {
            max_open: AtomicUsize::new(max_open),
            open: AtomicUsize::new(0),
            evictions: AtomicU64::new(0),
            clock: Mutex::new(Clock {
                ring: Vec::new(),
                hand: 0,
                compact_at: RING_COMPACT_MIN,
            }),
        }
    }

    pub(crate) fn stats(&self) -> OpenFileStats {
        OpenFileStats {
            open: self.open.load(Ordering::Relaxed),
            max_open: self.max_open.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }

    fn clock(&self) -> MutexGuard<'_, Clock> {
        // A panic while holding it leaves the ring consistent (each step is whole).
        self.clock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `slot` (whose lock the caller holds, as `handles`) just opened `opened`
    /// descriptors: count them, put the slot in the ring, and close idle slots while
    /// the count is over the bound.
    fn admit(&self, slot: &Arc<Slot>, handles: &mut Handles, opened: usize) {
        self.open.fetch_add(opened, Ordering::Relaxed);
        let mut clock = self.clock();
        if !handles.in_ring {
            handles.in_ring = true;
            clock.ring.push(Arc::downgrade(slot));
            if clock.ring.len() >= clock.compact_at {
                clock.ring.retain(|w| w.strong_count() > 0);
                clock.hand = 0;
                clock.compact_at = (2 * clock.ring.len()).max(RING_COMPACT_MIN);
            }
        }
        let max = self.max_open.load(Ordering::Relaxed);
        let mut steps = 2 * clock.ring.len();
        while self.open.load(Ordering::Relaxed) > max && steps > 0 && !clock.ring.is_empty() {
            steps -= 1;
            if clock.hand >= clock.ring.len() {
                clock.hand = 0;
            }
            let hand = clock.hand;
            let Some(victim) = clock.ring[hand].upgrade() else {
                clock.ring.swap_remove(hand);
                continue;
            };
            if Arc::ptr_eq(&victim, slot) || victim.referenced.swap(false, Ordering::Relaxed) {
                clock.hand += 1;
                continue;
            }
            let locked = match victim.handles.try_lock() {
                Ok(h) => Some(h),
                Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
                Err(TryLockError::WouldBlock) => None,
            };
            let Some(mut victim_handles) = locked else {
                clock.hand += 1;
                continue;
            };
            let closed = victim_handles.close_all();
            victim_handles.in_ring = false;
            drop(victim_handles);
            self.open.fetch_sub(closed, Ordering::Relaxed);
            self.evictions.fetch_add(1, Ordering::Relaxed);
            clock.ring.swap_remove(hand);
        }
    }
}

/// The open handles of a slot, behind its lock.
#[derive(Debug)]
struct Handles {
    log_path: PathBuf,
    log: Option<Arc<File>>,
    offset_index: Option<File>,
    time_index: Option<File>,
    /// Whether the ring has an entry for this slot (it does while anything is open).
    in_ring: bool,
    /// Device and inode of the `.log` when first opened: a reopen finding another file
    /// at the path (the directory renamed away by a delete and the topic created again)
    /// is refused rather than read or appended to.
    identity: Option<(u64, u64)>,
}

impl Handles {
    fn count(&self) -> usize {
        usize::from(self.log.is_some())
            + usize::from(self.offset_index.is_some())
            + usize::from(self.time_index.is_some())
    }

    /// Closes every handle (a reader's `Arc<File>` stays open until it is done); returns
    /// how many the slot held.
    fn close_all(&mut self) -> usize {
        let n = self.count();
        self.log = None;
        self.offset_index = None;
        self.time_index = None;
        n
    }
}

/// One segment's files: closed at any time by the cache, reopened on demand. The `.log`
/// is opened read + append (`O_APPEND`: appends go to the end whatever the handle); the
/// indexes append-only, and only when the segment writes or syncs them (active
/// segment).
#[derive(Debug)]
pub(crate) struct Slot {
    cache: &'static FdCache,
    offset_index_path: PathBuf,
    time_index_path: PathBuf,
    referenced: AtomicBool,
    handles: Mutex<Handles>,
}

impl Slot {
    /// A slot with nothing open for the segment at `log_path` whose indexes are
    /// `offset_index_path` and `time_index_path`.
    pub(crate) fn new(
        cache: &'static FdCache,
        log_path: PathBuf,
        offset_index_path: PathBuf,
        time_index_path: PathBuf,
    ) -> Arc<Slot> {
        Arc::new(Slot {
            cache,
            offset_index_path,
            time_index_path,
            referenced: AtomicBool::new(false),
            handles: Mutex::new(Handles {
                log_path,
                log: None,
                offset_index: None,
                time_index: None,
                in_ring: false,
                identity: None,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Handles> {
        self.referenced.store(true, Ordering::Relaxed);
        // Each handle is set or cleared whole: a panic elsewhere leaves them usable.
        self.handles.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The `.log`, opened now if the cache had closed it. The caller may keep the
    /// `Arc` for as long as one read or write takes. Errors: `Io` (open).
    pub(crate) fn log(self: &Arc<Self>) -> Result<Arc<File>, LogError> {
        let mut handles = self.lock();
        if let Some(file) = &handles.log {
            return Ok(Arc::clone(file));
        }
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(&handles.log_path)
            .map_err(io_error("open", &handles.log_path))?;
        let meta = file
            .metadata()
            .map_err(io_error("stat", &handles.log_path))?;
        let identity = (meta.dev(), meta.ino());
        if *handles.identity.get_or_insert(identity) != identity {
            return Err(io_error("open", &handles.log_path)(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "another file is at the segment's path now (renamed away or deleted)",
            )));
        }
        let file = Arc::new(file);
        handles.log = Some(Arc::clone(&file));
        self.cache.admit(self, &mut handles, 1);
        Ok(file)
    }

    /// Runs `f` on the index file `which`, opened (append-only) now if needed. Errors:
    /// `Io` (open, or what `f` returns, with the index's path).
    pub(crate) fn with_index(
        self: &Arc<Self>,
        which: IndexFile,
        op: &'static str,
        f: impl FnOnce(&mut File) -> std::io::Result<()>,
    ) -> Result<(), LogError> {
        let path = match which {
            IndexFile::Offset => &self.offset_index_path,
            IndexFile::Time => &self.time_index_path,
        };
        let mut handles = self.lock();
        let slot = match which {
            IndexFile::Offset => &mut handles.offset_index,
            IndexFile::Time => &mut handles.time_index,
        };
        let opened = if slot.is_none() {
            let file = OpenOptions::new()
                .append(true)
                .open(path)
                .map_err(io_error("open", path))?;
            *slot = Some(file);
            true
        } else {
            false
        };
        let file = slot.as_mut().expect("just opened");
        let result = f(file).map_err(io_error(op, path));
        if opened {
            self.cache.admit(self, &mut handles, 1);
        }
        result
    }

    /// Appends `bytes` to the index file `which` (tests). Errors: `Io`.
    #[cfg(test)]
    pub(crate) fn append_index(
        self: &Arc<Self>,
        which: IndexFile,
        bytes: &[u8],
    ) -> Result<(), LogError> {
        self.with_index(which, "write", |f| std::io::Write::write_all(f, bytes))
    }

    /// The `.log` was renamed to `path` (the cleaner's copy put in place): reopen there.
    pub(crate) fn set_log_path(&self, path: PathBuf) {
        self.lock().log_path = path;
    }

    /// Closes the index handles (the segment is no longer active).
    pub(crate) fn close_indexes(&self) {
        let mut handles = self.lock();
        let n = usize::from(handles.offset_index.take().is_some())
            + usize::from(handles.time_index.take().is_some());
        self.cache.open.fetch_sub(n, Ordering::Relaxed);
    }

    /// Closes everything now, as an eviction does (tests; the slot stays usable).
    #[cfg(test)]
    pub(crate) fn close(&self) {
        let n = self.lock().close_all();
        self.cache.open.fetch_sub(n, Ordering::Relaxed);
    }

    /// Descriptors this slot holds open now.
    #[cfg(test)]
    pub(crate) fn open_count(&self) -> usize {
        self.lock().count()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let handles = self.handles.get_mut().unwrap_or_else(|p| p.into_inner());
        let n = handles.close_all();
        self.cache.open.fetch_sub(n, Ordering::Relaxed);
    }
}

/// The index paths of a segment whose `.log` is `log_path`, for [`Slot::new`].
pub(crate) fn slot_for(dir: &Path, base_offset: i64, log_path: PathBuf) -> Arc<Slot> {
    Slot::new(
        global(),
        log_path,
        super::segment::file_path(dir, base_offset, "index"),
        super::segment::file_path(dir, base_offset, "timeindex"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    fn leaked(max: usize) -> &'static FdCache {
        Box::leak(Box::new(FdCache::new(max)))
    }

    fn slot_in(cache: &'static FdCache, dir: &Path, name: &str) -> Arc<Slot> {
        let log = dir.join(format!("{name}.log"));
        let offset = dir.join(format!("{name}.index"));
        let time = dir.join(format!("{name}.timeindex"));
        for p in [&log, &offset, &time] {
            std::fs::write(p, b"").unwrap();
        }
        Slot::new(cache, log, offset, time)
    }

    fn read_all(slot: &Arc<Slot>) -> Vec<u8> {
        let f = slot.log().unwrap();
        let len = f.metadata().unwrap().len() as usize;
        let mut buf = vec![0u8; len];
        f.read_exact_at(&mut buf, 0).unwrap();
        buf
    }

    #[test]
    fn the_bound_holds_and_idle_slots_are_evicted_first() {
        let dir = tempfile::tempdir().unwrap();
        let cache = leaked(4);
        let slots: Vec<_> = (0..10)
            .map(|i| slot_in(cache, dir.path(), &i.to_string()))
            .collect();
        for (i, s) in slots.iter().enumerate() {
            (&*s.log().unwrap()).write_all(&[i as u8]).unwrap();
            assert!(cache.stats().open <= 4, "{:?}", cache.stats());
        }
        assert_eq!(cache.stats().open, 4);
        assert_eq!(cache.stats().evictions, 6);
        // Every slot reads back what was written, evicted or not (reopened on demand).
        for (i, s) in slots.iter().enumerate() {
            assert_eq!(read_all(s), vec![i as u8]);
            assert!(cache.stats().open <= 4);
        }
        // Dropping slots gives their descriptors back.
        drop(slots);
        assert_eq!(cache.stats().open, 0);
    }

    #[test]
    fn a_slot_used_between_opens_gets_a_second_chance() {
        let dir = tempfile::tempdir().unwrap();
        let cache = leaked(4);
        let slots: Vec<_> = (0..7)
            .map(|i| slot_in(cache, dir.path(), &i.to_string()))
            .collect();
        for s in &slots[..5] {
            s.log().unwrap();
        }
        assert_eq!(
            slots[0].open_count(),
            0,
            "all were referenced: the oldest goes"
        );
        for s in &slots[5..] {
            slots[2].log().unwrap();
            s.log().unwrap();
        }
        assert_eq!(slots[2].open_count(), 1, "the hot slot stayed open");
        assert_eq!(cache.stats().open, 4);
        assert_eq!(cache.stats().evictions, 3);
    }

    #[test]
    fn appends_and_index_writes_survive_eviction() {
        let dir = tempfile::tempdir().unwrap();
        let cache = leaked(MIN_OPEN);
        let a = slot_in(cache, dir.path(), "a");
        let others: Vec<_> = (0..6)
            .map(|i| slot_in(cache, dir.path(), &format!("o{i}")))
            .collect();
        for round in 0..5u8 {
            (&*a.log().unwrap()).write_all(&[round]).unwrap();
            a.append_index(IndexFile::Offset, &[round; 8]).unwrap();
            a.append_index(IndexFile::Time, &[round; 12]).unwrap();
            // Others push `a` out (it is never used meanwhile, so it loses its chance).
            for o in &others {
                o.log().unwrap();
                o.log().unwrap();
            }
            assert!(cache.stats().open <= MIN_OPEN, "{:?}", cache.stats());
        }
        assert!(cache.stats().evictions > 0);
        assert_eq!(read_all(&a), vec![0, 1, 2, 3, 4]);
        let offset = std::fs::read(dir.path().join("a.index")).unwrap();
        assert_eq!(offset.len(), 40);
        assert_eq!(offset[32..], [4u8; 8]);
        assert_eq!(
            std::fs::read(dir.path().join("a.timeindex")).unwrap().len(),
            60
        );
        // An fsync through a reopened handle works (and flushes the inode).
        a.close();
        a.log().unwrap().sync_data().unwrap();
    }

    #[test]
    fn a_reader_keeps_its_handle_across_eviction() {
        let dir = tempfile::tempdir().unwrap();
        let cache = leaked(MIN_OPEN);
        let a = slot_in(cache, dir.path(), "a");
        (&*a.log().unwrap()).write_all(b"kept").unwrap();
        let held = a.log().unwrap();
        a.close();
        assert_eq!(a.open_count(), 0);
        // Even unlinked, the held handle reads the file it was opened on.
        std::fs::remove_file(dir.path().join("a.log")).unwrap();
        let mut buf = [0u8; 4];
        held.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"kept");
        assert!(matches!(a.log(), Err(LogError::Io { op: "open", .. })));
        // Another file at the path (a topic created again) is not taken for this one.
        std::fs::write(dir.path().join("a.log"), b"other").unwrap();
        let e = a.log().unwrap_err();
        assert!(e.to_string().contains("another file"), "{e}");
    }
}
