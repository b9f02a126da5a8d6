//! Tidy test for ARCHITECTURE.md: the map must name only things that exist, and stay a map.
//!
//! Rules (kept simple so they hold up as the code moves):
//! - the file is at most [`MAX_BYTES`] bytes;
//! - a backticked path from the repository root (`src/...`, `tests/...`, `wit/...`, ...)
//!   exists; `path.rs:name` (a produce or fetch hop) also needs `fn name` in that file,
//!   and `path.rs:Type::name` needs `Type` and `fn name` there; a backticked bare
//!   `file.rs` exists somewhere under `src/`;
//! - a backticked Rust path (`a::b::C`, `Type::method`, optionally followed by an
//!   argument list) whose first segment is not an external crate names, segment by
//!   segment, modules and items defined in the sources (`src/`, `tests/`, `benches/`,
//!   `plugins/`, `connectors/`);
//! - a backticked CamelCase name (`ReplicaManager`) or SCREAMING_CASE name with an
//!   underscore (`SUPPORTED_APIS`) is defined there (`struct`, `enum`, `trait`, `type`,
//!   `const`, `static`, `fn`, `mod`, or an enum variant);
//! - a relative markdown link target exists, and no code span wraps across lines;
//! - every reference to a section of ARCHITECTURE.md in README.md, `docs/`, `wit/` and the
//!   Rust sources (the file name, a comma, the heading in double quotes) names a heading
//!   it has.
//!
//! Kafka API names (Fetch, JoinGroup) are written without backticks in the map, so they
//! are not taken for Rust types.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use regex::Regex;

/// The map's size limit: rust-analyzer's is about 20 KB; ours aims at 12–15 KB.
const MAX_BYTES: usize = 16 * 1024;

/// Directories at the repository root a backticked path may start with.
const ROOTS: &[&str] = &[
    "src/",
    "tests/",
    "wit/",
    "benches/",
    "plugins/",
    "connectors/",
    "config/",
    "docs/",
    "vendor/",
    "fuzz/",
    ".ci/",
];

/// Directories whose `.rs` files define the names the map may use.
const SOURCE_DIRS: &[&str] = &["src", "tests", "benches", "plugins", "connectors"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Every `.rs` file under `dir`, skipping build output.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            if name != "target" && name != ".git" {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Names defined in the sources: items after a keyword (`mod` included), enum variants
/// (loosely: a line that starts with a CamelCase word followed by `{`, `(`, `,`, `=` or
/// nothing), and the module names given by file and directory names.
struct Index {
    defined: HashSet<String>,
    modules: HashSet<String>,
}

impl Index {
    fn build() -> Index {
        let item = Regex::new(
            r"\b(?:fn|struct|enum|trait|type|const|static|mod|union|macro_rules!)\s+([A-Za-z_][A-Za-z0-9_]*)",
        )
        .unwrap();
        let variant = Regex::new(r"^\s*([A-Z][A-Za-z0-9]*)\s*(?:[{(,=]|$)").unwrap();
        let mut files = Vec::new();
        for dir in SOURCE_DIRS {
            rust_files(&root().join(dir), &mut files);
        }
        let mut defined = HashSet::new();
        let mut modules = HashSet::new();
        for file in &files {
            let text = read(file);
            for c in item.captures_iter(&text) {
                defined.insert(c[1].to_string());
            }
            for line in text.lines() {
                if let Some(c) = variant.captures(line) {
                    defined.insert(c[1].to_string());
                }
            }
            for part in file.strip_prefix(root()).unwrap().iter() {
                let part = part.to_string_lossy();
                modules.insert(part.trim_end_matches(".rs").replace('-', "_"));
            }
        }
        Index { defined, modules }
    }
}

/// Crates the sources depend on (`[dependencies]` and `[dev-dependencies]` of the root
/// Cargo.toml), plus the standard library's: paths into them are not ours to check.
fn external_crates() -> HashSet<String> {
    let manifest = read(&root().join("Cargo.toml"));
    let mut crates: HashSet<String> = ["std", "core", "alloc"].map(String::from).into();
    let mut in_deps = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]" || line == "[dev-dependencies]";
        } else if in_deps {
            if let Some((name, _)) = line.split_once('=') {
                let name = name.trim();
                if !name.is_empty() && !name.starts_with('#') {
                    crates.insert(name.replace('-', "_"));
                }
            }
        }
    }
    crates
}

/// The backticked spans of `text`, outside fenced code blocks; a span that wraps onto
/// the next line (an odd number of backticks on a line) is a problem, since it would
/// escape the checks.
fn code_spans(text: &str, problems: &mut Vec<String>) -> Vec<String> {
    let mut spans = Vec::new();
    let mut fenced = false;
    for (number, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        if line.matches('`').count() % 2 == 1 {
            problems.push(format!(
                "line {}: a code span wraps onto the next line; keep it on one",
                number + 1
            ));
        }
        let mut parts = line.split('`');
        parts.next();
        while let (Some(inside), Some(_)) = (parts.next(), parts.next()) {
            spans.push(inside.to_string());
        }
    }
    spans
}

fn is_camel(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_uppercase())
        && s.chars().any(|c| c.is_ascii_lowercase())
        && s.chars().all(|c| c.is_ascii_alphanumeric())
}

fn is_screaming(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_uppercase())
        && s.contains('_')
        && s.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// Problems with one backticked path (`src/x.rs`, `src/x.rs:f`, `src/x.rs:T::f`).
fn check_path(span: &str, problems: &mut Vec<String>) {
    let (path, item) = match span.split_once(".rs:") {
        Some((p, item)) => (format!("{p}.rs"), Some(item)),
        None => (span.to_string(), None),
    };
    let full = root().join(&path);
    if !full.exists() {
        problems.push(format!("`{span}`: {path} does not exist"));
        return;
    }
    let Some(item) = item else { return };
    let text = read(&full);
    let mut segments: Vec<&str> = item.split("::").collect();
    let Some(function) = segments.pop() else {
        return;
    };
    if !Regex::new(&format!(r"\bfn\s+{}\b", regex::escape(function)))
        .unwrap()
        .is_match(&text)
    {
        problems.push(format!("`{span}`: no `fn {function}` in {path}"));
    }
    for ty in segments {
        let defined = Regex::new(&format!(
            r"\b(?:struct|enum|trait|impl(?:<[^>]*>)?)\s+{}\b",
            regex::escape(ty)
        ))
        .unwrap();
        if !defined.is_match(&text) {
            problems.push(format!("`{span}`: no type `{ty}` in {path}"));
        }
    }
}

/// Problems with one backticked Rust path (`a::b::C`, `Type::method(..)`).
fn check_rust_path(
    span: &str,
    index: &Index,
    external: &HashSet<String>,
    problems: &mut Vec<String>,
) {
    let path = span.split('(').next().unwrap_or(span).trim_end_matches('!');
    let segments: Vec<&str> = path.split("::").collect();
    let first = segments[0];
    if external.contains(first) {
        return;
    }
    let segments = match first {
        "crate" | "weir" => &segments[1..],
        _ => &segments[..],
    };
    let Some((last, parents)) = segments.split_last() else {
        return;
    };
    for parent in parents {
        let known = if parent.starts_with(|c: char| c.is_ascii_uppercase()) {
            index.defined.contains(*parent)
        } else {
            index.modules.contains(*parent) || index.defined.contains(*parent)
        };
        if !known {
            problems.push(format!(
                "`{span}`: `{parent}` is not defined in the sources"
            ));
        }
    }
    if !index.defined.contains(*last) && !index.modules.contains(*last) {
        problems.push(format!("`{span}`: `{last}` is not defined in the sources"));
    }
}

/// Every problem with the backticked names and the links of `text`.
fn problems(text: &str) -> Vec<String> {
    let index = Index::build();
    let external = external_crates();
    let rust_path =
        Regex::new(r"^[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)+!?(?:\(.*\))?$").unwrap();
    let mut src_files = Vec::new();
    rust_files(&root().join("src"), &mut src_files);
    let mut out = Vec::new();
    for span in code_spans(text, &mut out) {
        let span = span.trim();
        if span.contains(['<', '*', ' ']) && !rust_path.is_match(span) {
            continue;
        }
        if ROOTS.iter().any(|r| span.starts_with(r)) {
            check_path(span, &mut out);
        } else if span.ends_with(".rs") && !span.contains('/') {
            if !src_files
                .iter()
                .any(|f| f.file_name().is_some_and(|n| n == span))
            {
                out.push(format!("`{span}`: no such file under src/"));
            }
        } else if rust_path.is_match(span) {
            check_rust_path(span, &index, &external, &mut out);
        } else if (is_camel(span) || is_screaming(span)) && !index.defined.contains(span) {
            out.push(format!("`{span}` is not defined in the sources"));
        }
    }
    let link = Regex::new(r"\]\(([^)#\s]+)(?:#[^)]*)?\)").unwrap();
    for c in link.captures_iter(text) {
        let target = &c[1];
        if !target.contains("://") && !root().join(target).exists() {
            out.push(format!("link to {target}: does not exist"));
        }
    }
    out
}

#[test]
fn architecture_md_is_a_map_of_what_exists() {
    let text = read(&root().join("ARCHITECTURE.md"));
    assert!(
        text.len() <= MAX_BYTES,
        "ARCHITECTURE.md is {} bytes, over {MAX_BYTES}: it is a map; move feature detail to \
         docs/, the module's //! header or benches/RESULTS.md",
        text.len()
    );
    let found = problems(&text);
    assert!(
        found.is_empty(),
        "ARCHITECTURE.md names things that do not exist:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn references_to_architecture_sections_resolve() {
    let text = read(&root().join("ARCHITECTURE.md"));
    let headings: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| l.trim_start_matches('#').trim())
        .collect();
    let mut files = vec![root().join("README.md"), root().join("wit/README.md")];
    if let Ok(entries) = std::fs::read_dir(root().join("docs")) {
        files.extend(entries.flatten().map(|e| e.path()));
    }
    for dir in SOURCE_DIRS {
        rust_files(&root().join(dir), &mut files);
    }
    let reference = Regex::new(r#"ARCHITECTURE\.md,\s*"([^"]+)""#).unwrap();
    let mut broken = Vec::new();
    for file in files.iter().filter(|f| f.is_file()) {
        for c in reference.captures_iter(&read(file)) {
            if !headings.iter().any(|h| h.contains(&c[1])) {
                broken.push(format!("{}: \"{}\"", file.display(), &c[1]));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "references to ARCHITECTURE.md sections that do not exist:\n  {}",
        broken.join("\n  ")
    );
}

#[test]
fn the_checker_catches_what_it_should() {
    let bad = "`src/nowhere.rs`, `src/broker.rs:no_such_fn`, `NoSuchType`, \
               `replica::NoSuchThing::append`, `NO_SUCH_CONST`, [x](docs/none.md)\n`wraps";
    assert_eq!(problems(bad).len(), 7, "{:?}", problems(bad));
    let good = "`src/broker.rs:run`, `src/replica.rs:ReplicaManager::append`, \
                `ReplicaManager`, `replica::Partition`, `SUPPORTED_APIS`, \
                `wasmtime::Engine`, `broker::run(config, listeners, shutdown)`, \
                `segment.rs`, `weir serve`, `<log.dirs>/.lock`";
    assert_eq!(problems(good), Vec::<String>::new());
}
