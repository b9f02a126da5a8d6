//! Classic members inside a consumer-protocol group: KIP-848's online migration.
//!
//! A classic group whose members speak the consumer embedded protocol becomes a
//! consumer-protocol group when a ConsumerGroupHeartbeat joins it ([`ConsumerGroup::
//! from_classic`]); its classic members stay, with the partitions their last SyncGroup
//! gave them, and take part through JoinGroup, SyncGroup, Heartbeat and LeaveGroup, which
//! the coordinator maps onto the group's epochs here (Kafka's `GroupMetadataManager
//! .classicGroupJoinToConsumerGroup` and its Sync, Heartbeat and Leave siblings):
//!
//! - JoinGroup is answered at once: generation = the member's epoch after it is reconciled
//!   with the target assignment (the partitions its subscription says it owns are what it
//!   holds), protocol = the first it offered, no leader (the broker assigns);
//! - SyncGroup returns its current assignment as a ConsumerProtocolAssignment;
//! - Heartbeat answers REBALANCE_IN_PROGRESS when it must rejoin: the group epoch moved
//!   past its epoch, it has partitions to give up, or partitions it waited for are free;
//! - a member told to rejoin that does not within its rebalance timeout, or that joined
//!   and never syncs, is removed; its session is its own `session.timeout.ms`.
//!
//! When the last consumer-protocol member leaves, the group goes back to the classic
//! protocol with the classic members left and their target assignments
//! ([`ConsumerGroup::to_classic`]), and the coordinator starts a classic rebalance.

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as AssignedTopic;
use kafka_protocol::messages::{
    ConsumerProtocolAssignment, ConsumerProtocolSubscription, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::ResponseError;
use tokio::time::Instant;

use super::{count, minus, ConsumerGroup, ConsumerGroupSettings, Member, MemberState, Partitions};
use crate::cluster::MetadataImage;

/// The protocol type of groups whose members speak the consumer embedded protocol.
pub(crate) const CONSUMER_PROTOCOL_TYPE: &str = "consumer";

/// Highest ConsumerProtocolSubscription / ConsumerProtocolAssignment version known; a
/// newer one is read as this one (its extra fields come after), as Kafka's
/// `ConsumerProtocol` does.
const MAX_EMBEDDED_VERSION: i16 = 3;

/// How a group may change protocol while it has members (Kafka's
/// `group.consumer.migration.policy`, KIP-848 "Upgrade/Downgrade").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrationPolicy {
    /// Neither way: a non-empty group keeps its protocol.
    Disabled,
    /// Consumer → classic only.
    Downgrade,
    /// Classic → consumer only.
    Upgrade,
    /// Both (Kafka's default).
    Bidirectional,
}

impl MigrationPolicy {
    /// Parses Kafka's names, in any case. `None` for anything else.
    pub fn parse(text: &str) -> Option<MigrationPolicy> {
        match text.trim().to_ascii_lowercase().as_str() {
            "disabled" => Some(MigrationPolicy::Disabled),
            "downgrade" => Some(MigrationPolicy::Downgrade),
            "upgrade" => Some(MigrationPolicy::Upgrade),
            "bidirectional" => Some(MigrationPolicy::Bidirectional),
            _ => None,
        }
    }

    /// Whether a non-empty classic group may become a consumer-protocol group.
    pub fn upgrade_enabled(self) -> bool {
        matches!(
            self,
            MigrationPolicy::Upgrade | MigrationPolicy::Bidirectional
        )
    }

    /// Whether a consumer-protocol group left with only classic members goes back.
    pub fn downgrade_enabled(self) -> bool {
        matches!(
            self,
            MigrationPolicy::Downgrade | MigrationPolicy::Bidirectional
        )
    }
}

/// What a classic member keeps inside a consumer-protocol group.
#[derive(Debug, Clone)]
pub(crate) struct ClassicMember {
    /// Its JoinGroup's `session.timeout.ms`.
    session_timeout_ms: i32,
    /// The protocols (assignor name, subscription bytes) its last JoinGroup offered, in
    /// its order of preference.
    protocols: Vec<(String, Bytes)>,
    /// Told to rejoin: removed if no JoinGroup comes by then (its rebalance timeout).
    join_deadline: Option<Instant>,
    /// Joined: removed if no SyncGroup comes by then (its rebalance timeout).
    sync_deadline: Option<Instant>,
}

impl ClassicMember {
    fn protocol_name(&self) -> &str {
        self.protocols
            .first()
            .map(|(n, _)| n.as_str())
            .unwrap_or("")
    }

    /// The embedded protocol version its subscription was written in.
    fn version(&self) -> i16 {
        self.protocols
            .first()
            .and_then(|(_, m)| m.get(..2))
            .map(|v| i16::from_be_bytes([v[0], v[1]]))
            .unwrap_or(0)
            .clamp(0, MAX_EMBEDDED_VERSION)
    }

    /// Whether `now` is past its session, or a rejoin or sync it owes.
    pub(super) fn expired(&self, last_heartbeat: Instant, now: Instant) -> Option<&'static str> {
        let session = Duration::from_millis(self.session_timeout_ms.max(0) as u64);
        if now.duration_since(last_heartbeat) > session {
            Some("session timed out")
        } else if self.join_deadline.is_some_and(|d| d <= now) {
            Some("did not rejoin within its rebalance timeout")
        } else if self.sync_deadline.is_some_and(|d| d <= now) {
            Some("did not send SyncGroup within its rebalance timeout")
        } else {
            None
        }
    }
}

/// A classic member as the coordinator's classic side holds it: what an upgrade reads
/// and a downgrade gives back.
#[derive(Debug, Clone)]
pub(crate) struct ClassicMemberState {
    /// Member id.
    pub member_id: String,
    /// `group.instance.id`.
    pub instance_id: Option<String>,
    /// Client id.
    pub client_id: String,
    /// Client address.
    pub client_host: String,
    /// `session.timeout.ms`.
    pub session_timeout_ms: i32,
    /// `max.poll.interval.ms`.
    pub rebalance_timeout_ms: i32,
    /// (assignor name, ConsumerProtocolSubscription bytes), in preference order.
    pub protocols: Vec<(String, Bytes)>,
    /// ConsumerProtocolAssignment bytes: upgrade, what its last SyncGroup gave it
    /// (empty: nothing); downgrade, its target assignment.
    pub assignment: Bytes,
}

/// A JoinGroup (key 11) to a consumer-protocol group.
#[derive(Debug, Clone)]
pub(crate) struct ClassicJoinRequest<'a> {
    /// Empty on a first join.
    pub member_id: &'a str,
    /// `group.instance.id`.
    pub instance_id: Option<&'a str>,
    /// JoinGroup v4+: a dynamic member gets its id with MEMBER_ID_REQUIRED first.
    pub require_known_member_id: bool,
    /// `session.timeout.ms`.
    pub session_timeout_ms: i32,
    /// `max.poll.interval.ms`.
    pub rebalance_timeout_ms: i32,
    /// Must be "consumer".
    pub protocol_type: &'a str,
    /// (assignor name, ConsumerProtocolSubscription bytes).
    pub protocols: &'a [(String, Bytes)],
    /// Client id.
    pub client_id: &'a str,
    /// Client address.
    pub client_host: &'a str,
}

/// The answer to a [`ClassicJoinRequest`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ClassicJoin {
    /// MEMBER_ID_REQUIRED (79) with this id: join again with it.
    MemberIdRequired(String),
    /// Joined at once.
    Joined {
        /// Its id.
        member_id: String,
        /// Its member epoch, the generation it must sync and heartbeat with.
        generation: i32,
        /// The protocol (client-side assignor name) it must sync with: the first it offered.
        protocol_name: String,
    },
}

/// The fields of a ConsumerProtocolSubscription the group uses.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Subscription {
    /// Topic names subscribed to.
    pub topics: BTreeSet<String>,
    /// Partitions it holds (v1+; empty before, as eager members hold none when joining).
    pub owned: Partitions,
    /// `client.rack` (v3+).
    pub rack: Option<String>,
}

/// Decodes a ConsumerProtocolSubscription (int16 version, then the message). `None` for
/// bytes that are not one (a negative version, truncated or malformed fields).
pub(crate) fn decode_subscription(bytes: &[u8]) -> Option<Subscription> {
    let (version, mut buf) = embedded_version(bytes)?;
    let s = ConsumerProtocolSubscription::decode(&mut buf, version).ok()?;
    let owned = by_topic(
        s.owned_partitions
            .into_iter()
            .map(|tp| (tp.topic.0.to_string(), tp.partitions)),
    );
    Some(Subscription {
        topics: s.topics.iter().map(|t| t.to_string()).collect(),
        owned,
        rack: s.rack_id.map(|r| r.to_string()).filter(|r| !r.is_empty()),
    })
}

/// Decodes a ConsumerProtocolAssignment; empty bytes are no partitions. `None` for bytes
/// that are not one.
pub(crate) fn decode_assignment(bytes: &[u8]) -> Option<Partitions> {
    if bytes.is_empty() {
        return Some(Partitions::new());
    }
    let (version, mut buf) = embedded_version(bytes)?;
    let a = ConsumerProtocolAssignment::decode(&mut buf, version).ok()?;
    Some(by_topic(
        a.assigned_partitions
            .into_iter()
            .map(|tp| (tp.topic.0.to_string(), tp.partitions)),
    ))
}

/// The int16 version prefix of embedded-protocol bytes, capped at the highest version
/// known, and the bytes after it; `None` for fewer than 2 bytes or a negative version.
fn embedded_version(bytes: &[u8]) -> Option<(i16, Bytes)> {
    let prefix: [u8; 2] = bytes.get(..2)?.try_into().ok()?;
    let version = i16::from_be_bytes(prefix);
    (version >= 0).then(|| {
        (
            version.min(MAX_EMBEDDED_VERSION),
            Bytes::copy_from_slice(&bytes[2..]),
        )
    })
}

/// Topic-partition lists as [`Partitions`], topics left without partitions dropped.
fn by_topic(lists: impl Iterator<Item = (String, Vec<i32>)>) -> Partitions {
    let mut out = Partitions::new();
    for (topic, partitions) in lists {
        out.entry(topic).or_default().extend(partitions);
    }
    out.retain(|_, p| !p.is_empty());
    out
}

/// Encodes `parts` as a ConsumerProtocolAssignment of `version` (the member's
/// subscription version, as Kafka answers), with its int16 version prefix.
pub(crate) fn encode_assignment(parts: &Partitions, version: i16) -> Bytes {
    let version = version.clamp(0, MAX_EMBEDDED_VERSION);
    let message = ConsumerProtocolAssignment::default().with_assigned_partitions(
        parts
            .iter()
            .map(|(t, p)| {
                AssignedTopic::default()
                    .with_topic(TopicName(StrBytes::from_string(t.clone())))
                    .with_partitions(p.iter().copied().collect())
            })
            .collect(),
    );
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&version.to_be_bytes());
    if message.encode(&mut buf, version).is_err() {
        // Only a field the version cannot carry fails; an assignment has none.
        buf.truncate(2);
    }
    buf.freeze()
}

impl ConsumerGroup {
    /// The consumer-protocol group a classic group becomes (Kafka's `ConsumerGroup
    /// .fromClassicGroup`): every member keeps its id, its last assignment (also its
    /// target) and its subscription from `protocol`'s metadata (its first protocol's when
    /// the group has none chosen yet), at member epoch = group epoch = `generation`.
    ///
    /// Errors: a member's subscription or assignment that is not the consumer embedded
    /// protocol (the message names it).
    pub(crate) fn from_classic(
        generation: i32,
        protocol: Option<&str>,
        members: Vec<ClassicMemberState>,
        settings: &ConsumerGroupSettings,
        now: Instant,
    ) -> Result<ConsumerGroup, String> {
        let mut g = ConsumerGroup::new(generation.max(0), settings);
        for c in members {
            let metadata = protocol
                .and_then(|p| c.protocols.iter().find(|(n, _)| n == p))
                .or_else(|| c.protocols.first())
                .map(|(_, m)| m.clone())
                .unwrap_or_default();
            let Some(sub) = decode_subscription(&metadata) else {
                return Err(format!(
                    "member {} has a subscription that is not the consumer embedded protocol",
                    c.member_id
                ));
            };
            let Some(assigned) = decode_assignment(&c.assignment) else {
                return Err(format!(
                    "member {} has an assignment that is not the consumer embedded protocol",
                    c.member_id
                ));
            };
            let mut m = Member::new(c.member_id.clone(), now);
            m.instance_id = c.instance_id.clone();
            m.rack_id = sub.rack;
            m.client_id = c.client_id;
            m.client_host = c.client_host;
            m.member_epoch = g.group_epoch;
            m.previous_member_epoch = g.group_epoch;
            m.rebalance_timeout_ms = c.rebalance_timeout_ms;
            m.subscribed_topic_names = sub.topics;
            m.assigned = assigned.clone();
            m.classic = Some(ClassicMember {
                session_timeout_ms: c.session_timeout_ms,
                protocols: c.protocols,
                join_deadline: None,
                sync_deadline: None,
            });
            if let Some(instance) = &c.instance_id {
                g.static_members
                    .insert(instance.clone(), c.member_id.clone());
            }
            g.target.insert(c.member_id.clone(), assigned);
            g.members.insert(c.member_id, m);
        }
        Ok(g)
    }

    /// Whether the group has members and every one is a classic member: the moment it
    /// goes back to the classic protocol, if the policy allows.
    pub(crate) fn only_classic_members(&self) -> bool {
        !self.members.is_empty() && self.members.values().all(|m| m.classic.is_some())
    }

    /// Number of members.
    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    /// The highest member epoch: the generation a downgraded group starts from, so that
    /// reconciled members heartbeat at the current generation and are told
    /// REBALANCE_IN_PROGRESS, not ILLEGAL_GENERATION (the leave that emptied the group of
    /// consumer-protocol members bumped the group epoch past them).
    pub(crate) fn max_member_epoch(&self) -> i32 {
        self.members
            .values()
            .map(|m| m.member_epoch)
            .max()
            .unwrap_or(self.group_epoch)
    }

    /// The members as a classic group takes them back (Kafka's `ClassicGroup
    /// .fromConsumerGroup`): each with its target assignment, in its subscription's
    /// version. Only classic members carry what a classic group needs; call when
    /// [`ConsumerGroup::only_classic_members`].
    pub(crate) fn to_classic(&self) -> Vec<ClassicMemberState> {
        let empty = Partitions::new();
        self.members
            .values()
            .filter_map(|m| {
                let c = m.classic.as_ref()?;
                let target = self.target.get(&m.member_id).unwrap_or(&empty);
                Some(ClassicMemberState {
                    member_id: m.member_id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    session_timeout_ms: c.session_timeout_ms,
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    protocols: c.protocols.clone(),
                    assignment: encode_assignment(target, c.version()),
                })
            })
            .collect()
    }

    /// Kafka's `supportsClassicProtocols`: "consumer" type, and a protocol every other
    /// classic member also offered.
    fn supports_classic(
        &self,
        member_id: &str,
        protocol_type: &str,
        offered: &[(String, Bytes)],
    ) -> bool {
        if protocol_type != CONSUMER_PROTOCOL_TYPE || offered.is_empty() {
            return false;
        }
        let mut common: HashSet<&str> = offered.iter().map(|(n, _)| n.as_str()).collect();
        for m in self.members.values().filter(|m| m.member_id != member_id) {
            if let Some(c) = &m.classic {
                let theirs: HashSet<&str> = c.protocols.iter().map(|(n, _)| n.as_str()).collect();
                common.retain(|n| theirs.contains(n));
            }
        }
        !common.is_empty()
    }

    /// The member a classic request names (Kafka's `validateConsumerGroupMember`), which
    /// must be a classic one.
    ///
    /// Errors: UNKNOWN_MEMBER_ID (25), FENCED_INSTANCE_ID (82).
    fn classic_member_id(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Result<String, ResponseError> {
        let id = match instance_id {
            Some(instance) => {
                let Some(current) = self.static_members.get(instance) else {
                    return Err(ResponseError::UnknownMemberId);
                };
                if !member_id.is_empty() && current != member_id {
                    return Err(ResponseError::FencedInstanceId);
                }
                current.clone()
            }
            None => member_id.to_string(),
        };
        match self.members.get(&id) {
            Some(m) if m.classic.is_some() => Ok(id),
            _ => Err(ResponseError::UnknownMemberId),
        }
    }

    /// JoinGroup (key 11) of a classic member (Kafka's `classicGroupJoinToConsumerGroup`):
    /// creates or updates the member from its subscription, moves the group epoch and
    /// target assignment as a heartbeat would, reconciles the member with the partitions
    /// its subscription says it owns, and answers at once.
    ///
    /// Errors: INCONSISTENT_GROUP_PROTOCOL (23) for another protocol type, no protocol in
    /// common with the other classic members, or a subscription that is not the consumer
    /// embedded protocol; GROUP_MAX_SIZE_REACHED (81); UNKNOWN_MEMBER_ID (25);
    /// FENCED_INSTANCE_ID (82).
    pub(crate) fn classic_join(
        &mut self,
        r: &ClassicJoinRequest<'_>,
        now: Instant,
        image: &std::sync::Arc<MetadataImage>,
        settings: &ConsumerGroupSettings,
    ) -> Result<ClassicJoin, ResponseError> {
        if !self.supports_classic(r.member_id, r.protocol_type, r.protocols) {
            return Err(ResponseError::InconsistentGroupProtocol);
        }
        let Some(sub) = decode_subscription(&r.protocols[0].1) else {
            return Err(ResponseError::InconsistentGroupProtocol);
        };
        let unknown = r.member_id.is_empty();
        let member_id = if unknown {
            super::new_member_id()
        } else {
            r.member_id.to_string()
        };
        let full = |g: &ConsumerGroup| {
            !g.members.contains_key(&member_id) && g.members.len() >= settings.max_size
        };
        if r.instance_id.is_none() && unknown && r.require_known_member_id {
            if full(self) {
                return Err(ResponseError::GroupMaxSizeReached);
            }
            return Ok(ClassicJoin::MemberIdRequired(member_id));
        }
        let mut changed = false;
        if let Some(instance) = r.instance_id {
            match self.static_members.get(instance).cloned() {
                Some(old) if old != member_id => {
                    if !unknown {
                        return Err(ResponseError::FencedInstanceId);
                    }
                    // A new incarnation takes the old one's place and partitions, at
                    // epoch 0 (it reconciles below), whichever protocol the old one spoke
                    // (Kafka's `getOrMaybeSubscribeStaticConsumerGroupMember`).
                    if let Some(mut m) = self.members.remove(&old) {
                        m.member_id = member_id.clone();
                        m.member_epoch = 0;
                        m.previous_member_epoch = 0;
                        self.members.insert(member_id.clone(), m);
                    }
                    if let Some(t) = self.target.remove(&old) {
                        self.target.insert(member_id.clone(), t);
                    }
                    self.static_members
                        .insert(instance.to_string(), member_id.clone());
                    tracing::info!(instance, old = %old, new = %member_id, "static classic member rejoined; keeps its partitions");
                }
                Some(_) => {}
                None => {
                    if !unknown && !self.members.contains_key(&member_id) {
                        return Err(ResponseError::UnknownMemberId);
                    }
                }
            }
        }
        if !self.members.contains_key(&member_id) {
            if full(self) {
                return Err(ResponseError::GroupMaxSizeReached);
            }
            let mut m = Member::new(member_id.clone(), now);
            m.instance_id = r.instance_id.map(str::to_string);
            if let Some(instance) = r.instance_id {
                self.static_members
                    .insert(instance.to_string(), member_id.clone());
            }
            self.members.insert(member_id.clone(), m);
            changed = true;
            tracing::info!(member = %member_id, instance = ?r.instance_id, "classic member joined consumer group");
        }
        {
            let Some(m) = self.members.get_mut(&member_id) else {
                return Err(ResponseError::UnknownMemberId);
            };
            m.last_heartbeat = now;
            m.client_id = r.client_id.to_string();
            m.client_host = r.client_host.to_string();
            if sub.rack.is_some() {
                m.rack_id = sub.rack.clone();
            }
            if r.rebalance_timeout_ms >= 0 {
                m.rebalance_timeout_ms = r.rebalance_timeout_ms;
            }
            if m.subscribed_topic_names != sub.topics || m.subscribed_topic_regex.is_some() {
                m.subscribed_topic_names = sub.topics.clone();
                m.subscribed_topic_regex = None;
                m.resolved = None;
                changed = true;
            }
            if m.server_assignor.is_some() {
                m.server_assignor = None;
                changed = true;
            }
            let rebalance_ms = m.rebalance_timeout_ms.max(0) as u64;
            m.classic = Some(ClassicMember {
                session_timeout_ms: r.session_timeout_ms,
                protocols: r.protocols.to_vec(),
                join_deadline: None,
                sync_deadline: Some(now + Duration::from_millis(rebalance_ms)),
            });
        }
        if self.refresh_subscription_metadata(image) || changed {
            self.bump();
        }
        self.maybe_compute_target(image, settings);
        self.reconcile(&member_id, Some(&sub.owned), now);
        let Some(m) = self.members.get(&member_id) else {
            return Err(ResponseError::UnknownMemberId);
        };
        tracing::info!(member = %member_id, member_epoch = m.member_epoch, group_epoch = self.group_epoch, partitions = count(&m.assigned), revoking = count(&m.pending_revocation), "classic member joined at its epoch");
        Ok(ClassicJoin::Joined {
            member_id: member_id.clone(),
            generation: m.member_epoch,
            protocol_name: m
                .classic
                .as_ref()
                .map(|c| c.protocol_name().to_string())
                .unwrap_or_default(),
        })
    }

    /// SyncGroup (key 14) of a classic member (Kafka's `classicGroupSyncToConsumerGroup`):
    /// its current assignment, as a ConsumerProtocolAssignment, and the protocol name.
    ///
    /// Errors: UNKNOWN_MEMBER_ID (25), FENCED_INSTANCE_ID (82), ILLEGAL_GENERATION (22)
    /// when `generation` is not its epoch, INCONSISTENT_GROUP_PROTOCOL (23),
    /// REBALANCE_IN_PROGRESS (27) when the group epoch moved on since it joined.
    pub(crate) fn classic_sync(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        protocol_type: Option<&str>,
        protocol_name: Option<&str>,
        now: Instant,
    ) -> Result<(Bytes, String), ResponseError> {
        let id = self.classic_member_id(member_id, instance_id)?;
        let group_epoch = self.group_epoch;
        let Some(m) = self.members.get_mut(&id) else {
            return Err(ResponseError::UnknownMemberId);
        };
        if generation != m.member_epoch {
            return Err(ResponseError::IllegalGeneration);
        }
        let rebalance_ms = m.rebalance_timeout_ms.max(0) as u64;
        let Some(c) = m.classic.as_mut() else {
            return Err(ResponseError::UnknownMemberId);
        };
        if protocol_type.is_some_and(|t| t != CONSUMER_PROTOCOL_TYPE)
            || protocol_name.is_some_and(|n| n != c.protocol_name())
        {
            return Err(ResponseError::InconsistentGroupProtocol);
        }
        if group_epoch > m.member_epoch && m.state != MemberState::UnrevokedPartitions {
            c.join_deadline
                .get_or_insert(now + Duration::from_millis(rebalance_ms));
            return Err(ResponseError::RebalanceInProgress);
        }
        c.sync_deadline = None;
        m.last_heartbeat = now;
        Ok((
            encode_assignment(&m.assigned, c.version()),
            c.protocol_name().to_string(),
        ))
    }

    /// Heartbeat (key 12) of a classic member (Kafka's `classicGroupHeartbeatToConsumerGroup`).
    ///
    /// Errors: UNKNOWN_MEMBER_ID (25), FENCED_INSTANCE_ID (82), ILLEGAL_GENERATION (22),
    /// REBALANCE_IN_PROGRESS (27) when it must rejoin: the group epoch is past its epoch, it
    /// has partitions to give up, or partitions it waits for were released.
    pub(crate) fn classic_heartbeat(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        now: Instant,
    ) -> Option<ResponseError> {
        let id = match self.classic_member_id(member_id, instance_id) {
            Ok(id) => id,
            Err(e) => return Some(e),
        };
        let group_epoch = self.group_epoch;
        let waiting = self.waiting_on_unreleased(&id);
        let m = self.members.get_mut(&id)?;
        if generation != m.member_epoch {
            return Some(ResponseError::IllegalGeneration);
        }
        m.last_heartbeat = now;
        let rejoin = m.member_epoch < group_epoch
            || m.state == MemberState::UnrevokedPartitions
            || (m.state == MemberState::UnreleasedPartitions && !waiting);
        if !rejoin {
            return None;
        }
        let rebalance_ms = m.rebalance_timeout_ms.max(0) as u64;
        if let Some(c) = m.classic.as_mut() {
            c.join_deadline
                .get_or_insert(now + Duration::from_millis(rebalance_ms));
        }
        Some(ResponseError::RebalanceInProgress)
    }

    /// Whether some partition `member_id`'s target gives it is still held by another
    /// member.
    fn waiting_on_unreleased(&self, member_id: &str) -> bool {
        let Some(m) = self.members.get(member_id) else {
            return false;
        };
        let wanted = minus(
            self.target.get(member_id).unwrap_or(&Partitions::new()),
            &m.assigned,
        );
        !self.held_by_others(member_id, &wanted).is_empty()
    }

    /// LeaveGroup (key 13) of one classic member, by member id or instance id (an admin
    /// removing a static member sends no member id). Returns the id removed.
    ///
    /// Errors: UNKNOWN_MEMBER_ID (25) for no such classic member, FENCED_INSTANCE_ID (82).
    pub(crate) fn classic_leave(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Result<String, ResponseError> {
        let id = self.classic_member_id(member_id, instance_id)?;
        self.remove_member(&id);
        tracing::info!(member = %id, group_epoch = self.group_epoch, "classic member left consumer group");
        Ok(id)
    }
}
