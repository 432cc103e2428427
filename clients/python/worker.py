#!/usr/bin/env python3
"""A skiplock worker script over the library (skiplock.worker, `pip install skiplock`): replace
handle(), run it. Your own program would rather import skiplock.worker and register handlers
(clients/README.md); this script keeps the environment interface the reference clients share.

    DATABASE_URL=postgresql://... STAGE=default python worker.py

STAGE may name several stages, comma-separated, and prefixes ('tenant.*'): they are taken round
robin (queue.take_next(stages[])). CONCURRENCY (1) runs that many handlers at a time, in threads.

The loop: take a batch (queue.take_next), run handle() per task, then queue.finish or queue.fail
with the task's lease, or queue.release with retry_in when the handler snoozes the task. A heartbeat thread extends the leases of the batch while a handler runs
long. When the stage is empty the worker sleeps on LISTEN "skiplock.<stage>" (enqueue sends
NOTIFY) and polls anyway every IDLE_WAIT seconds, so a lost notification never strands a task.
SIGTERM or Ctrl-C: finish the tasks in hand (SHUTDOWN_TIMEOUT seconds, 20; then they are released),
then exit 0.

Through a connection pooler in transaction mode (PgBouncer pool_mode=transaction), set
SKIPLOCK_POOLER=transaction: statements are then never prepared on the server (the next
transaction may run on a server connection that does not have them) and the idle worker polls
every IDLE_WAIT seconds instead of LISTEN (a notification reaches a server connection, not us).

A lost connection (a terminated backend, a server restart) is logged and the worker reconnects,
for ever, after 0.1 s, then twice as long each time up to 5 s: the results of the batch in hand
are reported with their leases (still valid) once it is back, the rest of the batch runs, LISTEN
is issued again and heartbeats go on. Stopped (SIGTERM) while the server is unreachable, it gives
up after one more try and exits 1: the leases of the tasks it held run out and reap_hung()
hands them back.

Errors that pass by waiting (a statement or lock timeout, a deadlock, a serialization failure, a
full disk or too many connections: SQLSTATE classes 53 and 08, 55P03, 57014, 40001, 40P01) are
logged and the statement is tried again with the same backoff; a finish or fail for as long as
the task's lease holds (the heartbeat thread renews it meanwhile). A statement this worker
prepared that went missing (26000: a pooler in transaction mode that SKIPLOCK_POOLER did not
announce) makes it say so once and go on unprepared and polling. What waiting does not cure (a
refused login, a revoked grant, skiplock not installed) ends the worker in one line, exit 1.

Unless MAINTAIN_EVERY is 0, a thread runs queue.maintain() every MAINTAIN_EVERY seconds, one
worker at a time across all of them (an advisory lock elects one), so that the tasks of a worker
that died come back without a `skiplock maintain` running (a login that may not run it says so
once). A handler that runs longer than the stage's task_timeout (configure_stage; read when the
worker first takes from the stage) or TASK_TIMEOUT seconds, which overrides it, has its attempt
failed, retried by the stage's policy (its thread cannot be stopped: its result is dropped).

Settings (environment): DATABASE_URL, STAGE (default), BATCH (10, 1 to 10000), LEASE seconds
(60), IDLE_WAIT seconds (5), MAINTAIN_EVERY seconds (10 or LEASE/3 if shorter; 0: off),
TASK_TIMEOUT seconds (none), CONCURRENCY (1), SHUTDOWN_TIMEOUT seconds (20). A bad value prints a message and exits 2.
ASYNCIO=1 runs the same loop on asyncio (skiplock.worker.AsyncWorker, psycopg's AsyncConnection),
handle() in a thread through asyncio.to_thread: what an asyncio application gets.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import sys
import time

from skiplock.worker import AsyncWorker, Fail, Refused, Snooze, Task, Unreachable, Worker

__all__ = ["Fail", "Snooze", "handle", "main"]


def setting(name: str, default: str, parse: type, low: float, high: float = math.inf) -> float:
    """A numeric setting from the environment; a bad one ends the worker with a message (exit 2)."""
    text = os.environ.get(name, default)
    try:
        value = parse(text)
    except ValueError:
        value = math.nan
    if not (low <= value <= high and math.isfinite(value)):  # nan fails too
        kind = "an integer" if parse is int else "a number of seconds"
        bound = f"from {low:g} to {high:g}" if high < math.inf else f"at least {low:g}"
        print(f"worker.py: {name}={text!r}: expected {kind} {bound}", file=sys.stderr)
        sys.exit(2)
    return value


def handle(task_id: int, payload: dict, attempt: int) -> None:
    """Your work goes here. Return to finish the task; raise Fail (or any exception) to fail it,
    Snooze to hand it back for later.

    This example understands a few demo fields: {"sleep": s} works for s seconds,
    {"fail_attempts": n} fails attempts 1..n, {"fatal": true} fails for good,
    {"snooze_until": t} snoozes until the Unix time t.
    """
    if time.time() < float(payload.get("snooze_until", 0)):
        raise Snooze(float(payload["snooze_until"]) - time.time())
    time.sleep(float(payload.get("sleep", 0)))
    if payload.get("fatal"):
        raise Fail("fatal by request", fatal=True)
    if attempt <= int(payload.get("fail_attempts", 0)):
        raise Fail(f"failing attempt {attempt} by request")
    print(f"done {task_id}: {payload}", flush=True)


def main() -> int:
    if "DATABASE_URL" not in os.environ:
        print("worker.py: set DATABASE_URL (e.g. postgresql://app@localhost/app)", file=sys.stderr)
        return 2
    batch = int(setting("BATCH", "10", int, 1, 10000))
    lease = setting("LEASE", "60", float, 0.001)
    idle_wait = setting("IDLE_WAIT", "5", float, 0.001)
    pooler = os.environ.get("SKIPLOCK_POOLER", "none").strip().lower() or "none"
    if pooler not in ("none", "session", "transaction"):
        print(f"worker.py: SKIPLOCK_POOLER={pooler!r}: expected none, session or transaction", file=sys.stderr)
        return 2
    maintain_every = setting("MAINTAIN_EVERY", str(min(10.0, lease / 3)), float, 0)
    task_timeout = setting("TASK_TIMEOUT", "inf", float, 0.001) if os.environ.get("TASK_TIMEOUT") else None
    concurrency = int(setting("CONCURRENCY", "1", int, 1, 1000))
    shutdown_timeout = setting("SHUTDOWN_TIMEOUT", "20", float, 0)
    stages = [s.strip() for s in os.environ.get("STAGE", "default").split(",") if s.strip()] or ["default"]
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")

    def run(task: Task) -> None:
        handle(task.id, task.payload, task.attempt)   # the module's handle, as replaced by the caller

    kind = AsyncWorker if os.environ.get("ASYNCIO", "") not in ("", "0") else Worker
    worker = kind(os.environ["DATABASE_URL"], dict.fromkeys(stages, run), batch=batch, concurrency=concurrency,
                  lease=lease, idle_wait=idle_wait, pooler=pooler, maintain_every=maintain_every,
                  task_timeout=task_timeout, shutdown_timeout=shutdown_timeout)
    try:
        if isinstance(worker, AsyncWorker):
            asyncio.run(worker.run(install_signals=True))
        else:
            worker.run(install_signals=True)
    except (Refused, Unreachable):   # logged by the worker in one line
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
