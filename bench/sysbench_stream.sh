# What bench/clickhouse.sh and bench/lake.sh share (sourced, not run): their options, a hermetic
# MariaDB with one sysbench table, the snapshot timing and the two change-stream phases of one
# job into one sink.
#
# A script sets its default `commit_interval`, sources this file, calls `stream_bench_options "$@"`
# and `stream_bench_setup NAME [CARGO FEATURES...]`, starts its sink's server (naming its engine
# in `servers` first, so the cleanup stops it), and defines `cdc_job` (the snapshot+cdc job's
# file) and `stream_position`, which prints "file-sequence offset" of the stream's last committed
# position in the sink (nothing before the first).

rows=1000000
backlog_seconds=60
rate=1250
latency_seconds=60
out=bench/results
sluice=""
# The cdc job processes, killed at exit; the hermetic servers under $base, stopped at exit.
pids=()
servers=(mariadb)

stream_bench_options() {
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
}

cleanup() {
  local pid engine
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for engine in "${servers[@]}"; do scripts/testdb stop "$engine" "$base/$engine" >/dev/null 2>&1 || true; done
  rm -rf "$base"
}

# stream_bench_setup NAME [FEATURES...]: sysbench, the servers' packages, sluice (a release build
# with FEATURES unless --sluice named one), $base, MariaDB with $rows sysbench rows read once, and
# $results ($out/NAME-<time>.jsonl). Sets base, mysql_url, my, stamp, results.
stream_bench_setup() {
  local name=$1 features
  shift
  features=$(IFS=,; echo "$*")
  command -v sysbench >/dev/null && command -v /usr/bin/time >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq sysbench time >/dev/null
  }
  scripts/testdb install >/dev/null
  export SLUICE_TEST_PASSWORD=bench-pw
  if [[ -z $sluice ]]; then
    cargo build --release --quiet ${features:+--features "$features"} -p sluice --bin sluice
    sluice=$PWD/target/release/sluice
  fi
  base=$(mktemp -d "/dev/shm/sluice-$name.XXXXXX")
  trap cleanup EXIT
  mysql_url=$(scripts/testdb start mariadb "$base/mariadb"); mysql_url=${mysql_url#URL=}
  my="mariadb --no-defaults -uroot -S $base/mariadb/mysql.sock"
  $my -e "SET GLOBAL innodb_buffer_pool_size = 1073741824; CREATE DATABASE sbtest"
  echo "preparing $rows sysbench rows" >&2
  sysbench oltp_read_write --db-driver=mysql --mysql-socket="$base/mariadb/mysql.sock" --mysql-user=root \
    --mysql-db=sbtest --tables=1 --table-size="$rows" prepare >/dev/null
  $my -N -e "SELECT count(*), sum(length(c)) FROM sbtest.sbtest1" >/dev/null
  mkdir -p "$out"
  stamp=$(date -u +%Y%m%dT%H%M%SZ)
  results="$out/$name-$stamp.jsonl"
  : > "$results"
}

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

source_check() { $my -N -e "SELECT count(*), sum(k) FROM sbtest.sbtest1" | tr '\t' ' '; }
master_position() { $my -N -e "SHOW MASTER STATUS" | awk '{ split($1, f, "."); print f[2] + 0, $2 }'; }

run_pid=""
# start_job NAME: the cdc job in the background, its summary in $base/NAME.json.
start_job() {
  "$sluice" run "$cdc_job" --state-dir "$base/state-cdc" --summary-json "$base/$1.json" >"$base/$1.log" 2>&1 &
  run_pid=$!
  pids+=("$run_pid")
}
stop_job() { kill -TERM "$run_pid"; wait "$run_pid" || true; }
# wait_caught_up: until the stream's position in the sink reaches the source's position now.
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

# stream_phases LABEL CHECK: the backlog catch-up and the freshness at a fixed rate of the cdc job
# into LABEL (a name for the records); CHECK is a command printing "count sum(k)" of the sink's
# table, compared with the source's after each phase.
stream_phases() {
  local label=$1 check=$2 started caught_up applied seconds
  log "cdc: snapshot+cdc into $label to the starting state"
  start_job setup
  $my -e "CREATE DATABASE IF NOT EXISTS bench_marker"
  wait_caught_up
  stop_job
  log "cdc: $backlog_seconds s of sysbench oltp_write_only at saturation with the job stopped"
  sysbench oltp_write_only --db-driver=mysql --mysql-socket="$base/mariadb/mysql.sock" --mysql-user=root \
    --mysql-db=sbtest --tables=1 --table-size="$rows" --threads=4 --time="$backlog_seconds" --report-interval=0 run \
    >"$base/backlog-sysbench.log"
  started=$(date +%s.%N)
  start_job backlog
  wait_caught_up
  caught_up=$(date +%s.%N)
  stop_job
  applied=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["stream"]["rows_applied"])' "$base/backlog.json")
  seconds=$(awk "BEGIN{print $caught_up - $started}")
  printf '{"name":"sluice MySQL→%s, backlog catch-up","row_changes":%d,"seconds":%s,"rows_per_sec":%s}\n' \
    "$label" "$applied" "$seconds" "$(awk "BEGIN{printf \"%.0f\", $applied / $seconds}")" >> "$results"
  [[ $($check) == "$(source_check)" ]] || { log "$label differs from the source after the backlog"; exit 1; }

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
print(json.dumps({"name": "sluice MySQL→%s, freshness at a fixed rate" % sys.argv[4], "rate": int(sys.argv[2]), "interval_secs": int(sys.argv[3]),
  "row_changes": s["rows_applied"], "p50_ms": s["latency_p50_ms"], "p99_ms": s["latency_p99_ms"]}, ensure_ascii=False))' \
    "$base/latency.json" "$rate" "$commit_interval" "$label" >> "$results"
  [[ $($check) == "$(source_check)" ]] || { log "$label differs from the source after the rate run"; exit 1; }
}

# print_stream_phases: the Markdown lines of the two phases' records in $results.
print_stream_phases() {
  python3 - "$results" <<'PY'
import json, sys
for r in (json.loads(line) for line in open(sys.argv[1])):
    if "rows_per_sec" in r:
        print(f"\nbacklog: {r['row_changes']:,} row changes applied in {r['seconds']:.1f} s: **{r['rows_per_sec']:,} rows/s**")
    if "p99_ms" in r:
        print(f"\nfreshness at {r['rate'] * 4:,} rows/s ({r['rate']} tx/s), commit every {r['interval_secs']} s: "
              f"p50 ≤ {r['p50_ms']} ms, **p99 ≤ {r['p99_ms']} ms** over {r['row_changes']:,} row changes")
PY
}
