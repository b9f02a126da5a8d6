#!/usr/bin/env node
// Kafka transactions through kafkajs: a committed, an aborted and a committed transaction,
// then a read_committed consumer (kafkajs' consumer.run in a group, readUncommitted false)
// that must see exactly the committed records, and a read_uncommitted one that sees all.
//
// Usage: node tests/compat/transactions.js BOOTSTRAP TOPIC
// Prints "kafkajs transactions ok committed=20 all=30" on success, exits 1 otherwise.

const { loadKafkajs } = require('./kafkajs_find');

async function readAll(kjs, kafka, topic, readUncommitted, want) {
  const consumer = kafka.consumer({ groupId: `reader-${process.pid}-${readUncommitted}`,
    readUncommitted, maxWaitTimeInMs: 200 });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const values = [];
  let last = Date.now();
  await consumer.run({ eachMessage: async ({ message }) => {
    values.push(message.value.toString());
    last = Date.now();
  } });
  const started = Date.now();
  while (Date.now() - started < 30000) {
    await new Promise((r) => setTimeout(r, 200));
    if (values.length >= want && Date.now() - last > 2000) break;
  }
  await consumer.disconnect();
  return values;
}

async function main() {
  const [bootstrap, topic] = process.argv.slice(2);
  const kjs = loadKafkajs();
  const kafka = new kjs.Kafka({ clientId: 'weir-txn-test', brokers: bootstrap.split(','),
    logLevel: kjs.logLevel.NOTHING });
  const producer = kafka.producer({ transactionalId: `tx-js-${topic}`, maxInFlightRequests: 1,
    idempotent: true });
  await producer.connect();
  const runs = [['c1', true], ['a', false], ['c2', true]];
  for (const [tag, commit] of runs) {
    const txn = await producer.transaction();
    await txn.send({ topic, messages: Array.from({ length: 10 }, (_, i) => ({
      key: `${tag}-${i}`, value: `js-${tag}-${i}` })) });
    if (commit) await txn.commit(); else await txn.abort();
  }
  await producer.disconnect();
  const committed = await readAll(kjs, kafka, topic, false, 20);
  const all = await readAll(kjs, kafka, topic, true, 30);
  const want = [];
  for (const tag of ['c1', 'c2']) for (let i = 0; i < 10; i++) want.push(`js-${tag}-${i}`);
  const sorted = (a) => a.slice().sort().join(',');
  if (sorted(committed) !== sorted(want)) {
    console.log(`read_committed saw ${committed.length}: ${sorted(committed)}`);
    process.exit(1);
  }
  if (all.length !== 30) {
    console.log(`read_uncommitted saw ${all.length}`);
    process.exit(1);
  }
  console.log(`kafkajs transactions ok committed=${committed.length} all=${all.length}`);
}

main().catch((e) => { console.log(`error: ${e.stack || e}`); process.exit(1); });
