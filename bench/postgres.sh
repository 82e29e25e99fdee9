#!/usr/bin/env bash
# PostgreSQL source benchmark: a snapshot and a CDC backlog, PostgreSQL → PostgreSQL, sluice
# next to the hand-made limit and the peers, in the same run, on the same hermetic servers.
#
#   bench/postgres.sh [--rows 1000000] [--cdc-rows 1000000] [--changes 200000] [--repeat 2]
#                     [--latency-seconds 30] [--rate 1250] [--only snapshot|cdc]
#                     [--apply-parallelism N (the target's default)] [--keyless]
#                     [--sluice PATH] [--out bench/results] [--logs DIR]
#
# Servers (scripts/testdb, tmpfs, PostgreSQL 15, wal_level=logical): `src` (the source
# databases), `dst` (every snapshot target and sluice's CDC target), `native` (the native
# logical-replication subscriber, so its apply worker's CPU is that server's alone).
#
# 1. Snapshot of a pgbench-like table (id bigint primary key, a int, b int, c text of 60
#    characters, filler character(84)) of --rows rows, from database `bench` on `src` into a
#    fresh database on `dst` per run (dropped once measured, then CHECKPOINT):
#    - limit: `psql -c "COPY t TO STDOUT" | psql -c "COPY t FROM STDIN"` into a table without
#      keys, then `ALTER TABLE t ADD PRIMARY KEY (id)` (the same end state: the key built);
#    - sluice `mode: snapshot`, create_tables, parallelism 4 (the default) and 2, and 4 into a
#      table made beforehand with its primary key (sluice then loads into the key, as it did
#      before it built a created table's key after the copy);
#    - pgcopydb clone --table-jobs 2 --index-jobs 2, filtered to the table (it also dumps and
#      restores the table's DDL and VACUUM ANALYZEs it), whole-table and split in 2 parts.
#    With --keyless the snapshot's table has no primary key (the pipe adds none; sluice reads it
#    as one task, by several connections over page ranges; the keyed-table run is left out).
#    Each is timed by /usr/bin/time (wall, user+sys CPU of the tool's process tree, peak RSS);
#    the servers' CPU over the run comes from /proc (postmaster trees, reaped backends included).
#    Each target is checked against the source: count, sums of a, b, hashes of c and filler,
#    a primary key present.
# 2. CDC backlog: table t of --cdc-rows rows in database `cdc` on `src`. sluice's job is brought
#    to the start by `mode: snapshot+cdc` run until its stream checkpoint exists, then stopped
#    (SIGTERM); the native subscriber's table is loaded by COPY, then CREATE SUBSCRIPTION ...
#    WITH (create_slot = true, copy_data = false, enabled = false). With both stopped, a
#    procedure makes --changes row changes in transactions of 4 (2 updates of random keys, an
#    insert, a delete), committing each. Then each in turn is started and timed until its
#    position reaches the source's pg_current_wal_lsn() taken after the backlog: sluice's
#    stored stream checkpoint (`position->'at'->>'lsn'`, job restarted with `mode: cdc`), the
#    native slot's confirmed_flush_lsn (ALTER SUBSCRIPTION ... ENABLE). Then stopped again and
#    checked against the source. --repeat rounds, each on a fresh backlog continuing the last.
#    The same backlog also goes to a MySQL target (a hermetic MariaDB, `my`): a second sluice
#    job with a slot of its own, brought to the start and timed the same way (its stored
#    checkpoint in the MariaDB), with its peak memory; checked by count, sums and an md5-based
#    sum of c computed alike by both servers.
# 3. Latency at a fixed rate (--latency-seconds, 0 skips it): with the replicator caught up,
#    pgbench runs the same 4-change transaction at --rate transactions/s. sluice's p50/p99 come
#    from its summary JSON (histogram bucket bounds; from a transaction's arrival at sluice, its
#    source commit second being whole, to its target commit); the native subscriber's from the
#    source's pg_stat_replication.replay_lag sampled every 0.5 s (its commit → the subscriber's
#    confirmation of its apply), as a percentile of the samples.
#
# Prints a Markdown table and writes it, with the raw figures as JSON lines, under --out.
# Peers missing on the machine are installed (apt: pgcopydb, time).
set -euo pipefail
cd "$(dirname "$0")/.."
command_line="bench/postgres.sh $*"

rows=1000000
cdc_rows=1000000
changes=200000
repeat=2
latency_seconds=30
rate=1250
only=""
sluice=""
out=bench/results
logs=""
timeout=1800
apply_parallelism=""
keyless=false
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rows) rows=$2; shift 2 ;;
    --cdc-rows) cdc_rows=$2; shift 2 ;;
    --changes) changes=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --latency-seconds) latency_seconds=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --sluice) sluice=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --logs) logs=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --apply-parallelism) apply_parallelism=$2; shift 2 ;;
    --keyless) keyless=true; shift ;;
    *) echo "usage: $0 [--rows N] [--cdc-rows N] [--changes N] [--repeat N] [--latency-seconds S] [--rate TPS] [--only snapshot|cdc]" \
         "[--apply-parallelism N] [--keyless]" \
         "[--sluice PATH (prebuilt; skips the build)] [--out DIR] [--logs DIR] [--timeout S]" >&2; exit 2 ;;
  esac
done
wanted() { [[ -z "$only" || "$1" == "$only" ]]; }
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
tx=$((changes / 4))
if ((cdc_rows / 2 < tx * (repeat + 2) + rate * latency_seconds * 11 / 10)); then
  echo "--cdc-rows must be at least 2 × (--changes / 4 × (--repeat + 2) + --rate × --latency-seconds) (the deletes walk down from the top key)" >&2; exit 2
fi

# --- peers ------------------------------------------------------------------------------------
scripts/testdb install >/dev/null
missing=()
command -v pgcopydb >/dev/null || missing+=(pgcopydb)
[[ -x /usr/bin/time ]] || missing+=(time)
if [[ ${#missing[@]} -gt 0 ]]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null || log "could not install ${missing[*]}"
fi
pg_bin=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -1)
export PATH="$pg_bin:$PATH"   # pgcopydb runs pg_dump and pg_restore
export SLUICE_TEST_PASSWORD=bench-pw
if [[ -z "$sluice" ]]; then
  cargo build --release --quiet -p sluice --bin sluice
  sluice=${CARGO_TARGET_DIR:-$PWD/target}/release/sluice
fi
sluice=$(realpath "$sluice")
# shellcheck source=bench/measure.sh
source bench/measure.sh

base=$(mktemp -d /dev/shm/sluice-pgbench.XXXXXX)
chmod 755 "$base"
servers=()
bg_pids=()
cleanup() {
  local pid server
  for pid in "${bg_pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  if [[ -n "$logs" ]]; then
    mkdir -p "$logs"
    cp "$base"/*.log "$base"/*.yaml "$logs"/ 2>/dev/null || true
    for server in "${servers[@]}"; do cp "$base/$server/server.log" "$logs/server-$server.log" 2>/dev/null || true; done
  fi
  for server in "${servers[@]}"; do scripts/testdb stop postgres "$base/$server" >/dev/null 2>&1 || true; done
  scripts/testdb stop mariadb "$base/my" >/dev/null 2>&1 || true
  rm -rf "$base"
}
trap cleanup EXIT
trap 'exit 130' INT TERM


log "starting servers in $base"
for server in src dst native; do
  servers+=("$server")
  url=$(scripts/testdb start postgres "$base/$server"); url=${url#URL=}
  declare "${server}_url=$url"
  declare "${server}_port=$(cat "$base/$server/port")"
done
if wanted cdc; then
  my_url=$(scripts/testdb start mariadb "$base/my"); my_url=${my_url#URL=}
fi
pid_of() { cat "$base/$1/pid"; }
# my SQL...: the MariaDB client as root over the socket, batch output without column names.
my() { mariadb --no-defaults -S "$base/my/mysql.sock" -uroot -N -B "$@"; }
# q SERVER DB SQL...: psql as postgres over the server's socket, unaligned, quiet.
q() { local server=$1 db=$2; shift 2; psql -X -q -At -v ON_ERROR_STOP=1 -h "$base/$server" -p "$(cat "$base/$server/port")" -U postgres -d "$db" "$@"; }
# db_url SERVER DB: sluice's URL of database DB on SERVER.
db_url() { local url=${1}_url; echo "${!url%/sluice}/$2"; }
conninfo() { echo "host=127.0.0.1 port=$(cat "$base/$1/port") user=sluice password=$SLUICE_TEST_PASSWORD dbname=$2"; }

mkdir -p "$out"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
results="$out/postgres-$stamp.jsonl"
: >"$results"
emit() { echo "$1" >>"$results"; }
emit "{\"name\":\"run\",\"command\":\"$(json_str "$command_line")\",\"sluice_binary\":\"$(sha256sum "$sluice" | cut -c1-12) $(date -u -r "$sluice" +%FT%TZ)\",\"rows\":$rows,\"cdc_rows\":$cdc_rows,\"changes\":$changes,\"repeat\":$repeat,\"load\":\"$(cut -d' ' -f1-3 /proc/loadavg)\",\"postgres\":\"$("$pg_bin/postgres" --version | awk '{print $3}')\",\"pgcopydb\":\"$(pgcopydb --version 2>/dev/null | awk '/pgcopydb version/ {print $3}')\"}"

# The pgbench-like table, rows 1..N. c: 60 characters; filler as pgbench_accounts'.
table_ddl="CREATE TABLE public.t (id bigint PRIMARY KEY, a int NOT NULL, b int NOT NULL, c text NOT NULL, filler character(84))"
# The snapshot's source table: the same, without its key with --keyless.
snapshot_ddl=$table_ddl
$keyless && snapshot_ddl=${table_ddl/ PRIMARY KEY/}
fill_sql() { echo "INSERT INTO public.t SELECT g, (g * 7919) % 100000, (g * 104729) % 1000, left(md5(g::text) || md5((g + 1)::text), 60), '' FROM generate_series(1::bigint, $1) g"; }
# checksum SERVER DB: what every copy must match.
checksum() {
  q "$1" "$2" -c "SELECT count(*), coalesce(sum(a), 0), coalesce(sum(b), 0), coalesce(sum(hashtext(c)::bigint), 0), coalesce(sum(hashtext(filler::text)::bigint), 0),
    (SELECT count(*) FROM pg_index WHERE indrelid = 'public.t'::regclass AND indisprimary) FROM public.t" 2>&1 || true
}

# portable_checksum SERVER DB | my: count, sums of a and b, and the sum of the first 32 bits
# of md5(c), which PostgreSQL and MariaDB compute alike (filler, blank padding, is left out:
# MariaDB strips a CHAR's trailing blanks).
portable_checksum() {
  if [[ $1 == my ]]; then
    my -e "SELECT count(*), coalesce(sum(a), 0), coalesce(sum(b), 0), coalesce(sum(cast(conv(substr(md5(c), 1, 8), 16, 10) AS UNSIGNED)), 0) FROM public.t" 2>&1 | tr '\t' '|' || true
  else
    q "$1" "$2" -c "SELECT count(*), coalesce(sum(a), 0), coalesce(sum(b), 0), coalesce(sum(('x' || substr(md5(c), 1, 8))::bit(32)::bigint), 0) FROM public.t" 2>&1 || true
  fi
}

# ============================== 1. snapshot ====================================================
# measure NAME KIND COMMAND...: times the command (tool tree by /usr/bin/time, servers from
# /proc), checks the target database `$target_db`, appends a JSON line.
measure() {
  local name=$1 kind=$2 run=$3
  shift 3
  log "snapshot: $name (run $run)"
  local timing s0 d0 scpu dcpu
  timing=$(mktemp)
  s0=$(tree_cpu "$(pid_of src)"); d0=$(tree_cpu "$(pid_of dst)")
  if ! nice -n 0 /usr/bin/time -f "%e %U %S %M" -o "$timing" "$@" >"$base/$kind-$run.log" 2>&1; then
    log "$name failed:"; tail -5 "$base/$kind-$run.log" >&2; rm -f "$timing"
    emit "{\"name\":\"$name\",\"kind\":\"$kind\",\"phase\":\"snapshot\",\"run\":$run,\"rows\":$rows,\"failed\":\"$(json_str "$(grep -v '^\s*$' "$base/$kind-$run.log" | grep -v 'Command exited' | tail -1)")\"}"
    return
  fi
  scpu=$(sub "$(tree_cpu "$(pid_of src)")" "$s0"); dcpu=$(sub "$(tree_cpu "$(pid_of dst)")" "$d0")
  local wall user system rss got ok=false
  read -r wall user system rss < <(tail -1 "$timing")
  rm -f "$timing"
  got=$(checksum dst "$target_db")
  [[ "$got" == "$want" ]] && ok=true || log "MISMATCH: source [$want] target [$got]"
  emit "{\"name\":\"$name\",\"kind\":\"$kind\",\"phase\":\"snapshot\",\"run\":$run,\"rows\":$rows,\"wall\":$wall,\"cpu\":$(awk "BEGIN{print $user + $system}"),\"rss_kb\":$rss,\"source_cpu\":$scpu,\"target_cpu\":$dcpu,\"verified\":$ok}"
  log "  $wall s, tool CPU $(awk "BEGIN{print $user + $system}") s, servers $scpu + $dcpu s, verified $ok"
}
fresh_target() {
  target_db=$1
  q dst postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $1" -c "CREATE DATABASE $1 OWNER sluice" -c "CHECKPOINT" >/dev/null
}
drop_target() { q dst postgres -c "DROP DATABASE IF EXISTS $1" -c "CHECKPOINT" >/dev/null; }

pipe_copy() {
  psql -X -q -h "$base/dst" -p "$dst_port" -U postgres -d pipe -v ON_ERROR_STOP=1 \
    -c "CREATE TABLE public.t (id bigint NOT NULL, a int NOT NULL, b int NOT NULL, c text NOT NULL, filler character(84))"
  psql -X -q -h "$base/src" -p "$src_port" -U postgres -d bench -v ON_ERROR_STOP=1 -c "COPY public.t TO STDOUT" \
    | psql -X -q -h "$base/dst" -p "$dst_port" -U postgres -d pipe -v ON_ERROR_STOP=1 -c "COPY public.t FROM STDIN"
  [[ $keyless == true ]] ||
    psql -X -q -h "$base/dst" -p "$dst_port" -U postgres -d pipe -v ON_ERROR_STOP=1 -c "ALTER TABLE public.t ADD PRIMARY KEY (id)"
}
export base src_port dst_port keyless
export -f pipe_copy

snapshot_job() {
  local name=$1 parallelism=$2
  cat >"$base/$name.yaml" <<EOF
name: $name
mode: snapshot
source:
  type: postgres
  url: $(db_url src bench)
  tables: ["public.t"]
target:
  type: postgres
  url: $(db_url dst "${name//-/_}")
  create_tables: true
${parallelism:+parallelism: $parallelism}
EOF
  echo "$base/$name.yaml"
}
pgcopydb_filters=$base/pgcopydb-filters.ini
printf '[include-only-table]\npublic.t\n' >"$pgcopydb_filters"

# run_tool TOOL RUN: one measured run of TOOL into a fresh target database.
run_tool() {
  local tool=$1 run=$2
  case $tool in
    pipe)
      fresh_target pipe
      measure "limit: psql COPY | psql COPY$($keyless || echo ", then ADD PRIMARY KEY")" pipe "$run" bash -c pipe_copy
      drop_target pipe ;;
    sluice4|sluice2)
      local p=${tool#sluice} name=bench-snap-p${tool#sluice}
      fresh_target "${name//-/_}"
      rm -rf "$base/state-$name"
      measure "sluice PostgreSQL→PostgreSQL (parallelism $p$([[ $p == 4 ]] && echo ", the default"))" "$tool" "$run" \
        "$sluice" run "$(snapshot_job "$name" "$([[ $p == 4 ]] || echo "$p")")" --state-dir "$base/state-$name"
      drop_target "${name//-/_}" ;;
    sluice4-keyed)
      # As before decision 0065: the table exists with its primary key, which every COPY keeps.
      local name=bench-snap-keyed
      fresh_target "${name//-/_}"
      q dst "${name//-/_}" -c "$table_ddl" -c "ALTER TABLE public.t OWNER TO sluice" >/dev/null
      rm -rf "$base/state-$name"
      measure "sluice, parallelism 4, into a table made beforehand with its primary key" "$tool" "$run" \
        "$sluice" run "$(snapshot_job "$name" "")" --state-dir "$base/state-$name"
      drop_target "${name//-/_}" ;;
    pgcopydb|pgcopydb-split)
      fresh_target pgcopydb
      rm -rf "$base/pgcopydb-work"
      local split=() label="pgcopydb clone --table-jobs 2 --index-jobs 2"
      if [[ $tool == pgcopydb-split ]]; then
        # Same-table concurrency: parts of at most half the table's size, one COPY each.
        split=(--split-tables-larger-than "$(( $(q src bench -c "SELECT pg_table_size('public.t')") / 2 / 1048576 + 1 ))MB")
        label+=" --split-tables-larger-than (2 parts)"
      fi
      measure "$label" "$tool" "$run" pgcopydb clone --source "$(db_url src bench)" --target "$(db_url dst pgcopydb)" \
        --dir "$base/pgcopydb-work" --table-jobs 2 --index-jobs 2 "${split[@]}" --no-owner --no-acl --filters "$pgcopydb_filters"
      drop_target pgcopydb ;;
  esac
}

snapshot_tools=(pipe sluice4 sluice4-keyed sluice2 pgcopydb pgcopydb-split)
$keyless && snapshot_tools=(pipe sluice4 sluice2 pgcopydb pgcopydb-split)
if wanted snapshot; then
  log "snapshot: preparing $rows rows"
  q src postgres -c "CREATE DATABASE bench OWNER sluice" >/dev/null
  q src bench -c "$snapshot_ddl" -c "$(fill_sql "$rows")" -c "VACUUM ANALYZE public.t" -c "CHECKPOINT" >/dev/null
  q src bench -c "SELECT count(*), sum(length(c)) FROM public.t" >/dev/null  # warm the cache
  table_bytes=$(q src bench -c "SELECT pg_table_size('public.t')")
  emit "{\"name\":\"snapshot table\",\"phase\":\"snapshot-table\",\"rows\":$rows,\"table_bytes\":$table_bytes,\"keyless\":$keyless}"
  want=$(checksum src bench)
  # Interleaved rounds: every tool once per round, so the machine's load spreads over all.
  for run in $(seq 1 "$repeat"); do
    for tool in "${snapshot_tools[@]}"; do run_tool "$tool" "$run"; done
  done
  # A tool whose first two runs differ by more than 15 % runs twice more (all runs are kept).
  for tool in "${snapshot_tools[@]}"; do
    spread=$(python3 - "$results" "$tool" <<'PY'
import json, sys
walls = [r["wall"] for r in map(json.loads, open(sys.argv[1])) if r.get("kind") == sys.argv[2] and "wall" in r]
print("yes" if len(walls) >= 2 and max(walls[:2]) > 1.15 * min(walls[:2]) else "no")
PY
)
    if [[ $spread == yes ]]; then
      log "snapshot: $tool's two runs differ by more than 15 %: two more runs"
      run_tool "$tool" $((repeat + 1)); run_tool "$tool" $((repeat + 2))
    fi
  done
  q src postgres -c "DROP DATABASE bench" -c "CHECKPOINT" >/dev/null
fi

# ============================== 2. CDC backlog =================================================
sluice_pid=""
# cdc_job MODE [my]: the job file, into PostgreSQL (`bench-cdc`) or MariaDB (`bench-cdc-my`,
# whose tables land in database `public`, named after the source schema).
cdc_job() {
  local name=bench-cdc target="type: postgres
  url: $(db_url dst cdc_sluice)"
  if [[ ${2:-} == my ]]; then name=bench-cdc-my target="type: mysql
  url: $my_url"; fi
  cat >"$base/$name-$1.yaml" <<EOF
name: $name
mode: $1
source:
  type: postgres
  url: $(db_url src cdc)
  tables: ["public.t"]
target:
  $target
  create_tables: true
${apply_parallelism:+apply_parallelism: $apply_parallelism}
EOF
  echo "$base/$name-$1.yaml"
}
# sluice_start MODE LOG [my]
sluice_start() {
  SLUICE_PROGRESS_SECS=5 nice -n 0 "$sluice" run "$(cdc_job "$1" "${3:-}")" --state-dir "$base/state-cdc${3:+-$3}" --summary-json "$base/$2.json" >"$base/$2.log" 2>&1 &
  sluice_pid=$!
  bg_pids+=("$sluice_pid")
}
sluice_stop() {
  kill -TERM "$sluice_pid" 2>/dev/null || true
  local deadline=$((SECONDS + 60))
  while kill -0 "$sluice_pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
  if kill -0 "$sluice_pid" 2>/dev/null; then log "sluice did not stop in 60 s; SIGKILL"; kill -KILL "$sluice_pid"; fi
  wait "$sluice_pid" 2>/dev/null || true
}
# enable_subscription: ALTER SUBSCRIPTION ... ENABLE, at least 6 s after the previous one: the
# launcher starts a subscription's worker at most once per wal_retrieve_retry_interval (5 s),
# which would otherwise be timed as the subscriber's catch-up.
last_enable=-100
enable_gap() { while ((SECONDS - last_enable < 6)); do sleep 0.2; done; }
enable_subscription() {
  enable_gap
  last_enable=$SECONDS
  q native cdc_native -c "ALTER SUBSCRIPTION bench_sub ENABLE"
}
# writes SERVER DB: the target table's write counters so far, as JSON fields: how the
# replicator applied the changes (UPDATE, HOT or not, or DELETE + INSERT).
writes() {
  sleep 1  # backends report their counters at exit or once a second
  q "$1" "$2" -F, -c "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables WHERE relid = 'public.t'::regclass" |
    awk -F, '{printf "\"target_writes\":{\"ins\":%d,\"upd\":%d,\"hot_upd\":%d,\"del\":%d}", $1, $2, $3, $4}'
}
# lsn_reached AT MARK: AT >= MARK (X/Y LSNs), compared by the source server.
lsn_reached() { [[ -n "$1" ]] && [[ $(q src postgres -c "SELECT '$1'::pg_lsn >= '$2'::pg_lsn") == t ]]; }
sluice_lsn() { q dst cdc_sluice -c "SELECT position->'at'->>'lsn' FROM sluice.checkpoints WHERE job = 'bench-cdc' AND task = 'stream'" 2>/dev/null || true; }
my_lsn() { my -e "SELECT JSON_UNQUOTE(JSON_EXTRACT(position, '$.at.lsn')) FROM sluice.checkpoints WHERE job = 'bench-cdc-my' AND task = 'stream'" 2>/dev/null || true; }
native_lsn() { q src cdc -c "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'bench_sub'"; }
# wait_lsn WHAT GETTER MARK: until GETTER's LSN reaches MARK; fails when sluice dies (if it runs)
# or after --timeout.
wait_lsn() {
  local deadline=$((SECONDS + timeout)) at
  while :; do
    at=$($2)
    if lsn_reached "$at" "$3"; then return 0; fi
    if [[ $1 == sluice* ]] && ! kill -0 "$sluice_pid" 2>/dev/null; then log "sluice exited before reaching $3"; return 1; fi
    if ((SECONDS >= deadline)); then log "$1 did not reach $3 in $timeout s (at $at)"; return 1; fi
    sleep 0.1
  done
}

if wanted cdc; then
  log "cdc: preparing $cdc_rows rows"
  q src postgres -c "CREATE DATABASE cdc OWNER sluice" >/dev/null
  q src cdc -c "$table_ddl" -c "$(fill_sql "$cdc_rows")" -c "VACUUM ANALYZE public.t" >/dev/null
  # The backlog: transactions of 4 row changes (2 updates of random keys in the lower half, the
  # insert of a new key above the table, the delete of a key from the top down), each committed.
  q src cdc <<SQL
CREATE FUNCTION one_tx(i bigint) RETURNS void LANGUAGE plpgsql AS \$\$
DECLARE k1 bigint; k2 bigint;
BEGIN
  -- The keys are drawn first: random() in a WHERE would be evaluated per row (a full scan).
  k1 := 1 + (random() * ($cdc_rows / 2 - 1))::bigint;
  k2 := 1 + (random() * ($cdc_rows / 2 - 1))::bigint;
  UPDATE public.t SET a = a + 1, b = (random() * 1000)::int WHERE id = k1;
  UPDATE public.t SET a = a - 1, c = left(md5(i::text) || c, 60) WHERE id = k2;
  INSERT INTO public.t VALUES ($cdc_rows + i, i % 100000, i % 1000, left(md5(i::text) || md5((i + 7)::text), 60), '');
  DELETE FROM public.t WHERE id = $cdc_rows + 1 - i;
END \$\$;
CREATE PROCEDURE backlog(first bigint, count bigint) LANGUAGE plpgsql AS \$\$
BEGIN
  FOR i IN first .. first + count - 1 LOOP
    PERFORM one_tx(i);
    COMMIT;
  END LOOP;
END \$\$;
SQL

  # sluice: the starting state by snapshot+cdc, run until its stream has a checkpoint.
  log "cdc: sluice snapshot+cdc to the starting state"
  q dst postgres -c "CREATE DATABASE cdc_sluice OWNER sluice" >/dev/null
  sluice_start snapshot+cdc cdc-setup
  mark=$(q src postgres -c "SELECT pg_current_wal_lsn()")
  sluice_ready=true
  if ! wait_lsn sluice sluice_lsn "$mark"; then
    tail -5 "$base/cdc-setup.log" >&2; sluice_ready=false
    emit "{\"name\":\"sluice PostgreSQL→PostgreSQL (mode: cdc)\",\"kind\":\"sluice\",\"phase\":\"cdc\",\"run\":0,\"failed\":\"setup: $(json_str "$(grep -v '^\s*$' "$base/cdc-setup.log" | tail -1)")\"}"
  fi
  sluice_stop
  # sluice into MariaDB: the same, with a slot of its own.
  log "cdc: sluice snapshot+cdc into MariaDB to the starting state"
  sluice_start snapshot+cdc cdc-setup-my my
  my_ready=true
  if ! wait_lsn sluice-my my_lsn "$mark"; then
    tail -5 "$base/cdc-setup-my.log" >&2; my_ready=false
    emit "{\"name\":\"sluice PostgreSQL→MySQL (mode: cdc)\",\"kind\":\"sluice-mysql\",\"phase\":\"cdc\",\"run\":0,\"failed\":\"setup: $(json_str "$(grep -v '^\s*$' "$base/cdc-setup-my.log" | tail -1)")\"}"
  fi
  sluice_stop
  # native: the table loaded by COPY, then a disabled subscription whose slot starts here.
  log "cdc: native subscriber's table and subscription"
  q native postgres -c "CREATE DATABASE cdc_native OWNER sluice" >/dev/null
  q native cdc_native -c "$table_ddl"
  q src cdc -c "COPY public.t TO STDOUT" | q native cdc_native -c "COPY public.t FROM STDIN"
  q native cdc_native -c "VACUUM ANALYZE public.t" >/dev/null
  q src cdc -c "CREATE PUBLICATION bench_pub FOR TABLE public.t" >/dev/null
  q native cdc_native -c "CREATE SUBSCRIPTION bench_sub CONNECTION '$(conninfo src cdc)' PUBLICATION bench_pub
    WITH (create_slot = true, copy_data = false, enabled = false)" >/dev/null

  rounds=$repeat
  run=0
  while ((run < rounds)); do
    run=$((run + 1))
    log "cdc round $run: backlog of $changes row changes ($tx transactions of 4)"
    t0=$(now)
    q src cdc -c "CALL backlog($(( (run - 1) * tx + 1 )), $tx)"
    made=$(elapsed "$t0")
    end_lsn=$(q src postgres -c "SELECT pg_current_wal_lsn()")
    wal_bytes=$(q src postgres -c "SELECT pg_wal_lsn_diff('$end_lsn', '$mark')")
    want=$(checksum src cdc)
    log "  made in $made s, up to $end_lsn ($wal_bytes WAL bytes since the start)"
    emit "{\"name\":\"backlog\",\"phase\":\"cdc-load\",\"run\":$run,\"row_changes\":$changes,\"transactions\":$tx,\"made_s\":$made,\"end_lsn\":\"$end_lsn\"}"
    mark=$end_lsn

    # sluice
    if $sluice_ready; then
    log "cdc round $run: sluice"
    s0=$(tree_cpu "$(pid_of src)"); d0=$(tree_cpu "$(pid_of dst)"); t0=$(now)
    sluice_start cdc "cdc-backlog-$run"
    if wait_lsn sluice sluice_lsn "$end_lsn"; then
      wall=$(elapsed "$t0")
      cpu=$(tree_cpu "$sluice_pid"); rss=$(tree_rss_kb "$sluice_pid")
      scpu=$(sub "$(tree_cpu "$(pid_of src)")" "$s0"); dcpu=$(sub "$(tree_cpu "$(pid_of dst)")" "$d0")
      sluice_stop
      got=$(checksum dst cdc_sluice); ok=false
      [[ "$got" == "$want" ]] && ok=true || log "MISMATCH: source [$want] sluice [$got]"
      emit "{\"name\":\"sluice PostgreSQL→PostgreSQL (mode: cdc)\",\"kind\":\"sluice\",\"phase\":\"cdc\",\"run\":$run,\"row_changes\":$changes,\"transactions\":$tx,\"wall\":$wall,\"cpu\":$cpu,\"source_cpu\":$scpu,\"target_cpu\":$dcpu,\"rss_kb\":$rss,\"verified\":$ok,$(writes dst cdc_sluice)}"
      log "  $wall s, $(awk "BEGIN{printf \"%.0f\", $changes / $wall}") row changes/s, sluice CPU $cpu s, source $scpu s, target $dcpu s, verified $ok"
    else
      tail -5 "$base/cdc-backlog-$run.log" >&2
      emit "{\"name\":\"sluice PostgreSQL→PostgreSQL (mode: cdc)\",\"kind\":\"sluice\",\"phase\":\"cdc\",\"run\":$run,\"failed\":\"$(json_str "$(grep -v '^\s*$' "$base/cdc-backlog-$run.log" | tail -1)")\"}"
      sluice_stop
    fi
    fi

    # sluice into MariaDB
    if $my_ready; then
      log "cdc round $run: sluice into MariaDB"
      s0=$(tree_cpu "$(pid_of src)"); d0=$(tree_cpu "$(pid_of my)"); t0=$(now)
      sluice_start cdc "cdc-backlog-my-$run" my
      if wait_lsn sluice-my my_lsn "$end_lsn"; then
        wall=$(elapsed "$t0")
        cpu=$(tree_cpu "$sluice_pid"); rss=$(tree_rss_kb "$sluice_pid")
        scpu=$(sub "$(tree_cpu "$(pid_of src)")" "$s0"); dcpu=$(sub "$(tree_cpu "$(pid_of my)")" "$d0")
        sluice_stop
        got=$(portable_checksum my); ok=false; want_portable=$(portable_checksum src cdc)
        [[ "$got" == "$want_portable" ]] && ok=true || log "MISMATCH: source [$want_portable] sluice into MariaDB [$got]"
        emit "{\"name\":\"sluice PostgreSQL→MySQL (mode: cdc)\",\"kind\":\"sluice-mysql\",\"phase\":\"cdc\",\"run\":$run,\"row_changes\":$changes,\"transactions\":$tx,\"wall\":$wall,\"cpu\":$cpu,\"source_cpu\":$scpu,\"target_cpu\":$dcpu,\"rss_kb\":$rss,\"verified\":$ok}"
        log "  $wall s, $(awk "BEGIN{printf \"%.0f\", $changes / $wall}") row changes/s, sluice CPU $cpu s, peak RSS $rss kB, source $scpu s, target $dcpu s, verified $ok"
      else
        tail -5 "$base/cdc-backlog-my-$run.log" >&2
        emit "{\"name\":\"sluice PostgreSQL→MySQL (mode: cdc)\",\"kind\":\"sluice-mysql\",\"phase\":\"cdc\",\"run\":$run,\"failed\":\"$(json_str "$(grep -v '^\s*$' "$base/cdc-backlog-my-$run.log" | tail -1)")\"}"
        sluice_stop
      fi
    fi

    # native logical replication
    log "cdc round $run: native subscriber"
    enable_gap
    s0=$(tree_cpu "$(pid_of src)"); n0=$(tree_cpu "$(pid_of native)"); t0=$(now)
    enable_subscription
    if wait_lsn native native_lsn "$end_lsn"; then
      wall=$(elapsed "$t0")
      scpu=$(sub "$(tree_cpu "$(pid_of src)")" "$s0"); ncpu=$(sub "$(tree_cpu "$(pid_of native)")" "$n0")
      q native cdc_native -c "ALTER SUBSCRIPTION bench_sub DISABLE"
      got=$(checksum native cdc_native); ok=false
      [[ "$got" == "$want" ]] && ok=true || log "MISMATCH: source [$want] native [$got]"
      emit "{\"name\":\"PostgreSQL native logical replication (subscription)\",\"kind\":\"native\",\"phase\":\"cdc\",\"run\":$run,\"row_changes\":$changes,\"transactions\":$tx,\"wall\":$wall,\"cpu\":$ncpu,\"source_cpu\":$scpu,\"target_cpu\":0,\"rss_kb\":0,\"verified\":$ok,$(writes native cdc_native)}"
      log "  $wall s, $(awk "BEGIN{printf \"%.0f\", $changes / $wall}") row changes/s, subscriber server CPU $ncpu s, source $scpu s, verified $ok"
    else
      q native cdc_native -c "ALTER SUBSCRIPTION bench_sub DISABLE" || true
      emit "{\"name\":\"PostgreSQL native logical replication (subscription)\",\"kind\":\"native\",\"phase\":\"cdc\",\"run\":$run,\"failed\":\"did not reach $end_lsn\"}"
    fi
    # The subscriber's walsender ends a moment after DISABLE; the slot must be free for the next round.
    for _ in $(seq 1 100); do
      [[ $(q src cdc -c "SELECT active FROM pg_replication_slots WHERE slot_name = 'bench_sub'") == f ]] && break
      sleep 0.1
    done
    # After the first pair: if either replicator's two catch-ups differ by more than 15 %, two
    # more rounds (every round is kept).
    if ((run == repeat && repeat >= 2)); then
      spread=$(python3 - "$results" <<'PY'
import json, sys
runs = [r for r in map(json.loads, open(sys.argv[1])) if r.get("phase") == "cdc" and "wall" in r]
spread = any(max(w[:2]) > 1.15 * min(w[:2]) for w in ([r["wall"] for r in runs if r["kind"] == k] for k in ("sluice", "native")) if len(w) >= 2)
print("yes" if spread else "no")
PY
)
      if [[ $spread == yes ]]; then log "cdc: a pair of catch-ups differs by more than 15 %: two more rounds"; rounds=$((repeat + 2)); fi
    fi
  done
  grep -hE "WARN|ERROR" "$base"/cdc-*.log 2>/dev/null | grep -v "stopping: finishing" | sort | uniq -c | sort -rn | head -10 >&2 || true
fi

# ============================== 3. latency at a fixed rate =====================================
# lag_sampler SLOT FILE: in the background, every 0.5 s, the source's pg_stat_replication
# replay_lag (ms) of the walsender serving SLOT (the source's WAL write of a change → the
# replicator's confirmation that it is applied); sets sampler.
lag_sampler() {
  (while :; do
     q src postgres -c "SELECT coalesce((extract(epoch FROM r.replay_lag) * 1000)::text, 'null') FROM pg_stat_replication r
       JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name $1"
     sleep 0.5
   done) >"$2" 2>/dev/null &
  sampler=$!; bg_pids+=("$sampler")
}
# lag_json FILE: the samples' percentiles (null samples, when the server had no lag figure, counted apart).
lag_json() {
  python3 -c 'import json,sys
lines=[x.strip() for x in open(sys.argv[1]) if x.strip()]
v=sorted(float(x) for x in lines if x != "null")
q=lambda p: round(v[min(len(v)-1, int(p*len(v)))]) if v else None
print(json.dumps({"lag_samples": len(v), "lag_null_samples": len(lines) - len(v), "lag_p50_ms": q(0.5), "lag_p99_ms": q(0.99), "lag_max_ms": round(v[-1]) if v else None})[1:-1])' "$1"
}
# rate_load NAME: pgbench at --rate for --latency-seconds, each transaction one_tx of the next
# number; prints "transactions/s row_changes".
rate_load() {
  local first=$1
  printf 'SELECT one_tx(nextval(%s));\n' "'rate_seq'" >"$base/rate.sql"
  nice -n 0 pgbench -n -f "$base/rate.sql" -R "$rate" -T "$latency_seconds" -c 4 -j 2 \
    -h "$base/src" -p "$src_port" -U postgres cdc >"$base/pgbench-$2.log" 2>&1
  awk '/^tps = / {tps = $3} /number of transactions actually processed/ {split($NF, n, "/"); done = $6} END {print tps, done * 4}' "$base/pgbench-$2.log"
}
if wanted cdc && ((latency_seconds > 0)); then
  q src cdc -c "CREATE SEQUENCE rate_seq START $((rounds * tx + 1))" >/dev/null
  if $sluice_ready; then
    log "latency: sluice at $rate tx/s for $latency_seconds s"
    sluice_start cdc cdc-latency
    mark=$(q src postgres -c "SELECT pg_current_wal_lsn()")
    if wait_lsn sluice sluice_lsn "$mark"; then
      sleep 1
      lag_sampler "<> 'bench_sub'" "$base/sluice-lag.txt"
      c0=$(tree_cpu "$sluice_pid"); d0=$(tree_cpu "$(pid_of dst)"); t0=$(now)
      read -r tps done_changes < <(rate_load 0 sluice)
      kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true
      end_lsn=$(q src postgres -c "SELECT pg_current_wal_lsn()")
      wait_lsn sluice sluice_lsn "$end_lsn" || true
      wall=$(elapsed "$t0")
      cpu=$(sub "$(tree_cpu "$sluice_pid")" "$c0"); dcpu=$(sub "$(tree_cpu "$(pid_of dst)")" "$d0")
      sluice_stop
      got=$(checksum dst cdc_sluice); want=$(checksum src cdc); ok=false
      [[ "$got" == "$want" ]] && ok=true || log "MISMATCH: source [$want] sluice [$got]"
      stream=$(python3 -c 'import json,sys; st=json.load(open(sys.argv[1]))["stream"]; print(json.dumps({"p50_ms": st["latency_p50_ms"], "p99_ms": st["latency_p99_ms"], "transactions_applied": st["transactions_applied"], "histogram": {str(b["up_to_ms"]): b["transactions"] for b in st["latency_histogram"] if b["transactions"]}})[1:-1])' "$base/cdc-latency.json" 2>/dev/null || echo '"p50_ms":null,"p99_ms":null')
      emit "{\"name\":\"sluice PostgreSQL→PostgreSQL (mode: cdc)\",\"kind\":\"sluice\",\"phase\":\"latency\",\"rate\":$rate,\"tps\":$tps,\"row_changes\":$done_changes,\"seconds\":$latency_seconds,\"cpu_per_s\":$(awk "BEGIN{printf \"%.3f\", $cpu / $wall}"),\"target_cpu_per_s\":$(awk "BEGIN{printf \"%.3f\", $dcpu / $wall}"),\"verified\":$ok,$stream,$(lag_json "$base/sluice-lag.txt")}"
      log "  $(tail -1 "$results")"
    else
      sluice_stop
    fi
  fi
  log "latency: native subscriber at $rate tx/s for $latency_seconds s"
  enable_subscription
  mark=$(q src postgres -c "SELECT pg_current_wal_lsn()")
  if wait_lsn native native_lsn "$mark"; then
    sleep 1
    lag_sampler "= 'bench_sub'" "$base/native-lag.txt"
    n0=$(tree_cpu "$(pid_of native)"); t0=$(now)
    read -r tps done_changes < <(rate_load 0 native)
    kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true
    end_lsn=$(q src postgres -c "SELECT pg_current_wal_lsn()")
    wait_lsn native native_lsn "$end_lsn" || true
    wall=$(elapsed "$t0"); ncpu=$(sub "$(tree_cpu "$(pid_of native)")" "$n0")
    q native cdc_native -c "ALTER SUBSCRIPTION bench_sub DISABLE"
    got=$(checksum native cdc_native); want=$(checksum src cdc); ok=false
    [[ "$got" == "$want" ]] && ok=true || log "MISMATCH: source [$want] native [$got]"
    lag=$(lag_json "$base/native-lag.txt")
    emit "{\"name\":\"PostgreSQL native logical replication (subscription)\",\"kind\":\"native\",\"phase\":\"latency\",\"rate\":$rate,\"tps\":$tps,\"row_changes\":$done_changes,\"seconds\":$latency_seconds,\"cpu_per_s\":$(awk "BEGIN{printf \"%.3f\", $ncpu / $wall}"),\"verified\":$ok,$lag}"
    log "  $(tail -1 "$results")"
  fi
fi

# --- report ------------------------------------------------------------------------------------
python3 - "$results" <<'PY' | tee "$out/postgres-$stamp.md"
import json, statistics, sys

def cell(text):
    return str(text).replace("|", "\\|")

runs = [json.loads(line) for line in open(sys.argv[1])]
head = runs[0]
print(f"`{head['command']}` (sluice binary {head['sluice_binary']}; PostgreSQL {head['postgres']}, pgcopydb {head['pgcopydb']}; load average at the start {head['load']})\n")

def grouped(phase):
    tools = {}
    for r in runs:
        if r.get("phase") == phase:
            tools.setdefault(r["kind"], []).append(r)
    return tools

snap = grouped("snapshot")
if snap:
    table = next(r for r in runs if r.get("phase") == "snapshot-table")
    keyless = ", a table without a key" if table.get("keyless") else ""
    print(f"### Snapshot, {table['rows']:,} rows ({table['table_bytes'] / 1e6:,.0f} MB table{keyless}), PostgreSQL → PostgreSQL (two servers on one machine)\n")
    print("Median of the runs; every run's wall time in the last column. Tool CPU: the tool's own processes "
          "(for the pipe: the two psql); server CPU: the source's and the target's postmaster trees.\n")
    med = {k: statistics.median(r["wall"] for r in v if "wall" in r) for k, v in snap.items() if any("wall" in r for r in v)}
    limit, sluice = med.get("pipe"), med.get("sluice4")
    print("| tool | × the pipe's time | × sluice's time | wall s | rows/s | tool CPU s | rows per tool CPU-s | source + target server CPU s | rows per total CPU-s | peak RSS MB | target = source | runs (wall s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for kind, rs in sorted(snap.items(), key=lambda kv: med.get(kv[0], 1e9)):
        ok = [r for r in rs if "wall" in r]
        if not ok:
            print(f"| {cell(rs[0]['name'])} | failed: {cell(rs[0]['failed'])} | | | | | | | | | | |")
            continue
        w = med[kind]
        cpu = statistics.median(r["cpu"] for r in ok)
        srv = statistics.median(r["source_cpu"] + r["target_cpu"] for r in ok)
        rss = max(r["rss_kb"] for r in ok) / 1024
        rows = ok[0]["rows"]
        verified = "yes" if all(r["verified"] for r in ok) else "NO"
        fails = sum(1 for r in rs if "failed" in r)
        each = " / ".join(f"{r['wall']:.2f}" for r in ok) + (f" ({fails} failed)" if fails else "")
        print(f"| {cell(ok[0]['name'])} | {w / limit:.2f} | {w / sluice:.2f} | {w:.2f} | {rows / w:,.0f} | {cpu:.2f} | {rows / max(cpu, 0.01):,.0f} | "
              f"{srv:.2f} | {rows / max(cpu + srv, 0.01):,.0f} | {rss:,.0f} | {verified} | {each} |" if limit and sluice else
              f"| {cell(ok[0]['name'])} | - | - | {w:.2f} | {rows / w:,.0f} | {cpu:.2f} | | {srv:.2f} | | {rss:,.0f} | {verified} | {each} |")
    print()

cdc = grouped("cdc")
if cdc:
    load = [r for r in runs if r.get("phase") == "cdc-load"]
    print(f"### CDC backlog, PostgreSQL → PostgreSQL (and sluice → MySQL): {load[0]['row_changes']:,} row changes in {load[0]['transactions']:,} transactions per round, {len(load)} rounds\n")
    print("Catch-up from the job's (subscription's) start until its stored position reaches the source's pg_current_wal_lsn() "
          "after the backlog. Tool CPU: sluice's process; for the native subscriber its whole server (the apply worker). "
          "Target CPU: sluice's target server (MariaDB for → MySQL). Peak RSS: sluice's VmHWM. Source CPU: the source server (its walsender decodes for both).\n")
    med = {k: statistics.median(r["wall"] for r in v if "wall" in r) for k, v in cdc.items() if any("wall" in r for r in v)}
    sluice = med.get("sluice")
    print("| tool | × sluice's row changes/s | catch-up s | row changes/s | tool CPU s | row changes per tool CPU-s | target CPU s | source CPU s | row changes per total CPU-s | peak RSS MB | target = source | runs (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for kind, rs in cdc.items():
        ok = [r for r in rs if "wall" in r]
        if not ok:
            print(f"| {cell(rs[0]['name'])} | failed: {cell(rs[0]['failed'])} | | | | | | | | | | |")
            continue
        w = med[kind]
        n = ok[0]["row_changes"]
        cpu = statistics.median(r["cpu"] for r in ok)
        tcpu = statistics.median(r["target_cpu"] for r in ok)
        scpu = statistics.median(r["source_cpu"] for r in ok)
        rss = max(r["rss_kb"] for r in ok) / 1024
        verified = "yes" if all(r["verified"] for r in ok) else "NO"
        each = " / ".join(f"{r['wall']:.2f}" for r in ok)
        vs = f"{(n / w) / (n / sluice):.2f}" if sluice else "-"
        print(f"| {cell(ok[0]['name'])} | {vs} | {w:.2f} | {n / w:,.0f} | {cpu:.2f} | {n / max(cpu, 0.01):,.0f} | "
              f"{tcpu:.2f} | {scpu:.2f} | {n / max(cpu + tcpu + scpu, 0.01):,.0f} | {rss:,.0f} | {verified} | {each} |")
    print()

    for kind, rs in cdc.items():
        ws = [r["target_writes"] for r in rs if "target_writes" in r]
        if len(ws) >= 2:
            d = {k: ws[-1][k] - ws[-2][k] for k in ws[-1]}
            print(f"{rs[0]['name']}: the target table's writes in the last round (pg_stat_user_tables): "
                  f"{d['ins']:,} inserted, {d['upd']:,} updated ({d['hot_upd']:,} HOT), {d['del']:,} deleted\n")

latency = [r for r in runs if r.get("phase") == "latency"]
if latency:
    print("### CDC latency at a fixed rate\n")
    print("sluice: its summary's p50/p99 (upper bounds of histogram buckets; a transaction from its arrival at sluice to its target commit). "
          "Both: the source's pg_stat_replication.replay_lag of the replicator's walsender (WAL write → the replicator's applied-and-confirmed report), "
          "sampled every 0.5 s; percentiles of the samples (null: no figure at that instant).\n")
    print("| tool | rate tx/s (achieved) | row changes | sluice's own p50 / p99 | source replay_lag p50 / p99 / max (samples, null) | tool CPU per s | target CPU per s | target = source |")
    print("|---|---|---|---|---|---|---|---|")
    for r in latency:
        own = f"≤ {r['p50_ms']} / ≤ {r['p99_ms']} ms" if r.get("p50_ms") is not None else "-"
        lag = (f"{r['lag_p50_ms']} / {r['lag_p99_ms']} / {r['lag_max_ms']} ms ({r['lag_samples']}, {r['lag_null_samples']})"
               if r.get("lag_samples") else f"- (0, {r.get('lag_null_samples', 0)})")
        tgt = f"{r['target_cpu_per_s']:.2f}" if "target_cpu_per_s" in r else "(in tool)"
        print(f"| {cell(r['name'])} | {r['rate']} ({r['tps']:,.0f}) | {r['row_changes']:,} | {own} | {lag} | {r['cpu_per_s']:.2f} | {tgt} | {'yes' if r['verified'] else 'NO'} |")
    print()
    for r in latency:
        if "histogram" in r:
            print(f"{r['name']} histogram (ms bound: transactions): " + ", ".join(f"{k}: {v:,}" for k, v in r["histogram"].items()) + "\n")
PY
