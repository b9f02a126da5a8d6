"""Topic and dynamic broker configs through confluent-kafka's AdminClient, as
tests/it/dynamic_configs.rs drives it: dynamic_configs.py BOOTSTRAP PHASE NODE_ID.

Phases: `topics` (every Kafka 4.1 topic key at CreateTopics, AlterConfigs and
IncrementalAlterConfigs; an invalid value; SUBTRACT emptying cleanup.policy), `broker`
(cluster default log.retention.ms applied to a topic without override, per-broker
message.max.bytes refusing a bigger produce, a read-only key refused), `restarted` (the
dynamic values survived a restart). Prints `PHASE ok` last; any failure raises."""

import sys
import time

from confluent_kafka import KafkaError, KafkaException, Producer, Consumer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)

BOOTSTRAP, PHASE, NODE = sys.argv[1], sys.argv[2], sys.argv[3]
admin = AdminClient({"bootstrap.servers": BOOTSTRAP})

# One valid value of every Kafka 4.1 topic config key (TopicConfig).
ALL_TOPIC_KEYS = {
    "cleanup.policy": "delete",
    "compression.type": "producer",
    "compression.gzip.level": "5",
    "compression.lz4.level": "10",
    "compression.zstd.level": "7",
    "delete.retention.ms": "1000",
    "file.delete.delay.ms": "30000",
    "flush.messages": "1000",
    "flush.ms": "1000",
    "follower.replication.throttled.replicas": "0:1",
    "index.interval.bytes": "2048",
    "leader.replication.throttled.replicas": "*",
    "local.retention.bytes": "-2",
    "local.retention.ms": "-2",
    "max.compaction.lag.ms": "100000",
    "max.message.bytes": "2000000",
    "message.timestamp.after.max.ms": "3600000",
    "message.timestamp.before.max.ms": "86400000",
    "message.timestamp.type": "CreateTime",
    "min.cleanable.dirty.ratio": "0.3",
    "min.compaction.lag.ms": "10",
    "min.insync.replicas": "1",
    "preallocate": "false",
    "remote.log.copy.disable": "false",
    "remote.log.delete.on.disable": "false",
    "remote.storage.enable": "false",
    "retention.bytes": "100000000",
    "retention.ms": "600000",
    "segment.bytes": "2000000",
    "segment.index.bytes": "1000000",
    "segment.jitter.ms": "0",
    "segment.ms": "600000",
    "unclean.leader.election.enable": "false",
}


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def one(futures):
    """The result of the single future in a dict of futures."""
    (f,) = futures.values()
    return f.result(timeout=30)


def create(name, config=None):
    """Creates `name` (1 partition); an existing one is fine (a rerun on one broker)."""
    e = error_of(admin.create_topics([NewTopic(name, 1, 1, config=config or {})]))
    check(e is None or e.code() == KafkaError.TOPIC_ALREADY_EXISTS, f"create {name}: {e}")


def error_of(futures):
    """The KafkaError the single future failed with (None on success)."""
    try:
        one(futures)
        return None
    except KafkaException as e:
        return e.args[0]


def describe(rtype, name):
    return one(admin.describe_configs([ConfigResource(rtype, name)]))


def incremental(rtype, name, entries):
    res = ConfigResource(rtype, name, incremental_configs=entries)
    return admin.incremental_alter_configs([res])


def op(name, value, kind=AlterConfigOpType.SET):
    return ConfigEntry(name, value, incremental_operation=kind)


def watermarks(topic):
    c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "dyn-wm"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        c.close()


def produce(topic, size, extra=None):
    """Delivers one record of `size` bytes; returns the delivery error (None: ok)."""
    conf = {"bootstrap.servers": BOOTSTRAP, "linger.ms": 0, "retries": 0}
    conf.update(extra or {})
    p = Producer(conf)
    out = []
    p.produce(topic, b"x" * size, on_delivery=lambda err, msg: out.append(err))
    p.flush(30)
    check(len(out) == 1, "no delivery report")
    return out[0]


def topics_phase():
    # Every key at CreateTopics.
    fs = admin.create_topics([NewTopic("every-key", 1, 1, config=ALL_TOPIC_KEYS)])
    check(error_of(fs) is None, f"create with every key: {error_of(fs)}")
    got = describe(ResourceType.TOPIC, "every-key")
    for k, v in ALL_TOPIC_KEYS.items():
        check(k in got, f"{k} not described")
        check(got[k].value == v, f"{k}={got[k].value}, wanted {v}")
        check(got[k].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value, f"{k}: {got[k].source}")
    # Every key at (non-incremental) AlterConfigs.
    admin.create_topics([NewTopic("alter-all", 1, 1)])["alter-all"].result(timeout=30)
    res = ConfigResource(ResourceType.TOPIC, "alter-all", set_config=ALL_TOPIC_KEYS)
    one(admin.alter_configs([res]))
    got = describe(ResourceType.TOPIC, "alter-all")
    for k, v in ALL_TOPIC_KEYS.items():
        check(got[k].value == v, f"altered {k}={got[k].value}, wanted {v}")
    # Invalid values: INVALID_CONFIG (40) with a message naming the key.
    for k, v in [("file.delete.delay.ms", "-1"), ("compression.zstd.level", "99"),
                 ("cleanup.policy", "shred"), ("remote.storage.enable", "true")]:
        e = error_of(incremental(ResourceType.TOPIC, "alter-all", [op(k, v)]))
        check(e is not None and e.code() == KafkaError.INVALID_CONFIG, f"{k}={v}: {e}")
        check(e.str(), f"{k}={v}: no message")
        fs = admin.create_topics([NewTopic("bad-" + k.replace(".", "-"), 1, 1, config={k: v})])
        e = error_of(fs)
        check(e is not None and e.code() == KafkaError.INVALID_CONFIG, f"create {k}={v}: {e}")
    # Defaults: a topic without overrides reports DEFAULT_CONFIG for stored-only keys.
    plain = describe(ResourceType.TOPIC, "every-key")["segment.jitter.ms"]
    check(plain.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value, "jitter")
    fresh = describe(ResourceType.TOPIC, "alter-all")
    check(fresh["file.delete.delay.ms"].value == "30000", "file.delete.delay.ms kept")
    # SUBTRACT leaving cleanup.policy empty: accepted (Kafka 4.1), reported empty.
    e = error_of(incremental(ResourceType.TOPIC, "alter-all",
                             [op("cleanup.policy", "delete", AlterConfigOpType.SUBTRACT)]))
    check(e is None, f"SUBTRACT to empty: {e}")
    cp = describe(ResourceType.TOPIC, "alter-all")["cleanup.policy"]
    check(cp.value == "" and cp.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value, f"{cp.value!r}")
    print("topics ok")


def broker_phase():
    # The cluster default log.retention.ms=1000 was set before (`weir config alter
    # --broker-default`: librdkafka refuses an empty broker resource name locally): a
    # topic without override reports and applies it.
    create("ret")
    r = describe(ResourceType.TOPIC, "ret")["retention.ms"]
    check(r.value == "1000", f"retention.ms {r.value}")
    check(r.source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value, f"source {r.source}")
    check(produce("ret", 10) is None, "produce to ret")
    check(produce("ret", 10) is None, "produce to ret")
    deadline = time.time() + 60
    while watermarks("ret")[0] < watermarks("ret")[1]:
        check(time.time() < deadline, f"retention never ran: {watermarks('ret')}")
        time.sleep(0.5)
    # Per-broker message.max.bytes: a bigger batch fails with MESSAGE_TOO_LARGE.
    create("big")
    check(produce("big", 5000) is None, "5000 bytes before")
    e = error_of(incremental(ResourceType.BROKER, NODE, [op("message.max.bytes", "2000")]))
    check(e is None, f"set message.max.bytes: {e}")
    err = produce("big", 5000)
    check(err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, f"{err}")
    check(produce("big", 100) is None, "a small one still goes")
    b = describe(ResourceType.BROKER, NODE)
    m = b["message.max.bytes"]
    check(m.value == "2000" and m.source == ConfigSource.DYNAMIC_BROKER_CONFIG.value, f"{m}")
    check(not m.is_read_only, "message.max.bytes is dynamic")
    check(b["num.partitions"].is_read_only, "num.partitions is read-only")
    lrm = b["log.retention.ms"]
    check(not lrm.is_read_only, "log.retention.ms is dynamic")
    check(lrm.source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value, f"{lrm}")
    # Read-only keys and bad values: INVALID_REQUEST (42), as Kafka.
    for key, value in [("num.partitions", "3"), ("log.dirs", "/x"),
                       ("log.retention.hours", "1"), ("log.retention.ms", "soon")]:
        e = error_of(incremental(ResourceType.BROKER, NODE, [op(key, value)]))
        check(e is not None and e.code() == KafkaError.INVALID_REQUEST, f"{key}: {e}")
    # A per-broker key on a broker: accepted (stored, reported).
    e = error_of(incremental(ResourceType.BROKER, NODE,
                             [op("num.io.threads", "4")]))
    check(e is None, f"num.io.threads: {e}")
    # Non-incremental AlterConfigs on a broker replaces its whole set.
    res = ConfigResource(ResourceType.BROKER, NODE, set_config={"message.max.bytes": "2000"})
    one(admin.alter_configs([res]))
    b = describe(ResourceType.BROKER, NODE)
    check(b["num.io.threads"].source != ConfigSource.DYNAMIC_BROKER_CONFIG.value, "replaced")
    check(b["message.max.bytes"].value == "2000", "kept")
    print("broker ok")


def restarted_phase():
    r = describe(ResourceType.TOPIC, "ret")["retention.ms"]
    check(r.value == "1000", f"retention.ms after restart {r.value}")
    check(r.source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value, f"source {r.source}")
    m = describe(ResourceType.BROKER, NODE)["message.max.bytes"]
    check(m.value == "2000" and m.source == ConfigSource.DYNAMIC_BROKER_CONFIG.value, f"{m}")
    err = produce("big", 5000)
    check(err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, f"{err}")
    s = describe(ResourceType.TOPIC, "big")["segment.bytes"]
    check(s.value == "2000000" and s.source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value,
          f"segment.bytes set by the CLI: {s}")
    print("restarted ok")


{"topics": topics_phase, "broker": broker_phase, "restarted": restarted_phase}[PHASE]()
