#!/usr/bin/env bash
# benches/latency_ab.sh — paced produce latency (benches/latency.rs, linger.ms=0, one
# partition, 100 B records) against two weir binaries at once, alternating run by run so
# that the machine's drift falls on both alike; with, per run, what the machine did:
# CPU pressure (/proc/pressure/cpu "some": time some task waited for a CPU) and
# hypervisor steal (/proc/stat). Each run gets a fresh topic; the page cache is synced
# and dropped before it when the script may (root).
#
# Usage: benches/latency_ab.sh BIN_A BIN_B
#   RUNS=10         runs per binary
#   RATE=1100000    records/s asked
#   RECORDS=2000000 records per run
#   PIN=0           1: brokers on CPU 0, the client on CPU 1 (taskset)
#   LATENCY         the latency program (default $CARGO_TARGET_DIR/release/weir-bench-latency,
#                   the link benches/run.sh makes)
# Prints one line per run: `a|b RUN latency: ... cpu_some_ms=.. steal_ms=..` (latency.rs's
# line, see its doc), then per binary the p99s sorted and their median.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { sed -n 2,18p "$0"; exit 2; }
bin_a=$1 bin_b=$2
runs=${RUNS:-10} rate=${RATE:-1100000} records=${RECORDS:-2000000}
latency=${LATENCY:-${CARGO_TARGET_DIR:-target}/release/weir-bench-latency}
[ -x "$latency" ] || { echo "no latency program at $latency (run benches/run.sh once, or set LATENCY)" >&2; exit 2; }
# shellcheck source=benches/lib.sh
. benches/lib.sh
client_pin=()
if [ "${PIN:-0}" = 1 ]; then broker_pin=(taskset -c 0); client_pin=(taskset -c 1); fi
cpu_some_us() { awk '/^some/{split($5,a,"="); print a[2]}' /proc/pressure/cpu 2>/dev/null || echo 0; }
steal_ticks() { awk '/^cpu /{print $9}' /proc/stat; }

start_broker a "$bin_a"
start_broker b "$bin_b"
echo "a: $bin_a; b: $bin_b; $runs runs each at $rate/s, $records records, PIN=${PIN:-0}"
for run in $(seq 1 "$runs"); do
    for side in a b; do
        bin_var="bin_$side"
        addr=${broker_addr[$side]}
        "${!bin_var}" topic create "t$run" -p 1 -b "$addr" >/dev/null
        sync
        [ -w /proc/sys/vm/drop_caches ] && echo 3 >/proc/sys/vm/drop_caches
        c0=$(cpu_some_us) s0=$(steal_ticks)
        line=$("${client_pin[@]}" "$latency" "$addr" "t$run" 0 "$records" "$rate" 100 | grep '^latency:')
        c1=$(cpu_some_us) s1=$(steal_ticks)
        echo "$side $run $line cpu_some_ms=$(((c1 - c0) / 1000)) steal_ms=$(((s1 - s0) * 1000 / $(getconf CLK_TCK)))" |
            tee -a "$work/lines"
    done
done
for side in a b; do
    p99s=$(grep "^$side " "$work/lines" | tr ' ' '\n' | sed -n 's/^p99_ms=//p' | sort -g)
    echo "$side p99 ms sorted: $(echo $p99s); median $(median <<<"$p99s")"
done
