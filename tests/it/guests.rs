//! Builds the guest crates in `plugins/` (once per test process) and finds their
//! components. Shared with `benches/plugins.rs` (included by path).
//!
//! Runs `cargo build --release --target wasm32-wasip2` inside `plugins/` (its own
//! workspace and target dir, whatever `CARGO_TARGET_DIR` says for the host build). A
//! missing target fails with the command that adds it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The guest workspace: `<repo>/plugins`.
pub fn plugins_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("plugins")
}

/// Builds every guest (once per process) and returns the component of crate `name`
/// (`murmur2`, `redact`, `hostile`, ...). Panics with the build's output or with how to
/// add the `wasm32-wasip2` target.
pub fn guest(name: &str) -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = BUILT
        .get_or_init(build)
        .as_ref()
        .unwrap_or_else(|e| panic!("{e}"));
    let path = dir.join(format!("{}.wasm", name.replace('-', "_")));
    assert!(path.exists(), "no guest component at {}", path.display());
    path
}

fn target_installed() -> bool {
    let sysroot = Command::new("rustc").args(["--print", "sysroot"]).output();
    match sysroot {
        Ok(out) if out.status.success() => {
            let root = String::from_utf8_lossy(&out.stdout).trim().to_string();
            Path::new(&root).join("lib/rustlib/wasm32-wasip2").exists()
        }
        // Cannot tell: let cargo try and report.
        _ => true,
    }
}

fn build() -> Result<PathBuf, String> {
    build_workspace(&plugins_dir())
}

/// Builds the guest workspace at `dir` (`plugins/` or `connectors/`) with
/// `cargo build --release --target wasm32-wasip2` into its own `target/`; returns the
/// directory of the built components.
pub fn build_workspace(dir: &Path) -> Result<PathBuf, String> {
    if !target_installed() {
        return Err("the wasm32-wasip2 Rust target is missing: run \
                    `rustup target add wasm32-wasip2` (tests/install-deps.sh does it)"
            .into());
    }
    let target_dir = dir.join("target");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(dir)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .args([
            "build",
            "--release",
            "--locked",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
        ])
        .arg(&target_dir)
        .output()
        .map_err(|e| {
            format!(
                "cannot run cargo to build the guests in {}: {e}",
                dir.display()
            )
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let hint =
            if stderr.contains("wasm32-wasip2") && stderr.contains("target may not be installed") {
                "\nhint: run `rustup target add wasm32-wasip2`"
            } else {
                ""
            };
        return Err(format!(
            "building the guests (cd {} && cargo build --release --target wasm32-wasip2) failed:\n{stderr}{hint}",
            dir.display()
        ));
    }
    Ok(target_dir.join("wasm32-wasip2/release"))
}
