#!/usr/bin/env python3
"""Round trip through a Kafka-wire broker with one real Python client.

Usage:
    python3 tests/compat/roundtrip.py BOOTSTRAP TOPIC N CLIENT

    BOOTSTRAP  host:port[,host:port...]     e.g. 127.0.0.1:19092
    TOPIC      topic to write to; created by the producer's Metadata request
               (auto-creation) unless it exists already. Old records in it do no harm.
    N          number of records to produce, 1..1000000
    CLIENT     confluent-kafka | kafka-python | aiokafka

What it does:
    1. produces N records with acks=all: key "k<i>", a value tagged with a fresh run id,
       and 2 headers ("weir-run" = run id, "weir-idx" = i), noting the (partition, offset)
       each delivery report gives;
    2. reads them back WITHOUT a consumer group: looks the partitions up in Metadata,
       assigns all of them explicitly, seeks to the beginning (ListOffsets earliest) and
       fetches until every partition reaches the end offset it had after the produce
       (ListOffsets latest). confluent-kafka insists on a group.id even for assign(); it
       gets a unique one that is never joined (librdkafka may still send FindCoordinator);
    3. checks each record of this run: key, value, both headers (names, values, order),
       timestamp near now, partition and offset equal to what the producer was acknowledged,
       no duplicates, none missing, and per partition in produce order.

Output: exactly one line on stdout,
    <client> ok N/N
    <client> FAIL <reason>
client chatter goes to stderr (all of it, at debug level, with ROUNDTRIP_DEBUG=1).
Exit status: 0 ok, 1 FAIL, 2 usage error.

Time: everything is bounded by ROUNDTRIP_TIMEOUT_S (default 60, the maximum): the client
calls get deadlines inside that budget, and a watchdog thread prints a FAIL line and exits
the process if anything still hangs when it runs out.

Used by the integration tests (std::process::Command); needs the clients that
tests/install-deps.sh installs.
"""

import functools
import os
import secrets
import sys
import threading
import time

CLIENTS = ("confluent-kafka", "kafka-python", "aiokafka")
MAX_N = 1_000_000
MAX_TIMEOUT_S = 60
# Kept back from the budget so that clients can close before the watchdog fires.
CLOSE_RESERVE_S = 5
PRODUCE_SHARE = 0.5  # of the remaining budget, for producing (the rest is for consuming)


def usage(msg):
    print(f"usage: {sys.argv[0]} BOOTSTRAP TOPIC N CLIENT   ({' | '.join(CLIENTS)}): {msg}",
          file=sys.stderr)
    sys.exit(2)


def one_line(e):
    text = str(e)
    if isinstance(e, BaseException) and not text.startswith(type(e).__name__):
        text = f"{type(e).__name__}: {text}"
    return " ".join(text.split())[:200]


class Budget:
    """The run's time limit. `left_s()` is what a client call may still take."""

    def __init__(self, total_s):
        self.start = time.monotonic()
        self.total_s = total_s
        self.end = self.start + total_s - CLOSE_RESERVE_S

    def left_s(self):
        return max(0.0, self.end - time.monotonic())

    def produce_deadline(self):
        return time.monotonic() + self.left_s() * PRODUCE_SHARE

    def expired(self):
        return time.monotonic() >= self.end


class Phase:
    """What the run is doing, named in FAIL lines. `closing` is set while a client closes:
    a finally block must not rename the phase an exception escaping through it came from."""
    name = "start"
    closing = False

    @classmethod
    def describe(cls):
        return cls.name + (" (closing the client)" if cls.closing else "")


def start_watchdog(client, total_s):
    def fire():
        print(f"{client} FAIL timed out after {total_s}s (during {Phase.describe()})", flush=True)
        os._exit(1)
    t = threading.Timer(total_s, fire)
    t.daemon = True
    t.start()


# ------------------------------------------------------------------ the records of one run
class Run:
    def __init__(self, client, n):
        self.client = client
        self.n = n
        self.id = f"{int(time.time())}-{os.getpid()}-{secrets.token_hex(3)}"
        self.value_prefix = f"{client}|{self.id}|".encode()
        self.start_ms = int(time.time() * 1000)

    def key(self, i):
        return f"k{i}".encode()

    def value(self, i):
        # sizes vary with i so batches are not uniform
        return self.value_prefix + f"{i}|".encode() + b"v" * (i % 97)

    def headers(self, i):
        return [("weir-run", self.id.encode()), ("weir-idx", str(i).encode())]

    def index_of(self, value):
        """i if value is one of this run's values, else None (other runs' or clients' data)."""
        if not isinstance(value, (bytes, bytearray)) or not value.startswith(self.value_prefix):
            return None
        rest = bytes(value[len(self.value_prefix):])
        head, sep, _ = rest.partition(b"|")
        if not sep or not head.isdigit():
            return -1
        return int(head)


class Check:
    """Collects delivery reports and consumed records; says what went wrong, if anything."""

    def __init__(self, run):
        self.run = run
        self.acked = {}  # i -> (partition, offset)
        self.seen = set()
        self.dups = 0
        self.last_idx = {}  # partition -> last i consumed
        self.problems = {}  # kind -> [count, first detail]

    def problem(self, kind, detail):
        entry = self.problems.setdefault(kind, [0, detail])
        entry[0] += 1

    def ack(self, i, partition, offset):
        self.acked[i] = (partition, offset)

    def record(self, partition, offset, key, value, headers, timestamp_ms):
        """One consumed record; headers as a list of (str, bytes)."""
        run = self.run
        i = run.index_of(value)
        if i is None:
            return
        if i < 0 or i >= run.n:
            self.problem("value", f"p{partition}@{offset} value={bytes(value)[:60]!r}")
            return
        if bytes(value) != run.value(i):
            self.problem("value", f"record {i}: {bytes(value)[:60]!r}")
        if key is None or bytes(key) != run.key(i):
            self.problem("key", f"record {i}: key={key!r}")
        got_headers = [(name, None if hv is None else bytes(hv)) for name, hv in headers or []]
        if got_headers != run.headers(i):
            self.problem("headers", f"record {i}: {got_headers!r}")
        now_ms = int(time.time() * 1000)
        if timestamp_ms is None or not run.start_ms - 60_000 <= timestamp_ms <= now_ms + 60_000:
            self.problem("timestamp", f"record {i}: {timestamp_ms}")
        if i in self.acked and self.acked[i] != (partition, offset):
            self.problem("offset", f"record {i} acked at p{self.acked[i][0]}@{self.acked[i][1]}"
                                   f", read at p{partition}@{offset}")
        last = self.last_idx.get(partition)
        if last is not None and i <= last:
            self.problem("order", f"p{partition}: record {i} after record {last}")
        self.last_idx[partition] = i
        if i in self.seen:
            self.dups += 1
        self.seen.add(i)

    def verdict(self, extra=None):
        """(ok, line)"""
        n = self.run.n
        parts = []
        if extra:
            parts.append(extra)
        if len(self.seen) < n:
            missing = sorted(set(range(n)) - self.seen)
            parts.append(f"read back {len(self.seen)}/{n} (first missing: record {missing[0]})")
        if self.dups:
            parts.append(f"{self.dups} duplicates")
        for kind, (count, detail) in self.problems.items():
            parts.append(f"{count} bad {kind} (first: {detail})")
        if parts:
            return False, f"{self.run.client} FAIL " + "; ".join(parts)
        return True, f"{self.run.client} ok {len(self.seen)}/{n}"


def produce_failure(check, first_error):
    missing = check.run.n - len(check.acked)
    why = first_error or "not acknowledged in time"
    return f"{check.run.client} FAIL produce: {missing}/{check.run.n} not acknowledged ({why})"


def end_offsets_problem(check, high):
    """The end offsets read after producing must cover every acknowledged offset."""
    for i, (p, off) in check.acked.items():
        if p not in high:
            return f"partition {p} (record {i}) missing from Metadata"
        if high[p] <= off:
            return f"p{p} end offset {high[p]} <= acknowledged offset {off} (record {i})"
    return None


# ------------------------------------------------------------------ confluent-kafka
def run_confluent(boot, topic, check, budget):
    from confluent_kafka import (OFFSET_BEGINNING, Consumer, KafkaError, Producer,
                                 TopicPartition)
    run = check.run
    errors = []

    def on_delivery(i, err, msg):
        if err is not None:
            errors.append(str(err))
        else:
            check.ack(i, msg.partition(), msg.offset())

    client_errors = []  # librdkafka's error_cb: broker down, all brokers down, ...

    def on_error(err):
        client_errors.append(str(err))

    Phase.name = "produce"
    deadline = budget.produce_deadline()
    p = Producer({"bootstrap.servers": boot, "client.id": "weir-roundtrip-confluent",
                  "acks": "all", "linger.ms": 5, "error_cb": on_error,
                  "message.timeout.ms": max(1000, int((deadline - time.monotonic()) * 1000)),
                  "socket.timeout.ms": 10_000})
    for i in range(run.n):
        while True:
            try:
                p.produce(topic, key=run.key(i), value=run.value(i), headers=run.headers(i),
                          on_delivery=functools.partial(on_delivery, i))
                break
            except BufferError:
                if time.monotonic() >= deadline:
                    return False, produce_failure(check, "local queue full until the deadline")
                p.poll(0.05)
        p.poll(0)
    p.flush(max(0.0, deadline - time.monotonic()))
    if errors or len(check.acked) < run.n:
        why = errors[0] if errors else None
        if why is None and client_errors:
            why = f"not acknowledged in time; last client error: {client_errors[-1]}"
        return False, produce_failure(check, why)

    Phase.name, Phase.closing = "consume", False
    # group.id is required by the binding, even for assign(); nothing here joins the group
    c = Consumer({"bootstrap.servers": boot, "client.id": "weir-roundtrip-confluent",
                  "group.id": f"weir-roundtrip-{run.id}", "enable.auto.commit": False,
                  "error_cb": on_error,
                  "enable.auto.offset.store": False, "enable.partition.eof": False,
                  "socket.timeout.ms": 10_000})
    last_err = None
    try:
        md = c.list_topics(topic, timeout=max(1.0, min(10.0, budget.left_s())))
        tmd = md.topics.get(topic)
        if tmd is None or tmd.error is not None or not tmd.partitions:
            return False, f"{run.client} FAIL metadata for {topic}: {tmd.error if tmd else 'absent'}"
        parts = sorted(tmd.partitions)
        low, high = {}, {}
        for part in parts:
            low[part], high[part] = c.get_watermark_offsets(
                TopicPartition(topic, part), timeout=max(1.0, min(10.0, budget.left_s())),
                cached=False)
        bad = end_offsets_problem(check, high)
        if bad:
            return False, f"{run.client} FAIL {bad}"
        c.assign([TopicPartition(topic, part, OFFSET_BEGINNING) for part in parts])
        pos = dict(low)
        while any(pos[part] < high[part] for part in parts) and not budget.expired():
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                if m.error().code() != KafkaError._PARTITION_EOF:
                    last_err = str(m.error())
                continue
            pos[m.partition()] = m.offset() + 1
            _, ts = m.timestamp()
            check.record(m.partition(), m.offset(), m.key(), m.value(), m.headers(), ts)
        extra = None
        if any(pos[part] < high[part] for part in parts):
            extra = "positions " + ", ".join(f"p{part}:{pos[part]}/{high[part]}" for part in parts)
            last_err = last_err or (client_errors[-1] if client_errors else None)
            if last_err:
                extra += f"; last consumer error: {last_err[:120]}"
        return check.verdict(extra)
    finally:
        Phase.closing = True
        c.close()


# ------------------------------------------------------------------ kafka-python
def run_kafka_python(boot, topic, check, budget):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    run = check.run
    Phase.name = "produce"
    deadline = budget.produce_deadline()
    left_ms = max(1000, int((deadline - time.monotonic()) * 1000))
    p = KafkaProducer(bootstrap_servers=boot, client_id="weir-roundtrip-kafka-python",
                      acks="all", linger_ms=5, max_block_ms=left_ms,
                      bootstrap_timeout_ms=left_ms, request_timeout_ms=min(10_000, left_ms))
    first_error = None
    try:
        futs = []
        for i in range(run.n):
            # send() blocks for up to max_block_ms while it has no metadata; one such wait
            # uses the whole produce budget, so the first failure ends the produce phase
            try:
                futs.append(p.send(topic, key=run.key(i), value=run.value(i),
                                   headers=run.headers(i)))
            except Exception as e:  # noqa: BLE001
                first_error = f"send: {one_line(e)}"
                break
        p.flush(timeout=max(0.0, deadline - time.monotonic()))
        for i, f in enumerate(futs):
            if f.is_done and f.succeeded():
                check.ack(i, f.value.partition, f.value.offset)
            elif f.is_done and first_error is None:
                first_error = one_line(f.exception)
    finally:
        Phase.closing = True
        p.close(timeout=CLOSE_RESERVE_S / 2)
    if len(check.acked) < run.n:
        return False, produce_failure(check, first_error)

    Phase.name, Phase.closing = "consume", False
    left_ms = max(1000, int(budget.left_s() * 1000))
    c = KafkaConsumer(bootstrap_servers=boot, client_id="weir-roundtrip-kafka-python",
                      group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
                      bootstrap_timeout_ms=left_ms, request_timeout_ms=min(10_000, left_ms))
    try:
        parts = None
        while parts is None and not budget.expired():
            parts = c.partitions_for_topic(topic)  # None until the metadata names the topic
            if parts is None:
                time.sleep(0.1)
        if not parts:
            return False, f"{run.client} FAIL no partitions for {topic} in metadata"
        tps = [TopicPartition(topic, part) for part in sorted(parts)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        low = {tp.partition: off for tp, off in c.beginning_offsets(tps).items()}
        high = {tp.partition: off for tp, off in c.end_offsets(tps).items()}
        bad = end_offsets_problem(check, high)
        if bad:
            return False, f"{run.client} FAIL {bad}"
        pos = dict(low)
        while any(pos[part] < high[part] for part in pos) and not budget.expired():
            for tp, recs in c.poll(timeout_ms=200).items():
                for r in recs:
                    pos[tp.partition] = r.offset + 1
                    check.record(tp.partition, r.offset, r.key, r.value, r.headers, r.timestamp)
        extra = None
        if any(pos[part] < high[part] for part in pos):
            extra = "positions " + ", ".join(f"p{part}:{pos[part]}/{high[part]}" for part in sorted(pos))
        return check.verdict(extra)
    finally:
        Phase.closing = True
        c.close(autocommit=False)


# ------------------------------------------------------------------ aiokafka
def run_aiokafka(boot, topic, check, budget):
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    run = check.run

    parts = set()  # the topic's partitions, from the producer's Metadata

    async def produce():
        deadline = budget.produce_deadline()
        left_ms = max(1000, int((deadline - time.monotonic()) * 1000))
        p = AIOKafkaProducer(bootstrap_servers=boot, client_id="weir-roundtrip-aiokafka",
                             acks="all", linger_ms=5, request_timeout_ms=min(10_000, left_ms))
        first_error = None
        try:
            await asyncio.wait_for(p.start(), timeout=max(0.1, deadline - time.monotonic()))

            async def send_all():
                futs = [await p.send(topic, key=run.key(i), value=run.value(i),
                                     headers=run.headers(i)) for i in range(run.n)]
                return await asyncio.gather(*futs, return_exceptions=True)

            results = await asyncio.wait_for(send_all(),
                                             timeout=max(0.1, deadline - time.monotonic()))
            for i, r in enumerate(results):
                if isinstance(r, BaseException):
                    first_error = first_error or one_line(r)
                else:
                    check.ack(i, r.partition, r.offset)
            # A consumer without a subscription has no public metadata lookup; ask here.
            parts.update(await asyncio.wait_for(
                p.partitions_for(topic), timeout=max(0.1, deadline - time.monotonic())))
        except asyncio.TimeoutError:
            first_error = "not acknowledged in time"
        except Exception as e:  # noqa: BLE001 - e.g. KafkaConnectionError from start()
            first_error = one_line(e)
        finally:
            Phase.closing = True
            await asyncio.wait_for(p.stop(), timeout=CLOSE_RESERVE_S / 2)
        return first_error

    async def consume():
        left_ms = max(1000, int(budget.left_s() * 1000))
        c = AIOKafkaConsumer(bootstrap_servers=boot, client_id="weir-roundtrip-aiokafka",
                             group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest",
                             request_timeout_ms=min(10_000, left_ms))
        await asyncio.wait_for(c.start(), timeout=max(0.1, budget.left_s()))
        try:
            if not parts:
                return False, f"{run.client} FAIL no partitions for {topic} in metadata"
            tps = [TopicPartition(topic, part) for part in sorted(parts)]
            c.assign(tps)
            await c.seek_to_beginning(*tps)
            low = {tp.partition: off for tp, off in (await c.beginning_offsets(tps)).items()}
            high = {tp.partition: off for tp, off in (await c.end_offsets(tps)).items()}
            bad = end_offsets_problem(check, high)
            if bad:
                return False, f"{run.client} FAIL {bad}"
            pos = dict(low)
            while any(pos[part] < high[part] for part in pos) and not budget.expired():
                batches = await c.getmany(timeout_ms=200)
                for tp, recs in batches.items():
                    for r in recs:
                        pos[tp.partition] = r.offset + 1
                        check.record(tp.partition, r.offset, r.key, r.value, r.headers,
                                     r.timestamp)
            extra = None
            if any(pos[part] < high[part] for part in pos):
                extra = "positions " + ", ".join(f"p{part}:{pos[part]}/{high[part]}" for part in sorted(pos))
            return check.verdict(extra)
        finally:
            Phase.closing = True
            await asyncio.wait_for(c.stop(), timeout=CLOSE_RESERVE_S / 2)

    async def main():
        Phase.name = "produce"
        first_error = await produce()
        if len(check.acked) < run.n:
            return False, produce_failure(check, first_error)
        Phase.name, Phase.closing = "consume", False
        try:
            return await asyncio.wait_for(consume(), timeout=max(0.1, budget.left_s() + 1))
        except asyncio.TimeoutError:
            return False, f"{run.client} FAIL consume: timed out ({len(check.seen)}/{run.n} read)"

    return asyncio.run(main())


RUNNERS = {"confluent-kafka": run_confluent, "kafka-python": run_kafka_python,
           "aiokafka": run_aiokafka}


def main():
    if len(sys.argv) != 5:
        usage("expected 4 arguments")
    boot, topic, n_arg, client = sys.argv[1:]
    if client not in RUNNERS:
        usage(f"unknown client {client!r}")
    try:
        n = int(n_arg)
    except ValueError:
        usage(f"N must be an integer, got {n_arg!r}")
    if not 1 <= n <= MAX_N:
        usage(f"N must be in 1..{MAX_N}")
    try:
        total_s = int(os.environ.get("ROUNDTRIP_TIMEOUT_S", MAX_TIMEOUT_S))
    except ValueError:
        usage("ROUNDTRIP_TIMEOUT_S must be an integer")
    if not CLOSE_RESERVE_S * 2 <= total_s <= MAX_TIMEOUT_S:
        usage(f"ROUNDTRIP_TIMEOUT_S must be in {CLOSE_RESERVE_S * 2}..{MAX_TIMEOUT_S}")

    if os.environ.get("ROUNDTRIP_DEBUG"):
        import logging
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
    start_watchdog(client, total_s)
    budget = Budget(total_s)
    check = Check(Run(client, n))
    try:
        ok, line = RUNNERS[client](boot, topic, check, budget)
    except Exception as e:  # noqa: BLE001 - any client exception is this run's verdict
        ok, line = False, f"{client} FAIL during {Phase.name}: {one_line(e)}"
    print(line, flush=True)
    # os._exit: a client's non-daemon threads must not keep the process alive
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    main()
