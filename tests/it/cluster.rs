//! The controller quorum (issue 12): a data directory of the earlier single-node file
//! store is migrated into the Raft metadata log with its topics, records and committed
//! offsets; three `weir` processes form one quorum, a topic created through one node is
//! seen on another, the leader's kill -9 elects a new one, and the killed node catches up.

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};
use weir::broker::MetadataStore;

use crate::harness::TestBroker;
use crate::rdkafka_client::{create_topic, producer, read_partition};

fn group_consumer(bootstrap: &str, group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer")
}

fn committed(bootstrap: &str, group: &str, topic: &str, partitions: i32) -> Vec<Offset> {
    let consumer = group_consumer(bootstrap, group);
    let mut wanted = TopicPartitionList::new();
    for p in 0..partitions {
        wanted.add_partition(topic, p);
    }
    let got = consumer
        .committed_offsets(wanted, Duration::from_secs(20))
        .expect("committed offsets");
    (0..partitions)
        .map(|p| got.find_partition(topic, p).expect("partition").offset())
        .collect()
}

fn values(msgs: &[crate::rdkafka_client::Msg]) -> Vec<String> {
    msgs.iter()
        .map(|m| String::from_utf8(m.1.clone().unwrap_or_default()).unwrap())
        .collect()
}

/// Issue 12, test 7: a data dir made by the earlier code path (the file store) starts on
/// the metadata quorum with its topics, records and committed offsets, migrated once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_store_data_dir_is_migrated_with_records_and_committed_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let md = dir.path().join("__cluster_metadata");

    let old = TestBroker::start_on(dir.path(), &[], MetadataStore::EarlierFileStore);
    create_topic(&old.bootstrap, "kept", 2, &[("retention.ms", "123456789")]).await;
    let p = producer(&old.bootstrap, &[("acks", "all")]);
    for i in 0..100 {
        p.send(
            FutureRecord::to("kept")
                .key("k")
                .payload(&format!("r{i:03}"))
                .partition(i % 2),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    }
    drop(p);
    {
        let c = group_consumer(&old.bootstrap, "g");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("kept", 0, Offset::Offset(20))
            .unwrap();
        tpl.add_partition_offset("kept", 1, Offset::Offset(30))
            .unwrap();
        c.commit(&tpl, CommitMode::Sync).unwrap();
    }
    old.stop();
    assert!(md.join("topics/kept.toml").is_file(), "the earlier layout");
    assert!(!md.join("raft").exists(), "no metadata log yet");

    let new = TestBroker::start_in(dir.path(), &[]);
    for part in 0..2 {
        let got = read_partition(&new.bootstrap, "kept", part, Offset::Beginning, 50);
        let want: Vec<String> = (0..100)
            .filter(|i| i % 2 == part)
            .map(|i| format!("r{i:03}"))
            .collect();
        assert_eq!(values(&got), want, "partition {part}");
    }
    assert_eq!(
        committed(&new.bootstrap, "g", "kept", 2),
        [Offset::Offset(20), Offset::Offset(30)]
    );
    assert!(md.join("raft/log").is_file(), "the metadata log");
    let p = producer(&new.bootstrap, &[("acks", "all")]);
    let d = p
        .send(
            FutureRecord::to("kept")
                .key("k")
                .payload("next")
                .partition(0),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(d.offset, 50);
    drop(p);
    create_topic(&new.bootstrap, "after", 1, &[]).await;
    new.stop();

    // Migrated once: the next start replays the log, which has the topic made since.
    let again = TestBroker::start_in(dir.path(), &[]);
    let got = read_partition(&again.bootstrap, "kept", 0, Offset::Offset(50), 1);
    assert_eq!(values(&got), ["next"]);
    let got = read_partition(&again.bootstrap, "after", 0, Offset::Beginning, 0);
    assert!(got.is_empty());
    assert_eq!(
        committed(&again.bootstrap, "g", "kept", 2),
        [Offset::Offset(20), Offset::Offset(30)]
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let meta = loop {
        let c = group_consumer(&again.bootstrap, "m");
        let m = c
            .fetch_metadata(None, Duration::from_secs(10))
            .expect("metadata");
        let names: Vec<String> = m.topics().iter().map(|t| t.name().to_string()).collect();
        if names.contains(&"after".to_string()) || Instant::now() > deadline {
            break names;
        }
    };
    assert!(meta.contains(&"after".to_string()), "{meta:?}");
    assert!(meta.contains(&"kept".to_string()), "{meta:?}");
    again.stop();
}
