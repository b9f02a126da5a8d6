//! HTTP connectors (issue 5): the built-in `http-sink` and `http-source` against a small
//! HTTP/1.1 server in the test, with records produced and read by rdkafka.
//!
//! - A sink against a server failing ~30% of requests with 503 and refusing some
//!   records with 400: every record reaches the server exactly once or the DLQ topic.
//! - `Retry-After` in seconds and as an HTTP date is honoured; `0` does not busy-loop; a
//!   huge one is capped by `retry.backoff.max.ms` and does not hold up the broker's stop.
//! - A source with a cursor resumes from the stored cursor after a broker restart.
//! - Sandbox: hosts outside `http.allowed.hosts` are denied (FAILED, with the reason)
//!   and the server never sees a request.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::connect::{append, plugin_path, read_topic_for, wait_for_status};
use crate::harness::{poll_for, wait_until, TestBroker};

/// One request the test server received.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    query: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    at: Instant,
}

/// Status, headers and body of a reply.
type Reply = (u16, Vec<(String, String)>, Vec<u8>);

/// Decides the reply to a request; gets every request seen before it (this one last).
type Handler = Box<dyn Fn(&[Seen]) -> Reply + Send>;

/// A tiny HTTP/1.1 server (one request per connection, `Connection: close`) recording
/// what it receives.
struct Server {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
}

impl Server {
    fn start(handler: Handler) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let _ = serve_one(conn, &s, &handler);
            }
        });
        Server { addr, seen, stop }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn seen_on(&self, path: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|r| r.path == path).collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve_one(conn: TcpStream, seen: &Mutex<Vec<Seen>>, handler: &Handler) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let target = line.split(' ').nth(1).unwrap_or("/").to_string();
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), q.to_string()),
        None => (target, String::new()),
    };
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.trim_end().split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body)?;
    let reply = {
        let mut s = seen.lock().unwrap();
        s.push(Seen {
            path,
            query,
            headers,
            body,
            at: Instant::now(),
        });
        handler(&s)
    };
    let (status, headers, body) = reply;
    let mut out = format!(
        "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let mut conn = conn;
    conn.write_all(out.as_bytes())?;
    conn.write_all(&body)?;
    conn.flush()
}

fn ok() -> Reply {
    (200, vec![], b"{}".to_vec())
}

struct Dirs {
    _tmp: tempfile::TempDir,
    data: PathBuf,
    configs: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let configs = tmp.path().join("configs");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&configs).unwrap();
    Dirs {
        data,
        configs,
        _tmp: tmp,
    }
}

fn start(d: &Dirs) -> TestBroker {
    let dir = format!("connect.config.dir={}", d.configs.display());
    let plugins = format!("connect.plugin.path={}", plugin_path().display());
    TestBroker::start_in(&d.data, &[&dir, &plugins])
}

fn write_config(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(format!("{name}.toml")), text).unwrap();
}

fn produce(bootstrap: &str, topic: &str, values: &[String]) {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    for v in values {
        loop {
            match p.send(BaseRecord::<(), str>::to(topic).payload(v)) {
                Ok(()) => break,
                Err((_, _)) => {
                    p.poll(Duration::from_millis(50));
                }
            }
        }
    }
    p.flush(Duration::from_secs(30)).unwrap();
}

/// The ids in a request body: a JSON array of `{"id": n}` or one such object.
fn ids(body: &[u8]) -> Vec<u64> {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
    let one = |e: &serde_json::Value| e["id"].as_u64().unwrap();
    match &v {
        serde_json::Value::Array(a) => a.iter().map(one).collect(),
        other => vec![one(other)],
    }
}

/// Records of partition 0 of `topic` with their headers, reading until `expected`
/// arrived (or 30 s).
fn read_with_headers(
    bootstrap: &str,
    topic: &str,
    expected: usize,
) -> Vec<(String, BTreeMap<String, String>)> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "http-test-reader")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.len() < expected && Instant::now() < deadline {
        if let Some(m) = c.poll(Duration::from_millis(200)) {
            let m = m.unwrap();
            let mut h = BTreeMap::new();
            if let Some(hs) = m.headers() {
                for x in hs.iter() {
                    h.insert(
                        x.key.to_string(),
                        String::from_utf8_lossy(x.value.unwrap_or_default()).into_owned(),
                    );
                }
            }
            out.push((
                String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                h,
            ));
        }
    }
    out
}

#[test]
fn http_sink_delivers_each_record_once_or_to_the_dlq_despite_503s_and_400s() {
    const RECORDS: u64 = 400;
    let bad = |id: u64| id % 37 == 5;
    // Deterministic "random" 503s: about 30% of requests.
    let server = Server::start(Box::new(move |seen| {
        let n = seen.len() as u64;
        let r = seen.last().unwrap();
        if n.wrapping_mul(2_654_435_761) % 100 < 30 {
            return (503, vec![], b"busy".to_vec());
        }
        if ids(&r.body).into_iter().any(bad) {
            return (400, vec![], b"bad record".to_vec());
        }
        ok()
    }));
    let d = dirs();
    for (name, mode) in [("posts-batch", "batch"), ("posts-single", "single")] {
        write_config(
            &d.configs,
            name,
            &format!(
                "name = \"{name}\"\nconnector.class = \"http-sink\"\ntopics = \"orders\"\n\
                 http.url = \"{}\"\nhttp.request.mode = \"{mode}\"\nbatch.size = 25\n\
                 retry.backoff.ms = 1\nretry.backoff.max.ms = 20\n\
                 http.headers = \"X-A: 1|X-B: two\"\nhttp.auth.bearer.token = \"s3cret\"\n\
                 errors.tolerance = \"all\"\nerrors.deadletterqueue.topic.name = \"dlq-{mode}\"\n\
                 offset.flush.interval.ms = 100\n",
                server.url(&format!("/{mode}"))
            ),
        );
    }
    let broker = start(&d);
    let values: Vec<String> = (0..RECORDS)
        .map(|i| format!("{{\"id\":{i},\"item\":\"thing {i}\"}}"))
        .collect();
    produce(&broker.bootstrap, "orders", &values);
    let n_bad = (0..RECORDS).filter(|i| bad(*i)).count();
    for mode in ["batch", "single"] {
        let dlq = format!("dlq-{mode}");
        let dead = read_with_headers(&broker.bootstrap, &dlq, n_bad);
        assert_eq!(dead.len(), n_bad, "{mode}: every bad record in {dlq}");
        for (value, h) in &dead {
            let id = ids(value.as_bytes())[0];
            assert!(bad(id), "{mode}: a good record in the DLQ: {value}");
            assert_eq!(
                h.get("__connect.errors.topic").map(String::as_str),
                Some("orders")
            );
            assert_eq!(
                h.get("__connect.errors.offset").map(String::as_str),
                Some(id.to_string().as_str())
            );
            let msg = h.get("__connect.errors.exception.message").unwrap();
            assert!(msg.contains("HTTP 400"), "{msg}");
            let header = |k: &str| h.get(k).map(String::as_str);
            assert_eq!(header("__connect.errors.stage"), Some("TASK_PUT"));
            assert_eq!(header("__connect.errors.class.name"), Some("http-sink"));
            assert_eq!(
                header("__connect.errors.exception.class.name"),
                Some("ErrantRecord")
            );
            assert_eq!(
                header("__connect.errors.connector.name"),
                Some(format!("posts-{mode}").as_str())
            );
        }
    }
    // Every good record accepted (a 2xx) exactly once per connector. The server's
    // replies are decided in order, so replay the verdicts over what it saw.
    let seen = server.seen();
    for mode in ["batch", "single"] {
        let path = format!("/{mode}");
        wait_until(&format!("{mode}: every good record accepted"), 60, || {
            accepted_ids(&server.seen(), &path, bad).len() >= RECORDS as usize - n_bad
        });
        let got = accepted_ids(&server.seen(), &path, bad);
        let mut sorted = got.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), got.len(), "{mode}: a record accepted twice");
        let want: Vec<u64> = (0..RECORDS).filter(|i| !bad(*i)).collect();
        assert_eq!(sorted, want, "{mode}: every good record accepted");
        let r = server.seen_on(&path).pop().unwrap();
        let header = |k: &str| {
            r.headers
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(header("x-a").as_deref(), Some("1"));
        assert_eq!(header("x-b").as_deref(), Some("two"));
        assert_eq!(header("authorization").as_deref(), Some("Bearer s3cret"));
        assert_eq!(header("content-type").as_deref(), Some("application/json"));
    }
    assert!(
        seen.len() > RECORDS as usize / 25,
        "the server saw the traffic"
    );
    broker.stop();
}

/// Ids in requests to `path` that the server answered 2xx (recomputed from the same
/// rule the handler applies: position in the log and content).
fn accepted_ids(seen: &[Seen], path: &str, bad: impl Fn(u64) -> bool) -> Vec<u64> {
    let mut out = Vec::new();
    for (i, r) in seen.iter().enumerate() {
        let n = (i + 1) as u64;
        if r.path != path || n.wrapping_mul(2_654_435_761) % 100 < 30 {
            continue;
        }
        let ids = ids(&r.body);
        if ids.iter().any(|id| bad(*id)) {
            continue;
        }
        out.extend(ids);
    }
    out
}

/// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) for `t` (RFC 9110 §5.6.7).
fn http_date(t: SystemTime) -> String {
    let ts = jiff::Timestamp::try_from(t).unwrap();
    jiff::fmt::rfc2822::DateTimePrinter::new()
        .timestamp_to_rfc9110_string(&ts)
        .unwrap()
}

#[test]
fn http_sink_honours_retry_after_without_busy_looping_or_blocking_stop() {
    let first_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let fa = first_at.clone();
    let server = Server::start(Box::new(move |seen| {
        let r = seen.last().unwrap();
        let on_path = seen.iter().filter(|s| s.path == r.path).count();
        let retry = |v: String| (503, vec![("retry-after".to_string(), v)], b"wait".to_vec());
        match r.path.as_str() {
            // First request: wait 1 s, in seconds; then accepted.
            "/seconds" if on_path == 1 => retry("1".into()),
            // First request: wait until a date 2 s ahead (1-2 s at second precision).
            "/date" if on_path == 1 => retry(http_date(SystemTime::now() + Duration::from_secs(2))),
            // `Retry-After: 0` for 1.5 s after the first request: the backoff applies.
            "/zero" => {
                let mut f = fa.lock().unwrap();
                let first = *f.get_or_insert(r.at);
                if r.at.duration_since(first) < Duration::from_millis(1500) {
                    (429, vec![("retry-after".into(), "0".into())], vec![])
                } else {
                    ok()
                }
            }
            // A day, every time: capped by retry.backoff.max.ms.
            "/huge-capped" | "/huge" => retry("86400".into()),
            _ => ok(),
        }
    }));
    let d = dirs();
    for (name, path, max_ms) in [
        ("seconds", "/seconds", 60_000),
        ("date", "/date", 60_000),
        ("zero", "/zero", 400),
        ("huge-capped", "/huge-capped", 200),
        ("huge", "/huge", 600_000),
    ] {
        write_config(
            &d.configs,
            name,
            &format!(
                "name = \"{name}\"\nconnector.class = \"http-sink\"\ntopics = \"t-{name}\"\n\
                 http.url = \"{}\"\nretry.backoff.ms = 100\nretry.backoff.max.ms = {max_ms}\n\
                 errors.retry.timeout = -1\n",
                server.url(path)
            ),
        );
    }
    let broker = start(&d);
    for name in ["seconds", "date", "zero", "huge-capped", "huge"] {
        produce(
            &broker.bootstrap,
            &format!("t-{name}"),
            &[format!("{{\"id\":1,\"n\":\"{name}\"}}")],
        );
    }
    wait_until("the retried requests", 60, || {
        server.seen_on("/seconds").len() >= 2
            && server.seen_on("/date").len() >= 2
            && server.seen_on("/zero").iter().any(|r| {
                r.at.duration_since(first_at.lock().unwrap().unwrap_or(r.at))
                    >= Duration::from_millis(1500)
            })
            && server.seen_on("/huge-capped").len() >= 4
            && !server.seen_on("/huge").is_empty()
    });
    let gap = |path: &str| {
        let s = server.seen_on(path);
        s[1].at.duration_since(s[0].at)
    };
    assert!(
        gap("/seconds") >= Duration::from_millis(950),
        "Retry-After: 1 waited {:?}",
        gap("/seconds")
    );
    assert!(
        gap("/date") >= Duration::from_millis(950),
        "Retry-After: <date> waited {:?}",
        gap("/date")
    );
    assert_eq!(
        server.seen_on("/seconds").len(),
        2,
        "accepted after one retry"
    );
    // 1.5 s of `Retry-After: 0` with a 100 ms backoff doubling to 400 ms: a handful of
    // requests, not a busy loop.
    let zeros = server.seen_on("/zero").len();
    assert!(
        (2..=15).contains(&zeros),
        "{zeros} requests during 1.5 s of Retry-After: 0"
    );
    // The huge one is still waiting its (uncapped) day: stopping must not wait for it.
    assert_eq!(server.seen_on("/huge").len(), 1);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        broker.stop();
        let _ = tx.send(());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the broker stops while a sink waits out a Retry-After of a day");
}

#[test]
fn http_source_follows_the_cursor_and_resumes_from_it_after_a_restart() {
    // Items 0..total; `?cursor=N` returns up to 7 items from N and `next` = the cursor
    // after them.
    let total = Arc::new(Mutex::new(30u64));
    let t = total.clone();
    let server = Server::start(Box::new(move |seen| {
        let r = seen.last().unwrap();
        let from: u64 = r
            .query
            .strip_prefix("cursor=")
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let total = *t.lock().unwrap();
        let to = (from + 7).min(total);
        let items: Vec<serde_json::Value> = (from..to)
            .map(|i| serde_json::json!({"id": format!("k{i}"), "n": i}))
            .collect();
        let body = serde_json::json!({"meta": {"next": to}, "data": items});
        (200, vec![], body.to_string().into_bytes())
    }));
    let d = dirs();
    write_config(
        &d.configs,
        "items",
        &format!(
            "name = \"items\"\nconnector.class = \"http-source\"\ntopic = \"items\"\n\
             http.url = \"{}\"\npoll.interval.ms = 20\n\
             http.response.records.pointer = \"/data\"\nhttp.record.key.pointer = \"/id\"\n\
             http.response.cursor.pointer = \"/meta/next\"\n",
            server.url("/items")
        ),
    );
    let broker = start(&d);
    let got = read_topic_for(&broker.bootstrap, "items", 30, Duration::from_secs(60));
    assert_eq!(got.len(), 30, "every item once");
    for (i, (key, value)) in got.iter().enumerate() {
        assert_eq!(key.as_deref(), Some(format!("k{i}").as_str()));
        let v: serde_json::Value = serde_json::from_str(value).unwrap();
        assert_eq!(v["n"], i as u64);
    }
    // Non-empty polls also keep to poll.interval.ms: the cursor moved by 7 per request.
    let queries: Vec<String> = server.seen().iter().map(|r| r.query.clone()).collect();
    assert_eq!(
        &queries[..5],
        ["", "cursor=7", "cursor=14", "cursor=21", "cursor=28"]
    );
    broker.stop();

    *total.lock().unwrap() = 40;
    let before = server.seen().len();
    let broker = start(&d);
    let got = read_topic_for(&broker.bootstrap, "items", 40, Duration::from_secs(60));
    let values: Vec<u64> = got
        .iter()
        .map(|(_, v)| {
            serde_json::from_str::<serde_json::Value>(v).unwrap()["n"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(
        values,
        (0..40).collect::<Vec<_>>(),
        "resumed, nothing lost or repeated"
    );
    let after = server.seen();
    assert_eq!(
        after[before].query, "cursor=30",
        "the first request after the restart"
    );
    broker.stop();
}

/// A connector whose `http.url` its own `http.allowed.hosts` leaves out could only have
/// every request denied (by the wasi:http hook, `plugin::http`): since issue 16 such a
/// config is refused before anything runs (FAILED with the reason), and the server never
/// sees a request.
#[test]
fn http_connectors_reach_only_their_allowed_hosts() {
    let server = Server::start(Box::new(|_| ok()));
    let d = dirs();
    // A source whose own URL is not allowed.
    write_config(
        &d.configs,
        "src",
        &format!(
            "name = \"src\"\nconnector.class = \"http-source\"\ntopic = \"stolen\"\n\
             http.url = \"{}\"\nhttp.allowed.hosts = \"example.invalid\"\n\
             errors.retry.timeout = 300\n",
            server.url("/src")
        ),
    );
    // A sink allowed one port of the host, calling another.
    write_config(
        &d.configs,
        "sink",
        &format!(
            "name = \"sink\"\nconnector.class = \"http-sink\"\ntopics = \"out\"\n\
             http.url = \"{}\"\nhttp.allowed.hosts = \"127.0.0.1:1\"\n\
             errors.retry.timeout = 300\n",
            server.url("/sink")
        ),
    );
    let broker = start(&d);
    produce(&broker.bootstrap, "out", &["{\"secret\":1}".to_string()]);
    let src = wait_for_status(&broker.bootstrap, "status-connector-src", "FAILED");
    assert!(
        src.contains("`http.allowed.hosts`: does not include the host of http.url"),
        "{src}"
    );
    let sink = wait_for_status(&broker.bootstrap, "status-connector-sink", "FAILED");
    assert!(
        sink.contains("`http.allowed.hosts`: does not include the host of http.url"),
        "{sink}"
    );
    assert!(
        server.seen().is_empty(),
        "the server saw {:?}",
        server.seen()
    );
    broker.stop();
}

/// Kills the child process it holds when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn edge_gateway_pipeline_redacts_and_posts() {
    let shipped = crate::harness::repo_root().join("config/pipelines/edge-gateway");
    let d = dirs();
    let root = d.configs.parent().unwrap().to_path_buf();
    let (transforms, work) = (root.join("transforms"), root.join("work"));
    std::fs::create_dir_all(&transforms).unwrap();
    std::fs::create_dir_all(work.join("input")).unwrap();
    let input = work.join("input/app.log");
    let received = work.join("received.jsonl");
    std::fs::write(&input, "").unwrap();
    // The shipped endpoint, on a free port.
    let mut endpoint = std::process::Command::new("python3")
        .arg(shipped.join("endpoint.py"))
        .arg("0")
        .arg(&received)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs the shipped endpoint.py");
    let mut line = String::new();
    BufReader::new(endpoint.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _endpoint = Child(endpoint);
    let port: u16 = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .parse()
        .unwrap();
    // The shipped files with the paths and the port adjusted.
    let read = |p: &str| std::fs::read_to_string(shipped.join(p)).unwrap();
    let edge_in = read("connectors/edge-in.toml").replace(
        "\"work/input/app.log\"",
        &format!("\"{}\"", input.display()),
    );
    let edge_out =
        read("connectors/edge-out.toml").replace("127.0.0.1:8099", &format!("127.0.0.1:{port}"));
    let redact = read("transforms/redact-edge.toml").replace(
        "\"../../../../plugins/target/wasm32-wasip2/release/redact.wasm\"",
        &format!("\"{}\"", crate::guests::guest("redact").display()),
    );
    assert_ne!(edge_in, read("connectors/edge-in.toml"));
    assert_ne!(edge_out, read("connectors/edge-out.toml"));
    assert_ne!(redact, read("transforms/redact-edge.toml"));
    std::fs::write(d.configs.join("edge-in.toml"), edge_in).unwrap();
    std::fs::write(d.configs.join("edge-out.toml"), edge_out).unwrap();
    std::fs::write(transforms.join("redact-edge.toml"), redact).unwrap();
    let broker = TestBroker::start_in(
        &d.data,
        &[
            &format!("connect.config.dir={}", d.configs.display()),
            &format!("connect.plugin.path={}", plugin_path().display()),
            &format!("transform.config.dir={}", transforms.display()),
        ],
    );
    // The README's example, first and alone: what arrives is exactly what it shows.
    let readme = read("README.md");
    let documented = readme
        .lines()
        .find_map(|l| l.trim().strip_prefix("echo '"))
        .and_then(|l| l.split_once("' >> config/pipelines/edge-gateway/work/input/app.log"))
        .map(|(line, _)| line.to_string())
        .expect("the README appends a line to work/input/app.log");
    let shown = readme
        .lines()
        .find_map(|l| l.trim().strip_prefix("# ["))
        .map(|l| format!("[{l}"))
        .expect("the README shows what arrives");
    append(&input, &format!("{documented}\n"));
    poll_for("the endpoint receives the README's line", 60, || {
        let text = std::fs::read_to_string(&received).unwrap_or_default();
        match text.lines().next() {
            Some(first) if first == shown => Ok(()),
            Some(first) => Err(format!("received {first:?}, the README shows {shown:?}")),
            None => Err("nothing received yet".into()),
        }
    });
    std::fs::write(&received, "").unwrap();
    let lines = [
        r#"{"user":"ann","email":"ann@example.com","msg":"hi"}"#,
        r#"{"user":"bob","phone":"+1 555 0100","msg":"mail bob@example.org"}"#,
        r#"plain text from carl@example.net"#,
    ];
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&input)
        .unwrap();
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
    drop(f);
    let posted = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(&received)
            .unwrap_or_default()
            .lines()
            .flat_map(|l| serde_json::from_str::<Vec<serde_json::Value>>(l).unwrap_or_default())
            .collect()
    };
    wait_until("the endpoint receives the three lines", 60, || {
        posted().len() >= 3
    });
    let got = posted();
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[0]["user"], "ann");
    assert_eq!(got[0]["email"], "***");
    assert_eq!(got[1]["phone"], "***");
    assert_eq!(got[1]["msg"], "mail ***");
    assert_eq!(got[2], "plain text from ***");
    let text = std::fs::read_to_string(&received).unwrap();
    assert!(!text.contains("@example"), "{text}");
    broker.stop();
}

/// The `idempotency-key` header of a request, if any.
fn idempotency_key(r: &Seen) -> Option<String> {
    r.headers
        .iter()
        .find(|(k, _)| k == "idempotency-key")
        .map(|(_, v)| v.clone())
}

/// Issue 16: every request carries `Idempotency-Key: <topic>-<partition>-<first>-<last>`,
/// the same on each resend (after a 503, after a timeout whose request did arrive); a
/// request that never gets an answer in time is resent until `errors.retry.timeout` is
/// spent, then its records go to the dead-letter topic and the sink goes on, never
/// restarted (no status with an error), never resending them again.
#[test]
fn http_sink_resends_under_one_idempotency_key_and_dead_letters_what_never_gets_an_answer() {
    // One server each: the slow one's sleeping thread must not delay the other's answers.
    let slow = Arc::new(AtomicBool::new(true));
    let s = slow.clone();
    let slow_server = Server::start(Box::new(move |_| {
        if s.load(Ordering::SeqCst) {
            // Each request arrives, but its answer comes after the sink's http.timeout.ms.
            std::thread::sleep(Duration::from_millis(700));
        }
        ok()
    }));
    let flaky_server = Server::start(Box::new(|seen| {
        if seen.len() == 1 {
            return (503, vec![], b"busy".to_vec());
        }
        ok()
    }));
    let d = dirs();
    // The plugin call deadline well above one request's 200 ms timeout: a loaded machine
    // must not time a call out (that restart is not what this test is about).
    let dir = format!("connect.config.dir={}", d.configs.display());
    let plugins = format!("connect.plugin.path={}", plugin_path().display());
    let broker = TestBroker::start_in(&d.data, &[&dir, &plugins, "plugin.call.timeout.ms=10000"]);
    let values = |ids: std::ops::Range<u64>| -> Vec<String> {
        ids.map(|i| format!("{{\"id\":{i}}}")).collect()
    };
    produce(&broker.bootstrap, "flaky-in", &values(0..3));
    produce(&broker.bootstrap, "slow-in", &values(0..3));
    // The connectors start now (the config dir is watched): each reads its 3 records as
    // one batch.
    for (name, server) in [("slow", &slow_server), ("flaky", &flaky_server)] {
        write_config(
            &d.configs,
            name,
            &format!(
                "name = \"{name}\"\nconnector.class = \"http-sink\"\ntopics = \"{name}-in\"\n\
                 http.url = \"{}\"\nhttp.timeout.ms = 200\nretry.backoff.ms = 100\n\
                 errors.retry.timeout = 1500\nerrors.tolerance = \"all\"\n\
                 errors.deadletterqueue.topic.name = \"{name}-dlq\"\n\
                 offset.flush.interval.ms = 100\n",
                server.url(&format!("/{name}"))
            ),
        );
    }

    // A 503, then the same records again under the same key.
    wait_until("the flaky endpoint accepted a resend", 60, || {
        flaky_server.seen_on("/flaky").len() >= 2
    });
    let flaky = flaky_server.seen_on("/flaky");
    assert_eq!(ids(&flaky[0].body), vec![0, 1, 2]);
    assert_eq!(ids(&flaky[1].body), vec![0, 1, 2]);
    for r in &flaky[..2] {
        assert_eq!(idempotency_key(r).as_deref(), Some("flaky-in-0-0-2"));
    }

    // The slow endpoint: resent under one key until the retries are spent, then the
    // records are dead letters.
    let dead = read_with_headers(&broker.bootstrap, "slow-dlq", 3);
    assert_eq!(
        dead.len(),
        3,
        "the records that never got an answer are dead letters"
    );
    for (i, (value, h)) in dead.iter().enumerate() {
        assert_eq!(ids(value.as_bytes()), vec![i as u64]);
        assert_eq!(
            h.get("__connect.errors.exception.class.name")
                .map(String::as_str),
            Some("RetriesExhausted")
        );
        let msg = h.get("__connect.errors.exception.message").unwrap();
        assert!(msg.contains("errors.retry.timeout (1500 ms)"), "{msg}");
    }
    let tries = slow_server.seen_on("/slow");
    assert!(tries.len() >= 2, "resent: {} requests", tries.len());
    for r in &tries {
        assert_eq!(ids(&r.body), vec![0, 1, 2]);
        assert_eq!(idempotency_key(r).as_deref(), Some("slow-in-0-0-2"));
    }

    // The endpoint answers in time again: the sink went on, with the next records only.
    slow.store(false, Ordering::SeqCst);
    produce(&broker.bootstrap, "slow-in", &values(3..5));
    produce(&broker.bootstrap, "flaky-in", &values(3..5));
    // The ids of the requests to `server` carrying records after the first three.
    let later = |server: &Server| -> Vec<u64> {
        server
            .seen()
            .iter()
            .flat_map(|r| ids(&r.body))
            .filter(|id| *id >= 3)
            .collect()
    };
    wait_until("both sinks posted the next records", 60, || {
        later(&slow_server).len() >= 2 && later(&flaky_server).len() >= 2
    });
    for (name, server) in [("slow", &slow_server), ("flaky", &flaky_server)] {
        assert_eq!(
            later(server),
            vec![3, 4],
            "{name}: each once, nothing resent"
        );
        for r in server.seen() {
            let ids = ids(&r.body);
            let want = format!("{name}-in-0-{}-{}", ids[0], ids[ids.len() - 1]);
            assert_eq!(idempotency_key(&r), Some(want), "{name}");
        }
    }
    // Never restarted: no status of either task carries an error.
    let statuses = read_topic_for(
        &broker.bootstrap,
        "__connect_status",
        usize::MAX,
        Duration::from_secs(1),
    );
    assert!(!statuses.is_empty());
    for (k, v) in &statuses {
        let k = k.as_deref().unwrap_or_default();
        if k.starts_with("status-task-") && !v.is_empty() {
            let s: serde_json::Value = serde_json::from_str(v).unwrap();
            assert_eq!(s["trace"], serde_json::Value::Null, "{k}: {s}");
        }
    }
    broker.stop();
}
