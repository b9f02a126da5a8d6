//! weir transform `redact`: masks the values of JSON object fields named in its config.
//!
//! Config:
//! - `fields` (required): comma-separated field names, e.g. `ssn,card.number` is two names
//!   `ssn` and `card.number` (no paths: a name matches a field at any depth). Names are
//!   compared with the key as written in the JSON, escapes not decoded.
//! - `mask` (optional, default `***`): the replacement, written as a JSON string.
//!
//! A matching field's whole value (string, number, literal, object or array) becomes the
//! mask string. Records with a null value pass unchanged, as do values naming no field (no
//! copy). A value that is not well-formed enough to scan (unterminated string, unbalanced
//! brackets) fails the batch naming the record: passing it on could leak the fields.
//!
//! A small scanner rather than serde_json: it keeps the guest tiny and leaves every byte
//! outside the masked values as the producer wrote it (key order, spacing, numbers).

use weir_plugin_sdk::{Config, Output, Record, Transform};

/// The transform's state: the field names and the encoded mask.
pub struct Redact {
    fields: Vec<Vec<u8>>,
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
            mask_json,
        }
    }

    /// `value` with every named field masked, or `None` when nothing matched (the value
    /// is then to be kept as it is). Errors name what could not be scanned.
    pub fn redact(&self, value: &[u8]) -> Result<Option<Vec<u8>>, String> {
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

impl Transform for Redact {
    fn open(config: &Config) -> Result<Self, String> {
        let fields: Vec<&str> = config
            .get("fields")
            .ok_or("redact: config `fields` is required (comma-separated field names)")?
            .split(',')
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .collect();
        if fields.is_empty() {
            return Err("redact: config `fields` names no field".into());
        }
        Ok(Redact::new(&fields, config.get("mask").unwrap_or("***")))
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
}
