//! Broker metrics, rendered in Prometheus' text exposition format (version 0.0.4) by the
//! admin listener's `GET /metrics` (`admin/metrics.rs`).
//!
//! Owns: the name, type, labels and help text of every metric weir exports, and one
//! [`Metrics`] per broker that the hot paths record into. Names follow Prometheus'
//! conventions with Kafka's concepts: a unit suffix (`_seconds`, `_bytes`, `_total` for
//! counters), lower-case labels.
//!
//! | metric | type | labels | what, where counted |
//! |---|---|---|---|
//! | `weir_requests_total` | counter | `api` | Kafka requests handled (Kafka's `RequestsPerSec`), `protocol::Handler` |
//! | `weir_request_duration_seconds` | histogram | `api` | frame in → response encoded, long-poll wait included (Kafka's `TotalTimeMs` less the network) |
//! | `weir_bytes_in_total` | counter | `topic` | record-batch bytes accepted by Produce (Kafka's `BytesInPerSec`) |
//! | `weir_messages_in_total` | counter | `topic` | records accepted by Produce (Kafka's `MessagesInPerSec`) |
//! | `weir_bytes_out_total` | counter | `topic` | record-batch bytes returned by Fetch (Kafka's `BytesOutPerSec`) |
//! | `weir_follower_fetch_records_total` | counter | `topic` | records a consumer's Fetch read from this broker while it was a follower of the partition (KIP-392 reads from followers), `protocol::fetch` |
//! | `weir_fetch_sessions` | gauge | | incremental fetch sessions cached (KIP-227; Kafka's `NumIncrementalFetchSessions`), `fetch_session` |
//! | `weir_fetch_session_evictions_total` | counter | | sessions evicted to make room for another (Kafka's `IncrementalFetchSessionEvictionsPerSec`) |
//! | `weir_incremental_fetches_total` | counter | | consumer Fetch requests accepted as incremental in a session |
//! | `weir_fetch_sendfile_bytes_total` | counter | | record-set bytes Fetch responses send from segment files with `sendfile(2)` (the rest of `weir_bytes_out_total` is copied), `protocol::fetch` |
//! | `weir_plugin_call_duration_seconds` | histogram | `plugin`, `call` | one call into a plugin (`partition`, `apply`, `poll`, `commit`, `put`, `flush`) |
//! | `weir_plugin_call_failures_total` | counter | `plugin`, `call` | calls that returned an error (trap, timeout, memory, the plugin's own error, a bad result) |
//! | `weir_partition_log_start_offset` | gauge | `topic`, `partition` | at scrape time |
//! | `weir_partition_log_end_offset` | gauge | `topic`, `partition` | at scrape time (Kafka's `LogEndOffset`) |
//! | `weir_partition_size_bytes` | gauge | `topic`, `partition` | bytes of the partition's segments, at scrape time (Kafka's `Size`) |
//! | `weir_group_lag` | gauge | `group`, `topic`, `partition` | high watermark − committed offset, in records, at scrape time |
//! | `weir_connector_tasks` | gauge | `connector`, `state` | tasks of the connector in each of Kafka Connect's task states, at scrape time |
//! | `weir_log_open_files` | gauge | | segment descriptors the process-wide cache holds open (`log::fdcache`), at scrape time |
//! | `weir_log_open_files_max` | gauge | | its bound, `log.open.files.max` (resolved) |
//! | `weir_log_open_file_evictions_total` | counter | | idle segments whose files the cache closed to stay within the bound |
//!
//! `plugin` is the component's file name. A connector's `state` is one of `UNASSIGNED`,
//! `RUNNING`, `PAUSED`, `STOPPED`, `RESTARTING`, `FAILED`; every state is listed for every
//! connector (0 for the others), so a state that empties shows as 0 rather than vanishing.
//!
//! **Decision: one recorder per broker, recorded through directly; never the global
//! one.** [`Metrics::new`] builds a `metrics-exporter-prometheus` `PrometheusRecorder`
//! that is not installed as the process' recorder, and registers handles on it through
//! the `metrics::Recorder` trait (per API at start, per topic and per plugin on first
//! use); the `counter!`/`histogram!` macros, which only reach the global (or a
//! thread-local, `with_local_recorder`) recorder, are not used. Why: the tests run many
//! brokers in one process, and a global recorder would sum their counts (a test could not
//! assert that *its* produce moved `weir_requests_total{api="Produce"}` by exactly its
//! request count), can be installed only once, and would make a broker started twice in
//! one process report the first one's totals. A thread-local recorder does not follow a
//! tokio task across worker threads. The cost is that the hot paths hold a handle (an
//! `Arc` to an atomic) instead of naming a metric at the call site — which is also
//! cheaper: counting a request is one atomic add, no registry look-up.
//!
//! **Scrape-time gauges.** Per-partition offsets and size, group lag and connector task
//! states are read from their owners when `/metrics` is scraped ([`Scrape`]), not updated
//! on every append: an append pays nothing, and a deleted topic, group or connector
//! disappears from the next scrape instead of leaving a stale series in the recorder.
//!
//! Histograms have fixed buckets ([`DURATION_BUCKETS_SECONDS`], 10 µs to 10 s) and are
//! rendered as Prometheus histograms, not summaries. Samples wait in the recorder until a
//! scrape or [`Metrics::run_upkeep`] folds them into the buckets; the broker runs the
//! upkeep every [`UPKEEP_INTERVAL_MS`] so an unscraped broker's memory stays bounded.
//!
//! Never does: serve HTTP (the admin listener does), read a clock other than for the
//! durations it is handed, or keep per-topic counters of a deleted topic apart from a
//! recreated one (counters are cumulative, as Prometheus expects; they restart at broker
//! restart).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ::metrics::{
    Counter, Gauge, Histogram, Key, KeyName, Label, Metadata, Recorder, SharedString, Unit,
};
use kafka_protocol::messages::ApiKey;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use crate::log::ValidatedBatch;

/// `weir_requests_total{api}`: Kafka requests handled, by API name (`Produce`, `Fetch`, ...).
pub const REQUESTS_TOTAL: &str = "weir_requests_total";
/// `weir_request_duration_seconds{api}`: histogram of request handling time, in seconds.
pub const REQUEST_DURATION_SECONDS: &str = "weir_request_duration_seconds";
/// `weir_bytes_in_total{topic}`: record-batch bytes accepted by Produce.
pub const BYTES_IN_TOTAL: &str = "weir_bytes_in_total";
/// `weir_messages_in_total{topic}`: records accepted by Produce.
pub const MESSAGES_IN_TOTAL: &str = "weir_messages_in_total";
/// `weir_bytes_out_total{topic}`: record-batch bytes returned by Fetch.
pub const BYTES_OUT_TOTAL: &str = "weir_bytes_out_total";
/// `weir_follower_fetch_records_total{topic}`: records consumers read from a follower
/// replica on this broker (KIP-392).
pub const FOLLOWER_FETCH_RECORDS_TOTAL: &str = "weir_follower_fetch_records_total";
/// `weir_fetch_sessions`: gauge, incremental fetch sessions cached (KIP-227).
pub const FETCH_SESSIONS: &str = "weir_fetch_sessions";
/// `weir_fetch_session_evictions_total`: fetch sessions evicted for another.
pub const FETCH_SESSION_EVICTIONS_TOTAL: &str = "weir_fetch_session_evictions_total";
/// `weir_incremental_fetches_total`: Fetch requests accepted as incremental.
pub const INCREMENTAL_FETCHES_TOTAL: &str = "weir_incremental_fetches_total";
/// `weir_fetch_sendfile_bytes_total`: record-set bytes Fetch sends from segment files.
pub const FETCH_SENDFILE_BYTES_TOTAL: &str = "weir_fetch_sendfile_bytes_total";
/// `weir_plugin_call_duration_seconds{plugin,call}`: histogram of plugin call time, seconds.
pub const PLUGIN_CALL_DURATION_SECONDS: &str = "weir_plugin_call_duration_seconds";
/// `weir_plugin_call_failures_total{plugin,call}`: plugin calls that returned an error.
pub const PLUGIN_CALL_FAILURES_TOTAL: &str = "weir_plugin_call_failures_total";
/// `weir_partition_log_start_offset{topic,partition}`: gauge, at scrape time.
pub const PARTITION_LOG_START_OFFSET: &str = "weir_partition_log_start_offset";
/// `weir_partition_log_end_offset{topic,partition}`: gauge, at scrape time.
pub const PARTITION_LOG_END_OFFSET: &str = "weir_partition_log_end_offset";
/// `weir_partition_size_bytes{topic,partition}`: gauge, at scrape time.
pub const PARTITION_SIZE_BYTES: &str = "weir_partition_size_bytes";
/// `weir_group_lag{group,topic,partition}`: gauge in records, at scrape time.
pub const GROUP_LAG: &str = "weir_group_lag";
/// `weir_connector_tasks{connector,state}`: gauge, at scrape time.
pub const CONNECTOR_TASKS: &str = "weir_connector_tasks";
/// `weir_log_open_files`: gauge, segment descriptors held open by the cache (process-wide).
pub const LOG_OPEN_FILES: &str = "weir_log_open_files";
/// `weir_log_open_files_max`: gauge, the cache's bound (`log.open.files.max`).
pub const LOG_OPEN_FILES_MAX: &str = "weir_log_open_files_max";
/// `weir_log_open_file_evictions_total`: counter, slots the cache closed (process-wide).
pub const LOG_OPEN_FILE_EVICTIONS_TOTAL: &str = "weir_log_open_file_evictions_total";

/// Bucket bounds (`le`) of every duration histogram, in seconds: from a warm plugin call
/// (~1 µs, in the first bucket) to a long-polled Fetch (`fetch.max.wait.ms` 500 ms by
/// default).
pub const DURATION_BUCKETS_SECONDS: &[f64] = &[
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// How often the broker folds recorded histogram samples into their buckets
/// ([`Metrics::run_upkeep`]), in milliseconds.
pub const UPKEEP_INTERVAL_MS: u64 = 5_000;

/// The `Content-Type` of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Registration metadata (the Prometheus recorder ignores it).
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), ::metrics::Level::INFO, Some(module_path!()));

/// Request counter and latency histogram of one API.
#[derive(Debug)]
struct ApiMetrics {
    requests: Counter,
    duration: Histogram,
}

/// Produce/Fetch byte counters of one topic.
#[derive(Debug)]
struct TopicMetrics {
    bytes_in: Counter,
    messages_in: Counter,
    bytes_out: Counter,
    follower_records_out: Counter,
}

#[derive(Debug)]
struct Inner {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// Indexed by API key; `None` for keys outside the dispatch table.
    apis: Vec<Option<ApiMetrics>>,
    topics: RwLock<HashMap<String, TopicMetrics>>,
    /// `weir_fetch_sendfile_bytes_total`.
    sendfile_bytes: Counter,
}

/// One broker's metrics: cheap to clone (an `Arc`), shared by the protocol layer, the
/// plugin host and the admin listener. See the module doc for names and the recorder
/// decision.
#[derive(Debug, Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

fn recorder() -> PrometheusRecorder {
    PrometheusBuilder::new()
        .set_buckets(DURATION_BUCKETS_SECONDS)
        // Only an empty list is refused, and ours is a non-empty constant.
        .expect("duration buckets are not empty")
        .build_recorder()
}

fn describe(recorder: &PrometheusRecorder, kind: Kind, name: &'static str, help: &'static str) {
    let (name, help) = (KeyName::from_const_str(name), SharedString::const_str(help));
    let unit = None::<Unit>;
    match kind {
        Kind::Counter => recorder.describe_counter(name, unit, help),
        Kind::Gauge => recorder.describe_gauge(name, unit, help),
        Kind::Histogram => recorder.describe_histogram(name, unit, help),
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Metrics {
    /// A fresh set of metrics with its own recorder, counting requests of `apis` (the
    /// broker passes the dispatch table, `protocol::SUPPORTED_APIS`): each is registered
    /// at once, so its counter and histogram are exported (at 0) before its first
    /// request.
    pub fn new(apis: impl IntoIterator<Item = ApiKey>) -> Metrics {
        let recorder = recorder();
        for (kind, name, help) in [
            (Kind::Counter, REQUESTS_TOTAL, "Kafka requests handled, by API."),
            (
                Kind::Histogram,
                REQUEST_DURATION_SECONDS,
                "Time from a request frame to its encoded response (long-poll wait included), in seconds.",
            ),
            (Kind::Counter, BYTES_IN_TOTAL, "Record-batch bytes accepted by Produce, by topic."),
            (Kind::Counter, MESSAGES_IN_TOTAL, "Records accepted by Produce, by topic."),
            (Kind::Counter, BYTES_OUT_TOTAL, "Record-batch bytes returned by Fetch, by topic."),
            (
                Kind::Counter,
                FOLLOWER_FETCH_RECORDS_TOTAL,
                "Records consumers read from a follower replica on this broker (KIP-392), by topic.",
            ),
            (
                Kind::Gauge,
                FETCH_SESSIONS,
                "Incremental fetch sessions cached (KIP-227).",
            ),
            (
                Kind::Counter,
                FETCH_SESSION_EVICTIONS_TOTAL,
                "Fetch sessions evicted to make room for another.",
            ),
            (
                Kind::Counter,
                INCREMENTAL_FETCHES_TOTAL,
                "Consumer Fetch requests accepted as incremental in a fetch session.",
            ),
            (
                Kind::Counter,
                FETCH_SENDFILE_BYTES_TOTAL,
                "Record-set bytes Fetch responses send from segment files with sendfile(2).",
            ),
            (
                Kind::Histogram,
                PLUGIN_CALL_DURATION_SECONDS,
                "Time of one call into a plugin, in seconds.",
            ),
            (
                Kind::Counter,
                PLUGIN_CALL_FAILURES_TOTAL,
                "Plugin calls that returned an error (trap, timeout, memory limit, the plugin's error, an invalid result).",
            ),
        ] {
            describe(&recorder, kind, name, help);
        }
        let mut by_key: Vec<Option<ApiMetrics>> = Vec::new();
        for key in apis {
            // API keys are small and non-negative (0..=74 in kafka-protocol 0.18).
            let Ok(index) = usize::try_from(key as i16) else {
                continue;
            };
            if by_key.len() <= index {
                by_key.resize_with(index + 1, || None);
            }
            let labels = || vec![Label::new("api", api_name(key))];
            by_key[index] = Some(ApiMetrics {
                requests: recorder
                    .register_counter(&Key::from_parts(REQUESTS_TOTAL, labels()), &METADATA),
                duration: recorder.register_histogram(
                    &Key::from_parts(REQUEST_DURATION_SECONDS, labels()),
                    &METADATA,
                ),
            });
        }
        let handle = recorder.handle();
        let sendfile_bytes =
            recorder.register_counter(&Key::from_name(FETCH_SENDFILE_BYTES_TOTAL), &METADATA);
        Metrics {
            inner: Arc::new(Inner {
                recorder,
                handle,
                apis: by_key,
                topics: RwLock::new(HashMap::new()),
                sendfile_bytes,
            }),
        }
    }

    /// Counts one request of API `api_key` (the raw key from the frame) that took
    /// `elapsed`. Keys outside the dispatch table are not counted (their connection is
    /// closed before any work).
    pub fn request(&self, api_key: i16, elapsed: Duration) {
        let Some(Some(api)) = usize::try_from(api_key)
            .ok()
            .and_then(|i| self.inner.apis.get(i))
        else {
            return;
        };
        api.requests.increment(1);
        api.duration.record(elapsed);
    }

    /// Counts what a Produce appended to `topic`: `batch` bytes and records.
    pub fn produced(&self, topic: &str, batch: Appended) {
        self.with_topic(topic, |t| {
            t.bytes_in.increment(batch.bytes);
            t.messages_in.increment(batch.records);
        });
    }

    /// Counts `bytes` of record batches a Fetch response returns from `topic`.
    pub fn fetched(&self, topic: &str, bytes: u64) {
        if bytes > 0 {
            self.with_topic(topic, |t| t.bytes_out.increment(bytes));
        }
    }

    /// Counts `bytes` of record sets a Fetch response sends from segment files
    /// (`sendfile(2)`, issue 17).
    pub fn sent_from_files(&self, bytes: u64) {
        if bytes > 0 {
            self.inner.sendfile_bytes.increment(bytes);
        }
    }

    /// Counts `records` a consumer's Fetch read from `topic` on this broker as a
    /// follower replica (KIP-392).
    pub fn fetched_from_follower(&self, topic: &str, records: u64) {
        if records > 0 {
            self.with_topic(topic, |t| t.follower_records_out.increment(records));
        }
    }

    /// Runs `f` on `topic`'s counters, registering them on its first use (the map grows
    /// with the topics that had data appended or fetched; a deleted topic's counters stay
    /// until restart, as the module doc says).
    fn with_topic(&self, topic: &str, f: impl FnOnce(&TopicMetrics)) {
        let topics = &self.inner.topics;
        if let Some(t) = topics.read().unwrap_or_else(|p| p.into_inner()).get(topic) {
            return f(t);
        }
        let recorder = &self.inner.recorder;
        let key = |name: &'static str| Key::from_parts(name, vec![label("topic", topic)]);
        let mut topics = topics.write().unwrap_or_else(|p| p.into_inner());
        let t = topics
            .entry(topic.to_string())
            .or_insert_with(|| TopicMetrics {
                bytes_in: recorder.register_counter(&key(BYTES_IN_TOTAL), &METADATA),
                messages_in: recorder.register_counter(&key(MESSAGES_IN_TOTAL), &METADATA),
                bytes_out: recorder.register_counter(&key(BYTES_OUT_TOTAL), &METADATA),
                follower_records_out: recorder
                    .register_counter(&key(FOLLOWER_FETCH_RECORDS_TOTAL), &METADATA),
            });
        f(t)
    }

    /// The handles of calls named `call` (`partition`, `apply`, ...) into plugin `plugin`
    /// (its file name). Register once per loaded plugin and keep them: this takes the
    /// recorder's registry lock.
    pub fn plugin_calls(&self, plugin: &str, call: &'static str) -> PluginCalls {
        let recorder = &self.inner.recorder;
        let key = |name: &'static str| {
            Key::from_parts(
                name,
                vec![
                    label("plugin", plugin),
                    Label::from_static_parts("call", call),
                ],
            )
        };
        PluginCalls {
            duration: recorder.register_histogram(&key(PLUGIN_CALL_DURATION_SECONDS), &METADATA),
            failures: recorder.register_counter(&key(PLUGIN_CALL_FAILURES_TOTAL), &METADATA),
        }
    }

    /// The handles of the fetch session cache (`crate::fetch_session`). Registered at
    /// start by the broker, so the series exist (at 0) before the first session.
    pub fn fetch_sessions(&self) -> FetchSessionMetrics {
        let recorder = &self.inner.recorder;
        let key = |name: &'static str| Key::from_name(name);
        FetchSessionMetrics {
            sessions: recorder.register_gauge(&key(FETCH_SESSIONS), &METADATA),
            evictions: recorder.register_counter(&key(FETCH_SESSION_EVICTIONS_TOTAL), &METADATA),
            incremental: recorder.register_counter(&key(INCREMENTAL_FETCHES_TOTAL), &METADATA),
        }
    }

    /// Folds recorded histogram samples into their buckets (bounding the memory samples
    /// wait in between scrapes). The broker calls it every [`UPKEEP_INTERVAL_MS`].
    pub fn run_upkeep(&self) {
        self.inner.handle.run_upkeep();
    }

    /// Everything recorded, then the gauges of `scrape`, in Prometheus' text format
    /// ([`CONTENT_TYPE`]).
    pub fn render(&self, scrape: Scrape) -> String {
        let mut out = self.inner.handle.render();
        out.push_str(&scrape.recorder.handle().render());
        out
    }
}

/// A label whose value comes from a user (topic, group, connector or plugin name).
///
/// The exporter escapes `"` and newlines but takes a backslash as the start of an escape
/// already written (so `\"` would come out as `"`, losing the backslash); doubling every
/// backslash first makes each value render as the same string.
fn label(key: &'static str, value: &str) -> Label {
    Label::new(key, value.replace('\\', "\\\\"))
}

/// The `api` label of a key: its name in the protocol guide (`Produce`, `ApiVersions`).
fn api_name(key: ApiKey) -> String {
    format!("{key:?}")
}

/// The fetch session cache's handles ([`Metrics::fetch_sessions`]).
#[derive(Debug, Clone)]
pub struct FetchSessionMetrics {
    /// `weir_fetch_sessions`.
    pub sessions: Gauge,
    /// `weir_fetch_session_evictions_total`.
    pub evictions: Counter,
    /// `weir_incremental_fetches_total`.
    pub incremental: Counter,
}

/// What one Produce appended to a partition: bytes and records of its batches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Appended {
    /// Sum of the batches' lengths, in bytes (headers included, as stored).
    pub bytes: u64,
    /// Sum of the batches' record counts.
    pub records: u64,
}

impl Appended {
    /// The bytes and records of `batches`.
    pub fn of(batches: &[ValidatedBatch]) -> Appended {
        batches.iter().fold(Appended::default(), |a, b| Appended {
            bytes: a.bytes + b.len() as u64,
            records: a.records + u64::try_from(b.record_count()).unwrap_or(0),
        })
    }
}

/// Duration histogram and failure counter of one kind of call into one plugin
/// ([`Metrics::plugin_calls`]); [`PluginCalls::noop`] records nothing (a host without
/// metrics: the CLI, unit tests).
#[derive(Debug, Clone)]
pub struct PluginCalls {
    duration: Histogram,
    failures: Counter,
}

impl PluginCalls {
    /// Handles that record nothing.
    pub fn noop() -> PluginCalls {
        PluginCalls {
            duration: Histogram::noop(),
            failures: Counter::noop(),
        }
    }

    /// Records one call that took `elapsed` and failed when `failed`.
    pub fn record(&self, elapsed: Duration, failed: bool) {
        self.duration.record(elapsed);
        if failed {
            self.failures.increment(1);
        }
    }
}

/// The gauges read from the owners at scrape time, in a recorder of their own made for
/// one scrape (so nothing of an earlier scrape lingers). Filled by the `/metrics` handler,
/// then passed to [`Metrics::render`].
#[derive(Debug)]
pub struct Scrape {
    recorder: PrometheusRecorder,
}

impl Default for Scrape {
    fn default() -> Self {
        Scrape::new()
    }
}

/// One partition's state at scrape time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionGauges {
    /// First offset still in the log.
    pub log_start_offset: i64,
    /// Offset the next append gets.
    pub log_end_offset: i64,
    /// Bytes of the partition's segment files.
    pub size_bytes: u64,
}

impl Scrape {
    /// An empty scrape, its gauges described.
    pub fn new() -> Scrape {
        let recorder = PrometheusBuilder::new().build_recorder();
        for (name, help) in [
            (
                PARTITION_LOG_START_OFFSET,
                "First offset still in the partition's log.",
            ),
            (
                PARTITION_LOG_END_OFFSET,
                "Offset the partition's next appended record gets.",
            ),
            (
                PARTITION_SIZE_BYTES,
                "Bytes of the partition's segment files.",
            ),
            (
                GROUP_LAG,
                "Records between a group's committed offset and the partition's high watermark.",
            ),
            (
                CONNECTOR_TASKS,
                "Tasks of a connector in each of Kafka Connect's task states.",
            ),
            (
                LOG_OPEN_FILES,
                "Segment file descriptors the process-wide cache holds open.",
            ),
            (
                LOG_OPEN_FILES_MAX,
                "Bound of the segment file descriptor cache (log.open.files.max).",
            ),
        ] {
            describe(&recorder, Kind::Gauge, name, help);
        }
        describe(
            &recorder,
            Kind::Counter,
            LOG_OPEN_FILE_EVICTIONS_TOTAL,
            "Idle segments whose files the descriptor cache closed to stay within its bound.",
        );
        Scrape { recorder }
    }

    fn gauge(&self, name: &'static str, labels: Vec<Label>, value: f64) {
        self.recorder
            .register_gauge(&Key::from_parts(name, labels), &METADATA)
            .set(value);
    }

    /// Partition `partition` of `topic`.
    pub fn partition(&self, topic: &str, partition: i32, gauges: PartitionGauges) {
        let labels = || {
            vec![
                label("topic", topic),
                Label::new("partition", partition.to_string()),
            ]
        };
        self.gauge(
            PARTITION_LOG_START_OFFSET,
            labels(),
            gauges.log_start_offset as f64,
        );
        self.gauge(
            PARTITION_LOG_END_OFFSET,
            labels(),
            gauges.log_end_offset as f64,
        );
        self.gauge(PARTITION_SIZE_BYTES, labels(), gauges.size_bytes as f64);
    }

    /// The segment descriptor cache's figures (process-wide: brokers sharing a process,
    /// as in tests, share it).
    pub fn log_open_files(&self, stats: crate::log::fdcache::OpenFileStats) {
        self.gauge(LOG_OPEN_FILES, Vec::new(), stats.open as f64);
        self.gauge(LOG_OPEN_FILES_MAX, Vec::new(), stats.max_open as f64);
        self.recorder
            .register_counter(
                &Key::from_parts(LOG_OPEN_FILE_EVICTIONS_TOTAL, Vec::<Label>::new()),
                &METADATA,
            )
            .absolute(stats.evictions);
    }

    /// Group `group`'s lag on a partition, in records.
    pub fn group_lag(&self, group: &str, topic: &str, partition: i32, lag: i64) {
        self.gauge(
            GROUP_LAG,
            vec![
                label("group", group),
                label("topic", topic),
                Label::new("partition", partition.to_string()),
            ],
            lag as f64,
        );
    }

    /// `tasks` tasks of `connector` in `state` (Kafka Connect's name, `RUNNING`, ...).
    pub fn connector_tasks(&self, connector: &str, state: &'static str, tasks: u32) {
        self.gauge(
            CONNECTOR_TASKS,
            vec![
                label("connector", connector),
                Label::from_static_parts("state", state),
            ],
            f64::from(tasks),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(text: &str, line_start: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(line_start)?.trim().parse().ok())
    }

    const API_KEYS: [ApiKey; 2] = [ApiKey::Produce, ApiKey::Fetch];

    #[test]
    fn two_brokers_count_apart() {
        let (a, b) = (Metrics::new(API_KEYS), Metrics::new(API_KEYS));
        a.request(ApiKey::Produce as i16, Duration::from_millis(2));
        a.request(ApiKey::Produce as i16, Duration::from_millis(3));
        b.request(ApiKey::Produce as i16, Duration::from_millis(2));
        let (a, b) = (a.render(Scrape::new()), b.render(Scrape::new()));
        assert_eq!(
            sample(&a, "weir_requests_total{api=\"Produce\"}"),
            Some(2.0),
            "{a}"
        );
        assert_eq!(
            sample(&b, "weir_requests_total{api=\"Produce\"}"),
            Some(1.0),
            "{b}"
        );
        // Registered at start: exported at 0 before the first request.
        assert_eq!(
            sample(&a, "weir_requests_total{api=\"Fetch\"}"),
            Some(0.0),
            "{a}"
        );
        assert_eq!(
            sample(&a, "weir_request_duration_seconds_count{api=\"Produce\"}"),
            Some(2.0),
            "{a}"
        );
        assert_eq!(
            sample(
                &a,
                "weir_request_duration_seconds_bucket{api=\"Produce\",le=\"0.0025\"}"
            ),
            Some(1.0),
            "{a}"
        );
        assert!(
            a.contains("# TYPE weir_request_duration_seconds histogram"),
            "{a}"
        );
    }

    #[test]
    fn unknown_and_unsupported_keys_are_not_counted() {
        let m = Metrics::new(API_KEYS);
        m.request(-1, Duration::ZERO);
        m.request(i16::MAX, Duration::ZERO);
        m.request(ApiKey::DescribeAcls as i16, Duration::ZERO);
        let text = m.render(Scrape::new());
        assert!(!text.contains("DescribeAcls"), "{text}");
    }

    #[test]
    fn topics_and_plugins_get_their_series() {
        let m = Metrics::new(API_KEYS);
        m.produced(
            "t",
            Appended {
                bytes: 100,
                records: 3,
            },
        );
        m.produced(
            "t",
            Appended {
                bytes: 50,
                records: 1,
            },
        );
        m.fetched("t", 70);
        m.fetched("u", 0);
        let calls = m.plugin_calls("p.wasm", "apply");
        calls.record(Duration::from_micros(5), false);
        calls.record(Duration::from_micros(5), true);
        let scrape = Scrape::new();
        scrape.partition(
            "t",
            0,
            PartitionGauges {
                log_start_offset: 0,
                log_end_offset: 4,
                size_bytes: 150,
            },
        );
        scrape.group_lag("g", "t", 0, 2);
        scrape.connector_tasks("c", "RUNNING", 1);
        let text = m.render(scrape);
        for (series, value) in [
            ("weir_bytes_in_total{topic=\"t\"}", 150.0),
            ("weir_messages_in_total{topic=\"t\"}", 4.0),
            ("weir_bytes_out_total{topic=\"t\"}", 70.0),
            (
                "weir_plugin_call_failures_total{plugin=\"p.wasm\",call=\"apply\"}",
                1.0,
            ),
            (
                "weir_plugin_call_duration_seconds_count{plugin=\"p.wasm\",call=\"apply\"}",
                2.0,
            ),
            (
                "weir_partition_log_end_offset{topic=\"t\",partition=\"0\"}",
                4.0,
            ),
            (
                "weir_partition_size_bytes{topic=\"t\",partition=\"0\"}",
                150.0,
            ),
            (
                "weir_group_lag{group=\"g\",topic=\"t\",partition=\"0\"}",
                2.0,
            ),
            (
                "weir_connector_tasks{connector=\"c\",state=\"RUNNING\"}",
                1.0,
            ),
        ] {
            assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
        }
        // A topic that only had empty fetches has no series.
        assert!(!text.contains("topic=\"u\""), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let scrape = Scrape::new();
        scrape.group_lag("a\"b\\c\nd", "t", 0, 1);
        // A backslash before a quote, and two in a row, keep every backslash.
        scrape.group_lag("x\\\"y\\\\", "t", 0, 2);
        let text = Metrics::new(API_KEYS).render(scrape);
        assert!(
            text.contains(r#"weir_group_lag{group="a\"b\\c\nd",topic="t",partition="0"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"weir_group_lag{group="x\\\"y\\\\",topic="t",partition="0"} 2"#),
            "{text}"
        );
    }
}
