//! weir's built-in `http-source` connector: polls an HTTP endpoint and turns each element
//! of a JSON array in the response into a record.
//!
//! Keys:
//! - `http.url` (required): the URL to GET (`http://` only).
//! - `poll.interval.ms` (default 200): at most one request per interval, whether the last
//!   one returned records or not (the host also waits this long after an empty poll).
//! - `http.response.records.pointer` (JSON pointer, RFC 6901; default empty: the whole
//!   body is the array): where the array of records is.
//! - `http.record.key.pointer` (optional, JSON pointer into each element): the record
//!   key (a string as its text, anything else as its JSON).
//! - `http.response.cursor.pointer` (optional, JSON pointer into the response): the
//!   cursor. It is the source offset (`{"cursor": ...}`, source partition
//!   `{"url": <http.url>}`) and is sent on the next request as query parameter
//!   `http.request.cursor.param` (default `cursor`). After a restart the host hands back
//!   the stored cursor, so polling resumes where the last durable records ended.
//! - `http.timeout.ms` (default 400): deadline of a connect and of the first response
//!   byte; keep it below the broker's `plugin.call.timeout.ms`.
//! - `http.response.max.bytes` (default 8 MiB): a larger response body fails the poll.
//!
//! Each record's value is the element's JSON text. A response with more elements than
//! the host asked for is handed out over several polls; only the last records of a
//! response carry its new cursor (the earlier ones carry the cursor it was requested
//! with), so a crash in between asks for that response again (at-least-once).
//!
//! A non-2xx response or a failed request is logged and retried at the next interval;
//! a request the host denies (`http.allowed.hosts`) fails the task.

use std::cell::RefCell;
use std::collections::VecDeque;

use http_client::{encode_query_value, now_ms, send, HttpError, Request};

wit_bindgen::generate!({
    world: "source-connector",
    path: "../../wit",
});

use exports::weir::plugin::source::Guest;
use weir::plugin::connector_types::{SourcePosition, SourceRecord};
use weir::plugin::log::{log, Level};
use weir::plugin::types::{PluginError, Record};

struct State {
    url: String,
    interval_ms: u64,
    records_pointer: String,
    key_pointer: Option<String>,
    cursor_pointer: Option<String>,
    cursor_param: String,
    timeout_ms: u64,
    max_bytes: usize,
    /// The cursor of the last response taken (what the next request sends).
    cursor: Option<String>,
    /// When the last request started (ms since the epoch); 0 = never.
    last_request_ms: u64,
    /// Records of the last response not handed out yet.
    pending: VecDeque<SourceRecord>,
}

thread_local! {
    static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
}

fn error(message: String) -> PluginError {
    PluginError {
        message,
        record_index: None,
    }
}

use http_client::config_get as get;

fn number(config: &[(String, String)], key: &str, default: u64) -> Result<u64, PluginError> {
    http_client::config_number(config, key, default).map_err(error)
}

fn pointer_key(config: &[(String, String)], key: &str) -> Result<Option<String>, PluginError> {
    match config
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.trim())
    {
        None => Ok(None),
        Some(p) if p.is_empty() || p.starts_with('/') => Ok(Some(p.to_string())),
        Some(p) => Err(error(format!(
            "`{key}`: `{p}` is not a JSON pointer (empty, or starting with `/`)"
        ))),
    }
}

/// A JSON value as a cursor or key text: a string as itself, anything else as JSON.
fn text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl State {
    fn partition(&self) -> Vec<(String, String)> {
        vec![("url".to_string(), self.url.clone())]
    }

    fn offset(cursor: &Option<String>) -> Vec<(String, String)> {
        cursor
            .as_ref()
            .map(|c| vec![("cursor".to_string(), c.clone())])
            .unwrap_or_default()
    }

    fn request_url(&self) -> String {
        match &self.cursor {
            None => self.url.clone(),
            Some(c) => {
                let sep = if self.url.contains('?') { '&' } else { '?' };
                format!(
                    "{}{sep}{}={}",
                    self.url,
                    encode_query_value(&self.cursor_param),
                    encode_query_value(c)
                )
            }
        }
    }

    /// One request; its records queued in `pending`.
    fn fetch(&mut self) -> Result<(), PluginError> {
        let url = self.request_url();
        let resp = match send(&Request {
            method: "GET",
            url: &url,
            headers: &[("accept".to_string(), "application/json".to_string())],
            body: &[],
            timeout_ms: self.timeout_ms,
            max_response_bytes: self.max_bytes,
        }) {
            Ok(r) => r,
            Err(HttpError::Transport(m)) => {
                log(Level::Warn, &format!("{m}; will poll again"));
                return Ok(());
            }
            Err(e) => return Err(error(e.to_string())),
        };
        if !(200..300).contains(&resp.status) {
            log(
                Level::Warn,
                &format!("GET {url}: HTTP {}; will poll again", resp.status),
            );
            return Ok(());
        }
        let body: serde_json::Value = match serde_json::from_slice(&resp.body) {
            Ok(v) => v,
            Err(e) => {
                log(
                    Level::Warn,
                    &format!("GET {url}: the body is not JSON ({e}); will poll again"),
                );
                return Ok(());
            }
        };
        let elements = match body.pointer(&self.records_pointer) {
            Some(serde_json::Value::Array(a)) => a.as_slice(),
            Some(serde_json::Value::Null) | None => &[],
            Some(_) => {
                return Err(error(format!(
                    "GET {url}: the value at http.response.records.pointer `{}` is not an array",
                    self.records_pointer
                )))
            }
        };
        let new_cursor = match &self.cursor_pointer {
            Some(p) => match body.pointer(p) {
                Some(serde_json::Value::Null) | None => self.cursor.clone(),
                Some(v) => Some(text(v)),
            },
            None => None,
        };
        let partition = self.partition();
        let old_offset = Self::offset(&self.cursor);
        let new_offset = Self::offset(&new_cursor);
        for e in elements {
            let key = self
                .key_pointer
                .as_ref()
                .and_then(|p| e.pointer(p))
                .map(|k| text(k).into_bytes());
            self.pending.push_back(SourceRecord {
                record: Record {
                    key,
                    value: Some(e.to_string().into_bytes()),
                    headers: Vec::new(),
                    timestamp_ms: 0,
                },
                source_partition: partition.clone(),
                source_offset: old_offset.clone(),
                topic: None,
            });
        }
        // Only the last record carries the new cursor: the host stores the offset of the
        // last record of each poll, so the new cursor is durable only with every record
        // of this response.
        if let Some(last) = self.pending.back_mut() {
            last.source_offset = new_offset;
        }
        if new_cursor != self.cursor {
            log(
                Level::Debug,
                &format!("{} records, cursor now {:?}", elements.len(), new_cursor),
            );
        }
        self.cursor = new_cursor;
        Ok(())
    }
}

struct HttpSource;

impl Guest for HttpSource {
    fn open(
        config: Vec<(String, String)>,
        offsets: Vec<SourcePosition>,
    ) -> Result<(), PluginError> {
        let url = get(&config, "http.url")
            .ok_or_else(|| error("missing required key `http.url`".into()))?
            .to_string();
        let mut state = State {
            interval_ms: number(&config, "poll.interval.ms", 200)?,
            records_pointer: pointer_key(&config, "http.response.records.pointer")?
                .unwrap_or_default(),
            key_pointer: pointer_key(&config, "http.record.key.pointer")?,
            cursor_pointer: pointer_key(&config, "http.response.cursor.pointer")?,
            cursor_param: get(&config, "http.request.cursor.param")
                .unwrap_or("cursor")
                .to_string(),
            timeout_ms: number(&config, "http.timeout.ms", 400)?.max(1),
            max_bytes: number(&config, "http.response.max.bytes", 8 << 20)? as usize,
            url,
            cursor: None,
            last_request_ms: 0,
            pending: VecDeque::new(),
        };
        let partition = state.partition();
        state.cursor = offsets
            .iter()
            .find(|p| p.source_partition == partition)
            .and_then(|p| p.source_offset.iter().find(|(k, _)| k == "cursor"))
            .map(|(_, v)| v.clone());
        log(
            Level::Info,
            &format!("polling {} from cursor {:?}", state.url, state.cursor),
        );
        STATE.with(|s| *s.borrow_mut() = Some(state));
        Ok(())
    }

    fn poll(max_records: u32) -> Result<Vec<SourceRecord>, PluginError> {
        STATE.with(|s| {
            let mut guard = s.borrow_mut();
            let state = guard
                .as_mut()
                .ok_or_else(|| error("called before open".into()))?;
            if state.pending.is_empty() {
                let now = now_ms();
                if now.saturating_sub(state.last_request_ms) < state.interval_ms {
                    return Ok(Vec::new());
                }
                state.last_request_ms = now;
                state.fetch()?;
            }
            let n = state.pending.len().min(max_records as usize);
            Ok(state.pending.drain(..n).collect())
        })
    }

    fn commit(_offsets: Vec<SourcePosition>) {}

    fn close() {
        STATE.with(|s| *s.borrow_mut() = None);
    }
}

export!(HttpSource);
