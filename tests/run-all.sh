#!/usr/bin/env bash
# The whole weir test suite, as the README's second command and CI (.ci/run) run it.
#
#  1. installs what the tests need (tests/install-deps.sh: kcat, Python and Node clients,
#     C build deps of the bundled librdkafka) — idempotent, quiet when all is there;
#  2. checks formatting and clippy (-D warnings);
#  3. runs every Rust test: unit tests and the one integration binary (tests/it), where
#     real clients (rdkafka, kcat, confluent-kafka, kafka-python, aiokafka, kafkajs) drive
#     real brokers;
#  4. runs librdkafka's own integration tests on the allow-list (tests/compat/).
#
# CARGO_TARGET_DIR defaults to /var/tmp/weir-target so a second run on the same machine
# reuses the build (a fresh clone otherwise rebuilds wasmtime-sized dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/weir-target}"
export CARGO_TERM_COLOR=never

step() { printf '\n=== %s (%s)\n' "$*" "$(date +%T)"; }

step "install test dependencies"
bash tests/install-deps.sh

step "format and lints"
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings

step "build"
cargo build --all-targets --locked

step "unit and integration tests"
cargo test --all-targets --locked

step "librdkafka's own test suite (allow-list)"
bash tests/compat/librdkafka.sh
