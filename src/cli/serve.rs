//! `weir serve`: load the config, bind the listeners, run the broker until Ctrl-C/SIGTERM.
//!
//! Prints one machine-readable line on stdout once listening —
//! `weir listening on HOST:PORT` per listener — so scripts and tests that start the binary
//! with port 0 learn the port; a controller-only node, which has no Kafka listener,
//! prints `weir controller listening on HOST:PORT` (its CONTROLLER listener) instead.
//!
//! Started by `weir cluster up` (its pid in the environment variable
//! `cluster::PARENT_PID_ENV`), the broker asks Linux for SIGTERM when that parent dies
//! (`prctl(PR_SET_PDEATHSIG)`), so a killed `cluster up` leaves no node behind; the
//! SIGTERM stops the broker as Ctrl-C does.

use tokio::sync::watch;

use crate::config::BrokerConfig;

use super::ServeArgs;

/// Runs `weir serve`.
///
/// Errors: bad config (names the key), a listener that cannot bind, an unreadable log dir.
pub(super) fn run(args: ServeArgs) -> anyhow::Result<()> {
    if let Some(parent) = std::env::var_os(super::cluster::PARENT_PID_ENV) {
        exit_with_parent(&parent.to_string_lossy())?;
    }
    let config = BrokerConfig::load(args.config.as_deref(), &args.overrides)?;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WEIR_LOG")
                // openraft narrates every election at info: its warnings are what matter.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // A log line that cannot be written (stderr a closed pipe, the disk under its
        // file full) is dropped. Reporting it goes through `eprintln!`, which panics on
        // the same stderr: inside the group coordinator's lock that poisoned it, and every
        // later group request failed.
        .log_internal_errors(false)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("weir")
        .build()?;
    rt.block_on(async move {
        // Fail on an unusable log.dirs before announcing the listener: a script waiting for
        // the "listening" line must not see it from a broker that is about to exit.
        // The lock `broker::run` takes for the broker's lifetime, taken and released
        // here to fail early. Two processes starting in the same instant can both pass;
        // the loser then fails in `broker::run`, with the same message, after its
        // listening line.
        drop(crate::broker::lock_log_dirs(&config)?);
        let listeners = crate::broker::bind(&config).await?;
        for l in &listeners.kafka {
            println!("weir listening on {}", l.local_addr()?);
        }
        // A controller-only node has no Kafka listener: its CONTROLLER one instead.
        if listeners.kafka.is_empty() {
            if let Some(l) = &listeners.controller {
                println!("weir controller listening on {}", l.local_addr()?);
            }
        }
        if let Some(l) = &listeners.admin {
            println!("weir admin API on http://{}", l.local_addr()?);
        }
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutting down");
            let _ = tx.send(true);
        });
        crate::broker::run(config, listeners, rx).await
    })
}

/// Asks for SIGTERM when the parent process dies; fails if the parent is not `expected_pid`
/// any more (it died before the request, so the signal would never come).
///
/// Errors: `expected_pid` not a pid, the prctl refused, the parent already gone.
fn exit_with_parent(expected_pid: &str) -> anyhow::Result<()> {
    use rustix::process::{getppid, set_parent_process_death_signal, Pid, Signal};
    let expected: i32 = expected_pid.parse().map_err(|_| {
        anyhow::anyhow!(
            "{}={expected_pid:?} is not a process id",
            super::cluster::PARENT_PID_ENV
        )
    })?;
    set_parent_process_death_signal(Some(Signal::TERM))
        .map_err(|e| anyhow::anyhow!("prctl(PR_SET_PDEATHSIG): {e}"))?;
    // Checked after the request: a parent that died before it is seen here.
    if Pid::as_raw(getppid()) != expected {
        anyhow::bail!("the parent process {expected} (weir cluster up) is gone");
    }
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
