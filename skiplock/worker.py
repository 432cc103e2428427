"""A reference worker loop in Python over skiplock's SQL API.

Everything that decides anything lives in the database; this is the client side every language
writes once: take a batch, run a handler per task, finish or fail with the lease, sleep on
LISTEN when the stage is empty (poll through a transaction pooler: skiplock.connect), reconnect with backoff when the connection drops.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import psycopg
from psycopg.types.json import Jsonb

from skiplock import connect
from skiplock.db import one


@dataclass
class Task:
    id: int
    payload: Any          # the JSON object or array, as json.loads gives it
    attempt: int
    lease: str
    stage: str


class Fail(Exception):
    """Raise from a handler to fail the attempt; fatal=True means never retry."""

    def __init__(self, message: str, fatal: bool = False, retry_in: float | None = None) -> None:
        super().__init__(message)
        self.fatal = fatal
        self.retry_in = retry_in


@dataclass
class Outcome:
    """What a handler decided: finish (optionally moving to next_stage), keeping result (a JSON
    object or array: the run's result in queue.history, and with next_stage the task's payload there)."""
    next_stage: str | None = None
    result: dict[str, Any] | list[Any] | None = None


@dataclass
class Counters:
    taken: int = 0
    finished: int = 0
    failed: int = 0
    lost: int = 0          # finish/fail returned false: the lease was no longer ours
    reconnects: int = 0
    finished_ids: list[int] = field(default_factory=list)


Handler = Callable[[Task], "Outcome | None"]


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


class Worker:
    def __init__(self, url: str, handlers: dict[str, Handler], batch: int = 10,
                 idle_wait: float = 1.0, name: str | None = None) -> None:
        for stage in handlers:
            require_stage(stage)
        self.url = url
        self.handlers = handlers
        self.batch = batch
        self.idle_wait = idle_wait  # slow poll: a lost notification never strands a task
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.counters = Counters()
        self._stop = False
        self._listening = False

    def stop(self) -> None:
        self._stop = True

    def _connect(self) -> psycopg.Connection:
        delay = 0.1
        while True:
            try:
                conn = connect.connect(self.url)
                for stage in self.handlers:
                    self._listening = connect.listen(conn, channel(stage))
                return conn
            except psycopg.OperationalError:
                if self._stop:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def run(self, should_stop: Callable[[], bool] = lambda: False) -> Counters:
        conn = self._connect()
        try:
            while not (self._stop or should_stop()):
                try:
                    worked = False
                    for stage, handler in self.handlers.items():
                        worked |= self._drain_once(conn, stage, handler)
                    if not worked and not self._listening:  # through a transaction pooler
                        time.sleep(self.idle_wait)
                    elif not worked:
                        # Sleep until an enqueue notifies us, or the slow poll comes round.
                        for _ in conn.notifies(timeout=self.idle_wait, stop_after=1):
                            pass
                except psycopg.OperationalError:
                    # The server went away (restart, terminated backend): reconnect with backoff.
                    # Tasks we held come back through their leases and reap_hung().
                    self.counters.reconnects += 1
                    try:
                        conn.close()
                    except Exception:
                        pass
                    conn = self._connect()
        finally:
            conn.close()
        return self.counters

    def _drain_once(self, conn: psycopg.Connection, stage: str, handler: Handler) -> bool:
        rows = conn.execute(
            "SELECT id, payload, attempt, lease FROM queue.take_next(stage => %s, batch => %s, worker => %s)",
            (stage, self.batch, self.name)).fetchall()
        for task_id, payload, attempt, lease in rows:
            self.counters.taken += 1
            task = Task(task_id, payload, attempt, str(lease), stage)
            try:
                outcome = handler(task) or Outcome()
            except Exception as e:
                # A bug in the handler fails the attempt (retried per the stage's backoff) rather
                # than ending the loop with the rest of the batch still leased.
                f = e if isinstance(e, Fail) else Fail(f"{type(e).__name__}: {e}")
                ok = one(conn.execute(
                    "SELECT queue.fail(%s, %s, %s, fatal => %s, retry_in => %s::float8 * interval '1 second', "
                    "stage => %s)",
                    (task.id, task.lease, storable(str(f)), f.fatal, f.retry_in, task.stage)))[0]
                self.counters.failed += ok
                self.counters.lost += not ok
                continue
            ok = one(conn.execute("SELECT queue.finish(%s, %s, next_stage => %s, stage => %s, result => %s)",
                                  (task.id, task.lease, outcome.next_stage, task.stage,
                                   None if outcome.result is None else Jsonb(outcome.result))))[0]
            if ok:
                self.counters.finished += 1
                self.counters.finished_ids.append(task.id)
            else:
                self.counters.lost += 1
        return bool(rows)
