#!/usr/bin/env bash
# benches/run.sh — weir's end-to-end load benchmark, on loopback.
#
# Builds weir (release) and librdkafka's own load generator `rdkafka_performance` (from
# the librdkafka sources inside the rdkafka-sys crate), starts a fresh broker on a free
# 127.0.0.1 port with a temporary log dir, and for 1 and then 8 partitions:
#   produce RECORDS x RECORD_BYTES (acks=1, linger.ms=5, batch.size=1000000, no
#   compression), then consume them back; a paced produce for latency at a fixed rate;
#   and, next to each phase, the floor (benches/floor.rs): the same bytes weir stored,
#   pushed through a plain TCP socket into a file (produce) or from that file back out
#   (consume) by a minimal Rust program.
# Broker CPU per record is user+sys of the broker process (/proc/PID/stat) over the
# phase divided by records; peak RSS is VmHWM (reset before each phase via clear_refs).
# Prints a table; ratios are against the floor measured in the same run, minutes apart
# (the machine is shared and noisy: compare ratios, not absolute figures).
#
# Usage: benches/run.sh
# Environment (defaults):
#   RECORDS=5000000 RECORD_BYTES=100 PARTITIONS="1 8" LINGER_MS=5 BATCH_BYTES=1000000
#   PACED_RATE=500000 PACED_RECORDS=1000000   paced latency run (0 skips it)
#   STICKY_MS=0          librdkafka sticky.partitioning.linger.ms for >1 partition:
#                        0 spreads every batch over all partitions (random partitioner)
#   STEP_TIMEOUT=600     seconds allowed to every load step
#   CARGO_TARGET_DIR=/var/tmp/weir-target
#   WEIR_BENCH_CACHE=/var/tmp/weir-bench      where librdkafka is built (once)
#   WEIR_BENCH_DIR=/var/tmp                   where the run's temp dir (logs, output) goes
#   KEEP=1               keep the temp dir (broker log, rdkafka_performance output)
#   SKIP_BUILD=1         use the binaries already built
# Only 127.0.0.1 traffic. The broker is stopped on exit (trap), whatever happens.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/weir-target}
RECORDS=${RECORDS:-5000000}
RECORD_BYTES=${RECORD_BYTES:-100}
PARTITIONS=${PARTITIONS:-"1 8"}
LINGER_MS=${LINGER_MS:-5}
BATCH_BYTES=${BATCH_BYTES:-1000000}
PACED_RATE=${PACED_RATE:-500000}
PACED_RECORDS=${PACED_RECORDS:-1000000}
STICKY_MS=${STICKY_MS:-0}
STEP_TIMEOUT=${STEP_TIMEOUT:-600}
CACHE=${WEIR_BENCH_CACHE:-/var/tmp/weir-bench}
LRK_VERSION=4.10.0+2.12.1

say() { printf '== %s\n' "$*" >&2; }
die() { printf 'bench: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------- builds
WEIR=$CARGO_TARGET_DIR/release/weir
FLOOR_LINK=$CARGO_TARGET_DIR/release/weir-bench-floor
if [ -z "${SKIP_BUILD:-}" ]; then
  if pgrep -x rustc >/dev/null 2>&1; then
    say "warning: other rustc processes are running; figures will be noisier"
  fi
  say "building weir (release) into $CARGO_TARGET_DIR"
  (cd "$ROOT" && timeout 3600 cargo build --release --bin weir) || die "cargo build failed"
  say "building the floor (benches/floor.rs)"
  floor_exe=$(cd "$ROOT" && timeout 1200 cargo build --release --bench floor --message-format=json 2>/dev/null |
    grep -o '"executable":"[^"]*floor[^"]*"' | tail -1 | sed 's/.*:"//; s/"$//') || true
  [ -n "$floor_exe" ] && [ -x "$floor_exe" ] || die "could not build benches/floor.rs (cargo build --release --bench floor)"
  ln -sf "$floor_exe" "$FLOOR_LINK"
fi
FLOOR=$FLOOR_LINK
[ -x "$WEIR" ] || die "no $WEIR (run without SKIP_BUILD)"
[ -x "$FLOOR" ] || die "no $FLOOR (run without SKIP_BUILD)"

# librdkafka's rdkafka_performance, statically linked, built once into $CACHE.
LRK_SRC=$CACHE/librdkafka-$LRK_VERSION
PERF=$LRK_SRC/examples/rdkafka_performance
if [ ! -x "$PERF" ]; then
  crate=$(ls -d "$HOME"/.cargo/registry/src/*/rdkafka-sys-"$LRK_VERSION"/librdkafka 2>/dev/null | head -1)
  if [ -z "$crate" ]; then
    # The crate is a dependency of weir (through rdkafka): fetch it into the registry.
    (cd "$ROOT" && timeout 600 cargo fetch -q) || die "cargo fetch failed"
    crate=$(ls -d "$HOME"/.cargo/registry/src/*/rdkafka-sys-"$LRK_VERSION"/librdkafka 2>/dev/null | head -1)
  fi
  [ -n "$crate" ] || die "rdkafka-sys $LRK_VERSION sources not found under ~/.cargo/registry/src"
  say "building librdkafka $LRK_VERSION and rdkafka_performance into $CACHE (once; a few minutes)"
  mkdir -p "$CACHE" && rm -rf "$LRK_SRC" && cp -r "$crate" "$LRK_SRC"
  (cd "$LRK_SRC" && chmod +x configure &&
    timeout 600 ./configure --disable-ssl --disable-gssapi --disable-curl --disable-zstd >"$CACHE/configure.log" 2>&1 &&
    timeout 1800 make -j"$(nproc)" libs >"$CACHE/make.log" 2>&1 &&
    timeout 600 make -C examples rdkafka_performance >"$CACHE/make-examples.log" 2>&1) ||
    die "librdkafka build failed; see $CACHE/*.log"
fi

# ---------------------------------------------------------------------------- broker
mkdir -p "${WEIR_BENCH_DIR:-/var/tmp}"
RUN=$(mktemp -d "${WEIR_BENCH_DIR:-/var/tmp}/weir-bench.XXXXXX")
LOG=$RUN/log
TPID= BPID= FPID=
cleanup() {
  local rc=$?
  [ -n "$FPID" ] && kill "$FPID" 2>/dev/null || true
  if [ -n "$BPID" ] && kill -0 "$BPID" 2>/dev/null; then
    kill -TERM "$BPID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$BPID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$BPID" 2>/dev/null || true
  fi
  [ -n "$TPID" ] && kill "$TPID" 2>/dev/null || true
  wait 2>/dev/null || true
  if [ -n "${KEEP:-}" ]; then say "kept $RUN"; else rm -rf "$RUN"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The broker runs under timeout (a bound even if this script is killed -9).
timeout -s TERM 7200 "$WEIR" serve --override listeners=PLAINTEXT://127.0.0.1:0 \
  --override log.dirs="$LOG" >"$RUN/broker.out" 2>"$RUN/broker.err" &
TPID=$!
ADDR=
for _ in $(seq 300); do
  ADDR=$(sed -n 's/^weir listening on //p' "$RUN/broker.out" | head -1)
  [ -n "$ADDR" ] && break
  kill -0 "$TPID" 2>/dev/null || { cat "$RUN/broker.err" >&2; die "broker exited at start"; }
  sleep 0.1
done
[ -n "$ADDR" ] || die "broker did not listen within 30 s"
case $ADDR in 127.0.0.1:*) ;; *) die "broker listens on $ADDR, not loopback" ;; esac
BPID=$(pgrep -P "$TPID" -x weir | head -1) || true
[ -n "$BPID" ] || die "cannot find the broker process under timeout ($TPID)"
say "broker pid $BPID on $ADDR, log dir $LOG"

# ---------------------------------------------------------------------------- helpers
TCK=$(getconf CLK_TCK)
cpu_ticks() { local s; s=$(<"/proc/$BPID/stat"); s=${s##*) }; set -- $s; echo $((${12} + ${13})); }
reset_peak() { echo 5 >"/proc/$BPID/clear_refs" 2>/dev/null || true; }
peak_mb() { awk '/^VmHWM:/ {printf "%.0f", $2/1024}' "/proc/$BPID/status"; }
# log_bytes TOPIC: bytes of the topic's segment files (what weir stored).
log_bytes() {
  find "$LOG" -path "*/$1-[0-9]*/*" -name '*.log' -printf '%s\n' | awk '{s+=$1} END {printf "%d", s}'
}
# timed OUT CMD...: runs CMD under timeout, stdout+stderr to OUT, "wall user sys" to OUT.time
timed() {
  local out=$1; shift
  local TIMEFORMAT='%R %U %S'
  { time timeout "$STEP_TIMEOUT" "$@" >"$out" 2>&1; } 2>"$out.time"
}
partition_args() { local i; for ((i = 0; i < $1; i++)); do printf -- '-p %d ' "$i"; done; }
# percentiles FILE: "p50 p99" in ms of a file of one latency (µs) per line
percentiles() {
  sort -n -S 25% "$1" | awk '{v[NR]=$1} END {
    if (NR == 0) { print "- -"; exit }
    i50 = int(NR*0.50); if (i50 < NR*0.50) i50++; if (i50 < 1) i50 = 1
    i99 = int(NR*0.99); if (i99 < NR*0.99) i99++; if (i99 < 1) i99 = 1
    printf "%.2f %.2f\n", v[i50]/1000, v[i99]/1000 }'
}
# floor_in BYTES RECORDS: the plain socket-to-file program with BYTES; prints "records/s MB/s cpu_us_per_record"
floor_in() {
  local bytes=$1 recs=$2 port line
  rm -f "$RUN/floor.bin" "$RUN/floor-server.out"
  ( TIMEFORMAT='%U %S'; { time timeout "$STEP_TIMEOUT" "$FLOOR" server "$RUN/floor.bin" \
      >"$RUN/floor-server.out" 2>"$RUN/floor-server.err"; } 2>"$RUN/floor-server.time" ) &
  FPID=$!
  for _ in $(seq 100); do
    port=$(sed -n 's/^floor listening on 127.0.0.1://p' "$RUN/floor-server.out" 2>/dev/null | head -1)
    [ -n "$port" ] && break; sleep 0.05
  done
  [ -n "$port" ] || die "floor server did not start"
  timeout "$STEP_TIMEOUT" "$FLOOR" client "127.0.0.1:$port" "$bytes" >"$RUN/floor-client.out" || die "floor client failed"
  wait "$FPID" || die "floor server failed"; FPID=
  line=$(grep '^floor:' "$RUN/floor-client.out")
  awk -v l="$line" -v r="$recs" -v t="$(cat "$RUN/floor-server.time")" 'BEGIN {
    split(l, f, /[ =]/); secs = f[5]; split(t, c, " ")
    printf "%.0f %.1f %.3f\n", r/secs, f[3]/secs/1e6, (c[1]+c[2])*1e6/r }'
}
# floor_out RECORDS: the same file back out of the page cache through a socket
floor_out() {
  local recs=$1 port line
  rm -f "$RUN/floor-source.out"
  ( timeout "$STEP_TIMEOUT" "$FLOOR" source "$RUN/floor.bin" >"$RUN/floor-source.out" 2>&1 ) &
  FPID=$!
  for _ in $(seq 100); do
    port=$(sed -n 's/^floor listening on 127.0.0.1://p' "$RUN/floor-source.out" 2>/dev/null | head -1)
    [ -n "$port" ] && break; sleep 0.05
  done
  [ -n "$port" ] || die "floor source did not start"
  timeout "$STEP_TIMEOUT" "$FLOOR" drain "127.0.0.1:$port" >"$RUN/floor-drain.out" || die "floor drain failed"
  wait "$FPID" || die "floor source failed"; FPID=
  line=$(grep '^floor:' "$RUN/floor-drain.out")
  awk -v l="$line" -v r="$recs" 'BEGIN { split(l, f, /[ =]/); secs = f[5]
    printf "%.0f %.1f -\n", r/secs, f[3]/secs/1e6 }'
}

ROWS=()
# row PHASE RECS RECS/S MB/S P50 P99 CPU_US PEAK_MB CLIENT_CPU_S FLOOR_RECS/S FLOOR_MB/S FLOOR_CPU_US
row() { ROWS+=("$(printf '%s|' "$@")"); }

# ---------------------------------------------------------------------------- phases
say "machine: $(nproc) cpus, $(uname -r); weir $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?')$(cd "$ROOT" && git diff --quiet 2>/dev/null || echo '+dirty')"
FAILED=0
for P in $PARTITIONS; do
  T=bench-p$P
  timeout 60 "$WEIR" topic create "$T" -p "$P" -b "$ADDR" >/dev/null || die "topic create $T failed"
  timeout 60 "$WEIR" topic create "$T-paced" -p "$P" -b "$ADDR" >/dev/null || die "topic create $T-paced failed"
  if [ "$P" = 1 ]; then PROD_PART="-p 0"; EXTRA=(); else PROD_PART=""; EXTRA=(-X "sticky.partitioning.linger.ms=$STICKY_MS"); fi
  COMMON=(-b "$ADDR" -s "$RECORD_BYTES" -a 1 -X "linger.ms=$LINGER_MS" -X "batch.size=$BATCH_BYTES"
    -X compression.codec=none "${EXTRA[@]}")

  # -- produce: throughput, CPU, RSS; per-message latency at full load (-l -A)
  say "produce $RECORDS x $RECORD_BYTES B to $T ($P partition(s))"
  sync; reset_peak; c0=$(cpu_ticks)
  # shellcheck disable=SC2086
  timed "$RUN/produce-p$P.out" "$PERF" -P -t "$T" $PROD_PART -c "$RECORDS" -q -l -A "$RUN/lat-p$P.txt" "${COMMON[@]}" || true
  c1=$(cpu_ticks); peak=$(peak_mb)
  summary=$(grep 'messages produced' "$RUN/produce-p$P.out" | tail -1)
  delivered=$(sed -n 's/.* \([0-9]*\) delivered (offset [-0-9]*, \([0-9]*\) failed).*/\1 \2/p' <<<"$summary")
  set -- $delivered
  if [ "${1:-0}" != "$RECORDS" ] || [ "${2:-1}" != 0 ]; then
    say "produce to $T FAILED: ${summary:-no summary}"; tail -5 "$RUN/produce-p$P.out" >&2; FAILED=1; continue
  fi
  rps=$(sed -n 's/.*ms: \([0-9]*\) msgs\/s.*/\1/p' <<<"$summary")
  mbps=$(sed -n 's/.* and \([0-9.]*\) MB\/s.*/\1/p' <<<"$summary")
  read -r p50 p99 < <(percentiles "$RUN/lat-p$P.txt")
  rm -f "$RUN/lat-p$P.txt"
  cpu_us=$(awk -v d=$((c1 - c0)) -v t="$TCK" -v r="$RECORDS" 'BEGIN {printf "%.3f", d/t*1e6/r}')
  ccpu=$(awk '{printf "%.2f", $2+$3}' "$RUN/produce-p$P.out.time")
  bytes=$(log_bytes "$T")
  read -r frps fmbps fcpu < <(floor_in "$bytes" "$RECORDS")
  row "produce p$P" "$RECORDS" "$rps" "$mbps" "$p50" "$p99" "$cpu_us" "$peak" "$ccpu" "$frps" "$fmbps" "$fcpu"
  say "  weir stored $bytes B ($(awk -v b="$bytes" -v r="$RECORDS" 'BEGIN {printf "%.1f", b/r}') B/record on disk)"

  # -- consume everything back
  say "consume $RECORDS from $T"
  reset_peak; c0=$(cpu_ticks)
  # shellcheck disable=SC2046
  timed "$RUN/consume-p$P.out" "$PERF" -C -t "$T" $(partition_args "$P") -o beginning -c "$RECORDS" -q -b "$ADDR" || true
  c1=$(cpu_ticks); peak=$(peak_mb)
  summary=$(grep 'consumed in' "$RUN/consume-p$P.out" | tail -1)
  got=$(sed -n 's/^% \([0-9]*\) messages.*/\1/p' <<<"$summary")
  if [ "${got:-0}" -lt "$RECORDS" ]; then
    say "consume from $T FAILED: ${summary:-no summary}"; tail -5 "$RUN/consume-p$P.out" >&2; FAILED=1
  else
    rps=$(sed -n 's/.*ms: \([0-9]*\) msgs\/s.*/\1/p' <<<"$summary")
    mbps=$(sed -n 's/.*msgs\/s (\([0-9.]*\) MB\/s).*/\1/p' <<<"$summary")
    cpu_us=$(awk -v d=$((c1 - c0)) -v t="$TCK" -v r="$RECORDS" 'BEGIN {printf "%.3f", d/t*1e6/r}')
    ccpu=$(awk '{printf "%.2f", $2+$3}' "$RUN/consume-p$P.out.time")
    read -r frps fmbps fcpu < <(floor_out "$RECORDS")
    row "consume p$P" "$RECORDS" "$rps" "$mbps" - - "$cpu_us" "$peak" "$ccpu" "$frps" "$fmbps" "$fcpu"
  fi
  rm -f "$RUN/floor.bin"

  # -- paced produce: latency below saturation
  if [ "$PACED_RATE" != 0 ] && [ "$PACED_RECORDS" != 0 ]; then
    say "paced produce $PACED_RECORDS at $PACED_RATE/s to $T-paced"
    reset_peak; c0=$(cpu_ticks)
    # shellcheck disable=SC2086
    timed "$RUN/paced-p$P.out" "$PERF" -P -t "$T-paced" $PROD_PART -c "$PACED_RECORDS" -r "$PACED_RATE" -q \
      -l -A "$RUN/lat-paced-p$P.txt" "${COMMON[@]}" || true
    c1=$(cpu_ticks); peak=$(peak_mb)
    summary=$(grep 'messages produced' "$RUN/paced-p$P.out" | tail -1)
    rps=$(sed -n 's/.*ms: \([0-9]*\) msgs\/s.*/\1/p' <<<"$summary")
    mbps=$(sed -n 's/.* and \([0-9.]*\) MB\/s.*/\1/p' <<<"$summary")
    read -r p50 p99 < <(percentiles "$RUN/lat-paced-p$P.txt")
    rm -f "$RUN/lat-paced-p$P.txt"
    cpu_us=$(awk -v d=$((c1 - c0)) -v t="$TCK" -v r="$PACED_RECORDS" 'BEGIN {printf "%.3f", d/t*1e6/r}')
    ccpu=$(awk '{printf "%.2f", $2+$3}' "$RUN/paced-p$P.out.time")
    row "paced p$P @${PACED_RATE}/s" "$PACED_RECORDS" "${rps:--}" "${mbps:--}" "$p50" "$p99" "$cpu_us" "$peak" "$ccpu" - - -
  fi
done

# ---------------------------------------------------------------------------- report
echo
echo "weir end-to-end on loopback: ${RECORD_BYTES}-byte records, acks=1, linger.ms=$LINGER_MS, batch.size=$BATCH_BYTES, no compression"
echo "$(nproc) CPUs; broker: $WEIR; client: librdkafka $LRK_VERSION rdkafka_performance; floor: benches/floor.rs"
echo
printf '| %-20s | %9s | %10s | %7s | %8s | %8s | %10s | %8s | %9s | %11s | %9s | %10s | %8s |\n' \
  phase records "records/s" "MB/s" "p50 ms" "p99 ms" "µs CPU/rec" "peak MB" "client s" "floor rec/s" "floor MB/s" "floor µs/rec" "vs floor"
printf '|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n' ---------------------- ----------: ------------: ---------: \
  ----------: ----------: ------------: ----------: -----------: -------------: -----------: ------------: ----------:
for r in "${ROWS[@]}"; do
  IFS='|' read -r ph n rps mb p50 p99 cpu pk cc frps fmb fcpu <<<"$r"
  ratio=$(awk -v a="$rps" -v b="$frps" 'BEGIN { if (b+0 > 0 && a+0 > 0) printf "%.0f%%", 100*a/b; else print "-" }')
  printf '| %-20s | %9s | %10s | %7s | %8s | %8s | %10s | %8s | %9s | %11s | %9s | %10s | %8s |\n' \
    "$ph" "$n" "$rps" "$mb" "$p50" "$p99" "$cpu" "$pk" "$cc" "$frps" "$fmb" "$fcpu" "$ratio"
done
echo
echo "records/s, MB/s (payload, 10^6 B): rdkafka_performance's own figures (produce: first send to last"
echo "delivery report; consume: first to last message). p50/p99: per-message produce latency, produce()"
echo "call to delivery report (rdkafka_performance -l -A); the full-load rows include client-side queueing."
echo "µs CPU/rec: broker user+sys over the phase / records. peak MB: broker VmHWM during the phase."
echo "client s: rdkafka_performance user+sys. floor: the bytes weir stored for the topic, socket -> file"
echo "(produce rows) and file -> socket (consume rows), by benches/floor.rs; floor µs/rec: its server's CPU."
echo "targets (DESIGN.md, in-memory peer): produce >= 2.46 M rec/s at <= 0.13 µs CPU/rec; consume >= 3.15 M rec/s; >= 70% of floor"
exit "$FAILED"
