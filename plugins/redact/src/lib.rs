//! weir transform `redact`: masks the values of JSON object fields named in its config,
//! and whatever matches its regexes (PII such as card or phone numbers, e-mail
//! addresses) wherever it appears.
//!
//! Config (at least one of `fields` and `patterns`):
//! - `fields`: comma-separated field names, e.g. `ssn,card.number` is two names `ssn` and
//!   `card.number` (no paths: a name matches a field at any depth). Names are compared
//!   with the key as written in the JSON, escapes not decoded.
//! - `patterns`: comma-separated regexes (Rust `regex` syntax), e.g.
//!   `\d{4}-\d{4}-\d{4}-\d{4},[\w.+-]+@[\w-]+\.[\w.]+`. Commas inside `{m,n}` and
//!   `[...]` do not split; write a literal comma elsewhere as `\,`. Refused at open: a
//!   regex that does not compile, compiles to more than [`REGEX_SIZE_LIMIT_BYTES`], or
//!   matches the empty string (it would mask between every character).
//! - `mask` (optional, default `***`): the replacement.
//!
//! `fields`: a matching field's whole value (string, number, literal, object or array)
//! becomes the mask as a JSON string.
//!
//! `patterns`, applied after `fields`: when the value is JSON (strict validation), every
//! match inside a string value is replaced by the mask (the string is decoded first, so a
//! match may span escapes, and re-encoded after), and a number containing a match becomes
//! the mask as a JSON string (a number cannot hold a mask); object keys are left alone.
//! When the value is not JSON, every match in the raw bytes is replaced by the mask.
//!
//! Records with a null value pass unchanged, as do values where nothing matched (no
//! copy). With `fields`, a value that is not well-formed enough to scan (unterminated
//! string, unbalanced brackets) fails the batch naming the record: passing it on could
//! leak the fields.
//!
//! A small scanner rather than serde_json: it keeps the guest small and leaves every byte
//! outside the masked values as the producer wrote it (key order, spacing, numbers).

use regex::bytes::{Regex, RegexBuilder};
use weir_plugin_sdk::json;
use weir_plugin_sdk::{Config, Output, Record, Transform};

/// Most memory one compiled `patterns` regex may take, in bytes (its program, and again
/// its lazy DFA cache): a limit on what a config can make a guest allocate.
pub const REGEX_SIZE_LIMIT_BYTES: usize = 1 << 20;

/// Most memory all `patterns` together may take once combined into one regex, in bytes.
pub const REGEX_TOTAL_SIZE_LIMIT_BYTES: usize = 4 << 20;

/// The transform's state: the field names, the patterns and the mask.
pub struct Redact {
    fields: Vec<Vec<u8>>,
    /// Every pattern as one alternation (one pass per value; a mask written by one
    /// pattern is never matched again by another).
    patterns: Option<Regex>,
    mask: Vec<u8>,
    mask_json: Vec<u8>,
}

impl Redact {
    /// Builds a redactor for `fields` (names) replacing their values with `mask`.
    pub fn new(fields: &[&str], mask: &str) -> Self {
        let mut mask_json = Vec::with_capacity(mask.len() + 2);
        mask_json.push(b'"');
        for c in mask.chars() {
            match c {
                '"' => mask_json.extend_from_slice(b"\\\""),
                '\\' => mask_json.extend_from_slice(b"\\\\"),
                c if (c as u32) < 0x20 => {
                    mask_json.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes())
                }
                c => {
                    let mut b = [0u8; 4];
                    mask_json.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
                }
            }
        }
        mask_json.push(b'"');
        Redact {
            fields: fields.iter().map(|f| f.as_bytes().to_vec()).collect(),
            patterns: None,
            mask: mask.as_bytes().to_vec(),
            mask_json,
        }
    }

    /// This redactor also masking matches of `patterns` (regexes). Errors, naming the
    /// pattern: a regex that does not compile, is over [`REGEX_SIZE_LIMIT_BYTES`], or
    /// matches the empty string; all of them over [`REGEX_TOTAL_SIZE_LIMIT_BYTES`].
    pub fn with_patterns(mut self, patterns: &[String]) -> Result<Self, String> {
        if patterns.is_empty() {
            self.patterns = None;
            return Ok(self);
        }
        for p in patterns {
            let re = RegexBuilder::new(p)
                .size_limit(REGEX_SIZE_LIMIT_BYTES)
                .dfa_size_limit(REGEX_SIZE_LIMIT_BYTES)
                .build()
                .map_err(|e| format!("redact: config `patterns`: bad regex `{p}`: {e}"))?;
            if re.is_match(b"") {
                return Err(format!(
                    "redact: config `patterns`: regex `{p}` matches the empty string"
                ));
            }
        }
        let combined: Vec<String> = patterns.iter().map(|p| format!("(?:{p})")).collect();
        let re = RegexBuilder::new(&combined.join("|"))
            .size_limit(REGEX_TOTAL_SIZE_LIMIT_BYTES)
            .dfa_size_limit(REGEX_TOTAL_SIZE_LIMIT_BYTES)
            .build()
            .map_err(|e| format!("redact: config `patterns` together: {e}"))?;
        self.patterns = Some(re);
        Ok(self)
    }

    /// `value` with every named field masked, then every pattern match masked, or `None`
    /// when nothing matched (the value is then to be kept as it is). Errors name what
    /// could not be scanned (only with `fields`).
    pub fn redact(&self, value: &[u8]) -> Result<Option<Vec<u8>>, String> {
        let fields = if self.fields.is_empty() {
            None
        } else {
            self.redact_fields(value)?
        };
        let Some(re) = &self.patterns else {
            return Ok(fields);
        };
        let current = fields.as_deref().unwrap_or(value);
        let patterned = if json::validate(current).is_ok() {
            self.patterns_in_json(re, current)
        } else {
            self.replace(re, current)
        };
        Ok(patterned.or(fields))
    }

    /// `text` with every non-empty match of `re` replaced by the mask; `None` when there
    /// is none.
    fn replace(&self, re: &Regex, text: &[u8]) -> Option<Vec<u8>> {
        let mut out: Option<Vec<u8>> = None;
        let mut copied = 0;
        for m in re.find_iter(text).filter(|m| !m.is_empty()) {
            let o = out.get_or_insert_with(|| Vec::with_capacity(text.len()));
            o.extend_from_slice(&text[copied..m.start()]);
            o.extend_from_slice(&self.mask);
            copied = m.end();
        }
        out.map(|mut o| {
            o.extend_from_slice(&text[copied..]);
            o
        })
    }

    /// Pattern masking inside a JSON document (`doc` is valid JSON): string values are
    /// decoded, masked and re-encoded; a number with a match becomes the mask string;
    /// keys and structure are kept byte for byte.
    fn patterns_in_json(&self, re: &Regex, doc: &[u8]) -> Option<Vec<u8>> {
        let mut out: Option<Vec<u8>> = None;
        let mut copied = 0;
        let mut i = 0;
        while i < doc.len() {
            match doc[i] {
                b'"' => {
                    let end = string_end(doc, i).unwrap_or(doc.len());
                    let is_key = doc.get(skip_ws(doc, end)) == Some(&b':');
                    if !is_key && end - i >= 2 {
                        let text = json::unescape(&doc[i + 1..end - 1]);
                        if let Some(masked) = self.replace(re, &text) {
                            let o = out.get_or_insert_with(|| Vec::with_capacity(doc.len()));
                            o.extend_from_slice(&doc[copied..i]);
                            json::write_string(o, &masked);
                            copied = end;
                        }
                    }
                    i = end;
                }
                b'-' | b'0'..=b'9' => {
                    let mut end = i;
                    while end < doc.len()
                        && matches!(doc[end], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
                    {
                        end += 1;
                    }
                    if re.find_iter(&doc[i..end]).any(|m| !m.is_empty()) {
                        let o = out.get_or_insert_with(|| Vec::with_capacity(doc.len()));
                        o.extend_from_slice(&doc[copied..i]);
                        o.extend_from_slice(&self.mask_json);
                        copied = end;
                    }
                    i = end;
                }
                _ => i += 1,
            }
        }
        out.map(|mut o| {
            o.extend_from_slice(&doc[copied..]);
            o
        })
    }

    /// `value` with every named field masked, or `None` when nothing matched.
    fn redact_fields(&self, value: &[u8]) -> Result<Option<Vec<u8>>, String> {
        let mut out: Option<Vec<u8>> = None;
        // Bytes of `value` before `copied` are already in `out`.
        let mut copied = 0;
        let mut i = 0;
        while i < value.len() {
            if value[i] != b'"' {
                i += 1;
                continue;
            }
            let end = string_end(value, i)?;
            let name = &value[i + 1..end - 1];
            let mut j = skip_ws(value, end);
            if value.get(j) != Some(&b':') {
                i = end; // a string value, not a key
                continue;
            }
            j = skip_ws(value, j + 1);
            let value_end = value_end(value, j)?;
            if self.fields.iter().any(|f| f == name) {
                let o = out.get_or_insert_with(|| Vec::with_capacity(value.len()));
                o.extend_from_slice(&value[copied..j]);
                o.extend_from_slice(&self.mask_json);
                copied = value_end;
                i = value_end;
            } else {
                // Scan into objects and arrays: nested fields may match.
                i = j;
            }
        }
        Ok(out.map(|mut o| {
            o.extend_from_slice(&value[copied..]);
            o
        }))
    }
}

fn skip_ws(v: &[u8], mut i: usize) -> usize {
    while matches!(v.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// Index just past the closing quote of the string starting at `v[start] == '"'`.
fn string_end(v: &[u8], start: usize) -> Result<usize, String> {
    let mut i = start + 1;
    while i < v.len() {
        match v[i] {
            b'\\' => i += 2,
            b'"' => return Ok(i + 1),
            _ => i += 1,
        }
    }
    Err(format!("unterminated JSON string at byte {start}"))
}

/// Index just past the JSON value starting at `v[start]`.
fn value_end(v: &[u8], start: usize) -> Result<usize, String> {
    match v.get(start) {
        None => Err(format!("missing JSON value at byte {start}")),
        Some(b'"') => string_end(v, start),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut i = start;
            while i < v.len() {
                match v[i] {
                    b'"' => {
                        i = string_end(v, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            Err(format!("unbalanced JSON object or array at byte {start}"))
        }
        Some(_) => {
            let mut i = start;
            while i < v.len() && !matches!(v[i], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            {
                i += 1;
            }
            Ok(i)
        }
    }
}

/// Splits `patterns` at commas that are outside `[...]` classes and `{m,n}` repetitions
/// and not escaped (`\,` is a literal comma); trims each and drops empty ones.
pub fn split_patterns(patterns: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut class_depth = 0usize;
    let mut in_braces = false;
    let mut escaped = false;
    for c in patterns.chars() {
        if escaped {
            escaped = false;
            if c == ',' && class_depth == 0 && !in_braces {
                cur.push(',');
            } else {
                cur.push('\\');
                cur.push(c);
            }
            continue;
        }
        match c {
            '\\' => {
                escaped = true;
                continue;
            }
            '[' => class_depth += 1,
            ']' => class_depth = class_depth.saturating_sub(1),
            '{' if class_depth == 0 => in_braces = true,
            '}' if class_depth == 0 => in_braces = false,
            ',' if class_depth == 0 && !in_braces => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if escaped {
        cur.push('\\');
    }
    out.push(cur);
    out.into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

impl Transform for Redact {
    fn open(config: &Config) -> Result<Self, String> {
        let fields: Vec<&str> = config
            .get("fields")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .collect();
        let patterns = split_patterns(config.get("patterns").unwrap_or_default());
        if fields.is_empty() && patterns.is_empty() {
            return Err(
                "redact: set `fields` (comma-separated field names) or `patterns` \
                        (comma-separated regexes), or both"
                    .into(),
            );
        }
        Redact::new(&fields, config.get("mask").unwrap_or("***")).with_patterns(&patterns)
    }

    fn apply(&mut self, record: &Record<'_>, out: &mut Output) -> Result<(), String> {
        match record.value() {
            None => out.emit(record),
            Some(v) => match self.redact(v)? {
                None => out.emit(record),
                Some(masked) => out.emit_value(record, Some(&masked)),
            },
        }
        Ok(())
    }
}

weir_plugin_sdk::export_transform!(Redact);

#[cfg(test)]
mod tests {
    use super::*;

    fn r(fields: &[&str], v: &str) -> Result<String, String> {
        Redact::new(fields, "***")
            .redact(v.as_bytes())
            .map(|o| o.map_or_else(|| v.to_string(), |o| String::from_utf8(o).unwrap()))
    }

    #[test]
    fn masks_named_fields_at_any_depth() {
        assert_eq!(
            r(
                &["ssn", "card"],
                r#"{"name":"a","ssn":"123-45","x":{"card":{"n":1},"ssn":7}}"#
            )
            .unwrap(),
            r#"{"name":"a","ssn":"***","x":{"card":"***","ssn":"***"}}"#
        );
        assert_eq!(
            r(&["a"], r#"[{"a" : [1,"]"] , "b":"a"}]"#).unwrap(),
            r#"[{"a" : "***" , "b":"a"}]"#
        );
        assert_eq!(
            r(&["q"], r#"{"k":"say \"q\": no"}"#).unwrap(),
            r#"{"k":"say \"q\": no"}"#
        );
    }

    #[test]
    fn refuses_what_it_cannot_scan() {
        assert!(r(&["a"], r#"{"a":"x"#).is_err());
        assert!(r(&["a"], r#"{"a":{"b":1"#).is_err());
    }

    fn p(patterns: &str, v: &str) -> String {
        let t = Redact::new(&[], "~")
            .with_patterns(&split_patterns(patterns))
            .unwrap();
        t.redact(v.as_bytes())
            .unwrap()
            .map_or_else(|| v.to_string(), |o| String::from_utf8(o).unwrap())
    }

    #[test]
    fn masks_pattern_matches_in_json_strings_and_numbers() {
        let card = r"\d{4}-?\d{4}-?\d{4}-?\d{4}";
        assert_eq!(
            p(
                card,
                r#"{"note":"card 4111-1111-1111-1111, thanks","n":4111111111111111,"ok":12}"#
            ),
            r#"{"note":"card ~, thanks","n":"~","ok":12}"#
        );
        // Keys are left alone; escapes are decoded before matching and the result
        // re-encoded.
        assert_eq!(
            p("secret", r#"{"secret":"a secret \"quoted\"\u0021"}"#),
            r#"{"secret":"a ~ \"quoted\"!"}"#
        );
        // Two patterns in one pass: e-mail and phone numbers.
        assert_eq!(
            p(
                r"[\w.+-]+@[\w-]+\.[\w.]+, \+\d{2} \d{3,4} \d{4}",
                r#"["mail bo.b@ex.org or +33 612 3456"]"#
            ),
            r#"["mail ~ or ~"]"#
        );
        assert_eq!(p("x", r#"{"a":"nothing here"}"#), r#"{"a":"nothing here"}"#);
    }

    #[test]
    fn masks_pattern_matches_in_raw_text_when_not_json() {
        assert_eq!(p(r"\d{3}-\d{2}-\d{4}", "ssn 123-45-6789 end"), "ssn ~ end");
        // Broken JSON is raw text: matches are still masked.
        assert_eq!(p("tok-[a-z]+", r#"{"t":"tok-abc"#), r#"{"t":"~"#);
        // Empty matches (here of `\b`) are ignored.
        assert_eq!(p(r"\bx\b|\b", "a x b"), "a ~ b");
    }

    #[test]
    fn fields_then_patterns() {
        let t = Redact::new(&["ssn"], "***")
            .with_patterns(&split_patterns(r"\d{4}"))
            .unwrap();
        let out = t
            .redact(br#"{"ssn":"123-45-6789","pin":"code 1234"}"#)
            .unwrap()
            .unwrap();
        assert_eq!(out, br#"{"ssn":"***","pin":"code ***"}"#.to_vec());
    }

    #[test]
    fn splits_patterns_at_top_level_commas_only() {
        assert_eq!(
            split_patterns(r" a{1,3} , [,;]x ,b\,c, \d,, "),
            vec!["a{1,3}", "[,;]x", "b,c", r"\d"]
        );
        assert_eq!(split_patterns(""), Vec::<String>::new());
    }

    #[test]
    fn refuses_bad_patterns_at_open() {
        let open = |pairs: &[(&str, &str)]| {
            Redact::open(&Config::new(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ))
        };
        let e = open(&[("patterns", "ok,(unclosed")]).err().unwrap();
        assert!(e.contains("bad regex `(unclosed`"), "{e}");
        let e = open(&[("patterns", r"\d*")]).err().unwrap();
        assert!(e.contains("matches the empty string"), "{e}");
        let e = open(&[("patterns", r"\w{1000}{1000}")]).err().unwrap();
        assert!(e.contains("size limit"), "{e}");
        let e = open(&[("mask", "x")]).err().unwrap();
        assert!(e.contains("`fields`") && e.contains("`patterns`"), "{e}");
        assert!(open(&[("patterns", r"\d{4}")]).is_ok());
    }
}
