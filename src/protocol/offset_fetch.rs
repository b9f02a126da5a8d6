//! OffsetFetch (key 9), v0–v9. Protocol guide "OffsetFetch"; KIP-88 (v2: all topics with a
//! null list), KIP-320 (v5: leader epoch), KIP-709 (v8: several groups per request).
//! v0 has v1's layout and is read and written with v1's codec (`legacy`; Kafka 4.0 removed
//! it, KIP-896, 3.x serves it).
//!
//! A partition without a committed offset answers offset -1 and metadata "", as Kafka.
//! `require_stable` (KIP-447) has nothing to wait for: there are no transactions.
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
                let topics = g.topics.map(|ts| {
                    ts.into_iter()
                        .map(|t| (t.name.0.to_string(), t.partition_indexes))
                        .collect()
                });
                let fetched = fetch(ctx, g.group_id.0.as_str(), topics);
                let topics = fetched
                    .into_iter()
                    .map(|(t, ps)| {
                        OffsetFetchResponseTopics::default()
                            .with_name(TopicName(StrBytes::from_string(t)))
                            .with_partitions(
                                ps.into_iter()
                                    .map(|(p, c)| {
                                        let (offset, epoch, metadata) = parts(c);
                                        OffsetFetchResponsePartitions::default()
                                            .with_partition_index(p)
                                            .with_committed_offset(offset)
                                            .with_committed_leader_epoch(epoch)
                                            .with_metadata(Some(metadata))
                                    })
                                    .collect(),
                            )
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
    let fetched = fetch(ctx, request.group_id.0.as_str(), topics);
    let topics = fetched
        .into_iter()
        .map(|(t, ps)| {
            OffsetFetchResponseTopic::default()
                .with_name(TopicName(StrBytes::from_string(t)))
                .with_partitions(
                    ps.into_iter()
                        .map(|(p, c)| {
                            let (offset, epoch, metadata) = parts(c);
                            let out = OffsetFetchResponsePartition::default()
                                .with_partition_index(p)
                                .with_committed_offset(offset)
                                .with_metadata(Some(metadata));
                            if version >= 5 {
                                out.with_committed_leader_epoch(epoch)
                            } else {
                                out
                            }
                        })
                        .collect(),
                )
        })
        .collect();
    OffsetFetchResponse::default().with_topics(topics)
}
