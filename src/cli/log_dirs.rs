//! `weir log-dirs describe`: each broker's log directories and the size of every partition
//! in them, in the spirit of `kafka-log-dirs.sh --describe` and with its output: two lines
//! of progress, then one line of JSON,
//!
//! ```text
//! Querying brokers for log directories information
//! Received log directory information from brokers 1,2,3
//! {"version":1,"brokers":[{"broker":1,"logDirs":[{"logDir":"/data/node-1","error":null,
//!   "partitions":[{"partition":"orders-0","size":4096,"offsetLag":0,"isFuture":false}]}]}]}
//! ```
//!
//! (the JSON on one line). The brokers come from Metadata (librdkafka); each is asked
//! with DescribeLogDirs (key 35, the highest version both speak, v1–v4: librdkafka has no
//! such API, so it is spoken directly, `wire.rs`) for all its partitions; `--topic-list`
//! filters what is printed, as Kafka's tool does. A directory's `error` is the Kafka
//! error's name (`KafkaStorageError`) or null.
//!
//! Errors (exit code 1): no metadata from the bootstrap servers; a broker of
//! `--broker-list` not in the cluster; a broker that cannot be reached or answers with an
//! error.
//!
//! `weir log-dirs move --topic T --partition P --dir D [--broker B] [--wait]`: moves
//! partition `T-P` on broker `B` (default: the partition's leader) to its log directory
//! `D` with AlterReplicaLogDirs (key 34, v1–v2; Kafka's tool for this is
//! `kafka-reassign-partitions.sh` with a `log_dirs` entry per replica). Prints
//! `Moving T-P on broker B to D`; with `--wait`, then polls DescribeLogDirs every 200 ms
//! (at most `--timeout-ms`, default 60000) until `T-P` is in `D` with no future replica
//! left and prints `Moved T-P on broker B to D`. Errors (exit code 1): the broker's error
//! for the partition (`LOG_DIR_NOT_FOUND (57)`, `UNKNOWN_TOPIC_OR_PARTITION (3)`,
//! `KAFKA_STORAGE_ERROR (56)`, `REASSIGNMENT_IN_PROGRESS (60)`), or the wait timing out.

use anyhow::Context as _;
use clap::{Args, Subcommand};
use kafka_protocol::messages::alter_replica_log_dirs_request::{
    AlterReplicaLogDir, AlterReplicaLogDirTopic,
};
use kafka_protocol::messages::{
    AlterReplicaLogDirsRequest, ApiKey, DescribeLogDirsRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::Consumer as _;
use serde::Serialize;

use super::client::{self, CliContext, KafkaErrorText};
use super::wire::{error_text, version_of, Conn};
use super::ClientArgs;

/// Highest DescribeLogDirs version this command speaks.
const DESCRIBE_LOG_DIRS_MAX: i16 = 4;

/// Highest AlterReplicaLogDirs version this command speaks.
const ALTER_REPLICA_LOG_DIRS_MAX: i16 = 2;

/// Log directory subcommands.
#[derive(Debug, Subcommand)]
pub(super) enum LogDirsCommand {
    /// Print each broker's log directories and the size and offset lag of every
    /// partition in them, as JSON (kafka-log-dirs.sh --describe).
    Describe(DescribeArgs),
    /// Move a partition to another log directory of its broker while it keeps serving
    /// (AlterReplicaLogDirs).
    Move(MoveArgs),
}

/// `weir log-dirs move` options.
#[derive(Debug, Args)]
pub(super) struct MoveArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// The topic.
    #[arg(long)]
    topic: String,
    /// The partition.
    #[arg(long)]
    partition: i32,
    /// The destination: one of the broker's log.dirs, as `describe` prints it.
    #[arg(long)]
    dir: String,
    /// The broker whose replica moves (default: the partition's leader).
    #[arg(long)]
    broker: Option<i32>,
    /// Wait until the move is done.
    #[arg(long)]
    wait: bool,
    /// Longest wait with `--wait`, in milliseconds.
    #[arg(long = "timeout-ms", default_value_t = 60_000)]
    timeout_ms: u64,
}

/// `weir log-dirs describe` options.
#[derive(Debug, Args)]
pub(super) struct DescribeArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// Broker ids to ask, comma-separated (default: every broker in the cluster).
    #[arg(long = "broker-list", value_delimiter = ',')]
    broker_list: Vec<i32>,
    /// Topics to show, comma-separated (default: every topic).
    #[arg(long = "topic-list", value_delimiter = ',')]
    topic_list: Vec<String>,
}

/// Runs a log-dirs subcommand.
pub(super) fn run(cmd: LogDirsCommand) -> anyhow::Result<()> {
    match cmd {
        LogDirsCommand::Describe(args) => describe(&args),
        LogDirsCommand::Move(args) => move_partition(&args),
    }
}

/// kafka-log-dirs.sh's JSON: `{"version":1,"brokers":[...]}`.
#[derive(Debug, Serialize)]
struct Output {
    version: i32,
    brokers: Vec<BrokerDirs>,
}

#[derive(Debug, Serialize)]
struct BrokerDirs {
    broker: i32,
    #[serde(rename = "logDirs")]
    log_dirs: Vec<LogDir>,
}

#[derive(Debug, Serialize)]
struct LogDir {
    #[serde(rename = "logDir")]
    log_dir: String,
    error: Option<String>,
    partitions: Vec<PartitionDir>,
}

#[derive(Debug, Serialize)]
struct PartitionDir {
    /// `topic-partition`.
    partition: String,
    size: i64,
    #[serde(rename = "offsetLag")]
    offset_lag: i64,
    #[serde(rename = "isFuture")]
    is_future: bool,
}

fn describe(args: &DescribeArgs) -> anyhow::Result<()> {
    let consumer: rdkafka::consumer::BaseConsumer<CliContext> = client::base_config(&args.client)
        .create_with_context(CliContext::default())
        .map_err(|e| anyhow::anyhow!("cannot create the client: {}", KafkaErrorText(&e)))?;
    let metadata =
        client::fetch_metadata(consumer.client(), consumer.client().context(), &args.client)?;
    let mut brokers: Vec<(i32, String)> = metadata
        .brokers()
        .iter()
        .map(|b| (b.id(), format!("{}:{}", b.host(), b.port())))
        .collect();
    brokers.sort();
    if !args.broker_list.is_empty() {
        for id in &args.broker_list {
            anyhow::ensure!(
                brokers.iter().any(|(b, _)| b == id),
                "broker {id} is not in the cluster (brokers: {})",
                brokers
                    .iter()
                    .map(|(b, _)| b.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            );
        }
        brokers.retain(|(id, _)| args.broker_list.contains(id));
    }
    println!("Querying brokers for log directories information");
    let mut out = Output {
        version: 1,
        brokers: Vec::with_capacity(brokers.len()),
    };
    for (id, addr) in &brokers {
        let dirs = ask(addr, &args.topic_list).with_context(|| format!("broker {id} ({addr})"))?;
        out.brokers.push(BrokerDirs {
            broker: *id,
            log_dirs: dirs,
        });
    }
    println!(
        "Received log directory information from brokers {}",
        brokers
            .iter()
            .map(|(id, _)| id.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}

/// DescribeLogDirs of every partition, asked of the broker at `addr`; only `topics`
/// kept when given.
fn ask(addr: &str, topics: &[String]) -> anyhow::Result<Vec<LogDir>> {
    let (mut conn, versions) = Conn::bootstrap(addr)?;
    let version = version_of(&versions, ApiKey::DescribeLogDirs, DESCRIBE_LOG_DIRS_MAX)
        .context("the broker does not offer DescribeLogDirs (key 35)")?;
    let response = conn.call(
        &DescribeLogDirsRequest::default().with_topics(None),
        version,
    )?;
    anyhow::ensure!(
        response.error_code == 0,
        "DescribeLogDirs: {}",
        error_text(response.error_code, None)
    );
    Ok(response
        .results
        .into_iter()
        .map(|r| LogDir {
            log_dir: r.log_dir.to_string(),
            error: (r.error_code != 0).then(|| {
                kafka_protocol::ResponseError::try_from_code(r.error_code)
                    .map_or_else(|| format!("error {}", r.error_code), |e| format!("{e:?}"))
            }),
            partitions: r
                .topics
                .into_iter()
                .filter(|t| topics.is_empty() || topics.iter().any(|n| n == t.name.0.as_str()))
                .flat_map(|t| {
                    let name = t.name.0.to_string();
                    t.partitions.into_iter().map(move |p| PartitionDir {
                        partition: format!("{name}-{}", p.partition_index),
                        size: p.partition_size,
                        offset_lag: p.offset_lag,
                        is_future: p.is_future_key,
                    })
                })
                .collect(),
        })
        .collect())
}

fn move_partition(args: &MoveArgs) -> anyhow::Result<()> {
    let consumer: rdkafka::consumer::BaseConsumer<CliContext> = client::base_config(&args.client)
        .create_with_context(CliContext::default())
        .map_err(|e| anyhow::anyhow!("cannot create the client: {}", KafkaErrorText(&e)))?;
    let metadata =
        client::fetch_metadata(consumer.client(), consumer.client().context(), &args.client)?;
    let topic = client::find_topic(&metadata, &args.topic)?;
    let broker = match args.broker {
        Some(b) => b,
        None => topic
            .partitions()
            .iter()
            .find(|p| p.id() == args.partition)
            .map(|p| p.leader())
            .with_context(|| {
                format!("partition {}-{} does not exist", args.topic, args.partition)
            })?,
    };
    let addr = metadata
        .brokers()
        .iter()
        .find(|b| b.id() == broker)
        .map(|b| format!("{}:{}", b.host(), b.port()))
        .with_context(|| format!("broker {broker} is not in the cluster"))?;
    let name = format!("{}-{}", args.topic, args.partition);
    let (mut conn, versions) = Conn::bootstrap(&addr)?;
    let version = version_of(
        &versions,
        ApiKey::AlterReplicaLogDirs,
        ALTER_REPLICA_LOG_DIRS_MAX,
    )
    .context("the broker does not offer AlterReplicaLogDirs (key 34)")?;
    let request =
        AlterReplicaLogDirsRequest::default().with_dirs(vec![AlterReplicaLogDir::default()
            .with_path(StrBytes::from_string(args.dir.clone()))
            .with_topics(vec![AlterReplicaLogDirTopic::default()
                .with_name(TopicName(StrBytes::from_string(args.topic.clone())))
                .with_partitions(vec![args.partition])])]);
    let response = conn.call(&request, version)?;
    let code = response
        .results
        .iter()
        .flat_map(|t| t.partitions.iter())
        .find(|p| p.partition_index == args.partition)
        .map(|p| p.error_code)
        .context("AlterReplicaLogDirs: no answer for the partition")?;
    anyhow::ensure!(
        code == 0,
        "{name} on broker {broker}: {}",
        error_text(code, None)
    );
    println!("Moving {name} on broker {broker} to {}", args.dir);
    if !args.wait {
        return Ok(());
    }
    let want = std::path::absolute(&args.dir).unwrap_or_else(|_| args.dir.clone().into());
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(args.timeout_ms);
    loop {
        let dirs = ask(&addr, std::slice::from_ref(&args.topic))?;
        let future = dirs.iter().any(|d| {
            d.partitions
                .iter()
                .any(|p| p.partition == name && p.is_future)
        });
        let placed = dirs.iter().any(|d| {
            std::path::Path::new(&d.log_dir) == want
                && d.partitions
                    .iter()
                    .any(|p| p.partition == name && !p.is_future)
        });
        if placed && !future {
            println!("Moved {name} on broker {broker} to {}", args.dir);
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "{name} on broker {broker} is not in {} after {} ms",
            args.dir,
            args.timeout_ms
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
