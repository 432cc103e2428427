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
// A lost connection (a terminated backend, a server restart) is logged and the worker reconnects,
// for ever, after 0.1 s, then twice as long each time up to 5 s: the results of the batch in hand
// are reported with their leases (still valid) once it is back, the rest of the batch runs,
// LISTEN is issued again and heartbeats go on. Stopped (SIGTERM) while the server is unreachable,
// it gives up after one more try and exits 1 (run() rejects with an Unreachable error): the leases
// of the tasks it held run out and reap_hung() hands them back.
//
// Through a connection pooler in transaction mode (PgBouncer pool_mode=transaction), set
// SKIPLOCK_POOLER=transaction (option listen: false): the idle worker then polls every IDLE_WAIT
// seconds instead of LISTEN, whose notifications would reach a server connection, not us, and
// its statements are not prepared (option prepare: false), as the next transaction may run on a
// server connection that never saw them. Otherwise each statement is prepared once a connection
// (a named query), so that the server does not parse and plan it on every call (an unprepared
// `enqueue` ran 13-18 % fewer calls a second).
//
// Settings (environment): DATABASE_URL, STAGE (default), BATCH (10, 1 to 10000), LEASE seconds
// (60), IDLE_WAIT seconds (5), SKIPLOCK_POOLER (none, session or transaction). A bad value prints
// a message and exits 2.

const os = require('node:os');
const { Client, DatabaseError } = require('pg');

const BACKOFF_FIRST = 0.1;  // seconds before the first reconnection attempt, doubled each time...
const BACKOFF_MAX = 5;      // ...up to this

class Unreachable extends Error {}  // the server could not be reached while the worker stopped

// Did err come from a lost connection (terminated backend, server restart, network)? An error
// the server sent on a live connection is a DatabaseError with its SQLSTATE.
function connectionLost(err, client) {
  if (client && client.skiplockBroken) return true;
  if (!(err instanceof DatabaseError)) return Boolean(err && typeof err.code === 'string' && /^E[A-Z]+$/.test(err.code))
    || /Connection terminated|not queryable|ECONNRESET|EPIPE/.test(String(err && err.message));
  return err.code.startsWith('08') || ['57P01', '57P02', '57P03'].includes(err.code);
}

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
                name = `${os.hostname()}:${process.pid}`, listen = true, prepare = listen }) {
    if (!Number.isInteger(batch) || batch < 1 || batch > 10000) throw new RangeError(`batch: ${batch}: expected an integer from 1 to 10000`);
    if (!Number.isFinite(lease) || lease <= 0) throw new RangeError(`lease: ${lease}: expected seconds > 0`);
    if (!Number.isFinite(idleWait) || idleWait <= 0) throw new RangeError(`idleWait: ${idleWait}: expected seconds > 0`);
    Object.assign(this, { url, stage, batch, lease, idleWait, handler, name, listens: listen, prepares: prepare });
    this.statements = new Map();  // text -> its name, when prepares
    this.counters = { taken: 0, finished: 0, failed: 0, snoozed: 0, lost: 0 };
    this.held = new Map();    // id -> lease of the tasks not finished or failed yet
    this.stopping = false;
    this.notified = false;
    this.wake = () => {};
    this.db = null;           // a promise of the connected client for queries, null when lost
    this.listener = null;     // the LISTENing client, null while it reconnects
    this.backoffs = new Set();  // to cut the reconnections' waits short on stop()
    this.ended = false;
  }

  stop() {
    this.stopping = true;
    for (const cut of this.backoffs) cut();  // reconnecting: try once more now, then give up
    this.wake();  // asleep: stop now; busy: the loop stops after the batch
  }

  // A connected client, after retries with backoff; `setup` runs on it first (LISTEN).
  async connect(role, setup = async () => {}) {
    let delay = BACKOFF_FIRST;
    for (let failed = false; ; failed = true) {
      const client = new Client({ connectionString: this.url });
      client.on('error', () => { client.skiplockBroken = true; });  // never an unhandled 'error' event
      client.on('end', () => { client.skiplockBroken = true; });
      try {
        await client.connect();
        await setup(client);
        if (failed) console.error(`${role} connection: reconnected`);
        return client;
      } catch (err) {
        client.skiplockBroken = true;
        client.end().catch(() => {});
        if (this.stopping) throw new Unreachable(`${role} connection: ${err.message}`);
        console.error(`${role} connection: ${err.message}: retrying in ${delay} s`);
        await new Promise((resolve) => {
          const cut = () => { clearTimeout(timer); this.backoffs.delete(cut); resolve(); };
          const timer = setTimeout(cut, delay * 1000);
          this.backoffs.add(cut);
        });
        delay = Math.min(delay * 2, BACKOFF_MAX);
      }
    }
  }

  // db.query that survives a lost connection: reconnect, then the same statement again (a lease
  // stays valid meanwhile). Heartbeats and the loop share the client, and its reconnection.
  async query(text, values) {
    for (;;) {
      if (this.ended) throw new Unreachable('the worker has stopped');
      if (this.db === null) {
        const connecting = this.connect('main');
        this.db = connecting;
        connecting.catch(() => { if (this.db === connecting) this.db = null; });
      }
      const current = this.db;
      const client = await current;
      try {
        return await client.query(this.prepares ? { name: this.statementName(text), text, values } : { text, values });
      } catch (err) {
        if (!connectionLost(err, client)) throw err;
        if (this.db === current) {
          console.error(`main connection lost (${err.message}): reconnecting`);
          this.db = null;
          client.end().catch(() => {});
        }
      }
    }
  }

  // node-postgres prepares a named statement the first time a connection runs it.
  statementName(text) {
    if (!this.statements.has(text)) this.statements.set(text, `skiplock_${this.statements.size + 1}`);
    return this.statements.get(text);
  }

  // The LISTENing client, reconnected in the background when lost; then the loop takes at once
  // (a notification sent meanwhile is lost).
  async listen() {
    const channel = `skiplock.${this.stage}`;
    const client = await this.connect('listen', async (c) => {
      c.on('notification', () => { this.notified = true; this.wake(); });
      await c.query(`LISTEN ${c.escapeIdentifier(channel)}`);
    });
    if (this.ended) { client.end().catch(() => {}); return; }
    const lost = (what) => {
      if (this.listener !== client) return;
      this.listener = null;
      client.end().catch(() => {});
      if (this.stopping) return;
      console.error(`listen connection lost (${what}): reconnecting`);
      this.listening = this.listen().then(() => { this.notified = true; this.wake(); }, () => {});
    };
    client.on('error', (err) => lost(err.message));
    client.on('end', () => lost('closed'));
    this.listener = client;
    if (client.skiplockBroken) lost('closed');
  }

  async run() {
    // LISTEN before the first take: a task enqueued in between still wakes us.
    if (this.listens) await this.listen();
    const beat = setInterval(() => { if (!this.beating) this.beat = this.heartbeat(); }, (this.lease * 1000) / 3);
    try {
      while (!this.stopping) {
        this.notified = false;
        if (await this.runBatch()) continue;
        if (this.notified || this.stopping) continue;
        await new Promise((resolve) => {
          const timer = setTimeout(resolve, this.idleWait * 1000);
          this.wake = () => { clearTimeout(timer); resolve(); };
        });
        this.wake = () => {};
      }
    } finally {
      clearInterval(beat);
      this.stop();  // reconnections in the background give up
      await this.beat;
      await this.listening;
      this.ended = true;
      const { listener, db } = this;
      this.listener = null;
      this.db = null;
      if (listener) await listener.end().catch(() => {});
      if (db) await db.then((c) => c.end(), () => {}).catch(() => {});
    }
    return this.counters;
  }

  async heartbeat() {
    if (this.beating) return;  // the previous round still waits for a reconnection
    this.beating = true;
    try {
      for (const [id, lease] of this.held) {
        try {
          await this.query("SELECT queue.heartbeat(id => $1, lease => $2, lease_for => $3 * interval '1 second',"
                           + ' stage => $4)', [id, lease, this.lease, this.stage]);
        } catch (err) {
          if (err.code !== 'SK001') { console.error(`heartbeat on ${id}: ${err.message}`); continue; }
          this.held.delete(id);   // someone else owns the task now: drop our result
          this.counters.lost += 1;
        }
      }
    } finally {
      this.beating = false;
    }
  }

  // queue.fail; an error text refused all the same is replaced by a plain one, once, so that the
  // worker goes on and the task is not left running until its lease runs out.
  async fail(task, error, fatal) {
    const sql = 'SELECT queue.fail(id => $1, lease => $2, error => $3, fatal => $4, stage => $5) AS ok';
    try {
      // A text value holds no NUL (the server answers 22021): a handler's error may quote binary output.
      return (await this.query(sql, [task.id, task.lease, String(error).replace(/\0/g, '\\0'), fatal, this.stage])).rows[0];
    } catch (err) {
      if (!(err instanceof DatabaseError)) throw err;  // a lost connection was retried by query()
      console.error(`fail on ${task.id}: the error text was refused (${err.code}: ${err.message}); recording a plain one`);
      return (await this.query(sql, [task.id, task.lease, `handler failed; its error text was refused (SQLSTATE ${err.code})`,
                                     fatal, this.stage])).rows[0];
    }
  }

  async runBatch() {
    const { rows } = await this.query(
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
      // A lost connection: query() reconnects and calls again with the same lease.
      let r;
      if (snooze !== null) {
        [r] = (await this.query("SELECT queue.release(id => $1, lease => $2, retry_in => $3 * interval '1 second',"
                                + ' stage => $4) AS ok', [task.id, task.lease, snooze, this.stage])).rows;
        console.error(`snoozed ${task.id} for ${snooze.toFixed(3)} s`);
      } else if (error === null) {
        [r] = (await this.query('SELECT queue.finish(id => $1, lease => $2, stage => $3) AS ok',
                                [task.id, task.lease, this.stage])).rows;
      } else {
        r = await this.fail(task, error, fatal);
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

// A numeric setting from the environment; a bad one ends the worker with a message (exit 2).
function setting(env, name, fallback, { integer = false, min, max = Infinity }) {
  const text = env[name] === undefined ? String(fallback) : env[name];
  const value = /^\s*$/.test(text) ? NaN : Number(text);
  const ok = Number.isFinite(value) && value >= min && value <= max && (!integer || Number.isInteger(value));
  if (!ok) {
    const bound = max < Infinity ? `from ${min} to ${max}` : `greater than 0`;
    console.error(`worker.js: ${name}=${JSON.stringify(text)}: expected ${integer ? 'an integer' : 'a number of seconds'} ${bound}`);
    process.exit(2);
  }
  return value;
}

async function main() {
  const env = process.env;
  const pooler = (env.SKIPLOCK_POOLER || 'none').trim().toLowerCase() || 'none';
  if (!['none', 'session', 'transaction'].includes(pooler)) {
    console.error(`worker.js: SKIPLOCK_POOLER=${JSON.stringify(env.SKIPLOCK_POOLER)}: expected none, session or transaction`);
    process.exit(2);
  }
  const worker = new Worker({
    listen: pooler !== 'transaction',
    url: env.DATABASE_URL,
    stage: env.STAGE || 'default',
    batch: setting(env, 'BATCH', 10, { integer: true, min: 1, max: 10000 }),
    lease: setting(env, 'LEASE', 60, { min: Number.MIN_VALUE }),
    idleWait: setting(env, 'IDLE_WAIT', 5, { min: Number.MIN_VALUE }),
  });
  process.on('SIGTERM', () => worker.stop());
  process.on('SIGINT', () => worker.stop());
  await worker.run();
}

if (require.main === module) {
  main().catch((err) => {
    if (err instanceof Unreachable) {
      console.error(`stopping while the server is unreachable (${err.message}): the tasks in hand stay`
                    + ' running until their leases run out, then reap_hung() hands them back');
    } else {
      console.error(err);
    }
    process.exit(1);
  });
}

module.exports = { Worker, Fail, Snooze, Unreachable, handle };
