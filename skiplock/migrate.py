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
from pathlib import Path
from typing import Any, Sequence

from skiplock.sqlfiles import ROOT, run_files

# Key of the transaction-level advisory lock that serialises concurrent upgrades (fits bigint).
MIGRATION_LOCK_KEY = 0x736B69706C6F636B  # "skiplock"

DEFAULT_LOCK_TIMEOUT = "2s"
DEFAULT_LOCK_ATTEMPTS = 5
BACKOFF_FIRST = 1.0   # seconds before the second try; doubles each time
BACKOFF_CAP = 30.0
LOCK_NOT_AVAILABLE = "55P03"


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


def alembic_config(url: str, lock_timeout: str | None = None, lock_attempts: int | None = None):
    from alembic.config import Config
    cfg = Config(str(ROOT / "alembic.ini"))
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
    timeout = (x_args.get("lock_timeout") or attributes.get("lock_timeout")
               or os.environ.get("SKIPLOCK_MIGRATION_LOCK_TIMEOUT") or DEFAULT_LOCK_TIMEOUT)
    attempts = int(x_args.get("lock_attempts") or attributes.get("lock_attempts")
                   or os.environ.get("SKIPLOCK_MIGRATION_LOCK_ATTEMPTS") or DEFAULT_LOCK_ATTEMPTS)
    if attempts < 1:
        raise ValueError(f"lock_attempts must be at least 1, not {attempts}")
    return str(timeout), attempts


def is_lock_timeout(error: BaseException) -> bool:
    """True when error (or what it wraps: SQLAlchemy's .orig, __cause__, __context__) is a
    PostgreSQL 55P03 lock_not_available, i.e. lock_timeout fired."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if getattr(e, "sqlstate", None) == LOCK_NOT_AVAILABLE:
            return True
        todo += [getattr(e, "orig", None), e.__cause__, e.__context__]
    return False


def backoff(attempt: int, rng: random.Random | None = None) -> float:
    """Seconds to wait after failed try number `attempt` (1-based): 1, 2, 4 … s, capped, + 0–50 % jitter."""
    base = min(BACKOFF_CAP, BACKOFF_FIRST * 2 ** (attempt - 1))
    return base * (1 + 0.5 * (rng or random).random())
