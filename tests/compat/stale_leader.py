#!/usr/bin/env python3
"""kafka-python against moved leaders: NOT_LEADER_OR_FOLLOWER (6), then the right broker.

Usage:
    python3 tests/compat/stale_leader.py BOOTSTRAP TOPIC BROKERS

    BOOTSTRAP  host:port of one broker of a cluster (the client learns the others)
    TOPIC      a topic name that does not exist yet
    BROKERS    the cluster's broker ids, comma-separated (at least 2), e.g. 1,2,3

Leaders do not move on their own yet (no replication, issue 13), so the script moves them
itself, the way a client sees a leader change:
    1. creates TOPIC (KafkaAdminClient, explicit replica assignments) with two partitions
       per broker, partition p led by BROKERS[p % len(BROKERS)], every broker a replica of
       each;
    2. one KafkaProducer (acks=all) writes one record to every partition: it now caches
       those leaders (metadata.max.age.ms is 5 minutes);
    3. deletes TOPIC and creates it again with each leader shifted by one broker;
    4. the same producer writes one record to every partition again: it sends to the old
       leaders, which answer NOT_LEADER_OR_FOLLOWER (6); it must refresh Metadata, send
       to the new leaders, and get every record acknowledged;
    5. a KafkaConsumer (assign, no group) reads the second round back from the new leaders.

Output: one line on stdout,
    kafka-python ok: N partitions, K NOT_LEADER_OR_FOLLOWER answers followed
    kafka-python FAIL <reason>
It fails as well when no NOT_LEADER_OR_FOLLOWER answer was seen (the path was not
exercised). Everything is bounded by 60 s (watchdog). Exit status 0 ok, 1 FAIL, 2 usage.
"""

import logging
import os
import sys
import threading
import time

TIMEOUT_S = 60


def main():
    if len(sys.argv) != 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        sys.exit(2)
    boot, topic, ids = sys.argv[1], sys.argv[2], [int(b) for b in sys.argv[3].split(",")]
    if len(ids) < 2:
        print("usage: BROKERS needs at least 2 ids", file=sys.stderr)
        sys.exit(2)

    def fire():
        print(f"kafka-python FAIL timed out after {TIMEOUT_S}s", flush=True)
        os._exit(1)
    watchdog = threading.Timer(TIMEOUT_S, fire)
    watchdog.daemon = True
    watchdog.start()

    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic

    # kafka-python logs each retried Produce error; count the NOT_LEADER_OR_FOLLOWER ones.
    not_leader = []

    class Count(logging.Handler):
        def emit(self, record):
            if "NotLeaderForPartitionError" in record.getMessage():
                not_leader.append(record.getMessage())
    logging.getLogger("kafka").addHandler(Count())
    logging.getLogger("kafka").setLevel(logging.DEBUG)
    logging.getLogger("kafka").propagate = False

    n = 2 * len(ids)
    admin = KafkaAdminClient(bootstrap_servers=boot, request_timeout_ms=10_000)

    def create(shift):
        assignments = {p: [ids[(p + shift + k) % len(ids)] for k in range(len(ids))]
                       for p in range(n)}
        admin.create_topics([NewTopic(topic, num_partitions=-1, replication_factor=-1,
                                      replica_assignments=assignments)])

    def exists():
        return topic in admin.list_topics()

    create(0)
    producer = KafkaProducer(bootstrap_servers=boot, acks="all", request_timeout_ms=10_000)
    for p in range(n):
        producer.send(topic, key=b"k", value=b"first", partition=p).get(timeout=15)

    admin.delete_topics([topic])
    while exists():
        time.sleep(0.05)
    create(1)
    futures = [producer.send(topic, key=b"k", value=f"second-{p}".encode(), partition=p)
               for p in range(n)]
    try:
        acked = {f.get(timeout=20).partition for f in futures}
    except Exception as e:  # noqa: BLE001 - the client's error is the result
        print(f"kafka-python FAIL second round: {type(e).__name__}: {e} "
              f"(after {len(not_leader)} NOT_LEADER_OR_FOLLOWER answers)")
        sys.exit(1)
    producer.close(timeout=5)
    if acked != set(range(n)):
        print(f"kafka-python FAIL second round acknowledged on partitions {sorted(acked)}")
        sys.exit(1)

    consumer = KafkaConsumer(bootstrap_servers=boot, enable_auto_commit=False,
                             auto_offset_reset="earliest", consumer_timeout_ms=15_000)
    consumer.assign([TopicPartition(topic, p) for p in range(n)])
    got = {}
    for m in consumer:
        got[m.partition] = m.value
        if len(got) == n:
            break
    consumer.close()
    want = {p: f"second-{p}".encode() for p in range(n)}
    if got != want:
        print(f"kafka-python FAIL read back {got}, expected {want}")
        sys.exit(1)
    if not not_leader:
        print("kafka-python FAIL no NOT_LEADER_OR_FOLLOWER answer seen: leaders did not move?")
        sys.exit(1)
    print(f"kafka-python ok: {n} partitions, {len(not_leader)} NOT_LEADER_OR_FOLLOWER "
          "answers followed")


if __name__ == "__main__":
    main()
