//! The composition root: builds every owner from the configuration and wires them.
//!
//! `run(config, listeners, shutdown)` takes already-bound listeners, so tests bind port 0
//! and read the port back (mini-redis style). Start-up order: metadata (topics, ids) →
//! replica manager (opens and recovers every partition log) → purgatory → groups →
//! plugin host → ingest → transforms → connectors → protocol handler → server and admin
//! API; background tasks: group timers, transform hot reload, retention, producer id
//! expiry, the high watermark checkpoint, the metrics upkeep. Shutdown: stop accepting, let connections
//! end, stop background tasks, flush every log, checkpoint the high watermarks.
//!
//! Wiring: this is the only place that knows every owner. Each layer gets, at
//! construction, what it calls and nothing more: `topics::Topics` (config, metadata,
//! replicas) for topic changes, `ingest` over that, `transform::Owners` and
//! `connect::Owners` (plus `ingest` and the plugin host) for transforms and connectors,
//! `protocol::Context` for the request handlers, `admin::AdminState` for the HTTP API.
//! Nothing built later is set into something built earlier, so there is no reference
//! cycle: every task spawned here is awaited before `run` returns, and then every owner
//! is dropped, closing its files, before the log directory lock is released.

use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::admin::{self, AdminState};
use crate::cluster::{self, BrokerEndpoint, Metadata};
use crate::config::BrokerConfig;
use crate::connect::{self, ConnectHandle, ConnectSettings};
use crate::group::GroupCoordinator;
use crate::ingest::Ingest;
use crate::metrics::{Metrics, UPKEEP_INTERVAL_MS};
use crate::plugin::{PluginHost, PluginHostConfig, PluginLimits};
use crate::protocol::{Context, Endpoint, Handler, SUPPORTED_APIS};
use crate::purgatory::Purgatory;
use crate::replica::ReplicaManager;
use crate::server::{self, ServerLimits};
use crate::topics::Topics;
use crate::transform::inline::InlineRegistry;
use crate::transform::{self, TransformManager};

/// The bound sockets of a broker: Kafka listeners, the CONTROLLER listener and the admin
/// HTTP listener.
#[derive(Debug)]
pub struct Listeners {
    /// One per Kafka (non-controller) `listeners` entry, in order.
    pub kafka: Vec<TcpListener>,
    /// The CONTROLLER listener (`ClusterSettings::controller_listener`; port 0 binds
    /// this node's port in `controller.quorum.voters`), served by the controller quorum.
    pub controller: Option<std::net::TcpListener>,
    /// `admin.listeners` (`None` when it is empty).
    pub admin: Option<TcpListener>,
}

/// Binds every configured listener (port 0 picks a free port).
///
/// Errors: the address cannot be bound (in use, no permission), with the address.
pub async fn bind(config: &BrokerConfig) -> anyhow::Result<Listeners> {
    let mut kafka = Vec::new();
    for l in &config.listeners {
        let addr = format!("{}:{}", l.host, l.port);
        let listener = TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr} (listeners)"))?;
        kafka.push(listener);
    }
    let controller = match &config.cluster.controller_listener {
        Some(l) => {
            let voter_port = config
                .cluster
                .quorum_voters
                .iter()
                .find(|v| v.id == config.node_id)
                .map(|v| v.port);
            let port = if l.port == 0 {
                voter_port.unwrap_or(0)
            } else {
                l.port
            };
            let addr = format!("{}:{}", l.host, port);
            Some(
                std::net::TcpListener::bind(&addr)
                    .with_context(|| format!("cannot listen on {addr} (listeners, controller)"))?,
            )
        }
        None => None,
    };
    let admin = match &config.admin_listener {
        // A controller-only node serves no broker API, HTTP included.
        Some(a) if !config.cluster.process_roles.broker => {
            tracing::warn!(
                "admin.listeners ({}:{}) is not served by a controller-only node (process.roles=controller)",
                a.host,
                a.port
            );
            None
        }
        Some(a) => {
            let addr = format!("{}:{}", a.host, a.port);
            Some(
                TcpListener::bind(&addr)
                    .await
                    .with_context(|| format!("cannot listen on {addr} (admin.listeners)"))?,
            )
        }
        None => None,
    };
    Ok(Listeners {
        kafka,
        controller,
        admin,
    })
}

/// The endpoint Metadata advertises for Kafka listener `name`, bound at `bound`: its
/// `advertised.listeners` entry (same name), else the bound address (its real port, so
/// port 0 works; 0.0.0.0 becomes 127.0.0.1).
///
/// Errors: the socket has no local address.
pub fn advertised_endpoint(
    config: &BrokerConfig,
    name: &str,
    bound: &TcpListener,
) -> anyhow::Result<Endpoint> {
    if let Some(a) = config.advertised_listeners.iter().find(|a| a.name == name) {
        return Ok(Endpoint {
            host: a.host.clone(),
            port: i32::from(a.port),
        });
    }
    let addr = bound
        .local_addr()
        .context("listener has no local address")?;
    let host = if addr.ip().is_unspecified() {
        tracing::warn!("listening on {addr}; advertising 127.0.0.1: set advertised.listeners for remote clients");
        "127.0.0.1".to_string()
    } else {
        addr.ip().to_string()
    };
    Ok(Endpoint {
        host,
        port: i32::from(addr.port()),
    })
}

/// Each Kafka listener's name and advertised endpoint ([`advertised_endpoint`]), in
/// `listeners` order (`bound` is [`Listeners::kafka`], one per `config.listeners` entry).
///
/// Errors: a socket has no local address.
fn listener_endpoints(
    config: &BrokerConfig,
    bound: &[TcpListener],
) -> anyhow::Result<Vec<(String, Endpoint)>> {
    config
        .listeners
        .iter()
        .zip(bound)
        .map(|(l, b)| Ok((l.name.clone(), advertised_endpoint(config, &l.name, b)?)))
        .collect()
}

/// What this broker registers and how often it heartbeats: every Kafka listener by
/// name at its advertised endpoint (`endpoints`, in `listeners` order: the first is what
/// a peer uses when it lacks `inter.broker.listener.name`), then the admin listener.
fn broker_session(
    config: &BrokerConfig,
    endpoints: &[(String, Endpoint)],
    admin: Option<std::net::SocketAddr>,
) -> cluster::brokers::SessionSettings {
    let advertised = &endpoints[0].1;
    let mut endpoints: Vec<BrokerEndpoint> = endpoints
        .iter()
        .map(|(name, e)| BrokerEndpoint {
            name: name.clone(),
            host: e.host.clone(),
            port: e.port,
        })
        .collect();
    // The admin listener, where other brokers forward connect REST requests
    // (`connect::leader`); an unspecified address is reached at the advertised host.
    endpoints.extend(admin.map(|addr| BrokerEndpoint {
        name: connect::leader::ADMIN_ENDPOINT.to_string(),
        host: if addr.ip().is_unspecified() {
            advertised.host.clone()
        } else {
            addr.ip().to_string()
        },
        port: i32::from(addr.port()),
    }));
    cluster::brokers::SessionSettings {
        endpoints,
        rack: config.rack.clone(),
        heartbeat_interval: std::time::Duration::from_millis(
            config.cluster.broker_heartbeat_interval_ms,
        ),
        session_timeout: std::time::Duration::from_millis(config.cluster.broker_session_timeout_ms),
        unclean_leader_election_enable: config.replication.unclean_leader_election_enable,
    }
}

/// Runs the blocking `job` every `every` (on the blocking pool, one run at a time; a
/// late tick is delayed, not bunched) until `shutdown` changes.
async fn every_interval(
    every: std::time::Duration,
    mut shutdown: watch::Receiver<bool>,
    job: impl Fn() + Send + Sync + 'static,
) {
    let job = Arc::new(job);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let job = job.clone();
                let _ = tokio::task::spawn_blocking(move || job()).await;
            }
            _ = shutdown.changed() => break,
        }
    }
}

/// Spawns on `tasks` what every controller runs and acts on only while its node leads
/// the quorum (combined and controller-only nodes alike): fencing brokers whose session
/// lapsed, with the elections that follow (`cluster::brokers::fence_loop`), and the
/// preferred-leader rebalance (`cluster::brokers::rebalance_loop`).
fn spawn_controller_duties(
    tasks: &mut tokio::task::JoinSet<()>,
    metadata: &Arc<Metadata>,
    session: cluster::brokers::SessionSettings,
    config: &BrokerConfig,
    shutdown: &watch::Receiver<bool>,
) {
    tasks.spawn(cluster::brokers::fence_loop(
        metadata.clone(),
        session,
        shutdown.clone(),
    ));
    tasks.spawn(cluster::brokers::rebalance_loop(
        metadata.clone(),
        rebalance_settings(config),
        shutdown.clone(),
    ));
}

/// Takes an exclusive advisory lock on `<log_dir>/.lock` (Kafka's), held while the
/// returned file is open.
///
/// Errors: another process (another weir) holds it ("log.dirs D is in use by another weir
/// process (D/.lock is locked)"), or the file cannot be created or locked.
pub(crate) fn lock_log_dir(log_dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    let path = log_dir.join(".lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
            "log.dirs {} is in use by another weir process ({} is locked)",
            log_dir.display(),
            path.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("cannot lock {}", path.display()))
        }
    }
}

/// Creates and locks every directory of the broker ([`BrokerConfig::all_dirs`]: each of
/// `log.dirs`, and `metadata.log.dir`), in order, with [`lock_log_dir`]; the locks are
/// held while the returned files are open. One weir per directory: another weir on any
/// of them stops this start-up, naming that directory.
///
/// Errors: a directory cannot be created ("cannot create log.dirs D") or locked (as
/// [`lock_log_dir`]); the locks taken before it are released.
pub(crate) fn lock_log_dirs(config: &BrokerConfig) -> anyhow::Result<Vec<std::fs::File>> {
    config
        .all_dirs()
        .into_iter()
        .map(|dir| {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create log.dirs {}", dir.display()))?;
            lock_log_dir(dir)
        })
        .collect()
}

/// Where a broker-only node remembers the port of its learner listener
/// (`<log.dirs>/__cluster_metadata/learner.port`), so a restart binds the same one and
/// the quorum replicates to it at the address it already knows.
const LEARNER_PORT_FILE: &str = "__cluster_metadata/learner.port";

/// Binds a broker-only node's internal Raft listener, where the quorum leader replicates
/// `__cluster_metadata` to it as a learner (Kafka's brokers fetch that log as observers,
/// KIP-595; with openraft the leader pushes, so a learner needs an address). It is on the
/// host of the `inter.broker.listener.name` listener (the network brokers share; an
/// unspecified address is reached at the advertised host), on the port of the previous
/// start when that is free, else a free one; the port is written to
/// [`LEARNER_PORT_FILE`]. Returns the listener and the `HOST:PORT` to register.
///
/// Errors: no address can be bound, or the port file cannot be written.
fn bind_learner_listener(
    config: &BrokerConfig,
    advertised: &Endpoint,
) -> anyhow::Result<(std::net::TcpListener, String)> {
    let host = config
        .listeners
        .iter()
        .find(|l| l.name == config.cluster.inter_broker_listener_name)
        .or(config.listeners.first())
        .map_or_else(|| "127.0.0.1".to_string(), |l| l.host.clone());
    let path = config.metadata_dir().join(LEARNER_PORT_FILE);
    let earlier: Option<u16> = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| t.trim().parse().ok());
    let listener = match earlier.and_then(|p| std::net::TcpListener::bind((host.as_str(), p)).ok())
    {
        Some(l) => l,
        None => std::net::TcpListener::bind((host.as_str(), 0)).with_context(|| {
            format!("cannot listen on {host}:0 (the learner listener of a broker-only node)")
        })?,
    };
    let addr = listener
        .local_addr()
        .context("learner listener has no local address")?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(&path, format!("{}\n", addr.port()))
        .with_context(|| format!("cannot write {}", path.display()))?;
    let host = if addr.ip().is_unspecified() {
        advertised.host.clone()
    } else {
        addr.ip().to_string()
    };
    let addr = format!("{host}:{}", addr.port());
    tracing::info!(%addr, "learner listener (Raft replication of __cluster_metadata to this broker-only node)");
    Ok((listener, addr))
}

/// Runs a controller-only node (`process.roles=controller`, KIP-631) until `shutdown`: a
/// voter of the controller quorum on `controller_listener` that does the active
/// controller's work when it leads (fencing and unfencing brokers, the elections they
/// need, the leader rebalance; changes brokers propose are appended by whichever voter
/// leads) and nothing of a broker: it does not register, hosts no partition, serves no
/// Kafka or admin listener, and is never listed to clients.
///
/// Errors: the log directory cannot be created or locked, or the quorum cannot start.
async fn run_controller(
    config: Arc<BrokerConfig>,
    controller_listener: Option<std::net::TcpListener>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let _log_dir_locks = lock_log_dirs(&config)?;
    let addr = controller_listener
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .context("a controller-only node needs its CONTROLLER listener")?;
    let metadata = Arc::new(
        Metadata::open_quorum(
            config.metadata_dir(),
            config.node_id,
            config.cluster.voters(config.node_id),
            controller_listener,
            config.cluster.controller_quorum_election_timeout_ms,
            None,
        )
        .context("cannot open cluster metadata")?,
    );
    let _metadata_follower = metadata.follow();
    tracing::info!(
        %addr,
        node_id = config.node_id,
        cluster_id = metadata.cluster_id(),
        "controller-only node: CONTROLLER listener up, no broker role"
    );
    let session = cluster::brokers::SessionSettings {
        endpoints: Vec::new(),
        rack: None,
        heartbeat_interval: std::time::Duration::from_millis(
            config.cluster.broker_heartbeat_interval_ms,
        ),
        session_timeout: std::time::Duration::from_millis(config.cluster.broker_session_timeout_ms),
        unclean_leader_election_enable: config.replication.unclean_leader_election_enable,
    };
    let mut tasks = tokio::task::JoinSet::new();
    spawn_controller_duties(&mut tasks, &metadata, session, &config, &shutdown);
    while tasks.join_next().await.is_some() {}
    tracing::info!("controller stopped");
    Ok(())
}

/// The leader rebalance's settings (`auto.leader.rebalance.enable`, `leader.imbalance.*`).
fn rebalance_settings(config: &BrokerConfig) -> cluster::brokers::RebalanceSettings {
    cluster::brokers::RebalanceSettings {
        enabled: config.replication.auto_leader_rebalance_enable,
        check_interval: std::time::Duration::from_millis(
            config.replication.leader_imbalance_check_interval_ms,
        ),
        per_broker_percentage: config.replication.leader_imbalance_per_broker_percentage,
    }
}

/// Which metadata log a broker runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataStore {
    /// The controller quorum (`cluster::RaftMetadataLog`): every broker.
    Quorum,
    /// The single-node file store of earlier versions (`cluster::FileMetadataLog`), kept
    /// so an upgrade test can make a data directory as they did.
    EarlierFileStore,
}

/// Runs a broker on `listeners` until `shutdown` becomes true.
///
/// Errors: the log directory cannot be created or recovered (environment), with context.
pub async fn run(
    config: BrokerConfig,
    listeners: Listeners,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    run_on(config, listeners, shutdown, MetadataStore::Quorum).await
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and bounds the segment descriptor
/// cache (`log.open.files.max`, 0: half the soft limit), logging the figures. A failure
/// to raise the limit is logged and the current one used.
fn configure_open_files(config: &BrokerConfig) {
    use crate::log::fdcache;
    let soft = match fdcache::raise_nofile_limit() {
        Ok(limit) => {
            tracing::info!(
                soft_before = ?limit.soft_before,
                soft = ?limit.soft,
                hard = ?limit.hard,
                "RLIMIT_NOFILE"
            );
            limit.soft
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise RLIMIT_NOFILE");
            rustix::process::getrlimit(rustix::process::Resource::Nofile).current
        }
    };
    let max_open = match config.log_open_files_max {
        0 => fdcache::derived_max_open(soft),
        n => n,
    };
    fdcache::configure(max_open);
    tracing::info!(
        max_open = fdcache::stats().max_open,
        "segment file descriptor cache bound (log.open.files.max)"
    );
}

/// [`run`] with the metadata on `store`.
///
/// Errors: as [`run`].
pub async fn run_on(
    config: BrokerConfig,
    listeners: Listeners,
    shutdown: watch::Receiver<bool>,
    store: MetadataStore,
) -> anyhow::Result<()> {
    let config = Arc::new(config);
    let Listeners {
        kafka: listeners,
        controller: controller_listener,
        admin: admin_listener,
    } = listeners;
    let roles = config.cluster.process_roles;
    if !roles.broker {
        return run_controller(config, controller_listener, shutdown).await;
    }
    let endpoints = listener_endpoints(&config, &listeners)?;
    let advertised = endpoints
        .first()
        .map(|(_, e)| e.clone())
        .context("no listener to serve")?;
    // One broker per log directory (Kafka's `.lock`): two writers of one log lose data.
    // The locks live as long as this function, i.e. until every log is flushed.
    let _log_dir_locks = lock_log_dirs(&config)?;
    // A broker-only node is a Raft learner: the leader replicates the log to an internal
    // listener of its own (docs/cluster.md, "Broker-only and controller-only nodes").
    let (controller_listener, learner_addr) = if roles.controller || store != MetadataStore::Quorum
    {
        (controller_listener, None)
    } else {
        let (listener, addr) = bind_learner_listener(&config, &advertised)?;
        (Some(listener), Some(addr))
    };
    // The controller quorum (a one-voter quorum of this node when no voters are set):
    // starting it replays `__cluster_metadata` (snapshot + tail) into the first image.
    let metadata = Arc::new(
        match store {
            MetadataStore::Quorum => Metadata::open_quorum(
                config.metadata_dir(),
                config.node_id,
                config.cluster.voters(config.node_id),
                controller_listener,
                config.cluster.controller_quorum_election_timeout_ms,
                learner_addr,
            ),
            MetadataStore::EarlierFileStore => {
                Metadata::open(config.metadata_dir(), config.node_id)
            }
        }
        .context("cannot open cluster metadata")?,
    );
    // Applies what other nodes commit; stopped (joined) when `run` returns.
    let _metadata_follower = metadata.follow();
    // Registers this broker (KIP-631) before serving, so Metadata lists it at the
    // endpoint it has now; when the quorum cannot commit it yet, the heartbeat task
    // retries.
    let admin_addr = admin_listener.as_ref().and_then(|l| l.local_addr().ok());
    let session = broker_session(&config, &endpoints, admin_addr);
    let broker_epoch = if store == MetadataStore::Quorum {
        let (m, s) = (metadata.clone(), session.clone());
        match tokio::task::spawn_blocking(move || cluster::brokers::register_at_start(&m, &s)).await
        {
            Ok(Ok(epoch)) => epoch,
            // Another live broker has this node.id: stop before serving anything.
            Ok(Err(e)) => anyhow::bail!("{e}"),
            Err(e) => anyhow::bail!("broker registration task failed: {e}"),
        }
    } else {
        None
    };
    configure_open_files(&config);
    let purgatory = Arc::new(Purgatory::new(config.fetch_purgatory_max_size));
    let started = std::time::Instant::now();
    // The replica manager opens every partition of the metadata image, then follows it.
    let replicas = ReplicaManager::open(config.clone(), &metadata, purgatory)
        .context("cannot open partition logs")?;
    tracing::info!(
        topics = metadata.image().topic_count(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        log_dirs = ?config.log_dirs,
        cluster_id = metadata.cluster_id(),
        "logs recovered"
    );
    let groups = Arc::new(
        GroupCoordinator::open(metadata.clone(), replicas.clone(), config.group)
            .map_err(|e| anyhow::anyhow!(e))
            .context("cannot load consumer groups")?,
    );
    let txn = crate::txn::TransactionCoordinator::new(
        metadata.clone(),
        replicas.clone(),
        groups.clone(),
        config.clone(),
    );
    // This broker's own recorder (not the process' global one: see `metrics`).
    let metrics = Metrics::new(SUPPORTED_APIS.iter().map(|a| a.key));
    let plugins = Arc::new(
        PluginHost::new(PluginHostConfig {
            cache_dir: Some(config.plugin.cache_dir.clone()),
            limits: PluginLimits {
                memory_bytes: config.plugin.memory_max_bytes,
                call_timeout_ms: config.plugin.call_timeout_ms,
            },
            metrics: Some(metrics.clone()),
        })
        .context("cannot start the plugin host")?,
    );
    // Each layer gets what it calls, here and only here; no layer holds another's state
    // bag, and nothing built below points back up, so every owner is dropped (its files
    // closed) when this function returns.
    let topic_admin = Topics {
        config: config.clone(),
        metadata: metadata.clone(),
        replicas: replicas.clone(),
    };
    // The broker's own writes; loads topics' partitioner components through `plugins`.
    let inline = Arc::new(InlineRegistry::new());
    let ingest = Arc::new(Ingest::new(
        topic_admin.clone(),
        plugins.clone(),
        inline.clone(),
    ));
    let transforms = Arc::new(
        TransformManager::new(
            transform::Owners {
                config: config.clone(),
                metadata: metadata.clone(),
                replicas: replicas.clone(),
                groups: groups.clone(),
                txn: txn.clone(),
            },
            inline.clone(),
            ingest.clone(),
            plugins.clone(),
        )
        .context("cannot open the transform deployments directory")?,
    );
    transforms.start().await;
    // Connectors: on the connect leader (a single node always is; `connect::leader`),
    // REST-created ones need no directory; the files of `connect.config.dir` are loaded
    // and watched when it is set.
    let connect = ConnectHandle::new(metadata.clone());
    let connect_run = connect::leader::run(
        connect.clone(),
        ConnectSettings {
            config_dir: config.connect_config_dir.clone(),
            plugin_path: config.connect_plugin_path.clone(),
            worker_id: format!("{}:{}", advertised.host, advertised.port),
            ceiling: connect::config::Ceiling::new(
                &config.connect_allowed_paths,
                config.connect_http_allowed_hosts.clone(),
                &config
                    .all_dirs()
                    .into_iter()
                    .chain([config.plugin.cache_dir.as_path()])
                    .collect::<Vec<_>>(),
            ),
            exactly_once_source: config.connect_exactly_once_source,
            transaction_max_timeout_ms: config.transaction.max_timeout_ms,
        },
        connect::Owners {
            metadata: metadata.clone(),
            replicas: replicas.clone(),
            groups: groups.clone(),
            txn: txn.clone(),
        },
        ingest.clone(),
        plugins.clone(),
        shutdown.clone(),
    );
    let context = Context {
        config: config.clone(),
        metadata: metadata.clone(),
        replicas: replicas.clone(),
        groups: groups.clone(),
        txn: txn.clone(),
        topics: topic_admin,
        listener_name: endpoints[0].0.clone(),
        advertised,
        inline,
        ingest: ingest.clone(),
        metrics: metrics.clone(),
        fetch_sessions: Arc::new(crate::fetch_session::FetchSessions::new(
            config.max_incremental_fetch_session_cache_slots,
            metrics.fetch_sessions(),
        )),
    };
    let limits = ServerLimits {
        request_max_bytes: config.socket_request_max_bytes,
        max_connections: config.max_connections,
        queued_max_requests: config.queued_max_requests,
        connections_max_idle_ms: config.connections_max_idle_ms,
    };

    // Every task below is owned here and awaited before this function returns.
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(connect_run);
    if store == MetadataStore::Quorum {
        tasks.spawn(cluster::brokers::heartbeat_loop(
            metadata.clone(),
            session.clone(),
            broker_epoch,
            shutdown.clone(),
        ));
        spawn_controller_duties(&mut tasks, &metadata, session, &config, &shutdown);
        tasks.spawn(crate::replication::run(
            metadata.clone(),
            replicas.clone(),
            config.clone(),
            shutdown.clone(),
        ));
    }
    // One handler per listener: Metadata, FindCoordinator and DescribeCluster answer
    // with the endpoints of the listener the request came in on (Kafka's rule).
    for (listener, (name, endpoint)) in listeners.into_iter().zip(endpoints) {
        let addr = listener
            .local_addr()
            .context("listener has no local address")?;
        tracing::info!(%addr, listener = %name, "listening");
        let handler = Arc::new(Handler::new(Context {
            listener_name: name,
            advertised: endpoint,
            ..context.clone()
        }));
        tasks.spawn(server::run(listener, handler, limits, shutdown.clone()));
    }
    if let Some(listener) = admin_listener {
        let addr = listener
            .local_addr()
            .context("admin listener has no local address")?;
        tracing::info!(%addr, "admin API listening");
        let state = Arc::new(AdminState {
            config: config.clone(),
            metadata,
            ingest,
            transforms: transforms.clone(),
            connect,
            replicas: replicas.clone(),
            groups: groups.clone(),
            metrics: metrics.clone(),
        });
        let shutdown = shutdown.clone();
        tasks.spawn(async move {
            if let Err(e) = admin::serve(listener, state, shutdown).await {
                tracing::error!(error = %e, "admin API stopped");
            }
        });
    }
    tasks.spawn(groups.run_timers(shutdown.clone()));
    tasks.spawn(txn.run_timers(shutdown.clone()));
    // Hot reload; on shutdown it stops every transform runner (each finishes its chunk).
    tasks.spawn(transforms.run(shutdown.clone()));
    {
        let replicas = replicas.clone();
        let every = std::time::Duration::from_millis(config.retention_check_interval_ms.max(1));
        // Retention deletes files: off the async workers.
        tasks.spawn(every_interval(every, shutdown.clone(), move || {
            replicas.apply_retention();
        }));
    }
    {
        // Kafka's `LogManager.deleteLogs`: deleted partitions' renamed directories go.
        let replicas = replicas.clone();
        let every =
            std::time::Duration::from_millis(crate::replica::DELETED_DIR_REMOVAL_INTERVAL_MS);
        tasks.spawn(every_interval(every, shutdown.clone(), move || {
            replicas.remove_deleted_dirs();
        }));
    }
    {
        // Kafka's producer id expiration task (`producer.id.expiration.check.interval.ms`).
        let replicas = replicas.clone();
        let every = std::time::Duration::from_millis(
            config.producer_id_expiration_check_interval_ms.max(1),
        );
        tasks.spawn(every_interval(every, shutdown.clone(), move || {
            let expired = replicas.expire_producers();
            if expired > 0 {
                tracing::debug!(expired, "expired idle producer ids");
            }
        }));
    }
    {
        // Kafka's high watermark checkpoint thread: a restarted replica starts from it.
        let replicas = replicas.clone();
        let every = std::time::Duration::from_millis(
            config
                .replication
                .high_watermark_checkpoint_interval_ms
                .max(1),
        );
        tasks.spawn(every_interval(every, shutdown.clone(), move || {
            if let Err(e) = replicas.checkpoint_high_watermarks() {
                tracing::warn!(error = %e, "cannot write the high watermark checkpoint");
            }
        }));
    }
    {
        // Folds histogram samples into buckets so an unscraped broker's memory is bounded.
        let mut shutdown = shutdown.clone();
        let every = std::time::Duration::from_millis(UPKEEP_INTERVAL_MS);
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => metrics.run_upkeep(),
                    _ = shutdown.changed() => break,
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    replicas.stop_moves();
    replicas.flush_all();
    // After the flush: the checkpoint never names records the log has not made durable.
    if let Err(e) = replicas.checkpoint_high_watermarks() {
        tracing::warn!(error = %e, "cannot write the high watermark checkpoint at shutdown");
    }
    tracing::info!("broker stopped");
    Ok(())
}

#[cfg(test)]
mod tidy {
    use std::path::{Path, PathBuf};

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("src is readable") {
            let path = entry.expect("src entry").path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
    }

    /// Only the composition root (and the protocol layer itself) imports `protocol`:
    /// the layers below get what they call from `broker`, never the handlers' context.
    /// `fuzzing` is no layer below either: a test harness calling `protocol`'s decoders
    /// as the broker does, it sits above `protocol`, like `broker`.
    #[test]
    fn no_layer_below_protocol_imports_it() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let allowed = [
            src.join("broker.rs"),
            src.join("protocol"),
            src.join("fuzzing.rs"),
        ];
        let mut offenders = Vec::new();
        for file in files {
            if allowed.iter().any(|a| file.starts_with(a)) {
                continue;
            }
            let text = std::fs::read_to_string(&file).expect("source is UTF-8");
            for (n, line) in text.lines().enumerate() {
                let code = line.trim_start();
                if !code.starts_with("//") && code.contains("crate::protocol") {
                    offenders.push(format!("{}:{}: {}", file.display(), n + 1, code));
                }
            }
        }
        assert!(
            offenders.is_empty(),
            "imports of the protocol layer: {offenders:#?}"
        );
    }
}
