#!/usr/bin/env bash
# Runs the edge gateway: builds the components, starts the test endpoint (port 8099) and
# weir with this directory's connectors and transform. Append lines to
# work/input/app.log; what the endpoint receives is in work/received.jsonl. Ctrl-C stops
# both. weir's Kafka and admin listeners take free ports (printed at start: "weir
# listening on ...", "weir admin API on ..."), so this runs beside a broker already on
# 9092/8083; its data is work/data, and connectors may open work/input only.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
(cd "$root/plugins" && env -u CARGO_TARGET_DIR cargo build --release --target wasm32-wasip2 -q)
(cd "$root/connectors" && env -u CARGO_TARGET_DIR cargo build --release --target wasm32-wasip2 -q)
mkdir -p "$here/work/input" && touch "$here/work/input/app.log"
cd "$here"
python3 endpoint.py 8099 work/received.jsonl &
endpoint=$!
trap 'kill $endpoint' EXIT
cargo run --manifest-path "$root/Cargo.toml" --release -q --bin weir -- serve \
  --override listeners=PLAINTEXT://127.0.0.1:0 \
  --override admin.listeners=http://127.0.0.1:0 \
  --override log.dirs="$here/work/data" \
  --override connect.allowed.paths=work/input \
  --override connect.config.dir=connectors \
  --override transform.config.dir=transforms \
  --override connect.plugin.path="$root/connectors/target/wasm32-wasip2/release"
