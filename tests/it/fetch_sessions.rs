//! Incremental fetch sessions (KIP-227, `src/fetch_session.rs`) with real clients and raw
//! frames. kafka-python uses sessions by default; librdkafka never does (it sends
//! `session_epoch` -1, "KIP-227: Not supported" in its INTRODUCTION.md), so its test
//! checks the sessionless path stays whole and opens no session. Broker-side proof of
//! sessions: `weir_fetch_sessions` and `weir_incremental_fetches_total` on `/metrics`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};

use crate::clients::script;
use crate::harness::{decode, wait_until, RawConn, TestBroker};
use crate::metrics::scrape;
use crate::rdkafka_client::{create_topic, producer};

const SESSIONS: &str = "weir_fetch_sessions";
const INCREMENTAL: &str = "weir_incremental_fetches_total";
const EVICTIONS: &str = "weir_fetch_session_evictions_total";

/// Produces `rounds` × `per_round` records to every partition of `topics`, record i of a
/// partition with value `i`, a round every 50 ms (so consumers read while it produces).
async fn produce_rounds(
    bootstrap: String,
    topics: Vec<String>,
    partitions: i32,
    rounds: usize,
    per_round: usize,
) {
    let p = producer(&bootstrap, &[("acks", "all")]);
    for round in 0..rounds {
        let mut sends = Vec::new();
        for t in &topics {
            for partition in 0..partitions {
                for j in 0..per_round {
                    let value = (round * per_round + j).to_string();
                    sends.push(
                        p.send(
                            FutureRecord::<(), _>::to(t)
                                .payload(&value)
                                .partition(partition),
                            Duration::from_secs(30),
                        )
                        .await,
                    );
                }
            }
        }
        for s in sends {
            s.expect("record produced");
        }
        // Paces the producer so the consumer reads while records still come; not a wait
        // for anything.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn topics_of(b: &TestBroker, prefix: &str, count: usize, partitions: i32) -> Vec<String> {
    let mut topics = Vec::new();
    for i in 0..count {
        let t = format!("{prefix}-{i}");
        create_topic(&b.bootstrap, &t, partitions, &[]).await;
        topics.push(t);
    }
    topics
}

/// Runs the kafka-python session consumer in a thread; its (success, output).
fn python_consumer(
    bootstrap: &str,
    topics: &[String],
    partitions: i32,
    expected: usize,
) -> std::thread::JoinHandle<(bool, String)> {
    let args = [
        "tests/compat/fetch_session_consumer.py".to_string(),
        bootstrap.to_string(),
        topics.join(","),
        partitions.to_string(),
        expected.to_string(),
    ];
    std::thread::spawn(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        script("python3", &args)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librdkafka_many_partitions_read_once_in_order_without_a_session() {
    let b = TestBroker::start();
    let topics = topics_of(&b, "lrk", 3, 8).await;
    let (rounds, per_round) = (10, 5);
    let expected = rounds * per_round;
    let writer = tokio::spawn(produce_rounds(
        b.bootstrap.clone(),
        topics.clone(),
        8,
        rounds,
        per_round,
    ));
    let bootstrap = b.bootstrap.clone();
    let consumed = topics.clone();
    let next = tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", "unused-no-commits")
            .set("enable.auto.commit", "false")
            .set("fetch.wait.max.ms", "200")
            .create()
            .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        for t in &consumed {
            for p in 0..8 {
                tpl.add_partition_offset(t, p, Offset::Beginning).unwrap();
            }
        }
        consumer.assign(&tpl).unwrap();
        let mut next: HashMap<(String, i32), usize> = HashMap::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while next.values().sum::<usize>() < 24 * expected && Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    let value: usize = std::str::from_utf8(m.payload().unwrap())
                        .unwrap()
                        .parse()
                        .unwrap();
                    let n = next
                        .entry((m.topic().to_string(), m.partition()))
                        .or_default();
                    assert_eq!(
                        (value, m.offset()),
                        (*n, *n as i64),
                        "{}-{}: out of order or twice",
                        m.topic(),
                        m.partition()
                    );
                    *n += 1;
                }
                Some(Err(e)) => panic!("consumer error: {e}"),
                None => {}
            }
        }
        next
    })
    .await
    .unwrap();
    writer.await.unwrap();
    assert_eq!(next.len(), 24);
    assert!(
        next.values().all(|&n| n == expected),
        "every record once: {next:?}"
    );
    // librdkafka sends session_epoch -1 (FINAL_EPOCH): the broker opened no session.
    let m = scrape(&b.admin_url);
    assert_eq!(m.get(SESSIONS, &[]), Some(0.0));
    assert_eq!(m.get(INCREMENTAL, &[]), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_python_reads_through_an_incremental_session() {
    let b = TestBroker::start();
    let topics = topics_of(&b, "kp", 3, 8).await;
    let (rounds, per_round) = (10, 5);
    let expected = rounds * per_round;
    let consumer = python_consumer(&b.bootstrap, &topics, 8, expected);
    // Its first (full) fetch of the empty partitions opens a session; then the records
    // come while it reads, through incremental fetches.
    wait_until("a fetch session is cached", 60, || {
        scrape(&b.admin_url).or_zero(SESSIONS, &[]) >= 1.0 || consumer.is_finished()
    });
    assert!(!consumer.is_finished(), "{:?}", consumer.join());
    produce_rounds(b.bootstrap.clone(), topics.clone(), 8, rounds, per_round).await;
    let (ok, text) = consumer.join().unwrap();
    assert!(
        ok && text.contains(&format!("kafka-python ok {}", 24 * expected)),
        "{text}"
    );
    let m = scrape(&b.admin_url);
    let incremental = m.or_zero(INCREMENTAL, &[]);
    assert!(
        incremental >= 10.0,
        "kafka-python sent {incremental} incremental fetches"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slot_two_consumers_both_read_everything() {
    let b = TestBroker::start_with(&["max.incremental.fetch.session.cache.slots=1"]);
    let a_topics = topics_of(&b, "slot-a", 1, 4).await;
    let b_topics = topics_of(&b, "slot-b", 1, 4).await;
    let (rounds, per_round) = (20, 2);
    let expected = rounds * per_round;
    let first = python_consumer(&b.bootstrap, &a_topics, 4, expected);
    let second = python_consumer(&b.bootstrap, &b_topics, 4, expected);
    let all: Vec<String> = a_topics.iter().chain(&b_topics).cloned().collect();
    // The first consumer to fetch takes the slot; the other gets session id 0.
    wait_until("a fetch session is cached", 60, || {
        scrape(&b.admin_url).or_zero(SESSIONS, &[]) >= 1.0
    });
    produce_rounds(b.bootstrap.clone(), all, 4, rounds, per_round).await;
    let mut most = 0.0f64;
    wait_until("both consumers finish", 90, || {
        most = most.max(scrape(&b.admin_url).or_zero(SESSIONS, &[]));
        first.is_finished() && second.is_finished()
    });
    for (name, c) in [("first", first), ("second", second)] {
        let (ok, text) = c.join().unwrap();
        assert!(
            ok && text.contains(&format!("kafka-python ok {}", 4 * expected)),
            "{name}: {text}"
        );
    }
    let m = scrape(&b.admin_url);
    assert!(most <= 1.0, "one slot, {most} sessions");
    assert_eq!(m.or_zero(SESSIONS, &[]), 1.0, "one of them holds the slot");
    assert!(m.or_zero(INCREMENTAL, &[]) >= 1.0);
    // Both sessions are younger than the eviction age: nobody was evicted.
    assert_eq!(m.or_zero(EVICTIONS, &[]), 0.0);
}

fn name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_string()))
}

fn partition(index: i32, offset: i64) -> FetchPartition {
    FetchPartition::default()
        .with_partition(index)
        .with_fetch_offset(offset)
        .with_partition_max_bytes(1 << 20)
}

/// A consumer's Fetch v12 (topics by name) with session fields.
fn session_fetch(session_id: i32, epoch: i32, topics: Vec<FetchTopic>) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(0)
        .with_max_bytes(1 << 20)
        .with_session_id(session_id)
        .with_session_epoch(epoch)
        .with_topics(topics)
}

fn send(conn: &mut RawConn, req: &FetchRequest, version: i16) -> FetchResponse {
    decode(
        conn.request(req, version, 1).expect("a fetch response"),
        version,
    )
}

/// (partition, number of record bytes) of every partition answered.
fn answered(r: &FetchResponse) -> Vec<(i32, usize)> {
    r.responses
        .iter()
        .flat_map(|t| t.partitions.iter())
        .map(|p| (p.partition_index, p.records.as_ref().map_or(0, |r| r.len())))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_wire_session_lifecycle_and_errors() {
    let b = TestBroker::start();
    create_topic(&b.bootstrap, "raw", 2, &[]).await;
    let p = producer(&b.bootstrap, &[]);
    p.send(
        FutureRecord::<(), _>::to("raw").payload("a").partition(0),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let mut c = RawConn::connect(&b.bootstrap);

    // Full, epoch 0: a session over both partitions, both answered.
    let both = vec![FetchTopic::default()
        .with_topic(name("raw"))
        .with_partitions(vec![partition(0, 0), partition(1, 0)])];
    let r = send(&mut c, &session_fetch(0, 0, both.clone()), 12);
    assert_eq!(r.error_code, 0);
    let id = r.session_id;
    assert_ne!(id, 0, "a new session");
    assert_eq!(answered(&r).len(), 2);
    assert!(answered(&r)[0].1 > 0, "p0's record");
    assert_eq!(scrape(&b.admin_url).get(SESSIONS, &[]), Some(1.0));

    // Incremental, epoch 1: p0 moved past its record; nothing changed, nothing answered.
    let p0_moved = vec![FetchTopic::default()
        .with_topic(name("raw"))
        .with_partitions(vec![partition(0, 1)])];
    let r = send(&mut c, &session_fetch(id, 1, p0_moved), 12);
    assert_eq!((r.error_code, r.session_id), (0, id));
    assert_eq!(answered(&r), vec![]);

    // A record on p1, which the request does not name: the session reads it.
    p.send(
        FutureRecord::<(), _>::to("raw").payload("b").partition(1),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let r = send(&mut c, &session_fetch(id, 2, vec![]), 12);
    assert_eq!((r.error_code, r.session_id), (0, id));
    let got = answered(&r);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, 1);
    assert!(got[0].1 > 0);

    // Forget p1: it is no longer read (its fetch offset 0 would return the record).
    let mut forget = session_fetch(id, 3, vec![]);
    forget.forgotten_topics_data = vec![ForgottenTopic::default()
        .with_topic(name("raw"))
        .with_partitions(vec![1])];
    let r = send(&mut c, &forget, 12);
    assert_eq!((r.error_code, answered(&r)), (0, vec![]));

    // Wrong epoch: 71, no partitions, session id 0; the session is kept.
    let r = send(&mut c, &session_fetch(id, 9, vec![]), 12);
    assert_eq!((r.error_code, r.session_id), (71, 0));
    assert!(r.responses.is_empty());
    // Unknown session id: 70.
    let unknown = if id == i32::MAX { 1 } else { id + 1 };
    let r = send(&mut c, &session_fetch(unknown, 1, vec![]), 12);
    assert_eq!((r.error_code, r.session_id), (70, 0));
    assert!(r.responses.is_empty());
    // Topic ids (v13) in a session opened by name: 106.
    let r = send(&mut c, &session_fetch(id, 4, vec![]), 13);
    assert_eq!((r.error_code, r.session_id), (106, 0));
    // The right epoch still works after the errors.
    let r = send(&mut c, &session_fetch(id, 4, vec![]), 12);
    assert_eq!((r.error_code, r.session_id), (0, id));

    // FINAL_EPOCH closes it: a full answer with session id 0; the id is gone.
    let r = send(&mut c, &session_fetch(id, -1, both), 12);
    assert_eq!((r.error_code, r.session_id), (0, 0));
    assert_eq!(answered(&r).len(), 2);
    let r = send(&mut c, &session_fetch(id, 5, vec![]), 12);
    assert_eq!(r.error_code, 70);
    assert_eq!(scrape(&b.admin_url).get(SESSIONS, &[]), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_incremental_fetch_updates_the_session_once() {
    let b = TestBroker::start();
    create_topic(&b.bootstrap, "parked", 1, &[]).await;
    let mut c = RawConn::connect(&b.bootstrap);
    let one = vec![FetchTopic::default()
        .with_topic(name("parked"))
        .with_partitions(vec![partition(0, 0)])];
    let r = send(&mut c, &session_fetch(0, 0, one), 12);
    let id = r.session_id;
    assert_ne!(id, 0);
    // An incremental fetch that parks (min_bytes 1, nothing to read) until a produce.
    let bs = b.bootstrap.clone();
    let writer = tokio::spawn(async move {
        // Gives the fetch time to park first; were it not parked yet it would find the
        // record at once and the test would still hold.
        tokio::time::sleep(Duration::from_millis(300)).await;
        producer(&bs, &[])
            .send(
                FutureRecord::<(), _>::to("parked")
                    .payload("x")
                    .partition(0),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    });
    let parked = session_fetch(id, 1, vec![])
        .with_min_bytes(1)
        .with_max_wait_ms(20_000);
    let (r, mut c) = tokio::task::spawn_blocking(move || (send(&mut c, &parked, 12), c))
        .await
        .unwrap();
    writer.await.unwrap();
    assert_eq!((r.error_code, r.session_id), (0, id));
    let got = answered(&r);
    assert!(got.len() == 1 && got[0].1 > 0, "{got:?}");
    // Answered once: the next epoch is 2, and epoch 1 again is refused.
    let r = send(&mut c, &session_fetch(id, 1, vec![]), 12);
    assert_eq!(r.error_code, 71);
    let r = send(&mut c, &session_fetch(id, 2, vec![]), 12);
    assert_eq!((r.error_code, r.session_id), (0, id));
}
