"""Dependencies under concurrency: the end of the last awaited task makes the waiting one ready,
even when the last two end at once in two transactions (the fan-in race), under READ COMMITTED
and REPEATABLE READ; and a crowd of workers ending awaited tasks (done, fatal) in any order leaves
every waiting task exactly where its policy puts it, with no edge left behind.
"""

from __future__ import annotations

import random
import threading
import time

import psycopg
import pytest

DEADLINE = 120.0  # seconds: bounds against a hang, never reached when the code is right


def _blocked(admin: psycopg.Connection, pid: int) -> None:
    """Waits until backend pid waits for a lock (the event, not a sleep), or fails after DEADLINE."""
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        row = admin.execute("SELECT wait_event_type FROM pg_catalog.pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        if row and row[0] == "Lock":
            return
        time.sleep(0.01)
    pytest.fail(f"backend {pid} never waited for a lock")


def _take(conn: psycopg.Connection, stage: str) -> tuple[int, str]:
    row = conn.execute("SELECT id, lease::text FROM queue.take_next(%s)", (stage,)).fetchone()
    assert row is not None
    return row[0], row[1]


@pytest.mark.parametrize("isolation", ["read committed", "repeatable read"])
def test_the_last_two_awaited_tasks_ending_at_once_make_the_waiting_one_ready(db: str, isolation: str):
    """Two workers finish the last two awaited tasks in two open transactions: the second finish
    meets the first on the waiting task's row. Whichever commits first, the waiting task is ready
    once both have: never missed (both seeing the other's task still live), never counted twice.
    REPEATABLE READ may refuse the second with 40001; its retry then makes the task ready."""
    stage = f"fanin.{isolation.split()[0]}"
    with psycopg.connect(db, autocommit=True) as admin, \
            psycopg.connect(db, autocommit=True) as w1, psycopg.connect(db, autocommit=True) as w2:
        for round_ in range(5):
            a = admin.execute("SELECT queue.enqueue('{}', %s)", (stage + ".p",)).fetchone()[0]
            b = admin.execute("SELECT queue.enqueue('{}', %s)", (stage + ".p",)).fetchone()[0]
            c = admin.execute("SELECT queue.enqueue('{}', %s, after => %s)", (stage + ".c", [a, b])).fetchone()[0]
            first, second = (w1, w2) if round_ % 2 == 0 else (w2, w1)
            ta, tb = _take(first, stage + ".p"), _take(second, stage + ".p")
            first.execute(f"BEGIN ISOLATION LEVEL {isolation.upper()}")
            second.execute(f"BEGIN ISOLATION LEVEL {isolation.upper()}")
            second.execute("SELECT 1")  # takes its snapshot now, before the first commits
            assert first.execute("SELECT queue.finish(%s, %s::uuid)", ta).fetchone()[0] is True
            result: list[object] = []

            def finish_second() -> None:
                try:
                    result.append(second.execute("SELECT queue.finish(%s, %s::uuid)", tb).fetchone()[0])
                except psycopg.Error as e:
                    result.append(e.sqlstate)

            thread = threading.Thread(target=finish_second)
            thread.start()
            _blocked(admin, second.info.backend_pid)  # it waits for the first on the waiting task's row
            first.execute("COMMIT")
            thread.join(DEADLINE)
            assert not thread.is_alive()
            if result == ["40001"]:
                assert isolation == "repeatable read", result
                second.execute("ROLLBACK")
                second.execute(f"BEGIN ISOLATION LEVEL {isolation.upper()}")
                assert second.execute("SELECT queue.finish(%s, %s::uuid)", tb).fetchone()[0] is True
            else:
                assert result == [True], result
            second.execute("COMMIT")
            status, waits = admin.execute("SELECT status::text, waits FROM queue.live_tasks WHERE id = %s", (c,)).fetchone()
            assert (status, waits) == ("ready", 0), f"round {round_}: the waiting task is {status} with {waits} to wait for"
            assert admin.execute("SELECT count(*) FROM queue.dependencies WHERE task = %s", (c,)).fetchone()[0] == 0


@pytest.mark.parametrize("seed", [50, 51, 52, 53])
def test_workers_ending_awaited_tasks_in_any_order_resolve_every_waiting_task(db: str, seed: int):
    """120 awaited tasks and 200 waiting ones (each for 1 to 5 random awaited tasks, policy cancel
    or run); 6 workers take and end the awaited tasks concurrently, 1 in 8 fatally. Afterwards
    each waiting task is ready when all it waited for were done or its policy is 'run', else
    cancelled; no edge and no waiting task is left."""
    rng = random.Random(seed)
    p_stage, c_stage = f"crowd{seed}.p", f"crowd{seed}.c"
    with psycopg.connect(db, autocommit=True) as admin:
        parents = [admin.execute("SELECT queue.enqueue(%s::jsonb, %s)", (f'{{"fatal": {str(rng.random() < 0.125).lower()}}}', p_stage)).fetchone()[0]
                   for _ in range(120)]
        children: dict[int, tuple[list[int], str]] = {}
        for _ in range(200):
            after = rng.sample(parents, rng.randint(1, 5))
            policy = rng.choice(["cancel", "run"])
            cid = admin.execute("SELECT queue.enqueue('{}', %s, after => %s, after_failed => %s)",
                                (c_stage, after, policy)).fetchone()[0]
            children[cid] = (after, policy)
        errors: list[str] = []

        def worker(n: int) -> None:
            try:
                with psycopg.connect(db, autocommit=True) as conn:
                    end = time.monotonic() + DEADLINE
                    while time.monotonic() < end:
                        row = conn.execute("SELECT id, lease, payload FROM queue.take_next(%s)", (p_stage,)).fetchone()
                        if row is None:
                            return
                        if row[2]["fatal"]:
                            conn.execute("SELECT queue.fail(%s, %s, 'boom', fatal => true)", row[:2])
                        else:
                            conn.execute("SELECT queue.finish(%s, %s)", row[:2])
                    errors.append(f"worker {n} still busy after {DEADLINE} s")
            except Exception as e:  # noqa: BLE001 - reported below, with the worker's number
                errors.append(f"worker {n}: {e!r}")

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DEADLINE + 10)
        assert not errors, errors
        final = dict(admin.execute("SELECT id, status::text FROM queue.history WHERE stage = %s", (p_stage,)).fetchall())
        assert len(final) == len(parents)
        got = dict(admin.execute("SELECT id, status::text FROM queue.tasks WHERE stage = %s", (c_stage,)).fetchall())
        expected = {cid: "ready" if policy == "run" or all(final[p] == "done" for p in after) else "cancelled"
                    for cid, (after, policy) in children.items()}
        assert got == expected
        assert admin.execute("SELECT count(*) FROM queue.dependencies d JOIN queue.tasks t ON t.id = d.task"
                             " WHERE t.stage = %s", (c_stage,)).fetchone()[0] == 0
        assert set(expected.values()) == {"ready", "cancelled"}, "the draw exercised both outcomes"


@pytest.mark.parametrize("first", ["enqueue", "finish"])
def test_an_enqueue_after_a_task_that_ends_meanwhile_is_resolved_either_way(db: str, first: str):
    """A producer enqueues a task after P while a worker finishes P, each in an open transaction:
    whichever writes first, the other waits for its commit, and the new task ends up ready: the
    finish sees the mark the enqueue left (and the edge), or the enqueue finds P in history."""
    stage = f"race.{first}"
    with psycopg.connect(db, autocommit=True) as admin, \
            psycopg.connect(db, autocommit=True) as producer, psycopg.connect(db, autocommit=True) as worker:
        p = admin.execute("SELECT queue.enqueue('{}', %s)", (stage,)).fetchone()[0]
        taken = _take(worker, stage)
        producer.execute("BEGIN")
        worker.execute("BEGIN")
        result: list[object] = []
        if first == "enqueue":
            child = producer.execute("SELECT queue.enqueue('{}', %s, after => %s)", (stage + ".c", [p])).fetchone()[0]
            blocked, call = worker, lambda: result.append(worker.execute(
                "SELECT queue.finish(%s, %s::uuid)", taken).fetchone()[0])
        else:
            assert worker.execute("SELECT queue.finish(%s, %s::uuid)", taken).fetchone()[0] is True
            blocked, call = producer, lambda: result.append(producer.execute(
                "SELECT queue.enqueue('{}', %s, after => %s)", (stage + ".c", [p])).fetchone()[0])
        thread = threading.Thread(target=call)
        thread.start()
        _blocked(admin, blocked.info.backend_pid)
        (producer if first == "enqueue" else worker).execute("COMMIT")
        thread.join(DEADLINE)
        assert not thread.is_alive()
        blocked.execute("COMMIT")
        if first == "finish":
            child = result[0]
        else:
            assert result == [True]
        assert admin.execute("SELECT status::text, waits FROM queue.live_tasks WHERE id = %s", (child,)).fetchone() == ("ready", 0)
        assert admin.execute("SELECT count(*) FROM queue.dependencies WHERE task = %s", (child,)).fetchone()[0] == 0
