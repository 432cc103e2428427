"""`make test`: lint (ruff, mypy), then the pgTAP suite through pg_prove, then pytest, on a cluster
of the tests' own. A lint finding stops the run before any database starts.

It never reads DATABASE_URL: tests drop and rebuild schema queue. It starts a throwaway cluster,
or uses TEST_DATABASE_URL, a server where it may create and drop its own databases.
pytest runs last so that its summary is the last line printed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid

import psycopg

from skiplock import devdb, lint, migrate
from skiplock.sqlfiles import ROOT

TAP_DB = "skiplock_pgtap"


def prepare_tap_database(admin_url: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{TAP_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{TAP_DB}"')
    url = db_url(admin_url, TAP_DB)
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgtap")
        conn.execute("CREATE EXTENSION IF NOT EXISTS plpgsql_check")
    return url


def db_url(admin_url: str, dbname: str) -> str:
    """The same server as admin_url, another database."""
    params = psycopg.conninfo.conninfo_to_dict(admin_url)
    params["dbname"] = dbname
    return psycopg.conninfo.make_conninfo("", **params)


def create_database(admin_url: str, prefix: str) -> str:
    """A new database with a unique name on admin_url's server; returns its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return db_url(admin_url, name)


def drop_database(admin_url: str, url: str) -> None:
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run_pg_prove(url: str) -> int:
    params = psycopg.conninfo.conninfo_to_dict(url)
    env = dict(os.environ)
    for key, var in (("host", "PGHOST"), ("port", "PGPORT"), ("user", "PGUSER"),
                     ("dbname", "PGDATABASE"), ("password", "PGPASSWORD")):
        if params.get(key):
            env[var] = str(params[key])
    tests = ROOT / "tests" / "sql"
    # --ext .sql: without it pg_prove looks for *.pg, finds nothing and still exits 0.
    proc = subprocess.run(["pg_prove", "--ext", ".sql", "-r", "--failures", str(tests)],
                          env=env, cwd=ROOT, capture_output=True, text=True)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    sys.stdout.flush()
    counted = re.search(r"Files=(\d+), Tests=(\d+)", proc.stdout)
    if counted is None or int(counted.group(1)) == 0 or int(counted.group(2)) == 0:
        print("pg_prove ran no test: failing (check tests/sql and --ext .sql)")
        return 1
    return proc.returncode


def run_pytest(admin_url: str, extra: list[str]) -> int:
    env = dict(os.environ)
    env.pop("DATABASE_URL", None)  # the tests must never find the user's database
    env["SKIPLOCK_TEST_ADMIN_URL"] = admin_url
    proc = subprocess.run([sys.executable, "-m", "pytest", *extra], cwd=ROOT, env=env)
    return proc.returncode


def main(argv: list[str] | None = None) -> int:
    extra = list(sys.argv[1:] if argv is None else argv)
    if lint.run() != 0:
        return 1
    explicit = os.environ.get("TEST_DATABASE_URL")
    cluster = None
    code = 1
    with devdb.stopped_on_signals():
        try:
            if explicit:
                admin_url = explicit
            else:
                print("starting a throwaway PostgreSQL cluster for the tests", flush=True)
                cluster = devdb.Cluster(durable=False).start()
                admin_url = cluster.url()
            tap_code = run_pg_prove(prepare_tap_database(admin_url))
            py_code = run_pytest(admin_url, extra)
            code = tap_code or py_code
        finally:
            if cluster is not None:
                cluster.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
