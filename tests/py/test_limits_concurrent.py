"""Concurrency limits under real concurrency: 8 worker processes, a sampler reading running counts.

Stage lim.max has max_running 3; stage lim.grp has group_limit 1 over 20 groups. Every worker is
a separate process ('spawn') taking small batches from both stages, holding each task a few ms,
sometimes failing it for a retry. A sampler connection in this process reads the running counts
(per stage, and the largest per group) in one statement every few ms for the whole run. The caps
must never be exceeded in any sample, the caps must actually be reached (the test saw contention),
and every task must end done exactly once.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest

import workload
from dev.testrun import create_database, drop_database

MAX_STAGE, GROUP_STAGE = "lim.max", "lim.grp"
MAX_RUNNING, GROUP_LIMIT = 3, 1
GROUPS, PER_GROUP = 20, 20          # 400 grouped tasks
MAX_TASKS = 400
WORKERS = 8
DEADLINE = 90.0                     # seconds; the run takes 5-15 s here, a hang fails instead of blocking

TAKE = "SELECT id, lease FROM queue.take_next(stage => %s, batch => %s, worker => %s)"
FINISH = "SELECT queue.finish(%s, %s)"
FAIL = "SELECT queue.fail(%s, %s, 'flaky', retry_in => interval '0')"
SAMPLE = """
SELECT (SELECT count(*) FROM queue.live_tasks t WHERE t.stage = %(max)s AND t.status = 'running'),
       (SELECT count(*) FROM queue.live_tasks t WHERE t.stage = %(grp)s AND t.status = 'running'),
       (SELECT coalesce(max(g.n), 0)
          FROM (SELECT count(*) AS n FROM queue.live_tasks t
                 WHERE t.stage = %(grp)s AND t.status = 'running' GROUP BY t.group_key) g)
"""


@pytest.fixture(scope="module")
def limits_db(admin_url: str, template_db: str) -> Iterator[str]:
    """A database built by the migrations, for this module."""
    url = create_database(admin_url, "limits", template=template_db)  # alembic upgrade head: what we ship
    try:
        yield url
    finally:
        drop_database(admin_url, url)


def work(url: str, index: int, stop: Any, out: str, seed: int, deadline: float) -> None:
    """Take 1-3 tasks from each stage in turn, hold each 1-6 ms, finish it (5 %: fail, retry now).

    Records every successful finish as (id, stage) and every successful fail as the id.
    """
    rng = random.Random(seed)
    name = f"lim-{index}"
    finished: list[tuple[int, str]] = []
    retried: list[int] = []
    lost = 0
    stages = [MAX_STAGE, GROUP_STAGE] if index % 2 else [GROUP_STAGE, MAX_STAGE]
    with psycopg.connect(workload.with_application_name(url, name), autocommit=True) as conn:
        while not stop.is_set() and time.monotonic() < deadline:
            worked = False
            for stage in stages:
                rows = conn.execute(TAKE, (stage, rng.randint(1, 3), name)).fetchall()
                worked |= bool(rows)
                for task_id, lease in rows:
                    time.sleep(rng.uniform(0.001, 0.006))
                    if rng.random() < 0.05:
                        ok = conn.execute(FAIL, (task_id, lease)).fetchone()[0]
                        if ok:
                            retried.append(task_id)
                    else:
                        ok = conn.execute(FINISH, (task_id, lease)).fetchone()[0]
                        if ok:
                            finished.append((task_id, stage))
                    lost += not ok
            if not worked:
                time.sleep(0.002)
    workload.write_record(out, {"index": index, "pid": os.getpid(), "finished": finished,
                                "retried": retried, "lost": lost})


class Sampler(threading.Thread):
    """Reads the running counts in one statement (one snapshot) every few ms until stopped."""

    def __init__(self, url: str) -> None:
        super().__init__(name="sampler", daemon=True)
        self.url = url
        self.halt = threading.Event()
        self.samples: list[tuple[int, int, int]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(workload.with_application_name(self.url, "sampler"),
                                 autocommit=True) as conn:
                while not self.halt.is_set():
                    row = conn.execute(SAMPLE, {"max": MAX_STAGE, "grp": GROUP_STAGE}).fetchone()
                    self.samples.append((int(row[0]), int(row[1]), int(row[2])))
                    time.sleep(0.002)
        except BaseException as e:  # reported by the test, not lost in the thread
            self.error = e


def test_limits_hold_under_eight_concurrent_workers(limits_db: str, tmp_path: Path):
    db = limits_db
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SELECT queue.configure_stage(%s, max_running => %s, max_attempts => 1000)",
                     (MAX_STAGE, MAX_RUNNING))
        conn.execute("SELECT queue.configure_stage(%s, group_limit => %s, max_attempts => 1000)",
                     (GROUP_STAGE, GROUP_LIMIT))
        max_ids = [r[0] for r in conn.execute(
            "SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[%s]), stage => %s)",
            (MAX_TASKS, MAX_STAGE)).fetchall()]
        group_of: dict[int, str] = {}
        # Groups interleaved in claim order: a round of every group, PER_GROUP rounds.
        for _ in range(PER_GROUP):
            for g in range(GROUPS):
                key = f"tenant-{g:02d}"
                task_id = conn.execute("SELECT queue.enqueue('{}', stage => %s, group_key => %s)",
                                       (GROUP_STAGE, key)).fetchone()[0]
                group_of[task_id] = key
    all_ids = max_ids + list(group_of)
    assert len(set(all_ids)) == MAX_TASKS + GROUPS * PER_GROUP

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    deadline = time.monotonic() + DEADLINE
    rng = random.Random(20240612)
    outs = [str(tmp_path / f"lim-{i}.pickle") for i in range(WORKERS)]
    procs = [ctx.Process(target=work, args=(db, i, stop, outs[i], rng.randrange(2**32), deadline + 10),
                         name=f"lim-{i}", daemon=True)
             for i in range(WORKERS)]
    sampler = Sampler(db)
    sampler.start()
    started = time.monotonic()
    try:
        for p in procs:
            p.start()
        with psycopg.connect(db, autocommit=True) as conn:
            while True:
                live = conn.execute("SELECT count(*) FROM queue.live_tasks WHERE stage = ANY(%s)",
                                    ([MAX_STAGE, GROUP_STAGE],)).fetchone()[0]
                if live == 0:
                    break
                assert time.monotonic() < deadline, f"{live} tasks still live after {DEADLINE} s: a hang"
                assert all(p.is_alive() for p in procs), \
                    f"a worker died: exit codes {[p.exitcode for p in procs]}"
                assert sampler.is_alive(), f"the sampler stopped: {sampler.error!r}"
                time.sleep(0.05)
        elapsed = time.monotonic() - started
    finally:
        workload.stop_processes(procs, stop)
        sampler.halt.set()
        sampler.join(10)
    assert sampler.error is None, f"the sampler failed: {sampler.error!r}"
    assert [p.exitcode for p in procs] == [0] * WORKERS
    records = [workload.read_record(o) for o in outs]

    # The sampler watched the whole run, and the caps held in every sample.
    samples = sampler.samples
    assert len(samples) >= 200, f"only {len(samples)} samples in {elapsed:.1f} s"
    max_running = max(s[0] for s in samples)
    group_running = max(s[1] for s in samples)
    per_group = max(s[2] for s in samples)
    over = [s for s in samples if s[0] > MAX_RUNNING or s[2] > GROUP_LIMIT]
    assert not over, f"{len(over)} samples over a cap (lim.max running, lim.grp running, most in a group): {over[:10]}"
    # Not vacuous: the cap was reached, and the group limit did not serialise the whole stage.
    assert max_running == MAX_RUNNING, f"lim.max never had {MAX_RUNNING} running (at most {max_running})"
    assert per_group == GROUP_LIMIT
    assert group_running >= 2, f"lim.grp never ran two groups at once (at most {group_running})"
    assert all(r["finished"] for r in records), "a worker finished nothing"

    # Every task ended done exactly once: in the workers' records and in queue.history.
    finishes = Counter(task_id for r in records for task_id, _ in r["finished"])
    twice = [t for t, c in finishes.items() if c > 1]
    assert not twice, f"tasks finished more than once: {twice[:10]}"
    assert set(finishes) == set(all_ids), (
        f"never finished: {sorted(set(all_ids) - set(finishes))[:10]}; "
        f"unexpected: {sorted(set(finishes) - set(all_ids))[:10]}")
    assert sum(r["lost"] for r in records) == 0, "a finish or fail found its lease gone (no lease expires here)"
    with psycopg.connect(db) as conn:
        history = conn.execute(
            "SELECT id, stage, status::text, group_key FROM queue.history WHERE id = ANY(%s)",
            (all_ids,)).fetchall()
    rows = Counter(task_id for task_id, *_ in history)
    assert all(c == 1 for c in rows.values()) and set(rows) == set(all_ids), \
        "queue.history must hold exactly one row per task"
    assert all(status == "done" for _, _, status, _ in history)
    assert all(group_of.get(task_id) == key for task_id, stage, _, key in history if stage == GROUP_STAGE), \
        "history keeps each grouped task's group_key"
    retries = sum(len(r["retried"]) for r in records)
    print(f"{len(all_ids)} tasks done once with {WORKERS} processes in {elapsed:.1f} s ({retries} retries); "
          f"{len(samples)} samples: lim.max at most {max_running} running, lim.grp at most "
          f"{group_running} running and {per_group} per group")
