"""History modes beside other sessions: concurrent finishes of a stage that keeps no history count
every run exactly once, each backend in rows of its own; a rolled-back finish takes its count back;
configure_stage(history => …) does not wait for a task a take_locked transaction holds, which
keeps the mode it had. (One session: tests/sql/106_history_modes.sql.)"""

from __future__ import annotations

import threading
import time

import psycopg

BOUND = 120.0  # against hangs only


def _work(db: str, stage: str, locked: bool, errors: list[BaseException], done: dict[int, int]) -> None:
    """Take and finish tasks of stage one at a time until none is left; done[backend] = how many."""
    try:
        with psycopg.connect(db, autocommit=True) as c:
            pid = c.info.backend_pid
            done[pid] = 0
            deadline = time.monotonic() + BOUND
            while time.monotonic() < deadline:
                if locked:
                    with c.transaction():
                        row = c.execute("SELECT id FROM queue.take_locked(%s)", (stage,)).fetchone()
                        if row is None:
                            return
                        assert c.execute("SELECT queue.finish_locked(%s)", (row[0],)).fetchone() == (True,)
                    done[pid] += 1
                else:
                    row = c.execute("SELECT id, lease FROM queue.take_next(%s)", (stage,)).fetchone()
                    if row is None:
                        return
                    assert c.execute("SELECT queue.finish(%s, %s)", row).fetchone() == (True,)
                    done[pid] += 1
            raise AssertionError("the stage was not emptied in time")
    except BaseException as e:  # reported by the test
        errors.append(e)


def test_concurrent_finishes_of_a_none_stage_count_each_run_once(db: str, conn: psycopg.Connection):
    conn.execute("SELECT queue.configure_stage('hm.many', history => 'none')")
    conn.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[400]), 'hm.many')")
    errors: list[BaseException] = []
    done: dict[int, int] = {}
    threads = [threading.Thread(target=_work, args=(db, "hm.many", k % 2 == 0, errors, done)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND)
        assert not t.is_alive(), "a worker hung"
    assert errors == []
    assert conn.execute("SELECT count(*) FROM queue.live_tasks WHERE stage = 'hm.many'").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM queue.history WHERE stage = 'hm.many'").fetchone() == (0,)
    assert conn.execute("SELECT status, total FROM queue.finished_totals WHERE stage = 'hm.many'").fetchall() == [("done", 400)]
    # Each backend counted its runs in rows of its own (no row that every finish updates).
    assert sum(done.values()) == 400
    assert conn.execute("SELECT backend, sum(runs)::integer FROM queue.finished_counts WHERE stage = 'hm.many'"
                        " GROUP BY backend ORDER BY backend").fetchall() == sorted((p, n) for p, n in done.items() if n)
    # A fold keeps the total: nothing is closed yet, nothing moves.
    conn.execute("SELECT * FROM queue.maintain()")
    assert conn.execute("SELECT total FROM queue.finished_totals WHERE stage = 'hm.many'").fetchone() == (400,)


def test_a_rolled_back_finish_takes_its_count_back(db: str, conn: psycopg.Connection):
    conn.execute("SELECT queue.configure_stage('hm.rb', history => 'none')")
    conn.execute("SELECT queue.enqueue('{}', 'hm.rb')")
    with psycopg.connect(db) as worker:
        task = worker.execute("SELECT id FROM queue.take_locked('hm.rb')").fetchone()
        assert worker.execute("SELECT queue.finish_locked(%s)", task).fetchone() == (True,)
        worker.rollback()
    assert conn.execute("SELECT count(*) FROM queue.finished_counts WHERE stage = 'hm.rb'").fetchone() == (0,)
    assert conn.execute("SELECT status::text FROM queue.live_tasks WHERE stage = 'hm.rb'").fetchall() == [("ready",)]


def test_a_mode_change_skips_a_task_take_locked_holds(db: str, conn: psycopg.Connection):
    ids = [r[0] for r in conn.execute(
        "SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[3]), 'hm.held') ORDER BY 1").fetchall()]
    with psycopg.connect(db) as worker:
        held = worker.execute("SELECT id FROM queue.take_locked('hm.held')").fetchone()
        assert held == (ids[0],)
        conn.execute("SET lock_timeout = '5s'")  # a wait would be an error, not a hang
        started = time.monotonic()
        conn.execute("SELECT queue.configure_stage('hm.held', history => 'none')")
        assert time.monotonic() - started < 5
        assert conn.execute("SELECT id, history FROM queue.live_tasks WHERE stage = 'hm.held' ORDER BY id").fetchall() == \
            [(ids[0], None), (ids[1], "none"), (ids[2], "none")]
        assert worker.execute("SELECT queue.finish_locked(%s)", held).fetchone() == (True,)
        worker.commit()
    # The held task ended under the mode it had (all): a history row; the others are counted.
    for _ in ids[1:]:
        conn.execute("SELECT queue.finish(t.id, t.lease) FROM queue.take_next('hm.held') t")
    assert conn.execute("SELECT id FROM queue.history WHERE stage = 'hm.held'").fetchall() == [(ids[0],)]
    assert conn.execute("SELECT status, total FROM queue.finished_totals WHERE stage = 'hm.held'").fetchall() == [("done", 3)]
