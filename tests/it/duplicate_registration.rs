//! Issue 12 leftover: DUPLICATE_BROKER_REGISTRATION (101, KIP-631). A second `weir`
//! process with the `node.id` and `controller.quorum.voters` of a live broker, on
//! another host (its own network namespace and address, `netns::TestNet`; without root,
//! another loopback address, 127.0.0.2, where the voter's CONTROLLER port is free), is
//! refused by the active controller and stops at start-up naming the id, while the
//! cluster carries on untouched: the original keeps its registration (address, broker
//! epoch), its partitions and their leader epochs, the quorum keeps its leader, and a
//! librdkafka producer and consumer keep working. Every process is stopped at the end
//! (`BinaryBroker`'s and `ThreeNodes`' drop), bounded waits throughout.

use std::collections::BTreeMap;
use std::time::Duration;

use kafka_protocol::messages::{MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::cluster::{describe_cluster, logged_epoch, port_of, quorum_node_on};
use crate::cluster_fixture::{produce_keyed, read_keyed, ThreeNodes};
use crate::harness::{decode, BinaryBroker, RawConn};
use crate::netns::TestNet;
use crate::replication::create_rf3;

const TOPIC: &str = "kept";
const PARTITIONS: i32 = 3;
const SHORT_SESSIONS: [&str; 2] = [
    "broker.session.timeout.ms=1500",
    "broker.heartbeat.interval.ms=300",
];

/// `TOPIC`'s partitions as a node's Metadata (v12, raw) lists them: index -> (leader,
/// leader epoch).
fn leaders(bootstrap: &str) -> BTreeMap<i32, (i32, i32)> {
    let mut conn = RawConn::connect(bootstrap);
    let req = MetadataRequest::default().with_topics(Some(vec![
        kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
            .with_name(Some(TopicName(StrBytes::from_static_str(TOPIC)))),
    ]));
    let m: MetadataResponse = decode(conn.request(&req, 12, 1).expect("a Metadata answer"), 12);
    m.topics
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| (p.partition_index, (p.leader_id.0, p.leader_epoch)))
        .collect()
}

/// The brokers DescribeCluster v2 (fenced ones included) lists through `bootstrap`:
/// (id, port, fenced).
fn described_brokers(bootstrap: &str) -> Vec<(i32, i32, bool)> {
    describe_cluster(bootstrap, 2, 1)
        .brokers
        .iter()
        .map(|b| (b.broker_id.0, b.port, b.is_fenced))
        .collect()
}

/// Starts a second process with `id` and the nodes' voters on `host` (in the namespace
/// `netns` when given), waits (at most 30 s) for it to exit, and returns its stderr;
/// fails the test unless it exited non-zero naming `node.id=ID` and error 101.
fn duplicate_stops(nodes: &ThreeNodes, netns: Option<&str>, host: &str, id: i32) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut dup: BinaryBroker = quorum_node_on(
        netns,
        host,
        dir.path(),
        id,
        nodes.voters(),
        nodes.controller_port(id),
        &SHORT_SESSIONS,
    );
    let status = dup.exit_within(Duration::from_secs(30));
    let stderr = dup.stderr_text();
    let status = status
        .unwrap_or_else(|| panic!("the duplicate of node {id} still runs after 30 s:\n{stderr}"));
    assert!(!status.success(), "{status:?}\n{stderr}");
    assert!(
        stderr.contains(&format!(
            "node.id={id} is already registered by another live broker"
        )) && stderr.contains("DUPLICATE_BROKER_REGISTRATION (101)"),
        "{stderr}"
    );
    // It stood for election while it retried (it never hears a leader): the voters
    // refused its vote requests, the original answering at the voter's address.
    assert!(
        stderr.contains(&format!(
            "the peer refuses this node's Raft requests: a vote request names node {id}"
        )),
        "{stderr}"
    );
    stderr
}

/// See the module doc. The duplicate of a follower is refused because the follower's
/// session is live (it heartbeats on an open connection); the duplicate of the active
/// controller because that process is alive with that id. Each duplicate's vote
/// requests are refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_with_a_live_node_id_stops_and_the_cluster_carries_on() {
    let (nodes, netns, host) = match TestNet::create(4) {
        Ok(net) => {
            let (ns, host) = (net.namespace(4), net.addr(4));
            (
                ThreeNodes::start_on(net, 3, &SHORT_SESSIONS),
                Some(ns),
                host,
            )
        }
        Err(why) => {
            eprintln!(
                "the duplicate runs on 127.0.0.2: network namespaces cannot be made here: {why}"
            );
            (
                ThreeNodes::start(&SHORT_SESSIONS),
                None,
                "127.0.0.2".to_string(),
            )
        }
    };
    let leader = nodes.leader();
    let follower = leader % 3 + 1;
    create_rf3(&nodes.bootstrap(leader), TOPIC, PARTITIONS, &[]).await;
    produce_keyed(&nodes.bootstrap_all(), TOPIC, 100, Some(PARTITIONS))
        .await
        .assert_all_acked(100);
    let brokers = described_brokers(&nodes.bootstrap(leader));
    let partitions = leaders(&nodes.bootstrap(leader));
    let epoch = logged_epoch(&nodes.node(follower).stderr_text(), follower)
        .expect("the follower logged its registration");
    assert_eq!(brokers.len(), 3, "{brokers:?}");
    assert!(brokers.iter().all(|b| !b.2), "{brokers:?}");

    for id in [follower, leader] {
        duplicate_stops(&nodes, netns.as_deref(), &host, id);
        // Nothing changed: every broker listed as before (the original at its own
        // port, unfenced), every partition with the same leader at the same leader
        // epoch (a new registration of the id would have moved its leaderships to a
        // higher epoch), the same quorum leader.
        for n in 1..=3 {
            assert_eq!(described_brokers(&nodes.bootstrap(n)), brokers, "node {n}");
            assert_eq!(leaders(&nodes.bootstrap(n)), partitions, "node {n}");
        }
        assert_eq!(nodes.leader(), leader);
    }
    let leader_log = nodes.node(leader).stderr_text();
    assert!(
        leader_log.contains("refused a broker registration with DUPLICATE_BROKER_REGISTRATION"),
        "{leader_log}"
    );
    // The originals never registered again nor were fenced.
    for (n, node) in nodes.running() {
        let log = node.stderr_text();
        assert_eq!(
            log.matches("registered broker_id=").count(),
            1,
            "node {n}:\n{log}"
        );
        assert!(!log.contains("fenced broker_id="), "node {n}:\n{log}");
    }
    assert_eq!(
        logged_epoch(&nodes.node(follower).stderr_text(), follower),
        Some(epoch)
    );
    assert_eq!(
        port_of(&nodes.bootstrap(follower)),
        brokers[(follower - 1) as usize].1
    );

    // The quorum still takes changes, and a real client produces to and reads back
    // from the old topic and a new one.
    create_rf3(&nodes.bootstrap(follower), "after", PARTITIONS, &[]).await;
    for topic in [TOPIC, "after"] {
        let produced = produce_keyed(&nodes.bootstrap_all(), topic, 200, Some(PARTITIONS)).await;
        produced.assert_all_acked(200);
        let total = if topic == TOPIC { 300 } else { 200 };
        let read = read_keyed(&nodes.bootstrap_all(), topic, PARTITIONS, total);
        assert!(read.bad.is_empty(), "{:?}", read.bad);
        if topic == "after" {
            read.assert_exactly(&produced.acked);
        } else {
            // Records 0..100 twice (before and after), 100..200 once.
            let want: BTreeMap<usize, usize> =
                (0..200).map(|i| (i, if i < 100 { 2 } else { 1 })).collect();
            assert_eq!(read.seen, want);
        }
    }
    nodes.assert_no_panic();
}
