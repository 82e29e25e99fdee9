#!/usr/bin/env bash
# Scale run: sluice MySQL→PostgreSQL on one sysbench table of 1 M, 3 M and 10 M rows.
# Time should grow linearly and peak RSS stay flat (memory is set by configuration, not size).
#
#   bench/scale.sh [--sizes "1000000 3000000 10000000"] [--out bench/results]
set -euo pipefail
cd "$(dirname "$0")/.."

sizes="1000000 3000000 10000000"
out=bench/results
while [[ $# -gt 0 ]]; do
  case "$1" in
    --sizes) sizes=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--sizes \"N ...\"] [--out DIR]" >&2; exit 2 ;;
  esac
done
# The servers (MariaDB, PostgreSQL, etcd) come from the project's installer.
scripts/testdb install >/dev/null
command -v sysbench >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq sysbench time >/dev/null; }
export SLUICE_TEST_PASSWORD=bench-pw
cargo build --release --quiet -p sluice --bin sluice
sluice=$PWD/target/release/sluice

base=$(mktemp -d /dev/shm/sluice-scale.XXXXXX)
cleanup() {
  scripts/testdb stop mariadb "$base/mariadb" >/dev/null 2>&1 || true
  scripts/testdb stop postgres "$base/postgres" >/dev/null 2>&1 || true
  rm -rf "$base"
}
trap cleanup EXIT
mysql_url=$(scripts/testdb start mariadb "$base/mariadb"); mysql_url=${mysql_url#URL=}
postgres_url=$(scripts/testdb start postgres "$base/postgres"); postgres_url=${postgres_url#URL=}
my="mariadb --no-defaults -uroot -S $base/mariadb/mysql.sock"
largest=$(tr ' ' '\n' <<<"$sizes" | sort -n | tail -1)
$my -e "SET GLOBAL innodb_buffer_pool_size = 1073741824; CREATE DATABASE sbtest"
echo "preparing $largest rows" >&2
sysbench oltp_read_write --db-driver=mysql --mysql-socket="$base/mariadb/mysql.sock" --mysql-user=root \
  --mysql-db=sbtest --tables=1 --table-size="$largest" prepare >/dev/null

mkdir -p "$out"
report="$out/scale-$(date -u +%Y%m%dT%H%M%SZ).md"
{
  echo "| rows | wall s | rows/s | sluice CPU s | rows per CPU-s | peak RSS MB |"
  echo "|---|---|---|---|---|---|"
} > "$report"
for size in $sizes; do
  $my -e "DROP DATABASE IF EXISTS scale; CREATE DATABASE scale; CREATE TABLE scale.t LIKE sbtest.sbtest1;
          INSERT INTO scale.t SELECT * FROM sbtest.sbtest1 WHERE id <= $size"
  $my -N -e "SELECT count(*), sum(length(c)) FROM scale.t" >/dev/null
  cat > "$base/scale.yaml" <<EOF
name: scale-$size
source:
  type: mysql
  url: $mysql_url
  tables: ["scale.t"]
target:
  type: postgres
  url: $postgres_url
  namespace: scale_$size
parallelism: 4
EOF
  echo "running $size rows" >&2
  /usr/bin/time -f "%e %U %S %M" -o "$base/time" "$sluice" run "$base/scale.yaml" --state-dir "$base/state-$size" >/dev/null 2>&1
  read -r wall user system rss < "$base/time"
  python3 -c "
size, wall, cpu, rss = $size, $wall, $user + $system, $rss
print(f'| {size:,} | {wall:.2f} | {size / wall:,.0f} | {cpu:.2f} | {size / cpu:,.0f} | {rss / 1024:,.0f} |')" >> "$report"
done
cat "$report"
