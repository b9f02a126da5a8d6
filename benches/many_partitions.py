"""One run of benches/many_partitions.sh: against the broker at BOOTSTRAP (pid PID),
create PARTITIONS partitions (topics of at most 10,000), produce RECORDS records of 100
bytes round-robin over them, read every record back, and print one line of figures:
create seconds, produce and fetch records/s, the broker's RSS and open descriptors.

Usage: python3 many_partitions.py BOOTSTRAP PID PARTITIONS RECORDS
"""
import os
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

bootstrap, pid, partitions, records = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
PER_TOPIC = 10_000


def proc_figures():
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    rss_kb = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
    return fds, rss_kb // 1024


layout = []  # (topic, partitions)
left, t = partitions, 0
while left > 0:
    n = min(left, PER_TOPIC)
    layout.append((f"mp-{t}", n))
    left -= n
    t += 1

admin = AdminClient({"bootstrap.servers": bootstrap})
start = time.monotonic()
for name, n in layout:
    fut = admin.create_topics([NewTopic(name, n, 1)], request_timeout=600, operation_timeout=600)
    for _, f in fut.items():
        f.result()
create_s = time.monotonic() - start
targets = [(name, p) for name, n in layout for p in range(n)]

producer = Producer({
    "bootstrap.servers": bootstrap,
    "linger.ms": 20,
    "batch.num.messages": 10000,
    "queue.buffering.max.messages": 1000000,
    "queue.buffering.max.kbytes": 1048576,
    "message.timeout.ms": 600000,
})
failed = []
def report(err, _msg):
    if err is not None:
        failed.append(err)

payload = b"x" * 100
# Metadata of every topic first, so the timing covers produce only.
producer.list_topics(timeout=120)
start = time.monotonic()
for i in range(records):
    name, p = targets[i % len(targets)]
    while True:
        try:
            producer.produce(name, payload, partition=p, on_delivery=report)
            break
        except BufferError:
            producer.poll(0.05)
    if i % 10000 == 0:
        producer.poll(0)
left = producer.flush(600)
produce_s = time.monotonic() - start
assert left == 0 and not failed, (left, failed[:3])

consumer = Consumer({
    "bootstrap.servers": bootstrap,
    "group.id": "many-partitions-bench",
    "enable.auto.commit": False,
    "fetch.wait.max.ms": 50,
})
consumer.assign([TopicPartition(name, p, 0) for name, p in targets])
got = 0
start = time.monotonic()
deadline = start + 900
while got < records and time.monotonic() < deadline:
    for m in consumer.consume(10000, 0.1):
        if m.error() is None:
            got += 1
fetch_s = time.monotonic() - start
consumer.close()
assert got == records, (got, records)
fds, rss_mb = proc_figures()
print(f"partitions={partitions} create_s={create_s:.1f} produce_rps={records / produce_s:.0f} "
      f"fetch_rps={records / fetch_s:.0f} rss_mb={rss_mb} fds={fds}", flush=True)
