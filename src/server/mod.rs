//! The TCP server: accepts connections, reads size-prefixed frames, hands each request to
//! the protocol layer, and writes responses back in request order.
//!
//! Owns: sockets, the frame size check (`socket.request.max.bytes`, checked *before*
//! allocating), the per-connection pipeline (requests handled one at a time in arrival
//! order — so pipelined produces are appended in order — while earlier answers are written;
//! at most `queued.max.requests` answers wait for the socket), the connection limit
//! (`max.connections`) and graceful shutdown.
//!
//! Never does: interpret request bodies, or touch `log`, `group` or `cluster`. A request
//! the protocol layer cannot parse closes that connection (with a log line), never the
//! broker.
//!
//! The warnings a client's bad frames cause (a frame outside `socket.request.max.bytes`,
//! one the protocol layer refuses: unparsable, unknown API, unsupported version) are rate
//! limited per peer IP by `warn_limit::PeerWarnings`: at most one line per peer per 10 s,
//! the next one saying how many were suppressed, so a client cannot fill the log.

pub(crate) mod warn_limit;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;

use warn_limit::PeerWarnings;

/// What the protocol layer makes of one request frame.
#[derive(Debug)]
pub enum Outcome {
    /// Send this (response header + body, without the 4-byte size prefix).
    Respond(BytesMut),
    /// Send these parts in order, `len` bytes in all (without the 4-byte size prefix):
    /// a response whose record sets stay in their segment files (a consumer's Fetch,
    /// issue 17). A file part is sent with `sendfile(2)`, straight from the page cache.
    RespondParts {
        /// Sum of the parts' lengths.
        len: usize,
        /// The response, in order.
        parts: Vec<ResponsePart>,
    },
    /// Send nothing (Produce with acks=0).
    NoResponse,
    /// Close the connection (unparseable request); the reason is logged.
    Close(String),
}

/// A piece of a response sent by [`Outcome::RespondParts`].
#[derive(Debug)]
pub enum ResponsePart {
    /// Bytes in memory.
    Bytes(Bytes),
    /// `len` bytes of `file` from byte `position`, sent with `sendfile(2)`. The file must
    /// hold them when the part is written: if it turns out shorter (truncated since), the
    /// response cannot be completed and the connection is closed (the client retries).
    File {
        /// An open file (a segment's `.log`).
        file: Arc<std::fs::File>,
        /// First byte.
        position: u64,
        /// Bytes to send.
        len: usize,
        /// Whatever must live until the part is sent or dropped (the protocol layer's
        /// share of a budget of held files).
        hold: Option<Box<dyn std::any::Any + Send>>,
    },
}

/// Writes `len` bytes of `file` from `position` to the socket with `sendfile(2)`: the
/// kernel moves them from the page cache to the socket, without a copy through this
/// process. Waits for the socket to be writable as often as needed. Returns the bytes
/// sent: fewer than `len` only when the file's file system refuses `sendfile` (EINVAL,
/// ENOSYS, EOPNOTSUPP) before anything was sent, for the caller to copy instead.
///
/// Errors: the socket's or the file's `std::io::Error`; `UnexpectedEof` when the file
/// ends before the range does.
async fn send_file(
    socket: &TcpStream,
    file: &std::fs::File,
    position: u64,
    len: usize,
) -> std::io::Result<usize> {
    let mut offset = position;
    let end = position + len as u64;
    while offset < end {
        socket.writable().await?;
        let count = ((end - offset) as usize).min(SENDFILE_CHUNK_BYTES);
        let sent = socket.try_io(tokio::io::Interest::WRITABLE, || {
            rustix::fs::sendfile(socket, file, Some(&mut offset), count).map_err(Into::into)
        });
        match sent {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "segment file ended inside a record set being sent",
                ))
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if offset == position && cannot_sendfile(&e) => return Ok(0),
            Err(e) => return Err(e),
        }
    }
    Ok(len)
}

/// Whether `sendfile(2)` failed because the file (its file system) does not support it.
fn cannot_sendfile(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error().map(rustix::io::Errno::from_raw_os_error),
        Some(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS | rustix::io::Errno::OPNOTSUPP)
    )
}

/// Writes `len` bytes of `file` from `position` through memory (`pread`, then the
/// socket), for a file `sendfile(2)` cannot send.
///
/// Errors: the file's or the socket's `std::io::Error`; `UnexpectedEof` when the file
/// ends before the range does.
async fn copy_file<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    file: &std::fs::File,
    position: u64,
    len: usize,
) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buffer = vec![0u8; len.min(SENDFILE_CHUNK_BYTES)];
    let mut done = 0usize;
    while done < len {
        let chunk = (len - done).min(buffer.len());
        file.read_exact_at(&mut buffer[..chunk], position + done as u64)?;
        w.write_all(&buffer[..chunk]).await?;
        done += chunk;
    }
    Ok(())
}

/// Most bytes one `sendfile(2)` call is asked to move, so one big record set does not
/// hold the socket's writer in the kernel for long.
const SENDFILE_CHUNK_BYTES: usize = 4 << 20;

/// The request handler the server calls, one call per frame (the frame without its size
/// prefix). Implemented by `protocol::Handler`; tests may plug in their own.
pub(crate) trait RequestHandler: Send + Sync + 'static {
    /// Handles one request. Must not panic on any input.
    fn handle(
        self: Arc<Self>,
        frame: Bytes,
        peer: SocketAddr,
    ) -> impl Future<Output = Outcome> + Send + 'static;
}

/// Server limits from the broker config.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServerLimits {
    /// `socket.request.max.bytes`: larger frames close the connection.
    pub request_max_bytes: usize,
    /// `max.connections`.
    pub max_connections: usize,
    /// `queued.max.requests`: answers waiting to be written per connection.
    pub queued_max_requests: usize,
    /// `connections.max.idle.ms`: a connection that sends nothing (or stalls inside a
    /// frame), or leaves an answer unread, for this long is closed, so stalled clients
    /// cannot hold every slot (nor, unread, the answers and segment files queued for them).
    pub connections_max_idle_ms: u64,
}

fn idle_close(peer: SocketAddr, limits: ServerLimits) -> std::io::Result<()> {
    tracing::info!(%peer, idle_ms = limits.connections_max_idle_ms, "closing idle connection (connections.max.idle.ms)");
    Ok(())
}

/// The writer of a client that has not read an answer for `connections.max.idle.ms`:
/// logged, and the connection closed (TimedOut).
fn stalled_writer(peer: SocketAddr, limits: ServerLimits) -> std::io::Result<()> {
    tracing::info!(%peer, idle_ms = limits.connections_max_idle_ms,
        "closing connection: an answer not read for connections.max.idle.ms");
    Err(std::io::ErrorKind::TimedOut.into())
}

/// What the connection's writer does after an answer.
enum Written {
    /// Goes on with the next one.
    More,
    /// Stops: the connection is closing.
    Closing,
}

/// Writes one answer to the connection's buffered socket (flushed when no other answer
/// is queued in `rx`, so pipelined answers share a write): bytes, and file regions with
/// `sendfile(2)` (a copy where the file system cannot).
async fn write_outcome(
    w: &mut BufWriter<OwnedWriteHalf>,
    outcome: Outcome,
    rx: &mpsc::Receiver<Outcome>,
    peer: SocketAddr,
    warnings: &PeerWarnings,
) -> std::io::Result<Written> {
    match outcome {
        Outcome::Respond(body) => {
            let len = body.len() as u32;
            w.write_all(&len.to_be_bytes()).await?;
            w.write_all(&body).await?;
        }
        Outcome::RespondParts { len, parts } => {
            w.write_all(&(len as u32).to_be_bytes()).await?;
            for part in parts {
                match part {
                    ResponsePart::Bytes(bytes) => w.write_all(&bytes).await?,
                    ResponsePart::File {
                        file,
                        position,
                        len,
                        hold: _hold,
                    } => {
                        // What is buffered goes first; then the kernel sends the file's
                        // bytes straight to the socket.
                        w.flush().await?;
                        let sent = send_file(w.get_ref().as_ref(), &file, position, len).await?;
                        if sent < len {
                            // The file system cannot sendfile: copy the rest.
                            copy_file(w, &file, position + sent as u64, len - sent).await?;
                        }
                    }
                }
            }
        }
        // An answer buffered before it (acks=0 after another request) must not wait for
        // the next answer: the flush below.
        Outcome::NoResponse => {}
        Outcome::Close(reason) => {
            if let Some(suppressed) = warnings.admit(peer.ip(), Instant::now()) {
                tracing::warn!(%peer, %reason, suppressed, "closing connection");
            }
            w.flush().await?;
            return Ok(Written::Closing);
        }
    }
    if rx.is_empty() {
        w.flush().await?;
    }
    Ok(Written::More)
}

/// Serves `listener` until `shutdown` turns true, then stops accepting, and waits for
/// every connection task to end (they end when their client disconnects or at shutdown).
pub(crate) async fn run<H: RequestHandler>(
    listener: TcpListener,
    handler: Arc<H>,
    limits: ServerLimits,
    mut shutdown: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let warnings = Arc::new(PeerWarnings::new());
    let mut conns = JoinSet::new();
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = shutdown.changed() => break,
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => break,
        };
        // Reap finished connection tasks so the set does not grow.
        while conns.try_join_next().is_some() {}
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                let handler = handler.clone();
                let shutdown = shutdown.clone();
                let warnings = warnings.clone();
                conns.spawn(async move {
                    let conn = Connection {
                        peer,
                        limits,
                        warnings,
                    };
                    if let Err(e) = serve_connection(stream, conn, handler, shutdown).await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                    drop(permit);
                });
            }
            Err(e) => {
                // EMFILE and friends: back off a little instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
    conns.shutdown().await;
}

/// What a connection task knows besides its socket.
struct Connection {
    peer: SocketAddr,
    limits: ServerLimits,
    /// The listener's warning limiter.
    warnings: Arc<PeerWarnings>,
}

async fn serve_connection<H: RequestHandler>(
    stream: TcpStream,
    conn: Connection,
    handler: Arc<H>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let Connection {
        peer,
        limits,
        warnings,
    } = conn;
    let writer_warnings = warnings.clone();
    let (mut reader, writer) = stream.into_split();
    // Requests of one connection are handled one at a time, in order, as Kafka does (a
    // pipelined Produce must not overtake the one before it); the writer task sends each
    // answer while the next request is read and handled. The bounded queue caps answers
    // waiting for a slow reader.
    let (tx, mut rx) = mpsc::channel::<Outcome>(limits.queued_max_requests);
    // A client that sends requests but stops reading the answers fills the socket; each
    // answer must be written within connections.max.idle.ms (Kafka closes a connection
    // with no I/O progress for that long), or the writer gives up and the connection
    // closes, letting go of the answers and the segment files they hold.
    let idle = std::time::Duration::from_millis(limits.connections_max_idle_ms);
    let writer_task = tokio::spawn(async move {
        let mut w = BufWriter::with_capacity(256 * 1024, writer);
        while let Some(outcome) = rx.recv().await {
            let written = write_outcome(&mut w, outcome, &rx, peer, &writer_warnings);
            match tokio::time::timeout(idle, written).await {
                Ok(Ok(Written::More)) => {}
                Ok(Ok(Written::Closing)) => return Ok(()),
                Ok(Err(e)) => return Err(e),
                Err(_) => return stalled_writer(peer, limits),
            }
        }
        match tokio::time::timeout(idle, w.flush()).await {
            Ok(flushed) => flushed,
            Err(_) => stalled_writer(peer, limits),
        }
    });

    let result = async {
        // One buffer per connection, filled without zeroing; each frame is split off it.
        let mut buf = BytesMut::with_capacity(64 * 1024);
        loop {
            while buf.len() < 4 {
                tokio::select! {
                    r = tokio::time::timeout(idle, reader.read_buf(&mut buf)) => match r {
                        Ok(Ok(0)) if buf.is_empty() => return Ok(()),
                        Ok(Ok(0)) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => return Err(e),
                        Err(_) => return idle_close(peer, limits),
                    },
                    _ = shutdown.changed() => return Ok(()),
                }
            }
            let len = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
            if len < 0 || len as usize > limits.request_max_bytes {
                if let Some(suppressed) = warnings.admit(peer.ip(), Instant::now()) {
                    tracing::warn!(%peer, frame_bytes = len, limit = limits.request_max_bytes,
                        suppressed,
                        "frame size outside 0..=socket.request.max.bytes; closing connection");
                }
                return Ok(());
            }
            let len = len as usize;
            buf.reserve((4 + len).saturating_sub(buf.len()));
            while buf.len() < 4 + len {
                match tokio::time::timeout(idle, reader.read_buf(&mut buf)).await {
                    Ok(Ok(0)) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return Err(e),
                    Err(_) => return idle_close(peer, limits),
                }
            }
            buf.advance(4);
            let frame = buf.split_to(len);
            let outcome = tokio::select! {
                o = handler.clone().handle(frame.freeze(), peer) => o,
                _ = shutdown.changed() => return Ok(()),
            };
            let closing = matches!(outcome, Outcome::Close(_));
            if tx.send(outcome).await.is_err() || closing {
                return Ok(()); // the connection is closing
            }
        }
    }
    .await;
    drop(tx);
    // The writer finishes the answers already queued, then ends.
    match writer_task.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "write failed"),
        Err(e) => tracing::warn!(%peer, error = %e, "writer task failed"),
    }
    result
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use tokio::io::AsyncReadExt;

    use super::*;

    fn file_of(content: &[u8]) -> std::fs::File {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(content).unwrap();
        file
    }

    /// `send_file` moves a range of 12 MiB to a reader that drains it slowly (the socket
    /// fills, `sendfile` would block, the loop waits for room), byte for byte.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn send_file_sends_the_range_through_a_full_socket() {
        let content: Vec<u8> = (0..14u32 << 20).map(|i| (i % 251) as u8).collect();
        let file = file_of(&content);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let reader = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut received = Vec::new();
            let mut chunk = vec![0u8; 64 << 10];
            loop {
                tokio::time::sleep(std::time::Duration::from_micros(200)).await;
                match socket.read(&mut chunk).await.unwrap() {
                    0 => break received,
                    n => received.extend_from_slice(&chunk[..n]),
                }
            }
        });
        let socket = TcpStream::connect(address).await.unwrap();
        let (position, len) = (1_000_003u64, 12 << 20);
        assert_eq!(send_file(&socket, &file, position, len).await.unwrap(), len);
        drop(socket);
        let received = reader.await.unwrap();
        assert_eq!(received.len(), len);
        assert!(received == content[position as usize..position as usize + len]);
    }

    /// A range past the file's end fails with UnexpectedEof (the connection is then
    /// closed): the response's length was already promised.
    #[tokio::test]
    async fn a_file_shorter_than_its_range_is_an_error() {
        let file = file_of(&[7u8; 1000]);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let socket = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let _peer = listener.accept().await.unwrap();
        let e = send_file(&socket, &file, 500, 1000).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        let mut out = Vec::new();
        let e = copy_file(&mut out, &file, 500, 1000).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    /// The copying fallback writes the same bytes, in chunks.
    #[tokio::test]
    async fn copy_file_writes_the_range() {
        let content: Vec<u8> = (0..10u32 << 20).map(|i| (i % 253) as u8).collect();
        let file = file_of(&content);
        let mut out = Vec::new();
        copy_file(&mut out, &file, 17, 9 << 20).await.unwrap();
        assert!(out == content[17..17 + (9 << 20)]);
        assert!(cannot_sendfile(&std::io::Error::from_raw_os_error(
            rustix::io::Errno::INVAL.raw_os_error()
        )));
        assert!(!cannot_sendfile(&std::io::Error::from_raw_os_error(
            rustix::io::Errno::PIPE.raw_os_error()
        )));
    }
}
