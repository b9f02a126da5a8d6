//! ListPartitionReassignments (key 46), v0. Protocol guide "ListPartitionReassignments";
//! KIP-455.
//!
//! Lists the partitions whose reassignment is in progress, from this broker's metadata
//! image (every broker has the committed metadata; no NOT_CONTROLLER): all of them when
//! `topics` is null, else those among the partitions named. Each with its `replicas`
//! (the target's, then the ones being removed), `adding_replicas` and
//! `removing_replicas`. A topic or partition that does not exist, or is not being
//! reassigned, is left out (as Kafka does). No error is returned.

use kafka_protocol::messages::list_partition_reassignments_response::{
    OngoingPartitionReassignment, OngoingTopicReassignment,
};
use kafka_protocol::messages::{
    BrokerId, ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::Context;
use crate::cluster::{PartitionState, TopicMeta};

fn ongoing(index: i32, s: &PartitionState) -> OngoingPartitionReassignment {
    let ids = |v: &[i32]| v.iter().copied().map(BrokerId).collect();
    OngoingPartitionReassignment::default()
        .with_partition_index(index)
        .with_replicas(ids(&s.replicas))
        .with_adding_replicas(ids(&s.adding_replicas))
        .with_removing_replicas(ids(&s.removing_replicas))
}

fn topic(t: &TopicMeta, indexes: Option<&[i32]>) -> Option<OngoingTopicReassignment> {
    let partitions: Vec<OngoingPartitionReassignment> = match indexes {
        None => (0..t.partitions)
            .filter_map(|i| t.partition(i).map(|s| (i, s)))
            .filter(|(_, s)| s.is_reassigning())
            .map(|(i, s)| ongoing(i, s))
            .collect(),
        Some(indexes) => indexes
            .iter()
            .filter_map(|i| t.partition(*i).map(|s| (*i, s)))
            .filter(|(_, s)| s.is_reassigning())
            .map(|(i, s)| ongoing(i, s))
            .collect(),
    };
    (!partitions.is_empty()).then(|| {
        OngoingTopicReassignment::default()
            .with_name(TopicName(StrBytes::from_string(t.name.clone())))
            .with_partitions(partitions)
    })
}

/// Handles a ListPartitionReassignments request.
pub(super) fn handle(
    ctx: &Context,
    request: ListPartitionReassignmentsRequest,
    _version: i16,
) -> ListPartitionReassignmentsResponse {
    let image = ctx.metadata.image();
    let topics = match &request.topics {
        None => image.topics().filter_map(|t| topic(t, None)).collect(),
        Some(wanted) => {
            let mut seen = std::collections::HashSet::new();
            wanted
                .iter()
                .filter(|w| seen.insert(w.name.0.as_str().to_string()))
                .filter_map(|w| {
                    let t = image.topic(w.name.0.as_str())?;
                    topic(t, Some(&w.partition_indexes))
                })
                .collect()
        }
    };
    ListPartitionReassignmentsResponse::default().with_topics(topics)
}
