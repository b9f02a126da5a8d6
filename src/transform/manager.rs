//! The transform manager: every deployment of the broker, by name.
//!
//! - Deploy/replace/delete (the admin API's `/transforms`): a spec is validated and its
//!   component loaded (compiled, checked against the `transform` world, opened with the
//!   config) *before* it is accepted, so a deployment that cannot run is refused, never
//!   accepted to fail later. Accepted API deployments are written to the cluster
//!   metadata (`MetadataRecord::TransformDeployed` / `TransformDeleted`), so every
//!   broker knows them and a restart restores them; deployments an earlier weir wrote to
//!   `<log.dir>/__transforms/<name>.json` are moved into the metadata once at start.
//! - On a cluster ([`TransformManager::run`] reconciles every
//!   [`RECONCILE_INTERVAL_MS`]): an **inline** deployment is installed on every broker,
//!   since whichever broker leads a partition of its input applies it to produced
//!   batches; an **async** deployment runs on exactly one broker, the connect leader
//!   (`connect::leader`: the leader of `__connect_configs`-0), and moves with it,
//!   resuming from its committed progress (after `connect::leader::TAKEOVER_GRACE_MS`).
//!   The admin API's `/transforms` is forwarded to that broker like `/connectors`; an
//!   async deployment made there within the grace starts when the grace ends.
//! - `transform.config.dir/*.toml`: the same specs as files, deployed at start and
//!   re-applied when a file changes (removing the file deletes the deployment). They are
//!   not copied to `__transforms/`: the file is their source of truth.
//! - Hot reload: a `notify` watcher on the directory of every deployed component (and on
//!   `transform.config.dir`). After a change settles ([`crate::fswatch::DEBOUNCE_MS`],
//!   debounced by [`crate::fswatch`]), the component is
//!   read, hashed and loaded; a load that fails is retried while the file keeps changing
//!   (a copy in progress), and only a stable file that fails is reported (`reload_error`,
//!   and a log line) while the old version keeps running. Async deployments swap between
//!   batches; inline ones get a new slot in the registry.
//! - Deleting a deployment stops its runner, removes its inline slot, its file and its
//!   progress (the group `transform-<name>`), so a new deployment of that name starts
//!   from the beginning of its input.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::Digest;
use tokio::sync::{watch, Notify};

use super::inline::{InlineRegistry, InlineSlot};
use super::runner::{short, Runner};
use super::spec::{Mode, TransformSpec};
use super::{Deployment, Loaded, Owners, RunState, Stats, Tolerance};
use crate::cluster::MetadataRecord;
use crate::fswatch;
use crate::ingest::Ingest;
use crate::plugin::PluginHost;

/// Wait before re-reading a component whose load failed, in milliseconds: a file still
/// being written changes meanwhile and is tried again; a stable one is reported.
pub(super) const RELOAD_SETTLE_MS: u64 = 300;
/// Most load attempts of one reload (a file that keeps changing for ~6 s is reported).
pub(super) const RELOAD_MAX_ATTEMPTS: usize = 20;
/// How often (ms) a broker compares its deployments with the metadata's and with where
/// async deployments run (see the module docs).
pub(super) const RECONCILE_INTERVAL_MS: u64 = 250;

/// How often an async deployment made within the connect leader's takeover grace looks
/// whether the grace is over, in ms.
const GRACE_POLL_MS: u64 = 50;

/// Why a deploy, replace or delete was refused.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DeployError {
    /// The spec is invalid or its component does not load (HTTP 400).
    #[error("{0}")]
    Invalid(String),
    /// A deployment of that name exists, or another inline deployment holds the input
    /// topic, or the deployment belongs to a file (HTTP 409).
    #[error("{0}")]
    Conflict(String),
    /// No deployment of that name (HTTP 404).
    #[error("{0}")]
    NotFound(String),
    /// The spec could not be persisted (HTTP 500).
    #[error("{0}")]
    Io(String),
}

/// A deployment's status: `GET /transforms/{name}` and `weir transform list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransformStatus {
    /// Deployment name.
    pub name: String,
    /// `async` or `inline`.
    pub mode: Mode,
    /// Input topic.
    pub input: String,
    /// Output topics (the first is the default).
    pub outputs: Vec<String>,
    /// Component path on the broker host.
    pub wasm: PathBuf,
    /// Config given to the plugin's `open`.
    pub config: BTreeMap<String, String>,
    /// `errors.tolerance`.
    #[serde(rename = "errors.tolerance")]
    pub tolerance: Tolerance,
    /// `errors.deadletterqueue.topic.name`.
    #[serde(rename = "errors.deadletterqueue.topic.name")]
    pub dlq_topic: Option<String>,
    /// `processing.guarantee`: `at_least_once` or `exactly_once`.
    #[serde(rename = "processing.guarantee", default)]
    pub guarantee: super::Guarantee,
    /// sha256 (hex) of the component bytes in use ("" when it never loaded).
    pub version: String,
    /// RUNNING or FAILED.
    pub state: RunState,
    /// Why it FAILED: the plugin's message (trap, timeout...) and the input
    /// topic/partition/offset of the failing record.
    pub error: Option<String>,
    /// Why the last hot reload was refused (the previous version still runs).
    pub reload_error: Option<String>,
    /// Records not yet transformed: Σ over input partitions of log end offset − committed
    /// progress (`null` for inline deployments, which have no lag).
    pub input_lag: Option<i64>,
    /// Records given to the transform.
    pub records_in: u64,
    /// Records written to the outputs.
    pub records_out: u64,
    /// Records that failed (dead-lettered, skipped, or the one that stopped it).
    pub errors: u64,
    /// Mean nanoseconds of transform calls per input record.
    pub mean_ns_per_record: u64,
    /// The TOML file defining it, when it came from `transform.config.dir`.
    pub source_file: Option<PathBuf>,
    /// The broker answering: where this status (and, for an async deployment, its
    /// runner) is (Kafka Connect's `worker_id`, as a `node.id`).
    #[serde(default)]
    pub broker_id: i32,
}

/// Whether deploying `spec` next to `others` (every other deployment; a replaced one
/// excluded) closes a cycle of topics: async deployments are edges input -> output, and
/// a cycle would move a record round it forever. A topic feeding itself is refused by
/// [`TransformSpec::validate`]; inline deployments rewrite their input in place (no
/// edge), and dead-letter topics are no edge (re-processing dead letters into the input
/// is a legitimate pipeline, and records only reach them by failing).
///
/// Returns the refusal naming the cycle and the deployments on it: "outputs: b -> a
/// closes the cycle a -> b -> a (transforms t1, t2): a record would loop forever".
fn closed_cycle<'a>(
    spec: &TransformSpec,
    others: impl Iterator<Item = &'a TransformSpec>,
) -> Option<String> {
    if spec.mode != Mode::Async {
        return None;
    }
    // topic -> [(output, deployment)], over the other async deployments.
    let mut edges: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
    for o in others.filter(|o| o.mode == Mode::Async) {
        for out in &o.outputs {
            edges
                .entry(o.input.as_str())
                .or_default()
                .push((out.as_str(), o.name.as_str()));
        }
    }
    for out in &spec.outputs {
        // Breadth-first from `out` back to the input: the shortest way round is named.
        let mut came_from: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([out.as_str()]);
        let mut seen = BTreeSet::from([out.as_str()]);
        while let Some(t) = queue.pop_front() {
            if t == spec.input {
                let mut path = vec![(t, "")];
                let mut at = t;
                while let Some(&(prev, via)) = came_from.get(at) {
                    path.push((prev, via));
                    at = prev;
                }
                path.reverse();
                let mut topics: Vec<&str> = vec![&spec.input];
                topics.extend(path.iter().map(|(t, _)| *t));
                let mut names: Vec<&str> = vec![&spec.name];
                names.extend(path.iter().map(|(_, n)| *n).filter(|n| !n.is_empty()));
                return Some(format!(
                    "outputs: {} -> {out} closes the cycle {} (transforms {}): a record would loop forever",
                    spec.input,
                    topics.join(" -> "),
                    names.join(", ")
                ));
            }
            for &(next, via) in edges.get(t).map(Vec::as_slice).unwrap_or_default() {
                if seen.insert(next) {
                    came_from.insert(next, (t, via));
                    queue.push_back(next);
                }
            }
        }
    }
    None
}

/// Where a deployment came from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    /// The admin API (kept in the cluster metadata).
    Api,
    /// A `transform.config.dir` file.
    File(PathBuf),
}

/// One deployment and what the manager holds for it.
struct Deployed {
    d: Arc<Deployment>,
    source: Source,
    /// The async runner: its stop signal and thread (`None` for inline, or FAILED at load).
    runner: Option<RunnerHandle>,
}

/// An async deployment's runner thread and its stop signal.
struct RunnerHandle {
    stop: watch::Sender<bool>,
    thread: std::thread::JoinHandle<()>,
}

/// File events not handled yet, and the signal that there are some.
#[derive(Default)]
struct Changes {
    paths: Mutex<BTreeSet<PathBuf>>,
    signal: Notify,
}

/// Every transform deployment of the broker (see the module docs).
pub struct TransformManager {
    ctx: Owners,
    ingest: Arc<Ingest>,
    plugins: Arc<PluginHost>,
    inline: Arc<InlineRegistry>,
    /// `<log.dir>/__transforms`.
    dir: PathBuf,
    /// `transform.config.dir`.
    config_dir: Option<PathBuf>,
    /// By name. An async mutex: deploys load components while holding it, so two deploys
    /// of one name cannot interleave.
    deployments: tokio::sync::Mutex<BTreeMap<String, Deployed>>,
    changes: Arc<Changes>,
    watcher: Mutex<Option<fswatch::Debounced>>,
    watched: Mutex<BTreeSet<PathBuf>>,
    /// Whether this broker runs async deployments (it is the connect leader), as of the
    /// last reconcile.
    runs_async: std::sync::atomic::AtomicBool,
    /// Metadata specs that do not parse, already logged (logged once each).
    unparsable: Mutex<BTreeSet<(String, Arc<str>)>>,
    /// Since when this broker has been the connect leader without a break (async
    /// deployments start `connect::leader::TAKEOVER_GRACE_MS` after).
    leads_since: Mutex<Option<std::time::Instant>>,
    /// Whether `transform.config.dir` was applied once (at the first reconcile).
    config_dir_applied: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for TransformManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransformManager")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl TransformManager {
    /// A manager over the broker's owners, installing inline deployments into `inline`,
    /// writing outputs through `ingest` and loading components through `plugins`; call
    /// [`TransformManager::start`] to restore deployments and [`TransformManager::run`]
    /// for hot reload.
    ///
    /// Errors: `<log.dir>/__transforms` cannot be created.
    pub fn new(
        ctx: Owners,
        inline: Arc<InlineRegistry>,
        ingest: Arc<Ingest>,
        plugins: Arc<PluginHost>,
    ) -> std::io::Result<TransformManager> {
        let dir = ctx.config.metadata_dir().join("__transforms");
        std::fs::create_dir_all(&dir)?;
        let changes = Arc::new(Changes::default());
        let sink = changes.clone();
        let watcher = fswatch::debounced(move |changed| {
            let mut paths = sink.paths.lock().unwrap_or_else(|e| e.into_inner());
            // Bounded: at most one entry per distinct file until the reload task drains them.
            if paths.len() < 10_000 {
                paths.extend(changed);
            }
            drop(paths);
            sink.signal.notify_one();
        });
        let watcher = match watcher {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch plugin files: hot reload is off");
                None
            }
        };
        Ok(TransformManager {
            inline,
            config_dir: ctx.config.transform_config_dir.clone(),
            ctx,
            ingest,
            plugins,
            dir,
            deployments: tokio::sync::Mutex::new(BTreeMap::new()),
            changes,
            watcher: Mutex::new(watcher),
            watched: Mutex::new(BTreeSet::new()),
            runs_async: std::sync::atomic::AtomicBool::new(false),
            unparsable: Mutex::new(BTreeSet::new()),
            config_dir_applied: std::sync::atomic::AtomicBool::new(false),
            leads_since: Mutex::new(None),
        })
    }

    /// Moves deployments an earlier weir kept under `__transforms/` into the metadata,
    /// then restores the metadata's deployments (those this broker runs: see the module
    /// docs) and those of `transform.config.dir`. One that no longer loads is kept as
    /// FAILED with the error (its spec is not lost); a file that does not parse is logged
    /// and skipped.
    pub async fn start(&self) {
        self.migrate_files().await;
        self.reconcile().await;
    }

    /// Writes each `__transforms/<name>.json` of an earlier weir into the metadata (unless
    /// the metadata has that name already) and removes the file once it is there.
    async fn migrate_files(&self) {
        let mut files: Vec<PathBuf> = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect(),
            Err(e) => {
                tracing::error!(dir = %self.dir.display(), error = %e, "cannot list transform deployments");
                Vec::new()
            }
        };
        files.sort();
        for path in files {
            let spec = std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| TransformSpec::from_json(&b));
            let spec = match spec {
                Ok(spec) => spec,
                Err(e) => {
                    tracing::error!(file = %path.display(), error = %e, "transform deployment file skipped");
                    continue;
                }
            };
            let known = self
                .ctx
                .metadata
                .image()
                .transforms()
                .contains_key(&spec.name);
            if !known {
                if let Err(e) = self.persist(&spec).await {
                    tracing::error!(file = %path.display(), error = %e, "transform deployment not moved into the cluster metadata (kept; retried at the next start)");
                    continue;
                }
                tracing::info!(transform = %spec.name, file = %path.display(), "transform deployment moved into the cluster metadata");
            }
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(file = %path.display(), error = %e, "cannot remove a moved transform deployment file");
            }
        }
    }

    /// Whether this broker runs async deployments now: it is the connect leader. While no
    /// broker is (an election in progress), the last answer holds, so a deployment does
    /// not stop and start again for a moment without a leader.
    fn leads_async(&self) -> bool {
        let image = self.ctx.metadata.image();
        let mut since = self.leads_since.lock().unwrap_or_else(|e| e.into_inner());
        crate::connect::leader::leads_after_grace(&image, &mut since)
            .unwrap_or_else(|| self.runs_async.load(Ordering::SeqCst))
    }

    /// Before an async runner starts: on the connect leader, waits until it has led for
    /// [`crate::connect::leader::TAKEOVER_GRACE_MS`] (polled; at most that plus
    /// [`RECONCILE_INTERVAL_MS`]). The
    /// admin API reaches this broker as soon as it leads; a runner started then was
    /// stopped by the next reconcile until the grace ended, and started again from the
    /// committed progress, copying what it had read since. Elsewhere (leadership moved
    /// meanwhile), no wait: reconcile stops it here and the leader runs it.
    async fn await_takeover_grace(&self) {
        let grace = Duration::from_millis(
            crate::connect::leader::TAKEOVER_GRACE_MS + RECONCILE_INTERVAL_MS,
        );
        let deadline = std::time::Instant::now() + grace;
        while !self.leads_async() && std::time::Instant::now() < deadline {
            let image = self.ctx.metadata.image();
            if crate::connect::leader::connect_leader(&image) != Some(image.node_id()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(GRACE_POLL_MS)).await;
        }
    }

    /// Brings this broker's deployments in line with the metadata and with where async
    /// deployments run (see the module docs): deploys what the metadata has and this
    /// broker should run, replaces what changed, stops what was deleted or moved away, and
    /// (re-)applies `transform.config.dir` when this broker starts running async ones.
    async fn reconcile(&self) {
        // Under the lock, with the image and the leadership read after taking it: a
        // deploy or delete through the API changes the metadata (and may wait out the
        // takeover grace) under this lock too, so the two never cross.
        let mut deployments = self.deployments.lock().await;
        let runs_async = self.leads_async();
        let gained = runs_async && !self.runs_async.swap(runs_async, Ordering::SeqCst);
        if !runs_async {
            self.runs_async.store(false, Ordering::SeqCst);
        }
        let image = self.ctx.metadata.image();
        let mut wanted: BTreeMap<String, TransformSpec> = BTreeMap::new();
        for (name, json) in image.transforms() {
            match TransformSpec::from_json(json.as_bytes()) {
                Ok(spec) => {
                    if spec.mode == Mode::Inline || runs_async {
                        wanted.insert(name.clone(), spec);
                    }
                }
                Err(e) => {
                    let mut logged = self.unparsable.lock().unwrap_or_else(|e| e.into_inner());
                    if logged.insert((name.clone(), json.clone())) {
                        tracing::error!(transform = %name, error = %e, "transform deployment in the metadata does not parse; not deployed here");
                    }
                }
            }
        }
        let gone: Vec<String> = deployments
            .iter()
            .filter(|(name, d)| match d.source {
                Source::Api => !wanted.contains_key(*name),
                Source::File(_) => d.d.spec.mode == Mode::Async && !runs_async,
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            if let Some(old) = deployments.remove(&name) {
                self.stop(old, false).await;
                if image.transforms().contains_key(&name) {
                    tracing::info!(
                        transform = %name,
                        connect_leader = ?crate::connect::leader::connect_leader(&image),
                        "transform stopped here: async deployments run on the connect leader"
                    );
                } else {
                    tracing::info!(transform = %name, "transform stopped here: deleted");
                }
            }
        }
        for (name, spec) in wanted {
            let current = deployments
                .get(&name)
                .map(|d| (d.source.clone(), d.d.spec == spec));
            match current {
                Some((Source::Api, true)) | Some((Source::File(_), _)) => {}
                _ => {
                    self.restore_locked(&mut deployments, spec, Source::Api)
                        .await
                }
            }
        }
        drop(deployments);
        // At start, and when async deployments come here: files are this broker's own,
        // and an async one in them runs only where async deployments run.
        if !self.config_dir_applied.swap(true, Ordering::SeqCst) || gained {
            self.apply_config_dir().await;
        }
    }

    /// Applies every file of `transform.config.dir` (and watches it).
    async fn apply_config_dir(&self) {
        if let Some(dir) = self.config_dir.clone() {
            self.watch_dir(&dir);
            let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
                .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
                .unwrap_or_default();
            files.sort();
            for path in files {
                if is_toml(&path) {
                    self.apply_file(&path).await;
                }
            }
        }
    }

    /// Deploys (or redeploys) a spec from the metadata, with the deployments locked by
    /// the caller; one that fails to load is kept as FAILED in place of what ran before.
    async fn restore_locked(
        &self,
        deployments: &mut BTreeMap<String, Deployed>,
        spec: TransformSpec,
        source: Source,
    ) {
        let name = spec.name.clone();
        match self
            .deploy_locked(
                deployments,
                spec.clone(),
                Replace::Yes,
                source.clone(),
                false,
            )
            .await
        {
            Ok(_) => tracing::info!(transform = %name, "transform deployment restored"),
            Err(e) => {
                tracing::error!(transform = %name, error = %e, "transform deployment not running");
                if let Some(dir) = spec.wasm.parent() {
                    self.watch_dir(dir);
                }
                let d = Arc::new(Deployment::new(
                    spec,
                    String::new(),
                    Arc::new(Stats::default()),
                ));
                d.set_failed(format!("cannot load: {e}"));
                if let Some(old) = deployments.remove(&name) {
                    self.stop(old, false).await;
                }
                deployments.insert(
                    name,
                    Deployed {
                        d,
                        source,
                        runner: None,
                    },
                );
            }
        }
    }

    /// `POST /transforms`: a new deployment.
    ///
    /// Errors: [`DeployError::Invalid`] (bad spec, a cycle of deployments it would close,
    /// or the component does not load: not a component, wrong world, missing import,
    /// `open` refused the config),
    /// [`DeployError::Conflict`] (name taken, or the input topic already has an inline
    /// transform), [`DeployError::Io`] (cannot persist).
    pub async fn create(&self, spec: TransformSpec) -> Result<TransformStatus, DeployError> {
        self.deploy_from(spec, Replace::No, Source::Api, true).await
    }

    /// `PUT /transforms/{name}`: creates or replaces (redeploys) a deployment. A replaced
    /// async deployment resumes from its committed progress. Returns the status and
    /// whether it was created.
    ///
    /// Errors: as [`TransformManager::create`]; [`DeployError::Conflict`] for a deployment
    /// defined by a `transform.config.dir` file.
    pub async fn replace(
        &self,
        spec: TransformSpec,
    ) -> Result<(TransformStatus, bool), DeployError> {
        let existed = self.deployments.lock().await.contains_key(&spec.name);
        let status = self
            .deploy_from(spec, Replace::Yes, Source::Api, true)
            .await?;
        Ok((status, !existed))
    }

    async fn deploy_from(
        &self,
        spec: TransformSpec,
        replace: Replace,
        source: Source,
        persist: bool,
    ) -> Result<TransformStatus, DeployError> {
        let mut deployments = self.deployments.lock().await;
        self.deploy_locked(&mut deployments, spec, replace, source, persist)
            .await
    }

    /// [`TransformManager::deploy_from`] with the deployments locked by the caller.
    async fn deploy_locked(
        &self,
        deployments: &mut BTreeMap<String, Deployed>,
        spec: TransformSpec,
        replace: Replace,
        source: Source,
        persist: bool,
    ) -> Result<TransformStatus, DeployError> {
        spec.validate().map_err(DeployError::Invalid)?;
        if let Some(old) = deployments.get(&spec.name) {
            if replace == Replace::No {
                return Err(DeployError::Conflict(format!(
                    "transform {} already exists: to replace it, deploy again with \
                     `weir transform deploy --replace` (PUT /transforms/{})",
                    spec.name, spec.name
                )));
            }
            if old.source != source {
                return Err(DeployError::Conflict(match &old.source {
                    Source::File(f) => format!(
                        "transform {} is defined by {}: edit or remove that file",
                        spec.name,
                        f.display()
                    ),
                    Source::Api => format!(
                        "transform {} was deployed through the admin API, not by a file",
                        spec.name
                    ),
                }));
            }
        }
        if spec.mode == Mode::Inline {
            if let Some((other, _)) = deployments.iter().find(|(n, o)| {
                **n != spec.name && o.d.spec.mode == Mode::Inline && o.d.spec.input == spec.input
            }) {
                return Err(DeployError::Conflict(format!(
                    "topic {} already has the inline transform {other}",
                    spec.input
                )));
            }
        }
        let others = deployments
            .iter()
            .filter(|(n, _)| **n != spec.name)
            .map(|(_, o)| &o.d.spec);
        if let Some(cycle) = closed_cycle(&spec, others) {
            return Err(DeployError::Invalid(cycle));
        }
        let loaded = self.load(&spec).await.map_err(DeployError::Invalid)?;
        if persist && source == Source::Api {
            self.persist(&spec).await.map_err(DeployError::Io)?;
        }
        if let Some(old) = deployments.remove(&spec.name) {
            self.stop(old, false).await;
        }
        if let Some(dir) = spec.wasm.parent() {
            self.watch_dir(dir);
        }
        let d = Arc::new(Deployment::new(
            spec.clone(),
            loaded.version.clone(),
            Arc::new(Stats::default()),
        ));
        if spec.mode == Mode::Async {
            self.await_takeover_grace().await;
        }
        let runner = self.launch(&d, loaded);
        tracing::info!(transform = %spec.name, mode = spec.mode.name(), input = %spec.input, version = %short(&d.live().version), "transform deployed");
        let status = self.status_of(&d, &source);
        deployments.insert(
            spec.name.clone(),
            Deployed {
                d: d.clone(),
                source,
                runner,
            },
        );
        Ok(status)
    }

    /// Starts an async runner, or installs the inline slot.
    ///
    /// A runner gets a thread of its own (with a current-thread Tokio runtime), not a task
    /// on the broker's runtime: a guest call runs until its deadline without yielding, and
    /// a spinning component must not hold one of the threads that serve Kafka clients.
    fn launch(&self, d: &Arc<Deployment>, loaded: Loaded) -> Option<RunnerHandle> {
        match d.spec.mode {
            Mode::Async => {
                let (tx, rx) = watch::channel(false);
                let runner = Runner::new(
                    d.clone(),
                    self.ctx.clone(),
                    self.ingest.clone(),
                    loaded.transform,
                    loaded.version,
                    rx,
                );
                let failed = d.clone();
                let thread = std::thread::Builder::new()
                    .name(format!("weir-transform-{}", d.spec.name))
                    .spawn(move || {
                        match tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                        {
                            Ok(rt) => rt.block_on(runner.run()),
                            Err(e) => failed.set_failed(format!("cannot start a runtime: {e}")),
                        }
                    });
                match thread {
                    Ok(thread) => Some(RunnerHandle { stop: tx, thread }),
                    Err(e) => {
                        d.set_failed(format!("cannot start a thread: {e}"));
                        None
                    }
                }
            }
            Mode::Inline => {
                self.install_inline(d, loaded);
                None
            }
        }
    }

    fn install_inline(&self, d: &Arc<Deployment>, loaded: Loaded) {
        let slot = InlineSlot {
            name: d.spec.name.clone(),
            version: loaded.version,
            transform: tokio::sync::Mutex::new(loaded.transform),
            tolerance: d.spec.tolerance,
            dlq_topic: d.spec.dlq_topic.clone(),
            stats: d.stats.clone(),
        };
        self.inline.set(&d.spec.input, Arc::new(slot));
    }

    /// Stops a deployment's runner (waiting for its current chunk) or removes its inline
    /// slot; with `forget`, also its progress.
    async fn stop(&self, old: Deployed, forget: bool) {
        if let Some(runner) = old.runner {
            let _ = runner.stop.send(true);
            let joined = tokio::task::spawn_blocking(move || runner.thread.join()).await;
            if !matches!(joined, Ok(Ok(()))) {
                tracing::error!(transform = %old.d.spec.name, "transform thread ended abnormally");
            }
        }
        if old.d.spec.mode == Mode::Inline {
            if let Some(slot) = self.inline.remove(&old.d.spec.input) {
                if slot.name != old.d.spec.name {
                    // Not ours (cannot happen: one inline deployment per topic); put it back.
                    self.inline.set(&old.d.spec.input, slot);
                }
            }
        }
        if forget {
            let group = old.d.spec.group_id();
            if self.ctx.groups.describe(&group).is_some() {
                if let Some(e) = self.ctx.groups.delete_group(&group) {
                    tracing::debug!(group = %group, error = ?e, "transform progress not deleted");
                }
            }
        }
    }

    /// `DELETE /transforms/{name}`.
    ///
    /// Errors: [`DeployError::NotFound`]; [`DeployError::Conflict`] for a deployment
    /// defined by a `transform.config.dir` file (remove the file instead).
    pub async fn delete(&self, name: &str) -> Result<(), DeployError> {
        let mut deployments = self.deployments.lock().await;
        match deployments.get(name).map(|d| d.source.clone()) {
            None => return Err(DeployError::NotFound(format!("no transform named {name}"))),
            Some(Source::File(f)) => {
                return Err(DeployError::Conflict(format!(
                    "transform {name} is defined by {}: remove that file to delete it",
                    f.display()
                )))
            }
            Some(Source::Api) => {}
        }
        self.unpersist(name).await.map_err(DeployError::Io)?;
        if let Some(old) = deployments.remove(name) {
            self.stop(old, true).await;
        }
        tracing::info!(transform = %name, "transform deleted");
        Ok(())
    }

    /// `GET /transforms`: every deployment, by name.
    pub async fn list(&self) -> Vec<TransformStatus> {
        let deployments = self.deployments.lock().await;
        deployments
            .values()
            .map(|d| self.status_of(&d.d, &d.source))
            .collect()
    }

    /// `GET /transforms/{name}`.
    pub async fn get(&self, name: &str) -> Option<TransformStatus> {
        let deployments = self.deployments.lock().await;
        deployments
            .get(name)
            .map(|d| self.status_of(&d.d, &d.source))
    }

    /// Stops every runner (broker shutdown), waiting for each current chunk.
    pub async fn shutdown(&self) {
        let mut deployments = self.deployments.lock().await;
        // Every runner told first, so their current chunks end together, not in turn.
        for d in deployments.values() {
            if let Some(runner) = &d.runner {
                let _ = runner.stop.send(true);
            }
        }
        for (_, d) in std::mem::take(&mut *deployments) {
            self.stop(d, false).await;
        }
        *self.watcher.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Hot reload until `shutdown` becomes true, then stops every runner.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(Duration::from_millis(RECONCILE_INTERVAL_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.changes.signal.notified() => {}
                _ = tick.tick() => {
                    self.reconcile().await;
                    continue;
                }
                r = shutdown.changed() => {
                    if r.is_err() || *shutdown.borrow() { break; }
                    continue;
                }
            }
            // The paths have settled already (the debouncer reports a path once it has
            // been quiet for DEBOUNCE_MS).
            let paths =
                std::mem::take(&mut *self.changes.paths.lock().unwrap_or_else(|e| e.into_inner()));
            for path in paths {
                if self.is_config_file(&path) {
                    self.apply_file(&path).await;
                } else {
                    self.reload_path(&path).await;
                }
            }
        }
        self.shutdown().await;
    }

    fn is_config_file(&self, path: &Path) -> bool {
        is_toml(path)
            && self
                .config_dir
                .as_deref()
                .is_some_and(|d| path.parent() == Some(d))
    }

    /// Re-applies a `transform.config.dir` file: deploys or replaces what it defines, or
    /// deletes the deployment it defined when it is gone. Problems are logged.
    async fn apply_file(&self, path: &Path) {
        let source = Source::File(path.to_path_buf());
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut deployments = self.deployments.lock().await;
                let gone: Vec<String> = deployments
                    .iter()
                    .filter(|(_, d)| d.source == source)
                    .map(|(n, _)| n.clone())
                    .collect();
                for name in gone {
                    if let Some(old) = deployments.remove(&name) {
                        self.stop(old, true).await;
                        tracing::info!(transform = %name, file = %path.display(), "transform deleted (its file was removed)");
                    }
                }
                return;
            }
            Err(e) => {
                tracing::error!(file = %path.display(), error = %e, "cannot read transform file");
                return;
            }
        };
        let mut spec = match TransformSpec::from_toml(&text) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(file = %path.display(), error = %e, "transform file skipped");
                return;
            }
        };
        if spec.wasm.is_relative() {
            if let Some(dir) = path.parent() {
                // Relative to the file; absolute even when transform.config.dir is relative.
                let joined = dir.join(&spec.wasm);
                spec.wasm = std::path::absolute(&joined).unwrap_or(joined);
            }
        }
        if spec.mode == Mode::Async && !self.runs_async.load(Ordering::SeqCst) {
            // Runs where async deployments run; applied again when they come here.
            let mut deployments = self.deployments.lock().await;
            if deployments
                .get(&spec.name)
                .is_some_and(|d| d.source == source)
            {
                if let Some(old) = deployments.remove(&spec.name) {
                    self.stop(old, false).await;
                }
            }
            tracing::debug!(transform = %spec.name, file = %path.display(), "async transform file: runs on the connect leader");
            return;
        }
        {
            let deployments = self.deployments.lock().await;
            if let Some(d) = deployments.get(&spec.name) {
                if d.source == source && d.d.spec == spec && d.d.live().state == RunState::Running {
                    return; // unchanged (a component change is a reload, not a redeploy)
                }
            }
        }
        let name = spec.name.clone();
        match self.deploy_from(spec, Replace::Yes, source, false).await {
            Ok(_) => {}
            Err(e) => {
                tracing::error!(file = %path.display(), transform = %name, error = %e, "transform file not deployed")
            }
        }
    }

    /// Reloads every deployment whose component is `path`.
    async fn reload_path(&self, path: &Path) {
        let targets: Vec<Arc<Deployment>> = {
            let deployments = self.deployments.lock().await;
            deployments
                .values()
                .filter(|d| d.d.spec.wasm == path)
                .map(|d| d.d.clone())
                .collect()
        };
        for d in targets {
            self.reload(d).await;
        }
    }

    /// Loads the current bytes of `d`'s component and swaps it in (see the module docs).
    async fn reload(&self, d: Arc<Deployment>) {
        let name = d.spec.name.clone();
        let mut last_error = String::new();
        let mut last_bytes: Option<Vec<u8>> = None;
        for _ in 0..RELOAD_MAX_ATTEMPTS {
            let bytes = match std::fs::read(&d.spec.wasm) {
                Ok(b) => b,
                Err(e) => {
                    last_error = format!("cannot read {}: {e}", d.spec.wasm.display());
                    tokio::time::sleep(Duration::from_millis(RELOAD_SETTLE_MS)).await;
                    continue;
                }
            };
            let version = sha256_hex(&bytes);
            {
                let live = d.live();
                if live.version == version && live.state == RunState::Running {
                    return; // the same component (a touch, or our own earlier reload)
                }
            }
            if last_bytes.as_deref() == Some(&bytes[..]) {
                break; // stable and still failing
            }
            match self.load_bytes(&d.spec, &bytes, version).await {
                Ok(loaded) => {
                    self.swap(&d, loaded).await;
                    return;
                }
                Err(e) => {
                    last_error = e;
                    last_bytes = Some(bytes);
                    tokio::time::sleep(Duration::from_millis(RELOAD_SETTLE_MS)).await;
                }
            }
        }
        tracing::error!(transform = %name, error = %last_error, "hot reload refused; the previous version keeps running");
        d.live().reload_error = Some(last_error);
    }

    /// Puts a reloaded component in place, if `d` is still the deployment of its name.
    async fn swap(&self, d: &Arc<Deployment>, loaded: Loaded) {
        let mut deployments = self.deployments.lock().await;
        let Some(current) = deployments.get_mut(&d.spec.name) else {
            return;
        };
        if !Arc::ptr_eq(&current.d, d) {
            return; // replaced or deleted meanwhile
        }
        let version = loaded.version.clone();
        match d.spec.mode {
            Mode::Inline => {
                self.install_inline(d, loaded);
                let mut live = d.live();
                live.version = version.clone();
                live.reload_error = None;
                live.state = RunState::Running;
                live.error = None;
            }
            Mode::Async => {
                let stopped = current
                    .runner
                    .as_ref()
                    .is_none_or(|r| r.thread.is_finished());
                if stopped {
                    // FAILED: a new version restarts it from its committed progress.
                    {
                        let mut live = d.live();
                        live.version = version.clone();
                        live.reload_error = None;
                        live.state = RunState::Running;
                        live.error = None;
                    }
                    current.runner = self.launch(d, loaded);
                } else {
                    d.set_pending(loaded);
                }
            }
        }
        tracing::info!(transform = %d.spec.name, version = %short(&version), "transform component reloaded");
    }

    /// Reads, hashes and loads `spec`'s component.
    async fn load(&self, spec: &TransformSpec) -> Result<Loaded, String> {
        let bytes = std::fs::read(&spec.wasm)
            .map_err(|e| format!("cannot read wasm {}: {e}", spec.wasm.display()))?;
        let version = sha256_hex(&bytes);
        self.load_bytes(spec, &bytes, version).await
    }

    async fn load_bytes(
        &self,
        spec: &TransformSpec,
        bytes: &[u8],
        version: String,
    ) -> Result<Loaded, String> {
        let name = spec
            .wasm
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| spec.wasm.display().to_string());
        let transform = self
            .plugins
            .load_transform_bytes(&name, bytes, &spec.config_pairs())
            .await
            .map_err(|e| e.to_string())?;
        Ok(Loaded { transform, version })
    }

    /// Writes `spec` to the cluster metadata (a [`MetadataRecord::TransformDeployed`]);
    /// returns once every live broker has it (`Metadata::update`).
    async fn persist(&self, spec: &TransformSpec) -> Result<(), String> {
        let json = serde_json::to_string(spec).map_err(|e| e.to_string())?;
        let name = spec.name.clone();
        self.change_metadata(MetadataRecord::TransformDeployed { name, spec: json })
            .await
    }

    /// Deletes `name` from the cluster metadata (a [`MetadataRecord::TransformDeleted`]),
    /// when the metadata has it.
    async fn unpersist(&self, name: &str) -> Result<(), String> {
        if !self.ctx.metadata.image().transforms().contains_key(name) {
            return Ok(());
        }
        self.change_metadata(MetadataRecord::TransformDeleted {
            name: name.to_string(),
        })
        .await
    }

    /// Commits `record` through the controller quorum (off the async threads: the change
    /// waits for the quorum and for the other brokers to apply it).
    async fn change_metadata(&self, record: MetadataRecord) -> Result<(), String> {
        let metadata = self.ctx.metadata.clone();
        tokio::task::spawn_blocking(move || {
            metadata
                .update(|_| Ok::<_, std::convert::Infallible>(vec![record]))
                .map(|_| ())
                .map_err(|e| format!("cannot write the deployment to the cluster metadata: {e}"))
        })
        .await
        .map_err(|e| format!("cannot write the deployment to the cluster metadata: {e}"))?
    }

    /// Starts watching `dir` (once).
    fn watch_dir(&self, dir: &Path) {
        let mut watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        if watched.contains(dir) {
            return;
        }
        let mut watcher = self.watcher.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = watcher.as_mut() {
            match w.watcher().watch(dir, notify::RecursiveMode::NonRecursive) {
                Ok(()) => {
                    watched.insert(dir.to_path_buf());
                }
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot watch for hot reload")
                }
            }
        }
    }

    fn status_of(&self, d: &Deployment, source: &Source) -> TransformStatus {
        let live = d.live().clone();
        let spec = &d.spec;
        let input_lag = match spec.mode {
            Mode::Inline => None,
            Mode::Async => Some(self.lag(spec)),
        };
        TransformStatus {
            name: spec.name.clone(),
            mode: spec.mode,
            input: spec.input.clone(),
            outputs: spec.outputs.clone(),
            wasm: spec.wasm.clone(),
            config: spec.config.clone(),
            tolerance: spec.tolerance,
            guarantee: spec.guarantee,
            dlq_topic: spec.dlq_topic.clone(),
            version: live.version,
            state: live.state,
            error: live.error,
            reload_error: live.reload_error,
            input_lag,
            records_in: d.stats.records_in.load(Ordering::Relaxed),
            records_out: d.stats.records_out.load(Ordering::Relaxed),
            errors: d.stats.errors.load(Ordering::Relaxed),
            mean_ns_per_record: d.stats.mean_ns_per_record(),
            source_file: match source {
                Source::Api => None,
                Source::File(f) => Some(f.clone()),
            },
            broker_id: self.ctx.metadata.node_id(),
        }
    }

    /// Σ over input partitions of log end offset − committed progress (log start when
    /// nothing is committed).
    fn lag(&self, spec: &TransformSpec) -> i64 {
        let Some(meta) = self.ctx.metadata.topic(&spec.input) else {
            return 0;
        };
        let parts: Vec<i32> = (0..meta.partitions).collect();
        let fetched = self.ctx.groups.fetch_offsets(
            &spec.group_id(),
            Some(&[(spec.input.clone(), parts.clone())]),
        );
        let committed: BTreeMap<i32, i64> = fetched
            .into_iter()
            .flat_map(|(_, ps)| ps)
            .filter_map(|(p, c)| c.map(|c| (p, c.offset)))
            .collect();
        parts
            .iter()
            .filter_map(|&p| {
                let partition = self.ctx.replicas.partition(&spec.input, p)?;
                let offsets = partition.offsets();
                let (start, end) = (offsets.log_start_offset, offsets.high_watermark);
                let at = committed.get(&p).copied().unwrap_or(start).max(start);
                Some((end - at).max(0))
            })
            .sum()
    }
}

/// Whether a deploy may replace an existing deployment of the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replace {
    No,
    Yes,
}

fn is_toml(path: &Path) -> bool {
    path.extension().is_some_and(|x| x == "toml")
}

/// sha256 of `bytes`, lowercase hex (a deployment's version).
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = sha2::Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, input: &str, outputs: &[&str]) -> TransformSpec {
        TransformSpec {
            name: name.into(),
            wasm: "/p/t.wasm".into(),
            input: input.into(),
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            config: BTreeMap::new(),
            mode: Mode::Async,
            tolerance: Tolerance::default(),
            dlq_topic: None,
            guarantee: Default::default(),
        }
    }

    #[test]
    fn a_deployment_closing_a_cycle_is_named_with_the_way_round() {
        let t1 = spec("t1", "a", &["b"]);
        let t2 = spec("t2", "b", &["x", "a"]);
        assert_eq!(
            closed_cycle(&t2, [&t1].into_iter()).as_deref(),
            Some(
                "outputs: b -> a closes the cycle b -> a -> b (transforms t2, t1): \
                 a record would loop forever"
            )
        );
        // Three hops, found whatever the order of the outputs.
        let t3 = spec("t3", "c", &["z", "a"]);
        let t2 = spec("t2", "b", &["c"]);
        assert_eq!(
            closed_cycle(&t3, [&t1, &t2].into_iter()).as_deref(),
            Some(
                "outputs: c -> a closes the cycle c -> a -> b -> c (transforms t3, t1, t2): \
                 a record would loop forever"
            )
        );
        // A chain, a diamond and an inline deployment close nothing.
        let chain = spec("t2", "b", &["c"]);
        assert_eq!(closed_cycle(&chain, [&t1].into_iter()), None);
        let diamond = spec("d", "a", &["c"]);
        assert_eq!(closed_cycle(&diamond, [&t1, &chain].into_iter()), None);
        let mut inline = spec("i", "b", &["a"]);
        inline.mode = Mode::Inline;
        assert_eq!(closed_cycle(&inline, [&t1].into_iter()), None);
        assert!(closed_cycle(&t1, [&inline].into_iter()).is_none());
    }
}
