//! DescribeQuorum (key 55), v0–v2. KIP-595 (the API), KIP-836 (v1: each replica's
//! `last_fetch_timestamp` and `last_caught_up_timestamp`), KIP-853 (v2: `nodes`, the
//! voters' controller listeners, and `replica_directory_id`).
//!
//! Describes the controller quorum's log, `__cluster_metadata` partition 0, as its
//! leader sees it: `leader_id`, `leader_epoch` (the Raft term), `high_watermark` (one
//! past the last entry committed and applied on the leader), each voter with its
//! `log_end_offset` (one past the last entry the leader knows it holds: openraft's
//! matched log id; the leader's own log end for itself), and as observers the Raft
//! learners (broker-only nodes) likewise. A Kafka broker forwards DescribeQuorum to the active controller; weir does
//! the same over the CONTROLLER listener when this node does not lead, so any broker
//! answers with the leader's view.
//!
//! Timestamps (v1+): the leader's own are the current time (as KRaft's `LeaderState`
//! reports them); a follower's are -1, "unknown": openraft 0.9 does not tell when a
//! follower last replicated. `replica_directory_id` is the zero UUID (no directory ids).
//!
//! Errors, per partition as Kafka's `KafkaRaftClient` answers: UNKNOWN_TOPIC_OR_PARTITION
//! (3) for each partition asked for when the request is not exactly one topic
//! `__cluster_metadata` with one partition 0; NOT_LEADER_OR_FOLLOWER (6) for
//! `__cluster_metadata`-0 when no leader is known or it cannot be reached in time.

use std::time::Duration;

use kafka_protocol::messages::describe_quorum_response::{
    Listener, Node, PartitionData, ReplicaState, TopicData,
};
use kafka_protocol::messages::{
    BrokerId, DescribeQuorumRequest, DescribeQuorumResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::Context;
use crate::cluster::{QuorumState, VoterState};

/// The metadata log's topic (KIP-500).
pub(crate) const METADATA_TOPIC: &str = "__cluster_metadata";

/// How long a broker waits for the active controller's answer.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);

/// The listener name `nodes` (v2) gives the voters' endpoints.
const CONTROLLER_LISTENER: &str = "CONTROLLER";

fn topic_name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

/// Whether the request asks for exactly `__cluster_metadata`-0 (Kafka's
/// `hasValidTopicPartition`).
fn asks_for_metadata_log(request: &DescribeQuorumRequest) -> bool {
    matches!(&request.topics[..], [t] if t.topic_name.0.as_str() == METADATA_TOPIC
        && matches!(&t.partitions[..], [p] if p.partition_index == 0))
}

/// Every partition asked for, each with `error`.
fn partition_errors(request: &DescribeQuorumRequest, error: ResponseError) -> Vec<TopicData> {
    request
        .topics
        .iter()
        .map(|t| {
            TopicData::default()
                .with_topic_name(t.topic_name.clone())
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            PartitionData::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(error.code())
                                .with_leader_id(BrokerId(-1))
                                .with_leader_epoch(-1)
                                .with_high_watermark(-1)
                        })
                        .collect(),
                )
        })
        .collect()
}

/// Milliseconds since the Unix epoch, now.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The answer for `__cluster_metadata`-0 from `state`.
fn describe(state: &QuorumState, version: i16) -> DescribeQuorumResponse {
    let now = now_ms();
    let replica = |v: &VoterState| {
        let at = if v.id == state.leader_id { now } else { -1 };
        ReplicaState::default()
            .with_replica_id(BrokerId(v.id))
            .with_log_end_offset(v.log_end_offset)
            .with_last_fetch_timestamp(at)
            .with_last_caught_up_timestamp(at)
    };
    let voters = state.voters.iter().map(replica).collect();
    let observers = state.observers.iter().map(replica).collect();
    let partition = PartitionData::default()
        .with_partition_index(0)
        .with_leader_id(BrokerId(state.leader_id))
        .with_leader_epoch(state.leader_epoch)
        .with_high_watermark(state.high_watermark)
        .with_current_voters(voters)
        .with_observers(observers);
    let mut response = DescribeQuorumResponse::default().with_topics(vec![TopicData::default()
        .with_topic_name(topic_name(METADATA_TOPIC))
        .with_partitions(vec![partition])]);
    if version >= 2 {
        response.nodes = state
            .voters
            .iter()
            .filter_map(|v| {
                let (host, port) = v.addr.rsplit_once(':')?;
                Some(Node::default().with_node_id(BrokerId(v.id)).with_listeners(
                    vec![Listener::default()
                            .with_name(StrBytes::from_static_str(CONTROLLER_LISTENER))
                            .with_host(StrBytes::from_string(host.to_string()))
                            .with_port(port.parse().ok()?)],
                ))
            })
            .collect();
    }
    response
}

/// Handles a DescribeQuorum request.
pub(super) async fn handle(
    ctx: &Context,
    request: DescribeQuorumRequest,
    version: i16,
) -> DescribeQuorumResponse {
    if !asks_for_metadata_log(&request) {
        return DescribeQuorumResponse::default().with_topics(partition_errors(
            &request,
            ResponseError::UnknownTopicOrPartition,
        ));
    }
    let described = match ctx.metadata.quorum() {
        Some(q) => q.describe(FORWARD_TIMEOUT).await,
        None => Err("no controller quorum (a local metadata store)".to_string()),
    };
    match described {
        Ok(state) => describe(&state, version),
        Err(why) => {
            tracing::debug!(error = %why, "DescribeQuorum: no answer from the active controller");
            let mut response = DescribeQuorumResponse::default().with_topics(partition_errors(
                &request,
                ResponseError::NotLeaderOrFollower,
            ));
            if version >= 2 {
                for p in response
                    .topics
                    .iter_mut()
                    .flat_map(|t| t.partitions.iter_mut())
                {
                    p.error_message = Some(StrBytes::from_string(why.clone()));
                }
            }
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_metadata_partition_is_described() {
        use kafka_protocol::messages::describe_quorum_request::{
            PartitionData as P, TopicData as T,
        };
        let ask = |topic: &str, parts: &[i32]| {
            DescribeQuorumRequest::default().with_topics(vec![T::default()
                .with_topic_name(topic_name(topic))
                .with_partitions(
                    parts
                        .iter()
                        .map(|&i| P::default().with_partition_index(i))
                        .collect(),
                )])
        };
        assert!(asks_for_metadata_log(&ask(METADATA_TOPIC, &[0])));
        assert!(!asks_for_metadata_log(&ask(METADATA_TOPIC, &[1])));
        assert!(!asks_for_metadata_log(&ask(METADATA_TOPIC, &[0, 0])));
        assert!(!asks_for_metadata_log(&ask("other", &[0])));
        assert!(!asks_for_metadata_log(&DescribeQuorumRequest::default()));
        let errors = partition_errors(
            &ask("other", &[0, 3]),
            ResponseError::UnknownTopicOrPartition,
        );
        assert_eq!(errors[0].partitions.len(), 2);
        assert_eq!(errors[0].partitions[1].partition_index, 3);
        assert_eq!(errors[0].partitions[1].error_code, 3);
    }

    #[test]
    fn the_leader_reports_now_and_followers_unknown_times() {
        let state = QuorumState {
            leader_id: 2,
            leader_epoch: 4,
            high_watermark: 17,
            voters: [(1, 17), (2, 17), (3, -1)]
                .into_iter()
                .map(|(id, log_end_offset)| VoterState {
                    id,
                    log_end_offset,
                    addr: format!("127.0.0.1:{}", 9000 + id),
                })
                .collect(),
            observers: Vec::new(),
        };
        let r = describe(&state, 2);
        let p = &r.topics[0].partitions[0];
        assert_eq!(
            (
                p.error_code,
                p.leader_id.0,
                p.leader_epoch,
                p.high_watermark
            ),
            (0, 2, 4, 17)
        );
        let times: Vec<(i32, i64, bool)> = p
            .current_voters
            .iter()
            .map(|v| (v.replica_id.0, v.log_end_offset, v.last_fetch_timestamp > 0))
            .collect();
        assert_eq!(times, [(1, 17, false), (2, 17, true), (3, -1, false)]);
        assert!(p.observers.is_empty());
        assert_eq!(r.nodes.len(), 3);
        assert_eq!(r.nodes[2].listeners[0].port, 9003);
        assert!(describe(&state, 1).nodes.is_empty());
    }
}
