//! Named listeners (issue 15): a broker serves several Kafka listeners, each named in
//! `listener.security.protocol.map`, and a request answered on a listener gets that
//! listener's endpoints back — every broker's in Metadata and DescribeCluster, the
//! coordinator's in FindCoordinator — as Kafka does, so clients that came in on one
//! network stay on it. Duplicate names, names without a protocol and protocols weir does
//! not serve (SSL, SASL) are refused at start-up with the reason.

use std::collections::BTreeSet;
use std::time::Duration;

use kafka_protocol::messages::{
    DescribeClusterRequest, DescribeClusterResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, MetadataRequest, MetadataResponse,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::{NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

use crate::cluster::free_ports;
use crate::cluster_fixture::{keyed_key, keyed_value};
use crate::cluster_scenarios::refused_start;
use crate::harness::{decode, poll_for, BinaryBroker, RawConn};

/// Brokers (id, host, port) as `bootstrap`'s Metadata v12 lists them, sorted.
fn raw_metadata_brokers(bootstrap: &str) -> Result<Vec<(i32, String, i32)>, String> {
    let mut conn = RawConn::connect(bootstrap);
    let body = conn
        .request(&MetadataRequest::default().with_topics(Some(vec![])), 12, 1)
        .ok_or("no Metadata answer")?;
    let m: MetadataResponse = decode(body, 12);
    let mut out: Vec<_> = m
        .brokers
        .iter()
        .map(|b| (b.node_id.0, b.host.to_string(), b.port))
        .collect();
    out.sort();
    Ok(out)
}

/// Brokers (id, host, port) as librdkafka's Metadata through `bootstrap` lists them.
fn rdkafka_brokers(bootstrap: &str) -> Vec<(i32, String, i32)> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("consumer");
    let m = c
        .fetch_metadata(None, Duration::from_secs(10))
        .expect("metadata");
    let mut out: Vec<_> = m
        .brokers()
        .iter()
        .map(|b| (b.id(), b.host().to_string(), b.port()))
        .collect();
    out.sort();
    out
}

/// Raw FindCoordinator v3 for group `group` through `addr`: (error, node id, host, port).
fn raw_find_coordinator(addr: &str, group: &str) -> (i16, i32, String, i32) {
    let mut conn = RawConn::connect(addr);
    let req = FindCoordinatorRequest::default().with_key(StrBytes::from_string(group.into()));
    let body = conn.request(&req, 3, 3).expect("FindCoordinator answer");
    let f: FindCoordinatorResponse = decode(body, 3);
    (f.error_code, f.node_id.0, f.host.to_string(), f.port)
}

/// (error, leader) of partition 0 of `topic` in `addr`'s Metadata v12.
fn raw_partition_leader(addr: &str, topic: &str) -> (i16, i32) {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::TopicName;
    let mut conn = RawConn::connect(addr);
    let req = MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(topic.into()))))]));
    let body = conn.request(&req, 12, 4).expect("Metadata answer");
    let m: MetadataResponse = decode(body, 12);
    let p = &m.topics[0].partitions[0];
    (p.error_code, p.leader_id.0)
}

/// Three combined nodes serving INTERNAL on 127.0.0.1 (the inter-broker listener);
/// nodes 1 and 2 also serve EXTERNAL on 127.0.0.2, node 3 does not. librdkafka and raw
/// requests on either listener are told only that listener's endpoints (Metadata,
/// DescribeCluster, FindCoordinator): through EXTERNAL node 3 is not listed, a partition
/// it leads has leader -1 and LISTENER_NOT_FOUND (72), a group it coordinates
/// COORDINATOR_NOT_AVAILABLE (15). A consumer group that bootstraps on EXTERNAL reads,
/// through EXTERNAL addresses only, every record a producer on INTERNAL wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_listener_advertises_its_own_endpoints_on_a_cluster() {
    let ports = free_ports(8);
    let (controller, internal, external) = (&ports[0..3], &ports[3..6], &ports[6..8]);
    let voters = (0..3)
        .map(|i| format!("{}@127.0.0.1:{}", i + 1, controller[i]))
        .collect::<Vec<_>>()
        .join(",");
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let nodes: Vec<BinaryBroker> = (0..3)
        .map(|i| {
            let external = external
                .get(i)
                .map_or(String::new(), |q| format!(",EXTERNAL://127.0.0.2:{q}"));
            let overrides = [
                format!("node.id={}", i + 1),
                format!("controller.quorum.voters={voters}"),
                "controller.listener.names=CONTROLLER".to_string(),
                format!(
                    "listeners=INTERNAL://127.0.0.1:{}{external},CONTROLLER://127.0.0.1:{}",
                    internal[i], controller[i]
                ),
                "listener.security.protocol.map=INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT"
                    .to_string(),
                "inter.broker.listener.name=INTERNAL".to_string(),
                "offsets.topic.num.partitions=3".to_string(),
                "group.initial.rebalance.delay.ms=0".to_string(),
            ];
            let refs: Vec<&str> = overrides.iter().map(String::as_str).collect();
            BinaryBroker::spawn(dirs[i].path(), 0, &refs)
        })
        .collect();
    let on = |host: &str, ports: &[u16]| -> Vec<(i32, String, i32)> {
        (0..ports.len())
            .map(|i| (i as i32 + 1, host.to_string(), i32::from(ports[i])))
            .collect()
    };
    let want_internal = on("127.0.0.1", internal);
    let want_external = on("127.0.0.2", external);
    let mut addrs = Vec::new();
    for i in 0..3 {
        assert_eq!(nodes[i].bootstrap, format!("127.0.0.1:{}", internal[i]));
        addrs.push((format!("127.0.0.1:{}", internal[i]), &want_internal));
        if let Some(q) = external.get(i) {
            addrs.push((format!("127.0.0.2:{q}"), &want_external));
        }
    }
    for (addr, want) in &addrs {
        poll_for(&format!("{addr} lists its listener's brokers"), 30, || {
            let listed = raw_metadata_brokers(addr)?;
            if &listed == *want {
                Ok(())
            } else {
                Err(format!("{listed:?}"))
            }
        });
        assert_eq!(&rdkafka_brokers(addr), *want, "librdkafka through {addr}");
        // DescribeCluster (key 60) names the same endpoints.
        let mut conn = RawConn::connect(addr);
        let body = conn
            .request(&DescribeClusterRequest::default(), 0, 2)
            .expect("DescribeCluster answer");
        let d: DescribeClusterResponse = decode(body, 0);
        let mut described: Vec<_> = d
            .brokers
            .iter()
            .map(|b| (b.broker_id.0, b.host.to_string(), b.port))
            .collect();
        described.sort();
        assert_eq!(&described, *want, "DescribeCluster through {addr}");
    }

    // A topic on brokers 1 and 2, written through INTERNAL with acks=all; one on 3 only.
    let internal_boot = nodes[0].bootstrap.clone();
    let external_boot = format!("127.0.0.2:{}", external[1]);
    let assignment: &[&[i32]] = &[&[1, 2], &[2, 1], &[1, 2]];
    crate::replication::create_topic(
        &internal_boot,
        NewTopic::new("named-listeners", 3, TopicReplication::Variable(assignment)),
    )
    .await;
    let only_three: &[&[i32]] = &[&[3]];
    crate::replication::create_topic(
        &internal_boot,
        NewTopic::new("on-node-3", 1, TopicReplication::Variable(only_three)),
    )
    .await;
    poll_for(
        "node 3 leads on-node-3 (INTERNAL)",
        30,
        || match raw_partition_leader(&internal_boot, "on-node-3") {
            (0, 3) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    assert_eq!(
        raw_partition_leader(&external_boot, "on-node-3"),
        (72, -1),
        "through EXTERNAL: LISTENER_NOT_FOUND, no leader"
    );
    let p = crate::rdkafka_client::producer(&internal_boot, &[("acks", "all")]);
    for i in 0..300 {
        let (k, v) = (keyed_key(i), keyed_value(i));
        p.send(
            rdkafka::producer::FutureRecord::to("named-listeners")
                .key(&k)
                .payload(&v),
            Duration::from_secs(30),
        )
        .await
        .unwrap_or_else(|(e, _)| panic!("record {i}: {e}"));
    }

    // FindCoordinator on each listener answers with that listener's endpoint; a group
    // node 3 coordinates has no coordinator on EXTERNAL.
    let group_on = |want_three: bool| -> String {
        (0..100)
            .map(|n| format!("named-listeners-{want_three}-{n}"))
            .find(|g| {
                let id = poll_for(
                    &format!("FindCoordinator {g}"),
                    30,
                    || match raw_find_coordinator(&internal_boot, g) {
                        (0, id, _, _) => Ok(id),
                        other => Err(format!("{other:?}")),
                    },
                );
                (id == 3) == want_three
            })
            .expect("a group of each kind among 100 names")
    };
    let group = group_on(false);
    let unreachable_group = group_on(true);
    let (_, id, host_in, port_in) = raw_find_coordinator(&internal_boot, &group);
    let (error, id_ex, host_ex, port_ex) = raw_find_coordinator(&external_boot, &group);
    assert_eq!((error, id_ex), (0, id), "one coordinator for the group");
    let k = (id - 1) as usize;
    assert_eq!(
        (host_in.as_str(), port_in),
        ("127.0.0.1", i32::from(internal[k]))
    );
    assert_eq!(
        (host_ex.as_str(), port_ex),
        ("127.0.0.2", i32::from(external[k]))
    );
    assert_eq!(
        raw_find_coordinator(&external_boot, &unreachable_group).0,
        15,
        "COORDINATOR_NOT_AVAILABLE: node 3 has no EXTERNAL endpoint"
    );

    // A group consumer that only knows EXTERNAL reads everything.
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &external_boot)
        .set("group.id", &group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    c.subscribe(&["named-listeners"]).expect("subscribe");
    let mut seen = BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while seen.len() < 300 && std::time::Instant::now() < deadline {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
            use rdkafka::Message;
            seen.insert(String::from_utf8_lossy(m.payload().unwrap_or_default()).to_string());
        }
    }
    let want: BTreeSet<String> = (0..300).map(keyed_value).collect();
    assert_eq!(seen, want, "read through EXTERNAL");
    drop(c);
    for n in &nodes {
        let log = n.stderr_text();
        assert!(!log.contains("panicked"), "{log}");
    }
}

/// A listener name used twice, a name with no security protocol, and a listener mapped
/// to a protocol weir does not serve stop `weir serve` with the key and the reason.
#[test]
fn bad_listener_names_are_refused_at_start_with_the_reason() {
    for (overrides, want) in [
        (
            vec!["listeners=PLAINTEXT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0"],
            "the listener name PLAINTEXT is used twice",
        ),
        (
            vec!["listeners=INTERNAL://127.0.0.1:0"],
            "INTERNAL: no security protocol defined for this listener name",
        ),
        (
            vec![
                "listeners=SECURE://127.0.0.1:0",
                "listener.security.protocol.map=SECURE:SSL",
            ],
            "SECURE: its security protocol is SSL",
        ),
        (
            vec![
                "listeners=PLAINTEXT://127.0.0.1:0",
                "listener.security.protocol.map=PLAINTEXT:TLS",
            ],
            "TLS is not a security protocol",
        ),
    ] {
        let overrides: Vec<String> = overrides.iter().map(|o| o.to_string()).collect();
        let (code, stderr) = refused_start(&overrides);
        assert!(
            code.is_some_and(|c| c != 0),
            "{overrides:?}: {code:?} {stderr}"
        );
        assert!(stderr.contains(want), "{overrides:?}: {stderr}");
    }
}
