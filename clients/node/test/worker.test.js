'use strict';
// Runs against a database with skiplock installed, named by SKIPLOCK_TEST_URL (a superuser URL:
// the tests configure stages). tests/py/test_clients.py builds one and runs `npm test`.
// Every test uses a stage of its own, so the tests share the database without interfering.

const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { Client } = require('pg');
const { Worker, Fail } = require('../worker');
const { enqueue } = require('../producer');

const url = process.env.SKIPLOCK_TEST_URL;
if (!url) throw new Error('set SKIPLOCK_TEST_URL to a database with skiplock installed');

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
let db;
let stages = 0;

function newStage() {
  stages += 1;
  return `node_${process.pid}_${stages}`;
}

async function waitFor(what, cond, seconds = 20) {
  const deadline = Date.now() + seconds * 1000;
  while (Date.now() < deadline) {
    if (await cond()) return;
    await sleep(50);
  }
  throw new Error(`timed out waiting for ${what}`);
}

async function liveCount(stage) {
  const { rows: [r] } = await db.query('SELECT count(*)::int AS n FROM queue.live_tasks WHERE stage = $1', [stage]);
  return r.n;
}

async function history(stage) {
  const { rows } = await db.query(
    'SELECT id::text AS id, status::text AS status, attempt, error_text FROM queue.history WHERE stage = $1 ORDER BY id',
    [stage]);
  return rows;
}

test.before(async () => {
  db = new Client({ connectionString: url });
  await db.connect();
});

test.after(async () => {
  await db.end();
});

test('worker.js drains a stage, retries, records the fatal task, stops on SIGTERM with 0', async () => {
  const stage = newStage();
  await db.query("SELECT queue.configure_stage($1, backoff_base => interval '0', backoff_jitter => 0)", [stage]);
  const payloads = [];
  for (let n = 0; n < 20; n += 1) payloads.push({ n, fail_attempts: n % 5 === 0 ? 1 : 0 });
  payloads.push({ n: 20, fatal: true });
  const ids = await enqueue(url, stage, payloads);
  assert.equal(ids.length, 21);

  const child = spawn(process.execPath, [path.join(__dirname, '..', 'worker.js')], {
    env: { ...process.env, DATABASE_URL: url, STAGE: stage, BATCH: '4', IDLE_WAIT: '0.5' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (d) => { output += d; });
  child.stderr.on('data', (d) => { output += d; });
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));

  await waitFor('the stage to drain', async () => (await liveCount(stage)) === 0);
  child.kill('SIGTERM');
  const { code, signal } = await exited;
  assert.equal(code, 0, `worker exited with ${code} (${signal}):\n${output}`);

  const rows = await history(stage);
  assert.deepEqual(rows.map((r) => r.id).sort(), ids.map(String).sort(), 'every task ends exactly once');
  for (const r of rows) {
    const n = ids.map(String).indexOf(r.id);
    if (n === 20) {
      assert.equal(r.status, 'fatal');
      assert.equal(r.attempt, 1);
      assert.match(r.error_text, /fatal by request/);
    } else {
      assert.equal(r.status, 'done', `task ${r.id}`);
      assert.equal(r.attempt, n % 5 === 0 ? 2 : 1, `attempts of task ${r.id}`);
    }
  }
});

test('the worker prepares its statements on its connection, and with prepare: false none', async () => {
  for (const prepare of [true, false]) {
    const stage = newStage();
    await enqueue(url, stage, [{ n: 1 }, { n: 2 }]);
    const seen = [];
    const worker = new Worker({
      url, stage, idleWait: 0.2, prepare,
      handler: async () => {  // between the take and the finishes: the take has run on this connection
        const client = await worker.db;
        const { rows } = await client.query(
          "SELECT count(*)::int AS n FROM pg_prepared_statements WHERE statement LIKE '%queue.take_next(%'");
        seen.push(rows[0].n);
      },
    });
    const running = worker.run();
    await waitFor('the tasks to finish', async () => (await liveCount(stage)) === 0);
    worker.stop();
    assert.equal((await running).finished, 2);
    assert.deepEqual(seen, prepare ? [1, 1] : [0, 0], `prepare: ${prepare}`);
  }
});

test('heartbeats keep a long task leased past its lease', async () => {
  const stage = newStage();
  const [id] = await enqueue(url, stage, [{ long: true }]);
  let expiries = [];
  const worker = new Worker({
    url, stage, lease: 1.5, idleWait: 0.2,
    handler: async () => {
      // twice the lease; heartbeats every 0.5 s leave a stall of 1 s before a reap
      for (let i = 0; i < 6; i += 1) {
        await sleep(500);
        // what a reaper would do meanwhile: it must find nothing to reap
        await db.query('SELECT queue.reap_hung()');
        const { rows: [r] } = await db.query('SELECT lease_expires FROM queue.live_tasks WHERE id = $1', [id]);
        expiries.push(r.lease_expires.getTime());
      }
    },
  });
  const running = worker.run();
  await waitFor('the task to finish', async () => (await liveCount(stage)) === 0);
  worker.stop();
  const counters = await running;
  assert.deepEqual(counters, { taken: 1, finished: 1, failed: 0, snoozed: 0, lost: 0 });
  assert.ok(new Set(expiries).size >= 3, `the lease was extended several times: ${expiries}`);
  const rows = await history(stage);
  assert.equal(rows.length, 1);
  assert.equal(rows[0].status, 'done');
  assert.equal(rows[0].attempt, 1, 'never reaped, never retried');
});

test('a lost lease is detected and the result dropped', async () => {
  const stage = newStage();
  const [id] = await enqueue(url, stage, [{ doomed: true }]);
  const worker = new Worker({
    url, stage, lease: 0.6, idleWait: 0.2,
    handler: async () => {
      // someone cancels the task while it runs: the next heartbeat raises SK001
      await db.query('SELECT queue.cancel($1)', [id]);
      await sleep(600);
    },
  });
  const running = worker.run();
  await waitFor('the task to be taken', async () => worker.counters.taken === 1);
  await sleep(800);
  worker.stop();
  const counters = await running;
  assert.equal(counters.lost, 1);
  assert.equal(counters.finished, 0);
  const rows = await history(stage);
  assert.deepEqual(rows.map((r) => r.status), ['cancelled']);
});

test('fail paths: an error retries with the error kept, Fail({fatal}) ends the task', async () => {
  const stage = newStage();
  await db.query("SELECT queue.configure_stage($1, backoff_base => interval '1 hour')", [stage]);
  const [retried, fatal] = await enqueue(url, stage, [{ kind: 'bug' }, { kind: 'fatal' }]);
  const worker = new Worker({
    url, stage, idleWait: 0.2,
    handler: async (task) => {
      if (task.payload.kind === 'bug') throw new TypeError('boom');
      throw new Fail('no such image', { fatal: true });
    },
  });
  const running = worker.run();
  await waitFor('both tasks to fail', async () => worker.counters.failed === 2);
  worker.stop();
  await running;
  const { rows: [live] } = await db.query(
    'SELECT status::text AS status, attempt, error_text, run_at > now() + interval \'30 minutes\' AS later'
    + ' FROM queue.live_tasks WHERE id = $1', [retried]);
  assert.equal(live.status, 'error');
  assert.equal(live.attempt, 1);
  assert.match(live.error_text, /TypeError: boom/);
  assert.ok(live.later, 'retried after the stage backoff');
  const rows = await history(stage);
  assert.deepEqual(rows.map((r) => [r.id, r.status, r.error_text]), [[String(fatal), 'fatal', 'no such image']]);
});

test('an idle worker wakes on NOTIFY, long before its slow poll', async () => {
  const stage = newStage();
  const worker = new Worker({ url, stage, idleWait: 30, handler: async () => {} });
  const running = worker.run();
  await sleep(300);  // idle now, asleep on LISTEN
  const started = Date.now();
  await enqueue(url, stage, [{ wake: true }]);
  await waitFor('the task to be done', async () => worker.counters.finished === 1, 5);
  const latency = Date.now() - started;
  worker.stop();
  await running;
  console.log(`node wake-up: ${latency} ms from enqueue to finished`);
  assert.ok(latency < 3000, `took ${latency} ms`);  // against a 30 s poll
});
