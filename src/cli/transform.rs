//! `weir transform`: deploy, list and delete transform deployments. A client of the admin
//! HTTP API (`/transforms`, see `admin::transforms`), not of the Kafka protocol: the
//! broker loads and runs the component, so `--wasm` names a file on the broker host (a
//! relative path is made absolute here, for a broker on this host).
//!
//! Errors print the server's message (`{"message": ...}`) and exit non-zero.

use anyhow::{bail, Context as _};
use clap::{Args, Subcommand};
use std::path::PathBuf;

pub(super) use super::admin_http::AdminArgs;
use super::admin_http::{agent, base, call, print_table};
use serde_json::{json, Map, Value};

/// `weir transform` subcommands.
#[derive(Debug, Subcommand)]
pub(super) enum TransformCommand {
    /// Deploy a transform component on an input topic (replaces one of the same name
    /// with --replace).
    Deploy(DeployArgs),
    /// List deployments: state, version, lag, counters.
    List(AdminArgs),
    /// Delete a deployment (stops it and forgets its progress).
    Delete(DeleteArgs),
}

/// `weir transform deploy`.
#[derive(Debug, Args)]
pub(super) struct DeployArgs {
    /// Deployment name ([a-zA-Z0-9._-]).
    pub name: String,
    /// The component (.wasm) on the broker host.
    #[arg(long)]
    pub wasm: PathBuf,
    /// Input topic.
    #[arg(long)]
    pub input: String,
    /// Output topic(s), comma-separated; the first is the default output.
    #[arg(long, value_delimiter = ',')]
    pub output: Vec<String>,
    /// Plugin config entry; repeatable.
    #[arg(long = "config", value_name = "KEY=VALUE")]
    pub config: Vec<String>,
    /// async (consume the input, write the outputs) or inline (rewrite produced batches).
    #[arg(long, default_value = "async", value_parser = ["async", "inline"])]
    pub mode: String,
    /// errors.tolerance: none (stop on the first failing record) or all (dead-letter it).
    #[arg(long, default_value = "none", value_parser = ["none", "all"])]
    pub errors_tolerance: String,
    /// errors.deadletterqueue.topic.name.
    #[arg(long)]
    pub dlq_topic: Option<String>,
    /// processing.guarantee (async only): at_least_once, or exactly_once (each chunk's
    /// outputs and progress commit in one transaction).
    #[arg(long, default_value = "at_least_once", value_parser = ["at_least_once", "exactly_once"])]
    pub processing_guarantee: String,
    /// Replace an existing deployment of this name (PUT instead of POST).
    #[arg(long)]
    pub replace: bool,
    #[command(flatten)]
    pub admin: AdminArgs,
}

/// `weir transform delete`.
#[derive(Debug, Args)]
pub(super) struct DeleteArgs {
    /// Deployment name.
    pub name: String,
    #[command(flatten)]
    pub admin: AdminArgs,
}

/// Runs a `transform` subcommand.
///
/// Errors: the admin API cannot be reached, or answers an error (its message is shown).
pub(super) fn run(cmd: TransformCommand) -> anyhow::Result<()> {
    match cmd {
        TransformCommand::Deploy(args) => deploy(args),
        TransformCommand::List(args) => list(&args),
        TransformCommand::Delete(args) => {
            let url = format!("{}/transforms/{}", base(&args.admin), args.name);
            call(agent().delete(&url).call())?;
            println!("deleted transform {}", args.name);
            Ok(())
        }
    }
}

fn deploy(args: DeployArgs) -> anyhow::Result<()> {
    let wasm = if args.wasm.is_absolute() {
        args.wasm.clone()
    } else {
        std::env::current_dir()
            .context("cannot resolve --wasm: no current directory")?
            .join(&args.wasm)
    };
    let mut config = Map::new();
    for kv in &args.config {
        let Some((k, v)) = kv.split_once('=') else {
            bail!("--config {kv:?}: expected KEY=VALUE");
        };
        config.insert(k.to_string(), Value::String(v.to_string()));
    }
    let mut body = json!({
        "name": args.name,
        "wasm": wasm,
        "input": args.input,
        "outputs": args.output,
        "config": config,
        "mode": args.mode,
        "errors.tolerance": args.errors_tolerance,
        "processing.guarantee": args.processing_guarantee,
    });
    if let (Some(d), Some(obj)) = (&args.dlq_topic, body.as_object_mut()) {
        obj.insert(
            "errors.deadletterqueue.topic.name".into(),
            Value::String(d.clone()),
        );
    }
    let status = if args.replace {
        let url = format!("{}/transforms/{}", base(&args.admin), args.name);
        call(agent().put(&url).send_json(body))?
    } else {
        let url = format!("{}/transforms", base(&args.admin));
        call(agent().post(&url).send_json(body))?
    };
    println!(
        "deployed transform {} (version {}, {})",
        args.name,
        short(status.get("version").and_then(Value::as_str).unwrap_or("")),
        status.get("state").and_then(Value::as_str).unwrap_or("?"),
    );
    Ok(())
}

fn short(version: &str) -> &str {
    version.get(..12).unwrap_or(version)
}

fn list(admin: &AdminArgs) -> anyhow::Result<()> {
    let url = format!("{}/transforms", base(admin));
    let all = call(agent().get(&url).call())?;
    let rows: Vec<Vec<String>> = all
        .as_array()
        .map(|a| a.iter().map(row).collect())
        .unwrap_or_default();
    print_table(
        &[
            "NAME", "STATE", "MODE", "VERSION", "INPUT", "OUTPUTS", "LAG", "IN", "OUT", "ERRORS",
            "NS/REC",
        ],
        &rows,
    );
    // Errors under the table, one line each: the table stays readable.
    if let Some(a) = all.as_array() {
        for t in a {
            let name = t.get("name").and_then(Value::as_str).unwrap_or("?");
            if let Some(e) = t.get("error").and_then(Value::as_str) {
                println!("{name}: error: {e}");
            }
            if let Some(e) = t.get("reload_error").and_then(Value::as_str) {
                println!("{name}: reload error: {e}");
            }
        }
    }
    Ok(())
}

fn row(t: &Value) -> Vec<String> {
    let s = |k: &str| t.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let n = |k: &str| match t.get(k) {
        Some(Value::Number(n)) => n.to_string(),
        _ => "-".to_string(),
    };
    let outputs = t
        .get("outputs")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    vec![
        s("name"),
        s("state"),
        s("mode"),
        short(&s("version")).to_string(),
        s("input"),
        outputs,
        n("input_lag"),
        n("records_in"),
        n("records_out"),
        n("errors"),
        n("mean_ns_per_record"),
    ]
}
