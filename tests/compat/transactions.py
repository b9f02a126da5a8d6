#!/usr/bin/env python3
"""Kafka transactions through real Python clients, against one broker.

Usage: transactions.py SCENARIO BOOTSTRAP TOPIC [ARGS...]

Scenarios (each prints "<scenario> ok ..." on success, exits non-zero otherwise):
  commit-abort BOOT TOPIC CLIENT [RUN]
                                   CLIENT (confluent-kafka | kafka-python) writes a committed,
                                   an aborted and a committed transaction; read_committed
                                   sees exactly the committed records, read_uncommitted all
                                   (of this RUN's records, default r1).
  fence BOOT TOPIC                 two producers with one transactional.id: the older is
                                   fenced, none of its records become visible.
  timeout BOOT TOPIC               a producer opens a transaction and vanishes; the
                                   coordinator aborts it after transaction.timeout.ms and a
                                   read_committed consumer moves past it.
  ctp BOOT IN OUT GROUP DIE        consume-transform-produce of IN to OUT in transactions,
                                   with the input offsets sent to the transaction; with
                                   DIE=1 the process kills itself (SIGKILL) at a random
                                   point. Prints "ctp done" when IN is fully processed.
  txn-loop BOOT TOPIC SECONDS OUT transactions of 10 records over TOPIC's partitions for
                                   SECONDS, each committed (4 in 5) or aborted, surviving
                                   broker restarts; writes "committed N", "aborted N" or
                                   "unknown N" per transaction to OUT.
  check BOOT TOPIC OUT             read_committed reads TOPIC and judges OUT's outcomes:
                                   committed transactions whole and once, aborted ones
                                   never, unknown ones whole or not at all; prints
                                   "check ok ..." or the anomalies.
  open BOOT TOPIC TXID             opens a transaction of TXID (timeout 120 s), produces 5
                                   records to partition 0, and exits without ending it.
  read BOOT TOPIC ISOLATION        prints every value of TOPIC (all partitions) as read
                                   with ISOLATION, one per line after "values:".
"""
import os
import random
import signal
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition


def read_all(boot, topic, isolation, idle_s=3.0, deadline_s=30.0, want=None):
    """Every value of `topic` from the beginning, as `isolation` reads it; stops after
    `idle_s` without records (or once `want` values were read)."""
    c = Consumer({
        "bootstrap.servers": boot,
        "group.id": f"reader-{os.getpid()}-{random.random()}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": isolation,
    })
    md = c.list_topics(topic, timeout=10)
    parts = [TopicPartition(topic, p, 0) for p in md.topics[topic].partitions]
    c.assign(parts)
    values = []
    last = time.time()
    end = time.time() + deadline_s
    while time.time() < end:
        m = c.poll(0.2)
        if m is None:
            if time.time() - last > idle_s:
                break
            continue
        if m.error():
            continue
        values.append(m.value().decode())
        last = time.time()
        if want is not None and len(values) >= want:
            break
    c.close()
    return values


def confluent_producer(boot, tid, **extra):
    conf = {"bootstrap.servers": boot, "transactional.id": tid}
    conf.update(extra)
    p = Producer(conf)
    p.init_transactions(30)
    return p


def txn_confluent(p, topic, values, commit):
    p.begin_transaction()
    for v in values:
        p.produce(topic, value=v.encode(), key=v.encode())
    if commit:
        p.commit_transaction(30)
    else:
        p.flush(30)
        p.abort_transaction(30)


def commit_abort(boot, topic, client, run="r1"):
    tag = f"{client}-{run}"
    a = [f"{tag}-c1-{i}" for i in range(10)]
    b = [f"{tag}-a-{i}" for i in range(10)]
    c = [f"{tag}-c2-{i}" for i in range(10)]
    if client == "confluent-kafka":
        p = confluent_producer(boot, f"tx-{topic}")
        txn_confluent(p, topic, a, True)
        txn_confluent(p, topic, b, False)
        txn_confluent(p, topic, c, True)
    elif client == "kafka-python":
        from kafka import KafkaProducer
        p = KafkaProducer(bootstrap_servers=boot, transactional_id=f"tx-{topic}")
        p.init_transactions()
        for values, commit in ((a, True), (b, False), (c, True)):
            p.begin_transaction()
            for v in values:
                p.send(topic, value=v.encode(), key=v.encode())
            if commit:
                p.commit_transaction()
            else:
                p.flush()
                p.abort_transaction()
        p.close()
    else:
        sys.exit(f"unknown client {client}")
    mine = lambda values: [v for v in values if v.startswith(tag + "-")]
    committed = mine(read_all(boot, topic, "read_committed"))
    everything = mine(read_all(boot, topic, "read_uncommitted"))
    if sorted(committed) != sorted(a + c):
        sys.exit(f"read_committed saw {len(committed)} records: {sorted(committed)[:40]}")
    if sorted(everything) != sorted(a + b + c):
        sys.exit(f"read_uncommitted saw {len(everything)} records, expected 30")
    print(f"commit-abort ok {client} committed={len(committed)} all={len(everything)}")


def fence(boot, topic):
    tid = f"tx-fence-{topic}"
    old = confluent_producer(boot, tid)
    old.begin_transaction()
    for i in range(5):
        old.produce(topic, value=f"old-{i}".encode())
    old.flush(30)
    new = confluent_producer(boot, tid)  # fences `old`, aborting its open transaction
    fenced = False
    try:
        for i in range(5, 10):
            old.produce(topic, value=f"old-{i}".encode())
        old.commit_transaction(30)
    except KafkaException as e:
        fenced = True
        err = e.args[0]
        print(f"old producer: {err.name()} fatal={err.fatal()}")
    if not fenced:
        sys.exit("the older producer committed after being fenced")
    txn_confluent(new, topic, [f"new-{i}" for i in range(5)], True)
    committed = read_all(boot, topic, "read_committed")
    if sorted(committed) != sorted(f"new-{i}" for i in range(5)):
        sys.exit(f"read_committed saw {sorted(committed)}")
    print(f"fence ok committed={len(committed)}")


def timeout(boot, topic):
    p = confluent_producer(boot, f"tx-timeout-{topic}", **{"transaction.timeout.ms": 2000})
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, value=f"open-{i}".encode())
    p.flush(30)
    # The producer vanishes: nothing ends its transaction but the coordinator's timeout.
    started = time.time()
    q = confluent_producer(boot, f"tx-after-{topic}")
    txn_confluent(q, topic, [f"after-{i}" for i in range(5)], True)
    got = read_all(boot, topic, "read_committed", idle_s=40, deadline_s=40, want=5)
    waited = time.time() - started
    if sorted(got) != sorted(f"after-{i}" for i in range(5)):
        sys.exit(f"read_committed saw {sorted(got)} after {waited:.1f}s")
    everything = read_all(boot, topic, "read_uncommitted", want=10)
    if len(everything) != 10:
        sys.exit(f"read_uncommitted saw {len(everything)}")
    print(f"timeout ok after {waited:.1f}s")


def ctp(boot, src, dst, group, die):
    """Copies src to dst as 'out-<value>', one transaction per polled batch."""
    c = Consumer({
        "bootstrap.servers": boot,
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        # A killed run's member leaves the group at its session timeout: keep it short.
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
    })
    c.subscribe([src])
    p = confluent_producer(boot, f"tx-ctp-{group}", **{"transaction.timeout.ms": 10000})
    md = c.list_topics(src, timeout=10)
    total_parts = len(md.topics[src].partitions)
    # A dying run dies at a random point once it has records: between transactions,
    # after producing inside one, or after sending its offsets, before the commit.
    die_at = None
    committed_txns = 0

    def maybe_die(where):
        if die_at is not None and time.time() > die_at:
            print(f"dying {where} after {committed_txns} transactions", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    idle_since = time.time()
    while True:
        maybe_die("between transactions")
        msgs = c.consume(num_messages=random.randint(1, 50), timeout=0.5)
        msgs = [m for m in msgs if not m.error()]
        if not msgs:
            # Done when the group's committed offset of every partition is at its end
            # (position() knows nothing before this run's first record).
            assignment = c.assignment()
            if len(assignment) == total_parts:
                try:
                    committed = c.committed(assignment, timeout=5)
                except KafkaException:
                    continue
                at_end = all(
                    tp.offset >= c.get_watermark_offsets(tp, timeout=5)[1] for tp in committed
                )
                if at_end and time.time() - idle_since > 2:
                    break
            continue
        if die and die_at is None:
            die_at = time.time() + random.uniform(0.0, 1.0)
        idle_since = time.time()
        p.begin_transaction()
        for m in msgs:
            p.produce(dst, key=m.key(), value=b"out-" + m.value())
        p.flush(30)
        maybe_die("inside a transaction")
        offsets = {}
        for m in msgs:
            offsets[(m.topic(), m.partition())] = m.offset() + 1
        p.send_offsets_to_transaction(
            [TopicPartition(t, part, o) for (t, part), o in offsets.items()],
            c.consumer_group_metadata(),
            30,
        )
        maybe_die("before the commit")
        p.commit_transaction(30)
        committed_txns += 1
    c.close()
    print("ctp done")


def txn_loop(boot, topic, seconds, out_path):
    """Transactions until `seconds` pass; every outcome to `out_path` as it is known."""
    out = open(out_path, "w")
    tid = f"tx-loop-{topic}"
    conf = {"transaction.timeout.ms": 30000, "message.timeout.ms": 20000,
            "socket.timeout.ms": 5000, "reconnect.backoff.max.ms": 500}

    def new_producer():
        while True:
            try:
                return confluent_producer(boot, tid, **conf)
            except KafkaException:
                time.sleep(0.5)

    p = new_producer()
    end = time.time() + float(seconds)
    n = 0
    counts = {"committed": 0, "aborted": 0, "unknown": 0}
    while time.time() < end:
        n += 1
        commit = random.random() < 0.8
        outcome = "unknown"
        try:
            p.begin_transaction()
            for i in range(10):
                p.produce(topic, key=f"t{n}".encode(), value=f"t{n}-{i}".encode(),
                          partition=i % 3)
            if commit:
                p.commit_transaction(20)
                outcome = "committed"
            else:
                p.flush(20)
                p.abort_transaction(20)
                outcome = "aborted"
        except KafkaException as e:
            err = e.args[0]
            if err.txn_requires_abort():
                try:
                    p.abort_transaction(20)
                    outcome = "aborted"
                except KafkaException:
                    pass
            elif not err.retriable() or err.fatal():
                p = new_producer()
            if outcome == "unknown":
                # An error of commit_transaction may still have committed: a retry of
                # the commit says which, else the outcome stays unknown.
                try:
                    if commit:
                        p.commit_transaction(20)
                        outcome = "committed"
                except KafkaException:
                    p = new_producer()
        counts[outcome] += 1
        out.write(f"{outcome} {n}\n")
        out.flush()
    out.close()
    print(f"txn-loop done {counts}", flush=True)


def check(boot, topic, out_path):
    outcomes = {}
    for line in open(out_path):
        kind, n = line.split()
        outcomes[int(n)] = kind
    values = read_all(boot, topic, "read_committed", idle_s=5, deadline_s=120)
    seen = {}
    for v in values:
        n, i = v[1:].split("-")
        seen.setdefault(int(n), []).append(int(i))
    anomalies = []
    for n, records in seen.items():
        if sorted(records) != list(range(10)):
            anomalies.append(f"t{n}: torn or duplicated {sorted(records)}")
        if outcomes.get(n) == "aborted":
            anomalies.append(f"t{n}: aborted but read")
    for n, kind in outcomes.items():
        if kind == "committed" and n not in seen:
            anomalies.append(f"t{n}: committed but lost")
    kinds = {k: sum(1 for v in outcomes.values() if v == k) for k in ("committed", "aborted", "unknown")}
    if anomalies:
        sys.exit(f"check failed {kinds}: {anomalies[:20]}")
    print(f"check ok {kinds} read={len(seen)}")


def main():
    scenario = sys.argv[1]
    args = sys.argv[2:]
    if scenario == "commit-abort":
        commit_abort(*args)
    elif scenario == "fence":
        fence(*args)
    elif scenario == "timeout":
        timeout(*args)
    elif scenario == "ctp":
        ctp(args[0], args[1], args[2], args[3], args[4] == "1")
    elif scenario == "txn-loop":
        txn_loop(*args)
    elif scenario == "check":
        check(*args)
    elif scenario == "open":
        p = confluent_producer(args[0], args[2], **{"transaction.timeout.ms": 120000})
        p.begin_transaction()
        for i in range(5):
            p.produce(args[1], value=f"open-{i}".encode(), partition=0)
        p.flush(30)
        print("open ok", flush=True)
        os._exit(0)
    elif scenario == "read":
        values = read_all(args[0], args[1], args[2])
        print("values:")
        for v in values:
            print(v)
    else:
        sys.exit(f"unknown scenario {scenario}")


if __name__ == "__main__":
    main()
