#!/usr/bin/env bash
# The whole weir test suite, as the README's second command and CI (.ci/run) run it.
#
#  1. installs what the tests need (tests/install-deps.sh: kcat, Python and Node clients,
#     C build deps of the bundled librdkafka, the wasm32-wasip2 Rust target) — idempotent,
#     quiet when all is there;
#  2. checks formatting and clippy (-D warnings), for the broker, the plugin guests
#     (plugins/) and the connector guests (connectors/) — separate workspaces — and builds
#     the guests (wasm32-wasip2 components the plugin and connect tests load);
#  3. runs every Rust test: unit tests and the one integration binary (tests/it), where
#     real clients (rdkafka, kcat, confluent-kafka, kafka-python, aiokafka, kafkajs) drive
#     real brokers;
#  4. runs librdkafka's own integration tests on the allow-lists (tests/compat/): the
#     default scenario, then `noautocreate` against a broker without auto-creation.
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

step "plugin guests (plugins/, wasm32-wasip2)"
# Their own workspace and target dir: the host's CARGO_TARGET_DIR is not theirs.
(
    cd plugins
    unset CARGO_TARGET_DIR
    cargo fmt --all -- --check
    cargo clippy --locked --all-targets -- -D warnings
    cargo clippy --locked --target wasm32-wasip2 -- -D warnings
    cargo test --locked
    cargo build --locked --release --target wasm32-wasip2
)

step "connector guests (connectors/, wasm32-wasip2)"
(
    cd connectors
    unset CARGO_TARGET_DIR
    cargo fmt --all -- --check
    cargo clippy --locked --target wasm32-wasip2 -- -D warnings
    cargo test --locked -p http-client   # the HTTP client's parsing, on the host
    cargo build --locked --release --target wasm32-wasip2
)

step "build"
cargo build --all-targets --locked

step "unit and integration tests"
cargo test --locked

# A weir broker shaped like one of the suite's scenarios: 4 partitions for auto-created
# topics, a short initial rebalance delay (tests/compat/README.md says why), on a free port,
# stopped whatever happens. `start_lrk_broker DIR [--override K=V]...` sets $lrk_boot and
# remembers the pid.
lrk_pids=()
lrk_dirs=()
trap 'for p in "${lrk_pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "${lrk_dirs[@]}"' EXIT
start_lrk_broker() {
    local dir="$1"; shift
    lrk_dirs+=("$dir")
    "$CARGO_TARGET_DIR/debug/weir" serve \
        --override listeners=PLAINTEXT://127.0.0.1:0 \
        --override admin.listeners=http://127.0.0.1:0 \
        --override "log.dirs=$dir/data" \
        --override num.partitions=4 \
        --override group.initial.rebalance.delay.ms=500 \
        "$@" >"$dir/stdout" 2>"$dir/broker.log" &
    lrk_pids+=($!)
    for _ in $(seq 1 100); do
        grep -q '^weir listening on ' "$dir/stdout" && break
        sleep 0.1
    done
    lrk_boot="$(sed -n 's/^weir listening on //p' "$dir/stdout" | head -n1)"
    [ -n "$lrk_boot" ] || { cat "$dir/broker.log" >&2; echo "weir did not start" >&2; exit 1; }
}
# Runs the suite (extra environment first) against $lrk_boot; fails on a failed test or a
# panic in the broker log of DIR.
run_lrk_suite() {
    local dir="$1"; shift
    if ! env "$@" bash tests/compat/librdkafka.sh "$lrk_boot"; then
        echo "--- broker log (last 40 lines)" >&2
        tail -n 40 "$dir/broker.log" >&2
        exit 1
    fi
    if grep -q 'panicked' "$dir/broker.log"; then
        grep -B2 -A8 'panicked' "$dir/broker.log" >&2
        echo "weir panicked during the librdkafka suite" >&2
        exit 1
    fi
}

step "librdkafka's own test suite (allow-list)"
lrk_default="$(mktemp -d /tmp/weir-lrk.XXXXXX)"
start_lrk_broker "$lrk_default"
run_lrk_suite "$lrk_default"

step "librdkafka's own test suite, scenario noautocreate (allow-list)"
lrk_noauto="$(mktemp -d /tmp/weir-lrk.XXXXXX)"
start_lrk_broker "$lrk_noauto" --override auto.create.topics.enable=false
run_lrk_suite "$lrk_noauto" TEST_SCENARIO=noautocreate \
    LRK_ALLOWLIST=tests/compat/librdkafka-allowlist-noautocreate.txt
