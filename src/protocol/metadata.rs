//! Metadata (key 3), v0–v13. Protocol guide "Metadata"; KIP-516 (topic ids, v10+),
//! KIP-430 (authorized operations, not computed: left at "not requested").
//!
//! Lists this broker (its advertised listener) as the only broker and controller, and the
//! requested topics: `null` (or an empty list at v0) means all. A missing topic is created
//! when `auto.create.topics.enable` is on and the request allows it (v4+ field; always at
//! v0–v3, as in Kafka). Each partition's leader, leader epoch, replicas and ISR are the
//! metadata image's (on a single node: this broker, epoch 0).
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

fn topic_entry(t: &TopicMeta) -> MetadataResponseTopic {
    let partitions = t
        .partition_states
        .iter()
        .zip(0..)
        .map(|(p, i)| {
            let nodes = |ids: &[i32]| ids.iter().copied().map(BrokerId).collect::<Vec<_>>();
            MetadataResponsePartition::default()
                .with_partition_index(i)
                .with_leader_id(BrokerId(p.leader))
                .with_leader_epoch(p.leader_epoch)
                .with_replica_nodes(nodes(&p.replicas))
                .with_isr_nodes(nodes(&p.isr))
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
pub(super) fn handle(ctx: &Context, request: MetadataRequest, version: i16) -> MetadataResponse {
    let all = match &request.topics {
        None => true,
        Some(list) => list.is_empty() && version == 0,
    };
    let allow_auto_create = version < 4 || request.allow_auto_topic_creation;
    let image = ctx.metadata.image();
    let topics = if all {
        image.topics().map(topic_entry).collect()
    } else {
        let mut out = Vec::new();
        for req in request.topics.unwrap_or_default() {
            match req.name {
                Some(name) => {
                    let name = name.0.as_str().to_string();
                    match topics::get_or_auto_create(&ctx.topics, &name, allow_auto_create) {
                        Ok(t) => out.push(topic_entry(&t)),
                        Err(e) => out.push(error_entry(Some(name), e.error)),
                    }
                }
                None => match image.topic_by_id(req.topic_id) {
                    Some(t) => out.push(topic_entry(t)),
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
        .with_node_id(BrokerId(image.node_id()))
        .with_host(StrBytes::from_string(ctx.advertised.host.clone()))
        .with_port(ctx.advertised.port);
    MetadataResponse::default()
        .with_brokers(vec![me])
        .with_cluster_id(Some(StrBytes::from_string(image.cluster_id().to_string())))
        .with_controller_id(BrokerId(image.node_id()))
        .with_topics(topics)
}
