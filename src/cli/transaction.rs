//! `weir transaction`: list, describe, abort and find hanging transactions, as Kafka's
//! `kafka-transactions.sh` (KIP-664) does, with its verbs and columns (tab-separated, a header):
//!
//! - `list`: every transaction of every broker (ListTransactions, key 66, asked of each
//!   broker of the cluster, which lists those it coordinates): `TransactionalId
//!   Coordinator ProducerId TransactionState`.
//! - `describe --transactional-id ID`: FindCoordinator (key type 1), then
//!   DescribeTransactions (key 65) at the coordinator: `CoordinatorId TransactionalId
//!   ProducerId ProducerEpoch TransactionState TransactionTimeoutMs
//!   CurrentTransactionStartTimeMs TransactionDurationMs TopicPartitions`.
//!
//! - `describe-producers --topic T --partition P`: DescribeProducers (key 61) at the
//!   partition's leader: `ProducerId ProducerEpoch LatestCoordinatorEpoch LastSequence
//!   LastTimestamp CurrentTransactionStartOffset`.
//! - `abort --topic T --partition P --start-offset O`: the producer whose open transaction
//!   starts at O on that partition (DescribeProducers) gets an ABORT marker there
//!   (WriteTxnMarkers v1 at the leader, with its epoch and latest coordinator epoch), as
//!   `kafka-transactions.sh abort` does for a hanging transaction.
//! - `find-hanging --broker-id B [--max-transaction-timeout MIN]`: the open transactions
//!   of the partitions B leads that are older than the timeout (15 min by default) and
//!   that no coordinator lists as Ongoing with that partition: `Topic Partition
//!   ProducerId ProducerEpoch CoordinatorEpoch StartOffset LastTimestamp Duration(min)`.
//!
//! librdkafka has none of these APIs: they are spoken directly (`wire.rs`). The brokers
//! come from Metadata (librdkafka).
//!
//! Errors (exit code 1): no metadata; a broker that cannot be reached or answers with an
//! error (printed with its name, code and message).

use anyhow::Context as _;
use clap::{Args, Subcommand};
use kafka_protocol::messages::{
    ApiKey, DescribeTransactionsRequest, ListTransactionsRequest, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::Consumer as _;

use super::client::{self, CliContext, KafkaErrorText};
use super::wire::{connect_coordinator, error_text, version_of, Conn};
use super::ClientArgs;

/// Transaction subcommands (kafka-transactions.sh's verbs).
#[derive(Debug, Subcommand)]
pub(super) enum TransactionCommand {
    /// List the transactions of every broker (or of --broker-id).
    List(ListArgs),
    /// Describe one transactional id at its coordinator.
    Describe(DescribeArgs),
    /// Describe the producers a partition's leader knows.
    DescribeProducers(PartitionArgs),
    /// Abort the open transaction starting at an offset of a partition (a hanging one).
    Abort(AbortArgs),
    /// Find open transactions that no coordinator knows (hanging transactions).
    FindHanging(FindHangingArgs),
}

/// `weir transaction describe-producers` options.
#[derive(Debug, Args)]
pub(super) struct PartitionArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// Topic.
    #[arg(long)]
    topic: String,
    /// Partition.
    #[arg(long)]
    partition: i32,
}

/// `weir transaction abort` options.
#[derive(Debug, Args)]
pub(super) struct AbortArgs {
    #[command(flatten)]
    partition: PartitionArgs,
    /// First offset of the transaction to abort (CurrentTransactionStartOffset).
    #[arg(long = "start-offset")]
    start_offset: i64,
}

/// `weir transaction find-hanging` options.
#[derive(Debug, Args)]
pub(super) struct FindHangingArgs {
    #[command(flatten)]
    client: ClientArgs,
    /// The broker whose led partitions are searched.
    #[arg(long = "broker-id")]
    broker_id: i32,
    /// Transactions open longer than this (minutes) are candidates.
    #[arg(long = "max-transaction-timeout", default_value_t = 15)]
    max_transaction_timeout_min: i64,
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
        TransactionCommand::DescribeProducers(args) => describe_producers(&args),
        TransactionCommand::Abort(args) => abort(&args),
        TransactionCommand::FindHanging(args) => find_hanging(&args),
    }
}

/// The cluster's brokers as (id, `host:port`), by id, and every partition as (topic,
/// partition, leader id).
type Cluster = (Vec<(i32, String)>, Vec<(String, i32, i32)>);

fn cluster(client_args: &ClientArgs) -> anyhow::Result<Cluster> {
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
    let partitions = metadata
        .topics()
        .iter()
        .flat_map(|t| {
            t.partitions()
                .iter()
                .map(move |p| (t.name().to_string(), p.id(), p.leader()))
        })
        .collect();
    Ok((brokers, partitions))
}

fn brokers(client_args: &ClientArgs) -> anyhow::Result<Vec<(i32, String)>> {
    Ok(cluster(client_args)?.0)
}

/// One producer as DescribeProducers reports it.
struct Producer {
    producer_id: i64,
    producer_epoch: i32,
    coordinator_epoch: i32,
    last_sequence: i32,
    last_timestamp: i64,
    current_txn_start_offset: i64,
}

/// DescribeProducers of `topic`-`partition` at the broker at `addr`.
fn producers_at(addr: &str, topic: &str, partition: i32) -> anyhow::Result<Vec<Producer>> {
    use kafka_protocol::messages::describe_producers_request::TopicRequest;
    use kafka_protocol::messages::{DescribeProducersRequest, TopicName};
    let (mut conn, versions) = Conn::bootstrap(addr)?;
    let version = version_of(&versions, ApiKey::DescribeProducers, 0)
        .context("the broker does not offer DescribeProducers (key 61)")?;
    let response = conn.call(
        &DescribeProducersRequest::default().with_topics(vec![TopicRequest::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_indexes(vec![partition])]),
        version,
    )?;
    let p = response
        .topics
        .into_iter()
        .flat_map(|t| t.partitions)
        .next()
        .context("DescribeProducers answered no partition")?;
    anyhow::ensure!(
        p.error_code == 0,
        "DescribeProducers of {topic}-{partition}: {}",
        error_text(p.error_code, p.error_message.as_ref())
    );
    Ok(p.active_producers
        .into_iter()
        .map(|s| Producer {
            producer_id: s.producer_id.0,
            producer_epoch: s.producer_epoch,
            coordinator_epoch: s.coordinator_epoch,
            last_sequence: s.last_sequence,
            last_timestamp: s.last_timestamp,
            current_txn_start_offset: s.current_txn_start_offset,
        })
        .collect())
}

/// The address of `topic`-`partition`'s leader.
fn leader_of(
    client_args: &ClientArgs,
    topic: &str,
    partition: i32,
) -> anyhow::Result<(i32, String)> {
    let (brokers, partitions) = cluster(client_args)?;
    let leader = partitions
        .iter()
        .find(|(t, p, _)| t == topic && *p == partition)
        .map(|(_, _, l)| *l)
        .with_context(|| format!("{topic}-{partition}: no such partition"))?;
    brokers
        .into_iter()
        .find(|(id, _)| *id == leader)
        .with_context(|| format!("{topic}-{partition} has no live leader"))
}

fn describe_producers(args: &PartitionArgs) -> anyhow::Result<()> {
    let (_, addr) = leader_of(&args.client, &args.topic, args.partition)?;
    println!("ProducerId\tProducerEpoch\tLatestCoordinatorEpoch\tLastSequence\tLastTimestamp\tCurrentTransactionStartOffset");
    for p in producers_at(&addr, &args.topic, args.partition)? {
        let start = if p.current_txn_start_offset >= 0 {
            p.current_txn_start_offset.to_string()
        } else {
            "None".to_string()
        };
        println!(
            "{}\t{}\t{}\t{}\t{}\t{start}",
            p.producer_id, p.producer_epoch, p.coordinator_epoch, p.last_sequence, p.last_timestamp
        );
    }
    Ok(())
}

fn abort(args: &AbortArgs) -> anyhow::Result<()> {
    use kafka_protocol::messages::write_txn_markers_request::{
        WritableTxnMarker, WritableTxnMarkerTopic,
    };
    use kafka_protocol::messages::{ProducerId, TopicName, WriteTxnMarkersRequest};
    let a = &args.partition;
    let (leader, addr) = leader_of(&a.client, &a.topic, a.partition)?;
    let producer = producers_at(&addr, &a.topic, a.partition)?
        .into_iter()
        .find(|p| p.current_txn_start_offset == args.start_offset)
        .with_context(|| {
            format!(
                "no open transaction starts at offset {} of {}-{}",
                args.start_offset, a.topic, a.partition
            )
        })?;
    let (mut conn, versions) = Conn::bootstrap(&addr)?;
    let version = version_of(&versions, ApiKey::WriteTxnMarkers, 1)
        .context("the leader does not offer WriteTxnMarkers (key 27) v1")?;
    let response = conn.call(
        &WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
            .with_producer_id(ProducerId(producer.producer_id))
            .with_producer_epoch(i16::try_from(producer.producer_epoch).unwrap_or(i16::MAX))
            .with_transaction_result(false)
            .with_coordinator_epoch(producer.coordinator_epoch.max(0))
            .with_topics(vec![WritableTxnMarkerTopic::default()
                .with_name(TopicName(StrBytes::from_string(a.topic.clone())))
                .with_partition_indexes(vec![a.partition])])]),
        version,
    )?;
    let code = response
        .markers
        .iter()
        .flat_map(|m| m.topics.iter())
        .flat_map(|t| t.partitions.iter())
        .map(|p| p.error_code)
        .next()
        .unwrap_or(0);
    anyhow::ensure!(
        code == 0,
        "WriteTxnMarkers at broker {leader}: {}",
        error_text(code, None)
    );
    println!(
        "Aborted the transaction of producer {} (epoch {}) starting at offset {} of {}-{}",
        producer.producer_id, producer.producer_epoch, args.start_offset, a.topic, a.partition
    );
    Ok(())
}

fn find_hanging(args: &FindHangingArgs) -> anyhow::Result<()> {
    let (brokers, partitions) = cluster(&args.client)?;
    let addr = brokers
        .iter()
        .find(|(id, _)| *id == args.broker_id)
        .map(|(_, a)| a.clone())
        .with_context(|| format!("broker {} is not in the cluster", args.broker_id))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let max_ms = args.max_transaction_timeout_min.saturating_mul(60_000);
    // Every open transaction the coordinators know: (producer id, its partitions).
    let mut ongoing: Vec<(i64, Vec<(String, i32)>)> = Vec::new();
    for (id, broker) in &brokers {
        let (mut conn, versions) =
            Conn::bootstrap(broker).with_context(|| format!("broker {id}"))?;
        let Some(version) = version_of(&versions, ApiKey::ListTransactions, 1) else {
            continue;
        };
        let listed = conn.call(
            &ListTransactionsRequest::default()
                .with_state_filters(vec![StrBytes::from_static_str("Ongoing")]),
            version,
        )?;
        let ids: Vec<TransactionalId> = listed
            .transaction_states
            .into_iter()
            .map(|t| t.transactional_id)
            .collect();
        if ids.is_empty() {
            continue;
        }
        let described = conn.call(
            &DescribeTransactionsRequest::default().with_transactional_ids(ids),
            0,
        )?;
        for t in described.transaction_states {
            let parts = t
                .topics
                .iter()
                .flat_map(|tp| {
                    tp.partitions
                        .iter()
                        .map(move |p| (tp.topic.0.to_string(), *p))
                })
                .collect();
            ongoing.push((t.producer_id.0, parts));
        }
    }
    println!("Topic\tPartition\tProducerId\tProducerEpoch\tCoordinatorEpoch\tStartOffset\tLastTimestamp\tDuration(min)");
    for (topic, partition, leader) in partitions {
        if leader != args.broker_id || topic.starts_with("__") {
            continue;
        }
        for p in producers_at(&addr, &topic, partition)? {
            let open_ms = now - p.last_timestamp;
            if p.current_txn_start_offset < 0 || open_ms <= max_ms {
                continue;
            }
            let known = ongoing.iter().any(|(pid, parts)| {
                *pid == p.producer_id && parts.iter().any(|(t, i)| *t == topic && *i == partition)
            });
            if !known {
                println!(
                    "{topic}\t{partition}\t{}\t{}\t{}\t{}\t{}\t{}",
                    p.producer_id,
                    p.producer_epoch,
                    p.coordinator_epoch,
                    p.current_txn_start_offset,
                    p.last_timestamp,
                    open_ms / 60_000
                );
            }
        }
    }
    Ok(())
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
    let (coordinator, mut conn, versions) =
        connect_coordinator(&mut conn, &versions, &args.transactional_id, 1)?;
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
