//! A small blocking HTTP client over `wasi:http/outgoing-handler` for weir's HTTP
//! connectors: one request, its whole response, with a deadline.
//!
//! Every request carries `connect-timeout` and `first-byte-timeout` (and
//! `between-bytes-timeout`) from [`Request::timeout_ms`], so a call never waits on the
//! host past the connector's own limit, which the connector keeps below
//! `plugin.call.timeout.ms`. Responses are read up to [`Request::max_response_bytes`].
//!
//! The host grants only the connector's `http.allowed.hosts`: any other authority ends
//! in [`HttpError::Denied`] (wasi:http's `HTTP-request-denied`).

use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    ErrorCode, Fields, Method, OutgoingBody, OutgoingRequest, RequestOptions, Scheme,
};
use wasip2::io::streams::StreamError;

/// Largest chunk written to an output stream at once (wasi's `blocking-write-and-flush`
/// takes at most 4096 bytes).
const WRITE_CHUNK_BYTES: usize = 4096;

/// One request to send.
pub struct Request<'a> {
    /// `GET`, `POST`, ...
    pub method: &'a str,
    /// An absolute `http://host[:port]/path[?query]` URL.
    pub url: &'a str,
    /// Header lines (name, value).
    pub headers: &'a [(String, String)],
    /// Body (empty for none).
    pub body: &'a [u8],
    /// Deadline of the connect, of the first response byte, and between body bytes, in ms.
    pub timeout_ms: u64,
    /// Most response body bytes read; more is an error.
    pub max_response_bytes: usize,
}

/// A whole response.
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers, names in lower case.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Why a request got no response.
#[derive(Debug)]
pub enum HttpError {
    /// The host refused it: the authority is not in `http.allowed.hosts`.
    Denied(String),
    /// The request could not be built (bad URL, method, header).
    Invalid(String),
    /// Connecting, sending or reading failed, or a deadline passed (worth retrying).
    Transport(String),
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Denied(m) => write!(f, "HTTP request denied: {m}"),
            HttpError::Invalid(m) => write!(f, "invalid HTTP request: {m}"),
            HttpError::Transport(m) => write!(f, "HTTP request failed: {m}"),
        }
    }
}

fn code_error(url: &str, code: ErrorCode) -> HttpError {
    match code {
        ErrorCode::HttpRequestDenied => HttpError::Denied(format!(
            "{url} is outside the connector's http.allowed.hosts"
        )),
        ErrorCode::HttpRequestUriInvalid | ErrorCode::HttpProtocolError => {
            HttpError::Invalid(format!("{url}: {code:?} (only http:// URLs are supported)"))
        }
        other => HttpError::Transport(format!("{url}: {other:?}")),
    }
}

/// Splits `http://authority/path?query` into scheme, authority and path-with-query.
fn split_url(url: &str) -> Result<(Scheme, &str, &str), HttpError> {
    let (scheme, rest) = if let Some(r) = url.strip_prefix("http://") {
        (Scheme::Http, r)
    } else if let Some(r) = url.strip_prefix("https://") {
        (Scheme::Https, r)
    } else {
        return Err(HttpError::Invalid(format!("`{url}` is not an http:// URL")));
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        return Err(HttpError::Invalid(format!("`{url}` has no host")));
    }
    Ok((scheme, authority, path))
}

/// Sends `req` and reads the whole response.
///
/// Errors: [`HttpError`].
pub fn send(req: &Request<'_>) -> Result<Response, HttpError> {
    let (scheme, authority, path) = split_url(req.url)?;
    let headers = Fields::new();
    for (k, v) in req.headers {
        headers
            .append(&k.to_ascii_lowercase(), v.as_bytes())
            .map_err(|e| HttpError::Invalid(format!("header `{k}`: {e:?}")))?;
    }
    if req.method != "GET" || !req.body.is_empty() {
        // A declared length, not chunked: what simple endpoints (python's http.server)
        // read, and the host checks the body against it.
        headers
            .append("content-length", &req.body.len().to_string().into_bytes())
            .map_err(|e| HttpError::Invalid(format!("content-length: {e:?}")))?;
    }
    let request = OutgoingRequest::new(headers);
    let method = match req.method {
        "GET" => Method::Get,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        other => Method::Other(other.to_string()),
    };
    let bad = |what: &str| HttpError::Invalid(format!("{}: bad {what}", req.url));
    request.set_method(&method).map_err(|_| bad("method"))?;
    request
        .set_scheme(Some(&scheme))
        .map_err(|_| bad("scheme"))?;
    request
        .set_authority(Some(authority))
        .map_err(|_| bad("authority"))?;
    request
        .set_path_with_query(Some(path))
        .map_err(|_| bad("path"))?;
    let options = RequestOptions::new();
    let timeout_ns = req.timeout_ms.saturating_mul(1_000_000);
    // A host may not support one of these; the others still bound the call.
    let _ = options.set_connect_timeout(Some(timeout_ns));
    let _ = options.set_first_byte_timeout(Some(timeout_ns));
    let _ = options.set_between_bytes_timeout(Some(timeout_ns));
    let body = request
        .body()
        .map_err(|_| HttpError::Invalid("request body taken twice".into()))?;
    let future =
        outgoing_handler::handle(request, Some(options)).map_err(|c| code_error(req.url, c))?;
    {
        let stream = body
            .write()
            .map_err(|_| HttpError::Invalid("request body stream taken twice".into()))?;
        for chunk in req.body.chunks(WRITE_CHUNK_BYTES) {
            if let Err(e) = stream.blocking_write_and_flush(chunk) {
                // The host may have refused the request (denied, bad URI) and closed the
                // body: its answer says why.
                future.subscribe().block();
                if let Some(Ok(Err(code))) = future.get() {
                    return Err(code_error(req.url, code));
                }
                return Err(HttpError::Transport(format!(
                    "{}: writing the body: {e:?}",
                    req.url
                )));
            }
        }
    }
    OutgoingBody::finish(body, None).map_err(|c| code_error(req.url, c))?;
    future.subscribe().block();
    let response = match future.get() {
        Some(Ok(Ok(r))) => r,
        Some(Ok(Err(code))) => return Err(code_error(req.url, code)),
        Some(Err(())) | None => {
            return Err(HttpError::Transport(format!("{}: no response", req.url)))
        }
    };
    let status = response.status();
    let headers = response
        .headers()
        .entries()
        .into_iter()
        .map(|(k, v)| {
            (
                k.to_ascii_lowercase(),
                String::from_utf8_lossy(&v).into_owned(),
            )
        })
        .collect();
    let incoming = response
        .consume()
        .map_err(|_| HttpError::Transport("response body taken twice".into()))?;
    let mut out = Vec::new();
    {
        let stream = incoming
            .stream()
            .map_err(|_| HttpError::Transport("response body stream taken twice".into()))?;
        loop {
            match stream.blocking_read(64 * 1024) {
                Ok(bytes) => {
                    if out.len() + bytes.len() > req.max_response_bytes {
                        return Err(HttpError::Transport(format!(
                            "{}: response body larger than {} bytes",
                            req.url, req.max_response_bytes
                        )));
                    }
                    out.extend_from_slice(&bytes);
                }
                Err(StreamError::Closed) => break,
                Err(StreamError::LastOperationFailed(e)) => {
                    return Err(HttpError::Transport(format!(
                        "{}: reading the response: {}",
                        req.url,
                        e.to_debug_string()
                    )))
                }
            }
        }
    }
    Ok(Response {
        status,
        headers,
        body: out,
    })
}

/// Milliseconds since the Unix epoch (wall clock).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Parses an HTTP `Retry-After` value: delay-seconds, or an IMF-fixdate
/// (`Sun, 06 Nov 1994 08:49:37 GMT`, RFC 9110 §10.2.3) taken relative to `now_ms`.
/// Returns the wait in ms (0 for a date in the past); `None` when unparseable.
pub fn retry_after_ms(value: &str, now_ms: u64) -> Option<u64> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(secs.saturating_mul(1000));
    }
    let date_ms = http_date_ms(v)?;
    Some(date_ms.saturating_sub(now_ms))
}

/// An IMF-fixdate as ms since the epoch.
fn http_date_ms(v: &str) -> Option<u64> {
    // "Sun, 06 Nov 1994 08:49:37 GMT"
    let rest = v.split_once(", ")?.1;
    let mut parts = rest.split(' ');
    let day: u64 = parts.next()?.parse().ok()?;
    let month = match parts.next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let year: i64 = parts.next()?.parse().ok()?;
    let mut hms = parts.next()?.split(':');
    let h: u64 = hms.next()?.parse().ok()?;
    let m: u64 = hms.next()?.parse().ok()?;
    let s: u64 = hms.next()?.parse().ok()?;
    if parts.next()? != "GMT" || !(1..=31).contains(&day) || h > 23 || m > 59 || s > 60 {
        return None;
    }
    let days = days_from_civil(year, month, day as i64);
    let secs = u64::try_from(days).ok()? * 86_400 + h * 3600 + m * 60 + s;
    Some(secs * 1000)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Formats ms since the epoch as an IMF-fixdate (for tests and servers).
pub fn format_http_date(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // civil_from_days
    let z = days + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let wd = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][days.rem_euclid(7) as usize];
    let mon = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ][(m - 1) as usize];
    format!(
        "{wd}, {d:02} {mon} {y} {:02}:{:02}:{:02} GMT",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Percent-encodes a query parameter value (RFC 3986 unreserved characters kept).
pub fn encode_query_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The last value of `key` in a connector's config, trimmed; `None` when absent or blank.
pub fn config_get<'a>(config: &'a [(String, String)], key: &str) -> Option<&'a str> {
    config
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// `key` as a non-negative integer, `default` when absent.
///
/// Errors: the value is not a non-negative integer, as a message naming the key.
pub fn config_number(config: &[(String, String)], key: &str, default: u64) -> Result<u64, String> {
    match config_get(config, key) {
        None => Ok(default),
        Some(v) => v
            .parse()
            .map_err(|_| format!("`{key}`: `{v}` is not a non-negative integer")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_seconds_and_dates() {
        assert_eq!(retry_after_ms("3", 0), Some(3000));
        assert_eq!(retry_after_ms("0", 0), Some(0));
        let now = 784_111_777_000; // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(format_http_date(now), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(
            retry_after_ms("Sun, 06 Nov 1994 08:49:39 GMT", now),
            Some(2000)
        );
        assert_eq!(
            retry_after_ms("Sun, 06 Nov 1994 08:49:30 GMT", now),
            Some(0)
        );
        assert_eq!(retry_after_ms("soon", now), None);
        assert_eq!(encode_query_value("a b/c"), "a%20b%2Fc");
    }
}
