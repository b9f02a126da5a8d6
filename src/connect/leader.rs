//! Where the connect runtime runs on a cluster: on exactly one broker, the **connect
//! leader** — the leader of `__connect_configs` partition 0 (before that topic exists,
//! the live broker with the lowest id). Every broker computes it from its metadata image,
//! so all agree once they have applied the same records, and it moves when the
//! partition's leadership moves: when the broker is fenced, killed, shut down, or a
//! preferred-leader election hands it back.
//!
//! Why one broker and that one: the runtime's state (configs, target states, statuses,
//! source offsets, connector state) is in its compacted topics, which it replays at start
//! and then owns in memory; one writer at a time keeps that state consistent without a
//! Kafka Connect-style group protocol, and the leader of `__connect_configs` holds every
//! committed config in its own log. Its writes to the other connect topics and to users'
//! topics are forwarded to their leaders when another broker leads them
//! (`InternalTopic::forwarding`, `Ingest`).
//!
//! [`run`] starts a [`ConnectRuntime`] when this broker has been the connect leader for
//! [`TAKEOVER_GRACE_MS`] (at once when it is the only broker) and
//! stops it gracefully (sources store their offsets, sinks flush and commit) when it
//! stops being it, then waits to lead again. A single node is always its own connect
//! leader. The REST API of a broker that is not the connect leader forwards each request
//! to the leader's admin listener (`admin::connect::forward`), found through the
//! [`ADMIN_ENDPOINT`] endpoint of its registration.
//!
//! Never does: run a connector while another broker's image names that broker the
//! connect leader (a broker cut off from the quorum keeps its last image, and may run
//! until its writes fail: Kafka Connect's zombie worker, at least once as everywhere else
//! in the runtime).

use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::watch;

use super::{configs, ConnectRuntime, ConnectSettings, Owners};
use crate::cluster::brokers::stopped_within;
use crate::cluster::{Metadata, MetadataImage};
use crate::ingest::Ingest;
use crate::plugin::PluginHost;

/// The listener name a broker registers its admin HTTP listener under (not a Kafka
/// listener: clients never see it; brokers forward connect REST requests to it).
pub(crate) const ADMIN_ENDPOINT: &str = "WEIR_ADMIN";

/// How often the connect leader is looked at again.
const LEADERSHIP_CHECK_INTERVAL: Duration = Duration::from_millis(200);

/// How long (ms) a broker that became the connect leader waits before it runs connectors
/// and async transforms, on a cluster of more than one broker: the broker that ran them
/// stops them within a leadership check once its image shows the change, so the two do
/// not run them at once when leadership moves while both are up (a broker fenced for a
/// moment under load, a lower id registering on a fresh cluster, a controlled
/// shutdown). A broker cut off keeps running until its writes fail: at least once.
pub(crate) const TAKEOVER_GRACE_MS: u64 = 2_000;

/// Whether this broker is the connect leader in `image` and has been for
/// [`TAKEOVER_GRACE_MS`] (`since`: when it last became it, kept by the caller; reset when
/// it is not). Alone in the cluster, at once.
pub(crate) fn leads_after_grace(
    image: &MetadataImage,
    since: &mut Option<std::time::Instant>,
) -> Option<bool> {
    let leads = connect_leader(image)? == image.node_id();
    if !leads {
        *since = None;
        return Some(false);
    }
    let alone = image.brokers().all(|b| b.broker_id == image.node_id());
    let since = since.get_or_insert_with(std::time::Instant::now);
    Some(alone || since.elapsed() >= Duration::from_millis(TAKEOVER_GRACE_MS))
}

/// Wait before starting again after a runtime that failed to start.
const START_RETRY_BACKOFF: Duration = Duration::from_secs(1);

/// The broker that runs the connect runtime in `image`: the leader of
/// `__connect_configs`-0, else (no such topic yet) the live broker with the lowest id.
/// `None` while the partition has no leader, or no broker is live.
pub(crate) fn connect_leader(image: &MetadataImage) -> Option<i32> {
    match image.topic(configs::CONFIGS_TOPIC) {
        Some(_) => image.leader_of(configs::CONFIGS_TOPIC, 0),
        None => crate::cluster::live_brokers(image).into_iter().min(),
    }
}

/// The running runtime, if this broker is the connect leader; shared with the admin API.
#[derive(Debug)]
pub(crate) struct ConnectHandle {
    metadata: Arc<Metadata>,
    current: RwLock<Option<ConnectRuntime>>,
}

/// Where a connect REST request is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Here: this broker is the connect leader (its runtime may still be starting).
    Here,
    /// On broker `.0`, whose admin API is at `.1` (`http://host:port`).
    Elsewhere(i32, String),
    /// Nowhere yet: no connect leader, or it registered no admin listener.
    Unknown(String),
}

impl ConnectHandle {
    /// No runtime yet: [`run`] starts one when this broker leads.
    pub(crate) fn new(metadata: Arc<Metadata>) -> Arc<ConnectHandle> {
        Arc::new(ConnectHandle {
            metadata,
            current: RwLock::new(None),
        })
    }

    /// The runtime, while this broker runs it.
    pub(crate) fn current(&self) -> Option<ConnectRuntime> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set(&self, runtime: Option<ConnectRuntime>) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = runtime;
    }

    /// Where a REST request is answered now.
    pub(crate) fn placement(&self) -> Placement {
        let image = self.metadata.image();
        let me = image.node_id();
        match connect_leader(&image) {
            Some(leader) if leader == me => Placement::Here,
            Some(leader) => {
                let endpoint = image
                    .broker(leader)
                    .and_then(|b| b.endpoints.iter().find(|e| e.name == ADMIN_ENDPOINT));
                match endpoint {
                    Some(e) => {
                        Placement::Elsewhere(leader, format!("http://{}:{}", e.host, e.port))
                    }
                    None => Placement::Unknown(format!(
                        "the connect leader, broker {leader}, has no admin listener"
                    )),
                }
            }
            None => Placement::Unknown(format!(
                "{} has no leader: no broker runs the connect runtime",
                configs::CONFIGS_TOPIC
            )),
        }
    }
}

/// Runs the connect runtime on this broker whenever it is the connect leader, until
/// `shutdown`; the runtime in hand is stopped gracefully (awaited) before this returns.
pub(crate) async fn run(
    handle: Arc<ConnectHandle>,
    settings: ConnectSettings,
    owners: Owners,
    ingest: Arc<Ingest>,
    plugins: Arc<PluginHost>,
    mut shutdown: watch::Receiver<bool>,
) {
    let metadata = owners.metadata.clone();
    let leads = || {
        let image = metadata.image();
        connect_leader(&image) == Some(image.node_id())
    };
    let mut since = None;
    let mut leads_after_grace =
        || leads_after_grace(&metadata.image(), &mut since).unwrap_or(false);
    loop {
        while !leads_after_grace() {
            if stopped_within(&mut shutdown, LEADERSHIP_CHECK_INTERVAL).await {
                return;
            }
        }
        let (stop, stopped) = watch::channel(false);
        let started = ConnectRuntime::start(
            settings.clone(),
            owners.clone(),
            ingest.clone(),
            plugins.clone(),
            stopped,
        )
        .await;
        let (runtime, runtime_run) = match started {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "the connect runtime cannot start; trying again");
                if stopped_within(&mut shutdown, START_RETRY_BACKOFF).await {
                    return;
                }
                continue;
            }
        };
        tracing::info!("this broker is the connect leader: connectors run here");
        handle.set(Some(runtime));
        let task = tokio::spawn(runtime_run);
        let ending = loop {
            if stopped_within(&mut shutdown, LEADERSHIP_CHECK_INTERVAL).await {
                break true;
            }
            if !leads() {
                break false;
            }
        };
        if !ending {
            tracing::info!(
                leader = ?connect_leader(&metadata.image()),
                "this broker is no longer the connect leader: stopping its connectors"
            );
        }
        handle.set(None);
        let _ = stop.send(true);
        if let Err(e) = task.await {
            tracing::error!(error = %e, "the connect runtime panicked");
        }
        if ending {
            return;
        }
    }
}
