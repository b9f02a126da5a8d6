//! Retention: old segments go, the log start offset moves, a consumer at offset 0 gets
//! OFFSET_OUT_OF_RANGE and `auto.offset.reset=earliest` recovers; the active segment is
//! never deleted; when everything expired, new records continue from the log end offset.
//! Compaction (`cleanup.policy=compact`): a consumer from the beginning sees the latest
//! value of each key, at its original offset, plus the untouched active segment; and a
//! long compaction (throttled by `log.cleaner.io.max.bytes.per.second`) does not hold up
//! produce or fetch on its partition.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::{AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};

use crate::harness::{decode, poll_for, wait_until, RawConn, TestBroker};
use crate::rdkafka_client::{admin, create_topic, producer};

fn watermarks(bootstrap: &str, topic: &str) -> (i64, i64) {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    c.fetch_watermarks(topic, 0, Duration::from_secs(10))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn size_retention_moves_the_log_start_and_clients_recover() {
    let b = TestBroker::start_with(&["log.retention.check.interval.ms=100"]);
    create_topic(
        &b.bootstrap,
        "ret",
        1,
        &[("segment.bytes", "2048"), ("retention.bytes", "4096")],
    )
    .await;
    let p = producer(&b.bootstrap, &[("linger.ms", "0")]);
    for i in 0..200 {
        p.send(
            FutureRecord::to("ret")
                .key("k")
                .payload(&format!("{i:05}-{}", "y".repeat(80)))
                .partition(0),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    }
    // Retention runs every 100 ms, also while the records arrive: wait for the state it
    // settles in, not for its first step.
    wait_until("log start offset to pass 100", 30, || {
        watermarks(&b.bootstrap, "ret").0 > 100
    });
    let (start, end) = watermarks(&b.bootstrap, "ret");
    assert_eq!(end, 200);
    assert!(
        start > 100,
        "retention.bytes=4096 keeps only the last segments, start={start}"
    );

    // Raw fetch at 0: OFFSET_OUT_OF_RANGE (1).
    let mut c = RawConn::connect(&b.bootstrap);
    let req = FetchRequest::default()
        .with_max_wait_ms(0)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_replica_id(kafka_protocol::messages::BrokerId(-1))
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_static_str("ret")))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(0)
                .with_partition_max_bytes(1 << 20)])]);
    let resp: FetchResponse = decode(c.request(&req, 11, 1).unwrap(), 11);
    let part = &resp.responses[0].partitions[0];
    assert_eq!(part.error_code, 1);
    assert_eq!(part.log_start_offset, start);

    // A consumer asking for offset 0 with auto.offset.reset=earliest lands at the log start.
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &b.bootstrap)
        .set("group.id", "unused")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("ret", 0, Offset::Offset(0))
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let first = loop {
        assert!(Instant::now() < deadline, "no message after offset reset");
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            break m.offset();
        }
    };
    assert!(first >= start, "first={first} start={start}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_retention_keeps_the_active_segment_and_continues_from_the_end() {
    let b = TestBroker::start_with(&["log.retention.check.interval.ms=100"]);
    create_topic(&b.bootstrap, "old", 1, &[("retention.ms", "1000")]).await;
    let p = producer(&b.bootstrap, &[("linger.ms", "0")]);
    // Records stamped an hour ago: expired at once.
    let ts = weir::replica::now_ms() - 3_600_000;
    for i in 0..20 {
        p.send(
            FutureRecord::to("old")
                .key("k")
                .payload(&format!("{i}"))
                .partition(0)
                .timestamp(ts),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    }
    wait_until("everything to expire", 30, || {
        watermarks(&b.bootstrap, "old").0 == 20
    });
    assert_eq!(watermarks(&b.bootstrap, "old"), (20, 20));
    // The partition still has a segment to write to; offsets continue from 20.
    let offset = p
        .send(
            FutureRecord::to("old").key("k").payload("new").partition(0),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(offset.offset, 20);
}

/// (offset, key, value) of every record from the beginning up to `end` (exclusive), read
/// with librdkafka; `None` if it cannot get there within 10 s.
fn consume_from_beginning(
    bootstrap: &str,
    topic: &str,
    end: i64,
) -> Result<Vec<(i64, String, String)>, String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "compaction-reader")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let text = |b: Option<&[u8]>| String::from_utf8_lossy(b.unwrap_or_default()).into_owned();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    let mut errors = Vec::new();
    while out
        .last()
        .is_none_or(|r: &(i64, String, String)| r.0 < end - 1)
    {
        if Instant::now() > deadline {
            let offsets: Vec<i64> = out.iter().map(|r| r.0).collect();
            return Err(format!("offsets {offsets:?}, consumer errors {errors:?}"));
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => out.push((m.offset(), text(m.key()), text(m.payload()))),
            Some(Err(e)) if errors.len() < 5 => errors.push(e.to_string()),
            _ => {}
        }
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_leaves_the_latest_value_of_each_key() {
    let b = TestBroker::start_with(&["log.retention.check.interval.ms=100"]);
    create_topic(
        &b.bootstrap,
        "compacted",
        1,
        &[
            ("cleanup.policy", "compact"),
            ("segment.bytes", "1024"),
            ("min.cleanable.dirty.ratio", "0.01"),
        ],
    )
    .await;
    let p = producer(&b.bootstrap, &[("linger.ms", "0")]);
    let mut latest: BTreeMap<String, (i64, String)> = BTreeMap::new();
    let mut produced: Vec<(i64, String)> = Vec::new();
    for round in 0..10 {
        for k in 0..10 {
            let key = format!("k{k}");
            let value = format!("{round}-{}", "x".repeat(100));
            let delivered = p
                .send(
                    FutureRecord::to("compacted")
                        .key(&key)
                        .payload(&value)
                        .partition(0),
                    Duration::from_secs(10),
                )
                .await
                .unwrap();
            produced.push((delivered.offset, key.clone()));
            latest.insert(key, (delivered.offset, value));
        }
    }
    let end = 100;
    assert_eq!(watermarks(&b.bootstrap, "compacted"), (0, end));
    let partition_dir = b.data_dir.join("compacted-0");
    let mut seen = Vec::new();
    poll_for("compaction of every closed segment", 30, || {
        let records = consume_from_beginning(&b.bootstrap, "compacted", end).map_err(|read| {
            format!(
                "the consumer did not reach offset {}: read {read:?}",
                end - 1
            )
        })?;
        seen = records;
        // The active segment (the last one, never cleaned) starts at `active_base`. Below
        // it only values that no record below it supersedes are left (the cleaner's
        // offset map covers at least the closed segments, as Kafka's; weir's also the
        // active segment as it was when it ran, which may remove more, never less); from
        // it on, every record, untouched.
        let files = segment_files(&partition_dir);
        let active_base = files
            .iter()
            .filter_map(|(name, _)| name.strip_suffix(".log")?.parse::<i64>().ok())
            .max()
            .unwrap_or(0);
        let latest_below: BTreeMap<&str, i64> = produced
            .iter()
            .filter(|(offset, _)| *offset < active_base)
            .map(|(offset, key)| (key.as_str(), *offset))
            .collect();
        let closed_compacted = seen
            .iter()
            .filter(|(offset, _, _)| *offset < active_base)
            .all(|(offset, key, _)| latest_below.get(key.as_str()) == Some(offset));
        let active: Vec<i64> = seen
            .iter()
            .map(|r| r.0)
            .filter(|offset| *offset >= active_base)
            .collect();
        let active_whole = active == (active_base..end).collect::<Vec<i64>>();
        if active_base > 0 && closed_compacted && active_whole {
            Ok(())
        } else {
            let offsets: Vec<i64> = seen.iter().map(|r| r.0).collect();
            Err(format!(
                "offsets read {offsets:?}; active segment from {active_base}; files {files:?}"
            ))
        }
    });
    assert!(
        seen.windows(2).all(|w| w[0].0 < w[1].0),
        "offsets increase: {seen:?}"
    );
    assert!(
        seen.len() < 20,
        "superseded values are gone: {} records",
        seen.len()
    );
    for (key, (offset, value)) in &latest {
        assert!(
            seen.contains(&(*offset, key.clone(), value.clone())),
            "latest value of {key} at {offset} is readable"
        );
    }
    // Compaction never moves the log start or the log end.
    assert_eq!(watermarks(&b.bootstrap, "compacted"), (0, end));
}

/// The partition directory's files with their sizes in bytes, by name.
fn segment_files(partition_dir: &std::path::Path) -> Vec<(String, u64)> {
    let mut files: Vec<(String, u64)> = std::fs::read_dir(partition_dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| {
                    let size = e.metadata().map_or(0, |m| m.len());
                    (e.file_name().to_string_lossy().into_owned(), size)
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// Names of the cleaner's files (`*.cleaned`: its copies while a compaction is being
/// prepared, until the swap) in a partition directory.
fn cleaner_files(partition_dir: &std::path::Path) -> Vec<String> {
    segment_files(partition_dir)
        .into_iter()
        .map(|(name, _)| name)
        .filter(|n| n.ends_with(".cleaned"))
        .collect()
}

/// Issue 11: compaction prepares its copies with no partition lock, so a fetch during a
/// long compaction is answered within its `fetch.wait.max.ms` and a produce is
/// acknowledged at once. The cleaner is throttled so the compaction takes seconds; it is
/// seen running by its `.cleaned` files, which exist from the start of its cleaning pass
/// to its swap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_and_fetch_are_served_during_a_long_compaction() {
    const TOPIC: &str = "slowclean";
    const KEYS: usize = 40;
    const ROUNDS: usize = 30;
    const FETCH_WAIT_MAX_MS: u64 = 500;
    // ~140 KB of records; the prepare step reads them twice (offset map, then cleaning),
    // so at 30 KB/s it takes ~9 s, ~4.5 s of them with the copies on disk.
    let b = TestBroker::start_with(&[
        "log.retention.check.interval.ms=100",
        "log.cleaner.io.max.bytes.per.second=30000",
    ]);
    // Written with cleanup.policy=delete, so the first compaction (after the switch below)
    // covers every record at once.
    create_topic(&b.bootstrap, TOPIC, 1, &[("segment.bytes", "16384")]).await;
    // Small batches, so the log rolls into many closed segments whatever the timing (a
    // segment rolls only between batches; one big batch would leave nothing to clean).
    let p = producer(&b.bootstrap, &[("linger.ms", "5"), ("batch.size", "4096")]);
    let mut pending = Vec::new();
    let mut written = Vec::new();
    for round in 0..ROUNDS {
        for k in 0..KEYS {
            let (key, value) = (format!("k{k}"), format!("{round}-{}", "x".repeat(100)));
            pending.push(
                p.send_result(
                    FutureRecord::to(TOPIC)
                        .key(&key)
                        .payload(&value)
                        .partition(0),
                )
                .unwrap(),
            );
            written.push((key, value));
        }
    }
    let mut latest: BTreeMap<String, (i64, String)> = BTreeMap::new();
    let mut by_offset: BTreeMap<i64, (String, String)> = BTreeMap::new();
    for (future, (key, value)) in pending.into_iter().zip(written) {
        let offset = future.await.unwrap().unwrap().offset;
        latest.insert(key.clone(), (offset, value.clone()));
        by_offset.insert(offset, (key, value));
    }
    let end = (KEYS * ROUNDS) as i64;
    assert_eq!(watermarks(&b.bootstrap, TOPIC), (0, end));

    // A consumer waiting at the end with long polls of FETCH_WAIT_MAX_MS.
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &b.bootstrap)
        .set("group.id", "slowclean-tail")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", FETCH_WAIT_MAX_MS.to_string())
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, 0, Offset::Offset(end))
        .unwrap();
    consumer.assign(&tpl).unwrap();
    // Nothing to read yet; this gets its fetch loop going.
    assert!(consumer
        .poll(Duration::from_millis(300))
        .is_none_or(|m| m.is_err()));

    let mut alter = AlterConfig::new(ResourceSpecifier::Topic(TOPIC));
    for (k, v) in [
        ("cleanup.policy", "compact"),
        ("segment.bytes", "16384"),
        ("min.cleanable.dirty.ratio", "0.01"),
    ] {
        alter = alter.set(k, v);
    }
    let altered = admin(&b.bootstrap)
        .alter_configs(&[alter], &AdminOptions::new())
        .await
        .unwrap();
    assert!(altered[0].is_ok(), "{altered:?}");
    let partition_dir = b.data_dir.join(format!("{TOPIC}-0"));
    wait_until("the compaction's cleaning pass to start", 30, || {
        !cleaner_files(&partition_dir).is_empty()
    });

    // While it runs: a produce is acknowledged and the waiting consumer gets the record.
    let started = Instant::now();
    let delivered = p
        .send(
            FutureRecord::to(TOPIC)
                .key("during")
                .payload("compaction")
                .partition(0),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    let acked_after = started.elapsed();
    assert_eq!(delivered.offset, end);
    let acked = Instant::now();
    let received = loop {
        match consumer.poll(Duration::from_millis(100)) {
            Some(m) => break m.unwrap(),
            None => assert!(
                acked.elapsed() < Duration::from_secs(10),
                "no record within 10 s"
            ),
        }
    };
    let received_after = acked.elapsed();
    assert_eq!(
        (received.offset(), received.key()),
        (end, Some(&b"during"[..]))
    );
    assert!(
        !cleaner_files(&partition_dir).is_empty(),
        "the compaction was still running when both were answered"
    );
    assert!(
        acked_after < Duration::from_millis(1500),
        "produce during compaction acknowledged after {acked_after:?}"
    );
    assert!(
        received_after < Duration::from_millis(FETCH_WAIT_MAX_MS + 1000),
        "fetch during compaction answered after {received_after:?} (fetch.wait.max.ms {FETCH_WAIT_MAX_MS})"
    );
    latest.insert("during".into(), (end, "compaction".into()));
    by_offset.insert(end, ("during".into(), "compaction".into()));

    // Afterwards: the last value of each key, at its offset; old values gone.
    wait_until("the compaction to finish", 30, || {
        cleaner_files(&partition_dir).is_empty()
    });
    let seen = consume_from_beginning(&b.bootstrap, TOPIC, end + 1).expect("read the log");
    assert!(
        seen.windows(2).all(|w| w[0].0 < w[1].0),
        "offsets increase: {seen:?}"
    );
    for (key, (offset, value)) in &latest {
        assert!(
            seen.contains(&(*offset, key.clone(), value.clone())),
            "latest value of {key} at {offset} is readable"
        );
    }
    // Every key's last value is in the active segment (16 KiB), which compaction leaves
    // as it is: what remains is about that segment.
    assert!(
        seen.len() < (end as usize) / 4,
        "superseded values are gone: {} records",
        seen.len()
    );
    for (offset, key, value) in &seen {
        assert_eq!(
            by_offset.get(offset),
            Some(&(key.clone(), value.clone())),
            "record at {offset} is the one written there"
        );
    }
    assert_eq!(watermarks(&b.bootstrap, TOPIC), (0, end + 1));
}
