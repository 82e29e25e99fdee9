#!/usr/bin/env bash
# Verification benchmark: `sluice verify` of a MySQL → PostgreSQL table with no difference,
# against the physical limit measured in the same run — both tables read once by the servers' own
# clients (`mariadb --quick` into /dev/null and `COPY ... TO STDOUT` into /dev/null), one after
# the other and both at once. Then the same verification while a snapshot+cdc job applies a write
# load to the same table: its wall time and the source server's CPU during it.
#
#   bench/verify.sh [--rows 2000000] [--out bench/results]
#
# Prints a Markdown table and writes it, with the raw figures as JSON lines, under --out. Tool
# CPU = user + sys of the tool's process (servers excluded), from /usr/bin/time; server CPU from
# /proc of the server's processes.
set -euo pipefail
cd "$(dirname "$0")/.."

rows=2000000
out=bench/results
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rows) rows=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--rows N] [--out DIR]" >&2; exit 2 ;;
  esac
done

scripts/testdb install >/dev/null
command -v /usr/bin/time >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq time >/dev/null; }
export SLUICE_TEST_PASSWORD=bench-pw
cargo build --release --quiet -p sluice --bin sluice
sluice=$PWD/target/release/sluice

base=$(mktemp -d /dev/shm/sluice-verify.XXXXXX)
load_pid=""
run_pid=""
cleanup() {
  [[ -n $load_pid ]] && kill "$load_pid" 2>/dev/null || true
  [[ -n $run_pid ]] && kill "$run_pid" 2>/dev/null || true
  scripts/testdb stop mariadb "$base/mariadb" >/dev/null 2>&1 || true
  scripts/testdb stop postgres "$base/postgres" >/dev/null 2>&1 || true
  rm -rf "$base"
}
trap cleanup EXIT
mysql_url=$(scripts/testdb start mariadb "$base/mariadb"); mysql_url=${mysql_url#URL=}
postgres_url=$(scripts/testdb start postgres "$base/postgres"); postgres_url=${postgres_url#URL=}
pg_port=$(cat "$base/postgres/port")
my="mariadb --no-defaults --default-character-set=utf8mb4 -uroot -S $base/mariadb/mysql.sock"
pg="psql -X -q -h $base/postgres -p $pg_port -U postgres -d sluice"
clk=$(getconf CLK_TCK)
descendants() { local c; for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do echo "$c"; descendants "$c"; done; }
# CPU ticks of a server's processes (PostgreSQL forks a backend per connection).
server_cpu() { local p t=0 s f; for p in "$1" $(descendants "$1"); do { read -r s <"/proc/$p/stat"; } 2>/dev/null || continue; read -ra f <<<"${s##*) }"; t=$((t+f[11]+f[12]+f[13]+f[14])); done; echo $t; }
my_pid=$(cat "$base/mariadb/pid")

$my -e "SET GLOBAL innodb_buffer_pool_size = 1073741824; CREATE DATABASE bench"
echo "preparing $rows rows" >&2
$my bench -e "CREATE TABLE items (id BIGINT PRIMARY KEY, a INT NOT NULL, price DECIMAL(12,2) NOT NULL,
    name VARCHAR(60) NOT NULL, made DATETIME(6) NOT NULL, note VARCHAR(20) NULL);
  INSERT INTO items SELECT seq, seq % 100000, (seq % 100000) / 7, CONCAT('name ', MD5(seq)),
    '2024-01-01 00:00:00' + INTERVAL seq SECOND, IF(seq % 3 = 0, NULL, 'n') FROM seq_1_to_$rows;
  ANALYZE TABLE items;" >/dev/null
cat >"$base/job.yaml" <<EOF
name: verify-bench
mode: snapshot
source:
  type: mysql
  url: $mysql_url/bench
  tables: [bench.items]
target:
  type: postgres
  url: $postgres_url
parallelism: 4
EOF
echo "copying" >&2
"$sluice" run "$base/job.yaml" --state-dir "$base/state" >/dev/null 2>&1
$pg -c "VACUUM ANALYZE bench.items" >/dev/null
# Warm both servers' caches.
$my bench -e "SELECT count(*) FROM items" >/dev/null; $pg -c "SELECT count(*) FROM bench.items" >/dev/null

results=()
measure() { # name, command...
  local name=$1; shift
  local start end
  start=$(date +%s.%N)
  /usr/bin/time -f "%U %S %M" -o "$base/time" "$@" >/dev/null 2>"$base/stderr" || { cat "$base/stderr" >&2; exit 1; }
  end=$(date +%s.%N)
  read -r user sys rss <"$base/time"
  local wall cpu
  wall=$(awk "BEGIN{printf \"%.2f\", $end - $start}")
  cpu=$(awk "BEGIN{printf \"%.2f\", $user + $sys}")
  results+=("{\"what\":\"$name\",\"wall\":$wall,\"cpu\":$cpu,\"rss_kb\":$rss}")
  echo "$name: wall $wall s, tool CPU $cpu s" >&2
}
read_mysql="$my --quick -N bench -e 'SELECT * FROM items'"
read_postgres="$pg -c 'COPY bench.items TO STDOUT'"
for run in 1 2; do
  measure "limit: MySQL read (mariadb --quick)" bash -c "$read_mysql"
  measure "limit: PostgreSQL read (COPY TO STDOUT)" bash -c "$read_postgres"
  measure "limit: both read at once" bash -c "$read_mysql >/dev/null & $read_postgres >/dev/null; wait"
  measure "sluice verify" "$sluice" verify "$base/job.yaml" --state-dir "$base/state"
done

# The same table followed by a snapshot+cdc job under a write load: verify's wall time and what
# it costs the source while the stream runs.
sed -e 's/^name: verify-bench/name: verify-bench-live/' -e 's/^mode: snapshot/mode: snapshot+cdc/' "$base/job.yaml" >"$base/live.yaml"
$pg -c "DROP TABLE bench.items" >/dev/null
"$sluice" run "$base/live.yaml" --state-dir "$base/live" >"$base/live.log" 2>&1 &
run_pid=$!
until $pg -At -c "SELECT position FROM sluice.checkpoints WHERE job = 'verify-bench-live' AND task = 'stream'" 2>/dev/null | grep -q at; do sleep 1; done
# 500 updates a second, each on a random row.
(
  while true; do
    for i in $(seq 1 50); do echo "UPDATE items SET a = a + 1, note = 'u' WHERE id = $(( (RANDOM * 32768 + RANDOM) % rows + 1 ));"; done
    sleep 0.1
  done | $my bench
) >/dev/null 2>&1 &
load_pid=$!
sleep 5
# The source's CPU under the load alone, over 10 s: the baseline a verify's cost is read against.
before=$(server_cpu "$my_pid"); start=$(date +%s.%N); sleep 10; after=$(server_cpu "$my_pid"); end=$(date +%s.%N)
baseline=$(awk "BEGIN{printf \"%.3f\", ($after - $before) / $clk / ($end - $start)}")
results+=("{\"what\":\"source server CPU per second under the load alone\",\"cpu\":$baseline}")
for run in 1 2; do
  before=$(server_cpu "$my_pid"); start=$(date +%s.%N)
  measure "sluice verify while the stream applies 500 updates/s" "$sluice" verify "$base/live.yaml" --state-dir "$base/live"
  end=$(date +%s.%N); after=$(server_cpu "$my_pid")
  source_cpu=$(awk "BEGIN{printf \"%.2f\", ($after - $before) / $clk}")
  wall=$(awk "BEGIN{printf \"%.2f\", $end - $start}")
  results+=("{\"what\":\"source server CPU during verify under load\",\"wall\":$wall,\"cpu\":$source_cpu}")
  echo "source server CPU during it: $source_cpu s over $wall s" >&2
done

stamp=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
printf '%s\n' "${results[@]}" >"$out/verify-$stamp.jsonl"
python3 - "$out/verify-$stamp.jsonl" "$rows" >"$out/verify-$stamp.md" <<'PY'
import json, sys
rows = int(sys.argv[2])
figures = [json.loads(line) for line in open(sys.argv[1])]
def best(name):
    walls = [f["wall"] for f in figures if f["what"] == name]
    return min(walls) if walls else float("nan")
both = best("limit: both read at once")
sequential = best("limit: MySQL read (mariadb --quick)") + best("limit: PostgreSQL read (COPY TO STDOUT)")
print(f"| what ({rows:,} rows, best of 2) | wall s | / both read at once | rows/s |")
print("|---|---:|---:|---:|")
for name in ["limit: MySQL read (mariadb --quick)", "limit: PostgreSQL read (COPY TO STDOUT)", "limit: both read at once", "sluice verify", "sluice verify while the stream applies 500 updates/s"]:
    wall = best(name)
    print(f"| {name} | {wall:.2f} | {wall / both:.2f} | {rows / wall:,.0f} |")
print(f"| limit: both read one after the other | {sequential:.2f} | {sequential / both:.2f} | {rows / sequential:,.0f} |")
baseline = [f["cpu"] for f in figures if f["what"] == "source server CPU per second under the load alone"][0]
for f in figures:
    if f["what"] == "source server CPU during verify under load":
        extra = f["cpu"] - baseline * f["wall"]
        print(f"\nsource server CPU during a verify under load: {f['cpu']:.2f} s over {f['wall']:.2f} s; "
              f"the load alone takes {baseline:.2f} s/s, so the verify's own cost is {extra:.2f} s "
              f"({rows / max(extra, 0.001):,.0f} rows per source CPU-second)")
PY
cat "$out/verify-$stamp.md"
