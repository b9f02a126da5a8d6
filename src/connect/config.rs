//! Connector configs: one TOML file per connector, Kafka Connect's keys.
//!
//! Keys read by the runtime (every key, these included, is also passed to the component's
//! `open` as a string):
//!
//! | key | meaning |
//! |---|---|
//! | `name` | connector name (required; also the sink's group `connect-<name>`) |
//! | `connector.class` | `file-source`, `file-sink`, or a path to a `.wasm` component |
//! | `tasks.max` | default 1; only 1 task runs (more is accepted and logged, as Kafka Connect lets a connector run fewer tasks than asked) |
//! | `topic` | source: topic for records that name none |
//! | `topics` | sink: comma-separated topics (its presence makes the connector a sink) |
//! | `file` | file connectors: the file; its directory is the one path the component may open (read-only for a source, read-write for a sink) |
//! | `batch.size` | most records per `poll` / `put` (default 2000, FileStreamSource's) |
//! | `errors.tolerance` | `none` (default): an errant record fails the task; `all` (sinks only): it goes to the dead-letter topic, or is logged and skipped without one |
//! | `errors.deadletterqueue.topic.name` | sinks under `errors.tolerance=all`: topic for errant records, with Kafka Connect's `__connect.errors.*` headers |
//! | `http.url` | HTTP connectors: the URL polled (source) or posted to (sink) |
//! | `http.allowed.hosts` | hosts (`host` = any port, `host:port`) the component may reach over HTTP, comma-separated; default: the host and port of `http.url`; neither key: no HTTP at all |
//! | `retry.backoff.max.ms` | sink: cap on the wait a `put` asks for before its batch is put again (default 30000) |
//! | `errors.retry.timeout` | ms a failing task is restarted for before it is FAILED (default 60000; -1 forever, 0 never) |
//! | `errors.retry.delay.max.ms` | longest wait between restarts (default 60000; waits start at 100 ms and double) |
//! | `poll.interval.ms` | source: wait after a poll that returned nothing (default 200) |
//! | `offset.flush.interval.ms` | sink: how often `flush` + offset commit run (default 10000), and always at stop |
//!
//! A TOML value may be a string, integer, float or boolean (written as text), or an
//! array of those (joined with commas); nested tables become dotted keys, so
//! `connector.class = "file-source"` and `"connector.class" = "file-source"` are the same.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Which way a connector moves records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectorKind {
    /// Into topics (world `source-connector`).
    Source,
    /// Out of topics (world `sink-connector`).
    Sink,
}

/// Where the component comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectorClass {
    /// A connector shipped in `connectors/` (`file-source`, `file-sink`).
    BuiltIn(&'static str),
    /// A component file named by path.
    Path(PathBuf),
}

/// The built-in connectors: `connector.class` name and direction.
pub const BUILT_INS: &[(&str, ConnectorKind)] = &[
    ("file-source", ConnectorKind::Source),
    ("file-sink", ConnectorKind::Sink),
    ("http-source", ConnectorKind::Source),
    ("http-sink", ConnectorKind::Sink),
];

/// `errors.tolerance`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorTolerance {
    /// A failed record fails the task (Kafka Connect's default).
    None,
    /// A failed record is skipped: sent to `errors.deadletterqueue.topic.name` when set,
    /// else logged (sinks only; a source has no errant records yet).
    All,
}

/// One connector's config, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectorConfig {
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
    /// `file`, made absolute.
    pub file: Option<PathBuf>,
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
    /// Every key as a string, in key order, for the component's `open` (`file` made
    /// absolute).
    pub pairs: Vec<(String, String)>,
}

/// Why a connector config was refused: the file, the key when one is to blame, the reason.
#[derive(Debug, Clone, thiserror::Error)]
#[error("connector config {}: {}{message}", path.display(), key.as_ref().map(|k| format!("`{k}`: ")).unwrap_or_default())]
pub struct ConfigError {
    /// The file.
    pub path: PathBuf,
    /// The offending key.
    pub key: Option<String>,
    /// What is wrong.
    pub message: String,
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

impl ConnectorConfig {
    /// What a file connector may open: the directory of its `file` (read-only for a
    /// source, read-write for a sink), and nothing else. No `file`: no directory.
    pub fn file_grants(&self, writable: bool) -> crate::plugin::ConnectorGrants {
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
            http_hosts: self.http_hosts.clone(),
        }
    }

    /// Reads and checks the connector file at `path`.
    ///
    /// Errors: [`ConfigError`] for an unreadable file, bad TOML, or a key missing or
    /// invalid (naming it).
    pub fn from_file(path: &Path) -> Result<ConnectorConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            path: path.to_path_buf(),
            key: None,
            message: format!("cannot read: {e}"),
        })?;
        Self::parse(path, &text)
    }

    /// Parses connector TOML `text` (read from `path`, which names it in errors).
    ///
    /// Errors: as [`ConnectorConfig::from_file`].
    pub fn parse(path: &Path, text: &str) -> Result<ConnectorConfig, ConfigError> {
        let fail = |key: Option<&str>, message: String| ConfigError {
            path: path.to_path_buf(),
            key: key.map(str::to_string),
            message,
        };
        let value: toml::Value =
            toml::from_str(text).map_err(|e| fail(None, format!("not TOML: {e}")))?;
        let mut keys = BTreeMap::new();
        flatten("", &value, &mut keys).map_err(|m| fail(None, m))?;
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
            ConnectorClass::Path(_) if keys.contains_key("topics") => ConnectorKind::Sink,
            ConnectorClass::Path(_) => ConnectorKind::Source,
        };
        if kind == ConnectorKind::Sink && topics.is_empty() {
            return Err(fail(
                Some("topics"),
                "a sink needs at least one topic".into(),
            ));
        }
        if keys.contains_key("topics.regex") {
            return Err(fail(
                Some("topics.regex"),
                "not supported yet; list the topics in `topics`".into(),
            ));
        }
        let tasks_max = number("tasks.max", 1, 1)?;
        let tasks_max =
            u32::try_from(tasks_max).map_err(|_| fail(Some("tasks.max"), "too large".into()))?;
        let errors_tolerance = match get("errors.tolerance").map(str::trim) {
            None | Some("none") => ErrorTolerance::None,
            Some("all") if kind == ConnectorKind::Sink => ErrorTolerance::All,
            Some("all") => {
                return Err(fail(
                    Some("errors.tolerance"),
                    "`all` is supported for sinks only (a source reports no errant records yet); use `none`"
                        .into(),
                ))
            }
            Some(other) => {
                return Err(fail(
                    Some("errors.tolerance"),
                    format!("`{other}`: expected none or all"),
                ))
            }
        };
        let file = match get("file") {
            Some(f) => Some(
                std::path::absolute(f.trim())
                    .map_err(|e| fail(Some("file"), format!("cannot make `{f}` absolute: {e}")))?,
            ),
            None => None,
        };
        if matches!(class, ConnectorClass::BuiltIn(n) if n.starts_with("file-")) && file.is_none() {
            return Err(fail(Some("file"), "required by the file connectors".into()));
        }
        let http_url = get("http.url").map(str::trim);
        if matches!(class, ConnectorClass::BuiltIn(n) if n.starts_with("http-"))
            && http_url.is_none()
        {
            return Err(fail(
                Some("http.url"),
                "required by the HTTP connectors".into(),
            ));
        }
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
        let retry_backoff_max_ms = number("retry.backoff.max.ms", 30_000, 0)? as u64;
        if let Some(f) = &file {
            // The guest sees the absolute path the runtime grants.
            keys.insert("file".into(), f.display().to_string());
        }
        Ok(ConnectorConfig {
            name,
            class,
            kind,
            tasks_max,
            topic,
            topics,
            file,
            batch_size: u32::try_from(batch_size.min(1_000_000)).unwrap_or(1_000_000),
            errors_tolerance,
            dlq_topic,
            http_hosts,
            retry_backoff_max_ms,
            retry_timeout_ms: u64::try_from(retry_timeout).ok(),
            retry_delay_max_ms,
            poll_interval_ms,
            offset_flush_interval_ms,
            pairs: keys.into_iter().collect(),
        })
    }

    /// The component file: a built-in's `<plugin_path>/<name with _>.wasm`, or the path
    /// given.
    pub fn component_path(&self, plugin_path: &Path) -> PathBuf {
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
        ConnectorConfig::parse(Path::new("c.toml"), text)
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
        let e = parse("name = \"s\"\nconnector.class = \"file-source\"\nfile = \"/tmp/x\"\nerrors.tolerance = \"all\"\n").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("errors.tolerance"));
        let e =
            parse("name = \"h\"\nconnector.class = \"http-source\"\ntopic = \"t\"\n").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("http.url"));
        assert!(parse("name = [").is_err());
        let s = parse("name = \"s\"\nconnector.class = \"file-sink\"\nfile = \"/tmp/x\"\ntopics = [\"a\", \"b\"]\n").unwrap();
        assert_eq!(s.topics, vec!["a", "b"]);
        assert_eq!(s.kind, ConnectorKind::Sink);
    }

    #[test]
    fn http_hosts_default_to_the_url_and_tolerance_all_is_for_sinks() {
        use crate::plugin::HttpHost;
        let c = parse("name = \"h\"\nconnector.class = \"http-sink\"\ntopics = \"t\"\nhttp.url = \"http://127.0.0.1:9000/in\"\nerrors.tolerance = \"all\"\nerrors.deadletterqueue.topic.name = \"dlq\"\n").unwrap();
        assert_eq!(c.kind, ConnectorKind::Sink);
        assert_eq!(c.errors_tolerance, ErrorTolerance::All);
        assert_eq!(c.dlq_topic.as_deref(), Some("dlq"));
        assert_eq!(
            c.file_grants(true).http_hosts,
            vec![HttpHost::parse("127.0.0.1:9000").unwrap()]
        );
        let c = parse("name = \"h\"\nconnector.class = \"http-source\"\ntopic = \"t\"\nhttp.url = \"http://a/\"\nhttp.allowed.hosts = \"b, c:81\"\n").unwrap();
        assert_eq!(c.http_hosts.len(), 2);
        assert!(c.file.is_none());
        let f = parse(
            "name = \"f\"\nconnector.class = \"file-source\"\nfile = \"/tmp/x\"\ntopic = \"t\"\n",
        )
        .unwrap();
        assert!(f.http_hosts.is_empty());
    }
}
