//! Broker configuration: the key registry, TOML loading and `--override`.
//!
//! Owns: the list of every broker key weir understands (name, type, default, one line of
//! doc, validator), turning a TOML file plus `KEY=VALUE` overrides into a typed
//! [`BrokerConfig`], and the per-topic keys ([`TOPIC_KEYS`], every Kafka 4.1 `TopicConfig`
//! key) with the broker key each one falls back to, so DescribeConfigs can report a value
//! and its source. `dynamic.rs`: which broker keys may change at run time
//! ([`DYNAMIC_BROKER_KEYS`], KIP-226) and the layer walk (dynamic per-broker > dynamic
//! cluster default > static > default) over the values the metadata image holds.
//!
//! Never does: I/O beyond reading the one file it is given. Key names are Apache Kafka's
//! (`log.dirs`, `log.segment.bytes`, ...), so a Kafka user's habits carry over; TOML dotted
//! keys (`log.dirs = "x"`) and quoted keys (`"log.dirs" = "x"`) are the same key.

mod cluster;
mod dynamic;

/// KIP-848's server-side assignors and consumer-group settings, defined with the group
/// coordinator.
pub use crate::group::assignor::AssignorKind;
pub use crate::group::consumer::{ConsumerGroupSettings, MigrationPolicy};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use cluster::{parse_voters, ClusterSettings, ProcessRoles, QuorumVoter};
pub use dynamic::{
    broker_synonyms, check_dynamic_change, dynamic_key, ConfigSource, DynamicConfigError,
    DynamicKeySpec, DynamicLayers, DynamicScope, Synonym, DYNAMIC_BROKER_KEYS,
};

/// The type of a configuration value, as Kafka's `ConfigDef.Type` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    /// `true` / `false`.
    Boolean,
    /// A 32-bit signed integer.
    Int,
    /// A 64-bit signed integer.
    Long,
    /// A 64-bit float (`min.cleanable.dirty.ratio`).
    Double,
    /// Free text.
    String,
    /// A comma-separated list of strings.
    List,
}

impl KeyType {
    /// The name Kafka uses in DescribeConfigs v3+ (`config_type`, KIP-569).
    pub fn describe_configs_code(self) -> i8 {
        match self {
            KeyType::Boolean => 1,
            KeyType::String => 2,
            KeyType::Int => 3,
            KeyType::Long => 5,
            KeyType::Double => 6,
            KeyType::List => 7,
        }
    }
}

/// One broker configuration key: its Kafka name, type, default (as text; `None` = no
/// default, i.e. null) and one line of documentation.
#[derive(Debug, Clone, Copy)]
pub struct KeySpec {
    /// Kafka's key name, e.g. `log.segment.bytes`.
    pub name: &'static str,
    /// Value type.
    pub key_type: KeyType,
    /// Default value as text, `None` for null.
    pub default: Option<&'static str>,
    /// Smallest accepted value for numeric keys.
    pub min: Option<i64>,
    /// One line of documentation (also in `config/weir.toml`).
    pub doc: &'static str,
}

const fn key(
    name: &'static str,
    key_type: KeyType,
    default: Option<&'static str>,
    min: Option<i64>,
    doc: &'static str,
) -> KeySpec {
    KeySpec {
        name,
        key_type,
        default,
        min,
        doc,
    }
}

use KeyType::{Boolean, Double, Int, List, Long};

/// Every broker key weir understands. `config/weir.toml` lists each of them with its
/// default; a tidy test keeps the two in step.
pub const BROKER_KEYS: &[KeySpec] = &[
    key("node.id", Int, Some("1"), Some(0), "This broker's id (Kafka's broker.id / node.id)."),
    key("process.roles", List, Some("broker,controller"), None, "What this node runs: broker, controller, or both (KRaft combined mode)."),
    key("controller.quorum.voters", List, Some(""), None, "The controller quorum as ID@HOST:PORT of each voter's CONTROLLER listener; empty: this node alone."),
    key("controller.quorum.election.timeout.ms", Int, Some("1000"), Some(100), "A controller that hears no quorum leader for 1.5 to 2 times this long (ms) stands for election (openraft's leader lease plus a randomised timeout)."),
    key("controller.listener.names", List, None, None, "Names of the listeners the controller quorum uses (e.g. CONTROLLER); needed with controller.quorum.voters."),
    key("listeners", List, Some("PLAINTEXT://127.0.0.1:9092"), None, "Addresses to listen on, as NAME://HOST:PORT, each name once: Kafka listeners (PLAINTEXT, or any name listener.security.protocol.map maps to PLAINTEXT) and controller.listener.names ones; port 0 picks a free port. Metadata and FindCoordinator answer with the endpoints of the listener asked."),
    key("advertised.listeners", List, None, None, "Addresses given to clients in Metadata; defaults to listeners (with the bound port)."),
    key("inter.broker.listener.name", KeyType::String, Some("PLAINTEXT"), None, "The listener brokers use to talk to each other."),
    key("broker.session.timeout.ms", Int, Some("9000"), Some(1), "A broker the controller has not heard from for this long is fenced (ms)."),
    key("broker.heartbeat.interval.ms", Int, Some("2000"), Some(1), "How often a broker heartbeats to the controller (ms); below broker.session.timeout.ms."),
    key("log.dirs", KeyType::String, Some("./data"), None, "Comma-separated directories holding partition logs (each locked by one broker); a new partition goes to the one with the fewest partitions, ties by this order."),
    key("metadata.log.dir", KeyType::String, None, None, "Directory of the broker's own files: the cluster metadata log (__cluster_metadata, with meta.properties), replication-offset-checkpoint; default the first of log.dirs. May be one of log.dirs or apart."),
    key("num.partitions", Int, Some("1"), Some(1), "Partitions of an auto-created topic, and of CreateTopics with -1."),
    key("default.replication.factor", Int, Some("1"), Some(1), "Replication factor of auto-created topics."),
    key("log.segment.bytes", Int, Some("1073741824"), Some(14), "Roll a new segment when the active one would exceed this many bytes."),
    key("log.roll.ms", Long, None, Some(1), "Roll a new segment when the active one's first batch is this old (ms); overrides log.roll.hours."),
    key("log.roll.hours", Int, Some("168"), Some(1), "As log.roll.ms, in hours."),
    key("log.retention.ms", Long, None, Some(-1), "Delete segments whose newest record is older than this (ms); -1 keeps forever. Overrides log.retention.minutes/hours."),
    key("log.retention.minutes", Int, None, Some(-1), "As log.retention.ms, in minutes; overrides log.retention.hours."),
    key("log.retention.hours", Int, Some("168"), Some(-1), "As log.retention.ms, in hours."),
    key("log.retention.bytes", Long, Some("-1"), Some(-1), "Delete oldest segments while a partition is larger than this; -1 for no limit."),
    key("log.retention.check.interval.ms", Long, Some("300000"), Some(1), "How often retention runs (ms)."),
    key("producer.id.expiration.ms", Int, Some("86400000"), Some(1), "An idempotent producer that has appended nothing to a partition for this long (ms, on the broker's clock, never its batches' timestamps) is forgotten there; its next batch is then accepted with any sequence (KIP-360), so a retry after that is appended again."),
    key("producer.id.expiration.check.interval.ms", Int, Some("600000"), Some(1), "How often idle producer ids are looked for (ms)."),
    key("log.index.interval.bytes", Int, Some("4096"), Some(0), "Bytes of log between two sparse offset-index entries."),
    key("log.open.files.max", Int, Some("0"), Some(0), "weir-specific: most segment files (.log, and the active segment's .index and .timeindex) open at once over all partitions; idle segments are closed and reopened on demand, so a broker hosts more partitions than its file-descriptor limit. 0 derives it from RLIMIT_NOFILE (raised to the hard limit at start-up): half the soft limit. Reads in flight may hold a few more."),
    key("log.index.size.max.bytes", Int, Some("10485760"), Some(4), "Largest offset index of a segment; a full index rolls the segment."),
    key("log.flush.interval.messages", Long, Some("9223372036854775807"), Some(1), "fsync a partition after this many records (default: leave it to the OS)."),
    key("log.flush.interval.ms", Long, Some("9223372036854775807"), Some(0), "fsync a partition when its oldest unflushed record is this old (ms); the default leaves it to the OS."),
    key("compression.type", KeyType::String, Some("producer"), None, "Topic compression: client batches are stored as the producer compressed them; a codec here is applied only to batches the broker re-encodes (inline transforms, which otherwise keep the producer's codec)."),
    key("log.message.format.version", KeyType::String, Some("3.0-IV1"), None, "Deprecated since Kafka 3.0 and ignored, as Kafka 3.x ignores it: batches are always stored as the producer sent them (magic 2). Accepted so configs and clients written for Kafka 2.x still work."),
    key("log.cleanup.policy", List, Some("delete"), None, "delete (time/size retention), compact (keep the latest record per key; Kafka's log cleaner), or both."),
    key("log.cleaner.min.cleanable.ratio", Double, Some("0.5"), None, "Compact a partition only when its dirty (not yet compacted) closed bytes are at least this fraction of its closed bytes (0..1)."),
    key("log.cleaner.delete.retention.ms", Long, Some("86400000"), Some(0), "How long a tombstone (null value) survives compaction (ms, from its batch's timestamp)."),
    key("log.cleaner.min.compaction.lag.ms", Long, Some("0"), Some(0), "Never compact segments holding records newer than this (ms; KIP-58)."),
    key("log.cleaner.io.max.bytes.per.second", Double, Some("1.7976931348623157E308"), None, "Most bytes per second the log cleaner reads while compacting (all partitions together); the default is no limit."),
    key("log.message.timestamp.type", KeyType::String, Some("CreateTime"), None, "CreateTime keeps the producer's timestamp; LogAppendTime stamps batches with the broker's clock."),
    key("message.max.bytes", Int, Some("1048588"), Some(0), "Largest record batch a producer may send (bytes, after compression)."),
    key("auto.create.topics.enable", Boolean, Some("true"), None, "Create a topic on first Metadata/Produce for it."),
    key("delete.topic.enable", Boolean, Some("true"), None, "Allow DeleteTopics."),
    key("min.insync.replicas", Int, Some("1"), Some(1), "Replicas that must hold a batch before acks=all succeeds."),
    key("replica.lag.time.max.ms", Long, Some("30000"), Some(1), "A follower that has not caught up with its leader for this long leaves the ISR (ms)."),
    key("replica.fetch.wait.max.ms", Int, Some("500"), Some(0), "Longest a follower's fetch waits at the leader for new records (ms); below replica.lag.time.max.ms."),
    key("replica.fetch.max.bytes", Int, Some("1048576"), Some(0), "Bytes a follower asks for per partition in one fetch (the first batch comes whole even when larger)."),
    key("replica.fetch.response.max.bytes", Int, Some("10485760"), Some(0), "Bytes a follower asks for in one whole fetch response."),
    key("replica.fetch.backoff.ms", Int, Some("1000"), Some(0), "How long a follower waits after a failed fetch from its leader (ms)."),
    key("replica.high.watermark.checkpoint.interval.ms", Long, Some("5000"), Some(1), "How often the high watermark of every partition is written to replication-offset-checkpoint in the log dir (ms); a restarted replica starts from it."),
    key("unclean.leader.election.enable", Boolean, Some("false"), None, "Let the controller elect a live replica outside the ISR when no ISR member is alive: the partition comes back, losing what only the ISR held (Kafka's default: false, stay offline)."),
    key("auto.leader.rebalance.enable", Boolean, Some("true"), None, "The active controller moves leadership back to each partition's preferred replica (the first listed) when a broker's leader imbalance passes leader.imbalance.per.broker.percentage."),
    key("leader.imbalance.check.interval.seconds", Long, Some("300"), Some(1), "How often the active controller checks the leader imbalance (s)."),
    key("leader.imbalance.per.broker.percentage", Int, Some("10"), Some(0), "Percentage of a broker's preferred partitions led elsewhere above which the controller moves them back."),
    key("broker.rack", KeyType::String, None, None, "This broker's rack (Metadata and DescribeCluster list it; the rack-aware replica selector matches it with a consumer's client.rack)."),
    key("replica.selector.class", KeyType::String, Some("org.apache.kafka.common.replica.LeaderSelector"), None, "Who serves a consumer's fetch (KIP-392): org.apache.kafka.common.replica.LeaderSelector (the leader) or org.apache.kafka.common.replica.RackAwareReplicaSelector (an in-sync follower in the consumer's client.rack)."),
    key("offsets.topic.replication.factor", Int, Some("3"), Some(1), "Replication factor of __consumer_offsets (capped at the live broker count when it is created)."),
    key("socket.request.max.bytes", Int, Some("104857600"), Some(1), "Largest request frame; a larger one closes the connection before anything is allocated."),
    key("max.connections", Int, Some("10000"), Some(1), "Most client connections served at once; more wait in the accept queue."),
    key("connections.max.idle.ms", Long, Some("600000"), Some(1), "Close a connection that sends nothing, stalls inside a request, or leaves an answer unread, for this long (ms)."),
    key("queued.max.requests", Int, Some("500"), Some(1), "Most answers of one connection waiting to be written; requests are handled one at a time, in order."),
    key("fetch.max.bytes", Int, Some("2097152"), Some(0), "Largest Fetch response the broker builds, whatever the request asks (bytes); the first batch still goes whole (KIP-74); a follower's is at least replica.fetch.response.max.bytes. weir's default is 2 MiB, not Kafka's 55 MiB: librdkafka reads 8 partitions at ~0.7x the CPU per record with it (benches/RESULTS.md); raise it for consumers far away (one response per round trip)."),
    key("fetch.sendfile.enable", Boolean, Some("true"), None, "weir-specific: send a consumer's fetched record sets from the segment files with sendfile(2) (zero-copy: page cache to socket, no copy through the broker); false copies them through memory."),
    key("max.incremental.fetch.session.cache.slots", Int, Some("1000"), Some(0), "Most incremental fetch sessions (KIP-227) cached at once; a consumer finding none free and none evictable sends full requests (0: no sessions)."),
    key("fetch.purgatory.max.size", Int, Some("10000"), Some(1), "Most long-poll Fetch requests parked at once; more answer at once."),
    key("group.initial.rebalance.delay.ms", Int, Some("3000"), Some(0), "How long the first rebalance of an empty group waits for more members to join (ms)."),
    key("group.min.session.timeout.ms", Int, Some("6000"), Some(1), "Smallest session.timeout.ms a member may ask for (INVALID_SESSION_TIMEOUT below it)."),
    key("group.max.session.timeout.ms", Int, Some("1800000"), Some(1), "Largest session.timeout.ms a member may ask for (INVALID_SESSION_TIMEOUT above it)."),
    key("group.max.size", Int, Some("2147483647"), Some(1), "Most members one consumer group may have (GROUP_MAX_SIZE_REACHED above it)."),
    key("group.coordinator.rebalance.protocols", List, Some("classic,consumer"), None, "The group protocols the coordinator speaks: classic (JoinGroup/SyncGroup) and consumer (KIP-848's ConsumerGroupHeartbeat, advertised only when listed); classic is required."),
    key("group.consumer.session.timeout.ms", Int, Some("45000"), Some(1), "A consumer-protocol member (KIP-848) that sends no heartbeat for this long is removed from its group (ms)."),
    key("group.consumer.heartbeat.interval.ms", Int, Some("5000"), Some(1), "How often consumer-protocol members (KIP-848) are told to heartbeat (ms)."),
    key("group.consumer.assignors", List, Some("uniform,range"), None, "Server-side assignors of consumer-protocol groups (KIP-848), the first the default: uniform (balanced, sticky) and range; Kafka's class names (org.apache.kafka.coordinator.group.assignor.UniformAssignor, ...RangeAssignor) are accepted."),
    key("group.consumer.migration.policy", KeyType::String, Some("bidirectional"), None, "Whether a group with members changes protocol as they restart (KIP-848's online migration): upgrade (a classic group becomes a consumer-protocol group when a consumer-protocol member joins; its classic members stay in it), downgrade (back when the last consumer-protocol member leaves), bidirectional (both), disabled (neither)."),
    key("group.consumer.max.size", Int, Some("2147483647"), Some(1), "Most members one consumer-protocol group may have (GROUP_MAX_SIZE_REACHED above it)."),
    key("offsets.topic.num.partitions", Int, Some("50"), Some(1), "Partitions of __consumer_offsets, fixed when it is first created."),
    key("offsets.topic.segment.bytes", Int, Some("104857600"), Some(14), "Segment size of __consumer_offsets (bytes)."),
    key("offsets.retention.minutes", Int, Some("10080"), Some(1), "Committed offsets of a group are dropped this long after it became empty (minutes)."),
    key("offsets.retention.check.interval.ms", Long, Some("600000"), Some(1), "How often expired committed offsets are looked for (ms)."),
    key("offset.metadata.max.bytes", Int, Some("4096"), Some(0), "Longest metadata string of a committed offset (OFFSET_METADATA_TOO_LARGE above it)."),
    key("transaction.state.log.num.partitions", Int, Some("50"), Some(1), "Partitions of __transaction_state (the transaction coordinators' log), fixed when it is first created."),
    key("transaction.state.log.replication.factor", Int, Some("3"), Some(1), "Replication factor of __transaction_state (capped at the live broker count when it is created)."),
    key("transaction.state.log.min.isr", Int, Some("2"), Some(1), "min.insync.replicas of __transaction_state (capped at its replication factor)."),
    key("transaction.state.log.segment.bytes", Int, Some("104857600"), Some(14), "Segment size of __transaction_state (bytes)."),
    key("transaction.max.timeout.ms", Int, Some("900000"), Some(1), "Largest transaction.timeout.ms a producer may ask for (INVALID_TRANSACTION_TIMEOUT above it)."),
    key("transactional.id.expiration.ms", Int, Some("604800000"), Some(1), "A transactional id with no transaction for this long (ms) is forgotten by its coordinator."),
    key("transaction.abort.timed.out.transaction.cleanup.interval.ms", Int, Some("10000"), Some(1), "How often the coordinators look for transactions open past their timeout, and abort them (ms)."),
    key("transaction.remove.expired.transaction.cleanup.interval.ms", Int, Some("3600000"), Some(1), "How often the coordinators look for expired transactional ids (ms)."),
    key("transaction.version", Int, Some("2"), Some(0), "The level of Kafka's transaction.version feature that ApiVersions advertises as finalized (0, 1 or 2). At 2 a client that knows KIP-890 part 2 (the Java client 4.x) bumps the producer epoch per transaction (EndTxn v5) and sends no AddPartitionsToTxn; below 2 every client stays on part 1."),
    key("admin.listeners", List, Some("http://127.0.0.1:8083"), None, "The admin HTTP listener (transforms, HTTP produce, Connect REST API), as http://HOST:PORT; empty turns it off; port 0 picks a free port."),
    key("admin.max.inflight.request.bytes", Long, Some("268435456"), Some(1), "Most request-body bytes all admin HTTP requests together may hold at once (each counts its Content-Length, capped at its route's body limit, or that limit when chunked). A request that does not fit now gets 503 with Retry-After; one larger than this whole bound gets 413."),
    key("plugin.cache.dir", KeyType::String, None, None, "Directory of compiled plugin components (<sha256>.cwasm); default <metadata.log.dir>/__plugin_cache (the first of log.dirs when unset)."),
    key("plugin.memory.max.bytes", Long, Some("67108864"), Some(65536), "Most linear memory one plugin instance may use (bytes)."),
    key("plugin.call.timeout.ms", Long, Some("1000"), Some(1), "Deadline of one plugin call (ms); a call past it fails and its instance is replaced."),
    key("partitioner.file", KeyType::String, Some(""), None, "Partitioner component (.wasm path on the broker host) for records the broker routes itself (HTTP produce, transform outputs) on topics that set no `partitioner`; empty: Kafka's default (murmur2 of the key; keyless records spread)."),
    key("partitioner.config", KeyType::String, Some(""), None, "Config passed to that partitioner's open: comma-separated key=value pairs (e.g. field=user_id); values cannot contain commas."),
    key("log.roll.jitter.ms", Long, None, Some(0), "Most random jitter subtracted from a segment's roll time (ms); overrides log.roll.jitter.hours. Stored and reported only: weir rolls without jitter."),
    key("log.roll.jitter.hours", Int, Some("0"), Some(0), "As log.roll.jitter.ms, in hours. Stored and reported only."),
    key("log.cleaner.max.compaction.lag.ms", Long, Some("9223372036854775807"), Some(1), "Longest a record may stay uncompacted (ms; KIP-354). Stored and reported only: weir compacts by min.cleanable.dirty.ratio alone."),
    key("log.segment.delete.delay.ms", Long, Some("60000"), Some(0), "How long a deleted segment's file waits before removal (ms). Stored and reported only: weir removes segment files at once."),
    key("compression.gzip.level", Int, Some("-1"), None, "gzip level (-1 or 1..9; KIP-390) for batches the broker re-encodes. Stored and reported only: weir uses the codec's default level."),
    key("compression.lz4.level", Int, Some("9"), None, "lz4 level (1..17; KIP-390). Stored and reported only."),
    key("compression.zstd.level", Int, Some("3"), None, "zstd level (-131072..22; KIP-390). Stored and reported only."),
    key("log.preallocate", Boolean, Some("false"), None, "Preallocate segment files. Stored and reported only: weir never preallocates."),
    key("log.message.timestamp.before.max.ms", Long, Some("9223372036854775807"), Some(0), "Largest allowed age of a record's CreateTime behind the broker's clock (ms; KIP-937). Stored and reported only: weir accepts any timestamp."),
    key("log.message.timestamp.after.max.ms", Long, Some("3600000"), Some(0), "Largest allowed lead of a record's CreateTime ahead of the broker's clock (ms; KIP-937, 1 hour since Kafka 4.0). Stored and reported only: weir accepts any timestamp."),
    key("log.local.retention.ms", Long, Some("-2"), Some(-2), "Tiered storage: local retention (ms; -2: retention.ms; KIP-405). Stored and reported only: weir has no tiered storage."),
    key("log.local.retention.bytes", Long, Some("-2"), Some(-2), "Tiered storage: local retention (bytes; -2: retention.bytes; KIP-405). Stored and reported only."),
    key("log.cleaner.threads", Int, Some("1"), Some(0), "Log cleaner threads. Stored and reported only: weir's cleaner runs in the retention task."),
    key("log.cleaner.dedupe.buffer.size", Long, Some("134217728"), None, "Memory of the cleaner's key map (bytes). Stored and reported only."),
    key("log.cleaner.io.buffer.size", Int, Some("524288"), Some(0), "Cleaner I/O buffer (bytes). Stored and reported only."),
    key("log.cleaner.io.buffer.load.factor", Double, Some("0.9"), None, "Load factor of the cleaner's key map. Stored and reported only."),
    key("log.cleaner.backoff.ms", Long, Some("15000"), Some(0), "How long the cleaner sleeps when nothing needs cleaning (ms). Stored and reported only: weir compacts on log.retention.check.interval.ms."),
    key("num.io.threads", Int, Some("8"), Some(1), "Request handler threads. Stored and reported only: weir runs requests on its tokio runtime."),
    key("num.network.threads", Int, Some("3"), Some(1), "Network threads. Stored and reported only: weir runs sockets on its tokio runtime."),
    key("num.replica.fetchers", Int, Some("1"), Some(1), "Fetcher threads per source broker. Stored and reported only: weir fetches with one task per leader."),
    key("num.recovery.threads.per.data.dir", Int, Some("2"), Some(1), "Threads recovering logs at start-up. Stored and reported only."),
    key("background.threads", Int, Some("10"), Some(1), "Background task threads. Stored and reported only."),
    key("max.connections.per.ip", Int, Some("2147483647"), Some(0), "Most connections from one IP address. Stored and reported only: weir limits only the total (max.connections)."),
    key("max.connections.per.ip.overrides", KeyType::String, Some(""), None, "Per-IP or per-host overrides of max.connections.per.ip (host:count,...). Stored and reported only."),
    key("max.connection.creation.rate", Int, Some("2147483647"), Some(0), "Most new connections per second. Stored and reported only."),
    key("listener.security.protocol.map", KeyType::String, Some("SASL_SSL:SASL_SSL,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT"), None, "Listener name to security protocol (NAME:PROTOCOL,...): a Kafka listener may have any name mapped to PLAINTEXT (a name that is a protocol needs no entry); SSL and SASL_* are refused (not implemented)."),
    key("transform.config.dir", KeyType::String, None, None, "Directory of transform deployment TOML files (*.toml), loaded at start and watched; unset: none."),
    key("connect.config.dir", KeyType::String, None, None, "Directory of connector config TOML files (*.toml, Kafka Connect keys), started with the broker and watched (a new, changed or removed file creates, updates or deletes its connector); unset: only connectors created through the REST API."),
    key("connect.plugin.path", KeyType::String, Some("connectors/target/wasm32-wasip2/release"), None, "Directory holding the built-in connector components (file_source.wasm, file_sink.wasm); relative to the working directory."),
    key("connect.allowed.paths", List, Some("connect-files"), None, "The ceiling of what connectors may open: comma-separated directories (anything under them) or files; a connector's `file` directory and `database` must lie inside one, and never overlap log.dirs or plugin.cache.dir. Relative to the working directory. Default: one dedicated directory, ./connect-files (not /tmp, which every local user can write, nor the working directory, which holds ./data); empty: no files at all."),
    key("connect.http.allowed.hosts", List, Some("localhost,127.0.0.1,::1"), None, "The ceiling of the hosts connectors may reach over HTTP: comma-separated `host` (any port) or `host:port` (`[v6]:port`), or `*` for any host; a connector's http.allowed.hosts (or http.url's host) must lie inside it. Default: loopback only; empty: no HTTP at all."),
    key("connect.exactly.once.source.support", KeyType::String, Some("disabled"), None, "Kafka Connect's exactly.once.source.support (KIP-618): enabled writes each source task's records and their source offsets in one transaction of the transactional id connect-cluster-<connector>-0; disabled (at least once) and preparing (accepted for Kafka's rolling upgrade; runs as disabled) do not. A connector with exactly.once.support=required is refused unless enabled."),
];

/// A topic-level key (Kafka's `TopicConfig`) and the broker key supplying its default.
#[derive(Debug, Clone, Copy)]
pub struct TopicKeySpec {
    /// Topic-level name, e.g. `retention.ms`.
    pub name: &'static str,
    /// The broker key whose value is the default, e.g. `log.retention.ms` (Kafka's
    /// `ServerTopicConfigSynonyms`); `None` for the keys without one.
    pub broker_key: Option<&'static str>,
    /// Value type.
    pub key_type: KeyType,
    /// Default (as text) of a key without a broker synonym; `None` otherwise (the broker
    /// key's default applies).
    pub default: Option<&'static str>,
    /// Smallest accepted value of a numeric key (Kafka's `ConfigDef.Range.atLeast`).
    pub min: Option<i64>,
    /// One line of documentation; a key weir does not act on says so.
    pub doc: &'static str,
}

#[allow(clippy::too_many_arguments)]
const fn tk(
    name: &'static str,
    broker_key: Option<&'static str>,
    key_type: KeyType,
    default: Option<&'static str>,
    min: Option<i64>,
    doc: &'static str,
) -> TopicKeySpec {
    TopicKeySpec {
        name,
        broker_key,
        key_type,
        default,
        min,
        doc,
    }
}

/// Every topic-level key of Kafka 4.1 (`TopicConfig`), plus weir's `partitioner` keys and
/// the deprecated `message.format.version` (accepted as Kafka 3.x accepted it). Accepted
/// by CreateTopics, AlterConfigs and IncrementalAlterConfigs, validated as Kafka's
/// `LogConfig` validates them, reported by DescribeConfigs. Keys weir does not act on are
/// stored and reported, and their doc says so.
pub const TOPIC_KEYS: &[TopicKeySpec] = &[
    tk("cleanup.policy", Some("log.cleanup.policy"), List, None, None, "delete, compact, both (comma-separated), or empty: neither, every record is kept (Kafka 4.1)."),
    tk("compression.type", Some("compression.type"), KeyType::String, None, None, "producer (batches as sent); a codec is applied only to batches an inline transform re-encodes."),
    tk("compression.gzip.level", Some("compression.gzip.level"), Int, None, None, "gzip level (-1 or 1..9; KIP-390). Stored and reported only."),
    tk("compression.lz4.level", Some("compression.lz4.level"), Int, None, None, "lz4 level (1..17; KIP-390). Stored and reported only."),
    tk("compression.zstd.level", Some("compression.zstd.level"), Int, None, None, "zstd level (-131072..22; KIP-390). Stored and reported only."),
    tk("delete.retention.ms", Some("log.cleaner.delete.retention.ms"), Long, None, Some(0), "How long tombstones survive compaction (ms)."),
    tk("file.delete.delay.ms", Some("log.segment.delete.delay.ms"), Long, None, Some(0), "Delay before a deleted segment's file is removed (ms). Stored and reported only: weir removes it at once."),
    tk("flush.messages", Some("log.flush.interval.messages"), Long, None, Some(1), "fsync after this many records."),
    tk("flush.ms", Some("log.flush.interval.ms"), Long, None, Some(0), "fsync after this long (ms)."),
    tk("follower.replication.throttled.replicas", None, List, Some(""), None, "Replicas throttled on the follower side (partition:broker,... or *). Stored and reported only: weir does not throttle replication."),
    tk("index.interval.bytes", Some("log.index.interval.bytes"), Int, None, Some(0), "Bytes between offset-index entries."),
    tk("leader.replication.throttled.replicas", None, List, Some(""), None, "Replicas throttled on the leader side (partition:broker,... or *). Stored and reported only: weir does not throttle replication."),
    tk("local.retention.bytes", Some("log.local.retention.bytes"), Long, None, Some(-2), "Tiered storage local retention (bytes; -2: retention.bytes). Stored and reported only: weir has no tiered storage."),
    tk("local.retention.ms", Some("log.local.retention.ms"), Long, None, Some(-2), "Tiered storage local retention (ms; -2: retention.ms). Stored and reported only."),
    tk("max.compaction.lag.ms", Some("log.cleaner.max.compaction.lag.ms"), Long, None, Some(1), "Longest a record stays uncompacted (ms; KIP-354). Stored and reported only."),
    tk("max.message.bytes", Some("message.max.bytes"), Int, None, Some(0), "Largest record batch (bytes)."),
    tk("message.format.version", Some("log.message.format.version"), KeyType::String, None, None, "Deprecated, ignored (Kafka 3.x ignores it too); stored and reported only."),
    tk("message.timestamp.after.max.ms", Some("log.message.timestamp.after.max.ms"), Long, None, Some(0), "Largest lead of a CreateTime over the broker's clock (ms; KIP-937). Stored and reported only: weir accepts any timestamp."),
    tk("message.timestamp.before.max.ms", Some("log.message.timestamp.before.max.ms"), Long, None, Some(0), "Largest age of a CreateTime behind the broker's clock (ms; KIP-937). Stored and reported only."),
    tk("message.timestamp.type", Some("log.message.timestamp.type"), KeyType::String, None, None, "CreateTime or LogAppendTime."),
    tk("min.cleanable.dirty.ratio", Some("log.cleaner.min.cleanable.ratio"), Double, None, None, "Dirty fraction of closed bytes that triggers compaction (0..1)."),
    tk("min.compaction.lag.ms", Some("log.cleaner.min.compaction.lag.ms"), Long, None, Some(0), "Records newer than this are not compacted (ms; KIP-58)."),
    tk("min.insync.replicas", Some("min.insync.replicas"), Int, None, Some(1), "Replicas needed for acks=all."),
    tk("preallocate", Some("log.preallocate"), Boolean, None, None, "Preallocate segment files. Stored and reported only."),
    tk("remote.log.copy.disable", None, Boolean, Some("false"), None, "Tiered storage: stop copying segments to remote storage (KIP-950). Stored and reported only."),
    tk("remote.log.delete.on.disable", None, Boolean, Some("false"), None, "Tiered storage: delete remote segments when disabling it (KIP-950). Stored and reported only."),
    tk("remote.storage.enable", None, Boolean, Some("false"), None, "Tiered storage (KIP-405); weir has none, so true is refused as Kafka refuses it on a broker without remote.log.storage.system.enable."),
    tk("retention.bytes", Some("log.retention.bytes"), Long, None, Some(-1), "Largest partition size before old segments go; -1 no limit."),
    tk("retention.ms", Some("log.retention.ms"), Long, None, Some(-1), "Delete segments older than this (ms); -1 forever."),
    tk("segment.bytes", Some("log.segment.bytes"), Int, None, Some(14), "Segment size (bytes)."),
    tk("segment.index.bytes", Some("log.index.size.max.bytes"), Int, None, Some(4), "Largest offset index (bytes)."),
    tk("segment.jitter.ms", Some("log.roll.jitter.ms"), Long, None, Some(0), "Random jitter subtracted from segment.ms (ms). Stored and reported only."),
    tk("segment.ms", Some("log.roll.ms"), Long, None, Some(1), "Segment age before a roll (ms)."),
    tk("unclean.leader.election.enable", Some("unclean.leader.election.enable"), Boolean, None, None, "Elect a live replica outside the ISR when no ISR member is alive (may lose acknowledged records)."),
    tk("partitioner", Some("partitioner.file"), KeyType::String, None, None, "Partitioner component (.wasm path on the broker host) for records the broker routes itself; empty: murmur2."),
    tk("partitioner.config", Some("partitioner.config"), KeyType::String, None, None, "Comma-separated key=value pairs passed to the partitioner's open."),
];

/// A configuration error: names the key and says what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The path given.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("config file {path} is not valid TOML: {message}")]
    Toml {
        /// The path given.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A key weir does not know.
    #[error("unknown config key `{0}` (see config/weir.toml for every key)")]
    UnknownKey(String),
    /// A value of the wrong type or out of range.
    #[error("invalid value for `{key}`: {message}")]
    InvalidValue {
        /// The key.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// An `--override` without `=`.
    #[error("override `{0}` is not KEY=VALUE")]
    BadOverride(String),
}

/// A listener: name (`PLAINTEXT`, or a `controller.listener.names` one, served as
/// plaintext too), host and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// Listener name, e.g. `PLAINTEXT`.
    pub name: String,
    /// Host or IP address.
    pub host: String,
    /// TCP port; 0 asks the OS for one.
    pub port: u16,
}

impl Listener {
    /// Parses `NAME://HOST:PORT` (`[v6]:port` allowed).
    ///
    /// Errors: [`ConfigError::InvalidValue`] naming `key`.
    pub fn parse(key: &str, text: &str) -> Result<Listener, ConfigError> {
        let bad = |message: &str| ConfigError::InvalidValue {
            key: key.to_string(),
            message: format!("`{text}`: {message}"),
        };
        let (name, rest) = text
            .split_once("://")
            .ok_or_else(|| bad("expected NAME://HOST:PORT"))?;
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| bad("expected HOST:PORT after ://"))?;
        let port: u16 = port
            .parse()
            .map_err(|_| bad("port is not a number 0-65535"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let host = if host.is_empty() { "0.0.0.0" } else { host };
        // Which names are allowed depends on controller.listener.names: checked with the
        // other keys (`cluster::cluster_settings`).
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err(bad("the listener name is not [A-Z0-9_]+"));
        }
        Ok(Listener {
            name: name.to_string(),
            host: host.to_string(),
            port,
        })
    }
}

/// A raw key → text value map: what a file and overrides said, validated against
/// [`BROKER_KEYS`]. Every reader goes through the typed getters of [`BrokerConfig`].
#[derive(Debug, Clone, Default)]
pub struct RawConfig {
    values: BTreeMap<String, String>,
}

impl RawConfig {
    /// Reads a TOML file. Dotted tables are flattened (`[log] dirs = "x"` is `log.dirs`).
    ///
    /// Errors: [`ConfigError::Read`], [`ConfigError::Toml`], [`ConfigError::UnknownKey`],
    /// [`ConfigError::InvalidValue`].
    pub fn from_file(path: &Path) -> Result<RawConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        RawConfig::from_toml_str(&text).map_err(|e| match e {
            ConfigError::Toml { message, .. } => ConfigError::Toml {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })
    }

    /// Parses TOML text (see [`RawConfig::from_file`]).
    pub fn from_toml_str(text: &str) -> Result<RawConfig, ConfigError> {
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::Toml {
                path: PathBuf::new(),
                message: e.to_string(),
            })?;
        let mut raw = RawConfig::default();
        flatten("", &table, &mut raw)?;
        Ok(raw)
    }

    /// Applies `KEY=VALUE` overrides (Kafka's `kafka-server-start.sh --override`).
    ///
    /// Errors: [`ConfigError::BadOverride`], [`ConfigError::UnknownKey`],
    /// [`ConfigError::InvalidValue`].
    pub fn apply_overrides<S: AsRef<str>>(&mut self, overrides: &[S]) -> Result<(), ConfigError> {
        for o in overrides {
            let o = o.as_ref();
            let (k, v) = o
                .split_once('=')
                .ok_or_else(|| ConfigError::BadOverride(o.to_string()))?;
            self.set(k.trim(), v.trim())?;
        }
        Ok(())
    }

    /// Sets one key after checking it exists and its value parses.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let spec = broker_key(key).ok_or_else(|| ConfigError::UnknownKey(key.to_string()))?;
        check_value(spec.name, spec.key_type, spec.min, value)?;
        self.values.insert(key.to_string(), value.to_string());
        Ok(())
    }

    /// The explicitly set value of `key`, if any.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    /// The value of `key`: set or default (`None` for a null default).
    pub fn value(&self, key: &str) -> Option<String> {
        self.get(key)
            .map(str::to_string)
            .or_else(|| broker_key(key).and_then(|s| s.default.map(str::to_string)))
    }
}

fn flatten(prefix: &str, table: &toml::Table, out: &mut RawConfig) -> Result<(), ConfigError> {
    for (k, v) in table {
        let name = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        let text = match v {
            toml::Value::Table(t) => {
                flatten(&name, t, out)?;
                continue;
            }
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Array(items) => {
                let mut parts = Vec::new();
                for item in items {
                    match item {
                        toml::Value::String(s) => parts.push(s.clone()),
                        other => parts.push(other.to_string()),
                    }
                }
                parts.join(",")
            }
            other => {
                return Err(ConfigError::InvalidValue {
                    key: name,
                    message: format!("unsupported TOML value {other}"),
                })
            }
        };
        out.set(&name, &text)?;
    }
    Ok(())
}

/// The spec of a broker key, if weir knows it.
pub fn broker_key(name: &str) -> Option<&'static KeySpec> {
    BROKER_KEYS.iter().find(|k| k.name == name)
}

/// The spec of a topic-level key, if weir knows it.
pub fn topic_key(name: &str) -> Option<&'static TopicKeySpec> {
    TOPIC_KEYS.iter().find(|k| k.name == name)
}

/// Checks that `value` parses as `key_type` and respects `min`; also the enumerated keys.
///
/// Errors: [`ConfigError::InvalidValue`] naming `key`.
pub fn check_value(
    key: &str,
    key_type: KeyType,
    min: Option<i64>,
    value: &str,
) -> Result<(), ConfigError> {
    let bad = |message: String| ConfigError::InvalidValue {
        key: key.to_string(),
        message,
    };
    match key_type {
        KeyType::Boolean => {
            if value != "true" && value != "false" {
                return Err(bad(format!("`{value}` is not true or false")));
            }
        }
        KeyType::Int | KeyType::Long => {
            let n: i64 = value
                .parse()
                .map_err(|_| bad(format!("`{value}` is not an integer")))?;
            if key_type == KeyType::Int && i32::try_from(n).is_err() {
                return Err(bad(format!("`{value}` does not fit a 32-bit int")));
            }
            if let Some(min) = min {
                if n < min {
                    return Err(bad(format!("`{value}` is below the minimum {min}")));
                }
            }
        }
        KeyType::Double => {
            let x: f64 = value
                .parse()
                .map_err(|_| bad(format!("`{value}` is not a number")))?;
            if !x.is_finite() {
                return Err(bad(format!("`{value}` is not a finite number")));
            }
            if let Some(min) = min {
                if x < min as f64 {
                    return Err(bad(format!("`{value}` is below the minimum {min}")));
                }
            }
        }
        KeyType::String | KeyType::List => {}
    }
    match key {
        "log.message.timestamp.type" | "message.timestamp.type"
            if value != "CreateTime" && value != "LogAppendTime" =>
        {
            return Err(bad(format!("`{value}` is not CreateTime or LogAppendTime")));
        }
        "compression.type"
            if !matches!(
                value,
                "producer" | "uncompressed" | "gzip" | "snappy" | "lz4" | "zstd"
            ) =>
        {
            return Err(bad(format!(
                "`{value}` is not producer, uncompressed, gzip, snappy, lz4 or zstd"
            )));
        }
        "log.cleaner.min.cleanable.ratio" | "min.cleanable.dirty.ratio"
            if !value.parse::<f64>().is_ok_and(|x| (0.0..=1.0).contains(&x)) =>
        {
            return Err(bad(format!("`{value}` is not between 0 and 1")));
        }
        "log.cleaner.io.max.bytes.per.second" if !value.parse::<f64>().is_ok_and(|x| x > 0.0) => {
            return Err(bad(format!("`{value}` is not a positive number")));
        }
        // Kafka 4.1 accepts an empty list: neither delete nor compact, keep everything.
        "log.cleanup.policy" | "cleanup.policy" => {
            for p in list_items(value) {
                if !matches!(p, "delete" | "compact") {
                    return Err(bad(format!("`{p}` is not delete or compact")));
                }
            }
        }
        "compression.gzip.level" | "compression.lz4.level" | "compression.zstd.level" => {
            let n: i64 = value.parse().unwrap_or(i64::MIN);
            let ok = match key {
                "compression.gzip.level" => n == -1 || (1..=9).contains(&n),
                "compression.lz4.level" => (1..=17).contains(&n),
                _ => (-131_072..=22).contains(&n),
            };
            if !ok {
                return Err(bad(format!(
                    "`{value}` is outside the codec's levels (gzip -1 or 1..9, lz4 1..17, zstd -131072..22)"
                )));
            }
        }
        "leader.replication.throttled.replicas" | "follower.replication.throttled.replicas" => {
            let pair = |p: &str| {
                p.split_once(':').is_some_and(|(a, b)| {
                    a.trim().parse::<u32>().is_ok() && b.trim().parse::<u32>().is_ok()
                })
            };
            if value.trim() != "*" && !list_items(value).all(pair) {
                return Err(bad(format!(
                    "`{value}` must be the literal '*' or a list of replicas in the following format: [partitionId]:[brokerId],[partitionId]:[brokerId],..."
                )));
            }
        }
        "partitioner.config" => {
            parse_plugin_config(value).map_err(bad)?;
        }
        "listeners" | "advertised.listeners" => {
            for l in value.split(',').filter(|s| !s.trim().is_empty()) {
                Listener::parse(key, l.trim())?;
            }
        }
        "process.roles" if !value.trim().is_empty() => {
            ProcessRoles::parse(value)?;
        }
        "controller.quorum.voters" => {
            parse_voters(value)?;
        }
        _ => {}
    }
    Ok(())
}

/// Parses a plugin config value (`partitioner.config`): comma-separated `key=value`
/// pairs, trimmed, empty entries skipped, in the order given. A value may contain `=` but
/// not a comma.
///
/// Errors: an entry without `=` or with an empty key, as a message naming it.
pub fn parse_plugin_config(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        match entry.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                pairs.push((k.trim().to_string(), v.trim().to_string()))
            }
            _ => return Err(format!("`{entry}` is not key=value")),
        }
    }
    Ok(pairs)
}

/// The typed broker configuration every owner reads from. Built by [`BrokerConfig::from_raw`].
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// The validated key/value map (for DescribeConfigs).
    pub raw: RawConfig,
    /// `node.id`.
    pub node_id: i32,
    /// `listeners` a broker serves Kafka on: every entry but the controller listeners
    /// (those are in [`ClusterSettings::controller_listener`]).
    pub listeners: Vec<Listener>,
    /// The KRaft keys (`process.roles`, `controller.quorum.voters`, ...), checked together.
    pub cluster: ClusterSettings,
    /// `advertised.listeners` (empty: use the bound listeners).
    pub advertised_listeners: Vec<Listener>,
    /// `log.dirs`: every partition directory, in the order given (at least one, no two
    /// alike). A partition lives in exactly one of them (`replica.rs`).
    pub log_dirs: Vec<PathBuf>,
    /// `metadata.log.dir`, `None` when unset: see [`BrokerConfig::metadata_dir`].
    pub metadata_log_dir: Option<PathBuf>,
    /// `num.partitions`.
    pub num_partitions: i32,
    /// `default.replication.factor`.
    pub default_replication_factor: i16,
    /// `log.retention.check.interval.ms`.
    pub retention_check_interval_ms: u64,
    /// `producer.id.expiration.ms`: idempotent producer state idle this long (broker clock)
    /// is forgotten.
    pub producer_id_expiration_ms: i64,
    /// `producer.id.expiration.check.interval.ms`.
    pub producer_id_expiration_check_interval_ms: u64,
    /// `log.cleaner.io.max.bytes.per.second` (> 0; `f64::MAX`, the default, is no limit).
    pub cleaner_io_max_bytes_per_second: f64,
    /// `auto.create.topics.enable`.
    pub auto_create_topics_enable: bool,
    /// `delete.topic.enable`.
    pub delete_topic_enable: bool,
    /// `socket.request.max.bytes`.
    pub socket_request_max_bytes: usize,
    /// `max.connections`.
    pub max_connections: usize,
    /// `queued.max.requests`.
    pub queued_max_requests: usize,
    /// `connections.max.idle.ms`.
    pub connections_max_idle_ms: u64,
    /// `fetch.purgatory.max.size`.
    pub fetch_purgatory_max_size: usize,
    /// `log.open.files.max`: segment descriptors open at once over all partitions (0:
    /// derived from `RLIMIT_NOFILE` at start-up, `log::fdcache::derived_max_open`).
    pub log_open_files_max: usize,
    /// `fetch.max.bytes`.
    pub fetch_max_bytes: usize,
    /// `fetch.sendfile.enable`: consumers' record sets are sent from the segment files
    /// with `sendfile(2)` (issue 17).
    pub fetch_sendfile_enable: bool,
    /// `max.incremental.fetch.session.cache.slots`: fetch sessions cached (0: none).
    pub max_incremental_fetch_session_cache_slots: usize,
    /// Follower fetching and ISR upkeep (`replica.*`).
    pub replication: ReplicationSettings,
    /// `broker.rack` (`None`: not set; an empty value is not set either, as in Kafka).
    pub rack: Option<String>,
    /// `replica.selector.class`: which replica a consumer is told to read from (KIP-392).
    pub replica_selector: ReplicaSelector,
    /// Consumer group coordinator settings (`group.*`, `offsets.*`).
    pub group: GroupSettings,
    /// Transaction coordinator settings (`transaction.*`, `transactional.id.*`).
    pub transaction: TransactionSettings,
    /// `admin.max.inflight.request.bytes`: request-body bytes all admin HTTP requests
    /// together may hold at once.
    pub admin_max_inflight_request_bytes: u64,
    /// `admin.listeners`: the admin HTTP address (`None`: off).
    pub admin_listener: Option<AdminListener>,
    /// `plugin.*`: where compiled components are cached and the limits of every instance.
    pub plugin: PluginSettings,
    /// `transform.config.dir`: transform deployment files (`None`: none).
    pub transform_config_dir: Option<PathBuf>,
    /// `connect.config.dir`: connector config files (`None`: REST-created connectors only).
    pub connect_config_dir: Option<PathBuf>,
    /// `connect.plugin.path`: where built-in connector components are.
    pub connect_plugin_path: PathBuf,
    /// `connect.allowed.paths`: the directories (or files) connectors may be granted, as
    /// given (relative ones against the working directory); empty: none.
    pub connect_allowed_paths: Vec<PathBuf>,
    /// `connect.http.allowed.hosts`: the hosts connectors may be granted; `None` for `*`
    /// (any host), empty: none.
    pub connect_http_allowed_hosts: Option<Vec<crate::plugin::HttpHost>>,
    /// `connect.exactly.once.source.support` (Kafka Connect's
    /// `exactly.once.source.support`, KIP-618).
    pub connect_exactly_once_source: ExactlyOnceSourceSupport,
}

/// Kafka Connect's worker key `exactly.once.source.support` (KIP-618), weir's
/// `connect.exactly.once.source.support`: whether source tasks write their records and
/// source offsets in one transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExactlyOnceSourceSupport {
    /// `disabled` (the default): at least once.
    #[default]
    Disabled,
    /// `preparing`: Kafka's step of a rolling upgrade (its workers fence each other's
    /// config writes); weir has no such step and runs source tasks as `disabled`.
    Preparing,
    /// `enabled`: every source task is exactly once.
    Enabled,
}

impl ExactlyOnceSourceSupport {
    /// Parses a value (case-insensitive, as Kafka's `ConfigDef` validator).
    ///
    /// Errors: [`ConfigError::InvalidValue`] naming `connect.exactly.once.source.support`
    /// for any other value.
    pub fn parse(value: &str) -> Result<ExactlyOnceSourceSupport, ConfigError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "disabled" => Ok(ExactlyOnceSourceSupport::Disabled),
            "preparing" => Ok(ExactlyOnceSourceSupport::Preparing),
            "enabled" => Ok(ExactlyOnceSourceSupport::Enabled),
            other => Err(ConfigError::InvalidValue {
                key: "connect.exactly.once.source.support".into(),
                message: format!("`{other}`: expected disabled, preparing or enabled"),
            }),
        }
    }

    /// Kafka's spelling of the value.
    pub fn as_str(self) -> &'static str {
        match self {
            ExactlyOnceSourceSupport::Disabled => "disabled",
            ExactlyOnceSourceSupport::Preparing => "preparing",
            ExactlyOnceSourceSupport::Enabled => "enabled",
        }
    }
}

/// The admin HTTP listener, from `admin.listeners` (`http://HOST:PORT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminListener {
    /// Host or IP address to bind.
    pub host: String,
    /// TCP port; 0 asks the OS for one.
    pub port: u16,
}

/// The plugin host's settings (`plugin.*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginSettings {
    /// `plugin.cache.dir`, defaulting to `<metadata dir>/__plugin_cache`
    /// ([`BrokerConfig::metadata_dir`]).
    pub cache_dir: PathBuf,
    /// `plugin.memory.max.bytes`.
    pub memory_max_bytes: usize,
    /// `plugin.call.timeout.ms`.
    pub call_timeout_ms: u64,
}

/// Replication settings, Kafka's names (`ReplicationConfigs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicationSettings {
    /// `replica.lag.time.max.ms`.
    pub lag_time_max_ms: i64,
    /// `replica.fetch.wait.max.ms`.
    pub fetch_wait_max_ms: i32,
    /// `replica.fetch.max.bytes`.
    pub fetch_max_bytes: i32,
    /// `replica.fetch.response.max.bytes`.
    pub fetch_response_max_bytes: i32,
    /// `replica.fetch.backoff.ms`.
    pub fetch_backoff_ms: u64,
    /// `replica.high.watermark.checkpoint.interval.ms`: how often every partition's high
    /// watermark is written to `replication-offset-checkpoint` (also at clean shutdown).
    pub high_watermark_checkpoint_interval_ms: u64,
    /// `unclean.leader.election.enable`: the broker default of the topic key.
    pub unclean_leader_election_enable: bool,
    /// `auto.leader.rebalance.enable`.
    pub auto_leader_rebalance_enable: bool,
    /// `leader.imbalance.check.interval.seconds`, in ms.
    pub leader_imbalance_check_interval_ms: u64,
    /// `leader.imbalance.per.broker.percentage`.
    pub leader_imbalance_per_broker_percentage: u32,
}

/// `replica.selector.class` (KIP-392): which replica a leader tells a consumer to fetch
/// from (`preferred_read_replica`, Fetch v11+). Kafka's two built-in selectors, by their
/// class names; any other value stops start-up naming the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaSelector {
    /// `org.apache.kafka.common.replica.LeaderSelector` (the default): always the leader.
    Leader,
    /// `org.apache.kafka.common.replica.RackAwareReplicaSelector`: an in-sync follower in
    /// the consumer's `client.rack`, unless the leader is in it.
    RackAware,
}

impl ReplicaSelector {
    /// Kafka's class name of the leader selector.
    pub const LEADER_CLASS: &'static str = "org.apache.kafka.common.replica.LeaderSelector";
    /// Kafka's class name of the rack-aware selector.
    pub const RACK_AWARE_CLASS: &'static str =
        "org.apache.kafka.common.replica.RackAwareReplicaSelector";

    /// Parses a `replica.selector.class` value; empty means the default (Kafka's null).
    ///
    /// Errors: [`ConfigError::InvalidValue`] naming `replica.selector.class` for any
    /// other class.
    pub fn parse(value: &str) -> Result<ReplicaSelector, ConfigError> {
        match value.trim() {
            "" | Self::LEADER_CLASS => Ok(ReplicaSelector::Leader),
            Self::RACK_AWARE_CLASS => Ok(ReplicaSelector::RackAware),
            other => Err(ConfigError::InvalidValue {
                key: "replica.selector.class".into(),
                message: format!(
                    "`{other}` is not a supported selector ({} or {})",
                    Self::LEADER_CLASS,
                    Self::RACK_AWARE_CLASS
                ),
            }),
        }
    }
}

/// The group coordinator's settings, Kafka's names (`GroupCoordinatorConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupSettings {
    /// `group.initial.rebalance.delay.ms`.
    pub initial_rebalance_delay_ms: u64,
    /// `group.min.session.timeout.ms`.
    pub min_session_timeout_ms: i32,
    /// `group.max.session.timeout.ms`.
    pub max_session_timeout_ms: i32,
    /// `group.max.size`.
    pub max_size: usize,
    /// `offsets.topic.num.partitions`.
    pub offsets_topic_num_partitions: i32,
    /// `offsets.topic.segment.bytes`.
    pub offsets_topic_segment_bytes: i64,
    /// `offsets.topic.replication.factor` (capped at the live brokers at creation).
    pub offsets_topic_replication_factor: i16,
    /// `offsets.retention.minutes`, in ms.
    pub offsets_retention_ms: i64,
    /// `offsets.retention.check.interval.ms`.
    pub offsets_retention_check_interval_ms: u64,
    /// `offset.metadata.max.bytes`.
    pub offset_metadata_max_bytes: usize,
    /// Whether `group.coordinator.rebalance.protocols` lists `consumer` (KIP-848).
    pub consumer_protocol_enabled: bool,
    /// `group.consumer.*` (KIP-848).
    pub consumer: ConsumerGroupSettings,
}

/// The transaction coordinator's settings, Kafka's names (`TransactionStateManagerConfig`,
/// `TransactionLogConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransactionSettings {
    /// `transaction.state.log.num.partitions`.
    pub state_log_num_partitions: i32,
    /// `transaction.state.log.replication.factor` (capped at the live brokers at creation).
    pub state_log_replication_factor: i16,
    /// `transaction.state.log.min.isr`.
    pub state_log_min_isr: i32,
    /// `transaction.state.log.segment.bytes`.
    pub state_log_segment_bytes: i64,
    /// `transaction.max.timeout.ms`.
    pub max_timeout_ms: i32,
    /// `transactional.id.expiration.ms`.
    pub id_expiration_ms: i64,
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms`.
    pub abort_timed_out_interval_ms: u64,
    /// `transaction.remove.expired.transaction.cleanup.interval.ms`.
    pub remove_expired_interval_ms: u64,
    /// `transaction.version`: the finalized level of Kafka's `transaction.version`
    /// feature, 0–2 (KIP-890 part 2 at 2).
    pub version: i16,
}

impl BrokerConfig {
    /// Every key at its default: a single node on 127.0.0.1:9092 with data under `./data`.
    pub fn defaults() -> BrokerConfig {
        match BrokerConfig::from_raw(RawConfig::default()) {
            Ok(c) => c,
            // The defaults are ours: failing to parse them is a bug the unit tests catch.
            Err(e) => panic!("built-in defaults are invalid: {e}"),
        }
    }

    /// The directory of the broker's own files (`metadata.log.dir`, else the first of
    /// `log.dirs`, as Kafka places its KRaft metadata log): `__cluster_metadata/` (the
    /// Raft log, its `meta.properties`, `learner.port`), `replication-offset-checkpoint`
    /// and an earlier weir's `__transforms/`. The other log dirs hold partitions and their
    /// `.lock` only (docs/broker.md, "Several log directories").
    pub fn metadata_dir(&self) -> &Path {
        self.metadata_log_dir
            .as_deref()
            .unwrap_or(&self.log_dirs[0])
    }

    /// Every directory this broker writes and locks: `log.dirs`, then `metadata.log.dir`
    /// when it is apart from them.
    pub fn all_dirs(&self) -> Vec<&Path> {
        let mut dirs: Vec<&Path> = self.log_dirs.iter().map(PathBuf::as_path).collect();
        if let Some(m) = &self.metadata_log_dir {
            let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
            if !dirs.iter().any(|d| abs(d) == abs(m)) {
                dirs.push(m);
            }
        }
        dirs
    }

    /// Points every directory at `dir` (one log dir, metadata there too): for tests.
    pub fn set_single_dir(&mut self, dir: &Path) {
        self.log_dirs = vec![dir.to_path_buf()];
        self.metadata_log_dir = None;
    }

    /// Builds the typed config.
    ///
    /// Errors: [`ConfigError::InvalidValue`] for a value that parses alone but not with the
    /// others.
    pub fn from_raw(raw: RawConfig) -> Result<BrokerConfig, ConfigError> {
        let text = |k: &str| raw.value(k).unwrap_or_default();
        let int = |k: &str| -> Result<i64, ConfigError> {
            let v = text(k);
            v.parse().map_err(|_| ConfigError::InvalidValue {
                key: k.to_string(),
                message: format!("`{v}` is not an integer"),
            })
        };
        let listeners = parse_listeners("listeners", &text("listeners"))?;
        if listeners.is_empty() {
            return Err(ConfigError::InvalidValue {
                key: "listeners".into(),
                message: "at least one listener is needed".into(),
            });
        }
        let advertised_listeners =
            parse_listeners("advertised.listeners", &text("advertised.listeners"))?;
        let node_id = int("node.id")? as i32;
        let (cluster, listeners) =
            cluster::cluster_settings(&raw, node_id, listeners, &advertised_listeners)?;
        let offsets_topic_replication_factor = cluster.offsets_topic_replication_factor;
        let log_dirs = parse_log_dirs(&text("log.dirs"))?;
        let metadata_log_dir = raw
            .value("metadata.log.dir")
            .map(|d| d.trim().to_string())
            .filter(|d| !d.is_empty())
            .map(PathBuf::from);
        let default_plugin_cache_dir = metadata_log_dir
            .as_ref()
            .unwrap_or(&log_dirs[0])
            .join("__plugin_cache");
        let rf = int("default.replication.factor")?;
        Ok(BrokerConfig {
            log_dirs,
            metadata_log_dir,
            node_id,
            listeners,
            cluster,
            advertised_listeners,
            num_partitions: int("num.partitions")? as i32,
            default_replication_factor: i16::try_from(rf).map_err(|_| {
                ConfigError::InvalidValue {
                    key: "default.replication.factor".into(),
                    message: "too large".into(),
                }
            })?,
            retention_check_interval_ms: int("log.retention.check.interval.ms")? as u64,
            producer_id_expiration_ms: int("producer.id.expiration.ms")?,
            producer_id_expiration_check_interval_ms: int(
                "producer.id.expiration.check.interval.ms",
            )? as u64,
            cleaner_io_max_bytes_per_second: text("log.cleaner.io.max.bytes.per.second")
                .parse()
                .map_err(|_| ConfigError::InvalidValue {
                    key: "log.cleaner.io.max.bytes.per.second".into(),
                    message: "not a number".into(),
                })?,
            auto_create_topics_enable: text("auto.create.topics.enable") == "true",
            delete_topic_enable: text("delete.topic.enable") == "true",
            socket_request_max_bytes: int("socket.request.max.bytes")? as usize,
            max_connections: int("max.connections")? as usize,
            queued_max_requests: int("queued.max.requests")? as usize,
            connections_max_idle_ms: int("connections.max.idle.ms")? as u64,
            fetch_purgatory_max_size: int("fetch.purgatory.max.size")? as usize,
            log_open_files_max: int("log.open.files.max")? as usize,
            fetch_max_bytes: int("fetch.max.bytes")? as usize,
            fetch_sendfile_enable: text("fetch.sendfile.enable") == "true",
            max_incremental_fetch_session_cache_slots: int(
                "max.incremental.fetch.session.cache.slots",
            )? as usize,
            replication: ReplicationSettings {
                lag_time_max_ms: int("replica.lag.time.max.ms")?,
                fetch_wait_max_ms: int("replica.fetch.wait.max.ms")?.min(i64::from(i32::MAX))
                    as i32,
                fetch_max_bytes: int("replica.fetch.max.bytes")?.min(i64::from(i32::MAX)) as i32,
                fetch_response_max_bytes: int("replica.fetch.response.max.bytes")?
                    .min(i64::from(i32::MAX)) as i32,
                fetch_backoff_ms: int("replica.fetch.backoff.ms")? as u64,
                high_watermark_checkpoint_interval_ms: int(
                    "replica.high.watermark.checkpoint.interval.ms",
                )? as u64,
                unclean_leader_election_enable: text("unclean.leader.election.enable") == "true",
                auto_leader_rebalance_enable: text("auto.leader.rebalance.enable") == "true",
                leader_imbalance_check_interval_ms: int("leader.imbalance.check.interval.seconds")?
                    .saturating_mul(1000)
                    as u64,
                leader_imbalance_per_broker_percentage: int(
                    "leader.imbalance.per.broker.percentage",
                )?
                .min(i64::from(u32::MAX))
                    as u32,
            },
            rack: raw
                .value("broker.rack")
                .map(|r| r.trim().to_string())
                .filter(|r| !r.is_empty()),
            replica_selector: ReplicaSelector::parse(&text("replica.selector.class"))?,
            group: GroupSettings {
                initial_rebalance_delay_ms: int("group.initial.rebalance.delay.ms")? as u64,
                min_session_timeout_ms: int("group.min.session.timeout.ms")? as i32,
                max_session_timeout_ms: int("group.max.session.timeout.ms")? as i32,
                max_size: int("group.max.size")? as usize,
                offsets_topic_num_partitions: int("offsets.topic.num.partitions")? as i32,
                offsets_topic_segment_bytes: int("offsets.topic.segment.bytes")?,
                offsets_topic_replication_factor,
                offsets_retention_ms: int("offsets.retention.minutes")?.saturating_mul(60_000),
                offsets_retention_check_interval_ms: int("offsets.retention.check.interval.ms")?
                    as u64,
                offset_metadata_max_bytes: int("offset.metadata.max.bytes")? as usize,
                consumer_protocol_enabled: parse_rebalance_protocols(&text(
                    "group.coordinator.rebalance.protocols",
                ))?,
                consumer: ConsumerGroupSettings {
                    session_timeout_ms: int("group.consumer.session.timeout.ms")? as i32,
                    heartbeat_interval_ms: int("group.consumer.heartbeat.interval.ms")? as i32,
                    max_size: int("group.consumer.max.size")? as usize,
                    assignors: parse_assignors(&text("group.consumer.assignors"))?,
                    migration_policy: {
                        let policy = text("group.consumer.migration.policy");
                        MigrationPolicy::parse(&policy).ok_or_else(|| {
                            ConfigError::InvalidValue {
                                key: "group.consumer.migration.policy".to_string(),
                                message: format!(
                                "`{policy}` is none of disabled, downgrade, upgrade, bidirectional"
                            ),
                            }
                        })?
                    },
                },
            },
            transaction: TransactionSettings {
                state_log_num_partitions: int("transaction.state.log.num.partitions")? as i32,
                state_log_replication_factor: int("transaction.state.log.replication.factor")?
                    .min(i64::from(i16::MAX)) as i16,
                state_log_min_isr: int("transaction.state.log.min.isr")? as i32,
                state_log_segment_bytes: int("transaction.state.log.segment.bytes")?,
                max_timeout_ms: int("transaction.max.timeout.ms")? as i32,
                id_expiration_ms: int("transactional.id.expiration.ms")?,
                abort_timed_out_interval_ms: int(
                    "transaction.abort.timed.out.transaction.cleanup.interval.ms",
                )? as u64,
                remove_expired_interval_ms: int(
                    "transaction.remove.expired.transaction.cleanup.interval.ms",
                )? as u64,
                version: match int("transaction.version")? {
                    v @ 0..=2 => v as i16,
                    v => {
                        return Err(ConfigError::InvalidValue {
                            key: "transaction.version".to_string(),
                            message: format!("{v} is not 0, 1 or 2"),
                        })
                    }
                },
            },
            admin_listener: parse_admin_listener(&text("admin.listeners"))?,
            admin_max_inflight_request_bytes: int("admin.max.inflight.request.bytes")? as u64,
            plugin: PluginSettings {
                cache_dir: match raw.value("plugin.cache.dir") {
                    Some(d) if !d.is_empty() => PathBuf::from(d),
                    _ => default_plugin_cache_dir,
                },
                memory_max_bytes: int("plugin.memory.max.bytes")? as usize,
                call_timeout_ms: int("plugin.call.timeout.ms")? as u64,
            },
            transform_config_dir: raw
                .value("transform.config.dir")
                .filter(|d| !d.is_empty())
                .map(PathBuf::from),
            connect_config_dir: raw
                .value("connect.config.dir")
                .filter(|d| !d.is_empty())
                .map(PathBuf::from),
            connect_plugin_path: PathBuf::from(text("connect.plugin.path")),
            connect_allowed_paths: list_items(&text("connect.allowed.paths"))
                .map(PathBuf::from)
                .collect(),
            connect_http_allowed_hosts: parse_host_ceiling(&text("connect.http.allowed.hosts"))?,
            connect_exactly_once_source: ExactlyOnceSourceSupport::parse(&text(
                "connect.exactly.once.source.support",
            ))?,
            raw,
        })
    }

    /// Reads `path` (if given), applies overrides, builds the typed config.
    pub fn load(path: Option<&Path>, overrides: &[String]) -> Result<BrokerConfig, ConfigError> {
        let mut raw = match path {
            Some(p) => RawConfig::from_file(p)?,
            None => RawConfig::default(),
        };
        raw.apply_overrides(overrides)?;
        BrokerConfig::from_raw(raw)
    }

    /// The broker-level default of a topic key from the static config alone (no dynamic
    /// layer), with Kafka's fallbacks for the keys with several spellings
    /// (`log.retention.ms` > `.minutes` > `.hours`, `log.roll.ms` > `.hours`). Returns
    /// the value as text (`None`: null) and whether it was set explicitly (source
    /// STATIC_BROKER_CONFIG vs DEFAULT_CONFIG). See [`Self::topic_default_in`] for the
    /// dynamic layers.
    pub fn topic_default(&self, topic_key: &TopicKeySpec) -> (Option<String>, bool) {
        let (value, source) = self.topic_default_in(DynamicLayers::default(), topic_key);
        (value, source == ConfigSource::StaticBroker)
    }
}

/// Parses `admin.listeners`: empty (off) or one `http://HOST:PORT`.
///
/// Errors: [`ConfigError::InvalidValue`] for another scheme, several entries or a bad port.
/// The non-empty, trimmed items of a comma-separated list.
fn list_items(text: &str) -> impl Iterator<Item = &str> {
    text.split(',').map(str::trim).filter(|i| !i.is_empty())
}

/// `connect.http.allowed.hosts`: `None` when an item is `*` (any host), else every item
/// parsed as a [`crate::plugin::HttpHost`].
///
/// Errors: an item that is neither `*` nor `host` / `host:port`, naming the key.
fn parse_host_ceiling(text: &str) -> Result<Option<Vec<crate::plugin::HttpHost>>, ConfigError> {
    let mut hosts = Vec::new();
    for item in list_items(text) {
        if item == "*" {
            return Ok(None);
        }
        hosts.push(crate::plugin::HttpHost::parse(item).map_err(|why| {
            ConfigError::InvalidValue {
                key: "connect.http.allowed.hosts".into(),
                message: why,
            }
        })?);
    }
    Ok(Some(hosts))
}

fn parse_admin_listener(text: &str) -> Result<Option<AdminListener>, ConfigError> {
    let bad = |message: String| ConfigError::InvalidValue {
        key: "admin.listeners".into(),
        message,
    };
    let entries: Vec<&str> = text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let entry = match entries.as_slice() {
        [] => return Ok(None),
        [one] => *one,
        _ => return Err(bad("only one admin listener is supported".into())),
    };
    let rest = entry
        .strip_prefix("http://")
        .ok_or_else(|| bad(format!("`{entry}`: expected http://HOST:PORT")))?;
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| bad(format!("`{entry}`: expected http://HOST:PORT")))?;
    let port: u16 = port
        .trim_end_matches('/')
        .parse()
        .map_err(|_| bad(format!("`{entry}`: port is not a number 0-65535")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Ok(Some(AdminListener {
        host: if host.is_empty() { "0.0.0.0" } else { host }.to_string(),
        port,
    }))
}

/// `log.dirs`: comma-separated directories, blanks around each trimmed.
///
/// Errors: [`ConfigError::InvalidValue`] naming `log.dirs` when the list is empty, an entry
/// is empty, or one directory is named twice (after making it absolute: two names of one
/// directory would let two partitions logs share it; Kafka refuses duplicates too).
/// `group.coordinator.rebalance.protocols`: whether `consumer` is listed. `classic` must
/// be (as Kafka requires); `share` and `streams` are refused (not built).
fn parse_rebalance_protocols(text: &str) -> Result<bool, ConfigError> {
    let bad = |message: String| ConfigError::InvalidValue {
        key: "group.coordinator.rebalance.protocols".to_string(),
        message,
    };
    let mut consumer = false;
    let mut classic = false;
    for p in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match p.to_ascii_lowercase().as_str() {
            "classic" => classic = true,
            "consumer" => consumer = true,
            other => {
                return Err(bad(format!(
                    "unknown or unsupported group protocol `{other}` (classic, consumer)"
                )))
            }
        }
    }
    if !classic {
        return Err(bad("the classic protocol must be enabled".to_string()));
    }
    Ok(consumer)
}

/// `group.consumer.assignors` as one of the static orders (the settings stay `Copy`).
fn parse_assignors(text: &str) -> Result<&'static [AssignorKind], ConfigError> {
    use AssignorKind::{Range, Uniform};
    let mut kinds = Vec::new();
    for name in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let short = name.rsplit('.').next().unwrap_or(name);
        let kind = match short {
            "uniform" | "UniformAssignor" => Uniform,
            "range" | "RangeAssignor" => Range,
            _ => {
                return Err(ConfigError::InvalidValue {
                    key: "group.consumer.assignors".to_string(),
                    message: format!("unknown assignor `{name}` (uniform, range)"),
                })
            }
        };
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    Ok(match kinds.as_slice() {
        [Range, Uniform] => &[Range, Uniform],
        [Range] => &[Range],
        [Uniform] => &[Uniform],
        [] => {
            return Err(ConfigError::InvalidValue {
                key: "group.consumer.assignors".to_string(),
                message: "at least one assignor is needed".to_string(),
            })
        }
        _ => &[Uniform, Range],
    })
}

fn parse_log_dirs(text: &str) -> Result<Vec<PathBuf>, ConfigError> {
    let invalid = |message: String| ConfigError::InvalidValue {
        key: "log.dirs".into(),
        message,
    };
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for entry in text.split(',') {
        let entry = entry.trim();
        if entry.is_empty() {
            return Err(invalid(format!("empty directory in `{text}`")));
        }
        let dir = PathBuf::from(entry);
        let key = std::path::absolute(&dir).unwrap_or_else(|_| dir.clone());
        if !seen.insert(key) {
            return Err(invalid(format!("directory {entry} is named twice")));
        }
        dirs.push(dir);
    }
    Ok(dirs)
}

fn parse_listeners(key: &str, text: &str) -> Result<Vec<Listener>, ConfigError> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| Listener::parse(key, s))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_a_single_local_node() {
        let c = BrokerConfig::defaults();
        assert_eq!(c.listeners[0].host, "127.0.0.1");
        assert_eq!(c.listeners[0].port, 9092);
        assert_eq!(c.log_dirs, [PathBuf::from("./data")]);
        assert_eq!(c.metadata_dir(), Path::new("./data"));
        assert!(c.auto_create_topics_enable);
        assert_eq!(c.num_partitions, 1);
    }

    #[test]
    fn the_connect_ceiling_defaults_to_one_directory_and_loopback() {
        let c = BrokerConfig::defaults();
        assert_eq!(
            c.connect_allowed_paths,
            vec![PathBuf::from("connect-files")]
        );
        let hosts: Vec<String> = c
            .connect_http_allowed_hosts
            .expect("a list, not `*`")
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(hosts, ["localhost", "127.0.0.1", "::1"]);
        let load = |o: &str| BrokerConfig::load(None, &[o.to_string()]);
        assert_eq!(
            load("connect.http.allowed.hosts=a, *")
                .unwrap()
                .connect_http_allowed_hosts,
            None
        );
        let c = load("connect.allowed.paths=").unwrap();
        assert!(c.connect_allowed_paths.is_empty());
        let e = load("connect.http.allowed.hosts=a:99999")
            .unwrap_err()
            .to_string();
        assert!(e.contains("connect.http.allowed.hosts"), "{e}");
    }

    #[test]
    fn toml_dotted_and_quoted_keys_and_overrides() {
        let mut raw = RawConfig::from_toml_str(
            "log.dirs = \"/tmp/x\"\n\"num.partitions\" = 3\n[log.retention]\nbytes = 100\n",
        )
        .unwrap();
        raw.apply_overrides(&["num.partitions=5"]).unwrap();
        let c = BrokerConfig::from_raw(raw).unwrap();
        assert_eq!(c.log_dirs, [PathBuf::from("/tmp/x")]);
        assert_eq!(c.num_partitions, 5);
        assert_eq!(c.raw.get("log.retention.bytes"), Some("100"));
    }

    #[test]
    fn several_log_dirs_with_the_metadata_in_the_first_unless_named() {
        let load = |o: &[&str]| {
            BrokerConfig::load(None, &o.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        };
        let c = load(&["log.dirs=/d/a, /d/b ,/d/c"]).unwrap();
        assert_eq!(
            c.log_dirs,
            [
                PathBuf::from("/d/a"),
                PathBuf::from("/d/b"),
                PathBuf::from("/d/c")
            ]
        );
        assert_eq!(c.metadata_dir(), Path::new("/d/a"));
        assert_eq!(c.all_dirs().len(), 3);
        assert_eq!(c.plugin.cache_dir, PathBuf::from("/d/a/__plugin_cache"));
        let c = load(&["log.dirs=/d/a,/d/b", "metadata.log.dir=/m"]).unwrap();
        assert_eq!(c.metadata_dir(), Path::new("/m"));
        assert_eq!(
            c.all_dirs(),
            [Path::new("/d/a"), Path::new("/d/b"), Path::new("/m")]
        );
        let c = load(&["log.dirs=/d/a,/d/b", "metadata.log.dir=/d/b"]).unwrap();
        assert_eq!(c.all_dirs().len(), 2);
        for bad in ["log.dirs=/d/a,/d/a", "log.dirs=/d/a,,/d/b", "log.dirs="] {
            let e = load(&[bad]).unwrap_err().to_string();
            assert!(e.contains("log.dirs"), "{bad}: {e}");
        }
    }

    #[test]
    fn bad_config_names_the_key() {
        let e = RawConfig::from_toml_str("num.partitions = \"many\"").unwrap_err();
        assert!(e.to_string().contains("num.partitions"), "{e}");
        let e = RawConfig::from_toml_str("no.such.key = 1").unwrap_err();
        assert!(e.to_string().contains("no.such.key"), "{e}");
        let e = RawConfig::default()
            .apply_overrides(&["listeners=tcp:9092"])
            .unwrap_err();
        assert!(e.to_string().contains("listeners"), "{e}");
        let e = RawConfig::default()
            .apply_overrides(&["num.partitions=0"])
            .unwrap_err();
        assert!(e.to_string().contains("minimum"), "{e}");
    }

    #[test]
    fn cleaner_keys_are_checked_and_fall_back_to_the_broker() {
        let raw = RawConfig::from_toml_str("log.cleaner.min.cleanable.ratio = 0.25\n").unwrap();
        let c = BrokerConfig::from_raw(raw).unwrap();
        let spec = topic_key("min.cleanable.dirty.ratio").unwrap();
        assert_eq!(c.topic_default(spec), (Some("0.25".to_string()), true));
        assert_eq!(spec.key_type.describe_configs_code(), 6);
        for bad in ["1.5", "-0.1", "x", "NaN"] {
            let e = check_value("min.cleanable.dirty.ratio", Double, None, bad).unwrap_err();
            assert!(e.to_string().contains("min.cleanable.dirty.ratio"), "{e}");
        }
        check_value("min.cleanable.dirty.ratio", Double, None, "0.01").unwrap();
        let e = RawConfig::default()
            .apply_overrides(&["log.cleaner.delete.retention.ms=-1"])
            .unwrap_err();
        assert!(e.to_string().contains("minimum"), "{e}");
        let d = BrokerConfig::defaults();
        let spec = topic_key("delete.retention.ms").unwrap();
        assert_eq!(d.topic_default(spec), (Some("86400000".to_string()), false));
    }

    #[test]
    fn partitioner_keys_fall_back_to_the_broker_and_configs_are_pairs() {
        let mut raw = RawConfig::default();
        raw.set("partitioner.file", "/p/json_field.wasm").unwrap();
        raw.set("partitioner.config", "field=user_id").unwrap();
        let c = BrokerConfig::from_raw(raw).unwrap();
        let spec = topic_key("partitioner").unwrap();
        assert_eq!(
            c.topic_default(spec),
            (Some("/p/json_field.wasm".to_string()), true)
        );
        let spec = topic_key("partitioner.config").unwrap();
        assert_eq!(
            c.topic_default(spec),
            (Some("field=user_id".to_string()), true)
        );
        let d = BrokerConfig::defaults();
        assert_eq!(d.topic_default(spec), (Some(String::new()), false));
        assert_eq!(
            parse_plugin_config(" field = user.id , ,expr=a=b").unwrap(),
            vec![
                ("field".to_string(), "user.id".to_string()),
                ("expr".to_string(), "a=b".to_string())
            ]
        );
        for bad in ["field", "=x", "a=1,b"] {
            let e = check_value("partitioner.config", KeyType::String, None, bad).unwrap_err();
            assert!(e.to_string().contains("partitioner.config"), "{e}");
        }
        check_value("partitioner.config", KeyType::String, None, "").unwrap();
    }

    /// Every Kafka 4.1 topic key is known, and each family is checked as Kafka's
    /// `LogConfig` checks it: ranges, enumerations, lists.
    #[test]
    fn topic_keys_are_kafkas_and_validated_by_family() {
        for name in [
            "cleanup.policy",
            "compression.type",
            "compression.gzip.level",
            "compression.lz4.level",
            "compression.zstd.level",
            "delete.retention.ms",
            "file.delete.delay.ms",
            "flush.messages",
            "flush.ms",
            "follower.replication.throttled.replicas",
            "index.interval.bytes",
            "leader.replication.throttled.replicas",
            "local.retention.bytes",
            "local.retention.ms",
            "max.compaction.lag.ms",
            "max.message.bytes",
            "message.timestamp.after.max.ms",
            "message.timestamp.before.max.ms",
            "message.timestamp.type",
            "min.cleanable.dirty.ratio",
            "min.compaction.lag.ms",
            "min.insync.replicas",
            "preallocate",
            "remote.log.copy.disable",
            "remote.log.delete.on.disable",
            "remote.storage.enable",
            "retention.bytes",
            "retention.ms",
            "segment.bytes",
            "segment.index.bytes",
            "segment.jitter.ms",
            "segment.ms",
            "unclean.leader.election.enable",
        ] {
            let spec = topic_key(name).unwrap_or_else(|| panic!("{name} unknown"));
            if let Some(b) = spec.broker_key {
                assert!(
                    broker_key(b).is_some(),
                    "{name}'s synonym {b} is not a broker key"
                );
            } else {
                assert!(
                    spec.default.is_some(),
                    "{name} has neither synonym nor default"
                );
            }
        }
        let check = |k: &str, v: &str| {
            let spec = topic_key(k).unwrap();
            check_value(k, spec.key_type, spec.min, v)
        };
        let ok = [
            ("retention.ms", "-1"),
            ("local.retention.ms", "-2"),
            ("file.delete.delay.ms", "0"),
            ("max.compaction.lag.ms", "1"),
            ("compression.gzip.level", "-1"),
            ("compression.gzip.level", "9"),
            ("compression.lz4.level", "17"),
            ("compression.zstd.level", "-131072"),
            ("cleanup.policy", ""),
            ("cleanup.policy", "compact,delete"),
            ("preallocate", "true"),
            ("leader.replication.throttled.replicas", "*"),
            ("follower.replication.throttled.replicas", "0:1, 1:2"),
            ("follower.replication.throttled.replicas", ""),
            ("message.timestamp.type", "LogAppendTime"),
            ("segment.jitter.ms", "0"),
        ];
        for (k, v) in ok {
            check(k, v).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
        }
        let bad = [
            ("retention.ms", "-2"),
            ("local.retention.bytes", "-3"),
            ("file.delete.delay.ms", "-1"),
            ("max.compaction.lag.ms", "0"),
            ("compression.gzip.level", "0"),
            ("compression.gzip.level", "10"),
            ("compression.lz4.level", "18"),
            ("compression.zstd.level", "23"),
            ("cleanup.policy", "delete,keep"),
            ("preallocate", "yes"),
            ("leader.replication.throttled.replicas", "0-1"),
            ("message.timestamp.type", "Now"),
            ("segment.ms", "0"),
            ("max.message.bytes", "2147483648"),
            ("min.cleanable.dirty.ratio", "1.1"),
        ];
        for (k, v) in bad {
            let e = check(k, v).expect_err(&format!("{k}={v} accepted"));
            assert!(e.to_string().contains(k), "{e}");
        }
    }

    #[test]
    fn retention_fallbacks() {
        let mut raw = RawConfig::default();
        raw.set("log.retention.minutes", "2").unwrap();
        let c = BrokerConfig::from_raw(raw).unwrap();
        let spec = topic_key("retention.ms").unwrap();
        assert_eq!(c.topic_default(spec), (Some("120000".to_string()), true));
        let d = BrokerConfig::defaults();
        assert_eq!(
            d.topic_default(spec),
            (Some((168 * 3_600_000i64).to_string()), false)
        );
    }
}

#[cfg(test)]
mod tidy {
    use super::*;

    /// `config/weir.toml` documents every key, and parses as it stands.
    #[test]
    fn connect_exactly_once_source_support_takes_kafkas_three_values() {
        let load = |o: &str| BrokerConfig::load(None, &[o.to_string()]);
        assert_eq!(
            BrokerConfig::defaults().connect_exactly_once_source,
            ExactlyOnceSourceSupport::Disabled
        );
        for (v, want) in [
            ("disabled", ExactlyOnceSourceSupport::Disabled),
            ("preparing", ExactlyOnceSourceSupport::Preparing),
            ("ENABLED", ExactlyOnceSourceSupport::Enabled),
        ] {
            let c = load(&format!("connect.exactly.once.source.support={v}")).unwrap();
            assert_eq!(c.connect_exactly_once_source, want);
        }
        let e = load("connect.exactly.once.source.support=yes")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("connect.exactly.once.source.support") && e.contains("enabled"),
            "{e}"
        );
    }

    #[test]
    fn replica_selector_class_takes_kafkas_two_selectors_and_refuses_others() {
        let load = |o: &[&str]| {
            let o: Vec<String> = o.iter().map(|s| s.to_string()).collect();
            BrokerConfig::load(None, &o)
        };
        let c = load(&[]).unwrap();
        assert_eq!(
            (c.replica_selector, c.rack),
            (ReplicaSelector::Leader, None)
        );
        let c = load(&[
            "replica.selector.class=org.apache.kafka.common.replica.RackAwareReplicaSelector",
            "broker.rack=r2",
        ])
        .unwrap();
        assert_eq!(
            (c.replica_selector, c.rack.as_deref()),
            (ReplicaSelector::RackAware, Some("r2"))
        );
        let c = load(&["replica.selector.class=org.apache.kafka.common.replica.LeaderSelector"])
            .unwrap();
        assert_eq!(c.replica_selector, ReplicaSelector::Leader);
        let e = load(&["replica.selector.class=com.example.MySelector"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("replica.selector.class"), "{e}");
    }

    #[test]
    fn weir_toml_documents_every_key() {
        let text = include_str!("../../config/weir.toml");
        for k in BROKER_KEYS {
            assert!(
                text.contains(&format!("{} =", k.name)),
                "config/weir.toml lacks {}",
                k.name
            );
        }
        let raw = RawConfig::from_toml_str(text).expect("config/weir.toml parses");
        BrokerConfig::from_raw(raw).expect("config/weir.toml is valid");
    }
}
