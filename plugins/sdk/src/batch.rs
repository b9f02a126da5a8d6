//! The "weir batch v1" byte layout (documented in `wit/transform.wit`): zero-copy reading
//! of the input batch, writing of the output batch.
//!
//! All integers are little-endian; a length of -1 (i32) is null. Reading checks every
//! length against the buffer and never panics; writing panics only on a field longer than
//! `i32::MAX` bytes (impossible under weir's guest memory limit).

use std::fmt;

/// Bytes before the records of a batch: the `count:u32`.
const COUNT_BYTES: usize = 4;

/// A batch the host sent that does not follow the layout (a host bug, reported to the
/// host as the batch's error).
#[derive(Debug, Clone)]
pub struct MalformedBatch {
    /// Index of the record being read.
    pub record_index: u32,
    /// Byte offset in the input buffer where reading failed.
    pub byte_offset: usize,
    /// What was wrong.
    pub what: &'static str,
}

impl fmt::Display for MalformedBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "malformed input batch at byte {} (record {}): {}",
            self.byte_offset, self.record_index, self.what
        )
    }
}

/// A bounds-checked reader over a byte slice.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    record_index: u32,
}

impl<'a> Cursor<'a> {
    fn err(&self, what: &'static str) -> MalformedBatch {
        MalformedBatch {
            record_index: self.record_index,
            byte_offset: self.pos,
            what,
        }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], MalformedBatch> {
        let end = self.pos.checked_add(n).ok_or_else(|| self.err(what))?;
        let s = self.buf.get(self.pos..end).ok_or_else(|| self.err(what))?;
        self.pos = end;
        Ok(s)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, MalformedBatch> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn i64(&mut self, what: &'static str) -> Result<i64, MalformedBatch> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_le_bytes(a))
    }

    /// A length-prefixed (i32, -1 = null) byte field.
    fn nullable(&mut self, what: &'static str) -> Result<Option<&'a [u8]>, MalformedBatch> {
        let len = self.u32(what)? as i32;
        if len == -1 {
            return Ok(None);
        }
        let len = usize::try_from(len).map_err(|_| self.err(what))?;
        self.take(len, what).map(Some)
    }
}

/// One header of a record: a UTF-8 key and an optional value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<'a> {
    /// Header key.
    pub key: &'a str,
    /// Header value; `None` is Kafka's null header value.
    pub value: Option<&'a [u8]>,
}

/// The headers of a [`Record`], read lazily from the batch.
#[derive(Debug, Clone)]
pub struct Headers<'a> {
    raw: &'a [u8],
    left: u32,
    record_index: u32,
}

impl<'a> Iterator for Headers<'a> {
    type Item = Header<'a>;

    fn next(&mut self) -> Option<Header<'a>> {
        if self.left == 0 {
            return None;
        }
        // Validated when the record was parsed, so errors cannot happen here; a failure
        // ends the iteration rather than panicking.
        let mut c = Cursor {
            buf: self.raw,
            pos: 0,
            record_index: self.record_index,
        };
        let header = read_header(&mut c).ok()?;
        self.raw = &self.raw[c.pos..];
        self.left -= 1;
        Some(header)
    }
}

fn read_header<'a>(c: &mut Cursor<'a>) -> Result<Header<'a>, MalformedBatch> {
    let key_len = c.u32("header key length")? as usize;
    let key = c.take(key_len, "header key")?;
    let key = std::str::from_utf8(key).map_err(|_| c.err("header key is not UTF-8"))?;
    let value = c.nullable("header value")?;
    Ok(Header { key, value })
}

/// One input record, borrowed from the batch buffer.
#[derive(Debug, Clone)]
pub struct Record<'a> {
    index: u32,
    raw: &'a [u8],
    timestamp_ms: i64,
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
    headers_raw: &'a [u8],
    header_count: u32,
}

impl<'a> Record<'a> {
    /// Position of this record in its batch (0-based); its offset is the batch context's
    /// `base_offset` plus this index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Record key; `None` is a null key.
    pub fn key(&self) -> Option<&'a [u8]> {
        self.key
    }

    /// Record value; `None` is a null value (a tombstone).
    pub fn value(&self) -> Option<&'a [u8]> {
        self.value
    }

    /// Milliseconds since the Unix epoch.
    pub fn timestamp_ms(&self) -> i64 {
        self.timestamp_ms
    }

    /// The record's headers, in order.
    pub fn headers(&self) -> Headers<'a> {
        Headers {
            raw: self.headers_raw,
            left: self.header_count,
            record_index: self.index,
        }
    }

    /// The last header named `key` (Kafka Connect's `Headers.lastWithName`), if any.
    pub fn last_header(&self, key: &str) -> Option<Header<'a>> {
        self.headers().filter(|h| h.key == key).last()
    }
}

/// The records of an input batch.
pub(crate) struct Input<'a> {
    cursor: Cursor<'a>,
    left: u32,
}

impl<'a> Input<'a> {
    /// Starts reading a batch: checks the count prefix.
    pub(crate) fn parse(buf: &'a [u8]) -> Result<Self, MalformedBatch> {
        let mut cursor = Cursor {
            buf,
            pos: 0,
            record_index: 0,
        };
        let left = cursor.u32("record count")?;
        Ok(Input { cursor, left })
    }

    /// Records not read yet.
    pub(crate) fn remaining(&self) -> u32 {
        self.left
    }

    fn record(&mut self) -> Result<Record<'a>, MalformedBatch> {
        let c = &mut self.cursor;
        let start = c.pos;
        let timestamp_ms = c.i64("timestamp")?;
        let key = c.nullable("key")?;
        let value = c.nullable("value")?;
        let header_count = c.u32("header count")?;
        let headers_start = c.pos;
        for _ in 0..header_count {
            read_header(c)?;
        }
        Ok(Record {
            index: c.record_index,
            raw: &c.buf[start..c.pos],
            timestamp_ms,
            key,
            value,
            headers_raw: &c.buf[headers_start..c.pos],
            header_count,
        })
    }
}

impl<'a> Iterator for Input<'a> {
    type Item = Result<Record<'a>, MalformedBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            if self.cursor.pos != self.cursor.buf.len() {
                let e = self.cursor.err("bytes after the last record");
                self.cursor.pos = self.cursor.buf.len();
                return Some(Err(e));
            }
            return None;
        }
        self.left -= 1;
        let r = self.record();
        self.cursor.record_index = self.cursor.record_index.wrapping_add(1);
        if r.is_err() {
            self.left = 0;
            self.cursor.pos = self.cursor.buf.len();
        }
        Some(r)
    }
}

/// A record to emit that is not a copy of an input record.
#[derive(Debug, Clone, Copy)]
pub struct NewRecord<'x> {
    /// Output topic; `None` is the transform's default output topic.
    pub topic: Option<&'x str>,
    /// Key; `None` is null.
    pub key: Option<&'x [u8]>,
    /// Value; `None` is null.
    pub value: Option<&'x [u8]>,
    /// Headers, in order.
    pub headers: &'x [Header<'x>],
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
}

/// The output records of a batch, written in the "weir batch v1" output layout. Every
/// record emitted while handling input record `i` carries `i` as its input index.
#[derive(Debug)]
pub struct Output {
    buf: Vec<u8>,
    count: u32,
    input_index: u32,
}

fn len_i32(len: usize) -> [u8; 4] {
    match i32::try_from(len) {
        Ok(n) => n.to_le_bytes(),
        Err(_) => panic!("weir: output field of {len} bytes exceeds i32::MAX"),
    }
}

impl Output {
    pub(crate) fn with_capacity(bytes: usize) -> Self {
        let mut buf = Vec::with_capacity(bytes);
        buf.extend_from_slice(&[0u8; COUNT_BYTES]);
        Output {
            buf,
            count: 0,
            input_index: 0,
        }
    }

    pub(crate) fn set_input_index(&mut self, index: u32) {
        self.input_index = index;
    }

    /// Records emitted so far in this batch.
    pub fn len(&self) -> u32 {
        self.count
    }

    /// True when nothing was emitted yet in this batch.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    fn start(&mut self, topic: Option<&str>) {
        self.count += 1;
        self.buf.extend_from_slice(&self.input_index.to_le_bytes());
        match topic {
            None => self.buf.extend_from_slice(&(-1i32).to_le_bytes()),
            Some(t) => {
                self.buf.extend_from_slice(&len_i32(t.len()));
                self.buf.extend_from_slice(t.as_bytes());
            }
        }
    }

    fn nullable(&mut self, field: Option<&[u8]>) {
        match field {
            None => self.buf.extend_from_slice(&(-1i32).to_le_bytes()),
            Some(b) => {
                self.buf.extend_from_slice(&len_i32(b.len()));
                self.buf.extend_from_slice(b);
            }
        }
    }

    /// Emits `record` unchanged to the default output topic (one copy of its bytes).
    pub fn emit(&mut self, record: &Record<'_>) {
        self.start(None);
        self.buf.extend_from_slice(record.raw);
    }

    /// Emits `record` unchanged to `topic` (routing).
    pub fn emit_to(&mut self, topic: &str, record: &Record<'_>) {
        self.start(Some(topic));
        self.buf.extend_from_slice(record.raw);
    }

    /// Emits `record` with its value replaced (key, headers and timestamp kept) to the
    /// default output topic.
    pub fn emit_value(&mut self, record: &Record<'_>, value: Option<&[u8]>) {
        self.start(None);
        self.buf
            .extend_from_slice(&record.timestamp_ms.to_le_bytes());
        self.nullable(record.key);
        self.nullable(value);
        self.buf
            .extend_from_slice(&record.header_count.to_le_bytes());
        self.buf.extend_from_slice(record.headers_raw);
    }

    /// Emits a record built by the plugin.
    pub fn emit_new(&mut self, record: &NewRecord<'_>) {
        self.start(record.topic);
        self.buf
            .extend_from_slice(&record.timestamp_ms.to_le_bytes());
        self.nullable(record.key);
        self.nullable(record.value);
        self.buf.extend_from_slice(&len_i32(record.headers.len()));
        for h in record.headers {
            self.buf.extend_from_slice(&len_i32(h.key.len()));
            self.buf.extend_from_slice(h.key.as_bytes());
            self.nullable(h.value);
        }
    }

    /// The finished output buffer.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.buf[..COUNT_BYTES].copy_from_slice(&self.count.to_le_bytes());
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// timestamp, key, value, headers
    type TestRecord<'a> = (
        i64,
        Option<&'a [u8]>,
        Option<&'a [u8]>,
        &'a [(&'a str, Option<&'a [u8]>)],
    );

    fn encode(records: &[TestRecord<'_>]) -> Vec<u8> {
        let mut b = (records.len() as u32).to_le_bytes().to_vec();
        for (ts, k, v, hs) in records {
            b.extend_from_slice(&ts.to_le_bytes());
            for f in [k, v] {
                match f {
                    None => b.extend_from_slice(&(-1i32).to_le_bytes()),
                    Some(x) => {
                        b.extend_from_slice(&(x.len() as i32).to_le_bytes());
                        b.extend_from_slice(x);
                    }
                }
            }
            b.extend_from_slice(&(hs.len() as u32).to_le_bytes());
            for (hk, hv) in hs.iter() {
                b.extend_from_slice(&(hk.len() as u32).to_le_bytes());
                b.extend_from_slice(hk.as_bytes());
                match hv {
                    None => b.extend_from_slice(&(-1i32).to_le_bytes()),
                    Some(x) => {
                        b.extend_from_slice(&(x.len() as i32).to_le_bytes());
                        b.extend_from_slice(x);
                    }
                }
            }
        }
        b
    }

    #[test]
    fn reads_records_and_headers() {
        let buf = encode(&[
            (7, Some(b"k"), Some(b"v"), &[("h", Some(b"x")), ("n", None)]),
            (8, None, None, &[]),
        ]);
        let recs: Vec<_> = Input::parse(&buf).unwrap().map(|r| r.unwrap()).collect();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].key(), Some(&b"k"[..]));
        assert_eq!(recs[0].timestamp_ms(), 7);
        let hs: Vec<_> = recs[0].headers().collect();
        assert_eq!(
            hs,
            vec![
                Header {
                    key: "h",
                    value: Some(b"x")
                },
                Header {
                    key: "n",
                    value: None
                }
            ]
        );
        assert_eq!(recs[1].index(), 1);
        let buf = encode(&[(
            1,
            None,
            None,
            &[("h", Some(b"1")), ("g", None), ("h", Some(b"2"))],
        )]);
        let rec = Input::parse(&buf).unwrap().next().unwrap().unwrap();
        assert_eq!(rec.last_header("h").and_then(|h| h.value), Some(&b"2"[..]));
        assert_eq!(rec.last_header("g").map(|h| h.value), Some(None));
        assert_eq!(rec.last_header("x"), None);
        assert_eq!(recs[1].value(), None);
    }

    #[test]
    fn refuses_truncated_and_trailing_bytes() {
        let buf = encode(&[(7, Some(b"k"), Some(b"v"), &[])]);
        for cut in 0..buf.len() {
            let ok = Input::parse(&buf[..cut]).map(|i| i.collect::<Result<Vec<_>, _>>().is_ok());
            assert!(!matches!(ok, Ok(true)), "cut at {cut} accepted");
        }
        let mut long = buf.clone();
        long.push(0);
        assert!(Input::parse(&long)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .is_err());
    }

    #[test]
    fn identity_output_round_trips() {
        let buf = encode(&[(1, Some(b"a"), Some(b"b"), &[("h", None)])]);
        let mut out = Output::with_capacity(0);
        for r in Input::parse(&buf).unwrap() {
            let r = r.unwrap();
            out.set_input_index(r.index());
            out.emit(&r);
            out.emit_value(&r, Some(b"zz"));
        }
        let o = out.finish();
        assert_eq!(&o[..4], &2u32.to_le_bytes());
        // index 0, topic -1, then the record bytes as in the input.
        assert_eq!(&o[4..8], &0u32.to_le_bytes());
        assert_eq!(&o[8..12], &(-1i32).to_le_bytes());
        assert_eq!(&o[12..12 + buf.len() - 4], &buf[4..]);
    }
}
