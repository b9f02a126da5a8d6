//! `weir connector`: create, list, inspect, pause, resume, stop, restart and delete
//! connectors, and show their offsets. Thin wrappers over the Kafka Connect REST API on
//! the admin listener (`admin::connect`), like `curl` against Kafka Connect; the broker
//! runs the connectors.
//!
//! `create FILE` takes a connector TOML file (the same format as `connect.config.dir`,
//! flattened by the broker's own parser so both read a file alike) or a JSON file (Kafka
//! Connect's `{"name", "config"}` body, or the bare config object). A relative `file` is
//! made absolute here, for a broker on this host.
//!
//! Errors print the server's message (`{"message": ...}`) and exit non-zero.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::admin_http::{agent, base, call, print_table, AdminArgs};

/// `weir connector` subcommands.
#[derive(Debug, Subcommand)]
pub(super) enum ConnectorCommand {
    /// Create a connector from a TOML or JSON file (POST /connectors).
    Create(CreateArgs),
    /// List connectors: name, type, state, tasks, class.
    List(AdminArgs),
    /// Show a connector's status (GET /connectors/NAME/status).
    Status(NameArgs),
    /// Pause a connector: no polls, no puts (PUT /connectors/NAME/pause).
    Pause(NameArgs),
    /// Resume a paused or stopped connector (PUT /connectors/NAME/resume).
    Resume(NameArgs),
    /// Stop a connector; its offsets may then be changed (PUT /connectors/NAME/stop).
    Stop(NameArgs),
    /// Restart a connector (POST /connectors/NAME/restart).
    Restart(RestartArgs),
    /// Delete a connector; its offsets are kept (DELETE /connectors/NAME).
    Delete(NameArgs),
    /// Show a connector's offsets (GET /connectors/NAME/offsets).
    Offsets(NameArgs),
}

/// `weir connector create`.
#[derive(Debug, Args)]
pub(super) struct CreateArgs {
    /// The connector's config: FILE.toml or FILE.json.
    pub file: PathBuf,
    #[command(flatten)]
    pub admin: AdminArgs,
}

/// A subcommand naming one connector.
#[derive(Debug, Args)]
pub(super) struct NameArgs {
    /// Connector name.
    pub name: String,
    #[command(flatten)]
    pub admin: AdminArgs,
}

/// `weir connector restart`.
#[derive(Debug, Args)]
pub(super) struct RestartArgs {
    /// Connector name.
    pub name: String,
    /// Restart its tasks too (includeTasks=true).
    #[arg(long)]
    pub include_tasks: bool,
    /// Restart only what is FAILED (onlyFailed=true).
    #[arg(long)]
    pub only_failed: bool,
    #[command(flatten)]
    pub admin: AdminArgs,
}

/// Runs a `connector` subcommand.
///
/// Errors: the file cannot be read or parsed, the admin API cannot be reached, or it
/// answers an error (its message is shown).
pub(super) fn run(cmd: ConnectorCommand) -> anyhow::Result<()> {
    match cmd {
        ConnectorCommand::Create(args) => create(&args),
        ConnectorCommand::List(admin) => list(&admin),
        ConnectorCommand::Status(a) => {
            let v = call(agent().get(&url(&a, "/status")).call())?;
            print_json(&v)
        }
        ConnectorCommand::Pause(a) => {
            call(agent().put(&url(&a, "/pause")).call())?;
            println!("paused connector {}", a.name);
            Ok(())
        }
        ConnectorCommand::Resume(a) => {
            call(agent().put(&url(&a, "/resume")).call())?;
            println!("resumed connector {}", a.name);
            Ok(())
        }
        ConnectorCommand::Stop(a) => {
            call(agent().put(&url(&a, "/stop")).call())?;
            println!("stopped connector {}", a.name);
            Ok(())
        }
        ConnectorCommand::Restart(a) => restart(&a),
        ConnectorCommand::Delete(a) => {
            call(agent().delete(&url(&a, "")).call())?;
            println!("deleted connector {}", a.name);
            Ok(())
        }
        ConnectorCommand::Offsets(a) => {
            let v = call(agent().get(&url(&a, "/offsets")).call())?;
            print_json(&v)
        }
    }
}

/// `/connectors/<name><suffix>` with the name percent-encoded.
fn url(a: &NameArgs, suffix: &str) -> String {
    connector_url(&a.admin, &a.name, suffix)
}

fn connector_url(admin: &AdminArgs, name: &str, suffix: &str) -> String {
    let mut encoded = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            encoded.push(b as char);
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    format!("{}/connectors/{encoded}{suffix}", base(admin))
}

fn print_json(v: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Reads FILE.toml or FILE.json into `(name, config)`.
fn read_config(path: &Path) -> anyhow::Result<(String, BTreeMap<String, String>)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let is_json = path.extension().is_some_and(|e| e == "json");
    let mut config: BTreeMap<String, String> = if is_json {
        let v: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        let (name, config) = match v.get("config") {
            Some(c) => (v.get("name").and_then(Value::as_str), c.clone()),
            None => (None, v.clone()),
        };
        let mut map = crate::connect::config::ConnectorConfig::properties_from_json(path, &config)?;
        if let Some(n) = name {
            map.entry("name".into()).or_insert_with(|| n.to_string());
        }
        map
    } else {
        crate::connect::config::file_properties(path, &text)?
    };
    let Some(name) = config.get("name").cloned() else {
        bail!("{}: no `name`", path.display());
    };
    if let Some(f) = config.get("file").cloned() {
        let absolute =
            std::path::absolute(&f).with_context(|| format!("cannot make file {f:?} absolute"))?;
        config.insert("file".into(), absolute.display().to_string());
    }
    Ok((name, config))
}

fn create(args: &CreateArgs) -> anyhow::Result<()> {
    let (name, config) = read_config(&args.file)?;
    let body = json!({ "name": name, "config": config });
    let url = format!("{}/connectors", base(&args.admin));
    let info = call(agent().post(&url).send_json(body))?;
    println!(
        "created {} connector {name}",
        info.get("type").and_then(Value::as_str).unwrap_or("?")
    );
    Ok(())
}

fn list(admin: &AdminArgs) -> anyhow::Result<()> {
    let url = format!("{}/connectors?expand=status&expand=info", base(admin));
    let all = call(agent().get(&url).call())?;
    let mut rows = Vec::new();
    let mut traces = Vec::new();
    if let Some(map) = all.as_object() {
        for (name, v) in map {
            let status = &v["status"];
            let info = &v["info"];
            let s = |v: &Value| v.as_str().unwrap_or("").to_string();
            let tasks: Vec<String> = status["tasks"]
                .as_array()
                .map(|t| {
                    t.iter()
                        .map(|t| format!("{}:{}", t["id"], s(&t["state"])))
                        .collect()
                })
                .unwrap_or_default();
            rows.push(vec![
                name.clone(),
                s(&status["type"]),
                s(&status["connector"]["state"]),
                if tasks.is_empty() {
                    "-".to_string()
                } else {
                    tasks.join(",")
                },
                s(&info["config"]["connector.class"]),
            ]);
            for t in status["tasks"].as_array().into_iter().flatten() {
                if let Some(trace) = t["trace"].as_str() {
                    traces.push(format!("{name}: task {}: {trace}", t["id"]));
                }
            }
        }
    }
    print_table(&["NAME", "TYPE", "STATE", "TASKS", "CLASS"], &rows);
    // Errors under the table, one line each: the table stays readable.
    for t in traces {
        println!("{t}");
    }
    Ok(())
}

fn restart(a: &RestartArgs) -> anyhow::Result<()> {
    let url = format!(
        "{}?includeTasks={}&onlyFailed={}",
        connector_url(&a.admin, &a.name, "/restart"),
        a.include_tasks,
        a.only_failed
    );
    let v = call(agent().post(&url).call())?;
    if v.is_null() {
        println!("restarted connector {}", a.name);
        Ok(())
    } else {
        print_json(&v)
    }
}
