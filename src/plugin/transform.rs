//! The transform runtime: one instance of a `transform` component, called once per batch.
//!
//! The batch crosses as one byte buffer each way in the "weir batch v1" layout
//! (`wit/transform.wit`, ARCHITECTURE.md): [`encode_input`] writes it, [`decode_output`]
//! reads the guest's answer, checking every length and never panicking. Output keys and
//! values are slices of the guest's returned buffer (`Bytes`), not copies.

use std::sync::Arc;

use bytes::Bytes;
use wasmtime::component::{Component, Linker};
use wasmtime::Store;

use super::sandbox::StoreState;
use super::{call_error, PluginError, Shared};

mod bindings {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "transform",
        exports: { default: async },
    });
}

use bindings::weir::plugin::types::BatchContext as WitContext;
use bindings::{Transform as World, TransformPre as WorldPre};

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

/// One output record of a transform.
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
    shared: Arc<Shared>,
    name: Arc<str>,
    pre: WorldPre<StoreState>,
    config: Vec<(String, String)>,
    live: Option<(Store<StoreState>, World)>,
    /// Reused input buffer.
    input: Vec<u8>,
}

impl Transform {
    pub(super) async fn load(
        shared: Arc<Shared>,
        name: Arc<str>,
        component: &Component,
        config: Vec<(String, String)>,
    ) -> Result<Self, PluginError> {
        let wrong_world = |e: wasmtime::Error| PluginError::WrongWorld {
            plugin: name.to_string(),
            world: "transform",
            message: format!("{e:#}"),
        };
        let mut linker = Linker::new(&shared.engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(|e| PluginError::Host {
            message: format!("linking WASI: {e:#}"),
        })?;
        let pre = linker.instantiate_pre(component).map_err(wrong_world)?;
        let pre = WorldPre::new(pre).map_err(wrong_world)?;
        let mut t = Transform {
            shared,
            name,
            pre,
            config,
            live: None,
            input: Vec::new(),
        };
        t.instantiate().await?;
        Ok(t)
    }

    /// The plugin's name (its file name).
    pub fn name(&self) -> &str {
        &self.name
    }

    async fn instantiate(&mut self) -> Result<(), PluginError> {
        self.live = None;
        let mut store = Store::new(
            &self.shared.engine,
            StoreState::new(&self.name, &self.shared.limits),
        );
        StoreState::limit(&mut store);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(self.shared.deadline_ticks());
        let world = match self.pre.instantiate_async(&mut store).await {
            Ok(w) => w,
            Err(e) => {
                return Err(call_error(
                    &self.name,
                    &self.shared.limits,
                    store.data(),
                    &e,
                ))
            }
        };
        store.set_epoch_deadline(self.shared.deadline_ticks());
        let opened = world
            .weir_plugin_transformer()
            .call_open(&mut store, &self.config)
            .await;
        match opened {
            Ok(Ok(())) => {
                self.live = Some((store, world));
                Ok(())
            }
            Ok(Err(e)) => Err(PluginError::Open {
                plugin: self.name.to_string(),
                message: e.message,
            }),
            Err(e) => Err(call_error(
                &self.name,
                &self.shared.limits,
                store.data(),
                &e,
            )),
        }
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
    ) -> Result<Vec<Output>, PluginError> {
        encode_input(batch, &mut self.input).map_err(|message| PluginError::InvalidCall {
            plugin: self.name.to_string(),
            message,
        })?;
        if self.live.is_none() {
            self.instantiate().await?;
        }
        let deadline = self.shared.deadline_ticks();
        let Some((store, world)) = self.live.as_mut() else {
            return Err(PluginError::Host {
                message: format!("plugin {}: no live instance", self.name),
            });
        };
        store.data_mut().begin_call();
        store.set_epoch_deadline(deadline);
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
            Ok(Ok(out)) => decode_output(Bytes::from(out), batch.len()).map_err(|message| {
                PluginError::BadOutput {
                    plugin: self.name.to_string(),
                    message,
                }
            }),
            Ok(Err(e)) => Err(PluginError::Failed {
                plugin: self.name.to_string(),
                message: e.message,
                record_index: e.record_index,
            }),
            Err(e) => {
                let err = call_error(&self.name, &self.shared.limits, store.data(), &e);
                if let Err(again) = self.instantiate().await {
                    tracing::warn!(plugin = %self.name, "replacing the failed instance: {again}");
                }
                Err(err)
            }
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

/// A bounds-checked reader over the guest's output; errors name the byte offset.
struct Reader {
    buf: Bytes,
    pos: usize,
}

impl Reader {
    fn take(&mut self, n: usize, what: &str) -> Result<Bytes, String> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.buf.len() => {
                let s = self.buf.slice(self.pos..end);
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
        let b = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(&b);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        self.array::<4>(what).map(u32::from_le_bytes)
    }

    fn i32(&mut self, what: &str) -> Result<i32, String> {
        self.array::<4>(what).map(i32::from_le_bytes)
    }

    fn nullable(&mut self, what: &str) -> Result<Option<Bytes>, String> {
        let at = self.pos;
        match self.i32(what)? {
            -1 => Ok(None),
            n => match usize::try_from(n) {
                Ok(len) => self.take(len, what).map(Some),
                Err(_) => Err(format!("{what} has length {n} at byte {at}")),
            },
        }
    }

    fn utf8(&mut self, len: usize, what: &str) -> Result<String, String> {
        let at = self.pos;
        let b = self.take(len, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| format!("{what} at byte {at} is not UTF-8"))
    }
}

/// Reads the guest's output buffer ("weir batch v1" output layout) for a batch of
/// `input_count` records. Refuses trailing bytes, input indexes out of range or going
/// backwards, and any length past the buffer.
pub(crate) fn decode_output(buf: Bytes, input_count: usize) -> Result<Vec<Output>, String> {
    let mut r = Reader { buf, pos: 0 };
    let count = r.u32("record count")?;
    // Every out-record takes at least 24 bytes: a count past that is a lie, refused before
    // reserving memory for it.
    let most = r.buf.len().saturating_sub(4) / 24;
    if count as usize > most {
        return Err(format!(
            "record count {count} cannot fit in {} bytes",
            r.buf.len()
        ));
    }
    let mut out = Vec::with_capacity(count as usize);
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
                Ok(len) => Some(r.utf8(len, "topic")?),
                Err(_) => return Err(format!("topic has length {n} at byte {}", r.pos - 4)),
            },
        };
        let timestamp_ms = i64::from_le_bytes(r.array::<8>("timestamp")?);
        let key = r.nullable("key")?;
        let value = r.nullable("value")?;
        let header_count = r.u32("header count")?;
        let mut headers = Vec::new();
        for _ in 0..header_count {
            let key_len = r.u32("header key length")? as usize;
            let key = r.utf8(key_len, "header key")?;
            let value = r.nullable("header value")?;
            headers.push(Header { key, value });
        }
        out.push(Output {
            input_index,
            topic,
            record: Record {
                key,
                value,
                headers,
                timestamp_ms,
            },
        });
    }
    if r.pos != r.buf.len() {
        return Err(format!(
            "{} bytes after the last record (at byte {})",
            r.buf.len() - r.pos,
            r.pos
        ));
    }
    Ok(out)
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
        let out = decode_output(Bytes::from(identity(&buf)), 2).expect("valid output");
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].record, sample()[0]);
        assert_eq!(out[1].input_index, 1);
        assert_eq!(out[1].topic, None);
    }

    #[test]
    fn every_truncation_and_extension_is_refused() {
        let mut buf = Vec::new();
        encode_input(&sample(), &mut buf).unwrap_or_default();
        let good = identity(&buf);
        for cut in 0..good.len() {
            assert!(
                decode_output(Bytes::copy_from_slice(&good[..cut]), 2).is_err(),
                "cut {cut}"
            );
        }
        let mut long = good.clone();
        long.push(0);
        assert!(decode_output(Bytes::from(long), 2).is_err());
        // An input index past the batch.
        assert!(decode_output(Bytes::from(good), 1).is_err());
        // A huge claimed count is refused before allocating.
        assert!(decode_output(Bytes::from(u32::MAX.to_le_bytes().to_vec()), 2).is_err());
    }
}
