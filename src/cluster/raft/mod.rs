//! The controller quorum: `__cluster_metadata` as a Raft log, on openraft 0.9 (DESIGN.md
//! decision 4; Kafka's KRaft, KIP-500/KIP-595, with openraft's protocol in place of
//! KIP-595's pull-based one).
//!
//! Owns: [`RaftMetadataLog`], the [`MetadataLog`] of a broker: a Raft node whose log
//! entries are [`Proposal`]s (one metadata change, its [`MetadataRecord`]s), whose state
//! machine applies them to a [`MetadataImage`](super::MetadataImage) (`storage.rs`) and whose snapshots are that
//! image as records (a restart replays snapshot + tail). It runs on a runtime of its own
//! (two threads), so `Metadata`'s synchronous change path can block on a commit from any
//! thread, even a single-threaded runtime's, without starving Raft. A change is proposed
//! to the local Raft if it leads, else sent to the leader over the CONTROLLER listener
//! (`network.rs`); either way `append` returns once this node's state machine applied it.
//!
//! Single node (`controller.quorum.voters` empty): a one-voter quorum with no network,
//! elected at once at first start (openraft's `initialize` elects a sole voter at once)
//! and on restart (the committed vote restores it as leader; else an election is
//! triggered), so no change ever waits for an election timeout.
//!
//! Split roles (KIP-631): a controller-only node is a voter like any other; a
//! broker-only node is not a voter but a learner (KIP-595's observer): it asks the
//! leader to add it at its internal listener ([`join_as_learner`], `AddLearner`), then
//! receives and applies the log as a voter does, and proposes through the leader. A
//! learner is never removed (docs/cluster.md, "Broker-only and controller-only nodes").
//!
//! Upgrade: a data directory of the earlier file store (`topics/<name>.toml`,
//! `producer_id`) is migrated into the log once, at the first start on this version, as
//! one entry, with a log line; the old files are left as they were.
//!
//! Never does: decide what a change is (that is `cluster::topics`), or apply records to
//! the broker's image (`Metadata` does, from the [`CommittedQueue`], in log order).

mod network;
mod storage;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, Raft, RaftMetrics, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::brokers::BrokerSessions;
use super::image::MetadataRecord;
use super::store::{FileMetadataLog, MetadataLog};
use super::MetadataError;
use crate::config::QuorumVoter;

pub(crate) use storage::{Committed, CommittedChange, CommittedQueue};

/// One entry of `__cluster_metadata`: the records of one metadata change, applied all or
/// none (Kafka writes a change as one record batch, applied atomically likewise).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Proposal {
    /// The records, in order.
    pub(crate) records: Vec<MetadataRecord>,
    /// Random per metadata change, the same on every try of it: when the answer to a
    /// committed try is lost (the leader died or the RPC timed out after the commit) and
    /// the proposer tries again, the change can be in the log twice; the proposer takes
    /// the first copy that applied as its own ([`CommittedQueue::first_applied`]) instead
    /// of the second's refusal. The state machine ignores it, so every node applies the
    /// same entries the same way. `None` in entries written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) id: Option<uuid::Uuid>,
}

/// What the state machine made of an entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ProposalOutcome {
    /// Why the records were not applied (they did not apply to the image at the entry's
    /// position: another change committed first); `None` when applied.
    pub(crate) refused: Option<String>,
}

openraft::declare_raft_types!(
    /// weir's openraft types: node ids are Kafka node ids (`node.id`, ≥ 0), a node's
    /// address is its CONTROLLER listener (`HOST:PORT`), an entry is a [`Proposal`],
    /// snapshots are bytes in memory (the image as records, JSON).
    pub(crate) TypeConfig:
        D = Proposal,
        R = ProposalOutcome,
        NodeId = u64,
        Node = BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = std::io::Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// Longest a metadata change waits to be committed and applied (ms) before the caller
/// gets an error (the quorum is gone or no leader could be found).
pub(crate) const COMMIT_TIMEOUT_MS: u64 = 15_000;

/// Kafka's default `controller.quorum.election.timeout.ms` (ms), for tests (the key's
/// default lives in the key registry).
#[cfg(test)]
pub(crate) const DEFAULT_ELECTION_TIMEOUT_MS: u64 = 1000;

/// openraft's timing from `controller.quorum.election.timeout.ms` = T (ms), as
/// (heartbeat interval, election timeout min, max): the leader heartbeats every T/10 (at
/// most 100 ms, at least 10); a follower that saw a leader waits out that leader's lease
/// (openraft's, T) and then a random T/2..T before it stands, so a dead controller is
/// replaced 1.5T–2T after its last heartbeat (KRaft's own randomised backoff spans
/// T..2T). With the default 1000: 1.5–2 s.
fn raft_timing(election_timeout_ms: u64) -> (u64, u64, u64) {
    let heartbeat = (election_timeout_ms / 10).clamp(10, 100);
    (heartbeat, election_timeout_ms / 2, election_timeout_ms)
}

/// Longest the node that made a metadata change waits, after its own image has it, for
/// every other live broker's image to have it too (ms), before it answers anyway (with a
/// warning): a broker that is slow or unreachable but not fenced yet (up to
/// `broker.session.timeout.ms`) must not make every admin request hang. Brokers answer in
/// a few ms; Kafka's own brokers never wait (their metadata is eventually consistent), so
/// on timeout weir is as consistent as Kafka.
pub(crate) const AWAIT_APPLIED_TIMEOUT_MS: u64 = 1_000;

/// At most one warning per this many seconds that a change was answered before some
/// broker applied it (with how many were not logged since).
const AWAIT_APPLIED_WARN_EVERY_S: u64 = 10;

/// A snapshot is taken every this many entries; the log keeps as many behind it for
/// followers that lag a little (bounds the log and the restart replay).
pub(crate) const SNAPSHOT_EVERY_ENTRIES: u64 = 1000;

/// What a node needs to join (or be) the controller quorum.
#[derive(Debug)]
pub(crate) struct QuorumSettings {
    /// `<log.dirs>/__cluster_metadata`: the Raft files go under `raft/`; an earlier
    /// version's file store there is migrated.
    pub(crate) dir: PathBuf,
    /// The cluster id (KIP-78): the image's.
    pub(crate) cluster_id: String,
    /// This node's `node.id`.
    pub(crate) node_id: i32,
    /// The effective voters ([`crate::config::ClusterSettings::voters`]); one voter with
    /// this node's id and no address for a single node.
    pub(crate) voters: Vec<QuorumVoter>,
    /// The bound CONTROLLER listener, served on the Raft runtime (`None`: no peers dial
    /// this node — a single node).
    pub(crate) controller_listener: Option<std::net::TcpListener>,
    /// `controller.quorum.election.timeout.ms` ([`raft_timing`]).
    pub(crate) election_timeout_ms: u64,
    /// A node that is not a voter (a broker-only node): the `HOST:PORT` of its
    /// `controller_listener` (an internal one), where the leader replicates to it once it
    /// asked to be a learner ([`join_as_learner`]). `None` on a voter.
    pub(crate) learner_addr: Option<String>,
}

/// The Raft runtime and what runs on it; dropped (Raft shut down, files closed) when the
/// log is.
struct RaftRuntime {
    runtime: Option<tokio::runtime::Runtime>,
    raft: Raft<TypeConfig>,
    shutdown: watch::Sender<bool>,
}

/// Whether `raft` is the leader now (what a broker heartbeat needs of its receiver).
fn leads(raft: &Raft<TypeConfig>) -> bool {
    let m = raft.metrics();
    let m = m.borrow();
    m.state == ServerState::Leader && m.current_leader == Some(m.id)
}

/// The controller quorum as its leader describes it (DescribeQuorum, KIP-595 and
/// KIP-836): offsets are Raft log indexes, so an entry's offset is its index and an end
/// offset is one past the last entry (Kafka's convention).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct QuorumState {
    /// The leader's node id.
    pub(crate) leader_id: i32,
    /// The Raft term, KRaft's leader epoch.
    pub(crate) leader_epoch: i32,
    /// One past the last entry committed and applied on the leader; -1 when none is.
    pub(crate) high_watermark: i64,
    /// Every voter, by id.
    pub(crate) voters: Vec<VoterState>,
    /// Every learner (a broker-only node, KIP-595's observer), by id.
    #[serde(default)]
    pub(crate) observers: Vec<VoterState>,
}

/// One voter of [`QuorumState`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct VoterState {
    /// Its node id.
    pub(crate) id: i32,
    /// One past the last entry the leader knows it holds (the leader: its own log end);
    /// -1 when unknown.
    pub(crate) log_end_offset: i64,
    /// Its CONTROLLER listener `HOST:PORT` (empty on a single node).
    pub(crate) addr: String,
}

/// The quorum as `metrics` (the leader's) shows it, or `None` when they are not a
/// leader's: the term, the applied entry and the replication map with each voter's
/// matched log id.
fn quorum_state(
    m: &RaftMetrics<u64, BasicNode>,
    voters: &BTreeMap<u64, BasicNode>,
) -> Option<QuorumState> {
    if m.state != ServerState::Leader || m.current_leader != Some(m.id) {
        return None;
    }
    let end = |index: Option<u64>| {
        index
            .and_then(|i| i64::try_from(i).ok())
            .map_or(-1, |i| i + 1)
    };
    let replication = m.replication.as_ref();
    let membership = m.membership_config.membership();
    let mut ids: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
    ids.extend(voters.keys().copied());
    let state = |id: u64| {
        let log_end_offset = if id == m.id {
            end(m.last_log_index)
        } else {
            end(replication
                .and_then(|r| r.get(&id))
                .and_then(|matched| matched.as_ref().map(|l| l.index)))
        };
        Some(VoterState {
            id: i32::try_from(id).ok()?,
            log_end_offset,
            addr: voters
                .get(&id)
                .or_else(|| membership.get_node(&id))
                .map(|n| n.addr.clone())
                .unwrap_or_default(),
        })
    };
    let observers = membership
        .learner_ids()
        .filter(|id| !ids.contains(id))
        .filter_map(state)
        .collect();
    let voters = ids.iter().copied().filter_map(state).collect();
    Some(QuorumState {
        leader_id: i32::try_from(m.id).ok()?,
        leader_epoch: i32::try_from(m.current_term).unwrap_or(i32::MAX),
        high_watermark: end(m.last_applied.map(|l| l.index)),
        voters,
        observers,
    })
}

/// [`quorum_state`] of `raft` now, or why not (it does not lead).
pub(super) fn describe_local(
    raft: &Raft<TypeConfig>,
    voters: &BTreeMap<u64, BasicNode>,
) -> Result<QuorumState, String> {
    let m = raft.metrics();
    let m = m.borrow();
    quorum_state(&m, voters).ok_or_else(|| "not the active controller".to_string())
}

/// The quorum as the broker side sees it, without the metadata change lock: who leads
/// (DescribeCluster's `controller_id`), the leader's CONTROLLER address for
/// broker heartbeats, and, on the leader, the broker sessions. Holds Raft's metrics watch
/// only, no storage: it may outlive the log.
pub struct QuorumHandle {
    node_id: u64,
    /// This node as the sender of its Raft RPCs.
    me: Arc<network::Sender>,
    voters: BTreeMap<u64, BasicNode>,
    metrics: watch::Receiver<RaftMetrics<u64, BasicNode>>,
    sessions: Arc<BrokerSessions>,
    /// The Raft runtime, where [`QuorumHandle::await_applied_everywhere`]'s RPCs run (a
    /// handle: once the runtime is gone, nothing is sent and nothing is waited for).
    runtime: tokio::runtime::Handle,
    /// When a change was last answered before some broker applied it was logged, and how
    /// many such changes were not logged since (rate limit of the warning).
    lag_warned: std::sync::Mutex<(Option<Instant>, u64)>,
    /// This process's incarnation id (KIP-631): random per start, what its broker
    /// registers with.
    incarnation_id: uuid::Uuid,
}

impl std::fmt::Debug for QuorumHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuorumHandle")
            .field("node_id", &self.node_id)
            .field("voters", &self.voters)
            .finish_non_exhaustive()
    }
}

/// A broker's connection to the active controller for heartbeats (remade when the leader
/// changes or a call fails).
#[derive(Debug, Default)]
pub(crate) struct HeartbeatClient {
    leader: Option<u64>,
    conn: Option<tokio::net::TcpStream>,
}

impl QuorumHandle {
    /// The node id of the quorum leader (the active controller), if one is known.
    pub(crate) fn leader(&self) -> Option<i32> {
        let leader = self.metrics.borrow().current_leader;
        leader.and_then(|l| i32::try_from(l).ok())
    }

    /// This process's incarnation id (random per start; KIP-631's `incarnationId`).
    pub(crate) fn incarnation_id(&self) -> uuid::Uuid {
        self.incarnation_id
    }

    /// How many voters the quorum has (1: a single node).
    pub(crate) fn voter_count(&self) -> usize {
        self.voters.len()
    }

    /// Whether this node is a voter of the quorum (a controller); `false` on a
    /// broker-only node, a learner.
    pub(crate) fn is_voter(&self) -> bool {
        self.voters.contains_key(&self.node_id)
    }

    /// Whether this node is the active controller now.
    pub(crate) fn is_leader(&self) -> bool {
        let m = self.metrics.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.node_id)
    }

    /// The broker sessions this node keeps while it leads.
    pub(crate) fn sessions(&self) -> &BrokerSessions {
        &self.sessions
    }

    /// The quorum as its leader describes it: computed here when this node leads, else
    /// asked of the leader over its CONTROLLER listener (within `ttl`), as a Kafka broker
    /// forwards DescribeQuorum to the active controller.
    ///
    /// Errors: no leader known, or it cannot be reached or does not lead any more, as text.
    pub(crate) async fn describe(&self, ttl: Duration) -> Result<QuorumState, String> {
        let leader = self.metrics.borrow().current_leader;
        let Some(leader) = leader else {
            return Err("no active controller known".to_string());
        };
        if leader == self.node_id {
            let m = self.metrics.borrow();
            return quorum_state(&m, &self.voters)
                .ok_or_else(|| "this node is not the active controller yet".to_string());
        }
        let Some(node) = self.voters.get(&leader) else {
            return Err(format!("the active controller {leader} is not a voter"));
        };
        network::describe_at(&node.addr, &self.me, ttl).await
    }

    /// Waits until every other live broker of `image` (registered and unfenced) has the
    /// entry at `index` in its image, asking each over its CONTROLLER listener in parallel
    /// (`AwaitApplied`), at most [`AWAIT_APPLIED_TIMEOUT_MS`] (plus the RPCs' grace); then
    /// returns whatever they answered, logging a (rate-limited) warning naming the brokers
    /// that had not applied it. Called by the node that made the change, once its own
    /// image has it and outside the change lock, so a change answered to a client is seen
    /// by every broker's metadata readers. Blocks the calling thread (the RPCs run on the
    /// Raft runtime). A single node, or no other live broker: returns at once, no RPC.
    pub(crate) fn await_applied_everywhere(&self, index: u64, image: &super::MetadataImage) {
        // A broker's Raft address: its CONTROLLER listener when it is a voter (combined
        // mode), else the internal listener it joined the quorum as a learner at. A live
        // broker with neither (not a learner yet) is not waited for.
        let nodes = self.metrics.borrow().membership_config.nodes().fold(
            BTreeMap::new(),
            |mut nodes, (id, node)| {
                nodes.insert(*id, node.addr.clone());
                nodes
            },
        );
        let targets: Vec<(u64, String)> = image
            .live_brokers()
            .filter_map(|b| u64::try_from(b.broker_id).ok())
            .filter(|id| *id != self.node_id)
            .filter_map(|id| {
                let addr = self.voters.get(&id).map(|n| n.addr.clone());
                Some((id, addr.or_else(|| nodes.get(&id).cloned())?))
            })
            .collect();
        if targets.is_empty() {
            return;
        }
        let bound = Duration::from_millis(AWAIT_APPLIED_TIMEOUT_MS);
        let me = self.me.clone();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        // Dropped unsent (tx with it) when the runtime is shut down: `recv` returns then.
        let task = self.runtime.spawn(async move {
            let lagging = network::await_applied_all(targets, index, bound, |addr, index, wait| {
                let me = me.clone();
                async move { network::await_applied_at(&addr, &me, index, wait).await }
            })
            .await;
            let _ = tx.send(lagging);
        });
        // Detached: it ends within the bound, waited for below.
        drop(task);
        let lagging = match rx.recv_timeout(bound + network::AWAIT_APPLIED_GRACE * 2) {
            Ok(lagging) => lagging,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                vec![(
                    u64::MAX,
                    network::Lagging::Failed("no answer in time".into()),
                )]
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
        };
        if !lagging.is_empty() {
            self.warn_lagging(index, &lagging);
        }
    }

    /// The warning of [`Self::await_applied_everywhere`], at most once every
    /// [`AWAIT_APPLIED_WARN_EVERY_S`].
    fn warn_lagging(&self, index: u64, lagging: &[(u64, network::Lagging)]) {
        let now = Instant::now();
        let suppressed = {
            let mut warned = self.lag_warned.lock().expect("lag warning lock poisoned");
            let due = warned.0.is_none_or(|at| {
                now.duration_since(at) >= Duration::from_secs(AWAIT_APPLIED_WARN_EVERY_S)
            });
            if !due {
                warned.1 += 1;
                return;
            }
            let suppressed = warned.1;
            *warned = (Some(now), 0);
            suppressed
        };
        let brokers = lagging
            .iter()
            .map(|(node, l)| {
                let node = if *node == u64::MAX {
                    "all".to_string()
                } else {
                    format!("broker {node}")
                };
                match l {
                    network::Lagging::Behind(at) => format!("{node} had applied up to {at}"),
                    network::Lagging::Failed(why) => format!("{node} did not answer: {why}"),
                }
            })
            .collect::<Vec<_>>()
            .join("; ");
        tracing::warn!(
            index,
            suppressed,
            "metadata change answered before every live broker applied it (waited at most {AWAIT_APPLIED_TIMEOUT_MS} ms): {brokers}; such warnings are logged at most every {AWAIT_APPLIED_WARN_EVERY_S} s, {suppressed} not logged since the last"
        );
    }

    /// Tells the active controller that `broker_id` at `broker_epoch` is alive: noted here
    /// when this node leads, else sent to the leader's CONTROLLER listener (within `ttl`).
    ///
    /// Errors: no leader known, or it cannot be reached or does not lead any more, as text.
    pub(crate) async fn heartbeat(
        &self,
        client: &mut HeartbeatClient,
        broker_id: i32,
        broker_epoch: i64,
        ttl: Duration,
    ) -> Result<(), String> {
        let leader = self.metrics.borrow().current_leader;
        let Some(leader) = leader else {
            return Err("no active controller known".to_string());
        };
        if leader == self.node_id {
            if !self.is_leader() {
                return Err("this node is not the active controller yet".to_string());
            }
            self.sessions
                .record(broker_id, broker_epoch, Instant::now());
            return Ok(());
        }
        let Some(node) = self.voters.get(&leader) else {
            return Err(format!("the active controller {leader} is not a voter"));
        };
        if client.leader != Some(leader) {
            client.leader = Some(leader);
            client.conn = None;
        }
        network::heartbeat_at(
            &mut client.conn,
            &node.addr,
            &self.me,
            broker_id,
            broker_epoch,
            ttl,
        )
        .await
    }
}

/// The replicated [`MetadataLog`]: see the module doc.
pub(crate) struct RaftMetadataLog {
    rt: RaftRuntime,
    quorum: Arc<QuorumHandle>,
    machine: storage::StateMachine,
    queue: Arc<CommittedQueue>,
    node_id: u64,
    voters: BTreeMap<u64, BasicNode>,
    /// Entries up to here are in what `replay` returned: dropped from the queue.
    replayed_through: u64,
    /// A broker-only node: whether the leader made it a learner (set by
    /// [`join_as_learner`]); `None` on a voter.
    joined: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// Tests: the next committed try's answer is dropped, as a lost RPC reply would be.
    #[cfg(test)]
    lose_next_answer: std::sync::atomic::AtomicBool,
    /// Tests: changes `append` found committed twice.
    #[cfg(test)]
    committed_twice: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for RaftMetadataLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftMetadataLog")
            .field("node_id", &self.node_id)
            .field("voters", &self.voters)
            .finish_non_exhaustive()
    }
}

fn raft_error(what: &str, e: impl std::fmt::Display) -> MetadataError {
    MetadataError::Unsupported(format!("metadata quorum: {what}: {e}"))
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> MetadataError + '_ {
    move |source| MetadataError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Runs `fut` on `runtime` and waits for it from this thread (any thread, even one of
/// another runtime, where `block_on` is not allowed), at most `timeout`.
fn run_on<T: Send + 'static>(
    runtime: &tokio::runtime::Runtime,
    timeout: Duration,
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv_timeout(timeout).ok()
}

impl RaftRuntime {
    /// [`run_on`] the Raft runtime.
    fn run<T: Send + 'static>(
        &self,
        timeout: Duration,
        fut: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Option<T> {
        run_on(self.runtime.as_ref()?, timeout, fut)
    }
}

impl Drop for RaftRuntime {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        let raft = self.raft.clone();
        // A runtime is neither blocked on nor dropped inside another one's context (this
        // may run on a broker worker): do both on a thread of its own, and wait for it,
        // so every file of the log is closed when the log is dropped.
        let stopper = std::thread::Builder::new()
            .name("weir-raft-stop".into())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = tokio::time::timeout(Duration::from_secs(5), raft.shutdown()).await;
                });
                runtime.shutdown_timeout(Duration::from_secs(5));
            });
        if let Ok(t) = stopper {
            let _ = t.join();
        }
    }
}

impl RaftMetadataLog {
    /// Starts this node's Raft on `settings`: opens the log and the state machine under
    /// `<dir>/raft/` (replaying snapshot + committed tail), forms the quorum at first
    /// start (every voter initialises the same membership: openraft allows it), serves
    /// the CONTROLLER listener, and on a single node waits (at most
    /// [`COMMIT_TIMEOUT_MS`]) until it leads with everything committed applied. Migrates
    /// an earlier version's file store at first start.
    ///
    /// Errors: [`MetadataError`]: the files cannot be read or written, openraft refuses
    /// to start, a single node does not become leader, the migration fails, or a node of
    /// a multi-voter quorum has a file store to migrate (migrate as a single node first).
    pub(crate) fn open(settings: QuorumSettings) -> Result<RaftMetadataLog, MetadataError> {
        let raft_dir = settings.dir.join("raft");
        let node_id = u64::try_from(settings.node_id)
            .map_err(|_| raft_error("node.id", "negative node id"))?;
        let voters: BTreeMap<u64, BasicNode> = settings
            .voters
            .iter()
            .filter_map(|v| {
                let id = u64::try_from(v.id).ok()?;
                Some((id, BasicNode::new(format!("{}:{}", v.host, v.port))))
            })
            .collect();
        let single_node = voters.len() == 1 && voters.contains_key(&node_id);
        let is_voter = voters.contains_key(&node_id);
        if !is_voter && settings.learner_addr.is_none() {
            return Err(raft_error(
                "start",
                "a node that is not a voter needs a Raft address to be a learner at",
            ));
        }
        let incarnation_id = uuid::Uuid::new_v4();
        let me = Arc::new(network::Sender {
            node_id,
            incarnation_id: Some(incarnation_id),
            cluster_id: settings.cluster_id.clone(),
            voters: voters
                .iter()
                .map(|(id, node)| format!("{id}@{}", node.addr))
                .collect::<Vec<_>>()
                .join(","),
        });
        let log = storage::LogStore::open(&raft_dir).map_err(io_error(&raft_dir))?;
        let pristine = log.is_pristine();
        let queue = Arc::new(CommittedQueue::default());
        let machine = storage::StateMachine::open(
            &raft_dir,
            &settings.cluster_id,
            settings.node_id,
            queue.clone(),
        )
        .map_err(io_error(&raft_dir))?;

        // The earlier file store: only migrated into a log that holds nothing yet.
        let legacy = if pristine {
            legacy_records(&settings.dir, settings.node_id)?
        } else {
            Vec::new()
        };
        if !legacy.is_empty() && !single_node {
            return Err(raft_error(
                "upgrade",
                "this data directory holds a single-node file store (__cluster_metadata/topics); start it once as a single node (no controller.quorum.voters) to migrate it",
            ));
        }

        let (heartbeat_interval, election_timeout_min, election_timeout_max) =
            raft_timing(settings.election_timeout_ms);
        let config = openraft::Config {
            cluster_name: "weir".into(),
            heartbeat_interval,
            election_timeout_min,
            election_timeout_max,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(SNAPSHOT_EVERY_ENTRIES),
            max_in_snapshot_log_to_keep: SNAPSHOT_EVERY_ENTRIES,
            ..Default::default()
        }
        .validate()
        .map_err(|e| raft_error("config", e))?;

        let sessions = Arc::new(BrokerSessions::default());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("weir-raft")
            .enable_all()
            .build()
            .map_err(|e| raft_error("runtime", e))?;
        let timeout = Duration::from_millis(COMMIT_TIMEOUT_MS);
        let raft = {
            let (log, machine) = (log.clone(), machine.clone());
            let peers = network::Peers {
                me: me.clone(),
                sessions: sessions.clone(),
            };
            let started = run_on(&runtime, timeout, async move {
                Raft::new(node_id, Arc::new(config), peers, log, machine).await
            });
            match started {
                Some(Ok(raft)) => raft,
                Some(Err(e)) => {
                    runtime.shutdown_background();
                    return Err(raft_error("start", e));
                }
                None => {
                    runtime.shutdown_background();
                    return Err(raft_error("start", "timed out"));
                }
            }
        };
        let (shutdown, shutdown_rx) = watch::channel(false);
        // From here on, dropping `rt` stops Raft and the runtime properly.
        let rt = RaftRuntime {
            runtime: Some(runtime),
            raft: raft.clone(),
            shutdown,
        };
        if let Some(runtime) = &rt.runtime {
            runtime.spawn(log_leader_changes(raft.clone(), shutdown_rx.clone()));
        }
        let joined = match (&settings.learner_addr, &rt.runtime) {
            (Some(addr), Some(runtime)) if !is_voter => {
                let joined = Arc::new(std::sync::atomic::AtomicBool::new(false));
                runtime.spawn(join_as_learner(
                    raft.clone(),
                    me.clone(),
                    voters.clone(),
                    addr.clone(),
                    joined.clone(),
                    shutdown_rx.clone(),
                ));
                Some(joined)
            }
            _ => None,
        };
        let Some(runtime_handle) = rt.runtime.as_ref().map(|r| r.handle().clone()) else {
            return Err(raft_error("start", "no runtime"));
        };
        let quorum = Arc::new(QuorumHandle {
            node_id,
            me: me.clone(),
            voters: voters.clone(),
            metrics: raft.metrics(),
            sessions: sessions.clone(),
            runtime: runtime_handle,
            lag_warned: std::sync::Mutex::new((None, 0)),
            incarnation_id,
        });
        if let (Some(listener), Some(runtime)) = (settings.controller_listener, &rt.runtime) {
            let listener = {
                let _guard = runtime.enter();
                listener
                    .set_nonblocking(true)
                    .and_then(|()| tokio::net::TcpListener::from_std(listener))
                    .map_err(|e| raft_error("controller listener", e))?
            };
            runtime.spawn(network::serve(
                listener,
                network::Served {
                    me,
                    raft: raft.clone(),
                    sessions,
                    voters: voters.clone(),
                    visible: queue.clone(),
                    machine: machine.clone(),
                    incarnation_id,
                    verified: std::sync::Mutex::default(),
                },
                shutdown_rx,
            ));
        }
        let mut me = RaftMetadataLog {
            rt,
            quorum,
            machine,
            queue,
            node_id,
            voters,
            replayed_through: 0,
            joined,
            #[cfg(test)]
            lose_next_answer: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            committed_twice: std::sync::atomic::AtomicU64::new(0),
        };
        if !pristine {
            // The membership is the log's (no membership change is served yet): a voter
            // set that differs from it is a misconfiguration, not a change.
            let formed = storage::formed_voters(&log, &me.machine);
            let configured: std::collections::BTreeSet<u64> = me.voters.keys().copied().collect();
            if !formed.is_empty() && formed != configured {
                return Err(MetadataError::Unsupported(format!(
                    "controller.quorum.voters names node ids {configured:?}, but this node's metadata log was formed by voters {formed:?} (changing the quorum is not supported yet)"
                )));
            }
        }
        // A learner never forms the quorum: the voters do, and the leader adds it.
        if pristine && is_voter {
            let members = me.voters.clone();
            let init = me
                .rt
                .run(timeout, async move { raft.initialize(members).await })
                .ok_or_else(|| raft_error("initialize", "timed out"))?;
            match init {
                Ok(()) => {}
                // Another voter's AppendEntries got here first: already formed.
                Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                Err(e) => return Err(raft_error("initialize", e)),
            }
        }
        if single_node {
            me.become_single_node_leader(timeout)?;
        }
        if !legacy.is_empty() {
            let topics = legacy
                .iter()
                .filter(|r| matches!(r, MetadataRecord::TopicCreated(_)))
                .count();
            me.append(&legacy)?;
            // What the migration applied is part of the start-up image, not news.
            me.queue.drain();
            tracing::info!(
                topics,
                dir = %settings.dir.display(),
                "migrated the single-node metadata file store into the metadata log __cluster_metadata (once; the old files are left as they were)"
            );
        }
        Ok(me)
    }

    /// A sole voter leads at once: restored as leader from its committed vote, else
    /// elected now; then everything in its log is committed and applied.
    fn become_single_node_leader(&self, timeout: Duration) -> Result<(), MetadataError> {
        let raft = self.rt.raft.clone();
        let node_id = self.node_id;
        let result = self
            .rt
            .run(timeout, async move {
                if raft.metrics().borrow().current_leader != Some(node_id) {
                    raft.trigger().elect().await.map_err(|e| e.to_string())?;
                }
                raft.wait(Some(timeout))
                    .state(ServerState::Leader, "single node leads")
                    .await
                    .map_err(|e| e.to_string())?;
                raft.ensure_linearizable()
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
            .ok_or_else(|| raft_error("election", "timed out"))?;
        result.map_err(|e| raft_error("election", e))
    }

    /// Proposes `proposal` to the local Raft, or to the leader it names, retrying while
    /// a leader is being elected, until `deadline`. Returns the entry's offset.
    fn propose(&self, proposal: Proposal, deadline: Instant) -> Result<u64, MetadataError> {
        let mut last_error = String::from("no leader");
        while Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            let raft = self.rt.raft.clone();
            let p = proposal.clone();
            let result = self
                .rt
                .run(left, async move { raft.client_write(p).await })
                .ok_or_else(|| raft_error("commit", "timed out"))?;
            let leader = match result {
                #[cfg(test)]
                Ok(_)
                    if self
                        .lose_next_answer
                        .swap(false, std::sync::atomic::Ordering::SeqCst) =>
                {
                    // As when a committed try's answer is lost: the loop tries again.
                    None
                }
                Ok(r) => return Ok(r.log_id.index),
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => f.leader_node,
                Err(e) => return Err(raft_error("commit", e)),
            };
            // No leader known here (a node no leader replicates to, such as a second
            // process with a voter's id on another host): the other voters may know one.
            let leader = match leader {
                Some(node) => Some(node),
                None => self.leader_from_peers(left),
            };
            if let Some(node) = leader {
                let p = proposal.clone();
                let me = self.quorum.me.clone();
                let ttl = left.min(Duration::from_secs(5));
                let sent = self
                    .rt
                    .run(left, async move {
                        network::propose_at(&node.addr, &me, p, ttl).await
                    })
                    .ok_or_else(|| raft_error("commit", "timed out"))?;
                match sent {
                    Ok(offset) => return Ok(offset),
                    Err(network::ProposeError::DuplicateBrokerRegistration(why)) => {
                        return Err(MetadataError::DuplicateBrokerRegistration(why))
                    }
                    Err(network::ProposeError::Failed(e)) => last_error = e,
                }
            }
            // No leader known yet, or it just lost the lead: an election is under way.
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(raft_error("commit", format!("timed out: {last_error}")))
    }
}

impl RaftMetadataLog {
    /// The leader another voter names (asked in turn, [`LEADER_QUERY_TTL`] each, within
    /// `left`), when this node knows none.
    fn leader_from_peers(&self, left: Duration) -> Option<BasicNode> {
        let peers: Vec<(u64, String)> = self
            .voters
            .iter()
            .filter(|(id, _)| **id != self.node_id)
            .map(|(id, n)| (*id, n.addr.clone()))
            .collect();
        let me = self.quorum.me.clone();
        let ttl = left.min(LEADER_QUERY_TTL);
        let leader = self
            .rt
            .run(left, async move {
                for (_, addr) in peers {
                    if let Ok(Some(leader)) = network::leader_at(&addr, &me, ttl).await {
                        return Some(leader);
                    }
                }
                None
            })
            .flatten()?;
        // Even when it names this node's id: then another process with this id leads
        // (a duplicate), and it refuses this node's registration with 101.
        self.voters.get(&leader).cloned()
    }
}

/// How often a broker-only node asks again to be made a learner while no leader did.
const JOIN_RETRY: Duration = Duration::from_millis(200);

/// A broker-only node (not a voter) asks the quorum leader, over its CONTROLLER
/// listener, to make it a learner replicated to at `addr` (`AddLearner`), every
/// [`JOIN_RETRY`] until one does; then sets `joined`, logs, and ends. A learner is never
/// removed (docs/cluster.md, "Broker-only and controller-only nodes"): a restart asks
/// again and moves it to its new address if that changed. Ends on `shutdown`.
async fn join_as_learner(
    raft: Raft<TypeConfig>,
    me: Arc<network::Sender>,
    voters: BTreeMap<u64, BasicNode>,
    addr: String,
    joined: Arc<std::sync::atomic::AtomicBool>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut warned = false;
    // After a failed attempt at the leader this node knows (it may be dead: a restarted
    // learner hears of a new one only once it replicates here), ask the voters instead.
    let mut ask_voters = false;
    loop {
        let known = raft.metrics().borrow().current_leader;
        let mut leader = known
            .filter(|_| !ask_voters)
            .and_then(|l| voters.get(&l).cloned());
        if leader.is_none() {
            for node in voters.values() {
                if let Ok(Some(l)) = network::leader_at(&node.addr, &me, LEADER_QUERY_TTL).await {
                    leader = voters.get(&l).cloned();
                    break;
                }
            }
        }
        let result = match &leader {
            Some(node) => {
                network::add_learner_at(&node.addr, &me, &addr, Duration::from_secs(5)).await
            }
            None => Err("no active controller known".to_string()),
        };
        match result {
            Ok(()) => {
                joined.store(true, std::sync::atomic::Ordering::SeqCst);
                tracing::info!(
                    "metadata quorum: this broker-only node is a learner at {addr}: the active controller replicates __cluster_metadata to it"
                );
                return;
            }
            Err(why) if !warned => {
                warned = true;
                ask_voters = !ask_voters;
                tracing::warn!("metadata quorum: not a learner yet, asking again: {why}");
            }
            Err(why) => {
                ask_voters = !ask_voters;
                tracing::debug!("metadata quorum: not a learner yet: {why}")
            }
        }
        tokio::select! {
            _ = shutdown.changed() => return,
            () = tokio::time::sleep(JOIN_RETRY) => {}
        }
    }
}

/// How long a node that knows no leader waits for each other voter to name one.
const LEADER_QUERY_TTL: Duration = Duration::from_millis(500);

/// Logs each change of quorum leader (`quorum_leader=ID term=T`, `-1`: none known) until
/// `shutdown`: what an operator (and the three-node test) reads to find the active
/// controller until DescribeQuorum is served.
async fn log_leader_changes(raft: Raft<TypeConfig>, mut shutdown: watch::Receiver<bool>) {
    let mut metrics = raft.metrics();
    let mut last = None;
    loop {
        let (leader, term) = {
            let m = metrics.borrow();
            (m.current_leader, m.current_term)
        };
        if last != Some(leader) {
            let id = leader.and_then(|l| i64::try_from(l).ok()).unwrap_or(-1);
            tracing::info!("metadata quorum: quorum_leader={id} term={term}");
            last = Some(leader);
        }
        tokio::select! {
            _ = shutdown.changed() => return,
            changed = metrics.changed() => if changed.is_err() { return },
        }
    }
}

/// The records of an earlier version's file store under `dir`, if it has any topic or
/// producer id reservation (what is migrated).
fn legacy_records(dir: &Path, node_id: i32) -> Result<Vec<MetadataRecord>, MetadataError> {
    if !dir.join("topics").is_dir() && !dir.join("producer_id").is_file() {
        return Ok(Vec::new());
    }
    let mut file = FileMetadataLog::open(dir, node_id)?;
    file.replay()
}

impl MetadataLog for RaftMetadataLog {
    fn replay(&mut self) -> Result<Vec<MetadataRecord>, MetadataError> {
        // One consistent read: the image and the last entry in it. Queued entries up to
        // that one are dropped by `take_committed`.
        let (image, applied) = self.machine.applied();
        self.replayed_through = applied;
        // The image `Metadata` starts from holds everything up to here.
        self.queue.mark_visible(applied);
        Ok(image.to_records())
    }

    fn append(&mut self, records: &[MetadataRecord]) -> Result<Option<u64>, MetadataError> {
        let deadline = Instant::now() + Duration::from_millis(COMMIT_TIMEOUT_MS);
        if let Some(joined) = &self.joined {
            // A learner proposes only once the leader replicates to it at its current
            // address: its registration must not come before (a connect refused at a
            // previous incarnation's address would count against the new one), and it
            // could never apply its own change otherwise.
            while !joined.load(std::sync::atomic::Ordering::SeqCst) {
                if Instant::now() >= deadline {
                    return Err(raft_error(
                        "commit",
                        "timed out: not a learner of the quorum yet (no leader answered AddLearner)",
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let id = uuid::Uuid::new_v4();
        let offset = self.propose(
            Proposal {
                records: records.to_vec(),
                id: Some(id),
            },
            deadline,
        )?;
        // The entry is committed; wait for this node's state machine to have applied it
        // (at once when this node leads).
        let left = deadline.saturating_duration_since(Instant::now());
        if !self.queue.wait_for(Some(offset), left) {
            return Err(raft_error(
                "commit",
                format!("entry {offset} committed but not applied here in time"),
            ));
        }
        // A try whose answer was lost may have committed before the one answered: that
        // first copy is this change (the later one was refused, or applied again).
        match self.queue.first_applied(id) {
            Some(first) if first < offset => {
                #[cfg(test)]
                self.committed_twice
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tracing::info!(
                    "metadata quorum: a metadata change was committed twice (the answer to entry {first} was lost and it was proposed again as entry {offset}); entry {first} is the change"
                );
                Ok(Some(first))
            }
            _ => Ok(Some(offset)),
        }
    }

    fn take_committed(&mut self) -> Vec<Committed> {
        let through = self.replayed_through;
        self.queue
            .drain()
            .into_iter()
            .filter(|c| c.offset > through)
            .collect()
    }

    fn committed_queue(&self) -> Option<Arc<CommittedQueue>> {
        Some(self.queue.clone())
    }

    fn quorum(&self) -> Option<Arc<QuorumHandle>> {
        Some(self.quorum.clone())
    }

    #[cfg(test)]
    fn lose_next_answer(&self) {
        self.lose_next_answer
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    #[cfg(test)]
    fn changes_committed_twice(&self) -> u64 {
        self.committed_twice
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The image a quorum's state machine holds now, for tests.
#[cfg(test)]
impl RaftMetadataLog {
    fn machine_image(&self) -> Arc<super::MetadataImage> {
        self.machine.applied().0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::image::{PartitionState, TopicMeta};

    #[test]
    fn the_election_timeout_key_sets_openraft_timing_it_accepts() {
        assert_eq!(raft_timing(DEFAULT_ELECTION_TIMEOUT_MS), (100, 500, 1000));
        // The smallest value the key takes (100) still validates.
        let (heartbeat_interval, election_timeout_min, election_timeout_max) = raft_timing(100);
        assert_eq!((heartbeat_interval, election_timeout_min), (10, 50));
        let config = openraft::Config {
            heartbeat_interval,
            election_timeout_min,
            election_timeout_max,
            ..Default::default()
        };
        assert!(config.validate().is_ok());
    }

    fn single(dir: &Path) -> QuorumSettings {
        QuorumSettings {
            dir: dir.to_path_buf(),
            cluster_id: "c".into(),
            node_id: 1,
            voters: vec![QuorumVoter {
                id: 1,
                host: String::new(),
                port: 0,
            }],
            controller_listener: None,
            election_timeout_ms: DEFAULT_ELECTION_TIMEOUT_MS,
            learner_addr: None,
        }
    }

    fn topic(name: &str) -> MetadataRecord {
        MetadataRecord::TopicCreated(TopicMeta {
            name: name.into(),
            id: uuid::Uuid::new_v4(),
            partitions: 1,
            replication_factor: 1,
            configs: Default::default(),
            partition_states: vec![PartitionState::single_node(1)].into(),
        })
    }

    #[test]
    fn a_single_node_commits_at_once_and_replays_after_restart() {
        let dir = tempfile::tempdir().unwrap();
        let started = Instant::now();
        let mut log = RaftMetadataLog::open(single(dir.path())).unwrap();
        assert!(log.replay().unwrap().is_empty());
        for i in 0..20 {
            let offset = log.append(&[topic(&format!("t{i}"))]).unwrap().unwrap();
            let committed = log.take_committed();
            assert_eq!(committed.len(), 1);
            assert_eq!(committed[0].offset, offset);
        }
        // A conflicting change is refused by the state machine, the same on every node.
        let MetadataRecord::TopicCreated(t0) = topic("t0") else {
            unreachable!()
        };
        log.append(&[MetadataRecord::TopicCreated(t0)]).unwrap();
        let refused = log.take_committed();
        assert!(matches!(refused[0].change, CommittedChange::Refused(_)));
        // No election timeout on the single-node path.
        assert!(
            started.elapsed() < Duration::from_millis(DEFAULT_ELECTION_TIMEOUT_MS * 2),
            "{:?}",
            started.elapsed()
        );
        let image = log.machine_image();
        drop(log);
        let started = Instant::now();
        let mut log = RaftMetadataLog::open(single(dir.path())).unwrap();
        let records = log.replay().unwrap();
        assert_eq!(records.len(), 20);
        assert_eq!(log.machine_image().topic_count(), image.topic_count());
        log.append(&[topic("after")]).unwrap();
        assert!(started.elapsed() < Duration::from_millis(DEFAULT_ELECTION_TIMEOUT_MS * 2));
    }

    #[test]
    fn a_change_tried_again_after_a_lost_answer_is_the_first_copy_not_the_refused_second() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RaftMetadataLog::open(single(dir.path())).unwrap();
        log.replay().unwrap();
        log.append(&[topic("before")]).unwrap();
        log.take_committed();
        // The first try commits, its answer is lost, the proposer tries again: the log
        // holds the change twice, and the second copy is refused (the topic exists).
        log.lose_next_answer();
        let offset = log.append(&[topic("twice")]).unwrap().unwrap();
        let committed = log.take_committed();
        assert_eq!(committed.len(), 2, "{committed:?}");
        assert!(matches!(committed[0].change, CommittedChange::Records(_)));
        assert!(matches!(committed[1].change, CommittedChange::Refused(_)));
        assert_eq!(committed[0].proposal_id, committed[1].proposal_id);
        // The proposer is told of the copy that applied.
        assert_eq!(offset, committed[0].offset);
        assert!(log.machine_image().topic("twice").is_some());
        // A change that conflicts with another proposal's is still refused.
        let MetadataRecord::TopicCreated(mut again) = topic("twice") else {
            unreachable!()
        };
        again.id = uuid::Uuid::new_v4();
        let offset = log
            .append(&[MetadataRecord::TopicCreated(again)])
            .unwrap()
            .unwrap();
        let committed = log.take_committed();
        assert_eq!(committed.len(), 1);
        assert_eq!(committed[0].offset, offset);
        assert!(matches!(committed[0].change, CommittedChange::Refused(_)));
    }
}
