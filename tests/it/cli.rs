//! The `weir` client subcommands (`topic`, `produce`, `consume`) run as a person would run
//! them: the built binary, against an in-process broker, asserting on stdout, stderr and
//! the exit code.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use crate::harness::TestBroker;

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
    let expected = format!(
        "Topic: orders\tTopicId: -\tPartitionCount: 2\tReplicationFactor: 1\t\
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
            "Topic: audit\tTopicId: -\tPartitionCount: 1\tReplicationFactor: 1\tConfigs: \n{}",
            partition_line("audit", 0)
        )
    );

    assert_eq!(
        ok(b, &["topic", "alter", "orders", "--partitions", "4"], b""),
        ""
    );
    let altered = ok(b, &["topic", "describe", "orders"], b"");
    assert!(
        altered.starts_with("Topic: orders\tTopicId: -\tPartitionCount: 4\t"),
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
        described.starts_with(
            "Topic: cfg\tTopicId: -\tPartitionCount: 3\tReplicationFactor: 1\t\
             Configs: max.message.bytes=2000,retention.ms=1000\n"
        ),
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
