"""The server crashes (`pg_ctl stop -m immediate`) under full load and restarts: every enqueue whose
COMMIT returned is present, every task ends done exactly once, the reference workers reconnect.

This module starts its OWN durable cluster (fsync and synchronous_commit on, as PostgreSQL ships),
whatever TEST_DATABASE_URL says: it kills that server, and only a durable one promises that a
returned COMMIT survives a crash. Producers are processes that enqueue small batches and record the
ids of each batch whose call returned (autocommit: returned = committed); a call cut by the crash is
in doubt and its ids are unknown, so the check is "acknowledged ⊆ present", and every present task
must be done once. Workers are skiplock.worker.Worker (tests/py/workload.py `reference`), which
reconnects with backoff. Leases are 1 second and a reaper thread that reconnects too calls
reap_hung() every 0.2 s, so tasks that were running at the crash come back within the test.

Two crash points, one test each: 'early' (producers and workers both busy) and 'late' (the
producers are done, the workers are half-way through the backlog).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Iterator

import psycopg
import pytest

import workload
from skiplock import devdb, migrate

PRODUCERS, WORKERS = 2, 3
BATCHES, BATCH_SIZE = 60, 25          # per producer: 1,500 tasks each, 3,000 a round
ROUND_DEADLINE = 90.0                 # seconds; a round takes ~15 s here, a hang fails instead


@pytest.fixture(scope="module")
def crash_cluster() -> Iterator[devdb.Cluster]:
    """A durable cluster of this module's own, which the tests crash."""
    cluster = devdb.Cluster(durable=True).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def crash_db(crash_cluster: devdb.Cluster) -> str:
    url = crash_cluster.createdb("crash")
    migrate.upgrade(url)  # alembic upgrade head: what we ship
    return url


def produce(url: str, name: str, stage: str, batches: int, size: int, out: str, deadline: float) -> None:
    """Enqueue `batches` batches of `size` tasks, one call each; reconnect with backoff when the
    server goes away. Records the ids of every call that returned, and counts the calls in doubt
    (cut by the crash: they may or may not have committed)."""
    acknowledged: list[int] = []
    in_doubt = errors = 0
    conn: psycopg.Connection | None = None
    k = 0
    delay = 0.05
    while k < batches and time.monotonic() < deadline:
        sent = False
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(workload.with_application_name(url, name), autocommit=True)
                delay = 0.05
            sent = True
            payloads = [json.dumps({"producer": name, "batch": k, "n": j}) for j in range(size)]
            ids = [r[0] for r in conn.execute(
                "SELECT queue.enqueue_batch(payloads => %s::jsonb[], stage => %s)", (payloads, stage)).fetchall()]
            acknowledged.extend(ids)
            k += 1
            time.sleep(0.05)  # spread the load over several seconds, so the crash hits it
        except psycopg.OperationalError:
            errors += 1
            in_doubt += sent  # the call was sent: it may have committed
            try:
                if conn is not None:
                    conn.close()
            except Exception:
                pass
            conn = None
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
    if conn is not None:
        conn.close()
    workload.write_record(out, {"name": name, "acknowledged": acknowledged, "batches": k,
                                "in_doubt": in_doubt, "errors": errors})


class Reaper(threading.Thread):
    """reap_hung() every `interval` s on its own connection, reconnecting when the server restarts."""

    def __init__(self, url: str, interval: float = 0.2) -> None:
        super().__init__(name="reaper", daemon=True)
        self.url, self.interval = url, interval
        self.halt = threading.Event()
        self.reaped = self.calls = self.reconnects = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        conn = None
        try:
            while not self.halt.wait(self.interval):
                try:
                    if conn is None:
                        conn = psycopg.connect(self.url, autocommit=True, connect_timeout=2)
                    self.reaped += conn.execute("SELECT queue.reap_hung()").fetchone()[0]
                    self.calls += 1
                except psycopg.OperationalError:
                    self.reconnects += 1
                    if conn is not None:
                        conn.close()
                    conn = None
        except BaseException as e:  # anything but a lost connection fails the test
            self.error = e
        finally:
            if conn is not None:
                conn.close()

    def stop(self) -> None:
        self.halt.set()
        self.join(10)


def server_identity(url: str) -> tuple:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT pg_postmaster_start_time(), pg_backend_pid()").fetchone()


def stage_counts(url: str, stage: str) -> tuple[int, int]:
    """(tasks present: live + done, done) for a stage; (-1, -1) while the server is down."""
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            return conn.execute(
                "SELECT (SELECT count(*) FROM queue.live_tasks WHERE stage = %(s)s)"
                "     + (SELECT count(*) FROM queue.history WHERE stage = %(s)s),"
                "       (SELECT count(*) FROM queue.history WHERE stage = %(s)s)", {"s": stage}).fetchone()
    except psycopg.OperationalError:
        return (-1, -1)


def wait_until(predicate, deadline: float, what: str, pause: float = 0.05) -> None:
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(pause)


@pytest.mark.parametrize("crash_point", ["early", "late"])
def test_server_crash_under_load_loses_no_committed_task(crash_cluster: devdb.Cluster, crash_db: str,
                                                         crash_point: str, tmp_path: Path):
    stage = f"crash.{crash_point}"
    total = PRODUCERS * BATCHES * BATCH_SIZE
    with psycopg.connect(crash_db, autocommit=True) as conn:
        conn.execute("SELECT queue.configure_stage(stage => %s, lease_duration => interval '1 second',"
                     " max_attempts => 100, backoff_base => interval '0')", (stage,))
        assert conn.execute("SHOW fsync").fetchone()[0] == "on"
        assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    deadline = time.monotonic() + ROUND_DEADLINE
    p_outs = {f"producer-{i}": str(tmp_path / f"producer-{i}.pickle") for i in range(PRODUCERS)}
    w_outs = {f"worker-{i}": str(tmp_path / f"worker-{i}.pickle") for i in range(WORKERS)}
    producers = [ctx.Process(target=produce, args=(crash_db, n, stage, BATCHES, BATCH_SIZE, out, deadline),
                             name=n, daemon=True) for n, out in p_outs.items()]
    workers = [ctx.Process(target=workload.reference,
                           args=(crash_db, n, stage, stop, out, deadline + 10),
                           kwargs={"batch": 10, "per_task": 0.004}, name=n, daemon=True)
               for n, out in w_outs.items()]
    reaper = Reaper(crash_db)
    before = server_identity(crash_db)
    crash_at: tuple[int, int] = (0, 0)
    t0 = time.monotonic()
    try:
        for p in workers + producers:
            p.start()
        reaper.start()
        if crash_point == "early":
            # Producers still have most of their batches to send; workers have done some tasks.
            wait_until(lambda: (lambda c: c[0] >= total // 5 and c[1] >= 100)(stage_counts(crash_db, stage)),
                       deadline, "the load to build up")
        else:
            wait_until(lambda: all(not p.is_alive() for p in producers), deadline, "the producers to finish")
            wait_until(lambda: stage_counts(crash_db, stage)[1] >= total // 2, deadline,
                       "the workers to drain half the backlog")
        crash_at = stage_counts(crash_db, stage)
        assert crash_at[1] < total, "the queue drained before the crash: nothing was tested"
        crash_cluster.restart_after_crash()
        devdb.wait_ready(crash_db)
        crashed = time.monotonic() - t0

        for p in producers:
            p.join(max(0.0, deadline - time.monotonic()))
        assert [p.exitcode for p in producers] == [0] * PRODUCERS, "a producer did not survive the crash"
        wait_until(lambda: _drained(crash_db, stage), deadline, "the queue to drain", pause=0.2)
    finally:
        workload.stop_processes(workers + producers, stop)
        reaper.stop()
    elapsed = time.monotonic() - t0
    assert reaper.error is None, f"reap_hung failed: {reaper.error!r}"
    assert [p.exitcode for p in workers] == [0] * WORKERS, "a worker did not survive the crash"

    # The fault really happened: a new postmaster, which went through crash recovery.
    after = server_identity(crash_db)
    assert after[0] > before[0], "the server was not restarted"
    log = crash_cluster.logfile.read_text()
    assert "not properly shut down; automatic recovery in progress" in log, "no crash recovery in the log"

    produced = [workload.read_record(out) for out in p_outs.values()]
    worked = [workload.read_record(out) for out in w_outs.values()]
    acknowledged = [i for r in produced for i in r["acknowledged"]]
    assert all(r["batches"] == BATCHES for r in produced), "a producer gave up before its last batch"

    with psycopg.connect(crash_db) as conn:
        rows = conn.execute("SELECT id, status::text FROM queue.history WHERE stage = %s", (stage,)).fetchall()
        live = conn.execute("SELECT count(*) FROM queue.live_tasks WHERE stage = %s", (stage,)).fetchone()[0]
    per_id = Counter(i for i, _ in rows)
    assert live == 0, "tasks left in queue.live_tasks"
    assert not [i for i, c in per_id.items() if c > 1], "a task has more than one history row"
    assert {s for _, s in rows} == {"done"}, f"tasks that did not end done: {Counter(s for _, s in rows)}"
    missing = set(acknowledged) - set(per_id)
    assert not missing, f"acknowledged enqueues lost in the crash: {sorted(missing)[:10]}"
    # Only calls in doubt may have added tasks nobody was told about.
    unacknowledged = len(per_id) - len(set(acknowledged))
    in_doubt = sum(r["in_doubt"] for r in produced)
    assert 0 <= unacknowledged <= in_doubt * BATCH_SIZE, (unacknowledged, in_doubt)

    # Every finish a worker saw return true is durable, and none was seen twice.
    finished = Counter(i for r in worked for i in r["finished"])
    assert not [i for i, c in finished.items() if c > 1], "a task was finished twice"
    assert set(finished) <= set(per_id), "a finish that returned true was lost in the crash"
    # Every worker was connected when the server died, so every one had to reconnect.
    reconnects = {r["name"]: r["reconnects"] for r in worked}
    assert all(n >= 1 for n in reconnects.values()), f"workers that did not reconnect: {reconnects}"
    print(f"\n[{crash_point}] crash after {crashed:.1f} s at {crash_at[0]} present / {crash_at[1]} done of"
          f" {total}; {len(acknowledged)} acknowledged, {in_doubt} enqueue calls in doubt"
          f" ({unacknowledged} unacknowledged tasks committed); worker reconnects {reconnects};"
          f" reaper reaped {reaper.reaped}, reconnected {reaper.reconnects}; {len(per_id)} done once"
          f" in {elapsed:.1f} s")


def _drained(url: str, stage: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            return conn.execute("SELECT NOT EXISTS (SELECT FROM queue.live_tasks WHERE stage = %s)",
                                (stage,)).fetchone()[0]
    except psycopg.OperationalError:
        return False
