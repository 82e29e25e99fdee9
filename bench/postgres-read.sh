#!/usr/bin/env bash
# The source server's CPU for sluice's snapshot read (its split statement: every column ::text,
# a key range, ORDER BY the key) against COPY and its variants, on one hermetic PostgreSQL, 1 M
# rows of bench/postgres.sh's table, two runs each (BENCHMARKS.md, the PostgreSQL source section).
#
#   bench/postgres-read.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export SLUICE_TEST_PASSWORD=bench-pw
base=$(mktemp -d /dev/shm/readexp.XXXXXX); chmod 755 "$base"
trap 'scripts/testdb stop postgres "$base/pg" >/dev/null 2>&1; rm -rf "$base"' EXIT
scripts/testdb start postgres "$base/pg" >/dev/null
port=$(cat "$base/pg/port"); pid=$(cat "$base/pg/pid")
q() { psql -X -q -At -h "$base/pg" -p "$port" -U postgres -d sluice "$@"; }
clk=$(getconf CLK_TCK)
descendants() { local c; for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do echo "$c"; descendants "$c"; done; }
cpu() { local p t=0 s f; for p in "$pid" $(descendants "$pid"); do { read -r s <"/proc/$p/stat"; } 2>/dev/null || continue; read -ra f <<<"${s##*) }"; t=$((t+f[11]+f[12]+f[13]+f[14])); done; echo $t; }
q -c "CREATE TABLE public.t (id bigint PRIMARY KEY, a int NOT NULL, b int NOT NULL, c text NOT NULL, filler character(84))" \
  -c "INSERT INTO public.t SELECT g, (g * 7919) % 100000, (g * 104729) % 1000, left(md5(g::text) || md5((g + 1)::text), 60), '' FROM generate_series(1::bigint, 1000000) g" \
  -c "VACUUM ANALYZE public.t" -c "CHECKPOINT"
q -c "SELECT count(*) FROM public.t" >/dev/null
split_sql() {
  echo "PREPARE s(text, text) AS SELECT $1 FROM public.t AS row WHERE ROW(row.id) > ROW(\$1::text::bigint) AND ROW(row.id) <= ROW(\$2::text::bigint) ORDER BY row.id;"
  for i in $(seq 0 9); do echo "EXECUTE s('$((i * 100000))', '$(((i + 1) * 100000))');"; done
}
texts="row.id::text, row.a::text, row.b::text, row.c::text, row.filler::text"
measure() {
  local name=$1; shift
  for run in 1 2; do
    local c0 t0 c1 t1
    c0=$(cpu); t0=$(date +%s.%N)
    "$@" >/dev/null
    t1=$(date +%s.%N)
    sleep 0.3  # the client's backend exits and is reaped by the postmaster: its CPU counts then
    c1=$(cpu)
    awk -v n="$name" -v r=$run "BEGIN{printf \"%-75s run %d: wall %.2f s, server CPU %.2f s\n\", n, r, $t1 - $t0, ($c1 - $c0) / $clk}"
  done
}
measure "COPY public.t TO STDOUT" q -c "COPY public.t TO STDOUT"
measure "COPY (SELECT <cols>::text ... ORDER BY id) TO STDOUT" q -c "COPY (SELECT $texts FROM public.t AS row ORDER BY row.id) TO STDOUT"
split_sql "$texts" >"$base/split-text.sql"; split_sql "row.*" >"$base/split-plain.sql"
measure "COPY (SELECT * ... ORDER BY id) TO STDOUT" q -c "COPY (SELECT * FROM public.t AS row ORDER BY row.id) TO STDOUT"
measure "COPY (SELECT <cols>::text ..., no ORDER BY) TO STDOUT" q -c "COPY (SELECT $texts FROM public.t AS row) TO STDOUT"
measure "10 x EXECUTE split (sluice's statement: ::text, range, ORDER BY key)" q -f "$base/split-text.sql"
measure "10 x EXECUTE split, plain columns (no ::text)" q -f "$base/split-plain.sql"
measure "SELECT * FROM t (one statement, no ORDER BY)" q -c "SELECT * FROM public.t"
echo "plan of a split (generic plan):"
q <<SQL
$(split_sql "$texts" | head -1)
SET plan_cache_mode = force_generic_plan;
EXPLAIN EXECUTE s('0', '100000');
SQL
