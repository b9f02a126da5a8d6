//! WebAssembly plugins (`weir::plugin`) with the real components from `plugins/`: the
//! murmur2 partitioner against Kafka's Java test vectors and librdkafka's
//! `murmur2_random`; json-field, filter, route and redact on records a real client
//! produced and read back; hostile fixtures (infinite loop, allocation bomb, panic, wrong
//! world, not wasm, file/socket/environment escape, an import weir withholds, a future
//! major version of weir's package); the on-disk cache; `weir produce --partitioner` end
//! to end.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::producer::FutureRecord;
use rdkafka::Offset;
use weir::plugin::{
    BatchContext, OutputBatch, PluginError, PluginHost, PluginHostConfig, PluginLimits, Record,
};

use crate::guests::guest;
use crate::harness::TestBroker;
use crate::rdkafka_client::{create_topic, producer, read_partition};

fn host() -> PluginHost {
    PluginHost::new(PluginHostConfig::default()).expect("plugin host")
}

/// A host whose calls time out after 200 ms and whose guests get 32 MiB.
fn strict_host() -> PluginHost {
    host_with_timeout(200)
}

/// A host with the strict memory limit (32 MiB) and `call_timeout_ms` per call.
fn host_with_timeout(call_timeout_ms: u64) -> PluginHost {
    PluginHost::new(PluginHostConfig {
        cache_dir: None,
        limits: PluginLimits {
            memory_bytes: 32 << 20,
            call_timeout_ms,
        },
        metrics: None,
    })
    .expect("plugin host")
}

fn record(value: &[u8]) -> Record {
    Record {
        key: None,
        value: Some(Bytes::copy_from_slice(value)),
        headers: Vec::new(),
        timestamp_ms: 1,
    }
}

fn context() -> BatchContext {
    BatchContext {
        topic: "in".into(),
        partition: 0,
        base_offset: 0,
    }
}

fn values(out: &OutputBatch) -> Vec<&[u8]> {
    out.iter().map(|o| o.value.unwrap_or_default()).collect()
}

/// Kafka's `UtilsTest.testMurmur2` vectors (murmur2 as a signed Java int).
const JAVA_MURMUR2: [(&[u8], i32); 6] = [
    (b"21", -973_932_308),
    (b"foobar", -790_332_482),
    (b"a-little-bit-long-string", -985_981_536),
    (b"a-little-bit-longer-string", -1_486_304_829),
    (
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
        -58_897_971,
    ),
    (b"abc", 479_470_107),
];

#[tokio::test]
async fn murmur2_component_matches_the_java_client_vectors() {
    let mut p = host()
        .load_partitioner(&guest("murmur2"))
        .await
        .expect("load murmur2");
    for (key, hash) in JAVA_MURMUR2 {
        let positive = (hash as u32) & 0x7fff_ffff;
        // With u32::MAX partitions the answer is the masked hash itself, all 31 bits.
        assert_eq!(
            p.partition(Some(key), None, u32::MAX)
                .await
                .expect("partition"),
            positive,
            "key {:?}",
            String::from_utf8_lossy(key)
        );
        for n in [1, 2, 3, 12, 100, 1000] {
            assert_eq!(
                p.partition(Some(key), None, n).await.expect("partition"),
                positive % n
            );
        }
    }
}

#[tokio::test]
async fn murmur2_component_spreads_keyless_records() {
    let mut p = host()
        .load_partitioner(&guest("murmur2"))
        .await
        .expect("load murmur2");
    let mut seen = [0u32; 4];
    for _ in 0..40 {
        let n = p.partition(None, Some(b"v"), 4).await.expect("partition");
        seen[n as usize] += 1;
    }
    assert!(
        seen.iter().all(|&c| c > 0),
        "keyless records not spread: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn murmur2_component_agrees_with_librdkafka_murmur2_random_on_10000_keys() {
    const PARTITIONS: i32 = 7;
    const KEYS: usize = 10_000;
    let broker = TestBroker::start();
    create_topic(&broker.bootstrap, "m2", PARTITIONS, &[]).await;
    let prod = producer(&broker.bootstrap, &[("partitioner", "murmur2_random")]);
    let keys: Vec<String> = (0..KEYS).map(|i| format!("key-{i}-{}", i * 7919)).collect();
    let mut pending = Vec::with_capacity(KEYS);
    for k in &keys {
        let rec: FutureRecord<'_, str, str> = FutureRecord::to("m2").key(k.as_str()).payload("v");
        match prod.send_result(rec) {
            Ok(f) => pending.push(f),
            Err((e, _)) => panic!("enqueue: {e}"),
        }
    }
    let mut p = host()
        .load_partitioner(&guest("murmur2"))
        .await
        .expect("load murmur2");
    let mut per_partition = [0usize; PARTITIONS as usize];
    for (k, f) in keys.iter().zip(pending) {
        let partition = f
            .await
            .expect("not cancelled")
            .expect("delivered")
            .partition;
        let mine = p
            .partition(Some(k.as_bytes()), Some(b"v"), PARTITIONS as u32)
            .await
            .expect("partition");
        assert_eq!(mine as i32, partition, "key {k}");
        per_partition[partition as usize] += 1;
    }
    assert!(per_partition.iter().all(|&c| c > 1000), "{per_partition:?}");
    broker.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redact_masks_fields_of_records_a_real_client_produced() {
    let broker = TestBroker::start();
    create_topic(&broker.bootstrap, "people", 1, &[]).await;
    let prod = producer(&broker.bootstrap, &[]);
    let docs = [
        r#"{"name":"ada","ssn":"123-45-6789","card":{"number":"4111","exp":"12/30"}}"#,
        r#"{"name":"bob","note":"no secrets"}"#,
        r#"{"list":[{"ssn":1},{"ssn":[2,3]}]}"#,
    ];
    for (i, d) in docs.iter().enumerate() {
        let key = format!("k{i}");
        let rec: FutureRecord<'_, str, str> =
            FutureRecord::to("people").key(key.as_str()).payload(*d);
        prod.send(rec, Duration::from_secs(10))
            .await
            .expect("delivered");
    }
    let read = read_partition(
        &broker.bootstrap,
        "people",
        0,
        Offset::Beginning,
        docs.len(),
    );
    let batch: Vec<Record> = read
        .iter()
        .map(|(k, v, _, _)| Record {
            key: k.clone().map(Bytes::from),
            value: v.clone().map(Bytes::from),
            headers: Vec::new(),
            timestamp_ms: 0,
        })
        .collect();
    let mut t = host()
        .load_transform(&guest("redact"), &[("fields".into(), "ssn, number".into())])
        .await
        .expect("load redact");
    let out = t.apply(&context(), &batch).await.expect("apply");
    assert_eq!(
        values(&out),
        vec![
            &br#"{"name":"ada","ssn":"***","card":{"number":"***","exp":"12/30"}}"#[..],
            &br#"{"name":"bob","note":"no secrets"}"#[..],
            &br#"{"list":[{"ssn":"***"},{"ssn":"***"}]}"#[..],
        ]
    );
    for (i, o) in out.iter().enumerate() {
        assert_eq!(o.input_index as usize, i);
        assert_eq!(o.topic, None);
        assert_eq!(o.key, Some(format!("k{i}").as_bytes()));
    }
    // A value it cannot scan fails the batch naming the record.
    let bad = vec![record(br#"{"a":1}"#), record(br#"{"ssn":"unterminated"#)];
    match t.apply(&context(), &bad).await {
        Err(PluginError::Failed { record_index, .. }) => assert_eq!(record_index, Some(1)),
        other => panic!("expected a failure on record 1, got {other:?}"),
    }
    broker.stop();
}

#[tokio::test]
async fn redact_without_fields_is_refused_at_load() {
    match host().load_transform(&guest("redact"), &[]).await {
        Err(e @ PluginError::Open { .. }) => assert!(e.to_string().contains("fields"), "{e}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("redact loaded without `fields`"),
    }
}

#[tokio::test]
async fn an_infinite_loop_times_out_and_the_next_call_works() {
    let mut t = strict_host()
        .load_transform(&guest("hostile"), &[])
        .await
        .expect("load hostile");
    let started = Instant::now();
    match t.apply(&context(), &[record(b"ok"), record(b"spin")]).await {
        Err(e @ PluginError::Timeout { .. }) => {
            eprintln!("{e}");
            assert!(e.to_string().contains("200 ms"), "{e}")
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "stopped after {took:?}");
    let out = t
        .apply(&context(), &[record(b"after")])
        .await
        .expect("next call");
    assert_eq!(values(&out), vec![&b"after"[..]]);

    let mut p = strict_host()
        .load_partitioner(&guest("bad-partitioner"))
        .await
        .expect("load bad-partitioner");
    assert!(matches!(
        p.partition(Some(b"spin"), None, 3).await,
        Err(PluginError::Timeout { .. })
    ));
    assert_eq!(
        p.partition(Some(b"x"), None, 3).await.expect("next call"),
        0
    );
}

/// The epoch ticker parks when no call deadline is ahead; a call armed after such an
/// idle spell wakes it, so a spinning guest is still stopped at its deadline, and a
/// guest that returns is not disturbed.
#[tokio::test]
async fn an_infinite_loop_after_an_idle_spell_still_times_out() {
    let mut t = host_with_timeout(100)
        .load_transform(&guest("hostile"), &[])
        .await
        .expect("load hostile");
    // Longer than the load's deadline: with no other call in flight the ticker parks.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    match t.apply(&context(), &[record(b"spin")]).await {
        Err(e @ PluginError::Timeout { .. }) => assert!(e.to_string().contains("100 ms"), "{e}"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "stopped after {took:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let out = t
        .apply(&context(), &[record(b"after")])
        .await
        .expect("a call after another idle spell");
    assert_eq!(values(&out), vec![&b"after"[..]]);
}

#[tokio::test]
async fn an_allocation_bomb_hits_the_memory_limit_and_the_next_call_works() {
    // The deadline is far from the memory limit's reach: on a loaded 2-core machine
    // growing 32 MiB took over 200 ms, and this test is about memory, not time.
    let mut t = host_with_timeout(10_000)
        .load_transform(&guest("hostile"), &[])
        .await
        .expect("load hostile");
    match t.apply(&context(), &[record(b"bomb")]).await {
        Err(
            e @ PluginError::MemoryLimit {
                limit_bytes,
                requested_bytes,
                ..
            },
        ) => {
            eprintln!("{e}");
            assert_eq!(limit_bytes, 32 << 20);
            assert!(requested_bytes > limit_bytes);
        }
        other => panic!("expected the memory limit, got {other:?}"),
    }
    let out = t
        .apply(&context(), &[record(b"fine")])
        .await
        .expect("next call");
    assert_eq!(values(&out), vec![&b"fine"[..]]);
}

#[tokio::test]
async fn a_guest_panic_fails_that_call_only() {
    let mut t = host()
        .load_transform(&guest("hostile"), &[])
        .await
        .expect("load hostile");
    match t.apply(&context(), &[record(b"a"), record(b"panic")]).await {
        Err(e @ PluginError::Trap { .. }) => {
            let msg = e.to_string();
            eprintln!("{msg}");
            assert!(msg.contains("hostile.wasm"), "{msg}");
            assert!(msg.contains("asked to panic on record 1"), "{msg}");
        }
        other => panic!("expected a trap, got {other:?}"),
    }
    // Guest stdout/stderr are logged, not inherited; the record passes.
    let out = t
        .apply(&context(), &[record(b"print"), record(b"b")])
        .await
        .expect("next call");
    assert_eq!(values(&out), vec![&b"print"[..], &b"b"[..]]);
}

#[tokio::test]
async fn a_partition_out_of_range_is_an_error() {
    let mut p = host()
        .load_partitioner(&guest("bad-partitioner"))
        .await
        .expect("load bad-partitioner");
    match p.partition(Some(b"oob"), None, 3).await {
        Err(e @ PluginError::BadOutput { .. }) => {
            assert!(
                e.to_string().contains("partition 3 for a topic of 3"),
                "{e}"
            )
        }
        other => panic!("expected a bad output, got {other:?}"),
    }
    assert!(matches!(
        p.partition(Some(b"k"), None, 0).await,
        Err(PluginError::InvalidCall { .. })
    ));
}

#[tokio::test]
async fn files_that_are_not_weir_components_are_refused_at_load() {
    let h = host();
    let dir = tempfile::tempdir().expect("temp dir");

    let text = dir.path().join("notes.wasm");
    std::fs::write(&text, b"hello, not wasm").expect("write");
    match h.load_partitioner(&text).await {
        Err(e @ PluginError::NotWasm { .. }) => {
            eprintln!("{e}");
            assert!(e.to_string().contains("notes.wasm"))
        }
        other => panic!("expected NotWasm, got {:?}", other.err()),
    }

    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").expect("write");
    assert!(matches!(
        h.load_transform(&core, &[]).await,
        Err(PluginError::NotComponent { .. })
    ));

    let missing = dir.path().join("missing.wasm");
    assert!(matches!(
        h.load_partitioner(&missing).await,
        Err(PluginError::Read { .. })
    ));

    // A component of the other world: the error names the missing export.
    match h.load_transform(&guest("murmur2"), &[]).await {
        Err(e @ PluginError::WrongWorld { .. }) => {
            let msg = e.to_string();
            eprintln!("{msg}");
            assert!(msg.contains("weir:plugin/transformer@0.1.0"), "{msg}");
        }
        other => panic!("expected WrongWorld, got {:?}", other.err()),
    }
    match h.load_partitioner(&guest("redact")).await {
        Err(e @ PluginError::WrongWorld { .. }) => {
            let msg = e.to_string();
            eprintln!("{msg}");
            assert!(msg.contains("weir:plugin/partition@0.1.0"), "{msg}");
        }
        other => panic!("expected WrongWorld, got {:?}", other.err()),
    }
}

#[tokio::test]
async fn compiled_components_are_cached_on_disk() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = PluginHostConfig {
        cache_dir: Some(dir.path().to_path_buf()),
        limits: PluginLimits::default(),
        metrics: None,
    };
    let first = PluginHost::new(config.clone()).expect("host");
    let started = Instant::now();
    first
        .load_partitioner(&guest("murmur2"))
        .await
        .expect("load");
    let compile = started.elapsed();
    let cached: Vec<_> = std::fs::read_dir(dir.path())
        .expect("read cache dir")
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
        .collect();
    assert_eq!(cached.len(), 1, "one compiled component on disk");

    let second = PluginHost::new(config).expect("host");
    let started = Instant::now();
    let mut p = second
        .load_partitioner(&guest("murmur2"))
        .await
        .expect("load from cache");
    let load = started.elapsed();
    assert_eq!(
        p.partition(Some(b"21"), None, 1000)
            .await
            .expect("partition"),
        (-973_932_308i32 as u32 & 0x7fff_ffff) % 1000
    );
    eprintln!("compile {compile:?}, load from disk cache {load:?}");

    // A corrupt cache entry is recompiled, not trusted.
    std::fs::write(cached[0].path(), b"garbage").expect("corrupt");
    let third = PluginHost::new(PluginHostConfig {
        cache_dir: Some(dir.path().to_path_buf()),
        limits: PluginLimits::default(),
        metrics: None,
    })
    .expect("host");
    third
        .load_partitioner(&guest("murmur2"))
        .await
        .expect("recompiled");
}

#[test]
fn weir_produce_with_a_partitioner_component_puts_records_where_it_chooses() {
    const PARTITIONS: i32 = 5;
    let broker = TestBroker::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(create_topic(&broker.bootstrap, "routed", PARTITIONS, &[]));
    let murmur2 = guest("murmur2");
    let lines: String = (0..200).map(|i| format!("user-{i}:event {i}\n")).collect();
    let out = run_weir(
        &broker.bootstrap,
        &murmur2,
        &["produce", "routed", "--key-separator", ":", "--partitioner"],
        lines.as_bytes(),
    );
    assert!(
        out.status.success(),
        "weir produce failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Where the component puts each key.
    let mut expected: HashMap<i32, Vec<String>> = HashMap::new();
    rt.block_on(async {
        let mut p = host().load_partitioner(&murmur2).await.expect("load");
        for i in 0..200 {
            let key = format!("user-{i}");
            let n = p
                .partition(Some(key.as_bytes()), None, PARTITIONS as u32)
                .await
                .expect("partition");
            expected.entry(n as i32).or_default().push(key);
        }
    });
    assert!(expected.len() > 1, "keys all on one partition");
    for partition in 0..PARTITIONS {
        let want = expected.remove(&partition).unwrap_or_default();
        let got = read_partition(
            &broker.bootstrap,
            "routed",
            partition,
            Offset::Beginning,
            want.len(),
        );
        let got_keys: Vec<String> = got
            .iter()
            .map(|(k, _, _, _)| {
                String::from_utf8_lossy(k.as_deref().unwrap_or_default()).into_owned()
            })
            .collect();
        assert_eq!(got_keys, want, "partition {partition}");
    }
    broker.stop();
}

/// Runs `weir ARGS FILE -b BOOTSTRAP` with `stdin`, under a deadline.
fn run_weir(bootstrap: &str, file: &Path, args: &[&str], stdin: &[u8]) -> std::process::Output {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("timeout")
        .arg("60")
        .arg(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .arg(file)
        .args(["-b", bootstrap])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn weir");
    let mut child_stdin = child.stdin.take().expect("stdin");
    child_stdin.write_all(stdin).expect("write stdin");
    drop(child_stdin);
    child.wait_with_output().expect("wait for weir")
}

/// A record for [`produce_and_read_back`]: key, value, headers.
type Sent<'a> = (Option<&'a str>, &'a str, &'a [(&'a str, &'a str)]);

/// Produces `records` with rdkafka to partition 0 of a new one-partition `topic`, reads
/// them back with an rdkafka consumer and returns them as a transform's input batch.
async fn produce_and_read_back(bootstrap: &str, topic: &str, records: &[Sent<'_>]) -> Vec<Record> {
    use rdkafka::message::{Header as KafkaHeader, OwnedHeaders};
    create_topic(bootstrap, topic, 1, &[]).await;
    let prod = producer(bootstrap, &[]);
    for (key, value, headers) in records {
        let mut hs = OwnedHeaders::new();
        for (k, v) in headers.iter() {
            hs = hs.insert(KafkaHeader {
                key: k,
                value: Some(*v),
            });
        }
        let mut rec: FutureRecord<'_, str, str> =
            FutureRecord::to(topic).payload(*value).headers(hs);
        if let Some(k) = key {
            rec = rec.key(*k);
        }
        prod.send(rec, Duration::from_secs(10))
            .await
            .expect("delivered");
    }
    let read = read_partition(bootstrap, topic, 0, Offset::Beginning, records.len());
    assert_eq!(read.len(), records.len(), "read back what was produced");
    read.into_iter()
        .map(|(k, v, _, hs)| Record {
            key: k.map(Bytes::from),
            value: v.map(Bytes::from),
            headers: hs
                .into_iter()
                .map(|(key, value)| weir::plugin::Header {
                    key,
                    value: Some(Bytes::from(value)),
                })
                .collect(),
            timestamp_ms: 0,
        })
        .collect()
}

fn config(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_field_partitions_real_records_by_the_field_like_murmur2_on_its_text() {
    const PARTITIONS: u32 = 12;
    let broker = TestBroker::start();
    let sent: [Sent<'_>; 7] = [
        (Some("k1"), r#"{"user":{"id":"u-17"},"event":"click"}"#, &[]),
        (Some("k2"), r#"{"user":{"id":"u-17"},"event":"buy"}"#, &[]),
        (None, r#"{"event":"view","user":{"id":"u-17"}}"#, &[]),
        (Some("k4"), r#"{"user":{"id":42}}"#, &[]),
        // Fallbacks: no field, JSON null, not JSON -> murmur2 of the key.
        (Some("k5"), r#"{"event":"anonymous"}"#, &[]),
        (Some("k6"), r#"{"user":{"id":null}}"#, &[]),
        (Some("k7"), "plain text", &[]),
    ];
    let batch = produce_and_read_back(&broker.bootstrap, "clicks", &sent).await;
    let h = host();
    let mut by_field = h
        .load_partitioner_with(&guest("json-field"), &config(&[("field", "user.id")]))
        .await
        .expect("load json-field");
    let mut murmur2 = h
        .load_partitioner(&guest("murmur2"))
        .await
        .expect("load murmur2");
    let mut got = Vec::new();
    for r in &batch {
        got.push(
            by_field
                .partition(r.key.as_deref(), r.value.as_deref(), PARTITIONS)
                .await
                .expect("partition"),
        );
    }
    // What murmur2 gives a record keyed with the field's text, or with its own key.
    let mut want = Vec::new();
    for key in ["u-17", "u-17", "u-17", "42", "k5", "k6", "k7"] {
        want.push(
            murmur2
                .partition(Some(key.as_bytes()), None, PARTITIONS)
                .await
                .expect("partition"),
        );
    }
    assert_eq!(got, want);

    // Keyless and fieldless: spread, not refused.
    let mut seen = std::collections::HashSet::new();
    for _ in 0..PARTITIONS {
        seen.insert(
            by_field
                .partition(None, Some(b"{}"), PARTITIONS)
                .await
                .expect("partition"),
        );
    }
    assert_eq!(
        seen.len(),
        PARTITIONS as usize,
        "keyless records not spread"
    );

    match h.load_partitioner_with(&guest("json-field"), &[]).await {
        Err(e @ PluginError::Open { .. }) => {
            assert!(e.to_string().contains("config `field` is required"), "{e}")
        }
        other => panic!("json-field loaded without `field`: {:?}", other.err()),
    }
    broker.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_keeps_real_records_matching_a_field_or_header_predicate() {
    let broker = TestBroker::start();
    let sent: [Sent<'_>; 6] = [
        (
            Some("a"),
            r#"{"status":"ok","order":{"total":12.5}}"#,
            &[("tenant", "acme")],
        ),
        (Some("b"), r#"{"status":"failed"}"#, &[("tenant", "globex")]),
        (Some("c"), r#"{"order":{"total":3}}"#, &[]),
        (Some("d"), "not json", &[("tenant", "acme")]),
        (
            Some("e"),
            r#"{"status":"ok-retried"}"#,
            &[("tenant", "acme-eu")],
        ),
        (Some("f"), r#"{"status":null}"#, &[]),
    ];
    let batch = produce_and_read_back(&broker.bootstrap, "orders", &sent).await;
    let h = host();
    let kept = |out: &OutputBatch| -> Vec<String> {
        out.iter()
            .map(|o| String::from_utf8_lossy(o.key.unwrap_or_default()).into_owned())
            .collect()
    };
    for (cfg, want) in [
        (&[("field", "status"), ("equals", "ok")][..], &["a"][..]),
        (
            &[("field", "status"), ("not.equals", "ok")],
            &["b", "c", "e", "f"],
        ),
        (&[("field", "status"), ("matches", "ok.*")], &["a", "e"]),
        (&[("field", "order.total"), ("exists", "true")], &["a", "c"]),
        (
            &[
                ("field", "status"),
                ("exists", "false"),
                ("on.invalid", "keep"),
            ],
            &["c", "d", "f"],
        ),
        (
            &[("header", "tenant"), ("matches", "acme(-.*)?")],
            &["a", "d", "e"],
        ),
        (&[("header", "tenant"), ("exists", "false")], &["c", "f"]),
    ] {
        let mut t = h
            .load_transform(&guest("filter"), &config(cfg))
            .await
            .unwrap_or_else(|e| panic!("load filter {cfg:?}: {e}"));
        let out = t.apply(&context(), &batch).await.expect("apply");
        assert_eq!(kept(&out), want, "{cfg:?}");
        // Kept records pass unchanged, headers included.
        for o in out.iter() {
            let input = &batch[o.input_index as usize];
            assert_eq!(o.topic, None);
            assert_eq!(o.value, input.value.as_deref());
            assert_eq!(o.headers().len(), input.headers.len());
        }
    }

    // on.invalid=fail names the record.
    let mut t = h
        .load_transform(
            &guest("filter"),
            &config(&[
                ("field", "status"),
                ("equals", "ok"),
                ("on.invalid", "fail"),
            ]),
        )
        .await
        .expect("load filter");
    match t.apply(&context(), &batch).await {
        Err(e @ PluginError::Failed { record_index, .. }) => {
            eprintln!("{e}");
            assert_eq!(record_index, Some(3));
            assert!(e.to_string().contains("not JSON"), "{e}");
        }
        other => panic!("expected a failure on record 3, got {other:?}"),
    }

    // Bad config is refused at load, saying what is wrong.
    for (cfg, says) in [
        (&[("field", "status")][..], "exactly one predicate"),
        (&[("field", "a"), ("matches", "(")], "bad regex `(`"),
        (&[("equals", "x")], "exactly one of `field`"),
    ] {
        match h.load_transform(&guest("filter"), &config(cfg)).await {
            Err(e @ PluginError::Open { .. }) => {
                assert!(e.to_string().contains(says), "{cfg:?}: {e}")
            }
            other => panic!("filter loaded with {cfg:?}: {:?}", other.err()),
        }
    }
    broker.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_sends_real_records_to_topics_named_by_a_field_and_a_client_reads_them() {
    let broker = TestBroker::start();
    let sent: [Sent<'_>; 5] = [
        (Some("1"), r#"{"region":"eu","n":1}"#, &[]),
        (Some("2"), r#"{"region":"us","n":2}"#, &[]),
        (Some("3"), r#"{"n":3}"#, &[]),
        (Some("4"), r#"{"region":"eu","n":4}"#, &[("trace", "t4")]),
        (Some("5"), "not json", &[]),
    ];
    let batch = produce_and_read_back(&broker.bootstrap, "orders-in", &sent).await;
    let mut t = host()
        .load_transform(
            &guest("route"),
            &config(&[
                ("field", "region"),
                ("topic.format", "orders-${value}"),
                ("default.topic", "orders-unrouted"),
            ]),
        )
        .await
        .expect("load route");
    let out = t.apply(&context(), &batch).await.expect("apply");
    let topics: Vec<&str> = out.iter().map(|o| o.topic.unwrap_or("-")).collect();
    assert_eq!(
        topics,
        [
            "orders-eu",
            "orders-us",
            "orders-unrouted",
            "orders-eu",
            "orders-unrouted"
        ]
    );

    // Write each output where the plugin sent it; a real consumer reads them back.
    for topic in ["orders-eu", "orders-us", "orders-unrouted"] {
        create_topic(&broker.bootstrap, topic, 1, &[]).await;
    }
    let prod = producer(&broker.bootstrap, &[]);
    for o in out.iter() {
        let topic = o.topic.expect("routed");
        let rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic)
            .key(o.key.unwrap_or_default())
            .payload(o.value.unwrap_or_default());
        prod.send(rec, Duration::from_secs(10))
            .await
            .expect("delivered");
    }
    for (topic, keys) in [
        ("orders-eu", &["1", "4"][..]),
        ("orders-us", &["2"]),
        ("orders-unrouted", &["3", "5"]),
    ] {
        let got = read_partition(&broker.bootstrap, topic, 0, Offset::Beginning, keys.len());
        let got_keys: Vec<String> = got
            .iter()
            .map(|(k, _, _, _)| String::from_utf8_lossy(k.as_deref().unwrap_or_default()).into())
            .collect();
        assert_eq!(got_keys, keys, "{topic}");
    }

    // A value that cannot name a topic fails the batch, naming the record.
    let bad = vec![
        record(br#"{"region":"eu"}"#),
        record(br#"{"region":"eu/west"}"#),
    ];
    match t.apply(&context(), &bad).await {
        Err(e @ PluginError::Failed { record_index, .. }) => {
            eprintln!("{e}");
            assert_eq!(record_index, Some(1));
            assert!(
                e.to_string()
                    .contains("`orders-eu/west` is not a legal Kafka topic name"),
                "{e}"
            );
        }
        other => panic!("expected a failure on record 1, got {other:?}"),
    }
    // Records without the field go to the transform's default output without
    // `default.topic`; a header can name the topic too.
    let mut by_header = host()
        .load_transform(&guest("route"), &config(&[("header", "trace")]))
        .await
        .expect("load route");
    let out = by_header.apply(&context(), &batch).await.expect("apply");
    let topics: Vec<Option<&str>> = out.iter().map(|o| o.topic).collect();
    assert_eq!(topics, [None, None, None, Some("t4"), None]);
    broker.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redact_masks_pattern_matches_in_real_records() {
    let broker = TestBroker::start();
    let sent: [Sent<'_>; 4] = [
        (
            Some("1"),
            r#"{"name":"ada","note":"card 4111-1111-1111-1111 exp 12/30","ssn":"123-45-6789"}"#,
            &[],
        ),
        (
            Some("2"),
            r#"{"contact":"mail ada@example.org","phone":33612345678}"#,
            &[],
        ),
        (
            Some("3"),
            "raw log: user bob@example.org paid with 4111111111111111",
            &[],
        ),
        (Some("4"), r#"{"clean":"nothing to see"}"#, &[]),
    ];
    let batch = produce_and_read_back(&broker.bootstrap, "pii", &sent).await;
    let mut t = host()
        .load_transform(
            &guest("redact"),
            &config(&[
                ("fields", "ssn"),
                (
                    "patterns",
                    r"\d{4}-?\d{4}-?\d{4}-?\d{4}, [\w.+-]+@[\w-]+\.[\w.]+, \d{11}",
                ),
                ("mask", "[redacted]"),
            ]),
        )
        .await
        .expect("load redact");
    let out = t.apply(&context(), &batch).await.expect("apply");
    assert_eq!(
        values(&out),
        vec![
            &br#"{"name":"ada","note":"card [redacted] exp 12/30","ssn":"[redacted]"}"#[..],
            &br#"{"contact":"mail [redacted]","phone":"[redacted]"}"#[..],
            &b"raw log: user [redacted] paid with [redacted]"[..],
            &br#"{"clean":"nothing to see"}"#[..],
        ]
    );
    for (i, o) in out.iter().enumerate() {
        assert_eq!(o.key, Some(format!("{}", i + 1).as_bytes()));
    }
    match host()
        .load_transform(&guest("redact"), &config(&[("patterns", r"ok,\d{3")]))
        .await
    {
        Err(e @ PluginError::Open { .. }) => {
            eprintln!("{e}");
            assert!(e.to_string().contains(r"bad regex `\d{3`"), "{e}")
        }
        other => panic!("redact loaded a bad regex: {:?}", other.err()),
    }
    broker.stop();
}

#[tokio::test]
async fn a_plugin_cannot_open_files_or_sockets_or_read_the_environment() {
    let mut t = host()
        .load_transform(&guest("fs-escape"), &[])
        .await
        .expect("load fs-escape");
    match t.apply(&context(), &[record(b"x")]).await {
        Err(e @ PluginError::Failed { .. }) => {
            let msg = e.to_string();
            eprintln!("{msg}");
            assert!(!msg.contains("SUCCEEDED"), "{msg}");
            assert!(
                msg.contains("open /etc/passwd: failed (No such file"),
                "{msg}"
            );
            assert!(
                msg.contains("connect 127.0.0.1:9: failed (Permission denied"),
                "{msg}"
            );
            assert!(msg.contains("env: 0 variables"), "{msg}");
        }
        other => panic!("expected the fixture's report, got {other:?}"),
    }
}

#[tokio::test]
async fn a_component_importing_what_weir_withholds_is_refused_at_load() {
    let h = host();
    // Refused before linking, with the import named, whichever world it is loaded as.
    let transform = h.load_transform(&guest("withheld-import"), &[]).await;
    let partitioner = h.load_partitioner(&guest("withheld-import")).await;
    for (world, result) in [
        ("transform", transform.err()),
        ("partitioner", partitioner.err()),
    ] {
        match result {
            Some(e @ PluginError::WrongWorld { .. }) => {
                let msg = e.to_string();
                eprintln!("{msg}");
                assert_eq!(
                    msg,
                    format!(
                        "plugin withheld_import.wasm: not a weir `{world}` component: imports \
                         `weir:host/secrets@0.1.0`, which weir does not provide (weir links \
                         WASI 0.2 and nothing else)"
                    )
                );
            }
            other => panic!("expected WrongWorld, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_component_of_a_future_major_version_is_refused_at_load() {
    let h = host();
    let transform = h.load_transform(&guest("future-major"), &[]).await;
    let partitioner = h.load_partitioner(&guest("future-major")).await;
    for (world, result) in [
        ("transform", transform.err()),
        ("partitioner", partitioner.err()),
    ] {
        match result {
            Some(e @ PluginError::WrongWorld { .. }) => {
                let msg = e.to_string();
                eprintln!("{msg}");
                let prefix = format!(
                    "plugin future_major.wasm: not a weir `{world}` component: built for \
                     weir:plugin 1.0.0; this weir provides weir:plugin 0.1.0 (exports: "
                );
                assert!(msg.starts_with(&prefix), "{msg}");
                assert!(msg.contains("weir:plugin/transformer@1.0.0"), "{msg}");
            }
            other => panic!("expected WrongWorld, got {other:?}"),
        }
    }
}
