//! Raft RPCs over the CONTROLLER listener: weir's own small framing, not Kafka's
//! KRaft RPCs (Vote, BeginQuorumEpoch, Fetch with a replica id: KIP-595), which a Kafka
//! tool never sends to a weir controller anyway.
//!
//! Owns: the frame (4-byte big-endian length, at most [`MAX_RPC_BYTES`], then one
//! [`RaftRpc`] or [`RaftRpcReply`] as JSON with openraft's serde types), the client side
//! (`Peers`: one lazily connected TCP stream per peer and openraft client, request then
//! reply, each under openraft's deadline) and the server side ([`serve`]: the accept loop
//! of the CONTROLLER listener, at most [`MAX_CONTROLLER_CONNECTIONS`], handing each
//! request to the local `Raft`). `Propose` carries a metadata change from a node that is
//! not the Raft leader to the one that is (forwarding at the log level: the leader
//! appends, the proposer waits for its own state machine to apply the entry).
//! `AwaitApplied` is answered once this broker's image holds an entry (or at a timeout):
//! the node that made a change asks every other live broker before it answers
//! ([`await_applied_all`], bounded). On the leader, a `Propose` holding a broker
//! registration of a `node.id` another live broker holds is refused with
//! DUPLICATE_BROKER_REGISTRATION (101) before it is appended
//! (`brokers::duplicate_registration`). `Leader` tells a node that knows no leader who
//! leads. `AddLearner` makes a broker-only node (not a voter) a Raft learner at its
//! internal listener, which this same [`serve`] answers on. A vote request is served only
//! from the process listening at the named voter's
//! address (`Identify`, [`voter_refusal`]): a second process with a voter's id elsewhere
//! never votes (docs/cluster.md, DUPLICATE_BROKER_REGISTRATION).
//!
//! Never does: interpret metadata records, or trust the frame length before checking it.
//! The listener trusts its peers as Kafka's PLAINTEXT controller listener does: bind it
//! to an address only the quorum reaches.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Raft};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

use super::storage::StateMachine;
use super::{
    describe_local, leads, BrokerSessions, CommittedQueue, Proposal, QuorumState, TypeConfig,
};
use crate::cluster::brokers::{duplicate_registration, HeartbeatConnection};
use crate::cluster::image::MetadataRecord;

type NodeId = u64;

/// Largest frame read from a peer (bytes): an AppendEntries of `max_payload_entries`
/// metadata changes or a snapshot chunk fit well below it.
pub(crate) const MAX_RPC_BYTES: usize = 64 << 20;

/// Most connections the CONTROLLER listener serves at once (a quorum of 5 needs ~10).
pub(crate) const MAX_CONTROLLER_CONNECTIONS: usize = 64;

/// Who sends a request: its node id and the quorum it belongs to. Every request carries
/// it, and a receiver whose own quorum differs refuses the request (a node started with
/// other `controller.quorum.voters`, or one of another cluster, never votes or appends).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Sender {
    /// The sender's `node.id`.
    pub(crate) node_id: u64,
    /// Its process's incarnation id (random per start): what a vote request is checked
    /// by ([`voter_refusal`]). `None` from a node of an earlier weir.
    #[serde(default)]
    pub(crate) incarnation_id: Option<uuid::Uuid>,
    /// Its cluster id (`meta.properties`).
    pub(crate) cluster_id: String,
    /// Its `controller.quorum.voters`, sorted: `ID@HOST:PORT,...`.
    pub(crate) voters: String,
}

impl Sender {
    /// Why a request from `from` is refused by a node that is `self`, if it is. A node that
    /// is not a voter (a broker-only node, a Raft learner) is heard except for `raft`
    /// requests (Vote, AppendEntries, InstallSnapshot): it proposes, heartbeats, asks to
    /// be a learner and answers AwaitApplied like any broker, but never votes or leads.
    fn refusal(&self, from: &Sender, raft: bool) -> Option<String> {
        if from.voters != self.voters {
            Some(format!(
                "node {} has controller.quorum.voters {}, this node {}: every node must list the same voters",
                from.node_id, from.voters, self.voters
            ))
        } else if from.cluster_id != self.cluster_id {
            Some(format!(
                "node {} is of cluster {}, this node of {}",
                from.node_id, from.cluster_id, self.cluster_id
            ))
        } else if raft
            && !self
                .voters
                .split(',')
                .any(|v| v.split('@').next() == Some(from.node_id.to_string().as_str()))
        {
            Some(format!(
                "node {} is not a voter ({})",
                from.node_id, self.voters
            ))
        } else {
            None
        }
    }
}

/// One request on the wire: the sender, then the request.
#[derive(Debug, Serialize, Deserialize)]
struct Envelope<S, R> {
    from: S,
    rpc: R,
}

/// A request between controllers.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum RaftRpc {
    /// Raft AppendEntries (also the heartbeat).
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    /// Raft RequestVote.
    Vote(VoteRequest<NodeId>),
    /// One chunk of a snapshot.
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// A metadata change for the leader to append (sent by a node that is not it).
    Propose(Proposal),
    /// A broker is alive (Kafka's BrokerHeartbeat, KIP-631, without its log offsets):
    /// kept in the leader's memory only, never a log entry.
    BrokerHeartbeat {
        /// The broker's `node.id`.
        broker_id: i32,
        /// Its current broker epoch.
        broker_epoch: i64,
    },
    /// Describe the quorum (DescribeQuorum forwarded by a broker to the active controller).
    DescribeQuorum,
    /// Answer once this broker's image holds the entry at `index` (its metadata readers
    /// see it), or after `timeout_ms` (capped at [`AWAIT_APPLIED_MAX_MS`]) with what it
    /// holds: the node that answered an admin request waits for every live broker so.
    AwaitApplied {
        /// The Raft log index (`__cluster_metadata` offset) of the entry.
        index: u64,
        /// How long to wait at most (ms).
        timeout_ms: u64,
    },
    /// Which node leads, as this node knows: asked by a node that knows none before it
    /// proposes (a node no leader replicates to would otherwise never find one).
    Leader,
    /// Which process listens here: asked at a voter's address by a node that got a vote
    /// request in that voter's name ([`voter_refusal`]).
    Identify,
    /// Make the sender, a broker-only node, a Raft learner replicated to at `addr` (its
    /// internal Raft listener), so it receives `__cluster_metadata` as Kafka's brokers
    /// fetch it as observers (KIP-595). Answered by the leader once the membership entry
    /// is committed; a learner already there at `addr` is answered at once.
    AddLearner {
        /// The learner's Raft address, `HOST:PORT`.
        addr: String,
    },
}

/// The answer to a [`RaftRpc`], variant for variant.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum RaftRpcReply {
    /// To AppendEntries.
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    /// To Vote.
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    /// To InstallSnapshot.
    InstallSnapshot(
        Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
    ),
    /// To Propose: the log index (offset) the change was appended at, or why not (this
    /// node is not the leader, the quorum is gone).
    Propose(Result<u64, String>),
    /// To BrokerHeartbeat: noted, or why not (this node is not the leader).
    BrokerHeartbeat(Result<(), String>),
    /// To any request whose sender's quorum is not this node's ([`Sender`]): why.
    Refused(String),
    /// To DescribeQuorum: the leader's view, or why not (this node is not the leader).
    DescribeQuorum(Result<QuorumState, String>),
    /// To AwaitApplied: the index of the last entry this broker's image holds (below the
    /// one asked for when the wait timed out).
    Applied(u64),
    /// To Propose, from the leader: the change is refused with this Kafka error code and
    /// message, never appended. Only DUPLICATE_BROKER_REGISTRATION (101) today: a broker
    /// registration of a `node.id` another live broker holds
    /// (`brokers::duplicate_registration`).
    ProposeRefused {
        /// Kafka's error code.
        error_code: i16,
        /// Why.
        message: String,
    },
    /// To Leader: the leader this node knows, if any.
    Leader(Option<NodeId>),
    /// To AddLearner: the sender is a learner at its address, or why not (this node is not
    /// the leader, a membership change is under way, the sender is a voter).
    LearnerAdded(Result<(), String>),
    /// To Identify: this process's node id and incarnation id.
    Identity {
        /// Its `node.id`.
        node_id: NodeId,
        /// Its incarnation id.
        incarnation_id: uuid::Uuid,
    },
}

/// Kafka's DUPLICATE_BROKER_REGISTRATION error code (KIP-631).
pub(crate) const DUPLICATE_BROKER_REGISTRATION: i16 = 101;

/// Why [`propose_at`] failed.
#[derive(Debug)]
pub(super) enum ProposeError {
    /// The leader refused a broker registration (DUPLICATE_BROKER_REGISTRATION, 101).
    DuplicateBrokerRegistration(String),
    /// Unreachable, broken, timed out, refused as not of this quorum, or not the leader
    /// any more: worth another try.
    Failed(String),
}

/// The longest wait a peer's [`RaftRpc::AwaitApplied`] gets (ms), whatever it asks: a
/// served connection is not held longer.
pub(crate) const AWAIT_APPLIED_MAX_MS: u64 = 5_000;

async fn write_frame<T: Serialize>(stream: &mut TcpStream, msg: &T) -> std::io::Result<()> {
    let body = serde_json::to_vec(msg)?;
    if body.len() > MAX_RPC_BYTES {
        return Err(std::io::Error::other("raft rpc too large"));
    }
    let mut frame = Vec::with_capacity(body.len() + 4);
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    stream.write_all(&frame).await
}

async fn read_frame<T: for<'de> Deserialize<'de>>(stream: &mut TcpStream) -> std::io::Result<T> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_RPC_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("raft rpc of {len} bytes is above the limit of {MAX_RPC_BYTES}"),
        ));
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).await?;
    Ok(serde_json::from_slice(&body)?)
}

/// One request and its reply on `conn` (connecting first if needed), within `ttl`.
/// On any error the connection is dropped, to be made again next time.
///
/// Cancel-safe: the stream is taken out of `conn` for the exchange and put back only
/// after a whole reply was read. openraft runs each AppendEntries under a timer of its
/// own and drops the call when it fires; had the connection stayed in `conn` with a
/// request written and its reply unread, the next request on it would have read that
/// reply as its own (the frames carry no request id): a leader taking a stale
/// `Conflict` for a heartbeat's answer panicked in openraft's replication code, and a
/// stale `Success` could have been counted towards a commit.
///
/// Errors: the connection could not be made (`Err(Ok(e))`: unreachable), or broke or
/// timed out after (`Err(Err(e))`).
async fn call(
    conn: &mut Option<TcpStream>,
    addr: &str,
    from: &Sender,
    rpc: &RaftRpc,
    ttl: Duration,
) -> Result<RaftRpcReply, Result<std::io::Error, std::io::Error>> {
    let mut stream = match conn.take() {
        Some(stream) => stream,
        None => {
            let stream = tokio::time::timeout(ttl, TcpStream::connect(addr))
                .await
                .map_err(|_| {
                    Ok(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "connect timed out",
                    ))
                })?
                .map_err(Ok)?;
            let _ = stream.set_nodelay(true);
            stream
        }
    };
    let result = tokio::time::timeout(ttl, async {
        write_frame(&mut stream, &Envelope { from, rpc }).await?;
        read_frame::<RaftRpcReply>(&mut stream).await
    })
    .await
    .unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "rpc timed out",
        ))
    });
    if result.is_ok() {
        *conn = Some(stream);
    }
    result.map_err(Err)
}

/// Sends `proposal` to the controller at `addr` and returns the offset it was appended at.
///
/// Errors: [`ProposeError::DuplicateBrokerRegistration`]: the leader refused a broker
/// registration; [`ProposeError::Failed`], as text: the peer is unreachable, or refused
/// (not the leader any more).
pub(super) async fn propose_at(
    addr: &str,
    from: &Sender,
    proposal: Proposal,
    ttl: Duration,
) -> Result<u64, ProposeError> {
    let mut conn = None;
    match call(&mut conn, addr, from, &RaftRpc::Propose(proposal), ttl).await {
        Ok(RaftRpcReply::Propose(r)) => r.map_err(ProposeError::Failed),
        Ok(RaftRpcReply::ProposeRefused {
            error_code: DUPLICATE_BROKER_REGISTRATION,
            message,
        }) => Err(ProposeError::DuplicateBrokerRegistration(message)),
        Ok(RaftRpcReply::ProposeRefused {
            error_code,
            message,
        }) => Err(ProposeError::Failed(format!(
            "controller {addr} refused with error {error_code}: {message}"
        ))),
        Ok(RaftRpcReply::Refused(why)) => Err(ProposeError::Failed(format!(
            "controller {addr} refused: {why}"
        ))),
        Ok(other) => Err(ProposeError::Failed(format!(
            "unexpected reply to Propose: {other:?}"
        ))),
        Err(Ok(e)) | Err(Err(e)) => Err(ProposeError::Failed(format!("controller {addr}: {e}"))),
    }
}

/// Asks the process listening at `addr` who it is: (node id, incarnation id).
///
/// Errors: as text: unreachable, broken, timed out, refused, or an earlier weir.
async fn identify_at(
    addr: &str,
    from: &Sender,
    ttl: Duration,
) -> Result<(NodeId, uuid::Uuid), String> {
    let mut conn = None;
    match call(&mut conn, addr, from, &RaftRpc::Identify, ttl).await {
        Ok(RaftRpcReply::Identity {
            node_id,
            incarnation_id,
        }) => Ok((node_id, incarnation_id)),
        Ok(RaftRpcReply::Refused(why)) => Err(format!("refused: {why}")),
        Ok(other) => Err(format!("unexpected reply to Identify: {other:?}")),
        Err(Ok(e)) | Err(Err(e)) => Err(e.to_string()),
    }
}

/// How long a node waits for a voter's address to say who listens there.
const IDENTIFY_TTL: Duration = Duration::from_millis(500);

/// Why a vote request naming `from` is refused, if it is: it must come from the process
/// that listens at that voter's address in `controller.quorum.voters` (so a second
/// process with a voter's `node.id` elsewhere, with the same voters, never votes or
/// stands: two processes voting as one voter could elect two leaders in one term).
/// Checked by asking that address who listens there ([`RaftRpc::Identify`], within
/// [`IDENTIFY_TTL`]), once per incarnation (kept in `verified`): refused when another
/// incarnation answers, when nothing answers (unverifiable: a candidate always listens
/// at its own address), or when `from` claims this node's own id. A sender of an earlier
/// weir (no incarnation id) is not checked.
async fn voter_refusal(served: &Served, from: &Sender) -> Option<String> {
    let incarnation = from.incarnation_id?;
    if from.node_id == served.me.node_id {
        return Some(format!(
            "a vote request names this node's own id {} (incarnation {incarnation}, this process {}): a second process with node.id={} elsewhere",
            from.node_id, served.incarnation_id, from.node_id
        ));
    }
    {
        let verified = served
            .verified
            .lock()
            .expect("verified voters lock poisoned");
        if verified.get(&from.node_id) == Some(&incarnation) {
            return None;
        }
    }
    let addr = served.voters.get(&from.node_id)?.addr.clone();
    match identify_at(&addr, &served.me, IDENTIFY_TTL).await {
        Ok((node_id, listening)) if node_id == from.node_id && listening == incarnation => {
            let mut verified = served.verified.lock().expect("verified voters lock poisoned");
            if verified.len() < served.voters.len() || verified.contains_key(&node_id) {
                verified.insert(node_id, incarnation);
            }
            None
        }
        Ok((node_id, listening)) => Some(format!(
            "a vote request names node {} (incarnation {incarnation}), but node {node_id} incarnation {listening} listens at its voter address {addr}: a second process with node.id={} elsewhere",
            from.node_id, from.node_id
        )),
        Err(why) => Some(format!(
            "a vote request names node {} (incarnation {incarnation}), but its voter address {addr} does not say it listens there ({why})",
            from.node_id
        )),
    }
}

/// Asks the controller at `addr` which node leads, as it knows (on a connection of its
/// own, within `ttl`).
///
/// Errors: as text: unreachable, broken, timed out, or refused (not of this quorum).
pub(super) async fn leader_at(
    addr: &str,
    from: &Sender,
    ttl: Duration,
) -> Result<Option<NodeId>, String> {
    let mut conn = None;
    match call(&mut conn, addr, from, &RaftRpc::Leader, ttl).await {
        Ok(RaftRpcReply::Leader(leader)) => Ok(leader),
        Ok(RaftRpcReply::Refused(why)) => Err(format!("controller {addr} refused: {why}")),
        Ok(other) => Err(format!("unexpected reply to Leader: {other:?}")),
        Err(Ok(e)) | Err(Err(e)) => Err(format!("controller {addr}: {e}")),
    }
}

/// Asks the controller at `addr` (the leader) to make `from` a Raft learner at
/// `learner_addr` (on a connection of its own, within `ttl`).
///
/// Errors: as text: unreachable, broken, timed out, refused, or not done there (not the
/// leader, a membership change under way).
pub(super) async fn add_learner_at(
    addr: &str,
    from: &Sender,
    learner_addr: &str,
    ttl: Duration,
) -> Result<(), String> {
    let mut conn = None;
    let rpc = RaftRpc::AddLearner {
        addr: learner_addr.to_string(),
    };
    match call(&mut conn, addr, from, &rpc, ttl).await {
        Ok(RaftRpcReply::LearnerAdded(r)) => r,
        Ok(RaftRpcReply::Refused(why)) => Err(format!("controller {addr} refused: {why}")),
        Ok(other) => Err(format!("unexpected reply to AddLearner: {other:?}")),
        Err(Ok(e)) | Err(Err(e)) => Err(format!("controller {addr}: {e}")),
    }
}

/// On the leader: makes `node_id` a learner at `addr` (openraft's `add_learner`, not
/// waiting for it to catch up), or moves a learner to a new `addr` (`SetNodes`); nothing
/// when it is a learner at `addr` already. Returns once the membership entry is committed.
///
/// Errors: as text: `node_id` is a voter, this node does not lead, or openraft refused
/// (e.g. another membership change is under way: the learner asks again).
async fn add_learner(raft: &Raft<TypeConfig>, node_id: NodeId, addr: String) -> Result<(), String> {
    if !leads(raft) {
        return Err("not the active controller".to_string());
    }
    let (is_voter, current) = {
        let m = raft.metrics();
        let m = m.borrow();
        let membership = m.membership_config.membership();
        let is_voter = membership.voter_ids().any(|v| v == node_id);
        (
            is_voter,
            membership.get_node(&node_id).map(|n| n.addr.clone()),
        )
    };
    if is_voter {
        return Err(format!("node {node_id} is a voter, not a learner"));
    }
    let node = BasicNode::new(addr.clone());
    let result = match current {
        Some(at) if at == addr => return Ok(()),
        Some(_) => raft
            .change_membership(
                openraft::ChangeMembers::SetNodes(BTreeMap::from([(node_id, node)])),
                true,
            )
            .await
            .map(|_| ()),
        None => raft.add_learner(node_id, node, false).await.map(|_| ()),
    };
    match result {
        Ok(()) => {
            tracing::info!(
                "metadata quorum: node {node_id} is a learner at {addr} (a broker-only node)"
            );
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Sends a broker heartbeat to the controller at `addr` over `conn` (made when `None`,
/// dropped on error).
///
/// Errors: as text: unreachable, broken, timed out, or refused (not the leader).
pub(super) async fn heartbeat_at(
    conn: &mut Option<TcpStream>,
    addr: &str,
    from: &Sender,
    broker_id: i32,
    broker_epoch: i64,
    ttl: Duration,
) -> Result<(), String> {
    let rpc = RaftRpc::BrokerHeartbeat {
        broker_id,
        broker_epoch,
    };
    match call(conn, addr, from, &rpc, ttl).await {
        Ok(RaftRpcReply::BrokerHeartbeat(r)) => r,
        Ok(RaftRpcReply::Refused(why)) => Err(format!("controller {addr} refused: {why}")),
        Ok(other) => Err(format!("unexpected reply to BrokerHeartbeat: {other:?}")),
        Err(Ok(e)) | Err(Err(e)) => Err(format!("controller {addr}: {e}")),
    }
}

/// Asks the controller at `addr` to describe the quorum (on a connection of its own).
///
/// Errors: as text: unreachable, broken, timed out, or refused (not the leader).
pub(super) async fn describe_at(
    addr: &str,
    from: &Sender,
    ttl: Duration,
) -> Result<QuorumState, String> {
    let mut conn = None;
    match call(&mut conn, addr, from, &RaftRpc::DescribeQuorum, ttl).await {
        Ok(RaftRpcReply::DescribeQuorum(r)) => r,
        Ok(RaftRpcReply::Refused(why)) => Err(format!("controller {addr} refused: {why}")),
        Ok(other) => Err(format!("unexpected reply to DescribeQuorum: {other:?}")),
        Err(Ok(e)) | Err(Err(e)) => Err(format!("controller {addr}: {e}")),
    }
}

/// Asks the broker whose CONTROLLER listener is `addr` to answer once its image holds the
/// entry at `index` (waiting at most `wait` there), over a connection of its own; returns
/// the last index it holds. The call is bounded by `wait` plus [`AWAIT_APPLIED_GRACE`].
///
/// Errors: as text: unreachable, broken, timed out, or refused (not of this quorum).
pub(super) async fn await_applied_at(
    addr: &str,
    from: &Sender,
    index: u64,
    wait: Duration,
) -> Result<u64, String> {
    let rpc = RaftRpc::AwaitApplied {
        index,
        timeout_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
    };
    let mut conn = None;
    match call(&mut conn, addr, from, &rpc, wait + AWAIT_APPLIED_GRACE).await {
        Ok(RaftRpcReply::Applied(applied)) => Ok(applied),
        Ok(RaftRpcReply::Refused(why)) => Err(format!("refused: {why}")),
        Ok(other) => Err(format!("unexpected reply to AwaitApplied: {other:?}")),
        Err(Ok(e)) | Err(Err(e)) => Err(e.to_string()),
    }
}

/// What an [`await_applied_at`] call may take beyond the wait it asks for: connecting,
/// and the answer's way back.
pub(super) const AWAIT_APPLIED_GRACE: Duration = Duration::from_millis(100);

/// Where a broker stood when [`await_applied_all`] gave up on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Lagging {
    /// It answered, holding entries up to this index only.
    Behind(u64),
    /// It did not answer: why.
    Failed(String),
}

/// Asks every `(node id, CONTROLLER address)` of `targets` in parallel, with `ask` (in
/// weir: [`await_applied_at`]), to answer once it holds the entry at `index`, and waits
/// for all of them, at most `bound` (each is asked to wait `bound`, and is cut off at
/// `bound` + [`AWAIT_APPLIED_GRACE`]). Returns those that had not applied it, by node id:
/// empty when every one had. No targets: returns at once.
pub(super) async fn await_applied_all<F, Fut>(
    targets: Vec<(u64, String)>,
    index: u64,
    bound: Duration,
    ask: F,
) -> Vec<(u64, Lagging)>
where
    F: Fn(String, u64, Duration) -> Fut,
    Fut: std::future::Future<Output = Result<u64, String>> + Send + 'static,
{
    let mut calls = tokio::task::JoinSet::new();
    for (node, addr) in targets {
        let call = ask(addr, index, bound);
        calls.spawn(async move {
            let answer = tokio::time::timeout(bound + AWAIT_APPLIED_GRACE, call)
                .await
                .unwrap_or_else(|_| Err("no answer in time".to_string()));
            (node, answer)
        });
    }
    let mut lagging = Vec::new();
    while let Some(joined) = calls.join_next().await {
        match joined {
            Ok((_, Ok(applied))) if applied >= index => {}
            Ok((node, Ok(applied))) => lagging.push((node, Lagging::Behind(applied))),
            Ok((node, Err(why))) => lagging.push((node, Lagging::Failed(why))),
            // The task panicked or was cancelled (the runtime stops): not waited for.
            Err(_) => {}
        }
    }
    lagging.sort_by_key(|(node, _)| *node);
    lagging
}

/// openraft's network factory: a [`PeerClient`] per peer it asks for, each sending as
/// `me`, each telling `sessions` whether the peer's CONTROLLER listener takes connections
/// (a refused connect is the evidence that fences a killed broker early: a broker's Raft
/// node id is its broker id, at its CONTROLLER listener or, broker-only, its learner
/// listener, and the active controller's Raft heartbeats reach every one every 100 ms).
#[derive(Debug, Clone)]
pub(super) struct Peers {
    pub(super) me: Arc<Sender>,
    pub(super) sessions: Arc<BrokerSessions>,
}

/// The client side of one peer: its address and one connection.
#[derive(Debug)]
pub(super) struct PeerClient {
    target: NodeId,
    addr: String,
    me: Arc<Sender>,
    conn: Option<TcpStream>,
    /// Whether this peer's refusal was logged (once per client, not per heartbeat).
    refusal_logged: bool,
    sessions: Arc<BrokerSessions>,
}

impl RaftNetworkFactory<TypeConfig> for Peers {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        PeerClient {
            target,
            addr: node.addr.clone(),
            me: self.me.clone(),
            conn: None,
            refusal_logged: false,
            sessions: self.sessions.clone(),
        }
    }
}

impl PeerClient {
    async fn rpc<E: std::error::Error>(
        &mut self,
        rpc: RaftRpc,
        option: &RPCOption,
    ) -> Result<RaftRpcReply, RPCError<NodeId, BasicNode, E>> {
        let started = std::time::Instant::now();
        let result = call(
            &mut self.conn,
            &self.addr,
            &self.me,
            &rpc,
            option.hard_ttl(),
        )
        .await;
        if let Ok(broker_id) = i32::try_from(self.target) {
            match &result {
                Ok(_) => self.sessions.note_reachable(broker_id),
                Err(Ok(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    self.sessions.note_refused(broker_id, started)
                }
                Err(_) => {}
            }
        }
        match result {
            Ok(RaftRpcReply::Refused(why)) => {
                if !std::mem::replace(&mut self.refusal_logged, true) {
                    tracing::error!(
                        peer = self.target,
                        addr = %self.addr,
                        "controller quorum: the peer refuses this node's Raft requests: {why}"
                    );
                }
                let e = std::io::Error::other(format!("refused by node {}: {why}", self.target));
                Err(RPCError::Network(NetworkError::new(&e)))
            }
            Ok(reply) => Ok(reply),
            Err(Ok(e)) => Err(RPCError::Unreachable(Unreachable::new(&e))),
            Err(Err(e)) => Err(RPCError::Network(NetworkError::new(&e))),
        }
    }

    fn unexpected<E: std::error::Error>(reply: RaftRpcReply) -> RPCError<NodeId, BasicNode, E> {
        let e = std::io::Error::other(format!("unexpected reply {reply:?}"));
        RPCError::Network(NetworkError::new(&e))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        match self.rpc(RaftRpc::AppendEntries(rpc), &option).await? {
            RaftRpcReply::AppendEntries(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            other => Err(Self::unexpected(other)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        match self.rpc(RaftRpc::InstallSnapshot(rpc), &option).await? {
            RaftRpcReply::InstallSnapshot(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            other => Err(Self::unexpected(other)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        match self.rpc(RaftRpc::Vote(rpc), &option).await? {
            RaftRpcReply::Vote(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            other => Err(Self::unexpected(other)),
        }
    }
}

/// What the CONTROLLER listener answers from.
pub(super) struct Served {
    /// This node as a sender (its quorum: who may be heard).
    pub(super) me: Arc<Sender>,
    /// The local Raft.
    pub(super) raft: Raft<TypeConfig>,
    /// The broker sessions (heartbeats noted here; registrations checked against them).
    pub(super) sessions: Arc<BrokerSessions>,
    /// The voters by id.
    pub(super) voters: BTreeMap<NodeId, BasicNode>,
    /// What this broker's image holds (AwaitApplied).
    pub(super) visible: Arc<CommittedQueue>,
    /// The state machine: its image is what a registration is checked against.
    pub(super) machine: StateMachine,
    /// This process's incarnation id (its own broker's registrations).
    pub(super) incarnation_id: uuid::Uuid,
    /// Voter id → the incarnation its voter address confirmed ([`voter_refusal`]); at
    /// most one entry per voter.
    pub(super) verified: std::sync::Mutex<std::collections::HashMap<NodeId, uuid::Uuid>>,
}

/// Serves the CONTROLLER listener until `shutdown` turns true: each connection is a
/// sequence of requests, each answered in turn by the local `raft`.
pub(super) async fn serve(
    listener: TcpListener,
    served: Served,
    mut shutdown: watch::Receiver<bool>,
) {
    let served = Arc::new(served);
    let permits = Arc::new(Semaphore::new(MAX_CONTROLLER_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            _ = shutdown.changed() => return,
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let (stream, peer) = tokio::select! {
            _ = shutdown.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "controller listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let served = served.clone();
        let mut shutdown = shutdown.clone();
        tokio::spawn(async move {
            let _permit = permit;
            tokio::select! {
                _ = shutdown.changed() => {}
                r = serve_connection(stream, &served) => {
                    if let Err(e) = r {
                        tracing::debug!(%peer, error = %e, "controller connection closed");
                    }
                }
            }
        });
    }
}

/// Why the leader refuses `proposal` from another node, as a Kafka error code and
/// message: a broker registration of a `node.id` that another live broker holds
/// ([`duplicate_registration`]). `None`: this node does not lead (the write is refused
/// anyway) or nothing in it is a registration.
fn refused_proposal(served: &Served, proposal: &Proposal) -> Option<(i16, String)> {
    if !leads(&served.raft) {
        return None;
    }
    let now = std::time::Instant::now();
    let image = served.machine.applied().0;
    let controller_id = i32::try_from(served.me.node_id).ok()?;
    proposal.records.iter().find_map(|r| match r {
        MetadataRecord::BrokerRegistered {
            broker_id,
            incarnation_id,
            ..
        } => duplicate_registration(
            &image,
            &served.sessions,
            controller_id,
            served.incarnation_id,
            *broker_id,
            *incarnation_id,
            now,
        )
        .map(|why| (DUPLICATE_BROKER_REGISTRATION, why)),
        _ => None,
    })
}

async fn serve_connection(mut stream: TcpStream, served: &Served) -> std::io::Result<()> {
    let Served {
        me,
        raft,
        sessions,
        voters,
        visible,
        ..
    } = served;
    let _ = stream.set_nodelay(true);
    let mut refusal_logged = false;
    let mut vote_refusal_logged = false;
    // Open while this connection is: the broker whose heartbeats come on it.
    let mut heartbeats: Option<HeartbeatConnection> = None;
    loop {
        let Envelope { from, rpc } =
            match read_frame::<Envelope<Sender, RaftRpc>>(&mut stream).await {
                Ok(request) => request,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            };
        let raft_rpc = matches!(
            rpc,
            RaftRpc::AppendEntries(_) | RaftRpc::Vote(_) | RaftRpc::InstallSnapshot(_)
        );
        if let Some(why) = me.refusal(&from, raft_rpc) {
            // Once per connection: a refused peer retries on it every heartbeat.
            if !std::mem::replace(&mut refusal_logged, true) {
                let peer = stream
                    .peer_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_default();
                tracing::error!(
                    %peer,
                    "controller quorum: refusing Raft requests from a node not of this quorum: {why}"
                );
            }
            write_frame(&mut stream, &RaftRpcReply::Refused(why)).await?;
            continue;
        }
        let reply = match rpc {
            RaftRpc::AppendEntries(r) => RaftRpcReply::AppendEntries(raft.append_entries(r).await),
            RaftRpc::Vote(r) => match voter_refusal(served, &from).await {
                None => RaftRpcReply::Vote(raft.vote(r).await),
                Some(why) => {
                    if !std::mem::replace(&mut vote_refusal_logged, true) {
                        let peer = stream
                            .peer_addr()
                            .map(|a| a.to_string())
                            .unwrap_or_default();
                        tracing::error!(%peer, "controller quorum: refusing a vote request: {why}");
                    }
                    RaftRpcReply::Refused(why)
                }
            },
            RaftRpc::InstallSnapshot(r) => {
                RaftRpcReply::InstallSnapshot(raft.install_snapshot(r).await)
            }
            RaftRpc::Propose(p) => match refused_proposal(served, &p) {
                Some((error_code, message)) => {
                    let peer = stream
                        .peer_addr()
                        .map(|a| a.to_string())
                        .unwrap_or_default();
                    tracing::warn!(
                        %peer,
                        from = from.node_id,
                        "refused a broker registration with DUPLICATE_BROKER_REGISTRATION ({error_code}): {message}"
                    );
                    RaftRpcReply::ProposeRefused {
                        error_code,
                        message,
                    }
                }
                None => RaftRpcReply::Propose(
                    raft.client_write(p)
                        .await
                        .map(|r| r.log_id.index)
                        .map_err(|e| e.to_string()),
                ),
            },
            RaftRpc::BrokerHeartbeat {
                broker_id,
                broker_epoch,
            } => RaftRpcReply::BrokerHeartbeat(if leads(raft) {
                if heartbeats.as_ref().map(HeartbeatConnection::broker_id) != Some(broker_id) {
                    heartbeats = Some(sessions.heartbeat_connection(broker_id));
                }
                sessions.record(broker_id, broker_epoch, std::time::Instant::now());
                Ok(())
            } else {
                Err("not the active controller".to_string())
            }),
            RaftRpc::DescribeQuorum => RaftRpcReply::DescribeQuorum(describe_local(raft, voters)),
            RaftRpc::AwaitApplied { index, timeout_ms } => {
                let wait = Duration::from_millis(timeout_ms.min(AWAIT_APPLIED_MAX_MS));
                RaftRpcReply::Applied(visible.wait_visible(index, wait).await)
            }
            RaftRpc::Leader => RaftRpcReply::Leader(raft.metrics().borrow().current_leader),
            RaftRpc::AddLearner { addr } => {
                RaftRpcReply::LearnerAdded(add_learner(raft, from.node_id, addr).await)
            }
            RaftRpc::Identify => RaftRpcReply::Identity {
                node_id: me.node_id,
                incarnation_id: served.incarnation_id,
            },
        };
        write_frame(&mut stream, &reply).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::{await_applied_all, Lagging, Sender};
    use std::time::Duration;

    /// A fake peer at `addr` (its name tells how it behaves) for [`await_applied_all`].
    async fn fake_peer(addr: String, index: u64, wait: Duration) -> Result<u64, String> {
        match addr.as_str() {
            "quick" => Ok(index),
            "ahead" => Ok(index + 3),
            "late" => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(index)
            }
            // Waits as long as it is asked to, then says where it is.
            "behind" => {
                tokio::time::sleep(wait).await;
                Ok(index - 1)
            }
            // Never answers.
            "hung" => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(index)
            }
            _ => Err("connection refused".to_string()),
        }
    }

    fn targets(addrs: &[&str]) -> Vec<(u64, String)> {
        addrs
            .iter()
            .enumerate()
            .map(|(i, a)| (i as u64 + 1, a.to_string()))
            .collect()
    }

    #[tokio::test]
    async fn every_peer_that_applied_the_entry_is_waited_for_and_nothing_else() {
        let bound = Duration::from_secs(30);
        let lagging =
            await_applied_all(targets(&["quick", "late", "ahead"]), 10, bound, fake_peer).await;
        assert_eq!(lagging, vec![]);
        // No peers: nothing to wait for.
        assert_eq!(
            await_applied_all(vec![], 10, bound, fake_peer).await,
            vec![]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_or_unreachable_peer_is_given_up_on_at_the_bound() {
        let bound = Duration::from_millis(1000);
        let started = tokio::time::Instant::now();
        let lagging = await_applied_all(
            targets(&["quick", "behind", "gone", "hung"]),
            10,
            bound,
            fake_peer,
        )
        .await;
        // Paused time: exactly the bound plus the grace, never the hung peer's hour.
        assert_eq!(started.elapsed(), bound + super::AWAIT_APPLIED_GRACE);
        assert_eq!(
            lagging,
            vec![
                (2, Lagging::Behind(9)),
                (3, Lagging::Failed("connection refused".to_string())),
                (4, Lagging::Failed("no answer in time".to_string())),
            ]
        );
        // The unreachable one alone: not waited for at all.
        let started = tokio::time::Instant::now();
        let lagging = await_applied_all(targets(&["gone"]), 10, bound, fake_peer).await;
        assert_eq!(lagging.len(), 1);
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    const VOTERS: &str = "1@127.0.0.1:9093,2@127.0.0.1:9095,3@127.0.0.1:9097";

    fn sender(node_id: u64, voters: &str) -> Sender {
        Sender {
            node_id,
            incarnation_id: None,
            cluster_id: "c".into(),
            voters: voters.into(),
        }
    }

    #[test]
    fn only_a_voter_of_the_same_quorum_is_heard() {
        let me = sender(1, VOTERS);
        assert_eq!(me.refusal(&sender(2, VOTERS), true), None);
        assert_eq!(me.refusal(&sender(1, VOTERS), true), None);
        let moved = VOTERS.replace("2@127.0.0.1:9095", "2@127.0.0.1:9999");
        let why = me.refusal(&sender(2, &moved), false).expect("other voters");
        assert!(why.contains("controller.quorum.voters"), "{why}");
        let mut other = sender(2, VOTERS);
        other.cluster_id = "d".into();
        let why = me.refusal(&other, false).expect("another cluster");
        assert!(why.contains("cluster d"), "{why}");
        let why = me.refusal(&sender(4, VOTERS), true).expect("not a voter");
        assert!(why.contains("not a voter"), "{why}");
        // A broker-only node (not a voter) proposes, heartbeats, asks to be a learner.
        assert_eq!(me.refusal(&sender(4, VOTERS), false), None);
        // Node 12 is not node 1 or 2.
        assert!(sender(1, "1@h:1,2@h:2")
            .refusal(&sender(12, "1@h:1,2@h:2"), true)
            .is_some());
    }

    /// A call dropped after its request went out (openraft's own timer firing first) must
    /// not leave its reply for the next call on the connection to read as its own. The
    /// fake peer answers each request with `Leader(Some(n))`, `n` counting requests, the
    /// first after 300 ms: the first call is dropped at 50 ms, and the second must get
    /// its own answer (2), not the first's (1).
    #[tokio::test]
    async fn a_call_dropped_midway_leaves_no_reply_for_the_next() {
        use super::{call, read_frame, write_frame, RaftRpc, RaftRpcReply};
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let served = Arc::new(AtomicU64::new(0));
        let peer = tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                let served = served.clone();
                tokio::spawn(async move {
                    while read_frame::<serde_json::Value>(&mut stream).await.is_ok() {
                        let n = served.fetch_add(1, Ordering::SeqCst) + 1;
                        if n == 1 {
                            tokio::time::sleep(Duration::from_millis(300)).await;
                        }
                        let reply = RaftRpcReply::Leader(Some(n));
                        if write_frame(&mut stream, &reply).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let me = sender(1, VOTERS);
        let ttl = Duration::from_secs(5);
        let mut conn = None;
        let first = tokio::time::timeout(
            Duration::from_millis(50),
            call(&mut conn, &addr, &me, &RaftRpc::Leader, ttl),
        )
        .await;
        assert!(
            first.is_err(),
            "the first call is dropped before its answer"
        );
        // Past the first answer's delay: on a reused connection it would be waiting.
        tokio::time::sleep(Duration::from_millis(400)).await;
        match call(&mut conn, &addr, &me, &RaftRpc::Leader, ttl).await {
            Ok(RaftRpcReply::Leader(Some(n))) => assert_eq!(n, 2, "the second call's answer"),
            other => panic!("unexpected: {other:?}"),
        }
        peer.abort();
    }
}
