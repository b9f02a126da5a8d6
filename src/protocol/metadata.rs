//! Metadata (key 3), v0–v13. Protocol guide "Metadata"; KIP-516 (topic ids, v10+),
//! KIP-430 (authorized operations, not computed: left at "not requested").
//!
//! Lists this broker (its advertised listener) as the only broker and controller, and the
//! requested topics: `null` (or an empty list at v0) means all. A missing topic is created
//! when `auto.create.topics.enable` is on and the request allows it (v4+ field; always at
//! v0–v3, as in Kafka). On a single node every partition's leader, replica and ISR is this
//! broker.
//!
//! Errors returned per topic: UNKNOWN_TOPIC_OR_PARTITION (3), INVALID_TOPIC_EXCEPTION (17),
//! UNKNOWN_TOPIC_ID (100) for an id lookup that finds nothing.

use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::cluster::{is_internal_topic, TopicMeta};

use super::Context;
use crate::topics;

fn topic_entry(ctx: &Context, t: &TopicMeta) -> MetadataResponseTopic {
    let me = BrokerId(ctx.metadata.node_id());
    let partitions = (0..t.partitions)
        .map(|i| {
            MetadataResponsePartition::default()
                .with_partition_index(i)
                .with_leader_id(me)
                .with_leader_epoch(0)
                .with_replica_nodes(vec![me])
                .with_isr_nodes(vec![me])
        })
        .collect();
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(t.name.clone()))))
        .with_topic_id(t.id)
        .with_is_internal(is_internal_topic(&t.name))
        .with_partitions(partitions)
}

fn error_entry(name: Option<String>, error: ResponseError) -> MetadataResponseTopic {
    MetadataResponseTopic::default()
        .with_name(name.map(|n| TopicName(StrBytes::from_string(n))))
        .with_error_code(error.code())
}

/// Handles a Metadata request.
pub fn handle(ctx: &Context, request: MetadataRequest, version: i16) -> MetadataResponse {
    let all = match &request.topics {
        None => true,
        Some(list) => list.is_empty() && version == 0,
    };
    let allow_auto_create = version < 4 || request.allow_auto_topic_creation;
    let topics = if all {
        ctx.metadata
            .topics()
            .iter()
            .map(|t| topic_entry(ctx, t))
            .collect()
    } else {
        let mut out = Vec::new();
        for req in request.topics.unwrap_or_default() {
            match req.name {
                Some(name) => {
                    let name = name.0.as_str().to_string();
                    match topics::get_or_auto_create(&ctx.topics, &name, allow_auto_create) {
                        Ok(t) => out.push(topic_entry(ctx, &t)),
                        Err(e) => out.push(error_entry(Some(name), e.error)),
                    }
                }
                None => match ctx.metadata.topic_by_id(req.topic_id) {
                    Some(t) => out.push(topic_entry(ctx, &t)),
                    None => out.push(
                        error_entry(None, ResponseError::UnknownTopicId)
                            .with_topic_id(req.topic_id),
                    ),
                },
            }
        }
        out
    };
    let me = MetadataResponseBroker::default()
        .with_node_id(BrokerId(ctx.metadata.node_id()))
        .with_host(StrBytes::from_string(ctx.advertised.host.clone()))
        .with_port(ctx.advertised.port);
    MetadataResponse::default()
        .with_brokers(vec![me])
        .with_cluster_id(Some(StrBytes::from_string(
            ctx.metadata.cluster_id().to_string(),
        )))
        .with_controller_id(BrokerId(ctx.metadata.node_id()))
        .with_topics(topics)
}
