//! Crash consistency with the real binary: kill -9 under acks=all load loses no
//! acknowledged record; a torn tail (a segment cut mid-batch) is truncated at restart with
//! a log line, and the next produce continues at the right offset.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::producer::FutureRecord;
use rdkafka::Offset;

use crate::cluster_fixture::{keyed_value, produce_keyed};
use crate::harness::{BinaryBroker, TestBroker};
use crate::rdkafka_client::{create_topic, high_watermark, producer, read_partition};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_writes_loses_no_acknowledged_record() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BinaryBroker::spawn(dir.path(), 0, &[]);
    create_topic(&broker.bootstrap, "crash", 1, &[]).await;
    let p = producer(
        &broker.bootstrap,
        &[
            ("acks", "all"),
            ("linger.ms", "1"),
            ("message.timeout.ms", "5000"),
        ],
    );
    let acked: Arc<Mutex<Vec<(i64, String)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let acked = acked.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut i = 0u64;
            let mut inflight = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < 2_000_000 {
                let v = format!("record-{i:08}");
                match p.send_result(FutureRecord::to("crash").key("k").payload(&v).partition(0)) {
                    Ok(f) => inflight.push((v, f)),
                    Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                }
                i += 1;
                if inflight.len() >= 500 {
                    for (v, f) in inflight.drain(..) {
                        if let Ok(Ok(d)) = f.await {
                            let offset = d.offset;
                            acked.lock().unwrap().push((offset, v));
                        }
                    }
                }
            }
            for (v, f) in inflight.drain(..) {
                if let Ok(Ok(d)) = f.await {
                    let offset = d.offset;
                    acked.lock().unwrap().push((offset, v));
                }
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked.lock().unwrap().len() < 20_000 {
        assert!(Instant::now() < deadline, "producer too slow");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    broker.kill9();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = tokio::time::timeout(Duration::from_secs(30), writer).await;
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= 20_000);

    let broker = BinaryBroker::spawn(dir.path(), 0, &[]);
    let hw = high_watermark(&broker.bootstrap, "crash", 0);
    let max_acked = acked.iter().map(|a| a.0).max().unwrap();
    assert!(
        hw > max_acked,
        "hw {hw} <= last acknowledged offset {max_acked}"
    );
    let got = read_partition(
        &broker.bootstrap,
        "crash",
        0,
        Offset::Beginning,
        hw as usize,
    );
    assert_eq!(got.len() as i64, hw);
    for (offset, value) in &acked {
        let m = &got[*offset as usize];
        assert_eq!(m.2, *offset);
        assert_eq!(m.1.as_deref(), Some(value.as_bytes()), "offset {offset}");
    }
    // In order: values increase with offsets.
    let values: Vec<&[u8]> = got.iter().map(|m| m.1.as_deref().unwrap()).collect();
    assert!(
        values.windows(2).all(|w| w[0] < w[1]),
        "records out of order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_tail_is_truncated_with_a_log_line_and_offsets_continue() {
    let dir = tempfile::tempdir().unwrap();
    {
        let b = TestBroker::start_in(dir.path(), &[]);
        create_topic(&b.bootstrap, "torn", 1, &[]).await;
        let p = producer(&b.bootstrap, &[("linger.ms", "0")]);
        for i in 0..10 {
            p.send(
                FutureRecord::to("torn")
                    .key("k")
                    .payload(&format!("batch-{i}"))
                    .partition(0),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        }
        b.stop();
    }
    let seg = dir.path().join("torn-0").join("00000000000000000000.log");
    let len = std::fs::metadata(&seg).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.set_len(len - 7).unwrap(); // cut the last batch in the middle
    drop(f);

    let broker = BinaryBroker::spawn(dir.path(), 0, &[]);
    assert_eq!(high_watermark(&broker.bootstrap, "torn", 0), 9);
    let log = broker.stderr_text();
    assert!(
        log.to_lowercase().contains("truncat"),
        "no truncation log line in:\n{log}"
    );
    let p = producer(&broker.bootstrap, &[("linger.ms", "0")]);
    let offset = p
        .send(
            FutureRecord::to("torn").key("k").payload("after"),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(offset.offset, 9);
    let got = read_partition(&broker.bootstrap, "torn", 0, Offset::Beginning, 10);
    let values: Vec<String> = got
        .iter()
        .map(|m| String::from_utf8(m.1.clone().unwrap()).unwrap())
        .collect();
    let mut want: Vec<String> = (0..9).map(|i| format!("batch-{i}")).collect();
    want.push("after".into());
    assert_eq!(values, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_restart_keeps_topics_configs_and_records() {
    let dir = tempfile::tempdir().unwrap();
    let broker = BinaryBroker::spawn(dir.path(), 0, &[]);
    create_topic(
        &broker.bootstrap,
        "kept",
        2,
        &[("retention.ms", "123456789")],
    )
    .await;
    produce_keyed(&broker.bootstrap, "kept", 500, Some(2))
        .await
        .assert_all_acked(500);
    let log = broker.terminate();
    assert!(log.contains("broker stopped"), "no clean stop in:\n{log}");
    let broker = BinaryBroker::spawn(dir.path(), 0, &[]);
    for part in 0..2 {
        let got = read_partition(&broker.bootstrap, "kept", part, Offset::Beginning, 250);
        let want: Vec<String> = (0..500)
            .filter(|i| i % 2 == part)
            .map(|i| keyed_value(i as usize))
            .collect();
        let values: Vec<String> = got
            .iter()
            .map(|m| String::from_utf8(m.1.clone().unwrap()).unwrap())
            .collect();
        assert_eq!(values, want);
    }
    let p = producer(&broker.bootstrap, &[("acks", "all")]);
    let d = p
        .send(
            FutureRecord::to("kept")
                .key("k")
                .payload("next")
                .partition(0),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(d.offset, 250);
}
