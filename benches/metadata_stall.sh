#!/usr/bin/env bash
# Metadata latency while topics are created under disk pressure.
#
#   bash benches/metadata_stall.sh [WEIR_BIN]   (default: $CARGO_TARGET_DIR/debug/weir)
#
# Starts one broker, a synchronous writer of 3 GB (`dd oflag=dsync`: every fsync waits),
# and 4 clients each creating 5 topics of 40 partitions one after another, then asks
# Metadata (kcat -L) 40 times, 250 ms apart, and prints each answer's latency in ms and
# the largest. A metadata change blocks its thread (the quorum's commit, the partitions'
# files fsynced); before `cluster::off_the_async_workers` it blocked the Tokio worker of
# the request, and two such requests stopped a 2-core broker from answering anything.
# Stops everything it started.
set -u
bin="${1:-${CARGO_TARGET_DIR:-/var/tmp/weir-target}/debug/weir}"
d="$(mktemp -d /tmp/weir-stall.XXXXXX)"
hog="$d/hog"
"$bin" serve --override listeners=PLAINTEXT://127.0.0.1:0 --override admin.listeners= \
    --override "log.dirs=$d/data" >"$d/out" 2>"$d/log" &
pid=$!
cleanup() { kill "$pid" 2>/dev/null; pkill -f "of=$hog" 2>/dev/null; rm -rf "$d"; }
trap cleanup EXIT
for _ in $(seq 1 100); do grep -q 'listening on' "$d/out" && break; sleep 0.1; done
boot="$(sed -n 's/^weir listening on //p' "$d/out" | head -n1)"
[ -n "$boot" ] || { cat "$d/log"; exit 1; }
dd if=/dev/zero of="$hog" bs=1M count=3000 oflag=dsync 2>/dev/null &
sleep 1
for j in 1 2 3 4; do
    (for i in 1 2 3 4 5; do "$bin" topic create -b "$boot" "t$j-$i" --partitions 40 >/dev/null 2>&1; done) &
done
max=0
for _ in $(seq 1 40); do
    s=$(date +%s%N)
    timeout 30 kcat -b "$boot" -L -m 30 >/dev/null 2>&1
    e=$(( ($(date +%s%N) - s) / 1000000 ))
    [ "$e" -gt "$max" ] && max=$e
    printf '%s ' "$e"
    sleep 0.25
done
echo
echo "max_ms=$max topics_created=$(grep -c 'created topic' "$d/log")"
