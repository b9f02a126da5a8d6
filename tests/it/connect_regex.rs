//! Sinks with `topics.regex` (issue 5; Kafka Connect's pattern subscription): a file sink
//! consumes every topic whose whole name matches, including one created while it runs,
//! and nothing else.

use std::path::Path;
use std::time::Duration;

use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;

use crate::connect::{dirs, start};
use crate::harness::poll_for;

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

fn values(topic: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{topic} {i}")).collect()
}

/// Waits (up to 60 s) until `path` holds exactly the lines of `want`, in any order
/// (records of different topics interleave); panics showing both otherwise.
fn wait_for_lines(path: &Path, want: &[String]) {
    let mut want = want.to_vec();
    want.sort();
    poll_for(&format!("{} holds the lines", path.display()), 60, || {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut got: Vec<String> = text.lines().map(str::to_string).collect();
        got.sort();
        if got == want {
            return Ok(());
        }
        Err(format!(
            "it holds {} lines, expected {}; unexpected: {:?}",
            got.len(),
            want.len(),
            got.iter()
                .filter(|l| !want.contains(l))
                .take(5)
                .collect::<Vec<_>>()
        ))
    })
}

#[test]
fn a_topics_regex_sink_consumes_matching_topics_including_new_ones() {
    let d = dirs();
    let broker = start(&d);
    // Two matching topics and one that does not match, before the connector exists.
    let mut want = values("logs-a", 100);
    want.extend(values("logs-b", 100));
    produce(&broker.bootstrap, "logs-a", &values("logs-a", 100));
    produce(&broker.bootstrap, "logs-b", &values("logs-b", 100));
    produce(&broker.bootstrap, "other", &values("other", 100));
    std::fs::write(
        d.configs.join("logs.toml"),
        format!(
            "name = \"logs-out\"\nconnector.class = \"file-sink\"\nfile = \"{}\"\n\
             topics.regex = \"logs-.*\"\noffset.flush.interval.ms = 100\n",
            d.output.display()
        ),
    )
    .unwrap();
    wait_for_lines(&d.output, &want);

    // A matching topic created while the sink runs is picked up (at its next metadata
    // look), from its first record; the old topics carry on without a repeat.
    produce(&broker.bootstrap, "logs-c", &values("logs-c", 100));
    want.extend(values("logs-c", 100));
    wait_for_lines(&d.output, &want);
    let more: Vec<String> = (100..150).map(|i| format!("logs-a {i}")).collect();
    produce(&broker.bootstrap, "logs-a", &more);
    produce(&broker.bootstrap, "other", &values("other", 10));
    want.extend(more);
    wait_for_lines(&d.output, &want);
    let text = std::fs::read_to_string(&d.output).unwrap();
    assert!(
        !text.contains("other"),
        "a topic that does not match is not consumed"
    );
    broker.stop();
}
