"""Migrations: run Alembic programmatically, and the helper every revision file calls."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from skiplock.sqlfiles import ROOT, run_files

# Key of the transaction-level advisory lock that serialises concurrent upgrades (fits bigint).
MIGRATION_LOCK_KEY = 0x736B69706C6F636B  # "skiplock"


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


def alembic_config(url: str):
    from alembic.config import Config
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "alembic"))
    cfg.attributes["url"] = libpq_url(url)
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    from alembic import command
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    from alembic import command
    command.downgrade(alembic_config(url), revision)


def database_url_from_env() -> str | None:
    return os.environ.get("DATABASE_URL")
