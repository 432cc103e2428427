"""SQL tasks (issue 5): CALL queue.run_sql_tasks against a real server, and `skiplock run-sql`.

run_sql_tasks commits after each task, so it cannot run inside a pgTAP transaction: this module
drives it (tests/sql/150_sql_tasks.sql covers enqueue_sql's arguments and states). An executor is
a session of the enqueuing role itself: alice's tasks run on alice's own connections. Every test
uses its own stage; roles are cluster-wide, so they get names unique to this run and are dropped
at the end.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import psycopg
import psycopg.errors
import pytest
from psycopg import sql

from skiplock.sqlfiles import ROOT

ENV = dict(os.environ, COLUMNS="200")
ENV.pop("DATABASE_URL", None)

# The pg_cron recipe (docs/guide.md, "Running SQL tasks (pg_task style)"): per enqueuing role, an executor
# job and a watchdog job, both run as that role.
CRON_RUN = "CALL queue.run_sql_tasks('reports', 100)"
CRON_WATCHDOG = "SELECT queue.cancel_overdue_sql_tasks()"


@dataclass
class Roles:
    admin: str        # the superuser of the db URL
    alice: str        # LOGIN, member of skiplock_sql: enqueues SQL tasks and runs her own
    bob: str          # LOGIN, member of skiplock_sql: another enqueuing role
    producer: str     # LOGIN, member of skiplock_producer only
    alice_url: str
    bob_url: str
    producer_url: str


@pytest.fixture(scope="module")
def roles(db: str) -> Iterator[Roles]:
    suffix = uuid.uuid4().hex[:8]
    alice, bob, producer = (f"sqlt_{who}_{suffix}" for who in ("alice", "bob", "producer"))
    with psycopg.connect(db, autocommit=True) as c:
        admin = c.execute("SELECT session_user::text").fetchone()[0]
        for role in (alice, bob):
            c.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE skiplock_sql").format(sql.Identifier(role)))
        c.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE skiplock_producer").format(sql.Identifier(producer)))
    url = lambda user: psycopg.conninfo.make_conninfo(db, user=user)  # noqa: E731
    try:
        yield Roles(admin, alice, bob, producer, url(alice), url(bob), url(producer))
    finally:
        with psycopg.connect(db, autocommit=True) as c:
            for role in (producer, bob, alice):
                c.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                c.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.fixture
def admin(db: str) -> Iterator[psycopg.Connection]:
    """A superuser connection: setup and checks (as an executor it would run only its own tasks)."""
    with psycopg.connect(db, autocommit=True) as c:
        yield c


@pytest.fixture
def alice(roles: Roles) -> Iterator[psycopg.Connection]:
    """Alice's session: she enqueues on it, and it is the executor of her tasks."""
    with psycopg.connect(roles.alice_url, autocommit=True) as c:
        yield c


@pytest.fixture
def secret(admin: psycopg.Connection) -> str:
    """A table that only the superuser may read."""
    name = f"sqlt_secret_{uuid.uuid4().hex[:6]}"
    admin.execute(sql.SQL("CREATE TABLE public.{} (s text)").format(sql.Identifier(name)))
    admin.execute(sql.SQL("INSERT INTO public.{} VALUES ('top secret')").format(sql.Identifier(name)))
    admin.execute(sql.SQL("REVOKE ALL ON public.{} FROM PUBLIC").format(sql.Identifier(name)))
    return name


# -- helpers --------------------------------------------------------------------------------------

def enqueue_sql(conn: psycopg.Connection, request: str, **options: Any) -> int:
    named = sql.SQL("").join(sql.SQL(", {} => %s").format(sql.Identifier(k)) for k in options)
    query = sql.SQL("SELECT queue.enqueue_sql(%s{})").format(named)
    return conn.execute(query, [request, *options.values()]).fetchone()[0]


def call(conn: psycopg.Connection, stage: str, max_tasks: int = 100) -> int:
    return conn.execute("CALL queue.run_sql_tasks(%s, %s)", (stage, max_tasks)).fetchone()[0]


def task(conn: psycopg.Connection, task_id: int) -> tuple:
    """(status, attempt, error_text, result, run_as) of a one-off task, live or finished."""
    rows = conn.execute("SELECT status::text, attempt, error_text, result, run_as::text FROM queue.tasks WHERE id = %s",
                        (task_id,)).fetchall()
    assert len(rows) == 1, rows
    return rows[0]


def who(conn: psycopg.Connection) -> tuple[str, str]:
    return conn.execute("SELECT current_user::text, session_user::text").fetchone()


def wait_for(predicate, timeout: float = 90.0, every: float = 0.05) -> float:
    """Seconds it took until predicate() held; AssertionError after timeout (a bound for a hang:
    it returns as soon as predicate() holds)."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError("timed out waiting")
        time.sleep(every)
    return time.monotonic() - start


def secret_leaked(conn: psycopg.Connection, stage: str) -> int:
    return conn.execute("SELECT count(*) FROM queue.tasks WHERE stage = %s AND (result::text LIKE '%%top secret%%' "
                        "OR error_text LIKE '%%top secret%%')", (stage,)).fetchone()[0]


class Executors:
    """n threads, each with its own connection looping CALL queue.run_sql_tasks(stage, 1); an
    empty call sleeps `idle` seconds. Stops (and re-raises the first error) on leaving the block."""

    def __init__(self, url: str, stage: str, n: int = 1, idle: float = 0.02) -> None:
        self.url, self.stage, self.idle = url, stage, idle
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.ran = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(n)]

    def _loop(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as c:
                while not self.stop.is_set():
                    ran = call(c, self.stage, 1)
                    with self.lock:
                        self.ran += ran
                    if not ran:
                        self.stop.wait(self.idle)
        except BaseException as e:
            self.errors.append(e)

    def __enter__(self) -> "Executors":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=40)
        assert not any(t.is_alive() for t in self.threads), "an executor did not stop"
        if self.errors and exc[0] is None:
            raise self.errors[0]


class Watchdog(threading.Thread):
    """`SELECT queue.cancel_overdue_sql_tasks()` every `every` seconds on a connection of `url`
    (the role whose tasks it watches) until stopped; `cancels` is what each call returned."""

    def __init__(self, url: str, every: float = 0.1, command: str = CRON_WATCHDOG) -> None:
        super().__init__(daemon=True)
        self.url, self.every, self.command = url, every, command
        self.stopped = threading.Event()
        self.cancels: list[int] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as c:
                while not self.stopped.is_set():
                    self.cancels.append(c.execute(self.command).fetchone()[0])
                    self.stopped.wait(self.every)
        except BaseException as e:
            self.error = e

    def __enter__(self) -> "Watchdog":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.join(timeout=10)
        assert not self.is_alive()
        if self.error is not None and exc[0] is None:
            raise self.error


class BackgroundCall(threading.Thread):
    """CALL queue.run_sql_tasks on its own connection of `url`; `pid` is its backend."""

    def __init__(self, url: str, stage: str, max_tasks: int) -> None:
        super().__init__(daemon=True)
        self.url, self.stage, self.max_tasks = url, stage, max_tasks
        self.connected = threading.Event()
        self.pid = 0
        self.ran: int | None = None
        self.took = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as c:
                self.pid = c.info.backend_pid
                self.connected.set()
                started = time.monotonic()
                self.ran = call(c, self.stage, self.max_tasks)
                self.took = time.monotonic() - started
        except BaseException as e:
            self.error = e
            self.connected.set()

    def result(self, timeout: float = 90) -> int:
        self.join(timeout=timeout)
        assert not self.is_alive(), "the call did not return"
        if self.error is not None:
            raise self.error
        return self.ran


# -- results --------------------------------------------------------------------------------------

def test_a_query_keeps_column_names_types_and_rows_in_order(admin: psycopg.Connection, alice: psycopg.Connection,
                                                            roles: Roles) -> None:
    request = ("SELECT g AS n, 'row ' || g AS label, g * 1.5 AS half, g % 2 = 0 AS even, NULL::date AS day "
               "FROM generate_series(3, 1, -1) g")
    t = enqueue_sql(alice, request, stage="res.query")
    assert call(alice, "res.query") == 1
    status, attempt, error, result, run_as = task(admin, t)
    assert (status, attempt, error, run_as) == ("done", 1, None, roles.alice)
    assert result == {
        "columns": [{"name": "n", "type": "integer"}, {"name": "label", "type": "text"},
                    {"name": "half", "type": "numeric"}, {"name": "even", "type": "boolean"},
                    {"name": "day", "type": "date"}],
        "rows": [[3, "row 3", 4.5, False, None], [2, "row 2", 3.0, True, None], [1, "row 1", 1.5, False, None]],
        "row_count": 3,
    }


def test_a_statement_without_rows_records_its_command_and_row_count(admin: psycopg.Connection,
                                                                    alice: psycopg.Connection, roles: Roles) -> None:
    admin.execute("CREATE TABLE public.sqlt_sink (v integer)")
    admin.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE ON public.sqlt_sink TO {}").format(sql.Identifier(roles.alice)))
    insert = enqueue_sql(alice, "INSERT INTO public.sqlt_sink VALUES (1), (2)", stage="res.command", priority=0)
    update = enqueue_sql(alice, "UPDATE public.sqlt_sink SET v = v + 10 WHERE v > 0", stage="res.command", priority=1)
    empty = enqueue_sql(alice, "SELECT v FROM public.sqlt_sink WHERE v < 0", stage="res.command", priority=2)
    assert call(alice, "res.command") == 3
    assert task(admin, insert)[:4] == ("done", 1, None, {"command": "INSERT", "row_count": 2})
    assert task(admin, update)[3] == {"command": "UPDATE", "row_count": 2}
    assert task(admin, empty)[3] == {"columns": [{"name": "v", "type": "integer"}], "rows": [], "row_count": 0}
    assert admin.execute("SELECT array_agg(v ORDER BY v) FROM public.sqlt_sink").fetchone()[0] == [11, 12]


def test_keep_history_false_leaves_no_history_row_after_success(admin: psycopg.Connection,
                                                               alice: psycopg.Connection) -> None:
    admin.execute("SELECT queue.configure_stage('res.nohistory', max_attempts => 1)")
    ok = enqueue_sql(alice, "SELECT 1", stage="res.nohistory", keep_history=False, priority=0)
    bad = enqueue_sql(alice, "SELECT 1/0", stage="res.nohistory", keep_history=False, priority=1)
    kept = enqueue_sql(alice, "SELECT 2", stage="res.nohistory", priority=2)
    assert call(alice, "res.nohistory") == 3
    assert admin.execute("SELECT count(*) FROM queue.tasks WHERE id = %s", (ok,)).fetchone()[0] == 0
    assert task(admin, bad)[:3] == ("fatal", 1, "22012: division by zero")  # a failure is still kept
    assert task(admin, kept)[0] == "done"


# -- errors ---------------------------------------------------------------------------------------

def test_division_by_zero_is_recorded_with_its_sqlstate_and_retried_or_fatal_by_the_stage(
        admin: psycopg.Connection, alice: psycopg.Connection) -> None:
    retried = enqueue_sql(alice, "SELECT 1/0", stage="err.retry")
    admin.execute("SELECT queue.configure_stage('err.fatal', max_attempts => 1)")
    fatal = enqueue_sql(alice, "SELECT 1/0", stage="err.fatal")
    assert call(alice, "err.retry") == 1 and call(alice, "err.fatal") == 1
    assert task(admin, retried)[:4] == ("error", 1, "22012: division by zero", None)
    assert admin.execute("SELECT run_at > now() FROM queue.live_tasks WHERE id = %s", (retried,)).fetchone()[0]
    assert task(admin, fatal)[:4] == ("fatal", 1, "22012: division by zero", None)


def test_a_failing_task_does_not_affect_the_next_task_in_the_same_call(admin: psycopg.Connection,
                                                                      alice: psycopg.Connection) -> None:
    admin.execute("SELECT queue.configure_stage('err.next', max_attempts => 1)")
    div = enqueue_sql(alice, "SELECT 1/0", stage="err.next", priority=0)
    missing = enqueue_sql(alice, "SELECT * FROM sqlt_no_such_table", stage="err.next", priority=1)
    syntax = enqueue_sql(alice, "SELEKT 1", stage="err.next", priority=2)
    fine = enqueue_sql(alice, "SELECT 'fine' AS ok", stage="err.next", priority=3)
    assert call(alice, "err.next", 10) == 4  # one call: each failure recorded, the call went on
    assert task(admin, div)[:3] == ("fatal", 1, "22012: division by zero")
    assert task(admin, missing)[2].startswith("42P01: relation \"sqlt_no_such_table\" does not exist")
    assert task(admin, syntax)[2].startswith("42601: ")
    assert task(admin, fine)[:4] == ("done", 1, None, {"columns": [{"name": "ok", "type": "text"}],
                                                       "rows": [["fine"]], "row_count": 1})


def test_settings_temp_tables_and_locks_of_a_request_do_not_leak_into_the_next_task(
        admin: psycopg.Connection, alice: psycopg.Connection, roles: Roles) -> None:
    stage = "err.leak"
    before = alice.execute("SELECT current_setting('work_mem'), current_setting('search_path')").fetchone()
    requests = ["SET search_path = pg_catalog",
                "SET work_mem = '77MB'",
                "SELECT set_config('sqlt.leak', 'yes', false)",
                "CREATE TEMP TABLE sqlt_leak AS SELECT 1 AS a",
                "SELECT pg_advisory_lock(424242)"]
    setters = [enqueue_sql(alice, r, stage=stage, priority=i) for i, r in enumerate(requests)]
    probe = enqueue_sql(alice, "SELECT current_setting('search_path') AS search_path, "
                               "current_setting('work_mem') AS work_mem, "
                               "coalesce(current_setting('sqlt.leak', true), '') AS custom, "
                               "to_regclass('pg_temp.sqlt_leak') IS NULL AS no_temp_table, "
                               "current_user::text AS who", stage=stage, priority=len(requests))
    assert call(alice, stage, 10) == len(requests) + 1
    assert [task(admin, t)[:3] for t in setters] == [("done", 1, None)] * len(requests)
    status, _, _, result, _ = task(admin, probe)
    assert status == "done"
    assert result["rows"] == [['"$user", public', before[0], "", True, roles.alice]]
    # nor into the executor's session itself once the call has returned
    assert alice.execute("SELECT current_setting('work_mem'), current_setting('search_path')").fetchone() == before
    assert alice.execute("SELECT current_user::text, to_regclass('pg_temp.sqlt_leak')").fetchone() == (roles.alice, None)
    assert admin.execute("SELECT pg_try_advisory_lock(424242)").fetchone()[0] is True  # the lock was let go
    admin.execute("SELECT pg_advisory_unlock(424242)")


def test_a_request_raising_query_canceled_itself_is_an_ordinary_error_and_the_call_goes_on(
        admin: psycopg.Connection, alice: psycopg.Connection) -> None:
    # Regression: any 57014 before the timeout used to be taken for a stop request (task handed
    # back, attempt not counted), so such a request ran again and again.
    stage = "err.own57014"
    raiser = enqueue_sql(alice, "DO $$BEGIN RAISE EXCEPTION 'x' USING ERRCODE = 'query_canceled'; END$$",
                         stage=stage, timeout="60 seconds", priority=0)
    after = enqueue_sql(alice, "SELECT 'after' AS next", stage=stage, priority=1)
    assert call(alice, stage, 10) == 2
    status, attempt, error, _, _ = task(admin, raiser)
    assert (status, attempt, error) == ("error", 1, "57014: x")
    assert admin.execute("SELECT run_at > now() FROM queue.live_tasks WHERE id = %s", (raiser,)).fetchone()[0]
    assert task(admin, after)[:3] == ("done", 1, None)
    assert call(alice, stage, 10) == 0  # not due again at once: retried by the stage's backoff


# -- deferred constraints -------------------------------------------------------------------------

def test_a_deferred_constraint_trigger_fires_as_the_enqueuing_role_inside_the_task(
        admin: psycopg.Connection, alice: psycopg.Connection, roles: Roles) -> None:
    # Regression: with the first design (an executor login, SET ROLE, RESET ROLE before COMMIT) a
    # deferred constraint trigger fired at the executor's COMMIT, as the executor.
    stage, schema = "defer.who", f"sqlt_defer_{uuid.uuid4().hex[:6]}"
    admin.execute("SELECT queue.configure_stage(%s, max_attempts => 1)", (stage,))
    admin.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(sql.Identifier(schema), sql.Identifier(roles.alice)))
    s = sql.Identifier(schema)
    alice.execute(sql.SQL("CREATE TABLE {}.items (v integer)").format(s))
    alice.execute(sql.SQL("CREATE TABLE {}.seen (v integer, cur text, sess text)").format(s))
    alice.execute(sql.SQL(
        "CREATE FUNCTION {0}.record_who() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
        "  IF NEW.v < 0 THEN RAISE EXCEPTION 'deferred check failed for %', NEW.v; END IF; "
        "  INSERT INTO {0}.seen VALUES (NEW.v, current_user, session_user); RETURN NULL; END$$").format(s))
    alice.execute(sql.SQL("CREATE CONSTRAINT TRIGGER record_who AFTER INSERT ON {0}.items DEFERRABLE INITIALLY DEFERRED "
                          "FOR EACH ROW EXECUTE FUNCTION {0}.record_who()").format(s))
    ok = enqueue_sql(alice, f'INSERT INTO "{schema}".items VALUES (1)', stage=stage, priority=0)
    bad = enqueue_sql(alice, f'INSERT INTO "{schema}".items VALUES (-1)', stage=stage, priority=1)
    after = enqueue_sql(alice, "SELECT 'after' AS next", stage=stage, priority=2)
    assert call(alice, stage, 10) == 3  # the deferred trigger's error did not abort the call
    assert task(admin, ok)[:4] == ("done", 1, None, {"command": "INSERT", "row_count": 1})
    assert admin.execute(sql.SQL("SELECT v, cur, sess FROM {}.seen").format(s)).fetchall() == \
        [(1, roles.alice, roles.alice)]  # the trigger ran as alice, in her task: never as anyone else
    status, attempt, error, result, _ = task(admin, bad)
    assert (status, attempt, result) == ("fatal", 1, None)
    assert error.startswith("P0001: deferred check failed for -1"), error  # the task's error
    assert admin.execute(sql.SQL("SELECT array_agg(v) FROM {}.items").format(s)).fetchone()[0] == [1]  # rolled back
    assert task(admin, after)[0] == "done"


def test_a_temp_table_with_a_pending_deferred_trigger_does_not_strand_its_task(
        admin: psycopg.Connection, alice: psycopg.Connection) -> None:
    # Regression: the cleanup (DISCARD TEMP) ran in the task's transaction, where the temp table
    # still had trigger events pending: the whole CALL failed, and the task stayed running.
    stage = "defer.temp"
    trap = ("DO $$BEGIN CREATE TEMP TABLE sqlt_trap (a int); "
            "CREATE FUNCTION pg_temp.sqlt_noop() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END'; "
            "CREATE CONSTRAINT TRIGGER sqlt_trap AFTER INSERT ON pg_temp.sqlt_trap DEFERRABLE INITIALLY DEFERRED "
            "FOR EACH ROW EXECUTE FUNCTION pg_temp.sqlt_noop(); INSERT INTO pg_temp.sqlt_trap VALUES (1); END$$")
    trapped = enqueue_sql(alice, trap, stage=stage, priority=0)
    after = enqueue_sql(alice, "SELECT to_regclass('pg_temp.sqlt_trap') IS NULL AS gone", stage=stage, priority=1)
    assert call(alice, stage, 10) == 2
    assert task(admin, trapped)[:4] == ("done", 1, None, {"command": "DO", "row_count": 0})
    assert task(admin, after)[:4] == ("done", 1, None, {"columns": [{"name": "gone", "type": "boolean"}],
                                                        "rows": [[True]], "row_count": 1})
    assert alice.execute("SELECT to_regclass('pg_temp.sqlt_trap')").fetchone()[0] is None


# -- timeout and stop -----------------------------------------------------------------------------

def test_the_watchdog_cancels_a_statement_past_its_timeout_as_57014_and_the_next_task_runs(
        admin: psycopg.Connection, alice: psycopg.Connection, roles: Roles) -> None:
    stage = "timeout"
    admin.execute("SELECT queue.configure_stage(%s, max_attempts => 1)", (stage,))
    slow = enqueue_sql(alice, "SELECT pg_sleep(30)", stage=stage, timeout="1 second", priority=0)
    after = enqueue_sql(alice, "SELECT 'after' AS next", stage=stage, priority=1)
    # The watchdog keeps polling every 0.1 s throughout: it signals a task at most once per 5 s,
    # so no second cancel reaches the executor while it records the first.
    with Watchdog(roles.alice_url) as watchdog:
        started = time.monotonic()
        ran = call(alice, stage, 10)
        took = time.monotonic() - started
        time.sleep(0.3)
    assert ran == 2
    assert 0.9 < took < 20, took  # the timeout (1 s), not the statement's 30 s
    assert sum(watchdog.cancels) == 1, watchdog.cancels
    status, attempt, error, result, _ = task(admin, slow)
    assert (status, attempt, result) == ("fatal", 1, None)
    assert error == "57014: canceling statement due to user request (timeout 00:00:01)", error
    assert task(admin, after)[:4] == ("done", 1, None, {"columns": [{"name": "next", "type": "text"}],
                                                        "rows": [["after"]], "row_count": 1})


def test_a_stop_request_hands_the_task_back_and_the_call_returns(admin: psycopg.Connection,
                                                                 alice: psycopg.Connection, roles: Roles) -> None:
    # Regression: a stop request used to hand the task back and go on to claim the next one, so
    # stopping took a cancel per due task. A stop request is stop_sql_executor (a cancel while
    # the stopping session holds the executor's advisory lock).
    stage = "stop.request"
    slow = enqueue_sql(alice, "SELECT pg_sleep(60)", stage=stage, timeout="120 seconds", priority=0)
    due = [enqueue_sql(alice, "SELECT 1", stage=stage, priority=1) for _ in range(3)]
    executor = BackgroundCall(roles.alice_url, stage, 10)
    executor.start()
    executor.connected.wait(90)
    wait_for(lambda: task(admin, slow)[0] == "running", timeout=90)
    time.sleep(0.3)  # in pg_sleep
    assert alice.execute("SELECT queue.stop_sql_executor(%s)", (executor.pid,)).fetchone()[0] is True
    assert executor.result() == 1  # it handed one back and returned, though 3 more were due
    alice.execute("SELECT pg_advisory_unlock(1936419948, %s)", (executor.pid,))
    assert executor.took < 30, executor.took  # the stop, not the statement's 60 s
    assert task(admin, slow)[:4] == ("ready", 0, None, None)  # back, the attempt not counted
    assert [task(admin, t)[:2] for t in due] == [("ready", 0)] * 3
    assert admin.execute("SELECT count(*) FROM queue.history WHERE stage = %s", (stage,)).fetchone()[0] == 0


def test_a_stop_from_a_session_that_ends_at_once_still_hands_the_task_back(admin: psycopg.Connection,
                                                                          alice: psycopg.Connection,
                                                                          roles: Roles) -> None:
    # Regression: the executor tells a stop from any other cancel by the stopping session's
    # advisory lock, and looked for it only when the cancel arrived. `psql -c "SELECT
    # queue.stop_sql_executor(pid)"` disconnects at once: in 48 of 80 tries the lock was gone by
    # then and the task ended as a 57014 error, its attempt counted.
    stage = "stop.oneshot"
    for attempt in range(8):
        slow = enqueue_sql(alice, "SELECT pg_sleep(20)", stage=stage, timeout="60 seconds")
        executor = BackgroundCall(roles.alice_url, stage, 1)
        executor.start()
        executor.connected.wait(90)
        wait_for(lambda: task(admin, slow)[0] == "running", timeout=90)
        time.sleep(0.1)  # in pg_sleep
        with psycopg.connect(roles.alice_url, autocommit=True) as stopper:  # closed right after the call
            assert stopper.execute("SELECT queue.stop_sql_executor(%s)", (executor.pid,)).fetchone()[0] is True
        assert executor.result() == 1  # the call returned, its one task handed back
        assert task(admin, slow)[:3] == ("ready", 0, None), f"try {attempt + 1}: {task(admin, slow)}"
        admin.execute("SELECT queue.cancel(%s)", (slow,))


def test_a_request_cancelling_itself_is_its_own_error_not_a_stop(admin: psycopg.Connection,
                                                                  alice: psycopg.Connection) -> None:
    # Regression: any cancel before the timeout used to count as a stop request, so a request that
    # cancelled its own backend was handed back (attempt not counted) and claimed again for ever.
    stage = "self.cancel"
    rogue = enqueue_sql(alice, "SELECT pg_cancel_backend(pg_backend_pid()), pg_sleep(0.5)", stage=stage, priority=0)
    after = enqueue_sql(alice, "SELECT 'after' AS next", stage=stage, priority=1)
    assert call(alice, stage, 10) == 2  # both ran in one call: no stop
    status, attempt, error, _ = task(admin, rogue)[:4]
    assert (status, attempt) == ("error", 1), (status, attempt)
    assert error == "57014: canceling statement due to user request", error
    assert task(admin, after)[0] == "done"


def test_a_request_switching_role_does_not_strand_its_task(admin: psycopg.Connection,
                                                            alice: psycopg.Connection, roles: Roles) -> None:
    # Regression: a request's SET ROLE (to a role alice belongs to, without skiplock_sql) outlived
    # it, so recording the task failed, the CALL aborted and the task stayed running.
    stage = "set.role"
    other = f"sqlt_other_{uuid.uuid4().hex[:8]}"
    admin.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(other)))
    try:
        admin.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(other), sql.Identifier(roles.alice)))
        switch = enqueue_sql(alice, f'SET ROLE "{other}"', stage=stage, priority=0)
        after = enqueue_sql(alice, "SELECT current_user::text AS who", stage=stage, priority=1)
        assert call(alice, stage, 10) == 2
        assert task(admin, switch)[0] == "done"
        status, _, _, result = task(admin, after)[:4]
        assert (status, result["rows"]) == ("done", [[roles.alice]])
    finally:
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(other)))


# -- security -------------------------------------------------------------------------------------

def test_a_role_cannot_read_through_a_task_a_table_it_cannot_read_directly(
        admin: psycopg.Connection, alice: psycopg.Connection, roles: Roles, secret: str) -> None:
    stage = "sec.read"
    admin.execute("SELECT queue.configure_stage(%s, max_attempts => 1)", (stage,))
    read = f"SELECT s FROM public.{secret}"
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        alice.execute(read)
    assert admin.execute(read).fetchall() == [("top secret",)]
    t = enqueue_sql(alice, read, stage=stage)
    assert call(admin, stage) == 0  # a superuser's executor runs only the superuser's own tasks
    assert task(admin, t)[0] == "ready"
    assert call(alice, stage) == 1
    status, _, error, result, run_as = task(admin, t)
    assert (status, result, run_as) == ("fatal", None, roles.alice)
    assert error.startswith(f"42501: permission denied for table {secret}"), error
    assert secret_leaked(admin, stage) == 0
    # The control: once alice may read it, the same task reads it.
    admin.execute(sql.SQL("GRANT SELECT ON public.{} TO {}").format(sql.Identifier(secret), sql.Identifier(roles.alice)))
    granted = enqueue_sql(alice, read, stage=stage)
    assert call(alice, stage) == 1
    assert task(admin, granted)[3]["rows"] == [["top secret"]]


def test_the_request_runs_as_the_enqueuing_role_in_its_own_session(admin: psycopg.Connection,
                                                                   alice: psycopg.Connection, roles: Roles) -> None:
    t = enqueue_sql(alice, "SELECT current_user, session_user", stage="sec.whoami")
    assert call(alice, "sec.whoami") == 1
    assert task(admin, t)[3]["rows"] == [[roles.alice, roles.alice]]
    assert who(alice) == (roles.alice, roles.alice)


# Each attempt to reach another identity from a request: (request, how the task ends). In alice's
# own session the harmless ones are no-ops (there is no other role to go back to); the others are
# refused by the server.
ESCALATIONS = [
    ("RESET ROLE", "done"),
    ("SET ROLE NONE", "done"),
    ("SET SESSION AUTHORIZATION DEFAULT", "done"),
    ("SET ROLE {admin}", "42501: permission denied to set role"),
    ("SELECT set_config('role', '{admin}', false)", "42501: permission denied to set role"),
    ("SET SESSION AUTHORIZATION {admin}", "42501: permission denied to set session authorization"),
    ("SELECT set_config('session_authorization', '{admin}', false)",
     "42501: permission denied to set session authorization"),
]


@pytest.mark.parametrize("request_,outcome", ESCALATIONS, ids=[r for r, _ in ESCALATIONS])
def test_a_request_cannot_take_another_identity(request_: str, outcome: str, admin: psycopg.Connection,
                                                alice: psycopg.Connection, roles: Roles, secret: str) -> None:
    stage = "sec.escalate"
    admin.execute("SELECT queue.configure_stage(%s, max_attempts => 1)", (stage,))
    escalate = request_.format(admin=roles.admin)
    as_statement = escalate.replace("SELECT set_config", "PERFORM set_config")
    t = enqueue_sql(alice, escalate, stage=stage, priority=0)
    whoami = enqueue_sql(alice, "SELECT current_user, session_user", stage=stage, priority=1)
    # The same, then the read, in one request.
    then_read = enqueue_sql(alice, f"DO $$DECLARE v text; BEGIN {as_statement}; SELECT s INTO v FROM public.{secret}; "
                                   "RAISE NOTICE '%', v; END$$", stage=stage, priority=2)
    assert call(alice, stage) == 3
    status, _, error, result, _ = task(admin, t)
    if outcome == "done":
        assert (status, error) == ("done", None)
    else:
        assert (status, result) == ("fatal", None)
        assert error.startswith(outcome), error
    assert task(admin, whoami)[3]["rows"] == [[roles.alice, roles.alice]]
    status, _, error, result, _ = task(admin, then_read)
    assert (status, result) == ("fatal", None)
    assert error.startswith(outcome if outcome != "done" else f"42501: permission denied for table {secret}"), error
    assert secret_leaked(admin, stage) == 0
    assert who(alice) == (roles.alice, roles.alice)


def test_an_executor_runs_only_its_own_roles_tasks(admin: psycopg.Connection, alice: psycopg.Connection,
                                                   roles: Roles) -> None:
    stage = "sec.roles"
    admin.execute("SELECT queue.configure_stage(%s, max_attempts => 1)", (stage,))
    with psycopg.connect(roles.bob_url, autocommit=True) as bob:
        hers = [enqueue_sql(alice, "SELECT current_user", stage=stage) for _ in range(2)]
        his = enqueue_sql(bob, "SELECT current_user", stage=stage, priority=-1)  # first in the stage's order
        assert call(alice, stage, 10) == 2
        assert [task(admin, t)[3]["rows"] for t in hers] == [[[roles.alice]]] * 2
        assert task(admin, his)[0] == "ready"  # not alice's to run
        assert call(admin, stage, 10) == 0
        assert call(bob, stage, 10) == 1
        assert task(admin, his)[3]["rows"] == [[roles.bob]]
        # Nor do their watchdogs reach each other's tasks.
        slow = enqueue_sql(bob, "SELECT pg_sleep(30)", stage=stage, timeout="1 second")
        executor = BackgroundCall(roles.bob_url, stage, 1)
        executor.start()
        wait_for(lambda: task(admin, slow)[0] == "running", timeout=90)
        cancels: list[tuple[int, int]] = []

        def watchdogs() -> bool:  # alice's first: she would see the task as soon as bob does
            cancels.append((alice.execute(CRON_WATCHDOG).fetchone()[0], bob.execute(CRON_WATCHDOG).fetchone()[0]))
            return cancels[-1][1] == 1

        wait_for(watchdogs, timeout=90, every=0.1)
        assert sum(a for a, _ in cancels) == 0, cancels
        assert executor.result() == 1
    status, _, error, _, run_as = task(admin, slow)
    assert (status, run_as) == ("fatal", roles.bob) and error.startswith("57014: "), error


def test_run_sql_tasks_refuses_to_run_under_set_role(admin: psycopg.Connection, alice: psycopg.Connection,
                                                     roles: Roles) -> None:
    stage = "sec.setrole"
    t = enqueue_sql(alice, "SELECT current_user", stage=stage)
    admin.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(roles.alice)))
    try:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="must not run under SET ROLE"):
            call(admin, stage)
    finally:
        admin.execute("RESET ROLE")
    alice.execute("SET ROLE skiplock_sql")  # a role alice is a member of
    try:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="must not run under SET ROLE"):
            call(alice, stage)
    finally:
        alice.execute("RESET ROLE")
    assert task(admin, t)[:2] == ("ready", 0)
    assert call(alice, stage) == 1 and task(admin, t)[3]["rows"] == [[roles.alice]]


def test_only_members_of_skiplock_sql_may_enqueue_or_run_sql_tasks(admin: psycopg.Connection, roles: Roles) -> None:
    with psycopg.connect(roles.producer_url, autocommit=True) as producer:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            enqueue_sql(producer, "SELECT 1", stage="sec.enqueue")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            call(producer, "sec.enqueue")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            producer.execute(CRON_WATCHDOG)
    assert admin.execute("SELECT count(*) FROM queue.tasks WHERE stage = 'sec.enqueue'").fetchone()[0] == 0


def test_a_producer_cannot_rewrite_an_sql_task_through_enqueue_rerun(admin: psycopg.Connection,
                                                                     alice: psycopg.Connection, roles: Roles) -> None:
    t = enqueue_sql(alice, "SELECT 'mine'", stage="sec.rerun", key="k")
    payload = admin.execute("SELECT payload FROM queue.live_tasks WHERE id = %s", (t,)).fetchone()[0]
    with psycopg.connect(roles.producer_url, autocommit=True) as producer:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            producer.execute("SELECT queue.enqueue(%s::jsonb, 'sec.rerun', key => 'k', mode => 'rerun')",
                             ('{"sql": "SELECT pg_read_file(\'/etc/passwd\')", "timeout": null, "keep_history": true}',))
    assert admin.execute("SELECT payload, run_as::text, status::text FROM queue.live_tasks WHERE id = %s",
                         (t,)).fetchone() == (payload, roles.alice, "ready")
    assert payload["sql"] == "SELECT 'mine'"
    assert call(alice, "sec.rerun") == 1
    assert task(admin, t)[3]["rows"] == [["mine"]]


# -- max running ----------------------------------------------------------------------------------

def test_max_2_never_runs_more_than_2_tasks_of_the_stage_at_once(admin: psycopg.Connection,
                                                                 alice: psycopg.Connection, roles: Roles) -> None:
    stage, n = "cap", 8
    admin.execute("CREATE TABLE public.sqlt_cap_log (started timestamptz, ended timestamptz)")
    admin.execute(sql.SQL("GRANT INSERT ON public.sqlt_cap_log TO {}").format(sql.Identifier(roles.alice)))
    request = ("DO $$DECLARE s timestamptz := clock_timestamp(); BEGIN PERFORM pg_sleep(0.5); "
               "INSERT INTO public.sqlt_cap_log VALUES (s, clock_timestamp()); END$$")
    # The cap is an admin's; alice may pass the cap the stage has (pg_task's habit), not set one.
    admin.execute("SELECT queue.configure_stage(%s, max_running => 2)", (stage,))
    ids = [enqueue_sql(alice, request, stage=stage, max=2) for _ in range(n)]
    done = lambda: admin.execute("SELECT count(*) FROM queue.history WHERE stage = %s AND status = 'done'",  # noqa: E731
                                 (stage,)).fetchone()[0] == n
    with Executors(roles.alice_url, stage, n=4):
        took = wait_for(done, timeout=90)
    assert took >= 1.9  # 8 runs of 0.5 s, 2 at a time
    intervals = admin.execute("SELECT started, ended FROM public.sqlt_cap_log").fetchall()
    assert len(intervals) == n and [task(admin, t)[0] for t in ids] == ["done"] * n
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    assert most == 2


def test_max_from_a_role_outside_skiplock_admin_cannot_change_a_stages_cap(admin: psycopg.Connection,
                                                                         alice: psycopg.Connection) -> None:
    # max sets max_running for every task of the stage, ordinary ones too: a stage's policy.
    stage = "cap.policy"
    admin.execute("SELECT queue.configure_stage(%s, max_running => 2)", (stage,))
    for attempt in (100000, 1):
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as denied:
            enqueue_sql(alice, "SELECT 1", stage=stage, max=attempt)
        assert "configure_stage('cap.policy', max_running => " in denied.value.diag.message_hint
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        enqueue_sql(alice, "SELECT 1", stage="cap.none", max=3)  # a stage without a cap gets none
    assert enqueue_sql(alice, "SELECT 1", stage=stage, max=2) > 0
    assert admin.execute("SELECT stage, max_running FROM queue.stage_settings WHERE stage LIKE 'cap.%%' ORDER BY 1"
                         ).fetchall() == [("cap.policy", 2)]
    assert admin.execute("SELECT count(*) FROM queue.live_tasks WHERE stage LIKE 'cap.%%'").fetchone()[0] == 1


def test_enqueue_sql_on_a_restricted_stage_says_only_permission_denied_whatever_the_key(
        admin: psycopg.Connection, alice: psycopg.Connection) -> None:
    # Another tenant's key must neither be told apart from a free one nor make the caller wait.
    stage = "sec.keys"
    admin.execute("SELECT queue.grant_stage(%s, 'skiplock_admin'::regrole)", (stage,))
    admin.execute("SELECT queue.enqueue('{}', %s, key => 'invoice-42')", (stage,))
    with psycopg.connect(admin.info.dsn) as holder:  # a worker holds that task's row
        holder.execute("SELECT id FROM queue.live_tasks WHERE stage = %s FOR UPDATE", (stage,))
        alice.execute("SET lock_timeout = '2s'")
        for key in ("invoice-42", "invoice-43"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as denied:
                enqueue_sql(alice, "SELECT 1", stage=stage, key=key)
            assert str(denied.value).startswith("permission denied for stage sec.keys"), (key, denied.value)
        alice.execute("RESET lock_timeout")


def test_sql_tasks_belong_to_the_role_of_that_exact_name(admin: psycopg.Connection, db: str, roles: Roles) -> None:
    # A cast of a role's name to regrole reads it as SQL input: "Mixed" as mixed, a name of
    # digits as an OID, a dotted name as an error. run_as must be the caller, whatever its name.
    suffix = uuid.uuid4().hex[:8]
    alice_oid = admin.execute("SELECT %s::regrole::oid::text", (roles.alice,)).fetchone()[0]
    lower, mixed, digits, dotted = f"sqlt_mixed_{suffix}", f"Sqlt_Mixed_{suffix}", alice_oid, f"sqlt.dot.{suffix}"
    made = [lower, mixed, digits, dotted]
    for role in made:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE skiplock_sql").format(sql.Identifier(role)))
    try:
        ids = {}
        for role in (mixed, digits, dotted):
            with psycopg.connect(psycopg.conninfo.make_conninfo(db, user=role), autocommit=True) as c:
                ids[role] = enqueue_sql(c, "SELECT current_user::text", stage="names")
        for role, task_id in ids.items():
            assert task(admin, task_id)[4] == admin.execute(
                "SELECT oid::regrole::text FROM pg_roles WHERE rolname = %s", (role,)).fetchone()[0], role
        # Neither the lower-case namesake nor alice (whose OID is a role's name) runs them.
        for role in (lower, roles.alice):
            with psycopg.connect(psycopg.conninfo.make_conninfo(db, user=role), autocommit=True) as c:
                assert call(c, "names") == 0
        for role in (mixed, digits, dotted):
            with psycopg.connect(psycopg.conninfo.make_conninfo(db, user=role), autocommit=True) as c:
                assert call(c, "names") == 1
                assert task(admin, ids[role])[3]["rows"] == [[role]]
        # The grant the access error suggests names the caller, not its lower-case namesake.
        admin.execute("SELECT queue.grant_stage('names.closed', 'skiplock_admin'::regrole)")
        with psycopg.connect(psycopg.conninfo.make_conninfo(db, user=mixed), autocommit=True) as c:
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as denied:
                enqueue_sql(c, "SELECT 1", stage="names.closed")
        hint = denied.value.diag.message_hint
        grant = hint[hint.index("SELECT queue.grant_stage"):]
        admin.execute(grant)
        assert admin.execute("SELECT role::text FROM queue.stage_access WHERE stage = 'names.closed' "
                             "AND role <> 'skiplock_admin'::regrole").fetchall() == [(f'"{mixed}"',)]
    finally:
        admin.execute("DELETE FROM queue.stage_access WHERE stage = 'names.closed'")
        for role in made:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


# -- repeat ---------------------------------------------------------------------------------------

def test_repeat_with_drift_stays_on_the_grid_and_without_drift_plans_from_the_runs_end(
        admin: psycopg.Connection, alice: psycopg.Connection, roles: Roles) -> None:
    # Each run takes 0.3 s and the executors look only every 0.2 s, so runs start late.
    grid = enqueue_sql(alice, "SELECT pg_sleep(0.3)", stage="repeat.drift", repeat="1 second", drift=True)
    after = enqueue_sql(alice, "SELECT pg_sleep(0.3)", stage="repeat.nodrift", repeat="1 second", drift=False)
    with Executors(roles.alice_url, "repeat.drift", idle=0.2), Executors(roles.alice_url, "repeat.nodrift", idle=0.2):
        time.sleep(4.6)
    admin.execute("SELECT queue.cancel(%s), queue.cancel(%s)", (grid, after))

    def runs(t: int) -> list[tuple[float, float, float]]:
        return admin.execute("SELECT extract(epoch FROM run_at)::float8, extract(epoch FROM started)::float8, "
                             "       extract(epoch FROM finished)::float8 "
                             "  FROM queue.history WHERE id = %s AND status = 'done' ORDER BY finished", (t,)).fetchall()

    drift = runs(grid)
    assert len(drift) >= 3, drift
    offsets = [r[0] - drift[0][0] for r in drift]
    assert all(abs(o - round(o)) < 0.001 for o in offsets), offsets  # planned from the slot: on the 1 s grid
    assert [round(o) for o in offsets] == sorted(set(round(o) for o in offsets))
    assert all(started - run_at < 1.0 for run_at, started, _ in drift)  # each run starts before its next slot
    assert all(finished - started >= 0.3 for _, started, finished in drift)  # finished: the run's real end

    nodrift = runs(after)
    assert len(nodrift) >= 3, nodrift
    # Regression: finished used to be the start of the request's transaction, and the next run
    # was planned from it.
    assert all(finished - started >= 0.3 for _, started, finished in nodrift), nodrift
    gaps = [nodrift[i + 1][0] - nodrift[i][2] for i in range(len(nodrift) - 1)]
    assert all(abs(g - 1.0) < 0.005 for g in gaps), gaps  # the next run_at is the run's end + repeat
    offsets = [r[0] - nodrift[0][0] for r in nodrift]
    assert any(abs(o - round(o)) > 0.01 for o in offsets[1:]), offsets  # late starts and 0.3 s runs push it off the grid


# -- the CLI --------------------------------------------------------------------------------------

def run_sql_cli(url: str, *args: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "skiplock", "--db", url, "run-sql", *args],
                            stdout=subprocess.DEVNULL, stderr=log.open("w"), env=ENV, cwd=ROOT)


def stop(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, float]:
    """SIGTERM; the exit code and how long it took to exit."""
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return rc, time.monotonic() - started


def statuses(conn: psycopg.Connection, stage: str) -> dict[str, int]:
    return dict(conn.execute("SELECT status::text, count(*) FROM queue.tasks WHERE stage = %s GROUP BY 1",
                             (stage,)).fetchall())


def test_cli_refuses_a_login_outside_skiplock_sql_or_under_set_role(db: str, roles: Roles) -> None:
    def run(url: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "skiplock", "--db", url, "run-sql", "--stage", "x"],
                              capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=60)

    proc = run(roles.producer_url)
    assert proc.returncode == 1 and f"GRANT skiplock_sql TO {roles.producer}" in proc.stderr, proc.stderr
    as_alice = psycopg.conninfo.make_conninfo(db, options=f"-c role={roles.alice}")  # the superuser, SET ROLE alice
    proc = run(as_alice)
    assert proc.returncode == 1 and "SET ROLE" in proc.stderr and roles.alice in proc.stderr, proc.stderr


def test_cli_drains_tasks_with_3_connections_and_wakes_on_notify(admin: psycopg.Connection,
                                                                 alice: psycopg.Connection, roles: Roles,
                                                                 tmp_path: Path) -> None:
    stage, log = "cli.drain", tmp_path / "run-sql.log"
    ids = [enqueue_sql(alice, f"SELECT {i} AS i", stage=stage) for i in range(30)]
    with psycopg.connect(roles.bob_url, autocommit=True) as bob:
        bobs = enqueue_sql(bob, "SELECT 'bob'", stage=stage)
    # --poll 30: within the test only a NOTIFY can wake an idle executor.
    proc = run_sql_cli(roles.alice_url, "--stage", stage, "--concurrency", "3", "--poll", "30", log=log)
    try:
        wait_for(lambda: statuses(admin, stage) == {"done": 30, "ready": 1}, timeout=90)
        results = admin.execute("SELECT id, result FROM queue.tasks WHERE stage = %s AND status = 'done'",
                                (stage,)).fetchall()
        assert {i: r["rows"] for i, r in results} == {t: [[n]] for n, t in enumerate(ids)}
        workers = admin.execute("SELECT count(DISTINCT worker) FROM queue.history WHERE stage = %s",
                                (stage,)).fetchone()[0]
        assert 1 <= workers <= 3
        time.sleep(1.0)  # idle, on LISTEN
        late = enqueue_sql(alice, "SELECT 'late'", stage=stage)
        took = wait_for(lambda: task(admin, late)[0] == "done", timeout=90, every=0.02)
        assert took < 15.0, took  # a NOTIFY, not the 30 s poll
        assert task(admin, bobs)[0] == "ready"  # bob's task is not alice's executors' to run
    finally:
        rc, stopping = stop(proc)
    out = log.read_text()
    assert rc == 0, out
    assert stopping < 15  # at once, not after the 30 s poll
    assert f"running the SQL tasks that role {roles.alice} enqueued" in out, out
    assert f"stopped: 31 task(s) of role {roles.alice} run" in out, out


def test_cli_survives_unlisten_and_deallocate_in_a_request(admin: psycopg.Connection, alice: psycopg.Connection,
                                                           roles: Roles, tmp_path: Path) -> None:
    # A request runs on the executor's own session: the CLI LISTENs again after each call, and
    # never prepares its CALL (psycopg would after 5 runs, and DEALLOCATE ALL would drop it).
    stage, log = "cli.session", tmp_path / "run-sql.log"
    requests = [*(f"SELECT {i}" for i in range(6)), "DEALLOCATE ALL", "UNLISTEN *", *(f"SELECT {i}" for i in range(3))]
    ids = [enqueue_sql(alice, r, stage=stage, priority=i) for i, r in enumerate(requests)]
    proc = run_sql_cli(roles.alice_url, "--stage", stage, "--poll", "30", log=log)
    try:
        wait_for(lambda: all(task(admin, t)[0] == "done" for t in ids), timeout=90)
        time.sleep(1.0)  # idle, on LISTEN again
        late = enqueue_sql(alice, "SELECT 'late'", stage=stage)
        took = wait_for(lambda: task(admin, late)[0] == "done", timeout=90, every=0.02)
        assert took < 15.0, took  # a NOTIFY, not the 30 s poll
    finally:
        rc, _ = stop(proc)
    assert rc == 0, log.read_text()
    assert "ended in an error" in log.read_text() and "0 call(s) ended in an error" in log.read_text()


def test_cli_sigterm_mid_run_releases_running_tasks_and_loses_none(admin: psycopg.Connection,
                                                                  alice: psycopg.Connection, roles: Roles,
                                                                  tmp_path: Path) -> None:
    stage, n = "cli.stop", 6
    # Each request outlasts the grace by far: a stop that waited for them (or a CLI slowed by a
    # busy machine) would find them done, not handed back.
    ids = [enqueue_sql(alice, "SELECT pg_sleep(10)", stage=stage) for _ in range(n)]
    proc = run_sql_cli(roles.alice_url, "--stage", stage, "--concurrency", "3", "--grace", "1",
                       "--max-tasks-per-call", "10", log=tmp_path / "first.log")
    try:
        wait_for(lambda: statuses(admin, stage).get("running") == 3, timeout=90)
        time.sleep(0.2)
    finally:
        rc, took = stop(proc)
    first = (tmp_path / "first.log").read_text()
    assert rc == 0, first
    # grace 1 s, then one cancel each: every call hands its task back and returns (had it waited for
    # the statements, they would be done, not ready, below; stop() bounds the wait at 60 s)
    print(f"stopped in {took:.1f} s")
    rows = admin.execute("SELECT id, status::text, attempt, error_text FROM queue.tasks WHERE stage = %s",
                         (stage,)).fetchall()
    assert sorted(r[0] for r in rows) == sorted(ids)  # none lost, none duplicated
    assert {r[1] for r in rows} == {"ready"}, rows  # nothing left running, nothing run
    assert all(r[2] == 0 and r[3] is None for r in rows), rows  # attempt not counted
    assert f"stopped: 0 task(s) of role {roles.alice} run, 3 handed back at stop" in first, first
    # Nothing left running: the only session of alice is the test's own.
    wait_for(lambda: admin.execute("SELECT array_agg(pid) FROM pg_stat_activity WHERE usename = %s",
                                   (roles.alice,)).fetchone()[0] == [alice.info.backend_pid], timeout=60)

    proc = run_sql_cli(roles.alice_url, "--stage", stage, "--concurrency", str(n), log=tmp_path / "second.log")
    try:
        wait_for(lambda: statuses(admin, stage) == {"done": n}, timeout=90)
    finally:
        rc, _ = stop(proc)
    assert rc == 0, (tmp_path / "second.log").read_text()
    assert admin.execute("SELECT count(*), count(DISTINCT id), max(attempt) FROM queue.tasks WHERE stage = %s",
                         (stage,)).fetchone() == (n, n, 1)


def test_cli_keeps_serving_the_stage_when_a_call_fails_or_its_connection_drops(
        admin: psycopg.Connection, alice: psycopg.Connection, roles: Roles, tmp_path: Path) -> None:
    stage, log = "cli.resilient", tmp_path / "run-sql.log"
    # Alice may enqueue into the stage but not take from it: every CALL fails (42501 from the claim).
    admin.execute("SELECT queue.grant_stage(%s, %s::regrole, enqueue => true, take => false)", (stage, roles.alice))
    first = [enqueue_sql(alice, f"SELECT {i}", stage=stage) for i in range(3)]
    proc = run_sql_cli(roles.alice_url, "--stage", stage, "--poll", "0.2", log=log)
    try:
        wait_for(lambda: "call failed (42501: permission denied for stage" in log.read_text(), timeout=90)
        assert proc.poll() is None, log.read_text()
        assert [task(admin, t)[0] for t in first] == ["ready"] * 3
        admin.execute("SELECT queue.grant_stage(%s, %s::regrole, enqueue => true, take => true)", (stage, roles.alice))
        wait_for(lambda: all(task(admin, t)[0] == "done" for t in first), timeout=90)
        # Every connection of the CLI dropped (executor and watchdog): it reconnects.
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s AND pid <> %s",
                      (roles.alice, alice.info.backend_pid))
        second = [enqueue_sql(alice, f"SELECT {i}", stage=stage) for i in range(3)]
        wait_for(lambda: all(task(admin, t)[0] == "done" for t in second), timeout=90)
        assert proc.poll() is None, log.read_text()
    finally:
        rc, _ = stop(proc)
    out = log.read_text()
    assert rc == 0, out
    assert f"stopped: 6 task(s) of role {roles.alice} run" in out, out


# -- pg_cron --------------------------------------------------------------------------------------

def test_the_pg_cron_recipe_commands_work_when_run_by_hand_as_the_role(admin: psycopg.Connection,
                                                                       alice: psycopg.Connection,
                                                                       roles: Roles) -> None:
    readme = (ROOT / "docs" / "guide.md").read_text()
    for job in (CRON_RUN, CRON_WATCHDOG):  # the guide's two jobs, run as the enqueuing role
        assert f"$${job}$$, current_database(), 'reporting'" in readme, job
    now = enqueue_sql(alice, "SELECT now() IS NOT NULL AS ok", stage="reports", priority=0)
    slow = enqueue_sql(alice, "SELECT pg_sleep(30)", stage="reports", timeout="1 second", priority=1)
    admin.execute("SELECT queue.configure_stage('reports', max_attempts => 1)")
    # pg_cron's two jobs, by hand, each on a plain connection of alice's login
    with Watchdog(roles.alice_url, every=0.5) as watchdog:
        with psycopg.connect(roles.alice_url, autocommit=True) as executor:
            assert executor.execute(CRON_RUN).fetchone()[0] == 2
    assert sum(watchdog.cancels) == 1
    assert task(admin, now)[:4] == ("done", 1, None, {"columns": [{"name": "ok", "type": "boolean"}],
                                                      "rows": [[True]], "row_count": 1})
    assert task(admin, slow)[0] == "fatal" and task(admin, slow)[2].startswith("57014: ")


# -- attacks (issue 54) -----------------------------------------------------------------------------

# Operators for the type pairs that the executor compares, computes and concatenates outside the
# request (run_sql_tasks commits, so it cannot pin search_path): (operator, left, right, result).
SHADOWED_OPERATORS = [
    ("=", "oid", "regclass", "bool"), ("=", "oid", "int4", "bool"), ("=", "int2", "int4", "bool"),
    (">", "int2", "int4", "bool"), ("=", "text", "text", "bool"), ("<>", "text", "text", "bool"),
    ("<>", "name", "name", "bool"), ("=", "name", "name", "bool"), ("<", "int4", "int4", "bool"),
    ("<>", "int4", "int4", "bool"), ("+", "int4", "int4", "int4"),
    ("<", "timestamptz", "timestamptz", "bool"), (">=", "timestamptz", "timestamptz", "bool"),
    ("+", "timestamptz", "interval", "timestamptz"), ("||", "text", "text", "text"), ("->", "json", "int4", "json"),
]
# Functions, by the names the executor calls (a qualified call never looks at them).
SHADOWED_FUNCTIONS = [("format", "text, text", "text"), ("to_regclass", "text", "regclass"), ("upper", "text", "text"),
                      ("substring", "text, text", "text"), ("nullif", "text, text", "text")]


def test_an_executor_runs_no_operator_or_function_another_role_put_on_its_search_path(
        admin: psycopg.Connection, alice: psycopg.Connection, roles: Roles, tmp_path: Path) -> None:
    # Issue 54, item 1: run_sql_tasks compared attrelid = to_regclass(…) (oid = regclass) and
    # classid = 1936419948 (oid = int4); pg_catalog has no exact operator for these, so bob's, in
    # public (CREATE on it: PostgreSQL 14's default), won and ran with the executor's rights. Bob
    # shadows every operator the executor uses, for the exact types, and logs each call; alice's
    # executor runs every branch (a query, a bare statement, a nameless column, an error with a
    # detail, a cancel) with public first on its path. Not one call of bob's may run.
    stage = "sec.shadow"
    admin.execute("SELECT queue.configure_stage(%s, max_attempts => 1)", (stage,))
    admin.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(roles.bob)))
    log = f"sqlt_shadow_log_{uuid.uuid4().hex[:6]}"
    made: list[str] = []
    with psycopg.connect(roles.bob_url, autocommit=True) as bob:
        bob.execute(sql.SQL("CREATE TABLE public.{} (who text, what text)").format(sql.Identifier(log)))
        bob.execute(sql.SQL("GRANT INSERT ON public.{} TO PUBLIC").format(sql.Identifier(log)))
        for n, (op, left, right, result) in enumerate(SHADOWED_OPERATORS):
            fn = f"sqlt_shadow_op_{n}"
            bob.execute(sql.SQL(
                "CREATE FUNCTION public.{fn}(a {l}, b {r}) RETURNS {res} LANGUAGE sql AS $f$ "
                "INSERT INTO public.{log} VALUES (current_user, {what}); "
                "SELECT a::pg_catalog.{l2} OPERATOR(pg_catalog.{op}) b::pg_catalog.{r2} $f$").format(
                    fn=sql.Identifier(fn), l=sql.SQL(left), r=sql.SQL(right), res=sql.SQL(result),
                    log=sql.Identifier(log), what=sql.Literal(f"{left} {op} {right}"), op=sql.SQL(op),
                    l2=sql.SQL(left), r2=sql.SQL("oid" if left == "oid" else right)))
            bob.execute(sql.SQL("CREATE OPERATOR public.{op} (LEFTARG = {l}, RIGHTARG = {r}, FUNCTION = public.{fn})")
                        .format(op=sql.SQL(op), l=sql.SQL(left), r=sql.SQL(right), fn=sql.Identifier(fn)))
            made.append(f"{left} {op} {right}")
        for name, args, result in SHADOWED_FUNCTIONS:
            bob.execute(sql.SQL("CREATE FUNCTION public.{fn}({args}) RETURNS {res} LANGUAGE sql AS $f$ "
                                "INSERT INTO public.{log} VALUES (current_user, {what}); SELECT NULL::{res} $f$").format(
                fn=sql.Identifier(name), args=sql.SQL(args), res=sql.SQL(result), log=sql.Identifier(log),
                what=sql.Literal(name)))
    try:
        # The control: on this path, an unqualified comparison of alice's runs bob's operator.
        with psycopg.connect(roles.alice_url, autocommit=True, options="-c search_path=public,pg_catalog") as ex:
            ex.execute("SELECT a.attnum FROM pg_catalog.pg_attribute a WHERE a.attrelid = 'pg_class'::regclass")
            assert admin.execute(sql.SQL("SELECT count(*) FROM public.{}").format(sql.Identifier(log))).fetchone()[0] > 0
            admin.execute(sql.SQL("TRUNCATE public.{}").format(sql.Identifier(log)))
            tasks = [enqueue_sql(alice, request, stage=stage, priority=p) for p, request in enumerate([
                "SELECT 1 AS one, 'x'::text AS two",               # a query: its columns from pg_attribute
                "SELECT 1, 2",                                     # nameless columns: json -> 0
                "DO $$BEGIN PERFORM 1; END$$",                     # not a query: the command and row count
                "SELECT 1/0",                                      # an error
                "CREATE TABLE pg_temp.x (a int CHECK (a > 0)); INSERT INTO pg_temp.x VALUES (-1)",  # with a detail
                "SELECT pg_catalog.pg_cancel_backend(pg_catalog.pg_backend_pid()), pg_catalog.pg_sleep(0.5)",  # a cancel
            ])]
            assert call(ex, stage, 10) == len(tasks)
        assert [task(admin, t)[0] for t in tasks] == ["done", "done", "done", "fatal", "fatal", "fatal"]
        # `skiplock run-sql` on the same path: its start-up checks, LISTEN, CALL and watchdog.
        by_cli = enqueue_sql(alice, "SELECT 'cli' AS via", stage=stage)
        proc = run_sql_cli(psycopg.conninfo.make_conninfo(roles.alice_url, options="-c search_path=public,pg_catalog"),
                           "--stage", stage, "--poll", "1", log=tmp_path / "run-sql.log")
        try:
            wait_for(lambda: task(admin, by_cli)[0] == "done" or proc.poll() is not None, timeout=90)
        finally:
            rc, _ = stop(proc)
        assert (rc, task(admin, by_cli)[0]) == (0, "done"), (tmp_path / "run-sql.log").read_text()
        ran = admin.execute(sql.SQL("SELECT who, what FROM public.{}").format(sql.Identifier(log))).fetchall()
        assert ran == [], ran
    finally:
        admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(roles.bob)))
        admin.execute(sql.SQL("REVOKE CREATE ON SCHEMA public FROM {}").format(sql.Identifier(roles.bob)))


def advisory_locks(conn: psycopg.Connection, pid: int) -> list[tuple]:
    return conn.execute("SELECT classid::int8, objid::int8, objsubid::int4 FROM pg_catalog.pg_locks "
                        "WHERE locktype = 'advisory' AND pid = %s", (pid,)).fetchall()


def test_a_refused_stop_sql_executor_leaves_no_advisory_lock_behind(admin: psycopg.Connection,
                                                                     alice: psycopg.Connection, roles: Roles) -> None:
    # Issue 54, item 6: stop_sql_executor took the session's advisory lock, then pg_cancel_backend
    # refused another role's backend (42501): the lock stayed with alice's session, as it did for
    # a pid that is no backend. A refused call changes nothing.
    with psycopg.connect(roles.bob_url, autocommit=True) as bob:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            alice.execute("SELECT queue.stop_sql_executor(%s)", (bob.info.backend_pid,))
        assert advisory_locks(admin, alice.info.backend_pid) == []
        dead = admin.execute("SELECT max(pid) + 100000 FROM pg_catalog.pg_stat_activity").fetchone()[0]
        assert alice.execute("SELECT queue.stop_sql_executor(%s)", (dead,)).fetchone()[0] is False
        assert advisory_locks(admin, alice.info.backend_pid) == []
        # A lock alice held before the refused call is still hers (the call gave back only its own).
        alice.execute("SELECT pg_advisory_lock(1936419948, %s)", (bob.info.backend_pid,))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            alice.execute("SELECT queue.stop_sql_executor(%s)", (bob.info.backend_pid,))
        assert advisory_locks(admin, alice.info.backend_pid) == [(1936419948, bob.info.backend_pid, 2)]
        alice.execute("SELECT pg_advisory_unlock(1936419948, %s)", (bob.info.backend_pid,))


def test_enqueue_sql_never_adopts_a_task_a_producer_put_under_its_key_meanwhile(admin: psycopg.Connection,
                                                                               alice: psycopg.Connection,
                                                                               roles: Roles) -> None:
    # Issue 54, item 3: a producer enqueued an ordinary task whose payload was what enqueue_sql
    # would build (it was predictable) under the key, with repeat => 1 second, and committed while
    # alice's enqueue_sql(…, key => K) waited on it: enqueue_sql adopted the row, and the one-off
    # request ran every second as alice. Now the payload carries a random nonce: the producer's
    # row, whatever it holds, is never alice's.
    stage, request = "sec.takeover", "SELECT 'one-off'"
    predicted = '{"sql": "SELECT \'one-off\'", "timeout": null, "keep_history": true}'
    with psycopg.connect(roles.producer_url, autocommit=True) as producer:
        producer.execute("BEGIN")
        planted = producer.execute("SELECT queue.enqueue(%s::jsonb, %s, key => 'K', repeat => interval '1 second')",
                                   (predicted, stage)).fetchone()[0]
        outcome: dict[str, object] = {}

        def alice_enqueues() -> None:
            with psycopg.connect(roles.alice_url, autocommit=True) as c:
                outcome["pid"] = c.info.backend_pid
                try:
                    outcome["id"] = enqueue_sql(c, request, stage=stage, key="K")
                except psycopg.Error as e:
                    outcome["error"] = e

        waiter = threading.Thread(target=alice_enqueues, daemon=True)
        waiter.start()
        # alice's enqueue_sql waits on the producer's uncommitted row (its key's index entry).
        wait_for(lambda: "pid" in outcome and admin.execute(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (outcome["pid"],)).fetchone()[0]
            or not waiter.is_alive(), timeout=90)
        producer.execute("COMMIT")
        waiter.join(90)
        assert not waiter.is_alive()
    assert isinstance(outcome.get("error"), psycopg.errors.InsufficientPrivilege), outcome
    assert admin.execute("SELECT run_as::text, repeat FROM queue.live_tasks WHERE id = %s",
                         (planted,)).fetchone() == (None, datetime.timedelta(seconds=1)), \
        "the producer's task stays an ordinary task"
    assert call(alice, stage) == 0, "alice's executor has nothing of hers to run"


def test_a_request_that_catches_the_cancel_cannot_outlive_its_timeout(admin: psycopg.Connection,
                                                                      alice: psycopg.Connection, roles: Roles) -> None:
    # Issue 54, item 5: a request catching query_canceled in a DO block ignored every cancel and
    # ran on, recorded done. Now the watchdog terminates its executor's session 5 s after a cancel
    # it ignored (rolling the request back) and records the attempt as timed out.
    stage = "sec.timeout"
    admin.execute("SELECT queue.configure_stage(%s, max_attempts => 1)", (stage,))
    stubborn = enqueue_sql(alice, "DO $$BEGIN LOOP BEGIN PERFORM pg_catalog.pg_sleep(0.2); "
                                  "EXCEPTION WHEN query_canceled THEN NULL; END; END LOOP; END$$",
                           stage=stage, timeout="1 second")
    executor = BackgroundCall(roles.alice_url, stage, 10)
    started = time.monotonic()
    with Watchdog(roles.alice_url) as watchdog:
        executor.start()
        with pytest.raises(psycopg.OperationalError):  # its session was terminated
            executor.result(timeout=120)
        took = time.monotonic() - started
        wait_for(lambda: task(admin, stubborn)[0] != "running", timeout=90)
    assert took < 60, took  # the timeout and the grace, not for ever
    status, attempt, error, result, _ = task(admin, stubborn)
    assert (status, attempt, result) == ("fatal", 1, None)
    assert error.startswith("57014: canceling statement due to user request (timeout 00:00:01)"), error
    assert "terminated" in error, error
    assert sum(watchdog.cancels) >= 2, watchdog.cancels  # a cancel, then the terminate
