//! Cluster metadata: which topics exist (ids, partitions with their replicas, leader,
//! leader epoch and ISR, topic-level configs), the producer ids reserved, the cluster id
//! and this broker's identity.
//!
//! Owns: the current [`MetadataImage`] (immutable, behind an `Arc`: readers take it with
//! [`Metadata::image`] and never block a change), the one path that changes it
//! ([`Metadata::update`]: records validated against the image → listeners prepare →
//! [`MetadataLog::append`] makes them durable → the new image is published → listeners
//! finish), and topic lifecycle on top of it (`topics.rs`: create, grow, reconfigure,
//! delete). The replica manager is a [`MetadataListener`]: it opens, reconfigures and
//! closes partitions from deltas, so no caller keeps topics and partitions in step by
//! hand. The durable form is the [`MetadataLog`]: for a broker the replicated log
//! [`RaftMetadataLog`] (`raft/`: the controller quorum, `__cluster_metadata` on openraft;
//! [`Metadata::open_quorum`]), in unit tests and as what that log migrates from the
//! single-node [`FileMetadataLog`] (files under `<log.dirs>/__cluster_metadata/`;
//! [`Metadata::open`]). With a replicated log, changes committed by other nodes reach the
//! image through the same listeners, in log order, applied by [`Metadata::follow`]'s
//! thread or by the next local change, whichever comes first.
//!
//! Never does: serve client APIs or write partition data (that is `replica` + `log`).

pub(crate) mod brokers;
mod election;
mod image;
mod placement;
mod raft;
mod reassign;
mod store;
mod topics;

use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

use uuid::Uuid;

use crate::config::QuorumVoter;

pub(crate) use election::{ElectionError, ElectionType};
pub(crate) use image::{
    BrokerEndpoint, BrokerRegistration, ImageError, MetadataDelta, MetadataImage, MetadataRecord,
    PartitionState, TopicMeta,
};
pub(crate) use placement::live_brokers;
pub(crate) use raft::{
    Committed, CommittedChange, QuorumHandle, QuorumSettings, QuorumState, RaftMetadataLog,
    VoterState,
};
pub(crate) use reassign::Reassignment;
pub(crate) use store::{FileMetadataLog, MetadataLog};
pub(crate) use topics::{NewTopic, TopicError};

use store::{io_err, write_atomic};

/// The longest legal topic name (Kafka's `Topic.MAX_NAME_LENGTH`).
pub(crate) const TOPIC_NAME_MAX_LENGTH: usize = 249;

/// Why a topic name is refused (Kafka: INVALID_TOPIC_EXCEPTION, code 17; a `.`/`_`
/// collision is also code 17 in Kafka's CreateTopics, with its own message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TopicNameError {
    /// Empty, `.` or `..`.
    #[error("topic name is illegal, it can't be empty, '.' or '..'")]
    Empty,
    /// Longer than 249 characters.
    #[error("topic name is illegal, it can't be longer than 249 characters")]
    TooLong,
    /// A character outside `[a-zA-Z0-9._-]`.
    #[error("topic name `{0}` is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'")]
    IllegalCharacter(String),
}

/// Checks a topic name as Kafka's `Topic.validate` does.
///
/// Errors: [`TopicNameError`] (Kafka INVALID_TOPIC_EXCEPTION, 17).
pub(crate) fn validate_topic_name(name: &str) -> Result<(), TopicNameError> {
    if name.is_empty() || name == "." || name == ".." {
        return Err(TopicNameError::Empty);
    }
    if name.len() > TOPIC_NAME_MAX_LENGTH {
        return Err(TopicNameError::TooLong);
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Err(TopicNameError::IllegalCharacter(name.to_string()));
    }
    Ok(())
}

/// Kafka's internal topics (reported with `is_internal` in Metadata), and the connect
/// runtime's `__connect_configs`, `__connect_offsets`, `__connect_status` and
/// `__connect_state`: only the broker writes them (a client's produce would bypass the
/// runtime's in-memory state), so they are refused to Produce and DeleteTopics like `__consumer_offsets`. Kafka
/// itself treats Connect's topics as ordinary topics because its workers are clients.
pub(crate) fn is_internal_topic(name: &str) -> bool {
    matches!(
        name,
        "__consumer_offsets"
            | "__transaction_state"
            | "__connect_configs"
            | "__connect_offsets"
            | "__connect_status"
            | "__connect_state"
    )
}

/// Errors of the metadata store and of applying a change: environment failures, with
/// context, and changes that could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// Reading or writing a metadata file failed.
    #[error("metadata I/O on {path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A metadata file does not parse.
    #[error("metadata file {path} is corrupt: {message}")]
    Corrupt {
        /// The file.
        path: std::path::PathBuf,
        /// The parser's message.
        message: String,
    },
    /// The replayed records do not build an image (a corrupt or foreign log).
    #[error("metadata log does not replay: {0}")]
    Replay(ImageError),
    /// The records of a change do not apply to the current image (a bug in the caller).
    #[error(transparent)]
    Invalid(#[from] ImageError),
    /// The store cannot hold this record (the single-node file store and a partition led
    /// by another node).
    #[error("metadata store: {0}")]
    Unsupported(String),
    /// A listener could not take the change (a partition log could not be opened).
    #[error(transparent)]
    Listener(#[from] ListenerError),
    /// The active controller refused this node's broker registration: another live broker
    /// is registered with its `node.id` (Kafka's DUPLICATE_BROKER_REGISTRATION, 101,
    /// KIP-631; `brokers::duplicate_registration` says when). The text is the
    /// controller's reason.
    #[error("DUPLICATE_BROKER_REGISTRATION (101): {0}")]
    DuplicateBrokerRegistration(String),
}

/// A listener's failure, with its cause (a `LogError` of the replica manager).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ListenerError {
    /// What could not be done, naming the topic and partition.
    pub message: String,
    /// The cause.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl ListenerError {
    /// `message`, caused by `source`.
    pub fn new(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> ListenerError {
        let source: Box<dyn std::error::Error + Send + Sync> = Box::new(source);
        ListenerError {
            message: format!("{}: {source}", message.into()),
            source: Some(source),
        }
    }
}

/// Why [`Metadata::update`] did not (fully) make a change.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError<E> {
    /// The caller's closure refused (validation): nothing changed.
    #[error("refused: {0}")]
    Refused(E),
    /// The records did not apply, a listener could not prepare, or the log could not make
    /// them durable: nothing changed (listeners undid what they prepared).
    #[error("not applied: {0}")]
    NotApplied(MetadataError),
    /// The change is durable and published, but a listener could not finish acting on it
    /// (a deleted partition's directory could not be removed, say).
    #[error("applied, not finished: {0}")]
    Incomplete(MetadataError),
}

/// Acts on metadata changes (Kafka's `MetadataPublisher`): the replica manager opens,
/// reconfigures and closes partitions. Called with metadata changes serialised, from the
/// thread making the change; never re-enters [`Metadata`]'s change path.
///
/// For each delta: [`MetadataListener::prepare`] before it is durable (take what it adds:
/// open new partition logs), then either [`MetadataListener::publish`] once it is durable
/// and visible (act on what it changes or removes), or [`MetadataListener::abort`] when
/// it will not be applied (undo `prepare`).
pub trait MetadataListener: Send + Sync + std::fmt::Debug {
    /// Readies what `delta` adds. On `Err` the delta is not applied, and the listener has
    /// already undone its own partial work (`abort` is not called).
    ///
    /// Errors: [`ListenerError`], e.g. a partition log that cannot be created.
    fn prepare(&self, delta: &MetadataDelta) -> Result<(), ListenerError>;

    /// `delta` is durable and its image published: act on what it changes or removes.
    ///
    /// Errors: [`ListenerError`]; the delta stays applied, the error reaches the caller.
    fn publish(&self, delta: &MetadataDelta) -> Result<(), ListenerError>;

    /// `delta` will not be applied after a successful `prepare`: undo it.
    fn abort(&self, delta: &MetadataDelta);
}

/// The writer side: the log and the listeners, behind one mutex that serialises changes.
#[derive(Debug)]
struct Writer {
    log: Box<dyn MetadataLog>,
    listeners: Vec<Arc<dyn MetadataListener>>,
}

#[derive(Debug)]
struct ProducerIdBlock {
    next: i64,
    reserved_until: i64,
}

/// Producer ids reserved per metadata write.
const PRODUCER_ID_BLOCK: i64 = 1000;

/// How long [`Metadata::follow`]'s thread waits for a committed change before looking
/// whether it should stop.
const FOLLOW_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// The thread of [`Metadata::follow`]: stopped and joined when dropped.
#[derive(Debug)]
pub struct MetadataFollower {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for MetadataFollower {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs `f`, which blocks its thread (the change lock, the quorum's commit, partition
/// files created and fsynced by the listeners), so that a Tokio worker that calls it —
/// a request handler: CreateTopics, an auto-creating Metadata or Produce — first hands
/// its other tasks to another thread (`block_in_place`), and the broker's other
/// connections are served meanwhile. Found under disk pressure: two handlers creating
/// topics held both workers of a 2-core broker for seconds and every client saw
/// "all brokers down". Outside a multi-threaded runtime `f` just runs.
fn off_the_async_workers<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// The broker's metadata: the current image, and the only way to change it.
#[derive(Debug)]
pub struct Metadata {
    /// The image's cluster id, kept here too to be lent out (it never changes).
    cluster_id: String,
    node_id: i32,
    image: RwLock<Arc<MetadataImage>>,
    /// Held from reading the image a change is computed on to the last listener done: a
    /// `std` mutex, never held across `.await`.
    writer: Mutex<Writer>,
    /// The next producer id within the block the image reserves.
    producer_ids: Mutex<ProducerIdBlock>,
    /// Who leads the quorum, broker sessions (`None`: a local store).
    quorum: Option<Arc<QuorumHandle>>,
    /// Where the last entry in the image is noted for peers waiting on it (a replicated
    /// log; `None`: a local store).
    committed: Option<Arc<raft::CommittedQueue>>,
}

/// Reads the cluster id from `<dir>/meta.properties`, writing a new one at first start.
fn cluster_id(dir: &Path, node_id: i32) -> Result<String, MetadataError> {
    cluster_id_or(dir, node_id, || short_uuid(Uuid::new_v4()))
}

/// The cluster id of a multi-voter quorum at its first start: the same on every node
/// without a format step (Kafka's `kafka-storage format --cluster-id`), derived from the
/// voter set: the first 16 bytes of the SHA-256 of the sorted `ID@HOST:PORT` entries.
fn quorum_cluster_id(voters: &[QuorumVoter]) -> String {
    use sha2::Digest;
    let mut entries: Vec<String> = voters
        .iter()
        .map(|v| format!("{}@{}:{}", v.id, v.host, v.port))
        .collect();
    entries.sort();
    let digest = sha2::Sha256::digest(entries.join(",").as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    short_uuid(Uuid::from_bytes(bytes))
}

/// Reads the cluster id from `<dir>/meta.properties`, writing `new()` at first start.
fn cluster_id_or(
    dir: &Path,
    node_id: i32,
    new: impl FnOnce() -> String,
) -> Result<String, MetadataError> {
    let meta_path = dir.join("meta.properties");
    match std::fs::read_to_string(&meta_path) {
        Ok(text) => text
            .lines()
            .find_map(|l| l.strip_prefix("cluster.id="))
            .map(str::to_string)
            .ok_or_else(|| MetadataError::Corrupt {
                path: meta_path.clone(),
                message: "no cluster.id line".into(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(io_err(dir))?;
            let id = new();
            write_atomic(
                &meta_path,
                format!("version=1\ncluster.id={id}\nnode.id={node_id}\n").as_bytes(),
            )?;
            Ok(id)
        }
        Err(e) => Err(io_err(&meta_path)(e)),
    }
}

impl Metadata {
    /// Opens (or creates) the metadata under `<log_dir>/__cluster_metadata` with the file
    /// store, replaying it into the first image.
    ///
    /// Errors: [`MetadataError`] when the directory cannot be created or a file is corrupt.
    pub fn open(log_dir: &Path, node_id: i32) -> Result<Metadata, MetadataError> {
        let dir = log_dir.join("__cluster_metadata");
        let log = FileMetadataLog::open(&dir, node_id)?;
        let cluster_id = cluster_id(&dir, node_id)?;
        Metadata::with_log(Box::new(log), cluster_id, node_id)
    }

    /// Opens (or creates) the metadata as this node's view of the controller quorum
    /// `voters` (one voter, this node, for a single node): the Raft log under
    /// `<log_dir>/__cluster_metadata/raft/`, serving Raft RPCs on `controller_listener`
    /// (bound by the caller; `None` when no peer dials this node), migrating an earlier
    /// version's file store there at first start. See [`RaftMetadataLog::open`].
    /// `election_timeout_ms` is `controller.quorum.election.timeout.ms`. A node that is
    /// not among `voters` (a broker-only node) gives `learner_addr`, the `HOST:PORT` of
    /// `controller_listener` (its internal Raft listener): it asks the quorum leader to
    /// make it a learner there and receives `__cluster_metadata` as one (KIP-595's
    /// observer; docs/cluster.md).
    ///
    /// Errors: [`MetadataError`]: the files, the quorum's start, the migration, a node
    /// that is not a voter without `learner_addr`.
    pub fn open_quorum(
        log_dir: &Path,
        node_id: i32,
        voters: Vec<QuorumVoter>,
        controller_listener: Option<std::net::TcpListener>,
        election_timeout_ms: u64,
        learner_addr: Option<String>,
    ) -> Result<Metadata, MetadataError> {
        let dir = log_dir.join("__cluster_metadata");
        // Configured voters (a voter port is never 0; a single node's own entry has 0):
        // every node, voter or learner, derives the same id from them.
        let configured = voters.len() > 1 || voters.iter().any(|v| v.port != 0);
        let cluster_id = if configured {
            let derived = quorum_cluster_id(&voters);
            cluster_id_or(&dir, node_id, || derived)?
        } else {
            cluster_id(&dir, node_id)?
        };
        let log = RaftMetadataLog::open(QuorumSettings {
            dir,
            cluster_id: cluster_id.clone(),
            node_id,
            voters,
            controller_listener,
            election_timeout_ms,
            learner_addr,
        })?;
        Metadata::with_log(Box::new(log), cluster_id, node_id)
    }

    /// The metadata of `log` (replayed now) for cluster `cluster_id` and node `node_id`.
    ///
    /// Errors: [`MetadataError`] when the log cannot be read, or
    /// [`MetadataError::Replay`] when its records do not build an image.
    pub fn with_log(
        mut log: Box<dyn MetadataLog>,
        cluster_id: String,
        node_id: i32,
    ) -> Result<Metadata, MetadataError> {
        let records = log.replay()?;
        let empty = Arc::new(MetadataImage::empty(cluster_id.clone(), node_id));
        let image = MetadataDelta::apply(empty, records)
            .map_err(MetadataError::Replay)?
            .after()
            .clone();
        // Ids handed out before a restart are below the reservation: start past them.
        let reserved = image.producer_ids_reserved_until();
        let quorum = log.quorum();
        let committed = log.committed_queue();
        Ok(Metadata {
            quorum,
            committed,
            cluster_id,
            node_id,
            image: RwLock::new(image),
            writer: Mutex::new(Writer {
                log,
                listeners: Vec::new(),
            }),
            producer_ids: Mutex::new(ProducerIdBlock {
                next: reserved,
                reserved_until: reserved,
            }),
        })
    }

    /// The current image: cheap (an `Arc` clone), consistent, and never changing under
    /// the reader; a later change makes a new image.
    pub fn image(&self) -> Arc<MetadataImage> {
        // A poisoned lock means a panic while holding it: a bug, crash loudly.
        self.image
            .read()
            .expect("metadata image lock poisoned")
            .clone()
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, Writer> {
        self.writer.lock().expect("metadata writer lock poisoned")
    }

    /// Registers `listener` for every later change, after giving it the current image as
    /// one delta from the empty image (prepare, then publish: the replica manager opens
    /// every partition). Done under the change lock, so no delta is missed or seen twice.
    ///
    /// Errors: [`ListenerError`] from the listener; it is then not registered.
    pub fn register(&self, listener: Arc<dyn MetadataListener>) -> Result<(), ListenerError> {
        let mut writer = self.writer();
        let image = self.image();
        let empty = Arc::new(MetadataImage::empty(image.cluster_id(), image.node_id()));
        let delta = MetadataDelta::apply(empty, image.to_records()).map_err(|e| ListenerError {
            message: format!("the image does not rebuild from its records: {e}"),
            source: None,
        })?;
        listener.prepare(&delta)?;
        listener.publish(&delta)?;
        writer.listeners.push(listener);
        Ok(())
    }

    /// Changes the metadata: `f` computes records from the current image (validating; its
    /// `Err` refuses), they are applied to a copy of the image, every listener prepares,
    /// the log makes them durable, the new image is published, every listener finishes.
    /// Changes are serialised: `f` sees the image the records apply to. An empty record
    /// list changes nothing. Returns the image after the change.
    ///
    /// With a multi-voter quorum, a change made returns only once every other live broker
    /// has it in its image too, or after [`raft::AWAIT_APPLIED_TIMEOUT_MS`] (see
    /// [`QuorumHandle::await_applied_everywhere`]): what a client was answered is what
    /// every broker's Metadata and DescribeConfigs show. That wait is outside the change
    /// lock (peers apply under theirs).
    ///
    /// Errors: [`UpdateError`]: refused or not applied (nothing changed), or applied and
    /// not finished by a listener.
    pub fn update<E>(
        &self,
        f: impl FnOnce(&MetadataImage) -> Result<Vec<MetadataRecord>, E>,
    ) -> Result<Arc<MetadataImage>, UpdateError<E>> {
        off_the_async_workers(|| {
            let mut offset = None;
            let result = self.update_locked(f, &mut offset);
            if let (Some(offset), Some(quorum)) = (offset, &self.quorum) {
                if matches!(result, Ok(_) | Err(UpdateError::Incomplete(_))) {
                    quorum.await_applied_everywhere(offset, &self.image());
                }
            }
            result
        })
    }

    /// [`Metadata::update`] under the change lock; sets `appended` to the log offset of
    /// the change when the log gave one (a replicated log).
    fn update_locked<E>(
        &self,
        f: impl FnOnce(&MetadataImage) -> Result<Vec<MetadataRecord>, E>,
        appended: &mut Option<u64>,
    ) -> Result<Arc<MetadataImage>, UpdateError<E>> {
        let mut writer = self.writer();
        // Changes other nodes committed come first: `f` sees the newest image.
        self.apply_committed(&mut writer);
        let before = self.image();
        let records = f(&before).map_err(UpdateError::Refused)?;
        if records.is_empty() {
            return Ok(before);
        }
        let delta =
            MetadataDelta::apply(before, records).map_err(|e| UpdateError::NotApplied(e.into()))?;
        let writer = &mut *writer;
        for (i, l) in writer.listeners.iter().enumerate() {
            if let Err(e) = l.prepare(&delta) {
                for prepared in writer.listeners[..i].iter().rev() {
                    prepared.abort(&delta);
                }
                return Err(UpdateError::NotApplied(e.into()));
            }
        }
        let offset = match writer.log.append(delta.records()) {
            Ok(offset) => offset,
            Err(e) => {
                for l in writer.listeners.iter().rev() {
                    l.abort(&delta);
                }
                return Err(UpdateError::NotApplied(e));
            }
        };
        *appended = offset;
        if let Some(offset) = offset {
            // A replicated log: ours is among the changes committed since, in log order.
            // Unless another change came first or ours was refused, `delta` is exactly
            // what ours does to the image: publish it and apply what follows.
            let committed = writer.log.take_committed();
            let ours = committed.iter().position(|c| c.offset == offset);
            let changed_before = committed
                .iter()
                .take_while(|c| c.offset < offset)
                .any(|c| !matches!(c.change, CommittedChange::Refused(_)));
            match ours.map(|i| &committed[i].change) {
                Some(CommittedChange::Records(_)) if !changed_before => {
                    let (_, after) = committed.split_at(ours.unwrap_or(0) + 1);
                    let result = self.publish(writer, &delta);
                    self.mark_visible(offset);
                    self.apply_each(writer, after.to_vec());
                    return result;
                }
                ours_change => {
                    let refused = match ours_change {
                        Some(CommittedChange::Refused(why)) => Some(why.clone()),
                        Some(_) => None,
                        None => Some(format!("entry {offset} not applied")),
                    };
                    for l in writer.listeners.iter().rev() {
                        l.abort(&delta);
                    }
                    self.apply_each(writer, committed);
                    return match refused {
                        Some(why) => Err(UpdateError::NotApplied(MetadataError::Invalid(
                            ImageError(format!("another change was committed first: {why}")),
                        ))),
                        None => Ok(self.image()),
                    };
                }
            }
        }
        self.publish(writer, &delta)
    }

    /// Makes `delta` (prepared by every listener, durable) the image and has every
    /// listener finish it.
    fn publish<E>(
        &self,
        writer: &Writer,
        delta: &MetadataDelta,
    ) -> Result<Arc<MetadataImage>, UpdateError<E>> {
        *self.image.write().expect("metadata image lock poisoned") = delta.after().clone();
        let mut failed = None;
        for l in &writer.listeners {
            if let Err(e) = l.publish(delta) {
                failed.get_or_insert(e);
            }
        }
        match failed {
            None => Ok(delta.after().clone()),
            Some(e) => Err(UpdateError::Incomplete(e.into())),
        }
    }

    /// Applies the changes the log committed since the last call (a replicated log; a
    /// local store has none).
    fn apply_committed(&self, writer: &mut Writer) {
        let committed = writer.log.take_committed();
        self.apply_each(writer, committed);
    }

    /// Applies committed changes in order: each to the image and through every listener.
    /// They are committed: a listener that cannot take one logs it (its partitions stay
    /// closed) and the image moves on, as on every other node.
    fn apply_each(&self, writer: &mut Writer, committed: Vec<Committed>) {
        for c in committed {
            let offset = c.offset;
            self.apply_one(writer, c);
            // Refused or skipped, the broker's image is at this entry all the same.
            self.mark_visible(offset);
        }
    }

    /// Notes that the image holds every entry up to `offset` (a replicated log: peers
    /// waiting for it are answered).
    fn mark_visible(&self, offset: u64) {
        if let Some(committed) = &self.committed {
            committed.mark_visible(offset);
        }
    }

    /// One committed change of [`Metadata::apply_each`].
    fn apply_one(&self, writer: &mut Writer, c: Committed) {
        let before = self.image();
        let records = match c.change {
            CommittedChange::Refused(_) => return,
            CommittedChange::Records(records) => records,
            CommittedChange::Image(image) => before.changes_to(&image),
        };
        let delta = match MetadataDelta::apply(before, records) {
            Ok(d) => d,
            Err(e) => {
                // The state machine applied it to the same image: our bug.
                tracing::error!(offset = c.offset, error = %e, "committed metadata change does not apply to this broker's image; skipped");
                return;
            }
        };
        let prepared: Vec<&Arc<dyn MetadataListener>> = writer
            .listeners
            .iter()
            .filter(|l| match l.prepare(&delta) {
                Ok(()) => true,
                Err(e) => {
                    tracing::error!(offset = c.offset, error = %e, "committed metadata change not taken by a listener");
                    false
                }
            })
            .collect();
        *self.image.write().expect("metadata image lock poisoned") = delta.after().clone();
        for l in prepared {
            if let Err(e) = l.publish(&delta) {
                tracing::error!(offset = c.offset, error = %e, "committed metadata change not fully applied");
            }
        }
    }

    /// Starts the thread that applies changes other nodes commit as they come (a
    /// replicated log only: `None` for a local store). It holds the metadata weakly and
    /// stops when the returned handle is dropped or the metadata is.
    pub fn follow(self: &Arc<Self>) -> Option<MetadataFollower> {
        let queue = self.writer().log.committed_queue()?;
        let weak = Arc::downgrade(self);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("weir-metadata".into())
            .spawn(move || {
                while !stopped.load(std::sync::atomic::Ordering::SeqCst) {
                    // Wait outside the change lock; apply under it.
                    if !queue.wait_for(None, FOLLOW_POLL) {
                        continue;
                    }
                    let Some(metadata) = weak.upgrade() else {
                        return;
                    };
                    let mut writer = metadata.writer();
                    metadata.apply_committed(&mut writer);
                }
            })
            .ok()?;
        Some(MetadataFollower {
            stop,
            thread: Some(thread),
        })
    }

    /// The quorum's handle (leader, broker sessions); `None` on a local store.
    pub(crate) fn quorum(&self) -> Option<&Arc<QuorumHandle>> {
        self.quorum.as_ref()
    }

    /// The node id of the active controller (the quorum leader), if one is known; `None`
    /// also on a local store.
    pub fn active_controller(&self) -> Option<i32> {
        self.quorum.as_ref().and_then(|q| q.leader())
    }

    /// Every registered broker with its epoch, endpoints and whether it is fenced, by id
    /// (what `weir cluster describe` shows).
    pub fn brokers(&self) -> Vec<BrokerRegistration> {
        self.image().brokers().cloned().collect()
    }

    /// Registers this node as a broker with this process's incarnation id (one per
    /// process start: a second call is a retry, KIP-631) and a broker epoch above every
    /// one handed out before (KIP-631's BrokerRegistration, through the quorum):
    /// unfenced, replacing its earlier registration. Blocks until committed. Returns the
    /// registration.
    ///
    /// Errors: [`MetadataError`]: the quorum did not commit it in time, the store holds
    /// no registrations (the earlier file store), or
    /// [`MetadataError::DuplicateBrokerRegistration`]: the active controller refused it.
    pub fn register_broker(
        &self,
        endpoints: Vec<BrokerEndpoint>,
        rack: Option<String>,
    ) -> Result<BrokerRegistration, MetadataError> {
        let incarnation_id = self
            .quorum
            .as_ref()
            .map_or_else(Uuid::new_v4, |q| q.incarnation_id());
        let broker_id = self.node_id;
        // Registrations of several nodes from one image: all but one are refused, and
        // retry on the newer image.
        let mut attempts = 0;
        loop {
            attempts += 1;
            let result = self.update(|image| {
                let mut records = vec![MetadataRecord::BrokerRegistered {
                    broker_id,
                    broker_epoch: image.max_broker_epoch() + 1,
                    incarnation_id,
                    endpoints: endpoints.clone(),
                    rack: rack.clone(),
                }];
                if image.broker(broker_id).is_some() {
                    // A restart: the earlier incarnation's ISR places and leaderships go.
                    records.extend(election::reregistration_changes(image, broker_id));
                }
                Ok::<_, std::convert::Infallible>(records)
            });
            let image = match result {
                Ok(image) => image,
                Err(UpdateError::Refused(never)) => match never {},
                Err(UpdateError::NotApplied(MetadataError::Invalid(_))) if attempts < 10 => {
                    continue
                }
                Err(UpdateError::NotApplied(e) | UpdateError::Incomplete(e)) => return Err(e),
            };
            match image.broker(broker_id) {
                Some(r) if r.incarnation_id == incarnation_id => return Ok(r.clone()),
                _ if attempts < 10 => {}
                _ => {
                    return Err(MetadataError::Unsupported(format!(
                        "broker {broker_id}'s registration was not applied"
                    )))
                }
            }
        }
    }

    /// A partition leader's ISR change (KIP-497's AlterPartition, here a
    /// `PartitionChanged` record through the quorum): sets the ISR of `topic`'s
    /// `partition`, which this broker leads, to `isr`, if the partition is still at
    /// `seen_partition_epoch`. Blocks until committed. Returns whether it changed
    /// anything (`false`: this broker does not lead it any more, or its state moved on —
    /// the leader follows the newer state and asks again if it still needs to).
    ///
    /// Errors: [`MetadataError`]: the quorum did not commit it in time, or it was refused
    /// on apply (a concurrent change took the epoch first).
    pub fn alter_isr(
        &self,
        topic: &str,
        partition: i32,
        seen_partition_epoch: i32,
        isr: Vec<i32>,
    ) -> Result<bool, MetadataError> {
        let mut changed = false;
        let result = self.update(|image| {
            let record = election::isr_change(
                image,
                topic,
                partition,
                self.node_id,
                seen_partition_epoch,
                isr,
            );
            changed = record.is_some();
            Ok::<_, std::convert::Infallible>(record.into_iter().collect())
        });
        match result {
            Ok(_) => Ok(changed),
            Err(UpdateError::Refused(never)) => match never {},
            Err(UpdateError::NotApplied(e)) => Err(e),
            // Committed; a listener did not finish (logged where it failed).
            Err(UpdateError::Incomplete(_)) => Ok(changed),
        }
    }

    /// ElectLeaders (KIP-460): an election of `election_type` ([`election::elect`]) for
    /// each of `partitions` (topic, index; repeats count once), or, with `None`, for every
    /// partition of every topic, leaving out those where it is not needed (as Kafka's
    /// controller answers a request with null partitions). All the new leaderships are
    /// one metadata change through the quorum (made by whichever broker is asked: the
    /// records are checked by partition epoch where they are applied); blocks until it is
    /// committed and every live broker has it. A change refused because another was
    /// committed first is computed again on the newer image, at most 3 times. Returns
    /// each partition's outcome, in request order.
    pub(crate) fn elect_leaders(
        &self,
        election_type: ElectionType,
        partitions: Option<&[(String, i32)]>,
    ) -> Vec<(String, i32, Result<(), ElectionError>)> {
        let requested: Option<Vec<(String, i32)>> = partitions.map(|ps| {
            let mut seen = std::collections::HashSet::new();
            ps.iter()
                .filter(|p| seen.insert((*p).clone()))
                .cloned()
                .collect()
        });
        let mut attempts = 0;
        loop {
            attempts += 1;
            let mut outcomes = Vec::new();
            let result = self.update(|image| {
                let all: Vec<(String, i32)> = match &requested {
                    Some(ps) => ps.clone(),
                    None => image
                        .topics()
                        .flat_map(|t| (0..t.partitions).map(|i| (t.name.clone(), i)))
                        .collect(),
                };
                let mut records = Vec::new();
                for (topic, partition) in all {
                    let outcome = match election::elect(image, &topic, partition, election_type) {
                        Ok(record) => {
                            records.push(record);
                            Ok(())
                        }
                        Err(ElectionError::NotNeeded) if requested.is_none() => continue,
                        Err(e) => Err(e),
                    };
                    outcomes.push((topic, partition, outcome));
                }
                Ok::<_, std::convert::Infallible>(records)
            });
            let why = match result {
                Ok(_) | Err(UpdateError::Incomplete(_)) => return outcomes,
                Err(UpdateError::Refused(never)) => match never {},
                Err(UpdateError::NotApplied(MetadataError::Invalid(_))) if attempts < 3 => continue,
                Err(UpdateError::NotApplied(e)) => e.to_string(),
            };
            tracing::warn!(error = %why, "leader election not committed");
            return outcomes
                .into_iter()
                .map(|(t, p, o)| {
                    let o = o.and(Err(ElectionError::NotCommitted(format!(
                        "the election was not committed: {why}"
                    ))));
                    (t, p, o)
                })
                .collect();
        }
    }

    /// The cluster id (generated at first start, KIP-78 style, 22 base64url characters).
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// This broker's node id.
    pub fn node_id(&self) -> i32 {
        self.node_id
    }

    /// A copy of one topic's metadata (see [`Metadata::image`] to read several things
    /// from one image without copying).
    pub fn topic(&self, name: &str) -> Option<TopicMeta> {
        self.image().topic(name).cloned()
    }

    /// The topic with this id (Fetch v13+, DeleteTopics v6).
    pub fn topic_by_id(&self, id: Uuid) -> Option<TopicMeta> {
        self.image().topic_by_id(id).cloned()
    }

    /// A copy of every topic, by name.
    pub fn topics(&self) -> Vec<TopicMeta> {
        self.image().topics().cloned().collect()
    }

    /// An existing topic whose name equals `name` once `.` and `_` are made alike.
    pub fn colliding_topic(&self, name: &str) -> Option<String> {
        self.image().colliding_topic(name).map(str::to_string)
    }

    /// Hands out a new producer id (InitProducerId). Ids are unique across restarts: a
    /// block of [`PRODUCER_ID_BLOCK`] ids is reserved durably (a
    /// [`MetadataRecord::ProducerIdsReserved`]) before any of it is used.
    ///
    /// Errors: [`MetadataError`] when the reservation cannot be written.
    pub fn next_producer_id(&self) -> Result<i64, MetadataError> {
        let mut block = self.producer_ids.lock().expect("producer id lock poisoned");
        if block.next >= block.reserved_until {
            // The block starts where the image's reservation ends (every node's image, in
            // a quorum); a node that reserved from a stale image is refused and retries.
            let mut attempts = 0;
            let (start, until) = loop {
                let mut start = 0;
                let result = self.update(|image| {
                    start = image.producer_ids_reserved_until();
                    Ok::<_, std::convert::Infallible>(vec![MetadataRecord::ProducerIdsReserved {
                        reserved_until: start + PRODUCER_ID_BLOCK,
                    }])
                });
                attempts += 1;
                match result {
                    Ok(_) => break (start, start + PRODUCER_ID_BLOCK),
                    Err(UpdateError::Refused(never)) => match never {},
                    Err(UpdateError::NotApplied(MetadataError::Invalid(_))) if attempts < 3 => {}
                    Err(UpdateError::NotApplied(e) | UpdateError::Incomplete(e)) => return Err(e),
                }
            };
            block.next = start;
            block.reserved_until = until;
        }
        let id = block.next;
        block.next += 1;
        Ok(id)
    }
}

/// Kafka prints cluster ids as the 16 uuid bytes in unpadded base64url.
fn short_uuid(id: Uuid) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bytes = id.as_bytes();
    let mut out = String::with_capacity(22);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for &b in bytes {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 6 {
            bits -= 6;
            out.push(ALPHABET[((acc >> bits) & 63) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (6 - bits)) & 63) as usize] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use kafka_protocol::ResponseError;

    #[test]
    fn topic_names_follow_kafka() {
        assert!(validate_topic_name("orders.v1_x-2").is_ok());
        assert_eq!(validate_topic_name(""), Err(TopicNameError::Empty));
        assert_eq!(validate_topic_name(".."), Err(TopicNameError::Empty));
        assert!(validate_topic_name("bad/name").is_err());
        assert!(validate_topic_name(&"a".repeat(249)).is_ok());
        assert_eq!(
            validate_topic_name(&"a".repeat(250)),
            Err(TopicNameError::TooLong)
        );
    }

    fn spec(name: &str, partitions: i32) -> NewTopic {
        NewTopic {
            name: name.to_string(),
            partitions,
            replication_factor: 1,
            configs: BTreeMap::new(),
            assignment: Vec::new(),
        }
    }

    #[test]
    fn topics_and_producer_ids_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let m = Metadata::open(dir.path(), 1).unwrap();
        let t = m.create_topic(spec("a.b", 3)).unwrap();
        assert_eq!(
            m.create_topic(spec("a.b", 3)).unwrap_err().error,
            ResponseError::TopicAlreadyExists
        );
        assert_eq!(m.ensure_topic(spec("a.b", 9)).unwrap(), t);
        assert_eq!(m.colliding_topic("a_b"), Some("a.b".to_string()));
        let p1 = m.next_producer_id().unwrap();
        let cluster = m.cluster_id().to_string();
        assert_eq!(cluster.len(), 22);
        drop(m);
        let m = Metadata::open(dir.path(), 1).unwrap();
        assert_eq!(m.topic("a.b"), Some(t.clone()));
        assert_eq!(m.image().topic_by_id(t.id), Some(&t));
        assert_eq!(m.cluster_id(), cluster);
        assert!(m.next_producer_id().unwrap() > p1);
        m.add_partitions("a.b", 5, &[]).unwrap();
        let configs = BTreeMap::from([("retention.ms".to_string(), "1000".to_string())]);
        let c = configs.clone();
        assert_eq!(
            m.alter_topic_configs("nope", |_| Ok(c)).unwrap_err().error,
            ResponseError::UnknownTopicOrPartition
        );
        let c = configs.clone();
        m.alter_topic_configs("a.b", |_| Ok(c)).unwrap();
        drop(m);
        let m = Metadata::open(dir.path(), 1).unwrap();
        let t = m.topic("a.b").unwrap();
        assert_eq!((t.partitions, &t.configs), (5, &configs));
        let p = m.image().partition("a.b", 4).cloned().unwrap();
        assert_eq!(p, image::PartitionState::single_node(1));
        m.delete_topic(t.id).unwrap();
        assert_eq!(
            m.delete_topic(t.id).unwrap_err().error,
            ResponseError::UnknownTopicId
        );
        drop(m);
        let m = Metadata::open(dir.path(), 1).unwrap();
        assert!(m.topics().is_empty());
    }

    /// The metadata of a one-voter quorum over `dir`, at the default Raft timing.
    fn open_sole_voter(dir: &Path) -> Metadata {
        Metadata::open_quorum(
            dir,
            1,
            sole_voter(),
            None,
            raft::DEFAULT_ELECTION_TIMEOUT_MS,
            None,
        )
        .unwrap()
    }

    fn sole_voter() -> Vec<QuorumVoter> {
        vec![QuorumVoter {
            id: 1,
            host: String::new(),
            port: 0,
        }]
    }

    #[test]
    fn a_change_committed_twice_after_a_lost_answer_answers_success_and_applies_once() {
        let dir = tempfile::tempdir().unwrap();
        let m = open_sole_voter(dir.path());
        // CreateTopics: the retried copy is refused (the topic exists); the first is ours.
        m.writer().log.lose_next_answer();
        let t = m.create_topic(spec("retried", 2)).unwrap();
        assert_eq!(m.writer().log.changes_committed_twice(), 1);
        assert_eq!(m.topic("retried"), Some(t));
        // CreatePartitions: the retried copy names the same first partition, so it is
        // refused instead of adding the partitions again.
        m.writer().log.lose_next_answer();
        let grown = m.add_partitions("retried", 4, &[]).unwrap();
        assert_eq!(m.writer().log.changes_committed_twice(), 2);
        assert_eq!(grown.partitions, 4);
        assert_eq!(m.topic("retried").unwrap().partitions, 4);
        drop(m);
        let m = open_sole_voter(dir.path());
        assert_eq!(m.topic("retried").unwrap().partitions, 4);
    }

    #[test]
    fn the_quorum_migrates_the_file_store_once_and_replays_after_restart() {
        let dir = tempfile::tempdir().unwrap();
        let old = Metadata::open(dir.path(), 1).unwrap();
        let kept = old.create_topic(spec("old", 2)).unwrap();
        let cluster = old.cluster_id().to_string();
        let first_pid = old.next_producer_id().unwrap();
        drop(old);

        let m = open_sole_voter(dir.path());
        assert_eq!(m.cluster_id(), cluster);
        assert_eq!(m.topic("old"), Some(kept.clone()));
        let pid = m.next_producer_id().unwrap();
        assert!(pid > first_pid, "{pid} after {first_pid}");
        m.create_topic(spec("new", 1)).unwrap();
        m.delete_topic(kept.id).unwrap();
        drop(m);

        // The file store is still there, but migrated once: the log decides.
        assert!(dir
            .path()
            .join("__cluster_metadata/topics/old.toml")
            .is_file());
        let m = open_sole_voter(dir.path());
        assert!(m.topic("old").is_none());
        assert_eq!(m.topic("new").unwrap().partitions, 1);
        assert!(m.next_producer_id().unwrap() > pid);

        // A registration is replayed after a restart; registering again (a restart of
        // the broker) gets a higher epoch and a new incarnation.
        assert_eq!(m.active_controller(), Some(1));
        let first = m.register_broker(endpoint(9092), None).unwrap();
        assert_eq!((first.broker_id, first.fenced), (1, false));
        drop(m);
        let m = open_sole_voter(dir.path());
        assert_eq!(m.brokers(), std::slice::from_ref(&first));
        let second = m.register_broker(endpoint(9094), None).unwrap();
        assert!(second.broker_epoch > first.broker_epoch);
        assert_ne!(second.incarnation_id, first.incarnation_id);
        assert_eq!(m.brokers(), [second]);
    }

    fn endpoint(port: i32) -> Vec<BrokerEndpoint> {
        vec![BrokerEndpoint {
            name: "PLAINTEXT".into(),
            host: "127.0.0.1".into(),
            port,
        }]
    }

    /// A node that is not a voter joins as a learner: it gets what the voters commit,
    /// and its own changes (a registration, a topic) reach the voters through the leader;
    /// reopened over the same directory it is a learner again and proposes.
    #[test]
    fn a_node_that_is_not_a_voter_is_a_learner_that_proposes_through_the_leader() {
        let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let listeners: Vec<std::net::TcpListener> = (0..3)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let addrs: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        let voters: Vec<QuorumVoter> = (0..2)
            .map(|i| QuorumVoter {
                id: i as i32 + 1,
                host: "127.0.0.1".into(),
                port: addrs[i],
            })
            .collect();
        let mut listeners = listeners.into_iter();
        let open = |i: usize, l: std::net::TcpListener| {
            let learner = (i == 2).then(|| format!("127.0.0.1:{}", addrs[2]));
            Arc::new(
                Metadata::open_quorum(
                    dirs[i].path(),
                    i as i32 + 1,
                    voters.clone(),
                    Some(l),
                    raft::DEFAULT_ELECTION_TIMEOUT_MS,
                    learner,
                )
                .unwrap(),
            )
        };
        let v1 = open(0, listeners.next().unwrap());
        let v2 = open(1, listeners.next().unwrap());
        let learner_listener = listeners.next().unwrap();
        let learner = open(2, learner_listener.try_clone().unwrap());
        let _voter_followers = (v1.follow(), v2.follow());
        let learner_follower = learner.follow();
        assert_eq!(learner.cluster_id(), v1.cluster_id());
        let wait = |what: &str, cond: &dyn Fn() -> bool| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !cond() {
                assert!(std::time::Instant::now() < deadline, "{what}");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        };
        // A topic created through a voter reaches the learner.
        v1.create_topic(spec("from-voter", 1)).unwrap();
        wait("the learner applies the voters' change", &|| {
            learner.topic("from-voter").is_some()
        });
        // The learner registers and creates a topic: proposed to the leader.
        let r = learner.register_broker(endpoint(9003), None).unwrap();
        assert_eq!(r.broker_id, 3);
        learner.create_topic(spec("from-learner", 1)).unwrap();
        wait("the voters apply the learner's changes", &|| {
            v2.topic("from-learner").is_some() && v2.image().broker(3).is_some()
        });
        // The leader describes it as an observer, never as a voter.
        let leader = if v1.quorum().unwrap().is_leader() {
            &v1
        } else {
            &v2
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let state = rt
            .block_on(
                leader
                    .quorum()
                    .unwrap()
                    .describe(std::time::Duration::from_secs(2)),
            )
            .unwrap();
        assert_eq!(
            state.voters.iter().map(|v| v.id).collect::<Vec<_>>(),
            [1, 2]
        );
        assert_eq!(
            state.observers.iter().map(|v| v.id).collect::<Vec<_>>(),
            [3]
        );
        // Restarted over its directory, at the same address: a learner again.
        drop(learner_follower);
        drop(learner);
        let learner = open(2, learner_listener);
        let _follower = learner.follow();
        assert!(learner.topic("from-learner").is_some());
        learner.create_topic(spec("after-restart", 1)).unwrap();
        wait("the restarted learner's change reaches the voters", &|| {
            v1.topic("after-restart").is_some()
        });
    }

    #[test]
    fn three_quorum_members_apply_each_others_changes() {
        let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let listeners: Vec<std::net::TcpListener> = (0..3)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let voters: Vec<QuorumVoter> = listeners
            .iter()
            .zip(1..)
            .map(|(l, id)| QuorumVoter {
                id,
                host: "127.0.0.1".into(),
                port: l.local_addr().unwrap().port(),
            })
            .collect();
        let nodes: Vec<Arc<Metadata>> = dirs
            .iter()
            .zip(listeners)
            .zip(1..)
            .map(|((d, l), id)| {
                Arc::new(
                    Metadata::open_quorum(
                        d.path(),
                        id,
                        voters.clone(),
                        Some(l),
                        raft::DEFAULT_ELECTION_TIMEOUT_MS,
                        None,
                    )
                    .unwrap(),
                )
            })
            .collect();
        let _followers: Vec<_> = nodes.iter().map(|m| m.follow()).collect();
        let ids: Vec<&str> = nodes.iter().map(|m| m.cluster_id()).collect();
        assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");

        // Through node 2 (the quorum elects while it waits), seen by node 3.
        let t = nodes[1].create_topic(spec("t", 2)).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while nodes[2].topic("t").is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(nodes[2].topic("t"), Some(t.clone()));
        // Node 3 validates on the image it was given.
        assert_eq!(
            nodes[2].create_topic(spec("t", 2)).unwrap_err().error,
            ResponseError::TopicAlreadyExists
        );
        nodes[2].add_partitions("t", 3, &[]).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while nodes[0].topic("t").map(|t| t.partitions) != Some(3)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(nodes[0].topic("t").unwrap().partitions, 3);
        // Producer id blocks reserved through different nodes never overlap.
        let a = nodes[0].next_producer_id().unwrap();
        let b = nodes[1].next_producer_id().unwrap();
        assert!(a.abs_diff(b) >= PRODUCER_ID_BLOCK as u64, "{a} {b}");

        // Three brokers register at once through their own nodes: three epochs, each
        // registration seen by every node; one registering again gets a higher epoch.
        let mut epochs: Vec<i64> = std::thread::scope(|s| {
            let running: Vec<_> = nodes
                .iter()
                .map(|m| s.spawn(|| m.register_broker(endpoint(9000 + m.node_id()), None)))
                .collect();
            running
                .into_iter()
                .map(|r| r.join().unwrap().unwrap().broker_epoch)
                .collect()
        });
        epochs.sort();
        epochs.dedup();
        assert_eq!(epochs.len(), 3, "{epochs:?}");
        for m in &nodes {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while m.brokers().len() < 3 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let ports: Vec<i32> = m.brokers().iter().map(|b| b.endpoints[0].port).collect();
            assert_eq!(ports, [9001, 9002, 9003]);
        }
        let again = nodes[1].register_broker(endpoint(9012), None).unwrap();
        assert!(again.broker_epoch > epochs[2]);
        let leader = nodes[0].active_controller().unwrap();
        assert!((1..=3).contains(&leader));

        // A broker heartbeat from a node that does not lead reaches the leader's memory
        // over the CONTROLLER listener (the leader's fence task is not running here: it
        // is told it leads by hand).
        let leading = &nodes[(leader - 1) as usize];
        let sessions = leading.quorum().unwrap().sessions();
        sessions.set_leading(true, std::time::Instant::now());
        let other = nodes.iter().find(|m| m.node_id() != leader).unwrap();
        let epoch = other.image().broker(other.node_id()).unwrap().broker_epoch;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let q = other.quorum().unwrap().clone();
        let id = other.node_id();
        rt.block_on(async move {
            let mut client = raft::HeartbeatClient::default();
            q.heartbeat(&mut client, id, epoch, std::time::Duration::from_secs(5))
                .await
        })
        .unwrap();
        assert!(sessions.last_heartbeat(id, epoch).is_some());
        assert!(sessions.last_heartbeat(id, epoch - 1).is_none());
    }

    #[test]
    fn opens_a_data_directory_of_an_earlier_version_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let md = dir.path().join("__cluster_metadata");
        std::fs::create_dir_all(md.join("topics")).unwrap();
        let files = [
            (
                "meta.properties",
                "version=1\ncluster.id=q1Sh-9_ISia_zwGINzRvyQ\nnode.id=3\n",
            ),
            (
                "topics/events.toml",
                "name = \"events\"\nid = \"67e55044-10b1-426f-9247-bb680e5fe0c8\"\n\
                 partitions = 2\nreplication_factor = 1\n\n[configs]\n\"retention.ms\" = \"1000\"\n",
            ),
            ("producer_id", "3000"),
        ];
        for (path, text) in files {
            std::fs::write(md.join(path), text).unwrap();
        }
        let m = Metadata::open(dir.path(), 3).unwrap();
        assert_eq!(m.cluster_id(), "q1Sh-9_ISia_zwGINzRvyQ");
        let image = m.image();
        let t = image.topic("events").unwrap();
        assert_eq!(t.id.to_string(), "67e55044-10b1-426f-9247-bb680e5fe0c8");
        assert_eq!(t.configs["retention.ms"], "1000");
        for i in 0..2 {
            let p = image.partition("events", i).unwrap();
            assert_eq!(
                (p.leader, p.leader_epoch, &p.replicas[..], &p.isr[..]),
                (3, 0, &[3][..], &[3][..])
            );
        }
        assert_eq!(m.next_producer_id().unwrap(), 3000);
        drop(m);
        // Opening wrote nothing but the new producer id reservation.
        for (path, text) in &files[..2] {
            assert_eq!(&std::fs::read_to_string(md.join(path)).unwrap(), text);
        }
        assert_eq!(
            std::fs::read_to_string(md.join("producer_id")).unwrap(),
            "4000"
        );
    }

    #[test]
    fn create_validates_like_kafka() {
        let dir = tempfile::tempdir().unwrap();
        let m = Metadata::open(dir.path(), 1).unwrap();
        m.create_topic(spec("a.b", 1)).unwrap();
        let bad_config = NewTopic {
            configs: BTreeMap::from([("retention.ms".to_string(), "soon".to_string())]),
            ..spec("c", 1)
        };
        let unknown_config = NewTopic {
            configs: BTreeMap::from([("no.such".to_string(), "1".to_string())]),
            ..spec("c", 1)
        };
        let cases = [
            (spec("a_b", 1), ResponseError::InvalidTopicException),
            (spec("bad/name", 1), ResponseError::InvalidTopicException),
            (spec("c", 0), ResponseError::InvalidPartitions),
            (
                spec("c", topics::MAX_PARTITIONS_PER_TOPIC + 1),
                ResponseError::InvalidPartitions,
            ),
            (
                NewTopic {
                    replication_factor: 2,
                    ..spec("c", 1)
                },
                ResponseError::InvalidReplicationFactor,
            ),
            (bad_config, ResponseError::InvalidConfig),
            (unknown_config, ResponseError::InvalidConfig),
        ];
        for (s, error) in cases {
            assert_eq!(m.validate_new_topic(&s).unwrap_err().error, error, "{s:?}");
            assert_eq!(m.create_topic(s.clone()).unwrap_err().error, error, "{s:?}");
        }
        assert_eq!(m.topics().len(), 1);
        assert_eq!(m.validate_new_topic(&spec("c", 2)).unwrap().id, Uuid::nil());
        assert!(m.topic("c").is_none());
        assert_eq!(
            m.add_partitions("a.b", 1, &[]).unwrap_err().error,
            ResponseError::InvalidPartitions
        );
        assert!(m.validate_add_partitions("a.b", 2, &[]).is_ok());
        assert_eq!(m.topic("a.b").unwrap().partitions, 1);
    }

    /// What a listener saw, and what it is told to fail.
    #[derive(Debug, Default)]
    struct Recorder {
        calls: Mutex<Vec<String>>,
        fail_prepare: std::sync::atomic::AtomicBool,
        fail_publish: std::sync::atomic::AtomicBool,
    }

    impl Recorder {
        fn note(&self, what: &str, delta: &MetadataDelta) {
            let topics = delta.after().topic_count();
            let records = delta.records().len();
            self.calls
                .lock()
                .unwrap()
                .push(format!("{what} {records} records, {topics} topics"));
        }

        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.calls.lock().unwrap())
        }
    }

    impl MetadataListener for Recorder {
        fn prepare(&self, delta: &MetadataDelta) -> Result<(), ListenerError> {
            self.note("prepare", delta);
            if self
                .fail_prepare
                .swap(false, std::sync::atomic::Ordering::SeqCst)
            {
                return Err(ListenerError {
                    message: "no room".into(),
                    source: None,
                });
            }
            Ok(())
        }

        fn publish(&self, delta: &MetadataDelta) -> Result<(), ListenerError> {
            self.note("publish", delta);
            if self
                .fail_publish
                .swap(false, std::sync::atomic::Ordering::SeqCst)
            {
                return Err(ListenerError {
                    message: "cannot remove".into(),
                    source: None,
                });
            }
            Ok(())
        }

        fn abort(&self, delta: &MetadataDelta) {
            self.note("abort", delta);
        }
    }

    #[test]
    fn listeners_see_each_delta_once_and_failures_change_nothing() {
        use std::sync::atomic::Ordering;
        let log = store::MemoryMetadataLog {
            records: vec![MetadataRecord::ProducerIdsReserved { reserved_until: 7 }],
            fail_next_append: false,
        };
        let m = Metadata::with_log(Box::new(log), "c".into(), 1).unwrap();
        m.create_topic(spec("before", 2)).unwrap();
        let r = Arc::new(Recorder::default());
        m.register(r.clone()).unwrap();
        // Registration hands over the image so far as one delta.
        assert_eq!(
            r.take(),
            ["prepare 2 records, 1 topics", "publish 2 records, 1 topics"]
        );

        m.create_topic(spec("t", 1)).unwrap();
        assert_eq!(
            r.take(),
            ["prepare 1 records, 2 topics", "publish 1 records, 2 topics"]
        );

        // The listener cannot take it: nothing changes, nothing is written.
        r.fail_prepare.store(true, Ordering::SeqCst);
        let e = m.create_topic(spec("u", 1)).unwrap_err();
        assert_eq!(e.error, ResponseError::UnknownServerError);
        assert!(e.message.contains("no room"), "{e:?}");
        assert!(m.topic("u").is_none());
        assert_eq!(r.take(), ["prepare 1 records, 3 topics"]);

        // The log cannot make it durable: the listener undoes its prepare.
        m.writer().log = Box::new(store::MemoryMetadataLog {
            records: vec![],
            fail_next_append: true,
        });
        let e = m.add_partitions("t", 3, &[]).unwrap_err();
        assert_eq!(e.error, ResponseError::UnknownServerError);
        assert_eq!(m.topic("t").unwrap().partitions, 1);
        assert_eq!(
            r.take(),
            ["prepare 1 records, 2 topics", "abort 1 records, 2 topics"]
        );

        // Refused by validation: listeners hear nothing.
        assert!(m.add_partitions("t", 1, &[]).is_err());
        assert!(r.take().is_empty());

        // Applied, but the listener could not finish: the caller hears of it.
        r.fail_publish.store(true, Ordering::SeqCst);
        let id = m.topic("t").unwrap().id;
        let e = m.delete_topic(id).unwrap_err();
        assert!(e.message.contains("cannot remove"), "{e:?}");
        assert!(m.topic("t").is_none());
        assert_eq!(
            r.take(),
            ["prepare 1 records, 1 topics", "publish 1 records, 1 topics"]
        );
        // Producer ids continue after the replayed reservation.
        assert_eq!(m.next_producer_id().unwrap(), 7);
    }
}
