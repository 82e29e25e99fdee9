#!/usr/bin/env bash
# Lake benchmark (the protocol at the top of BENCHMARKS.md): MySQL → Delta Lake and Apache
# Iceberg, in one run on the same rows.
#
#   bench/lake.sh [--format delta|iceberg] [--rows 1000000] [--backlog-seconds 60] [--rate 1250]
#                 [--latency-seconds 60] [--commit-interval 5] [--sluice BINARY] [--out bench/results]
#
# 1. Snapshot of --rows sysbench rows (one table) from a hermetic MariaDB, side by side with the
#    physical limit of the read (`mariadb --quick` to /dev/null), a plain Arrow → Parquet write
#    of the same rows (pyarrow reading their TSV export and writing one snappy Parquet file: no
#    database, no log), sluice into Parquet, into Delta (data files, statistics, log) and into
#    Iceberg (data files, manifests, a SQL catalog on SQLite).
# 2. CDC backlog: a snapshot+cdc job into the --format (Delta by default) is brought to the
#    source's position and stopped; sysbench oltp_write_only runs at saturation for
#    --backlog-seconds; the job is started again and timed until the position its target records
#    reaches the source's (rows applied from its summary).
# 3. Freshness: with the job caught up, sysbench runs at --rate transactions/s (4 row changes
#    each: 5,000 rows/s at the default) for --latency-seconds; p50/p99 from source commit to the
#    target's commit come from sluice's summary (histogram bucket bounds).
# Each run is checked: the table read by Python's deltalake (Delta) or pyiceberg (Iceberg) has the
# source's count and sum(k). CPU is user+sys of the tool's process tree (/usr/bin/time), servers
# excluded.
set -euo pipefail
cd "$(dirname "$0")/.."

commit_interval=5
format=delta
arguments=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --format) format=$2; shift 2 ;;
    *) arguments+=("$1"); shift ;;
  esac
done
[[ $format == delta || $format == iceberg ]] || { echo "$0: --format is delta or iceberg" >&2; exit 2; }
# The options, the cleanup, the setup, log, measure, source_check, the cdc job's start and stop,
# stream_phases.
source bench/sysbench_stream.sh
stream_bench_options "${arguments[@]}"
stream_bench_setup "lake-$format" delta iceberg
# The Python reader (deltalake, pyarrow) comes from the project's installer.
python=${SLUICE_TEST_LAKE_VENV:-/tmp/sluice-lake-venv}/bin/python

# job NAME MODE TYPE DIRECTORY [TARGET LINES]: a job file; an Iceberg target's catalog is
# DIRECTORY/catalog.db and its warehouse DIRECTORY.
job() {
  local target="  path: $4"
  [[ $3 != iceberg ]] || target="  catalog: {type: sql, uri: \"sqlite:///$4/catalog.db\", name: lake}
  warehouse: $4"
  mkdir -p "$4"
  cat > "$base/$1.yaml" <<EOF
name: $1
mode: $2
source:
  type: mysql
  url: $mysql_url
  tables: ["sbtest.*"]
target:
  type: $3
$target
${5:-}parallelism: 4
EOF
  echo "$base/$1.yaml"
}

# delta_check TABLE: "count sum(k)" of a Delta table, read by Python's deltalake.
delta_check() {
  "$python" -c '
import sys, os, deltalake, pyarrow.compute as pc
t = deltalake.DeltaTable(sys.argv[1]).to_pyarrow_table(columns=["k"])
print(t.num_rows, pc.sum(t.column("k")).as_py()); sys.stdout.flush(); os._exit(0)' "$1"
}

# iceberg_check DIRECTORY: "count sum(k)" of the Iceberg table sbtest.sbtest1, read by pyiceberg.
iceberg_check() {
  "$python" -c '
import sys, pyarrow.compute as pc
from pyiceberg.catalog.sql import SqlCatalog
t = SqlCatalog("lake", uri="sqlite:///" + sys.argv[1] + "/catalog.db").load_table("sbtest.sbtest1").scan(selected_fields=("k",)).to_arrow()
print(t.num_rows, pc.sum(t.column("k")).as_py())' "$1"
}

# --- 1. snapshot -----------------------------------------------------------------------------
measure "limit: source full read (mariadb --quick)" bash -c "$my --quick -N -e 'SELECT * FROM sbtest.sbtest1' >/dev/null"
export_dir="$base/export"; mkdir -p "$export_dir"; chmod 777 "$export_dir"
$my -e "SELECT * FROM sbtest.sbtest1 INTO OUTFILE '$export_dir/rows.tsv'"
measure "plain Arrow → Parquet (pyarrow, TSV file → Parquet)" "$python" -c '
import sys, pyarrow as pa, pyarrow.csv as csv, pyarrow.parquet as pq
schema = pa.schema([("id", pa.int32()), ("k", pa.int32()), ("c", pa.string()), ("pad", pa.string())])
table = csv.read_csv(sys.argv[1], read_options=csv.ReadOptions(column_names=schema.names),
    parse_options=csv.ParseOptions(delimiter="\t", quote_char=False), convert_options=csv.ConvertOptions(column_types=schema))
pq.write_table(table, sys.argv[2], compression="snappy", row_group_size=131072)' "$export_dir/rows.tsv" "$base/plain.parquet"
rm -rf "$export_dir"
measure "sluice MySQL→Parquet" "$sluice" run "$(job bench-parquet snapshot parquet "$base/parquet")" --state-dir "$base/state-parquet"
measure "sluice MySQL→Delta" "$sluice" run "$(job bench-delta snapshot delta "$base/delta")" --state-dir "$base/state-delta"
[[ $(delta_check "$base/delta/sbtest.sbtest1") == "$(source_check)" ]] || { log "the Delta copy differs from the source"; exit 1; }
measure "sluice MySQL→Iceberg" "$sluice" run "$(job bench-iceberg snapshot iceberg "$base/iceberg")" --state-dir "$base/state-iceberg"
[[ $(iceberg_check "$base/iceberg") == "$(source_check)" ]] || { log "the Iceberg copy differs from the source"; exit 1; }
rm -rf "$base/parquet" "$base/delta" "$base/iceberg" "$base/plain.parquet"

# --- 2. and 3. cdc: backlog catch-up, freshness at a fixed rate -----------------------------------
lake="$base/lake"
cdc_job=$(job bench-cdc snapshot+cdc "$format" "$lake" "  commit_interval_secs: $commit_interval
")
if [[ $format == delta ]]; then
  # stream_position: "sequence offset" of the stream's last decided group, from its journal.
  stream_position() {
    python3 -c '
import json, os, sys
d = sys.argv[1]
names = [int(n[:-5]) for n in os.listdir(d) if n.endswith(".json") and n[:-5].isdigit()] if os.path.isdir(d) else []
if names:
    at = json.load(open(os.path.join(d, "%d.json" % max(names))))["checkpoint"]["position"]["at"]
    print(int(at["file"].rsplit(".", 1)[1]), at["position"])' "$lake/.sluice/bench-cdc/stream"
  }
  stream_phases Delta "delta_check $lake/sbtest.sbtest1"
else
  # stream_position: "sequence offset" of the stream's last group, as the catalog records it.
  stream_position() {
    python3 -c '
import json, sqlite3, sys
try:
    row = sqlite3.connect(sys.argv[1]).execute("SELECT mark FROM sluice_streams WHERE job = ?", ("bench-cdc",)).fetchone()
except sqlite3.OperationalError:
    row = None
if row:
    at = json.loads(row[0])["checkpoint"]["position"]["at"]
    print(int(at["file"].rsplit(".", 1)[1]), at["position"])' "$lake/catalog.db"
  }
  stream_phases Iceberg "iceberg_check $lake"
fi
cp "$base/backlog.log" "$out/lake-$format-$stamp-backlog.log"

# --- results -------------------------------------------------------------------------------------
{
python3 - "$results" <<'PY'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
snapshots = [r for r in records if "wall" in r]
read = next(r for r in snapshots if r["name"].startswith("limit"))
plain = next(r for r in snapshots if r["name"].startswith("plain"))
print("| snapshot | wall s | ×(read + plain Arrow→Parquet) | rows/s | rows per CPU-s | peak RSS MB |")
print("|---|---:|---:|---:|---:|---:|")
for r in snapshots:
    print(f"| {r['name']} | {r['wall']:.2f} | {r['wall'] / (read['wall'] + plain['wall']):.2f} | {r['rows'] / r['wall']:,.0f} | "
          f"{r['rows'] / max(r['cpu'], 0.01):,.0f} | {r['rss_kb'] // 1024} |")
PY
  print_stream_phases
} | tee "${results%.jsonl}.md"
