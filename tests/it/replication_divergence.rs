//! Issue 13, test 4 and the idempotent producer across a failover: what a leader alone
//! had is truncated by leader epoch when it returns (KIP-101, KIP-279), and a retried
//! idempotent batch is recognised by the leader that replaced the one it was written to.
//!
//! Test 4 isolates a node by cutting it off the network (each node in a network
//! namespace of its own, `netns::TestNet`: it runs on, unreachable, as across a
//! partition) where namespaces can be made (root and `ip`; CI runs as root), else by
//! pausing it (SIGSTOP: it answers nothing and sends nothing, its connections stay open),
//! and says which. Every node is killed at the end (`ThreeNodes`' drop; SIGKILL ends a
//! stopped process too).

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;

use crate::cluster_fixture::{read_keyed, ThreeNodes};
use crate::harness::{decode, poll_for, RawConn};
use crate::rdkafka_client::{idempotent_batch, init_producer_id, produce_raw_within};
use crate::replication::{create_rf3, produce_range, Described};

/// Sends signal `s` (`STOP`, `CONT`) to `pid`.
pub(crate) fn sig(pid: u32, s: &str) {
    let status = Command::new("kill")
        .arg(format!("-{s}"))
        .arg(pid.to_string())
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{s} {pid}");
}

/// Partition 0 of `topic` as node `via` itself sees it (a raw Metadata v12 request to
/// that node: a client library may ask another broker, e.g. one just resumed whose
/// image is behind).
fn partition_seen_by(nodes: &ThreeNodes, via: i32, topic: &str) -> Result<Described, String> {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{MetadataRequest, MetadataResponse};
    use kafka_protocol::protocol::StrBytes;
    let mut conn = RawConn::connect(&nodes.bootstrap(via));
    let req = MetadataRequest::default()
        .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(
            kafka_protocol::messages::TopicName(StrBytes::from_string(topic.to_string())),
        ))]));
    let body = conn
        .request(&req, 12, 1)
        .ok_or_else(|| "no Metadata answer".to_string())?;
    let m: MetadataResponse = decode(body, 12);
    let p = m
        .topics
        .first()
        .and_then(|t| t.partitions.iter().find(|p| p.partition_index == 0))
        .ok_or_else(|| format!("no partition 0 in {:?}", m.topics))?;
    Ok(Described {
        leader: p.leader_id.0,
        replicas: p.replica_nodes.iter().map(|b| b.0).collect(),
        isr: p.isr_nodes.iter().map(|b| b.0).collect(),
    })
}

/// How test 4 isolates a node: see the module doc.
#[derive(Debug, Clone, Copy)]
enum Isolation {
    /// `ThreeNodes::cut` / `heal` (the nodes run in a `TestNet`).
    Cut,
    /// SIGSTOP / SIGCONT.
    Pause,
}

impl Isolation {
    /// Five nodes with `overrides`, in network namespaces where they can be made.
    fn start_five(overrides: &[&str]) -> (ThreeNodes, Isolation) {
        match crate::netns::TestNet::create(5) {
            Ok(net) => (ThreeNodes::start_on(net, 5, overrides), Isolation::Cut),
            Err(why) => {
                eprintln!("isolating by SIGSTOP: network namespaces cannot be made here: {why}");
                (ThreeNodes::start_n(5, overrides), Isolation::Pause)
            }
        }
    }

    fn isolate(self, nodes: &ThreeNodes, id: i32) {
        match self {
            Isolation::Cut => nodes.cut(id),
            Isolation::Pause => sig(nodes.node(id).pid(), "STOP"),
        }
    }

    fn rejoin(self, nodes: &ThreeNodes, id: i32) {
        match self {
            Isolation::Cut => nodes.heal(id),
            Isolation::Pause => sig(nodes.node(id).pid(), "CONT"),
        }
    }
}

/// Polls `topic`'s partition 0 as node `via` sees it until `want` holds.
pub(crate) fn wait_partition(
    nodes: &ThreeNodes,
    via: i32,
    topic: &str,
    what: &str,
    want: impl Fn(&Described) -> bool,
) -> Described {
    poll_for(what, 60, || {
        let p = partition_seen_by(nodes, via, topic)?;
        if want(&p) {
            Ok(p)
        } else {
            Err(format!("{p:?}"))
        }
    })
}

/// Issue 13, test 4. Five voters (the quorum outlives two paused or killed nodes), a
/// topic of replication factor 3 with `min.insync.replicas=2` on three of them: L leads,
/// F1 and F2 follow.
///
/// 1. 1,000 records with acks=all: acknowledged.
/// 2. F1 and F2 isolated (cut off, or paused); L alone takes 200 records with acks=1
///    (acknowledged by L only; never by acks=all). Then L is isolated too, and F1, F2
///    return — all within the session timeout, so the ISR never shrank to L.
/// 3. L is fenced; the controller elects F1 or F2 at a newer leader epoch; 500 records
///    with acks=all go to it: acknowledged.
/// 4. L returns: it is a follower now, asks the new leader for the end of its own last
///    epoch (OffsetForLeaderEpoch), truncates the 200 there, catches up and rejoins the
///    ISR.
/// 5. Proof that L's log is the new leader's: F1 and F2 are killed, L leads again, and a
///    consumer reads from L exactly the 1,500 acknowledged with acks=all — none of the
///    200 it alone had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_leader_truncates_what_it_alone_had_by_leader_epoch() {
    let (mut nodes, isolation) = Isolation::start_five(&[
        "broker.session.timeout.ms=6000",
        "broker.heartbeat.interval.ms=300",
        // An isolated follower's parked fetch is answered within this, so none is
        // waiting at the leader when step 2 appends.
        "replica.fetch.wait.max.ms=500",
    ]);
    create_rf3(
        &nodes.bootstrap(1),
        "diverge",
        1,
        &[("min.insync.replicas", "2")],
    )
    .await;
    let start = wait_partition(&nodes, 1, "diverge", "3 replicas in sync", |p| {
        p.leader > 0 && p.isr.len() == 3
    });
    let l = start.leader;
    let followers: Vec<i32> = start.replicas.iter().copied().filter(|r| *r != l).collect();
    let bystander = (1..=5).find(|id| !start.replicas.contains(id)).unwrap();
    eprintln!("leader {l}, followers {followers:?}, bystander {bystander}, {isolation:?}");

    // 1. Acknowledged by the whole ISR.
    let (acked_before, failed) =
        produce_range(&nodes.bootstrap(l), "diverge", 0..1000, ACKS_ALL).await;
    assert!(failed.is_empty(), "{failed:?}");

    // 2. The followers isolated; past replica.fetch.wait.max.ms their parked fetches are
    //    answered (empty) and no new one reaches L.
    for f in &followers {
        isolation.isolate(&nodes, *f);
    }
    std::thread::sleep(Duration::from_millis(900));
    let (only_on_l, failed) =
        produce_range(&nodes.bootstrap(l), "diverge", 1000..1200, ACKS_ONE).await;
    assert!(
        failed.is_empty() && only_on_l.len() == 200,
        "acks=1 on the leader alone: {failed:?}"
    );
    isolation.isolate(&nodes, l);
    for f in &followers {
        isolation.rejoin(&nodes, *f);
    }

    // 3. A new leader from the ISR, at a newer epoch; acks=all writes to it.
    let elected = wait_partition(&nodes, bystander, "diverge", "a leader other than L", |p| {
        p.leader > 0 && p.leader != l
    });
    eprintln!("while L is isolated: {elected:?}");
    assert!(followers.contains(&elected.leader), "{elected:?}");
    let (acked_after, failed) = produce_range(
        &nodes.bootstrap(elected.leader),
        "diverge",
        1200..1700,
        ACKS_ALL,
    )
    .await;
    assert!(failed.is_empty(), "{failed:?}");

    // 4. L returns and rejoins the ISR once its broker is active again (unfenced: listed
    //    in the bystander's Metadata; KIP-841 keeps a fenced broker out of the ISR).
    isolation.rejoin(&nodes, l);
    wait_partition(&nodes, bystander, "diverge", "L back in the ISR", |p| {
        p.leader == elected.leader && p.isr.contains(&l) && p.isr.len() == 3
    });
    nodes.wait_for_brokers(bystander, &[1, 2, 3, 4, 5], 30);

    // 5. Only L left of the replicas: it leads, and serves exactly what was acknowledged
    //    with acks=all.
    for f in &followers {
        nodes.kill9(*f);
    }
    wait_partition(&nodes, bystander, "diverge", "L leads again", |p| {
        p.leader == l
    });
    let acked: BTreeSet<usize> = acked_before.union(&acked_after).copied().collect();
    let read = read_keyed(&nodes.bootstrap(l), "diverge", 1, acked.len());
    let truncated = only_on_l
        .iter()
        .filter(|i| !read.seen.contains_key(i))
        .count();
    eprintln!("of the 200 L alone had, {truncated} are gone");
    read.assert_exactly(&acked);
    nodes.assert_no_panic();
}

/// acks=all, retried by librdkafka within its message timeout.
const ACKS_ALL: &[(&str, &str)] = &[("acks", "all")];

/// acks=1: the leader alone acknowledges.
const ACKS_ONE: &[(&str, &str)] = &[("acks", "1")];

/// Issue 13, "idempotent producers keep their guarantees across failover": producer
/// state is rebuilt on the new leader from the replicated log. An idempotent producer's
/// batches (raw Produce v9, acks=all) are acknowledged by the leader; it is killed with
/// -9; the same batch sent again to the new leader — a producer retrying one whose
/// answer it lost — is answered as the duplicate it is, with its original base offset,
/// and appended nowhere; the next sequence appends after it, and a gap in the sequence
/// gets OUT_OF_ORDER_SEQUENCE_NUMBER (45).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_retry_after_a_failover_is_recognised_by_the_new_leader() {
    let mut nodes = ThreeNodes::start(&[
        "broker.session.timeout.ms=1500",
        "broker.heartbeat.interval.ms=300",
    ]);
    create_rf3(&nodes.bootstrap(1), "idem", 1, &[]).await;
    let start = wait_partition(&nodes, 1, "idem", "3 replicas in sync", |p| {
        p.leader > 0 && p.isr.len() == 3
    });
    let old = start.leader;
    let mut conn = RawConn::connect(&nodes.bootstrap(old));
    let pid = init_producer_id(&mut conn, 1);
    let batch = |seq: i32, values: &[&str]| -> Bytes {
        idempotent_batch(
            pid,
            0,
            seq,
            values
                .iter()
                .map(|v| (None, Bytes::from(v.to_string())))
                .collect(),
        )
    };
    let first = batch(0, &["a", "b", "c"]);
    let second = batch(3, &["d"]);
    assert_eq!(
        produce_raw_within(&mut conn, "idem", first.clone(), 10_000, 2),
        (0, 0)
    );
    assert_eq!(
        produce_raw_within(&mut conn, "idem", second.clone(), 10_000, 3),
        (0, 3)
    );
    drop(conn);

    nodes.kill9(old);
    let survivor = (1..=3).find(|id| *id != old).unwrap();
    let now = wait_partition(&nodes, survivor, "idem", "a new leader", |p| {
        p.leader > 0 && p.leader != old
    });
    let mut conn = RawConn::connect(&nodes.bootstrap(now.leader));
    // Retries of both batches: duplicates, answered with where they were written.
    let retry_second = poll_for("the new leader answers the retry", 30, || {
        match produce_raw_within(&mut conn, "idem", second.clone(), 10_000, 4) {
            // NOT_LEADER_OR_FOLLOWER / LEADER_NOT_AVAILABLE while it takes over.
            (6 | 5, _) => Err("not leading yet".to_string()),
            other => Ok(other),
        }
    });
    assert_eq!(retry_second, (0, 3), "the retried last batch");
    assert_eq!(
        produce_raw_within(&mut conn, "idem", first, 10_000, 5),
        (0, 0),
        "the retried first batch"
    );
    // The next sequence goes on from the replicated state; a gap is refused.
    assert_eq!(
        produce_raw_within(&mut conn, "idem", batch(4, &["e"]), 10_000, 6),
        (0, 4)
    );
    assert_eq!(
        produce_raw_within(&mut conn, "idem", batch(6, &["gap"]), 10_000, 7).0,
        45,
        "OUT_OF_ORDER_SEQUENCE_NUMBER"
    );
    drop(conn);

    let values = read_values(&nodes.bootstrap(now.leader), "idem", 5);
    assert_eq!(values, ["a", "b", "c", "d", "e"]);
    nodes.assert_no_panic();
}

/// A follower away while retention removed the beginning of the leader's log: its
/// fetch from offset 0 is below the leader's log start (OFFSET_OUT_OF_RANGE), so it
/// restarts its log empty at the leader's log start offset and catches up from there
/// (Kafka's `truncateFullyAndStartAt`); before, it truncated by epoch again and again and
/// never rejoined the ISR (the leader adds a follower only once its log end offset
/// reached the high watermark, which it can only do by fetching from the log start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_the_leaders_log_start_restarts_there_and_rejoins() {
    let mut nodes = ThreeNodes::start(&[
        "broker.session.timeout.ms=1500",
        "broker.heartbeat.interval.ms=300",
        "log.retention.check.interval.ms=300",
    ]);
    create_rf3(
        &nodes.bootstrap(1),
        "trimmed",
        1,
        &[("segment.bytes", "2048"), ("retention.bytes", "4096")],
    )
    .await;
    let start = wait_partition(&nodes, 1, "trimmed", "3 replicas in sync", |p| {
        p.leader > 0 && p.isr.len() == 3
    });
    let leader = start.leader;
    let away = start
        .replicas
        .iter()
        .copied()
        .find(|r| *r != leader)
        .unwrap();
    nodes.kill9(away);
    wait_partition(
        &nodes,
        leader,
        "trimmed",
        "the ISR without the killed follower",
        |p| !p.isr.contains(&away),
    );
    // Small batches, so the 2 KiB segments roll and retention has whole segments to drop.
    let (acked, failed) = produce_range(
        &nodes.bootstrap(leader),
        "trimmed",
        0..2000,
        &[("acks", "all"), ("batch.size", "500")],
    )
    .await;
    assert!(failed.is_empty() && acked.len() == 2000, "{failed:?}");
    // Retention on the leader moves its log start past where the follower stopped.
    let watermarks: rdkafka::consumer::BaseConsumer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", nodes.bootstrap(leader))
        .create()
        .expect("consumer");
    let (low, high) = poll_for("retention on the leader", 30, || {
        use rdkafka::consumer::Consumer;
        match watermarks.fetch_watermarks("trimmed", 0, Duration::from_secs(5)) {
            Ok((low, high)) if low > 0 => Ok((low, high)),
            other => Err(format!("{other:?}")),
        }
    });
    drop(watermarks);
    eprintln!("leader {leader}: log start {low}, end {high}; follower {away} restarts");
    nodes.restart(away);
    wait_partition(
        &nodes,
        leader,
        "trimmed",
        "the follower back in the ISR",
        |p| p.isr.contains(&away) && p.isr.len() == 3,
    );
    // And the leader still serves everything from its log start on (retention may have
    // moved it further meanwhile): one contiguous run of records ending at `high`.
    let values = read_values(&nodes.bootstrap(leader), "trimmed", 1);
    let first = values
        .first()
        .and_then(|v| v.strip_prefix('r'))
        .and_then(|v| v.parse::<usize>().ok())
        .expect("records from the log start");
    assert!(
        first >= low as usize,
        "read from {first}, log start was {low}"
    );
    let expected: Vec<String> = (first..high as usize)
        .map(crate::cluster_fixture::keyed_value)
        .collect();
    assert!(
        values == expected,
        "{} read from {first}, want {}",
        values.len(),
        expected.len()
    );
    assert!(
        !nodes
            .node(away)
            .stderr_text()
            .contains("truncating by epoch again"),
        "the follower looped on epoch truncation"
    );
    nodes.assert_no_panic();
}

/// The values of `topic`-0 read from the beginning through `bootstrap` until `count` are
/// read (at most 30 s), then 1 s more to catch any extra. Errors right after a leader
/// change are polled past.
pub(crate) fn read_values(bootstrap: &str, topic: &str, count: usize) -> Vec<String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::Message;
    let consumer: BaseConsumer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "unused-no-commits")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, rdkafka::Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut extra: Option<std::time::Instant> = None;
    loop {
        let now = std::time::Instant::now();
        if out.len() >= count && extra.is_none() {
            extra = Some(now + Duration::from_secs(1));
        }
        if now > deadline || extra.is_some_and(|e| now > e) {
            break;
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                out.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).to_string())
            }
            Some(Err(e)) => eprintln!("consumer error (polled past): {e}"),
            None => {}
        }
    }
    out
}

/// Issue 13, elections: with `unclean.leader.election.enable` false (the default) a
/// partition whose only in-sync replica is dead stays offline though other replicas are
/// alive — they lack records acknowledged with acks=all — and once an admin client sets
/// it true on the topic (AlterConfigs, KIP-704's dynamic trigger), a live out-of-sync
/// replica is elected, accepting the loss Kafka documents for it.
///
/// Five voters (the quorum outlives three nodes down for a moment); a topic of
/// replication factor 3 with `min.insync.replicas=1`: L leads, F1 and F2 follow.
///
/// 1. 100 records with acks=all; F1 and F2 killed; the ISR shrinks to L, which alone
///    acknowledges 50 more with acks=all.
/// 2. L killed; F1 and F2 restarted over their data (they have the first 100).
/// 3. The partition has no leader and its ISR is still L, and stays so.
/// 4. AlterConfigs sets `unclean.leader.election.enable=true` on the topic: F1 or F2
///    leads, alone in the ISR, and serves exactly the first 100 (the 50 only L had are
///    what an unclean election loses); it takes new records.
/// 5. L restarted: it truncates the 50 by leader epoch and rejoins the ISR; with F1 and
///    F2 killed it leads and serves exactly what the unclean leader had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_without_a_live_in_sync_replica_stays_offline_until_unclean_election_is_enabled(
) {
    use rdkafka::admin::{AdminOptions, AlterConfig, ResourceSpecifier};
    const TOPIC: &str = "unclean";
    let mut nodes = ThreeNodes::start_n(
        5,
        &[
            "broker.session.timeout.ms=1500",
            "broker.heartbeat.interval.ms=300",
        ],
    );
    create_rf3(
        &nodes.bootstrap(1),
        TOPIC,
        1,
        &[("min.insync.replicas", "1")],
    )
    .await;
    let start = wait_partition(&nodes, 1, TOPIC, "3 replicas in sync", |p| {
        p.leader > 0 && p.isr.len() == 3
    });
    let l = start.leader;
    let followers: Vec<i32> = start.replicas.iter().copied().filter(|r| *r != l).collect();
    let bystander = (1..=5).find(|id| !start.replicas.contains(id)).unwrap();
    eprintln!("leader {l}, followers {followers:?}, bystander {bystander}");

    // 1. The whole ISR has 0..100; L alone 100..150, acknowledged with acks=all.
    let (in_sync, failed) = produce_range(&nodes.bootstrap(l), TOPIC, 0..100, ACKS_ALL).await;
    assert!(failed.is_empty() && in_sync.len() == 100, "{failed:?}");
    for f in &followers {
        nodes.kill9(*f);
    }
    wait_partition(&nodes, bystander, TOPIC, "an ISR of L alone", |p| {
        p.leader == l && p.isr == [l]
    });
    let (only_on_l, failed) = produce_range(&nodes.bootstrap(l), TOPIC, 100..150, ACKS_ALL).await;
    assert!(failed.is_empty() && only_on_l.len() == 50, "{failed:?}");

    // 2. and 3. L gone, the out-of-sync followers back: no leader, the ISR kept.
    nodes.kill9(l);
    for f in &followers {
        nodes.restart(*f);
    }
    let offline = |p: &Described| p.leader == -1 && p.isr == [l];
    wait_partition(&nodes, bystander, TOPIC, "the partition offline", offline);
    // Every broker but L active (the followers unfenced), so an election could take them.
    let live: Vec<i32> = (1..=5).filter(|b| *b != l).collect();
    nodes.wait_for_brokers(bystander, &live, 30);
    // Proving that nothing happens: the controller has run its elections by now.
    std::thread::sleep(Duration::from_secs(3));
    let still = partition_seen_by(&nodes, bystander, TOPIC).unwrap();
    assert!(offline(&still), "{still:?}");

    // 4. Unclean election enabled on the topic: a live replica outside the ISR leads.
    let alter = AlterConfig::new(ResourceSpecifier::Topic(TOPIC))
        .set("min.insync.replicas", "1")
        .set("unclean.leader.election.enable", "true");
    let r = crate::rdkafka_client::admin(&nodes.bootstrap(bystander))
        .alter_configs(&[alter], &AdminOptions::new())
        .await
        .expect("alter_configs");
    assert!(r[0].is_ok(), "{r:?}");
    let elected = wait_partition(&nodes, bystander, TOPIC, "an unclean leader", |p| {
        followers.contains(&p.leader)
    });
    // Elected alone in the ISR; the other follower may have caught up and joined by now.
    assert!(!elected.isr.contains(&l), "{elected:?}");
    let read = read_keyed(&nodes.bootstrap(elected.leader), TOPIC, 1, 100);
    read.assert_exactly(&in_sync);
    let (after, failed) =
        produce_range(&nodes.bootstrap(elected.leader), TOPIC, 150..160, ACKS_ALL).await;
    assert!(failed.is_empty() && after.len() == 10, "{failed:?}");

    // 5. L returns as a follower: its 50 are truncated, and it rejoins the ISR.
    nodes.restart(l);
    // Leadership may move on meanwhile (preferred-leader balancing): what matters is L
    // in the ISR under a leader that is not L.
    wait_partition(&nodes, bystander, TOPIC, "L back in the ISR", |p| {
        p.leader >= 0 && p.leader != l && p.isr.contains(&l)
    });
    // Proof that L's log is the new leader's: the other two killed, L leads (it is in
    // the ISR) and serves exactly what the unclean leader had.
    for f in &followers {
        nodes.kill9(*f);
    }
    wait_partition(&nodes, bystander, TOPIC, "L leads again", |p| p.leader == l);
    let want: BTreeSet<usize> = in_sync.union(&after).copied().collect();
    read_keyed(&nodes.bootstrap(l), TOPIC, 1, want.len()).assert_exactly(&want);
    nodes.assert_no_panic();
}
