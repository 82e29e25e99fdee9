#!/usr/bin/env bash
# Soak (issue 15): two snapshot+cdc jobs, MariaDB → PostgreSQL and MariaDB → MariaDB, on a
# two-node cluster over one etcd member, under a mixed write load, while a nemesis SIGKILLs
# nodes and injects network faults through the fault proxy (crates/sluice-faults, as the
# `sluice-fault-proxy` process) between the nodes and the source, both targets and etcd.
#
#   bench/soak.sh [--minutes 30] [--kill-every 3] [--rate 150] [--items 20000] [--lease-secs 3]
#                 [--out bench/results]
#
# - Load: inserts, updates (hot keys too), deletes, primary-key moves and transfers between 200
#   accounts in multi-statement transactions that keep the sum of balances at 200000, written
#   straight to the source (not through a proxy), --rate statements a second.
# - Nemesis, every --kill-every seconds: SIGKILL a random node and start it again at once; and
#   one random fault on a random link (source, postgres, mysql, etcd): reset every connection,
#   stall 2 s, 150 ms latency for 4 s, or down (connections refused) for 3 s.
# - Samplers, every 200 ms per target: `count(*), sum(balance)` of the accounts once the table
#   is visible; any other answer than 200 / 200000 is a partial transaction seen.
# - At the end: faults off, the load stopped, both targets waited on until they hold the
#   source's rows, then compared row by row (lost: in the source only; extra: in the target
#   only; a changed row counts as both).
#
# Prints a Markdown table and writes it with the raw figures as a JSON line under --out.
set -euo pipefail
cd "$(dirname "$0")/.."
command_line="bench/soak.sh $*"

minutes=30
kill_every=3
rate=150
items=20000
lease_secs=3
out=bench/results
while (($#)); do
  case $1 in
    --minutes) minutes=$2; shift 2 ;;
    --kill-every) kill_every=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --items) items=$2; shift 2 ;;
    --lease-secs) lease_secs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--minutes N] [--kill-every S] [--rate N] [--items N] [--lease-secs N] [--out DIR]" >&2; exit 2 ;;
  esac
done

export SLUICE_TEST_PASSWORD=${SLUICE_TEST_PASSWORD:-CANARY-7f3a9c-secret}
scripts/testdb install
cargo build --release -q -p sluice -p sluice-faults
sluice=$PWD/target/release/sluice
proxy=$PWD/target/release/sluice-fault-proxy

work=$(mktemp -d /dev/shm/sluice-soak.XXXXXX)
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}" $(cat "$work"/node*.pid 2>/dev/null); do
    kill -9 "$pid" 2>/dev/null || true
  done
  scripts/testdb stop mariadb "$work/source" >/dev/null 2>&1 || true
  scripts/testdb stop mariadb "$work/mysql" >/dev/null 2>&1 || true
  scripts/testdb stop postgres "$work/postgres" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

port_of() { echo "${1##*:}" | sed 's|/.*||'; }
source_url=$(scripts/testdb start mariadb "$work/source" | sed -n 's/^URL=//p')
mysql_url=$(scripts/testdb start mariadb "$work/mysql" | sed -n 's/^URL=//p')
postgres_url=$(scripts/testdb start postgres "$work/postgres" | sed -n 's/^URL=//p')
src() { mariadb --no-defaults -uroot -S "$work/source/mysql.sock" -N --batch "$@"; }
dst_my() { mariadb --no-defaults -uroot -S "$work/mysql/mysql.sock" -N --batch "$@"; }
dst_pg() { psql "$postgres_url" -X -At -v ON_ERROR_STOP=1 "$@"; }

# etcd, one member.
etcd_client=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
etcd_peer=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
etcd --name soak --data-dir "$work/etcd" --listen-client-urls "http://127.0.0.1:$etcd_client" \
  --advertise-client-urls "http://127.0.0.1:$etcd_client" --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" --initial-cluster "soak=http://127.0.0.1:$etcd_peer" \
  >"$work/etcd.log" 2>&1 &
pids+=($!)

# One fault proxy per link, driven through a FIFO.
declare -A listen
for link in source postgres mysql etcd; do
  case $link in
    source) upstream="127.0.0.1:$(port_of "${source_url#*@}")" ;;
    mysql) upstream="127.0.0.1:$(port_of "${mysql_url#*@}")" ;;
    postgres) upstream="127.0.0.1:$(port_of "${postgres_url#*@}")" ;;
    etcd) upstream="127.0.0.1:$etcd_client" ;;
  esac
  mkfifo "$work/$link.fifo"
  "$proxy" "$upstream" <"$work/$link.fifo" >"$work/$link.proxy" 2>&1 &
  pids+=($!)
  exec {fd}>"$work/$link.fifo"
  eval "fault_fd_$link=$fd"
  for _ in $(seq 100); do grep -q LISTEN "$work/$link.proxy" && break; sleep 0.05; done
  listen[$link]=$(sed -n 's/^LISTEN //p' "$work/$link.proxy")
done
fault() { local fd="fault_fd_$1"; echo "$2" >&"${!fd}"; }
through() { echo "$1" | sed "s|@127.0.0.1:[0-9]*|@${listen[$2]}|"; }

export SOAK_SOURCE SOAK_POSTGRES SOAK_MYSQL
SOAK_SOURCE=$(through "$source_url" source)
SOAK_POSTGRES=$(through "$postgres_url" postgres)
SOAK_MYSQL=$(through "$mysql_url" mysql)

api_ports=()
start_node() {
  local index=$1
  (
    exec "$sluice" server --listen "127.0.0.1:${api_ports[$index]}" --node-id "n$index" \
      --state-dir "$work/state$index" --etcd "http://${listen[etcd]}" --lease-secs "$lease_secs" --env-prefix SOAK_
  ) >>"$work/node$index.log" 2>&1 &
  echo $! >"$work/node$index.pid"
}
for index in 0 1; do
  api_ports[index]=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  start_node "$index"
done
for _ in $(seq 200); do curl -sf "http://127.0.0.1:${api_ports[0]}/healthz" >/dev/null && break; sleep 0.1; done

# The source tables, and the jobs.
src -e "CREATE DATABASE soak; USE soak;
  CREATE TABLE items (id BIGINT PRIMARY KEY, v INT NOT NULL, note VARCHAR(64) NULL, KEY (v));
  INSERT INTO items SELECT seq, seq % 1000, CONCAT('item ', seq) FROM seq_1_to_$items;
  CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL);
  INSERT INTO accounts SELECT seq, 1000 FROM seq_1_to_200;"
for target in postgres mysql; do
  variable=SOAK_${target^^}
  cat >"$work/$target.yaml" <<EOF
name: soak-$target
mode: snapshot+cdc
source: {type: mysql, url: "\${SOAK_SOURCE}", tables: ["soak.*"]}
target: {type: $target, url: "\${$variable}", namespace: soak_${target:0:2}}
limits: {batch_rows: 500, split_rows: 2000}
EOF
  "$sluice" job submit "$work/$target.yaml" --server "http://127.0.0.1:${api_ports[0]}" >/dev/null
done

# The load. (Background subshells drop the EXIT trap: killed at the end, they must not clean up.)
(
  trap - EXIT
  next=$((items + 1))
  while [[ ! -e $work/stop ]]; do
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      id=$((1 + (RANDOM * 32768 + RANDOM) % next))
      case $((RANDOM % 20)) in
        0 | 1 | 2 | 3 | 4 | 5) echo "INSERT INTO items VALUES ($next, $((RANDOM % 1000)), 'new $RANDOM');"; next=$((next + 1)) ;;
        6 | 7 | 8 | 9) echo "UPDATE items SET v = v + 1, note = 'u$RANDOM' WHERE id = $id;" ;;
        10 | 11) echo "UPDATE items SET v = v + 1 WHERE id = $((1 + RANDOM % 5));" ;;
        12 | 13) echo "DELETE FROM items WHERE id = $id;" ;;
        14) echo "UPDATE items SET id = $next WHERE id = $id;"; next=$((next + 1)) ;;
        *)
          from=$((1 + RANDOM % 200)) to=$((1 + RANDOM % 200)) amount=$((1 + RANDOM % 50))
          echo "BEGIN; UPDATE accounts SET balance = balance - $amount WHERE id = $from; INSERT INTO items VALUES ($next, 0, 'transfer'); UPDATE accounts SET balance = balance + $amount WHERE id = $to; COMMIT;"
          next=$((next + 1)) ;;
      esac
    done
    sleep "$(awk "BEGIN {print 10 / $rate}")"
  done | src --force soak >/dev/null 2>&1
) &
load_pid=$!
pids+=("$load_pid")

# The samplers: one line per sample, "ok", "absent" or the wrong answer.
sample_postgres() { dst_pg -c "SELECT count(*) || ' ' || sum(balance) FROM soak_po.accounts" 2>/dev/null || echo absent; }
sample_mysql() { dst_my -e "SELECT CONCAT(count(*), ' ', sum(balance)) FROM soak_my.accounts" 2>/dev/null || echo absent; }
for target in postgres mysql; do
  (
    trap - EXIT
    while [[ ! -e $work/stop-sampling ]]; do
      answer=$("sample_$target")
      case $answer in "200 200000") echo ok ;; absent | "") echo absent ;; *) echo "bad $answer" ;; esac
      sleep 0.2
    done >"$work/$target.samples"
  ) &
  pids+=($!)
done

# The nemesis.
kills=0
declare -A faults=([source]=0 [postgres]=0 [mysql]=0 [etcd]=0)
started=$(date +%s)
deadline=$((started + minutes * 60))
echo "soak: running ${minutes} min, a kill and a fault every ${kill_every} s (work dir $work)" >&2
while (($(date +%s) < deadline)); do
  sleep "$kill_every"
  victim=$((RANDOM % 2))
  kill -9 "$(cat "$work/node$victim.pid")" 2>/dev/null || true
  wait "$(cat "$work/node$victim.pid")" 2>/dev/null || true
  start_node "$victim"
  kills=$((kills + 1))
  links=(source postgres mysql etcd)
  link=${links[$((RANDOM % 4))]}
  case $((RANDOM % 4)) in
    0) fault "$link" reset ;;
    1) fault "$link" stall; sleep 2; fault "$link" none ;;
    2) fault "$link" "latency 150"; sleep 4; fault "$link" none ;;
    3) fault "$link" down; sleep 3; fault "$link" none ;;
  esac
  faults[$link]=$((faults[$link] + 1))
  if ((kills % 20 == 0)); then
    echo "soak: $((($(date +%s) - started) / 60)) min, $kills kills" >&2
  fi
done
for link in source postgres mysql etcd; do fault "$link" none; done
elapsed=$((($(date +%s) - started) / 60))

# The end: the load stops, the targets catch up, then every row is compared.
touch "$work/stop"
wait "$load_pid" || true
changes=$(src -e "SELECT sum(variable_value) FROM information_schema.global_status WHERE variable_name IN ('COM_INSERT', 'COM_UPDATE', 'COM_DELETE')")
dump_source() { src -e "SELECT concat_ws('|', id, v, coalesce(note, 'NULL')) FROM soak.items ORDER BY id; SELECT concat_ws('|', id, balance) FROM soak.accounts ORDER BY id"; }
dump_postgres() { dst_pg -c "SELECT concat_ws('|', id, v, coalesce(note, 'NULL')) FROM soak_po.items ORDER BY id" -c "SELECT concat_ws('|', id, balance) FROM soak_po.accounts ORDER BY id" 2>/dev/null; }
dump_mysql() { dst_my -e "SELECT concat_ws('|', id, v, coalesce(note, 'NULL')) FROM soak_my.items ORDER BY id; SELECT concat_ws('|', id, balance) FROM soak_my.accounts ORDER BY id" 2>/dev/null; }
dump_source >"$work/source.rows"
declare -A lost extra converged_after
for target in postgres mysql; do
  waited=0
  converged_after[$target]="no (gave up after 300 s)"
  while ((waited <= 300)); do
    if "dump_$target" >"$work/$target.rows" && cmp -s "$work/source.rows" "$work/$target.rows"; then
      converged_after[$target]="$waited s"
      break
    fi
    sleep 2
    waited=$((waited + 2))
  done
  lost[$target]=$(comm -23 <(sort "$work/source.rows") <(sort "$work/$target.rows") | wc -l)
  extra[$target]=$(comm -13 <(sort "$work/source.rows") <(sort "$work/$target.rows") | wc -l)
done
rows=$(wc -l <"$work/source.rows")
touch "$work/stop-sampling"
sleep 0.5
declare -A samples bad
for target in postgres mysql; do
  samples[$target]=$(grep -c -v absent "$work/$target.samples" || true)
  bad[$target]=$(grep -c '^bad' "$work/$target.samples" || true)
done
restarts=$(cat "$work"/node*.log | grep -c "restart .* in " || true)
fenced=$(cat "$work"/node*.log | grep -c "FENCED" || true)
# The servers' password is a canary: no log may hold it.
leaked=$(grep -l -F "$SLUICE_TEST_PASSWORD" "$work"/node*.log | wc -l)

mkdir -p "$out"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
table="| target | minutes | SIGKILLs | faults (source/postgres/mysql/etcd) | rows compared | lost | extra | samples | partial seen | converged after load stop |
|---|---|---|---|---|---|---|---|---|---|"
for target in postgres mysql; do
  table+="
| $target | $elapsed | $kills | ${faults[source]}/${faults[postgres]}/${faults[mysql]}/${faults[etcd]} | $rows | ${lost[$target]} | ${extra[$target]} | ${samples[$target]} | ${bad[$target]} | ${converged_after[$target]} |"
done
echo "$table"
echo "task restarts logged: $restarts; fenced commits refused (FENCED in the logs): $fenced; row statements on the source: $changes; logs holding the password: $leaked"
{
  echo "$table"
  echo
  echo "command: $command_line"
} >"$out/soak-$stamp.md"
printf '{"minutes":%s,"kills":%s,"faults":{"source":%s,"postgres":%s,"mysql":%s,"etcd":%s},"rows":%s,"postgres":{"lost":%s,"extra":%s,"samples":%s,"partial":%s,"converged":"%s"},"mysql":{"lost":%s,"extra":%s,"samples":%s,"partial":%s,"converged":"%s"},"restarts":%s,"fenced":%s,"row_statements":%s,"leaked":%s}\n' \
  "$elapsed" "$kills" "${faults[source]}" "${faults[postgres]}" "${faults[mysql]}" "${faults[etcd]}" "$rows" \
  "${lost[postgres]}" "${extra[postgres]}" "${samples[postgres]}" "${bad[postgres]}" "${converged_after[postgres]}" \
  "${lost[mysql]}" "${extra[mysql]}" "${samples[mysql]}" "${bad[mysql]}" "${converged_after[mysql]}" \
  "$restarts" "$fenced" "$changes" "$leaked" >"$out/soak-$stamp.json"
if ((lost[postgres] + extra[postgres] + lost[mysql] + extra[mysql] + bad[postgres] + bad[mysql] + leaked > 0)); then
  echo "soak: MISMATCHES; logs kept in $work.kept" >&2
  cp -r "$work" "$work.kept"
  exit 1
fi
