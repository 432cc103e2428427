"""History partitions rotate while workers finish tasks at full speed, and rotation barely waits.

queue.rotate_partitions() and queue.maintain() run in a loop with an injected `now` that moves
forward, so partitions are created and dropped while finishes insert into queue.history; no
worker may see an error, and every task must end up in history exactly once. Then, from other
sessions, the cases a single pgTAP transaction cannot show: rotation gets its turn between
finishes that never leave queue.history unlocked, a partition locked by someone else is skipped
within about 100 ms ('skipped: busy'), a second rotation returns at once ('skipped: rotation
running'), and creating a future partition does not wait for in-flight finishes.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

import psycopg
import pytest

import workload
from dev.testrun import create_database, drop_database

STAGE = "rot.load"
TASKS = 20_000
CHUNK = 2_500
WORKERS = 6
DRAIN_DEADLINE = 180.0  # seconds; a hang fails instead of blocking (the other drains allow as much)


@pytest.fixture
def rot_db(admin_url: str, template_db: str) -> Iterator[str]:
    """A fresh database built by the migrations, one per test (each changes the policy)."""
    url = create_database(admin_url, "rotation", template=template_db)  # alembic upgrade head: what we ship
    try:
        yield url
    finally:
        drop_database(admin_url, url)


def utc_day(conn: psycopg.Connection) -> datetime:
    """Midnight UTC of the server's today (the day real finishes land in)."""
    return conn.execute("SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'").fetchone()[0]


def partitions(conn: psycopg.Connection) -> dict[str, tuple[datetime, datetime]]:
    return {name: (r.lower, r.upper) for name, r in conn.execute(
        "SELECT h.name, h.range FROM queue._history_partitions() h").fetchall()}


def day_name(day: datetime) -> str:
    return "history_" + day.astimezone(timezone.utc).strftime("%Y%m%d")


def rotate(conn: psycopg.Connection, now: datetime | None = None) -> list[tuple[str, str | None, str]]:
    if now is None:
        return conn.execute("SELECT action, partition, detail FROM queue.rotate_partitions()").fetchall()
    return conn.execute("SELECT action, partition, detail FROM queue.rotate_partitions(%s)", (now,)).fetchall()


def test_rotation_and_maintain_under_worker_load_lose_no_task(rot_db: str, tmp_path: Path):
    with psycopg.connect(rot_db, autocommit=True) as conn:
        today = utc_day(conn)
        # Old partitions to drop during the load, each holding a few finished rows of long ago.
        conn.execute("SELECT queue.configure_history(retention => '400 days', premake => 3, rotate_every => '1 minute')")
        for d in range(-40, 1):
            rotate(conn, today + timedelta(days=d, hours=12))
        conn.execute("""
            INSERT INTO queue.history (id, stage, status, priority, run_at, payload, attempt, created, started, finished)
            SELECT -g, 'rot.old', 'done', 0, f, '{}', 1, f, f, f
              FROM generate_series(1, 400) g,
                   LATERAL (SELECT %s::timestamptz - g * interval '2 hours') AS t(f)""", (today,))
        old_rows = conn.execute("SELECT count(*) FROM queue.history_default").fetchone()[0]
        assert old_rows == 0, "the seeded rows of long ago must sit in their dated partitions"
        before = partitions(conn)
        assert day_name(today) in before and day_name(today + timedelta(days=3)) in before
        assert day_name(today - timedelta(days=40)) in before
        conn.execute("SELECT queue.configure_history(retention => '30 days')")
        ids: list[int] = []
        for start in range(0, TASKS, CHUNK):
            payloads = [f'{{"n": {n}}}' for n in range(start, start + CHUNK)]
            ids += [r[0] for r in conn.execute(
                "SELECT queue.enqueue_batch(%s::jsonb[], stage => %s)", (payloads, STAGE)).fetchall()]
        conn.execute("SELECT queue.configure_stage(%s, max_attempts => 1000)", (STAGE,))

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    deadline = time.monotonic() + DRAIN_DEADLINE
    outs = [str(tmp_path / f"drain-{i}.pickle") for i in range(WORKERS)]
    procs = [ctx.Process(target=workload.drain,
                         args=(rot_db, i, [STAGE], {}, stop, outs[i], 1000 + i, deadline + 10),
                         kwargs={"retry_rate": 0.02, "fatal_rate": 0.01},
                         name=f"drain-{i}", daemon=True)
             for i in range(WORKERS)]

    # Two rotators: one calls rotate_partitions, the other maintain, each with its own `now`
    # moving forward an hour a call (a day every 24 calls), up to 25 days ahead: the retention
    # cutoff then stays before today, so the partition real finishes land in is never dropped.
    rotator_stop = threading.Event()
    results: dict[str, Counter] = {"rotate": Counter(), "maintain": Counter()}
    errors: list[BaseException] = []
    calls = Counter()

    def rotator(kind: str) -> None:
        try:
            with psycopg.connect(rot_db, autocommit=True) as c:
                c.execute("SET statement_timeout = '10s'")  # rotation waits 100 ms at most: a hang is a failure
                step = 0
                while not rotator_stop.is_set():
                    now = today + timedelta(hours=12 + min(step, 25 * 24))
                    if kind == "rotate":
                        for action, _part, _detail in rotate(c, now):
                            results[kind][action] += 1
                    else:
                        for task, count, detail in c.execute(
                                "SELECT task, count, detail FROM queue.maintain(%s)", (now,)).fetchall():
                            if task == "rotate_partitions":
                                for item in (detail or "").split("; "):
                                    key = "not due" if item.startswith("not due") else item.split(" queue.")[0]
                                    results[kind][key] += 1
                    calls[kind] += 1
                    step += 1
                    time.sleep(0.01)
        except BaseException as e:  # reported by the test thread
            errors.append(e)

    threads = [threading.Thread(target=rotator, args=(k,), daemon=True) for k in ("rotate", "maintain")]
    started = time.monotonic()
    try:
        for p in procs:
            p.start()
        for t in threads:
            t.start()
        with psycopg.connect(rot_db, autocommit=True) as conn:
            while True:
                live = conn.execute("SELECT count(*) FROM queue.live_tasks WHERE stage = %s", (STAGE,)).fetchone()[0]
                if live == 0:
                    break
                assert time.monotonic() < deadline, f"{live} tasks still live after {DRAIN_DEADLINE} s: a hang"
                assert all(p.is_alive() for p in procs), f"a worker died: exit codes {[p.exitcode for p in procs]}"
                assert not errors, f"a rotator failed: {errors!r}"
                time.sleep(0.2)
        elapsed = time.monotonic() - started
    finally:
        rotator_stop.set()
        for t in threads:
            t.join(15)
        workload.stop_processes(procs, stop)

    assert not errors, f"a rotator failed: {errors!r}"
    assert not any(t.is_alive() for t in threads), "a rotator hung"
    assert [p.exitcode for p in procs] == [0] * WORKERS, "a worker failed (an error in finish or fail?)"
    records = [workload.read_record(o) for o in outs]
    assert [r["lost"] for r in records] == [0] * WORKERS, "a finish or fail found its lease gone"
    assert all(r["takes"] for r in records)

    # Rotation really happened during the load: partitions made and dropped while workers finished.
    done = results["rotate"] + results["maintain"]
    assert done["created"] > 0, f"no partition created under load: {dict(done)}"
    assert done["dropped"] > 0, f"no partition dropped under load: {dict(done)}"
    print(f"\ndrained {TASKS} tasks with {WORKERS} workers in {elapsed:.1f} s; rotate_partitions calls "
          f"{calls['rotate']}: {dict(results['rotate'])}; maintain calls {calls['maintain']}: {dict(results['maintain'])}")

    with psycopg.connect(rot_db, autocommit=True) as conn:
        # Every task is in history exactly once, in a dated partition (none fell to the default).
        rows = conn.execute("""
            SELECT h.id, h.status::text, h.tableoid::regclass::text
              FROM queue.history h WHERE h.stage = %s""", (STAGE,)).fetchall()
        per_id = Counter(r[0] for r in rows)
        assert set(per_id) == set(ids), (
            f"missing from history: {sorted(set(ids) - set(per_id))[:10]}; "
            f"strangers: {sorted(set(per_id) - set(ids))[:10]}")
        doubled = [i for i, c in per_id.items() if c > 1]
        assert not doubled, f"tasks in history more than once: {doubled[:10]}"
        outcomes = Counter(o for r in records for _, _, o in r["results"])
        assert Counter(r[1] for r in rows) == Counter({"done": outcomes["done"], "fatal": outcomes["fatal"]})
        assert {r[2] for r in rows} <= {f"queue.{day_name(today)}", f"queue.{day_name(today + timedelta(days=1))}"}, \
            "finished tasks must land in today's premade partition (or tomorrow's, past midnight UTC)"

        # Without load, one more rotation at the last `now` leaves what the policy asks for: the
        # partitions of that day and the premake (3) days after it, and none whose whole range is
        # older than the cutoff. (Days between the load's last `now` and this one are not
        # back-filled: rotation makes partitions from the current period on.)
        last = today + timedelta(hours=12 + 25 * 24)
        rotate(conn, last)
        cutoff = last - timedelta(days=30)
        have = set(partitions(conn))
        ahead = {day_name(today + timedelta(days=25 + k)) for k in range(4)}  # premake 3
        assert ahead <= have, f"missing partitions ahead of the last rotation: {sorted(ahead - have)}"
        expired = sorted(p for p in have if datetime.strptime(p[len("history_"):], "%Y%m%d").replace(
            tzinfo=timezone.utc) + timedelta(days=1) <= cutoff)
        assert not expired, f"partitions past the retention still there: {expired}"
        # The seeded rows of long ago went with their partitions, never row by row.
        kept_old = conn.execute("SELECT count(*), min(finished) FROM queue.history WHERE stage = 'rot.old'").fetchone()
        assert kept_old[0] < 400 and (kept_old[0] == 0 or kept_old[1] >= cutoff - timedelta(days=1))


def test_a_locked_partition_is_skipped_at_once_and_dropped_next_time(rot_db: str):
    with psycopg.connect(rot_db, autocommit=True) as conn, \
            psycopg.connect(rot_db, autocommit=True) as holder:
        conn.execute("SET statement_timeout = '20s'")  # rotation waits 100 ms at most: a hang fails here
        conn.execute("SELECT queue.configure_history(retention => '4000 days', premake => 3)")
        rotate(conn, datetime(2020, 3, 1, 12, tzinfo=timezone.utc))   # history_20200301 … _20200304
        conn.execute("SELECT queue.configure_history(retention => '30 days')")

        with holder.transaction():
            holder.execute("SELECT count(*) FROM queue.history_20200301")   # holds ACCESS SHARE on it
            holder_pid = holder.info.backend_pid
            t0 = time.monotonic()
            rows = rotate(conn)
            took = time.monotonic() - t0
            # 100 ms for the lock, then on; waiting for the holder would never end (it lets go after)
            assert took < 10.0, f"rotate_partitions waited {took:.1f} s for a lock"
            by_part = {p: (a, d) for a, p, d in rows}
            action, detail = by_part["queue.history_20200301"]
            assert action == "skipped: busy"
            assert f"pid {holder_pid} AccessShareLock" in detail, detail
            for day in ("20200302", "20200303", "20200304"):
                assert by_part[f"queue.history_{day}"][0] == "dropped"
            assert "history_20200301" in partitions(conn)

        # The lock is gone: the next rotation drops it.
        rows = rotate(conn)
        assert ("dropped", "queue.history_20200301") in {(a, p) for a, p, _ in rows}
        assert not any(n.startswith("history_2020") for n in partitions(conn))


def test_rotation_drops_partitions_while_finishes_keep_history_locked_without_a_gap(rot_db: str):
    """Busy workers always have a finish in flight: some session holds ROW EXCLUSIVE on
    queue.history at every instant. A LOCK … NOWAIT never found a gap (every drop of the
    benchmark's 10-minute soak was skipped); rotation waits briefly instead, so it gets its turn
    between two finishes, and the finishes wait for it no longer than that."""
    with psycopg.connect(rot_db, autocommit=True) as conn:
        conn.execute("SET statement_timeout = '20s'")
        conn.execute("SELECT queue.configure_history(retention => '4000 days', premake => 3)")
        rotate(conn, datetime(2020, 3, 1, 12, tzinfo=timezone.utc))   # history_20200301 … _20200304
        conn.execute("SELECT queue.configure_history(retention => '30 days')")

        stop = threading.Event()
        waits: list[float] = []
        errors: list[BaseException] = []

        def finisher(offset: float) -> None:
            # Each holds the lock a finish takes for 30 ms at a time; three of them, staggered,
            # overlap, so the table is never free. A holder lets go within 30 ms of the rotation's
            # request, well inside its 100 ms wait even on a loaded machine.
            try:
                with psycopg.connect(rot_db, autocommit=True) as c:
                    time.sleep(offset)
                    while not stop.is_set():
                        with c.transaction():
                            t0 = time.monotonic()
                            c.execute("LOCK TABLE queue.history IN ROW EXCLUSIVE MODE")
                            waits.append(time.monotonic() - t0)
                            time.sleep(0.03)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=finisher, args=(k * 0.01,), daemon=True) for k in range(3)]
        for t in threads:
            t.start()
        try:
            # The finishers connect and start (on a busy machine that may take seconds).
            held, ready_by = 0, time.monotonic() + 60
            while held < 1 and not errors:
                assert time.monotonic() < ready_by, "the finishers never held queue.history"
                time.sleep(0.05)
                held = conn.execute("SELECT count(*) FROM pg_locks WHERE relation = 'queue.history'::regclass"
                                    " AND mode = 'RowExclusiveLock' AND granted").fetchone()[0]
            assert not errors, errors
            # On a quiet machine the first rotation drops all four. On a loaded one a holder may not
            # be scheduled to let go within the 100 ms: that partition is 'skipped: busy' and the
            # next rotation tries again, as the scheduled one would. Never a gap, never a drop.
            wanted = {f"queue.history_2020030{d}" for d in range(1, 5)}
            dropped: set[str] = set()
            calls: list[list[tuple[str, str | None, str]]] = []
            give_up = time.monotonic() + 120
            while not wanted <= dropped and time.monotonic() < give_up:
                t0 = time.monotonic()
                rows = rotate(conn)
                took = time.monotonic() - t0
                calls.append(rows)
                assert took < 10.0, f"rotate_partitions took {took:.1f} s"
                dropped |= {p for a, p, _ in rows if a == "dropped"}
        finally:
            stop.set()
            for t in threads:
                t.join(5)
        assert not errors, errors
        assert wanted <= dropped, f"not dropped in {len(calls)} rotations within 120 s: {calls[-1]}"
        print(f"\ndropped while finishes held queue.history, in {len(calls)} rotation(s)")
        # The finishers queued behind the rotation's lock for about as long as it waited and worked
        # (well under a second; the bound leaves room for a loaded machine, not for a pile-up).
        assert max(waits) < 15.0, f"a finish waited {max(waits):.2f} s for its lock"


def test_a_reader_of_history_makes_drops_busy_but_not_slow(rot_db: str):
    with psycopg.connect(rot_db, autocommit=True) as conn, \
            psycopg.connect(rot_db, autocommit=True) as reader:
        conn.execute("SET statement_timeout = '20s'")
        conn.execute("SELECT queue.configure_history(retention => '4000 days', premake => 3)")
        rotate(conn, datetime(2020, 3, 1, 12, tzinfo=timezone.utc))
        conn.execute("SELECT queue.configure_history(retention => '30 days')")
        with reader.transaction():
            # A report over all of history: ACCESS SHARE on queue.history and every partition.
            reader.execute("SELECT count(*) FROM queue.history")
            took = float("inf")
            for _ in range(3):  # load only adds time: the fastest try is what the code takes
                t0 = time.monotonic()
                rows = rotate(conn, datetime.now(timezone.utc) + timedelta(days=10))
                took = min(took, time.monotonic() - t0)
                assert rows and all(a == "skipped: busy" for a, _, _ in rows), rows
                if took < 0.75:
                    break
            # It waited 100 ms for the first lock, then 1 ms at most for each of the others.
            assert len(rows) >= 8 and took < 0.75, f"{len(rows)} locks busy, {took:.2f} s"
            # Creations need ACCESS EXCLUSIVE on the default partition, drops on queue.history.
            assert any("queue.history_default is locked by" in d for a, _, d in rows)
            assert any("queue.history is locked by" in d for a, _, d in rows)
        rows = rotate(conn, datetime.now(timezone.utc) + timedelta(days=10))
        assert not any(a.startswith("skipped") for a, _, _ in rows), rows


def test_creating_future_partitions_does_not_wait_for_inflight_finishes(rot_db: str):
    with psycopg.connect(rot_db, autocommit=True) as conn, \
            psycopg.connect(rot_db, autocommit=True) as worker:
        conn.execute("SET statement_timeout = '20s'")
        conn.execute("SELECT queue.configure_history(premake => 3)")
        worker.execute("SELECT queue.enqueue('{}', stage => 'rot.w')")
        task_id, lease = worker.execute("SELECT id, lease FROM queue.take_next('rot.w')").fetchone()
        today = utc_day(conn)
        with worker.transaction():
            # A finish not yet committed: ROW EXCLUSIVE on queue.history and today's partition.
            assert worker.execute("SELECT queue.finish(%s, %s)", (task_id, lease)).fetchone()[0]
            t0 = time.monotonic()
            rows = rotate(conn, today + timedelta(days=10, hours=12))
            assert time.monotonic() - t0 < 2.0
            created = {p for a, p, _ in rows if a == "created"}
            assert created == {f"queue.{day_name(today + timedelta(days=d))}" for d in range(10, 14)}, rows
            # …but dropping today's partition (past a 1-day retention) needs ACCESS EXCLUSIVE on
            # queue.history, which the finish in flight holds a conflicting lock on.
            conn.execute("SELECT queue.configure_history(retention => '1 day', premake => 3)")
            rows = rotate(conn, today + timedelta(days=10, hours=12))
            busy = {p for a, p, _ in rows if a == "skipped: busy"}
            assert f"queue.{day_name(today)}" in busy, rows
        where = worker.execute("SELECT tableoid::regclass::text FROM queue.history WHERE id = %s", (task_id,)).fetchone()
        assert where == (f"queue.{day_name(today)}",)


def test_a_second_rotation_returns_at_once_while_one_runs(rot_db: str):
    with psycopg.connect(rot_db, autocommit=True) as first, \
            psycopg.connect(rot_db, autocommit=True) as second:
        second.execute("SET statement_timeout = '20s'")
        with first.transaction():
            first.execute("SELECT * FROM queue.rotate_partitions()").fetchall()   # holds the rotation lock
            t0 = time.monotonic()
            rows = rotate(second)
            assert time.monotonic() - t0 < 2.0
            assert rows == [("skipped: rotation running", None,
                             f"Session {first.info.backend_pid} is rotating queue.history; this call did nothing.")]
            # maintain() in another session, an hour later, sees the rotation is due but leaves
            # it to the session that holds the lock, and still reaps.
            got = second.execute("SELECT task, count, detail FROM queue.maintain(now() + interval '1 hour')"
                                 " WHERE task NOT IN ('compact', 'stage_waiters', 'roll_up_hours', 'finished_counts')").fetchall()
            assert got == [("reap_hung", 0, "no expired lease"),
                           ("fire_schedules", 0, "no schedule due"),
                           ("rotate_partitions", 0, "due, but another session is rotating")]


def test_the_roll_up_skips_a_round_while_another_session_holds_history(rot_db: str):
    """maintain()'s roll_up_hours step (_roll_up_hours) waits at most 100 ms for queue.history (a
    rotation in another session holds it ACCESS EXCLUSIVE to its commit): it skips the round,
    writing nothing, and the next call rolls the minutes up. (reap_hung, before it in maintain(),
    waits for that lock as it always has.)"""
    with psycopg.connect(rot_db, autocommit=True) as holder, \
            psycopg.connect(rot_db, autocommit=True) as conn:
        conn.execute("SET statement_timeout = '60s'")
        conn.execute("UPDATE queue.finished_hours_clock SET rolled_to = NULL")  # due: never rolled up
        with holder.transaction():
            holder.execute("LOCK TABLE queue.history IN ACCESS EXCLUSIVE MODE")
            t0 = time.monotonic()
            got = conn.execute("SELECT queue._roll_up_hours(now())").fetchall()
            assert time.monotonic() - t0 < 30.0
            assert got == [(0,)]
            assert conn.execute("SELECT rolled_to FROM queue.finished_hours_clock").fetchone() == (None,)
        got = conn.execute("SELECT count FROM queue.maintain() WHERE task = 'roll_up_hours'").fetchall()
        assert got == [(1440,)]  # a day at most a call, from 8 days back
