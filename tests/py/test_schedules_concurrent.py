"""Named cron schedules under concurrency: many sessions call queue.fire_schedules(now) with the
same injected times at once, and every (schedule, tick) becomes exactly one task.

Each session is a thread with its own connection (psycopg releases the GIL while it waits on the
server), so the calls really overlap inside PostgreSQL.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Iterator

import psycopg
import pytest
from psycopg.types.json import Jsonb

from dev import testrun

SESSIONS = 8
STAGE = "sc.fire"
BASE = datetime(2030, 1, 1, tzinfo=timezone.utc)
STEPS = 90          # injected times: BASE + k minutes + 15 s, k = 0 .. STEPS-1
OFFSET = timedelta(seconds=15)
# cron, time zone, the UTC minutes of the hour it fires at (every one of these fires hourly or more often)
KINDS = [
    ("* * * * *", "UTC", set(range(60))),
    ("*/2 * * * *", "UTC", set(range(0, 60, 2))),
    ("*/3 * * * *", "UTC", set(range(0, 60, 3))),
    ("1-59/5 * * * *", "UTC", set(range(1, 60, 5))),
    ("0,30 * * * *", "UTC", {0, 30}),
    ("7,8,9 * * * *", "UTC", {7, 8, 9}),
    ("*/7 * * * *", "UTC", set(range(0, 60, 7))),
    ("@hourly", "UTC", {0}),
    ("0 * * * *", "Asia/Kolkata", {30}),          # UTC+05:30: the local top of the hour is :30 UTC
    ("*/15 * * * *", "Europe/Berlin", {0, 15, 30, 45}),
]
PER_KIND = 16       # 160 schedules


@pytest.fixture
def sched_db(admin_url: str, template_db: str) -> Iterator[str]:
    """A fresh database built by the migrations, one per test."""
    url = testrun.create_database(admin_url, "sched", template=template_db)  # alembic upgrade head: what we ship
    try:
        yield url
    finally:
        testrun.drop_database(admin_url, url)


def _make_schedules(url: str) -> dict[str, set[int]]:
    """Creates the schedules, their first tick at or after BASE; returns name -> UTC minutes."""
    minutes: dict[str, set[int]] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for i in range(PER_KIND):
            for j, (cron, tz, mins) in enumerate(KINDS):
                name = f"sc-{j:02d}-{i:02d}"
                conn.execute("SELECT queue.schedule(%s, %s, stage => %s, payload => %s, priority => %s, timezone => %s)",
                             (name, cron, STAGE, Jsonb({"schedule": name}), j, tz))
                minutes[name] = mins
        # Injected times lie in 2030: start every schedule there (a superuser may write the table).
        conn.execute("UPDATE queue.schedules SET next_fire = queue._cron_next(cron, %s, timezone)",
                     (BASE - timedelta(microseconds=1),))
    return minutes


def _fired(url: str) -> tuple[list[tuple[str, datetime]], list[tuple[str, dict, int]]]:
    """(schedule, tick) of every task a schedule enqueued, and (stage, payload, priority) of each."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT key, stage, payload, priority FROM queue.live_tasks "
                            "WHERE key LIKE 'schedule:%' ORDER BY id").fetchall()
    pairs = []
    for key, *_ in rows:
        _, name, tick = key.split(":", 2)
        pairs.append((name, datetime.strptime(tick, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)))
    return pairs, [tuple(r[1:]) for r in rows]


def _run_sessions(url: str, plan: list[list[datetime]], barrier: threading.Barrier | None,
                  hold: float) -> list[list[int]]:
    """Each session calls fire_schedules(now) for its list of times, each call in its own
    transaction held open up to `hold` seconds; with a barrier, all sessions call with the same
    time together. Returns each session's counts."""
    counts: list[list[int]] = [[] for _ in plan]
    errors: list[BaseException] = []

    def session(n: int) -> None:
        rng = random.Random(n)
        try:
            with psycopg.connect(url) as conn:
                for now in plan[n]:
                    if barrier is not None:
                        barrier.wait()
                    counts[n].append(conn.execute("SELECT queue.fire_schedules(%s)", (now,)).fetchone()[0])
                    if hold:
                        conn.execute("SELECT pg_sleep(%s)", (rng.random() * hold,))
                    conn.commit()
        except BaseException as e:  # reported by the main thread
            errors.append(e)
            if barrier is not None:
                barrier.abort()

    threads = [threading.Thread(target=session, args=(n,), name=f"fire-{n}") for n in range(len(plan))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a session hung"
    assert not errors, f"a session failed: {errors[0]!r}"
    return counts


def test_sessions_firing_the_same_ticks_enqueue_exactly_one_task_per_schedule_and_tick(sched_db: str):
    minutes = _make_schedules(sched_db)
    times = [BASE + timedelta(minutes=k) + OFFSET for k in range(STEPS)]
    barrier = threading.Barrier(SESSIONS, timeout=60)
    counts = _run_sessions(sched_db, [times] * SESSIONS, barrier, hold=0.005)

    pairs, tasks = _fired(sched_db)
    per_pair = Counter(pairs)
    twice = [p for p, c in per_pair.items() if c > 1]
    assert not twice, f"(schedule, tick) enqueued more than once: {twice[:10]}"
    # Every minute of the run was called, so no tick was missed: each one that fell in the run fired.
    expected = {(name, BASE + timedelta(minutes=k))
                for name, mins in minutes.items() for k in range(STEPS) if (BASE.minute + k) % 60 in mins}
    assert set(per_pair) == expected, (
        f"missing: {sorted(expected - set(per_pair))[:10]}; unexpected: {sorted(set(per_pair) - expected)[:10]}")
    # The sessions' counts add up to the tasks, and the racing really happened: several sessions fired.
    assert sum(map(sum, counts)) == len(pairs)
    assert sum(1 for c in counts if sum(c) > 0) > 1, f"only one session ever fired: {[sum(c) for c in counts]}"
    # Each task carries its schedule's payload, stage and priority.
    names = [name for name, _ in pairs]
    assert all(stage == STAGE and payload == {"schedule": name} and priority == int(name[3:5])
               for name, (stage, payload, priority) in zip(names, tasks))

    with psycopg.connect(sched_db) as conn:
        state = {name: (last, nxt) for name, last, nxt in
                 conn.execute("SELECT name, last_fired, next_fire FROM queue.schedules").fetchall()}
    end = times[-1]
    for name, mins in minutes.items():
        ticks = sorted(t for n, t in pairs if n == name)
        after = next(end.replace(second=0) + timedelta(minutes=m) for m in range(1, 121)
                     if (end.minute + m) % 60 in mins)
        assert state[name] == (ticks[-1], after), name


def test_sessions_at_different_times_never_enqueue_a_tick_twice(sched_db: str):
    minutes = _make_schedules(sched_db)
    # Every session walks forward through its own random selection of times, without waiting for
    # the others: calls for earlier and later times race on the same schedules.
    rng = random.Random(20300101)
    all_times = [BASE + timedelta(minutes=k) + OFFSET for k in range(STEPS)]
    plan = [sorted(rng.sample(all_times, STEPS // 2)) for _ in range(SESSIONS)]
    counts = _run_sessions(sched_db, plan, None, hold=0.002)

    pairs, _ = _fired(sched_db)
    per_pair = Counter(pairs)
    twice = [p for p, c in per_pair.items() if c > 1]
    assert not twice, f"(schedule, tick) enqueued more than once: {twice[:10]}"
    assert sum(map(sum, counts)) == len(pairs)
    # Every task is for a real tick of its schedule within the run (a session may skip ticks when
    # another holds the schedule, which is the documented no-burst behaviour, but never invents one).
    last = max(max(p) for p in plan)
    bad = [(n, t) for n, t in pairs if t.minute not in minutes[n] or not BASE <= t <= last]
    assert not bad, f"tasks for times that are no tick: {bad[:10]}"
    assert len(pairs) > len(minutes), "too few firings to mean anything"
