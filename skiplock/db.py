"""Small helpers over psycopg shared by the commands."""

from __future__ import annotations

from typing import Any

import psycopg


def one(cursor: psycopg.Cursor[Any]) -> tuple[Any, ...]:
    """The row of a statement that returns exactly one (`SELECT queue.finish(…)`): psycopg's
    fetchone() says "a row or None", and None here would be a bug, not a state to handle."""
    row = cursor.fetchone()
    if row is None:
        raise LookupError("the statement returned no row")
    return row
