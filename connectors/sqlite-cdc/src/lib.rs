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
//! Capture: change-log triggers that name only key columns. `open` installs, for each
//! table, AFTER INSERT / UPDATE / DELETE triggers writing `(change id, table, op, key,
//! ts_ms)` into `_weir_cdc_log` — the key as `json_array` of the key values (a BLOB as
//! `["<hex>"]`: `json_array` refuses BLOBs, which would fail the writer's statement) —
//! whose `INTEGER PRIMARY KEY AUTOINCREMENT` id is the change id. SQLite has one writer at
//! a time and the log insert is part of the writer's transaction, so change ids are in
//! commit order, a rolled-back change never appears, and a reader that has seen id N will
//! never later see a committed id below N. The triggers live in the database: a change
//! committed while the connector is down waits in the log. Why not the session extension
//! (it records only in the connection that enabled it — the writer's, which we do not
//! own) or WAL reading (frames are pages, not rows; a checkpoint may recycle them before
//! we read them; the format is not an API): see `docs/connectors.md`.
//!
//! Row images are read when the log is read (Debezium-for-Postgres' `REPLICA IDENTITY
//! DEFAULT` shape): in one read transaction the connector reads a page of the log and,
//! for each create/update, `SELECT *` of the row by its key from the table as it is now,
//! so the event has the table's current columns and names. `before` is null for creates
//! and updates and holds only the key columns for deletes; `after` is the current row.
//! Changes of one key within one read coalesce: a run of creates/updates emits one event
//! (`c` if the run began with a create, else `u`) at the change id of the run's last
//! entry; a run followed by a delete of that key emits only the delete (and its
//! tombstone); a run whose row is gone by then emits nothing (its delete follows in the
//! log). Offsets stay correct because an entry is only ever absorbed into a later one of
//! the same key: a restart after an event's change id re-reads every later entry.
//!
//! Decided (issue 16, schema changes): a trigger naming a column makes SQLite refuse
//! `ALTER TABLE DROP COLUMN` of it (it re-parses every trigger after the drop), a RENAME
//! keeps the old name in a `json_object` string literal, and an ADD is invisible to a
//! trigger written before it; SQLite has no `NEW.*` and triggers run in the writer's
//! connection, where no host function exists. So the triggers name only the key
//! columns, the primary key and the columns of UNIQUE indexes (for `INSERT OR REPLACE`):
//! SQLite refuses to drop PRIMARY KEY, UNIQUE and indexed columns anyway and rewrites
//! trigger bodies on RENAME COLUMN. ADD, RENAME and DROP of any other column are never
//! blocked and show in the next event without a pause. Limits: a column named only by
//! `message.key.columns` (no index) cannot be dropped while it is the key (change the key
//! first: it is the record's identity); `DROP INDEX` of a `CREATE UNIQUE INDEX` then
//! `DROP COLUMN` of its column fails until the connector has re-created the triggers
//! (its next read of the log); renaming a `message.key.columns` column fails the task
//! until the config names the new column (changes keep waiting in the log).
//!
//! Special cases:
//! - `INSERT OR REPLACE` / `REPLACE` deletes conflicting rows without firing DELETE
//!   triggers. A BEFORE INSERT trigger copies the key of every row that conflicts on the
//!   primary key or on a (non-partial, column) UNIQUE index into `_weir_cdc_pending`; the
//!   AFTER INSERT trigger (which fires only if the row was inserted, so not for `INSERT
//!   OR IGNORE`) turns them into a delete of each removed row with another key, then an
//!   update (same key was replaced) or a create. Stale pending rows (an insert that was
//!   ignored) are cleared by the next BEFORE INSERT.
//! - An UPDATE changing the key logs a delete of the old key then a create of the new one.
//! - Before each read of the log the connector compares `PRAGMA schema_version` (inside
//!   the read transaction); when it changed it re-describes the tables and re-creates
//!   the triggers of a table whose key, primary key or UNIQUE indexes changed or whose
//!   triggers are missing (in one write transaction), then reads.
//! - Upgrade: `open` replaces triggers of the earlier shape (full `json_object` rows).
//!   Log rows they wrote (key a JSON object, not an array) are emitted as they were
//!   logged, `before` and `after` included, in change-id order before any new row.
//!
//! Offsets: source partition `{"database": path}`, offset `{"change_id": N, "snapshot":
//! "done" | "running"}`. `commit` deletes log rows up to the committed change id. A
//! restart during the snapshot takes the snapshot again (duplicates `op=r`, at least
//! once). BLOB values appear in JSON as hex text (JSON has no bytes).

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};

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

/// One captured table: what its triggers name.
#[derive(Clone, PartialEq, Eq)]
struct Table {
    name: String,
    /// Primary key columns in key order; empty = a rowid table without a declared one.
    pk: Vec<String>,
    /// The columns of the record key: `message.key.columns`' entry for the table, else
    /// the primary key. Never empty (such a table is refused: see [`describe`]).
    key: Vec<String>,
    /// Column lists of UNIQUE indexes other than the primary key.
    uniques: Vec<Vec<String>>,
}

/// The names of the five triggers of a table (see [`Table::trigger_sql`]).
const TRIGGER_SUFFIXES: [&str; 5] = ["bi", "ai", "au", "auk", "ad"];

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

/// A column value as JSON: BLOBs as upper-case hex text (what SQLite's `hex` gives),
/// non-finite reals as null (JSON has neither bytes nor infinities).
fn value_json(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Integer(i) => i.to_string(),
        Value::Real(f) if f.is_finite() => format!("{f:?}"),
        Value::Real(_) => "null".into(),
        Value::Text(t) => json_string(t),
        Value::Blob(b) => {
            let hex: String = b.iter().map(|x| format!("{x:02X}")).collect();
            json_string(&hex)
        }
    }
}

/// A JSON object of `names[i]: values[i]`, in order.
fn object_json(names: &[String], values: &[Value]) -> String {
    let fields: Vec<String> = names
        .iter()
        .zip(values)
        .map(|(n, v)| format!("{}:{}", json_string(n), value_json(v)))
        .collect();
    format!("{{{}}}", fields.join(","))
}

fn exec(db: u32, text: &str, params: &[Value]) -> Result<u64, PluginError> {
    sql::execute(db, text, params).map_err(error)
}

fn query_rows(db: u32, text: &str, params: &[Value]) -> Result<sql::Rows, PluginError> {
    sql::query(db, text, params).map_err(error)
}

fn query(db: u32, text: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, PluginError> {
    query_rows(db, text, params).map(|r| r.rows)
}

/// Runs `f` in a read transaction (one snapshot of the database), ended whatever `f`
/// returns.
fn read_transaction<T>(
    db: u32,
    f: impl FnOnce() -> Result<T, PluginError>,
) -> Result<T, PluginError> {
    exec(db, "BEGIN", &[])?;
    match f() {
        Ok(v) => {
            exec(db, "COMMIT", &[])?;
            Ok(v)
        }
        Err(e) => {
            let _ = exec(db, "ROLLBACK", &[]);
            Err(e)
        }
    }
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

/// Reads a table's primary key and UNIQUE indexes; its key is `key_columns` (from
/// `message.key.columns`) when given, else its primary key.
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
        pk,
        key,
        uniques,
    })
}

impl Table {
    /// `json_array(...)` of the key of row `alias` (`NEW`, `OLD`, or the table): its key
    /// values in key order, a BLOB as `["<hex>"]` (`json_array` refuses a BLOB, which
    /// would fail the writer's statement).
    fn key_array(&self, alias: &str) -> String {
        let parts: Vec<String> = self
            .key
            .iter()
            .map(|c| {
                let col = format!("{alias}.{}", ident(c));
                format!(
                    "CASE WHEN typeof({col}) = 'blob' THEN json_array(hex({col})) ELSE {col} END"
                )
            })
            .collect();
        format!("json_array({})", parts.join(", "))
    }

    /// The key values decoded from a logged key array bound to `?1`, one expression per
    /// key column (the inverse of [`Table::key_array`]).
    fn key_values(&self) -> Vec<String> {
        (0..self.key.len())
            .map(|i| {
                format!(
                    "CASE WHEN json_type(?1, '$[{i}]') = 'array' \
                     THEN unhex(json_extract(?1, '$[{i}][0]')) ELSE json_extract(?1, '$[{i}]') END"
                )
            })
            .collect()
    }

    /// A query with `?1` = a logged key array: the key values, then (`row`) every column
    /// of the row with that key as the table is now (no row: no result), or (not `row`)
    /// nothing more (always one result).
    fn by_key_sql(&self, row: bool) -> String {
        let values = self.key_values();
        if !row {
            return format!("SELECT {}", values.join(", "));
        }
        let t = ident(&self.name);
        let cond: Vec<String> = self
            .key
            .iter()
            .zip(&values)
            .map(|(c, v)| format!("{t}.{} IS {v}", ident(c)))
            .collect();
        format!(
            "SELECT {}, {t}.* FROM {t} WHERE {} LIMIT 1",
            values.join(", "),
            cond.join(" AND ")
        )
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

    fn trigger_name(&self, suffix: &str) -> String {
        format!("_weir_cdc_{}_{suffix}", self.name)
    }

    fn trigger(&self, suffix: &str) -> String {
        ident(&self.trigger_name(suffix))
    }

    /// The statements that (re)create this table's triggers. They name only the key, the
    /// primary key and UNIQUE index columns (see the module doc).
    fn trigger_sql(&self) -> String {
        let t = ident(&self.name);
        let tl = literal(&self.name);
        let mut s = String::new();
        for suffix in TRIGGER_SUFFIXES {
            s.push_str(&format!(
                "DROP TRIGGER IF EXISTS {};\n",
                self.trigger(suffix)
            ));
        }
        let log_cols = format!("{LOG_TABLE}(tbl, op, key, ts_ms)");
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
               INSERT INTO {PENDING_TABLE}(tbl, key) SELECT {tl}, {key_t} FROM {t} WHERE {cond}; \
             END;\n",
            bi = self.trigger("bi"),
            key_t = self.key_array(&t),
            cond = conflicts.join(" OR "),
        ));
        let key_new = self.key_array("NEW");
        let key_old = self.key_array("OLD");
        s.push_str(&format!(
            "CREATE TRIGGER {ai} AFTER INSERT ON {t} BEGIN \
               INSERT INTO {log_cols} SELECT {tl}, 'd', key, {TS_SQL} FROM {PENDING_TABLE} \
                 WHERE tbl = {tl} AND key IS NOT {key_new} ORDER BY rowid; \
               INSERT INTO {log_cols} SELECT {tl}, \
                 CASE WHEN EXISTS (SELECT 1 FROM {PENDING_TABLE} WHERE tbl = {tl} AND key = {key_new}) THEN 'u' ELSE 'c' END, \
                 {key_new}, {TS_SQL}; \
               DELETE FROM {PENDING_TABLE} WHERE tbl = {tl}; \
             END;\n",
            ai = self.trigger("ai"),
        ));
        s.push_str(&format!(
            "CREATE TRIGGER {au} AFTER UPDATE ON {t} WHEN {same} BEGIN \
               INSERT INTO {log_cols} VALUES ({tl}, 'u', {key_new}, {TS_SQL}); \
             END;\n",
            au = self.trigger("au"),
            same = self.same_key("OLD", "NEW"),
        ));
        s.push_str(&format!(
            "CREATE TRIGGER {auk} AFTER UPDATE ON {t} WHEN NOT ({same}) BEGIN \
               INSERT INTO {log_cols} VALUES ({tl}, 'd', {key_old}, {TS_SQL}); \
               INSERT INTO {log_cols} VALUES ({tl}, 'c', {key_new}, {TS_SQL}); \
             END;\n",
            auk = self.trigger("auk"),
            same = self.same_key("OLD", "NEW"),
        ));
        s.push_str(&format!(
            "CREATE TRIGGER {ad} AFTER DELETE ON {t} BEGIN \
               INSERT INTO {log_cols} VALUES ({tl}, 'd', {key_old}, {TS_SQL}); \
             END;\n",
            ad = self.trigger("ad"),
        ));
        s
    }

    /// True when all of this table's triggers exist (a user may drop one, e.g. to run a
    /// DDL they blocked; see the module doc).
    fn triggers_present(&self, db: u32) -> Result<bool, PluginError> {
        let mut params = vec![Value::Text(self.name.clone())];
        params.extend(
            TRIGGER_SUFFIXES
                .iter()
                .map(|s| Value::Text(self.trigger_name(s))),
        );
        let rows = query(
            db,
            "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?1 \
             AND name IN (?2, ?3, ?4, ?5, ?6)",
            &params,
        )?;
        let n = rows.first().and_then(|r| r.first()).map(int).unwrap_or(0);
        Ok(n == TRIGGER_SUFFIXES.len() as i64)
    }
}

fn schema_version(db: u32) -> Result<i64, PluginError> {
    let rows = query(db, "PRAGMA schema_version", &[])?;
    Ok(rows.first().and_then(|r| r.first()).map(int).unwrap_or(0))
}

/// Describes every table and (re)creates the triggers of those whose shape differs from
/// `known` (all of them when `known` is empty) or whose triggers are missing, in one
/// write transaction. Returns the tables and the schema version they describe (read
/// inside the transaction, so no DDL slips between the two).
fn install(
    db: u32,
    names: &[String],
    keys: &KeyColumns,
    known: &[Table],
) -> Result<(Vec<Table>, i64), PluginError> {
    exec(db, "BEGIN IMMEDIATE", &[])?;
    let result = (|| {
        let mut tables = Vec::with_capacity(names.len());
        let mut ddl = String::new();
        for name in names {
            let key = keys.iter().find(|(t, _)| t == name).map(|(_, k)| &k[..]);
            let t = describe(db, name, key)?;
            if !known.contains(&t) || !t.triggers_present(db)? {
                ddl.push_str(&t.trigger_sql());
            }
            tables.push(t);
        }
        if !ddl.is_empty() {
            exec(db, &ddl, &[])?;
        }
        Ok((tables, schema_version(db)?))
    })();
    match result {
        Ok(done) => {
            exec(db, "COMMIT", &[])?;
            Ok(done)
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

/// One row of the change log.
struct Entry {
    id: i64,
    table: String,
    op: String,
    /// A JSON array of the key values; a JSON object in rows the earlier triggers wrote.
    key: String,
    /// Row images: only in rows the earlier triggers wrote.
    before: Option<String>,
    after: Option<String>,
    ts_ms: i64,
}

impl Entry {
    /// Written by the triggers before issue 16 (the key a JSON object, row images in the
    /// log): emitted as logged.
    fn as_logged(&self) -> bool {
        !self.key.starts_with('[')
    }
}

/// What one entry of a page of the log emits.
#[derive(Clone, Copy)]
enum Planned {
    /// Its own envelope, as logged ([`Entry::as_logged`]).
    AsLogged,
    /// The key's current row, op `c` (its run of creates/updates began with a create)
    /// or `u`.
    Upsert { create: bool },
    /// A delete (and its tombstone).
    Delete,
}

/// Coalesces a page of the log (in change-id order): what each entry emits, None when
/// it is absorbed into a later entry of the same key (see the module doc). An entry is
/// only ever absorbed into a later one, so a restart from the offset of any emitted
/// event still reads the entry each skipped one was absorbed into.
fn coalesce(entries: &[Entry]) -> Vec<Option<Planned>> {
    let mut plan: Vec<Option<Planned>> = Vec::with_capacity(entries.len());
    // (table, key) -> index of the open run's last entry.
    let mut open: HashMap<(&str, &str), usize> = HashMap::new();
    for (i, e) in entries.iter().enumerate() {
        if e.as_logged() {
            plan.push(Some(Planned::AsLogged));
            continue;
        }
        let key = (e.table.as_str(), e.key.as_str());
        let planned = match e.op.as_str() {
            "c" | "u" => {
                let began = open.get(&key).and_then(|&j| plan[j].take());
                let create = match began {
                    Some(Planned::Upsert { create }) => create,
                    Some(Planned::AsLogged | Planned::Delete) | None => e.op == "c",
                };
                open.insert(key, i);
                Some(Planned::Upsert { create })
            }
            "d" => {
                if let Some(j) = open.remove(&key) {
                    plan[j] = None;
                }
                Some(Planned::Delete)
            }
            other => {
                log(
                    Level::Warn,
                    &format!("{LOG_TABLE} row {} has op `{other}`: skipped", e.id),
                );
                None
            }
        };
        plan.push(planned);
    }
    plan
}

/// Tries of a read of the log that finds the schema changed (each re-describes it).
const SCHEMA_TRIES: usize = 5;

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

    /// Appends the records of one streamed change of `entry`'s table: its envelope, and
    /// for a delete (with tombstones on) the tombstone. A delete's envelope carries the
    /// change id before it, its tombstone the id itself, so a crash between them
    /// re-emits the delete rather than losing the tombstone.
    fn push_change(
        &self,
        out: &mut Vec<SourceRecord>,
        entry: &Entry,
        op: &str,
        key: Option<String>,
        before: Option<&str>,
        after: Option<&str>,
    ) {
        let value = self.envelope(
            &entry.table,
            op,
            before,
            after,
            entry.id,
            entry.ts_ms,
            false,
        );
        let tombstone = op == "d" && self.tombstones;
        let offset = if tombstone { entry.id - 1 } else { entry.id };
        out.push(self.record(&entry.table, key.clone(), Some(value), offset, true));
        if tombstone {
            out.push(self.record(&entry.table, key, None, entry.id, true));
        }
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
        let rows = query_rows(
            self.db,
            &format!("SELECT * FROM {t} ORDER BY {order} LIMIT ?1 OFFSET ?2"),
            &[Value::Integer(page), Value::Integer(done_rows)],
        )?;
        let mut key_at = Vec::with_capacity(table.key.len());
        for k in &table.key {
            match rows.columns.iter().position(|c| c == k) {
                Some(i) => key_at.push(i),
                None => {
                    return Err(error(format!(
                        "table `{}` has no key column `{k}` any more",
                        table.name
                    )))
                }
            }
        }
        let ts = now_ms();
        let last_table = index + 1 == self.tables.len();
        let n = rows.rows.len();
        for (i, row) in rows.rows.iter().enumerate() {
            let done = last_table && n < page as usize && i + 1 == n;
            let key_values: Vec<Value> = key_at
                .iter()
                .map(|&i| row.get(i).cloned().unwrap_or(Value::Null))
                .collect();
            let key = object_json(&table.key, &key_values);
            let after = object_json(&rows.columns, row);
            let value = self.envelope(&table.name, "r", None, Some(&after), change_id, ts, true);
            let rec = self.record(&table.name, Some(key), Some(value), change_id, done);
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

    /// Re-describes the tables (the schema changed) and re-creates the triggers that
    /// need it.
    fn follow_schema(&mut self) -> Result<(), PluginError> {
        let (tables, version) = install(self.db, &self.table_names, &self.keys, &self.tables)?;
        if tables != self.tables {
            log(
                Level::Info,
                "table keys or UNIQUE indexes changed: change-log triggers re-created",
            );
        }
        self.tables = tables;
        self.schema_version = version;
        Ok(())
    }

    /// Queues the next changes of the log: a page of it and the rows it names, read in
    /// one read transaction under the schema [`State::tables`] describes.
    fn fill_stream(&mut self, max: u32) -> Result<(), PluginError> {
        for _ in 0..SCHEMA_TRIES {
            let known = self.schema_version;
            let read = read_transaction(self.db, || {
                if schema_version(self.db)? != known {
                    return Ok(None);
                }
                self.read_log(max).map(Some)
            })?;
            match read {
                Some((records, last_id)) => {
                    self.queue.extend(records);
                    self.last_id = last_id;
                    return Ok(());
                }
                None => self.follow_schema()?,
            }
        }
        Err(error(format!(
            "the schema changed during each of {SCHEMA_TRIES} reads of the change log"
        )))
    }

    /// Reads the page of the log after [`State::last_id`] (at most `max` entries) and
    /// what it emits, coalesced; returns the records and the last change id read. Runs
    /// inside a read transaction.
    fn read_log(&self, max: u32) -> Result<(Vec<SourceRecord>, i64), PluginError> {
        let rows = query(
            self.db,
            &format!(
                "SELECT id, tbl, op, key, before, after, ts_ms FROM {LOG_TABLE} WHERE id > ?1 ORDER BY id LIMIT ?2"
            ),
            &[Value::Integer(self.last_id), Value::Integer(i64::from(max.max(1)))],
        )?;
        let entries: Vec<Entry> = rows
            .iter()
            .filter(|r| r.len() >= 7)
            .map(|r| Entry {
                id: int(&r[0]),
                table: text(&r[1]).unwrap_or_default(),
                op: text(&r[2]).unwrap_or_default(),
                key: text(&r[3]).unwrap_or_default(),
                before: text(&r[4]),
                after: text(&r[5]),
                ts_ms: int(&r[6]),
            })
            .collect();
        let plan = coalesce(&entries);
        let mut out = Vec::new();
        let mut last_id = self.last_id;
        for (entry, planned) in entries.iter().zip(plan) {
            last_id = entry.id;
            let Some(planned) = planned else { continue };
            let (op, deleted) = match planned {
                Planned::AsLogged => {
                    let key = Some(entry.key.clone());
                    let (before, after) = (entry.before.as_deref(), entry.after.as_deref());
                    self.push_change(&mut out, entry, &entry.op, key, before, after);
                    continue;
                }
                Planned::Upsert { create: true } => ("c", false),
                Planned::Upsert { create: false } => ("u", false),
                Planned::Delete => ("d", true),
            };
            let Some(table) = self.tables.iter().find(|t| t.name == entry.table) else {
                log(
                    Level::Warn,
                    &format!(
                        "{LOG_TABLE} row {} is of table `{}`, not captured: skipped",
                        entry.id, entry.table
                    ),
                );
                continue;
            };
            let found = query_rows(
                self.db,
                &table.by_key_sql(!deleted),
                &[Value::Text(entry.key.clone())],
            )?;
            // No row: it was deleted after this entry; that delete follows in the log.
            let Some(row) = found.rows.first() else {
                continue;
            };
            let n = table.key.len();
            if row.len() < n || found.columns.len() != row.len() {
                return Err(error(format!(
                    "reading the row of {LOG_TABLE} row {}: {} values for {} columns",
                    entry.id,
                    row.len(),
                    found.columns.len()
                )));
            }
            let key = object_json(&table.key, &row[..n]);
            if deleted {
                self.push_change(&mut out, entry, op, Some(key.clone()), Some(&key), None);
            } else {
                let after = object_json(&found.columns[n..], &row[n..]);
                self.push_change(&mut out, entry, op, Some(key), None, Some(&after));
            }
        }
        Ok((out, last_id))
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
        let (tables, schema_version) = install(db, &table_names, &keys, &[])?;
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
