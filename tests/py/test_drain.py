"""drain: one consumer a stage, by a tried advisory lock, claiming without a row lock per task. Beside
the other calls on the same tasks, in two sessions: a second drainer and the takes skip (never
wait); a drain waits for a take, cancel or set_priority holding a task and then skips the task if it
changed (the next drain takes it if still waiting); a cancel or set_priority waits for a drain holding the task and then
finds it finished. Nothing is done twice, nothing lost. (One session: tests/sql/105_drain.sql.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest

BOUND = 120.0  # against hangs only: every wait below is for an event


def _ids(conn: psycopg.Connection, sql: str, *params: object) -> list[int]:
    return [r[0] for r in conn.execute(sql, params).fetchall()]


def _waiting_on_a_lock(conn: psycopg.Connection, pid: int) -> None:
    """Return once backend pid waits on a lock (heavyweight: a row's transaction)."""
    deadline = time.monotonic() + BOUND
    while conn.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() != (True,):
        assert time.monotonic() < deadline, f"backend {pid} never waited on a lock"
        time.sleep(0.01)


class Background:
    """A call run in another thread on its own connection; .pid while it runs, .result when done."""

    def __init__(self, db: str, call: Callable[[psycopg.Connection], object]) -> None:
        self.conn = psycopg.connect(db, autocommit=True)
        self.pid = self.conn.info.backend_pid
        self.result: object = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(call,))
        self.thread.start()

    def _run(self, call: Callable[[psycopg.Connection], object]) -> None:
        try:
            self.result = call(self.conn)
        except BaseException as e:  # reported by join
            self.error = e

    def join(self) -> object:
        self.thread.join(BOUND)
        assert not self.thread.is_alive(), "the call hung"
        self.conn.close()
        if self.error:
            raise self.error
        return self.result


def _stage(conn: psycopg.Connection, stage: str, n: int) -> list[int]:
    return _ids(conn, "SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[%s]), %s) ORDER BY 1", n, stage)


def test_a_second_drainer_gets_nothing_at_once_then_the_rest(db: str, conn: psycopg.Connection):
    ids = _stage(conn, "dr.two", 10)
    with psycopg.connect(db) as first:
        got = _ids(first, "SELECT id FROM queue.drain('dr.two', 4)")
        conn.execute("SET lock_timeout = '5s'")  # a wait would be an error, not a hang
        started = time.monotonic()
        assert _ids(conn, "SELECT id FROM queue.drain('dr.two', 4)") == [], "the stage is being drained: nothing"
        assert time.monotonic() - started < 5
        first.commit()
    assert got == ids[:4]
    assert _ids(conn, "SELECT id FROM queue.drain('dr.two', 100)") == ids[4:]


def test_takes_skip_what_a_drain_holds_without_waiting(db: str, conn: psycopg.Connection):
    ids = _stage(conn, "dr.take", 6)
    with psycopg.connect(db) as drainer:
        drained = _ids(drainer, "SELECT id FROM queue.drain('dr.take', 3)")
        conn.execute("SET lock_timeout = '5s'")
        taken = _ids(conn, "SELECT id FROM queue.take_next('dr.take', 10)")
        with psycopg.connect(db) as locker:
            locked = _ids(locker, "SELECT id FROM queue.take_locked('dr.take', 10)")
            consumed = _ids(conn, "SELECT id FROM queue.consume('dr.take', 10)")
            locker.rollback()
        drainer.commit()
    assert drained == ids[:3] and taken == ids[3:] and locked == [] and consumed == []


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_a_drain_waits_for_a_take_locked_then_skips_the_task_it_finished(db: str, conn: psycopg.Connection, end: str):
    stage = f"dr.locked.{end}"
    ids = _stage(conn, stage, 3)
    with psycopg.connect(db) as worker:
        held = _ids(worker, "SELECT id FROM queue.take_locked(%s)", stage)
        assert held == ids[:1]
        # The drain reads the held task as due and waiting, then waits for its row.
        drain = Background(db, lambda c: _ids(c, "SELECT id FROM queue.drain(%s, 10)", stage))
        _waiting_on_a_lock(conn, drain.pid)
        worker.execute("SELECT queue.finish_locked(%s)", (held[0],))
        getattr(worker, end)()
        drained = drain.join()
    if end == "commit":
        assert drained == ids[1:], "the finished task is skipped, not drained again"
        assert conn.execute("SELECT count(*) FROM queue.history WHERE id = %s", (held[0],)).fetchone()[0] == 1
    else:
        assert drained == ids, "the task given back is drained"
    assert _ids(conn, "SELECT id FROM queue.live_tasks WHERE stage = %s", stage) == []


def test_a_drain_waits_for_a_take_next_then_skips_the_running_task(db: str, conn: psycopg.Connection):
    ids = _stage(conn, "dr.next", 3)
    with psycopg.connect(db) as worker:
        taken = _ids(worker, "SELECT id FROM queue.take_next('dr.next')")
        drain = Background(db, lambda c: _ids(c, "SELECT id FROM queue.drain('dr.next', 10)"))
        _waiting_on_a_lock(conn, drain.pid)
        worker.commit()
        assert drain.join() == ids[1:]
    assert conn.execute("SELECT status::text FROM queue.live_tasks WHERE id = %s", (taken[0],)).fetchone() == ("running",)


def test_a_drain_waits_for_a_cancel_then_skips_the_task(db: str, conn: psycopg.Connection):
    ids = _stage(conn, "dr.cancel", 3)
    with psycopg.connect(db) as admin:
        admin.execute("SELECT queue.cancel(%s)", (ids[0],))
        drain = Background(db, lambda c: _ids(c, "SELECT id FROM queue.drain('dr.cancel', 10)"))
        _waiting_on_a_lock(conn, drain.pid)
        admin.commit()
        assert drain.join() == ids[1:]
    assert conn.execute("SELECT array_agg(status::text ORDER BY id) FROM queue.history WHERE stage = 'dr.cancel'"
                        ).fetchone()[0] == ["cancelled", "done", "done"]


def test_a_cancel_waits_for_a_drain_then_finds_the_task_finished(db: str, conn: psycopg.Connection):
    ids = _stage(conn, "dr.cancel2", 2)
    with psycopg.connect(db) as drainer:
        assert _ids(drainer, "SELECT id FROM queue.drain('dr.cancel2', 1)") == ids[:1]
        cancel = Background(db, lambda c: c.execute("SELECT queue.cancel(%s)", (ids[0],)))
        _waiting_on_a_lock(conn, cancel.pid)
        drainer.commit()
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):  # 55000: already finished
            cancel.join()
    assert conn.execute("SELECT status::text FROM queue.history WHERE id = %s", (ids[0],)).fetchone() == ("done",)


def test_a_drain_waits_for_set_priority_then_leaves_the_task_to_the_next(db: str, conn: psycopg.Connection):
    ids = _stage(conn, "dr.prio", 2)
    with psycopg.connect(db) as admin:
        admin.execute("SELECT queue.set_priority(%s, 5)", (ids[0],))
        drain = Background(db, lambda c: _ids(c, "SELECT id FROM queue.drain('dr.prio', 10)"))
        _waiting_on_a_lock(conn, drain.pid)
        admin.commit()
        assert drain.join() == ids[1:], "the changed task is skipped, not lost"
    assert _ids(conn, "SELECT id FROM queue.drain('dr.prio', 10)") == ids[:1], "the next drain takes it"
    assert conn.execute("SELECT priority FROM queue.history WHERE id = %s", (ids[0],)).fetchone() == (5,)


def test_set_priority_waits_for_a_drain_then_finds_the_task_finished(db: str, conn: psycopg.Connection):
    ids = _stage(conn, "dr.prio2", 1)
    with psycopg.connect(db) as drainer:
        assert _ids(drainer, "SELECT id FROM queue.drain('dr.prio2')") == ids
        change = Background(db, lambda c: c.execute("SELECT queue.set_priority(%s, 5)", (ids[0],)))
        _waiting_on_a_lock(conn, change.pid)
        drainer.commit()
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
            change.join()


def test_drainers_and_workers_end_every_task_exactly_once(db: str, conn: psycopg.Connection):
    stages = [f"dr.mix.{i}" for i in range(3)]
    for s in stages:
        _stage(conn, s, 600)
    seen: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def drainer() -> None:
        try:
            with psycopg.connect(db, autocommit=True) as c:
                while c.execute("SELECT count(*) FROM queue.live_tasks WHERE stage LIKE 'dr.mix.%'").fetchone()[0]:
                    for s in stages:
                        got = _ids(c, "SELECT id FROM queue.drain(%s, 50)", s)
                        with lock:
                            seen.extend(got)
        except BaseException as e:  # reported below
            errors.append(e)

    def worker() -> None:
        try:
            with psycopg.connect(db, autocommit=True) as c:
                while c.execute("SELECT count(*) FROM queue.live_tasks WHERE stage LIKE 'dr.mix.%'").fetchone()[0]:
                    for s in stages:
                        for task_id, lease in c.execute("SELECT id, lease FROM queue.take_next(%s, 5)", (s,)).fetchall():
                            assert c.execute("SELECT queue.finish(%s, %s)", (task_id, lease)).fetchone()[0]
                            with lock:
                                seen.append(task_id)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=f) for f in (drainer, drainer, drainer, worker, worker)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a session hung"
    assert len(seen) == len(set(seen)) == 1800, "every task ended once"
    assert conn.execute("SELECT sum(total) FROM queue.finished_totals WHERE stage LIKE 'dr.mix.%'").fetchone()[0] == 1800
