"""An application that already uses Alembic adds skiplock's migrations (docs/embedding.md).

The application is tests/py/embedding_app: its own env.py and two revisions (app.orders, then
app.order_events), and a third revision that calls queue.configure_stage, in one variant per
recipe under uses_queue/. Each test gets fresh, empty databases of its own.

Recipe 1, side by side: the app's history in alembic_version, skiplock's in
queue.skiplock_version, two upgrades. Recipe 2, one history: skiplock's alembic/versions listed in
the app's version_locations, one `alembic upgrade heads`, both branches in alembic_version.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import psycopg
import pytest
import sqlalchemy.exc
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from dev.testrun import create_database, drop_database
from skiplock import migrate
from skiplock.sqlfiles import ROOT

APP = Path(__file__).resolve().parent / "embedding_app"
APP_TABLES = {"app.orders", "app.order_events"}


def skiplock_head() -> str:
    """skiplock's head, read from its own alembic directory (never hard-coded)."""
    return ScriptDirectory.from_config(migrate.alembic_config("postgresql://unused")).get_current_head()


def app_config(ini: str, url: str, uses_queue: bool = False) -> Config:
    """The sample app's Alembic config, as its deploy script would build it; uses_queue adds the
    revision that calls skiplock's API (the variant written for that recipe)."""
    cfg = Config(str(APP / ini))
    cfg.attributes["url"] = url
    if uses_queue:
        recipe = ini.removesuffix(".ini")
        locations = cfg.get_main_option("version_locations") or str(APP / "migrations" / "versions")
        cfg.set_main_option("version_locations",
                            locations + os.pathsep + str(APP / "uses_queue" / recipe))
    return cfg


def app_head(cfg: Config) -> str:
    return ScriptDirectory.from_config(cfg).get_revision("app@head").revision


@pytest.fixture
def fresh_db(admin_url: str) -> Iterator[Callable[[], str]]:
    """Makes new, empty databases on the test cluster; drops them after the test."""
    made: list[str] = []

    def make() -> str:
        made.append(create_database(admin_url, "embedding"))
        return made[-1]

    try:
        yield make
    finally:
        for url in made:
            drop_database(admin_url, url)


def versions(conn: psycopg.Connection, table: str) -> set[str] | None:
    """The rows of an Alembic version table, None when it does not exist."""
    if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is None:
        return None
    return {r[0] for r in conn.execute(f"SELECT version_num FROM {table}")}


def state(url: str) -> dict:
    """What the tests compare: the app's tables and both version tables."""
    with psycopg.connect(url, autocommit=True) as conn:
        tables = {r[0] for r in conn.execute(
            "SELECT c.oid::regclass::text FROM pg_class c"
            " WHERE c.relnamespace = to_regnamespace('app') AND c.relkind = 'r'")}
        return {"app_tables": tables,
                "alembic_version": versions(conn, "public.alembic_version"),
                "skiplock_version": versions(conn, "queue.skiplock_version")}


def assert_queue_works(url: str) -> None:
    """A task of stage 'orders' is enqueued, taken and finished."""
    with psycopg.connect(url, autocommit=True) as conn:
        task = conn.execute("""SELECT queue.enqueue('{"order": 1}', stage => 'orders')""").fetchone()[0]
        taken = conn.execute("SELECT id, lease FROM queue.take_next('orders')").fetchall()
        assert [t[0] for t in taken] == [task]
        assert conn.execute("SELECT queue.finish(%s, %s)", taken[0]).fetchone()[0] is True
        assert conn.execute("SELECT count(*) FROM queue.take_next('orders')").fetchone()[0] == 0


def orders_max_attempts(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT max_attempts FROM queue.configure_stage('orders')").fetchone()[0]


# --- Recipe 1: side by side -------------------------------------------------------------------

@pytest.mark.parametrize("order", ["app first", "skiplock first"])
def test_side_by_side_in_either_order_gives_the_same_database(fresh_db, order: str):
    url = fresh_db()
    cfg = app_config("side_by_side.ini", url)
    if order == "app first":
        command.upgrade(cfg, "head")
        migrate.upgrade(url)          # what `skiplock upgrade` runs
    else:
        migrate.upgrade(url)
        command.upgrade(cfg, "head")
    assert state(url) == {"app_tables": APP_TABLES,
                          "alembic_version": {app_head(cfg)},
                          "skiplock_version": {skiplock_head()}}
    assert_queue_works(url)


def test_side_by_side_app_revision_calling_skiplock_needs_skiplock_first(fresh_db):
    url = fresh_db()
    cfg = app_config("side_by_side.ini", url, uses_queue=True)
    assert app_head(cfg) == "app0003"
    # App first: its revision app0003 finds no schema queue; the app's run is one transaction,
    # so app0001 and app0002 are rolled back with it.
    with pytest.raises(sqlalchemy.exc.ProgrammingError, match='schema "queue" does not exist'):
        command.upgrade(cfg, "head")
    assert state(url) == {"app_tables": set(), "alembic_version": None, "skiplock_version": None}
    # The deploy script's order: skiplock, then the app.
    migrate.upgrade(url)
    command.upgrade(cfg, "head")
    assert state(url) == {"app_tables": APP_TABLES, "alembic_version": {"app0003"},
                          "skiplock_version": {skiplock_head()}}
    assert orders_max_attempts(url) == 8
    assert_queue_works(url)


def test_side_by_side_env_py_hook_runs_skiplock_first(fresh_db):
    """skiplock_first = true in alembic.ini (here: config.attributes): one `alembic upgrade head`
    runs skiplock's migrations, then the app's, which may then call queue.*."""
    url = fresh_db()
    cfg = app_config("side_by_side.ini", url, uses_queue=True)
    cfg.attributes["skiplock_first"] = True
    command.upgrade(cfg, "head")
    assert state(url) == {"app_tables": APP_TABLES, "alembic_version": {"app0003"},
                          "skiplock_version": {skiplock_head()}}
    assert orders_max_attempts(url) == 8
    command.upgrade(cfg, "head")  # again: nothing to do on either side
    assert state(url)["skiplock_version"] == {skiplock_head()}


# --- Recipe 2: one history --------------------------------------------------------------------

def test_one_history_sees_both_branches():
    cfg = app_config("one_history.ini", "postgresql://unused")
    script = ScriptDirectory.from_config(cfg)
    assert set(script.get_heads()) == {"app0002", skiplock_head()}
    assert script.get_revision("skiplock@head").revision == skiplock_head()


def test_one_history_alembic_upgrade_heads_on_the_command_line(fresh_db):
    """The documented command, run as a user runs it: the alembic CLI, -c the app's ini."""
    url = fresh_db()
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    proc = subprocess.run([sys.executable, "-m", "alembic", "-c", str(APP / "one_history.ini"),
                           "-x", f"url={url}", "upgrade", "heads"],
                          cwd=APP, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # Both branches' heads in the app's version table; skiplock's own table is never made.
    assert state(url) == {"app_tables": APP_TABLES, "alembic_version": {"app0002", skiplock_head()},
                          "skiplock_version": None}
    assert_queue_works(url)


@pytest.mark.parametrize("first, second", [("app@head", "skiplock@head"), ("skiplock@head", "app@head")])
def test_one_history_branches_upgrade_in_either_order(fresh_db, first: str, second: str):
    url = fresh_db()
    cfg = app_config("one_history.ini", url)
    command.upgrade(cfg, first)
    after_first = state(url)
    if first == "app@head":
        assert after_first == {"app_tables": APP_TABLES, "alembic_version": {"app0002"}, "skiplock_version": None}
    else:
        assert after_first == {"app_tables": set(), "alembic_version": {skiplock_head()}, "skiplock_version": None}
    command.upgrade(cfg, second)
    assert state(url) == {"app_tables": APP_TABLES, "alembic_version": {"app0002", skiplock_head()},
                          "skiplock_version": None}
    command.upgrade(cfg, "heads")  # nothing left to do
    assert state(url)["alembic_version"] == {"app0002", skiplock_head()}
    assert_queue_works(url)


def test_one_history_downgrade_names_the_branch(fresh_db):
    """`downgrade app@-1` undoes the app's last revision and leaves skiplock's branch alone (a bare
    `downgrade -1` may pick skiplock's branch: docs/embedding.md)."""
    url = fresh_db()
    cfg = app_config("one_history.ini", url)
    command.upgrade(cfg, "heads")
    command.downgrade(cfg, "app@-1")
    assert state(url) == {"app_tables": {"app.orders"}, "alembic_version": {"app0001", skiplock_head()},
                          "skiplock_version": None}
    assert_queue_works(url)


def test_one_history_depends_on_runs_skiplock_first(fresh_db):
    """app0003 has depends_on = '0100': `upgrade app@head` on an empty database runs skiplock's
    0100 (the baseline) before it; `upgrade heads` later brings skiplock to its head (as after a skiplock release)."""
    url = fresh_db()
    cfg = app_config("one_history.ini", url, uses_queue=True)
    command.upgrade(cfg, "app@head")
    # 0100 ran, but Alembic records only app0003: a dependency is implied by its dependent.
    assert state(url) == {"app_tables": APP_TABLES, "alembic_version": {"app0003"}, "skiplock_version": None}
    assert orders_max_attempts(url) == 8
    command.upgrade(cfg, "heads")
    # While skiplock's head is the revision app0003 depends on, app0003 still implies it.
    expected = {"app0003"} if skiplock_head() == "0100" else {"app0003", skiplock_head()}
    assert state(url) == {"app_tables": APP_TABLES, "alembic_version": expected, "skiplock_version": None}
    assert orders_max_attempts(url) == 8
    assert_queue_works(url)


def test_skiplock_migrations_are_read_from_the_checkout():
    """Both recipes read alembic/versions from disk, beside the skiplock package: a checkout or
    an editable install (the wheel ships the skiplock package only)."""
    assert (ROOT / "alembic" / "versions").is_dir()
    one_history = Config(str(APP / "one_history.ini")).get_version_locations_list()
    assert Path(one_history[-1]).resolve() == (ROOT / "alembic" / "versions").resolve()
