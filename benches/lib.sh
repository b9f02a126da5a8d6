# benches/lib.sh — what the bench scripts that start their own brokers share; sourced,
# not run. Gives:
#   $work            a fresh temporary directory, removed on exit with every broker
#   broker_pin=()    a command prefix for brokers (set by the script, e.g. taskset)
#   free_port        a free TCP port on 127.0.0.1
#   start_broker NAME BIN [serve args...]
#                    starts `BIN serve` on 127.0.0.1 with its log dir under $work and an
#                    admin listener on a free port, waits (≤ 20 s) for it to listen, and
#                    sets broker_addr[NAME], broker_pid[NAME] and broker_admin[NAME]
#                    (http://HOST:PORT, empty if it did not say)
#   median           the median of the numbers on standard input, one per line
# Only 127.0.0.1; the brokers are stopped (and waited for) on exit.
work=$(mktemp -d "${TMPDIR:-/tmp}/weir-bench.XXXXXX")
bench_pids=()
broker_pin=()
declare -A broker_addr broker_pid broker_admin
bench_cleanup() {
    for pid in "${bench_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap bench_cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start_broker() {
    local name=$1 bin=$2 port
    shift 2
    port=$(free_port)
    "${broker_pin[@]}" "$bin" serve --override "listeners=PLAINTEXT://127.0.0.1:$port" \
        --override "log.dirs=$work/$name" --override admin.listeners=http://127.0.0.1:0 "$@" \
        >"$work/$name.log" 2>&1 &
    bench_pids+=($!)
    broker_pid[$name]=$!
    broker_addr[$name]=127.0.0.1:$port
    for _ in $(seq 1 100); do
        grep -q "listening addr" "$work/$name.log" && break
        sleep 0.2
    done
    broker_admin[$name]=http://$(sed -n 's/.*admin API listening addr=\([0-9.:]*\).*/\1/p' "$work/$name.log" | head -1)
}

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
