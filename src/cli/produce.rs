//! `weir produce`: one record per stdin line, as Kafka's `kafka-console-producer.sh`.
//!
//! Lines end at `\n` (a trailing `\r` is dropped too) and are sent as raw bytes; an empty
//! line is an empty record. With `--key-separator SEP` the bytes before the first SEP are
//! the key and the rest the value (Kafka's `parse.key=true` + `key.separator`); a line
//! without SEP is an error, as in Kafka. `--header KEY=VALUE` (repeatable) adds the same
//! headers to every record; `--property parse.headers=true` reads per-line headers
//! first, as kafka-console-producer does (`k1:v1,k2:v2<TAB>key<TAB>value` with
//! `parse.key=true`; the separators are properties, see [`LineFormat`]).
//!
//! Stdin is streamed: one line buffer, reused; librdkafka's queue bounds what is in flight,
//! and a full queue (`QUEUE_FULL`) is waited out by polling for deliveries. Every delivery
//! report is counted; the command fails if any record failed, naming the first failure.
//!
//! With `--partitioner FILE.wasm`, a partitioner component (world `partitioner`, see
//! `wit/`) chooses each record's partition from its key, value and the topic's partition
//! count (read from metadata once, at start; the topic must exist), and the record is
//! sent to that partition explicitly. A plugin failure stops the command at that line.
//!
//! Never does: read all of stdin into memory, or retry a record librdkafka gave up on.

use std::io::{BufRead, Read as _};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};

use super::client::{self, CliContext, KafkaErrorText};
use super::ClientArgs;
use crate::plugin::{Partitioner, PluginHost, PluginHostConfig};

/// Longest stdin line accepted, in bytes: librdkafka's default `message.max.bytes`. A
/// longer line could never be sent, and bounding it bounds the line buffer.
const MAX_LINE_BYTES: usize = 1_000_000;

/// librdkafka's `message.timeout.ms` for the CLI: Kafka's `delivery.timeout.ms` default.
const MESSAGE_TIMEOUT_MS: u64 = 120_000;

/// How long one wait for delivery reports lasts while the send queue is full.
const QUEUE_FULL_POLL: Duration = Duration::from_millis(100);

/// `weir produce` options (as `kafka-console-producer.sh`).
#[derive(Debug, Args)]
pub(super) struct ProduceArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Topic to produce to.
    pub topic: String,
    /// Split each line at the first SEP into key and value (Kafka's parse.key/key.separator).
    #[arg(long = "key-separator", value_name = "SEP")]
    pub key_separator: Option<String>,
    /// Partition to write every record to; librdkafka's partitioner chooses if absent.
    #[arg(short = 'p', long, conflicts_with = "partitioner")]
    pub partition: Option<i32>,
    /// A partitioner WebAssembly component (world weir:plugin/partitioner) that chooses
    /// each record's partition, e.g. plugins/murmur2 built for wasm32-wasip2.
    #[arg(long, value_name = "FILE.wasm")]
    pub partitioner: Option<PathBuf>,
    /// KEY=VALUE passed to the partitioner's `open`; repeatable.
    #[arg(
        long = "partitioner-config",
        value_name = "KEY=VALUE",
        requires = "partitioner"
    )]
    pub partitioner_config: Vec<String>,
    /// Acknowledgements the leader waits for before answering (Kafka's `acks`).
    #[arg(long, value_enum, default_value_t = Acks::All, allow_negative_numbers = true)]
    pub acks: Acks,
    /// Compression codec for record batches (Kafka's `compression.type`).
    #[arg(long, value_enum, default_value_t = Compression::None)]
    pub compression: Compression,
    /// A header KEY=VALUE every record carries (the value's bytes as given; `KEY=` is an
    /// empty value); repeatable, kept in order, duplicates allowed (as Kafka headers).
    #[arg(long = "header", value_name = "KEY=VALUE", value_parser = parse_header)]
    pub headers: Vec<(String, String)>,
    /// kafka-console-producer's line reader properties: parse.key (true/false),
    /// key.separator (default tab), parse.headers (true/false: each line starts with
    /// `k1:v1,k2:v2` then headers.delimiter), headers.delimiter (default tab),
    /// headers.separator (default `,`), headers.key.separator (default `:`); repeatable.
    #[arg(long = "property", value_name = "KEY=VALUE", value_parser = client::parse_key_value)]
    pub properties: Vec<(String, String)>,
}

/// How a stdin line splits into headers, key and value (kafka-console-producer's
/// `LineMessageReader`). Separators are never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LineFormat {
    /// `Some(sep)`: the bytes before the first `sep` are the key.
    key_separator: Option<Vec<u8>>,
    /// `Some(..)`: the line starts with headers.
    headers: Option<HeaderFormat>,
}

/// kafka-console-producer's `parse.headers` separators.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HeaderFormat {
    /// Ends the headers part of the line (`headers.delimiter`, default tab).
    delimiter: Vec<u8>,
    /// Between two headers (`headers.separator`, default `,`).
    separator: Vec<u8>,
    /// Between a header's key and value (`headers.key.separator`, default `:`).
    key_separator: Vec<u8>,
}

impl LineFormat {
    /// From `--key-separator` and the `--property` list. Errors: an unknown property, a
    /// boolean that is not true/false, an empty separator.
    fn from_args(
        key_separator: Option<&str>,
        properties: &[(String, String)],
    ) -> anyhow::Result<LineFormat> {
        let mut parse_key = key_separator.is_some();
        let mut key_sep = key_separator.unwrap_or("\t").as_bytes().to_vec();
        let mut parse_headers = false;
        let mut headers = HeaderFormat {
            delimiter: b"\t".to_vec(),
            separator: b",".to_vec(),
            key_separator: b":".to_vec(),
        };
        for (key, value) in properties {
            let flag = || super::client::bool_property(key, value);
            let bytes = value.as_bytes().to_vec();
            match key.as_str() {
                "parse.key" => parse_key = flag()?,
                "key.separator" => key_sep = bytes,
                "parse.headers" => parse_headers = flag()?,
                "headers.delimiter" => headers.delimiter = bytes,
                "headers.separator" => headers.separator = bytes,
                "headers.key.separator" => headers.key_separator = bytes,
                _ => anyhow::bail!(
                    "--property {key}: unknown (known: parse.key, key.separator, \
                     parse.headers, headers.delimiter, headers.separator, headers.key.separator)"
                ),
            }
        }
        if key_sep.is_empty()
            || headers.delimiter.is_empty()
            || headers.separator.is_empty()
            || headers.key_separator.is_empty()
        {
            anyhow::bail!("--key-separator and the separator properties must not be empty");
        }
        Ok(LineFormat {
            key_separator: parse_key.then_some(key_sep),
            headers: parse_headers.then_some(headers),
        })
    }
}

/// The headers, key and value of one line (`line_number` for the error text, which is
/// kafka-console-producer's).
type ParsedLine<'a> = (Vec<(&'a [u8], &'a [u8])>, Option<&'a [u8]>, &'a [u8]);

fn parse_line<'a>(
    format: &LineFormat,
    line: &'a [u8],
    line_number: usize,
) -> anyhow::Result<ParsedLine<'a>> {
    let text = || String::from_utf8_lossy(line).to_string();
    let mut rest = line;
    let mut headers = Vec::new();
    if let Some(h) = &format.headers {
        let Some(at) = find(rest, &h.delimiter) else {
            anyhow::bail!(
                "no headers delimiter found on line number {line_number}: '{}'",
                text()
            );
        };
        let part = &rest[..at];
        rest = &rest[at + h.delimiter.len()..];
        if !part.is_empty() {
            let mut pairs = part;
            loop {
                let (pair, more) = match find(pairs, &h.separator) {
                    Some(i) => (&pairs[..i], Some(&pairs[i + h.separator.len()..])),
                    None => (pairs, None),
                };
                match find(pair, &h.key_separator) {
                    Some(i) => headers.push((&pair[..i], &pair[i + h.key_separator.len()..])),
                    None => anyhow::bail!(
                        "no header key separator found in pair '{}' on line number {line_number}",
                        String::from_utf8_lossy(pair)
                    ),
                }
                match more {
                    Some(m) => pairs = m,
                    None => break,
                }
            }
        }
    }
    match &format.key_separator {
        None => Ok((headers, None, rest)),
        Some(sep) => match find(rest, sep) {
            Some(at) => Ok((headers, Some(&rest[..at]), &rest[at + sep.len()..])),
            None => anyhow::bail!(
                "no key separator found on line number {line_number}: '{}'",
                text()
            ),
        },
    }
}

/// `KEY=VALUE` at the first `=`. An empty key is refused: Kafka allows it, but it is
/// almost certainly a typo on a command line.
fn parse_header(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!(
            "expected KEY=VALUE with a non-empty KEY, got '{s}'"
        )),
    }
}

/// Kafka's `acks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum Acks {
    /// Wait for the full ISR (`acks=all`, also spelled -1).
    #[value(name = "all", alias = "-1")]
    All,
    /// Wait for the leader only.
    #[value(name = "1")]
    Leader,
    /// Do not wait: failures are not reported.
    #[value(name = "0")]
    None,
}

impl Acks {
    fn config_value(self) -> &'static str {
        match self {
            Acks::All => "-1",
            Acks::Leader => "1",
            Acks::None => "0",
        }
    }
}

/// Kafka's `compression.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum Compression {
    /// No compression.
    None,
    /// gzip.
    Gzip,
    /// Snappy.
    Snappy,
    /// LZ4.
    Lz4,
    /// Zstandard.
    Zstd,
}

impl Compression {
    fn config_value(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Snappy => "snappy",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

/// Runs `weir produce`: reads stdin to EOF, then flushes.
///
/// Errors: a line without the key separator or longer than 1,000,000 bytes (after
/// flushing what was already sent), stdin unreadable, a producer config librdkafka rejects
/// (e.g. a codec it was built without), or any failed delivery (`N of M records failed`,
/// with the first failure's Kafka error name and line number).
pub(super) fn run(args: ProduceArgs) -> anyhow::Result<()> {
    let mut config = client::base_config(&args.client);
    config
        .set("acks", args.acks.config_value())
        .set("compression.type", args.compression.config_value())
        .set("message.timeout.ms", MESSAGE_TIMEOUT_MS.to_string());
    let producer: BaseProducer<DeliveryTally> = config
        .create_with_context(DeliveryTally::default())
        .map_err(|e| anyhow::anyhow!("cannot create the producer: {}", KafkaErrorText(&e)))?;
    // Fail fast on an unreachable broker rather than after the message timeout.
    let metadata =
        client::fetch_metadata(producer.client(), &producer.context().inner, &args.client)?;
    let mut chooser = match &args.partitioner {
        None => None,
        Some(path) => {
            let partitions = client::find_topic(&metadata, &args.topic)?
                .partitions()
                .len();
            let partition_count = u32::try_from(partitions)
                .ok()
                .filter(|&n| n > 0)
                .with_context(|| format!("topic '{}' has no partitions", args.topic))?;
            Some(PluginPartitioner::load(
                path,
                &args.partitioner_config,
                partition_count,
            )?)
        }
    };

    let stdin = std::io::stdin();
    let read_result = send_lines(&producer, &args, chooser.as_mut(), &mut stdin.lock());

    // Deliver what was sent even when reading stopped early, so the error is the only loss.
    let flush_result = producer.flush(Duration::from_millis(MESSAGE_TIMEOUT_MS + 10_000));
    let sent = read_result?;
    let tally = producer.context();
    if let Err(e) = flush_result {
        anyhow::bail!(
            "{} records not delivered before the timeout: {}",
            producer.in_flight_count(),
            tally.inner.explain(&e)
        );
    }
    let failed = tally.failed.load(Ordering::SeqCst);
    if failed > 0 {
        let first = tally.first_error().unwrap_or_default();
        anyhow::bail!("{failed} of {sent} records failed; first: {first}");
    }
    Ok(())
}

/// Sends one record per line of `input`; returns how many lines were read.
fn send_lines(
    producer: &BaseProducer<DeliveryTally>,
    args: &ProduceArgs,
    mut chooser: Option<&mut PluginPartitioner>,
    input: &mut impl BufRead,
) -> anyhow::Result<u64> {
    if args.key_separator.as_deref() == Some("") {
        anyhow::bail!("--key-separator must not be empty");
    }
    let format = LineFormat::from_args(args.key_separator.as_deref(), &args.properties)?;
    let fixed: Vec<(&[u8], &[u8])> = args
        .headers
        .iter()
        .map(|(k, v)| (k.as_bytes(), v.as_bytes()))
        .collect();
    let mut line = Vec::with_capacity(4096);
    let mut line_number: usize = 0;
    loop {
        line.clear();
        let limit = u64::try_from(MAX_LINE_BYTES + 2).unwrap_or(u64::MAX);
        let n = input
            .by_ref()
            .take(limit)
            .read_until(b'\n', &mut line)
            .context("cannot read stdin")?;
        if n == 0 {
            break;
        }
        line_number += 1;
        if line.last() == Some(&b'\n') {
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
        }
        if line.len() > MAX_LINE_BYTES {
            anyhow::bail!("line {line_number} is longer than {MAX_LINE_BYTES} bytes");
        }
        let (parsed, key, value) = parse_line(&format, &line, line_number)?;
        let mut record: BaseRecord<'_, [u8], [u8], usize> =
            BaseRecord::with_opaque_to(&args.topic, line_number).payload(value);
        if let Some(key) = key {
            record = record.key(key);
        }
        if !fixed.is_empty() || !parsed.is_empty() {
            let headers =
                fixed
                    .iter()
                    .chain(parsed.iter())
                    .fold(OwnedHeaders::new(), |h, (key, value)| {
                        h.insert(Header {
                            key: &String::from_utf8_lossy(key),
                            value: Some(*value),
                        })
                    });
            record = record.headers(headers);
        }
        if let Some(partition) = args.partition {
            record = record.partition(partition);
        }
        if let Some(chooser) = chooser.as_deref_mut() {
            let partition = chooser
                .choose(key, Some(value))
                .with_context(|| format!("line {line_number}: the partitioner failed"))?;
            record = record.partition(partition);
        }
        send(producer, record);
        // Serve delivery reports as they come, without waiting.
        producer.poll(Duration::ZERO);
    }
    u64::try_from(line_number).context("line count overflow")
}

/// A partitioner component and what calling it needs: the plugin host, a single-threaded
/// runtime to drive its async calls from this synchronous loop, the partition count.
struct PluginPartitioner {
    runtime: tokio::runtime::Runtime,
    partitioner: Partitioner,
    partition_count: u32,
    // Kept alive for the partitioner (engine and epoch ticker).
    _host: PluginHost,
}

impl PluginPartitioner {
    /// Loads the component at `path`, opening it with `config` (`KEY=VALUE` strings).
    fn load(
        path: &std::path::Path,
        config: &[String],
        partition_count: u32,
    ) -> anyhow::Result<Self> {
        let pairs = config
            .iter()
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) => Ok((k.to_string(), v.to_string())),
                None => anyhow::bail!("--partitioner-config {kv:?}: expected KEY=VALUE"),
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start a runtime for the partitioner")?;
        let host = PluginHost::new(PluginHostConfig::default())?;
        let partitioner = runtime.block_on(host.load_partitioner_with(path, &pairs))?;
        Ok(PluginPartitioner {
            runtime,
            partitioner,
            partition_count,
            _host: host,
        })
    }

    /// The partition the component chooses for this key and value.
    fn choose(&mut self, key: Option<&[u8]>, value: Option<&[u8]>) -> anyhow::Result<i32> {
        let n = self.partition_count;
        let p = self
            .runtime
            .block_on(self.partitioner.partition(key, value, n))?;
        // `p < n <= i32::MAX` (a topic's partition count is an i32), so this never fails.
        i32::try_from(p).context("partition out of range")
    }
}

/// Hands `record` to librdkafka, waiting while its queue is full. A record librdkafka
/// refuses outright (too large, unknown partition) is counted as failed, like a failed
/// delivery: Kafka's producer reports those through the callback too.
fn send(producer: &BaseProducer<DeliveryTally>, mut record: BaseRecord<'_, [u8], [u8], usize>) {
    loop {
        match producer.send(record) {
            Ok(()) => return,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                record = back;
                producer.poll(QUEUE_FULL_POLL);
            }
            Err((e, back)) => {
                producer.context().fail(back.delivery_opaque, &e);
                return;
            }
        }
    }
}

/// The first index of `needle` in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// Producer context counting delivery reports; keeps the first failure's text.
#[derive(Debug, Default)]
struct DeliveryTally {
    inner: CliContext,
    failed: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl DeliveryTally {
    fn fail(&self, line_number: usize, error: &KafkaError) {
        self.failed.fetch_add(1, Ordering::SeqCst);
        let mut guard = match self.first_error.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if guard.is_none() {
            *guard = Some(format!("line {line_number}: {}", self.inner.explain(error)));
        }
    }

    fn first_error(&self) -> Option<String> {
        match self.first_error.lock() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

impl ClientContext for DeliveryTally {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.inner.log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.inner.error(error, reason);
    }
}

impl ProducerContext for DeliveryTally {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, line_number: usize) {
        if let Err((error, _)) = result {
            self.fail(line_number, error);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{find, parse_line, LineFormat};

    #[test]
    fn lines_split_into_headers_key_and_value_as_kafka_reads_them() {
        let props: Vec<(String, String)> = [("parse.headers", "true"), ("parse.key", "true")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let format = LineFormat::from_args(None, &props).unwrap();
        let (headers, key, value) = parse_line(&format, b"a:1,b:\tk\tv\tw", 1).unwrap();
        assert_eq!(headers, vec![(&b"a"[..], &b"1"[..]), (&b"b"[..], &b""[..])]);
        assert_eq!((key, value), (Some(&b"k"[..]), &b"v\tw"[..]));
        let (headers, key, _) = parse_line(&format, b"\tk\tv", 2).unwrap();
        assert!(headers.is_empty() && key == Some(&b"k"[..]));
        let e = parse_line(&format, b"no-delimiter", 3).unwrap_err();
        assert!(e
            .to_string()
            .contains("no headers delimiter found on line number 3"));
        let e = parse_line(&format, b"nokeysep\tk\tv", 4).unwrap_err();
        assert!(e
            .to_string()
            .contains("no header key separator found in pair 'nokeysep'"));
        let plain = LineFormat::from_args(None, &[]).unwrap();
        assert_eq!(
            parse_line(&plain, b"x\ty", 5).unwrap(),
            (vec![], None, &b"x\ty"[..])
        );
        let bad = [("parse.colour".to_string(), "true".to_string())];
        assert!(LineFormat::from_args(None, &bad).is_err());
    }

    #[test]
    fn find_first_separator() {
        assert_eq!(find(b"k::v::w", b"::"), Some(1));
        assert_eq!(find(b"kv", b"::"), None);
        assert_eq!(find(b"\tv", b"\t"), Some(0));
    }
}
