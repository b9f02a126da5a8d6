//! The Kafka Connect REST API (issue 5, test 6), driven by the `curl` binary with Kafka
//! Connect's documentation's example bodies (adapted to `file-source` / `file-sink`),
//! with a real rdkafka consumer checking what reaches the topics: create, pause, resume,
//! config change, restart (204 and 202 with RESTARTING), FAILED and
//! `restart?includeTasks=true&onlyFailed=true`, stop + offsets reset and alter
//! (KIP-875), delete, validate, plugins; REST-created connectors and target states
//! surviving a broker restart; the watched `connect.config.dir`; and `weir connector`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::connect::{append, dirs, lines, read_topic, read_topic_for, start, wait_for_file};
use crate::harness::{poll_for, wait_until};

/// `curl -X method url [-d body]`: the HTTP status and the JSON body (`Null` when empty).
pub(crate) fn curl(method: &str, url: &str, body: Option<&Value>) -> (u16, Value) {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "--max-time",
        "120",
        "-X",
        method,
        "-w",
        "\n%{http_code}",
    ]);
    if let Some(b) = body {
        cmd.args(["-H", "Content-Type: application/json", "-d", &b.to_string()]);
    }
    let out = cmd.arg(url).output().expect("curl runs");
    assert!(out.status.success(), "curl {method} {url}: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let (body, code) = text.rsplit_once('\n').unwrap();
    let code: u16 = code.trim().parse().unwrap();
    let json = if body.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{method} {url}: {e}: {body}"))
    };
    (code, json)
}

/// Waits until the connector's status says `state`, and so do its tasks (panics after
/// 60 s with the status).
pub(crate) fn wait_for_state(admin: &str, name: &str, state: &str) -> Value {
    poll_for(&format!("{name} is {state}"), 60, || {
        let (code, status) = curl("GET", &format!("{admin}/connectors/{name}/status"), None);
        let tasks_too = status["tasks"]
            .as_array()
            .is_some_and(|t| t.iter().all(|t| t["state"] == state));
        if code == 200 && status["connector"]["state"] == state && tasks_too {
            return Ok(status);
        }
        Err(format!("status {code} {status}"))
    })
}

/// Kafka Connect's quickstart source body, adapted: `file-source` reading `file`.
fn source_body(name: &str, file: &Path, topic: &str) -> Value {
    json!({
        "name": name,
        "config": {
            "connector.class": "file-source",
            "tasks.max": "1",
            "file": file.display().to_string(),
            "topic": topic,
            "poll.interval.ms": "20",
        }
    })
}

fn values(records: &[(Option<String>, String)]) -> Vec<String> {
    records.iter().map(|(_, v)| v.clone()).collect()
}

fn want(from: usize, to: usize) -> Vec<String> {
    lines(from, to).lines().map(String::from).collect()
}

#[test]
fn rest_create_pause_resume_reconfigure_restart_offsets_and_delete() {
    let d = dirs();
    let broker = start(&d);
    let admin = broker.admin_url.clone();
    let name = "local-file-source";
    append(&d.input, &lines(0, 100));

    let (code, info) = curl(
        "POST",
        &format!("{admin}/connectors"),
        Some(&source_body(name, &d.input, "connect-test")),
    );
    assert_eq!(code, 201, "{info}");
    assert_eq!(info["name"], name);
    assert_eq!(info["type"], "source");
    assert_eq!(info["config"]["topic"], "connect-test");
    assert_eq!(info["tasks"], json!([{"connector": name, "task": 0}]));
    let (code, err) = curl(
        "POST",
        &format!("{admin}/connectors"),
        Some(&source_body(name, &d.input, "connect-test")),
    );
    assert_eq!(code, 409, "{err}");
    assert_eq!(err["error_code"], 409);
    let (code, names) = curl("GET", &format!("{admin}/connectors"), None);
    assert_eq!((code, names), (200, json!([name])));
    let got = read_topic(&broker.bootstrap, "connect-test", 100);
    assert_eq!(values(&got), want(0, 100));
    let status = wait_for_state(&admin, name, "RUNNING");
    assert_eq!(status["type"], "source");
    assert_eq!(status["tasks"][0]["id"], 0);
    assert_eq!(status["tasks"][0]["state"], "RUNNING");
    assert!(status["tasks"][0]["worker_id"].is_string(), "{status}");

    // Pause: appended lines do not arrive; resume: they do, once.
    let (code, _) = curl("PUT", &format!("{admin}/connectors/{name}/pause"), None);
    assert_eq!(code, 202);
    let status = wait_for_state(&admin, name, "PAUSED");
    assert_eq!(status["tasks"][0]["state"], "PAUSED");
    append(&d.input, &lines(100, 200));
    let got = read_topic_for(
        &broker.bootstrap,
        "connect-test",
        200,
        Duration::from_secs(2),
    );
    assert_eq!(got.len(), 100, "nothing is read while paused");
    let (code, _) = curl("PUT", &format!("{admin}/connectors/{name}/resume"), None);
    assert_eq!(code, 202);
    let got = read_topic(&broker.bootstrap, "connect-test", 200);
    assert_eq!(values(&got), want(0, 200));

    // PUT config: the new topic gets what follows (offsets carry on).
    let mut config = source_body(name, &d.input, "connect-test-2")["config"].clone();
    config["name"] = json!(name);
    let (code, info) = curl(
        "PUT",
        &format!("{admin}/connectors/{name}/config"),
        Some(&config),
    );
    assert_eq!(code, 200, "{info}");
    assert_eq!(info["config"]["topic"], "connect-test-2");
    let (code, got_config) = curl("GET", &format!("{admin}/connectors/{name}/config"), None);
    assert_eq!(code, 200);
    assert_eq!(got_config["topic"], "connect-test-2");
    wait_for_state(&admin, name, "RUNNING");
    append(&d.input, &lines(200, 250));
    let got = read_topic(&broker.bootstrap, "connect-test-2", 50);
    assert_eq!(values(&got), want(200, 250));

    // Restart: the connector alone → 204; with its tasks → 202 and RESTARTING.
    let (code, body) = curl("POST", &format!("{admin}/connectors/{name}/restart"), None);
    assert_eq!((code, body), (204, Value::Null));
    wait_for_state(&admin, name, "RUNNING");
    let (code, body) = curl(
        "POST",
        &format!("{admin}/connectors/{name}/restart?includeTasks=true&onlyFailed=false"),
        None,
    );
    assert_eq!(code, 202, "{body}");
    assert_eq!(body["connector"]["state"], "RESTARTING", "{body}");
    assert_eq!(body["tasks"][0]["state"], "RESTARTING", "{body}");
    wait_for_state(&admin, name, "RUNNING");
    let (code, tasks) = curl("GET", &format!("{admin}/connectors/{name}/tasks"), None);
    assert_eq!(code, 200);
    assert_eq!(tasks[0]["id"], json!({"connector": name, "task": 0}));
    assert_eq!(tasks[0]["config"]["topic"], "connect-test-2");
    let (code, t) = curl(
        "GET",
        &format!("{admin}/connectors/{name}/tasks/0/status"),
        None,
    );
    assert_eq!((code, &t["id"]), (200, &json!(0)));
    let (code, _) = curl(
        "GET",
        &format!("{admin}/connectors/{name}/tasks/7/status"),
        None,
    );
    assert_eq!(code, 404);
    let (code, _) = curl(
        "POST",
        &format!("{admin}/connectors/{name}/tasks/0/restart"),
        None,
    );
    assert_eq!(code, 204);
    let (code, _) = curl(
        "POST",
        &format!("{admin}/connectors/{name}/tasks/7/restart"),
        None,
    );
    assert_eq!(code, 404);
    wait_for_state(&admin, name, "RUNNING");

    // Offsets: the byte position after the last line.
    let file = d.input.display().to_string();
    let len = std::fs::metadata(&d.input).unwrap().len();
    let (code, offsets) = curl("GET", &format!("{admin}/connectors/{name}/offsets"), None);
    assert_eq!(code, 200);
    // The file source's offset also carries the fingerprint of the file it belongs to.
    let fingerprint = offsets["offsets"][0]["offset"]["fingerprint"].clone();
    assert!(
        fingerprint.as_str().is_some_and(|f| f.len() == 16),
        "{offsets}"
    );
    assert_eq!(
        offsets,
        json!({"offsets": [{"partition": {"filename": file}, "offset": {"position": len.to_string(), "fingerprint": fingerprint}}]})
    );
    // KIP-875: offsets change only when STOPPED.
    let (code, err) = curl(
        "DELETE",
        &format!("{admin}/connectors/{name}/offsets"),
        None,
    );
    assert_eq!(code, 400, "{err}");
    assert!(
        err["message"].as_str().unwrap().contains("STOPPED"),
        "{err}"
    );
    let (code, _) = curl("PUT", &format!("{admin}/connectors/{name}/stop"), None);
    assert_eq!(
        code, 204,
        "Kafka Connect's stopConnector returns no content"
    );
    let status = wait_for_state(&admin, name, "STOPPED");
    assert_eq!(status["tasks"], json!([]));
    let (code, info) = curl("GET", &format!("{admin}/connectors/{name}"), None);
    assert_eq!((code, &info["tasks"]), (200, &json!([])));
    let (code, msg) = curl(
        "DELETE",
        &format!("{admin}/connectors/{name}/offsets"),
        None,
    );
    assert_eq!(code, 200, "{msg}");
    assert!(msg["message"].is_string());
    let (_, offsets) = curl("GET", &format!("{admin}/connectors/{name}/offsets"), None);
    assert_eq!(offsets, json!({"offsets": []}));
    // Resumed with no offsets: the whole file again.
    let (code, _) = curl("PUT", &format!("{admin}/connectors/{name}/resume"), None);
    assert_eq!(code, 202);
    let got = read_topic(&broker.bootstrap, "connect-test-2", 300);
    let mut expected = want(200, 250);
    expected.extend(want(0, 250));
    assert_eq!(values(&got), expected, "re-read from the start");

    // PATCH: resume from the start of line 240.
    let position = lines(0, 240).len();
    curl("PUT", &format!("{admin}/connectors/{name}/stop"), None);
    wait_for_state(&admin, name, "STOPPED");
    let (code, msg) = curl(
        "PATCH",
        &format!("{admin}/connectors/{name}/offsets"),
        Some(
            &json!({"offsets": [{"partition": {"filename": file}, "offset": {"position": position}}]}),
        ),
    );
    assert_eq!(code, 200, "{msg}");
    curl("PUT", &format!("{admin}/connectors/{name}/resume"), None);
    let got = read_topic(&broker.bootstrap, "connect-test-2", 310);
    expected.extend(want(240, 250));
    assert_eq!(values(&got), expected, "resumed from the patched position");

    // Delete: gone.
    let (code, _) = curl("DELETE", &format!("{admin}/connectors/{name}"), None);
    assert_eq!(code, 204);
    let (code, err) = curl("GET", &format!("{admin}/connectors/{name}"), None);
    assert_eq!(code, 404);
    assert_eq!(err["error_code"], 404);
    assert!(err["message"].as_str().unwrap().contains(name), "{err}");
    let (_, names) = curl("GET", &format!("{admin}/connectors"), None);
    assert_eq!(names, json!([]));
    broker.stop();
}

#[test]
fn rest_failed_connector_restarts_validate_plugins_and_sink_offsets() {
    let d = dirs();
    let broker = start(&d);
    let admin = broker.admin_url.clone();

    // A source whose file is a symlink out of its granted directory: FAILED.
    let secret = d.output.with_file_name("secret.txt");
    std::fs::write(&secret, "secret\n").unwrap();
    let link = d.input.with_file_name("flaky.txt");
    std::os::unix::fs::symlink(&secret, &link).unwrap();
    let mut body = source_body("flaky", &link, "flaky");
    body["config"]["errors.retry.timeout"] = json!("300");
    let (code, _) = curl("POST", &format!("{admin}/connectors"), Some(&body));
    assert_eq!(code, 201);
    let status = wait_for_state(&admin, "flaky", "FAILED");
    assert_eq!(status["tasks"][0]["state"], "FAILED");
    assert!(
        status["tasks"][0]["trace"]
            .as_str()
            .unwrap()
            .contains("flaky.txt"),
        "{status}"
    );
    // Fixed: the symlink becomes a real file; only the failed parts restart.
    std::fs::remove_file(&link).unwrap();
    append(&link, &lines(0, 10));
    let (code, body) = curl(
        "POST",
        &format!("{admin}/connectors/flaky/restart?includeTasks=true&onlyFailed=true"),
        None,
    );
    assert_eq!(code, 202, "{body}");
    assert_eq!(body["connector"]["state"], "RESTARTING", "{body}");
    assert_eq!(body["tasks"][0]["state"], "RESTARTING", "{body}");
    wait_for_state(&admin, "flaky", "RUNNING");
    let got = read_topic(&broker.bootstrap, "flaky", 10);
    assert_eq!(values(&got), want(0, 10));
    // Nothing failed: nothing is restarted.
    let (code, body) = curl(
        "POST",
        &format!("{admin}/connectors/flaky/restart?includeTasks=true&onlyFailed=true"),
        None,
    );
    assert_eq!(code, 202);
    assert_eq!(body["connector"]["state"], "RUNNING", "{body}");
    assert_eq!(body["tasks"][0]["state"], "RUNNING", "{body}");
    let (code, _) = curl("POST", &format!("{admin}/connectors/nope/restart"), None);
    assert_eq!(code, 404);

    // A sink (Kafka Connect's quickstart sink, adapted); its offsets are the group's.
    let sink = json!({
        "name": "local-file-sink",
        "config": {
            "connector.class": "file-sink",
            "tasks.max": "1",
            "file": d.output.display().to_string(),
            "topics": "flaky",
            "offset.flush.interval.ms": "100",
        }
    });
    let (code, info) = curl("POST", &format!("{admin}/connectors"), Some(&sink));
    assert_eq!(code, 201, "{info}");
    assert_eq!(info["type"], "sink");
    wait_for_file(&d.output, &lines(0, 10));
    poll_for("the sink's offsets reach 10", 30, || {
        let (_, offsets) = curl(
            "GET",
            &format!("{admin}/connectors/local-file-sink/offsets"),
            None,
        );
        let want = json!({"offsets": [{"partition": {"kafka_topic": "flaky", "kafka_partition": 0}, "offset": {"kafka_offset": 10}}]});
        if offsets == want {
            return Ok(());
        }
        Err(format!("offsets {offsets}"))
    });
    // KIP-875 on a sink: stop, move the group back to offset 5, resume: 5..10 again.
    let (code, _) = curl(
        "PUT",
        &format!("{admin}/connectors/local-file-sink/stop"),
        None,
    );
    assert_eq!(code, 204);
    wait_for_state(&admin, "local-file-sink", "STOPPED");
    let (code, msg) = curl(
        "PATCH",
        &format!("{admin}/connectors/local-file-sink/offsets"),
        Some(
            &json!({"offsets": [{"partition": {"kafka_topic": "flaky", "kafka_partition": 0}, "offset": {"kafka_offset": 5}}]}),
        ),
    );
    assert_eq!(code, 200, "{msg}");
    let (_, offsets) = curl(
        "GET",
        &format!("{admin}/connectors/local-file-sink/offsets"),
        None,
    );
    assert_eq!(
        offsets["offsets"][0]["offset"]["kafka_offset"], 5,
        "{offsets}"
    );
    curl(
        "PUT",
        &format!("{admin}/connectors/local-file-sink/resume"),
        None,
    );
    let mut twice = lines(0, 10);
    twice.push_str(&lines(5, 10));
    wait_for_file(&d.output, &twice);
    let (code, all) = curl(
        "GET",
        &format!("{admin}/connectors?expand=status&expand=info"),
        None,
    );
    assert_eq!(code, 200);
    assert_eq!(
        all["flaky"]["status"]["connector"]["state"], "RUNNING",
        "{all}"
    );
    assert_eq!(all["local-file-sink"]["info"]["type"], "sink", "{all}");

    // Plugins and validate.
    let (code, plugins) = curl("GET", &format!("{admin}/connector-plugins"), None);
    assert_eq!(code, 200);
    let classes: Vec<&str> = plugins
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["class"].as_str().unwrap())
        .collect();
    assert!(
        classes.contains(&"file-source") && classes.contains(&"file-sink"),
        "{plugins}"
    );
    let (code, infos) = curl(
        "PUT",
        &format!("{admin}/connector-plugins/file-source/config/validate"),
        Some(&json!({"connector.class": "file-source", "name": "v", "topic": "t"})),
    );
    assert_eq!(code, 200, "{infos}");
    assert_eq!(infos["name"], "file-source");
    assert_eq!(infos["error_count"], 1, "{infos}");
    let file = infos["configs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["definition"]["name"] == "file")
        .unwrap();
    assert_eq!(file["definition"]["required"], true);
    assert!(
        file["value"]["errors"][0]
            .as_str()
            .unwrap()
            .contains("\"file\""),
        "{file}"
    );
    let (code, infos) = curl(
        "PUT",
        &format!("{admin}/connector-plugins/file-source/config/validate"),
        Some(
            &json!({"connector.class": "file-source", "name": "v", "topic": "t", "file": d.input.display().to_string()}),
        ),
    );
    assert_eq!((code, &infos["error_count"]), (200, &json!(0)), "{infos}");
    // A bad config is refused at creation with 400.
    let (code, err) = curl(
        "POST",
        &format!("{admin}/connectors"),
        Some(&json!({"name": "bad", "config": {"connector.class": "file-source", "topic": "t"}})),
    );
    assert_eq!(code, 400, "{err}");
    assert!(err["message"].as_str().unwrap().contains("file"), "{err}");
    broker.stop();
}

#[test]
fn rest_connectors_survive_a_restart_and_the_config_dir_is_watched() {
    let d = dirs();
    let broker = start(&d);
    let admin = broker.admin_url.clone();
    append(&d.input, &lines(0, 20));
    let (code, _) = curl(
        "POST",
        &format!("{admin}/connectors"),
        Some(&source_body("kept", &d.input, "kept")),
    );
    assert_eq!(code, 201);
    assert_eq!(
        values(&read_topic(&broker.bootstrap, "kept", 20)),
        want(0, 20)
    );
    curl("PUT", &format!("{admin}/connectors/kept/pause"), None);
    wait_for_state(&admin, "kept", "PAUSED");
    // Kafka Connect's record shapes in __connect_configs.
    let configs = read_topic_for(
        &broker.bootstrap,
        "__connect_configs",
        2,
        Duration::from_secs(10),
    );
    let latest = |key: &str| -> Value {
        let v = configs
            .iter()
            .rev()
            .find(|(k, _)| k.as_deref() == Some(key))
            .unwrap_or_else(|| panic!("no {key} in {configs:?}"));
        serde_json::from_str(&v.1).unwrap()
    };
    assert_eq!(latest("connector-kept")["properties"]["topic"], "kept");
    assert_eq!(latest("target-state-kept"), json!({"state": "PAUSED"}));
    // Only the broker writes them: reported internal, like __consumer_offsets.
    let mut conn = crate::harness::RawConn::connect(&broker.bootstrap);
    let req = kafka_protocol::messages::MetadataRequest::default().with_topics(None);
    let resp: kafka_protocol::messages::MetadataResponse =
        crate::harness::decode(conn.request(&req, 12, 1).expect("a response"), 12);
    let internal: Vec<(String, bool)> = resp
        .topics
        .iter()
        .map(|t| {
            let name = t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default();
            (name, t.is_internal)
        })
        .collect();
    for topic in ["__connect_configs", "__connect_offsets", "__connect_status"] {
        assert!(
            internal.contains(&(topic.to_string(), true)),
            "{internal:?}"
        );
    }
    assert!(
        internal.contains(&("kept".to_string(), false)),
        "{internal:?}"
    );
    broker.stop();

    // Restarted: still there, still paused; resumed, it carries on without repeats.
    append(&d.input, &lines(20, 30));
    let broker = start(&d);
    let admin = broker.admin_url.clone();
    let (_, names) = curl("GET", &format!("{admin}/connectors"), None);
    assert_eq!(names, json!(["kept"]));
    let (_, config) = curl("GET", &format!("{admin}/connectors/kept/config"), None);
    assert_eq!(config["topic"], "kept");
    wait_for_state(&admin, "kept", "PAUSED");
    curl("PUT", &format!("{admin}/connectors/kept/resume"), None);
    assert_eq!(
        values(&read_topic(&broker.bootstrap, "kept", 30)),
        want(0, 30)
    );

    // A TOML file dropped into the watched directory starts a connector.
    let toml = d.configs.join("from-file.toml");
    let second = d.input.with_file_name("second.txt");
    append(&second, &lines(0, 5));
    std::fs::write(
        &toml,
        format!(
            "name = \"from-file\"\nconnector.class = \"file-source\"\nfile = \"{}\"\ntopic = \"from-file\"\npoll.interval.ms = 20\n",
            second.display()
        ),
    )
    .unwrap();
    wait_for_state(&admin, "from-file", "RUNNING");
    assert_eq!(
        values(&read_topic(&broker.bootstrap, "from-file", 5)),
        want(0, 5)
    );
    // REST may not change or delete it: the file would overwrite the change.
    let (code, err) = curl(
        "PUT",
        &format!("{admin}/connectors/from-file/config"),
        Some(&json!({"connector.class": "file-source", "file": "/tmp/x", "topic": "t"})),
    );
    assert_eq!(code, 409, "{err}");
    assert!(
        err["message"].as_str().unwrap().contains("from-file.toml"),
        "{err}"
    );
    let (code, _) = curl("DELETE", &format!("{admin}/connectors/from-file"), None);
    assert_eq!(code, 409);
    // Changing the file reconfigures it; removing it deletes the connector.
    std::fs::write(
        &toml,
        format!(
            "name = \"from-file\"\nconnector.class = \"file-source\"\nfile = \"{}\"\ntopic = \"from-file-2\"\npoll.interval.ms = 20\n",
            second.display()
        ),
    )
    .unwrap();
    poll_for("the edited file's config is applied", 30, || {
        let (_, config) = curl("GET", &format!("{admin}/connectors/from-file/config"), None);
        if config["topic"] == "from-file-2" {
            return Ok(());
        }
        Err(format!("config {config}"))
    });
    append(&second, &lines(5, 8));
    assert_eq!(
        values(&read_topic(&broker.bootstrap, "from-file-2", 3)),
        want(5, 8)
    );
    std::fs::remove_file(&toml).unwrap();
    wait_until("from-file is gone with its file", 30, || {
        curl("GET", &format!("{admin}/connectors/from-file"), None).0 == 404
    });
    let (_, names) = curl("GET", &format!("{admin}/connectors"), None);
    assert_eq!(names, json!(["kept"]));
    broker.stop();
}

/// `weir connector ...` with `--admin-url`: (stdout, success).
fn weir(args: &[&str]) -> (String, bool) {
    let out = Command::new("timeout")
        .arg("120")
        .arg(crate::harness::weir_bin())
        .args(args)
        .output()
        .expect("weir runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (format!("{stdout}{stderr}"), out.status.success())
}

#[test]
fn weir_connector_cli_wraps_the_rest_api() {
    let d = dirs();
    let broker = start(&d);
    let admin = broker.admin_url.clone();
    let a = ["--admin-url", admin.as_str()];
    append(&d.input, &lines(0, 10));
    // TOML outside the watched directory: created through REST, not watched.
    let file = d.data.with_file_name("cli-source.toml");
    std::fs::write(
        &file,
        format!(
            "name = \"cli-src\"\nconnector.class = \"file-source\"\nfile = \"{}\"\ntopic = \"cli\"\npoll.interval.ms = 20\n",
            d.input.display()
        ),
    )
    .unwrap();
    let file = file.display().to_string();
    let (out, ok) = weir(&[&["connector", "create", file.as_str()][..], &a].concat());
    assert!(ok, "{out}");
    assert!(out.contains("created source connector cli-src"), "{out}");
    assert_eq!(
        values(&read_topic(&broker.bootstrap, "cli", 10)),
        want(0, 10)
    );
    // JSON, Kafka Connect's body shape.
    let json_file = d.data.with_file_name("cli-sink.json");
    std::fs::write(
        &json_file,
        json!({"name": "cli-sink", "config": {"connector.class": "file-sink", "topics": "cli", "file": d.output.display().to_string()}}).to_string(),
    )
    .unwrap();
    let json_file = json_file.display().to_string();
    let (out, ok) = weir(&[&["connector", "create", json_file.as_str()][..], &a].concat());
    assert!(ok, "{out}");
    let (out, ok) = weir(&[&["connector", "create", json_file.as_str()][..], &a].concat());
    assert!(
        !ok && out.contains("already exists") && out.contains("409"),
        "{out}"
    );
    wait_for_state(&admin, "cli-src", "RUNNING");
    wait_for_state(&admin, "cli-sink", "RUNNING");
    let (out, ok) = weir(&[&["connector", "list"][..], &a].concat());
    assert!(ok, "{out}");
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        ["NAME", "TYPE", "STATE", "TASKS", "CLASS"],
        "{out}"
    );
    assert!(
        rows.contains(&vec![
            "cli-sink",
            "sink",
            "RUNNING",
            "0:RUNNING",
            "file-sink"
        ]),
        "{out}"
    );
    assert!(
        rows.contains(&vec![
            "cli-src",
            "source",
            "RUNNING",
            "0:RUNNING",
            "file-source"
        ]),
        "{out}"
    );

    let (out, ok) = weir(&[&["connector", "pause", "cli-src"][..], &a].concat());
    assert!(ok && out.contains("paused"), "{out}");
    wait_for_state(&admin, "cli-src", "PAUSED");
    let (out, ok) = weir(&[&["connector", "status", "cli-src"][..], &a].concat());
    assert!(ok, "{out}");
    let status: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status["connector"]["state"], "PAUSED");
    let (out, ok) = weir(&[&["connector", "resume", "cli-src"][..], &a].concat());
    assert!(ok, "{out}");
    wait_for_state(&admin, "cli-src", "RUNNING");
    let (out, ok) = weir(&[&["connector", "restart", "cli-src"][..], &a].concat());
    assert!(ok && out.contains("restarted connector cli-src"), "{out}");
    let (out, ok) = weir(
        &[
            &["connector", "restart", "cli-src", "--include-tasks"][..],
            &a,
        ]
        .concat(),
    );
    assert!(ok, "{out}");
    let status: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status["tasks"][0]["state"], "RESTARTING", "{out}");
    wait_for_state(&admin, "cli-src", "RUNNING");
    let (out, ok) = weir(&[&["connector", "offsets", "cli-src"][..], &a].concat());
    assert!(ok, "{out}");
    let offsets: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        offsets["offsets"][0]["offset"]["position"],
        lines(0, 10).len().to_string(),
        "{out}"
    );
    let (out, ok) = weir(&[&["connector", "stop", "cli-src"][..], &a].concat());
    assert!(ok && out.contains("stopped"), "{out}");
    for name in ["cli-src", "cli-sink"] {
        let (out, ok) = weir(&[&["connector", "delete", name][..], &a].concat());
        assert!(ok && out.contains("deleted"), "{out}");
    }
    let (out, ok) = weir(&[&["connector", "status", "cli-src"][..], &a].concat());
    assert!(!ok && out.contains("404"), "{out}");
    let (out, ok) = weir(&[&["connector", "list"][..], &a].concat());
    assert!(ok && out.lines().count() == 1, "{out}");
    broker.stop();
}

/// A broker for the issue 16 validation tests over `d`: connectors may be granted
/// `<root>/in` and `<root>/out` and reach 127.0.0.1; `<root>/outside` holds a secret and
/// `<root>/in/escape` links to it. Returns the broker and `<root>`.
fn ceiling_broker(d: &crate::connect::Dirs) -> (crate::harness::TestBroker, std::path::PathBuf) {
    let root = d.data.parent().expect("the temp root").to_path_buf();
    let outside = root.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "secret\n").unwrap();
    std::os::unix::fs::symlink(&outside, root.join("in/escape")).unwrap();
    let broker = crate::harness::TestBroker::start_in(
        &d.data,
        &[
            &format!("connect.config.dir={}", d.configs.display()),
            &format!(
                "connect.plugin.path={}",
                crate::connect::plugin_path().display()
            ),
            &format!(
                "connect.allowed.paths={},{}",
                root.join("in").display(),
                root.join("out").display()
            ),
            "connect.http.allowed.hosts=127.0.0.1",
        ],
    );
    (broker, root)
}

/// POSTs connector `bad` with `config` and checks the refusal: 400 with Kafka Connect's
/// error body listing one error, containing each of `want`; `PUT .../config` refuses it
/// too.
pub(crate) fn refused(admin: &str, config: Value, want: &[&str]) {
    let body = json!({"name": "bad", "config": config});
    let (code, err) = curl("POST", &format!("{admin}/connectors"), Some(&body));
    assert_eq!(code, 400, "{err}");
    assert_eq!(err["error_code"], 400, "{err}");
    let message = err["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(
            "Connector configuration is invalid and contains the following 1 error(s):\n"
        ),
        "{message}"
    );
    assert!(
        message.ends_with("You can also find the above list of errors at the endpoint `/connector-plugins/{connectorType}/config/validate`"),
        "{message}"
    );
    for w in want {
        assert!(message.contains(w), "{message:?} lacks {w:?}");
    }
    let (code, err) = curl(
        "PUT",
        &format!("{admin}/connectors/bad/config"),
        Some(&config),
    );
    assert_eq!(code, 400, "{err}");
}

/// Issue 16: a config that cannot work is refused at creation with 400 and Kafka
/// Connect's error body (the errors `config/validate` reports, listed), where it used to
/// be accepted with 201 and retried for ever: a transform component as
/// `connector.class`, a sink component given a source's config, a component path that
/// does not resolve, an `http.url` outside the connector's own `http.allowed.hosts`.
#[test]
fn rest_refuses_configs_that_cannot_run() {
    let d = dirs();
    let (broker, root) = ceiling_broker(&d);
    let admin = broker.admin_url.clone();
    let transform = crate::guests::guest("identity");
    refused(
        &admin,
        json!({"connector.class": transform.display().to_string(), "topic": "t"}),
        &[
            "identity.wasm",
            "it is a transform component",
            "weir transform deploy",
        ],
    );
    let sink_as_source = crate::connect::plugin_path().join("file_sink.wasm");
    refused(
        &admin,
        json!({"connector.class": sink_as_source.display().to_string(), "file": d.output.display().to_string(), "topic": "t"}),
        &["it is a sink connector", "`topics`"],
    );
    let missing = root.join("no-such-connector.wasm");
    refused(
        &admin,
        json!({"connector.class": missing.display().to_string(), "topic": "t"}),
        &["no-such-connector.wasm", "cannot read"],
    );
    refused(
        &admin,
        json!({"connector.class": "http-sink", "topics": "t", "http.url": "http://127.0.0.1:9/in", "http.allowed.hosts": "example.com"}),
        &["http.url", "127.0.0.1:9", "every request would be denied"],
    );
    let (_, names) = curl("GET", &format!("{admin}/connectors"), None);
    assert_eq!(names, json!([]), "nothing refused was created");
    // validate reports the same (on `connector.class` for the component).
    let (code, infos) = curl(
        "PUT",
        &format!("{admin}/connector-plugins/file-source/config/validate"),
        Some(&json!({"name": "v", "topic": "t", "file": d.input.display().to_string()})),
    );
    assert_eq!((code, &infos["error_count"]), (200, &json!(0)), "{infos}");
    // A config file naming a transform runs (files get no component check: a component
    // may be built later) and fails with the same words, never RUNNING.
    std::fs::write(
        d.configs.join("misnamed.toml"),
        format!(
            "name = \"misnamed\"\nconnector.class = \"{}\"\ntopic = \"t\"\nerrors.retry.timeout = 0\n",
            transform.display()
        ),
    )
    .unwrap();
    let status = wait_for_state(&admin, "misnamed", "FAILED");
    assert!(
        status["tasks"][0]["trace"]
            .as_str()
            .unwrap_or_default()
            .contains("it is a transform component"),
        "{status}"
    );
    broker.stop();
}

/// Issue 16: the broker's ceiling (`connect.allowed.paths`, `connect.http.allowed.hosts`)
/// bounds what a connector may be granted; a connector config narrows it, never widens
/// it: a file or database outside it, a directory symlink or `..` leading out of it, a
/// host outside it are refused at creation (400), reported by validate on their key, and
/// a `connect.config.dir` file asking for them is FAILED with the reason, nothing running.
#[test]
fn the_broker_ceiling_bounds_what_a_connector_is_granted() {
    let d = dirs();
    let (broker, root) = ceiling_broker(&d);
    let admin = broker.admin_url.clone();
    let outside = root.join("outside");
    let source = |file: &Path| json!({"connector.class": "file-source", "file": file.display().to_string(), "topic": "t"});
    refused(
        &admin,
        source(&outside.join("secret.txt")),
        &[
            "is outside connect.allowed.paths",
            "outside`",
            "broker config",
        ],
    );
    refused(
        &admin,
        source(&root.join("in/escape/secret.txt")),
        &["is outside connect.allowed.paths"],
    );
    refused(
        &admin,
        source(&root.join("in/../outside/secret.txt")),
        &["is outside connect.allowed.paths"],
    );
    refused(
        &admin,
        source(&d.data.join("x.txt")),
        &["overlaps the broker's own directory"],
    );
    refused(
        &admin,
        json!({"connector.class": "sqlite-sink", "topics": "t", "database": outside.join("x.db").display().to_string()}),
        &["is outside connect.allowed.paths"],
    );
    refused(
        &admin,
        json!({"connector.class": "http-source", "topic": "t", "http.url": "http://10.1.2.3/feed"}),
        &["host `10.1.2.3:80` is outside connect.http.allowed.hosts (127.0.0.1)"],
    );
    refused(
        &admin,
        json!({"connector.class": "http-sink", "topics": "t", "http.url": "http://127.0.0.1:9/in", "http.allowed.hosts": "127.0.0.1:9,169.254.169.254"}),
        &["169.254.169.254", "connect.http.allowed.hosts"],
    );
    let (_, names) = curl("GET", &format!("{admin}/connectors"), None);
    assert_eq!(names, json!([]), "nothing refused was created");

    // validate reports the ceiling on the key it concerns.
    let (code, infos) = curl(
        "PUT",
        &format!("{admin}/connector-plugins/file-source/config/validate"),
        Some(
            &json!({"connector.class": "file-source", "name": "v", "topic": "t", "file": outside.join("secret.txt").display().to_string()}),
        ),
    );
    assert_eq!(code, 200, "{infos}");
    assert_eq!(infos["error_count"], 1, "{infos}");
    let file = infos["configs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["definition"]["name"] == "file")
        .unwrap();
    assert!(
        file["value"]["errors"][0]
            .as_str()
            .unwrap()
            .contains("is outside connect.allowed.paths"),
        "{file}"
    );

    // A file-defined connector beyond the ceiling is FAILED with the reason; nothing runs.
    std::fs::write(
        d.configs.join("greedy.toml"),
        format!(
            "name = \"greedy\"\nconnector.class = \"file-source\"\nfile = \"{}\"\ntopic = \"greedy\"\n",
            outside.join("secret.txt").display()
        ),
    )
    .unwrap();
    let status = wait_for_state(&admin, "greedy", "FAILED");
    assert!(
        status["connector"]["trace"]
            .as_str()
            .unwrap_or_default()
            .contains("is outside connect.allowed.paths"),
        "{status}"
    );
    assert_eq!(status["tasks"], json!([]), "{status}");

    // Inside the ceiling, a connector runs.
    append(&d.input, &lines(0, 3));
    let (code, info) = curl(
        "POST",
        &format!("{admin}/connectors"),
        Some(&source_body("good", &d.input, "good")),
    );
    assert_eq!(code, 201, "{info}");
    assert_eq!(
        values(&read_topic(&broker.bootstrap, "good", 3)),
        want(0, 3)
    );
    broker.stop();
}

/// Issue 16: a task that failed and waits to be restarted is UNASSIGNED, and so is its
/// connector (weir's connector is its one task): status never says RUNNING for what is
/// not running.
#[test]
fn a_failing_connector_is_not_reported_running() {
    let d = dirs();
    let broker = start(&d);
    let admin = broker.admin_url.clone();
    // The file is a symlink out of its granted directory: every attempt fails.
    let secret = d.output.with_file_name("secret.txt");
    std::fs::write(&secret, "secret\n").unwrap();
    let link = d.input.with_file_name("link.txt");
    std::os::unix::fs::symlink(&secret, &link).unwrap();
    let mut body = source_body("retrying", &link, "retrying");
    body["config"]["errors.retry.timeout"] = json!("-1");
    let (code, info) = curl("POST", &format!("{admin}/connectors"), Some(&body));
    assert_eq!(code, 201, "{info}");
    let status = poll_for("the task failed once and waits for its restart", 60, || {
        let (_, status) = curl("GET", &format!("{admin}/connectors/retrying/status"), None);
        let task = &status["tasks"][0];
        if task["state"] == "UNASSIGNED" && task["trace"].is_string() {
            return Ok(status);
        }
        Err(format!("status {status}"))
    });
    assert_eq!(status["connector"]["state"], "UNASSIGNED", "{status}");
    broker.stop();
}
