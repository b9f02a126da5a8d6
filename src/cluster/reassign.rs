//! Partition reassignment (KIP-455; Kafka's `PartitionReassignmentReplicas`,
//! `PartitionReassignmentRevert` and `ReplicationControlManager`'s reassignment paths).
//!
//! Owns: what a reassignment does to one partition's state, as plain functions (sans-IO:
//! no clock, no I/O; which brokers are active is a parameter), and
//! [`Metadata::alter_partition_reassignments`], which validates a request and commits
//! the `PartitionChanged` records through the quorum like every other admin write.
//!
//! The steps, as Kafka takes them:
//! 1. [`start`]: `replicas` becomes the target followed by the original replicas not in
//!    it (`removing_replicas`); the target's new brokers are `adding_replicas`; ISR and
//!    leader stay. The adding brokers open the partition as followers and fetch from the
//!    leader (`replica.rs`), which tracks them and lets them join the ISR once caught up
//!    (the ordinary join rule).
//! 2. [`complete`], run by the controller with every election pass
//!    (`election::leadership_changes`) and with every ISR change (`election::isr_change`):
//!    once every adding replica is in the ISR, `replicas` becomes the target, the ISR its
//!    intersection with the target, adding and removing are cleared; a leader outside the
//!    target hands over to the first target replica in the ISR that is active (leader
//!    epoch + 1). The removed brokers close the partition and delete its directory.
//! 3. [`cancel`] (a null replica list): back to the original replicas (the removing ones
//!    stay, the adding ones leave `replicas` and the ISR).
//!
//! A target equal to the current replicas changes nothing; one with the same brokers in
//! another order reorders them at once; a new target while one is in progress replaces
//! it (computed from the original replicas, as Kafka does).
//!
//! Errors ([`TopicError`], Kafka codes): INVALID_REPLICA_ASSIGNMENT (39) for an empty
//! list, a broker twice, or a broker not registered or fenced, and for a cancellation
//! that would leave no in-sync replica; UNKNOWN_TOPIC_OR_PARTITION (3);
//! NO_REASSIGNMENT_IN_PROGRESS (85) for cancelling nothing; INVALID_REPLICATION_FACTOR
//! (38) for a change of replication factor when `allow_replication_factor_change` is
//! false (v1); UNKNOWN_SERVER_ERROR (-1) when the change cannot be committed.

use std::collections::HashMap;

use kafka_protocol::ResponseError;

use super::image::{MetadataImage, MetadataRecord, PartitionState};
use super::placement::{check_assignment, live_brokers};
use super::topics::TopicError;
use super::{Metadata, MetadataError, UpdateError};

/// How often a request whose records were refused by a race (another change of the same
/// partition committed first) is planned again on the newer image.
const ATTEMPTS: u32 = 3;

/// One partition of an AlterPartitionReassignments request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reassignment {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
    /// The target replicas, the preferred leader first; `None` cancels the reassignment in
    /// progress.
    pub replicas: Option<Vec<i32>>,
}

/// `state` as it was before its reassignment in progress (Kafka's
/// `PartitionReassignmentRevert`): the adding replicas leave `replicas` and the ISR; a
/// leader among them hands over to the first remaining replica in the ISR that is
/// active. Epochs are `state`'s (the caller makes the change one step).
///
/// Errors: INVALID_REPLICA_ASSIGNMENT (39) when no ISR member would remain (only an
/// unclean election could lead it; weir has none).
fn revert(state: &PartitionState, active: &impl Fn(i32) -> bool) -> Result<PartitionState, String> {
    let kept = |r: &i32| !state.adding_replicas.contains(r);
    let replicas: Vec<i32> = state.replicas.iter().copied().filter(kept).collect();
    let isr: Vec<i32> = state.isr.iter().copied().filter(kept).collect();
    if isr.is_empty() {
        return Err("because it would require an unclean leader election".into());
    }
    let leader = if isr.contains(&state.leader) {
        state.leader
    } else {
        replicas
            .iter()
            .copied()
            .find(|r| isr.contains(r) && active(*r))
            .unwrap_or(-1)
    };
    Ok(PartitionState {
        replicas,
        isr,
        leader,
        adding_replicas: Vec::new(),
        removing_replicas: Vec::new(),
        ..state.clone()
    })
}

/// The completed form of `state`'s reassignment, epochs not moved, or `None` while it
/// cannot complete: none in progress, an adding replica not in the ISR yet, no in-sync
/// target replica, or a leader that must move and no active in-sync target replica to
/// take over.
fn completed(state: &PartitionState, active: &impl Fn(i32) -> bool) -> Option<PartitionState> {
    if !state.is_reassigning() {
        return None;
    }
    let target = state.target_replicas();
    let isr: Vec<i32> = state
        .isr
        .iter()
        .copied()
        .filter(|r| target.contains(r))
        .collect();
    if isr.is_empty() || !state.adding_replicas.iter().all(|r| isr.contains(r)) {
        return None;
    }
    let leader = if isr.contains(&state.leader) {
        state.leader
    } else {
        target
            .iter()
            .copied()
            .find(|r| isr.contains(r) && active(*r))?
    };
    Some(PartitionState {
        replicas: target,
        isr,
        leader,
        adding_replicas: Vec::new(),
        removing_replicas: Vec::new(),
        ..state.clone()
    })
}

/// The state completing `state`'s reassignment makes (one change: partition epoch + 1,
/// leader epoch + 1 when the leader moves), or `None` while it cannot complete (see the
/// module doc). `active` says which brokers may lead.
pub(crate) fn complete(
    state: &PartitionState,
    active: &impl Fn(i32) -> bool,
) -> Option<PartitionState> {
    completed(state, active).map(|next| state.succeeded_by(next))
}

/// The state a reassignment of `state` to `target` (checked by the caller: non-empty,
/// distinct, registered brokers) makes, or `None` when it changes nothing (the target is
/// the current assignment and none is in progress). A reassignment in progress is
/// replaced: the new one starts from the original replicas. One that needs no new
/// replica (removing only) completes at once.
///
/// Errors: as [`revert`], when one in progress cannot be reverted.
pub(crate) fn start(
    state: &PartitionState,
    target: &[i32],
    active: &impl Fn(i32) -> bool,
) -> Result<Option<PartitionState>, String> {
    let original = if state.is_reassigning() {
        revert(state, active)?
    } else {
        state.clone()
    };
    let adding: Vec<i32> = target
        .iter()
        .copied()
        .filter(|r| !original.replicas.contains(r))
        .collect();
    let removing: Vec<i32> = original
        .replicas
        .iter()
        .copied()
        .filter(|r| !target.contains(r))
        .collect();
    let mut replicas = target.to_vec();
    replicas.extend(&removing);
    let mut next = PartitionState {
        replicas,
        adding_replicas: adding,
        removing_replicas: removing,
        ..original
    };
    if let Some(done) = completed(&next, active) {
        next = done;
    }
    Ok((next != *state).then(|| state.succeeded_by(next)))
}

/// The state cancelling `state`'s reassignment makes: the original replicas back.
///
/// Errors: NO_REASSIGNMENT_IN_PROGRESS (85) when none is; INVALID_REPLICA_ASSIGNMENT
/// (39) when reverting would leave no in-sync replica.
pub(crate) fn cancel(
    state: &PartitionState,
    active: &impl Fn(i32) -> bool,
) -> Result<PartitionState, (ResponseError, String)> {
    if !state.is_reassigning() {
        return Err((ResponseError::NoReassignmentInProgress, String::new()));
    }
    let original =
        revert(state, active).map_err(|e| (ResponseError::InvalidReplicaAssignment, e))?;
    Ok(state.succeeded_by(original))
}

/// The record one partition of a request makes on `image` (with the changes planned
/// earlier in the same request in `planned`), or `None` when it changes nothing.
fn plan_one(
    image: &MetadataImage,
    planned: &mut HashMap<(String, i32), PartitionState>,
    wanted: &Reassignment,
    allow_replication_factor_change: bool,
) -> Result<Option<MetadataRecord>, TopicError> {
    let (name, index) = (wanted.topic.as_str(), wanted.partition);
    let unknown = || {
        TopicError::new(
            ResponseError::UnknownTopicOrPartition,
            format!("Unable to find partition {name}:{index}."),
        )
    };
    let meta = image.topic(name).ok_or_else(unknown)?;
    let key = (name.to_string(), index);
    let current = planned
        .get(&key)
        .or_else(|| meta.partition(index))
        .ok_or_else(unknown)?
        .clone();
    let live = live_brokers(image);
    let active = |id: i32| live.contains(&id);
    let unclean = |why: String| {
        TopicError::new(
            ResponseError::InvalidReplicaAssignment,
            format!("Unable to revert partition assignment for {name}:{index} {why}."),
        )
    };
    let next = match &wanted.replicas {
        None => Some(
            cancel(&current, &active).map_err(|(error, why)| match error {
                ResponseError::NoReassignmentInProgress => TopicError::new(
                    error,
                    format!("No ongoing reassignment for partition {name}:{index}."),
                ),
                _ => unclean(why),
            })?,
        ),
        Some(target) => {
            check_assignment(image, std::slice::from_ref(target), None)?;
            let original = current.replicas.len() - current.adding_replicas.len();
            if !allow_replication_factor_change && target.len() != original {
                return Err(TopicError::new(
                    ResponseError::InvalidReplicationFactor,
                    format!(
                        "The replication factor is changed from {original} to {} but \
                         allowReplicationFactorChange is false.",
                        target.len()
                    ),
                ));
            }
            start(&current, target, &active).map_err(unclean)?
        }
    };
    let Some(next) = next else {
        return Ok(None);
    };
    let record = MetadataRecord::PartitionChanged {
        topic_id: meta.id,
        partition: index,
        expected_partition_epoch: current.partition_epoch,
        state: next.clone(),
    };
    planned.insert(key, next);
    Ok(Some(record))
}

impl Metadata {
    /// AlterPartitionReassignments (KIP-455): starts, replaces or cancels (`replicas:
    /// None`) the reassignment of each partition of `wanted`, in one metadata change
    /// through the quorum (any broker proposes it; no NOT_CONTROLLER). Returns one result
    /// per entry of `wanted`, in order. `allow_replication_factor_change` false (v1)
    /// refuses a target of another size than the original replicas.
    ///
    /// Errors per partition: see the module doc (39, 3, 85, 38, -1).
    pub fn alter_partition_reassignments(
        &self,
        wanted: &[Reassignment],
        allow_replication_factor_change: bool,
    ) -> Vec<Result<(), TopicError>> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let mut results = Vec::with_capacity(wanted.len());
            let mut changed = Vec::new();
            let outcome = self.update(|image| {
                let mut planned = HashMap::new();
                let mut records = Vec::new();
                for w in wanted {
                    match plan_one(image, &mut planned, w, allow_replication_factor_change) {
                        Ok(record) => {
                            if let Some(MetadataRecord::PartitionChanged { state, .. }) = &record {
                                changed.push((w.topic.clone(), w.partition, state.clone()));
                            }
                            records.extend(record);
                            results.push(Ok(()));
                        }
                        Err(e) => results.push(Err(e)),
                    }
                }
                Ok::<_, std::convert::Infallible>(records)
            });
            let failure = match outcome {
                Ok(_) | Err(UpdateError::Incomplete(_)) => None,
                Err(UpdateError::Refused(never)) => match never {},
                Err(UpdateError::NotApplied(MetadataError::Invalid(_))) if attempts < ATTEMPTS => {
                    continue
                }
                Err(UpdateError::NotApplied(e)) => Some(e),
            };
            if let Some(e) = failure {
                tracing::error!(error = %e, "partition reassignment not committed");
                return results
                    .into_iter()
                    .map(|r| {
                        r.and(Err(TopicError::new(
                            ResponseError::UnknownServerError,
                            e.to_string(),
                        )))
                    })
                    .collect();
            }
            for (topic, partition, s) in changed {
                tracing::info!(
                    %topic,
                    partition,
                    replicas = ?s.replicas,
                    adding = ?s.adding_replicas,
                    removing = ?s.removing_replicas,
                    leader = s.leader,
                    isr = ?s.isr,
                    "partition reassignment changed"
                );
            }
            return results;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(replicas: &[i32], isr: &[i32], leader: i32) -> PartitionState {
        PartitionState {
            replicas: replicas.to_vec(),
            isr: isr.to_vec(),
            leader,
            leader_epoch: 3,
            partition_epoch: 7,
            adding_replicas: Vec::new(),
            removing_replicas: Vec::new(),
        }
    }

    fn all(_: i32) -> bool {
        true
    }

    #[test]
    fn a_move_adds_then_completes_once_the_new_replica_is_in_sync() {
        let s = state(&[1, 2], &[1, 2], 1);
        let moving = start(&s, &[2, 3], &all).unwrap().unwrap();
        assert_eq!(moving.replicas, [2, 3, 1]);
        assert_eq!(
            (
                moving.adding_replicas.as_slice(),
                moving.removing_replicas.as_slice()
            ),
            (&[3][..], &[1][..])
        );
        assert_eq!((moving.leader, &moving.isr[..]), (1, &[1, 2][..]));
        assert_eq!((moving.leader_epoch, moving.partition_epoch), (3, 8));
        // Not in sync yet: nothing to complete.
        assert_eq!(complete(&moving, &all), None);
        // 3 joins the ISR: done; leader 1 is not in the target, 2 takes over.
        let joined = moving.changed(1, vec![1, 2, 3]);
        let done = complete(&joined, &all).unwrap();
        assert_eq!(done.replicas, [2, 3]);
        assert_eq!((done.leader, &done.isr[..]), (2, &[2, 3][..]));
        assert!(!done.is_reassigning());
        assert_eq!((done.leader_epoch, done.partition_epoch), (4, 10));
        // Only an active target replica may take over.
        let done = complete(&joined, &|b| b != 2).unwrap();
        assert_eq!(done.leader, 3);
        assert_eq!(complete(&joined, &|b| b == 1), None);
    }

    #[test]
    fn a_leader_in_the_target_keeps_its_epoch() {
        let s = state(&[2, 3], &[2, 3], 2);
        let adding = start(&s, &[2, 3, 1], &all).unwrap().unwrap();
        assert_eq!(
            (
                adding.replicas.as_slice(),
                adding.adding_replicas.as_slice()
            ),
            (&[2, 3, 1][..], &[1][..])
        );
        assert!(adding.removing_replicas.is_empty());
        let joined = adding.changed(2, vec![2, 3, 1]);
        let done = complete(&joined, &all).unwrap();
        assert_eq!(
            (done.replicas.as_slice(), done.leader, done.leader_epoch),
            (&[2, 3, 1][..], 2, 3)
        );
    }

    #[test]
    fn same_replicas_change_nothing_a_new_order_applies_at_once() {
        let s = state(&[1, 2], &[1, 2], 1);
        assert_eq!(start(&s, &[1, 2], &all).unwrap(), None);
        let reordered = start(&s, &[2, 1], &all).unwrap().unwrap();
        assert_eq!(
            (reordered.replicas.as_slice(), reordered.leader),
            (&[2, 1][..], 1)
        );
        assert!(!reordered.is_reassigning());
        // Removing only: completes at once, the ISR shrinks with the replicas.
        let s = state(&[1, 2, 3], &[1, 2, 3], 3);
        let shrunk = start(&s, &[1, 2], &all).unwrap().unwrap();
        assert_eq!(
            (shrunk.replicas.as_slice(), &shrunk.isr[..], shrunk.leader),
            (&[1, 2][..], &[1, 2][..], 1)
        );
        assert_eq!(shrunk.leader_epoch, 4);
    }

    #[test]
    fn cancelling_reverts_to_the_original_replicas() {
        let s = state(&[1, 2], &[1, 2], 1);
        assert_eq!(
            cancel(&s, &all).unwrap_err().0,
            ResponseError::NoReassignmentInProgress
        );
        let moving = start(&s, &[2, 3], &all).unwrap().unwrap();
        // 2 fell out of the ISR, 3 joined: cancelled, 3 leaves, 1 alone is in sync.
        let joined = moving.changed(1, vec![1, 3]);
        let back = cancel(&joined, &all).unwrap();
        assert_eq!(
            (back.replicas.as_slice(), &back.isr[..], back.leader),
            (&[2, 1][..], &[1][..], 1)
        );
        assert!(!back.is_reassigning());
        assert_eq!(back.partition_epoch, joined.partition_epoch + 1);
        // An adding replica that leads hands over.
        let led_by_new = moving.changed(3, vec![3, 2]);
        let back = cancel(&led_by_new, &all).unwrap();
        assert_eq!((back.leader, &back.isr[..]), (2, &[2][..]));
        // Only adding replicas in sync: no revert without an unclean election.
        let only_new = moving.changed(3, vec![3]);
        assert_eq!(
            cancel(&only_new, &all).unwrap_err().0,
            ResponseError::InvalidReplicaAssignment
        );
    }

    #[test]
    fn a_second_target_replaces_the_first() {
        let s = state(&[1, 2], &[1, 2], 1);
        let moving = start(&s, &[2, 3], &all).unwrap().unwrap();
        let joined = moving.changed(1, vec![1, 2, 3]);
        // Now to {1, 4}: from the original {1, 2}; 3 leaves, 4 is added.
        let again = start(&joined, &[1, 4], &all).unwrap().unwrap();
        assert_eq!(again.replicas, [1, 4, 2]);
        assert_eq!(
            (
                again.adding_replicas.as_slice(),
                again.removing_replicas.as_slice()
            ),
            (&[4][..], &[2][..])
        );
        assert_eq!((again.leader, &again.isr[..]), (1, &[1, 2][..]));
        // Back to the original: the reassignment ends.
        let back = start(&joined, &[1, 2], &all).unwrap().unwrap();
        assert_eq!(
            (back.replicas.as_slice(), &back.isr[..]),
            (&[1, 2][..], &[1, 2][..])
        );
        assert!(!back.is_reassigning());
        // Replacing drops the first target's new replicas from the ISR (Kafka's revert):
        // 3 stays a replica, keeps its copy and joins again once caught up.
        let again = start(&joined, &[3, 1], &all).unwrap().unwrap();
        assert_eq!(
            (again.replicas.as_slice(), &again.isr[..]),
            (&[3, 1, 2][..], &[1, 2][..])
        );
        assert_eq!(again.adding_replicas, [3]);
    }
}
