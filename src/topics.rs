//! Topic lifecycle changes asked for from outside: creation shared by CreateTopics,
//! auto-creation on Metadata and on Produce and the ingest path (transform outputs,
//! dead-letter topics, HTTP produce, connectors); topic config changes shared by
//! AlterConfigs and IncrementalAlterConfigs.
//!
//! Resolves Kafka's -1 defaults from the broker config and hands the change to
//! `cluster::topics`, which validates like Kafka (`Topic.validate`, `.`/`_` collisions,
//! partitions ≥ 1, replication factor ≤ live brokers, known topic-level config keys with
//! valid values) and applies it; the replica manager follows the metadata change.
//!
//! Errors returned: INVALID_TOPIC_EXCEPTION (17), TOPIC_ALREADY_EXISTS (36),
//! INVALID_PARTITIONS (37), INVALID_REPLICATION_FACTOR (38), INVALID_REPLICA_ASSIGNMENT
//! (39), INVALID_CONFIG (40),
//! UNKNOWN_SERVER_ERROR (-1) when the metadata or log cannot be written.
//!
//! Never does: hold state of its own (it calls the owners in [`Topics`], which the
//! composition root hands to the protocol layer and to `ingest`), or speak the wire
//! protocol (callers turn a [`TopicError`] into their response).

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::ResponseError;

use crate::cluster::{validate_topic_name, Metadata, NewTopic, TopicMeta};
use crate::config::{parse_plugin_config, BrokerConfig};
use crate::replica::ReplicaManager;

/// The owners a topic change goes through: the broker defaults, the topic registry and
/// the partition logs. Built once by `broker`; cheap to clone (three `Arc`s).
#[derive(Debug, Clone)]
pub struct Topics {
    /// Broker configuration (`num.partitions`, `auto.create.topics.enable`, ...).
    pub config: Arc<BrokerConfig>,
    /// Cluster metadata: where topics are recorded.
    pub metadata: Arc<Metadata>,
    /// Hosted partitions: where a topic's logs are opened and reconfigured.
    pub replicas: Arc<ReplicaManager>,
}

pub(crate) use crate::cluster::TopicError;

/// Validates and (unless `validate_only`) creates a topic with its partition logs, through
/// [`crate::cluster::Metadata::create_topic`]. `partitions` / `replication_factor` of -1
/// mean the broker defaults (`num.partitions`, `default.replication.factor`); a non-empty
/// `assignment` (replicas of each partition, by index) places the partitions as it says
/// (then both are -1; the caller checked the numbering).
///
/// Errors: as [`crate::cluster::Metadata::create_topic`].
pub(crate) fn create(
    ctx: &Topics,
    name: &str,
    partitions: i32,
    replication_factor: i16,
    configs: BTreeMap<String, String>,
    assignment: Vec<Vec<i32>>,
    validate_only: bool,
) -> Result<TopicMeta, TopicError> {
    let (partitions, replication_factor) = match assignment.first() {
        Some(first) => (
            i32::try_from(assignment.len()).unwrap_or(i32::MAX),
            i16::try_from(first.len()).unwrap_or(i16::MAX),
        ),
        None => (partitions, replication_factor),
    };
    check_plugin_configs(&BTreeMap::new(), &configs)?;
    let spec = NewTopic {
        name: name.to_string(),
        partitions: if partitions == -1 {
            ctx.config.num_partitions
        } else {
            partitions
        },
        replication_factor: if replication_factor == -1 {
            ctx.config.default_replication_factor
        } else {
            replication_factor
        },
        configs,
        assignment,
    };
    if validate_only {
        ctx.metadata.validate_new_topic(&spec)
    } else {
        ctx.metadata.create_topic(spec)
    }
}

/// Replaces the config overrides of an existing topic with what `f` computes from the
/// current ones (validated like CreateTopics) and applies them to the live partitions,
/// through [`crate::cluster::Metadata::alter_topic_configs`]; with `validate_only` it only
/// validates. Shared by AlterConfigs and IncrementalAlterConfigs, which differ only in how
/// they compute the new set.
///
/// Errors: UNKNOWN_TOPIC_OR_PARTITION (3), INVALID_CONFIG (40), whatever `f` returns,
/// UNKNOWN_SERVER_ERROR (-1) when the metadata cannot be written.
pub(crate) fn alter_configs(
    ctx: &Topics,
    name: &str,
    validate_only: bool,
    f: impl FnOnce(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, TopicError>,
) -> Result<(), TopicError> {
    let f = |old: &BTreeMap<String, String>| {
        let new = f(old)?;
        check_plugin_configs(old, &new)?;
        Ok(new)
    };
    if validate_only {
        ctx.metadata.validate_topic_configs(name, f)
    } else {
        ctx.metadata.alter_topic_configs(name, f).map(|_| ())
    }
}

/// Checks the topic-level plugin settings of `new` that differ from `old`, as Kafka checks
/// a class-valued config (a class that cannot be found is refused when set, not at first
/// use): a non-empty `partitioner` must name a file on the broker host, and
/// `partitioner.config` must parse as `key=value` pairs. Unchanged values are not
/// re-checked, so altering another key of a topic whose component went away still works
/// (its produce requests report the missing component).
///
/// Errors: INVALID_CONFIG (40), "Invalid value V for configuration K: why".
fn check_plugin_configs(
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
) -> Result<(), TopicError> {
    let changed = |key: &str| new.get(key).filter(|v| old.get(key) != Some(*v));
    let invalid = |key: &str, value: &str, why: String| {
        TopicError::new(
            ResponseError::InvalidConfig,
            format!("Invalid value {value} for configuration {key}: {why}"),
        )
    };
    if let Some(path) = changed("partitioner").map(|p| p.trim()) {
        if !path.is_empty() {
            match std::fs::metadata(path) {
                Ok(m) if m.is_file() => {}
                Ok(_) => {
                    return Err(invalid(
                        "partitioner",
                        path,
                        "not a file (a .wasm component on the broker host)".into(),
                    ))
                }
                Err(e) => {
                    return Err(invalid(
                        "partitioner",
                        path,
                        format!("cannot read the component on the broker host: {e}"),
                    ))
                }
            }
        }
    }
    if let Some(text) = changed("partitioner.config") {
        parse_plugin_config(text).map_err(|e| invalid("partitioner.config", text, e))?;
    }
    Ok(())
}

/// The topic, auto-creating it with the broker defaults when `auto.create.topics.enable`
/// and `allowed` say so. `Err` carries the error for this topic (UNKNOWN_TOPIC_OR_PARTITION
/// (3) when it does not exist and may not be created).
pub(crate) fn get_or_auto_create(
    ctx: &Topics,
    name: &str,
    allowed: bool,
) -> Result<TopicMeta, TopicError> {
    if let Some(t) = ctx.metadata.topic(name) {
        return Ok(t);
    }
    if validate_topic_name(name).is_err() {
        return Err(TopicError::new(
            ResponseError::InvalidTopicException,
            format!("invalid topic name {name:?}"),
        ));
    }
    if !(allowed && ctx.config.auto_create_topics_enable) {
        return Err(TopicError::new(
            ResponseError::UnknownTopicOrPartition,
            "This server does not host this topic-partition.",
        ));
    }
    match create(ctx, name, -1, -1, BTreeMap::new(), Vec::new(), false) {
        Ok(t) => Ok(t),
        // Lost a race with another creator: the topic exists now. Either this node knew
        // it by then (TOPIC_ALREADY_EXISTS), or, on a cluster, the other creation reached
        // this node's image only with the refusal of ours (a refused metadata change,
        // UNKNOWN_SERVER_ERROR): answering that would fail a Produce for good in clients
        // that treat -1 as fatal (kafka-python) while the topic is there.
        Err(e) => ctx.metadata.topic(name).ok_or(e),
    }
}
