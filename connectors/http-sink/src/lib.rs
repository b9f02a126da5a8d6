//! weir's built-in `http-sink` connector: POSTs records to an HTTP endpoint.
//!
//! Keys:
//! - `http.url` (required): where to POST (`http://` only).
//! - `http.request.mode`: `batch` (default; one request per `put`, body a JSON array) or
//!   `single` (one request per record, body the record's JSON). A value that parses as
//!   JSON is sent as that JSON; any other value as a JSON string; a null value as `null`.
//! - `http.headers`: extra headers, `Name: value` pairs separated by `|`
//!   (`X-A: 1|X-B: 2`; a `|` cannot appear in a value).
//! - `http.auth.basic.username` / `http.auth.basic.password`, or `http.auth.bearer.token`:
//!   the `Authorization` header.
//! - `retry.backoff.ms` (default 100) and `retry.backoff.max.ms` (default 30000): the
//!   wait after a retriable failure starts at the first and doubles per consecutive
//!   failure up to the second.
//! - `http.timeout.ms` (default 400): deadline of a connect and of the first response
//!   byte; also this sink's budget per `put` call: no new request starts once it is used
//!   up. Keep it below half of the broker's `plugin.call.timeout.ms`.
//!
//! Outcomes per response:
//! - 2xx: the records are settled.
//! - 429, 5xx, or no response (connection refused, timeout): retriable. `put` returns
//!   `retry` with the records settled so far and the wait: the larger of `Retry-After`
//!   (seconds or an HTTP date) and the backoff, at most `retry.backoff.max.ms`. So
//!   `Retry-After: 0` still waits the backoff (no busy loop) and a huge one waits the
//!   maximum. The host waits (never this guest) and puts only the unsettled rest again:
//!   a record a 2xx answered is not sent again by a retry.
//! - Any other 4xx: the record is errant (the host sends it to the dead-letter topic or
//!   fails the task, by `errors.tolerance`). In `batch` mode a 4xx for the batch is
//!   followed by one request per record, so only the records the endpoint refuses are
//!   errant.
//! - A request the host denies (`http.allowed.hosts`) or cannot build fails the task.
//!
//! Idempotency: every request carries `Idempotency-Key: <topic>-<partition>-<first
//! offset>-<last offset>` of the records in its body (the IETF httpapi draft's header
//! name; the value unquoted, as Stripe and most APIs take it), so an endpoint can tell a
//! resend — after a timeout whose request did arrive, say — from new records: a resend
//! carries the same records, hence the same key. A batch therefore holds records of one
//! topic partition: a `put` spanning several sends one request per partition run, in
//! order. A request that keeps failing (timeouts included) is retried with the backoff
//! until the host's `errors.retry.timeout` is spent; then its records go to the
//! dead-letter topic (`errors.tolerance=all`) or the task is FAILED (`none`).

use std::cell::RefCell;

use http_client::{now_ms, retry_after_ms, send, HttpError, Request, Response};

wit_bindgen::generate!({
    world: "sink-connector",
    path: "../../wit",
});

use exports::weir::plugin::sink::Guest;
use weir::plugin::connector_types::{
    ErrantRecord, PutResult, PutRetry, SinkRecord, TopicOffset, TopicPartition,
};
use weir::plugin::log::{log, Level};
use weir::plugin::types::PluginError;

/// Most response body bytes read (a sink only looks at the status and headers).
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Batch,
    Single,
}

struct State {
    url: String,
    mode: Mode,
    headers: Vec<(String, String)>,
    backoff_ms: u64,
    backoff_max_ms: u64,
    timeout_ms: u64,
    /// Consecutive retriable failures (0 after a success).
    failures: u32,
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

fn base64(input: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A record's value as JSON: itself when it is JSON, else a JSON string.
fn value_json(r: &SinkRecord) -> serde_json::Value {
    match &r.record.value {
        None => serde_json::Value::Null,
        Some(v) => serde_json::from_slice(v)
            .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(v).into_owned())),
    }
}

/// What one response means for the records it carried.
enum Verdict {
    Accepted,
    /// Wait this long, then try again.
    Retry(u64),
    /// Refused for good, with the reason.
    Errant(String),
}

/// The `Idempotency-Key` of a request carrying `records` (one topic partition, in offset
/// order): `<topic>-<partition>-<first offset>-<last offset>`. `None` for no records.
fn idempotency_key(records: &[SinkRecord]) -> Option<String> {
    let (first, last) = (records.first()?, records.last()?);
    Some(format!(
        "{}-{}-{}-{}",
        first.topic, first.partition, first.offset, last.offset
    ))
}

/// The end of the run of records of `records[start]`'s topic partition (exclusive).
fn run_end(records: &[SinkRecord], start: usize) -> usize {
    let Some(first) = records.get(start) else {
        return start;
    };
    records[start..]
        .iter()
        .position(|r| r.topic != first.topic || r.partition != first.partition)
        .map_or(records.len(), |k| start + k)
}

impl State {
    /// POSTs `body`, which carries `records`, with their idempotency key.
    fn post(&mut self, records: &[SinkRecord], body: &[u8]) -> Result<Verdict, PluginError> {
        let mut headers = self.headers.clone();
        if let Some(key) = idempotency_key(records) {
            headers.push(("idempotency-key".to_string(), key));
        }
        let r = send(&Request {
            method: "POST",
            url: &self.url,
            headers: &headers,
            body,
            timeout_ms: self.timeout_ms,
            max_response_bytes: MAX_RESPONSE_BYTES,
        });
        match r {
            Ok(resp) => Ok(self.judge(&resp)),
            Err(HttpError::Transport(m)) => {
                log(Level::Warn, &format!("{m}; will retry"));
                Ok(Verdict::Retry(self.backoff(None)))
            }
            Err(e @ (HttpError::Denied(_) | HttpError::Invalid(_))) => Err(error(e.to_string())),
        }
    }

    fn judge(&mut self, resp: &Response) -> Verdict {
        match resp.status {
            200..=299 => {
                self.failures = 0;
                Verdict::Accepted
            }
            429 | 500..=599 => {
                let after = resp
                    .header("retry-after")
                    .and_then(|v| retry_after_ms(v, now_ms()));
                Verdict::Retry(self.backoff(after))
            }
            status => {
                let text = String::from_utf8_lossy(&resp.body);
                let text: String = text.chars().take(200).collect();
                Verdict::Errant(format!("HTTP {status} from {}: {text}", self.url))
            }
        }
    }

    /// The wait before the next attempt: the larger of `retry_after` and the
    /// exponential backoff, at most `retry.backoff.max.ms`.
    fn backoff(&mut self, retry_after: Option<u64>) -> u64 {
        let exp = self.failures.min(30);
        self.failures = self.failures.saturating_add(1);
        let backoff = self.backoff_ms.saturating_mul(1u64 << exp);
        backoff
            .max(retry_after.unwrap_or(0))
            .min(self.backoff_max_ms)
    }

    /// Sends `records[start..end]` one by one, while the call's budget lasts (`first`:
    /// the index of the call's first request, which is always sent).
    fn singles(
        &mut self,
        records: &[SinkRecord],
        (start, end): (usize, usize),
        first: usize,
        began_ms: u64,
        errant: &mut Vec<ErrantRecord>,
    ) -> Result<Option<PutRetry>, PluginError> {
        for (i, r) in records.iter().enumerate().take(end).skip(start) {
            if i > first && now_ms().saturating_sub(began_ms) >= self.timeout_ms {
                return Ok(Some(PutRetry {
                    settled: i as u32,
                    after_ms: 0,
                }));
            }
            let body = serde_json::to_vec(&value_json(r)).map_err(|e| error(e.to_string()))?;
            match self.post(std::slice::from_ref(r), &body)? {
                Verdict::Accepted => {}
                Verdict::Retry(after_ms) => {
                    return Ok(Some(PutRetry {
                        settled: i as u32,
                        after_ms,
                    }))
                }
                Verdict::Errant(reason) => errant.push(ErrantRecord {
                    index: i as u32,
                    reason,
                }),
            }
        }
        Ok(None)
    }
}

impl State {
    /// Sends one request per run of records of one topic partition, in order, while the
    /// call's budget lasts; a run refused with a 4xx is sent again one record at a time,
    /// so only the records the endpoint refuses are errant.
    fn batches(
        &mut self,
        records: &[SinkRecord],
        began_ms: u64,
        errant: &mut Vec<ErrantRecord>,
    ) -> Result<Option<PutRetry>, PluginError> {
        let mut start = 0;
        while start < records.len() {
            if start > 0 && now_ms().saturating_sub(began_ms) >= self.timeout_ms {
                return Ok(Some(PutRetry {
                    settled: start as u32,
                    after_ms: 0,
                }));
            }
            let end = run_end(records, start);
            let run = &records[start..end];
            let body: Vec<serde_json::Value> = run.iter().map(value_json).collect();
            let body = serde_json::to_vec(&body).map_err(|e| error(e.to_string()))?;
            match self.post(run, &body)? {
                Verdict::Accepted => {}
                Verdict::Retry(after_ms) => {
                    return Ok(Some(PutRetry {
                        settled: start as u32,
                        after_ms,
                    }))
                }
                Verdict::Errant(reason) if run.len() == 1 => errant.push(ErrantRecord {
                    index: start as u32,
                    reason,
                }),
                Verdict::Errant(reason) => {
                    log(
                        Level::Info,
                        &format!(
                            "batch of {} refused ({reason}); sending one by one",
                            run.len()
                        ),
                    );
                    if let Some(retry) =
                        self.singles(records, (start, end), start, began_ms, errant)?
                    {
                        return Ok(Some(retry));
                    }
                }
            }
            start = end;
        }
        Ok(None)
    }
}

fn with_state<T>(f: impl FnOnce(&mut State) -> Result<T, PluginError>) -> Result<T, PluginError> {
    STATE.with(|s| match s.borrow_mut().as_mut() {
        Some(state) => f(state),
        None => Err(error("called before open".into())),
    })
}

struct HttpSink;

impl Guest for HttpSink {
    fn open(
        config: Vec<(String, String)>,
        _partitions: Vec<TopicPartition>,
    ) -> Result<(), PluginError> {
        let url = get(&config, "http.url")
            .ok_or_else(|| error("missing required key `http.url`".into()))?
            .to_string();
        let mode = match get(&config, "http.request.mode").unwrap_or("batch") {
            "batch" => Mode::Batch,
            "single" => Mode::Single,
            other => {
                return Err(error(format!(
                    "`http.request.mode`: `{other}`: expected batch or single"
                )))
            }
        };
        let mut headers = vec![("content-type".to_string(), "application/json".to_string())];
        for part in get(&config, "http.headers")
            .unwrap_or("")
            .split('|')
            .filter(|p| !p.trim().is_empty())
        {
            let (k, v) = part
                .split_once(':')
                .ok_or_else(|| error(format!("`http.headers`: `{part}` is not `Name: value`")))?;
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
        match (
            get(&config, "http.auth.basic.username"),
            get(&config, "http.auth.bearer.token"),
        ) {
            (Some(_), Some(_)) => {
                return Err(error(
                    "set either http.auth.basic.* or http.auth.bearer.token, not both".into(),
                ))
            }
            (Some(user), None) => {
                let password = get(&config, "http.auth.basic.password").unwrap_or("");
                headers.push((
                    "authorization".into(),
                    format!("Basic {}", base64(format!("{user}:{password}").as_bytes())),
                ));
            }
            (None, Some(token)) => {
                headers.push(("authorization".into(), format!("Bearer {token}")))
            }
            (None, None) => {}
        }
        let state = State {
            url,
            mode,
            headers,
            backoff_ms: number(&config, "retry.backoff.ms", 100)?.max(1),
            backoff_max_ms: number(&config, "retry.backoff.max.ms", 30_000)?,
            timeout_ms: number(&config, "http.timeout.ms", 400)?.max(1),
            failures: 0,
        };
        log(Level::Info, &format!("posting to {}", state.url));
        STATE.with(|s| *s.borrow_mut() = Some(state));
        Ok(())
    }

    fn put(records: Vec<SinkRecord>) -> Result<PutResult, PluginError> {
        with_state(|s| {
            let began_ms = now_ms();
            let mut errant = Vec::new();
            if records.is_empty() {
                return Ok(PutResult {
                    errant,
                    retry: None,
                });
            }
            let retry = match s.mode {
                Mode::Single => {
                    s.singles(&records, (0, records.len()), 0, began_ms, &mut errant)?
                }
                Mode::Batch => s.batches(&records, began_ms, &mut errant)?,
            };
            Ok(PutResult { errant, retry })
        })
    }

    fn flush(_offsets: Vec<TopicOffset>) -> Result<(), PluginError> {
        // Every settled record was answered 2xx already: nothing is buffered.
        Ok(())
    }

    fn close() {
        STATE.with(|s| *s.borrow_mut() = None);
    }
}

export!(HttpSink);

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_rfc4648() {
        assert_eq!(super::base64(b"user:pass"), "dXNlcjpwYXNz");
        assert_eq!(super::base64(b"a"), "YQ==");
        assert_eq!(super::base64(b"ab"), "YWI=");
    }
}
