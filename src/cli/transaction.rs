//! `weir transaction`: list and describe transactions, as Kafka's `kafka-transactions.sh`
//! (KIP-664) does, with its verbs and its columns (tab-separated, a header line):
//!
//! - `list`: every transaction of every broker (ListTransactions, key 66, asked of each
//!   broker of the cluster, which lists those it coordinates): `TransactionalId
//!   Coordinator ProducerId TransactionState`.
//! - `describe --transactional-id ID`: FindCoordinator (key type 1), then
//!   DescribeTransactions (key 65) at the coordinator: `CoordinatorId TransactionalId
//!   ProducerId ProducerEpoch TransactionState TransactionTimeoutMs
//!   CurrentTransactionStartTimeMs TransactionDurationMs TopicPartitions`.
//!
//! librdkafka has none of these APIs: they are spoken directly (`wire.rs`). The brokers
//! come from Metadata (librdkafka).
//!
//! Errors (exit code 1): no metadata; a broker that cannot be reached or answers with an
//! error (printed with its name, code and message).

use anyhow::Context as _;
use clap::{Args, Subcommand};
use kafka_protocol::messages::{
    ApiKey, DescribeTransactionsRequest, FindCoordinatorRequest, ListTransactionsRequest,
    TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::Consumer as _;

use super::client::{self, CliContext, KafkaErrorText};
use super::wire::{error_text, version_of, Conn};
use super::ClientArgs;

/// Transaction subcommands (kafka-transactions.sh's verbs).
#[derive(Debug, Subcommand)]
pub(super) enum TransactionCommand {
    /// List the transactions of every broker (or of --broker-id).
    List(ListArgs),
    /// Describe one transactional id at its coordinator.
    Describe(DescribeArgs),
}

/// `weir transaction list` options.
#[derive(Debug, Args)]
pub(super) struct ListArgs {
    #[command(flatten)]
    client: ClientArgs,
}

/// `weir transaction describe` options.
#[derive(Debug, Args)]
pub(super) struct DescribeArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// The transactional id.
    #[arg(long = "transactional-id")]
    transactional_id: String,
}

/// Runs a transaction subcommand.
pub(super) fn run(cmd: TransactionCommand) -> anyhow::Result<()> {
    match cmd {
        TransactionCommand::List(args) => list(&args),
        TransactionCommand::Describe(args) => describe(&args),
    }
}

/// The cluster's brokers as (id, `host:port`), by id.
fn brokers(client_args: &ClientArgs) -> anyhow::Result<Vec<(i32, String)>> {
    let consumer: rdkafka::consumer::BaseConsumer<CliContext> = client::base_config(client_args)
        .create_with_context(CliContext::default())
        .map_err(|e| anyhow::anyhow!("cannot create the client: {}", KafkaErrorText(&e)))?;
    let metadata =
        client::fetch_metadata(consumer.client(), consumer.client().context(), client_args)?;
    let mut brokers: Vec<(i32, String)> = metadata
        .brokers()
        .iter()
        .map(|b| (b.id(), format!("{}:{}", b.host(), b.port())))
        .collect();
    brokers.sort();
    Ok(brokers)
}

fn list(args: &ListArgs) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for (id, addr) in brokers(&args.client)? {
        let (mut conn, versions) =
            Conn::bootstrap(&addr).with_context(|| format!("broker {id} ({addr})"))?;
        let version = version_of(&versions, ApiKey::ListTransactions, 1)
            .with_context(|| format!("broker {id} does not offer ListTransactions (key 66)"))?;
        let response = conn.call(&ListTransactionsRequest::default(), version)?;
        anyhow::ensure!(
            response.error_code == 0,
            "ListTransactions at broker {id}: {}",
            error_text(response.error_code, None)
        );
        for t in response.transaction_states {
            rows.push(format!(
                "{}\t{}\t{}\t{}",
                t.transactional_id.0, id, t.producer_id.0, t.transaction_state
            ));
        }
    }
    rows.sort();
    println!("TransactionalId\tCoordinator\tProducerId\tTransactionState");
    for r in rows {
        println!("{r}");
    }
    Ok(())
}

fn describe(args: &DescribeArgs) -> anyhow::Result<()> {
    let (mut conn, versions) = Conn::bootstrap(&args.client.bootstrap_server)?;
    let version = version_of(&versions, ApiKey::FindCoordinator, 3)
        .context("the broker does not offer FindCoordinator")?;
    let found = conn.call(
        &FindCoordinatorRequest::default()
            .with_key(StrBytes::from_string(args.transactional_id.clone()))
            .with_key_type(1),
        version,
    )?;
    anyhow::ensure!(
        found.error_code == 0,
        "FindCoordinator: {}",
        error_text(found.error_code, found.error_message.as_ref())
    );
    let coordinator = found.node_id.0;
    let addr = format!("{}:{}", found.host, found.port);
    let (mut conn, versions) =
        Conn::bootstrap(&addr).with_context(|| format!("coordinator {coordinator} ({addr})"))?;
    let version = version_of(&versions, ApiKey::DescribeTransactions, 0)
        .context("the coordinator does not offer DescribeTransactions (key 65)")?;
    let response = conn.call(
        &DescribeTransactionsRequest::default().with_transactional_ids(vec![TransactionalId(
            StrBytes::from_string(args.transactional_id.clone()),
        )]),
        version,
    )?;
    let state = response
        .transaction_states
        .into_iter()
        .next()
        .context("DescribeTransactions answered no transaction")?;
    anyhow::ensure!(
        state.error_code == 0,
        "DescribeTransactions of {}: {}",
        args.transactional_id,
        error_text(state.error_code, None)
    );
    let start = state.transaction_start_time_ms;
    let duration = if start >= 0 {
        (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
            - start)
            .to_string()
    } else {
        "None".to_string()
    };
    let partitions: Vec<String> = state
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(move |p| format!("{}-{p}", t.topic.0))
        })
        .collect();
    println!("CoordinatorId\tTransactionalId\tProducerId\tProducerEpoch\tTransactionState\tTransactionTimeoutMs\tCurrentTransactionStartTimeMs\tTransactionDurationMs\tTopicPartitions");
    println!(
        "{coordinator}\t{}\t{}\t{}\t{}\t{}\t{}\t{duration}\t{}",
        state.transactional_id.0,
        state.producer_id.0,
        state.producer_epoch,
        state.transaction_state,
        state.transaction_timeout_ms,
        if start >= 0 {
            start.to_string()
        } else {
            "None".to_string()
        },
        partitions.join(",")
    );
    Ok(())
}
