//! Test harness: a real weir broker on an ephemeral port, in process or as the binary.
//!
//! `TestBroker::start()` runs `broker::run` on its own runtime thread with a temporary
//! `log.dirs`; the bound port goes into Metadata (advertised), so real clients that
//! reconnect to the advertised address reach it. `BinaryBroker` spawns the `weir` binary
//! (for kill -9 tests) and reads its "weir listening on" line.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kafka_protocol::protocol::Decodable;
use tokio::sync::watch;
use weir::config::{BrokerConfig, RawConfig};

/// A broker running in this process.
pub struct TestBroker {
    /// `127.0.0.1:PORT` (a controller-only node: its CONTROLLER listener).
    pub bootstrap: String,
    /// The log directory.
    pub data_dir: PathBuf,
    /// The admin HTTP API, `http://127.0.0.1:PORT` (an ephemeral port).
    pub admin_url: String,
    _tmp: Option<tempfile::TempDir>,
    shutdown: Option<watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The files under `data_dir` still open when `broker::run` returned.
    left_open: std::sync::Arc<std::sync::Mutex<Option<Vec<PathBuf>>>>,
}

impl TestBroker {
    /// A broker with default settings in a fresh temp dir.
    pub fn start() -> TestBroker {
        TestBroker::start_with(&[])
    }

    /// A broker with extra `KEY=VALUE` overrides in a fresh temp dir.
    pub fn start_with(overrides: &[&str]) -> TestBroker {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path().to_path_buf();
        let mut b = TestBroker::start_in(&dir, overrides);
        b._tmp = Some(tmp);
        b
    }

    /// A broker over an existing data dir (restart tests); the caller owns the dir.
    pub fn start_in(dir: &Path, overrides: &[&str]) -> TestBroker {
        TestBroker::start_on(dir, overrides, weir::broker::MetadataStore::Quorum)
    }

    /// [`TestBroker::start_in`] with the metadata on `store` (the upgrade test makes a
    /// data dir on the earlier file store).
    pub fn start_on(
        dir: &Path,
        overrides: &[&str],
        store: weir::broker::MetadataStore,
    ) -> TestBroker {
        let mut raw = RawConfig::default();
        raw.set("listeners", "PLAINTEXT://127.0.0.1:0").unwrap();
        raw.set("log.dirs", dir.to_str().unwrap()).unwrap();
        raw.set("admin.listeners", "http://127.0.0.1:0").unwrap();
        raw.set("connect.allowed.paths", &temp_ceiling()).unwrap();
        raw.apply_overrides(overrides).unwrap();
        let config = BrokerConfig::from_raw(raw).unwrap();
        let (tx, rx) = watch::channel(false);
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let left_open = std::sync::Arc::new(std::sync::Mutex::new(None));
        let left = left_open.clone();
        let data_dir = dir.to_path_buf();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listeners = weir::broker::bind(&config).await.unwrap();
                let admin = listeners.admin.as_ref().map(|l| l.local_addr().unwrap());
                addr_tx
                    .send((listeners.kafka[0].local_addr().unwrap(), admin))
                    .unwrap();
                weir::broker::run_on(config, listeners, rx, store)
                    .await
                    .unwrap();
                // Still on the broker's runtime: a task `run` did not await, or an owner
                // kept alive by a reference cycle, would still hold its files here.
                *left.lock().unwrap() = Some(open_files_under(&data_dir));
            });
        });
        let (addr, admin) = addr_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("broker started");
        TestBroker {
            bootstrap: addr.to_string(),
            data_dir: dir.to_path_buf(),
            admin_url: admin.map(|a| format!("http://{a}")).unwrap_or_default(),
            _tmp: None,
            shutdown: Some(tx),
            thread: Some(thread),
            left_open,
        }
    }

    /// Stops the broker and waits for it; returns the files under its data dir that this
    /// process still had open when `broker::run` returned (before its runtime was
    /// dropped). Empty when the broker released everything.
    pub fn stop_and_list_open_files(mut self) -> Vec<PathBuf> {
        self.stop_inner();
        self.left_open
            .lock()
            .unwrap()
            .take()
            .expect("broker::run returned")
    }

    /// Stops the broker and waits for it (flushes logs).
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The files under `dir` this process has open (the targets of `/proc/self/fd`).
pub fn open_files_under(dir: &Path) -> Vec<PathBuf> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.starts_with(&dir))
        .collect()
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// The `weir` binary the tests run: `$WEIR_BIN` when set (a copy taken right after the
/// build, when several worktrees share one target dir and another build may relink
/// `target/debug/weir` mid-run), else the one Cargo built for this test binary.
pub fn weir_bin() -> PathBuf {
    std::env::var_os("WEIR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_weir")))
}

/// The `weir` binary as a child process.
pub struct BinaryBroker {
    /// `127.0.0.1:PORT` (a controller-only node: its CONTROLLER listener).
    pub bootstrap: String,
    /// The admin HTTP API, `http://127.0.0.1:PORT` (an ephemeral port).
    #[allow(dead_code)] // until the admin tests land
    pub admin_url: String,
    child: Child,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl BinaryBroker {
    /// Spawns `weir serve` over `dir` on a free port (or `port` if non-zero).
    pub fn spawn(dir: &Path, port: u16, overrides: &[&str]) -> BinaryBroker {
        BinaryBroker::spawn_in(None, dir, port, overrides)
    }

    /// As [`BinaryBroker::spawn`], inside the network namespace `netns` when given
    /// (`ip netns exec` execs the broker: the child's pid is the broker's).
    pub fn spawn_in(
        netns: Option<&str>,
        dir: &Path,
        port: u16,
        overrides: &[&str],
    ) -> BinaryBroker {
        let cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(weir_bin());
                c
            }
            None => Command::new(weir_bin()),
        };
        BinaryBroker::spawn_command(cmd, dir, port, overrides)
    }

    /// As [`BinaryBroker::spawn`], with `RLIMIT_NOFILE` soft and hard set to `nofile`
    /// (util-linux `prlimit` execs the broker: the child's pid is the broker's).
    pub fn spawn_with_nofile(dir: &Path, nofile: u64, overrides: &[&str]) -> BinaryBroker {
        let mut cmd = Command::new("prlimit");
        cmd.arg(format!("--nofile={nofile}:{nofile}"))
            .arg(weir_bin());
        BinaryBroker::spawn_command(cmd, dir, 0, overrides)
    }

    /// `cmd` (which runs the `weir` binary) with `serve` and the test overrides.
    fn spawn_command(mut cmd: Command, dir: &Path, port: u16, overrides: &[&str]) -> BinaryBroker {
        cmd.arg("serve")
            .arg("--override")
            .arg(format!("listeners=PLAINTEXT://127.0.0.1:{port}"))
            .arg("--override")
            .arg(format!("log.dirs={}", dir.display()))
            .arg("--override")
            .arg("admin.listeners=http://127.0.0.1:0")
            .arg("--override")
            .arg(format!("connect.allowed.paths={}", temp_ceiling()));
        for o in overrides {
            cmd.arg("--override").arg(o);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn weir");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let line = lines.next().expect("a line").expect("readable");
        // A controller-only node (process.roles=controller) has no Kafka and no admin
        // listener: its CONTROLLER address stands in for `bootstrap`.
        let (bootstrap, admin_url) =
            if let Some(controller) = line.strip_prefix("weir controller listening on ") {
                (controller.to_string(), String::new())
            } else {
                let bootstrap = line
                    .strip_prefix("weir listening on ")
                    .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
                    .to_string();
                // One "listening" line per Kafka listener; the first is `bootstrap`.
                let mut line = lines.next().expect("a line").expect("readable");
                while line.starts_with("weir listening on ") {
                    line = lines.next().expect("a line").expect("readable");
                }
                let admin_url = line
                    .strip_prefix("weir admin API on ")
                    .unwrap_or_else(|| panic!("unexpected second line {line:?}"))
                    .to_string();
                (bootstrap, admin_url)
            };
        // Keep draining stdout and stderr so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = stderr.clone();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        BinaryBroker {
            bootstrap,
            admin_url,
            child,
            stderr,
        }
    }

    /// The process id (for signals such as SIGSTOP / SIGCONT).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGKILL and waits; returns the broker's stderr.
    pub fn kill9(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stderr_text()
    }

    /// What the broker has written to stderr so far.
    pub fn stderr_text(&self) -> String {
        std::thread::sleep(Duration::from_millis(100));
        self.stderr.lock().unwrap().clone()
    }

    /// The lines of stderr from each `panicked` line to the 12 after it, or `None` when
    /// nothing panicked: what a failing "no panic" assertion prints first, so a CI log
    /// cut in its middle still shows the panic and not only the node's whole log.
    pub fn panic_excerpt(&self) -> Option<String> {
        let text = self.stderr_text();
        let lines: Vec<&str> = text.lines().collect();
        let mut excerpt = Vec::new();
        for (i, line) in lines.iter().enumerate() {
            if line.contains("panicked") {
                excerpt.extend_from_slice(&lines[i..(i + 13).min(lines.len())]);
                excerpt.push("...");
            }
        }
        (!excerpt.is_empty()).then(|| excerpt.join("\n"))
    }

    /// Waits at most `timeout` for the process to exit by itself (polled every 50 ms):
    /// its exit status, or `None` while it still runs (drop kills it).
    pub fn exit_within(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM and wait (graceful), returning stderr.
    pub fn terminate(mut self) -> String {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
        self.stderr_text()
    }
}

/// The connector ceiling test brokers get unless a test overrides it: the system temp
/// directory, where every test keeps its files (weir's default, `./connect-files`, is
/// for a broker run from a checkout).
pub fn temp_ceiling() -> String {
    std::env::temp_dir().display().to_string()
}

/// Polls `cond` every 50 ms until it holds; fails the test naming `what` after
/// `timeout_secs`. With [`poll_for`], the one way tests wait for something to happen (a
/// sleep is only for proving that something does not happen, and says so).
pub fn wait_until(what: &str, timeout_secs: u64, mut cond: impl FnMut() -> bool) {
    poll_for(what, timeout_secs, || {
        if cond() {
            Ok(())
        } else {
            Err(String::new())
        }
    })
}

/// Polls `probe` every 50 ms until it returns `Ok`, and returns that value; after
/// `timeout_secs` fails the test naming `what` and showing the last `Err` (the state seen,
/// e.g. what a file holds instead).
pub fn poll_for<T>(
    what: &str,
    timeout_secs: u64,
    mut probe: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(timeout_secs);
    loop {
        let seen = match probe() {
            Ok(value) => return value,
            Err(seen) => seen,
        };
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {timeout_secs} s waiting until {what}; {seen}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The repository root (for scripts under tests/).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

impl Drop for BinaryBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A raw Kafka connection for tests that send hand-made frames.
pub struct RawConn {
    stream: std::net::TcpStream,
}

impl RawConn {
    /// Connects to `bootstrap`.
    pub fn connect(bootstrap: &str) -> RawConn {
        let stream = std::net::TcpStream::connect(bootstrap).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        RawConn { stream }
    }

    /// Sets how long a read waits before it fails (10 s from `connect`).
    pub fn set_read_timeout(&mut self, timeout: Duration) {
        self.stream.set_read_timeout(Some(timeout)).unwrap();
    }

    /// The socket, for tests that read it their own way.
    pub fn stream(&mut self) -> &mut std::net::TcpStream {
        &mut self.stream
    }

    /// Writes raw bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        use std::io::Write;
        self.stream.write_all(bytes).expect("write");
    }

    /// True when the broker closes the connection within 5 s without sending anything
    /// more; false when the connection stays open (a read timeout is not a close).
    pub fn is_closed_by_broker(&mut self) -> bool {
        use std::io::Read;
        self.stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
            ),
        }
    }

    /// Reads one size-prefixed frame; `None` when the broker closed the connection.
    pub fn read_frame(&mut self) -> Option<Vec<u8>> {
        use std::io::Read;
        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len).ok()?;
        let mut buf = vec![0u8; u32::from_be_bytes(len) as usize];
        self.stream.read_exact(&mut buf).ok()?;
        Some(buf)
    }

    /// Encodes and sends a request with the kafka-protocol crate, without reading the
    /// answer.
    pub fn send_request<R>(&mut self, req: &R, version: i16, correlation_id: i32)
    where
        R: kafka_protocol::protocol::Request,
    {
        use kafka_protocol::protocol::Encodable;
        let key = kafka_protocol::messages::ApiKey::try_from(R::KEY).unwrap();
        let header = kafka_protocol::messages::RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(kafka_protocol::protocol::StrBytes::from_static_str(
                "raw-test",
            )));
        let mut buf = bytes::BytesMut::new();
        header
            .encode(&mut buf, key.request_header_version(version))
            .unwrap();
        req.encode(&mut buf, version).unwrap();
        let mut frame = (buf.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&buf);
        self.send_raw(&frame);
    }

    /// Encodes and sends a request with the kafka-protocol crate; returns the response body
    /// (after the response header).
    pub fn request<R>(&mut self, req: &R, version: i16, correlation_id: i32) -> Option<bytes::Bytes>
    where
        R: kafka_protocol::protocol::Request,
    {
        let key = kafka_protocol::messages::ApiKey::try_from(R::KEY).unwrap();
        self.send_request(req, version, correlation_id);
        let resp = self.read_frame()?;
        let mut body = bytes::Bytes::from(resp);
        let h = kafka_protocol::messages::ResponseHeader::decode(
            &mut body,
            key.response_header_version(version),
        )
        .unwrap();
        assert_eq!(h.correlation_id, correlation_id);
        Some(body)
    }
}

/// Decodes a response body.
pub fn decode<T: kafka_protocol::protocol::Decodable>(mut body: bytes::Bytes, version: i16) -> T {
    T::decode(&mut body, version).expect("decodable response")
}
