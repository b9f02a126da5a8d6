//! Topic lifecycle changes asked for from outside: creation shared by CreateTopics,
//! auto-creation on Metadata and on Produce and the ingest path (transform outputs,
//! dead-letter topics, HTTP produce, connectors); topic config changes shared by
//! AlterConfigs and IncrementalAlterConfigs.
//!
//! Validates like Kafka (`Topic.validate`, `.`/`_` collisions, partitions ≥ 1, replication
//! factor ≤ live brokers, known topic-level config keys with valid values), then asks
//! `cluster` to record the topic and `replica` to open its partition logs.
//!
//! Errors returned: INVALID_TOPIC_EXCEPTION (17), TOPIC_ALREADY_EXISTS (36),
//! INVALID_PARTITIONS (37), INVALID_REPLICATION_FACTOR (38), INVALID_CONFIG (40),
//! UNKNOWN_SERVER_ERROR (-1) when the metadata or log cannot be written.
//!
//! Never does: hold state of its own (it calls the owners in [`Topics`], which the
//! composition root hands to the protocol layer and to `ingest`), or speak the wire
//! protocol (callers turn a [`TopicError`] into their response).

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::ResponseError;

use crate::cluster::{validate_topic_name, Metadata, TopicMeta};
use crate::config::{check_value, topic_key, BrokerConfig};
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

/// Most partitions one topic may have (a limit on everything; Kafka has none, but each
/// partition here is a directory and open files).
pub const MAX_PARTITIONS_PER_TOPIC: i32 = 10_000;

/// A refused topic operation: the Kafka error and a message for `error_message`.
#[derive(Debug, Clone, PartialEq)]
pub struct TopicError {
    /// The Kafka error.
    pub error: ResponseError,
    /// Human-readable detail.
    pub message: String,
}

impl TopicError {
    /// A refusal with `error` and `message`.
    pub fn new(error: ResponseError, message: impl Into<String>) -> TopicError {
        TopicError {
            error,
            message: message.into(),
        }
    }
}

/// Checks a topic name, including the `.`/`_` collision with existing topics.
pub fn check_name(ctx: &Topics, name: &str) -> Result<(), TopicError> {
    validate_topic_name(name)
        .map_err(|e| TopicError::new(ResponseError::InvalidTopicException, e.to_string()))?;
    if let Some(other) = ctx.metadata.colliding_topic(name) {
        return Err(TopicError::new(
            ResponseError::InvalidTopicException,
            format!("Topic '{name}' collides with existing topic: {other}"),
        ));
    }
    Ok(())
}

/// Checks topic-level configs: known keys, values of the right type.
pub fn check_configs(configs: &BTreeMap<String, String>) -> Result<(), TopicError> {
    for (k, v) in configs {
        let spec = topic_key(k).ok_or_else(|| {
            TopicError::new(
                ResponseError::InvalidConfig,
                format!("Unknown topic config name: {k}"),
            )
        })?;
        let min = crate::config::broker_key(spec.broker_key).and_then(|b| b.min);
        check_value(k, spec.key_type, min, v)
            .map_err(|e| TopicError::new(ResponseError::InvalidConfig, e.to_string()))?;
    }
    Ok(())
}

/// Validates and (unless `validate_only`) creates a topic with its partition logs.
/// `partitions` / `replication_factor` of -1 mean the broker defaults.
pub fn create(
    ctx: &Topics,
    name: &str,
    partitions: i32,
    replication_factor: i16,
    configs: BTreeMap<String, String>,
    validate_only: bool,
) -> Result<TopicMeta, TopicError> {
    if ctx.metadata.topic(name).is_some() {
        return Err(TopicError::new(
            ResponseError::TopicAlreadyExists,
            format!("Topic '{name}' already exists."),
        ));
    }
    check_name(ctx, name)?;
    let partitions = if partitions == -1 {
        ctx.config.num_partitions
    } else {
        partitions
    };
    if !(1..=MAX_PARTITIONS_PER_TOPIC).contains(&partitions) {
        return Err(TopicError::new(
            ResponseError::InvalidPartitions,
            format!("Number of partitions must be between 1 and {MAX_PARTITIONS_PER_TOPIC}, got {partitions}."),
        ));
    }
    let replication_factor = if replication_factor == -1 {
        ctx.config.default_replication_factor
    } else {
        replication_factor
    };
    if replication_factor != 1 {
        return Err(TopicError::new(
            ResponseError::InvalidReplicationFactor,
            format!("Replication factor must be between 1 and the number of brokers (1), got {replication_factor}."),
        ));
    }
    check_configs(&configs)?;
    if validate_only {
        return Ok(TopicMeta {
            name: name.to_string(),
            id: uuid::Uuid::nil(),
            partitions,
            replication_factor,
            configs,
        });
    }
    let meta = match ctx
        .metadata
        .create_topic(name, partitions, replication_factor, configs)
    {
        Ok(Some(m)) => m,
        Ok(None) => {
            return Err(TopicError::new(
                ResponseError::TopicAlreadyExists,
                format!("Topic '{name}' already exists."),
            ))
        }
        Err(e) => {
            tracing::error!(topic = name, error = %e, "cannot record new topic");
            return Err(TopicError::new(
                ResponseError::UnknownServerError,
                e.to_string(),
            ));
        }
    };
    if let Err(e) = ctx.replicas.open_partitions(&meta, 0) {
        // Roll back: a topic whose logs could not all be created must not stay registered
        // (start-up would then fail on it too).
        tracing::error!(topic = name, error = %e, "cannot create partition logs; rolling the topic back");
        if let Err(e) = ctx.replicas.delete_topic(name, meta.partitions) {
            tracing::error!(topic = name, error = %e, "cannot remove the partial partition logs");
        }
        if let Err(e) = ctx.metadata.delete_topic(name) {
            tracing::error!(topic = name, error = %e, "cannot remove the topic from the metadata");
        }
        return Err(TopicError::new(
            ResponseError::UnknownServerError,
            format!("cannot create the partition logs: {e}"),
        ));
    }
    tracing::info!(topic = name, partitions, "created topic");
    Ok(meta)
}

/// Replaces the config overrides of an existing topic with `configs` (after validating
/// them like CreateTopics), persists them and applies them to the live partitions; with
/// `validate_only` it only validates. Shared by AlterConfigs and IncrementalAlterConfigs,
/// which differ only in how they compute `configs` from the current overrides: `f`
/// receives the current overrides and returns the new set (or the error for the resource).
///
/// Errors: UNKNOWN_TOPIC_OR_PARTITION (3), INVALID_CONFIG (40), whatever `f` returns,
/// UNKNOWN_SERVER_ERROR (-1) when the metadata cannot be written.
pub fn alter_configs(
    ctx: &Topics,
    name: &str,
    validate_only: bool,
    f: impl FnOnce(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, TopicError>,
) -> Result<(), TopicError> {
    let unknown = || {
        TopicError::new(
            ResponseError::UnknownTopicOrPartition,
            format!("Topic '{name}' does not exist."),
        )
    };
    // Held from reading the current overrides to the last partition reconfigured, so
    // concurrent changes apply one after the other (no lost update, no stale partition).
    let _serial = ctx.replicas.lock_config_changes();
    let current = ctx.metadata.topic(name).ok_or_else(unknown)?;
    let configs = f(&current.configs)?;
    check_configs(&configs)?;
    if validate_only {
        return Ok(());
    }
    let meta = match ctx.metadata.set_topic_configs(name, configs) {
        Ok(Some(m)) => m,
        Ok(None) => return Err(unknown()),
        Err(e) => {
            tracing::error!(topic = name, error = %e, "cannot record topic configs");
            return Err(TopicError::new(
                ResponseError::UnknownServerError,
                e.to_string(),
            ));
        }
    };
    if let Err(e) = ctx.replicas.reconfigure_topic(&meta) {
        // Validated configs always resolve to a valid log config: this is our bug.
        tracing::error!(topic = name, error = %e, "cannot apply topic configs to the partitions");
        return Err(TopicError::new(
            ResponseError::UnknownServerError,
            e.to_string(),
        ));
    }
    tracing::info!(topic = name, configs = ?meta.configs, "altered topic configs");
    Ok(())
}

/// The topic, auto-creating it with the broker defaults when `auto.create.topics.enable`
/// and `allowed` say so. `Err` carries the error for this topic (UNKNOWN_TOPIC_OR_PARTITION
/// (3) when it does not exist and may not be created).
pub fn get_or_auto_create(
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
    match create(ctx, name, -1, -1, BTreeMap::new(), false) {
        Ok(t) => Ok(t),
        // Lost a race with another creator: the topic exists now.
        Err(e) if e.error == ResponseError::TopicAlreadyExists => ctx.metadata.topic(name).ok_or(e),
        Err(e) => Err(e),
    }
}
