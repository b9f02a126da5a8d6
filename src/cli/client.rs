//! What the client subcommands (`topic`, `produce`, `consume`, `group`) share: the librdkafka
//! configuration every client starts from, a client context that remembers the last
//! connection-level error, Kafka-style error text, and a stop flag raised by Ctrl-C/SIGTERM.
//!
//! `WEIR_RDKAFKA_DEBUG=protocol,cgrp` (librdkafka's `debug` contexts) prints librdkafka's
//! log on stderr, to see what a command sends.
//!
//! Never does: talk to the broker by any other means than librdkafka, or import broker
//! internals; the CLI is "any client".

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::client::{Client, ClientContext};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::metadata::Metadata;
use rdkafka::ClientConfig;

use super::ClientArgs;

/// `client.id` of every client the CLI creates, so broker logs can tell them apart.
pub(super) const CLIENT_ID: &str = "weir-cli";

/// Environment variable naming librdkafka `debug` contexts (e.g. `protocol,cgrp`) to turn
/// on; their log lines go to stderr. For diagnosing a client/broker mismatch.
pub(super) const RDKAFKA_DEBUG_ENV: &str = "WEIR_RDKAFKA_DEBUG";

/// How long a metadata request may take before the command gives up.
pub(super) const METADATA_TIMEOUT: Duration = Duration::from_secs(15);

/// A boolean `--property KEY=VALUE` of the console tools (`print.key`, `parse.headers`,
/// ...): `true` or `false`, any case, as Kafka's console tools read them.
///
/// Errors: any other value, naming the property.
pub(super) fn bool_property(key: &str, value: &str) -> anyhow::Result<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => anyhow::bail!("--property {key}={value}: expected true or false"),
    }
}

/// The librdkafka configuration all CLI clients start from: bootstrap servers and
/// `client.id`. Callers add what their client type needs.
///
/// `allow.auto.create.topics` keeps librdkafka's per-type default: a producer may create a
/// topic on a broker with `auto.create.topics.enable` (as Kafka's console producer does),
/// a consumer may not; the admin client only ever asks for all topics.
pub(super) fn base_config(client: &ClientArgs) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &client.bootstrap_server)
        .set("client.id", CLIENT_ID);
    if let Ok(contexts) = std::env::var(RDKAFKA_DEBUG_ENV) {
        // rdkafka derives librdkafka's log level from the `log` crate's, which is off here.
        config
            .set("debug", contexts)
            .set_log_level(RDKafkaLogLevel::Debug);
    }
    config
}

/// Client context for every CLI client: records the last global error librdkafka reports
/// (for example "Connect to ipv4#127.0.0.1:9092 failed: Connection refused") so that a
/// timeout can say *why*; prints librdkafka's own log lines on stderr only when
/// [`RDKAFKA_DEBUG_ENV`] is set.
#[derive(Debug, Default)]
pub(super) struct CliContext {
    last_error: Mutex<Option<String>>,
}

impl CliContext {
    /// The last global error seen, if any.
    pub(super) fn last_error(&self) -> Option<String> {
        match self.last_error.lock() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// `error` followed by the last connection-level error, if there was one: a timeout
    /// alone does not say that the broker refused the connection.
    pub(super) fn explain(&self, error: &KafkaError) -> String {
        match self.last_error() {
            Some(last) => format!("{} (last client error: {last})", KafkaErrorText(error)),
            None => KafkaErrorText(error).to_string(),
        }
    }
}

impl ClientContext for CliContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        if std::env::var_os(RDKAFKA_DEBUG_ENV).is_some() {
            eprintln!("weir: librdkafka {level:?} {fac}: {log_message}");
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let text = format!("{}: {reason}", KafkaErrorText(&error));
        match self.last_error.lock() {
            Ok(mut guard) => *guard = Some(text),
            Err(poisoned) => *poisoned.into_inner() = Some(text),
        }
    }
}

impl ConsumerContext for CliContext {}

/// Kafka's name for an error code, as in Kafka's `Errors` enum: `TopicAlreadyExists` →
/// `TOPIC_ALREADY_EXISTS`. librdkafka-local codes (negative in librdkafka) get the same
/// treatment; their description starts with "Local:".
pub(super) fn error_name(code: RDKafkaErrorCode) -> String {
    screaming_snake(&format!("{code:?}"))
}

/// `TopicAlreadyExists` → `TOPIC_ALREADY_EXISTS`: a Rust variant name (rdkafka's or
/// kafka-protocol's) as Kafka's `Errors` enum spells it.
pub(super) fn screaming_snake(camel: &str) -> String {
    let mut name = String::with_capacity(camel.len() + 8);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

/// `NAME: description` for an error code, e.g. `TOPIC_ALREADY_EXISTS: Topic already exists`.
pub(super) fn code_text(code: RDKafkaErrorCode) -> String {
    // rdkafka's Display is "Variant (librdkafka description)"; keep the description.
    let full = code.to_string();
    let prefix = format!("{code:?} (");
    let description = full
        .strip_prefix(prefix.as_str())
        .and_then(|s| s.strip_suffix(')'))
        .unwrap_or(full.as_str());
    let description = description.strip_prefix("Broker: ").unwrap_or(description);
    format!("{}: {description}", error_name(code))
}

/// Displays a [`KafkaError`] with Kafka's error name when it carries a code.
pub(super) struct KafkaErrorText<'a>(pub &'a KafkaError);

impl fmt::Display for KafkaErrorText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let code = match self.0 {
            // rdkafka keeps the admin error's code out of `rdkafka_error_code`.
            KafkaError::AdminOp(code) => Some(*code),
            other => other.rdkafka_error_code(),
        };
        match code {
            Some(code) => f.write_str(&code_text(code)),
            None => write!(f, "{}", self.0),
        }
    }
}

/// Metadata for every topic (never naming one: a Metadata request naming a topic may
/// create it on a broker with `auto.create.topics.enable`). Also how commands learn early
/// that the bootstrap servers cannot be reached, instead of waiting out a longer timeout.
///
/// Errors: the broker unreachable within [`METADATA_TIMEOUT`]
/// (`BROKER_TRANSPORT_FAILURE`, with librdkafka's last connection error when it has one).
pub(super) fn fetch_metadata<C: ClientContext>(
    client: &Client<C>,
    context: &CliContext,
    bootstrap: &ClientArgs,
) -> anyhow::Result<Metadata> {
    client.fetch_metadata(None, METADATA_TIMEOUT).map_err(|e| {
        anyhow::anyhow!(
            "no metadata from {} within {} s: {}",
            bootstrap.bootstrap_server,
            METADATA_TIMEOUT.as_secs(),
            context.explain(&e)
        )
    })
}

/// Looks `topic` up in `metadata`; a missing topic or one the broker reports an error for
/// is `UNKNOWN_TOPIC_OR_PARTITION` (or that error).
pub(super) fn find_topic<'m>(
    metadata: &'m Metadata,
    topic: &str,
) -> anyhow::Result<&'m rdkafka::metadata::MetadataTopic> {
    let found = metadata.topics().iter().find(|t| t.name() == topic);
    match found {
        None => anyhow::bail!(
            "topic '{topic}': {}",
            code_text(RDKafkaErrorCode::UnknownTopicOrPartition)
        ),
        Some(t) => match t.error() {
            Some(err) => anyhow::bail!("topic '{topic}': {}", code_text(err.into())),
            None => Ok(t),
        },
    }
}

/// A flag raised once SIGINT (Ctrl-C) or SIGTERM arrives, so a long-running command can
/// stop at a record boundary and flush its output instead of dying mid-line.
///
/// The signal is awaited on a small detached thread with its own single-threaded tokio
/// runtime; the thread ends with the process.
pub(super) fn stop_on_signal() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let spawned = std::thread::Builder::new()
        .name("weir-signal".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
            {
                Ok(rt) => rt,
                Err(_) => return,
            };
            runtime.block_on(async {
                use tokio::signal::unix::{signal, SignalKind};
                match signal(SignalKind::terminate()) {
                    Ok(mut term) => {
                        tokio::select! {
                            _ = tokio::signal::ctrl_c() => {}
                            _ = term.recv() => {}
                        }
                    }
                    Err(_) => {
                        let _ = tokio::signal::ctrl_c().await;
                    }
                }
            });
            flag.store(true, Ordering::SeqCst);
        });
    // Without the thread, Ctrl-C keeps its default meaning (end the process): still correct.
    drop(spawned);
    stop
}

/// Runs a future (an rdkafka admin operation, resolved by rdkafka's own polling thread)
/// to completion on a single-threaded runtime.
pub(super) fn block_on<F: std::future::Future>(future: F) -> anyhow::Result<F::Output> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    Ok(runtime.block_on(future))
}

/// Splits `KEY=VALUE` at the first `=`.
pub(super) fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got '{s}'")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_names_follow_kafka() {
        assert_eq!(
            error_name(RDKafkaErrorCode::TopicAlreadyExists),
            "TOPIC_ALREADY_EXISTS"
        );
        assert_eq!(
            code_text(RDKafkaErrorCode::UnknownTopicOrPartition),
            "UNKNOWN_TOPIC_OR_PARTITION: Unknown topic or partition"
        );
    }

    #[test]
    fn key_value() {
        assert_eq!(
            parse_key_value("a=b=c"),
            Ok(("a".to_string(), "b=c".to_string()))
        );
        assert!(parse_key_value("novalue").is_err());
        assert!(parse_key_value("=x").is_err());
    }
}
