//! `weir config`: dynamic broker configs (KIP-226), as Kafka's `kafka-configs.sh
//! --entity-type brokers`. `alter --broker N` changes broker N's own dynamic configs
//! (`--entity-name N`), `alter --broker-default` the cluster-wide defaults every broker
//! applies (`--entity-default`); `--add-config KEY=VALUE` and `--delete-config KEY`
//! are repeatable. `describe` prints the dynamic configs of that resource, one
//! `KEY=VALUE` per line (`--all`: every broker key of broker N with its source).
//!
//! Speaks IncrementalAlterConfigs (v0–v1: SET and DELETE, so changes to other keys made
//! meanwhile are kept) and DescribeConfigs directly (`wire.rs`); a broker resource goes
//! to that broker (its address from Metadata), the default resource to any broker.
//! Topic configs stay with `weir topic alter`.
//!
//! Errors are the broker's, in the one format of `wire::error_text`
//! (`INVALID_REQUEST (42): Cannot update these configs dynamically: Set(num.partitions)`).

use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, DescribeConfigsRequest, IncrementalAlterConfigsRequest,
    MetadataRequest,
};
use kafka_protocol::protocol::StrBytes;

use super::client;
use super::wire::{error_text, version_of, Conn};
use super::ClientArgs;

/// ConfigResource type BROKER.
const BROKER_RESOURCE_TYPE: i8 = 4;

/// How long the broker may take to commit a change (it answers once it is committed).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// `weir config` subcommands.
#[derive(Debug, Subcommand)]
pub(super) enum ConfigCommand {
    /// Change dynamic broker configs (kafka-configs.sh --alter --entity-type brokers).
    Alter(AlterArgs),
    /// Print dynamic broker configs (kafka-configs.sh --describe --entity-type brokers).
    Describe(DescribeArgs),
}

/// Which broker resource: one broker, or the cluster-wide default.
#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("entity")
        .required(true)
        .args(["broker", "broker_default"])
))]
pub(super) struct Entity {
    /// A broker's node.id (kafka-configs.sh --entity-name N).
    #[arg(long)]
    pub broker: Option<u32>,
    /// The cluster-wide default every broker applies (kafka-configs.sh --entity-default).
    #[arg(long = "broker-default")]
    pub broker_default: bool,
}

impl Entity {
    /// The resource name: "" for the default, the id otherwise.
    fn resource_name(&self) -> String {
        self.broker.map(|b| b.to_string()).unwrap_or_default()
    }

    /// How a message names it.
    fn describe(&self) -> String {
        match self.broker {
            Some(b) => format!("broker {b}"),
            None => "the broker default".to_string(),
        }
    }
}

/// `weir config alter` options.
#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("change")
        .required(true)
        .multiple(true)
        .args(["add_config", "delete_config"])
))]
pub(super) struct AlterArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub entity: Entity,
    /// Set a dynamic config KEY=VALUE (e.g. log.retention.ms=60000); repeatable.
    #[arg(long = "add-config", value_name = "KEY=VALUE", value_parser = client::parse_key_value)]
    pub add_config: Vec<(String, String)>,
    /// Remove a dynamic config (the next layer's value applies again); repeatable.
    #[arg(long = "delete-config", value_name = "KEY")]
    pub delete_config: Vec<String>,
}

/// `weir config describe` options.
#[derive(Debug, Args)]
pub(super) struct DescribeArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub entity: Entity,
    /// Every broker key with its value and source, not only the dynamic ones (with
    /// --broker).
    #[arg(long, requires = "broker")]
    pub all: bool,
}

/// Runs a config subcommand.
///
/// Errors: the broker's error for the resource, a broker that cannot be reached.
pub(super) fn run(cmd: ConfigCommand) -> anyhow::Result<()> {
    match cmd {
        ConfigCommand::Alter(args) => alter(args),
        ConfigCommand::Describe(args) => describe(args),
    }
}

/// A connection to the broker the resource belongs to, with the versions it offers:
/// broker N itself (found in Metadata), or the first bootstrap broker for the default.
fn connect(client: &ClientArgs, entity: &Entity) -> anyhow::Result<(Conn, ApiVersionsResponse)> {
    let (mut conn, versions) = Conn::bootstrap(&client.bootstrap_server)?;
    let Some(id) = entity.broker else {
        conn.set_read_timeout(REQUEST_TIMEOUT)?;
        return Ok((conn, versions));
    };
    let v = version(&versions, ApiKey::Metadata, 4)?;
    let metadata = conn.call(&MetadataRequest::default().with_topics(Some(Vec::new())), v)?;
    let broker = metadata
        .brokers
        .iter()
        .find(|b| i64::from(b.node_id.0) == i64::from(id))
        .with_context(|| format!("broker {id} is not among the cluster's live brokers"))?;
    let (mut conn, versions) = Conn::open(&format!("{}:{}", broker.host.as_str(), broker.port))
        .with_context(|| format!("broker {id}"))?;
    conn.set_read_timeout(REQUEST_TIMEOUT)?;
    Ok((conn, versions))
}

/// The highest version of `key` both speak, at most `ours`.
fn version(versions: &ApiVersionsResponse, key: ApiKey, ours: i16) -> anyhow::Result<i16> {
    version_of(versions, key, ours)
        .with_context(|| format!("the broker does not offer {key:?} (key {})", key as i16))
}

fn alter(args: AlterArgs) -> anyhow::Result<()> {
    let (mut conn, versions) = connect(&args.client, &args.entity)?;
    let v = version(&versions, ApiKey::IncrementalAlterConfigs, 1)?;
    let set = args.add_config.iter().map(|(k, value)| {
        AlterableConfig::default()
            .with_name(StrBytes::from_string(k.clone()))
            .with_config_operation(0)
            .with_value(Some(StrBytes::from_string(value.clone())))
    });
    let delete = args.delete_config.iter().map(|k| {
        AlterableConfig::default()
            .with_name(StrBytes::from_string(k.clone()))
            .with_config_operation(1)
    });
    let request = IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(BROKER_RESOURCE_TYPE)
            .with_resource_name(StrBytes::from_string(args.entity.resource_name()))
            .with_configs(set.chain(delete).collect()),
    ]);
    let what = args.entity.describe();
    let response = conn
        .call(&request, v)
        .with_context(|| format!("alter configs of {what}"))?;
    let r = response.responses.first().with_context(|| {
        format!("alter configs of {what}: the broker's response did not mention it")
    })?;
    if r.error_code != 0 {
        anyhow::bail!(
            "alter configs of {what}: {}",
            error_text(r.error_code, r.error_message.as_ref())
        );
    }
    println!("Completed updating config for {what}.");
    Ok(())
}

fn describe(args: DescribeArgs) -> anyhow::Result<()> {
    let (mut conn, versions) = connect(&args.client, &args.entity)?;
    let v = version(&versions, ApiKey::DescribeConfigs, 4)?;
    let request =
        DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(BROKER_RESOURCE_TYPE)
            .with_resource_name(StrBytes::from_string(args.entity.resource_name()))
            .with_configuration_keys(None)]);
    let what = args.entity.describe();
    let response = conn
        .call(&request, v)
        .with_context(|| format!("describe configs of {what}"))?;
    let r = response.results.first().with_context(|| {
        format!("describe configs of {what}: the broker's response did not mention it")
    })?;
    if r.error_code != 0 {
        anyhow::bail!(
            "describe configs of {what}: {}",
            error_text(r.error_code, r.error_message.as_ref())
        );
    }
    let mut out = String::new();
    for c in &r.configs {
        // 2 DYNAMIC_BROKER_CONFIG, 3 DYNAMIC_DEFAULT_BROKER_CONFIG.
        let dynamic = matches!(c.config_source, 2 | 3);
        if !(args.all || dynamic) {
            continue;
        }
        let value = c.value.as_ref().map_or("null", |v| v.as_str());
        if args.all {
            out.push_str(&format!(
                "{}={value}\t{}\n",
                c.name.as_str(),
                source_name(c.config_source)
            ));
        } else {
            out.push_str(&format!("{}={value}\n", c.name.as_str()));
        }
    }
    print!("{out}");
    Ok(())
}

/// Kafka's name of a DescribeConfigs `config_source`.
fn source_name(code: i8) -> &'static str {
    match code {
        1 => "DYNAMIC_TOPIC_CONFIG",
        2 => "DYNAMIC_BROKER_CONFIG",
        3 => "DYNAMIC_DEFAULT_BROKER_CONFIG",
        4 => "STATIC_BROKER_CONFIG",
        5 => "DEFAULT_CONFIG",
        _ => "UNKNOWN",
    }
}
