#!/usr/bin/env python3
"""One consumer-group member, driven by a test through stdin/stdout.

Usage:
    python3 tests/compat/group_member.py BOOTSTRAP TOPIC GROUP CLIENT [options]

    CLIENT      confluent-kafka | kafka-python
    --group-protocol classic|consumer   group.protocol (confluent-kafka only; default
                          classic). `consumer` is KIP-848's protocol (ConsumerGroupHeartbeat,
                          server-side assignor): session.timeout.ms, heartbeat.interval.ms
                          and partition.assignment.strategy are then not set (librdkafka
                          refuses them; the broker's group.consumer.* settings rule), and
                          rebalances are incremental like cooperative-sticky
    --assignor NAME       classic: range | roundrobin | cooperative-sticky (the last
                          confluent-kafka only); consumer: the server-side assignor asked
                          for, group.remote.assignor (uniform | range)
    --instance-id ID      group.instance.id (static membership, KIP-345)
    --session-ms N        session.timeout.ms (default 6000; classic only)
    --reset earliest|latest   auto.offset.reset (default earliest)
    --max N               stop (commit, leave) after reading N records
    --pattern             subscribe to the regex `^TOPIC.*` instead of TOPIC (confluent-kafka
                          only; with the consumer protocol librdkafka sends it to the broker
                          as subscribed_topic_regex); TOPIC is then a prefix, not a topic

What it does: subscribes to TOPIC in GROUP, reads records, and commits each record's
offset synchronously right after reading it (so "duplicates only after the last commit"
can be checked exactly). It stops cleanly (commit, close = LeaveGroup) when stdin closes
or --max is reached; the test kills it with SIGKILL to simulate a crash.

Output, one event per line on stdout, flushed at once:
    assigned P,P,...      the full assignment after every change ("assigned -" when none)
    record P O VALUE      a record read
    committed P O         the offset committed after a record (the next offset to read)
    closed                after a clean close
With --pattern the records may come from several topics, so after every "assigned" line
there is also
    owned T:P,T:P,...     the full assignment with topic names ("owned -" when none)
(the "assigned" line then lists the partition numbers of all topics together), and the
VALUE of a record tells its topic only if the producer put that in.
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
        "topic.metadata.refresh.interval.ms": 1000,
    }
    consumer_protocol = a.group_protocol == "consumer"
    if consumer_protocol:
        conf["group.protocol"] = "consumer"
        if a.assignor:
            conf["group.remote.assignor"] = a.assignor
    else:
        conf["session.timeout.ms"] = a.session_ms
        conf["heartbeat.interval.ms"] = max(100, a.session_ms // 10)
        if a.assignor:
            conf["partition.assignment.strategy"] = a.assignor
    if a.instance_id:
        conf["group.instance.id"] = a.instance_id
    c = Consumer(conf)
    # With the consumer protocol librdkafka's rebalance protocol is COOPERATIVE: each
    # callback carries only the partitions added or taken away.
    incremental = consumer_protocol or a.assignor == "cooperative-sticky"
    owned = set()  # (topic, partition)

    def report():
        show({p for _, p in owned})
        if a.pattern:
            emit("owned " + (",".join("%s:%d" % tp for tp in sorted(owned)) if owned else "-"))

    def on_assign(consumer, parts):
        if incremental:
            consumer.incremental_assign(parts)
        else:
            owned.clear()
        owned.update((p.topic, p.partition) for p in parts)
        report()

    def on_revoke(consumer, parts):
        if incremental:
            consumer.incremental_unassign(parts)
            owned.difference_update((p.topic, p.partition) for p in parts)
        else:
            owned.clear()
        report()

    subscription = ["^" + a.topic + ".*"] if a.pattern else [a.topic]
    c.subscribe(subscription, on_assign=on_assign, on_revoke=on_revoke)
    n = 0
    while not stop.is_set() and (a.max is None or n < a.max):
        m = c.poll(0.2)
        if m is None:
            continue
        if m.error():
            print("consumer error: %s" % m.error(), file=sys.stderr)
            continue
        emit("record %d %d %s" % (m.partition(), m.offset(), (m.value() or b"").decode()))
        n += 1
        try:
            c.commit(offsets=[TopicPartition(m.topic(), m.partition(), m.offset() + 1)], asynchronous=False)
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
    p.add_argument("--group-protocol", default="classic", choices=["classic", "consumer"])
    p.add_argument("--pattern", action="store_true")
    a = p.parse_args()
    if a.client != "confluent-kafka" and (a.group_protocol != "classic" or a.pattern):
        p.error("--group-protocol consumer and --pattern are for confluent-kafka only")
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
