//! Dynamic broker configs (KIP-226): which broker keys may be changed at run time, at
//! which level, and how a key's value is resolved through the layers Kafka stacks.
//!
//! Owns: [`DYNAMIC_BROKER_KEYS`] (Kafka's `DynamicBrokerConfig.AllDynamicConfigs` for the
//! keys weir knows, with [`DynamicScope`] and whether weir acts on a change), the check of
//! a dynamic change ([`check_dynamic_change`], Kafka's `DynamicBrokerConfig.validate`),
//! [`ConfigSource`] and the layer walk ([`DynamicLayers`], [`BrokerConfig::synonyms`]):
//! dynamic per-broker > dynamic cluster default > static (file, `--override`) > default,
//! each layer trying the key's synonyms in Kafka's order (`log.retention.ms`,
//! `.minutes`, `.hours`).
//!
//! Never does: store the dynamic values (they are metadata-log records, `cluster`), or
//! apply them (the replica manager re-resolves topic configs when they change).

use std::collections::BTreeMap;

use super::{broker_key, check_value, BrokerConfig, ConfigError, TopicKeySpec};

/// Where a config value came from (DescribeConfigs `config_source`, KIP-226; Kafka's
/// `DescribeConfigsResponse.ConfigSource`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigSource {
    /// Set on the topic (DYNAMIC_TOPIC_CONFIG, 1).
    Topic,
    /// Set dynamically for this broker, resource name "<node id>" (DYNAMIC_BROKER_CONFIG, 2).
    DynamicBroker,
    /// Set dynamically for every broker, resource name "" (DYNAMIC_DEFAULT_BROKER_CONFIG, 3).
    DynamicDefaultBroker,
    /// Set in the broker's file or overrides (STATIC_BROKER_CONFIG, 4).
    StaticBroker,
    /// Built-in default (DEFAULT_CONFIG, 5).
    Default,
}

impl ConfigSource {
    /// The DescribeConfigs v1+ `config_source` code.
    pub fn code(self) -> i8 {
        match self {
            ConfigSource::Topic => 1,
            ConfigSource::DynamicBroker => 2,
            ConfigSource::DynamicDefaultBroker => 3,
            ConfigSource::StaticBroker => 4,
            ConfigSource::Default => 5,
        }
    }
}

/// At which level a dynamic broker key may be set (Kafka's "Dynamic Update Mode" column
/// of the broker config table: `cluster-wide` or `per-broker`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DynamicScope {
    /// `cluster-wide`: on the default resource ("") or one broker ("<id>").
    ClusterWide,
    /// `per-broker`: on one broker only (`listeners`, `advertised.listeners`, ...).
    PerBroker,
}

/// One broker key Kafka lets IncrementalAlterConfigs / AlterConfigs change at run time.
#[derive(Debug, Clone, Copy)]
pub struct DynamicKeySpec {
    /// The broker key (in [`super::BROKER_KEYS`]).
    pub name: &'static str,
    /// Where it may be set.
    pub scope: DynamicScope,
    /// Whether a change takes effect in weir now (`false`: stored and reported only; the
    /// docs say so).
    pub applied: bool,
}

const fn dk(name: &'static str, scope: DynamicScope, applied: bool) -> DynamicKeySpec {
    DynamicKeySpec {
        name,
        scope,
        applied,
    }
}

use DynamicScope::{ClusterWide, PerBroker};

/// The broker keys weir lets change at run time: Kafka 4.1's dynamic keys
/// (`DynamicLogConfig`: the broker synonym of every topic key; `DynamicThreadPool`;
/// `DynamicListenerConfig`; cleaner, connection quota and producer-state keys) that weir
/// has. Every other broker key is read-only (DescribeConfigs `read_only`; a change is
/// refused with INVALID_REQUEST, "Cannot update these configs dynamically").
/// `applied: true` keys change the effective config of topics without an override of
/// their own at once.
pub const DYNAMIC_BROKER_KEYS: &[DynamicKeySpec] = &[
    dk("log.segment.bytes", ClusterWide, true),
    dk("log.roll.ms", ClusterWide, true),
    dk("log.roll.jitter.ms", ClusterWide, false),
    dk("log.index.size.max.bytes", ClusterWide, true),
    dk("log.flush.interval.messages", ClusterWide, true),
    dk("log.flush.interval.ms", ClusterWide, true),
    dk("log.retention.bytes", ClusterWide, true),
    dk("log.retention.ms", ClusterWide, true),
    dk("message.max.bytes", ClusterWide, true),
    dk("log.index.interval.bytes", ClusterWide, true),
    dk("log.cleaner.delete.retention.ms", ClusterWide, true),
    dk("log.cleaner.min.compaction.lag.ms", ClusterWide, true),
    dk("log.cleaner.max.compaction.lag.ms", ClusterWide, false),
    dk("log.segment.delete.delay.ms", ClusterWide, false),
    dk("log.cleaner.min.cleanable.ratio", ClusterWide, true),
    dk("log.cleanup.policy", ClusterWide, true),
    dk("unclean.leader.election.enable", ClusterWide, true),
    dk("min.insync.replicas", ClusterWide, true),
    dk("compression.type", ClusterWide, true),
    dk("compression.gzip.level", ClusterWide, false),
    dk("compression.lz4.level", ClusterWide, false),
    dk("compression.zstd.level", ClusterWide, false),
    dk("log.preallocate", ClusterWide, false),
    dk("log.message.timestamp.type", ClusterWide, true),
    dk("log.message.timestamp.before.max.ms", ClusterWide, false),
    dk("log.message.timestamp.after.max.ms", ClusterWide, false),
    dk("log.local.retention.ms", ClusterWide, false),
    dk("log.local.retention.bytes", ClusterWide, false),
    dk("log.cleaner.threads", ClusterWide, false),
    dk("log.cleaner.io.max.bytes.per.second", ClusterWide, false),
    dk("log.cleaner.dedupe.buffer.size", ClusterWide, false),
    dk("log.cleaner.io.buffer.size", ClusterWide, false),
    dk("log.cleaner.io.buffer.load.factor", ClusterWide, false),
    dk("log.cleaner.backoff.ms", ClusterWide, false),
    dk("num.io.threads", ClusterWide, false),
    dk("num.network.threads", ClusterWide, false),
    dk("num.replica.fetchers", ClusterWide, false),
    dk("num.recovery.threads.per.data.dir", ClusterWide, false),
    dk("background.threads", ClusterWide, false),
    dk("max.connections", ClusterWide, false),
    dk("max.connections.per.ip", ClusterWide, false),
    dk("max.connections.per.ip.overrides", ClusterWide, false),
    dk("max.connection.creation.rate", ClusterWide, false),
    dk("producer.id.expiration.ms", ClusterWide, false),
    dk("listeners", PerBroker, false),
    dk("advertised.listeners", PerBroker, false),
    dk("listener.security.protocol.map", PerBroker, false),
];

/// The dynamic spec of broker key `name`; `None`: read-only.
pub fn dynamic_key(name: &str) -> Option<&'static DynamicKeySpec> {
    DYNAMIC_BROKER_KEYS.iter().find(|k| k.name == name)
}

/// The dynamic broker configs in force for one broker, as the metadata image holds them:
/// this broker's own (resource "<node id>") and the cluster default (resource "").
/// Empty maps when nothing was set.
#[derive(Debug, Clone, Copy, Default)]
pub struct DynamicLayers<'a> {
    /// DYNAMIC_BROKER_CONFIG: set for this broker.
    pub per_broker: Option<&'a BTreeMap<String, String>>,
    /// DYNAMIC_DEFAULT_BROKER_CONFIG: set for every broker.
    pub cluster_default: Option<&'a BTreeMap<String, String>>,
}

/// Kafka's synonyms of a broker key, the key itself first (`KafkaConfig`'s
/// `brokerSynonyms`): the unit variants of the time keys.
pub fn broker_synonyms(key: &str) -> &'static [&'static str] {
    match key {
        "log.retention.ms" => &[
            "log.retention.ms",
            "log.retention.minutes",
            "log.retention.hours",
        ],
        "log.roll.ms" => &["log.roll.ms", "log.roll.hours"],
        "log.roll.jitter.ms" => &["log.roll.jitter.ms", "log.roll.jitter.hours"],
        _ => std::slice::from_ref(match broker_key(key) {
            Some(spec) => &spec.name,
            None => return &[],
        }),
    }
}

/// One synonym entry of DescribeConfigs: a key name, its value (text, `None`: null) and
/// the layer that holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Synonym {
    /// The key as set (`log.retention.hours`).
    pub name: &'static str,
    /// Its value as set.
    pub value: Option<String>,
    /// The layer.
    pub source: ConfigSource,
}

/// `value` of synonym `name` in the unit of `primary` (hours and minutes to ms; a
/// negative retention stays -1).
fn in_primary_unit(primary: &str, name: &str, value: &str) -> Option<String> {
    if name == primary {
        return Some(value.to_string());
    }
    let n: i64 = value.parse().ok()?;
    let factor: i64 = if name.ends_with(".hours") {
        3_600_000
    } else if name.ends_with(".minutes") {
        60_000
    } else {
        1
    };
    Some(if n < 0 { -1 } else { n.saturating_mul(factor) }.to_string())
}

impl BrokerConfig {
    /// Every synonym of broker key `key` that some layer sets, in Kafka's order
    /// (`ConfigHelper.configSynonyms`): all synonyms in the per-broker dynamic layer,
    /// then the dynamic default, then static, then the built-in defaults. The first entry
    /// is the one in force.
    pub fn synonyms(&self, layers: DynamicLayers<'_>, key: &str) -> Vec<Synonym> {
        let names = broker_synonyms(key);
        let mut out = Vec::new();
        let mut layer = |map: Option<&BTreeMap<String, String>>, source| {
            for name in names {
                if let Some(v) = map.and_then(|m| m.get(*name)) {
                    out.push(Synonym {
                        name,
                        value: Some(v.clone()),
                        source,
                    });
                }
            }
        };
        layer(layers.per_broker, ConfigSource::DynamicBroker);
        layer(layers.cluster_default, ConfigSource::DynamicDefaultBroker);
        for name in names {
            if let Some(v) = self.raw.get(name) {
                out.push(Synonym {
                    name,
                    value: Some(v.to_string()),
                    source: ConfigSource::StaticBroker,
                });
            }
        }
        for name in names {
            if let Some(d) = broker_key(name).and_then(|s| s.default) {
                out.push(Synonym {
                    name,
                    value: Some(d.to_string()),
                    source: ConfigSource::Default,
                });
            }
        }
        out
    }

    /// The value of broker key `key` in force through `layers` (converted to `key`'s unit
    /// when a synonym supplies it) and its source; `(None, Default)` for a null default.
    pub fn broker_value(
        &self,
        layers: DynamicLayers<'_>,
        key: &str,
    ) -> (Option<String>, ConfigSource) {
        match self.synonyms(layers, key).into_iter().next() {
            Some(s) => (
                s.value.and_then(|v| in_primary_unit(key, s.name, &v)),
                s.source,
            ),
            None => (None, ConfigSource::Default),
        }
    }

    /// The broker-level default of a topic key through the dynamic layers: the value of
    /// its broker synonym ([`Self::broker_value`]), or the topic key's own default when
    /// it has no broker synonym (`remote.storage.enable`, the throttled replica lists).
    pub fn topic_default_in(
        &self,
        layers: DynamicLayers<'_>,
        spec: &TopicKeySpec,
    ) -> (Option<String>, ConfigSource) {
        match spec.broker_key {
            Some(key) => self.broker_value(layers, key),
            None => (spec.default.map(str::to_string), ConfigSource::Default),
        }
    }
}

/// Why a dynamic broker config change is refused (Kafka answers INVALID_REQUEST, 42, for
/// all of them: `ConfigAdminManager` turns the `ConfigException` of
/// `DynamicBrokerConfig.validate` into an `InvalidRequestException`, KAFKA-13609).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DynamicConfigError {
    /// A key weir does not know.
    #[error("Unknown broker config name: {0}")]
    Unknown(String),
    /// A read-only key.
    #[error("Cannot update these configs dynamically: Set({0})")]
    ReadOnly(String),
    /// A per-broker key set on the cluster default.
    #[error("Cannot update these configs at default cluster level, broker id must be specified: Set({0})")]
    PerBrokerOnly(String),
    /// A value of the wrong type or out of range.
    #[error("Invalid value {value} for configuration {key}: {message}")]
    InvalidValue {
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// What is wrong.
        message: String,
    },
}

/// Checks the dynamic configs `configs` (the whole new set) of a broker resource:
/// `per_broker` for "<id>", `false` for the cluster default "". Every key must be in
/// [`DYNAMIC_BROKER_KEYS`] (per-broker keys only on a broker) and its value valid as in
/// the config file.
///
/// Errors: [`DynamicConfigError`], the first key refused.
pub fn check_dynamic_change(
    configs: &BTreeMap<String, String>,
    per_broker: bool,
) -> Result<(), DynamicConfigError> {
    for (k, v) in configs {
        let Some(spec) = broker_key(k) else {
            return Err(DynamicConfigError::Unknown(k.clone()));
        };
        let Some(dynamic) = dynamic_key(k) else {
            return Err(DynamicConfigError::ReadOnly(k.clone()));
        };
        if dynamic.scope == DynamicScope::PerBroker && !per_broker {
            return Err(DynamicConfigError::PerBrokerOnly(k.clone()));
        }
        check_value(spec.name, spec.key_type, spec.min, v).map_err(|e| {
            DynamicConfigError::InvalidValue {
                key: k.clone(),
                value: v.clone(),
                message: match e {
                    ConfigError::InvalidValue { message, .. } => message,
                    other => other.to_string(),
                },
            }
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{topic_key, RawConfig, BROKER_KEYS};

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_dynamic_key_is_a_broker_key() {
        for d in DYNAMIC_BROKER_KEYS {
            assert!(
                broker_key(d.name).is_some(),
                "{} is not in BROKER_KEYS",
                d.name
            );
        }
        assert!(BROKER_KEYS.len() > DYNAMIC_BROKER_KEYS.len());
    }

    #[test]
    fn precedence_is_per_broker_then_default_then_static_then_built_in() {
        let mut raw = RawConfig::default();
        raw.set("log.retention.hours", "2").unwrap();
        let c = BrokerConfig::from_raw(raw).unwrap();
        let spec = topic_key("retention.ms").unwrap();
        let none = DynamicLayers::default();
        assert_eq!(
            c.topic_default_in(none, spec),
            (Some("7200000".into()), ConfigSource::StaticBroker)
        );
        let default = map(&[("log.retention.ms", "5000")]);
        let broker = map(&[("log.retention.ms", "7000")]);
        let d = DynamicLayers {
            per_broker: None,
            cluster_default: Some(&default),
        };
        assert_eq!(
            c.topic_default_in(d, spec),
            (Some("5000".into()), ConfigSource::DynamicDefaultBroker)
        );
        let both = DynamicLayers {
            per_broker: Some(&broker),
            cluster_default: Some(&default),
        };
        assert_eq!(
            c.topic_default_in(both, spec),
            (Some("7000".into()), ConfigSource::DynamicBroker)
        );
        let names: Vec<(&str, ConfigSource)> = c
            .synonyms(both, "log.retention.ms")
            .iter()
            .map(|s| (s.name, s.source))
            .collect();
        assert_eq!(
            names,
            [
                ("log.retention.ms", ConfigSource::DynamicBroker),
                ("log.retention.ms", ConfigSource::DynamicDefaultBroker),
                ("log.retention.hours", ConfigSource::StaticBroker),
                ("log.retention.hours", ConfigSource::Default),
            ]
        );
        let d = BrokerConfig::defaults();
        assert_eq!(
            d.topic_default_in(none, spec),
            (Some("604800000".into()), ConfigSource::Default)
        );
        let spec = topic_key("remote.storage.enable").unwrap();
        assert_eq!(
            d.topic_default_in(none, spec),
            (Some("false".into()), ConfigSource::Default)
        );
    }

    #[test]
    fn dynamic_changes_are_checked_like_kafka() {
        check_dynamic_change(&map(&[("log.retention.ms", "1000")]), false).unwrap();
        check_dynamic_change(&map(&[("message.max.bytes", "2000")]), true).unwrap();
        assert_eq!(
            check_dynamic_change(&map(&[("num.partitions", "3")]), false),
            Err(DynamicConfigError::ReadOnly("num.partitions".into()))
        );
        assert_eq!(
            check_dynamic_change(&map(&[("log.retention.hours", "3")]), false),
            Err(DynamicConfigError::ReadOnly("log.retention.hours".into()))
        );
        assert_eq!(
            check_dynamic_change(&map(&[("no.such", "3")]), true),
            Err(DynamicConfigError::Unknown("no.such".into()))
        );
        let l = map(&[("listeners", "PLAINTEXT://127.0.0.1:0")]);
        check_dynamic_change(&l, true).unwrap();
        assert_eq!(
            check_dynamic_change(&l, false),
            Err(DynamicConfigError::PerBrokerOnly("listeners".into()))
        );
        for bad in [
            ("log.retention.ms", "-2"),
            ("message.max.bytes", "x"),
            ("log.cleanup.policy", "keep"),
            ("log.cleaner.threads", "-1"),
            ("compression.zstd.level", "23"),
        ] {
            let e = check_dynamic_change(&map(&[bad]), false).unwrap_err();
            assert!(
                matches!(e, DynamicConfigError::InvalidValue { .. }),
                "{bad:?}: {e}"
            );
        }
    }
}
