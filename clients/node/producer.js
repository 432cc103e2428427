'use strict';
// Enqueue tasks with plain node-postgres: one JSON payload per argument, or per line of stdin.
//
//   DATABASE_URL=postgresql://... node producer.js '{"n": 1}' '{"n": 2}'
//   seq 1000 | jq -c '{n: .}' | DATABASE_URL=... STAGE=resize node producer.js
//
// All payloads go in one call to queue.enqueue_batch (one transaction, one NOTIFY); the new ids
// are printed one a line. Use queue.enqueue(payload, stage, key => ...) for keyed tasks.

const { Client } = require('pg');
const { connectTimeoutMillis } = require('./worker');

async function enqueue(url, stage, payloads) {
  // node-postgres alone waits for ever on a server that never answers: 10 s unless the URL's
  // connect_timeout or PGCONNECT_TIMEOUT says otherwise.
  const db = new Client({ connectionString: url, connectionTimeoutMillis: connectTimeoutMillis(url) });
  await db.connect();
  try {
    const { rows } = await db.query(
      'SELECT queue.enqueue_batch(payloads => $1::jsonb[], stage => $2) AS id',
      [payloads.map((p) => JSON.stringify(p)), stage]);
    return rows.map((r) => r.id);
  } finally {
    await db.end();
  }
}

async function main(args) {
  let lines = args;
  if (lines.length === 0) {
    let input = '';
    for await (const chunk of process.stdin) input += chunk;
    lines = input.split('\n').filter((l) => l.trim());
  }
  const ids = await enqueue(process.env.DATABASE_URL, process.env.STAGE || 'default',
                            lines.map((l) => JSON.parse(l)));
  for (const id of ids) console.log(id);
}

if (require.main === module) {
  main(process.argv.slice(2)).catch((err) => { console.error(`producer: ${err.message}`); process.exit(1); });
}

module.exports = { enqueue };
