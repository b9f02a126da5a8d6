//! The transform runtime: one instance of a `transform` component, called once per batch.
//!
//! The batch crosses as one byte buffer each way in the "weir batch v1" layout
//! (`wit/transform.wit`, ARCHITECTURE.md): [`encode_input`] writes it, [`decode_output`]
//! reads the guest's answer, checking every length and never panicking, into an
//! [`OutputBatch`]: the returned buffer plus an index of where each field is. Reading an
//! output record borrows from that buffer: no copy, no allocation and no reference count
//! per record (an earlier version handed out a `Bytes` slice per key and value; its
//! atomic reference counts were a third of the host's cost per record).

use std::time::Instant;

use bytes::Bytes;
use wasmtime::component::InstancePre;
use wasmtime::Store;

use super::instance::{Bindings, Instance, World};
use super::sandbox::StoreState;
use super::PluginError;
use crate::log::records::DecodedRecord;
use crate::metrics::PluginCalls;

mod bindings {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "transform",
        exports: { default: async },
    });
}

use bindings::weir::plugin::types::BatchContext as WitContext;

impl Bindings<StoreState> for bindings::Transform {
    type Pre = bindings::TransformPre<StoreState>;
    const WORLD: &'static str = "transform";

    fn pre(pre: InstancePre<StoreState>) -> wasmtime::Result<Self::Pre> {
        bindings::TransformPre::new(pre)
    }

    async fn instantiate(pre: &Self::Pre, store: &mut Store<StoreState>) -> wasmtime::Result<Self> {
        pre.instantiate_async(store).await
    }
}

impl World for bindings::Transform {
    const EXPORT: &'static str = "weir:plugin/transformer";

    async fn open(
        &self,
        store: &mut Store<StoreState>,
        config: &Vec<(String, String)>,
    ) -> wasmtime::Result<Result<(), String>> {
        let opened = self
            .weir_plugin_transformer()
            .call_open(store, config)
            .await?;
        Ok(opened.map_err(|e| e.message))
    }
}

/// One record header: UTF-8 key, optional value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Header key.
    pub key: String,
    /// Header value; `None` is Kafka's null header value.
    pub value: Option<Bytes>,
}

/// A record going into or coming out of a transform.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    /// Key; `None` is null.
    pub key: Option<Bytes>,
    /// Value; `None` is null (a tombstone).
    pub value: Option<Bytes>,
    /// Headers, in order.
    pub headers: Vec<Header>,
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
}

impl From<DecodedRecord> for Record {
    /// A record read from the log (`log::records`), as a guest sees it: headers in
    /// order with repeated keys kept, keys read as UTF-8 leniently (as the Java client).
    fn from(r: DecodedRecord) -> Record {
        Record {
            key: r.key,
            value: r.value,
            headers: r
                .headers
                .into_iter()
                .map(|(k, v)| Header {
                    key: String::from_utf8_lossy(&k).into_owned(),
                    value: v,
                })
                .collect(),
            timestamp_ms: r.timestamp_ms,
        }
    }
}

/// One output record of a transform, owned (see [`OutputBatch::to_vec`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Index (in the input batch) of the record this one came from.
    pub input_index: u32,
    /// Output topic the plugin chose; `None` is the transform's default output.
    pub topic: Option<String>,
    /// The record.
    pub record: Record,
}

/// Where a batch comes from: input topic, partition, offset of its first record (-1 when
/// the records have no offsets yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchContext {
    /// Input topic.
    pub topic: String,
    /// Input partition.
    pub partition: i32,
    /// Offset of the batch's first record, or -1.
    pub base_offset: i64,
}

/// A loaded transform plugin (world `transform`): a batch of records in, records out.
///
/// Owns one instance; a call that traps, times out or runs out of memory fails alone and
/// the instance is replaced (and re-opened with the same config) before the next call.
/// Calls take `&mut self`: use one `Transform` per concurrent user.
pub struct Transform {
    instance: Instance<bindings::Transform>,
    /// Reused input buffer.
    input: Vec<u8>,
    /// `apply` durations and failures.
    calls: PluginCalls,
}

impl Transform {
    /// The runtime around a loaded instance (`PluginHost::load_transform*`).
    pub(super) fn new(instance: Instance<bindings::Transform>) -> Self {
        Transform {
            calls: instance.calls("apply"),
            instance,
            input: Vec::new(),
        }
    }

    /// The plugin's name (its file name).
    pub fn name(&self) -> &str {
        self.instance.name()
    }

    /// Transforms `batch` into output records.
    ///
    /// Errors: [`PluginError::Failed`] when the plugin reports an error (naming the
    /// record when it does); [`PluginError::BadOutput`] for a malformed output buffer;
    /// [`PluginError::Timeout`], [`PluginError::MemoryLimit`] or [`PluginError::Trap`] when
    /// the guest fails (the instance is then replaced). [`PluginError::InvalidCall`] for a
    /// batch of more than `u32::MAX` records or a field over `i32::MAX` bytes.
    pub async fn apply(
        &mut self,
        context: &BatchContext,
        batch: &[Record],
    ) -> Result<OutputBatch, PluginError> {
        let started = Instant::now();
        let result = self.apply_once(context, batch).await;
        self.calls.record(started.elapsed(), result.is_err());
        result
    }

    /// [`Transform::apply`], untimed.
    async fn apply_once(
        &mut self,
        context: &BatchContext,
        batch: &[Record],
    ) -> Result<OutputBatch, PluginError> {
        encode_input(batch, &mut self.input).map_err(|message| PluginError::InvalidCall {
            plugin: self.name().to_string(),
            message,
        })?;
        let (store, world) = self.instance.ready().await?;
        let wit_context = WitContext {
            topic: context.topic.clone(),
            partition: context.partition,
            base_offset: context.base_offset,
        };
        let result = world
            .weir_plugin_transformer()
            .call_apply(&mut *store, &wit_context, &self.input)
            .await;
        match result {
            Ok(Ok(out)) => {
                decode_output(out, batch.len()).map_err(|message| PluginError::BadOutput {
                    plugin: self.name().to_string(),
                    message,
                })
            }
            Ok(Err(e)) => Err(PluginError::Failed {
                plugin: self.name().to_string(),
                message: e.message,
                record_index: e.record_index,
            }),
            Err(e) => Err(self.instance.failed(&e).await),
        }
    }
}

fn put_len(buf: &mut Vec<u8>, len: usize) -> Result<(), String> {
    let n = i32::try_from(len).map_err(|_| format!("a field of {len} bytes exceeds i32::MAX"))?;
    buf.extend_from_slice(&n.to_le_bytes());
    Ok(())
}

fn put_nullable(buf: &mut Vec<u8>, field: Option<&[u8]>) -> Result<(), String> {
    match field {
        None => buf.extend_from_slice(&(-1i32).to_le_bytes()),
        Some(b) => {
            put_len(buf, b.len())?;
            buf.extend_from_slice(b);
        }
    }
    Ok(())
}

/// Writes `batch` into `buf` (cleared first) in the "weir batch v1" input layout.
pub(crate) fn encode_input(batch: &[Record], buf: &mut Vec<u8>) -> Result<(), String> {
    buf.clear();
    let count = u32::try_from(batch.len())
        .map_err(|_| format!("a batch of {} records exceeds u32::MAX", batch.len()))?;
    buf.extend_from_slice(&count.to_le_bytes());
    for r in batch {
        buf.extend_from_slice(&r.timestamp_ms.to_le_bytes());
        put_nullable(buf, r.key.as_deref())?;
        put_nullable(buf, r.value.as_deref())?;
        let headers = u32::try_from(r.headers.len())
            .map_err(|_| format!("{} headers exceed u32::MAX", r.headers.len()))?;
        buf.extend_from_slice(&headers.to_le_bytes());
        for h in &r.headers {
            put_len(buf, h.key.len())?;
            buf.extend_from_slice(h.key.as_bytes());
            put_nullable(buf, h.value.as_deref())?;
        }
    }
    Ok(())
}

/// Where a field lies in an [`OutputBatch`]'s buffer.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: u32,
    len: u32,
}

impl Span {
    fn of(buf: &[u8], span: Option<Span>) -> Option<&[u8]> {
        // In bounds by construction (checked when decoded); `get` keeps that from being
        // a panic if it ever were not.
        span.and_then(|s| buf.get(s.start as usize..(s.start as usize + s.len as usize)))
    }
}

/// One decoded out-record: spans into the buffer.
#[derive(Debug, Clone, Copy)]
struct Entry {
    input_index: u32,
    /// Index into `OutputBatch::topics`.
    topic: Option<u32>,
    key: Option<Span>,
    value: Option<Span>,
    timestamp_ms: i64,
    /// Range in `OutputBatch::headers`.
    headers_start: u32,
    headers_count: u32,
}

/// A decoded header: the key (validated UTF-8, owned) and the value's span.
#[derive(Debug, Clone)]
struct HeaderEntry {
    key: String,
    value: Option<Span>,
}

/// The output of one [`Transform::apply`]: the guest's buffer, checked, with an index of
/// its records. Records are read in place ([`OutputBatch::iter`], [`OutputBatch::get`]);
/// [`OutputBatch::to_vec`] copies them out.
#[derive(Debug, Clone)]
pub struct OutputBatch {
    buf: Vec<u8>,
    entries: Vec<Entry>,
    topics: Vec<String>,
    headers: Vec<HeaderEntry>,
}

/// One output record, borrowed from its [`OutputBatch`].
#[derive(Debug, Clone, Copy)]
pub struct OutputRecord<'a> {
    /// Index (in the input batch) of the record this one came from.
    pub input_index: u32,
    /// Output topic the plugin chose; `None` is the transform's default output.
    pub topic: Option<&'a str>,
    /// Key; `None` is null.
    pub key: Option<&'a [u8]>,
    /// Value; `None` is null.
    pub value: Option<&'a [u8]>,
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    headers: &'a [HeaderEntry],
    buf: &'a [u8],
}

impl<'a> OutputRecord<'a> {
    /// The record's headers, in order: key and value (`None` is null).
    pub fn headers(&self) -> impl ExactSizeIterator<Item = (&'a str, Option<&'a [u8]>)> + 'a {
        let buf = self.buf;
        self.headers
            .iter()
            .map(move |h| (h.key.as_str(), Span::of(buf, h.value)))
    }

    /// An owned copy of this record.
    pub fn to_output(&self) -> Output {
        Output {
            input_index: self.input_index,
            topic: self.topic.map(str::to_string),
            record: Record {
                key: self.key.map(Bytes::copy_from_slice),
                value: self.value.map(Bytes::copy_from_slice),
                headers: self
                    .headers()
                    .map(|(key, value)| Header {
                        key: key.to_string(),
                        value: value.map(Bytes::copy_from_slice),
                    })
                    .collect(),
                timestamp_ms: self.timestamp_ms,
            },
        }
    }
}

impl OutputBatch {
    /// Number of output records.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the transform dropped every record.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Output record `i`, if there is one.
    pub fn get(&self, i: usize) -> Option<OutputRecord<'_>> {
        self.entries.get(i).map(|e| self.record(e))
    }

    /// The output records, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = OutputRecord<'_>> + '_ {
        self.entries.iter().map(|e| self.record(e))
    }

    /// Owned copies of every output record.
    pub fn to_vec(&self) -> Vec<Output> {
        self.iter().map(|r| r.to_output()).collect()
    }

    fn record(&self, e: &Entry) -> OutputRecord<'_> {
        let start = e.headers_start as usize;
        let headers = self
            .headers
            .get(start..start + e.headers_count as usize)
            .unwrap_or_default();
        OutputRecord {
            input_index: e.input_index,
            topic: e
                .topic
                .and_then(|t| self.topics.get(t as usize))
                .map(String::as_str),
            key: Span::of(&self.buf, e.key),
            value: Span::of(&self.buf, e.value),
            timestamp_ms: e.timestamp_ms,
            headers,
            buf: &self.buf,
        }
    }
}

/// A bounds-checked reader over the guest's output; errors name the byte offset.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn span(&mut self, n: usize, what: &str) -> Result<Span, String> {
        match self.pos.checked_add(n) {
            // `end` fits in u32: the buffer length was checked to.
            Some(end) if end <= self.buf.len() => {
                let s = Span {
                    start: self.pos as u32,
                    len: n as u32,
                };
                self.pos = end;
                Ok(s)
            }
            _ => Err(format!(
                "{what} of {n} bytes at byte {} runs past the end ({} bytes)",
                self.pos,
                self.buf.len()
            )),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let at = self.pos;
        self.span(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(&self.buf[at..at + N]);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        self.array::<4>(what).map(u32::from_le_bytes)
    }

    fn i32(&mut self, what: &str) -> Result<i32, String> {
        self.array::<4>(what).map(i32::from_le_bytes)
    }

    fn nullable(&mut self, what: &str) -> Result<Option<Span>, String> {
        let at = self.pos;
        match self.i32(what)? {
            -1 => Ok(None),
            n => match usize::try_from(n) {
                Ok(len) => self.span(len, what).map(Some),
                Err(_) => Err(format!("{what} has length {n} at byte {at}")),
            },
        }
    }

    fn utf8(&mut self, len: usize, what: &str) -> Result<String, String> {
        let at = self.pos;
        self.span(len, what)?;
        std::str::from_utf8(&self.buf[at..at + len])
            .map(str::to_string)
            .map_err(|_| format!("{what} at byte {at} is not UTF-8"))
    }
}

/// Reads the guest's output buffer ("weir batch v1" output layout) for a batch of
/// `input_count` records. Refuses a buffer of 4 GiB or more, trailing bytes, input
/// indexes out of range or going backwards, and any length past the buffer.
pub(crate) fn decode_output(buf: Vec<u8>, input_count: usize) -> Result<OutputBatch, String> {
    if u32::try_from(buf.len()).is_err() {
        return Err(format!("output of {} bytes exceeds 4 GiB", buf.len()));
    }
    let mut r = Reader { buf: &buf, pos: 0 };
    let count = r.u32("record count")?;
    // Every out-record takes at least 28 bytes: a count past that is a lie, refused before
    // reserving memory for it.
    let most = buf.len().saturating_sub(4) / 28;
    if count as usize > most {
        return Err(format!(
            "record count {count} cannot fit in {} bytes",
            buf.len()
        ));
    }
    let mut entries = Vec::with_capacity(count as usize);
    let mut topics = Vec::new();
    let mut headers = Vec::new();
    let mut last_index = 0u32;
    for _ in 0..count {
        let at = r.pos;
        let input_index = r.u32("input index")?;
        if input_index as usize >= input_count || input_index < last_index {
            return Err(format!(
                "input index {input_index} at byte {at} (batch of {input_count}, previous {last_index})"
            ));
        }
        last_index = input_index;
        let topic = match r.i32("topic length")? {
            -1 => None,
            n => match usize::try_from(n) {
                Ok(len) => {
                    topics.push(r.utf8(len, "topic")?);
                    // At most one topic per out-record, so fewer than u32::MAX.
                    Some((topics.len() - 1) as u32)
                }
                Err(_) => return Err(format!("topic has length {n} at byte {}", r.pos - 4)),
            },
        };
        let timestamp_ms = i64::from_le_bytes(r.array::<8>("timestamp")?);
        let key = r.nullable("key")?;
        let value = r.nullable("value")?;
        let headers_count = r.u32("header count")?;
        // At most one header per 8 bytes of buffer, so fewer than u32::MAX.
        let headers_start = headers.len() as u32;
        for _ in 0..headers_count {
            let key_len = r.u32("header key length")? as usize;
            let key = r.utf8(key_len, "header key")?;
            let value = r.nullable("header value")?;
            headers.push(HeaderEntry { key, value });
        }
        entries.push(Entry {
            input_index,
            topic,
            key,
            value,
            timestamp_ms,
            headers_start,
            headers_count,
        });
    }
    if r.pos != buf.len() {
        return Err(format!(
            "{} bytes after the last record (at byte {})",
            buf.len() - r.pos,
            r.pos
        ));
    }
    Ok(OutputBatch {
        buf,
        entries,
        topics,
        headers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Record> {
        vec![
            Record {
                key: Some(Bytes::from_static(b"k")),
                value: Some(Bytes::from_static(b"{\"a\":1}")),
                headers: vec![Header {
                    key: "h".into(),
                    value: None,
                }],
                timestamp_ms: 42,
            },
            Record::default(),
        ]
    }

    /// What an identity guest answers: each input record behind its index and topic -1.
    fn identity(input: &[u8]) -> Vec<u8> {
        let mut out = input[..4].to_vec();
        let recs = sample();
        let mut pos = 4;
        for (i, r) in recs.iter().enumerate() {
            let mut one = Vec::new();
            encode_input(std::slice::from_ref(r), &mut one).unwrap_or_default();
            let len = one.len() - 4;
            out.extend_from_slice(&(i as u32).to_le_bytes());
            out.extend_from_slice(&(-1i32).to_le_bytes());
            out.extend_from_slice(&input[pos..pos + len]);
            pos += len;
        }
        out
    }

    #[test]
    fn output_round_trips() {
        let mut buf = Vec::new();
        encode_input(&sample(), &mut buf).unwrap_or_default();
        let out = decode_output(identity(&buf), 2)
            .expect("valid output")
            .to_vec();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].record, sample()[0]);
        assert_eq!(out[1].record, sample()[1]);
        assert_eq!(out[1].input_index, 1);
        assert_eq!(out[1].topic, None);
    }

    #[test]
    fn every_truncation_and_extension_is_refused() {
        let mut buf = Vec::new();
        encode_input(&sample(), &mut buf).unwrap_or_default();
        let good = identity(&buf);
        for cut in 0..good.len() {
            assert!(decode_output(good[..cut].to_vec(), 2).is_err(), "cut {cut}");
        }
        let mut long = good.clone();
        long.push(0);
        assert!(decode_output(long, 2).is_err());
        // An input index past the batch.
        assert!(decode_output(good, 1).is_err());
        // A huge claimed count is refused before allocating.
        assert!(decode_output(u32::MAX.to_le_bytes().to_vec(), 2).is_err());
    }
}
