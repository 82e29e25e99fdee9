"""The Kafka side of bench/streams.sh, through confluent-kafka (librdkafka), independent of sluice.

    kafka_bench.py count BOOTSTRAP TOPIC N        reads TOPIC (read_committed) from its beginning
                                                  until N records; prints {"records", "bytes",
                                                  "ended"} (the Unix time the last one came)
    kafka_bench.py produce BOOTSTRAP TOPIC N SIZE the broker's own limit: N records of SIZE bytes,
                                                  keyed, acks=all, idempotent, as fast as they go;
                                                  prints {"messages", "seconds", "per_second"}
    kafka_bench.py latency BOOTSTRAP TOPIC SECONDS reads TOPIC from its end for SECONDS; each
                                                  record's row carries `t`, the source client's
                                                  Unix time at its commit; prints the percentiles
                                                  of (arrival - t) in milliseconds
"""

import json
import sys
import time

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition, OFFSET_END


def consumer(bootstrap):
    return Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": "sluice-bench",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        "fetch.max.bytes": 64 * 1024 * 1024,
        # The broker answers a fetch at once when it has records; without them it holds the
        # fetch this long (librdkafka's 500 ms default would be measured as latency).
        "fetch.wait.max.ms": 10,
    })


def partitions(client, topic, offset):
    deadline = time.time() + 60
    while True:
        found = client.list_topics(topic, timeout=30).topics.get(topic)
        if found is not None and found.error is None and found.partitions:
            return [TopicPartition(topic, partition, offset) for partition in sorted(found.partitions)]
        if time.time() > deadline:
            sys.exit(f"topic {topic} does not exist")
        time.sleep(0.1)


def count(bootstrap, topic, wanted):
    client = consumer(bootstrap)
    client.assign(partitions(client, topic, 0))
    records = size = 0
    while records < wanted:
        for message in client.consume(num_messages=10000, timeout=1.0):
            if message.error():
                if message.error().code() != KafkaError._PARTITION_EOF:
                    sys.exit(f"reading: {message.error()}")
                continue
            records += 1
            size += len(message.value() or b"")
            ended = time.time()
    print(json.dumps({"records": records, "bytes": size, "ended": ended}))


def produce(bootstrap, topic, messages, size):
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "queue.buffering.max.messages": 1000000,
    })
    payload = b"x" * size
    failed = []
    started = time.time()
    for index in range(messages):
        while True:
            try:
                producer.produce(topic, payload, key=str(index).encode(), on_delivery=lambda error, _: error and failed.append(error))
                break
            except BufferError:
                producer.poll(0.01)
        if index % 10000 == 0:
            producer.poll(0)
    producer.flush(120)
    seconds = time.time() - started
    if failed:
        sys.exit(f"{len(failed)} records were not delivered: {failed[0]}")
    print(json.dumps({"messages": messages, "seconds": round(seconds, 3), "per_second": round(messages / seconds)}))


def latency(bootstrap, topic, seconds):
    client = consumer(bootstrap)
    client.assign(partitions(client, topic, OFFSET_END))
    delays = []
    deadline = time.time() + seconds
    while time.time() < deadline:
        # One record at a time: poll returns as soon as one is there (consume(n) would wait
        # for n records or its timeout, and that wait would be measured as latency).
        message = client.poll(0.2)
        if message is not None and not message.error():
            arrived = time.time()
            event = json.loads(message.value())
            event = event.get("payload", event)
            row = event.get("data") or event.get("after") or {}
            if "t" in row:
                delays.append((arrived - float(row["t"])) * 1000)
    delays.sort()
    pick = lambda share: round(delays[min(len(delays) - 1, int(share * len(delays)))], 1) if delays else None
    print(json.dumps({"events": len(delays), "p50_ms": pick(0.50), "p99_ms": pick(0.99), "max_ms": pick(1.0)}))


def main():
    command, arguments = sys.argv[1], sys.argv[2:]
    if command == "count":
        count(arguments[0], arguments[1], int(arguments[2]))
    elif command == "produce":
        produce(arguments[0], arguments[1], int(arguments[2]), int(arguments[3]))
    elif command == "latency":
        latency(arguments[0], arguments[1], float(arguments[2]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
