//! Kafka Connect-style connectors run inside the broker as sandboxed components.
//!
//! Owns: connector configs (TOML files in `connect.config.dir`, watched with notify,
//! [`config`], [`watch`]; and REST-created ones, stored in `__connect_configs`,
//! [`configs`]), the task of each connector (one per connector: `tasks.max` above 1 is
//! accepted and runs one), the source task loop ([`source`]: poll → append through
//! [`Ingest`] → store offsets in `__connect_offsets` → `commit`; with
//! `connect.exactly.once.source.support=enabled`, records and offsets in one transaction,
//! KIP-618), the sink task loop
//! ([`sink`]: read from the committed offsets of group `connect-<name>` → `put` → `flush`
//! → commit through the group coordinator), the control plane ([`ConnectRuntime`]:
//! create, update, delete, pause, resume, stop, restart, offsets — what the REST API in
//! `admin::connect` calls), restarts with backoff and the FAILED state, and the status of
//! every connector (in memory and in `__connect_status`).
//!
//! Never does: import wasmtime (components are loaded and called through
//! [`crate::plugin`]) or the protocol layer (what it calls comes in [`Owners`] and
//! [`Ingest`]); give a connector more than its config grants (the directory of
//! its `file`, HTTP to its `http.allowed.hosts`, and the `log` interface) plus its own
//! stored state (`__connect_state`, [`store::ConnectorStates`]); accept a config whose
//! grants exceed the broker's ceiling ([`config::Ceiling`]: `connect.allowed.paths`,
//! `connect.http.allowed.hosts`, never `log.dirs` or `plugin.cache.dir`), from REST, a
//! file or the store.
//!
//! Validation: a REST create or update runs every check `config/validate` reports
//! (keys, ceiling, the component and its transforms; [`ConnectRuntime::errors`]) and is
//! refused with Kafka Connect's 400 when any fails, so a config that cannot run is never
//! accepted to retry for ever. Status never says RUNNING for a task that is not: a task
//! waiting to be restarted is UNASSIGNED, and so is its connector.
//!
//! Lifecycle: each connector has one supervisor task following a `watch` of its
//! [`Control`] (config, target state, restart count). Any change ends the running attempt
//! gracefully (a source finishes the poll in hand and stores its offsets; a sink flushes
//! and commits), then the supervisor acts on the new control: run again (new config,
//! restart), or stay PAUSED / STOPPED without an instance. Pause therefore closes the
//! instance where Kafka Connect keeps it open and idle; the visible behaviour (no polls,
//! no puts, state PAUSED, resume continues from the stored offsets) is the same. Deleting
//! a connector drops its control, which ends the supervisor; its offsets are kept, as
//! Kafka Connect keeps them.
//!
//! Failure: every failure of a task — a trap, a timeout, a connector error, an append or
//! commit that fails — ends that attempt; the instance is dropped and a new one is
//! loaded and opened from the stored offsets after a backoff (100 ms doubling up to
//! `errors.retry.delay.max.ms`). A task failing without progress for
//! `errors.retry.timeout` ms is FAILED with its error (logged and in `__connect_status`)
//! until a restart (REST `POST /connectors/{name}/restart`), a config change, or a broker
//! restart. Each connector is its own Tokio task: one failing never touches another or
//! the broker.
//!
//! The exception, under `errors.tolerance=none`: a source record its topic refuses
//! whatever is retried, or a sink batch still not delivered when `errors.retry.timeout`
//! is spent, makes the task FAILED at once ([`TaskError::Refused`]) instead of restarted,
//! since a restart would append or put the same records again and fail the same way.
//!
//! Not yet: more than one task per connector.

pub(crate) mod catalog;
pub(crate) mod config;
pub(crate) mod configs;
pub(crate) mod convert;
pub(crate) mod leader;
mod sink;
pub(crate) mod smt;
mod source;
pub(crate) mod store;
mod watch;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::watch as tokio_watch;
use tokio::task::JoinHandle;

use crate::cluster::Metadata;
use crate::group::GroupCoordinator;
use crate::ingest::Ingest;
use crate::plugin::{PluginError, PluginHost};
use crate::replica::ReplicaManager;
use config::{ConnectorConfig, ConnectorKind};
use store::{
    ConnectorStates, InternalTopic, SourceOffsets, OFFSETS_TOPIC, STATE_TOPIC, STATUS_TOPIC,
};

pub(crate) use leader::{ConnectHandle, Placement};
pub(crate) use sink::group_id;

/// First wait before restarting a failed task.
const FIRST_BACKOFF_MS: u64 = 100;

/// Most connectors created through REST on one broker (each is a task and an instance).
const MAX_CONNECTORS: usize = 1_000;

/// How long an offsets request waits for a connector told to stop to finish stopping,
/// and a control request for the change to be in effect.
const STOPPING_WAIT_MS: u64 = 30_000;

/// The state of a connector's task, Kafka Connect's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskState {
    /// Configured, not started yet (or waiting to be restarted after a failure).
    Unassigned,
    /// Running.
    Running,
    /// Paused: no instance, no polls or puts (`PUT /connectors/{name}/pause`).
    Paused,
    /// Stopped: no instance (KIP-875 `PUT /connectors/{name}/stop`); offsets may be
    /// changed.
    Stopped,
    /// A restart was asked and has not taken effect yet.
    Restarting,
    /// Stopped for good after failures (`trace` says why), until restarted.
    Failed,
}

impl TaskState {
    /// Every state, in declaration order (`/metrics` lists each for every connector).
    pub(crate) const ALL: [TaskState; 6] = [
        TaskState::Unassigned,
        TaskState::Running,
        TaskState::Paused,
        TaskState::Stopped,
        TaskState::Restarting,
        TaskState::Failed,
    ];

    /// Kafka Connect's spelling (`RUNNING`, ...).
    pub(crate) fn name(self) -> &'static str {
        match self {
            TaskState::Unassigned => "UNASSIGNED",
            TaskState::Running => "RUNNING",
            TaskState::Paused => "PAUSED",
            TaskState::Stopped => "STOPPED",
            TaskState::Restarting => "RESTARTING",
            TaskState::Failed => "FAILED",
        }
    }

    /// The connector's state given its one task's: weir's connector is its task (there
    /// is no separate `Connector` instance), so the connector is in its task's state — a
    /// task waiting to be (re)started after a failure is UNASSIGNED and so is its
    /// connector, never RUNNING while nothing runs.
    pub(crate) fn connector_state(self) -> TaskState {
        self
    }
}

/// What the user asked a connector to be (Kafka Connect's `TargetState`, KIP-875).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TargetState {
    /// Running (the default).
    Started,
    /// Paused.
    Paused,
    /// Stopped (KIP-875).
    Stopped,
}

impl TargetState {
    /// Kafka Connect's spelling in `__connect_configs`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            TargetState::Started => "STARTED",
            TargetState::Paused => "PAUSED",
            TargetState::Stopped => "STOPPED",
        }
    }

    /// The state named `s`, if any.
    pub(crate) fn parse(s: &str) -> Option<TargetState> {
        match s {
            "STARTED" => Some(TargetState::Started),
            "PAUSED" => Some(TargetState::Paused),
            "STOPPED" => Some(TargetState::Stopped),
            _ => None,
        }
    }
}

/// Where a connector's config comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A TOML file in `connect.config.dir` (the file is its store; REST may not change
    /// or delete it).
    File(PathBuf),
    /// The REST API (stored in `__connect_configs`).
    Rest,
}

impl Origin {
    /// The path used in config errors: the file, or `REST`.
    pub(crate) fn path(&self) -> &Path {
        match self {
            Origin::File(p) => p,
            Origin::Rest => Path::new("REST"),
        }
    }
}

/// What the runtime knows about one connector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConnectorStatus {
    /// State of its (one) task.
    pub state: TaskState,
    /// The last error, if any.
    pub trace: Option<String>,
    /// Where its config comes from.
    pub origin: Origin,
}

/// Where the runtime finds its connectors, and the name it writes its status under.
#[derive(Debug, Clone)]
pub(crate) struct ConnectSettings {
    /// `connect.config.dir` (`None`: REST-created connectors only).
    pub config_dir: Option<PathBuf>,
    /// `connect.plugin.path`.
    pub plugin_path: PathBuf,
    /// This broker's advertised `host:port`: the `worker_id` of `__connect_status`
    /// records (Kafka Connect's worker id is the worker's REST `host:port`).
    pub worker_id: String,
    /// The broker's ceiling on connectors' grants (`connect.allowed.paths`,
    /// `connect.http.allowed.hosts`, never `log.dirs` or `plugin.cache.dir`).
    pub ceiling: config::Ceiling,
    /// `connect.exactly.once.source.support` (Kafka Connect's
    /// `exactly.once.source.support`, KIP-618).
    pub exactly_once_source: crate::config::ExactlyOnceSourceSupport,
    /// `transaction.max.timeout.ms`: caps an exactly-once source task's transaction
    /// timeout.
    pub transaction_max_timeout_ms: i32,
}

/// The broker's owners connectors call, handed over by the composition root (`broker`):
/// the internal topics (`__connect_*`) and sink input are read from the replica manager,
/// sink progress is a consumer group's committed offsets. Source records go through
/// `ingest`, given separately. Cheap to clone (three `Arc`s).
#[derive(Debug, Clone)]
pub(crate) struct Owners {
    /// Cluster metadata: internal topics and sink input topics.
    pub metadata: Arc<Metadata>,
    /// Hosted partitions: internal topics' logs and sink input.
    pub replicas: Arc<ReplicaManager>,
    /// Consumer groups: sink progress as `connect-<name>`'s committed offsets.
    pub groups: Arc<GroupCoordinator>,
    /// Transactions: an exactly-once source task's (KIP-618).
    pub txn: Arc<crate::txn::TransactionCoordinator>,
}

/// A control-plane request refused, with Kafka Connect's HTTP status.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ConnectError {
    /// 400: a bad config or request.
    #[error("{0}")]
    Invalid(String),
    /// 404: no such connector (or task).
    #[error("{0}")]
    NotFound(String),
    /// 409: the name exists, the connector is file-defined, or it is still stopping.
    #[error("{0}")]
    Conflict(String),
    /// 500: the config store or offsets store cannot be written.
    #[error("{0}")]
    Store(String),
}

fn not_found(name: &str) -> ConnectError {
    ConnectError::NotFound(format!("Connector {name} not found"))
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
    /// A record cannot be handled and retrying cannot help, under
    /// `errors.tolerance=none`: a source record its topic refuses whatever is retried
    /// (too large for `max.message.bytes`, keyless on a compacted topic; the offsets of
    /// what was written before it are stored first), or a sink's records still not
    /// delivered when `errors.retry.timeout` is spent. The task is FAILED at once, with
    /// this reason: a restart would only append or put the same records again and fail
    /// the same way. The user changes the topic, the endpoint or the config, then
    /// restarts (Kafka Connect fails a task on a producer error the same way).
    #[error("{0}")]
    Refused(String),
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
    ctx: Owners,
    ingest: Arc<Ingest>,
    plugins: Arc<PluginHost>,
    plugin_path: PathBuf,
    offsets: SourceOffsets,
    /// Connectors' stored state (`__connect_state`), granted to each as its own.
    state: Arc<ConnectorStates>,
    status_topic: InternalTopic,
    statuses: Arc<Mutex<BTreeMap<String, ConnectorStatus>>>,
    worker_id: String,
    /// Whether source tasks run exactly once (`connect.exactly.once.source.support=enabled`).
    exactly_once_source: bool,
    /// `transaction.max.timeout.ms`.
    transaction_max_timeout_ms: i32,
}

impl Deps {
    /// Reads and offsets for sink tasks, wherever partitions and coordinators are.
    fn io(&self) -> crate::worker_io::WorkerIo<'_> {
        crate::worker_io::WorkerIo {
            metadata: &self.ctx.metadata,
            replicas: &self.ctx.replicas,
            groups: &self.ctx.groups,
            peers: self.ingest.peers_ref(),
        }
    }

    /// What `c` may use: its config's grants ([`ConnectorConfig::file_grants`]) and its
    /// own stored state.
    fn grants(&self, c: &ConnectorConfig, writable: bool) -> crate::plugin::ConnectorGrants {
        let mut grants = c.file_grants(writable);
        let store: Arc<dyn crate::plugin::StateStore> = self.state.clone();
        grants.state = Some(crate::plugin::StateGrant::new(&c.name, store));
        grants
    }

    fn set_running(&self, c: &ConnectorConfig) {
        self.set_status(&c.name, TaskState::Running, None);
    }

    /// Records `state` in memory and in `__connect_status` (a write failure is logged:
    /// status is informational). A STOPPED connector has no task: its task key gets a
    /// tombstone.
    fn set_status(&self, name: &str, state: TaskState, trace: Option<String>) {
        {
            let mut s = self.statuses.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(st) = s.get_mut(name) {
                st.state = state;
                st.trace = trace.clone();
            }
        }
        let value = |state: TaskState| {
            json!({
                "state": state.name(),
                "trace": trace,
                "worker_id": self.worker_id,
                "generation": 0,
            })
            .to_string()
        };
        let task = match state {
            TaskState::Stopped => None,
            other => Some(Bytes::from(value(other))),
        };
        let records = [
            (
                Bytes::from(format!("status-connector-{name}")),
                Some(Bytes::from(value(state.connector_state()))),
            ),
            (Bytes::from(format!("status-task-{name}-0")), task),
        ];
        if let Err(e) = self.status_topic.append(0, &records) {
            tracing::warn!(connector = name, error = %e, "cannot write {STATUS_TOPIC}");
        }
    }

    fn status(&self, name: &str) -> Option<ConnectorStatus> {
        self.statuses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }
}

/// What a connector's supervisor follows; every change ends the running attempt.
#[derive(Debug, Clone)]
struct Control {
    config: Arc<ConnectorConfig>,
    target: TargetState,
    /// Bumped by each restart request.
    restarts: u64,
    /// Bumped by every change; the supervisor acknowledges it once the previous attempt
    /// has ended (see [`Entry::applied`]).
    generation: u64,
}

/// One connector known to the runtime.
struct Entry {
    origin: Origin,
    /// The properties as given (REST `config`, the file's keys).
    properties: BTreeMap<String, String>,
    /// `None` for a file whose config is refused (shown FAILED, nothing runs).
    kind: Option<ConnectorKind>,
    target: TargetState,
    control: Option<tokio_watch::Sender<Control>>,
    /// The last [`Control::generation`] the supervisor acted on: a change is in effect
    /// (the old attempt has ended; no more polls or puts under the old control) once
    /// this reaches its generation.
    applied: Option<tokio_watch::Receiver<u64>>,
    task: Option<JoinHandle<()>>,
}

/// Shared state of the runtime.
struct Inner {
    deps: Arc<Deps>,
    configs_topic: InternalTopic,
    settings: ConnectSettings,
    /// By name. An async mutex: deleting a connector awaits its task while holding it,
    /// so two requests on one name cannot interleave.
    entries: tokio::sync::Mutex<BTreeMap<String, Entry>>,
    /// File → the connector name it defines (or its stem when refused).
    files: Mutex<BTreeMap<PathBuf, String>>,
    shutdown: tokio_watch::Receiver<bool>,
}

/// The connectors of this broker: their status and the control plane the REST API
/// drives. Cheap to clone.
#[derive(Clone)]
pub(crate) struct ConnectRuntime {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ConnectRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectRuntime")
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

/// What a restart request restarted (Kafka Connect's `RestartRequest` outcome).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Restarted {
    /// The connector was restarted.
    pub connector: bool,
    /// Its task was restarted.
    pub task: bool,
}

impl ConnectRuntime {
    /// Loads every `*.toml` of `settings.config_dir` (sorted by file name) and the
    /// REST-created connectors of `__connect_configs`, replays `__connect_offsets` and
    /// `__connect_state`, starts every connector in its stored target state, and returns
    /// the runtime and the future that watches the directory and, at `shutdown`, waits
    /// for every task to stop (spawn it).
    ///
    /// A config file that is refused (bad TOML, missing key, a name used twice) is
    /// logged and shown as FAILED under its file name; it never stops the broker.
    ///
    /// Errors: `__connect_offsets`, `__connect_state` or `__connect_configs` cannot be
    /// read.
    pub(crate) async fn start(
        settings: ConnectSettings,
        ctx: Owners,
        ingest: Arc<Ingest>,
        plugins: Arc<PluginHost>,
        shutdown: tokio_watch::Receiver<bool>,
    ) -> anyhow::Result<(
        ConnectRuntime,
        impl std::future::Future<Output = ()> + Send + 'static,
    )> {
        use anyhow::Context as _;
        let peers = ingest.peers();
        let offsets_topic = store::connect_topic(
            OFFSETS_TOPIC,
            ctx.metadata.clone(),
            ctx.replicas.clone(),
            peers.clone(),
        );
        let offsets = SourceOffsets::load(offsets_topic)
            .map_err(|e| anyhow::anyhow!(e))
            .context("cannot replay __connect_offsets")?;
        let state_topic = store::connect_topic(
            STATE_TOPIC,
            ctx.metadata.clone(),
            ctx.replicas.clone(),
            peers.clone(),
        );
        let state = ConnectorStates::load(state_topic)
            .map_err(|e| anyhow::anyhow!(e))
            .context("cannot replay __connect_state")?;
        let configs_topic = store::connect_topic(
            configs::CONFIGS_TOPIC,
            ctx.metadata.clone(),
            ctx.replicas.clone(),
            peers.clone(),
        );
        let replayed = configs::replay(&configs_topic)
            .map_err(|e| anyhow::anyhow!(e))
            .context("cannot replay __connect_configs")?;
        let deps = Arc::new(Deps {
            worker_id: settings.worker_id.clone(),
            exactly_once_source: settings.exactly_once_source
                == crate::config::ExactlyOnceSourceSupport::Enabled,
            transaction_max_timeout_ms: settings.transaction_max_timeout_ms,
            status_topic: store::connect_topic(
                STATUS_TOPIC,
                ctx.metadata.clone(),
                ctx.replicas.clone(),
                peers,
            ),
            ctx,
            ingest,
            plugins,
            plugin_path: settings.plugin_path.clone(),
            offsets,
            state: Arc::new(state),
            statuses: Arc::new(Mutex::new(BTreeMap::new())),
        });
        let runtime = ConnectRuntime {
            inner: Arc::new(Inner {
                deps,
                configs_topic,
                settings: settings.clone(),
                entries: tokio::sync::Mutex::new(BTreeMap::new()),
                files: Mutex::new(BTreeMap::new()),
                shutdown: shutdown.clone(),
            }),
        };
        let watcher = match &settings.config_dir {
            Some(dir) => {
                let w = watch::DirWatch::new(dir);
                runtime.rescan(&replayed.targets).await;
                Some(w)
            }
            None => None,
        };
        {
            let mut entries = runtime.inner.entries.lock().await;
            for (name, props) in replayed.connectors {
                if entries.contains_key(&name) {
                    tracing::error!(connector = %name, "a REST-created connector has the name of a file-defined one; the file wins (delete one of them)");
                    continue;
                }
                let target = replayed
                    .targets
                    .get(&name)
                    .copied()
                    .unwrap_or(TargetState::Started);
                match runtime.accept(Origin::Rest.path(), props.clone()) {
                    Ok(c) => {
                        runtime.spawn_entry(&mut entries, c, props, Origin::Rest, target);
                    }
                    Err(e) => {
                        tracing::error!(connector = %name, error = %e, "stored connector config refused");
                        runtime.failed_entry(
                            &mut entries,
                            &name,
                            props,
                            Origin::Rest,
                            e.to_string(),
                        );
                    }
                }
            }
        }
        let rt = runtime.clone();
        let mut shutdown = shutdown;
        let run = async move {
            if let Some(mut w) = watcher {
                loop {
                    tokio::select! {
                        changed = w.changed() => {
                            if !changed {
                                break;
                            }
                            rt.rescan(&BTreeMap::new()).await;
                        }
                        r = shutdown.changed() => {
                            if r.is_err() || *shutdown.borrow() {
                                break;
                            }
                        }
                    }
                }
            }
            while !*shutdown.borrow_and_update() {
                if shutdown.changed().await.is_err() {
                    break;
                }
            }
            let tasks: Vec<JoinHandle<()>> = {
                let mut entries = rt.inner.entries.lock().await;
                entries.values_mut().filter_map(|e| e.task.take()).collect()
            };
            for t in tasks {
                if let Err(e) = t.await {
                    tracing::error!(error = %e, "a connector task panicked");
                }
            }
        };
        Ok((runtime, run))
    }

    /// Every connector by name, with its state.
    pub(crate) fn statuses(&self) -> BTreeMap<String, ConnectorStatus> {
        self.inner
            .deps
            .statuses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Starts the supervisor of `c` and records it (replacing nothing: the caller checked
    /// the name is free).
    fn spawn_entry(
        &self,
        entries: &mut BTreeMap<String, Entry>,
        c: ConnectorConfig,
        properties: BTreeMap<String, String>,
        origin: Origin,
        target: TargetState,
    ) {
        let name = c.name.clone();
        if c.tasks_max > 1 {
            tracing::info!(connector = %name, tasks_max = c.tasks_max, "running 1 task (more than one task per connector is not supported yet)");
        }
        tracing::info!(connector = %name, kind = ?c.kind, ?origin, "starting connector");
        let kind = c.kind;
        self.inner
            .deps
            .statuses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                name.clone(),
                ConnectorStatus {
                    state: TaskState::Unassigned,
                    trace: None,
                    origin: origin.clone(),
                },
            );
        let (tx, rx) = tokio_watch::channel(Control {
            config: Arc::new(c),
            target,
            restarts: 0,
            generation: 0,
        });
        let (applied_tx, applied) = tokio_watch::channel(0);
        let task = tokio::spawn(supervise(
            name.clone(),
            self.inner.deps.clone(),
            rx,
            applied_tx,
            self.inner.shutdown.clone(),
        ));
        entries.insert(
            name,
            Entry {
                origin,
                properties,
                kind: Some(kind),
                target,
                control: Some(tx),
                applied: Some(applied),
                task: Some(task),
            },
        );
    }

    /// Records a connector whose config is refused: FAILED with `error`, nothing runs.
    fn failed_entry(
        &self,
        entries: &mut BTreeMap<String, Entry>,
        name: &str,
        properties: BTreeMap<String, String>,
        origin: Origin,
        error: String,
    ) {
        self.inner
            .deps
            .statuses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                name.to_string(),
                ConnectorStatus {
                    state: TaskState::Failed,
                    trace: Some(error.clone()),
                    origin: origin.clone(),
                },
            );
        self.inner
            .deps
            .set_status(name, TaskState::Failed, Some(error));
        entries.insert(
            name.to_string(),
            Entry {
                origin,
                properties,
                kind: None,
                target: TargetState::Started,
                control: None,
                applied: None,
                task: None,
            },
        );
    }

    /// Stops and forgets connector `name` (its offsets stay), awaiting its task.
    async fn remove_entry(&self, entries: &mut BTreeMap<String, Entry>, name: &str) {
        if let Some(mut e) = entries.remove(name) {
            drop(e.control.take());
            if let Some(t) = e.task.take() {
                if let Err(err) = t.await {
                    tracing::error!(connector = name, error = %err, "a connector task panicked");
                }
            }
        }
        self.inner
            .deps
            .statuses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
        let records = [
            (Bytes::from(format!("status-connector-{name}")), None),
            (Bytes::from(format!("status-task-{name}-0")), None),
        ];
        if let Err(e) = self.inner.deps.status_topic.append(0, &records) {
            tracing::warn!(connector = name, error = %e, "cannot write {STATUS_TOPIC}");
        }
    }

    /// Changes connector `e`'s control with `f` and returns what to await for the change
    /// to be in effect ([`wait_applied`]).
    fn change(
        e: &Entry,
        f: impl FnOnce(&mut Control),
    ) -> Option<(tokio_watch::Receiver<u64>, u64)> {
        let tx = e.control.as_ref()?;
        let mut generation = 0;
        tx.send_modify(|ctl| {
            f(ctl);
            ctl.generation += 1;
            generation = ctl.generation;
        });
        e.applied.clone().map(|rx| (rx, generation))
    }

    fn store(&self, records: &[(Bytes, Option<Bytes>)]) -> Result<(), ConnectError> {
        self.inner.configs_topic.append(0, records).map_err(|e| {
            ConnectError::Store(format!("cannot write {}: {e}", configs::CONFIGS_TOPIC))
        })
    }

    /// Refuses a new REST-created connector beyond [`MAX_CONNECTORS`].
    fn check_room(entries: &BTreeMap<String, Entry>) -> Result<(), ConnectError> {
        if entries.len() >= MAX_CONNECTORS {
            return Err(ConnectError::Invalid(format!(
                "at most {MAX_CONNECTORS} connectors per broker; delete one first"
            )));
        }
        Ok(())
    }

    fn refuse_file(name: &str, origin: &Origin) -> Result<(), ConnectError> {
        match origin {
            Origin::File(p) => Err(ConnectError::Conflict(format!(
                "Connector {name} is defined by the file {}; change or remove the file instead (it would overwrite a change made here)",
                p.display()
            ))),
            Origin::Rest => Ok(()),
        }
    }

    /// `props` as a connector config from `origin`, checked by
    /// [`ConnectorConfig::from_map`] and against the broker's ceiling: what a config file
    /// or a stored config must pass to run.
    ///
    /// Errors: [`config::ConfigError`] naming the key.
    fn accept(
        &self,
        origin: &Path,
        props: BTreeMap<String, String>,
    ) -> Result<ConnectorConfig, config::ConfigError> {
        let c = ConnectorConfig::from_map(origin, props)?;
        self.inner.settings.ceiling.check(origin, &c)?;
        if let Some(message) = self.worker_refusal(&c) {
            return Err(config::ConfigError {
                path: origin.to_path_buf(),
                key: Some("exactly.once.support".into()),
                message,
            });
        }
        Ok(c)
    }

    /// Why this worker cannot run `c` as its config asks (KIP-618): a source with
    /// `exactly.once.support=required` when `connect.exactly.once.source.support` is not
    /// `enabled`. (Kafka Connect skips the check then; weir refuses, since it would run
    /// the connector at least once.)
    fn worker_refusal(&self, c: &ConnectorConfig) -> Option<String> {
        let support = self.inner.settings.exactly_once_source;
        (c.kind == ConnectorKind::Source
            && c.exactly_once_support == config::ExactlyOnceSupport::Required
            && support != crate::config::ExactlyOnceSourceSupport::Enabled)
            .then(|| {
                format!(
                    "exactly.once.support=required: this broker's connect.exactly.once.source.support is {}, not enabled, so the connector would run at least once",
                    support.as_str()
                )
            })
    }

    /// Everything wrong with connector properties `props`, by key: the static checks
    /// ([`catalog::static_errors`]), then, for a well-formed config, the broker's ceiling
    /// and its components — the connector component must exist and be a connector of the
    /// config's kind ([`PluginHost::check_connector`]), each `transforms.<alias>.type`
    /// must load as a transform with its keys. Returns the config when there is none.
    async fn errors(
        &self,
        props: &BTreeMap<String, String>,
    ) -> (Option<ConnectorConfig>, catalog::KeyErrors) {
        let (checked, mut errors) = catalog::static_errors(props);
        let Some(c) = checked else {
            return (None, errors);
        };
        let mut add = |key: String, message: String| errors.entry(key).or_default().push(message);
        if let Err(e) = self.inner.settings.ceiling.check(Origin::Rest.path(), &c) {
            add(e.key.unwrap_or_else(|| "connector.class".into()), e.message);
        }
        if let Some(message) = self.worker_refusal(&c) {
            add("exactly.once.support".into(), message);
        }
        let plugins = self.inner.deps.plugins.clone();
        let path = c.component_path(&self.inner.settings.plugin_path);
        let sink = c.kind == ConnectorKind::Sink;
        let component =
            tokio::task::spawn_blocking(move || plugins.check_connector(&path, sink)).await;
        match component {
            Ok(Ok(())) => {}
            Ok(Err(e)) => add("connector.class".into(), e.to_string()),
            Err(e) => add(
                "connector.class".into(),
                format!("the component check failed: {e}"),
            ),
        }
        for t in &c.transforms {
            if let Err(e) = self
                .inner
                .deps
                .plugins
                .load_transform(&t.wasm, &t.config)
                .await
            {
                add(format!("transforms.{}.type", t.alias), e.to_string());
            }
        }
        if errors.is_empty() {
            (Some(c), errors)
        } else {
            (None, errors)
        }
    }

    /// `PUT /connector-plugins/{class}/config/validate`: Kafka Connect's `ConfigInfos`
    /// for `props` as a config of `class` ([`catalog::config_infos`]) with every error
    /// creating it would meet ([`ConnectRuntime::errors`]); `None` when `class` is not a
    /// built-in.
    pub(crate) async fn validate(
        &self,
        class: &str,
        props: &BTreeMap<String, String>,
    ) -> Option<Value> {
        catalog::keys_of(class)?;
        // Kafka Connect's ConnectorPluginsResource sets `connector.class` from the path.
        let mut props = props.clone();
        props.insert("connector.class".into(), class.to_string());
        let (_, errors) = self.errors(&props).await;
        catalog::config_infos(class, &props, &errors)
    }

    /// A REST config for connector `name` (its `name` key filled in, or checked against
    /// the URL's) with every check validate makes ([`ConnectRuntime::errors`]).
    ///
    /// Errors: [`ConnectError::Invalid`] with Kafka Connect's message listing every
    /// error ([`catalog::invalid_message`]), or a name differing from the URL's.
    async fn check(
        &self,
        name: &str,
        props: BTreeMap<String, String>,
    ) -> Result<(ConnectorConfig, BTreeMap<String, String>), ConnectError> {
        let mut props = props;
        match props.get("name") {
            None => {
                props.insert("name".into(), name.to_string());
            }
            Some(n) if n == name => {}
            Some(n) => {
                return Err(ConnectError::Invalid(format!(
                    "Connector name configuration ({n}) doesn't match connector name in the URL ({name})"
                )))
            }
        }
        match self.errors(&props).await {
            (Some(c), _) => Ok((c, props)),
            (None, errors) => {
                let message = catalog::invalid_message(&errors);
                tracing::info!(connector = name, "connector config refused: {message}");
                Err(ConnectError::Invalid(message))
            }
        }
    }

    /// `POST /connectors`: creates connector `name` with `props`.
    ///
    /// Errors: [`ConnectError::Conflict`] when the name exists, `Invalid` for a refused
    /// config, `Store` when `__connect_configs` cannot be written.
    pub(crate) async fn create(
        &self,
        name: &str,
        props: BTreeMap<String, String>,
    ) -> Result<Value, ConnectError> {
        let (c, props) = self.check(name, props).await?;
        let mut entries = self.inner.entries.lock().await;
        if entries.contains_key(name) {
            return Err(ConnectError::Conflict(format!(
                "Connector {name} already exists"
            )));
        }
        Self::check_room(&entries)?;
        self.store(&[configs::connector_record(name, &props)])?;
        self.spawn_entry(&mut entries, c, props, Origin::Rest, TargetState::Started);
        Ok(self.info_of(name, &entries))
    }

    /// `PUT /connectors/{name}/config`: creates (`true`) or updates (`false`) connector
    /// `name`; an update restarts its task with the new config.
    ///
    /// Errors: `Conflict` for a file-defined connector, `Invalid`, `Store`.
    pub(crate) async fn put_config(
        &self,
        name: &str,
        props: BTreeMap<String, String>,
    ) -> Result<(Value, bool), ConnectError> {
        // A file-defined connector is refused as such (409) whatever the new config says.
        if let Some(e) = self.inner.entries.lock().await.get(name) {
            Self::refuse_file(name, &e.origin)?;
        }
        let (c, props) = self.check(name, props).await?;
        let mut entries = self.inner.entries.lock().await;
        let Some(e) = entries.get_mut(name) else {
            Self::check_room(&entries)?;
            self.store(&[configs::connector_record(name, &props)])?;
            self.spawn_entry(&mut entries, c, props, Origin::Rest, TargetState::Started);
            return Ok((self.info_of(name, &entries), true));
        };
        Self::refuse_file(name, &e.origin)?;
        self.store(&[configs::connector_record(name, &props)])?;
        let kind = c.kind;
        let mut wait = None;
        if e.control.is_some() {
            wait = Self::change(e, |ctl| ctl.config = Arc::new(c));
            e.properties = props;
            e.kind = Some(kind);
        } else {
            let target = e.target;
            entries.remove(name);
            self.spawn_entry(&mut entries, c, props, Origin::Rest, target);
        }
        let info = self.info_of(name, &entries);
        drop(entries);
        wait_applied(wait).await;
        Ok((info, false))
    }

    /// `DELETE /connectors/{name}`: stops the connector and forgets its config (its
    /// offsets stay, as in Kafka Connect).
    ///
    /// Errors: `NotFound`, `Conflict` for a file-defined connector, `Store`.
    pub(crate) async fn delete(&self, name: &str) -> Result<(), ConnectError> {
        let mut entries = self.inner.entries.lock().await;
        let e = entries.get(name).ok_or_else(|| not_found(name))?;
        Self::refuse_file(name, &e.origin)?;
        self.store(&configs::delete_records(name))?;
        self.remove_entry(&mut entries, name).await;
        tracing::info!(connector = name, "connector deleted");
        Ok(())
    }

    /// `PUT /connectors/{name}/pause`, `/resume`, `/stop`: sets and stores the target
    /// state (also for file-defined connectors: it is runtime state, not config).
    ///
    /// Errors: `NotFound`, `Store`.
    pub(crate) async fn set_target(
        &self,
        name: &str,
        target: TargetState,
    ) -> Result<(), ConnectError> {
        let mut entries = self.inner.entries.lock().await;
        let e = entries.get_mut(name).ok_or_else(|| not_found(name))?;
        if e.target == target {
            return Ok(());
        }
        self.store(&[configs::target_record(name, target)])?;
        e.target = target;
        let wait = Self::change(e, |ctl| ctl.target = target);
        drop(entries);
        tracing::info!(
            connector = name,
            target = target.name(),
            "connector target state changed"
        );
        wait_applied(wait).await;
        Ok(())
    }

    /// `POST /connectors/{name}/restart[?includeTasks&onlyFailed]`: restarts what Kafka
    /// Connect's `RestartRequest` selects — the connector unless `only_failed` and it is
    /// not FAILED; its task when `include_tasks`, unless `only_failed` and it is not
    /// FAILED. weir's connector is its one task, so restarting either restarts the one
    /// attempt (a running one stops gracefully first); what was restarted shows as
    /// RESTARTING until it runs again.
    ///
    /// Errors: `NotFound`.
    pub(crate) async fn restart(
        &self,
        name: &str,
        include_tasks: bool,
        only_failed: bool,
    ) -> Result<Restarted, ConnectError> {
        let entries = self.inner.entries.lock().await;
        let e = entries.get(name).ok_or_else(|| not_found(name))?;
        let state = self
            .inner
            .deps
            .status(name)
            .map(|s| s.state)
            .unwrap_or(TaskState::Unassigned);
        let failed = state == TaskState::Failed;
        let restarted = Restarted {
            connector: !only_failed || failed,
            task: include_tasks && (!only_failed || failed),
        };
        if e.control.is_none() || e.target != TargetState::Started {
            // A refused file config (nothing to restart until the file changes), or a
            // paused or stopped connector (no instance to restart; resume starts one).
            return Ok(Restarted {
                connector: false,
                task: false,
            });
        }
        let mut wait = None;
        if restarted.connector || restarted.task {
            self.inner
                .deps
                .set_status(name, TaskState::Restarting, None);
            wait = Self::change(e, |ctl| ctl.restarts += 1);
        }
        drop(entries);
        wait_applied(wait).await;
        Ok(restarted)
    }

    /// `POST /connectors/{name}/tasks/{task}/restart`: restarts task 0 (the only one).
    ///
    /// Errors: `NotFound` for another task id or an unknown connector.
    pub(crate) async fn restart_task(&self, name: &str, task: u32) -> Result<(), ConnectError> {
        if task != 0 {
            let entries = self.inner.entries.lock().await;
            if !entries.contains_key(name) {
                return Err(not_found(name));
            }
            return Err(ConnectError::NotFound(format!(
                "Task {name}-{task} not found"
            )));
        }
        self.restart(name, true, false).await.map(|_| ())
    }

    /// Connector names, sorted.
    pub(crate) async fn names(&self) -> Vec<String> {
        self.inner.entries.lock().await.keys().cloned().collect()
    }

    fn info_of(&self, name: &str, entries: &BTreeMap<String, Entry>) -> Value {
        let Some(e) = entries.get(name) else {
            return Value::Null;
        };
        let tasks: Vec<Value> = if e.target == TargetState::Stopped || e.kind.is_none() {
            Vec::new()
        } else {
            vec![json!({"connector": name, "task": 0})]
        };
        json!({
            "name": name,
            "config": e.properties,
            "tasks": tasks,
            "type": e.kind.map(catalog::kind_name).unwrap_or("unknown"),
        })
    }

    /// `GET /connectors/{name}`: `{name, config, tasks: [{connector, task}], type}`.
    ///
    /// Errors: `NotFound`.
    pub(crate) async fn info(&self, name: &str) -> Result<Value, ConnectError> {
        let entries = self.inner.entries.lock().await;
        if !entries.contains_key(name) {
            return Err(not_found(name));
        }
        Ok(self.info_of(name, &entries))
    }

    /// `GET /connectors/{name}/config`: the properties as given.
    ///
    /// Errors: `NotFound`.
    pub(crate) async fn config(
        &self,
        name: &str,
    ) -> Result<BTreeMap<String, String>, ConnectError> {
        let entries = self.inner.entries.lock().await;
        entries
            .get(name)
            .map(|e| e.properties.clone())
            .ok_or_else(|| not_found(name))
    }

    /// `GET /connectors/{name}/tasks`: `[{"id": {connector, task}, "config": {...}}]`.
    ///
    /// Errors: `NotFound`.
    pub(crate) async fn tasks(&self, name: &str) -> Result<Value, ConnectError> {
        let entries = self.inner.entries.lock().await;
        let e = entries.get(name).ok_or_else(|| not_found(name))?;
        if e.target == TargetState::Stopped || e.kind.is_none() {
            return Ok(json!([]));
        }
        Ok(json!([{
            "id": {"connector": name, "task": 0},
            "config": e.properties,
        }]))
    }

    fn task_json(&self, state: TaskState, trace: &Option<String>) -> Value {
        let mut t = json!({
            "id": 0,
            "state": state.name(),
            "worker_id": self.inner.deps.worker_id,
        });
        if let (Some(trace), Some(obj)) = (trace, t.as_object_mut()) {
            obj.insert("trace".into(), Value::String(trace.clone()));
        }
        t
    }

    fn status_of(
        &self,
        name: &str,
        entries: &BTreeMap<String, Entry>,
        restarted: Option<Restarted>,
    ) -> Option<Value> {
        let e = entries.get(name)?;
        let s = self.inner.deps.status(name)?;
        let mut connector_state = s.state.connector_state();
        let mut task_state = s.state;
        if let Some(r) = restarted {
            if r.connector {
                connector_state = TaskState::Restarting;
            }
            if r.task {
                task_state = TaskState::Restarting;
            }
        }
        let mut connector = json!({
            "state": connector_state.name(),
            "worker_id": self.inner.deps.worker_id,
        });
        if connector_state == TaskState::Failed {
            if let (Some(trace), Some(obj)) = (&s.trace, connector.as_object_mut()) {
                obj.insert("trace".into(), Value::String(trace.clone()));
            }
        }
        let tasks: Vec<Value> = if s.state == TaskState::Stopped || e.kind.is_none() {
            Vec::new()
        } else {
            vec![self.task_json(task_state, &s.trace)]
        };
        Some(json!({
            "name": name,
            "connector": connector,
            "tasks": tasks,
            "type": e.kind.map(catalog::kind_name).unwrap_or("unknown"),
        }))
    }

    /// `GET /connectors/{name}/status` (Kafka Connect's `ConnectorStateInfo`); with
    /// `restarted`, what a restart restarted shows as RESTARTING.
    ///
    /// Errors: `NotFound`.
    pub(crate) async fn status(
        &self,
        name: &str,
        restarted: Option<Restarted>,
    ) -> Result<Value, ConnectError> {
        let entries = self.inner.entries.lock().await;
        self.status_of(name, &entries, restarted)
            .ok_or_else(|| not_found(name))
    }

    /// `GET /connectors/{name}/tasks/{task}/status`.
    ///
    /// Errors: `NotFound` (unknown connector, or a task other than 0, or a stopped
    /// connector, which has no task).
    pub(crate) async fn task_status(&self, name: &str, task: u32) -> Result<Value, ConnectError> {
        let status = self.status(name, None).await?;
        status["tasks"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["id"] == task))
            .cloned()
            .ok_or_else(|| ConnectError::NotFound(format!("Task {name}-{task} not found")))
    }

    /// `GET /connectors?expand=...`: `{name: {"status": ..., "info": ...}}` with the
    /// parts asked.
    pub(crate) async fn expanded(&self, status: bool, info: bool) -> Value {
        let entries = self.inner.entries.lock().await;
        let mut out = serde_json::Map::new();
        for name in entries.keys() {
            let mut v = serde_json::Map::new();
            if status {
                if let Some(s) = self.status_of(name, &entries, None) {
                    v.insert("status".into(), s);
                }
            }
            if info {
                v.insert("info".into(), self.info_of(name, &entries));
            }
            out.insert(name.clone(), Value::Object(v));
        }
        Value::Object(out)
    }

    /// `GET /connectors/{name}/offsets` (KIP-875): sources
    /// `{"offsets": [{"partition": {...}, "offset": {...}}]}` from `__connect_offsets`;
    /// sinks the committed offsets of group `connect-<name>` as
    /// `{"partition": {"kafka_topic", "kafka_partition"}, "offset": {"kafka_offset"}}`.
    ///
    /// Errors: `NotFound`.
    pub(crate) async fn offsets(&self, name: &str) -> Result<Value, ConnectError> {
        let kind = {
            let entries = self.inner.entries.lock().await;
            entries.get(name).ok_or_else(|| not_found(name))?.kind
        };
        let deps = &self.inner.deps;
        let offsets: Vec<Value> = match kind {
            Some(ConnectorKind::Source) => deps
                .offsets
                .positions(name)
                .into_iter()
                .map(|p| {
                    let m = |pairs: Vec<(String, String)>| -> serde_json::Map<String, Value> {
                        pairs
                            .into_iter()
                            .map(|(k, v)| (k, Value::String(v)))
                            .collect()
                    };
                    json!({"partition": m(p.source_partition), "offset": m(p.source_offset)})
                })
                .collect(),
            Some(ConnectorKind::Sink) => deps
                .ctx
                .groups
                .fetch_offsets(&group_id(name), None)
                .into_iter()
                .flat_map(|(topic, parts)| {
                    parts.into_iter().filter_map(move |(p, c)| {
                        c.map(|c| {
                            json!({
                                "partition": {"kafka_topic": topic, "kafka_partition": p},
                                "offset": {"kafka_offset": c.offset},
                            })
                        })
                    })
                })
                .collect(),
            None => Vec::new(),
        };
        Ok(json!({ "offsets": offsets }))
    }

    /// Waits until connector `name` is STOPPED (target and task), for an offsets change.
    ///
    /// Errors: `NotFound`; `Invalid` (400, Kafka Connect's answer) when its target state
    /// is not STOPPED; `Conflict` when it is still stopping after 30 s.
    async fn stopped_kind(&self, name: &str) -> Result<ConnectorKind, ConnectError> {
        let deadline = Instant::now() + Duration::from_millis(STOPPING_WAIT_MS);
        loop {
            {
                let entries = self.inner.entries.lock().await;
                let e = entries.get(name).ok_or_else(|| not_found(name))?;
                if e.target != TargetState::Stopped {
                    return Err(ConnectError::Invalid(
                        "Connectors must be in the STOPPED state before their offsets can be modified. This can be done for the specified connector by issuing a 'PUT' request to the '/connectors/".to_string()
                            + name + "/stop' endpoint",
                    ));
                }
                let Some(kind) = e.kind else {
                    return Err(ConnectError::Invalid(format!(
                        "Connector {name} has a refused config: no offsets to change"
                    )));
                };
                if self.inner.deps.status(name).map(|s| s.state) == Some(TaskState::Stopped) {
                    return Ok(kind);
                }
            }
            if Instant::now() > deadline {
                return Err(ConnectError::Conflict(format!(
                    "Connector {name} is still stopping; try again"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `DELETE /connectors/{name}/offsets` (KIP-875): forgets every offset of a STOPPED
    /// connector (tombstones in `__connect_offsets`; a sink's group offsets deleted), so
    /// it starts from the beginning when resumed.
    ///
    /// Errors: as [`ConnectRuntime::stopped_kind`], or `Store`.
    pub(crate) async fn reset_offsets(&self, name: &str) -> Result<Value, ConnectError> {
        let kind = self.stopped_kind(name).await?;
        let deps = &self.inner.deps;
        match kind {
            ConnectorKind::Source => {
                deps.offsets.reset(name).map_err(ConnectError::Store)?;
            }
            ConnectorKind::Sink => {
                let group = group_id(name);
                let partitions: Vec<(String, i32)> = deps
                    .ctx
                    .groups
                    .fetch_offsets(&group, None)
                    .into_iter()
                    .flat_map(|(t, parts)| parts.into_iter().map(move |(p, _)| (t.clone(), p)))
                    .collect();
                if !partitions.is_empty() {
                    deps.ctx
                        .groups
                        .delete_offsets(&group, &partitions)
                        .map_err(|e| {
                            ConnectError::Store(format!(
                                "cannot delete the offsets of {group}: {e:?}"
                            ))
                        })?;
                }
            }
        }
        tracing::info!(connector = name, "connector offsets reset");
        Ok(json!({"message": "The offsets for this connector have been reset successfully"}))
    }

    /// `PATCH /connectors/{name}/offsets` (KIP-875) with body
    /// `{"offsets": [{"partition": {...}, "offset": {...} | null}]}`: sets (or, with a
    /// null offset, forgets) each partition's offset of a STOPPED connector. Sinks take
    /// Kafka Connect's `{"kafka_topic", "kafka_partition"}` / `{"kafka_offset"}`.
    ///
    /// Errors: as [`ConnectRuntime::stopped_kind`]; `Invalid` for a malformed body;
    /// `Store`.
    pub(crate) async fn alter_offsets(
        &self,
        name: &str,
        body: &Value,
    ) -> Result<Value, ConnectError> {
        let list = body
            .get("offsets")
            .and_then(Value::as_array)
            .ok_or_else(|| {
                ConnectError::Invalid("Offsets must be specified as {\"offsets\": [...]}".into())
            })?;
        if list.is_empty() {
            return Err(ConnectError::Invalid(
                "Partitions / offsets need to be provided for an alter offsets request".into(),
            ));
        }
        let kind = self.stopped_kind(name).await?;
        let deps = &self.inner.deps;
        match kind {
            ConnectorKind::Source => {
                let mut changes = Vec::with_capacity(list.len());
                for item in list {
                    let partition = item
                        .get("partition")
                        .and_then(store::json_string_map)
                        .ok_or_else(|| {
                            ConnectError::Invalid("each entry needs a \"partition\" object".into())
                        })?;
                    let offset = match item.get("offset") {
                        None | Some(Value::Null) => None,
                        Some(v) => Some(store::json_string_map(v).ok_or_else(|| {
                            ConnectError::Invalid("an \"offset\" must be an object or null".into())
                        })?),
                    };
                    changes.push((partition, offset));
                }
                deps.offsets
                    .alter(name, &changes)
                    .map_err(ConnectError::Store)?;
            }
            ConnectorKind::Sink => {
                let group = group_id(name);
                let mut set = Vec::new();
                let mut forget = Vec::new();
                for item in list {
                    let p = item.get("partition");
                    let topic = p.and_then(|p| p.get("kafka_topic")).and_then(Value::as_str);
                    let part = p
                        .and_then(|p| p.get("kafka_partition"))
                        .and_then(Value::as_i64)
                        .and_then(|n| i32::try_from(n).ok());
                    let (Some(topic), Some(part)) = (topic, part) else {
                        return Err(ConnectError::Invalid("a sink partition is {\"kafka_topic\": <string>, \"kafka_partition\": <int>}".into()));
                    };
                    match item.get("offset") {
                        None | Some(Value::Null) => forget.push((topic.to_string(), part)),
                        Some(o) => {
                            let offset = o
                                .get("kafka_offset")
                                .and_then(Value::as_i64)
                                .filter(|n| *n >= 0)
                                .ok_or_else(|| {
                                    ConnectError::Invalid(
                                        "a sink offset is {\"kafka_offset\": <non-negative int>}"
                                            .into(),
                                    )
                                })?;
                            set.push(crate::group::OffsetToCommit {
                                topic: topic.to_string(),
                                partition: part,
                                offset,
                                leader_epoch: -1,
                                metadata: None,
                            });
                        }
                    }
                }
                if !set.is_empty() {
                    let request = crate::group::CommitRequest {
                        group_id: group.clone(),
                        generation_id: -1,
                        member_id: String::new(),
                        group_instance_id: None,
                        offsets: set,
                    };
                    if let Some(e) = deps
                        .ctx
                        .groups
                        .commit(&request)
                        .into_iter()
                        .flatten()
                        .next()
                    {
                        return Err(ConnectError::Store(format!(
                            "cannot commit the offsets of {group}: {e:?}"
                        )));
                    }
                }
                if !forget.is_empty() {
                    if let Err(e) = deps.ctx.groups.delete_offsets(&group, &forget) {
                        tracing::debug!(group = %group, error = ?e, "no offsets to forget");
                    }
                }
            }
        }
        tracing::info!(connector = name, "connector offsets altered");
        Ok(json!({"message": "The offsets for this connector have been altered successfully"}))
    }

    /// Re-reads `connect.config.dir`: a new file creates its connector, a changed one
    /// updates it (restarting its task), a removed one deletes it. `targets` are the
    /// stored target states (at start). A file naming a connector that another file or
    /// the REST API defines is refused with an error log.
    async fn rescan(&self, targets: &BTreeMap<String, TargetState>) {
        let Some(dir) = self.inner.settings.config_dir.clone() else {
            return;
        };
        let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
            Ok(rd) => rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                .collect(),
            Err(e) => {
                tracing::error!(dir = %dir.display(), error = %e, "cannot list connect.config.dir");
                return;
            }
        };
        files.sort();
        let mut entries = self.inner.entries.lock().await;
        // Removed files first, so a connector moved to another file is recreated there.
        let known: Vec<(PathBuf, String)> = self
            .inner
            .files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(p, n)| (p.clone(), n.clone()))
            .collect();
        for (path, name) in &known {
            if !files.contains(path) {
                self.inner
                    .files
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(path);
                if entries
                    .get(name)
                    .is_some_and(|e| e.origin == Origin::File(path.clone()))
                {
                    tracing::info!(connector = %name, file = %path.display(), "connector file removed; deleting the connector");
                    if let Err(e) = self.store(&configs::delete_records(name)) {
                        tracing::warn!(connector = %name, error = %e, "target state not forgotten");
                    }
                    self.remove_entry(&mut entries, name).await;
                }
            }
        }
        for path in files {
            let origin = Origin::File(path.clone());
            let parsed = std::fs::read_to_string(&path)
                .map_err(|e| format!("connector config {}: cannot read: {e}", path.display()))
                .and_then(|text| config::file_properties(&path, &text).map_err(|e| e.to_string()));
            let stem = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let (name, props, checked) = match parsed {
                Ok(props) => {
                    let checked = self.accept(&path, props.clone());
                    let name = match &checked {
                        Ok(c) => c.name.clone(),
                        Err(_) => props
                            .get("name")
                            .map(|n| n.trim().to_string())
                            .filter(|n| !n.is_empty() && !n.contains('/'))
                            .unwrap_or_else(|| stem.clone()),
                    };
                    (name, props, checked.map_err(|e| e.to_string()))
                }
                Err(e) => (stem.clone(), BTreeMap::new(), Err(e)),
            };
            let previous = self
                .inner
                .files
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&path)
                .cloned();
            if let Some(prev) = &previous {
                if *prev != name && entries.get(prev).is_some_and(|e| e.origin == origin) {
                    self.remove_entry(&mut entries, prev).await;
                }
            }
            match entries.get_mut(&name) {
                Some(e) if e.origin != origin => {
                    if previous.as_deref() != Some(name.as_str()) {
                        tracing::error!(connector = %name, file = %path.display(), "connector {name} in {}: the name is already used by {}; file ignored", path.display(), e.origin.path().display());
                    }
                    self.inner
                        .files
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(path.clone(), name.clone());
                    continue;
                }
                Some(e) if e.properties == props && (e.kind.is_some() == checked.is_ok()) => {
                    continue;
                }
                Some(e) => {
                    let target = e.target;
                    match (checked, &e.control) {
                        (Ok(c), Some(_)) => {
                            tracing::info!(connector = %name, file = %path.display(), "connector file changed; restarting with the new config");
                            let kind = c.kind;
                            // Not awaited: the directory's other files need not wait.
                            let _ = Self::change(e, |ctl| ctl.config = Arc::new(c));
                            e.properties = props;
                            e.kind = Some(kind);
                        }
                        (Ok(c), None) => {
                            entries.remove(&name);
                            self.spawn_entry(&mut entries, c, props, origin, target);
                        }
                        (Err(err), _) => {
                            tracing::error!(connector = %name, "{err}");
                            self.remove_entry(&mut entries, &name).await;
                            self.failed_entry(&mut entries, &name, props, origin, err);
                        }
                    }
                }
                None => {
                    let target = targets.get(&name).copied().unwrap_or(TargetState::Started);
                    match checked {
                        Ok(c) => self.spawn_entry(&mut entries, c, props, origin, target),
                        Err(err) => {
                            tracing::error!(connector = %name, "{err}");
                            self.failed_entry(&mut entries, &name, props, origin, err);
                        }
                    }
                }
            }
            self.inner
                .files
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(path, name);
        }
    }
}

/// Waits (at most [`STOPPING_WAIT_MS`]) until the supervisor acknowledged a change, so
/// a `202 Accepted` for pause means no more polls, and a config change means no record
/// goes out under the old config. A supervisor that ended (shutdown) ends the wait.
async fn wait_applied(wait: Option<(tokio_watch::Receiver<u64>, u64)>) {
    let Some((mut rx, generation)) = wait else {
        return;
    };
    let acked = tokio::time::timeout(
        Duration::from_millis(STOPPING_WAIT_MS),
        rx.wait_for(|g| *g >= generation),
    )
    .await;
    if acked.is_err() {
        tracing::warn!(
            generation,
            "a connector change is not in effect after {STOPPING_WAIT_MS} ms"
        );
    }
}

/// How the wait for a control change ended.
enum Wake {
    /// The control changed.
    Changed,
    /// The broker is stopping, or the connector was deleted.
    Exit,
}

async fn wake(
    ctl: &mut tokio_watch::Receiver<Control>,
    shutdown: &mut tokio_watch::Receiver<bool>,
) -> Wake {
    loop {
        tokio::select! {
            r = ctl.changed() => return if r.is_ok() { Wake::Changed } else { Wake::Exit },
            r = shutdown.changed() => {
                if r.is_err() || *shutdown.borrow() {
                    return Wake::Exit;
                }
            }
        }
    }
}

/// Runs a connector's task as its [`Control`] says, restarting it with backoff, until
/// shutdown or deletion.
async fn supervise(
    name: String,
    deps: Arc<Deps>,
    mut ctl: tokio_watch::Receiver<Control>,
    applied: tokio_watch::Sender<u64>,
    mut shutdown: tokio_watch::Receiver<bool>,
) {
    let mut backoff_ms = FIRST_BACKOFF_MS;
    let mut failing_since: Option<Instant> = None;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let control = ctl.borrow_and_update().clone();
        let idle = match control.target {
            TargetState::Started => None,
            TargetState::Paused => Some(TaskState::Paused),
            TargetState::Stopped => Some(TaskState::Stopped),
        };
        if let Some(state) = idle {
            deps.set_status(&name, state, None);
            applied.send_replace(control.generation);
            failing_since = None;
            backoff_ms = FIRST_BACKOFF_MS;
            match wake(&mut ctl, &mut shutdown).await {
                Wake::Changed => continue,
                Wake::Exit => return,
            }
        }
        // The previous attempt has ended: the change is in effect.
        applied.send_replace(control.generation);
        let c = control.config.clone();
        let (stop_tx, mut stop_rx) = tokio_watch::channel(false);
        let mut progress = Progress::default();
        let mut woken: Option<Wake> = None;
        let result = {
            let attempt = async {
                match c.kind {
                    ConnectorKind::Source => {
                        source::run(&c, &deps, &mut progress, &mut stop_rx).await
                    }
                    ConnectorKind::Sink => sink::run(&c, &deps, &mut progress, &mut stop_rx).await,
                }
            };
            tokio::pin!(attempt);
            tokio::select! {
                r = &mut attempt => r,
                w = wake(&mut ctl, &mut shutdown) => {
                    woken = Some(w);
                    let _ = stop_tx.send(true);
                    attempt.await
                }
            }
        };
        match (woken, result) {
            (Some(Wake::Exit), Ok(())) => {
                tracing::info!(connector = %name, "connector stopped");
                return;
            }
            (Some(Wake::Exit), Err(e)) => {
                tracing::warn!(connector = %name, error = %e, "connector failed while stopping");
                return;
            }
            (Some(Wake::Changed), r) => {
                if let Err(e) = r {
                    tracing::warn!(connector = %name, error = %e, "connector failed while stopping for a change");
                }
                failing_since = None;
                backoff_ms = FIRST_BACKOFF_MS;
                // The top of the loop reads the changed control.
                continue;
            }
            (None, Ok(())) => {
                // The attempt ended by itself (a task only does when told to stop).
                tracing::info!(connector = %name, "connector stopped");
                match wake(&mut ctl, &mut shutdown).await {
                    Wake::Changed => continue,
                    Wake::Exit => return,
                }
            }
            (None, Err(e)) => {
                let error = e.to_string();
                if progress.made {
                    failing_since = None;
                    backoff_ms = FIRST_BACKOFF_MS;
                }
                let since = *failing_since.get_or_insert_with(Instant::now);
                let out_of_time = c
                    .retry_timeout_ms
                    .is_some_and(|t| since.elapsed() >= Duration::from_millis(t));
                let hopeless = matches!(e, TaskError::Refused(_));
                if out_of_time || hopeless {
                    let why = if hopeless {
                        "a record can never be written"
                    } else {
                        "errors.retry.timeout reached"
                    };
                    tracing::error!(connector = %name, error = %error, "connector FAILED ({why})");
                    deps.set_status(&name, TaskState::Failed, Some(error));
                    match wake(&mut ctl, &mut shutdown).await {
                        Wake::Changed => {
                            failing_since = None;
                            backoff_ms = FIRST_BACKOFF_MS;
                            continue;
                        }
                        Wake::Exit => return,
                    }
                }
                tracing::warn!(connector = %name, error = %error, retry_in_ms = backoff_ms, "connector task failed; restarting");
                deps.set_status(&name, TaskState::Unassigned, Some(error));
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(backoff_ms)) => {}
                    w = wake(&mut ctl, &mut shutdown) => match w {
                        Wake::Changed => {
                            failing_since = None;
                            backoff_ms = FIRST_BACKOFF_MS;
                            continue;
                        }
                        Wake::Exit => return,
                    },
                }
                backoff_ms = (backoff_ms * 2).min(c.retry_delay_max_ms.max(FIRST_BACKOFF_MS));
            }
        }
    }
}
