//! The replica manager: the partitions this broker hosts and the entry points that append
//! to and read from them (Kafka's `ReplicaManager`).
//!
//! Owns: the map topic-partition → [`Partition`] (a [`PartitionLog`] behind a mutex plus the
//! topic settings the produce path needs), opening every log at start-up, creating,
//! reconfiguring and deleting partition logs as metadata deltas say (it is a
//! [`MetadataListener`]; topic existence is the metadata's alone), the background
//! retention task, and waking
//! the purgatory after each append. On a single node the high watermark equals the log end
//! offset (every acknowledged write is in the only replica); replication will pass a real
//! high watermark in.
//!
//! Never does: decode requests or decide leadership.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use crate::cluster::{
    ListenerError, Metadata, MetadataDelta, MetadataListener, MetadataRecord, TopicMeta,
};
use crate::config::{BrokerConfig, TOPIC_KEYS};
use crate::log::{
    AppendInfo, AppendOptions, CleanupPolicy, Compression, LogConfig, LogError, PartitionLog,
    ValidatedBatch,
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

/// One hosted partition: its log and its topic's produce settings.
#[derive(Debug)]
pub struct Partition {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub index: i32,
    /// Settings from the topic config; swapped by [`ReplicaManager::reconfigure_topic`].
    settings: RwLock<ProduceSettings>,
    log: Mutex<PartitionLog>,
}

impl Partition {
    /// The topic settings in force now (a copy: the lock is held only to read them).
    pub fn settings(&self) -> ProduceSettings {
        *self
            .settings
            .read()
            .expect("partition settings lock poisoned")
    }

    /// Runs `f` with the log locked. The lock is a `std` mutex: never held across `.await`.
    pub fn with_log<T>(&self, f: impl FnOnce(&mut PartitionLog) -> T) -> T {
        let mut log = self.log.lock().expect("partition log lock poisoned");
        f(&mut log)
    }

    /// The high watermark: on a single node, the log end offset.
    pub fn high_watermark(&self) -> i64 {
        self.with_log(|l| l.log_end_offset())
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
            MetadataRecord::ProducerIdsReserved { .. } => continue,
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
    /// as each metadata change is applied ([`MetadataListener`]).
    ///
    /// Errors: [`ListenerError`] naming the first partition whose log cannot be opened
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

    /// Opens (creating) the logs of partitions `from..meta.partitions` of a topic and
    /// adds them to the map. Directories it creates are pushed to `created`. On error
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
            let dir = partition_dir(&self.log_dir, &meta.name, index);
            if !dir.exists() {
                // Pushed before opening: a log that fails half way leaves its directory.
                created.push(dir.clone());
            }
            let log = PartitionLog::open(&dir, log_config.clone(), now)?;
            let p = Arc::new(Partition {
                topic: meta.name.clone(),
                index,
                settings: RwLock::new(settings),
                log: Mutex::new(log),
            });
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
            p.with_log(|l| l.set_config(log_config.clone()))?;
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

    /// Appends validated batches to one partition, in order; returns the first batch's
    /// append info and the last offset. Wakes parked fetches.
    ///
    /// Errors: [`LogError`] from the log (sequence errors of idempotent producers, I/O).
    pub fn append(
        &self,
        partition: &Partition,
        batches: Vec<ValidatedBatch>,
    ) -> Result<AppendInfo, LogError> {
        let now = now_ms();
        let opts = AppendOptions {
            log_append_time_ms: partition.settings().log_append_time.then_some(now),
            leader_epoch: 0,
        };
        let result = partition.with_log(|log| {
            let mut first: Option<AppendInfo> = None;
            for batch in batches {
                let info = log.append(batch, opts, now)?;
                match &mut first {
                    None => first = Some(info),
                    Some(f) => f.last_offset = info.last_offset,
                }
            }
            Ok(first)
        });
        self.purgatory.notify_appended();
        // `split_batches` never yields an empty list for non-empty input, and the produce
        // path refuses empty input before calling: an empty list here is our bug.
        result.map(|first| first.expect("append called with no batches"))
    }

    /// Runs retention, then compaction, on every partition once (the background task in
    /// `broker.rs` calls it every `log.retention.check.interval.ms`): time/size retention
    /// where `cleanup.policy` has `delete`, [`PartitionLog::compact`] where it has
    /// `compact` (each logs a line when it removed something). A failure is logged and
    /// leaves that partition as it was; the others go on. Returns the number of segments
    /// deleted by retention.
    pub fn apply_retention(&self) -> usize {
        let parts: Vec<Arc<Partition>> = self.read().values().cloned().collect();
        let now = now_ms();
        let mut deleted = 0;
        for p in parts {
            match p.with_log(|l| l.apply_retention(now)) {
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
            match p.with_log(|l| l.compact(now)) {
                Ok(stats) if stats.cleaned => tracing::info!(
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
            if let Err(e) = p.with_log(|l| l.flush()) {
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
        }
    }

    #[test]
    fn partitions_follow_the_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let (m, rm) = open_in(dir.path());
        let rm = rm.unwrap();
        let t = m.create_topic(spec("t", 2)).unwrap();
        assert!(rm.partition("t", 1).is_some() && dir.path().join("t-1").is_dir());
        m.add_partitions("t", 3).unwrap();
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
        assert!(m.add_partitions("u", 3).is_err());
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
