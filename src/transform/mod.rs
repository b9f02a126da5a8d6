//! Transform deployments: a `transform` component attached to an input topic.
//!
//! Owns: deployment specs ([`spec`]) and their persistence (records of the cluster
//! metadata, plus `transform.config.dir/*.toml`), the [`TransformManager`] (deploy,
//! replace, delete, status, restore at start, hot reload with `notify`, and on a cluster
//! where each deployment runs: inline on every broker, async on the connect leader), and
//! the `async` runtime ([`runner`]: input read from this broker's replicas or the
//! partitions' leaders, outputs through [`crate::ingest::Ingest`], progress as the group
//! `transform-<name>`'s committed offsets at its coordinator, the dead-letter topic). `inline` mode rewrites produced batches before they
//! are appended: this module only installs its [`inline::InlineSlot`]; `protocol::produce`
//! applies it.
//!
//! Never does: touch wasmtime (the plugin host does), decode Kafka requests, import the
//! protocol layer (what it calls comes in [`Owners`] and [`crate::ingest::Ingest`]).

pub mod apply;
pub mod inline;
mod manager;
pub mod runner;
pub mod spec;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

pub use manager::{sha256_hex, DeployError, TransformManager, TransformStatus};
pub use spec::{Guarantee, Mode, TransformSpec};

use crate::cluster::Metadata;
use crate::config::BrokerConfig;
use crate::group::GroupCoordinator;
use crate::plugin::Transform;
use crate::replica::ReplicaManager;

/// The broker's owners transforms call, handed over by the composition root (`broker`):
/// async runners read their input from the replica manager and keep their progress as a
/// consumer group's committed offsets; outputs go through `ingest`, given separately.
/// Cheap to clone (five `Arc`s).
#[derive(Debug, Clone)]
pub struct Owners {
    /// Broker configuration (`log.dirs` for an earlier weir's `__transforms/`,
    /// `transform.config.dir`).
    pub config: Arc<BrokerConfig>,
    /// Cluster metadata: the input topic's partitions.
    pub metadata: Arc<Metadata>,
    /// Hosted partitions: the input's logs.
    pub replicas: Arc<ReplicaManager>,
    /// Consumer groups: progress as `transform-<name>`'s committed offsets.
    pub groups: Arc<GroupCoordinator>,
    /// The transaction coordinator: `processing.guarantee=exactly_once` deployments.
    pub txn: Arc<crate::txn::TransactionCoordinator>,
}

/// `errors.tolerance` (Kafka Connect's key and values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tolerance {
    /// `none` (default): the first failing record stops the transform (FAILED).
    #[default]
    None,
    /// `all`: failing records go to the dead-letter topic, the rest flow on.
    All,
}

/// A deployment's counters (shown by `weir transform list`). Relaxed atomics: figures,
/// not synchronisation.
#[derive(Debug, Default)]
pub struct Stats {
    /// Records given to the transform.
    pub records_in: AtomicU64,
    /// Records it emitted (and that were written).
    pub records_out: AtomicU64,
    /// Records that failed (sent to the dead-letter topic or refused).
    pub errors: AtomicU64,
    /// Nanoseconds spent in transform calls.
    pub busy_ns: AtomicU64,
}

impl Stats {
    /// Adds one call's figures.
    pub fn record_call(&self, records_in: u64, records_out: u64, busy_ns: u64) {
        self.records_in.fetch_add(records_in, Ordering::Relaxed);
        self.records_out.fetch_add(records_out, Ordering::Relaxed);
        self.busy_ns.fetch_add(busy_ns, Ordering::Relaxed);
    }

    /// Mean nanoseconds per input record (0 before the first record).
    pub fn mean_ns_per_record(&self) -> u64 {
        let n = self.records_in.load(Ordering::Relaxed);
        self.busy_ns
            .load(Ordering::Relaxed)
            .checked_div(n)
            .unwrap_or(0)
    }
}

/// A deployment's state as `GET /transforms` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum RunState {
    /// Transforming (or waiting for records).
    Running,
    /// Stopped by an error (`errors.tolerance=none`, or the component could not be loaded
    /// at start); `error` says why. A redeploy or a reloaded component restarts it.
    Failed,
}

/// What changes while a deployment lives.
#[derive(Debug, Clone)]
pub(crate) struct LiveStatus {
    /// sha256 (hex) of the component in use (or, when FAILED at load, of nothing: "").
    pub(crate) version: String,
    pub(crate) state: RunState,
    /// Why it FAILED.
    pub(crate) error: Option<String>,
    /// Why the last hot reload was refused (the old version keeps running).
    pub(crate) reload_error: Option<String>,
}

/// A component loaded for a deployment, with its version.
pub(crate) struct Loaded {
    pub(crate) transform: Transform,
    pub(crate) version: String,
}

/// One deployment as its runner, the manager and the status reader share it.
pub(crate) struct Deployment {
    pub(crate) spec: TransformSpec,
    pub(crate) stats: Arc<Stats>,
    live: Mutex<LiveStatus>,
    /// A reloaded component waiting to be swapped in between batches (async mode).
    pending: Mutex<Option<Loaded>>,
    /// Wakes the runner (a reload is pending).
    pub(crate) wake: tokio::sync::Notify,
}

impl std::fmt::Debug for Deployment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deployment")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl Deployment {
    pub(crate) fn new(spec: TransformSpec, version: String, stats: Arc<Stats>) -> Deployment {
        Deployment {
            spec,
            stats,
            live: Mutex::new(LiveStatus {
                version,
                state: RunState::Running,
                error: None,
                reload_error: None,
            }),
            pending: Mutex::new(None),
            wake: tokio::sync::Notify::new(),
        }
    }

    /// The live status, locked (a `std` mutex: never held across `.await`).
    pub(crate) fn live(&self) -> MutexGuard<'_, LiveStatus> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `loaded` for the runner and shows its version.
    /// Queued before the version shows, so a record appended after a reader sees the new
    /// version is transformed by it.
    pub(crate) fn set_pending(&self, loaded: Loaded) {
        let version = loaded.version.clone();
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = Some(loaded);
        {
            let mut live = self.live();
            live.version = version;
            live.reload_error = None;
        }
        self.wake.notify_one();
    }

    /// The component waiting to be swapped in, if any.
    pub(crate) fn take_pending(&self) -> Option<Loaded> {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}
