#!/usr/bin/env bash
# benches/fetch_sessions.sh — fetch sessions (KIP-227) at 1,000 partitions, with and
# without: two brokers from the same binary, one with the default
# max.incremental.fetch.session.cache.slots (1000) and one with 0 (sessions off), each
# with one topic of PARTITIONS partitions × RECORDS records; one kafka-python consumer
# reads everything from each (benches/fetch_sessions.py), then polls while idle. REPEAT
# rounds, alternating which broker goes first. Prints each run's line: time to read
# everything, then for 10 s of idle polling the Fetch requests per second (broker's
# /metrics) and CPU per fetch of the broker (/proc/PID/task/*/schedstat) and of the client.
#
# Usage: benches/fetch_sessions.sh
#   WEIR_BIN    the weir binary (default: $CARGO_TARGET_DIR/release/weir, else debug)
#   PARTITIONS  1000     RECORDS  100     REPEAT  2
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
bin=${WEIR_BIN:-$target/release/weir}
[ -x "$bin" ] || bin=$target/debug/weir
partitions=${PARTITIONS:-1000}
records=${RECORDS:-100}
repeat=${REPEAT:-2}
# shellcheck source=benches/lib.sh
. benches/lib.sh
start() { start_broker "$1" "$bin" --override "max.incremental.fetch.session.cache.slots=$2"; }

echo "binary: $bin ($(git rev-parse --short HEAD)); $partitions partitions x $records records"
start sessions 1000
start sessionless 0
python3 benches/fetch_sessions.py "${broker_addr[sessions]}" t "$partitions" "$records" produce
python3 benches/fetch_sessions.py "${broker_addr[sessionless]}" t "$partitions" "$records" produce
for round in $(seq 1 "$repeat"); do
    order="sessions sessionless"
    [ $((round % 2)) -eq 0 ] && order="sessionless sessions"
    for name in $order; do
        echo "round $round $name: $(python3 benches/fetch_sessions.py "${broker_addr[$name]}" t \
            "$partitions" "$records" consume "${broker_admin[$name]}" "${broker_pid[$name]}")"
    done
done
