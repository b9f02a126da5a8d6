//! Consumer groups of the next-generation protocol (KIP-848): ConsumerGroupHeartbeat's
//! state machine, run by the coordinator (`super`) under its lock.
//!
//! Owns, per group: the group epoch (bumped when a member joins or leaves, a
//! subscription changes, or a subscribed topic is created, deleted or grows), the target
//! assignment computed by a server-side assignor (`assignor.rs`) at that epoch, and per
//! member its epoch and reconciliation state — Kafka's `CurrentAssignmentBuilder`:
//!
//! - a member whose target lost partitions it holds is told to give them up first
//!   (UNREVOKED_PARTITIONS: its assignment shrinks, its epoch stays) and moves on once a
//!   heartbeat's owned partitions no longer name them, or it is fenced after its
//!   rebalance timeout;
//! - it then takes the target's new partitions that no other member still holds
//!   (UNRELEASED_PARTITIONS until the rest are released) at the target epoch.
//!
//! So rebalances are incremental: a member keeps consuming what it keeps. Sessions last
//! `group.consumer.session.timeout.ms` from the last heartbeat. Static members
//! (`group.instance.id`) leaving with epoch -2 keep their partitions until then, and a
//! new incarnation with the same instance id takes them over without a rebalance.
//!
//! Not kept across a coordinator restart or failover: members and assignments (the
//! group's epoch and committed offsets are); members find themselves unknown
//! (UNKNOWN_MEMBER_ID) and rejoin with epoch 0, as after a classic group's reload.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::ResponseError;
use tokio::time::Instant;
use uuid::Uuid;

use super::assignor::{self, AssignmentSpec, AssignorKind, TargetAssignment};
use crate::cluster::MetadataImage;

mod classic;
use classic::ClassicMember;
pub use classic::MigrationPolicy;
#[cfg(test)]
pub(crate) use classic::{decode_assignment, decode_subscription, encode_assignment};
pub(crate) use classic::{
    ClassicJoin, ClassicJoinRequest, ClassicMemberState, CONSUMER_PROTOCOL_TYPE,
};

/// Partitions by topic name.
pub(crate) type Partitions = BTreeMap<String, BTreeSet<i32>>;

/// Partitions by topic id, as the wire carries them.
pub(crate) type TopicPartitionIds = Vec<(Uuid, Vec<i32>)>;

/// Member epoch of a member leaving the group (KIP-848).
pub(crate) const LEAVE_GROUP_MEMBER_EPOCH: i32 = -1;
/// Member epoch of a static member leaving for a while: it keeps its partitions until its
/// session times out (KIP-848).
pub(crate) const LEAVE_GROUP_STATIC_MEMBER_EPOCH: i32 = -2;

/// The consumer-protocol settings (broker keys `group.consumer.*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerGroupSettings {
    /// `group.consumer.session.timeout.ms`.
    pub session_timeout_ms: i32,
    /// `group.consumer.heartbeat.interval.ms`.
    pub heartbeat_interval_ms: i32,
    /// `group.consumer.max.size`.
    pub max_size: usize,
    /// `group.consumer.assignors`, the first the default.
    pub assignors: &'static [AssignorKind],
    /// `group.consumer.migration.policy`: whether non-empty groups change protocol.
    pub migration_policy: MigrationPolicy,
}

/// A ConsumerGroupHeartbeat request (key 68, v0–v1), decoded.
#[derive(Debug, Clone, Default)]
pub(crate) struct HeartbeatRequest {
    /// `group.id`.
    pub group_id: String,
    /// Empty on a v0 join (the coordinator names the member); v1 members name themselves.
    pub member_id: String,
    /// 0 to join, -1 to leave, -2 for a static member's temporary leave, else the epoch
    /// the member holds.
    pub member_epoch: i32,
    /// `group.instance.id` (static membership).
    pub instance_id: Option<String>,
    /// `client.rack`.
    pub rack_id: Option<String>,
    /// `max.poll.interval.ms`; -1: unchanged.
    pub rebalance_timeout_ms: i32,
    /// Topic names subscribed to; `None`: unchanged.
    pub subscribed_topic_names: Option<Vec<String>>,
    /// Regular expression (RE2 syntax, whole name) subscribed to; `None`: unchanged,
    /// empty: none.
    pub subscribed_topic_regex: Option<String>,
    /// `group.remote.assignor`; `None`: unchanged.
    pub server_assignor: Option<String>,
    /// Partitions the member holds now; `None`: unchanged.
    pub owned: Option<TopicPartitionIds>,
    /// Client id from the request header.
    pub client_id: String,
    /// Peer address ("/127.0.0.1").
    pub client_host: String,
}

/// A ConsumerGroupHeartbeat answer.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct HeartbeatResult {
    /// Kafka error, `None` for success.
    pub error: Option<ResponseError>,
    /// A message naming the cause, with the error.
    pub error_message: Option<String>,
    /// The member's id.
    pub member_id: Option<String>,
    /// The member's epoch after this heartbeat.
    pub member_epoch: i32,
    /// `group.consumer.heartbeat.interval.ms`.
    pub heartbeat_interval_ms: i32,
    /// The member's assignment, when it changed or the request was a full one.
    pub assignment: Option<TopicPartitionIds>,
}

impl HeartbeatResult {
    pub(crate) fn error(error: ResponseError, message: impl Into<String>) -> HeartbeatResult {
        HeartbeatResult {
            error: Some(error),
            error_message: Some(message.into()),
            ..HeartbeatResult::default()
        }
    }
}

/// One member as ConsumerGroupDescribe reports it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ConsumerMemberDescription {
    /// Member id.
    pub member_id: String,
    /// `group.instance.id`.
    pub instance_id: Option<String>,
    /// `client.rack`.
    pub rack_id: Option<String>,
    /// Its epoch.
    pub member_epoch: i32,
    /// Client id.
    pub client_id: String,
    /// Client address.
    pub client_host: String,
    /// Topic names subscribed to.
    pub subscribed_topic_names: Vec<String>,
    /// Regular expression subscribed to.
    pub subscribed_topic_regex: Option<String>,
    /// What it holds now: (topic id, topic name, partitions).
    pub assignment: Vec<(Uuid, String, Vec<i32>)>,
    /// What the target assignment gives it.
    pub target_assignment: Vec<(Uuid, String, Vec<i32>)>,
    /// Whether it takes part through the classic protocol (JoinGroup, SyncGroup).
    pub classic: bool,
}

/// One consumer-protocol group as ConsumerGroupDescribe reports it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ConsumerGroupDescription {
    /// "Empty", "Assigning", "Reconciling" or "Stable" (Kafka's `ConsumerGroupState`).
    pub state: &'static str,
    /// The group epoch.
    pub group_epoch: i32,
    /// The epoch of the target assignment.
    pub assignment_epoch: i32,
    /// The assignor of the target assignment.
    pub assignor_name: String,
    /// Members, by member id.
    pub members: Vec<ConsumerMemberDescription>,
}

/// A member's reconciliation state (Kafka's `MemberState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MemberState {
    /// Holds its target at the target epoch.
    Stable,
    /// Must give up `pending_revocation` before anything else.
    UnrevokedPartitions,
    /// At the target epoch, waiting for partitions other members still hold.
    UnreleasedPartitions,
}

#[derive(Debug, Clone)]
struct Member {
    member_id: String,
    instance_id: Option<String>,
    rack_id: Option<String>,
    client_id: String,
    client_host: String,
    member_epoch: i32,
    previous_member_epoch: i32,
    state: MemberState,
    rebalance_timeout_ms: i32,
    subscribed_topic_names: BTreeSet<String>,
    subscribed_topic_regex: Option<(String, regex::Regex)>,
    server_assignor: Option<AssignorKind>,
    assigned: Partitions,
    pending_revocation: Partitions,
    last_heartbeat: Instant,
    /// Set while UNREVOKED_PARTITIONS: fenced if the revocation is not acknowledged by then.
    revocation_deadline: Option<Instant>,
    /// [`Member::resolved_topics`] at the image it was computed from (a regex is matched
    /// against every topic once per metadata change, not per heartbeat); cleared when the
    /// subscription changes.
    resolved: Option<(Arc<MetadataImage>, Arc<BTreeSet<String>>)>,
    /// Set for a member of the classic protocol (online migration, `classic.rs`).
    classic: Option<ClassicMember>,
}

impl Member {
    fn new(member_id: String, now: Instant) -> Member {
        Member {
            member_id,
            instance_id: None,
            rack_id: None,
            client_id: String::new(),
            client_host: String::new(),
            member_epoch: 0,
            previous_member_epoch: 0,
            state: MemberState::Stable,
            rebalance_timeout_ms: 300_000,
            subscribed_topic_names: BTreeSet::new(),
            subscribed_topic_regex: None,
            server_assignor: None,
            assigned: Partitions::new(),
            pending_revocation: Partitions::new(),
            last_heartbeat: now,
            revocation_deadline: None,
            resolved: None,
            classic: None,
        }
    }

    /// [`Member::resolved_topics`], cached per metadata image.
    fn resolved_at(&mut self, image: &Arc<MetadataImage>) -> Arc<BTreeSet<String>> {
        if let Some((at, topics)) = &self.resolved {
            if Arc::ptr_eq(at, image) {
                return topics.clone();
            }
        }
        let topics = Arc::new(self.resolved_topics(image));
        self.resolved = Some((image.clone(), topics.clone()));
        topics
    }

    /// The existing topics this member subscribes to (names, and regex matches among the
    /// non-internal topics).
    fn resolved_topics(&self, image: &MetadataImage) -> BTreeSet<String> {
        let mut out: BTreeSet<String> = self
            .subscribed_topic_names
            .iter()
            .filter(|t| image.topic(t).is_some())
            .cloned()
            .collect();
        if let Some((_, re)) = &self.subscribed_topic_regex {
            for t in image.topics() {
                if !crate::cluster::is_internal_topic(&t.name) && re.is_match(&t.name) {
                    out.insert(t.name.clone());
                }
            }
        }
        out
    }
}

/// One consumer-protocol group.
#[derive(Debug, Clone)]
pub(crate) struct ConsumerGroup {
    group_epoch: i32,
    assignment_epoch: i32,
    members: BTreeMap<String, Member>,
    /// group.instance.id → member id.
    static_members: HashMap<String, String>,
    target: TargetAssignment,
    assignor: AssignorKind,
    /// The subscribed topics as last seen: name → (id, partition count). A difference
    /// bumps the group epoch.
    subscription_metadata: BTreeMap<String, (Uuid, i32)>,
    /// The image and member removal count `subscription_metadata` was computed at: while
    /// both are the same and every member's resolved topics are of that image (a new
    /// member or a changed subscription has none), it is still right and a heartbeat
    /// does not rebuild it (O(members × topics)).
    metadata_seen: Option<(Arc<MetadataImage>, u64)>,
    /// Members removed so far.
    removals: u64,
}

fn count(p: &Partitions) -> usize {
    p.values().map(BTreeSet::len).sum()
}

/// `a` minus `b`.
fn minus(a: &Partitions, b: &Partitions) -> Partitions {
    let mut out = Partitions::new();
    for (t, parts) in a {
        let rest: BTreeSet<i32> = match b.get(t) {
            Some(other) => parts.difference(other).copied().collect(),
            None => parts.clone(),
        };
        if !rest.is_empty() {
            out.insert(t.clone(), rest);
        }
    }
    out
}

/// `a` ∩ `b`.
fn intersect(a: &Partitions, b: &Partitions) -> Partitions {
    let mut out = Partitions::new();
    for (t, parts) in a {
        if let Some(other) = b.get(t) {
            let both: BTreeSet<i32> = parts.intersection(other).copied().collect();
            if !both.is_empty() {
                out.insert(t.clone(), both);
            }
        }
    }
    out
}

fn overlaps(a: &Partitions, b: &Partitions) -> bool {
    a.iter()
        .any(|(t, parts)| b.get(t).is_some_and(|o| !parts.is_disjoint(o)))
}

/// `owned` (by topic id) by topic name; ids the image does not know are dropped.
fn by_name(owned: &TopicPartitionIds, image: &MetadataImage) -> Partitions {
    let mut out = Partitions::new();
    for (id, parts) in owned {
        if let Some(t) = image.topic_by_id(*id) {
            out.entry(t.name.clone())
                .or_default()
                .extend(parts.iter().copied());
        }
    }
    out.retain(|_, p| !p.is_empty());
    out
}

/// `parts` by topic id, in topic-name order; topics the image no longer has are dropped.
fn by_id(parts: &Partitions, image: &MetadataImage) -> TopicPartitionIds {
    parts
        .iter()
        .filter_map(|(t, p)| {
            image
                .topic(t)
                .map(|meta| (meta.id, p.iter().copied().collect()))
        })
        .collect()
}

fn described(parts: &Partitions, image: &MetadataImage) -> Vec<(Uuid, String, Vec<i32>)> {
    parts
        .iter()
        .filter_map(|(t, p)| {
            image
                .topic(t)
                .map(|meta| (meta.id, t.clone(), p.iter().copied().collect()))
        })
        .collect()
}

/// Kafka's member ids: a random UUID in URL-safe base64 (22 characters).
fn new_member_id() -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bytes = Uuid::new_v4().into_bytes();
    let mut bits: u128 = u128::from_be_bytes(bytes);
    let mut out = Vec::with_capacity(22);
    for _ in 0..22 {
        out.push(ALPHABET[(bits >> 122) as usize & 63]);
        bits <<= 6;
    }
    String::from_utf8(out).unwrap_or_default()
}

impl ConsumerGroup {
    /// An empty group at `group_epoch` (0 when new; a reloaded or converted group keeps
    /// its epoch, so member epochs never go back).
    pub(crate) fn new(group_epoch: i32, settings: &ConsumerGroupSettings) -> ConsumerGroup {
        ConsumerGroup {
            group_epoch,
            assignment_epoch: group_epoch,
            members: BTreeMap::new(),
            static_members: HashMap::new(),
            target: TargetAssignment::new(),
            assignor: settings
                .assignors
                .first()
                .copied()
                .unwrap_or(AssignorKind::Uniform),
            subscription_metadata: BTreeMap::new(),
            metadata_seen: None,
            removals: 0,
        }
    }

    /// The group epoch.
    pub(crate) fn group_epoch(&self) -> i32 {
        self.group_epoch
    }

    /// Whether no member is in the group (a static member away with epoch -2 counts).
    pub(crate) fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Kafka's `ConsumerGroupState` name.
    pub(crate) fn state_name(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else if self.group_epoch > self.assignment_epoch {
            "Assigning"
        } else if self.members.values().any(|m| {
            m.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH
                && (m.member_epoch != self.assignment_epoch || m.state != MemberState::Stable)
        }) {
            "Reconciling"
        } else {
            "Stable"
        }
    }

    /// Every existing topic some member subscribes to (OffsetDelete refuses those).
    pub(crate) fn subscribed_topics(&self, image: &MetadataImage) -> BTreeSet<String> {
        self.members
            .values()
            .flat_map(|m| m.resolved_topics(image))
            .collect()
    }

    /// OffsetCommit / TxnOffsetCommit / OffsetFetch by a member (Kafka's
    /// `ConsumerGroup.validateOffsetCommit`): the member must be known and at its epoch.
    ///
    /// Errors: UNKNOWN_MEMBER_ID (25), STALE_MEMBER_EPOCH (113) (ILLEGAL_GENERATION (22)
    /// for a classic member).
    pub(crate) fn validate_member(
        &mut self,
        member_id: &str,
        member_epoch: i32,
        now: Instant,
    ) -> Result<(), ResponseError> {
        let Some(m) = self.members.get_mut(member_id) else {
            return Err(ResponseError::UnknownMemberId);
        };
        if m.member_epoch != member_epoch {
            // Classic clients know ILLEGAL_GENERATION, not STALE_MEMBER_EPOCH.
            return Err(if m.classic.is_some() {
                ResponseError::IllegalGeneration
            } else {
                ResponseError::StaleMemberEpoch
            });
        }
        m.last_heartbeat = now;
        Ok(())
    }

    fn bump(&mut self) {
        self.group_epoch = self.group_epoch.wrapping_add(1).max(1);
    }

    fn remove_member(&mut self, member_id: &str) -> bool {
        let Some(m) = self.members.remove(member_id) else {
            return false;
        };
        if let Some(instance) = &m.instance_id {
            if self.static_members.get(instance).map(String::as_str) == Some(member_id) {
                self.static_members.remove(instance);
            }
        }
        self.target.remove(member_id);
        self.removals += 1;
        self.bump();
        true
    }

    /// Recomputes the subscribed topics' metadata; returns whether it changed (which
    /// bumps the group epoch).
    fn refresh_subscription_metadata(&mut self, image: &Arc<MetadataImage>) -> bool {
        let unchanged = self
            .metadata_seen
            .as_ref()
            .is_some_and(|(at, removals)| Arc::ptr_eq(at, image) && *removals == self.removals)
            && self.members.values().all(|m| {
                m.resolved
                    .as_ref()
                    .is_some_and(|(at, _)| Arc::ptr_eq(at, image))
            });
        if unchanged {
            return false;
        }
        self.metadata_seen = Some((image.clone(), self.removals));
        let mut now: BTreeMap<String, (Uuid, i32)> = BTreeMap::new();
        for m in self.members.values_mut() {
            for t in m.resolved_at(image).iter() {
                if !now.contains_key(t) {
                    if let Some(meta) = image.topic(t) {
                        now.insert(t.clone(), (meta.id, meta.partitions));
                    }
                }
            }
        }
        if now == self.subscription_metadata {
            return false;
        }
        self.subscription_metadata = now;
        true
    }

    /// The assignor most members ask for (ties: the configured order), else the default.
    fn choose_assignor(&self, settings: &ConsumerGroupSettings) -> AssignorKind {
        let mut votes: Vec<(AssignorKind, usize)> =
            settings.assignors.iter().map(|a| (*a, 0)).collect();
        for m in self.members.values() {
            if let Some(a) = m.server_assignor {
                if let Some(v) = votes.iter_mut().find(|(k, _)| *k == a) {
                    v.1 += 1;
                }
            }
        }
        let best = votes.iter().map(|(_, n)| *n).max().unwrap_or(0);
        if best == 0 {
            return settings
                .assignors
                .first()
                .copied()
                .unwrap_or(AssignorKind::Uniform);
        }
        votes
            .iter()
            .find(|(_, n)| *n == best)
            .map(|(k, _)| *k)
            .unwrap_or(AssignorKind::Uniform)
    }

    /// A new target assignment when the group epoch moved past it.
    fn maybe_compute_target(
        &mut self,
        image: &Arc<MetadataImage>,
        settings: &ConsumerGroupSettings,
    ) {
        if self.group_epoch <= self.assignment_epoch && !self.members.is_empty() {
            return;
        }
        let members: BTreeMap<String, BTreeSet<String>> = self
            .members
            .values_mut()
            .map(|m| (m.member_id.clone(), (*m.resolved_at(image)).clone()))
            .collect();
        let topics: BTreeMap<String, i32> = self
            .subscription_metadata
            .iter()
            .map(|(t, (_, n))| (t.clone(), *n))
            .collect();
        self.assignor = self.choose_assignor(settings);
        self.target = assignor::assign(
            self.assignor,
            &AssignmentSpec {
                members: &members,
                topics: &topics,
                previous: &self.target,
            },
        );
        self.assignment_epoch = self.group_epoch;
        tracing::debug!(
            group_epoch = self.group_epoch,
            assignor = self.assignor.name(),
            members = members.len(),
            "target assignment computed"
        );
    }

    /// Moves `member_id` toward its target (Kafka's `CurrentAssignmentBuilder`); `owned`
    /// is what its heartbeat says it holds. A member at the target epoch with nothing to
    /// do returns at once: the other members' partitions are looked at only when this one
    /// wants partitions its target gives it.
    fn reconcile(&mut self, member_id: &str, owned: Option<&Partitions>, now: Instant) {
        let target_epoch = self.assignment_epoch;
        let target: Partitions = self.target.get(member_id).cloned().unwrap_or_default();
        let wanted = {
            let Some(m) = self.members.get_mut(member_id) else {
                return;
            };
            if m.state == MemberState::UnrevokedPartitions {
                let released = owned.is_some_and(|o| !overlaps(o, &m.pending_revocation));
                if !released {
                    return;
                }
                m.pending_revocation.clear();
                m.revocation_deadline = None;
                m.state = MemberState::Stable;
            }
            if m.member_epoch == target_epoch && m.state == MemberState::Stable {
                return;
            }
            let revoke = minus(&m.assigned, &target);
            // Kafka's `ownsRevokedPartitions`: a member that says it holds none of them
            // (an eager classic member rejoins holding nothing) has nothing to give up.
            if !revoke.is_empty() && owned.is_none_or(|o| overlaps(o, &revoke)) {
                m.assigned = intersect(&m.assigned, &target);
                m.pending_revocation = revoke;
                m.state = MemberState::UnrevokedPartitions;
                m.revocation_deadline =
                    Some(now + Duration::from_millis(m.rebalance_timeout_ms.max(0) as u64));
                return;
            }
            minus(&target, &m.assigned)
        };
        // Partitions of the target other members still hold (or give up): not assignable
        // yet.
        let held_elsewhere = self.held_by_others(member_id, &wanted);
        let Some(m) = self.members.get_mut(member_id) else {
            return;
        };
        let free = minus(&wanted, &held_elsewhere);
        let unreleased = count(&free) < count(&wanted);
        m.assigned = intersect(&m.assigned, &target);
        for (t, p) in free {
            m.assigned.entry(t).or_default().extend(p);
        }
        m.state = if unreleased {
            MemberState::UnreleasedPartitions
        } else {
            MemberState::Stable
        };
        if m.member_epoch != target_epoch {
            m.previous_member_epoch = m.member_epoch;
            m.member_epoch = target_epoch;
        }
    }

    /// The partitions of `wanted` that members other than `member_id` hold or are giving
    /// up. Only the wanted partitions are looked for (nothing when none is wanted).
    fn held_by_others(&self, member_id: &str, wanted: &Partitions) -> Partitions {
        let mut held_elsewhere = Partitions::new();
        if wanted.is_empty() {
            return held_elsewhere;
        }
        for m in self.members.values().filter(|m| m.member_id != member_id) {
            for (t, p) in m.assigned.iter().chain(m.pending_revocation.iter()) {
                if let Some(w) = wanted.get(t) {
                    let held: Vec<i32> = p.intersection(w).copied().collect();
                    if !held.is_empty() {
                        held_elsewhere.entry(t.clone()).or_default().extend(held);
                    }
                }
            }
        }
        held_elsewhere
    }

    /// Handles one ConsumerGroupHeartbeat (Kafka's `GroupMetadataManager
    /// .consumerGroupHeartbeat`). The caller checked the request ([`check`]: what it
    /// gives is `checked`), the group id and that this broker coordinates the group.
    ///
    /// Errors (in the result): INVALID_REQUEST (42) for a new member without a
    /// subscription, UNKNOWN_MEMBER_ID (25), FENCED_MEMBER_EPOCH (110), FENCED_INSTANCE_ID (82),
    /// UNRELEASED_INSTANCE_ID (111), GROUP_MAX_SIZE_REACHED (81).
    pub(crate) fn heartbeat(
        &mut self,
        r: &HeartbeatRequest,
        checked: CheckedRequest,
        now: Instant,
        image: &Arc<MetadataImage>,
        settings: &ConsumerGroupSettings,
    ) -> HeartbeatResult {
        let regex = checked.regex;
        match r.member_epoch {
            LEAVE_GROUP_MEMBER_EPOCH => return self.leave(r),
            LEAVE_GROUP_STATIC_MEMBER_EPOCH => return self.leave_static(r, now),
            _ => {}
        }
        let members_before = self.members.len();
        let member_id = match self.find_or_join(r, now, settings) {
            Ok(id) => id,
            Err(e) => return e,
        };
        // One bump per heartbeat, whatever changed (a join, a subscription, topics).
        let mut changed_subscription = self.members.len() != members_before;
        {
            let Some(m) = self.members.get_mut(&member_id) else {
                return HeartbeatResult::error(ResponseError::UnknownMemberId, "member gone");
            };
            m.last_heartbeat = now;
            m.client_id = r.client_id.clone();
            m.client_host = r.client_host.clone();
            if r.rack_id.is_some() {
                m.rack_id = r.rack_id.clone();
            }
            if r.instance_id.is_some() {
                m.instance_id = r.instance_id.clone();
            }
            if r.rebalance_timeout_ms >= 0 {
                m.rebalance_timeout_ms = r.rebalance_timeout_ms;
            }
            if let Some(names) = &r.subscribed_topic_names {
                let names: BTreeSet<String> = names.iter().cloned().collect();
                if names != m.subscribed_topic_names {
                    m.subscribed_topic_names = names;
                    m.resolved = None;
                    changed_subscription = true;
                }
            }
            if let Some(re) = regex {
                let old = m.subscribed_topic_regex.as_ref().map(|(s, _)| s.as_str());
                if old != re.as_ref().map(|(s, _)| s.as_str()) {
                    m.subscribed_topic_regex = re;
                    m.resolved = None;
                    changed_subscription = true;
                }
            }
            if let Some(name) = &r.server_assignor {
                let kind = AssignorKind::from_name(name);
                if kind != m.server_assignor {
                    m.server_assignor = kind;
                    changed_subscription = true;
                }
            }
        }
        if self.refresh_subscription_metadata(image) || changed_subscription {
            self.bump();
        }
        self.maybe_compute_target(image, settings);
        let owned = r.owned.as_ref().map(|o| by_name(o, image));
        let before = self
            .members
            .get(&member_id)
            .map(|m| (m.assigned.clone(), m.member_epoch));
        self.reconcile(&member_id, owned.as_ref(), now);
        let Some(m) = self.members.get(&member_id) else {
            return HeartbeatResult::error(ResponseError::UnknownMemberId, "member gone");
        };
        if before.as_ref() != Some(&(m.assigned.clone(), m.member_epoch)) {
            tracing::info!(member = %member_id, member_epoch = m.member_epoch, group_epoch = self.group_epoch, partitions = count(&m.assigned), revoking = count(&m.pending_revocation), "consumer group member assignment updated");
        }
        let full = r.member_epoch == 0
            || (r.rebalance_timeout_ms != -1
                && (r.subscribed_topic_names.is_some() || r.subscribed_topic_regex.is_some())
                && r.owned.is_some());
        let assigned_changed = before.as_ref().map(|(a, _)| a) != Some(&m.assigned)
            || owned.as_ref().is_some_and(|o| *o != m.assigned);
        HeartbeatResult {
            error: None,
            error_message: None,
            member_id: Some(member_id.clone()),
            member_epoch: m.member_epoch,
            heartbeat_interval_ms: settings.heartbeat_interval_ms,
            assignment: (full || assigned_changed).then(|| by_id(&m.assigned, image)),
        }
    }

    /// The member a heartbeat speaks for, joining it when its epoch is 0.
    fn find_or_join(
        &mut self,
        r: &HeartbeatRequest,
        now: Instant,
        settings: &ConsumerGroupSettings,
    ) -> Result<String, HeartbeatResult> {
        if r.member_epoch == 0 {
            return self.join(r, now, settings);
        }
        let Some(m) = self
            .members
            .get(&r.member_id)
            .filter(|m| m.classic.is_none())
        else {
            return Err(HeartbeatResult::error(
                ResponseError::UnknownMemberId,
                format!(
                    "Member {} is not a consumer-protocol member of the group.",
                    r.member_id
                ),
            ));
        };
        if let Some(instance) = &r.instance_id {
            if self.static_members.get(instance) != Some(&r.member_id) {
                return Err(HeartbeatResult::error(
                    ResponseError::FencedInstanceId,
                    format!("Static member {} with instance id {instance} was fenced by another member.", r.member_id),
                ));
            }
        }
        if r.member_epoch > m.member_epoch {
            return Err(fenced(r.member_epoch, m.member_epoch));
        }
        if r.member_epoch < m.member_epoch {
            // The response that bumped the epoch may have been lost: accept the previous
            // epoch from a member holding no more than its assignment.
            let owned = r.owned.as_ref();
            let subset = owned.is_some_and(|o| {
                o.iter().all(|(id, parts)| {
                    parts.iter().all(|p| {
                        m.assigned.iter().any(|(t, a)| {
                            a.contains(p)
                                && self.subscription_metadata.get(t).map(|(i, _)| i) == Some(id)
                        })
                    })
                })
            });
            if r.member_epoch != m.previous_member_epoch || !subset {
                return Err(fenced(r.member_epoch, m.member_epoch));
            }
        }
        Ok(r.member_id.clone())
    }

    fn join(
        &mut self,
        r: &HeartbeatRequest,
        now: Instant,
        settings: &ConsumerGroupSettings,
    ) -> Result<String, HeartbeatResult> {
        let member_id = if r.member_id.is_empty() {
            new_member_id()
        } else {
            r.member_id.clone()
        };
        if let Some(instance) = &r.instance_id {
            if let Some(old_id) = self.static_members.get(instance).cloned() {
                if old_id != member_id {
                    // A classic static member never leaves (classic static members do
                    // not send LeaveGroup): one restarting on this protocol replaces it
                    // at once, as in Kafka.
                    let away = self.members.get(&old_id).is_some_and(|m| {
                        m.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH || m.classic.is_some()
                    });
                    if !away {
                        return Err(HeartbeatResult::error(
                            ResponseError::UnreleasedInstanceId,
                            format!("Static member {old_id} with instance id {instance} is not released yet."),
                        ));
                    }
                    // A new incarnation takes the old one's place and partitions: no
                    // rebalance.
                    if let Some(mut m) = self.members.remove(&old_id) {
                        m.member_id = member_id.clone();
                        m.member_epoch = 0;
                        m.previous_member_epoch = 0;
                        m.last_heartbeat = now;
                        m.classic = None;
                        self.members.insert(member_id.clone(), m);
                    }
                    if let Some(t) = self.target.remove(&old_id) {
                        self.target.insert(member_id.clone(), t);
                    }
                    self.static_members
                        .insert(instance.clone(), member_id.clone());
                    tracing::info!(instance = %instance, old = %old_id, new = %member_id, "static member rejoined; keeps its partitions");
                    return Ok(member_id);
                }
            }
        }
        if let Some(m) = self.members.get_mut(&member_id) {
            // A known member rejoining (it was fenced, or lost its state): it starts over,
            // its partitions free for the target to give again.
            m.assigned.clear();
            m.pending_revocation.clear();
            m.state = MemberState::Stable;
            m.revocation_deadline = None;
            m.member_epoch = 0;
            m.previous_member_epoch = 0;
            m.classic = None;
            return Ok(member_id);
        }
        if r.subscribed_topic_names.is_none() && r.subscribed_topic_regex.is_none() {
            return Err(HeartbeatResult::error(
                ResponseError::InvalidRequest,
                "SubscribedTopicNames or SubscribedTopicRegex must be set in first request.",
            ));
        }
        if self.members.len() >= settings.max_size {
            return Err(HeartbeatResult::error(
                ResponseError::GroupMaxSizeReached,
                format!(
                    "The consumer group has reached its maximum capacity of {} members.",
                    settings.max_size
                ),
            ));
        }
        let mut m = Member::new(member_id.clone(), now);
        m.instance_id = r.instance_id.clone();
        if let Some(instance) = &r.instance_id {
            self.static_members
                .insert(instance.clone(), member_id.clone());
        }
        self.members.insert(member_id.clone(), m);
        tracing::info!(member = %member_id, instance = ?r.instance_id, "member joined consumer group");
        Ok(member_id)
    }

    fn leave(&mut self, r: &HeartbeatRequest) -> HeartbeatResult {
        let target = match &r.instance_id {
            Some(instance) => match self.static_members.get(instance) {
                Some(current) if current == &r.member_id || r.member_id.is_empty() => {
                    current.clone()
                }
                Some(current) => {
                    return HeartbeatResult::error(
                        ResponseError::FencedInstanceId,
                        format!("Static member {} with instance id {instance} was fenced by member {current}.", r.member_id),
                    )
                }
                None => r.member_id.clone(),
            },
            None => r.member_id.clone(),
        };
        if !self.remove_member(&target) {
            return HeartbeatResult::error(
                ResponseError::UnknownMemberId,
                format!("Member {target} is not a member of the group."),
            );
        }
        tracing::info!(member = %target, group_epoch = self.group_epoch, "member left consumer group");
        HeartbeatResult {
            member_id: Some(r.member_id.clone()),
            member_epoch: LEAVE_GROUP_MEMBER_EPOCH,
            ..HeartbeatResult::default()
        }
    }

    fn leave_static(&mut self, r: &HeartbeatRequest, now: Instant) -> HeartbeatResult {
        let instance = r.instance_id.clone().unwrap_or_default();
        match self.static_members.get(&instance) {
            Some(current) if current == &r.member_id => {}
            Some(current) => {
                return HeartbeatResult::error(
                    ResponseError::FencedInstanceId,
                    format!(
                    "Static member {} with instance id {instance} was fenced by member {current}.",
                    r.member_id
                ),
                )
            }
            None => {
                return HeartbeatResult::error(
                    ResponseError::UnknownMemberId,
                    format!("Member {} is not a member of the group.", r.member_id),
                )
            }
        }
        if let Some(m) = self.members.get_mut(&r.member_id) {
            m.member_epoch = LEAVE_GROUP_STATIC_MEMBER_EPOCH;
            m.last_heartbeat = now;
            tracing::info!(member = %r.member_id, instance = %instance, "static member left for now; its partitions wait for it until its session times out");
        }
        HeartbeatResult {
            member_id: Some(r.member_id.clone()),
            member_epoch: LEAVE_GROUP_STATIC_MEMBER_EPOCH,
            ..HeartbeatResult::default()
        }
    }

    /// Removes members whose session timed out or that did not give up partitions within
    /// their rebalance timeout. Returns (member id, reason) of each removed.
    pub(crate) fn expire(
        &mut self,
        now: Instant,
        settings: &ConsumerGroupSettings,
    ) -> Vec<(String, &'static str)> {
        let session = Duration::from_millis(settings.session_timeout_ms.max(0) as u64);
        let gone: Vec<(String, &'static str)> = self
            .members
            .values()
            .filter_map(|m| {
                if let Some(c) = &m.classic {
                    return c
                        .expired(m.last_heartbeat, now)
                        .map(|why| (m.member_id.clone(), why));
                }
                if now.duration_since(m.last_heartbeat) > session {
                    Some((m.member_id.clone(), "session timed out"))
                } else if m.revocation_deadline.is_some_and(|d| d <= now) {
                    Some((
                        m.member_id.clone(),
                        "did not revoke its partitions within its rebalance timeout",
                    ))
                } else {
                    None
                }
            })
            .collect();
        for (id, _) in &gone {
            self.remove_member(id);
        }
        gone
    }

    /// ConsumerGroupDescribe's view of the group.
    pub(crate) fn describe(&self, image: &MetadataImage) -> ConsumerGroupDescription {
        let empty = Partitions::new();
        ConsumerGroupDescription {
            state: self.state_name(),
            group_epoch: self.group_epoch,
            assignment_epoch: self.assignment_epoch,
            assignor_name: self.assignor.name().to_string(),
            members: self
                .members
                .values()
                .map(|m| ConsumerMemberDescription {
                    member_id: m.member_id.clone(),
                    instance_id: m.instance_id.clone(),
                    rack_id: m.rack_id.clone(),
                    member_epoch: m.member_epoch,
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    subscribed_topic_names: m.subscribed_topic_names.iter().cloned().collect(),
                    subscribed_topic_regex: m
                        .subscribed_topic_regex
                        .as_ref()
                        .map(|(s, _)| s.clone()),
                    assignment: described(&m.assigned, image),
                    target_assignment: described(
                        self.target.get(&m.member_id).unwrap_or(&empty),
                        image,
                    ),
                    classic: m.classic.is_some(),
                })
                .collect(),
        }
    }
}

/// The longest SubscribedTopicRegex compiled (Kafka sets none). The regex is compiled
/// under the coordinator's lock: a 10 MB one took 7 s there (debug build) and stalled
/// every group's heartbeats meanwhile. 32 KiB is far more than any topic regex needs.
const MAX_REGEX_BYTES: usize = 32 * 1024;

fn fenced(received: i32, expected: i32) -> HeartbeatResult {
    HeartbeatResult::error(
        ResponseError::FencedMemberEpoch,
        format!("The consumer group member has a member epoch ({received}) other than the one known by the group coordinator ({expected}). The member must abandon all its partitions and rejoin."),
    )
}

/// A heartbeat that passed [`check`]: its regex, compiled (`None`: unchanged; `Some(None)`:
/// none).
#[derive(Debug)]
pub(crate) struct CheckedRequest {
    regex: Option<Option<(String, regex::Regex)>>,
}

/// Checks a heartbeat before any group is looked at (Kafka's
/// `throwIfConsumerGroupHeartbeatRequestIsInvalid`), outside the coordinator's lock, and
/// compiles its regex.
///
/// Errors: INVALID_REQUEST (42) with Kafka's message, UNSUPPORTED_ASSIGNOR (112),
/// INVALID_REGULAR_EXPRESSION (128) for a regex that does not compile or is over
/// [`MAX_REGEX_BYTES`].
pub(crate) fn check(
    r: &HeartbeatRequest,
    settings: &ConsumerGroupSettings,
) -> Result<CheckedRequest, HeartbeatResult> {
    validate(r, settings)?;
    let regex = match r.subscribed_topic_regex.as_deref() {
        Some(re) if re.len() > MAX_REGEX_BYTES => {
            return Err(HeartbeatResult::error(
                ResponseError::InvalidRegularExpression,
                format!(
                    "SubscribedTopicRegex is {} bytes, more than the {MAX_REGEX_BYTES} allowed.",
                    re.len()
                ),
            ))
        }
        Some(re) if !re.is_empty() => match regex::Regex::new(&format!("^(?:{re})$")) {
            Ok(compiled) => Some(Some((re.to_string(), compiled))),
            Err(e) => {
                return Err(HeartbeatResult::error(
                    ResponseError::InvalidRegularExpression,
                    format!("SubscribedTopicRegex `{re}` is not a valid regular expression: {e}"),
                ))
            }
        },
        Some(_) => Some(None),
        None => None,
    };
    Ok(CheckedRequest { regex })
}

fn validate(r: &HeartbeatRequest, settings: &ConsumerGroupSettings) -> Result<(), HeartbeatResult> {
    let invalid = |m: &str| Err(HeartbeatResult::error(ResponseError::InvalidRequest, m));
    if r.group_id.trim().is_empty() {
        return invalid("GroupId can't be empty.");
    }
    if r.instance_id.as_ref().is_some_and(|i| i.trim().is_empty()) {
        return invalid("InstanceId can't be empty.");
    }
    if r.rack_id.as_ref().is_some_and(|i| i.trim().is_empty()) {
        return invalid("RackId can't be empty.");
    }
    // v1 members name themselves (KIP-1082); one that does not yet is named here, as v0.
    if r.member_id.is_empty() && r.member_epoch != 0 {
        return invalid("MemberId can't be empty.");
    }
    match r.member_epoch {
        // Kafka also refuses a join without a rebalance timeout or with null owned
        // partitions; librdkafka 2.12 sends such partial epoch-0 heartbeats when its
        // subscription changes quickly (librdkafka's test 0045), so they mean "unchanged"
        // here. A new member without any subscription is refused in `join`.
        0 if r
            .owned
            .as_ref()
            .is_some_and(|o| o.iter().any(|(_, p)| !p.is_empty())) =>
        {
            return invalid("TopicPartitions must be empty when (re-)joining.");
        }
        LEAVE_GROUP_STATIC_MEMBER_EPOCH if r.instance_id.is_none() => {
            return invalid("InstanceId can't be null.");
        }
        e if e < LEAVE_GROUP_STATIC_MEMBER_EPOCH => {
            return invalid(&format!("MemberEpoch is invalid: {e}."));
        }
        _ => {}
    }
    if let Some(name) = &r.server_assignor {
        let supported =
            AssignorKind::from_name(name).is_some_and(|k| settings.assignors.contains(&k));
        if !supported {
            let names: Vec<&str> = settings.assignors.iter().map(|a| a.name()).collect();
            return Err(HeartbeatResult::error(
                ResponseError::UnsupportedAssignor,
                format!(
                    "ServerAssignor {name} is not supported. Supported assignors: {}.",
                    names.join(", ")
                ),
            ));
        }
    }
    Ok(())
}
