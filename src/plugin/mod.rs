//! WebAssembly plugins: the wasmtime engine, the component cache, the sandbox, and the
//! partitioner and transform runtimes. The only module that imports wasmtime; no
//! `wasmtime` type appears in its public API.
//!
//! Contract: the WIT package `weir:plugin@0.1.0` in `wit/` (worlds `partitioner` and
//! `transform`). Guests are built from `plugins/` with the SDK there.
//!
//! - One [`PluginHost`] owns one `wasmtime::Engine` (component model, async calls, epoch
//!   interruption) and one ticker thread that advances the epoch every
//!   [`EPOCH_TICK_MS`] ms while a call deadline is ahead, and parks otherwise (a
//!   broker with no plugin call in flight does not wake every tick).
//! - Components are compiled once: cached in memory and, with
//!   [`PluginHostConfig::cache_dir`], on disk as `<sha256 of the .wasm>.cwasm`, so a
//!   restart loads in ~1 ms instead of compiling in ~100 ms.
//! - Each loaded plugin is checked against its world at load, before linking
//!   (`instance::check_world`): an import weir does not provide, a missing export and a
//!   component built for another version of `weir:plugin` are each refused with a message
//!   naming them. It then links once (`InstancePre`) and owns one instance in its own
//!   `Store`; the instance lifecycle is shared by both runtimes (`instance.rs`).
//! - Sandbox: no ambient capabilities — an empty WASI context (no files, environment,
//!   arguments or sockets; clocks and random only), guest stdout/stderr logged line by
//!   line through `tracing` with the plugin name; memory capped per store
//!   ([`PluginLimits::memory_bytes`]); every call (including instantiation and `open`)
//!   has a wall-clock deadline ([`PluginLimits::call_timeout_ms`]) enforced by epoch
//!   interruption, which also bounds CPU. At every epoch tick a running guest yields to
//!   Tokio (`sandbox::CallDeadline`), so a spinning plugin never holds a runtime thread
//!   for more than one tick: other requests and topics keep being served. Fuel is not
//!   used: it bounds instructions, not time, and a deadline is what the broker needs.
//! - A trap, timeout, out-of-memory or guest panic fails that call only: the instance is
//!   dropped with its store and a fresh one is made from the `InstancePre` (and opened
//!   with the same config) before the next call.
//!
//! Calls are `async` (wasmtime's async mode): WASI's blocking stream calls would
//! otherwise start a Tokio runtime inside the caller's, which panics on a runtime thread.
//!
//! Not here: deployments, hot reload and the DLQ (`crate::transform` watches files and
//! loads new versions through this host). Not yet: instance pools.

mod cache;
mod connector;
mod http;
mod instance;
mod partitioner;
mod sandbox;
mod sqlite;
mod state;
mod transform;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub use connector::{
    ConnectorGrants, DirGrant, ErrantRecord, PutOutcome, PutRetry, SinkConnector, SinkRecord,
    SourceConnector, SourcePosition, SourceRecord, StringMap, TopicOffset,
};
pub use http::HttpHost;
use instance::Instance;
pub use partitioner::Partitioner;
pub use sqlite::{SqlRows, SqlValue, DEFAULT_BUSY_TIMEOUT_MS, MAX_CONNECTIONS, MAX_QUERY_ROWS};
pub use state::{StateGrant, StateStore};
pub use transform::{BatchContext, Header, Output, OutputBatch, OutputRecord, Record, Transform};
// For `crate::fuzzing` only: the "weir batch v1" codec.
pub(crate) use transform::{
    decode_output as transform_decode_output, encode_input as transform_encode_input,
};

/// How often the engine's epoch advances, in milliseconds: the granularity of call
/// deadlines.
pub const EPOCH_TICK_MS: u64 = 5;

/// Limits applied to every plugin instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginLimits {
    /// Most linear memory (all memories of an instance together), in bytes. Default
    /// 64 MiB. A guest growing past it fails its call with [`PluginError::MemoryLimit`].
    pub memory_bytes: usize,
    /// Wall-clock deadline of one call (and of instantiation + `open`), in milliseconds.
    /// Default 1,000. Enforced to within [`EPOCH_TICK_MS`]; a call past it fails with
    /// [`PluginError::Timeout`].
    pub call_timeout_ms: u64,
}

impl Default for PluginLimits {
    fn default() -> Self {
        PluginLimits {
            memory_bytes: 64 << 20,
            call_timeout_ms: 1_000,
        }
    }
}

/// Configuration of a [`PluginHost`].
#[derive(Debug, Clone, Default)]
pub struct PluginHostConfig {
    /// Directory for compiled components (`<sha256>.cwasm`); created if missing. `None`
    /// caches in memory only. Only weir should write there: a compiled component is
    /// trusted native code.
    pub cache_dir: Option<PathBuf>,
    /// Limits for every plugin this host loads.
    pub limits: PluginLimits,
    /// Where call durations and failures are counted
    /// (`weir_plugin_call_duration_seconds`, `weir_plugin_call_failures_total`, per
    /// plugin and call); `None` counts nothing.
    pub metrics: Option<crate::metrics::Metrics>,
}

/// Why a plugin could not be loaded or a call failed. Every variant names the plugin (its
/// file name) so a log line stands on its own.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The plugin file could not be read.
    #[error("plugin {path}: cannot read: {source}")]
    Read {
        /// File given.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file does not start with the WebAssembly magic bytes.
    #[error("plugin {plugin}: not a WebAssembly file (no \\0asm header)")]
    NotWasm {
        /// Plugin name.
        plugin: String,
    },
    /// The file is a core WebAssembly module, not a component.
    #[error(
        "plugin {plugin}: a core WebAssembly module, not a component \
         (build it with `cargo build --target wasm32-wasip2`)"
    )]
    NotComponent {
        /// Plugin name.
        plugin: String,
    },
    /// wasmtime refused to compile the component.
    #[error("plugin {plugin}: does not compile: {message}")]
    Compile {
        /// Plugin name.
        plugin: String,
        /// wasmtime's reason.
        message: String,
    },
    /// The component does not implement the expected world: it imports something weir
    /// does not provide ("imports `weir:host/secrets@0.1.0`, which weir does not provide
    /// ..."), was built for another version of weir's package ("built for weir:plugin
    /// 1.0.0; this weir provides weir:plugin 0.1.0 ..."), or lacks the world's export.
    #[error("plugin {plugin}: not a weir `{world}` component: {message}")]
    WrongWorld {
        /// Plugin name.
        plugin: String,
        /// Expected world (`partitioner` or `transform`).
        world: &'static str,
        /// What is wrong, naming the import, export or version.
        message: String,
    },
    /// The plugin's `open` returned an error for its config.
    #[error("plugin {plugin}: refused its config: {message}")]
    Open {
        /// Plugin name.
        plugin: String,
        /// The plugin's message.
        message: String,
    },
    /// A call ran past [`PluginLimits::call_timeout_ms`].
    #[error("plugin {plugin}: call exceeded its deadline of {timeout_ms} ms")]
    Timeout {
        /// Plugin name.
        plugin: String,
        /// The deadline.
        timeout_ms: u64,
    },
    /// The guest tried to grow its memory past [`PluginLimits::memory_bytes`].
    #[error(
        "plugin {plugin}: exceeded its memory limit of {limit_bytes} bytes \
         (asked for {requested_bytes})"
    )]
    MemoryLimit {
        /// Plugin name.
        plugin: String,
        /// The limit.
        limit_bytes: usize,
        /// Memory size the guest asked to grow to.
        requested_bytes: usize,
    },
    /// The guest trapped (a panic, `unreachable`, an out-of-bounds access...).
    #[error("plugin {plugin}: trapped: {message}")]
    Trap {
        /// Plugin name.
        plugin: String,
        /// The trap, and the guest's last stderr line (a panic message) when there is one.
        message: String,
    },
    /// The plugin reported an error for a batch (the WIT `plugin-error`).
    #[error("plugin {plugin}: failed{}: {message}", on_record(.record_index))]
    Failed {
        /// Plugin name.
        plugin: String,
        /// The plugin's message.
        message: String,
        /// Index of the offending record in the batch, when the plugin named one.
        record_index: Option<u32>,
    },
    /// The plugin returned something its world forbids (a partition out of range, a
    /// malformed output batch).
    #[error("plugin {plugin}: returned an invalid result: {message}")]
    BadOutput {
        /// Plugin name.
        plugin: String,
        /// What was wrong.
        message: String,
    },
    /// The caller passed something the world forbids (e.g. zero partitions).
    #[error("plugin {plugin}: invalid call: {message}")]
    InvalidCall {
        /// Plugin name.
        plugin: String,
        /// What was wrong.
        message: String,
    },
    /// The host itself failed (engine set-up, cache directory, instantiation).
    #[error("plugin host: {message}")]
    Host {
        /// What failed.
        message: String,
    },
}

/// " on record N" when a record is named.
fn on_record(index: &Option<u32>) -> String {
    index.map(|i| format!(" on record {i}")).unwrap_or_default()
}

/// Stops the epoch ticker when the last engine user is gone.
struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            // It may be parked with no call ahead.
            t.thread().unpark();
            // The thread only sleeps and increments; it cannot fail.
            let _ = t.join();
        }
    }
}

/// What every plugin of a host shares: the engine, the ticker, the limits.
pub(crate) struct Shared {
    pub(crate) engine: wasmtime::Engine,
    pub(crate) limits: PluginLimits,
    metrics: Option<crate::metrics::Metrics>,
    _ticker: Ticker,
}

impl Shared {
    /// The metric handles of calls named `call` into plugin `name` (no-ops when the host
    /// has no metrics). Taken once per loaded plugin.
    pub(crate) fn calls(&self, name: &str, call: &'static str) -> crate::metrics::PluginCalls {
        match &self.metrics {
            Some(m) => m.plugin_calls(name, call),
            None => crate::metrics::PluginCalls::noop(),
        }
    }
}

/// Loads plugins: one wasmtime engine, one compiled-component cache, shared limits.
///
/// Cheap to share by reference; loaded plugins keep what they need alive, so they may
/// outlive the host.
pub struct PluginHost {
    shared: Arc<Shared>,
    cache: cache::ComponentCache,
}

impl std::fmt::Debug for PluginHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginHost")
            .field("limits", &self.shared.limits)
            .finish_non_exhaustive()
    }
}

impl PluginHost {
    /// A host with its engine and epoch ticker thread.
    ///
    /// Errors: [`PluginError::Host`] when the engine cannot be configured, the cache
    /// directory cannot be created, or the ticker thread cannot be spawned.
    pub fn new(config: PluginHostConfig) -> Result<Self, PluginError> {
        let mut wasm = wasmtime::Config::new();
        wasm.wasm_component_model(true);
        wasm.epoch_interruption(true);
        let engine = wasmtime::Engine::new(&wasm).map_err(|e| PluginError::Host {
            message: format!("wasmtime engine: {e:#}"),
        })?;
        let cache = cache::ComponentCache::new(config.cache_dir)?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let engine = engine.clone();
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("weir-plugin-epoch".into())
                .spawn(move || {
                    sandbox::run_ticker(&engine, &stop, Duration::from_millis(EPOCH_TICK_MS))
                })
                .map_err(|e| PluginError::Host {
                    message: format!("spawning the epoch ticker: {e}"),
                })?
        };
        Ok(PluginHost {
            shared: Arc::new(Shared {
                engine,
                limits: config.limits,
                metrics: config.metrics,
                _ticker: Ticker {
                    stop,
                    thread: Some(thread),
                },
            }),
            cache,
        })
    }

    /// Loads a partitioner component (world `partitioner`) from `path` and opens it with
    /// no config.
    ///
    /// Errors: [`PluginError::Read`], [`PluginError::NotWasm`],
    /// [`PluginError::NotComponent`], [`PluginError::Compile`],
    /// [`PluginError::WrongWorld`], [`PluginError::Open`], or a limit hit while opening.
    pub async fn load_partitioner(&self, path: &Path) -> Result<Partitioner, PluginError> {
        self.load_partitioner_with(path, &[]).await
    }

    /// As [`PluginHost::load_partitioner`], passing `config` (key/value pairs) to `open`.
    pub async fn load_partitioner_with(
        &self,
        path: &Path,
        config: &[(String, String)],
    ) -> Result<Partitioner, PluginError> {
        let (name, component) = self.component(path)?;
        Instance::load(&self.shared, name, &component, config)
            .await
            .map(Partitioner::new)
    }

    /// Loads a transform component (world `transform`) from `path` and opens it with
    /// `config` (key/value pairs).
    ///
    /// Errors: as [`PluginHost::load_partitioner`].
    pub async fn load_transform(
        &self,
        path: &Path,
        config: &[(String, String)],
    ) -> Result<Transform, PluginError> {
        let (name, component) = self.component(path)?;
        Instance::load(&self.shared, name, &component, config)
            .await
            .map(Transform::new)
    }

    /// As [`PluginHost::load_transform`], from the component's bytes already read (the
    /// transform runtime hashes the same bytes it loads, so a file rewritten between a
    /// read and a load cannot give a version that is not the one running). `name` names
    /// the plugin in errors and logs (the file name).
    ///
    /// Errors: as [`PluginHost::load_transform`], except [`PluginError::Read`].
    pub async fn load_transform_bytes(
        &self,
        name: &str,
        bytes: &[u8],
        config: &[(String, String)],
    ) -> Result<Transform, PluginError> {
        let name: Arc<str> = name.into();
        let component = self.cache.get(&self.shared.engine, &name, bytes)?;
        Instance::load(&self.shared, name, &component, config)
            .await
            .map(Transform::new)
    }

    /// Reads and compiles (or finds in the cache) the component at `path`; its name is
    /// the file name.
    fn component(
        &self,
        path: &Path,
    ) -> Result<(Arc<str>, wasmtime::component::Component), PluginError> {
        let name: Arc<str> = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string())
            .into();
        let bytes = std::fs::read(path).map_err(|source| PluginError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let component = self.cache.get(&self.shared.engine, &name, &bytes)?;
        Ok((name, component))
    }
}

/// Maps a failed wasmtime call to the plugin error it means, looking at what the store
/// recorded (memory denied) and the trap code. A call stopped by a sandbox limit (its
/// deadline, its memory cap) is logged as a warning here, at most one line per plugin
/// per 10 s (with the count of lines left out since): whichever caller gets the error
/// (a produce refused, a record sent to a dead-letter topic, a connector task failing),
/// the operator sees in the broker's log which plugin hit which limit.
pub(crate) fn call_error(
    plugin: &str,
    limits: &PluginLimits,
    state: &sandbox::StoreState,
    err: &wasmtime::Error,
) -> PluginError {
    if let Some(requested_bytes) = state.memory_denied() {
        let error = PluginError::MemoryLimit {
            plugin: plugin.to_string(),
            limit_bytes: limits.memory_bytes,
            requested_bytes,
        };
        warn_limit_hit(plugin, &error);
        return error;
    }
    if let Some(wasmtime::Trap::Interrupt) = err.downcast_ref::<wasmtime::Trap>() {
        let error = PluginError::Timeout {
            plugin: plugin.to_string(),
            timeout_ms: limits.call_timeout_ms,
        };
        warn_limit_hit(plugin, &error);
        return error;
    }
    let mut message = match err.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => trap.to_string(),
        None => format!("{err:#}"),
    };
    if let Some(line) = state.stderr_tail() {
        message.push_str(&format!(" (guest stderr: {line})"));
    }
    PluginError::Trap {
        plugin: plugin.to_string(),
        message,
    }
}

/// Logs that `plugin`'s call was stopped by a sandbox limit (`error`), rate-limited per
/// plugin name as peers' bad input is (`server::warn_limit`).
fn warn_limit_hit(plugin: &str, error: &PluginError) {
    static WARNINGS: std::sync::OnceLock<crate::server::warn_limit::PeerWarnings<String>> =
        std::sync::OnceLock::new();
    let warnings = WARNINGS.get_or_init(crate::server::warn_limit::PeerWarnings::new);
    if let Some(suppressed) = warnings.admit(plugin.to_string(), std::time::Instant::now()) {
        tracing::warn!(plugin, suppressed, "plugin call stopped: {error}");
    }
}
