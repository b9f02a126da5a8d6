#!/usr/bin/env bash
# tests/compat/librdkafka.sh BOOTSTRAP [TESTS]
#
# Runs librdkafka's own integration tests against a running broker at BOOTSTRAP.
#
# The broker must look like the suite's "default" scenario (tests/scenarios/default.json):
# topics auto-created on Metadata/Produce, with 4 partitions. For weir:
#     weir serve --override listeners=PLAINTEXT://127.0.0.1:PORT --override num.partitions=4 \
#                --override group.initial.rebalance.delay.ms=500 ...   (README.md says why)
# With kcat on PATH the script checks this first: it stops if nothing answers at BOOTSTRAP
# and warns if an auto-created probe topic does not get 4 partitions.
#
#   TESTS   (default) the tests in tests/compat/librdkafka-allowlist.txt
#           0001,0012,...   those test numbers
#           all             every broker test: all numbers except manual ones (8xxx); tests
#                           that need no broker (TEST_F_LOCAL: unit tests, the mock cluster)
#                           and sockem tests are skipped by the runner (-L -E)
#   Tests run in quick mode (-Q) unless LRK_QUICK=0. Quick mode skips the subtests not
#   marked quick without a word, so a test can pass having done nothing; such passes are
#   marked "(vacuous: ...)" and do not belong on the allow-list. A test whose subtests are
#   all non-quick (0018, 0045, 0102, ...) is marked `full` in the allow-list instead: its
#   number then always runs in full mode (without -Q), whatever TESTS selects. A test
#   number can stand for several tests (0045 is six); each of them that runs is reported.
#
# Output on stdout, one line per test, then a total:
#     PASSED 0001_multiobj
#     PASSED 0019_list_groups (vacuous: did nothing in 0 ms; quick mode skipped its subtests?)
#     FAILED 0030_offset_commit <first failure message> (<where>)
#     SKIPPED 0054_offset_time <why>     (only when the runner says why; not counted)
#     N passed, M failed
# Exit: 1 if a test failed that is on the allow-list (or, with an explicit list of numbers,
# any of them); an allow-listed test that did not run counts as failed. 0 otherwise.
# 2 for usage or build errors. Each test's full log is kept in $LRK_LOG_DIR/<number>.log.
#
# The suite comes from the sources of the rdkafka-sys crate (the librdkafka the `rdkafka`
# dependency builds), so the C library under test is the one weir's own Rust tests link.
# First use copies them from ~/.cargo/registry (running `cargo fetch` of that crate if they
# are absent) and builds librdkafka plus its test-runner into $LRK_CACHE (3-5 minutes on
# 2 cores, under `nice`); later runs reuse the build.
#
# Why one test-runner process per test number: when a test times out, test-runner stops it
# with pthread_kill(SIGKILL), which kills the whole process; a single hang would end a
# whole-suite run.
#
# Environment (defaults in brackets):
#   LRK_VERSION          [4.10.0+2.12.1]   rdkafka-sys crate version (the one in Cargo.lock)
#   LRK_CACHE            [/var/tmp/weir-librdkafka]  build cache
#   LRK_LOG_DIR          [$LRK_CACHE/logs]  per-test logs, emptied at the start of each run
#   LRK_PARALLEL         [1]               test numbers run at the same time
#   LRK_TIMEOUT_MULT     [2]               test.timeout.multiplier (per-test timeouts)
#   LRK_TEST_TIMEOUT_S   [600]             hard limit for one test number's process
#   LRK_BROKER_VERSION   [3.9.0]           Kafka version weir claims to be; tests that need
#                                          a newer broker skip themselves
#   LRK_BUILD_TIMEOUT_S  [3600]            limit for fetching and building the suite
#   LRK_QUICK            [1]               0: full mode, without -Q (slower, more subtests)
#   LRK_ALLOWLIST        [tests/compat/librdkafka-allowlist.txt]  the allow-list to use
#   TEST_SCENARIO        [default]         the suite's scenario (noautocreate: a broker
#                                          with auto.create.topics.enable=false)
#   LRK_WEIR_BIN         [$CARGO_TARGET_DIR/debug/weir, CARGO_TARGET_DIR defaulting to
#                         /var/tmp/weir-target]  weir binary behind kafka-shim/bin/kafka-topics.sh:
#                                          tests that run Kafka's kafka-topics.sh (KAFKA_PATH)
#                                          get this shim; without the binary they fail as
#                                          before ("KAFKA_PATH ... must be set")
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ALLOWLIST="${LRK_ALLOWLIST:-$here/librdkafka-allowlist.txt}"
VER="${LRK_VERSION:-4.10.0+2.12.1}"
CACHE="${LRK_CACHE:-/var/tmp/weir-librdkafka}"
LOG_DIR="${LRK_LOG_DIR:-$CACHE/logs}"
PARALLEL="${LRK_PARALLEL:-1}"
TIMEOUT_MULT="${LRK_TIMEOUT_MULT:-2}"
TEST_TIMEOUT_S="${LRK_TEST_TIMEOUT_S:-600}"
BROKER_VERSION="${LRK_BROKER_VERSION:-3.9.0}"
BUILD_TIMEOUT_S="${LRK_BUILD_TIMEOUT_S:-3600}"
WEIR_BIN="${LRK_WEIR_BIN:-${CARGO_TARGET_DIR:-/var/tmp/weir-target}/debug/weir}"
QUICK_FLAG=-Q
[ "${LRK_QUICK:-1}" = 0 ] && QUICK_FLAG=
SRC="$CACHE/librdkafka-$VER"
# The suffix names what the build needs beyond the sources (RapidJSON, for the tests that
# read statistics): a build made without it is made again.
STAMP="$SRC/.weir-built-rapidjson"

die() { echo "librdkafka.sh: $*" >&2; exit 2; }

[ $# -ge 1 ] && [ $# -le 2 ] || die "usage: $0 BOOTSTRAP [all|NNNN,NNNN,...]   (default: the allow-list)"
BOOT="$1"
SELECT="${2:-}"
[[ "$PARALLEL" =~ ^[1-9][0-9]*$ ]] || die "LRK_PARALLEL must be a positive integer"
[[ "$TEST_TIMEOUT_S" =~ ^[1-9][0-9]*$ ]] || die "LRK_TEST_TIMEOUT_S must be a positive integer"

# ------------------------------------------------------------------ allow-list
# One entry per line: a test number (all tests of that number) or a full test name, then
# optionally the word `full` (run that number without -Q), then an optional "# what it
# covers".
allowed=()
full_numbers=" "  # numbers marked `full`, space-separated
if [ -f "$ALLOWLIST" ]; then
    while IFS= read -r line; do
        read -r entry mode extra <<<"${line%%#*}" || true
        [ -z "${entry:-}" ] && continue
        [[ "$entry" =~ ^[0-9]{4}(_[A-Za-z0-9_]+)?$ ]] && [ -z "${extra:-}" ] \
            && [[ "${mode:-}" =~ ^(full)?$ ]] || die "$ALLOWLIST: bad entry '$line'"
        allowed+=("$entry")
        [ "${mode:-}" = full ] && full_numbers+="${entry:0:4} "
    done <"$ALLOWLIST"
fi

# ------------------------------------------------------------------ build (once)
find_crate_sources() {
    # prints nothing (and succeeds) when the sources are not there
    { ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/rdkafka-sys-"$VER"/librdkafka 2>/dev/null || true; } | head -n1
}

build_suite() {
    local crate tmp
    crate="$(find_crate_sources)"
    if [ -z "$crate" ]; then
        # Not fetched yet: fetch just this crate through a throw-away package.
        tmp="$(mktemp -d)"
        mkdir -p "$tmp/src"
        echo 'fn main() {}' >"$tmp/src/main.rs"
        printf '[package]\nname = "weir-lrk-fetch"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\nrdkafka-sys = "=%s"\n' \
            "$VER" >"$tmp/Cargo.toml"
        (cd "$tmp" && timeout "$BUILD_TIMEOUT_S" cargo fetch -q) >"$CACHE/fetch.log" 2>&1 \
            || { tail -n 20 "$CACHE/fetch.log" >&2; rm -rf "$tmp"; die "cargo fetch of rdkafka-sys $VER failed"; }
        rm -rf "$tmp"
        crate="$(find_crate_sources)"
        [ -n "$crate" ] || die "rdkafka-sys $VER sources not found after cargo fetch"
    fi
    rm -rf "$SRC"
    cp -r "$crate" "$SRC"
    chmod +x "$SRC/configure"
    echo "librdkafka.sh: building librdkafka $VER and its test suite in $SRC (log: $CACHE/build.log)" >&2
    # nice: the machine is usually busy with a cargo build as well
    if ! (cd "$SRC" && timeout "$BUILD_TIMEOUT_S" nice -n 10 bash -c \
            "./configure && make -j$(nproc) libs && make -C tests -j$(nproc) build") \
            >"$CACHE/build.log" 2>&1; then
        tail -n 30 "$CACHE/build.log" >&2
        die "build failed; see $CACHE/build.log"
    fi
    [ -x "$SRC/tests/test-runner" ] || die "build finished without tests/test-runner"
    date -u +%FT%TZ >"$STAMP"
}

if [ ! -f "$STAMP" ]; then
    mkdir -p "$CACHE"
    # one builder at a time; whoever waited finds the stamp and goes on
    exec 9>"$CACHE/.build.lock"
    flock -w "$BUILD_TIMEOUT_S" 9 || die "timed out waiting for another build ($CACHE/.build.lock)"
    [ -f "$STAMP" ] || build_suite
    exec 9>&-
fi
RUNNER_DIR="$SRC/tests"

# ------------------------------------------------------------------ what to run
numbers=()
explicit_list=0  # 1: every requested test must pass (explicit list)
case "$SELECT" in
    "")
        for e in "${allowed[@]}"; do numbers+=("${e:0:4}"); done
        ;;
    all)
        # The names of all tests, from the runner itself: a run that matches nothing
        # reports every test as skipped.
        list_report="$(mktemp)"
        (cd "$RUNNER_DIR" && TESTS=none TEST_REPORT="$list_report" LD_LIBRARY_PATH=../src:../src-cpp \
            timeout 60 ./test-runner -S >/dev/null 2>&1) || true
        mapfile -t numbers < <(grep -o '"name": "[0-9]\{4\}_' "$list_report" | grep -o '[0-9]\{4\}' | grep -v '^8' )
        rm -f "$list_report"
        [ "${#numbers[@]}" -gt 0 ] || die "could not list the tests of $RUNNER_DIR/test-runner"
        ;;
    *)
        IFS=, read -r -a numbers <<<"$SELECT"
        for num in "${numbers[@]}"; do
            [[ "$num" =~ ^[0-9]{4}$ ]] || die "bad test number '$num' (want NNNN,NNNN,... or all)"
        done
        explicit_list=1
        ;;
esac
mapfile -t numbers < <(printf '%s\n' "${numbers[@]}" | awk 'NF && !seen[$0]++')

# ------------------------------------------------------------------ preflight
if command -v kcat >/dev/null; then
    timeout 15 kcat -b "$BOOT" -L -m 10 >/dev/null 2>&1 || die "no broker answers Metadata at $BOOT"
    probe="weir-lrk-probe-$$-$RANDOM"
    echo probe | timeout 15 kcat -P -b "$BOOT" -t "$probe" -m 10 >/dev/null 2>&1 || true
    parts="$(timeout 15 kcat -b "$BOOT" -L -t "$probe" -m 10 2>/dev/null | grep -c '^ *partition ' || true)"
    if [ "$parts" != 4 ]; then
        echo "librdkafka.sh: warning: $BOOT auto-created $probe with ${parts:-0} partitions;" \
            "the suite assumes 4 (weir: --override num.partitions=4)" >&2
    fi
fi

# ------------------------------------------------------------------ run
# The log dir is emptied first; refuse to empty a folder given in LRK_LOG_DIR that this
# script did not make.
if [ -n "${LRK_LOG_DIR:-}" ] && [ -d "$LOG_DIR" ] && [ ! -f "$LOG_DIR/.librdkafka-sh" ] \
        && [ -n "$(ls -A "$LOG_DIR")" ]; then
    die "LRK_LOG_DIR=$LOG_DIR is not empty and not one of ours; pick another"
fi
rm -rf "$LOG_DIR"
mkdir -p "$LOG_DIR"
touch "$LOG_DIR/.librdkafka-sh"
printf 'bootstrap.servers=%s\ntest.timeout.multiplier=%s\n' "$BOOT" "$TIMEOUT_MULT" >"$LOG_DIR/test.conf"

# Turns one number's report + log into result lines: "<STATE> <name> <reason>".
# The report's JSON is not escaped by the runner, so it is read with a pattern, not json.
cat >"$LOG_DIR/results.py" <<'PY'
import re, sys
num, report, log, rc, explicit = sys.argv[1:6]
ansi = re.compile(r"\x1b\[[0-9;]*m")
try:
    text = open(report, errors="replace").read()
except OSError:
    text = ""
try:
    lines = [ansi.sub("", l).rstrip("\r\n") for l in open(log, errors="replace")]
except OSError:
    lines = []

def failure(name):
    head = re.compile(r'### Test "%s(?: \(.*?\))?" failed at (\S+) ' % re.escape(name))
    for k, l in enumerate(lines):
        m = head.search(l)
        if m:
            msg = next((x.strip() for x in lines[k + 1:k + 4] if x.strip()), "")
            return f"{' '.join(msg.split())[:200]} ({m.group(1)})"
    return "no failure message in the log"

def skip_reason(name):
    # "[name  /  0.0s] WARN: SKIPPING TEST: why", or the summary row "| name | SKIPPED | 0.0s | why"
    pats = [re.compile(r"\[%s\s*/[^\]]*\]\s*(?:WARN:\s*)?SKIPPING TEST: (.*)" % re.escape(name)),
            re.compile(r"^\|\s*%s\s*\|\s*SKIPPED\s*\|[^|]*\|\s*(\S.*)" % re.escape(name))]
    for pat in pats:
        for l in lines:
            m = pat.search(l)
            if m:
                return " ".join(m.group(1).split())[:200]
    return None

found = printed = 0
entry = re.compile(r'"name": "(%s_[^"]*)", "state": "([A-Z_ ]+)".*?"duration": ([0-9.]+)' % num)
for name, state, duration_s in entry.findall(text):
    found += 1
    if state == "PASSED":
        printed += 1
        # Quick mode (-Q) skips non-quick subtests without a word; a test whose subtests were
        # all skipped passes at once having created no client. Say so: it proves nothing.
        # (C++ tests do not log "Created kafka instance", hence the duration as well.)
        made_client = re.compile(r"\[%s\s*/[^\]]*\].*Created\s+kafka instance" % re.escape(name))
        if float(duration_s) < 0.005 and not any(made_client.search(l) for l in lines):
            print(f"PASSED {name} (vacuous: did nothing in {float(duration_s) * 1000:.0f} ms; quick mode skipped its subtests?)")
        else:
            print(f"PASSED {name}")
    elif state in ("FAILED", "RUNNING"):
        printed += 1
        print(f"FAILED {name} {failure(name)}")
    elif state == "SKIPPED":
        why = skip_reason(name)
        # tests filtered by flags (local/sockem/manual) or scenario are not this run's business
        if why and "test flags" not in why and "scenario" not in why:
            printed += 1
            print(f"SKIPPED {name} {why}")
    # NOT_STARTED: nothing ran; an allow-listed one is caught as "did not run"
if not found and '"tests":' in text:
    print(f"FAILED {num} no test with this number in this build of the suite")
elif not found:
    print(f"FAILED {num} no test report (test-runner exit status {rc}; killed after a hang or crash?)")
elif not printed and explicit == "1":
    print(f"SKIPPED {num} no broker test with this number ran (local, sockem, manual or another scenario)")
PY

# Kafka's command-line tools, as far as the suite needs them (kafka-shim/bin), on weir's CLI.
shim_env=()
if [ -x "$WEIR_BIN" ]; then
    shim_env=(KAFKA_PATH="$here/kafka-shim" BROKERS="$BOOT" WEIR_BIN="$WEIR_BIN")
fi

run_one() { # number -> $LOG_DIR/<number>.results
    local num="$1" rc=0 quick="$QUICK_FLAG"
    [[ "$full_numbers" == *" $num "* ]] && quick=
    # the outer 2>/dev/null takes bash's own "Aborted" notice when the runner dies of a signal
    { (cd "$RUNNER_DIR" &&
        RDKAFKA_TEST_CONF="$LOG_DIR/test.conf" TEST_REPORT="$LOG_DIR/$num.json" TESTS="$num" \
        TEST_KAFKA_VERSION="$BROKER_VERSION" LD_LIBRARY_PATH=../src:../src-cpp \
        env "${shim_env[@]}" timeout -k 10 "$TEST_TIMEOUT_S" ./test-runner $quick -L -E) >"$LOG_DIR/$num.log" 2>&1; } 2>/dev/null \
        || rc=$?
    python3 "$LOG_DIR/results.py" "$num" "$LOG_DIR/$num.json" "$LOG_DIR/$num.log" "$rc" "$explicit_list" \
        >"$LOG_DIR/$num.results.tmp"
    mv "$LOG_DIR/$num.results.tmp" "$LOG_DIR/$num.results"
}

printed=()
print_done() { # print results of finished numbers, once each
    local num
    for num in "${numbers[@]}"; do
        [ -f "$LOG_DIR/$num.results" ] || continue
        [[ " ${printed[*]-} " == *" $num "* ]] && continue
        cat "$LOG_DIR/$num.results"
        printed+=("$num")
    done
}

running=0
for num in "${numbers[@]}"; do
    if [ "$running" -ge "$PARALLEL" ]; then
        wait -n || true
        running=$((running - 1))
        print_done
    fi
    run_one "$num" &
    running=$((running + 1))
done
wait || true
print_done

# ------------------------------------------------------------------ verdict
is_allowed() { # test-name
    local e
    for e in "${allowed[@]}"; do
        [ "$e" = "$1" ] || [ "$e" = "${1:0:4}" ] && return 0
    done
    return 1
}

passed=0 failed=0 bad=0
declare -A ran=()
while read -r state name rest; do
    [ -n "${state:-}" ] || continue
    case "$state" in
        PASSED)
            ran[$name]=1
            # an allow-listed test that tested nothing is a broken allow-list entry
            if [[ "$rest" == "(vacuous"* ]] && is_allowed "$name"; then
                echo "FAILED $name allow-listed but passed vacuously (no subtest ran)"
                failed=$((failed + 1)); bad=$((bad + 1))
            else
                passed=$((passed + 1))
            fi
            ;;
        FAILED)
            failed=$((failed + 1)); ran[$name]=1
            if [ "$explicit_list" = 1 ] || is_allowed "$name"; then bad=$((bad + 1)); fi
            ;;
    esac
done < <(for num in "${numbers[@]}"; do cat "$LOG_DIR/$num.results" 2>/dev/null || true; done)

# An allow-listed test that did not run at all (skipped, renamed, not in this build) would
# otherwise pass silently.
if [ "$SELECT" = "" ] || [ "$SELECT" = all ]; then
    for e in "${allowed[@]}"; do
        hit=0
        for name in "${!ran[@]}"; do
            if [ "$name" = "$e" ] || [ "${name:0:4}" = "$e" ]; then hit=1; break; fi
        done
        if [ "$hit" = 0 ]; then
            echo "FAILED $e allow-listed but did not run (see $LOG_DIR/${e:0:4}.log)"
            failed=$((failed + 1)); bad=$((bad + 1))
        fi
    done
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] || echo "librdkafka.sh: logs in $LOG_DIR" >&2
[ "$bad" -eq 0 ]
