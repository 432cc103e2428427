"""set_priority is not a change of state: queue.errors' last_seen (a live error task's `updated`)
stays when an admin reorders a task waiting for its retry; and finish_locked's fence, which reads
`updated` of the versions its own transaction wrote, still finishes a task reprioritised in the
transaction that holds it, or before take_locked takes it there."""

from __future__ import annotations

import time

import psycopg


def test_set_priority_of_a_task_waiting_for_its_retry_leaves_errors_last_seen(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        task = c.execute("SELECT queue.enqueue('{}', 'sp.errors')").fetchone()[0]
        tid, lease = c.execute("SELECT id, lease FROM queue.take_next('sp.errors')").fetchone()
        assert tid == task
        c.execute("SELECT queue.fail(%s, %s, 'boom', retry_in => interval '1 hour')", (tid, lease))
        before = c.execute("SELECT last_seen FROM queue.errors WHERE stage = 'sp.errors'").fetchone()[0]
        time.sleep(0.2)
        c.execute("SELECT queue.set_priority(%s, -5)", (task,))
        after = c.execute("SELECT last_seen FROM queue.errors WHERE stage = 'sp.errors'").fetchone()[0]
        assert c.execute("SELECT priority FROM queue.tasks WHERE id = %s", (task,)).fetchone()[0] == -5
    assert after == before, (before, after)


def test_take_locked_then_set_priority_then_finish_locked_finishes_the_task(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        task = c.execute("SELECT queue.enqueue('{}', 'sp.fence1')").fetchone()[0]
        time.sleep(0.01)  # the take's transaction starts later than the enqueue's
        c.execute("BEGIN")
        assert c.execute("SELECT id FROM queue.take_locked('sp.fence1')").fetchone()[0] == task
        c.execute("SELECT queue.set_priority(%s, 3)", (task,))
        assert c.execute("SELECT queue.finish_locked(%s)", (task,)).fetchone()[0] is True
        c.execute("COMMIT")
        assert c.execute("SELECT status FROM queue.tasks WHERE id = %s", (task,)).fetchone()[0] == "done"


def test_set_priority_then_take_locked_in_one_transaction_then_finish_locked_finishes_the_task(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        task = c.execute("SELECT queue.enqueue('{}', 'sp.fence2')").fetchone()[0]
        tid, lease = c.execute("SELECT id, lease FROM queue.take_next('sp.fence2')").fetchone()
        c.execute("SELECT queue.fail(%s, %s, 'boom', retry_in => interval '0')", (tid, lease))  # due error task
        time.sleep(0.01)
        c.execute("BEGIN")
        c.execute("SELECT queue.set_priority(%s, 3)", (task,))
        assert c.execute("SELECT id FROM queue.take_locked('sp.fence2')").fetchone()[0] == task
        assert c.execute("SELECT queue.finish_locked(%s)", (task,)).fetchone()[0] is True
        c.execute("COMMIT")
        assert c.execute("SELECT status FROM queue.tasks WHERE id = %s", (task,)).fetchone()[0] == "done"


def test_a_task_released_after_the_worker_began_is_still_finished_after_set_priority(db: str) -> None:
    """The version taken is stamped after the worker's transaction began (another worker released
    the task meanwhile, due as before): set_priority must not make it look ended."""
    with psycopg.connect(db, autocommit=True) as c, psycopg.connect(db, autocommit=True) as other:
        task = other.execute("SELECT queue.enqueue('{}', 'sp.fence3')").fetchone()[0]
        tid, lease = other.execute("SELECT id, lease FROM queue.take_next('sp.fence3')").fetchone()
        c.execute("BEGIN")
        c.execute("SELECT now()")  # the worker's transaction began before the release
        time.sleep(0.01)
        assert other.execute("SELECT queue.release(%s, %s)", (tid, lease)).fetchone()[0] is True
        assert c.execute("SELECT updated > now() FROM queue.live_tasks WHERE id = %s", (task,)).fetchone()[0]
        assert c.execute("SELECT id FROM queue.take_locked('sp.fence3')").fetchone()[0] == task
        c.execute("SELECT queue.set_priority(%s, 3)", (task,))
        assert c.execute("SELECT queue.finish_locked(%s)", (task,)).fetchone()[0] is True
        c.execute("COMMIT")
        assert c.execute("SELECT status FROM queue.tasks WHERE id = %s", (task,)).fetchone()[0] == "done"


def test_set_priority_after_fail_locked_does_not_let_the_task_end_twice(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        task = c.execute("SELECT queue.enqueue('{}', 'sp.fence4')").fetchone()[0]
        c.execute("BEGIN")
        assert c.execute("SELECT id FROM queue.take_locked('sp.fence4')").fetchone()[0] == task
        assert c.execute("SELECT queue.fail_locked(%s, 'boom', retry_in => interval '0')", (task,)).fetchone()[0] is True
        c.execute("SELECT queue.set_priority(%s, 3)", (task,))
        assert c.execute("SELECT queue.finish_locked(%s)", (task,)).fetchone()[0] is False
        c.execute("COMMIT")
        assert c.execute("SELECT status, attempt, error_text FROM queue.tasks WHERE id = %s",
                         (task,)).fetchone() == ("error", 1, "boom")
