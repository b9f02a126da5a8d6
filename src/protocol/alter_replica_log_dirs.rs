//! AlterReplicaLogDirs (key 34), v1–v2. Protocol guide "AlterReplicaLogDirs"; KIP-113
//! (the API), KIP-482 (v2: flexible). v0 has no codec in the crate (Kafka 4.0 dropped
//! it).
//!
//! Moves each named partition of this broker to the named log dir while it keeps serving
//! (`ReplicaManager::alter_replica_log_dir`): the answer comes at once; the copy runs in
//! the background and shows in DescribeLogDirs as a future replica (`is_future_key`) in
//! the destination until the swap. A partition already in the directory is answered NONE
//! and not touched.
//!
//! Errors, per partition: LOG_DIR_NOT_FOUND (57) for a path none of `log.dirs` is (compared
//! as absolute paths, as DescribeLogDirs reports them); UNKNOWN_TOPIC_OR_PARTITION (3) for
//! a partition not hosted here; KAFKA_STORAGE_ERROR (56) when the move cannot start (the
//! copy's directory cannot be created); REASSIGNMENT_IN_PROGRESS (60) for a partition
//! already moving to another directory (Kafka replaces that move; weir lets it finish).
//! There is no authorizer (CLUSTER_AUTHORIZATION_FAILED is never returned).

use std::collections::BTreeMap;

use kafka_protocol::messages::alter_replica_log_dirs_response::{
    AlterReplicaLogDirPartitionResult, AlterReplicaLogDirTopicResult,
};
use kafka_protocol::messages::{
    AlterReplicaLogDirsRequest, AlterReplicaLogDirsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::Context;

/// Handles an AlterReplicaLogDirs request.
pub(super) fn handle(
    ctx: &Context,
    request: AlterReplicaLogDirsRequest,
    _version: i16,
) -> AlterReplicaLogDirsResponse {
    let mut results: BTreeMap<String, Vec<AlterReplicaLogDirPartitionResult>> = BTreeMap::new();
    for dir in &request.dirs {
        for topic in &dir.topics {
            let name = topic.name.0.as_str();
            for &index in &topic.partitions {
                let error_code = match ctx.replicas.alter_replica_log_dir(
                    name,
                    index,
                    dir.path.as_str(),
                ) {
                    Ok(()) => 0,
                    Err(refusal) => {
                        tracing::info!(topic = name, partition = index, dir = %dir.path.as_str(), ?refusal, "AlterReplicaLogDirs refused");
                        refusal.kafka_error().code()
                    }
                };
                results.entry(name.to_string()).or_default().push(
                    AlterReplicaLogDirPartitionResult::default()
                        .with_partition_index(index)
                        .with_error_code(error_code),
                );
            }
        }
    }
    AlterReplicaLogDirsResponse::default()
        .with_throttle_time_ms(0)
        .with_results(
            results
                .into_iter()
                .map(|(name, partitions)| {
                    AlterReplicaLogDirTopicResult::default()
                        .with_topic_name(TopicName(StrBytes::from_string(name)))
                        .with_partitions(partitions)
                })
                .collect(),
        )
}
