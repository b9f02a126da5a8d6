//! Records the broker writes itself: transform outputs, dead-letter records, the HTTP
//! produce endpoint and connector source records (which ask [`Ingest::first_refused`]
//! first, so they never append past a record that cannot be written).
//!
//! [`Ingest::append`] / [`Ingest::append_each`] take plain records for one topic, choose
//! each record's partition — the caller's choice, else the topic's partitioner —, encode
//! record batches (magic 2, uncompressed, CreateTime; split so that none exceeds
//! `max.message.bytes`) per partition and append them through the replica manager when
//! this broker leads the partition, else forward them to its leader as a Produce
//! (`peer`); either way as a Produce with acks=all (the in-sync replicas have each batch
//! before it is answered). A batch appended here goes through the topic's inline
//! transform first, as a produced one does (a forwarded one meets it on the leader); a
//! refusal is the transform's Kafka error. The topic is auto-created when
//! `auto.create.topics.enable` allows.
//!
//! The topic's partitioner is its `partitioner` setting (topic-level, falling back to the
//! broker's `partitioner.file`): empty means Kafka's default (murmur2 of the key, masked
//! positive, mod partitions — the Java client's, librdkafka's `murmur2_random` —; keyless
//! records round-robin); otherwise the path of a partitioner component on the broker
//! host, opened with `partitioner.config` (`key=value` pairs). Loaded components are kept
//! per (path, config) and reloaded when the file's modification time or size changes (at
//! most [`MAX_CACHED_PARTITIONERS`]); one instance per entry, so concurrent appends
//! through the same partitioner take turns.
//!
//! Failures of the partitioner are never papered over by another partitioner: a component
//! that cannot be loaded fails every record that needed it (INVALID_CONFIG: the topic's
//! setting is wrong), and a call that traps, times out or returns a partition out of
//! range fails that record (INVALID_RECORD); the other records are written.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use kafka_protocol::ResponseError;

use crate::cluster::{is_internal_topic, TopicMeta};
use crate::config::parse_plugin_config;
use crate::log::{plain, split_batches};
use crate::peer::PeerClients;
use crate::plugin::{Partitioner, PluginHost, Record};
use crate::replica::{effective_topic_configs, produce_settings, Partition, ProduceSettings};
use crate::topics::{self, Topics};
use crate::transform::apply as inline;
use crate::transform::inline::InlineRegistry;
use crate::txn::producer::BatchProducer;

/// Kafka's key hash: `murmur2(bytes)` as the Java client's `Utils.murmur2` computes it,
/// and `partition_for_bytes` (masked positive, mod the partition count). The one copy is
/// the guest SDK's file, compiled here too, so the broker's default partitioner and the
/// `murmur2`/`json-field` plugins cannot drift apart.
#[path = "../plugins/sdk/src/murmur2.rs"]
pub mod murmur2;
use murmur2::partition_for_bytes;

/// Most partitioner components kept loaded; the least recently used goes first.
pub const MAX_CACHED_PARTITIONERS: usize = 64;

/// How long a write waits for every in-sync replica to have its batch (acks=all), here
/// or on the leader it is forwarded to: the Java producer's `request.timeout.ms` default.
const ACKS_TIMEOUT_MS: i32 = 30_000;

/// Bytes of a record batch before its records (magic 2 header).
const BATCH_HEADER_BYTES: usize = 61;

/// Why records could not be written: the Kafka error a Produce would have got, and a
/// message for logs and HTTP bodies.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message} (Kafka error {})", error.code())]
pub struct IngestError {
    /// The Kafka error code (UNKNOWN_TOPIC_OR_PARTITION, INVALID_TOPIC_EXCEPTION,
    /// MESSAGE_TOO_LARGE, INVALID_RECORD, INVALID_CONFIG, KAFKA_STORAGE_ERROR, ...).
    pub error: ResponseError,
    /// What went wrong, naming the topic and partition.
    pub message: String,
}

impl IngestError {
    fn new(error: ResponseError, message: impl Into<String>) -> IngestError {
        IngestError {
            error,
            message: message.into(),
        }
    }
}

/// Where one record went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// Partition index.
    pub partition: i32,
    /// The record's offset.
    pub offset: i64,
    /// The record's timestamp as stored: the log-append time on a `LogAppendTime` topic,
    /// else the record's own (ms since the Unix epoch).
    pub timestamp_ms: i64,
}

/// The outcome of one record of [`Ingest::append_each`].
pub type RecordResult = Result<Appended, IngestError>;

/// A cached partitioner: the file's identity when loaded, and the instance.
struct CachedPartitioner {
    modified: Option<SystemTime>,
    len: u64,
    last_used: u64,
    partitioner: Arc<tokio::sync::Mutex<Partitioner>>,
}

/// How a topic chooses partitions for records without one.
enum TopicPartitioner {
    /// Kafka's default (murmur2 / round-robin).
    Default,
    /// A component, loaded.
    Plugin(Arc<tokio::sync::Mutex<Partitioner>>),
    /// A component that could not be loaded: every record needing it fails with this.
    Broken(IngestError),
}

/// Writes records into the broker's own logs (see the module docs).
pub struct Ingest {
    /// The owners records and topics are written through (as the protocol layer does).
    topics: Topics,
    plugins: Arc<PluginHost>,
    /// Round-robin counter for keyless records (Kafka's default spreads them).
    next_keyless: AtomicU32,
    /// Loaded partitioners by (path, config text).
    partitioners: Mutex<HashMap<(PathBuf, String), CachedPartitioner>>,
    /// Logical clock for the partitioner cache's LRU.
    uses: AtomicU64,
    /// Connections to the other brokers, for partitions another broker leads.
    peers: Arc<PeerClients>,
    /// Inline transforms, by input topic: a batch appended here goes through its topic's
    /// as a produced one does (a forwarded one meets it on the leader).
    inline: Arc<InlineRegistry>,
}

impl std::fmt::Debug for Ingest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ingest").finish_non_exhaustive()
    }
}

impl Ingest {
    /// An ingest path writing through `topics`' owners (auto-creating topics as a
    /// Produce would), loading partitioners through `plugins`, applying the inline
    /// transforms of `inline` to what it appends here.
    pub fn new(topics: Topics, plugins: Arc<PluginHost>, inline: Arc<InlineRegistry>) -> Ingest {
        let peers = Arc::new(PeerClients::new(
            topics.metadata.clone(),
            topics.config.clone(),
        ));
        Ingest {
            peers,
            inline,
            topics,
            plugins,
            next_keyless: AtomicU32::new(0),
            partitioners: Mutex::new(HashMap::new()),
            uses: AtomicU64::new(0),
        }
    }

    /// The connections to the other brokers this ingest forwards through (shared with
    /// the connect runtime's internal topics).
    pub(crate) fn peers(&self) -> Arc<PeerClients> {
        self.peers.clone()
    }

    /// The connections to the other brokers, borrowed.
    pub(crate) fn peers_ref(&self) -> &PeerClients {
        &self.peers
    }

    /// The topic, auto-created when the broker allows it.
    ///
    /// Errors: INVALID_TOPIC_EXCEPTION (17) for an internal or invalid name,
    /// UNKNOWN_TOPIC_OR_PARTITION (3) when it does not exist and auto-creation is off.
    pub fn topic(&self, topic: &str) -> Result<TopicMeta, IngestError> {
        if is_internal_topic(topic) {
            return Err(IngestError::new(
                ResponseError::InvalidTopicException,
                format!("cannot write to internal topic {topic}"),
            ));
        }
        topics::get_or_auto_create(&self.topics, topic, true)
            .map_err(|e| IngestError::new(e.error, format!("topic {topic}: {}", e.message)))
    }

    /// The first of `records` that can never be appended to `meta`'s topic, whichever
    /// partition and however often it is tried (checked as [`Ingest::append_each`]
    /// checks each record, with the topic's settings), with its position and why:
    /// INVALID_RECORD (87) for a keyless record on a compacted topic, MESSAGE_TOO_LARGE
    /// (10) when it alone exceeds `max.message.bytes`. `None`: all fit. A writer that
    /// must keep records in order (a source connector) asks before appending, so it
    /// never appends what follows a record that will fail.
    pub fn first_refused<'a>(
        &self,
        meta: &TopicMeta,
        records: impl IntoIterator<Item = &'a Record>,
    ) -> Option<(usize, IngestError)> {
        let image = self.topics.metadata.image();
        let settings = produce_settings(&self.topics.config, image.dynamic_layers(), &meta.configs);
        records.into_iter().enumerate().find_map(|(i, r)| {
            refusal(&settings, r).map(|(error, message)| {
                (
                    i,
                    IngestError::new(error, format!("{}: {message}", meta.name)),
                )
            })
        })
    }

    /// Kafka's default partition for a record: murmur2 of the key (masked positive, mod
    /// `partitions`) — the same as the Java client, librdkafka's `murmur2_random` and the
    /// `murmur2` plugin —, keyless records round-robin. `partitions` ≥ 1.
    pub fn default_partition(&self, key: Option<&[u8]>, partitions: i32) -> i32 {
        let n = partitions.max(1) as u32;
        let partition = match key {
            Some(k) => partition_for_bytes(k, n),
            None => self.next_keyless.fetch_add(1, Ordering::Relaxed) % n,
        };
        partition as i32
    }

    /// Appends `records` to `topic`: each to `partition` when given, else to the
    /// partition the topic's partitioner chooses. Batches per partition, in record order.
    /// Returns where each record went, in input order.
    ///
    /// Errors: [`IngestError`] from [`Ingest::topic`], else the first record error of
    /// [`Ingest::append_each`] (records of other partitions may have been written).
    pub async fn append(
        &self,
        topic: &str,
        partition: Option<i32>,
        records: &[Record],
    ) -> Result<Vec<Appended>, IngestError> {
        let partitions = vec![partition; records.len()];
        self.append_each(topic, records, &partitions)
            .await?
            .into_iter()
            .collect()
    }

    /// Appends `records` to `topic`, record `i` to `partitions[i]` when that is `Some`,
    /// else to the partition the topic's partitioner chooses. Records of one partition go
    /// in input order, in as few batches as `max.message.bytes` allows. Returns each
    /// record's outcome, in input order.
    ///
    /// Errors: the whole call fails with [`Ingest::topic`]'s errors, or INVALID_REQUEST
    /// when the two slices differ in length. A record fails alone with
    /// UNKNOWN_TOPIC_OR_PARTITION (3) for a partition out of range, INVALID_CONFIG (40)
    /// when the topic's partitioner cannot be loaded, INVALID_RECORD (87) when the
    /// partitioner fails on it or when a compacted topic gets no key, MESSAGE_TOO_LARGE
    /// (10) when it alone exceeds `max.message.bytes`; a batch fails with the log's error
    /// (KAFKA_STORAGE_ERROR).
    pub async fn append_each(
        &self,
        topic: &str,
        records: &[Record],
        partitions: &[Option<i32>],
    ) -> Result<Vec<RecordResult>, IngestError> {
        if records.len() != partitions.len() {
            return Err(IngestError::new(
                ResponseError::InvalidRequest,
                format!(
                    "{} partitions given for {} records",
                    partitions.len(),
                    records.len()
                ),
            ));
        }
        let (meta, chosen) = self.choose_partitions(topic, records, partitions).await?;
        Ok(self.append_chosen(&meta, records, chosen, None).await)
    }

    /// The partition of each record of `records` for `topic`: `partitions[i]` when that
    /// is `Some` (and in range), else the topic's partitioner's choice; with the topic's
    /// metadata. [`Ingest::append_chosen`] then writes them.
    ///
    /// Errors: as [`Ingest::append_each`] (the whole call, or a record alone).
    pub(crate) async fn choose_partitions(
        &self,
        topic: &str,
        records: &[Record],
        partitions: &[Option<i32>],
    ) -> Result<(TopicMeta, Vec<Result<i32, IngestError>>), IngestError> {
        let meta = self.topic(topic)?;
        let n = meta.partitions;
        let mut chosen: Vec<Result<i32, IngestError>> = Vec::with_capacity(records.len());
        let mut partitioner: Option<TopicPartitioner> = None;
        for (r, given) in records.iter().zip(partitions) {
            let p = match *given {
                Some(p) if (0..n).contains(&p) => Ok(p),
                Some(p) => Err(IngestError::new(
                    ResponseError::UnknownTopicOrPartition,
                    format!("{topic}: no partition {p} (the topic has {n})"),
                )),
                None => {
                    if partitioner.is_none() {
                        partitioner = Some(self.topic_partitioner(&meta).await);
                    }
                    match &partitioner {
                        Some(TopicPartitioner::Plugin(plugin)) => {
                            let mut plugin = plugin.lock().await;
                            plugin
                                .partition(r.key.as_deref(), r.value.as_deref(), n as u32)
                                .await
                                .map(|p| p as i32)
                                .map_err(|e| {
                                    IngestError::new(
                                        ResponseError::InvalidRecord,
                                        format!("{topic}: the topic's partitioner failed: {e}"),
                                    )
                                })
                        }
                        Some(TopicPartitioner::Broken(e)) => Err(e.clone()),
                        Some(TopicPartitioner::Default) | None => {
                            Ok(self.default_partition(r.key.as_deref(), n))
                        }
                    }
                }
            };
            chosen.push(p);
        }
        Ok((meta, chosen))
    }

    /// Appends each record of `records` to the partition `chosen` says (a record whose
    /// choice failed fails so), batched per partition in record order; stamped with
    /// `producer`'s id, epoch and sequences as transactional batches when given (its
    /// partitions added to its transaction first). Returns each record's outcome, in
    /// input order.
    pub(crate) async fn append_chosen(
        &self,
        meta: &TopicMeta,
        records: &[Record],
        chosen: Vec<Result<i32, IngestError>>,
        producer: Option<&BatchProducer>,
    ) -> Vec<RecordResult> {
        let topic = &meta.name;
        let mut out: Vec<Option<RecordResult>> = Vec::with_capacity(records.len());
        let mut by_partition: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
        for (i, p) in chosen.into_iter().enumerate() {
            match p {
                Ok(p) => {
                    by_partition.entry(p).or_default().push(i);
                    out.push(None);
                }
                Err(e) => out.push(Some(Err(e))),
            }
        }
        for (p, indexes) in by_partition {
            let results = self
                .append_partition(meta, p, records, &indexes, producer)
                .await;
            for (i, r) in indexes.into_iter().zip(results) {
                out[i] = Some(r);
            }
        }
        out.into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(IngestError::new(
                        ResponseError::UnknownServerError,
                        format!("{topic}: record not appended"),
                    ))
                })
            })
            .collect()
    }

    /// The partitioner of `meta`'s topic: its `partitioner` setting (or the broker's),
    /// loaded through the cache.
    async fn topic_partitioner(&self, meta: &TopicMeta) -> TopicPartitioner {
        let mut path = String::new();
        let mut config = String::new();
        let image = self.topics.metadata.image();
        for (key, value, _) in
            effective_topic_configs(&self.topics.config, image.dynamic_layers(), &meta.configs)
        {
            match key {
                "partitioner" => path = value.unwrap_or_default(),
                "partitioner.config" => config = value.unwrap_or_default(),
                _ => {}
            }
        }
        let path = path.trim();
        if path.is_empty() {
            return TopicPartitioner::Default;
        }
        let broken = |message: String| {
            tracing::warn!(topic = %meta.name, partitioner = path, "{message}");
            TopicPartitioner::Broken(IngestError::new(
                ResponseError::InvalidConfig,
                format!(
                    "{}: the topic's partitioner {path} cannot be used: {message}",
                    meta.name
                ),
            ))
        };
        let pairs = match parse_plugin_config(&config) {
            Ok(p) => p,
            Err(e) => return broken(format!("partitioner.config: {e}")),
        };
        match self
            .load_partitioner(PathBuf::from(path), config, &pairs)
            .await
        {
            Ok(p) => TopicPartitioner::Plugin(p),
            Err(e) => broken(e),
        }
    }

    /// The cached partitioner for (`path`, `config`), loaded (again) when missing or when
    /// the file changed.
    async fn load_partitioner(
        &self,
        path: PathBuf,
        config: String,
        pairs: &[(String, String)],
    ) -> Result<Arc<tokio::sync::Mutex<Partitioner>>, String> {
        let file = std::fs::metadata(&path).map_err(|e| format!("cannot read: {e}"))?;
        let modified = file.modified().ok();
        let len = file.len();
        let key = (path, config);
        let now = self.uses.fetch_add(1, Ordering::Relaxed);
        {
            let mut cache = self.cache();
            if let Some(c) = cache.get_mut(&key) {
                if c.modified == modified && c.len == len {
                    c.last_used = now;
                    return Ok(c.partitioner.clone());
                }
            }
        }
        let loaded = self
            .plugins
            .load_partitioner_with(&key.0, pairs)
            .await
            .map_err(|e| e.to_string())?;
        tracing::info!(plugin = %key.0.display(), config = %key.1, "loaded partitioner");
        let partitioner = Arc::new(tokio::sync::Mutex::new(loaded));
        let mut cache = self.cache();
        if cache.len() >= MAX_CACHED_PARTITIONERS && !cache.contains_key(&key) {
            let oldest = cache
                .iter()
                .min_by_key(|(_, c)| c.last_used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                cache.remove(&k);
            }
        }
        cache.insert(
            key,
            CachedPartitioner {
                modified,
                len,
                last_used: now,
                partitioner: partitioner.clone(),
            },
        );
        Ok(partitioner)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<(PathBuf, String), CachedPartitioner>> {
        // The map stays consistent whatever panicked while holding it.
        match self.partitioners.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Appends `records[i]` for each `i` of `indexes` (in order) to partition `index`, in
    /// batches of at most `max.message.bytes`, on this broker when it leads the partition,
    /// else forwarded to its leader. Returns each record's outcome, in `indexes` order; a
    /// failed batch fails its records and those of every later batch, which are not sent
    /// (so a retry keeps the partition's order).
    async fn append_partition(
        &self,
        meta: &TopicMeta,
        index: i32,
        records: &[Record],
        indexes: &[usize],
        producer: Option<&BatchProducer>,
    ) -> Vec<RecordResult> {
        let topic = &meta.name;
        let fail = |error: ResponseError, message: String| {
            IngestError::new(error, format!("{topic}-{index}: {message}"))
        };
        let target = match self.target(meta, index) {
            Ok(t) => t,
            Err((error, message)) => {
                let e = fail(error, message);
                return indexes.iter().map(|_| Err(e.clone())).collect();
            }
        };
        let settings = match &target {
            Target::Here(partition) => partition.settings(),
            Target::Leader(_) => produce_settings(
                &self.topics.config,
                self.topics.metadata.image().dynamic_layers(),
                &meta.configs,
            ),
        };
        // Each record's outcome, by position in `indexes`; `None` until decided.
        let mut results: Vec<Option<RecordResult>> = indexes.iter().map(|_| None).collect();
        // Positions of the records to write, grouped into batches under the size limit.
        let mut batches: Vec<Vec<usize>> = Vec::new();
        let mut batch: Vec<usize> = Vec::new();
        let mut batch_bytes = BATCH_HEADER_BYTES;
        for (k, &i) in indexes.iter().enumerate() {
            let r = &records[i];
            if let Some((error, message)) = refusal(&settings, r) {
                results[k] = Some(Err(fail(error, message)));
                continue;
            }
            let size = max_encoded_size(r);
            if !batch.is_empty() && batch_bytes + size > settings.max_message_bytes {
                batches.push(std::mem::take(&mut batch));
                batch_bytes = BATCH_HEADER_BYTES;
            }
            batch.push(k);
            batch_bytes += size;
        }
        if !batch.is_empty() {
            batches.push(batch);
        }
        let mut batches = batches.into_iter();
        while let Some(b) = batches.next() {
            let refs: Vec<&Record> = b.iter().map(|&k| &records[indexes[k]]).collect();
            match self
                .append_batch(
                    &target,
                    topic,
                    index,
                    settings.max_message_bytes,
                    &refs,
                    producer,
                )
                .await
            {
                Ok((base, log_append_time_ms)) => {
                    for (n, (&k, r)) in b.iter().zip(&refs).enumerate() {
                        let timestamp_ms = if log_append_time_ms >= 0 {
                            log_append_time_ms
                        } else {
                            r.timestamp_ms
                        };
                        results[k] = Some(Ok(Appended {
                            partition: index,
                            offset: base + n as i64,
                            timestamp_ms,
                        }));
                    }
                }
                Err((error, message)) => {
                    // The later batches are not sent: appended after a refused one, a
                    // retry of it would land behind them (out of order).
                    let e = fail(error, message);
                    let later: Vec<usize> = batches.by_ref().flatten().collect();
                    for &k in b.iter().chain(&later) {
                        results[k] = Some(Err(e.clone()));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(fail(
                        ResponseError::UnknownServerError,
                        "not appended".into(),
                    ))
                })
            })
            .collect()
    }

    /// Where partition `index` of `meta`'s topic is written: here when this broker leads
    /// it, else its leader. Errors: UNKNOWN_TOPIC_OR_PARTITION (3) for a partition the
    /// topic does not have, LEADER_NOT_AVAILABLE (5) when it has no leader,
    /// NOT_LEADER_OR_FOLLOWER (6) when the metadata names this broker but its replica is
    /// not leading yet (a retry finds it).
    fn target(&self, meta: &TopicMeta, index: i32) -> Result<Target, (ResponseError, String)> {
        if let Some(p) = self.topics.replicas.partition(&meta.name, index) {
            if p.is_leader() {
                return Ok(Target::Here(p));
            }
        }
        let Some(state) = meta.partition(index) else {
            return Err((
                ResponseError::UnknownTopicOrPartition,
                format!("no partition {index} (the topic has {})", meta.partitions),
            ));
        };
        if state.leader < 0 {
            return Err((
                ResponseError::LeaderNotAvailable,
                "the partition has no leader (its replicas are offline)".into(),
            ));
        }
        if state.leader == self.topics.config.node_id {
            return Err((
                ResponseError::NotLeaderOrFollower,
                "this broker is becoming its leader".into(),
            ));
        }
        Ok(Target::Leader(state.leader))
    }

    /// Encodes `records` as one batch and appends it to `target`, acknowledged by every
    /// in-sync replica (acks=all, [`ACKS_TIMEOUT_MS`]). Returns the base offset and the
    /// log-append time (-1 for CreateTime).
    async fn append_batch(
        &self,
        target: &Target,
        topic: &str,
        index: i32,
        max_message_bytes: usize,
        records: &[&Record],
        producer: Option<&BatchProducer>,
    ) -> Result<(i64, i64), (ResponseError, String)> {
        let encoded: Vec<plain::Record> = records
            .iter()
            .enumerate()
            .map(|(i, r)| {
                plain::record(
                    i as i64,
                    r.timestamp_ms,
                    r.key.clone(),
                    r.value.clone(),
                    r.headers
                        .iter()
                        .map(|h| (h.key.clone().into(), h.value.clone()))
                        .collect(),
                )
            })
            .collect();
        let fields = producer.map(|p| plain::ProducerFields {
            producer_id: p.producer_id,
            producer_epoch: p.producer_epoch,
            base_sequence: p.next_sequence(topic, index, encoded.len()),
            transactional: true,
        });
        let buf =
            plain::encode_as(&encoded, fields).map_err(|e| (ResponseError::CorruptMessage, e))?;
        if buf.len() > max_message_bytes {
            return Err((
                ResponseError::MessageTooLarge,
                format!(
                    "record batch of {} bytes exceeds max.message.bytes {max_message_bytes}",
                    buf.len()
                ),
            ));
        }
        let partition = match target {
            Target::Here(partition) => partition,
            Target::Leader(leader) => {
                let answer = self
                    .peers
                    .produce(
                        *leader,
                        topic,
                        index,
                        buf,
                        ACKS_TIMEOUT_MS,
                        producer.map(|p| p.transactional_id.as_str()),
                    )
                    .await?;
                return Ok((answer.base_offset, answer.log_append_time_ms));
            }
        };
        let batches =
            split_batches(buf).map_err(|e| (ResponseError::CorruptMessage, e.to_string()))?;
        // The topic's inline transform, as on a produced batch (offsets kept: 1:1 or
        // filtered, so record `i` stays at base + i). The batch is uncompressed: its
        // decompressed size is its size.
        let slot = self.inline.get(topic);
        let inline_target = inline::Target {
            topic,
            partition: index,
            compression: partition.settings().compression,
            max_decompressed_bytes: max_message_bytes,
            max_message_bytes,
        };
        let (batches, dead_letters) = match &slot {
            None => (batches, Vec::new()),
            Some(slot) => {
                let applied = inline::apply(slot, inline_target, batches)
                    .await
                    .map_err(|refused| (refused.error, refused.message))?;
                (applied.batches, applied.dead_letters)
            }
        };
        let info = self
            .topics
            .replicas
            .append(partition, batches)
            .map_err(|e| (e.kafka_error(), e.to_string()))?;
        if let Some(slot) = slot.filter(|_| !dead_letters.is_empty()) {
            // Boxed: writing a dead letter appends through this path again.
            Box::pin(inline::write_dead_letters(
                self,
                &slot,
                inline_target,
                dead_letters,
                &[info.base_offset],
            ))
            .await;
        }
        let waited = partition
            .wait_for_high_watermark(info.last_offset, ACKS_TIMEOUT_MS as u64)
            .await;
        if let Some((error, message)) = waited.refusal() {
            return Err((error, message.into()));
        }
        Ok((info.base_offset, info.log_append_time_ms))
    }
}

/// Where one partition's batches are written.
enum Target {
    /// This broker leads the partition.
    Here(Arc<Partition>),
    /// Broker `.0` leads it: batches are forwarded there as Produce requests.
    Leader(i32),
}

/// Why `r` can never be appended to a partition with `settings`, however often it is
/// tried: INVALID_RECORD (87) for a keyless record on a compacted topic (Kafka's
/// `LogValidator` message), MESSAGE_TOO_LARGE (10) when it alone, as a batch, may exceed
/// `max.message.bytes`. `None`: it fits.
fn refusal(settings: &ProduceSettings, r: &Record) -> Option<(ResponseError, String)> {
    if settings.require_keys && r.key.is_none() {
        return Some((
            ResponseError::InvalidRecord,
            "Compacted topic cannot accept message without key".into(),
        ));
    }
    let bytes = BATCH_HEADER_BYTES + max_encoded_size(r);
    if bytes > settings.max_message_bytes {
        return Some((
            ResponseError::MessageTooLarge,
            format!(
                "a record of up to {bytes} bytes (as a batch) exceeds max.message.bytes {}",
                settings.max_message_bytes
            ),
        ));
    }
    None
}

/// An upper bound of a record's size inside a magic-2 batch: its fields plus the largest
/// varints (length 5, attributes 1, timestamp delta 10, offset delta 5, key and value
/// lengths 5 each, header count 5; per header two lengths of 5).
fn max_encoded_size(r: &Record) -> usize {
    let field = |b: &Option<bytes::Bytes>| b.as_ref().map_or(0, |b| b.len());
    36 + field(&r.key)
        + field(&r.value)
        + r.headers
            .iter()
            .map(|h| 10 + h.key.len() + field(&h.value))
            .sum::<usize>()
}
