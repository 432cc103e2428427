"""Model-based test (hypothesis): random sequences of API calls from several simulated workers,
each on its own connection, checked step by step against a small Python model of the queue.

Rules: enqueue (with and without key, modes 'ignore' and 'rerun'), take_next (batches), finish,
finish with next_stage, fail (retry_in 0 and fatal), heartbeat, reap_hung (after expiring a lease
by UPDATE as superuser), cancel, retry, set_priority, and enqueue(after => ids, after_failed) of
tasks that wait for others (live, moved on, or already ended), resolved by whatever ends them. Leases handed out stay in a pool, so stale
ones are presented too (finish/fail must return false, heartbeat must raise SK001).

Invariants after every step: each live task's stage, status, attempt, lease, key and rerun flag
equal the model's; what each waiting task still waits for (queue.dependencies, live_tasks.waits)
equals the model's; each task's finished rows (stage, status, attempt) equal the model's (so no
task is done twice and nothing appears or vanishes); every return value and SQLSTATE equals the
model's prediction.

Reproducible in CI: derandomize=True. Profiles (SKIPLOCK_HYPOTHESIS_PROFILE=…): 'skiplock-ci'
(default, < 60 s), 'skiplock-random' (same size, a new random seed each run) and 'skiplock-long'
(1,000 examples of 100 steps, for a longer local run). The test also fails when the run did not
exercise the branches that matter (stale leases, SK002, re-runs, reaping, …).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from dev import testrun

A, B = "m.a", "m.b"          # finish(next_stage) only moves a task from A to B
MAX_ATTEMPTS = {A: 2, B: 1}   # B: every failure is the last one; A: one retry
WORKERS = 3
KEYS = [None, "k1", "k2"]
UNKNOWN_ID = 10**12

settings.register_profile("skiplock-ci", max_examples=60, stateful_step_count=50, derandomize=True,
                          deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("skiplock-random", max_examples=60, stateful_step_count=50, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("skiplock-long", max_examples=1000, stateful_step_count=100, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
PROFILE = os.environ.get("SKIPLOCK_HYPOTHESIS_PROFILE", "skiplock-ci")


@pytest.fixture(scope="module")
def model_db(admin_url: str, template_db: str) -> Iterator[str]:
    url = testrun.create_database(admin_url, "model_based", template=template_db)  # alembic upgrade head: what we ship
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            # Setup, not under test: written directly (as superuser) rather than through
            # configure_stage, so this module tests the worker API only.
            for stage in (A, B):
                conn.execute("INSERT INTO queue.stage_settings (stage, max_attempts, backoff_base, backoff_jitter)"
                             " VALUES (%s, %s, interval '0', 0)", (stage, MAX_ATTEMPTS[stage]))
        yield url
    finally:
        testrun.drop_database(admin_url, url)


@dataclass
class Task:
    id: int
    stage: str
    key: str | None
    status: str = "ready"          # ready, running, error, waiting (live) — finished tasks are in .history only
    attempt: int = 0
    lease: str | None = None
    rerun: bool = False
    live: bool = True
    history: list[tuple[str, str, int]] = field(default_factory=list)  # (stage, status, attempt)
    waits: set[int] = field(default_factory=set)   # ids it still waits for (status 'waiting')
    policy: str = "cancel"                         # after_failed


def sqlstate(call) -> tuple[str, Any]:
    """('ok', result) or ('error', sqlstate). (A void function's result reads as ''.)"""
    try:
        return "ok", call()
    except psycopg.Error as e:
        return "error", e.sqlstate


class QueueMachine(RuleBasedStateMachine):
    url: str = ""
    conns: list[psycopg.Connection] = []   # WORKERS worker connections, then the admin one
    seen: Counter = Counter()              # branches the examples went through, over the whole run

    def __init__(self) -> None:
        super().__init__()
        if not QueueMachine.conns:
            QueueMachine.conns = [psycopg.connect(self.url, autocommit=True) for _ in range(WORKERS + 1)]
        self.admin = QueueMachine.conns[-1]
        self.admin.execute("TRUNCATE queue.live_tasks, queue.history, queue.dependencies")
        self.tasks: dict[int, Task] = {}
        self.leases: list[tuple[int, str]] = []   # every (id, lease) handed out, current or stale
        self.finished_true: Counter = Counter()  # (id, lease) pairs whose finish/fail returned true

    # -- helpers ----------------------------------------------------------------------------
    def live(self, stage: str | None = None) -> list[Task]:
        return [t for t in self.tasks.values() if t.live and (stage is None or t.stage == stage)]

    def by_key(self, stage: str, key: str | None) -> Task | None:
        if key is None:
            return None
        found = [t for t in self.live(stage) if t.key == key]
        return found[0] if found else None

    def current(self, task_id: int, lease: str) -> Task | None:
        t = self.tasks.get(task_id)
        return t if t is not None and t.live and t.status == "running" and t.lease == lease else None

    def end(self, t: Task, status: str) -> None:
        t.history.append((t.stage, status, t.attempt))
        t.live, t.lease, t.rerun, t.waits = False, None, False, set()
        # What waited for it: counts down, or is cancelled after a failure under 'cancel'.
        for w in sorted(self.live(), key=lambda w: w.id):
            if w.live and t.id in w.waits:
                w.waits.discard(t.id)
                if status != "done" and w.policy == "cancel":
                    self.seen["cancelled by what it waited for"] += 1
                    self.end(w, "cancelled")
                elif not w.waits:
                    self.seen["ready by the last end it waited for"] += 1
                    w.status = "ready"

    def requeue_rerun(self, t: Task) -> None:
        t.status, t.attempt, t.lease, t.rerun = "ready", 0, None, False

    def pick_lease(self, i: int, fresh: bool) -> tuple[int, str]:
        """A lease handed out earlier: a current one when fresh (and there is one), else any."""
        pool = [(t.id, t.lease) for t in sorted(self.live(), key=lambda t: t.id) if t.status == "running"]
        if not fresh or not pool:
            pool = self.leases
        return pool[i % len(pool)]

    def pick_id(self, i: int) -> int:
        ids = sorted(self.tasks) + [UNKNOWN_ID]
        return ids[i % len(ids)]

    # -- rules ------------------------------------------------------------------------------
    @initialize()
    def some_tasks(self) -> None:
        """Every example starts with work to do, keyed and not, in both stages."""
        for stage, key in ((A, None), (A, "k1"), (A, "k2"), (A, None), (B, None), (B, "k1")):
            self.enqueue(stage, key, "ignore")

    @rule(stage=st.sampled_from([A, B]), key=st.sampled_from(KEYS), mode=st.sampled_from(["ignore", "rerun"]))
    def enqueue(self, stage: str, key: str | None, mode: str) -> None:
        got = self.admin.execute("SELECT queue.enqueue(payload => '{}'::jsonb, stage => %s, key => %s, mode => %s)",
                                 (stage, key, mode)).fetchone()[0]
        existing = self.by_key(stage, key)
        if existing is None:
            assert got not in self.tasks
            self.tasks[got] = Task(got, stage, key)
            return
        assert got == existing.id
        if mode == "rerun":
            if existing.status == "running":
                self.seen["rerun while running"] += 1
                existing.rerun = True
            elif existing.status == "waiting":
                self.seen["rerun while waiting"] += 1
            else:
                existing.status, existing.attempt = "ready", 0

    @rule(stage=st.sampled_from([A, B]), key=st.sampled_from(KEYS), picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=3),
          policy=st.sampled_from(["cancel", "run"]), cancel=st.integers(0, 3))
    def enqueue_after(self, stage: str, key: str | None, picks: list[int], policy: str, cancel: int) -> None:
        """A task that waits for up to three known tasks: live ones (running, waiting, moved on) and
        ended ones, resolved from history at once. One time in four, an admin then cancels the
        first waiting task (its edges go; what waits for it follows)."""
        self._enqueue_after(stage, key, picks, policy)
        waiting = sorted(t.id for t in self.live() if t.status == "waiting")
        if cancel == 0 and waiting:
            self.cancel_id(waiting[0])

    def _enqueue_after(self, stage: str, key: str | None, picks: list[int], policy: str) -> None:
        after = sorted({sorted(self.tasks)[i % len(self.tasks)] for i in picks})
        got = self.admin.execute("SELECT queue.enqueue('{}'::jsonb, %s, key => %s, after => %s, after_failed => %s)",
                                 (stage, key, after, policy)).fetchone()[0]
        existing = self.by_key(stage, key)
        if existing is not None:
            assert got == existing.id
            return
        assert got not in self.tasks
        t = self.tasks[got] = Task(got, stage, key, status="waiting", policy=policy)
        ended = [self.tasks[a].history[-1][1] for a in after if not self.tasks[a].live]
        t.waits = {a for a in after if self.tasks[a].live}
        if ended:
            self.seen["enqueue after an ended task"] += 1
        if policy == "cancel" and any(status != "done" for status in ended):
            self.seen["cancelled at enqueue"] += 1
            self.end(t, "cancelled")
        elif not t.waits:
            t.status = "ready"

    @rule(worker=st.integers(0, WORKERS - 1), stage=st.sampled_from([A, B]), batch=st.integers(1, 4))
    def take_next(self, worker: int, stage: str, batch: int) -> None:
        self._take(worker, stage, batch)

    @rule(worker=st.integers(0, WORKERS - 1), stage=st.sampled_from([A, B]),
          actions=st.lists(st.sampled_from(["finish", "next", "fail", "fatal", "keep", "hang", "cancel", "rerun"]),
                           min_size=3, max_size=3))
    def work(self, worker: int, stage: str, actions: list[str]) -> None:
        """A worker's loop turn: take a batch and end each attempt, keep it running, hang (its
        lease expires and reap_hung takes it back), or see an admin cancel it or a producer
        re-enqueue its key (mode 'rerun') and then finish it."""
        for (task_id, lease), action in zip(self._take(worker, stage, len(actions)), actions):
            if action in ("finish", "next"):
                self._finish(worker, task_id, lease, B if action == "next" and stage == A else None)
            elif action in ("fail", "fatal"):
                self._fail(worker, task_id, lease, action == "fatal")
            elif action == "hang":
                self._reap(self.tasks[task_id])
            elif action == "cancel":
                self.cancel_id(task_id)
            elif action == "rerun" and self.tasks[task_id].key:
                self.enqueue(stage, self.tasks[task_id].key, "rerun")
                self._finish(worker, task_id, lease, None)

    @rule(i=st.integers(0, 10**6))
    def rerun_running(self, i: int) -> None:
        """A producer re-enqueues (mode 'rerun') the key of a task that is running."""
        running = [t for t in sorted(self.live(), key=lambda t: t.id) if t.status == "running" and t.key]
        if running:
            t = running[i % len(running)]
            self.enqueue(t.stage, t.key, "rerun")

    def _take(self, worker: int, stage: str, batch: int) -> list[tuple[int, str]]:
        rows = self.conns[worker].execute(
            "SELECT id, attempt, lease::text FROM queue.take_next(stage => %s, batch => %s, worker => %s)",
            (stage, batch, f"w{worker}")).fetchall()
        waiting = {t.id for t in self.live(stage) if t.status in ("ready", "error")}
        assert len(rows) == min(batch, len(waiting)), (rows, waiting)
        for task_id, attempt, lease in rows:
            assert task_id in waiting
            t = self.tasks[task_id]
            t.status, t.attempt, t.lease = "running", t.attempt + 1, lease
            assert attempt == t.attempt
            self.leases.append((task_id, lease))
        return [(task_id, lease) for task_id, _attempt, lease in rows]

    @rule(worker=st.integers(0, WORKERS - 1), i=st.integers(0, 10**6), move=st.booleans(), fresh=st.booleans())
    def finish(self, worker: int, i: int, move: bool, fresh: bool) -> None:
        if not self.leases:
            return
        task_id, lease = self.pick_lease(i, fresh)
        self._finish(worker, task_id, lease, B if move and self.tasks[task_id].stage == A else None)

    def _finish(self, worker: int, task_id: int, lease: str, nxt: str | None) -> None:
        t = self.current(task_id, lease)
        outcome = sqlstate(lambda: self.conns[worker].execute(
            "SELECT queue.finish(%s, %s::uuid, next_stage => %s)", (task_id, lease, nxt)).fetchone()[0])
        if t is None:
            assert outcome == ("ok", False)
            self.seen["stale finish"] += 1
            return
        if t.rerun:
            assert outcome == ("ok", True)
            self.seen["finish of a rerun"] += 1
            self.requeue_rerun(t)
        elif nxt is not None and self.by_key(nxt, t.key) is not None:
            assert outcome == ("error", "SK002")
            self.seen["finish SK002"] += 1
            return
        else:
            assert outcome == ("ok", True)
            self.seen["finish to next stage" if nxt else "finish done"] += 1
            if nxt is None:
                self.end(t, "done")
            else:
                t.history.append((t.stage, "done", t.attempt))
                t.stage, t.status, t.attempt, t.lease = nxt, "ready", 0, None
        self.finished_true[(task_id, lease)] += 1

    @rule(worker=st.integers(0, WORKERS - 1), i=st.integers(0, 10**6), fatal=st.booleans(), fresh=st.booleans())
    def fail(self, worker: int, i: int, fatal: bool, fresh: bool) -> None:
        if not self.leases:
            return
        task_id, lease = self.pick_lease(i, fresh)
        self._fail(worker, task_id, lease, fatal)

    def _fail(self, worker: int, task_id: int, lease: str, fatal: bool) -> None:
        t = self.current(task_id, lease)
        ok = self.conns[worker].execute(
            "SELECT queue.fail(%s, %s::uuid, 'boom', fatal => %s, retry_in => interval '0')",
            (task_id, lease, fatal)).fetchone()[0]
        assert ok is (t is not None)
        if t is None:
            self.seen["stale fail"] += 1
            return
        if t.rerun:
            self.seen["fail of a rerun"] += 1
            self.requeue_rerun(t)
        elif fatal or t.attempt >= MAX_ATTEMPTS[t.stage]:
            self.seen["fail fatal" if fatal else "fail out of attempts"] += 1
            self.end(t, "fatal")
        else:
            self.seen["fail retried"] += 1
            t.status, t.lease = "error", None
        self.finished_true[(task_id, lease)] += 1

    @rule(worker=st.integers(0, WORKERS - 1), i=st.integers(0, 10**6), fresh=st.booleans())
    def heartbeat(self, worker: int, i: int, fresh: bool) -> None:
        if not self.leases:
            return
        task_id, lease = self.pick_lease(i, fresh)
        outcome = sqlstate(lambda: self.conns[worker].execute(
            "SELECT queue.heartbeat(%s, %s::uuid)", (task_id, lease)).fetchone()[0])
        if self.current(task_id, lease) is None:
            assert outcome == ("error", "SK001")
            self.seen["heartbeat SK001"] += 1
        else:
            assert outcome[0] == "ok"

    @rule(i=st.integers(0, 10**6), expire=st.booleans())
    def reap(self, i: int, expire: bool) -> None:
        running = sorted(t.id for t in self.live() if t.status == "running")
        self._reap(self.tasks[running[i % len(running)]] if running and expire else None)

    def _reap(self, victim: Task | None) -> None:
        if victim is not None:
            # A hung worker: its lease runs out (superuser UPDATE; leases are 5 minutes otherwise).
            self.admin.execute("UPDATE queue.live_tasks SET lease_expires = now() - interval '1 second'"
                               " WHERE id = %s", (victim.id,))
        reaped = self.admin.execute("SELECT queue.reap_hung()").fetchone()[0]
        assert reaped == (victim is not None)
        if victim is None:
            return
        self.seen["reaped"] += 1
        if victim.rerun:
            self.requeue_rerun(victim)
        elif victim.attempt < MAX_ATTEMPTS[victim.stage]:
            victim.status, victim.lease = "error", None
        else:
            self.end(victim, "fatal")

    @rule(i=st.integers(0, 10**6))
    def cancel(self, i: int) -> None:
        self.cancel_id(self.pick_id(i))

    def cancel_id(self, task_id: int) -> None:
        outcome = sqlstate(lambda: self.admin.execute("SELECT queue.cancel(%s)", (task_id,)).fetchone()[0])
        t = self.tasks.get(task_id)
        if t is None:
            assert outcome == ("error", "P0002")
        elif not t.live:
            assert outcome == ("error", "55000")
        else:
            assert outcome[0] == "ok", outcome
            self.seen["cancel " + t.status] += 1
            self.end(t, "cancelled")

    @rule(i=st.integers(0, 10**6))
    def retry(self, i: int) -> None:
        task_id = self.pick_id(i)
        outcome = sqlstate(lambda: self.admin.execute("SELECT queue.retry(%s)", (task_id,)).fetchone()[0])
        t = self.tasks.get(task_id)
        if t is None:
            assert outcome == ("error", "P0002")
        elif t.live:
            if t.status == "running":
                assert outcome == ("error", "55000")
                return
            assert outcome[0] == "ok", outcome
            if t.status == "error":
                t.status, t.attempt = "ready", 0
        else:
            stage, status, _attempt = t.history[-1]
            if status == "done":
                assert outcome == ("error", "55000")
            elif self.by_key(stage, t.key) is not None:
                assert outcome == ("error", "SK002")
                self.seen["retry SK002"] += 1
            else:
                assert outcome[0] == "ok", outcome
                self.seen["retry from history"] += 1
                t.history.pop()
                t.live, t.stage, t.status, t.attempt = True, stage, "ready", 0

    @rule(i=st.integers(0, 10**6), priority=st.integers(-2, 2))
    def set_priority(self, i: int, priority: int) -> None:
        task_id = self.pick_id(i)
        outcome = sqlstate(lambda: self.admin.execute("SELECT queue.set_priority(%s, %s)",
                                                      (task_id, priority)).fetchone()[0])
        t = self.tasks.get(task_id)
        expected = "P0002" if t is None else "55000" if not t.live else None
        assert outcome == ("error", expected) if expected else outcome[0] == "ok", outcome

    # -- invariants -------------------------------------------------------------------------
    @invariant()
    def database_matches_model(self) -> None:
        live = self.admin.execute("SELECT id, stage, status::text, attempt, lease::text, key, rerun"
                                  " FROM queue.live_tasks ORDER BY id").fetchall()
        expected = [(t.id, t.stage, t.status, t.attempt, t.lease, t.key, t.rerun)
                    for t in sorted(self.live(), key=lambda t: t.id)]
        assert live == expected
        waits = self.admin.execute("SELECT t.id, greatest(t.waits, 0), coalesce(q.waits_for, '{}') FROM queue.live_tasks t"
                                   " JOIN queue.tasks q ON q.id = t.id AND q.finished IS NULL ORDER BY t.id").fetchall()
        assert waits == [(t.id, len(t.waits), sorted(t.waits)) for t in sorted(self.live(), key=lambda t: t.id)]
        edges = self.admin.execute("SELECT count(*) FROM queue.dependencies").fetchone()[0]
        assert edges == sum(len(t.waits) for t in self.live())
        history = self.admin.execute("SELECT id, stage, status::text, attempt FROM queue.history"
                                     " ORDER BY id, finished, stage").fetchall()
        expected_history = [(t.id, *h) for t in sorted(self.tasks.values(), key=lambda t: t.id) for h in t.history]
        assert sorted(history) == sorted(expected_history)

    @invariant()
    def no_double_completion(self) -> None:
        done = Counter((t.id, stage) for t in self.tasks.values() for stage, status, _ in t.history if status == "done")
        assert not [k for k, n in done.items() if n > 1]
        assert not [k for k, n in self.finished_true.items() if n > 1], "one attempt ended twice"
        # Conservation: every task ever created is live, or finished (has a final last row).
        for t in self.tasks.values():
            assert t.live or (t.history and t.history[-1][1] in ("done", "fatal", "cancelled"))

    def teardown(self) -> None:
        pass  # connections are kept for the next example; closed by the test


def test_queue_follows_its_model(model_db: str):
    QueueMachine.url = model_db
    QueueMachine.conns = []
    QueueMachine.seen = Counter()
    try:
        run_state_machine_as_test(QueueMachine, settings=settings.get_profile(PROFILE))
    finally:
        for c in QueueMachine.conns:
            c.close()
        QueueMachine.conns = []
    seen = QueueMachine.seen
    print(f"\nbranches exercised: {dict(sorted(seen.items()))}")
    # The run must have gone where the bugs would be, or it proved little.
    must = ["stale finish", "stale fail", "heartbeat SK001", "finish done", "finish to next stage",
            "finish of a rerun", "fail fatal", "fail out of attempts", "fail retried", "reaped", "rerun while running",
            "retry from history", "cancel running", "enqueue after an ended task", "cancelled at enqueue",
            "cancelled by what it waited for", "ready by the last end it waited for", "cancel waiting"]
    assert not [b for b in must if not seen[b]], f"branches never exercised: {[b for b in must if not seen[b]]}"
