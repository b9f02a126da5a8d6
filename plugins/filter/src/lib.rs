//! weir transform `filter`: keeps the records that match a predicate on a JSON field of
//! the value or on a header, drops the others. Records pass unchanged (one copy of their
//! bytes, same topic).
//!
//! Config (in the spirit of Kafka Connect's `Filter` SMT and its predicates):
//! - what to look at, exactly one of:
//!   - `field`: a JSON field of the value, top-level (`status`) or a dotted path
//!     (`user.country`); its text is a string's contents without quotes, or other JSON
//!     as compact text (`42`, `true`, `{"a":1}`);
//!   - `header`: a header name; its value bytes (the last header of that name counts);
//! - the predicate, exactly one of:
//!   - `equals=TEXT`: the text is exactly `TEXT` (bytes compared);
//!   - `not.equals=TEXT`: the text is not `TEXT` — including when the field or header is
//!     absent (the exact complement of `equals` on JSON records);
//!   - `matches=REGEX`: the whole text matches `REGEX` (Rust `regex` syntax, anchored at
//!     both ends as Java's `Matcher.matches` and Kafka Connect's `TopicNameMatches`:
//!     write `.*word.*` to search);
//!   - `exists=true|false`: the field or header is there (or is not);
//! - `on.invalid` (optional, `field` only): what to do with a record whose value is not
//!   JSON: `drop` (default), `keep`, or `fail` (the batch fails with an error naming the
//!   record, which the host's error policy then handles: FAILED state or dead-letter
//!   topic).
//!
//! Absent means: the field is missing or JSON `null`, a path step is not an object, the
//! record value is null (a tombstone has no fields); the header is missing or has a null
//! value. An absent field matches `not.equals` and `exists=false` only. A non-JSON value
//! is not "absent": it follows `on.invalid`, whatever the predicate.
//!
//! Errors at open (the plugin is refused at load): no or both of `field` and `header`,
//! no or several predicates, an `exists` other than `true`/`false`, an `on.invalid`
//! other than `drop`/`keep`/`fail`, a regex that does not compile or compiles to more
//! than [`REGEX_SIZE_LIMIT_BYTES`].

use weir_plugin_sdk::select::{Selected, Selector};
use weir_plugin_sdk::{Config, Output, Record, Transform};

/// Most memory one compiled `matches` regex may take, in bytes (its program, and again
/// its lazy DFA cache): a limit on what a config can make a guest allocate.
pub const REGEX_SIZE_LIMIT_BYTES: usize = 1 << 20;

/// The predicate on the selected text.
#[derive(Debug)]
enum Predicate {
    Equals(Vec<u8>),
    NotEquals(Vec<u8>),
    Matches(regex::bytes::Regex),
    Exists(bool),
}

/// What to do with a record whose value is not JSON (config `on.invalid`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnInvalid {
    /// Drop it (default).
    Drop,
    /// Keep it.
    Keep,
    /// Fail the batch, naming the record.
    Fail,
}

/// The transform's state: selector, predicate, invalid-value policy.
#[derive(Debug)]
pub struct Filter {
    selector: Selector,
    predicate: Predicate,
    on_invalid: OnInvalid,
}

impl Filter {
    /// Whether `record` is kept; `Err` when its value is not JSON and `on.invalid=fail`.
    pub fn keeps(&self, record: &Record<'_>) -> Result<bool, String> {
        let text = match self.selector.select(record) {
            Selected::Found(t) => Some(t),
            Selected::Absent => None,
            Selected::NotJson(e) => {
                return match self.on_invalid {
                    OnInvalid::Drop => Ok(false),
                    OnInvalid::Keep => Ok(true),
                    OnInvalid::Fail => Err(format!("filter: the record value is {e}")),
                }
            }
        };
        Ok(match (&self.predicate, text) {
            (Predicate::Equals(want), Some(t)) => t.as_ref() == want.as_slice(),
            (Predicate::NotEquals(want), Some(t)) => t.as_ref() != want.as_slice(),
            (Predicate::Matches(re), Some(t)) => re.is_match(&t),
            (Predicate::Exists(want), found) => *want == found.is_some(),
            (Predicate::Equals(_) | Predicate::Matches(_), None) => false,
            (Predicate::NotEquals(_), None) => true,
        })
    }
}

fn predicate(config: &Config) -> Result<Predicate, String> {
    let given: Vec<&str> = ["equals", "not.equals", "matches", "exists"]
        .into_iter()
        .filter(|k| config.get(k).is_some())
        .collect();
    let [which] = given.as_slice() else {
        return Err(format!(
            "filter: set exactly one predicate of `equals`, `not.equals`, `matches` and \
             `exists` (got {})",
            if given.is_empty() {
                "none".to_string()
            } else {
                given.join(", ")
            }
        ));
    };
    let arg = config.get(which).unwrap_or_default();
    match *which {
        "equals" => Ok(Predicate::Equals(arg.as_bytes().to_vec())),
        "not.equals" => Ok(Predicate::NotEquals(arg.as_bytes().to_vec())),
        "matches" => regex::bytes::RegexBuilder::new(&format!("^(?:{arg})$"))
            .size_limit(REGEX_SIZE_LIMIT_BYTES)
            .dfa_size_limit(REGEX_SIZE_LIMIT_BYTES)
            .build()
            .map(Predicate::Matches)
            .map_err(|e| format!("filter: config `matches`: bad regex `{arg}`: {e}")),
        _ => match arg {
            "true" => Ok(Predicate::Exists(true)),
            "false" => Ok(Predicate::Exists(false)),
            other => Err(format!(
                "filter: config `exists` must be `true` or `false`, not `{other}`"
            )),
        },
    }
}

impl Transform for Filter {
    fn open(config: &Config) -> Result<Self, String> {
        let selector = Selector::from_config(config, "filter")?;
        let predicate = predicate(config)?;
        let on_invalid = match config.get("on.invalid") {
            None | Some("drop") => OnInvalid::Drop,
            Some("keep") => OnInvalid::Keep,
            Some("fail") => OnInvalid::Fail,
            Some(other) => {
                return Err(format!(
                    "filter: config `on.invalid` must be `drop`, `keep` or `fail`, not `{other}`"
                ))
            }
        };
        if matches!(selector, Selector::Header(_)) && config.get("on.invalid").is_some() {
            return Err("filter: config `on.invalid` applies to `field` only \
                        (a header has no JSON to be invalid)"
                .into());
        }
        Ok(Filter {
            selector,
            predicate,
            on_invalid,
        })
    }

    fn apply(&mut self, record: &Record<'_>, out: &mut Output) -> Result<(), String> {
        if self.keeps(record)? {
            out.emit(record);
        }
        Ok(())
    }
}

weir_plugin_sdk::export_transform!(Filter);

#[cfg(test)]
mod tests {
    use super::*;
    use weir_plugin_sdk::testing::{open, run, TestRecord};

    /// Indexes of the kept records.
    fn kept(config: &[(&str, &str)], records: &[TestRecord]) -> Vec<u32> {
        let mut f: Filter = open(config).unwrap();
        run(&mut f, records)
            .unwrap()
            .iter()
            .map(|o| o.input_index)
            .collect()
    }

    fn docs() -> Vec<TestRecord> {
        [
            r#"{"status":"ok","n":1}"#,        // 0
            r#"{"status":"failed","n":2}"#,    // 1
            r#"{"n":3}"#,                      // 2: no status
            r#"{"status":null}"#,              // 3: null counts as absent
            "not json",                        // 4
            r#"{"status":"ok-ish","n":2.50}"#, // 5
        ]
        .iter()
        .map(TestRecord::value)
        .collect()
    }

    #[test]
    fn field_predicates() {
        let d = docs();
        assert_eq!(kept(&[("field", "status"), ("equals", "ok")], &d), [0]);
        assert_eq!(
            kept(&[("field", "status"), ("not.equals", "ok")], &d),
            [1, 2, 3, 5]
        );
        assert_eq!(
            kept(&[("field", "status"), ("matches", "ok.*")], &d),
            [0, 5]
        );
        // Anchored: a regex must match the whole text.
        assert_eq!(
            kept(&[("field", "status"), ("matches", "k")], &d),
            [] as [u32; 0]
        );
        assert_eq!(
            kept(&[("field", "status"), ("exists", "true")], &d),
            [0, 1, 5]
        );
        assert_eq!(
            kept(&[("field", "status"), ("exists", "false")], &d),
            [2, 3]
        );
        // Numbers compare as written.
        assert_eq!(kept(&[("field", "n"), ("equals", "2.50")], &d), [5]);
        assert_eq!(kept(&[("field", "n"), ("matches", r"\d+")], &d), [0, 1, 2]);
    }

    #[test]
    fn nested_fields_and_tombstones() {
        let recs = vec![
            TestRecord::value(r#"{"user":{"country":"FR"}}"#),
            TestRecord::value(r#"{"user":"FR"}"#),
            TestRecord::default(), // null value
        ];
        assert_eq!(
            kept(&[("field", "user.country"), ("equals", "FR")], &recs),
            [0]
        );
        assert_eq!(
            kept(&[("field", "user.country"), ("exists", "false")], &recs),
            [1, 2]
        );
    }

    #[test]
    fn on_invalid_policies() {
        let d = docs();
        let cfg = |policy| {
            [
                ("field", "status"),
                ("exists", "false"),
                ("on.invalid", policy),
            ]
        };
        assert_eq!(kept(&cfg("drop"), &d), [2, 3]);
        assert_eq!(kept(&cfg("keep"), &d), [2, 3, 4]);
        let mut f: Filter = open(&cfg("fail")).unwrap();
        let e = run(&mut f, &d).unwrap_err();
        assert_eq!(e.record_index, Some(4));
        assert!(e.message.contains("not JSON at byte 0"), "{}", e.message);
    }

    #[test]
    fn header_predicates() {
        let recs = vec![
            TestRecord::value("a").header("tenant", Some(b"acme")),
            TestRecord::value("b")
                .header("tenant", Some(b"acme"))
                .header("tenant", Some(b"globex")),
            TestRecord::value("c").header("tenant", None),
            TestRecord::value("d"),
        ];
        assert_eq!(
            kept(&[("header", "tenant"), ("equals", "acme")], &recs),
            [0]
        );
        assert_eq!(
            kept(&[("header", "tenant"), ("matches", "glo.*|ac.e")], &recs),
            [0, 1]
        );
        assert_eq!(
            kept(&[("header", "tenant"), ("exists", "false")], &recs),
            [2, 3]
        );
        assert_eq!(
            kept(&[("header", "tenant"), ("not.equals", "acme")], &recs),
            [1, 2, 3]
        );
    }

    #[test]
    fn refuses_bad_config() {
        for cfg in [
            &[("equals", "x")][..],
            &[("field", "a"), ("header", "h"), ("equals", "x")],
            &[("field", "a")],
            &[("field", "a"), ("equals", "x"), ("exists", "true")],
            &[("field", "a"), ("exists", "yes")],
            &[("field", "a"), ("matches", "(unclosed")],
            &[("field", "a"), ("equals", "x"), ("on.invalid", "ignore")],
            &[("header", "h"), ("equals", "x"), ("on.invalid", "keep")],
            &[("field", "a..b"), ("equals", "x")],
        ] {
            let e = open::<Filter>(cfg).unwrap_err();
            assert!(e.starts_with("filter: "), "{e}");
        }
        let e = open::<Filter>(&[("field", "a"), ("matches", "(unclosed")]).unwrap_err();
        assert!(e.contains("bad regex `(unclosed`"), "{e}");
        let e = open::<Filter>(&[("field", "a"), ("matches", r"\w{1000}{1000}")]).unwrap_err();
        assert!(e.contains("size limit"), "{e}");
    }
}
