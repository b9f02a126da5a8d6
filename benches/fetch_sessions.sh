#!/usr/bin/env bash
# benches/fetch_sessions.sh — fetch sessions (KIP-227) at 1,000 partitions, with and
# without: two brokers from the same binary, one with the default
# max.incremental.fetch.session.cache.slots (1000) and one with 0 (sessions off), each
# with one topic of PARTITIONS partitions × RECORDS records; one kafka-python consumer
# reads everything from each (benches/fetch_sessions.py), then polls while idle. REPEAT
# rounds, alternating which broker goes first. Prints each run's line: time to read
# everything, then for 10 s of idle polling the Fetch requests per second (broker's
# /metrics) and CPU per fetch of the broker (/proc/PID/task/*/schedstat) and of the client.
#
# Usage: benches/fetch_sessions.sh
#   WEIR_BIN    the weir binary (default: $CARGO_TARGET_DIR/release/weir, else debug)
#   PARTITIONS  1000     RECORDS  100     REPEAT  2
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
bin=${WEIR_BIN:-$target/release/weir}
[ -x "$bin" ] || bin=$target/debug/weir
partitions=${PARTITIONS:-1000}
records=${RECORDS:-100}
repeat=${REPEAT:-2}
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start() { # name slots -> sets port_<name>
    local name=$1 slots=$2 port
    port=$(free_port)
    "$bin" serve --override "listeners=PLAINTEXT://127.0.0.1:$port" \
        --override "log.dirs=$work/$name" --override admin.listeners=http://127.0.0.1:0 \
        --override "max.incremental.fetch.session.cache.slots=$slots" \
        >"$work/$name.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 100); do
        grep -q "listening addr" "$work/$name.log" && break
        sleep 0.2
    done
    eval "port_$name=$port"
    eval "pid_$name=$!"
    eval "admin_$name=http://$(sed -n 's/.*admin API listening addr=\([0-9.:]*\).*/\1/p' "$work/$name.log" | head -1)"
}

echo "binary: $bin ($(git rev-parse --short HEAD)); $partitions partitions x $records records"
start sessions 1000
start sessionless 0
python3 benches/fetch_sessions.py "127.0.0.1:$port_sessions" t "$partitions" "$records" produce
python3 benches/fetch_sessions.py "127.0.0.1:$port_sessionless" t "$partitions" "$records" produce
for round in $(seq 1 "$repeat"); do
    order="sessions sessionless"
    [ $((round % 2)) -eq 0 ] && order="sessionless sessions"
    for name in $order; do
        port_var="port_$name" admin_var="admin_$name" pid_var="pid_$name"
        echo "round $round $name: $(python3 benches/fetch_sessions.py "127.0.0.1:${!port_var}" t \
            "$partitions" "$records" consume "${!admin_var}" "${!pid_var}")"
    done
done
