//! Configs as Kafka has them, with real clients: every Kafka 4.1 topic key at CreateTopics,
//! AlterConfigs and IncrementalAlterConfigs; invalid values refused with INVALID_CONFIG;
//! SUBTRACT emptying `cleanup.policy`; dynamic broker configs (KIP-226) set with
//! confluent-kafka's AdminClient and `weir config alter`, applied to topics without an
//! override (retention deletes sooner, a bigger produce fails with MESSAGE_TOO_LARGE),
//! reported with their sources and kept across a restart; DescribeConfigs documentation
//! and synonyms (raw v4).

use std::collections::BTreeMap;
use std::process::Command;

use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::{
    alter_configs_request, incremental_alter_configs_request, AlterConfigsRequest,
    AlterConfigsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::cluster_fixture::ThreeNodes;
use crate::cluster_placement::create_raw;
use crate::harness::{decode, poll_for, repo_root, weir_bin, RawConn, TestBroker};

/// Runs `tests/compat/dynamic_configs.py` for `phase`; panics with its output unless it
/// printed `PHASE ok`.
fn python_phase(bootstrap: &str, phase: &str) {
    let out = Command::new("timeout")
        .args(["180", "python3", "tests/compat/dynamic_configs.py"])
        .args([bootstrap, phase, "1"])
        .current_dir(repo_root())
        .output()
        .expect("spawn python3");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains(&format!("{phase} ok")),
        "{phase}: {text}"
    );
}

/// `weir config ARGS -b BOOTSTRAP`: (success, stdout, stderr).
fn weir_config(bootstrap: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(weir_bin())
        .arg("config")
        .args(args)
        .args(["-b", bootstrap])
        .output()
        .expect("spawn weir");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// IncrementalAlterConfigs v1 on broker resource `name` (SET each pair): error code and
/// message.
fn raw_incremental(c: &mut RawConn, name: &str, set: &[(&str, &str)], id: i32) -> (i16, String) {
    let configs = set
        .iter()
        .map(|(k, v)| {
            incremental_alter_configs_request::AlterableConfig::default()
                .with_name(StrBytes::from_string(k.to_string()))
                .with_config_operation(0)
                .with_value(Some(StrBytes::from_string(v.to_string())))
        })
        .collect();
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
        incremental_alter_configs_request::AlterConfigsResource::default()
            .with_resource_type(4)
            .with_resource_name(StrBytes::from_string(name.to_string()))
            .with_configs(configs),
    ]);
    let r: IncrementalAlterConfigsResponse = decode(c.request(&req, 1, id).unwrap(), 1);
    let r = &r.responses[0];
    let message = r.error_message.as_ref().map(|m| m.to_string());
    (r.error_code, message.unwrap_or_default())
}

/// AlterConfigs v1 replacing the dynamic configs of broker resource `name`: error code.
fn raw_alter(c: &mut RawConn, name: &str, set: &[(&str, &str)], id: i32) -> i16 {
    let configs = set
        .iter()
        .map(|(k, v)| {
            alter_configs_request::AlterableConfig::default()
                .with_name(StrBytes::from_string(k.to_string()))
                .with_value(Some(StrBytes::from_string(v.to_string())))
        })
        .collect();
    let req = AlterConfigsRequest::default().with_resources(vec![
        alter_configs_request::AlterConfigsResource::default()
            .with_resource_type(4)
            .with_resource_name(StrBytes::from_string(name.to_string()))
            .with_configs(configs),
    ]);
    let r: AlterConfigsResponse = decode(c.request(&req, 1, id).unwrap(), 1);
    r.responses[0].error_code
}

#[test]
fn topic_keys_and_dynamic_broker_configs_with_real_clients_and_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let overrides = ["log.retention.check.interval.ms=300"];
    let b = TestBroker::start_in(dir.path(), &overrides);
    python_phase(&b.bootstrap, "topics");

    // kafka-configs.sh habits: --entity-default / --entity-name N. librdkafka refuses an
    // empty broker resource name locally, so the cluster default is set by the CLI.
    let (ok, stdout, stderr) = weir_config(
        &b.bootstrap,
        &[
            "alter",
            "--broker-default",
            "--add-config",
            "log.retention.ms=1000",
        ],
    );
    assert!(ok && stdout.contains("Completed"), "{stdout}{stderr}");
    python_phase(&b.bootstrap, "broker");

    // The default resource with raw requests: a per-broker key is refused there;
    // AlterConfigs replaces its whole set.
    let mut c = RawConn::connect(&b.bootstrap);
    let (code, message) = raw_incremental(&mut c, "", &[("listeners", "PLAINTEXT://:1")], 1);
    assert_eq!(code, 42, "{message}");
    assert!(message.contains("broker id must be specified"), "{message}");
    let replaced = [("log.retention.ms", "1000"), ("log.cleaner.threads", "2")];
    assert_eq!(raw_alter(&mut c, "", &replaced, 2), 0);
    assert_eq!(
        raw_alter(&mut c, "7", &replaced, 3),
        42,
        "another broker's id"
    );

    let (ok, stdout, stderr) = weir_config(
        &b.bootstrap,
        &[
            "alter",
            "--broker-default",
            "--add-config",
            "log.segment.bytes=2000000",
        ],
    );
    assert!(ok, "{stdout}{stderr}");
    let (ok, stdout, _) = weir_config(&b.bootstrap, &["describe", "--broker-default"]);
    assert!(ok, "{stdout}");
    assert_eq!(
        stdout,
        "log.cleaner.threads=2\nlog.retention.ms=1000\nlog.segment.bytes=2000000\n"
    );
    let (ok, stdout, stderr) = weir_config(
        &b.bootstrap,
        &["alter", "--broker", "1", "--add-config", "num.partitions=3"],
    );
    assert!(!ok, "a read-only key is refused: {stdout}");
    assert!(
        stderr.contains("INVALID_REQUEST (42)")
            && stderr.contains("Cannot update these configs dynamically: Set(num.partitions)"),
        "{stderr}"
    );
    let (ok, stdout, _) = weir_config(&b.bootstrap, &["describe", "--broker", "1", "--all"]);
    assert!(
        ok && stdout.contains("message.max.bytes=2000\tDYNAMIC_BROKER_CONFIG")
            && stdout.contains("log.segment.bytes=2000000\tDYNAMIC_DEFAULT_BROKER_CONFIG")
            && stdout.contains("num.partitions=1\tDEFAULT_CONFIG"),
        "{stdout}"
    );

    b.stop();
    let b = TestBroker::start_in(dir.path(), &overrides);
    python_phase(&b.bootstrap, "restarted");
}

/// DescribeConfigs v4 with documentation and synonyms: a topic key reports its doc, type
/// and Kafka's synonym order (topic override, then the broker key per layer).
#[test]
fn describe_configs_reports_documentation_and_synonyms_in_kafkas_order() {
    let b = TestBroker::start_with(&["log.retention.hours=2"]);
    let mut c = RawConn::connect(&b.bootstrap);
    let describe = |c: &mut RawConn, rtype: i8, name: &str, id: i32| {
        let req = DescribeConfigsRequest::default()
            .with_resources(vec![DescribeConfigsResource::default()
                .with_resource_type(rtype)
                .with_resource_name(StrBytes::from_string(name.to_string()))
                .with_configuration_keys(None)])
            .with_include_synonyms(true)
            .with_include_documentation(true);
        let r: DescribeConfigsResponse = decode(c.request(&req, 4, id).unwrap(), 4);
        r.results.into_iter().next().unwrap()
    };
    let broker = describe(&mut c, 4, "1", 1);
    assert_eq!(broker.error_code, 0);
    let get = |name: &str| {
        broker
            .configs
            .iter()
            .find(|e| e.name.as_str() == name)
            .unwrap_or_else(|| panic!("{name} missing"))
            .clone()
    };
    let hours = get("log.retention.hours");
    assert_eq!(
        (
            hours.value.as_ref().map(|v| v.as_str()),
            hours.config_source,
            hours.read_only
        ),
        (Some("2"), 4, true)
    );
    let synonyms: Vec<(String, i8)> = hours
        .synonyms
        .iter()
        .map(|s| (s.name.as_str().to_string(), s.source))
        .collect();
    assert_eq!(
        synonyms,
        [
            ("log.retention.hours".to_string(), 4),
            ("log.retention.hours".to_string(), 5)
        ]
    );
    let ms = get("log.retention.ms");
    assert!(!ms.read_only, "log.retention.ms is dynamic");
    assert!(ms.documentation.is_some_and(|d| !d.is_empty()));
    // None set: the default resource lists nothing.
    assert!(describe(&mut c, 4, "", 2).configs.is_empty());
    // Another broker's id: INVALID_REQUEST.
    assert_eq!(describe(&mut c, 4, "9", 3).error_code, 42);
}

/// A raw DescribeConfigs v4 of one resource on `bootstrap`: (error code, name → (value,
/// source)).
fn describe_on(bootstrap: &str, rtype: i8, name: &str) -> (i16, BTreeMap<String, (String, i8)>) {
    let req =
        DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(rtype)
            .with_resource_name(StrBytes::from_string(name.to_string()))
            .with_configuration_keys(None)]);
    let mut c = RawConn::connect(bootstrap);
    let r: DescribeConfigsResponse = decode(c.request(&req, 4, 1).unwrap(), 4);
    let r = &r.results[0];
    let configs = r
        .configs
        .iter()
        .map(|e| {
            let value = e.value.as_ref().map(|v| v.to_string()).unwrap_or_default();
            (e.name.to_string(), (value, e.config_source))
        })
        .collect();
    (r.error_code, configs)
}

/// On a cluster the dynamic configs are metadata-log records: a cluster default set
/// through broker 1 is what broker 3 applies to its topics, a per-broker value set for
/// broker 2 (the CLI routes it there) is broker 2's alone, and a restarted node still has
/// both.
#[test]
fn a_cluster_default_set_through_one_broker_applies_on_every_broker() {
    let mut nodes = ThreeNodes::start(&[]);
    let (b1, b2, b3) = (nodes.bootstrap(1), nodes.bootstrap(2), nodes.bootstrap(3));
    let (ok, out, err) = weir_config(
        &b1,
        &[
            "alter",
            "--broker-default",
            "--add-config",
            "log.retention.ms=4321",
        ],
    );
    assert!(ok, "{out}{err}");
    let (ok, out, err) = weir_config(
        &b1,
        &[
            "alter",
            "--broker",
            "2",
            "--add-config",
            "message.max.bytes=3000",
        ],
    );
    assert!(ok, "{out}{err}");
    let topic = CreatableTopic::default()
        .with_name(TopicName(StrBytes::from_static_str("spread")))
        .with_num_partitions(3)
        .with_replication_factor(3);
    assert_eq!(create_raw(&b1, topic).0, 0);
    let retention_on = |bootstrap: &str| {
        let (code, configs) = describe_on(bootstrap, 2, "spread");
        (code == 0)
            .then(|| configs.get("retention.ms").cloned())
            .flatten()
    };
    let want = Some(("4321".to_string(), 3));
    poll_for("broker 3 applies the cluster default", 20, || {
        let seen = retention_on(&b3);
        if seen == want {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
    let max_on = |bootstrap: &str, id: &str| {
        describe_on(bootstrap, 4, id)
            .1
            .get("message.max.bytes")
            .cloned()
    };
    assert_eq!(max_on(&b2, "2"), Some(("3000".to_string(), 2)));
    assert_eq!(max_on(&b3, "3"), Some(("1048588".to_string(), 5)));
    nodes.kill9(3);
    nodes.restart(3);
    let b3 = nodes.bootstrap(3);
    poll_for("restarted broker 3 still applies it", 30, || {
        let seen = std::panic::catch_unwind(|| retention_on(&b3)).unwrap_or(None);
        if seen == want {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
    assert_eq!(
        describe_on(&b3, 4, "").1.get("log.retention.ms").cloned(),
        Some(("4321".to_string(), 3))
    );
}
