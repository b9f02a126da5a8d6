//! ElectLeaders (key 43), v0–v2. Protocol guide "ElectLeaders"; KIP-183 (preferred
//! leader election from the admin client), KIP-460 (`election_type`, v1+: 0 preferred,
//! 1 unclean; v0 is always preferred).
//!
//! Any broker answers (Kafka's admin client sends it to the controller; here the change
//! is a metadata record through the quorum, checked by partition epoch where it is
//! applied, so the broker asked makes it): `cluster::Metadata::elect_leaders`. Preferred
//! makes the first replica of the assignment leader when it is active and in the ISR;
//! unclean gives a partition with no active leader one from the ISR, else any active
//! replica (what only the old ISR held is then lost). Null `topic_partitions` means every
//! partition, and the answer leaves out those that needed nothing, as Kafka's does. The
//! answer comes once the change is committed and every live broker has it
//! (`timeout_ms` is not used: the quorum's commit timeout bounds the wait).
//!
//! Errors per partition: UNKNOWN_TOPIC_OR_PARTITION (3), PREFERRED_LEADER_NOT_AVAILABLE
//! (80), ELIGIBLE_LEADERS_NOT_AVAILABLE (83), ELECTION_NOT_NEEDED (84),
//! UNKNOWN_SERVER_ERROR (-1) when the change could not be committed. An `election_type`
//! other than 0 or 1: INVALID_REQUEST (42) for every partition named (and at the top
//! level from v1).

use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::{ElectLeadersRequest, ElectLeadersResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::Context;
use crate::cluster::{ElectionError, ElectionType};

/// One partition's answer.
fn partition_result(
    topic: &str,
    partition: i32,
    outcome: &Result<(), ElectionError>,
) -> PartitionResult {
    let out = PartitionResult::default().with_partition_id(partition);
    match outcome {
        Ok(()) => out,
        Err(e) => out
            .with_error_code(e.kafka_error().code())
            .with_error_message(Some(StrBytes::from_string(e.message(topic, partition)))),
    }
}

/// Partition results grouped by topic, topics in order of first appearance.
fn by_topic(
    results: impl IntoIterator<Item = (String, PartitionResult)>,
) -> Vec<ReplicaElectionResult> {
    let mut out: Vec<ReplicaElectionResult> = Vec::new();
    for (topic, result) in results {
        match out.iter_mut().find(|r| r.topic.0.as_str() == topic) {
            Some(r) => r.partition_result.push(result),
            None => out.push(
                ReplicaElectionResult::default()
                    .with_topic(TopicName(StrBytes::from_string(topic)))
                    .with_partition_result(vec![result]),
            ),
        }
    }
    out
}

/// The answer to an `election_type` other than 0 and 1 (Kafka refuses the request):
/// INVALID_REQUEST (42) for each partition named, and at the top level from v1.
fn invalid_type(
    code: i8,
    requested: Option<Vec<(String, i32)>>,
    version: i16,
) -> ElectLeadersResponse {
    let message = format!("Unknown election type {code}");
    let results = by_topic(requested.unwrap_or_default().into_iter().map(|(topic, p)| {
        let result = PartitionResult::default()
            .with_partition_id(p)
            .with_error_code(ResponseError::InvalidRequest.code())
            .with_error_message(Some(StrBytes::from_string(message.clone())));
        (topic, result)
    }));
    let response = ElectLeadersResponse::default().with_replica_election_results(results);
    if version >= 1 {
        response.with_error_code(ResponseError::InvalidRequest.code())
    } else {
        response
    }
}

/// Handles an ElectLeaders request.
pub(super) fn handle(
    ctx: &Context,
    request: ElectLeadersRequest,
    version: i16,
) -> ElectLeadersResponse {
    let requested: Option<Vec<(String, i32)>> = request.topic_partitions.map(|topics| {
        topics
            .into_iter()
            .flat_map(|t| {
                let name = t.topic.0.as_str().to_string();
                t.partitions.into_iter().map(move |p| (name.clone(), p))
            })
            .collect()
    });
    // v0 has no election type: the field decodes as 0, preferred.
    let Some(election_type) = ElectionType::from_code(request.election_type) else {
        return invalid_type(request.election_type, requested, version);
    };
    let outcomes = ctx
        .metadata
        .elect_leaders(election_type, requested.as_deref());
    for (topic, partition, outcome) in &outcomes {
        if outcome.is_ok() {
            tracing::info!(%topic, partition, election = election_type.name(), "leader elected (ElectLeaders)");
        }
    }
    let results = by_topic(outcomes.into_iter().map(|(topic, partition, outcome)| {
        let result = partition_result(&topic, partition, &outcome);
        (topic, result)
    }));
    ElectLeadersResponse::default().with_replica_election_results(results)
}
