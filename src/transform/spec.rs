//! A transform deployment's spec: what `POST /transforms`, a `<log.dir>/__transforms/*.json`
//! file and a `transform.config.dir/*.toml` file say, with the same keys in all three.
//!
//! ```toml
//! name = "redact-users"
//! wasm = "/opt/weir/plugins/redact.wasm"   # a file on the broker host
//! input = "users"
//! outputs = ["users-redacted"]              # the first is the default output
//! mode = "async"                            # or "inline"
//! "errors.tolerance" = "all"                # or "none" (default)
//! "errors.deadletterqueue.topic.name" = "users-dlq"
//! "processing.guarantee" = "exactly_once"  # async only; default "at_least_once"
//! [config]
//! fields = "email,phone"
//! ```
//!
//! [`TransformSpec::validate`] is the one check, whatever the source: a spec that passes
//! can be deployed (the component itself is checked by loading it).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::Tolerance;
use crate::cluster::{is_internal_topic, validate_topic_name};

/// Longest deployment name, in bytes (it names a file and the group `transform-<name>`).
pub const NAME_MAX_BYTES: usize = 200;

/// Where a transform runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Consumes the input topic and writes the outputs (default).
    #[default]
    Async,
    /// Rewrites produced batches of the input topic before they are appended.
    Inline,
}

impl Mode {
    /// `async` or `inline`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Async => "async",
            Mode::Inline => "inline",
        }
    }
}

/// `processing.guarantee` of an async deployment (Kafka Streams' key; its values without
/// the `_v2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Guarantee {
    /// `at_least_once` (default): outputs are written, then progress is committed; a
    /// crash between the two writes a chunk's outputs again.
    #[default]
    AtLeastOnce,
    /// `exactly_once`: each chunk's outputs, dead letters and progress commit in one
    /// Kafka transaction (transactional id `transform-<name>`); read_committed
    /// consumers see every output once.
    ExactlyOnce,
}

impl Guarantee {
    fn is_default(&self) -> bool {
        *self == Guarantee::AtLeastOnce
    }
}

/// One deployment, as given (JSON body, JSON file or TOML file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformSpec {
    /// Deployment name: 1..=200 bytes of `[a-zA-Z0-9._-]`.
    pub name: String,
    /// Absolute path of the component on the broker host.
    pub wasm: PathBuf,
    /// Input topic.
    pub input: String,
    /// Output topics; the first is where records the plugin does not route go. Optional for
    /// `inline` (it rewrites its input in place).
    #[serde(default)]
    pub outputs: Vec<String>,
    /// Passed to the plugin's `open`.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// `async` (default) or `inline`.
    #[serde(default)]
    pub mode: Mode,
    /// `errors.tolerance`: `none` (default) or `all`.
    #[serde(default, rename = "errors.tolerance")]
    pub tolerance: Tolerance,
    /// `errors.deadletterqueue.topic.name`: where failing records go with `all`.
    #[serde(
        default,
        rename = "errors.deadletterqueue.topic.name",
        skip_serializing_if = "Option::is_none"
    )]
    pub dlq_topic: Option<String>,
    /// `processing.guarantee`: `at_least_once` (default) or `exactly_once` (async only).
    #[serde(
        default,
        rename = "processing.guarantee",
        skip_serializing_if = "Guarantee::is_default"
    )]
    pub guarantee: Guarantee,
}

impl TransformSpec {
    /// Parses a JSON spec (the HTTP body, a persisted file).
    ///
    /// Errors: serde's message (unknown key, wrong type, missing `name`...).
    pub fn from_json(bytes: &[u8]) -> Result<TransformSpec, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("invalid transform spec: {e}"))
    }

    /// Parses a JSON value (an HTTP body after its name was filled in). A bad `mode` or
    /// `errors.tolerance` is named (serde's enum message does not say which key).
    ///
    /// Errors: as [`TransformSpec::from_json`].
    pub fn from_json_value(value: serde_json::Value) -> Result<TransformSpec, String> {
        for (key, allowed) in [
            ("mode", &["async", "inline"][..]),
            ("errors.tolerance", &["none", "all"][..]),
            (
                "processing.guarantee",
                &["at_least_once", "exactly_once"][..],
            ),
        ] {
            if let Some(v) = value.get(key) {
                if !v.as_str().is_some_and(|s| allowed.contains(&s)) {
                    return Err(format!(
                        "invalid transform spec: {key} must be one of {}, got {v}",
                        allowed.join(", ")
                    ));
                }
            }
        }
        serde_json::from_value(value).map_err(|e| format!("invalid transform spec: {e}"))
    }

    /// Parses a TOML spec (a `transform.config.dir` file).
    ///
    /// Errors: the TOML parser's message.
    pub fn from_toml(text: &str) -> Result<TransformSpec, String> {
        toml::from_str(text).map_err(|e| format!("invalid transform spec: {e}"))
    }

    /// The consumer group holding this deployment's progress: `transform-<name>`.
    pub fn group_id(&self) -> String {
        format!("transform-{}", self.name)
    }

    /// `config` as the plugin host takes it.
    pub fn config_pairs(&self) -> Vec<(String, String)> {
        self.config
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The default output topic (the first of `outputs`; the input for `inline`).
    pub fn default_output(&self) -> &str {
        self.outputs.first().map_or(&self.input, |s| s.as_str())
    }

    /// Checks everything but the component: the name, an absolute `wasm` path, topic
    /// names (valid, not internal; no async output equal to the input, which would feed
    /// the transform its own output forever), at least one output for `async`.
    ///
    /// Errors: a message naming the key at fault.
    pub fn validate(&self) -> Result<(), String> {
        if self.name.is_empty() || self.name.len() > NAME_MAX_BYTES {
            return Err(format!(
                "name must be 1 to {NAME_MAX_BYTES} bytes, got {}",
                self.name.len()
            ));
        }
        if !self
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
            || self.name == "."
            || self.name == ".."
        {
            return Err(format!(
                "name {:?} may only contain ASCII letters, digits, '.', '_' and '-'",
                self.name
            ));
        }
        if !self.wasm.is_absolute() {
            return Err(format!(
                "wasm must be an absolute path on the broker host, got {:?}",
                self.wasm.display().to_string()
            ));
        }
        let topic = |key: &str, t: &str| -> Result<(), String> {
            validate_topic_name(t).map_err(|e| format!("{key}: topic {t:?}: {e}"))?;
            if is_internal_topic(t) {
                return Err(format!("{key}: {t} is an internal topic"));
            }
            Ok(())
        };
        topic("input", &self.input)?;
        if self.mode == Mode::Async && self.outputs.is_empty() {
            return Err("outputs: an async transform needs at least one output topic".into());
        }
        for o in &self.outputs {
            topic("outputs", o)?;
            if self.mode == Mode::Async && *o == self.input {
                return Err(format!(
                    "outputs: {o} is also the input topic (the transform would read its own output forever)"
                ));
            }
        }
        if self.guarantee == Guarantee::ExactlyOnce && self.mode != Mode::Async {
            return Err(
                "processing.guarantee: exactly_once needs mode async (an inline transform is part of its producer's write)".into(),
            );
        }
        if let Some(d) = &self.dlq_topic {
            topic("errors.deadletterqueue.topic.name", d)?;
            if *d == self.input {
                return Err(format!(
                    "errors.deadletterqueue.topic.name: {d} is also the input topic"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> TransformSpec {
        TransformSpec::from_json(
            br#"{"name":"r","wasm":"/p/redact.wasm","input":"in","outputs":["out"],
                 "config":{"fields":"email"},"errors.tolerance":"all",
                 "errors.deadletterqueue.topic.name":"dlq"}"#,
        )
        .unwrap()
    }

    #[test]
    fn json_and_toml_use_the_same_keys() {
        let j = spec();
        assert_eq!(j.tolerance, Tolerance::All);
        assert_eq!(j.mode, Mode::Async);
        assert_eq!(j.dlq_topic.as_deref(), Some("dlq"));
        let t = TransformSpec::from_toml(
            r#"
            name = "r"
            wasm = "/p/redact.wasm"
            input = "in"
            outputs = ["out"]
            "errors.tolerance" = "all"
            "errors.deadletterqueue.topic.name" = "dlq"
            [config]
            fields = "email"
            "#,
        )
        .unwrap();
        assert_eq!(j, t);
        let round = TransformSpec::from_json(&serde_json::to_vec(&j).unwrap()).unwrap();
        assert_eq!(round, j);
        assert!(j.validate().is_ok());
    }

    #[test]
    fn bad_specs_are_refused_naming_the_key() {
        type Change = fn(&mut TransformSpec);
        let cases: Vec<(Change, &str)> = vec![
            (|s| s.name = "a/b".into(), "name"),
            (|s| s.name = String::new(), "name"),
            (|s| s.wasm = "redact.wasm".into(), "wasm"),
            (|s| s.input = "bad topic".into(), "input"),
            (|s| s.outputs.clear(), "outputs"),
            (|s| s.outputs = vec!["in".into()], "outputs"),
            (|s| s.outputs = vec!["__consumer_offsets".into()], "outputs"),
            (
                |s| s.dlq_topic = Some("in".into()),
                "errors.deadletterqueue",
            ),
        ];
        for (change, key) in cases {
            let mut s = spec();
            change(&mut s);
            let e = s.validate().unwrap_err();
            assert!(e.starts_with(key), "{e}");
        }
        let unknown = TransformSpec::from_json(br#"{"name":"r","wasm":"/a","input":"i","x":1}"#);
        assert!(unknown.unwrap_err().contains("unknown field"));
    }

    #[test]
    fn inline_needs_no_outputs() {
        let mut s = spec();
        s.mode = Mode::Inline;
        s.outputs.clear();
        assert!(s.validate().is_ok());
        assert_eq!(s.default_output(), "in");
    }
}
