//! The replica manager: the partitions this broker hosts and the entry points that append
//! to and read from them (Kafka's `ReplicaManager` and `Partition`).
//!
//! Owns: the map topic-partition → [`Partition`]; each `Partition` is the one owner of its
//! [`PartitionLog`], its high watermark (computed only in [`high_watermark_for`]) and its
//! replica role ([`ReplicaRole`]: leader with ISR and follower state, or follower). Callers
//! get [`Partition::offsets`], [`Partition::read`] bounded by a [`FetchIsolation`] and
//! [`Partition::append_as_leader`], never the log. Also: opening every log at start-up,
//! creating, reconfiguring and deleting partition logs as metadata deltas say (it is a
//! `MetadataListener`; topic existence is the metadata's alone), the retention task.
//! A high watermark advance is published on the partition's own watch channel, which
//! parked fetches and acks=all produces wait on (keyed per partition, see `purgatory`).
//! On a single node the ISR is this broker alone, so the high watermark is the log end
//! offset after every append.
//!
//! Never does: decode requests or decide leadership (the role is set from the metadata).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use tokio::sync::watch;

use crate::cluster::{
    ListenerError, Metadata, MetadataDelta, MetadataListener, MetadataRecord, PartitionState,
    TopicMeta,
};
use crate::config::{BrokerConfig, TOPIC_KEYS};
use crate::log::{
    AppendInfo, AppendOptions, CleanerThrottle, CleanupPolicy, CompactionPlan, CompactionStats,
    Compression, LogConfig, LogError, PartitionLog, PreparedCompaction, ValidatedBatch,
};
use crate::purgatory::Purgatory;

/// Where a topic-level config value came from (DescribeConfigs `config_source`, KIP-226).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigSource {
    /// Set on the topic (DYNAMIC_TOPIC_CONFIG, 1).
    Topic,
    /// Set in the broker's file or overrides (STATIC_BROKER_CONFIG, 4).
    StaticBroker,
    /// Built-in default (DEFAULT_CONFIG, 5).
    Default,
}

impl ConfigSource {
    /// The DescribeConfigs v1+ `config_source` code.
    pub fn code(self) -> i8 {
        match self {
            ConfigSource::Topic => 1,
            ConfigSource::StaticBroker => 4,
            ConfigSource::Default => 5,
        }
    }
}

/// The effective value of every topic-level key for a topic: override, else broker value.
/// Returns `(key, value or None for null, source)` in [`TOPIC_KEYS`] order.
pub fn effective_topic_configs(
    broker: &BrokerConfig,
    overrides: &BTreeMap<String, String>,
) -> Vec<(&'static str, Option<String>, ConfigSource)> {
    TOPIC_KEYS
        .iter()
        .map(|spec| {
            if let Some(v) = overrides.get(spec.name) {
                return (spec.name, Some(v.clone()), ConfigSource::Topic);
            }
            let (v, set) = broker.topic_default(spec);
            let source = if set {
                ConfigSource::StaticBroker
            } else {
                ConfigSource::Default
            };
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
}

fn resolve(
    broker: &BrokerConfig,
    overrides: &BTreeMap<String, String>,
) -> (LogConfig, ProduceSettings) {
    let mut log = LogConfig::default();
    let mut settings = ProduceSettings {
        max_message_bytes: 1_048_588,
        log_append_time: false,
        require_keys: false,
        compression: None,
    };
    for (key, value, _) in effective_topic_configs(broker, overrides) {
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

/// A partition's offsets: log start, high watermark, log end (the three a Fetch and a
/// ListOffsets response carry). Invariant: `log_start_offset <= high_watermark <=
/// log_end_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionOffsets {
    /// First offset still in the log (earliest, ListOffsets -2).
    pub log_start_offset: i64,
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
}

/// What one read returns: the stored batches and the offsets they were read against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionRead {
    /// The partition's offsets when the read was made.
    pub offsets: PartitionOffsets,
    /// Whole stored batches from the one containing the fetch offset, as on disk.
    pub bytes: Bytes,
}

/// What the leader knows of one follower (Kafka's `Replica` state on the leader).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerState {
    /// The follower's log end offset, from its last Fetch.
    pub log_end_offset: i64,
    /// Wall-clock time (ms) the follower was last caught up to the leader's LEO; ISR
    /// shrinking compares it with `replica.lag.time.max.ms`.
    pub last_caught_up_ms: i64,
}

/// A replica's role for its partition: its one home (Kafka's `Partition` leader state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaRole {
    /// This broker leads the partition.
    Leader {
        /// The leader epoch stamped into every batch this leader appends.
        leader_epoch: i32,
        /// The in-sync replicas' broker ids, this broker included.
        isr: Vec<i32>,
        /// Every other replica's fetch state, by broker id.
        followers: BTreeMap<i32, FollowerState>,
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

/// The high watermark a leader may expose: the smallest log end offset over the ISR
/// (its own `leader_log_end_offset` included; a member with no fetch state yet holds
/// it at `current`). Never moves back: the result is at least `current`. A follower's
/// high watermark is the leader's, so this returns `current` for [`ReplicaRole::Follower`].
/// Sans-IO (STYLE rule 5): the one place the high watermark is computed.
pub fn high_watermark_for(
    role: &ReplicaRole,
    self_id: i32,
    leader_log_end_offset: i64,
    current: i64,
) -> i64 {
    match role {
        ReplicaRole::Leader { isr, followers, .. } => {
            let min_isr_leo = isr
                .iter()
                .filter(|id| **id != self_id)
                .map(|id| followers.get(id).map_or(current, |f| f.log_end_offset))
                .fold(leader_log_end_offset, i64::min);
            min_isr_leo.max(current)
        }
        ReplicaRole::Follower { .. } => current,
    }
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
}

impl Partition {
    /// A partition over an opened log in the role `state` gives this broker: leader (ISR
    /// = itself until replication exists) or follower of `state.leader`. The high
    /// watermark starts at the log end offset: every record on the leader's only in-sync
    /// replica is committed (a follower holds no data yet).
    fn new_replica(
        topic: String,
        index: i32,
        node_id: i32,
        state: &PartitionState,
        settings: ProduceSettings,
        log: PartitionLog,
    ) -> Partition {
        let (high_watermark, _) = watch::channel(log.log_end_offset());
        let role = if state.leader == node_id {
            ReplicaRole::Leader {
                leader_epoch: state.leader_epoch,
                isr: vec![node_id],
                followers: BTreeMap::new(),
            }
        } else {
            ReplicaRole::Follower {
                leader_id: state.leader,
                leader_epoch: state.leader_epoch,
            }
        };
        Partition {
            topic,
            index,
            node_id,
            settings: RwLock::new(settings),
            log: RwLock::new(log),
            role: Mutex::new(role),
            high_watermark,
        }
    }

    /// Whether this broker leads the partition (Produce, ListOffsets and consumer Fetch
    /// go to the leader only: NOT_LEADER_OR_FOLLOWER elsewhere).
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

    fn role(&self) -> std::sync::MutexGuard<'_, ReplicaRole> {
        self.role.lock().expect("partition role lock poisoned")
    }

    /// The replica role now (a copy).
    pub fn replica_role(&self) -> ReplicaRole {
        self.role().clone()
    }

    fn offsets_of(&self, log: &PartitionLog) -> PartitionOffsets {
        let log_start_offset = log.log_start_offset();
        let log_end_offset = log.log_end_offset();
        PartitionOffsets {
            log_start_offset,
            high_watermark: (*self.high_watermark.borrow()).clamp(log_start_offset, log_end_offset),
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
        let role = self.role();
        self.high_watermark.send_if_modified(|hw| {
            let new = high_watermark_for(&role, self.node_id, leo, *hw).min(leo);
            let changed = new != *hw;
            *hw = new;
            changed
        });
    }

    /// Whole stored batches from the one containing `fetch_offset`, up to `max_bytes`
    /// (the first batch whole even when larger: KIP-74), bounded by `isolation` (the high
    /// watermark for consumers). `fetch_offset` equal to the bound gives no bytes.
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
        let log = self.log();
        let offsets = self.offsets_of(&log);
        let bound = match isolation {
            FetchIsolation::LogEnd => offsets.log_end_offset,
            FetchIsolation::HighWatermark => offsets.high_watermark,
        };
        let read = log.read(fetch_offset, max_bytes, bound)?;
        Ok(PartitionRead {
            offsets,
            bytes: read.bytes,
        })
    }

    /// ListOffsets by timestamp (KIP-79): the first record whose timestamp is at or
    /// after `ts_ms`, as `(offset, timestamp_ms)`, below the high watermark.
    ///
    /// Errors: [`LogError`] from the index or a batch read (KAFKA_STORAGE_ERROR, 56).
    pub fn offset_for_timestamp(&self, ts_ms: i64) -> Result<Option<(i64, i64)>, LogError> {
        let log = self.log();
        let hw = self.offsets_of(&log).high_watermark;
        Ok(log
            .offset_for_timestamp(ts_ms)?
            .filter(|(offset, _)| *offset < hw))
    }

    /// ListOffsets -3 (KIP-734): the record with the largest timestamp, as
    /// `(offset, timestamp_ms)`, if it is below the high watermark.
    ///
    /// Errors: [`LogError`] from a batch read (KAFKA_STORAGE_ERROR, 56).
    pub fn max_timestamp(&self) -> Result<Option<(i64, i64)>, LogError> {
        let log = self.log();
        let hw = self.offsets_of(&log).high_watermark;
        Ok(log.max_timestamp()?.filter(|(offset, _)| *offset < hw))
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
        let leader_epoch = self.role().leader_epoch();
        let opts = AppendOptions {
            log_append_time_ms: self.settings().log_append_time.then_some(now_ms),
            leader_epoch,
        };
        let mut log = self.log_mut();
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
        drop(log);
        result?;
        // `split_batches` never yields an empty list for non-empty input, and the produce
        // path refuses empty input before calling: an empty list here is our bug.
        Ok(first.expect("append called with no batches"))
    }

    /// Waits until the high watermark passes `offset` (acks=all: the batch whose last
    /// offset is `offset` is on every in-sync replica), or `timeout_ms` passes. Parks on
    /// the partition's high watermark, never blocking a thread. Returns whether it passed.
    pub async fn wait_for_high_watermark(&self, offset: i64, timeout_ms: u64) -> bool {
        let mut rx = self.watch_high_watermark();
        let wait = async { rx.wait_for(|hw| *hw > offset).await.is_ok() };
        tokio::time::timeout(std::time::Duration::from_millis(timeout_ms), wait)
            .await
            .unwrap_or(false)
    }

    /// Retention (then compaction) on this partition's log; returns the segments deleted
    /// by retention. See [`PartitionLog::apply_retention`] and [`PartitionLog::compact`].
    fn apply_retention(&self, now_ms: i64) -> Result<usize, LogError> {
        let mut log = self.log_mut();
        let deleted = log.apply_retention(now_ms)?;
        self.update_high_watermark(&log);
        Ok(deleted)
    }

    /// Compaction step 1, under the exclusive lock (cheap): what a run would clean. See
    /// [`PartitionLog::plan_compaction`]; step 2, `CompactionPlan::prepare`, runs with no
    /// lock held, so produce and fetch go on.
    fn plan_compaction(&self, now_ms: i64) -> CompactionPlan {
        self.log_mut().plan_compaction(now_ms)
    }

    /// Compaction step 3, under the exclusive lock: swaps the prepared segments in, or
    /// discards them if the log changed meanwhile ([`PartitionLog::install_compaction`]).
    fn install_compaction(
        &self,
        prepared: PreparedCompaction,
    ) -> Result<CompactionStats, LogError> {
        let mut log = self.log_mut();
        let stats = log.install_compaction(prepared)?;
        self.update_high_watermark(&log);
        Ok(stats)
    }

    fn flush(&self) -> Result<(), LogError> {
        self.log_mut().flush()
    }

    fn set_log_config(&self, config: LogConfig) -> Result<(), LogError> {
        self.log_mut().set_config(config)
    }
}

/// Key of the partition map.
type PartitionKey = (String, i32);

/// The partitions of this broker.
#[derive(Debug)]
pub struct ReplicaManager {
    log_dir: PathBuf,
    broker: Arc<BrokerConfig>,
    partitions: RwLock<HashMap<PartitionKey, Arc<Partition>>>,
    purgatory: Arc<Purgatory>,
    /// Partition directories created by the prepared, not yet published, metadata change
    /// (metadata changes are serialised: at most one is pending), removed if it aborts.
    created_dirs: Mutex<Vec<PathBuf>>,
}

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
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for record in delta.records() {
        let id = match record {
            MetadataRecord::TopicCreated(t) => t.id,
            MetadataRecord::PartitionsAdded { topic_id, .. }
            | MetadataRecord::TopicConfigsChanged { topic_id, .. }
            | MetadataRecord::TopicDeleted { topic_id } => *topic_id,
            MetadataRecord::ProducerIdsReserved { .. }
            | MetadataRecord::BrokerRegistered { .. }
            | MetadataRecord::BrokerFenced { .. }
            | MetadataRecord::BrokerUnfenced { .. }
            | MetadataRecord::BrokerShuttingDown { .. } => continue,
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
            }
            (Some(b), None) => out.push(TopicChange::Close {
                name: &b.name,
                partitions: b.partitions,
            }),
            // Created and deleted within the delta: nothing to do here.
            (None, None) => {}
        }
    }
    Ok(out)
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
    /// as each metadata change is applied (`MetadataListener`).
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
        let rm = Arc::new(ReplicaManager {
            log_dir: broker.log_dir.clone(),
            broker,
            partitions: RwLock::new(HashMap::new()),
            purgatory,
            created_dirs: Mutex::new(Vec::new()),
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
        meta: &TopicMeta,
        from: i32,
        created: &mut Vec<PathBuf>,
    ) -> Result<(), LogError> {
        let (log_config, settings) = resolve(&self.broker, &meta.configs);
        let now = now_ms();
        for index in from..meta.partitions {
            let Some(state) = meta
                .partition(index)
                .filter(|s| s.replicas.contains(&self.broker.node_id))
            else {
                continue;
            };
            let dir = partition_dir(&self.log_dir, &meta.name, index);
            if !dir.exists() {
                // Pushed before opening: a log that fails half way leaves its directory.
                created.push(dir.clone());
            }
            let log = PartitionLog::open(&dir, log_config.clone(), now)?;
            let p = Arc::new(Partition::new_replica(
                meta.name.clone(),
                index,
                self.broker.node_id,
                state,
                settings,
                log,
            ));
            self.write().insert((meta.name.clone(), index), p);
        }
        Ok(())
    }

    /// Undoes the `Open` changes of a delta: closes those partitions and removes the
    /// directories `created` lists (never one that existed before: at start-up that
    /// would be data).
    fn undo_open(&self, changes: &[TopicChange<'_>], created: Vec<PathBuf>) {
        {
            let mut map = self.write();
            for change in changes {
                if let TopicChange::Open { meta, from } = change {
                    for index in *from..meta.partitions {
                        map.remove(&(meta.name.clone(), index));
                    }
                }
            }
        }
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
        self.read().get(&(topic.to_string(), index)).cloned()
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
    fn reconfigure_topic(&self, meta: &TopicMeta) -> Result<(), LogError> {
        let (log_config, settings) = resolve(&self.broker, &meta.configs);
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

    /// Removes partitions `0..partitions` of `topic` and deletes their directories.
    ///
    /// Errors: the first directory that cannot be removed (the others are still tried).
    fn delete_topic(&self, topic: &str, partitions: i32) -> Result<(), LogError> {
        {
            let mut map = self.write();
            map.retain(|(t, _), _| t != topic);
        }
        let mut first_error = None;
        for index in 0..partitions {
            let dir = partition_dir(&self.log_dir, topic, index);
            // The Arc of a removed partition may still be held by an in-flight fetch, which
            // then reads from unlinked files (POSIX keeps them alive) and finishes normally.
            if let Err(e) = remove_partition_dir(&dir) {
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
                Err(e) => {
                    tracing::warn!(topic = %p.topic, partition = p.index, error = %e, "retention failed")
                }
            }
            let plan = p.plan_compaction(now);
            if !plan.is_due() {
                continue;
            }
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
        let mut created = Vec::new();
        for change in &changes {
            if let TopicChange::Open { meta, from } = change {
                if let Err(e) = self.open_partitions(meta, *from, &mut created) {
                    self.undo_open(&changes, created);
                    return Err(ListenerError::new(
                        format!("cannot create the partition logs of {}", meta.name),
                        e,
                    ));
                }
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
                TopicChange::Open { .. } => continue,
                TopicChange::Reconfigure(meta) => self.reconfigure_topic(meta).map_err(|e| {
                    // Validated configs always resolve to a valid log config: our bug.
                    ListenerError::new(format!("cannot apply the configs of {}", meta.name), e)
                }),
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
    use crate::cluster::NewTopic;
    use kafka_protocol::ResponseError;

    fn open_in(dir: &Path) -> (Metadata, Result<Arc<ReplicaManager>, ListenerError>) {
        let mut config = BrokerConfig::defaults();
        config.log_dir = dir.to_path_buf();
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

    #[test]
    fn a_topic_whose_logs_cannot_all_be_created_is_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let (m, rm) = open_in(dir.path());
        let rm = rm.unwrap();
        std::fs::write(dir.path().join("t-1"), "in the way").unwrap();
        let e = m.create_topic(spec("t", 3)).unwrap_err();
        assert_eq!(e.error, ResponseError::UnknownServerError);
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
            isr: isr.to_vec(),
            followers: followers
                .iter()
                .map(|&(id, leo)| {
                    (
                        id,
                        FollowerState {
                            log_end_offset: leo,
                            last_caught_up_ms: 0,
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn high_watermark_is_the_smallest_log_end_offset_of_the_isr() {
        // A single node: the ISR is itself, so the high watermark follows its LEO.
        assert_eq!(high_watermark_for(&leader(&[1], &[]), 1, 10, 4), 10);
        // Followers in the ISR hold it back to the slowest of them.
        let role = leader(&[1, 2, 3], &[(2, 7), (3, 9)]);
        assert_eq!(high_watermark_for(&role, 1, 10, 4), 7);
        // A replica outside the ISR does not count, however far behind.
        let role = leader(&[1, 3], &[(2, 0), (3, 9)]);
        assert_eq!(high_watermark_for(&role, 1, 10, 4), 9);
        // An ISR member with no fetch state yet holds it where it is; it never moves back.
        assert_eq!(high_watermark_for(&leader(&[1, 2], &[]), 1, 10, 4), 4);
        assert_eq!(high_watermark_for(&leader(&[1, 2], &[(2, 2)]), 1, 10, 4), 4);
        // A follower's high watermark is the leader's: unchanged here.
        let follower = ReplicaRole::Follower {
            leader_id: 2,
            leader_epoch: 3,
        };
        assert_eq!(high_watermark_for(&follower, 1, 10, 4), 4);
    }

    #[tokio::test]
    async fn reads_stop_at_the_high_watermark_and_appends_advance_it() {
        let dir = tempfile::tempdir().unwrap();
        let log = PartitionLog::open(dir.path(), LogConfig::default(), 0).unwrap();
        let (_, settings) = resolve(&BrokerConfig::defaults(), &BTreeMap::new());
        let p = Partition::new_replica(
            "t".into(),
            0,
            1,
            &PartitionState::single_node(1),
            settings,
            log,
        );
        let mut hw = p.watch_high_watermark();
        assert_eq!(
            p.offsets(),
            PartitionOffsets {
                log_start_offset: 0,
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
        assert!(p.wait_for_high_watermark(2, 10).await);
        assert!(!p.wait_for_high_watermark(3, 10).await);
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
        assert_eq!(p.max_timestamp().unwrap().map(|(o, _)| o < 3), Some(true));
    }

    #[test]
    fn resolve_reads_the_cleaner_keys() {
        let broker = BrokerConfig::defaults();
        let (log, settings) = resolve(&broker, &BTreeMap::new());
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
        let (log, settings) = resolve(&broker, &overrides);
        assert!(log.cleanup_policy.compact && log.cleanup_policy.delete);
        assert_eq!(log.min_cleanable_dirty_ratio, 0.01);
        assert_eq!(log.delete_retention_ms, 1000);
        assert_eq!(log.min_compaction_lag_ms, 2000);
        assert!(settings.require_keys);
    }
}
