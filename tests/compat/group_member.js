#!/usr/bin/env node
// One kafkajs consumer-group member, driven by a test through stdin/stdout: the same
// interface and output as tests/compat/group_member.py (see there).
//
// Usage:
//     node tests/compat/group_member.js BOOTSTRAP TOPIC GROUP kafkajs [--assignor range|roundrobin]
//                                       [--session-ms N] [--max N]
//
// Output lines: "assigned P,P,..." (from the GROUP_JOIN event: this member's partitions),
// "record P O VALUE", "committed P O" (kafkajs commits the offset after each record with
// autoCommitThreshold 1), "closed". Stops on stdin EOF or after --max records.

const { loadKafkajs } = require('./kafkajs_find');

function emit(line) { process.stdout.write(line + '\n'); }

async function main() {
  const argv = process.argv.slice(2);
  const [bootstrap, topic, group] = argv;
  const opt = (name, dflt) => {
    const i = argv.indexOf(name);
    return i >= 0 ? argv[i + 1] : dflt;
  };
  const kjs = loadKafkajs();
  const assignorName = opt('--assignor', 'range');
  const assignor = assignorName === 'roundrobin' ? kjs.PartitionAssigners.roundRobin
    : kjs.PartitionAssigners.range || kjs.PartitionAssigners.roundRobin;
  const sessionTimeout = Number(opt('--session-ms', '6000'));
  const max = opt('--max', null);
  const kafka = new kjs.Kafka({ clientId: 'weir-group-test', brokers: bootstrap.split(','),
    logLevel: kjs.logLevel.NOTHING });
  const consumer = kafka.consumer({ groupId: group, sessionTimeout,
    heartbeatInterval: Math.max(100, Math.floor(sessionTimeout / 10)),
    partitionAssigners: [assignor], metadataMaxAge: 1000 });
  consumer.on(consumer.events.GROUP_JOIN, (e) => {
    const mine = (e.payload.memberAssignment || {})[topic] || [];
    emit('assigned ' + (mine.length ? mine.slice().sort((a, b) => a - b).join(',') : '-'));
  });
  let n = 0;
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    await consumer.disconnect();
    emit('closed');
    process.exit(0);
  };
  process.stdin.on('end', stop);
  process.stdin.resume();
  setTimeout(() => process.exit(3), 300000).unref();
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  await consumer.run({
    autoCommit: false,
    eachMessage: async ({ partition, message }) => {
      if (stopping) return;
      emit(`record ${partition} ${message.offset} ${message.value ? message.value.toString() : ''}`);
      n += 1;
      const next = (BigInt(message.offset) + 1n).toString();
      try {
        await consumer.commitOffsets([{ topic, partition, offset: next }]);
        emit(`committed ${partition} ${next}`);
      } catch (e) {
        process.stderr.write(`commit failed: ${e}\n`);
      }
      if (max !== null && n >= Number(max)) setImmediate(stop);
    },
  });
}

main().catch((e) => { process.stderr.write(`group_member.js: ${e.stack || e}\n`); process.exit(1); });
