//! The connector runtimes' wasmtime side: one instance of a `source-connector` or
//! `sink-connector` component (`wit/connector.wit`), with the capabilities its config
//! grants and nothing else.
//!
//! Unlike a transform, a connector instance that traps is not replaced here: the call
//! fails, the instance is dropped, and every later call fails at once with
//! [`PluginError::Host`]. Restarting (with backoff, re-opening with the stored offsets)
//! is the connect runtime's decision (`crate::connect`), because a connector's state —
//! its position in a file, its open database — must be rebuilt from durable offsets, not
//! from the config alone.
//!
//! Capabilities: the preopened directories of [`ConnectorGrants`] (each read-only or
//! read-write), the `sqlite` interface limited to its one granted database file
//! (`super::sqlite`), outgoing HTTP to the hosts of [`ConnectorGrants::http_hosts`]
//! (`wasi:http`, always linked, every other authority denied: [`super::http`]), the
//! connector's own stored state ([`ConnectorGrants::state`], `super::state`) and the
//! `log` interface; clocks and random as every plugin. No sockets, no environment, no
//! other path.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use wasmtime::component::{HasSelf, InstancePre, Linker};
use wasmtime::Store;

use super::instance::{begin_call, link, sandboxed_store, wasi_linker, Bindings};
use super::sandbox::StoreState;
use super::sqlite::{SqlValue, SqliteConns, DEFAULT_BUSY_TIMEOUT_MS};
use super::{call_error, Header, PluginError, PluginHost, Record, Shared};
use crate::metrics::PluginCalls;

mod source_bindings {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "source-connector",
        imports: { "weir:plugin/sqlite": async },
        exports: { default: async },
    });
}

mod sink_bindings {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "sink-connector",
        exports: { default: async },
        // One Rust type and one `Host` impl for `log`, `sqlite` and `state` in both worlds.
        with: {
            "weir:plugin/log": super::source_bindings::weir::plugin::log,
            "weir:plugin/sqlite": super::source_bindings::weir::plugin::sqlite,
            "weir:plugin/state": super::source_bindings::weir::plugin::state,
        },
    });
}

use sink_bindings::weir::plugin::connector_types as sink_types;
use source_bindings::weir::plugin::connector_types as src_types;

/// A directory granted to a connector: `host` appears in the guest as `guest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirGrant {
    /// Directory on the host.
    pub host: PathBuf,
    /// Path the guest opens it by (weir uses the host path itself, so paths in the
    /// connector's config and its error messages mean the same thing on both sides).
    pub guest: String,
    /// Read-write when true, read-only otherwise.
    pub writable: bool,
}

/// What a connector instance may use beyond clocks, random and `log`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectorGrants {
    /// Preopened directories.
    pub dirs: Vec<DirGrant>,
    /// The one SQLite database file the `sqlite` interface may open (absolute; none:
    /// every `open` is refused).
    pub sqlite_database: Option<PathBuf>,
    /// Hosts the connector may send HTTP requests to (`http.allowed.hosts`); empty: none
    /// (every `wasi:http` request fails with `HTTP-request-denied`).
    pub http_hosts: Vec<super::HttpHost>,
    /// The connector's stored state (`state` interface); none: every `get` finds
    /// nothing and every `set` fails (the runtime grants it to every connector).
    pub state: Option<super::StateGrant>,
}

/// A source partition or source offset map (Kafka Connect's, with string values).
pub type StringMap = Vec<(String, String)>;

/// One record a source task returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRecord {
    /// The record (timestamp 0 or less: stamp at append).
    pub record: Record,
    /// Its source partition.
    pub source_partition: StringMap,
    /// The offset just after it in its source partition.
    pub source_offset: StringMap,
    /// Topic, when the connector chose one.
    pub topic: Option<String>,
}

/// A source partition and its stored offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourcePosition {
    /// The source partition.
    pub source_partition: StringMap,
    /// Its offset.
    pub source_offset: StringMap,
}

/// One record handed to a sink task, with where it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkRecord {
    /// The record.
    pub record: Record,
    /// Topic read.
    pub topic: String,
    /// Partition read.
    pub partition: i32,
    /// The record's offset.
    pub offset: i64,
}

/// A record of a `put` batch the sink gave up on (KIP-610's errant record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrantRecord {
    /// Index of the record in the batch passed to that `put`.
    pub index: u32,
    /// Why, in the connector's words.
    pub reason: String,
}

/// A sink's request to put the rest of a batch again later (Kafka Connect's
/// `RetriableException` + `SinkTaskContext.timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutRetry {
    /// Records at the start of the batch that are settled (never to be put again).
    pub settled: u32,
    /// Wait before putting `settled..` again, in ms, as the connector asked (uncapped).
    pub after_ms: u64,
}

/// What a sink's `put` did with a batch (checked: indices in range, errant records
/// among the settled ones).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PutOutcome {
    /// Records failed for good, in index order.
    pub errant: Vec<ErrantRecord>,
    /// `None`: the whole batch is settled.
    pub retry: Option<PutRetry>,
}

/// A topic partition and an offset (the next one to read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicOffset {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

/// What a connector instance's `Store` holds: the plugin state and its name for `log`.
struct ConnectorState {
    base: StoreState,
    name: Arc<str>,
    sqlite: SqliteConns,
    http: wasmtime_wasi_http::WasiHttpCtx,
    http_hooks: super::http::HttpHooks,
    state: Option<super::StateGrant>,
}

impl wasmtime_wasi_http::WasiHttpView for ConnectorState {
    fn http(&mut self) -> wasmtime_wasi_http::WasiHttpCtxView<'_> {
        wasmtime_wasi_http::WasiHttpCtxView {
            ctx: &mut self.http,
            table: wasmtime_wasi::WasiView::ctx(&mut self.base).table,
            hooks: &mut self.http_hooks,
        }
    }
}

impl AsMut<StoreState> for ConnectorState {
    fn as_mut(&mut self) -> &mut StoreState {
        &mut self.base
    }
}

impl wasmtime_wasi::WasiView for ConnectorState {
    fn ctx(&mut self) -> wasmtime_wasi::WasiCtxView<'_> {
        self.base.ctx()
    }
}

impl source_bindings::weir::plugin::log::Host for ConnectorState {
    fn log(&mut self, level: source_bindings::weir::plugin::log::Level, message: String) {
        use source_bindings::weir::plugin::log::Level;
        let name = &*self.name;
        match level {
            Level::Trace => {
                tracing::trace!(target: "weir::connect::guest", connector = name, "{message}")
            }
            Level::Debug => {
                tracing::debug!(target: "weir::connect::guest", connector = name, "{message}")
            }
            Level::Info => {
                tracing::info!(target: "weir::connect::guest", connector = name, "{message}")
            }
            Level::Warn => {
                tracing::warn!(target: "weir::connect::guest", connector = name, "{message}")
            }
            Level::Error => {
                tracing::error!(target: "weir::connect::guest", connector = name, "{message}")
            }
        }
    }
}

use source_bindings::weir::plugin::sqlite as wit_sqlite;

fn from_wit_value(v: wit_sqlite::Value) -> SqlValue {
    match v {
        wit_sqlite::Value::Null => SqlValue::Null,
        wit_sqlite::Value::Integer(i) => SqlValue::Integer(i),
        wit_sqlite::Value::Real(f) => SqlValue::Real(f),
        wit_sqlite::Value::Text(s) => SqlValue::Text(s),
        wit_sqlite::Value::Blob(b) => SqlValue::Blob(b),
    }
}

fn to_wit_value(v: SqlValue) -> wit_sqlite::Value {
    match v {
        SqlValue::Null => wit_sqlite::Value::Null,
        SqlValue::Integer(i) => wit_sqlite::Value::Integer(i),
        SqlValue::Real(f) => wit_sqlite::Value::Real(f),
        SqlValue::Text(s) => wit_sqlite::Value::Text(s),
        SqlValue::Blob(b) => wit_sqlite::Value::Blob(b),
    }
}

/// The `sqlite` capability: [`SqliteConns`] does the work off the runtime's worker
/// threads; the time a call waits is given back to the guest's call deadline.
impl wit_sqlite::Host for ConnectorState {
    async fn open(&mut self, path: String) -> Result<u32, String> {
        let started = std::time::Instant::now();
        let r = self.sqlite.open(&path).await;
        self.base.deadline().extend(started.elapsed());
        r
    }

    async fn execute(
        &mut self,
        db: u32,
        sql: String,
        params: Vec<wit_sqlite::Value>,
    ) -> Result<u64, String> {
        let started = std::time::Instant::now();
        let params = params.into_iter().map(from_wit_value).collect();
        let r = self.sqlite.execute(db, sql, params).await;
        self.base.deadline().extend(started.elapsed());
        r
    }

    async fn query(
        &mut self,
        db: u32,
        sql: String,
        params: Vec<wit_sqlite::Value>,
    ) -> Result<wit_sqlite::Rows, String> {
        let started = std::time::Instant::now();
        let params = params.into_iter().map(from_wit_value).collect();
        let r = self.sqlite.query(db, sql, params).await;
        self.base.deadline().extend(started.elapsed());
        r.map(|rows| wit_sqlite::Rows {
            columns: rows.columns,
            rows: rows
                .rows
                .into_iter()
                .map(|row| row.into_iter().map(to_wit_value).collect())
                .collect(),
        })
    }

    async fn close(&mut self, db: u32) {
        self.sqlite.close(db)
    }
}

use source_bindings::weir::plugin::state as wit_state;

/// The `state` capability: every call goes to the connector's own [`super::StateGrant`].
/// A `set` appends to the log synchronously (a local write, like the offset commit of a
/// source); its time is given back to the guest's call deadline.
impl wit_state::Host for ConnectorState {
    fn get(&mut self, key: String) -> Option<Vec<u8>> {
        self.state.as_ref().and_then(|s| s.get(&key))
    }

    fn set(&mut self, key: String, value: Option<Vec<u8>>) -> Result<(), String> {
        let Some(state) = &self.state else {
            return Err("state: no stored state is granted to this connector".into());
        };
        let started = std::time::Instant::now();
        let r = state.set(&key, value);
        self.base.deadline().extend(started.elapsed());
        r
    }

    fn keys(&mut self) -> Vec<String> {
        self.state.as_ref().map(|s| s.keys()).unwrap_or_default()
    }
}

/// A store with limits, deadline and grants, and a linker with WASI and `log`.
fn new_store(
    shared: &Shared,
    name: &Arc<str>,
    grants: &ConnectorGrants,
) -> Result<Store<ConnectorState>, PluginError> {
    let base = StoreState::with_dirs(name, &shared.limits, &grants.dirs).map_err(|message| {
        PluginError::Host {
            message: format!("connector {name}: {message}"),
        }
    })?;
    Ok(sandboxed_store(
        shared,
        ConnectorState {
            base,
            name: name.clone(),
            sqlite: SqliteConns::new(
                name.clone(),
                grants.sqlite_database.clone(),
                DEFAULT_BUSY_TIMEOUT_MS,
            ),
            http: wasmtime_wasi_http::WasiHttpCtx::new(),
            http_hooks: super::http::HttpHooks::new(name.clone(), &grants.http_hosts),
            state: grants.state.clone(),
        },
    ))
}

/// The linker of both connector worlds: WASI, wasi:http, and weir's `log`, `sqlite` and
/// `state` (one type per interface in both worlds, so one linker serves both; what a
/// connector may reach through them is decided by its grants in the store).
fn linker(shared: &Shared) -> Result<Linker<ConnectorState>, PluginError> {
    let mut linker = wasi_linker(&shared.engine)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker).map_err(|e| {
        PluginError::Host {
            message: format!("linking wasi:http: {e:#}"),
        }
    })?;
    let host = |what: &str, e: wasmtime::Error| PluginError::Host {
        message: format!("linking {what}: {e:#}"),
    };
    source_bindings::weir::plugin::log::add_to_linker::<_, HasSelf<ConnectorState>>(
        &mut linker,
        |s| s,
    )
    .map_err(|e| host("log", e))?;
    wit_sqlite::add_to_linker::<_, HasSelf<ConnectorState>>(&mut linker, |s| s)
        .map_err(|e| host("sqlite", e))?;
    wit_state::add_to_linker::<_, HasSelf<ConnectorState>>(&mut linker, |s| s)
        .map_err(|e| host("state", e))?;
    Ok(linker)
}

fn to_wit_record<R>(
    r: &Record,
    make: impl FnOnce(Option<Vec<u8>>, Option<Vec<u8>>, Vec<(String, Option<Vec<u8>>)>, i64) -> R,
) -> R {
    make(
        r.key.as_ref().map(|b| b.to_vec()),
        r.value.as_ref().map(|b| b.to_vec()),
        r.headers
            .iter()
            .map(|h| (h.key.clone(), h.value.as_ref().map(|v| v.to_vec())))
            .collect(),
        r.timestamp_ms,
    )
}

/// Builds a loaded-connector failure from a wasmtime error, looking at the store.
fn failed(name: &str, shared: &Shared, state: &ConnectorState, e: &wasmtime::Error) -> PluginError {
    call_error(name, &shared.limits, &state.base, e)
}

fn dead(name: &str) -> PluginError {
    PluginError::Host {
        message: format!("connector {name}: the instance failed earlier; restart the task"),
    }
}

/// A loaded source connector task (world `source-connector`): one instance.
pub struct SourceConnector {
    shared: Arc<Shared>,
    name: Arc<str>,
    live: Option<(Store<ConnectorState>, source_bindings::SourceConnector)>,
    /// `poll` durations and failures.
    poll_calls: PluginCalls,
    /// `commit` durations and failures.
    commit_calls: PluginCalls,
}

/// A loaded sink connector task (world `sink-connector`): one instance.
pub struct SinkConnector {
    shared: Arc<Shared>,
    name: Arc<str>,
    live: Option<(Store<ConnectorState>, sink_bindings::SinkConnector)>,
    /// `put` durations and failures.
    put_calls: PluginCalls,
    /// `flush` durations and failures.
    flush_calls: PluginCalls,
}

impl Bindings<ConnectorState> for source_bindings::SourceConnector {
    type Pre = source_bindings::SourceConnectorPre<ConnectorState>;
    const WORLD: &'static str = "source-connector";

    fn pre(pre: InstancePre<ConnectorState>) -> wasmtime::Result<Self::Pre> {
        source_bindings::SourceConnectorPre::new(pre)
    }

    async fn instantiate(
        pre: &Self::Pre,
        store: &mut Store<ConnectorState>,
    ) -> wasmtime::Result<Self> {
        pre.instantiate_async(store).await
    }
}

impl Bindings<ConnectorState> for sink_bindings::SinkConnector {
    type Pre = sink_bindings::SinkConnectorPre<ConnectorState>;
    const WORLD: &'static str = "sink-connector";

    fn pre(pre: InstancePre<ConnectorState>) -> wasmtime::Result<Self::Pre> {
        sink_bindings::SinkConnectorPre::new(pre)
    }

    async fn instantiate(
        pre: &Self::Pre,
        store: &mut Store<ConnectorState>,
    ) -> wasmtime::Result<Self> {
        pre.instantiate_async(store).await
    }
}

impl PluginHost {
    /// Loads and instantiates a source connector component (world `source-connector`)
    /// from `path` with `grants`. Call [`SourceConnector::open`] next.
    ///
    /// Errors: as [`PluginHost::load_transform`] (without `Open`); [`PluginError::Host`]
    /// when a granted directory cannot be opened.
    pub async fn load_source_connector(
        &self,
        path: &Path,
        grants: &ConnectorGrants,
    ) -> Result<SourceConnector, PluginError> {
        let (name, live) = self.load_connector(path, grants).await?;
        Ok(SourceConnector {
            poll_calls: self.shared.calls(&name, "poll"),
            commit_calls: self.shared.calls(&name, "commit"),
            shared: self.shared.clone(),
            name,
            live: Some(live),
        })
    }

    /// Loads and instantiates a sink connector component (world `sink-connector`). Call
    /// [`SinkConnector::open`] next.
    ///
    /// Errors: as [`PluginHost::load_source_connector`].
    pub async fn load_sink_connector(
        &self,
        path: &Path,
        grants: &ConnectorGrants,
    ) -> Result<SinkConnector, PluginError> {
        let (name, live) = self.load_connector(path, grants).await?;
        Ok(SinkConnector {
            put_calls: self.shared.calls(&name, "put"),
            flush_calls: self.shared.calls(&name, "flush"),
            shared: self.shared.clone(),
            name,
            live: Some(live),
        })
    }

    /// Checks, without instantiating it, that the component at `path` is a connector of
    /// the world asked (`sink`: `sink-connector`, else `source-connector`) and links with
    /// what weir provides: what connector validation (`POST /connectors`,
    /// `config/validate`) asks before accepting a config. Compiles the component (cached)
    /// on the calling thread.
    ///
    /// Errors: [`PluginError::Read`] (no such file), `NotWasm`, `NotComponent`, `Compile`;
    /// [`PluginError::WrongWorld`] saying what the component is instead — a transform or
    /// partitioner ("it is a transform ..."), the other connector world — or what does
    /// not link.
    pub fn check_connector(&self, path: &Path, sink: bool) -> Result<(), PluginError> {
        let (name, component) = self.component(path)?;
        self.check_exports(&name, &component, sink)?;
        let linker = linker(&self.shared)?;
        if sink {
            link::<_, sink_bindings::SinkConnector>(&linker, &component, &name)?;
        } else {
            link::<_, source_bindings::SourceConnector>(&linker, &component, &name)?;
        }
        Ok(())
    }

    /// Before linking `component` (plugin `name`) as a connector (`sink` or source):
    /// when it exports another world's interface, says what it is in weir's terms rather
    /// than the linker's.
    ///
    /// Errors: [`PluginError::WrongWorld`] naming a transform or partitioner (pointing at
    /// `weir transform deploy`) or the other connector world.
    fn check_exports(
        &self,
        name: &str,
        component: &wasmtime::component::Component,
        sink: bool,
    ) -> Result<(), PluginError> {
        let world = if sink {
            "sink-connector"
        } else {
            "source-connector"
        };
        let wrong = |message: String| PluginError::WrongWorld {
            plugin: name.to_string(),
            world,
            message,
        };
        let (_, exports) = super::instance::names(&self.shared.engine, component);
        let version = super::instance::PACKAGE_VERSION;
        let exported = |iface: &str| {
            let full = format!("weir:plugin/{iface}@{version}");
            exports.contains(&full).then_some(full)
        };
        for (other, iface) in [("transform", "transformer"), ("partitioner", "partition")] {
            if let Some(full) = exported(iface) {
                return Err(wrong(format!(
                    "it is a {other} component (exports `{full}`), not a connector: deploy a \
                     transform with `weir transform deploy` (POST /transforms) or name it in a \
                     connector's `transforms.<alias>.type`"
                )));
            }
        }
        match (sink, exported("source"), exported("sink")) {
            (true, Some(full), None) => Err(wrong(format!(
                "it is a source connector (exports `{full}`): a config with `topics` or \
                 `topics.regex` makes a sink; drop them and set `topic`"
            ))),
            (false, None, Some(full)) => Err(wrong(format!(
                "it is a sink connector (exports `{full}`): a sink needs `topics` or \
                 `topics.regex`"
            ))),
            _ => Ok(()),
        }
    }

    /// The one loader of both connector worlds: the component at `path` linked as world
    /// `W` ([`linker`]) and instantiated in a store with `grants`, not yet opened (each
    /// world's `open` takes more than a config). Returns the plugin name and the live
    /// instance.
    async fn load_connector<W: Bindings<ConnectorState>>(
        &self,
        path: &Path,
        grants: &ConnectorGrants,
    ) -> Result<(Arc<str>, (Store<ConnectorState>, W)), PluginError> {
        let (name, component) = self.component(path)?;
        self.check_exports(&name, &component, W::WORLD == "sink-connector")?;
        let pre = link::<_, W>(&linker(&self.shared)?, &component, &name)?;
        let mut store = new_store(&self.shared, &name, grants)?;
        match W::instantiate(&pre, &mut store).await {
            Ok(world) => Ok((name, (store, world))),
            Err(e) => Err(failed(&name, &self.shared, store.data(), &e)),
        }
    }
}

/// Runs one call on a live instance: a fresh deadline and stderr tail first; a wasmtime
/// error (trap, timeout, memory) drops the instance. `$call` is a closure-like block
/// given `store` and `world`.
macro_rules! call {
    ($self:ident, |$store:ident, $world:ident| $body:expr) => {{
        let timeout_ms = $self.shared.limits.call_timeout_ms;
        let Some((store, world)) = $self.live.as_mut() else {
            return Err(dead(&$self.name));
        };
        begin_call(store, timeout_ms);
        let result = {
            let $store = &mut *store;
            let $world = &*world;
            $body.await
        };
        match result {
            Ok(v) => Ok(v),
            Err(e) => {
                let err = failed(&$self.name, &$self.shared, store.data(), &e);
                $self.live = None;
                Err(err)
            }
        }
    }};
}

fn to_wit_positions(positions: &[SourcePosition]) -> Vec<src_types::SourcePosition> {
    positions
        .iter()
        .map(|p| src_types::SourcePosition {
            source_partition: p.source_partition.clone(),
            source_offset: p.source_offset.clone(),
        })
        .collect()
}

fn plugin_failed(name: &str, message: String, record_index: Option<u32>) -> PluginError {
    PluginError::Failed {
        plugin: name.to_string(),
        message,
        record_index,
    }
}

impl SourceConnector {
    /// The component's name (its file name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `open(config, offsets)`.
    ///
    /// Errors: [`PluginError::Open`] with the connector's message; a trap, timeout or
    /// memory limit (the instance is then dead).
    pub async fn open(
        &mut self,
        config: &[(String, String)],
        offsets: &[SourcePosition],
    ) -> Result<(), PluginError> {
        let config = config.to_vec();
        let offsets = to_wit_positions(offsets);
        let r = call!(self, |store, world| world
            .weir_plugin_source()
            .call_open(store, &config, &offsets))?;
        r.map_err(|e| PluginError::Open {
            plugin: self.name.to_string(),
            message: e.message,
        })
    }

    /// `poll(max-records)`: at most `max_records` records (more is refused as
    /// [`PluginError::BadOutput`]).
    ///
    /// Errors: [`PluginError::Failed`] with the connector's message; a trap, timeout or
    /// memory limit (the instance is then dead).
    pub async fn poll(&mut self, max_records: u32) -> Result<Vec<SourceRecord>, PluginError> {
        let started = Instant::now();
        let result = self.poll_once(max_records).await;
        self.poll_calls.record(started.elapsed(), result.is_err());
        result
    }

    /// [`SourceConnector::poll`], untimed.
    async fn poll_once(&mut self, max_records: u32) -> Result<Vec<SourceRecord>, PluginError> {
        let r = call!(self, |store, world| world
            .weir_plugin_source()
            .call_poll(store, max_records))?;
        let records = r.map_err(|e| plugin_failed(&self.name, e.message, e.record_index))?;
        if records.len() > max_records as usize {
            return Err(PluginError::BadOutput {
                plugin: self.name.to_string(),
                message: format!(
                    "poll returned {} records, more than the {max_records} asked for",
                    records.len()
                ),
            });
        }
        Ok(records
            .into_iter()
            .map(|r| SourceRecord {
                record: Record {
                    key: r.record.key.map(Bytes::from),
                    value: r.record.value.map(Bytes::from),
                    headers: r
                        .record
                        .headers
                        .into_iter()
                        .map(|h| Header {
                            key: h.key,
                            value: h.value.map(Bytes::from),
                        })
                        .collect(),
                    timestamp_ms: r.record.timestamp_ms,
                },
                source_partition: r.source_partition,
                source_offset: r.source_offset,
                topic: r.topic,
            })
            .collect())
    }

    /// `commit(offsets)`: tells the connector these offsets are durable.
    ///
    /// Errors: a trap, timeout or memory limit (the instance is then dead).
    pub async fn commit(&mut self, offsets: &[SourcePosition]) -> Result<(), PluginError> {
        let started = Instant::now();
        let result = self.commit_once(offsets).await;
        self.commit_calls.record(started.elapsed(), result.is_err());
        result
    }

    /// [`SourceConnector::commit`], untimed.
    async fn commit_once(&mut self, offsets: &[SourcePosition]) -> Result<(), PluginError> {
        let offsets = to_wit_positions(offsets);
        call!(self, |store, world| world
            .weir_plugin_source()
            .call_commit(store, &offsets))
    }

    /// `close()`; the instance is dropped afterwards whatever happens.
    ///
    /// Errors: a trap, timeout or memory limit.
    pub async fn close(&mut self) -> Result<(), PluginError> {
        let r = call!(self, |store, world| world
            .weir_plugin_source()
            .call_close(store));
        self.live = None;
        r
    }
}

impl SinkConnector {
    /// The component's name (its file name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `open(config, partitions)`.
    ///
    /// Errors: [`PluginError::Open`] with the connector's message; a trap, timeout or
    /// memory limit (the instance is then dead).
    pub async fn open(
        &mut self,
        config: &[(String, String)],
        partitions: &[(String, i32)],
    ) -> Result<(), PluginError> {
        let config = config.to_vec();
        let partitions: Vec<sink_types::TopicPartition> = partitions
            .iter()
            .map(|(topic, partition)| sink_types::TopicPartition {
                topic: topic.clone(),
                partition: *partition,
            })
            .collect();
        let r = call!(self, |store, world| world.weir_plugin_sink().call_open(
            store,
            &config,
            &partitions
        ))?;
        r.map_err(|e| PluginError::Open {
            plugin: self.name.to_string(),
            message: e.message,
        })
    }

    /// `put(records)`: which records are errant, and whether to put the rest again.
    ///
    /// Errors: [`PluginError::Failed`] with the connector's message;
    /// [`PluginError::BadOutput`] for an errant index or `settled` count outside the
    /// batch; a trap, timeout or memory limit (the instance is then dead).
    pub async fn put(&mut self, records: &[SinkRecord]) -> Result<PutOutcome, PluginError> {
        let started = Instant::now();
        let result = self.put_once(records).await;
        self.put_calls.record(started.elapsed(), result.is_err());
        result
    }

    /// [`SinkConnector::put`], untimed.
    async fn put_once(&mut self, records: &[SinkRecord]) -> Result<PutOutcome, PluginError> {
        let records: Vec<sink_types::SinkRecord> = records
            .iter()
            .map(|r| sink_types::SinkRecord {
                record: to_wit_record(&r.record, |key, value, headers, timestamp_ms| {
                    sink_bindings::weir::plugin::types::Record {
                        key,
                        value,
                        headers: headers
                            .into_iter()
                            .map(|(key, value)| sink_bindings::weir::plugin::types::Header {
                                key,
                                value,
                            })
                            .collect(),
                        timestamp_ms,
                    }
                }),
                topic: r.topic.clone(),
                partition: r.partition,
                offset: r.offset,
            })
            .collect();
        let len = records.len();
        let r = call!(self, |store, world| world
            .weir_plugin_sink()
            .call_put(store, &records))?;
        let r = r.map_err(|e| plugin_failed(&self.name, e.message, e.record_index))?;
        let settled = r.retry.as_ref().map_or(len, |t| t.settled as usize);
        let bad = |message: String| PluginError::BadOutput {
            plugin: self.name.to_string(),
            message,
        };
        if settled > len {
            return Err(bad(format!(
                "put settled {settled} records of a batch of {len}"
            )));
        }
        let mut errant: Vec<ErrantRecord> = r
            .errant
            .into_iter()
            .map(|e| ErrantRecord {
                index: e.index,
                reason: e.reason,
            })
            .collect();
        if let Some(e) = errant.iter().find(|e| e.index as usize >= settled) {
            return Err(bad(format!(
                "put reported record {} as errant, outside the {settled} settled records",
                e.index
            )));
        }
        errant.sort_by_key(|e| e.index);
        errant.dedup_by_key(|e| e.index);
        Ok(PutOutcome {
            errant,
            retry: r.retry.map(|t| PutRetry {
                settled: t.settled,
                after_ms: t.after_ms,
            }),
        })
    }

    /// `flush(offsets)`: ok means everything put is durable and `offsets` may be
    /// committed.
    ///
    /// Errors: as [`SinkConnector::put`].
    pub async fn flush(&mut self, offsets: &[TopicOffset]) -> Result<(), PluginError> {
        let started = Instant::now();
        let result = self.flush_once(offsets).await;
        self.flush_calls.record(started.elapsed(), result.is_err());
        result
    }

    /// [`SinkConnector::flush`], untimed.
    async fn flush_once(&mut self, offsets: &[TopicOffset]) -> Result<(), PluginError> {
        let offsets: Vec<sink_types::TopicOffset> = offsets
            .iter()
            .map(|o| sink_types::TopicOffset {
                topic: o.topic.clone(),
                partition: o.partition,
                offset: o.offset,
            })
            .collect();
        let r = call!(self, |store, world| world
            .weir_plugin_sink()
            .call_flush(store, &offsets))?;
        r.map_err(|e| plugin_failed(&self.name, e.message, e.record_index))
    }

    /// `close()`; the instance is dropped afterwards whatever happens.
    ///
    /// Errors: a trap, timeout or memory limit.
    pub async fn close(&mut self) -> Result<(), PluginError> {
        let r = call!(self, |store, world| world
            .weir_plugin_sink()
            .call_close(store));
        self.live = None;
        r
    }
}
