//! Unit-test support for guest crates: run a [`Transform`] over owned records on the
//! host target (`cargo test` in `plugins/`), through the same batch layout and loop the
//! exported `apply` uses, and read its output back as owned records.
//!
//! ```ignore
//! let mut t: Filter = open(&[("field", "status"), ("equals", "ok")]).unwrap();
//! let out = run(&mut t, &[TestRecord::value(r#"{"status":"ok"}"#)]).unwrap();
//! assert_eq!(out.len(), 1);
//! ```
//!
//! Not for production code: the helpers panic on a malformed output batch (an SDK bug).

use crate::{BatchContext, Config, Transform};

/// An owned record for tests.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TestRecord {
    /// Key; `None` is null.
    pub key: Option<Vec<u8>>,
    /// Value; `None` is null.
    pub value: Option<Vec<u8>>,
    /// Headers in order: key and value (`None` is null).
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
}

impl TestRecord {
    /// A keyless record with value `value`, no headers, timestamp 0.
    pub fn value(value: impl AsRef<[u8]>) -> Self {
        TestRecord {
            value: Some(value.as_ref().to_vec()),
            ..TestRecord::default()
        }
    }

    /// This record with key `key`.
    pub fn key(mut self, key: impl AsRef<[u8]>) -> Self {
        self.key = Some(key.as_ref().to_vec());
        self
    }

    /// This record with a header `key` = `value` (`None`: a null value) appended.
    pub fn header(mut self, key: &str, value: Option<&[u8]>) -> Self {
        self.headers.push((key.into(), value.map(<[u8]>::to_vec)));
        self
    }

    /// The value as UTF-8 text (lossy), `None` for a null value.
    pub fn value_text(&self) -> Option<String> {
        self.value
            .as_ref()
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

/// One output record: which input it came from, where it goes, what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestOutput {
    /// Index of the input record it came from.
    pub input_index: u32,
    /// Output topic; `None` is the transform's default output topic.
    pub topic: Option<String>,
    /// The record.
    pub record: TestRecord,
}

/// A failed batch: the offending record's index (when one is named) and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestError {
    /// Index of the record the plugin blamed.
    pub record_index: Option<u32>,
    /// The plugin's message.
    pub message: String,
}

/// Opens a `T` with config `pairs`, as the host's `open` would.
pub fn open<T: Transform>(pairs: &[(&str, &str)]) -> Result<T, String> {
    T::open(&Config::new(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    ))
}

/// Runs `t` over `records` as one batch (from topic `in`, partition 0, base offset 0).
pub fn run<T: Transform>(t: &mut T, records: &[TestRecord]) -> Result<Vec<TestOutput>, TestError> {
    let context = BatchContext {
        topic: "in",
        partition: 0,
        base_offset: 0,
    };
    let out =
        crate::apply_batch(t, &context, &encode(records)).map_err(|(record_index, message)| {
            TestError {
                record_index,
                message,
            }
        })?;
    Ok(decode_output(&out))
}

fn put_nullable(b: &mut Vec<u8>, field: &Option<Vec<u8>>) {
    match field {
        None => b.extend_from_slice(&(-1i32).to_le_bytes()),
        Some(x) => {
            b.extend_from_slice(&(x.len() as i32).to_le_bytes());
            b.extend_from_slice(x);
        }
    }
}

/// `records` in the "weir batch v1" input layout.
fn encode(records: &[TestRecord]) -> Vec<u8> {
    let mut b = (records.len() as u32).to_le_bytes().to_vec();
    for r in records {
        b.extend_from_slice(&r.timestamp_ms.to_le_bytes());
        put_nullable(&mut b, &r.key);
        put_nullable(&mut b, &r.value);
        b.extend_from_slice(&(r.headers.len() as u32).to_le_bytes());
        for (k, v) in &r.headers {
            b.extend_from_slice(&(k.len() as u32).to_le_bytes());
            b.extend_from_slice(k.as_bytes());
            put_nullable(&mut b, v);
        }
    }
    b
}

/// A reader over an output batch that panics on truncation.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Vec<u8> {
        let s = self
            .buf
            .get(self.pos..self.pos + n)
            .expect("weir SDK bug: truncated output batch");
        self.pos += n;
        s.to_vec()
    }

    fn i32(&mut self) -> i32 {
        let b = self.take(4);
        i32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }

    fn nullable(&mut self) -> Option<Vec<u8>> {
        match self.i32() {
            -1 => None,
            n => Some(self.take(n as usize)),
        }
    }

    fn text(&mut self, n: usize) -> String {
        String::from_utf8(self.take(n)).expect("weir SDK bug: a topic or header key is not UTF-8")
    }
}

/// Reads an output layout; panics on a malformed one.
fn decode_output(buf: &[u8]) -> Vec<TestOutput> {
    let mut r = Reader { buf, pos: 0 };
    let count = r.i32() as u32;
    let mut out = Vec::new();
    for _ in 0..count {
        let input_index = r.i32() as u32;
        let topic = match r.i32() {
            -1 => None,
            n => Some(r.text(n as usize)),
        };
        let mut ts = [0u8; 8];
        ts.copy_from_slice(&r.take(8));
        let key = r.nullable();
        let value = r.nullable();
        let header_count = r.i32() as u32;
        let mut headers = Vec::new();
        for _ in 0..header_count {
            let n = r.i32() as usize;
            let k = r.text(n);
            headers.push((k, r.nullable()));
        }
        out.push(TestOutput {
            input_index,
            topic,
            record: TestRecord {
                key,
                value,
                headers,
                timestamp_ms: i64::from_le_bytes(ts),
            },
        });
    }
    assert_eq!(
        r.pos,
        buf.len(),
        "weir SDK bug: bytes after the output batch"
    );
    out
}
