//! Issue 12, "plugins and connectors keep working on a cluster", the data path: records
//! the broker writes itself (HTTP produce, connector source records, the connect
//! runtime's own topics) reach partitions another broker leads, forwarded to that leader
//! as Produce requests, and a real client reads each of them exactly once.

use std::collections::BTreeSet;

use rdkafka::admin::{NewTopic, TopicReplication};
use serde_json::{json, Value};

use crate::cluster_fixture::{keyed_key, keyed_value, read_keyed, ThreeNodes};
use crate::cluster_placement::partitions_listed;
use crate::connect::{append, lines, plugin_path, read_partitions_for};
use crate::connect_rest::{curl, wait_for_state};
use crate::harness::{poll_for, temp_ceiling};
use crate::replication::create_topic;
use crate::rest_produce::post;

/// The leader of each partition of `topic`, by index, as broker `bootstrap` (one
/// `host:port`) lists them (waits
/// at most 20 s for every partition to have one).
fn leaders(bootstrap: &str, topic: &str) -> Vec<i32> {
    poll_for(
        &format!("every partition of {topic} has a leader"),
        20,
        || {
            let listed = partitions_listed(bootstrap, topic);
            let leaders: Vec<i32> = listed.values().map(|(_, leader, _, _)| *leader).collect();
            if !leaders.is_empty() && leaders.iter().all(|l| *l >= 0) {
                Ok(leaders)
            } else {
                Err(format!("{listed:?}"))
            }
        },
    )
}

/// HTTP produce of `n` keyed records (`keyed_key(i)`, `keyed_value(i)`) to `topic`
/// through `admin_url`; fails the test unless every record was written.
fn http_produce_keyed(admin_url: &str, topic: &str, n: usize) {
    let body: Vec<Value> = (0..n)
        .map(|i| {
            json!({
                "key": {"type": "STRING", "data": keyed_key(i)},
                "value": {"type": "STRING", "data": keyed_value(i)},
            })
        })
        .collect();
    let answer = post(
        admin_url,
        &format!("/topics/{topic}/records"),
        &Value::Array(body).to_string(),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let results = answer.json();
    let results = results.as_array().expect("an array answer");
    assert_eq!(results.len(), n);
    for r in results {
        assert_eq!(r["error_code"], 200, "{r}");
    }
}

/// HTTP produce through broker 1 writes every partition of a topic whose leaders are
/// spread over the three brokers (replication factor 3), and of a topic broker 1 holds
/// no replica of (replication factor 1 on brokers 2 and 3): each record is read back
/// exactly once by librdkafka.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_produce_through_one_broker_reaches_partitions_the_others_lead() {
    const RECORDS: usize = 3_000;
    let nodes = ThreeNodes::start(&[]);
    let all = nodes.bootstrap_all();
    create_topic(&all, NewTopic::new("spread", 6, TopicReplication::Fixed(3))).await;
    create_topic(
        &all,
        NewTopic::new("elsewhere", 2, TopicReplication::Variable(&[&[2], &[3]])),
    )
    .await;
    let spread = leaders(&nodes.bootstrap(1), "spread");
    assert!(
        spread.iter().any(|l| *l != 1),
        "broker 1 leads every partition: {spread:?}"
    );
    assert_eq!(leaders(&nodes.bootstrap(1), "elsewhere"), vec![2, 3]);

    let admin = nodes.node(1).admin_url.clone();
    for (topic, partitions) in [("spread", 6), ("elsewhere", 2)] {
        http_produce_keyed(&admin, topic, RECORDS);
        read_keyed(&all, topic, partitions, RECORDS)
            .assert_exactly(&(0..RECORDS).collect::<BTreeSet<usize>>());
    }
    nodes.assert_no_panic();
}

/// The REST body of a `file-source` reading `file` into `topic`.
fn file_source(name: &str, file: &std::path::Path, topic: &str) -> Value {
    json!({"name": name, "config": {
        "connector.class": "file-source", "file": file.display().to_string(),
        "topic": topic, "poll.interval.ms": "20",
    }})
}

/// The broker leading `topic`-0 as broker `bootstrap` lists it (at most 30 s).
pub(crate) fn leader_of_first(bootstrap: &str, topic: &str) -> i32 {
    poll_for(&format!("{topic}-0 has a leader"), 30, || {
        let listed = partitions_listed(bootstrap, topic);
        match listed.get(&0) {
            Some((_, leader, _, _)) if *leader >= 0 => Ok(*leader),
            _ => Err(format!("{listed:?}")),
        }
    })
}

/// Waits until `name`'s stored source offset (through `admin`) is the length of `file`.
fn wait_for_offsets_at_end(admin: &str, name: &str, file: &std::path::Path) {
    poll_for(&format!("{name}'s offsets cover the file"), 30, || {
        let (code, offsets) = curl("GET", &format!("{admin}/connectors/{name}/offsets"), None);
        // Offsets come back as Kafka Connect stores them: the position as a string.
        let position = &offsets["offsets"][0]["offset"]["position"];
        let position = position
            .as_u64()
            .or_else(|| position.as_str().and_then(|p| p.parse().ok()));
        let len = std::fs::metadata(file).unwrap().len();
        if code == 200 && position == Some(len) {
            Ok(())
        } else {
            Err(format!("{code} {offsets} (file of {len} bytes)"))
        }
    })
}

/// Reads `topic`'s six partitions from the beginning and fails the test unless they
/// hold `lines(0, n)` exactly once each.
fn assert_lines_exactly_once(bootstrap: &str, topic: &str, n: usize) {
    let read = read_partitions_for(bootstrap, topic, 6, n, std::time::Duration::from_secs(60));
    let got: BTreeSet<String> = read.iter().map(|(_, v)| v.clone()).collect();
    let want: BTreeSet<String> = lines(0, n).lines().map(String::from).collect();
    assert_eq!(
        got.len(),
        want.len(),
        "lines lost: {} of {n} read",
        got.len()
    );
    assert_eq!(got, want);
    assert_eq!(read.len(), n, "{} duplicates", read.len() - n);
}

/// A file source created through a broker that is not the connect leader (and leads
/// neither `__connect_configs` nor `__connect_offsets`): the REST request is forwarded to
/// the connect leader, the connector runs there and only there (its status names that
/// broker), its records reach all six partitions of a replicated topic exactly once,
/// and its offsets, stored through whichever broker leads `__connect_offsets`, are
/// readable through the REST API of any broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connector_created_through_any_broker_runs_on_the_connect_leader() {
    const LINES: usize = 2_000;
    let plugins = format!("connect.plugin.path={}", plugin_path().display());
    let nodes = ThreeNodes::start(&[&plugins]);
    let all = nodes.bootstrap_all();
    let one = nodes.bootstrap(1);
    create_topic(&all, NewTopic::new("lines", 6, TopicReplication::Fixed(3))).await;
    let dir = tempfile::tempdir_in(temp_ceiling()).unwrap();

    // A first connector creates the connect topics; then find a broker leading neither.
    let first = dir.path().join("first.txt");
    append(&first, "one line\n");
    let admin1 = nodes.node(1).admin_url.clone();
    let (code, answer) = curl(
        "POST",
        &format!("{admin1}/connectors"),
        Some(&file_source("first", &first, "first")),
    );
    assert_eq!(code, 201, "{answer}");
    wait_for_offsets_at_end(&admin1, "first", &first);
    let configs = leader_of_first(&one, "__connect_configs");
    let offsets = leader_of_first(&one, "__connect_offsets");
    let other = (1..=3)
        .find(|id| *id != configs && *id != offsets)
        .expect("three brokers, two leaders");
    let admin = nodes.node(other).admin_url.clone();

    let input = dir.path().join("lines.txt");
    append(&input, &lines(0, LINES));
    let (code, answer) = curl(
        "POST",
        &format!("{admin}/connectors"),
        Some(&file_source("lines-in", &input, "lines")),
    );
    assert_eq!(code, 201, "{answer}");
    let status = wait_for_state(&admin, "lines-in", "RUNNING");
    assert_eq!(
        status["connector"]["worker_id"],
        json!(nodes.bootstrap(configs)),
        "runs on the connect leader, broker {configs}: {status}"
    );
    assert_lines_exactly_once(&all, "lines", LINES);
    let spread: BTreeSet<i32> = leaders(&one, "lines").into_iter().collect();
    assert!(spread.len() > 1, "one broker leads every partition");
    wait_for_offsets_at_end(&admin, "lines-in", &input);
    nodes.assert_no_panic();
}

/// kill -9 of the connect leader: once it is fenced, another broker leads
/// `__connect_configs` and runs the connector from its stored offsets — lines appended
/// after the kill arrive exactly once, after the ones before it; the REST API of a
/// survivor reports it RUNNING there. The killed broker restarts and the connector still
/// runs on exactly one broker: more lines arrive exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connectors_move_to_the_new_connect_leader_when_the_old_one_is_killed() {
    const LINES: usize = 1_000;
    let plugins = format!("connect.plugin.path={}", plugin_path().display());
    let mut nodes = ThreeNodes::start(&[
        &plugins,
        "broker.session.timeout.ms=1500",
        "broker.heartbeat.interval.ms=300",
    ]);
    let all = nodes.bootstrap_all();
    create_topic(&all, NewTopic::new("moved", 6, TopicReplication::Fixed(3))).await;
    let dir = tempfile::tempdir_in(temp_ceiling()).unwrap();
    let input = dir.path().join("moved.txt");
    append(&input, &lines(0, LINES));
    let admin1 = nodes.node(1).admin_url.clone();
    let (code, answer) = curl(
        "POST",
        &format!("{admin1}/connectors"),
        Some(&file_source("mover", &input, "moved")),
    );
    assert_eq!(code, 201, "{answer}");
    wait_for_offsets_at_end(&admin1, "mover", &input);
    let old = leader_of_first(&nodes.bootstrap(1), "__connect_configs");

    nodes.kill9(old);
    let survivor = (1..=3).find(|id| *id != old).unwrap();
    let survivor_boot = nodes.bootstrap(survivor);
    let new = poll_for(
        "another broker leads __connect_configs",
        30,
        || match leader_of_first(&survivor_boot, "__connect_configs") {
            l if l != old => Ok(l),
            l => Err(format!("still broker {l}")),
        },
    );
    append(&input, &lines(LINES, 2 * LINES));
    let admin = nodes.node(survivor).admin_url.clone();
    let status = wait_for_state(&admin, "mover", "RUNNING");
    assert_eq!(
        status["connector"]["worker_id"],
        json!(nodes.bootstrap(new)),
        "{status}"
    );
    assert_lines_exactly_once(&nodes.bootstrap(survivor), "moved", 2 * LINES);
    wait_for_offsets_at_end(&admin, "mover", &input);

    nodes.restart(old);
    nodes.wait_for_brokers(old, &[1, 2, 3], 30);
    append(&input, &lines(2 * LINES, 3 * LINES));
    assert_lines_exactly_once(&all, "moved", 3 * LINES);
    nodes.assert_no_panic();
}
