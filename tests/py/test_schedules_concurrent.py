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


OVERLAP_SCHEDULES = 12


def test_schedules_without_overlap_never_have_two_live_tasks_while_sessions_fire_run_now_and_work(sched_db: str):
    """schedule(…, overlap => false) under concurrency: sessions fire the same ticks and call
    run_schedule_now at random while workers take, fail, move on and finish the tasks, and a
    sampler reads, snapshot after snapshot, how many live tasks each schedule has: never two."""
    names = [f"ov-{i:02d}" for i in range(OVERLAP_SCHEDULES)]
    stages = [f"ov.{i:02d}" for i in range(OVERLAP_SCHEDULES)]
    with psycopg.connect(sched_db, autocommit=True) as conn:
        for name, stage in zip(names, stages):
            conn.execute("SELECT queue.schedule(%s, '* * * * *', stage => %s, overlap => false)", (name, stage))
        conn.execute("UPDATE queue.schedules SET next_fire = %s", (BASE,))
    times = [BASE + timedelta(minutes=k) + OFFSET for k in range(STEPS)]
    firing_done = threading.Event()
    errors: list[BaseException] = []
    enqueued: list[int] = []          # fire_schedules' counts and run_schedule_now's non-NULL ids
    refused: list[str] = []           # run_schedule_now calls that returned NULL
    seen_two: list[tuple] = []
    samples: list[int] = []

    def firer(n: int, barrier: threading.Barrier) -> None:
        rng = random.Random(n)
        try:
            with psycopg.connect(sched_db, autocommit=True) as conn:
                for now in times:
                    barrier.wait()
                    enqueued.append(conn.execute("SELECT queue.fire_schedules(%s)", (now,)).fetchone()[0])
                    if rng.random() < 0.3:
                        name = rng.choice(names)
                        task = conn.execute("SELECT queue.run_schedule_now(%s)", (name,)).fetchone()[0]
                        (enqueued.append(1) if task is not None else refused.append(name))
        except BaseException as e:
            errors.append(e)
            barrier.abort()

    def worker(n: int) -> None:
        rng = random.Random(100 + n)
        try:
            with psycopg.connect(sched_db, autocommit=True) as conn:
                while not firing_done.is_set():
                    stage = rng.choice(stages) + rng.choice(["", ".next"])
                    row = conn.execute("SELECT id, lease FROM queue.take_next(%s)", (stage,)).fetchone()
                    if row is None or row[0] is None:
                        continue
                    conn.execute("SELECT pg_sleep(%s)", (rng.random() * 0.02,))
                    roll = rng.random()
                    if roll < 0.2:
                        conn.execute("SELECT queue.fail(%s, %s, 'flaky', retry_in => interval '0', stage => %s)",
                                     (row[0], row[1], stage))
                    elif roll < 0.4 and not stage.endswith(".next"):
                        conn.execute("SELECT queue.finish(%s, %s, %s, %s)", (row[0], row[1], stage + ".next", stage))
                    else:
                        conn.execute("SELECT queue.finish(%s, %s, stage => %s)", (row[0], row[1], stage))
        except BaseException as e:
            errors.append(e)

    def sampler() -> None:
        try:
            with psycopg.connect(sched_db, autocommit=True) as conn:
                while not firing_done.is_set():
                    # One statement, one snapshot: the live tasks of each schedule at one instant.
                    rows = conn.execute(
                        "SELECT split_part(t.key, ':', 2), count(*) FROM queue.live_tasks t "
                        "WHERE t.key LIKE 'schedule:ov-%' GROUP BY 1 HAVING count(*) > 1").fetchall()
                    seen_two.extend(rows)
                    samples.append(1)
        except BaseException as e:
            errors.append(e)

    barrier = threading.Barrier(SESSIONS // 2, timeout=60)
    firers = [threading.Thread(target=firer, args=(n, barrier)) for n in range(SESSIONS // 2)]
    others = [threading.Thread(target=worker, args=(n,)) for n in range(3)] + [threading.Thread(target=sampler)]
    for t in firers + others:
        t.start()
    for t in firers:
        t.join(120)
    firing_done.set()
    for t in others:
        t.join(120)
    assert not any(t.is_alive() for t in firers + others), "a session hung"
    assert not errors, f"a session failed: {errors[0]!r}"
    assert not seen_two, f"schedules without overlap had two live tasks at once: {seen_two[:10]}"
    with psycopg.connect(sched_db) as conn:
        twice = conn.execute("SELECT split_part(t.key, ':', 2), count(*) FROM queue.live_tasks t "
                             "WHERE t.key LIKE 'schedule:ov-%' GROUP BY 1 HAVING count(*) > 1").fetchall()
        done = conn.execute("SELECT count(*) FROM queue.history WHERE key LIKE 'schedule:ov-%' "
                            "AND stage NOT LIKE '%.next' AND status = 'done'").fetchone()[0]
    assert not twice, f"two live tasks of a schedule at the end: {twice}"
    # It was exercised: ticks were skipped (fewer tasks than ticks), tasks still ran to the end and
    # new ones were enqueued after them, run_schedule_now was refused while one was live, and the
    # sampler looked many times.
    fired = sum(enqueued)
    assert OVERLAP_SCHEDULES < fired < OVERLAP_SCHEDULES * STEPS, fired
    assert done > OVERLAP_SCHEDULES, done
    assert refused, "run_schedule_now was never refused"
    assert len(samples) > 50, len(samples)
