//! `GET /metrics` on the admin listener: scraped before and after a real client's
//! produce and consume, every sample parsed by a strict reader of Prometheus' text format
//! (0.0.4); per-broker counts (two brokers in one process count apart); group lag after a
//! commit; plugin call durations and failures; connector task states.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::json;
use weir::plugin::{PluginError, PluginHost, PluginHostConfig, PluginLimits, Record};

use crate::guests::guest;
use crate::harness::TestBroker;
use crate::rdkafka_client::{create_topic, producer, read_partition};

/// One sample line: metric name, labels, value.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A parsed exposition: samples, and each family's `# TYPE`.
#[derive(Debug)]
pub(crate) struct Exposition {
    samples: Vec<Sample>,
    types: HashMap<String, String>,
}

impl Exposition {
    /// The value of the series `name{labels}` (labels compared as a set), if present.
    pub(crate) fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == want)
            .map(|s| s.value)
    }

    /// As [`Exposition::get`], 0 when the series is absent (a counter not yet created).
    pub(crate) fn or_zero(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or(0.0)
    }
}

fn is_name(s: &str, colon: bool) -> bool {
    let mut chars = s.chars();
    let first_ok = |c: char| c.is_ascii_alphabetic() || c == '_' || (colon && c == ':');
    chars.next().is_some_and(first_ok) && chars.all(|c| first_ok(c) || c.is_ascii_digit())
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => s.parse().map_err(|e| format!("bad value {s:?}: {e}")),
    }
}

/// `{a="x",b="y\"z"}` → labels and the rest of the line after `}`.
fn parse_labels(s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    let mut rest = s;
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((labels, after));
        }
        let eq = rest.find('=').ok_or("label without '='")?;
        let name = &rest[..eq];
        if !is_name(name, false) {
            return Err(format!("bad label name {name:?}"));
        }
        let mut chars = rest[eq + 1..].char_indices();
        if chars.next().map(|(_, c)| c) != Some('"') {
            return Err(format!("label {name} value not quoted"));
        }
        let mut value = String::new();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next().map(|(_, c)| c) {
                    Some('\\') => value.push('\\'),
                    Some('"') => value.push('"'),
                    Some('n') => value.push('\n'),
                    other => return Err(format!("bad escape \\{other:?} in label {name}")),
                },
                '"' => {
                    end = Some(eq + 1 + i + 1);
                    break;
                }
                '\n' => return Err("raw newline in a label value".into()),
                c => value.push(c),
            }
        }
        let end = end.ok_or_else(|| format!("unterminated value of label {name}"))?;
        if labels.insert(name.to_string(), value).is_some() {
            return Err(format!("label {name} twice"));
        }
        rest = &rest[end..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

/// Parses Prometheus' text format strictly: every line is a `# HELP`/`# TYPE`/comment,
/// blank, or a well-formed sample; a family's `# TYPE` comes once, before its samples,
/// and its samples are contiguous; no series twice; a histogram's buckets rise with `le`
/// and end in `+Inf` equal to `_count`.
fn parse(text: &str) -> Result<Exposition, String> {
    let mut samples = Vec::new();
    let mut types: HashMap<String, String> = HashMap::new();
    let mut seen_series = HashSet::new();
    let mut finished_families: HashSet<String> = HashSet::new();
    let mut current_family: Option<String> = None;
    for (n, line) in text.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let words: Vec<&str> = comment.trim_start().splitn(3, ' ').collect();
            match words.as_slice() {
                ["TYPE", name, kind] => {
                    if !is_name(name, true) {
                        return Err(at("bad metric name".into()));
                    }
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(kind) {
                        return Err(at(format!("unknown type {kind}")));
                    }
                    if types.insert(name.to_string(), kind.to_string()).is_some() {
                        return Err(at("second TYPE for a family".into()));
                    }
                    if finished_families.contains(*name) || current_family.as_deref() == Some(*name)
                    {
                        return Err(at("TYPE after the family's samples".into()));
                    }
                }
                ["HELP", name, ..] if is_name(name, true) => {}
                ["HELP", ..] => return Err(at("bad HELP".into())),
                _ => {}
            }
            continue;
        }
        let name_end = line.find(['{', ' ']).ok_or_else(|| at("no value".into()))?;
        let name = &line[..name_end];
        if !is_name(name, true) {
            return Err(at("bad metric name".into()));
        }
        let (labels, rest) = match line[name_end..].strip_prefix('{') {
            Some(l) => parse_labels(l).map_err(at)?,
            None => (BTreeMap::new(), &line[name_end..]),
        };
        let mut fields = rest.split_whitespace();
        let value = parse_value(fields.next().ok_or_else(|| at("no value".into()))?).map_err(at)?;
        if let Some(ts) = fields.next() {
            ts.parse::<i64>()
                .map_err(|e| at(format!("bad timestamp: {e}")))?;
        }
        if fields.next().is_some() {
            return Err(at("trailing fields".into()));
        }
        // The family a sample belongs to: histogram samples carry a suffix.
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| types.get(*f).map(String::as_str) == Some("histogram"))
            })
            .unwrap_or(name)
            .to_string();
        if current_family.as_deref() != Some(family.as_str()) {
            if finished_families.contains(&family) {
                return Err(at(format!("samples of {family} are not contiguous")));
            }
            if let Some(done) = current_family.replace(family.clone()) {
                finished_families.insert(done);
            }
        }
        let series = format!("{name}{labels:?}");
        if !seen_series.insert(series) {
            return Err(at("series twice".into()));
        }
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    // Histograms: cumulative buckets, +Inf last and equal to _count.
    for (family, kind) in &types {
        if kind != "histogram" {
            continue;
        }
        let mut by_series: BTreeMap<BTreeMap<String, String>, Vec<(f64, f64)>> = BTreeMap::new();
        for s in samples
            .iter()
            .filter(|s| s.name == format!("{family}_bucket"))
        {
            let mut labels = s.labels.clone();
            let le = labels
                .remove("le")
                .ok_or(format!("{family}_bucket without le"))?;
            by_series
                .entry(labels)
                .or_default()
                .push((parse_value(&le)?, s.value));
        }
        for (labels, buckets) in by_series {
            let les: Vec<f64> = buckets.iter().map(|b| b.0).collect();
            let counts: Vec<f64> = buckets.iter().map(|b| b.1).collect();
            if !les.windows(2).all(|w| w[0] < w[1]) || les.last() != Some(&f64::INFINITY) {
                return Err(format!("{family}{labels:?}: bucket bounds {les:?}"));
            }
            if !counts.windows(2).all(|w| w[0] <= w[1]) {
                return Err(format!("{family}{labels:?}: bucket counts {counts:?}"));
            }
            let count = samples
                .iter()
                .find(|s| s.name == format!("{family}_count") && s.labels == labels)
                .map(|s| s.value);
            if count != counts.last().copied() {
                return Err(format!(
                    "{family}{labels:?}: _count {count:?} != +Inf bucket"
                ));
            }
        }
    }
    Ok(Exposition { samples, types })
}

/// `GET {admin}/metrics`, checked for status and content type, parsed.
pub(crate) fn scrape(admin_url: &str) -> Exposition {
    let response = ureq::get(&format!("{admin_url}/metrics"))
        .timeout(Duration::from_secs(30))
        .call()
        .expect("GET /metrics");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = response.into_string().expect("UTF-8 body");
    parse(&text).unwrap_or_else(|e| panic!("not Prometheus text format: {e}\n{text}"))
}

const RECORDS: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_a_real_clients_produce_and_consume() {
    let b = TestBroker::start();
    let topic = "metered";
    create_topic(&b.bootstrap, topic, 1, &[]).await;
    let p0 = [("topic", topic), ("partition", "0")];
    let before = scrape(&b.admin_url);
    assert_eq!(
        before
            .types
            .get("weir_request_duration_seconds")
            .map(String::as_str),
        Some("histogram")
    );
    assert_eq!(
        before.types.get("weir_requests_total").map(String::as_str),
        Some("counter")
    );
    assert_eq!(before.get("weir_partition_log_end_offset", &p0), Some(0.0));
    assert_eq!(before.get("weir_partition_size_bytes", &p0), Some(0.0));

    // Each record awaited before the next, with no linger: librdkafka sends exactly one
    // Produce request per record.
    let producer = producer(&b.bootstrap, &[("linger.ms", "0"), ("acks", "all")]);
    for i in 0..RECORDS {
        let value = format!("record {i} {}", "x".repeat(i));
        producer
            .send(
                FutureRecord::to(topic)
                    .partition(0)
                    .key("k")
                    .payload(value.as_str()),
                Duration::from_secs(30),
            )
            .await
            .expect("delivered");
    }
    let produced = scrape(&b.admin_url);
    let delta = |after: &Exposition, before: &Exposition, name: &str, labels: &[(&str, &str)]| {
        after.or_zero(name, labels) - before.or_zero(name, labels)
    };
    let produce = [("api", "Produce")];
    assert_eq!(
        delta(&produced, &before, "weir_requests_total", &produce),
        RECORDS as f64
    );
    assert_eq!(
        delta(
            &produced,
            &before,
            "weir_request_duration_seconds_count",
            &produce
        ),
        RECORDS as f64
    );
    assert_eq!(
        produced.get("weir_partition_log_end_offset", &p0),
        Some(RECORDS as f64)
    );
    assert_eq!(
        produced.get("weir_partition_log_start_offset", &p0),
        Some(0.0)
    );
    let t = [("topic", topic)];
    assert_eq!(
        delta(&produced, &before, "weir_messages_in_total", &t),
        RECORDS as f64
    );
    // Batches are stored as sent: the partition grew by exactly the bytes counted in.
    let bytes_in = delta(&produced, &before, "weir_bytes_in_total", &t);
    assert!(bytes_in > 0.0);
    assert_eq!(
        delta(&produced, &before, "weir_partition_size_bytes", &p0),
        bytes_in
    );
    assert_eq!(delta(&produced, &before, "weir_bytes_out_total", &t), 0.0);

    let got = read_partition(&b.bootstrap, topic, 0, Offset::Beginning, RECORDS);
    assert_eq!(got.len(), RECORDS);
    let consumed = scrape(&b.admin_url);
    let fetch = [("api", "Fetch")];
    let fetches = delta(&consumed, &produced, "weir_requests_total", &fetch);
    assert!(fetches >= 1.0, "{fetches} Fetch requests");
    assert!(
        delta(
            &consumed,
            &produced,
            "weir_request_duration_seconds_count",
            &fetch
        ) >= fetches,
        "every counted Fetch has its duration"
    );
    // One reader from offset 0 receives every stored batch exactly once.
    assert_eq!(
        delta(&consumed, &produced, "weir_bytes_out_total", &t),
        bytes_in
    );
    assert_eq!(
        delta(&consumed, &produced, "weir_requests_total", &produce),
        0.0
    );

    // Group lag: a commit at offset 15 leaves RECORDS - 15 records to read. The group id
    // has a quote and a backslash: label values come back as the client wrote them.
    let group = "metered \"group\\";
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &b.bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(15))
        .unwrap();
    consumer.commit(&tpl, CommitMode::Sync).expect("commit");
    let lagging = scrape(&b.admin_url);
    assert_eq!(
        lagging.get(
            "weir_group_lag",
            &[("group", group), ("topic", topic), ("partition", "0")]
        ),
        Some((RECORDS - 15) as f64)
    );

    // Another broker in this process has its own recorder: none of the above is there.
    let other = TestBroker::start();
    let fresh = scrape(&other.admin_url);
    assert_eq!(fresh.get("weir_requests_total", &produce), Some(0.0));
    assert_eq!(fresh.get("weir_bytes_in_total", &t), None);
    other.stop();
    b.stop();
}

#[tokio::test]
async fn plugin_calls_and_failures_are_counted_per_plugin_and_call() {
    let metrics = weir::metrics::Metrics::new([]);
    let host = PluginHost::new(PluginHostConfig {
        cache_dir: None,
        limits: PluginLimits::default(),
        metrics: Some(metrics.clone()),
    })
    .expect("plugin host");
    let mut t = host
        .load_transform(&guest("hostile"), &[])
        .await
        .expect("load hostile");
    let record = |v: &'static [u8]| Record {
        key: None,
        value: Some(bytes::Bytes::from_static(v)),
        headers: Vec::new(),
        timestamp_ms: 1,
    };
    let context = weir::plugin::BatchContext {
        topic: "in".into(),
        partition: 0,
        base_offset: 0,
    };
    t.apply(&context, &[record(b"fine")]).await.expect("a call");
    assert!(matches!(
        t.apply(&context, &[record(b"panic")]).await,
        Err(PluginError::Trap { .. })
    ));
    t.apply(&context, &[record(b"fine")])
        .await
        .expect("the next call");
    let text = metrics.render(weir::metrics::Scrape::new());
    let m = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let labels = [("plugin", "hostile.wasm"), ("call", "apply")];
    assert_eq!(m.get("weir_plugin_call_failures_total", &labels), Some(1.0));
    assert_eq!(
        m.get("weir_plugin_call_duration_seconds_count", &labels),
        Some(3.0)
    );
}

/// Polls `GET /metrics` until `cond` holds (panics after 60 s with the last scrape's
/// connector lines).
fn wait_for_metrics(admin: &str, what: &str, cond: impl Fn(&Exposition) -> bool) -> Exposition {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let m = scrape(admin);
        if cond(&m) {
            return m;
        }
        if Instant::now() > deadline {
            let lines: Vec<&Sample> = m
                .samples
                .iter()
                .filter(|s| {
                    s.name.starts_with("weir_connector") || s.name.starts_with("weir_plugin")
                })
                .collect();
            panic!("timed out waiting for {what}: {lines:#?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn connector_task_states_and_calls_are_exported() {
    let d = crate::connect::dirs();
    let broker = crate::connect::start(&d);
    let admin = broker.admin_url.clone();
    crate::connect::append(&d.input, &crate::connect::lines(0, 10));
    let name = "metered-source";
    let body = json!({
        "name": name,
        "config": {
            "connector.class": "file-source",
            "tasks.max": "1",
            "file": d.input.display().to_string(),
            "topic": "metered-connect",
            "poll.interval.ms": "20",
        }
    });
    let response = ureq::post(&format!("{admin}/connectors"))
        .timeout(Duration::from_secs(60))
        .send_json(body)
        .expect("POST /connectors");
    assert_eq!(response.status(), 201);
    let state = |s: &'static str| [("connector", name), ("state", s)];
    let m = wait_for_metrics(&admin, "a RUNNING task that polled", |m| {
        m.get("weir_connector_tasks", &state("RUNNING")) == Some(1.0)
            && m.get(
                "weir_partition_log_end_offset",
                &[("topic", "metered-connect"), ("partition", "0")],
            ) == Some(10.0)
    });
    for other in ["UNASSIGNED", "PAUSED", "STOPPED", "RESTARTING", "FAILED"] {
        assert_eq!(
            m.get("weir_connector_tasks", &state(other)),
            Some(0.0),
            "{other}"
        );
    }
    let polls = m
        .samples
        .iter()
        .find(|s| {
            s.name == "weir_plugin_call_duration_seconds_count"
                && s.labels.get("call").map(String::as_str) == Some("poll")
        })
        .map(|s| s.value);
    assert!(polls.is_some_and(|n| n >= 1.0), "poll calls: {polls:?}");

    let response = ureq::put(&format!("{admin}/connectors/{name}/pause"))
        .timeout(Duration::from_secs(60))
        .call()
        .expect("PUT pause");
    assert_eq!(response.status(), 202);
    wait_for_metrics(&admin, "a PAUSED task", |m| {
        m.get("weir_connector_tasks", &state("PAUSED")) == Some(1.0)
            && m.get("weir_connector_tasks", &state("RUNNING")) == Some(0.0)
    });
}

#[test]
fn the_reader_refuses_what_is_not_the_text_format() {
    for bad in [
        "weir_x{a=\"1\"\n",
        "weir_x{a=1} 1\n",
        "weir_x 1 2 3\n",
        "weir x 1\n",
        "weir_x{a=\"\\q\"} 1\n",
        "weir_x 1\nweir_y 1\nweir_x{a=\"b\"} 1\n",
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
    ] {
        assert!(parse(bad).is_err(), "accepted {bad:?}");
    }
    let ok = parse("# HELP a x y\n# TYPE a counter\na{b=\"c\\\"d\"} 1\n\na 2 1700000000000\n")
        .expect("valid");
    assert_eq!(ok.get("a", &[("b", "c\"d")]), Some(1.0));
}
