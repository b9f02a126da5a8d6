#!/usr/bin/env bash
# benches/consumer_cpu.sh — what librdkafka's consumer spends reading from weir, by how the
# broker sends record sets (issue 17): three brokers side by side, each with one topic of
# PARTITIONS partitions holding RECORDS records of 100 bytes written by rdkafka_performance
# (linger.ms=5, batch.size=1000000, as benches/run.sh):
#   base  WEIR_BIN_BEFORE (a build before zero-copy fetch, copying record sets)
#   send  WEIR_BIN with the default fetch.sendfile.enable=true (sendfile(2))
#   copy  WEIR_BIN with fetch.sendfile.enable=false (the same build, copying)
# then ROUNDS rounds of `rdkafka_performance -C` reading everything from each broker in
# turn, printing per run the consumer's records/s (its own figure) and its user+sys CPU
# seconds, then the medians. PIN=1 runs every broker on CPU 0 and the consumer on CPU 1
# (taskset), so the consumer's two threads (librdkafka's broker thread and the
# application thread) share one core instead of running side by side on two.
#
# Usage: WEIR_BIN_BEFORE=/path/old/weir WEIR_BIN=/path/new/weir benches/consumer_cpu.sh
# Environment: RECORDS=3000000 PARTITIONS=1 ROUNDS=6 PIN=0
#   CONSUMER_ARGS  more rdkafka_performance arguments for the consumer, e.g.
#                  "-X max.partition.fetch.bytes=4194304" (the response's shape)
#   RDKAFKA_PERF  rdkafka_performance (default: the one benches/run.sh builds under
#                 /var/tmp/weir-bench)
# Only 127.0.0.1; the brokers are stopped on exit.
set -euo pipefail
: "${WEIR_BIN_BEFORE:?the baseline weir binary}" "${WEIR_BIN:?the weir binary to measure}"
PERF=${RDKAFKA_PERF:-$(ls /var/tmp/weir-bench/librdkafka-*/examples/rdkafka_performance 2>/dev/null | head -1)}
[ -x "$PERF" ] || { echo "no rdkafka_performance: run benches/run.sh once, or set RDKAFKA_PERF" >&2; exit 1; }
RECORDS=${RECORDS:-3000000}
PARTITIONS=${PARTITIONS:-1}
ROUNDS=${ROUNDS:-6}
PIN=${PIN:-0}
TMPDIR=${TMPDIR:-/var/tmp}
# shellcheck source=benches/lib.sh
. "$(dirname "$0")/lib.sh"
client_pin=()
if [ "$PIN" = 1 ]; then broker_pin=(taskset -c 0) client_pin=(taskset -c 1); fi
start_broker base "$WEIR_BIN_BEFORE"
start_broker send "$WEIR_BIN"
start_broker copy "$WEIR_BIN" --override fetch.sendfile.enable=false
parts=()
for ((i = 0; i < PARTITIONS; i++)); do parts+=(-p "$i"); done
for name in base send copy; do
  for _ in $(seq 50); do
    "$WEIR_BIN" topic create -b "${broker_addr[$name]}" -p "$PARTITIONS" t >/dev/null 2>&1 && break
    sleep 0.2
  done
  "$PERF" -P -t t -c "$RECORDS" -s 100 -a 1 -X linger.ms=5 -X batch.size=1000000 -q \
    -b "${broker_addr[$name]}" >"$work/produce-$name.out" 2>&1
done
echo "consumer_cpu: $RECORDS records x 100 B, $PARTITIONS partition(s), $ROUNDS rounds, PIN=$PIN, consumer args: ${CONSUMER_ARGS:-none}; $(nproc) CPUs"
echo "| round | broker | records/s | client CPU s |"
echo "|---|---|---:|---:|"
for ((round = 1; round <= ROUNDS; round++)); do
  for name in base send copy; do
    # shellcheck disable=SC2086 # CONSUMER_ARGS is split into arguments on purpose
    /usr/bin/time -f "%U %S" -o "$work/time" "${client_pin[@]}" "$PERF" -C -t t "${parts[@]}" \
      -o beginning -c "$RECORDS" -q -b "${broker_addr[$name]}" ${CONSUMER_ARGS:-} >"$work/consume.out" 2>&1
    rate=$(grep 'consumed in' "$work/consume.out" | tail -1 | sed -n 's/.*ms: \([0-9]*\) msgs\/s.*/\1/p')
    cpu=$(awk '{printf "%.2f", $1 + $2}' "$work/time")
    echo "| $round | $name | ${rate:-FAILED} | $cpu |"
    echo "$name $rate $cpu" >>"$work/rows"
  done
done
echo
echo "| broker | median records/s | median client CPU s |"
echo "|---|---:|---:|"
for name in base send copy; do
  echo "| $name | $(awk -v n=$name '$1 == n {print $2}' "$work/rows" | median) | $(awk -v n=$name '$1 == n {print $3}' "$work/rows" | median) |"
done
