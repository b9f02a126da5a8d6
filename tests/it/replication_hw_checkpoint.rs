//! Issue 13, "consumers never see past the high watermark": a partition leader killed
//! with -9 and restarted over its data started its high watermark at its log end
//! offset, so records it had appended but never committed (acks=1 records no follower
//! copied) were served to consumers, then truncated when leadership moved: a dirty read.
//! Now it starts from the `replication-offset-checkpoint` of its log dir (Kafka's
//! high watermark checkpoint, `replica.high.watermark.checkpoint.interval.ms`).
//!
//! Both followers are paused (SIGSTOP), which also leaves the three-voter controller
//! quorum without a majority: nothing in the metadata changes until they resume, so the
//! restarted leader leads from its own image, as in the tester's repro (on its earlier
//! client port: the metadata still names it). Every process is killed at the end (`ThreeNodes`' drop; SIGKILL ends a stopped process too).

use std::time::Duration;

use crate::cluster_fixture::{keyed_value, read_keyed, ThreeNodes};
use crate::harness::{decode, poll_for, RawConn};
use crate::replication::{create_rf3, produce_range};
use crate::replication_divergence::{sig, wait_partition};

/// Checkpoint interval for this test (ms): small, so the checkpoint holding the
/// committed records is on disk well before the kill.
const CHECKPOINT_INTERVAL_MS: u64 = 200;

/// Topic RF 3, 10 records committed with acks=all; both followers paused; 50 records
/// acks=1 to the leader alone; the leader killed with -9 and restarted over its data: its
/// high watermark (librdkafka's ListOffsets) is 10 and a consumer's Fetch from it gets
/// exactly the 10 committed records, never the 50. Resumed, the followers take the leadership
/// (the restarted leader's registration moves it) and serve the 10, then at most a prefix
/// of the 50 (those a follower copied from the restarted leader before the move).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_leader_serves_only_what_was_committed() {
    let interval =
        format!("replica.high.watermark.checkpoint.interval.ms={CHECKPOINT_INTERVAL_MS}");
    let mut nodes = ThreeNodes::start(&[
        // A paused follower's parked fetch is answered within this, so none is waiting
        // at the leader when the acks=1 records are appended.
        "replica.fetch.wait.max.ms=500",
        &interval,
    ]);
    create_rf3(&nodes.bootstrap(1), "hwcp", 1, &[]).await;
    let start = wait_partition(&nodes, 1, "hwcp", "3 replicas in sync", |p| {
        p.leader > 0 && p.isr.len() == 3
    });
    let l = start.leader;
    let followers: Vec<i32> = start.replicas.iter().copied().filter(|r| *r != l).collect();
    eprintln!("leader {l}, followers {followers:?}");

    let (committed, failed) =
        produce_range(&nodes.bootstrap(l), "hwcp", 0..10, &[("acks", "all")]).await;
    assert!(failed.is_empty() && committed.len() == 10, "{failed:?}");
    let committed_values: Vec<String> = committed.iter().map(|i| keyed_value(*i)).collect();
    // The leader's checkpoint holds the committed high watermark before anything else.
    let checkpoint = nodes.log_dir(l).join("replication-offset-checkpoint");
    poll_for("the leader's high watermark checkpoint at 10", 30, || {
        let text = std::fs::read_to_string(&checkpoint).map_err(|e| e.to_string())?;
        if text.lines().any(|line| line == "hwcp 0 10") {
            Ok(())
        } else {
            Err(text)
        }
    });

    for f in &followers {
        sig(nodes.node(*f).pid(), "STOP");
    }
    std::thread::sleep(Duration::from_millis(900));
    let (uncommitted, failed) =
        produce_range(&nodes.bootstrap(l), "hwcp", 10..60, &[("acks", "1")]).await;
    assert!(
        failed.is_empty() && uncommitted.len() == 50,
        "acks=1 on the leader alone: {failed:?}"
    );

    // Restarted on its earlier client port: with two of three voters paused the quorum
    // cannot register the new endpoint, and clients go where the metadata says.
    let address = nodes.bootstrap(l);
    let controller_port = nodes.controller_port(l);
    nodes.kill9(l);
    nodes.restart_with(
        l,
        &[format!(
            "listeners=PLAINTEXT://{address},CONTROLLER://127.0.0.1:{controller_port}"
        )],
    );
    // Without a quorum its start-up waits out the registration's and the group
    // coordinator's commit timeouts (15 s each) before it serves clients.
    poll_for("the restarted leader serving as leader", 120, || {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let consumer: BaseConsumer = rdkafka::config::ClientConfig::new()
            .set("bootstrap.servers", nodes.bootstrap(l))
            .create()
            .map_err(|e| e.to_string())?;
        let metadata = consumer
            .fetch_metadata(Some("hwcp"), Duration::from_secs(5))
            .map_err(|e| e.to_string())?;
        let leaders: Vec<i32> = metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions().iter().map(|p| p.leader()))
            .collect();
        if leaders == [l] {
            Ok(())
        } else {
            Err(format!("leaders {leaders:?}"))
        }
    });
    let high_watermark = poll_for("ListOffsets from the restarted leader", 30, || {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let consumer: BaseConsumer = rdkafka::config::ClientConfig::new()
            .set("bootstrap.servers", nodes.bootstrap(l))
            .create()
            .map_err(|e| e.to_string())?;
        consumer
            .fetch_watermarks("hwcp", 0, Duration::from_secs(5))
            .map(|(_, high)| high)
            .map_err(|e| e.to_string())
    });
    assert_eq!(high_watermark, 10, "the restarted leader's high watermark");
    let (read, fetched_high_watermark) = consumer_fetch(&nodes.bootstrap(l));
    assert_eq!(
        fetched_high_watermark, 10,
        "the Fetch response's high watermark"
    );
    assert_eq!(read, committed_values, "read from the restarted leader");

    // The followers return; the restarted leader's registration moves the leadership to
    // one of them. Until that commits, a follower may still fetch from the restarted
    // leader, copy some of the 50 and so commit them (with the whole ISR holding them,
    // Kafka allows it); the rest the old leader truncates. Either way a reader sees the
    // 10, then at most a prefix of the 50, each once.
    for f in &followers {
        sig(nodes.node(*f).pid(), "CONT");
    }
    let moved = wait_partition(&nodes, followers[0], "hwcp", "a follower leads", |p| {
        followers.contains(&p.leader)
    });
    let read = read_keyed(&nodes.bootstrap(moved.leader), "hwcp", 1, committed.len());
    read.assert_acked_and_maybe(&committed, &(10..60));
    nodes.assert_no_panic();
}

/// The values of `hwcp`-0 a consumer's Fetch (raw, v11, replica id -1, from offset 0)
/// gets from `bootstrap`, with the high watermark the response carries. Raw because
/// librdkafka's consumer assigns partitions only with a `group.id`, and with one it read
/// nothing here: the restarted leader, without a controller quorum, has no group
/// coordinator (it cannot create `__consumer_offsets`).
fn consumer_fetch(bootstrap: &str) -> (Vec<String>, i64) {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, TopicName};
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::records::RecordBatchDecoder;
    let mut conn = RawConn::connect(bootstrap);
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_static_str("hwcp")))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(0)
                .with_partition_max_bytes(1 << 20)])]);
    let response: FetchResponse = decode(conn.request(&req, 11, 1).expect("a Fetch answer"), 11);
    let partition = &response.responses[0].partitions[0];
    assert_eq!(partition.error_code, 0, "Fetch error");
    let mut values = Vec::new();
    if let Some(mut bytes) = partition.records.clone() {
        for set in RecordBatchDecoder::decode_all(&mut bytes).expect("record batches") {
            for r in set.records {
                values.push(String::from_utf8_lossy(&r.value.unwrap_or_default()).to_string());
            }
        }
    }
    (values, partition.high_watermark)
}
