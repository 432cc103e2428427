"""A worker that waits on LISTEN while producers enqueue: W1 "while a worker waits".

It drains the stage (take_next of up to 1,000, finish_batch) whenever it is woken, and waits on
the stage's channel (with a 1 s slow poll) whenever a take finds nothing, which is when
take_next marks the stage as waited on. So the producers see the stage waited on as often as a
real idle-then-woken worker makes it: the cost of the wake-ups as deployed (bench/NOTIFY.md).
"""

from __future__ import annotations

import threading

import psycopg
import psycopg.sql


class WaitingWorker:
    def __init__(self, url: str, stage: str, poll: float = 1.0) -> None:
        self.url, self.stage, self.poll = url, stage, poll
        self.notifies = 0       # notifications received
        self.waits = 0          # empty takes, each followed by a wait
        self.finished = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"waiter-{stage}", daemon=True)
        self.error: BaseException | None = None

    def __enter__(self) -> "WaitingWorker":
        self._conn = psycopg.connect(self.url, autocommit=True)
        self._conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier("skiplock." + self.stage)))
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=self.poll + 10)
        self._conn.close()

    def _run(self) -> None:
        conn = self._conn
        try:
            while not self._stop.is_set():
                ids, leases = conn.execute(
                    "SELECT array_agg(t.id), array_agg(t.lease) FROM queue.take_next(%s, 1000) t",
                    (self.stage,)).fetchone()
                if ids:
                    conn.execute("SELECT queue.finish_batch(%s, %s)", (ids, leases))
                    self.finished += len(ids)
                    continue
                self.waits += 1
                for _ in conn.notifies(timeout=self.poll, stop_after=1):
                    self.notifies += 1
        except BaseException as e:  # reported by the caller
            if not self._stop.is_set():
                self.error = e
