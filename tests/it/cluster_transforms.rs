//! Issue 12, "plugins keep working on a cluster", for transforms: a deployment made
//! through any broker is kept in the cluster metadata, so every broker knows it. An
//! inline deployment applies on every partition leader; an async one runs on exactly one
//! broker, the connect leader, reading input partitions it holds no replica of from
//! their leaders, and moves when that broker is killed.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::admin::{NewTopic, TopicReplication};
use rdkafka::producer::FutureRecord;
use serde_json::{json, Value};

use crate::cluster_fixture::{
    keyed_key, keyed_value, read_keyed, read_keyed_as, ReadBack, ThreeNodes,
};
use crate::connect::read_partitions_for;
use crate::connect_rest::curl;
use crate::guests::guest;
use crate::harness::poll_for;
use crate::replication::create_topic;

/// Produces records `range` (`keyed_key(i)`, `value(i)`) to `topic`, record `i` to
/// partition `i % partitions`, acks=all; fails the test unless all are acknowledged.
async fn produce(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    range: std::ops::Range<usize>,
    value: impl Fn(usize) -> String,
) {
    let p = crate::rdkafka_client::producer(bootstrap, &[("acks", "all")]);
    let mut deliveries = Vec::new();
    for i in range {
        let (key, value) = (keyed_key(i), value(i));
        let record = FutureRecord::to(topic)
            .key(&key)
            .payload(&value)
            .partition(i as i32 % partitions);
        deliveries.push((
            i,
            p.send_result(record).map_err(|(e, _)| e).expect("queued"),
        ));
    }
    for (i, d) in deliveries {
        let delivered = d.await.expect("delivery future");
        assert!(delivered.is_ok(), "record {i}: {delivered:?}");
    }
}

/// `GET {admin}/transforms/{name}` until it answers 200 with state `state` (at most
/// 60 s; a forwarded request fails while the connect leader moves).
fn wait_for_transform(admin: &str, name: &str, state: &str) -> Value {
    poll_for(
        &format!("transform {name} {state} through {admin}"),
        60,
        || {
            let (code, status) = curl("GET", &format!("{admin}/transforms/{name}"), None);
            if code == 200 && status["state"] == state {
                Ok(status)
            } else {
                Err(format!("{code} {status}"))
            }
        },
    )
}

/// Kills broker 1 with -9 and waits until deployment `name` runs on broker 2; its status.
fn kill_the_runner_and_wait_for_broker_2(nodes: &mut ThreeNodes, name: &str) -> Value {
    nodes.kill9(1);
    let survivor = nodes.node(2).admin_url.clone();
    let status = poll_for("the transform runs on broker 2", 60, || {
        let status = wait_for_transform(&survivor, name, "RUNNING");
        if status["broker_id"] == 2 {
            Ok(status)
        } else {
            Err(status.to_string())
        }
    });
    eprintln!("after the kill: {status}");
    status
}

/// Records `0..want` not in `read`, and those read more than once (record → times).
fn lost_and_repeated(read: &ReadBack, want: usize) -> (Vec<usize>, BTreeMap<usize, usize>) {
    let lost = (0..want).filter(|i| !read.seen.contains_key(i)).collect();
    let twice = read
        .seen
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(i, n)| (*i, *n))
        .collect();
    (lost, twice)
}

/// An inline `redact` deployed through broker 2 on a topic whose six partitions are led
/// by all three brokers: once the deploy is answered, every record produced is stored
/// redacted whichever broker leads its partition — produced by a client, or through the
/// HTTP produce API of broker 1 (appended there or forwarded) — and any broker's admin
/// API lists the deployment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_transform_deployed_through_one_broker_applies_on_every_leader() {
    const RECORDS: usize = 600;
    const HTTP_RECORDS: usize = 120;
    let nodes = ThreeNodes::start(&[]);
    let all = nodes.bootstrap_all();
    create_topic(&all, NewTopic::new("pii", 6, TopicReplication::Fixed(3))).await;
    let leaders: std::collections::BTreeSet<i32> =
        crate::cluster_placement::partitions_listed(&nodes.bootstrap(1), "pii")
            .values()
            .map(|(_, leader, _, _)| *leader)
            .collect();
    assert!(leaders.len() > 1, "one broker leads every partition");

    let spec = json!({
        "name": "redact-pii", "wasm": guest("redact"), "input": "pii", "outputs": ["pii"],
        "config": {"fields": "email"}, "mode": "inline",
    });
    let (code, answer) = curl(
        "POST",
        &format!("{}/transforms", nodes.node(2).admin_url),
        Some(&spec),
    );
    assert_eq!(code, 201, "{answer}");
    // Produced right after the answer: redacted on every leader.
    produce(&all, "pii", 6, 0..RECORDS, |i| {
        format!(r#"{{"id":{i},"email":"user{i}@example.com"}}"#)
    })
    .await;
    // HTTP produce through broker 1: the batches for partitions it leads are appended
    // there (through the inline transform too), the others forwarded to their leaders.
    let body: Vec<Value> = (RECORDS..RECORDS + HTTP_RECORDS)
        .map(|i| {
            json!({"value": {"type": "JSON", "data": {"id": i, "email": format!("user{i}@example.com")}}})
        })
        .collect();
    let answer = crate::rest_produce::post(
        &nodes.node(1).admin_url,
        "/topics/pii/records",
        &Value::Array(body).to_string(),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let total = RECORDS + HTTP_RECORDS;
    let read = read_partitions_for(&all, "pii", 6, total, Duration::from_secs(60));
    assert_eq!(read.len(), total);
    let mut ids = std::collections::BTreeSet::new();
    for (_, value) in &read {
        let v: Value = serde_json::from_str(value).unwrap_or_else(|e| panic!("{value}: {e}"));
        assert_eq!(v["email"], "***", "not redacted: {value}");
        ids.insert(v["id"].as_u64().expect("id"));
    }
    assert_eq!(ids.len(), total, "every record once");
    for id in 1..=3 {
        let (code, list) = curl(
            "GET",
            &format!("{}/transforms", nodes.node(id).admin_url),
            None,
        );
        assert_eq!(code, 200, "{list}");
        assert_eq!(list[0]["name"], "redact-pii", "broker {id}: {list}");
    }
    nodes.assert_no_panic();
}

/// An async `identity` deployed through broker 3 runs on the connect leader (broker 1:
/// no connector made `__connect_configs`, so the lowest live id), which holds no replica
/// of the input (replication factor 1 on brokers 2 and 3) and reads it from the leaders:
/// 1,000 records copied exactly once. kill -9 of broker 1: the deployment, kept in the
/// metadata, runs on broker 2 from the committed progress, and 1,000 more are copied —
/// nothing lost, and only records from before the kill may be copied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_transform_runs_on_the_connect_leader_and_moves_when_it_is_killed() {
    const RECORDS: usize = 1_000;
    let mut nodes = ThreeNodes::start(&[
        "broker.session.timeout.ms=1500",
        "broker.heartbeat.interval.ms=300",
    ]);
    let all = nodes.bootstrap_all();
    create_topic(
        &all,
        NewTopic::new(
            "copy-in",
            4,
            TopicReplication::Variable(&[&[2], &[3], &[2], &[3]]),
        ),
    )
    .await;
    create_topic(
        &all,
        NewTopic::new("copy-out", 4, TopicReplication::Fixed(3)),
    )
    .await;
    let spec = json!({
        "name": "copier", "wasm": guest("identity"), "input": "copy-in",
        "outputs": ["copy-out"],
    });
    let (code, answer) = curl(
        "POST",
        &format!("{}/transforms", nodes.node(3).admin_url),
        Some(&spec),
    );
    assert_eq!(code, 201, "{answer}");
    let status = wait_for_transform(&nodes.node(2).admin_url, "copier", "RUNNING");
    assert_eq!(
        status["broker_id"], 1,
        "runs on the connect leader: {status}"
    );

    produce(&all, "copy-in", 4, 0..RECORDS, keyed_value).await;
    let read = read_keyed(&all, "copy-out", 4, RECORDS);
    for id in 1..=3 {
        for line in nodes.node(id).stderr_text().lines() {
            let wanted = [
                "transform",
                "fenc",
                "copier",
                "leader",
                "regist",
                "heartbeat",
            ];
            if wanted.iter().any(|w| line.contains(w)) {
                eprintln!("node {id}: {line}");
            }
        }
    }
    read.assert_exactly(&(0..RECORDS).collect());

    kill_the_runner_and_wait_for_broker_2(&mut nodes, "copier");
    let survivors = format!("{},{}", nodes.bootstrap(2), nodes.bootstrap(3));
    produce(&survivors, "copy-in", 4, RECORDS..2 * RECORDS, keyed_value).await;
    let read = read_keyed(&survivors, "copy-out", 4, 2 * RECORDS);
    let (lost, twice) = lost_and_repeated(&read, 2 * RECORDS);
    eprintln!("lost {}, copied more than once {}", lost.len(), twice.len());
    assert!(
        lost.is_empty(),
        "lost {} records, first {:?}",
        lost.len(),
        lost.first()
    );
    assert!(
        twice.keys().all(|i| *i < RECORDS),
        "records produced after the kill copied twice: {twice:?}"
    );
    assert!(read.bad.is_empty(), "{:?}", read.bad);
    nodes.assert_no_panic();
}

/// An async deployment rides out a kill -9 of the broker that leads its output
/// partitions (not its runner), paused and then killed while it copies: the writes cut
/// off or refused meanwhile (NETWORK_EXCEPTION, NOT_LEADER_OR_FOLLOWER) are tried again
/// until a survivor leads, as a producer retries within `delivery.timeout.ms`. The
/// deployment stays RUNNING on broker 1 and no record is lost (a retried write may
/// repeat one: at least once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_transform_keeps_running_through_the_kill_of_its_output_leader() {
    const RECORDS: usize = 10_000;
    // A session long enough that the pause below does not fence broker 3: its kill
    // fences it at once (its CONTROLLER listener refuses connections).
    let mut nodes = ThreeNodes::start(&[
        "broker.session.timeout.ms=10000",
        "broker.heartbeat.interval.ms=300",
    ]);
    let all = nodes.bootstrap_all();
    create_topic(
        &all,
        NewTopic::new(
            "ride-in",
            2,
            TopicReplication::Variable(&[&[2, 1], &[2, 1]]),
        ),
    )
    .await;
    create_topic(
        &all,
        NewTopic::new(
            "ride-out",
            2,
            TopicReplication::Variable(&[&[3, 1, 2], &[3, 2, 1]]),
        ),
    )
    .await;
    produce(&all, "ride-in", 2, 0..RECORDS / 2, keyed_value).await;
    let spec = json!({
        "name": "rider", "wasm": guest("identity"), "input": "ride-in",
        "outputs": ["ride-out"],
    });
    let (code, answer) = curl(
        "POST",
        &format!("{}/transforms", nodes.node(2).admin_url),
        Some(&spec),
    );
    assert_eq!(code, 201, "{answer}");
    let runner = nodes.node(1).admin_url.clone();
    poll_for("broker 1 to copy records", 30, || {
        let s = wait_for_transform(&runner, "rider", "RUNNING");
        if s["records_out"].as_u64().unwrap_or(0) > 0 {
            eprintln!("killing broker 3 at {} records out", s["records_out"]);
            Ok(())
        } else {
            Err(s.to_string())
        }
    });
    // Paused first, and the rest of the input written meanwhile (to brokers 2 and 1),
    // so a write of the runner is likely to hang on it when it dies (killed at once, the
    // runner's next write often went to the next leader already).
    let paused = std::process::Command::new("kill")
        .args(["-STOP", &nodes.node(3).pid().to_string()])
        .status()
        .expect("kill -STOP");
    assert!(paused.success());
    let survivors = format!("{},{}", nodes.bootstrap(1), nodes.bootstrap(2));
    produce(&survivors, "ride-in", 2, RECORDS / 2..RECORDS, keyed_value).await;
    // Up to 3 s for the runner to hang on a write (read more than written); it may hang
    // on a commit to a coordinator on broker 3 instead.
    for _ in 0..30 {
        let (_, s) = curl("GET", &format!("{runner}/transforms/rider"), None);
        if s["records_in"].as_u64() > s["records_out"].as_u64() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    nodes.kill9(3);
    let read = read_keyed(&survivors, "ride-out", 2, RECORDS);
    let (lost, twice) = lost_and_repeated(&read, RECORDS);
    let (code, status) = curl("GET", &format!("{runner}/transforms/rider"), None);
    eprintln!(
        "lost {}, copied more than once {}; {status}",
        lost.len(),
        twice.len()
    );
    let log = nodes.node(1).stderr_text();
    for line in log.lines() {
        if line.contains("rider") {
            eprintln!("node 1: {line}");
        }
    }
    // Whether a write was cut off depends on where the runner was (reading, writing, or
    // committing to a coordinator on broker 3): said, not asserted.
    eprintln!(
        "a write was retried: {}",
        log.contains("output records refused; trying again")
    );
    assert!(
        lost.is_empty(),
        "lost {} records, first {:?}",
        lost.len(),
        lost.first()
    );
    assert_eq!(code, 200, "{status}");
    assert_eq!(status["state"], "RUNNING", "{status}");
    assert_eq!(status["broker_id"], 1, "{status}");
    assert!(read.bad.is_empty(), "{:?}", read.bad);
    nodes.assert_no_panic();
}

/// Issue 14 on a cluster: an `exactly_once` deployment whose runner (the connect leader)
/// is killed with -9 mid-stream moves to a survivor, whose InitProducerId aborts what
/// the dead runner left open; a read_committed consumer of the output reads every input
/// record exactly once, those copied before the kill included (at-least-once allows
/// repeats there). The coordinators of its transactional id and group are wherever
/// their partitions' leaders are: calls go over the peer connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exactly_once_transform_moved_by_a_kill_copies_each_record_once() {
    const RECORDS: usize = 3_000;
    let mut nodes = ThreeNodes::start(&[
        "broker.session.timeout.ms=1500",
        "broker.heartbeat.interval.ms=300",
        "transaction.state.log.num.partitions=4",
        "offsets.topic.num.partitions=4",
    ]);
    let all = nodes.bootstrap_all();
    for topic in ["eos-in", "eos-out"] {
        create_topic(&all, NewTopic::new(topic, 4, TopicReplication::Fixed(3))).await;
    }
    let spec = json!({
        "name": "eos-copier", "wasm": guest("identity"), "input": "eos-in",
        "outputs": ["eos-out"], "processing.guarantee": "exactly_once",
    });
    let (code, answer) = curl(
        "POST",
        &format!("{}/transforms", nodes.node(3).admin_url),
        Some(&spec),
    );
    assert_eq!(code, 201, "{answer}");
    let status = wait_for_transform(&nodes.node(2).admin_url, "eos-copier", "RUNNING");
    assert_eq!(
        status["broker_id"], 1,
        "runs on the connect leader: {status}"
    );
    assert_eq!(status["processing.guarantee"], "exactly_once", "{status}");

    // A producer writes without pause (idempotent: the input holds each record once)
    // while the runner's broker is killed mid-stream.
    let writer = crate::rdkafka_client::Writer::spawn(&all, "eos-in", 2 * RECORDS, |i| {
        (keyed_key(i), keyed_value(i), Some(i as i32 % 4))
    });
    poll_for("the runner on broker 1 to copy records", 30, || {
        let s = wait_for_transform(&nodes.node(1).admin_url, "eos-copier", "RUNNING");
        if s["records_out"].as_u64().unwrap_or(0) > 0 {
            Ok(())
        } else {
            Err(s.to_string())
        }
    });
    kill_the_runner_and_wait_for_broker_2(&mut nodes, "eos-copier");
    let (sent, delivered) = writer.finish();
    assert!(
        sent == 2 * RECORDS && delivered,
        "sent {sent}, all delivered: {delivered}"
    );
    let survivors = format!("{},{}", nodes.bootstrap(2), nodes.bootstrap(3));
    let read = read_keyed_as(&survivors, "eos-out", 4, 2 * RECORDS, "read_committed");
    let (lost, twice) = lost_and_repeated(&read, 2 * RECORDS);
    let uncommitted = read_keyed(&survivors, "eos-out", 4, 2 * RECORDS);
    let copies: usize = uncommitted.seen.values().sum();
    eprintln!(
        "exactly-once on a cluster: lost {}, copied more than once {}, read_uncommitted copies {copies}",
        lost.len(),
        twice.len()
    );
    for id in 2..=3 {
        for line in nodes.node(id).stderr_text().lines() {
            if line.contains("eos-copier") || line.contains("exactly-once") {
                eprintln!("node {id}: {line}");
            }
        }
    }
    assert!(
        lost.is_empty(),
        "lost {} records, first {:?}",
        lost.len(),
        lost.first()
    );
    assert!(twice.is_empty(), "copied more than once: {twice:?}");
    assert!(read.bad.is_empty(), "{:?}", read.bad);
    nodes.assert_no_panic();
}
