//! weir's built-in `sqlite-sink` connector: upserts records into a SQLite table by key,
//! deletes on a tombstone — Confluent's JDBC sink connector, for one SQLite file.
//!
//! Keys (the JDBC sink's names): `database` (required; the file, the one the runtime
//! lets the `sqlite` interface open), `table.name.format` (default `${topic}`; `${topic}`
//! is replaced by the record's topic, then every character other than ASCII letters,
//! digits and `_` becomes `_`), `pk.mode` (`record_key`, the only mode: the record key's
//! JSON object fields are the primary key), `insert.mode` (`upsert`, the default, or
//! `insert`), `delete.enabled` (default true: a tombstone deletes the row with that key),
//! `auto.create` (default false: create a missing table from the first record, columns
//! typed from its JSON values, primary key from its key), `auto.evolve` (default false:
//! add a column a record has and the table lacks).
//!
//! Records: key and value are JSON objects; a field of the value that is an object or an
//! array is stored as its JSON text. Each `put` is one transaction, so `flush` has
//! nothing left to do: what `put` returned ok for is committed.
//!
//! Another connection holding the database (a writer in `BEGIN IMMEDIATE`) past the
//! runtime's busy timeout rolls the batch back and asks the host to put it again after a
//! backoff (100 ms doubling to 2 s): the wait is latency, the task stays RUNNING, and the
//! batch goes in whole, once, in order. Only `errors.retry.timeout` of refusals fails it.

use std::cell::RefCell;
use std::collections::BTreeMap;

wit_bindgen::generate!({
    world: "sink-connector",
    path: "../../wit",
});

use exports::weir::plugin::sink::Guest;
use weir::plugin::connector_types::{PutResult, PutRetry, SinkRecord, TopicOffset, TopicPartition};
use weir::plugin::log::{log, Level};
use weir::plugin::sqlite::{self as sql, Value};
use weir::plugin::types::PluginError;

struct State {
    db: u32,
    table_format: String,
    upsert: bool,
    delete_enabled: bool,
    auto_create: bool,
    auto_evolve: bool,
    /// Known columns of each table written to.
    columns: BTreeMap<String, Vec<String>>,
    /// Batches refused in a row because another connection held the database.
    busy_retries: u32,
}

thread_local! {
    static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
}

fn error(message: String, index: Option<u32>) -> PluginError {
    PluginError {
        message,
        record_index: index,
    }
}

fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn json_path(field: &str) -> String {
    format!("$.\"{}\"", field.replace('"', "\\\""))
}

fn config_value(config: &[(String, String)], key: &str) -> Option<String> {
    config
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

fn flag(config: &[(String, String)], key: &str, default: bool) -> Result<bool, PluginError> {
    match config_value(config, key).as_deref() {
        None => Ok(default),
        Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(other) => Err(error(
            format!("`{key}`: `{other}` is not true or false"),
            None,
        )),
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::Text(t) => Some(t.clone()),
        _ => None,
    }
}

/// The fields of JSON object `json` with their JSON types (`integer`, `real`, `text`, ...),
/// in order. Errors: not a JSON object.
fn fields(db: u32, json: &str, what: &str) -> Result<Vec<(String, String)>, String> {
    let ty = sql::query(
        db,
        "SELECT CASE WHEN json_valid(?1) THEN json_type(?1) END",
        &[Value::Text(json.into())],
    )?;
    if ty
        .rows
        .first()
        .and_then(|r| r.first())
        .and_then(text)
        .as_deref()
        != Some("object")
    {
        return Err(format!("the record {what} is not a JSON object"));
    }
    let rows = sql::query(
        db,
        "SELECT key, type FROM json_each(?1)",
        &[Value::Text(json.into())],
    )?;
    Ok(rows
        .rows
        .iter()
        .filter_map(|r| Some((text(&r[0])?, text(&r[1])?)))
        .collect())
}

impl State {
    fn table_for(&self, topic: &str) -> String {
        self.table_format
            .replace("${topic}", topic)
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    }

    fn known_columns(&mut self, table: &str) -> Result<Vec<String>, String> {
        if let Some(c) = self.columns.get(table) {
            return Ok(c.clone());
        }
        let rows = sql::query(
            self.db,
            "SELECT name FROM pragma_table_info(?1) ORDER BY cid",
            &[Value::Text(table.into())],
        )?;
        let cols: Vec<String> = rows.rows.iter().filter_map(|r| text(&r[0])).collect();
        if !cols.is_empty() {
            self.columns.insert(table.to_string(), cols.clone());
        }
        Ok(cols)
    }

    /// Makes sure `table` exists with every column of `all` (creating or evolving it as
    /// configured).
    fn ensure_table(
        &mut self,
        table: &str,
        key: &[(String, String)],
        all: &[(String, String)],
    ) -> Result<(), String> {
        let sql_type = |t: &str| match t {
            "integer" | "true" | "false" => "INTEGER",
            "real" => "REAL",
            _ => "TEXT",
        };
        let known = self.known_columns(table)?;
        if known.is_empty() {
            if !self.auto_create {
                return Err(format!(
                    "table {table} does not exist (set auto.create=true to create it)"
                ));
            }
            let cols: Vec<String> = all
                .iter()
                .map(|(n, t)| format!("{} {}", ident(n), sql_type(t)))
                .collect();
            let pk: Vec<String> = key.iter().map(|(n, _)| ident(n)).collect();
            sql::execute(
                self.db,
                &format!(
                    "CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({}))",
                    ident(table),
                    cols.join(", "),
                    pk.join(", ")
                ),
                &[],
            )?;
            log(Level::Info, &format!("created table {table}"));
            self.columns.remove(table);
            return Ok(());
        }
        let missing: Vec<&(String, String)> =
            all.iter().filter(|(n, _)| !known.contains(n)).collect();
        if missing.is_empty() {
            return Ok(());
        }
        if !self.auto_evolve {
            return Err(format!(
                "table {table} has no column {} (set auto.evolve=true to add it)",
                missing[0].0
            ));
        }
        for (n, t) in missing {
            sql::execute(
                self.db,
                &format!(
                    "ALTER TABLE {} ADD COLUMN {} {}",
                    ident(table),
                    ident(n),
                    sql_type(t)
                ),
                &[],
            )?;
        }
        self.columns.remove(table);
        Ok(())
    }

    fn write(&mut self, r: &SinkRecord) -> Result<(), String> {
        let table = self.table_for(&r.topic);
        let key = r
            .record
            .key
            .as_ref()
            .ok_or("pk.mode=record_key needs a record key")?;
        let key = std::str::from_utf8(key).map_err(|_| "the record key is not UTF-8")?;
        let key_fields = fields(self.db, key, "key")?;
        if key_fields.is_empty() {
            return Err("the record key has no fields".into());
        }
        let key_match: Vec<String> = key_fields
            .iter()
            .map(|(n, _)| {
                format!(
                    "{} = json_extract(?1, '{}')",
                    ident(n),
                    json_path(n).replace('\'', "''")
                )
            })
            .collect();
        let Some(value) = &r.record.value else {
            if !self.delete_enabled {
                return Ok(());
            }
            if self.known_columns(&table)?.is_empty() {
                return Ok(());
            }
            sql::execute(
                self.db,
                &format!(
                    "DELETE FROM {} WHERE {}",
                    ident(&table),
                    key_match.join(" AND ")
                ),
                &[Value::Text(key.into())],
            )?;
            return Ok(());
        };
        let value = std::str::from_utf8(value).map_err(|_| "the record value is not UTF-8")?;
        // Key fields win over value fields of the same name.
        let merged = sql::query(
            self.db,
            "SELECT json_patch(?1, ?2)",
            &[Value::Text(value.into()), Value::Text(key.into())],
        )?;
        fields(self.db, value, "value")?;
        let merged = merged
            .rows
            .first()
            .and_then(|r| r.first())
            .and_then(text)
            .ok_or("cannot merge key and value")?;
        let all = fields(self.db, &merged, "value")?;
        self.ensure_table(&table, &key_fields, &all)?;
        let names: Vec<String> = all.iter().map(|(n, _)| ident(n)).collect();
        let values: Vec<String> = all
            .iter()
            .map(|(n, _)| format!("json_extract(?1, '{}')", json_path(n).replace('\'', "''")))
            .collect();
        let pk: Vec<String> = key_fields.iter().map(|(n, _)| ident(n)).collect();
        let updates: Vec<String> = all
            .iter()
            .filter(|(n, _)| !key_fields.iter().any(|(k, _)| k == n))
            .map(|(n, _)| format!("{} = excluded.{}", ident(n), ident(n)))
            .collect();
        let conflict = if !self.upsert {
            String::new()
        } else if updates.is_empty() {
            format!(" ON CONFLICT ({}) DO NOTHING", pk.join(", "))
        } else {
            format!(
                " ON CONFLICT ({}) DO UPDATE SET {}",
                pk.join(", "),
                updates.join(", ")
            )
        };
        sql::execute(
            self.db,
            &format!(
                "INSERT INTO {} ({}) VALUES ({}){conflict}",
                ident(&table),
                names.join(", "),
                values.join(", ")
            ),
            &[Value::Text(merged)],
        )?;
        Ok(())
    }
}

/// First wait before a batch refused for a lock is put again, in ms (each attempt has
/// already waited the runtime's busy timeout inside SQLite); doubled per refusal.
const BUSY_BACKOFF_MIN_MS: u64 = 100;
/// Longest wait between attempts, in ms. The host caps it by `retry.backoff.max.ms` and
/// fails the task once `errors.retry.timeout` passed without the batch going in.
const BUSY_BACKOFF_MAX_MS: u64 = 2_000;

/// Whether SQLite's message says another connection holds a lock (SQLITE_BUSY,
/// SQLITE_LOCKED): retriable, unlike anything a record or the schema can cause.
fn is_busy(message: &str) -> bool {
    message.contains("database is locked")
        || message.contains("database table is locked")
        || message.contains("database schema is locked")
        || message.contains("database is busy")
}

/// Why a batch's transaction did not commit.
enum Failed {
    /// Another connection held the database past the busy timeout.
    Busy(String),
    /// Record `0` (index in the batch) cannot be written.
    Record(usize, String),
    /// BEGIN or COMMIT failed otherwise.
    Other(String),
}

impl State {
    /// Writes `records` in one transaction (`BEGIN IMMEDIATE` ... `COMMIT`); on an error
    /// the caller rolls back.
    fn put_all(&mut self, records: &[SinkRecord]) -> Result<(), Failed> {
        let txn = |e: String| {
            if is_busy(&e) {
                Failed::Busy(e)
            } else {
                Failed::Other(e)
            }
        };
        sql::execute(self.db, "BEGIN IMMEDIATE", &[]).map_err(txn)?;
        for (i, r) in records.iter().enumerate() {
            if let Err(e) = self.write(r) {
                return Err(if is_busy(&e) {
                    Failed::Busy(e)
                } else {
                    Failed::Record(i, e)
                });
            }
        }
        sql::execute(self.db, "COMMIT", &[]).map_err(txn)?;
        Ok(())
    }
}

fn with_state<T>(f: impl FnOnce(&mut State) -> Result<T, PluginError>) -> Result<T, PluginError> {
    STATE.with(|s| match s.borrow_mut().as_mut() {
        Some(state) => f(state),
        None => Err(error("called before open".into(), None)),
    })
}

struct SqliteSink;

impl Guest for SqliteSink {
    fn open(
        config: Vec<(String, String)>,
        _partitions: Vec<TopicPartition>,
    ) -> Result<(), PluginError> {
        let path = config_value(&config, "database")
            .ok_or_else(|| error("missing required key `database`".into(), None))?;
        match config_value(&config, "pk.mode").as_deref() {
            None | Some("record_key") => {}
            Some(other) => {
                return Err(error(
                    format!("`pk.mode`: `{other}` is not supported (only record_key)"),
                    None,
                ))
            }
        }
        let upsert = match config_value(&config, "insert.mode").as_deref() {
            None | Some("upsert") => true,
            Some("insert") => false,
            Some(other) => {
                return Err(error(
                    format!("`insert.mode`: `{other}` is not one of upsert, insert"),
                    None,
                ))
            }
        };
        let db = sql::open(&path).map_err(|e| error(e, None))?;
        let state = State {
            db,
            table_format: config_value(&config, "table.name.format")
                .unwrap_or_else(|| "${topic}".into()),
            upsert,
            delete_enabled: flag(&config, "delete.enabled", true)?,
            auto_create: flag(&config, "auto.create", false)?,
            auto_evolve: flag(&config, "auto.evolve", false)?,
            columns: BTreeMap::new(),
            busy_retries: 0,
        };
        log(Level::Info, &format!("writing to {path}"));
        STATE.with(|s| *s.borrow_mut() = Some(state));
        Ok(())
    }

    fn put(records: Vec<SinkRecord>) -> Result<PutResult, PluginError> {
        with_state(|s| {
            let failed = match s.put_all(&records) {
                Ok(()) => {
                    s.busy_retries = 0;
                    return Ok(PutResult {
                        errant: Vec::new(),
                        retry: None,
                    });
                }
                Err(f) => f,
            };
            // Nothing of this batch stays: it is put again whole, or the task fails.
            let _ = sql::execute(s.db, "ROLLBACK", &[]);
            s.columns.clear();
            match failed {
                Failed::Busy(e) => {
                    let after_ms =
                        (BUSY_BACKOFF_MIN_MS << s.busy_retries.min(8)).min(BUSY_BACKOFF_MAX_MS);
                    s.busy_retries = s.busy_retries.saturating_add(1);
                    log(
                        Level::Warn,
                        &format!(
                            "another connection holds the database ({e}); putting {} records \
                             again in {after_ms} ms",
                            records.len()
                        ),
                    );
                    Ok(PutResult {
                        errant: Vec::new(),
                        retry: Some(PutRetry {
                            settled: 0,
                            after_ms,
                        }),
                    })
                }
                Failed::Record(i, e) => {
                    let r = &records[i];
                    Err(error(
                        format!("{}[{}]@{}: {e}", r.topic, r.partition, r.offset),
                        Some(i as u32),
                    ))
                }
                Failed::Other(e) => Err(error(e, None)),
            }
        })
    }

    fn flush(_offsets: Vec<TopicOffset>) -> Result<(), PluginError> {
        with_state(|_| Ok(()))
    }

    fn close() {
        STATE.with(|s| {
            if let Some(state) = s.borrow_mut().take() {
                sql::close(state.db);
            }
        });
    }
}

export!(SqliteSink);
