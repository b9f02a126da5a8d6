//! Outgoing HTTP for connectors (`wasi:http/outgoing-handler`), limited to an allowlist.
//!
//! Owns: the check of every request's authority against the connector's
//! [`HttpHost`] list, and sending the allowed ones (plain `http` over HTTP/1.1, through
//! hyper, with the timeouts the guest asked for in its `request-options`).
//!
//! Deliberately not: TLS. wasmtime-wasi-http's own sender brings rustls with aws-lc (a
//! C build); until a deployment needs https, an `https` URL is refused as an unsupported
//! scheme (the guest sees `HTTP-protocol-error`). A denied request never opens a
//! socket: the guest sees `HTTP-request-denied` and a warn line names the connector and
//! the authority.
//!
//! A connector with no [`HttpHost`] (every connector whose config has no HTTP keys) has
//! `wasi:http` linked but every request denied, so a component importing it still loads.

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use http::uri::Scheme;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

/// Longest a connect, or a wait for the first response byte, may take when the guest did
/// not set `request-options` (a guest call is bounded by `plugin.call.timeout.ms` anyway
/// only while guest code runs, not while it waits on the host).
const DEFAULT_TIMEOUT_MS: u64 = 30_000;

/// One entry of a connector's `http.allowed.hosts`: a host name or IP address
/// (compared case-insensitively) and, when given, the only port allowed; without a
/// port, any port of that host is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpHost {
    /// Host name or IP address, lower case (an IPv6 address without brackets).
    pub host: String,
    /// The port, or `None` for any.
    pub port: Option<u16>,
}

impl HttpHost {
    /// Parses `host` or `host:port` (`[v6]:port` for IPv6).
    ///
    /// Errors: an empty host or a port that is not a number from 1 to 65535.
    pub fn parse(text: &str) -> Result<HttpHost, String> {
        let text = text.trim();
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (h, after) = rest
                .split_once(']')
                .ok_or_else(|| format!("`{text}`: unclosed `[`"))?;
            (h, after.strip_prefix(':'))
        } else {
            match text.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') => (h, Some(p)),
                _ => (text, None),
            }
        };
        if host.is_empty() {
            return Err(format!("`{text}`: no host"));
        }
        let port = match port {
            None => None,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 => Some(n),
                _ => return Err(format!("`{text}`: `{p}` is not a port")),
            },
        };
        Ok(HttpHost {
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    /// The host and port of an absolute `http`/`https` URL (the port made explicit: 80
    /// or 443 by scheme), for the default allowlist of a connector's `http.url`.
    ///
    /// Errors: not an absolute URL with a host.
    pub fn of_url(url: &str) -> Result<HttpHost, String> {
        let uri: http::Uri = url
            .trim()
            .parse()
            .map_err(|e| format!("`{url}` is not a URL: {e}"))?;
        let host = uri
            .host()
            .ok_or_else(|| format!("`{url}` has no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        let port = uri.port_u16().or(match uri.scheme_str() {
            Some("http") => Some(80),
            Some("https") => Some(443),
            _ => None,
        });
        Ok(HttpHost { host, port })
    }

    /// Whether every request `other` allows is allowed by `self` too: the same host, and
    /// any port here or the same port as `other`'s (a port-less `other`, any port, is
    /// covered only by a port-less `self`).
    pub fn covers(&self, other: &HttpHost) -> bool {
        self.host == other.host && (self.port.is_none() || self.port == other.port)
    }

    fn allows(&self, host: &str, port: u16) -> bool {
        self.host == host && self.port.is_none_or(|p| p == port)
    }
}

/// `host`, `host:port`, or `[v6]:port`: the form [`HttpHost::parse`] reads.
impl std::fmt::Display for HttpHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.port {
            None => f.write_str(&self.host),
            Some(p) if self.host.contains(':') => write!(f, "[{}]:{p}", self.host),
            Some(p) => write!(f, "{}:{p}", self.host),
        }
    }
}

/// The `wasi:http` hooks of one connector instance: its name (for log lines) and its
/// allowlist.
pub(crate) struct HttpHooks {
    connector: Arc<str>,
    allowed: Arc<[HttpHost]>,
}

impl HttpHooks {
    pub(crate) fn new(connector: Arc<str>, allowed: &[HttpHost]) -> HttpHooks {
        HttpHooks {
            connector,
            allowed: allowed.into(),
        }
    }

    /// Whether the authority of `uri` is on the allowlist; `Err` names it when not.
    fn check(&self, uri: &http::Uri) -> Result<(), String> {
        let host = uri
            .host()
            .unwrap_or("")
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        let port = uri
            .port_u16()
            .unwrap_or(if uri.scheme() == Some(&Scheme::HTTPS) {
                443
            } else {
                80
            });
        if self.allowed.iter().any(|a| a.allows(&host, port)) {
            Ok(())
        } else {
            Err(format!("{host}:{port}"))
        }
    }
}

type SendFuture = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), Error>> + Send>,
                ),
                Error,
            >,
        > + Send,
>;

impl WasiHttpHooks for HttpHooks {
    fn is_supported_scheme(&mut self, scheme: &Scheme) -> bool {
        *scheme == Scheme::HTTP
    }

    fn default_scheme(&mut self) -> Option<Scheme> {
        Some(Scheme::HTTP)
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> SendFuture {
        drop(fut);
        if let Err(authority) = self.check(request.uri()) {
            tracing::warn!(
                connector = &*self.connector,
                host = %authority,
                "HTTP request denied: the host is not in the connector's http.allowed.hosts"
            );
            return Box::new(async { Err(Error::HttpRequestDenied) });
        }
        Box::new(send(request, options))
    }
}

/// Sends `request` over a new HTTP/1.1 connection with the guest's timeouts (or
/// [`DEFAULT_TIMEOUT_MS`]).
async fn send(
    mut request: http::Request<WasiBody>,
    options: Option<RequestOptions>,
) -> Result<
    (
        http::Response<WasiBody>,
        Box<dyn Future<Output = Result<(), Error>> + Send>,
    ),
    Error,
> {
    use http_body_util::BodyExt;
    let default = Duration::from_millis(DEFAULT_TIMEOUT_MS);
    let connect_timeout = options.and_then(|o| o.connect_timeout).unwrap_or(default);
    let first_byte_timeout = options
        .and_then(|o| o.first_byte_timeout)
        .unwrap_or(default);
    let uri = request.uri().clone();
    let host = uri.host().ok_or(Error::HttpRequestUriInvalid)?;
    let port = uri.port_u16().unwrap_or(80);
    let addr = format!(
        "{}:{port}",
        host.trim_start_matches('[').trim_end_matches(']')
    );
    let stream =
        match tokio::time::timeout(connect_timeout, tokio::net::TcpStream::connect(&addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                return Err(Error::ConnectionRefused)
            }
            Ok(Err(e)) => return Err(Error::Connect(e)),
            Err(_) => return Err(Error::ConnectionTimeout),
        };
    let (mut sender, conn) = tokio::time::timeout(
        connect_timeout,
        hyper::client::conn::http1::handshake(TokioIo::new(stream)),
    )
    .await
    .map_err(|_| Error::ConnectionTimeout)??;
    // Origin form on the wire: the authority is in the Host header.
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    *request.uri_mut() = path.parse().map_err(|_| Error::HttpRequestUriInvalid)?;
    let mut conn = Some(conn);
    let mut response = pin!(tokio::time::timeout(
        first_byte_timeout,
        sender.send_request(request)
    ));
    // Drive the connection while waiting for the response head.
    let response = std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = response.as_mut().poll(cx) {
            return Poll::Ready(r);
        }
        if let Some(c) = conn.as_mut() {
            if let Poll::Ready(r) = Pin::new(c).poll(cx) {
                conn = None;
                if let Err(e) = r {
                    return Poll::Ready(Ok(Err(e)));
                }
                return response.as_mut().poll(cx);
            }
        }
        Poll::Pending
    })
    .await
    .map_err(|_| Error::ConnectionReadTimeout)??;
    let response = response.map(|body| body.map_err(Error::from).boxed_unsync());
    let io: Box<dyn Future<Output = Result<(), Error>> + Send> = Box::new(async move {
        let _sender = sender;
        match conn {
            Some(c) => c.await.map_err(Error::from),
            None => Ok(()),
        }
    });
    Ok((response, io))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_parse_and_match() {
        let a = HttpHost::parse("Example.COM").unwrap();
        assert!(a.allows("example.com", 8080));
        let b = HttpHost::parse("127.0.0.1:9000").unwrap();
        assert!(b.allows("127.0.0.1", 9000));
        assert!(!b.allows("127.0.0.1", 9001));
        assert_eq!(
            HttpHost::parse("[::1]:80").unwrap(),
            HttpHost {
                host: "::1".into(),
                port: Some(80)
            }
        );
        assert!(HttpHost::parse("h:0").is_err());
        assert!(HttpHost::parse(":80").is_err());
        assert_eq!(
            HttpHost::of_url("http://localhost/x?y=1").unwrap(),
            HttpHost {
                host: "localhost".into(),
                port: Some(80)
            }
        );
        assert!(HttpHost::of_url("not a url").is_err());
    }
}
