"""Upgrades under load: `alembic upgrade head` from every earlier revision while workers run.

For each revision R of the history that is not head (parametrised from Alembic's script
directory, so a new revision is covered without editing this file): a fresh database migrated
only to R is seeded, through the API as it exists at R, with tasks in every state (ready, planned
for later, running under a lease, running with an expired lease, error awaiting retry, done,
fatal, cancelled, periodic, with keys, in a group, moved on by finish(next_stage)); worker
processes (spawn) keep enqueueing, taking, heartbeating, finishing, failing and reaping through the
API while the test process runs `alembic upgrade head`. Then:

- no worker call failed (every call is counted per kind, every error is recorded and printed);
- calls ran while the upgrade ran, and every worker made calls after it (on the new functions);
- no call waited longer than MAX_CALL_SECONDS (a migration holding the hot table's lock for
  long, or queueing for it without lock_timeout, stalls every worker: that fails here);
- every task id enqueued before and during the upgrade is accounted for: live or in history, at
  most one history row per (id, stage) (periodic tasks: one per run), every worker's successful
  finish/fail has its history row, the seeded history rows are unchanged, and the workers drain
  everything after the upgrade; the leases taken at R are still honoured at head;
- `alembic downgrade -1` and `upgrade head` again with tasks in the database (ready, error,
  running) keep every row (the columns both revisions have), and the lease of the running task
  still works afterwards.

With a single revision (head) there is nothing to upgrade from: the test is skipped and says so.

test_a_hot_table_migration_waits_at_most_lock_timeout runs today, whatever the history: it puts a
throw-away revision on top of head (a version location in tmp_path) that ALTERs queue.live_tasks,
holds a transaction on the table, and checks that the migration gives up after lock_timeout,
retries with backoff and lands once the transaction ends, while enqueue calls wait at most about
lock_timeout; without lock_timeout the same calls wait for the whole hold (the pile-up).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import random
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from dev.testrun import create_database, drop_database
from skiplock import migrate

A, B, C, G, TICK, HOLD = "upg.a", "upg.b", "upg.c", "upg.g", "upg.tick", "upg.hold"
WORKER_STAGES = [A, B, C, G, TICK]          # HOLD is the test's own: its leases span the upgrade
HOPS = {A: B}                               # finishing in A moves the task on to B
WORKERS = 4
WARM_SECONDS = 3.0                          # workers run (and psycopg prepares their statements) before the upgrade
AFTER_SECONDS = 3.0                         # and keep producing this long after it
DRAIN_DEADLINE = 180.0
# Spawned interpreters import psycopg and connect: on a machine running two suites that took over 60 s.
STARTUP_DEADLINE = 300.0
MAX_CALL_SECONDS = 8.0                      # lock_timeout (2 s) + slack for a loaded 2-core machine
API = ["enqueue", "enqueue_batch", "take_next", "heartbeat", "finish", "fail", "cancel", "reap_hung",
       "configure_stage", "schedule"]


def _script():
    from alembic.script import ScriptDirectory
    return ScriptDirectory.from_config(migrate.alembic_config("postgresql://unused"))


def earlier_revisions() -> list[str]:
    """Every revision but head, oldest first (base is not a revision: a fresh install is tested elsewhere)."""
    script = _script()
    head = script.get_current_head()
    return [r.revision for r in reversed(list(script.walk_revisions())) if r.revision != head]


EARLIER = earlier_revisions()
NO_EARLIER = pytest.param(None, id="no-earlier-revision", marks=pytest.mark.skip(
    reason=f"the history has one revision ({_script().get_current_head()} = head): no earlier revision "
           "to upgrade from; this test runs for every earlier revision once a second one exists"))


# -- worker processes (top-level functions: multiprocessing 'spawn' imports this module) -------------

class Calls:
    """Per kind of call: how many, how many failed (with SQLSTATE and message), the slowest, when."""

    def __init__(self, failed: Any = None) -> None:
        self.failed = failed                          # a shared counter, so the test can stop early
        self.count: Counter = Counter()
        self.errors: list[tuple[str, str | None, str, float]] = []
        self.slowest: dict[str, float] = defaultdict(float)
        self.spans: list[tuple[float, float]] = []   # (start, end) of every call, time.monotonic()

    def run(self, kind: str, conn: psycopg.Connection, sql: str, params: Any = None) -> list | None:
        started = time.monotonic()
        try:
            rows = conn.execute(sql, params).fetchall()
        except psycopg.Error as e:
            self.errors.append((kind, e.sqlstate, str(e).strip(), started))
            if self.failed is not None:
                with self.failed.get_lock():
                    self.failed.value += 1
            return None
        finally:
            ended = time.monotonic()
            self.count[kind] += 1
            self.slowest[kind] = max(self.slowest[kind], ended - started)
            self.spans.append((started, ended))
        return rows

    def record(self) -> dict[str, Any]:
        return {"count": dict(self.count), "errors": self.errors, "slowest": dict(self.slowest),
                "spans": self.spans}


def _connect(url: str, name: str) -> psycopg.Connection:
    return psycopg.connect(psycopg.conninfo.make_conninfo(url, application_name=name),
                           autocommit=True, row_factory=dict_row)


def mixed_worker(url: str, index: int, produce: Any, stop: Any, failed: Any, warm: Any, out: str,
                 seed: int, deadline: float, quiet: Any) -> None:
    """Producer and worker in one loop until stop: while `produce` is set, enqueue (single, with a
    key, in a group, batches); take from every worker stage; heartbeat some tasks; finish (hop
    A→B), fail with a retry, or fail for good. Odd workers take with `SELECT *` (as the README
    does), even ones name their columns (as the clients do). A call that raises is recorded and
    the loop goes on (on a new connection if that one broke)."""
    rng = random.Random(seed)
    name = f"upg-worker-{index}"
    calls = Calls(failed)
    enqueued: list[tuple[int, str]] = []
    results: list[tuple[int, str, str]] = []     # (id, stage, outcome) of calls that returned true
    lost = 0
    take_sql = ("SELECT * FROM queue.take_next(stage => %s, batch => %s, worker => %s)" if index % 2
                else "SELECT id, payload, attempt, lease FROM queue.take_next(stage => %s, batch => %s, worker => %s)")
    conn = _connect(url, name)
    n = 0
    said_quiet = False
    while not stop.is_set() and time.monotonic() < deadline:
        if conn.broken:
            conn = _connect(url, name)
        if not produce.is_set() and not said_quiet:  # from here on this worker enqueues nothing
            with quiet.get_lock():
                quiet.value += 1
            said_quiet = True
        if produce.is_set():
            n += 1
            roll = rng.random()
            if roll < 0.4:
                stage = rng.choice([A, C])
                key = f"w{index}-{n}" if rng.random() < 0.5 else None
                rows = calls.run("enqueue", conn, "SELECT queue.enqueue(%s::jsonb, stage => %s, priority => %s,"
                                 " key => %s) AS id", ('{"w": %d}' % n, stage, rng.choice([-1, 0, 1]), key))
                enqueued += [(r["id"], stage) for r in rows or []]
            elif roll < 0.6:
                rows = calls.run("enqueue", conn, "SELECT queue.enqueue(%s::jsonb, stage => %s, group_key => %s) AS id",
                                 ('{"g": %d}' % n, G, f"tenant-{rng.randrange(3)}"))
                enqueued += [(r["id"], G) for r in rows or []]
            else:
                stage = rng.choice([A, B, C])
                rows = calls.run("enqueue_batch", conn, "SELECT queue.enqueue_batch(%s::jsonb[], stage => %s) AS id",
                                 (['{"b": %d}' % k for k in range(5)], stage))
                enqueued += [(r["id"], stage) for r in rows or []]
        worked = False
        for stage in WORKER_STAGES:
            rows = calls.run("take_next", conn, take_sql, (stage, 5, name)) or []
            worked |= bool(rows)
            for row in rows:
                task_id, lease = row["id"], row["lease"]
                if rng.random() < 0.3:
                    calls.run("heartbeat", conn, "SELECT queue.heartbeat(%s, %s) AS until", (task_id, lease))
                roll = rng.random()
                if stage != TICK and roll < 0.03:
                    outcome, got = "fatal", calls.run("fail", conn, "SELECT queue.fail(%s, %s, %s, fatal => true) AS ok",
                                                      (task_id, lease, "bad input"))
                elif stage != TICK and roll < 0.10:
                    outcome, got = "retry", calls.run("fail", conn, "SELECT queue.fail(%s, %s, %s, retry_in => interval '0') AS ok",
                                                      (task_id, lease, "flaky"))
                else:
                    outcome = "hop" if stage in HOPS else "done"
                    got = calls.run("finish", conn, "SELECT queue.finish(%s, %s, next_stage => %s) AS ok",
                                    (task_id, lease, HOPS.get(stage)))
                if got is None:
                    continue
                if got[0]["ok"]:
                    results.append((task_id, stage, outcome))
                else:
                    lost += 1
        if n == 20:                                   # warmed up: the test may start the upgrade
            with warm.get_lock():
                warm.value += 1
        if not worked:
            time.sleep(0.02)
    conn.close()
    _write(out, {"index": index, "calls": calls.record(), "enqueued": enqueued, "results": results, "lost": lost})


def admin_worker(url: str, stop: Any, failed: Any, out: str, deadline: float) -> None:
    """What `skiplock maintain` and a dashboard do meanwhile: reap_hung and read queue.stats."""
    calls = Calls(failed)
    reaped = 0
    conn = _connect(url, "upg-admin")
    while not stop.is_set() and time.monotonic() < deadline:
        if conn.broken:
            conn = _connect(url, "upg-admin")
        rows = calls.run("reap_hung", conn, "SELECT queue.reap_hung() AS n")
        reaped += rows[0]["n"] if rows else 0
        calls.run("stats", conn, "SELECT * FROM queue.stats")
        time.sleep(0.2)
    conn.close()
    _write(out, {"calls": calls.record(), "reaped": reaped})


def _write(out: str, record: dict[str, Any]) -> None:
    with open(out + ".tmp", "wb") as f:
        pickle.dump(record, f)
    os.replace(out + ".tmp", out)


def _read(out: str) -> dict[str, Any]:
    with open(out, "rb") as f:
        return pickle.load(f)


# -- seeding at revision R, through R's API ----------------------------------------------------------

def _api_at(conn: psycopg.Connection) -> set[str]:
    return {r["proname"] for r in conn.execute(
        "SELECT proname FROM pg_proc WHERE pronamespace = 'queue'::regnamespace").fetchall()}


def seed(conn: psycopg.Connection) -> dict[str, Any]:
    """Tasks in every state, made only with calls that exist at the first revision (0001). Returns
    the ids per state and the leases the test itself holds across the upgrade."""
    missing = [f for f in API if f not in _api_at(conn)]
    assert not missing, f"the seed uses API functions this revision lacks: {missing}; adapt seed()"
    q = lambda sql, *p: conn.execute(sql, p).fetchall()  # noqa: E731
    for stage in [A, B, C, G, TICK, HOLD]:
        q("SELECT queue.configure_stage(%s, max_attempts => 1000, backoff_base => interval '100 milliseconds',"
          " backoff_cap => interval '1 second')", stage)
    q("SELECT queue.configure_stage(%s, max_running => 4, group_limit => 2)", G)
    s: dict[str, Any] = defaultdict(list)
    s["ready"] = [r["id"] for st in (A, B, C) for r in q(
        "SELECT queue.enqueue_batch(%s::jsonb[], stage => %s, priority => 1) AS id",
        ['{"seed": %d}' % k for k in range(200)], st)]
    s["keyed"] = [q("SELECT queue.enqueue(%s::jsonb, stage => %s, key => %s) AS id",
                    '{"k": %d}' % k, C, f"seed-key-{k}")[0]["id"] for k in range(20)]
    s["grouped"] = [q("SELECT queue.enqueue(%s::jsonb, stage => %s, group_key => %s) AS id",
                      '{"g": %d}' % k, G, f"tenant-{k % 3}")[0]["id"] for k in range(30)]
    s["planned"] = [q("SELECT queue.enqueue(%s::jsonb, stage => %s, run_at => now() + interval '6 seconds') AS id",
                      '{"later": %d}' % k, st)[0]["id"] for k, st in enumerate([A, B, C] * 5)]
    priority = iter(range(-10, -1000, -10))

    def taken(stage: str, n: int, lease_for: str | None = None) -> list[dict]:
        """n new tasks, taken: each call enqueues below every earlier priority so that the take
        gets exactly these (a task moved on by finish(next_stage) keeps its priority)."""
        p = next(priority)
        for k in range(n):
            q("SELECT queue.enqueue(%s::jsonb, stage => %s, priority => %s)", '{"t": %d}' % k, stage, p)
        rows = q("SELECT id, lease FROM queue.take_next(stage => %s, batch => %s, lease_for => %s::interval,"
                 " worker => 'seed')", stage, n, lease_for)
        assert len(rows) == n
        assert {r["id"] for r in rows} == {r["id"] for r in q(
            "SELECT id FROM queue.live_tasks WHERE stage = %s AND priority = %s", stage, p)}
        return rows
    for r in taken(C, 10):
        assert q("SELECT queue.finish(%s, %s) AS ok", r["id"], r["lease"])[0]["ok"]
        s["done"].append(r["id"])
    for r in taken(A, 10):
        assert q("SELECT queue.finish(%s, %s, next_stage => %s) AS ok", r["id"], r["lease"], B)[0]["ok"]
        s["hopped"].append(r["id"])                       # done in A, ready in B
    for r in taken(C, 10):
        assert q("SELECT queue.fail(%s, %s, 'bad input', fatal => true) AS ok", r["id"], r["lease"])[0]["ok"]
        s["fatal"].append(r["id"])
    for r in taken(B, 10):
        assert q("SELECT queue.fail(%s, %s, 'flaky', retry_in => interval '3 seconds') AS ok",
                 r["id"], r["lease"])[0]["ok"]
        s["error"].append(r["id"])                        # error, retry due in 3 s
    s["hung"] = [r["id"] for r in taken(C, 10, "1 second")]   # running, lease expires: reap_hung recovers them
    s["held"] = [(r["id"], r["lease"]) for r in taken(HOLD, 10)]  # running under the test's own leases
    for k in range(10):
        s["cancelled"].append(q("SELECT queue.enqueue(%s::jsonb, stage => %s, run_at => now() + interval '1 hour') AS id",
                                '{"c": %d}' % k, C)[0]["id"])
    for i in s["cancelled"]:
        q("SELECT queue.cancel(%s)", i)
    for r in taken(C, 2):
        q("SELECT queue.cancel(%s)", r["id"])            # cancelled while running
        s["cancelled"].append(r["id"])
    s["periodic"] = [q("SELECT queue.enqueue(%s::jsonb, stage => %s, repeat => interval '1 second') AS id",
                       '{"tick": %d}' % k, TICK)[0]["id"] for k in range(2)]
    q("SELECT queue.schedule('upg-nightly', '0 3 * * *', %s)", C)
    return dict(s)


def snapshot(conn: psycopg.Connection, ids: list[int]) -> dict[str, dict]:
    """The rows of these tasks in live_tasks and history, keyed by (id, stage, finished), as dicts."""
    out = {}
    for table in ("live_tasks", "history"):
        rows = conn.execute(f"SELECT * FROM queue.{table} WHERE id = ANY(%s)", (ids,)).fetchall()
        out[table] = {(r["id"], r["stage"], r.get("finished")): r for r in rows}
    return out


def assert_same_rows(before: dict, after: dict, what: str) -> None:
    for table in before:
        assert set(before[table]) == set(after[table]), (
            f"{what}: {table} rows differ: only before {sorted(set(before[table]) - set(after[table]), key=repr)[:10]}, "
            f"only after {sorted(set(after[table]) - set(before[table]), key=repr)[:10]}")
        changed = []
        for k, row in before[table].items():
            common = set(row) & set(after[table][k])
            if {c: row[c] for c in common} != {c: after[table][k][c] for c in common}:
                changed.append((k, {c: (row[c], after[table][k][c]) for c in common if row[c] != after[table][k][c]}))
        assert not changed, f"{what}: {table} rows changed: {changed[:5]}"


# -- the test ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("start", EARLIER or [NO_EARLIER])
def test_upgrade_head_under_load_loses_nothing(start: str, admin_url: str, tmp_path: Path):
    head = _script().get_current_head()
    url = create_database(admin_url, f"upg_{start}")
    try:
        _run_scenario(url, start, head, tmp_path)
    finally:
        drop_database(admin_url, url)


def _version(conn: psycopg.Connection) -> str:
    return conn.execute("SELECT version_num FROM queue.skiplock_version").fetchone()["version_num"]


def _run_scenario(url: str, start: str, head: str, tmp_path: Path) -> None:
    migrate.upgrade(url, start)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        assert _version(conn) == start
        s = seed(conn)
        seeded_ids = [i for k, v in s.items() if k != "held" for i in v] + [i for i, _ in s["held"]]
        finished_before = snapshot(conn, seeded_ids)["history"]
        states = Counter(r["status"] for r in conn.execute(
            "SELECT status::text FROM queue.tasks WHERE id = ANY(%s)", (seeded_ids,)).fetchall())
        assert set(states) == {"ready", "running", "error", "done", "fatal", "cancelled"}, states

    ctx = mp.get_context("spawn")
    produce, stop, failed, warm = ctx.Event(), ctx.Event(), ctx.Value("i", 0), ctx.Value("i", 0)
    quiet = ctx.Value("i", 0)  # workers that saw `produce` cleared: none of them enqueues again
    produce.set()
    deadline = time.monotonic() + DRAIN_DEADLINE + STARTUP_DEADLINE
    outs = [str(tmp_path / f"worker-{i}.pickle") for i in range(WORKERS)]
    admin_out = str(tmp_path / "admin.pickle")
    procs = [ctx.Process(target=mixed_worker, args=(url, i, produce, stop, failed, warm, outs[i], 1000 + i, deadline, quiet),
                         name=f"upg-worker-{i}", daemon=True) for i in range(WORKERS)]
    procs.append(ctx.Process(target=admin_worker, args=(url, stop, failed, admin_out, deadline), name="upg-admin", daemon=True))
    try:
        for p in procs:
            p.start()
        while warm.value < WORKERS:                   # every worker is producing and taking
            assert all(p.is_alive() for p in procs), f"a worker died: {[p.exitcode for p in procs]}"
            assert time.monotonic() < deadline - DRAIN_DEADLINE, f"the workers did not start within {STARTUP_DEADLINE:.0f} s"
            time.sleep(0.1)
        time.sleep(WARM_SECONDS)                      # and psycopg has prepared their statements
        up_start = time.monotonic()
        migrate.upgrade(url)                                   # alembic upgrade head, under load
        up_end = time.monotonic()
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            assert _version(conn) == head
            # The leases taken at R are still the tasks' leases at head.
            for i, (task_id, lease) in enumerate(s["held"]):
                assert conn.execute("SELECT queue.heartbeat(%s, %s) AS t", (task_id, lease)).fetchone()["t"]
                if i % 2:
                    ok = conn.execute("SELECT queue.finish(%s, %s, next_stage => %s) AS ok", (task_id, lease, B)).fetchone()
                else:
                    ok = conn.execute("SELECT queue.fail(%s, %s, 'bad', fatal => true) AS ok", (task_id, lease)).fetchone()
                assert ok["ok"], f"a lease taken at {start} was refused at {head}: task {task_id}"
            time.sleep(AFTER_SECONDS if not failed.value else 1.0)
            produce.clear()
            # Drain: every worker stage but the periodic one empties.
            while True:
                left = conn.execute("SELECT count(*) AS n FROM queue.live_tasks WHERE stage = ANY(%s) AND repeat IS NULL",
                                    ([A, B, C, G, HOLD],)).fetchone()["n"]
                # Drained once no worker can still be inside an enqueue it began before produce.clear().
                if (left == 0 and quiet.value == WORKERS) or failed.value:
                    break                             # drained, or a call failed: the records below say which
                assert time.monotonic() < up_end + DRAIN_DEADLINE, f"{left} tasks still live {DRAIN_DEADLINE} s after the upgrade"
                assert all(p.is_alive() for p in procs), f"a worker died: {[p.exitcode for p in procs]}"
                time.sleep(0.2)
    finally:
        from workload import stop_processes
        stop_processes(procs, stop)
    assert [p.exitcode for p in procs] == [0] * len(procs)
    records = [_read(o) for o in outs]
    admin = _read(admin_out)

    # No worker call failed.
    all_calls = [r["calls"] for r in records] + [admin["calls"]]
    errors = [e for c in all_calls for e in c["errors"]]
    counts = sum((Counter(c["count"]) for c in all_calls), Counter())
    slowest = max(((k, v) for c in all_calls for k, v in c["slowest"].items()), key=lambda kv: kv[1])
    print(f"\n{start} -> {head}: upgrade took {up_end - up_start:.2f} s under load; calls {dict(counts)}; "
          f"slowest {slowest[0]} {slowest[1]:.2f} s; errors {len(errors)}")
    for kind, state, message, at in errors[:30]:
        print(f"  {kind} at upgrade{at - up_start:+.2f} s: {state}: {message.splitlines()[0]}")
    by_kind = Counter((kind, state) for kind, state, _, _ in errors)
    assert not errors, f"worker calls failed during the upgrade, per (call, SQLSTATE): {dict(by_kind)}"
    assert [r["lost"] for r in records] == [0] * WORKERS, "a finish or fail found its lease gone (no reaping of live leases here)"
    # The upgrade really ran under load: calls overlapped it, and every worker called the new functions.
    during = sum(1 for c in all_calls for a, b in c["spans"] if a < up_end and b > up_start)
    print(f"  {during} calls overlapped the upgrade window")
    assert during > 0, "no worker call overlapped the upgrade: it exercised nothing"
    assert all(any(a > up_end for a, _ in r["calls"]["spans"]) for r in records), "a worker made no call after the upgrade"
    assert slowest[1] <= MAX_CALL_SECONDS, f"a worker call waited {slowest[1]:.1f} s ({slowest[0]}): the migration stalled the queue"
    assert admin["reaped"] >= len(s["hung"]), f"reap_hung recovered {admin['reaped']} tasks, the seed left {len(s['hung'])} hung"

    # Every task is accounted for.
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        for task_id in s["periodic"]:
            conn.execute("SELECT queue.cancel(%s)", (task_id,))
        worker_ids = [i for r in records for i, _ in r["enqueued"]]
        all_ids = seeded_ids + worker_ids
        twice = [i for i, n in Counter(all_ids).items() if n > 1]
        assert not twice, f"ids returned by more than one enqueue: {twice[:10]}"
        live = conn.execute("SELECT id FROM queue.live_tasks WHERE id = ANY(%s)", (all_ids,)).fetchall()
        history = conn.execute("SELECT id, stage, status::text AS status, finished FROM queue.history WHERE id = ANY(%s)",
                               (all_ids,)).fetchall()
        after = snapshot(conn, seeded_ids)["history"]
        schedules = conn.execute("SELECT count(*) AS n FROM queue.schedules WHERE name = 'upg-nightly'").fetchone()["n"]
    assert not live, f"tasks still live after the drain: {[r['id'] for r in live][:10]}"
    assert schedules == 1, "the seeded schedule is gone"
    periodic = set(s["periodic"])
    per_stage = Counter((r["id"], r["stage"]) for r in history if r["id"] not in periodic)
    twice = [k for k, n in per_stage.items() if n > 1]
    assert not twice, f"(id, stage) finished more than once: {twice[:10]}"
    ended = {r["id"] for r in history}
    never = sorted(set(all_ids) - ended)
    assert not never, f"tasks enqueued but neither live nor in history: {never[:10]}"
    for task_id in periodic:
        runs = Counter(r["status"] for r in history if r["id"] == task_id)
        assert runs["cancelled"] == 1 and runs["done"] >= 1, f"periodic task {task_id}: {runs}"
    status_of = {(r["id"], r["stage"]): r["status"] for r in history if r["id"] not in periodic}
    want = {"done": "done", "hop": "done", "fatal": "fatal"}
    wrong = [(i, st, o, status_of.get((i, st))) for r in records for i, st, o in r["results"]
             if o in want and st != TICK and status_of.get((i, st)) != want[o]]
    assert not wrong, f"a worker's successful finish/fail has no matching history row: {wrong[:10]}"
    finals = Counter((i, st) for r in records for i, st, o in r["results"] if o in want and st != TICK)
    assert not [k for k, n in finals.items() if n > 1], "a task ended twice in a stage by the workers"
    for k, row in finished_before.items():
        assert k in after and {c: row[c] for c in row if c in after[k]} == {c: after[k][c] for c in row if c in after[k]}, \
            f"a history row written at {start} changed or vanished: {k}"

    _round_trip(url, head, s)


def _round_trip(url: str, head: str, s: dict[str, Any]) -> None:
    """downgrade -1, upgrade head, with ready, error and running tasks and history present."""
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        q = lambda sql, *p: conn.execute(sql, p).fetchall()  # noqa: E731
        ids = [r["id"] for r in q("SELECT queue.enqueue_batch(%s::jsonb[], stage => %s) AS id",
                                 ['{"rt": %d}' % k for k in range(20)], C)]
        ids.append(q("SELECT queue.enqueue('{}'::jsonb, stage => %s, key => 'rt-key', run_at => now() + interval '1 hour') AS id",
                     C)[0]["id"])
        taken = q("SELECT id, lease FROM queue.take_next(stage => %s, batch => 2)", C)
        assert q("SELECT queue.fail(%s, %s, 'flaky', retry_in => interval '0') AS ok", taken[0]["id"], taken[0]["lease"])[0]["ok"]
        running = taken[1]
        everything = [r["id"] for r in q("SELECT id FROM queue.tasks")]
        before = snapshot(conn, everything)
    migrate.downgrade(url, "-1")
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        down_to = _version(conn)
        assert_same_rows(before, snapshot(conn, everything), f"downgrade {head} -> {down_to}")
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        assert _version(conn) == head
        assert_same_rows(before, snapshot(conn, everything), f"upgrade {down_to} -> {head} after the downgrade")
        assert conn.execute("SELECT queue.finish(%s, %s) AS ok", (running["id"], running["lease"])).fetchone()["ok"], \
            "a lease taken before the downgrade/upgrade round trip was refused after it"
        for _ in range(100):
            rows = conn.execute("SELECT id, lease FROM queue.take_next(stage => %s, batch => 50)", (C,)).fetchall()
            for r in rows:
                assert conn.execute("SELECT queue.finish(%s, %s) AS ok", (r["id"], r["lease"])).fetchone()["ok"]
            if not rows:
                break
        conn.execute("SELECT queue.cancel(%s)", (ids[-1],))  # the one planned an hour ahead
        left = conn.execute("SELECT count(*) AS n FROM queue.live_tasks WHERE id = ANY(%s)", (ids,)).fetchone()["n"]
        assert left == 0, f"{left} round-trip tasks could not be drained after the round trip"
        print(f"round trip {head} -> {down_to} -> {head}: {len(before['live_tasks'])} live and "
              f"{len(before['history'])} history rows kept")


# -- lock_timeout and retry in alembic/env.py --------------------------------------------------------

PROBE_REVISION = '''"""probe: add a column to the hot table (throw-away, test_upgrade_under_load)"""
from alembic import op

revision = "9999probe"
down_revision = {down!r}
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE queue.live_tasks ADD COLUMN upgrade_probe text")


def downgrade() -> None:
    op.execute("ALTER TABLE queue.live_tasks DROP COLUMN upgrade_probe")
'''
HOLD_SECONDS = 8.0  # long enough that "about lock_timeout (1 s)" and "the whole hold" stay apart under load


def _probe_config(url: str, versions: Path, lock_timeout: str, attempts: int):
    cfg = migrate.alembic_config(url, lock_timeout=lock_timeout, lock_attempts=attempts)
    cfg.set_main_option("version_locations", os.pathsep.join([str(migrate.ROOT / "alembic" / "versions"), str(versions)]))
    return cfg


def _hold_and_probe(url: str, run_migration) -> tuple[float, list[float], list[str]]:
    """Hold a transaction on queue.live_tasks for HOLD_SECONDS while run_migration() runs and a
    producer enqueues every 50 ms; returns (migration seconds, enqueue latencies, enqueue errors)."""
    holder = psycopg.connect(url)
    holder.execute("SELECT count(*) FROM queue.live_tasks")       # ACCESS SHARE, kept until commit
    latencies: list[float] = []
    errors: list[str] = []
    probing = threading.Event()
    probing.set()

    def probe() -> None:
        with psycopg.connect(url, autocommit=True) as c:
            while probing.is_set():
                t = time.monotonic()
                try:
                    c.execute("SELECT queue.enqueue('{}'::jsonb, stage => 'upg.probe')")
                except psycopg.Error as e:
                    errors.append(f"{e.sqlstate}: {e}")
                latencies.append(time.monotonic() - t)
                time.sleep(0.05)

    def release() -> None:
        time.sleep(HOLD_SECONDS - 0.7)
        probing.clear()                       # the probe stops before the column lands
        time.sleep(0.7)
        holder.commit()

    threads = [threading.Thread(target=probe), threading.Thread(target=release)]
    for t in threads:
        t.start()
    started = time.monotonic()
    try:
        run_migration()
    finally:
        took = time.monotonic() - started
        for t in threads:
            t.join()
        holder.close()
    return took, latencies, errors


def test_a_hot_table_migration_waits_at_most_lock_timeout(admin_url: str, tmp_path: Path, caplog):
    """An ALTER TABLE queue.live_tasks behind a long transaction: with lock_timeout (env.py's
    default mechanism, 1 s here) it gives up, retries with backoff and lands after the transaction
    ends, while enqueue waits about lock_timeout at most; without it enqueue waits the whole hold."""
    from alembic import command
    url = create_database(admin_url, "upg_lock")
    versions = tmp_path / "versions"
    versions.mkdir()
    (versions / "9999probe.py").write_text(PROBE_REVISION.format(down=_script().get_current_head()))
    try:
        migrate.upgrade(url)
        caplog.set_level(logging.WARNING, logger="alembic.env")
        cfg = _probe_config(url, versions, lock_timeout="1s", attempts=8)
        took, latencies, errors = _hold_and_probe(url, lambda: command.upgrade(cfg, "9999probe"))
        retries = [r.getMessage() for r in caplog.records if "lock_timeout" in r.getMessage()]
        print(f"\nwith lock_timeout 1s: migration took {took:.1f} s, {len(retries)} retries, "
              f"{len(latencies)} enqueues, slowest {max(latencies):.2f} s")
        assert not errors, errors
        assert retries, "the migration never hit lock_timeout: the hold did not block it"
        assert took >= HOLD_SECONDS - 1, f"the migration landed after {took:.1f} s, before the hold ended"
        assert max(latencies) < 1 + 3.0, f"an enqueue waited {max(latencies):.2f} s behind the migration (lock_timeout 1 s)"
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM pg_attribute WHERE attrelid = 'queue.live_tasks'::regclass"
                                " AND attname = 'upgrade_probe' AND NOT attisdropped").fetchone()[0] == 1
        command.downgrade(cfg, "-1")

        # Every try times out: the last 55P03 comes out, nothing is applied.
        cfg = _probe_config(url, versions, lock_timeout="200ms", attempts=2)
        holder = psycopg.connect(url)
        holder.execute("SELECT count(*) FROM queue.live_tasks")
        try:
            with pytest.raises(Exception) as failed:
                command.upgrade(cfg, "9999probe")
            assert migrate.is_lock_timeout(failed.value)
            assert any("lock_timeout=200ms" in n for n in getattr(failed.value, "__notes__", [])), failed.value
        finally:
            holder.close()

        # The contrast: no lock_timeout, and every enqueue queues behind the waiting ALTER.
        cfg = _probe_config(url, versions, lock_timeout="0", attempts=1)
        took, latencies, errors = _hold_and_probe(url, lambda: command.upgrade(cfg, "9999probe"))
        print(f"without lock_timeout: migration took {took:.1f} s, slowest enqueue {max(latencies):.2f} s")
        assert not errors, errors
        assert max(latencies) > HOLD_SECONDS - 2, "without lock_timeout an enqueue should have queued behind the ALTER"
        command.downgrade(cfg, "-1")
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT version_num FROM queue.skiplock_version").fetchone()[0] == _script().get_current_head()
    finally:
        drop_database(admin_url, url)


def test_a_view_read_while_the_run_holds_the_tables_waits_for_the_run(db: str) -> None:
    """The cycle a CI run met upgrading from 0100 under load (a `queue.stats` read got 40P01): the
    run held every table, a read of queue.stats locked the view and queued for a table, and the
    run's CREATE OR REPLACE VIEW queued for the view. lock_queue_tables takes the views as well,
    so the read queues at the view and the run's view DDL (ACCESS EXCLUSIVE on it, as here) has
    nothing to wait for; the read then ends normally. Without the views in the lock, the read or
    the run fails with 40P01 after deadlock_timeout."""
    from sqlalchemy import create_engine, pool, text
    engine = create_engine("postgresql+psycopg://", poolclass=pool.NullPool, creator=lambda: psycopg.connect(db))
    outcome: dict[str, Any] = {}
    reader = psycopg.connect(db, autocommit=True)
    reader.execute("SET lock_timeout = '60s'")
    reader_pid = reader.info.backend_pid

    def read() -> None:
        try:
            outcome["rows"] = reader.execute("SELECT count(*) FROM queue.stats").fetchone()[0]
        except psycopg.Error as e:
            outcome["error"] = f"{e.sqlstate}: {e}"

    try:
        with engine.connect() as run, psycopg.connect(db, autocommit=True) as watch:
            run.execute(text("SET LOCAL lock_timeout = '30s'"))
            assert migrate.lock_queue_tables(run, 10.0) == "nowait"
            thread = threading.Thread(target=read, daemon=True)
            thread.start()
            deadline = time.monotonic() + 60
            while watch.execute("SELECT wait_event_type IS DISTINCT FROM 'Lock' FROM pg_stat_activity WHERE pid = %s",
                                (reader_pid,)).fetchone()[0]:
                assert time.monotonic() < deadline and thread.is_alive(), f"the read never queued behind the run: {outcome}"
                time.sleep(0.05)
            waits_on = watch.execute("SELECT l.relation::regclass::text FROM pg_locks l WHERE l.pid = %s AND NOT l.granted",
                                     (reader_pid,)).fetchone()[0]
            try:
                run.execute(text("LOCK TABLE queue.stats IN ACCESS EXCLUSIVE MODE"))
            except Exception as e:  # noqa: BLE001 - the verdict says what it was
                outcome["run error"] = str(e).splitlines()[0]
            run.rollback()
        thread.join(60)
        assert not thread.is_alive(), "the read did not end after the run"
        assert "error" not in outcome and "run error" not in outcome, (waits_on, outcome)
        assert waits_on == "queue.stats", f"the read queued for {waits_on}, not for the view"
    finally:
        reader.close()
