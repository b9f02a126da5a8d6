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
#             rdkafka_performance -l): LAT_RECORDS at full speed, then at PACED_RATE/s.
# Broker CPU per record is user+sys of the broker process (/proc/PID/stat) over the
# phase divided by records; peak RSS is VmHWM, reset before each phase (clear_refs).
# Ratios are against the floor measured in the same run, seconds apart: the machine is
# shared and noisy, compare ratios rather than absolute figures.
#
# Before each produce phase the script runs `sync` and drops the clean page cache (when
# /proc/sys/vm/drop_caches is writable; DROP_CACHES=0 to skip): on this VM, page-cache
# pages backed by never-touched guest memory cost ~5x more kernel CPU to fill than
# recycled ones, which made produce figures drift by 4x from run to run, the floor's too.
#
# Usage: benches/run.sh
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
#   BROKER_ENV="K=V ..." extra environment for the broker, for A/B runs, e.g.
#                        BROKER_ENV=GLIBC_TUNABLES=glibc.malloc.mmap_threshold=67108864
# Only 127.0.0.1 traffic. The broker is stopped on exit (trap), whatever happens.
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
CACHE=${WEIR_BENCH_CACHE:-/var/tmp/weir-bench}
LRK_VERSION=4.10.0+2.12.1

say() { printf '== %s\n' "$*" >&2; }
die() { printf 'bench: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------- builds
FLOOR_LINK=$CARGO_TARGET_DIR/release/weir-bench-floor
WIRE_LINK=$CARGO_TARGET_DIR/release/weir-bench-wire
if [ -z "${SKIP_BUILD:-}" ]; then
  if pgrep -x rustc >/dev/null 2>&1; then
    say "warning: other rustc processes are running; figures will be noisier"
  fi
  say "building weir (release) into $CARGO_TARGET_DIR"
  (cd "$ROOT" && timeout 3600 cargo build --release --bin weir) || die "cargo build failed"
  say "building benches/floor.rs and benches/wire.rs"
  built=$(cd "$ROOT" && timeout 1200 cargo build --release --bench floor --bench wire --message-format=json 2>/dev/null |
    grep -o '"executable":"[^"]*"' | sed 's/.*:"//; s/"$//') || true
  floor_exe=$(grep '/floor-[^/]*$' <<<"$built" | tail -1) || true
  wire_exe=$(grep '/wire-[^/]*$' <<<"$built" | tail -1) || true
  [ -n "$floor_exe" ] && [ -x "$floor_exe" ] && [ -n "$wire_exe" ] && [ -x "$wire_exe" ] ||
    die "could not build the bench programs (cargo build --release --bench floor --bench wire)"
  ln -sf "$floor_exe" "$FLOOR_LINK"
  ln -sf "$wire_exe" "$WIRE_LINK"
fi
[ -x "$CARGO_TARGET_DIR/release/weir" ] || die "no $CARGO_TARGET_DIR/release/weir (run without SKIP_BUILD)"
[ -x "$FLOOR_LINK" ] && [ -x "$WIRE_LINK" ] || die "no $FLOOR_LINK or $WIRE_LINK (run without SKIP_BUILD)"

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
LOG=$RUN/log
# Snapshots: the shared target dir may be rebuilt by someone else during the run.
cp "$CARGO_TARGET_DIR/release/weir" "$RUN/weir"
cp "$(readlink -f "$FLOOR_LINK")" "$RUN/floor"
cp "$(readlink -f "$WIRE_LINK")" "$RUN/wire"
WEIR=$RUN/weir
FLOOR=$RUN/floor
WIRE=$RUN/wire
TPID= BPID= FPID= PERFPID=
cleanup() {
  local rc=$?
  [ -n "$PERFPID" ] && kill -INT "$PERFPID" 2>/dev/null || true
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
# shellcheck disable=SC2086
env ${BROKER_ENV:-} timeout -s TERM 7200 "$WEIR" serve --override listeners=PLAINTEXT://127.0.0.1:0 \
  --override admin.listeners=http://127.0.0.1:0 \
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
  find "$LOG" -path "*/$1-[0-9]*/*" -name '*.log' -printf '%s\n' | awk '{s+=$1} END {printf "%d", s}'
}
# timed OUT CMD...: CMD under timeout, its output to OUT, "wall user sys" to OUT.time
timed() {
  local out=$1; shift
  local TIMEFORMAT='%R %U %S'
  { time timeout "$STEP_TIMEOUT" "$@" >"$out" 2>&1; } 2>"$out.time"
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
  ( TIMEFORMAT='%U %S'; { time timeout "$STEP_TIMEOUT" "$FLOOR" server "$RUN/floor.bin" \
      >"$RUN/floor-server.out" 2>"$RUN/floor-server.err"; } 2>"$RUN/floor-server.time" ) &
  FPID=$!
  port=$(wait_port "$RUN/floor-server.out") || die "floor server did not start"
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
  ( TIMEFORMAT='%U %S'; { time timeout "$STEP_TIMEOUT" "$FLOOR" source "$RUN/floor.bin" \
      >"$RUN/floor-source.out" 2>"$RUN/floor-source.err"; } 2>"$RUN/floor-source.time" ) &
  FPID=$!
  port=$(wait_port "$RUN/floor-source.out") || die "floor source did not start"
  timeout "$STEP_TIMEOUT" "$FLOOR" drain "127.0.0.1:$port" >"$RUN/floor-drain.out" || die "floor drain failed"
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
row() { ROWS+=("$(printf '%s|' "$@")"); }

# ---------------------------------------------------------------------------- phases
REV="$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?')$(cd "$ROOT" && git diff --quiet HEAD -- src Cargo.toml 2>/dev/null || echo '+local changes')"
say "machine: $(nproc) cpus, $(uname -r); weir $REV"
FAILED=0
for P in $PARTITIONS; do
  T=bench-p$P
  for t in "$T" "$T-wire" "$T-lat" "$T-paced"; do
    timeout 60 "$WEIR" topic create "$t" -p "$P" -b "$ADDR" >/dev/null || die "topic create $t failed"
  done
  if [ "$P" = 1 ]; then PROD_PART=(-p 0); EXTRA=(); else PROD_PART=(); EXTRA=(-X "sticky.partitioning.linger.ms=$STICKY_MS"); fi
  COMMON=(-b "$ADDR" -s "$RECORD_BYTES" -a 1 -X "linger.ms=$LINGER_MS" -X "batch.size=$BATCH_BYTES"
    -X compression.codec=none "${EXTRA[@]}")

  # -- produce: throughput, broker CPU and RSS; then the floor with the bytes weir stored
  say "produce $RECORDS x $RECORD_BYTES B to $T ($P partition(s))"
  fresh_cache; reset_peak; profile_start "produce-p$P"; c0=$(cpu_ticks)
  timed "$RUN/produce-p$P.out" "$PERF" -P -t "$T" "${PROD_PART[@]}" -c "$RECORDS" -q "${COMMON[@]}" || true
  c1=$(cpu_ticks); peak=$(peak_mb); profile_stop "produce-p$P"
  summary=$(prod_summary "$RUN/produce-p$P.out")
  if ! prod_ok "$summary" "$RECORDS"; then
    say "produce to $T FAILED: ${summary:-no summary}"; tail -5 "$RUN/produce-p$P.out" >&2; FAILED=1; continue
  fi
  bytes=$(log_bytes "$T")
  read -r frps fmbps fcpu < <(floor_in "$bytes" "$RECORDS")
  row "produce p$P" "$RECORDS" "$(prod_rate "$summary")" "$(prod_mbps "$summary")" - - \
    "$(per_record_us $((c1 - c0)) "$RECORDS")" "$peak" "$(client_cpu "$RUN/produce-p$P.out")" "$frps" "$fmbps" "$fcpu"
  say "  weir stored $bytes B ($(awk -v b="$bytes" -v r="$RECORDS" 'BEGIN {printf "%.1f", b/r}') B/record)"

  # -- consume everything back (page cache), then the floor the other way
  say "consume $RECORDS from $T"
  reset_peak; profile_start "consume-p$P"; c0=$(cpu_ticks)
  # shellcheck disable=SC2046
  timed "$RUN/consume-p$P.out" "$PERF" -C -t "$T" $(partition_args "$P") -o beginning -c "$RECORDS" -q -b "$ADDR" || true
  c1=$(cpu_ticks); peak=$(peak_mb); profile_stop "consume-p$P"
  summary=$(grep 'consumed in' "$RUN/consume-p$P.out" | tail -1)
  got=$(sed -n 's/^% \([0-9]*\) messages.*/\1/p' <<<"$summary")
  if [ "${got:-0}" -lt "$RECORDS" ]; then
    say "consume from $T FAILED: ${summary:-no summary}"; tail -5 "$RUN/consume-p$P.out" >&2; FAILED=1
  else
    read -r frps fmbps fcpu < <(floor_out "$RECORDS")
    row "consume p$P" "$RECORDS" "$(sed -n 's/.*ms: \([0-9]*\) msgs\/s.*/\1/p' <<<"$summary")" \
      "$(sed -n 's/.*msgs\/s (\([0-9.]*\) MB\/s).*/\1/p' <<<"$summary")" - - \
      "$(per_record_us $((c1 - c0)) "$RECORDS")" "$peak" "$(client_cpu "$RUN/consume-p$P.out")" "$frps" "$fmbps" "$fcpu"
  fi
  rm -f "$RUN/floor.bin"

  # -- the broker-bound pair: the wire client, then the floor, in each direction
  say "wire produce $RECORDS x $RECORD_BYTES B to $T-wire"
  fresh_cache; reset_peak; profile_start "wire-produce-p$P"; c0=$(cpu_ticks)
  timed "$RUN/wire-produce-p$P.out" "$WIRE" produce "$ADDR" "$T-wire" "$P" "$RECORDS" "$RECORD_BYTES" "$BATCH_BYTES" || true
  c1=$(cpu_ticks); peak=$(peak_mb); profile_stop "wire-produce-p$P"
  n=$(wire_field "$RUN/wire-produce-p$P.out" records)
  if [ -z "$n" ]; then
    say "wire produce to $T-wire FAILED"; tail -5 "$RUN/wire-produce-p$P.out" >&2; FAILED=1
  else
    bytes=$(log_bytes "$T-wire")
    read -r frps fmbps fcpu < <(floor_in "$bytes" "$n")
    row "wire produce p$P" "$n" "$(wire_field "$RUN/wire-produce-p$P.out" records/s)" \
      "$(wire_field "$RUN/wire-produce-p$P.out" MB/s)" - - "$(per_record_us $((c1 - c0)) "$n")" "$peak" \
      "$(client_cpu "$RUN/wire-produce-p$P.out")" "$frps" "$fmbps" "$fcpu"
    say "wire fetch $n from $T-wire"
    reset_peak; profile_start "wire-fetch-p$P"; c0=$(cpu_ticks)
    timed "$RUN/wire-fetch-p$P.out" "$WIRE" fetch "$ADDR" "$T-wire" "$P" "$n" "$RECORD_BYTES" || true
    c1=$(cpu_ticks); peak=$(peak_mb); profile_stop "wire-fetch-p$P"
    got=$(wire_field "$RUN/wire-fetch-p$P.out" records)
    if [ "${got:-0}" -lt "$n" ]; then
      say "wire fetch from $T-wire FAILED"; tail -5 "$RUN/wire-fetch-p$P.out" >&2; FAILED=1
    else
      read -r frps fmbps fcpu < <(floor_out "$n")
      row "wire fetch p$P" "$got" "$(wire_field "$RUN/wire-fetch-p$P.out" records/s)" \
        "$(wire_field "$RUN/wire-fetch-p$P.out" MB/s)" - - "$(per_record_us $((c1 - c0)) "$got")" "$peak" \
        "$(client_cpu "$RUN/wire-fetch-p$P.out")" "$frps" "$fmbps" "$fcpu"
    fi
    rm -f "$RUN/floor.bin"
  fi

  # -- latency: per-message (-l costs the client a timestamp, a copy and a line of output
  #    per record, so the full-speed latency run is slower than the produce run above)
  if [ "$LAT_RECORDS" != 0 ]; then
    for kind in full paced; do
      if [ "$kind" = full ]; then RATE=(); topic=$T-lat; label="latency p$P full"
      else [ "$PACED_RATE" != 0 ] || continue; RATE=(-r "$PACED_RATE"); topic=$T-paced; label="latency p$P @$PACED_RATE/s"; fi
      say "$label: $LAT_RECORDS records to $topic"
      fresh_cache; reset_peak; c0=$(cpu_ticks)
      timed "$RUN/lat-$kind-p$P.out" "$PERF" -P -t "$topic" "${PROD_PART[@]}" -c "$LAT_RECORDS" "${RATE[@]}" -q \
        -l -A "$RUN/lat-$kind-p$P.txt" "${COMMON[@]}" || true
      c1=$(cpu_ticks); peak=$(peak_mb)
      summary=$(prod_summary "$RUN/lat-$kind-p$P.out")
      if ! prod_ok "$summary" "$LAT_RECORDS"; then
        say "$label FAILED: ${summary:-no summary}"; FAILED=1; continue
      fi
      read -r p50 p99 < <(percentiles "$RUN/lat-$kind-p$P.txt")
      rm -f "$RUN/lat-$kind-p$P.txt"
      row "$label" "$LAT_RECORDS" "$(prod_rate "$summary")" "$(prod_mbps "$summary")" "$p50" "$p99" \
        "$(per_record_us $((c1 - c0)) "$LAT_RECORDS")" "$peak" "$(client_cpu "$RUN/lat-$kind-p$P.out")" - - -
    done
  fi
done

# ---------------------------------------------------------------------------- report
echo
echo "weir end-to-end on loopback: ${RECORD_BYTES}-byte records, acks=1, linger.ms=$LINGER_MS, batch.size=$BATCH_BYTES, no compression"
echo "weir $REV${BROKER_ENV:+ (broker env: $BROKER_ENV)}; $(nproc) CPUs, $(uname -r); client: rdkafka_performance (librdkafka $LRK_VERSION); floor: benches/floor.rs; page cache dropped before produce phases: $DROPPED"
echo
H='| %-22s | %8s | %10s | %7s | %7s | %7s | %10s | %7s | %8s | %11s | %10s | %12s | %10s | %14s |\n'
# (hand-aligned: printf pads bytes, and "µ" is two)
echo '| phase                  |  records |  records/s |    MB/s |  p50 ms |  p99 ms | µs CPU/rec | peak MB | client s | floor rec/s | floor MB/s | floor µs/rec | rate/floor | CPU floor/weir |'
echo '|------------------------|---------:|-----------:|--------:|--------:|--------:|-----------:|--------:|---------:|------------:|-----------:|-------------:|-----------:|---------------:|'
for r in "${ROWS[@]}"; do
  IFS='|' read -r ph n rps mb p50 p99 cpu pk cc frps fmb fcpu <<<"$r"
  ratio=$(awk -v a="$rps" -v b="$frps" 'BEGIN { if (b+0 > 0 && a+0 > 0) printf "%.0f%%", 100*a/b; else print "-" }')
  cratio=$(awk -v a="$fcpu" -v b="$cpu" 'BEGIN { if (b+0 > 0 && a+0 > 0) printf "%.0f%%", 100*a/b; else print "-" }')
  # shellcheck disable=SC2059
  printf "$H" "$ph" "$n" "$rps" "$mb" "$p50" "$p99" "$cpu" "$pk" "$cc" "$frps" "$fmb" "$fcpu" "$ratio" "$cratio"
done
cat <<EOF

produce/consume rows: rdkafka_performance; records/s and MB/s (payload, 10^6 B) are its own
  figures (produce: first send to last delivery report; consume: first to last message).
wire rows: benches/wire.rs, pre-encoded ~1 MB Produce requests (5 in flight) / Fetch requests
  (one at a time, 1 MiB per partition), from connect to the last answer: the broker-bound figures.
p50/p99: per-message produce latency, produce() call to delivery report (rdkafka_performance -l);
  "full" produces as fast as the client can (client-side queueing included), "@N/s" is paced.
µs CPU/rec: broker user+sys over the phase / records.   peak MB: broker VmHWM during the phase.
client s: the client's user+sys for the phase (it shares the machine's $(nproc) CPUs with the broker).
floor: the bytes weir stored for the topic, socket -> file (produce rows) and file -> socket
  (consume rows), by benches/floor.rs, right after the weir phase; floor µs/rec: its server's CPU.
rate/floor: weir records/s / floor records/s.  CPU floor/weir: floor CPU per record / weir's.
targets (DESIGN.md, an in-memory peer): produce >= 2.46 M rec/s at <= 0.13 µs CPU/rec,
  consume >= 3.15 M rec/s, and >= 70% of the floor.
EOF
if [ -n "$PROFILE" ] && [ -f "$RUN/profile.txt" ]; then echo; cat "$RUN/profile.txt"; fi
exit "$FAILED"
