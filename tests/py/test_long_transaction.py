"""A long transaction holds back the xmin horizon while producers and workers run: the workers keep
working (no error, no task stuck, every task done once).

The issue speaks of minutes: the hold lasts HOLD_SECONDS (half a minute; the W3 benchmark holds
two, and measures what this test does not assert: speed). During the hold no dead row version of
queue.live_tasks can be removed (by vacuum or by pruning), which is what slows SKIP LOCKED queues
down; the test reports throughput before, during and after the hold, and dead tuples, without
asserting any speed. No verdict depends on how fast the machine is: the drain after the hold is
waited for (bounded only against a hang).
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
from dev import testrun

# Half a minute (a minute until 2026-11-27): some 30 autovacuum naptimes that can remove nothing,
# thousands of tasks whose dead versions every claim has to pass. The test asserts no speed, only
# that workers neither fail nor stall, and that does not change between the 30th second and the
# 60th; the W3 benchmark holds two minutes and measures the speed.
HOLD_SECONDS = 30.0
# Seconds for the backlog to drain once the producer stops: only against a hang. Under a load of
# 12 on 2 cores the workers finished ~50 tasks/s and a drain took minutes (180 s was nearly met).
DRAIN_BOUND = 600.0
BEFORE_SECONDS = 5.0     # load without the hold, to compare
AFTER_SECONDS = 5.0
WORKERS = 2
RATE_BATCH, RATE_PAUSE = 20, 0.05   # the producer: 20 tasks every 50 ms, about 400 tasks/s at most
STAGE = "longtx"
HOLDER = "longtx-holder"


@pytest.fixture(scope="module")
def longtx_db(admin_url: str, template_db: str) -> Iterator[str]:
    url = testrun.create_database(admin_url, "long_transaction", template=template_db)  # alembic upgrade head: what we ship
    try:
        yield url
    finally:
        testrun.drop_database(admin_url, url)


class Producer(threading.Thread):
    def __init__(self, url: str) -> None:
        super().__init__(name="producer", daemon=True)
        self.url = url
        self.halt = threading.Event()
        self.ids: list[int] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                k = 0
                while not self.halt.is_set():
                    batch = [json.dumps({"n": k + j}) for j in range(RATE_BATCH)]
                    self.ids += [r[0] for r in conn.execute(
                        "SELECT queue.enqueue_batch(payloads => %s::jsonb[], stage => %s)", (batch, STAGE)).fetchall()]
                    k += RATE_BATCH
                    time.sleep(RATE_PAUSE)
        except BaseException as e:
            self.error = e


def test_workers_keep_working_while_a_transaction_holds_the_xmin_horizon(longtx_db: str, tmp_path: Path):
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    total = BEFORE_SECONDS + HOLD_SECONDS + AFTER_SECONDS + DRAIN_BOUND
    deadline = time.monotonic() + total + 60
    outs = {f"longtx-{i}": str(tmp_path / f"longtx-{i}.pickle") for i in range(WORKERS)}
    workers = [ctx.Process(target=workload.reference, args=(longtx_db, n, STAGE, stop, out, deadline),
                           kwargs={"batch": 10, "per_task": 0.001}, name=n, daemon=True)
               for n, out in outs.items()]
    producer = Producer(longtx_db)
    marks: dict[str, object] = {}
    with psycopg.connect(longtx_db, autocommit=True) as admin, \
            psycopg.connect(workload.with_application_name(longtx_db, HOLDER)) as holder:
        def now() -> object:
            return admin.execute("SELECT clock_timestamp()").fetchone()[0]

        def dead_tuples() -> int:
            admin.execute("SELECT pg_stat_clear_snapshot()")
            return admin.execute("SELECT n_dead_tup FROM pg_stat_user_tables"
                                 " WHERE relid = 'queue.live_tasks'::regclass").fetchone()[0]

        try:
            for p in workers:
                p.start()
            producer.start()
            marks["start"] = now()
            time.sleep(BEFORE_SECONDS)

            marks["hold"] = now()
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT 1")
            held = admin.execute("SELECT backend_xmin::text::bigint, state FROM pg_stat_activity"
                                 " WHERE application_name = %s", (HOLDER,)).fetchone()
            assert held is not None and held[0] is not None, "the holder has no snapshot: nothing is held"
            assert held[1] == "idle in transaction"
            xid_at_hold = admin.execute("SELECT txid_current()").fetchone()[0]
            dead_at_hold = dead_tuples()
            time.sleep(HOLD_SECONDS)
            still = admin.execute("SELECT backend_xmin::text::bigint, state FROM pg_stat_activity"
                                  " WHERE application_name = %s", (HOLDER,)).fetchone()
            # The horizon stayed where the hold put it while the rest of the cluster moved on.
            assert still == held, (held, still)
            oldest = admin.execute("SELECT min(backend_xmin::text::bigint) FROM pg_stat_activity"
                                   " WHERE backend_xmin IS NOT NULL").fetchone()[0]
            assert oldest <= held[0]
            xid_after_hold = admin.execute("SELECT txid_current()").fetchone()[0]
            assert xid_after_hold - xid_at_hold > 100, "too little happened during the hold to test anything"
            dead_end_of_hold = dead_tuples()
            marks["release"] = now()
            holder.rollback()

            time.sleep(AFTER_SECONDS)
            marks["end"] = now()
            producer.halt.set()
            producer.join(60)
            assert producer.error is None, f"the producer failed: {producer.error!r}"
            # Nothing stuck: the backlog drains soon after the producer stops.
            end = time.monotonic() + DRAIN_BOUND
            while admin.execute("SELECT count(*) FROM queue.live_tasks WHERE stage = %s",
                                (STAGE,)).fetchone()[0]:
                assert time.monotonic() < end, f"tasks still live {DRAIN_BOUND:.0f} s after the producer stopped"
                assert all(p.is_alive() for p in workers), "a worker died while tasks were live"
                time.sleep(0.2)
        finally:
            producer.halt.set()
            workload.stop_processes(workers, stop)

        assert [p.exitcode for p in workers] == [0] * WORKERS, "a worker died (an error escaped it)"
        records = [workload.read_record(out) for out in outs.values()]
        assert [(r["failed"], r["lost"], r["reconnects"]) for r in records] == [(0, 0, 0)] * WORKERS

        ids = producer.ids
        rows = admin.execute("SELECT id, status::text FROM queue.history WHERE stage = %s", (STAGE,)).fetchall()
        per_id = Counter(i for i, _ in rows)
        assert set(per_id) == set(ids), "tasks lost"
        assert max(per_id.values()) == 1, "a task has more than one history row"
        assert {s for _, s in rows} == {"done"}
        finished = Counter(i for r in records for i in r["finished"])
        assert set(finished) == set(ids) and max(finished.values()) == 1

        def rate(a: str, b: str) -> float:
            n, secs = admin.execute(
                "SELECT count(*), extract(epoch FROM %s::timestamptz - %s::timestamptz)::float8 FROM queue.history"
                " WHERE stage = %s AND finished >= %s AND finished < %s",
                (marks[b], marks[a], STAGE, marks[a], marks[b])).fetchone()
            return n / secs
        print(f"\nheld xmin {held[0]} for {HOLD_SECONDS:.0f} s while {xid_after_hold - xid_at_hold} xids passed;"
              f" {len(ids)} tasks done once; done/s before {rate('start', 'hold'):.0f},"
              f" during {rate('hold', 'release'):.0f}, after {rate('release', 'end'):.0f};"
              f" dead tuples in live_tasks {dead_at_hold} at hold, {dead_end_of_hold} at release,"
              f" {dead_tuples()} at the end")
