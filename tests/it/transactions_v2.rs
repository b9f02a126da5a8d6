//! KIP-890 part 2 (transaction version 2) as the Java client 4.x speaks it, on the wire:
//! ApiVersions v4 advertises `transaction.version` finalized at 2 (with EndTxn v5, Produce
//! v12, TxnOffsetCommit v5); the producer then sends no AddPartitionsToTxn and no
//! AddOffsetsToTxn (the partition leader and the group coordinator add the partitions),
//! and each EndTxn v5 bumps the epoch and answers with it, the next transaction starting
//! at sequence 0. No client installable here speaks part 2 (librdkafka 2.x, kafka-python,
//! aiokafka, kafkajs and @platformatic/kafka stop at part 1), so the producer is
//! `TxV2Producer`, and real consumers (librdkafka read_committed and read_uncommitted, a
//! librdkafka group's committed offset) check the outcome. A late write of an aborted
//! transaction is fenced by the bump; a retried EndTxn gets its first answer; a producer
//! on part 1 keeps part 1's defence when it sends Produce v12.
//!
//! Every wait is bounded.

use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::txn_offset_commit_request::{
    TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, ApiKey, ApiVersionsRequest,
    ApiVersionsResponse, EndTxnRequest, EndTxnResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, GroupId, InitProducerIdRequest, InitProducerIdResponse,
    ProduceRequest, ProduceResponse, ProducerId, TopicName, TransactionalId,
    TxnOffsetCommitRequest, TxnOffsetCommitResponse,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use crate::cluster_connect::leader_of_first;
use crate::cluster_fixture::ThreeNodes;
use crate::harness::{decode, poll_for, RawConn, TestBroker};
use crate::rdkafka_client::create_topic;
use crate::transactions_log::{batch, consume};

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// The coordinator of `key` (`key_type` 0: a group, 1: a transactional id) as broker
/// `bootstrap` names it: its node id and `host:port` (at most 30 s, while the internal
/// topic is created and its leaders elected).
fn find_coordinator(bootstrap: &str, key: &str, key_type: i8) -> (i32, String) {
    poll_for(&format!("the coordinator of {key}"), 30, || {
        let mut conn = RawConn::connect(bootstrap);
        let find = FindCoordinatorRequest::default()
            .with_key(s(key))
            .with_key_type(key_type);
        let f: FindCoordinatorResponse = decode(conn.request(&find, 2, 1).unwrap(), 2);
        if f.error_code == 0 {
            Ok((f.node_id.0, format!("{}:{}", f.host, f.port)))
        } else {
            Err(format!("error {}", f.error_code))
        }
    })
}

/// A transactional producer speaking transaction version 2 as the Java client 4.x does
/// (its `TransactionManager` with `isTransactionV2Enabled`): requests of the transaction
/// to its coordinator, records to the leader of partition 0.
struct TxV2Producer {
    bootstrap: String,
    coordinator: RawConn,
    leader: RawConn,
    transactional_id: String,
    producer_id: i64,
    producer_epoch: i16,
    /// The next sequence of partition 0 (reset to 0 by each EndTxn v5, as the client's
    /// `resetSequenceNumbers`).
    sequence: i32,
    correlation_id: i32,
}

impl TxV2Producer {
    /// FindCoordinator through `bootstrap`, then InitProducerId there; records will go
    /// to `leader` (`host:port`).
    fn init(bootstrap: &str, leader: &str, transactional_id: &str) -> TxV2Producer {
        let (_, address) = find_coordinator(bootstrap, transactional_id, 1);
        let mut coordinator = RawConn::connect(&address);
        let request = InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(s(transactional_id))))
            .with_transaction_timeout_ms(60_000);
        let r: InitProducerIdResponse = decode(coordinator.request(&request, 4, 2).unwrap(), 4);
        assert_eq!(r.error_code, 0, "InitProducerId");
        TxV2Producer {
            bootstrap: bootstrap.to_string(),
            coordinator,
            leader: RawConn::connect(leader),
            transactional_id: transactional_id.to_string(),
            producer_id: r.producer_id.0,
            producer_epoch: r.producer_epoch,
            sequence: 0,
            correlation_id: 3,
        }
    }

    fn next_correlation_id(&mut self) -> i32 {
        self.correlation_id += 1;
        self.correlation_id
    }

    /// Produce v12 (acks=all) of one transactional batch of `values` to partition 0 of
    /// `topic` at `(producer_id, epoch)` and `sequence`, with no AddPartitionsToTxn
    /// before it; the partition's error code.
    fn produce_at(&mut self, topic: &str, epoch: i16, sequence: i32, values: &[&str]) -> i16 {
        let records = batch((self.producer_id, epoch), sequence, true, values);
        self.produce_records(topic, records)
    }

    /// Produce v12 (acks=all) of `records` to partition 0 of `topic`; its error code.
    fn produce_records(&mut self, topic: &str, records: Bytes) -> i16 {
        let request = ProduceRequest::default()
            .with_transactional_id(Some(TransactionalId(s(&self.transactional_id))))
            .with_acks(-1)
            .with_timeout_ms(10_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(s(topic)))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(records))])]);
        let id = self.next_correlation_id();
        let r: ProduceResponse = decode(self.leader.request(&request, 12, id).unwrap(), 12);
        r.responses[0].partition_responses[0].error_code
    }

    /// Produces `values` in the open transaction (sequences go on from the last batch).
    fn produce(&mut self, topic: &str, values: &[&str]) -> i16 {
        let (epoch, sequence) = (self.producer_epoch, self.sequence);
        let code = self.produce_at(topic, epoch, sequence, values);
        if code == 0 {
            self.sequence += values.len() as i32;
        }
        code
    }

    /// TxnOffsetCommit v5 of `offset` for partition 0 of `topic` in `group`, with no
    /// AddOffsetsToTxn before it (the client's `sendOffsetsToTransaction` under TV2).
    fn send_offsets(&mut self, group: &str, topic: &str, offset: i64) -> i16 {
        let (_, address) = find_coordinator(&self.bootstrap, group, 0);
        let mut conn = RawConn::connect(&address);
        let request = TxnOffsetCommitRequest::default()
            .with_transactional_id(TransactionalId(s(&self.transactional_id)))
            .with_group_id(GroupId(s(group)))
            .with_producer_id(ProducerId(self.producer_id))
            .with_producer_epoch(self.producer_epoch)
            .with_generation_id(-1)
            .with_member_id(s(""))
            .with_topics(vec![TxnOffsetCommitRequestTopic::default()
                .with_name(TopicName(s(topic)))
                .with_partitions(vec![TxnOffsetCommitRequestPartition::default()
                    .with_partition_index(0)
                    .with_committed_offset(offset)
                    .with_committed_leader_epoch(-1)])]);
        let id = self.next_correlation_id();
        let r: TxnOffsetCommitResponse = decode(conn.request(&request, 5, id).unwrap(), 5);
        r.topics[0].partitions[0].error_code
    }

    /// EndTxn v5 at `epoch`: the error code and the producer id and epoch answered.
    fn end_at(&mut self, epoch: i16, commit: bool) -> (i16, i64, i16) {
        let request = EndTxnRequest::default()
            .with_transactional_id(TransactionalId(s(&self.transactional_id)))
            .with_producer_id(ProducerId(self.producer_id))
            .with_producer_epoch(epoch)
            .with_committed(commit);
        let id = self.next_correlation_id();
        let r: EndTxnResponse = decode(self.coordinator.request(&request, 5, id).unwrap(), 5);
        (r.error_code, r.producer_id.0, r.producer_epoch)
    }

    /// Ends the open transaction; on success goes on with the answered id and epoch at
    /// sequence 0, as the client does. The answer.
    fn end(&mut self, commit: bool) -> (i16, i64, i16) {
        let answer = self.end_at(self.producer_epoch, commit);
        if answer.0 == 0 {
            self.producer_id = answer.1;
            self.producer_epoch = answer.2;
            self.sequence = 0;
        }
        answer
    }
}

/// The committed offset of partition 0 of `topic` in `group`, as a librdkafka consumer
/// of that group reads it (read_committed: only stable offsets, KIP-447).
fn committed(bootstrap: &str, group: &str, topic: &str) -> Offset {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, 0);
    let got = consumer
        .committed_offsets(tpl, Duration::from_secs(20))
        .unwrap();
    got.find_partition(topic, 0).unwrap().offset()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_version_2_producer_commits_aborts_and_is_fenced_by_the_epoch_bump() {
    let b = TestBroker::start();
    const TOPIC: &str = "tv2";
    create_topic(&b.bootstrap, TOPIC, 1, &[]).await;
    let bootstrap = b.bootstrap.clone();
    tokio::task::spawn_blocking(move || {
        // What makes the Java client turn transaction version 2 on.
        let mut conn = RawConn::connect(&bootstrap);
        let v: ApiVersionsResponse = decode(
            conn.request(&ApiVersionsRequest::default(), 4, 1).unwrap(),
            4,
        );
        assert!(v.finalized_features_epoch >= 0, "{v:?}");
        let finalized: Vec<_> = v
            .finalized_features
            .iter()
            .map(|f| (f.name.to_string(), f.min_version_level, f.max_version_level))
            .collect();
        assert_eq!(finalized, vec![("transaction.version".to_string(), 2, 2)]);
        assert!(v
            .supported_features
            .iter()
            .any(|f| f.name.as_str() == "transaction.version" && f.max_version == 2));
        let max = |key: ApiKey| {
            v.api_keys
                .iter()
                .find(|k| k.api_key == key as i16)
                .map(|k| k.max_version)
        };
        assert!(max(ApiKey::EndTxn) >= Some(5));
        assert!(max(ApiKey::Produce) >= Some(12));
        assert!(max(ApiKey::TxnOffsetCommit) >= Some(5));

        let mut p = TxV2Producer::init(&bootstrap, &bootstrap, "tv2-producer");
        let (pid, e0) = (p.producer_id, p.producer_epoch);
        // 1: committed, with the consumer group's offset in it.
        assert_eq!(p.produce(TOPIC, &["a1", "a2"]), 0);
        assert_eq!(p.send_offsets("tv2-group", TOPIC, 42), 0);
        assert_eq!(
            p.end(true),
            (0, pid, e0 + 1),
            "EndTxn v5 answers the bumped epoch"
        );
        // A retry of that EndTxn (its answer lost) gets the same answer.
        assert_eq!(p.end_at(e0, true), (0, pid, e0 + 1));
        // 2: aborted, at the bumped epoch from sequence 0.
        assert_eq!(p.produce(TOPIC, &["b1"]), 0);
        assert_eq!(p.end(false), (0, pid, e0 + 2));
        // A late write of transaction 2 (epoch e0 + 1) is fenced by the bump: it would
        // otherwise hang a new transaction on the partition.
        assert_eq!(
            p.produce_at(TOPIC, e0 + 1, 1, &["late"]),
            47,
            "INVALID_PRODUCER_EPOCH"
        );
        assert_eq!(p.end_at(e0 + 1, false), (0, pid, e0 + 2), "a retried abort");
        assert_eq!(p.end_at(e0 + 1, true).0, 48, "a commit after the abort");
        // 3: an abort with nothing sent still bumps; 4: committed.
        assert_eq!(p.end(false), (0, pid, e0 + 3));
        // A batch after the transaction's first, arriving before it: refused, not
        // written out of order.
        assert_eq!(
            p.produce_at(TOPIC, e0 + 3, 1, &["c-early"]),
            45,
            "OUT_OF_ORDER_SEQUENCE_NUMBER"
        );
        assert_eq!(p.produce(TOPIC, &["c1"]), 0);
        assert_eq!(p.send_offsets("tv2-group", TOPIC, 43), 0);
        assert_eq!(p.end(true), (0, pid, e0 + 4));

        // A producer on part 1 (AddPartitionsToTxn, EndTxn v4: no bump) that sends its
        // late write as Produce v12 is refused as part 1 refuses it.
        let mut old = TxV2Producer::init(&bootstrap, &bootstrap, "tv1-producer");
        let add = AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(s("tv1-producer")))
            .with_v3_and_below_producer_id(ProducerId(old.producer_id))
            .with_v3_and_below_producer_epoch(old.producer_epoch)
            .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(TopicName(s(TOPIC)))
                .with_partitions(vec![0])]);
        let r: AddPartitionsToTxnResponse =
            decode(old.coordinator.request(&add, 3, 90).unwrap(), 3);
        assert_eq!(
            r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code,
            0
        );
        assert_eq!(old.produce(TOPIC, &["x1"]), 0);
        let request = EndTxnRequest::default()
            .with_transactional_id(TransactionalId(s("tv1-producer")))
            .with_producer_id(ProducerId(old.producer_id))
            .with_producer_epoch(old.producer_epoch)
            .with_committed(false);
        let r: EndTxnResponse = decode(old.coordinator.request(&request, 4, 91).unwrap(), 4);
        assert_eq!(r.error_code, 0);
        assert_eq!(old.produce(TOPIC, &["x-late"]), 48, "INVALID_TXN_STATE");
        // Transactional batches of two producers in one partition's records: refused
        // whole, as only one producer's transaction could be checked.
        let mixed = [
            batch((p.producer_id, p.producer_epoch), 0, true, &["m1"]),
            batch((old.producer_id, old.producer_epoch), 2, true, &["m2"]),
        ]
        .concat();
        assert_eq!(
            p.produce_records(TOPIC, Bytes::from(mixed)),
            49,
            "INVALID_PRODUCER_ID_MAPPING"
        );
    })
    .await
    .unwrap();

    // What real consumers see: transactions 1 and 4, in order, nothing of 2, the aborted
    // part-1 write, or the late writes; read_uncommitted also sees the aborted records.
    let bootstrap = b.bootstrap.clone();
    let (committed_values, all_values, offset) = tokio::task::spawn_blocking(move || {
        (
            consume(&bootstrap, TOPIC, "read_committed", 3),
            consume(&bootstrap, TOPIC, "read_uncommitted", 5),
            committed(&bootstrap, "tv2-group", TOPIC),
        )
    })
    .await
    .unwrap();
    assert_eq!(committed_values, vec!["a1", "a2", "c1"]);
    assert_eq!(all_values, vec!["a1", "a2", "b1", "c1", "x1"]);
    assert_eq!(offset, Offset::Offset(43));
}

/// On three brokers, with the leader of the partition, the transaction coordinator and
/// the group coordinator on different nodes: the leader adds the partition at the
/// coordinator (AddPartitionsToTxn v4 without `verify_only`), the group coordinator adds
/// `__consumer_offsets` the same way, and the outcome is as on one node: committed
/// records and offsets visible, aborted ones not, the late write fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_version_2_producer_on_a_cluster_is_added_by_leaders_that_do_not_coordinate()
{
    let nodes = ThreeNodes::start(&[
        "transaction.state.log.num.partitions=5",
        "offsets.topic.num.partitions=5",
    ]);
    const TOPIC: &str = "tv2-cluster";
    crate::replication::create_topic(
        &nodes.bootstrap_all(),
        rdkafka::admin::NewTopic::new(TOPIC, 1, rdkafka::admin::TopicReplication::Fixed(3)),
    )
    .await;
    let bootstrap = nodes.bootstrap(1);
    let leader = leader_of_first(&bootstrap, TOPIC);
    let leader_address = nodes.bootstrap(leader);
    let (p, committed_values, offset) = tokio::task::spawn_blocking(move || {
        // A transactional id another node coordinates, and a group a third node does.
        let (tid, coordinator) = (0..100)
            .map(|i| format!("tv2-cluster-{i}"))
            .map(|tid| {
                let (node, _) = find_coordinator(&bootstrap, &tid, 1);
                (tid, node)
            })
            .find(|(_, node)| *node != leader)
            .expect("an id coordinated away from the leader");
        let group = (0..100)
            .map(|i| format!("tv2-cluster-group-{i}"))
            .find(|g| {
                let node = find_coordinator(&bootstrap, g, 0).0;
                node != coordinator && node != leader
            })
            .expect("a group coordinated by the third node");
        let mut p = TxV2Producer::init(&bootstrap, &leader_address, &tid);
        let (pid, e0) = (p.producer_id, p.producer_epoch);
        assert_eq!(p.produce(TOPIC, &["a1"]), 0);
        assert_eq!(p.send_offsets(&group, TOPIC, 7), 0);
        assert_eq!(p.end(true), (0, pid, e0 + 1));
        assert_eq!(p.produce(TOPIC, &["b1"]), 0);
        assert_eq!(p.send_offsets(&group, TOPIC, 8), 0);
        assert_eq!(p.end(false), (0, pid, e0 + 2));
        assert_eq!(
            p.produce_at(TOPIC, e0 + 1, 1, &["late"]),
            47,
            "INVALID_PRODUCER_EPOCH"
        );
        assert_eq!(p.produce(TOPIC, &["c1"]), 0);
        assert_eq!(p.end(true), (0, pid, e0 + 3));
        let all = format!("{bootstrap},{leader_address}");
        (
            (pid, coordinator),
            consume(&all, TOPIC, "read_committed", 2),
            committed(&all, &group, TOPIC),
        )
    })
    .await
    .unwrap();
    assert_ne!(p.1, leader);
    assert_eq!(committed_values, vec!["a1", "c1"]);
    assert_eq!(
        offset,
        Offset::Offset(7),
        "the aborted transaction's offset is not committed"
    );
    nodes.assert_no_panic();
}
