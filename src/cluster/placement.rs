//! Placement: which brokers hold the replicas of new partitions, and which leads.
//!
//! Owns: the brokers new replicas may go to ([`live_brokers`]), Kafka's rack-unaware
//! assignment ([`assign`], after `AdminUtils.assignReplicasToBrokersRackUnaware`: a
//! random start broker for the first replicas, round-robin over the brokers sorted by id,
//! and a replica shift that grows every full round so followers spread too), and the
//! checks of an assignment a client names (CreateTopics and CreatePartitions
//! `assignments`, [`check_assignment`]). Pure: the random start is a parameter
//! ([`random_start`] draws one), so tests fix it.
//!
//! Never does: decide leadership after creation (the first replica leads at epoch 0,
//! ISR = the leader alone until replication exists: followers hold no data yet).
//!
//! Errors ([`TopicError`]): INVALID_REPLICATION_FACTOR (38), INVALID_REPLICA_ASSIGNMENT
//! (39), with Kafka's (KRaft controller's) messages.

use std::collections::BTreeSet;

use kafka_protocol::ResponseError;

use super::image::{MetadataImage, PartitionState};
use super::topics::TopicError;

/// The brokers new replicas may go to, sorted by id: the registered unfenced ones, and
/// this node when it is not registered (a store without registrations, or a single node
/// whose registration has not committed yet: it serves, so it can hold replicas).
pub(crate) fn live_brokers(image: &MetadataImage) -> Vec<i32> {
    let mut out: Vec<i32> = image.live_brokers().map(|b| b.broker_id).collect();
    if image.broker(image.node_id()).is_none() {
        out.push(image.node_id());
        out.sort_unstable();
    }
    out
}

/// Where the round-robin starts: Kafka draws both the first replica's broker index and
/// the replica shift at random, so topics created one after the other do not all put
/// partition 0 on the same broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Start {
    /// Index (into the sorted brokers) of partition 0's first replica.
    pub(crate) index: usize,
    /// Initial shift between a partition's first replica and its second.
    pub(crate) shift: usize,
}

/// A random [`Start`] over `brokers` brokers (uuid v4's random bits: no extra crate).
pub(crate) fn random_start(brokers: usize) -> Start {
    let r = uuid::Uuid::new_v4().as_u128();
    let n = brokers.max(1) as u128;
    Start {
        index: (r % n) as usize,
        shift: ((r >> 64) % n) as usize,
    }
}

/// INVALID_REPLICATION_FACTOR unless `1 <= replication_factor <= brokers`.
pub(crate) fn check_replication_factor(
    replication_factor: i16,
    brokers: usize,
) -> Result<(), TopicError> {
    if replication_factor < 1 {
        return Err(TopicError::new(
            ResponseError::InvalidReplicationFactor,
            "Replication factor must be larger than 0, or -1 to use the default value.",
        ));
    }
    if replication_factor as usize > brokers {
        return Err(TopicError::new(
            ResponseError::InvalidReplicationFactor,
            format!(
                "Unable to replicate the partition {replication_factor} time(s): The target \
                 replication factor of {replication_factor} cannot be reached because only \
                 {brokers} broker(s) are registered."
            ),
        ));
    }
    Ok(())
}

/// The replicas of partitions `first..first + count` over `brokers` (sorted, distinct),
/// `replication_factor` each, the leader first: Kafka's rack-unaware assignment. With
/// `n` brokers, partition `p`'s first replica is broker `(p + start.index) % n`; the
/// others follow at `1 + (shift + j) % (n - 1)` places after it, where `shift` is
/// `start.shift` plus one per full round of `n` partitions.
///
/// Errors: INVALID_REPLICATION_FACTOR (38) unless `1 <= replication_factor <= n`.
pub(crate) fn assign(
    brokers: &[i32],
    first: i32,
    count: i32,
    replication_factor: i16,
    start: Start,
) -> Result<Vec<Vec<i32>>, TopicError> {
    check_replication_factor(replication_factor, brokers.len())?;
    let n = brokers.len();
    let rf = replication_factor as usize;
    let mut shift = start.shift;
    let mut out = Vec::with_capacity(count.max(0) as usize);
    for p in first.max(0)..first.max(0) + count.max(0) {
        let p = p as usize;
        if p > 0 && p.is_multiple_of(n) {
            shift += 1;
        }
        let leader = (p + start.index) % n;
        let mut replicas = Vec::with_capacity(rf);
        replicas.push(brokers[leader]);
        for j in 0..rf - 1 {
            let step = 1 + (shift + j) % (n - 1);
            replicas.push(brokers[(leader + step) % n]);
        }
        out.push(replicas);
    }
    Ok(out)
}

/// Checks an assignment a client names (partition `i` of the list is the `i`-th new
/// partition; CreateTopics callers check the numbering first): every replica list
/// non-empty, of `replicas` entries when given (CreatePartitions: the topic's), else all
/// of the first one's length; no broker twice in a list; every broker registered and not
/// fenced.
///
/// Errors: INVALID_REPLICA_ASSIGNMENT (39).
pub(crate) fn check_assignment(
    image: &MetadataImage,
    assignment: &[Vec<i32>],
    replicas: Option<usize>,
) -> Result<(), TopicError> {
    let bad = |m: String| Err(TopicError::new(ResponseError::InvalidReplicaAssignment, m));
    let live: BTreeSet<i32> = live_brokers(image).into_iter().collect();
    let expected = replicas.or_else(|| assignment.first().map(Vec::len));
    for list in assignment {
        if list.is_empty() {
            return bad("The manual partition assignment includes an empty replica list.".into());
        }
        if let Some(expected) = expected.filter(|e| *e != list.len()) {
            return bad(format!(
                "The manual partition assignment includes a partition with {} replica(s), but \
                 this is not consistent with previous partitions, which have {expected} replica(s).",
                list.len()
            ));
        }
        let mut seen = BTreeSet::new();
        for id in list {
            if !seen.insert(*id) {
                return bad(format!(
                    "The manual partition assignment includes the broker {id} more than once."
                ));
            }
            if !live.contains(id) {
                let why = if image.broker(*id).is_some() {
                    "but that broker is fenced"
                } else {
                    "but no such broker is registered"
                };
                return bad(format!(
                    "The manual partition assignment includes broker {id}, {why}."
                ));
            }
        }
    }
    Ok(())
}

/// The new partition whose replicas are `replicas`: led by the first at epoch 0, every
/// replica in the ISR (all are empty, so all are caught up, as Kafka creates them).
pub(crate) fn new_partition(replicas: Vec<i32>) -> PartitionState {
    let leader = replicas[0];
    PartitionState {
        isr: replicas.clone(),
        replicas,
        leader,
        leader_epoch: 0,
        partition_epoch: 0,
        adding_replicas: Vec::new(),
        removing_replicas: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{BrokerEndpoint, MetadataDelta, MetadataRecord};
    use std::collections::BTreeMap;
    use std::sync::Arc;

    fn leaders(a: &[Vec<i32>]) -> BTreeMap<i32, usize> {
        let mut out = BTreeMap::new();
        for r in a {
            *out.entry(r[0]).or_default() += 1;
        }
        out
    }

    #[test]
    fn three_brokers_six_partitions_rf3_every_broker_leads_two() {
        for index in 0..3 {
            for shift in 0..3 {
                let a = assign(&[1, 2, 3], 0, 6, 3, Start { index, shift }).unwrap();
                assert_eq!(a.len(), 6);
                assert_eq!(leaders(&a), BTreeMap::from([(1, 2), (2, 2), (3, 2)]));
                for r in &a {
                    let set: BTreeSet<i32> = r.iter().copied().collect();
                    assert_eq!(set, BTreeSet::from([1, 2, 3]), "{r:?}");
                }
            }
        }
    }

    #[test]
    fn kafka_round_robin_with_replica_shift() {
        // Kafka's AdminUtils doc example: 5 brokers, 10 partitions, rf 3, start 0, shift 0.
        let a = assign(&[0, 1, 2, 3, 4], 0, 10, 3, Start { index: 0, shift: 0 }).unwrap();
        let expected: Vec<Vec<i32>> = vec![
            vec![0, 1, 2],
            vec![1, 2, 3],
            vec![2, 3, 4],
            vec![3, 4, 0],
            vec![4, 0, 1],
            vec![0, 2, 3],
            vec![1, 3, 4],
            vec![2, 4, 0],
            vec![3, 0, 1],
            vec![4, 1, 2],
        ];
        assert_eq!(a, expected);
        // Growing from partition 10: the first replica continues the round-robin; the
        // shift grows once, at partition 10 (Kafka counts rounds within one call too).
        let more = assign(&[0, 1, 2, 3, 4], 10, 1, 3, Start { index: 0, shift: 0 }).unwrap();
        assert_eq!(more, vec![vec![0, 2, 3]]);
    }

    #[test]
    fn single_broker_gets_everything() {
        let a = assign(&[7], 0, 4, 1, random_start(1)).unwrap();
        assert_eq!(a, vec![vec![7]; 4]);
    }

    #[test]
    fn replicas_are_distinct_for_any_start() {
        let brokers = [1, 2, 3, 4];
        for _ in 0..50 {
            let start = random_start(brokers.len());
            assert!(start.index < 4 && start.shift < 4);
            for rf in 1..=4 {
                for r in assign(&brokers, 3, 9, rf, start).unwrap() {
                    let set: BTreeSet<i32> = r.iter().copied().collect();
                    assert_eq!(set.len(), rf as usize, "{r:?}");
                }
            }
        }
    }

    #[test]
    fn replication_factor_outside_one_to_brokers_is_38() {
        for rf in [0, -2, 4] {
            let e = assign(&[1, 2, 3], 0, 1, rf, Start { index: 0, shift: 0 }).unwrap_err();
            assert_eq!(e.error, ResponseError::InvalidReplicationFactor, "{rf}");
        }
        let e = check_replication_factor(4, 3).unwrap_err();
        assert!(e.message.contains("only 3 broker(s)"), "{}", e.message);
    }

    fn image_with(brokers: &[(i32, bool)]) -> MetadataImage {
        let mut image = Arc::new(MetadataImage::empty("c", 1));
        for (epoch, (id, fenced)) in brokers.iter().enumerate() {
            let mut records = vec![MetadataRecord::BrokerRegistered {
                broker_id: *id,
                broker_epoch: epoch as i64 + 1,
                incarnation_id: uuid::Uuid::new_v4(),
                endpoints: vec![BrokerEndpoint {
                    name: "PLAINTEXT".into(),
                    host: "h".into(),
                    port: 1,
                }],
                rack: None,
            }];
            if *fenced {
                records.push(MetadataRecord::BrokerFenced {
                    broker_id: *id,
                    broker_epoch: epoch as i64 + 1,
                });
            }
            image = MetadataDelta::apply(image, records)
                .unwrap()
                .after()
                .clone();
        }
        (*image).clone()
    }

    #[test]
    fn live_brokers_are_the_unfenced_and_this_node_when_unregistered() {
        assert_eq!(live_brokers(&MetadataImage::empty("c", 4)), vec![4]);
        let image = image_with(&[(1, false), (2, true), (3, false)]);
        assert_eq!(live_brokers(&image), vec![1, 3]);
    }

    #[test]
    fn assignment_checks_are_39() {
        let image = image_with(&[(1, false), (2, false), (3, false), (4, true)]);
        let ok = [vec![1, 2], vec![2, 3], vec![3, 1]];
        assert!(check_assignment(&image, &ok, None).is_ok());
        assert!(check_assignment(&image, &ok, Some(2)).is_ok());
        // (assignment, replicas required, what the message says)
        type Case<'a> = (&'a [Vec<i32>], Option<usize>, &'a str);
        let cases: [Case; 6] = [
            (&[vec![1, 9]], None, "no such broker"),
            (&[vec![4]], None, "fenced"),
            (&[vec![1, 1]], None, "more than once"),
            (&[vec![1, 2], vec![3]], None, "not consistent"),
            (&[vec![1, 2]], Some(3), "not consistent"),
            (&[vec![]], None, "empty"),
        ];
        for (a, replicas, what) in cases {
            let e = check_assignment(&image, a, replicas).unwrap_err();
            assert_eq!(e.error, ResponseError::InvalidReplicaAssignment, "{a:?}");
            assert!(e.message.contains(what), "{a:?}: {}", e.message);
        }
    }

    #[test]
    fn a_new_partition_is_led_by_its_first_replica_with_every_replica_in_the_isr() {
        let p = new_partition(vec![3, 1, 2]);
        assert_eq!((p.leader, p.leader_epoch, p.isr), (3, 0, vec![3, 1, 2]));
        assert_eq!(p.replicas, vec![3, 1, 2]);
    }
}
