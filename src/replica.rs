//! The replica manager: the partitions this broker hosts and the entry points that append
//! to and read from them (Kafka's `ReplicaManager`).
//!
//! Owns: the map topic-partition → [`Partition`] (a [`PartitionLog`] behind a read-write lock plus the
//! topic settings the produce path needs), opening every log at start-up, creating and
//! deleting partition logs when topics change, the background retention task, and waking
//! the purgatory after each append. On a single node the high watermark equals the log end
//! offset (every acknowledged write is in the only replica); replication will pass a real
//! high watermark in.
//!
//! Never does: decode requests or decide leadership.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use crate::cluster::TopicMeta;
use crate::config::{BrokerConfig, TOPIC_KEYS};
use crate::log::{
    AppendInfo, AppendOptions, CleanerThrottle, CleanupPolicy, Compression, LogConfig, LogError,
    PartitionLog, ValidatedBatch,
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
    /// Reads (fetch, ListOffsets) share it; appends, retention, compaction's plan and
    /// install steps, config changes and flushes take it exclusively.
    log: RwLock<PartitionLog>,
}

impl Partition {
    /// The topic settings in force now (a copy: the lock is held only to read them).
    pub fn settings(&self) -> ProduceSettings {
        *self
            .settings
            .read()
            .expect("partition settings lock poisoned")
    }

    /// Runs `f` with the log locked exclusively (for changes: append, retention, config,
    /// flush). The lock is a `std` `RwLock`: never held across `.await`.
    pub fn with_log<T>(&self, f: impl FnOnce(&mut PartitionLog) -> T) -> T {
        let mut log = self.log.write().expect("partition log lock poisoned");
        f(&mut log)
    }

    /// Runs `f` with the log locked shared (reads: any number at once, and alongside a
    /// compaction's prepare step, which holds no lock). A `std` `RwLock`: never held
    /// across `.await`.
    pub fn with_log_read<T>(&self, f: impl FnOnce(&PartitionLog) -> T) -> T {
        let log = self.log.read().expect("partition log lock poisoned");
        f(&log)
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
    /// Serialises topic config changes from the metadata write to the last partition
    /// reconfigured, so two concurrent alters cannot leave partitions on the older one.
    config_changes: Mutex<()>,
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

impl ReplicaManager {
    /// Opens the log of every partition of every topic in `topics` (recovering each).
    ///
    /// Errors: the first [`LogError`] (an unreadable log dir stops start-up: serving with a
    /// partition missing would answer UNKNOWN_TOPIC_OR_PARTITION for data that exists).
    pub fn open(
        broker: Arc<BrokerConfig>,
        topics: &[TopicMeta],
        purgatory: Arc<Purgatory>,
    ) -> Result<ReplicaManager, LogError> {
        let rm = ReplicaManager {
            log_dir: broker.log_dir.clone(),
            broker,
            partitions: RwLock::new(HashMap::new()),
            purgatory,
            config_changes: Mutex::new(()),
        };
        for t in topics {
            rm.open_partitions(t, 0)?;
        }
        Ok(rm)
    }

    /// Opens (creating) the logs of partitions `from..meta.partitions` of a topic.
    pub fn open_partitions(&self, meta: &TopicMeta, from: i32) -> Result<(), LogError> {
        let (log_config, settings) = resolve(&self.broker, &meta.configs);
        let now = now_ms();
        for index in from..meta.partitions {
            let dir = partition_dir(&self.log_dir, &meta.name, index);
            let log = PartitionLog::open(&dir, log_config.clone(), now)?;
            let p = Arc::new(Partition {
                topic: meta.name.clone(),
                index,
                settings: RwLock::new(settings),
                log: RwLock::new(log),
            });
            self.write().insert((meta.name.clone(), index), p);
        }
        Ok(())
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
    pub fn reconfigure_topic(&self, meta: &TopicMeta) -> Result<(), LogError> {
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

    /// Held by a topic config change from its metadata write to its
    /// [`ReplicaManager::reconfigure_topic`]; a `std` mutex, never held across `.await`.
    pub fn lock_config_changes(&self) -> std::sync::MutexGuard<'_, ()> {
        self.config_changes
            .lock()
            .expect("config change lock poisoned")
    }

    /// Removes partitions `0..partitions` of `topic` and deletes their directories
    /// (DeleteTopics, or rolling back a topic whose logs could not all be created — so a
    /// directory is removed even if its log never opened).
    pub fn delete_topic(&self, topic: &str, partitions: i32) -> Result<(), LogError> {
        {
            let mut map = self.write();
            map.retain(|(t, _), _| t != topic);
        }
        for index in 0..partitions {
            let dir = partition_dir(&self.log_dir, topic, index);
            // The Arc of a removed partition may still be held by an in-flight fetch, which
            // then reads from unlinked files (POSIX keeps them alive) and finishes normally.
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(LogError::Io {
                        op: "delete partition directory",
                        path: dir,
                        source: e,
                    })
                }
            }
        }
        Ok(())
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
            let plan = p.with_log(|l| l.plan_compaction(now));
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
                p.with_log(|l| l.install_compaction(prepared)).map(Some)
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
