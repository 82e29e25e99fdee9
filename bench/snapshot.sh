#!/usr/bin/env bash
# Snapshot benchmark (the protocol at the top of BENCHMARKS.md): sysbench tables in a hermetic MariaDB, copied
# into a hermetic PostgreSQL and MariaDB by sluice and by the peers, in the same run, next to the
# physical limit (the source's full read and the target's bulk load of the same rows from a file).
#
#   bench/snapshot.sh [--tables 4] [--rows 1000000] [--only sluice] [--baseline PATH] [--out bench/results]
#
# --baseline PATH: an earlier sluice binary, measured right after this checkout's on the PostgreSQL
# and MySQL targets ("sluice (baseline) …"), for before/after figures of one run.
#
# Prints a Markdown table and writes it, with the raw figures as JSON lines, under --out.
# Peers missing on the machine are installed (apt: sysbench pgloader mydumper; PyPI:
# sling-linux-amd64==1.4.11). Each tool is timed by /usr/bin/time: wall, user+sys CPU of the
# tool's own process tree (servers excluded), peak RSS.
set -euo pipefail
cd "$(dirname "$0")/.."

tables=4
rows=1000000
only=""
baseline=""
out=bench/results
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tables) tables=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --baseline) baseline=$(realpath "$2"); shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--tables N] [--rows N] [--only TOOL] [--baseline PATH] [--out DIR]" >&2; exit 2 ;;
  esac
done

install_peers() {
  local missing=()
  for tool in sysbench pgloader mydumper /usr/bin/time; do
    command -v "$tool" >/dev/null || missing+=("$(basename "$tool")")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  if ! python3 -c "import sling_linux_amd64" 2>/dev/null; then
    python3 -m pip install -q sling-linux-amd64==1.4.11
  fi
  sling=$(python3 -c "import sling_linux_amd64, os; print(os.path.join(os.path.dirname(sling_linux_amd64.__file__), 'bin', 'sling-linux-amd64'))")
}

# The servers (MariaDB, PostgreSQL, etcd) come from the project's installer.
scripts/testdb install >/dev/null
install_peers
export SLUICE_TEST_PASSWORD=bench-pw
cargo build --release --quiet -p sluice --bin sluice
sluice=$PWD/target/release/sluice

base=$(mktemp -d /dev/shm/sluice-bench.XXXXXX)
cleanup() {
  scripts/testdb stop mariadb "$base/mariadb" >/dev/null 2>&1 || true
  scripts/testdb stop postgres "$base/postgres" >/dev/null 2>&1 || true
  rm -rf "$base"
}
trap cleanup EXIT
mysql_url=$(scripts/testdb start mariadb "$base/mariadb"); mysql_url=${mysql_url#URL=}
postgres_url=$(scripts/testdb start postgres "$base/postgres"); postgres_url=${postgres_url#URL=}
my_port=$(cat "$base/mariadb/port")
pg_port=$(cat "$base/postgres/port")
# Plain strings (no arrays), exported with the step functions, so /usr/bin/time can time a step
# as `bash -c step`.
export my="mariadb --no-defaults --default-character-set=utf8mb4 -uroot -S $base/mariadb/mysql.sock"
export pg="psql -X -q -h $base/postgres -p $pg_port -U postgres -d sluice"
export base tables my_port pg_port sling mysql_url postgres_url

$my -e "SET GLOBAL innodb_buffer_pool_size = 1073741824; SET GLOBAL local_infile = 1; CREATE DATABASE sbtest"
echo "preparing $tables x $rows sysbench rows" >&2
sysbench oltp_read_write --db-driver=mysql --mysql-socket="$base/mariadb/mysql.sock" --mysql-user=root \
  --mysql-db=sbtest --tables="$tables" --table-size="$rows" --threads="$tables" prepare >/dev/null
total=$((tables * rows))
for t in $(seq 1 "$tables"); do $my -e "ANALYZE TABLE sbtest.sbtest$t" >/dev/null; done
bytes=$($my -N -e "SELECT sum(data_length) FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'sbtest'")
# Warm the buffer pool, so every tool reads from memory.
for t in $(seq 1 "$tables"); do $my -N -e "SELECT count(*), sum(length(c)) FROM sbtest.sbtest$t" >/dev/null; done

mkdir -p "$out"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
results="$out/snapshot-$stamp.jsonl"
: > "$results"

# settle: waits (at most 2 minutes) until MariaDB has written back the pages the previous tool
# dirtied, so that no tool pays for the one before it.
settle() {
  $my -e "SET GLOBAL innodb_max_dirty_pages_pct_lwm = 0, GLOBAL innodb_max_dirty_pages_pct = 0"
  local dirty
  for _ in $(seq 1 240); do
    dirty=$($my -N -e "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'INNODB_BUFFER_POOL_PAGES_DIRTY'")
    if [[ $dirty -lt 100 ]]; then return; fi
    sleep 0.5
  done
  echo "MariaDB still has $dirty dirty pages after 2 minutes; measuring anyway" >&2
}

# measure NAME KIND COMMAND...: times the command, appends a JSON line.
measure() {
  local name=$1 kind=$2
  shift 2
  # --only keeps the physical limit, which every ratio needs.
  if [[ -n "$only" && "$name" != *"$only"* && "$kind" != limit-* ]]; then return; fi
  settle
  echo "running $name" >&2
  local timing
  timing=$(mktemp)
  if declare -F "$1" >/dev/null; then
    export -f "$1"
    set -- bash -c "$1"
  fi
  if ! /usr/bin/time -f "%e %U %S %M" -o "$timing" "$@" >"$base/$name.log" 2>&1; then
    echo "$name failed:" >&2; tail -5 "$base/$name.log" >&2; rm -f "$timing"
    local reason
    reason=$(grep -v '^\s*$' "$base/$name.log" | grep -v 'Command exited' | tail -1 | tr -d '"\\' | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-120)
    printf '{"name":"%s","kind":"%s","rows":%d,"bytes":%d,"failed":"%s"}\n' "$name" "$kind" "$total" "$bytes" "$reason" >> "$results"
    return
  fi
  read -r wall user system rss < <(tail -1 "$timing")
  rm -f "$timing"
  printf '{"name":"%s","kind":"%s","rows":%d,"bytes":%d,"wall":%s,"cpu":%s,"rss_kb":%d}\n' \
    "$name" "$kind" "$total" "$bytes" "$wall" "$(awk "BEGIN{print $user + $system}")" "$rss" >> "$results"
}

# Before each tool: its target schema dropped, and a CHECKPOINT, so no tool pays for the WAL of
# the one before it.
fresh_pg() { $pg -c "DROP SCHEMA IF EXISTS $1 CASCADE" -c "DROP SCHEMA IF EXISTS sluice CASCADE" -c "CHECKPOINT" >/dev/null 2>&1; }
fresh_my() { $my -e "DROP DATABASE IF EXISTS $1; DROP DATABASE IF EXISTS sluice"; }

# --- the physical limit -------------------------------------------------------------------
export export_dir="$base/export"; mkdir -p "$export_dir"; chmod 777 "$export_dir"
read_all() { for t in $(seq 1 "$tables"); do $my --quick -N -e "SELECT * FROM sbtest.sbtest$t" > /dev/null; done; }
measure "limit: source full read (mariadb --quick)" limit-read read_all
for t in $(seq 1 "$tables"); do
  $my -e "SELECT * FROM sbtest.sbtest$t INTO OUTFILE '$export_dir/sbtest$t.tsv'"
done
fresh_pg limit_pg
$pg -c "CREATE SCHEMA limit_pg" >/dev/null
for t in $(seq 1 "$tables"); do
  $pg -c "CREATE TABLE limit_pg.sbtest$t (id integer NOT NULL, k integer NOT NULL, c varchar(120) NOT NULL, pad varchar(60) NOT NULL, PRIMARY KEY (id))" >/dev/null
done
# The same table sluice makes: primary key before the load, sysbench's index on k after it.
copy_all() {
  for t in $(seq 1 "$tables"); do
    $pg -c "\\copy limit_pg.sbtest$t FROM '$export_dir/sbtest$t.tsv'" -c "CREATE INDEX ON limit_pg.sbtest$t (k)"
  done
}
measure "limit: PostgreSQL COPY from a file" limit-pg copy_all
# Every copy is dropped as soon as it is measured, so its background work (autovacuum) does
# not run under the next tool.
fresh_pg limit_pg

# --- MySQL -> PostgreSQL --------------------------------------------------------------------
# job NAME TYPE URL NAMESPACE [DATABASE]: a job file copying DATABASE (sbtest) into a target.
job() {
  local target="  url: $3
  namespace: $4"
  if [[ "$2" == parquet ]]; then target="  path: $base/lake-$1"; fi
  cat > "$base/$1.yaml" <<EOF
name: $1
source:
  type: mysql
  url: $mysql_url
  tables: ["${5:-sbtest}.*"]
target:
  type: $2
$target
parallelism: 4
EOF
  echo "$base/$1.yaml"
}
fresh_pg sluice_pg
measure "sluice MySQL→PostgreSQL" pg "$sluice" run "$(job bench-pg postgres "$postgres_url" sluice_pg)" --state-dir "$base/state-pg"
if [[ -n "$baseline" ]]; then
  fresh_pg sluice_pg
  measure "sluice (baseline) MySQL→PostgreSQL" pg "$baseline" run "$(job bench-pg-baseline postgres "$postgres_url" sluice_pg)" --state-dir "$base/state-pg-baseline"
fi
# The same copy through three transforms (a computed column, a filter that keeps every row, a
# mask): the transform stage's cost against the plain copy above.
fresh_pg sluice_pg
transformed=$(job bench-pg-transform postgres "$postgres_url" sluice_pg)
cat >> "$transformed" <<'EOF'
transform:
  - source_table: "sbtest\\..*"
    projection: "id, k, upper(c) AS c, pad"
    filter: "id > 0"
    mask: {pad: truncate(30)}
EOF
measure "sluice MySQL→PostgreSQL, 3 transforms" pg "$sluice" run "$transformed" --state-dir "$base/state-pg-transform"
# Both servers keep their data on tmpfs: each copy is dropped once measured.
fresh_pg sluice_pg
fresh_pg sling_pg
sling_pg() {
  for t in $(seq 1 "$tables"); do
    MYSQL="mysql://sluice:$SLUICE_TEST_PASSWORD@127.0.0.1:$my_port/sbtest" PG="postgresql://sluice:$SLUICE_TEST_PASSWORD@127.0.0.1:$pg_port/sluice?sslmode=disable" \
      "$sling" run --src-conn MYSQL --src-stream "sbtest.sbtest$t" --tgt-conn PG --tgt-object "sling_pg.sbtest$t" --mode full-refresh
  done
}
measure "Sling 1.4.11 MySQL→PostgreSQL" pg sling_pg
fresh_pg sling_pg
$pg -c "DROP SCHEMA IF EXISTS sbtest CASCADE" >/dev/null
# One table per pgloader run: loading all four at once exhausts its 1 GiB heap here.
pgloader_pg() {
  for t in $(seq 1 "$tables"); do
    cat > "$base/pgloader-$t.load" <<LOAD
LOAD DATABASE
  FROM mysql://sluice:$SLUICE_TEST_PASSWORD@127.0.0.1:$my_port/sbtest
  INTO postgresql://sluice:$SLUICE_TEST_PASSWORD@127.0.0.1:$pg_port/sluice
  WITH prefetch rows = 10000
  INCLUDING ONLY TABLE NAMES MATCHING 'sbtest$t';
LOAD
    pgloader --quiet "$base/pgloader-$t.load"
  done
}
measure "pgloader MySQL→PostgreSQL" pg pgloader_pg
$pg -c "DROP SCHEMA IF EXISTS sbtest CASCADE" >/dev/null

# --- MySQL -> Parquet -----------------------------------------------------------------------
measure "sluice MySQL→Parquet" parquet "$sluice" run "$(job bench-parquet parquet "" "")" --state-dir "$base/state-parquet"
rm -rf "$base/lake-bench-parquet"

# --- MySQL -> MySQL -------------------------------------------------------------------------
# The MariaDB limit is measured here, after every PostgreSQL target: writing 4 M rows leaves
# MariaDB flushing pages for a while, under whatever runs next.
fresh_my limit_my
$my -e "CREATE DATABASE limit_my"
for t in $(seq 1 "$tables"); do $my -e "CREATE TABLE limit_my.sbtest$t LIKE sbtest.sbtest$t"; done
load_all() { for t in $(seq 1 "$tables"); do $my --local-infile=1 -e "LOAD DATA LOCAL INFILE '$export_dir/sbtest$t.tsv' INTO TABLE limit_my.sbtest$t"; done; }
measure "limit: MariaDB LOAD DATA from a file" limit-my load_all
fresh_my limit_my
fresh_my sluice_my
measure "sluice MySQL→MySQL" my "$sluice" run "$(job bench-my mysql "$mysql_url" sluice_my)" --state-dir "$base/state-my"
if [[ -n "$baseline" ]]; then
  fresh_my sluice_my
  measure "sluice (baseline) MySQL→MySQL" my "$baseline" run "$(job bench-my-baseline mysql "$mysql_url" sluice_my)" --state-dir "$base/state-my-baseline"
fi
fresh_my sluice_my; rm -rf "$export_dir"
fresh_my dump_my
dump_pipe() {
  $my -e "CREATE DATABASE dump_my"
  mariadb-dump --no-defaults -uroot -S "$base/mariadb/mysql.sock" --single-transaction --quick sbtest | $my dump_my
}
measure "mariadb-dump | mariadb" my dump_pipe
fresh_my dump_my
fresh_my mydumper_my
mydumper_pipe() {
  rm -rf "$base/mydumper"
  mydumper -h 127.0.0.1 -P "$my_port" -u sluice -p "$SLUICE_TEST_PASSWORD" -B sbtest -o "$base/mydumper" -t 4 >/dev/null
  myloader -h 127.0.0.1 -P "$my_port" -u sluice -p "$SLUICE_TEST_PASSWORD" -d "$base/mydumper" -B mydumper_my -t 4 -o >/dev/null
}
measure "mydumper + myloader (4 threads)" my mydumper_pipe
fresh_my mydumper_my; rm -rf "$base/mydumper"

# --- the wide table: every common type -----------------------------------------------------
wide_rows=$((rows / 2))
$my -e "CREATE DATABASE wide; USE wide; CREATE TABLE wide.items (
  id BIGINT UNSIGNED PRIMARY KEY, amount DECIMAL(20,6), price DECIMAL(10,2), qty INT, ratio DOUBLE, score FLOAT,
  created DATETIME(6), updated TIMESTAMP(6) NULL, birthday DATE, duration TIME(3), title VARCHAR(200), body TEXT,
  tags JSON, status ENUM('new','paid','shipped'), flags SET('a','b','c'), payload BLOB, active TINYINT(1), code CHAR(8),
  token BINARY(16));
  INSERT INTO wide.items SELECT seq, seq * 1.000001, (seq % 100000) / 100, seq % 1000, seq / 7, seq / 3,
    '2024-01-01' + INTERVAL seq SECOND + INTERVAL (seq % 1000000) MICROSECOND, FROM_UNIXTIME(1700000000 + seq),
    '1990-01-01' + INTERVAL (seq % 10000) DAY, SEC_TO_TIME(seq % 300000), CONCAT('Item ', seq, ' — naïve café ✓'),
    REPEAT(CONCAT('body ', seq, ' '), 1 + seq % 20), CONCAT('{\"n\": ', seq, ', \"tags\": [\"x\", \"y\"]}'),
    ELT(1 + seq % 3, 'new', 'paid', 'shipped'), ELT(1 + seq % 4, '', 'a', 'a,b', 'a,b,c'), UNHEX(SHA1(seq)),
    seq % 2, LPAD(seq % 99999999, 8, '0'), UNHEX(MD5(seq)) FROM seq_1_to_$wide_rows"
$my -e "ANALYZE TABLE wide.items" >/dev/null
wide_bytes=$($my -N -e "SELECT data_length + index_length FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'wide'")
total_sbtest=$total; bytes_sbtest=$bytes
total=$wide_rows; bytes=$wide_bytes
measure "wide: sluice MySQL→PostgreSQL" wide "$sluice" run "$(job wide-pg postgres "$postgres_url" wide_pg wide)" --state-dir "$base/state-wide-pg"
measure "wide: sluice MySQL→MySQL" wide "$sluice" run "$(job wide-my mysql "$mysql_url" wide_my wide)" --state-dir "$base/state-wide-my"
measure "wide: sluice MySQL→Parquet" wide "$sluice" run "$(job wide-parquet parquet "" "" wide)" --state-dir "$base/state-wide-parquet"
measure "wide: Sling 1.4.11 MySQL→PostgreSQL" wide env MYSQL="mysql://sluice:$SLUICE_TEST_PASSWORD@127.0.0.1:$my_port/wide" \
  PG="postgresql://sluice:$SLUICE_TEST_PASSWORD@127.0.0.1:$pg_port/sluice?sslmode=disable" \
  "$sling" run --src-conn MYSQL --src-stream wide.items --tgt-conn PG --tgt-object sling_wide.items --mode full-refresh
total=$total_sbtest; bytes=$bytes_sbtest

# --- report ---------------------------------------------------------------------------------
python3 - "$results" "$tables" "$rows" <<'PY' | tee "$out/snapshot-$stamp.md"
import json, sys

def cell(text):
    """A Markdown table cell: a pipe in a tool's name (`mariadb-dump | mariadb`) is escaped."""
    return str(text).replace("|", "\\|")


runs = [json.loads(line) for line in open(sys.argv[1])]
by = {run["name"]: run for run in runs}
limit_read = next((r["wall"] for r in runs if r["kind"] == "limit-read" and "failed" not in r), None)
limits = {"pg": next((r["wall"] for r in runs if r["kind"] == "limit-pg" and "failed" not in r), None),
          "my": next((r["wall"] for r in runs if r["kind"] == "limit-my" and "failed" not in r), None)}
print(f"{sys.argv[2]} × {int(sys.argv[3]):,} sysbench rows\n")
for kind, title in (("pg", "MySQL → PostgreSQL"), ("my", "MySQL → MySQL"), ("parquet", "MySQL → Parquet"), ("wide", "wide all-types table")):
    # The snapshot issue's physical limit: the larger of the source's read and the target's
    # load. The performance protocol's is their sum (both share the CPU); both are shown.
    physical = max(limit_read, limits[kind]) if limit_read and limits.get(kind) else None
    summed = limit_read + limits[kind] if physical else None
    sluice = next((r for r in runs if r["kind"] == kind and "sluice" in r["name"] and "failed" not in r and (kind != "wide" or "PostgreSQL" in r["name"])), None)
    print(f"### {title}\n")
    print(f"physical limit: {physical:.2f} s (the larger of source read {limit_read:.2f} s and target load {limits[kind]:.2f} s); read + load: {summed:.2f} s\n" if physical else "")
    if kind == "wide":
        print(f"{next(r['rows'] for r in runs if r['kind'] == 'wide'):,} rows of 19 columns (decimals, date-times, JSON, text, blobs, enums)\n")
    print("| tool | × sluice's time | × physical limit | × (read + load) | wall s | rows/s | MB/s | tool CPU s | rows per tool CPU-s | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in (r for r in runs if r["kind"] == kind and "failed" in r):
        print(f"| {cell(r['name'])} | failed: {cell(r['failed'])} | | | | | | | | |")
    for r in sorted((r for r in runs if r["kind"] == kind and "failed" not in r), key=lambda r: r["wall"]):
        vs = f"{r['wall'] / sluice['wall']:.2f}" if sluice else "-"
        vl = f"{r['wall'] / physical:.2f}" if physical else "-"
        vs_summed = f"{r['wall'] / summed:.2f}" if summed else "-"
        cpu = r["cpu"] or 0.001
        print(f"| {cell(r['name'])} | {vs} | {vl} | {vs_summed} | {r['wall']:.2f} | {r['rows'] / r['wall']:,.0f} | {r['bytes'] / r['wall'] / 1e6:,.1f} | {r['cpu']:.2f} | {r['rows'] / cpu:,.0f} | {r['rss_kb'] / 1024:,.0f} |")
    print()
PY
