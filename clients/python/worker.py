#!/usr/bin/env python3
"""A skiplock worker in plain psycopg 3: copy it, replace handle(), run it.

    DATABASE_URL=postgresql://... STAGE=default python worker.py

The loop: take a batch (queue.take_next), run handle() per task, then queue.finish or queue.fail
with the task's lease, or queue.release with retry_in when the handler snoozes the task. A heartbeat thread extends the leases of the batch while a handler runs
long. When the stage is empty the worker sleeps on LISTEN "skiplock.<stage>" (enqueue sends
NOTIFY) and polls anyway every IDLE_WAIT seconds, so a lost notification never strands a task.
SIGTERM or Ctrl-C: finish the batch in hand, then exit 0.

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
worker starts) or TASK_TIMEOUT seconds, which overrides it, has its attempt failed (SIGALRM
interrupts it in the main thread), retried by the stage's policy.

Settings (environment): DATABASE_URL, STAGE (default), BATCH (10, 1 to 10000), LEASE seconds
(60), IDLE_WAIT seconds (5), MAINTAIN_EVERY seconds (10 or LEASE/3 if shorter; 0: off),
TASK_TIMEOUT seconds (none). A bad value prints a message and exits 2.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import sys
import threading
import time
from typing import Callable

import psycopg
from psycopg import sql


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


if "DATABASE_URL" not in os.environ:
    print("worker.py: set DATABASE_URL (e.g. postgresql://app@localhost/app)", file=sys.stderr)
    sys.exit(2)
URL = os.environ["DATABASE_URL"]
STAGE = os.environ.get("STAGE", "default")
BATCH = int(setting("BATCH", "10", int, 1, 10000))
LEASE = setting("LEASE", "60", float, 0.001)
IDLE_WAIT = setting("IDLE_WAIT", "5", float, 0.001)
POOLER = os.environ.get("SKIPLOCK_POOLER", "none").strip().lower() or "none"
if POOLER not in ("none", "session", "transaction"):
    print(f"worker.py: SKIPLOCK_POOLER={POOLER!r}: expected none, session or transaction", file=sys.stderr)
    sys.exit(2)
SESSIONS = POOLER != "transaction"   # LISTEN and prepared statements stay with our connection
NAME = f"{socket.gethostname()}:{os.getpid()}"
MAINTAIN_EVERY = setting("MAINTAIN_EVERY", str(min(10.0, LEASE / 3)), float, 0)
TASK_TIMEOUT = setting("TASK_TIMEOUT", "inf", float, 0.001) if os.environ.get("TASK_TIMEOUT") else None
BACKOFF_FIRST, BACKOFF_MAX = 0.1, 5.0   # seconds between reconnection attempts
# SQLSTATEs that pass by waiting (see the top of this file); 26000 and 42P05: a statement we
# prepared is missing or already there on the server connection (a transaction pooler).
TRANSIENT_CLASSES = ("53", "08")
TRANSIENT = ("55P03", "57014", "40001", "40P01", "57P01", "57P02", "57P03", "26000", "42P05")
REFUSED = ("password authentication failed", "no pg_hba.conf entry", "does not exist",
           "permission denied for database")


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


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Unreachable(Exception):
    """The server could not be reached and the worker is stopping: give up."""


class Refused(Exception):
    """What waiting does not cure: a refused login, a revoked grant, skiplock not installed."""


def transient(e: BaseException) -> bool:
    """Does e pass by waiting? A connection failure does, unless the server refused the login."""
    state = getattr(e, "sqlstate", None)
    if state is None:
        return isinstance(e, psycopg.OperationalError) and not any(r in str(e) for r in REFUSED)
    return state.startswith(TRANSIENT_CLASSES) or state in TRANSIENT


def connection_lost(e: BaseException, conn: psycopg.Connection | None) -> bool:
    """Did e come from a lost connection (terminated backend, server restart, network)?"""
    if not isinstance(e, (psycopg.OperationalError, psycopg.InterfaceError)):
        return False
    if conn is None or conn.closed or getattr(conn, "broken", False):
        return True
    state = getattr(e, "sqlstate", None) or ""
    return state.startswith("08") or state in ("57P01", "57P02", "57P03")


class Db:
    """A connection that comes back when it is lost: query() reconnects (LISTEN again if asked)
    with a backoff of BACKOFF_FIRST doubling up to BACKOFF_MAX seconds, for ever, then runs the
    statement again. Once `stop` is set, a failed connection attempt raises Unreachable instead."""

    def __init__(self, role: str, stop: threading.Event, listen: bool = False) -> None:
        self.role, self.stop, self.listen = role, stop, listen
        self.conn: psycopg.Connection | None = None

    def connected(self) -> psycopg.Connection:
        delay, failed = BACKOFF_FIRST, False
        while self.conn is None or self.conn.closed:
            conn = None
            try:
                conn = psycopg.connect(URL, autocommit=True,
                                       prepare_threshold=5 if SESSIONS else None)
                if self.listen and SESSIONS:  # notifications sent while we were away are lost: the caller takes now
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier("skiplock." + STAGE)))
                self.conn = conn
            except psycopg.OperationalError as e:
                if conn is not None:
                    conn.close()
                if not transient(e):
                    raise Refused(f"{self.role} connection: {' '.join(str(e).split())}") from e
                if self.stop.is_set():
                    raise Unreachable(f"{self.role} connection: {e}".strip()) from e
                log(f"{self.role} connection: {str(e).strip()}: retrying in {delay:g} s")
                failed = True
                self.stop.wait(delay)
                delay = min(delay * 2, BACKOFF_MAX)
        if failed:
            log(f"{self.role} connection: reconnected")
        return self.conn

    def lost(self, e: BaseException) -> None:
        log(f"{self.role} connection lost ({type(e).__name__}: {str(e).strip()}): reconnecting")
        self.close()

    def query(self, query: str | sql.Composable, params: tuple = (), holds: Callable[[], bool] | None = None) \
            -> list[tuple]:
        """Run a statement; a lost connection or an error that passes by waiting is tried again
        (after a backoff) while holds() says so (a lease that still holds; by default: until
        the worker stops), else raised."""
        if holds is None:
            holds = lambda: not self.stop.is_set()  # noqa: E731
        global SESSIONS
        delay = BACKOFF_FIRST
        while True:
            conn = self.connected()
            try:
                return conn.execute(query, params).fetchall()
            except psycopg.Error as e:
                if connection_lost(e, conn):
                    self.lost(e)  # then the same statement again: a lease stays valid meanwhile
                    continue
                if not transient(e) or not holds():
                    raise
                if e.sqlstate in ("26000", "42P05"):
                    if SESSIONS:
                        SESSIONS = False
                        log(f"{e.sqlstate}: {e.diag.message_primary}: a pooler in transaction mode? going on with "
                            "unprepared statements and polling (set SKIPLOCK_POOLER=transaction to start so)")
                    self.close()   # the next connection prepares nothing and does not LISTEN
                log(f"{self.role}: {e.sqlstate}: {e.diag.message_primary}; retrying in {delay:g} s")
                self.stop.wait(delay)
                delay = min(delay * 2, BACKOFF_MAX)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class Heartbeat(threading.Thread):
    """Extends the leases of the tasks in hand every LEASE/3 seconds, on its own connection."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.held: dict[int, str] = {}   # id -> lease, the tasks not finished or failed yet
        self.expires: dict[int, float] = {}  # id -> when its lease runs out (time.monotonic())
        self.lost: set[int] = set()      # heartbeat raised SK001: someone else owns the task now
        self.mutex = threading.Lock()
        self.halt = threading.Event()

    def run(self) -> None:
        db = Db("heartbeat", self.halt)  # connects at the first heartbeat
        try:
            while not self.halt.wait(LEASE / 3):
                with self.mutex:
                    held = list(self.held.items())
                for task_id, lease in held:
                    try:
                        beat = time.monotonic()
                        db.query("SELECT queue.heartbeat(id => %s, lease => %s,"
                                 " lease_for => %s * interval '1 second', stage => %s)", (task_id, lease, LEASE, STAGE),
                                 holds=lambda: not self.halt.is_set())
                        with self.mutex:
                            if task_id in self.held:
                                self.expires[task_id] = beat + LEASE
                    except Unreachable:
                        return
                    except psycopg.Error as e:
                        if e.sqlstate != "SK001":  # the lease may run out: reap_hung() recovers it
                            log(f"heartbeat on {task_id}: {e}")
                            continue
                        with self.mutex:
                            self.held.pop(task_id, None)
                            self.lost.add(task_id)
                    except Refused as e:
                        log(f"heartbeat: {e}")
                        return
        finally:
            db.close()

    def holds(self, task_id: int) -> bool:
        """Does the task's lease still hold (as far as the last heartbeat knows)?"""
        with self.mutex:
            return task_id not in self.lost and time.monotonic() < self.expires.get(task_id, 0.0)

    def done(self, task_id: int) -> None:
        with self.mutex:
            self.held.pop(task_id, None)
            self.expires.pop(task_id, None)


class Maintainer(threading.Thread):
    """queue.maintain() every MAINTAIN_EVERY seconds, in a transaction of its own, by one worker
    at a time (an advisory lock elects it): expired leases come back with no `skiplock maintain`."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.halt = threading.Event()

    def run(self) -> None:
        conn = None
        try:
            while not self.halt.wait(MAINTAIN_EVERY):
                try:
                    if conn is None or conn.closed or conn.broken:
                        conn = psycopg.connect(URL, autocommit=True, prepare_threshold=None, connect_timeout=5)
                    with conn.transaction():  # no row when another worker runs it now
                        conn.execute("SELECT * FROM queue.maintain_now()")
                except psycopg.Error as e:
                    if e.sqlstate == "42501":
                        log(f"maintain: {e.diag.message_primary}: this login does not maintain the queue "
                            "(queue.maintain_now() is granted to skiplock_worker: run `skiplock maintain`, or set MAINTAIN_EVERY=0)")
                        return
                    log(f"maintain: {' '.join(str(e).split())}; trying again in {MAINTAIN_EVERY:g} s")
        finally:
            if conn is not None:
                conn.close()


stopping = False
stop_event = threading.Event()  # set with stopping: cuts a reconnection's backoff short
idle = False


class _WakeUp(Exception):
    pass


def on_signal(signum: int, frame: object) -> None:
    global stopping
    stopping = True
    stop_event.set()
    if idle:            # asleep on LISTEN: wake up now; busy: the loop stops after the batch
        raise _WakeUp


def storable(text: str) -> str:
    """An error text the driver and the server accept: a text value holds no NUL, and psycopg
    cannot encode a lone surrogate (os.fsdecode of bytes that are not UTF-8 makes one)."""
    return text.replace("\0", "\\0").encode("utf-8", "backslashreplace").decode("utf-8")


def fail(db: Db, task_id: int, lease: str, error: str, fatal: bool, holds: Callable[[], bool]) -> bool:
    """queue.fail; an error text refused all the same is replaced by a plain one, once, so that
    the worker goes on and the task is not left running until its lease runs out."""
    query = "SELECT queue.fail(id => %s, lease => %s, error => %s, fatal => %s, stage => %s)"
    try:
        return db.query(query, (task_id, lease, storable(error), fatal, STAGE), holds)[0][0]
    except (psycopg.Error, UnicodeError) as e:  # not a lost connection: Db.query retries those
        if isinstance(e, psycopg.Error) and transient(e):
            raise
        log(f"fail on {task_id}: the error text was refused ({type(e).__name__}: {e}); recording a plain one")
        return db.query(query, (task_id, lease, f"handler failed; its error text was refused ({type(e).__name__})",
                                fatal, STAGE), holds)[0][0]


class TimedOut(Exception):
    """The handler ran past TASK_TIMEOUT (raised in it by SIGALRM)."""


def on_alarm(signum: int, frame: object) -> None:
    raise TimedOut(f"timed out after {TASK_TIMEOUT:g} s (TASK_TIMEOUT)")


def run_handler(task_id: int, payload: dict, attempt: int) -> None:
    """handle(), interrupted by SIGALRM past TASK_TIMEOUT."""
    if TASK_TIMEOUT is None:
        handle(task_id, payload, attempt)
        return
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, TASK_TIMEOUT)
    try:
        handle(task_id, payload, attempt)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def run_batch(db: Db, heartbeat: Heartbeat) -> int:
    rows = db.query(
        "SELECT id, payload, attempt, lease FROM queue.take_next("
        " stage => %s, batch => %s, lease_for => %s * interval '1 second', worker => %s)",
        (STAGE, BATCH, LEASE, NAME))
    taken = time.monotonic()
    with heartbeat.mutex:
        heartbeat.held.update((r[0], r[3]) for r in rows)
        heartbeat.expires.update((r[0], taken + LEASE) for r in rows)
    for task_id, payload, attempt, lease in rows:
        error, fatal, snooze = None, False, None
        try:
            run_handler(task_id, payload, attempt)
        except Snooze as s:
            snooze = s.seconds
        except Fail as f:
            error, fatal = str(f), f.fatal
        except Exception as e:  # a bug in the handler is a failed attempt, retried with backoff
            error = f"{type(e).__name__}: {e}"
        with heartbeat.mutex:
            if task_id in heartbeat.lost:
                heartbeat.held.pop(task_id, None)
                log(f"lease lost on {task_id}: dropping the result")
                continue
        # A lost connection: Db.query reconnects and calls again with the same lease; an error
        # that passes by waiting is tried again while the lease holds (the heartbeat renews it).
        holds = lambda: heartbeat.holds(task_id)  # noqa: E731
        try:
            if snooze is not None:
                ok = db.query("SELECT queue.release(id => %s, lease => %s, retry_in => %s * interval '1 second',"
                              " stage => %s)", (task_id, lease, snooze, STAGE), holds)[0][0]
                log(f"snoozed {task_id} for {snooze:.3f} s")
            elif error is None:
                ok = db.query("SELECT queue.finish(id => %s, lease => %s, stage => %s)", (task_id, lease, STAGE),
                              holds)[0][0]
            else:
                ok = fail(db, task_id, lease, error, fatal, holds)
        except psycopg.Error as e:
            if not transient(e):
                raise
            log(f"task {task_id} not recorded while its lease held ({e.sqlstate}: {e.diag.message_primary}): "
                "reap_hung() hands it back")
            ok = True
        finally:
            heartbeat.done(task_id)
        if not ok:  # false: the lease was no longer ours (reaped and retaken)
            log(f"lease lost on {task_id}")
    return len(rows)


def wait_for_notify(db: Db) -> None:
    """Sleep on LISTEN until a NOTIFY, IDLE_WAIT seconds or a signal; a lost connection is closed
    (the next query reconnects and LISTENs again)."""
    global idle
    lost = None
    try:
        try:
            conn = db.connected()
            idle = True
            if not stopping and not SESSIONS:
                stop_event.wait(IDLE_WAIT)   # the poll alone: no LISTEN through the pooler
            elif not stopping:
                for _ in conn.notifies(timeout=IDLE_WAIT, stop_after=1):
                    pass
        except psycopg.Error as e:
            idle = False
            if not connection_lost(e, db.conn):
                raise
            lost = e
        finally:
            idle = False
    except _WakeUp:  # raised by on_signal anywhere above while idle
        pass
    if lost is not None:
        db.lost(lost)


def main() -> int:
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    heartbeat = Heartbeat()
    heartbeat.start()
    maintainer = Maintainer()
    if MAINTAIN_EVERY > 0:
        maintainer.start()
    # LISTEN before the first take: a task enqueued in between still wakes us.
    db = Db("main", stop_event, listen=True)
    global TASK_TIMEOUT
    try:
        if TASK_TIMEOUT is None:  # the stage's own limit (configure_stage(task_timeout => …)), if any
            try:
                TASK_TIMEOUT = db.query("SELECT extract(epoch FROM queue.task_timeout(%s))::float8", (STAGE,))[0][0]
            except psycopg.errors.UndefinedFunction:  # a database older than the setting
                db.close()
        while not stopping:
            if run_batch(db, heartbeat):
                continue
            wait_for_notify(db)
    except Unreachable as e:
        log(f"stopping while the server is unreachable ({e}): the tasks in hand stay running"
            " until their leases run out, then reap_hung() hands them back")
        return 1
    except Refused as e:
        log(f"worker.py: {e}: waiting does not cure this; stopping")
        return 1
    except psycopg.Error as e:
        if transient(e):  # stopped while it kept failing: what it held comes back through its lease
            log(f"stopping while the server still answers {e.sqlstate} ({e.diag.message_primary}): the tasks in hand"
                " stay running until their leases run out, then reap_hung() hands them back")
        else:  # what waiting does not cure: a revoked grant, skiplock missing
            log(f"worker.py: {e.diag.message_primary or e} (SQLSTATE {e.sqlstate}): waiting does not cure this; stopping")
        return 1
    finally:
        maintainer.halt.set()
        heartbeat.halt.set()
        db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
