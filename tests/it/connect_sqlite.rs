//! SQLite connectors (issue 5): `sqlite-cdc` captures what another process (python3's
//! stdlib sqlite3, its own SQLite library) commits, read back with a real rdkafka
//! consumer; `sqlite-sink` upserts and deletes what rdkafka produced; a connector opening
//! another database than its `database` is denied.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::Value;

use crate::harness::{poll_for, wait_until, TestBroker};

/// The built `connectors/` components (built once per test process).
fn plugin_path() -> PathBuf {
    crate::connect::plugin_path()
}

/// Runs `script` (SQL, several statements) against `db` in a python3 process, committed.
fn py_sql(db: &Path, script: &str) {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys\nc=sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)\nc.executescript(sys.argv[2])\nc.close()",
        ])
        .arg(db)
        .arg(script)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "python3 failed on {script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One record read: topic, key, value (None = tombstone).
type Rec = (String, Option<String>, Option<String>);

/// Reads `topics` (partition 0) from the beginning until `expected` records arrived or
/// 60 s passed, then half a second more to catch anything extra.
fn read_all(bootstrap: &str, topics: &[&str], expected: usize) -> Vec<Rec> {
    read_all_for(bootstrap, topics, expected, Duration::from_secs(60))
}

/// As [`read_all`], giving up after `wait`.
fn read_all_for(bootstrap: &str, topics: &[&str], expected: usize, wait: Duration) -> Vec<Rec> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "sqlite-test-reader")
        .set("enable.auto.commit", "false")
        .set("topic.metadata.refresh.interval.ms", "500")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for t in topics {
        tpl.add_partition_offset(t, 0, Offset::Beginning).unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + wait;
    let mut settle: Option<Instant> = None;
    loop {
        if out.len() >= expected && settle.is_none() {
            settle = Some(Instant::now() + Duration::from_millis(500));
        }
        if settle.is_some_and(|s| Instant::now() > s) || Instant::now() > deadline {
            return out;
        }
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            let Ok(m) = m else { continue };
            out.push((
                m.topic().to_string(),
                m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                m.payload().map(|v| String::from_utf8_lossy(v).into_owned()),
            ));
        }
    }
}

/// `(key, op)` of each record of `topic`, `op` = "tombstone" for a null value.
fn ops(records: &[Rec], topic: &str) -> Vec<(String, String)> {
    records
        .iter()
        .filter(|(t, _, _)| t == topic)
        .map(|(_, k, v)| {
            let op = match v {
                None => "tombstone".to_string(),
                Some(v) => {
                    let j: Value = serde_json::from_str(v).unwrap();
                    j["op"].as_str().unwrap().to_string()
                }
            };
            (k.clone().unwrap_or_default(), op)
        })
        .collect()
}

fn kv(key: &str, op: &str) -> (String, String) {
    (key.to_string(), op.to_string())
}

struct Dirs {
    _tmp: tempfile::TempDir,
    data: PathBuf,
    configs: PathBuf,
    db: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    for d in ["data", "configs", "db"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    Dirs {
        data: root.join("data"),
        configs: root.join("configs"),
        db: root.join("db/shop.db"),
        _tmp: tmp,
    }
}

fn start(d: &Dirs) -> TestBroker {
    let dir = format!("connect.config.dir={}", d.configs.display());
    let plugins = format!("connect.plugin.path={}", plugin_path().display());
    TestBroker::start_in(&d.data, &[&dir, &plugins])
}

fn cdc_config(d: &Dirs, name: &str, tables: &str, extra: &str) {
    std::fs::write(
        d.configs.join(format!("{name}.toml")),
        format!(
            "name = \"{name}\"\nconnector.class = \"sqlite-cdc\"\ndatabase = \"{}\"\n\
             tables = \"{tables}\"\ntopic.prefix = \"shop\"\npoll.interval.ms = 20\n{extra}",
            d.db.display()
        ),
    )
    .unwrap();
}

/// Waits until the connector installed `table`'s change-log triggers (all five).
fn wait_for_triggers(db: &Path, table: &str) {
    wait_until(
        &format!("the triggers of {table} are installed"),
        30,
        || {
            let conn = rusqlite::Connection::open(db).unwrap();
            let n: i64 = conn
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' \
                     AND tbl_name = ?1 AND name GLOB '_weir_cdc_*'",
                    [table],
                    |r| r.get(0),
                )
                .unwrap();
            n == 5
        },
    )
}

/// Runs `script` with python3 ([`py_sql`]), then reads `topics` from the beginning until
/// `total` records arrived, and returns them. Waiting for each step's events keeps
/// changes of one key in different steps from coalescing into one event.
fn step(d: &Dirs, bootstrap: &str, topics: &[&str], script: &str, total: usize) -> Vec<Rec> {
    py_sql(&d.db, script);
    let all = read_all(bootstrap, topics, total);
    let shown = if all.len() <= 50 {
        format!("{all:?}")
    } else {
        format!("{} records", all.len())
    };
    let first_line = script.lines().next().unwrap_or_default();
    assert_eq!(all.len(), total, "after `{first_line}`...: {shown}");
    all
}

#[test]
fn cdc_snapshot_then_replace_pk_change_and_schema_change() {
    let d = dirs();
    py_sql(
        &d.db,
        "PRAGMA journal_mode=WAL;
         CREATE TABLE items(id INTEGER PRIMARY KEY, sku TEXT UNIQUE, qty INTEGER, pic BLOB);
         CREATE TABLE pairs(a TEXT, b INTEGER, v TEXT, PRIMARY KEY (a, b)) WITHOUT ROWID;
         INSERT INTO items(id, sku, qty, pic) VALUES (1, 'a', 1, x'00ff'), (2, 'b', 2, NULL);
         INSERT INTO pairs VALUES ('x', 1, 'p');",
    );
    cdc_config(&d, "shop-cdc", "items, pairs", "");
    let broker = start(&d);
    // The snapshot is taken before anything else is written.
    let snap = read_all(&broker.bootstrap, &["shop.items", "shop.pairs"], 3);
    assert_eq!(
        ops(&snap, "shop.items"),
        vec![kv("{\"id\":1}", "r"), kv("{\"id\":2}", "r")]
    );
    let first = snap.iter().find(|(t, _, _)| t == "shop.items").unwrap();
    let first: Value = serde_json::from_str(first.2.as_deref().unwrap()).unwrap();
    assert_eq!(first["after"]["pic"], "00FF", "a BLOB is hex text: {first}");
    assert_eq!(first["before"], Value::Null);
    assert_eq!(first["source"]["connector"], "sqlite");
    assert_eq!(first["source"]["table"], "items");
    assert_eq!(first["source"]["snapshot"], "true");
    assert_eq!(first["source"]["db"], d.db.display().to_string());

    let topics = ["shop.items", "shop.pairs"];
    let b = broker.bootstrap.as_str();
    // The same key replaced: an update carrying the row as it is now.
    step(
        &d,
        b,
        &topics,
        "INSERT OR REPLACE INTO items(id, sku, qty) VALUES (1, 'a', 10);",
        4,
    );
    // A new key replacing a row through the UNIQUE sku: delete of 2, create of 3.
    step(
        &d,
        b,
        &topics,
        "REPLACE INTO items(id, sku, qty) VALUES (3, 'b', 30);",
        7,
    );
    // Conflicts on the key (1) and on sku (row 3): delete of 3, update of 1.
    step(
        &d,
        b,
        &topics,
        "INSERT OR REPLACE INTO items(id, sku, qty) VALUES (1, 'b', 5);",
        10,
    );
    // Ignored: nothing. Primary key changes, rowid and WITHOUT ROWID tables: delete then
    // create.
    step(
        &d,
        b,
        &topics,
        "INSERT OR IGNORE INTO items(id, sku, qty) VALUES (1, 'zz', 0);
         UPDATE items SET id = 7 WHERE id = 1;",
        13,
    );
    step(&d, b, &topics, "UPDATE pairs SET b = 2 WHERE a = 'x';", 16);
    // A new column shows in the next event, with no wait between the ALTER and the insert.
    step(
        &d,
        b,
        &topics,
        "ALTER TABLE items ADD COLUMN note TEXT;
         INSERT INTO items(id, sku, qty, note) VALUES (8, 'h', 8, 'hello');",
        17,
    );
    let all = step(&d, b, &topics, "DELETE FROM items WHERE id = 8;", 3 + 16);
    assert_eq!(
        ops(&all, "shop.items"),
        vec![
            kv("{\"id\":1}", "r"),
            kv("{\"id\":2}", "r"),
            kv("{\"id\":1}", "u"),
            kv("{\"id\":2}", "d"),
            kv("{\"id\":2}", "tombstone"),
            kv("{\"id\":3}", "c"),
            kv("{\"id\":3}", "d"),
            kv("{\"id\":3}", "tombstone"),
            kv("{\"id\":1}", "u"),
            kv("{\"id\":1}", "d"),
            kv("{\"id\":1}", "tombstone"),
            kv("{\"id\":7}", "c"),
            kv("{\"id\":8}", "c"),
            kv("{\"id\":8}", "d"),
            kv("{\"id\":8}", "tombstone"),
        ]
    );
    assert_eq!(
        ops(&all, "shop.pairs"),
        vec![
            kv("{\"a\":\"x\",\"b\":1}", "r"),
            kv("{\"a\":\"x\",\"b\":1}", "d"),
            kv("{\"a\":\"x\",\"b\":1}", "tombstone"),
            kv("{\"a\":\"x\",\"b\":2}", "c"),
        ]
    );
    let values = events(&all, "shop.items");
    // The update of 1 by key: `before` null, `after` the row as read (qty 10).
    assert_eq!(values[2]["before"], Value::Null);
    assert_eq!(values[2]["after"]["qty"], 10);
    assert_eq!(values[2]["source"]["snapshot"], "false");
    // The delete of 2 (removed by REPLACE) carries its key columns as `before`.
    assert_eq!(values[3]["before"], serde_json::json!({"id": 2}));
    assert_eq!(values[3]["after"], Value::Null);
    let change_ids: Vec<i64> = values[2..]
        .iter()
        .map(|v| v["source"]["change_id"].as_i64().unwrap())
        .collect();
    assert!(
        change_ids.windows(2).all(|w| w[0] < w[1]),
        "commit order: {change_ids:?}"
    );
    // The insert after ALTER TABLE carries the new column.
    assert_eq!(values[9]["after"]["note"], "hello", "{}", values[9]);
    broker.stop();
}

#[test]
fn cdc_snapshot_never_streams_only_new_changes_and_tombstones_can_be_off() {
    let d = dirs();
    py_sql(
        &d.db,
        "CREATE TABLE logs(msg TEXT); INSERT INTO logs VALUES ('old 1'), ('old 2');",
    );
    cdc_config(
        &d,
        "logs-cdc",
        "logs",
        "snapshot.mode = \"never\"\ntombstones.on.delete = false\n\
         message.key.columns = \"logs:msg\"\n",
    );
    let broker = start(&d);
    // Wait for the connector to install its triggers, then write.
    wait_for_triggers(&d.db, "logs");
    py_sql(
        &d.db,
        "INSERT INTO logs VALUES ('new'); DELETE FROM logs WHERE msg = 'old 1';",
    );
    let got = read_all(&broker.bootstrap, &["shop.logs"], 2);
    // The table has no primary key: the key is the column `message.key.columns` names.
    assert_eq!(
        ops(&got, "shop.logs"),
        vec![kv("{\"msg\":\"new\"}", "c"), kv("{\"msg\":\"old 1\"}", "d")]
    );
    broker.stop();
}

/// The latest value of `key` in `__connect_status`, waiting until it contains `want`.
fn wait_for_status(bootstrap: &str, key: &str, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let records = read_all_for(
            bootstrap,
            &["__connect_status"],
            usize::MAX,
            Duration::from_secs(1),
        );
        let latest = records
            .iter()
            .rev()
            .find(|(_, k, _)| k.as_deref() == Some(key))
            .and_then(|(_, _, v)| v.clone());
        if let Some(v) = &latest {
            if v.contains(want) {
                return v.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{key} is {latest:?}, never {want}"
        );
    }
}

#[test]
fn a_sqlite_connector_opening_another_database_is_denied() {
    let d = dirs();
    let other = d.db.with_file_name("other.db");
    py_sql(
        &other,
        "CREATE TABLE secrets(s TEXT); INSERT INTO secrets VALUES ('x');",
    );
    py_sql(&d.db, "CREATE TABLE t(id INTEGER PRIMARY KEY);");
    // The fixture (plugins/fixtures/sqlite-escape) opens `target`, then ATTACHes it
    // through a connection to its granted `database`, and reports both in its error.
    std::fs::write(
        d.configs.join("sneaky.toml"),
        format!(
            "name = \"sneaky\"\nconnector.class = \"{}\"\ndatabase = \"{}\"\n\
             target = \"{}\"\ntopic = \"stolen\"\nerrors.retry.timeout = 300\n",
            crate::guests::guest("sqlite-escape").display(),
            d.db.display(),
            other.display()
        ),
    )
    .unwrap();
    let broker = start(&d);
    let status = wait_for_status(&broker.bootstrap, "status-connector-sneaky", "FAILED");
    let granted = d.db.display().to_string();
    let target = other.display().to_string();
    assert!(
        status.contains(&format!("open {target}: failed (sqlite: access to {target} denied: the only database granted to this connector is {granted})")),
        "the open is denied, naming the granted database: {status}"
    );
    assert!(
        status.contains(&format!("attach {target}: failed (sqlite: ")),
        "ATTACH is refused: {status}"
    );
    assert!(status.contains(&format!("open {granted}: ok")), "{status}");
    // Nothing was written to the other file.
    let conn = rusqlite::Connection::open(&other).unwrap();
    let n: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
    broker.stop();
}

#[test]
fn sqlite_sink_upserts_by_key_and_deletes_on_tombstone() {
    let d = dirs();
    std::fs::write(
        d.configs.join("sink.toml"),
        format!(
            "name = \"orders-sink\"\nconnector.class = \"sqlite-sink\"\ndatabase = \"{}\"\n\
             topics = \"orders.v1\"\nauto.create = true\nauto.evolve = true\n\
             offset.flush.interval.ms = 100\n",
            d.db.display()
        ),
    )
    .unwrap();
    let broker = start(&d);
    let producer: rdkafka::producer::BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &broker.bootstrap)
        .create()
        .unwrap();
    let send = |key: &str, value: Option<&str>| {
        let mut r = rdkafka::producer::BaseRecord::<str, str>::to("orders.v1").key(key);
        if let Some(v) = value {
            r = r.payload(v);
        }
        producer.send(r).map_err(|(e, _)| e).unwrap();
    };
    send("{\"id\":1}", Some("{\"item\":\"apple\",\"qty\":2}"));
    send("{\"id\":2}", Some("{\"item\":\"pear\",\"qty\":1}"));
    send("{\"id\":1}", Some("{\"item\":\"apple\",\"qty\":5}"));
    send(
        "{\"id\":3}",
        Some("{\"item\":\"fig\",\"qty\":9,\"note\":\"new column\"}"),
    );
    send("{\"id\":2}", None);
    rdkafka::producer::Producer::flush(&producer, Duration::from_secs(10)).unwrap();
    // Table name: the topic with `.` as `_`.
    let want = vec![
        (1, "apple".to_string(), 5, None),
        (3, "fig".to_string(), 9, Some("new column".to_string())),
    ];
    poll_for("the sink's table holds the upserts", 60, || {
        let conn = rusqlite::Connection::open(&d.db).unwrap();
        let got: Vec<(i64, String, i64, Option<String>)> = conn
            .prepare("SELECT id, item, qty, note FROM orders_v1 ORDER BY id")
            .and_then(|mut s| {
                s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                    .collect()
            })
            .unwrap_or_default();
        if got == want {
            return Ok(());
        }
        Err(format!("table is {got:?}, want {want:?}"))
    });
    broker.stop();
}

/// The writer of the stress test: `n` inserts across tables `a` and `b`, with updates and
/// deletes of earlier rows, in transactions of 1..40 statements, a short pause between.
const WRITER: &str = r#"
import random, sqlite3, sys, time
db, n = sys.argv[1], int(sys.argv[2])
rnd = random.Random(5)
c = sqlite3.connect(db, timeout=60, isolation_level=None)
live = {"a": [], "b": []}
i = 0
while i < n:
    c.execute("BEGIN")
    for _ in range(rnd.randint(1, 40)):
        if i >= n:
            break
        t = "a" if i % 2 == 0 else "b"
        c.execute(f"INSERT INTO {t}(id, v) VALUES (?, ?)", (i, f"v{i}"))
        live[t].append(i)
        i += 1
        r = rnd.random()
        t2 = rnd.choice("ab")
        if live[t2] and r < 0.3:
            k = rnd.choice(live[t2])
            c.execute(f"UPDATE {t2} SET v = ? WHERE id = ?", (f"u{i}", k))
        elif live[t2] and r < 0.4:
            k = live[t2].pop(rnd.randrange(len(live[t2])))
            c.execute(f"DELETE FROM {t2} WHERE id = ?", (k,))
    c.execute("COMMIT")
    time.sleep(0.01)
c.close()
"#;

/// The rows of table `t` as `id -> v`.
fn table(db: &Path, t: &str) -> BTreeMap<i64, String> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut s = conn.prepare(&format!("SELECT id, v FROM {t}")).unwrap();
    s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Applies change events to a model of the tables: c/u/r put `after`, d and tombstones
/// remove the key.
fn apply(model: &mut BTreeMap<String, BTreeMap<i64, String>>, r: &Rec) {
    let table = r.0.trim_start_matches("shop.").to_string();
    let key: Value = serde_json::from_str(r.1.as_deref().unwrap()).unwrap();
    let id = key["id"].as_i64().unwrap();
    let rows = model.entry(table).or_default();
    match &r.2 {
        None => {
            rows.remove(&id);
        }
        Some(v) => {
            let v: Value = serde_json::from_str(v).unwrap();
            match v["op"].as_str().unwrap() {
                "d" => {
                    rows.remove(&id);
                }
                _ => {
                    rows.insert(id, v["after"]["v"].as_str().unwrap().to_string());
                }
            }
        }
    }
}

#[test]
fn cdc_of_10000_rows_in_two_tables_survives_two_broker_restarts() {
    let d = dirs();
    py_sql(
        &d.db,
        "PRAGMA journal_mode=WAL;
         CREATE TABLE a(id INTEGER PRIMARY KEY, v TEXT);
         CREATE TABLE b(id INTEGER PRIMARY KEY, v TEXT);
         INSERT INTO a VALUES (-1, 'before the connector');",
    );
    cdc_config(&d, "stress", "a,b", "batch.size = 500\n");
    let mut broker = start(&d);
    wait_for_triggers(&d.db, "b");
    let mut writer = Command::new("python3")
        .args(["-c", WRITER])
        .arg(&d.db)
        .arg("10000")
        .spawn()
        .expect("python3 runs");
    // Two restarts while the writer writes: what it commits meanwhile waits in the log.
    for _ in 0..2 {
        // Pacing: let the writer commit for a while before each stop (not a wait for a
        // condition; the test checks that every commit is captured, whenever it landed).
        std::thread::sleep(Duration::from_millis(1500));
        assert!(
            writer.try_wait().unwrap().is_none(),
            "the writer is still writing when the broker stops"
        );
        broker.stop();
        // Pacing too: the writer keeps committing while no broker runs.
        std::thread::sleep(Duration::from_millis(500));
        broker = start(&d);
    }
    let status = writer.wait().unwrap();
    assert!(status.success());
    let want_a = table(&d.db, "a");
    let want_b = table(&d.db, "b");
    assert!(want_a.len() + want_b.len() > 5_000);
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &broker.bootstrap)
        .set("group.id", "sqlite-stress-reader")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for t in ["shop.a", "shop.b"] {
        tpl.add_partition_offset(t, 0, Offset::Beginning).unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut model: BTreeMap<String, BTreeMap<i64, String>> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut read = 0usize;
    loop {
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            let Ok(m) = m else { continue };
            let r: Rec = (
                m.topic().to_string(),
                m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                m.payload().map(|v| String::from_utf8_lossy(v).into_owned()),
            );
            apply(&mut model, &r);
            read += 1;
            continue;
        }
        let got_a = model.get("a").cloned().unwrap_or_default();
        let got_b = model.get("b").cloned().unwrap_or_default();
        if got_a == want_a && got_b == want_b {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after {read} records the topics give {} + {} rows, the database has {} + {}",
            got_a.len(),
            got_b.len(),
            want_a.len(),
            want_b.len()
        );
    }
    // The committed part of the log was trimmed.
    let conn = rusqlite::Connection::open(&d.db).unwrap();
    let left: i64 = conn
        .query_row("SELECT count(*) FROM _weir_cdc_log", [], |r| r.get(0))
        .unwrap();
    assert!(left < 10_000, "{left} log rows left");
    broker.stop();
}

#[test]
fn the_db_streaming_pipeline_runs_as_shipped() {
    let d = dirs();
    let pipeline = crate::harness::repo_root().join("config/pipelines/db-streaming");
    let make_db = |extra: &[&str]| {
        let out = Command::new("python3")
            .arg(pipeline.join("make_db.py"))
            .arg(&d.db)
            .args(extra)
            .output()
            .expect("python3 runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    make_db(&[]);
    // The connector file as shipped, its `database` pointed at this test's copy.
    let shipped = std::fs::read_to_string(pipeline.join("connectors/shop-cdc.toml")).unwrap();
    let line = "database = \"config/pipelines/db-streaming/shop.db\"";
    assert!(shipped.contains(line), "{shipped}");
    let adjusted = shipped.replace(line, &format!("database = \"{}\"", d.db.display()));
    std::fs::write(d.configs.join("shop-cdc.toml"), adjusted).unwrap();
    let broker = start(&d);
    let snap = read_all(&broker.bootstrap, &["shop.customers", "shop.orders"], 5);
    assert_eq!(
        ops(&snap, "shop.customers"),
        vec![
            kv("{\"id\":1}", "r"),
            kv("{\"id\":2}", "r"),
            kv("{\"id\":3}", "r")
        ]
    );
    assert_eq!(ops(&snap, "shop.orders").len(), 2);
    make_db(&["--change"]);
    let all = read_all(&broker.bootstrap, &["shop.customers", "shop.orders"], 5 + 5);
    assert_eq!(
        ops(&all, "shop.customers")[3..],
        [
            kv("{\"id\":1}", "u"),
            kv("{\"id\":2}", "d"),
            kv("{\"id\":2}", "tombstone"),
            kv("{\"id\":3}", "u"),
        ]
    );
    assert_eq!(ops(&all, "shop.orders")[2..], [kv("{\"id\":102}", "c")]);
    broker.stop();
}

#[test]
fn a_writer_holding_the_lock_makes_the_connector_wait_not_fail() {
    use std::io::BufRead;
    let d = dirs();
    py_sql(
        &d.db,
        "PRAGMA journal_mode=WAL; CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (1, 'before');",
    );
    // Holds the write lock for 2.5 s, longer than a plugin call's deadline (1 s): the
    // connector's trigger install waits on the busy timeout, and that wait does not count
    // against the deadline.
    let mut writer = Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys,time\nc=sqlite3.connect(sys.argv[1], isolation_level=None)\nc.execute('BEGIN IMMEDIATE')\nc.execute(\"INSERT INTO t VALUES (2, 'held')\")\nprint('locked', flush=True)\ntime.sleep(2.5)\nc.execute('COMMIT')",
        ])
        .arg(&d.db)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut line = String::new();
    std::io::BufReader::new(writer.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "locked");
    cdc_config(&d, "patient", "t", "");
    let broker = start(&d);
    let got = read_all(&broker.bootstrap, &["shop.t"], 2);
    assert_eq!(
        ops(&got, "shop.t"),
        vec![kv("{\"id\":1}", "r"), kv("{\"id\":2}", "r")]
    );
    assert!(writer.wait().unwrap().success());
    // The task never failed: every status it wrote has no error.
    let statuses = read_all_for(
        &broker.bootstrap,
        &["__connect_status"],
        usize::MAX,
        Duration::from_secs(1),
    );
    let mine: Vec<Value> = statuses
        .iter()
        .filter(|(_, k, _)| k.as_deref() == Some("status-connector-patient"))
        .map(|(_, _, v)| serde_json::from_str(v.as_deref().unwrap()).unwrap())
        .collect();
    assert!(!mine.is_empty());
    for s in &mine {
        assert_eq!(s["trace"], Value::Null, "{mine:?}");
    }
    broker.stop();
}

/// `GET /connectors/{name}/status`: (connector state, task 0 state, task 0 trace).
fn rest_status(admin: &str, name: &str) -> (String, String, Value) {
    try_rest_status(admin, name).unwrap_or_else(|e| panic!("{e}"))
}

/// [`rest_status`], or why the request failed (e.g. 404 before the connector exists).
fn try_rest_status(admin: &str, name: &str) -> Result<(String, String, Value), String> {
    let url = format!("{admin}/connectors/{name}/status");
    let response = ureq::get(&url)
        .timeout(Duration::from_secs(30))
        .call()
        .map_err(|e| format!("GET {url}: {e}"))?;
    let body: Value = response
        .into_json()
        .map_err(|e| format!("GET {url}: {e}"))?;
    let task = &body["tasks"][0];
    Ok((
        body["connector"]["state"]
            .as_str()
            .unwrap_or("?")
            .to_string(),
        task["state"].as_str().unwrap_or("?").to_string(),
        task["trace"].clone(),
    ))
}

/// Issue 16: a writer holding `BEGIN IMMEDIATE` past the busy timeout (5 s) is latency
/// for the sink, not a failure: the task stays RUNNING throughout, and once the lock is
/// released every record is written once, in order (a trigger logs each insert).
#[test]
fn a_writer_holding_the_lock_delays_the_sink_which_stays_running() {
    let d = dirs();
    py_sql(
        &d.db,
        "PRAGMA journal_mode=WAL;
         CREATE TABLE events(id INTEGER PRIMARY KEY, n INTEGER);
         CREATE TABLE log(seq INTEGER PRIMARY KEY AUTOINCREMENT, id INTEGER);
         CREATE TRIGGER logged AFTER INSERT ON events BEGIN INSERT INTO log(id) VALUES (NEW.id); END;",
    );
    std::fs::write(
        d.configs.join("sink.toml"),
        format!(
            "name = \"patient-sink\"\nconnector.class = \"sqlite-sink\"\ndatabase = \"{}\"\n\
             topics = \"events\"\noffset.flush.interval.ms = 100\n",
            d.db.display()
        ),
    )
    .unwrap();
    let broker = start(&d);
    let admin = broker.admin_url.clone();
    let producer: rdkafka::producer::BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &broker.bootstrap)
        .set("linger.ms", "0")
        .create()
        .unwrap();
    let send = |i: i64| {
        let key = format!("{{\"id\":{i}}}");
        let value = format!("{{\"n\":{i}}}");
        producer
            .send(
                rdkafka::producer::BaseRecord::<str, str>::to("events")
                    .key(&key)
                    .payload(&value),
            )
            .map_err(|(e, _)| e)
            .unwrap();
        rdkafka::producer::Producer::flush(&producer, Duration::from_secs(10)).unwrap();
    };
    let logged = || -> Vec<i64> {
        let conn = rusqlite::Connection::open(&d.db).unwrap();
        conn.busy_timeout(Duration::from_secs(10)).unwrap();
        let mut s = conn.prepare("SELECT id FROM log ORDER BY seq").unwrap();
        let ids = s.query_map([], |r| r.get(0)).unwrap();
        ids.collect::<Result<_, _>>().unwrap()
    };
    for i in 0..10 {
        send(i);
    }
    poll_for("the first 10 records are written", 60, || {
        let got = logged();
        (got.len() >= 10)
            .then_some(())
            .ok_or(format!("log {got:?}"))
    });
    assert_eq!(rest_status(&admin, "patient-sink").1, "RUNNING");

    // Hold the write lock for 8 s (past the 5 s busy timeout) while records keep coming,
    // checking the status over the REST API all along.
    let holder = rusqlite::Connection::open(&d.db).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let locked_at = Instant::now();
    let mut next = 10;
    let mut checks = 0;
    while locked_at.elapsed() < Duration::from_secs(8) {
        if next < 40 {
            send(next);
            next += 1;
        }
        let (connector, task, trace) = rest_status(&admin, "patient-sink");
        assert_eq!(
            (connector.as_str(), task.as_str(), &trace),
            ("RUNNING", "RUNNING", &Value::Null),
            "after {:?} of lock",
            locked_at.elapsed()
        );
        checks += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(checks > 20, "{checks} status checks");
    assert_eq!(
        logged().len(),
        10,
        "nothing went in while the lock was held"
    );
    holder.execute_batch("COMMIT").unwrap();
    drop(holder);

    for i in next..50 {
        send(i);
    }
    let want: Vec<i64> = (0..50).collect();
    poll_for("every record is written once, in order", 60, || {
        let got = logged();
        if got == want {
            return Ok(());
        }
        if got.len() > want.len() || !want.starts_with(&got) {
            panic!("log is {got:?}: a record was lost, duplicated or reordered");
        }
        Err(format!("log {got:?}"))
    });
    assert_eq!(rest_status(&admin, "patient-sink").1, "RUNNING");
    // No status the task ever wrote carries an error.
    let statuses = read_all_for(
        &broker.bootstrap,
        &["__connect_status"],
        usize::MAX,
        Duration::from_secs(1),
    );
    for (_, k, v) in &statuses {
        if k.as_deref() == Some("status-task-patient-sink-0") {
            let s: Value = serde_json::from_str(v.as_deref().unwrap()).unwrap();
            assert_eq!(s["trace"], Value::Null, "{s}");
        }
    }
    broker.stop();
}

/// The change ids of the events of `records` (tombstones have none), in read order.
fn change_ids(records: &[Rec]) -> Vec<i64> {
    records
        .iter()
        .filter_map(|(_, _, v)| v.as_deref())
        .map(|v| {
            let j: Value = serde_json::from_str(v).unwrap();
            j["source"]["change_id"].as_i64().unwrap()
        })
        .collect()
}

/// Issue 16: a backlog of ~2 KB rows in two tables, committed while the broker is down,
/// is more than `max.message.bytes` per poll. On start the source splits what it appends
/// to fit and stores exactly what was appended: every change arrives once, in order, and
/// the task never fails (no retry re-appending the leading events).
#[test]
fn cdc_backlog_larger_than_max_message_bytes_arrives_once_in_order() {
    let d = dirs();
    py_sql(
        &d.db,
        "PRAGMA journal_mode=WAL;
         CREATE TABLE a(id INTEGER PRIMARY KEY, v TEXT);
         CREATE TABLE b(id INTEGER PRIMARY KEY, v TEXT);",
    );
    cdc_config(&d, "backlog", "a,b", "");
    let broker = start(&d);
    wait_for_triggers(&d.db, "b");
    // One change through, so the connector has stored an offset to resume from.
    py_sql(&d.db, "INSERT INTO a VALUES (-1, 'first');");
    assert_eq!(read_all(&broker.bootstrap, &["shop.a"], 1).len(), 1);
    broker.stop();
    // 1,200 rows of 2 KB alternating between the tables: ~2.4 MB in the log, well over
    // one poll's worth of max.message.bytes (1 MiB) and several topic runs per poll.
    const ROWS: i64 = 1_200;
    py_sql(
        &d.db,
        &format!(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {})
             INSERT INTO a SELECT i, printf('%.2000c', 'x') FROM n WHERE i % 2 = 0;
             WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {})
             INSERT INTO b SELECT i, printf('%.2000c', 'y') FROM n WHERE i % 2 = 1;",
            ROWS - 1,
            ROWS - 1
        ),
    );
    let broker = start(&d);
    let admin = broker.admin_url.clone();
    let got = read_all(&broker.bootstrap, &["shop.a", "shop.b"], 1 + ROWS as usize);
    let mut ids = change_ids(&got);
    assert_eq!(
        got.len(),
        1 + ROWS as usize,
        "every change once, none repeated"
    );
    let per_topic_in_order = ["shop.a", "shop.b"].iter().all(|t| {
        let mine: Vec<Rec> = got.iter().filter(|r| r.0 == *t).cloned().collect();
        change_ids(&mine).windows(2).all(|w| w[0] < w[1])
    });
    assert!(per_topic_in_order, "change ids in order per topic");
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 1 + ROWS as usize, "no change id twice");
    let (connector, task, trace) = rest_status(&admin, "backlog");
    assert_eq!(
        (connector.as_str(), task.as_str(), &trace),
        ("RUNNING", "RUNNING", &Value::Null)
    );
    broker.stop();
}

/// The `id`s of the keys of `topic`'s records in `records`, in read order.
fn ids_of(records: &[Rec], topic: &str) -> Vec<i64> {
    records
        .iter()
        .filter(|(t, _, _)| t == topic)
        .map(|(_, k, _)| {
            let key: Value = serde_json::from_str(k.as_deref().unwrap()).unwrap();
            key["id"].as_i64().unwrap()
        })
        .collect()
}

/// Issue 16, a record a topic refuses: `shop.b` takes at most 16 KiB per batch, and one
/// transaction inserts a0, b1, a2, b3 (40 KB), a4, b5. Returns the directories and the
/// broker once the transaction is committed under connector `refused` (`extra` keys).
fn refused_record_setup(extra: &str) -> (Dirs, TestBroker) {
    let d = dirs();
    py_sql(
        &d.db,
        "PRAGMA journal_mode=WAL;
         CREATE TABLE a(id INTEGER PRIMARY KEY, v TEXT);
         CREATE TABLE b(id INTEGER PRIMARY KEY, v TEXT);",
    );
    let broker = start(&d);
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(crate::rdkafka_client::create_topic(
            &broker.bootstrap,
            "shop.b",
            1,
            &[("max.message.bytes", "16384")],
        ));
    cdc_config(&d, "refused", "a,b", extra);
    wait_for_triggers(&d.db, "b");
    py_sql(
        &d.db,
        "BEGIN;
         INSERT INTO a VALUES (0, 'small');
         INSERT INTO b VALUES (1, 'small');
         INSERT INTO a VALUES (2, 'small');
         INSERT INTO b VALUES (3, printf('%.40000c', 'x'));
         INSERT INTO a VALUES (4, 'small');
         INSERT INTO b VALUES (5, 'small');
         COMMIT;",
    );
    (d, broker)
}

/// Under `errors.tolerance=none` (and restarts forever, `errors.retry.timeout=-1`) the
/// refused record fails the task at once — FAILED with the reason, not a retry loop
/// appending a0, b1, a2 again each time — with the offset of a2 stored. Once the topic
/// takes the record, a restart writes b3, a4, b5: every change once, in order.
#[test]
fn cdc_record_too_large_for_its_topic_fails_the_task_once_and_resumes_after_a_fix() {
    let (_d, broker) = refused_record_setup("errors.retry.timeout = -1\n");
    let admin = broker.admin_url.clone();
    let trace = poll_for("the task is FAILED", 30, || {
        match rest_status(&admin, "refused") {
            (c, t, trace) if c == "FAILED" && t == "FAILED" => Ok(trace),
            other => Err(format!("status {other:?}")),
        }
    });
    let trace = trace.as_str().unwrap_or_default().to_string();
    assert!(
        trace.contains("shop.b") && trace.contains("exceeds max.message.bytes 16384"),
        "the reason names the topic and the limit: {trace}"
    );
    let before = read_all(&broker.bootstrap, &["shop.a", "shop.b"], 3);
    assert_eq!(ids_of(&before, "shop.a"), vec![0, 2], "{before:?}");
    assert_eq!(ids_of(&before, "shop.b"), vec![1]);

    // The user lets the topic take the record, then restarts the connector.
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let alter =
            rdkafka::admin::AlterConfig::new(rdkafka::admin::ResourceSpecifier::Topic("shop.b"))
                .set("max.message.bytes", "1048588");
        let r = crate::rdkafka_client::admin(&broker.bootstrap)
            .alter_configs(&[alter], &rdkafka::admin::AdminOptions::new())
            .await
            .unwrap();
        assert!(r[0].is_ok(), "{r:?}");
    });
    let restart = format!("{admin}/connectors/refused/restart");
    ureq::post(&restart)
        .timeout(Duration::from_secs(30))
        .call()
        .unwrap_or_else(|e| panic!("POST {restart}: {e}"));
    let after = read_all(&broker.bootstrap, &["shop.a", "shop.b"], 6);
    assert_eq!(ids_of(&after, "shop.a"), vec![0, 2, 4], "{after:?}");
    assert_eq!(ids_of(&after, "shop.b"), vec![1, 3, 5]);
    poll_for("the task is RUNNING again", 30, || {
        match rest_status(&admin, "refused") {
            (c, t, trace) if c == "RUNNING" && t == "RUNNING" && trace.is_null() => Ok(()),
            other => Err(format!("status {other:?}")),
        }
    });
    broker.stop();
}

/// Under `errors.tolerance=all` the refused record goes to the dead-letter topic with
/// Kafka Connect's headers (stage KAFKA_PRODUCE) and the rest arrive once, in order; the
/// task stays RUNNING.
#[test]
fn cdc_record_too_large_for_its_topic_goes_to_the_dead_letter_topic() {
    let (_d, broker) = refused_record_setup(
        "errors.tolerance = \"all\"\nerrors.deadletterqueue.topic.name = \"shop-dlq\"\nerrors.retry.timeout = -1\n",
    );
    let got = read_all(&broker.bootstrap, &["shop.a", "shop.b"], 5);
    assert_eq!(ids_of(&got, "shop.a"), vec![0, 2, 4], "{got:?}");
    assert_eq!(ids_of(&got, "shop.b"), vec![1, 5]);
    let dead = crate::rdkafka_client::read_partition(
        &broker.bootstrap,
        "shop-dlq",
        0,
        Offset::Beginning,
        1,
    );
    assert_eq!(dead.len(), 1, "one dead letter");
    let (key, value, _, headers) = &dead[0];
    assert_eq!(key.as_deref(), Some(&b"{\"id\":3}"[..]));
    let value: Value = serde_json::from_slice(value.as_deref().unwrap()).unwrap();
    assert_eq!(value["after"]["v"].as_str().map(str::len), Some(40_000));
    let header = |k: &str| {
        headers
            .iter()
            .find(|(hk, _)| hk == k)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_else(|| panic!("no header {k} in {headers:?}"))
    };
    assert_eq!(header("__connect.errors.stage"), "KAFKA_PRODUCE");
    assert_eq!(header("__connect.errors.topic"), "shop.b");
    assert_eq!(
        header("__connect.errors.exception.class.name"),
        "RecordTooLargeException"
    );
    assert_eq!(header("__connect.errors.connector.name"), "refused");
    assert!(header("__connect.errors.exception.message").contains("max.message.bytes 16384"));
    let (connector, task, trace) = rest_status(&broker.admin_url, "refused");
    assert_eq!(
        (connector.as_str(), task.as_str(), &trace),
        ("RUNNING", "RUNNING", &Value::Null)
    );
    broker.stop();
}

/// Issue 16: configs sqlite-cdc cannot honour are refused with the reason, never run half
/// right: a table without a primary key (its rowid key would change under VACUUM) unless
/// `message.key.columns` names its key, a key column the table lacks, and Debezium keys
/// weir does not implement (`provide.transaction.metadata`).
#[test]
fn cdc_refuses_a_table_without_a_key_and_unimplemented_debezium_keys() {
    let d = dirs();
    py_sql(
        &d.db,
        "CREATE TABLE plain(v TEXT); CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);",
    );
    let broker = start(&d);
    let admin = broker.admin_url.clone();
    let failed = |name: &str, tables: &str, extra: &str, want: &str| {
        cdc_config(
            &d,
            name,
            tables,
            &format!("errors.retry.timeout = 0\n{extra}"),
        );
        let trace = poll_for(&format!("{name} is FAILED"), 30, || match try_rest_status(
            &admin, name,
        )? {
            (c, t, trace) if c == "FAILED" && t == "FAILED" => Ok(trace),
            other => Err(format!("status {other:?}")),
        });
        let trace = trace.as_str().unwrap_or_default().to_string();
        assert!(trace.contains(want), "{name}: {trace}");
    };
    failed(
        "no-key",
        "plain, t",
        "",
        "table `plain` has no primary key: its rows would be keyed by rowid",
    );
    failed(
        "bad-key",
        "plain",
        "message.key.columns = \"plain:nosuch\"\n",
        "`message.key.columns`: table `plain` has no column `nosuch`",
    );
    failed(
        "tx-metadata",
        "t",
        "provide.transaction.metadata = true\n",
        "`provide.transaction.metadata` = `true`: a Debezium key sqlite-cdc does not implement",
    );
    // Nothing was installed in the user's database by the refused configs.
    let conn = rusqlite::Connection::open(&d.db).unwrap();
    let triggers: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'trigger'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(triggers, 0);
    broker.stop();
}

/// The `value` of each event of `topic` in `records` (tombstones skipped), parsed.
fn events(records: &[Rec], topic: &str) -> Vec<Value> {
    records
        .iter()
        .filter(|(t, _, _)| t == topic)
        .filter_map(|(_, _, v)| v.as_deref().map(|v| serde_json::from_str(v).unwrap()))
        .collect()
}

/// Issue 16, schema changes: with the connector running, ADD COLUMN then an insert,
/// RENAME COLUMN then an update, DROP COLUMN then an insert, and a rename of the primary
/// key then a delete — each pair in one python3 script, no pause between the DDL and the
/// change. The DROP succeeds in the user's database (triggers naming every column made
/// SQLite refuse it), and each event carries the table's new shape.
#[test]
fn cdc_events_after_add_rename_and_drop_column_carry_the_new_shape() {
    let d = dirs();
    py_sql(
        &d.db,
        "PRAGMA journal_mode=WAL;
         CREATE TABLE items(id INTEGER PRIMARY KEY, qty INTEGER, old TEXT);",
    );
    cdc_config(&d, "ddl", "items", "");
    let broker = start(&d);
    wait_for_triggers(&d.db, "items");
    let (b, topics) = (broker.bootstrap.as_str(), ["shop.items"]);
    let all = step(
        &d,
        b,
        &topics,
        "ALTER TABLE items ADD COLUMN note TEXT;
         INSERT INTO items VALUES (1, 1, 'x', 'hello');",
        1,
    );
    let e = events(&all, "shop.items");
    assert_eq!(e[0]["op"], "c");
    assert_eq!(
        e[0]["after"],
        serde_json::json!({"id": 1, "qty": 1, "old": "x", "note": "hello"}),
        "the insert after ADD COLUMN has the new column"
    );
    let all = step(
        &d,
        b,
        &topics,
        "ALTER TABLE items RENAME COLUMN qty TO amount;
         UPDATE items SET amount = 2 WHERE id = 1;",
        2,
    );
    let e = events(&all, "shop.items");
    assert_eq!(e[1]["op"], "u");
    assert_eq!(
        e[1]["after"],
        serde_json::json!({"id": 1, "amount": 2, "old": "x", "note": "hello"}),
        "the update after RENAME COLUMN uses the new name"
    );
    // py_sql fails the test if SQLite refuses the DROP.
    let all = step(
        &d,
        b,
        &topics,
        "ALTER TABLE items DROP COLUMN old;
         INSERT INTO items(id, amount, note) VALUES (2, 3, 'new');",
        3,
    );
    let e = events(&all, "shop.items");
    assert_eq!(e[2]["op"], "c");
    assert_eq!(
        e[2]["after"],
        serde_json::json!({"id": 2, "amount": 3, "note": "new"}),
        "the insert after DROP COLUMN lacks the column"
    );
    // The key's field names follow a rename of the primary key too.
    let all = step(
        &d,
        b,
        &topics,
        "ALTER TABLE items RENAME COLUMN id TO item_id;
         DELETE FROM items WHERE item_id = 2;",
        5,
    );
    assert_eq!(
        ops(&all, "shop.items")[3..],
        [
            kv("{\"item_id\":2}", "d"),
            kv("{\"item_id\":2}", "tombstone")
        ]
    );
    let e = events(&all, "shop.items");
    assert_eq!(e[3]["before"], serde_json::json!({"item_id": 2}));
    let (connector, task, trace) = rest_status(&broker.admin_url, "ddl");
    assert_eq!(
        (connector.as_str(), task.as_str(), &trace),
        ("RUNNING", "RUNNING", &Value::Null)
    );
    broker.stop();
}

/// Issue 16, coalescing: one transaction updates row 0 a thousand times while inserting
/// 100 other rows (each updated once), and creates, updates and deletes row 5000. Read
/// in one go, row 0 gives one event with its last value, row 5000 only its delete, every
/// other row one create with its updated value; change ids increase; a consumer
/// applying the events holds exactly the table.
#[test]
fn cdc_coalesces_changes_of_one_key_between_reads() {
    let d = dirs();
    py_sql(
        &d.db,
        "PRAGMA journal_mode=WAL; CREATE TABLE a(id INTEGER PRIMARY KEY, v TEXT);",
    );
    cdc_config(&d, "coalesce", "a", "");
    let broker = start(&d);
    wait_for_triggers(&d.db, "a");
    let mut script = String::from("BEGIN; INSERT INTO a VALUES (0, 'v0');\n");
    for i in 1..=1000 {
        script.push_str(&format!("UPDATE a SET v = 'u{i}' WHERE id = 0;\n"));
        if i % 10 == 0 {
            script.push_str(&format!("INSERT INTO a VALUES ({i}, 'n{i}');\n"));
        }
        if i % 10 == 5 && i > 10 {
            let k = i - 5;
            script.push_str(&format!("UPDATE a SET v = 'm{k}' WHERE id = {k};\n"));
        }
        if i == 500 {
            script.push_str(
                "INSERT INTO a VALUES (5000, 'gone'); UPDATE a SET v = 'x' WHERE id = 5000;\n",
            );
        }
        if i == 700 {
            script.push_str("DELETE FROM a WHERE id = 5000;\n");
        }
    }
    script.push_str("COMMIT;");
    // 1 + 100 creates + 1 delete and its tombstone.
    let all = step(&d, &broker.bootstrap, &["shop.a"], &script, 103);
    let by_key = |id: i64| -> Vec<(String, String)> {
        ops(&all, "shop.a")
            .into_iter()
            .filter(|(k, _)| *k == format!("{{\"id\":{id}}}"))
            .collect()
    };
    assert_eq!(by_key(0), vec![kv("{\"id\":0}", "c")], "row 0: one event");
    assert_eq!(
        by_key(5000),
        vec![kv("{\"id\":5000}", "d"), kv("{\"id\":5000}", "tombstone")],
        "a row created and deleted between reads: only its delete"
    );
    let e = events(&all, "shop.a");
    let last_of_0 = e.iter().find(|v| v["after"]["id"] == 0).unwrap();
    assert_eq!(last_of_0["after"]["v"], "u1000");
    let ids = change_ids(&all);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "commit order: {ids:?}");
    let mut model: BTreeMap<String, BTreeMap<i64, String>> = BTreeMap::new();
    for r in &all {
        apply(&mut model, r);
    }
    assert_eq!(model.remove("a").unwrap_or_default(), table(&d.db, "a"));
    assert_eq!(table(&d.db, "a").len(), 101);
    broker.stop();
}

/// Issue 16, upgrade: a database the earlier connector captured holds its triggers
/// (whole rows as `json_object`, every column named) and log rows in that format. At
/// `open` the new connector emits those rows as logged (`before` the whole row) and
/// replaces the triggers, so a DROP COLUMN the old ones blocked succeeds.
#[test]
fn cdc_upgrade_emits_old_log_rows_as_logged_and_replaces_old_triggers() {
    let d = dirs();
    py_sql(
        &d.db,
        "PRAGMA journal_mode=WAL;
         CREATE TABLE items(id INTEGER PRIMARY KEY, qty INTEGER, old TEXT);",
    );
    cdc_config(&d, "upgrade", "items", "");
    let broker = start(&d);
    wait_for_triggers(&d.db, "items");
    let b = broker.bootstrap.clone();
    step(
        &d,
        &b,
        &["shop.items"],
        "INSERT INTO items VALUES (1, 1, 'a');",
        1,
    );
    broker.stop();
    // What the earlier version left behind: its trigger, and a delete it logged.
    py_sql(
        &d.db,
        "DROP TRIGGER _weir_cdc_items_ad;
         CREATE TRIGGER _weir_cdc_items_ad AFTER DELETE ON items BEGIN
           INSERT INTO _weir_cdc_log(tbl, op, key, before, after, ts_ms) VALUES ('items', 'd',
             json_object('id', OLD.id), json_object('id', OLD.id, 'qty', OLD.qty, 'old', OLD.old),
             NULL, 0);
         END;
         DELETE FROM items WHERE id = 1;",
    );
    let broker = start(&d);
    let all = read_all(&broker.bootstrap, &["shop.items"], 3);
    assert_eq!(
        ops(&all, "shop.items"),
        vec![
            kv("{\"id\":1}", "c"),
            kv("{\"id\":1}", "d"),
            kv("{\"id\":1}", "tombstone")
        ]
    );
    let e = events(&all, "shop.items");
    assert_eq!(
        e[1]["before"],
        serde_json::json!({"id": 1, "qty": 1, "old": "a"})
    );
    // The connector has opened (it emitted the delete): the old trigger is gone.
    py_sql(
        &d.db,
        "ALTER TABLE items DROP COLUMN old; INSERT INTO items VALUES (2, 2);",
    );
    let all = read_all(&broker.bootstrap, &["shop.items"], 4);
    let e = events(&all, "shop.items");
    assert_eq!(e[2]["after"], serde_json::json!({"id": 2, "qty": 2}));
    broker.stop();
}

/// A BLOB primary key: the earlier triggers' `json_object` of it failed the writer's own
/// INSERT ("JSON cannot hold BLOB values"). Now the insert, an update and a delete go
/// through, and the events' key and row carry the BLOB as hex text.
#[test]
fn cdc_blob_keys_never_fail_the_writer() {
    let d = dirs();
    py_sql(
        &d.db,
        "PRAGMA journal_mode=WAL;
         CREATE TABLE files(k BLOB PRIMARY KEY, v TEXT) WITHOUT ROWID;",
    );
    cdc_config(&d, "blobs", "files", "");
    let broker = start(&d);
    wait_for_triggers(&d.db, "files");
    let (b, topics) = (broker.bootstrap.as_str(), ["shop.files"]);
    step(
        &d,
        b,
        &topics,
        "INSERT INTO files VALUES (x'00ff', 'one');",
        1,
    );
    step(
        &d,
        b,
        &topics,
        "UPDATE files SET v = 'two' WHERE k = x'00ff';",
        2,
    );
    let all = step(&d, b, &topics, "DELETE FROM files WHERE k = x'00ff';", 4);
    let key = "{\"k\":\"00FF\"}";
    assert_eq!(
        ops(&all, "shop.files"),
        vec![
            kv(key, "c"),
            kv(key, "u"),
            kv(key, "d"),
            kv(key, "tombstone")
        ]
    );
    let e = events(&all, "shop.files");
    assert_eq!(e[1]["after"], serde_json::json!({"k": "00FF", "v": "two"}));
    assert_eq!(e[2]["before"], serde_json::json!({"k": "00FF"}));
    broker.stop();
}

/// The documented way around the one DDL the triggers still block: a column of a
/// `CREATE UNIQUE INDEX` is named (so a REPLACE through the index logs its delete), and
/// once the index is dropped the connector re-creates its triggers without it, so the
/// column can be dropped. A trigger the user drops comes back at the next read.
#[test]
fn cdc_a_dropped_unique_index_releases_its_column_and_dropped_triggers_come_back() {
    let d = dirs();
    py_sql(
        &d.db,
        "PRAGMA journal_mode=WAL;
         CREATE TABLE items(id INTEGER PRIMARY KEY, sku TEXT, qty INTEGER);
         CREATE UNIQUE INDEX items_sku ON items(sku);",
    );
    cdc_config(&d, "unique", "items", "");
    let broker = start(&d);
    wait_for_triggers(&d.db, "items");
    let (b, topics) = (broker.bootstrap.as_str(), ["shop.items"]);
    step(&d, b, &topics, "INSERT INTO items VALUES (1, 'a', 1);", 1);
    let all = step(&d, b, &topics, "REPLACE INTO items VALUES (2, 'a', 2);", 4);
    assert_eq!(
        ops(&all, "shop.items")[1..],
        [
            kv("{\"id\":1}", "d"),
            kv("{\"id\":1}", "tombstone"),
            kv("{\"id\":2}", "c")
        ]
    );
    py_sql(&d.db, "DROP INDEX items_sku;");
    wait_until("the triggers no longer name sku", 30, || {
        let conn = rusqlite::Connection::open(&d.db).unwrap();
        let (all, naming): (i64, i64) = conn
            .query_row(
                "SELECT count(*), count(*) FILTER (WHERE sql LIKE '%sku%') FROM sqlite_master \
                 WHERE type = 'trigger' AND tbl_name = 'items'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        all == 5 && naming == 0
    });
    let all = step(
        &d,
        b,
        &topics,
        "ALTER TABLE items DROP COLUMN sku; INSERT INTO items VALUES (3, 3);",
        5,
    );
    assert_eq!(
        events(&all, "shop.items")[3]["after"],
        serde_json::json!({"id": 3, "qty": 3})
    );
    py_sql(&d.db, "DROP TRIGGER _weir_cdc_items_ad;");
    wait_for_triggers(&d.db, "items");
    let all = step(&d, b, &topics, "DELETE FROM items WHERE id = 3;", 7);
    assert_eq!(
        ops(&all, "shop.items")[5..],
        [kv("{\"id\":3}", "d"), kv("{\"id\":3}", "tombstone")]
    );
    broker.stop();
}
