#!/usr/bin/env bash
# tests/install-deps.sh — install what weir's client-compatibility tests need.
#
#   sudo tests/install-deps.sh            # Debian 12 (bookworm) with Rust already installed
#
# What it installs, and who needs it:
#   apt  kcat                                       tests/compat, kcat smoke checks
#        gcc g++ make pkg-config zlib1g-dev         the `rdkafka` dev-dependency builds its bundled
#        libssl-dev libzstd-dev liblz4-dev          librdkafka with ./configure + make; the same
#        libsasl2-dev libcurl4-openssl-dev          sources build librdkafka's test suite
#                                                   (tests/compat/librdkafka.sh). librdkafka 2.12
#                                                   includes <curl/curl.h> even without WITH_CURL.
#        python3, python3-pip, nodejs, npm          only when the command is missing (a node or
#                                                   python from elsewhere is kept as it is)
#   pip  confluent-kafka, kafka-python, aiokafka    tests/compat/roundtrip.py   (pinned below)
#   npm  kafkajs                                    tests/compat/roundtrip.js   (pinned below),
#        @platformatic/kafka                        tests/compat/kip848_member.mjs (pinned),
#                                                   into $WEIR_CLIENTS_DIR/node/node_modules
#   rustup target wasm32-wasip2                     the plugin guests in plugins/ (only when
#                                                   rustup exists and the target is missing)
#
# Idempotent and quiet: prints nothing and exits 0 when everything is already in place;
# `apt-get update` runs only when an apt package is missing. On failure: one line
# "install-deps: FAILED <what>" (plus the tail of the failing tool's log) on stderr, exit 1.
#
# Environment (defaults in brackets):
#   WEIR_CLIENTS_DIR [/var/tmp/weir-clients]   kafkajs goes to $WEIR_CLIENTS_DIR/node
#   PYTHON           [python3]                 interpreter the pip packages are installed for
#   INSTALL_DEPS_DRY_RUN=1                     print what would be installed, change nothing
#
# pip and PEP 668: Debian 12 marks its python "externally managed", so a plain `pip install`
# as root is refused. These are throw-away test machines (CI images, dev boxes), so we set
# PIP_BREAK_SYSTEM_PACKAGES=1 (older pips ignore it) rather than make the tests find a venv.
set -euo pipefail

# Pinned: the versions checked against weir. Bump deliberately, together with FINDINGS.md.
CONFLUENT_KAFKA_VERSION=2.16.1
KAFKA_PYTHON_VERSION=3.0.12
AIOKAFKA_VERSION=0.14.0
KAFKAJS_VERSION=2.2.4
# A second KIP-848 client, pure JavaScript (tests/compat/kip848_member.mjs). 1.35 is the
# last line that runs on Node 20 (2.x needs Node 22).
PLATFORMATIC_KAFKA_VERSION=1.35.0

WEIR_CLIENTS_DIR="${WEIR_CLIENTS_DIR:-/var/tmp/weir-clients}"
PYTHON="${PYTHON:-python3}"
DRY_RUN="${INSTALL_DEPS_DRY_RUN:-0}"
# Every network step is bounded; a hung mirror must not hang CI forever.
APT_TIMEOUT_S=900
PIP_TIMEOUT_S=600
NPM_TIMEOUT_S=600

LOG="$(mktemp /tmp/install-deps.XXXXXX)"
trap 'rm -f "$LOG"' EXIT

die() {
    echo "install-deps: FAILED $*" >&2
    if [ -s "$LOG" ]; then tail -n 25 "$LOG" | sed 's/^/  | /' >&2; fi
    exit 1
}

# run CMD... : quietly, output kept in $LOG for die(); in dry-run mode only say it.
run() {
    if [ "$DRY_RUN" = 1 ]; then
        echo "would run: $*"
        return 0
    fi
    "$@" >"$LOG" 2>&1
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo "$@"
    else
        die "need root for: $* (re-run as root)"
    fi
}

# ---------------------------------------------------------------- apt
# rapidjson-dev: librdkafka's test suite checks its statistics JSON with it; without it the
# runner skips the tests that read statistics (0101_fetch_from_follower among them).
# iproute2: `ip netns`, with which the replication fault loop cuts a broker off the network.
apt_wanted=(kcat gcc g++ make pkg-config zlib1g-dev libssl-dev libzstd-dev liblz4-dev
            libsasl2-dev libcurl4-openssl-dev rapidjson-dev iproute2)
apt_missing=()
for pkg in "${apt_wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' \
        || apt_missing+=("$pkg")
done
# Interpreters: judged by the command, not the package, so a pyenv python or a NodeSource
# node (which bundles npm and conflicts with Debian's npm package) is left alone.
command -v "$PYTHON" >/dev/null || apt_missing+=(python3)
if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then apt_missing+=(python3-pip); fi
command -v node >/dev/null || apt_missing+=(nodejs)
command -v npm >/dev/null || apt_missing+=(npm)

if [ "${#apt_missing[@]}" -gt 0 ]; then
    # env, not export: sudo would drop an exported variable
    run as_root env DEBIAN_FRONTEND=noninteractive timeout "$APT_TIMEOUT_S" \
        apt-get update -qq || die "apt-get update"
    run as_root env DEBIAN_FRONTEND=noninteractive timeout "$APT_TIMEOUT_S" \
        apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" \
        || die "apt-get install ${apt_missing[*]}"
fi

# ---------------------------------------------------------------- pip
pip_wanted=("confluent-kafka==$CONFLUENT_KAFKA_VERSION"
            "kafka-python==$KAFKA_PYTHON_VERSION"
            "aiokafka==$AIOKAFKA_VERSION")
pip_missing=()
if [ "$DRY_RUN" = 1 ] && ! command -v "$PYTHON" >/dev/null; then
    pip_missing=("${pip_wanted[@]}")
else
    # One interpreter start: print each spec whose installed version differs.
    mapfile -t pip_missing < <("$PYTHON" - "${pip_wanted[@]}" <<'PY'
import sys
from importlib import metadata
for spec in sys.argv[1:]:
    name, want = spec.split("==")
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        have = None
    if have != want:
        print(spec)
PY
    )
fi
if [ "${#pip_missing[@]}" -gt 0 ]; then
    PIP_BREAK_SYSTEM_PACKAGES=1 run timeout "$PIP_TIMEOUT_S" "$PYTHON" -m pip install -q \
        --disable-pip-version-check --no-input --root-user-action=ignore "${pip_missing[@]}" \
        || die "pip install ${pip_missing[*]}"
fi
if [ "$DRY_RUN" != 1 ]; then
    run "$PYTHON" -c 'import confluent_kafka, kafka, aiokafka' \
        || die "the python clients do not import with $PYTHON"
fi

# ---------------------------------------------------------------- npm
node_dir="$WEIR_CLIENTS_DIR/node"
kjs_pkg="$node_dir/node_modules/kafkajs/package.json"
# Read the installed version from package.json with sed: no node start, works before node exists.
have_kjs="$(sed -n 's/^[[:space:]]*"version":[[:space:]]*"\([^"]*\)".*/\1/p' "$kjs_pkg" 2>/dev/null | head -n1 || true)"
pk_pkg="$node_dir/node_modules/@platformatic/kafka/package.json"
have_pk="$(sed -n 's/^[[:space:]]*"version":[[:space:]]*"\([^"]*\)".*/\1/p' "$pk_pkg" 2>/dev/null | head -n1 || true)"
if [ "$have_kjs" != "$KAFKAJS_VERSION" ] || [ "$have_pk" != "$PLATFORMATIC_KAFKA_VERSION" ]; then
    run mkdir -p "$node_dir" || die "mkdir $node_dir"
    if [ "$DRY_RUN" != 1 ] && [ ! -f "$node_dir/package.json" ]; then
        # npm wants a package.json, else it walks up and installs into some parent folder
        printf '{ "name": "weir-compat-clients", "private": true }\n' >"$node_dir/package.json" \
            || die "write $node_dir/package.json"
    fi
    run timeout "$NPM_TIMEOUT_S" npm install --prefix "$node_dir" --no-audit --no-fund \
        --no-progress --loglevel=error --save-exact "kafkajs@$KAFKAJS_VERSION" \
        "@platformatic/kafka@$PLATFORMATIC_KAFKA_VERSION" \
        || die "npm install kafkajs@$KAFKAJS_VERSION @platformatic/kafka@$PLATFORMATIC_KAFKA_VERSION into $node_dir"
fi
if [ "$DRY_RUN" != 1 ]; then
    run node -e "require(process.argv[1])" "$node_dir/node_modules/kafkajs" \
        || die "kafkajs does not load from $node_dir"
    run node -e "import(require('url').pathToFileURL(process.argv[1]).href).catch((e) => { console.error(e); process.exit(1); })" \
        "$node_dir/node_modules/@platformatic/kafka/dist/index.js" \
        || die "@platformatic/kafka does not load from $node_dir"
fi

# ---------------------------------------------------------------- rust target for plugins
# The guests in plugins/ are WebAssembly components built for wasm32-wasip2. Only rustup
# can add a target; without rustup the guest build says what is missing.
if command -v rustup >/dev/null \
    && ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2; then
    run timeout "$APT_TIMEOUT_S" rustup target add wasm32-wasip2 \
        || die "rustup target add wasm32-wasip2"
fi

exit 0
