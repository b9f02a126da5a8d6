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
#     default scenario, then, side by side, `noautocreate` against a broker without
#     auto-creation, the 3-broker lists against clusters of three weir nodes (one
#     without auto-creation, one with it for the default-scenario list), and the
#     consumer-group-protocol list (KIP-848) on a broker of its own.
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
# What the tests run: the binary, the library's and the integration tests. The ten bench
# binaries are not linked here (clippy --all-targets above type-checks them; `cargo bench`
# builds them in release): compiling and linking them in debug took 34 CPU-s (83 s wall
# on a loaded 2-core machine) that no test uses.
cargo build --bins --tests --locked

step "unit and integration tests"
# On a failure the panics are printed once more at the end: a CI log shown cut in its
# middle (a test's message can hold a node's whole log) still ends with what failed.
test_log="$(mktemp /tmp/weir-test-log.XXXXXX)"
if ! cargo test --locked 2>&1 | tee "$test_log"; then
    echo "--- the failing tests' panics again (backtrace frames left out):" >&2
    grep -A16 'panicked' "$test_log" | grep -Ev '^ +([0-9]+: |at )' | tail -n 80 >&2
    rm -f "$test_log"
    exit 1
fi
rm -f "$test_log"

# A weir broker shaped like one of the suite's scenarios: 4 partitions for auto-created
# topics, a short initial rebalance delay (tests/compat/README.md says why), on a free port,
# stopped whatever happens. `start_lrk_broker DIR [--override K=V]...` sets $lrk_boot and
# remembers the pid.
lrk_pids=()
lrk_dirs=()
lrk_jobs=()  # suite runs in the background: stopped with all their processes
# Every broker started here gets SIGTERM, and SIGKILL if it is still there 15 s later;
# also on Ctrl-C or SIGTERM of this script (the INT/TERM traps turn those into an exit).
# A background suite run still going is stopped first with all its processes: each one
# is frozen (SIGSTOP, so it starts no more children), its children are stopped the same
# way, then it gets SIGTERM and SIGCONT.
lrk_kill_tree() {
    local c kids
    kill -STOP "$1" 2>/dev/null || true
    kids="$(pgrep -P "$1" || true)"
    for c in $kids; do lrk_kill_tree "$c"; done
    kill "$1" 2>/dev/null || true
    kill -CONT "$1" 2>/dev/null || true
}
lrk_any_alive() {
    local p
    for p in "${lrk_pids[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done
    return 1
}
stop_lrk_brokers() {
    local p
    for p in "${lrk_jobs[@]}"; do lrk_kill_tree "$p"; done
    for p in "${lrk_pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for _ in $(seq 1 150); do
        lrk_any_alive || break
        sleep 0.1
    done
    for p in "${lrk_pids[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    rm -rf "${lrk_dirs[@]}"
}
trap stop_lrk_brokers EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
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
# A cluster of N combined broker-and-controller nodes (docs/cluster.md), shaped like the
# suite's scenarios as start_lrk_broker's broker is; node K keeps data and logs in
# DIR/node-K. `start_lrk_cluster DIR N [--override K=V]...` waits until every node's
# Metadata lists N brokers, sets $lrk_boot to all N PLAINTEXT addresses and remembers the
# pids. The CONTROLLER ports are picked free first (the voter list names them); the Kafka
# and admin ports are the nodes' own picks (port 0). WEIR_PARENT_PID: a node dies with
# this script even if it is killed with SIGKILL and its EXIT trap never runs.
start_lrk_cluster() {
    local dir="$1" n="$2" id voters="" boot="" node ports
    shift 2
    lrk_dirs+=("$dir")
    mapfile -t ports < <(python3 -c '
import socket, sys
held = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in held:
    s.bind(("127.0.0.1", 0))
print("\n".join(str(s.getsockname()[1]) for s in held))' "$n")
    for id in $(seq 1 "$n"); do voters+="${voters:+,}$id@127.0.0.1:${ports[id - 1]}"; done
    for id in $(seq 1 "$n"); do
        node="$dir/node-$id"
        mkdir -p "$node"
        WEIR_PARENT_PID=$$ "$CARGO_TARGET_DIR/debug/weir" serve \
            --override "node.id=$id" \
            --override "controller.quorum.voters=$voters" \
            --override controller.listener.names=CONTROLLER \
            --override "listeners=PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:${ports[id - 1]}" \
            --override admin.listeners=http://127.0.0.1:0 \
            --override "log.dirs=$node/data" \
            --override num.partitions=4 \
            --override group.initial.rebalance.delay.ms=500 \
            --override "broker.rack=RACK$id" \
            "$@" >"$node/stdout" 2>"$node/broker.log" &
        lrk_pids+=($!)
    done
    for id in $(seq 1 "$n"); do
        node="$dir/node-$id"
        for _ in $(seq 1 300); do
            grep -q '^weir listening on ' "$node/stdout" && break
            sleep 0.1
        done
        lrk_boot="$(sed -n 's/^weir listening on //p' "$node/stdout" | head -n1)"
        [ -n "$lrk_boot" ] || { tail -n 40 "$node/broker.log" >&2; echo "weir node $id did not start" >&2; exit 1; }
        boot+="${boot:+,}$lrk_boot"
    done
    # Registration goes through the quorum: wait until each node lists all N brokers.
    for addr in ${boot//,/ }; do
        for _ in $(seq 1 300); do
            [ "$(timeout 5 kcat -b "$addr" -L -m 3 2>/dev/null | grep -c '^  broker [0-9]* at ')" = "$n" ] && break
            sleep 0.1
        done
        [ "$(timeout 5 kcat -b "$addr" -L -m 3 2>/dev/null | grep -c '^  broker [0-9]* at ')" = "$n" ] \
            || { tail -n 40 "$dir"/node-*/broker.log >&2; echo "$addr does not list $n brokers" >&2; exit 1; }
    done
    lrk_boot="$boot"
}
# `run_lrk_suite DIR BOOTSTRAP [ENV=VALUE]...` runs the suite with that extra environment
# against BOOTSTRAP; fails on a failed test or a panic in a broker log under DIR
# (DIR/broker.log, or DIR/node-K/broker.log of a cluster).
run_lrk_suite() {
    local dir="$1" boot="$2" logs log
    shift 2
    mapfile -t logs < <(find "$dir" -name broker.log | sort)
    if ! env "$@" bash tests/compat/librdkafka.sh "$boot"; then
        for log in "${logs[@]}"; do
            echo "--- ${log#"$dir"/} (last 40 lines)" >&2
            tail -n 40 "$log" >&2
        done
        exit 1
    fi
    if grep -q 'panicked' "${logs[@]}"; then
        grep -B2 -A8 'panicked' "${logs[@]}" >&2
        echo "weir panicked during the librdkafka suite" >&2
        exit 1
    fi
}

step "librdkafka's own test suite (allow-list)"
# Tests with offset.store.method=file (0014) leave <topic>-<partition>.offset files in the
# runner's directory, and their "random" topic names repeat across runs: a file left by an
# earlier run makes the consumer start past its records. Removed once here, before any of
# the suites below runs (they run in parallel later, so not inside librdkafka.sh).
rm -f "${LRK_CACHE:-/var/tmp/weir-librdkafka}"/librdkafka-*/tests/*.offset
lrk_default="$(mktemp -d /tmp/weir-lrk.XXXXXX)"
start_lrk_broker "$lrk_default"
# Three test numbers at a time: the tests mostly wait (session timeouts, max.poll.interval,
# rebalances), so this takes the list from ~12.5 min to ~5 on two cores; every test makes
# its own topics and groups (librdkafka's own `make` runs them in parallel too).
run_lrk_suite "$lrk_default" "$lrk_boot" LRK_PARALLEL="${LRK_PARALLEL:-3}"

# The two short scenarios run side by side (separate brokers, ports, data and log dirs):
# each one's output goes to a file, printed when both are done; either failing fails the run.
step "librdkafka's own test suite: scenario noautocreate, 3 brokers, and the consumer group protocol (allow-lists, in parallel)"
lrk_noauto="$(mktemp -d /tmp/weir-lrk.XXXXXX)"
start_lrk_broker "$lrk_noauto" --override auto.create.topics.enable=false
lrk_noauto_boot="$lrk_boot"
lrk_three="$(mktemp -d /tmp/weir-lrk.XXXXXX)"
# the suite's scenarios name replication factor 3 (trivup's 3-broker cluster); each node
# is in rack RACK<id> and consumers may read from followers (KIP-392), as
# 0101_fetch_from_follower expects of trivup's cluster
start_lrk_cluster "$lrk_three" 3 --override auto.create.topics.enable=false \
    --override default.replication.factor=3 \
    --override replica.selector.class=org.apache.kafka.common.replica.RackAwareReplicaSelector
lrk_three_boot="$lrk_boot"
# the default-scenario tests that need three brokers get a cluster of their own, with
# auto-creation on as in that scenario (0103_transactions produces to topics it never
# creates); it idles until the noautocreate list is done
lrk_three_auto="$(mktemp -d /tmp/weir-lrk.XXXXXX)"
start_lrk_cluster "$lrk_three_auto" 3 --override default.replication.factor=3 \
    --override replica.selector.class=org.apache.kafka.common.replica.RackAwareReplicaSelector
lrk_three_auto_boot="$lrk_boot"
# the default scenario again with every consumer on the consumer group protocol (KIP-848:
# the suite's TEST_CONSUMER_GROUP_PROTOCOL=consumer), on a broker of its own
lrk_consumer="$(mktemp -d /tmp/weir-lrk.XXXXXX)"
start_lrk_broker "$lrk_consumer"
lrk_consumer_boot="$lrk_boot"
lrk_out="$(mktemp -d /tmp/weir-lrk-out.XXXXXX)"
lrk_dirs+=("$lrk_out")
(run_lrk_suite "$lrk_noauto" "$lrk_noauto_boot" TEST_SCENARIO=noautocreate \
    LRK_ALLOWLIST=tests/compat/librdkafka-allowlist-noautocreate.txt \
    LRK_LOG_DIR="$lrk_noauto/lrk-logs") >"$lrk_out/noauto" 2>&1 &
lrk_noauto_job=$!
lrk_jobs+=("$lrk_noauto_job")
# then, on the second cluster, the default-scenario tests that need three brokers
(run_lrk_suite "$lrk_three" "$lrk_three_boot" TEST_SCENARIO=noautocreate \
    LRK_ALLOWLIST=tests/compat/librdkafka-allowlist-3brokers.txt \
    LRK_LOG_DIR="$lrk_three/lrk-logs" LRK_PARALLEL=2 &&
    run_lrk_suite "$lrk_three_auto" "$lrk_three_auto_boot" \
        LRK_ALLOWLIST=tests/compat/librdkafka-allowlist-3brokers-default.txt \
        LRK_LOG_DIR="$lrk_three_auto/lrk-logs-default") >"$lrk_out/three" 2>&1 &
lrk_three_job=$!
lrk_jobs+=("$lrk_three_job")
(run_lrk_suite "$lrk_consumer" "$lrk_consumer_boot" TEST_CONSUMER_GROUP_PROTOCOL=consumer \
    LRK_ALLOWLIST=tests/compat/librdkafka-allowlist-consumer-protocol.txt \
    LRK_LOG_DIR="$lrk_consumer/lrk-logs" LRK_PARALLEL=2) >"$lrk_out/consumer" 2>&1 &
lrk_consumer_job=$!
lrk_jobs+=("$lrk_consumer_job")
lrk_failed=0
wait "$lrk_noauto_job" || lrk_failed=1
wait "$lrk_three_job" || lrk_failed=$((lrk_failed + 2))
lrk_consumer_failed=0
wait "$lrk_consumer_job" || lrk_consumer_failed=1
lrk_jobs=()  # done: their pids may be reused
echo "--- scenario noautocreate, 1 broker ($lrk_noauto_boot)"
cat "$lrk_out/noauto"
echo "--- 3 brokers ($lrk_three_boot; default scenario: $lrk_three_auto_boot)"
cat "$lrk_out/three"
echo "--- consumer group protocol, 1 broker ($lrk_consumer_boot)"
cat "$lrk_out/consumer"
if [ "$lrk_consumer_failed" != 0 ]; then
    echo "librdkafka suite failed: consumer group protocol" >&2
    exit 1
fi
case "$lrk_failed" in
    0) ;;
    1) echo "librdkafka suite failed: scenario noautocreate" >&2; exit 1 ;;
    2) echo "librdkafka suite failed: 3 brokers" >&2; exit 1 ;;
    *) echo "librdkafka suite failed: scenario noautocreate and 3 brokers" >&2; exit 1 ;;
esac
