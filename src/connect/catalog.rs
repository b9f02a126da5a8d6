//! The keys each connector class takes: ONE table, read by `GET /connector-plugins` (the
//! classes) and `PUT /connector-plugins/{plugin}/config/validate` (Kafka Connect's
//! `ConfigInfos`: one definition and one value per key, errors per key).
//!
//! Owns: the key definitions (name, type, required, default, importance, documentation,
//! group) of the common keys and of each built-in class, the shape of validate's answer
//! ([`config_infos`]) and of a refused create's message ([`invalid_message`]). Never
//! does: decide whether a config is valid beyond "a required key is missing" — the checks
//! live in [`super::config::ConnectorConfig::from_map`], the broker's ceiling and the
//! runtime's component checks, which report errors per key ([`KeyErrors`]); create and
//! validate show the same errors, so the two cannot disagree.
//!
//! Adding a connector: add its `(class, kind)` to [`super::config::BUILT_INS`] and its
//! keys to [`CLASS_KEYS`].

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

use super::config::{ConnectorConfig, ConnectorKind, BUILT_INS};

/// A key's type, Kafka's `ConfigDef.Type` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyType {
    /// `STRING`.
    String,
    /// `INT`.
    Int,
    /// `LONG`.
    Long,
    /// `LIST` (comma-separated).
    List,
    /// `CLASS` (here: a built-in name or a `.wasm` path).
    Class,
}

impl KeyType {
    /// Kafka's spelling.
    pub(crate) fn name(self) -> &'static str {
        match self {
            KeyType::String => "STRING",
            KeyType::Int => "INT",
            KeyType::Long => "LONG",
            KeyType::List => "LIST",
            KeyType::Class => "CLASS",
        }
    }
}

/// One key's definition (Kafka Connect's `ConfigKeyInfo`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyDef {
    /// The key, Kafka Connect's name.
    pub name: &'static str,
    /// Its type.
    pub kind: KeyType,
    /// Whether a config without it is refused.
    pub required: bool,
    /// Default as text (`None`: no default).
    pub default: Option<&'static str>,
    /// `HIGH`, `MEDIUM` or `LOW`.
    pub importance: &'static str,
    /// What it does.
    pub documentation: &'static str,
    /// Kafka Connect's group (`Common`, `Error Handling`, ...).
    pub group: &'static str,
}

const fn key(
    name: &'static str,
    kind: KeyType,
    required: bool,
    default: Option<&'static str>,
    importance: &'static str,
    group: &'static str,
    documentation: &'static str,
) -> KeyDef {
    KeyDef {
        name,
        kind,
        required,
        default,
        importance,
        documentation,
        group,
    }
}

use KeyType::{Class, Int, List, Long, String as Str};

/// Keys every connector takes (Kafka Connect's `ConnectorConfig`, `SourceConnectorConfig`
/// and `SinkConnectorConfig`); `topics` is listed for sinks only, `topic` for sources.
pub(crate) const COMMON_KEYS: &[KeyDef] = &[
    key("name", Str, true, None, "HIGH", "Common", "Globally unique name to use for this connector."),
    key("connector.class", Class, true, None, "HIGH", "Common", "The connector: a built-in name (see GET /connector-plugins) or the path of a .wasm component."),
    key("tasks.max", Int, false, Some("1"), "HIGH", "Common", "Maximum number of tasks to use for this connector (weir runs one)."),
    key("key.converter", Class, false, None, "LOW", "Common", "Converter for record keys (bytes, string, json)."),
    key("value.converter", Class, false, None, "LOW", "Common", "Converter for record values (bytes, string, json)."),
    key("transforms", List, false, Some(""), "LOW", "Transforms", "Aliases for the transformations to be applied to records."),
    key("errors.retry.timeout", Long, false, Some("60000"), "MEDIUM", "Error Handling", "Maximum duration in milliseconds that a failed task is restarted for before it is FAILED; -1 retries forever, 0 never."),
    key("errors.retry.delay.max.ms", Long, false, Some("60000"), "MEDIUM", "Error Handling", "Maximum duration in milliseconds between consecutive restarts of a failing task (they start at 100 ms and double)."),
    key("errors.tolerance", Str, false, Some("none"), "MEDIUM", "Error Handling", "Behavior for tolerating errors: none fails the task on the first error; all skips records that fail conversion or a transform (logged)."),
    key("errors.deadletterqueue.topic.name", Str, false, Some(""), "MEDIUM", "Error Handling", "Topic for records that failed (sinks), when errors.tolerance is all."),
];

/// Keys of source connectors.
pub(crate) const SOURCE_KEYS: &[KeyDef] = &[
    key(
        "topic",
        Str,
        false,
        None,
        "HIGH",
        "Common",
        "The topic for records that name none.",
    ),
    key(
        "poll.interval.ms",
        Long,
        false,
        Some("200"),
        "LOW",
        "Common",
        "Wait after a poll that returned nothing (ms).",
    ),
    key(
        "exactly.once.support",
        Str,
        false,
        Some("requested"),
        "MEDIUM",
        "Exactly Once Support",
        "requested or required (KIP-618): required refuses the connector unless the broker's connect.exactly.once.source.support is enabled.",
    ),
    key(
        "transaction.boundary",
        Str,
        false,
        Some("poll"),
        "MEDIUM",
        "Exactly Once Support",
        "Where an exactly-once task commits (KIP-618): poll (each poll) or interval (every transaction.boundary.interval.ms); connector is refused, no weir connector defines boundaries.",
    ),
    key(
        "transaction.boundary.interval.ms",
        Long,
        false,
        None,
        "LOW",
        "Exactly Once Support",
        "With transaction.boundary=interval: ms between commits (default offset.flush.interval.ms).",
    ),
];

/// Keys of sink connectors.
pub(crate) const SINK_KEYS: &[KeyDef] = &[
    key(
        "topics",
        List,
        false,
        Some(""),
        "HIGH",
        "Common",
        "List of topics to consume, separated by commas. Set this or topics.regex, not both.",
    ),
    key(
        "topics.regex",
        Str,
        false,
        Some(""),
        "HIGH",
        "Common",
        "Regular expression giving topics to consume: every topic whose whole name matches (internal __ topics excepted), also topics created later (looked for every few seconds). Set this or topics, not both.",
    ),
    key(
        "offset.flush.interval.ms",
        Long,
        false,
        Some("10000"),
        "LOW",
        "Common",
        "How often flush and the offset commit run (ms), and always at stop.",
    ),
];

/// Keys of each built-in class, beyond the common, source and sink ones.
pub(crate) const CLASS_KEYS: &[(&str, &[KeyDef])] = &[
    (
        "file-source",
        &[
            key("file", Str, true, None, "HIGH", "Common", "Source filename (its directory is the only one the connector may read)."),
            key("batch.size", Int, false, Some("2000"), "LOW", "Common", "The maximum number of records the source task can read from the file each time it is polled."),
        ],
    ),
    (
        "file-sink",
        &[
            key("file", Str, true, None, "HIGH", "Common", "Destination filename (its directory is the only one the connector may write)."),
            key("batch.size", Int, false, Some("2000"), "LOW", "Common", "Most records per put."),
        ],
    ),
    (
        "sqlite-cdc",
        &[
            key("database", Str, true, None, "HIGH", "Common", "The SQLite database file to capture (the only file the connector may open)."),
            key("tables", List, true, None, "HIGH", "Common", "Tables to capture, separated by commas."),
            key("topic.prefix", Str, true, None, "HIGH", "Common", "Topic prefix: changes of table T go to <topic.prefix>.T."),
            key("snapshot.mode", Str, false, Some("initial"), "MEDIUM", "Common", "initial: emit every existing row (op=r) first; never: only changes from now on."),
            key("tombstones.on.delete", Str, false, Some("true"), "MEDIUM", "Common", "Whether a delete is followed by a tombstone (null value) for its key."),
            key("batch.size", Int, false, Some("2000"), "LOW", "Common", "Most change events per poll."),
        ],
    ),
    (
        "sqlite-sink",
        &[
            key("database", Str, true, None, "HIGH", "Common", "The SQLite database file to write (the only file the connector may open)."),
            key("table.name.format", Str, false, Some("${topic}"), "MEDIUM", "Common", "Destination table; ${topic} is replaced by the topic name (characters other than letters, digits and _ become _)."),
            key("pk.mode", Str, false, Some("record_key"), "HIGH", "Common", "Where the primary key comes from: record_key (the key's JSON object fields)."),
            key("insert.mode", Str, false, Some("upsert"), "HIGH", "Common", "upsert (insert or update by key) or insert."),
            key("delete.enabled", Str, false, Some("true"), "MEDIUM", "Common", "Whether a tombstone deletes the row with its key."),
            key("auto.create", Str, false, Some("false"), "MEDIUM", "Common", "Create the table from the first record when it does not exist."),
            key("auto.evolve", Str, false, Some("false"), "MEDIUM", "Common", "Add columns for fields the table lacks."),
            key("batch.size", Int, false, Some("2000"), "LOW", "Common", "Most records per put."),
        ],
    ),
    (
        "http-source",
        &[
            key("http.url", Str, true, None, "HIGH", "Common", "The URL polled (GET)."),
            key("http.allowed.hosts", List, false, None, "HIGH", "Common", "Hosts (host, or host:port) the connector may reach; default: the host and port of http.url."),
            key("http.response.records.pointer", Str, false, Some(""), "MEDIUM", "Common", "JSON pointer to the array of records in a response (empty: the whole body is the array)."),
            key("http.record.key.pointer", Str, false, None, "MEDIUM", "Common", "JSON pointer, within a record, to its key."),
            key("http.response.cursor.pointer", Str, false, None, "MEDIUM", "Common", "JSON pointer to the cursor in a response; stored as the source offset."),
            key("http.request.cursor.param", Str, false, Some("cursor"), "MEDIUM", "Common", "Query parameter that carries the stored cursor on the next request."),
            key("http.headers", Str, false, None, "LOW", "Common", "Request headers, `Name: value` separated by |."),
            key("http.timeout.ms", Long, false, Some("400"), "LOW", "Common", "Deadline of a connect and of the first response byte (ms)."),
            key("http.response.max.bytes", Long, false, Some("8388608"), "LOW", "Common", "Largest response body accepted."),
        ],
    ),
    (
        "http-sink",
        &[
            key("http.url", Str, true, None, "HIGH", "Common", "The URL records are POSTed to."),
            key("http.allowed.hosts", List, false, None, "HIGH", "Common", "Hosts (host, or host:port) the connector may reach; default: the host and port of http.url."),
            key("http.request.mode", Str, false, Some("batch"), "MEDIUM", "Common", "batch: one JSON array per put; single: one request per record."),
            key("http.headers", Str, false, None, "LOW", "Common", "Request headers, `Name: value` separated by |."),
            key("http.auth.basic.username", Str, false, None, "MEDIUM", "Common", "Basic auth user name."),
            key("http.auth.basic.password", Str, false, None, "MEDIUM", "Common", "Basic auth password."),
            key("http.auth.bearer.token", Str, false, None, "MEDIUM", "Common", "Bearer token (Authorization header)."),
            key("retry.backoff.ms", Long, false, Some("100"), "MEDIUM", "Common", "First wait before a retry of a 429, 5xx or connection error; doubles."),
            key("retry.backoff.max.ms", Long, false, Some("30000"), "MEDIUM", "Common", "Longest wait between retries, Retry-After included."),
            key("http.timeout.ms", Long, false, Some("400"), "LOW", "Common", "Deadline of a connect and of the first response byte (ms)."),
        ],
    ),
];

/// Version reported for the built-ins (they ship with the broker).
pub(crate) const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Every key `class` takes, common ones first; `None` for an unknown class.
pub(crate) fn keys_of(class: &str) -> Option<Vec<KeyDef>> {
    let kind = BUILT_INS
        .iter()
        .find(|(n, _)| *n == class)
        .map(|(_, k)| *k)?;
    let mut out: Vec<KeyDef> = COMMON_KEYS.to_vec();
    out.extend_from_slice(match kind {
        ConnectorKind::Source => SOURCE_KEYS,
        ConnectorKind::Sink => SINK_KEYS,
    });
    if let Some((_, keys)) = CLASS_KEYS.iter().find(|(n, _)| *n == class) {
        out.extend_from_slice(keys);
    }
    Some(out)
}

/// `GET /connector-plugins`: `[{"class", "type", "version"}]` for every built-in.
pub(crate) fn plugins_json() -> Value {
    Value::Array(
        BUILT_INS
            .iter()
            .map(|(name, kind)| {
                json!({
                    "class": name,
                    "type": kind_name(*kind),
                    "version": VERSION,
                })
            })
            .collect(),
    )
}

/// `source` or `sink`, Kafka Connect's spelling.
pub(crate) fn kind_name(kind: ConnectorKind) -> &'static str {
    match kind {
        ConnectorKind::Source => "source",
        ConnectorKind::Sink => "sink",
    }
}

/// Kafka Connect's message for a required key that is missing.
fn missing(key: &str) -> String {
    format!("Missing required configuration \"{key}\" which has no default value.")
}

/// A config's errors by key, as Kafka Connect's `ConfigValue.errorMessages` (several per
/// key possible).
pub(crate) type KeyErrors = BTreeMap<String, Vec<String>>;

/// The errors of connector properties `props` that need no broker state: each required
/// key of its built-in class that is missing (Kafka Connect's message), and the error
/// [`ConnectorConfig::from_map`] reports (on the key it names, `connector.class` when it
/// names none) unless that key already has one. A missing `name` is reported, then
/// `validate` stands in for it so the rest is still checked. Returns the config when
/// `from_map` accepts it (the broker's ceiling and the component are the runtime's
/// checks, added to the same errors).
pub(crate) fn static_errors(
    props: &BTreeMap<String, String>,
) -> (Option<ConnectorConfig>, KeyErrors) {
    let mut errors = KeyErrors::new();
    let class = props
        .get("connector.class")
        .map(|c| c.trim())
        .unwrap_or_default();
    let defs = keys_of(class).unwrap_or_else(|| COMMON_KEYS.to_vec());
    for d in &defs {
        let present = props.get(d.name).is_some_and(|v| !v.trim().is_empty());
        if d.required && !present {
            errors
                .entry(d.name.into())
                .or_default()
                .push(missing(d.name));
        }
    }
    let mut checked = props.clone();
    checked
        .entry("name".into())
        .or_insert_with(|| "validate".into());
    match ConnectorConfig::from_map(Path::new("REST"), checked) {
        Ok(c) => (Some(c), errors),
        Err(e) => {
            let key = e.key.clone().unwrap_or_else(|| "connector.class".into());
            let list = errors.entry(key).or_default();
            if list.is_empty() {
                list.push(e.message);
            }
            (None, errors)
        }
    }
}

/// Kafka Connect's 400 message for a create or update whose config has `errors`
/// (`AbstractHerder.maybeAddConfigErrors`): the count, each message on its own line,
/// and where to find them again.
pub(crate) fn invalid_message(errors: &KeyErrors) -> String {
    let count: usize = errors.values().map(Vec::len).sum();
    let mut message =
        format!("Connector configuration is invalid and contains the following {count} error(s):");
    for m in errors.values().flatten() {
        message.push('\n');
        message.push_str(m);
    }
    message.push_str("\nYou can also find the above list of errors at the endpoint `/connector-plugins/{connectorType}/config/validate`");
    message
}

/// `PUT /connector-plugins/{class}/config/validate`: Kafka Connect's `ConfigInfos`
/// (`{name, error_count, groups, configs: [{definition, value}]}`) for `props` (whose
/// `connector.class` the caller set to `class`, as Kafka Connect does) with `errors`
/// ([`static_errors`] plus the runtime's), or `None` when `class` is not a built-in. An
/// error on a key the class does not define is shown on `connector.class`.
pub(crate) fn config_infos(
    class: &str,
    props: &BTreeMap<String, String>,
    errors: &KeyErrors,
) -> Option<Value> {
    let defs = keys_of(class)?;
    let mut shown: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (key, list) in errors {
        let on = defs
            .iter()
            .find(|d| d.name == key)
            .map(|d| d.name)
            .unwrap_or("connector.class");
        shown.entry(on).or_default().extend(list.iter().cloned());
    }
    let mut groups: Vec<&str> = Vec::new();
    for d in &defs {
        if !groups.contains(&d.group) {
            groups.push(d.group);
        }
    }
    let configs: Vec<Value> = defs
        .iter()
        .map(|d| {
            json!({
                "definition": {
                    "name": d.name,
                    "type": d.kind.name(),
                    "required": d.required,
                    "default_value": d.default,
                    "importance": d.importance,
                    "documentation": d.documentation,
                    "group": d.group,
                    "width": "NONE",
                    "display_name": d.name,
                    "dependents": [],
                    "order": -1,
                },
                "value": {
                    "name": d.name,
                    "value": props.get(d.name),
                    "recommended_values": [],
                    "errors": shown.get(d.name).cloned().unwrap_or_default(),
                    "visible": true,
                },
            })
        })
        .collect();
    let error_count: usize = shown.values().map(Vec::len).sum();
    Some(json!({
        "name": class,
        "error_count": error_count,
        "groups": groups,
        "configs": configs,
    }))
}

/// [`config_infos`] with only the [`static_errors`] (no broker state), for `props` with
/// `connector.class` set to `class`.
#[cfg(test)]
pub(crate) fn validate(class: &str, props: &BTreeMap<String, String>) -> Option<Value> {
    let mut props = props.clone();
    props.insert("connector.class".into(), class.to_string());
    let (_, errors) = static_errors(&props);
    config_infos(class, &props, &errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_is_one_error_on_file() {
        let props = BTreeMap::from([
            ("name".to_string(), "x".to_string()),
            ("topic".to_string(), "t".to_string()),
        ]);
        let v = validate("file-source", &props).unwrap();
        assert_eq!(v["error_count"], 1, "{v}");
        let file = v["configs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["definition"]["name"] == "file")
            .unwrap();
        assert_eq!(
            file["value"]["errors"][0],
            "Missing required configuration \"file\" which has no default value."
        );
        assert!(validate("nope", &props).is_none());
        assert_eq!(plugins_json().as_array().unwrap().len(), BUILT_INS.len());
    }

    #[test]
    fn every_built_in_lists_its_keys_and_marks_the_required_ones() {
        for (class, _) in BUILT_INS {
            let own = CLASS_KEYS
                .iter()
                .find(|(c, _)| c == class)
                .unwrap_or_else(|| panic!("{class} has no entry in CLASS_KEYS"))
                .1;
            for required in super::super::config::required_keys(class) {
                assert!(
                    own.iter().any(|k| k.name == *required && k.required),
                    "{class}: `{required}` is required by the config check but not in the catalog as required"
                );
            }
        }
    }
}
