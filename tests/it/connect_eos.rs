//! Exactly-once source connectors (issue 14, KIP-618): with the broker's
//! `connect.exactly.once.source.support=enabled`, a file source writes each poll's records
//! and their source offsets in one transaction, so the broker killed with -9 while the
//! file grows leaves each line in the topic once for a read_committed consumer; the
//! connector keys (`exactly.once.support`, `transaction.boundary`,
//! `transaction.boundary.interval.ms`) are checked with the reason, and `required` on a
//! broker where the support is disabled is refused.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::connect::{append, dirs, plugin_path};
use crate::connect_rest::{curl, refused, wait_for_state};
use crate::harness::{BinaryBroker, TestBroker};
use crate::transforms::read_everything;

/// Line `i` of the input: its text is its key (distinct per line).
fn line(i: usize) -> String {
    format!("eos-line-{i:06}\n")
}

/// Issue 14 (KIP-618) test (a), `transaction.boundary=poll`: see [`kill_loop`].
#[test]
fn an_exactly_once_file_source_writes_each_line_once_across_kill_9_of_the_broker() {
    kill_loop("poll", "transaction.boundary = \"poll\"\n");
}

/// Issue 14 (KIP-618) test (a), `transaction.boundary=interval` (300 ms: a transaction
/// is open most of the time, so a kill mostly lands inside one): see [`kill_loop`].
#[test]
fn an_exactly_once_interval_file_source_writes_each_line_once_across_kill_9() {
    kill_loop(
        "interval",
        "transaction.boundary = \"interval\"\n\"transaction.boundary.interval.ms\" = 300\n",
    );
}

/// A file source with `exactly.once.support=required` and `boundary` keys on a broker
/// with the support enabled, while the file grows and the broker is killed with -9 three
/// times: read_committed, the topic holds every line exactly once (counted per line), and
/// the task's transactional id `connect-cluster-eos-src-0` is known to the coordinator;
/// what read_uncommitted sees beyond that (aborted copies: evidence a kill landed
/// mid-transaction) is printed, not asserted.
fn kill_loop(label: &str, boundary: &str) {
    const TOTAL: usize = 30_000;
    const KILLS: usize = 3;
    let d = dirs();
    std::fs::write(
        d.configs.join("eos-src.toml"),
        format!(
            "name = \"eos-src\"\nconnector.class = \"file-source\"\nfile = \"{}\"\n\
             topic = \"eos-lines\"\nbatch.size = 300\npoll.interval.ms = 20\n\
             exactly.once.support = \"required\"\n{boundary}",
            d.input.display()
        ),
    )
    .unwrap();
    let overrides = [
        format!("connect.config.dir={}", d.configs.display()),
        format!("connect.plugin.path={}", plugin_path().display()),
        "connect.exactly.once.source.support=enabled".to_string(),
        "transaction.state.log.num.partitions=3".to_string(),
        "offsets.topic.num.partitions=3".to_string(),
    ];
    let overrides: Vec<&str> = overrides.iter().map(String::as_str).collect();
    std::fs::write(&d.input, "").unwrap();
    let mut broker = BinaryBroker::spawn(&d.data, 0, &overrides);
    let port: u16 = broker
        .bootstrap
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let started = Instant::now();
    // The application keeps writing while the broker is killed and restarted.
    let input = d.input.clone();
    let writer = std::thread::spawn(move || {
        for from in (0..TOTAL).step_by(200) {
            let chunk: String = (from..from + 200).map(line).collect();
            append(&input, &chunk);
            // Pacing of the workload (an application writing over time), not a wait.
            std::thread::sleep(Duration::from_millis(30));
        }
    });
    for _ in 0..KILLS {
        // Pacing of the kills (the source is mid-stream), not a wait for a condition.
        std::thread::sleep(Duration::from_millis(1200));
        let stderr = broker.kill9();
        assert!(!stderr.contains("panicked"), "{stderr}");
        broker = BinaryBroker::spawn(&d.data, port, &overrides);
    }
    writer.join().unwrap();
    let bootstrap = broker.bootstrap.clone();
    // Wait (bounded) until read_committed shows every line, then count.
    let deadline = Instant::now() + Duration::from_secs(40);
    let committed = loop {
        let got = read_everything(
            &bootstrap,
            "eos-lines",
            1,
            "read_committed",
            Duration::from_millis(1500),
        );
        let distinct: std::collections::BTreeSet<&String> = got.iter().collect();
        if distinct.len() >= TOTAL || Instant::now() > deadline {
            break got;
        }
    };
    let uncommitted = read_everything(
        &bootstrap,
        "eos-lines",
        1,
        "read_uncommitted",
        Duration::from_millis(1500),
    );
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for v in &committed {
        *counts.entry(v.as_str()).or_default() += 1;
    }
    let want: Vec<String> = (0..TOTAL).map(|i| line(i).trim_end().to_string()).collect();
    let lost: Vec<&String> = want
        .iter()
        .filter(|w| !counts.contains_key(w.as_str()))
        .collect();
    let duplicated: Vec<(&str, usize)> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(v, n)| (*v, *n))
        .collect();
    let (code, status) = curl(
        "GET",
        &format!("{}/connectors/eos-src/status", broker.admin_url),
        None,
    );
    eprintln!(
        "exactly-once file source ({label}): {KILLS} kills in {:?}, {TOTAL} lines, read_committed {} \
         (lost {}, duplicated {}), read_uncommitted {} ({} aborted copies), status {code} {status}",
        started.elapsed(),
        committed.len(),
        lost.len(),
        duplicated.len(),
        uncommitted.len(),
        uncommitted.len().saturating_sub(committed.len()),
    );
    assert!(
        lost.is_empty(),
        "lost {} e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    assert!(
        duplicated.is_empty(),
        "duplicated {} e.g. {:?}",
        duplicated.len(),
        &duplicated[..duplicated.len().min(5)]
    );
    assert_eq!(committed.len(), TOTAL);
    assert!(uncommitted.len() >= committed.len());
    assert_eq!(status["connector"]["state"], "RUNNING", "{status}");
    let out = std::process::Command::new(crate::harness::weir_bin())
        .args(["transaction", "list", "-b", &bootstrap])
        .output()
        .expect("run weir");
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("connect-cluster-eos-src-0\t")),
        "{listed}"
    );
    broker.terminate();
}

/// An in-process broker with the file-source plugin and
/// `connect.exactly.once.source.support=enabled`, and its dirs with an empty input file.
fn eos_broker() -> (crate::connect::Dirs, TestBroker) {
    let d = dirs();
    std::fs::write(&d.input, "").unwrap();
    let plugins = format!("connect.plugin.path={}", plugin_path().display());
    let broker = TestBroker::start_in(
        &d.data,
        &[&plugins, "connect.exactly.once.source.support=enabled"],
    );
    (d, broker)
}

/// Issue 14 (KIP-618) test (b): bad values of the exactly-once keys are refused at create
/// with 400 and the reason; good ones are accepted and shown by the REST config.
#[test]
fn bad_exactly_once_source_keys_are_refused_with_the_reason() {
    let (d, broker) = eos_broker();
    let admin = broker.admin_url.clone();
    let file = d.input.display().to_string();
    let base = |key: &str, value: &str| json!({"connector.class": "file-source", "file": file, "topic": "t", key: value});
    refused(
        &admin,
        base("exactly.once.support", "sometimes"),
        &["exactly.once.support", "expected requested or required"],
    );
    refused(
        &admin,
        base("transaction.boundary", "batch"),
        &[
            "transaction.boundary",
            "expected poll, interval or connector",
        ],
    );
    refused(
        &admin,
        base("transaction.boundary", "connector"),
        &[
            "transaction.boundary",
            "no weir connector can define transaction boundaries",
        ],
    );
    refused(
        &admin,
        base("transaction.boundary.interval.ms", "-5"),
        &["`-5` is below the minimum 0"],
    );
    // Good values run, and the REST config shows them.
    let body = json!({"name": "good", "config": {
        "connector.class": "file-source", "file": file, "topic": "t",
        "exactly.once.support": "required", "transaction.boundary": "interval",
        "transaction.boundary.interval.ms": "200"}});
    let (code, created) = curl("POST", &format!("{admin}/connectors"), Some(&body));
    assert_eq!(code, 201, "{created}");
    let (_, config) = curl("GET", &format!("{admin}/connectors/good/config"), None);
    assert_eq!(config["exactly.once.support"], "required", "{config}");
    assert_eq!(config["transaction.boundary"], "interval", "{config}");
    wait_for_state(&admin, "good", "RUNNING");
    append(&d.input, "one\ntwo\n");
    let got = crate::connect::read_topic(&broker.bootstrap, "t", 2);
    assert_eq!(got.len(), 2, "{got:?}");
    broker.stop();
}

/// Issue 14 (KIP-618) test (c): `exactly.once.support=required` on a broker whose
/// `connect.exactly.once.source.support` is disabled (the default) is refused with the
/// reason; `requested` runs (at least once).
#[test]
fn required_exactly_once_on_a_broker_with_it_disabled_is_refused() {
    let d = dirs();
    let plugins = format!("connect.plugin.path={}", plugin_path().display());
    let broker = TestBroker::start_in(&d.data, &[&plugins]);
    let admin = broker.admin_url.clone();
    let file = d.input.display().to_string();
    refused(
        &admin,
        json!({"connector.class": "file-source", "file": file, "topic": "t",
               "exactly.once.support": "required"}),
        &[
            "exactly.once.support",
            "connect.exactly.once.source.support is disabled, not enabled",
        ],
    );
    let body = json!({"name": "ok", "config": {
        "connector.class": "file-source", "file": file, "topic": "t",
        "exactly.once.support": "requested"}});
    let (code, created) = curl("POST", &format!("{admin}/connectors"), Some(&body));
    assert_eq!(code, 201, "{created}");
    broker.stop();
}

/// Issue 14 (KIP-618): an exactly-once source's dead letters go in its transaction. A
/// line too large for its topic, under `errors.tolerance=all`, reaches the dead-letter
/// topic; read_committed, the topic holds the other lines and the dead-letter topic the
/// large one, and both partitions were written by the producer of the task's
/// transactional id (DescribeProducers).
#[test]
fn an_exactly_once_sources_dead_letters_are_written_in_its_transaction() {
    let (d, broker) = eos_broker();
    let admin = broker.admin_url.clone();
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(crate::rdkafka_client::create_topic(
            &broker.bootstrap,
            "eos-small",
            1,
            &[("max.message.bytes", "2048")],
        ));
    let body = json!({"name": "eos-dlq-src", "config": {
        "connector.class": "file-source", "file": d.input.display().to_string(),
        "topic": "eos-small", "errors.tolerance": "all",
        "errors.deadletterqueue.topic.name": "eos-dlq", "poll.interval.ms": "20"}});
    let (code, created) = curl("POST", &format!("{admin}/connectors"), Some(&body));
    assert_eq!(code, 201, "{created}");
    wait_for_state(&admin, "eos-dlq-src", "RUNNING");
    let large = "L".repeat(5000);
    append(&d.input, &format!("small-a\n{large}\nsmall-b\n"));
    let dead = crate::connect::read_topic(&broker.bootstrap, "eos-dlq", 1);
    assert_eq!(dead.len(), 1, "{} dead letters", dead.len());
    assert_eq!(dead[0].1, large);
    let kept: Vec<String> = crate::connect::read_topic(&broker.bootstrap, "eos-small", 2)
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(kept, ["small-a", "small-b"]);
    let weir = |args: &[&str]| {
        let out = std::process::Command::new(crate::harness::weir_bin())
            .arg("transaction")
            .args(args)
            .args(["-b", &broker.bootstrap])
            .output()
            .expect("run weir");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let listed = weir(&["list"]);
    let producer_id = listed
        .lines()
        .find_map(|l| {
            let cols: Vec<&str> = l.split('\t').collect();
            (cols.first() == Some(&"connect-cluster-eos-dlq-src-0")).then(|| cols[2].to_string())
        })
        .unwrap_or_else(|| panic!("no transactional id of the task: {listed}"));
    for topic in ["eos-dlq", "eos-small"] {
        let producers = weir(&["describe-producers", "--topic", topic, "--partition", "0"]);
        eprintln!("{topic}: {producers}");
        assert!(
            producers
                .lines()
                .skip(1)
                .any(|l| l.split('\t').next() == Some(producer_id.as_str())),
            "{topic}: producer {producer_id} not among {producers}"
        );
    }
    broker.stop();
}
