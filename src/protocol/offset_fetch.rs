//! OffsetFetch (key 9), v0–v9. Protocol guide "OffsetFetch"; KIP-88 (v2: all topics with a
//! null list), KIP-320 (v5: leader epoch), KIP-709 (v8: several groups per request).
//! v0 has v1's layout and is read and written with v1's codec (`legacy`; Kafka 4.0 removed
//! it, KIP-896, 3.x serves it).
//!
//! A partition without a committed offset answers offset -1 and metadata "", as Kafka.
//! `require_stable` (v7+, KIP-447): a partition with offsets committed in a transaction
//! that has no marker yet answers UNSTABLE_OFFSET_COMMIT (88); the client retries.
//! NOT_COORDINATOR (16) first on a broker that does not coordinate the group
//! (`find_coordinator.rs`), COORDINATOR_NOT_AVAILABLE (15) when its coordinator is fenced.

use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{OffsetFetchRequest, OffsetFetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::Context;
use crate::group::{CommittedOffset, FetchedOffsets};

fn fetch(ctx: &Context, group: &str, topics: Option<Vec<(String, Vec<i32>)>>) -> FetchedOffsets {
    ctx.groups.fetch_offsets(group, topics.as_deref())
}

/// UNSTABLE_OFFSET_COMMIT's code when `require_stable` and `group` has a pending
/// transactional offset of `topic`-`partition`, else 0.
fn unstable(ctx: &Context, require_stable: bool, group: &str, topic: &str, partition: i32) -> i16 {
    if require_stable && ctx.groups.has_pending_txn_offset(group, topic, partition) {
        kafka_protocol::ResponseError::UnstableOffsetCommit.code()
    } else {
        0
    }
}

fn parts(c: Option<CommittedOffset>) -> (i64, i32, StrBytes) {
    match c {
        Some(c) => (c.offset, c.leader_epoch, StrBytes::from_string(c.metadata)),
        None => (-1, -1, StrBytes::default()),
    }
}

/// Handles an OffsetFetch request.
pub(super) fn handle(
    ctx: &Context,
    request: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    if version >= 8 {
        let groups = request
            .groups
            .into_iter()
            .map(|g| {
                if let Err(e) =
                    super::find_coordinator::check_coordinator(ctx, g.group_id.0.as_str())
                {
                    return OffsetFetchResponseGroup::default()
                        .with_group_id(g.group_id)
                        .with_error_code(e.code());
                }
                // v9 (KIP-848): a consumer-protocol member reads at its current epoch.
                if let Err(e) = ctx.groups.validate_offset_fetch(
                    g.group_id.0.as_str(),
                    g.member_id.as_ref().map_or("", |m| m.as_str()),
                    g.member_epoch,
                ) {
                    return OffsetFetchResponseGroup::default()
                        .with_group_id(g.group_id)
                        .with_error_code(e.code());
                }
                let topics = g.topics.map(|ts| {
                    ts.into_iter()
                        .map(|t| (t.name.0.to_string(), t.partition_indexes))
                        .collect()
                });
                let group = g.group_id.0.as_str();
                let fetched = fetch(ctx, group, topics);
                let topics = fetched
                    .into_iter()
                    .map(|(t, ps)| {
                        let partitions = ps
                            .into_iter()
                            .map(|(p, c)| {
                                let error = unstable(ctx, request.require_stable, group, &t, p);
                                let (offset, epoch, metadata) = parts(c);
                                OffsetFetchResponsePartitions::default()
                                    .with_partition_index(p)
                                    .with_committed_offset(offset)
                                    .with_committed_leader_epoch(epoch)
                                    .with_metadata(Some(metadata))
                                    .with_error_code(error)
                            })
                            .collect();
                        OffsetFetchResponseTopics::default()
                            .with_name(TopicName(StrBytes::from_string(t)))
                            .with_partitions(partitions)
                    })
                    .collect();
                OffsetFetchResponseGroup::default()
                    .with_group_id(g.group_id)
                    .with_topics(topics)
            })
            .collect();
        return OffsetFetchResponse::default().with_groups(groups);
    }
    if let Err(e) = super::find_coordinator::check_coordinator(ctx, request.group_id.0.as_str()) {
        if version >= 2 {
            return OffsetFetchResponse::default().with_error_code(e.code());
        }
        // v0–v1 have errors per partition only.
        let topics = request
            .topics
            .unwrap_or_default()
            .into_iter()
            .map(|t| {
                OffsetFetchResponseTopic::default()
                    .with_name(t.name)
                    .with_partitions(
                        t.partition_indexes
                            .into_iter()
                            .map(|p| {
                                OffsetFetchResponsePartition::default()
                                    .with_partition_index(p)
                                    .with_committed_offset(-1)
                                    .with_metadata(Some(StrBytes::default()))
                                    .with_error_code(e.code())
                            })
                            .collect(),
                    )
            })
            .collect();
        return OffsetFetchResponse::default().with_topics(topics);
    }
    let topics = request.topics.map(|ts| {
        ts.into_iter()
            .map(|t| (t.name.0.to_string(), t.partition_indexes))
            .collect()
    });
    let group = request.group_id.0.as_str();
    let require_stable = version >= 7 && request.require_stable;
    let fetched = fetch(ctx, group, topics);
    let topics = fetched
        .into_iter()
        .map(|(t, ps)| {
            let partitions = ps
                .into_iter()
                .map(|(p, c)| {
                    let error = unstable(ctx, require_stable, group, &t, p);
                    let (offset, epoch, metadata) = parts(c);
                    let out = OffsetFetchResponsePartition::default()
                        .with_partition_index(p)
                        .with_committed_offset(offset)
                        .with_metadata(Some(metadata))
                        .with_error_code(error);
                    if version >= 5 {
                        out.with_committed_leader_epoch(epoch)
                    } else {
                        out
                    }
                })
                .collect();
            OffsetFetchResponseTopic::default()
                .with_name(TopicName(StrBytes::from_string(t)))
                .with_partitions(partitions)
        })
        .collect();
    OffsetFetchResponse::default().with_topics(topics)
}
