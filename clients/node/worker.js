'use strict';
// The skiplock worker for Node.js (the npm package "skiplock"; README.md): a Worker class over
// node-postgres, and, run as a script, a worker whose handle() you replace.
//
//   DATABASE_URL=postgresql://... STAGE=default node worker.js
//
// Several stages: STAGE=a,b (option stages: ['a', 'b'], or a prefix 'tenant.*') are taken round
// robin by queue.take_next(stages[]); option handlers maps a stage (or prefix) to its handler. A
// handler's return value, an object or an array, is the task's result (queue.finish(result => …));
// new Outcome({ nextStage, result }) moves it on to another stage; task.progress(value) stores its
// progress (queue.heartbeat(progress => …)). stop() lets the batch in hand finish for at most
// shutdownTimeout seconds (SHUTDOWN_TIMEOUT, 20); the tasks of the batch not started by then are
// released (back at once, the attempt not counted). Option concurrency (CONCURRENCY, 1) runs that
// many handlers of a batch at once (each task's lease heartbeated); batch should be at least as
// large. Option transactional: true runs each batch in one transaction instead (take_locked; each
// handler in a savepoint, given task.client, that transaction's client, for writes that must
// commit with the task's finish_locked, or roll back before its fail_locked; one at a time, no
// lease: for short tasks).
//
// The loop: take a batch (queue.take_next), run handle() per task, then queue.finish or
// queue.fail with the task's lease. A timer heartbeats the tasks in hand every LEASE/3 seconds
// while a handler runs long. When the stage is empty the worker sleeps until a NOTIFY on
// "skiplock.<stage>" (enqueue sends it; a dedicated client LISTENs) or IDLE_WAIT seconds pass:
// the slow poll means a lost notification never strands a task.
// SIGTERM or Ctrl-C: finish the batch in hand, then exit 0.
//
// A lost connection (a terminated backend, a server restart) is logged and the worker reconnects,
// for ever, after 0.1 s, then twice as long each time up to 5 s (an attempt that gets no answer
// ends after the URL's connect_timeout, else PGCONNECT_TIMEOUT, else 10 s): the results of the batch in hand
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
// Errors that pass by waiting (a statement or lock timeout, a deadlock, a serialization failure,
// a full disk or too many connections: SQLSTATE classes 53 and 08, 55P03, 57014, 40001, 40P01) are
// logged and the statement is tried again with the same backoff; a finish or fail for as long as
// the task's lease holds (heartbeats go on meanwhile). A statement this worker prepared that went
// missing (26000: a pooler in transaction mode nobody announced) makes it say so once and go on
// unprepared and polling. What waiting does not cure (a refused login, a revoked grant, skiplock
// not installed) ends the worker in one line, exit 1.
//
// Unless MAINTAIN_EVERY is 0, the worker runs queue.maintain() every MAINTAIN_EVERY seconds, one
// worker at a time across all of them (an advisory lock elects one), so that the tasks of a
// worker that died come back with no `skiplock maintain` running. A handler that has not settled
// within the stage's task_timeout (configure_stage; read when the worker starts) or TASK_TIMEOUT
// seconds, which overrides it, has its attempt failed (retried by the stage's policy; JavaScript
// cannot stop the handler itself, whose result is then ignored).
//
// Settings (environment): DATABASE_URL, STAGE (default), BATCH (10, 1 to 10000), LEASE seconds
// (60), IDLE_WAIT seconds (5), MAINTAIN_EVERY seconds (10, or LEASE/3 if shorter; 0: off),
// TASK_TIMEOUT seconds (none), CONCURRENCY (1), SKIPLOCK_POOLER (none, session or transaction).
// A bad value prints a message and exits 2.

const crypto = require('node:crypto');
const os = require('node:os');
const { Client, DatabaseError } = require('pg');

// Optional OpenTelemetry, through @opentelemetry/api when the application has it installed: a span
// "skiplock.task <stage>" per task (from the handler's start to its finish, fail or release) with
// skiplock.stage, skiplock.task_id and skiplock.attempt, child of the context the payload carries
// under the reserved key "_trace" (written by withTrace, W3C traceparent as the global propagator
// writes it). Nothing without the package.
let otel = null;
try {
  otel = require('@opentelemetry/api');  // eslint-disable-line global-require
} catch (err) {
  otel = null;
}

// payload with the trace context of ctx (the active one by default) under "_trace"; unchanged
// without OpenTelemetry, without a span, or for an array.
function withTrace(payload, ctx = otel ? otel.context.active() : null) {
  if (!otel || !payload || typeof payload !== 'object' || Array.isArray(payload)) return payload;
  const carrier = {};
  otel.propagation.inject(ctx, carrier);
  return Object.keys(carrier).length ? { ...payload, _trace: carrier } : payload;
}

// A started span for a task (null without OpenTelemetry) and the context to run its handler in.
function taskSpan(task) {
  if (!otel) return { span: null, ctx: null };
  const carrier = task.payload && typeof task.payload === 'object' && !Array.isArray(task.payload) ? task.payload._trace : null;
  const parent = carrier && typeof carrier === 'object' ? otel.propagation.extract(otel.ROOT_CONTEXT, carrier) : otel.context.active();
  const span = otel.trace.getTracer('skiplock').startSpan(`skiplock.task ${task.stage}`, {
    kind: otel.SpanKind.CONSUMER,
    attributes: { 'skiplock.stage': task.stage, 'skiplock.task_id': Number(task.id), 'skiplock.attempt': task.attempt },
  }, parent);
  return { span, ctx: otel.trace.setSpan(parent, span) };
}

const BACKOFF_FIRST = 0.1;  // seconds before the first reconnection attempt, doubled each time...
const BACKOFF_MAX = 5;      // ...up to this
const CONNECT_TIMEOUT = 10; // seconds a connection attempt may take, unless the URL or PGCONNECT_TIMEOUT says

// node-postgres waits for a connection without a limit of its own (and does not read the URL's
// connect_timeout): an attempt that hangs (a server that accepts and never answers) would hold
// the worker. The URL's connect_timeout, else PGCONNECT_TIMEOUT, else CONNECT_TIMEOUT; 0: none.
function connectTimeoutMillis(url) {
  const query = String(url).indexOf('?');  // a URI's parameters (WHATWG URL refuses postgresql://u@/db)
  const given = query >= 0 ? new URLSearchParams(String(url).slice(query + 1)).get('connect_timeout') : null;
  const seconds = Number(given ?? process.env.PGCONNECT_TIMEOUT ?? CONNECT_TIMEOUT);
  return Number.isFinite(seconds) && seconds > 0 ? seconds * 1000 : 0;
}

class Unreachable extends Error {}  // the server could not be reached while the worker stopped
class Refused extends Error {}      // what waiting does not cure: a refused login

// Does err pass by waiting (see the top of this file)? 26000 and 42P05: a statement we prepared is
// missing or already there on the server connection (a transaction pooler).
function transient(err) {
  if (!(err instanceof DatabaseError)) return connectionLost(err, null);
  return /^(53|08)/.test(err.code)
    || ['55P03', '57014', '40001', '40P01', '57P01', '57P02', '57P03', '26000', '42P05'].includes(err.code);
}


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

// What a handler may return to move the task to another stage, with a result (its payload there).
class Outcome {
  constructor({ nextStage = null, result = null } = {}) {
    this.nextStage = nextStage;
    this.result = result;
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
  constructor({ url, stage = 'default', stages = null, handlers = null, batch = 10, lease = 60, idleWait = 5,
                handler = handle, name = `${os.hostname()}:${process.pid}`, listen = true, prepare = listen,
                maintainEvery = Math.min(10, lease / 3), taskTimeout = null, shutdownTimeout = 20, concurrency = 1,
                transactional = false }) {
    stages = stages || (handlers ? Object.keys(handlers) : [stage]);
    if (!Array.isArray(stages) || stages.length === 0 || !stages.every((s) => typeof s === 'string' && s)) {
      throw new RangeError(`stages: ${JSON.stringify(stages)}: expected a non-empty array of stage names`);
    }
    if (!Number.isInteger(batch) || batch < 1 || batch > 10000) throw new RangeError(`batch: ${batch}: expected an integer from 1 to 10000`);
    if (!Number.isFinite(lease) || lease <= 0) throw new RangeError(`lease: ${lease}: expected seconds > 0`);
    if (!Number.isFinite(idleWait) || idleWait <= 0) throw new RangeError(`idleWait: ${idleWait}: expected seconds > 0`);
    if (!Number.isInteger(concurrency) || concurrency < 1) throw new RangeError(`concurrency: ${concurrency}: expected an integer >= 1`);
    Object.assign(this, { url, stages, stage: stages[0], handlers: handlers || {}, batch, lease, idleWait, handler, name,
                          listens: listen, prepares: prepare, maintainEvery, taskTimeout, shutdownTimeout, concurrency,
                          transactional: Boolean(transactional) });
    this.multi = stages.length > 1 || stages[0].endsWith('*');
    this.connectTimeout = connectTimeoutMillis(url);
    this.timeouts = new Map(); // stage -> its task_timeout in seconds (or null), read once
    this.expires = new Map(); // id -> when its lease runs out (Date.now()), renewed by each heartbeat
    this.statements = new Map();  // text -> its name, when prepares
    this.counters = { taken: 0, finished: 0, failed: 0, snoozed: 0, lost: 0 };
    this.held = new Map();    // id -> lease of the tasks not finished or failed yet
    this.stageOf = new Map(); // id -> the stage of a task in hand
    this.shutdownExpired = false;
    this.stopping = false;
    this.notified = false;
    this.wake = () => {};
    this.db = null;           // a promise of the connected client for queries, null when lost
    this.listener = null;     // the LISTENing client, null while it reconnects
    this.backoffs = new Set();  // to cut the reconnections' waits short on stop()
    this.ended = false;
  }

  stop() {
    if (!this.stopping && this.shutdownTimeout !== null) {
      setTimeout(() => { this.shutdownExpired = true; }, this.shutdownTimeout * 1000).unref();
    }
    this.stopping = true;
    for (const cut of this.backoffs) cut();  // reconnecting: try once more now, then give up
    this.wake();  // asleep: stop now; busy: the loop stops after the batch
  }

  // A connected client, after retries with backoff; `setup` runs on it first (LISTEN).
  async connect(role, setup = async () => {}) {
    let delay = BACKOFF_FIRST;
    for (let failed = false; ; failed = true) {
      const client = new Client({ connectionString: this.url, connectionTimeoutMillis: this.connectTimeout });
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
        if (err instanceof DatabaseError && (/^28/.test(err.code) || err.code === '3D000')) {
          throw new Refused(`${role} connection: ${err.message} (SQLSTATE ${err.code})`);
        }
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

  // The promise of the main client, connecting (with retries) when there is none.
  mainClient() {
    if (this.ended) throw new Unreachable('the worker has stopped');
    if (this.db === null) {
      const connecting = this.connect('main');
      this.db = connecting;
      connecting.catch(() => { if (this.db === connecting) this.db = null; });
    }
    return this.db;
  }

  // db.query that survives a lost connection: reconnect, then the same statement again (a lease
  // stays valid meanwhile). Heartbeats and the loop share the client, and its reconnection.
  // An error that passes by waiting (transient()) is tried again after a backoff while holds()
  // (a lease that still holds), else thrown.
  async query(text, values, holds = () => !this.stopping) {
    let delay = BACKOFF_FIRST;
    for (;;) {
      const current = this.mainClient();
      const client = await current;
      try {
        return await client.query(this.prepares ? { name: this.statementName(text), text, values } : { text, values });
      } catch (err) {
        if (!connectionLost(err, client)) {
          if (!transient(err) || !holds()) throw err;
          if (['26000', '42P05'].includes(err.code)) {
            if (this.prepares) {
              this.prepares = false;
              console.error(`${err.code}: ${err.message}: a pooler in transaction mode? going on with unprepared`
                            + ' statements (set SKIPLOCK_POOLER=transaction to start so)');
            }
            if (this.db === current) { this.db = null; client.end().catch(() => {}); }
          }
          console.error(`main: ${err.code}: ${err.message}; retrying in ${delay} s`);
          await sleep(delay * 1000);
          delay = Math.min(delay * 2, BACKOFF_MAX);
          continue;
        }
        if (this.db === current) {
          console.error(`main connection lost (${err.message}): reconnecting`);
          this.db = null;
          client.end().catch(() => {});
        }
      }
    }
  }

  // Does the task's lease still hold, as far as the last heartbeat knows?
  holds(id) {
    return this.held.has(id) && Date.now() < (this.expires.get(id) || 0);
  }

  // queue.maintain() in a transaction of its own, if no other worker runs it now (an advisory
  // lock elects one); on a connection of its own, opened for the round.
  async maintain() {
    const client = new Client({ connectionString: this.url, connectionTimeoutMillis: this.connectTimeout });
    client.on('error', () => {});
    try {
      await client.connect();
      await client.query('BEGIN');
      await client.query('SELECT * FROM queue.maintain_now()');  // no row when another worker runs it now
      await client.query('COMMIT');
    } catch (err) {
      if (err.code === '42501') {
        console.error(`maintain: ${err.message}: this login does not maintain the queue (queue.maintain_now() is granted to skiplock_worker: run \`skiplock maintain\`, or set MAINTAIN_EVERY=0)`);
        this.maintainEvery = 0;
      } else {
        console.error(`maintain: ${err.message}; trying again in ${this.maintainEvery} s`);
      }
    } finally {
      await client.end().catch(() => {});
    }
  }

  // node-postgres prepares a named statement the first time a connection runs it. The name is a
  // hash of the text: through a pooler in transaction mode that nobody announced, a server
  // connection may hold another client's statement of a name, and then it is this very statement.
  statementName(text) {
    if (!this.statements.has(text)) {
      this.statements.set(text, `skiplock_${crypto.createHash('sha256').update(text).digest('hex').slice(0, 32)}`);
    }
    return this.statements.get(text);
  }

  // The LISTENing client, reconnected in the background when lost; then the loop takes at once
  // (a notification sent meanwhile is lost).
  async listen() {
    const client = await this.connect('listen', async (c) => {
      c.on('notification', () => { this.notified = true; this.wake(); });
      // A prefix's stages are found at the poll: only the stages named are listened to.
      for (const stage of this.stages.filter((s) => !s.endsWith('*'))) {
        await c.query(`LISTEN ${c.escapeIdentifier(`skiplock.${stage}`)}`);
      }
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
    let maintaining = null;
    const maintainer = this.maintainEvery > 0 ? setInterval(() => {
      if (this.maintainEvery <= 0) { clearInterval(maintainer); return; }
      if (!maintaining) maintaining = this.maintain().finally(() => { maintaining = null; });
    }, this.maintainEvery * 1000) : null;
    try {
      while (!this.stopping) {
        this.notified = false;
        if (await (this.transactional ? this.runLockedBatch() : this.runBatch())) continue;
        if (this.notified || this.stopping) continue;
        await new Promise((resolve) => {
          const timer = setTimeout(resolve, this.idleWait * 1000);
          this.wake = () => { clearTimeout(timer); resolve(); };
        });
        this.wake = () => {};
      }
    } finally {
      clearInterval(beat);
      if (maintainer) clearInterval(maintainer);
      this.stop();  // reconnections in the background give up
      await this.beat;
      await maintaining;
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
      for (const id of [...this.held.keys()]) await this.beatOne(id);
    } finally {
      this.beating = false;
    }
  }

  // queue.heartbeat on one task in hand, with its progress when given; false when the lease is lost.
  async beatOne(id, progress = null) {
    if (!this.held.has(id)) return false;
    try {
      const at = Date.now();
      await this.query("SELECT queue.heartbeat(id => $1, lease => $2, lease_for => $3 * interval '1 second',"
                       + ' stage => $4, progress => $5::jsonb)',
                       [id, this.held.get(id), this.lease, this.stageOf.get(id), progress === null ? null : JSON.stringify(progress)],
                       () => !this.stopping && this.held.has(id));
      if (this.held.has(id)) this.expires.set(id, at + this.lease * 1000);
      return true;
    } catch (err) {
      if (err.code !== 'SK001') { console.error(`heartbeat on ${id}: ${err.message}`); return true; }
      if (!this.held.has(id)) return false;  // ended by us meanwhile (the finish ran first on the shared client)
      this.held.delete(id);   // someone else owns the task now: drop our result
      this.counters.lost += 1;
      return false;
    }
  }

  // The handler of a stage: handlers[stage], else the longest prefix 'x*' that matches, else handler.
  handlerFor(stage) {
    if (this.handlers[stage]) return this.handlers[stage];
    const prefix = Object.keys(this.handlers).filter((s) => s.endsWith('*') && stage.startsWith(s.slice(0, -1)))
      .sort((a, b) => b.length - a.length)[0];
    return prefix ? this.handlers[prefix] : this.handler;
  }

  // The stage's task_timeout (configure_stage(task_timeout => …)) in seconds, read once a stage.
  async stageTimeout(stage) {
    if (this.taskTimeout !== null) return this.taskTimeout;
    if (!this.timeouts.has(stage)) {
      try {
        const { rows } = await this.query('SELECT extract(epoch FROM queue.task_timeout($1))::float8 AS s', [stage]);
        this.timeouts.set(stage, rows[0].s);
      } catch (err) {
        if (err.code !== '42883') throw err;  // a database older than the setting
        this.timeouts.set(stage, null);
      }
    }
    return this.timeouts.get(stage);
  }

  // queue.fail; an error text refused all the same is replaced by a plain one, once, so that the
  // worker goes on and the task is not left running until its lease runs out.
  async fail(task, error, fatal, holds) {
    const sql = 'SELECT queue.fail(id => $1, lease => $2, error => $3, fatal => $4, stage => $5) AS ok';
    const stage = task.stage;
    try {
      // A text value holds no NUL (the server answers 22021): a handler's error may quote binary output.
      return (await this.query(sql, [task.id, task.lease, String(error).replace(/\0/g, '\\0'), fatal, stage], holds)).rows[0];
    } catch (err) {
      if (!(err instanceof DatabaseError) || transient(err)) throw err;  // retried by query() while the lease held
      console.error(`fail on ${task.id}: the error text was refused (${err.code}: ${err.message}); recording a plain one`);
      return (await this.query(sql, [task.id, task.lease, `handler failed; its error text was refused (SQLSTATE ${err.code})`,
                                     fatal, stage], holds)).rows[0];
    }
  }

  async runBatch() {
    const { rows } = this.multi
      ? await this.query(  // several stages, or a prefix: round robin, each row names its stage
        "SELECT stage, id, payload, attempt, lease FROM queue.take_next(stages => $1::text[], batch => $2,"
        + " lease_for => $3 * interval '1 second', worker => $4)",
        [this.stages, this.batch, this.lease, this.name])
      : await this.query(
        "SELECT $1::text AS stage, id, payload, attempt, lease FROM queue.take_next(stage => $1, batch => $2,"
        + " lease_for => $3 * interval '1 second', worker => $4)",
        [this.stage, this.batch, this.lease, this.name]);
    const taken = Date.now();
    for (const row of rows) {
      this.held.set(row.id, row.lease);
      this.stageOf.set(row.id, row.stage);
      this.expires.set(row.id, taken + this.lease * 1000);
      row.progress = (value) => this.beatOne(row.id, value);
    }
    // `concurrency` lanes, each running the batch's next task until none is left; the heartbeat
    // timer extends the leases of all of them meanwhile.
    let next = 0;
    const lane = async () => {
      while (next < rows.length) await this.runTask(rows[next++]);
    };
    const lanes = [];
    for (let i = 0; i < Math.min(this.concurrency, rows.length); i += 1) lanes.push(lane());
    const settled = await Promise.allSettled(lanes);
    const failed = settled.find((s) => s.status === 'rejected');
    if (failed) throw failed.reason;
    return rows.length;
  }

  // One task of a batch: its handler (within the task's time limit), then queue.finish, fail or
  // release with its lease.
  async runTask(task) {
    this.counters.taken += 1;
    if (this.shutdownExpired) {  // stopping past shutdownTimeout: back at once, not run
      try {
        await this.query('SELECT queue.release(id => $1, lease => $2, stage => $3)', [task.id, task.lease, task.stage],
                         () => false);
        console.error(`released ${task.id}: the worker is stopping past its shutdown timeout`);
      } catch (err) {
        console.error(`task ${task.id} not released (${err.message}): its lease runs out`);
      }
      this.held.delete(task.id);
      return;
    }
    const taskTimeout = await this.stageTimeout(task.stage);
    const handler = this.handlerFor(task.stage);
    let returned;
    let error = null;
    let fatal = false;
    let snooze = null;
    let timer = null;
    const { span, ctx } = taskSpan(task);
    try {
      const run = Promise.resolve().then(() => (ctx ? otel.context.with(ctx, () => handler(task)) : handler(task)));
      if (taskTimeout) {
        const limit = new Promise((_, reject) => {
          timer = setTimeout(() => reject(new Fail(`timed out after ${taskTimeout} s (TASK_TIMEOUT)`)),
                             taskTimeout * 1000);
        });
        run.catch(() => {});
        returned = await Promise.race([run, limit]);
      } else {
        returned = await run;
      }
    } catch (err) {
      if (err instanceof Snooze) {
        snooze = err.seconds;
      } else {
        error = err instanceof Fail ? err.message : String(err && err.stack || err);
        fatal = Boolean(err && err.fatal);
        console.error(JSON.stringify({ msg: 'task failed', task_id: task.id, stage: task.stage, attempt: task.attempt,
                                       fatal, error: String(err && err.message || err) }));
        if (span) {
          if (err instanceof Error) span.recordException(err);
          span.setStatus({ code: otel.SpanStatusCode.ERROR, message: String(err && err.message || err) });
        }
      }
    }
    clearTimeout(timer);
    if (!this.held.has(task.id)) {
      console.error(`lease lost on ${task.id}: dropping the result`);
      if (span) span.end();
      return;
    }
    // A lost connection: query() reconnects and calls again with the same lease; an error that
    // passes by waiting is tried again while the lease holds (heartbeats renew it).
    const holds = () => this.holds(task.id);
    const outcome = returned instanceof Outcome ? returned
      : new Outcome({ result: returned !== null && typeof returned === 'object' ? returned : null });
    let r;
    try {
      if (snooze !== null) {
        [r] = (await this.query("SELECT queue.release(id => $1, lease => $2, retry_in => $3 * interval '1 second',"
                                + ' stage => $4) AS ok', [task.id, task.lease, snooze, task.stage], holds)).rows;
        console.error(`snoozed ${task.id} for ${snooze.toFixed(3)} s`);
      } else if (error === null) {
        [r] = (await this.query('SELECT queue.finish(id => $1, lease => $2, stage => $3, next_stage => $4,'
                                + ' result => $5::jsonb) AS ok',
                                [task.id, task.lease, task.stage, outcome.nextStage,
                                 outcome.result === null ? null : JSON.stringify(outcome.result)], holds)).rows;
      } else {
        r = await this.fail(task, error, fatal, holds);
      }
    } catch (err) {
      if (!transient(err)) throw err;
      console.error(`task ${task.id} not recorded while its lease held (${err.code}: ${err.message}): reap_hung() hands it back`);
      return;
    } finally {
      this.held.delete(task.id);
      this.stageOf.delete(task.id);
      this.expires.delete(task.id);
      if (span) span.end();
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
  // Transactional mode: one transaction takes a batch (queue.take_locked), runs each handler in a
  // savepoint with task.client (that transaction's client: the handler's writes commit with the
  // task's end) and ends it there with queue.finish_locked, or, the savepoint rolled back, with
  // queue.fail_locked (Snooze: a failed attempt with retry_in). The commit ends them all. A lost
  // connection or an error that passes by waiting rolls the whole batch back (its tasks were never
  // taken) and the loop takes again. No lease, no heartbeat: for short tasks.
  async runLockedBatch() {
    const current = this.mainClient();
    const client = await current;
    const q = (text, values) => client.query({ text, values });
    let rows;
    const ended = { finished: 0, failed: 0 };  // counted once the commit holds
    try {
      await q('BEGIN');
      ({ rows } = this.multi
        ? await q('SELECT stage, id, payload, attempt FROM queue.take_locked(stages => $1::text[], batch => $2)',
                  [this.stages, this.batch])
        : await q('SELECT $1::text AS stage, id, payload, attempt FROM queue.take_locked(stage => $1, batch => $2)',
                  [this.stage, this.batch]));
      for (const task of rows) {
        task.client = client;
        task.progress = async () => true;  // no lease to extend, nothing stored
        const { span, ctx } = taskSpan(task);
        await q('SAVEPOINT skiplock_task');
        try {
          const returned = await (ctx ? otel.context.with(ctx, () => this.handlerFor(task.stage)(task))
            : this.handlerFor(task.stage)(task));
          if (returned instanceof Outcome && returned.nextStage !== null) {
            throw new Fail('nextStage is not available in transactional mode', { fatal: true });
          }
          const result = returned instanceof Outcome ? returned.result
            : (returned !== null && typeof returned === 'object' ? returned : null);
          await q('SELECT queue.finish_locked(id => $1, worker => $2, stage => $3, result => $4::jsonb)',
                  [task.id, this.name, task.stage, result === null ? null : JSON.stringify(result)]);
          await q('RELEASE SAVEPOINT skiplock_task');
          ended.finished += 1;
        } catch (err) {
          if (connectionLost(err, client)) throw err;
          await q('ROLLBACK TO SAVEPOINT skiplock_task');  // the handler's writes are undone
          const snooze = err instanceof Snooze ? err.seconds : null;
          const fatal = snooze === null && Boolean(err && err.fatal);
          const error = err instanceof Fail || err instanceof Snooze ? err.message : String(err && err.stack || err);
          console.error(JSON.stringify({ msg: 'task failed', task_id: task.id, stage: task.stage, attempt: task.attempt,
                                         fatal, error: String(err && err.message || err) }));
          if (span) {
            if (err instanceof Error) span.recordException(err);
            span.setStatus({ code: otel.SpanStatusCode.ERROR, message: String(err && err.message || err) });
          }
          await q("SELECT queue.fail_locked(id => $1, error => $2, fatal => $3, retry_in => $4::float8 * interval '1 second',"
                  + ' worker => $5, stage => $6)',
                  [task.id, error.replace(/\0/g, '\\0'), fatal, snooze, this.name, task.stage]);
          await q('RELEASE SAVEPOINT skiplock_task');
          ended.failed += 1;
        } finally {
          if (span) span.end();
        }
      }
      await q('COMMIT');
      this.counters.taken += rows.length;
      this.counters.finished += ended.finished;
      this.counters.failed += ended.failed;
    } catch (err) {
      if (connectionLost(err, client)) {
        if (this.db === current) {
          console.error(`main connection lost (${err.message}): the batch rolled back, reconnecting`);
          this.db = null;
          client.end().catch(() => {});
        }
        return true;
      }
      await q('ROLLBACK').catch(() => {});
      if (!transient(err) || this.stopping) throw err;
      console.error(`main: ${err.code}: ${err.message}; the batch rolled back, taking again`);
      await sleep(BACKOFF_FIRST * 1000);
      return true;
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
    stages: (env.STAGE || 'default').split(',').map((s) => s.trim()).filter((s) => s),
    batch: setting(env, 'BATCH', 10, { integer: true, min: 1, max: 10000 }),
    lease: setting(env, 'LEASE', 60, { min: Number.MIN_VALUE }),
    idleWait: setting(env, 'IDLE_WAIT', 5, { min: Number.MIN_VALUE }),
    maintainEvery: setting(env, 'MAINTAIN_EVERY', Math.min(10, setting(env, 'LEASE', 60, { min: Number.MIN_VALUE }) / 3), { min: 0 }),
    taskTimeout: env.TASK_TIMEOUT ? setting(env, 'TASK_TIMEOUT', 0, { min: Number.MIN_VALUE }) : null,
    shutdownTimeout: setting(env, 'SHUTDOWN_TIMEOUT', 20, { min: 0 }),
    concurrency: setting(env, 'CONCURRENCY', 1, { integer: true, min: 1, max: 1000 }),
  });
  process.on('SIGTERM', () => worker.stop());
  process.on('SIGINT', () => worker.stop());
  await worker.run();
  // A handler past its time limit may still hold a timer: it must not keep the process alive.
  setTimeout(() => process.exit(0), 100).unref();
}

if (require.main === module) {
  main().catch((err) => {
    if (err instanceof Unreachable) {
      console.error(`stopping while the server is unreachable (${err.message}): the tasks in hand stay`
                    + ' running until their leases run out, then reap_hung() hands them back');
    } else if (err instanceof DatabaseError && transient(err)) {
      console.error(`stopping while the server still answers ${err.code} (${err.message}): the tasks in hand stay`
                    + ' running until their leases run out, then reap_hung() hands them back');
    } else if (err instanceof Refused || err instanceof DatabaseError) {
      console.error(`worker.js: ${err.message}${err.code ? ` (SQLSTATE ${err.code})` : ''}: waiting does not cure this; stopping`);
    } else {
      console.error(err);
    }
    process.exit(1);
  });
}

module.exports = { Worker, Fail, Snooze, Outcome, Unreachable, Refused, handle, transient, withTrace, connectTimeoutMillis };
