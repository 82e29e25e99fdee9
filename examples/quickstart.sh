#!/usr/bin/env bash
# The quickstart: build sluice, generate the sample shop database, copy it into a SQLite
# warehouse and into JSON Lines files, with the progress display and the run summaries.
# Running it again resumes; a finished job copies nothing twice.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet -p sluice --bin sluice --example shop_db
if [[ ! -f examples/data/shop.db ]]; then
  target/release/examples/shop_db examples/data/shop.db
fi
target/release/sluice run examples/quickstart.yaml --state-dir examples/data/state --summary-json examples/data/quickstart-summary.json
target/release/sluice run examples/quickstart-jsonl.yaml --state-dir examples/data/state --summary-json examples/data/quickstart-jsonl-summary.json
echo "summaries: examples/data/quickstart-summary.json examples/data/quickstart-jsonl-summary.json"
