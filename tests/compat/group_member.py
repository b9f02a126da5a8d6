#!/usr/bin/env python3
"""One consumer-group member, driven by a test through stdin/stdout.

Usage:
    python3 tests/compat/group_member.py BOOTSTRAP TOPIC GROUP CLIENT [options]

    CLIENT      confluent-kafka | kafka-python
    --assignor NAME       range | roundrobin | cooperative-sticky (confluent-kafka only)
    --instance-id ID      group.instance.id (static membership, KIP-345)
    --session-ms N        session.timeout.ms (default 6000)
    --reset earliest|latest   auto.offset.reset (default earliest)
    --max N               stop (commit, leave) after reading N records

What it does: subscribes to TOPIC in GROUP, reads records, and commits each record's
offset synchronously right after reading it (so "duplicates only after the last commit"
can be checked exactly). It stops cleanly (commit, close = LeaveGroup) when stdin closes
or --max is reached; the test kills it with SIGKILL to simulate a crash.

Output, one event per line on stdout, flushed at once:
    assigned P,P,...      the full assignment after every change ("assigned -" when none)
    record P O VALUE      a record read
    committed P O         the offset committed after a record (the next offset to read)
    closed                after a clean close
Client chatter goes to stderr.
"""

import argparse
import os
import sys
import threading
import time


def emit(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def show(parts):
    emit("assigned " + (",".join(str(p) for p in sorted(parts)) if parts else "-"))


def stdin_closed(flag):
    try:
        sys.stdin.read()
    finally:
        flag.set()


def run_confluent(a, stop):
    from confluent_kafka import Consumer, TopicPartition

    conf = {
        "bootstrap.servers": a.bootstrap,
        "group.id": a.group,
        "auto.offset.reset": a.reset,
        "enable.auto.commit": False,
        "session.timeout.ms": a.session_ms,
        "heartbeat.interval.ms": max(100, a.session_ms // 10),
        "topic.metadata.refresh.interval.ms": 1000,
    }
    if a.assignor:
        conf["partition.assignment.strategy"] = a.assignor
    if a.instance_id:
        conf["group.instance.id"] = a.instance_id
    c = Consumer(conf)
    owned = set()

    def on_assign(consumer, parts):
        if a.assignor == "cooperative-sticky":
            consumer.incremental_assign(parts)
            owned.update(p.partition for p in parts)
        else:
            owned.clear()
            owned.update(p.partition for p in parts)
        show(owned)

    def on_revoke(consumer, parts):
        if a.assignor == "cooperative-sticky":
            consumer.incremental_unassign(parts)
            owned.difference_update(p.partition for p in parts)
        else:
            owned.clear()
        show(owned)

    c.subscribe([a.topic], on_assign=on_assign, on_revoke=on_revoke)
    n = 0
    while not stop.is_set() and (a.max is None or n < a.max):
        m = c.poll(0.2)
        if m is None or m.error():
            continue
        emit("record %d %d %s" % (m.partition(), m.offset(), (m.value() or b"").decode()))
        n += 1
        try:
            c.commit(offsets=[TopicPartition(a.topic, m.partition(), m.offset() + 1)], asynchronous=False)
            emit("committed %d %d" % (m.partition(), m.offset() + 1))
        except Exception as e:  # a commit refused during a rebalance: the record may come again
            print("commit failed: %s" % e, file=sys.stderr)
    c.close()
    emit("closed")


def run_kafka_python(a, stop):
    from kafka import KafkaConsumer, TopicPartition
    from kafka.consumer.subscription_state import ConsumerRebalanceListener
    from kafka.structs import OffsetAndMetadata
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    assignors = {
        None: [RangePartitionAssignor],
        "range": [RangePartitionAssignor],
        "roundrobin": [RoundRobinPartitionAssignor],
    }[a.assignor]
    c = KafkaConsumer(
        bootstrap_servers=a.bootstrap,
        group_id=a.group,
        auto_offset_reset=a.reset,
        enable_auto_commit=False,
        session_timeout_ms=a.session_ms,
        heartbeat_interval_ms=max(100, a.session_ms // 10),
        partition_assignment_strategy=assignors,
        metadata_max_age_ms=1000,
    )

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            show(set())

        def on_partitions_assigned(self, assigned):
            show({tp.partition for tp in assigned})

    c.subscribe([a.topic], listener=Listener())
    n = 0
    while not stop.is_set() and (a.max is None or n < a.max):
        batch = c.poll(timeout_ms=200, max_records=1)
        for tp, records in batch.items():
            for m in records:
                emit("record %d %d %s" % (m.partition, m.offset, (m.value or b"").decode()))
                n += 1
                try:
                    c.commit({TopicPartition(a.topic, m.partition): OffsetAndMetadata(m.offset + 1, "", -1)})
                    emit("committed %d %d" % (m.partition, m.offset + 1))
                except Exception as e:
                    print("commit failed: %s" % e, file=sys.stderr)
    c.close()
    emit("closed")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument("client", choices=["confluent-kafka", "kafka-python"])
    p.add_argument("--assignor")
    p.add_argument("--instance-id")
    p.add_argument("--session-ms", type=int, default=6000)
    p.add_argument("--reset", default="earliest", choices=["earliest", "latest"])
    p.add_argument("--max", type=int)
    a = p.parse_args()
    stop = threading.Event()
    threading.Thread(target=stdin_closed, args=(stop,), daemon=True).start()
    # A member that outlives its test would hold the group: bound its life.
    threading.Timer(300, lambda: os._exit(3)).start()
    if a.client == "confluent-kafka":
        run_confluent(a, stop)
    else:
        run_kafka_python(a, stop)
    os._exit(0)


if __name__ == "__main__":
    main()
