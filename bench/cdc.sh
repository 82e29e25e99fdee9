#!/usr/bin/env bash
# CDC benchmark (the protocol at the top of BENCHMARKS.md): apply throughput on a backlog and latency at a fixed
# rate, for sluice MySQL→PostgreSQL and MySQL→MySQL, next to a MariaDB native replica (serial and
# with slave_parallel_threads) and pg_chameleon (MySQL→PostgreSQL), in the same run on the same
# changes.
#
#   bench/cdc.sh [--tables 4] [--rows 100000] [--seconds 60] [--threads 4] [--rate 1250]
#                [--latency-seconds 30] [--parallel-threads 4] [--parallel-mode optimistic]
#                [--batch-rows 5000] [--queue-batches N (sluice's default)] [--apply-parallelism N (the target's default)]
#                [--only sluice|native|chameleon] [--sluice PATH] [--out bench/results]
#
# 1. Hermetic servers: a source MariaDB, a target PostgreSQL, a target MariaDB (sluice), and one
#    MariaDB per native replica. sysbench prepares --tables x --rows.
# 2. Every replicator is brought to the same starting state, then stopped: sluice by a
#    snapshot+cdc job run until its stream checkpoint exists past the replay window; the native
#    replicas by `mariadb-dump --master-data=2 --single-transaction` loaded into them, CHANGE
#    MASTER TO the dump's position, not started; pg_chameleon by init_replica.
# 3. With all of them stopped, `sysbench oltp_write_only` runs --seconds at saturation; the row
#    changes it made are counted exactly from the binlog (mariadb-binlog --verbose).
# 4. Each replicator in turn is started and timed until it has applied up to the source position
#    recorded after the load (sluice: its checkpoint in the target; native: MASTER_POS_WAIT;
#    pg_chameleon: its replica batches read past the position and all replayed). Then the
#    target is checked against the source per table: count(*), sum(k), sum of an md5 prefix of c.
# 5. Latency: with a replicator caught up, sysbench runs at --rate transactions/s (4 row changes
#    each) for --latency-seconds; sluice's p50/p99 (source commit → target commit) come from its
#    summary JSON, the native replicas' from Seconds_Behind_Master sampled every second.
#
# CPU is counted per process tree from /proc (utime+stime, children included) over the catch-up:
# the tool's own (sluice, pg_chameleon's python; for a native replica its whole mariadbd) and the
# target and source servers'. Peak RSS is the tool's VmHWM.
#
# Prints a Markdown table and writes it, with the raw figures as JSON lines, under --out.
# Peers missing on the machine are installed (apt: sysbench; PyPI: pg_chameleon==2.0.21 in a
# venv owned by the OS user `pgchameleon`, which is created: pg_chameleon refuses to run as root).
set -euo pipefail
cd "$(dirname "$0")/.."
command_line="bench/cdc.sh $*"

tables=4
rows=100000
seconds=60
threads=4
rate=1250
latency_seconds=30
parallel_threads=4
parallel_mode=optimistic
batch_rows=5000
queue_batches=""
apply_parallelism=""
only=""
sluice=""
out=bench/results
timeout=1800
logs=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tables) tables=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --latency-seconds) latency_seconds=$2; shift 2 ;;
    --parallel-threads) parallel_threads=$2; shift 2 ;;
    --parallel-mode) parallel_mode=$2; shift 2 ;;
    --batch-rows) batch_rows=$2; shift 2 ;;
    --queue-batches) queue_batches=$2; shift 2 ;;
    --apply-parallelism) apply_parallelism=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --sluice) sluice=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --logs) logs=$2; shift 2 ;;
    *) echo "usage: $0 [--tables N] [--rows N] [--seconds S] [--threads N] [--rate TPS] [--latency-seconds S]" \
         "[--parallel-threads N] [--parallel-mode MODE] [--batch-rows N] [--queue-batches N] [--only sluice|native|chameleon]" \
         "[--sluice PATH (prebuilt; skips the build)] [--timeout S] [--out DIR] [--logs DIR (keeps the run's logs)]" >&2; exit 2 ;;
  esac
done
wanted() { [[ -z "$only" || "$1" == *"$only"* ]]; }
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }

# --- peers ----------------------------------------------------------------------------------
chameleon_user=pgchameleon
chameleon_version=2.0.21
install_peers() {
  local missing=()
  for tool in sysbench /usr/bin/time; do
    command -v "$tool" >/dev/null || missing+=("$(basename "$tool")")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}
# pg_chameleon: its own OS user and a venv from the system python in that user's home.
install_chameleon() {
  id "$chameleon_user" >/dev/null 2>&1 || useradd -m -s /bin/bash "$chameleon_user"
  chameleon_home=$(getent passwd "$chameleon_user" | cut -d: -f6)
  chameleon_venv=$chameleon_home/venv-pg_chameleon-$chameleon_version
  if [[ ! -x $chameleon_venv/bin/chameleon ]]; then
    setpriv --reuid="$chameleon_user" --regid="$chameleon_user" --init-groups -- env HOME="$chameleon_home" \
      bash -c "/usr/bin/python3 -m venv '$chameleon_venv' && '$chameleon_venv/bin/pip' install -q pg_chameleon==$chameleon_version"
  fi
}

# The servers (MariaDB, PostgreSQL, etcd) come from the project's installer.
scripts/testdb install >/dev/null
install_peers
if wanted chameleon; then install_chameleon || log "pg_chameleon could not be installed"; fi
export SLUICE_TEST_PASSWORD=bench-pw
if [[ -z "$sluice" ]]; then
  cargo build --release --quiet -p sluice --bin sluice
  sluice=$PWD/target/release/sluice
fi
sluice=$(realpath "$sluice")
# shellcheck source=bench/measure.sh
source bench/measure.sh

base=$(mktemp -d /dev/shm/sluice-cdc.XXXXXX)
chmod 755 "$base"
servers=()   # "engine dir" of every server started
bg_pids=()   # background processes started (sluice, pg_chameleon, samplers)
polls=0      # this script's queries of the target's progress (they count as target transactions)
cleanup() {
  local pid server
  for pid in "${bg_pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      kill_tree "$pid" KILL
    fi
  done
  if [[ -n "$logs" ]]; then
    mkdir -p "$logs"
    cp "$base"/*.log "$base"/*.json "$base"/*.yaml "$base"/*.txt "$logs"/ 2>/dev/null || true
    for server in "${servers[@]}"; do cp "${server#* }/server.log" "$logs/server-$(basename "${server#* }").log" 2>/dev/null || true; done
  fi
  for server in "${servers[@]}"; do
    # shellcheck disable=SC2086
    scripts/testdb stop $server >/dev/null 2>&1 || true
  done
  rm -rf "$base"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

kill_tree() {
  local pids
  pids=$(descendants "$1")
  # shellcheck disable=SC2086
  kill -"$2" "$1" $pids 2>/dev/null || true
}

# start_server ENGINE NAME: starts a server in $base/NAME (registered for cleanup first); sets url.
start_server() {
  servers+=("$1 $base/$2")
  url=$(scripts/testdb start "$1" "$base/$2")
  url=${url#URL=}
}
log "starting servers in $base"
start_server mariadb src; src_url=$url
start_server postgres pg; pg_url=$url
start_server mariadb tgt; my_url=$url
replicas=()
if wanted native; then
  for r in rep1 rep4; do start_server mariadb "$r"; replicas+=("$r"); done
fi
src_port=$(cat "$base/src/port")
pg_port=$(cat "$base/pg/port")
pid_of() { cat "$base/$1/pid"; }
my() { local server=$1; shift; mariadb --no-defaults --default-character-set=utf8mb4 -uroot -S "$base/$server/mysql.sock" "$@"; }
pg() { psql -X -q -At -h "$base/pg" -p "$pg_port" -U postgres -d sluice "$@"; }
for server in src tgt "${replicas[@]}"; do
  my "$server" -e "SET GLOBAL innodb_buffer_pool_size = 1073741824"
done

# --- data -------------------------------------------------------------------------------------
sb_common=(--db-driver=mysql --mysql-socket="$base/src/mysql.sock" --mysql-user=root --mysql-db=sbtest
  --tables="$tables" --table-size="$rows")
my src -e "CREATE DATABASE sbtest; CREATE DATABASE bench_marker; CREATE TABLE bench_marker.tick (id INT AUTO_INCREMENT PRIMARY KEY)"
log "preparing $tables x $rows sysbench rows"
sysbench oltp_write_only "${sb_common[@]}" --threads="$tables" prepare >/dev/null
for t in $(seq 1 "$tables"); do my src -e "ANALYZE TABLE sbtest.sbtest$t" >/dev/null; done

# master_status: "file position" of the source now.
master_status() { my src -N -e "SHOW MASTER STATUS" | awk '{print $1, $2}'; }
# reached FILE POS MARK_FILE MARK_POS: true if FILE:POS >= MARK (file sequence number, then pos).
reached() {
  local seq=${1##*.} mark_seq=${3##*.}
  ((10#$seq > 10#$mark_seq || (10#$seq == 10#$mark_seq && $2 >= $4)))
}

mkdir -p "$out"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
results="$out/cdc-$stamp.jsonl"
: >"$results"
emit() { echo "$1" >>"$results"; }

# checksum SERVER: per table "count sum(k) sum(md5 prefix of c)" of the source or a target.
checksum() {
  local t
  case $1 in
    pg:*)
      for t in $(seq 1 "$tables"); do
        pg -F' ' -c "SELECT count(*), coalesce(sum(k),0), coalesce(sum(('x' || substr(md5(c::text), 1, 7))::bit(28)::int),0) FROM ${1#pg:}.sbtest$t"
      done ;;
    *)
      local server=${1%%:*} db=${1#*:}
      for t in $(seq 1 "$tables"); do
        my "$server" -N -e "SELECT count(*), coalesce(sum(k),0), coalesce(sum(conv(substr(md5(c), 1, 7), 16, 10)),0) FROM $db.sbtest$t" | tr '\t' ' '
      done ;;
  esac
}
# verify TARGET: true when the target matches the source; prints the mismatch otherwise.
verify() {
  local want got
  want=$(checksum src:sbtest)
  got=$(checksum "$1" 2>&1) || true
  if [[ "$want" == "$got" ]]; then return 0; fi
  log "MISMATCH in $1: source [$(tr '\n' ';' <<<"$want")] target [$(tr '\n' ';' <<<"$got")]"
  return 1
}

# --- sluice ----------------------------------------------------------------------------------
# job NAME MODE TYPE URL NAMESPACE: writes the job file, prints its path.
job() {
  cat >"$base/$1-$2.yaml" <<EOF
name: $1
mode: $2
source:
  type: mysql
  url: $src_url
  tables: ["sbtest.*"]
target:
  type: $3
  url: $4
  namespace: $5
limits: {batch_rows: $batch_rows${queue_batches:+, queue_batches: $queue_batches}}
${apply_parallelism:+apply_parallelism: $apply_parallelism}
EOF
  echo "$base/$1-$2.yaml"
}
# sluice_checkpoint KIND NAME: "file position replay_until_type" of the job's stream checkpoint.
sluice_checkpoint() {
  case $1 in
    pg) pg -F' ' -c "SELECT position->'at'->>'file', position->'at'->>'position', jsonb_typeof(position->'replay_until')
          FROM sluice.checkpoints WHERE job = '$2' AND task = 'stream'" 2>/dev/null || true ;;
    my) my tgt -N -e "SELECT JSON_VALUE(position, '\$.at.file'), JSON_VALUE(position, '\$.at.position'),
          lower(JSON_TYPE(JSON_EXTRACT(position, '\$.replay_until'))) FROM sluice.checkpoints
          WHERE job = '$2' AND task = 'stream'" 2>/dev/null | tr '\t' ' ' || true ;;
  esac
}
sluice_pid=""
# sluice_start KIND NAME MODE LOGNAME: starts the job in the background (sluice_pid).
sluice_start() {
  local kind=$1 name=$2 mode=$3 url namespace
  if [[ $kind == pg ]]; then url=$pg_url; namespace=sbtest_sluice; else url=$my_url; namespace=sbtest_sluice; fi
  "$sluice" run "$(job "$name" "$mode" "$( [[ $kind == pg ]] && echo postgres || echo mysql)" "$url" "$namespace")" \
    --state-dir "$base/state-$name" --summary-json "$base/$4.json" >"$base/$4.log" 2>&1 &
  sluice_pid=$!
  bg_pids+=("$sluice_pid")
}
# sluice_stop: SIGTERM, wait; a stopped cdc job exits 1 with status "stopped".
sluice_stop() {
  kill -TERM "$sluice_pid" 2>/dev/null || true
  local deadline=$((SECONDS + 60))
  while kill -0 "$sluice_pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
  if kill -0 "$sluice_pid" 2>/dev/null; then log "sluice did not stop in 60 s; SIGKILL"; kill -KILL "$sluice_pid"; fi
  wait "$sluice_pid" 2>/dev/null || true
}
# sluice_wait KIND NAME FILE POS [REPLAY_DONE]: waits until the checkpoint reaches FILE:POS (and,
# with REPLAY_DONE, has left the replay window). Fails when sluice dies or after $timeout s.
sluice_wait() {
  local kind=$1 name=$2 file=$3 pos=$4 deadline=$((SECONDS + timeout)) at_file at_pos replay
  while :; do
    read -r at_file at_pos replay < <(sluice_checkpoint "$kind" "$name"; echo)
    polls=$((polls + 1))
    if [[ -n "${at_file:-}" ]] && reached "$at_file" "$at_pos" "$file" "$pos" \
       && { [[ -z "${5:-}" ]] || [[ "$replay" == null ]]; }; then
      return 0
    fi
    if ! kill -0 "$sluice_pid" 2>/dev/null; then log "sluice exited before catching up"; return 1; fi
    if ((SECONDS >= deadline)); then log "sluice did not catch up in $timeout s"; return 1; fi
    if [[ -n "${5:-}" ]]; then my src -e "INSERT INTO bench_marker.tick VALUES ()"; sleep 0.5; else sleep 0.25; fi
  done
}
# sluice_setup KIND NAME: snapshot+cdc until the stream checkpoint is past the replay window.
sluice_setup() {
  local kind=$1 name=$2
  log "sluice $kind: snapshot+cdc to the starting state"
  sluice_start "$kind" "$name" snapshot+cdc "$name-setup"
  # Changes outside source.tables move the position only: the stream then checkpoints it.
  read -r file pos < <(master_status)
  if ! sluice_wait "$kind" "$name" "$file" "$pos" replay; then
    tail -5 "$base/$name-setup.log" >&2; sluice_stop; return 1
  fi
  sluice_stop
}

# --- native replicas -------------------------------------------------------------------------
native_setup() {
  log "native replicas: mariadb-dump --master-data=2 --single-transaction into ${replicas[*]}"
  mariadb-dump --no-defaults -uroot -S "$base/src/mysql.sock" --master-data=2 --single-transaction --quick \
    --databases sbtest >"$base/dump.sql"
  local coords file pos id=2
  coords=$(grep -m1 -- "-- CHANGE MASTER TO MASTER_LOG_FILE" "$base/dump.sql")
  file=$(sed -E "s/.*MASTER_LOG_FILE='([^']+)'.*/\1/" <<<"$coords")
  pos=$(sed -E "s/.*MASTER_LOG_POS=([0-9]+).*/\1/" <<<"$coords")
  for r in "${replicas[@]}"; do
    { echo "SET sql_log_bin = 0;"; cat "$base/dump.sql"; } | my "$r"
    my "$r" -e "SET GLOBAL server_id = $id;
      CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = $src_port, MASTER_USER = 'sluice',
        MASTER_PASSWORD = '$SLUICE_TEST_PASSWORD', MASTER_LOG_FILE = '$file', MASTER_LOG_POS = $pos"
    id=$((id + 1))
  done
  my rep4 -e "SET GLOBAL slave_parallel_threads = $parallel_threads; SET GLOBAL slave_parallel_mode = '$parallel_mode'"
  rm -f "$base/dump.sql"
}
# native_wait REPLICA FILE POS: MASTER_POS_WAIT; fails on timeout or a stopped SQL thread.
native_wait() {
  local result
  result=$(my "$1" -N -e "SELECT MASTER_POS_WAIT('$2', $3, $timeout)")
  if [[ "$result" == NULL || "$result" == -1 ]]; then
    log "$1: MASTER_POS_WAIT returned $result"
    my "$1" -e "SHOW SLAVE STATUS\G" | grep -E "Running|Last_.*Error" >&2 || true
    return 1
  fi
}

# --- pg_chameleon ----------------------------------------------------------------------------
chameleon() {
  setpriv --reuid="$chameleon_user" --regid="$chameleon_user" --init-groups -- \
    env HOME="$base/chameleon" "$chameleon_venv/bin/chameleon" "$@"
}
chameleon_pid=""
chameleon_setup() {
  log "pg_chameleon: configuration, create_replica_schema, add_source, init_replica"
  mkdir -p "$base/chameleon/out"
  chown -R "$chameleon_user": "$base/chameleon"
  chameleon set_configuration_files >"$base/chameleon-setup.log" 2>&1 || return 1
  local config=$base/chameleon/.pg_chameleon/configuration/default.yml
  cp "$base/chameleon/.pg_chameleon/configuration/config-example.yml" "$config"
  "$chameleon_venv/bin/python" - "$config" <<PY || return 1
import sys, yaml
path = sys.argv[1]
config = yaml.safe_load(open(path))
config["log_dest"] = "stdout"
config["log_level"] = "info"
config["pg_conn"].update(host="127.0.0.1", port="$pg_port", user="sluice", password="$SLUICE_TEST_PASSWORD", database="sluice")
source = config["sources"]["mysql"]
source["db_conn"].update(host="127.0.0.1", port="$src_port", user="sluice", password="$SLUICE_TEST_PASSWORD")
source["schema_mappings"] = {"sbtest": "sbtest_chameleon"}
source["limit_tables"] = None
source["skip_tables"] = None
source["grant_select_to"] = None
source["skip_events"] = {"insert": None, "delete": None, "update": None}
source["out_dir"] = "$base/chameleon/out"
config["sources"] = {"mysql": source}
yaml.safe_dump(config, open(path, "w"), sort_keys=False)
PY
  chown "$chameleon_user": "$config"
  local step
  for step in create_replica_schema "add_source --source mysql" "init_replica --source mysql"; do
    # shellcheck disable=SC2086
    # (Daemonize's atexit hook prints a harmless "SystemExit: 0" traceback.)
    if ! chameleon $step --config default >>"$base/chameleon-setup.log" 2>&1 \
       || grep -qE " ERROR: |^[A-Za-z.]*(Error|Exception): " "$base/chameleon-setup.log"; then
      log "pg_chameleon $step failed:"; tail -5 "$base/chameleon-setup.log" >&2; return 1
    fi
  done
  grep -q "init replica for source mysql is complete" "$base/chameleon-setup.log" \
    || { log "pg_chameleon init_replica did not complete:"; tail -5 "$base/chameleon-setup.log" >&2; return 1; }
}
chameleon_start() {
  chameleon start_replica --config default --source mysql >"$base/chameleon-$1.log" 2>&1 &
  chameleon_pid=$!
  bg_pids+=("$chameleon_pid")
}
chameleon_stop() {
  kill -INT "$chameleon_pid" 2>/dev/null || true
  local deadline=$((SECONDS + 30))
  while kill -0 "$chameleon_pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
  if kill -0 "$chameleon_pid" 2>/dev/null; then kill_tree "$chameleon_pid" KILL; fi
  wait "$chameleon_pid" 2>/dev/null || true
}
# chameleon_wait: until the replica batches read since init_replica have replayed every row
# change of the backlog. (The open batch's i_binlog_position stays at the start of the last event
# read, short of SHOW MASTER STATUS, so the position alone never shows the catch-up.)
chameleon_wait() {
  local deadline=$((SECONDS + timeout)) replayed
  while :; do
    replayed=$(pg -c "SELECT coalesce(sum(i_replayed + i_skipped), 0) FROM sch_chameleon.t_replica_batch WHERE b_replayed" 2>/dev/null || true)
    polls=$((polls + 1))
    if [[ -n "$replayed" ]] && ((replayed >= changes)); then return 0; fi
    if ! kill -0 "$chameleon_pid" 2>/dev/null; then log "pg_chameleon exited"; tail -5 "$base/chameleon-backlog.log" >&2; return 1; fi
    if grep -q "Read process alive" "$base/chameleon-backlog.log"; then log "a pg_chameleon daemon died"; return 1; fi
    if ((SECONDS >= deadline)); then log "pg_chameleon did not catch up in $timeout s"; return 1; fi
    sleep 0.5
  done
}

# --- starting state --------------------------------------------------------------------------
failed=()   # "name|reason" of replicators whose setup failed
if wanted sluice; then
  sluice_setup pg bench-cdc-pg || failed+=("sluice MySQL→PostgreSQL|snapshot+cdc setup failed: $(json_str "$(tail -1 "$base/bench-cdc-pg-setup.log")")")
  sluice_setup my bench-cdc-my || failed+=("sluice MySQL→MySQL|snapshot+cdc setup failed: $(json_str "$(tail -1 "$base/bench-cdc-my-setup.log")")")
fi
if wanted native; then native_setup; fi
chameleon_ok=""
if wanted chameleon; then
  if [[ -z "${chameleon_venv:-}" || ! -x "$chameleon_venv/bin/chameleon" ]]; then
    failed+=("pg_chameleon $chameleon_version MySQL→PostgreSQL|not installed (pip install pg_chameleon==$chameleon_version failed)")
  elif chameleon_setup; then
    chameleon_ok=1
  else
    failed+=("pg_chameleon $chameleon_version MySQL→PostgreSQL|setup failed: $(json_str "$(grep -E 'Error|ERROR|error' "$base/chameleon-setup.log" | tail -1)")")
  fi
fi
for entry in "${failed[@]}"; do
  emit "{\"name\":\"${entry%%|*}\",\"phase\":\"backlog\",\"failed\":\"${entry#*|}\"}"
done

# --- the backlog -----------------------------------------------------------------------------
read -r start_file start_pos < <(master_status)
log "backlog: sysbench oltp_write_only, $threads threads, $seconds s, at saturation (from $start_file:$start_pos)"
sysbench oltp_write_only "${sb_common[@]}" --threads="$threads" --time="$seconds" --report-interval=0 run >"$base/sysbench-backlog.log"
read -r end_file end_pos < <(master_status)
load_tps=$(awk '/transactions:/ {gsub(/[()]/, "", $3); print $3}' "$base/sysbench-backlog.log")
load_tx=$(awk '/transactions:/ {print $2}' "$base/sysbench-backlog.log")
# Row changes counted exactly from the binlog between the two positions.
binlogs=()
while read -r name _; do
  if reached "$name" 0 "$start_file" 0 && reached "$end_file" 0 "$name" 0; then binlogs+=("$base/src/binlog/$name"); fi
done < <(my src -N -e "SHOW BINARY LOGS")
read -r changes transactions < <(mariadb-binlog --no-defaults --verbose --base64-output=decode-rows \
  --start-position="$start_pos" --stop-position="$end_pos" "${binlogs[@]}" \
  | awk '/^### (INSERT INTO|UPDATE|DELETE FROM) / {rows++} /Xid = / {tx++} END {print rows + 0, tx + 0}')
binlog_bytes=$(( $(for f in "${binlogs[@]}"; do stat -c %s "$f"; done | paste -sd+) - start_pos - ($(stat -c %s "$base/src/binlog/$end_file") - end_pos) ))
log "backlog: $changes row changes in $transactions transactions ($load_tx sysbench tx at $load_tps tx/s; ${binlog_bytes} binlog bytes), up to $end_file:$end_pos"
emit "{\"name\":\"load\",\"phase\":\"backlog\",\"command\":\"$(json_str "$command_line")\",\"sluice_binary\":\"$(sha256sum "$sluice" | cut -c1-12) $(date -u -r "$sluice" +%FT%TZ)\",\"seconds\":$seconds,\"threads\":$threads,\"sysbench_tx\":$load_tx,\"sysbench_tps\":$load_tps,\"row_changes\":$changes,\"transactions\":$transactions,\"binlog_bytes\":$binlog_bytes,\"tables\":$tables,\"table_rows\":$rows}"

src_pid=$(pid_of src)
# target_commits KIND: transactions committed so far in the target (PostgreSQL: database sluice's
# xact_commit, each poll of this script counting one; MariaDB: Com_commit).
target_commits() {
  case $1 in
    pg) pg -c "SELECT xact_commit FROM pg_stat_database WHERE datname = 'sluice'" ;;
    my) my tgt -N -e "SHOW GLOBAL STATUS LIKE 'Com_commit'" | awk '{print $2}' ;;
  esac
}
# commits_since KIND BEFORE POLLS_BEFORE: target commits since BEFORE, less this script's polls.
commits_since() {
  [[ $1 == pg ]] && sleep 1.5  # backends report their counters when they exit, or once a second
  local after
  after=$(target_commits "$1")
  if [[ $1 == pg ]]; then echo $((after - $2 - (polls - $3) - 1)); else echo $((after - $2)); fi
}
# backlog_line NAME KIND WALL TOOL_CPU TARGET_CPU SOURCE_CPU RSS VERIFIED [EXTRA_JSON]
backlog_line() {
  emit "{\"name\":\"$1\",\"kind\":\"$2\",\"phase\":\"backlog\",\"row_changes\":$changes,\"transactions\":$transactions,\"wall\":$3,\"rows_per_s\":$(awk "BEGIN{printf \"%.0f\", $changes / $3}"),\"tool_cpu\":$4,\"target_cpu\":$5,\"source_cpu\":$6,\"rss_kb\":$7,\"verified\":$8${9:+,$9}}"
}

run_sluice_backlog() {
  local kind=$1 name=$2 label=$3 target_pid=$4 target=$5
  log "backlog: $label"
  local t0 s0 g0 wall cpu rss tcpu scpu
  local x0 p0=$polls commits
  x0=$(target_commits "$kind")
  t0=$(now); s0=$(tree_cpu "$src_pid"); g0=$(tree_cpu "$target_pid")
  sluice_start "$kind" "$name" cdc "$name-backlog"
  if ! sluice_wait "$kind" "$name" "$end_file" "$end_pos"; then
    tail -5 "$base/$name-backlog.log" >&2
    emit "{\"name\":\"$label\",\"kind\":\"$kind\",\"phase\":\"backlog\",\"failed\":\"$(json_str "$(grep -v '^\s*$' "$base/$name-backlog.log" | tail -1)")\"}"
    sluice_stop; return
  fi
  wall=$(elapsed "$t0")
  cpu=$(tree_cpu "$sluice_pid"); rss=$(tree_rss_kb "$sluice_pid")
  sluice_stop
  commits=$(commits_since "$kind" "$x0" "$p0")
  tcpu=$(awk "BEGIN{printf \"%.2f\", $(tree_cpu "$target_pid") - $g0}"); scpu=$(awk "BEGIN{printf \"%.2f\", $(tree_cpu "$src_pid") - $s0}")
  local ok=false summary
  verify "$target" && ok=true
  summary=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); st=s.get("stream") or {}; print(json.dumps({"status": s.get("status"), "sluice_rows_applied": st.get("rows_applied"), "sluice_transactions_applied": st.get("transactions_applied")})[1:-1])' "$base/$name-backlog.json" 2>/dev/null || echo '"status":"no summary"')
  backlog_line "$label" "$kind" "$wall" "$cpu" "$tcpu" "$scpu" "$rss" "$ok" "\"target_commits\":$commits,$summary"
  log "  $wall s, $(awk "BEGIN{printf \"%.0f\", $changes / $wall}") rows/s, sluice CPU $cpu s, peak RSS $((rss / 1024)) MB, verified $ok"
}

run_native_backlog() {
  local replica=$1 label=$2
  log "backlog: $label"
  local t0 s0 g0 wall tcpu scpu pid
  pid=$(pid_of "$replica")
  s0=$(tree_cpu "$src_pid"); g0=$(tree_cpu "$pid"); t0=$(now)
  my "$replica" -e "START SLAVE"
  if ! native_wait "$replica" "$end_file" "$end_pos"; then
    emit "{\"name\":\"$label\",\"kind\":\"my\",\"phase\":\"backlog\",\"failed\":\"$(json_str "$(my "$replica" -e "SHOW SLAVE STATUS\G" | grep -E 'Last_SQL_Error:' | head -1)")\"}"
    my "$replica" -e "STOP SLAVE"; return
  fi
  wall=$(elapsed "$t0")
  tcpu=$(awk "BEGIN{printf \"%.2f\", $(tree_cpu "$pid") - $g0}"); scpu=$(awk "BEGIN{printf \"%.2f\", $(tree_cpu "$src_pid") - $s0}")
  my "$replica" -e "STOP SLAVE"
  local ok=false
  verify "$replica:sbtest" && ok=true
  # The replica's server is the tool: its CPU is the tool's, and there is no separate target.
  backlog_line "$label" my "$wall" "$tcpu" 0 "$scpu" 0 "$ok"
  log "  $wall s, $(awk "BEGIN{printf \"%.0f\", $changes / $wall}") rows/s, replica server CPU $tcpu s, verified $ok"
}

run_chameleon_backlog() {
  local label="pg_chameleon $chameleon_version MySQL→PostgreSQL"
  log "backlog: $label"
  local t0 s0 g0 wall cpu rss tcpu scpu pg_pid
  pg_pid=$(pid_of pg)
  local x0 p0=$polls commits
  x0=$(target_commits pg)
  s0=$(tree_cpu "$src_pid"); g0=$(tree_cpu "$pg_pid"); t0=$(now)
  chameleon_start backlog
  if ! chameleon_wait; then
    emit "{\"name\":\"$label\",\"kind\":\"pg\",\"phase\":\"backlog\",\"failed\":\"$(json_str "$(grep -E 'Error|ERROR' "$base/chameleon-backlog.log" | tail -1)")\"}"
    chameleon_stop; return
  fi
  wall=$(elapsed "$t0")
  cpu=$(tree_cpu "$chameleon_pid"); rss=$(tree_rss_kb "$chameleon_pid")
  chameleon_stop
  commits=$(commits_since pg "$x0" "$p0")
  tcpu=$(awk "BEGIN{printf \"%.2f\", $(tree_cpu "$pg_pid") - $g0}"); scpu=$(awk "BEGIN{printf \"%.2f\", $(tree_cpu "$src_pid") - $s0}")
  local ok=false
  verify pg:sbtest_chameleon && ok=true
  backlog_line "$label" pg "$wall" "$cpu" "$tcpu" "$scpu" "$rss" "$ok" "\"target_commits\":$commits"
  log "  $wall s, $(awk "BEGIN{printf \"%.0f\", $changes / $wall}") rows/s, pg_chameleon CPU $cpu s, verified $ok"
}

sluice_ok() { ! printf '%s\n' "${failed[@]}" | grep -q "^sluice $1|"; }
if wanted sluice; then
  sluice_ok MySQL→PostgreSQL && run_sluice_backlog pg bench-cdc-pg "sluice MySQL→PostgreSQL" "$(pid_of pg)" pg:sbtest_sluice
  sluice_ok MySQL→MySQL && run_sluice_backlog my bench-cdc-my "sluice MySQL→MySQL" "$(pid_of tgt)" tgt:sbtest_sluice
fi
if wanted native; then
  run_native_backlog rep1 "MariaDB native replica (serial)"
  run_native_backlog rep4 "MariaDB native replica ($parallel_threads threads, $parallel_mode)"
fi
if [[ -n "$chameleon_ok" ]]; then run_chameleon_backlog; fi

# --- latency at a fixed rate -----------------------------------------------------------------
# rate_load NAME: sysbench at --rate for --latency-seconds; prints "tps row_changes".
rate_load() {
  sysbench oltp_write_only "${sb_common[@]}" --threads="$threads" --rate="$rate" --time="$latency_seconds" \
    --report-interval=0 run >"$base/sysbench-$1.log"
  awk '/transactions:/ {gsub(/[()]/, "", $3); print $3, $2 * 4}' "$base/sysbench-$1.log"
}
run_sluice_latency() {
  local kind=$1 name=$2 label=$3 target=$4 file pos
  log "latency: $label at $rate tx/s for $latency_seconds s"
  # Catch up with whatever ran since (other replicators' rate loads), then start afresh, so the
  # histogram holds only the rate load's transactions.
  read -r file pos < <(master_status)
  sluice_start "$kind" "$name" cdc "$name-catchup"
  sluice_wait "$kind" "$name" "$file" "$pos" || { sluice_stop; emit "{\"name\":\"$label\",\"kind\":\"$kind\",\"phase\":\"latency\",\"failed\":\"no catch-up before the rate load\"}"; return; }
  sluice_stop
  sluice_start "$kind" "$name" cdc "$name-latency"
  sleep 2
  local c0 t0 tps rchanges wall cpu rss
  c0=$(tree_cpu "$sluice_pid"); t0=$(now)
  read -r tps rchanges < <(rate_load "$name")
  read -r file pos < <(master_status)
  if ! sluice_wait "$kind" "$name" "$file" "$pos"; then
    sluice_stop; emit "{\"name\":\"$label\",\"kind\":\"$kind\",\"phase\":\"latency\",\"failed\":\"$(json_str "$(grep -v '^\s*$' "$base/$name-latency.log" | tail -1)")\"}"; return
  fi
  wall=$(elapsed "$t0")
  cpu=$(awk "BEGIN{printf \"%.2f\", $(tree_cpu "$sluice_pid") - $c0}"); rss=$(tree_rss_kb "$sluice_pid")
  sluice_stop
  local ok=false stream
  verify "$target" && ok=true
  stream=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); st=s["stream"]; print(json.dumps({"status": s["status"], "p50_ms": st["latency_p50_ms"], "p99_ms": st["latency_p99_ms"], "sluice_rows_applied": st["rows_applied"], "sluice_transactions_applied": st["transactions_applied"], "histogram": {str(b["up_to_ms"]): b["transactions"] for b in st["latency_histogram"] if b["transactions"]}})[1:-1])' "$base/$name-latency.json" 2>/dev/null || echo '"failed":"no summary JSON"')
  emit "{\"name\":\"$label\",\"kind\":\"$kind\",\"phase\":\"latency\",\"rate\":$rate,\"tps\":$tps,\"row_changes\":$rchanges,\"seconds\":$latency_seconds,\"cpu\":$cpu,\"cpu_per_s\":$(awk "BEGIN{printf \"%.3f\", $cpu / $wall}"),\"rss_kb\":$rss,\"verified\":$ok,$stream}"
  log "  $(tail -1 "$results")"
}
run_native_latency() {
  local replica=$1 label=$2 file pos
  log "latency: $label at $rate tx/s for $latency_seconds s"
  my "$replica" -e "START SLAVE"
  read -r file pos < <(master_status)
  native_wait "$replica" "$file" "$pos" || { my "$replica" -e "STOP SLAVE"; emit "{\"name\":\"$label\",\"kind\":\"my\",\"phase\":\"latency\",\"failed\":\"no catch-up before the rate load\"}"; return; }
  # Seconds_Behind_Master, once a second, while the load runs.
  (while :; do my "$replica" -e "SHOW SLAVE STATUS\G" | awk '/Seconds_Behind_Master:/ {print $2}'; sleep 1; done) >"$base/sbm-$replica.log" &
  local sampler=$!
  bg_pids+=("$sampler")
  local tps rchanges
  read -r tps rchanges < <(rate_load "$replica")
  kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true
  read -r file pos < <(master_status)
  native_wait "$replica" "$file" "$pos" || true
  my "$replica" -e "STOP SLAVE"
  local ok=false sbm
  verify "$replica:sbtest" && ok=true
  sbm=$(awk '$1 ~ /^[0-9]+$/ {n++; s += $1; if ($1 > m) m = $1} END {printf "\"sbm_max_s\":%d,\"sbm_mean_s\":%.2f,\"sbm_samples\":%d", m, n ? s / n : 0, n}' "$base/sbm-$replica.log")
  emit "{\"name\":\"$label\",\"kind\":\"my\",\"phase\":\"latency\",\"rate\":$rate,\"tps\":$tps,\"row_changes\":$rchanges,\"seconds\":$latency_seconds,\"verified\":$ok,$sbm}"
  log "  $(tail -1 "$results")"
}
if wanted sluice; then
  sluice_ok MySQL→PostgreSQL && run_sluice_latency pg bench-cdc-pg "sluice MySQL→PostgreSQL" pg:sbtest_sluice
  sluice_ok MySQL→MySQL && run_sluice_latency my bench-cdc-my "sluice MySQL→MySQL" tgt:sbtest_sluice
fi
if wanted native; then
  run_native_latency rep1 "MariaDB native replica (serial)"
  run_native_latency rep4 "MariaDB native replica ($parallel_threads threads, $parallel_mode)"
fi

# Odd lines in sluice's logs (warnings, errors), kept next to the results.
grep -hE "WARN|ERROR|error|panick" "$base"/bench-cdc-*.log 2>/dev/null | grep -v "stopping: finishing the batches" | sed -E 's/^[0-9TZ:.-]+ //' | sort | uniq -c | sort -rn | head -20 >"$base/sluice-warnings.txt" || true
if [[ -s "$base/sluice-warnings.txt" ]]; then log "sluice warnings/errors:"; cat "$base/sluice-warnings.txt" >&2; fi

# --- report ----------------------------------------------------------------------------------
python3 - "$results" <<'PY' | tee "$out/cdc-$stamp.md"
import json, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
load = next(r for r in runs if r["name"] == "load")
print(f"`{load['command']}` (sluice binary {load['sluice_binary']})\n")
print(f"{load['tables']} × {load['table_rows']:,} sysbench rows; backlog: oltp_write_only, {load['threads']} threads, "
      f"{load['seconds']} s at {load['sysbench_tps']:,.0f} tx/s → {load['row_changes']:,} row changes in "
      f"{load['transactions']:,} transactions ({load['binlog_bytes'] / 1e6:,.0f} MB of binlog)\n")
backlog = [r for r in runs if r.get("phase") == "backlog" and r["name"] != "load"]
print("### Apply throughput on the backlog\n")
print("tool CPU: sluice's process, pg_chameleon's python processes, or the whole replica mariadbd; "
      "target/source CPU: the target and source servers' during the catch-up.\n")
for kind, title in (("pg", "MySQL → PostgreSQL"), ("my", "MySQL → MySQL")):
    rows = [r for r in backlog if r.get("kind", kind) == kind and (kind == "pg") == ("PostgreSQL" in r["name"])]
    if not rows:
        continue
    sluice = next((r for r in rows if r["name"].startswith("sluice") and "failed" not in r), None)
    print(f"#### {title}\n")
    print("| tool | × sluice's rows/s | catch-up s | rows/s | tool CPU s | rows per tool CPU-s | target CPU s | source CPU s | rows per total CPU-s | peak RSS MB | source tx per target commit | target = source |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "failed" in r:
            print(f"| {r['name']} | failed: {r['failed']} | | | | | | | | | | |")
            continue
        grouping = f"{r['transactions'] / r['target_commits']:,.1f} ({r['target_commits']:,} commits)" if r.get("target_commits", 0) > 0 else "-"
        total = r["tool_cpu"] + r["target_cpu"] + r["source_cpu"]
        vs = f"{r['rows_per_s'] / sluice['rows_per_s']:.2f}" if sluice else "-"
        rss = f"{r['rss_kb'] / 1024:,.0f}" if r["rss_kb"] else "-"
        tgt = f"{r['target_cpu']:.1f}" if "native" not in r["name"] else "(in tool)"
        print(f"| {r['name']} | {vs} | {r['wall']:.1f} | {r['rows_per_s']:,} | {r['tool_cpu']:.1f} | "
              f"{r['row_changes'] / max(r['tool_cpu'], 0.01):,.0f} | {tgt} | {r['source_cpu']:.1f} | "
              f"{r['row_changes'] / max(total, 0.01):,.0f} | {rss} | {grouping} | {'yes' if r['verified'] else 'NO'} |")
    print()
latency = [r for r in runs if r.get("phase") == "latency"]
if latency:
    print("### Latency at a fixed rate\n")
    print("sluice: its summary's latency_p50_ms/p99_ms, upper bounds of histogram buckets, per source transaction from "
          "its source commit (whole seconds in the binlog, so in practice from its arrival at sluice) to its target commit; "
          "native: Seconds_Behind_Master sampled every second (whole seconds).\n")
    print("| tool | rate tx/s (achieved) | row changes | p50 | p99 | replica lag (SBM) max / mean s | tool CPU per s | peak RSS MB | target = source |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in latency:
        if "failed" in r:
            print(f"| {r['name']} | failed: {r['failed']} | | | | | | | |")
            continue
        p50 = f"≤ {r['p50_ms']} ms" if "p50_ms" in r else "-"
        p99 = f"≤ {r['p99_ms']} ms" if "p99_ms" in r else "-"
        sbm = f"{r['sbm_max_s']} / {r['sbm_mean_s']:.2f}" if "sbm_max_s" in r else "-"
        cpu = f"{r['cpu_per_s']:.2f}" if "cpu_per_s" in r else "-"
        rss = f"{r['rss_kb'] / 1024:,.0f}" if r.get("rss_kb") else "-"
        print(f"| {r['name']} | {r['rate']} ({r['tps']:,.0f}) | {r['row_changes']:,} | {p50} | {p99} | {sbm} | {cpu} | {rss} | {'yes' if r['verified'] else 'NO'} |")
    print()
    for r in latency:
        if "histogram" in r:
            print(f"{r['name']} histogram (ms bound: transactions): " + ", ".join(f"{k}: {v:,}" for k, v in r["histogram"].items()) + "\n")
PY
