//! Connectors (issue 5, first slice): the built-in file source and file sink run by the
//! broker from `connect.config.dir`, checked with a real rdkafka consumer; a restart
//! resumes from the stored offsets; a connector reaching outside its granted directory
//! is denied and FAILED while the broker carries on.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::harness::TestBroker;

/// The built `connectors/` components (built once per test process).
pub(crate) fn plugin_path() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            crate::guests::build_workspace(&crate::harness::repo_root().join("connectors"))
        })
        .as_ref()
        .unwrap_or_else(|e| panic!("{e}"))
        .clone()
}

fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

fn lines(from: usize, to: usize) -> String {
    (from..to)
        .map(|i| format!("line {i} ✓ {}\n", "x".repeat(i % 50)))
        .collect()
}

/// Waits until `path` holds exactly `want` (panics after 60 s, showing the difference).
fn wait_for_file(path: &Path, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = std::fs::read_to_string(path).unwrap_or_default();
        if got == want {
            return;
        }
        if Instant::now() > deadline {
            panic!(
                "{} has {} bytes ({} lines), expected {} bytes ({} lines)",
                path.display(),
                got.len(),
                got.lines().count(),
                want.len(),
                want.lines().count()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every record of partition 0 of `topic` from the beginning, as (key, value) strings,
/// reading until `expected` records arrived or 30 s passed.
fn read_topic(bootstrap: &str, topic: &str, expected: usize) -> Vec<(Option<String>, String)> {
    read_topic_for(bootstrap, topic, expected, Duration::from_secs(30))
}

/// As [`read_topic`], giving up after `wait`.
pub(crate) fn read_topic_for(
    bootstrap: &str,
    topic: &str,
    expected: usize,
    wait: Duration,
) -> Vec<(Option<String>, String)> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "connect-test-reader")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + wait;
    while out.len() < expected && Instant::now() < deadline {
        if let Some(m) = c.poll(Duration::from_millis(200)) {
            let m = m.unwrap();
            out.push((
                m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
            ));
        }
    }
    // Anything beyond `expected` would be a duplicate: give it a moment to show up.
    let settle = Instant::now() + Duration::from_millis(500);
    while Instant::now() < settle {
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            out.push((
                m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
            ));
        }
    }
    out
}

struct Dirs {
    _tmp: tempfile::TempDir,
    data: PathBuf,
    configs: PathBuf,
    input: PathBuf,
    output: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    for d in ["data", "configs", "in", "out"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    Dirs {
        data: root.join("data"),
        configs: root.join("configs"),
        input: root.join("in/source.txt"),
        output: root.join("out/sink.txt"),
        _tmp: tmp,
    }
}

fn start(d: &Dirs) -> TestBroker {
    let dir = format!("connect.config.dir={}", d.configs.display());
    let plugins = format!("connect.plugin.path={}", plugin_path().display());
    TestBroker::start_in(&d.data, &[&dir, &plugins])
}

#[test]
fn file_source_to_topic_to_file_sink_and_resume_after_restart() {
    let d = dirs();
    std::fs::write(
        d.configs.join("source.toml"),
        format!(
            "name = \"lines-in\"\nconnector.class = \"file-source\"\ntasks.max = 1\n\
             file = \"{}\"\ntopic = \"lines\"\nbatch.size = 500\npoll.interval.ms = 20\n",
            d.input.display()
        ),
    )
    .unwrap();
    std::fs::write(
        d.configs.join("sink.toml"),
        format!(
            "name = \"lines-out\"\n\"connector.class\" = \"file-sink\"\n\
             file = \"{}\"\ntopics = \"lines\"\noffset.flush.interval.ms = 200\n",
            d.output.display()
        ),
    )
    .unwrap();
    // Half before the broker starts, half appended while it runs.
    let mut want = lines(0, 5_000);
    append(&d.input, &want);
    let broker = start(&d);
    let more = lines(5_000, 10_000);
    append(&d.input, &more);
    want.push_str(&more);
    wait_for_file(&d.output, &want);
    let got = read_topic(&broker.bootstrap, "lines", 10_000);
    let want_lines: Vec<&str> = want.lines().collect();
    assert_eq!(got.len(), 10_000, "every line once");
    for (i, (key, value)) in got.iter().enumerate() {
        assert_eq!(key, &None, "record {i}");
        assert_eq!(value, want_lines[i], "record {i} in order");
    }
    broker.stop();

    // Restart: the source resumes after the last stored byte offset, the sink after its
    // committed offset. A graceful stop stores both, so nothing is repeated.
    let more = lines(10_000, 11_000);
    append(&d.input, &more);
    want.push_str(&more);
    let broker = start(&d);
    wait_for_file(&d.output, &want);
    // A last line without its newline waits for it, then goes as one joined line.
    append(&d.input, "half a ");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(std::fs::read_to_string(&d.output).unwrap(), want);
    append(&d.input, "line\r\n");
    want.push_str("half a line\n");
    wait_for_file(&d.output, &want);
    let got = read_topic(&broker.bootstrap, "lines", 11_001);
    let values: Vec<&str> = got.iter().map(|(_, v)| v.as_str()).collect();
    let want_lines: Vec<&str> = want.lines().collect();
    assert_eq!(
        values, want_lines,
        "no line lost or repeated across the restart"
    );
    broker.stop();
}

/// The latest value of each key in `__connect_status`, waiting until `key` has a value
/// containing `want`.
pub(crate) fn wait_for_status(bootstrap: &str, key: &str, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let records = read_topic_for(
            bootstrap,
            "__connect_status",
            usize::MAX,
            Duration::from_secs(1),
        );
        let latest = records
            .iter()
            .rev()
            .find(|(k, _)| k.as_deref() == Some(key))
            .map(|(_, v)| v.clone());
        if let Some(v) = latest {
            if v.contains(want) {
                return v;
            }
            if Instant::now() > deadline {
                panic!("{key} is {v}, never {want}");
            }
        } else if Instant::now() > deadline {
            panic!("no {key} in __connect_status: {records:?}");
        }
    }
}

#[test]
fn a_connector_reaching_outside_its_directory_is_denied_and_failed() {
    let d = dirs();
    // `in/escape.txt` is a symlink to a file outside `in/`, the only directory granted.
    let secret = d.output.with_file_name("secret.txt");
    std::fs::write(&secret, "secret line\n").unwrap();
    let link = d.input.with_file_name("escape.txt");
    std::os::unix::fs::symlink(&secret, &link).unwrap();
    std::fs::write(
        d.configs.join("escape.toml"),
        format!(
            "name = \"escape\"\nconnector.class = \"file-source\"\nfile = \"{}\"\n\
             topic = \"stolen\"\nerrors.retry.timeout = 300\n",
            link.display()
        ),
    )
    .unwrap();
    // A config file that is not a connector at all: FAILED too, nothing else affected.
    std::fs::write(d.configs.join("broken.toml"), "name = \"broken\"\n").unwrap();
    let broker = start(&d);
    let status = wait_for_status(&broker.bootstrap, "status-connector-escape", "FAILED");
    assert!(
        status.contains("cannot open") && status.contains("escape.txt"),
        "{status}"
    );
    assert!(!status.contains("secret line"), "{status}");
    let broken = wait_for_status(&broker.bootstrap, "status-connector-broken", "FAILED");
    assert!(broken.contains("connector.class"), "{broken}");

    // The broker is fine: a produce and a consume still work, and nothing was stolen.
    let producer: rdkafka::producer::BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &broker.bootstrap)
        .create()
        .unwrap();
    producer
        .send(rdkafka::producer::BaseRecord::<(), str>::to("after").payload("still here"))
        .map_err(|(e, _)| e)
        .unwrap();
    rdkafka::producer::Producer::flush(&producer, Duration::from_secs(10)).unwrap();
    let got = read_topic(&broker.bootstrap, "after", 1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, "still here");
    let stolen = std::fs::read_to_string(d.data.join("stolen-0/00000000000000000000.log"))
        .unwrap_or_default();
    assert!(!stolen.contains("secret line"));
    broker.stop();
}
