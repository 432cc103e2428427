"""Admin calls racing other sessions, and compaction's isolation level (revision 0026's fixes).

Each test sets up the race deterministically: one session holds a row in an open transaction, the
other call runs in a thread and is seen waiting on that session (pg_blocking_pids) before the
holder commits. They prove that:
  - configure_stage keeps a concurrent caller's change (a pause) instead of writing back the
    stale copy it read before waiting, for a stage with a row and for a brand-new one;
  - a cancel that waited behind a take_locked worker's finish of a periodic task is the task's last
    event in queue.history, so retry() queues it again instead of calling it done;
  - two retries of one fatal task both succeed and put exactly one task back;
  - a stage with a group_limit hands out the other groups' tasks while another transaction holds
    the head task's row (a producer's re-run, an admin's edit), singly and in a batch, in claim
    order;
  - compact() refuses a REPEATABLE READ or SERIALIZABLE transaction (0A000) and changes nothing,
    still works under READ COMMITTED, and maintain() in such a transaction skips a due compaction
    and says why.
Each failed on revision 0025's functions, except the READ COMMITTED compact(), which guards that
the check left the ordinary call working.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

import workload

WAIT = 60.0  # seconds: the longest a step may take before the test calls it a hang


class _Call(threading.Thread):
    """One statement in its own autocommit session, run in a thread, so that the test can watch
    it wait on a lock and then let it go."""

    def __init__(self, db: str, sql: str, params: tuple = ()) -> None:
        super().__init__(daemon=True)
        self.conn = psycopg.connect(db, autocommit=True)
        # A hang ends as an error in the thread instead of blocking the run.
        self.conn.execute("SET statement_timeout = '90s'")
        self.pid = self.conn.info.backend_pid
        self.sql, self.params = sql, params
        self.rows: list[tuple] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.rows = self.conn.execute(self.sql, self.params).fetchall()
        except BaseException as e:  # re-raised in the test by outcome()
            self.error = e

    def outcome(self) -> list[tuple]:
        """The statement's rows once it has ended; its error raised here."""
        self.join(WAIT)
        assert not self.is_alive(), f"{self.sql!r} still running after {WAIT} s"
        if self.error is not None:
            raise self.error
        assert self.rows is not None
        return self.rows

    def __enter__(self) -> "_Call":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.is_alive():
            self.conn.cancel()
            self.join(WAIT)
        self.conn.close()


def _wait_until_blocked(watch: psycopg.Connection, call: _Call, holder: psycopg.Connection) -> None:
    """Returns once `call` waits on a lock `holder` holds: the race is set up, not hoped for."""
    deadline = time.monotonic() + WAIT
    while not watch.execute("SELECT %s = ANY (pg_blocking_pids(%s))",
                            (holder.info.backend_pid, call.pid)).fetchone()[0]:
        assert call.is_alive(), f"{call.sql!r} ended without waiting: {call.error or call.rows}"
        assert time.monotonic() < deadline, f"{call.sql!r} did not wait on the holder within {WAIT} s"
        time.sleep(0.005)


def _retry_twice_at_once(db: str, conn: psycopg.Connection, task: int) -> None:
    """A first retry moves the task back and keeps its transaction open; a second waits for the
    history row it holds, then runs once the first commits. Either raising fails the test."""
    with psycopg.connect(db, autocommit=True) as first:
        first.execute("BEGIN")
        first.execute("SELECT queue.retry(%s)", (task,))
        with _Call(db, "SELECT queue.retry(%s)", (task,)) as second:
            _wait_until_blocked(conn, second, first)
            first.execute("COMMIT")
            second.outcome()


def _ids(rows: list[tuple]) -> list[int]:
    return [r[0] for r in rows]


# configure_stage ---------------------------------------------------------------------------------

@pytest.mark.parametrize("had_row", [True, False], ids=["stage-with-a-row", "new-stage"])
def test_configure_stage_keeps_the_change_of_a_call_it_waited_for(db: str, conn: psycopg.Connection,
                                                                  had_row: bool):
    """Admin A pauses the stage and has not committed; admin B sets a cap and waits for A's row
    (or, for a new stage, A's insert). B must apply its cap to the row as A left it."""
    stage = f"races.cfg.{'row' if had_row else 'new'}"
    if had_row:
        conn.execute("SELECT queue.configure_stage(%s, max_attempts => 7)", (stage,))
    default_attempts = conn.execute("SELECT max_attempts FROM queue._settings('*')").fetchone()[0]
    with psycopg.connect(db, autocommit=True) as a:
        a.execute("BEGIN")
        a.execute("SELECT queue.configure_stage(%s, paused => true)", (stage,))
        with _Call(db, "SELECT paused, max_running FROM queue.configure_stage(%s, max_running => 2)",
                   (stage,)) as b:
            _wait_until_blocked(conn, b, a)
            a.execute("COMMIT")
            # What B returns is the row it wrote.
            assert b.outcome() == [(True, 2)], "B wrote back its stale copy of the row"
    row = conn.execute("SELECT paused, max_running, max_attempts FROM queue.stage_settings WHERE stage = %s",
                       (stage,)).fetchone()
    assert row == (True, 2, 7 if had_row else default_attempts), "A's pause and B's cap both stay"


# cancel of a periodic task ----------------------------------------------------------------------

def test_a_cancel_that_waited_for_a_periodic_tasks_finish_is_its_last_event_and_retry_requeues_it(
        db: str, conn: psycopg.Connection):
    """finish_locked stamps clock time, later than the now() of a cancel that began before it and
    waited for the worker's row: the cancel's history row must still come last."""
    stage = "races.cancel"
    task = conn.execute("SELECT queue.enqueue('{}', %s, repeat => interval '1 hour')", (stage,)).fetchone()[0]
    with psycopg.connect(db, autocommit=True) as worker:
        worker.execute("BEGIN")
        assert _ids(worker.execute("SELECT id FROM queue.take_locked(%s)", (stage,)).fetchall()) == [task]
        with _Call(db, "SELECT queue.cancel(%s)", (task,)) as cancel:
            _wait_until_blocked(conn, cancel, worker)
            assert worker.execute("SELECT queue.finish_locked(%s)", (task,)).fetchone()[0] is True
            worker.execute("COMMIT")
            cancel.outcome()
    history = dict(conn.execute("SELECT status::text, finished FROM queue.history WHERE id = %s",
                                (task,)).fetchall())
    assert sorted(history) == ["cancelled", "done"], history
    assert conn.execute("SELECT count(*) FROM queue.live_tasks WHERE id = %s", (task,)).fetchone()[0] == 0
    assert history["cancelled"] >= history["done"], f"the cancel is recorded before the run it waited for: {history}"
    # Before the fix: 55000 'cannot retry task: it is done' (the done run looked like the last event).
    conn.execute("SELECT queue.retry(%s)", (task,))
    assert conn.execute("SELECT status::text FROM queue.live_tasks WHERE id = %s",
                        (task,)).fetchall() == [("ready",)]


# retry racing retry ------------------------------------------------------------------------------

def test_two_concurrent_retries_of_a_fatal_task_both_succeed_and_requeue_it_once(db: str,
                                                                                  conn: psycopg.Connection):
    """The first retry moves the history row back and holds its transaction open; the second
    waits for that row, finds it gone, and must see the task live again, not 'not found'."""
    stage = "races.retry"
    task = conn.execute("SELECT queue.enqueue('{}', %s)", (stage,)).fetchone()[0]
    taken, lease = conn.execute("SELECT id, lease FROM queue.take_next(%s)", (stage,)).fetchone()
    assert taken == task
    assert conn.execute("SELECT queue.fail(%s, %s, 'boom', fatal => true)", (task, lease)).fetchone()[0] is True
    _retry_twice_at_once(db, conn, task)  # before the fix: P0002 'task not found'
    assert conn.execute("SELECT status::text, attempt FROM queue.live_tasks WHERE id = %s",
                        (task,)).fetchall() == [("ready", 0)]
    assert conn.execute("SELECT count(*) FROM queue.history WHERE id = %s", (task,)).fetchone()[0] == 0


# group_limit past a held head task ---------------------------------------------------------------

# Ways another transaction holds a waiting task's row: the holder's statement, on task a.
HOLDERS = {
    "producer-rerun": "SELECT queue.enqueue('{\"v\": 2}', %(stage)s, key => 'a', mode => 'rerun')",
    "admin-row-lock": "SELECT 1 FROM queue.live_tasks WHERE id = %(id)s FOR UPDATE",
}


def _grouped_stage(conn: psycopg.Connection, stage: str, groups: str) -> dict[str, int]:
    """A stage with group_limit 1 and one due task per group, group A's task (key 'a') at the head.
    They are enqueued in reverse, with earlier run_at for earlier groups, so that claim order
    (priority, run_at, id) is not the order of the rows in the table."""
    conn.execute("SELECT queue.configure_stage(%s, group_limit => 1)", (stage,))
    ids = {}
    for n, group in reversed(list(enumerate(groups))):
        ids[group] = conn.execute(
            "SELECT queue.enqueue('{}', %s, run_at => now() - make_interval(mins => %s), key => %s,"
            "                     group_key => %s)",
            (stage, 10 - n, group.lower(), group)).fetchone()[0]
    return ids


@pytest.mark.parametrize("holder", list(HOLDERS))
def test_a_grouped_take_hands_out_the_next_group_while_the_head_task_is_held(
        db: str, conn: psycopg.Connection, holder: str):
    stage = f"races.grp.one.{holder}"
    ids = _grouped_stage(conn, stage, "ABC")
    conn.execute("SET statement_timeout = '10s'")  # a take must never wait on the holder
    with psycopg.connect(db, autocommit=True) as held:
        held.execute("BEGIN")
        held.execute(HOLDERS[holder], {"stage": stage, "id": ids["A"]})
        # Before the fix: nothing (the walk ended at the held head).
        assert _ids(conn.execute("SELECT id FROM queue.take_next(%s)", (stage,)).fetchall()) == [ids["B"]]
        assert _ids(conn.execute("SELECT id FROM queue.take_next(%s, 2)", (stage,)).fetchall()) == [ids["C"]]
        held.execute("COMMIT")
    # The skipped task was only passed over: it is the next one taken.
    assert _ids(conn.execute("SELECT id FROM queue.take_next(%s, 2)", (stage,)).fetchall()) == [ids["A"]]


@pytest.mark.parametrize("holder", list(HOLDERS))
def test_a_grouped_batch_reaches_past_a_held_head_task_in_claim_order(
        db: str, conn: psycopg.Connection, holder: str):
    """A batch of 3 with the head held: its first pass claims B and C, the next must go on to D.
    (With only B and C behind the held head, the first pass alone took both before the fix too.)"""
    stage = f"races.grp.batch.{holder}"
    ids = _grouped_stage(conn, stage, "ABCD")
    conn.execute("SET statement_timeout = '10s'")
    with psycopg.connect(db, autocommit=True) as held:
        held.execute("BEGIN")
        held.execute(HOLDERS[holder], {"stage": stage, "id": ids["A"]})
        assert _ids(conn.execute("SELECT id FROM queue.take_next(%s, 3)", (stage,)).fetchall()) == \
            [ids["B"], ids["C"], ids["D"]]
        held.execute("COMMIT")
    assert _ids(conn.execute("SELECT id FROM queue.take_next(%s, 3)", (stage,)).fetchall()) == [ids["A"]]


def test_a_held_head_keeps_its_group_waiting_so_the_groups_next_task_does_not_overtake_it(
        db: str, conn: psycopg.Connection):
    """group_limit 1 is one at a time, first in first out: with A1 held, A2 must not run ahead
    of it (revision 0026's first fix took A2), while other groups go on."""
    stage = "races.grp.fifo"
    conn.execute("SELECT queue.configure_stage(%s, group_limit => 1)", (stage,))
    a1, a2, a3, b1 = (conn.execute("SELECT queue.enqueue('{}', %s, group_key => %s)", (stage, g)).fetchone()[0]
                      for g in ("A", "A", "A", "B"))
    conn.execute("SET statement_timeout = '10s'")
    with psycopg.connect(db, autocommit=True) as held:
        held.execute("BEGIN")
        held.execute("SELECT 1 FROM queue.live_tasks WHERE id = %s FOR UPDATE", (a1,))
        assert _ids(conn.execute("SELECT id FROM queue.take_next(%s)", (stage,)).fetchall()) == [b1]
        assert _ids(conn.execute("SELECT id FROM queue.take_next(%s, 5)", (stage,)).fetchall()) == []
        held.execute("COMMIT")
    assert _ids(conn.execute("SELECT id FROM queue.take_next(%s, 5)", (stage,)).fetchall()) == [a1]
    assert conn.execute("SELECT status::text FROM queue.live_tasks WHERE id = ANY(%s) ORDER BY id",
                        ([a2, a3],)).fetchall() == [("ready",), ("ready",)]


def test_a_single_take_reaches_a_free_task_behind_150_held_ones(db: str, conn: psycopg.Connection):
    """A take of one task reads up to 1,000 candidates: 150 tasks held by one transaction (a bulk
    edit, say) must not hide the free task behind them (revision 0026 gave up after 101 passes)."""
    stage = "races.grp.deep"
    conn.execute("SELECT queue.configure_stage(%s, group_limit => 1)", (stage,))
    held_ids = _ids(conn.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[150]), %s)",
                                 (stage,)).fetchall())
    free = conn.execute("SELECT queue.enqueue('{}', %s)", (stage,)).fetchone()[0]
    conn.execute("SET statement_timeout = '10s'")
    with psycopg.connect(db, autocommit=True) as held:
        held.execute("BEGIN")
        held.execute("SELECT 1 FROM queue.live_tasks WHERE id = ANY(%s) FOR UPDATE", (held_ids,))
        assert _ids(conn.execute("SELECT id FROM queue.take_next(%s)", (stage,)).fetchall()) == [free]
        held.execute("COMMIT")


@pytest.mark.parametrize("ended", ["done-then-cancelled", "fatal-then-cancelled"])
def test_two_concurrent_retries_of_a_periodic_task_with_several_history_rows_both_succeed(
        db: str, conn: psycopg.Connection, ended: str):
    """The second retry, waiting on the newest history row, reads the next older one once the
    first moved the newest back: it must still see the task live, not call it done."""
    stage = f"races.retry.{ended}"
    task = conn.execute("SELECT queue.enqueue('{}', %s, repeat => '1 hour')", (stage,)).fetchone()[0]
    taken, lease = conn.execute("SELECT id, lease FROM queue.take_next(%s)", (stage,)).fetchone()
    if ended.startswith("done"):
        assert conn.execute("SELECT queue.finish(%s, %s)", (taken, lease)).fetchone()[0] is True
    else:
        assert conn.execute("SELECT queue.fail(%s, %s, 'boom', fatal => true)", (taken, lease)).fetchone()[0] is True
    conn.execute("SELECT queue.cancel(%s)", (task,))
    _retry_twice_at_once(db, conn, task)  # before: 55000 'it is done' / SK002
    assert conn.execute("SELECT status::text FROM queue.live_tasks WHERE id = %s", (task,)).fetchall() == [("ready",)]


# compact() and the isolation level ---------------------------------------------------------------

@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
def test_compact_in_a_snapshot_transaction_raises_and_changes_nothing(db: str, conn: psycopg.Connection,
                                                                      isolation: str):
    """A snapshot older than compact()'s lock would rewrite the table as it was: the task enqueued
    since lost, the task finished since back. compact() must refuse, even if the caller commits."""
    stage = f"races.compact.{isolation.split()[0].lower()}"
    finished = conn.execute("SELECT queue.enqueue('{}', %s)", (stage,)).fetchone()[0]
    with psycopg.connect(db, autocommit=True) as old:
        old.execute(f"BEGIN ISOLATION LEVEL {isolation}")
        old.execute("SELECT count(*) FROM queue.live_tasks")  # the snapshot is taken here
        enqueued = conn.execute("SELECT queue.enqueue('{}', %s)", (stage + ".new",)).fetchone()[0]
        task, lease = conn.execute("SELECT id, lease FROM queue.take_next(%s)", (stage,)).fetchone()
        assert task == finished
        assert conn.execute("SELECT queue.finish(%s, %s)", (task, lease)).fetchone()[0] is True
        raised: psycopg.Error | None = None
        try:
            old.execute("SELECT queue.compact()")
        except psycopg.Error as e:
            raised = e
        old.execute("COMMIT")  # after the error, a rollback
    live = _ids(conn.execute("SELECT id FROM queue.live_tasks WHERE id IN (%s, %s)",
                             (enqueued, finished)).fetchall())
    assert live == [enqueued], "the task enqueued after the snapshot stays, the finished one stays finished"
    assert isinstance(raised, psycopg.errors.FeatureNotSupported), repr(raised)
    assert isolation in raised.diag.message_detail


def test_compact_under_read_committed_rewrites_every_live_task_unchanged(conn: psycopg.Connection):
    conn.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[50]), 'races.compact.rc')")
    rows = "SELECT md5(string_agg(t::text, ',' ORDER BY t.id)), count(*) FROM queue.live_tasks t"
    before, live = conn.execute(rows).fetchone()
    conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
    assert conn.execute("SELECT tasks FROM queue.compact()").fetchone()[0] == live
    conn.execute("COMMIT")
    assert conn.execute("SELECT tasks FROM queue.compact()").fetchone()[0] == live  # on its own
    assert conn.execute(rows).fetchone() == (before, live)


@pytest.fixture
def no_autovacuum(conn: psycopg.Connection):
    """The compaction check reads n_live_tup and n_dead_tup; an autoanalyze during the test would
    replace what its VACUUM reported with a sampled estimate."""
    conn.execute("ALTER TABLE queue.live_tasks SET (autovacuum_enabled = off)")
    yield
    conn.execute("ALTER TABLE queue.live_tasks RESET (autovacuum_enabled)")


def _make_compaction_due(conn: psycopg.Connection, stage: str) -> None:
    """As tests/py/test_compaction.py does: 100 live tasks among the space of 60,000 finished
    ones, vacuumed, so that _compaction_due() is true."""
    conn.execute("SELECT queue.compact()")
    conn.execute("SELECT count(*) FROM queue.enqueue_batch(array_fill('{\"doc\": 1}'::jsonb, ARRAY[60100]), %s)",
                 (stage,))
    for _ in range(6):
        conn.execute("SELECT queue.finish_batch(array_agg(t.id), array_agg(t.lease))"
                     "  FROM queue.take_next(%s, batch => 10000) t", (stage,))
    deadline = time.monotonic() + 120  # statistics arrive late (a second or two), vacuuming between looks
    while time.monotonic() < deadline:
        workload.flush_stats(conn)
        conn.execute("VACUUM ANALYZE queue.live_tasks")
        due, detail = conn.execute("SELECT * FROM queue._compaction_due()").fetchone()
        if due:
            return
        time.sleep(0.2)
    raise AssertionError(f"compaction did not become due: {detail}")


def _compact_row(conn: psycopg.Connection) -> tuple[int, str]:
    # As of the last rotation, so that a run crossing midnight UTC does not rotate (and defer compaction).
    sql = "SELECT * FROM queue.maintain(coalesce((SELECT p.last_rotated FROM queue.history_policy p), now()))"
    return {task: (count, detail) for task, count, detail in conn.execute(sql)}["compact"]


def test_maintain_in_a_repeatable_read_transaction_skips_a_due_compaction_and_says_why(
        conn: psycopg.Connection, no_autovacuum: None):
    conn.execute("SELECT * FROM queue.maintain()")  # any rotation due happens now, not below
    _make_compaction_due(conn, "races.maintain")
    live = conn.execute("SELECT count(*) FROM queue.live_tasks").fetchone()[0]
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    count, detail = _compact_row(conn)   # raises nothing
    conn.execute("COMMIT")
    assert count == 0 and "REPEATABLE READ" in detail and "READ COMMITTED" in detail, detail
    assert conn.execute("SELECT due FROM queue._compaction_due()").fetchone()[0] is True, "nothing was compacted"
    count, detail = _compact_row(conn)   # the same session, READ COMMITTED: compacts
    assert count == live and detail.startswith("rewrote "), detail
