//! The floor for `benches/run.sh`: the same bytes the broker receives, pushed through a
//! plain loopback TCP socket into a file by the smallest program that does it. Nothing a
//! broker does beyond `read` + `write` (framing, CRCs, offsets, indexes, responses) is
//! in it, so "weir at N% of the floor" says how much of the machine's socket-to-file
//! bandwidth weir turns into records, on the same noisy machine in the same run.
//!
//! ```text
//! floor server FILE [PORT]         accept one connection on 127.0.0.1 (port 0 = free),
//!                                  print `floor listening on 127.0.0.1:PORT`, write
//!                                  everything received into FILE, ack one byte at EOF
//! floor client ADDR BYTES [REC]    push BYTES in 1 MiB writes, wait for the ack, print
//!                                  bytes/s and records/s for REC-byte records (default 100)
//! floor [BYTES] [REC]              both in one process, FILE in the temp dir
//! floor source FILE [PORT]         the consume direction: accept one connection, send
//!                                  FILE (from the page cache) in 1 MiB writes, close
//! floor drain ADDR [REC]           read until EOF, print the same line as `client`
//! ```
//!
//! The result is one line, `floor: bytes=.. secs=.. MB/s=.. records/s=.. record_bytes=..`
//! (MB = 10^6 bytes, as rdkafka_performance counts). The server also prints its own
//! line; the client's (connect to ack) is the figure: it includes the server's last
//! write. No fsync on either side, as weir's default (page cache) durability.
//! Built as a `harness = false` bench target: `cargo bench --bench floor` runs the
//! in-process mode with 500 MB (cargo's extra `--bench` argument is ignored).

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

const CHUNK: usize = 1 << 20;
const DEFAULT_BYTES: u64 = 5_000_000 * 100;
const DEFAULT_RECORD: u64 = 100;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let result = match args.first().map(String::as_str) {
        Some("server") if args.len() >= 2 => {
            let port = args.get(2).map(|p| parse(p)).transpose();
            port.and_then(|p| {
                let listener = bind(p.unwrap_or(0) as u16)?;
                println!("floor listening on {}", listener.local_addr()?);
                std::io::stdout().flush()?;
                serve(listener, Path::new(&args[1])).map(|_| ())
            })
        }
        Some("client") if args.len() >= 3 => {
            let record = args.get(3).map(|r| parse(r)).transpose();
            match (args[1].parse::<SocketAddr>(), parse(&args[2]), record) {
                (Ok(addr), Ok(bytes), Ok(record)) => {
                    client(addr, bytes, record.unwrap_or(DEFAULT_RECORD))
                }
                (Err(e), _, _) => Err(format!("bad address {}: {e}", args[1]).into()),
                (_, Err(e), _) | (_, _, Err(e)) => Err(e),
            }
        }
        Some("source") if args.len() >= 2 => {
            let port = args.get(2).map(|p| parse(p)).transpose();
            port.and_then(|p| {
                let listener = bind(p.unwrap_or(0) as u16)?;
                println!("floor listening on {}", listener.local_addr()?);
                std::io::stdout().flush()?;
                source(listener, Path::new(&args[1]))
            })
        }
        Some("drain") if args.len() >= 2 => {
            let record = args.get(2).map(|r| parse(r)).transpose();
            match (args[1].parse::<SocketAddr>(), record) {
                (Ok(addr), Ok(record)) => drain(addr, record.unwrap_or(DEFAULT_RECORD)),
                (Err(e), _) => Err(format!("bad address {}: {e}", args[1]).into()),
                (_, Err(e)) => Err(e),
            }
        }
        Some("-h") | Some("--help") | Some("help") => {
            eprintln!(
                "usage: floor server FILE [PORT] | floor client ADDR BYTES [RECORD_BYTES]\n       \
                 floor source FILE [PORT] | floor drain ADDR [RECORD_BYTES]\n       \
                 floor [BYTES] [RECORD_BYTES]"
            );
            return ExitCode::from(2);
        }
        _ => {
            let bytes = args.first().map(|b| parse(b)).transpose();
            let record = args.get(1).map(|r| parse(r)).transpose();
            match (bytes, record) {
                (Ok(b), Ok(r)) => {
                    in_process(b.unwrap_or(DEFAULT_BYTES), r.unwrap_or(DEFAULT_RECORD))
                }
                (Err(e), _) | (_, Err(e)) => Err(e),
            }
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floor: error: {e}");
            ExitCode::FAILURE
        }
    }
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn parse(s: &str) -> Result<u64> {
    let s = s.replace('_', "");
    s.parse::<u64>()
        .map_err(|e| format!("bad number {s}: {e}").into())
}

fn bind(port: u16) -> Result<TcpListener> {
    Ok(TcpListener::bind(("127.0.0.1", port))?)
}

/// Accepts one connection, copies it into `path`, acks one byte at EOF. Returns the bytes.
fn serve(listener: TcpListener, path: &Path) -> Result<u64> {
    let (mut conn, _) = listener.accept()?;
    let mut file = File::create(path)?;
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    let start = Instant::now();
    loop {
        let n = match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        file.write_all(&buf[..n])?;
        total += n as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    conn.write_all(&[1])?;
    println!(
        "floor server: received={total} secs={secs:.3} file={}",
        path.display()
    );
    Ok(total)
}

fn client(addr: SocketAddr, bytes: u64, record: u64) -> Result<()> {
    let chunk: Vec<u8> = (0..CHUNK).map(|i| b'a' + (i % 26) as u8).collect();
    let start = Instant::now();
    let mut conn = TcpStream::connect(addr)?;
    let mut left = bytes;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        conn.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    conn.shutdown(Shutdown::Write)?;
    let mut ack = [0u8; 1];
    conn.read_exact(&mut ack)?;
    report(bytes, start.elapsed().as_secs_f64(), record);
    Ok(())
}

fn report(bytes: u64, secs: f64, record: u64) {
    let record = record.max(1);
    println!(
        "floor: bytes={bytes} secs={secs:.6} MB/s={:.1} records/s={:.0} record_bytes={record}",
        bytes as f64 / secs / 1e6,
        bytes as f64 / record as f64 / secs
    );
}

/// Accepts one connection and sends `path` over it, read in 1 MiB pieces.
fn source(listener: TcpListener, path: &Path) -> Result<()> {
    let (mut conn, _) = listener.accept()?;
    let mut file = File::open(path)?;
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        conn.write_all(&buf[..n])?;
    }
    conn.shutdown(Shutdown::Write)?;
    Ok(())
}

/// Connects and reads until EOF; the figure is connect to EOF.
fn drain(addr: SocketAddr, record: u64) -> Result<()> {
    let mut buf = vec![0u8; CHUNK];
    let start = Instant::now();
    let mut conn = TcpStream::connect(addr)?;
    let mut total = 0u64;
    loop {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
    }
    report(total, start.elapsed().as_secs_f64(), record);
    Ok(())
}

fn in_process(bytes: u64, record: u64) -> Result<()> {
    let listener = bind(0)?;
    let addr = listener.local_addr()?;
    let path = std::env::temp_dir().join(format!("weir-floor-{}.bin", std::process::id()));
    let server_path = path.clone();
    let server = std::thread::spawn(move || serve(listener, &server_path));
    let result = client(addr, bytes, record);
    let served = server.join().map_err(|_| "server thread panicked")?;
    let _ = std::fs::remove_file(&path);
    result?;
    served.map(|_| ())
}
