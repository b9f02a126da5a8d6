//! DescribeConfigs (key 32), v1–v4. Protocol guide "DescribeConfigs"; KIP-226 (config
//! source, synonyms), KIP-569 (type and documentation, v3+).
//!
//! Topics and this broker's id are read from this broker's metadata image, as a Kafka
//! broker answers from its metadata cache: nothing waits for the controller quorum, so
//! it answers while the quorum elects a leader. Topic resources (type
//! 2) report every topic-level key with its effective value and
//! source (DYNAMIC_TOPIC_CONFIG when set on the topic, else the broker's STATIC_BROKER_CONFIG
//! or DEFAULT_CONFIG); broker resources (type 4, name = this node id or empty) report every
//! broker key. `configuration_keys` filters; synonyms list the broker key behind a topic key.
//!
//! Errors returned per resource: UNKNOWN_TOPIC_OR_PARTITION (3), INVALID_REQUEST (42) for
//! another broker's id or an unsupported resource type.

use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::config::{topic_key, BROKER_KEYS};
use crate::replica::{effective_topic_configs, ConfigSource};

use super::Context;

/// Resource type: topic.
const TOPIC: i8 = 2;
/// Resource type: broker.
const BROKER: i8 = 4;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// Handles a DescribeConfigs request.
pub(super) fn handle(
    ctx: &Context,
    request: DescribeConfigsRequest,
    version: i16,
) -> DescribeConfigsResponse {
    let image = ctx.metadata.image();
    let results = request
        .resources
        .into_iter()
        .map(|r| {
            let wanted = |k: &str| {
                r.configuration_keys
                    .as_ref()
                    .is_none_or(|keys| keys.iter().any(|w| w.as_str() == k))
            };
            let out = DescribeConfigsResult::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone());
            let name = r.resource_name.as_str();
            match r.resource_type {
                TOPIC => {
                    let Some(meta) = image.topic(name) else {
                        return out
                            .with_error_code(ResponseError::UnknownTopicOrPartition.code())
                            .with_error_message(Some(s("The topic does not exist.")));
                    };
                    let configs = effective_topic_configs(&ctx.config, &meta.configs)
                        .into_iter()
                        .filter(|(k, _, _)| wanted(k))
                        .map(|(k, v, source)| {
                            let spec = topic_key(k);
                            let mut e = DescribeConfigsResourceResult::default()
                                .with_name(s(k))
                                .with_value(v.as_deref().map(s))
                                .with_config_source(source.code());
                            if version >= 3 {
                                if let Some(spec) = spec {
                                    e = e.with_config_type(spec.key_type.describe_configs_code());
                                    if request.include_documentation {
                                        e = e.with_documentation(Some(s(spec.doc)));
                                    }
                                }
                            }
                            if request.include_synonyms {
                                let mut syn = Vec::new();
                                if source == ConfigSource::Topic {
                                    syn.push(
                                        DescribeConfigsSynonym::default()
                                            .with_name(s(k))
                                            .with_value(v.as_deref().map(s))
                                            .with_source(ConfigSource::Topic.code()),
                                    );
                                }
                                if let Some(spec) = spec {
                                    let (bv, set) = ctx.config.topic_default(spec);
                                    let src = if set {
                                        ConfigSource::StaticBroker
                                    } else {
                                        ConfigSource::Default
                                    };
                                    syn.push(
                                        DescribeConfigsSynonym::default()
                                            .with_name(s(spec.broker_key))
                                            .with_value(bv.as_deref().map(s))
                                            .with_source(src.code()),
                                    );
                                }
                                e = e.with_synonyms(syn);
                            }
                            e
                        })
                        .collect();
                    out.with_configs(configs)
                }
                BROKER => {
                    if !name.is_empty() && name != image.node_id().to_string() {
                        return out
                            .with_error_code(ResponseError::InvalidRequest.code())
                            .with_error_message(Some(s("This broker's id is not that one.")));
                    }
                    let configs = BROKER_KEYS
                        .iter()
                        .filter(|k| wanted(k.name))
                        .map(|k| {
                            let set = ctx.config.raw.get(k.name).is_some();
                            let src = if set {
                                ConfigSource::StaticBroker
                            } else {
                                ConfigSource::Default
                            };
                            let mut e = DescribeConfigsResourceResult::default()
                                .with_name(s(k.name))
                                .with_value(ctx.config.raw.value(k.name).as_deref().map(s))
                                .with_read_only(true)
                                .with_config_source(src.code());
                            if version >= 3 {
                                e = e.with_config_type(k.key_type.describe_configs_code());
                                if request.include_documentation {
                                    e = e.with_documentation(Some(s(k.doc)));
                                }
                            }
                            if request.include_synonyms {
                                e = e.with_synonyms(vec![DescribeConfigsSynonym::default()
                                    .with_name(s(k.name))
                                    .with_value(ctx.config.raw.value(k.name).as_deref().map(s))
                                    .with_source(src.code())]);
                            }
                            e
                        })
                        .collect();
                    out.with_configs(configs)
                }
                _ => out
                    .with_error_code(ResponseError::InvalidRequest.code())
                    .with_error_message(Some(s("Unsupported resource type."))),
            }
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}
