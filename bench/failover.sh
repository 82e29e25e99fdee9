#!/usr/bin/env bash
# Failover benchmark (issue 5's target): a snapshot+cdc job MariaDB → PostgreSQL under a write
# load of 200 statements/s on a 3-node cluster over one etcd member, with the nodes' default
# lease (2 s; --lease N for another). The node running
# the change stream is SIGKILLed --trials times (and started again after each); each trial is
# timed from the SIGKILL to the first commit of the stream on another node (its committed row
# count in the target moves). At the end the target is compared with the source row by row.
#
#   bench/failover.sh [--trials 20] [--lease 2] [--out bench/results]
#
# It runs the integration test `cluster::the_stream_fails_over_when_its_node_is_killed_…` with
# SLUICE_FAILOVER_TRIALS and SLUICE_FAILOVER_REPORT, on hermetic servers (scripts/testdb).
set -euo pipefail
cd "$(dirname "$0")/.."

trials=20
lease=2
out=bench/results
while (($#)); do
  case $1 in
    --trials) trials=$2; shift 2 ;;
    --lease) lease=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--trials N] [--lease SECONDS] [--out DIR]" >&2; exit 2 ;;
  esac
done

export SLUICE_TEST_PASSWORD=${SLUICE_TEST_PASSWORD:-CANARY-7f3a9c-secret}
scripts/testdb install
base=$(mktemp -d /dev/shm/sluice-failover.XXXXXX)
trap 'scripts/testdb stop mariadb "$base/m" >/dev/null 2>&1 || true; scripts/testdb stop postgres "$base/p" >/dev/null 2>&1 || true; rm -rf "$base"' EXIT
m=$(scripts/testdb start mariadb "$base/m")
p=$(scripts/testdb start postgres "$base/p")
export SLUICE_TEST_MYSQL_URL=${m#URL=} SLUICE_TEST_POSTGRES_URL=${p#URL=} SLUICE_TEST_MYSQL_SOCKET=$base/m/mysql.sock

mkdir -p "$out"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
report="$PWD/$out/failover-$stamp.json"
SLUICE_FAILOVER_TRIALS=$trials SLUICE_FAILOVER_REPORT=$report SLUICE_TEST_LEASE_SECS=$lease \
  cargo test -p sluice --test suite the_stream_fails_over -- --nocapture --test-threads 1
python3 - "$report" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
s = sorted(r["seconds"])
print(f"| trials | lease | p50 | p99 | min | max |\n|---|---|---|---|---|---|")
print(f"| {r['trials']} | {r['lease_secs']} s | {r['p50']:.2f} s | {r['p99']:.2f} s | {s[0]:.2f} s | {s[-1]:.2f} s |")
print("all (s): " + ", ".join(f"{x:.2f}" for x in r["seconds"]))
PY
