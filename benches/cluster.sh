#!/usr/bin/env bash
# benches/cluster.sh — issues 12 and 13's cluster benchmark (benches/cluster.rs) against the
# release `weir`, with what a results note needs printed around it.
#
# Builds the bench program (`cargo build --release --bench cluster`) and then the release
# broker (`cargo build --release --bin weir`, in that order: building a bench target
# rebuilds target/release/weir with the dev-dependencies' features, the second build puts
# the plain release binary back), copies the broker into a temp dir (the target dir may be
# rebuilt by someone else during the run) and runs the bench with it, printing the commit,
# the machine, and the load (`uptime`) before and after.
#
# Usage: benches/cluster.sh [--only metadata|failover|replication|partition-failover[,...]]
#                           [--topics N] [--partitions N] [--batch N] [--runs N]
#                           [--records N] [--rounds N] [--produce-partitions N]
#                           [--latency-secs N]
# Environment (defaults):
#   CARGO_TARGET_DIR=/var/tmp/weir-target
#   SKIP_BUILD=1       use the binaries already built (needs an earlier run's build)
#   WEIR_BIN=PATH      the broker to measure instead of the one built here
#   WEIR_BIN_BASE=PATH a baseline broker: partition failover runs with it too (A/B)
#   RDKAFKA_PERF=CMD   rdkafka_performance (default: ../shared/tools/rdkafka-perf.sh
#                      next to the clone when it exists, else rdkafka_performance)
#   WEIR_BENCH_DIR=/var/tmp  where the run's temp dirs go; KEEP=1 keeps the node logs
#   RUN_TIMEOUT=2400   seconds the bench may run before it is stopped
# Only 127.0.0.1 traffic; every node is stopped when the bench ends (it kills them on
# exit or panic, and each node dies with its parent through WEIR_PARENT_PID).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/weir-target}
RUN_TIMEOUT=${RUN_TIMEOUT:-2400}
LINK=$CARGO_TARGET_DIR/release/weir-bench-cluster

say() { printf '== %s\n' "$*" >&2; }
die() { printf 'cluster bench: %s\n' "$*" >&2; exit 1; }

if [ -z "${SKIP_BUILD:-}" ]; then
  say "building benches/cluster.rs (release) into $CARGO_TARGET_DIR"
  built=$(cd "$ROOT" && timeout 3600 cargo build --release --locked --bench cluster --message-format=json 2>/dev/null |
    grep -o '"executable":"[^"]*"' | sed 's/.*:"//; s/"$//' | grep '/cluster-[^/]*$' | tail -1) || true
  [ -n "$built" ] && [ -x "$built" ] || die "could not build benches/cluster.rs (cargo build --release --bench cluster)"
  ln -sf "$built" "$LINK"
  if [ -z "${WEIR_BIN:-}" ]; then
    say "building weir (release)"
    (cd "$ROOT" && timeout 3600 cargo build --release --locked --bin weir) || die "cargo build failed"
  fi
fi
[ -x "$LINK" ] || die "no $LINK (run without SKIP_BUILD)"
BIN=${WEIR_BIN:-$CARGO_TARGET_DIR/release/weir}
[ -x "$BIN" ] || die "no broker binary $BIN"

mkdir -p "${WEIR_BENCH_DIR:-/var/tmp}"
SNAP=$(mktemp -d "${WEIR_BENCH_DIR:-/var/tmp}/weir-cluster-bin.XXXXXX")
trap 'rm -rf "$SNAP"' EXIT
cp "$BIN" "$SNAP/weir"
cp "$(readlink -f "$LINK")" "$SNAP/bench"
if [ -n "${WEIR_BIN_BASE:-}" ]; then
  [ -x "$WEIR_BIN_BASE" ] || die "no baseline broker binary $WEIR_BIN_BASE"
  cp "$WEIR_BIN_BASE" "$SNAP/weir-base"
  export WEIR_BIN_BASE=$SNAP/weir-base
  echo "baseline broker: $WEIR_BIN_BASE (sha256 $(sha256sum "$SNAP/weir-base" | cut -c1-12))"
fi
if [ -z "${RDKAFKA_PERF:-}" ] && [ -x "$ROOT/../shared/tools/rdkafka-perf.sh" ]; then
  export RDKAFKA_PERF=$ROOT/../shared/tools/rdkafka-perf.sh
fi

rev=$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(cd "$ROOT" && git status --porcelain --untracked-files=no 2>/dev/null | head -1)
echo "commit: $rev${dirty:+ (with uncommitted changes)}; broker $BIN (sha256 $(sha256sum "$SNAP/weir" | cut -c1-12))"
echo "machine: $(nproc) CPUs, $(uname -r), $(awk '/MemTotal/ {printf "%.0f GB", $2/1048576}' /proc/meminfo)"
echo "start: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); uptime:$(uptime | sed 's/.*load/ load/')"
if pgrep -x rustc >/dev/null 2>&1; then echo "note: rustc processes were running at the start"; fi
echo "command: benches/cluster.sh $*"
echo
rc=0
WEIR_BIN=$SNAP/weir timeout -s TERM "$RUN_TIMEOUT" "$SNAP/bench" "$@" || rc=$?
echo "end: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); uptime:$(uptime | sed 's/.*load/ load/')"
exit "$rc"
