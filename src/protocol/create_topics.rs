//! CreateTopics (key 19), v2–v7. Protocol guide "CreateTopics"; KIP-464 (defaults via -1,
//! v4+), KIP-525 (configs in the response, v5+), KIP-516 (topic id, v7).
//!
//! Errors returned per topic: INVALID_TOPIC_EXCEPTION (17), TOPIC_ALREADY_EXISTS (36),
//! INVALID_PARTITIONS (37), INVALID_REPLICATION_FACTOR (38), INVALID_REPLICA_ASSIGNMENT
//! (39), INVALID_CONFIG (40), INVALID_REQUEST (42) for a topic named twice.

use std::collections::BTreeMap;

use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::{CreateTopicsRequest, CreateTopicsResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::replica::effective_topic_configs;

use super::Context;
use crate::topics::{self, TopicError};

/// Handles a CreateTopics request.
pub(super) fn handle(
    ctx: &Context,
    request: CreateTopicsRequest,
    version: i16,
) -> CreateTopicsResponse {
    let mut seen = std::collections::HashSet::new();
    let duplicates: std::collections::HashSet<String> = request
        .topics
        .iter()
        .filter_map(|t| {
            let n = t.name.0.as_str().to_string();
            (!seen.insert(n.clone())).then_some(n)
        })
        .collect();
    let results = request
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.0.as_str().to_string();
            let result = if duplicates.contains(&name) {
                Err(TopicError::new(ResponseError::InvalidRequest, format!("Create topics request from client contains multiple entries for topic {name}")))
            } else {
                create_one(ctx, &name, &t, request.validate_only)
            };
            let out = CreatableTopicResult::default().with_name(t.name);
            match result {
                Ok(meta) => {
                    let mut out = out
                        .with_topic_id(meta.id)
                        .with_num_partitions(meta.partitions)
                        .with_replication_factor(meta.replication_factor);
                    if version >= 5 {
                        let image = ctx.metadata.image();
                        let configs = effective_topic_configs(
                            &ctx.config,
                            image.dynamic_layers(),
                            &meta.configs,
                        )
                            .into_iter()
                            .map(|(k, v, source)| {
                                CreatableTopicConfigs::default()
                                    .with_name(StrBytes::from_static_str(k))
                                    .with_value(v.map(StrBytes::from_string))
                                    .with_config_source(source.code())
                            })
                            .collect();
                        out = out.with_configs(Some(configs));
                    }
                    out
                }
                Err(e) => {
                    tracing::debug!(topic = %name, error = ?e.error, message = %e.message, "create topic refused");
                    out.with_error_code(e.error.code())
                        .with_error_message(Some(StrBytes::from_string(e.message)))
                        .with_num_partitions(-1)
                        .with_replication_factor(-1)
                }
            }
        })
        .collect();
    CreateTopicsResponse::default().with_topics(results)
}

fn create_one(
    ctx: &Context,
    name: &str,
    t: &kafka_protocol::messages::create_topics_request::CreatableTopic,
    validate_only: bool,
) -> Result<crate::cluster::TopicMeta, TopicError> {
    let mut configs = BTreeMap::new();
    for c in &t.configs {
        match &c.value {
            Some(v) => {
                configs.insert(c.name.as_str().to_string(), v.as_str().to_string());
            }
            None => {
                return Err(TopicError::new(
                    ResponseError::InvalidConfig,
                    format!(
                        "Null value not supported for topic config {}",
                        c.name.as_str()
                    ),
                ))
            }
        }
    }
    let assignment = if t.assignments.is_empty() {
        Vec::new()
    } else {
        if t.num_partitions != -1 || t.replication_factor != -1 {
            return Err(TopicError::new(ResponseError::InvalidRequest, "Both numPartitions or replicationFactor and replicasAssignments were set. Both cannot be used at the same time."));
        }
        // Partitions numbered 0..N-1, each once (Kafka's controller); the brokers of each
        // are checked by `cluster::placement` against the live brokers.
        let mut by_index: Vec<&_> = t.assignments.iter().collect();
        by_index.sort_by_key(|a| a.partition_index);
        for (expected, a) in by_index.iter().enumerate() {
            if a.partition_index != expected as i32 {
                return Err(TopicError::new(
                    ResponseError::InvalidReplicaAssignment,
                    format!(
                        "Partitions should be sequentially numbered from 0: partition {expected} is missing or named twice (got {}).",
                        a.partition_index
                    ),
                ));
            }
        }
        by_index
            .iter()
            .map(|a| a.broker_ids.iter().map(|b| b.0).collect())
            .collect()
    };
    topics::create(
        &ctx.topics,
        name,
        t.num_partitions,
        t.replication_factor,
        configs,
        assignment,
        validate_only,
    )
}
