"""Connections for every command, and what a connection pooler between us and the server allows.

SKIPLOCK_POOLER (or `skiplock --pooler MODE …`, which sets it for the command and what it starts)
says what sits between the commands and PostgreSQL:
  none         a direct connection (the default)
  session      a pooler in session mode (PgBouncer pool_mode=session): a client keeps its server
               connection until it disconnects, so everything works as on a direct connection
  transaction  a pooler in transaction mode (PgBouncer pool_mode=transaction): each transaction may
               run on another server connection. Statements are never prepared on the server
               (psycopg prepares a statement run 5 times; the next transaction's server connection
               does not have it), and idle workers poll instead of LISTEN, whose notifications go
               to a server connection the client no longer holds. Commands that need a session of
               their own (run-sql) refuse to start.
A worker not told of a transaction pooler finds out when a statement it prepared is missing
(SQLSTATE 26000) and goes on as under transaction (detected_transaction_pooler()).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # psycopg is imported when a connection is made: the CLI parses its options without it
    import psycopg

POOLER_ENV = "SKIPLOCK_POOLER"
MODES = ("none", "session", "transaction")
CONNECT_TIMEOUT = 10   # seconds a connection attempt may take, unless the URL or PGCONNECT_TIMEOUT says


class PoolerError(ValueError):
    """SKIPLOCK_POOLER holds a value that is not one of MODES, or a command needs a session."""


def pooler() -> str:
    """The pooler mode from SKIPLOCK_POOLER: none (also when unset or empty), session or transaction."""
    mode = os.environ.get(POOLER_ENV, "").strip().lower() or "none"
    if mode not in MODES:
        raise PoolerError(f"{POOLER_ENV}={os.environ[POOLER_ENV]!r}: expected one of {', '.join(MODES)}")
    return mode


_detected = False  # a statement prepared on a connection went missing: see detected_transaction_pooler()


def detected_transaction_pooler() -> bool:
    """Say that a transaction pooler sits in between though SKIPLOCK_POOLER does not say so (a
    statement this process prepared went missing, SQLSTATE 26000): from now on this process
    connects as under SKIPLOCK_POOLER=transaction. True the first time (for one log line)."""
    global _detected
    first = not _detected and has_sessions()
    _detected = True
    return first


def has_sessions() -> bool:
    """Does session state (LISTEN, prepared statements, settings) stay with this client?"""
    return pooler() != "transaction" and not _detected


def require_session(command: str) -> None:
    """Refuse a command that needs a server session of its own under transaction pooling."""
    if not has_sessions():
        raise PoolerError(f"{command} needs a session of its own (it runs requests on its connection and "
                          f"cancels them by backend pid): connect it directly or through session pooling, "
                          f"not with {POOLER_ENV}=transaction")


def timeout_args(url: str) -> dict[str, Any]:
    """connect_timeout=CONNECT_TIMEOUT unless the URL or PGCONNECT_TIMEOUT sets one. An attempt that
    hangs (a host that drops packets, a server that accepts and never answers) then fails, and is
    retried where the caller retries; psycopg's own bound is 130 s. A URL that does not parse is
    left to the connection to report."""
    import psycopg
    try:
        given = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error:
        return {}
    return {} if "connect_timeout" in given or os.environ.get("PGCONNECT_TIMEOUT") else {"connect_timeout": CONNECT_TIMEOUT}


def connect(url: str, **kwargs: Any) -> psycopg.Connection:
    """psycopg.connect (autocommit unless told otherwise) within timeout_args' bound, with
    server-side prepares off under transaction pooling, and statement names of its own
    (unique_statement_names)."""
    import psycopg
    kwargs = {**timeout_args(url), **kwargs}
    kwargs.setdefault("autocommit", True)
    if not has_sessions():
        kwargs["prepare_threshold"] = None
    return unique_statement_names(psycopg.connect(url, **kwargs))


C = TypeVar("C", "psycopg.Connection", "psycopg.AsyncConnection")


def unique_statement_names(conn: C) -> C:
    """Start the names of the statements psycopg prepares on conn (_pg3_0, _pg3_1, … on every
    connection) at a random number: through a pooler in transaction mode that nobody announced, a
    name we prepared must never meet another client's statement of that name on a server
    connection, where it would run their statement with our parameters. psycopg has no public
    setting for the names; where its counter is not found, conn prepares nothing."""
    import secrets
    manager: Any = getattr(conn, "_prepared", None)
    if isinstance(getattr(manager, "_prepared_idx", None), int):
        manager._prepared_idx = secrets.randbelow(1 << 62)
    else:
        conn.prepare_threshold = None
    return conn


def listen(conn: psycopg.Connection, channel: str) -> bool:
    """LISTEN on channel where the connection keeps a session; whether it listens (else: poll)."""
    if not has_sessions():
        return False
    import psycopg.sql
    conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)), prepare=False)
    return True
