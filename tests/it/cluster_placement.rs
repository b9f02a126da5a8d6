//! Issue 12, placement: three `weir` processes; a topic's partitions are spread over the
//! brokers (Kafka's rack-unaware round-robin), each partition's log lives only on its
//! replicas, and only its leader answers Produce, ListOffsets and Fetch — the others say
//! NOT_LEADER_OR_FOLLOWER (6), so a client bootstrapped to one node follows Metadata to
//! the leaders. CreateTopics refuses a replication factor above the live brokers (38) and
//! an assignment naming an unknown broker (39). A group's coordinator is the leader of its
//! `__consumer_offsets` partition; the other brokers answer NOT_COORDINATOR (16). Every
//! process is killed at the end
//! (`BinaryBroker`'s drop).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::{CreatableReplicaAssignment, CreatableTopic};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    BrokerId, CreateTopicsRequest, CreateTopicsResponse, DescribeGroupsRequest,
    DescribeGroupsResponse, FetchRequest, FetchResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, HeartbeatRequest, HeartbeatResponse, ListOffsetsRequest,
    ListOffsetsResponse, MetadataRequest, MetadataResponse, ProduceRequest, ProduceResponse,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use crate::cluster::port_of;
use crate::cluster_fixture::{produce_keyed, read_keyed, ThreeNodes};
use crate::harness::{decode, poll_for, RawConn};
use crate::rdkafka_client::admin;

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

/// One partition as a node's Metadata v12 lists it: (error, leader, replicas, isr).
type Listed = (i16, i32, Vec<i32>, Vec<i32>);

/// `topic`'s partitions as `bootstrap`'s Metadata v12 lists them (raw), by index; empty
/// when the node does not know the topic (yet).
pub(crate) fn partitions_listed(bootstrap: &str, topic: &str) -> BTreeMap<i32, Listed> {
    let req = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(name(topic)))
        ]))
        .with_allow_auto_topic_creation(false);
    let mut conn = RawConn::connect(bootstrap);
    let Some(body) = conn.request(&req, 12, 7) else {
        return BTreeMap::new();
    };
    let m: MetadataResponse = decode(body, 12);
    let ids = |v: &[BrokerId]| v.iter().map(|b| b.0).collect::<Vec<i32>>();
    m.topics
        .iter()
        .filter(|t| t.error_code == 0)
        .flat_map(|t| t.partitions.iter())
        .map(|p| {
            (
                p.partition_index,
                (
                    p.error_code,
                    p.leader_id.0,
                    ids(&p.replica_nodes),
                    ids(&p.isr_nodes),
                ),
            )
        })
        .collect()
}

/// A raw CreateTopics v5: the topic's (error code, message).
pub(crate) fn create_raw(bootstrap: &str, topic: CreatableTopic) -> (i16, String) {
    let req = CreateTopicsRequest::default()
        .with_topics(vec![topic])
        .with_timeout_ms(10_000);
    let mut conn = RawConn::connect(bootstrap);
    let r: CreateTopicsResponse = decode(conn.request(&req, 5, 19).expect("an answer"), 5);
    let t = &r.topics[0];
    (
        t.error_code,
        t.error_message
            .as_ref()
            .map_or(String::new(), |m| m.to_string()),
    )
}

fn one_batch() -> Bytes {
    let record = Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: -1,
        timestamp: weir::replica::now_ms(),
        key: Some(Bytes::from_static(b"k")),
        value: Some(Bytes::from_static(b"v")),
        headers: Default::default(),
    };
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &[record],
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .unwrap();
    buf.freeze()
}

/// The error codes `bootstrap` answers a raw Produce v9, ListOffsets v7 and a consumer's
/// Fetch at `fetch_version` of `topic`'s partition `partition` with.
fn produce_list_fetch_errors(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    fetch_version: i16,
) -> [i16; 3] {
    let mut conn = RawConn::connect(bootstrap);
    let produce = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(one_batch()))])]);
    let p: ProduceResponse = decode(conn.request(&produce, 9, 1).expect("Produce answer"), 9);
    let list = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(name(topic))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(partition)
                .with_timestamp(-1)])]);
    let l: ListOffsetsResponse = decode(conn.request(&list, 7, 2).expect("ListOffsets answer"), 7);
    let fetch = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(name(topic))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(0)
                .with_partition_max_bytes(1 << 20)])]);
    let f: FetchResponse = decode(
        conn.request(&fetch, fetch_version, 3)
            .expect("Fetch answer"),
        fetch_version,
    );
    [
        p.responses[0].partition_responses[0].error_code,
        l.topics[0].partitions[0].error_code,
        f.responses[0].partitions[0].error_code,
    ]
}

/// Issue 12, placement test: 3 nodes; "placed" (6 partitions, rf 3) is led twice by each
/// broker with 3 replicas per partition, all in the ISR; a producer and a consumer
/// bootstrapped to node 1 alone move 3000 keyed records through the three leaders with
/// nothing lost or duplicated; a raw Produce, ListOffsets or Fetch to a follower or to a
/// node not hosting the partition gets NOT_LEADER_OR_FOLLOWER (6), except a consumer's
/// Fetch v11+ to a follower, which it serves (KIP-392); rf 4 on 3 brokers
/// gets INVALID_REPLICATION_FACTOR (38), an assignment naming broker 9
/// INVALID_REPLICA_ASSIGNMENT (39).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_spread_over_three_brokers_and_clients_follow_the_leaders() {
    // Placement is over the live brokers of the image: the fixture waits until every
    // node has all three.
    let nodes = ThreeNodes::start(&[]);
    let addr = |id: i32| nodes.bootstrap(id);

    // CreateTopics through a real client bootstrapped to node 1.
    let created = admin(&addr(1))
        .create_topics(
            &[NewTopic::new("placed", 6, TopicReplication::Fixed(3))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(20))),
        )
        .await
        .expect("create_topics");
    for r in created {
        r.expect("topic created");
    }
    for id in 1..=3 {
        let listed = poll_for(
            &format!("node {id} lists placed's 6 partitions"),
            15,
            || {
                let p = partitions_listed(&addr(id), "placed");
                if p.len() == 6 {
                    Ok(p)
                } else {
                    Err(format!("{p:?}"))
                }
            },
        );
        let mut led: BTreeMap<i32, usize> = BTreeMap::new();
        for (index, (error, leader, replicas, isr)) in &listed {
            assert_eq!(*error, 0, "partition {index}");
            let distinct: BTreeSet<i32> = replicas.iter().copied().collect();
            assert_eq!(distinct, BTreeSet::from([1, 2, 3]), "partition {index}");
            assert_eq!(replicas.len(), 3, "partition {index}: {replicas:?}");
            assert_eq!(*leader, replicas[0], "the first replica leads");
            let in_sync: BTreeSet<i32> = isr.iter().copied().collect();
            assert_eq!(
                in_sync, distinct,
                "partition {index}: a new partition's ISR is every replica"
            );
            *led.entry(*leader).or_default() += 1;
        }
        assert_eq!(
            led,
            BTreeMap::from([(1, 2), (2, 2), (3, 2)]),
            "node {id}: {listed:?}"
        );
    }
    let leaders: BTreeMap<i32, i32> = partitions_listed(&addr(1), "placed")
        .into_iter()
        .map(|(p, l)| (p, l.1))
        .collect();

    // 3000 keyed records, acks=all, through a client that knows node 1 only; read back
    // through a consumer that knows node 1 only (librdkafka assigns only with a group
    // id; nothing is committed).
    const RECORDS: usize = 3000;
    let produced = produce_keyed(&addr(1), "placed", RECORDS, None).await;
    let read = read_keyed(&addr(1), "placed", 6, produced.acked.len());
    produced.assert_all_acked(RECORDS);
    read.assert_exactly(&produced.acked);
    let partitions_of_key = &read.partitions_of_key;
    assert!(partitions_of_key.values().all(|p| p.len() == 1));
    let used: BTreeSet<i32> = partitions_of_key.values().flatten().copied().collect();
    let leaders_used: BTreeSet<i32> = used.iter().map(|p| leaders[p]).collect();
    assert!(
        leaders_used.len() > 1,
        "records went through leaders {leaders_used:?} only"
    );

    // A follower of partition 0 (it hosts the log) does not answer for it, except a
    // consumer's Fetch v11+ (KIP-392: reads from followers).
    let leader0 = leaders[&0];
    let follower = (1..=3).find(|id| *id != leader0).unwrap();
    assert_eq!(
        produce_list_fetch_errors(&addr(follower), "placed", 0, 10),
        [6, 6, 6],
        "Produce, ListOffsets, Fetch v10 to follower {follower} of placed-0 (leader {leader0})"
    );
    assert_eq!(
        produce_list_fetch_errors(&addr(follower), "placed", 0, 12),
        [6, 6, 0],
        "Fetch v12 to follower {follower} of placed-0 (leader {leader0})"
    );
    assert_eq!(
        produce_list_fetch_errors(&addr(leader0), "placed", 0, 12),
        [0, 0, 0],
        "the leader answers"
    );
    // A node that does not host the partition at all.
    let (e, m) = create_raw(
        &addr(1),
        CreatableTopic::default()
            .with_name(name("on-one"))
            .with_num_partitions(1)
            .with_replication_factor(1),
    );
    assert_eq!(e, 0, "{m}");
    let leader = poll_for("on-one in node 1's Metadata", 15, || {
        partitions_listed(&addr(1), "on-one")
            .get(&0)
            .map(|p| p.1)
            .ok_or_else(|| "not yet".to_string())
    });
    let elsewhere = (1..=3).find(|id| *id != leader).unwrap();
    poll_for("on-one in the other node's Metadata", 15, || {
        if partitions_listed(&addr(elsewhere), "on-one").is_empty() {
            Err("not yet".to_string())
        } else {
            Ok(())
        }
    });
    assert_eq!(
        produce_list_fetch_errors(&addr(elsewhere), "on-one", 0, 12),
        [6, 6, 6],
        "node {elsewhere} does not host on-one-0 (led by {leader})"
    );

    // Two brokers creating one name at the same moment: one creation wins, the other
    // answers TOPIC_ALREADY_EXISTS (36) — never UNKNOWN_SERVER_ERROR (-1), which is what
    // the loser got when the quorum refused its change because the winner's came first.
    for round in 0..8 {
        let topic = format!("raced-{round}");
        let answers: Vec<(i16, String)> = std::thread::scope(|scope| {
            let racers: Vec<_> = [2, 3]
                .into_iter()
                .map(|id| {
                    let (bootstrap, topic) = (addr(id), topic.clone());
                    scope.spawn(move || {
                        create_raw(
                            &bootstrap,
                            CreatableTopic::default()
                                .with_name(name(&topic))
                                .with_num_partitions(1)
                                .with_replication_factor(1),
                        )
                    })
                })
                .collect();
            racers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let mut codes: Vec<i16> = answers.iter().map(|(e, _)| *e).collect();
        codes.sort_unstable();
        assert_eq!(codes, [0, 36], "{topic}: {answers:?}");
    }

    // Replication factor above the live brokers; an assignment naming broker 9.
    let (e, m) = create_raw(
        &addr(2),
        CreatableTopic::default()
            .with_name(name("rf-four"))
            .with_num_partitions(1)
            .with_replication_factor(4),
    );
    assert_eq!(e, 38, "INVALID_REPLICATION_FACTOR: {m}");
    assert!(m.contains("only 3 broker(s)"), "{m}");
    let (e, m) = create_raw(
        &addr(3),
        CreatableTopic::default()
            .with_name(name("to-nine"))
            .with_num_partitions(-1)
            .with_replication_factor(-1)
            .with_assignments(vec![CreatableReplicaAssignment::default()
                .with_partition_index(0)
                .with_broker_ids(vec![BrokerId(1), BrokerId(9)])]),
    );
    assert_eq!(e, 39, "INVALID_REPLICA_ASSIGNMENT: {m}");
    assert!(m.contains("broker 9"), "{m}");
    // A valid explicit assignment is taken as given.
    let (e, m) = create_raw(
        &addr(3),
        CreatableTopic::default()
            .with_name(name("assigned"))
            .with_num_partitions(-1)
            .with_replication_factor(-1)
            .with_assignments(vec![
                CreatableReplicaAssignment::default()
                    .with_partition_index(1)
                    .with_broker_ids(vec![BrokerId(2), BrokerId(3)]),
                CreatableReplicaAssignment::default()
                    .with_partition_index(0)
                    .with_broker_ids(vec![BrokerId(3), BrokerId(1)]),
            ]),
    );
    assert_eq!(e, 0, "{m}");
    let assigned = poll_for("assigned in node 1's Metadata", 15, || {
        let p = partitions_listed(&addr(1), "assigned");
        if p.len() == 2 {
            Ok(p)
        } else {
            Err(format!("{p:?}"))
        }
    });
    assert_eq!(assigned[&0].1, 3);
    assert_eq!(assigned[&0].2, vec![3, 1]);
    assert_eq!(assigned[&1].1, 2);
    assert_eq!(assigned[&1].2, vec![2, 3]);

    // Groups: FindCoordinator on every node answers the leader of the group's
    // `__consumer_offsets` partition; the others answer NOT_COORDINATOR (16); offsets
    // committed through node 1 are read back through node 2 (both go to the coordinator).
    let group = "placement-group";
    let mut coordinators = BTreeSet::new();
    for id in 1..=3 {
        let req = FindCoordinatorRequest::default()
            .with_key(StrBytes::from_static_str(group))
            .with_key_type(0);
        let mut conn = RawConn::connect(&addr(id));
        let r: FindCoordinatorResponse = decode(
            conn.request(&req, 3, 10).expect("FindCoordinator answer"),
            3,
        );
        assert_eq!(r.error_code, 0, "node {id}: {:?}", r.error_message);
        assert_eq!(r.port, port_of(&addr(r.node_id.0)), "at its own endpoint");
        coordinators.insert(r.node_id.0);
    }
    assert_eq!(coordinators.len(), 1, "{coordinators:?}");
    let coordinator = *coordinators.first().unwrap();
    let offsets = poll_for("__consumer_offsets in node 1's Metadata", 15, || {
        let p = partitions_listed(&addr(1), "__consumer_offsets");
        if p.is_empty() {
            Err("not yet".to_string())
        } else {
            Ok(p)
        }
    });
    let hash = group
        .encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)));
    let partition = (hash & 0x7fff_ffff) % offsets.len() as i32;
    assert_eq!(offsets[&partition].1, coordinator, "leader of {partition}");
    for id in 1..=3 {
        let req = HeartbeatRequest::default()
            .with_group_id(kafka_protocol::messages::GroupId(
                StrBytes::from_static_str(group),
            ))
            .with_generation_id(1)
            .with_member_id(StrBytes::from_static_str("nobody"));
        let mut conn = RawConn::connect(&addr(id));
        let r: HeartbeatResponse = decode(conn.request(&req, 3, 11).expect("Heartbeat answer"), 3);
        let d =
            DescribeGroupsRequest::default().with_groups(vec![kafka_protocol::messages::GroupId(
                StrBytes::from_static_str(group),
            )]);
        let described: DescribeGroupsResponse =
            decode(conn.request(&d, 5, 12).expect("DescribeGroups answer"), 5);
        let described = described.groups[0].error_code;
        if id == coordinator {
            assert_ne!(r.error_code, 16, "the coordinator");
            assert_eq!(described, 0, "the coordinator describes it");
        } else {
            assert_eq!(r.error_code, 16, "NOT_COORDINATOR from node {id}");
            assert_eq!(
                described, 16,
                "DescribeGroups: NOT_COORDINATOR from node {id}"
            );
        }
    }
    let committer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", addr(1))
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for part in 0..6 {
        tpl.add_partition_offset("placed", part, Offset::Offset(10 + part as i64))
            .unwrap();
    }
    committer
        .commit(&tpl, rdkafka::consumer::CommitMode::Sync)
        .expect("commit through node 1");
    drop(committer);
    let reader: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", addr(2))
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut wanted = TopicPartitionList::new();
    for part in 0..6 {
        wanted.add_partition("placed", part);
    }
    let got = reader
        .committed_offsets(wanted, Duration::from_secs(20))
        .expect("committed offsets through node 2");
    for part in 0..6 {
        assert_eq!(
            got.find_partition("placed", part)
                .expect("partition")
                .offset(),
            Offset::Offset(10 + part as i64)
        );
    }
    drop(reader);

    nodes.assert_no_panic();
}
