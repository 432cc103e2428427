"""SQL tasks (issue 5): CALL queue.run_sql_tasks against a real server, and `skiplock run-sql`.

run_sql_tasks commits after each task, so it cannot run inside a pgTAP transaction: this module
drives it (tests/sql/150_sql_tasks.sql covers enqueue_sql's arguments and states). Every test
uses its own stage; roles are cluster-wide, so they get names unique to this run and are dropped
at the end.
"""

from __future__ import annotations

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

# The pg_cron recipe (README, "Running SQL tasks (pg_task style)"): an executor job and a watchdog job.
CRON_RUN = "CALL queue.run_sql_tasks('reports', 100)"
CRON_WATCHDOG = "SELECT queue.cancel_overdue_sql_tasks()"
CRON_SCHEDULE_RUN = f"SELECT cron.schedule('skiplock-sql-reports', '10 seconds', $${CRON_RUN}$$)"
CRON_SCHEDULE_WATCHDOG = f"SELECT cron.schedule('skiplock-sql-watchdog', '5 seconds', $${CRON_WATCHDOG}$$)"


@dataclass
class Roles:
    admin: str        # the superuser of the db URL
    alice: str        # member of skiplock_sql: enqueues SQL tasks
    producer: str     # member of skiplock_producer only
    executor: str     # login in skiplock_sql_executor, granted alice (so it can SET ROLE alice)
    alice_url: str
    producer_url: str
    executor_url: str


@pytest.fixture(scope="module")
def roles(db: str) -> Iterator[Roles]:
    suffix = uuid.uuid4().hex[:8]
    alice, producer, executor = (f"sqlt_{who}_{suffix}" for who in ("alice", "producer", "executor"))
    with psycopg.connect(db, autocommit=True) as c:
        admin = c.execute("SELECT session_user::text").fetchone()[0]
        c.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE skiplock_sql").format(sql.Identifier(alice)))
        c.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE skiplock_producer").format(sql.Identifier(producer)))
        c.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE skiplock_sql_executor").format(sql.Identifier(executor)))
        c.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(alice), sql.Identifier(executor)))
    url = lambda user: psycopg.conninfo.make_conninfo(db, user=user)  # noqa: E731
    try:
        yield Roles(admin, alice, producer, executor, url(alice), url(producer), url(executor))
    finally:
        with psycopg.connect(db, autocommit=True) as c:
            for role in (executor, producer, alice):
                c.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                c.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.fixture
def admin(db: str) -> Iterator[psycopg.Connection]:
    """A superuser connection: setup, checks, and an executor (a superuser may SET ROLE to anyone)."""
    with psycopg.connect(db, autocommit=True) as c:
        yield c


@pytest.fixture
def alice(roles: Roles) -> Iterator[psycopg.Connection]:
    with psycopg.connect(roles.alice_url, autocommit=True) as c:
        yield c


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


def wait_for(predicate, timeout: float = 20.0, every: float = 0.05) -> float:
    """Seconds it took until predicate() held; AssertionError after timeout."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError("timed out waiting")
        time.sleep(every)
    return time.monotonic() - start


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


def watchdog_until_first_cancel(url: str, stop: threading.Event, every: float = 0.2,
                                command: str = "SELECT queue.cancel_overdue_sql_tasks()") -> list[int]:
    """Run in a thread: the watchdog, until it has cancelled one statement (or stop). Stopping after
    the first cancel keeps a second signal from reaching the executor while it records the first
    (see the report on run_sql_tasks' late-cancel window)."""
    counts: list[int] = []
    with psycopg.connect(url, autocommit=True) as c:
        while not stop.is_set() and sum(counts) == 0:
            counts.append(c.execute(command).fetchone()[0])
            stop.wait(every)
    return counts


# -- results --------------------------------------------------------------------------------------

def test_a_query_keeps_column_names_types_and_rows_in_order(admin: psycopg.Connection, alice: psycopg.Connection,
                                                            roles: Roles) -> None:
    request = ("SELECT g AS n, 'row ' || g AS label, g * 1.5 AS half, g % 2 = 0 AS even, NULL::date AS day "
               "FROM generate_series(3, 1, -1) g")
    t = enqueue_sql(alice, request, stage="res.query")
    assert call(admin, "res.query") == 1
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
    assert call(admin, "res.command") == 3
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
    assert call(admin, "res.nohistory") == 3
    assert admin.execute("SELECT count(*) FROM queue.tasks WHERE id = %s", (ok,)).fetchone()[0] == 0
    assert task(admin, bad)[:3] == ("fatal", 1, "22012: division by zero")  # a failure is still kept
    assert task(admin, kept)[0] == "done"


# -- errors ---------------------------------------------------------------------------------------

def test_division_by_zero_is_recorded_with_its_sqlstate_and_retried_or_fatal_by_the_stage(
        admin: psycopg.Connection, alice: psycopg.Connection) -> None:
    retried = enqueue_sql(alice, "SELECT 1/0", stage="err.retry")
    admin.execute("SELECT queue.configure_stage('err.fatal', max_attempts => 1)")
    fatal = enqueue_sql(alice, "SELECT 1/0", stage="err.fatal")
    assert call(admin, "err.retry") == 1 and call(admin, "err.fatal") == 1
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
    assert call(admin, "err.next", 10) == 4  # one call: each failure recorded, the call went on
    assert task(admin, div)[:3] == ("fatal", 1, "22012: division by zero")
    assert task(admin, missing)[2].startswith("42P01: relation \"sqlt_no_such_table\" does not exist")
    assert task(admin, syntax)[2].startswith("42601: ")
    assert task(admin, fine)[:4] == ("done", 1, None, {"columns": [{"name": "ok", "type": "text"}],
                                                       "rows": [["fine"]], "row_count": 1})


def test_settings_temp_tables_and_locks_of_a_request_do_not_leak_into_the_next_task(
        admin: psycopg.Connection, alice: psycopg.Connection, db: str, roles: Roles) -> None:
    stage = "err.leak"
    before = admin.execute("SELECT current_setting('work_mem'), current_setting('search_path')").fetchone()
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
    assert call(admin, stage, 10) == len(requests) + 1
    assert [task(admin, t)[:3] for t in setters] == [("done", 1, None)] * len(requests)
    status, _, _, result, _ = task(admin, probe)
    assert status == "done"
    assert result["rows"] == [['"$user", public', before[0], "", True, roles.alice]]
    # nor into the executor's own session
    assert admin.execute("SELECT current_setting('work_mem'), current_setting('search_path')").fetchone() == before
    assert admin.execute("SELECT current_user::text, to_regclass('pg_temp.sqlt_leak')").fetchone() == (roles.admin, None)
    with psycopg.connect(db, autocommit=True) as other:  # the advisory lock was let go
        assert other.execute("SELECT pg_try_advisory_lock(424242)").fetchone()[0] is True
        other.execute("SELECT pg_advisory_unlock(424242)")


# -- timeout --------------------------------------------------------------------------------------

def test_the_watchdog_cancels_a_statement_past_its_timeout_as_57014_and_the_next_task_runs(
        admin: psycopg.Connection, alice: psycopg.Connection, db: str) -> None:
    stage = "timeout"
    admin.execute("SELECT queue.configure_stage(%s, max_attempts => 1)", (stage,))
    slow = enqueue_sql(alice, "SELECT pg_sleep(30)", stage=stage, timeout="1 second", priority=0)
    after = enqueue_sql(alice, "SELECT 'after' AS next", stage=stage, priority=1)
    stop = threading.Event()
    cancels: list[int] = []
    watchdog = threading.Thread(target=lambda: cancels.extend(watchdog_until_first_cancel(db, stop)), daemon=True)
    watchdog.start()
    started = time.monotonic()
    try:
        ran = call(admin, stage, 10)
    finally:
        took = time.monotonic() - started
        stop.set()
        watchdog.join(timeout=10)
    assert ran == 2
    assert 0.9 < took < 5, took
    assert sum(cancels) == 1
    status, attempt, error, result, _ = task(admin, slow)
    assert (status, attempt, result) == ("fatal", 1, None)
    assert error.startswith("57014: ") and error.endswith("(timeout 00:00:01)"), error
    assert task(admin, after)[:4] == ("done", 1, None, {"columns": [{"name": "next", "type": "text"}],
                                                        "rows": [["after"]], "row_count": 1})


# -- security -------------------------------------------------------------------------------------

def test_a_role_cannot_read_through_a_task_a_table_it_cannot_read_directly(
        admin: psycopg.Connection, alice: psycopg.Connection, roles: Roles) -> None:
    stage = "sec.read"
    admin.execute("SELECT queue.configure_stage(%s, max_attempts => 1)", (stage,))
    admin.execute("CREATE TABLE public.sqlt_secret (s text)")
    admin.execute("INSERT INTO public.sqlt_secret VALUES ('top secret')")
    admin.execute("REVOKE ALL ON public.sqlt_secret FROM PUBLIC")
    admin.execute(sql.SQL("GRANT SELECT ON public.sqlt_secret TO {}").format(sql.Identifier(roles.executor)))
    # Directly: alice cannot; both executors (the superuser, and the login granted alice) can.
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        alice.execute("SELECT s FROM public.sqlt_secret")
    assert admin.execute("SELECT s FROM public.sqlt_secret").fetchall() == [("top secret",)]
    with psycopg.connect(roles.executor_url, autocommit=True) as executor:
        assert executor.execute("SELECT s FROM public.sqlt_secret").fetchall() == [("top secret",)]
        # Through a task, run by either executor: refused, and nothing of the table recorded.
        by_login = enqueue_sql(alice, "SELECT s FROM public.sqlt_secret", stage=stage)
        assert call(executor, stage) == 1
    by_superuser = enqueue_sql(alice, "SELECT s FROM public.sqlt_secret", stage=stage)
    assert call(admin, stage) == 1
    for t in (by_login, by_superuser):
        status, _, error, result, run_as = task(admin, t)
        assert (status, result, run_as) == ("fatal", None, roles.alice)
        assert error.startswith("42501: permission denied for table sqlt_secret"), error
    assert admin.execute("SELECT count(*) FROM queue.tasks WHERE stage = %s AND (result::text LIKE '%%top secret%%' "
                         "OR error_text LIKE '%%top secret%%')", (stage,)).fetchone()[0] == 0
    # The control: once alice may read it, the same task reads it.
    admin.execute(sql.SQL("GRANT SELECT ON public.sqlt_secret TO {}").format(sql.Identifier(roles.alice)))
    granted = enqueue_sql(alice, "SELECT s FROM public.sqlt_secret", stage=stage)
    assert call(admin, stage) == 1
    assert task(admin, granted)[3]["rows"] == [["top secret"]]


@pytest.mark.parametrize("request_", [
    "RESET ROLE",
    "SET ROLE NONE",
    "SET ROLE {admin}",
    "SELECT set_config('role', '{admin}', false)",
    "SET SESSION AUTHORIZATION DEFAULT",
    "SELECT set_config('session_authorization', '{admin}', false)",
])
def test_a_request_cannot_take_the_executors_role(request_: str, admin: psycopg.Connection,
                                                  alice: psycopg.Connection, roles: Roles) -> None:
    stage = "sec.escalate"
    admin.execute("SELECT queue.configure_stage(%s, max_attempts => 1)", (stage,))
    t = enqueue_sql(alice, request_.format(admin=roles.admin), stage=stage, priority=0)
    whoami = enqueue_sql(alice, "SELECT current_user, session_user", stage=stage, priority=1)
    assert call(admin, stage) == 2
    status, _, error, result, _ = task(admin, t)
    assert (status, result) == ("fatal", None)
    assert error.startswith("42501: "), error
    assert task(admin, whoami)[3]["rows"] == [[roles.alice, roles.admin]]


def test_the_request_runs_as_the_enqueuing_role_under_a_non_superuser_executor(
        admin: psycopg.Connection, alice: psycopg.Connection, roles: Roles) -> None:
    t = enqueue_sql(alice, "SELECT current_user, session_user", stage="sec.whoami")
    with psycopg.connect(roles.executor_url, autocommit=True) as executor:
        assert call(executor, "sec.whoami") == 1
        assert executor.execute("SELECT current_user::text").fetchone()[0] == roles.executor
    assert task(admin, t)[3]["rows"] == [[roles.alice, roles.executor]]


def test_only_members_of_skiplock_sql_may_enqueue_sql_tasks(admin: psycopg.Connection, roles: Roles) -> None:
    with psycopg.connect(roles.producer_url, autocommit=True) as producer:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            enqueue_sql(producer, "SELECT 1", stage="sec.enqueue")
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


# -- max running ----------------------------------------------------------------------------------

def test_max_2_never_runs_more_than_2_tasks_of_the_stage_at_once(admin: psycopg.Connection,
                                                                 alice: psycopg.Connection, db: str,
                                                                 roles: Roles) -> None:
    stage, n = "cap", 8
    admin.execute("CREATE TABLE public.sqlt_cap_log (started timestamptz, ended timestamptz)")
    admin.execute(sql.SQL("GRANT INSERT ON public.sqlt_cap_log TO {}").format(sql.Identifier(roles.alice)))
    request = ("DO $$DECLARE s timestamptz := clock_timestamp(); BEGIN PERFORM pg_sleep(0.5); "
               "INSERT INTO public.sqlt_cap_log VALUES (s, clock_timestamp()); END$$")
    ids = [enqueue_sql(alice, request, stage=stage, max=2) for _ in range(n)]
    done = lambda: admin.execute("SELECT count(*) FROM queue.history WHERE stage = %s AND status = 'done'",  # noqa: E731
                                 (stage,)).fetchone()[0] == n
    with Executors(db, stage, n=4):
        took = wait_for(done, timeout=20)
    assert took >= 1.9  # 8 runs of 0.5 s, 2 at a time
    intervals = admin.execute("SELECT started, ended FROM public.sqlt_cap_log").fetchall()
    assert len(intervals) == n and [task(admin, t)[0] for t in ids] == ["done"] * n
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    assert most == 2


# -- repeat ---------------------------------------------------------------------------------------

def test_repeat_with_drift_stays_on_the_grid_and_without_drift_plans_from_the_run(
        admin: psycopg.Connection, alice: psycopg.Connection, db: str) -> None:
    # Each run takes 0.3 s and the executors look only every 0.2 s, so runs start late.
    grid = enqueue_sql(alice, "SELECT pg_sleep(0.3)", stage="repeat.drift", repeat="1 second", drift=True)
    after = enqueue_sql(alice, "SELECT pg_sleep(0.3)", stage="repeat.nodrift", repeat="1 second", drift=False)
    with Executors(db, "repeat.drift", idle=0.2), Executors(db, "repeat.nodrift", idle=0.2):
        time.sleep(4.6)
    admin.execute("SELECT queue.cancel(%s), queue.cancel(%s)", (grid, after))

    def runs(t: int) -> list[tuple[float, float, float]]:
        rows = admin.execute("SELECT extract(epoch FROM run_at)::float8, extract(epoch FROM started)::float8, "
                             "       extract(epoch FROM finished)::float8 "
                             "  FROM queue.history WHERE id = %s AND status = 'done' ORDER BY finished", (t,)).fetchall()
        return rows

    drift = runs(grid)
    assert len(drift) >= 3, drift
    offsets = [r[0] - drift[0][0] for r in drift]
    assert all(abs(o - round(o)) < 0.001 for o in offsets), offsets  # planned from the slot: on the 1 s grid
    assert [round(o) for o in offsets] == sorted(set(round(o) for o in offsets))
    assert all(started - run_at < 0.6 for run_at, started, _ in drift)

    nodrift = runs(after)
    assert len(nodrift) >= 3, nodrift
    gaps = [nodrift[i + 1][0] - nodrift[i][2] for i in range(len(nodrift) - 1)]
    assert all(abs(g - 1.0) < 0.05 for g in gaps), gaps  # the next run_at is the recorded finish + repeat
    offsets = [r[0] - nodrift[0][0] for r in nodrift]
    assert any(abs(o - round(o)) > 0.01 for o in offsets[1:]), offsets  # late starts push it off the grid


# -- the CLI --------------------------------------------------------------------------------------

def run_sql_cli(url: str, *args: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "skiplock", "--db", url, "run-sql", *args],
                            stdout=subprocess.DEVNULL, stderr=log.open("w"), env=ENV, cwd=ROOT)


def stop(proc: subprocess.Popen, timeout: float = 10) -> tuple[int, float]:
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


def test_cli_refuses_a_login_that_may_not_run_sql_tasks(roles: Roles) -> None:
    proc = subprocess.run([sys.executable, "-m", "skiplock", "--db", roles.alice_url, "run-sql", "--stage", "x"],
                          capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=60)
    assert proc.returncode == 1 and "skiplock_sql_executor" in proc.stderr, proc.stderr


def test_cli_drains_tasks_with_3_connections_and_wakes_on_notify(admin: psycopg.Connection,
                                                                 alice: psycopg.Connection, roles: Roles,
                                                                 tmp_path: Path) -> None:
    stage, log = "cli.drain", tmp_path / "run-sql.log"
    ids = [enqueue_sql(alice, f"SELECT {i} AS i", stage=stage) for i in range(30)]
    # --poll 30: within the test only a NOTIFY can wake an idle executor.
    proc = run_sql_cli(roles.executor_url, "--stage", stage, "--concurrency", "3", "--poll", "30", log=log)
    try:
        wait_for(lambda: statuses(admin, stage) == {"done": 30}, timeout=30)
        results = admin.execute("SELECT id, result FROM queue.tasks WHERE stage = %s", (stage,)).fetchall()
        assert {i: r["rows"] for i, r in results} == {t: [[n]] for n, t in enumerate(ids)}
        workers = admin.execute("SELECT count(DISTINCT worker) FROM queue.history WHERE stage = %s",
                                (stage,)).fetchone()[0]
        assert 1 <= workers <= 3
        time.sleep(1.0)  # idle, on LISTEN
        late = enqueue_sql(alice, "SELECT 'late'", stage=stage)
        took = wait_for(lambda: task(admin, late)[0] == "done", timeout=10, every=0.02)
        assert took < 1.0, took
    finally:
        rc, stopping = stop(proc)
    assert rc == 0, log.read_text()
    assert stopping < 3
    out = log.read_text()
    assert "stopped: 31 task(s) run" in out, out


def test_cli_sigterm_mid_run_releases_running_tasks_and_loses_none(admin: psycopg.Connection,
                                                                  alice: psycopg.Connection, roles: Roles,
                                                                  tmp_path: Path) -> None:
    stage, n = "cli.stop", 6
    ids = [enqueue_sql(alice, "SELECT pg_sleep(3)", stage=stage) for _ in range(n)]
    proc = run_sql_cli(roles.executor_url, "--stage", stage, "--concurrency", "3", "--grace", "1",
                       log=tmp_path / "first.log")
    try:
        wait_for(lambda: statuses(admin, stage).get("running") == 3, timeout=15)
        time.sleep(0.2)
    finally:
        rc, took = stop(proc)
    assert rc == 0, (tmp_path / "first.log").read_text()
    assert took < 4, took  # grace 1 s, then the calls are cancelled
    rows = admin.execute("SELECT id, status::text, attempt, error_text FROM queue.tasks WHERE stage = %s",
                         (stage,)).fetchall()
    assert sorted(r[0] for r in rows) == sorted(ids)  # none lost, none duplicated
    assert {r[1] for r in rows} <= {"done", "ready"}, rows  # nothing left running
    released = [r for r in rows if r[1] == "ready"]
    assert len(released) >= 3 and all(r[2] == 0 and r[3] is None for r in released), rows  # attempt not counted
    assert "stopped: 0 task(s) run, 3 handed back at stop" in (tmp_path / "first.log").read_text()

    proc = run_sql_cli(roles.executor_url, "--stage", stage, "--concurrency", str(n), log=tmp_path / "second.log")
    try:
        wait_for(lambda: statuses(admin, stage) == {"done": n}, timeout=20)
    finally:
        rc, _ = stop(proc)
    assert rc == 0, (tmp_path / "second.log").read_text()
    assert admin.execute("SELECT count(*), count(DISTINCT id), max(attempt) FROM queue.tasks WHERE stage = %s",
                         (stage,)).fetchone() == (n, n, 1)


def test_cli_keeps_serving_the_stage_when_a_call_fails(admin: psycopg.Connection, alice: psycopg.Connection,
                                                       roles: Roles, tmp_path: Path) -> None:
    stage, log = "cli.resilient", tmp_path / "run-sql.log"
    # A temp table with a deferred trigger event still pending: run_sql_tasks' DISCARD TEMP after
    # the request fails, and with it the whole CALL (reported as a bug of run_sql_tasks).
    trap = ("DO $$BEGIN CREATE TEMP TABLE sqlt_trap (a int); "
            "CREATE FUNCTION pg_temp.sqlt_noop() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END'; "
            "CREATE CONSTRAINT TRIGGER sqlt_trap AFTER INSERT ON pg_temp.sqlt_trap DEFERRABLE INITIALLY DEFERRED "
            "FOR EACH ROW EXECUTE FUNCTION pg_temp.sqlt_noop(); INSERT INTO pg_temp.sqlt_trap VALUES (1); END$$")
    enqueue_sql(alice, trap, stage=stage, priority=0)
    fine = [enqueue_sql(alice, f"SELECT {i}", stage=stage, priority=1) for i in range(3)]
    proc = run_sql_cli(roles.executor_url, "--stage", stage, "--poll", "0.2", log=log)
    try:
        wait_for(lambda: all(task(admin, t)[0] == "done" for t in fine), timeout=15)
        assert proc.poll() is None, log.read_text()
    finally:
        rc, _ = stop(proc)
    assert rc == 0, log.read_text()


# -- pg_cron --------------------------------------------------------------------------------------

def test_the_pg_cron_recipe_commands_work_when_run_by_hand(admin: psycopg.Connection, alice: psycopg.Connection,
                                                           roles: Roles) -> None:
    assert f"$${CRON_RUN}$$" in CRON_SCHEDULE_RUN and f"$${CRON_WATCHDOG}$$" in CRON_SCHEDULE_WATCHDOG
    now = enqueue_sql(alice, "SELECT now() IS NOT NULL AS ok", stage="reports", priority=0)
    slow = enqueue_sql(alice, "SELECT pg_sleep(30)", stage="reports", timeout="1 second", priority=1)
    admin.execute("SELECT queue.configure_stage('reports', max_attempts => 1)")
    stop_ = threading.Event()
    cancels: list[int] = []
    # pg_cron's two jobs, by hand, each on a plain connection of the executor's login
    watchdog = threading.Thread(target=lambda: cancels.extend(
        watchdog_until_first_cancel(roles.executor_url, stop_, every=0.5, command=CRON_WATCHDOG)), daemon=True)
    watchdog.start()
    try:
        with psycopg.connect(roles.executor_url, autocommit=True) as executor:
            assert executor.execute(CRON_RUN).fetchone()[0] == 2
    finally:
        stop_.set()
        watchdog.join(timeout=10)
    assert sum(cancels) == 1
    assert task(admin, now)[:4] == ("done", 1, None, {"columns": [{"name": "ok", "type": "boolean"}],
                                                      "rows": [[True]], "row_count": 1})
    assert task(admin, slow)[0] == "fatal" and task(admin, slow)[2].startswith("57014: ")
