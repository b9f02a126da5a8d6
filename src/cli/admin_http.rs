//! The admin HTTP API's client side, shared by the subcommands that are its clients
//! (`weir transform`, `weir connector`): the `--admin-url` option, one ureq agent with
//! deadlines, and turning an answer into its JSON or an error with the server's message
//! (`{"error_code", "message"}`).

use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::Args;
use serde_json::Value;

/// Where the admin API is.
#[derive(Debug, Args, Clone)]
pub(super) struct AdminArgs {
    /// The broker's admin HTTP API (admin.listeners).
    #[arg(long, env = "WEIR_ADMIN_URL", default_value = "http://127.0.0.1:8083")]
    pub admin_url: String,
}

/// `--admin-url` without a trailing slash.
pub(super) fn base(admin: &AdminArgs) -> &str {
    admin.admin_url.trim_end_matches('/')
}

/// An HTTP agent: 10 s to connect, 120 s for a whole request.
pub(super) fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(10))
        // A deploy compiles the component (~0.1-1 s) and may wait for a running chunk.
        .timeout(Duration::from_secs(120))
        .build()
}

/// The answer's JSON, or an error with the server's message.
pub(super) fn call(result: Result<ureq::Response, ureq::Error>) -> anyhow::Result<Value> {
    match result {
        Ok(resp) => {
            // 204, and Kafka Connect's 202 for pause/resume/stop, have no body.
            let text = resp
                .into_string()
                .context("cannot read the admin API's answer")?;
            if text.trim().is_empty() {
                return Ok(Value::Null);
            }
            serde_json::from_str(&text).context("the admin API answered something that is not JSON")
        }
        Err(ureq::Error::Status(code, resp)) => {
            let text = resp.into_string().unwrap_or_default();
            let message = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(String::from))
                .unwrap_or(text);
            bail!("{message} (HTTP {code})")
        }
        Err(e) => {
            Err(e).context("cannot reach the admin API (is admin.listeners set? see --admin-url)")
        }
    }
}

/// Prints `rows` under `header` as left-aligned columns two spaces apart.
pub(super) fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let print = |r: &[String]| {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", line.join("  ").trim_end());
    };
    let header: Vec<String> = header.iter().map(|s| s.to_string()).collect();
    print(&header);
    for r in rows {
        print(r);
    }
}
