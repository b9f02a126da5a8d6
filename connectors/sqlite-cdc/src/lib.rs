//! weir's built-in `sqlite-cdc` connector: every committed INSERT, UPDATE and DELETE on
//! the configured tables of a SQLite database another process writes, as Debezium's
//! change-event envelope in JSON, one topic per table.
//!
//! Keys: `database` (required; the file — the one the runtime lets the `sqlite`
//! interface open), `tables` (required, comma-separated), `topic.prefix` (required; the
//! topic of table `t` is `<topic.prefix>.t`), `snapshot.mode` (`initial`, the default: all
//! existing rows as `op=r` first; `never`), `tombstones.on.delete` (default true),
//! `message.key.columns` (Debezium's: `table:col1,col2;table2:col` — the record key of
//! those tables; others are keyed by their primary key).
//!
//! A table without a primary key and without `message.key.columns` is refused at `open`:
//! its only key would be the rowid, which VACUUM may renumber, so one row would change
//! key. Debezium keys this connector does not implement and that would change what is
//! captured (`provide.transaction.metadata`, `include.schema.changes`, `*.include.list` /
//! `*.exclude.list`, `skipped.operations`, column masking, ...) are refused at `open` when
//! set to anything but their "off" value, never silently ignored.
//!
//! Capture: change-log triggers. `open` installs, for each table, AFTER INSERT / UPDATE /
//! DELETE triggers writing the old and new row (`json_object`) into `_weir_cdc_log`, whose
//! `INTEGER PRIMARY KEY AUTOINCREMENT` id is the change id. SQLite has one writer at a
//! time and the log insert is part of the writer's transaction, so change ids are in
//! commit order, a rolled-back change never appears, and a reader that has seen id N will
//! never later see a committed id below N. The triggers live in the database: a change
//! committed while the connector is down waits in the log. Why not the session extension
//! (it records only in the connection that enabled it — the writer's, which we do not
//! own) or WAL reading (frames are pages, not rows; a checkpoint may recycle them before
//! we read them; the format is not an API): see ARCHITECTURE.md.
//!
//! Special cases:
//! - `INSERT OR REPLACE` / `REPLACE` deletes conflicting rows without firing DELETE
//!   triggers. A BEFORE INSERT trigger copies every row that conflicts on the primary key
//!   or on a (non-partial, column) UNIQUE index into `_weir_cdc_pending`; the AFTER INSERT
//!   trigger (which fires only if the row was inserted, so not for `INSERT OR IGNORE`)
//!   turns them into a delete of each removed row with another key, then an update (same
//!   key was replaced) or a create. Stale pending rows (an insert that was ignored) are
//!   cleared by the next BEFORE INSERT.
//! - An UPDATE changing the key logs a delete of the old key then a create of the new one.
//! - Schema changes: before each read of the log the connector compares
//!   `PRAGMA schema_version`; when a table's columns changed it re-creates its triggers
//!   (in one write transaction). Changes committed between the `ALTER TABLE` and that
//!   moment carry the old column set.
//!
//! Offsets: source partition `{"database": path}`, offset `{"change_id": N, "snapshot":
//! "done" | "running"}`. `commit` deletes log rows up to the committed change id. A
//! restart during the snapshot takes the snapshot again (duplicates `op=r`, at least
//! once). BLOB values appear in JSON as hex text (JSON has no bytes).

use std::cell::RefCell;
use std::collections::VecDeque;

wit_bindgen::generate!({
    world: "source-connector",
    path: "../../wit",
});

use exports::weir::plugin::source::Guest;
use weir::plugin::connector_types::{SourcePosition, SourceRecord};
use weir::plugin::log::{log, Level};
use weir::plugin::sqlite::{self as sql, Value};
use weir::plugin::types::{PluginError, Record};

/// The change log table the triggers write.
const LOG_TABLE: &str = "_weir_cdc_log";
/// Rows a REPLACE is about to remove (see the module doc).
const PENDING_TABLE: &str = "_weir_cdc_pending";

/// Milliseconds since the Unix epoch, in SQLite, at trigger time.
const TS_SQL: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

/// One captured table.
#[derive(Clone, PartialEq, Eq)]
struct Table {
    name: String,
    columns: Vec<String>,
    /// Primary key columns in key order; empty = a rowid table without a declared one.
    pk: Vec<String>,
    /// The columns of the record key: `message.key.columns`' entry for the table, else
    /// the primary key. Never empty (such a table is refused: see [`describe`]).
    key: Vec<String>,
    /// Column lists of UNIQUE indexes other than the primary key.
    uniques: Vec<Vec<String>>,
}

struct Snapshot {
    change_id: i64,
    table: usize,
    done_rows: i64,
}

struct State {
    db: u32,
    path: String,
    prefix: String,
    table_names: Vec<String>,
    /// `message.key.columns`.
    keys: KeyColumns,
    tables: Vec<Table>,
    tombstones: bool,
    last_id: i64,
    schema_version: i64,
    snapshot: Option<Snapshot>,
    queue: VecDeque<SourceRecord>,
}

thread_local! {
    static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
}

fn error(message: String) -> PluginError {
    PluginError {
        message,
        record_index: None,
    }
}

fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn exec(db: u32, text: &str, params: &[Value]) -> Result<u64, PluginError> {
    sql::execute(db, text, params).map_err(error)
}

fn query(db: u32, text: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, PluginError> {
    sql::query(db, text, params).map(|r| r.rows).map_err(error)
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Integer(i) => *i,
        Value::Real(f) => *f as i64,
        Value::Text(t) => t.parse().unwrap_or(0),
        Value::Null | Value::Blob(_) => 0,
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::Text(t) => Some(t.clone()),
        Value::Integer(i) => Some(i.to_string()),
        Value::Real(f) => Some(f.to_string()),
        Value::Null | Value::Blob(_) => None,
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Reads a table's columns, primary key and UNIQUE indexes; its key is `key_columns`
/// (from `message.key.columns`) when given, else its primary key.
///
/// Errors: no such table; a key column it does not have; no primary key and no key
/// columns (its rows would be keyed by rowid, which VACUUM may renumber, so one row would
/// change key).
fn describe(db: u32, name: &str, key_columns: Option<&[String]>) -> Result<Table, PluginError> {
    let cols = query(
        db,
        "SELECT name, pk FROM pragma_table_info(?1) ORDER BY cid",
        &[Value::Text(name.into())],
    )?;
    if cols.is_empty() {
        return Err(error(format!("table `{name}` does not exist")));
    }
    let columns: Vec<String> = cols.iter().filter_map(|r| text(&r[0])).collect();
    let mut pk: Vec<(i64, String)> = cols
        .iter()
        .filter(|r| int(&r[1]) > 0)
        .filter_map(|r| text(&r[0]).map(|n| (int(&r[1]), n)))
        .collect();
    pk.sort();
    let mut uniques = Vec::new();
    let indexes = query(
        db,
        "SELECT name FROM pragma_index_list(?1) WHERE \"unique\" = 1 AND partial = 0 AND origin <> 'pk'",
        &[Value::Text(name.into())],
    )?;
    for idx in indexes.iter().filter_map(|r| text(&r[0])) {
        let parts = query(
            db,
            "SELECT name FROM pragma_index_info(?1) ORDER BY seqno",
            &[Value::Text(idx)],
        )?;
        // An index on an expression has a NULL column name: not comparable here.
        let names: Vec<Option<String>> = parts.iter().map(|r| text(&r[0])).collect();
        if !names.is_empty() && names.iter().all(Option::is_some) {
            uniques.push(names.into_iter().flatten().collect());
        }
    }
    let pk: Vec<String> = pk.into_iter().map(|(_, n)| n).collect();
    let key = match key_columns {
        Some(k) => {
            if let Some(missing) = k.iter().find(|c| !columns.contains(c)) {
                return Err(error(format!(
                    "`message.key.columns`: table `{name}` has no column `{missing}`"
                )));
            }
            k.to_vec()
        }
        None if pk.is_empty() => {
            return Err(error(format!(
                "table `{name}` has no primary key: its rows would be keyed by rowid, which \
                 VACUUM may renumber (one row changing key); declare a PRIMARY KEY or name \
                 its key columns with `message.key.columns` (e.g. `{name}:col1,col2`)"
            )))
        }
        None => pk.clone(),
    };
    Ok(Table {
        name: name.to_string(),
        columns,
        pk,
        key,
        uniques,
    })
}

impl Table {
    /// `json_object(...)` of the row `alias` (`NEW`, `OLD`, or the table), BLOBs as hex.
    fn row_json(&self, alias: &str) -> String {
        let fields: Vec<String> = self
            .columns
            .iter()
            .map(|c| {
                let col = format!("{alias}.{}", ident(c));
                format!(
                    "{}, CASE WHEN typeof({col}) = 'blob' THEN hex({col}) ELSE {col} END",
                    literal(c)
                )
            })
            .collect();
        format!("json_object({})", fields.join(", "))
    }

    /// `json_object(...)` of the key of row `alias`: its key columns.
    fn key_json(&self, alias: &str) -> String {
        let fields: Vec<String> = self
            .key
            .iter()
            .map(|c| format!("{}, {alias}.{}", literal(c), ident(c)))
            .collect();
        format!("json_object({})", fields.join(", "))
    }

    /// True (in SQL) when rows `a` and `b` have the same key.
    fn same_key(&self, a: &str, b: &str) -> String {
        let parts: Vec<String> = self
            .key
            .iter()
            .map(|c| format!("{a}.{} IS {b}.{}", ident(c), ident(c)))
            .collect();
        parts.join(" AND ")
    }

    fn trigger(&self, suffix: &str) -> String {
        ident(&format!("_weir_cdc_{}_{suffix}", self.name))
    }

    /// The statements that (re)create this table's triggers.
    fn trigger_sql(&self) -> String {
        let t = ident(&self.name);
        let tl = literal(&self.name);
        let mut s = String::new();
        for suffix in ["bi", "ai", "au", "auk", "ad"] {
            s.push_str(&format!(
                "DROP TRIGGER IF EXISTS {};\n",
                self.trigger(suffix)
            ));
        }
        let log_cols = format!("{LOG_TABLE}(tbl, op, key, before, after, ts_ms)");
        // Rows an insert would conflict with (REPLACE removes them without a trigger).
        let mut conflicts = Vec::new();
        if self.pk.is_empty() {
            conflicts.push(format!("{t}.rowid = NEW.rowid"));
        } else {
            let parts: Vec<String> = self
                .pk
                .iter()
                .map(|c| format!("{t}.{} = NEW.{}", ident(c), ident(c)))
                .collect();
            conflicts.push(format!("({})", parts.join(" AND ")));
        }
        for u in &self.uniques {
            let parts: Vec<String> = u
                .iter()
                .map(|c| format!("{t}.{} = NEW.{}", ident(c), ident(c)))
                .collect();
            conflicts.push(format!("({})", parts.join(" AND ")));
        }
        s.push_str(&format!(
            "CREATE TRIGGER {bi} BEFORE INSERT ON {t} BEGIN \
               DELETE FROM {PENDING_TABLE} WHERE tbl = {tl}; \
               INSERT INTO {PENDING_TABLE}(tbl, key, before) SELECT {tl}, {key_t}, {row_t} FROM {t} WHERE {cond}; \
             END;\n",
            bi = self.trigger("bi"),
            key_t = self.key_json(&t),
            row_t = self.row_json(&t),
            cond = conflicts.join(" OR "),
        ));
        let key_new = self.key_json("NEW");
        s.push_str(&format!(
            "CREATE TRIGGER {ai} AFTER INSERT ON {t} BEGIN \
               INSERT INTO {log_cols} SELECT {tl}, 'd', key, before, NULL, {TS_SQL} FROM {PENDING_TABLE} \
                 WHERE tbl = {tl} AND key IS NOT {key_new} ORDER BY rowid; \
               INSERT INTO {log_cols} SELECT {tl}, \
                 CASE WHEN EXISTS (SELECT 1 FROM {PENDING_TABLE} WHERE tbl = {tl} AND key = {key_new}) THEN 'u' ELSE 'c' END, \
                 {key_new}, (SELECT before FROM {PENDING_TABLE} WHERE tbl = {tl} AND key = {key_new} LIMIT 1), {row_new}, {TS_SQL}; \
               DELETE FROM {PENDING_TABLE} WHERE tbl = {tl}; \
             END;\n",
            ai = self.trigger("ai"),
            row_new = self.row_json("NEW"),
        ));
        s.push_str(&format!(
            "CREATE TRIGGER {au} AFTER UPDATE ON {t} WHEN {same} BEGIN \
               INSERT INTO {log_cols} VALUES ({tl}, 'u', {key_new}, {row_old}, {row_new}, {TS_SQL}); \
             END;\n",
            au = self.trigger("au"),
            same = self.same_key("OLD", "NEW"),
            row_old = self.row_json("OLD"),
            row_new = self.row_json("NEW"),
        ));
        s.push_str(&format!(
            "CREATE TRIGGER {auk} AFTER UPDATE ON {t} WHEN NOT ({same}) BEGIN \
               INSERT INTO {log_cols} VALUES ({tl}, 'd', {key_old}, {row_old}, NULL, {TS_SQL}); \
               INSERT INTO {log_cols} VALUES ({tl}, 'c', {key_new}, NULL, {row_new}, {TS_SQL}); \
             END;\n",
            auk = self.trigger("auk"),
            same = self.same_key("OLD", "NEW"),
            key_old = self.key_json("OLD"),
            row_old = self.row_json("OLD"),
            row_new = self.row_json("NEW"),
        ));
        s.push_str(&format!(
            "CREATE TRIGGER {ad} AFTER DELETE ON {t} BEGIN \
               INSERT INTO {log_cols} VALUES ({tl}, 'd', {key_old}, {row_old}, NULL, {TS_SQL}); \
             END;\n",
            ad = self.trigger("ad"),
            key_old = self.key_json("OLD"),
            row_old = self.row_json("OLD"),
        ));
        s
    }
}

fn schema_version(db: u32) -> Result<i64, PluginError> {
    let rows = query(db, "PRAGMA schema_version", &[])?;
    Ok(rows.first().and_then(|r| r.first()).map(int).unwrap_or(0))
}

/// Describes every table and (re)creates the triggers of those whose shape differs from
/// `known` (all of them when `known` is empty), in one write transaction.
fn install(
    db: u32,
    names: &[String],
    keys: &KeyColumns,
    known: &[Table],
) -> Result<Vec<Table>, PluginError> {
    exec(db, "BEGIN IMMEDIATE", &[])?;
    let result = (|| {
        let mut tables = Vec::with_capacity(names.len());
        let mut ddl = String::new();
        for name in names {
            let key = keys.iter().find(|(t, _)| t == name).map(|(_, k)| &k[..]);
            let t = describe(db, name, key)?;
            if !known.contains(&t) {
                ddl.push_str(&t.trigger_sql());
            }
            tables.push(t);
        }
        if !ddl.is_empty() {
            exec(db, &ddl, &[])?;
        }
        Ok(tables)
    })();
    match result {
        Ok(tables) => {
            exec(db, "COMMIT", &[])?;
            Ok(tables)
        }
        Err(e) => {
            let _ = exec(db, "ROLLBACK", &[]);
            Err(e)
        }
    }
}

/// `message.key.columns` (Debezium's key): the key columns named for each table.
type KeyColumns = Vec<(String, Vec<String>)>;

/// Parses `message.key.columns`: `<table>:<column>[,<column>...]` entries separated by
/// `;` (Debezium's syntax; a table may be written `main.<table>`), each table one of
/// `tables`.
///
/// Errors: an entry without `:` or columns, a table not captured, a table named twice.
fn key_columns(value: Option<&str>, tables: &[String]) -> Result<KeyColumns, PluginError> {
    let mut out: KeyColumns = Vec::new();
    for entry in value
        .unwrap_or("")
        .split(';')
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        let bad = |why: &str| {
            error(format!(
                "`message.key.columns`: `{entry}` {why} (expected `table:col1,col2;table2:col`)"
            ))
        };
        let (table, columns) = entry.split_once(':').ok_or_else(|| bad("has no `:`"))?;
        let table = table.trim();
        let table = table.strip_prefix("main.").unwrap_or(table);
        if !tables.iter().any(|t| t == table) {
            return Err(bad("names a table that is not in `tables`"));
        }
        if out.iter().any(|(t, _)| t == table) {
            return Err(bad("names a table twice"));
        }
        let columns: Vec<String> = columns
            .split(',')
            .map(|c| c.trim().to_string())
            .filter(|c| !c.is_empty())
            .collect();
        if columns.is_empty() {
            return Err(bad("names no column"));
        }
        out.push((table.to_string(), columns));
    }
    Ok(out)
}

/// Debezium connector keys that change what is captured or emitted, which this connector
/// does not implement: set to anything but their default, they are refused rather than
/// silently ignored. (Each with the value that means "off".)
const UNIMPLEMENTED_KEYS: &[(&str, &str)] = &[
    ("provide.transaction.metadata", "false"),
    ("include.schema.changes", "false"),
    ("table.include.list", ""),
    ("table.exclude.list", ""),
    ("column.include.list", ""),
    ("column.exclude.list", ""),
    ("skipped.operations", ""),
    ("snapshot.select.statement.overrides", ""),
    ("event.processing.failure.handling.mode", "fail"),
];

/// Refuses a key of [`UNIMPLEMENTED_KEYS`] set to a value other than its default, or a
/// column masking / truncation / hashing key (`column.mask.*`, `column.truncate.to.*`,
/// `column.mask.hash.*`).
fn refuse_unimplemented(config: &[(String, String)]) -> Result<(), PluginError> {
    for (key, value) in config {
        let value = value.trim();
        let off = UNIMPLEMENTED_KEYS
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, off)| *off);
        let refused = match off {
            Some(off) => !value.is_empty() && !value.eq_ignore_ascii_case(off),
            None => key.starts_with("column.mask.") || key.starts_with("column.truncate.to."),
        };
        if refused {
            return Err(error(format!(
                "`{key}` = `{value}`: a Debezium key sqlite-cdc does not implement; remove it \
                 (it is refused rather than ignored, as it would change what is captured)"
            )));
        }
    }
    Ok(())
}

fn last_change_id(db: u32) -> Result<i64, PluginError> {
    let rows = query(
        db,
        "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = ?1), 0)",
        &[Value::Text(LOG_TABLE.into())],
    )?;
    Ok(rows.first().and_then(|r| r.first()).map(int).unwrap_or(0))
}

fn config_value(config: &[(String, String)], key: &str) -> Option<String> {
    config
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

impl State {
    fn partition(&self) -> Vec<(String, String)> {
        vec![("database".into(), self.path.clone())]
    }

    fn record(
        &self,
        table: &str,
        key: Option<String>,
        value: Option<String>,
        change_id: i64,
        snapshot_done: bool,
    ) -> SourceRecord {
        SourceRecord {
            record: Record {
                key: key.map(String::into_bytes),
                value: value.map(String::into_bytes),
                headers: Vec::new(),
                timestamp_ms: 0,
            },
            source_partition: self.partition(),
            source_offset: vec![
                ("change_id".into(), change_id.to_string()),
                (
                    "snapshot".into(),
                    if snapshot_done { "done" } else { "running" }.into(),
                ),
            ],
            topic: Some(format!("{}.{}", self.prefix, table)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn envelope(
        &self,
        table: &str,
        op: &str,
        before: Option<&str>,
        after: Option<&str>,
        change_id: i64,
        ts_ms: i64,
        snapshot: bool,
    ) -> String {
        format!(
            "{{\"before\":{},\"after\":{},\"source\":{{\"connector\":\"sqlite\",\"db\":{},\"table\":{},\"change_id\":{change_id},\"ts_ms\":{ts_ms},\"snapshot\":\"{snapshot}\"}},\"op\":\"{op}\",\"ts_ms\":{}}}",
            before.unwrap_or("null"),
            after.unwrap_or("null"),
            json_string(&self.path),
            json_string(table),
            now_ms(),
        )
    }

    /// Queues the next page of the snapshot (ending it after the last table).
    fn fill_snapshot(&mut self, max: u32) -> Result<(), PluginError> {
        let Some(snap) = self.snapshot.as_ref() else {
            return Ok(());
        };
        let (change_id, index, done_rows) = (snap.change_id, snap.table, snap.done_rows);
        let Some(table) = self.tables.get(index).cloned() else {
            exec(self.db, "COMMIT", &[])?;
            self.snapshot = None;
            self.last_id = change_id;
            log(
                Level::Info,
                &format!("snapshot of {} done at change id {change_id}", self.path),
            );
            return Ok(());
        };
        let t = ident(&table.name);
        let order = if table.pk.is_empty() {
            "rowid".to_string()
        } else {
            table
                .pk
                .iter()
                .map(|c| ident(c))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let page = i64::from(max.max(1));
        let rows = query(
            self.db,
            &format!(
                "SELECT {}, {} FROM {t} ORDER BY {order} LIMIT ?1 OFFSET ?2",
                table.key_json(&t),
                table.row_json(&t)
            ),
            &[Value::Integer(page), Value::Integer(done_rows)],
        )?;
        let ts = now_ms();
        let last_table = index + 1 == self.tables.len();
        let n = rows.len();
        for (i, row) in rows.iter().enumerate() {
            let done = last_table && n < page as usize && i + 1 == n;
            let value = self.envelope(
                &table.name,
                "r",
                None,
                text(&row[1]).as_deref(),
                change_id,
                ts,
                true,
            );
            let rec = self.record(&table.name, text(&row[0]), Some(value), change_id, done);
            self.queue.push_back(rec);
        }
        if let Some(s) = self.snapshot.as_mut() {
            if (n as i64) < page {
                s.table += 1;
                s.done_rows = 0;
            } else {
                s.done_rows += n as i64;
            }
        }
        Ok(())
    }

    /// Re-creates triggers of tables whose schema changed since the last look.
    fn follow_schema(&mut self) -> Result<(), PluginError> {
        let version = schema_version(self.db)?;
        if version != self.schema_version {
            let tables = install(self.db, &self.table_names, &self.keys, &self.tables)?;
            if tables != self.tables {
                log(
                    Level::Info,
                    "table schema changed: change-log triggers re-created",
                );
            }
            self.tables = tables;
            self.schema_version = schema_version(self.db)?;
        }
        Ok(())
    }

    /// Queues the next changes of the log.
    fn fill_stream(&mut self, max: u32) -> Result<(), PluginError> {
        self.follow_schema()?;
        let rows = query(
            self.db,
            &format!(
                "SELECT id, tbl, op, key, before, after, ts_ms FROM {LOG_TABLE} WHERE id > ?1 ORDER BY id LIMIT ?2"
            ),
            &[Value::Integer(self.last_id), Value::Integer(i64::from(max.max(1)))],
        )?;
        for row in rows {
            let id = int(&row[0]);
            let table = text(&row[1]).unwrap_or_default();
            let op = text(&row[2]).unwrap_or_default();
            let key = text(&row[3]);
            let before = text(&row[4]);
            let after = text(&row[5]);
            let value = self.envelope(
                &table,
                &op,
                before.as_deref(),
                after.as_deref(),
                id,
                int(&row[6]),
                false,
            );
            let tombstone = op == "d" && self.tombstones;
            // A delete's offset stays before it until its tombstone is written too.
            let offset = if tombstone { id - 1 } else { id };
            self.queue
                .push_back(self.record(&table, key.clone(), Some(value), offset, true));
            if tombstone {
                self.queue
                    .push_back(self.record(&table, key, None, id, true));
            }
            self.last_id = id;
        }
        Ok(())
    }
}

fn with_state<T>(f: impl FnOnce(&mut State) -> Result<T, PluginError>) -> Result<T, PluginError> {
    STATE.with(|s| match s.borrow_mut().as_mut() {
        Some(state) => f(state),
        None => Err(error("called before open".into())),
    })
}

struct SqliteCdc;

impl Guest for SqliteCdc {
    fn open(
        config: Vec<(String, String)>,
        offsets: Vec<SourcePosition>,
    ) -> Result<(), PluginError> {
        let need = |k: &str| {
            config_value(&config, k).ok_or_else(|| error(format!("missing required key `{k}`")))
        };
        let path = need("database")?;
        let prefix = need("topic.prefix")?;
        let table_names: Vec<String> = need("tables")?
            .split(',')
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
            .collect();
        let snapshot_initial = match config_value(&config, "snapshot.mode").as_deref() {
            None | Some("initial") => true,
            Some("never") => false,
            Some(other) => {
                return Err(error(format!(
                    "`snapshot.mode`: `{other}` is not one of initial, never"
                )))
            }
        };
        refuse_unimplemented(&config)?;
        let keys = key_columns(
            config_value(&config, "message.key.columns").as_deref(),
            &table_names,
        )?;
        let tombstones = match config_value(&config, "tombstones.on.delete").as_deref() {
            None | Some("true") => true,
            Some("false") => false,
            Some(other) => {
                return Err(error(format!(
                    "`tombstones.on.delete`: `{other}` is not true or false"
                )))
            }
        };
        let db = sql::open(&path).map_err(error)?;
        // WAL: the connector reads while the writer writes (persistent in the file).
        query(db, "PRAGMA journal_mode = WAL", &[])?;
        exec(
            db,
            &format!(
                "CREATE TABLE IF NOT EXISTS {LOG_TABLE}(id INTEGER PRIMARY KEY AUTOINCREMENT, \
                   tbl TEXT NOT NULL, op TEXT NOT NULL, key TEXT, before TEXT, after TEXT, ts_ms INTEGER NOT NULL); \
                 CREATE TABLE IF NOT EXISTS {PENDING_TABLE}(tbl TEXT NOT NULL, key TEXT, before TEXT);"
            ),
            &[],
        )?;
        // Where `snapshot.mode=never` starts: read before the triggers exist, so a change
        // committed right after they do is never skipped.
        let start_id = last_change_id(db)?;
        let tables = install(db, &table_names, &keys, &[])?;
        let schema_version = schema_version(db)?;
        let stored = offsets
            .iter()
            .find(|p| {
                p.source_partition
                    .iter()
                    .any(|(k, v)| k == "database" && *v == path)
            })
            .map(|p| {
                let get = |k: &str| {
                    p.source_offset
                        .iter()
                        .find(|(key, _)| key == k)
                        .map(|(_, v)| v.clone())
                };
                (
                    get("change_id").and_then(|c| c.parse::<i64>().ok()),
                    get("snapshot"),
                )
            });
        let mut state = State {
            db,
            path: path.clone(),
            prefix,
            table_names,
            keys,
            tables,
            tombstones,
            last_id: 0,
            schema_version,
            snapshot: None,
            queue: VecDeque::new(),
        };
        match stored {
            Some((Some(id), Some(s))) if s == "done" => {
                state.last_id = id;
                log(
                    Level::Info,
                    &format!("{path}: resuming after change id {id}"),
                );
            }
            _ if snapshot_initial => {
                // One read transaction: the change id and every row as of one moment.
                exec(db, "BEGIN", &[])?;
                let change_id = last_change_id(db)?;
                log(
                    Level::Info,
                    &format!("{path}: snapshot at change id {change_id}"),
                );
                state.snapshot = Some(Snapshot {
                    change_id,
                    table: 0,
                    done_rows: 0,
                });
            }
            _ => {
                state.last_id = start_id;
                log(
                    Level::Info,
                    &format!(
                        "{path}: no snapshot; streaming after change id {}",
                        state.last_id
                    ),
                );
            }
        }
        STATE.with(|s| *s.borrow_mut() = Some(state));
        Ok(())
    }

    fn poll(max_records: u32) -> Result<Vec<SourceRecord>, PluginError> {
        with_state(|s| {
            if s.queue.is_empty() {
                if s.snapshot.is_some() {
                    s.fill_snapshot(max_records)?;
                } else {
                    s.fill_stream(max_records)?;
                }
            }
            let n = s.queue.len().min(max_records as usize);
            Ok(s.queue.drain(..n).collect())
        })
    }

    fn commit(offsets: Vec<SourcePosition>) {
        let _ = with_state(|s| {
            if s.snapshot.is_some() {
                return Ok(());
            }
            for p in &offsets {
                if p.source_partition != s.partition() {
                    continue;
                }
                let done = p
                    .source_offset
                    .iter()
                    .any(|(k, v)| k == "snapshot" && v == "done");
                let id = p
                    .source_offset
                    .iter()
                    .find(|(k, _)| k == "change_id")
                    .and_then(|(_, v)| v.parse::<i64>().ok());
                if let (true, Some(id)) = (done, id) {
                    if let Err(e) = exec(
                        s.db,
                        &format!("DELETE FROM {LOG_TABLE} WHERE id <= ?1"),
                        &[Value::Integer(id)],
                    ) {
                        log(
                            Level::Warn,
                            &format!("cannot trim {LOG_TABLE}: {}", e.message),
                        );
                    }
                }
            }
            Ok(())
        });
    }

    fn close() {
        STATE.with(|s| {
            if let Some(state) = s.borrow_mut().take() {
                sql::close(state.db);
            }
        });
    }
}

export!(SqliteCdc);
