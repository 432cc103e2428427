'use strict';
// A skiplock worker in plain node-postgres: copy it, replace handle(), run it.
//
//   DATABASE_URL=postgresql://... STAGE=default node worker.js
//
// The loop: take a batch (queue.take_next), run handle() per task, then queue.finish or
// queue.fail with the task's lease. A timer heartbeats the tasks in hand every LEASE/3 seconds
// while a handler runs long. When the stage is empty the worker sleeps until a NOTIFY on
// "skiplock.<stage>" (enqueue sends it; a dedicated client LISTENs) or IDLE_WAIT seconds pass:
// the slow poll means a lost notification never strands a task.
// SIGTERM or Ctrl-C: finish the batch in hand, then exit 0.
//
// Settings (environment): DATABASE_URL, STAGE (default), BATCH (10), LEASE seconds (60),
// IDLE_WAIT seconds (5).

const os = require('node:os');
const { Client } = require('pg');

class Fail extends Error {
  // Throw from a handler to fail the attempt; { fatal: true } means never retry.
  constructor(message, { fatal = false } = {}) {
    super(message);
    this.fatal = fatal;
  }
}

class Snooze extends Error {
  // Throw from a handler when the task cannot run yet (a rate limit, a resource not ready): it
  // goes back, due `seconds` from now, and the attempt is not counted.
  constructor(seconds) {
    super(`snoozed for ${seconds.toFixed(3)} s`);
    this.seconds = seconds;
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Your work goes here. Resolve to finish the task; throw Fail (or any error) to fail it, Snooze
// to hand it back for later.
// This example understands a few demo fields: {"sleep": s} works for s seconds,
// {"fail_attempts": n} fails attempts 1..n, {"fatal": true} fails for good,
// {"snooze_until": t} snoozes until the Unix time t.
async function handle(task) {
  const p = task.payload;
  const left = Number(p.snooze_until || 0) - Date.now() / 1000;
  if (left > 0) throw new Snooze(left);
  await sleep(1000 * Number(p.sleep || 0));
  if (p.fatal) throw new Fail('fatal by request', { fatal: true });
  if (task.attempt <= Number(p.fail_attempts || 0)) throw new Fail(`failing attempt ${task.attempt} by request`);
  console.log(`done ${task.id}: ${JSON.stringify(p)}`);
}

class Worker {
  constructor({ url, stage = 'default', batch = 10, lease = 60, idleWait = 5, handler = handle,
                name = `${os.hostname()}:${process.pid}` }) {
    Object.assign(this, { url, stage, batch, lease, idleWait, handler, name });
    this.counters = { taken: 0, finished: 0, failed: 0, snoozed: 0, lost: 0 };
    this.held = new Map();    // id -> lease of the tasks not finished or failed yet
    this.stopping = false;
    this.notified = false;
    this.wake = () => {};
  }

  stop() {
    this.stopping = true;
    this.wake();  // asleep: stop now; busy: the loop stops after the batch
  }

  async run() {
    const db = new Client({ connectionString: this.url });
    const listener = new Client({ connectionString: this.url });
    await db.connect();
    await listener.connect();
    listener.on('notification', () => { this.notified = true; this.wake(); });
    // LISTEN before the first take: a task enqueued in between still wakes us.
    await listener.query(`LISTEN ${listener.escapeIdentifier(`skiplock.${this.stage}`)}`);
    const beat = setInterval(() => this.heartbeat(db), (this.lease * 1000) / 3);
    try {
      while (!this.stopping) {
        this.notified = false;
        if (await this.runBatch(db)) continue;
        if (this.notified || this.stopping) continue;
        await new Promise((resolve) => {
          const timer = setTimeout(resolve, this.idleWait * 1000);
          this.wake = () => { clearTimeout(timer); resolve(); };
        });
        this.wake = () => {};
      }
    } finally {
      clearInterval(beat);
      await listener.end();
      await db.end();
    }
    return this.counters;
  }

  async heartbeat(db) {
    for (const [id, lease] of this.held) {
      try {
        await db.query("SELECT queue.heartbeat(id => $1, lease => $2, lease_for => $3 * interval '1 second')",
                       [id, lease, this.lease]);
      } catch (err) {
        if (err.code !== 'SK001') { console.error(`heartbeat on ${id}: ${err.message}`); continue; }
        this.held.delete(id);   // someone else owns the task now: drop our result
        this.counters.lost += 1;
      }
    }
  }

  async runBatch(db) {
    const { rows } = await db.query(
      "SELECT id, payload, attempt, lease FROM queue.take_next(stage => $1, batch => $2,"
      + " lease_for => $3 * interval '1 second', worker => $4)",
      [this.stage, this.batch, this.lease, this.name]);
    for (const row of rows) this.held.set(row.id, row.lease);
    for (const task of rows) {
      this.counters.taken += 1;
      let error = null;
      let fatal = false;
      let snooze = null;
      try {
        await this.handler(task);
      } catch (err) {
        if (err instanceof Snooze) {
          snooze = err.seconds;
        } else {
          error = err instanceof Fail ? err.message : String(err && err.stack || err);
          fatal = Boolean(err && err.fatal);
        }
      }
      if (!this.held.delete(task.id)) {
        console.error(`lease lost on ${task.id}: dropping the result`);
        continue;
      }
      let r;
      if (snooze !== null) {
        [r] = (await db.query("SELECT queue.release(id => $1, lease => $2, retry_in => $3 * interval '1 second') AS ok",
                              [task.id, task.lease, snooze])).rows;
        console.error(`snoozed ${task.id} for ${snooze.toFixed(3)} s`);
      } else if (error === null) {
        [r] = (await db.query('SELECT queue.finish(id => $1, lease => $2) AS ok', [task.id, task.lease])).rows;
      } else {
        [r] = (await db.query('SELECT queue.fail(id => $1, lease => $2, error => $3, fatal => $4) AS ok',
                              [task.id, task.lease, error, fatal])).rows;
      }
      if (!r.ok) {           // false: the lease was no longer ours (reaped and retaken)
        this.counters.lost += 1;
        console.error(`lease lost on ${task.id}`);
      } else if (snooze !== null) {
        this.counters.snoozed += 1;
      } else if (error === null) {
        this.counters.finished += 1;
      } else {
        this.counters.failed += 1;
      }
    }
    return rows.length;
  }
}

async function main() {
  const env = process.env;
  const worker = new Worker({
    url: env.DATABASE_URL,
    stage: env.STAGE || 'default',
    batch: Number(env.BATCH || 10),
    lease: Number(env.LEASE || 60),
    idleWait: Number(env.IDLE_WAIT || 5),
  });
  process.on('SIGTERM', () => worker.stop());
  process.on('SIGINT', () => worker.stop());
  await worker.run();
}

if (require.main === module) {
  main().catch((err) => { console.error(err); process.exit(1); });
}

module.exports = { Worker, Fail, Snooze, handle };
