"""The pg_cron recipe of docs/guide.md for SQL tasks, driven by pg_cron itself.

A cluster of this module's own preloads pg_cron (Debian's postgresql-15-cron, installed by
`make test`); a job scheduled with cron.schedule_in_database(…, username => the enqueuing role)
CALLs queue.run_sql_tasks, which runs the role's due tasks in the job's session. pg_cron 1.4 (the
version Debian 12 ships) schedules by the minute ('10 seconds' needs pg_cron 1.5), so the test
waits for the next minute boundary: about a minute.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from skiplock import devdb, migrate

ROLE = "sqlcron_alice"
STAGE = "reports"


@pytest.fixture(scope="module")
def cron_cluster() -> Iterator[devdb.Cluster]:
    lib = devdb.pg_bin().parent / "lib" / "pg_cron.so"
    assert lib.exists(), f"{lib} is missing: install postgresql-15-cron (make test does)"
    cluster = devdb.Cluster(settings={"shared_preload_libraries": "'pg_cron'",
                                      "cron.database_name": "'postgres'"}).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_a_pg_cron_job_runs_the_roles_sql_tasks_as_that_role(cron_cluster: devdb.Cluster):
    db_url = cron_cluster.createdb("cron")
    migrate.upgrade(db_url)
    dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE skiplock_sql").format(sql.Identifier(ROLE)))
        admin.execute("CREATE TABLE public.cron_secret (s text)")
    role_url = psycopg.conninfo.make_conninfo(db_url, user=ROLE)
    with psycopg.connect(role_url, autocommit=True) as alice:
        answer = alice.execute("SELECT queue.enqueue_sql('SELECT 42 AS answer, current_user::text AS cu, "
                               "session_user::text AS su', stage => %s)", (STAGE,)).fetchone()[0]
        denied = alice.execute("SELECT queue.enqueue_sql('SELECT * FROM public.cron_secret', stage => %s)",
                               (STAGE,)).fetchone()[0]
    with psycopg.connect(cron_cluster.url(), autocommit=True) as cron:
        cron.execute("CREATE EXTENSION pg_cron")
        # The guide's recipe, at pg_cron 1.4's granularity.
        cron.execute("SELECT cron.schedule_in_database('skiplock-sql-reports-' || %s, '* * * * *', "
                     "$$CALL queue.run_sql_tasks('reports', 100)$$, %s, %s)", (ROLE, dbname, ROLE))
        cron.execute("SELECT cron.schedule_in_database('skiplock-sql-watchdog-' || %s, '* * * * *', "
                     "$$SELECT queue.cancel_overdue_sql_tasks()$$, %s, %s)", (ROLE, dbname, ROLE))
        deadline = time.monotonic() + 100
        with psycopg.connect(db_url, autocommit=True) as admin:
            while time.monotonic() < deadline:
                live = admin.execute("SELECT count(*) FROM queue.live_tasks WHERE id IN (%s, %s) AND status = 'ready'"
                                     " AND attempt = 0", (answer, denied)).fetchone()[0]
                if live == 0:
                    break
                time.sleep(1)
            # The tasks leave 'ready' at the procedure's COMMIT; its run is recorded as succeeded only
            # once the CALL has returned. No new runs, then wait for those under way.
            cron.execute("SELECT cron.unschedule(jobid) FROM cron.job")
            while True:
                details = cron.execute("SELECT command, status, return_message, username FROM cron.job_run_details"
                                       " ORDER BY runid").fetchall()
                if all(d[1] in ("succeeded", "failed") for d in details) or time.monotonic() > deadline + 30:
                    break
                time.sleep(0.2)
            assert live == 0, f"pg_cron ran nothing within 100 s; job runs: {details}"
            status, result, run_as = admin.execute(
                "SELECT status::text, result, run_as::text FROM queue.tasks WHERE id = %s AND status = 'done'",
                (answer,)).fetchone()
            assert (status, run_as) == ("done", ROLE)
            assert result["rows"] == [[42, ROLE, ROLE]], result
            error = admin.execute("SELECT error_text FROM queue.tasks WHERE id = %s ORDER BY finished NULLS FIRST LIMIT 1",
                                  (denied,)).fetchone()[0]
            assert error.startswith("42501: permission denied for table cron_secret"), error
        runs = [d for d in details if "run_sql_tasks" in d[0]]
        assert runs and all(d[1] == "succeeded" and d[3] == ROLE for d in runs), details
