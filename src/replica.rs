//! The replica manager: the partitions this broker hosts and the entry points that append
//! to and read from them (Kafka's `ReplicaManager` and `Partition`).
//!
//! Owns: the map topic-partition → [`Partition`]; each `Partition` is the one owner of its
//! [`PartitionLog`], its high watermark (computed only in [`high_watermark_for`]) and its
//! replica role ([`ReplicaRole`]: leader with ISR and follower state, or follower). Callers
//! get [`Partition::offsets`], [`Partition::read`] bounded by a [`FetchIsolation`] and
//! [`Partition::append_as_leader`], never the log. Also: opening every log at start-up,
//! creating, reconfiguring and deleting partition logs as metadata deltas say (it is a
//! `MetadataListener`; topic existence is the metadata's alone; a change of the dynamic
//! broker configs re-resolves every topic's effective config), the retention task.
//! A high watermark advance is published on the partition's own watch channel, which
//! parked fetches and acks=all produces wait on (keyed per partition, see `purgatory`).
//! On a single node the ISR is this broker alone, so the high watermark is the log end
//! offset after every append.
//!
//! Transactions (KIP-98): the leader writes transaction markers
//! ([`Partition::append_txn_marker`], [`ReplicaManager::write_txn_marker`] for
//! WriteTxnMarkers and the transaction coordinator); every replica computes its last
//! stable offset (LSO) in [`PartitionOffsets`] as `min(high watermark, first unstable
//! offset)`, never below the log start offset, where the first unstable offset is the
//! start of the earliest transaction that is open or whose marker the high watermark has
//! not passed (`PartitionLog::first_unstable_offset`). So the LSO moves forward only when
//! the high watermark does or a new transaction cannot lower it: parked read_committed
//! fetches wait on the high watermark watch like the others. Reads with
//! [`FetchIsolation::ReadCommitted`] stop at the LSO and return the aborted transactions
//! of the range read.
//!
//! Several log dirs (`log.dirs`, [`LogDir`]): each partition lives in one; a new one goes
//! to the online dir with the fewest ([`ReplicaManager::place`]); a partition moves
//! between them online ([`ReplicaManager::alter_replica_log_dir`], the file steps in
//! `log::relocate`); the first I/O error of a partition takes its whole dir offline
//! (KIP-112: its partitions answer KAFKA_STORAGE_ERROR). `docs/broker.md`, "Several log
//! directories".
//!
//! Never does: decode requests or decide leadership (the role is set from the metadata).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use tokio::sync::{mpsc, watch};

use crate::cluster::{
    ListenerError, Metadata, MetadataDelta, MetadataListener, MetadataRecord, PartitionState,
    TopicMeta,
};
use crate::config::{BrokerConfig, DynamicLayers, TOPIC_KEYS};
use crate::log::checkpoint::{self, HighWatermarks};
use crate::log::relocate;
use crate::log::topic_id::Claim;
use crate::log::{
    AbortedTxn, AppendInfo, AppendOptions, CleanerThrottle, CleanupPolicy, CompactionPlan,
    CompactionStats, Compression, EpochEndOffset, FileRegion, LogConfig, LogError, PartitionLog,
    PreparedCompaction, ProducerSummary, TxnMarker, ValidatedBatch,
};
use crate::purgatory::Purgatory;

pub use crate::config::ConfigSource;

/// The effective value of every topic-level key for a topic: its override, else the
/// broker's value through the dynamic layers (per-broker, cluster default) and the static
/// config ([`BrokerConfig::topic_default_in`]). Returns `(key, value or None for null,
/// source)` in [`TOPIC_KEYS`] order.
pub fn effective_topic_configs(
    broker: &BrokerConfig,
    layers: DynamicLayers<'_>,
    overrides: &BTreeMap<String, String>,
) -> Vec<(&'static str, Option<String>, ConfigSource)> {
    TOPIC_KEYS
        .iter()
        .map(|spec| {
            if let Some(v) = overrides.get(spec.name) {
                return (spec.name, Some(v.clone()), ConfigSource::Topic);
            }
            let (v, source) = broker.topic_default_in(layers, spec);
            (spec.name, v, source)
        })
        .collect()
}

/// What the produce path needs to know about a partition's topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProduceSettings {
    /// `max.message.bytes`: largest batch accepted (MESSAGE_TOO_LARGE, 10, above it).
    pub max_message_bytes: usize,
    /// `message.timestamp.type=LogAppendTime`.
    pub log_append_time: bool,
    /// `cleanup.policy` contains `compact`: every record needs a key (INVALID_RECORD, 87,
    /// "Compacted topic cannot accept message without key", as Kafka's `LogValidator`).
    pub require_keys: bool,
    /// `compression.type` when it names a codec (`uncompressed` is `Compression::None`);
    /// `None` for `producer` (the default). Applied only to batches the broker re-encodes
    /// (inline transforms); client batches are stored as sent.
    pub compression: Option<Compression>,
    /// `min.insync.replicas`: the ISR size acks=all needs (NOT_ENOUGH_REPLICAS, 19,
    /// below it), and below which the high watermark does not advance (KIP-966).
    pub min_insync_replicas: usize,
}

/// The produce settings of a topic with `overrides` on `broker`: what every partition of
/// it applies ([`Partition::settings`]), for a writer that checks records before a
/// partition is chosen (`Ingest::refusal`).
pub fn produce_settings(
    broker: &BrokerConfig,
    layers: DynamicLayers<'_>,
    overrides: &BTreeMap<String, String>,
) -> ProduceSettings {
    resolve(broker, layers, overrides).1
}

fn resolve(
    broker: &BrokerConfig,
    layers: DynamicLayers<'_>,
    overrides: &BTreeMap<String, String>,
) -> (LogConfig, ProduceSettings) {
    let mut log = LogConfig::default();
    let mut settings = ProduceSettings {
        max_message_bytes: 1_048_588,
        log_append_time: false,
        require_keys: false,
        compression: None,
        min_insync_replicas: 1,
    };
    for (key, value, _) in effective_topic_configs(broker, layers, overrides) {
        let int = value.as_deref().and_then(|v| v.parse::<i64>().ok());
        match key {
            "retention.ms" => log.retention_ms = int.unwrap_or(-1),
            "retention.bytes" => log.retention_bytes = int.unwrap_or(-1),
            "segment.bytes" => {
                if let Some(n) = int {
                    log.segment_bytes = n.max(14) as u64;
                }
            }
            "segment.ms" => {
                if let Some(n) = int {
                    log.segment_ms = n;
                }
            }
            "segment.index.bytes" => {
                if let Some(n) = int {
                    log.segment_index_bytes = n.max(8) as u64;
                }
            }
            "index.interval.bytes" => {
                if let Some(n) = int {
                    log.index_interval_bytes = n.clamp(0, i64::from(u32::MAX)) as u32;
                }
            }
            "flush.messages" => {
                log.flush_messages = int.filter(|n| *n > 0 && *n < i64::MAX).map(|n| n as u64)
            }
            "flush.ms" => log.flush_ms = int.filter(|n| *n >= 0 && *n < i64::MAX),
            "max.message.bytes" => {
                if let Some(n) = int {
                    settings.max_message_bytes = n.max(0) as usize;
                }
            }
            "message.timestamp.type" => {
                settings.log_append_time = value.as_deref() == Some("LogAppendTime")
            }
            "cleanup.policy" => {
                log.cleanup_policy = CleanupPolicy::parse(value.as_deref().unwrap_or(""));
                settings.require_keys = log.cleanup_policy.compact;
            }
            "compression.type" => {
                settings.compression = match value.as_deref() {
                    Some("uncompressed") => Some(Compression::None),
                    Some("gzip") => Some(Compression::Gzip),
                    Some("snappy") => Some(Compression::Snappy),
                    Some("lz4") => Some(Compression::Lz4),
                    Some("zstd") => Some(Compression::Zstd),
                    _ => None,
                }
            }
            "min.insync.replicas" => {
                if let Some(n) = int {
                    settings.min_insync_replicas = n.clamp(1, i64::from(i16::MAX)) as usize;
                }
            }
            "min.cleanable.dirty.ratio" => {
                if let Some(ratio) = value.as_deref().and_then(|v| v.parse::<f64>().ok()) {
                    if (0.0..=1.0).contains(&ratio) {
                        log.min_cleanable_dirty_ratio = ratio;
                    }
                }
            }
            "delete.retention.ms" => {
                if let Some(n) = int {
                    log.delete_retention_ms = n.max(0);
                }
            }
            "min.compaction.lag.ms" => {
                if let Some(n) = int {
                    log.min_compaction_lag_ms = n.max(0);
                }
            }
            _ => {}
        }
    }
    (log, settings)
}

/// A partition's offsets: log start, last stable offset, high watermark, log end (what a
/// Fetch and a ListOffsets response carry). Invariant: `log_start_offset <=
/// last_stable_offset <= high_watermark <= log_end_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionOffsets {
    /// First offset still in the log (earliest, ListOffsets -2).
    pub log_start_offset: i64,
    /// The last stable offset (KIP-98): `min(high_watermark, first offset of the earliest
    /// transaction not yet decided and replicated)`, at least `log_start_offset`.
    /// read_committed consumers never read at or past it (their latest, ListOffsets -1
    /// with isolation_level 1); equal to the high watermark when no transaction is open.
    pub last_stable_offset: i64,
    /// The high watermark: the offset below which every record is on every in-sync
    /// replica. Consumers never read at or past it (latest, ListOffsets -1).
    pub high_watermark: i64,
    /// The log end offset (LEO): the offset the next appended record gets.
    pub log_end_offset: i64,
}

/// How far a read may go (Kafka's `FetchIsolation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchIsolation {
    /// Up to the log end offset: follower replicas, and the coordinators' own replay of
    /// their internal topics (Kafka's coordinator loader reads to the log end too).
    LogEnd,
    /// Up to the high watermark: consumers (read_uncommitted), sinks, transforms.
    HighWatermark,
    /// Up to the last stable offset, with the aborted transactions of the range read:
    /// read_committed consumers (Fetch `isolation_level` 1, KIP-98).
    ReadCommitted,
}

/// What one read returns: the stored batches and the offsets they were read against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionRead {
    /// The partition's offsets when the read was made.
    pub offsets: PartitionOffsets,
    /// Whole stored batches from the one containing the fetch offset, as on disk.
    pub bytes: Bytes,
    /// [`FetchIsolation::ReadCommitted`] only: the aborted transactions whose range
    /// overlaps `[fetch offset, last offset in bytes]` (Fetch v4+ `aborted_transactions`;
    /// empty when no bytes were read); `None` for the other isolations.
    pub aborted_transactions: Option<Vec<AbortedTxn>>,
}

/// What [`Partition::read_region`] returns: [`PartitionRead`] with the batches as a file
/// region.
#[derive(Debug)]
pub struct PartitionRegionRead {
    /// The partition's offsets when the read was made.
    pub offsets: PartitionOffsets,
    /// Whole stored batches from the one containing the fetch offset; `None` when none
    /// is readable.
    pub region: Option<FileRegion>,
    /// As [`PartitionRead::aborted_transactions`].
    pub aborted_transactions: Option<Vec<AbortedTxn>>,
}

/// The aborted transactions a read from `fetch_offset` up to `last` (an offset no record
/// read exceeds; `None` when nothing was read) returns: read_committed only (Kafka's
/// `collectAbortedTxns`), `None` for the other isolations.
fn aborted_txns_read(
    log: &PartitionLog,
    isolation: FetchIsolation,
    fetch_offset: i64,
    last: Option<i64>,
) -> Result<Option<Vec<AbortedTxn>>, LogError> {
    Ok(match isolation {
        FetchIsolation::ReadCommitted => Some(match last {
            Some(last) => log.collect_aborted_txns(fetch_offset, last)?,
            None => Vec::new(),
        }),
        FetchIsolation::LogEnd | FetchIsolation::HighWatermark => None,
    })
}

/// The offset a read with `isolation` stops before.
fn isolation_bound(offsets: &PartitionOffsets, isolation: FetchIsolation) -> i64 {
    match isolation {
        FetchIsolation::LogEnd => offsets.log_end_offset,
        FetchIsolation::HighWatermark => offsets.high_watermark,
        FetchIsolation::ReadCommitted => offsets.last_stable_offset,
    }
}

/// What the leader knows of one follower (Kafka's `Replica` state on the leader).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerState {
    /// The follower's log end offset, from its last Fetch.
    pub log_end_offset: i64,
    /// Wall-clock time (ms) the follower was last caught up to the leader's LEO; ISR
    /// shrinking compares it with `replica.lag.time.max.ms`.
    pub last_caught_up_ms: i64,
    /// The leader's log end offset when the follower last fetched (Kafka's
    /// `lastFetchLeaderLogEndOffset`): a fetch from at least there means the follower
    /// was caught up at that earlier fetch.
    pub last_fetch_leader_log_end_offset: i64,
    /// Wall-clock time (ms) of the follower's last fetch.
    pub last_fetch_ms: i64,
}

impl FollowerState {
    /// A follower the leader has not heard from yet, counted as caught up at `now_ms`
    /// (Kafka starts every replica's clock when leadership begins), its log end offset
    /// unknown (-1).
    fn new(now_ms: i64) -> FollowerState {
        FollowerState {
            log_end_offset: -1,
            last_caught_up_ms: now_ms,
            last_fetch_leader_log_end_offset: -1,
            last_fetch_ms: now_ms,
        }
    }

    /// Notes a fetch from `fetch_offset` at `now_ms` while the leader's log ends at
    /// `leader_log_end_offset` (Kafka's `Replica.updateFetchState`).
    fn record_fetch(&mut self, fetch_offset: i64, leader_log_end_offset: i64, now_ms: i64) {
        if fetch_offset >= leader_log_end_offset {
            self.last_caught_up_ms = self.last_caught_up_ms.max(now_ms);
        } else if fetch_offset >= self.last_fetch_leader_log_end_offset {
            self.last_caught_up_ms = self.last_caught_up_ms.max(self.last_fetch_ms);
        }
        self.log_end_offset = fetch_offset;
        self.last_fetch_leader_log_end_offset = leader_log_end_offset;
        self.last_fetch_ms = now_ms;
    }
}

/// A replica's role for its partition: its one home (Kafka's `Partition` leader state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaRole {
    /// This broker leads the partition.
    Leader {
        /// The leader epoch stamped into every batch this leader appends.
        leader_epoch: i32,
        /// The partition epoch of the metadata state this role follows (an ISR change
        /// this leader proposes is made against it, KIP-497).
        partition_epoch: i32,
        /// The in-sync replicas' broker ids, this broker included.
        isr: Vec<i32>,
        /// `isr` plus the follower this leader has asked to add and the metadata has not
        /// answered yet (KIP-497's "maximal ISR"): the high watermark waits for it too,
        /// since once the change commits it is an ISR member the controller may elect,
        /// and it must hold every record acknowledged meanwhile. Equal to `isr` when no
        /// expansion is pending.
        maximal_isr: Vec<i32>,
        /// Every other replica's fetch state, by broker id.
        followers: BTreeMap<i32, FollowerState>,
        /// The log end offset when this leadership began: a follower joins the ISR only
        /// once it has fetched from here (KIP-101's leader epoch start offset).
        epoch_start_offset: i64,
    },
    /// Another broker leads; this one copies its log.
    Follower {
        /// The leader's broker id.
        leader_id: i32,
        /// The epoch of that leadership.
        leader_epoch: i32,
    },
}

impl ReplicaRole {
    /// The leader epoch this role is in.
    pub fn leader_epoch(&self) -> i32 {
        match self {
            ReplicaRole::Leader { leader_epoch, .. }
            | ReplicaRole::Follower { leader_epoch, .. } => *leader_epoch,
        }
    }
}

/// The high watermark a leader may expose: the smallest log end offset over the maximal
/// ISR (the ISR and a follower whose joining is pending; its own
/// `leader_log_end_offset` included; a member with no fetch state yet holds it at
/// `current`), and only while the ISR has at least `min_insync_replicas` members
/// (KIP-966: with fewer, nothing more is committed). Never moves back: the result is at
/// least `current`. A follower's high watermark is the leader's, so this returns
/// `current` for [`ReplicaRole::Follower`].
/// Sans-IO (STYLE rule 5): the one place the high watermark is computed.
pub fn high_watermark_for(
    role: &ReplicaRole,
    self_id: i32,
    leader_log_end_offset: i64,
    current: i64,
    min_insync_replicas: usize,
) -> i64 {
    match role {
        ReplicaRole::Leader { isr, .. } if isr.len() < min_insync_replicas => current,
        ReplicaRole::Leader {
            maximal_isr,
            followers,
            ..
        } => {
            let min_isr_leo = maximal_isr
                .iter()
                .filter(|id| **id != self_id)
                .map(|id| followers.get(id).map_or(current, |f| f.log_end_offset))
                .fold(leader_log_end_offset, i64::min);
            min_isr_leo.max(current)
        }
        ReplicaRole::Follower { .. } => current,
    }
}

/// A follower a leader could send a consumer to (Kafka's `ReplicaView`), as the leader
/// knows it from the follower's fetches ([`Partition::in_sync_followers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadReplicaCandidate {
    /// The follower's broker id.
    pub broker_id: i32,
    /// Its log end offset from its last fetch (-1: not fetched yet in this leadership).
    pub log_end_offset: i64,
    /// Wall-clock time (ms) it was last caught up with the leader.
    pub last_caught_up_ms: i64,
}

/// Kafka's `RackAwareReplicaSelector` (KIP-392), as a leader answering a consumer's
/// Fetch v11+ applies it: the follower a consumer in `client_rack` should read from, or
/// `None` for the leader itself. The leader is kept when the client names no rack, when
/// the leader's own rack (`leader_rack`) is the client's, or when no candidate in that
/// rack holds `fetch_offset` (its log end offset below it: Kafka's filter). Among the
/// candidates in the client's rack, the one with the largest log end offset, then the
/// most recently caught up, then the lowest id. `candidates` are the in-sync followers
/// on active brokers, each with its broker's rack; the caller filters them so (a
/// follower out of the ISR, or on a fenced broker, is never chosen).
/// Sans-IO: plain values in, a broker id out.
pub fn select_read_replica(
    client_rack: &str,
    leader_rack: Option<&str>,
    fetch_offset: i64,
    candidates: &[(ReadReplicaCandidate, Option<&str>)],
) -> Option<i32> {
    if client_rack.is_empty() || leader_rack == Some(client_rack) {
        return None;
    }
    candidates
        .iter()
        .filter(|(c, rack)| *rack == Some(client_rack) && c.log_end_offset >= fetch_offset)
        .map(|(c, _)| c)
        .max_by(|a, b| {
            a.log_end_offset
                .cmp(&b.log_end_offset)
                .then(a.last_caught_up_ms.cmp(&b.last_caught_up_ms))
                .then(b.broker_id.cmp(&a.broker_id))
        })
        .map(|c| c.broker_id)
}

/// Hosted partitions per log dir (by index in `log.dirs`) while one metadata change opens
/// partitions: counted at the first new partition that has a choice of log dirs, then
/// kept up to date as the change places them ([`ReplicaManager::place`]). Counting the
/// map for every new partition made a CreateTopics of N partitions cost N times the
/// partitions hosted (a topic of 10,000 on a broker holding 40,000: 26 s, most of it that
/// count).
type DirCounts = Option<Vec<usize>>;

/// Bumped after every change the follower fetchers act on: a partition's role stored
/// anew ([`Partition::apply_state`]) or a partition entering or leaving a broker's map.
/// The fetcher manager (`replication.rs`) walks the partitions only when it moved, not
/// every round: at 100,000 partitions a walk every 100 ms (copying each role) took most
/// of the broker's CPU. Process-wide, so no plumbing: a change on another broker of the
/// same process (tests) only costs the others one walk that finds nothing new.
static ROLES_VERSION: AtomicU64 = AtomicU64::new(0);

/// The current [`ROLES_VERSION`]; read before a walk, a change made during it shows as
/// a new version at the next look.
pub(crate) fn roles_version() -> u64 {
    ROLES_VERSION.load(Ordering::SeqCst)
}

/// Marks a change of roles or of the partition map, after it is made.
fn roles_changed() {
    ROLES_VERSION.fetch_add(1, Ordering::SeqCst);
}

/// One hosted partition: the single owner of its log, its high watermark and its replica
/// role. Callers get offsets, reads bounded by the high watermark and appends; never the
/// log itself.
#[derive(Debug)]
pub struct Partition {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub index: i32,
    /// This broker's id (`node.id`).
    node_id: i32,
    /// Settings from the topic config; swapped by [`ReplicaManager::reconfigure_topic`].
    settings: RwLock<ProduceSettings>,
    /// Reads (fetch, ListOffsets) share it; appends, retention, compaction's plan and
    /// install steps, config changes and flushes take it exclusively.
    log: RwLock<PartitionLog>,
    /// The role; locked after `log` when both are held.
    role: Mutex<ReplicaRole>,
    /// The high watermark, published: parked fetches and acks=all produces wait on it.
    high_watermark: watch::Sender<i64>,
    /// The log end offset, published: followers' fetches parked at the leader wait on it.
    log_end_offset: watch::Sender<i64>,
    /// Where this partition, as leader, sends the ISR changes it wants (the replication
    /// task commits them, `replication.rs`); `None` in unit tests.
    isr_changes: Option<mpsc::Sender<IsrChange>>,
    /// An ISR change is on its way: no other is sent until the metadata answers (a new
    /// partition epoch) or the change fails.
    isr_change_pending: AtomicBool,
    /// As a follower, the high watermark its leader last sent, uncapped (-1: none yet):
    /// how far this replica is behind the committed records ([`Partition::offset_lag`]).
    leader_high_watermark: AtomicI64,
    /// Set once, under the log's write lock, when the partition is deleted
    /// ([`Partition::retire`]): from then on nothing touches its files (they are renamed
    /// away for removal) and every operation on them answers [`LogError::Deleted`].
    deleted: AtomicBool,
    /// The one of `log.dirs` holding the log's directory; changed only under the log's
    /// write lock (a move between directories, `AlterReplicaLogDirs`).
    log_dir: RwLock<Arc<LogDir>>,
    /// Held by a move between log dirs for its whole length, and by compaction from plan
    /// to install (tried only: a moving partition is not compacted that round), so a
    /// move never copies a segment compaction is rewriting in place.
    maintenance: Mutex<()>,
    /// Truncations of the log so far (counted under its write lock): a move copies the
    /// `.log` files whole again after one (`log::relocate`).
    truncations: std::sync::atomic::AtomicU64,
    /// Bumped at every change of the published high watermark; shared by every partition
    /// of a [`ReplicaManager`], whose checkpoint is written only when it moved
    /// ([`ReplicaManager::checkpoint_high_watermarks`]).
    high_watermark_changes: Arc<AtomicU64>,
}

/// One directory of `log.dirs` (Kafka's log dir), shared by the partitions in it.
#[derive(Debug)]
pub struct LogDir {
    /// As configured.
    path: PathBuf,
    /// Set, never cleared, at the first I/O error of a partition in it (KIP-112; Kafka's
    /// `LogDirFailureChannel`): its partitions answer KAFKA_STORAGE_ERROR (56), no new
    /// partition is placed in it, DescribeLogDirs reports it with error 56. A restart
    /// (after the disk is fixed) brings it back.
    offline: AtomicBool,
    /// Woken when it goes offline: the replication task then reports its partitions to
    /// the controller ([`ReplicaManager::offline_dir_notify`]). `None` for a partition's
    /// placeholder before it is put in its dir.
    offline_notify: Option<Arc<tokio::sync::Notify>>,
}

impl LogDir {
    /// A log dir at `path` (as configured), online.
    pub fn new(path: PathBuf) -> LogDir {
        LogDir {
            path,
            offline: AtomicBool::new(false),
            offline_notify: None,
        }
    }

    /// The directory, as configured.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether an I/O error took it offline.
    pub fn is_offline(&self) -> bool {
        self.offline.load(Ordering::SeqCst)
    }

    /// Takes it offline because of `error` (logged once, at the first).
    fn mark_offline(&self, error: &LogError) {
        if !self.offline.swap(true, Ordering::SeqCst) {
            tracing::error!(dir = %self.path.display(), %error, "log dir offline after an I/O error: its partitions answer KAFKA_STORAGE_ERROR until a restart");
            // Followers stop fetching into it (the fetcher manager looks again), and the
            // controller is told (a permit is stored when nothing waits yet).
            roles_changed();
            if let Some(n) = &self.offline_notify {
                n.notify_one();
            }
        }
    }
}

/// An ISR change a leader asks the controller for (KIP-497 AlterPartition, here a
/// `PartitionChanged` metadata record checked by partition epoch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsrChange {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
    /// The partition epoch the leader's state came from.
    pub partition_epoch: i32,
    /// The ISR wanted.
    pub isr: Vec<i32>,
}

/// Why a replica (follower) fetch or a leader-epoch-checked request was refused, with its
/// Kafka error.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// NOT_LEADER_OR_FOLLOWER (6): this broker does not lead the partition.
    #[error("not the leader")]
    NotLeader,
    /// FENCED_LEADER_EPOCH (74): the request's `current_leader_epoch` is older than the
    /// partition's (KIP-320).
    #[error("leader epoch {requested} is older than {current}")]
    FencedLeaderEpoch {
        /// The request's epoch.
        requested: i32,
        /// This broker's.
        current: i32,
    },
    /// UNKNOWN_LEADER_EPOCH (75): the request's `current_leader_epoch` is newer than this
    /// broker knows yet (KIP-320).
    #[error("leader epoch {requested} is newer than {current}")]
    UnknownLeaderEpoch {
        /// The request's epoch.
        requested: i32,
        /// This broker's.
        current: i32,
    },
    /// The log's error.
    #[error(transparent)]
    Log(#[from] LogError),
}

impl ReplicaError {
    /// The Kafka error code.
    pub fn kafka_error(&self) -> kafka_protocol::ResponseError {
        use kafka_protocol::ResponseError as E;
        match self {
            ReplicaError::NotLeader => E::NotLeaderOrFollower,
            ReplicaError::FencedLeaderEpoch { .. } => E::FencedLeaderEpoch,
            ReplicaError::UnknownLeaderEpoch { .. } => E::UnknownLeaderEpoch,
            ReplicaError::Log(e) => e.kafka_error(),
        }
    }
}

/// How an acks=all wait ended ([`Partition::wait_for_high_watermark`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicationWait {
    /// The high watermark passed the batch: every in-sync replica has it.
    Replicated,
    /// The ISR fell below `min.insync.replicas` after the append
    /// (NOT_ENOUGH_REPLICAS_AFTER_APPEND, 20).
    NotEnoughReplicasAfterAppend,
    /// This broker stopped leading the partition (NOT_LEADER_OR_FOLLOWER, 6): the batch
    /// may or may not survive on the new leader; the producer retries.
    NotLeader,
    /// The deadline passed (REQUEST_TIMED_OUT, 7).
    TimedOut,
}

impl ReplicationWait {
    /// The Kafka error an acks=all write answers with, and why; `None` when replicated.
    pub fn refusal(self) -> Option<(kafka_protocol::ResponseError, &'static str)> {
        match self {
            ReplicationWait::Replicated => None,
            ReplicationWait::TimedOut => Some((
                kafka_protocol::ResponseError::RequestTimedOut,
                "the in-sync replicas did not acknowledge the batch within timeout_ms",
            )),
            ReplicationWait::NotEnoughReplicasAfterAppend => Some((
                kafka_protocol::ResponseError::NotEnoughReplicasAfterAppend,
                "the ISR fell below min.insync.replicas after the batch was appended",
            )),
            ReplicationWait::NotLeader => Some((
                kafka_protocol::ResponseError::NotLeaderOrFollower,
                "this broker stopped leading the partition before the batch was replicated",
            )),
        }
    }
}

/// The role `state` gives broker `node_id` at `now_ms`; `previous` keeps the followers'
/// fetch state across an ISR change within one leadership.
fn role_for(
    state: &PartitionState,
    node_id: i32,
    log_end_offset: i64,
    previous: Option<&ReplicaRole>,
    now_ms: i64,
) -> ReplicaRole {
    if state.leader != node_id {
        return ReplicaRole::Follower {
            leader_id: state.leader,
            leader_epoch: state.leader_epoch,
        };
    }
    match previous {
        Some(ReplicaRole::Leader {
            leader_epoch,
            followers,
            epoch_start_offset,
            ..
        }) if *leader_epoch == state.leader_epoch => ReplicaRole::Leader {
            leader_epoch: state.leader_epoch,
            partition_epoch: state.partition_epoch,
            isr: state.isr.clone(),
            maximal_isr: state.isr.clone(),
            // A reassignment adds replicas (tracked from now, outside the ISR until they
            // catch up) and removes others within one leadership.
            followers: state
                .replicas
                .iter()
                .filter(|r| **r != node_id)
                .map(|r| {
                    let f = followers.get(r).copied();
                    (*r, f.unwrap_or_else(|| FollowerState::new(now_ms)))
                })
                .collect(),
            epoch_start_offset: *epoch_start_offset,
        },
        _ => ReplicaRole::Leader {
            leader_epoch: state.leader_epoch,
            partition_epoch: state.partition_epoch,
            isr: state.isr.clone(),
            maximal_isr: state.isr.clone(),
            followers: state
                .replicas
                .iter()
                .filter(|r| **r != node_id)
                .map(|r| (*r, FollowerState::new(now_ms)))
                .collect(),
            epoch_start_offset: log_end_offset,
        },
    }
}

impl Partition {
    /// A partition over an opened log in the role `state` gives this broker: leader (with
    /// the ISR of `state`) or follower of `state.leader`.
    ///
    /// The high watermark starts at `checkpointed_high_watermark` (this partition's entry
    /// in the log dir's `replication-offset-checkpoint`, Kafka's `ReplicaManager` HW
    /// checkpoint; see KIP-101 on why it may lag the true one and why that is safe) capped
    /// at the log end offset and at least the log start offset; then
    /// [`high_watermark_for`] advances it as the ISR's followers fetch (at once on a single
    /// node, whose ISR is itself). So a restarted leader never serves records that were
    /// appended but not committed (acks=1 records no follower copied, acks=all records
    /// whose wait failed): they may be truncated when leadership moves.
    ///
    /// Without an entry (a data dir from a weir version that wrote no checkpoint, or a
    /// partition created after the last write), the behaviour of those versions is kept
    /// so an upgrade does not hide committed data: a leader starts at its log end offset,
    /// a follower at its log start offset (it knows no high watermark until its leader's
    /// first fetch response, and its tail may be a divergent one its fetcher is about to
    /// truncate).
    #[allow(clippy::too_many_arguments)]
    fn new_replica(
        topic: String,
        index: i32,
        node_id: i32,
        state: &PartitionState,
        settings: ProduceSettings,
        log: PartitionLog,
        checkpointed_high_watermark: Option<i64>,
        isr_changes: Option<mpsc::Sender<IsrChange>>,
    ) -> Partition {
        let mut log = log;
        if state.leader == node_id {
            if let Err(e) = log.assign_epoch_start_offset(state.leader_epoch) {
                tracing::error!(%topic, partition = index, error = %e, "cannot record the leader epoch start offset");
            }
        }
        let leo = log.log_end_offset();
        let log_start_offset = log.log_start_offset();
        let role = role_for(state, node_id, leo, None, now_ms());
        let start = match checkpointed_high_watermark {
            Some(hw) => hw.min(leo).max(log_start_offset),
            None if state.leader == node_id => leo,
            None => log_start_offset,
        };
        let hw =
            high_watermark_for(&role, node_id, leo, start, settings.min_insync_replicas).min(leo);
        let (high_watermark, _) = watch::channel(hw);
        let (log_end_offset, _) = watch::channel(leo);
        let log_dir = Arc::new(LogDir::new(
            log.dir()
                .parent()
                .map_or_else(PathBuf::new, Path::to_path_buf),
        ));
        Partition {
            topic,
            index,
            node_id,
            settings: RwLock::new(settings),
            log: RwLock::new(log),
            role: Mutex::new(role),
            high_watermark,
            log_end_offset,
            isr_changes,
            isr_change_pending: AtomicBool::new(false),
            leader_high_watermark: AtomicI64::new(-1),
            deleted: AtomicBool::new(false),
            log_dir: RwLock::new(log_dir),
            maintenance: Mutex::new(()),
            truncations: std::sync::atomic::AtomicU64::new(0),
            high_watermark_changes: Arc::default(),
        }
    }

    /// This partition, counting its high watermark changes in `changes` (its manager's,
    /// [`ReplicaManager::checkpoint_high_watermarks`]; [`Partition::new_replica`] makes
    /// a counter of its own).
    fn counting_high_watermark_changes_in(mut self, changes: Arc<AtomicU64>) -> Partition {
        self.high_watermark_changes = changes;
        self
    }

    /// Notes a change of the published high watermark, after it is made.
    fn high_watermark_changed(&self) {
        self.high_watermark_changes.fetch_add(1, Ordering::SeqCst);
    }

    /// This partition, placed in `log_dir` (the shared entry of the log dir its log's
    /// directory is in; [`Partition::new_replica`] makes one of its own).
    fn in_log_dir(self, log_dir: Arc<LogDir>) -> Partition {
        *self
            .log_dir
            .write()
            .expect("partition log dir lock poisoned") = log_dir;
        self
    }

    /// The log dir holding this partition now.
    pub fn log_dir(&self) -> Arc<LogDir> {
        self.log_dir
            .read()
            .expect("partition log dir lock poisoned")
            .clone()
    }

    /// Follows a metadata change of this partition's leader or ISR (Kafka's
    /// `Partition.makeLeader` / `makeFollower`): the role becomes what `state` says. A new
    /// leadership starts every follower's clock afresh and remembers where its epoch
    /// starts; an ISR change within one leadership keeps the followers' fetch state. The
    /// high watermark is recomputed (a shrunken ISR may let it advance), and every waiter
    /// is woken to look again (an acks=all produce on a broker that stopped leading
    /// answers NOT_LEADER_OR_FOLLOWER). A follower's log is truncated by its fetcher
    /// (by leader epoch), not here.
    fn apply_state(&self, state: &PartitionState) {
        let Ok(mut log) = self.live_log_mut() else {
            return;
        };
        if state.leader == self.node_id {
            // Kafka's `makeLeader`: the new epoch starts at the log end offset, so a
            // follower asking where its older epoch ends gets an answer (KIP-279).
            if let Err(e) = log.assign_epoch_start_offset(state.leader_epoch) {
                tracing::error!(topic = %self.topic, partition = self.index, error = %e, "cannot record the leader epoch start offset");
            }
        }
        {
            let mut role = self.role();
            let new = role_for(
                state,
                self.node_id,
                log.log_end_offset(),
                Some(&role),
                now_ms(),
            );
            if new != *role {
                tracing::info!(
                    topic = %self.topic,
                    partition = self.index,
                    leader = state.leader,
                    leader_epoch = state.leader_epoch,
                    isr = ?state.isr,
                    "partition role: {}",
                    if state.leader == self.node_id { "leader" } else { "follower" }
                );
            }
            *role = new;
        }
        roles_changed();
        self.isr_change_pending.store(false, Ordering::SeqCst);
        self.update_high_watermark(&log);
        drop(log);
        // Wake every waiter to look again at the new role.
        self.high_watermark.send_modify(|_| {});
        self.log_end_offset.send_modify(|_| {});
    }

    /// Whether this broker leads the partition (Produce, ListOffsets and consumer Fetch
    /// before v11 go to the leader only: NOT_LEADER_OR_FOLLOWER elsewhere; a consumer's
    /// Fetch v11+ may read a follower, KIP-392).
    pub fn is_leader(&self) -> bool {
        matches!(*self.role(), ReplicaRole::Leader { .. })
    }

    /// The topic settings in force now (a copy: the lock is held only to read them).
    pub fn settings(&self) -> ProduceSettings {
        *self
            .settings
            .read()
            .expect("partition settings lock poisoned")
    }

    /// The log, locked shared: reads (any number at once, and alongside a compaction's
    /// prepare step, which holds no lock). A `std` `RwLock`: never held across `.await`.
    /// Private: the partition offers operations, not its insides.
    fn log(&self) -> std::sync::RwLockReadGuard<'_, PartitionLog> {
        self.log.read().expect("partition log lock poisoned")
    }

    /// The log, locked exclusively: appends, retention, compaction's plan and install
    /// steps, config changes, flushes.
    fn log_mut(&self) -> std::sync::RwLockWriteGuard<'_, PartitionLog> {
        self.log.write().expect("partition log lock poisoned")
    }

    /// [`Partition::log`] for what reads the files: refused once the partition is
    /// deleted (checked under the lock, so a delete never overlaps a read).
    ///
    /// Errors: [`LogError::Deleted`] (6).
    fn live_log(&self) -> Result<std::sync::RwLockReadGuard<'_, PartitionLog>, LogError> {
        let log = self.log();
        if self.deleted.load(Ordering::SeqCst) {
            return Err(LogError::Deleted);
        }
        self.check_online()?;
        Ok(log)
    }

    /// Whether the log dir holding this partition is offline (KIP-112): requests for it
    /// answer KAFKA_STORAGE_ERROR (56).
    pub fn is_offline(&self) -> bool {
        self.log_dir
            .read()
            .expect("partition log dir lock poisoned")
            .is_offline()
    }

    /// Errors: [`LogError::LogDirOffline`] when [`Partition::is_offline`].
    fn check_online(&self) -> Result<(), LogError> {
        let dir = self
            .log_dir
            .read()
            .expect("partition log dir lock poisoned");
        if dir.is_offline() {
            return Err(LogError::LogDirOffline {
                path: dir.path.clone(),
            });
        }
        Ok(())
    }

    /// `result` as is; an I/O error in it first takes this partition's log dir offline
    /// (KIP-112: any I/O error in a log dir fails the whole dir, whose state is then
    /// unknown).
    fn failing_dir_on_io<T>(&self, result: Result<T, LogError>) -> Result<T, LogError> {
        if let Err(e @ LogError::Io { .. }) = &result {
            self.log_dir
                .read()
                .expect("partition log dir lock poisoned")
                .mark_offline(e);
        }
        result
    }

    /// [`Partition::log_mut`] for what writes the files, refused as [`Partition::live_log`].
    ///
    /// Errors: [`LogError::Deleted`] (6).
    fn live_log_mut(&self) -> Result<std::sync::RwLockWriteGuard<'_, PartitionLog>, LogError> {
        let log = self.log_mut();
        if self.deleted.load(Ordering::SeqCst) {
            return Err(LogError::Deleted);
        }
        self.check_online()?;
        Ok(log)
    }

    /// Deletes this partition's files the way Kafka's `Partition.delete` and
    /// `LogManager.asyncDelete` do: under the log's write lock (so no read, append,
    /// retention or compaction step is in flight, and none starts later) it is marked
    /// deleted and its directory (in whichever log dir holds it) is renamed to
    /// `<topic>-<partition>.<uuid>-delete` ([`crate::log::delete::rename_for_delete`]);
    /// the caller removes that later. Waiters are woken: a parked acks=all produce answers
    /// NOT_LEADER_OR_FOLLOWER. The in-memory log (and its open files, unlinked once
    /// removed) goes with the last holder of this `Arc`. Returns the renamed directory
    /// (`None`: there was none).
    ///
    /// Errors: [`LogError::Io`]: the rename failed; the partition stays deleted and the
    /// directory keeps its name.
    fn retire(&self) -> Result<Option<PathBuf>, LogError> {
        let log = self.log_mut();
        self.deleted.store(true, Ordering::SeqCst);
        let renamed = crate::log::delete::rename_for_delete(log.dir());
        drop(log);
        self.high_watermark.send_modify(|_| {});
        self.log_end_offset.send_modify(|_| {});
        renamed
    }

    fn role(&self) -> std::sync::MutexGuard<'_, ReplicaRole> {
        self.role.lock().expect("partition role lock poisoned")
    }

    /// The replica role now (a copy).
    pub fn replica_role(&self) -> ReplicaRole {
        self.role().clone()
    }

    /// As a follower, the leader it follows and that leadership's epoch (`leader_id`,
    /// `leader_epoch`); `None` as leader. What the fetcher manager walks the partitions
    /// for, without copying a leader's ISR and follower map as [`Self::replica_role`] does.
    pub fn followed_leader(&self) -> Option<(i32, i32)> {
        match &*self.role() {
            ReplicaRole::Follower {
                leader_id,
                leader_epoch,
            } => Some((*leader_id, *leader_epoch)),
            ReplicaRole::Leader { .. } => None,
        }
    }

    /// Whether this broker leads the partition with another broker in the ISR: the only
    /// partitions [`Self::maybe_shrink_isr`] can act on (a leader alone in its ISR, as
    /// every partition of a single node is, has nobody to drop; a follower joining is
    /// noticed in its fetch).
    pub fn leads_with_followers_in_isr(&self) -> bool {
        match &*self.role() {
            ReplicaRole::Leader { isr, .. } => isr.iter().any(|id| *id != self.node_id),
            ReplicaRole::Follower { .. } => false,
        }
    }

    fn offsets_of(&self, log: &PartitionLog) -> PartitionOffsets {
        let log_start_offset = log.log_start_offset();
        let log_end_offset = log.log_end_offset();
        // min then max, not `clamp`: clamp panics should the start ever pass the end.
        let high_watermark = (*self.high_watermark.borrow())
            .min(log_end_offset)
            .max(log_start_offset);
        let last_stable_offset = log
            .first_unstable_offset(high_watermark)
            .map_or(high_watermark, |first| first.min(high_watermark))
            .max(log_start_offset);
        PartitionOffsets {
            log_start_offset,
            last_stable_offset,
            high_watermark,
            log_end_offset,
        }
    }

    /// Log start, high watermark and log end, read together.
    pub fn offsets(&self) -> PartitionOffsets {
        self.offsets_of(&self.log())
    }

    /// The high watermark.
    pub fn high_watermark(&self) -> i64 {
        self.offsets().high_watermark
    }

    /// A receiver that sees every high watermark advance of this partition, marked seen
    /// at the current value. Take it *before* checking a condition, so an advance between
    /// the check and the wait is not missed; the purgatory parks on it.
    pub fn watch_high_watermark(&self) -> watch::Receiver<i64> {
        self.high_watermark.subscribe()
    }

    /// Recomputes the high watermark from the role and the log end offset and publishes
    /// it when it advanced. Called with the log locked, after anything that moves the
    /// log end offset or the ISR.
    fn update_high_watermark(&self, log: &PartitionLog) {
        let leo = log.log_end_offset();
        let min_isr = self.settings().min_insync_replicas;
        let role = self.role();
        let changed = self.high_watermark.send_if_modified(|hw| {
            let new = high_watermark_for(&role, self.node_id, leo, *hw, min_isr).min(leo);
            let changed = new != *hw;
            *hw = new;
            changed
        });
        drop(role);
        if changed {
            self.high_watermark_changed();
        }
        self.log_end_offset.send_if_modified(|end| {
            let changed = *end != leo;
            *end = leo;
            changed
        });
    }

    /// A receiver that sees every log end offset change of this partition (appends,
    /// truncation), marked seen at the current value: what a follower's fetch parked at
    /// the leader waits on (followers read past the high watermark).
    pub fn watch_log_end_offset(&self) -> watch::Receiver<i64> {
        self.log_end_offset.subscribe()
    }

    /// Checks a request's `current_leader_epoch` against this replica's (KIP-320): -1
    /// (not given) passes.
    ///
    /// Errors: [`ReplicaError::FencedLeaderEpoch`] (74) when older,
    /// [`ReplicaError::UnknownLeaderEpoch`] (75) when newer.
    pub fn check_leader_epoch(&self, current_leader_epoch: i32) -> Result<(), ReplicaError> {
        let epoch = self.role().leader_epoch();
        match current_leader_epoch {
            -1 => Ok(()),
            e if e < epoch => Err(ReplicaError::FencedLeaderEpoch {
                requested: e,
                current: epoch,
            }),
            e if e > epoch => Err(ReplicaError::UnknownLeaderEpoch {
                requested: e,
                current: epoch,
            }),
            _ => Ok(()),
        }
    }

    /// The in-sync followers of a partition this broker leads, with what the leader knows
    /// of each (log end offset, last caught-up time), by broker id; empty when it does
    /// not lead. What the replica selector chooses a consumer's read replica from
    /// ([`select_read_replica`]; KIP-392).
    pub fn in_sync_followers(&self) -> Vec<ReadReplicaCandidate> {
        match &*self.role() {
            ReplicaRole::Leader { isr, followers, .. } => isr
                .iter()
                .filter(|id| **id != self.node_id)
                .filter_map(|id| {
                    let f = followers.get(id)?;
                    Some(ReadReplicaCandidate {
                        broker_id: *id,
                        log_end_offset: f.log_end_offset,
                        last_caught_up_ms: f.last_caught_up_ms,
                    })
                })
                .collect(),
            ReplicaRole::Follower { .. } => Vec::new(),
        }
    }

    /// The number of in-sync replicas when this broker leads (0 when it does not):
    /// acks=all needs `min.insync.replicas` of them.
    pub fn isr_len(&self) -> usize {
        match &*self.role() {
            ReplicaRole::Leader { isr, .. } => isr.len(),
            ReplicaRole::Follower { .. } => 0,
        }
    }

    /// Sends an ISR change to the replication task unless one is pending.
    fn propose_isr(&self, partition_epoch: i32, isr: Vec<i32>) {
        if self.isr_changes.is_none() || self.isr_change_pending.swap(true, Ordering::SeqCst) {
            return;
        }
        self.send_isr_change(partition_epoch, isr);
    }

    /// Sends a change whose pending flag was claimed; when the channel is full or closed,
    /// withdraws it (the next fetch or check asks again). Takes no log lock: callers may
    /// hold it.
    fn send_isr_change(&self, partition_epoch: i32, isr: Vec<i32>) {
        let Some(tx) = &self.isr_changes else {
            return;
        };
        let change = IsrChange {
            topic: self.topic.clone(),
            partition: self.index,
            partition_epoch,
            isr,
        };
        if tx.try_send(change).is_err() {
            self.withdraw_isr_change(partition_epoch);
        }
    }

    /// Drops the pending ISR change made at `partition_epoch`: a follower it was to add
    /// no longer holds the high watermark back (from its next computation; unless the
    /// role moved on, which reset it already), and the next change may go.
    fn withdraw_isr_change(&self, partition_epoch: i32) {
        if let ReplicaRole::Leader {
            isr,
            maximal_isr,
            partition_epoch: current,
            ..
        } = &mut *self.role()
        {
            if *current == partition_epoch {
                maximal_isr.clone_from(isr);
            }
        }
        self.isr_change_pending.store(false, Ordering::SeqCst);
    }

    /// The replication task is done with this partition's pending ISR change, made at
    /// `partition_epoch`: the next one may go. Unless it was `committed` (the new ISR
    /// then comes with the metadata, [`Partition::apply_state`]), a follower it was to
    /// add no longer holds the high watermark back.
    pub fn isr_change_done(&self, partition_epoch: i32, committed: bool) {
        if committed {
            self.isr_change_pending.store(false, Ordering::SeqCst);
        } else {
            let log = self.log();
            self.withdraw_isr_change(partition_epoch);
            self.update_high_watermark(&log);
        }
    }

    /// A follower's fetch at the leader (Kafka's `Partition.fetchRecords` for a replica):
    /// checks leadership and `current_leader_epoch`, records that `replica_id` has
    /// everything below `fetch_offset` (its log end offset), which may advance the high
    /// watermark (waking acks=all produces) or, once the follower has caught up to the
    /// high watermark within this leadership, ask for it to join the ISR; then reads whole
    /// batches from `fetch_offset` up to the log end offset, `max_bytes` at most (the
    /// first batch whole; 0 reads nothing).
    ///
    /// Errors: [`ReplicaError::NotLeader`] (6) when this broker does not lead or
    /// `replica_id` is not a replica; the epoch errors (74, 75); [`LogError`]
    /// (OFFSET_OUT_OF_RANGE, 1, outside the log; 56).
    pub fn read_for_follower(
        &self,
        replica_id: i32,
        current_leader_epoch: i32,
        fetch_offset: i64,
        max_bytes: usize,
        now_ms: i64,
    ) -> Result<PartitionRead, ReplicaError> {
        self.check_leader_epoch(current_leader_epoch)?;
        let log = self.live_log()?;
        let leo = log.log_end_offset();
        if fetch_offset > leo || fetch_offset < log.log_start_offset() {
            return Err(LogError::OffsetOutOfRange {
                offset: fetch_offset,
                log_start_offset: log.log_start_offset(),
                log_end_offset: leo,
            }
            .into());
        }
        let expand = {
            let mut role = self.role();
            let ReplicaRole::Leader {
                isr,
                maximal_isr,
                followers,
                epoch_start_offset,
                partition_epoch,
                ..
            } = &mut *role
            else {
                return Err(ReplicaError::NotLeader);
            };
            let Some(f) = followers.get_mut(&replica_id) else {
                return Err(ReplicaError::NotLeader);
            };
            f.record_fetch(fetch_offset, leo, now_ms);
            let hw = *self.high_watermark.borrow();
            let joins = !isr.contains(&replica_id)
                && fetch_offset >= hw
                && fetch_offset >= *epoch_start_offset;
            // Claimed under the role lock, so the high watermark waits for the joining
            // follower (maximal ISR) from before the change is sent.
            (joins
                && self.isr_changes.is_some()
                && !self.isr_change_pending.swap(true, Ordering::SeqCst))
            .then(|| {
                let mut wanted = isr.clone();
                wanted.push(replica_id);
                maximal_isr.clone_from(&wanted);
                (*partition_epoch, wanted)
            })
        };
        self.update_high_watermark(&log);
        if let Some((epoch, isr)) = expand {
            tracing::info!(topic = %self.topic, partition = self.index, replica_id, "follower caught up: asking for it to join the ISR");
            self.send_isr_change(epoch, isr);
        }
        let offsets = self.offsets_of(&log);
        // No room left in the response: the fetch offset is recorded, nothing is read.
        let bytes = if max_bytes == 0 {
            Bytes::new()
        } else {
            log.read(fetch_offset, max_bytes, offsets.log_end_offset)?
                .bytes
        };
        Ok(PartitionRead {
            offsets,
            bytes,
            aborted_transactions: None,
        })
    }

    /// The leader's ISR check (Kafka's `Partition.maybeShrinkIsr`): the in-sync
    /// followers not caught up for longer than `lag_time_max_ms` leave the ISR (the
    /// change goes to the controller). Returns the ISR asked for, if any.
    pub fn maybe_shrink_isr(&self, now_ms: i64, lag_time_max_ms: i64) -> Option<Vec<i32>> {
        let (epoch, wanted) = {
            let role = self.role();
            let ReplicaRole::Leader {
                isr,
                followers,
                partition_epoch,
                ..
            } = &*role
            else {
                return None;
            };
            let wanted: Vec<i32> = isr
                .iter()
                .copied()
                .filter(|id| {
                    *id == self.node_id
                        || followers
                            .get(id)
                            .is_some_and(|f| now_ms - f.last_caught_up_ms <= lag_time_max_ms)
                })
                .collect();
            if wanted.len() == isr.len() {
                return None;
            }
            (*partition_epoch, wanted)
        };
        tracing::info!(topic = %self.topic, partition = self.index, isr = ?wanted, "followers lag by more than replica.lag.time.max.ms: asking to shrink the ISR");
        self.propose_isr(epoch, wanted.clone());
        Some(wanted)
    }

    /// Appends batches copied from the leader, as the leader stored them (offsets, leader
    /// epochs, timestamps kept; producer state rebuilt from them, so idempotent retries are
    /// recognised if this replica becomes leader), then takes the high watermark the
    /// leader sent, capped at the new log end offset (Kafka's `Partition.appendRecordsToFollowerOrFutureReplica`
    /// and `maybeUpdateHighWatermark`).
    ///
    /// Errors: [`LogError::UnexpectedAppendOffset`] when a batch does not start at the log
    /// end offset (the fetcher truncates and fetches again); I/O.
    pub fn append_as_follower(
        &self,
        batches: Vec<ValidatedBatch>,
        leader_high_watermark: i64,
        now_ms: i64,
    ) -> Result<(), LogError> {
        let mut log = self.live_log_mut()?;
        if matches!(*self.role(), ReplicaRole::Leader { .. }) {
            // Became leader since the fetch was sent: its log is the truth now.
            return Ok(());
        }
        let mut result = Ok(());
        for batch in batches {
            if let Err(e) = log.append_as_follower(batch, now_ms) {
                result = Err(e);
                break;
            }
        }
        self.leader_high_watermark
            .store(leader_high_watermark, Ordering::SeqCst);
        self.set_follower_high_watermark(&log, leader_high_watermark);
        let hw = *self.high_watermark.borrow();
        log.prune_replicated_txns(hw);
        self.failing_dir_on_io(result)
    }

    /// How many offsets this replica's log is behind the committed records (DescribeLogDirs
    /// `offset_lag`, Kafka's `max(high watermark − log end offset, 0)`): 0 on the leader;
    /// on a follower, measured against the high watermark its leader last sent (0 before
    /// the first).
    pub fn offset_lag(&self) -> i64 {
        let leo = self.log().log_end_offset();
        match &*self.role() {
            ReplicaRole::Leader { .. } => 0,
            ReplicaRole::Follower { .. } => {
                (self.leader_high_watermark.load(Ordering::SeqCst) - leo).max(0)
            }
        }
    }

    /// A follower's high watermark: the leader's, capped at its own log end offset.
    fn set_follower_high_watermark(&self, log: &PartitionLog, leader_high_watermark: i64) {
        let leo = log.log_end_offset();
        let hw = leader_high_watermark.min(leo).max(log.log_start_offset());
        let changed = self.high_watermark.send_if_modified(|current| {
            let changed = *current != hw;
            *current = hw;
            changed
        });
        if changed {
            self.high_watermark_changed();
        }
        self.log_end_offset.send_if_modified(|end| {
            let changed = *end != leo;
            *end = leo;
            changed
        });
    }

    /// Removes every record at or above `offset` (a follower's divergent tail, KIP-101);
    /// the high watermark is capped at the new log end offset.
    ///
    /// Errors: [`LogError`] (I/O).
    pub fn truncate_to(&self, offset: i64, now_ms: i64) -> Result<(), LogError> {
        let mut log = self.live_log_mut()?;
        let before = log.log_end_offset();
        self.truncations.fetch_add(1, Ordering::SeqCst);
        // Also at or past the end: that drops an epoch assigned with no records after it.
        log.truncate_to(offset, now_ms)?;
        if log.log_end_offset() < before {
            tracing::info!(topic = %self.topic, partition = self.index, from = before, to = log.log_end_offset(), "truncated the log to the leader's");
        }
        let hw = *self.high_watermark.borrow();
        self.set_follower_high_watermark(&log, hw);
        Ok(())
    }

    /// Empties this replica's log and restarts it at `offset`, the leader's log start
    /// offset, when that is above this replica's log end offset (Kafka's
    /// `truncateFullyAndStartAt`, on OFFSET_OUT_OF_RANGE from the leader); the high
    /// watermark moves to `offset`. Anything else keeps the log (the caller truncates by
    /// epoch instead) and returns `false`.
    ///
    /// Errors: [`LogError`] (I/O).
    pub fn reset_to_leader_log_start(&self, offset: i64, now_ms: i64) -> Result<bool, LogError> {
        let mut log = self.live_log_mut()?;
        let before = log.log_end_offset();
        if offset <= before {
            return Ok(false);
        }
        self.truncations.fetch_add(1, Ordering::SeqCst);
        log.truncate_fully_and_start_at(offset, now_ms)?;
        tracing::info!(topic = %self.topic, partition = self.index, log_end_offset = before, leader_log_start_offset = offset, "follower log ends before the leader's log start; restarted empty there");
        self.set_follower_high_watermark(&log, offset);
        Ok(true)
    }

    /// DeleteRecords on the leader (protocol guide "DeleteRecords"; Kafka's
    /// `Partition.deleteRecordsOnLeader`): moves the log start offset to `offset`, or to
    /// the high watermark when `offset` is -1, deleting the segments wholly below it
    /// ([`PartitionLog::increment_log_start_offset`]). Returns the log start offset after
    /// the call (the response's `low_watermark`; unchanged when `offset` is below it).
    /// Followers move theirs when their next Fetch response carries the new start
    /// ([`Partition::follow_leader_log_start`]); the answer does not wait for them.
    ///
    /// Errors: `NotLeader` (6) on a follower; `OffsetOutOfRange` (1) when `offset` is
    /// above the high watermark or negative other than -1; `Io` (56).
    pub fn delete_records_on_leader(&self, offset: i64) -> Result<i64, LogError> {
        let mut log = self.live_log_mut()?;
        if !matches!(*self.role(), ReplicaRole::Leader { .. }) {
            return Err(LogError::NotLeader);
        }
        let offsets = self.offsets_of(&log);
        let target = if offset == -1 {
            offsets.high_watermark
        } else {
            offset
        };
        if target < 0 {
            return Err(LogError::OffsetOutOfRange {
                offset,
                log_start_offset: offsets.log_start_offset,
                log_end_offset: offsets.log_end_offset,
            });
        }
        if log.increment_log_start_offset(target, offsets.high_watermark)? {
            tracing::info!(topic = %self.topic, partition = self.index, log_start_offset = target, "DeleteRecords moved the log start offset");
            self.log_start_moved();
        }
        Ok(log.log_start_offset())
    }

    /// A follower takes its leader's log start offset from a Fetch response (Kafka's
    /// `ReplicaFetcherThread.processPartitionData` → `maybeIncrementLogStartOffset`),
    /// capped at its own high watermark; so records deleted on the leader (DeleteRecords,
    /// retention) stop being readable here too. Does nothing on a leader or when the
    /// offset is not above this replica's start. Returns whether the start moved.
    ///
    /// Errors: [`LogError`] (I/O).
    pub fn follow_leader_log_start(&self, leader_log_start_offset: i64) -> Result<bool, LogError> {
        // Every Fetch response calls this; the write lock only when there is work.
        if leader_log_start_offset <= self.log().log_start_offset() {
            return Ok(false);
        }
        let mut log = self.live_log_mut()?;
        if matches!(*self.role(), ReplicaRole::Leader { .. }) {
            return Ok(false);
        }
        let hw = self.offsets_of(&log).high_watermark;
        let target = leader_log_start_offset.min(hw);
        if target <= log.log_start_offset() {
            return Ok(false);
        }
        let moved = log.increment_log_start_offset(target, hw)?;
        if moved {
            tracing::info!(topic = %self.topic, partition = self.index, log_start_offset = target, "follower moved its log start offset to the leader's");
            self.log_start_moved();
        }
        Ok(moved)
    }

    /// Wakes what waits on the high watermark after the log start offset moved: a parked
    /// consumer Fetch then reads again instead of answering with records read before
    /// they were deleted (`protocol::fetch::handle` answers a quiet park with its first
    /// read).
    fn log_start_moved(&self) {
        self.high_watermark.send_modify(|_| {});
    }

    /// The newest leader epoch in this replica's log, if any batch carries one.
    pub fn latest_epoch(&self) -> Option<i32> {
        self.log().latest_epoch()
    }

    /// OffsetForLeaderEpoch (KIP-101, KIP-279): the largest epoch at or below
    /// `leader_epoch` this log knows, with the offset where it ends.
    pub fn end_offset_for_epoch(&self, leader_epoch: i32) -> EpochEndOffset {
        self.log().end_offset_for_epoch(leader_epoch)
    }

    /// Whole stored batches from the one containing `fetch_offset`, up to `max_bytes`
    /// (the first batch whole even when larger: KIP-74), bounded by `isolation` (the high
    /// watermark for consumers, the last stable offset for read_committed ones, which
    /// also get the aborted transactions overlapping what was read, Kafka's
    /// `collectAbortedTxns`). `fetch_offset` equal to the bound gives no bytes.
    ///
    /// Errors: [`LogError::OffsetOutOfRange`] (OFFSET_OUT_OF_RANGE, 1) below the log
    /// start or above the log end; [`LogError::Io`] / [`LogError::Corrupt`]
    /// (KAFKA_STORAGE_ERROR, 56).
    pub fn read(
        &self,
        fetch_offset: i64,
        max_bytes: usize,
        isolation: FetchIsolation,
    ) -> Result<PartitionRead, LogError> {
        let log = self.live_log()?;
        let offsets = self.offsets_of(&log);
        let bound = isolation_bound(&offsets, isolation);
        let read = self.failing_dir_on_io(log.read(fetch_offset, max_bytes, bound))?;
        let last = crate::log::last_offset_in(&read.bytes);
        let aborted_transactions = aborted_txns_read(&log, isolation, fetch_offset, last)?;
        Ok(PartitionRead {
            offsets,
            bytes: read.bytes,
            aborted_transactions,
        })
    }

    /// [`Partition::read`] as a byte range of a segment file ([`FileRegion`], `None` when
    /// nothing is readable), for a consumer's Fetch sent with `sendfile(2)` (issue 17):
    /// the same batches, bounds, aborted transactions and errors.
    pub fn read_region(
        &self,
        fetch_offset: i64,
        max_bytes: usize,
        isolation: FetchIsolation,
    ) -> Result<PartitionRegionRead, LogError> {
        let log = self.live_log()?;
        let offsets = self.offsets_of(&log);
        let bound = isolation_bound(&offsets, isolation);
        let region = self.failing_dir_on_io(log.read_region(fetch_offset, max_bytes, bound))?;
        let last = region.as_ref().map(|r| r.last_offset);
        let aborted_transactions = aborted_txns_read(&log, isolation, fetch_offset, last)?;
        Ok(PartitionRegionRead {
            offsets,
            region,
            aborted_transactions,
        })
    }

    /// ListOffsets by timestamp (KIP-79): the first record whose timestamp is at or
    /// after `ts_ms`, as `(offset, timestamp_ms)`, below the bound of `isolation` (the
    /// high watermark; the last stable offset for ListOffsets `isolation_level` 1).
    ///
    /// Errors: [`LogError`] from the index or a batch read (KAFKA_STORAGE_ERROR, 56).
    pub fn offset_for_timestamp(
        &self,
        ts_ms: i64,
        isolation: FetchIsolation,
    ) -> Result<Option<(i64, i64)>, LogError> {
        let log = self.live_log()?;
        let bound = isolation_bound(&self.offsets_of(&log), isolation);
        Ok(log
            .offset_for_timestamp(ts_ms)?
            .filter(|(offset, _)| *offset < bound))
    }

    /// ListOffsets -3 (KIP-734): the record with the largest timestamp, as
    /// `(offset, timestamp_ms)`, if it is below the bound of `isolation` (as
    /// [`Partition::offset_for_timestamp`]).
    ///
    /// Errors: [`LogError`] from a batch read (KAFKA_STORAGE_ERROR, 56).
    pub fn max_timestamp(&self, isolation: FetchIsolation) -> Result<Option<(i64, i64)>, LogError> {
        let log = self.live_log()?;
        let bound = isolation_bound(&self.offsets_of(&log), isolation);
        Ok(log.max_timestamp()?.filter(|(offset, _)| *offset < bound))
    }

    /// Appends a transaction marker as the partition's leader (KIP-98; what a
    /// WriteTxnMarkers request does per partition): one control batch ending
    /// `producer_id`'s transaction, COMMIT when `commit` else ABORT, carrying
    /// `coordinator_epoch`, stamped with the leader epoch and timestamped `now_ms` (wall
    /// clock, ms). Ends the producer's ongoing transaction here; an ABORT adds an entry to
    /// the aborted transaction index. Advances the high watermark as far as the ISR allows
    /// and wakes what waits on it, like [`Partition::append_as_leader`]; the caller waits
    /// for replication with [`Partition::wait_for_high_watermark`] (markers are written
    /// with acks=all). A marker for a producer with no transaction open here is written
    /// all the same (Kafka does; it is harmless).
    ///
    /// Errors: [`LogError::NotLeader`] (6) on a follower; [`LogError::InvalidProducerEpoch`]
    /// (47) when `producer_epoch` is below the producer's known epoch;
    /// [`LogError::TransactionCoordinatorFenced`] (52) when `coordinator_epoch` is below
    /// the last one seen for the producer; I/O (56). Nothing is written on error.
    pub fn append_txn_marker(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
        now_ms: i64,
    ) -> Result<AppendInfo, LogError> {
        let mut log = self.live_log_mut()?;
        let leader_epoch = match &*self.role() {
            ReplicaRole::Leader { leader_epoch, .. } => *leader_epoch,
            ReplicaRole::Follower { .. } => return Err(LogError::NotLeader),
        };
        let options = AppendOptions {
            log_append_time_ms: None,
            leader_epoch,
        };
        let marker = TxnMarker {
            commit,
            coordinator_epoch,
        };
        let result = log.append_txn_marker(producer_id, producer_epoch, marker, options, now_ms);
        self.update_high_watermark(&log);
        let hw = *self.high_watermark.borrow();
        log.prune_replicated_txns(hw);
        self.failing_dir_on_io(result)
    }

    /// Whether a batch of `producer_id` at `producer_epoch` must start at sequence 0 on
    /// this partition: KIP-890 part 2's check of a transaction's first batch.
    pub fn expects_first_sequence(&self, producer_id: i64, producer_epoch: i16) -> bool {
        self.log()
            .expects_first_sequence(producer_id, producer_epoch)
    }

    /// Whether `producer_id` has a transaction open on this partition at
    /// `producer_epoch`: KIP-890's check at produce (a transaction of an older epoch is
    /// one whose marker has not arrived yet, which a batch of a newer epoch is not in).
    pub fn has_ongoing_txn_at(&self, producer_id: i64, producer_epoch: i16) -> bool {
        self.log().has_ongoing_txn_at(producer_id, producer_epoch)
    }

    /// The producers this replica's log knows (DescribeProducers, KIP-664), by id.
    pub fn producer_summaries(&self) -> Vec<ProducerSummary> {
        self.log().producer_summaries()
    }

    /// Appends validated batches in order as the partition's leader, stamping the leader
    /// epoch into each; returns the first batch's append info with the last batch's last
    /// offset. Advances the high watermark as far as the ISR allows (on a single node: to
    /// the new log end offset) and wakes what waits on it.
    ///
    /// The caller checked leadership against the metadata image (a produce to a follower
    /// is answered NOT_LEADER_OR_FOLLOWER, 6, before it gets here); followers will append
    /// with their own entry point that keeps the leader's offsets and epochs. Errors: [`LogError`] from the log (sequence
    /// errors of idempotent producers 45/47, I/O 56); batches before the failing one stay
    /// appended, as in Kafka.
    pub fn append_as_leader(
        &self,
        batches: Vec<ValidatedBatch>,
        now_ms: i64,
    ) -> Result<AppendInfo, LogError> {
        let log_append_time_ms = self.settings().log_append_time.then_some(now_ms);
        let mut log = self.live_log_mut()?;
        // The role is read under the log lock: a leader change (which takes the log lock
        // too) cannot slip between the check and the append.
        let leader_epoch = match &*self.role() {
            ReplicaRole::Leader { leader_epoch, .. } => *leader_epoch,
            ReplicaRole::Follower { .. } => return Err(LogError::NotLeader),
        };
        let opts = AppendOptions {
            log_append_time_ms,
            leader_epoch,
        };
        let mut first: Option<AppendInfo> = None;
        let mut result = Ok(());
        for batch in batches {
            match log.append(batch, opts, now_ms) {
                Ok(info) => match &mut first {
                    None => first = Some(info),
                    Some(f) => f.last_offset = info.last_offset,
                },
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.update_high_watermark(&log);
        let hw = *self.high_watermark.borrow();
        log.prune_replicated_txns(hw);
        drop(log);
        self.failing_dir_on_io(result)?;
        // `split_batches` never yields an empty list for non-empty input, and the produce
        // path refuses empty input before calling: an empty list here is our bug.
        Ok(first.expect("append called with no batches"))
    }

    /// Waits until the high watermark passes `offset` (acks=all: the batch whose last
    /// offset is `offset` is on every in-sync replica), this broker stops leading, the ISR
    /// falls below `min.insync.replicas`, or `timeout_ms` passes (Kafka's
    /// `DelayedProduce`). Parks on the partition's high watermark, never blocking a
    /// thread.
    pub async fn wait_for_high_watermark(&self, offset: i64, timeout_ms: u64) -> ReplicationWait {
        let mut rx = self.watch_high_watermark();
        let wait = async {
            loop {
                if *rx.borrow_and_update() > offset {
                    return ReplicationWait::Replicated;
                }
                let isr = self.isr_len();
                if isr == 0 || self.deleted.load(Ordering::SeqCst) {
                    return ReplicationWait::NotLeader;
                }
                if isr < self.settings().min_insync_replicas {
                    return ReplicationWait::NotEnoughReplicasAfterAppend;
                }
                if rx.changed().await.is_err() {
                    return ReplicationWait::NotLeader;
                }
            }
        };
        tokio::time::timeout(std::time::Duration::from_millis(timeout_ms), wait)
            .await
            .unwrap_or(ReplicationWait::TimedOut)
    }

    /// Retention (then compaction) on this partition's log; returns the segments deleted
    /// by retention. See [`PartitionLog::apply_retention`] and [`PartitionLog::compact`].
    fn apply_retention(&self, now_ms: i64) -> Result<usize, LogError> {
        let mut log = self.live_log_mut()?;
        let deleted = self.failing_dir_on_io(log.apply_retention(now_ms))?;
        self.update_high_watermark(&log);
        if deleted > 0 {
            self.log_start_moved();
        }
        Ok(deleted)
    }

    /// Compaction step 1, under the exclusive lock (cheap): what a run would clean. See
    /// [`PartitionLog::plan_compaction`]; step 2, `CompactionPlan::prepare`, runs with no
    /// lock held, so produce and fetch go on. `None` once the partition is deleted.
    fn plan_compaction(&self, now_ms: i64) -> Option<CompactionPlan> {
        Some(self.live_log_mut().ok()?.plan_compaction(now_ms))
    }

    /// Compaction step 3, under the exclusive lock: swaps the prepared segments in, or
    /// discards them if the log changed meanwhile ([`PartitionLog::install_compaction`]).
    fn install_compaction(
        &self,
        prepared: PreparedCompaction,
    ) -> Result<CompactionStats, LogError> {
        let mut log = self.live_log_mut()?;
        let stats = log.install_compaction(prepared)?;
        self.update_high_watermark(&log);
        Ok(stats)
    }

    fn flush(&self) -> Result<(), LogError> {
        let result = self.live_log_mut()?.flush();
        self.failing_dir_on_io(result)
    }

    /// A move's view of the files: the log's directory, its files' lengths and times
    /// taken with appends stopped (the read lock, so every byte below a length is
    /// written), when they were taken, and the truncation count then.
    ///
    /// Errors: [`LogError::Deleted`]; [`LogError::Io`] listing the directory.
    fn files_for_move(&self) -> Result<(PathBuf, relocate::Snapshot, u64), LogError> {
        let log = self.live_log()?;
        let snapshot = relocate::snapshot(log.dir())?;
        Ok((
            log.dir().to_path_buf(),
            snapshot,
            self.truncations.load(Ordering::SeqCst),
        ))
    }

    /// The end of a move (`AlterReplicaLogDirs`): under the write lock (no append, read or
    /// truncation runs, none starts until it returns) the log is flushed, the copy brought
    /// up to date ([`relocate::Copier::copy_pass`], `.log` files whole when a truncation
    /// happened since `truncations_seen`), swapped in ([`relocate::Copier::commit`]) and
    /// opened as the partition's log, now in `dest`; the old log and its files are
    /// dropped. A log that cannot be opened from the copy puts the source back and keeps
    /// the old log. Returns the renamed source directory, for removal.
    ///
    /// Errors: [`LogError::Deleted`] (deleted meanwhile: the caller drops the copy);
    /// [`LogError::Io`] or [`LogError::Corrupt`] (the partition stays where it was).
    fn finish_move(
        &self,
        copier: &mut relocate::Copier,
        dest: Arc<LogDir>,
        truncations_seen: u64,
    ) -> Result<PathBuf, LogError> {
        let mut log = self.live_log_mut()?;
        log.flush()?;
        let (files, taken) = relocate::snapshot(log.dir())?;
        let truncated = self.truncations.load(Ordering::SeqCst) != truncations_seen;
        copier.copy_pass(&files, taken, truncated)?;
        let (new_dir, renamed) = copier.commit()?;
        match PartitionLog::open(&new_dir, log.config().clone(), now_ms()) {
            Ok(opened) => {
                *log = opened;
                *self
                    .log_dir
                    .write()
                    .expect("partition log dir lock poisoned") = dest;
                Ok(renamed)
            }
            Err(e) => {
                if let Err(undo) = copier.undo_commit(&renamed) {
                    tracing::error!(topic = %self.topic, partition = self.index, error = %undo, "cannot put a moved partition's source back; a restart keeps the copy");
                }
                Err(e)
            }
        }
    }

    fn set_log_config(&self, config: LogConfig) -> Result<(), LogError> {
        self.live_log_mut()?.set_config(config)
    }
}

/// One of this broker's log directories as DescribeLogDirs reports it
/// ([`ReplicaManager::describe_log_dirs`]).
#[derive(Debug)]
pub struct LogDirDescription {
    /// The directory (one of `log.dirs`), absolute.
    pub path: PathBuf,
    /// Why it cannot be read, when it cannot (KAFKA_STORAGE_ERROR, 56).
    pub error: Option<std::io::Error>,
    /// Size of the file system holding it, in bytes (-1: unknown).
    pub total_bytes: i64,
    /// Bytes of that file system still usable by this process (-1: unknown).
    pub usable_bytes: i64,
    /// Every partition hosted in it (none when the directory cannot be read), and the
    /// future replicas being copied into it (`is_future`).
    pub partitions: Vec<HostedPartitionSize>,
}

/// One hosted partition's size and lag (DescribeLogDirs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostedPartitionSize {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
    /// Bytes of its segment files.
    pub size_bytes: u64,
    /// [`Partition::offset_lag`].
    pub offset_lag: i64,
    /// A future replica: the copy of a partition being moved into this directory
    /// (AlterReplicaLogDirs), not yet the one served.
    pub is_future: bool,
}

/// Key of the partition map.
type PartitionKey = (String, i32);

/// A partition map key seen as `(topic, index)`: lets a lookup borrow its topic
/// (`(&str, i32)`) instead of allocating a `String` for every partition a Fetch names.
/// Hashes and compares as the tuple does, so both key forms find the same entry.
trait PartitionKeyRef {
    fn key(&self) -> (&str, i32);
}

impl PartitionKeyRef for PartitionKey {
    fn key(&self) -> (&str, i32) {
        (&self.0, self.1)
    }
}

impl PartitionKeyRef for (&str, i32) {
    fn key(&self) -> (&str, i32) {
        (self.0, self.1)
    }
}

impl<'a> std::borrow::Borrow<dyn PartitionKeyRef + 'a> for PartitionKey {
    fn borrow(&self) -> &(dyn PartitionKeyRef + 'a) {
        self
    }
}

impl std::hash::Hash for dyn PartitionKeyRef + '_ {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key().hash(state)
    }
}

impl PartialEq for dyn PartitionKeyRef + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for dyn PartitionKeyRef + '_ {}

/// The partitions of this broker.
#[derive(Debug)]
pub struct ReplicaManager {
    /// `log.dirs`, in order; every partition lives in one of them.
    log_dirs: Vec<Arc<LogDir>>,
    /// [`BrokerConfig::metadata_dir`]: where `replication-offset-checkpoint` is.
    metadata_dir: PathBuf,
    broker: Arc<BrokerConfig>,
    partitions: RwLock<HashMap<PartitionKey, Arc<Partition>>>,
    purgatory: Arc<Purgatory>,
    /// Partition directories created by the prepared, not yet published, metadata change
    /// (metadata changes are serialised: at most one is pending), removed if it aborts.
    created_dirs: Mutex<Vec<PathBuf>>,
    /// Where leaders send ISR changes ([`Partition::maybe_shrink_isr`], follower catch-up).
    isr_changes: mpsc::Sender<IsrChange>,
    /// The other end, until the replication task takes it.
    isr_changes_rx: Mutex<Option<mpsc::Receiver<IsrChange>>>,
    /// The metadata dir's `replication-offset-checkpoint` as read at start-up, less the
    /// partitions opened since (each takes its entry as its starting high watermark). What
    /// is left is written back with every checkpoint, so a partition the metadata has not
    /// opened yet keeps its entry.
    unopened_high_watermarks: Mutex<HighWatermarks>,
    /// Bumped at every high watermark change of a hosted partition (each counts into it,
    /// `Partition::high_watermark_changes`) and every change of the partition map.
    high_watermark_changes: Arc<AtomicU64>,
    /// Held while a checkpoint is written (the periodic task and shutdown share one temp
    /// file); holds the [`Self::high_watermark_changes`] count the last written checkpoint
    /// covers (`None`: none written by this process), so an unchanged one is not written
    /// again.
    checkpoint_write: Mutex<Option<u64>>,
    /// Renamed directories of deleted partitions (and `-delete` leftovers found at
    /// start-up), removed by [`ReplicaManager::remove_deleted_dirs`]. Bounded by the
    /// partitions deleted between two runs.
    deleted_dirs: Mutex<Vec<PathBuf>>,
    /// Moves between log dirs in progress (AlterReplicaLogDirs), at most one per
    /// partition, each on a thread of its own that removes its entry when done.
    moves: Mutex<HashMap<PartitionKey, Move>>,
    /// Woken when one of `log_dirs` goes offline ([`LogDir::mark_offline`]).
    offline_dir_notify: Arc<tokio::sync::Notify>,
}

/// A partition being moved to another log dir ([`ReplicaManager::alter_replica_log_dir`]).
#[derive(Debug)]
struct Move {
    /// Where it goes.
    dest: Arc<LogDir>,
    /// The copy being made there (`<topic>-<partition>.<id>-future`).
    future: PathBuf,
    /// Set to give the move up (shutdown).
    cancel: Arc<AtomicBool>,
    /// The thread copying.
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Why [`ReplicaManager::alter_replica_log_dir`] refused, with Kafka's error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveRefusal {
    /// LOG_DIR_NOT_FOUND (57): the directory is none of `log.dirs`.
    LogDirNotFound,
    /// KAFKA_STORAGE_ERROR (56): the destination (or the partition's own dir) is offline.
    StorageError,
    /// UNKNOWN_TOPIC_OR_PARTITION (3): the partition is not hosted here.
    UnknownPartition,
    /// REASSIGNMENT_IN_PROGRESS (60): it is already moving to another directory.
    MoveInProgress,
}

impl MoveRefusal {
    /// The Kafka error code.
    pub fn kafka_error(self) -> kafka_protocol::ResponseError {
        use kafka_protocol::ResponseError as E;
        match self {
            MoveRefusal::LogDirNotFound => E::LogDirNotFound,
            MoveRefusal::StorageError => E::KafkaStorageError,
            MoveRefusal::UnknownPartition => E::UnknownTopicOrPartition,
            MoveRefusal::MoveInProgress => E::ReassignmentInProgress,
        }
    }
}

/// Unlocked copy passes of a move before the locked last one, at most.
const MOVE_UNLOCKED_PASSES: usize = 8;

/// An unlocked pass copying fewer bytes than this ends the unlocked passes: the rest is
/// copied with the partition's writes stopped.
const MOVE_LOCKED_PASS_BYTES: u64 = 4 * 1024 * 1024;

/// A marker appended by [`ReplicaManager::append_txn_marker`], not yet known replicated.
#[derive(Debug, Clone)]
pub struct AppendedMarker {
    /// The partition it went to.
    pub partition: Arc<Partition>,
    /// The marker's offset.
    pub offset: i64,
}

/// How long [`ReplicaManager::write_txn_marker`] waits for a marker to be replicated
/// (the brief's 5 s; Kafka uses `request.timeout.ms`).
pub const TXN_MARKER_TIMEOUT_MS: u64 = 5_000;

/// Most ISR changes waiting for the replication task; a leader whose change does not fit
/// asks again at its next check.
const ISR_CHANGE_QUEUE: usize = 1024;

/// Milliseconds since the Unix epoch, from the system clock.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn partition_dir(log_dir: &Path, topic: &str, index: i32) -> PathBuf {
    log_dir.join(format!("{topic}-{index}"))
}

/// What a metadata delta does to one topic's partitions on this broker.
#[derive(Debug)]
enum TopicChange<'a> {
    /// Open partitions `from..meta.partitions` (a new topic, or partitions added).
    Open { meta: &'a TopicMeta, from: i32 },
    /// Partition `index`'s leader or ISR changed: its role follows.
    Leadership { meta: &'a TopicMeta, index: i32 },
    /// This broker became a replica of partition `index` (a reassignment adds it): open
    /// it, as a follower.
    Join { meta: &'a TopicMeta, index: i32 },
    /// This broker is no longer a replica of partition `index` (a reassignment removed
    /// it): close it and delete its directory.
    Leave { meta: &'a TopicMeta, index: i32 },
    /// Apply the topic's new configs to its partitions.
    Reconfigure(&'a TopicMeta),
    /// Close partitions `0..partitions` and delete their directories.
    Close { name: &'a str, partitions: i32 },
}

/// The changes `delta` makes to the partitions here, topic by topic in record order.
///
/// Errors: a delta that deletes a topic and creates another of the same name (two
/// partitions would share a directory): none is built so.
fn topic_changes(delta: &MetadataDelta) -> Result<Vec<TopicChange<'_>>, ListenerError> {
    let (before, after) = (delta.before(), delta.after());
    let me = after.node_id();
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    let mut dynamic_configs_changed = false;
    for record in delta.records() {
        let id = match record {
            MetadataRecord::TopicCreated(t) => t.id,
            MetadataRecord::PartitionsAdded { topic_id, .. }
            | MetadataRecord::TopicConfigsChanged { topic_id, .. }
            | MetadataRecord::TopicDeleted { topic_id }
            | MetadataRecord::PartitionChanged { topic_id, .. } => *topic_id,
            MetadataRecord::ProducerIdsReserved { .. }
            | MetadataRecord::BrokerRegistered { .. }
            | MetadataRecord::BrokerFenced { .. }
            | MetadataRecord::BrokerUnfenced { .. }
            | MetadataRecord::BrokerShuttingDown { .. }
            // The elections it brings come as `PartitionChanged`; the local dir state is
            // the partition's own (`LogDir`).
            | MetadataRecord::ReplicasOffline { .. }
            | MetadataRecord::TransformDeployed { .. }
            | MetadataRecord::TransformDeleted { .. } => continue,
            MetadataRecord::BrokerConfigsChanged { .. } => {
                dynamic_configs_changed = true;
                continue;
            }
        };
        if !seen.insert(id) {
            continue;
        }
        match (before.topic_by_id(id), after.topic_by_id(id)) {
            (None, Some(a)) => {
                if before.topic(&a.name).is_some() {
                    return Err(ListenerError {
                        message: format!(
                            "topic {} is deleted and created again in one metadata change",
                            a.name
                        ),
                        source: None,
                    });
                }
                out.push(TopicChange::Open { meta: a, from: 0 });
            }
            (Some(b), Some(a)) => {
                if a.partitions > b.partitions {
                    out.push(TopicChange::Open {
                        meta: a,
                        from: b.partitions,
                    });
                }
                if a.configs != b.configs {
                    out.push(TopicChange::Reconfigure(a));
                }
                for (index, old, new) in a.changed_partitions(b) {
                    out.push(
                        match (old.replicas.contains(&me), new.replicas.contains(&me)) {
                            (false, true) => TopicChange::Join { meta: a, index },
                            (true, false) => TopicChange::Leave { meta: a, index },
                            _ => TopicChange::Leadership { meta: a, index },
                        },
                    );
                }
            }
            (Some(b), None) => out.push(TopicChange::Close {
                name: &b.name,
                partitions: b.partitions,
            }),
            // Created and deleted within the delta: nothing to do here.
            (None, None) => {}
        }
    }
    if dynamic_configs_changed && before.dynamic_layers_differ(after) {
        // A broker default changed: every topic without an override of its own may have a
        // new effective config (the topics this delta opens resolve with it already).
        for t in after.topics() {
            if !seen.contains(&t.id) {
                out.push(TopicChange::Reconfigure(t));
            }
        }
    }
    Ok(out)
}

/// How often `broker.rs` runs [`ReplicaManager::remove_deleted_dirs`] (ms). Kafka waits
/// `file.delete.delay.ms` (60 s) so that reads of the old files can finish; here no read
/// is in flight once a partition is marked deleted, so the wait is only to keep removal
/// off the metadata change.
pub const DELETED_DIR_REMOVAL_INTERVAL_MS: u64 = 1_000;

/// The copy passes and the swap of a move (see [`ReplicaManager::alter_replica_log_dir`]):
/// returns the renamed source directory, or `None` when `cancel` was raised first.
///
/// Errors: those of [`relocate::Copier::copy_pass`] and [`Partition::finish_move`].
fn copy_and_swap(
    p: &Partition,
    copier: &mut relocate::Copier,
    dest: &Arc<LogDir>,
    cancel: &AtomicBool,
) -> Result<Option<PathBuf>, LogError> {
    let mut truncations_seen = None;
    for _ in 0..MOVE_UNLOCKED_PASSES {
        if cancel.load(Ordering::SeqCst) {
            return Ok(None);
        }
        let (_, (files, taken), truncations) = p.files_for_move()?;
        let truncated = truncations_seen.is_some_and(|t| t != truncations);
        truncations_seen = Some(truncations);
        if copier.copy_pass(&files, taken, truncated)? < MOVE_LOCKED_PASS_BYTES {
            break;
        }
    }
    if cancel.load(Ordering::SeqCst) {
        return Ok(None);
    }
    p.finish_move(copier, dest.clone(), truncations_seen.unwrap_or(0))
        .map(Some)
}

/// Bytes of the regular files directly in `dir` (0 when it cannot be listed).
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .filter(std::fs::Metadata::is_file)
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Removes `dir` and everything in it; a missing directory is fine.
fn remove_partition_dir(dir: &Path) -> Result<(), LogError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(LogError::Io {
            op: "delete partition directory",
            path: dir.to_path_buf(),
            source: e,
        }),
    }
}

impl ReplicaManager {
    /// A replica manager following `metadata`: it opens (recovering) the log of every
    /// partition of the current image, then opens, reconfigures and closes partitions
    /// as each metadata change is applied (`MetadataListener`). Directories named
    /// `*-delete` (renamed by a delete this broker did not finish removing) are never
    /// opened: they are queued for [`ReplicaManager::remove_deleted_dirs`].
    ///
    /// Errors: `ListenerError` naming the first partition whose log cannot be opened
    /// (an unreadable log dir stops start-up: serving with a partition missing would
    /// answer UNKNOWN_TOPIC_OR_PARTITION for data that exists). Existing data is never
    /// removed on that path.
    pub fn open(
        broker: Arc<BrokerConfig>,
        metadata: &Metadata,
        purgatory: Arc<Purgatory>,
    ) -> Result<Arc<ReplicaManager>, ListenerError> {
        let (isr_changes, rx) = mpsc::channel(ISR_CHANGE_QUEUE);
        let metadata_dir = broker.metadata_dir().to_path_buf();
        // Directories a stopped broker renamed for deletion and did not remove, in every
        // log dir: never partitions, removed by the first `remove_deleted_dirs`. A log dir
        // that cannot be listed is reported by DescribeLogDirs; the leftovers wait for the
        // next start.
        // Moves a stop interrupted: committed ones are finished, the others' copies go.
        let mut deleted_dirs = relocate::resolve_at_start(&broker.log_dirs).map_err(|e| {
            ListenerError::new("cannot resolve interrupted partition moves".to_string(), e)
        })?;
        for dir in &broker.log_dirs {
            match crate::log::delete::list_delete_dirs(dir) {
                Ok(found) => deleted_dirs.extend(found),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot look for deleted partition directories")
                }
            }
        }
        let offline_dir_notify = Arc::new(tokio::sync::Notify::new());
        let rm = Arc::new(ReplicaManager {
            log_dirs: broker
                .log_dirs
                .iter()
                .map(|d| {
                    Arc::new(LogDir {
                        offline_notify: Some(offline_dir_notify.clone()),
                        ..LogDir::new(d.clone())
                    })
                })
                .collect(),
            metadata_dir: metadata_dir.clone(),
            broker,
            partitions: RwLock::new(HashMap::new()),
            purgatory,
            created_dirs: Mutex::new(Vec::new()),
            isr_changes,
            isr_changes_rx: Mutex::new(Some(rx)),
            unopened_high_watermarks: Mutex::new(checkpoint::read_high_watermarks(&metadata_dir)),
            high_watermark_changes: Arc::default(),
            checkpoint_write: Mutex::new(None),
            deleted_dirs: Mutex::new(deleted_dirs),
            moves: Mutex::new(HashMap::new()),
            offline_dir_notify,
        });
        metadata.register(rm.clone())?;
        Ok(rm)
    }

    /// Opens (creating) the logs of partitions `from..meta.partitions` of a topic that
    /// this broker is a replica of (its id in the partition's `replicas`) and adds them
    /// to the map; the others are not hosted here. Directories it creates are pushed to
    /// `created`. On error
    /// the partitions it opened stay open: the caller undoes (see [`Self::undo_open`]).
    fn open_partitions(
        &self,
        layers: DynamicLayers<'_>,
        meta: &TopicMeta,
        from: i32,
        created: &mut Vec<PathBuf>,
        counts: &mut DirCounts,
    ) -> Result<(), LogError> {
        for index in from..meta.partitions {
            self.open_partition(layers, meta, index, created, counts)?;
        }
        Ok(())
    }

    /// Opens (creating) the log of partition `index` of a topic if this broker is one of
    /// its replicas, as [`Self::open_partitions`] does for a range.
    fn open_partition(
        &self,
        layers: DynamicLayers<'_>,
        meta: &TopicMeta,
        index: i32,
        created: &mut Vec<PathBuf>,
        counts: &mut DirCounts,
    ) -> Result<(), LogError> {
        let Some(state) = meta
            .partition(index)
            .filter(|s| s.replicas.contains(&self.broker.node_id))
        else {
            return Ok(());
        };
        let (log_config, settings) = resolve(&self.broker, layers, &meta.configs);
        let (log_dir, dir) = self.place(&meta.name, index, counts)?;
        if !dir.exists() {
            // Pushed before opening: a log that fails half way leaves its directory.
            created.push(dir.clone());
        }
        match crate::log::topic_id::claim(&dir, meta.id)? {
            Claim::Ours => {}
            Claim::Adopted => {
                tracing::info!(topic = %meta.name, partition = index, topic_id = %meta.id, "partition directory from an earlier version: partition.metadata written")
            }
            Claim::StrayRemoved {
                stray_topic_id,
                renamed,
            } => {
                tracing::warn!(topic = %meta.name, partition = index, topic_id = %meta.id, %stray_topic_id, "removed a stray partition directory of a deleted topic of the same name (this broker missed the delete)");
                created.push(dir.clone());
                self.deleted_dirs
                    .lock()
                    .expect("deleted dirs lock poisoned")
                    .push(renamed);
            }
        }
        let log = PartitionLog::open(&dir, log_config, now_ms())?;
        let checkpointed_high_watermark = self
            .unopened_high_watermarks
            .lock()
            .expect("high watermark checkpoint lock poisoned")
            .remove(&(meta.name.clone(), index));
        let p = Arc::new(
            Partition::new_replica(
                meta.name.clone(),
                index,
                self.broker.node_id,
                state,
                settings,
                log,
                checkpointed_high_watermark,
                Some(self.isr_changes.clone()),
            )
            .in_log_dir(log_dir)
            .counting_high_watermark_changes_in(self.high_watermark_changes.clone()),
        );
        self.write().insert((meta.name.clone(), index), p);
        roles_changed();
        self.partition_map_changed();
        Ok(())
    }

    /// Stops hosting partition `index` of `meta` (a reassignment moved it away): its role
    /// follows the new state first, so a produce waiting on it as leader answers
    /// NOT_LEADER_OR_FOLLOWER and the client goes to the new leader; then it leaves the
    /// map (followers stop fetching it at their next round) and is deleted
    /// ([`ReplicaManager::delete_partition`]).
    ///
    /// Errors: [`LogError::Io`]: the directory cannot be renamed.
    fn leave_partition(&self, meta: &TopicMeta, index: i32) -> Result<(), LogError> {
        if let (Some(p), Some(state)) = (self.partition(&meta.name, index), meta.partition(index)) {
            p.apply_state(state);
        }
        tracing::info!(topic = %meta.name, partition = index, "no longer a replica: partition closed and its directory deleted");
        self.delete_partition(&meta.name, index)
    }

    /// The one way a partition is deleted here (DeleteTopics, a topic deleted through the
    /// metadata on any broker, a reassignment moving the replica away), Kafka's
    /// `ReplicaManager.stopPartitions` with delete → `LogManager.asyncDelete`: the
    /// partition leaves the map (new requests find no partition), then is retired
    /// ([`Partition::retire`]: in-flight requests holding it get
    /// NOT_LEADER_OR_FOLLOWER, its directory is renamed to
    /// `<topic>-<index>.<uuid>-delete`), so a topic of the same name created next opens a
    /// fresh directory no old writer can touch. The renamed directory is removed by
    /// [`ReplicaManager::remove_deleted_dirs`]. A directory without a hosted partition
    /// (not a replica here) is renamed the same way if it exists.
    ///
    /// Errors: [`LogError::Io`]: the rename failed (the partition is gone from the map
    /// all the same).
    fn delete_partition(&self, topic: &str, index: i32) -> Result<(), LogError> {
        let removed = self.write().remove(&(topic.to_string(), index));
        roles_changed();
        self.partition_map_changed();
        let renamed = match removed {
            Some(p) => vec![p.retire()?],
            None => self
                .log_dirs
                .iter()
                .map(|d| {
                    crate::log::delete::rename_for_delete(&partition_dir(&d.path, topic, index))
                })
                .collect::<Result<Vec<_>, _>>()?,
        };
        self.deleted_dirs
            .lock()
            .expect("deleted dirs lock poisoned")
            .extend(renamed.into_iter().flatten());
        Ok(())
    }

    /// Where partition `index` of `topic` lives: the one log dir already holding its
    /// directory `<topic>-<index>` (looked for in every log dir, so a restart finds it
    /// wherever it was placed or moved), else the log dir with the fewest hosted
    /// partitions (Kafka's `LogManager.nextLogDirs` rule), ties going to the earlier in
    /// `log.dirs`. Returns the log dir and the partition directory in it. `counts` holds
    /// the partitions per log dir for the change under way, counted at most once
    /// ([`DirCounts`]), and is kept up to date with the choice.
    ///
    /// Offline log dirs are never chosen for a new partition.
    ///
    /// Errors: [`LogError::Io`] ("Duplicate log directories found", Kafka's start-up
    /// refusal) when two log dirs hold the directory: which one is current cannot be
    /// told, so nothing is opened and the operator removes the stale one;
    /// [`LogError::LogDirOffline`] when a new partition has no online log dir to go to.
    fn place(
        &self,
        topic: &str,
        index: i32,
        counts: &mut DirCounts,
    ) -> Result<(Arc<LogDir>, PathBuf), LogError> {
        let found: Vec<usize> = (0..self.log_dirs.len())
            .filter(|i| partition_dir(&self.log_dirs[*i].path, topic, index).is_dir())
            .collect();
        let chosen = match found.as_slice() {
            [one] => *one,
            [] => {
                let online: Vec<usize> = (0..self.log_dirs.len())
                    .filter(|i| !self.log_dirs[*i].is_offline())
                    .collect();
                match online.as_slice() {
                    [] => {
                        return Err(LogError::LogDirOffline {
                            path: self.log_dirs[0].path.clone(),
                        })
                    }
                    [only] => *only,
                    several => {
                        let counts = counts.get_or_insert_with(|| self.partitions_per_log_dir());
                        // The first of the least loaded: ties go to the earlier in `log.dirs`.
                        let mut best = several[0];
                        for i in several {
                            if counts[*i] < counts[best] {
                                best = *i;
                            }
                        }
                        best
                    }
                }
            }
            [first, second, ..] => {
                let (a, b) = (
                    partition_dir(&self.log_dirs[*first].path, topic, index),
                    partition_dir(&self.log_dirs[*second].path, topic, index),
                );
                return Err(LogError::Io {
                    op: "find partition directory",
                    path: a.clone(),
                    source: std::io::Error::other(format!(
                        "Duplicate log directories found: {} and {} (one is stale: remove it)",
                        a.display(),
                        b.display()
                    )),
                });
            }
        };
        if let Some(counts) = counts {
            counts[chosen] += 1;
        }
        let chosen = self.log_dirs[chosen].clone();
        let dir = partition_dir(&chosen.path, topic, index);
        Ok((chosen, dir))
    }

    /// How many hosted partitions each of `log.dirs` holds (by index), counted once for
    /// [`DirCounts`].
    fn partitions_per_log_dir(&self) -> Vec<usize> {
        let mut counts = vec![0; self.log_dirs.len()];
        for p in self.read().values() {
            let dir = p.log_dir();
            if let Some(i) = self.log_dirs.iter().position(|d| Arc::ptr_eq(d, &dir)) {
                counts[i] += 1;
            }
        }
        counts
    }

    /// Removes the directories of deleted partitions ([`ReplicaManager::delete_partition`])
    /// and the `-delete` directories found at start-up; `broker.rs` calls it every
    /// [`DELETED_DIR_REMOVAL_INTERVAL_MS`] on a blocking thread (Kafka's
    /// `LogManager.deleteLogs`). One that cannot be removed is logged and tried again next
    /// time. Returns how many were removed.
    pub fn remove_deleted_dirs(&self) -> usize {
        let dirs = std::mem::take(
            &mut *self
                .deleted_dirs
                .lock()
                .expect("deleted dirs lock poisoned"),
        );
        let mut failed = Vec::new();
        let mut removed = 0;
        for dir in dirs {
            match crate::log::delete::remove(&dir) {
                Ok(()) => {
                    tracing::info!(dir = %dir.display(), "removed a deleted partition directory");
                    removed += 1;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot remove a deleted partition directory yet");
                    failed.push(dir);
                }
            }
        }
        self.deleted_dirs
            .lock()
            .expect("deleted dirs lock poisoned")
            .extend(failed);
        removed
    }

    /// Undoes the `Open` changes of a delta: closes those partitions and removes the
    /// directories `created` lists (never one that existed before: at start-up that
    /// would be data).
    fn undo_open(&self, changes: &[TopicChange<'_>], created: Vec<PathBuf>) {
        {
            let mut map = self.write();
            for change in changes {
                match change {
                    TopicChange::Open { meta, from } => {
                        for index in *from..meta.partitions {
                            map.remove(&(meta.name.clone(), index));
                        }
                    }
                    TopicChange::Join { meta, index } => {
                        map.remove(&(meta.name.clone(), *index));
                    }
                    TopicChange::Leadership { .. }
                    | TopicChange::Leave { .. }
                    | TopicChange::Reconfigure(_)
                    | TopicChange::Close { .. } => {}
                }
            }
        }
        roles_changed();
        self.partition_map_changed();
        for dir in created {
            if let Err(e) = remove_partition_dir(&dir) {
                tracing::error!(error = %e, "cannot remove a partition directory of a topic change not made");
            }
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<PartitionKey, Arc<Partition>>> {
        self.partitions.read().expect("partition map lock poisoned")
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<PartitionKey, Arc<Partition>>> {
        self.partitions
            .write()
            .expect("partition map lock poisoned")
    }

    /// The partition, if hosted here.
    pub fn partition(&self, topic: &str, index: i32) -> Option<Arc<Partition>> {
        self.read()
            .get(&(topic, index) as &dyn PartitionKeyRef)
            .cloned()
    }

    /// The high watermark watches of every hosted partition of `topic` (see
    /// [`Partition::watch_high_watermark`]): what a reader of the whole topic parks on.
    pub fn watch_high_watermarks(&self, topic: &str) -> Vec<watch::Receiver<i64>> {
        self.read()
            .values()
            .filter(|p| p.topic == topic)
            .map(|p| p.watch_high_watermark())
            .collect()
    }

    /// Applies a topic's (changed) configs to its hosted partitions: recomputes the log
    /// config and produce settings and swaps them in. Batches already written stay as
    /// they are; later appends, rolls, retention runs and flushes follow the new values.
    ///
    /// Errors: the first [`LogError::InvalidConfig`] (validated configs never produce one;
    /// the partitions before it are already reconfigured).
    fn reconfigure_topic(
        &self,
        layers: DynamicLayers<'_>,
        meta: &TopicMeta,
    ) -> Result<(), LogError> {
        let (log_config, settings) = resolve(&self.broker, layers, &meta.configs);
        let parts: Vec<Arc<Partition>> = self
            .read()
            .values()
            .filter(|p| p.topic == meta.name)
            .cloned()
            .collect();
        for p in parts {
            p.set_log_config(log_config.clone())?;
            *p.settings
                .write()
                .expect("partition settings lock poisoned") = settings;
        }
        Ok(())
    }

    /// Deletes partitions `0..partitions` of `topic` ([`ReplicaManager::delete_partition`]).
    ///
    /// Errors: the first directory that cannot be renamed (the others are still tried).
    fn delete_topic(&self, topic: &str, partitions: i32) -> Result<(), LogError> {
        let mut first_error = None;
        for index in 0..partitions {
            if let Err(e) = self.delete_partition(topic, index) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Appends validated batches to one partition as its leader
    /// ([`Partition::append_as_leader`]): the high watermark advances and wakes what
    /// waits on it.
    ///
    /// Errors: [`LogError`] from the log (sequence errors of idempotent producers, I/O).
    pub fn append(
        &self,
        partition: &Partition,
        batches: Vec<ValidatedBatch>,
    ) -> Result<AppendInfo, LogError> {
        partition.append_as_leader(batches, now_ms())
    }

    /// Writes one transaction marker to `topic`-`partition` and waits for it to be
    /// replicated (WriteTxnMarkers per partition, KIP-98; for the transaction coordinator
    /// too, on partitions this broker leads): [`ReplicaManager::append_txn_marker`], then
    /// [`ReplicaManager::wait_txn_marker`] for at most [`TXN_MARKER_TIMEOUT_MS`] (Kafka
    /// appends markers with `acks=-1`).
    ///
    /// Errors: those of the two steps (Kafka codes, as WriteTxnMarkers answers per
    /// partition).
    pub async fn write_txn_marker(
        &self,
        topic: &str,
        partition: i32,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
    ) -> Result<(), kafka_protocol::ResponseError> {
        let appended = self.append_txn_marker(
            topic,
            partition,
            producer_id,
            producer_epoch,
            commit,
            coordinator_epoch,
        )?;
        self.wait_txn_marker(topic, &appended, TXN_MARKER_TIMEOUT_MS)
            .await
    }

    /// The append half of [`ReplicaManager::write_txn_marker`]: the partition must be
    /// hosted and led here and its ISR at least `min.insync.replicas`; then
    /// [`Partition::append_txn_marker`] with the wall clock as timestamp. Returns what
    /// [`ReplicaManager::wait_txn_marker`] waits on (so a caller writing many markers
    /// appends them all, then waits on them under one deadline).
    ///
    /// Errors: UNKNOWN_TOPIC_OR_PARTITION (3) when not hosted; NOT_LEADER_OR_FOLLOWER (6)
    /// when not led here; NOT_ENOUGH_REPLICAS (19) when the ISR is too small (nothing
    /// written); INVALID_PRODUCER_EPOCH (47); TRANSACTION_COORDINATOR_FENCED (52);
    /// KAFKA_STORAGE_ERROR (56).
    pub fn append_txn_marker(
        &self,
        topic: &str,
        partition: i32,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
    ) -> Result<AppendedMarker, kafka_protocol::ResponseError> {
        use kafka_protocol::ResponseError;
        let Some(p) = self.partition(topic, partition) else {
            return Err(ResponseError::UnknownTopicOrPartition);
        };
        if !p.is_leader() {
            return Err(ResponseError::NotLeaderOrFollower);
        }
        if p.isr_len() < p.settings().min_insync_replicas {
            return Err(ResponseError::NotEnoughReplicas);
        }
        let info = p
            .append_txn_marker(
                producer_id,
                producer_epoch,
                commit,
                coordinator_epoch,
                now_ms(),
            )
            .map_err(|e| {
                if matches!(e, LogError::Io { .. } | LogError::Corrupt { .. }) {
                    tracing::error!(%topic, partition, error = %e, "transaction marker append failed");
                }
                e.kafka_error()
            })?;
        Ok(AppendedMarker {
            partition: p,
            offset: info.last_offset,
        })
    }

    /// The wait half of [`ReplicaManager::write_txn_marker`]: until the high watermark
    /// passes the marker, at most `timeout_ms`.
    ///
    /// Errors: NOT_ENOUGH_REPLICAS_AFTER_APPEND (20), NOT_LEADER_OR_FOLLOWER (6),
    /// REQUEST_TIMED_OUT (7), as [`ReplicationWait::refusal`] maps them.
    pub async fn wait_txn_marker(
        &self,
        topic: &str,
        appended: &AppendedMarker,
        timeout_ms: u64,
    ) -> Result<(), kafka_protocol::ResponseError> {
        match appended
            .partition
            .wait_for_high_watermark(appended.offset, timeout_ms)
            .await
            .refusal()
        {
            None => Ok(()),
            Some((error, why)) => {
                tracing::warn!(%topic, partition = appended.partition.index, offset = appended.offset, %why, "transaction marker not replicated");
                Err(error)
            }
        }
    }

    /// Forgets, on every hosted partition, the idempotent producers idle for
    /// `producer.id.expiration.ms` on the broker's clock ([`PartitionLog::expire_producers`];
    /// the background task in `broker.rs` calls it every
    /// `producer.id.expiration.check.interval.ms`). Returns how many entries were dropped.
    pub fn expire_producers(&self) -> usize {
        let parts: Vec<Arc<Partition>> = self.read().values().cloned().collect();
        let now = now_ms();
        let expiration_ms = self.broker.producer_id_expiration_ms;
        parts
            .iter()
            .map(|p| p.log_mut().expire_producers(now, expiration_ms))
            .sum()
    }

    /// Runs retention, then compaction, on every partition once (the background task in
    /// `broker.rs` calls it every `log.retention.check.interval.ms`, on a blocking thread):
    /// time/size retention where `cleanup.policy` has `delete`, compaction where it has
    /// `compact` (each logs a line when it removed something). Compaction holds the
    /// partition's lock only to plan and to install: its expensive step
    /// ([`crate::log::CompactionPlan::prepare`], throttled by
    /// `log.cleaner.io.max.bytes.per.second`) runs with no lock, so produce and fetch on a
    /// compacting partition go on. A failure is logged and leaves that partition as it
    /// was; the others go on. Returns the number of segments deleted by retention.
    pub fn apply_retention(&self) -> usize {
        let parts: Vec<Arc<Partition>> = self.read().values().cloned().collect();
        let now = now_ms();
        let mut throttle = CleanerThrottle::new(self.broker.cleaner_io_max_bytes_per_second);
        let mut deleted = 0;
        for p in parts {
            match p.apply_retention(now) {
                Ok(n) => {
                    if n > 0 {
                        tracing::info!(topic = %p.topic, partition = p.index, segments = n, "retention deleted segments");
                    }
                    deleted += n;
                }
                // Deleted since the snapshot of the map: nothing to do.
                Err(LogError::Deleted) => continue,
                Err(e) => {
                    tracing::warn!(topic = %p.topic, partition = p.index, error = %e, "retention failed")
                }
            }
            // A partition moving between log dirs is compacted after its move.
            let Ok(_maintenance) = p.maintenance.try_lock() else {
                continue;
            };
            let Some(plan) = p.plan_compaction(now).filter(CompactionPlan::is_due) else {
                continue;
            };
            tracing::info!(
                topic = %p.topic,
                partition = p.index,
                dirty_ratio = plan.stats().dirty_ratio,
                bytes = plan.stats().bytes_before,
                "compacting partition"
            );
            let installed = plan.prepare(&mut throttle).and_then(|prepared| {
                let hosted = self
                    .partition(&p.topic, p.index)
                    .is_some_and(|q| Arc::ptr_eq(&q, &p));
                if !hosted {
                    // Deleted (or recreated) meanwhile; dropping the copies removes them.
                    return Ok(None);
                }
                p.install_compaction(prepared).map(Some)
            });
            match installed {
                Ok(Some(stats)) if stats.cleaned => tracing::info!(
                    topic = %p.topic,
                    partition = p.index,
                    dirty_ratio = stats.dirty_ratio,
                    records_removed = stats.records_removed,
                    bytes_removed = stats.bytes_removed(),
                    segments_rewritten = stats.segments_rewritten,
                    segments_deleted = stats.segments_deleted,
                    first_dirty_offset = stats.first_dirty_offset,
                    "compacted partition"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!(
                    topic = %p.topic,
                    partition = p.index,
                    error = %e,
                    "compaction aborted; no data lost (segments already swapped are complete)"
                ),
            }
        }
        deleted
    }

    /// Flushes every partition (clean shutdown).
    pub fn flush_all(&self) {
        let parts: Vec<Arc<Partition>> = self.read().values().cloned().collect();
        for p in parts {
            if let Err(e) = p.flush() {
                tracing::warn!(topic = %p.topic, partition = p.index, error = %e, "flush failed");
            }
        }
    }

    /// Writes the high watermark of every hosted partition (and the entries of partitions
    /// not opened since start-up) to `replication-offset-checkpoint` in the log dir,
    /// atomically (Kafka's `ReplicaManager.checkpointHighWatermarks`): what a restarted
    /// replica starts from ([`Partition`]'s `new_replica`). Called every
    /// `replica.high.watermark.checkpoint.interval.ms` and at clean shutdown; writes
    /// nothing when no high watermark moved and no partition came or went since the last
    /// write (at 100,000 partitions each write copied and formatted every entry). Blocking
    /// file I/O (fsync): call it off the async workers.
    ///
    /// Errors: `LogError::Io` (the previous checkpoint stays; the next call retries).
    pub fn checkpoint_high_watermarks(&self) -> Result<(), LogError> {
        let mut written = self
            .checkpoint_write
            .lock()
            .expect("high watermark checkpoint write lock poisoned");
        // Read before the values: a change while they are read shows at the next call.
        let changes = self.high_watermark_changes.load(Ordering::SeqCst);
        if *written == Some(changes) {
            return Ok(());
        }
        let unopened = self
            .unopened_high_watermarks
            .lock()
            .expect("high watermark checkpoint lock poisoned")
            .clone();
        let partitions = self.partitions();
        let mut high_watermarks: BTreeMap<(&str, i32), i64> = unopened
            .iter()
            .map(|((topic, index), hw)| ((topic.as_str(), *index), *hw))
            .collect();
        for p in &partitions {
            high_watermarks.insert((p.topic.as_str(), p.index), p.high_watermark());
        }
        checkpoint::write_high_watermark_entries(
            &self.metadata_dir,
            high_watermarks
                .iter()
                .map(|((topic, index), hw)| (*topic, *index, *hw)),
        )?;
        *written = Some(changes);
        Ok(())
    }

    /// Notes that a partition entered or left the map (after the change): the next
    /// checkpoint is written even if no high watermark moved.
    fn partition_map_changed(&self) {
        self.high_watermark_changes.fetch_add(1, Ordering::SeqCst);
    }

    /// The ISR changes leaders ask for, for the replication task (`replication.rs`);
    /// `None` once taken.
    pub fn take_isr_changes(&self) -> Option<mpsc::Receiver<IsrChange>> {
        self.isr_changes_rx
            .lock()
            .expect("isr changes lock poisoned")
            .take()
    }

    /// The purgatory parked fetches wait in.
    pub fn purgatory(&self) -> &Purgatory {
        &self.purgatory
    }

    /// The broker configuration.
    pub fn broker_config(&self) -> &BrokerConfig {
        &self.broker
    }

    /// Every hosted partition (a snapshot of the map, in no order): `/metrics` reads each
    /// one's [`Partition::log_gauges`].
    pub fn partitions(&self) -> Vec<Arc<Partition>> {
        self.read().values().cloned().collect()
    }

    /// Woken (one stored permit) whenever one of `log.dirs` goes offline: the replication
    /// task waits on it to report [`ReplicaManager::offline_partitions`] to the controller.
    pub fn offline_dir_notify(&self) -> Arc<tokio::sync::Notify> {
        self.offline_dir_notify.clone()
    }

    /// The hosted partitions (topic, index) whose log dir is offline, sorted.
    pub fn offline_partitions(&self) -> Vec<(String, i32)> {
        let mut out: Vec<(String, i32)> = self
            .read()
            .values()
            .filter(|p| p.is_offline())
            .map(|p| (p.topic.clone(), p.index))
            .collect();
        out.sort_unstable();
        out
    }

    /// Every log dir, in `log.dirs` order, with the size and lag of each partition hosted
    /// in it, and the size and free space of its file system (DescribeLogDirs, KIP-113 /
    /// KIP-827). A directory that cannot be listed gives its error and no partitions.
    pub fn describe_log_dirs(&self) -> Vec<LogDirDescription> {
        let partitions = self.partitions();
        let mut out: Vec<LogDirDescription> = self
            .log_dirs
            .iter()
            .map(|d| self.describe_log_dir(d, &partitions))
            .collect();
        let moves = self.moves.lock().expect("moves lock poisoned");
        for ((topic, partition), m) in moves.iter() {
            let Some(i) = self.log_dirs.iter().position(|d| Arc::ptr_eq(d, &m.dest)) else {
                continue;
            };
            if out[i].error.is_some() {
                continue;
            }
            // Kafka's `max(current LEO - future LEO, 0)`: how far the copy is behind the
            // partition it is made of (its log start when nothing is copied yet).
            let offset_lag = partitions
                .iter()
                .find(|p| p.topic == *topic && p.index == *partition)
                .map_or(0, |p| {
                    let o = p.offsets();
                    let copied = crate::log::relocate::copied_log_end(&m.future)
                        .unwrap_or(o.log_start_offset);
                    (o.log_end_offset - copied).max(0)
                });
            out[i].partitions.push(HostedPartitionSize {
                topic: topic.clone(),
                partition: *partition,
                size_bytes: dir_bytes(&m.future),
                offset_lag,
                is_future: true,
            });
        }
        out
    }

    /// The log dir among `log.dirs` that `path` names (compared as absolute paths, as
    /// DescribeLogDirs reports them).
    fn log_dir_named(&self, path: &str) -> Option<Arc<LogDir>> {
        let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let wanted = abs(Path::new(path));
        self.log_dirs
            .iter()
            .find(|d| abs(&d.path) == wanted)
            .cloned()
    }

    /// Moves partition `index` of `topic` to log dir `dest` while it keeps serving
    /// (AlterReplicaLogDirs, KIP-113; Kafka's `ReplicaManager.alterReplicaLogDirs` and
    /// `ReplicaAlterLogDirsThread`). Answers at once: the copy runs on a thread of its own
    /// ([`relocate::Copier`]: passes with no lock, then a last one with the partition's
    /// writes stopped, then the swap, [`Partition::finish_move`]), which DescribeLogDirs
    /// shows as a future replica in `dest` until it is done. A partition already in `dest`,
    /// or already moving there, is left as it is. A failed move is logged and leaves the
    /// partition where it was.
    ///
    /// Errors (checked in this order): [`MoveRefusal::LogDirNotFound`],
    /// [`MoveRefusal::StorageError`] (the destination is offline),
    /// [`MoveRefusal::UnknownPartition`], [`MoveRefusal::StorageError`] (the partition's
    /// own dir is offline, or the copy cannot start), [`MoveRefusal::MoveInProgress`]
    /// (moving to another directory; Kafka would replace that move).
    pub fn alter_replica_log_dir(
        self: &Arc<Self>,
        topic: &str,
        index: i32,
        dest: &str,
    ) -> Result<(), MoveRefusal> {
        let dest = self
            .log_dir_named(dest)
            .ok_or(MoveRefusal::LogDirNotFound)?;
        if dest.is_offline() {
            return Err(MoveRefusal::StorageError);
        }
        let p = self
            .partition(topic, index)
            .ok_or(MoveRefusal::UnknownPartition)?;
        if p.is_offline() {
            return Err(MoveRefusal::StorageError);
        }
        let key = (topic.to_string(), index);
        let mut moves = self.moves.lock().expect("moves lock poisoned");
        if let Some(m) = moves.get(&key) {
            return if Arc::ptr_eq(&m.dest, &dest) {
                Ok(())
            } else {
                Err(MoveRefusal::MoveInProgress)
            };
        }
        if Arc::ptr_eq(&p.log_dir(), &dest) {
            return Ok(());
        }
        let source = p.log().dir().to_path_buf();
        let copier = relocate::Copier::new(&source, &dest.path).map_err(|e| {
            tracing::warn!(%topic, partition = index, error = %e, "cannot start a partition move");
            MoveRefusal::StorageError
        })?;
        let cancel = Arc::new(AtomicBool::new(false));
        let future = copier.future_dir().to_path_buf();
        let rm = self.clone();
        let (d, c) = (dest.clone(), cancel.clone());
        let thread = std::thread::Builder::new()
            .name(format!("move {topic}-{index}"))
            .spawn(move || rm.run_move(&p, copier, d, &c))
            .map_err(|e| {
                tracing::warn!(%topic, partition = index, error = %e, "cannot start a partition move thread");
                MoveRefusal::StorageError
            })?;
        tracing::info!(%topic, partition = index, from = %source.display(), to = %dest.path.display(), "moving partition to another log dir");
        moves.insert(
            key,
            Move {
                dest,
                future,
                cancel,
                thread: Some(thread),
            },
        );
        Ok(())
    }

    /// The body of a move's thread (see [`ReplicaManager::alter_replica_log_dir`]).
    fn run_move(
        &self,
        p: &Arc<Partition>,
        mut copier: relocate::Copier,
        dest: Arc<LogDir>,
        cancel: &AtomicBool,
    ) {
        let _maintenance = p.maintenance.lock().expect("maintenance lock poisoned");
        let result = copy_and_swap(p, &mut copier, &dest, cancel);
        let key = (p.topic.clone(), p.index);
        match result {
            Ok(Some(renamed)) => {
                tracing::info!(topic = %p.topic, partition = p.index, to = %dest.path.display(), "partition moved to another log dir");
                self.deleted_dirs
                    .lock()
                    .expect("deleted dirs lock poisoned")
                    .push(renamed);
            }
            Ok(None) => {
                tracing::info!(topic = %p.topic, partition = p.index, "partition move given up (shutdown)");
                copier.abort();
            }
            Err(LogError::Deleted) => copier.abort(),
            Err(e) => {
                tracing::warn!(topic = %p.topic, partition = p.index, error = %e, "partition move failed; the partition stays where it was");
                copier.abort();
            }
        }
        self.moves.lock().expect("moves lock poisoned").remove(&key);
    }

    /// Gives up every move in progress and waits for their threads (shutdown, before the
    /// logs are flushed): each removes its copy; a move past its commit finishes.
    pub fn stop_moves(&self) {
        let threads: Vec<std::thread::JoinHandle<()>> = {
            let mut moves = self.moves.lock().expect("moves lock poisoned");
            moves
                .values_mut()
                .filter_map(|m| {
                    m.cancel.store(true, Ordering::SeqCst);
                    m.thread.take()
                })
                .collect()
        };
        for t in threads {
            if t.join().is_err() {
                tracing::error!("a partition move thread panicked");
            }
        }
    }

    fn describe_log_dir(
        &self,
        dir: &Arc<LogDir>,
        partitions: &[Arc<Partition>],
    ) -> LogDirDescription {
        let path = std::path::absolute(&dir.path).unwrap_or_else(|_| dir.path.clone());
        let error = if dir.is_offline() {
            Some(std::io::Error::other("offline after an I/O error"))
        } else {
            std::fs::read_dir(&dir.path).err()
        };
        let (total_bytes, usable_bytes) = match rustix::fs::statvfs(&dir.path) {
            Ok(s) => {
                let bytes = |blocks: u64| {
                    i64::try_from(blocks.saturating_mul(s.f_frsize)).unwrap_or(i64::MAX)
                };
                (bytes(s.f_blocks), bytes(s.f_bavail))
            }
            Err(_) => (-1, -1),
        };
        let partitions = if error.is_some() {
            Vec::new()
        } else {
            partitions
                .iter()
                .filter(|p| Arc::ptr_eq(&p.log_dir(), dir))
                .map(|p| HostedPartitionSize {
                    topic: p.topic.clone(),
                    partition: p.index,
                    size_bytes: p.log_gauges().size_bytes,
                    offset_lag: p.offset_lag(),
                    is_future: false,
                })
                .collect()
        };
        LogDirDescription {
            path,
            error,
            total_bytes,
            usable_bytes,
            partitions,
        }
    }
}

impl Partition {
    /// Log start offset, log end offset and size of the log now, for `/metrics`.
    pub fn log_gauges(&self) -> crate::metrics::PartitionGauges {
        let log = self.log();
        crate::metrics::PartitionGauges {
            log_start_offset: log.log_start_offset(),
            log_end_offset: log.log_end_offset(),
            size_bytes: log.size_bytes(),
        }
    }
}

/// The replica manager follows the metadata (Kafka's `BrokerMetadataPublisher` driving
/// its `ReplicaManager`): a delta's new topics and partitions are opened before it is
/// durable (so a log that cannot be created refuses the change), config changes and
/// deletions are acted on once it is.
impl MetadataListener for ReplicaManager {
    fn prepare(&self, delta: &MetadataDelta) -> Result<(), ListenerError> {
        let changes = topic_changes(delta)?;
        let layers = delta.after().dynamic_layers();
        let mut created = Vec::new();
        let mut counts: DirCounts = None;
        for change in &changes {
            let (meta, opened) = match change {
                TopicChange::Open { meta, from } => (
                    meta,
                    self.open_partitions(layers, meta, *from, &mut created, &mut counts),
                ),
                TopicChange::Join { meta, index } => (
                    meta,
                    self.open_partition(layers, meta, *index, &mut created, &mut counts),
                ),
                TopicChange::Leadership { .. }
                | TopicChange::Leave { .. }
                | TopicChange::Reconfigure(_)
                | TopicChange::Close { .. } => continue,
            };
            if let Err(e) = opened {
                self.undo_open(&changes, created);
                return Err(ListenerError::new(
                    format!("cannot create the partition logs of {}", meta.name),
                    e,
                ));
            }
        }
        *self
            .created_dirs
            .lock()
            .expect("created dirs lock poisoned") = created;
        Ok(())
    }

    fn publish(&self, delta: &MetadataDelta) -> Result<(), ListenerError> {
        self.created_dirs
            .lock()
            .expect("created dirs lock poisoned")
            .clear();
        let mut first_error = None;
        for change in topic_changes(delta)? {
            let result = match change {
                TopicChange::Open { .. } | TopicChange::Join { .. } => continue,
                TopicChange::Leave { meta, index } => {
                    self.leave_partition(meta, index).map_err(|e| {
                        ListenerError::new(
                            format!("cannot delete partition {}-{index}", meta.name),
                            e,
                        )
                    })
                }
                TopicChange::Leadership { meta, index } => {
                    if let (Some(p), Some(state)) =
                        (self.partition(&meta.name, index), meta.partition(index))
                    {
                        p.apply_state(state);
                    }
                    continue;
                }
                TopicChange::Reconfigure(meta) => {
                    self.reconfigure_topic(delta.after().dynamic_layers(), meta)
                        .map_err(|e| {
                            // Validated configs always resolve to a valid log config: our bug.
                            ListenerError::new(
                                format!("cannot apply the configs of {}", meta.name),
                                e,
                            )
                        })
                }
                TopicChange::Close { name, partitions } => {
                    self.delete_topic(name, partitions).map_err(|e| {
                        ListenerError::new(format!("cannot delete the partitions of {name}"), e)
                    })
                }
            };
            if let Err(e) = result {
                tracing::error!(error = %e, "metadata change not fully applied to the partitions");
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn abort(&self, delta: &MetadataDelta) {
        let created = std::mem::take(
            &mut *self
                .created_dirs
                .lock()
                .expect("created dirs lock poisoned"),
        );
        match topic_changes(delta) {
            Ok(changes) => self.undo_open(&changes, created),
            // `prepare` succeeded on this delta, so this does not happen.
            Err(e) => tracing::error!(error = %e, "cannot undo a metadata change"),
        }
    }
}

#[cfg(test)]
mod lifecycle_tests {
    use super::*;
    use crate::cluster::{MetadataImage, NewTopic};
    use kafka_protocol::ResponseError;

    fn open_in(dir: &Path) -> (Metadata, Result<Arc<ReplicaManager>, ListenerError>) {
        let mut config = BrokerConfig::defaults();
        config.set_single_dir(dir);
        let metadata = Metadata::open(dir, 1).unwrap();
        let rm = ReplicaManager::open(Arc::new(config), &metadata, Arc::new(Purgatory::new(10)));
        (metadata, rm)
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

    fn append(p: &Partition, count: i64) {
        let records: Vec<_> = (0..count)
            .map(|i| crate::log::plain::record(i, 1000 + i, None, None, Default::default()))
            .collect();
        let batch = crate::log::plain::encode(&records).unwrap();
        p.append_as_leader(crate::log::split_batches(batch).unwrap(), 0)
            .unwrap();
    }

    /// A single node (ISR = itself) checkpoints its high watermarks in Kafka's format and,
    /// restarted over its data, exposes everything at once, with the checkpoint, with a
    /// checkpoint behind the log (the rule advances it), and with a corrupt one (warned
    /// and ignored, never a failed start).
    #[test]
    fn a_restarted_single_node_exposes_its_whole_log() {
        let dir = tempfile::tempdir().unwrap();
        let checkpoint = dir.path().join("replication-offset-checkpoint");
        {
            let (m, rm) = open_in(dir.path());
            let rm = rm.unwrap();
            m.create_topic(spec("t", 2)).unwrap();
            append(&rm.partition("t", 0).unwrap(), 3);
            rm.checkpoint_high_watermarks().unwrap();
            assert_eq!(
                std::fs::read_to_string(&checkpoint).unwrap(),
                "0\n2\nt 0 3\nt 1 0\n"
            );
            append(&rm.partition("t", 0).unwrap(), 2);
        }
        for text in [None, Some("0\n1\nt 0 1\n"), Some("garbage")] {
            if let Some(text) = text {
                std::fs::write(&checkpoint, text).unwrap();
            }
            let (_m, rm) = open_in(dir.path());
            let rm = rm.unwrap();
            assert_eq!(
                rm.partition("t", 0).unwrap().high_watermark(),
                5,
                "{text:?}"
            );
        }
    }

    /// The periodic checkpoint writes only when something it holds changed: nothing
    /// moved → no write (the file removed here stays absent); a high watermark moved, a
    /// topic created or deleted → written again with the new entries.
    #[test]
    fn the_checkpoint_is_written_only_when_a_high_watermark_or_the_partitions_changed() {
        let dir = tempfile::tempdir().unwrap();
        let checkpoint = dir.path().join("replication-offset-checkpoint");
        let (m, rm) = open_in(dir.path());
        let rm = rm.unwrap();
        let t = m.create_topic(spec("t", 2)).unwrap();
        rm.checkpoint_high_watermarks().unwrap();
        assert_eq!(
            std::fs::read_to_string(&checkpoint).unwrap(),
            "0\n2\nt 0 0\nt 1 0\n"
        );
        std::fs::remove_file(&checkpoint).unwrap();
        rm.checkpoint_high_watermarks().unwrap();
        assert!(!checkpoint.exists(), "nothing changed: not written again");

        append(&rm.partition("t", 1).unwrap(), 3);
        rm.checkpoint_high_watermarks().unwrap();
        assert_eq!(
            std::fs::read_to_string(&checkpoint).unwrap(),
            "0\n2\nt 0 0\nt 1 3\n"
        );
        std::fs::remove_file(&checkpoint).unwrap();
        rm.checkpoint_high_watermarks().unwrap();
        assert!(!checkpoint.exists());

        // A new partition's high watermark starts at 0, as if unchanged: written all the same.
        m.create_topic(spec("u", 1)).unwrap();
        rm.checkpoint_high_watermarks().unwrap();
        assert_eq!(
            std::fs::read_to_string(&checkpoint).unwrap(),
            "0\n3\nt 0 0\nt 1 3\nu 0 0\n"
        );
        m.delete_topic(t.id).unwrap();
        rm.checkpoint_high_watermarks().unwrap();
        assert_eq!(
            std::fs::read_to_string(&checkpoint).unwrap(),
            "0\n1\nu 0 0\n"
        );
    }

    /// New partitions go to the log dir holding the fewest, counting the partitions
    /// already hosted once per change (not once per partition) and those the same change
    /// placed before: three dirs, a topic of 4 then one of 5 (a dir already holding a
    /// partition's directory keeps it).
    #[test]
    fn new_partitions_fill_the_least_loaded_log_dirs() {
        let root = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = ["a", "b", "c"]
            .iter()
            .map(|d| root.path().join(d))
            .collect();
        let mut config = BrokerConfig::defaults();
        config.log_dirs = dirs.clone();
        std::fs::create_dir_all(&dirs[0]).unwrap();
        let m = Metadata::open(&dirs[0], 1).unwrap();
        let rm = ReplicaManager::open(Arc::new(config), &m, Arc::new(Purgatory::new(10))).unwrap();
        let hosted = |name: &str, partitions: i32| -> Vec<usize> {
            (0..partitions)
                .map(|i| {
                    dirs.iter()
                        .position(|d| d.join(format!("{name}-{i}")).is_dir())
                        .unwrap()
                })
                .collect()
        };
        m.create_topic(spec("x", 4)).unwrap();
        assert_eq!(hosted("x", 4), [0, 1, 2, 0]);
        // Counts now 2, 1, 1; a stale directory of y-1 already in c stays there.
        std::fs::create_dir_all(dirs[2].join("y-1")).unwrap();
        m.create_topic(spec("y", 5)).unwrap();
        assert_eq!(hosted("y", 5), [1, 2, 0, 1, 2]);
        assert_eq!(rm.partitions_per_log_dir(), [3, 3, 3]);
    }

    /// Two log dirs: a partition moved while its move waits (the maintenance lock held
    /// here) shows as a future replica in the destination, then, moved, is read in full
    /// from the new dir; an unknown dir and a partition not hosted are refused.
    #[test]
    fn a_moving_partition_shows_as_a_future_replica_then_serves_from_its_new_dir() {
        let root = tempfile::tempdir().unwrap();
        let (a, b) = (root.path().join("a"), root.path().join("b"));
        let mut config = BrokerConfig::defaults();
        config.log_dirs = vec![a.clone(), b.clone()];
        std::fs::create_dir_all(&a).unwrap();
        let m = Metadata::open(&a, 1).unwrap();
        let rm = ReplicaManager::open(Arc::new(config), &m, Arc::new(Purgatory::new(10))).unwrap();
        m.create_topic(spec("t", 2)).unwrap();
        assert!(a.join("t-0").is_dir() && b.join("t-1").is_dir());
        let p = rm.partition("t", 0).unwrap();
        append(&p, 5);
        let b_name = b.display().to_string();
        assert_eq!(
            rm.alter_replica_log_dir("t", 0, "/no/such/dir"),
            Err(MoveRefusal::LogDirNotFound)
        );
        assert_eq!(
            rm.alter_replica_log_dir("t", 9, &b_name),
            Err(MoveRefusal::UnknownPartition)
        );
        // Already there: nothing to do.
        rm.alter_replica_log_dir("t", 1, &b_name).unwrap();
        let held = p.maintenance.lock().unwrap();
        rm.alter_replica_log_dir("t", 0, &b_name).unwrap();
        rm.alter_replica_log_dir("t", 0, &b_name).unwrap();
        assert_eq!(
            rm.alter_replica_log_dir("t", 0, &a.display().to_string()),
            Err(MoveRefusal::MoveInProgress)
        );
        let dirs = rm.describe_log_dirs();
        let in_b: Vec<(String, i32, bool)> = dirs[1]
            .partitions
            .iter()
            .map(|p| (p.topic.clone(), p.partition, p.is_future))
            .collect();
        assert!(in_b.contains(&("t".to_string(), 0, true)), "{in_b:?}");
        assert!(dirs[0]
            .partitions
            .iter()
            .any(|p| p.partition == 0 && !p.is_future));
        drop(held);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !rm.moves.lock().unwrap().is_empty() {
            assert!(std::time::Instant::now() < deadline, "the move finishes");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(b.join("t-0").is_dir() && !a.join("t-0").exists());
        assert!(Arc::ptr_eq(&p.log_dir(), &rm.log_dirs[1]));
        let read = p.read(0, 1 << 20, FetchIsolation::LogEnd).unwrap();
        assert_eq!(crate::log::last_offset_in(&read.bytes), Some(4));
        append(&p, 1);
        assert_eq!(p.offsets().log_end_offset, 6);
        assert_eq!(rm.remove_deleted_dirs(), 1);

        // A shutdown gives a move up: the copy goes, the partition stays where it is.
        let held = p.maintenance.lock().unwrap();
        rm.alter_replica_log_dir("t", 0, &a.display().to_string())
            .unwrap();
        let future = rm.moves.lock().unwrap()[&("t".to_string(), 0)]
            .future
            .clone();
        assert!(future.is_dir());
        let stopper = {
            let rm = rm.clone();
            std::thread::spawn(move || rm.stop_moves())
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !rm.moves.lock().unwrap()[&("t".to_string(), 0)]
            .cancel
            .load(Ordering::SeqCst)
        {
            assert!(std::time::Instant::now() < deadline, "stop_moves cancels");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        drop(held);
        stopper.join().unwrap();
        assert!(!future.exists() && b.join("t-0").is_dir() && !a.join("t-0").exists());
        assert!(rm.moves.lock().unwrap().is_empty());
        assert_eq!(p.offsets().log_end_offset, 6);
    }

    #[test]
    fn partitions_follow_the_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let (m, rm) = open_in(dir.path());
        let rm = rm.unwrap();
        let t = m.create_topic(spec("t", 2)).unwrap();
        assert!(rm.partition("t", 1).is_some() && dir.path().join("t-1").is_dir());
        m.add_partitions("t", 3, &[]).unwrap();
        assert!(rm.partition("t", 2).is_some());
        let configs = BTreeMap::from([("max.message.bytes".to_string(), "100".to_string())]);
        m.alter_topic_configs("t", |_| Ok(configs)).unwrap();
        for i in 0..3 {
            assert_eq!(
                rm.partition("t", i).unwrap().settings().max_message_bytes,
                100
            );
        }
        m.delete_topic(t.id).unwrap();
        for i in 0..3 {
            assert!(rm.partition("t", i).is_none());
            assert!(!dir.path().join(format!("t-{i}")).exists());
        }
    }

    /// Issue 15: a deleted topic's directory is renamed `<topic>-<p>.<uuid>-delete` at
    /// once (Kafka's `LogManager.asyncDelete`); a request still holding the old partition
    /// gets NOT_LEADER_OR_FOLLOWER and never touches the directory of the topic created
    /// next under the same name (a new topic id); the renamed directory goes with
    /// `remove_deleted_dirs`, and one left over at start-up is removed, never opened.
    #[test]
    fn a_deleted_partition_is_renamed_away_and_whoever_holds_it_is_refused() {
        use crate::log::delete::list_delete_dirs;
        let dir = tempfile::tempdir().unwrap();
        let one_batch = || {
            let record = crate::log::plain::record(0, 1000, None, None, Default::default());
            crate::log::split_batches(crate::log::plain::encode(&[record]).unwrap()).unwrap()
        };
        {
            let (m, rm) = open_in(dir.path());
            let rm = rm.unwrap();
            let t = m.create_topic(spec("t", 1)).unwrap();
            let old = rm.partition("t", 0).unwrap();
            append(&old, 3);
            m.delete_topic(t.id).unwrap();
            assert!(!dir.path().join("t-0").exists());
            assert_eq!(list_delete_dirs(dir.path()).unwrap().len(), 1);
            let again = m.create_topic(spec("t", 1)).unwrap();
            assert_ne!(again.id, t.id);
            let new = rm.partition("t", 0).unwrap();
            let e = old.append_as_leader(one_batch(), 0).unwrap_err();
            assert_eq!(e.kafka_error(), ResponseError::NotLeaderOrFollower);
            let e = old
                .read(0, 1 << 20, FetchIsolation::HighWatermark)
                .unwrap_err();
            assert!(matches!(e, LogError::Deleted), "{e:?}");
            assert!(matches!(
                old.read_for_follower(2, -1, 0, 1 << 20, 0),
                Err(ReplicaError::Log(LogError::Deleted))
            ));
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            assert_eq!(
                rt.block_on(old.wait_for_high_watermark(10, 60_000)),
                ReplicationWait::NotLeader
            );
            assert_eq!(
                old.apply_retention(0).unwrap_err().kafka_error(),
                ResponseError::NotLeaderOrFollower
            );
            assert_eq!(new.offsets().log_end_offset, 0);
            append(&new, 2);
            assert_eq!(rm.remove_deleted_dirs(), 1);
            assert!(list_delete_dirs(dir.path()).unwrap().is_empty());
            for ext in ["log", "index", "timeindex"] {
                let file = dir.path().join(format!("t-0/00000000000000000000.{ext}"));
                assert!(file.exists(), "{}", file.display());
            }
        }
        let leftover = dir.path().join(crate::log::delete::delete_dir_name("t-0"));
        std::fs::create_dir(&leftover).unwrap();
        std::fs::write(leftover.join("00000000000000000000.log"), b"old").unwrap();
        let (_m, rm) = open_in(dir.path());
        let rm = rm.unwrap();
        assert_eq!(rm.partition("t", 0).unwrap().offsets().log_end_offset, 2);
        assert_eq!(rm.remove_deleted_dirs(), 1);
        assert!(!leftover.exists());
    }

    #[test]
    fn a_broker_a_reassignment_adds_opens_the_partition_and_one_it_removes_deletes_it() {
        let dir = tempfile::tempdir().unwrap();
        let (_m, rm) = open_in(dir.path());
        let rm = rm.unwrap();
        let t = TopicMeta {
            name: "r".into(),
            id: uuid::Uuid::new_v4(),
            partitions: 1,
            replication_factor: 2,
            configs: BTreeMap::new(),
            partition_states: vec![PartitionState {
                replicas: vec![2, 3],
                isr: vec![2, 3],
                ..PartitionState::single_node(2)
            }]
            .into(),
        };
        let step = |image: &Arc<MetadataImage>, records: Vec<MetadataRecord>| {
            let d = MetadataDelta::apply(image.clone(), records).unwrap();
            rm.prepare(&d).unwrap();
            rm.publish(&d).unwrap();
            d.after().clone()
        };
        let change = |from: &PartitionState, to: PartitionState| MetadataRecord::PartitionChanged {
            topic_id: t.id,
            partition: 0,
            expected_partition_epoch: from.partition_epoch,
            state: from.succeeded_by(to),
        };
        let one = step(
            &Arc::new(MetadataImage::empty("c", 1)),
            vec![MetadataRecord::TopicCreated(t.clone())],
        );
        assert!(rm.partition("r", 0).is_none());
        let s = one.partition("r", 0).unwrap().clone();
        // Broker 1 (this one) is added: it opens the partition as a follower of 2.
        let two = step(
            &one,
            vec![change(
                &s,
                PartitionState {
                    replicas: vec![2, 3, 1],
                    adding_replicas: vec![1],
                    ..s.clone()
                },
            )],
        );
        let p = rm.partition("r", 0).expect("opened");
        assert!(matches!(
            p.replica_role(),
            ReplicaRole::Follower { leader_id: 2, .. }
        ));
        assert!(dir.path().join("r-0").is_dir());
        // Cancelled: it leaves, the directory goes.
        let adding = two.partition("r", 0).unwrap().clone();
        step(&two, vec![change(&adding, s.clone())]);
        assert!(rm.partition("r", 0).is_none());
        assert!(!dir.path().join("r-0").exists());
    }

    #[test]
    fn a_topic_whose_logs_cannot_all_be_created_is_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let (m, rm) = open_in(dir.path());
        let rm = rm.unwrap();
        std::fs::write(dir.path().join("t-1"), "in the way").unwrap();
        let e = m.create_topic(spec("t", 3)).unwrap_err();
        assert_eq!(e.error, ResponseError::KafkaStorageError);
        assert!(
            e.message.contains("cannot create the partition logs of t"),
            "{e:?}"
        );
        assert!(m.topic("t").is_none());
        assert!(rm.partition("t", 0).is_none());
        assert!(!dir.path().join("t-0").exists());
        assert!(dir.path().join("t-1").is_file(), "not ours: left alone");
        // Partitions added to an existing topic: the same, and the topic keeps its count.
        m.create_topic(spec("u", 1)).unwrap();
        std::fs::write(dir.path().join("u-2"), "in the way").unwrap();
        assert!(m.add_partitions("u", 3, &[]).is_err());
        assert_eq!(m.topic("u").unwrap().partitions, 1);
        assert!(rm.partition("u", 1).is_none() && !dir.path().join("u-1").exists());
        assert!(rm.partition("u", 0).is_some() && dir.path().join("u-0").is_dir());
    }

    #[test]
    fn a_start_up_that_cannot_open_a_log_removes_no_data() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (m, rm) = open_in(dir.path());
            let _rm = rm.unwrap();
            m.create_topic(spec("t", 3)).unwrap();
        }
        std::fs::remove_dir_all(dir.path().join("t-2")).unwrap();
        std::fs::write(dir.path().join("t-2"), "in the way").unwrap();
        let (_m, rm) = open_in(dir.path());
        let e = rm.unwrap_err();
        assert!(e.to_string().contains("t"), "{e}");
        assert!(dir.path().join("t-0").is_dir() && dir.path().join("t-1").is_dir());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader(isr: &[i32], followers: &[(i32, i64)]) -> ReplicaRole {
        ReplicaRole::Leader {
            leader_epoch: 3,
            partition_epoch: 0,
            isr: isr.to_vec(),
            maximal_isr: isr.to_vec(),
            followers: followers
                .iter()
                .map(|&(id, leo)| {
                    let mut f = FollowerState::new(0);
                    f.log_end_offset = leo;
                    (id, f)
                })
                .collect(),
            epoch_start_offset: 0,
        }
    }

    #[test]
    fn a_leader_tracks_replicas_a_reassignment_adds_and_forgets_removed_ones() {
        let s = PartitionState {
            replicas: vec![1, 2],
            isr: vec![1, 2],
            ..PartitionState::single_node(1)
        };
        let first = role_for(&s, 1, 0, None, 100);
        let grown = PartitionState {
            replicas: vec![1, 2, 3],
            adding_replicas: vec![3],
            partition_epoch: 1,
            ..s.clone()
        };
        let second = role_for(&grown, 1, 0, Some(&first), 200);
        let ReplicaRole::Leader { followers, isr, .. } = &second else {
            panic!("{second:?}")
        };
        assert_eq!(followers.keys().copied().collect::<Vec<_>>(), [2, 3]);
        assert_eq!(followers[&2].last_caught_up_ms, 100, "2's state is kept");
        assert_eq!(followers[&3].last_caught_up_ms, 200);
        assert_eq!(isr, &[1, 2], "3 joins the ISR only once caught up");
        let moved = PartitionState {
            replicas: vec![1, 3],
            isr: vec![1, 3],
            partition_epoch: 2,
            ..s
        };
        let third = role_for(&moved, 1, 0, Some(&second), 300);
        let ReplicaRole::Leader { followers, .. } = &third else {
            panic!("{third:?}")
        };
        assert_eq!(followers.keys().copied().collect::<Vec<_>>(), [3]);
    }

    #[test]
    fn high_watermark_is_the_smallest_log_end_offset_of_the_isr() {
        // A single node: the ISR is itself, so the high watermark follows its LEO.
        assert_eq!(high_watermark_for(&leader(&[1], &[]), 1, 10, 4, 1), 10);
        // Followers in the ISR hold it back to the slowest of them.
        let role = leader(&[1, 2, 3], &[(2, 7), (3, 9)]);
        assert_eq!(high_watermark_for(&role, 1, 10, 4, 1), 7);
        // A replica outside the ISR does not count, however far behind.
        let role = leader(&[1, 3], &[(2, 0), (3, 9)]);
        assert_eq!(high_watermark_for(&role, 1, 10, 4, 1), 9);
        // An ISR member with no fetch state yet holds it where it is; it never moves back.
        assert_eq!(high_watermark_for(&leader(&[1, 2], &[]), 1, 10, 4, 1), 4);
        assert_eq!(
            high_watermark_for(&leader(&[1, 2], &[(2, 2)]), 1, 10, 4, 1),
            4
        );
        // A follower's high watermark is the leader's: unchanged here.
        let follower = ReplicaRole::Follower {
            leader_id: 2,
            leader_epoch: 3,
        };
        assert_eq!(high_watermark_for(&follower, 1, 10, 4, 1), 4);
        // KIP-966: with fewer in-sync replicas than min.insync.replicas it stays put.
        let role = leader(&[1, 2], &[(2, 9), (3, 9)]);
        assert_eq!(high_watermark_for(&role, 1, 10, 4, 3), 4);
        assert_eq!(high_watermark_for(&role, 1, 10, 4, 2), 9);
    }

    #[test]
    fn a_follower_is_caught_up_when_it_fetches_from_the_leaders_end() {
        let mut f = FollowerState::new(0);
        // Behind the leader's end at 10: not caught up at 100.
        f.record_fetch(5, 10, 100);
        assert_eq!(f.last_caught_up_ms, 0);
        // It fetches from 10, the leader's end at its last fetch, while the leader is at
        // 12: caught up as of that last fetch (100), not now.
        f.record_fetch(10, 12, 200);
        assert_eq!(f.last_caught_up_ms, 100);
        // From the leader's end: caught up now.
        f.record_fetch(12, 12, 300);
        assert_eq!((f.last_caught_up_ms, f.log_end_offset), (300, 12));
    }

    #[tokio::test]
    async fn reads_stop_at_the_high_watermark_and_appends_advance_it() {
        let dir = tempfile::tempdir().unwrap();
        let log = PartitionLog::open(dir.path(), LogConfig::default(), 0).unwrap();
        let (_, settings) = resolve(
            &BrokerConfig::defaults(),
            DynamicLayers::default(),
            &BTreeMap::new(),
        );
        let p = Partition::new_replica(
            "t".into(),
            0,
            1,
            &PartitionState::single_node(1),
            settings,
            log,
            None,
            None,
        );
        let mut hw = p.watch_high_watermark();
        assert_eq!(
            p.offsets(),
            PartitionOffsets {
                log_start_offset: 0,
                last_stable_offset: 0,
                high_watermark: 0,
                log_end_offset: 0
            }
        );
        let records: Vec<_> = (0..3)
            .map(|i| {
                crate::log::plain::record(
                    i,
                    1000 + i,
                    None,
                    Some(Bytes::from_static(b"v")),
                    Default::default(),
                )
            })
            .collect();
        let batch = crate::log::plain::encode(&records).unwrap();
        let info = p
            .append_as_leader(crate::log::split_batches(batch).unwrap(), 0)
            .unwrap();
        assert_eq!((info.base_offset, info.last_offset), (0, 2));
        assert!(hw.has_changed().unwrap());
        assert_eq!(*hw.borrow_and_update(), 3);
        assert_eq!(p.offsets().high_watermark, 3);
        assert_eq!(
            p.wait_for_high_watermark(2, 10).await,
            ReplicationWait::Replicated
        );
        assert_eq!(
            p.wait_for_high_watermark(3, 10).await,
            ReplicationWait::TimedOut
        );
        let read = p.read(0, 1 << 20, FetchIsolation::HighWatermark).unwrap();
        assert!(!read.bytes.is_empty());
        // With an ISR member that has fetched nothing, the high watermark stays and a
        // consumer's read stops there, while a replica's read goes to the log end.
        *p.role() = leader(&[1, 2], &[(2, 3)]);
        let batch = crate::log::plain::encode(&records).unwrap();
        p.append_as_leader(crate::log::split_batches(batch).unwrap(), 0)
            .unwrap();
        assert_eq!(p.offsets().high_watermark, 3);
        assert_eq!(p.offsets().log_end_offset, 6);
        assert!(p
            .read(3, 1 << 20, FetchIsolation::HighWatermark)
            .unwrap()
            .bytes
            .is_empty());
        assert!(!p
            .read(3, 1 << 20, FetchIsolation::LogEnd)
            .unwrap()
            .bytes
            .is_empty());
        assert_eq!(
            p.max_timestamp(FetchIsolation::HighWatermark)
                .unwrap()
                .map(|(o, _)| o < 3),
            Some(true)
        );
    }

    /// A restarted leader's high watermark starts at its checkpointed one (capped at the
    /// log end offset), not at the log end offset: records appended but not committed
    /// before the restart stay hidden until the ISR's followers have them. Without a
    /// checkpoint entry it starts at the log end offset (an upgrade from a version that
    /// wrote none); a follower without one starts at the log start offset.
    #[test]
    fn a_restarted_replica_starts_at_its_checkpointed_high_watermark() {
        let dir = tempfile::tempdir().unwrap();
        let (_, settings) = resolve(
            &BrokerConfig::defaults(),
            DynamicLayers::default(),
            &BTreeMap::new(),
        );
        let state = PartitionState {
            replicas: vec![1, 2, 3],
            isr: vec![1, 2, 3],
            leader: 1,
            leader_epoch: 0,
            partition_epoch: 0,
            adding_replicas: Vec::new(),
            removing_replicas: Vec::new(),
        };
        {
            let log = PartitionLog::open(dir.path(), LogConfig::default(), 0).unwrap();
            let p = Partition::new_replica("t".into(), 0, 1, &state, settings, log, None, None);
            let records: Vec<_> = (0..6)
                .map(|i| crate::log::plain::record(i, 1000 + i, None, None, Default::default()))
                .collect();
            let batch = crate::log::plain::encode(&records).unwrap();
            p.append_as_leader(crate::log::split_batches(batch).unwrap(), 0)
                .unwrap();
        }
        let reopen = |state: &PartitionState, checkpointed: Option<i64>| {
            let log = PartitionLog::open(dir.path(), LogConfig::default(), 0).unwrap();
            Partition::new_replica("t".into(), 0, 1, state, settings, log, checkpointed, None)
        };
        let p = reopen(&state, Some(2));
        assert_eq!(p.high_watermark(), 2);
        assert_eq!(p.offsets().log_end_offset, 6);
        assert!(p
            .read(2, 1 << 20, FetchIsolation::HighWatermark)
            .unwrap()
            .bytes
            .is_empty());
        // The followers' fetches advance it by the normal rule.
        p.read_for_follower(2, 0, 6, 1 << 20, 0).unwrap();
        assert_eq!(p.high_watermark(), 2);
        p.read_for_follower(3, 0, 4, 1 << 20, 0).unwrap();
        assert_eq!(p.high_watermark(), 4);
        drop(p);
        assert_eq!(reopen(&state, Some(100)).high_watermark(), 6);
        assert_eq!(reopen(&state, None).high_watermark(), 6);
        let follower = PartitionState {
            leader: 2,
            ..state.clone()
        };
        assert_eq!(reopen(&follower, Some(4)).high_watermark(), 4);
        assert_eq!(reopen(&follower, None).high_watermark(), 0);
    }

    /// KIP-497's maximal ISR: while a follower's joining is pending, the high watermark
    /// waits for it too, so it holds every record acknowledged before the change that
    /// makes it electable commits; a change that fails lets the ISR alone hold it again.
    #[test]
    fn a_joining_follower_holds_the_high_watermark_until_its_change_is_answered() {
        let dir = tempfile::tempdir().unwrap();
        let log = PartitionLog::open(dir.path(), LogConfig::default(), 0).unwrap();
        let (_, settings) = resolve(
            &BrokerConfig::defaults(),
            DynamicLayers::default(),
            &BTreeMap::new(),
        );
        let (tx, mut changes) = mpsc::channel(4);
        let state = PartitionState {
            replicas: vec![1, 2, 3],
            isr: vec![1, 2],
            leader: 1,
            leader_epoch: 0,
            partition_epoch: 0,
            adding_replicas: Vec::new(),
            removing_replicas: Vec::new(),
        };
        let p = Partition::new_replica("t".into(), 0, 1, &state, settings, log, None, Some(tx));
        let append_three = || {
            let records: Vec<_> = (0..3)
                .map(|i| crate::log::plain::record(i, 1000 + i, None, None, Default::default()))
                .collect();
            let batch = crate::log::plain::encode(&records).unwrap();
            p.append_as_leader(crate::log::split_batches(batch).unwrap(), 0)
                .unwrap();
        };
        let fetch = |replica_id: i32, offset: i64| {
            p.read_for_follower(replica_id, 0, offset, 1 << 20, 0)
                .unwrap();
        };
        append_three();
        fetch(2, 3);
        assert_eq!(p.high_watermark(), 3);
        // Replica 3, outside the ISR, fetches from the high watermark: it may join.
        fetch(3, 3);
        let asked = changes.try_recv().expect("an ISR change asked for");
        assert_eq!(asked.isr, vec![1, 2, 3]);
        // Before the change is answered, three more records reach the ISR (1 and 2) but
        // not replica 3: they are not committed, since 3 may be elected once it joins.
        append_three();
        fetch(2, 6);
        assert_eq!(p.high_watermark(), 3);
        // The change is refused: the ISR alone holds the high watermark again.
        p.isr_change_done(asked.partition_epoch, false);
        assert_eq!(p.high_watermark(), 6);
    }

    /// What the replication task's walks ask without copying a role: the ISR check
    /// looks only at a leader with another broker in its ISR; the fetchers only at a
    /// follower, with its leader and epoch.
    #[test]
    fn the_replication_walks_see_leaders_with_followers_and_followed_leaders() {
        let open = |leader: i32, isr: Vec<i32>| {
            let dir = tempfile::tempdir().unwrap();
            let log = PartitionLog::open(dir.path(), LogConfig::default(), 0).unwrap();
            let (_, settings) = resolve(
                &BrokerConfig::defaults(),
                DynamicLayers::default(),
                &BTreeMap::new(),
            );
            let state = PartitionState {
                replicas: vec![1, 2],
                isr,
                leader,
                leader_epoch: 4,
                partition_epoch: 0,
                adding_replicas: Vec::new(),
                removing_replicas: Vec::new(),
            };
            let p = Partition::new_replica("t".into(), 0, 1, &state, settings, log, None, None);
            (p.leads_with_followers_in_isr(), p.followed_leader())
        };
        assert_eq!(open(1, vec![1, 2]), (true, None));
        assert_eq!(
            open(1, vec![1]),
            (false, None),
            "alone in its ISR: nothing to shrink"
        );
        assert_eq!(open(2, vec![1, 2]), (false, Some((2, 4))));
    }

    /// KIP-98 on a leader with a lagging follower: the last stable offset stays at an
    /// open transaction's start, and after its marker until the high watermark passes the
    /// marker; read_committed reads stop there and report the aborted transaction; a
    /// follower copying the leader's batches computes the same last stable offset and may
    /// not write markers.
    #[test]
    fn the_last_stable_offset_waits_for_open_transactions_and_replicated_markers() {
        use crate::log::batch::testing::BatchSpec;
        let dir = tempfile::tempdir().unwrap();
        let log = PartitionLog::open(dir.path(), LogConfig::default(), 0).unwrap();
        let (_, settings) = resolve(
            &BrokerConfig::defaults(),
            DynamicLayers::default(),
            &BTreeMap::new(),
        );
        let state = PartitionState {
            replicas: vec![1, 2],
            isr: vec![1, 2],
            leader: 1,
            leader_epoch: 0,
            partition_epoch: 0,
            adding_replicas: Vec::new(),
            removing_replicas: Vec::new(),
        };
        let p = Partition::new_replica("t".into(), 0, 1, &state, settings, log, None, None);
        let txn = |pid: i64, seq: i32, count: usize| {
            let mut spec = BatchSpec::new(count, 1_000).idempotent(pid, 0, seq);
            spec.attributes = 0x10;
            spec.build()
        };
        let fetch = |offset: i64| {
            p.read_for_follower(2, 0, offset, 1 << 20, 0).unwrap();
        };
        p.append_as_leader(vec![txn(7, 0, 2)], 0).unwrap(); // 0..1
        p.append_as_leader(vec![crate::log::batch::testing::batch(1, 1_000)], 0)
            .unwrap(); // 2
        assert!(p.log().has_ongoing_txn(7) && !p.log().has_ongoing_txn(8));
        fetch(3);
        let offsets = p.offsets();
        assert_eq!((offsets.high_watermark, offsets.last_stable_offset), (3, 0));
        let read = p.read(0, 1 << 20, FetchIsolation::ReadCommitted).unwrap();
        assert!(read.bytes.is_empty());
        assert_eq!(read.aborted_transactions, Some(Vec::new()));
        assert_eq!(
            p.read(0, 1 << 20, FetchIsolation::HighWatermark)
                .unwrap()
                .aborted_transactions,
            None
        );

        // The ABORT marker at 3: the LSO waits until the follower has it.
        let info = p.append_txn_marker(7, 0, false, 0, 0).unwrap();
        assert_eq!(info.last_offset, 3);
        assert!(!p.log().has_ongoing_txn(7));
        assert_eq!(p.offsets().last_stable_offset, 0);
        fetch(4);
        let offsets = p.offsets();
        assert_eq!((offsets.high_watermark, offsets.last_stable_offset), (4, 4));
        let read = p.read(0, 1 << 20, FetchIsolation::ReadCommitted).unwrap();
        assert_eq!(crate::log::last_offset_in(&read.bytes), Some(3));
        let aborted = read.aborted_transactions.unwrap();
        assert_eq!(
            aborted
                .iter()
                .map(|t| (t.producer_id, t.first_offset, t.last_offset))
                .collect::<Vec<_>>(),
            vec![(7, 0, 3)]
        );
        // A read past the aborted range does not get it.
        let later = p.read(4, 1 << 20, FetchIsolation::ReadCommitted).unwrap();
        assert_eq!(later.aborted_transactions, Some(Vec::new()));
        // Two open transactions: the LSO is the earlier start until both end.
        p.append_as_leader(vec![txn(8, 0, 1)], 0).unwrap(); // 4
        p.append_as_leader(vec![txn(9, 0, 1)], 0).unwrap(); // 5
        fetch(6);
        assert_eq!(p.offsets().last_stable_offset, 4);
        p.append_txn_marker(8, 0, true, 0, 0).unwrap(); // 6
        fetch(7);
        assert_eq!(p.offsets().last_stable_offset, 5);
        // Fencing on the leader: a coordinator epoch older than producer 8's last marker.
        assert!(matches!(
            p.append_txn_marker(8, 0, true, -1, 0),
            Err(LogError::TransactionCoordinatorFenced { .. })
        ));

        // A follower copying these batches knows the same transactions.
        let copied = p.read(0, 1 << 20, FetchIsolation::LogEnd).unwrap().bytes;
        let follower_dir = tempfile::tempdir().unwrap();
        let follower_log =
            PartitionLog::open(follower_dir.path(), LogConfig::default(), 0).unwrap();
        let follower_state = PartitionState {
            leader: 2,
            ..state.clone()
        };
        let f = Partition::new_replica(
            "t".into(),
            0,
            1,
            &follower_state,
            settings,
            follower_log,
            None,
            None,
        );
        f.append_as_follower(crate::log::split_fetched(copied).unwrap(), 7, 0)
            .unwrap();
        let offsets = f.offsets();
        assert_eq!((offsets.high_watermark, offsets.last_stable_offset), (7, 5));
        assert!(f.log().has_ongoing_txn(9));
        assert!(matches!(
            f.append_txn_marker(9, 0, true, 0, 0),
            Err(LogError::NotLeader)
        ));
        let read = f.read(0, 1 << 20, FetchIsolation::ReadCommitted).unwrap();
        assert_eq!(read.aborted_transactions.unwrap().len(), 1);
    }

    fn candidate(
        broker_id: i32,
        log_end_offset: i64,
        last_caught_up_ms: i64,
    ) -> ReadReplicaCandidate {
        ReadReplicaCandidate {
            broker_id,
            log_end_offset,
            last_caught_up_ms,
        }
    }

    /// Kafka's `RackAwareReplicaSelector`: a follower in the client's rack holding the
    /// fetch offset, the most caught-up first; the leader (None) otherwise.
    #[test]
    fn the_rack_aware_selector_picks_an_in_sync_follower_in_the_clients_rack() {
        let two = (candidate(2, 10, 100), Some("r2"));
        let three = (candidate(3, 10, 100), Some("r3"));
        let all = [two, three];
        assert_eq!(select_read_replica("r2", Some("r1"), 0, &all), Some(2));
        assert_eq!(select_read_replica("r3", Some("r1"), 10, &all), Some(3));
        // No rack given, the leader's own rack, an unknown rack: the leader.
        assert_eq!(select_read_replica("", Some("r1"), 0, &all), None);
        assert_eq!(select_read_replica("r1", Some("r1"), 0, &all), None);
        assert_eq!(select_read_replica("r9", Some("r1"), 0, &all), None);
        // A leader without a rack still sends a client to its rack's follower.
        assert_eq!(select_read_replica("r2", None, 0, &all), Some(2));
        // A follower without the fetch offset (its log ends below it) is not chosen.
        assert_eq!(select_read_replica("r2", Some("r1"), 11, &all), None);
        // A follower with no rack never matches.
        assert_eq!(
            select_read_replica("r2", Some("r1"), 0, &[(candidate(2, 10, 0), None)]),
            None
        );
        // Several in the rack: the largest log end offset, then the most recently
        // caught up, then the lowest id.
        let same_rack = [
            (candidate(4, 9, 500), Some("r2")),
            (candidate(3, 10, 100), Some("r2")),
            (candidate(2, 10, 200), Some("r2")),
        ];
        assert_eq!(
            select_read_replica("r2", Some("r1"), 0, &same_rack),
            Some(2)
        );
        let tied = [
            (candidate(3, 10, 100), Some("r2")),
            (candidate(2, 10, 100), Some("r2")),
        ];
        assert_eq!(select_read_replica("r2", Some("r1"), 0, &tied), Some(2));
    }

    /// The candidates are the ISR's followers with fetch state, never an out-of-sync
    /// replica, nor anything on a follower replica.
    #[test]
    fn only_in_sync_followers_are_read_replica_candidates() {
        let dir = tempfile::tempdir().unwrap();
        let log = PartitionLog::open(dir.path(), LogConfig::default(), 0).unwrap();
        let (_, settings) = resolve(
            &BrokerConfig::defaults(),
            DynamicLayers::default(),
            &BTreeMap::new(),
        );
        let state = PartitionState {
            replicas: vec![1, 2, 3],
            isr: vec![1, 2, 3],
            leader: 1,
            leader_epoch: 0,
            partition_epoch: 0,
            adding_replicas: Vec::new(),
            removing_replicas: Vec::new(),
        };
        let p = Partition::new_replica("t".into(), 0, 1, &state, settings, log, None, None);
        *p.role() = leader(&[1, 3], &[(2, 5), (3, 7)]);
        assert_eq!(
            p.in_sync_followers()
                .iter()
                .map(|c| (c.broker_id, c.log_end_offset))
                .collect::<Vec<_>>(),
            [(3, 7)]
        );
        *p.role() = ReplicaRole::Follower {
            leader_id: 2,
            leader_epoch: 1,
        };
        assert!(p.in_sync_followers().is_empty());
    }

    /// A follower exposes nothing before its leader tells it a high watermark (its tail
    /// may be divergent), then the leader's, capped at its own log end offset; consumers
    /// reading it (KIP-392) stop there, get nothing between it and the log end, and
    /// OFFSET_OUT_OF_RANGE past the log end.
    #[test]
    fn a_follower_serves_reads_up_to_the_high_watermark_its_leader_sent() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = PartitionLog::open(dir.path(), LogConfig::default(), 0).unwrap();
        let records: Vec<_> = (0..3)
            .map(|i| crate::log::plain::record(i, 1000 + i, None, None, Default::default()))
            .collect();
        for _ in 0..2 {
            let batch = crate::log::plain::encode(&records).unwrap();
            for b in crate::log::split_batches(batch).unwrap() {
                log.append(
                    b,
                    AppendOptions {
                        log_append_time_ms: None,
                        leader_epoch: 0,
                    },
                    0,
                )
                .unwrap();
            }
        }
        let (_, settings) = resolve(
            &BrokerConfig::defaults(),
            DynamicLayers::default(),
            &BTreeMap::new(),
        );
        let state = PartitionState {
            replicas: vec![1, 2],
            isr: vec![1, 2],
            leader: 2,
            leader_epoch: 0,
            partition_epoch: 0,
            adding_replicas: Vec::new(),
            removing_replicas: Vec::new(),
        };
        let p = Partition::new_replica("t".into(), 0, 1, &state, settings, log, None, None);
        assert_eq!(p.offsets().log_end_offset, 6);
        assert_eq!(p.high_watermark(), 0);
        let read = |offset| p.read(offset, 1 << 20, FetchIsolation::HighWatermark);
        assert!(read(0).unwrap().bytes.is_empty());
        // The leader says 3 (its fetch response): three records are readable here.
        p.append_as_follower(Vec::new(), 3, 0).unwrap();
        assert_eq!(p.high_watermark(), 3);
        assert_eq!(crate::log::stored_record_count(&read(0).unwrap().bytes), 3);
        assert!(read(4).unwrap().bytes.is_empty());
        assert!(matches!(read(7), Err(LogError::OffsetOutOfRange { .. })));
        assert_eq!(p.offset_lag(), 0);
        // A leader's high watermark past this log's end is capped at it; the offset lag
        // (DescribeLogDirs) says by how much this replica is behind.
        p.append_as_follower(Vec::new(), 9, 0).unwrap();
        assert_eq!(p.high_watermark(), 6);
        assert_eq!(p.offset_lag(), 3);
        assert_eq!(crate::log::stored_record_count(&read(0).unwrap().bytes), 6);
    }

    #[test]
    fn resolve_reads_the_cleaner_keys() {
        let broker = BrokerConfig::defaults();
        let (log, settings) = resolve(&broker, DynamicLayers::default(), &BTreeMap::new());
        assert_eq!(log.cleanup_policy, CleanupPolicy::DELETE);
        assert_eq!(log.min_cleanable_dirty_ratio, 0.5);
        assert_eq!(log.delete_retention_ms, 86_400_000);
        assert_eq!(log.min_compaction_lag_ms, 0);
        assert!(!settings.require_keys);
        let overrides: BTreeMap<String, String> = [
            ("cleanup.policy", "compact,delete"),
            ("min.cleanable.dirty.ratio", "0.01"),
            ("delete.retention.ms", "1000"),
            ("min.compaction.lag.ms", "2000"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let (log, settings) = resolve(&broker, DynamicLayers::default(), &overrides);
        assert!(log.cleanup_policy.compact && log.cleanup_policy.delete);
        assert_eq!(log.min_cleanable_dirty_ratio, 0.01);
        assert_eq!(log.delete_retention_ms, 1000);
        assert_eq!(log.min_compaction_lag_ms, 2000);
        assert!(settings.require_keys);
    }

    #[test]
    fn resolve_follows_the_dynamic_layers_below_a_topic_override() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let broker = BrokerConfig::load(None, &["log.retention.ms=9000".to_string()]).unwrap();
        let default = map(&[
            ("log.retention.ms", "5000"),
            ("message.max.bytes", "2000"),
            ("log.cleanup.policy", "compact"),
        ]);
        let own = map(&[("message.max.bytes", "1000")]);
        let layers = DynamicLayers {
            per_broker: Some(&own),
            cluster_default: Some(&default),
        };
        let (log, settings) = resolve(&broker, layers, &BTreeMap::new());
        assert_eq!(log.retention_ms, 5000, "dynamic default over static");
        assert_eq!(settings.max_message_bytes, 1000, "per broker over default");
        assert!(log.cleanup_policy.compact && !log.cleanup_policy.delete);
        let (log, settings) = resolve(
            &broker,
            layers,
            &map(&[("retention.ms", "7"), ("cleanup.policy", "")]),
        );
        assert_eq!(log.retention_ms, 7, "topic override over everything");
        assert_eq!(settings.max_message_bytes, 1000);
        // Kafka 4.1: an empty cleanup.policy is neither delete nor compact.
        assert!(!log.cleanup_policy.compact && !log.cleanup_policy.delete);
        let (log, _) = resolve(&broker, DynamicLayers::default(), &BTreeMap::new());
        assert_eq!(log.retention_ms, 9000, "static without dynamic layers");
    }
}
