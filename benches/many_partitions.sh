#!/usr/bin/env bash
# benches/many_partitions.sh — one broker per size: PARTITIONS partitions (1 is the
# baseline), created, then RECORDS records of 100 B produced round-robin over them and
# read back with confluent-kafka (benches/many_partitions.py). Prints one line per size:
# create time, produce and fetch records/s, broker RSS and open descriptors after the run,
# and the descriptor cache's figures (/metrics). Quote ratios against the 1-partition
# line of the same run.
#
# Usage: benches/many_partitions.sh
#   WEIR_BIN    the weir binary (default: $CARGO_TARGET_DIR/release/weir)
#   SIZES       "1 10000 100000"    RECORDS  200000
#   NOFILE      RLIMIT_NOFILE of the broker (prlimit; default: inherited)
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
bin=${WEIR_BIN:-$target/release/weir}
sizes=${SIZES:-"1 10000 100000"}
records=${RECORDS:-200000}
work=$(mktemp -d /var/tmp/weir-many.XXXXXX)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT INT TERM
for size in $sizes; do
    data="$work/data-$size"
    wrap=()
    [ -n "${NOFILE:-}" ] && wrap=(prlimit "--nofile=$NOFILE:$NOFILE")
    "${wrap[@]}" "$bin" serve --override listeners=PLAINTEXT://127.0.0.1:0 \
        --override admin.listeners=http://127.0.0.1:0 --override "log.dirs=$data" \
        >"$work/out-$size" 2>"$work/log-$size" &
    pid=$!
    for _ in $(seq 1 100); do grep -q 'admin API on' "$work/out-$size" && break; sleep 0.1; done
    boot=$(sed -n 's/^weir listening on //p' "$work/out-$size" | head -n1)
    admin=$(sed -n 's/^weir admin API on //p' "$work/out-$size" | head -n1)
    [ -n "$boot" ] || { cat "$work/log-$size"; exit 1; }
    line=$(python3 benches/many_partitions.py "$boot" "$pid" "$size" "$records")
    cache=$(curl -s "$admin/metrics" | grep -E '^weir_log_open_file' | awk '{printf "%s=%s ", $1, $2}')
    echo "$line $cache"
    kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
    rm -rf "$data"
done
