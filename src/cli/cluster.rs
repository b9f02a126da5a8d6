//! `weir cluster up`: a local cluster of N combined broker-and-controller nodes, each a
//! child process `weir serve --override ...` of this same executable, for trying a
//! multi-node setup (and for tests) without writing N configs by hand.
//!
//! It picks free loopback ports (PLAINTEXT, CONTROLLER and admin HTTP per node), writes
//! them to `DIR/cluster.toml` so that running it again over the same DIR restarts the
//! same cluster on the same ports (the voter list is part of each node's identity),
//! starts node 1..N with `log.dirs=DIR/node-<id>` and their output in
//! `DIR/node-<id>.log`, and waits until every node answers Metadata on its PLAINTEXT
//! port ([`START_TIMEOUT`]). Then stdout gets the bootstrap list on the first line
//! (`127.0.0.1:P1,127.0.0.1:P2,...`, for scripts) and each node's pid and command line
//! (to restart one by hand). On SIGINT or SIGTERM every child gets SIGTERM, then SIGKILL
//! after [`STOP_GRACE`]; the exit code is 0. A child that exits during start-up, or a node
//! not answering in time, stops the others and fails the command with its log's tail.
//!
//! Children die with this process even when it is killed (SIGKILL included): each is
//! started with [`PARENT_PID_ENV`], and `weir serve` then asks Linux for SIGTERM when its
//! parent dies (`prctl(PR_SET_PDEATHSIG)`, see `serve.rs`).
//!
//! The ports are chosen by binding port 0 and releasing the sockets: another process may
//! take one before a node binds it (the node then fails to start and says so). Never
//! does: talk to the nodes other than as a Kafka client (the readiness probe), or import
//! broker internals.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Args, Subcommand};
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use serde::{Deserialize, Serialize};

use super::client::{self, CliContext};
use super::ClientArgs;

mod describe;

/// Environment variable naming the pid of the `weir cluster up` that started a node:
/// `weir serve` then asks for SIGTERM when that parent dies, and exits at once if it is
/// already gone.
pub(super) const PARENT_PID_ENV: &str = "WEIR_PARENT_PID";

/// How long every node together may take to answer Metadata after being started.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a node may take to stop after SIGTERM before it gets SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(15);

/// How often child processes are checked (exited? stop requested?).
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// How long one Metadata probe of a node may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);

/// How many lines of a failed node's log are shown.
const LOG_TAIL_LINES: usize = 30;

/// The most bytes read from the end of a log to find its tail.
const LOG_TAIL_MAX_BYTES: u64 = 64 * 1024;

/// The node counts `--nodes` accepts.
const MAX_NODES: u8 = 9;

/// The file in DIR holding the chosen ports.
const CLUSTER_FILE: &str = "cluster.toml";

/// Cluster subcommands.
#[derive(Debug, Subcommand)]
pub(super) enum ClusterCommand {
    /// Start N local nodes (combined broker and controller) as child processes, print the
    /// bootstrap list, run until Ctrl-C or SIGTERM, then stop them.
    Up(UpArgs),
    /// Show the cluster id, each broker (id, address, state) and the controller quorum
    /// (leader, epoch, high watermark, each voter's log end offset and lag), asked of a
    /// broker with DescribeCluster and DescribeQuorum.
    Describe(DescribeArgs),
}

/// `weir cluster describe` options.
#[derive(Debug, Args)]
pub(super) struct DescribeArgs {
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `weir cluster up` options.
#[derive(Debug, Args)]
pub(super) struct UpArgs {
    /// Number of nodes, 1 to 9 (3 for a new DIR; a DIR made before keeps its count).
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=i64::from(MAX_NODES)))]
    pub nodes: Option<u8>,
    /// Directory for the nodes' data, logs and `cluster.toml`; reusing one restarts the
    /// same cluster on the same ports. Default: a new directory under the system temp dir.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// Runs a cluster subcommand.
pub(super) fn run(cmd: ClusterCommand) -> anyhow::Result<()> {
    match cmd {
        ClusterCommand::Up(args) => up(args),
        ClusterCommand::Describe(args) => describe::run(&args.client.bootstrap_server),
    }
}

/// One node's ports, as stored in `cluster.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct NodePorts {
    /// `node.id`.
    id: u8,
    /// The PLAINTEXT (Kafka) listener's port.
    kafka_port: u16,
    /// The CONTROLLER listener's port, named in `controller.quorum.voters`.
    controller_port: u16,
    /// The admin HTTP listener's port (`admin.listeners`).
    admin_port: u16,
}

/// `DIR/cluster.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ClusterFile {
    /// Every node, ids 1..=N in order.
    node: Vec<NodePorts>,
}

impl ClusterFile {
    /// `controller.quorum.voters`: `1@127.0.0.1:C1,2@127.0.0.1:C2,...`.
    fn voters(&self) -> String {
        self.node
            .iter()
            .map(|n| format!("{}@127.0.0.1:{}", n.id, n.controller_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The bootstrap list: `127.0.0.1:P1,127.0.0.1:P2,...`.
    fn bootstrap(&self) -> String {
        self.node
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.kafka_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The `--override` values of node `n`'s `weir serve`.
    fn overrides(&self, n: &NodePorts, dir: &Path) -> Vec<String> {
        vec![
            format!("node.id={}", n.id),
            format!("controller.quorum.voters={}", self.voters()),
            "controller.listener.names=CONTROLLER".to_string(),
            format!(
                "listeners=PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}",
                n.kafka_port, n.controller_port
            ),
            format!("log.dirs={}", node_data_dir(dir, n.id).display()),
            format!("admin.listeners=http://127.0.0.1:{}", n.admin_port),
        ]
    }

    /// Checks what a stored file must satisfy: 1..=9 nodes numbered 1..N, distinct ports.
    fn validate(&self) -> Result<(), String> {
        let count = self.node.len();
        if count == 0 || count > usize::from(MAX_NODES) {
            return Err(format!("{count} nodes (1 to {MAX_NODES} expected)"));
        }
        for (i, n) in self.node.iter().enumerate() {
            if usize::from(n.id) != i + 1 {
                return Err(format!("node {} listed at position {}", n.id, i + 1));
            }
        }
        let mut ports: Vec<u16> = self
            .node
            .iter()
            .flat_map(|n| [n.kafka_port, n.controller_port, n.admin_port])
            .collect();
        if ports.contains(&0) {
            return Err("a port is 0".to_string());
        }
        ports.sort_unstable();
        if ports.windows(2).any(|w| w[0] == w[1]) {
            return Err("a port is used twice".to_string());
        }
        Ok(())
    }
}

fn node_data_dir(dir: &Path, id: u8) -> PathBuf {
    dir.join(format!("node-{id}"))
}

fn node_log_path(dir: &Path, id: u8) -> PathBuf {
    dir.join(format!("node-{id}.log"))
}

/// Three free loopback ports per node: all bound at once (so distinct), then released.
fn pick_ports(nodes: u8) -> anyhow::Result<ClusterFile> {
    let held = (0..usize::from(nodes) * 3)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .context("cannot bind a loopback port to pick free ones")?;
    let ports = held
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ClusterFile {
        node: (1..=nodes)
            .zip(ports.chunks_exact(3))
            .map(|(id, p)| NodePorts {
                id,
                kafka_port: p[0],
                controller_port: p[1],
                admin_port: p[2],
            })
            .collect(),
    })
}

/// A new directory under the system temp dir, `weir-cluster-<pid>-<n>`.
fn new_temp_dir() -> anyhow::Result<PathBuf> {
    let base = std::env::temp_dir();
    let pid = std::process::id();
    for n in 0..100 {
        let dir = base.join(format!("weir-cluster-{pid}-{n}"));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", dir.display())),
        }
    }
    anyhow::bail!("no free name for a new directory under {}", base.display())
}

/// The cluster of `dir`: the one its `cluster.toml` records, else a new one of `nodes`
/// nodes (3 by default) whose file is written now.
fn load_or_create(dir: &Path, nodes: Option<u8>) -> anyhow::Result<ClusterFile> {
    let path = dir.join(CLUSTER_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let file: ClusterFile = toml::from_str(&text)
                .with_context(|| format!("cannot parse {}", path.display()))?;
            file.validate()
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            if let Some(n) = nodes {
                if usize::from(n) != file.node.len() {
                    anyhow::bail!(
                        "{} records a cluster of {} nodes, not {n}: its nodes' metadata names \
                         those voters; use another --dir for another size",
                        path.display(),
                        file.node.len()
                    );
                }
            }
            Ok(file)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let file = pick_ports(nodes.unwrap_or(3))?;
            let text = format!(
                "# Written by `weir cluster up`: the ports of each node, reused when the same \
                 --dir is started again.\n{}",
                toml::to_string(&file)?
            );
            std::fs::write(&path, text)
                .with_context(|| format!("cannot write {}", path.display()))?;
            Ok(file)
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// A running node.
struct Node {
    id: u8,
    child: Child,
    /// The command line, quoted for a POSIX shell.
    command_line: String,
    log: PathBuf,
}

/// The started children; whatever is still running when this is dropped (an error, a
/// panic) is killed and reaped.
struct Nodes(Vec<Node>);

impl Nodes {
    /// SIGTERM to every running child, then SIGKILL to those still running after
    /// [`STOP_GRACE`]; reaps them all. Returns the ids of the nodes that had to be killed.
    fn stop(&mut self) -> Vec<u8> {
        for node in &mut self.0 {
            if matches!(node.child.try_wait(), Ok(None)) {
                let pid = rustix::process::Pid::from_child(&node.child);
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
        }
        let deadline = Instant::now() + STOP_GRACE;
        loop {
            let mut running = 0;
            for node in &mut self.0 {
                if matches!(node.child.try_wait(), Ok(None)) {
                    running += 1;
                }
            }
            if running == 0 || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(POLL_INTERVAL);
        }
        let mut killed = Vec::new();
        for node in &mut self.0 {
            if matches!(node.child.try_wait(), Ok(None)) {
                killed.push(node.id);
                let _ = node.child.kill();
            }
            let _ = node.child.wait();
        }
        killed
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for node in &mut self.0 {
            if matches!(node.child.try_wait(), Ok(None)) {
                let _ = node.child.kill();
                let _ = node.child.wait();
            }
        }
    }
}

/// Quotes `arg` for a POSIX shell when it holds anything beyond plain path and value
/// characters.
fn shell_quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:@,=+%".contains(c));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

fn start_node(
    exe: &Path,
    cluster: &ClusterFile,
    n: &NodePorts,
    dir: &Path,
) -> anyhow::Result<Node> {
    let log = node_log_path(dir, n.id);
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .with_context(|| format!("cannot open {}", log.display()))?;
    let err = out.try_clone()?;
    let mut args = vec!["serve".to_string()];
    for o in cluster.overrides(n, dir) {
        args.push("--override".to_string());
        args.push(o);
    }
    let mut command_line = shell_quote(&exe.to_string_lossy());
    for a in &args {
        command_line.push(' ');
        command_line.push_str(&shell_quote(a));
    }
    let child = Command::new(exe)
        .args(&args)
        .env(PARENT_PID_ENV, std::process::id().to_string())
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("cannot start node {} ({})", n.id, exe.display()))?;
    Ok(Node {
        id: n.id,
        child,
        command_line,
        log,
    })
}

/// The last [`LOG_TAIL_LINES`] lines of a node's log (read from its last
/// [`LOG_TAIL_MAX_BYTES`]).
fn log_tail(path: &Path) -> String {
    let read = || -> std::io::Result<String> {
        let mut f = File::open(path)?;
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_MAX_BYTES)))?;
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(LOG_TAIL_LINES);
            lines[from..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// Whether a node answers a Metadata request (`probe` is bootstrapped with its
/// PLAINTEXT address only).
fn answers_metadata(probe: &BaseConsumer<CliContext>) -> bool {
    probe.fetch_metadata(None, PROBE_TIMEOUT).is_ok()
}

fn up(args: UpArgs) -> anyhow::Result<()> {
    // Before any child exists, so a Ctrl-C during start-up stops them too.
    let stop = client::stop_on_signal();
    let dir = match args.dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            dir
        }
        None => new_temp_dir()?,
    };
    let dir =
        std::path::absolute(&dir).with_context(|| format!("cannot resolve {}", dir.display()))?;
    let cluster = load_or_create(&dir, args.nodes)?;
    let exe = std::env::current_exe().context("cannot find the weir executable")?;
    eprintln!(
        "weir cluster up: starting {} nodes in {}",
        cluster.node.len(),
        dir.display()
    );

    let mut nodes = Nodes(Vec::with_capacity(cluster.node.len()));
    for n in &cluster.node {
        nodes.0.push(start_node(&exe, &cluster, n, &dir)?);
    }

    let probes = cluster
        .node
        .iter()
        .map(|n| {
            let address = ClientArgs {
                bootstrap_server: format!("127.0.0.1:{}", n.kafka_port),
            };
            client::base_config(&address)
                .create_with_context::<_, BaseConsumer<CliContext>>(CliContext::default())
                .map_err(|e| anyhow::anyhow!("cannot create a Kafka client: {e}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut ready = vec![false; probes.len()];
    let deadline = Instant::now() + START_TIMEOUT;
    while ready.contains(&false) {
        let exited = nodes.0.iter_mut().find_map(|n| match n.child.try_wait() {
            Ok(Some(status)) => Some((n.id, n.log.clone(), status)),
            _ => None,
        });
        if let Some((id, log, status)) = exited {
            nodes.stop();
            anyhow::bail!(
                "node {id} exited during start-up ({status}); the others were stopped. \
                 The end of {}:\n{}",
                log.display(),
                log_tail(&log)
            );
        }
        if stop.load(Ordering::SeqCst) {
            nodes.stop();
            anyhow::bail!("interrupted during start-up; every node was stopped");
        }
        if Instant::now() >= deadline {
            let late: Vec<u8> = ready
                .iter()
                .zip(&cluster.node)
                .filter(|(r, _)| !**r)
                .map(|(_, n)| n.id)
                .collect();
            let mut tails = String::new();
            for id in &late {
                let log = node_log_path(&dir, *id);
                let _ = write!(tails, "\nThe end of {}:\n{}", log.display(), log_tail(&log));
            }
            nodes.stop();
            anyhow::bail!(
                "nodes {late:?} did not answer Metadata within {} s; every node was \
                 stopped.{tails}",
                START_TIMEOUT.as_secs()
            );
        }
        for (r, probe) in ready.iter_mut().zip(&probes) {
            if !*r {
                *r = answers_metadata(probe);
            }
        }
    }
    drop(probes);

    let mut out = format!("{}\n", cluster.bootstrap());
    for (node, ports) in nodes.0.iter().zip(&cluster.node) {
        let _ = writeln!(
            out,
            "# node {}: pid {}, admin http://127.0.0.1:{}, log {}\n{}",
            node.id,
            node.child.id(),
            ports.admin_port,
            node.log.display(),
            node.command_line
        );
    }
    let _ = writeln!(
        out,
        "# {} nodes up, data in {}; Ctrl-C stops them",
        nodes.0.len(),
        dir.display()
    );
    // Not print!: a closed stdout (`| head -1`) must not end the command with a panic.
    {
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        let _ = stdout
            .write_all(out.as_bytes())
            .and_then(|()| stdout.flush());
    }

    let mut reported = vec![false; nodes.0.len()];
    while !stop.load(Ordering::SeqCst) {
        for (i, node) in nodes.0.iter_mut().enumerate() {
            if reported[i] {
                continue;
            }
            if let Ok(Some(status)) = node.child.try_wait() {
                reported[i] = true;
                eprintln!(
                    "weir cluster up: node {} exited ({status}); the others keep running. \
                     The end of {}:\n{}",
                    node.id,
                    node.log.display(),
                    log_tail(&node.log)
                );
            }
        }
        std::thread::sleep(POLL_INTERVAL);
    }
    eprintln!("weir cluster up: stopping {} nodes", nodes.0.len());
    let killed = nodes.stop();
    if !killed.is_empty() {
        eprintln!(
            "weir cluster up: nodes {killed:?} did not stop within {} s of SIGTERM and were \
             killed",
            STOP_GRACE.as_secs()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picked_ports_are_distinct_and_make_the_voter_and_bootstrap_lists() {
        let file = pick_ports(3).unwrap();
        assert_eq!(file.validate(), Ok(()));
        let ids: Vec<u8> = file.node.iter().map(|n| n.id).collect();
        assert_eq!(ids, [1, 2, 3]);
        let n = &file.node[1];
        assert!(file
            .voters()
            .contains(&format!("2@127.0.0.1:{}", n.controller_port)));
        assert_eq!(file.voters().split(',').count(), 3);
        assert_eq!(
            file.bootstrap().split(',').nth(1),
            Some(format!("127.0.0.1:{}", n.kafka_port).as_str())
        );
        let overrides = file.overrides(n, Path::new("/d"));
        assert!(overrides.contains(&"node.id=2".to_string()));
        assert!(overrides.contains(&"log.dirs=/d/node-2".to_string()));
        assert!(overrides.contains(&format!(
            "listeners=PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}",
            n.kafka_port, n.controller_port
        )));
    }

    #[test]
    fn a_dir_keeps_its_ports_and_refuses_another_size() {
        let dir = std::env::temp_dir().join(format!("weir-cluster-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let first = load_or_create(&dir, None).unwrap();
        assert_eq!(first.node.len(), 3);
        assert_eq!(load_or_create(&dir, None).unwrap(), first);
        assert_eq!(load_or_create(&dir, Some(3)).unwrap(), first);
        let err = load_or_create(&dir, Some(5)).unwrap_err().to_string();
        assert!(err.contains("3 nodes, not 5"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_stored_file_with_repeated_ports_or_ids_is_refused() {
        let mut file = pick_ports(2).unwrap();
        file.node[1].admin_port = file.node[0].kafka_port;
        assert!(file.validate().unwrap_err().contains("twice"));
        let mut file = pick_ports(2).unwrap();
        file.node[1].id = 1;
        assert!(file.validate().is_err());
        assert!(ClusterFile { node: Vec::new() }.validate().is_err());
    }

    #[test]
    fn shell_quoting() {
        assert_eq!(
            shell_quote("log.dirs=/tmp/x/node-1"),
            "log.dirs=/tmp/x/node-1"
        );
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
