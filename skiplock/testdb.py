"""Test databases: the pgTAP database, one database a test module, pg_prove and pytest runs.

Shared by skiplock.testrun (`make test`) and skiplock.versions (the other PostgreSQL majors).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid

import psycopg

from skiplock import migrate
from skiplock.sqlfiles import ROOT

TAP_DB = "skiplock_pgtap"


def prepare_tap_database(admin_url: str, plpgsql_check: bool = True) -> str:
    """A database built by the migrations, with pgTAP (and plpgsql_check unless told not to)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{TAP_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{TAP_DB}"')
    url = db_url(admin_url, TAP_DB)
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgtap")
        if plpgsql_check:
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
