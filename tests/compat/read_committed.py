#!/usr/bin/env python3
"""Read partition 0 of a topic from the beginning with one real Python client and a
given isolation level (KIP-98), without a consumer group.

Usage:
    python3 tests/compat/read_committed.py BOOTSTRAP TOPIC ISOLATION EXPECTED CLIENT

    ISOLATION  read_committed | read_uncommitted
    EXPECTED   how many records to wait for; after that the script keeps reading 2 s more
               to show that nothing else arrives (a read_committed consumer must stop at
               the last stable offset)
    CLIENT     confluent-kafka | kafka-python

Output: one line on stdout, `<client> values <v1>,<v2>,...` (the record values in order)
or `<client> FAIL <reason>`. Everything is bounded by 30 s. Exit status 0, or 1 on FAIL,
2 on a usage error. Used by tests/it/transactions_log.rs.
"""

import sys
import time

TIMEOUT_S = 30
QUIET_S = 2


def read_confluent(bootstrap, topic, isolation, expected):
    from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "read-committed-py-no-commits",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    values = []
    deadline = time.monotonic() + TIMEOUT_S
    quiet_until = None
    try:
        while time.monotonic() < deadline:
            if quiet_until is not None and time.monotonic() >= quiet_until:
                return values
            m = consumer.poll(0.1)
            if m is not None:
                if m.error():
                    raise RuntimeError(str(m.error()))
                values.append(m.value().decode())
            if len(values) >= expected and quiet_until is None:
                quiet_until = time.monotonic() + QUIET_S
        raise RuntimeError(f"timed out with {values}")
    finally:
        consumer.close()


def read_kafka_python(bootstrap, topic, isolation, expected):
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level=isolation,
        auto_offset_reset="earliest",
    )
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    values = []
    deadline = time.monotonic() + TIMEOUT_S
    quiet_until = None
    try:
        while time.monotonic() < deadline:
            if quiet_until is not None and time.monotonic() >= quiet_until:
                return values
            for records in consumer.poll(timeout_ms=100).values():
                values.extend(r.value.decode() for r in records)
            if len(values) >= expected and quiet_until is None:
                quiet_until = time.monotonic() + QUIET_S
        raise RuntimeError(f"timed out with {values}")
    finally:
        consumer.close()


def main():
    if len(sys.argv) != 6:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    bootstrap, topic, isolation, expected, client = sys.argv[1:]
    readers = {"confluent-kafka": read_confluent, "kafka-python": read_kafka_python}
    if client not in readers or isolation not in ("read_committed", "read_uncommitted"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    try:
        values = readers[client](bootstrap, topic, isolation, int(expected))
    except Exception as e:  # one FAIL line for any client error
        print(f"{client} FAIL {e}")
        sys.exit(1)
    print(f"{client} values {','.join(values)}")


if __name__ == "__main__":
    main()
