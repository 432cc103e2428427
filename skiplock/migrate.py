"""Migrations: run Alembic programmatically, and the helper every revision file calls.

Lock safety (alembic/env.py applies it to every `alembic upgrade`/`downgrade`, CLI or programmatic):

- The whole run is one transaction. It first takes a transaction-level advisory lock
  (MIGRATION_LOCK_KEY), waiting as long as it takes, so concurrent upgrades run one after the other.
- Only then does it `SET LOCAL lock_timeout` (2 s by default). A migration that needs an ACCESS
  EXCLUSIVE lock on a busy table (ALTER TABLE queue.live_tasks …, CREATE OR REPLACE VIEW) queues for
  it behind the transactions that hold the table; while it waits, every new call that touches the
  table (enqueue, take_next, finish…) queues behind *it*: a lock-queue pile-up that stops every
  worker for as long as the oldest transaction lasts. lock_timeout bounds that stall: after it
  the statement fails with SQLSTATE 55P03 (lock_not_available), the run rolls back (nothing
  applied) and the queue flows again at once.
- The run is then retried from scratch, up to `attempts` times in all (5 by default), sleeping
  1, 2, 4, 8 … s (plus up to 50 % jitter, capped at 30 s) between tries, so that a migration lands
  in the first gap between long transactions. When every try times out, the last 55P03 is raised
  with a note saying what to look for (pg_stat_activity, the lock holders).
- Settings, first found wins: `-x lock_timeout=5s -x lock_attempts=10` on the alembic command line;
  config.attributes["lock_timeout"] / ["lock_attempts"] (upgrade()/downgrade() below); the
  environment variables SKIPLOCK_MIGRATION_LOCK_TIMEOUT / SKIPLOCK_MIGRATION_LOCK_ATTEMPTS; the
  defaults. lock_timeout takes PostgreSQL's syntax ('2s', '500ms'); '0' waits for ever (the
  pile-up is then the operator's choice).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from skiplock.sqlfiles import ROOT, run_files

if TYPE_CHECKING:
    from alembic.config import Config

# Key of the transaction-level advisory lock that serialises concurrent upgrades (fits bigint).
MIGRATION_LOCK_KEY = 0x736B69706C6F636B  # "skiplock"

DEFAULT_LOCK_TIMEOUT = "2s"
DEFAULT_LOCK_ATTEMPTS = 5
BACKOFF_FIRST = 1.0   # seconds before the second try; doubles each time
BACKOFF_CAP = 30.0
LOCK_NOT_AVAILABLE = "55P03"
DEADLOCK_DETECTED = "40P01"
LOCK_ORDER = ["stage_settings", "stage_access", "live_tasks", "stage_waiters", "history", "history_policy", "schedules"]


# Revision ids of the pre-release history, replaced by the 0.1.0 baseline (0100).
PRE_RELEASE = frozenset(f"{n:04d}" for n in range(1, 30))
# Each release's squashed revisions: (first, last) ids of the unreleased revisions that `make release`
# replaced with one revision, and the previous release's head. Written by `make release`.
SQUASHED: dict[str, tuple[str, str, str]] = {'0.2.0': ('0101', '0110', '0100')}


def squashed_by(rev: str | None) -> tuple[str, str] | None:
    """(release, previous release's head) when rev is an unreleased id that a release squashed."""
    for version, (first, last, base) in SQUASHED.items():
        if rev is not None and rev.isdigit() and int(first) <= int(rev) <= int(last):
            return version, base
    return None


def refuse_pre_release(current: Sequence[str | None]) -> None:
    """A database built by the pre-release history cannot be upgraded: one line that says what to do
    (instead of Alembic's "Can't locate revision")."""
    from alembic.util import CommandError
    old = [r for r in current if r in PRE_RELEASE]
    if old:
        raise CommandError(
            f"this database is at skiplock revision {old[0]}, from the pre-release history that 0.1.0 replaced "
            "with one baseline: back up its tasks, DROP SCHEMA queue CASCADE, then run skiplock upgrade")
    for rev in current:
        found = squashed_by(rev)
        if found:
            raise CommandError(
                f"this database is at skiplock revision {rev}, never released: {found[0]} replaced it with one "
                f"revision. Run `skiplock downgrade {found[1]}` with the skiplock that built it, or back up its tasks "
                "and DROP SCHEMA queue CASCADE; then run skiplock upgrade")


def refuse_old_server(e: BaseException) -> None:
    """The refusal of schema/bootstrap/server_version.sql (a server older than 14), said in one line
    as Alembic prints a CommandError, instead of a traceback."""
    import psycopg
    from alembic.util import CommandError
    if (isinstance(e, psycopg.Error) and e.sqlstate == "0A000"
            and any("server_version.sql" in note for note in getattr(e, "__notes__", ()))):
        raise CommandError(f"{e.diag.message_primary}. {e.diag.message_hint}") from None


def libpq_url(url: str) -> str:
    """A URL as libpq takes it: SQLAlchemy's postgresql+psycopg:// becomes postgresql://."""
    for prefix in ("postgresql+psycopg://", "postgresql+psycopg2://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix):]
    return url


def run_revision_files(base: Path, files: Sequence[str]) -> None:
    """Run a revision's frozen SQL files, in order, inside the migration's transaction."""
    from alembic import op
    run_files(op.get_bind().connection.driver_connection, base, files)


def alembic_config(url: str, lock_timeout: str | None = None, lock_attempts: int | None = None) -> Config:
    from alembic.config import Config
    ini = ROOT / "alembic.ini"  # a checkout has one; an installed wheel needs none (env.py sets no logging)
    cfg = Config(str(ini)) if ini.is_file() else Config()
    cfg.set_main_option("script_location", str(ROOT / "alembic"))
    cfg.attributes["url"] = libpq_url(url)
    if lock_timeout is not None:
        cfg.attributes["lock_timeout"] = lock_timeout
    if lock_attempts is not None:
        cfg.attributes["lock_attempts"] = lock_attempts
    return cfg


def upgrade(url: str, revision: str = "head", *, lock_timeout: str | None = None,
            lock_attempts: int | None = None) -> None:
    from alembic import command
    command.upgrade(alembic_config(url, lock_timeout, lock_attempts), revision)


def downgrade(url: str, revision: str, *, lock_timeout: str | None = None,
              lock_attempts: int | None = None) -> None:
    from alembic import command
    command.downgrade(alembic_config(url, lock_timeout, lock_attempts), revision)


def database_url_from_env() -> str | None:
    return os.environ.get("DATABASE_URL")


def lock_settings(x_args: dict[str, str], attributes: dict[str, Any]) -> tuple[str, int]:
    """(lock_timeout, attempts) for a migration run: -x arguments, then config attributes, then
    the environment, then the defaults (see the module docstring)."""
    from alembic.util import CommandError  # a user's mistake: `skiplock upgrade` says it in one line
    timeout = (x_args.get("lock_timeout") or attributes.get("lock_timeout")
               or os.environ.get("SKIPLOCK_MIGRATION_LOCK_TIMEOUT") or DEFAULT_LOCK_TIMEOUT)
    given: Any   # a string, or the int an embedding application put in the attributes
    for source, given in (("-x lock_attempts", x_args.get("lock_attempts")),
                          ("lock_attempts", attributes.get("lock_attempts")),
                          ("SKIPLOCK_MIGRATION_LOCK_ATTEMPTS", os.environ.get("SKIPLOCK_MIGRATION_LOCK_ATTEMPTS")),
                          ("the default lock_attempts", DEFAULT_LOCK_ATTEMPTS)):
        if given:
            break
    try:
        attempts = int(given)
    except (TypeError, ValueError):
        attempts = 0
    if attempts < 1:
        raise CommandError(f"{source} must be a whole number of tries, at least 1, not {given!r}")
    return str(timeout), attempts


def is_lock_timeout(error: BaseException) -> bool:
    """True when error (or what it wraps: SQLAlchemy's .orig, __cause__, __context__) is a
    PostgreSQL 55P03 lock_not_available, i.e. lock_timeout fired."""
    return _sqlstate_in(error, {LOCK_NOT_AVAILABLE})


def is_retryable(error: BaseException) -> bool:
    """True for what a whole-run retry cures: 55P03 (lock_timeout) and 40P01 (the deadlock
    detector chose the migration: it waited for a table lock that a worker holding another
    table's lock was waiting for)."""
    return _sqlstate_in(error, {LOCK_NOT_AVAILABLE, DEADLOCK_DETECTED})


def _sqlstate_in(error: BaseException, states: set[str]) -> bool:
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if getattr(e, "sqlstate", None) in states:
            return True
        todo += [getattr(e, "orig", None), e.__cause__, e.__context__]
    return False


def backoff(attempt: int, rng: random.Random | None = None) -> float:
    """Seconds to wait after failed try number `attempt` (1-based): 1, 2, 4 … s, capped, + 0–50 % jitter."""
    base = min(BACKOFF_CAP, BACKOFF_FIRST * 2 ** (attempt - 1))
    return base * (1 + 0.5 * (rng or random).random())


def lock_queue_tables(connection: Any, nowait_seconds: float, pause: float = 0.02) -> str:
    """Take ACCESS EXCLUSIVE on every table and view of schema queue at once, before the first DDL.

    Revisions alter tables (ADD COLUMN needs ACCESS EXCLUSIVE) one statement at a time, and
    workers lock the same tables in different orders (take_next: stage_settings then live_tasks;
    fail: live_tasks then stage_settings). A migration that holds one table while it queues for
    the next can close a cycle with a worker, and the deadlock detector may then abort the
    worker's call. So the run first tries to get all the tables in one LOCK … NOWAIT, which never
    queues (workers never wait behind it) and either gets every lock or none: no cycle can form.
    The views too: a read of a view locks the view, then its tables; holding the tables alone, the
    run's CREATE OR REPLACE VIEW queued behind a read that queued behind the run (40P01 for a
    `queue.stats` read under test_upgrade_under_load). Held first, the view makes the read wait.
    It retries that every `pause` seconds for `nowait_seconds`, then queues for them in one LOCK
    statement, bounded by lock_timeout like any other wait (55P03 → the whole run is retried).
    nowait_seconds 0 (lock_timeout 0: wait for ever) queues at once. Returns how it got them:
    'none' (no tables yet), 'nowait' or 'queued'."""
    from sqlalchemy import text
    found = [r[0] for r in connection.execute(text(
        "SELECT c.relname::pg_catalog.text FROM pg_catalog.pg_class c"
        " WHERE c.relnamespace OPERATOR(pg_catalog.=) 'queue'::pg_catalog.regnamespace::pg_catalog.oid"
        " AND c.relkind OPERATOR(pg_catalog.=) ANY ('{r,p,v}'::pg_catalog.\"char\"[])"
        " AND NOT c.relispartition AND c.relname OPERATOR(pg_catalog.<>) 'skiplock_version'::pg_catalog.name"
        " ORDER BY c.relname"))]
    if not found:
        return "none"
    # When it has to queue, in the order most calls take them (settings, then the hot table,
    # then history), which leaves fewer cycles to close.
    tables = ["queue." + t for t in sorted(found, key=lambda t: (LOCK_ORDER.index(t) if t in LOCK_ORDER else len(LOCK_ORDER), t))]
    lock = "LOCK TABLE " + ", ".join(tables) + " IN ACCESS EXCLUSIVE MODE"
    deadline = time.monotonic() + nowait_seconds
    while time.monotonic() < deadline:
        connection.execute(text("SAVEPOINT skiplock_table_locks"))
        try:
            connection.execute(text(lock + " NOWAIT"))
        except Exception as e:
            if not is_lock_timeout(e):
                raise
            connection.execute(text("ROLLBACK TO SAVEPOINT skiplock_table_locks"))
            time.sleep(pause)
            continue
        connection.execute(text("RELEASE SAVEPOINT skiplock_table_locks"))
        return "nowait"
    # Queued, the run may still close a cycle with a worker (fail() takes live_tasks, then
    # stage_settings); let the deadlock detector pick the run (retried) rather than the worker:
    # it checks a waiter after deadlock_timeout, so the run's shorter one makes it look first.
    # Only a superuser may set it; otherwise the server's value stays.
    connection.execute(text("SAVEPOINT skiplock_deadlock_timeout"))
    try:
        connection.execute(text("SET LOCAL deadlock_timeout = '100ms'"))
        connection.execute(text("RELEASE SAVEPOINT skiplock_deadlock_timeout"))
    except Exception:
        connection.execute(text("ROLLBACK TO SAVEPOINT skiplock_deadlock_timeout"))
    connection.execute(text(lock))
    return "queued"
