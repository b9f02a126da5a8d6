//! Leader election and ISR upkeep by the active controller (Kafka's
//! `PartitionChangeBuilder` and `ReplicationControlManager` election paths; KIP-631,
//! KIP-841, KIP-966; KIP-460 for ElectLeaders).
//!
//! Owns: [`leadership_changes`], the `PartitionChanged` records that bring every
//! partition in line with which replicas are active (the broker registered, neither
//! fenced nor in controlled shutdown, and its replica not on a failed log dir: KIP-112,
//! KIP-858; every function here judges a replica so, partition by partition,
//! [`MetadataImage::replica_active`]): an inactive replica leaves the ISR (never its last member, which
//! stays so the partition can come back with its data, as Kafka keeps it); a partition
//! whose leader is inactive gets the first replica, in assignment order, that is active
//! and in the ISR, or no leader (-1, offline) when none is. A replica outside the ISR is
//! elected only where `unclean.leader.election.enable` is true (topic key, else the
//! broker default; Kafka's default false): then a partition with no active ISR member
//! gets the first active replica as leader and sole ISR member, and whatever only the
//! old ISR held is lost. A partition offline for want of an ISR member comes back when
//! one is active again. [`elect`] is ElectLeaders' election of one partition (preferred:
//! the first replica, if it is active and in the ISR; unclean: as the automatic one with
//! unclean allowed). [`rebalance_changes`] is the `auto.leader.rebalance.enable` check
//! (Kafka's `checkAndTriggerAutoLeaderRebalance`): per broker, the share of the
//! partitions it is the preferred replica of that another broker leads
//! ([`leader_imbalance`]). [`isr_change`] builds the record a leader proposes for its own
//! ISR (KIP-497's AlterPartition, here a metadata change checked by partition epoch on
//! apply). Both complete a partition reassignment whose new replicas are all in sync
//! (`reassign::complete`, KIP-455).
//!
//! Never does: I/O or clocks (sans-IO: the fence task in `brokers.rs` calls it on the
//! image after its session records; controlled shutdown, ElectLeaders
//! (`Metadata::elect_leaders`) and the rebalance task likewise).

use std::collections::BTreeMap;

use kafka_protocol::ResponseError;

use super::image::{MetadataImage, MetadataRecord, PartitionState, TopicMeta};
use super::reassign;

/// The topic config `unclean.leader.election.enable` of `topic` ("true"), else
/// `broker_default` (the broker key of the same name).
pub(crate) fn unclean_allowed(topic: &TopicMeta, broker_default: bool) -> bool {
    topic
        .configs
        .get("unclean.leader.election.enable")
        .map_or(broker_default, |v| v == "true")
}

/// The `PartitionChanged` records that make every partition of `image` led by an active
/// ISR member when one exists (else, where [`unclean_allowed`] with `unclean_default`,
/// by an active replica outside the ISR; the image's dynamic cluster default of
/// `unclean.leader.election.enable` replaces `unclean_default`), with inactive brokers
/// out of the ISR. Empty
/// when nothing needs to change, or when no broker is registered (a store with no
/// registrations: a single node that predates them).
pub(crate) fn leadership_changes(
    image: &MetadataImage,
    unclean_default: bool,
) -> Vec<MetadataRecord> {
    if image.brokers().next().is_none() {
        return Vec::new();
    }
    // The dynamic cluster default (KIP-226) overrides the static value, as Kafka's
    // controller resolves a topic config (a per-broker value is not the controller's).
    let unclean_default = image
        .broker_configs("")
        .and_then(|c| c.get("unclean.leader.election.enable"))
        .map_or(unclean_default, |v| v == "true");
    let mut out = Vec::new();
    for topic in image.topics() {
        let unclean = unclean_allowed(topic, unclean_default);
        for (index, state) in topic.partition_states.iter().enumerate() {
            let active = |id: i32| image.replica_active(topic.id, index as i32, id);
            // A reassignment whose new replicas are all in sync completes first; the
            // election then looks at the state it leaves.
            let completed = reassign::complete(state, &active);
            let base = completed.as_ref().unwrap_or(state);
            let new = match (reconcile(base, &active, unclean), completed.is_some()) {
                (Some(elected), _) => state.succeeded_by(elected),
                (None, true) => base.clone(),
                (None, false) => continue,
            };
            out.push(MetadataRecord::PartitionChanged {
                topic_id: topic.id,
                partition: index as i32,
                expected_partition_epoch: state.partition_epoch,
                state: new,
            });
        }
    }
    out
}

/// The state `state` should move to given which brokers are `active`, or `None` when it
/// is right as it is. `unclean`: with no active ISR member, the first active replica
/// leads, alone in the ISR (Kafka's unclean election).
fn reconcile(
    state: &PartitionState,
    active: &impl Fn(i32) -> bool,
    unclean: bool,
) -> Option<PartitionState> {
    // The common case, decided without copying the ISR: an active leader in an ISR of
    // active brokers stays as it is.
    if state.leader != -1
        && state.isr.contains(&state.leader)
        && state.isr.iter().all(|b| active(*b))
    {
        return None;
    }
    let mut isr: Vec<i32> = state.isr.iter().copied().filter(|b| active(*b)).collect();
    if isr.is_empty() {
        // The last in-sync replica stays in the ISR while it is away (KIP-966's "last
        // known leader"): it alone holds every acknowledged record.
        isr = state.isr.clone();
    }
    let mut leader = if state.leader != -1 && active(state.leader) && isr.contains(&state.leader) {
        state.leader
    } else {
        state
            .replicas
            .iter()
            .copied()
            .find(|r| active(*r) && isr.contains(r))
            .unwrap_or(-1)
    };
    if leader == -1 && unclean {
        if let Some(r) = state.replicas.iter().copied().find(|r| active(*r)) {
            leader = r;
            isr = vec![r];
        }
    }
    (leader != state.leader || isr != state.isr).then(|| state.changed(leader, isr))
}

/// ElectLeaders' `election_type` (KIP-460).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ElectionType {
    /// 0: the preferred replica (the first of the assignment) leads, if it is active and
    /// in the ISR.
    Preferred,
    /// 1: a partition without an active leader gets one from the ISR, else any active
    /// replica (losing what only the ISR held).
    Unclean,
}

impl ElectionType {
    /// The type of wire value `code` (0 or 1), if any.
    pub(crate) fn from_code(code: i8) -> Option<ElectionType> {
        match code {
            0 => Some(ElectionType::Preferred),
            1 => Some(ElectionType::Unclean),
            _ => None,
        }
    }

    /// Its name as Kafka prints it (`ElectionType.toString`): `PREFERRED`, `UNCLEAN`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ElectionType::Preferred => "PREFERRED",
            ElectionType::Unclean => "UNCLEAN",
        }
    }
}

/// Why one partition of an ElectLeaders request got no new leader (Kafka's codes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ElectionError {
    /// UNKNOWN_TOPIC_OR_PARTITION (3).
    UnknownTopicOrPartition,
    /// ELECTION_NOT_NEEDED (84): the preferred replica leads already (preferred), or the
    /// partition has an active leader (unclean).
    NotNeeded,
    /// PREFERRED_LEADER_NOT_AVAILABLE (80): the preferred replica is not active or not in
    /// the ISR.
    PreferredLeaderNotAvailable,
    /// ELIGIBLE_LEADERS_NOT_AVAILABLE (83): no replica is active.
    EligibleLeadersNotAvailable,
    /// UNKNOWN_SERVER_ERROR (-1): the change was not committed (no quorum in time); the
    /// text says why.
    NotCommitted(String),
}

impl ElectionError {
    /// The Kafka error.
    pub(crate) fn kafka_error(&self) -> ResponseError {
        match self {
            ElectionError::UnknownTopicOrPartition => ResponseError::UnknownTopicOrPartition,
            ElectionError::NotNeeded => ResponseError::ElectionNotNeeded,
            ElectionError::PreferredLeaderNotAvailable => {
                ResponseError::PreferredLeaderNotAvailable
            }
            ElectionError::EligibleLeadersNotAvailable => {
                ResponseError::EligibleLeadersNotAvailable
            }
            ElectionError::NotCommitted(_) => ResponseError::UnknownServerError,
        }
    }

    /// The `error_message` Kafka's controller gives.
    pub(crate) fn message(&self, topic: &str, partition: i32) -> String {
        match self {
            ElectionError::UnknownTopicOrPartition => {
                format!("No such partition as {topic}-{partition}")
            }
            ElectionError::NotNeeded => "Leader election not needed for topic partition.".into(),
            ElectionError::PreferredLeaderNotAvailable => format!(
                "The preferred leader of {topic}-{partition} is not active or not in the ISR."
            ),
            ElectionError::EligibleLeadersNotAvailable => {
                format!("No replica of {topic}-{partition} is active.")
            }
            ElectionError::NotCommitted(why) => why.clone(),
        }
    }
}

/// The record an ElectLeaders election of `election_type` makes for `topic`'s
/// `partition` on `image` (Kafka's `ReplicationControlManager.electLeader`): preferred,
/// the first replica leads if it is active and in the ISR (ISR unchanged); unclean, a
/// partition without an active leader gets the first active ISR replica, else the first
/// active replica with ISR = [it]. The leader epoch goes up by one, the change is
/// checked by partition epoch on apply.
///
/// Errors: [`ElectionError`]: no such partition, not needed, no eligible replica.
pub(crate) fn elect(
    image: &MetadataImage,
    topic: &str,
    partition: i32,
    election_type: ElectionType,
) -> Result<MetadataRecord, ElectionError> {
    let meta = image
        .topic(topic)
        .ok_or(ElectionError::UnknownTopicOrPartition)?;
    let state = meta
        .partition(partition)
        .ok_or(ElectionError::UnknownTopicOrPartition)?;
    let active = |id: i32| image.replica_active(meta.id, partition, id);
    let new = match election_type {
        ElectionType::Preferred => {
            let preferred = state.replicas.first().copied().unwrap_or(-1);
            if state.leader == preferred {
                return Err(ElectionError::NotNeeded);
            }
            if !(active(preferred) && state.in_isr(preferred)) {
                return Err(ElectionError::PreferredLeaderNotAvailable);
            }
            state.changed(preferred, state.isr.clone())
        }
        ElectionType::Unclean => {
            if state.leader != -1 && active(state.leader) {
                return Err(ElectionError::NotNeeded);
            }
            match reconcile(state, &active, true) {
                Some(new) if new.leader != -1 => new,
                _ => return Err(ElectionError::EligibleLeadersNotAvailable),
            }
        }
    };
    Ok(MetadataRecord::PartitionChanged {
        topic_id: meta.id,
        partition,
        expected_partition_epoch: state.partition_epoch,
        state: new,
    })
}

/// Per broker that is the preferred replica (first of the assignment) of some partition:
/// (how many of those partitions another broker leads or nobody does, how many there
/// are). Kafka's imbalance ratio is the first over the second.
pub(crate) fn leader_imbalance(image: &MetadataImage) -> BTreeMap<i32, (usize, usize)> {
    let mut out: BTreeMap<i32, (usize, usize)> = BTreeMap::new();
    for topic in image.topics() {
        for state in topic.partition_states.iter() {
            let Some(&preferred) = state.replicas.first() else {
                continue;
            };
            let e = out.entry(preferred).or_default();
            e.1 += 1;
            if state.leader != preferred {
                e.0 += 1;
            }
        }
    }
    out
}

/// The preferred elections the active controller makes when auto leader rebalance is on
/// (Kafka's `checkAndTriggerAutoLeaderRebalance`): for each broker whose imbalance ratio
/// ([`leader_imbalance`]) is above `per_broker_percentage` %, every partition it is the
/// preferred replica of, led by another, where it is active and in the ISR, gets it as
/// leader. At most `max_elections` records (the rest wait for the next check).
pub(crate) fn rebalance_changes(
    image: &MetadataImage,
    per_broker_percentage: u32,
    max_elections: usize,
) -> Vec<MetadataRecord> {
    let over: Vec<i32> = leader_imbalance(image)
        .into_iter()
        .filter(|(_, (imbalanced, total))| {
            // imbalanced / total > percentage / 100, in integers.
            (*imbalanced as u128) * 100 > (*total as u128) * u128::from(per_broker_percentage)
        })
        .map(|(broker, _)| broker)
        .collect();
    let mut out = Vec::new();
    if over.is_empty() {
        return out;
    }
    for topic in image.topics() {
        for (index, state) in topic.partition_states.iter().enumerate() {
            if out.len() >= max_elections {
                return out;
            }
            let Some(&preferred) = state.replicas.first() else {
                continue;
            };
            if state.leader == preferred || !over.contains(&preferred) {
                continue;
            }
            if let Ok(record) = elect(image, &topic.name, index as i32, ElectionType::Preferred) {
                out.push(record);
            }
        }
    }
    out
}

/// The `PartitionChanged` records a new registration of `broker_id` (a restart) makes,
/// from `image`, the state before it. Kafka never lets a restarted broker carry on as
/// the earlier incarnation: KRaft registers it fenced, so it leaves the ISRs and its
/// leaderships move, and it rejoins by catching up. Here a restart replaces the
/// registration unfenced, so the same happens in the registration's own change: wherever
/// another active broker is in the ISR, `broker_id` leaves it and, where it led, the
/// first active ISR replica in assignment order leads at the next leader epoch. Without
/// this, a leader killed and restarted within `broker.session.timeout.ms` kept leading at
/// the same epoch, its high watermark at its log end offset (not checkpointed), and
/// acknowledged an idempotent retry of a batch no follower had; killed again, a follower
/// without it was elected. A partition whose ISR has no other active member is left as it
/// is (it alone may hold every acknowledged record).
pub(crate) fn reregistration_changes(image: &MetadataImage, broker_id: i32) -> Vec<MetadataRecord> {
    let mut out = Vec::new();
    for topic in image.topics() {
        for (index, state) in topic.partition_states.iter().enumerate() {
            let other_active =
                |id: i32| id != broker_id && image.replica_active(topic.id, index as i32, id);
            if !state.isr.contains(&broker_id) {
                continue;
            }
            let isr: Vec<i32> = state
                .isr
                .iter()
                .copied()
                .filter(|b| *b != broker_id)
                .collect();
            if !isr.iter().any(|b| other_active(*b)) {
                continue;
            }
            let leader = if state.leader == broker_id {
                state
                    .replicas
                    .iter()
                    .copied()
                    .find(|r| other_active(*r) && isr.contains(r))
                    .unwrap_or(-1)
            } else {
                state.leader
            };
            out.push(MetadataRecord::PartitionChanged {
                topic_id: topic.id,
                partition: index as i32,
                expected_partition_epoch: state.partition_epoch,
                state: state.changed(leader, isr),
            });
        }
    }
    out
}

/// The record a partition's leader `leader_id` proposes to set the ISR to `isr`
/// (shrink or expand; KIP-497 AlterPartition), against the state it last saw at
/// `seen_partition_epoch`. `None` when the image has no such partition, another broker
/// leads it now, the partition moved past the epoch the leader saw (the leader then
/// learns the newer state from the metadata and retries if still needed), or a broker it
/// adds is not active (KIP-841: fenced, shutting down or unregistered; the leader asks
/// again at that follower's next fetch).
pub(crate) fn isr_change(
    image: &MetadataImage,
    topic: &str,
    partition: i32,
    leader_id: i32,
    seen_partition_epoch: i32,
    isr: Vec<i32>,
) -> Option<MetadataRecord> {
    let meta = image.topic(topic)?;
    let state = meta.partition(partition)?;
    if state.leader != leader_id || state.partition_epoch != seen_partition_epoch {
        return None;
    }
    if isr.is_empty() || !isr.contains(&leader_id) || isr == state.isr {
        return None;
    }
    // The ISR change that brings a reassignment's last new replica in completes it in the
    // same record (Kafka's `PartitionChangeBuilder.tryCompleteReassignment`).
    let changed = state.changed(leader_id, isr);
    if let Some(id) = image.ineligible_isr_joiner(meta.id, partition, state, &changed) {
        // Asked again at the follower's next fetch, once its heartbeat unfenced it.
        tracing::debug!(
            topic,
            partition,
            broker_id = id,
            "not asking for an inactive broker or offline replica to join the ISR (KIP-841, KIP-858)"
        );
        return None;
    }
    let active = |id: i32| {
        image.broker(id).is_none_or(|b| b.is_active())
            && !image.replica_offline(meta.id, partition, id)
    };
    let new = match reassign::complete(&changed, &active) {
        Some(done) => state.succeeded_by(done),
        None => changed,
    };
    Some(MetadataRecord::PartitionChanged {
        topic_id: meta.id,
        partition,
        expected_partition_epoch: state.partition_epoch,
        state: new,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The records that create topic `t` (replication factor `replication_factor`, one
    /// partition per state of `states`) and register brokers 1, 2 and 3, active.
    fn topic_and_brokers(
        replication_factor: i16,
        states: Vec<PartitionState>,
    ) -> Vec<MetadataRecord> {
        let topic = crate::cluster::image::TopicMeta {
            name: "t".into(),
            id: uuid::Uuid::new_v4(),
            partitions: states.len() as i32,
            replication_factor,
            configs: Default::default(),
            partition_states: states.into(),
        };
        let mut records = vec![MetadataRecord::TopicCreated(topic)];
        for id in 1..=3 {
            records.push(MetadataRecord::BrokerRegistered {
                broker_id: id,
                broker_epoch: i64::from(id),
                incarnation_id: uuid::Uuid::new_v4(),
                endpoints: Vec::new(),
                rack: None,
            });
        }
        records
    }

    fn state(replicas: &[i32], isr: &[i32], leader: i32) -> PartitionState {
        PartitionState {
            replicas: replicas.to_vec(),
            isr: isr.to_vec(),
            leader,
            leader_epoch: 4,
            partition_epoch: 9,
            adding_replicas: Vec::new(),
            removing_replicas: Vec::new(),
        }
    }

    #[test]
    fn a_dead_leader_is_replaced_by_the_first_live_isr_member() {
        let s = state(&[1, 2, 3], &[1, 2, 3], 1);
        let new = reconcile(&s, &|b| b != 1, false).unwrap();
        assert_eq!((new.leader, &new.isr[..]), (2, &[2, 3][..]));
        assert_eq!((new.leader_epoch, new.partition_epoch), (5, 10));
    }

    #[test]
    fn a_dead_follower_leaves_the_isr_and_the_leader_epoch_stays() {
        let s = state(&[1, 2, 3], &[1, 2, 3], 1);
        let new = reconcile(&s, &|b| b != 3, false).unwrap();
        assert_eq!((new.leader, &new.isr[..]), (1, &[1, 2][..]));
        assert_eq!((new.leader_epoch, new.partition_epoch), (4, 10));
        assert_eq!(
            reconcile(&new, &|b| b != 3, false),
            None,
            "stable once applied"
        );
    }

    #[test]
    fn no_replica_outside_the_isr_is_elected() {
        // 3 is alive but was out of sync: the partition goes offline, ISR kept.
        let s = state(&[1, 2, 3], &[1], 1);
        let new = reconcile(&s, &|b| b == 3, false).unwrap();
        assert_eq!((new.leader, &new.isr[..]), (-1, &[1][..]));
        // The last ISR member returns: it leads again.
        let back = reconcile(&new, &|_| true, false).unwrap();
        assert_eq!((back.leader, &back.isr[..]), (1, &[1][..]));
        assert_eq!(back.leader_epoch, new.leader_epoch + 1);
    }

    #[test]
    fn a_restarted_broker_leaves_the_isr_and_its_leaderships_move_where_others_are_in_sync() {
        use crate::cluster::image::MetadataDelta;
        use std::sync::Arc;
        let records = topic_and_brokers(
            3,
            vec![
                // 1 leads, 2 and 3 in sync: 2 takes over at the next epoch.
                state(&[1, 2, 3], &[1, 2, 3], 1),
                // 1 follows in sync: it leaves the ISR, the leader stays.
                state(&[2, 1, 3], &[2, 1], 2),
                // 1 is the only ISR member: untouched.
                state(&[1, 2, 3], &[1], 1),
            ],
        );
        let image = MetadataDelta::apply(Arc::new(MetadataImage::empty("c", 1)), records)
            .unwrap()
            .after()
            .clone();
        let changes = reregistration_changes(&image, 1);
        assert_eq!(changes.len(), 2, "{changes:?}");
        let after = MetadataDelta::apply(image.clone(), changes).unwrap();
        let p = |i| after.after().partition("t", i).unwrap().clone();
        assert_eq!(
            (p(0).leader, &p(0).isr[..], p(0).leader_epoch),
            (2, &[2, 3][..], 5)
        );
        assert_eq!(
            (p(1).leader, &p(1).isr[..], p(1).leader_epoch),
            (2, &[2][..], 4)
        );
        assert_eq!(
            (p(2).leader, &p(2).isr[..], p(2).leader_epoch),
            (1, &[1][..], 4)
        );
    }

    #[test]
    fn the_isr_change_that_brings_the_last_new_replica_in_completes_a_reassignment() {
        use crate::cluster::image::MetadataDelta;
        use std::sync::Arc;
        // Moving {1, 2} to {2, 3}: 3 is catching up, 1 leads.
        let moving = PartitionState {
            adding_replicas: vec![3],
            removing_replicas: vec![1],
            ..state(&[2, 3, 1], &[1, 2], 1)
        };
        let records = topic_and_brokers(2, vec![moving]);
        let image = MetadataDelta::apply(Arc::new(MetadataImage::empty("c", 1)), records)
            .unwrap()
            .after()
            .clone();
        // Nothing to complete or elect yet.
        assert!(leadership_changes(&image, false).is_empty());
        let join = isr_change(&image, "t", 0, 1, 9, vec![1, 2, 3]).unwrap();
        let after = MetadataDelta::apply(image.clone(), vec![join]).unwrap();
        let p = after.after().partition("t", 0).unwrap().clone();
        assert_eq!(
            (&p.replicas[..], &p.isr[..], p.leader),
            (&[2, 3][..], &[2, 3][..], 2)
        );
        assert!(!p.is_reassigning());
        assert_eq!((p.leader_epoch, p.partition_epoch), (5, 10));
        // The controller's pass completes one whose new replica joined without it (an
        // ISR change made before the reassignment started, say).
        let joined = MetadataDelta::apply(
            image.clone(),
            vec![MetadataRecord::PartitionChanged {
                topic_id: image.topic("t").unwrap().id,
                partition: 0,
                expected_partition_epoch: 9,
                state: image.partition("t", 0).unwrap().changed(1, vec![1, 2, 3]),
            }],
        )
        .unwrap();
        let done = leadership_changes(joined.after(), false);
        assert_eq!(done.len(), 1, "{done:?}");
        let after = MetadataDelta::apply(joined.after().clone(), done).unwrap();
        let p = after.after().partition("t", 0).unwrap();
        assert_eq!(
            (&p.replicas[..], p.leader, p.leader_epoch),
            (&[2, 3][..], 2, 5)
        );
        assert!(
            leadership_changes(after.after(), false).is_empty(),
            "stable once applied"
        );
    }

    #[test]
    fn only_an_active_broker_joins_the_isr() {
        use crate::cluster::image::MetadataDelta;
        let fenced = image_of(vec![state(&[1, 2, 3], &[1, 2], 1)], &[3], &[]);
        // The leader does not ask, and a change made anyway is refused where it is applied.
        assert!(isr_change(&fenced, "t", 0, 1, 9, vec![1, 2, 3]).is_none());
        let join = MetadataRecord::PartitionChanged {
            topic_id: fenced.topic("t").unwrap().id,
            partition: 0,
            expected_partition_epoch: 9,
            state: fenced.partition("t", 0).unwrap().changed(1, vec![1, 2, 3]),
        };
        let refused = MetadataDelta::apply(fenced.clone(), vec![join.clone()]).unwrap_err();
        assert!(refused.to_string().contains("broker 3"), "{refused}");
        // A shrink that leaves the fenced broker out still goes.
        assert!(isr_change(&fenced, "t", 0, 1, 9, vec![1]).is_some());
        // Unfenced (its heartbeat), it joins.
        let unfenced = MetadataDelta::apply(
            fenced,
            vec![MetadataRecord::BrokerUnfenced {
                broker_id: 3,
                broker_epoch: 3,
            }],
        )
        .unwrap()
        .after()
        .clone();
        let join = isr_change(&unfenced, "t", 0, 1, 9, vec![1, 2, 3]).unwrap();
        let after = MetadataDelta::apply(unfenced, vec![join]).unwrap();
        assert_eq!(after.after().partition("t", 0).unwrap().isr, vec![1, 2, 3]);
    }

    #[test]
    fn replicas_on_a_failed_dir_leave_the_isr_lose_leadership_and_come_back_on_restart() {
        use crate::cluster::brokers::offline_replica_records;
        use crate::cluster::image::MetadataDelta;
        let image = image_of(
            vec![
                // 1 leads: 2 takes over, 1 leaves the ISR.
                state(&[1, 2, 3], &[1, 2, 3], 1),
                // 1 follows: it leaves the ISR, 2 keeps leading.
                state(&[2, 1, 3], &[2, 1, 3], 2),
                // 1 is the only ISR member: it stays in it, the partition has no leader.
                state(&[1, 2, 3], &[1], 1),
                // 1 is the sole replica: not reported (nowhere to move).
                state(&[1], &[1], 1),
                // Not on the failed dir: untouched.
                state(&[1, 2, 3], &[1, 2, 3], 1),
            ],
            &[],
            &[],
        );
        let failed: Vec<(String, i32)> = (0..4).map(|i| ("t".to_string(), i)).collect();
        let report = offline_replica_records(&image, 1, &failed);
        let MetadataRecord::ReplicasOffline {
            partitions,
            broker_epoch,
            ..
        } = &report[0]
        else {
            panic!("{report:?}");
        };
        assert_eq!((partitions.len(), *broker_epoch), (3, 1), "{report:?}");
        let marked = MetadataDelta::apply(image.clone(), report.clone())
            .unwrap()
            .after()
            .clone();
        assert!(
            offline_replica_records(&marked, 1, &failed).is_empty(),
            "reported once"
        );
        let changes = leadership_changes(&marked, false);
        assert_eq!(changes.len(), 3, "{changes:?}");
        let after = MetadataDelta::apply(marked.clone(), changes)
            .unwrap()
            .after()
            .clone();
        let p = |i| after.partition("t", i).unwrap().clone();
        assert_eq!((p(0).leader, p(0).isr.clone()), (2, vec![2, 3]));
        assert_eq!(p(0).leader_epoch, 5);
        assert_eq!((p(1).leader, p(1).isr.clone()), (2, vec![2, 3]));
        assert_eq!((p(2).leader, p(2).isr.clone()), (-1, vec![1]));
        assert_eq!((p(3).leader, p(3).isr.clone()), (1, vec![1]));
        assert_eq!((p(4).leader, p(4).isr.clone()), (1, vec![1, 2, 3]));
        assert!(leadership_changes(&after, false).is_empty(), "stable");
        // Never elected, neither preferred nor by the rebalance, nor taken back into the
        // ISR by a leader (and a change doing so is refused on apply).
        assert_eq!(
            elect(&after, "t", 0, ElectionType::Preferred),
            Err(ElectionError::PreferredLeaderNotAvailable)
        );
        assert!(rebalance_changes(&after, 0, 100).is_empty());
        assert!(isr_change(&after, "t", 1, 2, 10, vec![2, 1, 3]).is_none());
        let join = MetadataRecord::PartitionChanged {
            topic_id: after.topic("t").unwrap().id,
            partition: 1,
            expected_partition_epoch: 10,
            state: p(1).changed(2, vec![2, 1, 3]),
        };
        let refused = MetadataDelta::apply(after.clone(), vec![join]).unwrap_err();
        assert!(refused.to_string().contains("offline"), "{refused}");
        // Unclean allowed: the offline last ISR member is not elected, another is.
        assert_eq!(new_state(&leadership_changes(&after, true)[0]).leader, 2);
        // Restarted (registered again): active again, it rejoins the ISR by catching up
        // and the preferred election can give it its leadership back.
        let restarted = MetadataDelta::apply(
            after,
            vec![MetadataRecord::BrokerRegistered {
                broker_id: 1,
                broker_epoch: 4,
                incarnation_id: uuid::Uuid::new_v4(),
                endpoints: Vec::new(),
                rack: None,
            }],
        )
        .unwrap()
        .after()
        .clone();
        assert!(!restarted.replica_offline(restarted.topic("t").unwrap().id, 0, 1));
        let join = isr_change(&restarted, "t", 0, 2, 10, vec![2, 3, 1]).unwrap();
        let rejoined = MetadataDelta::apply(restarted, vec![join])
            .unwrap()
            .after()
            .clone();
        assert_eq!(rejoined.partition("t", 0).unwrap().isr, vec![2, 3, 1]);
        assert!(elect(&rejoined, "t", 0, ElectionType::Preferred).is_ok());
    }

    #[test]
    fn the_leader_proposes_only_against_the_state_it_saw() {
        use crate::cluster::image::{MetadataDelta, TopicMeta};
        use std::sync::Arc;
        let topic = TopicMeta {
            name: "t".into(),
            id: uuid::Uuid::new_v4(),
            partitions: 1,
            replication_factor: 3,
            configs: Default::default(),
            partition_states: vec![state(&[1, 2, 3], &[1, 2, 3], 1)].into(),
        };
        let image = MetadataDelta::apply(
            Arc::new(MetadataImage::empty("c", 1)),
            vec![MetadataRecord::TopicCreated(topic)],
        )
        .unwrap()
        .after()
        .clone();
        assert!(
            isr_change(&image, "t", 0, 1, 8, vec![1, 2]).is_none(),
            "stale epoch"
        );
        assert!(
            isr_change(&image, "t", 0, 2, 9, vec![2]).is_none(),
            "not the leader"
        );
        let shrink = isr_change(&image, "t", 0, 1, 9, vec![1, 2]).unwrap();
        let after = MetadataDelta::apply(image.clone(), vec![shrink.clone()]).unwrap();
        assert_eq!(after.after().partition("t", 0).unwrap().isr, vec![1, 2]);
        // The same change again (a stale leader's retry) is refused on apply.
        assert!(MetadataDelta::apply(after.after().clone(), vec![shrink]).is_err());
    }

    #[test]
    fn an_unclean_election_takes_a_live_replica_outside_the_isr_only_when_allowed() {
        // 1 (the only ISR member) is away; 2 and 3 are alive, out of sync.
        let s = state(&[1, 2, 3], &[1], -1);
        assert_eq!(reconcile(&s, &|b| b != 1, false), None, "stays offline");
        let new = reconcile(&s, &|b| b != 1, true).unwrap();
        assert_eq!((new.leader, &new.isr[..]), (2, &[2][..]));
        assert_eq!((new.leader_epoch, new.partition_epoch), (5, 10));
        // An ISR member alive is always preferred to an unclean pick.
        let s = state(&[1, 2, 3], &[1, 3], 1);
        let new = reconcile(&s, &|b| b != 1, true).unwrap();
        assert_eq!((new.leader, &new.isr[..]), (3, &[3][..]));
        // Nobody alive: nothing to elect.
        assert_eq!(reconcile(&state(&[1, 2], &[1], -1), &|_| false, true), None);
    }

    /// An image with topic `t` of `states` and brokers 1, 2, 3 registered, `down` fenced.
    fn image_of(
        states: Vec<PartitionState>,
        down: &[i32],
        configs: &[(&str, &str)],
    ) -> std::sync::Arc<MetadataImage> {
        use crate::cluster::image::MetadataDelta;
        use std::sync::Arc;
        let mut records = topic_and_brokers(3, states);
        if let MetadataRecord::TopicCreated(topic) = &mut records[0] {
            topic.configs = configs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        }
        for &id in down {
            records.push(MetadataRecord::BrokerFenced {
                broker_id: id,
                broker_epoch: i64::from(id),
            });
        }
        MetadataDelta::apply(Arc::new(MetadataImage::empty("c", 1)), records)
            .unwrap()
            .after()
            .clone()
    }

    fn new_state(record: &MetadataRecord) -> &PartitionState {
        match record {
            MetadataRecord::PartitionChanged { state, .. } => state,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_unclean_topic_config_overrides_the_broker_default() {
        let offline = || vec![state(&[1, 2, 3], &[1], -1)];
        let off = image_of(offline(), &[1], &[]);
        assert!(leadership_changes(&off, false).is_empty());
        let on = leadership_changes(&off, true);
        assert_eq!(new_state(&on[0]).leader, 2);
        let topic_on = image_of(
            offline(),
            &[1],
            &[("unclean.leader.election.enable", "true")],
        );
        assert_eq!(
            new_state(&leadership_changes(&topic_on, false)[0]).isr,
            vec![2]
        );
        let topic_off = image_of(
            offline(),
            &[1],
            &[("unclean.leader.election.enable", "false")],
        );
        assert!(leadership_changes(&topic_off, true).is_empty());
    }

    #[test]
    fn the_dynamic_cluster_default_overrides_the_static_unclean_default() {
        use crate::cluster::image::MetadataDelta;
        let offline = || vec![state(&[1, 2, 3], &[1], -1)];
        let default = |value: &str| MetadataRecord::BrokerConfigsChanged {
            resource: String::new(),
            configs: [(
                "unclean.leader.election.enable".to_string(),
                value.to_string(),
            )]
            .into(),
        };
        let with = |image: &std::sync::Arc<MetadataImage>, record| {
            MetadataDelta::apply(image.clone(), vec![record])
                .unwrap()
                .after()
                .clone()
        };
        let off = image_of(offline(), &[1], &[]);
        let on = with(&off, default("true"));
        assert_eq!(new_state(&leadership_changes(&on, false)[0]).leader, 2);
        assert!(leadership_changes(&with(&off, default("false")), true).is_empty());
        // A topic override still wins over the dynamic default.
        let topic_off = image_of(
            offline(),
            &[1],
            &[("unclean.leader.election.enable", "false")],
        );
        assert!(leadership_changes(&with(&topic_off, default("true")), false).is_empty());
    }

    #[test]
    fn a_preferred_election_needs_the_first_replica_active_and_in_sync() {
        let image = image_of(
            vec![
                // 2 leads, 1 (preferred) in sync: elected.
                state(&[1, 2, 3], &[1, 2, 3], 2),
                // 1 leads already.
                state(&[1, 2, 3], &[1, 2, 3], 1),
                // 3 (preferred) is out of the ISR.
                state(&[3, 1, 2], &[1, 2], 1),
                // 2 (preferred) is fenced.
                state(&[2, 1, 3], &[1, 2, 3], 1),
            ],
            &[2],
            &[],
        );
        let elect_p = |p| elect(&image, "t", p, ElectionType::Preferred);
        let r = elect_p(0).unwrap();
        let s = new_state(&r);
        assert_eq!(
            (s.leader, &s.isr[..], s.leader_epoch, s.partition_epoch),
            (1, &[1, 2, 3][..], 5, 10)
        );
        let after =
            crate::cluster::image::MetadataDelta::apply(image.clone(), vec![r.clone()]).unwrap();
        assert_eq!(after.after().partition("t", 0).unwrap().leader, 1);
        // The same record again (a second election from the same image) is refused.
        assert!(
            crate::cluster::image::MetadataDelta::apply(after.after().clone(), vec![r]).is_err()
        );
        assert_eq!(elect_p(1), Err(ElectionError::NotNeeded));
        assert_eq!(elect_p(2), Err(ElectionError::PreferredLeaderNotAvailable));
        assert_eq!(elect_p(3), Err(ElectionError::PreferredLeaderNotAvailable));
        assert_eq!(elect_p(4), Err(ElectionError::UnknownTopicOrPartition));
        assert_eq!(
            elect(&image, "nope", 0, ElectionType::Preferred),
            Err(ElectionError::UnknownTopicOrPartition)
        );
        assert_eq!(ElectionError::NotNeeded.kafka_error().code(), 84);
        assert_eq!(
            ElectionError::PreferredLeaderNotAvailable
                .kafka_error()
                .code(),
            80
        );
        assert_eq!(
            ElectionError::EligibleLeadersNotAvailable
                .kafka_error()
                .code(),
            83
        );
    }

    #[test]
    fn an_unclean_election_is_needed_only_without_an_active_leader() {
        let image = image_of(
            vec![
                // Still led by 1, fenced (before the fence task's election).
                state(&[1, 2, 3], &[1, 2, 3], 1),
                // Offline, the only ISR member (1) fenced, 2 and 3 alive.
                state(&[1, 2, 3], &[1], -1),
                // Offline, every replica fenced (only 1 is here).
                state(&[1], &[1], -1),
            ],
            &[1],
            &[],
        );
        let elect_u = |p| elect(&image, "t", p, ElectionType::Unclean);
        // 1 is fenced but still named leader of partition 0 (before the fence tick):
        // needed, and the ISR's next active member leads.
        let s0 = elect_u(0).unwrap();
        assert_eq!(
            (new_state(&s0).leader, &new_state(&s0).isr[..]),
            (2, &[2, 3][..])
        );
        let s1 = elect_u(1).unwrap();
        assert_eq!(
            (new_state(&s1).leader, &new_state(&s1).isr[..]),
            (2, &[2][..])
        );
        assert_eq!(elect_u(2), Err(ElectionError::EligibleLeadersNotAvailable));
        let healthy = image_of(vec![state(&[1, 2, 3], &[1, 2, 3], 3)], &[], &[]);
        assert_eq!(
            elect(&healthy, "t", 0, ElectionType::Unclean),
            Err(ElectionError::NotNeeded)
        );
        assert_eq!(ElectionType::from_code(1), Some(ElectionType::Unclean));
        assert_eq!(ElectionType::from_code(2), None);
    }

    #[test]
    fn rebalance_moves_leadership_back_only_above_the_imbalance_percentage() {
        // Broker 1 is preferred for 4 partitions; 2 lead elsewhere (50 %), one of those
        // with 1 out of the ISR. Broker 2 is preferred for 1, which it leads.
        let image = image_of(
            vec![
                state(&[1, 2, 3], &[1, 2, 3], 2),
                state(&[1, 2, 3], &[2, 3], 3),
                state(&[1, 3, 2], &[1, 2, 3], 1),
                state(&[1, 3, 2], &[1, 2, 3], 1),
                state(&[2, 3, 1], &[1, 2, 3], 2),
            ],
            &[],
            &[],
        );
        let ratios = leader_imbalance(&image);
        assert_eq!(ratios.get(&1), Some(&(2, 4)));
        assert_eq!(ratios.get(&2), Some(&(0, 1)));
        let at = |pct| rebalance_changes(&image, pct, 1000);
        // 50 % is not above 50 %; above 10 % (the default) it is: only the partition
        // where 1 is in sync moves.
        assert!(at(50).is_empty());
        let moved = at(10);
        assert_eq!(moved.len(), 1, "{moved:?}");
        assert!(matches!(
            moved[0],
            MetadataRecord::PartitionChanged { partition: 0, .. }
        ));
        assert_eq!(new_state(&moved[0]).leader, 1);
        assert!(rebalance_changes(&image, 0, 0).is_empty(), "bounded");
        let after = crate::cluster::image::MetadataDelta::apply(image.clone(), moved).unwrap();
        assert_eq!(leader_imbalance(after.after()).get(&1), Some(&(1, 4)));
        // 25 % left, all of it ineligible: nothing more to do.
        assert!(rebalance_changes(after.after(), 10, 1000).is_empty());
    }
}
