//! The partition log: bytes on disk for one partition, in Kafka's layout.
//!
//! Owns: `<log.dirs>/<topic>-<partition>/` — segments (`<base_offset:020>.log`), their
//! sparse `.index` / `.timeindex`, producer snapshots (`.snapshot`), the leader epoch
//! cache (`leader-epoch-checkpoint`, `epoch.rs`; KIP-101/KIP-279); offset assignment,
//! the log start offset and log end offset (LEO), rolling, retention (time/size, only when
//! `cleanup.policy` has `delete`), compaction (`compact.rs`, when it has `compact`),
//! truncation, recovery after kill -9, idempotent producer state, transaction state
//! (KIP-98: ongoing transactions per producer, markers, the first unstable offset the last
//! stable offset comes from, the per-segment aborted transaction index `.txnindex`,
//! `txn.rs`), the follower's append of
//! batches copied from the leader (`append_as_follower`, offsets and epochs kept), and
//! fsync when `flush_messages` / `flush_ms` ask for it. Never does: networking, request/response
//! types, decompression outside the cleaner, leadership decisions (the high watermark is passed in as `max_offset`), or locking
//! (the owner wraps a `PartitionLog` in whatever lock it needs; reads take `&self` and use
//! positional reads only, so they can share a read lock; compaction's expensive step runs
//! on snapshots with no lock at all, see `compact.rs`).
//!
//! Design (DESIGN.md, core decisions 1-3): record batches are stored exactly as the
//! client sent them except for baseOffset, partitionLeaderEpoch and, for LogAppendTime,
//! attributes/maxTimestamp/CRC; compaction later rewrites the batches it removes records
//! from (same offsets, uncompressed; see `compact.rs`). Closed segments and their indexes are trusted on open;
//! only the tail of the last segment is scanned, so start-up time is bounded by
//! `segment_bytes`, not by the data size (one exception: a log without a readable
//! `leader-epoch-checkpoint` has its batch headers scanned once to rebuild it). A follower's
//! batches are stored exactly as the leader stored them.
//!
//! Durability without flush settings is the page cache (survives kill -9, not power
//! loss). There is no recovery-point checkpoint yet: after a power loss only the last
//! segment is verified.

pub mod batch;
pub mod checkpoint;
pub mod codec;
mod compact;
pub mod delete;
mod epoch;
pub mod fdcache;
mod index;
pub mod plain;
mod producer;
pub mod records;
pub mod relocate;
pub mod rewrite;
mod segment;
pub mod topic_id;
mod txn;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use bytes::Bytes;

pub use batch::{
    last_offset_in, split_batches, split_fetched, stored_record_count, validate, BatchError,
    Compression, TimestampType, ValidatedBatch,
};
pub use compact::{CleanerThrottle, CompactionPlan, CompactionStats, PreparedCompaction};
pub use epoch::EpochEndOffset;
use epoch::LeaderEpochCache;
pub use producer::ProducerSummary;
use producer::{CompletedTxn, ProducerStateManager, SequenceCheck};
pub use segment::FileRegion;
use segment::{file_path, io_error, remove_if_exists, Segment};
pub use txn::{AbortedTxn, TxnMarker};

/// `cleanup.policy` (Kafka's `TopicConfig.CLEANUP_POLICY_CONFIG`): a list of `delete`
/// and/or `compact`. Both may be set; neither means the log only grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanupPolicy {
    /// `delete`: [`PartitionLog::apply_retention`] removes segments by `retention.ms` and
    /// `retention.bytes`.
    pub delete: bool,
    /// `compact`: [`PartitionLog::compact`] keeps only the latest record of each key.
    pub compact: bool,
}

impl CleanupPolicy {
    /// Kafka's default, `delete`.
    pub const DELETE: CleanupPolicy = CleanupPolicy {
        delete: true,
        compact: false,
    };

    /// Parses the comma-separated list (`"compact,delete"`); unknown words are ignored
    /// (the config registry has already refused them).
    pub fn parse(text: &str) -> CleanupPolicy {
        let has = |word: &str| text.split(',').any(|p| p.trim() == word);
        CleanupPolicy {
            delete: has("delete"),
            compact: has("compact"),
        }
    }
}

/// Per-partition log settings, Kafka's topic-level names with units.
#[derive(Debug, Clone, PartialEq)]
pub struct LogConfig {
    /// `segment.bytes`: roll before a segment would exceed this (1..=i32::MAX; default
    /// 1 GiB). A single batch larger than this gets a segment of its own.
    pub segment_bytes: u64,
    /// `segment.ms`: roll when the incoming batch's maxTimestamp is this much newer than the
    /// active segment's first batch (default 7 days).
    pub segment_ms: i64,
    /// `retention.ms`: delete segments whose largest timestamp is older; -1 = forever.
    pub retention_ms: i64,
    /// `retention.bytes`: delete oldest segments while the log is larger; -1 = no limit.
    pub retention_bytes: i64,
    /// `index.interval.bytes`: bytes between offset index entries (default 4096).
    pub index_interval_bytes: u32,
    /// `segment.index.bytes`: roll when an index would grow past this (default 10 MiB).
    pub segment_index_bytes: u64,
    /// `flush.messages`: fsync after this many records; `None` = leave it to the OS.
    pub flush_messages: Option<u64>,
    /// `flush.ms`: fsync when this long passed since the last one (checked on append and
    /// in [`PartitionLog::maybe_flush`]); `None` = leave it to the OS.
    pub flush_ms: Option<i64>,
    /// `cleanup.policy` (default `delete`).
    pub cleanup_policy: CleanupPolicy,
    /// `min.cleanable.dirty.ratio`: compact only when the closed bytes not yet compacted
    /// are at least this fraction of all cleanable closed bytes (0.0..=1.0; default 0.5).
    pub min_cleanable_dirty_ratio: f64,
    /// `delete.retention.ms`: a tombstone (null value) survives compaction until its
    /// batch's maxTimestamp is this much older than now (default 1 day).
    pub delete_retention_ms: i64,
    /// `min.compaction.lag.ms` (KIP-58): a closed segment holding a record newer than this
    /// is not compacted yet, nor any segment after it (default 0).
    pub min_compaction_lag_ms: i64,
}

impl Default for LogConfig {
    /// Kafka's defaults.
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1 << 30,
            segment_ms: 7 * 24 * 3_600_000,
            retention_ms: 7 * 24 * 3_600_000,
            retention_bytes: -1,
            index_interval_bytes: 4096,
            segment_index_bytes: 10 << 20,
            flush_messages: None,
            flush_ms: None,
            cleanup_policy: CleanupPolicy::DELETE,
            min_cleanable_dirty_ratio: 0.5,
            delete_retention_ms: 86_400_000,
            min_compaction_lag_ms: 0,
        }
    }
}

/// How to append one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendOptions {
    /// `Some(now_ms)` when the topic has `message.timestamp.type=LogAppendTime`.
    pub log_append_time_ms: Option<i64>,
    /// Written into partitionLeaderEpoch of the stored batch.
    pub leader_epoch: i32,
}

/// Result of an append, the fields a ProduceResponse partition needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    /// Offset assigned to the first record.
    pub base_offset: i64,
    /// Offset of the last record.
    pub last_offset: i64,
    /// The log-append time written into the batch, or -1 (CreateTime or duplicate).
    pub log_append_time_ms: i64,
    /// Log start offset after the append.
    pub log_start_offset: i64,
    /// True when the batch was a retry of one already in the log: nothing was written and
    /// the offsets are the original ones (KIP-98).
    pub duplicate: bool,
}

/// Bytes of a read: whole stored batches, concatenated, exactly as on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadResult {
    /// Concatenated batches (empty when nothing is readable below `max_offset`).
    pub bytes: Bytes,
    /// Base offset of the first batch in `bytes`; `None` when `bytes` is empty.
    pub first_batch_base_offset: Option<i64>,
}

/// Errors of the partition log. Kafka codes are given for the protocol layer
/// ([`LogError::kafka_error`]).
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The file system failed. Kafka `KAFKA_STORAGE_ERROR` (56).
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done ("read", "append", "fsync", ...).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The log dir holding the partition is offline after an I/O error (KIP-112): nothing
    /// touches its files until a restart. Kafka `KAFKA_STORAGE_ERROR` (56).
    #[error("log dir {} is offline", path.display())]
    LogDirOffline {
        /// The log dir.
        path: PathBuf,
    },
    /// A read or ListOffsets outside `[log_start_offset, log_end_offset]`.
    /// Kafka `OFFSET_OUT_OF_RANGE` (1).
    #[error("offset {offset} is outside [{log_start_offset}, {log_end_offset}]")]
    OffsetOutOfRange {
        /// The offset asked for.
        offset: i64,
        /// Current log start offset.
        log_start_offset: i64,
        /// Current log end offset.
        log_end_offset: i64,
    },
    /// A batch from an older producer epoch than the log knows (a fenced producer).
    /// Kafka `INVALID_PRODUCER_EPOCH` (47).
    #[error("producer {producer_id} epoch {producer_epoch} is older than {current_epoch}")]
    InvalidProducerEpoch {
        /// producerId of the batch.
        producer_id: i64,
        /// producerEpoch of the batch.
        producer_epoch: i16,
        /// The epoch the log knows.
        current_epoch: i16,
    },
    /// A batch whose baseSequence does not follow the producer's last one.
    /// Kafka `OUT_OF_ORDER_SEQUENCE_NUMBER` (45).
    #[error(
        "producer {producer_id} epoch {producer_epoch}: sequence {base_sequence}, expected {expected_sequence}"
    )]
    OutOfOrderSequence {
        /// producerId of the batch.
        producer_id: i64,
        /// producerEpoch of the batch.
        producer_epoch: i16,
        /// baseSequence of the batch.
        base_sequence: i32,
        /// The sequence the log expected.
        expected_sequence: i32,
    },
    /// Stored bytes do not match what the indexes or previous batches promise (the read
    /// side of "assert in pairs"). Kafka `KAFKA_STORAGE_ERROR` (56).
    #[error("corrupt log data in {} at byte {position}: {reason}", path.display())]
    Corrupt {
        /// The `.log` file.
        path: PathBuf,
        /// Byte position in it.
        position: u64,
        /// What did not match.
        reason: String,
    },
    /// A `LogConfig` value out of range. Kafka `INVALID_CONFIG` (40).
    #[error("invalid log config: {reason}")]
    InvalidConfig {
        /// Which value and why.
        reason: String,
    },
    /// [`PartitionLog::append_as_follower`] got a batch starting below the log end offset:
    /// it overlaps what the follower already holds (Kafka's
    /// `UnexpectedAppendOffsetException`). The replica fetcher asked from an offset that is
    /// no longer its log end offset, or the leader's log differs; it must not append, but
    /// truncate (OffsetsForLeaderEpoch) and fetch again. Kafka `UNKNOWN_SERVER_ERROR` (-1).
    #[error("follower append at offset {got}, the log end offset is {expected}")]
    UnexpectedAppendOffset {
        /// The log end offset: where the next batch must start (or, after a gap the
        /// leader's compaction left, beyond).
        expected: i64,
        /// baseOffset of the batch.
        got: i64,
    },
    /// A non-transactional batch from a producer with a transaction open on this
    /// partition (Kafka's `ProducerAppendInfo`: "Expected transactional write").
    /// Kafka `INVALID_TXN_STATE` (48).
    #[error("producer {producer_id} has a transaction open; a non-transactional batch is refused")]
    InvalidTxnState {
        /// producerId of the batch.
        producer_id: i64,
    },
    /// A transaction marker from a coordinator epoch older than the last one seen for the
    /// producer (a zombie coordinator, KIP-98). Kafka `TRANSACTION_COORDINATOR_FENCED` (52).
    #[error(
        "producer {producer_id}: coordinator epoch {coordinator_epoch} is older than {current_coordinator_epoch}"
    )]
    TransactionCoordinatorFenced {
        /// The producer the marker is for.
        producer_id: i64,
        /// The marker's coordinator epoch.
        coordinator_epoch: i32,
        /// The last one the log saw for this producer.
        current_coordinator_epoch: i32,
    },
    /// An append as leader to a partition this broker follows: the caller's leadership
    /// check raced a leader change. Kafka `NOT_LEADER_OR_FOLLOWER` (6). Raised by the
    /// partition's owner (`replica.rs`), which holds the role; the log itself never does.
    #[error("this broker does not lead the partition")]
    NotLeader,
    /// The partition was deleted (DeleteTopics, or a reassignment moved it away) while
    /// the request held it: Kafka `NOT_LEADER_OR_FOLLOWER` (6), what Kafka's `Partition`
    /// answers once `delete()` has cleared its log; the client refreshes Metadata and
    /// finds the topic gone, or re-created. Raised by the owner (`replica.rs`), which
    /// marks the partition deleted before its directory is renamed away
    /// (`log::delete`); the log itself never does.
    #[error("the partition was deleted")]
    Deleted,
}

impl LogError {
    /// The Kafka error for this error: the one mapping from a log failure to a response
    /// code, used by every API that touches a log (Produce, Fetch, ListOffsets,
    /// CreateTopics, CreatePartitions, AlterConfigs) and by the REST produce path.
    ///
    /// Each is the code Kafka's own broker sends for the same failure (`Errors.java`):
    /// - `Io`, `Corrupt` → `KAFKA_STORAGE_ERROR` (56): Kafka wraps a failed log-dir
    ///   operation in `KafkaStorageException`; the client retries or moves to another
    ///   replica, and the broker keeps serving the other partitions.
    /// - `OffsetOutOfRange` → `OFFSET_OUT_OF_RANGE` (1): the consumer resets by its
    ///   `auto.offset.reset`.
    /// - `InvalidProducerEpoch` → `INVALID_PRODUCER_EPOCH` (47): a fenced producer, as
    ///   `ProducerStateManager` reports it.
    /// - `OutOfOrderSequence` → `OUT_OF_ORDER_SEQUENCE_NUMBER` (45).
    /// - `InvalidConfig` → `INVALID_CONFIG` (40): Kafka's `LogConfig.validate` throws
    ///   `InvalidConfigurationException`, which is 40 in CreateTopics and AlterConfigs —
    ///   the only requests that hand the log a config. It was 56 (a storage error) on
    ///   the produce path, which would have told a client to retry a request that cannot
    ///   succeed.
    /// - `UnexpectedAppendOffset` → `UNKNOWN_SERVER_ERROR` (-1): it only happens inside the
    ///   replica fetcher (a follower append), never on a client's request, so no code
    ///   tells a client anything useful; Kafka has no code for it either (its
    ///   `kafka.common.UnexpectedAppendOffsetException` is a plain `RuntimeException`,
    ///   which `Errors.forException` answers with -1). The mapping exists so this function stays total.
    /// - `NotLeader`, `Deleted` → `NOT_LEADER_OR_FOLLOWER` (6): the client refreshes
    ///   Metadata.
    /// - `InvalidTxnState` → `INVALID_TXN_STATE` (48), `TransactionCoordinatorFenced` →
    ///   `TRANSACTION_COORDINATOR_FENCED` (52), as Kafka's `ProducerStateManager` raises them.
    pub fn kafka_error(&self) -> kafka_protocol::ResponseError {
        use kafka_protocol::ResponseError;
        match self {
            LogError::Io { .. } | LogError::Corrupt { .. } | LogError::LogDirOffline { .. } => {
                ResponseError::KafkaStorageError
            }
            LogError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
            LogError::InvalidProducerEpoch { .. } => ResponseError::InvalidProducerEpoch,
            LogError::OutOfOrderSequence { .. } => ResponseError::OutOfOrderSequenceNumber,
            LogError::InvalidConfig { .. } => ResponseError::InvalidConfig,
            LogError::UnexpectedAppendOffset { .. } => ResponseError::UnknownServerError,
            LogError::NotLeader | LogError::Deleted => ResponseError::NotLeaderOrFollower,
            LogError::InvalidTxnState { .. } => ResponseError::InvalidTxnState,
            LogError::TransactionCoordinatorFenced { .. } => {
                ResponseError::TransactionCoordinatorFenced
            }
        }
    }
}

/// One partition's log. See the module doc.
#[derive(Debug)]
pub struct PartitionLog {
    dir: PathBuf,
    config: LogConfig,
    /// Sorted by base offset, never empty; the last one is the active segment.
    segments: Vec<Segment>,
    log_start_offset: i64,
    producers: ProducerStateManager,
    unflushed_messages: u64,
    last_flush_ms: i64,
    /// Reused buffer so a small batch is appended with one `write`.
    scratch: Vec<u8>,
    /// The cleaner's checkpoint: offsets below it were compacted by the last run (Kafka's
    /// `cleaner-offset-checkpoint`, kept per partition in `compact::CHECKPOINT_FILE`).
    first_dirty_offset: i64,
    /// Which leader epoch wrote which offsets (`epoch.rs`, `leader-epoch-checkpoint`).
    epochs: LeaderEpochCache,
}

fn check_config(config: &LogConfig) -> Result<(), LogError> {
    let invalid = |reason: String| Err(LogError::InvalidConfig { reason });
    if config.segment_bytes == 0 || config.segment_bytes > i32::MAX as u64 {
        return invalid(format!(
            "segment_bytes {} not in 1..=2^31-1",
            config.segment_bytes
        ));
    }
    if config.segment_index_bytes < 12 || config.segment_index_bytes > i32::MAX as u64 {
        return invalid(format!(
            "segment_index_bytes {} not in 12..=2^31-1",
            config.segment_index_bytes
        ));
    }
    if config.segment_ms <= 0 {
        return invalid(format!("segment_ms {} must be positive", config.segment_ms));
    }
    if config.retention_ms < -1 || config.retention_bytes < -1 {
        return invalid("retention_ms and retention_bytes must be >= -1".into());
    }
    if config.flush_messages == Some(0) || config.flush_ms.is_some_and(|ms| ms < 0) {
        return invalid("flush_messages must be >= 1 and flush_ms >= 0".into());
    }
    if !(0.0..=1.0).contains(&config.min_cleanable_dirty_ratio) {
        return invalid(format!(
            "min_cleanable_dirty_ratio {} not in 0..=1",
            config.min_cleanable_dirty_ratio
        ));
    }
    if config.delete_retention_ms < 0 || config.min_compaction_lag_ms < 0 {
        return invalid("delete_retention_ms and min_compaction_lag_ms must be >= 0".into());
    }
    Ok(())
}

/// The upgrade path for a log written before epochs were kept (or whose checkpoint is
/// unreadable): one pass over every segment's batch headers, the only time `open` reads
/// closed segments; then the checkpoint is written so the next open does not repeat it.
fn rebuild_epoch_cache(dir: &Path, segments: &[Segment]) -> Result<LeaderEpochCache, LogError> {
    let mut epochs = LeaderEpochCache::empty(dir);
    for segment in segments {
        segment.for_each_header(|header| {
            epochs.push_if_newer(header.partition_leader_epoch, header.base_offset);
        })?;
    }
    tracing::info!(
        dir = %dir.display(),
        entries = epochs.entries().len(),
        latest_epoch = ?epochs.latest_epoch(),
        "rebuilt the leader epoch cache from the batch headers"
    );
    epochs.persist()?;
    Ok(epochs)
}

impl PartitionLog {
    /// Opens (creating if absent) `dir` (= `<log.dirs>/<topic>-<partition>`) and recovers
    /// it: closed segments are trusted (an index that is missing is rebuilt), the last
    /// segment's tail is scanned from its last index entry and cut at the first torn or
    /// corrupt batch (logged with `tracing::warn!`), producer state is reloaded from the
    /// active segment's snapshot plus its batch headers. The leader epoch cache is read
    /// from `leader-epoch-checkpoint`; when that is missing or unparsable and the log holds
    /// batches, it is rebuilt from every segment's batch headers once (logged with
    /// `tracing::info!`: a log from before epochs were kept). Entries starting at or after
    /// the log end offset are dropped, and the first one is moved up to the log start
    /// offset. `now_ms` is the wall clock.
    ///
    /// Errors: `InvalidConfig`, `Io` (with the path), `Corrupt`.
    pub fn open(dir: &Path, config: LogConfig, now_ms: i64) -> Result<PartitionLog, LogError> {
        check_config(&config)?;
        std::fs::create_dir_all(dir).map_err(io_error("create", dir))?;
        let mut bases = Vec::new();
        let mut others = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io_error("list", dir))? {
            let entry = entry.map_err(io_error("list", dir))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some((stem, extension)) = name.split_once('.') else {
                continue;
            };
            let Ok(base) = stem.parse::<i64>() else {
                continue;
            };
            if stem.len() != 20 || base < 0 {
                continue;
            }
            match extension {
                "log" => bases.push(base),
                "index" | "timeindex" | "txnindex" | "snapshot" => {
                    others.push((base, entry.path()))
                }
                // Temp files, and the cleaner's files of a compaction that never swapped
                // in (the original segment is still whole; see `compact.rs`).
                _ if extension.ends_with(".tmp")
                    || extension.ends_with(".cleaned")
                    || extension.ends_with(".swap") =>
                {
                    tracing::info!(file = %entry.path().display(), "removing leftover file");
                    others.push((-1, entry.path()))
                }
                _ => {}
            }
        }
        bases.sort_unstable();
        // Files of a segment whose .log is gone (a crash mid-delete) and temp files.
        for (base, path) in others {
            if bases.binary_search(&base).is_err() {
                remove_if_exists(&path)?;
            }
        }
        let mut segments = Vec::with_capacity(bases.len().max(1));
        for (i, base) in bases.iter().enumerate() {
            if let Some(next) = bases.get(i + 1) {
                segments.push(Segment::open_closed(
                    dir,
                    *base,
                    *next,
                    config.index_interval_bytes,
                    now_ms,
                )?);
            }
        }
        match bases.last() {
            Some(last) => {
                let (segment, _report) =
                    Segment::recover(dir, *last, config.index_interval_bytes, now_ms)?;
                segments.push(segment);
            }
            None => segments.push(Segment::create(
                dir,
                0,
                config.index_interval_bytes,
                now_ms,
            )?),
        }
        let log_end_offset = segments.last().map_or(0, |s| s.next_offset);
        let log_start_offset = match read_log_start_checkpoint(dir) {
            Some(checkpointed) if checkpointed > log_end_offset => {
                // The checkpoint is fsynced; records below it that recovery lost are gone
                // anyway. The log restarts at its end (see `truncate_to` for why no lower).
                tracing::warn!(dir = %dir.display(), checkpointed, log_end_offset, "log start offset checkpoint is past the recovered log end; using the log end");
                log_end_offset
            }
            Some(checkpointed) => checkpointed.max(segments[0].base_offset),
            None => segments[0].base_offset,
        };
        let first_dirty_offset = compact::read_checkpoint(dir)?
            .unwrap_or(log_start_offset)
            .max(log_start_offset);
        let epochs = match LeaderEpochCache::load(dir)? {
            Some(epochs) => epochs,
            None if segments.iter().any(|s| s.size_bytes > 0) => {
                rebuild_epoch_cache(dir, &segments)?
            }
            None => LeaderEpochCache::empty(dir),
        };
        let mut log = PartitionLog {
            dir: dir.to_path_buf(),
            config,
            segments,
            log_start_offset,
            producers: ProducerStateManager::default(),
            unflushed_messages: 0,
            last_flush_ms: now_ms,
            scratch: Vec::new(),
            first_dirty_offset,
            epochs,
        };
        // A crash can leave the checkpoint ahead of the recovered tail (an epoch is
        // assigned before its first batch is written) or behind the segments retention
        // deleted (the files go first).
        let log_end_offset = log.log_end_offset();
        log.epochs.truncate_from_end(log_end_offset)?;
        log.epochs.truncate_from_start(log_start_offset)?;
        log.reload_tail_state(now_ms)?;
        // A crash between the checkpoint write and the segment deletes of
        // `increment_log_start_offset` leaves segments wholly below the start: delete them.
        log.delete_segments_below_start()?;
        Ok(log)
    }

    /// Producer state = snapshot at the active segment's base + the active segment's
    /// batches, which count as appended at `now_ms` (the log does not keep append times;
    /// see `producer.rs` on expiry). The same pass over the headers adds to the epoch cache any epoch newer than
    /// its latest entry (one whose checkpoint write failed), as Kafka's segment recovery
    /// does, and rebuilds the active segment's aborted transaction index from its ABORT
    /// markers (recovery: an entry whose marker a crash lost goes, one a crash kept from
    /// being written comes). An ABORT marker whose transaction start the replay does not
    /// know, or knows only from this segment (a lost snapshot), keeps the earlier first
    /// offset the old index gave it, else the replayed one, else its own offset (Kafka's
    /// default).
    fn reload_tail_state(&mut self, now_ms: i64) -> Result<(), LogError> {
        let active = self.active();
        let path = file_path(&self.dir, active.base_offset, "snapshot");
        let mut producers = ProducerStateManager::read_snapshot(&path, now_ms)?.unwrap_or_default();
        let mut newer_epochs: Vec<(i32, i64)> = Vec::new();
        let mut latest = self.epochs.latest_epoch().unwrap_or(-1);
        let previous: Vec<AbortedTxn> = active.aborted_txns()?.to_vec();
        let mut aborted = Vec::new();
        active.for_each_header_and_marker(|header, marker| {
            if let Some(entry) = apply_to_producers(&mut producers, header, marker, now_ms) {
                // The entry written at append time knew the whole transaction; a replay
                // without the snapshot only knows its part in this segment.
                let written = previous
                    .iter()
                    .find(|e| {
                        e.producer_id == entry.producer_id && e.last_offset == entry.last_offset
                    })
                    .map(|e| e.first_offset);
                let first_offset = match (entry.first_offset, written) {
                    (Some(replayed), Some(written)) => Some(replayed.min(written)),
                    (replayed, written) => replayed.or(written),
                };
                aborted.push(aborted_entry(&producers, entry, first_offset));
            }
            if header.partition_leader_epoch > latest {
                latest = header.partition_leader_epoch;
                newer_epochs.push((latest, header.base_offset));
            }
        })?;
        self.producers = producers;
        for (epoch, start_offset) in newer_epochs {
            self.epochs.assign(epoch, start_offset)?;
        }
        let count = aborted.len();
        if self.active_mut().set_aborted_txns(aborted)? {
            tracing::info!(dir = %self.dir.display(), entries = count, "rebuilt the active segment's aborted transaction index");
        }
        Ok(())
    }

    fn active(&self) -> &Segment {
        self.segments
            .last()
            .expect("a log always has an active segment")
    }

    fn active_mut(&mut self) -> &mut Segment {
        self.segments
            .last_mut()
            .expect("a log always has an active segment")
    }

    /// Offset of the first record still in the log.
    pub fn log_start_offset(&self) -> i64 {
        self.log_start_offset
    }

    /// Log end offset (LEO): the offset the next appended record gets.
    pub fn log_end_offset(&self) -> i64 {
        self.active().next_offset
    }

    /// Total bytes of all segments.
    pub fn size_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.size_bytes).sum()
    }

    /// Number of segments (at least 1).
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// The partition directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends one batch: checks idempotent-producer sequence/epoch (KIP-98), assigns
    /// offsets LEO..LEO+lastOffsetDelta, writes `options.leader_epoch` into the header,
    /// applies LogAppendTime when `options.log_append_time_ms` is set, rolls the active
    /// segment if needed (size, `segment_ms`, full index) and writes the bytes (page cache;
    /// fsync only when the flush settings say so). `now_ms` is the wall clock.
    ///
    /// A retry of one of the producer's last 5 batches returns the original offsets with
    /// `duplicate: true` and writes nothing. A transactional batch opens its producer's
    /// transaction when none is open. Errors: `InvalidProducerEpoch` (47),
    /// `OutOfOrderSequence` (45), `InvalidTxnState` (48: a non-transactional batch while the
    /// producer has a transaction open), `Io` (56; the partial write is undone).
    pub fn append(
        &mut self,
        batch: ValidatedBatch,
        options: AppendOptions,
        now_ms: i64,
    ) -> Result<AppendInfo, LogError> {
        let mut batch = batch;
        if batch.producer_id() >= 0 {
            self.producers
                .check_txn_state(batch.producer_id(), batch.is_transactional())?;
        }
        if batch.producer_id() >= 0 && batch.base_sequence() >= 0 {
            let check = self.producers.check(
                batch.producer_id(),
                batch.producer_epoch(),
                batch.base_sequence(),
                batch.last_offset_delta(),
            )?;
            match check {
                SequenceCheck::Append => {}
                SequenceCheck::Duplicate(original) => {
                    return Ok(AppendInfo {
                        base_offset: original.base_offset,
                        last_offset: original.last_offset,
                        log_append_time_ms: -1,
                        log_start_offset: self.log_start_offset,
                        duplicate: true,
                    });
                }
            }
        }
        let base_offset = self.log_end_offset();
        batch.set_base_offset(base_offset);
        batch.set_partition_leader_epoch(options.leader_epoch);
        let log_append_time_ms = match options.log_append_time_ms {
            Some(ts) => {
                batch.set_log_append_time(ts);
                ts
            }
            None => -1,
        };
        self.write_batch(&batch, now_ms)?;
        Ok(AppendInfo {
            base_offset,
            last_offset: batch.last_offset(),
            log_append_time_ms,
            log_start_offset: self.log_start_offset,
            duplicate: false,
        })
    }

    /// Appends a batch exactly as the leader stored it, for the replica fetcher (Kafka's
    /// `appendAsFollower`): baseOffset, partitionLeaderEpoch, attributes and timestamps are
    /// kept (the bytes on disk are the leader's), no sequence or epoch check is made, and
    /// producer state is updated from the header as [`PartitionLog::append`] does, so that
    /// when this replica becomes leader a producer's retry of a copied batch is answered as
    /// a duplicate (KIP-98). Rolls by the same rules, adds the batch's leader epoch to the
    /// epoch cache when it is newer than the latest (KIP-101), and follows the flush
    /// settings. Get the batches from a Fetch response with [`split_fetched`]. `now_ms` is
    /// the wall clock.
    ///
    /// The batch must start at or beyond the log end offset. Beyond it is accepted, as Kafka
    /// does: the leader's compaction removes whole batches (`compact.rs`), so the next
    /// batch it sends may start after a gap. Below it is an overlap: error
    /// `UnexpectedAppendOffset { expected: log_end_offset, got: base_offset }` (-1) and
    /// nothing is written. Other errors: `Io` (56; the partial write is undone).
    pub fn append_as_follower(
        &mut self,
        batch: ValidatedBatch,
        now_ms: i64,
    ) -> Result<AppendInfo, LogError> {
        let log_end_offset = self.log_end_offset();
        if batch.base_offset() < log_end_offset {
            return Err(LogError::UnexpectedAppendOffset {
                expected: log_end_offset,
                got: batch.base_offset(),
            });
        }
        self.write_batch(&batch, now_ms)?;
        Ok(AppendInfo {
            base_offset: batch.base_offset(),
            last_offset: batch.last_offset(),
            log_append_time_ms: match batch.timestamp_type() {
                TimestampType::LogAppendTime => batch.max_timestamp(),
                TimestampType::CreateTime => -1,
            },
            log_start_offset: self.log_start_offset,
            duplicate: false,
        })
    }

    /// The write shared by both appends, for a batch whose header is final: roll if due,
    /// note its leader epoch (before the bytes, so a crash leaves no batch whose epoch the
    /// cache lacks), write, update producer state (an ABORT marker also adds an entry to
    /// the active segment's aborted transaction index, after the bytes: recovery rebuilds
    /// it if a crash comes between), flush if the settings say so.
    fn write_batch(&mut self, batch: &ValidatedBatch, now_ms: i64) -> Result<(), LogError> {
        if self.should_roll(batch, now_ms) {
            self.roll(now_ms)?;
        }
        self.epochs
            .assign(batch.partition_leader_epoch(), batch.base_offset())?;
        let mut scratch = std::mem::take(&mut self.scratch);
        let appended = self.active_mut().append(batch, &mut scratch);
        self.scratch = scratch;
        appended?;
        let header = batch::BatchHeader::parse(batch.header());
        let marker = txn::parse_marker(&header, batch.records());
        if let Some(completed) = apply_to_producers(&mut self.producers, &header, marker, now_ms) {
            let entry = aborted_entry(&self.producers, completed, completed.first_offset);
            self.active_mut().append_aborted_txn(entry)?;
        }
        self.unflushed_messages += batch.record_count().max(0) as u64;
        let due_by_count = self
            .config
            .flush_messages
            .is_some_and(|n| self.unflushed_messages >= n);
        if due_by_count || self.flush_due_by_time(now_ms) {
            self.flush_at(now_ms)?;
        }
        Ok(())
    }

    /// Appends a transaction marker as the partition's leader (KIP-98; Kafka's
    /// `UnifiedLog.appendAsLeader` with a control batch from `WriteTxnMarkers`): one
    /// control batch, attributes transactional + control, baseSequence -1, one
    /// `EndTransactionMarker` record (COMMIT when `commit`, else ABORT, with
    /// `coordinator_epoch`) timestamped `now_ms` (CreateTime), stamped with
    /// `options.leader_epoch`. It ends `producer_id`'s ongoing transaction; an ABORT adds
    /// an entry to the active segment's aborted transaction index. A marker for a producer
    /// with no transaction open here is written all the same (Kafka does; it ends
    /// nothing, and an ABORT's index entry covers only the marker).
    ///
    /// Errors: `InvalidProducerEpoch` (47) when `producer_epoch` is below the producer's
    /// known epoch; `TransactionCoordinatorFenced` (52) when `coordinator_epoch` is below
    /// the last one seen for the producer; `Io` (56). Nothing is written on error.
    pub fn append_txn_marker(
        &mut self,
        producer_id: i64,
        producer_epoch: i16,
        marker: TxnMarker,
        options: AppendOptions,
        now_ms: i64,
    ) -> Result<AppendInfo, LogError> {
        self.producers
            .check_marker(producer_id, producer_epoch, marker.coordinator_epoch)?;
        let mut batch = txn::encode_marker(producer_id, producer_epoch, marker, now_ms);
        let base_offset = self.log_end_offset();
        batch.set_base_offset(base_offset);
        batch.set_partition_leader_epoch(options.leader_epoch);
        self.write_batch(&batch, now_ms)?;
        Ok(AppendInfo {
            base_offset,
            last_offset: base_offset,
            log_append_time_ms: -1,
            log_start_offset: self.log_start_offset,
            duplicate: false,
        })
    }

    /// Whether `producer_id` has a transaction open in this log (a transactional batch
    /// and no marker after it).
    pub fn has_ongoing_txn(&self, producer_id: i64) -> bool {
        self.producers.has_ongoing_txn(producer_id)
    }

    /// Whether a batch of `producer_id` at `producer_epoch` must start at sequence 0 (it
    /// is the producer's first at that epoch here).
    pub fn expects_first_sequence(&self, producer_id: i64, producer_epoch: i16) -> bool {
        self.producers
            .expects_first_sequence(producer_id, producer_epoch)
    }

    /// Whether `producer_id` has a transaction open in this log at `producer_epoch`.
    pub fn has_ongoing_txn_at(&self, producer_id: i64, producer_epoch: i16) -> bool {
        self.producers
            .has_ongoing_txn_at(producer_id, producer_epoch)
    }

    /// The first offset a read_committed consumer may not read yet, given the high
    /// watermark (Kafka's `firstUnstableOffset`): the first offset of the earliest
    /// transaction that is open, or whose marker is at or above `high_watermark` (not yet
    /// replicated). `None` when none is. The owner takes the last stable offset as
    /// `min(high_watermark, this)`, at least the log start offset.
    pub fn first_unstable_offset(&self, high_watermark: i64) -> Option<i64> {
        self.producers.first_unstable_offset(high_watermark)
    }

    /// Forgets the completed transactions whose marker is below `high_watermark` (they
    /// are stable for good). Call after the high watermark moves; only bounds memory.
    pub fn prune_replicated_txns(&mut self, high_watermark: i64) {
        self.producers.prune_replicated(high_watermark);
    }

    /// The producers this log knows, by id (DescribeProducers, KIP-664).
    pub fn producer_summaries(&self) -> Vec<ProducerSummary> {
        self.producers.summaries()
    }

    /// The aborted transactions a read_committed consumer needs to read
    /// `[fetch_offset, upper_bound_offset]` (Kafka's `collectAbortedTransactions`): every
    /// entry of the aborted transaction indexes, from the segment holding `fetch_offset`
    /// to the last one (a transaction may span segments, and its marker, which holds the
    /// entry, may lie past the read), whose range overlaps it: `last_offset >=
    /// fetch_offset` and `first_offset <= upper_bound_offset`. Ordered by marker offset.
    ///
    /// Errors: `Io` (reading a closed segment's `.txnindex`).
    pub fn collect_aborted_txns(
        &self,
        fetch_offset: i64,
        upper_bound_offset: i64,
    ) -> Result<Vec<AbortedTxn>, LogError> {
        let first = self
            .segments
            .partition_point(|s| s.base_offset <= fetch_offset)
            .saturating_sub(1);
        let mut out = Vec::new();
        for segment in &self.segments[first..] {
            out.extend(
                segment.aborted_txns()?.iter().filter(|e| {
                    e.last_offset >= fetch_offset && e.first_offset <= upper_bound_offset
                }),
            );
        }
        Ok(out)
    }

    /// Per producer with a transaction open, its first offset (for the cleaner).
    fn ongoing_txns(&self) -> std::collections::HashMap<i64, i64> {
        self.producers.ongoing_txns()
    }

    /// Every aborted transaction of every segment's index (for the cleaner).
    fn all_aborted_txns(&self) -> Result<Vec<AbortedTxn>, LogError> {
        let mut out = Vec::new();
        for segment in &self.segments {
            out.extend_from_slice(segment.aborted_txns()?);
        }
        Ok(out)
    }

    /// The newest leader epoch that wrote to this log, from the epoch cache (`None` for a
    /// log no epoch has written to, or whose entries truncation removed).
    pub fn latest_epoch(&self) -> Option<i32> {
        self.epochs.latest_epoch()
    }

    /// OffsetsForLeaderEpoch for this partition (KIP-101; with the epoch, KIP-279), Kafka's
    /// `LeaderEpochFileCache.endOffsetFor`: where `requested_epoch` ended in this log.
    ///
    /// - `requested_epoch` is the latest epoch: `(requested_epoch, log end offset)`;
    /// - an older epoch: `(largest epoch <= requested_epoch, start offset of the next
    ///   epoch in the cache)`, so a follower truncates to where the leader's history and
    ///   its own part;
    /// - older than every epoch the cache still holds (retention removed them):
    ///   `(requested_epoch, start offset of the first epoch)`, as Kafka answers: that data
    ///   is gone and the follower should replicate from there;
    /// - negative (`UNDEFINED_EPOCH`), newer than the latest, or an empty cache:
    ///   [`EpochEndOffset::UNDEFINED`] (-1, -1).
    pub fn end_offset_for_epoch(&self, requested_epoch: i32) -> EpochEndOffset {
        self.epochs
            .end_offset_for(requested_epoch, self.log_end_offset())
    }

    /// Records that `leader_epoch` starts at the log end offset, when it is newer than the
    /// latest epoch: what Kafka's `Partition.makeLeader` does through
    /// `maybeAssignEpochStartOffset` when a replica becomes leader, before it has appended
    /// anything in that epoch, so that a follower asking OffsetsForLeaderEpoch for the
    /// previous epoch gets its end offset rather than UNDEFINED (KIP-279). An entry no
    /// batch follows is dropped at the next open (it starts at the log end offset) and
    /// replaced by the next newer epoch at the same offset. Errors: `Io` (56).
    pub fn assign_epoch_start_offset(&mut self, leader_epoch: i32) -> Result<(), LogError> {
        let log_end_offset = self.log_end_offset();
        self.epochs.assign(leader_epoch, log_end_offset)
    }

    fn should_roll(&self, batch: &ValidatedBatch, now_ms: i64) -> bool {
        let active = self.active();
        if active.size_bytes == 0 {
            return false;
        }
        let too_big = active.size_bytes + batch.len() as u64 > self.config.segment_bytes;
        let waited_ms = match active.first_batch_timestamp_ms {
            Some(first) if batch.max_timestamp() >= 0 => batch.max_timestamp() - first,
            _ => now_ms - active.created_ms,
        };
        let too_old = waited_ms > self.config.segment_ms;
        let relative_overflow = batch.last_offset() - active.base_offset > i64::from(u32::MAX);
        too_big
            || too_old
            || relative_overflow
            || active.index_full(self.config.segment_index_bytes)
    }

    /// Closes the active segment (final time index entry, producer snapshot) and starts a
    /// new one at the LEO.
    fn roll(&mut self, now_ms: i64) -> Result<(), LogError> {
        let fsync = self.config.flush_messages.is_some() || self.config.flush_ms.is_some();
        let leo = self.log_end_offset();
        self.active_mut().close(fsync)?;
        self.producers
            .write_snapshot(&file_path(&self.dir, leo, "snapshot"))?;
        let segment = Segment::create(&self.dir, leo, self.config.index_interval_bytes, now_ms)?;
        self.segments.push(segment);
        tracing::debug!(dir = %self.dir.display(), base_offset = leo, "rolled new segment");
        Ok(())
    }

    /// Whole batches from the one containing `offset` (KIP-74: the first batch is whole
    /// even when larger than `max_bytes`; later ones only while the total stays within
    /// `max_bytes`), from one segment, and only batches whose last offset is below
    /// `max_offset` (the caller passes the high watermark, or the LEO).
    ///
    /// `offset == LEO` (or a batch beyond `max_offset`) gives an empty result. Errors:
    /// `OffsetOutOfRange` (1) when `offset < log_start_offset` or `> LEO`; `Corrupt` when a
    /// stored header does not carry the expected offsets; `Io`.
    pub fn read(
        &self,
        offset: i64,
        max_bytes: usize,
        max_offset: i64,
    ) -> Result<ReadResult, LogError> {
        for segment in self.segments_to_read(offset, max_offset)? {
            if let Some((bytes, first_batch_base_offset)) =
                segment.read(offset, max_bytes, max_offset)?
            {
                return Ok(ReadResult {
                    bytes,
                    first_batch_base_offset,
                });
            }
        }
        Ok(ReadResult {
            bytes: Bytes::new(),
            first_batch_base_offset: None,
        })
    }

    /// The segments a read at `offset` bounded by `max_offset` walks, from the one that
    /// may hold `offset`; none when `offset` is the LEO or at or past `max_offset`.
    /// Errors: `OffsetOutOfRange` (1) when `offset < log_start_offset` or `> LEO`.
    fn segments_to_read(&self, offset: i64, max_offset: i64) -> Result<&[Segment], LogError> {
        let leo = self.log_end_offset();
        if offset < self.log_start_offset || offset > leo {
            return Err(LogError::OffsetOutOfRange {
                offset,
                log_start_offset: self.log_start_offset,
                log_end_offset: leo,
            });
        }
        if offset == leo || offset >= max_offset {
            return Ok(&[]);
        }
        let first = self
            .segments
            .partition_point(|s| s.base_offset <= offset)
            .saturating_sub(1);
        Ok(&self.segments[first..])
    }

    /// [`PartitionLog::read`] as a byte range of one segment file instead of a copy
    /// ([`FileRegion`]): the same batches, the same limits and errors. `Ok(None)` when
    /// nothing is readable below `max_offset`.
    pub fn read_region(
        &self,
        offset: i64,
        max_bytes: usize,
        max_offset: i64,
    ) -> Result<Option<FileRegion>, LogError> {
        for segment in self.segments_to_read(offset, max_offset)? {
            if let Some(region) = segment.read_region(offset, max_bytes, max_offset)? {
                return Ok(region);
            }
        }
        Ok(None)
    }

    /// ListOffsets by timestamp (protocol guide, ListOffsets; KIP-79): the first record
    /// whose timestamp is >= `ts_ms`, as `(offset, timestamp_ms)`. Segments are chosen by
    /// their largest timestamp, then the time index and offset index narrow the scan to
    /// the first batch whose maxTimestamp >= `ts_ms`. Inside that batch the answer is
    /// record-exact for uncompressed CreateTime batches; for compressed or LogAppendTime
    /// batches it is the batch's base offset and maxTimestamp (the log never
    /// decompresses). `None` when no record is that recent. The special timestamps -1, -2
    /// and -3 are the caller's (LEO, log start, [`PartitionLog::max_timestamp`]). An answer
    /// below the log start offset is raised to it.
    pub fn offset_for_timestamp(&self, ts_ms: i64) -> Result<Option<(i64, i64)>, LogError> {
        for segment in &self.segments {
            if segment.max_timestamp_ms >= ts_ms && segment.size_bytes > 0 {
                if let Some((offset, timestamp_ms)) = segment.find_by_timestamp(ts_ms)? {
                    // Records below a DeleteRecords start are gone even if still on disk.
                    return Ok(Some((offset.max(self.log_start_offset), timestamp_ms)));
                }
            }
        }
        Ok(None)
    }

    /// ListOffsets -3 (KIP-734): `(offset, timestamp_ms)` of the record with the largest
    /// timestamp (the first such on ties; record-exact for uncompressed CreateTime
    /// batches, else the batch's base offset). `None` for an empty log or one without
    /// timestamps.
    ///
    /// API change from the brief: returns `Result` because it may read a batch from disk.
    pub fn max_timestamp(&self) -> Result<Option<(i64, i64)>, LogError> {
        let mut best: Option<&Segment> = None;
        for segment in &self.segments {
            if segment.size_bytes > 0
                && segment.max_timestamp_ms >= 0
                && best.is_none_or(|b| segment.max_timestamp_ms > b.max_timestamp_ms)
            {
                best = Some(segment);
            }
        }
        match best {
            Some(segment) => segment.max_timestamp_record(),
            None => Ok(None),
        }
    }

    /// Forgets the idempotent producers whose last append, on the broker's wall clock, is
    /// `expiration_ms` (Kafka `producer.id.expiration.ms`) or more before `now_ms` (the
    /// wall clock); never by the timestamps inside their batches, which are the client's
    /// (issue 15). A forgotten producer's next batch is accepted with any sequence
    /// (KIP-360), so a retry after that could be appended twice: hence a day by default.
    /// Returns how many were forgotten. Kafka's `removeExpiredProducers`, run every
    /// `producer.id.expiration.check.interval.ms` by the broker.
    pub fn expire_producers(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
        self.producers.expire(now_ms, expiration_ms)
    }

    /// With `cleanup.policy` containing `delete`: deletes the oldest segments that are past
    /// `retention_ms` (their largest timestamp, or file mtime when they have none, is older
    /// than `now_ms - retention_ms`) and then those that keep the log above
    /// `retention_bytes`, oldest first, never leaving a gap. A closed segment that
    /// compaction emptied holds nothing and goes with its neighbours. If every segment, the
    /// active one included, is to go, it rolls first so the active segment is new and empty
    /// and the log start offset becomes the LEO (new records continue from there). The
    /// epoch cache follows the new log start (Kafka's `truncateFromStart`). Without
    /// `delete` (`cleanup.policy=compact` alone) no segment is deleted, as in Kafka.
    /// Returns the number of segments deleted. The caller
    /// must not call it with data above the high watermark it cares about (single node:
    /// HW = LEO).
    pub fn apply_retention(&mut self, now_ms: i64) -> Result<usize, LogError> {
        if !self.config.cleanup_policy.delete {
            return Ok(0);
        }
        let count = self.segments.len();
        let emptied_closed = |i: usize, s: &Segment| s.size_bytes == 0 && i + 1 < count;
        let mut deletable = 0usize;
        if self.config.retention_ms >= 0 {
            while deletable < count {
                let segment = &self.segments[deletable];
                if emptied_closed(deletable, segment) {
                    deletable += 1;
                    continue;
                }
                if segment.size_bytes == 0 {
                    break;
                }
                let largest_ms = if segment.max_timestamp_ms >= 0 {
                    segment.max_timestamp_ms
                } else {
                    segment.modified_ms()?
                };
                if now_ms - largest_ms > self.config.retention_ms {
                    deletable += 1;
                } else {
                    break;
                }
            }
            // Emptied segments are deleted only together with an expired one after them.
            while deletable > 0 && emptied_closed(deletable - 1, &self.segments[deletable - 1]) {
                deletable -= 1;
            }
        }
        if self.config.retention_bytes >= 0 {
            let remaining: u64 = self.segments[deletable..]
                .iter()
                .map(|s| s.size_bytes)
                .sum();
            let mut excess = remaining as i64 - self.config.retention_bytes;
            let mut candidate = deletable;
            while candidate < count {
                let segment = &self.segments[candidate];
                if emptied_closed(candidate, segment) {
                    candidate += 1;
                    continue;
                }
                let size = segment.size_bytes as i64;
                if size == 0 || excess - size < 0 {
                    break;
                }
                excess -= size;
                candidate += 1;
                deletable = candidate;
            }
        }
        if deletable == 0 {
            return Ok(0);
        }
        if deletable == count {
            self.roll(now_ms)?;
        }
        let removed: Vec<Segment> = self.segments.drain(..deletable).collect();
        // A DeleteRecords start inside the (now) first segment stays.
        self.log_start_offset = self.log_start_offset.max(self.segments[0].base_offset);
        for segment in removed {
            tracing::info!(
                dir = %self.dir.display(),
                base_offset = segment.base_offset,
                size_bytes = segment.size_bytes,
                "retention deleted segment"
            );
            segment.delete_files()?;
        }
        // After the files: a crash in between is repaired by `open`.
        self.epochs.truncate_from_start(self.log_start_offset)?;
        Ok(deletable)
    }

    /// fsyncs the active segment and its indexes (and the directory, for new files).
    /// Errors: `Io` (56).
    pub fn flush(&mut self) -> Result<(), LogError> {
        let now_ms = self.last_flush_ms;
        self.flush_at(now_ms)
    }

    /// Swaps the config used from now on (topic config changed at run time): later rolls,
    /// retention runs and flushes follow it; nothing already written is rewritten (an
    /// existing segment keeps its index interval until it rolls).
    ///
    /// Errors: `InvalidConfig` (the old config stays).
    pub fn set_config(&mut self, config: LogConfig) -> Result<(), LogError> {
        check_config(&config)?;
        self.config = config;
        Ok(())
    }

    /// The config in use.
    pub fn config(&self) -> &LogConfig {
        &self.config
    }

    /// Closes every segment's files, as the descriptor cache may at any time (tests).
    #[cfg(test)]
    pub(crate) fn close_files(&self) {
        self.segments.iter().for_each(Segment::close_files);
    }

    /// Descriptors the segments hold open (tests).
    #[cfg(test)]
    pub(crate) fn open_files(&self) -> usize {
        self.segments.iter().map(Segment::open_files).sum()
    }

    /// Flushes if `flush_ms` has passed since the last flush and records are unflushed
    /// (what Kafka's periodic log flusher does). Returns whether it flushed.
    pub fn maybe_flush(&mut self, now_ms: i64) -> Result<bool, LogError> {
        if self.unflushed_messages > 0 && self.flush_due_by_time(now_ms) {
            self.flush_at(now_ms)?;
            return Ok(true);
        }
        Ok(false)
    }

    fn flush_due_by_time(&self, now_ms: i64) -> bool {
        self.config
            .flush_ms
            .is_some_and(|ms| now_ms - self.last_flush_ms >= ms)
    }

    fn flush_at(&mut self, now_ms: i64) -> Result<(), LogError> {
        self.active().sync()?;
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io_error("fsync", &self.dir))?;
        self.unflushed_messages = 0;
        self.last_flush_ms = now_ms;
        Ok(())
    }

    /// Closes the log and removes its directory and everything in it, at once. The
    /// broker's deletes rename the directory first and remove it later (`delete.rs`).
    /// Errors: `Io` (56).
    pub fn delete(self) -> Result<(), LogError> {
        let dir = self.dir.clone();
        drop(self);
        std::fs::remove_dir_all(&dir).map_err(io_error("remove", &dir))
    }

    /// Removes every record and restarts the log, empty, at `offset` (Kafka's
    /// `truncateFullyAndStartAt`): a follower whose log end offset is below the leader's
    /// log start offset (retention or DeleteRecords ran on the leader while it was away,
    /// or a new replica of a partition whose beginning is gone) can only go on from the
    /// leader's log start. Producer state and the leader epoch cache are cleared; the new
    /// leader's batches bring their epochs. For replication (follower fetch).
    /// Errors: `Io`.
    pub fn truncate_fully_and_start_at(
        &mut self,
        offset: i64,
        now_ms: i64,
    ) -> Result<(), LogError> {
        while let Some(segment) = self.segments.pop() {
            segment.delete_files()?;
        }
        let segment = Segment::create(&self.dir, offset, self.config.index_interval_bytes, now_ms)?;
        self.segments.push(segment);
        self.log_start_offset = offset;
        remove_if_exists(&self.dir.join(LOG_START_OFFSET_CHECKPOINT_FILE))?;
        self.first_dirty_offset = offset;
        self.producers = ProducerStateManager::default();
        self.epochs.truncate_from_end(i64::MIN)?;
        Ok(())
    }

    /// Removes every record at or above `offset` (a batch containing `offset` goes
    /// entirely, as in Kafka, so the LEO may end below `offset`). `offset >= LEO` removes
    /// no record; `offset <= log_start_offset` empties the log and restarts it at `offset`,
    /// and so does a truncation whose removed batch also held the log start (restarted at
    /// that batch's base offset, the new log end). Producer state is reloaded for the new
    /// tail. Leader epochs starting at or after the new LEO leave the epoch cache (Kafka's
    /// `truncateFromEnd`), also when no record goes: an epoch this replica assigned as
    /// leader ([`PartitionLog::assign_epoch_start_offset`]) without writing anything must
    /// not shadow the older epoch of the batches the new leader sends from there. For
    /// replication (follower truncation).
    /// Errors: `Io`, `Corrupt`.
    pub fn truncate_to(&mut self, offset: i64, now_ms: i64) -> Result<(), LogError> {
        let log_end_offset = self.log_end_offset();
        if offset >= log_end_offset {
            // No record goes, but an epoch assigned at the LEO does (Kafka's `truncateTo`).
            return self.epochs.truncate_from_end(log_end_offset);
        }
        self.first_dirty_offset = self.first_dirty_offset.min(offset);
        if offset <= self.log_start_offset {
            while let Some(segment) = self.segments.pop() {
                segment.delete_files()?;
            }
            let segment =
                Segment::create(&self.dir, offset, self.config.index_interval_bytes, now_ms)?;
            self.segments.push(segment);
            self.log_start_offset = offset;
            remove_if_exists(&self.dir.join(LOG_START_OFFSET_CHECKPOINT_FILE))?;
            self.producers = ProducerStateManager::default();
            self.epochs.truncate_from_end(offset)?;
            return Ok(());
        }
        // Newest first, so a crash leaves a prefix of segments.
        while self.active().base_offset >= offset {
            let segment = self
                .segments
                .pop()
                .expect("offset > log start keeps a segment");
            segment.delete_files()?;
        }
        self.active_mut().truncate_to(offset, now_ms)?;
        // The new end, not `offset`: a batch containing `offset` went whole. After the
        // segments, so a crash in between is repaired by `open`.
        let log_end_offset = self.log_end_offset();
        if log_end_offset < self.log_start_offset {
            // That batch also held the log start (DeleteRecords, or a follower taking
            // its leader's, moved it inside the batch): nothing readable is left. The log
            // restarts empty at its new end, where the follower fetches the batch again
            // (Kafka's follower restarts so, `truncateFullyAndStartAt`, when a batch
            // starts below its log start); a log start above the log end would break
            // every reader's `log start <= high watermark <= log end`.
            return self.truncate_fully_and_start_at(log_end_offset, now_ms);
        }
        self.epochs.truncate_from_end(log_end_offset)?;
        self.reload_tail_state(now_ms)?;
        Ok(())
    }

    /// Moves the log start offset up to `new_start` (Kafka's
    /// `UnifiedLog.maybeIncrementLogStartOffset`, for DeleteRecords on the leader and for a
    /// follower following its leader's log start): records below it are no longer read
    /// (a read below it is OFFSET_OUT_OF_RANGE, ListOffsets earliest answers it), segments
    /// wholly below it are deleted, and the epoch cache and the cleaner's checkpoint follow.
    /// The new start is made durable first, in `log-start-offset-checkpoint` in the
    /// partition directory (Kafka keeps one such file per log dir; one per partition here,
    /// like `cleaner-offset-checkpoint`), so a restart keeps it even when it is inside a
    /// segment. `max_offset` is the highest start allowed: the high watermark on the
    /// leader (the caller passes it; the log knows no high watermark).
    ///
    /// Returns whether the start moved (`new_start <= log_start_offset` changes nothing).
    /// Errors: `OffsetOutOfRange` (1) when `new_start > max_offset` or `> LEO`; `Io` (56).
    pub fn increment_log_start_offset(
        &mut self,
        new_start: i64,
        max_offset: i64,
    ) -> Result<bool, LogError> {
        let log_end_offset = self.log_end_offset();
        if new_start > max_offset || new_start > log_end_offset {
            return Err(LogError::OffsetOutOfRange {
                offset: new_start,
                log_start_offset: self.log_start_offset,
                log_end_offset,
            });
        }
        if new_start <= self.log_start_offset {
            return Ok(false);
        }
        checkpoint::write_atomically(
            &self.dir,
            LOG_START_OFFSET_CHECKPOINT_FILE,
            &format!("{new_start}\n"),
        )?;
        self.log_start_offset = new_start;
        self.first_dirty_offset = self.first_dirty_offset.max(new_start);
        self.delete_segments_below_start()?;
        Ok(true)
    }

    /// Deletes the closed segments whose records all lie below the log start offset (the
    /// next segment starts at or before it), oldest first; the active segment stays. The
    /// epoch cache is then truncated from the start.
    fn delete_segments_below_start(&mut self) -> Result<(), LogError> {
        let deletable = self
            .segments
            .windows(2)
            .take_while(|pair| pair[1].base_offset <= self.log_start_offset)
            .count();
        if deletable > 0 {
            let removed: Vec<Segment> = self.segments.drain(..deletable).collect();
            for segment in removed {
                tracing::info!(
                    dir = %self.dir.display(),
                    base_offset = segment.base_offset,
                    log_start_offset = self.log_start_offset,
                    "deleted segment below the log start offset"
                );
                segment.delete_files()?;
            }
        }
        self.epochs.truncate_from_start(self.log_start_offset)
    }
}

/// File in the partition directory holding the log start offset DeleteRecords (or a
/// follower following its leader) set, as one decimal line (the role of Kafka's
/// per-log-dir `log-start-offset-checkpoint`). Absent: the first segment's base offset.
pub const LOG_START_OFFSET_CHECKPOINT_FILE: &str = "log-start-offset-checkpoint";

/// The checkpointed log start offset of the partition in `dir`, if any. A malformed or
/// unreadable file is logged and ignored (the start is then the first segment's base).
fn read_log_start_checkpoint(dir: &Path) -> Option<i64> {
    let path = dir.join(LOG_START_OFFSET_CHECKPOINT_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => match text.trim().parse::<i64>() {
            Ok(offset) if offset >= 0 => Some(offset),
            _ => {
                tracing::warn!(file = %path.display(), "malformed log start offset checkpoint; ignored");
                None
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "unreadable log start offset checkpoint; ignored");
            None
        }
    }
}

/// Applies one stored batch to producer state (the one path for leader and follower
/// appends and the replay at open): a control batch holding a marker completes its
/// producer's transaction, any other batch is recorded as data. Returns the completed
/// transaction when the marker was an ABORT (it needs an aborted index entry).
fn apply_to_producers(
    producers: &mut ProducerStateManager,
    header: &batch::BatchHeader,
    marker: Option<TxnMarker>,
    now_ms: i64,
) -> Option<CompletedTxn> {
    match marker {
        Some(m) => {
            let completed = producers.complete_txn(header, m.commit, m.coordinator_epoch, now_ms);
            completed.aborted.then_some(completed)
        }
        // A control batch without a known marker changes nothing (`update` skips batches
        // without a sequence, as control batches are).
        None => {
            producers.update(header, now_ms);
            None
        }
    }
}

/// The aborted index entry of `completed` (an ABORT), with `first_offset` (its marker's
/// own offset when unknown, Kafka's default) and, as last stable offset, the first offset
/// of the earliest transaction still open after it, else the marker's offset + 1
/// (Kafka's `ProducerStateManager.lastStableOffset(completedTxn)`).
fn aborted_entry(
    producers: &ProducerStateManager,
    completed: CompletedTxn,
    first_offset: Option<i64>,
) -> AbortedTxn {
    let still_open = producers.ongoing_txns().into_values().min();
    AbortedTxn {
        producer_id: completed.producer_id,
        first_offset: first_offset.unwrap_or(completed.last_offset),
        last_offset: completed.last_offset,
        last_stable_offset: still_open.unwrap_or(completed.last_offset + 1),
    }
}
