//! `weir partition elect-leaders`: Kafka's `kafka-leader-election.sh` — preferred or
//! unclean leader election for one partition (`--topic T --partition P`), the partitions
//! of a JSON file (`--path-to-json-file`, Kafka's `{"partitions": [{"topic": "t",
//! "partition": 0}]}`), or every partition (`--all-topic-partitions`).
//!
//! Speaks ElectLeaders (key 43, v0–v2; KIP-183, KIP-460) directly (the rdkafka binding
//! has no ElectLeaders): ApiVersions, then ElectLeaders to the first bootstrap address
//! that answers (any weir broker makes the change through the metadata quorum; Kafka's
//! admin client sends it to the controller). Output as Kafka's tool prints it:
//!
//! ```text
//! Successfully completed leader election (PREFERRED) for partitions t-0, t-3
//! Valid replica already elected for partitions t-1
//! Error completing leader election (PREFERRED) for partition: t-2: PREFERRED_LEADER_NOT_AVAILABLE: ...
//! ```
//!
//! With `--all-topic-partitions` the broker leaves out the partitions that needed no
//! election (as Kafka does); when none is left, the tool says `Valid replica already
//! elected for all partitions` (Kafka's prints nothing).
//!
//! Exit code 1 when a partition got an error other than ELECTION_NOT_NEEDED (84), with
//! `N replica(s) could not be elected` on stderr, as Kafka's tool fails; 2 on bad usage.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
use kafka_protocol::messages::{ApiKey, ElectLeadersRequest, ElectLeadersResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::wire::{error_text, version_of, Conn};
use super::ClientArgs;

/// Highest ElectLeaders version this command speaks.
const ELECT_LEADERS_MAX: i16 = 2;

/// How long the broker may take to answer: it answers once the change is committed by
/// the metadata quorum (bounded by its own commit timeout, 15 s, and retries).
const ELECT_TIMEOUT: Duration = Duration::from_secs(60);

/// Most partitions a JSON file may name.
const MAX_JSON_PARTITIONS: usize = 100_000;

/// `--election-type`, case-insensitive as Kafka's tool takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "UPPER")]
pub(super) enum ElectionKind {
    /// The first replica of the assignment leads, if it is alive and in the ISR.
    Preferred,
    /// A partition without a live leader gets one from the ISR, else any live replica:
    /// records only the old ISR held are lost.
    Unclean,
}

impl ElectionKind {
    fn code(self) -> i8 {
        match self {
            ElectionKind::Preferred => 0,
            ElectionKind::Unclean => 1,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ElectionKind::Preferred => "PREFERRED",
            ElectionKind::Unclean => "UNCLEAN",
        }
    }
}

/// `weir partition elect-leaders` options (kafka-leader-election.sh's).
#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("which")
        .required(true)
        .args(["topic", "all_topic_partitions", "path_to_json_file"])
))]
pub(super) struct ElectArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// PREFERRED or UNCLEAN (any case).
    #[arg(long = "election-type", ignore_case = true)]
    pub election_type: ElectionKind,
    /// The topic of the one partition to elect a leader for (with --partition).
    #[arg(long, requires = "partition")]
    pub topic: Option<String>,
    /// The partition of --topic.
    #[arg(long, requires = "topic")]
    pub partition: Option<i32>,
    /// Every partition of every topic.
    #[arg(long = "all-topic-partitions")]
    pub all_topic_partitions: bool,
    /// A JSON file naming the partitions: {"partitions": [{"topic": "t", "partition": 0}]}.
    #[arg(long = "path-to-json-file", value_name = "FILE")]
    pub path_to_json_file: Option<PathBuf>,
}

/// The JSON file's form (Kafka's `kafka-leader-election.sh --path-to-json-file`).
#[derive(Debug, serde::Deserialize)]
struct JsonFile {
    partitions: Vec<JsonPartition>,
}

#[derive(Debug, serde::Deserialize)]
struct JsonPartition {
    topic: String,
    partition: i32,
}

/// The partitions `text` names, in file order.
///
/// Errors: not the JSON Kafka's tool takes, a partition named twice (Kafka refuses those
/// too), more than [`MAX_JSON_PARTITIONS`].
fn parse_json(text: &str) -> anyhow::Result<Vec<(String, i32)>> {
    let file: JsonFile = serde_json::from_str(text)
        .context("expected {\"partitions\": [{\"topic\": \"TOPIC\", \"partition\": N}, ...]}")?;
    anyhow::ensure!(
        file.partitions.len() <= MAX_JSON_PARTITIONS,
        "more than {MAX_JSON_PARTITIONS} partitions"
    );
    let mut seen = BTreeSet::new();
    let mut dup = Vec::new();
    let mut out = Vec::new();
    for p in file.partitions {
        if !seen.insert((p.topic.clone(), p.partition)) {
            dup.push(format!("{}-{}", p.topic, p.partition));
        }
        out.push((p.topic, p.partition));
    }
    anyhow::ensure!(
        dup.is_empty(),
        "Replica election data contains duplicate partitions: {}",
        dup.join(",")
    );
    anyhow::ensure!(!out.is_empty(), "the file names no partition");
    Ok(out)
}

/// The request's `topic_partitions`: `None` for every partition.
fn request_partitions(partitions: Option<&[(String, i32)]>) -> Option<Vec<TopicPartitions>> {
    let partitions = partitions?;
    let mut out: Vec<TopicPartitions> = Vec::new();
    for (topic, p) in partitions {
        match out.iter_mut().find(|t| t.topic.0.as_str() == topic) {
            Some(t) => t.partitions.push(*p),
            None => out.push(
                TopicPartitions::default()
                    .with_topic(TopicName(StrBytes::from_string(topic.clone())))
                    .with_partitions(vec![*p]),
            ),
        }
    }
    Some(out)
}

/// Asks the broker at `addr`.
fn ask(
    addr: &str,
    kind: ElectionKind,
    partitions: Option<&[(String, i32)]>,
) -> anyhow::Result<ElectLeadersResponse> {
    let (mut conn, versions) = Conn::open(addr)?;
    let version = version_of(&versions, ApiKey::ElectLeaders, ELECT_LEADERS_MAX)
        .context("the broker does not offer ElectLeaders (key 43)")?;
    anyhow::ensure!(
        version >= 1 || kind == ElectionKind::Preferred,
        "the broker offers ElectLeaders v0 only: preferred elections only"
    );
    conn.set_read_timeout(ELECT_TIMEOUT)?;
    let request = ElectLeadersRequest::default()
        .with_election_type(kind.code())
        .with_topic_partitions(request_partitions(partitions))
        .with_timeout_ms(ELECT_TIMEOUT.as_millis() as i32);
    let response = conn.call(&request, version)?;
    anyhow::ensure!(
        response.error_code == 0,
        "ElectLeaders: {}",
        error_text(response.error_code, None)
    );
    Ok(response)
}

/// What Kafka's tool prints for `response`, and how many partitions failed.
fn render(kind: ElectionKind, all: bool, response: &ElectLeadersResponse) -> (String, usize) {
    let mut done = Vec::new();
    let mut noop = Vec::new();
    let mut failed = Vec::new();
    for t in &response.replica_election_results {
        for p in &t.partition_result {
            let name = format!("{}-{}", t.topic.0.as_str(), p.partition_id);
            match p.error_code {
                0 => done.push(name),
                code if code == ResponseError::ElectionNotNeeded.code() => noop.push(name),
                code => failed.push((name, error_text(code, p.error_message.as_ref()))),
            }
        }
    }
    done.sort();
    noop.sort();
    failed.sort();
    let mut out = String::new();
    if !done.is_empty() {
        let _ = writeln!(
            out,
            "Successfully completed leader election ({}) for partitions {}",
            kind.name(),
            done.join(", ")
        );
    }
    if !noop.is_empty() {
        let _ = writeln!(
            out,
            "Valid replica already elected for partitions {}",
            noop.join(", ")
        );
    }
    if all && done.is_empty() && noop.is_empty() && failed.is_empty() {
        let _ = writeln!(out, "Valid replica already elected for all partitions");
    }
    for (name, why) in &failed {
        let _ = writeln!(
            out,
            "Error completing leader election ({}) for partition: {name}: {why}",
            kind.name()
        );
    }
    (out, failed.len())
}

/// Runs `weir partition elect-leaders`.
///
/// Errors: no bootstrap address answers; a partition could not be elected.
pub(super) fn elect_leaders(args: ElectArgs) -> anyhow::Result<()> {
    let partitions: Option<Vec<(String, i32)>> = if args.all_topic_partitions {
        None
    } else if let Some(path) = &args.path_to_json_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        Some(parse_json(&text).with_context(|| format!("{}", path.display()))?)
    } else {
        match (&args.topic, args.partition) {
            (Some(t), Some(p)) => Some(vec![(t.clone(), p)]),
            _ => anyhow::bail!("--topic and --partition go together"),
        }
    };
    let mut failures = Vec::new();
    let mut answered = None;
    for addr in args
        .client
        .bootstrap_server
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
    {
        match ask(addr, args.election_type, partitions.as_deref()) {
            Ok(r) => {
                answered = Some(r);
                break;
            }
            Err(e) => failures.push(format!("{addr}: {e:#}")),
        }
    }
    let Some(response) = answered else {
        anyhow::bail!("no broker answered: {}", failures.join("; "));
    };
    let (text, failed) = render(args.election_type, partitions.is_none(), &response);
    print!("{text}");
    anyhow::ensure!(failed == 0, "{failed} replica(s) could not be elected");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::elect_leaders_response::{
        PartitionResult, ReplicaElectionResult,
    };

    #[test]
    fn the_json_file_is_kafkas() {
        let parsed = parse_json(
            r#"{"partitions": [{"topic": "a", "partition": 1}, {"topic": "b", "partition": 0}]}"#,
        )
        .unwrap();
        assert_eq!(parsed, vec![("a".into(), 1), ("b".into(), 0)]);
        let dup = parse_json(
            r#"{"partitions": [{"topic": "a", "partition": 1}, {"topic": "a", "partition": 1}]}"#,
        )
        .unwrap_err();
        assert!(
            format!("{dup:#}").contains("duplicate partitions: a-1"),
            "{dup:#}"
        );
        assert!(parse_json(r#"{"partitions": []}"#).is_err());
        assert!(parse_json(r#"{"partition": []}"#).is_err());
        let req = request_partitions(Some(&parsed[..])).unwrap();
        assert_eq!(req.len(), 2);
        assert!(request_partitions(None).is_none());
    }

    #[test]
    fn output_follows_kafkas_tool() {
        let result = |p: i32, code: i16| {
            PartitionResult::default()
                .with_partition_id(p)
                .with_error_code(code)
        };
        let response = ElectLeadersResponse::default().with_replica_election_results(vec![
            ReplicaElectionResult::default()
                .with_topic(TopicName(StrBytes::from_static_str("t")))
                .with_partition_result(vec![
                    result(1, 0),
                    result(0, 0),
                    result(2, 84),
                    result(3, 80),
                ]),
        ]);
        let (text, failed) = render(ElectionKind::Preferred, false, &response);
        assert_eq!(failed, 1);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "Successfully completed leader election (PREFERRED) for partitions t-0, t-1"
        );
        assert_eq!(lines[1], "Valid replica already elected for partitions t-2");
        assert!(
            lines[2].starts_with(
                "Error completing leader election (PREFERRED) for partition: t-3: PREFERRED_LEADER_NOT_AVAILABLE"
            ),
            "{text}"
        );
        let (text, failed) = render(
            ElectionKind::Unclean,
            true,
            &ElectLeadersResponse::default(),
        );
        assert_eq!(
            (text.as_str(), failed),
            ("Valid replica already elected for all partitions\n", 0)
        );
    }
}
