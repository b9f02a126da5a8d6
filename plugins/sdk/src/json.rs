//! JSON record values without a JSON library (a guest stays small and sees the bytes the
//! producer wrote): strict validation (RFC 8259), field lookup by a dotted path, the
//! "text" of a value that plugins hash, compare and route on, and string escaping.
//!
//! Nothing here allocates for a value it does not change, and nothing panics on any
//! input: a document nested deeper than [`MAX_DEPTH`] is refused rather than recursed
//! into.

use std::borrow::Cow;
use std::fmt;

/// Deepest nesting of objects and arrays accepted; a deeper document is not JSON as far
/// as weir's plugins are concerned (it bounds the validator's recursion).
pub const MAX_DEPTH: usize = 128;

/// Most segments in a [`FieldPath`] (a path can never be deeper than a document).
pub const MAX_PATH_SEGMENTS: usize = MAX_DEPTH;

/// Why a value is not JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError {
    /// Byte offset in the value where reading failed.
    pub byte_offset: usize,
    /// What was wrong.
    pub what: &'static str,
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not JSON at byte {}: {}", self.byte_offset, self.what)
    }
}

/// The kind of a JSON value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `"..."`
    String,
    /// `-1.5e3`
    Number,
    /// `true` or `false`
    Bool,
    /// `null`
    Null,
    /// `{...}`
    Object,
    /// `[...]`
    Array,
}

/// One JSON value inside a document: its kind and its exact bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Value<'a> {
    raw: &'a [u8],
    kind: Kind,
}

impl<'a> Value<'a> {
    /// The value's kind.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The value's bytes exactly as written (a string with its quotes and escapes).
    pub fn raw(&self) -> &'a [u8] {
        self.raw
    }

    /// The value as plugins hash, compare and route on it: a string's contents as UTF-8
    /// (no quotes, escapes decoded); a number, boolean or null as written; an object or
    /// array as compact JSON (whitespace outside strings removed, nothing else changed).
    /// Borrows unless something had to change.
    pub fn text(&self) -> Cow<'a, [u8]> {
        match self.kind {
            Kind::String => unescape(&self.raw[1..self.raw.len() - 1]),
            Kind::Number | Kind::Bool | Kind::Null => Cow::Borrowed(self.raw),
            Kind::Object | Kind::Array => compact(self.raw),
        }
    }
}

/// Checks that `doc` is one JSON value (RFC 8259: UTF-8, any value at the top level,
/// whitespace around it) nested at most [`MAX_DEPTH`] deep; returns its kind.
pub fn validate(doc: &[u8]) -> Result<Kind, JsonError> {
    if let Err(e) = std::str::from_utf8(doc) {
        return Err(JsonError {
            byte_offset: e.valid_up_to(),
            what: "invalid UTF-8",
        });
    }
    let mut p = Parser { doc, pos: 0 };
    let kind = p.value(0)?;
    p.ws();
    if p.pos != doc.len() {
        return Err(p.err("bytes after the value"));
    }
    Ok(kind)
}

/// A field of a JSON object, possibly nested: `user_id` is the top-level field
/// `user_id`, `user.id` is field `id` of the object in field `user`.
///
/// Segments are compared with object keys after decoding the keys' escapes. A field name
/// containing a dot cannot be addressed; arrays are not indexed (a path through an array
/// finds nothing). When an object repeats a key, the last one counts (as in JavaScript
/// and most JSON libraries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldPath {
    segments: Vec<String>,
}

impl FieldPath {
    /// Parses a dotted path. Errors (as text for a plugin's `open`): an empty path, an
    /// empty segment (`a..b`, `.a`), more than [`MAX_PATH_SEGMENTS`] segments.
    pub fn parse(path: &str) -> Result<Self, String> {
        let path = path.trim();
        if path.is_empty() {
            return Err("the field path is empty".into());
        }
        let segments: Vec<String> = path.split('.').map(str::to_string).collect();
        if segments.iter().any(String::is_empty) {
            return Err(format!("the field path `{path}` has an empty segment"));
        }
        if segments.len() > MAX_PATH_SEGMENTS {
            return Err(format!(
                "the field path `{path}` has more than {MAX_PATH_SEGMENTS} segments"
            ));
        }
        Ok(FieldPath { segments })
    }

    /// The segments, outermost first.
    pub fn segments(&self) -> &[String] {
        &self.segments
    }

    /// The value at this path in `doc`: `Ok(None)` when `doc` is JSON but has no such
    /// field (including when a step is not an object); `Err` when `doc` is not JSON (the
    /// whole document is validated, wherever the field is). A JSON `null` is returned
    /// as a value of kind [`Kind::Null`]; the caller decides what it means.
    pub fn lookup<'a>(&self, doc: &'a [u8]) -> Result<Option<Value<'a>>, JsonError> {
        validate(doc)?;
        let mut p = Parser { doc, pos: 0 };
        p.ws();
        let mut current = p.value_span()?;
        for segment in &self.segments {
            if current.kind != Kind::Object {
                return Ok(None);
            }
            match find_member(doc, current, segment.as_bytes())? {
                Some(v) => current = v,
                None => return Ok(None),
            }
        }
        Ok(Some(current))
    }
}

/// The last member named `name` of the object `object` (a validated span of `doc`).
fn find_member<'a>(
    doc: &'a [u8],
    object: Value<'a>,
    name: &[u8],
) -> Result<Option<Value<'a>>, JsonError> {
    let start = object.raw.as_ptr() as usize - doc.as_ptr() as usize;
    let mut p = Parser {
        doc,
        pos: start + 1,
    };
    let mut found = None;
    p.ws();
    if p.peek() == Some(b'}') {
        return Ok(None);
    }
    loop {
        p.ws();
        let key_start = p.pos;
        p.string()?;
        let key = unescape(&doc[key_start + 1..p.pos - 1]);
        p.ws();
        p.expect(b':', "expected `:` after an object key")?;
        p.ws();
        let value = p.value_span()?;
        if key.as_ref() == name {
            found = Some(value);
        }
        p.ws();
        match p.next() {
            Some(b',') => continue,
            Some(b'}') => return Ok(found),
            _ => return Err(p.err("expected `,` or `}` in an object")),
        }
    }
}

/// Decodes the contents of a JSON string (between the quotes): escapes become the
/// characters they stand for; a lone surrogate escape becomes U+FFFD. Borrows when there
/// is no escape. Expects validated input; malformed escapes are kept as written.
pub fn unescape(inner: &[u8]) -> Cow<'_, [u8]> {
    if !inner.contains(&b'\\') {
        return Cow::Borrowed(inner);
    }
    let mut out = Vec::with_capacity(inner.len());
    let mut i = 0;
    while i < inner.len() {
        let b = inner[i];
        if b != b'\\' || i + 1 >= inner.len() {
            out.push(b);
            i += 1;
            continue;
        }
        let simple = match inner[i + 1] {
            b'"' => Some(b'"'),
            b'\\' => Some(b'\\'),
            b'/' => Some(b'/'),
            b'b' => Some(0x08),
            b'f' => Some(0x0c),
            b'n' => Some(b'\n'),
            b'r' => Some(b'\r'),
            b't' => Some(b'\t'),
            _ => None,
        };
        if let Some(c) = simple {
            out.push(c);
            i += 2;
            continue;
        }
        let Some(hi) = hex4(inner, i + 2).filter(|_| inner[i + 1] == b'u') else {
            out.push(b);
            i += 1;
            continue;
        };
        i += 6;
        let c = if (0xd800..0xdc00).contains(&hi) {
            match (inner.get(i..i + 2), hex4(inner, i + 2)) {
                (Some(b"\\u"), Some(lo)) if (0xdc00..0xe000).contains(&lo) => {
                    i += 6;
                    char::from_u32(0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00))
                }
                _ => None,
            }
        } else {
            char::from_u32(hi)
        };
        let mut buf = [0u8; 4];
        out.extend_from_slice(
            c.unwrap_or(char::REPLACEMENT_CHARACTER)
                .encode_utf8(&mut buf)
                .as_bytes(),
        );
    }
    Cow::Owned(out)
}

/// The four hex digits at `s[at..at + 4]` as a number.
fn hex4(s: &[u8], at: usize) -> Option<u32> {
    let digits = s.get(at..at + 4)?;
    let text = std::str::from_utf8(digits).ok()?;
    if !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    u32::from_str_radix(text, 16).ok()
}

/// Appends `s` to `out` as a JSON string, quotes included: `"` and `\` escaped, control
/// characters as `\uXXXX` (or their short escapes); everything else copied as is.
pub fn write_string(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    for &b in s {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b if b < 0x20 => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
            b => out.push(b),
        }
    }
    out.push(b'"');
}

/// `raw` (a validated object or array) without whitespace outside strings.
fn compact(raw: &[u8]) -> Cow<'_, [u8]> {
    let mut out: Option<Vec<u8>> = None;
    let mut in_string = false;
    let mut escaped = false;
    for (i, &b) in raw.iter().enumerate() {
        let keep = if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            true
        } else {
            if b == b'"' {
                in_string = true;
            }
            !is_ws(b)
        };
        match (&mut out, keep) {
            (Some(o), true) => o.push(b),
            (None, false) => out = Some(raw[..i].to_vec()),
            _ => {}
        }
    }
    out.map_or(Cow::Borrowed(raw), Cow::Owned)
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// A strict recursive-descent reader over a document.
struct Parser<'a> {
    doc: &'a [u8],
    pos: usize,
}

impl<'a> Parser<'a> {
    fn err(&self, what: &'static str) -> JsonError {
        JsonError {
            byte_offset: self.pos,
            what,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.doc.get(self.pos).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek();
        if b.is_some() {
            self.pos += 1;
        }
        b
    }

    fn expect(&mut self, want: u8, what: &'static str) -> Result<(), JsonError> {
        if self.peek() == Some(want) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.err(what))
        }
    }

    fn ws(&mut self) {
        while self.peek().is_some_and(is_ws) {
            self.pos += 1;
        }
    }

    /// Reads the value at the current position (no leading whitespace) and returns its
    /// span.
    fn value_span(&mut self) -> Result<Value<'a>, JsonError> {
        let start = self.pos;
        let kind = self.value(0)?;
        Ok(Value {
            raw: &self.doc[start..self.pos],
            kind,
        })
    }

    fn value(&mut self, depth: usize) -> Result<Kind, JsonError> {
        self.ws();
        match self.peek() {
            None => Err(self.err("expected a value")),
            Some(b'{') => {
                self.container(depth, b'}', "expected `,` or `}` in an object")?;
                Ok(Kind::Object)
            }
            Some(b'[') => {
                self.container(depth, b']', "expected `,` or `]` in an array")?;
                Ok(Kind::Array)
            }
            Some(b'"') => self.string().map(|()| Kind::String),
            Some(b't') => self.literal(b"true").map(|()| Kind::Bool),
            Some(b'f') => self.literal(b"false").map(|()| Kind::Bool),
            Some(b'n') => self.literal(b"null").map(|()| Kind::Null),
            Some(b'-' | b'0'..=b'9') => self.number().map(|()| Kind::Number),
            Some(_) => Err(self.err("unexpected character")),
        }
    }

    /// An object (`close` is `}`) or an array (`]`), starting at its opening bracket.
    fn container(
        &mut self,
        depth: usize,
        close: u8,
        expected: &'static str,
    ) -> Result<(), JsonError> {
        if depth >= MAX_DEPTH {
            return Err(self.err("nested too deep"));
        }
        self.pos += 1;
        self.ws();
        if self.peek() == Some(close) {
            self.pos += 1;
            return Ok(());
        }
        loop {
            if close == b'}' {
                self.ws();
                if self.peek() != Some(b'"') {
                    return Err(self.err("expected a string key in an object"));
                }
                self.string()?;
                self.ws();
                self.expect(b':', "expected `:` after an object key")?;
            }
            self.value(depth + 1)?;
            self.ws();
            match self.next() {
                Some(b',') => continue,
                Some(c) if c == close => return Ok(()),
                _ => {
                    self.pos = self.pos.saturating_sub(1);
                    return Err(self.err(expected));
                }
            }
        }
    }

    /// A string, starting at its opening quote.
    fn string(&mut self) -> Result<(), JsonError> {
        self.expect(b'"', "expected a string")?;
        loop {
            match self.next() {
                None => return Err(self.err("unterminated string")),
                Some(b'"') => return Ok(()),
                Some(b'\\') => match self.next() {
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {}
                    Some(b'u') => {
                        if hex4(self.doc, self.pos).is_none() {
                            return Err(self.err("bad \\u escape"));
                        }
                        self.pos += 4;
                    }
                    _ => return Err(self.err("bad escape in a string")),
                },
                Some(0..=0x1f) => {
                    self.pos -= 1;
                    return Err(self.err("control character in a string"));
                }
                Some(_) => {}
            }
        }
    }

    fn literal(&mut self, word: &'static [u8]) -> Result<(), JsonError> {
        if self.doc[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(())
        } else {
            Err(self.err("unexpected word"))
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.pos += 1;
        }
        self.pos - start
    }

    /// `-? (0 | [1-9][0-9]*) (\.[0-9]+)? ([eE][+-]?[0-9]+)?`
    fn number(&mut self) -> Result<(), JsonError> {
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.err("bad number")),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if self.digits() == 0 {
                return Err(self.err("bad number: no digit after `.`"));
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return Err(self.err("bad number: no digit in the exponent"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(path: &str, doc: &str) -> Result<Option<(Kind, String)>, JsonError> {
        FieldPath::parse(path)
            .unwrap()
            .lookup(doc.as_bytes())
            .map(|v| v.map(|v| (v.kind(), String::from_utf8(v.text().into_owned()).unwrap())))
    }

    #[test]
    fn accepts_json_and_refuses_what_is_not() {
        for ok in [
            "{}",
            " [ ] ",
            "0",
            "-1.5e+3",
            "\"a\\u00e9\\n\"",
            "true",
            "null",
            r#"{"a":[1,{"b":null}],"c":"x"}"#,
        ] {
            assert!(validate(ok.as_bytes()).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "hello",
            "{",
            r#"{"a":1,}"#,
            "[1,]",
            "01",
            "1.",
            "-",
            "1e",
            r#"{"a" 1}"#,
            r#"{a:1}"#,
            "\"tab\there\"",
            r#""\x""#,
            r#""\u12g4""#,
            "{} {}",
            "tru",
            "[1 2]",
        ] {
            assert!(validate(bad.as_bytes()).is_err(), "{bad:?} accepted");
        }
        assert!(validate(b"\"\xff\"").is_err());
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert_eq!(
            validate(deep.as_bytes()).unwrap_err().what,
            "nested too deep"
        );
        let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(validate(ok.as_bytes()).is_ok());
    }

    #[test]
    fn looks_up_top_level_and_nested_fields() {
        let doc = r#" { "id" : 42, "user": {"id": "u-1", "tags": [ "a", "b" ]},
                       "ok": true, "none": null, "esc\u0061ped": "\"q\" \u00e9" } "#;
        assert_eq!(get("id", doc).unwrap(), Some((Kind::Number, "42".into())));
        assert_eq!(
            get("user.id", doc).unwrap(),
            Some((Kind::String, "u-1".into()))
        );
        assert_eq!(
            get("user.tags", doc).unwrap(),
            Some((Kind::Array, r#"["a","b"]"#.into()))
        );
        assert_eq!(get("ok", doc).unwrap(), Some((Kind::Bool, "true".into())));
        assert_eq!(get("none", doc).unwrap(), Some((Kind::Null, "null".into())));
        assert_eq!(
            get("escaped", doc).unwrap(),
            Some((Kind::String, "\"q\" é".into()))
        );
        assert_eq!(get("missing", doc).unwrap(), None);
        assert_eq!(get("id.x", doc).unwrap(), None);
        assert_eq!(get("user.tags.0", doc).unwrap(), None);
        // Only a direct member counts, and the last of repeated keys wins.
        assert_eq!(get("id", r#"{"x":{"id":1}}"#).unwrap(), None);
        assert_eq!(
            get("a", r#"{"a":1,"a":2}"#).unwrap(),
            Some((Kind::Number, "2".into()))
        );
        assert_eq!(get("a", "[1]").unwrap(), None);
        // The whole document is validated, wherever the field is.
        assert!(get("a", r#"{"a":1,"b":}"#).is_err());
        assert!(get("a", "not json").is_err());
    }

    #[test]
    fn compacts_objects_and_arrays_outside_strings_only() {
        let v = get("o", r#"{"o": { "k" : [1, 2], "s": "a b" }}"#)
            .unwrap()
            .unwrap();
        assert_eq!(v.1, r#"{"k":[1,2],"s":"a b"}"#);
    }

    #[test]
    fn unescapes_and_escapes_strings() {
        assert_eq!(&*unescape(br#"a\"b\\c\/\t"#), b"a\"b\\c/\t");
        assert_eq!(&*unescape(br#"\ud83d\ude00"#), "😀".as_bytes());
        assert_eq!(&*unescape(br#"\ud83dx"#), "\u{fffd}x".as_bytes());
        assert!(matches!(unescape(b"plain"), Cow::Borrowed(_)));
        let mut out = Vec::new();
        write_string(&mut out, "q\"\\\n\u{1}é".as_bytes());
        assert_eq!(out, r#""q\"\\\n\u0001é""#.as_bytes());
        let decoded = unescape(&out[1..out.len() - 1]);
        assert_eq!(&*decoded, "q\"\\\n\u{1}é".as_bytes());
    }

    #[test]
    fn refuses_bad_paths() {
        assert!(FieldPath::parse("").is_err());
        assert!(FieldPath::parse("a..b").is_err());
        assert!(FieldPath::parse(".a").is_err());
        assert_eq!(FieldPath::parse(" a.b ").unwrap().segments(), ["a", "b"]);
    }
}
