//! Stored state of connectors (issue 5, the `state` host capability): a connector's
//! key-value state survives a broker restart, is its own (another connector with the same
//! component has another), is refused past its limits, and lives in `__connect_state`,
//! which any Kafka client can read.

use std::path::Path;

use crate::connect::{dirs, read_topic, start};

/// A connector running the `state-counter` fixture (plugins/fixtures/state-counter): on
/// each `open` it increments `opens` in its state and emits `opens=<n> keys=<keys>`.
fn counter_config(configs: &Path, name: &str, topic: &str) {
    std::fs::write(
        configs.join(format!("{name}.toml")),
        format!(
            "name = \"{name}\"\nconnector.class = \"{}\"\ntopic = \"{topic}\"\n\
             poll.interval.ms = 20\n",
            crate::guests::guest("state-counter").display()
        ),
    )
    .unwrap();
}

fn values(bootstrap: &str, topic: &str, expected: usize) -> Vec<String> {
    read_topic(bootstrap, topic, expected)
        .into_iter()
        .map(|(_, v)| v)
        .collect()
}

#[test]
fn connector_state_survives_a_restart_is_per_connector_and_is_in_connect_state() {
    let d = dirs();
    counter_config(&d.configs, "counter-a", "counts-a");
    let broker = start(&d);
    // The fixture also checked that a 1025-byte key and a 1 MiB + 1 byte value are
    // refused (it fails `open` otherwise, and then emits nothing).
    assert_eq!(
        values(&broker.bootstrap, "counts-a", 1),
        vec!["opens=1 keys=opens"]
    );
    broker.stop();

    // After a restart the count continues from the stored state; a second connector with
    // the same component starts from its own, empty state.
    counter_config(&d.configs, "counter-b", "counts-b");
    let broker = start(&d);
    assert_eq!(
        values(&broker.bootstrap, "counts-a", 2),
        vec!["opens=1 keys=opens", "opens=2 keys=opens"]
    );
    assert_eq!(
        values(&broker.bootstrap, "counts-b", 1),
        vec!["opens=1 keys=opens"]
    );

    // `__connect_state` holds every `set`, keyed `["connector", "key"]`, readable by a
    // plain consumer.
    let state = read_topic(&broker.bootstrap, "__connect_state", 3);
    let pairs: Vec<(String, String)> = state
        .into_iter()
        .map(|(k, v)| (k.unwrap_or_default(), v))
        .collect();
    let of = |key: &str| -> Vec<&str> {
        pairs
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    };
    assert_eq!(of(r#"["counter-a","opens"]"#), vec!["1", "2"], "{pairs:?}");
    assert_eq!(of(r#"["counter-b","opens"]"#), vec!["1"], "{pairs:?}");
    assert_eq!(pairs.len(), 3, "nothing else was stored: {pairs:?}");
    broker.stop();
}
