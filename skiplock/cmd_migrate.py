"""`skiplock upgrade` and `downgrade`: Alembic, saying which revisions it applies."""

from __future__ import annotations

import logging
import re
from typing import Callable

import psycopg
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

from skiplock import migrate
from skiplock.connect import timeout_args
from skiplock.db import one
from skiplock.sqlfiles import ROOT


def current_revision(url: str) -> str | None:
    """The revision the database is at, None when skiplock was never installed."""
    url = migrate.libpq_url(url)
    with psycopg.connect(url, autocommit=True, **timeout_args(url)) as conn:
        if one(conn.execute("SELECT pg_catalog.to_regclass('queue.skiplock_version'::pg_catalog.text)"))[0] is None:
            return None
        row = conn.execute("SELECT version_num FROM queue.skiplock_version").fetchone()
        return row[0] if row else None


def head_revision() -> str:
    """The newest revision this package ships (their ids are numbers of four digits, one line of them)."""
    return max(p.name[:4] for p in (ROOT / "alembic" / "versions").glob("[0-9][0-9][0-9][0-9]_*.py"))


def planned(url: str, target: str) -> list[tuple[str, str]]:
    """(revision, message) of each revision an upgrade to target would apply, oldest first."""
    from alembic.script import ScriptDirectory
    script = ScriptDirectory.from_config(migrate.alembic_config(url))
    current = current_revision(url)
    revs = script.iterate_revisions(target, current or "base")
    return [(r.revision, (r.doc or "").strip()) for r in reversed(list(revs))]


class _StepCounter(logging.Handler):
    """Advances the progress bar on Alembic's "Running upgrade a -> b" log records."""

    def __init__(self, progress: Progress, task: TaskID) -> None:
        super().__init__(logging.INFO)
        self.progress, self.task = progress, task

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(("Running upgrade", "Running downgrade")):
            self.progress.update(self.task, advance=1, description=message.split(",")[0])


def _with_progress(steps: int, label: str, run: Callable[[], None]) -> None:
    err = Console(stderr=True)
    logger = logging.getLogger("alembic.runtime.migration")
    old_level = logger.level
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  console=err, transient=False) as progress:
        task = progress.add_task(label, total=steps)
        handler = _StepCounter(progress, task)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            run()
        finally:
            logger.removeHandler(handler)
            logger.setLevel(old_level)
        progress.update(task, completed=steps, description="committed")


def upgrade(url: str, target: str = "head") -> int:
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    migrate.refuse_pre_release([current_revision(url)])
    try:
        plan = planned(url, target)
    except psycopg.Error:
        raise  # the database cannot be read: reported by the command line, nothing tried
    except Exception as e:  # relative targets (+1) and the like: Alembic still knows what to do
        from alembic.script import ScriptDirectory
        from alembic.util import CommandError
        if not re.search(r"[+-]\d+$", target):  # a revision that does not exist: say so rather than try
            try:
                ScriptDirectory.from_config(migrate.alembic_config(url)).get_revisions(target)
            except CommandError:
                raise
            except Exception:
                pass
        err.print(f"upgrading to {target} ({e.__class__.__name__}: cannot list the revisions first)")
        migrate.upgrade(url, target)
        return 0
    if not plan:
        print(f"already at {current_revision(url) or 'base'}: nothing to apply")
        return 0
    for rev, doc in plan:
        print(f"to apply: {rev}  {doc}")
    # Alembic runs every revision in one transaction (see alembic/env.py): all or nothing.
    _with_progress(len(plan), "migrating", lambda: migrate.upgrade(url, target))
    print(f"at {current_revision(url)}")
    return 0


def downgrade(url: str, target: str) -> int:
    before = current_revision(url)
    migrate.downgrade(url, target)
    print(f"{before or 'base'} -> {current_revision(url) or 'base'}")
    return 0
