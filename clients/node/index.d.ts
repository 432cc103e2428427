// TypeScript declarations of the npm package "skiplock" (index.js).

/** JSON as PostgreSQL's jsonb holds it. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** The part of a node-postgres client a transactional handler needs (a pg Client at run time). */
export interface TransactionClient {
  query(text: string, values?: unknown[]): Promise<{ rows: any[]; rowCount: number | null }>;
}

/** A task in hand, as queue.take_next (or take_locked, in transactional mode) returned it. */
export interface Task<P = any> {
  id: string;            // a bigint: node-postgres gives it as a string
  payload: P;
  attempt: number;
  /** The lease; absent in transactional mode. */
  lease?: string;
  stage: string;
  /** Transactional mode: the client of the batch's transaction, for writes that commit with the
   * task's finish_locked or roll back (to a savepoint) before its fail_locked. */
  client?: TransactionClient;
  /** Store value as the task's progress (queue.heartbeat(progress => …)); false once the lease is lost. */
  progress(value: Json): Promise<boolean>;
}

/** What a handler may return: a result (object or array), an Outcome, or nothing. */
export type HandlerResult = void | null | undefined | { [key: string]: Json } | Json[] | Outcome;
export type Handler<P = any> = (task: Task<P>) => HandlerResult | Promise<HandlerResult>;

export interface WorkerOptions {
  /** A postgresql:// URI. */
  url: string;
  /** One stage (default "default"); ignored when stages or handlers is given. */
  stage?: string;
  /** Several stages, or prefixes such as "tenant.*": taken round robin by queue.take_next(stages[]). */
  stages?: string[];
  /** A handler per stage (or prefix "x.*"); the stages are its keys unless stages is given. */
  handlers?: Record<string, Handler>;
  /** The handler of a stage that handlers does not name. */
  handler?: Handler;
  /** Tasks taken per call, 1 to 10000 (10). */
  batch?: number;
  /** Lease in seconds, heartbeated every third (60). */
  lease?: number;
  /** Slow poll in seconds while idle on LISTEN (5). */
  idleWait?: number;
  /** The worker's name in queue.tasks (host:pid). */
  name?: string;
  /** LISTEN for enqueues (true); false through a transaction pooler. */
  listen?: boolean;
  /** Prepare statements (as listen). */
  prepare?: boolean;
  /** Run queue.maintain_now() every this many seconds (10 or lease/3; 0: never). */
  maintainEvery?: number;
  /** Fail a handler that has not settled after this many seconds (default: the stage's task_timeout). */
  taskTimeout?: number | null;
  /** After stop(), seconds before the batch's tasks not yet started are released (20; null: never). */
  shutdownTimeout?: number | null;
  /** Handlers of a batch run at once, each task's lease heartbeated (1); batch should be at least this. */
  concurrency?: number;
  /** Run each batch in one transaction: take_locked, each handler in a savepoint with task.client,
   * finish_locked / fail_locked, one commit (false). One handler at a time, no lease: short tasks. */
  transactional?: boolean;
}

export interface Counters {
  taken: number;
  finished: number;
  failed: number;
  snoozed: number;
  lost: number;
}

export class Worker {
  constructor(options: WorkerOptions);
  /** Work until stop(); rejects with Refused (what waiting does not cure) or Unreachable. */
  run(): Promise<Counters>;
  /** Take no more tasks; run() resolves once the batch in hand is ended. */
  stop(): void;
  readonly counters: Counters;
}

/** Throw from a handler to fail the attempt; fatal: never retry. */
export class Fail extends Error {
  constructor(message: string, options?: { fatal?: boolean });
  fatal: boolean;
}

/** Throw from a handler to hand the task back, due in `seconds`, the attempt not counted. */
export class Snooze extends Error {
  constructor(seconds: number);
  seconds: number;
}

/** Return from a handler to move the task to nextStage with result as its payload there. */
export class Outcome {
  constructor(options?: { nextStage?: string | null; result?: { [key: string]: Json } | Json[] | null });
  nextStage: string | null;
  result: { [key: string]: Json } | Json[] | null;
}

export class Unreachable extends Error {}
export class Refused extends Error {}

/** Does the error pass by waiting (a lost connection, a timeout, a deadlock, …)? */
export function transient(err: unknown): boolean;

/** queue.enqueue_batch of the payloads into stage, in one transaction; the new ids. */
export function enqueue(url: string, stage: string, payloads: Json[]): Promise<string[]>;

/** payload with the trace context of ctx (an @opentelemetry/api Context; the active one by
 * default) under the reserved key "_trace"; unchanged without @opentelemetry/api installed. */
export function withTrace<P>(payload: P, ctx?: unknown): P;
