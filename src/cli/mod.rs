//! The `weir` command line: `serve` runs a broker; every other subcommand is a Kafka client
//! for people, in the spirit of Kafka's `kafka-*.sh` tools and rpk, built on librdkafka
//! (the `rdkafka` crate) so it behaves like any other client.
//!
//! `cluster up` starts `weir serve` child processes and probes them as a Kafka client.
//! `cluster describe`, `partition reassign` and `partition elect-leaders` speak the
//! Kafka protocol directly
//! (`wire.rs`) for the APIs librdkafka lacks.
//!
//! Never does: reach into broker internals, except `serve`, which starts one (and
//! `connector create`, which reads a connector TOML file with the broker's pure parser,
//! `connect::config::file_properties`, so the CLI and the watched directory agree).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

mod admin_http;
mod client;
mod cluster;
mod config;
mod connector;
mod consume;
mod elect_leaders;
mod group;
mod log_dirs;
mod partition;
mod produce;
mod serve;
mod topic;
mod transaction;
mod transform;
mod wire;

/// The `weir` command.
#[derive(Debug, Parser)]
#[command(
    name = "weir",
    version,
    about = "A Kafka-compatible broker with WebAssembly plugins"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a broker (single node; every setting has a default).
    Serve(ServeArgs),
    /// Create, list, describe, alter and delete topics.
    #[command(subcommand)]
    Topic(topic::TopicCommand),
    /// Produce one record per stdin line.
    Produce(produce::ProduceArgs),
    /// Consume records and print one per line (alone, or as a member of a group).
    Consume(consume::ConsumeArgs),
    /// List, describe, reset the offsets of and delete consumer groups.
    #[command(subcommand)]
    Group(group::GroupCommand),
    /// Move partition replicas between brokers (`partition reassign`, as
    /// kafka-reassign-partitions.sh) and elect their leaders (`partition elect-leaders`,
    /// as kafka-leader-election.sh).
    #[command(subcommand)]
    Partition(partition::PartitionCommand),
    /// Deploy, list and delete transforms (a client of the admin HTTP API).
    #[command(subcommand)]
    Transform(transform::TransformCommand),
    /// Create, list, pause, resume, stop, restart and delete connectors (a client of the
    /// Kafka Connect REST API on the admin listener).
    #[command(subcommand)]
    Connector(connector::ConnectorCommand),
    /// Run a local multi-node cluster (`cluster up`: N `weir serve` child processes) or
    /// describe a cluster (`cluster describe`: brokers and the controller quorum).
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Change and describe dynamic broker configs (kafka-configs.sh --entity-type brokers,
    /// --entity-name N / --entity-default).
    #[command(subcommand)]
    Config(config::ConfigCommand),
    /// Describe each broker's log directories: partition sizes and offset lag, as JSON
    /// (kafka-log-dirs.sh).
    #[command(subcommand)]
    LogDirs(log_dirs::LogDirsCommand),
    /// List, describe and abort transactions, and find hanging ones (kafka-transactions.sh).
    #[command(subcommand)]
    Transaction(transaction::TransactionCommand),
}

/// `weir serve` options.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML config file with Kafka's key names (see config/weir.toml).
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// KEY=VALUE, overriding the file (as kafka-server-start.sh --override); repeatable.
    #[arg(long = "override", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
}

/// Options every client subcommand shares.
#[derive(Debug, Args, Clone)]
pub struct ClientArgs {
    /// Broker address(es), host:port[,host:port].
    #[arg(
        short = 'b',
        long = "bootstrap-server",
        default_value = "127.0.0.1:9092",
        global = true
    )]
    pub bootstrap_server: String,
}

/// Parses the command line and runs the subcommand; the exit code is 0 on success, 1 on
/// an error (printed on stderr), 2 on bad usage (clap's).
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Topic(cmd) => topic::run(cmd),
        Command::Produce(args) => produce::run(args),
        Command::Consume(args) => consume::run(args),
        Command::Group(cmd) => group::run(cmd),
        Command::Partition(cmd) => partition::run(cmd),
        Command::Transform(cmd) => transform::run(cmd),
        Command::Connector(cmd) => connector::run(cmd),
        Command::Cluster(cmd) => cluster::run(cmd),
        Command::LogDirs(cmd) => log_dirs::run(cmd),
        Command::Transaction(cmd) => transaction::run(cmd),
        Command::Config(cmd) => config::run(cmd),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weir: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
