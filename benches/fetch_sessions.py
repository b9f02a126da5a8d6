#!/usr/bin/env python3
"""Fetch sessions (KIP-227) at 1,000 partitions: one kafka-python consumer (incremental
fetch sessions on by default) assigned every partition of one topic.

Usage:
    python3 benches/fetch_sessions.py BOOTSTRAP TOPIC PARTITIONS RECORDS produce
    python3 benches/fetch_sessions.py BOOTSTRAP TOPIC PARTITIONS RECORDS consume ADMIN_URL PID

    produce   creates TOPIC with PARTITIONS partitions and writes RECORDS records of 100
              bytes to each (not timed)
    consume   assigns every partition from the beginning and reads until each partition
              holds RECORDS records read (checked: every record once, in order); then
              polls IDLE_S seconds with nothing new (the steady state of a caught-up
              consumer, where a sessionless fetch still lists every partition both ways)
    ADMIN_URL the broker's admin listener (Fetch requests counted from its /metrics)
    PID       the broker's process id (its CPU time from /proc/PID/task/*/schedstat)

Output of consume: one line
    read_s=<s> read_broker_cpu_s=<s> read_client_cpu_s=<s> records=<n> idle_fetches_per_s=<n> idle_broker_cpu_ms_per_fetch=<ms>
    idle_broker_net_cpu_ms_per_fetch=<ms> broker_background_cpu_ms_per_s=<ms>
    idle_client_cpu_ms_per_fetch=<ms> sessions=<weir_fetch_sessions at the end>
    (background: the broker's CPU over BACKGROUND_S seconds with no client, before the
    consumer starts; net: the idle phase's broker CPU less that background rate, per fetch)
Used by
benches/fetch_sessions.sh, which runs it against a broker with sessions and one without
(max.incremental.fetch.session.cache.slots=0).
"""

import sys
import time

IDLE_S = 10
BACKGROUND_S = 10
TIMEOUT_S = 600


def produce(bootstrap, topic, partitions, records):
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, partitions, 1)])
    admin.close()
    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=64 * 1024)
    value = b"x" * 100
    for i in range(records):
        for part in range(partitions):
            p.send(topic, value=value, key=str(i).encode(), partition=part)
    p.flush()
    p.close()


def metric(admin_url, series):
    import urllib.request
    text = urllib.request.urlopen(admin_url + "/metrics", timeout=30).read().decode()
    for line in text.splitlines():
        if line.split(" ")[0] == series:
            return float(line.split()[-1])
    return 0.0


def fetch_requests(admin_url):
    return metric(admin_url, 'weir_requests_total{api="Fetch"}')


def cpu_s(pid):
    """The process's CPU time so far: the sum over its threads of /proc schedstat's
    run time (ns resolution; /proc/PID/stat counts 10 ms ticks, too coarse for a few ms
    per fetch). Threads that ended are not counted (the broker's are long-lived)."""
    import os
    total_ns = 0
    for tid in os.listdir("/proc/%s/task" % pid):
        try:
            total_ns += int(open("/proc/%s/task/%s/schedstat" % (pid, tid)).read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total_ns / 1e9


def consume(bootstrap, topic, partitions, records, admin_url, pid):
    from kafka import KafkaConsumer, TopicPartition

    background_before = cpu_s(pid)
    time.sleep(BACKGROUND_S)
    background_per_s = (cpu_s(pid) - background_before) / BACKGROUND_S
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
    )
    assigned = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(assigned)
    consumer.seek_to_beginning(*assigned)
    next_offset = {tp: 0 for tp in assigned}
    done = 0
    total = partitions * records
    start = time.monotonic()
    read_broker, read_client = cpu_s(pid), time.process_time()
    while done < total and time.monotonic() - start < TIMEOUT_S:
        for tp, batch in consumer.poll(timeout_ms=500).items():
            for r in batch:
                if r.offset != next_offset[tp] or int(r.key) != r.offset:
                    sys.exit("FAIL %s: offset %d, expected %d" % (tp, r.offset, next_offset[tp]))
                next_offset[tp] += 1
                done += 1
    read_s = time.monotonic() - start
    read_broker, read_client = cpu_s(pid) - read_broker, time.process_time() - read_client
    if done != total:
        sys.exit("FAIL read %d of %d in %d s" % (done, total, TIMEOUT_S))
    fetches_before = fetch_requests(admin_url)
    broker_before, client_before = cpu_s(pid), time.process_time()
    idle_start = time.monotonic()
    while time.monotonic() - idle_start < IDLE_S:
        if consumer.poll(timeout_ms=200):
            sys.exit("FAIL records after the end")
    idle_s = time.monotonic() - idle_start
    broker_cpu, client_cpu = cpu_s(pid) - broker_before, time.process_time() - client_before
    idle_fetches = fetch_requests(admin_url) - fetches_before
    sessions = metric(admin_url, "weir_fetch_sessions")
    consumer.close()
    per = max(idle_fetches, 1) / 1000.0
    net_cpu = max(broker_cpu - background_per_s * idle_s, 0.0)
    print("read_s=%.2f read_broker_cpu_s=%.2f read_client_cpu_s=%.2f records=%d idle_fetches_per_s=%.1f idle_broker_cpu_ms_per_fetch=%.2f "
          "idle_broker_net_cpu_ms_per_fetch=%.2f broker_background_cpu_ms_per_s=%.2f "
          "idle_client_cpu_ms_per_fetch=%.2f sessions=%d"
          % (read_s, read_broker, read_client, done, idle_fetches / idle_s, broker_cpu / per,
             net_cpu / per, background_per_s * 1000, client_cpu / per, sessions))


def main():
    args = sys.argv[1:]
    if len(args) == 5 and args[4] == "produce":
        produce(args[0], args[1], int(args[2]), int(args[3]))
    elif len(args) == 7 and args[4] == "consume":
        consume(args[0], args[1], int(args[2]), int(args[3]), args[5], args[6])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
