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

use crate::harness::{poll_for, wait_until, TestBroker};

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

pub(crate) fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

pub(crate) fn lines(from: usize, to: usize) -> String {
    (from..to)
        .map(|i| format!("line {i} ✓ {}\n", "x".repeat(i % 50)))
        .collect()
}

/// Waits until `path` holds exactly `want` (panics after 60 s, showing the difference).
pub(crate) fn wait_for_file(path: &Path, want: &str) {
    poll_for(
        &format!("{} holds what is expected", path.display()),
        60,
        || {
            let got = std::fs::read_to_string(path).unwrap_or_default();
            if got == want {
                return Ok(());
            }
            Err(format!(
                "it has {} bytes ({} lines), expected {} bytes ({} lines)",
                got.len(),
                got.lines().count(),
                want.len(),
                want.lines().count()
            ))
        },
    )
}

/// Every record of partition 0 of `topic` from the beginning, as (key, value) strings,
/// reading until `expected` records arrived or 30 s passed.
pub(crate) fn read_topic(
    bootstrap: &str,
    topic: &str,
    expected: usize,
) -> Vec<(Option<String>, String)> {
    read_topic_for(bootstrap, topic, expected, Duration::from_secs(30))
}

/// As [`read_topic`], giving up after `wait`.
pub(crate) fn read_topic_for(
    bootstrap: &str,
    topic: &str,
    expected: usize,
    wait: Duration,
) -> Vec<(Option<String>, String)> {
    read_partitions_for(bootstrap, topic, 1, expected, wait)
}

/// As [`read_topic_for`], over partitions `0..partitions` (each in offset order, the
/// partitions interleaved as they arrive).
pub(crate) fn read_partitions_for(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
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
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + wait;
    while out.len() < expected && Instant::now() < deadline {
        if let Some(m) = c.poll(Duration::from_millis(200)) {
            // A transport error (a broker killed by the test) is retried by the client.
            let Ok(m) = m else { continue };
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
            // A transport error (a broker killed by the test) is retried by the client.
            let Ok(m) = m else { continue };
            out.push((
                m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
            ));
        }
    }
    out
}

/// A temp dir with `data/` (log.dirs), `configs/` (connect.config.dir), `in/source.txt`
/// and `out/sink.txt`.
pub(crate) struct Dirs {
    _tmp: tempfile::TempDir,
    pub(crate) data: PathBuf,
    pub(crate) configs: PathBuf,
    pub(crate) input: PathBuf,
    pub(crate) output: PathBuf,
}

pub(crate) fn dirs() -> Dirs {
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

pub(crate) fn start(d: &Dirs) -> TestBroker {
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
    // Proves an absence (the half line is not written alone): a sleep, not a poll.
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

/// Waits until the topic `topic` holds `expected` records and returns their values.
fn topic_values(bootstrap: &str, topic: &str, expected: usize) -> Vec<String> {
    read_topic_for(bootstrap, topic, expected, Duration::from_secs(60))
        .into_iter()
        .map(|(_, v)| v)
        .collect()
}

fn source_config(d: &Dirs, name: &str, topic: &str) {
    source_config_with_batch(d, name, topic, 500);
}

/// A file-source config `name` reading `d.input` into `topic`, `batch_size` lines a poll.
fn source_config_with_batch(d: &Dirs, name: &str, topic: &str, batch_size: usize) {
    std::fs::write(
        d.configs.join(format!("{name}.toml")),
        format!(
            "name = \"{name}\"\nconnector.class = \"file-source\"\nfile = \"{}\"\n\
             topic = \"{topic}\"\nbatch.size = {batch_size}\n",
            d.input.display()
        ),
    )
    .unwrap();
}

#[test]
fn file_source_follows_copytruncate_and_rename_rotation_exactly_once() {
    let d = dirs();
    source_config(&d, "rotating", "rotated");
    append(&d.input, &lines(0, 1_000));
    let broker = start(&d);
    assert_eq!(
        topic_values(&broker.bootstrap, "rotated", 1_000).len(),
        1_000
    );
    // copytruncate: lines appended just before are still unread when the file is copied
    // and emptied in place; they are read from the copy, then the new content.
    append(&d.input, &lines(1_000, 2_000));
    std::fs::copy(&d.input, d.input.with_extension("txt.1")).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&d.input)
        .unwrap()
        .set_len(0)
        .unwrap();
    append(&d.input, &lines(2_000, 3_000));
    // Let the connector reach the new content before the next rotation.
    let got = topic_values(&broker.bootstrap, "rotated", 3_000);
    assert_eq!(got.len(), 3_000, "after copytruncate");
    // rename-and-recreate: the writer still appends to the renamed file (its open
    // descriptor) before it creates the new one; every line is read once, in order.
    append(&d.input, &lines(3_000, 3_500));
    let renamed = d.input.with_extension("txt.2");
    std::fs::rename(&d.input, &renamed).unwrap();
    append(&renamed, &lines(3_500, 3_600));
    append(&d.input, &lines(3_600, 4_000));
    let got = topic_values(&broker.bootstrap, "rotated", 4_000);
    let want: Vec<String> = lines(0, 4_000).lines().map(str::to_string).collect();
    assert_eq!(got.len(), want.len(), "every line exactly once");
    assert_eq!(got, want, "in order");
    broker.stop();

    // The stored offset names the file, not just a position: after a restart with the
    // file replaced by a shorter new one, the new one is read from its start.
    let old = d.input.with_extension("txt.3");
    std::fs::rename(&d.input, &old).unwrap();
    append(&d.input, &lines(4_000, 4_010));
    let broker = start(&d);
    let got = topic_values(&broker.bootstrap, "rotated", 4_010);
    let want: Vec<String> = lines(0, 4_010).lines().map(str::to_string).collect();
    assert_eq!(
        got, want,
        "the replacement file is read from byte 0 after a restart"
    );
    broker.stop();

    // Rotations while the connector is down, with unread lines in the old file: the
    // stored fingerprint finds the copy (copytruncate) and the renamed file, whose rest
    // is read before the new file.
    append(&d.input, &lines(4_010, 4_100));
    std::fs::copy(&d.input, d.input.with_extension("txt.4")).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&d.input)
        .unwrap()
        .set_len(0)
        .unwrap();
    append(&d.input, &lines(4_100, 4_200));
    let broker = start(&d);
    let got = topic_values(&broker.bootstrap, "rotated", 4_200);
    let want: Vec<String> = lines(0, 4_200).lines().map(str::to_string).collect();
    assert_eq!(got, want, "copytruncate while stopped");
    broker.stop();
    append(&d.input, &lines(4_200, 4_300));
    std::fs::rename(&d.input, d.input.with_extension("txt.5")).unwrap();
    append(&d.input, &lines(4_300, 4_400));
    let broker = start(&d);
    let got = topic_values(&broker.bootstrap, "rotated", 4_400);
    let want: Vec<String> = lines(0, 4_400).lines().map(str::to_string).collect();
    assert_eq!(got, want, "rename-and-recreate while stopped");
    broker.stop();
}

/// A copytruncate while the connector is mid-file (its descriptor open, lines left to
/// read), with more new content written right after the truncation than the old file
/// held: the descriptor's next read returns the new content at the old offset. The guest
/// checks each read through the descriptor, drops that one, and reads the rest from the
/// copy, then the new file from byte 0: each line once and in order.
#[test]
fn file_source_mid_file_copytruncate_to_longer_content_reads_every_line_once() {
    const OLD: usize = 60_000;
    const NEW: usize = 120_000;
    let d = dirs();
    // 50 lines a poll: the connector stays mid-file, its descriptor open, for ~1,200 polls.
    source_config_with_batch(&d, "midfile", "midfile", 50);
    append(&d.input, &lines(0, OLD));
    // Built before the rotation, so the truncation and the new content come back to back
    // (a gap between them lets the connector see the end of the emptied file first).
    let new_content = lines(OLD, OLD + NEW);
    let broker = start(&d);
    let watcher: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &broker.bootstrap)
        .create()
        .unwrap();
    let end_offset = || {
        watcher
            .fetch_watermarks("midfile", 0, Duration::from_secs(5))
            .map_or(0, |(_, high)| high)
    };
    // As soon as the first lines are in the topic, rotate: copy, empty in place, write
    // twice as many lines as the old file had (so past wherever the descriptor is).
    wait_until("the first lines reach the topic", 60, || end_offset() > 0);
    std::fs::copy(&d.input, d.input.with_extension("txt.1")).unwrap();
    let mut input = std::fs::OpenOptions::new()
        .write(true)
        .open(&d.input)
        .unwrap();
    input.set_len(0).unwrap();
    input.write_all(new_content.as_bytes()).unwrap();
    drop(input);
    let at_rotation = end_offset();
    // The case this test is for: the connector had read into the old file but not to its
    // end (a 64 KiB read holds ~1,700 lines) when it was rotated.
    assert!(
        at_rotation < (OLD - 2_000) as i64,
        "the connector read {at_rotation} of {OLD} lines before the rotation: not mid-file"
    );
    let got = topic_values(&broker.bootstrap, "midfile", OLD + NEW);
    let numbers: Vec<usize> = got.iter().map(|l| line_number(l)).collect();
    let want: Vec<usize> = (0..OLD + NEW).collect();
    assert_eq!(numbers.len(), want.len(), "every line exactly once");
    assert_eq!(numbers, want, "in order");
    assert_eq!(
        end_offset(),
        (OLD + NEW) as i64,
        "no line after the last one"
    );
    broker.stop();
}

/// Line `i` of [`lines`] → `i` (panics on anything else: a torn or foreign line).
fn line_number(line: &str) -> usize {
    let n: usize = line
        .strip_prefix("line ")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a line of the input: {line:?}"));
    assert_eq!(
        format!("{line}\n"),
        lines(n, n + 1),
        "line {n} arrived changed"
    );
    n
}

#[test]
fn file_source_to_file_sink_100k_lines_survive_kill_9() {
    const TOTAL: usize = 100_000;
    let d = dirs();
    source_config(&d, "lines-in", "lines");
    std::fs::write(
        d.configs.join("sink.toml"),
        format!(
            "name = \"lines-out\"\nconnector.class = \"file-sink\"\nfile = \"{}\"\n\
             topics = \"lines\"\noffset.flush.interval.ms = 200\n",
            d.output.display()
        ),
    )
    .unwrap();
    let overrides = [
        format!("connect.config.dir={}", d.configs.display()),
        format!("connect.plugin.path={}", plugin_path().display()),
    ];
    let overrides: Vec<&str> = overrides.iter().map(String::as_str).collect();
    append(&d.input, &lines(0, 30_000));
    let broker = crate::harness::BinaryBroker::spawn(&d.data, 0, &overrides);
    // The application keeps writing while the broker is killed and restarted.
    let input = d.input.clone();
    let writer = std::thread::spawn(move || {
        for from in (30_000..TOTAL).step_by(2_000) {
            append(&input, &lines(from, from + 2_000));
            // Pacing of the workload (an application writing over time), not a wait.
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    wait_until("the sink reaches 40,000 lines", 60, || {
        std::fs::read_to_string(&d.output)
            .unwrap_or_default()
            .lines()
            .count()
            >= 40_000
    });
    broker.kill9();
    let broker = crate::harness::BinaryBroker::spawn(&d.data, 0, &overrides);
    writer.join().unwrap();

    // Every line arrives; a line seen again may only be part of a re-run that starts at
    // the crash (the source's last poll, the sink's records since its last flush).
    let deadline = Instant::now() + Duration::from_secs(120);
    let (distinct, reruns, repeated) = loop {
        let text = std::fs::read_to_string(&d.output).unwrap_or_default();
        // The sink may be writing: only whole lines count.
        let text = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
        let mut next = 0;
        let mut reruns = 0;
        let mut repeated = 0;
        let mut in_rerun = false;
        for line in text.lines() {
            let n = line_number(line);
            if n == next {
                next += 1;
                in_rerun = false;
            } else if n < next {
                repeated += 1;
                if !in_rerun {
                    reruns += 1;
                    in_rerun = true;
                }
            } else {
                panic!("line {n} arrived before line {next}");
            }
        }
        if next == TOTAL || Instant::now() > deadline {
            break (next, reruns, repeated);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        distinct, TOTAL,
        "every line is in the sink's file, in order"
    );
    assert!(
        reruns <= 2,
        "repeated lines only at the crash (source re-read and sink re-put): {reruns} runs, {repeated} lines"
    );
    eprintln!("kill -9: {repeated} lines repeated in {reruns} run(s)");
    // The topic itself holds every line in order, with repeats only from the source's
    // re-read of its last poll (at most batch.size = 500).
    let values = topic_values(&broker.bootstrap, "lines", TOTAL);
    let mut next = 0;
    let mut topic_repeats = 0;
    for v in &values {
        let n = line_number(v);
        if n == next {
            next += 1;
        } else {
            assert!(
                n < next && next - n <= 500,
                "line {n} out of place after {next}"
            );
            topic_repeats += 1;
        }
    }
    assert_eq!(next, TOTAL);
    assert!(
        topic_repeats <= 500,
        "{topic_repeats} repeated records in the topic"
    );
    broker.terminate();
}

#[test]
fn transforms_chain_and_json_converters_in_source_and_sink() {
    let d = dirs();
    let redact = crate::guests::guest("redact");
    let filter = crate::guests::guest("filter");
    // Source: redact `email`, keep only NL rows, then JsonConverter with schemas.
    std::fs::write(
        d.configs.join("source.toml"),
        format!(
            "name = \"people-in\"\nconnector.class = \"file-source\"\nfile = \"{}\"\n\
             topic = \"people\"\n\
             transforms = \"mask,keep\"\n\
             \"transforms.mask.type\" = \"{}\"\n\"transforms.mask.fields\" = \"email\"\n\
             \"transforms.keep.type\" = \"{}\"\n\"transforms.keep.field\" = \"country\"\n\
             \"transforms.keep.equals\" = \"NL\"\n\
             value.converter = \"org.apache.kafka.connect.json.JsonConverter\"\n\
             \"value.converter.schemas.enable\" = true\n",
            d.input.display(),
            redact.display(),
            filter.display()
        ),
    )
    .unwrap();
    // Sink: reads the envelopes back (the payload, a JSON object, is written as a line);
    // a record that is not an envelope is skipped under errors.tolerance=all.
    std::fs::write(
        d.configs.join("sink.toml"),
        format!(
            "name = \"people-out\"\nconnector.class = \"file-sink\"\nfile = \"{}\"\n\
             topics = \"people\"\noffset.flush.interval.ms = 100\n\
             value.converter = \"json\"\nerrors.tolerance = \"all\"\n",
            d.output.display()
        ),
    )
    .unwrap();
    let mut input = String::new();
    for i in 0..200 {
        let country = if i % 2 == 0 { "NL" } else { "BE" };
        input.push_str(&format!(
            "{{\"id\":{i},\"email\":\"u{i}@example.com\",\"country\":\"{country}\"}}\n"
        ));
    }
    append(&d.input, &input);
    let broker = start(&d);
    wait_for_status(&broker.bootstrap, "status-connector-people-in", "RUNNING");
    let got = topic_values(&broker.bootstrap, "people", 100);
    assert_eq!(got.len(), 100, "only the NL rows");
    for (n, v) in got.iter().enumerate() {
        let v: serde_json::Value = serde_json::from_str(v).unwrap();
        assert_eq!(v["schema"]["type"], "struct", "{v}");
        assert_eq!(v["payload"]["id"], n as i64 * 2, "{v}");
        assert_eq!(v["payload"]["email"], "***", "{v}");
        assert_eq!(v["payload"]["country"], "NL", "{v}");
    }
    // A record produced by a client that is not an envelope: skipped by the sink.
    let producer: rdkafka::producer::BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &broker.bootstrap)
        .create()
        .unwrap();
    producer
        .send(rdkafka::producer::BaseRecord::<(), str>::to("people").payload("not json"))
        .map_err(|(e, _)| e)
        .unwrap();
    rdkafka::producer::Producer::flush(&producer, Duration::from_secs(10)).unwrap();
    let want: String = (0..200)
        .step_by(2)
        .map(|i| format!("{{\"country\":\"NL\",\"email\":\"***\",\"id\":{i}}}\n"))
        .collect();
    wait_for_file(&d.output, &want);
    broker.stop();
}

/// Issue 14: a sink reads read_committed, as Kafka Connect's sinks do. A transactional
/// producer commits, aborts and commits again on the sink's topic, between plain
/// records: the file holds the plain and committed records in order, none of the
/// aborted ones, and the sink moves on past the transaction markers.
#[test]
fn a_file_sink_writes_committed_transactions_and_never_aborted_ones() {
    use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
    let d = dirs();
    std::fs::write(
        d.configs.join("sink.toml"),
        format!(
            "name = \"txn-out\"\n\"connector.class\" = \"file-sink\"\n\
             file = \"{}\"\ntopics = \"txn-lines\"\noffset.flush.interval.ms = 200\n",
            d.output.display()
        ),
    )
    .unwrap();
    let broker = start(&d);
    let make =
        |transactional: bool| -> ThreadedProducer<rdkafka::producer::DefaultProducerContext> {
            let mut c = ClientConfig::new();
            c.set("bootstrap.servers", &broker.bootstrap)
                .set("linger.ms", "1");
            if transactional {
                c.set("transactional.id", "sink-txn");
            }
            c.create().expect("producer")
        };
    let send = |p: &ThreadedProducer<_>, from: usize, to: usize, tag: &str| {
        for i in from..to {
            let v = format!("{tag} {i}");
            p.send(BaseRecord::<(), str>::to("txn-lines").payload(&v))
                .expect("queued");
        }
    };
    let plain = make(false);
    let txn = make(true);
    let wait = Duration::from_secs(30);
    txn.init_transactions(wait).expect("init_transactions");
    let mut want = String::new();
    send(&plain, 0, 100, "plain");
    plain.flush(wait).unwrap();
    want.push_str(&(0..100).map(|i| format!("plain {i}\n")).collect::<String>());
    txn.begin_transaction().unwrap();
    send(&txn, 0, 200, "committed");
    txn.commit_transaction(wait).expect("commit");
    want.push_str(
        &(0..200)
            .map(|i| format!("committed {i}\n"))
            .collect::<String>(),
    );
    txn.begin_transaction().unwrap();
    send(&txn, 0, 200, "aborted");
    txn.flush(wait).unwrap();
    txn.abort_transaction(wait).expect("abort");
    send(&plain, 100, 150, "plain");
    plain.flush(wait).unwrap();
    want.push_str(
        &(100..150)
            .map(|i| format!("plain {i}\n"))
            .collect::<String>(),
    );
    txn.begin_transaction().unwrap();
    send(&txn, 200, 300, "committed");
    txn.commit_transaction(wait).expect("commit");
    want.push_str(
        &(200..300)
            .map(|i| format!("committed {i}\n"))
            .collect::<String>(),
    );
    wait_for_file(&d.output, &want);
    // Proves an absence (nothing aborted shows up late): a sleep, not a poll.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(std::fs::read_to_string(&d.output).unwrap(), want);
    broker.stop();
}
