"""Worker entry points that the concurrency and crash tests run in separate processes.

Each entry point is a top-level function so that multiprocessing's 'spawn' context can start it:
a fresh interpreter, its own connection, nothing inherited from pytest. A worker records what it
saw (what it took, which finish/fail calls returned true) and, when stopped normally, writes the
record to `out` as a pickle; the test reads it after joining. A worker killed with SIGKILL writes
nothing, which is the point. Every loop also stops at `deadline` (time.monotonic()), so a test that
dies cannot leave a worker running for ever.
"""

from __future__ import annotations

import os
import pickle
import random
import time
from typing import Any

import psycopg

from skiplock.worker import Fail, Task, Worker

TAKE = "SELECT id, attempt, lease FROM queue.take_next(stage => %s, batch => %s, worker => %s)"
FINISH = "SELECT queue.finish(%s, %s, next_stage => %s)"
FAIL = "SELECT queue.fail(%s, %s, %s, fatal => %s, retry_in => %s::interval)"


def flush_stats(conn: psycopg.Connection) -> None:
    """This autocommit session's pending table statistics reach the server before its next statement.

    pg_stat_force_next_flush() from PostgreSQL 15 on. 14 has no such function: there a session
    reports to the statistics collector when a transaction ends at least 0.5 s after its last
    report, and readers accept a statistics file up to 0.5 s old, hence the waits either side.
    """
    if conn.info.server_version >= 150000:
        conn.execute("SELECT pg_stat_force_next_flush()")
    else:
        time.sleep(0.6)
        conn.execute("SELECT 1")
        time.sleep(0.6)


def with_application_name(url: str, name: str) -> str:
    """The same conninfo, naming the session so that pg_stat_activity can tell it apart."""
    return psycopg.conninfo.make_conninfo(url, application_name=name)


def write_record(out: str, record: dict[str, Any]) -> None:
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(record, f)
    os.replace(tmp, out)  # a reader never sees half a record


def read_record(out: str) -> dict[str, Any]:
    with open(out, "rb") as f:
        return pickle.load(f)


def drain(url: str, index: int, stages: list[str], hops: dict[str, str], stop: Any, out: str,
          seed: int, deadline: float, batch: int = 20, retry_rate: float = 0.05,
          fatal_rate: float = 0.01) -> None:
    """Take from every stage in turn; per attempt fail for good (fatal_rate), fail and retry at
    once (retry_rate), or finish (moving on to hops[stage] when the stage has a hop).

    Records takes as (id, stage, attempt, lease) and every call that returned true as
    (id, stage, outcome), outcome one of 'done', 'hop', 'retry', 'fatal'; counts calls that
    returned false in 'lost'.
    """
    rng = random.Random(seed)
    name = f"drain-{index}"
    takes: list[tuple[int, str, int, str]] = []
    results: list[tuple[int, str, str]] = []
    lost = 0
    order = stages[index % len(stages):] + stages[:index % len(stages)]
    with psycopg.connect(with_application_name(url, name), autocommit=True) as conn:
        while not stop.is_set() and time.monotonic() < deadline:
            worked = False
            for stage in order:
                rows = conn.execute(TAKE, (stage, batch, name)).fetchall()
                worked |= bool(rows)
                for task_id, attempt, lease in rows:
                    takes.append((task_id, stage, attempt, str(lease)))
                    roll = rng.random()
                    if roll < fatal_rate:
                        outcome = "fatal"
                        ok = conn.execute(FAIL, (task_id, lease, "bad input", True, None)).fetchone()[0]
                    elif roll < fatal_rate + retry_rate:
                        outcome = "retry"
                        ok = conn.execute(FAIL, (task_id, lease, "flaky", False, "0")).fetchone()[0]
                    else:
                        nxt = hops.get(stage)
                        outcome = "hop" if nxt else "done"
                        ok = conn.execute(FINISH, (task_id, lease, nxt)).fetchone()[0]
                    if ok:
                        results.append((task_id, stage, outcome))
                    else:
                        lost += 1
            if not worked:
                time.sleep(0.05)
    write_record(out, {"index": index, "pid": os.getpid(), "takes": takes, "results": results,
                       "lost": lost})


def grab(url: str, index: int, stage: str, batch: int, barrier: Any, out: str, deadline: float) -> None:
    """Take batches from one stage, finishing nothing, until a take returns no task."""
    name = f"grab-{index}"
    batches: list[list[tuple[int, str]]] = []
    with psycopg.connect(with_application_name(url, name), autocommit=True) as conn:
        conn.execute("SELECT 1")  # connected and warm before the start line
        barrier.wait(timeout=max(1.0, deadline - time.monotonic()))
        while time.monotonic() < deadline:
            rows = conn.execute(TAKE, (stage, batch, name)).fetchall()
            if not rows:
                break
            batches.append([(task_id, str(lease)) for task_id, _attempt, lease in rows])
    write_record(out, {"index": index, "name": name, "batches": batches})


def slow(url: str, name: str, stage: str, stop: Any, out: str, deadline: float,
         batch: int = 5, per_task: float = 0.01) -> None:
    """Take a batch, spend per_task seconds on each task, finish it: a worker worth killing
    mid-task (it nearly always holds leases)."""
    takes: list[tuple[int, int, str]] = []
    finished: list[int] = []
    lost = 0
    with psycopg.connect(with_application_name(url, name), autocommit=True) as conn:
        while not stop.is_set() and time.monotonic() < deadline:
            rows = conn.execute(TAKE, (stage, batch, name)).fetchall()
            if not rows:
                time.sleep(0.05)
                continue
            for task_id, attempt, lease in rows:
                takes.append((task_id, attempt, str(lease)))
                time.sleep(per_task)
                if conn.execute(FINISH, (task_id, lease, None)).fetchone()[0]:
                    finished.append(task_id)
                else:
                    lost += 1
    write_record(out, {"name": name, "pid": os.getpid(), "takes": takes, "finished": finished,
                       "lost": lost})


def reference(url: str, name: str, stage: str, stop: Any, out: str, deadline: float,
              batch: int = 5, per_task: float = 0.005) -> None:
    """skiplock.worker.Worker, the reference worker, on a connection named `name`; its handler
    records every task it is handed."""
    takes: list[tuple[int, int, str]] = []

    def handler(task: Task) -> None:
        takes.append((task.id, task.attempt, task.lease))
        time.sleep(per_task)
        if not isinstance(task.payload, dict):
            raise Fail("payload must be an object", fatal=True)

    worker = Worker(with_application_name(url, name), {stage: handler}, batch=batch,
                    idle_wait=0.2, name=name)
    counters = worker.run(should_stop=lambda: stop.is_set() or time.monotonic() >= deadline)
    write_record(out, {"name": name, "pid": os.getpid(), "takes": takes,
                       "finished": counters.finished_ids, "failed": counters.failed,
                       "lost": counters.lost, "reconnects": counters.reconnects,
                       "taken": counters.taken})


def stop_processes(procs: list[Any], stop: Any | None, timeout: float = 300) -> None:
    """Ask workers to stop, wait up to `timeout` seconds in all, then SIGKILL whatever is left.
    The default only guards against a hang: on a busy machine a worker may need tens of seconds to
    end its last call and write its record (30 s was once too short, with three suites running)."""
    if stop is not None:
        stop.set()
    end = time.monotonic() + timeout
    for p in procs:
        if p.pid is not None:
            p.join(max(0.0, end - time.monotonic()))
    for p in procs:
        if p.pid is not None and p.is_alive():
            p.kill()
            p.join(5)
