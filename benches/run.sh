#!/usr/bin/env bash
# benches/run.sh — weir's end-to-end load benchmark, on loopback.
#
# Builds weir (release) and librdkafka's own load generator `rdkafka_performance` (from
# the librdkafka sources inside the rdkafka-sys crate), starts a fresh broker on a free
# 127.0.0.1 port with a temporary log dir, and for 1 and then 8 partitions:
#   produce   RECORDS x RECORD_BYTES (acks=1, linger.ms=5, batch.size=1000000, no
#             compression): records/s, MB/s, broker CPU per record, broker peak RSS;
#   floor in  the bytes weir stored for that topic, pushed through a plain TCP socket
#             into a file by benches/floor.rs;
#   consume   the same records back from the beginning (from the page cache);
#   floor out that file back out through a socket;
#   wire      the same produce and consume with benches/wire.rs, a client that sends
#             pre-encoded requests and so costs next to nothing: the broker-bound
#             figures (on 2 CPUs librdkafka needs several times the broker's CPU per
#             record, so the rdkafka rows measure the client as much as the broker),
#             each next to its own floor run;
#   latency   per-message produce latency (produce() call -> delivery report,
#             rdkafka_performance -l): LAT_RECORDS at full speed, then at PACED_RATE/s;
#             then at PACED_RATE/s again with benches/latency.rs, the same librdkafka
#             paced by the clock ("clock-paced" rows): rdkafka_performance -r spins a
#             CPU polling between records, which on 2 cores is most of its tail.
# Broker CPU per record is user+sys of the broker process (/proc/PID/stat) over the
# phase divided by records, the client's the same of the client process (next to it); peak RSS is VmHWM, reset before each phase (clear_refs).
# Ratios are against the floor measured in the same run, seconds apart: the machine is
# shared and noisy, compare ratios rather than absolute figures.
#
# Before each produce phase the script runs `sync` and drops the clean page cache (when
# /proc/sys/vm/drop_caches is writable; DROP_CACHES=0 to skip): on this VM, page-cache
# pages backed by never-touched guest memory cost ~5x more kernel CPU to fill than
# recycled ones, which made produce figures drift by 4x from run to run, the floor's too.
#
# A/B (WEIR_BIN_BEFORE set): one broker per binary, side by side in the same run, each on
# its own free port and log dir (the idle one sleeps), and every phase for both,
# alternately, REPEAT rounds: odd rounds baseline then candidate, even rounds candidate
# then baseline, so the two runs of a pair are seconds apart and the machine's noise hits
# both (each produce still starts from a dropped page cache). Each pair is one unit: the
# rdkafka produce and its consume, the wire produce and its fetch, one latency run. The
# report lists every run's row, then per phase the median of each figure for both,
# candidate/baseline, and whether the candidate is within AB_TOLERANCE% of the baseline
# (or better); load averages seen at the start of each round are printed with it.
#
# Usage: benches/run.sh
#        WEIR_BIN_BEFORE=/path/to/old/weir [WEIR_BIN=/path/to/new/weir] REPEAT=3 benches/run.sh
# Environment (defaults):
#   RECORDS=5000000 RECORD_BYTES=100 PARTITIONS="1 8" LINGER_MS=5 BATCH_BYTES=1000000
#   LAT_RECORDS=1000000  records of each latency run (0 skips them)
#   PACED_RATE=500000    the paced latency run's rate, records/s (0 skips it)
#   STICKY_MS=0          librdkafka sticky.partitioning.linger.ms with >1 partition:
#                        0 spreads records over all partitions (every request has 8)
#   STEP_TIMEOUT=600     seconds allowed to every load step
#   CARGO_TARGET_DIR=/var/tmp/weir-target
#   WEIR_BENCH_CACHE=/var/tmp/weir-bench      where librdkafka is built (once)
#   WEIR_BENCH_DIR=/var/tmp                   where the run's temp dir goes
#   KEEP=1               keep the temp dir (broker log, client outputs, perf data)
#   SKIP_BUILD=1         use the binaries already built
#   PROFILE=1            perf-record the broker in each phase and print its top
#                        functions (perf's overhead inflates that run's CPU figures)
#   BROKER_ENV="K=V ..." extra environment for the broker (both brokers in A/B), e.g.
#                        BROKER_ENV=GLIBC_TUNABLES=glibc.malloc.mmap_threshold=67108864
#   CLIENT_ENV="K=V ..." extra environment for the clients measured (rdkafka_performance,
#                        wire, latency; not the floor's ends), words without spaces, e.g.
#                        CLIENT_ENV=LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
#                        (see CLIENT_CPUS)
#   WEIR_BIN=PATH        the broker binary to measure (the candidate); unset: the weir
#                        built here (when set, only benches/floor.rs and wire.rs are built)
#   WEIR_BIN_BEFORE=PATH the baseline broker binary: A/B mode, above (unset: one broker)
#   REPEAT=1             rounds of every phase; with REPEAT>1 or A/B each round writes its
#                        own topics (bench-pN-rR...), deleted after its unit, and every
#                        run's row carries its side and round (the single-run table and
#                        topic names are unchanged otherwise)
#   PIN=0                1: every broker and the floor's server end on CPU 0, every client
#                        (rdkafka_performance, wire, latency, the floor's client end) on
#                        CPU 1 (taskset), as if the client ran on another machine: on 2
#                        shared cores librdkafka's threads and the broker's compete for
#                        both, and the client's figures move with the broker's idle time
#   CLIENT_CPUS=         a taskset CPU list (e.g. 1): every client runs on those CPUs
#                        only, the brokers anywhere (PIN=1 wins when both are set).
#                        librdkafka's fetch parser (its broker thread) callocs one op per
#                        record and the application thread frees it; on two CPUs at once
#                        the two contend for glibc's arena lock (futex waits), and a
#                        consumer's CPU per record doubles in runs where the scheduler
#                        spreads them (benches/RESULTS.md, session 38). Issue 17's
#                        client-bound targets (consume >= produce, p99 at half the
#                        maximum) are judged with CLIENT_CPUS=1 on 2 vCPUs: each client
#                        then has one CPU, as it would on its own machine
#                        (benches/RESULTS.md, session 41)
#   AB_TOLERANCE=5       % by which a candidate median may be worse than the baseline's
#                        and still count as "ok" (rates lower, CPU/RSS/latency higher)
# Only 127.0.0.1 traffic. The brokers are stopped on exit (trap), whatever happens.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/weir-target}
RECORDS=${RECORDS:-5000000}
RECORD_BYTES=${RECORD_BYTES:-100}
PARTITIONS=${PARTITIONS:-"1 8"}
LINGER_MS=${LINGER_MS:-5}
BATCH_BYTES=${BATCH_BYTES:-1000000}
LAT_RECORDS=${LAT_RECORDS:-1000000}
PACED_RATE=${PACED_RATE:-500000}
STICKY_MS=${STICKY_MS:-0}
STEP_TIMEOUT=${STEP_TIMEOUT:-600}
DROP_CACHES=${DROP_CACHES:-1}
PROFILE=${PROFILE:-}
WEIR_BIN=${WEIR_BIN:-}
WEIR_BIN_BEFORE=${WEIR_BIN_BEFORE:-}
REPEAT=${REPEAT:-1}
AB_TOLERANCE=${AB_TOLERANCE:-5}
PIN=${PIN:-0}
# PIN=1: brokers (and the floor's receiving/sending end) on CPU 0, every client on CPU 1
BROKER_PIN=() CLIENT_PIN=()
if [ "$PIN" = 1 ]; then
  BROKER_PIN=(taskset -c 0) CLIENT_PIN=(taskset -c 1) CLIENT_CPUS=
elif [ -n "${CLIENT_CPUS:-}" ]; then
  CLIENT_PIN=(taskset -c "$CLIENT_CPUS")
fi
CLIENT_ENV_WORDS=()
read -ra CLIENT_ENV_WORDS <<<"${CLIENT_ENV:-}"
for word in "${CLIENT_ENV_WORDS[@]}"; do
  case $word in [A-Za-z_]*=*) ;; *) echo "bench: CLIENT_ENV word '$word' is not K=V" >&2; exit 1 ;; esac
done
CACHE=${WEIR_BENCH_CACHE:-/var/tmp/weir-bench}
LRK_VERSION=4.10.0+2.12.1

say() { printf '== %s\n' "$*" >&2; }
die() { printf 'bench: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------- builds
FLOOR_LINK=$CARGO_TARGET_DIR/release/weir-bench-floor
WIRE_LINK=$CARGO_TARGET_DIR/release/weir-bench-wire
LATENCY_LINK=$CARGO_TARGET_DIR/release/weir-bench-latency
if [ -z "${SKIP_BUILD:-}" ]; then
  if pgrep -x rustc >/dev/null 2>&1; then
    say "warning: other rustc processes are running; figures will be noisier"
  fi
  if [ -z "$WEIR_BIN" ]; then
    say "building weir (release) into $CARGO_TARGET_DIR"
    (cd "$ROOT" && timeout 3600 cargo build --release --bin weir) || die "cargo build failed"
  fi
  say "building benches/floor.rs, wire.rs and latency.rs"
  built=$(cd "$ROOT" && timeout 1200 cargo build --release --bench floor --bench wire --bench latency --message-format=json 2>/dev/null |
    grep -o '"executable":"[^"]*"' | sed 's/.*:"//; s/"$//') || true
  floor_exe=$(grep '/floor-[^/]*$' <<<"$built" | tail -1) || true
  wire_exe=$(grep '/wire-[^/]*$' <<<"$built" | tail -1) || true
  latency_exe=$(grep '/latency-[^/]*$' <<<"$built" | tail -1) || true
  [ -n "$floor_exe" ] && [ -x "$floor_exe" ] && [ -n "$wire_exe" ] && [ -x "$wire_exe" ] &&
    [ -n "$latency_exe" ] && [ -x "$latency_exe" ] ||
    die "could not build the bench programs (cargo build --release --bench floor --bench wire --bench latency)"
  ln -sf "$floor_exe" "$FLOOR_LINK"
  ln -sf "$wire_exe" "$WIRE_LINK"
  ln -sf "$latency_exe" "$LATENCY_LINK"
fi
case $REPEAT in '' | *[!0-9]* | 0) die "REPEAT must be a positive integer, not '$REPEAT'" ;; esac
if [ -n "$WEIR_BIN" ]; then
  [ -x "$WEIR_BIN" ] || die "WEIR_BIN=$WEIR_BIN is not an executable"
else
  [ -x "$CARGO_TARGET_DIR/release/weir" ] || die "no $CARGO_TARGET_DIR/release/weir (run without SKIP_BUILD)"
fi
[ -z "$WEIR_BIN_BEFORE" ] || [ -x "$WEIR_BIN_BEFORE" ] || die "WEIR_BIN_BEFORE=$WEIR_BIN_BEFORE is not an executable"
[ -x "$FLOOR_LINK" ] && [ -x "$WIRE_LINK" ] && [ -x "$LATENCY_LINK" ] ||
  die "no $FLOOR_LINK, $WIRE_LINK or $LATENCY_LINK (run without SKIP_BUILD)"

# librdkafka's rdkafka_performance, statically linked, built once into $CACHE.
LRK_SRC=$CACHE/librdkafka-$LRK_VERSION
PERF=$LRK_SRC/examples/rdkafka_performance
if [ ! -x "$PERF" ]; then
  crate=$(ls -d "$HOME"/.cargo/registry/src/*/rdkafka-sys-"$LRK_VERSION"/librdkafka 2>/dev/null | head -1)
  if [ -z "$crate" ]; then
    # rdkafka-sys is a dependency of weir (through rdkafka): fetch it into the registry.
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
# Snapshots: the shared target dir may be rebuilt by someone else during the run.
cp "${WEIR_BIN:-$CARGO_TARGET_DIR/release/weir}" "$RUN/weir"
cp "$(readlink -f "$FLOOR_LINK")" "$RUN/floor"
cp "$(readlink -f "$WIRE_LINK")" "$RUN/wire"
cp "$(readlink -f "$LATENCY_LINK")" "$RUN/latency"
FLOOR=$RUN/floor
WIRE=$RUN/wire
LATENCY=$RUN/latency
# Sides: "cand" (the broker measured) and, in A/B mode, "base" (WEIR_BIN_BEFORE).
declare -A SIDE_BIN=([cand]=$RUN/weir) SIDE_LOG=() SIDE_ADDR=() SIDE_BPID=() SIDE_TPID=()
SIDES=(cand)
if [ -n "$WEIR_BIN_BEFORE" ]; then
  cp "$WEIR_BIN_BEFORE" "$RUN/weir-base"
  SIDE_BIN[base]=$RUN/weir-base
  SIDES=(base cand)
fi
MULTI=; { [ "${#SIDES[@]}" -gt 1 ] || [ "$REPEAT" -gt 1 ]; } && MULTI=1
# The current side's broker (use_side): binary, log dir, address, pid.
WEIR= LOG= ADDR= BPID=
FPID= PERFPID=
cleanup() {
  local rc=$? s b
  [ -n "$PERFPID" ] && kill -INT "$PERFPID" 2>/dev/null || true
  [ -n "$FPID" ] && kill "$FPID" 2>/dev/null || true
  for s in "${!SIDE_TPID[@]}"; do
    b=${SIDE_BPID[$s]:-}
    if [ -n "$b" ] && kill -0 "$b" 2>/dev/null; then
      kill -TERM "$b" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$b" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$b" 2>/dev/null || true
    fi
    kill "${SIDE_TPID[$s]}" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  if [ -n "${KEEP:-}" ]; then say "kept $RUN"; else rm -rf "$RUN"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_broker SIDE: SIDE's binary on a free 127.0.0.1 port, log dir $RUN/log (one
# broker) or $RUN/SIDE/log (A/B), under timeout (a bound even if this script is killed -9).
start_broker() {
  local side=$1 dir=$RUN tpid addr= bpid
  [ -z "$WEIR_BIN_BEFORE" ] || { dir=$RUN/$side; mkdir -p "$dir"; }
  SIDE_LOG[$side]=$dir/log
  # shellcheck disable=SC2086
  env ${BROKER_ENV:-} timeout -s TERM 7200 "${BROKER_PIN[@]}" "${SIDE_BIN[$side]}" serve --override listeners=PLAINTEXT://127.0.0.1:0 \
    --override admin.listeners=http://127.0.0.1:0 \
    --override log.dirs="$dir/log" >"$dir/broker.out" 2>"$dir/broker.err" &
  tpid=$!
  SIDE_TPID[$side]=$tpid
  for _ in $(seq 300); do
    addr=$(sed -n 's/^weir listening on //p' "$dir/broker.out" | head -1)
    [ -n "$addr" ] && break
    kill -0 "$tpid" 2>/dev/null || { cat "$dir/broker.err" >&2; die "broker ($side) exited at start"; }
    sleep 0.1
  done
  [ -n "$addr" ] || die "broker ($side) did not listen within 30 s"
  case $addr in 127.0.0.1:*) ;; *) die "broker ($side) listens on $addr, not loopback" ;; esac
  bpid=$(pgrep -P "$tpid" -x "$(basename "${SIDE_BIN[$side]}")" | head -1) || true
  [ -n "$bpid" ] || die "cannot find the broker process ($side) under timeout ($tpid)"
  SIDE_ADDR[$side]=$addr
  SIDE_BPID[$side]=$bpid
  say "broker${MULTI:+ ($side)} pid $bpid on $addr, log dir $dir/log"
}
use_side() { WEIR=${SIDE_BIN[$1]} LOG=${SIDE_LOG[$1]} ADDR=${SIDE_ADDR[$1]} BPID=${SIDE_BPID[$1]}; }
for s in "${SIDES[@]}"; do start_broker "$s"; done

# ---------------------------------------------------------------------------- helpers
TCK=$(getconf CLK_TCK)
cpu_ticks() { local s; s=$(<"/proc/$BPID/stat"); s=${s##*) }; set -- $s; echo $((${12} + ${13})); }
per_record_us() { awk -v d="$1" -v t="$TCK" -v r="$2" 'BEGIN {printf "%.3f", d/t*1e6/r}'; }
reset_peak() { echo 5 >"/proc/$BPID/clear_refs" 2>/dev/null || true; }
peak_mb() { awk '/^VmHWM:/ {printf "%.0f", $2/1024}' "/proc/$BPID/status"; }
DROPPED=no
fresh_cache() {
  sync
  if [ "$DROP_CACHES" = 1 ] && { echo 1 >/proc/sys/vm/drop_caches; } 2>/dev/null; then DROPPED=yes; fi
}
# log_bytes TOPIC: bytes of the topic's segment files (what weir stored).
log_bytes() {
  # A deleted topic's directory may vanish while find walks it (removed in the background).
  { find "$LOG" -path "*/$1-[0-9]*/*" -name '*.log' -printf '%s\n' 2>/dev/null || true; } |
    awk '{s+=$1} END {printf "%d", s}'
}
# timed OUT CMD...: CMD under timeout, its output to OUT, "wall user sys" to OUT.time
timed() {
  local out=$1; shift
  local TIMEFORMAT='%R %U %S'
  { time env "${CLIENT_ENV_WORDS[@]}" timeout "$STEP_TIMEOUT" "${CLIENT_PIN[@]}" "$@" >"$out" 2>&1; } 2>"$out.time"
}
client_cpu() { awk '{printf "%.2f", $2+$3}' "$1.time"; }
partition_args() { local i; for ((i = 0; i < $1; i++)); do printf -- '-p %d ' "$i"; done; }
# percentiles FILE: "p50 p99" in ms, of a file of one latency (µs) per line
percentiles() {
  sort -n "$1" | awk '{v[NR]=$1} END {
    if (NR == 0) { print "- -"; exit }
    i50 = int(NR*0.50); if (i50 < NR*0.50) i50++; if (i50 < 1) i50 = 1
    i99 = int(NR*0.99); if (i99 < NR*0.99) i99++; if (i99 < 1) i99 = 1
    printf "%.2f %.2f\n", v[i50]/1000, v[i99]/1000 }'
}
# profile_start NAME / profile_stop NAME: perf record the broker (PROFILE=1)
profile_start() {
  [ -n "$PROFILE" ] || return 0
  perf record -F 1999 -g -p "$BPID" -o "$RUN/perf-$1.data" >"$RUN/perf-$1.log" 2>&1 &
  PERFPID=$!
  sleep 0.5
}
profile_stop() {
  [ -n "$PROFILE" ] && [ -n "$PERFPID" ] || return 0
  kill -INT "$PERFPID" 2>/dev/null || true
  wait "$PERFPID" 2>/dev/null || true
  PERFPID=
  {
    echo "-- broker profile, $1 (perf, cpu-clock samples, self time)"
    perf report -i "$RUN/perf-$1.data" --no-children --sort dso,sym --stdio 2>/dev/null |
      grep -E '^ +[0-9.]+%' | head -25 || true
    echo
  } >>"$RUN/profile.txt"
}
# wait_port FILE: the port a floor program printed
wait_port() {
  local port
  for _ in $(seq 200); do
    port=$(sed -n 's/^floor listening on 127.0.0.1://p' "$1" 2>/dev/null | head -1)
    [ -n "$port" ] && { echo "$port"; return 0; }
    sleep 0.05
  done
  return 1
}
# floor_in BYTES RECORDS: socket -> file; prints "records/s MB/s server-µs-CPU/record"
floor_in() {
  local bytes=$1 recs=$2 port line
  rm -f "$RUN/floor.bin" "$RUN/floor-server.out"
  ( TIMEFORMAT='%U %S'; { time timeout "$STEP_TIMEOUT" "${BROKER_PIN[@]}" "$FLOOR" server "$RUN/floor.bin" \
      >"$RUN/floor-server.out" 2>"$RUN/floor-server.err"; } 2>"$RUN/floor-server.time" ) &
  FPID=$!
  port=$(wait_port "$RUN/floor-server.out") || die "floor server did not start"
  timeout "$STEP_TIMEOUT" "${CLIENT_PIN[@]}" "$FLOOR" client "127.0.0.1:$port" "$bytes" >"$RUN/floor-client.out" || die "floor client failed"
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
  ( TIMEFORMAT='%U %S'; { time timeout "$STEP_TIMEOUT" "${BROKER_PIN[@]}" "$FLOOR" source "$RUN/floor.bin" \
      >"$RUN/floor-source.out" 2>"$RUN/floor-source.err"; } 2>"$RUN/floor-source.time" ) &
  FPID=$!
  port=$(wait_port "$RUN/floor-source.out") || die "floor source did not start"
  timeout "$STEP_TIMEOUT" "${CLIENT_PIN[@]}" "$FLOOR" drain "127.0.0.1:$port" >"$RUN/floor-drain.out" || die "floor drain failed"
  wait "$FPID" || die "floor source failed"; FPID=
  line=$(grep '^floor:' "$RUN/floor-drain.out")
  awk -v l="$line" -v r="$recs" -v t="$(cat "$RUN/floor-source.time")" 'BEGIN {
    split(l, f, /[ =]/); secs = f[5]; split(t, c, " ")
    printf "%.0f %.1f %.3f\n", r/secs, f[3]/secs/1e6, (c[1]+c[2])*1e6/r }'
}
prod_summary() { grep 'messages produced' "$1" | tail -1; }
prod_rate() { sed -n 's/.*ms: \([0-9]*\) msgs\/s.*/\1/p' <<<"$1"; }
prod_mbps() { sed -n 's/.* and \([0-9.]*\) MB\/s.*/\1/p' <<<"$1"; }
prod_ok() { # SUMMARY N: all N delivered, none failed
  local d
  d=$(sed -n 's/.* \([0-9]*\) delivered (offset [-0-9]*, \([0-9]*\) failed).*/\1 \2/p' <<<"$1")
  [ "$d" = "$2 0" ]
}

# wire_field OUT NAME: a field of the `wire:` line
wire_field() { grep '^wire:' "$1" | tail -1 | tr ' ' '\n' | sed -n "s|^$2=||p"; }

ROWS=()
# row PHASE RECS RECS/S MB/S P50 P99 CPU_US PEAK_MB CLIENT_CPU_S FLOOR_RECS/S FLOOR_MB/S FLOOR_CPU_US
# (stored behind the current side and round: SIDE|ROUND|PHASE|...)
SIDE=cand ROUND=1
row() { ROWS+=("$(printf '%s|' "$SIDE" "$ROUND" "$@")"); }

# ---------------------------------------------------------------------------- phases
# Every unit below runs on the current side's broker (use_side) with the current
# partition count P, topic prefix T and output-file suffix TAG (empty for a single run).
create_topic() { timeout 60 "$WEIR" topic create "$1" -p "$P" -b "$ADDR" >/dev/null || die "topic create $1 failed"; }
# drop_topic NAME: with REPEAT>1 or A/B, each unit's topic goes once measured
drop_topic() {
  [ -n "$MULTI" ] || return 0
  timeout 60 "$WEIR" topic delete "$1" -b "$ADDR" >/dev/null || say "warning: topic delete $1 failed"
}
set_common() {
  if [ "$P" = 1 ]; then PROD_PART=(-p 0); EXTRA=(); else PROD_PART=(); EXTRA=(-X "sticky.partitioning.linger.ms=$STICKY_MS"); fi
  COMMON=(-b "$ADDR" -s "$RECORD_BYTES" -a 1 -X "linger.ms=$LINGER_MS" -X "batch.size=$BATCH_BYTES"
    -X compression.codec=none "${EXTRA[@]}")
}

# -- produce: throughput, broker CPU and RSS; then the floor with the bytes weir stored;
#    then consume everything back (page cache), then the floor the other way
unit_rdkafka() {
  local summary bytes frps fmbps fcpu c0 c1 peak got
  create_topic "$T"
  say "produce $RECORDS x $RECORD_BYTES B to $T ($P partition(s))${MULTI:+ [$SIDE #$ROUND]}"
  fresh_cache; reset_peak; profile_start "produce-p$P$TAG"; c0=$(cpu_ticks)
  timed "$RUN/produce-p$P$TAG.out" "$PERF" -P -t "$T" "${PROD_PART[@]}" -c "$RECORDS" -q "${COMMON[@]}" || true
  c1=$(cpu_ticks); peak=$(peak_mb); profile_stop "produce-p$P$TAG"
  summary=$(prod_summary "$RUN/produce-p$P$TAG.out")
  if ! prod_ok "$summary" "$RECORDS"; then
    say "produce to $T FAILED: ${summary:-no summary}"; tail -5 "$RUN/produce-p$P$TAG.out" >&2; FAILED=1
    drop_topic "$T"; return 0
  fi
  bytes=$(log_bytes "$T")
  read -r frps fmbps fcpu < <(floor_in "$bytes" "$RECORDS")
  row "produce p$P" "$RECORDS" "$(prod_rate "$summary")" "$(prod_mbps "$summary")" - - \
    "$(per_record_us $((c1 - c0)) "$RECORDS")" "$peak" "$(client_cpu "$RUN/produce-p$P$TAG.out")" "$frps" "$fmbps" "$fcpu"
  say "  weir stored $bytes B ($(awk -v b="$bytes" -v r="$RECORDS" 'BEGIN {printf "%.1f", b/r}') B/record)"

  say "consume $RECORDS from $T"
  reset_peak; profile_start "consume-p$P$TAG"; c0=$(cpu_ticks)
  # shellcheck disable=SC2046
  timed "$RUN/consume-p$P$TAG.out" "$PERF" -C -t "$T" $(partition_args "$P") -o beginning -c "$RECORDS" -q -b "$ADDR" || true
  c1=$(cpu_ticks); peak=$(peak_mb); profile_stop "consume-p$P$TAG"
  summary=$(grep 'consumed in' "$RUN/consume-p$P$TAG.out" | tail -1)
  got=$(sed -n 's/^% \([0-9]*\) messages.*/\1/p' <<<"$summary")
  if [ "${got:-0}" -lt "$RECORDS" ]; then
    say "consume from $T FAILED: ${summary:-no summary}"; tail -5 "$RUN/consume-p$P$TAG.out" >&2; FAILED=1
  else
    read -r frps fmbps fcpu < <(floor_out "$RECORDS")
    row "consume p$P" "$RECORDS" "$(sed -n 's/.*ms: \([0-9]*\) msgs\/s.*/\1/p' <<<"$summary")" \
      "$(sed -n 's/.*msgs\/s (\([0-9.]*\) MB\/s).*/\1/p' <<<"$summary")" - - \
      "$(per_record_us $((c1 - c0)) "$RECORDS")" "$peak" "$(client_cpu "$RUN/consume-p$P$TAG.out")" "$frps" "$fmbps" "$fcpu"
  fi
  rm -f "$RUN/floor.bin"
  drop_topic "$T"
}

# -- the broker-bound pair: the wire client, then the floor, in each direction
unit_wire() {
  local n got bytes frps fmbps fcpu c0 c1 peak
  create_topic "$T-wire"
  say "wire produce $RECORDS x $RECORD_BYTES B to $T-wire${MULTI:+ [$SIDE #$ROUND]}"
  fresh_cache; reset_peak; profile_start "wire-produce-p$P$TAG"; c0=$(cpu_ticks)
  timed "$RUN/wire-produce-p$P$TAG.out" "$WIRE" produce "$ADDR" "$T-wire" "$P" "$RECORDS" "$RECORD_BYTES" "$BATCH_BYTES" || true
  c1=$(cpu_ticks); peak=$(peak_mb); profile_stop "wire-produce-p$P$TAG"
  n=$(wire_field "$RUN/wire-produce-p$P$TAG.out" records)
  if [ -z "$n" ]; then
    say "wire produce to $T-wire FAILED"; tail -5 "$RUN/wire-produce-p$P$TAG.out" >&2; FAILED=1
  else
    bytes=$(log_bytes "$T-wire")
    read -r frps fmbps fcpu < <(floor_in "$bytes" "$n")
    row "wire produce p$P" "$n" "$(wire_field "$RUN/wire-produce-p$P$TAG.out" records/s)" \
      "$(wire_field "$RUN/wire-produce-p$P$TAG.out" MB/s)" - - "$(per_record_us $((c1 - c0)) "$n")" "$peak" \
      "$(client_cpu "$RUN/wire-produce-p$P$TAG.out")" "$frps" "$fmbps" "$fcpu"
    say "wire fetch $n from $T-wire"
    reset_peak; profile_start "wire-fetch-p$P$TAG"; c0=$(cpu_ticks)
    timed "$RUN/wire-fetch-p$P$TAG.out" "$WIRE" fetch "$ADDR" "$T-wire" "$P" "$n" "$RECORD_BYTES" || true
    c1=$(cpu_ticks); peak=$(peak_mb); profile_stop "wire-fetch-p$P$TAG"
    got=$(wire_field "$RUN/wire-fetch-p$P$TAG.out" records)
    if [ "${got:-0}" -lt "$n" ]; then
      say "wire fetch from $T-wire FAILED"; tail -5 "$RUN/wire-fetch-p$P$TAG.out" >&2; FAILED=1
    else
      read -r frps fmbps fcpu < <(floor_out "$n")
      row "wire fetch p$P" "$got" "$(wire_field "$RUN/wire-fetch-p$P$TAG.out" records/s)" \
        "$(wire_field "$RUN/wire-fetch-p$P$TAG.out" MB/s)" - - "$(per_record_us $((c1 - c0)) "$got")" "$peak" \
        "$(client_cpu "$RUN/wire-fetch-p$P$TAG.out")" "$frps" "$fmbps" "$fcpu"
    fi
    rm -f "$RUN/floor.bin"
  fi
  drop_topic "$T-wire"
}

# -- latency KIND (full|paced): per-message (-l costs the client a timestamp, a copy and a
#    line of output per record, so the full-speed latency run is slower than the produce
#    run above)
unit_latency() {
  local kind=$1 topic label summary p50 p99 c0 c1 peak RATE
  if [ "$kind" = full ]; then RATE=(); topic=$T-lat; label="latency p$P full"
  else RATE=(-r "$PACED_RATE"); topic=$T-paced; label="latency p$P @$PACED_RATE/s"; fi
  create_topic "$topic"
  say "$label: $LAT_RECORDS records to $topic${MULTI:+ [$SIDE #$ROUND]}"
  fresh_cache; reset_peak; c0=$(cpu_ticks)
  timed "$RUN/lat-$kind-p$P$TAG.out" "$PERF" -P -t "$topic" "${PROD_PART[@]}" -c "$LAT_RECORDS" "${RATE[@]}" -q \
    -l -A "$RUN/lat-$kind-p$P$TAG.txt" "${COMMON[@]}" || true
  c1=$(cpu_ticks); peak=$(peak_mb)
  summary=$(prod_summary "$RUN/lat-$kind-p$P$TAG.out")
  if ! prod_ok "$summary" "$LAT_RECORDS"; then
    say "$label FAILED: ${summary:-no summary}"; FAILED=1
  else
    read -r p50 p99 < <(percentiles "$RUN/lat-$kind-p$P$TAG.txt")
    row "$label" "$LAT_RECORDS" "$(prod_rate "$summary")" "$(prod_mbps "$summary")" "$p50" "$p99" \
      "$(per_record_us $((c1 - c0)) "$LAT_RECORDS")" "$peak" "$(client_cpu "$RUN/lat-$kind-p$P$TAG.out")" - - -
  fi
  rm -f "$RUN/lat-$kind-p$P$TAG.txt"
  drop_topic "$topic"
}

# -- latency-clock: the paced run again with benches/latency.rs, the same librdkafka paced
#    by the clock (rdkafka_performance -r spins one CPU polling between records; see the
#    client's doc), same rate, record size and producer settings
unit_latency_clock() {
  local topic=$T-clock label="latency p$P @$PACED_RATE/s clock-paced" c0 c1 peak part=0
  [ "$P" = 1 ] || part=-1
  create_topic "$topic"
  say "$label: $LAT_RECORDS records to $topic${MULTI:+ [$SIDE #$ROUND]}"
  fresh_cache; reset_peak; c0=$(cpu_ticks)
  timed "$RUN/lat-clock-p$P$TAG.out" "$LATENCY" "$ADDR" "$topic" "$part" "$LAT_RECORDS" "$PACED_RATE" "$RECORD_BYTES" \
    -X "linger.ms=$LINGER_MS" -X "batch.size=$BATCH_BYTES" "${EXTRA[@]}" || true
  c1=$(cpu_ticks); peak=$(peak_mb)
  local f=$RUN/lat-clock-p$P$TAG.out n
  n=$(grep '^latency:' "$f" | tail -1 | tr ' ' '\n' | sed -n 's|^records=||p')
  if [ "$n" != "$LAT_RECORDS" ]; then
    say "$label FAILED"; tail -5 "$f" >&2; FAILED=1
  else
    row "$label" "$n" "$(grep '^latency:' "$f" | tr ' ' '\n' | sed -n 's|^records/s=||p')" - \
      "$(grep '^latency:' "$f" | tr ' ' '\n' | sed -n 's|^p50_ms=||p')" \
      "$(grep '^latency:' "$f" | tr ' ' '\n' | sed -n 's|^p99_ms=||p')" \
      "$(per_record_us $((c1 - c0)) "$n")" "$peak" "$(client_cpu "$f")" - - -
  fi
  drop_topic "$topic"
}

REV="$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?')$(cd "$ROOT" && git diff --quiet HEAD -- src Cargo.toml 2>/dev/null || echo '+local changes')"
# bin_id FILE: the first 12 hex digits of a binary's sha256 (which build ran)
bin_id() { sha256sum "$1" | cut -c1-12; }
if [ -n "$WEIR_BIN" ]; then WHAT="$WEIR_BIN (sha256 $(bin_id "$RUN/weir"))"; else WHAT="$REV"; fi
say "machine: $(nproc) cpus, $(uname -r), PIN=$PIN${CLIENT_CPUS:+, clients on CPUs $CLIENT_CPUS}; weir $WHAT${WEIR_BIN_BEFORE:+; baseline $WEIR_BIN_BEFORE (sha256 $(bin_id "$RUN/weir-base"))}"
UNITS=(rdkafka wire)
if [ "$LAT_RECORDS" != 0 ]; then
  UNITS+=(latency-full)
  [ "$PACED_RATE" = 0 ] || UNITS+=(latency-paced latency-clock)
fi
LOADS=()
FAILED=0
for P in $PARTITIONS; do
  for ((ROUND = 1; ROUND <= REPEAT; ROUND++)); do
    LOADS+=("p$P #$ROUND: $(cut -d' ' -f1-3 /proc/loadavg)")
    # odd rounds in SIDES order (baseline first), even rounds reversed
    order=("${SIDES[@]}")
    if [ $((ROUND % 2)) = 0 ] && [ "${#SIDES[@]}" = 2 ]; then order=("${SIDES[1]}" "${SIDES[0]}"); fi
    for unit in "${UNITS[@]}"; do
      for SIDE in "${order[@]}"; do
        use_side "$SIDE"; set_common
        T=bench-p$P TAG=
        if [ -n "$MULTI" ]; then T=bench-p$P-r$ROUND TAG=-$SIDE-r$ROUND; fi
        case $unit in
          rdkafka) unit_rdkafka ;;
          wire) unit_wire ;;
          latency-full) unit_latency full ;;
          latency-paced) unit_latency paced ;;
          latency-clock) unit_latency_clock ;;
        esac
      done
    done
  done
done
LOADS+=("end: $(cut -d' ' -f1-3 /proc/loadavg)")

# ---------------------------------------------------------------------------- report
echo
echo "weir end-to-end on loopback: ${RECORD_BYTES}-byte records, acks=1, linger.ms=$LINGER_MS, batch.size=$BATCH_BYTES, no compression"
echo "weir $WHAT${WEIR_BIN_BEFORE:+ against baseline $WEIR_BIN_BEFORE (sha256 $(bin_id "$RUN/weir-base"))}${BROKER_ENV:+ (broker env: $BROKER_ENV)}${CLIENT_ENV:+ (client env: $CLIENT_ENV)}${CLIENT_CPUS:+ (clients on CPUs $CLIENT_CPUS)}; $(nproc) CPUs, $(uname -r); client: rdkafka_performance (librdkafka $LRK_VERSION); floor: benches/floor.rs; page cache dropped before produce phases: $DROPPED"
echo
H='| %-22s | %8s | %10s | %7s | %7s | %7s | %10s | %7s | %8s | %14s | %11s | %10s | %12s | %10s | %14s |\n'
RH=
if [ -n "$MULTI" ]; then # every run's row, with its side (base/cand) and round
  H="| %-8s $H" RH='| run      '
  echo "every run (base: the baseline, cand: the candidate; #round), in the order they ran:"
  echo
fi
# (hand-aligned: printf pads bytes, and "µ" is two)
echo "$RH"'| phase                  |  records |  records/s |    MB/s |  p50 ms |  p99 ms | µs CPU/rec | peak MB | client s | client µs/rec | floor rec/s | floor MB/s | floor µs/rec | rate/floor | CPU floor/weir |'
echo "${RH:+|----------}"'|------------------------|---------:|-----------:|--------:|--------:|--------:|-----------:|--------:|---------:|---------------:|------------:|-----------:|-------------:|-----------:|---------------:|'
for r in "${ROWS[@]}"; do
  IFS='|' read -r side round ph n rps mb p50 p99 cpu pk cc frps fmb fcpu <<<"$r"
  ratio=$(awk -v a="$rps" -v b="$frps" 'BEGIN { if (b+0 > 0 && a+0 > 0) printf "%.0f%%", 100*a/b; else print "-" }')
  cratio=$(awk -v a="$fcpu" -v b="$cpu" 'BEGIN { if (b+0 > 0 && a+0 > 0) printf "%.0f%%", 100*a/b; else print "-" }')
  ccrec=$(awk -v c="$cc" -v n="$n" 'BEGIN { if (c != "" && c != "-" && n+0 > 0) printf "%.3f", 1e6*c/n; else print "-" }')
  # shellcheck disable=SC2059
  printf "$H" ${MULTI:+"$side #$round"} "$ph" "$n" "$rps" "$mb" "$p50" "$p99" "$cpu" "$pk" "$cc" "$ccrec" "$frps" "$fmb" "$fcpu" "$ratio" "$cratio"
done
cat <<EOF

produce/consume rows: rdkafka_performance; records/s and MB/s (payload, 10^6 B) are its own
  figures (produce: first send to last delivery report; consume: first to last message).
wire rows: benches/wire.rs, pre-encoded ~1 MB Produce requests (5 in flight) / Fetch requests
  (one at a time, 1 MiB per partition), from connect to the last answer: the broker-bound figures.
p50/p99: per-message produce latency, produce() call to delivery report (rdkafka_performance -l);
  "full" produces as fast as the client can (client-side queueing included), "@N/s" is paced
  (rdkafka_performance -r sleeps int(10^6/N) µs a record: above 10^6/s that is 0, unpaced);
  "clock-paced": benches/latency.rs, librdkafka paced every 100 µs without spinning a CPU.
µs CPU/rec: broker user+sys over the phase / records.   peak MB: broker VmHWM during the phase.
client s: the client's user+sys for the phase (it shares the machine's $(nproc) CPUs with the broker);
  client µs/rec: the same per record, next to the broker's µs CPU/rec.
floor: the bytes weir stored for the topic, socket -> file (produce rows) and file -> socket
  (consume rows), by benches/floor.rs, right after the weir phase; floor µs/rec: its server's CPU.
rate/floor: weir records/s / floor records/s.  CPU floor/weir: floor CPU per record / weir's.
targets (DESIGN.md, an in-memory peer): produce >= 2.46 M rec/s at <= 0.13 µs CPU/rec,
  consume >= 3.15 M rec/s, and >= 70% of the floor.
EOF
if [ -n "$MULTI" ]; then
  echo
  printf 'load average (1, 5, 15 min) at the start of each round: %s' "${LOADS[0]}"
  printf '; %s' "${LOADS[@]:1}"; echo
  echo
  if [ -n "$WEIR_BIN_BEFORE" ]; then
    echo "A/B, medians of $REPEAT round(s): baseline $WEIR_BIN_BEFORE, candidate ${WEIR_BIN:-$REV};"
    echo "cand/base = candidate median / baseline median; ok = candidate within $AB_TOLERANCE% of the baseline or better"
    echo "(records/s: higher is better; CPU, RSS and latency: lower is better; floor rows: the machine, each side's"
    echo "floor run right after its own run; rate/floor: records/s over that floor, a cross-check against machine noise)."
  else
    echo "medians of $REPEAT rounds:"
  fi
  echo
  printf '%s\n' "${ROWS[@]}" | awk -F'|' -v tol="$AB_TOLERANCE" -v ab="${WEIR_BIN_BEFORE:+1}" '
    function add(ph, m, side, v,   k) { if (v == "" || v == "-") return; k = ph SUBSEP m; has[k] = 1
      if ((k, side) in vals) vals[k, side] = vals[k, side] " " v; else vals[k, side] = v }
    function median(str,   a, n, i, j, t) { n = split(str, a, " ")
      for (i = 2; i <= n; i++) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
      return n % 2 ? a[(n + 1) / 2] + 0 : (a[n / 2] + a[n / 2 + 1]) / 2 }
    {
      if (!($3 in seen)) { seen[$3] = 1; order[++np] = $3 }
      add($3, "records/s", $1, $5)
      if ($12 + 0 > 0 && $5 + 0 > 0) add($3, "rate/floor %", $1, sprintf("%.1f", 100 * $5 / $12))
      add($3, "µs CPU/rec", $1, $9); add($3, "peak MB", $1, $10)
      if ($11 != "" && $11 != "-" && $4 + 0 > 0) add($3, "client µs CPU/rec", $1, sprintf("%.3f", 1e6 * $11 / $4))
      add($3, "p50 ms", $1, $7); add($3, "p99 ms", $1, $8); add($3, "floor rec/s", $1, $12)
    }
    END {
      nm = split("records/s|rate/floor %|µs CPU/rec|client µs CPU/rec|peak MB|p50 ms|p99 ms|floor rec/s", ms, "|")
      split("hi|-|lo|-|lo|lo|lo|-", dir, "|"); split("%.0f|%.1f|%.3f|%.3f|%.0f|%.2f|%.2f|%.0f", fmt, "|")
      if (ab) {
        print "| phase | figure | baseline | candidate | cand/base | verdict | baseline runs | candidate runs |"
        print "|---|---|---:|---:|---:|---|---|---|"
      } else {
        print "| phase | figure | median | runs |"
        print "|---|---|---:|---|"
      }
      worse = ""
      for (i = 1; i <= np; i++) for (j = 1; j <= nm; j++) {
        k = order[i] SUBSEP ms[j]; if (!(k in has)) continue
        if (!ab) { printf "| %s | %s | " fmt[j] " | %s |\n", order[i], ms[j], median(vals[k, "cand"]), vals[k, "cand"]; continue }
        if (!((k SUBSEP "base") in vals) || !((k SUBSEP "cand") in vals)) {
          printf "| %s | %s | %s | %s | - | missing | %s | %s |\n", order[i], ms[j], "-", "-", vals[k, "base"], vals[k, "cand"]
          worse = worse "\n  " order[i] " " ms[j] ": a side has no run"; continue }
        b = median(vals[k, "base"]); c = median(vals[k, "cand"])
        r = b > 0 ? c / b : 0; v = "ok"
        if (dir[j] == "-") v = ms[j] ~ /^floor/ ? "(machine)" : ms[j] ~ /^client/ ? "(client)" : "(cross-check)"
        else if (b <= 0) v = "-"
        else if (dir[j] == "hi" && r < 1 - tol / 100) v = sprintf("worse by %.1f%%", 100 * (1 - r))
        else if (dir[j] == "lo" && r > 1 + tol / 100) v = sprintf("worse by %.1f%%", 100 * (r - 1))
        if (v ~ /^worse/) worse = worse "\n  " order[i] " " ms[j] ": " v
        printf "| %s | %s | " fmt[j] " | " fmt[j] " | %s | %s | %s | %s |\n", order[i], ms[j], b, c,
          (b > 0 ? sprintf("%.3f", r) : "-"), v, vals[k, "base"], vals[k, "cand"]
      }
      if (ab) {
        print ""
        if (worse == "") printf "verdict: every figure within %s%% of the baseline (or better)\n", tol
        else printf "verdict: NOT every figure within %s%% of the baseline:%s\n", tol, worse
      }
    }'
fi
if [ -n "$PROFILE" ] && [ -f "$RUN/profile.txt" ]; then echo; cat "$RUN/profile.txt"; fi
exit "$FAILED"
