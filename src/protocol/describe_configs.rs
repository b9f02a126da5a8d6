//! DescribeConfigs (key 32), v1–v4. Protocol guide "DescribeConfigs"; KIP-226 (config
//! source, synonyms), KIP-569 (type and documentation, v3+).
//!
//! Topics and this broker's id are read from this broker's metadata image, as a Kafka
//! broker answers from its metadata cache: nothing waits for the controller quorum, so
//! it answers while the quorum elects a leader. Topic resources (type 2) report every
//! topic-level key (`config::TOPIC_KEYS`, Kafka 4.1's) with its effective value and
//! source: DYNAMIC_TOPIC_CONFIG (1) when set on the topic, else its broker synonym's
//! layer — DYNAMIC_BROKER_CONFIG (2), DYNAMIC_DEFAULT_BROKER_CONFIG (3),
//! STATIC_BROKER_CONFIG (4) or DEFAULT_CONFIG (5). Broker resources (type 4), as Kafka's
//! `ConfigHelper`: name "" lists the dynamic cluster defaults (source 3); name = this node
//! id lists every broker key with the value in force, `read_only` false exactly for the
//! dynamic keys (`config::DYNAMIC_BROKER_KEYS`). `configuration_keys` filters; synonyms
//! (when asked) follow Kafka's order: the topic override, then every spelling of the
//! broker key per layer (dynamic per-broker, dynamic default, static, default).
//!
//! Errors returned per resource: UNKNOWN_TOPIC_OR_PARTITION (3), INVALID_REQUEST (42) for
//! another broker's id or an unsupported resource type.

use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::config::{
    broker_key, dynamic_key, topic_key, DynamicLayers, KeyType, Synonym, BROKER_KEYS,
};
use crate::replica::{effective_topic_configs, ConfigSource};

use super::Context;

/// Resource type: topic.
const TOPIC: i8 = 2;
/// Resource type: broker.
const BROKER: i8 = 4;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// The wire form of `synonyms`.
fn wire_synonyms(synonyms: &[Synonym]) -> Vec<DescribeConfigsSynonym> {
    synonyms
        .iter()
        .map(|syn| {
            DescribeConfigsSynonym::default()
                .with_name(s(syn.name))
                .with_value(syn.value.as_deref().map(s))
                .with_source(syn.source.code())
        })
        .collect()
}

/// What one config entry says, before it is put on the wire.
struct Entry<'a> {
    name: &'a str,
    value: Option<String>,
    source: ConfigSource,
    read_only: bool,
    key_type: Option<KeyType>,
    doc: Option<&'static str>,
    synonyms: Vec<Synonym>,
}

fn entry(
    e: Entry<'_>,
    version: i16,
    request: &DescribeConfigsRequest,
) -> DescribeConfigsResourceResult {
    let mut out = DescribeConfigsResourceResult::default()
        .with_name(s(e.name))
        .with_value(e.value.as_deref().map(s))
        .with_read_only(e.read_only)
        .with_config_source(e.source.code());
    if version >= 3 {
        if let Some(t) = e.key_type {
            out = out.with_config_type(t.describe_configs_code());
        }
        if request.include_documentation {
            out = out.with_documentation(e.doc.map(s));
        }
    }
    if request.include_synonyms {
        out = out.with_synonyms(wire_synonyms(&e.synonyms));
    }
    out
}

/// Handles a DescribeConfigs request.
pub(super) fn handle(
    ctx: &Context,
    request: DescribeConfigsRequest,
    version: i16,
) -> DescribeConfigsResponse {
    let image = ctx.metadata.image();
    let layers = image.dynamic_layers();
    let results = request
        .resources
        .iter()
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
                    let configs = effective_topic_configs(&ctx.config, layers, &meta.configs)
                        .into_iter()
                        .filter(|(k, _, _)| wanted(k))
                        .map(|(k, v, source)| {
                            let spec = topic_key(k);
                            let mut synonyms = Vec::new();
                            if source == ConfigSource::Topic {
                                synonyms.push(Synonym {
                                    name: k,
                                    value: v.clone(),
                                    source,
                                });
                            }
                            if let Some(broker) = spec.and_then(|t| t.broker_key) {
                                synonyms.extend(ctx.config.synonyms(layers, broker));
                            }
                            let e = Entry {
                                name: k,
                                value: v,
                                source,
                                read_only: false,
                                key_type: spec.map(|t| t.key_type),
                                doc: spec.map(|t| t.doc),
                                synonyms,
                            };
                            entry(e, version, &request)
                        })
                        .collect();
                    out.with_configs(configs)
                }
                // Kafka's `ConfigHelper`: "" lists the cluster defaults set dynamically;
                // "<this node id>" lists every key with its value in force.
                BROKER if name.is_empty() => {
                    let defaults = DynamicLayers {
                        per_broker: None,
                        cluster_default: layers.cluster_default,
                    };
                    let configs = layers
                        .cluster_default
                        .into_iter()
                        .flatten()
                        .filter(|(k, _)| wanted(k))
                        .map(|(k, v)| {
                            let spec = broker_key(k);
                            let e = Entry {
                                name: k,
                                value: Some(v.clone()),
                                source: ConfigSource::DynamicDefaultBroker,
                                read_only: dynamic_key(k).is_none(),
                                key_type: spec.map(|k| k.key_type),
                                doc: spec.map(|k| k.doc),
                                synonyms: own_synonyms(ctx, defaults, k),
                            };
                            entry(e, version, &request)
                        })
                        .collect();
                    out.with_configs(configs)
                }
                BROKER => {
                    if name != image.node_id().to_string() {
                        return out
                            .with_error_code(ResponseError::InvalidRequest.code())
                            .with_error_message(Some(s("This broker's id is not that one.")));
                    }
                    let configs = BROKER_KEYS
                        .iter()
                        .filter(|k| wanted(k.name))
                        .map(|k| {
                            let synonyms = own_synonyms(ctx, layers, k.name);
                            let (value, source) = match synonyms.first() {
                                Some(first) => (first.value.clone(), first.source),
                                None => (ctx.config.raw.value(k.name), ConfigSource::Default),
                            };
                            let e = Entry {
                                name: k.name,
                                value,
                                source,
                                read_only: dynamic_key(k.name).is_none(),
                                key_type: Some(k.key_type),
                                doc: Some(k.doc),
                                synonyms,
                            };
                            entry(e, version, &request)
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

/// The synonyms of broker key `key` from the first one named `key` on (Kafka drops the
/// entries of its other spellings that come first: `log.retention.hours` set statically
/// is not the source of `log.retention.ms`'s entry).
fn own_synonyms(ctx: &Context, layers: DynamicLayers<'_>, key: &str) -> Vec<Synonym> {
    ctx.config
        .synonyms(layers, key)
        .into_iter()
        .skip_while(|syn| syn.name != key)
        .collect()
}
