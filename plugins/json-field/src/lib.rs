//! weir partitioner `json-field`: records with the same value in a JSON field of their
//! value go to the same partition, whatever their key.
//!
//! Config:
//! - `field` (required): the field, top-level (`user_id`) or a dotted path into nested
//!   objects (`user.id`); see `weir_plugin_sdk::json::FieldPath` (keys compared after
//!   decoding escapes, arrays not indexed, the last of repeated keys counts).
//!
//! Partition: `(murmur2(text) & 0x7fffffff) % partition_count`, Kafka's default
//! partitioner applied to the field's text instead of the key — the same function as the
//! `murmur2` plugin (shared through `weir_plugin_sdk::murmur2`). The text of a string is
//! its UTF-8 contents without quotes, escapes decoded (`{"user_id":"u1"}` partitions
//! like a record keyed `u1` under `murmur2`); a number, `true` or `false` is its JSON text
//! as written (`42`, `4.20`, `true`: `42` and `42.0` are different texts); an object or
//! array is its compact JSON text (whitespace outside strings removed).
//!
//! Fallback, so that no record is refused: when the value is null, is not JSON (strict
//! RFC 8259 validation of the whole value), lacks the field, or holds JSON `null` there,
//! the record is partitioned as `murmur2` would: murmur2 of the key, or round-robin when
//! it has no key. This keeps keyed non-JSON records (and tombstones, whose key carries
//! the identity) together with their key, and never fails a produce over a record's shape.

use weir_plugin_sdk::json::{FieldPath, Kind};
use weir_plugin_sdk::murmur2::{partition_for_bytes, RoundRobin};
use weir_plugin_sdk::{Config, Partitioner};

/// The partitioner's state: the field and the spreader for records with nothing to hash.
pub struct JsonField {
    path: FieldPath,
    keyless: RoundRobin,
}

impl JsonField {
    /// A partitioner on the field at `path` (a dotted path). Errors: an empty path or an
    /// empty segment.
    pub fn new(path: &str) -> Result<Self, String> {
        Ok(JsonField {
            path: FieldPath::parse(path).map_err(|e| format!("json-field: config `field`: {e}"))?,
            keyless: RoundRobin::new(),
        })
    }
}

impl Partitioner for JsonField {
    fn open(config: &Config) -> Result<Self, String> {
        let field = config.get("field").ok_or(
            "json-field: config `field` is required (a JSON field name such as `user_id`, \
             or a dotted path such as `user.id`)",
        )?;
        JsonField::new(field)
    }

    fn partition(&mut self, key: Option<&[u8]>, value: Option<&[u8]>, partition_count: u32) -> u32 {
        let field = value
            .and_then(|v| self.path.lookup(v).ok().flatten())
            .filter(|v| v.kind() != Kind::Null);
        match (field, key) {
            (Some(v), _) => partition_for_bytes(&v.text(), partition_count),
            (None, Some(k)) => partition_for_bytes(k, partition_count),
            (None, None) => self.keyless.next_partition(partition_count),
        }
    }
}

weir_plugin_sdk::export_partitioner!(JsonField);

#[cfg(test)]
mod tests {
    use super::*;

    fn p(field: &str, key: Option<&str>, value: &str) -> u32 {
        JsonField::new(field).unwrap().partition(
            key.map(str::as_bytes),
            Some(value.as_bytes()),
            1000,
        )
    }

    fn by_bytes(b: &str) -> u32 {
        partition_for_bytes(b.as_bytes(), 1000)
    }

    #[test]
    fn hashes_the_fields_text() {
        // Kafka's `UtilsTest.testMurmur2`: murmur2("21") = -973932308.
        let want = (-973_932_308i32 as u32 & 0x7fff_ffff) % 1000;
        assert_eq!(p("user_id", Some("k"), r#"{"user_id":"21"}"#), want);
        // A number hashes as its JSON text: the same partition as the string "21".
        assert_eq!(p("user_id", None, r#"{"user_id": 21}"#), want);
        assert_eq!(p("user.id", None, r#"{"user":{"id":"21"},"x":1}"#), want);
        assert_eq!(p("a", None, r#"{"a":"\u0032\u0031"}"#), want);
        assert_eq!(p("ok", None, r#"{"ok":true}"#), by_bytes("true"));
        assert_eq!(
            p("o", None, r#"{"o": {"b": [1, 2]}}"#),
            by_bytes(r#"{"b":[1,2]}"#)
        );
    }

    #[test]
    fn falls_back_to_the_key_then_spreads() {
        let by_key = by_bytes("the-key");
        for value in [
            "not json",
            r#"{"other":1}"#,
            r#"{"user_id":null}"#,
            r#"{"user_id":"x""#,
            r#"[{"user_id":"x"}]"#,
        ] {
            assert_eq!(p("user_id", Some("the-key"), value), by_key, "{value}");
        }
        let mut j = JsonField::new("user_id").unwrap();
        assert_eq!(j.partition(Some(b"the-key"), None, 1000), by_key);
        let spread: Vec<u32> = (0..4).map(|_| j.partition(None, Some(b"{}"), 3)).collect();
        assert_eq!(spread, vec![0, 1, 2, 0]);
    }

    #[test]
    fn refuses_a_missing_or_empty_field() {
        assert!(JsonField::open(&Config::default()).is_err());
        assert!(JsonField::new("a..b").is_err());
    }
}
