//! Kafka transactions (KIP-98) with real clients against one broker: confluent-kafka,
//! kafka-python and kafkajs transactional producers (commit visible to read_committed,
//! abort not, read_uncommitted sees both), zombie fencing, the coordinator's timeout
//! abort, a consume-transform-produce loop whose client is killed with SIGKILL at random
//! points, and transactions across a broker restart. The scripts are
//! `tests/compat/transactions.py` and `tests/compat/transactions.js`.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use rdkafka::producer::FutureRecord;

use crate::clients::script;
use crate::harness::{repo_root, weir_bin, TestBroker};
use crate::rdkafka_client::{create_topic, producer};

/// Broker settings that keep the waits of these tests short.
const FAST: &[&str] = &[
    "transaction.state.log.num.partitions=5",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms=500",
    "group.initial.rebalance.delay.ms=0",
    "offsets.topic.num.partitions=5",
];

fn python(args: &[&str]) -> (bool, String) {
    let mut all = vec!["tests/compat/transactions.py"];
    all.extend_from_slice(args);
    script("python3", &all)
}

/// The values of `topic` as a read_committed consumer (confluent-kafka) reads them.
fn read_committed(bootstrap: &str, topic: &str) -> Vec<String> {
    let (ok, text) = python(&["read", bootstrap, topic, "read_committed"]);
    assert!(ok, "read failed: {text}");
    let values = text.split("values:\n").nth(1).unwrap_or_default();
    values.lines().map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_transactional_producers_commit_and_abort() {
    let b = TestBroker::start_with(FAST);
    for client in ["confluent-kafka", "kafka-python"] {
        let topic = format!("txn-{client}");
        create_topic(&b.bootstrap, &topic, 3, &[]).await;
        let (ok, text) = python(&["commit-abort", &b.bootstrap, &topic, client]);
        assert!(
            ok && text.contains(&format!("commit-abort ok {client} committed=20 all=30")),
            "{client}: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafkajs_transactional_producer_commits_and_aborts() {
    let b = TestBroker::start_with(FAST);
    create_topic(&b.bootstrap, "txn-js", 2, &[]).await;
    let (ok, text) = script(
        "node",
        &["tests/compat/transactions.js", &b.bootstrap, "txn-js"],
    );
    assert!(
        ok && text.contains("kafkajs transactions ok committed=20 all=30"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_producer_with_the_same_transactional_id_is_fenced() {
    let b = TestBroker::start_with(FAST);
    create_topic(&b.bootstrap, "txn-fence", 2, &[]).await;
    let (ok, text) = python(&["fence", &b.bootstrap, "txn-fence"]);
    assert!(ok && text.contains("fence ok committed=5"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_transaction_is_aborted_at_its_timeout() {
    let b = TestBroker::start_with(FAST);
    create_topic(&b.bootstrap, "txn-timeout", 1, &[]).await;
    let (ok, text) = python(&["timeout", &b.bootstrap, "txn-timeout"]);
    assert!(ok && text.contains("timeout ok"), "{text}");
}

/// Consume-transform-produce with `send_offsets_to_transaction`: the client kills itself
/// with SIGKILL at a random point in four runs, then a fifth run finishes. Every input
/// record is in the output exactly once for read_committed, and the group's committed
/// offsets are at the end of the input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_transform_produce_is_exactly_once_across_client_kills() {
    let b = TestBroker::start_with(FAST);
    create_topic(&b.bootstrap, "ctp-in", 3, &[]).await;
    create_topic(&b.bootstrap, "ctp-out", 3, &[]).await;
    let p = producer(&b.bootstrap, &[("acks", "all")]);
    const N: usize = 2000;
    for i in 0..N {
        let v = format!("v{i}");
        p.send(
            FutureRecord::to("ctp-in").key(&v).payload(&v),
            Duration::from_secs(10),
        )
        .await
        .expect("input record");
    }
    let mut kills = Vec::new();
    for _ in 0..4 {
        let (ok, text) = python(&["ctp", &b.bootstrap, "ctp-in", "ctp-out", "ctp-group", "1"]);
        if text.contains("ctp done") {
            assert!(ok, "{text}");
            break;
        }
        assert!(
            !ok && text.contains("dying"),
            "a dying run ended without dying or finishing: {text}"
        );
        kills.push(text.trim().to_string());
    }
    assert!(!kills.is_empty(), "no run was killed");
    eprintln!("client runs killed: {kills:?}");
    let (ok, text) = python(&["ctp", &b.bootstrap, "ctp-in", "ctp-out", "ctp-group", "0"]);
    assert!(ok && text.contains("ctp done"), "{text}");
    let out = read_committed(&b.bootstrap, "ctp-out");
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for v in &out {
        *counts.entry(v.clone()).or_default() += 1;
    }
    let duplicated: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    let missing: Vec<String> = (0..N)
        .map(|i| format!("out-v{i}"))
        .filter(|v| !counts.contains_key(v))
        .collect();
    assert!(
        duplicated.is_empty() && missing.is_empty() && out.len() == N,
        "after client kills {kills:?}: {} records read, duplicated {:?}, missing {:?}",
        out.len(),
        &duplicated[..duplicated.len().min(10)],
        &missing[..missing.len().min(10)]
    );
}

/// A committed transaction survives a restart of the broker, and the coordinator's
/// state does too: the same transactional id initialises again (a new epoch) and its
/// next transaction commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_and_their_coordinator_survive_a_broker_restart() {
    let dir = tempfile::tempdir().unwrap();
    let b = TestBroker::start_in(dir.path(), FAST);
    create_topic(&b.bootstrap, "txn-restart", 2, &[]).await;
    let (ok, text) = python(&[
        "commit-abort",
        &b.bootstrap,
        "txn-restart",
        "confluent-kafka",
    ]);
    assert!(ok && text.contains("committed=20"), "{text}");
    b.stop();
    let b = TestBroker::start_in(dir.path(), FAST);
    let committed = read_committed(&b.bootstrap, "txn-restart");
    assert_eq!(committed.len(), 20, "{committed:?}");
    assert!(
        committed.iter().all(|v| !v.contains("-a-")),
        "{committed:?}"
    );
    // The same id again: the coordinator loads its state and bumps the epoch.
    let (ok, text) = python(&[
        "commit-abort",
        &b.bootstrap,
        "txn-restart",
        "confluent-kafka",
        "r2",
    ]);
    assert!(ok && text.contains("committed=20"), "{text}");
    let committed = read_committed(&b.bootstrap, "txn-restart");
    assert_eq!(committed.len(), 40, "{committed:?}");
}

/// `weir transaction` with kafka-transactions.sh's verbs on a transaction its producer
/// left open: list and describe show it Ongoing with its partition, describe-producers
/// its start offset, find-hanging nothing (its coordinator knows it), and abort ends it
/// at the partition so read_committed consumers move past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transaction_cli_lists_describes_and_aborts_an_open_transaction() {
    let b = TestBroker::start_with(FAST);
    create_topic(&b.bootstrap, "txn-cli", 1, &[]).await;
    let (ok, text) = python(&["open", &b.bootstrap, "txn-cli", "tx-cli"]);
    assert!(ok && text.contains("open ok"), "{text}");
    let weir = |args: &[&str]| {
        let out = Command::new(weir_bin())
            .arg("transaction")
            .args(args)
            .args(["-b", &b.bootstrap])
            .output()
            .expect("run weir");
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "weir transaction {args:?}: {text}");
        text
    };
    let listed = weir(&["list"]);
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("tx-cli\t") && l.ends_with("\tOngoing")),
        "{listed}"
    );
    let described = weir(&["describe", "--transactional-id", "tx-cli"]);
    assert!(
        described.contains("\tOngoing\t120000\t") && described.trim_end().ends_with("txn-cli-0"),
        "{described}"
    );
    let producers = weir(&[
        "describe-producers",
        "--topic",
        "txn-cli",
        "--partition",
        "0",
    ]);
    let row: Vec<&str> = producers
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split('\t')
        .collect();
    assert_eq!(row.get(5), Some(&"0"), "open since offset 0: {producers}");
    let hanging = weir(&[
        "find-hanging",
        "--broker-id",
        "1",
        "--max-transaction-timeout",
        "0",
    ]);
    assert_eq!(hanging.lines().count(), 1, "only the header: {hanging}");
    let aborted = weir(&[
        "abort",
        "--topic",
        "txn-cli",
        "--partition",
        "0",
        "--start-offset",
        "0",
    ]);
    assert!(aborted.contains("Aborted the transaction"), "{aborted}");
    let producers = weir(&[
        "describe-producers",
        "--topic",
        "txn-cli",
        "--partition",
        "0",
    ]);
    assert!(
        producers
            .lines()
            .nth(1)
            .unwrap_or_default()
            .ends_with("\tNone"),
        "{producers}"
    );
    // The partition is stable again: a committed transaction after it is readable.
    let (ok, text) = python(&["commit-abort", &b.bootstrap, "txn-cli", "confluent-kafka"]);
    assert!(ok && text.contains("committed=20"), "{text}");
}

/// Starts `transactions.py txn-loop` (confluent-kafka, transactions of 10 records over 3
/// partitions of `topic`, 4 in 5 committed) against `bootstrap` for `seconds`, writing
/// each transaction's outcome to `outcomes`; bounded by `timeout` at `seconds + 90`.
fn spawn_txn_loop(
    bootstrap: &str,
    topic: &str,
    seconds: u64,
    outcomes: &std::path::Path,
) -> std::process::Child {
    Command::new("timeout")
        .arg((seconds + 90).to_string())
        .args(["python3", "tests/compat/transactions.py", "txn-loop"])
        .args([bootstrap, topic, &seconds.to_string()])
        .arg(outcomes)
        .current_dir(repo_root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn the transaction loop")
}

/// Waits for the loop of [`spawn_txn_loop`], then reads `topic` read_committed through
/// `bootstrap` and judges every outcome: a committed transaction read whole and once, an
/// aborted one never, an unknown one whole or not at all. Fails the test on any anomaly
/// or when nothing committed; returns the checker's line (its counts).
fn check_txn_loop(
    mut looping: std::process::Child,
    bootstrap: &str,
    topic: &str,
    outcomes: &std::path::Path,
) -> String {
    let status = looping.wait().expect("the loop ends");
    let mut text = String::new();
    std::io::Read::read_to_string(looping.stdout.as_mut().unwrap(), &mut text).unwrap();
    assert!(status.success() && text.contains("txn-loop done"), "{text}");
    let (ok, checked) = python(&["check", bootstrap, topic, outcomes.to_str().unwrap()]);
    eprintln!("{text}{checked}");
    assert!(ok && checked.contains("check ok"), "{checked}");
    let committed: usize = checked
        .split("'committed': ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(committed > 0, "no transaction committed: {checked}");
    checked
}

/// Issue 14's test 4 on one node: a transactional producer (confluent-kafka) commits 4 in
/// 5 of its transactions and aborts the rest while the broker is killed with SIGKILL
/// three times and restarted on the same port. Then, under read_committed, every
/// transaction whose commit was acknowledged is read whole and once, no aborted record is
/// read, and no transaction is torn (an unacknowledged one is whole or absent).
#[test]
fn transactions_survive_kill_9_of_the_broker() {
    let dir = tempfile::tempdir().unwrap();
    let overrides = [
        "transaction.state.log.num.partitions=5",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms=500",
        "offsets.topic.num.partitions=5",
        "num.partitions=3",
    ];
    let broker = crate::harness::BinaryBroker::spawn(dir.path(), 0, &overrides);
    let bootstrap = broker.bootstrap.clone();
    let port: u16 = bootstrap.rsplit(':').next().unwrap().parse().unwrap();
    let outcomes = dir.path().join("outcomes.txt");
    let looping = spawn_txn_loop(&bootstrap, "txn-kill", 24, &outcomes);
    let mut broker = Some(broker);
    for _ in 0..3 {
        std::thread::sleep(Duration::from_secs(5));
        let stderr = broker.take().unwrap().kill9();
        assert!(!stderr.contains("panicked"), "{stderr}");
        std::thread::sleep(Duration::from_millis(500));
        broker = Some(crate::harness::BinaryBroker::spawn(
            dir.path(),
            port,
            &overrides,
        ));
    }
    check_txn_loop(looping, &bootstrap, "txn-kill", &outcomes);
    drop(broker);
}

/// Issue 14's test 4 on a cluster of three nodes: the same transaction loop on a topic of
/// 3 partitions, replication factor 3, `min.insync.replicas=2`, with `__transaction_state`
/// replicated likewise, while each node in turn is killed with SIGKILL (a partition
/// leader, a transaction coordinator, the quorum leader: the kills rotate over all three)
/// and restarted. Markers and the aborted-transaction index must survive on the replicas
/// that take over: under read_committed every acknowledged commit is read whole and once,
/// no aborted record is read, no transaction is torn.
#[test]
fn transactions_survive_kill_9_of_each_broker_of_a_cluster() {
    let mut nodes = crate::cluster_fixture::ThreeNodes::start(&[
        "transaction.state.log.num.partitions=5",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms=500",
        "offsets.topic.num.partitions=5",
        "num.partitions=3",
        "default.replication.factor=3",
        "min.insync.replicas=2",
    ]);
    let bootstrap = nodes.bootstrap_all();
    let dir = tempfile::tempdir().unwrap();
    let outcomes = dir.path().join("outcomes.txt");
    let looping = spawn_txn_loop(&bootstrap, "txn-cluster-kill", 30, &outcomes);
    for victim in [1, 2, 3] {
        std::thread::sleep(Duration::from_secs(6));
        let stderr = nodes.kill9(victim);
        assert!(!stderr.contains("panicked"), "node {victim}: {stderr}");
        std::thread::sleep(Duration::from_secs(1));
        nodes.restart(victim);
    }
    // The restarted nodes listen on new ports: read through all of them.
    let bootstrap_now = nodes.bootstrap_all();
    check_txn_loop(looping, &bootstrap_now, "txn-cluster-kill", &outcomes);
    nodes.assert_no_panic();
}
