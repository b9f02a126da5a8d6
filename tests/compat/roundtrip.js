#!/usr/bin/env node
// Round trip through a Kafka-wire broker with kafkajs.
//
// Usage:
//     node tests/compat/roundtrip.js BOOTSTRAP TOPIC N [kafkajs]
//
//     BOOTSTRAP  host:port[,host:port...]     e.g. 127.0.0.1:19092
//     TOPIC      topic to write to; created by the producer's Metadata request
//                (auto-creation) unless it exists already. Old records in it do no harm.
//     N          number of records to produce, 1..1000000
//     kafkajs    the client name (optional; the only one this script knows), so that the
//                command line has the same shape as roundtrip.py's
//
// What it does:
//     1. produces N records with acks=all (producer.send, batches of 100, one batch in
//        flight): key "k<i>", a value tagged with a fresh run id, and 2 headers
//        ("weir-run" = run id, "weir-idx" = i). The partition of each record is taken from
//        kafkajs' default partitioner (wrapped), its offset from the Produce response
//        (baseOffset + position within the partition's batch);
//     2. reads them back WITHOUT a consumer group. kafkajs' consumer only works in a group
//        (consumer.run needs JoinGroup/SyncGroup, there is no assign()), so the read uses
//        kafkajs' own lower layers, the ones its consumer runs on: a Cluster from the
//        client (Metadata), the public admin.fetchTopicOffsets (ListOffsets earliest and
//        latest), then broker.fetch (Fetch, kafkajs' record-batch decoder) from the
//        earliest offset until each partition reaches the end offset it had after the
//        produce. These internals are those of the pinned kafkajs (2.2.4, see
//        tests/install-deps.sh); if they are missing the script says so and fails. When
//        weir has a group coordinator, a consumer.run() half can join;
//     3. checks each record of this run: key, value, both headers (names, values, order),
//        timestamp near now, partition and offset equal to what the Produce response said,
//        no duplicates, none missing, and per partition in produce order.
//
// Output: exactly one line on stdout,
//     kafkajs ok N/N
//     kafkajs FAIL <reason>
// kafkajs' log (errors only; everything with ROUNDTRIP_DEBUG=1) goes to stderr. Exit status: 0 ok, 1 FAIL, 2 usage error.
//
// Time: everything is bounded by ROUNDTRIP_TIMEOUT_S (default 60, the maximum): requests
// have timeouts and few retries, and a watchdog timer prints a FAIL line and exits if
// anything still hangs when it runs out.
//
// Where kafkajs is looked for, first hit wins:
//     $KAFKAJS_DIR (the kafkajs package itself, or a folder with node_modules/kafkajs),
//     ${WEIR_CLIENTS_DIR:-/var/tmp/weir-clients}/node/node_modules/kafkajs (install-deps.sh),
//     /opt/weir-clients/node/node_modules/kafkajs, then node's own resolution.
'use strict';

const crypto = require('crypto');

const CLIENT = 'kafkajs';
const MAX_N = 1000000;
const MAX_TIMEOUT_S = 60;
const CLOSE_RESERVE_S = 5; // kept back from the budget so connections can close
const PRODUCE_SHARE = 0.5; // of the remaining budget, for producing
const SEND_BATCH = 100;
const FETCH_MAX_BYTES = 1 << 20;
const FETCH_MAX_WAIT_MS = 200;

function usage(msg) {
  process.stderr.write(`usage: ${process.argv[1]} BOOTSTRAP TOPIC N [kafkajs]: ${msg}\n`);
  process.exit(2);
}

function oneLine(e) {
  let text = e && e.message !== undefined ? String(e.message) : String(e);
  if (e && e.name && !text.startsWith(e.name)) text = `${e.name}: ${text}`;
  return text.split(/\s+/).join(' ').slice(0, 200);
}

// ------------------------------------------------------------------ arguments and budget
const args = process.argv.slice(2);
if (args.length < 3 || args.length > 4) usage('expected 3 or 4 arguments');
const [boot, topic, nArg, clientArg] = args;
if (clientArg !== undefined && clientArg !== CLIENT) usage(`unknown client ${JSON.stringify(clientArg)}`);
if (!/^[0-9]+$/.test(nArg)) usage(`N must be an integer, got ${JSON.stringify(nArg)}`);
const n = Number(nArg);
if (n < 1 || n > MAX_N) usage(`N must be in 1..${MAX_N}`);
const totalArg = process.env.ROUNDTRIP_TIMEOUT_S || String(MAX_TIMEOUT_S);
if (!/^[0-9]+$/.test(totalArg)) usage('ROUNDTRIP_TIMEOUT_S must be an integer');
const totalS = Number(totalArg);
if (totalS < 2 * CLOSE_RESERVE_S || totalS > MAX_TIMEOUT_S) {
  usage(`ROUNDTRIP_TIMEOUT_S must be in ${2 * CLOSE_RESERVE_S}..${MAX_TIMEOUT_S}`);
}

const startMs = Date.now();
const endMs = startMs + (totalS - CLOSE_RESERVE_S) * 1000;
const leftMs = () => Math.max(0, endMs - Date.now());
const expired = () => Date.now() >= endMs;
let phase = 'start';
// set while connections close: a finally block must not rename the phase an error escaping
// through it came from
let closing = false;

function finish(ok, line) {
  process.stdout.write(`${line}\n`, () => process.exit(ok ? 0 : 1));
}

// Watchdog: fires even if a promise never settles.
setTimeout(() => finish(false, `${CLIENT} FAIL timed out after ${totalS}s (during ${phase}${closing ? ' (closing the client)' : ''})`),
  totalS * 1000);

// Rejects after ms; the timer does not keep the process alive.
function withTimeout(promise, ms, what) {
  let timer;
  const t = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} timed out after ${ms} ms`)), ms);
  });
  return Promise.race([promise, t]).finally(() => clearTimeout(timer));
}

// ------------------------------------------------------------------ finding kafkajs
const { findKafkajs } = require('./kafkajs_find');

// ------------------------------------------------------------------ the records of one run
const runId = `${Math.floor(startMs / 1000)}-${process.pid}-${crypto.randomBytes(3).toString('hex')}`;
const valuePrefix = `${CLIENT}|${runId}|`;
const keyOf = (i) => `k${i}`;
const valueOf = (i) => `${valuePrefix}${i}|${'v'.repeat(i % 97)}`; // sizes vary with i
const headersOf = (i) => ({ 'weir-run': runId, 'weir-idx': String(i) });

const acked = new Map(); // i -> [partition, offset]
const seen = new Set();
const lastIdx = new Map(); // partition -> last i read
const problems = new Map(); // kind -> [count, first detail]
let dups = 0;

function problem(kind, detail) {
  if (!problems.has(kind)) problems.set(kind, [0, detail]);
  problems.get(kind)[0] += 1;
}

function indexOf(value) {
  if (!value) return null;
  const v = value.toString('latin1');
  if (!v.startsWith(valuePrefix)) return null;
  const head = v.slice(valuePrefix.length).split('|')[0];
  return /^[0-9]+$/.test(head) ? Number(head) : -1;
}

function checkRecord(partition, offset, m) {
  const i = indexOf(m.value);
  if (i === null) return; // another run's or client's record
  if (i < 0 || i >= n) {
    problem('value', `p${partition}@${offset} value=${JSON.stringify(m.value.toString().slice(0, 60))}`);
    return;
  }
  if (m.value.toString() !== valueOf(i)) problem('value', `record ${i}: ${JSON.stringify(m.value.toString().slice(0, 60))}`);
  const key = m.key == null ? null : m.key.toString();
  if (key !== keyOf(i)) problem('key', `record ${i}: key=${JSON.stringify(key)}`);
  const got = Object.entries(m.headers || {}).map(([k, v]) => [k, Array.isArray(v) ? v.map(String) : v == null ? v : v.toString()]);
  const want = Object.entries(headersOf(i));
  if (JSON.stringify(got) !== JSON.stringify(want)) problem('headers', `record ${i}: ${JSON.stringify(got)}`);
  const ts = Number(m.timestamp);
  if (!(ts >= startMs - 60000 && ts <= Date.now() + 60000)) problem('timestamp', `record ${i}: ${m.timestamp}`);
  const a = acked.get(i);
  if (a && (a[0] !== partition || a[1] !== offset)) {
    problem('offset', `record ${i} acked at p${a[0]}@${a[1]}, read at p${partition}@${offset}`);
  }
  const last = lastIdx.get(partition);
  if (last !== undefined && i <= last) problem('order', `p${partition}: record ${i} after record ${last}`);
  lastIdx.set(partition, i);
  if (seen.has(i)) dups += 1;
  seen.add(i);
}

function verdict(extra) {
  const parts = [];
  if (extra) parts.push(extra);
  if (seen.size < n) {
    let first = 0;
    while (seen.has(first)) first += 1;
    parts.push(`read back ${seen.size}/${n} (first missing: record ${first})`);
  }
  if (dups) parts.push(`${dups} duplicates`);
  for (const [kind, [count, detail]] of problems) parts.push(`${count} bad ${kind} (first: ${detail})`);
  if (parts.length) return [false, `${CLIENT} FAIL ${parts.join('; ')}`];
  return [true, `${CLIENT} ok ${seen.size}/${n}`];
}

// ------------------------------------------------------------------ produce
async function produce(kafka, Partitioners) {
  const chosen = new Map(); // message object -> partition the partitioner picked
  const createPartitioner = () => {
    const inner = Partitioners.DefaultPartitioner();
    return (a) => {
      const p = inner(a);
      chosen.set(a.message, p);
      return p;
    };
  };
  const producer = kafka.producer({ createPartitioner, allowAutoTopicCreation: true });
  const deadline = Date.now() + leftMs() * PRODUCE_SHARE;
  let firstError = null;
  try {
    await withTimeout(producer.connect(), Math.max(1, deadline - Date.now()), 'producer connect');
    for (let start = 0; start < n; start += SEND_BATCH) {
      const messages = [];
      for (let i = start; i < Math.min(n, start + SEND_BATCH); i++) {
        messages.push({ key: keyOf(i), value: valueOf(i), headers: headersOf(i) });
      }
      const left = deadline - Date.now();
      if (left <= 0) throw new Error('not acknowledged in time');
      const results = await withTimeout(
        producer.send({ topic, acks: -1, timeout: Math.min(10000, left), messages }), left, 'send');
      const base = new Map();
      for (const r of results) {
        if (r.errorCode) throw new Error(`partition ${r.partition}: error code ${r.errorCode}`);
        base.set(r.partition, BigInt(r.baseOffset));
      }
      const next = new Map(); // partition -> records of this batch seen so far
      messages.forEach((m, k) => {
        const p = chosen.get(m);
        if (p === undefined || !base.has(p)) return; // left unacknowledged: reported below
        const idx = next.get(p) || 0n;
        next.set(p, idx + 1n);
        acked.set(start + k, [p, Number(base.get(p) + idx)]);
      });
    }
  } catch (e) {
    firstError = oneLine(e);
  } finally {
    closing = true;
    await withTimeout(producer.disconnect(), CLOSE_RESERVE_S * 500, 'producer disconnect').catch(() => {});
  }
  if (acked.size < n) {
    return `${CLIENT} FAIL produce: ${n - acked.size}/${n} not acknowledged (${firstError || 'no offset for them in the Produce responses'})`;
  }
  return null;
}

// ------------------------------------------------------------------ consume, without a group
async function consume(kafka) {
  const createClusterSym = Object.getOwnPropertySymbols(kafka)
    .find((s) => s.description === 'private:Kafka:createCluster');
  if (!createClusterSym) {
    return [false, `${CLIENT} FAIL this kafkajs has no private:Kafka:createCluster (not 2.2.x?)`];
  }
  const admin = kafka.admin();
  const cluster = kafka[createClusterSym]({ allowAutoTopicCreation: false });
  try {
    phase = 'consume: metadata';
    await withTimeout(admin.connect(), Math.max(1, leftMs()), 'admin connect');
    await withTimeout(cluster.connect(), Math.max(1, leftMs()), 'cluster connect');
    await withTimeout(cluster.addTargetTopic(topic), Math.max(1, leftMs()), 'metadata');
    const partitionMd = cluster.findTopicPartitionMetadata(topic);
    if (!partitionMd.length) return [false, `${CLIENT} FAIL no partitions for ${topic} in metadata`];

    phase = 'consume: list offsets';
    const offsets = await withTimeout(admin.fetchTopicOffsets(topic), Math.max(1, leftMs()), 'fetchTopicOffsets');
    const low = new Map(offsets.map((o) => [o.partition, Number(o.low)]));
    const high = new Map(offsets.map((o) => [o.partition, Number(o.high)]));
    for (const [i, [p, off]] of acked) {
      if (!high.has(p)) return [false, `${CLIENT} FAIL partition ${p} (record ${i}) missing from ListOffsets`];
      if (high.get(p) <= off) {
        return [false, `${CLIENT} FAIL p${p} end offset ${high.get(p)} <= acknowledged offset ${off} (record ${i})`];
      }
    }

    phase = 'consume: fetch';
    const pos = new Map(low);
    const leaderOf = new Map(partitionMd.map((pm) => [pm.partitionId, pm.leader]));
    const behind = () => [...pos.keys()].filter((p) => pos.get(p) < high.get(p));
    while (behind().length && !expired()) {
      // one Fetch per leader, all of its lagging partitions in it
      const byLeader = new Map();
      for (const p of behind()) {
        const leader = leaderOf.get(p);
        if (!byLeader.has(leader)) byLeader.set(leader, []);
        byLeader.get(leader).push({ partition: p, fetchOffset: String(pos.get(p)), maxBytes: FETCH_MAX_BYTES });
      }
      for (const [nodeId, partitions] of byLeader) {
        const broker = await withTimeout(cluster.findBroker({ nodeId }), Math.max(1, leftMs()), 'findBroker');
        const res = await withTimeout(broker.fetch({
          replicaId: -1, maxWaitTime: FETCH_MAX_WAIT_MS, minBytes: 1, maxBytes: FETCH_MAX_BYTES,
          topics: [{ topic, partitions }],
        }), Math.max(1, leftMs()), 'fetch');
        for (const t of res.responses) {
          for (const pr of t.partitions) {
            for (const m of pr.messages) {
              const off = Number(m.offset);
              // a batch may start before the fetch offset; control records are not data
              if (off < pos.get(pr.partition) || m.isControlRecord) continue;
              pos.set(pr.partition, off + 1);
              checkRecord(pr.partition, off, m);
            }
          }
        }
      }
    }
    const lag = behind();
    const extra = lag.length
      ? `positions ${[...pos.keys()].sort((a, b) => a - b).map((p) => `p${p}:${pos.get(p)}/${high.get(p)}`).join(', ')}`
      : null;
    return verdict(extra);
  } finally {
    closing = true;
    await withTimeout(Promise.allSettled([admin.disconnect(), cluster.disconnect()]),
      CLOSE_RESERVE_S * 500, 'disconnect').catch(() => {});
  }
}

// ------------------------------------------------------------------ main
async function main() {
  const { kjs, dir } = findKafkajs();
  if (!kjs) return [false, `${CLIENT} FAIL kafkajs not found (looked in ${dir}); run tests/install-deps.sh`];
  const { Kafka, Partitioners, logLevel } = kjs;
  // kafkajs' default logger writes to stdout; ours keeps stdout for the result line
  const levelName = Object.fromEntries(Object.entries(logLevel).map(([k, v]) => [v, k]));
  const logCreator = () => ({ namespace, level, log }) => {
    const { message, error, ...rest } = log;
    process.stderr.write(`kafkajs ${levelName[level]} ${namespace}: ${message} ${error || ''} ${process.env.ROUNDTRIP_DEBUG ? JSON.stringify(rest) : ''}\n`);
  };
  const kafka = new Kafka({
    clientId: 'weir-roundtrip-kafkajs',
    brokers: boot.split(','),
    logLevel: process.env.ROUNDTRIP_DEBUG ? logLevel.DEBUG : logLevel.ERROR,
    logCreator,
    connectionTimeout: 3000,
    requestTimeout: 10000,
    retry: { retries: 3, initialRetryTime: 100, maxRetryTime: 2000 },
  });
  phase = 'produce';
  const failed = await produce(kafka, Partitioners);
  if (failed) return [false, failed];
  phase = 'consume';
  closing = false;
  return consume(kafka);
}

process.env.KAFKAJS_NO_PARTITIONER_WARNING = '1';
main().then(([ok, line]) => finish(ok, line),
  (e) => finish(false, `${CLIENT} FAIL during ${phase}: ${oneLine(e)}`));
