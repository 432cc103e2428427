"""Workers die (SIGKILL), lose their connection (pg_terminate_backend) or come back too late:
every task is still done exactly once, none is lost, none stays live.

Leases are 1 second and retries immediate (backoff_base 0) so that recovery happens within the
test; a reaper thread calls queue.reap_hung() every 0.2 s, as a deployment's supervisor would.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest

import workload


class Reaper(threading.Thread):
    """Calls queue.reap_hung() every `interval` seconds on its own connection; sums what it recovered."""

    def __init__(self, url: str, interval: float = 0.2) -> None:
        super().__init__(name="reaper", daemon=True)
        self.url, self.interval = url, interval
        self.halt = threading.Event()
        self.reaped = 0
        self.calls = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while not self.halt.wait(self.interval):
                    self.reaped += conn.execute("SELECT queue.reap_hung()").fetchone()[0]
                    self.calls += 1
        except BaseException as e:  # reported by stop(): a reaper that died must fail the test
            self.error = e

    def stop(self) -> None:
        self.halt.set()
        self.join(10)


# Seconds a crash test may take at most, only against a hang: a drain takes seconds on a quiet
# machine and minutes under a second suite's load (45 s was too short there).
DEADLINE = 300.0

def configure_fast_recovery(conn: psycopg.Connection, stage: str) -> None:
    conn.execute("SELECT queue.configure_stage(%s, lease_duration => interval '1 second',"
                 " max_attempts => 100, backoff_base => interval '0')", (stage,))


def enqueue(conn: psycopg.Connection, stage: str, n: int) -> list[int]:
    payloads = [json.dumps({"n": k}) for k in range(n)]
    return [r[0] for r in conn.execute("SELECT queue.enqueue_batch(%s::jsonb[], stage => %s)",
                                       (payloads, stage)).fetchall()]


def wait_until(predicate, deadline: float, what: str, pause: float = 0.05) -> None:
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(pause)


def live_count(conn: psycopg.Connection, ids: list[int]) -> int:
    return conn.execute("SELECT count(*) FROM queue.live_tasks WHERE id = ANY(%s)", (ids,)).fetchone()[0]


def assert_each_done_once(conn: psycopg.Connection, stage: str, ids: list[int]) -> list[tuple]:
    """Exactly one 'done' row per id in queue.history, nothing else, nothing live; returns the rows."""
    rows = conn.execute("SELECT id, stage, status::text, attempt, error_text FROM queue.history"
                        " WHERE id = ANY(%s)", (ids,)).fetchall()
    per_id = Counter(r[0] for r in rows)
    assert not [i for i, c in per_id.items() if c > 1], "tasks with more than one history row"
    assert set(per_id) == set(ids), f"lost: {sorted(set(ids) - set(per_id))[:10]}"
    not_done = [r for r in rows if r[1:3] != (stage, "done")]
    assert not not_done, f"tasks that did not end done in {stage}: {not_done[:5]}"
    assert live_count(conn, ids) == 0, "tasks left in queue.live_tasks"
    return rows


def test_sigkilled_workers_lose_no_task(db: str, tmp_path: Path):
    stage, tasks, workers, kills = "crash", 1500, 6, 3
    rng = random.Random(4242)
    with psycopg.connect(db, autocommit=True) as conn:
        configure_fast_recovery(conn, stage)
        ids = enqueue(conn, stage, tasks)

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    deadline = time.monotonic() + DEADLINE
    procs: dict[str, mp.Process] = {}
    outs: dict[str, str] = {}

    def start(name: str) -> None:
        outs[name] = str(tmp_path / f"{name}.pickle")
        procs[name] = ctx.Process(target=workload.slow, args=(db, name, stage, stop, outs[name], deadline + 10),
                                  name=name, daemon=True)
        procs[name].start()

    reaper = Reaper(db)
    killed: list[str] = []
    stranded: set[int] = set()   # tasks a killed worker held when it died
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            for i in range(workers):
                start(f"crash-{i}")
            reaper.start()
            # All six hold leases before the clock for the kills starts.
            wait_until(lambda: conn.execute(
                "SELECT count(DISTINCT worker) FROM queue.live_tasks WHERE stage = %s AND status = 'running'",
                (stage,)).fetchone()[0] == workers, deadline, "all workers to take tasks")
            t0 = time.monotonic()
            for at in sorted(rng.uniform(0.1, 1.2) for _ in range(kills)):
                time.sleep(max(0.0, t0 + at - time.monotonic()))
                victim = rng.choice([n for n, p in procs.items()
                                     if n.startswith("crash-") and p.is_alive() and n not in killed])
                os.kill(procs[victim].pid, signal.SIGKILL)
                procs[victim].join(10)
                assert procs[victim].exitcode == -signal.SIGKILL
                killed.append(victim)
                # Its backend notices the closed socket and ends, rolling back what was in flight;
                # then what it still holds can only come back through reap_hung().
                wait_until(lambda: conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                    (victim,)).fetchone()[0] == 0, deadline, f"the backend of {victim} to end")
                stranded |= {r[0] for r in conn.execute(
                    "SELECT id FROM queue.live_tasks WHERE worker = %s AND status = 'running'",
                    (victim,)).fetchall()}
                start(f"replacement-{len(killed)}")
            wait_until(lambda: live_count(conn, ids) == 0, deadline, "the queue to drain", pause=0.2)
    finally:
        workload.stop_processes(list(procs.values()), stop)
        reaper.stop()
    assert reaper.error is None, f"reap_hung failed: {reaper.error!r}"

    assert len(killed) == kills
    assert [p.exitcode for n, p in procs.items() if n not in killed] == [0] * (len(procs) - kills)
    assert stranded, "the kills hit no worker holding a task: nothing was tested"
    assert reaper.reaped >= len(stranded)

    with psycopg.connect(db) as conn:
        rows = assert_each_done_once(conn, stage, ids)
    by_id = {r[0]: r for r in rows}
    # Each task a dead worker held came back through its lease and was done by someone else.
    unrecovered = [by_id[i] for i in stranded
                   if by_id[i][3] < 2 or not (by_id[i][4] or "").startswith("lease expired")]
    assert not unrecovered, f"stranded tasks not recovered by reap_hung: {unrecovered[:5]}"

    # The survivors never shared an attempt, and each finish they saw succeed is a done row.
    records = [workload.read_record(outs[n]) for n in procs if n not in killed]
    takes = Counter((tid, attempt) for r in records for tid, attempt, _ in r["takes"])
    assert not [k for k, c in takes.items() if c > 1], "two workers held the same attempt"
    finished = Counter(tid for r in records for tid in r["finished"])
    assert not [t for t, c in finished.items() if c > 1], "a task was finished twice"
    assert set(finished) <= set(by_id)
    assert len(finished) < tasks  # the killed workers had finished some too
    print(f"killed {killed}; {len(stranded)} tasks stranded, {reaper.reaped} reaped,"
          f" {sum(r['lost'] for r in records)} late finishes refused")


def test_terminated_connections_lose_no_task(db: str, tmp_path: Path):
    stage, tasks, workers, terminations = "term", 2000, 4, 8
    rng = random.Random(777)
    with psycopg.connect(db, autocommit=True) as conn:
        configure_fast_recovery(conn, stage)
        ids = enqueue(conn, stage, tasks)

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    deadline = time.monotonic() + DEADLINE
    names = [f"term-{i}" for i in range(workers)]
    outs = {n: str(tmp_path / f"{n}.pickle") for n in names}
    procs = [ctx.Process(target=workload.reference, args=(db, n, stage, stop, outs[n], deadline + 10),
                         name=n, daemon=True) for n in names]
    reaper = Reaper(db)
    terminated: Counter = Counter()
    try:
        with psycopg.connect(db, autocommit=True) as admin:
            for p in procs:
                p.start()
            reaper.start()
            wait_until(lambda: admin.execute(
                "SELECT count(DISTINCT worker) FROM queue.live_tasks WHERE stage = %s AND status = 'running'",
                (stage,)).fetchone()[0] == workers, deadline, "all workers to take tasks")
            while sum(terminated.values()) < terminations:
                assert time.monotonic() < deadline, "could not terminate enough worker backends"
                assert live_count(admin, ids) > 0, "the queue drained before the terminations were done"
                backends = admin.execute(
                    "SELECT pid, application_name FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name = ANY(%s)",
                    (names,)).fetchall()
                if backends:
                    pid, name = rng.choice(backends)
                    if admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]:
                        terminated[name] += 1
                time.sleep(0.15)
            wait_until(lambda: live_count(admin, ids) == 0, deadline, "the queue to drain", pause=0.2)
    finally:
        workload.stop_processes(procs, stop)
        reaper.stop()
    assert reaper.error is None, f"reap_hung failed: {reaper.error!r}"
    assert [p.exitcode for p in procs] == [0] * workers, "a worker did not survive losing its connection"
    records = {r["name"]: r for r in (workload.read_record(outs[n]) for n in names)}

    assert sum(terminated.values()) == terminations
    reconnects = sum(r["reconnects"] for r in records.values())
    # Each termination costs the worker it hit one reconnect, unless it hit it while connecting.
    assert 1 <= reconnects <= terminations, (reconnects, terminated)

    with psycopg.connect(db) as conn:
        rows = assert_each_done_once(conn, stage, ids)
    takes = Counter((tid, attempt) for r in records.values() for tid, attempt, _ in r["takes"])
    assert not [k for k, c in takes.items() if c > 1], "two workers held the same attempt"
    finished = Counter(tid for r in records.values() for tid in r["finished"])
    assert not [t for t, c in finished.items() if c > 1], "a task was finished twice"
    # A finish that committed just before its connection died is done but unknown to its worker.
    assert set(finished) <= {r[0] for r in rows}
    assert len(finished) <= tasks
    print(f"terminated {dict(terminated)}; {reconnects} reconnects, {reaper.reaped} reaped,"
          f" {len(finished)} finishes seen by workers of {tasks} done")


def test_late_finish_from_a_reaped_worker_changes_nothing(db: str):
    stage = "late"
    with psycopg.connect(db, autocommit=True) as admin, \
            psycopg.connect(db, autocommit=True) as first, \
            psycopg.connect(db, autocommit=True) as second:
        configure_fast_recovery(admin, stage)
        task_id = admin.execute("SELECT queue.enqueue('{\"late\": true}'::jsonb, stage => %s)",
                                (stage,)).fetchone()[0]
        take = "SELECT id, attempt, lease FROM queue.take_next(stage => %s, worker => %s)"
        taken = first.execute(take, (stage, "first")).fetchall()
        assert [(t[0], t[1]) for t in taken] == [(task_id, 1)]
        old_lease = taken[0][2]

        # The first worker hangs: its lease runs out and reap_hung takes the task back.
        admin.execute("UPDATE queue.live_tasks SET lease_expires = now() - interval '1 second' WHERE id = %s",
                      (task_id,))
        assert admin.execute("SELECT queue.reap_hung()").fetchone()[0] >= 1
        assert admin.execute("SELECT status::text, lease FROM queue.live_tasks WHERE id = %s",
                             (task_id,)).fetchone() == ("error", None)

        # A second worker takes it again: a new attempt with a new lease.
        taken = second.execute(take, (stage, "second")).fetchall()
        assert [(t[0], t[1]) for t in taken] == [(task_id, 2)]
        new_lease = taken[0][2]
        assert new_lease != old_lease

        def snapshot() -> tuple:
            return (admin.execute("SELECT to_jsonb(t) FROM queue.live_tasks t WHERE id = %s",
                                  (task_id,)).fetchone(),
                    admin.execute("SELECT count(*) FROM queue.history WHERE id = %s", (task_id,)).fetchone())

        before = snapshot()
        assert before[0] is not None and before[1] == (0,)
        # The first worker wakes up and reports, too late: nothing it says counts any more.
        assert first.execute("SELECT queue.finish(%s, %s)", (task_id, old_lease)).fetchone()[0] is False
        assert snapshot() == before
        assert first.execute("SELECT queue.finish(%s, %s, next_stage => 'late.next')",
                             (task_id, old_lease)).fetchone()[0] is False
        assert snapshot() == before
        assert first.execute("SELECT queue.fail(%s, %s, 'late failure')",
                             (task_id, old_lease)).fetchone()[0] is False
        assert first.execute("SELECT queue.fail(%s, %s, 'late failure', fatal => true)",
                             (task_id, old_lease)).fetchone()[0] is False
        assert snapshot() == before
        with pytest.raises(psycopg.Error) as lost:
            first.execute("SELECT queue.heartbeat(%s, %s)", (task_id, old_lease))
        assert lost.value.sqlstate == "SK001"
        assert snapshot() == before

        # The second worker's lease is the current one: it finishes the task, once.
        assert second.execute("SELECT queue.finish(%s, %s)", (task_id, new_lease)).fetchone()[0] is True
        assert first.execute("SELECT queue.finish(%s, %s)", (task_id, old_lease)).fetchone()[0] is False
        assert second.execute("SELECT queue.finish(%s, %s)", (task_id, new_lease)).fetchone()[0] is False
        history = admin.execute("SELECT stage, status::text, attempt, worker FROM queue.history WHERE id = %s",
                                (task_id,)).fetchall()
        assert history == [(stage, "done", 2, "second")]
        assert live_count(admin, [task_id]) == 0
