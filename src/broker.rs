//! The composition root: builds every owner from the configuration and wires them.
//!
//! `run(config, listeners, shutdown)` takes already-bound listeners, so tests bind port 0
//! and read the port back (mini-redis style). Start-up order: metadata (topics, ids) →
//! replica manager (opens and recovers every partition log) → purgatory → protocol
//! handler → server; background tasks: retention. Shutdown: stop accepting, let
//! connections end, stop background tasks, flush every log.

use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::admin::{self, AdminState};
use crate::cluster::Metadata;
use crate::config::BrokerConfig;
use crate::group::GroupCoordinator;
use crate::ingest::Ingest;
use crate::plugin::{PluginHost, PluginHostConfig, PluginLimits};
use crate::protocol::{Context, Endpoint, Handler};
use crate::purgatory::Purgatory;
use crate::replica::ReplicaManager;
use crate::server::{self, ServerLimits};
use crate::transform::inline::InlineRegistry;
use crate::transform::TransformManager;

/// The bound sockets of a broker: Kafka listeners and the admin HTTP listener.
#[derive(Debug)]
pub struct Listeners {
    /// One per `listeners` entry, in order.
    pub kafka: Vec<TcpListener>,
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
    let admin = match &config.admin_listener {
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
    Ok(Listeners { kafka, admin })
}

/// The endpoint Metadata advertises: the first `advertised.listeners` entry, else the
/// first bound listener (its real port, so port 0 works; 0.0.0.0 becomes 127.0.0.1).
pub fn advertised_endpoint(config: &BrokerConfig, bound: &TcpListener) -> anyhow::Result<Endpoint> {
    if let Some(a) = config.advertised_listeners.first() {
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

/// Takes an exclusive advisory lock on `<log_dir>/.lock`.
///
/// Errors: another process (another weir) holds it, or the file cannot be created.
fn lock_log_dir(log_dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
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

/// Runs a broker on `listeners` until `shutdown` becomes true.
///
/// Errors: the log directory cannot be created or recovered (environment), with context.
pub async fn run(
    config: BrokerConfig,
    listeners: Listeners,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let config = Arc::new(config);
    let Listeners {
        kafka: listeners,
        admin: admin_listener,
    } = listeners;
    let first = listeners.first().context("no listener to serve")?;
    let advertised = advertised_endpoint(&config, first)?;
    std::fs::create_dir_all(&config.log_dir)
        .with_context(|| format!("cannot create log.dirs {}", config.log_dir.display()))?;
    // One broker per log directory (Kafka's `.lock`): two writers of one log lose data.
    // The lock lives as long as this function, i.e. until every log is flushed.
    let _log_dir_lock = lock_log_dir(&config.log_dir)?;
    let metadata = Arc::new(
        Metadata::open(&config.log_dir, config.node_id).context("cannot open cluster metadata")?,
    );
    let purgatory = Arc::new(Purgatory::new(config.fetch_purgatory_max_size));
    let started = std::time::Instant::now();
    // The replica manager opens every partition of the metadata image, then follows it.
    let replicas = ReplicaManager::open(config.clone(), &metadata, purgatory)
        .context("cannot open partition logs")?;
    tracing::info!(
        topics = metadata.image().topic_count(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        log_dir = %config.log_dir.display(),
        cluster_id = metadata.cluster_id(),
        "logs recovered"
    );
    let groups = Arc::new(
        GroupCoordinator::open(metadata.clone(), replicas.clone(), config.group)
            .map_err(|e| anyhow::anyhow!(e))
            .context("cannot load consumer groups")?,
    );
    let inline = Arc::new(InlineRegistry::new());
    let ctx = Context {
        config: config.clone(),
        metadata,
        replicas: replicas.clone(),
        groups: groups.clone(),
        advertised,
        inline: inline.clone(),
    };
    let plugins = Arc::new(
        PluginHost::new(PluginHostConfig {
            cache_dir: Some(config.plugin.cache_dir.clone()),
            limits: PluginLimits {
                memory_bytes: config.plugin.memory_max_bytes,
                call_timeout_ms: config.plugin.call_timeout_ms,
            },
        })
        .context("cannot start the plugin host")?,
    );
    // The ingest path loads topics' partitioner components through the same host.
    let ingest = Arc::new(Ingest::new(ctx.clone(), plugins.clone()));
    inline.set_ingest(ingest.clone());
    let transforms = Arc::new(
        TransformManager::new(ctx.clone(), ingest.clone(), plugins.clone())
            .context("cannot open the transform deployments directory")?,
    );
    transforms.start().await;
    let handler = Arc::new(Handler::new(ctx.clone()));
    let limits = ServerLimits {
        request_max_bytes: config.socket_request_max_bytes,
        max_connections: config.max_connections,
        queued_max_requests: config.queued_max_requests,
        connections_max_idle_ms: config.connections_max_idle_ms,
    };

    let mut tasks = tokio::task::JoinSet::new();
    for listener in listeners {
        let addr = listener
            .local_addr()
            .context("listener has no local address")?;
        tracing::info!(%addr, "listening");
        tasks.spawn(server::run(
            listener,
            handler.clone(),
            limits,
            shutdown.clone(),
        ));
    }
    // Connectors: always on (REST-created ones need no directory); the files of
    // `connect.config.dir` are loaded and watched when it is set.
    let (connect, connect_run) = crate::connect::ConnectRuntime::start(
        crate::connect::ConnectSettings {
            config_dir: config.connect_config_dir.clone(),
            plugin_path: config.connect_plugin_path.clone(),
        },
        ctx.clone(),
        ingest.clone(),
        plugins.clone(),
        shutdown.clone(),
    )
    .await?;
    tasks.spawn(connect_run);
    if let Some(listener) = admin_listener {
        let addr = listener
            .local_addr()
            .context("admin listener has no local address")?;
        tracing::info!(%addr, "admin API listening");
        let state = Arc::new(AdminState {
            ctx: ctx.clone(),
            ingest: ingest.clone(),
            inline: inline.clone(),
            plugins: plugins.clone(),
            transforms: transforms.clone(),
            connect: connect.clone(),
        });
        let shutdown = shutdown.clone();
        tasks.spawn(async move {
            if let Err(e) = admin::serve(listener, state, shutdown).await {
                tracing::error!(error = %e, "admin API stopped");
            }
        });
    }
    tasks.spawn(groups.clone().run_timers(shutdown.clone()));
    // Hot reload; on shutdown it stops every transform runner (each finishes its chunk).
    tasks.spawn(transforms.clone().run(shutdown.clone()));
    {
        let replicas = replicas.clone();
        let mut shutdown = shutdown.clone();
        let every = std::time::Duration::from_millis(config.retention_check_interval_ms.max(1));
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        let r = replicas.clone();
                        // Retention deletes files: keep it off the async workers.
                        let _ = tokio::task::spawn_blocking(move || r.apply_retention()).await;
                    }
                    _ = shutdown.changed() => break,
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    replicas.flush_all();
    tracing::info!("broker stopped");
    Ok(())
}
