#!/usr/bin/env bash
# ClickHouse benchmark (performance.md's protocol): MySQL → ClickHouse, in one run on the same rows.
#
#   bench/clickhouse.sh [--rows 1000000] [--backlog-seconds 60] [--rate 1250] [--latency-seconds 60]
#                       [--commit-interval 1] [--out bench/results]
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

rows=1000000
backlog_seconds=60
rate=1250
latency_seconds=60
commit_interval=1
out=bench/results
sluice=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rows) rows=$2; shift 2 ;;
    --backlog-seconds) backlog_seconds=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --latency-seconds) latency_seconds=$2; shift 2 ;;
    --commit-interval) commit_interval=$2; shift 2 ;;
    --sluice) sluice=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--rows N] [--backlog-seconds S] [--rate TPS] [--latency-seconds S] [--commit-interval S] [--sluice BINARY] [--out DIR]" >&2; exit 2 ;;
  esac
done

command -v sysbench >/dev/null && command -v /usr/bin/time >/dev/null || {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq sysbench time >/dev/null
}
# MariaDB and ClickHouse come from the project's installer.
scripts/testdb install >/dev/null
export SLUICE_TEST_PASSWORD=bench-pw
if [[ -z $sluice ]]; then
  cargo build --release --quiet -p sluice --bin sluice
  sluice=$PWD/target/release/sluice
fi

base=$(mktemp -d /dev/shm/sluice-clickhouse.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  scripts/testdb stop mariadb "$base/mariadb" >/dev/null 2>&1 || true
  scripts/testdb stop clickhouse "$base/clickhouse" >/dev/null 2>&1 || true
  rm -rf "$base"
}
trap cleanup EXIT
mysql_url=$(scripts/testdb start mariadb "$base/mariadb"); mysql_url=${mysql_url#URL=}
clickhouse_url=$(scripts/testdb start clickhouse "$base/clickhouse"); clickhouse_url=${clickhouse_url#URL=}
my="mariadb --no-defaults -uroot -S $base/mariadb/mysql.sock"
ch=(clickhouse-client --host 127.0.0.1 --port "$(cat "$base/clickhouse/tcp_port")" --user sluice --password "$SLUICE_TEST_PASSWORD")
$my -e "SET GLOBAL innodb_buffer_pool_size = 1073741824; CREATE DATABASE sbtest"
echo "preparing $rows sysbench rows" >&2
sysbench oltp_read_write --db-driver=mysql --mysql-socket="$base/mariadb/mysql.sock" --mysql-user=root \
  --mysql-db=sbtest --tables=1 --table-size="$rows" prepare >/dev/null
$my -N -e "SELECT count(*), sum(length(c)) FROM sbtest.sbtest1" >/dev/null

mkdir -p "$out"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
results="$out/clickhouse-$stamp.jsonl"
: > "$results"
log() { echo "$(date -u +%H:%M:%S) $*" >&2; }

# measure NAME COMMAND...: times the command; appends a JSON line with wall, CPU and peak RSS.
measure() {
  local name=$1 timing
  shift
  log "running $name"
  timing=$(mktemp)
  /usr/bin/time -f "%e %U %S %M" -o "$timing" "$@" >"$base/run.log" 2>&1 || { tail -5 "$base/run.log" >&2; exit 1; }
  read -r wall user system rss < <(tail -1 "$timing")
  rm -f "$timing"
  printf '{"name":"%s","rows":%d,"wall":%s,"cpu":%s,"rss_kb":%d}\n' \
    "$name" "$rows" "$wall" "$(awk "BEGIN{print $user + $system}")" "$rss" >> "$results"
}

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

source_check() { $my -N -e "SELECT count(*), sum(k) FROM sbtest.sbtest1" | tr '\t' ' '; }
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

# --- 2. cdc backlog ------------------------------------------------------------------------------
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
master_position() { $my -N -e "SHOW MASTER STATUS" | awk '{ split($1, f, "."); print f[2] + 0, $2 }'; }
run_pid=""
start_job() {
  "$sluice" run "$cdc_job" --state-dir "$base/state-cdc" --summary-json "$base/$1.json" >"$base/$1.log" 2>&1 &
  run_pid=$!
  pids+=("$run_pid")
}
stop_job() { kill -TERM "$run_pid"; wait "$run_pid" || true; }
# wait_caught_up: until the stream's checkpoint reaches the source's position now.
wait_caught_up() {
  local target at
  target=$(master_position)
  while :; do
    at=$(stream_position || true)
    if [[ -n "$at" ]] && python3 -c 'import sys; a = sys.argv[1].split(); b = sys.argv[2].split(); sys.exit(0 if (int(a[0]), int(a[1])) >= (int(b[0]), int(b[1])) else 1)' "$at" "$target"; then
      return 0
    fi
    kill -0 "$run_pid" 2>/dev/null || { log "sluice exited"; tail -5 "$base"/*.log >&2; exit 1; }
    sleep 0.1
  done
}
log "cdc: snapshot+cdc into ClickHouse to the starting state"
start_job setup
$my -e "CREATE DATABASE IF NOT EXISTS bench_marker"
wait_caught_up
stop_job
log "cdc: $backlog_seconds s of sysbench oltp_write_only at saturation with the job stopped"
sysbench oltp_write_only --db-driver=mysql --mysql-socket="$base/mariadb/mysql.sock" --mysql-user=root \
  --mysql-db=sbtest --tables=1 --table-size="$rows" --threads=4 --time="$backlog_seconds" --report-interval=0 run >"$base/backlog-sysbench.log"
started=$(date +%s.%N)
start_job backlog
wait_caught_up
caught_up=$(date +%s.%N)
stop_job
applied=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["stream"]["rows_applied"])' "$base/backlog.json")
seconds=$(awk "BEGIN{print $caught_up - $started}")
printf '{"name":"sluice MySQL→ClickHouse, backlog catch-up","row_changes":%d,"seconds":%s,"rows_per_sec":%s}\n' \
  "$applied" "$seconds" "$(awk "BEGIN{printf \"%.0f\", $applied / $seconds}")" >> "$results"
[[ $(clickhouse_check cdc) == "$(source_check)" ]] || { log "ClickHouse differs from the source after the backlog"; exit 1; }

# --- 3. freshness at a fixed rate ------------------------------------------------------------
log "cdc: $latency_seconds s at $rate transactions/s (4 row changes each)"
start_job latency
wait_caught_up
sysbench oltp_write_only --db-driver=mysql --mysql-socket="$base/mariadb/mysql.sock" --mysql-user=root \
  --mysql-db=sbtest --tables=1 --table-size="$rows" --threads=4 --rate="$rate" --time="$latency_seconds" \
  --report-interval=0 run >"$base/latency-sysbench.log"
wait_caught_up
stop_job
python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))["stream"]
print(json.dumps({"name": "sluice MySQL→ClickHouse, freshness at a fixed rate", "rate": int(sys.argv[2]), "interval_secs": int(sys.argv[3]),
  "row_changes": s["rows_applied"], "p50_ms": s["latency_p50_ms"], "p99_ms": s["latency_p99_ms"]}, ensure_ascii=False))' \
  "$base/latency.json" "$rate" "$commit_interval" >> "$results"
[[ $(clickhouse_check cdc) == "$(source_check)" ]] || { log "ClickHouse differs from the source after the rate run"; exit 1; }

python3 - "$results" <<'PY' | tee "${results%.jsonl}.md"
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
snapshots = [r for r in records if "wall" in r]
pipe = next(r for r in snapshots if r["name"].startswith("pipe"))
print("| snapshot | wall s | × the pipe's time | rows/s | rows per CPU-s | peak RSS MB |")
print("|---|---:|---:|---:|---:|---:|")
for r in snapshots:
    print(f"| {r['name']} | {r['wall']:.2f} | {r['wall'] / pipe['wall']:.2f} | {r['rows'] / r['wall']:,.0f} | "
          f"{r['rows'] / max(r['cpu'], 0.01):,.0f} | {r['rss_kb'] // 1024} |")
for r in records:
    if "rows_per_sec" in r:
        print(f"\nbacklog: {r['row_changes']:,} row changes applied in {r['seconds']:.1f} s: **{r['rows_per_sec']:,} rows/s**")
    if "p99_ms" in r:
        print(f"\nfreshness at {r['rate'] * 4:,} rows/s ({r['rate']} tx/s), commit every {r['interval_secs']} s: "
              f"p50 ≤ {r['p50_ms']} ms, **p99 ≤ {r['p99_ms']} ms** over {r['row_changes']:,} row changes")
PY
