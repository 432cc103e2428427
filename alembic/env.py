"""Alembic environment for skiplock: a schema package, not an ORM.

- The database is DATABASE_URL or `-x url=…`, written as any libpq user writes it; psycopg 3
  connects with it as is (SQLAlchemy only wraps that connection).
- The version table is queue.skiplock_version, so skiplock's history never mixes with the
  application's own alembic_version.
- A transaction-level advisory lock serialises concurrent `alembic upgrade` runs; the whole run is
  one transaction, so a failed upgrade leaves nothing half-applied.
"""

from __future__ import annotations

import os

import psycopg
from alembic import context
from sqlalchemy import create_engine, pool, text

from skiplock.migrate import MIGRATION_LOCK_KEY, libpq_url

config = context.config


def database_url() -> str:
    url = (context.get_x_argument(as_dictionary=True).get("url")
           or config.attributes.get("url")
           or os.environ.get("DATABASE_URL"))
    if not url:
        raise SystemExit("skiplock: set DATABASE_URL (or pass -x url=postgresql://…) to say which database to migrate")
    return libpq_url(url)


def run_migrations_online() -> None:
    url = database_url()
    engine = create_engine("postgresql+psycopg://", poolclass=pool.NullPool,
                           creator=lambda: psycopg.connect(url))
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            version_table="skiplock_version",
            version_table_schema="queue",
            transactional_ddl=True,
        )
        with context.begin_transaction():
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            # The version table lives in schema queue, which must exist before Alembic looks.
            connection.execute(text("CREATE SCHEMA IF NOT EXISTS queue"))
            context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("skiplock migrations run SQL files against a live database; offline mode is not supported")
run_migrations_online()
