#!/usr/bin/env python3
"""confluent-kafka idempotent producer for the fault loop (tests/it/replication_faults.rs).

Usage:
    python3 tests/compat/fault_producer.py BOOTSTRAP TOPIC PARTITIONS SECONDS OUT

    BOOTSTRAP   host:port[,host:port...] of the cluster
    TOPIC       an existing topic with PARTITIONS partitions
    SECONDS     how long to keep sending (then it flushes, at most FLUSH_S)
    OUT         file the outcome of every record is written to

With FAULT_PRODUCER_STOP_FILE=PATH in the environment it also stops sending as soon as
that file exists (the caller's "stop the load"), SECONDS being then the longest.

One producer (acks=all, enable.idempotence=true) sends, round-robin over the partitions,
records whose value is `p<partition>-s<sequence:09>`: sequence numbers count 0, 1, 2, ...
per partition, in send order, so a reader can tell what was sent, in which order, and
whether a record is there twice. Sending is paced (RATE_PER_S) and bounded (at most
MAX_IN_FLIGHT records not yet answered), so a broker outage does not pile up an unbounded
queue. Then it flushes, at most FLUSH_S.

OUT, one line per event:
    A <partition> <offset> <sequence>    acknowledged, at that offset
    F <partition> <sequence> <error>     failed (its ack never came; it may be in the log)
    E <fatal|error> <text>               a client error (error_cb)
    SENT <partition> <count>             at the end: sequences 0..count-1 were sent
    UNANSWERED <count>                   at the end: records neither acked nor failed
    DONE

stdout, one line at the end:
    confluent-kafka fault-producer sent N acked A failed F unanswered U fatal X
Exit status 0 when it ran to the end (failures of records are the caller's to judge), 1
on a fatal client error or the watchdog (SECONDS + FLUSH_S + 30 s), 2 on usage.
"""

import os
import sys
import threading
import time

RATE_PER_S = 300
MAX_IN_FLIGHT = 2000
FLUSH_S = 45
# librdkafka retries an idempotent produce until this; below FLUSH_S so a flush ends
# with every record answered.
MESSAGE_TIMEOUT_MS = 40_000


def main():
    if len(sys.argv) != 6:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        sys.exit(2)
    boot, topic = sys.argv[1], sys.argv[2]
    partitions, seconds, out_path = int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]

    def fire():
        print("confluent-kafka fault-producer FAIL watchdog", flush=True)
        os._exit(1)
    watchdog = threading.Timer(seconds + FLUSH_S + 30, fire)
    watchdog.daemon = True
    watchdog.start()

    from confluent_kafka import Producer

    out = open(out_path, "w", buffering=1 << 16)
    fatal = []

    def on_error(err):
        kind = "fatal" if err.fatal() else "error"
        if err.fatal():
            fatal.append(str(err))
        out.write(f"E {kind} {err}\n")

    counts = {"acked": 0, "failed": 0}

    def on_delivery(err, msg):
        # value is b"p<partition>-s<sequence>"
        seq = int(msg.value().split(b"-s")[1])
        if err is None:
            counts["acked"] += 1
            out.write(f"A {msg.partition()} {msg.offset()} {seq}\n")
        else:
            counts["failed"] += 1
            reason = str(err).replace("\n", " ")
            out.write(f"F {msg.partition()} {seq} {reason}\n")

    producer = Producer({
        "bootstrap.servers": boot,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "message.timeout.ms": MESSAGE_TIMEOUT_MS,
        "error_cb": on_error,
    })
    sent = [0] * partitions
    start = time.monotonic()
    n = 0
    stop_file = os.environ.get("FAULT_PRODUCER_STOP_FILE")
    while time.monotonic() - start < seconds and not fatal:
        if stop_file and n % 50 == 0 and os.path.exists(stop_file):
            break
        # Pace: record n is due at start + n / RATE_PER_S.
        due = start + n / RATE_PER_S
        now = time.monotonic()
        if now < due:
            producer.poll(due - now)
            continue
        if len(producer) >= MAX_IN_FLIGHT:
            producer.poll(0.05)
            continue
        p = n % partitions
        value = f"p{p}-s{sent[p]:09}".encode()
        try:
            producer.produce(topic, value=value, partition=p, on_delivery=on_delivery)
        except BufferError:
            producer.poll(0.05)
            continue
        sent[p] += 1
        n += 1
        producer.poll(0)
    unanswered = producer.flush(FLUSH_S)
    for p in range(partitions):
        out.write(f"SENT {p} {sent[p]}\n")
    out.write(f"UNANSWERED {unanswered}\n")
    out.write("DONE\n")
    out.close()
    print(
        f"confluent-kafka fault-producer sent {n} acked {counts['acked']} "
        f"failed {counts['failed']} unanswered {unanswered} fatal {len(fatal)}",
        flush=True,
    )
    sys.exit(1 if fatal else 0)


if __name__ == "__main__":
    main()
