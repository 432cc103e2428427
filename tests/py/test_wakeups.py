"""Wake-ups are sent only while a worker waits.

NOTIFY makes every notifying commit queue on one database-wide lock (bench/NOTIFY.md), so
enqueue sends it only while queue.stage_waiters says a worker found the stage empty in the last
minute (take_next and take_locked write that), and only once a wait: the wake-up ends the mark. A
busy stage, whose workers always find work, enqueues without NOTIFY; an idle one wakes its workers
within milliseconds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest


@pytest.fixture
def listener(db: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db, autocommit=True) as conn:
        yield conn


def channels(listener: psycopg.Connection, timeout: float) -> list[str]:
    return [n.channel for n in listener.notifies(timeout=timeout)]


def test_enqueue_without_a_waiting_worker_sends_no_notify(conn: psycopg.Connection, listener: psycopg.Connection):
    listener.execute('LISTEN "skiplock.wake.busy"')
    conn.execute("SELECT queue.enqueue('{}', 'wake.busy')")
    conn.execute("SELECT queue.enqueue_batch(ARRAY['{}', '{}']::jsonb[], 'wake.busy')")
    # A worker that finds work does not count as waiting.
    assert conn.execute("SELECT count(*) FROM queue.take_next('wake.busy')").fetchone()[0] == 1
    conn.execute("SELECT queue.enqueue('{}', 'wake.busy')")
    assert channels(listener, 0.5) == []
    assert conn.execute("SELECT count(*) FROM queue.stage_waiters WHERE stage = 'wake.busy'").fetchone()[0] == 0


def test_a_worker_finding_the_stage_empty_turns_wakeups_on(conn: psycopg.Connection, listener: psycopg.Connection):
    listener.execute('LISTEN "skiplock.wake.idle"')
    assert conn.execute("SELECT count(*) FROM queue.take_next('wake.idle')").fetchone()[0] == 0
    until = conn.execute("SELECT until - now() FROM queue.stage_waiters WHERE stage = 'wake.idle'").fetchone()[0]
    assert 50 <= until.total_seconds() <= 60
    conn.execute("SELECT queue.enqueue('{}', 'wake.idle')")
    assert channels(listener, 2.0) == ["skiplock.wake.idle"]
    # The worker woke, took the task, and found the stage empty again: that marks it again.
    assert conn.execute("SELECT count(*) FROM queue.take_next('wake.idle')").fetchone()[0] == 1
    assert conn.execute("SELECT count(*) FROM queue.take_next('wake.idle')").fetchone()[0] == 0
    conn.execute("SELECT queue.enqueue_batch(ARRAY['{}']::jsonb[], 'wake.idle')")
    assert channels(listener, 2.0) == ["skiplock.wake.idle"]


def test_one_notify_per_wait(conn: psycopg.Connection, listener: psycopg.Connection):
    # NOTIFY makes commits take turns (bench/NOTIFY.md): the first enqueue after a worker found the
    # stage empty wakes it and ends the mark; later ones send nothing until a take finds it empty again.
    listener.execute('LISTEN "skiplock.wake.once"')
    assert conn.execute("SELECT count(*) FROM queue.take_next('wake.once')").fetchone()[0] == 0
    for _ in range(3):
        conn.execute("SELECT queue.enqueue('{}', 'wake.once')")
    conn.execute("SELECT queue.enqueue_batch(ARRAY['{}', '{}']::jsonb[], 'wake.once')")
    assert channels(listener, 1.0) == ["skiplock.wake.once"]
    assert conn.execute("SELECT until = '-infinity' FROM queue.stage_waiters WHERE stage = 'wake.once'").fetchone()[0]
    # Tasks left: the worker is not waiting, and a take that finds work does not mark the stage.
    assert conn.execute("SELECT count(*) FROM queue.take_next('wake.once', 4)").fetchone()[0] == 4
    conn.execute("SELECT queue.enqueue('{}', 'wake.once')")
    assert channels(listener, 0.5) == []
    assert conn.execute("SELECT count(*) FROM queue.take_next('wake.once', 10)").fetchone()[0] == 2
    assert conn.execute("SELECT count(*) FROM queue.take_next('wake.once')").fetchone()[0] == 0
    conn.execute("SELECT queue.enqueue('{}', 'wake.once')")
    assert channels(listener, 1.0) == ["skiplock.wake.once"]


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_an_enqueue_finding_the_mark_being_ended_notifies_too(db: str, conn: psycopg.Connection,
                                                             listener: psycopg.Connection, outcome: str):
    # A first enqueue ends the mark in a transaction still open; a second one must neither wait
    # for it nor count on it (it may roll back), and the mark it ends stays until it commits.
    stage = f"wake.racing.{outcome}"
    listener.execute(f'LISTEN "{"skiplock." + stage}"')
    assert conn.execute("SELECT count(*) FROM queue.take_next(%s)", (stage,)).fetchone()[0] == 0
    with psycopg.connect(db) as first:
        first.execute("SELECT queue.enqueue('{}', %s)", (stage,))
        conn.execute("SET lock_timeout = '3s'")  # a wait shows as an error, not a hang
        started = time.monotonic()
        conn.execute("SELECT queue.enqueue('{}', %s)", (stage,))
        assert time.monotonic() - started < 0.5, "the enqueue waited on the other one's mark"
        conn.execute("RESET lock_timeout")
        assert channels(listener, 1.0) == ["skiplock." + stage], "the second enqueue did not notify"
        # A worker finding nothing meanwhile (the first one holds the mark) does not wait either.
        assert conn.execute("SELECT count(*) FROM queue.take_next(%s, 10)", (stage,)).fetchone()[0] == 1
        assert conn.execute("SELECT count(*) FROM queue.take_next(%s)", (stage,)).fetchone()[0] == 0
        getattr(first, outcome)()
    notified = channels(listener, 1.0)
    armed = conn.execute("SELECT until > now() FROM queue.stage_waiters WHERE stage = %s", (stage,)).fetchone()[0]
    if outcome == "commit":
        assert notified == ["skiplock." + stage] and not armed
    else:
        assert notified == [] and armed, "a rolled-back wake-up left the stage unmarked"
        conn.execute("SELECT queue.enqueue('{}', %s)", (stage,))
        assert channels(listener, 1.0) == ["skiplock." + stage]


def test_an_enqueue_in_a_repeatable_read_transaction_survives_a_concurrent_wakeup(db: str, conn: psycopg.Connection,
                                                                                   listener: psycopg.Connection):
    listener.execute('LISTEN "skiplock.wake.rr"')
    assert conn.execute("SELECT count(*) FROM queue.take_next('wake.rr')").fetchone()[0] == 0
    with psycopg.connect(db) as rr:
        rr.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        rr.execute("SELECT 1")  # the snapshot sees the mark
        conn.execute("SELECT queue.enqueue('{}', 'wake.rr')")  # ends it
        rr.execute("SELECT queue.enqueue('{}', 'wake.rr')")
        rr.commit()
    assert channels(listener, 1.0) == ["skiplock.wake.rr"] * 2


def test_finish_into_a_waited_on_stage_notifies_it(conn: psycopg.Connection, listener: psycopg.Connection):
    listener.execute('LISTEN "skiplock.wake.next"')
    assert conn.execute("SELECT count(*) FROM queue.take_next('wake.next')").fetchone()[0] == 0
    conn.execute("SELECT queue.enqueue('{}', 'wake.first')")
    task_id, lease = conn.execute("SELECT id, lease FROM queue.take_next('wake.first')").fetchone()
    assert conn.execute("SELECT queue.finish(%s, %s, next_stage => 'wake.next')", (task_id, lease)).fetchone()[0]
    assert channels(listener, 2.0) == ["skiplock.wake.next"]


def test_a_take_locked_worker_finding_the_stage_empty_is_woken_by_the_next_enqueue(db: str, conn: psycopg.Connection):
    # The take_locked loop: LISTEN, then BEGIN; take_locked; … COMMIT, and wait when it took nothing.
    with psycopg.connect(db) as worker:
        worker.execute('LISTEN "skiplock.wake.locked"')
        worker.commit()
        assert worker.execute("SELECT count(*) FROM queue.take_locked('wake.locked')").fetchone()[0] == 0
        worker.commit()
        task_id = conn.execute("SELECT queue.enqueue('{}', 'wake.locked')").fetchone()[0]
        assert channels(worker, 2.0) == ["skiplock.wake.locked"], "the enqueue did not wake the take_locked worker"
        assert worker.execute("SELECT id FROM queue.take_locked('wake.locked')").fetchone()[0] == task_id
        assert worker.execute("SELECT queue.finish_locked(%s)", (task_id,)).fetchone()[0]
        worker.commit()


@pytest.mark.parametrize("first_mark", [False, True], ids=["stale_mark", "no_mark_yet"])
def test_an_empty_take_never_waits_on_a_mark_another_open_transaction_writes(db: str, conn: psycopg.Connection,
                                                                             first_mark: bool):
    # A take_locked worker found 'wake.held' empty and runs on in its transaction (another stage's
    # task, say): its mark is written but not committed. Other workers' empty takes must not wait
    # on it (take_next never waits), and its mark counts once it commits.
    if not first_mark:
        conn.execute("INSERT INTO queue.stage_waiters (stage, until) VALUES ('wake.held', now() + interval '5 seconds')")
    with psycopg.connect(db) as holder:
        assert holder.execute("SELECT count(*) FROM queue.take_locked('wake.held')").fetchone()[0] == 0
        conn.execute("SET lock_timeout = '3s'")  # a wait shows as an error, not a hang
        for take in ("SELECT count(*) FROM queue.take_next('wake.held')",
                     "SELECT count(*) FROM queue.take_locked('wake.held')"):
            started = time.monotonic()
            assert conn.execute(take).fetchone()[0] == 0
            # a wait would end in lock_timeout's error (3 s): well under it, whatever the load
            assert time.monotonic() - started < 2.5, f"{take} waited on the open transaction's mark"
        conn.execute("RESET lock_timeout")
        holder.commit()
    left = conn.execute("SELECT until - now() FROM queue.stage_waiters WHERE stage = 'wake.held'").fetchone()[0]
    assert left.total_seconds() > 50, "the mark was not refreshed"


def test_wakeups_stop_a_minute_after_the_last_empty_take(conn: psycopg.Connection, listener: psycopg.Connection):
    listener.execute('LISTEN "skiplock.wake.stale"')
    assert conn.execute("SELECT count(*) FROM queue.take_next('wake.stale')").fetchone()[0] == 0
    conn.execute("UPDATE queue.stage_waiters SET until = now() - interval '1 second' WHERE stage = 'wake.stale'")
    conn.execute("SELECT queue.enqueue('{}', 'wake.stale')")
    assert channels(listener, 0.5) == []


def test_idle_polls_refresh_the_mark_only_when_it_runs_low(conn: psycopg.Connection):
    assert conn.execute("SELECT count(*) FROM queue.take_next('wake.poll')").fetchone()[0] == 0
    first = conn.execute("SELECT until, xmin::text FROM queue.stage_waiters WHERE stage = 'wake.poll'").fetchone()
    for _ in range(5):
        conn.execute("SELECT count(*) FROM queue.take_next('wake.poll')")
    assert conn.execute("SELECT until, xmin::text FROM queue.stage_waiters WHERE stage = 'wake.poll'").fetchone() == first, \
        "an idle poll rewrote a fresh mark"
    conn.execute("UPDATE queue.stage_waiters SET until = now() + interval '10 seconds' WHERE stage = 'wake.poll'")
    conn.execute("SELECT count(*) FROM queue.take_next('wake.poll')")
    left = conn.execute("SELECT until - now() FROM queue.stage_waiters WHERE stage = 'wake.poll'").fetchone()[0]
    assert left.total_seconds() > 50, "a mark with 10 s left was not refreshed"


def test_a_stages_own_notify_setting_overrides_the_defaults_row(conn: psycopg.Connection,
                                                                listener: psycopg.Connection):
    # _mark_waiting and _wake_waiters read the stage's row, else the defaults row ('*'): the
    # stage's own value must win whichever way the two differ. A stage that does not notify is not
    # marked, so turning notify on takes effect at its workers' next empty take.
    listener.execute('LISTEN "skiplock.wake.own_on"')
    listener.execute('LISTEN "skiplock.wake.own_off"')
    listener.execute('LISTEN "skiplock.wake.no_row"')
    conn.execute("SELECT queue.configure_stage('wake.own_on', notify => true)")
    conn.execute("SELECT queue.configure_stage('wake.own_off', notify => false)")
    conn.execute("SELECT queue.configure_stage('*', notify => false)")
    try:
        for stage in ("wake.own_on", "wake.own_off", "wake.no_row"):
            assert conn.execute("SELECT count(*) FROM queue.take_next(%s)", (stage,)).fetchone()[0] == 0
            conn.execute("SELECT queue.enqueue('{}', %s)", (stage,))
        assert channels(listener, 1.0) == ["skiplock.wake.own_on"]
        marked = "SELECT array_agg(stage ORDER BY stage) FROM queue.stage_waiters WHERE stage LIKE 'wake.own_o%' OR stage = 'wake.no_row'"
        assert conn.execute(marked).fetchone()[0] == ["wake.own_on"], "a stage that does not notify was marked"
        conn.execute("SELECT queue.configure_stage('*', notify => true)")
        for stage in ("wake.own_off", "wake.no_row"):
            conn.execute("SELECT count(*) FROM queue.take_next(%s)", (stage,))  # finds the enqueued task
            assert conn.execute("SELECT count(*) FROM queue.take_next(%s)", (stage,)).fetchone()[0] == 0
            conn.execute("SELECT queue.enqueue('{}', %s)", (stage,))
        assert channels(listener, 1.0) == ["skiplock.wake.no_row"]
    finally:
        conn.execute("SELECT queue.configure_stage('*', notify => true)")


# Every other way a task becomes due at once wakes a waiting worker too (revision 0024): a worker
# handing its task back as it shuts down, an admin's retry, a failure retried at once, a re-run
# queued again, a reaped task, a stage resumed, the end of the last task a waiting one waits for
# (enqueue(after => …): made ready in that end's transaction, not found by a poll). Each case
# leaves one task of its stage running (or in the state it needs), marks the stage as waited on,
# then acts; `due` says whether the act leaves a task due at once, which is when a wake-up is
# worth its commit-time lock.
def _running(conn: psycopg.Connection, stage: str, key: str | None = None) -> tuple[int, object]:
    conn.execute("SELECT queue.enqueue('{}', %s, key => %s)", (stage, key))
    return conn.execute("SELECT id, lease FROM queue.take_next(%s)", (stage,)).fetchone()


def _release(conn, stage):
    task_id, lease = _running(conn, stage)
    return lambda: conn.execute("SELECT queue.release(%s, %s)", (task_id, lease))


def _release_later(conn, stage):
    task_id, lease = _running(conn, stage)
    return lambda: conn.execute("SELECT queue.release(%s, %s, retry_in => '1 hour')", (task_id, lease))


def _retry_error(conn, stage):
    task_id, lease = _running(conn, stage)
    conn.execute("SELECT queue.fail(%s, %s, 'boom', retry_in => '1 hour')", (task_id, lease))
    return lambda: conn.execute("SELECT queue.retry(%s)", (task_id,))


def _retry_fatal(conn, stage):
    task_id, lease = _running(conn, stage)
    conn.execute("SELECT queue.fail(%s, %s, 'boom', fatal => true)", (task_id, lease))
    return lambda: conn.execute("SELECT queue.retry(%s)", (task_id,))


def _fail_at_once(conn, stage):
    task_id, lease = _running(conn, stage)
    return lambda: conn.execute("SELECT queue.fail(%s, %s, 'boom', retry_in => '0')", (task_id, lease))


def _fail_later(conn, stage):
    task_id, lease = _running(conn, stage)
    return lambda: conn.execute("SELECT queue.fail(%s, %s, 'boom', retry_in => '1 hour')", (task_id, lease))


def _fail_locked_at_once(conn, stage):
    conn.execute("SELECT queue.enqueue('{}', %s)", (stage,))

    def act():
        with conn.transaction():
            task_id = conn.execute("SELECT id FROM queue.take_locked(%s)", (stage,)).fetchone()[0]
            conn.execute("SELECT queue.fail_locked(%s, 'boom', retry_in => '0')", (task_id,))
    return act


def _finish_rerun(conn, stage):
    task_id, lease = _running(conn, stage, key="k")
    conn.execute("SELECT queue.enqueue('{\"v\": 2}', %s, key => 'k', mode => 'rerun')", (stage,))
    return lambda: conn.execute("SELECT queue.finish(%s, %s)", (task_id, lease))


def _finish_batch_rerun(conn, stage):
    task_id, lease = _running(conn, stage, key="k")
    conn.execute("SELECT queue.enqueue('{\"v\": 2}', %s, key => 'k', mode => 'rerun')", (stage,))
    return lambda: conn.execute("SELECT queue.finish_batch(ARRAY[%s]::bigint[], ARRAY[%s]::uuid[])", (task_id, lease))


def _reap_at_once(conn, stage):
    conn.execute("SELECT queue.configure_stage(%s, lease_duration => '10 milliseconds', backoff_base => '0', "
                 "backoff_jitter => 0)", (stage,))
    _running(conn, stage)
    time.sleep(0.05)
    return lambda: conn.execute("SELECT queue.reap_hung()")


def _awaited(conn, stage, after_failed="cancel"):
    """A task of `stage` waiting for one running task of another stage."""
    parent, lease = _running(conn, stage + ".parent")
    conn.execute("SELECT queue.enqueue('{}', %s, after => ARRAY[%s::bigint], after_failed => %s)",
                 (stage, parent, after_failed))
    return parent, lease


def _last_awaited_ends(conn, stage):
    parent, lease = _awaited(conn, stage)
    return lambda: conn.execute("SELECT queue.finish(%s, %s)", (parent, lease))


def _awaited_fails_run(conn, stage):
    parent, lease = _awaited(conn, stage, "run")
    return lambda: conn.execute("SELECT queue.fail(%s, %s, 'boom', fatal => true)", (parent, lease))


def _awaited_fails_cancel(conn, stage):
    parent, lease = _awaited(conn, stage)
    return lambda: conn.execute("SELECT queue.fail(%s, %s, 'boom', fatal => true)", (parent, lease))


def _resume(conn, stage):
    conn.execute("SELECT queue.configure_stage(%s, paused => true)", (stage,))
    conn.execute("SELECT queue.enqueue('{}', %s)", (stage,))
    return lambda: conn.execute("SELECT queue.configure_stage(%s, paused => false)", (stage,))


@pytest.mark.parametrize(("prepare", "due"), [
    (_release, True), (_release_later, False), (_retry_error, True), (_retry_fatal, True),
    (_fail_at_once, True), (_fail_later, False), (_fail_locked_at_once, True), (_finish_rerun, True),
    (_finish_batch_rerun, True), (_reap_at_once, True), (_resume, True),
    (_last_awaited_ends, True), (_awaited_fails_run, True), (_awaited_fails_cancel, False),
], ids=lambda v: v.__name__.lstrip("_") if callable(v) else None)
def test_a_task_due_again_at_once_wakes_the_waiting_workers(conn: psycopg.Connection, listener: psycopg.Connection,
                                                            prepare, due: bool):
    stage = "wake.again." + prepare.__name__.lstrip("_")
    act = prepare(conn, stage)
    listener.execute(f'LISTEN "skiplock.{stage}"')
    conn.execute("INSERT INTO queue.stage_waiters (stage, until) VALUES (%s, now() + interval '1 minute') "
                 "ON CONFLICT (stage) DO UPDATE SET until = excluded.until", (stage,))
    act()
    assert channels(listener, 1.0 if due else 0.5) == ([f"skiplock.{stage}"] if due else [])
    due_now = conn.execute("SELECT count(*) FROM queue.live_tasks WHERE stage = %s AND status <> 'running' "
                           "AND run_at <= now()", (stage,)).fetchone()[0]
    assert due_now == (1 if due else 0)


def test_resuming_a_stage_wakes_its_workers_after_their_mark_ran_out(conn: psycopg.Connection,
                                                                   listener: psycopg.Connection):
    # A take from a paused stage returns without renewing the mark, so after a minute of pause
    # there is none: the resume must notify anyway (and so must a new cap).
    stage = "wake.resume.late"
    conn.execute("SELECT queue.configure_stage(%s, paused => true)", (stage,))
    conn.execute("SELECT queue.enqueue('{}', %s)", (stage,))
    assert conn.execute("SELECT count(*) FROM queue.take_next(%s)", (stage,)).fetchone()[0] == 0
    conn.execute("DELETE FROM queue.stage_waiters WHERE stage = %s", (stage,))
    listener.execute(f'LISTEN "skiplock.{stage}"')
    conn.execute("SELECT queue.configure_stage(%s, paused => false)", (stage,))
    conn.execute("SELECT queue.configure_stage(%s, max_running => 3)", (stage,))
    assert channels(listener, 1.0) == [f"skiplock.{stage}"] * 2
