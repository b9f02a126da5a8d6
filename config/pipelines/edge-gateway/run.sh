#!/usr/bin/env bash
# Runs the edge gateway: builds the components, starts the test endpoint and weir with
# this directory's connectors and transform. Append lines to work/app.log; what the
# endpoint receives is in work/received.jsonl. Ctrl-C stops both.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
(cd "$root/plugins" && env -u CARGO_TARGET_DIR cargo build --release --target wasm32-wasip2 -q)
(cd "$root/connectors" && env -u CARGO_TARGET_DIR cargo build --release --target wasm32-wasip2 -q)
mkdir -p "$here/work" && touch "$here/work/app.log"
cd "$here"
python3 endpoint.py 8099 work/received.jsonl &
endpoint=$!
trap 'kill $endpoint' EXIT
cargo run --manifest-path "$root/Cargo.toml" --release -q --bin weir -- serve \
  --override log.dirs="$here/work/data" \
  --override connect.config.dir=connectors \
  --override transform.config.dir=transforms \
  --override connect.plugin.path="$root/connectors/target/wasm32-wasip2/release"
