//! `weir group`: list, describe, reset the offsets of and delete consumer groups, as
//! Kafka's `kafka-consumer-groups.sh` does, through librdkafka: ListGroups + DescribeGroups
//! (`rd_kafka_list_groups`), OffsetFetch and OffsetCommit from a consumer that has the
//! group's `group.id` but never subscribes (so it never joins the group), ListOffsets for
//! log start/end offsets, and the admin client's DeleteGroups.
//!
//! Output follows `kafka-consumer-groups.sh`: left-aligned columns at least 15 wide (the
//! reset plan: 30/30/10), the same headers and `-` for absent values, and the same notes on
//! stderr ("Consumer group 'g' has no active members."). Unlike Kafka, tables do not start
//! with a blank line.
//!
//! Never does: join a group, or talk to the broker other than through librdkafka.

use std::time::Duration;

use clap::{Args, Subcommand};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::groups::GroupInfo;
use rdkafka::metadata::Metadata;

use super::client::{self, CliContext, KafkaErrorText};
use super::ClientArgs;

mod describe;
mod reset;

/// How long one group request (ListGroups/DescribeGroups, OffsetFetch, OffsetCommit,
/// ListOffsets, DeleteGroups) may take before the command gives up.
const GROUP_REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// Topics that hold the broker's own state; their partitions are never shown as a
/// group's (Kafka's `Topic.INTERNAL_TOPICS`).
const INTERNAL_TOPICS: [&str; 2] = ["__consumer_offsets", "__transaction_state"];

/// Group states, as ListGroups names them (Kafka's `GroupState`: the classic protocol's,
/// and Assigning / Reconciling of consumer-protocol groups, KIP-848).
pub(super) const GROUP_STATES: [&str; 7] = [
    "Empty",
    "PreparingRebalance",
    "CompletingRebalance",
    "Stable",
    "Dead",
    "Assigning",
    "Reconciling",
];

/// Group subcommands.
#[derive(Debug, Subcommand)]
pub(super) enum GroupCommand {
    /// List groups and their state (GROUP STATE).
    List(ListArgs),
    /// Describe a group: committed offsets, log end offsets and lag per partition, with
    /// the member each partition is assigned to (or --members, --state).
    Describe(describe::DescribeArgs),
    /// Reset a group's committed offsets (only while the group has no members).
    ResetOffsets(reset::ResetArgs),
    /// Delete a group and its committed offsets (only while it has no members).
    Delete(DeleteArgs),
}

/// `weir group list` options (as `kafka-consumer-groups.sh --list --state`).
#[derive(Debug, Args)]
pub(super) struct ListArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Only groups in this state (Empty, PreparingRebalance, CompletingRebalance, Stable,
    /// Dead, and Assigning, Reconciling for consumer-protocol groups; any case);
    /// repeatable.
    #[arg(long = "state", value_name = "STATE", value_parser = parse_state)]
    pub states: Vec<String>,
    /// Show each group's type (classic or consumer, KIP-848) in a TYPE column; with
    /// values, only groups of those types (comma-separated, any case), as
    /// kafka-consumer-groups.sh --list --type.
    #[arg(long = "type", value_name = "TYPE", num_args = 0.., value_delimiter = ',', value_parser = parse_type)]
    pub types: Option<Vec<String>>,
}

/// `classic` or `consumer`, any case.
fn parse_type(text: &str) -> Result<String, String> {
    let t = text.trim().to_ascii_lowercase();
    match t.as_str() {
        "classic" | "consumer" => Ok(t),
        _ => Err(format!("unknown group type `{text}` (classic, consumer)")),
    }
}

/// `weir group delete` options (as `kafka-consumer-groups.sh --delete --group`).
#[derive(Debug, Args)]
pub(super) struct DeleteArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Group id.
    pub group: String,
}

/// Runs a group subcommand.
///
/// Errors: an unknown group (`Consumer group 'X' does not exist.`) for describe; a group
/// with members for reset-offsets and delete; the broker's error (Kafka's name and
/// description); a broker that cannot be reached within the timeouts.
pub(super) fn run(cmd: GroupCommand) -> anyhow::Result<()> {
    match cmd {
        GroupCommand::List(args) => list(args),
        GroupCommand::Describe(args) => describe::run(args),
        GroupCommand::ResetOffsets(args) => reset::run(args),
        GroupCommand::Delete(args) => delete(args),
    }
}

/// A state name in DescribeGroups' spelling, whatever case it was typed in.
fn parse_state(s: &str) -> Result<String, String> {
    GROUP_STATES
        .iter()
        .find(|known| known.eq_ignore_ascii_case(s))
        .map(|known| known.to_string())
        .ok_or_else(|| {
            format!(
                "unknown group state '{s}'; one of {}",
                GROUP_STATES.join(", ")
            )
        })
}

/// A consumer that has reached the cluster, and the metadata it got. With `group`, it
/// carries that `group.id` (for OffsetFetch/OffsetCommit) but never subscribes, so it
/// never joins the group; it never commits on its own either.
fn consumer(
    client: &ClientArgs,
    group: Option<&str>,
) -> anyhow::Result<(BaseConsumer<CliContext>, Metadata)> {
    let mut config = client::base_config(client);
    config
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    if let Some(group) = group {
        config.set("group.id", group);
    }
    let consumer: BaseConsumer<CliContext> = config
        .create_with_context(CliContext::default())
        .map_err(|e| anyhow::anyhow!("cannot create the consumer: {}", KafkaErrorText(&e)))?;
    let metadata = client::fetch_metadata(consumer.client(), consumer.context(), client)?;
    Ok((consumer, metadata))
}

/// ListGroups + DescribeGroups: every group, or only `group` (then at most one).
fn fetch_groups(
    consumer: &BaseConsumer<CliContext>,
    group: Option<&str>,
) -> anyhow::Result<rdkafka::groups::GroupList> {
    consumer
        .client()
        .fetch_group_list(group, GROUP_REQUEST_TIMEOUT)
        .map_err(|e| anyhow::anyhow!("list groups: {}", consumer.context().explain(&e)))
}

/// The one group named `group` in `groups`, unless it is absent or Dead (a group that
/// does not exist is described as Dead, as Kafka does).
fn find_live_group<'g>(
    groups: &'g rdkafka::groups::GroupList,
    group: &str,
) -> Option<&'g GroupInfo> {
    groups
        .groups()
        .iter()
        .find(|g| g.name() == group && g.state() != "Dead")
}

/// Kafka's text for a group that does not exist.
fn does_not_exist(group: &str) -> anyhow::Error {
    anyhow::anyhow!("Consumer group '{group}' does not exist.")
}

/// Kafka's notes on stderr for a group without members or in a rebalance.
fn note_state(group: &str, state: &str) {
    match state {
        "Empty" => eprintln!("Consumer group '{group}' has no active members."),
        "PreparingRebalance" | "CompletingRebalance" | "Assigning" | "Reconciling" => {
            eprintln!("Warning: Consumer group '{group}' is rebalancing.")
        }
        _ => {}
    }
}

/// Partitions of every topic in `metadata` except the internal ones, sorted.
fn all_partitions(metadata: &Metadata) -> Vec<(String, i32)> {
    let mut out: Vec<(String, i32)> = metadata
        .topics()
        .iter()
        .filter(|t| t.error().is_none() && !INTERNAL_TOPICS.contains(&t.name()))
        .flat_map(|t| {
            t.partitions()
                .iter()
                .map(|p| (t.name().to_string(), p.id()))
        })
        .collect();
    out.sort();
    out
}

/// Lays rows out in columns as `kafka-consumer-groups.sh` does: each column but the last
/// left-aligned to the widest of its values, header and `min_widths[i]`, one space apart.
fn table(header: &[&str], rows: &[Vec<String>], min_widths: &[usize]) -> String {
    let columns = header.len();
    let mut widths: Vec<usize> = (0..columns)
        .map(|i| min_widths.get(i).copied().unwrap_or(0).max(header[i].len()))
        .collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(columns) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, cell) in cells.enumerate() {
            if i + 1 == columns {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$} ", width = widths[i]));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// ListGroups (v4+: with states, and v5 consumer-protocol groups' states too) at every
/// broker of the cluster, each answering for the groups it coordinates, as Kafka's admin
/// client does.
///
/// Errors: a broker that cannot be reached, or answers with an error.
fn list(args: ListArgs) -> anyhow::Result<()> {
    use kafka_protocol::messages::{ApiKey, ListGroupsRequest};
    let (_consumer, metadata) = consumer(&args.client, None)?;
    let mut rows: Vec<Vec<String>> = Vec::new();
    for broker in metadata.brokers() {
        let addr = format!("{}:{}", broker.host(), broker.port());
        let (mut conn, versions) = super::wire::Conn::bootstrap(&addr)?;
        let version = super::wire::version_of(&versions, ApiKey::ListGroups, 5)
            .filter(|v| *v >= 4)
            .ok_or_else(|| anyhow::anyhow!("broker {addr} does not offer ListGroups v4+"))?;
        let response = conn.call(&ListGroupsRequest::default(), version)?;
        anyhow::ensure!(
            response.error_code == 0,
            "ListGroups at {addr}: {}",
            super::wire::error_text(response.error_code, None)
        );
        for g in response.groups {
            let state = g.group_state.to_string();
            // Brokers before ListGroups v5 name no type: their groups are classic.
            let kind = match g.group_type.as_str() {
                "" => "classic".to_string(),
                t => t.to_ascii_lowercase(),
            };
            let wanted_type = match &args.types {
                Some(types) => types.is_empty() || types.contains(&kind),
                None => true,
            };
            if (args.states.is_empty() || args.states.contains(&state)) && wanted_type {
                let mut row = vec![g.group_id.0.to_string(), state];
                if args.types.is_some() {
                    row.push(kind);
                }
                rows.push(row);
            }
        }
    }
    rows.sort();
    rows.dedup();
    if args.types.is_some() {
        write_stdout(&table(&["GROUP", "STATE", "TYPE"], &rows, &[15, 19, 0]))
    } else {
        write_stdout(&table(&["GROUP", "STATE"], &rows, &[15, 0]))
    }
}

fn delete(args: DeleteArgs) -> anyhow::Result<()> {
    let admin: AdminClient<CliContext> = client::base_config(&args.client)
        .create_with_context(CliContext::default())
        .map_err(|e| anyhow::anyhow!("cannot create the admin client: {}", KafkaErrorText(&e)))?;
    client::fetch_metadata(admin.inner(), admin.inner().context(), &args.client)?;
    let options = AdminOptions::new().request_timeout(Some(GROUP_REQUEST_TIMEOUT));
    let group = args.group.as_str();
    let results = client::block_on(admin.delete_groups(&[group], &options))?.map_err(|e| {
        anyhow::anyhow!(
            "delete group '{group}': {}",
            admin.inner().context().explain(&e)
        )
    })?;
    let code = results.into_iter().find_map(|r| match r {
        Ok(name) if name == group => Some(None),
        Err((name, code)) if name == group => Some(Some(code)),
        _ => None,
    });
    match code {
        Some(None) => write_stdout(&format!(
            "Deletion of requested consumer groups ('{group}') was successful.\n"
        )),
        Some(Some(code)) => {
            let why = match code {
                RDKafkaErrorCode::NonEmptyGroup => format!(
                    "{} (the group still has members: stop its consumers first)",
                    client::code_text(code)
                ),
                RDKafkaErrorCode::GroupIdNotFound => {
                    format!("{} (the group does not exist)", client::code_text(code))
                }
                other => client::code_text(other),
            };
            anyhow::bail!(
                "Deletion of some consumer groups failed:\n* Group '{group}' could not be \
                 deleted due to: {why}"
            )
        }
        None => anyhow::bail!("delete group '{group}': the broker's response did not mention it"),
    }
}

/// Writes to stdout; a closed pipe (`weir group list | head`) ends quietly.
fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_parse_in_any_case() {
        assert_eq!(parse_state("stable"), Ok("Stable".to_string()));
        assert_eq!(
            parse_state("PREPARINGREBALANCE"),
            Ok("PreparingRebalance".to_string())
        );
        assert!(parse_state("Running").is_err());
    }

    #[test]
    fn tables_pad_like_kafka() {
        let rows = vec![
            vec!["g".to_string(), "Empty".to_string()],
            vec!["a-rather-long-group-name".to_string(), "Stable".to_string()],
        ];
        assert_eq!(
            table(&["GROUP", "STATE"], &rows, &[15, 0]),
            "GROUP                    STATE\n\
             g                        Empty\n\
             a-rather-long-group-name Stable\n"
        );
        assert_eq!(
            table(&["GROUP", "STATE"], &[], &[15, 0]),
            "GROUP           STATE\n"
        );
    }
}
