//! Connector configs, Kafka Connect's keys: from a TOML file per connector
//! ([`file_properties`], a thin front) or a REST body
//! ([`ConnectorConfig::properties_from_json`]), both checked by
//! [`ConnectorConfig::from_map`] over the same string map.
//!
//! Keys read by the runtime (every key, these included, is also passed to the component's
//! `open` as a string):
//!
//! | key | meaning |
//! |---|---|
//! | `name` | connector name (required; also the sink's group `connect-<name>`) |
//! | `connector.class` | `file-source`, `file-sink`, `sqlite-cdc`, `sqlite-sink`, or a path to a `.wasm` component |
//! | `tasks.max` | default 1; only 1 task runs (more is accepted and logged, as Kafka Connect lets a connector run fewer tasks than asked) |
//! | `topic` | source: topic for records that name none |
//! | `topics` | sink: comma-separated topics (its presence makes the connector a sink) |
//! | `topics.regex` | sink, instead of `topics`: every topic whose whole name matches (internal `__*` topics excepted), including topics created later ([`TopicsRegex`]) |
//! | `file` | file connectors: the file; its directory (symlinks and `..` resolved, [`resolve`]) is the one path the component may open (read-only for a source, read-write for a sink); within the broker's `connect.allowed.paths` ([`Ceiling`]) |
//! | `database` | SQLite connectors: the database file (resolved), the one file the component's `sqlite` interface may open; within `connect.allowed.paths` |
//! | `batch.size` | most records per `poll` / `put` (default 2000, FileStreamSource's) |
//! | `errors.tolerance` | `none` (default): a record that fails conversion, a transform or the sink fails the task, and a source record its topic refuses (too large, keyless on a compacted topic) fails it for good (FAILED, no restart); `all`: it is skipped — a sink's, and a source's refused record, go to the dead-letter topic when one is set, otherwise it is logged |
//! | `errors.deadletterqueue.topic.name` | under `errors.tolerance=all`: topic for a sink's errant records and a source's refused ones, with Kafka Connect's `__connect.errors.*` headers |
//! | `key.converter`, `value.converter` (+ `.schemas.enable`) | how keys and values are written to / read from topics: `bytes` (default), `string`, `json` ([`super::convert`]) |
//! | `transforms` (+ `transforms.<alias>.*`) | a chain of transform components applied in the connector ([`super::smt`]) |
//! | `http.url` | HTTP connectors: the URL polled (source) or posted to (sink) |
//! | `http.allowed.hosts` | hosts (`host` = any port, `host:port`) the component may reach over HTTP, comma-separated, including `http.url`'s; default: the host and port of `http.url`; neither key: no HTTP at all; within the broker's `connect.http.allowed.hosts` |
//! | `retry.backoff.max.ms` | sink: cap on the wait a `put` asks for before its batch is put again (default 30000) |
//! | `errors.retry.timeout` | ms a failing task is restarted for before it is FAILED (default 60000; -1 forever, 0 never) |
//! | `errors.retry.delay.max.ms` | longest wait between restarts (default 60000; waits start at 100 ms and double) |
//! | `poll.interval.ms` | source: wait after a poll that returned nothing (default 200) |
//! | `offset.flush.interval.ms` | sink: how often `flush` + offset commit run (default 10000), and always at stop |
//! | `exactly.once.support` | source (KIP-618): `requested` (default) or `required`; `required` is refused unless the broker's `connect.exactly.once.source.support` is `enabled` |
//! | `transaction.boundary` | source, exactly once (KIP-618): `poll` (default: one transaction per poll) or `interval` (one per `transaction.boundary.interval.ms`); `connector` is refused: no weir connector can define transaction boundaries (the WIT source world has no `TransactionContext`) |
//! | `transaction.boundary.interval.ms` | with `transaction.boundary=interval`: ms between commits (default `offset.flush.interval.ms`) |
//!
//! A TOML value may be a string, integer, float or boolean (written as text), or an
//! array of those (joined with commas); nested tables become dotted keys, so
//! `connector.class = "file-source"` and `"connector.class" = "file-source"` are the same.
//! A key that is also the prefix of another (`transforms` and `transforms.mask.type`,
//! `value.converter` and `value.converter.schemas.enable`) cannot be both a value and a
//! table in TOML: write the longer keys quoted, `"transforms.mask.type" = "..."`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Which way a connector moves records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnectorKind {
    /// Into topics (world `source-connector`).
    Source,
    /// Out of topics (world `sink-connector`).
    Sink,
}

/// Where the component comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ConnectorClass {
    /// A connector shipped in `connectors/` (`file-source`, `file-sink`).
    BuiltIn(&'static str),
    /// A component file named by path.
    Path(PathBuf),
}

/// The built-in connectors: `connector.class` name and direction.
pub(crate) const BUILT_INS: &[(&str, ConnectorKind)] = &[
    ("file-source", ConnectorKind::Source),
    ("file-sink", ConnectorKind::Sink),
    ("sqlite-cdc", ConnectorKind::Source),
    ("sqlite-sink", ConnectorKind::Sink),
    ("http-source", ConnectorKind::Source),
    ("http-sink", ConnectorKind::Sink),
];

/// The keys a built-in connector cannot run without (checked at load, each refusal
/// naming its key).
pub(crate) fn required_keys(built_in: &str) -> &'static [&'static str] {
    match built_in {
        "file-source" | "file-sink" => &["file"],
        "sqlite-cdc" => &["database", "tables", "topic.prefix"],
        "sqlite-sink" => &["database"],
        "http-source" | "http-sink" => &["http.url"],
        _ => &[],
    }
}

/// `errors.tolerance`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorTolerance {
    /// A failed record fails the task (Kafka Connect's default).
    None,
    /// A failed record is skipped: a sink sends it to `errors.deadletterqueue.topic.name`
    /// when set, and so does a source for a record its topic refuses; otherwise it is
    /// logged.
    All,
}

/// `exactly.once.support` of a source connector (KIP-618).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExactlyOnceSupport {
    /// `requested` (the default): exactly once when the broker has it enabled.
    Requested,
    /// `required`: refused unless the broker's `connect.exactly.once.source.support` is
    /// `enabled` (weir's connectors always can: their position is their source offsets).
    Required,
}

/// `transaction.boundary` of a source connector (KIP-618): where an exactly-once task
/// commits. `connector` (the connector decides) is refused: no weir connector can.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TransactionBoundary {
    /// `poll` (the default): one transaction per non-empty poll.
    Poll,
    /// `interval`: one transaction for all polls within this many ms
    /// (`transaction.boundary.interval.ms`, default `offset.flush.interval.ms`).
    Interval(u64),
}

/// A sink's `topics.regex`: Kafka Connect's pattern subscription, a Java regex matched
/// against the whole topic name (`Pattern.matcher(topic).matches()`), here compiled with
/// the `regex` crate, whose syntax is Java's for everything but look-around and
/// back-references (refused as a config error). Internal topics (`__` prefix) never
/// match, as the Java consumer excludes them by default (`exclude.internal.topics`).
#[derive(Debug, Clone)]
pub(crate) struct TopicsRegex {
    pattern: String,
    anchored: regex::Regex,
}

impl TopicsRegex {
    /// Compiles `pattern`, anchored at both ends.
    ///
    /// Errors: the `regex` crate's message for a pattern it cannot compile.
    pub(crate) fn new(pattern: &str) -> Result<TopicsRegex, String> {
        let anchored = regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
            .size_limit(1 << 20)
            .build()
            .map_err(|e| format!("`{pattern}` is not a valid regex: {e}"))?;
        Ok(TopicsRegex {
            pattern: pattern.to_string(),
            anchored,
        })
    }

    /// Whether the sink consumes `topic`: the whole name matches and it is not internal.
    pub(crate) fn matches(&self, topic: &str) -> bool {
        !topic.starts_with("__") && self.anchored.is_match(topic)
    }
}

/// Equal when the patterns are the same text.
impl PartialEq for TopicsRegex {
    fn eq(&self, other: &Self) -> bool {
        self.pattern == other.pattern
    }
}

/// One connector's config, checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ConnectorConfig {
    /// `name`.
    pub name: String,
    /// `connector.class`.
    pub class: ConnectorClass,
    /// Source or sink.
    pub kind: ConnectorKind,
    /// `tasks.max` as given (only one task runs).
    pub tasks_max: u32,
    /// `topic` (sources).
    pub topic: Option<String>,
    /// `topics` (sinks).
    pub topics: Vec<String>,
    /// `topics.regex` (sinks; exactly one of it and `topics` is set).
    pub topics_regex: Option<TopicsRegex>,
    /// `file`, made absolute.
    pub file: Option<PathBuf>,
    /// `database` (SQLite connectors), made absolute: the one database file the
    /// connector's `sqlite` interface may open.
    pub database: Option<PathBuf>,
    /// `batch.size`.
    pub batch_size: u32,
    /// `errors.tolerance`.
    pub errors_tolerance: ErrorTolerance,
    /// `errors.deadletterqueue.topic.name` (sinks, with `errors.tolerance=all`).
    pub dlq_topic: Option<String>,
    /// Hosts the component may reach over HTTP: `http.allowed.hosts`, or by default the
    /// host and port of `http.url`; empty without either.
    pub http_hosts: Vec<crate::plugin::HttpHost>,
    /// `retry.backoff.max.ms`: the longest a sink's asked-for wait before a retried
    /// `put` is honoured (default 30000).
    pub retry_backoff_max_ms: u64,
    /// `errors.retry.timeout` in ms; `None` = retry forever (-1).
    pub retry_timeout_ms: Option<u64>,
    /// `errors.retry.delay.max.ms`.
    pub retry_delay_max_ms: u64,
    /// `poll.interval.ms`.
    pub poll_interval_ms: u64,
    /// `offset.flush.interval.ms`.
    pub offset_flush_interval_ms: u64,
    /// `exactly.once.support` (sources; KIP-618).
    pub exactly_once_support: ExactlyOnceSupport,
    /// `transaction.boundary` (+ `transaction.boundary.interval.ms`; sources, exactly once).
    pub transaction_boundary: TransactionBoundary,
    /// `key.converter`.
    pub key_converter: super::convert::Converter,
    /// `value.converter`.
    pub value_converter: super::convert::Converter,
    /// `transforms`: the chain, in order.
    pub transforms: Vec<super::smt::SmtSpec>,
    /// Every key as a string, in key order, for the component's `open` (`file` made
    /// absolute).
    pub pairs: Vec<(String, String)>,
}

/// Why a connector config was refused: the file, the key when one is to blame, the reason.
#[derive(Debug, Clone, thiserror::Error)]
#[error("connector config {}: {}{message}", path.display(), key.as_ref().map(|k| format!("`{k}`: ")).unwrap_or_default())]
pub(crate) struct ConfigError {
    /// The file.
    pub path: PathBuf,
    /// The offending key.
    pub key: Option<String>,
    /// What is wrong.
    pub message: String,
}

/// `path` made absolute with every symbolic link and `..` resolved as the OS resolves
/// them (its longest existing ancestor canonicalized, the rest appended): what a
/// connector is granted is then the place the ceiling check looked at, and a link or a
/// `..` cannot lead a grant out of an allowed directory.
///
/// Errors: the path cannot be made absolute, or a `..` follows a part that does not
/// exist yet (it cannot be resolved).
pub(crate) fn resolve(path: &str) -> Result<PathBuf, String> {
    let absolute =
        std::path::absolute(path).map_err(|e| format!("cannot make `{path}` absolute: {e}"))?;
    let mut rest: Vec<std::ffi::OsString> = Vec::new();
    let mut at = absolute.as_path();
    loop {
        if let Ok(real) = at.canonicalize() {
            let mut out = real;
            for part in rest.iter().rev() {
                out.push(part);
            }
            return Ok(out);
        }
        match at.components().next_back() {
            Some(std::path::Component::Normal(name)) => rest.push(name.to_os_string()),
            Some(std::path::Component::CurDir) => {}
            _ => {
                return Err(format!(
                    "cannot resolve `{path}`: `..` after a part that does not exist"
                ))
            }
        }
        at = match at.parent() {
            Some(p) => p,
            None => return Ok(absolute),
        };
    }
}

/// The broker's ceiling on what connectors may be granted (`connect.allowed.paths`,
/// `connect.http.allowed.hosts`): a connector's config narrows it, never widens it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ceiling {
    /// Allowed directories (everything under them) or files, resolved ([`resolve`]).
    pub paths: Vec<PathBuf>,
    /// Allowed hosts; `None`: any host (`*`).
    pub hosts: Option<Vec<crate::plugin::HttpHost>>,
    /// Never granted, even inside an allowed directory: the broker's `log.dirs` and
    /// `plugin.cache.dir` (compiled components are trusted native code).
    pub denied: Vec<PathBuf>,
}

impl Ceiling {
    /// The ceiling of `connect.allowed.paths` (`paths`, relative ones against the working
    /// directory) and `connect.http.allowed.hosts` (`hosts`), never granting `denied`
    /// (the broker's own directories: `log.dirs`, `plugin.cache.dir`). An allowed path
    /// that cannot be resolved is dropped with a log line.
    pub(crate) fn new(
        paths: &[PathBuf],
        hosts: Option<Vec<crate::plugin::HttpHost>>,
        denied: &[&Path],
    ) -> Ceiling {
        let resolved = |p: &Path| resolve(&p.to_string_lossy());
        let paths = paths
            .iter()
            .filter_map(|p| match resolved(p) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::error!(path = %p.display(), error = %e, "connect.allowed.paths: entry ignored");
                    None
                }
            })
            .collect();
        Ceiling {
            paths,
            hosts,
            denied: denied.iter().filter_map(|d| resolved(d).ok()).collect(),
        }
    }

    /// Checks what `c` would be granted against the ceiling: the directory of its `file`
    /// and its `database` inside an allowed path and clear of `log.dirs`, each of its
    /// HTTP hosts covered by an allowed host.
    ///
    /// Errors: [`ConfigError`] on the key whose grant is outside (`file`, `database`,
    /// `http.allowed.hosts`, or `http.url` when it sets the hosts), saying how to widen
    /// the ceiling.
    pub(crate) fn check(&self, origin: &Path, c: &ConnectorConfig) -> Result<(), ConfigError> {
        let fail = |key: &str, message: String| ConfigError {
            path: origin.to_path_buf(),
            key: Some(key.to_string()),
            message,
        };
        let allowed_list = || {
            if self.paths.is_empty() {
                "empty".to_string()
            } else {
                self.paths
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        let grants = [
            ("file", c.file.as_deref().and_then(Path::parent)),
            ("database", c.database.as_deref()),
        ];
        for (key, grant) in grants {
            let Some(grant) = grant else { continue };
            if let Some(d) = self
                .denied
                .iter()
                .find(|d| grant.starts_with(d) || d.starts_with(grant))
            {
                return Err(fail(
                    key,
                    format!(
                        "`{}` overlaps the broker's own directory {} (log.dirs or plugin.cache.dir): a connector is never granted the broker's files",
                        grant.display(),
                        d.display()
                    ),
                ));
            }
            if !self.paths.iter().any(|a| grant.starts_with(a)) {
                return Err(fail(
                    key,
                    format!(
                        "`{}` is outside connect.allowed.paths ({}): a connector may only be granted what the broker's ceiling allows; widen it in the broker config (connect.allowed.paths), not in the connector",
                        grant.display(),
                        allowed_list()
                    ),
                ));
            }
        }
        if let Some(ceiling) = &self.hosts {
            for h in &c.http_hosts {
                if !ceiling.iter().any(|a| a.covers(h)) {
                    let key = if c.pairs.iter().any(|(k, _)| k == "http.allowed.hosts") {
                        "http.allowed.hosts"
                    } else {
                        "http.url"
                    };
                    let list: Vec<String> = ceiling.iter().map(ToString::to_string).collect();
                    return Err(fail(
                        key,
                        format!(
                            "host `{h}` is outside connect.http.allowed.hosts ({}): widen it in the broker config, not in the connector",
                            if list.is_empty() { "empty".to_string() } else { list.join(", ") }
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

fn flatten(
    prefix: &str,
    value: &toml::Value,
    out: &mut BTreeMap<String, String>,
) -> Result<(), String> {
    let scalar = |v: &toml::Value| -> Option<String> {
        match v {
            toml::Value::String(s) => Some(s.clone()),
            toml::Value::Integer(i) => Some(i.to_string()),
            toml::Value::Float(f) => Some(f.to_string()),
            toml::Value::Boolean(b) => Some(b.to_string()),
            toml::Value::Datetime(d) => Some(d.to_string()),
            toml::Value::Array(_) | toml::Value::Table(_) => None,
        }
    };
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out)?;
            }
        }
        toml::Value::Array(items) => {
            let mut parts = Vec::with_capacity(items.len());
            for item in items {
                parts.push(
                    scalar(item)
                        .ok_or_else(|| format!("`{prefix}`: arrays may hold only plain values"))?,
                );
            }
            out.insert(prefix.to_string(), parts.join(","));
        }
        v => {
            if let Some(s) = scalar(v) {
                out.insert(prefix.to_string(), s);
            }
        }
    }
    Ok(())
}

/// The properties of connector TOML `text` (read from `path`, which names it in errors),
/// flattened to dotted keys with string values, unchecked.
///
/// Errors: [`ConfigError`] for bad TOML or an array holding tables.
pub(crate) fn file_properties(
    path: &Path,
    text: &str,
) -> Result<BTreeMap<String, String>, ConfigError> {
    let fail = |message: String| ConfigError {
        path: path.to_path_buf(),
        key: None,
        message,
    };
    let value: toml::Value = toml::from_str(text).map_err(|e| {
        let hint = if e.to_string().contains("cannot extend") {
            " (a key that is also the prefix of another key, like `transforms` and `transforms.x.type`, needs the longer one quoted: `\"transforms.x.type\" = ...`)"
        } else {
            ""
        };
        fail(format!("not TOML: {e}{hint}"))
    })?;
    let mut keys = BTreeMap::new();
    flatten("", &value, &mut keys).map_err(fail)?;
    Ok(keys)
}

impl ConnectorConfig {
    /// What a connector may open: the directory of its `file` (read-only for a source,
    /// read-write for a sink) and the SQLite file of its `database`, and nothing else. No
    /// `file`: no directory; no `database`: no SQLite file.
    pub(crate) fn file_grants(&self, writable: bool) -> crate::plugin::ConnectorGrants {
        let dirs = self
            .file
            .as_ref()
            .and_then(|f| f.parent())
            .map(|d| crate::plugin::DirGrant {
                host: d.to_path_buf(),
                guest: d.display().to_string(),
                writable,
            })
            .into_iter()
            .collect();
        crate::plugin::ConnectorGrants {
            dirs,
            sqlite_database: self.database.clone(),
            http_hosts: self.http_hosts.clone(),
            // Granted by the runtime, which owns the store (`Deps::grants`).
            state: None,
        }
    }

    /// Reads a JSON object of connector properties (a REST body's `config`): string
    /// values as they are, numbers and booleans as text (Kafka Connect's REST API takes
    /// `Map<String, String>` and Jackson coerces scalars the same way); `origin` names
    /// the source in errors (`REST`).
    ///
    /// Errors: [`ConfigError`] when `value` is not an object or holds an array, object
    /// or null.
    pub(crate) fn properties_from_json(
        origin: &Path,
        value: &serde_json::Value,
    ) -> Result<BTreeMap<String, String>, ConfigError> {
        let fail = |key: Option<&str>, message: String| ConfigError {
            path: origin.to_path_buf(),
            key: key.map(str::to_string),
            message,
        };
        let obj = value
            .as_object()
            .ok_or_else(|| fail(None, "the config must be a JSON object".into()))?;
        let mut keys = BTreeMap::new();
        for (k, v) in obj {
            let text = match v {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) => n.to_string(),
                serde_json::Value::Bool(b) => b.to_string(),
                serde_json::Value::Null
                | serde_json::Value::Array(_)
                | serde_json::Value::Object(_) => {
                    return Err(fail(
                        Some(k),
                        "values must be strings, numbers or booleans".into(),
                    ))
                }
            };
            keys.insert(k.clone(), text);
        }
        Ok(keys)
    }

    /// Checks connector properties `keys` (from a TOML file, a REST body or
    /// `__connect_configs`); `origin` (the file, or `REST`) names the source in errors.
    ///
    /// Errors: [`ConfigError`] for a key missing or invalid (naming it).
    pub(crate) fn from_map(
        origin: &Path,
        mut keys: BTreeMap<String, String>,
    ) -> Result<ConnectorConfig, ConfigError> {
        let path = origin;
        let fail = |key: Option<&str>, message: String| ConfigError {
            path: path.to_path_buf(),
            key: key.map(str::to_string),
            message,
        };
        let get = |k: &str| {
            keys.get(k)
                .map(String::as_str)
                .filter(|v| !v.trim().is_empty())
        };
        let number = |k: &str, default: i64, min: i64| -> Result<i64, ConfigError> {
            match get(k) {
                None => Ok(default),
                Some(v) => match v.trim().parse::<i64>() {
                    Ok(n) if n >= min => Ok(n),
                    Ok(_) => Err(fail(Some(k), format!("`{v}` is below the minimum {min}"))),
                    Err(_) => Err(fail(Some(k), format!("`{v}` is not an integer"))),
                },
            }
        };
        let name = get("name")
            .ok_or_else(|| fail(Some("name"), "required".into()))?
            .trim()
            .to_string();
        if name.len() > 200 || name.chars().any(|c| c.is_control() || c == '/') {
            return Err(fail(
                Some("name"),
                "at most 200 characters, no `/` or control characters".into(),
            ));
        }
        let class_text = get("connector.class")
            .ok_or_else(|| fail(Some("connector.class"), "required".into()))?
            .trim();
        let class = match BUILT_INS.iter().find(|(n, _)| *n == class_text) {
            Some((n, _)) => ConnectorClass::BuiltIn(n),
            None if class_text.ends_with(".wasm") => {
                ConnectorClass::Path(PathBuf::from(class_text))
            }
            None => {
                let known: Vec<&str> = BUILT_INS.iter().map(|(n, _)| *n).collect();
                return Err(fail(
                    Some("connector.class"),
                    format!("`{class_text}` is neither a built-in connector ({}) nor a path to a .wasm component", known.join(", ")),
                ));
            }
        };
        let topics: Vec<String> = get("topics")
            .map(|t| {
                t.split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let kind = match &class {
            ConnectorClass::BuiltIn(n) => BUILT_INS
                .iter()
                .find(|(b, _)| b == n)
                .map(|(_, k)| *k)
                .unwrap_or(ConnectorKind::Source),
            ConnectorClass::Path(_)
                if keys.contains_key("topics") || keys.contains_key("topics.regex") =>
            {
                ConnectorKind::Sink
            }
            ConnectorClass::Path(_) => ConnectorKind::Source,
        };
        let topics_regex = match get("topics.regex") {
            Some(p) => Some(TopicsRegex::new(p).map_err(|e| fail(Some("topics.regex"), e))?),
            None => None,
        };
        // Kafka Connect's SinkConnectorConfig.validate: exactly one of the two.
        if kind == ConnectorKind::Sink && topics.is_empty() && topics_regex.is_none() {
            return Err(fail(
                Some("topics"),
                "a sink needs `topics` (at least one topic) or `topics.regex`".into(),
            ));
        }
        if !topics.is_empty() && topics_regex.is_some() {
            return Err(fail(
                Some("topics.regex"),
                "set either `topics` or `topics.regex`, not both".into(),
            ));
        }
        let tasks_max = number("tasks.max", 1, 1)?;
        let tasks_max =
            u32::try_from(tasks_max).map_err(|_| fail(Some("tasks.max"), "too large".into()))?;
        let errors_tolerance = match get("errors.tolerance").map(str::trim) {
            None | Some("none") => ErrorTolerance::None,
            Some("all") => ErrorTolerance::All,
            Some(other) => {
                return Err(fail(
                    Some("errors.tolerance"),
                    format!("`{other}`: expected none or all"),
                ))
            }
        };
        // The directory is what a file connector is granted: resolved, so the ceiling
        // check sees where it really is. The file name is kept as given: a symlink there
        // stays a link the sandbox refuses to follow out of the directory.
        let file = match get("file").map(str::trim) {
            Some(f) => {
                let given = Path::new(f);
                let (Some(dir), Some(name)) = (given.parent(), given.file_name()) else {
                    return Err(fail(
                        Some("file"),
                        format!("`{f}` does not name a file in a directory"),
                    ));
                };
                let dir = if dir.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    dir
                };
                let dir = resolve(&dir.to_string_lossy()).map_err(|m| fail(Some("file"), m))?;
                Some(dir.join(name))
            }
            None => None,
        };
        if let ConnectorClass::BuiltIn(n) = &class {
            for key in required_keys(n) {
                if get(key).is_none() {
                    return Err(fail(Some(key), format!("required by {n}")));
                }
            }
        }
        // Resolved whole: the host opens the database by this path, following links.
        let database = match get("database") {
            Some(f) => Some(resolve(f.trim()).map_err(|m| fail(Some("database"), m))?),
            None => None,
        };
        let http_url = get("http.url").map(str::trim);
        let http_hosts = match (get("http.allowed.hosts"), http_url) {
            (Some(list), _) => list
                .split(',')
                .filter(|h| !h.trim().is_empty())
                .map(crate::plugin::HttpHost::parse)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|m| fail(Some("http.allowed.hosts"), m))?,
            (None, Some(url)) => {
                vec![crate::plugin::HttpHost::of_url(url).map_err(|m| fail(Some("http.url"), m))?]
            }
            (None, None) => Vec::new(),
        };
        if let (Some(url), Some(_)) = (http_url, get("http.allowed.hosts")) {
            let target =
                crate::plugin::HttpHost::of_url(url).map_err(|m| fail(Some("http.url"), m))?;
            if !http_hosts.iter().any(|h| h.covers(&target)) {
                return Err(fail(
                    Some("http.allowed.hosts"),
                    format!(
                        "does not include the host of http.url `{url}` ({}): every request would be denied",
                        target
                    ),
                ));
            }
        }
        let dlq_topic = get("errors.deadletterqueue.topic.name").map(|t| t.trim().to_string());
        if let Some(f) = &file {
            if f.file_name().is_none() || f.parent().is_none() {
                return Err(fail(
                    Some("file"),
                    format!("`{}` does not name a file in a directory", f.display()),
                ));
            }
        }
        let batch_size = number("batch.size", 2000, 1)?;
        let retry_timeout = number("errors.retry.timeout", 60_000, -1)?;
        let topic = get("topic").map(|t| t.trim().to_string());
        let retry_delay_max_ms = number("errors.retry.delay.max.ms", 60_000, 0)? as u64;
        let poll_interval_ms = number("poll.interval.ms", 200, 1)? as u64;
        let offset_flush_interval_ms = number("offset.flush.interval.ms", 10_000, 1)? as u64;
        let exactly_once_support = match get("exactly.once.support").map(str::trim) {
            None => ExactlyOnceSupport::Requested,
            Some(v) if v.eq_ignore_ascii_case("requested") => ExactlyOnceSupport::Requested,
            Some(v) if v.eq_ignore_ascii_case("required") => ExactlyOnceSupport::Required,
            Some(other) => {
                return Err(fail(
                    Some("exactly.once.support"),
                    format!("Invalid value {other} for configuration exactly.once.support: expected requested or required"),
                ))
            }
        };
        let boundary_interval_ms = number(
            "transaction.boundary.interval.ms",
            offset_flush_interval_ms as i64,
            0,
        )? as u64;
        let transaction_boundary = match get("transaction.boundary").map(str::trim) {
            None => TransactionBoundary::Poll,
            Some(v) if v.eq_ignore_ascii_case("poll") => TransactionBoundary::Poll,
            Some(v) if v.eq_ignore_ascii_case("interval") => {
                TransactionBoundary::Interval(boundary_interval_ms)
            }
            Some(v) if v.eq_ignore_ascii_case("connector") => {
                return Err(fail(
                    Some("transaction.boundary"),
                    "Invalid value connector for configuration transaction.boundary: no weir connector can define transaction boundaries (the WIT source world has no TransactionContext); use poll or interval".into(),
                ))
            }
            Some(other) => {
                return Err(fail(
                    Some("transaction.boundary"),
                    format!("Invalid value {other} for configuration transaction.boundary: expected poll, interval or connector"),
                ))
            }
        };
        let key_converter = super::convert::Converter::from_keys(&keys, "key")
            .map_err(|(k, m)| fail(Some(&k), m))?;
        let value_converter = super::convert::Converter::from_keys(&keys, "value")
            .map_err(|(k, m)| fail(Some(&k), m))?;
        let transforms = super::smt::specs_from_keys(&keys).map_err(|(k, m)| fail(Some(&k), m))?;
        let retry_backoff_max_ms = number("retry.backoff.max.ms", 30_000, 0)? as u64;
        if let Some(f) = &file {
            // The guest sees the absolute path the runtime grants.
            keys.insert("file".into(), f.display().to_string());
        }
        if let Some(d) = &database {
            keys.insert("database".into(), d.display().to_string());
        }
        Ok(ConnectorConfig {
            name,
            class,
            kind,
            tasks_max,
            topic,
            topics,
            topics_regex,
            file,
            database,
            batch_size: u32::try_from(batch_size.min(1_000_000)).unwrap_or(1_000_000),
            errors_tolerance,
            dlq_topic,
            http_hosts,
            retry_backoff_max_ms,
            retry_timeout_ms: u64::try_from(retry_timeout).ok(),
            retry_delay_max_ms,
            poll_interval_ms,
            offset_flush_interval_ms,
            exactly_once_support,
            transaction_boundary,
            key_converter,
            value_converter,
            transforms,
            pairs: keys.into_iter().collect(),
        })
    }

    /// The component file: a built-in's `<plugin_path>/<name with _>.wasm`, or the path
    /// given.
    pub(crate) fn component_path(&self, plugin_path: &Path) -> PathBuf {
        match &self.class {
            ConnectorClass::BuiltIn(n) => plugin_path.join(format!("{}.wasm", n.replace('-', "_"))),
            ConnectorClass::Path(p) => p.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ConnectorConfig, ConfigError> {
        let path = Path::new("c.toml");
        ConnectorConfig::from_map(path, file_properties(path, text)?)
    }

    #[test]
    fn dotted_and_quoted_keys_are_the_same() {
        let a = parse("name = \"a\"\nconnector.class = \"file-source\"\nfile = \"/tmp/x\"\ntopic = \"t\"\nbatch.size = 10\n").unwrap();
        let b = parse("name = \"a\"\n\"connector.class\" = \"file-source\"\nfile = \"/tmp/x\"\ntopic = \"t\"\n\"batch.size\" = \"10\"\n").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.kind, ConnectorKind::Source);
        assert_eq!(a.batch_size, 10);
        assert_eq!(
            a.component_path(Path::new("/p")),
            PathBuf::from("/p/file_source.wasm")
        );
    }

    #[test]
    fn exactly_once_keys_parse_and_bad_values_name_their_key() {
        let src = "name = \"s\"\nconnector.class = \"file-source\"\nfile = \"/tmp/x\"\n";
        let c = parse(src).unwrap();
        assert_eq!(c.exactly_once_support, ExactlyOnceSupport::Requested);
        assert_eq!(c.transaction_boundary, TransactionBoundary::Poll);
        let c = parse(&format!(
            "{src}exactly.once.support = \"REQUIRED\"\ntransaction.boundary = \"interval\"\noffset.flush.interval.ms = 700\n"
        ))
        .unwrap();
        assert_eq!(c.exactly_once_support, ExactlyOnceSupport::Required);
        // The interval defaults to offset.flush.interval.ms, as Kafka's to the worker's.
        assert_eq!(c.transaction_boundary, TransactionBoundary::Interval(700));
        let c = parse(&format!(
            "{src}transaction.boundary = \"interval\"\n\"transaction.boundary.interval.ms\" = 50\n"
        ))
        .unwrap();
        assert_eq!(c.transaction_boundary, TransactionBoundary::Interval(50));
        for (extra, key, reason) in [
            (
                "exactly.once.support = \"maybe\"\n",
                "exactly.once.support",
                "requested or required",
            ),
            (
                "transaction.boundary = \"batch\"\n",
                "transaction.boundary",
                "poll, interval or connector",
            ),
            (
                "transaction.boundary = \"connector\"\n",
                "transaction.boundary",
                "no weir connector can define",
            ),
            (
                "\"transaction.boundary.interval.ms\" = -1\n",
                "transaction.boundary.interval.ms",
                "minimum 0",
            ),
        ] {
            let e = parse(&format!("{src}{extra}")).unwrap_err();
            assert_eq!(e.key.as_deref(), Some(key), "{extra}");
            assert!(e.message.contains(reason), "{extra}: {}", e.message);
        }
    }

    #[test]
    fn sinks_need_topics_and_bad_values_name_their_key() {
        let e = parse("name = \"s\"\nconnector.class = \"file-sink\"\nfile = \"/tmp/x\"\n")
            .unwrap_err();
        assert_eq!(e.key.as_deref(), Some("topics"));
        let e = parse("name = \"s\"\nconnector.class = \"nope\"\n").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("connector.class"));
        let e = parse(
            "name = \"s\"\nconnector.class = \"file-source\"\nfile = \"/tmp/x\"\nbatch.size = 0\n",
        )
        .unwrap_err();
        assert_eq!(e.key.as_deref(), Some("batch.size"));
        let e = parse("name = \"s\"\nconnector.class = \"file-source\"\nfile = \"/tmp/x\"\nerrors.tolerance = \"some\"\n").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("errors.tolerance"));
        let e = parse("name = \"s\"\nconnector.class = \"file-source\"\nfile = \"/tmp/x\"\ntransforms = \"a\"\n").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("transforms.a.type"));
        let e = parse("name = \"s\"\nconnector.class = \"file-source\"\nfile = \"/tmp/x\"\nvalue.converter = \"avro\"\n").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("value.converter"));
        let t = parse("name = \"s\"\nconnector.class = \"file-source\"\nfile = \"/tmp/x\"\ntransforms = \"m\"\n\"transforms.m.type\" = \"/p/redact.wasm\"\n\"transforms.m.fields\" = \"ssn\"\nerrors.tolerance = \"all\"\n").unwrap();
        assert_eq!(
            t.transforms[0].config,
            vec![("fields".to_string(), "ssn".to_string())]
        );
        assert_eq!(t.errors_tolerance, ErrorTolerance::All);
        let e =
            parse("name = \"h\"\nconnector.class = \"http-source\"\ntopic = \"t\"\n").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("http.url"));
        assert!(parse("name = [").is_err());
        let s = parse("name = \"s\"\nconnector.class = \"file-sink\"\nfile = \"/tmp/x\"\ntopics = [\"a\", \"b\"]\n").unwrap();
        assert_eq!(s.topics, vec!["a", "b"]);
        assert_eq!(s.kind, ConnectorKind::Sink);
    }

    #[test]
    fn required_keys_are_per_class_and_database_is_granted() {
        let e = parse("name = \"c\"\nconnector.class = \"sqlite-cdc\"\ndatabase = \"/tmp/a.db\"\ntopic.prefix = \"p\"\n").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("tables"));
        let c = parse("name = \"c\"\nconnector.class = \"sqlite-cdc\"\ndatabase = \"/tmp/a.db\"\ntables = \"t\"\ntopic.prefix = \"p\"\n").unwrap();
        assert_eq!(c.kind, ConnectorKind::Source);
        assert_eq!(
            c.file_grants(false).sqlite_database,
            Some(PathBuf::from("/tmp/a.db"))
        );
        assert!(c.file_grants(false).dirs.is_empty());
        let s = parse("name = \"s\"\nconnector.class = \"sqlite-sink\"\ndatabase = \"/tmp/b.db\"\ntopics = \"t\"\n").unwrap();
        assert_eq!(s.kind, ConnectorKind::Sink);
        let e =
            parse("name = \"s\"\nconnector.class = \"sqlite-sink\"\ntopics = \"t\"\n").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("database"));
    }

    #[test]
    fn http_hosts_default_to_the_url_and_a_sink_takes_a_dead_letter_topic() {
        use crate::plugin::HttpHost;
        let c = parse("name = \"h\"\nconnector.class = \"http-sink\"\ntopics = \"t\"\nhttp.url = \"http://127.0.0.1:9000/in\"\nerrors.tolerance = \"all\"\nerrors.deadletterqueue.topic.name = \"dlq\"\n").unwrap();
        assert_eq!(c.kind, ConnectorKind::Sink);
        assert_eq!(c.errors_tolerance, ErrorTolerance::All);
        assert_eq!(c.dlq_topic.as_deref(), Some("dlq"));
        assert_eq!(
            c.file_grants(true).http_hosts,
            vec![HttpHost::parse("127.0.0.1:9000").unwrap()]
        );
        let c = parse("name = \"h\"\nconnector.class = \"http-source\"\ntopic = \"t\"\nhttp.url = \"http://b/\"\nhttp.allowed.hosts = \"b, c:81\"\n").unwrap();
        assert_eq!(c.http_hosts.len(), 2);
        assert!(c.file.is_none());
        let f = parse(
            "name = \"f\"\nconnector.class = \"file-source\"\nfile = \"/tmp/x\"\ntopic = \"t\"\n",
        )
        .unwrap();
        assert!(f.http_hosts.is_empty());
    }

    #[test]
    fn the_ceiling_is_checked_where_the_grant_really_is() {
        use crate::plugin::HttpHost;
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        for d in ["allowed/sub", "other", "data"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::os::unix::fs::symlink(root.join("other"), root.join("allowed/link")).unwrap();
        let ceiling = Ceiling::new(
            &[root.join("allowed"), root.join("other/one.db")],
            Some(vec![HttpHost::parse("127.0.0.1").unwrap()]),
            &[&root.join("data"), &root.join("allowed/cache")],
        );
        let check = |text: String| {
            let c = parse(&text).map_err(|e| e.to_string())?;
            ceiling
                .check(Path::new("c.toml"), &c)
                .map(|()| c)
                .map_err(|e| format!("{e}"))
        };
        let file = |f: PathBuf| {
            format!(
                "name = \"f\"\nconnector.class = \"file-sink\"\ntopics = \"t\"\nfile = \"{}\"\n",
                f.display()
            )
        };
        let db = |f: PathBuf| {
            format!(
                "name = \"d\"\nconnector.class = \"sqlite-sink\"\ntopics = \"t\"\ndatabase = \"{}\"\n",
                f.display()
            )
        };
        // Inside, to any depth; the grant is the resolved directory.
        let c = check(file(root.join("allowed/sub/out.txt"))).unwrap();
        assert_eq!(c.file_grants(true).dirs[0].host, root.join("allowed/sub"));
        // A directory link or `..` leading out is followed before the check.
        let e = check(file(root.join("allowed/link/out.txt"))).unwrap_err();
        assert!(e.contains("is outside connect.allowed.paths"), "{e}");
        let e = check(file(root.join("allowed/../other/out.txt"))).unwrap_err();
        assert!(e.contains("`file`") && e.contains("outside"), "{e}");
        // A file entry allows that file only; never the log directory or a parent of it.
        check(db(root.join("other/one.db"))).unwrap();
        let e = check(db(root.join("other/two.db"))).unwrap_err();
        assert!(e.contains("`database`"), "{e}");
        let e = check(file(root.join("x.txt"))).unwrap_err();
        assert!(e.contains("overlaps the broker's own directory"), "{e}");
        // Nor the plugin cache, even inside an allowed directory.
        let e = check(file(root.join("allowed/cache/evil.cwasm"))).unwrap_err();
        assert!(e.contains("overlaps the broker's own directory"), "{e}");
        // Hosts: the connector narrows (a port), never widens (another host, any port
        // where the ceiling names one).
        let http = |extra: &str| {
            format!("name = \"h\"\nconnector.class = \"http-sink\"\ntopics = \"t\"\nhttp.url = \"http://127.0.0.1:8080/\"\n{extra}")
        };
        check(http("")).unwrap();
        check(http("http.allowed.hosts = \"127.0.0.1:8080\"\n")).unwrap();
        let e = check(http("http.allowed.hosts = \"127.0.0.1, 10.0.0.1\"\n")).unwrap_err();
        assert!(
            e.contains("`http.allowed.hosts`") && e.contains("10.0.0.1"),
            "{e}"
        );
        let narrow = Ceiling {
            hosts: Some(vec![HttpHost::parse("127.0.0.1:8080").unwrap()]),
            ..ceiling.clone()
        };
        let c = parse(&http("http.allowed.hosts = \"127.0.0.1\"\n")).unwrap();
        assert!(narrow.check(Path::new("c.toml"), &c).is_err());
        let any = Ceiling {
            hosts: None,
            ..ceiling
        };
        let c = parse(&http("http.allowed.hosts = \"127.0.0.1, 10.0.0.1\"\n")).unwrap();
        any.check(Path::new("c.toml"), &c).unwrap();
        // The connector's own list must include http.url's host.
        let e = parse(&http("http.allowed.hosts = \"10.0.0.1\"\n")).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("http.allowed.hosts"));
    }

    #[test]
    fn a_sink_takes_topics_or_topics_regex_not_both() {
        let sink = |extra: &str| {
            parse(&format!(
                "name = \"s\"\nconnector.class = \"file-sink\"\nfile = \"/tmp/x\"\n{extra}"
            ))
        };
        let s = sink("topics.regex = \"logs-.*\"\n").unwrap();
        let r = s.topics_regex.as_ref().unwrap();
        assert!(r.matches("logs-a") && r.matches("logs-"));
        assert!(!r.matches("other") && !r.matches("my-logs-a") && !r.matches("__logs-a"));
        // Anchored: a match inside the name is not enough.
        let s = sink("topics.regex = \"a|b\"\n").unwrap();
        let r = s.topics_regex.as_ref().unwrap();
        assert!(r.matches("a") && !r.matches("ab"));
        // (TOML needs the longer key quoted when both are set.)
        let e = sink("topics = \"a\"\n\"topics.regex\" = \"a.*\"\n").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("topics.regex"));
        let e = sink("topics.regex = \"(\"\n").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("topics.regex"));
        let e = sink("").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("topics"));
        // A `.wasm` component with `topics.regex` is a sink.
        let s = parse("name = \"s\"\nconnector.class = \"/x/c.wasm\"\ntopics.regex = \"t.*\"\n")
            .unwrap();
        assert_eq!(s.kind, ConnectorKind::Sink);
    }
}
