"""The hot table stays the size of its backlog, however many tasks pass through it.

A producer keeps a live backlog of at most BACKLOG tasks in one stage while WORKERS processes
take (take_next, batch 100) and finish (finish_batch) TOTAL tasks in all, at most RATE tasks a
second together, with autovacuum on as by default. Throughout, pg_table_size and pg_indexes_size
of queue.live_tasks are sampled; they must stay within a bound set by what a freshly loaded
BACKLOG-row table needs, which does not depend on TOTAL. Every task must be processed exactly once. Then the history of the run goes by
rotation: rotate_partitions drops the partitions that hold it, never deleting row by row.

TOTAL is SKIPLOCK_HOT_TABLE_TASKS (default 500,000: without vacuum, or with a table that kept finished
rows, the hot table passes the bound within about 330,000 tasks, so the test can fail; the issue's
figure, 1,000,000, also passes); develop with SKIPLOCK_HOT_TABLE_TASKS=50000 (which cannot fail).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

import psycopg

import workload

STAGE = "hot.bound"
TOTAL = int(os.environ.get("SKIPLOCK_HOT_TABLE_TASKS", "500000"))
BACKLOG = min(10_000, TOTAL)   # live tasks the producer keeps at most
CHUNK = 1_000                  # tasks per enqueue_batch
TAKE_BATCH = 100
WORKERS = 4
# The workers are paced. How big the table gets is what they process between two autovacuum
# passes, and unpaced they take both cores, so autovacuum falls behind: the peak then measured
# how saturated the machine was, not the queue (unpaced, 48,000 to 60,000 tasks/s on 2 cores:
# 110 to 141 MB, one CI run over the bound). At 30,000 tasks/s the peak was 21 to 23 MB.
RATE = int(os.environ.get("SKIPLOCK_HOT_TABLE_RATE", "30000"))
# No bound on how fast the load goes (a loaded machine may run it at a tenth of its speed: one CI
# run's full suite did 175,000 tasks in 260 s where alone it does 500,000 in 30 s); a hang fails
# instead of blocking: no task finished for STALL seconds, or the whole load past CAP.
STALL = 120.0
CAP = 1800.0
SAMPLE_EVERY = 0.5                # seconds between size samples
MB = 1024 * 1024

SIZES = """
    SELECT pg_table_size('queue.live_tasks'), pg_indexes_size('queue.live_tasks'),
           coalesce(s.n_dead_tup, 0), coalesce(s.autovacuum_count, 0)
      FROM (SELECT 1) one LEFT JOIN pg_stat_user_tables s ON s.relid = 'queue.live_tasks'::regclass"""


def work(url: str, index: int, stage: str, stop: Any, done: Any, out: str, deadline: float) -> None:
    """Take batches of TAKE_BATCH and finish each batch with one finish_batch call, until told
    to stop. Adds what finish_batch ended to the shared counter `done` (the producer paces on it
    without counting rows in the hot table, which would itself prune its pages)."""
    name = f"hot-{index}"
    taken = finished = calls = 0
    per_second = RATE / WORKERS
    with psycopg.connect(workload.with_application_name(url, name), autocommit=True) as conn:
        started = time.monotonic()
        while not stop.is_set() and time.monotonic() < deadline:
            ahead = started + taken / per_second - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            rows = conn.execute("SELECT id, lease FROM queue.take_next(stage => %s, batch => %s, worker => %s)",
                                (stage, TAKE_BATCH, name)).fetchall()
            if not rows:
                time.sleep(0.02)
                continue
            taken += len(rows)
            n = conn.execute("SELECT queue.finish_batch(%s::bigint[], %s::uuid[])",
                             ([r[0] for r in rows], [r[1] for r in rows])).fetchone()[0]
            finished += n
            calls += 1
            with done.get_lock():
                done.value += n
    workload.write_record(out, {"index": index, "taken": taken, "finished": finished, "calls": calls})


def enqueue(conn: psycopg.Connection, start: int, count: int) -> list[int]:
    payloads = [f'{{"n": {n}}}' for n in range(start, start + count)]
    return [r[0] for r in conn.execute("SELECT queue.enqueue_batch(%s::jsonb[], stage => %s)",
                                       (payloads, STAGE)).fetchall()]


def test_hot_table_stays_bounded_and_history_rotates_away(db: str, tmp_path: Path):
    with psycopg.connect(db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM queue.live_tasks").fetchone()[0] == 0
        assert conn.execute("SHOW autovacuum").fetchone()[0] == "on"

        # What the backlog needs: the hot table freshly loaded with BACKLOG ready tasks (the run
        # starts from exactly this backlog).
        ids: list[int] = []
        while len(ids) < BACKLOG:
            ids += enqueue(conn, len(ids), min(CHUNK, BACKLOG - len(ids)))
        fresh_table, fresh_indexes, _, _ = conn.execute(SIZES).fetchone()
        fresh = fresh_table + fresh_indexes
        # The bound: 50 freshly loaded backlogs plus 16 MB (the smallest sizes of a table and
        # its four indexes, free space and visibility maps), about 120 MB. It does not depend on
        # TOTAL: a hot table that kept finished rows, or index entries of them, breaks it within
        # a few hundred thousand tasks. What it does depend on: each task leaves dead versions
        # behind (the insert's, superseded by the take's update, which the finish deletes) and
        # index entries, and only vacuum makes that space reusable (measured: ~0.27 KB of heap
        # and ~0.09 KB of index per task, so ~360 MB for a million tasks without vacuum). So the
        # table peaks at about the churn between two autovacuum passes: on a 2-core machine at
        # 30,000 tasks/s (RATE), with autovacuum_naptime 1 s, a pass came about every second and
        # the peak was 21 to 23 MB. With the default naptime of 1 min this test fails, and the
        # answer is a shorter naptime (or a VACUUM of queue.live_tasks every few seconds), not a
        # looser bound.
        bound = 50 * fresh + 16 * MB

        ctx = mp.get_context("spawn")
        stop = ctx.Event()
        done = ctx.Value("q", 0)
        deadline = time.monotonic() + CAP
        outs = [str(tmp_path / f"hot-{i}.pickle") for i in range(WORKERS)]
        procs = [ctx.Process(target=work, args=(db, i, STAGE, stop, done, outs[i], deadline + 10),
                             name=f"hot-{i}", daemon=True)
                 for i in range(WORKERS)]
        # (elapsed s, processed, table bytes, index bytes, dead tuples, autovacuum runs)
        samples: list[tuple[float, int, int, int, int, int]] = []
        started = time.monotonic()
        try:
            for p in procs:
                p.start()
            last_sample = 0.0
            progressed, progressed_at = 0, started
            while True:
                processed = done.value
                now = time.monotonic()
                if processed > progressed:
                    progressed, progressed_at = processed, now
                if now - last_sample >= SAMPLE_EVERY:
                    samples.append((now - started, processed, *conn.execute(SIZES).fetchone()))
                    last_sample = now
                live = len(ids) - processed
                if len(ids) < TOTAL and live <= BACKLOG - CHUNK:
                    ids += enqueue(conn, len(ids), min(CHUNK, TOTAL - len(ids)))
                    continue
                if processed >= TOTAL:
                    break
                assert now - progressed_at < STALL and now < deadline, (
                    f"{processed} of {TOTAL} tasks processed after {now - started:.0f} s, none in the last "
                    f"{now - progressed_at:.0f} s: a hang; last samples (s, processed, table, index bytes, dead "
                    f"tuples, autovacuums): {samples[-5:]}")
                assert all(p.is_alive() for p in procs), f"a worker died: exit codes {[p.exitcode for p in procs]}"
                time.sleep(0.01)
            elapsed = time.monotonic() - started
            samples.append((elapsed, done.value, *conn.execute(SIZES).fetchone()))
        finally:
            workload.stop_processes(procs, stop)

        assert [p.exitcode for p in procs] == [0] * WORKERS, "a worker failed (an error in take_next or finish_batch?)"
        records = [workload.read_record(o) for o in outs]
        assert sum(r["finished"] for r in records) == TOTAL
        assert [r["taken"] - r["finished"] for r in records] == [0] * WORKERS, "finish_batch skipped a lease it was given"

        # The sizes: print them, then the bound and the no-growth check.
        total_sizes = [t + i for _, _, t, i, _, _ in samples]
        print(f"\n{TOTAL} tasks by {WORKERS} workers in {elapsed:.1f} s ({TOTAL / elapsed:.0f} tasks/s); "
              f"fresh {BACKLOG}-row table {fresh_table / MB:.2f} MB + indexes {fresh_indexes / MB:.2f} MB; "
              f"bound {bound / MB:.1f} MB; peak {max(total_sizes) / MB:.2f} MB")
        print("   s   processed  table MB  index MB  dead tuples  autovacuums")
        step = max(1, len(samples) // 40)
        for k, (t, n, tb, ib, dead, av) in enumerate(samples):
            if k % step == 0 or k == len(samples) - 1:
                print(f"{t:6.1f} {n:10d} {tb / MB:9.2f} {ib / MB:9.2f} {dead:12d} {av:12d}")
        worst = max(samples, key=lambda s: s[2] + s[3])
        assert max(total_sizes) <= bound, (
            f"queue.live_tasks + indexes reached {max(total_sizes) / MB:.1f} MB at {worst[1]} tasks processed, "
            f"over the bound {bound / MB:.1f} MB (50 × {fresh / MB:.2f} MB fresh + 16 MB)")
        # No separate "no growth" check: pg_table_size only shrinks when vacuum can truncate the
        # table's tail, so the size keeps the high-water mark of the busiest stretch between two
        # autovacuum passes, and on a loaded machine such a stretch can come late in the run (CI
        # twice saw a plateau reached in the third quarter: a sample at the end and the floor of
        # the last quarter both failed a comparison with earlier quarters). What the issue asks,
        # a size that tracks the backlog and not the total processed, is the bound above: it does
        # not depend on TOTAL, and a hot table that kept finished rows (or their index entries)
        # passes it within a few hundred thousand of the million tasks.

        # Exactly once: one 'done' history row per enqueued id, nothing else, nothing left live.
        assert len(ids) == TOTAL
        assert conn.execute("SELECT count(*) FROM queue.live_tasks WHERE stage = %s", (STAGE,)).fetchone()[0] == 0
        rows, distinct, done_rows = conn.execute("""
            SELECT count(*), count(DISTINCT id), count(*) FILTER (WHERE status = 'done')
              FROM queue.history WHERE stage = %s""", (STAGE,)).fetchone()
        assert (rows, distinct, done_rows) == (TOTAL, TOTAL, TOTAL)
        history_ids = {r[0] for r in conn.execute("SELECT id FROM queue.history WHERE stage = %s", (STAGE,))}
        assert history_ids == set(ids), (
            f"missing: {sorted(set(ids) - history_ids)[:10]}; strangers: {sorted(history_ids - set(ids))[:10]}")

        # Old history goes by rotation. The run's rows sit in dated partitions (today's, or
        # tomorrow's past midnight UTC), none in the default, which would be truncated instead.
        holders = dict(conn.execute("""
            SELECT tableoid::regclass::text, count(*) FROM queue.history WHERE stage = %s GROUP BY 1""",
                                    (STAGE,)).fetchall())
        assert "queue.history_default" not in holders, holders
        conn.execute("SET statement_timeout = '60s'")
        conn.execute("SELECT queue.configure_history(retention => '1 day')")
        # Autovacuum may still be working through the million rows just written: rotation skips a
        # partition it holds ('skipped: busy'), by design, and a deployment's next maintain() call
        # tries again. So does the test, for up to a minute.
        t0 = time.monotonic()
        dropped: set[str] = set()
        for _ in range(60):
            actions = conn.execute(
                "SELECT action, partition, detail FROM queue.rotate_partitions(now => now() + interval '10 days')"
            ).fetchall()
            dropped |= {p for a, p, _ in actions if a == "dropped"}
            if not [a for a, _, _ in actions if a.startswith("skipped")]:
                break
            time.sleep(1)
        took = time.monotonic() - t0
        print(f"rotation in {took:.2f} s: {len(dropped)} partitions dropped, the run's rows in {holders}")
        assert set(holders) <= dropped, f"partitions holding the run not dropped: {actions}"
        assert not [a for a, _, _ in actions if a.startswith("skipped") or a == "truncated"], actions
        assert conn.execute("SELECT count(*) FROM queue.history WHERE stage = %s", (STAGE,)).fetchone()[0] == 0
        # Dropped, not emptied: the tables are gone.
        assert [conn.execute("SELECT to_regclass(%s)", (p,)).fetchone()[0] for p in holders] == [None] * len(holders)
