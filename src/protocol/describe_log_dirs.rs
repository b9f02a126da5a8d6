//! DescribeLogDirs (key 35), v1–v4. Protocol guide "DescribeLogDirs"; KIP-113 (the API),
//! KIP-482 (v2: flexible), KIP-827 (v4: `total_bytes`, `usable_bytes`).
//!
//! Answers for each of this broker's log directories (`log.dirs`, in order), reported by
//! its absolute path, with the partitions hosted in it (leader or follower):
//! `partition_size`, the bytes of its segment files; `offset_lag`, Kafka's
//! `max(high watermark − log end offset, 0)` with, on a follower, the high watermark its
//! leader last sent rather than its own capped one (so a follower behind the committed
//! records shows by how much; a leader always shows 0). A partition being moved into a
//! directory (AlterReplicaLogDirs) is listed there too with `is_future_key` true, its
//! size the bytes copied so far and its lag 0 (not computed). `topics` null asks for
//! every partition; otherwise only the named partitions hosted here are listed, and a
//! topic with none of them in a directory is left out of it (Kafka's
//! `ReplicaManager.describeLogDirs`). v4 adds the total and usable bytes of the file
//! system holding each directory (-1 when they cannot be read).
//!
//! Errors: per directory, KAFKA_STORAGE_ERROR (56) with no topics when the directory
//! cannot be read or is offline after an I/O error (KIP-112). The response's own `error_code` (v3+) is always 0: there is no
//! authorizer (CLUSTER_AUTHORIZATION_FAILED is never returned).

use std::collections::BTreeMap;

use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::{DescribeLogDirsRequest, DescribeLogDirsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::Context;

/// Handles a DescribeLogDirs request.
pub(super) fn handle(
    ctx: &Context,
    request: DescribeLogDirsRequest,
    version: i16,
) -> DescribeLogDirsResponse {
    let wanted: Option<std::collections::HashSet<(String, i32)>> =
        request.topics.as_ref().map(|topics| {
            topics
                .iter()
                .flat_map(|t| {
                    t.partitions
                        .iter()
                        .map(move |p| (t.topic.0.as_str().to_string(), *p))
                })
                .collect()
        });
    let results = ctx
        .replicas
        .describe_log_dirs()
        .into_iter()
        .map(|dir| describe_one(dir, wanted.as_ref(), version))
        .collect();
    DescribeLogDirsResponse::default()
        .with_throttle_time_ms(0)
        .with_error_code(0)
        .with_results(results)
}

/// The result of one log dir: its partitions (those `wanted`, or all), sizes and lags.
fn describe_one(
    dir: crate::replica::LogDirDescription,
    wanted: Option<&std::collections::HashSet<(String, i32)>>,
    version: i16,
) -> DescribeLogDirsResult {
    let mut result = DescribeLogDirsResult::default()
        .with_log_dir(StrBytes::from_string(dir.path.display().to_string()))
        .with_total_bytes(if version >= 4 { dir.total_bytes } else { -1 })
        .with_usable_bytes(if version >= 4 { dir.usable_bytes } else { -1 });
    if let Some(e) = &dir.error {
        tracing::warn!(dir = %dir.path.display(), error = %e, "DescribeLogDirs: the log directory cannot be read");
        return result.with_error_code(ResponseError::KafkaStorageError.code());
    }
    let mut topics: BTreeMap<&str, Vec<DescribeLogDirsPartition>> = BTreeMap::new();
    for p in &dir.partitions {
        if wanted.is_some_and(|w| !w.contains(&(p.topic.clone(), p.partition))) {
            continue;
        }
        topics.entry(p.topic.as_str()).or_default().push(
            DescribeLogDirsPartition::default()
                .with_partition_index(p.partition)
                .with_partition_size(i64::try_from(p.size_bytes).unwrap_or(i64::MAX))
                .with_offset_lag(p.offset_lag)
                .with_is_future_key(p.is_future),
        );
    }
    result = result.with_topics(
        topics
            .into_iter()
            .map(|(name, mut partitions)| {
                partitions.sort_by_key(|p| (p.partition_index, p.is_future_key));
                DescribeLogDirsTopic::default()
                    .with_name(TopicName(StrBytes::from_string(name.to_string())))
                    .with_partitions(partitions)
            })
            .collect(),
    );
    result
}
