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
//! `null`; raw bytes, one record per line. `--property print.timestamp=true` (and
//! `print.partition`, `print.offset`, `print.headers`, `print.key`, `key.separator`, ...)
//! add fields as kafka-console-consumer's `DefaultMessageFormatter` does ([`RecordFormat`]).
//! `--from-timestamp MS` starts each partition at the first record at or after MS. Ends after `-n` records, after `--timeout-ms`
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
    /// Start at the first offset whose record timestamp is at or after MS (milliseconds
    /// since the epoch), per partition (ListOffsets by timestamp); the end where none is.
    #[arg(long = "from-timestamp", value_name = "MS", conflicts_with_all = ["from_beginning", "offset", "group"])]
    pub from_timestamp: Option<i64>,
    /// Print the key before the value, separated by --key-separator.
    #[arg(long = "print-key")]
    pub print_key: bool,
    /// Separator between key and value with --print-key.
    #[arg(long = "key-separator", value_name = "SEP", default_value = "\t")]
    pub key_separator: String,
    /// kafka-console-consumer's formatter properties: print.key, print.value,
    /// print.partition, print.offset, print.timestamp, print.headers (true/false),
    /// key.separator, line.separator, headers.separator, null.literal; repeatable.
    #[arg(long = "property", value_name = "KEY=VALUE", value_parser = client::parse_key_value)]
    pub properties: Vec<(String, String)>,
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
    /// The first offset whose timestamp is at or after this one (ms since the epoch).
    Timestamp(i64),
}

impl StartOffset {
    /// The offset to assign; a timestamp is looked up first (see `assign`), the value
    /// here is what `offsets_for_times` takes.
    fn to_rdkafka(self) -> Offset {
        match self {
            StartOffset::Earliest => Offset::Beginning,
            StartOffset::Latest => Offset::End,
            StartOffset::At(n) | StartOffset::Timestamp(n) => Offset::Offset(n),
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

/// How each record is printed: Kafka's `DefaultMessageFormatter` (the properties of
/// `kafka-console-consumer.sh --property`). Fields in Kafka's order, each followed by
/// `key_separator` when another printed field follows, the last by `line_separator`:
/// `CreateTime:TS` (or `LogAppendTime:TS`, `NO_TIMESTAMP`), `Partition:P`, `Offset:O`,
/// headers (`k1:v1,k2:v2`, `NO_HEADERS` when none), key, value. An absent key, value or
/// header value prints as `null_literal`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RecordFormat {
    print_timestamp: bool,
    print_partition: bool,
    print_offset: bool,
    print_headers: bool,
    print_key: bool,
    print_value: bool,
    key_separator: Vec<u8>,
    line_separator: Vec<u8>,
    headers_separator: Vec<u8>,
    null_literal: Vec<u8>,
}

impl RecordFormat {
    /// The format of `--print-key`/`--key-separator` with the `--property` list applied
    /// over it. Errors: an unknown property or a boolean that is not true/false.
    fn from_args(
        print_key: bool,
        key_separator: &str,
        properties: &[(String, String)],
    ) -> anyhow::Result<RecordFormat> {
        let mut format = RecordFormat {
            print_timestamp: false,
            print_partition: false,
            print_offset: false,
            print_headers: false,
            print_key,
            print_value: true,
            key_separator: key_separator.as_bytes().to_vec(),
            line_separator: b"\n".to_vec(),
            headers_separator: b",".to_vec(),
            null_literal: b"null".to_vec(),
        };
        for (key, value) in properties {
            let flag = || super::client::bool_property(key, value);
            match key.as_str() {
                "print.timestamp" => format.print_timestamp = flag()?,
                "print.partition" => format.print_partition = flag()?,
                "print.offset" => format.print_offset = flag()?,
                "print.headers" => format.print_headers = flag()?,
                "print.key" => format.print_key = flag()?,
                "print.value" => format.print_value = flag()?,
                "key.separator" => format.key_separator = unescape(value),
                "line.separator" => format.line_separator = unescape(value),
                "headers.separator" => format.headers_separator = unescape(value),
                "null.literal" => format.null_literal = value.as_bytes().to_vec(),
                _ => anyhow::bail!(
                    "--property {key}: unknown (known: print.key, print.value, print.partition, \
                     print.offset, print.timestamp, print.headers, key.separator, \
                     line.separator, headers.separator, null.literal)"
                ),
            }
        }
        Ok(format)
    }
}

/// `\t`, `\n` and `\r` written as two characters (as a shell passes them) become the
/// control characters; anything else is taken as is.
fn unescape(s: &str) -> Vec<u8> {
    s.replace("\\t", "\t")
        .replace("\\n", "\n")
        .replace("\\r", "\r")
        .into_bytes()
}

/// What of one record [`write_record`] prints.
#[derive(Debug)]
struct RecordView<'a> {
    timestamp: rdkafka::Timestamp,
    partition: i32,
    offset: i64,
    headers: Vec<(&'a str, Option<&'a [u8]>)>,
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
}

/// Runs `weir consume`.
///
/// Errors: `--offset N` without `--partition`; the topic or partition does not exist
/// (`UNKNOWN_TOPIC_OR_PARTITION`); the broker cannot be reached for metadata; a fatal
/// consumer error; stdout failing for a reason other than being closed.
pub(super) fn run(args: ConsumeArgs) -> anyhow::Result<()> {
    let start = match (args.from_beginning, args.offset, args.from_timestamp) {
        (true, _, _) => StartOffset::Earliest,
        (false, Some(offset), _) => offset,
        (false, None, Some(ms)) if ms < 0 => {
            anyhow::bail!("--from-timestamp {ms}: must be milliseconds since the epoch (>= 0)")
        }
        (false, None, Some(ms)) => StartOffset::Timestamp(ms),
        (false, None, None) => StartOffset::Latest,
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
    let format = RecordFormat::from_args(args.print_key, &args.key_separator, &args.properties)?;
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
        StartOffset::Latest | StartOffset::At(_) | StartOffset::Timestamp(_) => "latest",
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
    if let StartOffset::Timestamp(ms) = start {
        // ListOffsets by timestamp (KIP-79); a partition with no record that recent gets
        // the end (librdkafka answers Offset::End), as kafka-console-consumer does.
        assignment = consumer
            .offsets_for_times(assignment, client::METADATA_TIMEOUT)
            .map_err(|e| {
                anyhow::anyhow!(
                    "offsets of '{topic}' for timestamp {ms}: {}",
                    consumer.context().explain(&e)
                )
            })?;
        for elem in assignment.elements() {
            if let Err(e) = elem.error() {
                anyhow::bail!(
                    "offset of {topic}-{} for timestamp {ms}: {}",
                    elem.partition(),
                    KafkaErrorText(&e)
                );
            }
        }
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
    format: &RecordFormat,
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
                use rdkafka::message::Headers as _;
                let headers = message
                    .headers()
                    .map(|h| h.iter().map(|x| (x.key, x.value)).collect())
                    .unwrap_or_default();
                let view = RecordView {
                    timestamp: message.timestamp(),
                    partition: message.partition(),
                    offset: message.offset(),
                    headers,
                    key: message.key(),
                    value: message.payload(),
                };
                match write_record(out, format, &view) {
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

/// Writes one record as [`RecordFormat`] says (Kafka's `DefaultMessageFormatter.writeTo`).
fn write_record(
    out: &mut impl Write,
    format: &RecordFormat,
    record: &RecordView<'_>,
) -> std::io::Result<()> {
    let mut fields: Vec<Vec<u8>> = Vec::with_capacity(6);
    if format.print_timestamp {
        fields.push(match record.timestamp {
            rdkafka::Timestamp::CreateTime(ms) => format!("CreateTime:{ms}").into_bytes(),
            rdkafka::Timestamp::LogAppendTime(ms) => format!("LogAppendTime:{ms}").into_bytes(),
            rdkafka::Timestamp::NotAvailable => b"NO_TIMESTAMP".to_vec(),
        });
    }
    if format.print_partition {
        fields.push(format!("Partition:{}", record.partition).into_bytes());
    }
    if format.print_offset {
        fields.push(format!("Offset:{}", record.offset).into_bytes());
    }
    if format.print_headers {
        if record.headers.is_empty() {
            fields.push(b"NO_HEADERS".to_vec());
        } else {
            let mut text = Vec::new();
            for (i, (key, value)) in record.headers.iter().enumerate() {
                if i > 0 {
                    text.extend_from_slice(&format.headers_separator);
                }
                text.extend_from_slice(key.as_bytes());
                text.push(b':');
                text.extend_from_slice(value.unwrap_or(&format.null_literal));
            }
            fields.push(text);
        }
    }
    if format.print_key {
        fields.push(record.key.unwrap_or(&format.null_literal).to_vec());
    }
    if format.print_value {
        fields.push(record.value.unwrap_or(&format.null_literal).to_vec());
    }
    for (i, field) in fields.iter().enumerate() {
        if i > 0 {
            out.write_all(&format.key_separator)?;
        }
        out.write_all(field)?;
    }
    out.write_all(&format.line_separator)
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

    fn view<'a>(key: Option<&'a [u8]>, value: Option<&'a [u8]>) -> RecordView<'a> {
        RecordView {
            timestamp: rdkafka::Timestamp::CreateTime(1_700_000_000_000),
            partition: 2,
            offset: 41,
            headers: Vec::new(),
            key,
            value,
        }
    }

    #[test]
    fn records_print_like_kafka() {
        let format = RecordFormat::from_args(true, "\t", &[]).unwrap();
        let mut out = Vec::new();
        write_record(&mut out, &format, &view(Some(b"k"), Some(b"v"))).unwrap();
        write_record(&mut out, &format, &view(None, None)).unwrap();
        assert_eq!(out, b"k\tv\nnull\tnull\n");
        let plain = RecordFormat::from_args(false, "\t", &[]).unwrap();
        let mut out = Vec::new();
        write_record(&mut out, &plain, &view(Some(b"k"), Some(b"v"))).unwrap();
        assert_eq!(out, b"v\n");
    }

    #[test]
    fn properties_print_every_field_in_kafkas_order() {
        let props: Vec<(String, String)> = [
            ("print.timestamp", "true"),
            ("print.partition", "true"),
            ("print.offset", "true"),
            ("print.headers", "true"),
            ("print.key", "true"),
            ("key.separator", "|"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let format = RecordFormat::from_args(false, "\t", &props).unwrap();
        let mut record = view(Some(b"k"), Some(b"v"));
        let mut out = Vec::new();
        write_record(&mut out, &format, &record).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "CreateTime:1700000000000|Partition:2|Offset:41|NO_HEADERS|k|v\n"
        );
        record.headers = vec![("a", Some(b"1".as_slice())), ("b", None)];
        record.timestamp = rdkafka::Timestamp::LogAppendTime(5);
        let mut out = Vec::new();
        write_record(&mut out, &format, &record).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "LogAppendTime:5|Partition:2|Offset:41|a:1,b:null|k|v\n"
        );
        let bad = [("print.color".to_string(), "true".to_string())];
        assert!(RecordFormat::from_args(false, "\t", &bad).is_err());
        let bad = [("print.key".to_string(), "yes".to_string())];
        assert!(RecordFormat::from_args(false, "\t", &bad).is_err());
    }
}
