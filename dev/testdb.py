"""Test databases: a migrated template, copies of it for pgTAP and each test module, pg_prove
side by side, and pytest.

Shared by dev.testrun (`make test`) and dev.versions (the other PostgreSQL majors).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import psycopg

from skiplock import migrate
from skiplock.sqlfiles import ROOT

TAP_DB = "skiplock_pgtap"
# pg_prove runs one file at a time, one backend busy: two of them, each on a database of its own
# taking the next file in turn, keep both cores of a 2-core machine busy (one database for all,
# with pg_prove -j, would let files that take the same locks or count the same rows meet).
TAP_JOBS = 2
# The name of the template database `make test` built, for pytest's fixtures to copy.
TEMPLATE_ENV = "SKIPLOCK_TEST_TEMPLATE"
# The invariants of a live task as a CHECK, in every database the suites copy or build here: the
# shipped table has none (PostgreSQL sets a CHECK up again for every statement that writes a row),
# so the tests check every row they write instead (queue._live_row_ok, schema/tables/live_tasks.sql).
LIVE_ROW_CHECK = ("ALTER TABLE queue.live_tasks ADD CONSTRAINT live_tasks_valid CHECK (queue._live_row_ok("
                  "status, attempt, lease, lease_expires, started, rerun, repeat, slot, group_key, waits))")
# What the pgTAP files test plans with: EXPLAIN [options] query, its lines as one text.
PLAN_TEXT = """CREATE OR REPLACE FUNCTION public.plan_text(query text, options text DEFAULT '') RETURNS text
    LANGUAGE plpgsql AS $$
DECLARE
    v_line text;
    v_all  text := '';
BEGIN
    FOR v_line IN EXECUTE 'EXPLAIN ' || options || ' ' || query LOOP
        v_all := v_all || v_line || E'\\n';
    END LOOP;
    RETURN v_all;
END
$$"""


def prepare_template(admin_url: str) -> str:
    """A new database built by `alembic upgrade head` (what we ship) with LIVE_ROW_CHECK added, to
    copy test databases from.

    It is closed to connections once built: CREATE DATABASE ... TEMPLATE fails while any session
    is connected to the template, and a copy takes a fraction of the seconds a migration takes.
    Returns its name; drop it with drop_template().
    """
    url = create_database(admin_url, "skiplock_template")
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(LIVE_ROW_CHECK)
    name = str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
    return name


def drop_template(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def prepare_tap_database(admin_url: str, template: str | None = None, name: str = TAP_DB,
                         plpgsql_check: bool = True) -> str:
    """A pgTAP database: a copy of `template` when given, else migrated here; with plpgsql_check
    unless told not to (it exists for the machine's major only)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    url = db_url(admin_url, name)
    with psycopg.connect(url, autocommit=True) as conn:
        if template is None:
            migrate.upgrade(url)
            conn.execute(LIVE_ROW_CHECK)
        add_tap_tools(conn)
        if plpgsql_check:
            conn.execute("CREATE EXTENSION IF NOT EXISTS plpgsql_check")
    return url


def add_tap_tools(conn: psycopg.Connection) -> None:
    """What the pgTAP files use beside the schema: pgTAP, and PLAN_TEXT."""
    conn.execute("CREATE EXTENSION IF NOT EXISTS pgtap")
    conn.execute(PLAN_TEXT)


def prepare_tap_databases(admin_url: str, template: str | None = None, count: int = TAP_JOBS,
                          plpgsql_check: bool = True) -> list[str]:
    """`count` pgTAP databases, one for each pg_prove that run_pg_prove runs side by side."""
    return [prepare_tap_database(admin_url, template, TAP_DB if k == 0 else f"{TAP_DB}_{k + 1}", plpgsql_check)
            for k in range(count)]


def db_url(admin_url: str, dbname: str) -> str:
    """The same server as admin_url, another database."""
    params = psycopg.conninfo.conninfo_to_dict(admin_url)
    params["dbname"] = dbname
    return psycopg.conninfo.make_conninfo("", **params)


def create_database(admin_url: str, prefix: str, template: str | None = None) -> str:
    """A new database with a unique name on admin_url's server, empty or a copy of `template`
    (see prepare_template); returns its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    return db_url(admin_url, name)


def drop_database(admin_url: str, url: str) -> None:
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _pg_prove(url: str, files: list[Path]) -> subprocess.Popen:
    """pg_prove on these files (paths from the checkout's root) against url."""
    params = psycopg.conninfo.conninfo_to_dict(url)
    env = dict(os.environ)
    for key, var in (("host", "PGHOST"), ("port", "PGPORT"), ("user", "PGUSER"),
                     ("dbname", "PGDATABASE"), ("password", "PGPASSWORD")):
        if params.get(key):
            env[var] = str(params[key])
    return subprocess.Popen(["pg_prove", "--failures", *map(str, files)],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_pg_prove(urls: str | list[str]) -> int:
    """tests/sql through pg_prove, one file at a time on each of the databases `urls` side by side,
    each taking the next file when it is done; prints each file's line (all of pg_prove's output
    for a file that failed) and a total. Fails unless every file passed and tests ran."""
    urls = [urls] if isinstance(urls, str) else list(urls)
    files = sorted((ROOT / "tests" / "sql").rglob("*.sql"))
    pending = list(files)
    lock = threading.Lock()
    results: dict[Path, tuple[int, str, str]] = {}

    def work(url: str) -> None:
        while True:
            with lock:
                if not pending:
                    return
                file = pending.pop(0)
            try:
                proc = _pg_prove(url, [file.relative_to(ROOT)])
                out, err = proc.communicate()
                results[file] = (proc.returncode, out, err)
            except OSError as e:  # pg_prove missing: the file fails, the others still run
                results[file] = (127, "", f"pg_prove: {e}\n")

    threads = [threading.Thread(target=work, args=(url,)) for url in urls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    code = 0 if files else 1
    tests = 0
    for file in files:
        rc, out, err = results[file]
        counted = re.search(r"Files=(\d+), Tests=(\d+)", out)
        ran = int(counted.group(2)) if counted else 0
        tests += ran
        if rc != 0 or ran == 0:
            code = 1
            sys.stdout.write(out)
            sys.stderr.write(err)
        else:
            sys.stdout.write(out.splitlines()[0].strip() + "\n")
    # --ext .sql once let a directory run find nothing and exit 0: a run without tests fails.
    print(f"Files={len(files)}, Tests={tests}, {len(urls)} pg_prove side by side")
    print("Result: " + ("PASS" if code == 0 and tests > 0 else "FAIL"), flush=True)
    return code if tests > 0 else 1


def chooses_workers(args: list[str]) -> bool:
    """Whether pytest's arguments choose a number of pytest-xdist processes (`-n N`, `--numprocesses`)."""
    return any(a == "-n" or a.startswith(("-n", "--numprocesses")) for a in args)


def run_pytest(admin_url: str, extra: list[str], template: str | None = None,
               environment: dict[str, str] | None = None, summary: list[str] | None = None) -> int:
    """pytest on admin_url's server (copies of `template` when given), `environment` added to ours.
    With `summary`, pytest's output passes through and its last summary line is appended to it."""
    env = {**os.environ, **(environment or {})}
    env.pop("DATABASE_URL", None)  # the tests must never find the user's database
    env["SKIPLOCK_TEST_ADMIN_URL"] = admin_url
    if template is not None:
        env[TEMPLATE_ENV] = template
    if chooses_workers(extra) and not any(a.startswith("--dist") for a in extra):
        # pytest-xdist: a module's tests stay together (some build on what an earlier one left)
        extra = [*extra, "--dist", "loadscope"]
    if summary is None:
        return subprocess.run([sys.executable, "-m", "pytest", *extra], cwd=ROOT, env=env).returncode
    with subprocess.Popen([sys.executable, "-m", "pytest", *extra], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        tail = b""
        while chunk := os.read(proc.stdout.fileno(), 65536):
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
            tail = (tail + chunk)[-8192:]
    lines = [line for line in tail.decode(errors="replace").splitlines() if re.search(r"\b(passed|failed|errors?|no tests ran)\b.* in [0-9.]+s", line)]
    summary.extend(lines[-1:])
    return proc.returncode
