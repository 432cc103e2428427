"""env.py of a sample application that embeds skiplock (docs/embedding.md); the tests run it.

Only the lines marked `# recipe 1` / `# recipe 2` (and what they call) concern skiplock:
- recipe 1 (side by side): the application's history lives in its own alembic_version table;
  with `skiplock_first = true` in alembic.ini (or config.attributes["skiplock_first"]) this file
  runs skiplock's migrations, in their own transaction and version table, before the app's. It
  runs them in a child process: alembic.context is one global per process, and a nested
  command.upgrade() (skiplock.migrate.upgrade) would tear down this run's context.
- recipe 2 (one history): skiplock's revisions run here, in this transaction; take skiplock's
  advisory lock and bound lock waits, as skiplock's own env.py does.
"""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
from alembic import context
from sqlalchemy import create_engine, pool, text

from skiplock.migrate import MIGRATION_LOCK_KEY

config = context.config


def database_url() -> str:
    url = (context.get_x_argument(as_dictionary=True).get("url")
           or config.attributes.get("url")
           or os.environ.get("DATABASE_URL"))
    if not url:
        raise SystemExit("set DATABASE_URL (or -x url=postgresql://…)")
    return url


def skiplock_first() -> bool:
    return bool(config.attributes.get("skiplock_first")
                or config.get_main_option("skiplock_first", "false").lower() == "true")


def skiplock_upgrade(url: str) -> None:
    """`skiplock upgrade`, in a child process (see above); the URL goes by the environment."""
    subprocess.run([sys.executable, "-m", "skiplock", "upgrade"], env={**os.environ, "DATABASE_URL": url},
                   check=True)


def run_migrations_online() -> None:
    url = database_url()
    if skiplock_first():
        skiplock_upgrade(url)                                                       # recipe 1
    # skiplock's revisions (recipe 2) need a psycopg 3 connection: they run their SQL files on it.
    engine = create_engine("postgresql+psycopg://", poolclass=pool.NullPool,
                           creator=lambda: psycopg.connect(url))
    with engine.connect() as connection:
        context.configure(connection=connection, transactional_ddl=True)
        with context.begin_transaction():
            connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})  # recipe 2
            connection.execute(text("SET LOCAL lock_timeout = '2s'"))                               # recipe 2
            context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("offline mode is not supported")
run_migrations_online()
