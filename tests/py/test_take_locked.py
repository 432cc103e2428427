"""take_locked between transactions: the row lock is the claim.

Workers take, work and finish in one transaction. Whatever happens to a worker (it rolls back, its
connection is killed), a task ends exactly once, and the worker's own writes commit with its finish
or not at all. A lock held by one transaction is not another's to end, and nobody waits on it.
"""

from __future__ import annotations

import random
import threading
import time

import psycopg
import pytest

from skiplock import devdb, migrate

STAGE = "lk.drain"
TASKS = 20_000
WORKERS = 6
# Seconds without any task ending before the test calls it a hang (the drain takes ~5 s on a quiet
# machine). Kills come only while tasks end: a fixed kill rate could outpace workers that a busy
# machine slows down, and stall the drain for good (it did, beside a second suite).
STALL_DEADLINE = 180.0


def _worker(db: str, n: int, stop: threading.Event, done: list[int], errors: list[str]) -> None:
    """Takes 1 to 3 tasks a transaction; fails 5 % for a retry, rolls back 3 % of transactions,
    writes a result row for each finished task in the same transaction."""
    rng = random.Random(n)
    while not stop.is_set():
        try:
            with psycopg.connect(db, autocommit=True, application_name=f"lk-worker-{n}") as conn:
                while not stop.is_set():
                    finished: list[int] = []
                    conn.execute("BEGIN")
                    rows = conn.execute("SELECT id, attempt FROM queue.take_locked(%s, %s)",
                                        (STAGE, rng.randint(1, 3))).fetchall()
                    if not rows:
                        conn.execute("ROLLBACK")
                        time.sleep(0.01)
                        continue
                    for task_id, attempt in rows:
                        if rng.random() < 0.05:
                            assert conn.execute("SELECT queue.fail_locked(%s, 'flaky', retry_in => interval '0')",
                                                (task_id,)).fetchone()[0] is True
                        else:
                            conn.execute("INSERT INTO lk_results (task_id, attempt) VALUES (%s, %s)",
                                         (task_id, attempt))
                            assert conn.execute("SELECT queue.finish_locked(%s)", (task_id,)).fetchone()[0] is True
                            finished.append(task_id)
                    if rng.random() < 0.03:
                        conn.execute("ROLLBACK")  # as a worker that gives up: nothing of it stays
                        continue
                    conn.execute("COMMIT")
                    done.extend(finished)
        except psycopg.OperationalError:
            time.sleep(0.05)  # killed by the test: connect again and go on
        except Exception as e:  # noqa: BLE001 - any other error is a finding; report it
            errors.append(f"worker {n}: {e!r}")
            return


def test_lock_workers_killed_and_rolling_back_end_every_task_exactly_once(db: str):
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE lk_results (task_id bigint NOT NULL, attempt integer NOT NULL)")
        conn.execute("SELECT queue.configure_stage(%s, max_attempts => 1000)", (STAGE,))
        ids = [r[0] for r in conn.execute(
            "SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[%s]), %s)", (TASKS, STAGE)).fetchall()]

    stop = threading.Event()
    done: list[int] = []
    errors: list[str] = []
    threads = [threading.Thread(target=_worker, args=(db, n, stop, done, errors), daemon=True)
               for n in range(WORKERS)]
    kills = 0
    try:
        for t in threads:
            t.start()
        with psycopg.connect(db, autocommit=True) as conn:
            rng = random.Random(7)
            last, progressed = TASKS + 1, time.monotonic()
            while live := conn.execute("SELECT count(*) FROM queue.live_tasks WHERE stage = %s",
                                       (STAGE,)).fetchone()[0]:
                assert not errors, errors
                if live < last:
                    last, progressed = live, time.monotonic()
                    # Kill a worker's connection wherever it is: mid-task, mid-finish, mid-commit.
                    kills += conn.execute(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
                        (f"lk-worker-{rng.randrange(WORKERS)}",)).fetchone()[0]
                assert time.monotonic() - progressed < STALL_DEADLINE, (
                    f"{live} tasks live and none ended for {STALL_DEADLINE:.0f} s: a hang")
                time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not errors, errors
    assert kills >= 10, f"only {kills} kills: the test did not exercise killed workers"

    with psycopg.connect(db, autocommit=True) as conn:
        history = dict(conn.execute(
            "SELECT id, count(*) FROM queue.history WHERE stage = %s AND status = 'done' GROUP BY id",
            (STAGE,)).fetchall())
        other = conn.execute("SELECT count(*) FROM queue.history WHERE stage = %s AND status <> 'done'",
                             (STAGE,)).fetchone()[0]
        results = dict(conn.execute("SELECT task_id, count(*) FROM lk_results GROUP BY task_id").fetchall())
        failed_attempts = conn.execute(
            "SELECT coalesce(sum(attempt - 1), 0) FROM queue.history WHERE stage = %s", (STAGE,)).fetchone()[0]
    assert set(history) == set(ids), "every task ends done"
    assert set(history.values()) == {1}, "no task is done twice"
    assert other == 0
    assert results == history, "the workers' own writes committed with the finish, once a task, or not at all"
    assert set(done) <= set(ids) and len(done) == len(set(done)), "no worker saw a task finish twice"
    assert failed_attempts > 0, "fail_locked counted attempts"


def test_another_transactions_lock_is_not_ended_nor_waited_on(db: str):
    with psycopg.connect(db, autocommit=True) as a, psycopg.connect(db, autocommit=True) as b:
        task = a.execute("SELECT queue.enqueue('{}', 'lk.two')").fetchone()[0]
        a.execute("BEGIN")
        assert a.execute("SELECT id FROM queue.take_locked('lk.two')").fetchone()[0] == task
        # A wait would be a lock timeout here: none of these may wait on A's lock.
        b.execute("SET lock_timeout = '500ms'")
        b.execute("BEGIN")
        assert b.execute("SELECT count(*) FROM queue.take_locked('lk.two')").fetchone()[0] == 0
        assert b.execute("SELECT queue.finish_locked(%s)", (task,)).fetchone()[0] is False
        assert b.execute("SELECT queue.fail_locked(%s, 'not mine', fatal => true)", (task,)).fetchone()[0] is False
        b.execute("COMMIT")
        assert a.execute("SELECT queue.finish_locked(%s)", (task,)).fetchone()[0] is True
        a.execute("COMMIT")
        assert a.execute("SELECT status::text FROM queue.history WHERE id = %s", (task,)).fetchall() == [("done",)]


def test_a_killed_lock_worker_gives_its_task_back_at_once_without_counting_the_attempt(db: str):
    with psycopg.connect(db, autocommit=True) as a, psycopg.connect(db, autocommit=True) as b:
        task = a.execute("SELECT queue.enqueue('{}', 'lk.kill')").fetchone()[0]
        pid = a.execute("SELECT pg_backend_pid()").fetchone()[0]
        a.execute("BEGIN")
        assert a.execute("SELECT id, attempt FROM queue.take_locked('lk.kill')").fetchone() == (task, 1)
        assert b.execute("SELECT count(*) FROM queue.take_locked('lk.kill')").fetchone()[0] == 0
        assert b.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone()[0] is True
        with pytest.raises(psycopg.OperationalError):
            a.execute("SELECT 1")
        b.execute("BEGIN")
        assert b.execute("SELECT id, attempt FROM queue.take_locked('lk.kill')").fetchone() == (task, 1)
        assert b.execute("SELECT queue.finish_locked(%s)", (task,)).fetchone()[0] is True
        b.execute("COMMIT")


def test_take_locked_claims_skip_finished_tasks_while_a_snapshot_holds_back_vacuum(db: str):
    """A held snapshot keeps every finished task's claim-index entry. Each session's claim
    starts where its last one ended, so it reads a few index pages, not all of those entries;
    the same claim from the stage's first entry (the control) does read them."""
    stage, done = "lk.mvcc", 6_000

    def claim_blocks(conn: psycopg.Connection) -> tuple[int, int]:
        # The backend's not yet reported counts (reported only between transactions): their
        # growth across the take is the pages the claim read.
        fetched = "SELECT pg_stat_get_xact_blocks_fetched('queue.live_tasks_claim'::regclass)"
        conn.execute("BEGIN")
        before = conn.execute(fetched).fetchone()[0]
        task = conn.execute("SELECT id FROM queue.take_locked(%s)", (stage,)).fetchone()[0]
        blocks = conn.execute(fetched).fetchone()[0] - before
        assert conn.execute("SELECT queue.finish_locked(%s)", (task,)).fetchone()[0] is True
        conn.execute("COMMIT")
        return task, blocks

    with psycopg.connect(db, autocommit=True) as w, psycopg.connect(db) as holder:
        w.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[%s]), %s)", (done + 1_000, stage))
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM queue.live_tasks")  # takes the snapshot and keeps it
        blocks = [claim_blocks(w)[1] for _ in range(done)]
        w.execute("SELECT set_config('skiplock.claim_hint', '', false)")  # forget the position
        control = claim_blocks(w)[1]
        dead = w.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'queue.live_tasks'::regclass").fetchone()[0]
        holder.rollback()
    recent = sorted(blocks[-1_000:])
    median = recent[len(recent) // 2]
    print(f"claim-index pages per claim: median {median} of the last 1,000, control {control}; {dead} dead tuples")
    assert control >= 20, f"the control claim read {control} pages: the held snapshot kept no entries to walk"
    assert median <= 8, f"claims read a median {median} index pages while the control read {control}"


def test_a_pipelined_finish_and_commit_end_the_task_and_a_failed_finish_commits_nothing(db: str):
    """The README's advice for short tasks: send the finish and the COMMIT together (the bench's
    take_locked loop does). If the finish fails, the server skips the COMMIT: neither the task's
    end nor the worker's own writes commit, and the task is still there to take."""
    with psycopg.connect(db, autocommit=True) as w:
        w.execute("CREATE TABLE lk_pipe_results (task_id bigint PRIMARY KEY)")
        first, second = (w.execute("SELECT queue.enqueue('{}', 'lk.pipe')").fetchone()[0] for _ in range(2))

        w.execute("BEGIN")
        assert w.execute("SELECT id FROM queue.take_locked('lk.pipe')").fetchone()[0] == first
        w.execute("INSERT INTO lk_pipe_results VALUES (%s)", (first,))
        with w.pipeline():
            finished = w.execute("SELECT queue.finish_locked(%s)", (first,))
            w.execute("COMMIT")
        assert finished.fetchone()[0] is True
        assert w.info.transaction_status == psycopg.pq.TransactionStatus.IDLE

        w.execute("BEGIN")
        assert w.execute("SELECT id FROM queue.take_locked('lk.pipe')").fetchone()[0] == second
        w.execute("INSERT INTO lk_pipe_results VALUES (%s)", (second,))
        with pytest.raises(psycopg.errors.NullValueNotAllowed):
            with w.pipeline():
                w.execute("SELECT queue.finish_locked(NULL)")  # a worker's bug: the wrong id
                w.execute("COMMIT")
        assert w.info.transaction_status == psycopg.pq.TransactionStatus.INERROR, "the COMMIT was skipped"
        w.execute("ROLLBACK")

        assert w.execute("SELECT array_agg(task_id ORDER BY task_id) FROM lk_pipe_results").fetchone()[0] == [first]
        assert w.execute("SELECT array_agg(id) FROM queue.history WHERE stage = 'lk.pipe'").fetchone()[0] == [first]
        assert w.execute("SELECT id, status::text, attempt FROM queue.live_tasks WHERE stage = 'lk.pipe'").fetchall() \
            == [(second, "ready", 0)], "the task whose finish failed is still there, its attempt not counted"
        w.execute("BEGIN")
        assert w.execute("SELECT id FROM queue.take_locked('lk.pipe')").fetchone()[0] == second
        w.execute("ROLLBACK")


def test_a_rolled_back_savepoint_that_ended_the_task_leaves_it_held_and_not_ended(db: str):
    """The README's pattern: work in a savepoint, roll it back on error, then fail_locked. A
    savepoint that called finish_locked (or fail_locked) and was rolled back leaves the row's
    lock the transaction's, through a multixact: the task must still be ended here, not handed
    out again, and not by anyone else."""
    with psycopg.connect(db, autocommit=True) as w, psycopg.connect(db, autocommit=True) as other:
        task, spare = (w.execute("SELECT queue.enqueue('{}', 'lk.sp')").fetchone()[0] for _ in range(2))
        w.execute("BEGIN")
        assert w.execute("SELECT id FROM queue.take_locked('lk.sp')").fetchone()[0] == task
        w.execute("SAVEPOINT work")
        assert w.execute("SELECT queue.finish_locked(%s)", (task,)).fetchone()[0] is True
        w.execute("ROLLBACK TO SAVEPOINT work")  # a later statement of the work failed
        other.execute("BEGIN")
        assert other.execute("SELECT array_agg(id) FROM queue.take_locked('lk.sp', 10)").fetchone()[0] == [spare], \
            "the task is still locked by the worker"
        other.execute("ROLLBACK")
        assert w.execute("SELECT array_agg(id) FROM queue.take_locked('lk.sp', 10)").fetchone()[0] == [spare], \
            "a later take of the same transaction does not hand the held task out again"
        assert w.execute("SELECT queue.fail_locked(%s, 'work failed', retry_in => interval '1 hour')",
                         (task,)).fetchone()[0] is True
        assert w.execute("SELECT queue.finish_locked(%s)", (task,)).fetchone()[0] is False, "ended once"
        w.execute("COMMIT")
        assert w.execute("SELECT status::text, attempt, error_text FROM queue.live_tasks WHERE id = %s",
                         (task,)).fetchall() == [("error", 1, "work failed")]

        # The same in PL/pgSQL: an exception block is a savepoint.
        w.execute("BEGIN")
        assert w.execute("SELECT id FROM queue.take_locked('lk.sp')").fetchone()[0] == spare
        w.execute("""
            DO $$
            BEGIN
                BEGIN
                    PERFORM queue.finish_locked(%s);
                    PERFORM 1 / 0;
                EXCEPTION WHEN division_by_zero THEN
                    IF NOT queue.fail_locked(%s, SQLERRM, fatal => true) THEN
                        RAISE EXCEPTION 'fail_locked answered false';
                    END IF;
                END;
            END $$""" % (spare, spare))
        w.execute("COMMIT")
        assert w.execute("SELECT status::text, attempt, error_text FROM queue.history WHERE id = %s",
                         (spare,)).fetchall() == [("fatal", 1, "division by zero")]


def test_a_task_ended_in_a_released_savepoint_cannot_be_ended_again(db: str):
    """A version written by a released savepoint carries the subtransaction's xmin; it is still
    this transaction's end of the task, so a second end answers false."""
    with psycopg.connect(db, autocommit=True) as w:
        once = w.execute("SELECT queue.enqueue('{}', 'lk.rel')").fetchone()[0]
        periodic = w.execute("SELECT queue.enqueue('{}', 'lk.relp', repeat => interval '1 hour')").fetchone()[0]

        w.execute("BEGIN")
        assert w.execute("SELECT id FROM queue.take_locked('lk.rel')").fetchone()[0] == once
        with w.transaction():  # SAVEPOINT … RELEASE
            assert w.execute("SELECT queue.fail_locked(%s, 'boom', retry_in => interval '1 hour')",
                             (once,)).fetchone()[0] is True
        assert w.execute("SELECT queue.finish_locked(%s)", (once,)).fetchone()[0] is False
        assert w.execute("SELECT queue.fail_locked(%s, 'again')", (once,)).fetchone()[0] is False
        w.execute("COMMIT")
        assert w.execute("SELECT status::text, attempt, error_text FROM queue.live_tasks WHERE id = %s",
                         (once,)).fetchall() == [("error", 1, "boom")]
        assert w.execute("SELECT count(*) FROM queue.history WHERE id = %s", (once,)).fetchone()[0] == 0

        w.execute("BEGIN")
        assert w.execute("SELECT id FROM queue.take_locked('lk.relp')").fetchone()[0] == periodic
        with w.transaction():
            assert w.execute("SELECT queue.finish_locked(%s)", (periodic,)).fetchone()[0] is True
        assert w.execute("SELECT queue.finish_locked(%s)", (periodic,)).fetchone()[0] is False
        w.execute("COMMIT")
        assert w.execute("SELECT status::text FROM queue.history WHERE id = %s", (periodic,)).fetchall() \
            == [("done",)], "one run, one history row"
        assert w.execute("SELECT run_at - now() BETWEEN interval '59 minutes' AND interval '1 hour' "
                         "FROM queue.live_tasks WHERE id = %s", (periodic,)).fetchone()[0] is True, \
            "re-armed for the next slot, not the one after"


def test_a_rerun_by_the_transaction_holding_the_task_leaves_it_ready_with_the_new_payload(db: str):
    """A re-run enqueued by the worker's own transaction (a trigger on its writes, say) must not
    be recorded as done before its payload ran."""
    with psycopg.connect(db, autocommit=True) as w:
        task = w.execute("SELECT queue.enqueue('{\"v\": 1}', 'lk.rerun', key => 'k')").fetchone()[0]
        w.execute("BEGIN")
        assert w.execute("SELECT id FROM queue.take_locked('lk.rerun')").fetchone()[0] == task
        assert w.execute("SELECT queue.enqueue('{\"v\": 2}', 'lk.rerun', key => 'k', mode => 'rerun')"
                         ).fetchone()[0] == task
        assert w.execute("SELECT queue.finish_locked(%s)", (task,)).fetchone()[0] is False
        w.execute("COMMIT")
        assert w.execute("SELECT status::text, attempt, payload FROM queue.live_tasks WHERE id = %s",
                         (task,)).fetchall() == [("ready", 0, {"v": 2})]
        assert w.execute("SELECT count(*) FROM queue.history WHERE id = %s", (task,)).fetchone()[0] == 0


def test_a_lock_inherited_by_a_written_version_survives_a_rolled_back_savepoint(db: str):
    """A version the holding transaction wrote (set_priority in a released savepoint) carries its
    lock as a key-share lock; a savepoint that wrote it again and was rolled back leaves a
    multixact with that key-share lock: still held, neither handed out again nor refused."""
    with psycopg.connect(db, autocommit=True) as w:
        task = w.execute("SELECT queue.enqueue('{}', 'lk.keysh')").fetchone()[0]
        w.execute("BEGIN")
        assert w.execute("SELECT id FROM queue.take_locked('lk.keysh')").fetchone()[0] == task
        with w.transaction():
            w.execute("SELECT queue.set_priority(%s, 5)", (task,))
        w.execute("SAVEPOINT b")
        w.execute("SELECT queue.set_priority(%s, 6)", (task,))
        w.execute("ROLLBACK TO SAVEPOINT b")
        w.execute("RELEASE SAVEPOINT b")
        assert w.execute("SELECT count(*) FROM queue.take_locked('lk.keysh')").fetchone()[0] == 0
        assert w.execute("SELECT queue.finish_locked(%s)", (task,)).fetchone()[0] is True
        w.execute("COMMIT")
        assert w.execute("SELECT status::text, priority FROM queue.history WHERE id = %s",
                         (task,)).fetchall() == [("done", 5)]


def test_a_stale_xmax_that_numbers_a_multixact_of_the_transaction_is_not_taken_for_its_lock():
    """Transaction ids and multixacts are numbered apart. A task left with a stale xmax (its
    take_locked worker rolled back) whose number is also a multixact this transaction made (a
    rolled-back savepoint on a task it holds) must not be ended as if this transaction held it.
    Its own cluster: the multixact counter must be driven up to that transaction id."""
    cluster = devdb.Cluster(durable=False).start()
    try:
        url = cluster.createdb("lk_stale")
        migrate.upgrade(url)
        with psycopg.connect(url, autocommit=True) as a:
            a.execute("CREATE TABLE burn (i int PRIMARY KEY); INSERT INTO burn VALUES (1)")
            stale = a.execute("SELECT queue.enqueue('{\"task\": \"stale\"}', 'lk.stale')").fetchone()[0]
            with psycopg.connect(url) as loser:  # takes the task and rolls back: xmax stays its id
                xid = int(loser.execute("SELECT pg_current_xact_id()::text").fetchone()[0])
                assert loser.execute("SELECT id FROM queue.take_locked('lk.stale')").fetchone()[0] == stale
                loser.rollback()
            held = a.execute("SELECT queue.enqueue('{\"task\": \"held\"}', 'lk.stale', priority => -1)").fetchone()[0]
            # Share locks of two sessions on one row make a multixact each time, until the next
            # multixact number is the stale xmax.
            with psycopg.connect(url) as s1, psycopg.connect(url, autocommit=True) as s2:
                s1.execute("SELECT FROM burn WHERE i = 1 FOR SHARE")

                def next_multixact() -> int:
                    a.execute("CHECKPOINT")
                    return int(a.execute("SELECT next_multixact_id FROM pg_control_checkpoint()").fetchone()[0])

                while (gap := xid - next_multixact()) > 0:
                    for _ in range(gap):
                        s2.execute("SELECT FROM burn WHERE i = 1 FOR SHARE")
                s1.rollback()
            assert next_multixact() == xid
            with psycopg.connect(url) as t:
                assert t.execute("SELECT id FROM queue.take_locked('lk.stale')").fetchone()[0] == held
                t.execute("SAVEPOINT s")
                assert t.execute("SELECT queue.finish_locked(%s)", (held,)).fetchone()[0] is True
                t.execute("ROLLBACK TO SAVEPOINT s")
                assert t.execute("SELECT xmax::text::bigint FROM queue.live_tasks WHERE id = %s",
                                 (held,)).fetchone()[0] == xid, "the multixact has the stale xmax's number"
                assert t.execute("SELECT queue.finish_locked(%s)", (stale,)).fetchone()[0] is False, \
                    "a task this transaction never took is not ended"
                assert t.execute("SELECT queue.finish_locked(%s)", (held,)).fetchone()[0] is True
                t.commit()
            assert a.execute("SELECT array_agg(id) FROM queue.history").fetchone()[0] == [held]
            assert a.execute("SELECT status::text FROM queue.live_tasks WHERE id = %s", (stale,)).fetchone()[0] == "ready"
    finally:
        cluster.stop()


# -- the fence against a replayed entry (issue 54, item 2) -----------------------------------------

def _replayed_take(a: psycopg.Connection, stage: str) -> int:
    """A takes under a savepoint, keeps skiplock.held, rolls the savepoint back (the row lock is
    gone) and puts the entry back: the replay the fence must refuse. Returns the task's id."""
    a.execute("BEGIN")
    a.execute("SAVEPOINT s")
    task = a.execute("SELECT id FROM queue.take_locked(%s)", (stage,)).fetchone()[0]
    saved = a.execute("SELECT current_setting('skiplock.held')").fetchone()[0]
    a.execute("ROLLBACK TO SAVEPOINT s")
    a.execute("SELECT set_config('skiplock.held', %s, true)", (saved,))
    return task


class _Call(threading.Thread):
    """One statement of `conn` in a thread (it may wait on a lock); `result` its first value."""

    def __init__(self, conn: psycopg.Connection, query: str, args: tuple) -> None:
        super().__init__(daemon=True)
        self.conn, self.query, self.args = conn, query, args
        self.result: object = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.result = self.conn.execute(self.query, self.args).fetchone()[0]
        except BaseException as e:  # noqa: BLE001 - re-raised by value()
            self.error = e

    def value(self) -> object:
        self.join(120)
        assert not self.is_alive(), "the call did not return"
        if self.error is not None:
            raise self.error
        return self.result


def _returned_or_waits(watch: psycopg.Connection, call: _Call, pid: int) -> None:
    """Until the call has returned, or waits on a lock (then it acts only after the holder ends)."""
    deadline = time.monotonic() + 120
    while call.is_alive() and time.monotonic() < deadline:
        if watch.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                         (pid,)).fetchone()[0]:
            return
        time.sleep(0.02)


def test_a_replayed_entry_does_not_end_a_task_that_another_take_locked_holds(db: str):
    with psycopg.connect(db, autocommit=True) as a, psycopg.connect(db, autocommit=True) as b, \
            psycopg.connect(db, autocommit=True) as watch:
        task = a.execute("SELECT queue.enqueue('{}', 'lk.replay')").fetchone()[0]
        assert _replayed_take(a, "lk.replay") == task
        b.execute("BEGIN")
        assert b.execute("SELECT id FROM queue.take_locked('lk.replay')").fetchone()[0] == task
        fail = _Call(a, "SELECT queue.fail_locked(%s, 'replayed', fatal => true)", (task,))
        _returned_or_waits(watch, fail, a.info.backend_pid)
        assert b.execute("SELECT queue.finish_locked(%s)", (task,)).fetchone()[0] is True
        b.execute("COMMIT")
        assert fail.value() is False, "not held by A: another transaction's lock"
        assert a.execute("SELECT queue.finish_locked(%s)", (task,)).fetchone()[0] is False
        a.execute("COMMIT")
        assert watch.execute("SELECT status::text FROM queue.history WHERE id = %s", (task,)).fetchall() \
            == [("done",)], "one run, one final history row"

        # The lock free again, but the task changed since A's take (B failed it): still not A's.
        task = a.execute("SELECT queue.enqueue('{}', 'lk.replay2')").fetchone()[0]
        assert _replayed_take(a, "lk.replay2") == task
        b.execute("BEGIN")
        assert b.execute("SELECT id FROM queue.take_locked('lk.replay2')").fetchone()[0] == task
        assert b.execute("SELECT queue.fail_locked(%s, 'b failed', retry_in => interval '0')",
                         (task,)).fetchone()[0] is True
        b.execute("COMMIT")
        assert a.execute("SELECT queue.fail_locked(%s, 'replayed', fatal => true)", (task,)).fetchone()[0] is False
        assert a.execute("SELECT queue.finish_locked(%s)", (task,)).fetchone()[0] is False
        a.execute("COMMIT")
        assert watch.execute("SELECT status::text, attempt, error_text FROM queue.live_tasks WHERE id = %s",
                             (task,)).fetchall() == [("error", 1, "b failed")]
        assert watch.execute("SELECT count(*) FROM queue.history WHERE id = %s", (task,)).fetchone()[0] == 0


def test_a_replayed_entry_does_not_end_a_task_running_under_another_workers_lease(db: str):
    with psycopg.connect(db, autocommit=True) as a, psycopg.connect(db, autocommit=True) as b, \
            psycopg.connect(db, autocommit=True) as watch:
        task = a.execute("SELECT queue.enqueue('{}', 'lk.replay.next')").fetchone()[0]
        assert _replayed_take(a, "lk.replay.next") == task
        b.execute("BEGIN")
        taken, lease = b.execute("SELECT id, lease FROM queue.take_next('lk.replay.next')").fetchone()
        assert taken == task
        fail = _Call(a, "SELECT queue.fail_locked(%s, 'replayed', fatal => true)", (task,))
        _returned_or_waits(watch, fail, a.info.backend_pid)
        b.execute("COMMIT")
        assert fail.value() is False
        a.execute("COMMIT")
        assert b.execute("SELECT queue.heartbeat(%s, %s)", (task, lease)).fetchone()[0] is not None
        assert b.execute("SELECT queue.finish(%s, %s)", (task, lease)).fetchone()[0] is True
        assert watch.execute("SELECT status::text FROM queue.history WHERE id = %s", (task,)).fetchall() \
            == [("done",)]
