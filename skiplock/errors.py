"""What went wrong with the database, in one line: the text of a `skiplock X: …` message.

Every command reports a database error through describe_error(); cli.main() catches the errors
that reportable() accepts and lets any other exception (a bug) end with its traceback.
"""

from __future__ import annotations

import psycopg

NOT_INSTALLED = ("3F000", "42P01", "42883")  # invalid_schema_name, undefined_table, undefined_function


def _migration_errors() -> tuple[type[BaseException], ...]:
    """Alembic's CommandError and SQLAlchemy's DBAPIError. Imported here, when an error is being
    described, because loading Alembic and SQLAlchemy costs every command (worker, enqueue, …)
    more than psycopg itself; only `upgrade` and `downgrade` need them."""
    try:
        from alembic.util import CommandError
        from sqlalchemy.exc import DBAPIError
    except ImportError:  # pragma: no cover
        return ()
    return (CommandError, DBAPIError)


def one_line(text: str, limit: int = 400) -> str:
    """text with its runs of whitespace (newlines too) made one space, cut to limit characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


def primary_message(e: BaseException) -> str:
    """The server's primary message with its SQLSTATE in front, else the exception's text."""
    if isinstance(e, psycopg.Error) and e.diag.message_primary:
        return (f"{e.sqlstate}: " if e.sqlstate else "") + e.diag.message_primary
    return str(e) or e.__class__.__name__


def reportable(e: BaseException) -> bool:
    """An error of the database or of a migration, which a command reports in one line (exit 1)."""
    return isinstance(e, (psycopg.Error, *_migration_errors()))


def describe_error(e: BaseException) -> str:
    """One line saying what went wrong with the database, for a `skiplock X: …` message."""
    command_error = _migration_errors()[:1]
    if command_error and isinstance(e, command_error):  # e.g. Alembic's "Can't locate revision identified by 'x'"
        return one_line(str(e))
    seen: set[int] = set()
    while not isinstance(e, psycopg.Error) and id(e) not in seen:  # SQLAlchemy (Alembic) wraps psycopg's errors
        seen.add(id(e))
        inner = getattr(e, "orig", None) or e.__cause__
        if inner is None:
            break
        e = inner
    if isinstance(e, psycopg.Error):
        primary = e.diag.message_primary if e.sqlstate else None
        if e.sqlstate is None:  # no server answer: a connection that failed or broke
            return "cannot reach the database: " + one_line(str(e).removeprefix("connection failed: "))
        if e.sqlstate in NOT_INSTALLED:
            return (f"skiplock is not installed in this database, or is older than this command ({primary}): "
                    "run `skiplock upgrade`")
        return f"{one_line(primary or str(e))} (SQLSTATE {e.sqlstate})"
    return one_line(f"{e.__class__.__name__}: {e}")


# What passes by waiting (a worker retries it with backoff): insufficient resources (53: disk or
# memory full, too many connections), a connection lost or refused (08, 57P01-03: the server shut
# down or restarts), a lock or statement timeout (55P03, 57014), a serialization failure or a
# deadlock (40001, 40P01), a prepared statement missing or already there (26000, 42P05: a pooler in
# transaction mode hands each transaction another server connection). Anything else the server
# answers (a revoked grant, skiplock missing, a bug) does not pass by waiting.
TRANSIENT_CLASSES = ("53", "08")
TRANSIENT_CODES = ("55P03", "57014", "40001", "40P01", "57P01", "57P02", "57P03", "26000", "42P05")
PREPARED_LOST = ("26000", "42P05")

# The server's reasons for refusing a connection that waiting does not change.
_REFUSED = ("password authentication failed", "no pg_hba.conf entry", "authentication failed",
            "does not exist", "permission denied for database", "pg_hba.conf rejects")


def transient(e: BaseException) -> bool:
    """Does e pass by waiting (see TRANSIENT_CLASSES)? A connection that failed or broke without a
    server answer does, unless the server refused the login (refused_login)."""
    if not isinstance(e, psycopg.Error):
        return False
    state = e.sqlstate
    if state is None:
        return isinstance(e, psycopg.OperationalError) and not refused_login(e)
    return state.startswith(TRANSIENT_CLASSES) or state in TRANSIENT_CODES


def refused_login(e: BaseException) -> bool:
    """Did the server refuse the login itself (password, pg_hba.conf, a missing role or database)?"""
    if isinstance(e, psycopg.Error) and e.sqlstate is not None:
        return e.sqlstate.startswith("28") or e.sqlstate == "3D000"
    text = str(e)
    return isinstance(e, psycopg.OperationalError) and any(r in text for r in _REFUSED)


def prepared_lost(e: BaseException) -> bool:
    """A statement psycopg prepared is missing, already there, or another statement of the same
    name (08P01: "bind message supplies 3 parameters, but prepared statement … requires 1") on the
    server connection: a pooler in transaction mode sits between us and the server."""
    if not isinstance(e, psycopg.Error):
        return False
    return e.sqlstate in PREPARED_LOST or (
        e.sqlstate == "08P01" and "prepared statement" in (e.diag.message_primary or ""))
