//! The Raft log and state machine of `__cluster_metadata`, on disk under
//! `<log.dirs>/__cluster_metadata/raft/`.
//!
//! Owns: `log` (one frame per Raft entry: 4-byte big-endian length, 4-byte CRC-32C of
//! the body, the entry as JSON; appended and fdatasynced before openraft hears it is
//! durable; a torn or corrupt tail is cut at start-up), `state.json` (the vote and the
//! last purged log id: fsynced, written by rename), `committed` (the last committed log
//! id: renamed, not fsynced — a stale one only means fewer entries re-applied at start,
//! the leader's next commit brings the rest) and `snapshot.json` (the image as records
//! plus openraft's snapshot meta, by rename). The state machine applies each committed
//! entry to its own [`MetadataImage`] — all of an entry's records or none: an entry
//! whose records do not apply (two nodes proposed from stale images) is refused the same
//! way on every node — and queues what it applied for `Metadata` ([`CommittedQueue`]).
//!
//! Never does: networking, or call into `Metadata` (it only queues).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Debug;
use std::io::{Cursor, Read, Seek, SeekFrom, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, LogId, LogState, OptionalSend, RaftLogReader,
    RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError, StorageIOError, StoredMembership,
    Vote,
};
use serde::{Deserialize, Serialize};

use super::{Proposal, ProposalOutcome, TypeConfig};
use crate::cluster::image::{MetadataDelta, MetadataImage, MetadataRecord};

/// Largest Raft entry frame read back from disk (a limit on everything: a corrupt length
/// must not allocate gigabytes). A proposal is one metadata change, far below it.
const MAX_ENTRY_BYTES: usize = 64 << 20;

type NodeId = u64;

fn io_error(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::write(AnyError::new(&e)).into()
}

fn read_error(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::read(AnyError::new(&e)).into()
}

/// Writes `bytes` to `path` by a temporary file and a rename; with `durable`, fsyncs the
/// file before and the directory after.
fn replace_file(path: &Path, bytes: &[u8], durable: bool) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    if durable {
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if durable {
        if let Some(parent) = path.parent() {
            std::fs::File::open(parent)?.sync_all()?;
        }
    }
    Ok(())
}

/// What the state machine applied, for `Metadata` to apply to its own image in log order.
#[derive(Debug, Clone)]
pub(crate) enum CommittedChange {
    /// An entry's records, applied.
    Records(Vec<MetadataRecord>),
    /// An entry refused: its records did not apply to the image at its position.
    Refused(String),
    /// A snapshot installed from the leader: the whole image at that position.
    Image(Arc<MetadataImage>),
}

/// One applied entry: its Raft log index and what it changed.
#[derive(Debug, Clone)]
pub struct Committed {
    /// The Raft log index (`__cluster_metadata` offset) of the entry.
    pub(crate) offset: u64,
    /// What it changed.
    pub(crate) change: CommittedChange,
    /// The entry's [`Proposal::id`] (`None` for a snapshot, or an entry without one).
    pub(crate) proposal_id: Option<uuid::Uuid>,
}

/// The hand-over from the state machine (the Raft runtime) to `Metadata` (any thread):
/// the state machine pushes, never blocking; `Metadata` drains under its change lock, and
/// its follower thread is woken by each push, so the queue holds only what was applied
/// since the last drain. Back the other way, `Metadata` marks the last entry its image
/// (and its listeners) took ([`CommittedQueue::mark_visible`]): what a peer's
/// `AwaitApplied` waits for ([`CommittedQueue::wait_visible`]).
#[derive(Debug)]
pub struct CommittedQueue {
    items: Mutex<VecDeque<Committed>>,
    pushed: Condvar,
    /// The index of the last entry in the broker's image (0: none yet).
    visible: tokio::sync::watch::Sender<u64>,
}

impl Default for CommittedQueue {
    fn default() -> CommittedQueue {
        CommittedQueue {
            items: Mutex::default(),
            pushed: Condvar::new(),
            visible: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl CommittedQueue {
    /// Notes that the broker's image holds every entry up to `offset` (published, every
    /// listener done): what readers of this broker's metadata see. Never goes back.
    pub(crate) fn mark_visible(&self, offset: u64) {
        self.visible.send_if_modified(|v| {
            let newer = offset > *v;
            if newer {
                *v = offset;
            }
            newer
        });
    }

    /// The index of the last entry in the broker's image (see [`Self::mark_visible`]).
    #[cfg(test)]
    pub(crate) fn visible(&self) -> u64 {
        *self.visible.borrow()
    }

    /// Waits until the broker's image holds the entry at `index`, at most `timeout`, and
    /// returns the last index it holds then (below `index` on timeout).
    pub(crate) async fn wait_visible(&self, index: u64, timeout: Duration) -> u64 {
        let mut rx = self.visible.subscribe();
        let _ = tokio::time::timeout(timeout, rx.wait_for(|v| *v >= index)).await;
        let visible = *rx.borrow();
        visible
    }

    fn push(&self, item: Committed) {
        self.items
            .lock()
            .expect("committed queue lock poisoned")
            .push_back(item);
        self.pushed.notify_all();
    }

    /// Everything queued, oldest first.
    pub(crate) fn drain(&self) -> Vec<Committed> {
        self.items
            .lock()
            .expect("committed queue lock poisoned")
            .drain(..)
            .collect()
    }

    /// The offset of the first queued entry of proposal `id` that applied (not refused),
    /// if any: a change tried again after a lost answer can be committed twice.
    pub(crate) fn first_applied(&self, id: uuid::Uuid) -> Option<u64> {
        self.items
            .lock()
            .expect("committed queue lock poisoned")
            .iter()
            .find(|c| c.proposal_id == Some(id) && matches!(c.change, CommittedChange::Records(_)))
            .map(|c| c.offset)
    }

    /// Waits up to `timeout` for the queue to hold an entry at `offset` or later (`None`:
    /// for anything); returns whether it does.
    pub(crate) fn wait_for(&self, offset: Option<u64>, timeout: Duration) -> bool {
        let ready = |items: &VecDeque<Committed>| match offset {
            None => !items.is_empty(),
            Some(o) => items.back().is_some_and(|c| c.offset >= o),
        };
        let items = self.items.lock().expect("committed queue lock poisoned");
        let (items, _) = self
            .pushed
            .wait_timeout_while(items, timeout, |items| !ready(items))
            .expect("committed queue lock poisoned");
        ready(&items)
    }
}

/// The vote and the purge point, fsynced together (`state.json`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct HardState {
    vote: Option<Vote<NodeId>>,
    last_purged: Option<LogId<NodeId>>,
}

#[derive(Debug)]
struct LogInner {
    dir: PathBuf,
    file: std::fs::File,
    /// Entries by index, with the file position of their frame.
    entries: BTreeMap<u64, (u64, Entry<TypeConfig>)>,
    end_pos: u64,
    hard: HardState,
    committed: Option<LogId<NodeId>>,
}

/// The Raft log store (openraft's `RaftLogStorage`): entries in `raft/log`, the vote in
/// `raft/state.json`. Cheap to clone (the reader openraft asks for is a clone).
#[derive(Debug, Clone)]
pub(crate) struct LogStore {
    inner: Arc<Mutex<LogInner>>,
}

fn encode_frame(entry: &Entry<TypeConfig>) -> std::io::Result<Vec<u8>> {
    let body = serde_json::to_vec(entry)?;
    let len = u32::try_from(body.len())
        .ok()
        .filter(|l| (*l as usize) <= MAX_ENTRY_BYTES)
        .ok_or_else(|| std::io::Error::other("raft entry too large"))?;
    let mut frame = Vec::with_capacity(body.len() + 8);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

impl LogStore {
    /// Opens (or creates) the log in `dir`, cutting a torn or corrupt tail.
    ///
    /// Errors: I/O, or a `state.json` that does not parse.
    pub(crate) fn open(dir: &Path) -> std::io::Result<LogStore> {
        std::fs::create_dir_all(dir)?;
        let hard: HardState = match std::fs::read(dir.join("state.json")) {
            Ok(bytes) => serde_json::from_slice(&bytes)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => HardState::default(),
            Err(e) => return Err(e),
        };
        let committed = match std::fs::read(dir.join("committed")) {
            Ok(bytes) => serde_json::from_slice(&bytes).ok().flatten(),
            Err(_) => None,
        };
        let path = dir.join("log");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let mut entries = BTreeMap::new();
        let mut pos = 0usize;
        let purged = hard.last_purged.map(|l| l.index);
        while bytes.len() - pos >= 8 {
            let len = u32::from_be_bytes(bytes[pos..pos + 4].try_into().expect("4 bytes")) as usize;
            let crc = u32::from_be_bytes(bytes[pos + 4..pos + 8].try_into().expect("4 bytes"));
            if len > MAX_ENTRY_BYTES || bytes.len() - pos - 8 < len {
                break;
            }
            let body = &bytes[pos + 8..pos + 8 + len];
            if crc32c::crc32c(body) != crc {
                break;
            }
            let Ok(entry) = serde_json::from_slice::<Entry<TypeConfig>>(body) else {
                break;
            };
            let index = entry.log_id.index;
            if purged.is_none_or(|p| index > p) {
                entries.insert(index, (pos as u64, entry));
            }
            pos += 8 + len;
        }
        if pos < bytes.len() {
            tracing::warn!(
                path = %path.display(),
                kept_bytes = pos,
                cut_bytes = bytes.len() - pos,
                "metadata log: cutting a torn or corrupt tail"
            );
            file.set_len(pos as u64)?;
            file.sync_all()?;
        }
        file.seek(SeekFrom::Start(pos as u64))?;
        Ok(LogStore {
            inner: Arc::new(Mutex::new(LogInner {
                dir: dir.to_path_buf(),
                file,
                entries,
                end_pos: pos as u64,
                hard,
                committed,
            })),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogInner> {
        self.inner.lock().expect("raft log lock poisoned")
    }

    /// Whether nothing was ever written: no entry, no vote (a first start).
    pub(crate) fn is_pristine(&self) -> bool {
        let inner = self.lock();
        inner.entries.is_empty() && inner.hard.vote.is_none() && inner.hard.last_purged.is_none()
    }
}

impl LogInner {
    fn save_hard(&self) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(&self.hard)?;
        replace_file(&self.dir.join("state.json"), &bytes, true)
    }

    /// Rewrites the log file with the entries kept (after a purge).
    fn rewrite(&mut self) -> std::io::Result<()> {
        let path = self.dir.join("log");
        let tmp = path.with_extension("tmp");
        let mut out = std::fs::File::create(&tmp)?;
        let mut pos = 0u64;
        let mut entries = BTreeMap::new();
        for (index, (_, entry)) in std::mem::take(&mut self.entries) {
            let frame = encode_frame(&entry)?;
            out.write_all(&frame)?;
            entries.insert(index, (pos, entry));
            pos += frame.len() as u64;
        }
        out.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(&self.dir)?.sync_all()?;
        self.file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)?;
        self.file.seek(SeekFrom::Start(pos))?;
        self.entries = entries;
        self.end_pos = pos;
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        Ok(self
            .lock()
            .entries
            .range(range)
            .map(|(_, (_, e))| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let inner = self.lock();
        let last_purged = inner.hard.last_purged;
        let last = inner
            .entries
            .values()
            .next_back()
            .map(|(_, e)| e.log_id)
            .or(last_purged);
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut inner = self.lock();
        inner.hard.vote = Some(*vote);
        inner.save_hard().map_err(io_error)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        Ok(self.lock().hard.vote)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        let mut inner = self.lock();
        inner.committed = committed;
        let bytes = serde_json::to_vec(&committed).map_err(io_error)?;
        replace_file(&inner.dir.join("committed"), &bytes, false).map_err(io_error)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(self.lock().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut inner = self.lock();
        let mut buf = Vec::new();
        let mut added = Vec::new();
        let mut pos = inner.end_pos;
        for entry in entries {
            let frame = encode_frame(&entry).map_err(io_error)?;
            buf.extend_from_slice(&frame);
            added.push((entry.log_id.index, (pos, entry)));
            pos += frame.len() as u64;
        }
        let written = inner
            .file
            .write_all(&buf)
            .and_then(|()| inner.file.sync_data());
        if let Err(e) = written {
            let message = e.to_string();
            callback.log_io_completed(Err(e));
            return Err(io_error(std::io::Error::other(message)));
        }
        inner.end_pos = pos;
        inner.entries.extend(added);
        drop(inner);
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut inner = self.lock();
        let Some(&(pos, _)) = inner.entries.get(&log_id.index) else {
            return Ok(());
        };
        drop(inner.entries.split_off(&log_id.index));
        inner.file.set_len(pos).map_err(io_error)?;
        inner.file.sync_all().map_err(io_error)?;
        inner.file.seek(SeekFrom::Start(pos)).map_err(io_error)?;
        inner.end_pos = pos;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut inner = self.lock();
        // The purge point first: entries at or below it are skipped at start-up even if
        // the rewrite below does not happen.
        inner.hard.last_purged = Some(log_id);
        inner.save_hard().map_err(io_error)?;
        let kept = inner.entries.split_off(&(log_id.index + 1));
        inner.entries = kept;
        inner.rewrite().map_err(io_error)
    }
}

/// The snapshot file: openraft's meta and the image as records.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta<NodeId, BasicNode>,
    records: Vec<MetadataRecord>,
}

#[derive(Debug)]
struct MachineInner {
    dir: PathBuf,
    cluster_id: String,
    node_id: i32,
    image: Arc<MetadataImage>,
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
    snapshot: Option<SnapshotFile>,
    snapshots_built: u64,
}

/// The state machine (openraft's `RaftStateMachine`): the image every committed entry
/// builds, its snapshots, and the queue to `Metadata`.
#[derive(Debug, Clone)]
pub(crate) struct StateMachine {
    inner: Arc<Mutex<MachineInner>>,
    queue: Arc<CommittedQueue>,
}

impl StateMachine {
    /// The state machine in `dir`, starting from `snapshot.json` if there is one.
    ///
    /// Errors: I/O, or a snapshot that does not parse or rebuild an image.
    pub(crate) fn open(
        dir: &Path,
        cluster_id: &str,
        node_id: i32,
        queue: Arc<CommittedQueue>,
    ) -> std::io::Result<StateMachine> {
        let empty = Arc::new(MetadataImage::empty(cluster_id, node_id));
        let (image, last_applied, membership, snapshot) =
            match std::fs::read(dir.join("snapshot.json")) {
                Ok(bytes) => {
                    let file: SnapshotFile = serde_json::from_slice(&bytes)?;
                    let image = MetadataDelta::apply(empty, file.records.clone())
                        .map_err(std::io::Error::other)?
                        .after()
                        .clone();
                    (
                        image,
                        file.meta.last_log_id,
                        file.meta.last_membership.clone(),
                        Some(file),
                    )
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    (empty, None, StoredMembership::default(), None)
                }
                Err(e) => return Err(e),
            };
        Ok(StateMachine {
            inner: Arc::new(Mutex::new(MachineInner {
                dir: dir.to_path_buf(),
                cluster_id: cluster_id.to_string(),
                node_id,
                image,
                last_applied,
                membership,
                snapshot,
                snapshots_built: 0,
            })),
            queue,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MachineInner> {
        self.inner.lock().expect("state machine lock poisoned")
    }

    /// The image and the index of the last entry applied (0 before any).
    pub(crate) fn applied(&self) -> (Arc<MetadataImage>, u64) {
        let inner = self.lock();
        (
            inner.image.clone(),
            inner.last_applied.map_or(0, |l| l.index),
        )
    }
}

impl MachineInner {
    fn save_snapshot(&mut self, file: SnapshotFile) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(&file)?;
        replace_file(&self.dir.join("snapshot.json"), &bytes, true)?;
        self.snapshot = Some(file);
        Ok(())
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let mut inner = self.lock();
        inner.snapshots_built += 1;
        let last = inner.last_applied;
        let meta = SnapshotMeta {
            last_log_id: last,
            last_membership: inner.membership.clone(),
            snapshot_id: format!("{}-{}", last.map_or(0, |l| l.index), inner.snapshots_built),
        };
        let file = SnapshotFile {
            meta: meta.clone(),
            records: inner.image.to_records(),
        };
        let data = serde_json::to_vec(&file.records).map_err(io_error)?;
        inner.save_snapshot(file).map_err(io_error)?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), StorageError<NodeId>>
    {
        let inner = self.lock();
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<ProposalOutcome>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut inner = self.lock();
        let mut out = Vec::new();
        for entry in entries {
            inner.last_applied = Some(entry.log_id);
            let offset = entry.log_id.index;
            match entry.payload {
                EntryPayload::Blank => out.push(ProposalOutcome { refused: None }),
                EntryPayload::Membership(m) => {
                    inner.membership = StoredMembership::new(Some(entry.log_id), m);
                    out.push(ProposalOutcome { refused: None });
                }
                EntryPayload::Normal(Proposal { records, id }) => {
                    match MetadataDelta::apply(inner.image.clone(), records.clone()) {
                        Ok(delta) => {
                            inner.image = delta.after().clone();
                            self.queue.push(Committed {
                                offset,
                                change: CommittedChange::Records(records),
                                proposal_id: id,
                            });
                            out.push(ProposalOutcome { refused: None });
                        }
                        Err(e) => {
                            self.queue.push(Committed {
                                offset,
                                change: CommittedChange::Refused(e.to_string()),
                                proposal_id: id,
                            });
                            out.push(ProposalOutcome {
                                refused: Some(e.to_string()),
                            });
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let records: Vec<MetadataRecord> =
            serde_json::from_slice(snapshot.get_ref()).map_err(read_error)?;
        let mut inner = self.lock();
        let empty = Arc::new(MetadataImage::empty(
            inner.cluster_id.clone(),
            inner.node_id,
        ));
        let image = MetadataDelta::apply(empty, records.clone())
            .map_err(read_error)?
            .after()
            .clone();
        inner.image = image.clone();
        inner.last_applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
        inner
            .save_snapshot(SnapshotFile {
                meta: meta.clone(),
                records,
            })
            .map_err(io_error)?;
        self.queue.push(Committed {
            offset: meta.last_log_id.map_or(0, |l| l.index),
            change: CommittedChange::Image(image),
            proposal_id: None,
        });
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let inner = self.lock();
        let Some(file) = &inner.snapshot else {
            return Ok(None);
        };
        let data = serde_json::to_vec(&file.records).map_err(io_error)?;
        Ok(Some(Snapshot {
            meta: file.meta.clone(),
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

/// The voter ids the quorum was formed with: the last membership entry of the log, else
/// the one the snapshot holds (empty: not formed yet).
pub(crate) fn formed_voters(log: &LogStore, machine: &StateMachine) -> BTreeSet<u64> {
    let from_log = log
        .lock()
        .entries
        .values()
        .rev()
        .find_map(|(_, e)| match &e.payload {
            EntryPayload::Membership(m) => Some(m.voter_ids().collect::<BTreeSet<u64>>()),
            EntryPayload::Blank | EntryPayload::Normal(_) => None,
        });
    from_log.unwrap_or_else(|| machine.lock().membership.membership().voter_ids().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[tokio::test]
    async fn wait_visible_returns_once_the_image_holds_the_entry_or_at_the_timeout() {
        let queue = Arc::new(CommittedQueue::default());
        assert_eq!(queue.visible(), 0);
        queue.mark_visible(5);
        // Never goes back.
        queue.mark_visible(3);
        assert_eq!(queue.visible(), 5);
        // Already there: at once.
        let started = Instant::now();
        assert_eq!(queue.wait_visible(4, Duration::from_secs(10)).await, 5);
        assert!(started.elapsed() < Duration::from_secs(5));
        // Marked later, from another thread (Metadata's follower): woken by it.
        let marker = queue.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            marker.mark_visible(6);
            marker.mark_visible(7);
        });
        let started = Instant::now();
        assert!(queue.wait_visible(7, Duration::from_secs(10)).await >= 7);
        assert!(started.elapsed() < Duration::from_secs(5));
        t.join().unwrap();
        // Never marked: what it has, after the timeout.
        let started = Instant::now();
        assert_eq!(queue.wait_visible(9, Duration::from_millis(50)).await, 7);
        assert!(started.elapsed() >= Duration::from_millis(50));
    }
}
