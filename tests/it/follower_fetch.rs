//! Issue 13, test 7: reads from followers (KIP-392). Three `weir` processes in racks r1,
//! r2, r3 with `replica.selector.class` set to Kafka's rack-aware selector; a librdkafka
//! consumer whose `client.rack` is a follower's rack is sent there by the leader
//! (`preferred_read_replica`) and reads every record from it, once and in order; one
//! without `client.rack` reads from the leader.
//!
//! Where the records came from is shown three ways: the follower's
//! `weir_follower_fetch_records_total` grows by exactly the records read (and nobody
//! else's does), the leader's `weir_bytes_out_total` does not move while the racked
//! consumer reads (and does for the other one), and librdkafka's own fetch debug log
//! says it migrated the partition to the follower because of the preferred replica.
//!
//! Every node is a `BinaryBroker` (killed on drop); every wait is bounded.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};

use crate::cluster_fixture::{kcat_produce, keyed_key, ThreeNodes};
use crate::harness::poll_for;
use crate::metrics::{scrape, Exposition};
use crate::replication::{create_rf3, describe};

const TOPIC: &str = "follower-read";
const RECORDS: usize = 3_000;
const RACK_AWARE: &str =
    "replica.selector.class=org.apache.kafka.common.replica.RackAwareReplicaSelector";

/// A librdkafka context keeping the client's log lines (with `debug=fetch`, its fetch
/// decisions).
#[derive(Clone, Default)]
struct LogLines(Arc<Mutex<Vec<String>>>);

impl ClientContext for LogLines {
    fn log(&self, _level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.0.lock().unwrap().push(format!("{fac}: {log_message}"));
    }
}

impl ConsumerContext for LogLines {}

/// What one consumer read: the values' indexes in the order read, and its log lines.
struct Read {
    order: Vec<usize>,
    log: Vec<String>,
}

/// Reads partition 0 of [`TOPIC`] from the beginning with a librdkafka consumer
/// bootstrapped to every node, `client.rack` set when `rack` is given, until `want`
/// records are read (at most 60 s), then 1 s more to catch anything extra.
fn read_all(bootstrap: &str, rack: Option<&str>, want: usize) -> Read {
    let ctx = LogLines::default();
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "follower-fetch-no-commits")
        .set("enable.auto.commit", "false")
        .set("debug", "fetch")
        .set_log_level(RDKafkaLogLevel::Debug);
    if let Some(rack) = rack {
        config.set("client.rack", rack);
    }
    let consumer: BaseConsumer<LogLines> =
        config.create_with_context(ctx.clone()).expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).expect("assign");
    let mut order = Vec::with_capacity(want);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut extra: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if order.len() >= want && extra.is_none() {
            extra = Some(now + Duration::from_secs(1));
        }
        if now > deadline || extra.is_some_and(|e| now > e) {
            break;
        }
        let Some(msg) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let msg = msg.expect("consume");
        let key = String::from_utf8_lossy(msg.key().unwrap_or_default()).to_string();
        let value = String::from_utf8_lossy(msg.payload().unwrap_or_default()).to_string();
        let i = value
            .strip_prefix('r')
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or_else(|| panic!("unexpected record {key:?} = {value:?}"));
        assert_eq!(key, keyed_key(i), "record {i}");
        assert_eq!(msg.offset(), i as i64, "record {i} at its offset");
        order.push(i);
    }
    drop(consumer);
    let log = ctx.0.lock().unwrap().clone();
    Read { order, log }
}

/// Every node's metrics, by id.
fn scrape_all(nodes: &ThreeNodes) -> Vec<(i32, Exposition)> {
    nodes
        .running()
        .map(|(id, n)| (id, scrape(&n.admin_url)))
        .collect()
}

/// How much `name{topic=TOPIC}` grew on each node between two scrapes, by id.
fn grown(before: &[(i32, Exposition)], after: &[(i32, Exposition)], name: &str) -> Vec<(i32, f64)> {
    let labels = [("topic", TOPIC)];
    before
        .iter()
        .zip(after)
        .map(|((id, b), (_, a))| (*id, a.or_zero(name, &labels) - b.or_zero(name, &labels)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_with_client_rack_reads_from_the_follower_in_its_rack() {
    let nodes = ThreeNodes::start_each(
        3,
        &[
            "broker.session.timeout.ms=1500",
            "broker.heartbeat.interval.ms=300",
            RACK_AWARE,
        ],
        |id| vec![format!("broker.rack=r{id}")],
    );
    create_rf3(&nodes.bootstrap(1), TOPIC, 1, &[]).await;
    let placed = poll_for("the topic has 3 in-sync replicas", 20, || {
        match describe(&nodes.bootstrap(1), TOPIC)?.as_slice() {
            [p] if p.isr.len() == 3 && p.leader > 0 => Ok(p.clone()),
            other => Err(format!("{other:?}")),
        }
    });
    let leader = placed.leader;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    kcat_produce(&nodes.bootstrap_all(), TOPIC, RECORDS);
    let all: Vec<usize> = (0..RECORDS).collect();

    // In the follower's rack: the leader sends the consumer there; it reads everything
    // from it, once, in order.
    let before = scrape_all(&nodes);
    let racked = read_all(
        &nodes.bootstrap_all(),
        Some(&format!("r{follower}")),
        RECORDS,
    );
    let after = scrape_all(&nodes);
    assert_eq!(
        racked.order, all,
        "records read by the consumer in r{follower}"
    );
    let from_followers = grown(&before, &after, "weir_follower_fetch_records_total");
    eprintln!(
        "leader {leader}; follower records served with client.rack=r{follower}: {from_followers:?}"
    );
    for (id, n) in &from_followers {
        let want = if *id == follower { RECORDS as f64 } else { 0.0 };
        assert_eq!(*n, want, "node {id}: {from_followers:?}");
    }
    // Nothing is produced meanwhile, so the leader's Fetch responses (its followers'
    // included) carry no record bytes.
    let leader_bytes = grown(&before, &after, "weir_bytes_out_total");
    let leader_out = leader_bytes.iter().find(|(id, _)| *id == leader).unwrap().1;
    assert_eq!(
        leader_out, 0.0,
        "the leader sent record bytes: {leader_bytes:?}"
    );
    let migrated = format!("to {follower} (leader is {leader}): preferred replica updated");
    let line = racked.log.iter().find(|l| l.contains(&migrated));
    eprintln!("librdkafka: {line:?}");
    assert!(
        line.is_some(),
        "librdkafka never logged {migrated:?}: {:#?}",
        racked
            .log
            .iter()
            .filter(|l| l.contains("preferred") || l.contains("migrating"))
            .collect::<Vec<_>>()
    );

    // No client.rack: the leader serves it, no follower does.
    let before = scrape_all(&nodes);
    let plain = read_all(&nodes.bootstrap_all(), None, RECORDS);
    let after = scrape_all(&nodes);
    assert_eq!(
        plain.order, all,
        "records read by the consumer without a rack"
    );
    let from_followers = grown(&before, &after, "weir_follower_fetch_records_total");
    assert!(
        from_followers.iter().all(|(_, n)| *n == 0.0),
        "{from_followers:?}"
    );
    let leader_bytes = grown(&before, &after, "weir_bytes_out_total");
    let leader_out = leader_bytes.iter().find(|(id, _)| *id == leader).unwrap().1;
    assert!(leader_out > 0.0, "{leader_bytes:?}");
    assert!(
        !plain
            .log
            .iter()
            .any(|l| l.contains("preferred replica updated")),
        "a consumer without client.rack was sent to a follower"
    );
    nodes.assert_no_panic();
}
