"""The operator's verbs (`skiplock task`, `retry`, `cancel`, `priority`, `pause`, `resume`,
`schedules`) and the paused stages in `stats` and `top`, run as a user runs them: subprocesses
against a real database, as an admin login and as a monitor login."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Iterator

import psycopg
import pytest

from skiplock.sqlfiles import ROOT

ENV = dict(os.environ, COLUMNS="200")
ENV.pop("DATABASE_URL", None)


@pytest.fixture(scope="module")
def logins(db: str) -> Iterator[dict[str, str]]:
    names = {"admin": f"ops_admin_{os.getpid()}", "monitor": f"ops_monitor_{os.getpid()}"}
    with psycopg.connect(db, autocommit=True) as c:
        c.execute(f"CREATE ROLE {names['admin']} LOGIN IN ROLE skiplock_admin")
        c.execute(f"CREATE ROLE {names['monitor']} LOGIN IN ROLE skiplock_monitor")
    try:
        yield {k: psycopg.conninfo.make_conninfo(db, user=v) for k, v in names.items()}
    finally:
        with psycopg.connect(db, autocommit=True) as c:
            for name in names.values():
                c.execute(f"DROP ROLE {name}")


def run(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skiplock", "--db", url, *args], capture_output=True, text=True,
                          timeout=120, env=ENV, cwd=ROOT)


def enqueue(conn: psycopg.Connection, stage: str, n: int) -> list[int]:
    return [r[0] for r in conn.execute("SELECT queue.enqueue_batch(%s::jsonb[], %s)",
                                       ([json.dumps({"n": i}) for i in range(n)], stage))]


def fail(conn: psycopg.Connection, stage: str, error: str, fatal: bool = True) -> int:
    row = conn.execute("SELECT t.id FROM queue.take_next(%s) t, queue.fail(t.id, t.lease, %s, fatal => %s) f",
                       (stage, error, fatal)).fetchone()
    assert row is not None
    return int(row[0])


def statuses(conn: psycopg.Connection, ids: list[int], stage: str) -> list[str]:
    return [conn.execute("SELECT status::text FROM queue.tasks WHERE id = %s AND stage = %s"
                         " ORDER BY finished DESC NULLS FIRST LIMIT 1", (i, stage)).fetchone()[0] for i in ids]


def test_task_shows_its_runs_error_and_payload(logins: dict[str, str], conn: psycopg.Connection) -> None:
    enqueue(conn, "ops.show", 1)
    task_id = fail(conn, "ops.show", "KeyError: 'width'")
    proc = run(logins["monitor"], "task", str(task_id))
    assert proc.returncode == 0, proc.stderr
    assert "KeyError: 'width'" in proc.stdout and "fatal" in proc.stdout and 'payload: {"n": 0}' in proc.stdout
    proc = run(logins["monitor"], "task", "999999999")
    assert proc.returncode == 1 and "no task 999999999" in proc.stdout


def test_retry_by_error_text_and_status_retries_only_the_matching_tasks(logins: dict[str, str], conn: psycopg.Connection) -> None:
    enqueue(conn, "ops.retry", 5)
    s3 = [fail(conn, "ops.retry", "S3 timeout after 30 s") for _ in range(2)]
    soft = fail(conn, "ops.retry", "S3 timeout after 30 s", fatal=False)   # error: waiting for its retry
    other = fail(conn, "ops.retry", "bad input")
    proc = run(logins["admin"], "retry", "--stage", "ops.retry", "--error", "S3 timeout", "--status", "fatal")
    assert proc.returncode == 0 and "retried 2" in proc.stdout, proc.stderr
    assert statuses(conn, s3 + [soft, other], "ops.retry") == ["ready", "ready", "error", "fatal"]
    proc = run(logins["admin"], "retry", "--stage", "ops.retry", "--error", "S3 timeout")
    assert "retried 1" in proc.stdout and statuses(conn, [soft], "ops.retry") == ["ready"]
    proc = run(logins["admin"], "retry", str(other))
    assert "retried 1" in proc.stdout and statuses(conn, [other], "ops.retry") == ["ready"]
    proc = run(logins["admin"], "retry")
    assert proc.returncode == 2 and "--stage" in proc.stdout


def test_cancel_and_priority(logins: dict[str, str], conn: psycopg.Connection) -> None:
    a, b = enqueue(conn, "ops.cancel", 2)
    assert run(logins["admin"], "priority", "-5", str(a), str(b)).returncode == 0
    assert conn.execute("SELECT array_agg(priority ORDER BY id) FROM queue.tasks WHERE stage = 'ops.cancel'").fetchone() == ([-5, -5],)
    proc = run(logins["admin"], "cancel", str(a))
    assert proc.returncode == 0 and statuses(conn, [a, b], "ops.cancel") == ["cancelled", "ready"]
    proc = run(logins["admin"], "cancel", str(a))  # a finished task: the function's own error, one line
    assert proc.returncode == 1 and "55000" in proc.stderr and "Traceback" not in proc.stderr


def test_pause_shows_in_stats_and_top_and_the_monitor_cannot_pause(logins: dict[str, str], conn: psycopg.Connection) -> None:
    enqueue(conn, "ops.paused", 1)
    assert run(logins["admin"], "pause", "ops.paused").returncode == 0
    stats = run(logins["monitor"], "stats")
    assert "ops.paused (paused)" in stats.stdout and "paused: ops.paused" in stats.stdout, stats.stdout
    top = run(logins["monitor"], "top", "--iterations", "1")
    assert "ops.paused (paused)" in top.stdout, top.stdout
    proc = run(logins["monitor"], "resume", "ops.paused")
    assert proc.returncode == 1 and "permission denied" in proc.stderr
    assert conn.execute("SELECT paused FROM queue.stage_config WHERE stage = 'ops.paused'").fetchone() == (True,)
    assert run(logins["admin"], "resume", "ops.paused").returncode == 0
    assert "(paused)" not in run(logins["monitor"], "stats").stdout


def test_schedules_lists_cron_schedules(logins: dict[str, str], conn: psycopg.Connection) -> None:
    conn.execute("SELECT queue.schedule('ops-nightly', '0 3 * * *', 'ops.reports')")
    proc = run(logins["monitor"], "schedules")
    assert proc.returncode == 0 and "ops-nightly" in proc.stdout and "0 3 * * *" in proc.stdout, proc.stdout
