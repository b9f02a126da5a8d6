//! The `weir` client subcommands (`topic`, `produce`, `consume`, `group`) run as a person would run
//! them: the built binary, against an in-process broker, asserting on stdout, stderr and
//! the exit code.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use crate::harness::{poll_for, wait_until, TestBroker};

/// Longest any single CLI invocation may take before the test fails, in seconds.
const COMMAND_DEADLINE_SECS: u64 = 60;

/// Runs `weir ARGS -b BOOTSTRAP`, feeding `stdin`, under `timeout(1)` so a hung command
/// fails the test (exit 124) instead of hanging it.
fn weir(bootstrap: &str, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new("timeout")
        .arg(COMMAND_DEADLINE_SECS.to_string())
        .arg(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .args(["-b", bootstrap])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn weir");
    let mut child_stdin = child.stdin.take().expect("stdin");
    let input = stdin.to_vec();
    // Write from another thread: a large input must not deadlock against a full stdout pipe.
    let writer = std::thread::spawn(move || {
        let _ = child_stdin.write_all(&input);
    });
    let output = child.wait_with_output().expect("wait for weir");
    let _ = writer.join();
    assert_ne!(
        output.status.code(),
        Some(124),
        "weir {args:?} ran longer than {COMMAND_DEADLINE_SECS} s"
    );
    output
}

/// Runs `weir`, asserts success, returns stdout.
fn ok(bootstrap: &str, args: &[&str], stdin: &[u8]) -> String {
    let out = weir(bootstrap, args, stdin);
    assert!(
        out.status.success(),
        "weir {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

/// Runs `weir`, asserts exit code 1, returns stderr.
fn fails(bootstrap: &str, args: &[&str], stdin: &[u8]) -> String {
    let out = weir(bootstrap, args, stdin);
    assert_eq!(
        out.status.code(),
        Some(1),
        "weir {args:?} should fail; stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr).expect("utf-8 stderr")
}

/// The id of `topic` from a raw Metadata v12 request, in Kafka's printed form
/// (`Uuid.toString`: URL-safe base64 without padding).
fn metadata_topic_id(bootstrap: &str, topic: &str) -> String {
    use base64::Engine as _;
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{MetadataRequest, MetadataResponse, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let mut c = crate::harness::RawConn::connect(bootstrap);
    let req = MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(topic.to_string()))))]));
    let resp: MetadataResponse = crate::harness::decode(c.request(&req, 12, 1).unwrap(), 12);
    let id = resp.topics[0].topic_id;
    assert!(!id.is_nil(), "{topic} has an id");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id.as_bytes())
}

fn partition_line(topic: &str, partition: i32) -> String {
    format!("\tTopic: {topic}\tPartition: {partition}\tLeader: 1\tReplicas: 1\tIsr: 1\n")
}

#[test]
fn topic_create_list_describe_alter_delete() {
    let broker = TestBroker::start();
    let b = broker.bootstrap.as_str();

    let created = ok(
        b,
        &[
            "topic",
            "create",
            "orders",
            "-p",
            "2",
            "-r",
            "1",
            "-c",
            "cleanup.policy=compact",
            "-c",
            "retention.ms=3600000",
        ],
        b"",
    );
    assert_eq!(created, "Created topic orders.\n");
    assert_eq!(
        ok(b, &["topic", "create", "audit"], b""),
        "Created topic audit.\n"
    );

    let again = fails(b, &["topic", "create", "orders", "-p", "2"], b"");
    assert!(
        again.starts_with("weir: error: ") && again.contains("TOPIC_ALREADY_EXISTS"),
        "{again}"
    );
    assert_eq!(
        ok(b, &["topic", "create", "orders", "--if-not-exists"], b""),
        ""
    );

    assert_eq!(ok(b, &["topic", "list"], b""), "audit\norders\n");

    let described = ok(b, &["topic", "describe", "orders"], b"");
    let orders_id = metadata_topic_id(b, "orders");
    assert_eq!(
        orders_id.len(),
        22,
        "Kafka's base64 form of 16 bytes: {orders_id}"
    );
    let expected = format!(
        "Topic: orders\tTopicId: {orders_id}\tPartitionCount: 2\tReplicationFactor: 1\t\
         Configs: cleanup.policy=compact,retention.ms=3600000\n{}{}",
        partition_line("orders", 0),
        partition_line("orders", 1)
    );
    assert_eq!(described, expected);
    // Broker defaults (num.partitions=1) and no topic configs.
    let audit = ok(b, &["topic", "describe", "audit"], b"");
    assert_eq!(
        audit,
        format!(
            "Topic: audit\tTopicId: {}\tPartitionCount: 1\tReplicationFactor: 1\tConfigs: \n{}",
            metadata_topic_id(b, "audit"),
            partition_line("audit", 0)
        )
    );

    assert_eq!(
        ok(b, &["topic", "alter", "orders", "--partitions", "4"], b""),
        ""
    );
    let altered = ok(b, &["topic", "describe", "orders"], b"");
    assert!(
        altered.starts_with(&format!(
            "Topic: orders\tTopicId: {orders_id}\tPartitionCount: 4\t"
        )),
        "{altered}"
    );
    for p in 0..4 {
        assert!(altered.contains(&partition_line("orders", p)), "{altered}");
    }
    let shrink = fails(b, &["topic", "alter", "orders", "--partitions", "2"], b"");
    assert!(shrink.contains("INVALID_PARTITIONS"), "{shrink}");

    assert_eq!(ok(b, &["topic", "delete", "orders"], b""), "");
    assert_eq!(ok(b, &["topic", "list"], b""), "audit\n");
    let gone = fails(b, &["topic", "delete", "orders"], b"");
    assert!(gone.contains("UNKNOWN_TOPIC_OR_PARTITION"), "{gone}");
    assert_eq!(
        ok(b, &["topic", "delete", "orders", "--if-exists"], b""),
        ""
    );
    let missing = fails(b, &["topic", "describe", "orders"], b"");
    assert!(missing.contains("UNKNOWN_TOPIC_OR_PARTITION"), "{missing}");
}

/// Issue 15: topic commands print the broker's error message after Kafka's error name
/// and code (librdkafka's admin client dropped it): the refused config key and value,
/// the existing topic, the partition count.
#[test]
fn topic_errors_carry_the_brokers_message() {
    let broker = TestBroker::start();
    let b = broker.bootstrap.as_str();
    let bad = fails(
        b,
        &["topic", "create", "msg", "-c", "retention.ms=soon"],
        b"",
    );
    assert!(
        bad.contains(
            "topic 'msg': INVALID_CONFIG (40): invalid value for `retention.ms`: `soon` is not an integer"
        ),
        "{bad}"
    );
    assert_eq!(
        ok(b, &["topic", "create", "msg"], b""),
        "Created topic msg.\n"
    );
    let again = fails(b, &["topic", "create", "msg"], b"");
    assert!(
        again.contains("TOPIC_ALREADY_EXISTS (36): Topic 'msg' already exists."),
        "{again}"
    );
    let same = fails(b, &["topic", "alter", "msg", "--partitions", "1"], b"");
    assert!(
        same.contains("INVALID_PARTITIONS (37): Topic already has 1 partitions."),
        "{same}"
    );
    let value = fails(
        b,
        &["topic", "alter", "msg", "--add-config", "retention.ms=soon"],
        b"",
    );
    assert!(
        value.contains(
            "topic 'msg': INVALID_CONFIG (40): invalid value for `retention.ms`: `soon` is not an integer"
        ),
        "{value}"
    );
}

/// The `Configs: ...` field of `weir topic describe NAME`'s first line.
fn described_configs(b: &str, topic: &str) -> String {
    let out = ok(b, &["topic", "describe", topic], b"");
    let first = out.lines().next().unwrap_or_default();
    first
        .split('\t')
        .find_map(|f| f.strip_prefix("Configs: "))
        .unwrap_or_else(|| panic!("no Configs field in {first:?}"))
        .to_string()
}

#[test]
fn topic_alter_adds_and_deletes_configs() {
    let broker = TestBroker::start();
    let b = broker.bootstrap.as_str();
    ok(
        b,
        &["topic", "create", "cfg", "-c", "retention.ms=60000"],
        b"",
    );

    let add = [
        "topic",
        "alter",
        "cfg",
        "--add-config",
        "max.message.bytes=2000",
        "--add-config",
        "cleanup.policy=compact,delete",
    ];
    assert_eq!(ok(b, &add, b""), "");
    assert_eq!(
        described_configs(b, "cfg"),
        "cleanup.policy=compact,delete,max.message.bytes=2000,retention.ms=60000"
    );
    let delete = ["topic", "alter", "cfg", "--delete-config", "retention.ms"];
    assert_eq!(ok(b, &delete, b""), "");
    assert_eq!(
        described_configs(b, "cfg"),
        "cleanup.policy=compact,delete,max.message.bytes=2000"
    );
    // Partitions and configs in one go.
    let both = [
        "topic",
        "alter",
        "cfg",
        "-p",
        "3",
        "--add-config",
        "retention.ms=1000",
        "--delete-config",
        "cleanup.policy",
    ];
    assert_eq!(ok(b, &both, b""), "");
    let described = ok(b, &["topic", "describe", "cfg"], b"");
    assert!(
        described.starts_with(&format!(
            "Topic: cfg\tTopicId: {}\tPartitionCount: 3\tReplicationFactor: 1\t\
             Configs: max.message.bytes=2000,retention.ms=1000\n",
            metadata_topic_id(b, "cfg")
        )),
        "{described}"
    );

    // Refusals leave the topic as it was.
    let unknown = fails(
        b,
        &["topic", "alter", "cfg", "--add-config", "no.such=1"],
        b"",
    );
    assert!(
        unknown.contains("INVALID_CONFIG") && unknown.contains("no.such"),
        "{unknown}"
    );
    let bad = fails(
        b,
        &["topic", "alter", "cfg", "--add-config", "retention.ms=soon"],
        b"",
    );
    assert!(bad.contains("INVALID_CONFIG"), "{bad}");
    let absent = fails(
        b,
        &["topic", "alter", "cfg", "--delete-config", "segment.ms"],
        b"",
    );
    assert!(absent.contains("segment.ms"), "{absent}");
    let nope = fails(
        b,
        &["topic", "alter", "nope", "--add-config", "retention.ms=1"],
        b"",
    );
    assert!(nope.contains("UNKNOWN_TOPIC_OR_PARTITION"), "{nope}");
    assert_eq!(
        described_configs(b, "cfg"),
        "max.message.bytes=2000,retention.ms=1000"
    );
    // Nothing to alter is a usage error.
    let out = weir(b, &["topic", "alter", "cfg"], b"");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

#[test]
fn produce_keyed_lines_and_consume_them_with_keys() {
    let broker = TestBroker::start();
    let b = broker.bootstrap.as_str();
    ok(b, &["topic", "create", "keyed", "-p", "3"], b"");

    let mut input = String::new();
    let mut expected = Vec::new();
    for i in 0..1000 {
        // The separator is the first "::"; the value may contain it again.
        input.push_str(&format!("key-{}::value-{i}::x\n", i % 17));
        expected.push(format!("key-{}\tvalue-{i}::x", i % 17));
    }
    let produced = weir(
        b,
        &["produce", "keyed", "--key-separator", "::"],
        input.as_bytes(),
    );
    assert!(
        produced.status.success(),
        "{}",
        String::from_utf8_lossy(&produced.stderr)
    );
    assert!(produced.stdout.is_empty());

    let out = weir(
        b,
        &[
            "consume",
            "keyed",
            "--from-beginning",
            "--print-key",
            "-n",
            "1000",
            "--timeout-ms",
            "20000",
        ],
        b"",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let mut got: Vec<String> = stdout.lines().map(str::to_string).collect();
    assert_eq!(got.len(), 1000, "{stdout}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Processed a total of 1000 messages"));

    // Partitions interleave, but one key lives in one partition: per key, produce order.
    for key in 0..17 {
        let prefix = format!("key-{key}\t");
        let of_key: Vec<&String> = got.iter().filter(|l| l.starts_with(&prefix)).collect();
        let want: Vec<&String> = expected.iter().filter(|l| l.starts_with(&prefix)).collect();
        assert_eq!(of_key, want, "key-{key} out of order");
    }
    got.sort();
    expected.sort();
    assert_eq!(got, expected);

    // Without --print-key only values; a custom separator between key and value.
    let values = ok(
        b,
        &[
            "consume",
            "keyed",
            "--from-beginning",
            "-n",
            "3",
            "--print-key",
            "--key-separator",
            "=",
        ],
        b"",
    );
    for line in values.lines() {
        assert!(
            line.starts_with("key-") && line.contains("=value-"),
            "{line}"
        );
    }

    let bad = fails(
        b,
        &["produce", "keyed", "--key-separator", "::"],
        b"no separator here\n",
    );
    assert!(
        bad.contains("no key separator found on line number 1"),
        "{bad}"
    );
}

#[test]
fn produce_headers_and_consume_with_kafkas_print_properties() {
    let broker = TestBroker::start();
    let b = broker.bootstrap.as_str();
    ok(b, &["topic", "create", "props", "-p", "2"], b"");
    ok(
        b,
        &[
            "produce",
            "props",
            "-p",
            "1",
            "--key-separator",
            ":",
            "--header",
            "source=cli",
            "--header",
            "trace=",
            "--header",
            "source=again",
        ],
        b"k1:v1\nk2:v2\n",
    );
    let all = [
        "--property",
        "print.partition=true",
        "--property",
        "print.offset=true",
        "--property",
        "print.headers=true",
        "--property",
        "print.key=true",
        "--property",
        "key.separator=|",
    ];
    let mut args = vec!["consume", "props", "-p", "1", "--offset", "1", "-n", "1"];
    args.extend_from_slice(&all);
    assert_eq!(
        ok(b, &args, b""),
        "Partition:1|Offset:1|source:cli,trace:,source:again|k2|v2\n"
    );

    // kafka-console-producer's parse.headers: per-line headers before the key.
    ok(
        b,
        &[
            "produce",
            "props",
            "-p",
            "1",
            "--property",
            "parse.headers=true",
            "--property",
            "parse.key=true",
        ],
        b"h:1,g:x\tk3\tv3\n",
    );
    let mut args = vec!["consume", "props", "-p", "1", "--offset", "2", "-n", "1"];
    args.extend_from_slice(&all);
    assert_eq!(ok(b, &args, b""), "Partition:1|Offset:2|h:1,g:x|k3|v3\n");

    // print.timestamp with CreateTime stamps from a real client; --from-timestamp
    // starts at the first record at or after it (ListOffsets by time).
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", b)
        .create()
        .unwrap();
    for (i, ts) in [1_000_000_i64, 2_000_000, 3_000_000].iter().enumerate() {
        let value = format!("t{i}");
        p.send(
            BaseRecord::<(), str>::to("props")
                .partition(0)
                .payload(&value)
                .timestamp(*ts),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    }
    p.flush(std::time::Duration::from_secs(10)).unwrap();
    let from = ok(
        b,
        &[
            "consume",
            "props",
            "-p",
            "0",
            "--from-timestamp",
            "1500000",
            "-n",
            "2",
            "--property",
            "print.timestamp=true",
            "--property",
            "print.offset=true",
            "--property",
            "print.headers=true",
        ],
        b"",
    );
    assert_eq!(
        from,
        "CreateTime:2000000\tOffset:1\tNO_HEADERS\tt1\nCreateTime:3000000\tOffset:2\tNO_HEADERS\tt2\n"
    );
    // Every partition, from a time after everything: nothing, until the idle timeout.
    let none = ok(
        b,
        &[
            "consume",
            "props",
            "--from-timestamp",
            "9000000000000",
            "--timeout-ms",
            "1000",
        ],
        b"",
    );
    assert_eq!(none, "");
    let bad = fails(
        b,
        &[
            "consume",
            "props",
            "--property",
            "print.colour=true",
            "-n",
            "1",
        ],
        b"",
    );
    assert!(bad.contains("print.colour"), "{bad}");
    // A usage error: clap's exit code 2, nothing sent.
    let bad = weir(b, &["produce", "props", "--header", "=x"], b"a\n");
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("non-empty KEY"),
        "{bad:?}"
    );
}

#[test]
fn consume_one_partition_from_an_offset() {
    let broker = TestBroker::start();
    let b = broker.bootstrap.as_str();
    ok(b, &["topic", "create", "pp", "-p", "2"], b"");

    let ones: String = (0..10).map(|i| format!("one-{i}\n")).collect();
    ok(b, &["produce", "pp", "-p", "1"], ones.as_bytes());
    ok(
        b,
        &["produce", "pp", "-p", "0", "--acks", "1"],
        b"zero-0\nzero-1\n",
    );

    let from_5 = ok(
        b,
        &[
            "consume",
            "pp",
            "-p",
            "1",
            "--offset",
            "5",
            "--timeout-ms",
            "2000",
        ],
        b"",
    );
    assert_eq!(from_5, "one-5\none-6\none-7\none-8\none-9\n");

    let zero = ok(
        b,
        &[
            "consume",
            "pp",
            "-p",
            "0",
            "--offset",
            "earliest",
            "--print-key",
            "-n",
            "2",
        ],
        b"",
    );
    assert_eq!(zero, "null\tzero-0\nnull\tzero-1\n");

    let whole = ok(
        b,
        &["consume", "pp", "--from-beginning", "--timeout-ms", "2000"],
        b"",
    );
    assert_eq!(whole.lines().count(), 12, "{whole}");

    // From the end (the default): nothing old, and --timeout-ms ends the wait.
    let latest = weir(b, &["consume", "pp", "--timeout-ms", "1000"], b"");
    assert!(latest.status.success());
    assert!(latest.stdout.is_empty());

    let no_partition = fails(b, &["consume", "pp", "--offset", "3"], b"");
    assert!(
        no_partition.contains("partition is required"),
        "{no_partition}"
    );
    let bad_partition = fails(b, &["consume", "pp", "-p", "7", "--timeout-ms", "500"], b"");
    assert!(
        bad_partition.contains("UNKNOWN_TOPIC_OR_PARTITION"),
        "{bad_partition}"
    );
    let no_topic = fails(b, &["consume", "nope", "--timeout-ms", "500"], b"");
    assert!(
        no_topic.contains("UNKNOWN_TOPIC_OR_PARTITION"),
        "{no_topic}"
    );
}

#[test]
fn produce_and_consume_100k_lines_in_order() {
    let broker = TestBroker::start();
    let b = broker.bootstrap.as_str();
    ok(b, &["topic", "create", "stream", "-p", "1"], b"");
    let input: String = (0..100_000).map(|i| format!("line-{i}\n")).collect();

    ok(
        b,
        &["produce", "stream", "--compression", "lz4"],
        input.as_bytes(),
    );
    let out = ok(
        b,
        &["consume", "stream", "--from-beginning", "-n", "100000"],
        b"",
    );
    // One partition: Kafka keeps produce order.
    assert!(
        out == input,
        "consumed records differ from the 100000 lines produced"
    );
}

/// A broker whose groups rebalance at once (Kafka's 3 s initial delay would only slow
/// every join down).
fn group_broker() -> TestBroker {
    TestBroker::start_with(&["group.initial.rebalance.delay.ms=0"])
}

/// The data rows of `weir group describe GROUP` (offsets view), split on whitespace,
/// after checking the header; the command must succeed.
fn describe_rows(b: &str, group: &str) -> Vec<Vec<String>> {
    let out = ok(b, &["group", "describe", group], b"");
    let mut lines = out.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "GROUP",
            "TOPIC",
            "PARTITION",
            "CURRENT-OFFSET",
            "LOG-END-OFFSET",
            "LAG",
            "CONSUMER-ID",
            "HOST",
            "CLIENT-ID"
        ],
        "{out}"
    );
    lines
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

/// `weir group describe GROUP`'s row for one partition: CURRENT-OFFSET, LOG-END-OFFSET,
/// LAG and CONSUMER-ID.
fn offsets_of(b: &str, group: &str, topic: &str, partition: i32) -> [String; 4] {
    let rows = describe_rows(b, group);
    let row = rows
        .iter()
        .find(|r| r[0] == group && r[1] == topic && r[2] == partition.to_string())
        .unwrap_or_else(|| panic!("no row for {topic}-{partition} in {rows:?}"));
    assert_eq!(row.len(), 9, "{row:?}");
    [
        row[3].clone(),
        row[4].clone(),
        row[5].clone(),
        row[6].clone(),
    ]
}

/// `[CURRENT-OFFSET, LOG-END-OFFSET, LAG, "-"]` for a group without members.
fn idle(current: &str, log_end: &str, lag: &str) -> [String; 4] {
    [current, log_end, lag, "-"].map(str::to_string)
}

/// `(group, state)` rows of `weir group list ARGS`, after checking the header.
fn group_list(b: &str, extra: &[&str]) -> Vec<(String, String)> {
    let mut args = vec!["group", "list"];
    args.extend_from_slice(extra);
    let out = ok(b, &args, b"");
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("GROUP           STATE"), "{out}");
    lines
        .map(|l| {
            let (g, s) = l.split_once(' ').expect("two columns");
            (g.to_string(), s.trim().to_string())
        })
        .collect()
}

/// `NEW-OFFSET` per partition of a reset plan printed by `weir group reset-offsets`.
fn plan(out: &str) -> Vec<(String, i32, i64)> {
    let mut lines = out.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"],
        "{out}"
    );
    lines
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 4, "{l}");
            (
                f[1].to_string(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn group_consume_commits_and_offsets_can_be_described_and_reset() {
    let broker = group_broker();
    let b = broker.bootstrap.as_str();
    ok(b, &["topic", "create", "gt", "-p", "1"], b"");
    let input: String = (0..10).map(|i| format!("r-{i}\n")).collect();
    ok(b, &["produce", "gt"], input.as_bytes());

    let consume = |n: &str, from_beginning: bool| {
        let mut args = vec!["consume", "gt", "--group", "g", "-n", n];
        if from_beginning {
            args.push("--from-beginning");
        }
        ok(b, &args, b"")
    };
    assert_eq!(consume("4", true), "r-0\nr-1\nr-2\nr-3\n");
    // The consumer left the group when it ended: Empty, with what it printed committed.
    let described = weir(b, &["group", "describe", "g"], b"");
    assert!(described.status.success());
    assert!(
        String::from_utf8_lossy(&described.stderr)
            .contains("Consumer group 'g' has no active members."),
        "{described:?}"
    );
    assert_eq!(
        describe_rows(b, "g"),
        vec![vec!["g", "gt", "0", "4", "10", "6", "-", "-", "-"]]
    );
    assert_eq!(group_list(b, &[]), [("g".to_string(), "Empty".to_string())]);
    assert_eq!(group_list(b, &["--state", "empty"]).len(), 1);
    assert!(group_list(b, &["--state", "Stable"]).is_empty());

    // The group goes on from its committed offset; --from-beginning does not move it.
    assert_eq!(consume("2", true), "r-4\nr-5\n");
    assert_eq!(offsets_of(b, "g", "gt", 0), idle("6", "10", "4"));

    let reset = |spec: &[&str], mode: &str| {
        let mut args = vec!["group", "reset-offsets", "g", "--topic", "gt"];
        args.extend_from_slice(spec);
        args.push(mode);
        ok(b, &args, b"")
    };
    let dry = reset(&["--to-earliest"], "--dry-run");
    assert_eq!(plan(&dry), [("gt".to_string(), 0, 0)]);
    assert!(
        dry.starts_with(&format!(
            "{:<30} {:<30} {:<10} NEW-OFFSET\n",
            "GROUP", "TOPIC", "PARTITION"
        )),
        "{dry}"
    );
    assert_eq!(offsets_of(b, "g", "gt", 0), idle("6", "10", "4"));

    assert_eq!(
        plan(&reset(&["--to-earliest"], "--execute")),
        [("gt".to_string(), 0, 0)]
    );
    assert_eq!(offsets_of(b, "g", "gt", 0), idle("0", "10", "10"));
    assert_eq!(consume("1", false), "r-0\n");
    assert_eq!(offsets_of(b, "g", "gt", 0), idle("1", "10", "9"));

    // Offsets are clamped into [log start, log end], with Kafka's note on stderr.
    let far = weir(
        b,
        &[
            "group",
            "reset-offsets",
            "g",
            "--topic",
            "gt",
            "--shift-by",
            "100",
            "--execute",
        ],
        b"",
    );
    assert!(far.status.success(), "{far:?}");
    assert_eq!(
        plan(&String::from_utf8_lossy(&far.stdout)),
        [("gt".to_string(), 0, 10)]
    );
    assert!(
        String::from_utf8_lossy(&far.stderr).contains(
            "New offset (101) is higher than latest offset for topic partition gt-0. \
             Value will be set to 10"
        ),
        "{far:?}"
    );
    assert_eq!(
        plan(&reset(&["--shift-by", "-3"], "--execute")),
        [("gt".to_string(), 0, 7)]
    );
    assert_eq!(
        plan(&reset(&["--shift-by=-30"], "--dry-run")),
        [("gt".to_string(), 0, 0)]
    );
    assert_eq!(
        plan(&reset(&["--to-offset", "20"], "--dry-run")),
        [("gt".to_string(), 0, 10)]
    );
    assert_eq!(
        plan(&reset(&["--to-offset", "-5"], "--dry-run")),
        [("gt".to_string(), 0, 0)]
    );
    assert_eq!(offsets_of(b, "g", "gt", 0), idle("7", "10", "3"));
    assert_eq!(
        plan(&reset(&["--to-latest"], "--execute")),
        [("gt".to_string(), 0, 10)]
    );
    assert_eq!(offsets_of(b, "g", "gt", 0), idle("10", "10", "0"));
    assert_eq!(
        plan(&reset(&["--to-offset", "5"], "--execute")),
        [("gt".to_string(), 0, 5)]
    );
    assert_eq!(consume("1", false), "r-5\n");

    // By time: every record is newer than 2001, none is from 2999 (then: the log end).
    assert_eq!(
        plan(&reset(
            &["--to-datetime", "2001-01-01T00:00:00.000"],
            "--dry-run"
        )),
        [("gt".to_string(), 0, 0)]
    );
    assert_eq!(
        plan(&reset(
            &["--to-datetime", "2999-01-01T00:00:00.000+02:00"],
            "--dry-run"
        )),
        [("gt".to_string(), 0, 10)]
    );
    let bad_time = weir(
        b,
        &[
            "group",
            "reset-offsets",
            "g",
            "--topic",
            "gt",
            "--to-datetime",
            "yesterday",
            "--dry-run",
        ],
        b"",
    );
    assert_eq!(bad_time.status.code(), Some(2), "{bad_time:?}");
    // Neither --dry-run nor --execute, or two specs: usage errors.
    let no_mode = weir(
        b,
        &[
            "group",
            "reset-offsets",
            "g",
            "--topic",
            "gt",
            "--to-earliest",
        ],
        b"",
    );
    assert_eq!(no_mode.status.code(), Some(2), "{no_mode:?}");
    assert!(
        String::from_utf8_lossy(&no_mode.stderr).contains("--dry-run"),
        "{no_mode:?}"
    );
    let two = weir(
        b,
        &[
            "group",
            "reset-offsets",
            "g",
            "--topic",
            "gt",
            "--to-earliest",
            "--to-latest",
            "--dry-run",
        ],
        b"",
    );
    assert_eq!(two.status.code(), Some(2), "{two:?}");
    let unknown = fails(
        b,
        &[
            "group",
            "reset-offsets",
            "g",
            "--topic",
            "nope",
            "--to-earliest",
            "--dry-run",
        ],
        b"",
    );
    assert!(unknown.contains("UNKNOWN_TOPIC_OR_PARTITION"), "{unknown}");
    let bad_partition = fails(
        b,
        &[
            "group",
            "reset-offsets",
            "g",
            "--topic",
            "gt:0,3",
            "--to-earliest",
            "--dry-run",
        ],
        b"",
    );
    assert!(bad_partition.contains("partition 3"), "{bad_partition}");
    let no_commit = fails(
        b,
        &[
            "group",
            "reset-offsets",
            "fresh",
            "--topic",
            "gt",
            "--shift-by",
            "1",
            "--dry-run",
        ],
        b"",
    );
    assert!(
        no_commit.contains(
            "Cannot shift offset for partition gt-0 since there is no current committed offset"
        ),
        "{no_commit}"
    );
    // A reset of a group that does not exist yet creates it (as Kafka's tool).
    reset_new_group(b);

    assert_eq!(
        ok(b, &["group", "delete", "g"], b""),
        "Deletion of requested consumer groups ('g') was successful.\n"
    );
    let gone = fails(b, &["group", "describe", "g"], b"");
    assert!(
        gone.contains("Consumer group 'g' does not exist."),
        "{gone}"
    );
    let again = fails(b, &["group", "delete", "g"], b"");
    assert!(again.contains("GROUP_ID_NOT_FOUND"), "{again}");
    assert!(!group_list(b, &[]).iter().any(|(g, _)| g == "g"));
}

fn reset_new_group(b: &str) {
    let out = ok(
        b,
        &[
            "group",
            "reset-offsets",
            "fresh",
            "--topic",
            "gt:0",
            "--to-offset",
            "3",
            "--execute",
        ],
        b"",
    );
    assert_eq!(plan(&out), [("gt".to_string(), 0, 3)]);
    assert_eq!(offsets_of(b, "fresh", "gt", 0), idle("3", "10", "7"));
    assert!(group_list(b, &[]).contains(&("fresh".to_string(), "Empty".to_string())));
}

#[test]
fn group_with_a_member_is_described_and_cannot_be_reset_or_deleted() {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};

    let broker = group_broker();
    let b = broker.bootstrap.as_str();
    ok(b, &["topic", "create", "busy", "-p", "2"], b"");
    ok(b, &["produce", "busy", "-p", "0"], b"a\nb\nc\n");

    let member: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", b)
        .set("group.id", "live")
        .set("client.id", "it-live")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    member.subscribe(&["busy"]).expect("subscribe");
    wait_until("the member gets both partitions", 30, || {
        let _ = member.poll(std::time::Duration::from_millis(100));
        member.assignment().map(|a| a.count()).unwrap_or(0) == 2
    });
    // The broker's view can trail the member's by a SyncGroup: wait for Stable.
    wait_until("the group is Stable", 30, || {
        group_list(b, &[]).contains(&("live".to_string(), "Stable".to_string()))
    });

    let rows = describe_rows(b, "live");
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (p, row) in rows.iter().enumerate() {
        assert_eq!(&row[..4], ["live", "busy", &p.to_string(), "-"], "{row:?}");
        assert_eq!(row[5], "-", "{row:?}");
        assert!(row[6].starts_with("it-live-"), "{row:?}");
        assert_eq!(row[8], "it-live", "{row:?}");
    }
    assert_eq!(rows[0][4], "3");
    assert_eq!(rows[1][4], "0");

    let members = ok(b, &["group", "describe", "live", "--members"], b"");
    let lines: Vec<Vec<&str>> = members
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
    );
    assert_eq!(lines.len(), 2, "{members}");
    assert_eq!(lines[1][0], "live");
    assert_eq!(lines[1][3..], ["it-live", "2"]);

    let state = ok(b, &["group", "describe", "live", "--state"], b"");
    let lines: Vec<&str> = state.lines().collect();
    assert!(
        lines[0].starts_with("GROUP") && lines[0].contains("COORDINATOR (ID)"),
        "{state}"
    );
    let fields: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(fields[0], "live");
    assert_eq!(fields[1], b);
    assert_eq!(fields[2..], ["(1)", "range", "Stable", "1"], "{state}");

    let refused = fails(
        b,
        &[
            "group",
            "reset-offsets",
            "live",
            "--topic",
            "busy",
            "--to-earliest",
            "--execute",
        ],
        b"",
    );
    assert!(
        refused.contains(
            "Assignments can only be reset if the group 'live' is inactive, but the current \
             state is Stable."
        ),
        "{refused}"
    );
    let not_deleted = fails(b, &["group", "delete", "live"], b"");
    assert!(
        not_deleted.contains("NON_EMPTY_GROUP") && not_deleted.contains("still has members"),
        "{not_deleted}"
    );

    // Once the member leaves, the group is Empty and both work.
    drop(member);
    wait_until("the group is Empty", 30, || {
        group_list(b, &[]).contains(&("live".to_string(), "Empty".to_string()))
    });
    let out = ok(
        b,
        &[
            "group",
            "reset-offsets",
            "live",
            "--topic",
            "busy:0",
            "--to-offset",
            "1",
            "--execute",
        ],
        b"",
    );
    assert_eq!(plan(&out), [("busy".to_string(), 0, 1)]);
    assert_eq!(offsets_of(b, "live", "busy", 0), idle("1", "3", "2"));
    assert_eq!(
        ok(b, &["group", "delete", "live"], b""),
        "Deletion of requested consumer groups ('live') was successful.\n"
    );
}

#[test]
fn group_consume_commits_on_sigterm() {
    use std::io::BufRead;
    use std::time::{Duration, Instant};

    let broker = group_broker();
    let b = broker.bootstrap.as_str();
    ok(b, &["topic", "create", "two", "-p", "2"], b"");
    ok(b, &["produce", "two", "-p", "0"], b"a\nb\nc\n");
    ok(b, &["produce", "two", "-p", "1"], b"d\ne\n");

    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args([
            "consume",
            "two",
            "--group",
            "term",
            "--from-beginning",
            "-b",
            b,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn weir consume");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.len() < 5 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => seen.push(line),
            Err(_) => {
                let _ = child.kill();
                panic!("only {seen:?} consumed within 30 s");
            }
        }
    }
    seen.sort();
    assert_eq!(seen, ["a", "b", "c", "d", "e"]);

    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(term.success());
    let status = poll_for("weir consume ends after SIGTERM", 30, || {
        child
            .try_wait()
            .expect("try_wait")
            .ok_or_else(|| "it is still running".to_string())
    });
    assert!(status.success(), "{status}");
    // Committed on the way out (the run is shorter than the 5 s auto-commit interval), and
    // the member left: the group is Empty at once.
    assert_eq!(offsets_of(b, "term", "two", 0), idle("3", "3", "0"));
    assert_eq!(offsets_of(b, "term", "two", 1), idle("2", "2", "0"));
    assert!(group_list(b, &[]).contains(&("term".to_string(), "Empty".to_string())));
}
