#!/usr/bin/env python3
"""A skiplock worker in plain psycopg 3: copy it, replace handle(), run it.

    DATABASE_URL=postgresql://... STAGE=default python worker.py

The loop: take a batch (queue.take_next), run handle() per task, then queue.finish or queue.fail
with the task's lease, or queue.release with retry_in when the handler snoozes the task. A heartbeat thread extends the leases of the batch while a handler runs
long. When the stage is empty the worker sleeps on LISTEN "skiplock.<stage>" (enqueue sends
NOTIFY) and polls anyway every IDLE_WAIT seconds, so a lost notification never strands a task.
SIGTERM or Ctrl-C: finish the batch in hand, then exit 0.

Settings (environment): DATABASE_URL, STAGE (default), BATCH (10), LEASE seconds (60),
IDLE_WAIT seconds (5).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time

import psycopg
from psycopg import sql

URL = os.environ["DATABASE_URL"]
STAGE = os.environ.get("STAGE", "default")
BATCH = int(os.environ.get("BATCH", "10"))
LEASE = float(os.environ.get("LEASE", "60"))
IDLE_WAIT = float(os.environ.get("IDLE_WAIT", "5"))
NAME = f"{socket.gethostname()}:{os.getpid()}"


class Fail(Exception):
    """Raise from handle() to fail the attempt; fatal=True means never retry."""

    def __init__(self, message: str, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


class Snooze(Exception):
    """Raise from handle() when the task cannot run yet (a rate limit, a resource not ready): it
    goes back, due `seconds` from now, and the attempt is not counted."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"snoozed for {seconds:.3f} s")
        self.seconds = seconds


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


class Heartbeat(threading.Thread):
    """Extends the leases of the tasks in hand every LEASE/3 seconds, on its own connection."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.held: dict[int, str] = {}   # id -> lease, the tasks not finished or failed yet
        self.lost: set[int] = set()      # heartbeat raised SK001: someone else owns the task now
        self.mutex = threading.Lock()
        self.halt = threading.Event()

    def run(self) -> None:
        with psycopg.connect(URL, autocommit=True) as conn:
            while not self.halt.wait(LEASE / 3):
                with self.mutex:
                    held = list(self.held.items())
                for task_id, lease in held:
                    try:
                        conn.execute("SELECT queue.heartbeat(id => %s, lease => %s,"
                                     " lease_for => %s * interval '1 second')", (task_id, lease, LEASE))
                    except psycopg.Error as e:
                        if e.sqlstate != "SK001":  # the lease may run out: reap_hung() recovers it
                            print(f"heartbeat on {task_id}: {e}", file=sys.stderr, flush=True)
                            continue
                        with self.mutex:
                            self.held.pop(task_id, None)
                            self.lost.add(task_id)


stopping = False
idle = False


class _WakeUp(Exception):
    pass


def on_signal(signum: int, frame: object) -> None:
    global stopping
    stopping = True
    if idle:            # asleep on LISTEN: wake up now; busy: the loop stops after the batch
        raise _WakeUp


def run_batch(conn: psycopg.Connection, heartbeat: Heartbeat) -> int:
    rows = conn.execute(
        "SELECT id, payload, attempt, lease FROM queue.take_next("
        " stage => %s, batch => %s, lease_for => %s * interval '1 second', worker => %s)",
        (STAGE, BATCH, LEASE, NAME)).fetchall()
    with heartbeat.mutex:
        heartbeat.held.update((r[0], r[3]) for r in rows)
    for task_id, payload, attempt, lease in rows:
        error, fatal, snooze = None, False, None
        try:
            handle(task_id, payload, attempt)
        except Snooze as s:
            snooze = s.seconds
        except Fail as f:
            error, fatal = str(f), f.fatal
        except Exception as e:  # a bug in the handler is a failed attempt, retried with backoff
            error = f"{type(e).__name__}: {e}"
        with heartbeat.mutex:
            heartbeat.held.pop(task_id, None)
            if task_id in heartbeat.lost:
                print(f"lease lost on {task_id}: dropping the result", file=sys.stderr, flush=True)
                continue
        if snooze is not None:
            ok = conn.execute("SELECT queue.release(id => %s, lease => %s, retry_in => %s * interval '1 second')",
                              (task_id, lease, snooze)).fetchone()[0]
            print(f"snoozed {task_id} for {snooze:.3f} s", file=sys.stderr, flush=True)
        elif error is None:
            ok = conn.execute("SELECT queue.finish(id => %s, lease => %s)", (task_id, lease)).fetchone()[0]
        else:
            ok = conn.execute("SELECT queue.fail(id => %s, lease => %s, error => %s, fatal => %s)",
                              (task_id, lease, error, fatal)).fetchone()[0]
        if not ok:  # false: the lease was no longer ours (reaped and retaken)
            print(f"lease lost on {task_id}", file=sys.stderr, flush=True)
    return len(rows)


def main() -> int:
    global idle
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    heartbeat = Heartbeat()
    heartbeat.start()
    with psycopg.connect(URL, autocommit=True) as conn:
        # LISTEN before the first take: a task enqueued in between still wakes us.
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier("skiplock." + STAGE)))
        while not stopping:
            if run_batch(conn, heartbeat):
                continue
            try:
                idle = True
                if not stopping:
                    for _ in conn.notifies(timeout=IDLE_WAIT, stop_after=1):
                        pass
            except _WakeUp:
                pass
            finally:
                idle = False
    heartbeat.halt.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
