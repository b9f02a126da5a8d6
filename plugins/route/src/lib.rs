//! weir transform `route`: sends each record, unchanged, to an output topic named after
//! the value of a JSON field or a header (Kafka Connect's `RegexRouter` and
//! `TimestampRouter` SMTs choose a topic the same way, from the topic name or the time).
//!
//! Config:
//! - what to route on, exactly one of:
//!   - `field`: a JSON field of the value, top-level (`region`) or a dotted path
//!     (`order.region`); its text is a string's contents without quotes, or other JSON as
//!     compact text (`42`, `true`);
//!   - `header`: a header name; its value bytes as UTF-8 (the last header of that name);
//! - `topic.format` (optional, default `${value}`): the topic name, with every `${value}`
//!   replaced by the text, e.g. `orders-${value}`. Must contain `${value}`, and the rest
//!   must be legal topic characters;
//! - `default.topic` (optional): where records without a value go. Without it they go
//!   to the transform's default output topic (the first `--output`).
//!
//! "Without a value" means: the field is missing or JSON `null`, a path step is not an
//! object, the record value is null (tombstone) or not JSON; the header is missing or
//! has a null value. Such records are not errors: nothing about them is wrong for the
//! topic they came from.
//!
//! A record whose text makes an illegal Kafka topic name (empty, `.` or `..`, longer
//! than [`MAX_TOPIC_NAME_BYTES`], a character outside `[a-zA-Z0-9._-]`, not UTF-8) fails
//! the batch with an error naming the record and the name. It is not sent to the default
//! topic: a value that cannot be a topic is bad data, and the host's error policy
//! (FAILED state, or the dead-letter topic with `errors.tolerance=all`) is where bad data
//! is meant to surface, not silently mixed into a topic that looks healthy.
//!
//! The output topics must exist or be creatable (auto-creation) on the broker; the plugin
//! only names them.

use weir_plugin_sdk::select::{Selected, Selector};
use weir_plugin_sdk::{Config, Output, Record, Transform};

/// Kafka's longest topic name (`Topic.MAX_NAME_LENGTH`), in bytes.
pub const MAX_TOPIC_NAME_BYTES: usize = 249;

/// The placeholder in `topic.format`.
const PLACEHOLDER: &str = "${value}";

/// Why `name` is not a legal Kafka topic name (`org.apache.kafka.common.internals.Topic.
/// validate`), or `None` when it is.
pub fn topic_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("it is empty".into());
    }
    if name == "." || name == ".." {
        return Some("`.` and `..` are reserved".into());
    }
    if name.len() > MAX_TOPIC_NAME_BYTES {
        return Some(format!(
            "it is {} bytes long, over Kafka's {MAX_TOPIC_NAME_BYTES}",
            name.len()
        ));
    }
    name.chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        .map(|c| format!("{c:?} is not one of [a-zA-Z0-9._-]"))
}

/// At most the first 80 characters of `s`, for error messages about long names.
fn shorten(s: &str) -> String {
    match s.char_indices().nth(80) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

/// The transform's state.
#[derive(Debug)]
pub struct Route {
    selector: Selector,
    /// `topic.format` split at each `${value}`: `parts.len() >= 2`.
    parts: Vec<String>,
    default_topic: Option<String>,
    /// Reused buffer for the topic name of the current record.
    topic: String,
}

impl Route {
    /// The topic for `record`: `Ok(None)` for the default output topic.
    fn topic_for(&mut self, record: &Record<'_>) -> Result<Option<&str>, String> {
        let text = match self.selector.select(record) {
            Selected::Found(t) => t,
            Selected::Absent | Selected::NotJson(_) => return Ok(self.default_topic.as_deref()),
        };
        let Ok(text) = std::str::from_utf8(&text) else {
            return Err(
                "route: the value to route on is not UTF-8, so it cannot name a topic".into(),
            );
        };
        self.topic.clear();
        for (i, part) in self.parts.iter().enumerate() {
            if i > 0 {
                self.topic.push_str(text);
            }
            self.topic.push_str(part);
        }
        if let Some(why) = topic_name_problem(&self.topic) {
            return Err(format!(
                "route: `{}` is not a legal Kafka topic name: {why}",
                shorten(&self.topic)
            ));
        }
        Ok(Some(&self.topic))
    }
}

impl Transform for Route {
    fn open(config: &Config) -> Result<Self, String> {
        let selector = Selector::from_config(config, "route")?;
        let format = config.get("topic.format").unwrap_or(PLACEHOLDER);
        let parts: Vec<String> = format.split(PLACEHOLDER).map(str::to_string).collect();
        if parts.len() < 2 {
            return Err(format!(
                "route: config `topic.format` (`{format}`) must contain `{PLACEHOLDER}`"
            ));
        }
        // The fixed parts alone must be legal characters (their length depends on the
        // value, so it is checked per record).
        let fixed: String = parts.concat();
        if let Some(bad) = fixed
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(format!(
                "route: config `topic.format` (`{format}`): {bad:?} is not one of \
                 [a-zA-Z0-9._-] outside `{PLACEHOLDER}`"
            ));
        }
        let default_topic = config.get("default.topic").map(str::to_string);
        if let Some(why) = default_topic.as_deref().and_then(topic_name_problem) {
            return Err(format!(
                "route: config `default.topic` is not a legal Kafka topic name: {why}"
            ));
        }
        Ok(Route {
            selector,
            parts,
            default_topic,
            topic: String::new(),
        })
    }

    fn apply(&mut self, record: &Record<'_>, out: &mut Output) -> Result<(), String> {
        match self.topic_for(record)? {
            Some(topic) => out.emit_to(topic, record),
            None => out.emit(record),
        }
        Ok(())
    }
}

weir_plugin_sdk::export_transform!(Route);

#[cfg(test)]
mod tests {
    use super::*;
    use weir_plugin_sdk::testing::{open, run, TestRecord};

    fn topics(config: &[(&str, &str)], records: &[TestRecord]) -> Vec<Option<String>> {
        let mut r: Route = open(config).unwrap();
        let out = run(&mut r, records).unwrap();
        assert_eq!(out.len(), records.len());
        for (i, o) in out.iter().enumerate() {
            assert_eq!(o.input_index as usize, i);
            assert_eq!(o.record, records[i], "records pass unchanged");
        }
        out.into_iter().map(|o| o.topic).collect()
    }

    fn some(s: &str) -> Option<String> {
        Some(s.to_string())
    }

    #[test]
    fn routes_on_a_field_with_a_format_and_a_default() {
        let recs: Vec<TestRecord> = [
            r#"{"region":"eu"}"#,
            r#"{"region":"us","id":1}"#,
            r#"{"id":2}"#,
            r#"{"region":null}"#,
            "not json",
            r#"{"region":7}"#,
        ]
        .iter()
        .map(TestRecord::value)
        .chain([TestRecord::default()])
        .collect();
        assert_eq!(
            topics(&[("field", "region")], &recs),
            [some("eu"), some("us"), None, None, None, some("7"), None]
        );
        assert_eq!(
            topics(
                &[
                    ("field", "region"),
                    ("topic.format", "orders-${value}"),
                    ("default.topic", "orders-unrouted"),
                ],
                &recs
            ),
            [
                some("orders-eu"),
                some("orders-us"),
                some("orders-unrouted"),
                some("orders-unrouted"),
                some("orders-unrouted"),
                some("orders-7"),
                some("orders-unrouted"),
            ]
        );
    }

    #[test]
    fn routes_on_a_header() {
        let recs = vec![
            TestRecord::value("a").header("tenant", Some(b"acme")),
            TestRecord::value("b").header("tenant", None),
            TestRecord::value("c"),
        ];
        assert_eq!(
            topics(
                &[("header", "tenant"), ("topic.format", "${value}.events")],
                &recs
            ),
            [some("acme.events"), None, None]
        );
    }

    #[test]
    fn an_illegal_topic_name_fails_naming_the_record() {
        let mut r: Route = open(&[("field", "region")]).unwrap();
        for (bad, why) in [
            (r#"{"region":"eu west"}"#, "' ' is not one of"),
            (r#"{"region":""}"#, "empty"),
            (r#"{"region":".."}"#, "reserved"),
            (r#"{"region":{"a":1}}"#, "'{' is not one of"),
        ] {
            let e = run(&mut r, &[TestRecord::value("{}"), TestRecord::value(bad)]).unwrap_err();
            assert_eq!(e.record_index, Some(1), "{bad}");
            assert!(e.message.contains(why), "{bad}: {}", e.message);
        }
        let long = format!(r#"{{"region":"{}"}}"#, "x".repeat(250));
        let e = run(&mut r, &[TestRecord::value(long)]).unwrap_err();
        assert!(e.message.contains("250 bytes long"), "{}", e.message);
        let mut r: Route = open(&[("header", "h")]).unwrap();
        let e = run(&mut r, &[TestRecord::value("v").header("h", Some(b"\xff"))]).unwrap_err();
        assert!(e.message.contains("not UTF-8"), "{}", e.message);
    }

    #[test]
    fn refuses_bad_config() {
        for cfg in [
            &[][..],
            &[("field", "a"), ("header", "h")],
            &[("field", "a"), ("topic.format", "fixed")],
            &[("field", "a"), ("topic.format", "a b-${value}")],
            &[("field", "a"), ("default.topic", "no/slash")],
            &[("field", "a"), ("default.topic", "")],
        ] {
            let e = open::<Route>(cfg).unwrap_err();
            assert!(e.starts_with("route: "), "{e}");
        }
    }

    #[test]
    fn topic_names_as_kafka_validates_them() {
        assert_eq!(topic_name_problem("orders.eu_1-x"), None);
        assert_eq!(topic_name_problem(&"a".repeat(249)), None);
        assert!(topic_name_problem(&"a".repeat(250)).is_some());
        assert!(topic_name_problem("é").is_some());
    }
}
