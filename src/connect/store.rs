//! The connect runtime's internal topics, written and replayed in process:
//!
//! - `__connect_offsets` (compacted, 1 partition): source offsets, Kafka Connect's
//!   format. Key = JSON `["<connector name>", {<source partition map>}]` (map keys
//!   sorted, so one partition always gives the same key and compaction keeps the latest);
//!   value = JSON `{<source offset map>}` — values are strings, as the WIT maps carry
//!   them (Kafka Connect's FileStreamSource writes `{"position": 123}`; weir's file
//!   source writes `{"position": "123"}`); a null value (tombstone) forgets the
//!   partition. Replayed at start: the last record per key wins.
//! - `__connect_status` (compacted, 1 partition): key `status-connector-<name>` and
//!   `status-task-<name>-0`, value JSON `{"state": "RUNNING"|"FAILED"|..., "trace":
//!   <error or null>, "worker_id": "<host:port>", "generation": 0}`, as Kafka Connect's
//!   status backing store. Written on every state change; readable by any consumer.
//!
//! - `__connect_state` (compacted, 1 partition): connectors' stored state (the WIT
//!   `state` interface), key JSON `["<connector name>", "<key>"]`, value the bytes as
//!   the connector stored them, a tombstone for a deleted key. Written through on every
//!   `set`, replayed at start ([`ConnectorStates`]).
//!
//! Appended here with acks=1 semantics (in the leader's log, not fsynced, not waiting for
//! followers) when this broker leads the topic; forwarded to the leader with acks=all when
//! another broker does (`InternalTopic::forwarding`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::cluster::Metadata;
pub(crate) use crate::internal_topic::InternalTopic;
use crate::internal_topic::InternalTopicSpec;
use crate::peer::PeerClients;
use crate::plugin::SourcePosition;
use crate::replica::ReplicaManager;

/// Source offsets topic.
pub(crate) const OFFSETS_TOPIC: &str = "__connect_offsets";
/// Connector and task status topic.
pub(crate) const STATUS_TOPIC: &str = "__connect_status";
/// Connectors' stored state topic.
pub(crate) const STATE_TOPIC: &str = "__connect_state";

/// Longest state key, in UTF-8 bytes.
pub(crate) const STATE_MAX_KEY_BYTES: usize = 1024;
/// Largest state value, in bytes.
pub(crate) const STATE_MAX_VALUE_BYTES: usize = 1 << 20;
/// Most state keys one connector may hold.
pub(crate) const STATE_MAX_KEYS: usize = 10_000;
/// Most bytes (keys and values) one connector's state may hold: the state is kept in
/// memory, so a plugin must not be able to make the broker hold more than this.
pub(crate) const STATE_MAX_BYTES: usize = 16 << 20;

/// Whether `name` is one of the connect runtime's topics (`__connect_configs`, `_offsets`,
/// `_status`, `_state`): the internal topics another broker may forward appends to.
pub(crate) fn is_connect_topic(name: &str) -> bool {
    [
        super::configs::CONFIGS_TOPIC,
        OFFSETS_TOPIC,
        STATUS_TOPIC,
        STATE_TOPIC,
    ]
    .contains(&name)
}

/// Replication factor of the connect runtime's topics: Kafka Connect's default for
/// `offset.storage.replication.factor` and its siblings (capped at the live brokers).
const CONNECT_TOPICS_REPLICATION_FACTOR: i16 = 3;

/// The connect runtime's internal topic `name`: compacted, one partition, created on
/// first use (Kafka Connect's defaults for its own topics).
pub(crate) fn connect_topic(
    name: &'static str,
    metadata: Arc<Metadata>,
    replicas: Arc<ReplicaManager>,
    peers: Arc<PeerClients>,
) -> InternalTopic {
    let spec = InternalTopicSpec {
        partitions: 1,
        replication_factor: CONNECT_TOPICS_REPLICATION_FACTOR,
        configs: BTreeMap::new(),
    };
    InternalTopic::new(name, spec, metadata, replicas).forwarding(peers)
}

/// Every keyed record of `topic` in offset order, as (key, value).
///
/// Errors: a read fails (I/O), as a message.
fn replay_pairs(topic: &InternalTopic) -> Result<Vec<(Bytes, Option<Bytes>)>, String> {
    Ok(topic
        .replay()
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|r| (r.key, r.value))
        .collect())
}

/// The JSON key of a source partition: `["name", {partition}]`, map keys sorted.
pub(crate) fn offset_key(connector: &str, partition: &[(String, String)]) -> String {
    let map: serde_json::Map<String, serde_json::Value> = partition
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    serde_json::Value::Array(vec![
        serde_json::Value::String(connector.to_string()),
        serde_json::Value::Object(map),
    ])
    .to_string()
}

fn string_map(v: &serde_json::Value) -> Option<Vec<(String, String)>> {
    let obj = v.as_object()?;
    Some(
        obj.iter()
            .map(|(k, v)| {
                let text = match v {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (k.clone(), text)
            })
            .collect(),
    )
}

/// Source offsets of every connector: replayed from `__connect_offsets` at start, kept
/// in memory, written through on every commit.
#[derive(Debug)]
pub(crate) struct SourceOffsets {
    topic: InternalTopic,
    /// connector name → (offset key JSON → position).
    latest: Mutex<BTreeMap<String, BTreeMap<String, SourcePosition>>>,
}

impl SourceOffsets {
    /// Replays `__connect_offsets`. Records that are not Kafka Connect's format are
    /// skipped with a warning (another tool may share the topic).
    ///
    /// Errors: the topic cannot be read, as a message.
    pub(crate) fn load(topic: InternalTopic) -> Result<SourceOffsets, String> {
        let mut latest: BTreeMap<String, BTreeMap<String, SourcePosition>> = BTreeMap::new();
        for (key, value) in replay_pairs(&topic)? {
            let parsed: Option<(String, Vec<(String, String)>)> =
                serde_json::from_slice::<serde_json::Value>(&key)
                    .ok()
                    .and_then(|k| {
                        let arr = k.as_array()?;
                        let name = arr.first()?.as_str()?.to_string();
                        let partition = string_map(arr.get(1)?)?;
                        Some((name, partition))
                    });
            let Some((name, partition)) = parsed else {
                tracing::warn!(key = %String::from_utf8_lossy(&key), "not a Kafka Connect offset key in {OFFSETS_TOPIC}; skipped");
                continue;
            };
            let canonical = offset_key(&name, &partition);
            let entry = latest.entry(name).or_default();
            match value {
                None => {
                    entry.remove(&canonical);
                }
                Some(v) => match serde_json::from_slice::<serde_json::Value>(&v)
                    .ok()
                    .as_ref()
                    .and_then(string_map)
                {
                    Some(offset) => {
                        entry.insert(
                            canonical,
                            SourcePosition {
                                source_partition: partition,
                                source_offset: offset,
                            },
                        );
                    }
                    None => {
                        tracing::warn!(key = %canonical, "offset value is not a JSON object in {OFFSETS_TOPIC}; skipped")
                    }
                },
            }
        }
        Ok(SourceOffsets {
            topic,
            latest: Mutex::new(latest),
        })
    }

    /// The stored positions of `connector` (one per source partition).
    pub(crate) fn positions(&self, connector: &str) -> Vec<SourcePosition> {
        let latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        latest
            .get(connector)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Writes `positions` of `connector` to `__connect_offsets` (one batch), then
    /// remembers them.
    ///
    /// Errors: the append fails, as a message (nothing is remembered).
    pub(crate) fn commit(
        &self,
        connector: &str,
        positions: &[SourcePosition],
    ) -> Result<(), String> {
        let records = offset_records(connector, positions);
        self.topic.append(0, &records).map_err(|e| e.to_string())?;
        self.remember(connector, positions);
        Ok(())
    }

    /// The topic and partition the offsets are written to, created if needed (an
    /// exactly-once task adds it to its transaction before writing).
    ///
    /// Errors: the topic cannot be created, as a message.
    pub(crate) fn partition(&self) -> Result<(&'static str, i32), String> {
        self.topic.ensure().map_err(|e| e.to_string())?;
        Ok((OFFSETS_TOPIC, 0))
    }

    /// KIP-618: writes `positions` of `connector` to `__connect_offsets` as one batch of
    /// the open transaction of `producer` (its partition added first, see
    /// [`SourceOffsets::partition`]). Nothing is remembered: call
    /// [`SourceOffsets::remember`] once the transaction committed.
    ///
    /// Errors: the append fails (a fenced epoch among them), as a message.
    pub(crate) fn write_transactional(
        &self,
        connector: &str,
        positions: &[SourcePosition],
        producer: &crate::txn::producer::BatchProducer,
    ) -> Result<(), String> {
        let records = offset_records(connector, positions);
        self.topic
            .append_transactional(
                0,
                &records,
                (producer.producer_id, producer.producer_epoch),
                &producer.transactional_id,
            )
            .map_err(|e| e.to_string())
    }

    /// Remembers `positions` of `connector` as stored (after they were written).
    pub(crate) fn remember(&self, connector: &str, positions: &[SourcePosition]) {
        let mut latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        let entry = latest.entry(connector.to_string()).or_default();
        for p in positions {
            entry.insert(offset_key(connector, &p.source_partition), p.clone());
        }
    }

    /// KIP-618: reads `connector`'s committed offsets again from `__connect_offsets`
    /// (records of aborted transactions left out, committed ones at their marker) and
    /// remembers exactly those. An exactly-once task calls it after its InitProducerId,
    /// so a transaction its predecessor committed after this broker's start-up replay
    /// (markers written late, after a crash) counts, and one it left open does not.
    /// While a transaction still holds records of `connector` without a marker (another
    /// incarnation's, completing), it waits, for at most `wait_ms`.
    ///
    /// The read is of this broker's replica of `__connect_offsets`-0; when it hosts none
    /// (a cluster where the connect leader is not among its replicas) the offsets known
    /// in memory are kept, with a warning.
    ///
    /// Errors: the topic cannot be read, or records stay pending past `wait_ms`, as a
    /// message.
    pub(crate) async fn reload_committed(
        &self,
        connector: &str,
        wait_ms: u64,
    ) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(wait_ms);
        let ours = |key: &Bytes| {
            serde_json::from_slice::<serde_json::Value>(key)
                .ok()
                .and_then(|k| k.as_array()?.first()?.as_str().map(|n| n == connector))
                .unwrap_or(false)
        };
        if self.topic.partitions().is_some() && self.topic.partition(0).is_none() {
            tracing::warn!(
                connector,
                "{OFFSETS_TOPIC}-0 has no replica on this broker: the task starts from the offsets known in memory"
            );
            return Ok(());
        }
        let replayed = loop {
            let replayed = if self.topic.partitions().is_some() {
                self.topic
                    .replay_one_transactional(0)
                    .map_err(|e| e.to_string())?
            } else {
                crate::internal_topic::ReplayedPartition::default()
            };
            if !replayed.pending.iter().any(|r| ours(&r.key)) {
                break replayed;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "{OFFSETS_TOPIC} still holds offsets of {connector} in a transaction without a marker after {wait_ms} ms"
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        };
        let mut fresh: BTreeMap<String, SourcePosition> = BTreeMap::new();
        for r in replayed.records.into_iter().filter(|r| ours(&r.key)) {
            let partition = serde_json::from_slice::<serde_json::Value>(&r.key)
                .ok()
                .and_then(|k| string_map(k.as_array()?.get(1)?));
            let Some(partition) = partition else {
                continue;
            };
            let canonical = offset_key(connector, &partition);
            match r
                .value
                .and_then(|v| serde_json::from_slice::<serde_json::Value>(&v).ok())
                .as_ref()
                .and_then(string_map)
            {
                Some(offset) => {
                    fresh.insert(
                        canonical,
                        SourcePosition {
                            source_partition: partition,
                            source_offset: offset,
                        },
                    );
                }
                None => {
                    fresh.remove(&canonical);
                }
            }
        }
        let mut latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        latest.insert(connector.to_string(), fresh);
        Ok(())
    }
}

/// The `__connect_offsets` records of `positions` of `connector` (module doc's format).
fn offset_records(connector: &str, positions: &[SourcePosition]) -> Vec<(Bytes, Option<Bytes>)> {
    positions
        .iter()
        .map(|p| {
            let key = offset_key(connector, &p.source_partition);
            let value: serde_json::Map<String, serde_json::Value> = p
                .source_offset
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect();
            (
                Bytes::from(key),
                Some(Bytes::from(serde_json::Value::Object(value).to_string())),
            )
        })
        .collect()
}

/// One change of KIP-875's `PATCH /connectors/{name}/offsets`: a source partition and
/// its new offset (`None`: forget the partition).
pub(crate) type OffsetChange = (Vec<(String, String)>, Option<Vec<(String, String)>>);

impl SourceOffsets {
    /// KIP-875 `DELETE /connectors/{name}/offsets`: writes a tombstone for every stored
    /// source partition of `connector` and forgets them; returns how many there were.
    ///
    /// Errors: the append fails, as a message (nothing is forgotten).
    pub(crate) fn reset(&self, connector: &str) -> Result<usize, String> {
        let keys: Vec<String> = {
            let latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
            latest
                .get(connector)
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default()
        };
        let records: Vec<(Bytes, Option<Bytes>)> = keys
            .iter()
            .map(|k| (Bytes::from(k.clone()), None))
            .collect();
        self.topic.append(0, &records).map_err(|e| e.to_string())?;
        let mut latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        latest.remove(connector);
        Ok(keys.len())
    }

    /// KIP-875 `PATCH /connectors/{name}/offsets`: sets (`Some`) or forgets (`None`) the
    /// offset of each given source partition of `connector`.
    ///
    /// Errors: the append fails, as a message (nothing is changed).
    pub(crate) fn alter(&self, connector: &str, changes: &[OffsetChange]) -> Result<(), String> {
        let records: Vec<(Bytes, Option<Bytes>)> = changes
            .iter()
            .map(|(partition, offset)| {
                let key = Bytes::from(offset_key(connector, partition));
                let value = offset.as_ref().map(|o| {
                    let map: serde_json::Map<String, serde_json::Value> = o
                        .iter()
                        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                        .collect();
                    Bytes::from(serde_json::Value::Object(map).to_string())
                });
                (key, value)
            })
            .collect();
        self.topic.append(0, &records).map_err(|e| e.to_string())?;
        let mut latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        let entry = latest.entry(connector.to_string()).or_default();
        for (partition, offset) in changes {
            let key = offset_key(connector, partition);
            match offset {
                Some(o) => {
                    entry.insert(
                        key,
                        SourcePosition {
                            source_partition: partition.clone(),
                            source_offset: o.clone(),
                        },
                    );
                }
                None => {
                    entry.remove(&key);
                }
            }
        }
        Ok(())
    }
}

/// The JSON key of a state entry: `["connector", "key"]`.
pub(crate) fn state_key(connector: &str, key: &str) -> String {
    serde_json::Value::Array(vec![
        serde_json::Value::String(connector.to_string()),
        serde_json::Value::String(key.to_string()),
    ])
    .to_string()
}

/// Every connector's stored state (the WIT `state` interface): replayed from
/// `__connect_state` at start, kept in memory, written through on every `set`.
///
/// Kept after a connector is deleted, as its offsets are (a connector created again
/// under the same name finds it).
#[derive(Debug)]
pub(crate) struct ConnectorStates {
    topic: InternalTopic,
    /// connector name → key → value. Each append and its map update happen under this
    /// lock, so the log order and the map agree.
    entries: Mutex<BTreeMap<String, BTreeMap<String, Bytes>>>,
}

impl ConnectorStates {
    /// Replays `__connect_state`. A record whose key is not `["name", "key"]` is
    /// skipped with a warning.
    ///
    /// Errors: the topic cannot be read, as a message.
    pub(crate) fn load(topic: InternalTopic) -> Result<ConnectorStates, String> {
        let mut entries: BTreeMap<String, BTreeMap<String, Bytes>> = BTreeMap::new();
        for (key, value) in replay_pairs(&topic)? {
            let parsed = serde_json::from_slice::<(String, String)>(&key).ok();
            let Some((name, k)) = parsed else {
                tracing::warn!(key = %String::from_utf8_lossy(&key), "not a [connector, key] pair in {STATE_TOPIC}; skipped");
                continue;
            };
            let entry = entries.entry(name).or_default();
            match value {
                Some(v) => {
                    entry.insert(k, v);
                }
                None => {
                    entry.remove(&k);
                }
            }
        }
        entries.retain(|_, m| !m.is_empty());
        Ok(ConnectorStates {
            topic,
            entries: Mutex::new(entries),
        })
    }
}

impl crate::plugin::StateStore for ConnectorStates {
    fn get(&self, connector: &str, key: &str) -> Option<Vec<u8>> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.get(connector)?.get(key).map(|v| v.to_vec())
    }

    /// Checks the limits ([`STATE_MAX_KEY_BYTES`], [`STATE_MAX_VALUE_BYTES`],
    /// [`STATE_MAX_KEYS`], [`STATE_MAX_BYTES`]), appends the record (a tombstone for `None`), then updates
    /// the map. Deleting a missing key is ok and writes nothing.
    fn set(&self, connector: &str, key: &str, value: Option<Vec<u8>>) -> Result<(), String> {
        if key.len() > STATE_MAX_KEY_BYTES {
            return Err(format!(
                "state: key of {} bytes, more than the {STATE_MAX_KEY_BYTES} allowed",
                key.len()
            ));
        }
        if let Some(v) = &value {
            if v.len() > STATE_MAX_VALUE_BYTES {
                return Err(format!(
                    "state: value of {} bytes, more than the {STATE_MAX_VALUE_BYTES} allowed",
                    v.len()
                ));
            }
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (exists, count) = entries
            .get(connector)
            .map_or((false, 0), |m| (m.contains_key(key), m.len()));
        match &value {
            None if !exists => return Ok(()),
            Some(_) if !exists && count >= STATE_MAX_KEYS => {
                return Err(format!(
                    "state: {count} keys stored, the most a connector may hold ({STATE_MAX_KEYS}); delete some first"
                ))
            }
            Some(v) => {
                let held: usize = entries.get(connector).map_or(0, |m| {
                    m.iter()
                        .filter(|(k, _)| k.as_str() != key)
                        .map(|(k, v)| k.len() + v.len())
                        .sum()
                });
                if held + key.len() + v.len() > STATE_MAX_BYTES {
                    return Err(format!(
                        "state: {held} bytes stored; {} more would pass the {STATE_MAX_BYTES} a connector may hold",
                        key.len() + v.len()
                    ));
                }
            }
            _ => {}
        }
        let value = value.map(Bytes::from);
        self.topic
            .append(
                0,
                &[(Bytes::from(state_key(connector, key)), value.clone())],
            )
            .map_err(|e| format!("state: cannot store {key}: {e}"))?;
        match value {
            Some(v) => {
                entries
                    .entry(connector.to_string())
                    .or_default()
                    .insert(key.to_string(), v);
            }
            None => {
                if let Some(m) = entries.get_mut(connector) {
                    m.remove(key);
                    if m.is_empty() {
                        entries.remove(connector);
                    }
                }
            }
        }
        Ok(())
    }

    fn keys(&self, connector: &str) -> Vec<String> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(connector)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }
}

/// A JSON object's values as strings (strings as they are, other values as JSON text):
/// the shape the WIT maps carry. `None` for a value that is not an object.
pub(crate) fn json_string_map(v: &serde_json::Value) -> Option<Vec<(String, String)>> {
    string_map(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::StateStore;

    /// The internal topic `name` over a broker's state in `dir`, as a (re)started broker
    /// builds it.
    fn topic_in(dir: &std::path::Path, name: &'static str) -> InternalTopic {
        let (metadata, replicas) = crate::internal_topic::test_owners(dir);
        let peers = Arc::new(PeerClients::new(
            metadata.clone(),
            Arc::new(crate::config::BrokerConfig::defaults()),
        ));
        connect_topic(name, metadata, replicas, peers)
    }

    /// The connector states over a broker's state in `dir`, as a (re)started broker
    /// builds them.
    fn states_in(dir: &std::path::Path) -> ConnectorStates {
        ConnectorStates::load(topic_in(dir, STATE_TOPIC)).unwrap()
    }

    #[test]
    fn state_is_per_connector_bounded_and_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let s = states_in(dir.path());
        assert_eq!(s.get("a", "k"), None);
        s.set("a", "k", Some(b"1".to_vec())).unwrap();
        s.set("a", "gone", Some(b"x".to_vec())).unwrap();
        s.set("a", "gone", None).unwrap();
        s.set("b", "k", Some(b"2".to_vec())).unwrap();
        assert_eq!(s.get("a", "k"), Some(b"1".to_vec()));
        assert_eq!(s.get("b", "k"), Some(b"2".to_vec()));
        assert_eq!(s.keys("a"), vec!["k"]);
        // Limits are errors, and nothing is stored.
        let long = "k".repeat(STATE_MAX_KEY_BYTES + 1);
        assert!(s.set("a", &long, Some(vec![])).unwrap_err().contains("key"));
        let big = vec![0u8; STATE_MAX_VALUE_BYTES + 1];
        assert!(s.set("a", "big", Some(big)).unwrap_err().contains("value"));
        s.set("a", "max", Some(vec![7u8; STATE_MAX_VALUE_BYTES]))
            .unwrap();
        // The bytes one connector holds are bounded too (state lives in memory).
        for i in 0..(STATE_MAX_BYTES / STATE_MAX_VALUE_BYTES) {
            let r = s.set(
                "d",
                &format!("v{i}"),
                Some(vec![1u8; STATE_MAX_VALUE_BYTES]),
            );
            if i + 1 < STATE_MAX_BYTES / STATE_MAX_VALUE_BYTES {
                r.unwrap();
            } else {
                assert!(r.unwrap_err().contains("bytes"));
            }
        }
        // Replacing a value counts its new size only.
        s.set("d", "v0", Some(vec![2u8; STATE_MAX_VALUE_BYTES]))
            .unwrap();
        for i in 2..STATE_MAX_KEYS {
            s.set("c", &format!("k{i}"), Some(vec![])).unwrap();
        }
        s.set("c", "k0", Some(vec![])).unwrap();
        s.set("c", "k1", Some(vec![])).unwrap();
        let e = s.set("c", "one-more", Some(vec![])).unwrap_err();
        assert!(e.contains("10000"), "{e}");
        // Overwriting and deleting still work at the limit.
        s.set("c", "k1", Some(b"v".to_vec())).unwrap();
        s.set("c", "k0", None).unwrap();
        s.set("c", "one-more", Some(vec![])).unwrap();
        drop(s);

        // A restarted broker replays the same state.
        let s = states_in(dir.path());
        assert_eq!(s.get("a", "k"), Some(b"1".to_vec()));
        assert_eq!(s.get("a", "gone"), None);
        assert_eq!(
            s.get("a", "max").map(|v| v.len()),
            Some(STATE_MAX_VALUE_BYTES)
        );
        assert_eq!(s.keys("a"), vec!["k", "max"]);
        assert_eq!(s.get("b", "k"), Some(b"2".to_vec()));
        assert_eq!(s.keys("c").len(), STATE_MAX_KEYS);
        assert_eq!(s.get("c", "k1"), Some(b"v".to_vec()));
        assert_eq!(s.get("c", "k0"), None);
    }

    #[test]
    fn offset_keys_are_kafka_connects_with_sorted_maps() {
        let a = offset_key(
            "src",
            &[("filename".into(), "/a b".into()), ("b".into(), "1".into())],
        );
        let b = offset_key(
            "src",
            &[("b".into(), "1".into()), ("filename".into(), "/a b".into())],
        );
        assert_eq!(a, b);
        assert_eq!(a, r#"["src",{"b":"1","filename":"/a b"}]"#);
    }
}
