#!/usr/bin/env bash
# Cluster scale harness (issue 41): a 3-member etcd, N `sluice server` workers on this machine
# (each with a small capacity), J snapshot jobs of S splits each from `generate` into
# `blackhole`. Reports idle etcd requests per second (per worker and by method), submit ->
# planned and submit -> finished, rows counted exactly once per job, workers' memory and CPU,
# etcd's database size, and with --kills K the time a killed worker's tasks take to run
# elsewhere. The JSON report goes to bench/results/cluster-scale-<stamp>.json.
#
#   bench/cluster_scale.sh [--workers 10] [--jobs 100] [--splits 10] [--split-rows 1000]
#                          [--capacity 4] [--lease 2] [--idle-seconds 30] [--kills 0]
#                          [--sluice PATH] [--out bench/results]
set -euo pipefail
cd "$(dirname "$0")/.."

out=bench/results
sluice=
passed=()
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --sluice) sluice=$2; shift 2 ;;
    --workers|--jobs|--splits|--split-rows|--capacity|--lease|--idle-seconds|--kills) passed+=("$1" "$2"); shift 2 ;;
    *) sed -n '2,12p' "$0" >&2; exit 2 ;;
  esac
done
scripts/testdb install >/dev/null
if [[ -z $sluice ]]; then
  cargo build --release --quiet -p sluice --bin sluice
  sluice=$PWD/target/release/sluice
fi
mkdir -p "$out"
report="$out/cluster-scale-$(date -u +%Y%m%dT%H%M%SZ).json"
python3 bench/cluster_scale.py --sluice "$sluice" --report "$report" "${passed[@]}"
echo "report: $report"
