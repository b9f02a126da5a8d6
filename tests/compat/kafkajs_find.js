// Where the kafkajs scripts of tests/compat find kafkajs: $KAFKAJS_DIR (a package or a
// directory with node_modules/kafkajs), then $WEIR_CLIENTS_DIR/node (default
// /var/tmp/weir-clients, where tests/install-deps.sh installs the pinned version), then
// /opt/weir-clients/node, then Node's own resolution.
'use strict';

const fs = require('fs');
const path = require('path');

// { kjs, dir }: the kafkajs module and where it was found, or kjs null and the places
// looked in.
function findKafkajs() {
  const clientsDir = process.env.WEIR_CLIENTS_DIR || '/var/tmp/weir-clients';
  const candidates = [];
  if (process.env.KAFKAJS_DIR) {
    candidates.push(path.join(process.env.KAFKAJS_DIR, 'node_modules', 'kafkajs'), process.env.KAFKAJS_DIR);
  }
  candidates.push(path.join(clientsDir, 'node', 'node_modules', 'kafkajs'),
    '/opt/weir-clients/node/node_modules/kafkajs');
  for (const dir of candidates) {
    let name = null;
    try {
      name = JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8')).name;
    } catch (e) {
      continue; // no package here
    }
    if (name === 'kafkajs') return { kjs: require(dir), dir };
  }
  try {
    return { kjs: require('kafkajs'), dir: path.dirname(require.resolve('kafkajs/package.json')) };
  } catch (e) {
    return { kjs: null, dir: candidates.join(', ') };
  }
}

// The kafkajs module; throws, naming where it looked, when there is none.
function loadKafkajs() {
  const { kjs, dir } = findKafkajs();
  if (!kjs) throw new Error(`kafkajs not found (looked in ${dir}); run tests/install-deps.sh`);
  return kjs;
}

module.exports = { findKafkajs, loadKafkajs };
