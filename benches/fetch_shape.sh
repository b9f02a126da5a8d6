#!/usr/bin/env bash
# benches/fetch_shape.sh — what the shape of Fetch responses costs librdkafka's consumer:
# one broker, one topic of PARTITIONS partitions holding RECORDS records of 100 B
# (rdkafka_performance -P), then, ROUNDS times, each consumer setting in turn reads them
# all from the beginning (rdkafka_performance -C, one queue for all partitions). Prints
# per read: records/s (rdkafka_performance's own figure), the consumer's user+sys CPU,
# its voluntary and involuntary context switches (vcs, ics: a vcs in the tens of
# thousands is librdkafka's threads contending for a lock, see benches/run.sh
# CLIENT_CPUS), and how many Fetch requests the broker answered (its /metrics).
#
# Usage: benches/fetch_shape.sh [SETTING ...]
#   each SETTING is a space-separated list of librdkafka properties, e.g.
#   "fetch.max.bytes=2097152" or "fetch.max.bytes=8388608 max.partition.fetch.bytes=8388608";
#   "" is librdkafka's defaults (50 MiB a response, 1 MiB a partition). Default: ""
#   WEIR_BIN     the weir binary (default: $CARGO_TARGET_DIR/release/weir)
#   PARTITIONS=8 RECORDS=2000000 ROUNDS=3
#   BROKER_ARGS  extra `weir serve` arguments, e.g. "--override fetch.max.bytes=57671680"
#   PERF         rdkafka_performance (default: the one benches/run.sh builds)
#   CLIENT_CPUS  a taskset CPU list for the consumer (e.g. 1); unset: any CPU
# Only 127.0.0.1; the broker is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${WEIR_BIN:-${CARGO_TARGET_DIR:-target}/release/weir}
perf=${PERF:-${WEIR_BENCH_CACHE:-/var/tmp/weir-bench}/librdkafka-4.10.0+2.12.1/examples/rdkafka_performance}
partitions=${PARTITIONS:-8} records=${RECORDS:-2000000} rounds=${ROUNDS:-3}
[ -x "$bin" ] || { echo "no weir binary at $bin (set WEIR_BIN)" >&2; exit 2; }
[ -x "$perf" ] || { echo "no rdkafka_performance at $perf (run benches/run.sh once, or set PERF)" >&2; exit 2; }
[ $# -gt 0 ] || set -- ""
# shellcheck source=benches/lib.sh
. benches/lib.sh
# shellcheck disable=SC2086 # BROKER_ARGS is a list of arguments
start_broker b "$bin" ${BROKER_ARGS:-}
addr=${broker_addr[b]} admin=${broker_admin[b]}
"$bin" topic create shape -p "$partitions" -b "$addr" >/dev/null
timeout 600 "$perf" -P -t shape -s 100 -c "$records" -b "$addr" -X linger.ms=5 -q >"$work/produce.out" 2>&1 ||
    { cat "$work/produce.out" >&2; echo "producing $records records failed" >&2; exit 1; }
partition_args=()
for p in $(seq 0 $((partitions - 1))); do partition_args+=(-p "$p"); done
fetches() { curl -s "$admin/metrics" | sed -n 's/^weir_request_duration_seconds_count{api="Fetch"} //p' | grep . || echo 0; }
echo "weir $bin; $partitions partitions x $records records of 100 B; rdkafka_performance $perf${CLIENT_CPUS:+ on CPUs $CLIENT_CPUS}"
for round in $(seq 1 "$rounds"); do
    for setting in "$@"; do
        props=()
        for kv in $setting; do props+=(-X "$kv"); done
        f0=$(fetches)
        out=$( { /usr/bin/time -f "cpu_s=%U+%S vcs=%w ics=%c" timeout 600 ${CLIENT_CPUS:+taskset -c "$CLIENT_CPUS"} "$perf" -C -t shape "${partition_args[@]}" -o beginning \
            -c "$records" -q -b "$addr" "${props[@]}"; } 2>&1)
        f1=$(fetches)
        rate=$(sed -n 's/.* \([0-9]*\) msgs\/s.*/\1/p' <<<"$out" | tail -1)
        cpu=$(sed -n 's/^cpu_s=\([^ ]*\) .*/\1/p' <<<"$out" | tail -1)
        switches=$(sed -n 's/^cpu_s=[^ ]* //p' <<<"$out" | tail -1)
        echo "round $round [${setting:-librdkafka defaults}]: records/s=$rate client_cpu_s=$cpu $switches fetches=$((${f1%.*} - ${f0%.*}))"
    done
done
