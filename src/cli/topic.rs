//! `weir topic`: create, list, describe, alter and delete topics, as Kafka's
//! `kafka-topics.sh` does (and `kafka-configs.sh --alter --entity-type topics` for config
//! changes). CreateTopics, CreatePartitions, DeleteTopics and AlterConfigs are spoken
//! directly (`wire.rs`): librdkafka's admin client (rdkafka 0.39) gives only their error
//! code and drops the broker's `error_message`, which says what was wrong (the config key
//! and value refused, the broker an assignment names); for AlterConfigs it reports
//! success whatever the broker said. Metadata and DescribeConfigs go through librdkafka's
//! admin client; `describe` also sends one Metadata v10+ directly for the topic ids,
//! which librdkafka does not expose (`TopicId: -`, with a warning, when that fails).
//! `delete-records` uses librdkafka's DeleteRecords, which routes each partition to its
//! leader.
//!
//! Output follows `kafka-topics.sh`: `Created topic NAME.` on create, one name per line on
//! list, the tab-separated describe layout; alter and delete print nothing on success.
//! Errors carry Kafka's error name, its code and the broker's message
//! (`TOPIC_ALREADY_EXISTS (36): Topic 'orders' already exists.`, the one format of
//! `wire::error_text`), or librdkafka's description where librdkafka made the request
//! (`UNKNOWN_TOPIC_OR_PARTITION: Unknown topic or partition`).
//!
//! `alter --add-config/--delete-config` reads the topic's current overrides
//! (DescribeConfigs, source DYNAMIC_TOPIC_CONFIG), merges the changes and sends the whole
//! set with AlterConfigs: rdkafka 0.39 has no IncrementalAlterConfigs (nor does this
//! command speak it yet), and AlterConfigs replaces every override. Two concurrent
//! `alter`s of one topic may thus lose one change (as `kafka-configs.sh` with old
//! brokers). A key DescribeConfigs does not list is refused before anything is sent
//! (INVALID_CONFIG, the broker's wording).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use kafka_protocol::messages::alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::{
    AlterConfigsRequest, ApiKey, ApiVersionsResponse, CreatePartitionsRequest, CreateTopicsRequest,
    DeleteTopicsRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use rdkafka::admin::{
    AdminClient, AdminOptions, ConfigResource, ConfigSource, OwnedResourceSpecifier,
    ResourceSpecifier,
};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::metadata::{Metadata, MetadataTopic};

use super::client::{self, CliContext, KafkaErrorText};
use super::wire::{error_text, version_of, Conn};
use super::ClientArgs;

/// How long the broker may take to finish a topic operation (Kafka's `timeout.ms` in
/// CreateTopics/DeleteTopics/CreatePartitions, and librdkafka's admin operations).
const OPERATION_TIMEOUT: Duration = Duration::from_secs(30);

/// ConfigResource type TOPIC in DescribeConfigs/AlterConfigs.
const TOPIC_RESOURCE_TYPE: i8 = 2;

/// [`OPERATION_TIMEOUT`] as the requests' `timeout_ms`.
const OPERATION_TIMEOUT_MS: i32 = 30_000;

/// How long the client waits for the broker's answer to an admin request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(40);

/// Topic subcommands.
#[derive(Debug, Subcommand)]
pub(super) enum TopicCommand {
    /// Create a topic; prints `Created topic NAME.`.
    Create(CreateArgs),
    /// List topic names, one per line, sorted.
    List(ListArgs),
    /// Describe a topic (or every topic): partitions, leaders, replicas, ISR, configs.
    Describe(DescribeArgs),
    /// Add partitions to a topic and/or change its config overrides.
    Alter(AlterArgs),
    /// Delete a topic.
    Delete(DeleteArgs),
    /// Delete records below an offset (kafka-delete-records.sh): moves each partition's
    /// log start offset; prints the new low watermark per partition.
    #[command(name = "delete-records")]
    DeleteRecords(DeleteRecordsArgs),
}

/// `weir topic create` options (as `kafka-topics.sh --create`).
#[derive(Debug, Args)]
pub(super) struct CreateArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Topic name.
    pub name: String,
    /// Number of partitions; the broker's `num.partitions` if absent.
    #[arg(short = 'p', long)]
    pub partitions: Option<i32>,
    /// Replication factor; the broker's `default.replication.factor` if absent.
    #[arg(short = 'r', long = "replication-factor")]
    pub replication_factor: Option<i32>,
    /// Topic config override KEY=VALUE (e.g. cleanup.policy=compact); repeatable.
    #[arg(short = 'c', long = "config", value_name = "KEY=VALUE", value_parser = client::parse_key_value)]
    pub configs: Vec<(String, String)>,
    /// Succeed without doing anything if the topic already exists.
    #[arg(long = "if-not-exists")]
    pub if_not_exists: bool,
}

/// `weir topic list` options.
#[derive(Debug, Args)]
pub(super) struct ListArgs {
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `weir topic describe` options.
#[derive(Debug, Args)]
pub(super) struct DescribeArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Topic name; every topic if absent.
    pub name: Option<String>,
    /// Only partitions with fewer in-sync replicas than replicas (kafka-topics.sh's
    /// `--under-replicated-partitions`); partition lines only.
    #[arg(
        long = "under-replicated-partitions",
        visible_alias = "under-replicated"
    )]
    pub under_replicated: bool,
    /// Only partitions with no leader (kafka-topics.sh's `--unavailable-partitions`);
    /// partition lines only.
    #[arg(long = "unavailable-partitions", visible_alias = "unavailable")]
    pub unavailable: bool,
}

/// `weir topic alter` options (as `kafka-topics.sh --alter` and `kafka-configs.sh
/// --alter --entity-type topics`). At least one option is required.
#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("change")
        .required(true)
        .multiple(true)
        .args(["partitions", "add_config", "delete_config"])
))]
pub(super) struct AlterArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Topic name.
    pub name: String,
    /// New total number of partitions (partitions can only be added).
    #[arg(short = 'p', long)]
    pub partitions: Option<i32>,
    /// Set a topic config override KEY=VALUE (e.g. retention.ms=60000); repeatable.
    #[arg(long = "add-config", value_name = "KEY=VALUE", value_parser = client::parse_key_value)]
    pub add_config: Vec<(String, String)>,
    /// Remove a topic config override (the broker's value applies again); repeatable.
    #[arg(long = "delete-config", value_name = "KEY")]
    pub delete_config: Vec<String>,
}

/// `weir topic delete` options.
#[derive(Debug, Args)]
pub(super) struct DeleteArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Topic name.
    pub name: String,
    /// Succeed without doing anything if the topic does not exist.
    #[arg(long = "if-exists")]
    pub if_exists: bool,
}

/// `weir topic delete-records` options: `TOPIC --partition P --offset O`, or
/// kafka-delete-records.sh's `--offset-json-file` (`{"partitions": [{"topic": "t",
/// "partition": 0, "offset": 3}], "version": 1}`).
#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("what")
        .required(true)
        .args(["name", "offset_json_file"])
))]
pub(super) struct DeleteRecordsArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Topic name (with `--partition` and `--offset`).
    #[arg(requires_all = ["partition", "offset"])]
    pub name: Option<String>,
    /// Partition index.
    #[arg(long)]
    pub partition: Option<i32>,
    /// Records below this offset are deleted; -1 means the high watermark (everything).
    #[arg(long, allow_negative_numbers = true)]
    pub offset: Option<i64>,
    /// kafka-delete-records.sh's JSON file of topics, partitions and offsets.
    #[arg(long = "offset-json-file", value_name = "FILE", conflicts_with_all = ["partition", "offset"])]
    pub offset_json_file: Option<std::path::PathBuf>,
}

/// Runs a topic subcommand.
///
/// Errors: the broker's error for the topic (Kafka's name and description), a connection
/// that cannot be made within the timeouts (with librdkafka's last connection error).
pub(super) fn run(cmd: TopicCommand) -> anyhow::Result<()> {
    match cmd {
        TopicCommand::Create(args) => create(args),
        TopicCommand::List(args) => list(args),
        TopicCommand::Describe(args) => describe(args),
        TopicCommand::Alter(args) => alter(args),
        TopicCommand::Delete(args) => delete(args),
        TopicCommand::DeleteRecords(args) => delete_records(args),
    }
}

/// An admin client that has reached the cluster, and the metadata it got: fetching it first
/// means an unreachable broker is reported within the metadata timeout rather than after
/// [`REQUEST_TIMEOUT`] as a bare "timed out".
fn admin_client(client: &ClientArgs) -> anyhow::Result<(AdminClient<CliContext>, Metadata)> {
    let admin: AdminClient<CliContext> = client::base_config(client)
        .create_with_context(CliContext::default())
        .map_err(|e| anyhow::anyhow!("cannot create the admin client: {}", KafkaErrorText(&e)))?;
    let metadata = client::fetch_metadata(admin.inner(), admin.inner().context(), client)?;
    Ok((admin, metadata))
}

fn admin_options() -> AdminOptions {
    AdminOptions::new()
        .operation_timeout(Some(OPERATION_TIMEOUT))
        .request_timeout(Some(REQUEST_TIMEOUT))
}

/// What happened to the one topic an admin request named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    /// The broker did it.
    Done,
    /// The broker answered with the error the caller tolerates (`--if-exists` and
    /// `--if-not-exists`): nothing to do.
    AlreadySo,
}

/// A connection to the first bootstrap broker that answers, with the versions it
/// offers; each answer may take [`REQUEST_TIMEOUT`] (the broker answers a topic change
/// once it is committed).
fn wire_session(client: &ClientArgs) -> anyhow::Result<(Conn, ApiVersionsResponse)> {
    let (mut conn, versions) = Conn::bootstrap(&client.bootstrap_server)?;
    conn.set_read_timeout(REQUEST_TIMEOUT)?;
    Ok((conn, versions))
}

/// The version of `key` to send: the highest both speak, at most `ours`.
fn version(versions: &ApiVersionsResponse, key: ApiKey, ours: i16) -> anyhow::Result<i16> {
    version_of(versions, key, ours)
        .with_context(|| format!("the broker does not offer {key:?} (key {})", key as i16))
}

/// The outcome for `name` out of its (name, error code, error message) results, with the
/// broker's error text; `tolerated` is an error that means [`Effect::AlreadySo`].
fn single_result<'r>(
    results: impl IntoIterator<Item = (&'r str, i16, Option<&'r StrBytes>)>,
    name: &str,
    tolerated: Option<ResponseError>,
) -> anyhow::Result<Effect> {
    for (topic, code, message) in results {
        if topic != name {
            continue;
        }
        if code == 0 {
            return Ok(Effect::Done);
        }
        if tolerated.is_some_and(|t| t.code() == code) {
            return Ok(Effect::AlreadySo);
        }
        anyhow::bail!("topic '{name}': {}", error_text(code, message));
    }
    anyhow::bail!("topic '{name}': the broker's response did not mention it")
}

fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

fn create(args: CreateArgs) -> anyhow::Result<()> {
    let (mut conn, versions) = wire_session(&args.client)?;
    // v4+: -1 asks the broker for its default (KIP-464).
    let v = version(&versions, ApiKey::CreateTopics, 7)?;
    let replication_factor = match args.replication_factor {
        None => -1,
        Some(r) => {
            i16::try_from(r).with_context(|| format!("--replication-factor {r} is out of range"))?
        }
    };
    let configs = args
        .configs
        .iter()
        .map(|(key, value)| {
            CreatableTopicConfig::default()
                .with_name(StrBytes::from_string(key.clone()))
                .with_value(Some(StrBytes::from_string(value.clone())))
        })
        .collect();
    let request = CreateTopicsRequest::default()
        .with_timeout_ms(OPERATION_TIMEOUT_MS)
        .with_topics(vec![CreatableTopic::default()
            .with_name(topic_name(&args.name))
            .with_num_partitions(args.partitions.unwrap_or(-1))
            .with_replication_factor(replication_factor)
            .with_configs(configs)]);
    let response = conn
        .call(&request, v)
        .with_context(|| format!("create topic '{}'", args.name))?;
    let results = response
        .topics
        .iter()
        .map(|t| (t.name.0.as_str(), t.error_code, t.error_message.as_ref()));
    let tolerated = args
        .if_not_exists
        .then_some(ResponseError::TopicAlreadyExists);
    // As kafka-topics.sh: --if-not-exists on an existing topic prints nothing.
    match single_result(results, &args.name, tolerated)? {
        Effect::Done => write_stdout(&format!("Created topic {}.\n", args.name))?,
        Effect::AlreadySo => {}
    }
    Ok(())
}

fn alter(args: AlterArgs) -> anyhow::Result<()> {
    if let Some(p) = args.partitions.filter(|p| *p <= 0) {
        anyhow::bail!("--partitions must be positive, got {p}");
    }
    let (admin, metadata) = admin_client(&args.client)?;
    client::find_topic(&metadata, &args.name)?;
    if !args.add_config.is_empty() || !args.delete_config.is_empty() {
        alter_configs(&admin, &args)?;
    }
    if let Some(count) = args.partitions {
        add_partitions(&args.client, &args.name, count)?;
    }
    Ok(())
}

/// Current overrides + `--add-config` − `--delete-config`, sent whole with AlterConfigs
/// (see the module doc for why).
fn alter_configs(admin: &AdminClient<CliContext>, args: &AlterArgs) -> anyhow::Result<()> {
    let name = args.name.as_str();
    let current = describe_topic_configs(admin, name)?;
    let known: Vec<&str> = current.entries.iter().map(|e| e.name.as_str()).collect();
    for (key, _) in &args.add_config {
        if !known.contains(&key.as_str()) {
            anyhow::bail!(
                "alter configs of topic '{name}': {}: Unknown topic config name: {key}",
                client::error_name(RDKafkaErrorCode::InvalidConfig)
            );
        }
    }
    let mut configs = dynamic_topic_configs(current);
    for key in &args.delete_config {
        // As kafka-configs.sh: deleting an override that is not there is a mistake.
        if configs.remove(key).is_none() {
            anyhow::bail!("topic '{name}': --delete-config {key}: no such override is set");
        }
    }
    for (key, value) in &args.add_config {
        configs.insert(key.clone(), value.clone());
    }
    let (mut conn, versions) = wire_session(&args.client)?;
    let v = version(&versions, ApiKey::AlterConfigs, 2)?;
    let alterable = configs
        .iter()
        .map(|(key, value)| {
            AlterableConfig::default()
                .with_name(StrBytes::from_string(key.clone()))
                .with_value(Some(StrBytes::from_string(value.clone())))
        })
        .collect();
    let request =
        AlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
            .with_resource_type(TOPIC_RESOURCE_TYPE)
            .with_resource_name(StrBytes::from_string(name.to_string()))
            .with_configs(alterable)]);
    let response = conn
        .call(&request, v)
        .with_context(|| format!("alter configs of topic '{name}'"))?;
    let results = response.responses.iter().map(|r| {
        (
            r.resource_name.as_str(),
            r.error_code,
            r.error_message.as_ref(),
        )
    });
    single_result(results, name, None).map(|_| ())
}

/// Every topic-level config of `name` (DescribeConfigs).
fn describe_topic_configs(
    admin: &AdminClient<CliContext>,
    name: &str,
) -> anyhow::Result<ConfigResource> {
    let described = client::block_on(
        admin.describe_configs([&ResourceSpecifier::Topic(name)], &admin_options()),
    )?
    .map_err(|e| {
        anyhow::anyhow!(
            "describe configs of topic '{name}': {}",
            admin.inner().context().explain(&e)
        )
    })?;
    match described.into_iter().next() {
        Some(Ok(c)) => Ok(c),
        Some(Err(code)) => anyhow::bail!(
            "describe configs of topic '{name}': {}",
            client::code_text(code)
        ),
        None => anyhow::bail!(
            "describe configs of topic '{name}': the broker's response did not mention it"
        ),
    }
}

/// The overrides set on the topic (DescribeConfigs source DYNAMIC_TOPIC_CONFIG).
fn dynamic_topic_configs(resource: ConfigResource) -> BTreeMap<String, String> {
    resource
        .entries
        .into_iter()
        .filter(|e| e.source == ConfigSource::DynamicTopic)
        .filter_map(|e| e.value.map(|v| (e.name, v)))
        .collect()
}

fn add_partitions(client: &ClientArgs, name: &str, count: i32) -> anyhow::Result<()> {
    let (mut conn, versions) = wire_session(client)?;
    let v = version(&versions, ApiKey::CreatePartitions, 3)?;
    let request = CreatePartitionsRequest::default()
        .with_timeout_ms(OPERATION_TIMEOUT_MS)
        .with_topics(vec![CreatePartitionsTopic::default()
            .with_name(topic_name(name))
            .with_count(count)
            .with_assignments(None)]);
    let response = conn
        .call(&request, v)
        .with_context(|| format!("alter topic '{name}'"))?;
    let results = response
        .results
        .iter()
        .map(|r| (r.name.0.as_str(), r.error_code, r.error_message.as_ref()));
    single_result(results, name, None).map(|_| ())
}

fn delete(args: DeleteArgs) -> anyhow::Result<()> {
    let (mut conn, versions) = wire_session(&args.client)?;
    // v0-v5 name topics in `topic_names` (v6 in `topics`, with ids); v5+ carry the message.
    let v = version(&versions, ApiKey::DeleteTopics, 5)?;
    let request = DeleteTopicsRequest::default()
        .with_timeout_ms(OPERATION_TIMEOUT_MS)
        .with_topic_names(vec![topic_name(&args.name)]);
    let response = conn
        .call(&request, v)
        .with_context(|| format!("delete topic '{}'", args.name))?;
    let results = response.responses.iter().map(|r| {
        (
            r.name.as_ref().map_or("", |n| n.0.as_str()),
            r.error_code,
            r.error_message.as_ref(),
        )
    });
    let tolerated = args
        .if_exists
        .then_some(ResponseError::UnknownTopicOrPartition);
    single_result(results, &args.name, tolerated).map(|_| ())
}

/// kafka-delete-records.sh's offset JSON.
#[derive(Debug, serde::Deserialize)]
struct OffsetJson {
    partitions: Vec<OffsetJsonEntry>,
}

#[derive(Debug, serde::Deserialize)]
struct OffsetJsonEntry {
    topic: String,
    partition: i32,
    offset: i64,
}

/// DeleteRecords through librdkafka's admin client, which sends each partition to its
/// leader. Prints, as kafka-delete-records.sh, one line per partition:
/// `partition: TOPIC-P\tlow_watermark: N` or `partition: TOPIC-P\terror: NAME: text`
/// (DeleteRecords carries no error message; the text is Kafka's description of the
/// code); fails when any partition failed.
fn delete_records(args: DeleteRecordsArgs) -> anyhow::Result<()> {
    let wanted: Vec<(String, i32, i64)> = match (&args.offset_json_file, &args.name) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("read {}", path.display()))?;
            let json: OffsetJson = serde_json::from_str(&text)
                .with_context(|| format!("parse the offset JSON in {}", path.display()))?;
            json.partitions
                .into_iter()
                .map(|e| (e.topic, e.partition, e.offset))
                .collect()
        }
        (None, Some(name)) => vec![(
            name.clone(),
            args.partition.context("--partition is required")?,
            args.offset.context("--offset is required")?,
        )],
        (None, None) => anyhow::bail!("give TOPIC --partition P --offset O or --offset-json-file"),
    };
    if wanted.is_empty() {
        anyhow::bail!("no partition to delete records from");
    }
    let mut tpl = rdkafka::TopicPartitionList::new();
    for (topic, partition, offset) in &wanted {
        let offset = match *offset {
            -1 => rdkafka::Offset::End,
            o if o >= 0 => rdkafka::Offset::Offset(o),
            o => anyhow::bail!("offset {o} of {topic}-{partition}: must be -1 or at least 0"),
        };
        tpl.add_partition_offset(topic, *partition, offset)
            .map_err(|e| anyhow::anyhow!("{topic}-{partition}: {}", KafkaErrorText(&e)))?;
    }
    let (admin, _metadata) = admin_client(&args.client)?;
    let result = client::block_on(admin.delete_records(&tpl, &admin_options()))?
        .map_err(|e| anyhow::anyhow!("delete records: {}", admin.inner().context().explain(&e)))?;
    let mut out = String::new();
    let mut failed = 0;
    for (topic, partition, _) in &wanted {
        let line = match result.find_partition(topic, *partition) {
            None => {
                failed += 1;
                "error: the broker's response did not mention it".to_string()
            }
            Some(elem) => match (elem.error(), elem.offset()) {
                (Ok(()), rdkafka::Offset::Offset(low)) => format!("low_watermark: {low}"),
                (Ok(()), other) => format!("low_watermark: {other:?}"),
                (Err(e), _) => {
                    failed += 1;
                    format!("error: {}", KafkaErrorText(&e))
                }
            },
        };
        out.push_str(&format!("partition: {topic}-{partition}\t{line}\n"));
    }
    write_stdout(&out)?;
    if failed > 0 {
        anyhow::bail!(
            "delete records failed for {failed} of {} partitions",
            wanted.len()
        );
    }
    Ok(())
}

fn list(args: ListArgs) -> anyhow::Result<()> {
    let (_admin, metadata) = admin_client(&args.client)?;
    let mut names: Vec<&str> = metadata.topics().iter().map(|t| t.name()).collect();
    names.sort_unstable();
    let mut out = String::new();
    for name in names {
        out.push_str(name);
        out.push('\n');
    }
    write_stdout(&out)?;
    Ok(())
}

fn describe(args: DescribeArgs) -> anyhow::Result<()> {
    let (admin, metadata) = admin_client(&args.client)?;
    let mut topics: Vec<&MetadataTopic> = match &args.name {
        Some(name) => vec![client::find_topic(&metadata, name)?],
        None => metadata.topics().iter().collect(),
    };
    topics.sort_unstable_by_key(|t| t.name());
    if topics.is_empty() {
        return Ok(());
    }

    let specifiers: Vec<ResourceSpecifier<'_>> = topics
        .iter()
        .map(|t| ResourceSpecifier::Topic(t.name()))
        .collect();
    let configs = client::block_on(admin.describe_configs(&specifiers, &admin_options()))?
        .map_err(|e| {
            anyhow::anyhow!(
                "describe topic configs: {}",
                admin.inner().context().explain(&e)
            )
        })?;

    let names: Vec<&str> = topics.iter().map(|t| t.name()).collect();
    // The broker that answered librdkafka's Metadata first: it is reachable (a bootstrap
    // list may start with a node that is down or cut off).
    let answered = metadata
        .brokers()
        .iter()
        .find(|b| b.id() == metadata.orig_broker_id())
        .map(|b| format!("{}:{}", b.host(), b.port()));
    let candidates = match answered {
        Some(addr) => format!("{addr},{}", args.client.bootstrap_server),
        None => args.client.bootstrap_server.clone(),
    };
    let ids = match topic_ids(&candidates, &names) {
        Ok(ids) => ids,
        Err(e) => {
            // The id is the one field librdkafka cannot give; the rest is still right.
            eprintln!("weir: warning: no topic ids (TopicId: -): {e:#}");
            BTreeMap::new()
        }
    };
    let mut out = String::new();
    for (i, topic) in topics.iter().enumerate() {
        // Results come in request order; look the name up anyway rather than trust it.
        let by_name = configs.iter().find_map(|c| match c {
            Ok(c) if c.specifier == OwnedResourceSpecifier::Topic(topic.name().to_string()) => {
                Some(c)
            }
            _ => None,
        });
        let config = match (by_name, configs.get(i)) {
            (Some(c), _) => c,
            (None, Some(Err(code))) => anyhow::bail!(
                "describe configs of topic '{}': {}",
                topic.name(),
                client::code_text(*code)
            ),
            (None, _) => anyhow::bail!(
                "describe configs of topic '{}': the broker's response did not mention it",
                topic.name()
            ),
        };
        let mut set: Vec<String> = config
            .entries
            .iter()
            .filter(|e| e.source == ConfigSource::DynamicTopic)
            .map(|e| format!("{}={}", e.name, e.value.as_deref().unwrap_or("null")))
            .collect();
        set.sort_unstable();
        let filter = PartitionFilter {
            under_replicated: args.under_replicated,
            unavailable: args.unavailable,
        };
        let id = ids.get(topic.name()).map_or("-", String::as_str);
        describe_topic(&mut out, topic, id, &set.join(","), filter);
    }
    write_stdout(&out)?;
    Ok(())
}

/// Which partitions `describe` lists (kafka-topics.sh's `--under-replicated-partitions`
/// and `--unavailable-partitions`; either set: only partition lines, no topic line).
#[derive(Debug, Clone, Copy, Default)]
struct PartitionFilter {
    under_replicated: bool,
    unavailable: bool,
}

impl PartitionFilter {
    fn any(self) -> bool {
        self.under_replicated || self.unavailable
    }

    /// Whether a partition with this leader, replica count and ISR size is listed.
    fn lists(self, leader: i32, replicas: usize, isr: usize) -> bool {
        !self.any() || (self.under_replicated && isr < replicas) || (self.unavailable && leader < 0)
    }
}

/// The topic id of each of `names`, as kafka-topics.sh prints it (Kafka's
/// `Uuid.toString`: URL-safe base64 of the 16 bytes, no padding), from a Metadata v10+
/// request spoken directly (KIP-516: topic ids in Metadata from v10): librdkafka does
/// not expose the id. A topic the broker answers with an error or the zero id is left
/// out. `bootstrap` is tried in order. Errors: no broker answers, or it offers no
/// Metadata v10+.
fn topic_ids(bootstrap: &str, names: &[&str]) -> anyhow::Result<BTreeMap<String, String>> {
    use base64::Engine as _;
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::MetadataRequest;
    let (mut conn, versions) = Conn::bootstrap(bootstrap)?;
    let v = version(&versions, ApiKey::Metadata, 12)?;
    if v < 10 {
        anyhow::bail!("the broker offers Metadata up to v{v}; topic ids need v10");
    }
    let request = MetadataRequest::default()
        .with_allow_auto_topic_creation(false)
        .with_topics(Some(
            names
                .iter()
                .map(|n| MetadataRequestTopic::default().with_name(Some(topic_name(n))))
                .collect(),
        ));
    let response = conn.call(&request, v).context("Metadata for topic ids")?;
    Ok(response
        .topics
        .into_iter()
        .filter(|t| t.error_code == 0 && !t.topic_id.is_nil())
        .filter_map(|t| {
            let name = t.name?.0.to_string();
            let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(t.topic_id.as_bytes());
            Some((name, id))
        })
        .collect())
}

/// Appends `kafka-topics.sh --describe`'s layout for one topic to `out`; `topic_id` is
/// from [`topic_ids`], `-` when unknown.
fn describe_topic(
    out: &mut String,
    topic: &MetadataTopic,
    topic_id: &str,
    configs: &str,
    filter: PartitionFilter,
) {
    let mut partitions: Vec<_> = topic.partitions().iter().collect();
    partitions.sort_unstable_by_key(|p| p.id());
    let replication_factor = partitions.first().map_or(0, |p| p.replicas().len());
    if !filter.any() {
        out.push_str(&format!(
            "Topic: {}\tTopicId: {}\tPartitionCount: {}\tReplicationFactor: {}\tConfigs: {}\n",
            topic.name(),
            topic_id,
            partitions.len(),
            replication_factor,
            configs
        ));
    }
    for p in partitions {
        if !filter.lists(p.leader(), p.replicas().len(), p.isr().len()) {
            continue;
        }
        let leader = if p.leader() < 0 {
            "none".to_string()
        } else {
            p.leader().to_string()
        };
        out.push_str(&format!(
            "\tTopic: {}\tPartition: {}\tLeader: {}\tReplicas: {}\tIsr: {}\n",
            topic.name(),
            p.id(),
            leader,
            join_ids(p.replicas()),
            join_ids(p.isr())
        ));
    }
}

fn join_ids(ids: &[i32]) -> String {
    ids.iter()
        .map(|id| id.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Writes to stdout; a closed pipe (`weir topic list | head`) ends quietly instead of
/// panicking as `print!` does.
fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(e.into()),
    }
}
