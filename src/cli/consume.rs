//! `weir consume`: print records one per line, as Kafka's `kafka-console-consumer.sh`.
//!
//! Without `--group` the consumer is *assigned* every partition of the topic (or the one
//! given with `-p`) at the beginning, the end, or a given offset, and never joins a group
//! or commits. librdkafka only lets a consumer with a `group.id` call `assign()`, so it
//! carries [`STANDALONE_GROUP_ID`], which is never sent in a group request.
//!
//! With `--group G` it subscribes to the topic as a member of G (JoinGroup/SyncGroup; the
//! group's assignor spreads partitions over its members) and starts each partition at G's
//! committed offset, or where `auto.offset.reset` says when there is none: the earliest
//! offset with `--from-beginning`, the end otherwise (as `kafka-console-consumer.sh
//! --group`). An offset is stored only after its record is written to stdout, committed
//! every `auto.commit.interval.ms` (librdkafka's 5 s) and once more, synchronously, when
//! the command ends (`-n` reached, `--timeout-ms`, Ctrl-C/SIGTERM, stdout closed); then the
//! consumer leaves the group. How partitions are obtained is isolated in [`Membership`].
//!
//! Output: the value, or with `--print-key` `key<SEP>value`; a null key or value prints as
//! `null`; raw bytes, one record per line. Ends after `-n` records, after `--timeout-ms`
//! without a record, at Ctrl-C/SIGTERM, or when stdout is closed (`| head`); then prints
//! `Processed a total of N messages` on stderr, as Kafka does.
//!
//! Never does: commit offsets or join a group without `--group`; commit the offset of a
//! record before it is written to stdout (a record still in the output buffer when stdout
//! closes can be committed without being seen).

use std::io::{BufWriter, Write};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use clap::Args;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::client::{self, CliContext, KafkaErrorText};
use super::ClientArgs;

/// `group.id` of the standalone consumer: librdkafka requires one for `assign()`; no group
/// request carries it because the consumer neither subscribes nor commits.
pub(super) const STANDALONE_GROUP_ID: &str = "weir-cli-standalone";

/// Longest single wait for a record, so Ctrl-C and `--timeout-ms` are noticed promptly.
const POLL_TICK: Duration = Duration::from_millis(100);

/// Capacity of the stdout buffer; it is flushed whenever no record is waiting.
const STDOUT_BUFFER_BYTES: usize = 64 * 1024;

/// `weir consume` options (as `kafka-console-consumer.sh`).
#[derive(Debug, Args)]
pub(super) struct ConsumeArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Topic to consume from.
    pub topic: String,
    /// Start at the earliest offset of each partition (default: the end, new records only).
    /// With --group, only where the group has no committed offset.
    #[arg(long = "from-beginning", conflicts_with = "offset")]
    pub from_beginning: bool,
    /// Where to start: an offset (needs --partition), `earliest` or `latest`.
    #[arg(long, value_parser = parse_start_offset)]
    pub offset: Option<StartOffset>,
    /// Consume only this partition.
    #[arg(short = 'p', long)]
    pub partition: Option<i32>,
    /// Consume as a member of this consumer group: partitions from the group, start at its
    /// committed offsets, commit what was printed.
    #[arg(short = 'g', long, value_name = "GROUP", conflicts_with_all = ["offset", "partition"])]
    pub group: Option<String>,
    /// Print the key before the value, separated by --key-separator.
    #[arg(long = "print-key")]
    pub print_key: bool,
    /// Separator between key and value with --print-key.
    #[arg(long = "key-separator", value_name = "SEP", default_value = "\t")]
    pub key_separator: String,
    /// Exit after this many records.
    #[arg(short = 'n', long = "max-messages", value_name = "MAX")]
    pub max_messages: Option<u64>,
    /// Exit when no record arrives for this long, in milliseconds.
    #[arg(long = "timeout-ms", value_name = "MS")]
    pub timeout_ms: Option<u64>,
}

/// Where consumption starts in each assigned partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StartOffset {
    /// The log start offset.
    Earliest,
    /// The log end offset: only records produced from now on.
    Latest,
    /// This offset (non-negative).
    At(i64),
}

impl StartOffset {
    fn to_rdkafka(self) -> Offset {
        match self {
            StartOffset::Earliest => Offset::Beginning,
            StartOffset::Latest => Offset::End,
            StartOffset::At(n) => Offset::Offset(n),
        }
    }
}

fn parse_start_offset(s: &str) -> Result<StartOffset, String> {
    match s {
        "earliest" | "beginning" => Ok(StartOffset::Earliest),
        "latest" | "end" => Ok(StartOffset::Latest),
        _ => match s.parse::<i64>() {
            Ok(n) if n >= 0 => Ok(StartOffset::At(n)),
            _ => Err(format!(
                "expected a non-negative offset, 'earliest' or 'latest', got '{s}'"
            )),
        },
    }
}

/// How the consumer gets its partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Membership<'a> {
    /// `assign()` of explicit partitions and offsets; no group, no commits.
    Standalone,
    /// `subscribe()` as a member of this group; offsets of printed records are committed.
    Group(&'a str),
}

/// When to stop, besides a signal or a closed stdout.
#[derive(Debug, Clone, Copy)]
struct StopAfter {
    max_messages: Option<u64>,
    idle_timeout: Option<Duration>,
}

/// How each record is printed.
#[derive(Debug)]
struct RecordFormat<'a> {
    print_key: bool,
    key_separator: &'a [u8],
}

/// Runs `weir consume`.
///
/// Errors: `--offset N` without `--partition`; the topic or partition does not exist
/// (`UNKNOWN_TOPIC_OR_PARTITION`); the broker cannot be reached for metadata; a fatal
/// consumer error; stdout failing for a reason other than being closed.
pub(super) fn run(args: ConsumeArgs) -> anyhow::Result<()> {
    let start = match (args.from_beginning, args.offset) {
        (true, _) => StartOffset::Earliest,
        (false, Some(offset)) => offset,
        (false, None) => StartOffset::Latest,
    };
    if matches!(start, StartOffset::At(_)) && args.partition.is_none() {
        anyhow::bail!("the partition is required when offset is specified (--partition)");
    }
    let stop = client::stop_on_signal();

    let membership = match &args.group {
        None => Membership::Standalone,
        Some(group) => Membership::Group(group),
    };
    let consumer = create_consumer(&args.client, membership, start)?;
    match membership {
        Membership::Standalone => {
            assign(&consumer, &args.client, &args.topic, args.partition, start)?
        }
        Membership::Group(_) => subscribe(&consumer, &args.client, &args.topic)?,
    }

    let stop_after = StopAfter {
        max_messages: args.max_messages,
        idle_timeout: args.timeout_ms.map(Duration::from_millis),
    };
    let format = RecordFormat {
        print_key: args.print_key,
        key_separator: args.key_separator.as_bytes(),
    };
    let stdout = std::io::stdout();
    let mut out = BufWriter::with_capacity(STDOUT_BUFFER_BYTES, stdout.lock());
    let result = print_records(
        &consumer,
        membership,
        &mut out,
        &format,
        stop_after,
        &|| stop.load(Ordering::SeqCst),
    );
    let processed = match &result {
        Ok(n) => *n,
        Err((n, _)) => *n,
    };
    eprintln!("Processed a total of {processed} messages");
    let committed = match membership {
        Membership::Standalone => Ok(()),
        Membership::Group(group) => commit_printed(&consumer, group),
    };
    // Dropping the consumer leaves the group (LeaveGroup), so the group is Empty at once.
    drop(consumer);
    result.map(|_| ()).map_err(|(_, e)| e).and(committed)
}

/// The final synchronous commit of the offsets stored for printed records. Nothing stored
/// since the last commit (or no record at all) is not an error.
fn commit_printed(consumer: &BaseConsumer<CliContext>, group: &str) -> anyhow::Result<()> {
    match consumer.commit_consumer_state(CommitMode::Sync) {
        Ok(()) => Ok(()),
        Err(e) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::NoOffset) => Ok(()),
        Err(e) => Err(anyhow::anyhow!(
            "commit offsets of group '{group}': {}",
            consumer.context().explain(&e)
        )),
    }
}

fn create_consumer(
    client: &ClientArgs,
    membership: Membership,
    start: StartOffset,
) -> anyhow::Result<BaseConsumer<CliContext>> {
    let mut config = client::base_config(client);
    // Where to go when a given offset is out of range: as Kafka's console consumer, the
    // end unless reading from the beginning.
    // With a group: where to start a partition the group has no committed offset for.
    let reset = match start {
        StartOffset::Earliest => "earliest",
        StartOffset::Latest | StartOffset::At(_) => "latest",
    };
    config
        .set("auto.offset.reset", reset)
        .set("enable.auto.offset.store", "false");
    match membership {
        Membership::Standalone => config
            .set("group.id", STANDALONE_GROUP_ID)
            .set("enable.auto.commit", "false"),
        // Offsets are stored by hand after printing; librdkafka commits them periodically.
        Membership::Group(group) => config
            .set("group.id", group)
            .set("enable.auto.commit", "true"),
    };
    config
        .create_with_context(CliContext::default())
        .map_err(|e| anyhow::anyhow!("cannot create the consumer: {}", KafkaErrorText(&e)))
}

/// Assigns every partition of `topic` (or only `partition`) starting at `start`.
fn assign(
    consumer: &BaseConsumer<CliContext>,
    bootstrap: &ClientArgs,
    topic: &str,
    partition: Option<i32>,
    start: StartOffset,
) -> anyhow::Result<()> {
    let metadata = client::fetch_metadata(consumer.client(), consumer.context(), bootstrap)?;
    let found = client::find_topic(&metadata, topic)?;
    let mut ids: Vec<i32> = found.partitions().iter().map(|p| p.id()).collect();
    ids.sort_unstable();
    if let Some(p) = partition {
        if !ids.contains(&p) {
            anyhow::bail!(
                "partition {p} of topic '{topic}': {}",
                client::code_text(RDKafkaErrorCode::UnknownTopicOrPartition)
            );
        }
        ids = vec![p];
    }
    let mut assignment = TopicPartitionList::with_capacity(ids.len());
    for id in ids {
        assignment
            .add_partition_offset(topic, id, start.to_rdkafka())
            .map_err(|e| anyhow::anyhow!("partition {id}: {}", KafkaErrorText(&e)))?;
    }
    consumer
        .assign(&assignment)
        .map_err(|e| anyhow::anyhow!("assign '{topic}': {}", KafkaErrorText(&e)))
}

/// Subscribes to `topic` as a member of the consumer's group; the topic must exist (a
/// consumer never creates one).
fn subscribe(
    consumer: &BaseConsumer<CliContext>,
    bootstrap: &ClientArgs,
    topic: &str,
) -> anyhow::Result<()> {
    let metadata = client::fetch_metadata(consumer.client(), consumer.context(), bootstrap)?;
    client::find_topic(&metadata, topic)?;
    consumer
        .subscribe(&[topic])
        .map_err(|e| anyhow::anyhow!("subscribe to '{topic}': {}", KafkaErrorText(&e)))
}

/// Polls `consumer` and prints records to `out` until a stop condition; returns how many
/// records were printed (also alongside an error). As a group member, stores each record's
/// offset once it is written, for the next commit.
fn print_records(
    consumer: &BaseConsumer<CliContext>,
    membership: Membership<'_>,
    out: &mut impl Write,
    format: &RecordFormat<'_>,
    stop_after: StopAfter,
    stopped: &dyn Fn() -> bool,
) -> Result<u64, (u64, anyhow::Error)> {
    let mut printed: u64 = 0;
    let mut last_record_at = Instant::now();
    let mut last_warning: Option<String> = None;
    loop {
        if stop_after.max_messages.is_some_and(|max| printed >= max) || stopped() {
            break;
        }
        let mut wait = POLL_TICK;
        if let Some(idle) = stop_after.idle_timeout {
            let elapsed = last_record_at.elapsed();
            if elapsed >= idle {
                break;
            }
            wait = wait.min(idle - elapsed);
        }
        let mut polled = consumer.poll(Duration::ZERO);
        if polled.is_none() {
            // Nothing waiting: show what was printed before blocking.
            match out.flush() {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(printed),
                Err(e) => return Err((printed, anyhow::Error::new(e).context("stdout"))),
            }
            polled = consumer.poll(wait);
        }
        match polled {
            None => {}
            Some(Ok(message)) => {
                match write_record(out, format, message.key(), message.payload()) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(printed),
                    Err(e) => return Err((printed, anyhow::Error::new(e).context("stdout"))),
                }
                printed += 1;
                last_record_at = Instant::now();
                match membership {
                    Membership::Standalone => {}
                    Membership::Group(_) => {
                        if let Err(e) = consumer.store_offset_from_message(&message) {
                            // The partition was revoked meanwhile: its new owner reads it.
                            let text = KafkaErrorText(&e).to_string();
                            if last_warning.as_deref() != Some(text.as_str()) {
                                eprintln!("weir: warning: offset not stored: {text}");
                                last_warning = Some(text);
                            }
                        }
                    }
                }
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(e)) if is_fatal(&e) => {
                let text = consumer.context().explain(&e);
                return Err((printed, anyhow::anyhow!("consume: {text}")));
            }
            Some(Err(e)) => {
                // librdkafka retries these itself (a broker down, a leader moving); say
                // so once per distinct error instead of once per retry.
                let text = KafkaErrorText(&e).to_string();
                if last_warning.as_deref() != Some(text.as_str()) {
                    eprintln!("weir: warning: {text}");
                    last_warning = Some(text);
                }
            }
        }
    }
    match out.flush() {
        Ok(()) => Ok(printed),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(printed),
        Err(e) => Err((printed, anyhow::Error::new(e).context("stdout"))),
    }
}

/// Errors after which consuming cannot go on: librdkafka's fatal ones, and the topic
/// vanishing or being forbidden.
fn is_fatal(error: &KafkaError) -> bool {
    match error {
        KafkaError::MessageConsumptionFatal(_) => true,
        other => matches!(
            other.rdkafka_error_code(),
            Some(
                RDKafkaErrorCode::UnknownTopicOrPartition
                    | RDKafkaErrorCode::UnknownTopic
                    | RDKafkaErrorCode::UnknownPartition
                    | RDKafkaErrorCode::TopicAuthorizationFailed
            )
        ),
    }
}

/// Writes one record: `value` or `key<SEP>value`, `null` for an absent key or value.
fn write_record(
    out: &mut impl Write,
    format: &RecordFormat<'_>,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
) -> std::io::Result<()> {
    if format.print_key {
        out.write_all(key.unwrap_or(b"null"))?;
        out.write_all(format.key_separator)?;
    }
    out.write_all(value.unwrap_or(b"null"))?;
    out.write_all(b"\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_parse() {
        assert_eq!(parse_start_offset("earliest"), Ok(StartOffset::Earliest));
        assert_eq!(parse_start_offset("latest"), Ok(StartOffset::Latest));
        assert_eq!(parse_start_offset("42"), Ok(StartOffset::At(42)));
        assert!(parse_start_offset("-1").is_err());
        assert!(parse_start_offset("x").is_err());
    }

    #[test]
    fn records_print_like_kafka() {
        let format = RecordFormat {
            print_key: true,
            key_separator: b"\t",
        };
        let mut out = Vec::new();
        write_record(&mut out, &format, Some(b"k"), Some(b"v")).unwrap();
        write_record(&mut out, &format, None, None).unwrap();
        assert_eq!(out, b"k\tv\nnull\tnull\n");
        let plain = RecordFormat {
            print_key: false,
            key_separator: b"\t",
        };
        let mut out = Vec::new();
        write_record(&mut out, &plain, Some(b"k"), Some(b"v")).unwrap();
        assert_eq!(out, b"v\n");
    }
}
