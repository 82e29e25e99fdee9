"""Prints every committed message of Kafka topics as JSON lines, in partition then offset order:
an independent reader (confluent-kafka, librdkafka) for the Kafka target's tests.

    kafka_read.py BOOTSTRAP TOPIC...
    kafka_read.py BOOTSTRAP --list      the topics' names, one per line

Each line: {"topic", "partition", "offset", "key", "value", "headers"}, key and value as text
(null for none). Reads with isolation.level=read_committed, so aborted transactions never show.
Partitions are assigned, not subscribed (no consumer group), and read to their end.
"""

import json
import sys
import time

from confluent_kafka import Consumer, KafkaError, TopicPartition


def main():
    bootstrap, topics = sys.argv[1], sys.argv[2:]
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": "sluice-test-reader",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
    })
    metadata = consumer.list_topics(timeout=30)
    if topics == ["--list"]:
        for name in sorted(metadata.topics):
            print(name)
        return
    assignment = []
    for topic in topics:
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            sys.exit(f"topic {topic} does not exist")
        assignment += [TopicPartition(topic, partition, 0) for partition in sorted(found.partitions)]
    consumer.assign(assignment)
    pending = {(part.topic, part.partition) for part in assignment}
    found = []
    deadline = time.time() + 120
    while pending:
        if time.time() > deadline:
            sys.exit(f"partitions {sorted(pending)} did not reach their end in 120 s")
        message = consumer.poll(1.0)
        if message is None:
            continue
        if message.error():
            if message.error().code() == KafkaError._PARTITION_EOF:
                pending.discard((message.topic(), message.partition()))
                continue
            sys.exit(f"reading: {message.error()}")
        text = lambda raw: None if raw is None else raw.decode("utf-8")
        found.append({
            "topic": message.topic(),
            "partition": message.partition(),
            "offset": message.offset(),
            "key": text(message.key()),
            "value": text(message.value()),
            "headers": {name: text(value) for name, value in (message.headers() or [])},
        })
    found.sort(key=lambda item: (item["topic"], item["partition"], item["offset"]))
    for item in found:
        print(json.dumps(item))


main()
