"""The queue core under real concurrency: many worker processes, one database, no task lost or run twice.

Every worker is a separate process ('spawn': a fresh interpreter) with its own connection, running
tests/py/workload.py. The workers' own records and queue.history must tell the same story.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import random
import time
from collections import Counter, defaultdict
from pathlib import Path

import psycopg

import workload

INGEST, PUBLISH, AUDIT = "cc.ingest", "cc.publish", "cc.audit"
STAGES = [INGEST, PUBLISH, AUDIT]
HOPS = {INGEST: PUBLISH}                      # finishing in ingest moves the task on to publish
# 10,000 tasks. What this proves is per call, not per total: each of the 8 processes makes hundreds
# of takes, finishes and fails on the same three stages while the producer still enqueues, so
# claims collide on nearly every call (SKIP LOCKED skips rows another process just locked), and a
# task handed out twice, lost or retried without a new attempt shows within the first thousands.
# 50,000 (until 2026-11-27) only made the drain last longer: about 5 × the CPU for no new case.
PLAN = {INGEST: 4_000, PUBLISH: 3_000, AUDIT: 3_000}
CHUNK = 500   # 20 chunks: the enqueue interleaves with the drain
PRIORITIES = [-1, 0, 1, 2]
WORKERS = 8
DRAIN_DEADLINE = 240.0  # seconds; the drain takes ~6 s on an idle 2-core machine; a hang fails instead of blocking


def _spawn() -> mp.context.SpawnContext:
    return mp.get_context("spawn")


def test_workers_drain_10000_tasks_with_failures_and_a_pipeline_exactly_once(db: str, tmp_path: Path):
    rng = random.Random(20240611)
    with psycopg.connect(db, autocommit=True) as conn:
        for stage in STAGES:
            # Plenty of attempts: a retried task must end only by finishing or by a fatal fail.
            conn.execute("SELECT queue.configure_stage(%s, max_attempts => 1000)", (stage,))

    ctx = _spawn()
    stop = ctx.Event()
    deadline = time.monotonic() + DRAIN_DEADLINE
    outs = [str(tmp_path / f"drain-{i}.pickle") for i in range(WORKERS)]
    procs = [ctx.Process(target=workload.drain,
                         args=(db, i, STAGES, HOPS, stop, outs[i], rng.randrange(2**32), deadline + 10),
                         name=f"drain-{i}", daemon=True)
             for i in range(WORKERS)]
    enqueued: dict[str, list[int]] = {s: [] for s in STAGES}
    chunks = [(stage, rng.choice(PRIORITIES)) for stage, n in PLAN.items() for _ in range(n // CHUNK)]
    rng.shuffle(chunks)
    started = time.monotonic()
    try:
        for p in procs:
            p.start()
        with psycopg.connect(db, autocommit=True) as conn:
            # Enqueue while the workers already drain: producers and consumers race on the same rows.
            n = 0
            for stage, priority in chunks:
                payloads = [json.dumps({"n": n + k, "stage": stage}) for k in range(CHUNK)]
                n += CHUNK
                ids = [r[0] for r in conn.execute(
                    "SELECT queue.enqueue_batch(%s::jsonb[], stage => %s, priority => %s)",
                    (payloads, stage, priority)).fetchall()]
                assert len(ids) == CHUNK
                enqueued[stage].extend(ids)
            all_ids = [i for ids in enqueued.values() for i in ids]
            while True:
                live = conn.execute("SELECT count(*) FROM queue.live_tasks WHERE id = ANY(%s)",
                                    (all_ids,)).fetchone()[0]
                if live == 0:
                    break
                assert time.monotonic() < deadline, f"{live} tasks still live after {DRAIN_DEADLINE} s: a hang"
                assert all(p.is_alive() for p in procs), \
                    f"a worker died: exit codes {[p.exitcode for p in procs]}"
                time.sleep(0.2)
        elapsed = time.monotonic() - started
    finally:
        workload.stop_processes(procs, stop)
    assert [p.exitcode for p in procs] == [0] * WORKERS
    records = [workload.read_record(o) for o in outs]

    # The scenario really happened: every process worked, and failures, fatals and hops occurred.
    assert all(r["takes"] for r in records), [len(r["takes"]) for r in records]
    outcomes = Counter(o for r in records for _, _, o in r["results"])
    assert outcomes["retry"] > 0 and outcomes["fatal"] > 0 and outcomes["hop"] > 0, outcomes
    # No lease is reaped here (5 minute leases), so no finish or fail may ever find its lease gone.
    assert [r["lost"] for r in records] == [0] * WORKERS

    # No two takes ever handed out the same attempt of a task, and every lease is unique.
    held = Counter((tid, stage, attempt) for r in records for tid, stage, attempt, _ in r["takes"])
    twice = [k for k, c in held.items() if c > 1]
    assert not twice, f"attempts taken more than once (id, stage, attempt): {twice[:10]}"
    leases = Counter(lease for r in records for *_, lease in r["takes"])
    assert len(leases) == sum(held.values()), "a lease token was handed out twice"
    # Attempts of a (task, stage) are 1..n with no gap: each take starts exactly the next attempt.
    attempts: dict[tuple[int, str], list[int]] = defaultdict(list)
    for tid, stage, attempt, _ in (t for r in records for t in r["takes"]):
        attempts[(tid, stage)].append(attempt)
    gaps = {k: sorted(v) for k, v in attempts.items() if sorted(v) != list(range(1, len(v) + 1))}
    assert not gaps, f"attempt numbers with gaps: {list(gaps.items())[:10]}"

    # From the workers' records: exactly one successful final call (finish or fatal fail) per (id, stage).
    finals: dict[tuple[int, str], list[str]] = defaultdict(list)
    retries: Counter = Counter()
    for tid, stage, outcome in (x for r in records for x in r["results"]):
        if outcome == "retry":
            retries[(tid, stage)] += 1
        else:
            finals[(tid, stage)].append(outcome)
    multiple = {k: v for k, v in finals.items() if len(v) != 1}
    assert not multiple, f"(id, stage) ended more than once by the workers: {list(multiple.items())[:10]}"
    # Every take ended in exactly one successful call: retries + 1 final = attempts taken.
    assert all(len(attempts[k]) == retries[k] + 1 for k in finals)
    assert set(attempts) == set(finals)

    # What must have ended, and where: each enqueued id in its stage; ingest tasks that finished
    # there also in publish, the stage the hop moved them to.
    expected = {(tid, stage) for stage, ids in enqueued.items() for tid in ids}
    expected |= {(tid, PUBLISH) for tid in enqueued[INGEST] if finals.get((tid, INGEST)) == ["hop"]}
    assert set(finals) == expected, (
        f"lost by the workers: {sorted(expected - set(finals))[:10]}; "
        f"unexpected: {sorted(set(finals) - expected)[:10]}")

    with psycopg.connect(db) as conn:
        all_ids = [tid for ids in enqueued.values() for tid in ids]
        history = conn.execute(
            "SELECT id, stage, status::text, attempt FROM queue.history WHERE id = ANY(%s)",
            (all_ids,)).fetchall()
        live = conn.execute("SELECT count(*) FROM queue.live_tasks WHERE id = ANY(%s)",
                            (all_ids,)).fetchone()[0]
        live_total = conn.execute(
            "SELECT count(*) FROM queue.live_tasks WHERE stage = ANY(%s)", (STAGES,)).fetchone()[0]
    assert live == 0 and live_total == 0, "tasks left in queue.live_tasks"

    # From queue.history: one final row per (id, stage), matching what the worker did.
    rows = Counter((tid, stage) for tid, stage, _, _ in history)
    doubled = [k for k, c in rows.items() if c > 1]
    assert not doubled, f"(id, stage) with more than one history row: {doubled[:10]}"
    assert set(rows) == expected, (
        f"missing from history: {sorted(expected - set(rows))[:10]}; "
        f"unexpected in history: {sorted(set(rows) - expected)[:10]}")
    want_status = {"done": "done", "hop": "done", "fatal": "fatal"}
    mismatched = [(tid, stage, status, finals[(tid, stage)][0]) for tid, stage, status, _ in history
                  if status != want_status[finals[(tid, stage)][0]]]
    assert not mismatched, f"history status differs from the worker's call: {mismatched[:10]}"
    wrong_attempt = [(tid, stage, attempt, len(attempts[(tid, stage)])) for tid, stage, _, attempt in history
                     if attempt != len(attempts[(tid, stage)])]
    assert not wrong_attempt, f"history attempt differs from attempts taken: {wrong_attempt[:10]}"

    # Every enqueued id reached a final state in its last stage.
    last_stage = {tid: stage for stage, ids in enqueued.items() for tid in ids}
    for tid in enqueued[INGEST]:
        if finals[(tid, INGEST)] == ["hop"]:
            last_stage[tid] = PUBLISH
    final_rows = {(tid, stage) for tid, stage, status, _ in history if status in ("done", "fatal")}
    assert all((tid, stage) in final_rows for tid, stage in last_stage.items())

    # The totals agree: successful finishes = done rows, successful fatal fails = fatal rows.
    status_count = Counter(status for _, _, status, _ in history)
    assert outcomes["done"] + outcomes["hop"] == status_count["done"]
    assert outcomes["fatal"] == status_count["fatal"]
    assert status_count["done"] + status_count["fatal"] == len(history)
    print(f"drained {sum(PLAN.values())} tasks ({len(history)} finished runs, {outcomes['retry']} retries,"
          f" {outcomes['fatal']} fatal) with {WORKERS} processes in {elapsed:.1f} s")


def test_concurrent_take_next_batches_are_disjoint(db: str, tmp_path: Path):
    # 5,000 tasks in batches of 50: 100 batches for 8 takers released at once by a barrier, so
    # every take races the others for the same head of the claim index (20,000 until 2026-11-27).
    stage, tasks, batch, takers = "cc.grab", 5_000, 50, 8
    with psycopg.connect(db, autocommit=True) as conn:
        ids: list[int] = []
        for priority in (1, 0, -1, 0):  # several priorities, interleaved ids
            payloads = [json.dumps({"k": k}) for k in range(tasks // 4)]
            ids += [r[0] for r in conn.execute(
                "SELECT queue.enqueue_batch(%s::jsonb[], stage => %s, priority => %s)",
                (payloads, stage, priority)).fetchall()]
    assert len(ids) == tasks

    ctx = _spawn()
    barrier = ctx.Barrier(takers)  # all start taking at the same moment
    deadline = time.monotonic() + 180  # against a hang only: it includes 8 interpreters starting, slow under load
    outs = [str(tmp_path / f"grab-{i}.pickle") for i in range(takers)]
    procs = [ctx.Process(target=workload.grab, args=(db, i, stage, batch, barrier, outs[i], deadline),
                         name=f"grab-{i}", daemon=True)
             for i in range(takers)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(max(0.0, deadline + 5 - time.monotonic()))
        assert not any(p.is_alive() for p in procs), "a taker hung"
    finally:
        workload.stop_processes(procs, None, timeout=5)
    assert [p.exitcode for p in procs] == [0] * takers
    records = [workload.read_record(o) for o in outs]

    got = [(r["name"], tid, lease) for r in records for b in r["batches"] for tid, lease in b]
    assert all(1 <= len(b) <= batch for r in records for b in r["batches"])
    taken_ids = Counter(tid for _, tid, _ in got)
    handed_twice = [t for t, c in taken_ids.items() if c > 1]
    assert not handed_twice, f"{len(handed_twice)} ids handed to two callers: {handed_twice[:10]}"
    assert len(got) == len(taken_ids)
    assert set(taken_ids) == set(ids), "some tasks were never taken, or strangers were"
    busy = [r["name"] for r in records if r["batches"]]
    assert len(busy) >= 2, f"only {busy} took anything: the takes did not overlap"

    # What each caller holds is what the database says: its lease is current, under its name.
    with psycopg.connect(db) as conn:
        rows = {tid: (str(lease), worker, status, attempt) for tid, lease, worker, status, attempt in conn.execute(
            "SELECT id, lease, worker, status::text, attempt FROM queue.live_tasks WHERE stage = %s",
            (stage,)).fetchall()}
    assert len(rows) == tasks
    wrong = [(tid, name, lease, rows[tid]) for name, tid, lease in got
             if rows[tid] != (lease, name, "running", 1)]
    assert not wrong, f"callers hold leases the database does not: {wrong[:10]}"
