#!/usr/bin/env bash
# ClickHouse benchmark (the protocol at the top of BENCHMARKS.md): MySQL → ClickHouse, in one run on the same rows.
#
#   bench/clickhouse.sh [--rows 1000000] [--backlog-seconds 60] [--rate 1250] [--latency-seconds 60]
#                       [--commit-interval 1] [--sluice BINARY] [--out bench/results]
#
# 1. Snapshot of --rows sysbench rows (one table) from a hermetic MariaDB into a hermetic
#    ClickHouse (Debian's 18.16), side by side with the physical limit of the read (`mariadb
#    --quick` to /dev/null) and the hand-made pipe of the same rows with the same end state:
#    `mariadb --quick | clickhouse-client --query "INSERT … FORMAT TSV"` into a ReplacingMergeTree
#    ordered by the key, as sluice makes it.
# 2. CDC backlog: a snapshot+cdc job is brought to the source's position and stopped; sysbench
#    oltp_write_only runs at saturation for --backlog-seconds; the job is started again and timed
#    until its checkpoint in ClickHouse reaches the source's position.
# 3. Freshness: with the job caught up, sysbench runs at --rate transactions/s (4 row changes
#    each: 5,000 row changes/s at the default) for --latency-seconds; p50/p99 from source commit to
#    the ClickHouse commit come from sluice's summary (histogram bucket bounds).
# Each copy is checked: count and sum(k) of the FINAL rows equal the source's. CPU is user+sys of
# the tool's process tree (/usr/bin/time), servers excluded.
set -euo pipefail
cd "$(dirname "$0")/.."

commit_interval=1
# The options, the cleanup, the setup, log, measure, source_check, the cdc job's start and stop,
# stream_phases.
source bench/sysbench_stream.sh
stream_bench_options "$@"
stream_bench_setup clickhouse
servers+=(clickhouse)
clickhouse_url=$(scripts/testdb start clickhouse "$base/clickhouse"); clickhouse_url=${clickhouse_url#URL=}
ch=(clickhouse-client --host 127.0.0.1 --port "$(cat "$base/clickhouse/tcp_port")" --user sluice --password "$SLUICE_TEST_PASSWORD")

# job NAME MODE NAMESPACE: a job file into ClickHouse.
job() {
  cat > "$base/$1.yaml" <<EOF
name: $1
mode: $2
source:
  type: mysql
  url: $mysql_url
  tables: ["sbtest.*"]
target:
  type: clickhouse
  url: $clickhouse_url
  create_tables: true
  namespace: $3
  commit_interval_secs: $commit_interval
parallelism: 4
EOF
  echo "$base/$1.yaml"
}

clickhouse_check() {
  "${ch[@]}" --query "SELECT count(), sum(k) FROM $1.sbtest1 FINAL WHERE _sluice_deleted = 0" | tr '\t' ' '
}

# --- 1. snapshot -----------------------------------------------------------------------------
measure "limit: source full read (mariadb --quick)" bash -c "$my --quick -N -e 'SELECT * FROM sbtest.sbtest1' >/dev/null"
"${ch[@]}" --query "CREATE DATABASE pipe"
"${ch[@]}" --query "CREATE TABLE pipe.sbtest1 (id Int32, k Int32, c String, pad String, _sluice_version UInt64 DEFAULT 0,
  _sluice_deleted UInt8 DEFAULT 0) ENGINE = ReplacingMergeTree(_sluice_version) ORDER BY (id)"
measure "pipe: mariadb --quick | clickhouse-client INSERT FORMAT TSV" bash -c \
  "$my --quick -N -e 'SELECT id, k, c, pad FROM sbtest.sbtest1' | ${ch[*]} --query 'INSERT INTO pipe.sbtest1 (id, k, c, pad) FORMAT TSV'"
[[ $(clickhouse_check pipe) == "$(source_check)" ]] || { log "the pipe's copy differs from the source"; exit 1; }
measure "sluice MySQL→ClickHouse" "$sluice" run "$(job bench-snapshot snapshot copy)" --state-dir "$base/state-snapshot"
[[ $(clickhouse_check copy) == "$(source_check)" ]] || { log "sluice's copy differs from the source"; exit 1; }
"${ch[@]}" --query "DROP DATABASE pipe"
"${ch[@]}" --query "DROP DATABASE copy"

# --- 2. and 3. cdc: backlog catch-up, freshness at a fixed rate -----------------------------------
cdc_job=$(job bench-cdc snapshot+cdc cdc)
# stream_position: "sequence offset" of the stream's checkpoint in ClickHouse.
stream_position() {
  "${ch[@]}" --query "SELECT argMax(position, (epoch, written)) FROM sluice.checkpoints
    WHERE job = 'bench-cdc' AND task = 'stream'" 2>/dev/null | python3 -c '
import json, sys
text = sys.stdin.read().strip()
if text:
    at = json.loads(text)["at"]
    print(int(at["file"].rsplit(".", 1)[1]), at["position"])'
}
stream_phases ClickHouse "clickhouse_check cdc"

# --- results -------------------------------------------------------------------------------------
{
python3 - "$results" <<'PY'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
snapshots = [r for r in records if "wall" in r]
pipe = next(r for r in snapshots if r["name"].startswith("pipe"))
print("| snapshot | wall s | × the pipe's time | rows/s | rows per CPU-s | peak RSS MB |")
print("|---|---:|---:|---:|---:|---:|")
for r in snapshots:
    print(f"| {r['name']} | {r['wall']:.2f} | {r['wall'] / pipe['wall']:.2f} | {r['rows'] / r['wall']:,.0f} | "
          f"{r['rows'] / max(r['cpu'], 0.01):,.0f} | {r['rss_kb'] // 1024} |")
PY
  print_stream_phases
} | tee "${results%.jsonl}.md"
