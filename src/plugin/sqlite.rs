//! The `sqlite` host capability of connectors (`wit/connector.wit`, interface `sqlite`):
//! connections to the one database file a connector's config grants, backed by rusqlite
//! (bundled SQLite).
//!
//! Owns: the connections of one connector instance, the grant check, and running each
//! statement on Tokio's blocking pool (`spawn_blocking`) so a statement waiting for a
//! writer's lock (`busy_timeout`) never holds a runtime worker thread.
//!
//! Never does: open a path other than the granted one (compared after making both
//! absolute, lexically: `..` or another spelling is refused, not resolved); let SQL reach
//! another file (`ATTACH` — which `VACUUM INTO` uses too — is refused by an authorizer
//! and by `SQLITE_LIMIT_ATTACHED = 0`; extension loading is never enabled; URI file
//! names are not accepted); hand wasmtime types out (the WIT glue is in
//! `connector.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::limits::Limit;
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};

/// Most connections one instance may hold open.
pub const MAX_CONNECTIONS: usize = 4;

/// Most rows one query may return (the guest pages with `LIMIT` beyond).
pub const MAX_QUERY_ROWS: usize = 100_000;

/// Longest a statement waits for another connection's lock before SQLITE_BUSY.
pub const DEFAULT_BUSY_TIMEOUT_MS: u64 = 5_000;

/// A value bound to a parameter or read from a column.
#[derive(Debug, Clone, PartialEq)]
pub enum SqlValue {
    /// NULL.
    Null,
    /// INTEGER.
    Integer(i64),
    /// REAL.
    Real(f64),
    /// TEXT.
    Text(String),
    /// BLOB.
    Blob(Vec<u8>),
}

/// A query's result.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SqlRows {
    /// Column names.
    pub columns: Vec<String>,
    /// Rows, each `columns.len()` values.
    pub rows: Vec<Vec<SqlValue>>,
}

/// The connections of one connector instance and what it may open.
pub(crate) struct SqliteConns {
    connector: Arc<str>,
    granted: Option<PathBuf>,
    busy_timeout_ms: u64,
    conns: BTreeMap<u32, Arc<Mutex<Connection>>>,
    next_id: u32,
}

impl SqliteConns {
    /// No connection yet; `granted` is the one file `open` accepts (none: every open is
    /// refused).
    pub(crate) fn new(connector: Arc<str>, granted: Option<PathBuf>, busy_timeout_ms: u64) -> Self {
        SqliteConns {
            connector,
            granted,
            busy_timeout_ms,
            conns: BTreeMap::new(),
            next_id: 1,
        }
    }

    /// Opens the granted database (see the WIT `open`).
    ///
    /// Errors (as messages for the guest): another path (also logged at warn), too many
    /// connections, SQLite cannot open it.
    pub(crate) async fn open(&mut self, path: &str) -> Result<u32, String> {
        let asked = std::path::absolute(path).unwrap_or_else(|_| PathBuf::from(path));
        let Some(granted) = self.granted.clone() else {
            tracing::warn!(target: "weir::connect::guest", connector = &*self.connector, path, "denied: sqlite database not granted (no `database` key)");
            return Err(format!(
                "sqlite: access to {path} denied: this connector is granted no database (set its `database` key)"
            ));
        };
        if asked != granted {
            tracing::warn!(target: "weir::connect::guest", connector = &*self.connector, path, granted = %granted.display(), "denied: sqlite database outside the grant");
            return Err(format!(
                "sqlite: access to {path} denied: the only database granted to this connector is {}",
                granted.display()
            ));
        }
        if self.conns.len() >= MAX_CONNECTIONS {
            return Err(format!(
                "sqlite: at most {MAX_CONNECTIONS} connections per connector"
            ));
        }
        let busy = Duration::from_millis(self.busy_timeout_ms);
        let conn = tokio::task::spawn_blocking(move || open_restricted(&granted, busy))
            .await
            .map_err(|e| format!("sqlite: open failed: {e}"))??;
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.conns.insert(id, Arc::new(Mutex::new(conn)));
        Ok(id)
    }

    fn conn(&self, db: u32) -> Result<Arc<Mutex<Connection>>, String> {
        self.conns
            .get(&db)
            .cloned()
            .ok_or_else(|| format!("sqlite: no open connection {db}"))
    }

    /// Runs `sql` (several statements when `params` is empty); rows changed by the last.
    ///
    /// Errors: an unknown connection, SQLite's message.
    pub(crate) async fn execute(
        &self,
        db: u32,
        sql: String,
        params: Vec<SqlValue>,
    ) -> Result<u64, String> {
        let conn = self.conn(db)?;
        blocking(move || {
            let conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            if params.is_empty() {
                conn.execute_batch(&sql)
                    .map_err(|e| format!("sqlite: {e}"))?;
                Ok(conn.changes())
            } else {
                let n = conn
                    .execute(&sql, rusqlite::params_from_iter(params.iter().map(to_sql)))
                    .map_err(|e| format!("sqlite: {e}"))?;
                Ok(n as u64)
            }
        })
        .await
    }

    /// Runs one query; at most [`MAX_QUERY_ROWS`] rows.
    ///
    /// Errors: an unknown connection, SQLite's message, too many rows.
    pub(crate) async fn query(
        &self,
        db: u32,
        sql: String,
        params: Vec<SqlValue>,
    ) -> Result<SqlRows, String> {
        let conn = self.conn(db)?;
        blocking(move || {
            let conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            let mut stmt = conn.prepare(&sql).map_err(|e| format!("sqlite: {e}"))?;
            let columns: Vec<String> = stmt.column_names().map(str::to_string).collect();
            let width = columns.len();
            let mut rows = stmt
                .query(rusqlite::params_from_iter(params.iter().map(to_sql)))
                .map_err(|e| format!("sqlite: {e}"))?;
            let mut out = Vec::new();
            while let Some(row) = rows.next().map_err(|e| format!("sqlite: {e}"))? {
                if out.len() >= MAX_QUERY_ROWS {
                    return Err(format!(
                        "sqlite: the query returns more than {MAX_QUERY_ROWS} rows; page with LIMIT"
                    ));
                }
                let mut values = Vec::with_capacity(width);
                for i in 0..width {
                    let v = row.get_ref(i).map_err(|e| format!("sqlite: {e}"))?;
                    values.push(from_ref(v));
                }
                out.push(values);
            }
            Ok(SqlRows { columns, rows: out })
        })
        .await
    }

    /// Closes connection `db` (ignored when unknown); an open transaction rolls back.
    pub(crate) fn close(&mut self, db: u32) {
        self.conns.remove(&db);
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("sqlite: the call failed: {e}"))?
}

fn to_sql(v: &SqlValue) -> rusqlite::types::Value {
    use rusqlite::types::Value;
    match v {
        SqlValue::Null => Value::Null,
        SqlValue::Integer(i) => Value::Integer(*i),
        SqlValue::Real(f) => Value::Real(*f),
        SqlValue::Text(s) => Value::Text(s.clone()),
        SqlValue::Blob(b) => Value::Blob(b.clone()),
    }
}

fn from_ref(v: ValueRef<'_>) -> SqlValue {
    match v {
        ValueRef::Null => SqlValue::Null,
        ValueRef::Integer(i) => SqlValue::Integer(i),
        ValueRef::Real(f) => SqlValue::Real(f),
        ValueRef::Text(t) => SqlValue::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => SqlValue::Blob(b.to_vec()),
    }
}

/// Opens `path` read-write (created if missing), no URI names, with `busy` as the busy
/// timeout, `ATTACH` refused and the attached-database limit at 0.
fn open_restricted(path: &Path, busy: Duration) -> Result<Connection, String> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn = Connection::open_with_flags(path, flags)
        .map_err(|e| format!("sqlite: cannot open {}: {e}", path.display()))?;
    conn.busy_timeout(busy)
        .map_err(|e| format!("sqlite: busy_timeout: {e}"))?;
    conn.set_limit(Limit::SQLITE_LIMIT_ATTACHED, 0)
        .map_err(|e| format!("sqlite: limit: {e}"))?;
    conn.authorizer(Some(|ctx: AuthContext<'_>| match ctx.action {
        AuthAction::Attach { .. } | AuthAction::Detach { .. } => Authorization::Deny,
        AuthAction::Pragma { pragma_name, .. }
            if pragma_name.eq_ignore_ascii_case("temp_store_directory")
                || pragma_name.eq_ignore_ascii_case("data_store_directory") =>
        {
            Authorization::Deny
        }
        _ => Authorization::Allow,
    }))
    .map_err(|e| format!("sqlite: authorizer: {e}"))?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_the_granted_file_opens_and_sql_cannot_reach_another() {
        let dir = tempfile::tempdir().unwrap();
        let granted = dir.path().join("a.db");
        let mut c = SqliteConns::new("t".into(), Some(granted.clone()), 1000);
        let other = dir.path().join("b.db");
        let e = c.open(other.to_str().unwrap()).await.unwrap_err();
        assert!(e.contains("denied") && e.contains("a.db"), "{e}");
        let sneaky = dir.path().join("x/../a.db");
        assert!(c.open(sneaky.to_str().unwrap()).await.is_err());
        let db = c.open(granted.to_str().unwrap()).await.unwrap();
        c.execute(
            db,
            "CREATE TABLE t(id INTEGER PRIMARY KEY, v)".into(),
            vec![],
        )
        .await
        .unwrap();
        let n = c
            .execute(
                db,
                "INSERT INTO t(id, v) VALUES (?1, ?2)".into(),
                vec![SqlValue::Integer(1), SqlValue::Blob(vec![0, 1])],
            )
            .await
            .unwrap();
        assert_eq!(n, 1);
        let rows = c
            .query(db, "SELECT id, v FROM t".into(), vec![])
            .await
            .unwrap();
        assert_eq!(rows.columns, vec!["id", "v"]);
        assert_eq!(
            rows.rows,
            vec![vec![SqlValue::Integer(1), SqlValue::Blob(vec![0, 1])]]
        );
        let attach = format!("ATTACH DATABASE '{}' AS o", other.display());
        assert!(c.execute(db, attach, vec![]).await.is_err());
        let vacuum = format!("VACUUM INTO '{}'", other.display());
        assert!(c.execute(db, vacuum, vec![]).await.is_err());
        assert!(!other.exists());
        c.close(db);
        assert!(c.query(db, "SELECT 1".into(), vec![]).await.is_err());
    }
}
