//! IncrementalAlterConfigs (key 44), v0–v1. Protocol guide "IncrementalAlterConfigs";
//! KIP-339 (the API), KIP-226 (dynamic broker configs).
//!
//! Each entry changes one key, the others stay — SET (0) sets the value, DELETE (1)
//! removes it (the next layer's value applies again), APPEND (2) and SUBTRACT (3) add
//! values to or remove values from a list-typed key (`cleanup.policy`). A SUBTRACT that
//! leaves `cleanup.policy` empty is accepted, as Kafka 4.1 accepts it: neither delete nor
//! compact, every record is kept.
//!
//! Topic resources (type 2): the changes apply to the topic's overrides; APPEND and
//! SUBTRACT start from the topic's effective value (its override, else the broker's).
//! The resulting set is validated like CreateTopics; with `validate_only` nothing
//! changes. As AlterConfigs, the result is persisted and applied to the live partitions.
//!
//! Broker resources (type 4): name "" (the cluster default) or this node's id; the
//! changes apply to that resource's dynamic configs (APPEND and SUBTRACT start from its
//! current value, else the key's default, as Kafka's `ConfigAdminManager`), checked and
//! recorded as AlterConfigs does (`alter_configs::alter_broker`).
//!
//! Errors returned per resource: UNKNOWN_TOPIC_OR_PARTITION (3), INVALID_CONFIG (40) for an
//! unknown topic key, a bad topic value, or APPEND/SUBTRACT on a key that is not a list,
//! INVALID_REQUEST (42) for a read-only, unknown or invalid broker key, another broker's
//! id, another resource type, a resource named twice, a key named twice in one resource,
//! an unknown operation or a null value for SET/APPEND/SUBTRACT, UNKNOWN_SERVER_ERROR (-1)
//! when the metadata cannot be written.

use std::collections::{BTreeMap, HashSet};

use kafka_protocol::messages::incremental_alter_configs_request::AlterableConfig;
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::{IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse};
use kafka_protocol::ResponseError;

use crate::config::{broker_key, topic_key, KeyType};
use crate::replica::effective_topic_configs;

use super::alter_configs::{alter_broker, outcome, refused_resource, BROKER};
use super::Context;
use crate::topics::{self, TopicError};

/// One operation on one key (the wire's `config_operation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Set,
    Delete,
    Append,
    Subtract,
}

impl Op {
    fn from_code(code: i8) -> Option<Op> {
        match code {
            0 => Some(Op::Set),
            1 => Some(Op::Delete),
            2 => Some(Op::Append),
            3 => Some(Op::Subtract),
            _ => None,
        }
    }
}

fn invalid_request(message: String) -> TopicError {
    TopicError::new(ResponseError::InvalidRequest, message)
}

fn invalid_config(message: String) -> TopicError {
    TopicError::new(ResponseError::InvalidConfig, message)
}

fn list_items(value: &str) -> Vec<&str> {
    value
        .split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .collect()
}

/// `current` (a topic's overrides, a broker resource's dynamic configs) after applying
/// `changes`. `key_type` gives a key's type or the error for an unknown key; `base` the
/// value an APPEND or SUBTRACT starts from when `current` does not set the key.
fn apply(
    current: &BTreeMap<String, String>,
    changes: &[AlterableConfig],
    key_type: impl Fn(&str) -> Result<KeyType, TopicError>,
    base: impl Fn(&str, &BTreeMap<String, String>) -> String,
) -> Result<BTreeMap<String, String>, TopicError> {
    let mut keys = HashSet::new();
    for c in changes {
        if !keys.insert(c.name.as_str()) {
            return Err(invalid_request(format!(
                "Error due to duplicate config keys: {}",
                c.name.as_str()
            )));
        }
    }
    let mut next = current.clone();
    for c in changes {
        let name = c.name.as_str();
        let op = Op::from_code(c.config_operation).ok_or_else(|| {
            invalid_request(format!(
                "Unknown config operation {} for {name}",
                c.config_operation
            ))
        })?;
        let key_type = key_type(name)?;
        if op == Op::Delete {
            next.remove(name);
            continue;
        }
        let Some(v) = c.value.as_ref().map(|v| v.as_str()) else {
            return Err(invalid_request(format!(
                "Null value not supported for : {name}"
            )));
        };
        if op == Op::Set {
            next.insert(name.to_string(), v.to_string());
            continue;
        }
        if key_type != KeyType::List {
            return Err(invalid_config(format!(
                "Config value {} is not allowed for config key: {name} (not a list)",
                if op == Op::Append {
                    "append"
                } else {
                    "subtract"
                }
            )));
        }
        let base = match next.get(name) {
            Some(v) => v.clone(),
            None => base(name, &next),
        };
        let mut items: Vec<&str> = list_items(&base);
        let given = list_items(v);
        if op == Op::Append {
            for g in given {
                if !items.contains(&g) {
                    items.push(g);
                }
            }
        } else {
            items.retain(|i| !given.contains(i));
        }
        next.insert(name.to_string(), items.join(","));
    }
    Ok(next)
}

/// The changes of a topic resource: keys are topic keys; APPEND/SUBTRACT start from the
/// effective value.
fn apply_to_topic(
    ctx: &Context,
    current: &BTreeMap<String, String>,
    changes: &[AlterableConfig],
) -> Result<BTreeMap<String, String>, TopicError> {
    let image = ctx.metadata.image();
    let layers = image.dynamic_layers();
    apply(
        current,
        changes,
        |name| {
            topic_key(name)
                .map(|spec| spec.key_type)
                .ok_or_else(|| invalid_config(format!("Unknown topic config name: {name}")))
        },
        |name, next| {
            effective_topic_configs(&ctx.config, layers, next)
                .into_iter()
                .find(|(k, _, _)| *k == name)
                .and_then(|(_, v, _)| v)
                .unwrap_or_default()
        },
    )
}

/// The changes of a broker resource: keys are broker keys (whether they are dynamic is
/// checked on the result); APPEND/SUBTRACT start from the key's default.
fn apply_to_broker(
    current: &BTreeMap<String, String>,
    changes: &[AlterableConfig],
) -> Result<BTreeMap<String, String>, TopicError> {
    apply(
        current,
        changes,
        |name| {
            broker_key(name)
                .map(|spec| spec.key_type)
                .ok_or_else(|| invalid_request(format!("Unknown broker config name: {name}")))
        },
        |name, _| {
            broker_key(name)
                .and_then(|spec| spec.default)
                .unwrap_or_default()
                .to_string()
        },
    )
}

/// Handles an IncrementalAlterConfigs request.
pub(super) fn handle(
    ctx: &Context,
    request: IncrementalAlterConfigsRequest,
    _version: i16,
) -> IncrementalAlterConfigsResponse {
    let mut seen = HashSet::new();
    let responses = request
        .resources
        .into_iter()
        .map(|r| {
            let name = r.resource_name.as_str();
            let result = match refused_resource(r.resource_type, name, &mut seen) {
                Some(e) => Err(e),
                None if r.resource_type == BROKER => {
                    alter_broker(ctx, name, request.validate_only, |current| {
                        apply_to_broker(current, &r.configs)
                    })
                }
                None => {
                    topics::alter_configs(&ctx.topics, name, request.validate_only, |current| {
                        apply_to_topic(ctx, current, &r.configs)
                    })
                }
            };
            let (code, message) = outcome(result);
            AlterConfigsResourceResponse::default()
                .with_error_code(code)
                .with_error_message(message)
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone())
        })
        .collect();
    IncrementalAlterConfigsResponse::default().with_responses(responses)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::protocol::StrBytes;

    fn change(name: &str, op: i8, value: Option<&str>) -> AlterableConfig {
        AlterableConfig::default()
            .with_name(StrBytes::from_string(name.to_string()))
            .with_config_operation(op)
            .with_value(value.map(|v| StrBytes::from_string(v.to_string())))
    }

    #[test]
    fn broker_lists_start_from_the_default_and_may_be_emptied() {
        let none = BTreeMap::new();
        let appended =
            apply_to_broker(&none, &[change("log.cleanup.policy", 2, Some("compact"))]).unwrap();
        assert_eq!(appended["log.cleanup.policy"], "delete,compact");
        let emptied = apply_to_broker(
            &appended,
            &[change("log.cleanup.policy", 3, Some("delete,compact"))],
        )
        .unwrap();
        assert_eq!(emptied["log.cleanup.policy"], "");
        let deleted = apply_to_broker(&emptied, &[change("log.cleanup.policy", 1, None)]).unwrap();
        assert!(deleted.is_empty());
        let e = apply_to_broker(&none, &[change("no.such.key", 0, Some("1"))]).unwrap_err();
        assert_eq!(e.error, ResponseError::InvalidRequest);
        let e = apply_to_broker(&none, &[change("log.retention.ms", 2, Some("1"))]).unwrap_err();
        assert_eq!(
            e.error,
            ResponseError::InvalidConfig,
            "APPEND on a non-list key"
        );
    }
}
