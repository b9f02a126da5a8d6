#!/usr/bin/env node
// One consumer-group member of @platformatic/kafka on KIP-848's consumer protocol
// (groupProtocol 'consumer': ConsumerGroupHeartbeat, the broker assigns), driven by a test
// through stdin/stdout with the interface and output of tests/compat/group_member.py (see
// there). A pure-JavaScript client: its KIP-848 code shares nothing with librdkafka's.
//
// Usage:
//     node tests/compat/kip848_member.mjs BOOTSTRAP TOPIC GROUP platformatic [--max N]
//
// Output lines: "assigned P,P,..." whenever the client's assignment changes ("-": none),
// "record P O VALUE", "committed P O" (after each record's commit succeeded), "closed".
// Reads from the committed offsets, else the earliest. Stops on stdin EOF (leaving the
// group: member epoch -1) or after --max records. The package is found under
// $WEIR_CLIENTS_DIR/node (default /var/tmp/weir-clients), where tests/install-deps.sh
// installs the pinned version.

import path from 'node:path';
import { pathToFileURL } from 'node:url';

function emit(line) { process.stdout.write(line + '\n'); }

const argv = process.argv.slice(2);
const [bootstrap, topic, group] = argv;
const maxAt = argv.indexOf('--max');
const max = maxAt >= 0 ? Number(argv[maxAt + 1]) : null;
const clientsDir = process.env.WEIR_CLIENTS_DIR || '/var/tmp/weir-clients';
const entry = path.join(clientsDir, 'node', 'node_modules', '@platformatic', 'kafka', 'dist', 'index.js');
const { Consumer, stringDeserializers } = await import(pathToFileURL(entry).href);

const consumer = new Consumer({
  groupId: group,
  clientId: 'weir-kip848-test',
  bootstrapBrokers: bootstrap.split(','),
  deserializers: stringDeserializers,
  groupProtocol: 'consumer',
});
let stopping = false;
const stop = async () => {
  if (stopping) return;
  stopping = true;
  try { await consumer.close(true); } catch (e) { process.stderr.write(`close: ${e}\n`); }
  emit('closed');
  process.exit(0);
};
process.stdin.on('end', stop);
process.stdin.resume();
setTimeout(() => process.exit(3), 300000).unref();

let shown = null;
const report = () => {
  const mine = [];
  for (const a of consumer.assignments || []) {
    if (a.topic === topic) mine.push(...a.partitions);
  }
  mine.sort((x, y) => x - y);
  const line = 'assigned ' + (mine.length ? mine.join(',') : '-');
  if (line !== shown) { shown = line; emit(line); }
};
setInterval(report, 100).unref();

const stream = await consumer.consume({
  autocommit: false, topics: [topic], mode: 'committed', fallbackMode: 'earliest',
});
let n = 0;
for await (const m of stream) {
  if (stopping) break;
  report();
  emit(`record ${m.partition} ${m.offset} ${m.value ?? ''}`);
  n += 1;
  try {
    await m.commit();
    emit(`committed ${m.partition} ${BigInt(m.offset) + 1n}`);
  } catch (e) {
    process.stderr.write(`commit failed: ${e}\n`);
  }
  if (max !== null && n >= max) break;
}
await stop();
