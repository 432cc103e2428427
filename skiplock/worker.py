"""skiplock's worker library: handlers per stage, run by threads (Worker) or asyncio (AsyncWorker)
in one process, over the SQL API.

    from skiplock.worker import Worker, Fail, Snooze

    worker = Worker("postgresql://app@localhost/app", concurrency=4)

    @worker.handler("email")
    def send(task):                      # task.id, .payload, .attempt, .stage, .progress(...)
        deliver(task.payload)
        return {"sent": True}            # the task's result (queue.finish(result => …))

    worker.run(install_signals=True)     # until SIGTERM / Ctrl-C / worker.stop()

The loop (the only one in the package: `skiplock worker`, skiplock/cmd_worker.py, and
clients/python/worker.py are layers over it): take up to
`batch` tasks from every stage that has a handler (queue.take_next(stage), or take_next(stages[])
round robin for several stages or a prefix 'tenant.*'), run each in a thread of its own, at most
`concurrency` at a time, then queue.finish (result, next stage), queue.fail (by the exception:
Fail, Fail(fatal=True) or Fatal, any other exception a retried failure) or queue.release (Snooze).
A heartbeat thread extends the leases of the tasks in hand; task.progress(x) stores progress
(queue.heartbeat(progress => x)). Idle, it sleeps on LISTEN "skiplock.<stage>" and polls every
idle_wait seconds anyway; through a transaction pooler (pooler="transaction", or found out by a
missing prepared statement, 26000) it prepares nothing and only polls. A lost connection or an
error that passes by waiting (skiplock.errors.transient; a connection attempt gets 10 s unless the
URL sets connect_timeout: skiplock.connect.timeout_args) is retried with backoff (0.1 s doubling
to 5 s), a finish or fail for as long as the task's lease holds; what waiting does not cure (a
refused login, a revoked grant, skiplock missing) ends run() with Refused. Unless maintain_every is
0, a thread runs queue.maintain_now() so that a dead worker's tasks come back with no `skiplock
maintain` beside. The stages' queue.worker_settings are read at most every 30 s: their
task_timeout, and whether they are paused (one log line when a stage is paused, one when resumed).
A handler past its time limit (task_timeout, the argument, else the stage's), whose lease is
lost, or still running shutdown_timeout after stop() is cancelled: Task.cancelled() says why
("timeout", "lost", "shutdown"), and the worker waits cancel_wait seconds (0 by default) for it
to return: a handler that can stop what it runs (a subprocess: `skiplock worker`) watches it.
Then a timed-out attempt fails (with the handler's own error if it raised one), a lost one records
nothing, one cut short by the shutdown is released; a handler still running has its slot freed
(a thread cannot be killed: its result is dropped). stop(): no more takes; stop(now=True), or a
second SIGTERM/SIGINT, cuts the tasks in hand short at once. Interrupted (raised by a handler)
releases the task, back at once, the attempt not counted. until_empty=True returns once nothing
is due and nothing is in hand (queue.maintain_now() once first, so expired leases count).
on_end(task, Ending) is called for each task's end (finished, failed, fatal, snoozed, released,
lost, unrecorded), for a log line or a metric; counters counts them. raw_payload=True gives the
payload as the JSON text the server sent. transactional=True runs each batch in
one transaction (take_locked / finish_locked / fail_locked): task.conn is that transaction, for a
handler whose writes must commit with the task's end. Every failure is logged on logger
"skiplock.worker.task" (a child of "skiplock.worker", the worker's own lines) with
extra={"task_id", "stage", "attempt", "error"}.

Async handlers (`async def`) given to Worker run on one event loop thread of the worker, so
`concurrency` of them wait at once at the cost of one thread each only while they run; past its
time limit, or past shutdown_timeout after stop(), an async handler is cancelled.

In an asyncio application, AsyncWorker (same arguments and handlers) is `await worker.run()`:

    worker = AsyncWorker("postgresql://app@localhost/app", concurrency=50)

    @worker.handler("email")
    async def send(task):
        await task.progress({"step": "sending"})   # an asyncio task: await it for the answer
        return {"sent": True}

    await worker.run(install_signals=True)         # loop.add_signal_handler(SIGTERM / SIGINT)

It runs the loop above on psycopg's AsyncConnection in the caller's event loop, with no thread of
its own: the takes, LISTEN (AsyncConnection.notifies), the heartbeats and the maintenance are
asyncio tasks; each handler is one (an async handler on the loop, `concurrency` at once; a sync
handler in a daemon thread, as asyncio.to_thread runs one but without holding the process's exit).
The rules are written once for both I/O styles: the statements (module constants), what an error
means (_DbRules: reconnect, retry with backoff, the pooler fallback, Refused), the leases in hand
(_Leases), a task's end (_end_statement, _cut_short, Worker._recorded), the settings and the
maintenance's logging; Worker and AsyncWorker only wait differently (threads and Events;
coroutines). What AsyncWorker does not do as Worker does: a sync handler's thread past its time
limit or the shutdown cannot be cancelled (its result is dropped, as in Worker); in transactional
mode task.conn is an AsyncConnection, which a sync handler cannot use.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import logging
import os
import queue as _queue
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from skiplock import tracing
from skiplock.connect import timeout_args, unique_statement_names
from skiplock.errors import prepared_lost, refused_login, transient

log = logging.getLogger("skiplock.worker")
log_task = logging.getLogger("skiplock.worker.task")   # a line per task's failure, snooze, release, lost lease
BACKOFF_FIRST, BACKOFF_MAX = 0.1, 5.0   # seconds between attempts at a statement or a connection
SETTINGS_EVERY = 30.0   # seconds between reads of a stage's queue.worker_settings (time limit, paused)
ROUTINE_STEPS = ("roll_up_hours", "finished_counts")  # maintain steps that do work every round: logged at DEBUG

# The statements of a worker, written once for both loops (Worker on threads, AsyncWorker on asyncio).
TAKE_ONE = ("SELECT %s::text, id, payload, attempt, lease, extract(epoch FROM lease_expires - now())::float8"
            " FROM queue.take_next(stage => %s, batch => %s, lease_for => %s * interval '1 second', worker => %s)")
TAKE_SEVERAL = ("SELECT stage, id, payload, attempt, lease, extract(epoch FROM lease_expires - now())::float8"
                " FROM queue.take_next(stages => %s::text[], batch => %s, lease_for => %s * interval '1 second',"
                " worker => %s)")
TAKE_ONE_TEXT = TAKE_ONE.replace(" payload,", " payload::text,")          # Worker(raw_payload=True)
TAKE_SEVERAL_TEXT = TAKE_SEVERAL.replace(" payload,", " payload::text,")
FINISH = ("SELECT queue.finish(id => %s, lease => %s, next_stage => %s, stage => %s, result => %s)")
FAIL = ("SELECT queue.fail(id => %s, lease => %s, error => %s, fatal => %s,"
        " retry_in => %s::float8 * interval '1 second', stage => %s)")
SNOOZE = "SELECT queue.release(id => %s, lease => %s, retry_in => %s * interval '1 second', stage => %s)"
RELEASE = "SELECT queue.release(id => %s, lease => %s, stage => %s)"
HEARTBEAT = ("SELECT queue.heartbeat(id => %s, lease => %s, lease_for => %s * interval '1 second',"
             " stage => %s, progress => %s)")
TAKE_LOCKED_ONE = "SELECT %s::text, id, payload, attempt FROM queue.take_locked(stage => %s, batch => %s)"
TAKE_LOCKED_SEVERAL = "SELECT stage, id, payload, attempt FROM queue.take_locked(stages => %s::text[], batch => %s)"
FINISH_LOCKED = "SELECT queue.finish_locked(id => %s, worker => %s, stage => %s, result => %s)"
FAIL_LOCKED = ("SELECT queue.fail_locked(id => %s, error => %s, fatal => %s,"
               " retry_in => %s::float8 * interval '1 second', worker => %s, stage => %s)")
MAINTAIN_NOW = "SELECT task, count, detail FROM queue.maintain_now()"
WORKER_SETTINGS = "SELECT extract(epoch FROM s.task_timeout)::float8, s.paused FROM queue.worker_settings(%s) s"
TASK_TIMEOUT = "SELECT extract(epoch FROM queue.task_timeout(%s))::float8"   # a database older than worker_settings
MAINTAIN_DENIED = ("maintain: %s: this login does not maintain the queue (queue.maintain_now() is granted to "
                   "skiplock_worker: run `skiplock maintain`, or set maintain_every=0)")



@dataclass
class Task:
    id: int
    payload: Any          # the JSON object or array, as json.loads gives it
    attempt: int
    lease: str | None     # None in transactional mode
    stage: str
    conn: Any = None   # transactional mode: the batch's transaction (AsyncWorker: an AsyncConnection)
    timeout: float | None = None   # the handler's time limit, seconds (task_timeout), None for none
    started: float = field(default_factory=time.monotonic)   # when its handler started (time.monotonic())
    cancel_reason: str | None = None   # why the handler should end now: "timeout", "lost" or "shutdown"
    cancel_detail: str = ""            # for "shutdown": when, e.g. "after the shutdown timeout (30 s)"
    _progress: Callable[[Any], bool] | None = field(default=None, repr=False)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _settled: bool = field(default=False, repr=False)   # its end is being recorded (by its thread or the shutdown)
    _settling: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def progress(self, value: Any) -> bool:
        """Store value (JSON) as the running task's progress and extend its lease; False when the
        lease is no longer ours. In transactional mode there is no lease: nothing is stored."""
        return self._progress(value) if self._progress is not None else True

    def cancelled(self, wait: float = 0.0) -> str | None:
        """Why the handler should stop now (waiting up to `wait` seconds for it), else None:
        "timeout" (its time limit passed: the attempt fails), "lost" (its lease is no longer ours:
        nothing will be recorded) or "shutdown" (the worker stops and the shutdown timeout passed:
        the task is released). A handler that runs something it can stop (a subprocess, a request)
        watches this; the worker waits Worker(cancel_wait=…) seconds for it to return."""
        self._cancel.wait(wait)
        return self.cancel_reason

    def _settle(self) -> bool:
        """Claim the recording of this task's end: True once, for its thread or the shutdown."""
        with self._settling:
            first, self._settled = not self._settled, True
        return first

    def _cancel_now(self, reason: str, detail: str = "") -> None:
        if not self._cancel.is_set():
            self.cancel_reason, self.cancel_detail = reason, detail
            self._cancel.set()


class Fail(Exception):
    """Raise from a handler to fail the attempt; fatal=True means never retry; retry_in seconds
    overrides the stage's backoff."""

    def __init__(self, message: str, fatal: bool = False, retry_in: float | None = None) -> None:
        super().__init__(message)
        self.fatal = fatal
        self.retry_in = retry_in


class Fatal(Fail):
    """Fail for good: never retried."""

    def __init__(self, message: str) -> None:
        super().__init__(message, fatal=True)


class Snooze(Exception):
    """Raise when the task cannot run yet: it goes back, due `seconds` from now, the attempt not
    counted (queue.release). In transactional mode it is a failed attempt with retry_in."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"snoozed for {seconds:.3f} s")
        self.seconds = seconds


class Interrupted(Snooze):
    """Raise when the run was cut short by no fault of the task (the worker is stopping, the
    process it ran was stopped with it): the task goes back at once, the attempt not counted
    (queue.release), counted as released. A handler cancelled for "shutdown" that raises
    anything else is released all the same."""

    def __init__(self, message: str = "interrupted") -> None:
        Exception.__init__(self, message)
        self.seconds = 0.0


@dataclass
class Outcome:
    """What a handler decided: finish (optionally moving to next_stage), keeping result (a JSON
    object or array: the run's result in queue.history, and with next_stage the task's payload there).
    A handler may also return the result itself (a dict or list), or None."""
    next_stage: str | None = None
    result: dict[str, Any] | list[Any] | None = None


@dataclass
class Counters:
    taken: int = 0
    finished: int = 0
    failed: int = 0
    snoozed: int = 0
    lost: int = 0          # finish/fail returned false, or the lease was lost: no longer ours
    timed_out: int = 0
    reconnects: int = 0
    released: int = 0      # handed back at once, the attempt not counted: shutdown, Interrupted
    unrecorded: int = 0    # ended but not recorded (the server could not be reached): left to its lease
    finished_ids: list[int] = field(default_factory=list)


@dataclass
class Ending:
    """How one task ended, given to Worker(on_end=…) once its end is recorded (or given up):
    what is finished, failed, fatal, snoozed, released, lost (the lease was no longer ours:
    nothing recorded) or unrecorded (the server could not be reached: left to its lease); error
    is the error text stored (failed, fatal) or the reason (released, unrecorded); seconds since its
    handler started; cause is the exception behind an unrecorded end."""
    what: str
    error: str | None = None
    seconds: float = 0.0
    cause: BaseException | None = None


# A handler returns None, an Outcome, a dict or a list; an async handler (a coroutine function)
# returns an awaitable of one.
Handler = Callable[[Task], Any]


class Refused(Exception):
    """What waiting does not cure: a refused login, a revoked grant, skiplock not installed."""


class Unreachable(Exception):
    """The server could not be reached and the worker is stopping: the tasks in hand come back
    through their leases."""


def storable(text: str) -> str:
    """text as a text value can hold it: NUL shown as \\0, lone surrogates escaped (a handler's
    error may quote bytes it read; the server or the driver would refuse them)."""
    return text.replace("\0", "\\0").encode("utf-8", "backslashreplace").decode("utf-8")


def channel(stage: str) -> str:
    """The NOTIFY channel enqueue signals for a stage."""
    return "skiplock." + stage


def require_stage(stage: object) -> str:
    """The stage a call is routed by, refused here when it is not a name: on Citus a delegated call
    with a NULL distribution argument crashes the coordinator's backend (a Citus bug), so no call
    of this client ever sends one."""
    if not isinstance(stage, str) or not stage:
        raise ValueError(f"a stage must be a non-empty name, not {stage!r}: on Citus every call is routed by it")
    return stage


def _one_line(e: BaseException) -> str:
    if isinstance(e, psycopg.Error) and e.sqlstate and e.diag.message_primary:
        return f"{e.sqlstate}: {e.diag.message_primary}"
    return " ".join(str(e).split()) or type(e).__name__


def _lost_connection(e: BaseException, conn: psycopg.Connection | psycopg.AsyncConnection | None) -> bool:
    """Did e come from a lost connection (terminated backend, server restart, network)?"""
    if not isinstance(e, (psycopg.OperationalError, psycopg.InterfaceError)):
        return False
    if conn is None or conn.closed or getattr(conn, "broken", False):
        return True
    state = getattr(e, "sqlstate", None) or ""
    return state.startswith("08") or state in ("57P01", "57P02", "57P03")


class _DbRules:
    """What a worker's connection does about an error, for both I/O styles (_Db: psycopg's
    Connection in threads; _AsyncDb: AsyncConnection on asyncio): the rules, not the waiting."""
    worker: Worker
    role: str
    prepares: bool   # the connection prepares statements (made before a pooler was found)

    def _connect_failed(self, e: psycopg.OperationalError, give_up: bool, delay: float) -> None:
        """A failed connection attempt: Refused when waiting does not cure it, Unreachable when the
        caller gives up (the worker stops, or the statement's lease ran out); else it is logged and
        tried again after delay."""
        if refused_login(e) or not transient(e):
            raise Refused(f"{self.role} connection: {_one_line(e)}") from e
        if give_up:
            raise Unreachable(f"{self.role} connection: {_one_line(e)}") from e
        log.warning("%s: cannot connect (%s); retrying in %g s", self.role, _one_line(e), delay,
                    extra={"error": _one_line(e)})

    def _said_lost(self, e: BaseException) -> None:
        log.warning("%s connection lost (%s: %s): reconnecting", self.role, type(e).__name__, _one_line(e),
                    extra={"error": _one_line(e)})
        self.worker._count("reconnects", 1)

    def _statement_failed(self, e: psycopg.Error, conn: Any, holds: bool, delay: float) -> bool:
        """A statement failed: True to run it again at once on a new connection (a lost connection,
        or one that prepared statements through a pooler found meanwhile), False to close the
        connection if it prepared, then run it again after delay; e raised when waiting does not
        cure it or the statement no longer holds (the worker stops, its lease ran out)."""
        if _lost_connection(e, conn) and not prepared_lost(e):
            self._said_lost(e)  # then the same statement again: a lease stays valid meanwhile
            return True
        if self.prepares and not self.worker.sessions and not prepared_lost(e) and holds:
            # A pooler found meanwhile: this connection's statement may have met another
            # client's prepared statement of the same name. Again, unprepared.
            log.warning("%s: %s on a connection that prepared statements through a pooler; again unprepared",
                        self.role, _one_line(e))
            return True
        if not transient(e) or not holds:
            raise e
        if prepared_lost(e):
            self.worker._pooler_found(e)   # the next connection prepares nothing and does not LISTEN
        log.warning("%s: %s; retrying in %g s", self.role, _one_line(e), delay, extra={"error": _one_line(e)})
        return False


class _Db(_DbRules):
    """A connection that comes back when it is lost: query() reconnects (LISTEN again if asked)
    with backoff, then runs the statement again. Once the worker stops, a failed connection attempt
    raises Unreachable; a refused login raises Refused at once."""

    def __init__(self, worker: Worker, role: str, halt: threading.Event, listen: bool = False) -> None:
        self.worker, self.role, self.halt, self.listen = worker, role, halt, listen
        self.conn: psycopg.Connection | None = None
        self.listening = False
        self.prepares = False   # the connection prepares statements (made before a pooler was found)

    def connected(self, holds: Callable[[], bool] | None = None) -> psycopg.Connection:
        """The connection, made again if it is gone: a failed attempt is retried with backoff until
        the worker stops or holds() (the statement's: a finish's lease) says no more (Unreachable)."""
        delay, failed = BACKOFF_FIRST, False
        if self.prepares and not self.worker.sessions:  # another connection found the pooler: prepare no more
            self.close()
        while self.conn is None or self.conn.closed:
            conn = None
            try:
                sessions = self.worker.sessions
                conn = unique_statement_names(
                    psycopg.connect(self.worker.url, autocommit=True, prepare_threshold=5 if sessions else None,
                                    **self.worker.connect_args))
                self.listening = False
                if self.listen and sessions:  # notifications sent while we were away are lost: the caller takes now
                    for stage in self.worker.stages:
                        if not stage.endswith("*"):
                            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(stage))))
                    self.listening = not any(s.endswith("*") for s in self.worker.stages)
                self.conn, self.prepares = conn, sessions
            except psycopg.OperationalError as e:
                if conn is not None:
                    conn.close()
                self._connect_failed(e, self.halt.is_set() or (holds is not None and not holds()), delay)
                failed = True
                self.halt.wait(delay)
                delay = min(delay * 2, BACKOFF_MAX)
        if failed:
            log.warning("%s connection: reconnected", self.role)
        return self.conn

    def lost(self, e: BaseException) -> None:
        self._said_lost(e)
        self.close()

    def query(self, query: Any, params: Any = (), holds: Callable[[], bool] | None = None) -> list[tuple]:
        """Run a statement; a lost connection or an error that passes by waiting is tried again
        (after a backoff) while holds() says so (by default: until the worker stops), else raised."""
        if holds is None:
            holds = lambda: not self.halt.is_set()  # noqa: E731
        delay = BACKOFF_FIRST
        while True:
            conn = self.connected(holds if self.role == "finish" else None)   # a finish gives up with its lease
            try:
                cur = conn.execute(query, params)
                return cur.fetchall() if cur.description else []
            except psycopg.Error as e:
                if self._statement_failed(e, conn, holds(), delay):
                    self.close()
                    continue
                if prepared_lost(e):
                    self.close()
                self.halt.wait(delay)
                delay = min(delay * 2, BACKOFF_MAX)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
            self.listening = False


@dataclass
class _Held:
    lease: str
    stage: str
    period: float          # the lease's length, seconds
    expires: float         # time.monotonic() when it runs out, as far as the last heartbeat knows
    task: Task | None = None   # told when its lease is found lost (Task.cancelled() says "lost")
    lost: bool = False


class _Leases:
    """The leases of the tasks in hand, for both heartbeats (a thread's, an asyncio task's): which
    are due for a heartbeat (a third of their lease), which hold, which were found lost."""

    def __init__(self) -> None:
        self.held: dict[int, _Held] = {}
        self.mutex = threading.Lock()

    def add(self, task: Task, period: float) -> None:
        assert task.lease is not None
        with self.mutex:
            self.held[task.id] = _Held(task.lease, task.stage, period, time.monotonic() + period, task)

    def done(self, task_id: int) -> None:
        with self.mutex:
            self.held.pop(task_id, None)

    def holds(self, task_id: int) -> bool:
        with self.mutex:
            h = self.held.get(task_id)
            return h is not None and not h.lost and time.monotonic() < h.expires

    def lost(self, task_id: int) -> bool:
        with self.mutex:
            h = self.held.get(task_id)
            return h is None or h.lost

    def due(self) -> list[int]:
        now = time.monotonic()
        with self.mutex:
            return [i for i, h in self.held.items() if not h.lost and h.expires - now < h.period * 2 / 3]

    def to_beat(self, task_id: int) -> _Held | None:
        """The lease to extend, None when it is no longer held."""
        with self.mutex:
            h = self.held.get(task_id)
        return None if h is None or h.lost else h

    @staticmethod
    def params(task_id: int, h: _Held, progress: Any) -> tuple[Any, ...]:
        return (task_id, h.lease, h.period, h.stage, None if progress is None else Jsonb(progress))

    def beat_failed(self, task_id: int, h: _Held, e: psycopg.Error) -> bool:
        """A heartbeat's error: SK001 (the lease is no longer ours) marks it lost and cancels the
        handler ("lost"): False; any other is logged and the lease may run out (reap_hung()
        recovers it): True."""
        if e.sqlstate != "SK001":
            log.warning("heartbeat on %s: %s", task_id, _one_line(e),
                        extra={"task_id": task_id, "stage": h.stage, "error": _one_line(e)})
            return True
        with self.mutex:
            h.lost = True
        if h.task is not None:
            h.task._cancel_now("lost")
        return False

    def renewed(self, h: _Held, started: float) -> bool:
        with self.mutex:
            h.expires = started + h.period
        return True


class _Heartbeat(_Leases, threading.Thread):
    """Extends the leases of the tasks in hand every third of their lease, on its own connection;
    progress() stores a handler's progress through it."""

    def __init__(self, worker: Worker) -> None:
        _Leases.__init__(self)
        threading.Thread.__init__(self, daemon=True, name="skiplock-heartbeat")
        self.worker = worker
        self.db_mutex = threading.Lock()
        self.halt = threading.Event()
        self.db = _Db(worker, "heartbeat", self.halt)

    def beat(self, task_id: int, progress: Any = None) -> bool:
        """queue.heartbeat on one task (with progress when given); False when the lease is lost."""
        h = self.to_beat(task_id)
        if h is None:
            return False
        started = time.monotonic()
        try:
            with self.db_mutex:
                self.db.query(HEARTBEAT, self.params(task_id, h, progress),
                              holds=lambda: self.holds(task_id) and not self.halt.is_set())
        except psycopg.Error as e:
            return self.beat_failed(task_id, h, e)
        return self.renewed(h, started)

    def run(self) -> None:
        try:
            while not self.halt.wait(0.1):
                for task_id in self.due():
                    self.beat(task_id)
        except (Unreachable, Refused) as e:
            log.warning("heartbeat: %s", e)
        finally:
            self.db.close()


class _Maintainer(threading.Thread):
    """queue.maintain_now() every `every` seconds, by one worker at a time across all of them (the
    function elects one): expired leases come back and schedules fire with no `skiplock maintain`."""

    def __init__(self, url: str, every: float) -> None:
        super().__init__(daemon=True, name="skiplock-maintain")
        self.url, self.every = url, every
        self.halt = threading.Event()

    def run(self) -> None:
        conn = None
        try:
            while not self.halt.wait(self.every):
                try:
                    if conn is None or conn.closed or conn.broken:
                        conn = psycopg.connect(self.url, autocommit=True, prepare_threshold=None, connect_timeout=5)
                    with conn.transaction():  # no row when another worker runs it now
                        rows = conn.execute(MAINTAIN_NOW).fetchall()
                    _maintained(rows)
                except psycopg.Error as e:
                    if not _maintain_failed(e, self.every):
                        return
        finally:
            if conn is not None:
                conn.close()


class Worker:
    """Runs handlers per stage; see the module's docstring. handlers maps a stage (or a prefix
    'tenant.*') to a handler; @worker.handler(stage) adds one."""

    def __init__(self, url: str, handlers: dict[str, Handler] | None = None, *, batch: int = 10,
                 concurrency: int = 1, lease: float | None = None, idle_wait: float = 5.0, name: str | None = None,
                 pooler: str = "none", maintain_every: float | None = None, task_timeout: float | None = None,
                 shutdown_timeout: float = 30.0, transactional: bool = False, until_empty: bool = False,
                 cancel_wait: float = 0.0, on_end: Callable[[Task, Ending], None] | None = None,
                 raw_payload: bool = False) -> None:
        if not 1 <= batch <= 10000 or concurrency < 1:
            raise ValueError("batch must be 1 to 10000 and concurrency at least 1")
        if pooler not in ("none", "session", "transaction"):
            raise ValueError(f"pooler={pooler!r}: expected none, session or transaction")
        if until_empty and transactional:
            raise ValueError("until_empty is not available in transactional mode")
        self.url = url
        self.connect_args = timeout_args(url)   # the connection attempts' time limit
        self.handlers: dict[str, Handler] = {}
        for stage, h in (handlers or {}).items():
            self.handlers[require_stage(stage)] = h
        self.batch, self.concurrency, self.lease, self.idle_wait = batch, concurrency, lease, idle_wait
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.sessions = pooler != "transaction"   # LISTEN and prepared statements stay with our connection
        self.maintain_every = min(10.0, (lease or 30.0) / 3) if maintain_every is None else maintain_every
        self.task_timeout = task_timeout
        self.shutdown_timeout = shutdown_timeout
        self.transactional = transactional
        self.until_empty = until_empty
        self.cancel_wait = cancel_wait
        self.on_end = on_end
        self.raw_payload = raw_payload   # Task.payload is the JSON text the server sent, not decoded
        self.counters = Counters()
        self._counting = threading.Lock()
        self._halt = threading.Event()           # stop(): no more takes
        self._deadline: float | None = None      # when the tasks in hand are cut short (time.monotonic())
        self._why = ""                           # why they are: "after the shutdown timeout (30 s)"
        self._slots = threading.Condition()
        self._run_slots = threading.BoundedSemaphore(concurrency)   # handlers running at a time
        self._running: dict[int, tuple[Task, Any]] = {}   # its thread (AsyncWorker: its asyncio task)
        self._pool: _queue.SimpleQueue[_Db] = _queue.SimpleQueue()
        # queue.worker_settings per stage, read at most every SETTINGS_EVERY seconds:
        # stage -> (task_timeout in seconds or None, paused, when read, time.monotonic())
        self._settings: dict[str, tuple[float | None, bool, float]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None   # async handlers run here
        self._own_loop = True   # the worker started _loop (AsyncWorker: the caller's loop)
        self._futures: dict[int, concurrent.futures.Future] = {}

    @property
    def stages(self) -> list[str]:
        return list(self.handlers)

    def handler(self, stage: str) -> Callable[[Handler], Handler]:
        """Decorator: register the function as the handler of stage (a name, or a prefix 'x.*')."""
        def register(fn: Handler) -> Handler:
            self.handlers[require_stage(stage)] = fn
            return fn
        return register

    def _count(self, name: str, n: int | bool = 1) -> None:
        with self._counting:
            setattr(self.counters, name, getattr(self.counters, name) + int(n))

    def stop(self, now: bool = False, why: str = "") -> None:
        """Take no more tasks; run() returns once the tasks in hand end, or shutdown_timeout passes
        (then they are cancelled for "shutdown" and released). now=True cuts them short at once
        (why says when, in the log and Task.cancel_detail: "on a second SIGINT")."""
        with self._slots:
            if not self._halt.is_set():
                self._deadline = time.monotonic() + self.shutdown_timeout
                self._why = f"after the shutdown timeout ({self.shutdown_timeout:g} s)"
                self._halt.set()
            if now and self._deadline is not None and self._deadline > time.monotonic():
                self._deadline = time.monotonic()
                self._why = why or "at once"
            self._slots.notify_all()

    def stopping(self, wait: float = 0.0) -> bool:
        """Has stop() been called (waiting up to `wait` seconds for it)?"""
        return self._halt.wait(wait)

    def on_signal(self, signum: int, frame: object) -> None:
        """The SIGTERM/SIGINT handler run(install_signals=True) installs: the first signal stop(), said
        in one line; a second stop(now=True)."""
        name = signal.Signals(signum).name
        with self._slots:
            running = len(self._running)
        if not self._halt.is_set():
            if running:
                log.warning("%s: draining, %d task(s) running, up to %g s", name, running, self.shutdown_timeout)
            else:
                log.warning("%s: stopping, no task running", name)
            self.stop()
        else:
            log.warning("%s again: cutting the tasks in hand short now", name)
            self.stop(now=True, why=f"on a second {name}")

    def _pooler_found(self, e: BaseException) -> None:
        """A statement we prepared went missing (prepared_lost): connect as under pooler='transaction'
        from now on, said once."""
        with self._counting:
            if not self.sessions:
                return
            self.sessions = False
        log.warning("%s: a pooler in transaction mode? going on with unprepared statements and polling "
                    "(pooler='transaction' / SKIPLOCK_POOLER=transaction starts so)", _one_line(e))

    def _handler_for(self, stage: str) -> Handler:
        if stage in self.handlers:
            return self.handlers[stage]
        best = max((s for s in self.handlers if s.endswith("*") and stage.startswith(s[:-1])), key=len, default=None)
        if best is None:
            raise Fatal(f"no handler for stage {stage!r} in this worker")
        return self.handlers[best]

    # -- running -------------------------------------------------------------------------------
    def run(self, should_stop: Callable[[], bool] = lambda: False, install_signals: bool = False) -> Counters:
        """Work until stop(), should_stop(), (until_empty) no due task left, or (install_signals)
        SIGTERM/SIGINT (a second one: stop(now=True)); the counters. Raises Refused when waiting
        does not cure an error (a refused login, a revoked grant), Unreachable when it stopped while
        the server could not be reached."""
        if not self.handlers:
            raise ValueError("no handlers: register one with @worker.handler(stage) or handlers={stage: fn}")
        if install_signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, self.on_signal)
        heartbeat = _Heartbeat(self)
        heartbeat.start()
        maintainer = _Maintainer(self.url, self.maintain_every)
        if self.maintain_every > 0 and not self.until_empty:
            maintainer.start()
        self._heartbeat = heartbeat
        db = _Db(self, "main", self._halt, listen=True)
        recovered = False   # until_empty: queue.maintain_now() ran since the last task taken
        try:
            try:
                while not (self._halt.is_set() or should_stop()):
                    if self.transactional:
                        worked = self._run_locked_batch(db)
                    else:
                        worked = self._take(db)
                    if worked:
                        recovered = False
                    elif self.until_empty:
                        if self._wait_for_a_task():
                            continue   # one ended: its stage may have more (a retry, a next stage)
                        if not recovered and self.maintain_every > 0:
                            recovered = True   # expired leases first: a task whose worker died is not done
                            _maintain_once(db)
                            continue
                        break
                    else:
                        self._check_paused(db)
                        self._idle(db, should_stop)
            except Unreachable as e:   # stopping while the server is down: the tasks in hand still end
                log.error("stopping while the server is unreachable (%s): the tasks in hand that cannot be "
                          "recorded stay running until their leases run out, then reap_hung() hands them back", e)
                self.stop()
                self._shut_down(db)
                raise
            self.stop()
            self._shut_down(db)
        except Refused as e:
            log.error("%s: waiting does not cure this; stopping", e)
            self.stop()
            self._shut_down(db)
            raise
        except psycopg.Error as e:
            self.stop()
            if transient(e):  # stopped while it kept failing: what it held comes back through its lease
                self._shut_down(db)
                raise Unreachable(f"stopped while the server still answers {_one_line(e)}") from e
            log.error("%s: waiting does not cure this; stopping", _one_line(e), extra={"error": _one_line(e)})
            self._shut_down(db)
            raise Refused(_one_line(e)) from e
        finally:
            self._halt.set()
            maintainer.halt.set()
            heartbeat.halt.set()
            db.close()
            while not self._pool.empty():
                self._pool.get().close()
            if self._loop is not None and self._own_loop:
                self._loop.call_soon_threadsafe(self._loop.stop)
        return self.counters

    def _wait_for_a_task(self) -> bool:
        """until_empty found nothing due: wait for a task in hand to end; False when none is in hand."""
        with self._slots:
            if not self._running:
                return False
            count = len(self._running)
            while len(self._running) >= count and not self._halt.is_set():
                self._slots.wait(0.5)
        return True

    def _take(self, db: _Db) -> bool:
        """Once fewer than `concurrency` tasks are in hand, take up to `batch` more and start a thread
        for each; at most `concurrency` of them run their handler at a time, the others wait (their
        leases heartbeated): with concurrency 1 a batch runs one task after the other."""
        with self._slots:
            while len(self._running) >= self.concurrency and not self._halt.is_set():
                self._slots.wait(0.5)
        free = self.batch
        if self._halt.is_set():
            return True
        stages = self.stages
        if len(stages) == 1 and not stages[0].endswith("*"):
            rows = db.query(TAKE_ONE_TEXT if self.raw_payload else TAKE_ONE,
                            (stages[0], stages[0], free, self.lease, self.name))
        else:  # several, or a prefix: round robin, each row names its stage
            rows = db.query(TAKE_SEVERAL_TEXT if self.raw_payload else TAKE_SEVERAL,
                            (stages, free, self.lease, self.name))
        for stage, task_id, payload, attempt, lease, period in rows:
            self._count("taken", 1)
            task = Task(task_id, payload, attempt, str(lease), stage,
                        _progress=functools.partial(self._heartbeat.beat, task_id))
            self._heartbeat.add(task, max(float(period), 0.001))
            task.timeout = self.task_timeout if self.task_timeout is not None else self._stage_settings(db, stage, True)[0]
            thread = threading.Thread(target=self._run_task, args=(task,), daemon=True,
                                      name=f"skiplock-task-{task_id}")
            with self._slots:
                self._running[task_id] = (task, thread)
            thread.start()
        return bool(rows)

    def _stage_settings(self, db: _Db, stage: str, taken: bool = False) -> tuple[float | None, bool]:
        """The stage's task_timeout (seconds, or None) and whether it is paused, from
        queue.worker_settings, read at most every SETTINGS_EVERY seconds a stage (and at once when a
        task was `taken` from a stage last seen paused). Logs (info) the time limit when it changes,
        and one line when the stage is paused or resumed. A passing error keeps what was known."""
        known = self._settings_known(stage)
        if not self._settings_due(known, taken):
            assert known is not None
            return known[0], known[1]
        try:
            ((seconds, paused),) = db.query(WORKER_SETTINGS, (stage,), holds=lambda: False)
        except psycopg.errors.UndefinedFunction:  # a database older than worker_settings
            db.close()
            try:
                seconds, paused = db.query(TASK_TIMEOUT, (stage,), holds=lambda: False)[0][0], False
            except psycopg.errors.UndefinedFunction:  # older than the time limit too
                db.close()
                seconds, paused = None, False
        except psycopg.Error as e:
            if not transient(e):
                raise
            return (known[0], known[1]) if known is not None else (None, False)
        return self._settings_seen(stage, known, seconds, bool(paused))

    def _settings_known(self, stage: str) -> tuple[float | None, bool, float] | None:
        with self._counting:
            return self._settings.get(stage)

    @staticmethod
    def _settings_due(known: tuple[float | None, bool, float] | None, taken: bool) -> bool:
        """Read the stage's settings again: never read, SETTINGS_EVERY passed, or a task was taken
        from a stage last seen paused."""
        return known is None or time.monotonic() >= known[2] + SETTINGS_EVERY or (taken and known[1])

    def _settings_seen(self, stage: str, known: tuple[float | None, bool, float] | None, seconds: float | None,
                       paused: bool) -> tuple[float | None, bool]:
        """The stage's settings as read: logged where they changed, kept."""
        if known is None or seconds != known[0]:
            log.info("task timeout of %s: %s", stage, f"{seconds:g} s (the stage's task_timeout)" if seconds else "none")
        if paused and (known is None or not known[1]):
            log.info("stage %s is paused: its tasks wait until it is resumed (configure_stage(paused => false))", stage)
        elif not paused and known is not None and known[1]:
            log.info("stage %s is resumed", stage)
        with self._counting:
            self._settings[stage] = (seconds, paused, time.monotonic())
        return seconds, paused

    def _check_paused(self, db: _Db) -> None:
        """Idle: read the settings of each stage served by name (a prefix's stages are known only by
        their tasks) when SETTINGS_EVERY has passed, so that the log says when one is paused or
        resumed although no task of it comes."""
        for stage in self.stages:
            if not stage.endswith("*"):
                self._stage_settings(db, stage)

    def _idle(self, db: _Db, should_stop: Callable[[], bool]) -> None:
        """Sleep on LISTEN until a NOTIFY or idle_wait seconds (a slow poll: a lost notification never
        strands a task), waking every half second to see whether to stop."""
        end = time.monotonic() + self.idle_wait
        while not (self._halt.is_set() or should_stop()):
            left = end - time.monotonic()
            if left <= 0:
                return
            conn = db.connected()
            if not db.listening:
                self._halt.wait(min(left, 0.5))
                continue
            try:
                for _ in conn.notifies(timeout=min(left, 0.5), stop_after=1):
                    return
            except psycopg.Error as e:
                if not _lost_connection(e, db.conn):
                    raise
                db.lost(e)
                return

    def _run_task(self, task: Task) -> None:
        """One task's thread, inside its span: the handler (in a thread of its own when it may be
        cut short: a time limit, a lost lease, the shutdown), then its end recorded with the lease."""
        outcome: list[Any] = []
        timeout = task.timeout

        def call() -> None:
            try:
                returned = self._handler_for(task.stage)(task)
                if inspect.isawaitable(returned):   # an async handler: on the worker's event loop
                    returned = self._await(task, returned)
                outcome.append(("ok", _outcome(returned)))
            except BaseException as e:  # noqa: BLE001 - every failure of a handler is a failed attempt
                outcome.append(("error", e))

        try:
            with self._run_slots, tracing.task_span(task) as failed:
                if self._heartbeat.lost(task.id):   # released at shutdown while it waited for a slot
                    return
                task.started = time.monotonic()
                inner = threading.Thread(target=contextvars.copy_context().run, args=(call,), daemon=True,
                                         name=f"skiplock-handler-{task.id}")
                inner.start()
                deadline = None if timeout is None else task.started + timeout
                while inner.is_alive() and not task._cancel.is_set():
                    if deadline is not None and time.monotonic() >= deadline:
                        task._cancel_now("timeout")
                        break
                    # Ends at once with the handler; a lost lease or the shutdown is seen within 0.5 s.
                    inner.join(0.5 if deadline is None else min(0.5, max(deadline - time.monotonic(), 0.0)))
                if task._cancel.is_set():
                    inner.join(self.cancel_wait)   # a handler that watches Task.cancelled() ends in it
                    if inner.is_alive():
                        future = self._futures.get(task.id)
                        if future is not None:   # an async handler is cancelled; a thread cannot be
                            future.cancel()
                if task.cancel_reason == "timeout":
                    self._count("timed_out", 1)
                _cut_short(task, outcome, "; the handler goes on, its result will be dropped")
                kind, value = outcome[0]
                if kind == "error":
                    failed(value)
                self._record(task, kind, value)
        except Exception as e:  # noqa: BLE001 - a slot must not die silently
            self._not_recorded(task, e)
        finally:
            self._heartbeat.done(task.id)
            with self._slots:
                self._running.pop(task.id, None)
                self._slots.notify_all()

    def _not_recorded(self, task: Task, e: Exception) -> None:
        """A task's end could not be recorded (called in the except clause): counted, told to on_end
        and logged; its lease runs out and reap_hung() hands it back."""
        extra = {"task_id": task.id, "stage": task.stage, "attempt": task.attempt}
        if isinstance(e, (Unreachable, Refused)):
            self._ended(task, "unrecorded", str(e), e.__cause__ or e)
            log_task.warning("task %s not recorded (%s): reap_hung() hands it back", task.id, e, extra=extra)
        else:
            self._ended(task, "unrecorded", _one_line(e), e)
            log.exception("task %s not recorded (%s): its lease runs out and reap_hung() hands it back", task.id,
                          _one_line(e), extra=extra)

    def _ended(self, task: Task, what: str, error: str | None = None, cause: BaseException | None = None) -> None:
        """Count the end and tell on_end (whose own error is logged, never raised)."""
        self._count({"finished": "finished", "failed": "failed", "fatal": "failed", "snoozed": "snoozed",
                     "released": "released", "lost": "lost", "unrecorded": "unrecorded"}[what], 1)
        if self.on_end is not None:
            try:
                self.on_end(task, Ending(what, error, time.monotonic() - task.started, cause))
            except Exception:  # noqa: BLE001 - a callback's bug must not leave the task unaccounted
                log.exception("on_end of task %s", task.id)

    def _await(self, task: Task, awaitable: Any) -> Any:
        """Run an async handler's coroutine on the worker's event loop (one thread, started at the
        first async handler), so that many async handlers wait at once; its result."""
        with self._slots:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, daemon=True, name="skiplock-asyncio").start()

        async def wrapped() -> Any:
            return await awaitable

        future = asyncio.run_coroutine_threadsafe(wrapped(), self._loop)
        self._futures[task.id] = future
        try:
            return future.result()
        finally:
            self._futures.pop(task.id, None)

    @contextlib.contextmanager
    def _db(self) -> Iterator[_Db]:
        try:
            db = self._pool.get_nowait()
        except _queue.Empty:
            db = _Db(self, "finish", self._halt)   # stopping: a failed connection attempt gives up
        try:
            yield db
        finally:
            self._pool.put(db)

    def _record(self, task: Task, kind: str, value: Any) -> None:
        """finish, fail or release the task with its lease, retried while the lease holds. A task
        cut short by the shutdown is released whatever its handler raised."""
        extra = {"task_id": task.id, "stage": task.stage, "attempt": task.attempt}
        if not task._settle():   # the shutdown released it meanwhile
            return
        if self._heartbeat.lost(task.id):
            log_task.warning("lease lost on %s: dropping the result", task.id, extra=extra)
            self._ended(task, "lost")
            return
        query, params, what, error = _end_statement(task, kind, value)
        holds = lambda: self._heartbeat.holds(task.id)  # noqa: E731
        with self._db() as db:
            try:
                try:
                    ok = db.query(query, params, holds)[0][0]
                except (psycopg.Error, UnicodeError) as e:  # not a lost connection: _Db.query retries those
                    if query is not FAIL or (isinstance(e, psycopg.Error) and transient(e)):
                        raise
                    params, error = _plain_failure(task, params, e)
                    ok = db.query(query, params, holds)[0][0]
            except psycopg.Error as e:
                if not transient(e):
                    raise
                log_task.warning("task %s not recorded while its lease held (%s): reap_hung() hands it back", task.id,
                                 _one_line(e), extra={**extra, "error": _one_line(e)})
                self._ended(task, "unrecorded", _one_line(e), e)
                return
        self._recorded(task, bool(ok), what, error, value)

    def _recorded(self, task: Task, ok: bool, what: str, error: str | None, value: Any) -> None:
        """The end's statement returned ok: log and count it (false: the lease was no longer ours,
        reaped and retaken, or cancelled)."""
        extra = {"task_id": task.id, "stage": task.stage, "attempt": task.attempt}
        if not ok:
            log_task.warning("lease lost on %s", task.id, extra=extra)
            self._ended(task, "lost")
            return
        if what == "finished":
            with self._counting:
                self.counters.finished_ids.append(task.id)
        elif what == "released":
            log_task.info("released %s (%s)", task.id, error, extra=extra)
        elif what == "snoozed":
            log_task.info("snoozed %s for %.3f s", task.id, value.seconds, extra=extra)
        self._ended(task, what, error)

    def _shut_down(self, db: _Db) -> None:
        """Wait for the tasks in hand until the deadline stop() set (shutdown_timeout, or now); then
        cancel the rest for "shutdown", wait cancel_wait for them to end (they release their tasks
        themselves), and release what is still running (back at once, the attempt not counted)."""
        said = time.monotonic()
        with self._slots:
            while self._running and time.monotonic() < (self._deadline or 0.0):
                self._slots.wait(min(0.5, max(0.0, (self._deadline or 0.0) - time.monotonic())))
                if self._running and time.monotonic() - said >= 5.0 and self._deadline is not None:
                    said = time.monotonic()
                    log.info("draining: %d task(s) still running, %.0f s left", len(self._running),
                             max(self._deadline - said, 0.0))
            left = list(self._running.values())
        if left:
            log.warning("%d task(s) still running %s: cutting them short, then releasing them (ready again, the attempt "
                        "not counted)", len(left), self._why)
        for task, _ in left:
            task._cancel_now("shutdown", self._why)
        cancel_end = time.monotonic() + self.cancel_wait
        with self._slots:
            while self._running and time.monotonic() < cancel_end:
                self._slots.wait(min(0.5, max(0.0, cancel_end - time.monotonic())))
            left = list(self._running.values())
        for task, _ in left:
            if not task._settle():   # its thread is recording its end right now
                continue
            self._heartbeat.done(task.id)   # its result, if it comes, is dropped
            future = self._futures.get(task.id)
            if future is not None:   # an async handler is cancelled; a thread cannot be
                future.cancel()
            try:
                ok = db.query(RELEASE, (task.id, task.lease, task.stage), holds=lambda: False)[0][0]
                log_task.warning("task %s still running %s: %s", task.id, self._why, "released" if ok else "lease lost",
                                 extra={"task_id": task.id, "stage": task.stage})
                self._ended(task, "released" if ok else "lost", f"still running {self._why}")
            except (psycopg.Error, Unreachable, Refused) as e:
                log_task.warning("task %s not released (%s): its lease runs out", task.id, e)
                self._ended(task, "unrecorded", str(e), e.__cause__ or e)

    # -- transactional mode ----------------------------------------------------------------------
    def _run_locked_batch(self, db: _Db) -> bool:
        """One transaction: take_locked, each handler in a savepoint with task.conn, finish_locked
        or fail_locked; the commit ends them all with the handlers' writes."""
        conn = db.connected()
        stages = self.stages
        try:
            with conn.transaction():
                if len(stages) == 1 and not stages[0].endswith("*"):
                    rows = conn.execute(TAKE_LOCKED_ONE, (stages[0], stages[0], self.batch)).fetchall()
                else:
                    rows = conn.execute(TAKE_LOCKED_SEVERAL, (stages, self.batch)).fetchall()
                for stage, task_id, payload, attempt in rows:
                    self._count("taken", 1)
                    task = Task(task_id, payload, attempt, None, stage, conn=conn)
                    try:
                        with tracing.task_span(task), conn.transaction():
                            next_stage, result = _outcome(self._handler_for(stage)(task))
                            conn.execute(FINISH_LOCKED, (task_id, self.name, stage, None if result is None else Jsonb(result)))
                            if next_stage is not None:
                                raise Fatal("next_stage is not available in transactional mode")
                        self._count("finished", 1)
                        self.counters.finished_ids.append(task_id)
                    except Exception as e:  # noqa: BLE001 - the handler's writes are rolled back to the savepoint
                        if isinstance(e, psycopg.Error) and (_lost_connection(e, conn) or prepared_lost(e)):
                            raise
                        conn.execute(FAIL_LOCKED, _locked_failure(task, e, self.name))
                        self._count("failed", 1)
        except psycopg.Error as e:
            if prepared_lost(e):   # a transaction pooler: the batch rolled back; again unprepared
                self._pooler_found(e)
                db.close()
                return True
            if _lost_connection(e, conn):
                db.lost(e)   # the transaction rolled back: its tasks were never taken
                return True
            if not transient(e) or self._halt.is_set():
                raise
            log.warning("main: %s; the batch rolled back, taking again", _one_line(e), extra={"error": _one_line(e)})
            self._halt.wait(BACKOFF_FIRST)
            return True
        return bool(rows)


class _AsyncDb(_DbRules):
    """_Db on psycopg's AsyncConnection: a connection that comes back when it is lost, the same
    rules (_DbRules), the waits on the event loop."""
    worker: AsyncWorker

    def __init__(self, worker: AsyncWorker, role: str, halted: Callable[[], bool], listen: bool = False) -> None:
        self.worker, self.role, self.halted, self.listen = worker, role, halted, listen
        self.conn: psycopg.AsyncConnection | None = None
        self.listening = False
        self.prepares = False

    async def connected(self, holds: Callable[[], bool] | None = None) -> psycopg.AsyncConnection:
        delay, failed = BACKOFF_FIRST, False
        if self.prepares and not self.worker.sessions:  # another connection found the pooler: prepare no more
            await self.close()
        while self.conn is None or self.conn.closed:
            conn = None
            try:
                sessions = self.worker.sessions
                conn = unique_statement_names(await psycopg.AsyncConnection.connect(
                    self.worker.url, autocommit=True, prepare_threshold=5 if sessions else None,
                    **self.worker.connect_args))
                self.listening = False
                if self.listen and sessions:  # notifications sent while we were away are lost: the caller takes now
                    for stage in self.worker.stages:
                        if not stage.endswith("*"):
                            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(stage))))
                    self.listening = not any(s.endswith("*") for s in self.worker.stages)
                self.conn, self.prepares = conn, sessions
            except psycopg.OperationalError as e:
                if conn is not None:
                    await conn.close()
                self._connect_failed(e, self.halted() or (holds is not None and not holds()), delay)
                failed = True
                await self.worker._sleep(delay, self.halted)
                delay = min(delay * 2, BACKOFF_MAX)
        if failed:
            log.warning("%s connection: reconnected", self.role)
        return self.conn

    async def lost(self, e: BaseException) -> None:
        self._said_lost(e)
        await self.close()

    async def query(self, query: Any, params: Any = (), holds: Callable[[], bool] | None = None) -> list[tuple]:
        if holds is None:
            holds = lambda: not self.halted()  # noqa: E731
        delay = BACKOFF_FIRST
        while True:
            conn = await self.connected(holds if self.role == "finish" else None)
            try:
                cur = await conn.execute(query, params)
                return await cur.fetchall() if cur.description else []
            except psycopg.Error as e:
                if self._statement_failed(e, conn, holds(), delay):
                    await self.close()
                    continue
                if prepared_lost(e):
                    await self.close()
                await self.worker._sleep(delay, self.halted)
                delay = min(delay * 2, BACKOFF_MAX)

    async def close(self) -> None:
        if self.conn is not None:
            conn, self.conn, self.listening = self.conn, None, False
            await conn.close()


async def _in_a_thread(fn: Callable[[Task], Any], task: Task) -> Any:
    """fn(task) in a daemon thread of its own, awaited: asyncio.to_thread, but a handler that never
    returns (past its time limit, cut short by the shutdown) does not hold the process's exit, as a
    thread of the default executor would (asyncio.run and the interpreter join those)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if not future.done():
            if error is None:
                future.set_result(value)
            else:
                future.set_exception(error)

    def call() -> None:
        try:
            value, error = fn(task), None
        except BaseException as e:  # noqa: BLE001 - the handler's failure, raised where it is awaited
            value, error = None, e
        with contextlib.suppress(RuntimeError):   # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle, value, error)

    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(call,), daemon=True, name=f"handler-{task.id}").start()
    return await future


class _AsyncHeartbeat(_Leases):
    """_Heartbeat as an asyncio task: extends the leases of the tasks in hand, stores progress."""

    def __init__(self, worker: AsyncWorker) -> None:
        super().__init__()
        self.worker = worker
        self.halt = False
        self.db = _AsyncDb(worker, "heartbeat", lambda: self.halt)
        self.db_lock = asyncio.Lock()

    async def beat(self, task_id: int, progress: Any = None) -> bool:
        h = self.to_beat(task_id)
        if h is None:
            return False
        started = time.monotonic()
        try:
            async with self.db_lock:
                await self.db.query(HEARTBEAT, self.params(task_id, h, progress),
                                    holds=lambda: self.holds(task_id) and not self.halt)
        except psycopg.Error as e:
            return self.beat_failed(task_id, h, e)
        return self.renewed(h, started)

    async def run(self) -> None:
        try:
            while not self.halt:
                await asyncio.sleep(0.1)
                for task_id in self.due():
                    await self.beat(task_id)
        except (Unreachable, Refused) as e:
            log.warning("heartbeat: %s", e)
        finally:
            await self.db.close()


class AsyncWorker(Worker):
    """The worker for an asyncio application, `await worker.run()`: the same arguments, handlers
    and rules as Worker (they are written once, above: the statements, the retries of _DbRules,
    the leases of _Leases, the ends of _end_statement), its I/O on psycopg's AsyncConnection in the
    caller's event loop, with no thread of its own: the takes, LISTEN (AsyncConnection.notifies),
    the heartbeats and the maintenance are asyncio tasks. `concurrency` handlers run at once, each
    an asyncio task: an async handler on the loop, a sync one in a daemon thread of its own (as
    asyncio.to_thread, but not the default executor, whose threads asyncio.run joins at exit: a
    thread cannot be cancelled, so past its time limit or the shutdown its result is dropped). In
    an async handler, Task.cancelled() is for a look without waiting (its wait blocks the loop):
    the handler is cancelled anyway. An async handler past task_timeout, whose lease is lost, or still
    running shutdown_timeout after stop() is cancelled (after cancel_wait seconds). In
    transactional mode task.conn is the batch's AsyncConnection (its transaction): the handlers
    of a batch run one after another, each in a savepoint, as in Worker; a sync handler cannot use
    it. task.progress(x) returns an asyncio task to await for the answer (from a sync handler's
    thread: the answer). Cancelling run() stops the worker as stop() does, then cancels run()
    itself once the loop has ended."""

    def __init__(self, url: str, handlers: dict[str, Handler] | None = None, **options: Any) -> None:
        super().__init__(url, handlers, **options)
        self._poked: asyncio.Event | None = None     # set by stop() and by each task's end
        self._strays: set[asyncio.Task] = set()     # handlers cancelled and not waited for
        self._finishers: list[_AsyncDb] = []

    # -- on the loop -----------------------------------------------------------------------------
    def stop(self, now: bool = False, why: str = "") -> None:
        super().stop(now, why)
        self._poke()

    def _poke(self) -> None:
        """Wake the loop's waits (from the loop or from another thread)."""
        loop, poked = self._loop, self._poked
        if loop is None or poked is None or loop.is_closed():
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            poked.set()
        else:
            loop.call_soon_threadsafe(poked.set)

    async def _sleep(self, seconds: float, halted: Callable[[], bool] | None = None) -> None:
        """Sleep up to seconds, waking at stop() (when halted() says so: by default the worker's)."""
        if (halted or self._halt.is_set)():
            return
        await self._changed(seconds)

    async def _changed(self, seconds: float) -> None:
        """Wait up to seconds for stop() or a task's end."""
        assert self._poked is not None
        self._poked.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._poked.wait(), max(seconds, 0.0))

    async def run(self, should_stop: Callable[[], bool] = lambda: False,  # type: ignore[override]
                  install_signals: bool = False) -> Counters:
        """Work until stop(), should_stop(), (until_empty) no due task left, cancellation or
        (install_signals) SIGTERM/SIGINT (a second one: stop(now=True)); the counters. Raises
        Refused and Unreachable as Worker.run does."""
        if not self.handlers:
            raise ValueError("no handlers: register one with @worker.handler(stage) or handlers={stage: fn}")
        loop = asyncio.get_running_loop()
        self._loop, self._own_loop, self._poked = loop, False, asyncio.Event()
        if install_signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.on_signal, signum, None)
        working = asyncio.ensure_future(self._work(should_stop))
        try:
            return await asyncio.shield(working)
        except asyncio.CancelledError:
            self.stop()
            await working
            raise
        finally:
            if install_signals:
                for signum in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(signum)

    async def _work(self, should_stop: Callable[[], bool]) -> Counters:
        """Worker.run's loop, awaited."""
        self._sem = asyncio.Semaphore(self.concurrency)
        heartbeat = _AsyncHeartbeat(self)
        self._heartbeat = heartbeat  # type: ignore[assignment]
        self._aheartbeat = heartbeat
        beating = asyncio.ensure_future(heartbeat.run())
        maintaining = None
        if self.maintain_every > 0 and not self.until_empty:
            maintaining = asyncio.ensure_future(self._maintain())
        db = _AsyncDb(self, "main", self._halt.is_set, listen=True)
        recovered = False
        try:
            try:
                while not (self._halt.is_set() or should_stop()):
                    worked = await (self._run_locked_batch_async(db) if self.transactional else self._take_async(db))
                    if worked:
                        recovered = False
                    elif self.until_empty:
                        if await self._wait_for_a_task_async():
                            continue
                        if not recovered and self.maintain_every > 0:
                            recovered = True
                            await self._maintain_once(db)
                            continue
                        break
                    else:
                        for stage in self.stages:
                            if not stage.endswith("*"):
                                await self._stage_settings_async(db, stage)
                        await self._idle_async(db, should_stop)
            except Unreachable as e:
                log.error("stopping while the server is unreachable (%s): the tasks in hand that cannot be "
                          "recorded stay running until their leases run out, then reap_hung() hands them back", e)
                self.stop()
                await self._shut_down_async(db)
                raise
            self.stop()
            await self._shut_down_async(db)
        except Refused as e:
            log.error("%s: waiting does not cure this; stopping", e)
            self.stop()
            await self._shut_down_async(db)
            raise
        except psycopg.Error as e:
            self.stop()
            if transient(e):
                await self._shut_down_async(db)
                raise Unreachable(f"stopped while the server still answers {_one_line(e)}") from e
            log.error("%s: waiting does not cure this; stopping", _one_line(e), extra={"error": _one_line(e)})
            await self._shut_down_async(db)
            raise Refused(_one_line(e)) from e
        finally:
            self._halt.set()
            heartbeat.halt = True
            for job in (maintaining, beating):
                if job is not None:
                    job.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await job
            await db.close()
            for finisher in self._finishers:
                await finisher.close()
            self._finishers.clear()
        return self.counters

    async def _wait_for_a_task_async(self) -> bool:
        if not self._running:
            return False
        count = len(self._running)
        while len(self._running) >= count and not self._halt.is_set():
            await self._changed(0.5)
        return True

    async def _take_async(self, db: _AsyncDb) -> bool:
        while len(self._running) >= self.concurrency and not self._halt.is_set():
            await self._changed(0.5)
        if self._halt.is_set():
            return True
        stages = self.stages
        if len(stages) == 1 and not stages[0].endswith("*"):
            rows = await db.query(TAKE_ONE_TEXT if self.raw_payload else TAKE_ONE,
                                  (stages[0], stages[0], self.batch, self.lease, self.name))
        else:
            rows = await db.query(TAKE_SEVERAL_TEXT if self.raw_payload else TAKE_SEVERAL,
                                  (stages, self.batch, self.lease, self.name))
        for stage, task_id, payload, attempt, lease, period in rows:
            self._count("taken", 1)
            task = Task(task_id, payload, attempt, str(lease), stage,
                        _progress=functools.partial(self._progress, task_id))
            self._aheartbeat.add(task, max(float(period), 0.001))
            task.timeout = self.task_timeout if self.task_timeout is not None else \
                (await self._stage_settings_async(db, stage, True))[0]
            with self._slots:
                self._running[task_id] = (task, asyncio.ensure_future(self._run_task_async(task)))
        return bool(rows)

    def _progress(self, task_id: int, value: Any) -> Any:
        """Task.progress: on the loop, an asyncio task (await it for the answer); from a sync
        handler's thread, the answer."""
        assert self._loop is not None
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            return asyncio.ensure_future(self._aheartbeat.beat(task_id, value))
        return asyncio.run_coroutine_threadsafe(self._aheartbeat.beat(task_id, value), self._loop).result()

    async def _stage_settings_async(self, db: _AsyncDb, stage: str, taken: bool = False) -> tuple[float | None, bool]:
        """Worker._stage_settings, awaited."""
        known = self._settings_known(stage)
        if not self._settings_due(known, taken):
            assert known is not None
            return known[0], known[1]
        try:
            ((seconds, paused),) = await db.query(WORKER_SETTINGS, (stage,), holds=lambda: False)
        except psycopg.errors.UndefinedFunction:
            await db.close()
            try:
                seconds, paused = (await db.query(TASK_TIMEOUT, (stage,), holds=lambda: False))[0][0], False
            except psycopg.errors.UndefinedFunction:
                await db.close()
                seconds, paused = None, False
        except psycopg.Error as e:
            if not transient(e):
                raise
            return (known[0], known[1]) if known is not None else (None, False)
        return self._settings_seen(stage, known, seconds, bool(paused))

    async def _idle_async(self, db: _AsyncDb, should_stop: Callable[[], bool]) -> None:
        """Worker._idle: LISTEN (AsyncConnection.notifies) until a NOTIFY or idle_wait seconds."""
        end = time.monotonic() + self.idle_wait
        while not (self._halt.is_set() or should_stop()):
            left = end - time.monotonic()
            if left <= 0:
                return
            conn = await db.connected()
            if not db.listening:
                await self._sleep(min(left, 0.5))
                continue
            try:
                async for _ in conn.notifies(timeout=min(left, 0.5), stop_after=1):
                    return
            except psycopg.Error as e:
                if not _lost_connection(e, db.conn):
                    raise
                await db.lost(e)
                return

    async def _call(self, task: Task) -> tuple[str, Any]:
        """The handler: an async one awaited here, a sync one in a thread (_in_a_thread)."""
        try:
            handler = self._handler_for(task.stage)
            if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(getattr(handler, "__call__", None)):
                returned = await handler(task)
            else:
                returned = await _in_a_thread(handler, task)
                if inspect.isawaitable(returned):
                    returned = await returned
            return "ok", _outcome(returned)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - every failure of a handler is a failed attempt
            return "error", e

    async def _run_task_async(self, task: Task) -> None:
        """Worker._run_task as an asyncio task: at most `concurrency` at a time, the handler in an
        asyncio task of its own (cancelled past its time limit, a lost lease, the shutdown)."""
        try:
            async with self._sem:
                with tracing.task_span(task) as failed:
                    if self._aheartbeat.lost(task.id):   # released at shutdown while it waited for a slot
                        return
                    task.started = time.monotonic()
                    inner = asyncio.ensure_future(self._call(task))
                    deadline = None if task.timeout is None else task.started + task.timeout
                    while not inner.done() and not task._cancel.is_set():
                        if deadline is not None and time.monotonic() >= deadline:
                            task._cancel_now("timeout")
                            break
                        await asyncio.wait({inner}, timeout=0.5 if deadline is None else
                                           min(0.5, max(deadline - time.monotonic(), 0.0)))
                    if task._cancel.is_set() and not inner.done():
                        await asyncio.wait({inner}, timeout=self.cancel_wait)
                        if not inner.done():
                            inner.cancel()
                            self._strays.add(inner)
                            inner.add_done_callback(self._strays.discard)
                    outcome: list[tuple[str, Any]] = []
                    if inner.done() and not inner.cancelled():
                        outcome.append(inner.result())
                    if task.cancel_reason == "timeout":
                        self._count("timed_out", 1)
                    _cut_short(task, outcome, "; the handler was cancelled")
                    kind, value = outcome[0]
                    if kind == "error":
                        failed(value)
                    await self._record_async(task, kind, value)
        except Exception as e:  # noqa: BLE001 - a slot must not die silently
            self._not_recorded(task, e)
        finally:
            self._aheartbeat.done(task.id)
            with self._slots:
                self._running.pop(task.id, None)
            self._poke()

    async def _record_async(self, task: Task, kind: str, value: Any) -> None:
        """Worker._record, awaited: the same statement (_end_statement), retried while the lease holds."""
        extra = {"task_id": task.id, "stage": task.stage, "attempt": task.attempt}
        if not task._settle():
            return
        if self._aheartbeat.lost(task.id):
            log_task.warning("lease lost on %s: dropping the result", task.id, extra=extra)
            self._ended(task, "lost")
            return
        query, params, what, error = _end_statement(task, kind, value)
        holds = lambda: self._aheartbeat.holds(task.id)  # noqa: E731
        db = self._finishers.pop() if self._finishers else _AsyncDb(self, "finish", self._halt.is_set)
        try:
            try:
                ok = (await db.query(query, params, holds))[0][0]
            except (psycopg.Error, UnicodeError) as e:
                if query is not FAIL or (isinstance(e, psycopg.Error) and transient(e)):
                    raise
                params, error = _plain_failure(task, params, e)
                ok = (await db.query(query, params, holds))[0][0]
        except psycopg.Error as e:
            if not transient(e):
                raise
            log_task.warning("task %s not recorded while its lease held (%s): reap_hung() hands it back", task.id,
                             _one_line(e), extra={**extra, "error": _one_line(e)})
            self._ended(task, "unrecorded", _one_line(e), e)
            return
        finally:
            self._finishers.append(db)
        self._recorded(task, bool(ok), what, error, value)

    async def _shut_down_async(self, db: _AsyncDb) -> None:
        """Worker._shut_down, awaited."""
        said = time.monotonic()
        while self._running and time.monotonic() < (self._deadline or 0.0):
            await self._changed(min(0.5, max(0.0, (self._deadline or 0.0) - time.monotonic())))
            if self._running and time.monotonic() - said >= 5.0 and self._deadline is not None:
                said = time.monotonic()
                log.info("draining: %d task(s) still running, %.0f s left", len(self._running),
                         max(self._deadline - said, 0.0))
        left = list(self._running.values())
        if left:
            log.warning("%d task(s) still running %s: cutting them short, then releasing them (ready again, the attempt "
                        "not counted)", len(left), self._why)
        for task, _ in left:
            task._cancel_now("shutdown", self._why)
        cancel_end = time.monotonic() + self.cancel_wait + 0.6   # each task sees its cancel within 0.5 s
        while self._running and time.monotonic() < cancel_end:
            await self._changed(min(0.5, max(0.0, cancel_end - time.monotonic())))
        for task, running in list(self._running.values()):
            if not task._settle():   # its task is recording its end right now
                continue
            self._aheartbeat.done(task.id)
            running.cancel()
            try:
                ok = (await db.query(RELEASE, (task.id, task.lease, task.stage), holds=lambda: False))[0][0]
                log_task.warning("task %s still running %s: %s", task.id, self._why, "released" if ok else "lease lost",
                                 extra={"task_id": task.id, "stage": task.stage})
                self._ended(task, "released" if ok else "lost", f"still running {self._why}")
            except (psycopg.Error, Unreachable, Refused) as e:
                log_task.warning("task %s not released (%s): its lease runs out", task.id, e)
                self._ended(task, "unrecorded", str(e), e.__cause__ or e)

    async def _maintain(self) -> None:
        """_Maintainer as an asyncio task: queue.maintain_now() every maintain_every seconds."""
        conn: psycopg.AsyncConnection | None = None
        try:
            while True:
                await asyncio.sleep(self.maintain_every)
                try:
                    if conn is None or conn.closed or conn.broken:
                        conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True, prepare_threshold=None,
                                                                     connect_timeout=5)
                    async with conn.transaction():  # no row when another worker runs it now
                        rows = await (await conn.execute(MAINTAIN_NOW)).fetchall()
                    _maintained(rows)
                except psycopg.Error as e:
                    if not _maintain_failed(e, self.maintain_every):
                        return
        finally:
            if conn is not None:
                await conn.close()

    async def _maintain_once(self, db: _AsyncDb) -> None:
        """_maintain_once, awaited."""
        deadline = time.monotonic() + MAINTAIN_BUSY_WAIT
        try:
            while not await db.query(MAINTAIN_NOW, holds=lambda: False):
                if time.monotonic() > deadline:
                    log.warning("maintain: another session kept queue.maintain_now() busy for %.0f s; not waiting "
                                "longer", MAINTAIN_BUSY_WAIT)
                    return
                await asyncio.sleep(0.2)
        except psycopg.Error as e:
            _maintain_once_failed(e)

    async def _run_locked_batch_async(self, db: _AsyncDb) -> bool:
        """Worker._run_locked_batch on the AsyncConnection: one transaction, take_locked, each
        handler in a savepoint with task.conn, finish_locked or fail_locked, one commit."""
        conn = await db.connected()
        stages = self.stages
        try:
            async with conn.transaction():
                if len(stages) == 1 and not stages[0].endswith("*"):
                    cur = await conn.execute(TAKE_LOCKED_ONE, (stages[0], stages[0], self.batch))
                else:
                    cur = await conn.execute(TAKE_LOCKED_SEVERAL, (stages, self.batch))
                rows = await cur.fetchall()
                for stage, task_id, payload, attempt in rows:
                    self._count("taken", 1)
                    task = Task(task_id, payload, attempt, None, stage, conn=conn)
                    try:
                        with tracing.task_span(task):
                            async with conn.transaction():
                                kind, value = await self._call(task)
                                if kind == "error":
                                    raise value
                                next_stage, result = value
                                await conn.execute(FINISH_LOCKED, (task_id, self.name, stage,
                                                                   None if result is None else Jsonb(result)))
                                if next_stage is not None:
                                    raise Fatal("next_stage is not available in transactional mode")
                        self._count("finished", 1)
                        self.counters.finished_ids.append(task_id)
                    except Exception as e:  # noqa: BLE001 - the handler's writes are rolled back to the savepoint
                        if isinstance(e, psycopg.Error) and (_lost_connection(e, conn) or prepared_lost(e)):
                            raise
                        await conn.execute(FAIL_LOCKED, _locked_failure(task, e, self.name))
                        self._count("failed", 1)
        except psycopg.Error as e:
            if prepared_lost(e):
                self._pooler_found(e)
                await db.close()
                return True
            if _lost_connection(e, conn):
                await db.lost(e)
                return True
            if not transient(e) or self._halt.is_set():
                raise
            log.warning("main: %s; the batch rolled back, taking again", _one_line(e), extra={"error": _one_line(e)})
            await self._sleep(BACKOFF_FIRST)
            return True
        return bool(rows)


MAINTAIN_BUSY_WAIT = 60.0  # seconds until_empty waits for another session's maintain_now() to end


def _maintain_once(db: _Db) -> None:
    """queue.maintain_now() once (until_empty: expired leases come back before the worker decides
    the stages are empty); a login that may not run it, or an error that passes, is skipped. While
    another session runs it (no row: its lock is taken) this one tries again, up to
    MAINTAIN_BUSY_WAIT s: that session's reap may have begun before a lease expired."""
    deadline = time.monotonic() + MAINTAIN_BUSY_WAIT
    try:
        while not db.query(MAINTAIN_NOW, holds=lambda: False):
            if time.monotonic() > deadline:
                log.warning("maintain: another session kept queue.maintain_now() busy for %.0f s; not waiting longer",
                            MAINTAIN_BUSY_WAIT)
                return
            time.sleep(0.2)
    except psycopg.Error as e:
        _maintain_once_failed(e)


def _maintained(rows: list[tuple[Any, ...]]) -> None:
    """Log what a queue.maintain_now() round did."""
    for task, count, detail in rows:
        if count:  # the rollups run every round: routine, not news
            log.log(logging.DEBUG if task in ROUTINE_STEPS else logging.INFO,
                    "maintain: %s %s%s", task, count, f" ({detail})" if detail else "")


def _maintain_failed(e: psycopg.Error, every: float) -> bool:
    """A maintenance round failed: logged; False when this login may not maintain (no more rounds)."""
    if e.sqlstate == "42501":
        log.warning(MAINTAIN_DENIED, e.diag.message_primary)
        return False
    log.warning("maintain: %s; trying again in %g s", _one_line(e), every, extra={"error": _one_line(e)})
    return True


def _maintain_once_failed(e: psycopg.Error) -> None:
    """until_empty's queue.maintain_now() failed: a login that may not run it, or an error that
    passes, is skipped (logged); anything else raised."""
    if e.sqlstate != "42501" and not transient(e):
        raise e
    log.warning("maintain: %s: the tasks of a worker that died stay running until a maintenance runs", _one_line(e))


def _cut_short(task: Task, outcome: list[tuple[str, Any]], goes_on: str) -> None:
    """The outcome of a handler cut short: past its time limit the attempt fails (with the
    handler's own error when it raised one: it says more; goes_on is said when it did not end);
    lost or shutdown, when it did not end in cancel_wait, it is Interrupted (released)."""
    if task.cancel_reason == "timeout":
        if not outcome or outcome[0][0] == "ok":
            outcome.insert(0, ("error", Fail(f"timed out after {task.timeout:g} s (task_timeout)"
                                             + ("" if outcome else goes_on))))
    elif task.cancel_reason is not None and not outcome:
        outcome.append(("error", Interrupted(f"cut short {task.cancel_detail}".strip())))


def _locked_failure(task: Task, e: BaseException, worker: str) -> tuple[Any, ...]:
    """FAIL_LOCKED's parameters for what a handler raised in transactional mode (a Snooze is a
    failed attempt due again in its seconds), the failure logged."""
    error, fatal, retry_in = _failure(e)
    if isinstance(e, Snooze):
        retry_in = e.seconds
    log.warning("task %s (%s, attempt %s) failed%s: %s", task.id, task.stage, task.attempt, " for good" if fatal else "",
                error, extra={"task_id": task.id, "stage": task.stage, "attempt": task.attempt, "error": error,
                              "fatal": fatal})
    return task.id, storable(error), fatal, retry_in, worker, task.stage


def _outcome(value: Any) -> tuple[str | None, Any]:
    """(next_stage, result) from what a handler returned."""
    if isinstance(value, Outcome):
        return value.next_stage, value.result
    if value is None or isinstance(value, (dict, list)):
        return None, value
    raise Fatal(f"a handler returns None, an Outcome, a dict or a list, not {type(value).__name__}")


def _failure(e: BaseException) -> tuple[str, bool, float | None]:
    """(error text, fatal, retry_in) for what a handler raised: Fail's message, else the type and text."""
    if isinstance(e, Fail):
        return str(e), e.fatal, e.retry_in
    return f"{type(e).__name__}: {e}", False, None


def _end_statement(task: Task, kind: str, value: Any) -> tuple[str, tuple[Any, ...], str, str | None]:
    """The statement that records a task's end with its lease, its parameters, what the end is
    (finished, snoozed, released, failed, fatal) and the error text stored; a failure is logged
    here. kind is "ok" (value: (next_stage, result)) or "error" (value: what the handler raised); a
    task cut short by the shutdown is released whatever its handler raised."""
    extra = {"task_id": task.id, "stage": task.stage, "attempt": task.attempt}
    if kind == "error" and task.cancel_reason == "shutdown" and not isinstance(value, Interrupted):
        value = Interrupted(f"cut short {task.cancel_detail}: {_failure(value)[0]}")
    if kind == "ok":
        next_stage, result = value
        return FINISH, (task.id, task.lease, next_stage, task.stage, None if result is None else Jsonb(result)), \
            "finished", None
    if isinstance(value, Snooze):
        what, said = ("released", str(value)) if isinstance(value, Interrupted) else ("snoozed", None)
        return SNOOZE, (task.id, task.lease, value.seconds, task.stage), what, said
    error, fatal, retry_in = _failure(value)
    error = storable(error)  # as stored; a lone surrogate would also break a log handler's encoding
    log_task.warning("task %s (%s, attempt %s) failed%s: %s", task.id, task.stage, task.attempt,
                     " for good" if fatal else "", error, extra={**extra, "error": error, "fatal": fatal})
    return FAIL, (task.id, task.lease, error, fatal, retry_in, task.stage), "fatal" if fatal else "failed", error


def _plain_failure(task: Task, params: tuple[Any, ...], e: BaseException) -> tuple[tuple[Any, ...], str]:
    """FAIL's parameters again with a plain error text, when the handler's own was refused all the same."""
    log.warning("fail on %s: the error text was refused (%s); recording a plain one", task.id, _one_line(e))
    error = f"handler failed; its error text was refused ({type(e).__name__})"
    return (params[0], params[1], error, *params[3:]), error
