//! The Kafka protocol spoken directly, for the subcommands whose APIs librdkafka (rdkafka
//! 0.39) lacks: `cluster describe` (DescribeCluster, DescribeQuorum) and `partition
//! reassign` (AlterPartitionReassignments, ListPartitionReassignments), and for those
//! whose broker error message its admin client drops (`topic create`, `topic alter
//! --partitions`, `topic delete`: CreateTopics, CreatePartitions, DeleteTopics), and for
//! the topic ids `topic describe` prints (Metadata v10+). Every
//! broker error is printed by [`error_text`]. A blocking
//! connection sends one request and reads its response (kafka-protocol's codecs), every
//! step bounded by [`IO_TIMEOUT`] and responses by [`MAX_RESPONSE_BYTES`].
//!
//! Never does: import broker internals; it is a client like any other.

use std::io::{Read as _, Write as _};
use std::net::{TcpStream, ToSocketAddrs as _};
use std::time::Duration;

use anyhow::Context as _;
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader,
};
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use kafka_protocol::ResponseError;

use crate::cli::client::CLIENT_ID;

/// How long connecting to a broker and each request may take.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest response read (bytes).
const MAX_RESPONSE_BYTES: usize = 16 << 20;

/// A connection speaking request then response.
pub(super) struct Conn {
    stream: TcpStream,
    correlation_id: i32,
}

impl Conn {
    /// Connects to `addr` (`host:port`).
    ///
    /// Errors: the address does not resolve, or no connection within [`IO_TIMEOUT`].
    pub(super) fn connect(addr: &str) -> anyhow::Result<Conn> {
        let sock = addr
            .to_socket_addrs()
            .with_context(|| format!("cannot resolve {addr}"))?
            .next()
            .with_context(|| format!("{addr} resolves to no address"))?;
        let stream = TcpStream::connect_timeout(&sock, IO_TIMEOUT)
            .with_context(|| format!("cannot connect to {addr}"))?;
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
        let _ = stream.set_nodelay(true);
        Ok(Conn {
            stream,
            correlation_id: 0,
        })
    }

    /// Lets each answer take up to `timeout` (10 s unless set), for a request the broker
    /// answers only once a change is committed.
    ///
    /// Errors: the socket refuses the setting.
    pub(super) fn set_read_timeout(&mut self, timeout: Duration) -> anyhow::Result<()> {
        self.stream.set_read_timeout(Some(timeout))?;
        Ok(())
    }

    /// Connects to `addr` and asks ApiVersions (v0): the connection with the versions
    /// offered.
    ///
    /// Errors: as [`Conn::connect`] and [`Conn::call`]; ApiVersions answered with an error.
    pub(super) fn open(addr: &str) -> anyhow::Result<(Conn, ApiVersionsResponse)> {
        let mut conn = Conn::connect(addr)?;
        let versions = conn.call(&ApiVersionsRequest::default(), 0)?;
        anyhow::ensure!(
            versions.error_code == 0,
            "ApiVersions: {}",
            error_text(versions.error_code, None)
        );
        Ok((conn, versions))
    }

    /// Connects to the first address of the comma-separated `bootstrap` list that
    /// answers ApiVersions (v0), and returns the connection with the versions offered.
    ///
    /// Errors: no address answers; the last one's error is given.
    pub(super) fn bootstrap(bootstrap: &str) -> anyhow::Result<(Conn, ApiVersionsResponse)> {
        let mut last = None;
        for addr in bootstrap
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
        {
            match Conn::open(addr) {
                Ok(found) => return Ok(found),
                Err(e) => last = Some(e.context(format!("broker {addr}"))),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no bootstrap server given")))
    }

    /// Sends `req` at `version` and decodes its response.
    ///
    /// Errors: I/O (closed connection, timeout), a response too large, for another
    /// request, or one that does not decode.
    pub(super) fn call<R: Request>(
        &mut self,
        req: &R,
        version: i16,
    ) -> anyhow::Result<R::Response> {
        let key = ApiKey::try_from(R::KEY).map_err(|_| anyhow::anyhow!("API key {}", R::KEY))?;
        self.correlation_id += 1;
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(StrBytes::from_static_str(CLIENT_ID)));
        let mut buf = BytesMut::new();
        header.encode(&mut buf, key.request_header_version(version))?;
        req.encode(&mut buf, version)?;
        let len = u32::try_from(buf.len())?;
        let mut frame = len.to_be_bytes().to_vec();
        frame.extend_from_slice(&buf);
        self.stream
            .write_all(&frame)
            .with_context(|| format!("sending {key:?}"))?;
        let mut len = [0u8; 4];
        self.stream
            .read_exact(&mut len)
            .with_context(|| format!("reading the {key:?} response (connection closed?)"))?;
        let len = u32::from_be_bytes(len) as usize;
        anyhow::ensure!(
            len <= MAX_RESPONSE_BYTES,
            "{key:?} response of {len} bytes is too large"
        );
        let mut body = vec![0u8; len];
        self.stream.read_exact(&mut body)?;
        let mut body = Bytes::from(body);
        let h = ResponseHeader::decode(&mut body, key.response_header_version(version))?;
        anyhow::ensure!(
            h.correlation_id == self.correlation_id,
            "{key:?} response for another request"
        );
        R::Response::decode(&mut body, version)
    }
}

/// FindCoordinator (v3 at most: one key) for `key` of `key_type` (0 a group, 1 a
/// transactional id) through `conn`, then a connection to the coordinator: its node id,
/// the connection and the versions it offers.
///
/// Errors: the broker does not offer FindCoordinator; its error (name, code, message);
/// the coordinator cannot be reached.
pub(super) fn connect_coordinator(
    conn: &mut Conn,
    versions: &ApiVersionsResponse,
    key: &str,
    key_type: i8,
) -> anyhow::Result<(i32, Conn, ApiVersionsResponse)> {
    let version = version_of(versions, ApiKey::FindCoordinator, 3)
        .context("the broker does not offer FindCoordinator")?;
    let found = conn.call(
        &kafka_protocol::messages::FindCoordinatorRequest::default()
            .with_key(StrBytes::from_string(key.to_string()))
            .with_key_type(key_type),
        version,
    )?;
    anyhow::ensure!(
        found.error_code == 0,
        "FindCoordinator: {}",
        error_text(found.error_code, found.error_message.as_ref())
    );
    let addr = format!("{}:{}", found.host, found.port);
    let (conn, versions) = Conn::bootstrap(&addr)
        .with_context(|| format!("coordinator {} ({addr})", found.node_id.0))?;
    Ok((found.node_id.0, conn, versions))
}

/// The version of `key` to use: the highest both sides speak, if any.
pub(super) fn version_of(versions: &ApiVersionsResponse, key: ApiKey, ours: i16) -> Option<i16> {
    let a = versions.api_keys.iter().find(|a| a.api_key == key as i16)?;
    (a.min_version <= ours).then(|| a.max_version.min(ours))
}

/// A broker's error as every client subcommand prints it: Kafka's `Errors` name, the
/// code and the broker's `error_message` when it sent one, e.g.
/// `INVALID_REPLICA_ASSIGNMENT (39): The manual partition assignment includes broker 9,
/// but no such broker is registered.`; `INVALID_REPLICA_ASSIGNMENT (39)` without one.
pub(super) fn error_text(code: i16, message: Option<&StrBytes>) -> String {
    let name = match ResponseError::try_from_code(code) {
        None => "NONE".to_string(),
        Some(ResponseError::Unknown(_)) => "error".to_string(),
        Some(e) => crate::cli::client::screaming_snake(&format!("{e:?}")),
    };
    match message {
        Some(m) if !m.is_empty() => format!("{name} ({code}): {}", m.as_str()),
        _ => format!("{name} ({code})"),
    }
}
