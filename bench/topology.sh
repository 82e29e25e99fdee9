#!/usr/bin/env bash
# Topology benchmark (issue "Topology"): the same backlog of binlog changes applied
#   1. by one job with three targets (`targets:`, one shared binlog read) against three jobs of
#      one target each, run side by side: the source's bytes sent (its Bytes_sent counter, which
#      the binlog dumps dominate) and sluice's CPU seconds per row change;
#   2. one way (A → B) against a two-way pair (A → B and B → A at once, a backlog on each side):
#      rows applied per second per direction.
#
#   bench/topology.sh [--changes 300000] [--sluice PATH] [--out bench/results]
#
# CPU: user + system seconds of the sluice processes (/usr/bin/time). Hermetic servers (scripts/testdb): MariaDB A and B, PostgreSQL for the three targets. Every run
# is a `cdc` job from the position before the backlog to the one after it
# (`source.start_position` / `stop_position`), so it ends by itself once everything is applied;
# targets are checked for the source's row count and sum afterwards. Prints a Markdown table and
# writes it, with the raw figures as JSON lines, under --out.
set -euo pipefail
cd "$(dirname "$0")/.."
command_line="bench/topology.sh $*"

changes=300000
sluice=""
out=bench/results
while [[ $# -gt 0 ]]; do
  case "$1" in
    --changes) changes=$2; shift 2 ;;
    --sluice) sluice=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--changes N] [--sluice PATH (prebuilt)] [--out DIR]" >&2; exit 2 ;;
  esac
done
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
# shellcheck source=bench/measure.sh
source bench/measure.sh

export SLUICE_TEST_PASSWORD=${SLUICE_TEST_PASSWORD:-bench-pw}
if [[ -z "$sluice" ]]; then
  log "building sluice (release)"
  cargo build --release --quiet -p sluice --bin sluice
  sluice=target/release/sluice
fi
sluice=$(realpath "$sluice")
commit=$(git rev-parse --short=12 HEAD)
stamp=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
result="$out/topology-$stamp"

base=$(mktemp -d /dev/shm/sluice-topology.XXXXXX)
servers=()
cleanup() {
  local server
  for server in "${servers[@]}"; do
    # shellcheck disable=SC2086
    scripts/testdb stop $server >/dev/null 2>&1 || true
  done
  rm -rf "$base"
}
trap cleanup EXIT
start_server() {
  servers+=("$1 $base/$2")
  url=$(scripts/testdb start "$1" "$base/$2")
  url=${url#URL=}
}
log "starting servers in $base"
start_server mariadb a; a_url=$url
start_server mariadb b; b_url=$url
start_server postgres pg; pg_url=$url
my() { local server=$1; shift; mariadb --no-defaults -N -uroot -S "$base/$server/mysql.sock" "$@"; }
pg() { psql -X -q -At -h "$base/pg" -p "$(cat "$base/pg/port")" -U postgres -d sluice "$@"; }
position() { my "$1" -e "SHOW MASTER STATUS" | awk '{printf "{file: %s, position: %s}", $1, $2}'; }
# bytes_sent SERVER: its Bytes_sent counter once no binlog dump thread is left (a thread adds its
# bytes to the global counter when it ends, which is a moment after its reader went away).
bytes_sent() {
  local waited=0
  while my "$1" -e "SHOW PROCESSLIST" | grep -q "Binlog Dump" && ((waited < 100)); do
    sleep 0.1
    waited=$((waited + 1))
  done
  my "$1" -e "SHOW GLOBAL STATUS LIKE 'Bytes_sent'" | awk '{print $2}'
}

# load SERVER FIRST_ID: `changes` row changes into bench.t, ids from FIRST_ID: inserts of 100
# rows per transaction, then updates of 100 rows per transaction (two thirds inserts).
load() {
  local server=$1 first=$2 inserts=$((changes * 2 / 3 / 100)) updates=$((changes / 3 / 100))
  awk -v first="$first" -v inserts="$inserts" -v updates="$updates" 'BEGIN {
    for (i = 0; i < inserts; i++) {
      printf "INSERT INTO bench.t (id, k, c) VALUES "
      for (j = 0; j < 100; j++) {
        id = first + i * 100 + j
        printf "%s(%d, %d, \"row %d with some text to carry along\")", (j ? "," : ""), id, id % 1000, id
      }
      print ";"
    }
    for (i = 0; i < updates; i++) {
      printf "UPDATE bench.t SET k = k + 1 WHERE id BETWEEN %d AND %d;\n", first + i * 100, first + i * 100 + 99
    }
  }' | my "$server"
}
for server in a b; do
  my "$server" -e "CREATE DATABASE bench; CREATE TABLE bench.t (id BIGINT PRIMARY KEY, k INT NOT NULL, c VARCHAR(100) NOT NULL)"
done

# run_jobs NAME FILE...: runs the job files side by side, each in its directory (its own state
# directory and run.log), waits for all; sets wall and cpu (user + system seconds of every sluice
# process, from /usr/bin/time, exact at exit).
run_jobs() {
  local name=$1 started pids=() file
  shift
  started=$(now)
  for file in "$@"; do
    (cd "$(dirname "$file")" && exec /usr/bin/time -f "%U %S" -o cpu.txt "$sluice" run "$file" >run.log 2>&1) &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || { log "$name: a run failed"; for file in "$@"; do tail -20 "$(dirname "$file")/run.log" >&2; done; exit 1; }
  done
  wall=$(elapsed "$started")
  cpu=$(for file in "$@"; do tail -1 "$(dirname "$file")/cpu.txt"; done | awk '{total += $1 + $2} END {printf "%.2f", total}')
}

# check_pg SCHEMA: the target's count and sum of k equal the source's (server a).
check_pg() {
  local want got
  want=$(my a -e "SELECT count(*), sum(k) FROM bench.t" | tr '\t' '|')
  got=$(pg -c "SELECT count(*), sum(k) FROM $1.t")
  [[ "$want" == "$got" ]] || { log "$1: $got, expected $want"; exit 1; }
}

jobs_dir=$base/jobs
# job_file NAME: the path of job NAME's file, in a directory of its own.
job_file() { mkdir -p "$jobs_dir/$1"; echo "$jobs_dir/$1/job.yaml"; }
job_head() { # NAME START STOP
  printf 'name: %s\nmode: cdc\nsource: {type: mysql, url: "%s", tables: ["bench.*"], start_position: %s, stop_position: %s}\n' \
    "$1" "$a_url" "$2" "$3"
}

# --- 1. one read for three targets, against three jobs ------------------------------------------
start=$(position a)
log "loading $changes row changes into A"
load a 1
stop=$(position a)

sent_before=$(bytes_sent a)
{
  job_head fan "$start" "$stop"
  echo "targets:"
  for n in 1 2 3; do printf '  - {name: t%s, type: postgres, url: "%s", namespace: fan%s}\n' "$n" "$pg_url" "$n"; done
} >"$(job_file fan)"
log "one job, three targets"
run_jobs fan "$(job_file fan)"
fan_wall=$wall fan_cpu=$cpu fan_sent=$(( $(bytes_sent a) - sent_before ))
fan_joins=$(grep -o 'joined the shared read of the source.s log [0-9]* times' "$jobs_dir/fan/run.log" | grep -o '[0-9]*' || echo 0)
grep -i "fell behind\|restarting" "$jobs_dir/fan/run.log" | head -5 >&2 || true
for n in 1 2 3; do check_pg "fan$n"; done

sent_before=$(bytes_sent a)
files=()
for n in 1 2 3; do
  { job_head "single$n" "$start" "$stop"; printf 'target: {type: postgres, url: "%s", namespace: single%s}\n' "$pg_url" "$n"; } >"$(job_file "single$n")"
  files+=("$(job_file "single$n")")
done
log "three jobs, one target each"
run_jobs single "${files[@]}"
single_wall=$wall single_cpu=$cpu single_sent=$(( $(bytes_sent a) - sent_before ))
for n in 1 2 3; do check_pg "single$n"; done

# --- 2. one way against two-way ------------------------------------------------------------------
# One way: the backlog on A applied into B.
my b -e "TRUNCATE bench.t"
{
  job_head oneway "$start" "$stop"
  printf 'target: {type: mysql, url: "%s"}\n' "$b_url"
} >"$(job_file oneway)"
log "one way, A -> B"
run_jobs oneway "$(job_file oneway)"
oneway_wall=$wall oneway_cpu=$cpu

# Two-way: B empties and takes its own backlog (other ids); both jobs at once.
my b -e "SET sql_log_bin = 0; TRUNCATE bench.t"
b_start=$(position b)
load b 100000001
b_stop=$(position b)
# B holds only its own rows when the pair starts: B's rows are new to A, A's to B.
{
  printf 'name: pair-ab\nmode: cdc\ntwo_way: true\nconflict: source_wins\n'
  printf 'source: {type: mysql, url: "%s", tables: ["bench.*"], start_position: %s, stop_position: %s}\n' "$a_url" "$start" "$stop"
  printf 'target: {type: mysql, url: "%s"}\n' "$b_url"
} >"$(job_file pair-ab)"
{
  printf 'name: pair-ba\nmode: cdc\ntwo_way: true\nconflict: source_wins\n'
  printf 'source: {type: mysql, url: "%s", tables: ["bench.*"], start_position: %s, stop_position: %s}\n' "$b_url" "$b_start" "$b_stop"
  printf 'target: {type: mysql, url: "%s"}\n' "$a_url"
} >"$(job_file pair-ba)"
log "two-way, A <-> B"
run_jobs pair "$(job_file pair-ab)" "$(job_file pair-ba)"
pair_wall=$wall pair_cpu=$cpu
a_rows=$(my a -e "SELECT count(*), sum(k) FROM bench.t")
b_rows=$(my b -e "SELECT count(*), sum(k) FROM bench.t")
[[ "$a_rows" == "$b_rows" ]] || { log "the pair differs: A $a_rows, B $b_rows"; exit 1; }

rate() { awk "BEGIN{printf \"%.0f\", $1 / $2}"; }
ratio() { awk "BEGIN{printf \"%.2f\", $1 / $2}"; }
{
  echo "## Topology ($stamp, sluice $commit, $changes row changes per backlog)"
  echo
  echo "\`$command_line\`"
  echo
  echo "| run | wall s | sluice CPU s | CPU µs per row change and target | source bytes sent | ratio to three jobs (bytes / CPU) |"
  echo "|---|---:|---:|---:|---:|---:|"
  echo "| one job, three targets (shared read; streams joined it $fan_joins times) | $fan_wall | $fan_cpu | $(awk "BEGIN{printf \"%.2f\", $fan_cpu * 1e6 / ($changes * 3)}") | $fan_sent | $(ratio "$fan_sent" "$single_sent") / $(ratio "$fan_cpu" "$single_cpu") |"
  echo "| three jobs, one target each | $single_wall | $single_cpu | $(awk "BEGIN{printf \"%.2f\", $single_cpu * 1e6 / ($changes * 3)}") | $single_sent | 1.00 / 1.00 |"
  echo
  echo "| run | wall s | rows/s per direction | sluice CPU s | ratio to one way |"
  echo "|---|---:|---:|---:|---:|"
  echo "| one way A → B | $oneway_wall | $(rate "$changes" "$oneway_wall") | $oneway_cpu | 1.00 |"
  echo "| two-way A ↔ B (both at once) | $pair_wall | $(rate "$changes" "$pair_wall") | $pair_cpu | $(ratio "$oneway_wall" "$pair_wall") |"
} | tee "$result.md"
printf '{"stamp":"%s","commit":"%s","changes":%s,"fan":{"wall":%s,"cpu":%s,"sent":%s},"single":{"wall":%s,"cpu":%s,"sent":%s},"oneway":{"wall":%s,"cpu":%s},"pair":{"wall":%s,"cpu":%s}}\n' \
  "$stamp" "$commit" "$changes" "$fan_wall" "$fan_cpu" "$fan_sent" "$single_wall" "$single_cpu" "$single_sent" \
  "$oneway_wall" "$oneway_cpu" "$pair_wall" "$pair_cpu" >"$result.jsonl"
log "written $result.md"
