#!/usr/bin/env python3
"""Read every partition of some topics from the beginning with kafka-python, which uses
incremental fetch sessions (KIP-227) by default, without a consumer group; check that
each partition's records arrive exactly once and in order.

Usage:
    python3 tests/compat/fetch_session_consumer.py BOOTSTRAP TOPICS PARTITIONS EXPECTED

    TOPICS      comma-separated topic names
    PARTITIONS  partitions per topic (all assigned)
    EXPECTED    records per partition; record i of a partition has the value `i` (decimal)

Output: one line on stdout, `kafka-python ok <total>` or `kafka-python FAIL <reason>`.
Bounded by 60 s. Exit status 0, or 1 on FAIL, 2 on a usage error. Used by
tests/it/fetch_sessions.rs.
"""

import sys
import time

TIMEOUT_S = 60


def main():
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    bootstrap, topics, partitions, expected = sys.argv[1:]
    topics = topics.split(",")
    partitions = int(partitions)
    expected = int(expected)

    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=200,
        max_partition_fetch_bytes=64 * 1024,
    )
    assigned = [TopicPartition(t, p) for t in topics for p in range(partitions)]
    consumer.assign(assigned)
    consumer.seek_to_beginning(*assigned)
    next_value = {tp: 0 for tp in assigned}
    deadline = time.monotonic() + TIMEOUT_S
    problem = None
    while problem is None and time.monotonic() < deadline:
        if all(v >= expected for v in next_value.values()):
            break
        batches = consumer.poll(timeout_ms=200)
        for tp, records in batches.items():
            for r in records:
                value = int(r.value.decode())
                want = next_value[tp]
                if value != want or r.offset != want:
                    problem = "%s-%d: value %d at offset %d, expected %d" % (
                        tp.topic, tp.partition, value, r.offset, want)
                    break
                next_value[tp] = want + 1
    consumer.close()
    if problem is None:
        short = [(tp, v) for tp, v in next_value.items() if v != expected]
        if short:
            tp, v = short[0]
            problem = "%d partitions short after %d s, e.g. %s-%d at %d of %d" % (
                len(short), TIMEOUT_S, tp.topic, tp.partition, v, expected)
    if problem is not None:
        print("kafka-python FAIL %s" % problem)
        sys.exit(1)
    print("kafka-python ok %d" % sum(next_value.values()))


if __name__ == "__main__":
    main()
