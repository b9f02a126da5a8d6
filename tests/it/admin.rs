//! Topic administration through librdkafka's AdminClient: CreateTopics validation (names,
//! `.`/`_` collisions, duplicates, configs), DeleteTopics removing data, CreatePartitions
//! growing (never shrinking), DescribeConfigs with sources, auto-creation settings.

use std::time::Duration;

use rdkafka::admin::{
    AdminOptions, ConfigSource, NewPartitions, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::FutureRecord;

use crate::harness::TestBroker;
use crate::rdkafka_client::{admin, create_topic, producer};

async fn create_err(bootstrap: &str, t: NewTopic<'_>) -> Option<RDKafkaErrorCode> {
    let r = admin(bootstrap)
        .create_topics(&[t], &AdminOptions::new())
        .await
        .unwrap();
    r.into_iter().next().unwrap().err().map(|(_, code)| code)
}

fn partitions(bootstrap: &str, topic: &str) -> usize {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    md.topics()[0].partitions().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_topics_validates_like_kafka() {
    let b = TestBroker::start();
    let bs = &b.bootstrap;
    assert_eq!(
        create_err(bs, NewTopic::new("a.b", 2, TopicReplication::Fixed(1))).await,
        None
    );
    assert_eq!(
        create_err(bs, NewTopic::new("a.b", 2, TopicReplication::Fixed(1))).await,
        Some(RDKafkaErrorCode::TopicAlreadyExists)
    );
    assert_eq!(
        create_err(bs, NewTopic::new("a_b", 2, TopicReplication::Fixed(1))).await,
        Some(RDKafkaErrorCode::InvalidTopic),
        "a.b and a_b cannot both exist"
    );
    assert_eq!(
        create_err(bs, NewTopic::new("bad/name", 1, TopicReplication::Fixed(1))).await,
        Some(RDKafkaErrorCode::InvalidTopic)
    );
    assert_eq!(
        create_err(
            bs,
            NewTopic::new(&"x".repeat(250), 1, TopicReplication::Fixed(1))
        )
        .await,
        Some(RDKafkaErrorCode::InvalidTopic)
    );
    assert_eq!(
        create_err(
            bs,
            NewTopic::new(&"x".repeat(249), 1, TopicReplication::Fixed(1))
        )
        .await,
        None
    );
    assert_eq!(
        create_err(bs, NewTopic::new("zero", 0, TopicReplication::Fixed(1))).await,
        Some(RDKafkaErrorCode::InvalidPartitions)
    );
    assert_eq!(
        create_err(bs, NewTopic::new("rf3", 1, TopicReplication::Fixed(3))).await,
        Some(RDKafkaErrorCode::InvalidReplicationFactor)
    );
    assert_eq!(
        create_err(
            bs,
            NewTopic::new("cfg", 1, TopicReplication::Fixed(1)).set("no.such.config", "1")
        )
        .await,
        Some(RDKafkaErrorCode::InvalidConfig)
    );
    assert_eq!(
        create_err(
            bs,
            NewTopic::new("cfg", 1, TopicReplication::Fixed(1)).set("retention.ms", "soon")
        )
        .await,
        Some(RDKafkaErrorCode::InvalidConfig)
    );
    assert_eq!(
        create_err(
            bs,
            NewTopic::new("cfg", 1, TopicReplication::Fixed(1)).set("cleanup.policy", "shred")
        )
        .await,
        Some(RDKafkaErrorCode::InvalidConfig)
    );
    assert_eq!(partitions(bs, "a.b"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_configs_reports_values_and_sources() {
    let b = TestBroker::start_with(&["log.retention.bytes=5000000"]);
    create_topic(
        &b.bootstrap,
        "described",
        1,
        &[("retention.ms", "60000"), ("cleanup.policy", "compact")],
    )
    .await;
    let res = admin(&b.bootstrap)
        .describe_configs(
            &[
                ResourceSpecifier::Topic("described"),
                ResourceSpecifier::Broker(1),
            ],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    let topic = res[0].as_ref().unwrap();
    let get = |name: &str| topic.get(name).unwrap_or_else(|| panic!("{name} missing"));
    assert_eq!(get("retention.ms").value.as_deref(), Some("60000"));
    assert_eq!(get("retention.ms").source, ConfigSource::DynamicTopic);
    assert_eq!(get("cleanup.policy").value.as_deref(), Some("compact"));
    assert_eq!(get("retention.bytes").value.as_deref(), Some("5000000"));
    assert_eq!(get("retention.bytes").source, ConfigSource::StaticBroker);
    assert_eq!(get("segment.bytes").value.as_deref(), Some("1073741824"));
    assert_eq!(get("segment.bytes").source, ConfigSource::Default);
    assert_eq!(get("max.message.bytes").value.as_deref(), Some("1048588"));
    let broker = res[1].as_ref().unwrap();
    assert_eq!(
        broker.get("log.retention.bytes").unwrap().value.as_deref(),
        Some("5000000")
    );
    assert_eq!(
        broker.get("num.partitions").unwrap().value.as_deref(),
        Some("1")
    );
    // An unknown topic: UNKNOWN_TOPIC_OR_PARTITION.
    let res = admin(&b.bootstrap)
        .describe_configs(&[ResourceSpecifier::Topic("nope")], &AdminOptions::new())
        .await
        .unwrap();
    // (rdkafka 0.39 drops the per-resource error code; no entries is what it shows of it.)
    assert!(res[0].as_ref().map_or(true, |r| r.entries.is_empty()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_topics_removes_data_and_create_partitions_only_grows() {
    let b = TestBroker::start();
    let bs = &b.bootstrap;
    create_topic(bs, "grow", 2, &[]).await;
    let a = admin(bs);
    let r = a
        .create_partitions(&[NewPartitions::new("grow", 5)], &AdminOptions::new())
        .await
        .unwrap();
    assert!(r[0].is_ok(), "{r:?}");
    assert_eq!(partitions(bs, "grow"), 5);
    let r = a
        .create_partitions(&[NewPartitions::new("grow", 3)], &AdminOptions::new())
        .await
        .unwrap();
    assert_eq!(
        r[0].as_ref().unwrap_err().1,
        RDKafkaErrorCode::InvalidPartitions
    );
    let r = a
        .create_partitions(&[NewPartitions::new("nope", 3)], &AdminOptions::new())
        .await
        .unwrap();
    assert_eq!(
        r[0].as_ref().unwrap_err().1,
        RDKafkaErrorCode::UnknownTopicOrPartition
    );
    // The new partitions take records.
    let p = producer(bs, &[]);
    let d = p
        .send(
            FutureRecord::to("grow").key("k").payload("v").partition(4),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(d.offset, 0);
    assert!(b.data_dir.join("grow-4").is_dir());

    let r = a
        .delete_topics(&["grow"], &AdminOptions::new())
        .await
        .unwrap();
    assert!(r[0].is_ok());
    for i in 0..5 {
        assert!(
            !b.data_dir.join(format!("grow-{i}")).exists(),
            "grow-{i} still on disk"
        );
    }
    let r = a
        .delete_topics(&["grow"], &AdminOptions::new())
        .await
        .unwrap();
    assert_eq!(
        r[0].as_ref().unwrap_err().1,
        RDKafkaErrorCode::UnknownTopicOrPartition
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_and_auto_creation_can_be_turned_off() {
    let b = TestBroker::start_with(&[
        "delete.topic.enable=false",
        "auto.create.topics.enable=false",
    ]);
    create_topic(&b.bootstrap, "stays", 1, &[]).await;
    let r = admin(&b.bootstrap)
        .delete_topics(&["stays"], &AdminOptions::new())
        .await
        .unwrap();
    assert_eq!(
        r[0].as_ref().unwrap_err().1,
        RDKafkaErrorCode::TopicDeletionDisabled
    );
    let p = producer(&b.bootstrap, &[("message.timeout.ms", "2000")]);
    let e = p
        .send(
            FutureRecord::to("never-made").key("k").payload("v"),
            Duration::from_secs(10),
        )
        .await
        .unwrap_err();
    let msg = format!("{:?}", e.0);
    assert!(
        msg.contains("UnknownTopic") || msg.contains("MessageTimedOut"),
        "{msg}"
    );
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &b.bootstrap)
        .create()
        .unwrap();
    let md = c.fetch_metadata(None, Duration::from_secs(10)).unwrap();
    assert!(md.topics().iter().all(|t| t.name() != "never-made"));
}
