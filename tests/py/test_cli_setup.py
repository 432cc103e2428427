"""The `skiplock` command around the queue: `--version`, the warning when the database's revision
is behind the package's, and `skiplock devdb` found from any directory and restarted, not
replaced, when its server stopped. Subprocesses against real databases, as test_cli.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import psycopg
import pytest

import dev.testrun
import skiplock
from skiplock import cmd_migrate
from skiplock.sqlfiles import ROOT

ENV = dict(os.environ, COLUMNS="200")
ENV.pop("DATABASE_URL", None)
ENV.pop("SKIPLOCK_DEVDB_STATE", None)


def run(*args: str, cwd: Path = ROOT, env: dict[str, str] = ENV) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skiplock", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=cwd)


def test_version_names_the_package_and_the_schema_revision_it_ships():
    proc = run("--version")
    assert proc.returncode == 0, proc.stderr
    head = max(p.name[:4] for p in (ROOT / "alembic" / "versions").glob("[0-9]*_*.py"))
    assert proc.stdout.strip() == f"skiplock {skiplock.__version__} (schema revision {head})"


@pytest.fixture
def behind(admin_url: str, template_db: str) -> Iterator[str]:
    """A database at the revision before the head."""
    url = dev.testrun.create_database(admin_url, "cli_behind", template=template_db)
    try:
        # The suite's CHECK calls the head's queue._live_row_ok, which the downgrade replaces.
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER TABLE queue.live_tasks DROP CONSTRAINT live_tasks_valid")
        proc = run("downgrade", "-1", "--db", url)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield url
    finally:
        dev.testrun.drop_database(admin_url, url)


def test_every_command_warns_in_one_line_when_the_database_is_behind(behind: str):
    head = cmd_migrate.head_revision()
    was = cmd_migrate.current_revision(behind)
    assert was is not None and was < head
    for command in (["stats"], ["maintain", "--once"], ["enqueue", "--stage", "cli.behind", "{}"]):
        proc = run(*command, "--db", behind)
        assert proc.returncode == 0, proc.stderr
        warned = [line for line in proc.stderr.splitlines() if "warning" in line]
        assert warned == [f"skiplock {command[0]}: warning: the database is at revision {was}, this skiplock "
                          f"({skiplock.__version__}) ships {head}: run `skiplock upgrade`"], proc.stderr
    # Every skiplock role may read the version table (alembic/env.py grants it): a monitor login is
    # warned too; a login with no skiplock role gets no warning and no error from the check.
    with psycopg.connect(behind, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS cli_behind_monitor")
        conn.execute("CREATE ROLE cli_behind_monitor LOGIN IN ROLE skiplock_monitor")
        conn.execute("DROP ROLE IF EXISTS cli_behind_nobody")
        conn.execute("CREATE ROLE cli_behind_nobody LOGIN")
    try:
        monitor = psycopg.conninfo.make_conninfo(behind, user="cli_behind_monitor")
        proc = run("stats", "--db", monitor)
        assert proc.returncode == 0, proc.stderr
        assert [line for line in proc.stderr.splitlines() if "warning" in line] == [
            f"skiplock stats: warning: the database is at revision {was}, this skiplock "
            f"({skiplock.__version__}) ships {head}: run `skiplock upgrade`"], proc.stderr
        nobody = psycopg.conninfo.make_conninfo(behind, user="cli_behind_nobody")
        proc = run("stats", "--db", nobody)
        assert "warning" not in proc.stderr, proc.stderr
        # Upgraded: nothing to say, and upgrade itself never warns.
        proc = run("upgrade", "--db", behind)
        assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stdout + proc.stderr
        proc = run("stats", "--db", behind)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    finally:
        with psycopg.connect(behind, autocommit=True) as conn:
            conn.execute("DROP ROLE cli_behind_monitor")
            conn.execute("DROP ROLE cli_behind_nobody")


@pytest.fixture
def checkout() -> Iterator[Path]:
    """A copy of this checkout's package (the SQL linked), so that its dev cluster is its own."""
    top = Path(tempfile.mkdtemp(prefix="skiplock-devdb-checkout-"))
    try:
        shutil.copytree(ROOT / "skiplock", top / "skiplock", ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("schema", "alembic", "alembic.ini", "pyproject.toml", "docs"):
            (top / name).symlink_to(ROOT / name)
        yield top
    finally:
        if (top / ".skiplock-devdb.json").exists():
            run("devdb", "stop", cwd=top, env=dict(ENV, PYTHONPATH=str(top)))
        shutil.rmtree(top, ignore_errors=True)


def test_devdb_is_found_from_any_directory_and_restarted_when_its_server_stopped(checkout: Path):
    env = dict(ENV, PYTHONPATH=str(checkout))
    started = run("devdb", "start", "--fast", cwd=checkout / "skiplock", env=env)  # a subdirectory
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip()
    assert (checkout / ".skiplock-devdb.json").exists(), "the state is kept at the checkout's root"
    for where in (checkout, checkout / "docs", Path("/")):
        found = run("devdb", "url", cwd=where, env=env)
        assert (found.returncode, found.stdout.strip()) == (0, url), (where, found.stderr)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (n int); INSERT INTO kept VALUES (42)")
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    # Its server stops behind its back (a reboot, pg_ctl stop): start brings the same cluster back.
    stopped = subprocess.run([sys.executable, "-c", "from skiplock import devdb; devdb.devdb_current().stop(remove=False)"],
                             env=env, cwd=checkout, capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=5).close()
    again = run("devdb", "start", cwd="/", env=env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == url
    assert "started it again" in again.stderr, again.stderr
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT n FROM kept").fetchone()[0] == 42
        assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] != pid
    running = run("devdb", "start", cwd=checkout, env=env)
    assert (running.returncode, running.stdout.strip(), running.stderr) == (0, url, "")
    assert run("devdb", "stop", cwd="/", env=env).stdout.strip() == "stopped"
    assert run("devdb", "url", cwd=checkout, env=env).returncode == 1
