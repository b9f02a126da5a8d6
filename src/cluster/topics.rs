//! Topic lifecycle: the one place a topic is created, grown, reconfigured or deleted.
//!
//! Owns: validating each change like Kafka's controller (`Topic.validate`, `.`/`_`
//! collisions, partitions ≥ 1, replication factor ≤ live brokers, a named replica
//! assignment (`placement::check_assignment`), known topic-level
//! config keys with valid values) against the current image, turning it into records,
//! and applying them through [`Metadata::update`] — which makes them durable and has the
//! listeners (the replica manager) open, reconfigure or close partitions. CreateTopics,
//! auto-creation, the group coordinator's `__consumer_offsets` and the connect runtime's
//! internal topics all create through [`Metadata::create_topic`]. Dynamic broker configs
//! (KIP-226) are recorded here too ([`Metadata::alter_broker_configs`]): like topic
//! configs they are config records every broker follows.
//!
//! Errors ([`TopicError`], Kafka codes): INVALID_TOPIC_EXCEPTION (17),
//! TOPIC_ALREADY_EXISTS (36), INVALID_PARTITIONS (37), INVALID_REPLICATION_FACTOR (38),
//! INVALID_CONFIG (40), UNKNOWN_TOPIC_OR_PARTITION (3), UNKNOWN_SERVER_ERROR (-1) when the
//! metadata or a partition log cannot be written (then nothing changed, except where
//! [`UpdateError::Incomplete`] says otherwise).

use std::collections::BTreeMap;

use kafka_protocol::ResponseError;
use uuid::Uuid;

use super::image::{MetadataImage, MetadataRecord, PartitionState, TopicMeta};
use super::placement::{self, assign, check_assignment, live_brokers, new_partition};
use super::{validate_topic_name, Metadata, MetadataError, UpdateError};
use crate::config::{check_value, topic_key};

/// Most partitions one topic may have (a limit on everything; Kafka has none, but each
/// partition here is a directory and open files).
pub(crate) const MAX_PARTITIONS_PER_TOPIC: i32 = 10_000;

/// A refused topic operation: the Kafka error and a message for `error_message`.
#[derive(Debug, Clone, PartialEq)]
pub struct TopicError {
    /// The Kafka error.
    pub error: ResponseError,
    /// Human-readable detail.
    pub message: String,
}

impl TopicError {
    /// An error with its message.
    pub fn new(error: ResponseError, message: impl Into<String>) -> TopicError {
        TopicError {
            error,
            message: message.into(),
        }
    }

    fn unknown(name: &str) -> TopicError {
        TopicError::new(
            ResponseError::UnknownTopicOrPartition,
            format!("Topic '{name}' does not exist."),
        )
    }
}

impl std::fmt::Display for TopicError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.error, self.message)
    }
}

impl std::error::Error for TopicError {}

/// How often [`Metadata::create_topic`] plans a creation refused by a race before it
/// answers UNKNOWN_SERVER_ERROR: each refusal means another change was committed first,
/// and the next plan sees it.
const CREATE_ATTEMPTS: u32 = 3;

/// UNKNOWN_SERVER_ERROR (-1) for a change the metadata or a listener could not make; the
/// message says which and whether anything changed. A change not made because of a file
/// system error (a partition log that cannot be created: no descriptor left, no space,
/// the path in the way) is KAFKA_STORAGE_ERROR (56) instead, the code Produce and Fetch
/// give for the same failure, so the client sees the class of the cause and the message
/// (the OS error and the path) says which; nothing was created.
fn server_error(name: &str, what: &str, e: UpdateError<TopicError>) -> TopicError {
    match e {
        UpdateError::Refused(e) => e,
        UpdateError::NotApplied(e) => {
            tracing::error!(topic = name, error = %e, "cannot {what}; nothing changed");
            let code = if caused_by_io(&e) {
                ResponseError::KafkaStorageError
            } else {
                ResponseError::UnknownServerError
            };
            TopicError::new(code, e.to_string())
        }
        UpdateError::Incomplete(e) => {
            tracing::error!(topic = name, error = %e, "{what}: recorded, but not finished");
            TopicError::new(ResponseError::UnknownServerError, e.to_string())
        }
    }
}

/// Whether an OS error is somewhere in `e`'s chain of causes.
fn caused_by_io(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if c.is::<std::io::Error>() {
            return true;
        }
        cause = c.source();
    }
    false
}

/// A topic to create, with every value given (callers resolve Kafka's -1 defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct NewTopic {
    /// Topic name.
    pub name: String,
    /// Partitions, 1..=[`MAX_PARTITIONS_PER_TOPIC`].
    pub partitions: i32,
    /// Replicas per partition, 1..=live brokers.
    pub replication_factor: i16,
    /// Topic-level config overrides, Kafka names.
    pub configs: BTreeMap<String, String>,
    /// The replicas of each partition, by index, leader first (CreateTopics
    /// `assignments`): empty places them over the live brokers (`cluster::placement`);
    /// else `partitions` is its length and `replication_factor` its lists' length.
    pub assignment: Vec<Vec<i32>>,
}

/// Checks topic-level configs: known keys, values of the right type.
///
/// Errors: INVALID_CONFIG (40) naming the key.
fn check_configs(configs: &BTreeMap<String, String>) -> Result<(), TopicError> {
    for (k, v) in configs {
        let spec = topic_key(k).ok_or_else(|| {
            TopicError::new(
                ResponseError::InvalidConfig,
                format!("Unknown topic config name: {k}"),
            )
        })?;
        check_value(k, spec.key_type, spec.min, v)
            .map_err(|e| TopicError::new(ResponseError::InvalidConfig, e.to_string()))?;
    }
    // Kafka's `LogConfig.validate`: checks across keys, and tiered storage needs the
    // broker's remote.log.storage.system.enable, which weir does not have.
    if configs.get("remote.storage.enable").map(String::as_str) == Some("true") {
        return Err(TopicError::new(
            ResponseError::InvalidConfig,
            "Tiered Storage functionality is disabled in the broker. Topic cannot be \
             configured with remote log storage.",
        ));
    }
    let long = |k: &str| configs.get(k).and_then(|v| v.parse::<i64>().ok());
    if let (Some(min), Some(max)) = (long("min.compaction.lag.ms"), long("max.compaction.lag.ms")) {
        if min > max {
            return Err(TopicError::new(
                ResponseError::InvalidConfig,
                format!(
                    "conflict topic config setting min.compaction.lag.ms ({min}) > \
                     max.compaction.lag.ms ({max})"
                ),
            ));
        }
    }
    Ok(())
}

/// Checks a topic name, including the `.`/`_` collision with the image's topics.
///
/// Errors: INVALID_TOPIC_EXCEPTION (17).
fn check_name(image: &MetadataImage, name: &str) -> Result<(), TopicError> {
    validate_topic_name(name)
        .map_err(|e| TopicError::new(ResponseError::InvalidTopicException, e.to_string()))?;
    if let Some(other) = image.colliding_topic(name) {
        return Err(TopicError::new(
            ResponseError::InvalidTopicException,
            format!("Topic '{name}' collides with existing topic: {other}"),
        ));
    }
    Ok(())
}

/// The topic `spec` makes on `image`, with id `id`, or why it may not.
fn plan_create(image: &MetadataImage, spec: &NewTopic, id: Uuid) -> Result<TopicMeta, TopicError> {
    let name = spec.name.as_str();
    if image.topic(name).is_some() {
        return Err(TopicError::new(
            ResponseError::TopicAlreadyExists,
            format!("Topic '{name}' already exists."),
        ));
    }
    check_name(image, name)?;
    let partitions = spec.partitions;
    if !(1..=MAX_PARTITIONS_PER_TOPIC).contains(&partitions) {
        return Err(TopicError::new(
            ResponseError::InvalidPartitions,
            format!("Number of partitions must be between 1 and {MAX_PARTITIONS_PER_TOPIC}, got {partitions}."),
        ));
    }
    let replicas = if spec.assignment.is_empty() {
        let brokers = live_brokers(image);
        let start = placement::random_start(brokers.len());
        assign(&brokers, 0, partitions, spec.replication_factor, start)?
    } else {
        check_assignment(image, &spec.assignment, None)?;
        spec.assignment.clone()
    };
    check_configs(&spec.configs)?;
    Ok(TopicMeta {
        name: name.to_string(),
        id,
        partitions,
        replication_factor: replicas.first().map_or(0, |r| r.len() as i16),
        configs: spec.configs.clone(),
        partition_states: replicas.into_iter().map(new_partition).collect(),
    })
}

/// The partitions growing `name` to `count` adds on `image`, or why it may not.
fn plan_grow(
    image: &MetadataImage,
    name: &str,
    count: i32,
    assignment: &[Vec<i32>],
) -> Result<(Uuid, Vec<PartitionState>), TopicError> {
    let Some(meta) = image.topic(name) else {
        return Err(TopicError::new(
            ResponseError::UnknownTopicOrPartition,
            format!("The topic '{name}' does not exist."),
        ));
    };
    if count <= meta.partitions {
        let msg = if count == meta.partitions {
            format!("Topic already has {count} partitions.")
        } else {
            format!(
                "Topic currently has {} partitions, which is higher than the requested {count}.",
                meta.partitions
            )
        };
        return Err(TopicError::new(ResponseError::InvalidPartitions, msg));
    }
    if count > MAX_PARTITIONS_PER_TOPIC {
        return Err(TopicError::new(
            ResponseError::InvalidPartitions,
            format!("At most {MAX_PARTITIONS_PER_TOPIC} partitions per topic."),
        ));
    }
    let new = count - meta.partitions;
    let replicas = if assignment.is_empty() {
        let brokers = live_brokers(image);
        let start = placement::random_start(brokers.len());
        assign(
            &brokers,
            meta.partitions,
            new,
            meta.replication_factor,
            start,
        )?
    } else {
        if assignment.len() != new as usize {
            return Err(TopicError::new(
                ResponseError::InvalidReplicaAssignment,
                format!(
                    "Attempted to add {new} additional partition(s), but only {} assignment(s) were specified.",
                    assignment.len()
                ),
            ));
        }
        let rf = usize::try_from(meta.replication_factor).unwrap_or(0);
        check_assignment(image, assignment, Some(rf))?;
        assignment.to_vec()
    };
    Ok((meta.id, replicas.into_iter().map(new_partition).collect()))
}

/// The new overrides of `name` that `f` computes from its current ones, validated.
fn plan_configs(
    image: &MetadataImage,
    name: &str,
    f: impl FnOnce(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, TopicError>,
) -> Result<(Uuid, BTreeMap<String, String>), TopicError> {
    let current = image.topic(name).ok_or_else(|| TopicError::unknown(name))?;
    let configs = f(&current.configs)?;
    check_configs(&configs)?;
    Ok((current.id, configs))
}

impl Metadata {
    /// Validates `spec` against the current metadata as [`Metadata::create_topic`] would,
    /// without creating anything (CreateTopics `validate_only`). The returned topic has
    /// the nil id.
    ///
    /// Errors: as [`Metadata::create_topic`], except UNKNOWN_SERVER_ERROR.
    pub fn validate_new_topic(&self, spec: &NewTopic) -> Result<TopicMeta, TopicError> {
        plan_create(&self.image(), spec, Uuid::nil())
    }

    /// Creates a topic with its partitions: validates `spec` against the current image,
    /// places the replicas over the live brokers (or as `spec.assignment` says), records
    /// it durably, and has the replica manager open every partition log hosted here — all
    /// or nothing: when a log cannot be opened the topic is not recorded and the logs
    /// already opened are closed and their new directories removed. The path of
    /// CreateTopics, auto-creation, and the internal topics of groups and connect.
    ///
    /// Errors: INVALID_TOPIC_EXCEPTION (17) for a bad or colliding name,
    /// TOPIC_ALREADY_EXISTS (36), INVALID_PARTITIONS (37) outside 1..=10000,
    /// INVALID_REPLICATION_FACTOR (38) outside 1..=live brokers,
    /// INVALID_REPLICA_ASSIGNMENT (39) for a bad assignment, INVALID_CONFIG (40),
    /// UNKNOWN_SERVER_ERROR (-1) when the metadata or a partition log cannot be written.
    pub fn create_topic(&self, spec: NewTopic) -> Result<TopicMeta, TopicError> {
        let id = Uuid::new_v4();
        let mut attempts = 0;
        let image = loop {
            attempts += 1;
            match self.update(|image| {
                plan_create(image, &spec, id).map(|t| vec![MetadataRecord::TopicCreated(t)])
            }) {
                Ok(image) => break image,
                // Another node's change was committed first and ours was refused on every
                // node (a race, e.g. two creators of one name): plan again on the image
                // that now holds it, so the loser gets TOPIC_ALREADY_EXISTS (36), not -1.
                Err(UpdateError::NotApplied(MetadataError::Invalid(_)))
                    if attempts < CREATE_ATTEMPTS => {}
                Err(e) => return Err(server_error(&spec.name, "create topic", e)),
            }
        };
        let meta = image
            .topic_by_id(id)
            .cloned()
            .ok_or_else(|| TopicError::unknown(&spec.name))?;
        tracing::info!(topic = %meta.name, partitions = meta.partitions, "created topic");
        Ok(meta)
    }

    /// The topic `spec.name` as it is, created from `spec` if it does not exist (the
    /// internal topics: a concurrent creator may win, its topic is returned). An existing
    /// topic is returned as it is, whatever `spec` says.
    ///
    /// Errors: as [`Metadata::create_topic`], except TOPIC_ALREADY_EXISTS.
    pub fn ensure_topic(&self, spec: NewTopic) -> Result<TopicMeta, TopicError> {
        if let Some(t) = self.image().topic(&spec.name) {
            return Ok(t.clone());
        }
        let name = spec.name.clone();
        match self.create_topic(spec) {
            Err(e) if e.error == ResponseError::TopicAlreadyExists => self.topic(&name).ok_or(e),
            other => other,
        }
    }

    /// Validates growing `name` to `count` partitions without doing it
    /// (CreatePartitions `validate_only`).
    ///
    /// Errors: as [`Metadata::add_partitions`], except UNKNOWN_SERVER_ERROR.
    pub fn validate_add_partitions(
        &self,
        name: &str,
        count: i32,
        assignment: &[Vec<i32>],
    ) -> Result<(), TopicError> {
        plan_grow(&self.image(), name, count, assignment).map(|_| ())
    }

    /// Grows `name` to `count` partitions (never shrinks): records the new partitions,
    /// placed over the live brokers at the topic's replication factor or as `assignment`
    /// says (one replica list per new partition; empty: placed), and has the replica
    /// manager open their logs where hosted, all or nothing. Returns the topic as grown.
    /// INVALID_REPLICATION_FACTOR (38) when fewer brokers are live than the topic's
    /// replication factor, INVALID_REPLICA_ASSIGNMENT (39) for a bad `assignment`.
    ///
    /// Errors: UNKNOWN_TOPIC_OR_PARTITION (3), INVALID_PARTITIONS (37) when `count` is not
    /// above the current count or above 10000, UNKNOWN_SERVER_ERROR (-1) when the
    /// metadata or a log cannot be written (the topic keeps its partitions).
    pub fn add_partitions(
        &self,
        name: &str,
        count: i32,
        assignment: &[Vec<i32>],
    ) -> Result<TopicMeta, TopicError> {
        let mut from = 0;
        let image = self
            .update(|image| {
                let (topic_id, partitions) = plan_grow(image, name, count, assignment)?;
                from = image.topic(name).map_or(0, |t| t.partitions);
                Ok(vec![MetadataRecord::PartitionsAdded {
                    topic_id,
                    partitions,
                    first_partition: Some(from),
                }])
            })
            .map_err(|e| server_error(name, "add partitions", e))?;
        let meta = image
            .topic(name)
            .cloned()
            .ok_or_else(|| TopicError::unknown(name))?;
        tracing::info!(topic = name, from, to = count, "added partitions");
        Ok(meta)
    }

    /// Validates the overrides `f` computes for `name` without applying them
    /// (AlterConfigs and IncrementalAlterConfigs `validate_only`).
    ///
    /// Errors: as [`Metadata::alter_topic_configs`], except UNKNOWN_SERVER_ERROR.
    pub fn validate_topic_configs(
        &self,
        name: &str,
        f: impl FnOnce(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, TopicError>,
    ) -> Result<(), TopicError> {
        plan_configs(&self.image(), name, f).map(|_| ())
    }

    /// Replaces the config overrides of `name` with what `f` computes from the current
    /// ones (validated like CreateTopics), records them and has the replica manager apply
    /// them to the live partitions. `f` runs with metadata changes serialised, so two
    /// concurrent alters apply one after the other (no lost update, no stale partition).
    ///
    /// Errors: UNKNOWN_TOPIC_OR_PARTITION (3), INVALID_CONFIG (40), whatever `f` returns,
    /// UNKNOWN_SERVER_ERROR (-1) when the metadata cannot be written.
    pub fn alter_topic_configs(
        &self,
        name: &str,
        f: impl FnOnce(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, TopicError>,
    ) -> Result<TopicMeta, TopicError> {
        let image = self
            .update(|image| {
                let (topic_id, configs) = plan_configs(image, name, f)?;
                Ok(vec![MetadataRecord::TopicConfigsChanged {
                    topic_id,
                    configs,
                }])
            })
            .map_err(|e| server_error(name, "alter topic configs", e))?;
        let meta = image
            .topic(name)
            .cloned()
            .ok_or_else(|| TopicError::unknown(name))?;
        tracing::info!(topic = name, configs = ?meta.configs, "altered topic configs");
        Ok(meta)
    }

    /// Replaces the dynamic configs of broker resource `resource` ("" the cluster default,
    /// "<node id>" one broker) with what `f` computes from the current ones, as one
    /// [`MetadataRecord::BrokerConfigsChanged`] (Kafka: `ConfigRecord`s of resource type
    /// BROKER, KIP-226), so every broker applies the cluster default and a restart keeps
    /// them. `f` runs with metadata changes serialised (no lost update) and checks the
    /// new set; with `validate_only` nothing is written.
    ///
    /// Errors: whatever `f` returns, UNKNOWN_SERVER_ERROR (-1) when the metadata cannot
    /// be written.
    pub fn alter_broker_configs(
        &self,
        resource: &str,
        validate_only: bool,
        f: impl FnOnce(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, TopicError>,
    ) -> Result<(), TopicError> {
        let empty = BTreeMap::new();
        if validate_only {
            let image = self.image();
            return f(image.broker_configs(resource).unwrap_or(&empty)).map(|_| ());
        }
        self.update(|image| {
            let configs = f(image.broker_configs(resource).unwrap_or(&empty))?;
            if image.broker_configs(resource).unwrap_or(&empty) == &configs {
                return Ok(Vec::new());
            }
            Ok(vec![MetadataRecord::BrokerConfigsChanged {
                resource: resource.to_string(),
                configs,
            }])
        })
        .map_err(|e| server_error(resource, "alter broker configs", e))?;
        tracing::info!(resource, "altered dynamic broker configs");
        Ok(())
    }

    /// Deletes the topic with id `id`: records the deletion, then the replica manager
    /// closes its partitions and deletes their directories. Returns the deleted topic.
    /// (Whether it may be deleted — internal topics, `delete.topic.enable` — is the
    /// caller's question.)
    ///
    /// Errors: UNKNOWN_TOPIC_ID (100) when no topic has that id, UNKNOWN_SERVER_ERROR (-1)
    /// when the metadata cannot be written (the topic stays) or a directory cannot be
    /// removed (the topic is gone; the message names the directory).
    pub fn delete_topic(&self, id: Uuid) -> Result<TopicMeta, TopicError> {
        let mut deleted = None;
        self.update(|image| {
            let t = image.topic_by_id(id).ok_or_else(|| {
                TopicError::new(
                    ResponseError::UnknownTopicId,
                    format!("No topic with id {id}."),
                )
            })?;
            deleted = Some(t.clone());
            Ok(vec![MetadataRecord::TopicDeleted { topic_id: id }])
        })
        .map_err(|e| {
            let name = deleted.as_ref().map_or("", |t| t.name.as_str());
            server_error(name, "delete topic", e)
        })?;
        let meta = deleted.ok_or_else(|| {
            TopicError::new(
                ResponseError::UnknownTopicId,
                format!("No topic with id {id}."),
            )
        })?;
        tracing::info!(topic = %meta.name, "deleted topic");
        Ok(meta)
    }
}
