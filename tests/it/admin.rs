//! Topic administration through librdkafka's AdminClient: CreateTopics validation (names,
//! `.`/`_` collisions, duplicates, configs), DeleteTopics removing data (also while
//! producers write), CreatePartitions growing (never shrinking), DescribeConfigs with
//! sources, auto-creation settings, AlterConfigs (rdkafka) and IncrementalAlterConfigs
//! (raw requests) changing topic configs of live partitions, compacted topics refusing
//! keyless records.

use std::collections::BTreeMap;
use std::time::Duration;

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{
    alter_configs_request, incremental_alter_configs_request, AlterConfigsRequest,
    AlterConfigsResponse, ApiKey, ApiVersionsRequest, ApiVersionsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::{
    AdminOptions, AlterConfig, ConfigSource, NewPartitions, NewTopic, ResourceSpecifier,
    TopicReplication,
};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::FutureRecord;

use crate::harness::{decode, RawConn, TestBroker};
use crate::rdkafka_client::{admin, create_topic, producer};

/// (name, partitions, replication factor, config, expected error).
type CreateCase<'a> = (
    &'a str,
    i32,
    i32,
    Option<(&'a str, &'a str)>,
    Option<RDKafkaErrorCode>,
);

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
    let long_ok = "x".repeat(249);
    let too_long = "x".repeat(250);
    use RDKafkaErrorCode::*;
    // (name, partitions, replication factor, config, expected error), in order.
    let cases: Vec<CreateCase> = vec![
        ("a.b", 2, 1, None, None),
        ("a.b", 2, 1, None, Some(TopicAlreadyExists)),
        ("a_b", 2, 1, None, Some(InvalidTopic)), // a.b and a_b cannot both exist
        ("bad/name", 1, 1, None, Some(InvalidTopic)),
        (&too_long, 1, 1, None, Some(InvalidTopic)),
        (&long_ok, 1, 1, None, None),
        ("zero", 0, 1, None, Some(InvalidPartitions)),
        ("rf3", 1, 3, None, Some(InvalidReplicationFactor)),
        (
            "cfg",
            1,
            1,
            Some(("no.such.config", "1")),
            Some(InvalidConfig),
        ),
        (
            "cfg",
            1,
            1,
            Some(("retention.ms", "soon")),
            Some(InvalidConfig),
        ),
        (
            "cfg",
            1,
            1,
            Some(("cleanup.policy", "shred")),
            Some(InvalidConfig),
        ),
    ];
    for (name, partitions, rf, config, expected) in cases {
        let mut t = NewTopic::new(name, partitions, TopicReplication::Fixed(rf));
        if let Some((k, v)) = config {
            t = t.set(k, v);
        }
        assert_eq!(create_err(bs, t).await, expected, "{name:.20} {config:?}");
    }
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
    // Issue 15: an assignment naming a broker that does not exist (this single broker is
    // node 1) is INVALID_REPLICA_ASSIGNMENT (39), and the topic keeps its partitions.
    let r = a
        .create_partitions(
            &[NewPartitions::new("grow", 6).assign(&[&[9]])],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    assert_eq!(
        r[0].as_ref().unwrap_err().1,
        RDKafkaErrorCode::InvalidReplicaAssignment
    );
    assert_eq!(partitions(bs, "grow"), 5);
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

/// The topic's overrides (entries with source DynamicTopic), as DescribeConfigs shows them.
async fn overrides(bootstrap: &str, topic: &str) -> BTreeMap<String, String> {
    let res = admin(bootstrap)
        .describe_configs(&[ResourceSpecifier::Topic(topic)], &AdminOptions::new())
        .await
        .unwrap();
    res[0]
        .as_ref()
        .unwrap()
        .entries
        .iter()
        .filter(|e| e.source == ConfigSource::DynamicTopic)
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// AlterConfigs through rdkafka. rdkafka 0.39 reports every resource as a success (it
/// drops the per-resource error of `rd_kafka_AlterConfigs_result_resources`), so refusals
/// are tested with raw requests ([`raw_alter`]).
async fn alter(bootstrap: &str, topic: &str, configs: &[(&str, &str)], validate_only: bool) {
    let mut a = AlterConfig::new(ResourceSpecifier::Topic(topic));
    for (k, v) in configs {
        a = a.set(k, v);
    }
    let r = admin(bootstrap)
        .alter_configs(&[a], &AdminOptions::new().validate_only(validate_only))
        .await
        .unwrap();
    assert!(r[0].is_ok(), "{r:?}");
}

/// AlterConfigs v`version` for one resource as a raw request; its error code and message.
fn raw_alter(
    conn: &mut RawConn,
    version: i16,
    resource_type: i8,
    name: &str,
    configs: &[(&str, &str)],
) -> (i16, String) {
    let req = AlterConfigsRequest::default().with_resources(vec![
        alter_configs_request::AlterConfigsResource::default()
            .with_resource_type(resource_type)
            .with_resource_name(StrBytes::from_string(name.to_string()))
            .with_configs(
                configs
                    .iter()
                    .map(|(k, v)| {
                        alter_configs_request::AlterableConfig::default()
                            .with_name(StrBytes::from_string(k.to_string()))
                            .with_value(Some(StrBytes::from_string(v.to_string())))
                    })
                    .collect(),
            ),
    ]);
    let resp: AlterConfigsResponse = decode(conn.request(&req, version, 9).unwrap(), version);
    let r = &resp.responses[0];
    assert_eq!(r.resource_name.as_str(), name);
    (
        r.error_code,
        r.error_message
            .as_ref()
            .map(|m| m.to_string())
            .unwrap_or_default(),
    )
}

async fn send(
    bootstrap: &str,
    topic: &str,
    key: Option<&str>,
    value_bytes: usize,
) -> Result<i64, RDKafkaErrorCode> {
    let p = producer(bootstrap, &[("message.timeout.ms", "10000")]);
    let value = vec![b'v'; value_bytes];
    let mut record = FutureRecord::to(topic).payload(&value).partition(0);
    if let Some(k) = key {
        record = record.key(k);
    }
    p.send(record, Duration::from_secs(15))
        .await
        .map(|d| d.offset)
        .map_err(|(e, _)| e.rdkafka_error_code().expect("a Kafka error code"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alter_configs_replaces_overrides_live_and_durably() {
    let dir = tempfile::tempdir().unwrap();
    let b = TestBroker::start_in(dir.path(), &[]);
    let bs = b.bootstrap.clone();
    create_topic(&bs, "altered", 1, &[("segment.bytes", "1000000")]).await;
    assert_eq!(send(&bs, "altered", Some("k"), 3000).await, Ok(0));

    alter(
        &bs,
        "altered",
        &[("retention.ms", "60000"), ("max.message.bytes", "2000")],
        false,
    )
    .await;
    // Non-incremental: segment.bytes, not listed, went back to the default.
    let want = map(&[("max.message.bytes", "2000"), ("retention.ms", "60000")]);
    assert_eq!(overrides(&bs, "altered").await, want);
    let res = admin(&bs)
        .describe_configs(&[ResourceSpecifier::Topic("altered")], &AdminOptions::new())
        .await
        .unwrap();
    let segment = res[0].as_ref().unwrap().get("segment.bytes").unwrap();
    assert_eq!(segment.value.as_deref(), Some("1073741824"));
    assert_eq!(segment.source, ConfigSource::Default);

    // The live partition follows the new max.message.bytes at once.
    assert_eq!(
        send(&bs, "altered", Some("k"), 3000).await,
        Err(RDKafkaErrorCode::MessageSizeTooLarge)
    );
    assert_eq!(send(&bs, "altered", Some("k"), 100).await, Ok(1));

    // validate_only changes nothing; refused changes change nothing.
    alter(&bs, "altered", &[("retention.ms", "1")], true).await;
    let mut c = RawConn::connect(&bs);
    for v in 0..=2 {
        let bad = [
            ("no.such.config", "1"),
            ("retention.ms", "soon"),
            ("cleanup.policy", "shred"),
        ];
        for kv in bad {
            assert_eq!(
                raw_alter(&mut c, v, 2, "altered", &[kv]).0,
                40,
                "v{v} {kv:?}"
            );
        }
        assert_eq!(
            raw_alter(&mut c, v, 2, "nope", &[("retention.ms", "1")]).0,
            3
        );
        let (code, message) = raw_alter(&mut c, v, 4, "1", &[("num.partitions", "3")]);
        assert_eq!(code, 42, "num.partitions is a read-only broker config");
        assert!(
            message.contains("Cannot update these configs dynamically"),
            "{message}"
        );
    }
    assert_eq!(overrides(&bs, "altered").await, want);

    // The change is durable: a restarted broker keeps and applies it.
    b.stop();
    let b = TestBroker::start_in(dir.path(), &[]);
    let bs = b.bootstrap.clone();
    assert_eq!(overrides(&bs, "altered").await, want);
    assert_eq!(
        send(&bs, "altered", Some("k"), 3000).await,
        Err(RDKafkaErrorCode::MessageSizeTooLarge)
    );
    assert_eq!(send(&bs, "altered", Some("k"), 100).await, Ok(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_topics_refuse_keyless_records() {
    let b = TestBroker::start();
    let bs = b.bootstrap.clone();
    create_topic(&bs, "compacted", 1, &[("cleanup.policy", "compact")]).await;
    assert_eq!(send(&bs, "compacted", Some("k"), 10).await, Ok(0));
    assert_eq!(
        send(&bs, "compacted", None, 10).await,
        Err(RDKafkaErrorCode::InvalidRecord)
    );
    // Back to `delete` at run time: keyless records are accepted again.
    alter(&bs, "compacted", &[("cleanup.policy", "delete")], false).await;
    assert_eq!(send(&bs, "compacted", None, 10).await, Ok(1));
    // And `delete,compact` requires keys again.
    alter(
        &bs,
        "compacted",
        &[("cleanup.policy", "delete,compact")],
        false,
    )
    .await;
    assert_eq!(
        send(&bs, "compacted", None, 10).await,
        Err(RDKafkaErrorCode::InvalidRecord)
    );
}

/// One IncrementalAlterConfigs entry: key, operation (0 SET, 1 DELETE, 2 APPEND,
/// 3 SUBTRACT), value.
type Change<'a> = (&'a str, i8, Option<&'a str>);

/// Sends IncrementalAlterConfigs for one resource; returns its error code and message.
fn incremental(
    conn: &mut RawConn,
    version: i16,
    resource_type: i8,
    name: &str,
    changes: &[Change<'_>],
    validate_only: bool,
) -> (i16, String) {
    let configs = changes
        .iter()
        .map(|(k, op, v)| {
            incremental_alter_configs_request::AlterableConfig::default()
                .with_name(StrBytes::from_string(k.to_string()))
                .with_config_operation(*op)
                .with_value(v.map(|v| StrBytes::from_string(v.to_string())))
        })
        .collect();
    let req = IncrementalAlterConfigsRequest::default()
        .with_validate_only(validate_only)
        .with_resources(vec![
            incremental_alter_configs_request::AlterConfigsResource::default()
                .with_resource_type(resource_type)
                .with_resource_name(StrBytes::from_string(name.to_string()))
                .with_configs(configs),
        ]);
    let resp: IncrementalAlterConfigsResponse =
        decode(conn.request(&req, version, 5).expect("a response"), version);
    let r = &resp.responses[0];
    assert_eq!(r.resource_name.as_str(), name);
    (
        r.error_code,
        r.error_message
            .as_ref()
            .map(|m| m.to_string())
            .unwrap_or_default(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incremental_alter_configs_set_delete_append_subtract() {
    const SET: i8 = 0;
    const DELETE: i8 = 1;
    const APPEND: i8 = 2;
    const SUBTRACT: i8 = 3;
    let b = TestBroker::start();
    let bs = b.bootstrap.clone();
    create_topic(&bs, "inc", 1, &[("segment.bytes", "1000000")]).await;
    let mut c = RawConn::connect(&bs);

    // Advertised at exactly the implemented ranges.
    let versions: ApiVersionsResponse =
        decode(c.request(&ApiVersionsRequest::default(), 3, 1).unwrap(), 3);
    let range = |key: ApiKey| {
        versions
            .api_keys
            .iter()
            .find(|a: &&ApiVersion| a.api_key == key as i16)
            .map(|a| (a.min_version, a.max_version))
    };
    assert_eq!(range(ApiKey::AlterConfigs), Some((0, 2)));
    assert_eq!(range(ApiKey::IncrementalAlterConfigs), Some((0, 1)));

    let ok = (0, String::new());
    let changes = [
        ("retention.ms", SET, Some("1000")),
        ("cleanup.policy", SET, Some("delete")),
    ];
    assert_eq!(incremental(&mut c, 1, 2, "inc", &changes, false), ok);
    assert_eq!(
        overrides(&bs, "inc").await,
        map(&[
            ("cleanup.policy", "delete"),
            ("retention.ms", "1000"),
            ("segment.bytes", "1000000"),
        ]),
        "keys not named stay (incremental)"
    );
    let append = [("cleanup.policy", APPEND, Some("compact"))];
    assert_eq!(incremental(&mut c, 0, 2, "inc", &append, false), ok);
    assert_eq!(incremental(&mut c, 1, 2, "inc", &append, false), ok);
    assert_eq!(
        overrides(&bs, "inc").await["cleanup.policy"],
        "delete,compact",
        "APPEND adds a value once"
    );
    let subtract = [("cleanup.policy", SUBTRACT, Some("delete"))];
    assert_eq!(incremental(&mut c, 1, 2, "inc", &subtract, false), ok);
    assert_eq!(overrides(&bs, "inc").await["cleanup.policy"], "compact");
    let delete = [
        ("retention.ms", DELETE, None),
        ("cleanup.policy", DELETE, None),
    ];
    assert_eq!(incremental(&mut c, 1, 2, "inc", &delete, false), ok);
    assert_eq!(
        overrides(&bs, "inc").await,
        map(&[("segment.bytes", "1000000")])
    );
    // APPEND to a key without an override starts from the broker's value (delete).
    assert_eq!(incremental(&mut c, 1, 2, "inc", &append, false), ok);
    assert_eq!(
        overrides(&bs, "inc").await["cleanup.policy"],
        "delete,compact"
    );
    let before = overrides(&bs, "inc").await;

    // validate_only changes nothing.
    let set = [("retention.ms", SET, Some("5"))];
    assert_eq!(incremental(&mut c, 1, 2, "inc", &set, true), ok);
    assert_eq!(overrides(&bs, "inc").await, before);

    // Refusals, each leaving the topic as it was.
    let code = |r: (i16, String)| r.0;
    let mut c2 = RawConn::connect(&bs);
    let c = &mut c2;
    assert_eq!(
        code(incremental(
            c,
            1,
            2,
            "inc",
            &[("retention.ms", APPEND, Some("1"))],
            false
        )),
        40,
        "APPEND on a non-list key"
    );
    assert_eq!(
        code(incremental(
            c,
            1,
            2,
            "inc",
            &[("no.such.config", SET, Some("1"))],
            false
        )),
        40
    );
    assert_eq!(
        code(incremental(
            c,
            1,
            2,
            "inc",
            &[("retention.ms", SET, Some("soon"))],
            false
        )),
        40
    );
    assert_eq!(
        code(incremental(
            c,
            1,
            2,
            "inc",
            &[("cleanup.policy", SET, Some("shred"))],
            false
        )),
        40
    );
    // (A SUBTRACT leaving cleanup.policy empty is accepted, as in Kafka 4.1:
    // dynamic_configs::subtract_may_leave_cleanup_policy_empty.)
    assert_eq!(
        code(incremental(
            c,
            1,
            2,
            "inc",
            &[("retention.ms", 9, Some("1"))],
            false
        )),
        42,
        "unknown operation"
    );
    assert_eq!(
        code(incremental(
            c,
            1,
            2,
            "inc",
            &[("retention.ms", SET, None)],
            false
        )),
        42,
        "null value"
    );
    assert_eq!(
        code(incremental(
            c,
            1,
            2,
            "inc",
            &[
                ("retention.ms", SET, Some("1")),
                ("retention.ms", DELETE, None)
            ],
            false
        )),
        42,
        "a key named twice"
    );
    assert_eq!(code(incremental(c, 1, 2, "nope", &set, false)), 3);
    let (code_broker, message) =
        incremental(c, 1, 4, "1", &[("num.partitions", SET, Some("3"))], false);
    assert_eq!(code_broker, 42);
    assert!(
        message.contains("Cannot update these configs dynamically"),
        "{message}"
    );
    assert_eq!(overrides(&bs, "inc").await, before);
}

/// Each partition's leader, replicas, ISR and leader epoch as a raw Metadata v12 answers
/// them, with the topic id: `(id, [(index, leader, epoch, replicas, isr)])`.
type PartitionStates = Vec<(i32, i32, i32, Vec<i32>, Vec<i32>)>;

fn raw_partition_states(bootstrap: &str, topic: &str) -> (uuid::Uuid, PartitionStates) {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{MetadataRequest, MetadataResponse, TopicName};
    let mut c = RawConn::connect(bootstrap);
    let req = MetadataRequest::default()
        .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(
            TopicName(StrBytes::from_string(topic.to_string())),
        ))]))
        .with_allow_auto_topic_creation(false);
    let r: MetadataResponse = decode(c.request(&req, 12, 1).unwrap(), 12);
    let t = &r.topics[0];
    assert_eq!(t.error_code, 0, "{topic}");
    let ids = |v: &[kafka_protocol::messages::BrokerId]| v.iter().map(|b| b.0).collect();
    let mut states: PartitionStates = t
        .partitions
        .iter()
        .map(|p| {
            (
                p.partition_index,
                p.leader_id.0,
                p.leader_epoch,
                ids(&p.replica_nodes),
                ids(&p.isr_nodes),
            )
        })
        .collect();
    states.sort();
    (t.topic_id, states)
}

/// librdkafka's view of one partition: (index, leader, replicas, ISR).
type RdkafkaPartition = (i32, i32, Vec<i32>, Vec<i32>);

/// librdkafka's view of a topic's partitions, or `None` when the broker does not list the
/// topic.
fn rdkafka_partition_states(bootstrap: &str, topic: &str) -> Option<Vec<RdkafkaPartition>> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("allow.auto.create.topics", "false")
        .create()
        .unwrap();
    let md = c.fetch_metadata(None, Duration::from_secs(10)).unwrap();
    let t = md.topics().iter().find(|t| t.name() == topic)?;
    let mut out: Vec<_> = t
        .partitions()
        .iter()
        .map(|p| (p.id(), p.leader(), p.replicas().to_vec(), p.isr().to_vec()))
        .collect();
    out.sort();
    Some(out)
}

/// Topic lifecycle through the metadata image: create, add partitions, alter configs and
/// delete with rdkafka's AdminClient behave as before, Metadata reports every partition's
/// leader, replicas, ISR and leader epoch from the image (this node, epoch 0), and all of
/// it — ids included — is the same after a restart over the same data directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_lifecycle_and_partition_state_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let b = TestBroker::start_in(dir.path(), &["node.id=7"]);
    let bs = b.bootstrap.clone();
    create_topic(&bs, "img", 2, &[("retention.ms", "600000")]).await;
    create_topic(&bs, "gone", 1, &[]).await;
    let a = admin(&bs);
    let r = a
        .create_partitions(&[NewPartitions::new("img", 3)], &AdminOptions::new())
        .await
        .unwrap();
    assert!(r[0].is_ok(), "{r:?}");
    // AlterConfigs replaces the overrides: retention.ms goes, segment.bytes comes.
    let r = a
        .alter_configs(
            &[AlterConfig::new(ResourceSpecifier::Topic("img")).set("segment.bytes", "1000000")],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    assert!(r[0].is_ok(), "{r:?}");
    let r = a
        .delete_topics(&["gone"], &AdminOptions::new())
        .await
        .unwrap();
    assert!(r[0].is_ok(), "{r:?}");

    let expected: PartitionStates = (0..3).map(|i| (i, 7, 0, vec![7], vec![7])).collect();
    let (id, states) = raw_partition_states(&bs, "img");
    assert_eq!(states, expected);
    let rd: Vec<_> = (0..3).map(|i| (i, 7, vec![7], vec![7])).collect();
    assert_eq!(rdkafka_partition_states(&bs, "img"), Some(rd.clone()));
    assert_eq!(rdkafka_partition_states(&bs, "gone"), None);
    drop(a);
    b.stop();

    let b = TestBroker::start_in(dir.path(), &["node.id=7"]);
    let bs = b.bootstrap.clone();
    assert_eq!(raw_partition_states(&bs, "img"), (id, expected));
    assert_eq!(rdkafka_partition_states(&bs, "img"), Some(rd));
    assert_eq!(rdkafka_partition_states(&bs, "gone"), None);
    assert!(!dir.path().join("gone-0").exists());
    let res = admin(&bs)
        .describe_configs(&[ResourceSpecifier::Topic("img")], &AdminOptions::new())
        .await
        .unwrap();
    let configs = res[0].as_ref().unwrap();
    let segment = configs.get("segment.bytes").unwrap();
    assert_eq!(
        (segment.value.as_deref(), &segment.source),
        (Some("1000000"), &ConfigSource::DynamicTopic)
    );
    assert_ne!(
        configs.get("retention.ms").unwrap().source,
        ConfigSource::DynamicTopic
    );
    // The partition added before the restart takes records.
    let d = producer(&bs, &[])
        .send(
            FutureRecord::to("img").key("k").payload("v").partition(2),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(d.offset, 0);
    // The name of the deleted topic is free again, for a new topic with a new id.
    create_topic(&bs, "gone", 2, &[]).await;
    let (new_id, states) = raw_partition_states(&bs, "gone");
    assert_eq!(states.len(), 2);
    assert_ne!(new_id, uuid::Uuid::nil());
}

/// Issue 16: a `partitioner` naming a missing file is refused when set (CreateTopics,
/// AlterConfigs, IncrementalAlterConfigs: INVALID_CONFIG naming the key and the path), not
/// accepted to fail every produce later; other keys of such a topic can still change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioner_naming_a_missing_file_is_refused_when_set() {
    let tmp = tempfile::tempdir().unwrap();
    let present = tmp.path().join("p.wasm");
    std::fs::write(&present, b"\0asm").unwrap();
    let present = present.to_str().unwrap().to_string();
    let missing = tmp.path().join("missing.wasm");
    let missing = missing.to_str().unwrap().to_string();
    let b = TestBroker::start();
    let bs = b.bootstrap.clone();

    let t = NewTopic::new("routed", 1, TopicReplication::Fixed(1)).set("partitioner", &missing);
    assert_eq!(
        create_err(&bs, t).await,
        Some(RDKafkaErrorCode::InvalidConfig)
    );
    let t = NewTopic::new("routed", 1, TopicReplication::Fixed(1))
        .set("partitioner.config", "no-equals-sign");
    assert_eq!(
        create_err(&bs, t).await,
        Some(RDKafkaErrorCode::InvalidConfig)
    );
    let t = NewTopic::new("routed", 1, TopicReplication::Fixed(1)).set("partitioner", &present);
    assert_eq!(create_err(&bs, t).await, None);
    assert_eq!(
        overrides(&bs, "routed").await,
        map(&[("partitioner", &present)])
    );

    let mut c = RawConn::connect(&bs);
    let (code, message) = raw_alter(&mut c, 1, 2, "routed", &[("partitioner", &missing)]);
    assert_eq!(code, 40, "{message}");
    assert!(
        message.contains("configuration partitioner") && message.contains(&missing),
        "{message}"
    );
    let (code, message) = incremental(
        &mut c,
        1,
        2,
        "routed",
        &[("partitioner", 0, Some(missing.as_str()))],
        false,
    );
    assert_eq!(code, 40, "{message}");
    assert!(
        message.contains("configuration partitioner") && message.contains(&missing),
        "{message}"
    );
    assert_eq!(
        overrides(&bs, "routed").await,
        map(&[("partitioner", &present)])
    );

    // The component goes away: a change to another key keeps the (unchanged) partitioner.
    std::fs::remove_file(&present).unwrap();
    let (code, message) = incremental(
        &mut c,
        1,
        2,
        "routed",
        &[("retention.ms", 0, Some("60000"))],
        false,
    );
    assert_eq!(code, 0, "{message}");
    assert_eq!(
        overrides(&bs, "routed").await,
        map(&[("partitioner", &present), ("retention.ms", "60000")])
    );
    b.stop();
}

/// Issue 15: a topic deleted five times while producers keep writing to it (auto-create
/// on, small segments so the old log rolls while it is deleted). Every DeleteTopics
/// answers NONE or UNKNOWN_TOPIC_OR_PARTITION (never UNKNOWN: "Directory not empty"), the
/// broker logs no panic, the topic re-created by the last writes holds every record
/// acknowledged after the last delete (sent after it: they can only be in the new
/// topic), in order and once, with each segment's `.log`, `.index` and `.timeindex`; after
/// a restart it reloads the same records and no `-delete` directory is left. A produce or
/// a (parked) fetch caught by a delete gets a Kafka error a client acts on (3, 6; 1 for
/// a fetch past the re-created log's end), never UNKNOWN_SERVER_ERROR or a storage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_deleted_under_load_is_recreated_clean() {
    use crate::harness::{wait_until, BinaryBroker};
    use crate::rdkafka_client::{high_watermark, read_partition};
    use rdkafka::Offset;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    const TOPIC: &str = "churn";
    const WRITERS: usize = 3;
    const DELETES: usize = 5;
    let dir = tempfile::tempdir().unwrap();
    let overrides = ["log.segment.bytes=2000", "log.index.interval.bytes=100"];
    let b = BinaryBroker::spawn(dir.path(), 0, &overrides);
    let p = producer(
        &b.bootstrap,
        &[
            ("linger.ms", "0"),
            ("acks", "all"),
            ("enable.idempotence", "false"),
            ("max.in.flight.requests.per.connection", "1"),
            ("topic.metadata.refresh.interval.ms", "500"),
        ],
    );
    // (deletes done when it was sent, writer, sequence, offset) of every acknowledged record.
    let acked = Arc::new(Mutex::new(Vec::<(usize, usize, usize, i64)>::new()));
    let deletes_done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (p, acked, deletes_done, stop) =
            (p.clone(), acked.clone(), deletes_done.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut seq = 0;
            while !stop.load(Ordering::SeqCst) {
                let phase = deletes_done.load(Ordering::SeqCst);
                let value = format!("{w}:{seq}");
                let r = FutureRecord::to(TOPIC)
                    .key("k")
                    .payload(&value)
                    .partition(0);
                match p.send(r, Duration::from_secs(10)).await {
                    Ok(d) => acked.lock().unwrap().push((phase, w, seq, d.offset)),
                    Err((e, _)) => assert!(
                        !matches!(
                            e.rdkafka_error_code(),
                            Some(RDKafkaErrorCode::Unknown | RDKafkaErrorCode::KafkaStorageError)
                        ),
                        "produce failed: {e:?}"
                    ),
                }
                seq += 1;
            }
        }));
    }
    // A consumer's Fetch at the high watermark (parked up to 100 ms) over and over:
    // error code -> count (i16::MIN: the partition missing from the response).
    let fetch_codes = Arc::new(Mutex::new(BTreeMap::<i16, usize>::new()));
    let fetcher = {
        use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
        use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, TopicName};
        let (bootstrap, codes, stop) = (b.bootstrap.clone(), fetch_codes.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut c = RawConn::connect(&bootstrap);
            let (mut offset, mut correlation_id) = (0, 0);
            while !stop.load(Ordering::SeqCst) {
                correlation_id += 1;
                let req = FetchRequest::default()
                    .with_max_wait_ms(100)
                    .with_min_bytes(1)
                    .with_max_bytes(1 << 20)
                    .with_replica_id(BrokerId(-1))
                    .with_topics(vec![FetchTopic::default()
                        .with_topic(TopicName(StrBytes::from_static_str(TOPIC)))
                        .with_partitions(vec![FetchPartition::default()
                            .with_partition(0)
                            .with_fetch_offset(offset)
                            .with_partition_max_bytes(1 << 16)])]);
                let resp: FetchResponse = decode(
                    c.request(&req, 11, correlation_id).expect("a Fetch answer"),
                    11,
                );
                let part = resp.responses.first().and_then(|t| t.partitions.first());
                let code = part.map_or(i16::MIN, |p| p.error_code);
                *codes.lock().unwrap().entry(code).or_default() += 1;
                offset = part
                    .filter(|p| p.error_code == 0)
                    .map_or(0, |p| p.high_watermark);
            }
        })
    };
    let a = admin(&b.bootstrap);
    let acked_count = || acked.lock().unwrap().len();
    for d in 1..=DELETES {
        let before = acked_count();
        wait_until("records acknowledged before a delete", 20, || {
            acked_count() >= before + 30
        });
        let r = a
            .delete_topics(&[TOPIC], &AdminOptions::new())
            .await
            .unwrap();
        match &r[0] {
            Ok(_) => {}
            Err((_, code)) => assert_eq!(
                *code,
                RDKafkaErrorCode::UnknownTopicOrPartition,
                "delete {d}: {r:?}"
            ),
        }
        deletes_done.store(d, Ordering::SeqCst);
    }
    let after_last = || {
        acked
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.0 == DELETES)
            .count()
    };
    wait_until("records acknowledged after the last delete", 20, || {
        after_last() >= 100
    });
    stop.store(true, Ordering::SeqCst);
    for w in writers {
        w.await.unwrap();
    }
    fetcher.join().unwrap();
    let codes = fetch_codes.lock().unwrap().clone();
    assert!(codes.get(&0).is_some_and(|n| *n > 0), "{codes:?}");
    assert!(codes.keys().all(|c| [0, 1, 3, 6].contains(c)), "{codes:?}");
    let expected: Vec<(usize, usize, i64)> = {
        let mut v: Vec<_> = acked
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.0 == DELETES)
            .map(|r| (r.1, r.2, r.3))
            .collect();
        v.sort_by_key(|r| r.2);
        v
    };
    let check = |bootstrap: &str| {
        let hw = high_watermark(bootstrap, TOPIC, 0);
        let got = read_partition(bootstrap, TOPIC, 0, Offset::Beginning, hw as usize);
        assert_eq!(
            got.len() as i64,
            hw,
            "every record up to the high watermark"
        );
        let mut seen = std::collections::HashMap::new();
        for (i, m) in got.iter().enumerate() {
            assert_eq!(m.2, i as i64, "offsets contiguous from 0");
            let value = String::from_utf8(m.1.clone().unwrap()).unwrap();
            assert!(seen.insert(value.clone(), m.2).is_none(), "{value} twice");
        }
        let mut last_seq = [None; WRITERS];
        for (w, seq, offset) in &expected {
            assert_eq!(
                seen.get(&format!("{w}:{seq}")),
                Some(offset),
                "acknowledged {w}:{seq} at {offset}"
            );
            assert!(last_seq[*w] < Some(*seq), "writer {w} in order");
            last_seq[*w] = Some(*seq);
        }
    };
    check(&b.bootstrap);
    let topic_dir = dir.path().join(format!("{TOPIC}-0"));
    let files: std::collections::BTreeSet<String> = std::fs::read_dir(&topic_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(files.contains("partition.metadata"), "{files:?}");
    let logs: Vec<&String> = files.iter().filter(|f| f.ends_with(".log")).collect();
    assert!(logs.len() > 1, "the new topic rolled: {files:?}");
    for log in logs {
        let stem = log.trim_end_matches(".log");
        for ext in ["index", "timeindex"] {
            assert!(
                files.contains(&format!("{stem}.{ext}")),
                "{stem}.{ext}: {files:?}"
            );
        }
    }
    drop((a, p));
    let log = b.terminate();
    for bad in ["panicked", "Directory not empty", "not fully applied"] {
        assert!(!log.contains(bad), "broker log has {bad:?}:\n{log}");
    }

    let b = BinaryBroker::spawn(dir.path(), 0, &overrides);
    check(&b.bootstrap);
    let deleting = || {
        std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy().ends_with("-delete")
            })
            .count()
    };
    wait_until("no -delete directory is left", 10, || deleting() == 0);
    let log = b.terminate();
    assert!(!log.contains("panicked"), "{log}");
}
