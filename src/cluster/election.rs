//! Leader election and ISR upkeep by the active controller (Kafka's
//! `PartitionChangeBuilder` and `ReplicationControlManager` election paths; KIP-631,
//! KIP-841, KIP-966).
//!
//! Owns: [`leadership_changes`], the `PartitionChanged` records that bring every
//! partition in line with which brokers are active (registered, neither fenced nor in
//! controlled shutdown): an inactive broker leaves the ISR (never its last member, which
//! stays so the partition can come back with its data, as Kafka keeps it); a partition
//! whose leader is inactive gets the first replica, in assignment order, that is active
//! and in the ISR, or no leader (-1, offline) when none is — never a replica outside the
//! ISR (`unclean.leader.election.enable=false`, Kafka's default, the only mode). A
//! partition offline for want of an ISR member comes back when one is active again.
//! [`isr_change`] builds the record a leader proposes for its own ISR (KIP-497's
//! AlterPartition, here a metadata change checked by partition epoch on apply). Both
//! complete a partition reassignment whose new replicas are all in sync
//! (`reassign::complete`, KIP-455).
//!
//! Never does: I/O or clocks (sans-IO: the fence task in `brokers.rs` calls it on the
//! image after its session records; controlled shutdown likewise).

use super::image::{MetadataImage, MetadataRecord, PartitionState};
use super::reassign;

/// The `PartitionChanged` records that make every partition of `image` led by an active
/// ISR member when one exists, with inactive brokers out of the ISR. Empty when nothing
/// needs to change, or when no broker is registered (a store with no registrations: a
/// single node that predates them).
pub(crate) fn leadership_changes(image: &MetadataImage) -> Vec<MetadataRecord> {
    if image.brokers().next().is_none() {
        return Vec::new();
    }
    let active = |id: i32| image.broker(id).is_some_and(|b| b.is_active());
    let mut out = Vec::new();
    for topic in image.topics() {
        for (index, state) in topic.partition_states.iter().enumerate() {
            // A reassignment whose new replicas are all in sync completes first; the
            // election then looks at the state it leaves.
            let completed = reassign::complete(state, &active);
            let base = completed.as_ref().unwrap_or(state);
            let new = match (reconcile(base, &active), completed.is_some()) {
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
/// is right as it is.
fn reconcile(state: &PartitionState, active: &impl Fn(i32) -> bool) -> Option<PartitionState> {
    let mut isr: Vec<i32> = state.isr.iter().copied().filter(|b| active(*b)).collect();
    if isr.is_empty() {
        // The last in-sync replica stays in the ISR while it is away (KIP-966's "last
        // known leader"): it alone holds every acknowledged record.
        isr = state.isr.clone();
    }
    let leader = if state.leader != -1 && active(state.leader) && isr.contains(&state.leader) {
        state.leader
    } else {
        state
            .replicas
            .iter()
            .copied()
            .find(|r| active(*r) && isr.contains(r))
            .unwrap_or(-1)
    };
    (leader != state.leader || isr != state.isr).then(|| state.changed(leader, isr))
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
    let other_active = |id: i32| id != broker_id && image.broker(id).is_some_and(|b| b.is_active());
    let mut out = Vec::new();
    for topic in image.topics() {
        for (index, state) in topic.partition_states.iter().enumerate() {
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
/// leads it now, or the partition moved past the epoch the leader saw (the leader then
/// learns the newer state from the metadata and retries if still needed).
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
    let active = |id: i32| image.broker(id).is_none_or(|b| b.is_active());
    let changed = state.changed(leader_id, isr);
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
        let new = reconcile(&s, &|b| b != 1).unwrap();
        assert_eq!((new.leader, &new.isr[..]), (2, &[2, 3][..]));
        assert_eq!((new.leader_epoch, new.partition_epoch), (5, 10));
    }

    #[test]
    fn a_dead_follower_leaves_the_isr_and_the_leader_epoch_stays() {
        let s = state(&[1, 2, 3], &[1, 2, 3], 1);
        let new = reconcile(&s, &|b| b != 3).unwrap();
        assert_eq!((new.leader, &new.isr[..]), (1, &[1, 2][..]));
        assert_eq!((new.leader_epoch, new.partition_epoch), (4, 10));
        assert_eq!(reconcile(&new, &|b| b != 3), None, "stable once applied");
    }

    #[test]
    fn no_replica_outside_the_isr_is_elected() {
        // 3 is alive but was out of sync: the partition goes offline, ISR kept.
        let s = state(&[1, 2, 3], &[1], 1);
        let new = reconcile(&s, &|b| b == 3).unwrap();
        assert_eq!((new.leader, &new.isr[..]), (-1, &[1][..]));
        // The last ISR member returns: it leads again.
        let back = reconcile(&new, &|_| true).unwrap();
        assert_eq!((back.leader, &back.isr[..]), (1, &[1][..]));
        assert_eq!(back.leader_epoch, new.leader_epoch + 1);
    }

    #[test]
    fn a_restarted_broker_leaves_the_isr_and_its_leaderships_move_where_others_are_in_sync() {
        use crate::cluster::image::{MetadataDelta, TopicMeta};
        use std::sync::Arc;
        let topic = TopicMeta {
            name: "t".into(),
            id: uuid::Uuid::new_v4(),
            partitions: 3,
            replication_factor: 3,
            configs: Default::default(),
            partition_states: vec![
                // 1 leads, 2 and 3 in sync: 2 takes over at the next epoch.
                state(&[1, 2, 3], &[1, 2, 3], 1),
                // 1 follows in sync: it leaves the ISR, the leader stays.
                state(&[2, 1, 3], &[2, 1], 2),
                // 1 is the only ISR member: untouched.
                state(&[1, 2, 3], &[1], 1),
            ]
            .into(),
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
        use crate::cluster::image::{MetadataDelta, TopicMeta};
        use std::sync::Arc;
        // Moving {1, 2} to {2, 3}: 3 is catching up, 1 leads.
        let moving = PartitionState {
            adding_replicas: vec![3],
            removing_replicas: vec![1],
            ..state(&[2, 3, 1], &[1, 2], 1)
        };
        let topic = TopicMeta {
            name: "t".into(),
            id: uuid::Uuid::new_v4(),
            partitions: 1,
            replication_factor: 2,
            configs: Default::default(),
            partition_states: vec![moving].into(),
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
        let image = MetadataDelta::apply(Arc::new(MetadataImage::empty("c", 1)), records)
            .unwrap()
            .after()
            .clone();
        // Nothing to complete or elect yet.
        assert!(leadership_changes(&image).is_empty());
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
        let done = leadership_changes(joined.after());
        assert_eq!(done.len(), 1, "{done:?}");
        let after = MetadataDelta::apply(joined.after().clone(), done).unwrap();
        let p = after.after().partition("t", 0).unwrap();
        assert_eq!(
            (&p.replicas[..], p.leader, p.leader_epoch),
            (&[2, 3][..], 2, 5)
        );
        assert!(
            leadership_changes(after.after()).is_empty(),
            "stable once applied"
        );
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
}
