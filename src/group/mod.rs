//! The group coordinator: Kafka's classic consumer-group protocol (protocol guide, "The
//! Consumer Group Protocol"; KIP-62 rebalance timeout, KIP-134 initial rebalance delay,
//! KIP-345 static membership, KIP-394 MEMBER_ID_REQUIRED, KIP-211 offset expiry, KIP-429
//! cooperative rebalancing, which the broker only relays) and committed offsets.
//!
//! Owns: every group's state machine (Empty → PreparingRebalance → CompletingRebalance →
//! Stable, and Dead when deleted), its members, generation, chosen protocol and leader;
//! parked JoinGroup and SyncGroup requests (a oneshot per member, answered when the
//! rebalance phase completes — never an early empty assignment); session, rebalance and
//! pending-member deadlines (checked by [`GroupCoordinator::run_timers`]); committed
//! offsets, cached here and written through [`store::OffsetStore`] to
//! `__consumer_offsets` before a commit is acknowledged.
//!
//! Never does: decode requests (the protocol layer translates to the plain types here), or
//! interpret assignments: the leader member chooses them; the broker parses a consumer
//! subscription only to refuse OffsetDelete of a subscribed topic.
//!
//! All state sits behind one `std` mutex, never held across `.await`; a parked request
//! waits on its oneshot with the lock released.

pub(crate) mod assignor;
pub(crate) mod consumer;
pub(crate) mod store;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes};
use indexmap::IndexMap;
use kafka_protocol::ResponseError;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::cluster::Metadata;
use crate::config::GroupSettings;
use crate::replica::{now_ms, ReplicaManager};
use store::partition_for;

use crate::replica::ReplicationWait;

/// Longest an offset commit waits for the in-sync replicas (Kafka's
/// `offsets.commit.timeout.ms` default).
pub(crate) const OFFSET_COMMIT_TIMEOUT_MS: u64 = 5000;
pub(crate) use consumer::{ConsumerGroupDescription, ConsumerGroupSettings};
pub(crate) use store::{CommittedOffset, OffsetStore, StoreRecord, OFFSETS_TOPIC};

/// A group's state (Kafka's `GroupState`, names as ListGroups/DescribeGroups report them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    /// No members; may still hold committed offsets.
    Empty,
    /// Waiting for members to (re)join.
    PreparingRebalance,
    /// Joined; waiting for the leader's assignment (SyncGroup).
    CompletingRebalance,
    /// Assignment delivered; members heartbeat.
    Stable,
    /// Deleted, or never existed (DescribeGroups before v6).
    Dead,
}

impl GroupState {
    /// The name Kafka reports ("Stable", "PreparingRebalance", ...).
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
        }
    }
}

/// A JoinGroup request, decoded (JoinGroup v0–v9).
#[derive(Debug, Clone)]
pub struct JoinRequest {
    /// `group.id`.
    pub group_id: String,
    /// Empty on a member's first join.
    pub member_id: String,
    /// `group.instance.id` (v5+, KIP-345).
    pub group_instance_id: Option<String>,
    /// Client id from the request header.
    pub client_id: String,
    /// Peer address, reported by DescribeGroups as Kafka does ("/127.0.0.1").
    pub client_host: String,
    /// `session.timeout.ms`.
    pub session_timeout_ms: i32,
    /// `max.poll.interval.ms` (v1+; v0 uses the session timeout).
    pub rebalance_timeout_ms: i32,
    /// "consumer" for consumers.
    pub protocol_type: String,
    /// Assignor names and their subscription metadata, in the member's preference order.
    pub protocols: Vec<(String, Bytes)>,
    /// v4+: an unknown member gets MEMBER_ID_REQUIRED and a member id first (KIP-394).
    pub require_known_member_id: bool,
}

/// One member as the leader sees it in its JoinGroup response.
#[derive(Debug, Clone, PartialEq)]
pub struct JoinedMember {
    /// Member id.
    pub member_id: String,
    /// `group.instance.id`.
    pub group_instance_id: Option<String>,
    /// Its metadata for the chosen protocol.
    pub metadata: Bytes,
}

/// A JoinGroup answer.
#[derive(Debug, Clone, PartialEq)]
pub struct JoinResult {
    /// Kafka error, `None` for success.
    pub error: Option<ResponseError>,
    /// The new generation (-1 on error).
    pub generation_id: i32,
    /// The group's protocol type.
    pub protocol_type: Option<String>,
    /// The chosen assignor.
    pub protocol_name: Option<String>,
    /// The leader's member id.
    pub leader_id: String,
    /// This member's id (a new one with MEMBER_ID_REQUIRED).
    pub member_id: String,
    /// Every member, for the leader only.
    pub members: Vec<JoinedMember>,
    /// v9+: a static leader rejoining a stable group must not reassign (KIP-814).
    pub skip_assignment: bool,
}

impl JoinResult {
    fn error(member_id: &str, error: ResponseError) -> JoinResult {
        JoinResult {
            error: Some(error),
            generation_id: -1,
            protocol_type: None,
            protocol_name: None,
            leader_id: String::new(),
            member_id: member_id.to_string(),
            members: Vec::new(),
            skip_assignment: false,
        }
    }
}

/// A SyncGroup request, decoded (SyncGroup v0–v5).
#[derive(Debug, Clone)]
pub struct SyncRequest {
    /// `group.id`.
    pub group_id: String,
    /// The generation the member joined.
    pub generation_id: i32,
    /// Member id.
    pub member_id: String,
    /// `group.instance.id` (v3+).
    pub group_instance_id: Option<String>,
    /// v5+: must match the group's.
    pub protocol_type: Option<String>,
    /// v5+: must match the chosen protocol.
    pub protocol_name: Option<String>,
    /// The leader's assignment per member; empty from followers.
    pub assignments: Vec<(String, Bytes)>,
}

/// A SyncGroup answer.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncResult {
    /// Kafka error, `None` for success.
    pub error: Option<ResponseError>,
    /// The group's protocol type (v5+).
    pub protocol_type: Option<String>,
    /// The chosen protocol (v5+).
    pub protocol_name: Option<String>,
    /// This member's assignment, as the leader wrote it.
    pub assignment: Bytes,
}

impl SyncResult {
    fn error(error: ResponseError) -> SyncResult {
        SyncResult {
            error: Some(error),
            protocol_type: None,
            protocol_name: None,
            assignment: Bytes::new(),
        }
    }
}

/// One offset to commit.
#[derive(Debug, Clone)]
pub struct OffsetToCommit {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
    /// The offset of the next record to read.
    pub offset: i64,
    /// Leader epoch (-1 when unknown).
    pub leader_epoch: i32,
    /// Client metadata (`None` is stored as "").
    pub metadata: Option<String>,
}

impl OffsetToCommit {
    /// A worker's progress (topic, partition, next offset) as offsets to commit: leader
    /// epoch unknown, no metadata.
    pub fn from_progress(offsets: &[(String, i32, i64)]) -> Vec<OffsetToCommit> {
        offsets
            .iter()
            .map(|(topic, partition, offset)| OffsetToCommit {
                topic: topic.clone(),
                partition: *partition,
                offset: *offset,
                leader_epoch: -1,
                metadata: None,
            })
            .collect()
    }
}

/// An OffsetCommit request, decoded (OffsetCommit v2–v9).
#[derive(Debug, Clone)]
pub struct CommitRequest {
    /// `group.id`.
    pub group_id: String,
    /// The member's generation; -1 for a commit outside group management.
    pub generation_id: i32,
    /// Member id ("" outside group management).
    pub member_id: String,
    /// `group.instance.id` (v7+).
    pub group_instance_id: Option<String>,
    /// The offsets.
    pub offsets: Vec<OffsetToCommit>,
}

/// A TxnOffsetCommit request, decoded (v0–v3; KIP-98, KIP-447 adds the member fields).
#[derive(Debug, Clone)]
pub struct TxnCommitRequest {
    /// `group.id`.
    pub group_id: String,
    /// The transactional producer.
    pub producer_id: i64,
    /// Its epoch.
    pub producer_epoch: i16,
    /// The member's generation (v3+); -1 when not given.
    pub generation_id: i32,
    /// Member id (v3+); "" when not given.
    pub member_id: String,
    /// `group.instance.id` (v3+).
    pub group_instance_id: Option<String>,
    /// The offsets.
    pub offsets: Vec<OffsetToCommit>,
}

/// OffsetFetch's answer: per topic, per partition, the committed offset if any.
pub(crate) type FetchedOffsets = Vec<(String, Vec<(i32, Option<CommittedOffset>)>)>;

/// One member as DescribeGroups reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberDescription {
    /// Member id.
    pub member_id: String,
    /// `group.instance.id`.
    pub group_instance_id: Option<String>,
    /// Client id.
    pub client_id: String,
    /// Client address ("/127.0.0.1").
    pub client_host: String,
    /// Subscription metadata for the chosen protocol (Stable groups only, else empty).
    pub metadata: Bytes,
    /// Current assignment (Stable groups only, else empty).
    pub assignment: Bytes,
}

/// One group as DescribeGroups reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupDescription {
    /// `group.id`.
    pub group_id: String,
    /// State.
    pub state: GroupState,
    /// Protocol type ("" when none).
    pub protocol_type: String,
    /// Chosen protocol when Stable, else "".
    pub protocol: String,
    /// Members.
    pub members: Vec<MemberDescription>,
}

/// One group as ListGroups reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupListing {
    /// `group.id`.
    pub group_id: String,
    /// Protocol type ("" for groups that only hold offsets).
    pub protocol_type: String,
    /// State (of a classic group; a consumer-protocol group's is in `state_name`).
    pub state: GroupState,
    /// The state's name as ListGroups reports it ("Stable", ..., and for
    /// consumer-protocol groups "Assigning" / "Reconciling").
    pub state_name: &'static str,
    /// "classic" or "consumer" (ListGroups v5, KIP-848).
    pub group_type: &'static str,
}

struct Member {
    member_id: String,
    instance_id: Option<String>,
    client_id: String,
    client_host: String,
    session_timeout_ms: i32,
    rebalance_timeout_ms: i32,
    protocols: Vec<(String, Bytes)>,
    assignment: Bytes,
    join_waiter: Option<oneshot::Sender<JoinResult>>,
    sync_waiter: Option<oneshot::Sender<SyncResult>>,
    /// Sent SyncGroup in the current generation.
    synced: bool,
    last_heartbeat: Instant,
}

impl Member {
    fn metadata_for(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(name, _)| name == protocol)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }

    fn session_expired(&self, now: Instant) -> bool {
        self.join_waiter.is_none()
            && self.sync_waiter.is_none()
            && now.duration_since(self.last_heartbeat)
                > Duration::from_millis(self.session_timeout_ms.max(0) as u64)
    }
}

/// KIP-134: the first rebalance of an empty group waits `group.initial.rebalance.delay.ms`,
/// and again (up to the rebalance timeout) while new members keep arriving.
struct InitialDelay {
    delay_ms: u64,
    remaining_ms: u64,
    new_member_added: bool,
}

struct Group {
    id: String,
    state: GroupState,
    protocol_type: Option<String>,
    protocol: Option<String>,
    generation: i32,
    leader: Option<String>,
    members: IndexMap<String, Member>,
    /// Member ids handed out with MEMBER_ID_REQUIRED, until they join or time out.
    pending: HashMap<String, Instant>,
    /// group.instance.id → member id.
    static_members: HashMap<String, String>,
    join_deadline: Option<Instant>,
    initial_delay: Option<InitialDelay>,
    sync_deadline: Option<Instant>,
    offsets: BTreeMap<(String, i32), CommittedOffset>,
    /// Offsets committed in open transactions, by producer id: logged, not yet visible
    /// (TxnOffsetCommit; moved into `offsets` by the COMMIT marker, dropped by ABORT).
    pending_txn: BTreeMap<i64, BTreeMap<(String, i32), CommittedOffset>>,
    /// Wall-clock time the group last became empty (offset expiry, KIP-211).
    empty_since_ms: Option<i64>,
    /// Set for a group of the consumer protocol (KIP-848, `consumer.rs`); its classic
    /// fields then stay unused but `state`, which mirrors it: Empty with no members,
    /// else Stable (so offset expiry, deletion and simple commits treat both kinds alike).
    consumer: Option<Box<consumer::ConsumerGroup>>,
}

impl Group {
    fn new(id: &str) -> Group {
        Group {
            id: id.to_string(),
            state: GroupState::Empty,
            protocol_type: None,
            protocol: None,
            generation: 0,
            leader: None,
            members: IndexMap::new(),
            pending: HashMap::new(),
            static_members: HashMap::new(),
            join_deadline: None,
            initial_delay: None,
            sync_deadline: None,
            offsets: BTreeMap::new(),
            pending_txn: BTreeMap::new(),
            empty_since_ms: Some(now_ms()),
            consumer: None,
        }
    }

    /// A group as `__consumer_offsets` left it: Empty, with its protocol type,
    /// generation and committed offsets (members rejoin).
    fn loaded(id: &str, loaded: store::LoadedGroup, settings: &ConsumerGroupSettings) -> Group {
        let mut g = Group::new(id);
        g.protocol_type = loaded.protocol_type.filter(|p| !p.is_empty());
        g.generation = loaded.generation_id;
        g.offsets = loaded.offsets;
        g.pending_txn = loaded.pending;
        if let Some(epoch) = loaded.consumer_group_epoch {
            g.protocol_type = Some("consumer".to_string());
            g.consumer = Some(Box::new(consumer::ConsumerGroup::new(epoch, settings)));
        }
        g
    }

    /// Keeps `state` in step with a consumer-protocol group's members.
    fn sync_consumer_state(&mut self) {
        let Some(c) = &self.consumer else { return };
        let empty = c.is_empty();
        if empty && self.state != GroupState::Empty {
            self.empty_since_ms = Some(now_ms());
        }
        if !empty {
            self.empty_since_ms = None;
        }
        self.state = if empty {
            GroupState::Empty
        } else {
            GroupState::Stable
        };
    }

    fn max_rebalance_timeout_ms(&self) -> u64 {
        self.members
            .values()
            .map(|m| m.rebalance_timeout_ms.max(0) as u64)
            .max()
            .unwrap_or(0)
    }

    /// Protocols every member supports, in the first member's order. Linear in the total
    /// number of protocols (hash sets): a member may send very many.
    fn candidate_protocols(&self) -> Vec<String> {
        let mut members = self.members.values();
        let Some(first) = members.next() else {
            return Vec::new();
        };
        let mut common: HashSet<&str> = first.protocols.iter().map(|(n, _)| n.as_str()).collect();
        for m in members {
            let theirs: HashSet<&str> = m.protocols.iter().map(|(n, _)| n.as_str()).collect();
            common.retain(|n| theirs.contains(n));
        }
        let mut seen = HashSet::new();
        first
            .protocols
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| common.contains(n) && seen.insert(*n))
            .map(str::to_string)
            .collect()
    }

    /// Kafka's `supportsProtocols`: same type, and at least one protocol in common with
    /// every current member.
    fn supports(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        if self.members.is_empty() {
            return !protocol_type.is_empty() && !protocols.is_empty();
        }
        let offered: HashSet<&str> = protocols.iter().map(|(p, _)| p.as_str()).collect();
        self.protocol_type.as_deref() == Some(protocol_type)
            && self
                .candidate_protocols()
                .iter()
                .any(|c| offered.contains(c.as_str()))
    }

    /// Each member votes for its most preferred candidate; most votes wins (ties: the
    /// first member's order).
    fn select_protocol(&self) -> Option<String> {
        let candidates = self.candidate_protocols();
        let index: HashMap<&str, usize> = candidates
            .iter()
            .enumerate()
            .map(|(i, c)| (c.as_str(), i))
            .collect();
        let mut votes = vec![0usize; candidates.len()];
        for m in self.members.values() {
            if let Some(i) = m.protocols.iter().find_map(|(p, _)| index.get(p.as_str())) {
                votes[*i] += 1;
            }
        }
        let best = votes.iter().copied().max()?;
        votes
            .iter()
            .position(|v| *v == best)
            .map(|i| candidates[i].clone())
    }

    fn all_joined(&self) -> bool {
        self.pending.is_empty() && self.members.values().all(|m| m.join_waiter.is_some())
    }

    fn join_result_for(&self, member_id: &str) -> JoinResult {
        let is_leader = self.leader.as_deref() == Some(member_id);
        let protocol = self.protocol.clone().unwrap_or_default();
        JoinResult {
            error: None,
            generation_id: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            leader_id: self.leader.clone().unwrap_or_default(),
            member_id: member_id.to_string(),
            members: if is_leader {
                self.members
                    .values()
                    .map(|m| JoinedMember {
                        member_id: m.member_id.clone(),
                        group_instance_id: m.instance_id.clone(),
                        metadata: m.metadata_for(&protocol),
                    })
                    .collect()
            } else {
                Vec::new()
            },
            skip_assignment: false,
        }
    }

    /// Answers every parked SyncGroup with `error` (a new rebalance began). A member that
    /// was parked was alive until `now`: its session restarts from here.
    fn fail_sync_waiters(&mut self, error: ResponseError, now: Instant) {
        for m in self.members.values_mut() {
            if let Some(w) = m.sync_waiter.take() {
                m.last_heartbeat = now;
                let _ = w.send(SyncResult::error(error));
            }
        }
    }

    fn prepare_rebalance(&mut self, now: Instant, settings: &GroupSettings, reason: &str) {
        if self.state == GroupState::CompletingRebalance {
            self.fail_sync_waiters(ResponseError::RebalanceInProgress, now);
        }
        self.sync_deadline = None;
        if self.state == GroupState::Empty && settings.initial_rebalance_delay_ms > 0 {
            // With a delay of 0 the join phase ends as soon as every member is in.
            let delay_ms = settings.initial_rebalance_delay_ms;
            let remaining_ms = self.max_rebalance_timeout_ms().saturating_sub(delay_ms);
            self.join_deadline = Some(now + Duration::from_millis(delay_ms));
            self.initial_delay = Some(InitialDelay {
                delay_ms,
                remaining_ms,
                new_member_added: false,
            });
        } else {
            self.join_deadline = Some(now + Duration::from_millis(self.max_rebalance_timeout_ms()));
            self.initial_delay = None;
        }
        tracing::info!(group = %self.id, generation = self.generation, members = self.members.len(), reason, "preparing to rebalance");
        self.state = GroupState::PreparingRebalance;
    }

    /// Removes a member (left, session expired, fenced), answering its parked requests.
    fn remove_member(&mut self, member_id: &str) -> bool {
        let Some(mut m) = self.members.shift_remove(member_id) else {
            return false;
        };
        if let Some(w) = m.join_waiter.take() {
            let _ = w.send(JoinResult::error(member_id, ResponseError::UnknownMemberId));
        }
        if let Some(w) = m.sync_waiter.take() {
            let _ = w.send(SyncResult::error(ResponseError::UnknownMemberId));
        }
        if let Some(instance) = &m.instance_id {
            if self.static_members.get(instance).map(String::as_str) == Some(member_id) {
                self.static_members.remove(instance);
            }
        }
        if self.leader.as_deref() == Some(member_id) {
            self.leader = self.members.keys().next().cloned();
        }
        true
    }

    /// After members changed: start a rebalance, or finish the join phase if everyone
    /// is in.
    fn on_members_changed(
        &mut self,
        now: Instant,
        settings: &GroupSettings,
        store: &OffsetStore,
        reason: &str,
    ) {
        match self.state {
            GroupState::Stable | GroupState::CompletingRebalance => {
                self.prepare_rebalance(now, settings, reason);
                self.maybe_complete_join(now, store);
            }
            GroupState::PreparingRebalance => self.maybe_complete_join(now, store),
            GroupState::Empty | GroupState::Dead => {}
        }
    }

    fn maybe_complete_join(&mut self, now: Instant, store: &OffsetStore) {
        if self.state == GroupState::PreparingRebalance
            && self.initial_delay.is_none()
            && self.all_joined()
        {
            self.complete_join(now, store);
        }
    }

    /// Ends the join phase: drops members that did not rejoin, starts the next
    /// generation, answers every parked JoinGroup (the leader gets the member list).
    fn complete_join(&mut self, now: Instant, store: &OffsetStore) {
        let missing: Vec<String> = self
            .members
            .values()
            .filter(|m| m.join_waiter.is_none())
            .map(|m| m.member_id.clone())
            .collect();
        for id in &missing {
            tracing::info!(group = %self.id, member = %id, "member did not rejoin in time; removed");
            self.remove_member(id);
        }
        self.join_deadline = None;
        self.initial_delay = None;
        self.generation = self.generation.wrapping_add(1).max(1);
        if self.members.is_empty() {
            self.state = GroupState::Empty;
            self.protocol = None;
            self.leader = None;
            self.empty_since_ms = Some(now_ms());
            tracing::info!(group = %self.id, generation = self.generation, "group is empty");
            self.persist_group(store);
            return;
        }
        self.protocol = self.select_protocol();
        if self
            .leader
            .as_ref()
            .is_none_or(|l| !self.members.contains_key(l))
        {
            self.leader = self.members.keys().next().cloned();
        }
        self.state = GroupState::CompletingRebalance;
        self.empty_since_ms = None;
        self.sync_deadline = Some(now + Duration::from_millis(self.max_rebalance_timeout_ms()));
        tracing::info!(group = %self.id, generation = self.generation, members = self.members.len(), protocol = ?self.protocol, leader = ?self.leader, "join phase complete");
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            let result = self.join_result_for(&id);
            if let Some(m) = self.members.get_mut(&id) {
                m.synced = false;
                m.last_heartbeat = now;
                if let Some(w) = m.join_waiter.take() {
                    let _ = w.send(result);
                }
            }
        }
    }

    fn persist_group(&self, store: &OffsetStore) {
        let record = StoreRecord::group(
            &self.id,
            self.protocol_type.as_deref().unwrap_or(""),
            self.generation,
            self.protocol.as_deref(),
            self.leader.as_deref(),
        );
        if let Err(e) = store.append(&self.id, &[record]) {
            tracing::warn!(group = %self.id, error = %e, "cannot store group metadata");
        }
    }

    /// Topics the members subscribe to, from the consumer protocol subscription
    /// (ConsumerProtocolSubscription v0+: version, topics array of strings).
    fn subscribed_topics(&self) -> Option<Vec<String>> {
        if self.protocol_type.as_deref() != Some("consumer") {
            return None;
        }
        let protocol = self.protocol.as_deref()?;
        let mut topics = Vec::new();
        for m in self.members.values() {
            let mut b = m.metadata_for(protocol);
            if b.remaining() < 6 {
                continue;
            }
            let _version = b.get_i16();
            let n = b.get_i32();
            for _ in 0..n.max(0) {
                if b.remaining() < 2 {
                    break;
                }
                let len = b.get_i16().max(0) as usize;
                if b.remaining() < len {
                    break;
                }
                topics.push(String::from_utf8_lossy(&b.split_to(len)).into_owned());
            }
        }
        Some(topics)
    }
}

/// Longest group id accepted: a Kafka string (int16 length) — longer ones cannot be stored
/// in `__consumer_offsets` nor listed by non-flexible ListGroups.
const MAX_GROUP_ID_BYTES: usize = i16::MAX as usize;

/// Longest committed-offset metadata string storable (int16 length), whatever
/// `offset.metadata.max.bytes` says.
const MAX_METADATA_BYTES: usize = i16::MAX as usize;

/// INVALID_GROUP_ID for an empty id (when `allow_empty` is false, as for JoinGroup,
/// SyncGroup, Heartbeat, LeaveGroup; OffsetCommit accepts "" as Kafka does) or one longer
/// than a Kafka string.
fn check_group_id(group_id: &str, allow_empty: bool) -> Option<ResponseError> {
    ((group_id.is_empty() && !allow_empty) || group_id.len() > MAX_GROUP_ID_BYTES)
        .then_some(ResponseError::InvalidGroupId)
}

/// `error` for every offset of a known partition, UNKNOWN_TOPIC_OR_PARTITION (3) for
/// the others.
fn all_offsets(known: &[bool], error: ResponseError) -> Vec<Option<ResponseError>> {
    known
        .iter()
        .map(|k| {
            Some(if *k {
                error
            } else {
                ResponseError::UnknownTopicOrPartition
            })
        })
        .collect()
}

/// What [`GroupCoordinator::prepare_offsets`] made of a commit's offsets.
struct Prepared {
    /// One answer per offset (`None`: accepted).
    results: Vec<Option<ResponseError>>,
    /// The records of the accepted offsets.
    records: Vec<StoreRecord>,
    /// Per accepted offset: its index in `results`, its partition and the offset.
    accepted: Vec<(usize, (String, i32), CommittedOffset)>,
}

/// The tombstones removing a group's metadata record (a classic group's, and a
/// consumer-protocol group's when it is one).
fn group_tombstones(g: &Group) -> Vec<StoreRecord> {
    let mut out = vec![StoreRecord::group_tombstone(&g.id)];
    if g.consumer.is_some() {
        out.push(StoreRecord::consumer_group_tombstone(&g.id));
    }
    out
}

fn new_member_id(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4())
}

/// The coordinator of every group (this broker coordinates all of them: one node).
pub struct GroupCoordinator {
    groups: Mutex<HashMap<String, Group>>,
    /// `__consumer_offsets` partition → the leader epoch its groups were loaded at
    /// (Kafka's `onElection`: a partition led anew is loaded before its groups are
    /// served). Locked before `groups` when both are held.
    loaded: Mutex<HashMap<i32, i32>>,
    store: OffsetStore,
    metadata: Arc<Metadata>,
    settings: GroupSettings,
}

impl std::fmt::Debug for GroupCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCoordinator")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

enum JoinOutcome {
    Ready(JoinResult),
    Wait(oneshot::Receiver<JoinResult>),
}

impl GroupCoordinator {
    /// A coordinator that replays `__consumer_offsets` (if it exists) into its cache:
    /// groups come back Empty with their offsets and generation; members rejoin.
    ///
    /// Errors: the offsets topic cannot be read (I/O), as a message.
    pub fn open(
        metadata: Arc<Metadata>,
        replicas: Arc<ReplicaManager>,
        settings: GroupSettings,
    ) -> Result<GroupCoordinator, String> {
        let store = OffsetStore::new(metadata.clone(), replicas, settings);
        let loaded = store.load()?;
        let mut groups = HashMap::new();
        for (id, l) in loaded {
            groups.insert(id.clone(), Group::loaded(&id, l, &settings.consumer));
        }
        if !groups.is_empty() {
            tracing::info!(
                groups = groups.len(),
                "loaded consumer groups from {OFFSETS_TOPIC}"
            );
        }
        let loaded = store.led_partitions().into_iter().collect();
        Ok(GroupCoordinator {
            groups: Mutex::new(groups),
            loaded: Mutex::new(loaded),
            store,
            metadata,
            settings,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Group>> {
        self.groups.lock().expect("group coordinator lock poisoned")
    }

    /// Makes sure the groups of `group_id`'s `__consumer_offsets` partition are loaded
    /// from this broker's log for the current leadership of that partition (Kafka's
    /// `GroupCoordinator.onElection`): when this broker became its leader since the last
    /// load (a failover moved the coordinator here, or it came back), every group of the
    /// partition is replaced by what the log holds (committed offsets, generation); their
    /// members rejoin, as after a restart. Nothing to do when `__consumer_offsets` does
    /// not exist yet or the partition was loaded at this epoch. The caller checked that
    /// the metadata names this broker the partition's leader.
    ///
    /// Errors: COORDINATOR_LOAD_IN_PROGRESS (14) when the partition cannot be read, or
    /// when the caller found this broker leading it in the metadata before its replica
    /// took the leader role (the image is published before the replicas follow it); the
    /// client retries.
    pub fn ensure_loaded(&self, group_id: &str) -> Result<(), ResponseError> {
        let Some((partitions, index, epoch)) = self.store.leadership_of(group_id) else {
            return Ok(());
        };
        let Some(epoch) = epoch else {
            return Err(ResponseError::CoordinatorLoadInProgress);
        };
        let mut loaded = self.loaded.lock().expect("group loads lock poisoned");
        if loaded.get(&index) == Some(&epoch) {
            return Ok(());
        }
        let found = self.store.load_partition(index).map_err(|e| {
            tracing::error!(partition = index, error = %e, "cannot load the groups of {OFFSETS_TOPIC}");
            ResponseError::CoordinatorLoadInProgress
        })?;
        let count = found.len();
        {
            let mut groups = self.lock();
            groups.retain(|id, _| partition_for(id, partitions) != index);
            for (id, l) in found {
                groups.insert(id.clone(), Group::loaded(&id, l, &self.settings.consumer));
            }
        }
        loaded.insert(index, epoch);
        tracing::info!(
            partition = index,
            leader_epoch = epoch,
            groups = count,
            "leading {OFFSETS_TOPIC} partition: its groups are loaded"
        );
        Ok(())
    }

    /// Waits until everything written so far to `group_id`'s `__consumer_offsets`
    /// partition is on every in-sync replica (Kafka appends offset commits with acks=-1,
    /// so a commit answered is not lost with its coordinator), at most
    /// [`OFFSET_COMMIT_TIMEOUT_MS`] (Kafka's `offsets.commit.timeout.ms`). Parks on the
    /// partition's high watermark; never blocks a thread.
    ///
    /// Errors, as Kafka's `GroupMetadataManager` maps them: NOT_COORDINATOR (16) when
    /// this broker stopped leading the partition, COORDINATOR_NOT_AVAILABLE (15) when the
    /// replicas did not acknowledge in time or the ISR is too small.
    pub async fn await_replicated(&self, group_id: &str) -> Result<(), ResponseError> {
        let Some((_, index, Some(_))) = self.store.leadership_of(group_id) else {
            return Err(ResponseError::NotCoordinator);
        };
        let Some(partition) = self.store.partition(index) else {
            return Err(ResponseError::NotCoordinator);
        };
        let end = partition.offsets().log_end_offset;
        if end == 0 {
            return Ok(());
        }
        match partition
            .wait_for_high_watermark(end - 1, OFFSET_COMMIT_TIMEOUT_MS)
            .await
        {
            ReplicationWait::Replicated => Ok(()),
            ReplicationWait::NotLeader => Err(ResponseError::NotCoordinator),
            ReplicationWait::TimedOut | ReplicationWait::NotEnoughReplicasAfterAppend => {
                Err(ResponseError::CoordinatorNotAvailable)
            }
        }
    }

    /// Creates `__consumer_offsets` if needed (FindCoordinator does this first, as Kafka).
    ///
    /// Errors: COORDINATOR_NOT_AVAILABLE (15) when it cannot be created.
    pub fn ensure_offsets_topic(&self) -> Result<(), ResponseError> {
        self.store.ensure_topic().map_err(|e| {
            tracing::error!(error = %e, "group coordinator unavailable");
            ResponseError::CoordinatorNotAvailable
        })?;
        // Led partitions with empty logs (a topic this broker may just have created)
        // hold nothing to load: mark them loaded before any group is made in them, so a
        // concurrent `ensure_loaded` does not replace a group being made (it waits on
        // the lock, or finds them marked). A partition with records is loaded by
        // `ensure_loaded` when first used.
        let mut loaded = self.loaded.lock().expect("group loads lock poisoned");
        for (index, epoch) in self.store.led_partitions() {
            let empty = self
                .store
                .partition(index)
                .is_some_and(|p| p.offsets().log_end_offset == 0);
            if empty {
                loaded.entry(index).or_insert(epoch);
            }
        }
        Ok(())
    }

    /// An empty consumer-protocol group becomes a classic one, keeping its committed
    /// offsets (KIP-848's downgrade of an empty group), as a classic member joins it.
    fn convert_to_classic(&self, g: &mut Group) {
        let records = [StoreRecord::consumer_group_tombstone(&g.id)];
        if let Err(e) = self.store.append(&g.id, &records) {
            tracing::warn!(group = %g.id, error = %e, "cannot store the conversion to a classic group");
        }
        if let Some(c) = g.consumer.take() {
            g.generation = c.group_epoch();
        }
        g.protocol_type = None;
        g.state = GroupState::Empty;
        tracing::info!(group = %g.id, "empty consumer-protocol group converted to the classic protocol");
    }

    /// The consumer-protocol group a classic group with members would become (KIP-848's
    /// online upgrade, Kafka's `convertToConsumerGroup`); `g` is not changed (see
    /// [`GroupCoordinator::finish_upgrade`]).
    ///
    /// Errors: why it cannot (the policy, another protocol type, too many members, a
    /// member whose bytes are not the consumer embedded protocol).
    fn consumer_group_from_classic(
        &self,
        g: &Group,
        now: Instant,
    ) -> Result<consumer::ConsumerGroup, String> {
        let settings = &self.settings.consumer;
        if !settings.migration_policy.upgrade_enabled() {
            return Err("the online upgrade is disabled (group.consumer.migration.policy)".into());
        }
        if g.protocol_type.as_deref() != Some(consumer::CONSUMER_PROTOCOL_TYPE) {
            return Err("its members do not use the consumer embedded protocol".into());
        }
        if g.members.len() >= settings.max_size {
            return Err(format!(
                "it has {} members and group.consumer.max.size is {}",
                g.members.len(),
                settings.max_size
            ));
        }
        let members = g
            .members
            .values()
            .map(|m| consumer::ClassicMemberState {
                member_id: m.member_id.clone(),
                instance_id: m.instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                session_timeout_ms: m.session_timeout_ms,
                rebalance_timeout_ms: m.rebalance_timeout_ms,
                protocols: m.protocols.clone(),
                assignment: m.assignment.clone(),
            })
            .collect();
        consumer::ConsumerGroup::from_classic(
            g.generation,
            g.protocol.as_deref(),
            members,
            settings,
            now,
        )
    }

    /// Makes `g` the consumer-protocol group `c`: the classic members' parked JoinGroup
    /// and SyncGroup requests are answered REBALANCE_IN_PROGRESS (they rejoin into the
    /// new group) and the classic group's record is replaced.
    fn finish_upgrade(&self, g: &mut Group, c: consumer::ConsumerGroup) {
        for m in g.members.values_mut() {
            if let Some(w) = m.join_waiter.take() {
                let _ = w.send(JoinResult::error(
                    &m.member_id,
                    ResponseError::RebalanceInProgress,
                ));
            }
            if let Some(w) = m.sync_waiter.take() {
                let _ = w.send(SyncResult::error(ResponseError::RebalanceInProgress));
            }
        }
        let members = g.members.len();
        g.members.clear();
        g.pending.clear();
        g.static_members.clear();
        g.leader = None;
        g.protocol = None;
        g.join_deadline = None;
        g.sync_deadline = None;
        g.initial_delay = None;
        g.protocol_type = Some(consumer::CONSUMER_PROTOCOL_TYPE.to_string());
        let records = [
            StoreRecord::group_tombstone(&g.id),
            StoreRecord::consumer_group(&g.id, c.group_epoch()),
        ];
        g.consumer = Some(Box::new(c));
        g.sync_consumer_state();
        if let Err(e) = self.store.append(&g.id, &records) {
            tracing::warn!(group = %g.id, error = %e, "cannot store the upgrade to a consumer group");
        }
        tracing::info!(group = %g.id, classic_members = members, "classic group upgraded to the consumer protocol with its members (online migration)");
    }

    /// A consumer-protocol group whose members are all classic ones goes back to the
    /// classic protocol (KIP-848's online downgrade, Kafka's `convertToClassicGroup`):
    /// each member with its target assignment, generation = the highest member epoch, then
    /// a classic rebalance. Nothing happens when the policy or `group.max.size` forbids it.
    /// Returns whether it happened.
    fn maybe_downgrade(&self, g: &mut Group, now: Instant) -> bool {
        let Some(c) = &g.consumer else { return false };
        if !c.only_classic_members()
            || !self.settings.consumer.migration_policy.downgrade_enabled()
            || c.len() > self.settings.max_size
        {
            return false;
        }
        let Some(c) = g.consumer.take() else {
            return false;
        };
        g.generation = c.max_member_epoch().max(0);
        g.protocol_type = Some(consumer::CONSUMER_PROTOCOL_TYPE.to_string());
        g.members.clear();
        g.static_members.clear();
        g.pending.clear();
        for m in c.to_classic() {
            if let Some(instance) = &m.instance_id {
                g.static_members
                    .insert(instance.clone(), m.member_id.clone());
            }
            g.members.insert(
                m.member_id.clone(),
                Member {
                    member_id: m.member_id,
                    instance_id: m.instance_id,
                    client_id: m.client_id,
                    client_host: m.client_host,
                    session_timeout_ms: m.session_timeout_ms,
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    protocols: m.protocols,
                    assignment: m.assignment,
                    join_waiter: None,
                    sync_waiter: None,
                    synced: true,
                    last_heartbeat: now,
                },
            );
        }
        g.leader = g.members.keys().next().cloned();
        g.protocol = g.select_protocol();
        g.state = GroupState::Stable;
        g.empty_since_ms = None;
        if let Err(e) = self
            .store
            .append(&g.id, &[StoreRecord::consumer_group_tombstone(&g.id)])
        {
            tracing::warn!(group = %g.id, error = %e, "cannot store the downgrade to a classic group");
        }
        g.persist_group(&self.store);
        tracing::info!(group = %g.id, generation = g.generation, members = g.members.len(), "the last consumer-protocol member left: group back to the classic protocol with its classic members (online migration)");
        g.prepare_rebalance(now, &self.settings, "downgraded from the consumer protocol");
        true
    }

    /// ConsumerGroupHeartbeat (key 68, KIP-848): joins, heartbeats and leaves of
    /// consumer-protocol members, answered at once (never parked). A new group is made on
    /// a join (epoch 0); an empty classic group is converted, keeping its offsets; a
    /// classic group with members is upgraded with them (online migration,
    /// `group.consumer.migration.policy`). When the last consumer-protocol member leaves
    /// a group of classic members, it goes back to the classic protocol.
    ///
    /// Errors (in the result): INVALID_REQUEST (42) for an empty group id, INVALID_GROUP_ID
    /// (24) for one over 32767 bytes, COORDINATOR_NOT_AVAILABLE (15), GROUP_ID_NOT_FOUND
    /// (69) for a classic group with members that cannot be upgraded (the message says
    /// why), UNKNOWN_MEMBER_ID (25) for a heartbeat other than a join to no group or to a
    /// classic group that can be upgraded (a member from before a restart: it rejoins);
    /// the rest as [`consumer::ConsumerGroup::heartbeat`].
    pub(crate) fn consumer_heartbeat(
        &self,
        req: &consumer::HeartbeatRequest,
    ) -> consumer::HeartbeatResult {
        use consumer::HeartbeatResult;
        let settings = self.settings.consumer;
        let checked = match consumer::check(req, &settings) {
            Ok(c) => c,
            Err(e) => return e,
        };
        if let Some(e) = check_group_id(&req.group_id, false) {
            return HeartbeatResult::error(e, "The group id is too long.");
        }
        if let Err(e) = self.ensure_offsets_topic() {
            return HeartbeatResult::error(e, "The group coordinator is not available.");
        }
        let image = self.metadata.image();
        let now = Instant::now();
        let mut groups = self.lock();
        let mut records = Vec::new();
        // A join refused (no subscription, group full, ...) leaves no trace: a group made
        // or converted for it is dropped or converted back.
        let mut created = false;
        let mut converted_from = None;
        if !groups.contains_key(&req.group_id) {
            if req.member_epoch != 0 {
                return HeartbeatResult::error(
                    ResponseError::UnknownMemberId,
                    format!("Consumer group {} not found.", req.group_id),
                );
            }
            groups.insert(req.group_id.clone(), Group::new(&req.group_id));
            created = true;
        }
        let Some(g) = groups.get_mut(&req.group_id) else {
            return HeartbeatResult::error(ResponseError::CoordinatorNotAvailable, "");
        };
        if g.state == GroupState::Dead {
            return HeartbeatResult::error(ResponseError::CoordinatorNotAvailable, "");
        }
        if g.consumer.is_none() {
            if g.state != GroupState::Empty || !g.members.is_empty() || !g.pending.is_empty() {
                let upgrade = self.consumer_group_from_classic(g, now);
                if req.member_epoch != 0 && upgrade.is_ok() {
                    // A member of the group before a coordinator restart or failover (the
                    // group came back empty and a classic member made it classic again):
                    // unknown here, it rejoins with epoch 0, which upgrades the group.
                    return HeartbeatResult::error(
                        ResponseError::UnknownMemberId,
                        format!(
                            "Member {} is not a member of group {}: rejoin with epoch 0.",
                            req.member_id, req.group_id
                        ),
                    );
                }
                let mut c = match upgrade {
                    Ok(c) => c,
                    Err(why) => {
                        tracing::info!(group = %g.id, "classic group not upgraded to the consumer protocol: {why}");
                        return HeartbeatResult::error(
                            ResponseError::GroupIdNotFound,
                            format!(
                                "Group {} is not a consumer group (it has classic members) and cannot be upgraded: {why}.",
                                req.group_id
                            ),
                        );
                    }
                };
                // The join is tried on the group-to-be: a refused one leaves the classic
                // group as it was.
                let result = c.heartbeat(req, checked, now, &image, &settings);
                if result.error.is_none() {
                    self.finish_upgrade(g, c);
                }
                return result;
            }
            if req.member_epoch != 0 {
                return HeartbeatResult::error(
                    ResponseError::UnknownMemberId,
                    format!("Consumer group {} not found.", req.group_id),
                );
            }
            if g.protocol_type.is_some() {
                records.push(StoreRecord::group_tombstone(&g.id));
            }
            converted_from = Some((g.protocol_type.take(), g.protocol.clone(), g.leader.clone()));
            g.consumer = Some(Box::new(consumer::ConsumerGroup::new(
                g.generation.max(0),
                &settings,
            )));
            g.protocol_type = Some("consumer".to_string());
            g.protocol = None;
            g.leader = None;
        }
        let Some(c) = g.consumer.as_mut() else {
            return HeartbeatResult::error(ResponseError::CoordinatorNotAvailable, "");
        };
        let epoch_before = c.group_epoch();
        let result = c.heartbeat(req, checked, now, &image, &settings);
        if result.error.is_some() && c.is_empty() {
            if created {
                groups.remove(&req.group_id);
            } else if let Some((protocol_type, protocol, leader)) = converted_from {
                g.consumer = None;
                g.protocol_type = protocol_type;
                g.protocol = protocol;
                g.leader = leader;
            }
            return result;
        }
        if converted_from.as_ref().is_some_and(|(t, _, _)| t.is_some()) {
            tracing::info!(group = %g.id, "empty classic group converted to the consumer protocol");
        }
        if c.group_epoch() != epoch_before || !records.is_empty() {
            records.push(StoreRecord::consumer_group(&g.id, c.group_epoch()));
        }
        if self.maybe_downgrade(g, now) {
            return result;
        }
        g.sync_consumer_state();
        if !records.is_empty() {
            if let Err(e) = self.store.append(&g.id, &records) {
                tracing::warn!(group = %g.id, error = %e, "cannot store consumer group metadata");
            }
        }
        result
    }

    /// ConsumerGroupDescribe (key 69, KIP-848) of one group.
    ///
    /// Errors: GROUP_ID_NOT_FOUND (69) for no group or a classic one, with a message.
    pub(crate) fn consumer_describe(
        &self,
        group_id: &str,
    ) -> Result<ConsumerGroupDescription, (ResponseError, String)> {
        let groups = self.lock();
        let Some(g) = groups.get(group_id).filter(|g| g.state != GroupState::Dead) else {
            return Err((
                ResponseError::GroupIdNotFound,
                format!("Group {group_id} not found."),
            ));
        };
        match &g.consumer {
            Some(c) => Ok(c.describe(&self.metadata.image())),
            None => Err((
                ResponseError::GroupIdNotFound,
                format!("Group {group_id} is not a consumer group."),
            )),
        }
    }

    /// OffsetFetch v9 from a member of a consumer-protocol group (Kafka's
    /// `ConsumerGroup.validateOffsetFetch`): with a member epoch of 0 or more, the member
    /// must be known and at that epoch. Nothing to check for -1 (an admin or a consumer
    /// outside group management) or a classic group.
    ///
    /// Errors: UNKNOWN_MEMBER_ID (25), STALE_MEMBER_EPOCH (113).
    pub fn validate_offset_fetch(
        &self,
        group_id: &str,
        member_id: &str,
        member_epoch: i32,
    ) -> Result<(), ResponseError> {
        if member_epoch < 0 {
            return Ok(());
        }
        let mut groups = self.lock();
        match groups.get_mut(group_id).and_then(|g| g.consumer.as_mut()) {
            Some(c) => c.validate_member(member_id, member_epoch, Instant::now()),
            None => Ok(()),
        }
    }

    /// "consumer" or "classic" for an existing group (KIP-848 group types).
    pub fn group_type(&self, group_id: &str) -> Option<&'static str> {
        self.lock().get(group_id).map(|g| {
            if g.consumer.is_some() {
                "consumer"
            } else {
                "classic"
            }
        })
    }

    /// JoinGroup: answers at once (errors, MEMBER_ID_REQUIRED, a rejoin that changes
    /// nothing) or when the join phase completes.
    ///
    /// Errors (in the result): INVALID_GROUP_ID (24), INCONSISTENT_GROUP_PROTOCOL (23),
    /// INVALID_SESSION_TIMEOUT (26), UNKNOWN_MEMBER_ID (25), MEMBER_ID_REQUIRED (79),
    /// FENCED_INSTANCE_ID (82), GROUP_MAX_SIZE_REACHED (81), COORDINATOR_NOT_AVAILABLE (15).
    pub async fn join(&self, req: JoinRequest) -> JoinResult {
        let outcome = self.join_locked(&req, Instant::now());
        match outcome {
            JoinOutcome::Ready(r) => r,
            JoinOutcome::Wait(rx) => rx.await.unwrap_or_else(|_| {
                JoinResult::error(&req.member_id, ResponseError::CoordinatorNotAvailable)
            }),
        }
    }

    fn join_locked(&self, req: &JoinRequest, now: Instant) -> JoinOutcome {
        use JoinOutcome::Ready;
        let err = |e| Ready(JoinResult::error(&req.member_id, e));
        if let Some(e) = check_group_id(&req.group_id, false) {
            return err(e);
        }
        if req.session_timeout_ms < self.settings.min_session_timeout_ms
            || req.session_timeout_ms > self.settings.max_session_timeout_ms
        {
            return err(ResponseError::InvalidSessionTimeout);
        }
        if req.protocol_type.is_empty() || req.protocols.is_empty() {
            return err(ResponseError::InconsistentGroupProtocol);
        }
        if let Err(e) = self.ensure_offsets_topic() {
            return err(e);
        }
        let image = self.metadata.image();
        let mut groups = self.lock();
        if !groups.contains_key(&req.group_id) {
            if !req.member_id.is_empty() {
                return err(ResponseError::UnknownMemberId);
            }
            groups.insert(req.group_id.clone(), Group::new(&req.group_id));
        }
        let Some(g) = groups.get_mut(&req.group_id) else {
            return err(ResponseError::CoordinatorNotAvailable);
        };
        if g.state == GroupState::Dead {
            return err(ResponseError::CoordinatorNotAvailable);
        }
        if let Some(c) = g.consumer.as_mut() {
            if !c.is_empty() {
                // A classic member inside a consumer-protocol group (KIP-848's online
                // migration): answered at once, the broker assigns.
                let epoch_before = c.group_epoch();
                let joined = c.classic_join(
                    &consumer::ClassicJoinRequest {
                        member_id: &req.member_id,
                        instance_id: req.group_instance_id.as_deref(),
                        require_known_member_id: req.require_known_member_id,
                        session_timeout_ms: req.session_timeout_ms,
                        rebalance_timeout_ms: req.rebalance_timeout_ms,
                        protocol_type: &req.protocol_type,
                        protocols: &req.protocols,
                        client_id: &req.client_id,
                        client_host: &req.client_host,
                    },
                    now,
                    &image,
                    &self.settings.consumer,
                );
                let result = match joined {
                    Err(e) => JoinResult::error(&req.member_id, e),
                    Ok(consumer::ClassicJoin::MemberIdRequired(id)) => {
                        JoinResult::error(&id, ResponseError::MemberIdRequired)
                    }
                    Ok(consumer::ClassicJoin::Joined {
                        member_id,
                        generation,
                        protocol_name,
                    }) => JoinResult {
                        error: None,
                        generation_id: generation,
                        protocol_type: Some(consumer::CONSUMER_PROTOCOL_TYPE.to_string()),
                        protocol_name: Some(protocol_name),
                        leader_id: String::new(),
                        member_id,
                        members: Vec::new(),
                        skip_assignment: false,
                    },
                };
                if c.group_epoch() != epoch_before {
                    let record = StoreRecord::consumer_group(&g.id, c.group_epoch());
                    if let Err(e) = self.store.append(&g.id, &[record]) {
                        tracing::warn!(group = %g.id, error = %e, "cannot store consumer group metadata");
                    }
                }
                // A static classic member replacing the last consumer-protocol one.
                if !self.maybe_downgrade(g, now) {
                    g.sync_consumer_state();
                }
                return Ready(result);
            }
            self.convert_to_classic(g);
        }
        if !g.supports(&req.protocol_type, &req.protocols) {
            return err(ResponseError::InconsistentGroupProtocol);
        }
        if req.member_id.is_empty() {
            self.join_new_member(g, req, now)
        } else {
            self.join_known_member(g, req, now)
        }
    }

    fn add_member(
        &self,
        g: &mut Group,
        req: &JoinRequest,
        member_id: String,
        now: Instant,
    ) -> oneshot::Receiver<JoinResult> {
        let (tx, rx) = oneshot::channel();
        if g.members.is_empty() {
            g.protocol_type = Some(req.protocol_type.clone());
        }
        if let Some(instance) = &req.group_instance_id {
            g.static_members.insert(instance.clone(), member_id.clone());
        }
        if g.leader.is_none() {
            g.leader = Some(member_id.clone());
        }
        g.members.insert(
            member_id.clone(),
            Member {
                member_id,
                instance_id: req.group_instance_id.clone(),
                client_id: req.client_id.clone(),
                client_host: req.client_host.clone(),
                session_timeout_ms: req.session_timeout_ms,
                rebalance_timeout_ms: req.rebalance_timeout_ms,
                protocols: req.protocols.clone(),
                assignment: Bytes::new(),
                join_waiter: Some(tx),
                sync_waiter: None,
                synced: false,
                last_heartbeat: now,
            },
        );
        if let Some(d) = &mut g.initial_delay {
            d.new_member_added = true;
        }
        rx
    }

    fn join_new_member(&self, g: &mut Group, req: &JoinRequest, now: Instant) -> JoinOutcome {
        let settings = self.settings;
        if let Some(instance) = &req.group_instance_id {
            if let Some(old_id) = g.static_members.get(instance).cloned() {
                return self.replace_static_member(g, req, &old_id, now);
            }
        } else if req.require_known_member_id {
            if g.members.len() + g.pending.len() >= settings.max_size {
                return JoinOutcome::Ready(JoinResult::error(
                    "",
                    ResponseError::GroupMaxSizeReached,
                ));
            }
            let member_id = new_member_id(&req.client_id);
            g.pending.insert(
                member_id.clone(),
                now + Duration::from_millis(req.session_timeout_ms.max(0) as u64),
            );
            return JoinOutcome::Ready(JoinResult::error(
                &member_id,
                ResponseError::MemberIdRequired,
            ));
        }
        if g.members.len() >= settings.max_size {
            return JoinOutcome::Ready(JoinResult::error("", ResponseError::GroupMaxSizeReached));
        }
        let prefix = req.group_instance_id.as_deref().unwrap_or(&req.client_id);
        let member_id = new_member_id(prefix);
        let rx = self.add_member(g, req, member_id, now);
        self.after_join(g, now, "new member joined");
        JoinOutcome::Wait(rx)
    }

    /// KIP-345: a static member came back with a new member id. In a Stable group with
    /// unchanged protocols it gets the old member's place and assignment, no rebalance.
    fn replace_static_member(
        &self,
        g: &mut Group,
        req: &JoinRequest,
        old_id: &str,
        now: Instant,
    ) -> JoinOutcome {
        let new_id = new_member_id(req.group_instance_id.as_deref().unwrap_or("static"));
        let Some(mut old) = g.members.shift_remove(old_id) else {
            g.static_members
                .remove(req.group_instance_id.as_deref().unwrap_or(""));
            return self.join_new_member(g, req, now);
        };
        // The old incarnation's parked requests are fenced.
        if let Some(w) = old.join_waiter.take() {
            let _ = w.send(JoinResult::error(old_id, ResponseError::FencedInstanceId));
        }
        if let Some(w) = old.sync_waiter.take() {
            let _ = w.send(SyncResult::error(ResponseError::FencedInstanceId));
        }
        let protocols_changed = old.protocols != req.protocols;
        old.member_id = new_id.clone();
        old.client_id = req.client_id.clone();
        old.client_host = req.client_host.clone();
        old.session_timeout_ms = req.session_timeout_ms;
        old.rebalance_timeout_ms = req.rebalance_timeout_ms;
        old.protocols = req.protocols.clone();
        old.last_heartbeat = now;
        g.members.insert(new_id.clone(), old);
        if let Some(instance) = &req.group_instance_id {
            g.static_members.insert(instance.clone(), new_id.clone());
        }
        if g.leader.as_deref() == Some(old_id) {
            g.leader = Some(new_id.clone());
        }
        tracing::info!(group = %g.id, instance = ?req.group_instance_id, old = %old_id, new = %new_id, "static member rejoined");
        if g.state == GroupState::Stable && !protocols_changed {
            let mut result = g.join_result_for(&new_id);
            if g.leader.as_deref() == Some(new_id.as_str()) {
                result.skip_assignment = true;
            }
            if let Some(m) = g.members.get_mut(&new_id) {
                m.synced = false;
            }
            return JoinOutcome::Ready(result);
        }
        let (tx, rx) = oneshot::channel();
        if let Some(m) = g.members.get_mut(&new_id) {
            m.join_waiter = Some(tx);
        }
        self.after_join(g, now, "static member rejoined");
        JoinOutcome::Wait(rx)
    }

    fn join_known_member(&self, g: &mut Group, req: &JoinRequest, now: Instant) -> JoinOutcome {
        let id = req.member_id.as_str();
        if g.pending.remove(id).is_some() {
            if g.members.len() >= self.settings.max_size {
                return JoinOutcome::Ready(JoinResult::error(
                    id,
                    ResponseError::GroupMaxSizeReached,
                ));
            }
            let rx = self.add_member(g, req, id.to_string(), now);
            self.after_join(g, now, "new member joined");
            return JoinOutcome::Wait(rx);
        }
        if let Some(instance) = &req.group_instance_id {
            if let Some(current) = g.static_members.get(instance) {
                if current != id {
                    return JoinOutcome::Ready(JoinResult::error(
                        id,
                        ResponseError::FencedInstanceId,
                    ));
                }
            }
        }
        let state = g.state;
        let is_leader = g.leader.as_deref() == Some(id);
        let Some(m) = g.members.get_mut(id) else {
            return JoinOutcome::Ready(JoinResult::error(id, ResponseError::UnknownMemberId));
        };
        let unchanged = m.protocols == req.protocols;
        m.last_heartbeat = now;
        m.client_id = req.client_id.clone();
        m.session_timeout_ms = req.session_timeout_ms;
        m.rebalance_timeout_ms = req.rebalance_timeout_ms;
        match state {
            GroupState::CompletingRebalance | GroupState::Stable if unchanged && !is_leader => {
                JoinOutcome::Ready(g.join_result_for(id))
            }
            GroupState::CompletingRebalance if unchanged => {
                JoinOutcome::Ready(g.join_result_for(id))
            }
            GroupState::Empty | GroupState::Dead => {
                JoinOutcome::Ready(JoinResult::error(id, ResponseError::UnknownMemberId))
            }
            _ => {
                m.protocols = req.protocols.clone();
                let (tx, rx) = oneshot::channel();
                if let Some(old) = m.join_waiter.replace(tx) {
                    let _ = old.send(JoinResult::error(id, ResponseError::UnknownMemberId));
                }
                self.after_join(g, now, "member rejoined");
                JoinOutcome::Wait(rx)
            }
        }
    }

    fn after_join(&self, g: &mut Group, now: Instant, reason: &str) {
        match g.state {
            GroupState::Empty | GroupState::Stable | GroupState::CompletingRebalance => {
                g.prepare_rebalance(now, &self.settings, reason)
            }
            _ => {}
        }
        g.maybe_complete_join(now, &self.store);
    }

    /// SyncGroup: the leader's request delivers every member's assignment; a follower's
    /// waits for it (never answered early with an empty assignment).
    ///
    /// Errors (in the result): INVALID_GROUP_ID (24), UNKNOWN_MEMBER_ID (25),
    /// ILLEGAL_GENERATION (22), INCONSISTENT_GROUP_PROTOCOL (23), REBALANCE_IN_PROGRESS
    /// (27), FENCED_INSTANCE_ID (82).
    pub async fn sync(&self, req: SyncRequest) -> SyncResult {
        let rx = {
            let mut groups = self.lock();
            match self.sync_locked(&mut groups, &req) {
                Ok(result) => return result,
                Err(rx) => rx,
            }
        };
        rx.await
            .unwrap_or_else(|_| SyncResult::error(ResponseError::CoordinatorNotAvailable))
    }

    fn sync_locked(
        &self,
        groups: &mut HashMap<String, Group>,
        req: &SyncRequest,
    ) -> Result<SyncResult, oneshot::Receiver<SyncResult>> {
        if let Some(e) = check_group_id(&req.group_id, false) {
            return Ok(SyncResult::error(e));
        }
        let Some(g) = groups.get_mut(&req.group_id) else {
            return Ok(SyncResult::error(ResponseError::UnknownMemberId));
        };
        if let Some(c) = g.consumer.as_mut() {
            // A classic member of a consumer-protocol group (online migration).
            return Ok(
                match c.classic_sync(
                    &req.member_id,
                    req.group_instance_id.as_deref(),
                    req.generation_id,
                    req.protocol_type.as_deref(),
                    req.protocol_name.as_deref(),
                    Instant::now(),
                ) {
                    Ok((assignment, protocol_name)) => SyncResult {
                        error: None,
                        protocol_type: Some(consumer::CONSUMER_PROTOCOL_TYPE.to_string()),
                        protocol_name: Some(protocol_name),
                        assignment,
                    },
                    Err(e) => SyncResult::error(e),
                },
            );
        }
        if !g.members.contains_key(&req.member_id) {
            return Ok(SyncResult::error(ResponseError::UnknownMemberId));
        }
        if let Some(instance) = &req.group_instance_id {
            if g.static_members.get(instance) != Some(&req.member_id) {
                return Ok(SyncResult::error(ResponseError::FencedInstanceId));
            }
        }
        if req.generation_id != g.generation {
            return Ok(SyncResult::error(ResponseError::IllegalGeneration));
        }
        if req
            .protocol_type
            .as_ref()
            .is_some_and(|p| Some(p) != g.protocol_type.as_ref())
            || req
                .protocol_name
                .as_ref()
                .is_some_and(|p| Some(p) != g.protocol.as_ref())
        {
            return Ok(SyncResult::error(ResponseError::InconsistentGroupProtocol));
        }
        let ok = |g: &Group, assignment: Bytes| SyncResult {
            error: None,
            protocol_type: g.protocol_type.clone(),
            protocol_name: g.protocol.clone(),
            assignment,
        };
        match g.state {
            GroupState::Empty | GroupState::Dead => {
                Ok(SyncResult::error(ResponseError::UnknownMemberId))
            }
            GroupState::PreparingRebalance => {
                Ok(SyncResult::error(ResponseError::RebalanceInProgress))
            }
            GroupState::Stable => {
                let assignment = {
                    let m = g.members.get_mut(&req.member_id).expect("checked above");
                    m.synced = true;
                    m.assignment.clone()
                };
                if g.members.values().all(|m| m.synced) {
                    g.sync_deadline = None;
                }
                Ok(ok(g, assignment))
            }
            GroupState::CompletingRebalance => {
                let (tx, rx) = oneshot::channel();
                {
                    let m = g.members.get_mut(&req.member_id).expect("checked above");
                    m.synced = true;
                    m.last_heartbeat = Instant::now();
                    m.sync_waiter = Some(tx);
                }
                if g.leader.as_deref() == Some(req.member_id.as_str()) {
                    let assigned: HashMap<&str, &Bytes> = req
                        .assignments
                        .iter()
                        .map(|(id, a)| (id.as_str(), a))
                        .collect();
                    for m in g.members.values_mut() {
                        m.assignment = assigned
                            .get(m.member_id.as_str())
                            .map(|a| (*a).clone())
                            .unwrap_or_default();
                    }
                    g.persist_group(&self.store);
                    g.state = GroupState::Stable;
                    tracing::info!(group = %g.id, generation = g.generation, "group is stable");
                    let (protocol_type, protocol_name) =
                        (g.protocol_type.clone(), g.protocol.clone());
                    for m in g.members.values_mut() {
                        if let Some(w) = m.sync_waiter.take() {
                            let _ = w.send(SyncResult {
                                error: None,
                                protocol_type: protocol_type.clone(),
                                protocol_name: protocol_name.clone(),
                                assignment: m.assignment.clone(),
                            });
                        }
                    }
                    if g.members.values().all(|m| m.synced) {
                        g.sync_deadline = None;
                    }
                }
                Err(rx)
            }
        }
    }

    /// Heartbeat: keeps a member's session alive and tells it when to rejoin.
    ///
    /// Errors: INVALID_GROUP_ID (24), UNKNOWN_MEMBER_ID (25), ILLEGAL_GENERATION (22),
    /// REBALANCE_IN_PROGRESS (27), FENCED_INSTANCE_ID (82).
    pub fn heartbeat(
        &self,
        group_id: &str,
        generation_id: i32,
        member_id: &str,
        group_instance_id: Option<&str>,
    ) -> Option<ResponseError> {
        if let Some(e) = check_group_id(group_id, false) {
            return Some(e);
        }
        let mut groups = self.lock();
        let Some(g) = groups.get_mut(group_id) else {
            return Some(ResponseError::UnknownMemberId);
        };
        if let Some(c) = g.consumer.as_mut() {
            // A classic member of a consumer-protocol group (online migration).
            return c.classic_heartbeat(
                member_id,
                group_instance_id,
                generation_id,
                Instant::now(),
            );
        }
        if let Some(instance) = group_instance_id {
            if let Some(current) = g.static_members.get(instance) {
                if current != member_id {
                    return Some(ResponseError::FencedInstanceId);
                }
            }
        }
        let state = g.state;
        let generation = g.generation;
        let Some(m) = g.members.get_mut(member_id) else {
            return Some(ResponseError::UnknownMemberId);
        };
        match state {
            GroupState::Empty | GroupState::Dead => Some(ResponseError::UnknownMemberId),
            _ if generation_id != generation => Some(ResponseError::IllegalGeneration),
            GroupState::PreparingRebalance => {
                m.last_heartbeat = Instant::now();
                Some(ResponseError::RebalanceInProgress)
            }
            GroupState::CompletingRebalance | GroupState::Stable => {
                m.last_heartbeat = Instant::now();
                None
            }
        }
    }

    /// LeaveGroup for each `(member_id, group_instance_id)`: per-member errors
    /// UNKNOWN_MEMBER_ID (25) or FENCED_INSTANCE_ID (82); a group-level INVALID_GROUP_ID
    /// (24) as `Err`.
    pub fn leave(
        &self,
        group_id: &str,
        members: &[(String, Option<String>)],
    ) -> Result<Vec<Option<ResponseError>>, ResponseError> {
        if let Some(e) = check_group_id(group_id, false) {
            return Err(e);
        }
        let now = Instant::now();
        let mut groups = self.lock();
        let Some(g) = groups.get_mut(group_id) else {
            return Ok(vec![Some(ResponseError::UnknownMemberId); members.len()]);
        };
        if let Some(c) = g.consumer.as_mut() {
            // Classic members of a consumer-protocol group (online migration).
            let results: Vec<Option<ResponseError>> = members
                .iter()
                .map(|(member_id, instance)| c.classic_leave(member_id, instance.as_deref()).err())
                .collect();
            if results.iter().any(Option::is_none) {
                let record = StoreRecord::consumer_group(&g.id, c.group_epoch());
                if let Err(e) = self.store.append(&g.id, &[record]) {
                    tracing::warn!(group = %g.id, error = %e, "cannot store consumer group metadata");
                }
                if !self.maybe_downgrade(g, now) {
                    g.sync_consumer_state();
                }
            }
            return Ok(results);
        }
        let mut results = Vec::with_capacity(members.len());
        let mut removed = 0;
        for (member_id, instance) in members {
            let target = match instance {
                Some(instance) => match g.static_members.get(instance) {
                    Some(current) if member_id.is_empty() || current == member_id => {
                        Some(current.clone())
                    }
                    Some(_) => {
                        results.push(Some(ResponseError::FencedInstanceId));
                        continue;
                    }
                    None => None,
                },
                None => Some(member_id.clone()),
            };
            let Some(target) = target else {
                results.push(Some(ResponseError::UnknownMemberId));
                continue;
            };
            if g.pending.remove(&target).is_some() {
                results.push(None);
                removed += 1;
            } else if g.remove_member(&target) {
                tracing::info!(group = %g.id, member = %target, "member left");
                results.push(None);
                removed += 1;
            } else {
                results.push(Some(ResponseError::UnknownMemberId));
            }
        }
        if removed > 0 {
            g.on_members_changed(now, &self.settings, &self.store, "member left");
        }
        Ok(results)
    }

    /// OffsetCommit: validates the member (unless the group is empty and the commit is
    /// outside group management, generation -1) and writes the offsets to
    /// `__consumer_offsets` as one batch before answering.
    ///
    /// Returns one error per offset, in order. An empty group id is accepted (Kafka keeps
    /// it for old clients). Errors: INVALID_GROUP_ID (24) for an id over 32767 bytes,
    /// ILLEGAL_GENERATION (22), UNKNOWN_MEMBER_ID (25), REBALANCE_IN_PROGRESS (27),
    /// FENCED_INSTANCE_ID (82), UNKNOWN_TOPIC_OR_PARTITION (3), OFFSET_METADATA_TOO_LARGE
    /// (12), COORDINATOR_NOT_AVAILABLE (15) when the offsets topic cannot be written.
    pub fn commit(&self, req: &CommitRequest) -> Vec<Option<ResponseError>> {
        // Unknown partitions are refused before the group is looked at (Kafka's KafkaApis
        // filters them out before the coordinator sees the request).
        let known = self.known_partitions(&req.offsets);
        let all = |e: ResponseError| all_offsets(&known, e);
        if let Some(e) = check_group_id(&req.group_id, true) {
            return all(e);
        }
        if let Err(e) = self.ensure_offsets_topic() {
            return all(e);
        }
        let mut groups = self.lock();
        if !groups.contains_key(&req.group_id) {
            if req.generation_id >= 0 {
                return all(ResponseError::IllegalGeneration);
            }
            groups.insert(req.group_id.clone(), Group::new(&req.group_id));
        }
        let Some(g) = groups.get_mut(&req.group_id) else {
            return all(ResponseError::CoordinatorNotAvailable);
        };
        let simple = req.generation_id < 0 && g.state == GroupState::Empty;
        if let Some(c) = g.consumer.as_mut() {
            if !simple {
                if let Err(e) = c.validate_member(&req.member_id, req.generation_id, Instant::now())
                {
                    return all(e);
                }
            }
        } else if !simple {
            if g.state == GroupState::Dead {
                return all(ResponseError::CoordinatorNotAvailable);
            }
            if let Some(instance) = &req.group_instance_id {
                if g.static_members
                    .get(instance)
                    .is_some_and(|current| current != &req.member_id)
                {
                    return all(ResponseError::FencedInstanceId);
                }
            }
            if !g.members.contains_key(&req.member_id) {
                return all(ResponseError::UnknownMemberId);
            }
            if req.generation_id != g.generation {
                return all(ResponseError::IllegalGeneration);
            }
            if g.state == GroupState::CompletingRebalance {
                return all(ResponseError::RebalanceInProgress);
            }
            if let Some(m) = g.members.get_mut(&req.member_id) {
                m.last_heartbeat = Instant::now();
            }
        }
        let Prepared {
            mut results,
            records,
            accepted,
        } = self.prepare_offsets(&g.id, &req.offsets, &known);
        if let Err(e) = self.store.append(&g.id, &records) {
            tracing::error!(group = %g.id, error = %e, "offset commit not stored");
            for (i, _, _) in &accepted {
                results[*i] = Some(ResponseError::CoordinatorNotAvailable);
            }
            return results;
        }
        for (_, key, c) in accepted {
            g.offsets.insert(key, c);
        }
        results
    }

    /// Whether each offset names a partition the metadata has (Kafka's KafkaApis refuses
    /// the others before the coordinator sees the request).
    fn known_partitions(&self, offsets: &[OffsetToCommit]) -> Vec<bool> {
        offsets
            .iter()
            .map(|o| {
                self.metadata
                    .topic(&o.topic)
                    .is_some_and(|t| (0..t.partitions).contains(&o.partition))
            })
            .collect()
    }

    /// The records of `offsets` for group `group_id` and the answer of each: unknown
    /// partitions and metadata over `offset.metadata.max.bytes` are refused, the rest
    /// accepted (their records to append, and what to cache once appended).
    fn prepare_offsets(
        &self,
        group_id: &str,
        offsets: &[OffsetToCommit],
        known: &[bool],
    ) -> Prepared {
        let now = now_ms();
        let mut out = Prepared {
            results: Vec::with_capacity(offsets.len()),
            records: Vec::new(),
            accepted: Vec::new(),
        };
        let max_metadata = self
            .settings
            .offset_metadata_max_bytes
            .min(MAX_METADATA_BYTES);
        for (o, known) in offsets.iter().zip(known) {
            let metadata = o.metadata.clone().unwrap_or_default();
            if !known {
                out.results
                    .push(Some(ResponseError::UnknownTopicOrPartition));
            } else if metadata.len() > max_metadata {
                out.results
                    .push(Some(ResponseError::OffsetMetadataTooLarge));
            } else {
                let c = CommittedOffset {
                    offset: o.offset,
                    leader_epoch: o.leader_epoch,
                    metadata,
                    commit_timestamp_ms: now,
                };
                out.records
                    .push(StoreRecord::offset(group_id, &o.topic, o.partition, &c));
                out.accepted
                    .push((out.results.len(), (o.topic.clone(), o.partition), c));
                out.results.push(None);
            }
        }
        out
    }

    /// TxnOffsetCommit: logs the offsets as part of the producer's transaction (a
    /// transactional batch in the group's `__consumer_offsets` partition, which the
    /// transaction coordinator added to the transaction with AddOffsetsToTxn); they stay
    /// pending, invisible to OffsetFetch, until [`GroupCoordinator::complete_txn`] sees
    /// the marker. Member and generation are checked when given (KIP-447), as
    /// OffsetCommit checks them.
    ///
    /// Errors per offset: UNKNOWN_TOPIC_OR_PARTITION (3), INVALID_GROUP_ID (24),
    /// UNKNOWN_MEMBER_ID (25), ILLEGAL_GENERATION (22), FENCED_INSTANCE_ID (82),
    /// OFFSET_METADATA_TOO_LARGE (12), COORDINATOR_NOT_AVAILABLE (15) when the offsets
    /// topic cannot be written, INVALID_PRODUCER_EPOCH (47) when the log fences the
    /// producer.
    pub fn txn_commit(&self, req: &TxnCommitRequest) -> Vec<Option<ResponseError>> {
        let known = self.known_partitions(&req.offsets);
        let all = |e: ResponseError| all_offsets(&known, e);
        if let Some(e) = check_group_id(&req.group_id, false) {
            return all(e);
        }
        if let Err(e) = self.ensure_offsets_topic() {
            return all(e);
        }
        let mut groups = self.lock();
        let g = groups
            .entry(req.group_id.clone())
            .or_insert_with(|| Group::new(&req.group_id));
        if g.state == GroupState::Dead {
            return all(ResponseError::CoordinatorNotAvailable);
        }
        if let Some(c) = g.consumer.as_mut() {
            if !req.member_id.is_empty() || req.generation_id >= 0 {
                if let Err(e) = c.validate_member(&req.member_id, req.generation_id, Instant::now())
                {
                    return all(e);
                }
            }
        } else if let Some(instance) = &req.group_instance_id {
            if g.static_members
                .get(instance)
                .is_some_and(|current| current != &req.member_id)
            {
                return all(ResponseError::FencedInstanceId);
            }
        }
        if g.consumer.is_none()
            && !req.member_id.is_empty()
            && !g.members.contains_key(&req.member_id)
        {
            return all(ResponseError::UnknownMemberId);
        }
        if g.consumer.is_none() && req.generation_id >= 0 && req.generation_id != g.generation {
            return all(ResponseError::IllegalGeneration);
        }
        let Prepared {
            mut results,
            records,
            accepted,
        } = self.prepare_offsets(&g.id, &req.offsets, &known);
        let producer = Some((req.producer_id, req.producer_epoch));
        let stored = self.store.append_as(&g.id, &records, producer);
        if let Err(e) = stored {
            tracing::warn!(group = %g.id, producer_id = req.producer_id, error = %e, "transactional offset commit not stored");
            let code = if e.to_string().contains("epoch") {
                ResponseError::InvalidProducerEpoch
            } else {
                ResponseError::CoordinatorNotAvailable
            };
            for (i, _, _) in &accepted {
                results[*i] = Some(code);
            }
            return results;
        }
        let pending = g.pending_txn.entry(req.producer_id).or_default();
        for (_, key, c) in accepted {
            pending.insert(key, c);
        }
        results
    }

    /// A transaction marker of `producer_id` was written to `__consumer_offsets`
    /// partition `index`: the producer's pending offsets of the groups there become
    /// committed (`commit`) or are dropped.
    pub fn complete_txn(&self, index: i32, producer_id: i64, commit: bool) {
        let Some((partitions, _, _)) = self.store.leadership_of("") else {
            return;
        };
        let mut groups = self.lock();
        for (id, g) in groups.iter_mut() {
            if partition_for(id, partitions) != index {
                continue;
            }
            if let Some(offsets) = g.pending_txn.remove(&producer_id) {
                if commit {
                    g.offsets.extend(offsets);
                }
            }
        }
    }

    /// Whether `group_id` has offsets of `topic`-`partition` committed in a transaction
    /// that has no marker yet (OffsetFetch v7+ with `require_stable` answers
    /// UNSTABLE_OFFSET_COMMIT, 88, for it: KIP-447).
    pub fn has_pending_txn_offset(&self, group_id: &str, topic: &str, partition: i32) -> bool {
        let key = (topic.to_string(), partition);
        self.lock()
            .get(group_id)
            .is_some_and(|g| g.pending_txn.values().any(|o| o.contains_key(&key)))
    }

    /// OffsetFetch: committed offsets of `topics` (each partition listed; `None` where
    /// nothing is committed), or of every partition the group committed when `topics` is
    /// `None`. An unknown group has no offsets.
    ///
    /// Errors: INVALID_GROUP_ID (24) never (an empty group id simply has no offsets, as
    /// Kafka allows for OffsetFetch).
    pub fn fetch_offsets(
        &self,
        group_id: &str,
        topics: Option<&[(String, Vec<i32>)]>,
    ) -> FetchedOffsets {
        let groups = self.lock();
        let g = groups.get(group_id);
        match topics {
            Some(topics) => topics
                .iter()
                .map(|(t, parts)| {
                    let parts = parts
                        .iter()
                        .map(|p| {
                            let c = g.and_then(|g| g.offsets.get(&(t.clone(), *p)).cloned());
                            (*p, c)
                        })
                        .collect();
                    (t.clone(), parts)
                })
                .collect(),
            None => {
                let mut out: FetchedOffsets = Vec::new();
                if let Some(g) = g {
                    for ((t, p), c) in &g.offsets {
                        match out.last_mut() {
                            Some((last, parts)) if last == t => parts.push((*p, Some(c.clone()))),
                            _ => out.push((t.clone(), vec![(*p, Some(c.clone()))])),
                        }
                    }
                }
                out
            }
        }
    }

    /// ListGroups: every group, with protocol type and state.
    pub fn list(&self) -> Vec<GroupListing> {
        let groups = self.lock();
        let mut out: Vec<GroupListing> = groups
            .values()
            .filter(|g| g.state != GroupState::Dead)
            .map(|g| GroupListing {
                group_id: g.id.clone(),
                protocol_type: g.protocol_type.clone().unwrap_or_default(),
                state: g.state,
                state_name: match &g.consumer {
                    Some(c) => c.state_name(),
                    None => g.state.name(),
                },
                group_type: if g.consumer.is_some() {
                    "consumer"
                } else {
                    "classic"
                },
            })
            .collect();
        out.sort_by(|a, b| a.group_id.cmp(&b.group_id));
        out
    }

    /// DescribeGroups for one group; `None` if it does not exist.
    pub fn describe(&self, group_id: &str) -> Option<GroupDescription> {
        let groups = self.lock();
        let g = groups.get(group_id).filter(|g| g.consumer.is_none())?;
        let stable = g.state == GroupState::Stable;
        let protocol = if stable {
            g.protocol.clone().unwrap_or_default()
        } else {
            String::new()
        };
        Some(GroupDescription {
            group_id: g.id.clone(),
            state: g.state,
            protocol_type: g.protocol_type.clone().unwrap_or_default(),
            protocol: protocol.clone(),
            members: g
                .members
                .values()
                .map(|m| MemberDescription {
                    member_id: m.member_id.clone(),
                    group_instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    metadata: if stable {
                        m.metadata_for(&protocol)
                    } else {
                        Bytes::new()
                    },
                    assignment: if stable {
                        m.assignment.clone()
                    } else {
                        Bytes::new()
                    },
                })
                .collect(),
        })
    }

    /// DeleteGroups for one group: its offsets and record are removed (tombstones).
    ///
    /// Errors: INVALID_GROUP_ID (24), GROUP_ID_NOT_FOUND (69), NON_EMPTY_GROUP (68),
    /// COORDINATOR_NOT_AVAILABLE (15) when the tombstones cannot be written.
    pub fn delete_group(&self, group_id: &str) -> Option<ResponseError> {
        let mut groups = self.lock();
        let Some(g) = groups.get(group_id) else {
            return Some(ResponseError::GroupIdNotFound);
        };
        if g.state != GroupState::Empty || !g.members.is_empty() || !g.pending.is_empty() {
            return Some(ResponseError::NonEmptyGroup);
        }
        let mut records: Vec<StoreRecord> = g
            .offsets
            .keys()
            .map(|(t, p)| StoreRecord::offset_tombstone(group_id, t, *p))
            .collect();
        records.extend(group_tombstones(g));
        if let Err(e) = self.store.append(group_id, &records) {
            tracing::error!(group = group_id, error = %e, "group not deleted");
            return Some(ResponseError::CoordinatorNotAvailable);
        }
        groups.remove(group_id);
        tracing::info!(group = group_id, "group deleted");
        None
    }

    /// OffsetDelete (KIP-496): removes committed offsets of partitions the group does not
    /// consume. Group-level `Err`: GROUP_ID_NOT_FOUND (69), NON_EMPTY_GROUP (68) for a
    /// non-consumer group with members, COORDINATOR_NOT_AVAILABLE (15). Per partition:
    /// GROUP_SUBSCRIBED_TO_TOPIC (86).
    pub fn delete_offsets(
        &self,
        group_id: &str,
        partitions: &[(String, i32)],
    ) -> Result<Vec<Option<ResponseError>>, ResponseError> {
        let mut groups = self.lock();
        let Some(g) = groups.get_mut(group_id) else {
            return Err(ResponseError::GroupIdNotFound);
        };
        let subscribed = if let Some(c) = &g.consumer {
            c.subscribed_topics(&self.metadata.image())
                .into_iter()
                .collect()
        } else if g.members.is_empty() {
            Vec::new()
        } else {
            match g.subscribed_topics() {
                Some(t) => t,
                None => return Err(ResponseError::NonEmptyGroup),
            }
        };
        let mut results = Vec::with_capacity(partitions.len());
        let mut records = Vec::new();
        for (t, p) in partitions {
            if subscribed.contains(t) {
                results.push(Some(ResponseError::GroupSubscribedToTopic));
            } else {
                if g.offsets.contains_key(&(t.clone(), *p)) {
                    records.push(StoreRecord::offset_tombstone(group_id, t, *p));
                }
                results.push(None);
            }
        }
        if let Err(e) = self.store.append(group_id, &records) {
            tracing::error!(group = group_id, error = %e, "offsets not deleted");
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        for ((t, p), r) in partitions.iter().zip(&results) {
            if r.is_none() {
                g.offsets.remove(&(t.clone(), *p));
            }
        }
        Ok(results)
    }

    /// Drops every group's committed offsets for deleted topics (Kafka does the same when
    /// a topic is deleted), writing tombstones.
    pub fn on_topic_deleted(&self, topic: &str) {
        let mut groups = self.lock();
        for g in groups.values_mut() {
            let keys: Vec<(String, i32)> = g
                .offsets
                .keys()
                .filter(|(t, _)| t == topic)
                .cloned()
                .collect();
            if keys.is_empty() {
                continue;
            }
            let records: Vec<StoreRecord> = keys
                .iter()
                .map(|(t, p)| StoreRecord::offset_tombstone(&g.id, t, *p))
                .collect();
            if let Err(e) = self.store.append(&g.id, &records) {
                tracing::warn!(group = %g.id, topic, error = %e, "cannot write offset tombstones for a deleted topic");
            }
            for k in keys {
                g.offsets.remove(&k);
            }
        }
    }

    /// Checks every deadline once: pending member ids, the join phase (KIP-134 initial
    /// delay and rebalance timeout), members that never sent SyncGroup, and expired
    /// sessions.
    pub fn expire(&self, now: Instant) {
        let mut groups = self.lock();
        for g in groups.values_mut() {
            if let Some(c) = g.consumer.as_mut() {
                let gone = c.expire(now, &self.settings.consumer);
                if !gone.is_empty() {
                    for (member, reason) in &gone {
                        tracing::info!(group = %g.id, member = %member, group_epoch = c.group_epoch(), "consumer group member removed: {reason}");
                    }
                    let record = StoreRecord::consumer_group(&g.id, c.group_epoch());
                    if let Err(e) = self.store.append(&g.id, &[record]) {
                        tracing::warn!(group = %g.id, error = %e, "cannot store consumer group metadata");
                    }
                    if !self.maybe_downgrade(g, now) {
                        g.sync_consumer_state();
                    }
                }
                continue;
            }
            let before = g.pending.len();
            g.pending.retain(|_, deadline| *deadline > now);
            if g.pending.len() != before {
                tracing::info!(group = %g.id, dropped = before - g.pending.len(), "member ids handed out with MEMBER_ID_REQUIRED expired");
                g.maybe_complete_join(now, &self.store);
            }
            if g.state == GroupState::PreparingRebalance
                && g.join_deadline.is_some_and(|d| d <= now)
            {
                match g.initial_delay.take() {
                    Some(d) if d.new_member_added && d.remaining_ms > 0 => {
                        let delay_ms = d.delay_ms.min(d.remaining_ms).max(1);
                        g.join_deadline = Some(now + Duration::from_millis(delay_ms));
                        g.initial_delay = Some(InitialDelay {
                            delay_ms: d.delay_ms,
                            remaining_ms: d.remaining_ms - delay_ms.min(d.remaining_ms),
                            new_member_added: false,
                        });
                    }
                    _ => g.complete_join(now, &self.store),
                }
            }
            if matches!(
                g.state,
                GroupState::CompletingRebalance | GroupState::Stable
            ) && g.sync_deadline.is_some_and(|d| d <= now)
            {
                g.sync_deadline = None;
                let late: Vec<String> = g
                    .members
                    .values()
                    .filter(|m| !m.synced)
                    .map(|m| m.member_id.clone())
                    .collect();
                if !late.is_empty() {
                    for id in &late {
                        tracing::info!(group = %g.id, member = %id, "member did not send SyncGroup in time; removed");
                        g.remove_member(id);
                    }
                    g.on_members_changed(
                        now,
                        &self.settings,
                        &self.store,
                        "members missed SyncGroup",
                    );
                }
            }
            let expired: Vec<String> = g
                .members
                .values()
                .filter(|m| m.session_expired(now))
                .map(|m| m.member_id.clone())
                .collect();
            if !expired.is_empty() {
                for id in &expired {
                    tracing::info!(group = %g.id, member = %id, "session timed out; member removed");
                    g.remove_member(id);
                }
                g.on_members_changed(now, &self.settings, &self.store, "session timeout");
            }
        }
    }

    /// KIP-211: offsets of a group that has been empty for `offsets.retention.minutes`
    /// expire (tombstones are written); an empty group with no offsets left is removed.
    /// Returns the number of offsets expired.
    pub fn expire_offsets(&self, now_wall_ms: i64) -> usize {
        let retention = self.settings.offsets_retention_ms;
        let mut groups = self.lock();
        let mut expired_total = 0;
        let mut dead = Vec::new();
        for g in groups.values_mut() {
            if g.state != GroupState::Empty {
                continue;
            }
            let expired: Vec<(String, i32)> = g
                .offsets
                .iter()
                .filter(|(_, c)| {
                    let base = match (&g.protocol_type, g.empty_since_ms) {
                        (Some(_), Some(since)) => since,
                        _ => c.commit_timestamp_ms,
                    };
                    now_wall_ms.saturating_sub(base) >= retention
                })
                .map(|(k, _)| k.clone())
                .collect();
            let mut records: Vec<StoreRecord> = expired
                .iter()
                .map(|(t, p)| StoreRecord::offset_tombstone(&g.id, t, *p))
                .collect();
            let now_dead = expired.len() == g.offsets.len() && g.pending.is_empty();
            if now_dead {
                records.extend(group_tombstones(g));
            }
            if records.is_empty() {
                continue;
            }
            if let Err(e) = self.store.append(&g.id, &records) {
                tracing::warn!(group = %g.id, error = %e, "cannot expire offsets");
                continue;
            }
            for k in &expired {
                g.offsets.remove(k);
            }
            if !expired.is_empty() {
                tracing::info!(group = %g.id, offsets = expired.len(), "expired committed offsets (offsets.retention.minutes)");
            }
            expired_total += expired.len();
            if now_dead {
                dead.push(g.id.clone());
            }
        }
        for id in dead {
            groups.remove(&id);
        }
        expired_total
    }

    /// The deadline checker: runs [`GroupCoordinator::expire`] every 50 ms and offset
    /// expiry every `offsets.retention.check.interval.ms`, until `shutdown` turns true.
    pub async fn run_timers(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let retention_every =
            Duration::from_millis(self.settings.offsets_retention_check_interval_ms.max(1));
        let mut next_retention = Instant::now() + retention_every;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let now = Instant::now();
                    self.expire(now);
                    if now >= next_retention {
                        next_retention = now + retention_every;
                        self.expire_offsets(now_ms());
                    }
                }
                _ = shutdown.changed() => break,
            }
        }
        // Answer anything still parked so no client waits on a closed broker.
        let mut groups = self.lock();
        for g in groups.values_mut() {
            for m in g.members.values_mut() {
                if let Some(w) = m.join_waiter.take() {
                    let _ = w.send(JoinResult::error(
                        &m.member_id,
                        ResponseError::CoordinatorNotAvailable,
                    ));
                }
                if let Some(w) = m.sync_waiter.take() {
                    let _ = w.send(SyncResult::error(ResponseError::CoordinatorNotAvailable));
                }
            }
        }
    }
}

#[cfg(test)]
mod consumer_tests;
#[cfg(test)]
mod tests;
