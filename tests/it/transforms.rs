//! Transform deployments (`weir::transform`, `/transforms`, `weir transform`): real
//! components from `plugins/` deployed on a running broker, records produced by rdkafka
//! into the input topic and read back from the outputs by an rdkafka consumer.
//!
//! Covered: deploy/list/delete through the CLI binary; routing to several outputs; a
//! broker restart mid-stream (no loss); hostile components with `errors.tolerance=all`
//! (dead-letter topic and its headers, the records around a panic still transformed,
//! other deployments flowing) and `none` (FAILED with the trap or timeout and the offset);
//! refusals at deploy; hot reload of a component while records flow, and of a corrupt one.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::Offset;
use serde_json::{json, Value};

use crate::guests::guest;
use crate::harness::{poll_for, wait_until, TestBroker};
use crate::rdkafka_client::{create_topic, producer, read_partition, Msg};

/// An HTTP call to the admin API: status and JSON body (`Null` when empty).
fn http(method: &str, url: &str, body: Option<Value>) -> (u16, Value) {
    let req = ureq::request(method, url).timeout(Duration::from_secs(60));
    let result = match body {
        Some(b) => req.send_json(b),
        None => req.call(),
    };
    let resp = match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {url}: {e}"),
    };
    let status = resp.status();
    let text = resp.into_string().expect("body");
    let value = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"))
    };
    (status, value)
}

/// `POST /transforms`, expecting 201.
fn deploy(admin: &str, spec: Value) -> Value {
    let (status, body) = http("POST", &format!("{admin}/transforms"), Some(spec));
    assert_eq!(status, 201, "{body}");
    body
}

fn status(admin: &str, name: &str) -> Value {
    let (code, body) = http("GET", &format!("{admin}/transforms/{name}"), None);
    assert_eq!(code, 200, "{body}");
    body
}

/// Waits until `name`'s status satisfies `cond`; returns that status.
fn wait_status(admin: &str, name: &str, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    poll_for(what, 30, || {
        let last = status(admin, name);
        if cond(&last) {
            Ok(last)
        } else {
            Err(format!("status {last}"))
        }
    })
}

async fn send(p: &FutureProducer, topic: &str, key: Option<&str>, value: &str) {
    let mut rec: FutureRecord<'_, str, str> = FutureRecord::to(topic).payload(value);
    if let Some(k) = key {
        rec = rec.key(k);
    }
    p.send(rec, Duration::from_secs(10))
        .await
        .expect("delivered");
}

/// Values of `count` records of partition 0 of `topic`, from the beginning.
fn values(bootstrap: &str, topic: &str, count: usize) -> Vec<String> {
    read_partition(bootstrap, topic, 0, Offset::Beginning, count)
        .into_iter()
        .map(|(_, v, _, _)| String::from_utf8(v.unwrap_or_default()).expect("utf-8"))
        .collect()
}

fn header<'a>(m: &'a Msg, key: &str) -> &'a str {
    m.3.iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| std::str::from_utf8(v).expect("utf-8"))
        .unwrap_or_else(|| panic!("no header {key} in {:?}", m.3))
}

/// Runs `weir transform ARGS --admin-url URL` in `dir`.
fn weir_transform(admin: &str, dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new("timeout")
        .arg("60")
        .arg(env!("CARGO_BIN_EXE_weir"))
        .arg("transform")
        .args(args)
        .args(["--admin-url", admin])
        .current_dir(dir)
        .output()
        .expect("run weir")
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_deploys_redact_lists_it_running_and_deletes_it() {
    let broker = TestBroker::start();
    let admin = broker.admin_url.clone();
    create_topic(&broker.bootstrap, "users", 1, &[]).await;
    let p = producer(&broker.bootstrap, &[]);
    for i in 0..20 {
        let v = format!(r#"{{"email":"u{i}@example.com","n":{i}}}"#);
        send(&p, "users", Some(&format!("k{i}")), &v).await;
    }
    // A relative --wasm is made absolute by the CLI (run from the guests' directory).
    let redact = guest("redact");
    let dir = redact.parent().expect("guest dir");
    let out = weir_transform(
        &admin,
        dir,
        &[
            "deploy",
            "redact-users",
            "--wasm",
            "redact.wasm",
            "--input",
            "users",
            "--output",
            "users-clean",
            "--config",
            "fields=email",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("deployed transform redact-users"));

    let got = values(&broker.bootstrap, "users-clean", 20);
    let want: Vec<String> = (0..20)
        .map(|i| format!(r#"{{"email":"***","n":{i}}}"#))
        .collect();
    assert_eq!(got, want);

    let s = wait_status(&admin, "redact-users", "20 records out", |s| {
        s["records_out"] == 20 && s["input_lag"] == 0
    });
    assert_eq!(s["state"], "RUNNING");
    assert_eq!(s["wasm"], redact.to_str().unwrap());
    assert_eq!(s["version"].as_str().unwrap().len(), 64);

    let out = weir_transform(&admin, dir, &["list"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listing = text(&out.stdout);
    eprintln!("{listing}");
    let header = listing.lines().next().expect("header");
    for col in [
        "NAME", "STATE", "MODE", "VERSION", "INPUT", "OUTPUTS", "LAG", "IN", "OUT", "ERRORS",
        "NS/REC",
    ] {
        assert!(header.contains(col), "{header}");
    }
    let row: Vec<&str> = listing
        .lines()
        .nth(1)
        .expect("a row")
        .split_whitespace()
        .collect();
    assert_eq!(&row[..3], ["redact-users", "RUNNING", "async"]);
    assert_eq!(row[3], &s["version"].as_str().unwrap()[..12]);
    assert_eq!(&row[4..10], ["users", "users-clean", "0", "20", "20", "0"]);

    // Errors print the server's message and exit non-zero.
    let again = weir_transform(
        &admin,
        dir,
        &[
            "deploy",
            "redact-users",
            "--wasm",
            "redact.wasm",
            "--input",
            "users",
            "--output",
            "x",
        ],
    );
    assert!(!again.status.success());
    // The refusal points at how to replace it.
    assert!(
        text(&again.stderr).contains("already exists")
            && text(&again.stderr).contains("weir transform deploy --replace"),
        "{}",
        text(&again.stderr)
    );

    let out = weir_transform(&admin, dir, &["delete", "redact-users"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let gone = weir_transform(&admin, dir, &["delete", "redact-users"]);
    assert!(!gone.status.success());
    assert!(text(&gone.stderr).contains("no transform named redact-users"));
    let (_, list) = http("GET", &format!("{admin}/transforms"), None);
    assert_eq!(list, json!([]));
    broker.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_writes_to_several_outputs() {
    let broker = TestBroker::start();
    let admin = broker.admin_url.clone();
    create_topic(&broker.bootstrap, "orders", 1, &[]).await;
    deploy(
        &admin,
        json!({
            "name": "by-region",
            "wasm": guest("route"),
            "input": "orders",
            "outputs": ["orders-other", "orders-eu", "orders-us"],
            "config": {"field": "region", "topic.format": "orders-${value}"},
        }),
    );
    let p = producer(&broker.bootstrap, &[]);
    let sent = [
        r#"{"region":"eu","n":1}"#,
        r#"{"region":"us","n":2}"#,
        r#"{"n":3}"#,
        r#"{"region":"eu","n":4}"#,
        "not json",
    ];
    for v in sent {
        send(&p, "orders", None, v).await;
    }
    assert_eq!(
        values(&broker.bootstrap, "orders-eu", 2),
        [sent[0], sent[3]]
    );
    assert_eq!(values(&broker.bootstrap, "orders-us", 1), [sent[1]]);
    assert_eq!(
        values(&broker.bootstrap, "orders-other", 2),
        [sent[2], sent[4]]
    );
    let s = wait_status(&admin, "by-region", "5 out", |s| s["records_out"] == 5);
    assert_eq!(s["records_in"], 5);
    assert_eq!(s["errors"], 0);
    broker.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_stream_loses_nothing() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let total = 400;
    let broker = TestBroker::start_in(tmp.path(), &[]);
    create_topic(&broker.bootstrap, "in", 1, &[]).await;
    deploy(
        &broker.admin_url,
        json!({"name": "copy", "wasm": guest("identity"), "input": "in", "outputs": ["out"]}),
    );
    let p = producer(&broker.bootstrap, &[]);
    for i in 0..total / 2 {
        send(&p, "in", None, &format!("v{i}")).await;
    }
    drop(p);
    broker.stop();

    let broker = TestBroker::start_in(tmp.path(), &[]);
    let s = status(&broker.admin_url, "copy");
    assert_eq!(s["state"], "RUNNING", "restored: {s}");
    let p = producer(&broker.bootstrap, &[]);
    for i in total / 2..total {
        send(&p, "in", None, &format!("v{i}")).await;
    }
    wait_status(&broker.admin_url, "copy", "no lag", |s| s["input_lag"] == 0);
    // At-least-once: every input record is in the output (duplicates are allowed).
    let hw = crate::rdkafka_client::high_watermark(&broker.bootstrap, "out", 0);
    assert!(hw >= total as i64, "out has {hw} records");
    let got: BTreeSet<String> = values(&broker.bootstrap, "out", hw as usize)
        .into_iter()
        .collect();
    let want: BTreeSet<String> = (0..total).map(|i| format!("v{i}")).collect();
    let missing: Vec<&String> = want.difference(&got).collect();
    assert!(missing.is_empty(), "lost {missing:?}");
    // The progress is a consumer group's committed offset.
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args([
            "group",
            "describe",
            "transform-copy",
            "-b",
            &broker.bootstrap,
        ])
        .output()
        .expect("weir group describe");
    let described = text(&out.stdout);
    eprintln!("{described}{}", text(&out.stderr));
    assert!(out.status.success());
    assert!(
        described.contains("in") && described.contains(&total.to_string()),
        "{described}"
    );
    broker.stop();
}

/// Issue 12: a deployment an earlier weir kept in `<log.dir>/__transforms/<name>.json`
/// moves into the cluster metadata at start (the file is removed) and runs; after
/// another restart it is still there, restored from the metadata alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_deployment_file_moves_into_the_metadata_at_start() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let legacy = tmp.path().join("__transforms");
    std::fs::create_dir_all(&legacy).unwrap();
    let spec = json!({"name": "legacy", "wasm": guest("identity"), "input": "old-in",
        "outputs": ["old-out"], "mode": "async", "config": {},
        "errors.tolerance": "none", "errors.deadletterqueue.topic.name": null});
    std::fs::write(legacy.join("legacy.json"), spec.to_string()).unwrap();

    let broker = TestBroker::start_in(tmp.path(), &[]);
    let s = status(&broker.admin_url, "legacy");
    assert_eq!(s["state"], "RUNNING", "{s}");
    assert!(
        !legacy.join("legacy.json").exists(),
        "the file is removed once the metadata has the deployment"
    );
    let p = producer(&broker.bootstrap, &[]);
    send(&p, "old-in", None, "before").await;
    drop(p);
    assert_eq!(
        values(&broker.bootstrap, "old-out", 1),
        vec!["before".to_string()]
    );
    broker.stop();

    let broker = TestBroker::start_in(tmp.path(), &[]);
    let s = status(&broker.admin_url, "legacy");
    assert_eq!(s["state"], "RUNNING", "restored from the metadata: {s}");
    let p = producer(&broker.bootstrap, &[]);
    send(&p, "old-in", None, "after").await;
    drop(p);
    assert_eq!(
        values(&broker.bootstrap, "old-out", 2),
        vec!["before".to_string(), "after".to_string()]
    );
    broker.stop();
}

/// Issue 11 §4: async transforms read the input with the log's record walker, and
/// `Ingest` writes their outputs with the one batch encoder, both keeping repeated header
/// keys (KIP-82). Before, kafka-protocol's decoder and encoder went through a header map
/// that kept one value per key, so `h: 1, g: x, h: 2` came out as `h: 2, g: x`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_headers_pass_through_an_async_transform_in_order() {
    use rdkafka::message::{Header, OwnedHeaders};
    let broker = TestBroker::start();
    create_topic(&broker.bootstrap, "in", 1, &[]).await;
    create_topic(&broker.bootstrap, "out", 1, &[]).await;
    deploy(
        &broker.admin_url,
        json!({"name": "copy", "wasm": guest("identity"), "input": "in", "outputs": ["out"]}),
    );
    let p = producer(&broker.bootstrap, &[]);
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "h",
            value: Some("1"),
        })
        .insert(Header {
            key: "g",
            value: Some("x"),
        })
        .insert(Header {
            key: "h",
            value: Some("2"),
        });
    p.send(
        FutureRecord::<str, str>::to("in")
            .key("k")
            .payload("v")
            .headers(headers),
        Duration::from_secs(10),
    )
    .await
    .expect("delivered");
    let got = read_partition(&broker.bootstrap, "out", 0, Offset::Beginning, 1);
    assert_eq!(got.len(), 1, "one record out");
    let want: Vec<(String, Vec<u8>)> = [("h", "1"), ("g", "x"), ("h", "2")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect();
    assert_eq!(got[0].3, want, "headers in order, repeats kept");
    assert_eq!(got[0].1.as_deref(), Some(&b"v"[..]));
    broker.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_with_tolerance_all_dead_letters_one_record_and_the_rest_flows() {
    let broker = TestBroker::start();
    let admin = broker.admin_url.clone();
    create_topic(&broker.bootstrap, "h-in", 1, &[]).await;
    let p = producer(&broker.bootstrap, &[("linger.ms", "50")]);
    // One produce batch: the panic is in the middle of the chunk the transform gets.
    let sends: Vec<_> = ["a", "b", "panic", "c", "d"]
        .iter()
        .map(|v| {
            p.send_result(FutureRecord::<str, str>::to("h-in").payload(*v))
                .expect("queued")
        })
        .collect();
    for s in sends {
        s.await.expect("sent").expect("delivered");
    }
    deploy(
        &admin,
        json!({
            "name": "hostile-all",
            "wasm": guest("hostile"),
            "input": "h-in",
            "outputs": ["h-out"],
            "errors.tolerance": "all",
            "errors.deadletterqueue.topic.name": "h-dlq",
        }),
    );
    assert_eq!(values(&broker.bootstrap, "h-out", 4), ["a", "b", "c", "d"]);
    let dlq = read_partition(&broker.bootstrap, "h-dlq", 0, Offset::Beginning, 1);
    assert_eq!(dlq.len(), 1);
    let m = &dlq[0];
    assert_eq!(m.1.as_deref(), Some(&b"panic"[..]));
    assert_eq!(header(m, "__connect.errors.topic"), "h-in");
    assert_eq!(header(m, "__connect.errors.partition"), "0");
    assert_eq!(header(m, "__connect.errors.offset"), "2");
    let message = header(m, "__connect.errors.exception.message");
    eprintln!("{message}");
    assert!(
        message.contains("trapped") && message.contains("asked to panic"),
        "{message}"
    );
    assert_eq!(header(m, "__connect.errors.stage"), "TRANSFORMATION");
    assert_eq!(header(m, "__connect.errors.class.name"), "hostile.wasm");
    assert_eq!(header(m, "__connect.errors.exception.class.name"), "Trap");
    // The same headers as an inline transform's dead letters (`inline::`).
    assert_eq!(header(m, "weir.errors.transform"), "hostile-all");
    assert_eq!(header(m, "weir.errors.plugin.version").len(), 64);
    // Later batches are still transformed.
    send(&p, "h-in", None, "e").await;
    assert_eq!(values(&broker.bootstrap, "h-out", 5)[4], "e");
    let s = wait_status(&admin, "hostile-all", "6 in", |s| s["records_in"] == 6);
    assert_eq!(s["state"], "RUNNING");
    assert_eq!(s["errors"], 1);
    assert_eq!(s["records_out"], 5);
    broker.stop();
}

/// An allocation bomb and a component trying to open a file and a socket: with tolerance
/// `all`, each failing record is dead-lettered with the reason (the memory limit; the
/// denied open and connect), the records around it flow, and the status counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocation_bomb_and_a_sandbox_escape_are_dead_lettered_with_the_reason() {
    let broker = TestBroker::start();
    let admin = broker.admin_url.clone();
    for t in ["bomb-in", "escape-in"] {
        create_topic(&broker.bootstrap, t, 1, &[]).await;
    }
    let p = producer(&broker.bootstrap, &[]);
    for v in ["a", "bomb", "b"] {
        send(&p, "bomb-in", None, v).await;
    }
    send(&p, "escape-in", None, "x").await;
    for (name, wasm, input, output, dlq) in [
        ("bomb", guest("hostile"), "bomb-in", "bomb-out", "bomb-dlq"),
        (
            "escape",
            guest("fs-escape"),
            "escape-in",
            "escape-out",
            "escape-dlq",
        ),
    ] {
        deploy(
            &admin,
            json!({
                "name": name,
                "wasm": wasm,
                "input": input,
                "outputs": [output],
                "errors.tolerance": "all",
                "errors.deadletterqueue.topic.name": dlq,
            }),
        );
    }
    assert_eq!(values(&broker.bootstrap, "bomb-out", 2), ["a", "b"]);
    let dlq = read_partition(&broker.bootstrap, "bomb-dlq", 0, Offset::Beginning, 1);
    assert_eq!(dlq[0].1.as_deref(), Some(&b"bomb"[..]));
    assert_eq!(
        header(&dlq[0], "__connect.errors.exception.class.name"),
        "MemoryLimit"
    );
    assert_eq!(header(&dlq[0], "__connect.errors.offset"), "1");

    let dlq = read_partition(&broker.bootstrap, "escape-dlq", 0, Offset::Beginning, 1);
    assert_eq!(dlq[0].1.as_deref(), Some(&b"x"[..]));
    let message = header(&dlq[0], "__connect.errors.exception.message");
    assert!(
        message.contains("open /etc/passwd: failed")
            && message.contains("connect 127.0.0.1:9: failed")
            && message.contains("env: 0 variables"),
        "{message}"
    );
    for name in ["bomb", "escape"] {
        let s = wait_status(&admin, name, "an error counted", |s| s["errors"] == 1);
        assert_eq!(s["state"], "RUNNING", "{name}: {s}");
    }
    broker.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tolerance_none_a_panic_or_a_loop_fails_the_deployment_and_others_keep_flowing() {
    let broker = TestBroker::start_with(&["plugin.call.timeout.ms=300"]);
    let admin = broker.admin_url.clone();
    for t in ["n-in", "spin-in", "ok-in"] {
        create_topic(&broker.bootstrap, t, 1, &[]).await;
    }
    let p = producer(&broker.bootstrap, &[]);
    for v in ["a", "panic", "b"] {
        send(&p, "n-in", None, v).await;
    }
    send(&p, "spin-in", None, "spin").await;
    for (name, input, output) in [
        ("hostile-none", "n-in", "n-out"),
        ("spinner", "spin-in", "spin-out"),
        ("healthy", "ok-in", "ok-out"),
    ] {
        deploy(
            &admin,
            json!({"name": name, "wasm": guest("hostile"), "input": input, "outputs": [output]}),
        );
    }
    for i in 0..50 {
        send(&p, "ok-in", None, &format!("ok{i}")).await;
    }
    let ok: Vec<String> = (0..50).map(|i| format!("ok{i}")).collect();
    assert_eq!(values(&broker.bootstrap, "ok-out", 50), ok);

    let failed = wait_status(&admin, "hostile-none", "FAILED", |s| s["state"] == "FAILED");
    let error = failed["error"].as_str().expect("error");
    eprintln!("{error}");
    assert!(
        error.contains("trapped") && error.contains("asked to panic"),
        "{error}"
    );
    assert!(error.contains("n-in-0 offset 1"), "{error}");
    // Progress stays at the failing record; the one before it was written.
    assert_eq!(failed["input_lag"], 2);
    assert_eq!(values(&broker.bootstrap, "n-out", 1), ["a"]);

    let spun = wait_status(&admin, "spinner", "FAILED", |s| s["state"] == "FAILED");
    let error = spun["error"].as_str().expect("error");
    eprintln!("{error}");
    assert!(error.contains("exceeded its deadline of 300 ms"), "{error}");
    assert!(error.contains("spin-in-0 offset 0"), "{error}");

    // Still flowing after both failed.
    send(&p, "ok-in", None, "late").await;
    assert_eq!(values(&broker.bootstrap, "ok-out", 51)[50], "late");
    let out = weir_transform(&admin, Path::new("."), &["list"]);
    let listing = text(&out.stdout);
    eprintln!("{listing}");
    assert!(listing
        .lines()
        .any(|l| l.starts_with("hostile-none") && l.contains("FAILED")));
    assert!(listing.contains("hostile-none: error: ") && listing.contains("offset 1"));
    assert!(listing
        .lines()
        .any(|l| l.starts_with("healthy") && l.contains("RUNNING")));
    broker.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploys_that_cannot_run_are_refused_with_the_reason() {
    let broker = TestBroker::start();
    let admin = broker.admin_url.clone();
    let tmp = tempfile::tempdir().expect("temp dir");
    let not_wasm = tmp.path().join("notes.wasm");
    std::fs::write(&not_wasm, b"hello, not wasm").expect("write");
    let spec = |wasm: &Path, config: Value| json!({"name": "t", "wasm": wasm, "input": "in", "outputs": ["out"], "config": config});
    let refused = |body: Value, want: &[&str]| {
        let (code, answer) = http("POST", &format!("{admin}/transforms"), Some(body));
        let message = answer["message"].as_str().unwrap_or_default().to_string();
        eprintln!("{code} {message}");
        assert_eq!(code, 400, "{answer}");
        assert_eq!(answer["error_code"], 400);
        for w in want {
            assert!(message.contains(w), "{message:?} lacks {w:?}");
        }
    };
    refused(
        spec(&not_wasm, json!({})),
        &["notes.wasm", "not a WebAssembly file"],
    );
    refused(
        spec(&guest("murmur2"), json!({})),
        &[
            "not a weir `transform` component",
            "weir:plugin/transformer@0.1.0",
        ],
    );
    refused(
        spec(&guest("withheld-import"), json!({})),
        &["weir:host/secrets@0.1.0"],
    );
    refused(
        spec(&guest("future-major"), json!({})),
        &["future_major.wasm", "not a weir `transform` component"],
    );
    refused(spec(&guest("redact"), json!({})), &["refused its config"]);
    refused(
        spec(&tmp.path().join("missing.wasm"), json!({})),
        &["cannot read wasm"],
    );
    refused(
        spec(Path::new("redact.wasm"), json!({})),
        &["wasm must be an absolute path"],
    );
    refused(
        json!({"name": "t", "wasm": guest("identity"), "input": "in"}),
        &["outputs"],
    );
    refused(
        json!({"name": "t", "wasm": guest("identity"), "input": "in", "outputs": ["in"]}),
        &["input topic"],
    );
    refused(
        json!({"name": "t", "wasm": guest("identity"), "input": "in", "outputs": ["o"], "mode": "later"}),
        &["mode must be one of async, inline"],
    );
    let (code, answer) = http("POST", &format!("{admin}/transforms"), None);
    assert_eq!(code, 400, "{answer}");

    // Nothing was accepted; a good spec is, once; PUT replaces it; unknown names are 404.
    let (_, list) = http("GET", &format!("{admin}/transforms"), None);
    assert_eq!(list, json!([]));
    let good = spec(&guest("identity"), json!({}));
    deploy(&admin, good.clone());
    let (code, answer) = http("POST", &format!("{admin}/transforms"), Some(good.clone()));
    assert_eq!(code, 409, "{answer}");
    let (code, answer) = http("PUT", &format!("{admin}/transforms/t"), Some(good));
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["state"], "RUNNING");
    let (code, _) = http("GET", &format!("{admin}/transforms/nope"), None);
    assert_eq!(code, 404);
    let (code, _) = http("DELETE", &format!("{admin}/transforms/nope"), None);
    assert_eq!(code, 404);
    let (code, _) = http("DELETE", &format!("{admin}/transforms/t"), None);
    assert_eq!(code, 204);
    broker.stop();
}

/// Issue 16: deployments feeding each other in a cycle are refused, naming the cycle,
/// whether the cycle is closed by a new deployment or by replacing one (`--replace`); a
/// connector component deployed as a transform is named as a connector.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_closing_a_cycle_or_a_connector_is_refused_with_the_reason() {
    let broker = TestBroker::start();
    let admin = broker.admin_url.clone();
    let identity = guest("identity");
    let spec = |name: &str, input: &str, outputs: &[&str]| json!({"name": name, "wasm": identity, "input": input, "outputs": outputs});
    let refused = |method: &str, path: &str, body: Value, want: &[&str]| {
        let (code, answer) = http(method, &format!("{admin}{path}"), Some(body));
        let message = answer["message"].as_str().unwrap_or_default().to_string();
        eprintln!("{code} {message}");
        assert_eq!(code, 400, "{answer}");
        for w in want {
            assert!(message.contains(w), "{message:?} lacks {w:?}");
        }
    };
    for t in ["a", "b", "c"] {
        create_topic(&broker.bootstrap, t, 1, &[]).await;
    }
    deploy(&admin, spec("t1", "a", &["b"]));
    refused(
        "POST",
        "/transforms",
        spec("t2", "b", &["x", "a"]),
        &["cycle b -> a -> b", "t2, t1"],
    );
    // A chain is fine; replacing its head to read the chain's end closes a cycle.
    deploy(&admin, spec("t2", "b", &["c"]));
    refused(
        "PUT",
        "/transforms/t1",
        spec("t1", "c", &["b"]),
        &["cycle c -> b -> c", "t1, t2"],
    );
    // Through the CLI, as a user would: the same refusal, exit non-zero.
    let dir = identity.parent().expect("guest dir");
    let out = weir_transform(
        &admin,
        dir,
        &[
            "deploy",
            "t3",
            "--wasm",
            "identity.wasm",
            "--input",
            "c",
            "--output",
            "a",
        ],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("cycle c -> a -> b -> c"),
        "{}",
        text(&out.stderr)
    );
    // The old t1 is what runs; a record goes a -> b -> c once.
    let p = producer(&broker.bootstrap, &[]);
    send(&p, "a", None, "once").await;
    assert_eq!(values(&broker.bootstrap, "c", 1), vec!["once".to_string()]);
    let (_, list) = http("GET", &format!("{admin}/transforms"), None);
    let names: Vec<&str> = list
        .as_array()
        .expect("a list")
        .iter()
        .map(|t| t["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(names, ["t1", "t2"]);
    assert_eq!(status(&admin, "t1")["input"], "a");

    let sink = crate::connect::plugin_path().join("sqlite_sink.wasm");
    refused(
        "POST",
        "/transforms",
        spec("s", "in", &["out"])
            .as_object()
            .map(|o| {
                let mut o = o.clone();
                o.insert("wasm".into(), json!(sink));
                Value::Object(o)
            })
            .expect("an object"),
        &[
            "sqlite_sink.wasm",
            "it is a connector",
            "`sink-connector`",
            "weir connector create",
        ],
    );
    broker.stop();
}

fn sha256_hex(path: &Path) -> String {
    weir::transform::sha256_hex(&std::fs::read(path).expect("read"))
}

/// Copies `from` over `to` the way `cp` does: truncate, then write in pieces.
fn copy_in_pieces(from: &Path, to: &Path) {
    use std::io::Write;
    let bytes = std::fs::read(from).expect("read");
    let mut f = std::fs::File::create(to).expect("create");
    for piece in bytes.chunks(64 * 1024) {
        f.write_all(piece).expect("write");
        f.flush().expect("flush");
        // Pacing: a slow copy, so the watcher sees a file in progress (not a wait).
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_reload_swaps_the_component_while_records_flow_and_refuses_a_corrupt_one() {
    let broker = TestBroker::start();
    let admin = broker.admin_url.clone();
    let tmp = tempfile::tempdir().expect("temp dir");
    let deployed: PathBuf = tmp.path().join("pii.wasm");
    std::fs::copy(guest("redact"), &deployed).expect("copy");
    create_topic(&broker.bootstrap, "pii", 1, &[]).await;
    let first = deploy(
        &admin,
        json!({"name": "pii", "wasm": deployed, "input": "pii", "outputs": ["pii-clean"],
               "config": {"fields": "email"}}),
    );
    assert_eq!(first["version"], sha256_hex(&guest("redact")));

    let p = producer(&broker.bootstrap, &[]);
    let mut n = 0;
    let mut sent_after_swap = None;
    let identity_version = sha256_hex(&guest("identity"));
    let mut swapped = false;
    let copier = {
        let deployed = deployed.clone();
        std::thread::spawn(move || {
            // Pacing: some records go through the old version first (not a wait).
            std::thread::sleep(Duration::from_millis(300));
            copy_in_pieces(&guest("identity"), &deployed);
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while sent_after_swap.is_none_or(|s| n < s + 50) {
        assert!(Instant::now() < deadline, "no swap seen");
        send(&p, "pii", None, &format!(r#"{{"email":"e{n}","n":{n}}}"#)).await;
        n += 1;
        if !swapped && status(&admin, "pii")["version"] == identity_version {
            swapped = true;
            sent_after_swap = Some(n);
        }
    }
    copier.join().expect("copier");
    let after = sent_after_swap.expect("swapped");
    let got = values(&broker.bootstrap, "pii-clean", n);
    assert_eq!(got.len(), n, "nothing lost");
    for (i, v) in got.iter().enumerate() {
        let masked = format!(r#"{{"email":"***","n":{i}}}"#);
        let plain = format!(r#"{{"email":"e{i}","n":{i}}}"#);
        if i == 0 {
            assert_eq!(*v, masked, "the first record met redact");
        } else if i >= after {
            assert_eq!(*v, plain, "record {i} was produced after the swap showed");
        } else {
            assert!(*v == masked || *v == plain, "{v}");
        }
    }

    // A corrupt file: refused once stable, the identity version keeps running.
    std::fs::write(&deployed, b"\0asm\x0d\0\x01\0garbage").expect("write");
    let s = wait_status(&admin, "pii", "a reload error", |s| {
        !s["reload_error"].is_null()
    });
    eprintln!("{}", s["reload_error"]);
    assert!(s["reload_error"].as_str().unwrap().contains("pii.wasm"));
    assert_eq!(s["version"], identity_version);
    assert_eq!(s["state"], "RUNNING");
    send(&p, "pii", None, r#"{"email":"late"}"#).await;
    assert_eq!(
        values(&broker.bootstrap, "pii-clean", n + 1)[n],
        r#"{"email":"late"}"#
    );
    broker.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_toml_file_in_the_config_dir_deploys_and_removing_it_deletes() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let file = tmp.path().join("copy.toml");
    std::fs::write(
        &file,
        format!(
            "name = \"from-file\"\nwasm = {:?}\ninput = \"f-in\"\noutputs = [\"f-out\"]\n\"errors.tolerance\" = \"all\"\n",
            guest("identity").to_str().unwrap()
        ),
    )
    .expect("write");
    let dir = format!("transform.config.dir={}", tmp.path().display());
    let broker = TestBroker::start_with(&[&dir]);
    let admin = broker.admin_url.clone();
    let s = status(&admin, "from-file");
    assert_eq!(s["errors.tolerance"], "all");
    assert_eq!(s["source_file"], file.to_str().unwrap());
    create_topic(&broker.bootstrap, "f-in", 1, &[]).await;
    let p = producer(&broker.bootstrap, &[]);
    send(&p, "f-in", None, "x").await;
    assert_eq!(values(&broker.bootstrap, "f-out", 1), ["x"]);
    let (code, answer) = http("DELETE", &format!("{admin}/transforms/from-file"), None);
    assert_eq!(code, 409, "{answer}");
    std::fs::remove_file(&file).expect("remove");
    wait_until("the deployment to go", 30, || {
        http("GET", &format!("{admin}/transforms/from-file"), None).0 == 404
    });
    broker.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_deployments_install_one_slot_per_topic() {
    let broker = TestBroker::start();
    let admin = broker.admin_url.clone();
    let tmp = tempfile::tempdir().expect("temp dir");
    let deployed = tmp.path().join("inline.wasm");
    std::fs::copy(guest("redact"), &deployed).expect("copy");
    let s = deploy(
        &admin,
        json!({"name": "scrub", "wasm": deployed, "input": "raw", "mode": "inline",
               "config": {"fields": "email"}}),
    );
    assert_eq!(s["mode"], "inline");
    assert_eq!(s["state"], "RUNNING");
    assert!(s["input_lag"].is_null(), "{s}");
    assert_eq!(s["outputs"], json!([]));
    // One inline transform per topic.
    let (code, answer) = http(
        "POST",
        &format!("{admin}/transforms"),
        Some(
            json!({"name": "scrub2", "wasm": guest("identity"), "input": "raw", "mode": "inline"}),
        ),
    );
    assert_eq!(code, 409, "{answer}");
    assert!(answer["message"]
        .as_str()
        .unwrap()
        .contains("already has the inline transform scrub"));
    // Hot reload replaces the slot: the version follows the file.
    copy_in_pieces(&guest("identity"), &deployed);
    let identity_version = sha256_hex(&guest("identity"));
    wait_status(&admin, "scrub", "the reloaded version", |s| {
        s["version"] == identity_version
    });
    let (code, _) = http("DELETE", &format!("{admin}/transforms/scrub"), None);
    assert_eq!(code, 204);
    // The topic is free again.
    deploy(
        &admin,
        json!({"name": "scrub2", "wasm": guest("identity"), "input": "raw", "mode": "inline"}),
    );
    broker.stop();
}

/// Every record of `topic` (`partitions` partitions) a consumer with `isolation` reads
/// from the beginning until `quiet` passes with nothing new (at most 90 s): values.
pub(crate) fn read_everything(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    isolation: &str,
    quiet: Duration,
) -> Vec<String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    use rdkafka::{ClientConfig, TopicPartitionList};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("eos-check-{isolation}"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).expect("assign");
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut last_new = Instant::now();
    while Instant::now() < deadline && last_new.elapsed() < quiet {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                out.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
                last_new = Instant::now();
            }
            Some(Err(e)) => eprintln!("consume: {e}"),
            None => {}
        }
    }
    out
}

/// Issue 14 test 5: an `exactly_once` transform while a producer writes its input
/// without pause and the broker is killed with -9 three times: a read_committed consumer
/// of the output reads each input record exactly as often as the input holds it (counted
/// per value); the copies aborted transactions left are seen only by read_uncommitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exactly_once_transform_writes_each_record_once_across_kill_9_of_the_broker() {
    use crate::harness::BinaryBroker;
    use std::collections::BTreeMap;
    const KILLS: usize = 3;
    let dir = tempfile::tempdir().unwrap();
    let overrides = [
        "transaction.state.log.num.partitions=3",
        "offsets.topic.num.partitions=3",
        "num.partitions=3",
    ];
    let mut broker = BinaryBroker::spawn(dir.path(), 0, &overrides);
    let bootstrap = broker.bootstrap.clone();
    let port: u16 = bootstrap.rsplit(':').next().unwrap().parse().unwrap();
    create_topic(&bootstrap, "eos-in", 3, &[]).await;
    create_topic(&bootstrap, "eos-out", 3, &[]).await;
    deploy(
        &broker.admin_url,
        json!({"name": "eos", "wasm": guest("identity"), "input": "eos-in",
               "outputs": ["eos-out"], "processing.guarantee": "exactly_once"}),
    );
    let writer = crate::rdkafka_client::Writer::spawn(&bootstrap, "eos-in", usize::MAX, |i| {
        (format!("k{i}"), format!("v{i}"), None)
    });
    for _ in 0..KILLS {
        std::thread::sleep(Duration::from_millis(1500));
        let stderr = broker.kill9();
        assert!(!stderr.contains("panicked"), "{stderr}");
        broker = BinaryBroker::spawn(dir.path(), port, &overrides);
    }
    std::thread::sleep(Duration::from_millis(1000));
    // Records not delivered across the kills are fine: the input read back is the truth.
    let (sent, _) = writer.stop();
    let s = poll_for("the transform to catch up", 90, || {
        let s = status(&broker.admin_url, "eos");
        if s["state"] == "RUNNING" && s["input_lag"] == 0 {
            Ok(s)
        } else {
            Err(format!("{s}"))
        }
    });
    let count = |values: &[String]| {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for v in values {
            *counts.entry(v.clone()).or_default() += 1;
        }
        counts
    };
    let input = read_everything(
        &bootstrap,
        "eos-in",
        3,
        "read_committed",
        Duration::from_secs(3),
    );
    let output = read_everything(
        &bootstrap,
        "eos-out",
        3,
        "read_committed",
        Duration::from_secs(3),
    );
    let uncommitted = read_everything(
        &bootstrap,
        "eos-out",
        3,
        "read_uncommitted",
        Duration::from_secs(2),
    );
    let (want, got) = (count(&input), count(&output));
    let lost: Vec<&String> = want.keys().filter(|v| !got.contains_key(*v)).collect();
    let duplicated: Vec<(&String, usize)> = got
        .iter()
        .filter(|(v, n)| **n > want.get(*v).copied().unwrap_or(0))
        .map(|(v, n)| (v, *n))
        .collect();
    let never_in_input: Vec<&String> = got.keys().filter(|v| !want.contains_key(*v)).collect();
    eprintln!(
        "exactly-once transform: {KILLS} kills, sent {}, input {}, output read_committed {} \
         (lost {}, duplicated {}, never in the input {}), read_uncommitted {} ({} in aborted \
         transactions), status {s}",
        sent,
        input.len(),
        output.len(),
        lost.len(),
        duplicated.len(),
        never_in_input.len(),
        uncommitted.len(),
        uncommitted.len().saturating_sub(output.len())
    );
    assert!(input.len() > 1000, "too little input: {}", input.len());
    assert!(
        lost.is_empty(),
        "lost {} e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    assert!(
        duplicated.is_empty(),
        "duplicated {} e.g. {:?}",
        duplicated.len(),
        &duplicated[..duplicated.len().min(5)]
    );
    assert!(never_in_input.is_empty(), "{never_in_input:?}");
    assert_eq!(output.len(), input.len());
    assert!(uncommitted.len() >= output.len());
    drop(broker);
}

/// `processing.guarantee` is checked: an unknown value and exactly_once on an inline
/// deployment are refused with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_processing_guarantee_is_refused_with_the_reason() {
    let broker = TestBroker::start();
    for (spec, reason) in [
        (
            json!({"name": "g1", "wasm": guest("identity"), "input": "a", "outputs": ["b"],
                   "processing.guarantee": "twice"}),
            "processing.guarantee must be one of at_least_once, exactly_once",
        ),
        (
            json!({"name": "g2", "wasm": guest("identity"), "input": "a", "mode": "inline",
                   "processing.guarantee": "exactly_once"}),
            "exactly_once needs mode async",
        ),
    ] {
        let (code, body) = http(
            "POST",
            &format!("{}/transforms", broker.admin_url),
            Some(spec),
        );
        assert_eq!(code, 400, "{body}");
        assert!(body.to_string().contains(reason), "{body}");
    }
    broker.stop();
}
