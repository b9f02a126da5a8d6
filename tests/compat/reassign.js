#!/usr/bin/env node
// kafkajs' admin client against partition reassignment (KIP-455): its
// alterPartitionReassignments (AlterPartitionReassignments v0, key 45) and
// listPartitionReassignments (ListPartitionReassignments v0, key 46), as sent to the
// broker Metadata names controller.
//
//     node tests/compat/reassign.js BOOTSTRAP TOPIC PARTITION REPLICAS(2,3,1)
//
// First asks to move PARTITION to broker 99 (not registered): the broker must refuse it
// with INVALID_REPLICA_ASSIGNMENT (39). Then moves it to REPLICAS and lists the
// reassignments of TOPIC (the move may already be complete: then none is listed).
//
// Output: one line on stdout,
//     kafkajs ok: refused INVALID_REPLICA_ASSIGNMENT, started TOPIC-P to R, listed [...]
//     kafkajs FAIL <reason>
// Bounded by 60 s. kafkajs is found by kafkajs_find.js.
'use strict';

const TIMEOUT_S = 60;

function finish(ok, line) {
  process.stdout.write(`${line}\n`, () => process.exit(ok ? 0 : 1));
}
setTimeout(() => finish(false, `kafkajs FAIL timed out after ${TIMEOUT_S}s`), TIMEOUT_S * 1000);

const { loadKafkajs } = require('./kafkajs_find');

async function main() {
  const args = process.argv.slice(2);
  if (args.length !== 4) {
    process.stderr.write('usage: reassign.js BOOTSTRAP TOPIC PARTITION REPLICAS(2,3,1)\n');
    process.exit(2);
  }
  const [boot, topic, partArg, replicasArg] = args;
  const partition = Number(partArg);
  const replicas = replicasArg.split(',').map(Number);
  const { Kafka, logLevel } = loadKafkajs();
  const kafka = new Kafka({
    clientId: 'weir-reassign', brokers: boot.split(','), logLevel: logLevel.ERROR,
    connectionTimeout: 3000, requestTimeout: 30000,
    retry: { retries: 5, initialRetryTime: 100, maxRetryTime: 2000 },
  });
  const admin = kafka.admin();
  await admin.connect();
  try {
    let refused = null;
    try {
      await admin.alterPartitionReassignments({
        topics: [{ topic, partitionAssignment: [{ partition, replicas: [99] }] }],
      });
    } catch (e) {
      refused = (e.errors || [e]).map(x => x.type).join(',');
    }
    if (refused !== 'INVALID_REPLICA_ASSIGNMENT') {
      return finish(false, `kafkajs FAIL a move to broker 99 was answered ${refused}`);
    }
    await admin.alterPartitionReassignments({
      topics: [{ topic, partitionAssignment: [{ partition, replicas }] }],
    });
    const listed = await admin.listPartitionReassignments({ topics: [{ topic, partitions: [partition] }] });
    const parts = listed.topics.flatMap(t => t.partitions.map(p =>
      `${t.name}-${p.partition} replicas ${p.replicas} adding ${p.addingReplicas} removing ${p.removingReplicas}`));
    return finish(true, `kafkajs ok: refused ${refused}, started ${topic}-${partition} to ${replicas}, listed [${parts.join('; ')}]`);
  } finally {
    await admin.disconnect();
  }
}

main().catch(e => finish(false, `kafkajs FAIL ${e && e.stack ? e.stack.split('\n')[0] : e}`));
