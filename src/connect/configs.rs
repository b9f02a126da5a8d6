//! `__connect_configs` (compacted, 1 partition): the connectors created through the REST
//! API and the target state of every connector, in Kafka Connect's record shapes
//! (`KafkaConfigBackingStore`):
//!
//! - key `connector-<name>`, value `{"properties": {<key>: <string>, ...}}`; a tombstone
//!   when the connector is deleted. Written for REST-created connectors only: a
//!   file-defined connector's store is its file (writing it here too would resurrect it
//!   after the file is removed while the broker is down).
//! - key `target-state-<name>`, value `{"state": "STARTED" | "PAUSED" | "STOPPED"}`
//!   (KIP-875's STOPPED spelled in `state`, as the brief of issue 5 asks; Kafka Connect
//!   3.5+ also writes `state.v2`, which is read here when present); a tombstone on delete.
//!
//! Replayed at start (last record per key wins), so REST-created connectors and paused or
//! stopped connectors survive a broker restart.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::{json, Value};

use super::store::InternalTopic;
use super::TargetState;

/// Connector configs topic.
pub(crate) const CONFIGS_TOPIC: &str = "__connect_configs";

/// What `__connect_configs` says after replay.
#[derive(Debug, Default)]
pub(crate) struct Replayed {
    /// REST-created connectors by name: their properties.
    pub connectors: BTreeMap<String, BTreeMap<String, String>>,
    /// Target states by connector name.
    pub targets: BTreeMap<String, TargetState>,
}

/// Reads `__connect_configs`. Records of other shapes (`task-*`, `commit-*`, other tools'
/// records) are skipped.
///
/// Errors: the topic cannot be read, as a message.
pub(crate) fn replay(topic: &InternalTopic) -> Result<Replayed, String> {
    let mut out = Replayed::default();
    for record in topic.replay().map_err(|e| e.to_string())? {
        let (key, value) = (record.key, record.value);
        let key = String::from_utf8_lossy(&key).into_owned();
        let value: Option<Value> = value.and_then(|v| serde_json::from_slice(&v).ok());
        if let Some(name) = key.strip_prefix("connector-") {
            match value
                .as_ref()
                .and_then(|v| v.get("properties"))
                .and_then(Value::as_object)
            {
                Some(props) => {
                    let props = props
                        .iter()
                        .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                        .collect();
                    out.connectors.insert(name.to_string(), props);
                }
                None => {
                    out.connectors.remove(name);
                }
            }
        } else if let Some(name) = key.strip_prefix("target-state-") {
            let state = value.as_ref().and_then(|v| {
                v.get("state.v2")
                    .or_else(|| v.get("state"))
                    .and_then(Value::as_str)
                    .and_then(TargetState::parse)
            });
            match state {
                Some(s) => {
                    out.targets.insert(name.to_string(), s);
                }
                None => {
                    out.targets.remove(name);
                }
            }
        }
    }
    Ok(out)
}

/// The record storing a REST-created connector's properties.
pub(crate) fn connector_record(
    name: &str,
    props: &BTreeMap<String, String>,
) -> (Bytes, Option<Bytes>) {
    (
        Bytes::from(format!("connector-{name}")),
        Some(Bytes::from(json!({ "properties": props }).to_string())),
    )
}

/// The record storing a connector's target state.
pub(crate) fn target_record(name: &str, state: TargetState) -> (Bytes, Option<Bytes>) {
    (
        Bytes::from(format!("target-state-{name}")),
        Some(Bytes::from(json!({ "state": state.name() }).to_string())),
    )
}

/// Tombstones forgetting connector `name` (its properties and target state).
pub(crate) fn delete_records(name: &str) -> Vec<(Bytes, Option<Bytes>)> {
    vec![
        (Bytes::from(format!("connector-{name}")), None),
        (Bytes::from(format!("target-state-{name}")), None),
    ]
}
