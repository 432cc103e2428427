"""Alembic environment for skiplock: a schema package, not an ORM.

- The database is DATABASE_URL or `-x url=…`, written as any libpq user writes it; psycopg 3
  connects with it as is (SQLAlchemy only wraps that connection).
- The version table is queue.skiplock_version, so skiplock's history never mixes with the
  application's own alembic_version.
- A transaction-level advisory lock serialises concurrent `alembic upgrade` runs; the whole run is
  one transaction, so a failed upgrade leaves nothing half-applied.
- After the advisory lock, the run sets `lock_timeout` (2 s unless -x lock_timeout=… says
  otherwise): a migration that queues for a lock on the hot table gives up after it instead of
  stalling every worker behind it, and the whole run is retried with backoff (-x lock_attempts=…,
  5 tries by default). Details in skiplock/migrate.py.
"""

from __future__ import annotations

import logging
import os
import time

import psycopg
from alembic import context
from sqlalchemy import create_engine, pool, text

from alembic.script import ScriptDirectory

from skiplock.connect import timeout_args
from skiplock.migrate import (MIGRATION_LOCK_KEY, backoff, is_lock_timeout, is_retryable, libpq_url,
                              lock_queue_tables, lock_settings, refuse_old_server, refuse_pre_release)

config = context.config
log = logging.getLogger("alembic.env")


def database_url() -> str:
    url = (context.get_x_argument(as_dictionary=True).get("url")
           or config.attributes.get("url")
           or os.environ.get("DATABASE_URL"))
    if not url:
        raise SystemExit("skiplock: set DATABASE_URL (or pass -x url=postgresql://…) to say which database to migrate")
    return libpq_url(url)


def run_once(url: str, lock_timeout: str) -> None:
    """One try: one connection, one transaction, every pending revision."""
    engine = create_engine("postgresql+psycopg://", poolclass=pool.NullPool,
                           creator=lambda: psycopg.connect(url, **timeout_args(url)))
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            version_table="skiplock_version",
            version_table_schema="queue",
            transactional_ddl=True,
        )
        with context.begin_transaction():
            # The migrating role is often a superuser: no schema another role can create in is on
            # the path while the revisions run (a shadowing operator or function would run with its
            # rights); every name the revisions use is qualified (queue.…) or pg_catalog's.
            connection.execute(text("SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true)"))
            # Wait for ever for another upgrade to end (no lock_timeout yet): upgrades queue up.
            connection.execute(text("SELECT pg_catalog.pg_advisory_xact_lock(CAST(:key AS pg_catalog.int8))"),
                               {"key": MIGRATION_LOCK_KEY})
            # From here on, waiting for a table lock is bounded (see skiplock/migrate.py).
            connection.execute(text("SELECT pg_catalog.set_config('lock_timeout', CAST(:t AS pg_catalog.text), true)"),
                               {"t": lock_timeout})
            # The version table lives in schema queue, which must exist before Alembic looks.
            connection.execute(text("CREATE SCHEMA IF NOT EXISTS queue"))
            refuse_pre_release(context.get_context().get_current_heads())
            # Something to do: take every queue table at once before the first DDL, so that the
            # run never holds one table while it queues for another (see lock_queue_tables).
            try:
                target = context.get_revision_argument()
            except KeyError:  # `alembic current`, `check`…: no target, nothing to apply
                target = None
            heads = set(ScriptDirectory.from_config(config).get_heads())
            if target is not None and not (target in ("head", "heads")
                                           and set(context.get_context().get_current_heads()) == heads):
                nowait = connection.execute(text(
                    "SELECT EXTRACT(epoch FROM pg_catalog.current_setting('lock_timeout')::interval)")).scalar()
                how = lock_queue_tables(connection, float(nowait))
                log.info("skiplock: queue tables locked (%s)", how)
            context.run_migrations()
            # Every skiplock role may read which revision the database is at (the CLI warns any
            # login whose database is behind the package); the table holds one id, nothing else.
            if connection.execute(text("SELECT pg_catalog.to_regclass('queue.skiplock_version') IS NOT NULL")).scalar():
                connection.execute(text("GRANT SELECT ON queue.skiplock_version TO skiplock_producer, skiplock_worker,"
                                        " skiplock_monitor, skiplock_admin, skiplock_sql"))


def run_migrations_online() -> None:
    url = database_url()
    lock_timeout, attempts = lock_settings(context.get_x_argument(as_dictionary=True), config.attributes)
    for attempt in range(1, attempts + 1):
        try:
            run_once(url, lock_timeout)
            return
        except Exception as e:
            refuse_old_server(e)
            if not is_retryable(e):
                raise
            if attempt == attempts and not is_lock_timeout(e):
                e.add_note(f"skiplock: the migration was chosen by the deadlock detector in each of {attempts} "
                           "tries and rolled back each time (nothing applied); retry it.")
                raise
            if attempt == attempts:
                e.add_note(f"skiplock: the migration waited more than lock_timeout={lock_timeout} for a lock "
                           f"in each of {attempts} tries and was rolled back each time (nothing applied). "
                           "Look for long transactions on queue tables in pg_stat_activity, or retry with "
                           "-x lock_timeout=… -x lock_attempts=…")
                raise
            delay = backoff(attempt)
            log.warning("%s on try %d of %d, rolled back; retrying in %.1f s: %s",
                        f"lock_timeout ({lock_timeout}) hit" if is_lock_timeout(e) else "deadlock",
                        attempt, attempts, delay, str(e).splitlines()[0])
            time.sleep(delay)


if context.is_offline_mode():
    raise SystemExit("skiplock migrations run SQL files against a live database; offline mode is not supported")
run_migrations_online()
