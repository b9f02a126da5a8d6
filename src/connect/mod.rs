//! Kafka Connect-style connectors run inside the broker as sandboxed components.
//!
//! Owns: connector configs (TOML files in `connect.config.dir`, [`config`]), the task of
//! each connector (one per connector: `tasks.max` above 1 is accepted and runs one),
//! the source task loop ([`source`]: poll → append through [`Ingest`] → store offsets
//! in `__connect_offsets` → `commit`), the sink task loop ([`sink`]: read from the
//! committed offsets of group `connect-<name>` → `put` → `flush` → commit through the
//! group coordinator), restarts with backoff and the FAILED state, and the status of
//! every connector (in memory, [`ConnectRuntime::statuses`], and in `__connect_status`).
//!
//! Never does: import wasmtime (components are loaded and called through
//! [`crate::plugin`]); give a connector more than its config grants (the directory of
//! its `file`, HTTP to its `http.allowed.hosts`, and the `log` interface).
//!
//! Failure: every failure of a task — a trap, a timeout, a connector error, an append or
//! commit that fails — ends that attempt; the instance is dropped and a new one is
//! loaded and opened from the stored offsets after a backoff (100 ms doubling up to
//! `errors.retry.delay.max.ms`). A task failing without progress for
//! `errors.retry.timeout` ms is FAILED with its error (logged and in `__connect_status`)
//! and stays so until the broker restarts. Each connector is its own Tokio task: one
//! failing never touches another or the broker.
//!
//! Not yet: the REST API, pause/resume/restart, watching the directory, `transforms`,
//! converters, a DLQ for sources (sinks have one: [`sink`]), more than one task per
//! connector.

pub mod config;
mod sink;
mod source;
pub mod store;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::watch;

use crate::ingest::Ingest;
use crate::plugin::{PluginError, PluginHost};
use crate::protocol::Context;
use config::{ConnectorConfig, ConnectorKind};
use store::{InternalTopic, SourceOffsets, OFFSETS_TOPIC, STATUS_TOPIC};

pub use sink::group_id;

/// First wait before restarting a failed task.
const FIRST_BACKOFF_MS: u64 = 100;

/// The state of a connector's task, Kafka Connect's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    /// Configured, not started yet (or waiting to be restarted after a failure).
    Unassigned,
    /// Running.
    Running,
    /// Stopped for good after failures (`trace` says why).
    Failed,
}

impl TaskState {
    /// Kafka Connect's spelling (`RUNNING`, ...).
    pub fn name(self) -> &'static str {
        match self {
            TaskState::Unassigned => "UNASSIGNED",
            TaskState::Running => "RUNNING",
            TaskState::Failed => "FAILED",
        }
    }
}

/// What the runtime knows about one connector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectorStatus {
    /// State of its (one) task.
    pub state: TaskState,
    /// The last error, if any.
    pub trace: Option<String>,
    /// The config file it came from.
    pub file: PathBuf,
}

/// Where the runtime finds its connectors.
#[derive(Debug, Clone)]
pub struct ConnectSettings {
    /// `connect.config.dir`.
    pub config_dir: PathBuf,
    /// `connect.plugin.path`.
    pub plugin_path: PathBuf,
}

/// Why one attempt of a task ended.
#[derive(Debug, thiserror::Error)]
enum TaskError {
    /// The component failed (load, trap, limit, its own error).
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The runtime failed around it (append, offsets, commit).
    #[error("{0}")]
    Runtime(String),
}

/// Set by a task attempt once it moved records, so a later failure starts a fresh retry
/// window.
#[derive(Debug, Default)]
struct Progress {
    made: bool,
}

impl Progress {
    fn made(&mut self) {
        self.made = true;
    }
}

/// What tasks use: the broker's owners, the plugin host, offsets and status.
struct Deps {
    ctx: Context,
    ingest: Arc<Ingest>,
    plugins: Arc<PluginHost>,
    plugin_path: PathBuf,
    offsets: SourceOffsets,
    status_topic: InternalTopic,
    statuses: Arc<Mutex<BTreeMap<String, ConnectorStatus>>>,
    worker_id: String,
}

impl Deps {
    fn set_running(&self, c: &ConnectorConfig) {
        self.set_status(&c.name, TaskState::Running, None);
    }

    /// Records `state` in memory and in `__connect_status` (a write failure is logged:
    /// status is informational).
    fn set_status(&self, name: &str, state: TaskState, trace: Option<String>) {
        {
            let mut s = self.statuses.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(st) = s.get_mut(name) {
                st.state = state;
                st.trace = trace.clone();
            }
        }
        let value = serde_json::json!({
            "state": state.name(),
            "trace": trace,
            "worker_id": self.worker_id,
            "generation": 0,
        })
        .to_string();
        let records = [
            (
                Bytes::from(format!("status-connector-{name}")),
                Some(Bytes::from(value.clone())),
            ),
            (
                Bytes::from(format!("status-task-{name}-0")),
                Some(Bytes::from(value)),
            ),
        ];
        if let Err(e) = self.status_topic.append(&records) {
            tracing::warn!(connector = name, error = %e, "cannot write {STATUS_TOPIC}");
        }
    }
}

/// The connectors of this broker and their status.
#[derive(Debug, Clone, Default)]
pub struct ConnectRuntime {
    statuses: Arc<Mutex<BTreeMap<String, ConnectorStatus>>>,
}

impl ConnectRuntime {
    /// Every connector by name, with its state.
    pub fn statuses(&self) -> BTreeMap<String, ConnectorStatus> {
        self.statuses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Loads every `*.toml` of `settings.config_dir` (sorted by file name), replays
    /// `__connect_offsets`, and returns the runtime and the future that runs every
    /// connector until `shutdown` (spawn it; it ends when every task has stopped).
    ///
    /// A config file that is refused (bad TOML, missing key, a name used twice) is
    /// logged and shown as FAILED under its file name; it never stops the broker.
    ///
    /// Errors: the directory cannot be listed, or `__connect_offsets` cannot be read.
    pub fn start(
        settings: ConnectSettings,
        ctx: Context,
        ingest: Arc<Ingest>,
        plugins: Arc<PluginHost>,
        shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<(
        ConnectRuntime,
        impl std::future::Future<Output = ()> + Send + 'static,
    )> {
        use anyhow::Context as _;
        let mut files: Vec<PathBuf> = std::fs::read_dir(&settings.config_dir)
            .with_context(|| {
                format!(
                    "cannot list connect.config.dir {}",
                    settings.config_dir.display()
                )
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        files.sort();
        let offsets_topic =
            InternalTopic::new(OFFSETS_TOPIC, ctx.metadata.clone(), ctx.replicas.clone());
        let offsets = SourceOffsets::load(offsets_topic)
            .map_err(|e| anyhow::anyhow!(e))
            .context("cannot replay __connect_offsets")?;
        let runtime = ConnectRuntime::default();
        let deps = Arc::new(Deps {
            worker_id: format!("{}:{}", ctx.advertised.host, ctx.advertised.port),
            status_topic: InternalTopic::new(
                STATUS_TOPIC,
                ctx.metadata.clone(),
                ctx.replicas.clone(),
            ),
            ctx,
            ingest,
            plugins,
            plugin_path: settings.plugin_path,
            offsets,
            statuses: runtime.statuses.clone(),
        });
        let mut configs = Vec::new();
        for file in files {
            let parsed = ConnectorConfig::from_file(&file);
            let taken = |name: &str| {
                deps.statuses
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains_key(name)
            };
            let (name, result) = match parsed {
                Ok(c) if taken(&c.name) => {
                    let name = c.name.clone();
                    (
                        name.clone(),
                        Err(format!(
                            "connector {name} in {}: the name is already used by another file",
                            file.display()
                        )),
                    )
                }
                Ok(c) => (c.name.clone(), Ok(c)),
                Err(e) => (
                    file.file_stem()
                        .map(|s| s.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    Err(e.to_string()),
                ),
            };
            let state = if result.is_ok() {
                TaskState::Unassigned
            } else {
                TaskState::Failed
            };
            deps.statuses
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(
                    name.clone(),
                    ConnectorStatus {
                        state,
                        trace: result.as_ref().err().cloned(),
                        file: file.clone(),
                    },
                );
            match result {
                Ok(c) => {
                    if c.tasks_max > 1 {
                        tracing::info!(connector = %c.name, tasks_max = c.tasks_max, "running 1 task (more than one task per connector is not supported yet)");
                    }
                    configs.push(c);
                }
                Err(e) => {
                    tracing::error!(connector = %name, "{e}");
                    deps.set_status(&name, TaskState::Failed, Some(e));
                }
            }
        }
        let run = async move {
            let mut tasks = tokio::task::JoinSet::new();
            for c in configs {
                tracing::info!(connector = %c.name, kind = ?c.kind, "starting connector");
                tasks.spawn(supervise(c, deps.clone(), shutdown.clone()));
            }
            while let Some(r) = tasks.join_next().await {
                if let Err(e) = r {
                    tracing::error!(error = %e, "a connector task panicked");
                }
            }
        };
        Ok((runtime, run))
    }
}

/// Runs a connector's task, restarting it with backoff, until shutdown or FAILED.
async fn supervise(c: ConnectorConfig, deps: Arc<Deps>, mut shutdown: watch::Receiver<bool>) {
    let mut backoff_ms = FIRST_BACKOFF_MS;
    let mut failing_since: Option<Instant> = None;
    loop {
        let mut progress = Progress::default();
        let result = match c.kind {
            ConnectorKind::Source => source::run(&c, &deps, &mut progress, &mut shutdown).await,
            ConnectorKind::Sink => sink::run(&c, &deps, &mut progress, &mut shutdown).await,
        };
        let error = match result {
            Ok(()) => {
                tracing::info!(connector = %c.name, "connector stopped");
                return;
            }
            Err(e) => e.to_string(),
        };
        if *shutdown.borrow() {
            tracing::warn!(connector = %c.name, error = %error, "connector failed while stopping");
            return;
        }
        if progress.made {
            failing_since = None;
            backoff_ms = FIRST_BACKOFF_MS;
        }
        let since = *failing_since.get_or_insert_with(Instant::now);
        let out_of_time = c
            .retry_timeout_ms
            .is_some_and(|t| since.elapsed() >= Duration::from_millis(t));
        if out_of_time {
            tracing::error!(connector = %c.name, error = %error, "connector FAILED (errors.retry.timeout reached)");
            deps.set_status(&c.name, TaskState::Failed, Some(error));
            return;
        }
        tracing::warn!(connector = %c.name, error = %error, retry_in_ms = backoff_ms, "connector task failed; restarting");
        deps.set_status(&c.name, TaskState::Unassigned, Some(error));
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(backoff_ms)) => {}
            _ = shutdown.changed() => return,
        }
        backoff_ms = (backoff_ms * 2).min(c.retry_delay_max_ms.max(FIRST_BACKOFF_MS));
    }
}
