#!/usr/bin/env node
// kafkajs against moved leaders: NOT_LEADER_OR_FOLLOWER (6), then the right broker.
// The kafkajs twin of stale_leader.py (read its docstring for the steps):
//
//     node tests/compat/stale_leader.js BOOTSTRAP TOPIC BROKERS
//
// creates TOPIC with two partitions per broker at explicit assignments, produces one
// record to each with one producer (acks=all), deletes and re-creates TOPIC with every
// leader shifted by one broker, produces again with the same producer (its cached leaders
// answer NOT_LEADER_OR_FOLLOWER; kafkajs must refresh Metadata and retry), then reads the
// second round back with kafkajs' own Fetch layer (as roundtrip.js does).
//
// Output: one line on stdout,
//     kafkajs ok: N partitions, K NOT_LEADER_OR_FOLLOWER answers followed
//     kafkajs FAIL <reason>
// It fails as well when no NOT_LEADER_OR_FOLLOWER answer was seen. Bounded by 60 s.
// kafkajs is found by kafkajs_find.js ($KAFKAJS_DIR, $WEIR_CLIENTS_DIR, ...).
'use strict';

const TIMEOUT_S = 60;

function finish(ok, line) {
  process.stdout.write(`${line}\n`, () => process.exit(ok ? 0 : 1));
}
setTimeout(() => finish(false, `kafkajs FAIL timed out after ${TIMEOUT_S}s`), TIMEOUT_S * 1000);

const { loadKafkajs } = require('./kafkajs_find');

async function main() {
  const args = process.argv.slice(2);
  if (args.length !== 3) {
    process.stderr.write('usage: stale_leader.js BOOTSTRAP TOPIC BROKERS(1,2,3)\n');
    process.exit(2);
  }
  const [boot, topic, idsArg] = args;
  const ids = idsArg.split(',').map(Number);
  const n = 2 * ids.length;
  const { Kafka, logLevel } = loadKafkajs();
  let notLeader = 0;
  const logCreator = () => ({ level, log }) => {
    const text = `${log.message} ${log.error || ''}`;
    // one "Response Produce(...)" log line per partition error kafkajs receives
    if (/^Response Produce/.test(log.message) && /not the leader/i.test(String(log.error))) notLeader += 1;
    if (process.env.ROUNDTRIP_DEBUG || level <= logLevel.ERROR) process.stderr.write(`kafkajs: ${text}\n`);
  };
  const kafka = new Kafka({
    clientId: 'weir-stale-leader', brokers: [boot], logLevel: logLevel.DEBUG, logCreator,
    connectionTimeout: 3000, requestTimeout: 10000,
    retry: { retries: 5, initialRetryTime: 100, maxRetryTime: 2000 },
  });
  const admin = kafka.admin();
  await admin.connect();
  const create = (shift) => admin.createTopics({
    waitForLeaders: true,
    topics: [{
      topic,
      replicaAssignment: [...Array(n).keys()].map((p) => ({
        partition: p,
        replicas: ids.map((_, k) => ids[(p + shift + k) % ids.length]),
      })),
    }],
  });
  await create(0);
  const producer = kafka.producer({ allowAutoTopicCreation: true });
  await producer.connect();
  const round = (tag) => producer.send({
    topic, acks: -1, messages: [...Array(n).keys()].map((p) => ({ partition: p, key: 'k', value: `${tag}-${p}` })),
  });
  await round('first');
  await admin.deleteTopics({ topics: [topic] });
  while ((await admin.listTopics()).includes(topic)) await new Promise((r) => setTimeout(r, 50));
  await create(1);
  const before = notLeader;
  let results;
  try {
    results = await round('second');
  } catch (e) {
    return [false, `kafkajs FAIL second round: ${e.name}: ${e.message} (after ${notLeader - before} NOT_LEADER_OR_FOLLOWER answers)`];
  }
  await producer.disconnect();
  const acked = new Set(results.map((r) => r.partition));
  if (acked.size !== n) return [false, `kafkajs FAIL second round acknowledged on partitions ${[...acked]}`];

  // read back through kafkajs' Fetch layer, from the leaders its Metadata names
  const sym = Object.getOwnPropertySymbols(kafka).find((s) => s.description === 'private:Kafka:createCluster');
  const cluster = kafka[sym]({ allowAutoTopicCreation: false });
  await cluster.connect();
  await cluster.addTargetTopic(topic);
  await cluster.refreshMetadata();
  const got = new Map();
  for (const pm of cluster.findTopicPartitionMetadata(topic)) {
    const broker = await cluster.findBroker({ nodeId: pm.leader });
    const res = await broker.fetch({
      replicaId: -1, maxWaitTime: 100, minBytes: 1, maxBytes: 1 << 20,
      topics: [{ topic, partitions: [{ partition: pm.partitionId, fetchOffset: '0', maxBytes: 1 << 20 }] }],
    });
    for (const t of res.responses) {
      for (const pr of t.partitions) {
        if (pr.errorCode) return [false, `kafkajs FAIL fetch p${pr.partition} from ${pm.leader}: error ${pr.errorCode}`];
        for (const m of pr.messages) got.set(pr.partition, m.value.toString());
      }
    }
  }
  await cluster.disconnect();
  await admin.disconnect();
  for (let p = 0; p < n; p++) {
    if (got.get(p) !== `second-${p}`) return [false, `kafkajs FAIL p${p} read back ${got.get(p)}, expected second-${p}`];
  }
  if (notLeader - before === 0) return [false, 'kafkajs FAIL no NOT_LEADER_OR_FOLLOWER answer seen: leaders did not move?'];
  return [true, `kafkajs ok: ${n} partitions, ${notLeader - before} NOT_LEADER_OR_FOLLOWER answers followed`];
}

process.env.KAFKAJS_NO_PARTITIONER_WARNING = '1';
main().then(([ok, line]) => finish(ok, line), (e) => finish(false, `kafkajs FAIL ${e.name}: ${e.message}`));
