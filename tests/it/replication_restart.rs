//! Issue 13: a partition leader killed with -9 and started again before
//! `broker.session.timeout.ms` fences it must not carry on as its earlier incarnation.
//! Found while writing the fault loop (`replication_faults.rs`): it re-registered
//! unfenced and kept leading at the same leader epoch, its ISR unchanged, its high
//! watermark at its log end offset (not checkpointed). A batch it had appended before
//! the kill and no follower had fetched was then below the high watermark, so the
//! idempotent producer's retry of it was answered as a duplicate, success, at once under
//! acks=all; killed again for longer than the session timeout, the leader was replaced by
//! a follower from the ISR that never had the batch: acknowledged, then lost. Now the
//! registration moves the leadership (`election::reregistration_changes`): the retry is
//! answered NOT_LEADER_OR_FOLLOWER and the producer goes to the new leader.
//!
//! Deterministic: both followers are paused (SIGSTOP) for about 1.3 s, under the session
//! and lag timeouts, long enough for the fetches they had parked at the leader to be
//! answered (500 ms), so none is at the leader when the batch is appended;
//! `replica.fetch.backoff.ms` is raised so they do not reach the restarted leader before
//! its second kill. Every process is killed at the end (`ThreeNodes`' drop).

use std::time::Duration;

use bytes::Bytes;

use crate::cluster_fixture::ThreeNodes;
use crate::harness::{poll_for, RawConn};
use crate::rdkafka_client::{idempotent_batch, init_producer_id, produce_raw_within};
use crate::replication::{create_rf3, describe};
use crate::replication_divergence::{read_values, sig};

/// One record `value` (no key) of producer `pid` (epoch 0) at sequence `seq`.
fn batch(pid: i64, seq: i32, value: &str) -> Bytes {
    idempotent_batch(pid, 0, seq, vec![(None, Bytes::from(value.to_string()))])
}

/// Produce `records` to partition 0 of topic `r`, acks=all: (error, base offset).
fn produce(conn: &mut RawConn, records: Bytes, timeout_ms: i32, corr: i32) -> (i16, i64) {
    produce_raw_within(conn, "r", records, timeout_ms, corr)
}

/// See the module doc: unless the retry is refused, the record is on the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_restarted_before_it_is_fenced_does_not_acknowledge_what_no_follower_has() {
    let mut nodes = ThreeNodes::start(&[
        "broker.session.timeout.ms=3000",
        "broker.heartbeat.interval.ms=300",
        "replica.fetch.backoff.ms=3000",
    ]);
    create_rf3(&nodes.bootstrap(1), "r", 1, &[]).await;
    let p = poll_for("3 in sync", 20, || {
        match describe(&nodes.bootstrap(1), "r")?.as_slice() {
            [p] if p.isr.len() == 3 && p.leader > 0 => Ok(p.clone()),
            other => Err(format!("{other:?}")),
        }
    });
    let leader = p.leader;
    let followers: Vec<i32> = (1..=3).filter(|id| *id != leader).collect();
    eprintln!("leader {leader}, followers {followers:?}");
    let mut conn = RawConn::connect(&nodes.bootstrap(leader));
    let pid = init_producer_id(&mut conn, 1);
    assert_eq!(
        produce(&mut conn, batch(pid, 0, "committed"), 10_000, 2),
        (0, 0)
    );
    // Followers paused: the next batch reaches the leader only.
    let fpids: Vec<u32> = followers.iter().map(|f| nodes.node(*f).pid()).collect();
    for f in &fpids {
        sig(*f, "STOP");
    }
    // Part of the fault, not a wait for a condition: past replica.fetch.wait.max.ms (500)
    // the fetches they had parked at the leader are answered (empty), and no new one
    // comes while they are stopped.
    std::thread::sleep(Duration::from_millis(800));
    let x = batch(pid, 1, "only-on-the-leader");
    let first = produce(&mut conn, x.clone(), 500, 3);
    eprintln!("first attempt: {first:?} (7 = REQUEST_TIMED_OUT: not acknowledged)");
    drop(conn);
    nodes.kill9(leader);
    for f in &fpids {
        sig(*f, "CONT");
    }
    nodes.restart(leader);
    eprintln!("{:?}", describe(&nodes.bootstrap(leader), "r"));
    let mut conn = RawConn::connect(&nodes.bootstrap(leader));
    let retry = produce(&mut conn, x, 500, 4);
    eprintln!("the producer's retry of the same batch: {retry:?} (0 = acknowledged)");
    drop(conn);
    let text = nodes.kill9(leader);
    eprintln!(
        "restarted leader's log:\n{}",
        text.lines()
            .filter(|l| !l.contains("openraft"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let after = poll_for("a new leader", 60, || {
        match describe(&nodes.bootstrap(followers[0]), "r")?.as_slice() {
            [p] if p.leader > 0 && p.leader != leader => Ok(p.clone()),
            other => Err(format!("{other:?}")),
        }
    });
    eprintln!("after: {after:?}");
    let new_leader = nodes.bootstrap(after.leader);
    let watermarks: rdkafka::consumer::BaseConsumer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", &new_leader)
        .create()
        .expect("consumer");
    let (_, high) = poll_for("the new leader's watermarks", 30, || {
        use rdkafka::consumer::Consumer;
        watermarks
            .fetch_watermarks("r", 0, Duration::from_secs(5))
            .map_err(|e| e.to_string())
    });
    let values = read_values(&new_leader, "r", high as usize);
    eprintln!("read from the new leader: {values:?}");
    if retry.0 == 0 {
        assert!(
            values.contains(&"only-on-the-leader".to_string()),
            "acknowledged (acks=all) and lost: {values:?}"
        );
    }
}
