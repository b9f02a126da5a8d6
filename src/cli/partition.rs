//! `weir partition reassign`: move partition replicas between brokers, in the spirit of
//! Kafka's `kafka-reassign-partitions.sh` (KIP-455): `--execute`, `--verify` and
//! `--cancel` with a `--reassignment-json-file`, and `--list`.
//!
//! Speaks the Kafka protocol directly (`wire.rs`; librdkafka has neither API):
//! AlterPartitionReassignments (key 45) to start or cancel, ListPartitionReassignments
//! (key 46) for what is in progress, Metadata for the current replicas. The file is
//! Kafka's: `{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[2,3]}]}`
//! (`log_dirs`, if given, must all be `"any"`: weir has one log directory per broker).
//!
//! Output as Kafka's tool:
//! - `--execute` prints the current assignment as a rollback file, then `Successfully
//!   started partition reassignment(s) for t-0,...`. A reassignment already in progress
//!   for any partition refuses it, unless `--additional`.
//! - `--verify` prints `Reassignment of partition t-0 is completed.` or `... is still in
//!   progress.` per partition; exit code 0 only when every one is complete.
//! - `--cancel` prints `Successfully cancelled partition reassignment(s) for: t-0,...`
//!   (only those in progress are cancelled) or `None of the specified partition
//!   reassignments are active.`.
//! - `--list` prints `t-0: replicas: 2,3,1. adding: 3. removing: 1.` per partition in
//!   progress, or `No partition reassignments found.`.
//!
//! Errors (exit code 1): a file that does not parse or breaks Kafka's rules (version 1,
//! a non-empty list, no partition twice, no broker twice in a list); no broker answers;
//! a partition the broker refuses (its error name and message are printed per
//! partition).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{ArgGroup, Args, Subcommand};
use kafka_protocol::messages::alter_partition_reassignments_request::{
    ReassignablePartition, ReassignableTopic,
};
use kafka_protocol::messages::list_partition_reassignments_request::ListPartitionReassignmentsTopics;
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, ApiKey, ApiVersionsResponse, BrokerId,
    ListPartitionReassignmentsRequest, MetadataRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use serde::{Deserialize, Serialize};

use super::wire::{error_text, version_of, Conn};
use super::ClientArgs;

/// How long the broker may take (AlterPartitionReassignments / ListPartitionReassignments
/// `timeout_ms`; Kafka's tool default).
const TIMEOUT_MS: i32 = 30_000;

/// Highest Metadata version this command speaks.
const METADATA_MAX: i16 = 12;

/// Partition subcommands.
#[derive(Debug, Subcommand)]
pub(super) enum PartitionCommand {
    /// Move partition replicas between brokers (as kafka-reassign-partitions.sh).
    Reassign(ReassignArgs),
    /// Elect partition leaders: the preferred replica, or (unclean) any live replica of a
    /// partition without a leader (kafka-leader-election.sh).
    ElectLeaders(super::elect_leaders::ElectArgs),
}

/// `weir partition reassign` options: exactly one action.
#[derive(Debug, Args)]
#[command(group(
    ArgGroup::new("action")
        .required(true)
        .args(["execute", "verify", "cancel", "list"])
))]
pub(super) struct ReassignArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Kafka's reassignment JSON: {"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[2,3]}]}.
    #[arg(long = "reassignment-json-file", value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Start the reassignment the file describes.
    #[arg(long, requires = "file")]
    pub execute: bool,
    /// Report whether the reassignment the file describes is complete (exit 0 only then).
    #[arg(long, requires = "file")]
    pub verify: bool,
    /// Cancel the reassignments in progress of the file's partitions.
    #[arg(long, requires = "file")]
    pub cancel: bool,
    /// List the partition reassignments in progress.
    #[arg(long)]
    pub list: bool,
    /// With --execute: start even though reassignments are in progress (a partition's
    /// new target replaces its current one).
    #[arg(long, requires = "execute")]
    pub additional: bool,
}

/// Kafka's reassignment JSON file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ReassignmentFile {
    version: i32,
    partitions: Vec<FileEntry>,
}

/// One partition of the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct FileEntry {
    topic: String,
    partition: i32,
    replicas: Vec<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    log_dirs: Option<Vec<String>>,
}

impl FileEntry {
    fn name(&self) -> String {
        format!("{}-{}", self.topic, self.partition)
    }
}

/// Parses and checks a reassignment file as Kafka's tool does.
///
/// Errors: bad JSON, a version other than 1, no partitions, a partition twice, a broker
/// twice in one list, a `log_dirs` entry other than `any` or of another length.
fn parse_file(text: &str) -> anyhow::Result<Vec<FileEntry>> {
    let file: ReassignmentFile =
        serde_json::from_str(text).context("the reassignment JSON does not parse")?;
    anyhow::ensure!(
        file.version == 1,
        "Not supported version field value {}",
        file.version
    );
    anyhow::ensure!(
        !file.partitions.is_empty(),
        "Partition reassignment list cannot be empty"
    );
    let mut seen = BTreeSet::new();
    for p in &file.partitions {
        anyhow::ensure!(
            seen.insert((p.topic.clone(), p.partition)),
            "Reassignment JSON file contains duplicate topic partitions: {}",
            p.name()
        );
        let distinct: BTreeSet<i32> = p.replicas.iter().copied().collect();
        anyhow::ensure!(
            distinct.len() == p.replicas.len(),
            "Partition replica lists may not contain duplicate entries: {} has {:?}",
            p.name(),
            p.replicas
        );
        if let Some(dirs) = &p.log_dirs {
            anyhow::ensure!(
                dirs.len() == p.replicas.len() && dirs.iter().all(|d| d == "any"),
                "{}: log_dirs must be \"any\" for every replica (weir has one log directory per broker)",
                p.name()
            );
        }
    }
    Ok(file.partitions)
}

/// A connection to a broker of the cluster, with the versions it offers.
struct Session {
    conn: Conn,
    versions: ApiVersionsResponse,
}

impl Session {
    fn open(client: &ClientArgs) -> anyhow::Result<Session> {
        let (conn, versions) = Conn::bootstrap(&client.bootstrap_server)?;
        Ok(Session { conn, versions })
    }

    fn version(&self, key: ApiKey, ours: i16) -> anyhow::Result<i16> {
        version_of(&self.versions, key, ours)
            .with_context(|| format!("the broker does not offer {key:?} (key {})", key as i16))
    }

    /// Every partition's replicas, by (topic, partition).
    fn replicas(&mut self) -> anyhow::Result<BTreeMap<(String, i32), Vec<i32>>> {
        let v = self.version(ApiKey::Metadata, METADATA_MAX)?;
        // All topics (null), never named: naming one could create it.
        let r = self
            .conn
            .call(&MetadataRequest::default().with_topics(None), v)?;
        let mut out = BTreeMap::new();
        for t in &r.topics {
            let Some(name) = &t.name else { continue };
            for p in &t.partitions {
                out.insert(
                    (name.0.as_str().to_string(), p.partition_index),
                    p.replica_nodes.iter().map(|b| b.0).collect(),
                );
            }
        }
        Ok(out)
    }

    /// The reassignments in progress, by (topic, partition): (replicas, adding,
    /// removing). Among `only`'s partitions when given.
    fn ongoing(&mut self, only: Option<&[FileEntry]>) -> anyhow::Result<Ongoing> {
        let v = self.version(ApiKey::ListPartitionReassignments, 0)?;
        let topics = only.map(|entries| {
            let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
            for e in entries {
                by_topic.entry(&e.topic).or_default().push(e.partition);
            }
            by_topic
                .into_iter()
                .map(|(t, parts)| {
                    ListPartitionReassignmentsTopics::default()
                        .with_name(TopicName(StrBytes::from_string(t.to_string())))
                        .with_partition_indexes(parts)
                })
                .collect()
        });
        let r = self.conn.call(
            &ListPartitionReassignmentsRequest::default()
                .with_timeout_ms(TIMEOUT_MS)
                .with_topics(topics),
            v,
        )?;
        anyhow::ensure!(
            r.error_code == 0,
            "ListPartitionReassignments: {}",
            error_text(r.error_code, r.error_message.as_ref())
        );
        let ids = |v: &[BrokerId]| v.iter().map(|b| b.0).collect::<Vec<i32>>();
        let mut out = BTreeMap::new();
        for t in &r.topics {
            for p in &t.partitions {
                out.insert(
                    (t.name.0.as_str().to_string(), p.partition_index),
                    (
                        ids(&p.replicas),
                        ids(&p.adding_replicas),
                        ids(&p.removing_replicas),
                    ),
                );
            }
        }
        Ok(out)
    }

    /// Sends AlterPartitionReassignments for `entries` (`None` replicas cancel); returns
    /// the partitions refused, with their error text.
    fn alter(
        &mut self,
        entries: &[(String, i32, Option<Vec<i32>>)],
    ) -> anyhow::Result<Vec<String>> {
        let v = self.version(ApiKey::AlterPartitionReassignments, 1)?;
        let mut by_topic: BTreeMap<&str, Vec<ReassignablePartition>> = BTreeMap::new();
        for (topic, partition, replicas) in entries {
            by_topic.entry(topic).or_default().push(
                ReassignablePartition::default()
                    .with_partition_index(*partition)
                    .with_replicas(
                        replicas
                            .as_ref()
                            .map(|r| r.iter().copied().map(BrokerId).collect()),
                    ),
            );
        }
        let topics = by_topic
            .into_iter()
            .map(|(t, parts)| {
                ReassignableTopic::default()
                    .with_name(TopicName(StrBytes::from_string(t.to_string())))
                    .with_partitions(parts)
            })
            .collect();
        let r = self.conn.call(
            &AlterPartitionReassignmentsRequest::default()
                .with_timeout_ms(TIMEOUT_MS)
                .with_allow_replication_factor_change(true)
                .with_topics(topics),
            v,
        )?;
        anyhow::ensure!(
            r.error_code == 0,
            "AlterPartitionReassignments: {}",
            error_text(r.error_code, r.error_message.as_ref())
        );
        let mut refused = Vec::new();
        for t in &r.responses {
            for p in &t.partitions {
                if p.error_code != 0 {
                    refused.push(format!(
                        "{}-{}: {}",
                        t.name.0.as_str(),
                        p.partition_index,
                        error_text(p.error_code, p.error_message.as_ref())
                    ));
                }
            }
        }
        Ok(refused)
    }
}

/// Reassignments in progress: (replicas, adding, removing) by (topic, partition).
type Ongoing = BTreeMap<(String, i32), (Vec<i32>, Vec<i32>, Vec<i32>)>;

fn joined(ids: &[i32]) -> String {
    ids.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
}

/// Runs a partition subcommand.
pub(super) fn run(cmd: PartitionCommand) -> anyhow::Result<()> {
    match cmd {
        PartitionCommand::Reassign(args) => reassign(args),
        PartitionCommand::ElectLeaders(args) => super::elect_leaders::elect_leaders(args),
    }
}

fn reassign(args: ReassignArgs) -> anyhow::Result<()> {
    let mut session = Session::open(&args.client)?;
    if args.list {
        return list(&mut session);
    }
    let path = args
        .file
        .as_ref()
        .context("--reassignment-json-file is required")?;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let entries = parse_file(&text)?;
    if args.execute {
        execute(&mut session, &entries, args.additional)
    } else if args.verify {
        verify(&mut session, &entries)
    } else {
        cancel(&mut session, &entries)
    }
}

fn execute(session: &mut Session, entries: &[FileEntry], additional: bool) -> anyhow::Result<()> {
    if !additional && !session.ongoing(None)?.is_empty() {
        anyhow::bail!(
            "Cannot execute because there is an existing partition assignment. Use \
             --additional to override this and create a new partition assignment in \
             addition to the existing one."
        );
    }
    let current = session.replicas()?;
    let rollback = ReassignmentFile {
        version: 1,
        partitions: entries
            .iter()
            .filter_map(|e| {
                let replicas = current.get(&(e.topic.clone(), e.partition))?;
                Some(FileEntry {
                    topic: e.topic.clone(),
                    partition: e.partition,
                    replicas: replicas.clone(),
                    log_dirs: Some(vec!["any".to_string(); replicas.len()]),
                })
            })
            .collect(),
    };
    println!("Current partition replica assignment\n");
    println!("{}\n", serde_json::to_string(&rollback)?);
    println!("Save this to use as the --reassignment-json-file option during rollback");
    let wanted: Vec<(String, i32, Option<Vec<i32>>)> = entries
        .iter()
        .map(|e| (e.topic.clone(), e.partition, Some(e.replicas.clone())))
        .collect();
    let refused = session.alter(&wanted)?;
    if !refused.is_empty() {
        anyhow::bail!("Error reassigning partition(s):\n{}", refused.join("\n"));
    }
    let names: Vec<String> = entries.iter().map(FileEntry::name).collect();
    let plural = if names.len() > 1 { "s" } else { "" };
    println!(
        "Successfully started partition reassignment{plural} for {}",
        names.join(",")
    );
    Ok(())
}

fn verify(session: &mut Session, entries: &[FileEntry]) -> anyhow::Result<()> {
    let ongoing = session.ongoing(Some(entries))?;
    let current = session.replicas()?;
    println!("Status of partition reassignment:");
    let mut incomplete = 0;
    for e in entries {
        let key = (e.topic.clone(), e.partition);
        if ongoing.contains_key(&key) {
            println!(
                "Reassignment of partition {} is still in progress.",
                e.name()
            );
            incomplete += 1;
            continue;
        }
        match current.get(&key) {
            Some(r) if *r == e.replicas => {
                println!("Reassignment of partition {} is completed.", e.name())
            }
            Some(r) => {
                println!(
                    "There is no active reassignment of partition {}, but replica set is {} rather than {}.",
                    e.name(),
                    joined(r),
                    joined(&e.replicas)
                );
                incomplete += 1;
            }
            None => {
                println!("Partition {} does not exist.", e.name());
                incomplete += 1;
            }
        }
    }
    anyhow::ensure!(
        incomplete == 0,
        "{incomplete} of {} partition reassignment(s) not complete",
        entries.len()
    );
    Ok(())
}

fn cancel(session: &mut Session, entries: &[FileEntry]) -> anyhow::Result<()> {
    let ongoing = session.ongoing(Some(entries))?;
    let active: Vec<(String, i32, Option<Vec<i32>>)> = entries
        .iter()
        .filter(|e| ongoing.contains_key(&(e.topic.clone(), e.partition)))
        .map(|e| (e.topic.clone(), e.partition, None))
        .collect();
    if active.is_empty() {
        println!("None of the specified partition reassignments are active.");
        return Ok(());
    }
    let refused = session.alter(&active)?;
    // Completed between the listing and the cancellation: nothing left to cancel.
    let no_reassignment = format!("{:?}", ResponseError::NoReassignmentInProgress);
    let refused: Vec<String> = refused
        .into_iter()
        .filter(|r| !r.contains(&no_reassignment))
        .collect();
    if !refused.is_empty() {
        anyhow::bail!(
            "Error cancelling partition reassignment(s):\n{}",
            refused.join("\n")
        );
    }
    let names: Vec<String> = active.iter().map(|(t, p, _)| format!("{t}-{p}")).collect();
    println!(
        "Successfully cancelled partition reassignment(s) for: {}",
        names.join(",")
    );
    Ok(())
}

fn list(session: &mut Session) -> anyhow::Result<()> {
    let ongoing = session.ongoing(None)?;
    if ongoing.is_empty() {
        println!("No partition reassignments found.");
        return Ok(());
    }
    println!("Current partition reassignments:");
    for ((topic, partition), (replicas, adding, removing)) in &ongoing {
        println!(
            "{topic}-{partition}: replicas: {}. adding: {}. removing: {}.",
            joined(replicas),
            joined(adding),
            joined(removing)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_follow_kafkas_rules() {
        let ok = parse_file(
            r#"{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[2,3],"log_dirs":["any","any"]}]}"#,
        )
        .unwrap();
        assert_eq!(
            (ok[0].name(), &ok[0].replicas[..]),
            ("t-0".to_string(), &[2, 3][..])
        );
        for (bad, why) in [
            (
                r#"{"version":2,"partitions":[{"topic":"t","partition":0,"replicas":[1]}]}"#,
                "version",
            ),
            (r#"{"version":1,"partitions":[]}"#, "empty"),
            (
                r#"{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1]},{"topic":"t","partition":0,"replicas":[2]}]}"#,
                "duplicate topic partitions",
            ),
            (
                r#"{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1,1]}]}"#,
                "duplicate entries",
            ),
            (
                r#"{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1],"log_dirs":["/x"]}]}"#,
                "log_dirs",
            ),
            ("{", "parse"),
        ] {
            let e = format!("{:#}", parse_file(bad).unwrap_err());
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn the_rollback_file_is_kafkas_json() {
        let f = ReassignmentFile {
            version: 1,
            partitions: vec![FileEntry {
                topic: "t".into(),
                partition: 0,
                replicas: vec![1, 2],
                log_dirs: Some(vec!["any".into(), "any".into()]),
            }],
        };
        assert_eq!(
            serde_json::to_string(&f).unwrap(),
            r#"{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1,2],"log_dirs":["any","any"]}]}"#
        );
    }
}
