#!/usr/bin/env bash
# benches/instructions.sh — the broker's user-space instructions per record, before/after.
#
# CPU time on a small shared machine moves by more than the 5% a change is judged by
# (benches/RESULTS.md: the same program on both sides of an A/B differed by up to 1.7x),
# and on the broker-bound produce ~90% of the broker's CPU is the kernel copying records
# into the page cache, whose cost depends on the page cache's state, not on weir. This
# script counts what weir's own code does, which does not depend on the machine's load:
# each broker runs under valgrind's callgrind with instrumentation off; after a warm-up,
# instrumentation is switched on for exactly one load phase of benches/wire.rs (the
# near-free Kafka-wire client) and the instructions retired in the broker's user space
# (weir, std, libc) are divided by the records of the phase:
#
#   produce pN   wire produce of RECORDS records to a topic of N partitions (acks=1, ~1 MB
#                Produce v8 requests, one batch per partition), after a 50,000-record
#                warm-up;
#   fetch p8     wire fetch of the same records back from offset 0 (page cache).
#
# Same client, same requests, same records on both sides: the figure repeats to within a
# few instructions from run to run. It does not count the kernel (syscalls, page cache),
# nor cache misses or branch mispredictions: it complements benches/run.sh (which does),
# it does not replace it.
#
# Usage: WEIR_BIN_BEFORE=/path/to/old/weir WEIR_BIN=/path/to/new/weir benches/instructions.sh
# Environment (defaults):
#   RECORDS=300000        records per measured phase (callgrind runs weir ~50x slower)
#   RECORD_BYTES=100
#   CARGO_TARGET_DIR=/var/tmp/weir-target  where benches/wire.rs is built (release)
#   SKIP_BUILD=1          use $CARGO_TARGET_DIR/release/weir-bench-wire as it is
# Needs valgrind (installed with apt-get when missing and root). Only 127.0.0.1 traffic;
# the brokers are stopped on exit, whatever happens.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/weir-target}
RECORDS=${RECORDS:-300000}
RECORD_BYTES=${RECORD_BYTES:-100}
WIRE_LINK=$CARGO_TARGET_DIR/release/weir-bench-wire

say() { printf '== %s\n' "$*" >&2; }
die() { printf 'instructions: %s\n' "$*" >&2; exit 1; }

[ -n "${WEIR_BIN_BEFORE:-}" ] && [ -x "$WEIR_BIN_BEFORE" ] || die "WEIR_BIN_BEFORE must be a weir binary"
[ -n "${WEIR_BIN:-}" ] && [ -x "$WEIR_BIN" ] || die "WEIR_BIN must be a weir binary"
if ! command -v valgrind >/dev/null; then
  [ "$(id -u)" = 0 ] || die "valgrind is missing (apt-get install valgrind)"
  say "installing valgrind"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q valgrind >/dev/null || die "apt-get install valgrind failed"
fi
if [ -z "${SKIP_BUILD:-}" ]; then
  say "building benches/wire.rs (release)"
  wire_exe=$(cd "$ROOT" && timeout 1200 cargo build --release --bench wire --message-format=json 2>/dev/null |
    grep -o '"executable":"[^"]*/wire-[^"]*"' | sed 's/.*:"//; s/"$//' | tail -1) || true
  [ -n "$wire_exe" ] && [ -x "$wire_exe" ] || die "could not build benches/wire.rs"
  ln -sf "$wire_exe" "$WIRE_LINK"
fi
[ -x "$WIRE_LINK" ] || die "no $WIRE_LINK (run without SKIP_BUILD)"

RUN=$(mktemp -d "${WEIR_BENCH_DIR:-/var/tmp}/weir-instructions.XXXXXX")
BPID=
cleanup() {
  [ -z "$BPID" ] || { kill "$BPID" 2>/dev/null; wait "$BPID" 2>/dev/null; } || true
  rm -rf "$RUN"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# measure BIN PHASE PARTITIONS: prints the broker's user-space instructions per record.
measure() {
  local bin=$1 phase=$2 partitions=$3 dir port total n f t
  dir=$(mktemp -d "$RUN/side.XXXXXX")
  port=$(free_port)
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$dir/cg.%p" \
    "$bin" serve --override "listeners=PLAINTEXT://127.0.0.1:$port" \
    --override admin.listeners=http://127.0.0.1:0 --override "log.dirs=$dir/data" \
    >"$dir/stdout" 2>"$dir/stderr" &
  BPID=$!
  for _ in $(seq 1 600); do grep -q '^weir listening on ' "$dir/stdout" && break; sleep 0.2; done
  grep -q '^weir listening on ' "$dir/stdout" || { tail "$dir/stderr" >&2; die "$bin did not start"; }
  "$bin" topic create -b "127.0.0.1:$port" -p "$partitions" t >/dev/null
  timeout 600 "$WIRE_LINK" produce "127.0.0.1:$port" t "$partitions" 50000 "$RECORD_BYTES" >/dev/null
  if [ "$phase" = fetch ]; then
    timeout 600 "$WIRE_LINK" produce "127.0.0.1:$port" t "$partitions" "$RECORDS" "$RECORD_BYTES" >/dev/null
  fi
  callgrind_control -i on "$BPID" >/dev/null 2>&1
  if [ "$phase" = fetch ]; then
    timeout 600 "$WIRE_LINK" fetch "127.0.0.1:$port" t "$partitions" "$RECORDS" "$RECORD_BYTES" >"$dir/wire.out"
  else
    timeout 600 "$WIRE_LINK" produce "127.0.0.1:$port" t "$partitions" "$RECORDS" "$RECORD_BYTES" >"$dir/wire.out"
  fi
  callgrind_control -i off "$BPID" >/dev/null 2>&1
  kill "$BPID"; wait "$BPID" 2>/dev/null || true
  BPID=
  total=0
  for f in "$dir"/cg.*; do
    t=$(callgrind_annotate "$f" 2>/dev/null | grep -m1 'PROGRAM TOTALS' | awk '{gsub(",","",$1); print $1}')
    case "$t" in '' | *[!0-9]*) t=0 ;; esac
    total=$((total + t))
  done
  n=$(sed -n 's/.*records=\([0-9]*\).*/\1/p' "$dir/wire.out")
  [ -n "$n" ] && [ "$n" -gt 0 ] && [ "$total" -gt 0 ] || die "no count for $phase p$partitions ($bin)"
  awk -v t="$total" -v n="$n" 'BEGIN { printf "%.1f\n", t / n }'
}

printf '%-12s %14s %14s %8s\n' phase "before Ir/rec" "after Ir/rec" ratio
for spec in produce:1 produce:8 fetch:8; do
  phase=${spec%:*}; partitions=${spec#*:}
  before=$(measure "$WEIR_BIN_BEFORE" "$phase" "$partitions")
  after=$(measure "$WEIR_BIN" "$phase" "$partitions")
  printf '%-12s %14s %14s %8s\n' "$phase p$partitions" "$before" "$after" \
    "$(awk -v a="$after" -v b="$before" 'BEGIN { printf "%.3f", a / b }')"
done
