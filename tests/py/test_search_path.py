"""What runs outside a pinned function resolves nothing through a schema others create in (issue 54,
item 1): the migrations. The SQL tasks' executor has its own test in test_sql_tasks.py.

A role with CREATE on public (PostgreSQL 14's default) shadows, for the exact types, operators that
the migration's own statements compare (`relnamespace = 'queue'::regnamespace` is oid = regnamespace,
for which pg_catalog has no exact operator, so the shadow wins wherever public is on the path), and
logs each call. The superuser then migrates with public first on its path: not one call may run.
"""

from __future__ import annotations

import uuid
from typing import Iterator

import psycopg
import pytest
from psycopg import sql

from skiplock import migrate

# (operator, left, right, the types the shadow compares with pg_catalog's operator)
SHADOWED = [
    ("=", "oid", "regnamespace", "oid", "oid"), ("<>", "oid", "regrole", "oid", "oid"),
    ("=", "oid", "regclass", "oid", "oid"), ("=", '"char"', '"char"', '"char"', '"char"'),
    ("<>", "name", "name", "name", "name"), ("=", "name", "name", "name", "name"),
    ("=", "text", "text", "text", "text"), ("<", "int4", "int4", "int4", "int4"),
]


@pytest.fixture
def attacker(empty_db: str) -> Iterator[str]:
    """A login with CREATE on public, its shadows in place; yields the log table's name."""
    role = f"sp_attacker_{uuid.uuid4().hex[:8]}"
    log = "sp_shadow_log"
    with psycopg.connect(empty_db, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        admin.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(role)))
    try:
        with psycopg.connect(psycopg.conninfo.make_conninfo(empty_db, user=role), autocommit=True) as c:
            c.execute(sql.SQL("CREATE TABLE public.{} (who text, what text)").format(sql.Identifier(log)))
            c.execute(sql.SQL("GRANT INSERT ON public.{} TO PUBLIC").format(sql.Identifier(log)))
            for n, (op, left, right, l2, r2) in enumerate(SHADOWED):
                fn = f"sp_shadow_{n}"
                c.execute(sql.SQL(
                    "CREATE FUNCTION public.{fn}(a {l}, b {r}) RETURNS bool LANGUAGE sql AS $f$ "
                    "INSERT INTO public.{log} VALUES (current_user, {what}); "
                    "SELECT a::pg_catalog.{l2} OPERATOR(pg_catalog.{op}) b::pg_catalog.{r2} $f$").format(
                        fn=sql.Identifier(fn), l=sql.SQL(left), r=sql.SQL(right), log=sql.Identifier(log),
                        what=sql.Literal(f"{left} {op} {right}"), op=sql.SQL(op), l2=sql.SQL(l2), r2=sql.SQL(r2)))
                c.execute(sql.SQL("CREATE OPERATOR public.{op} (LEFTARG = {l}, RIGHTARG = {r}, FUNCTION = public.{fn})")
                          .format(op=sql.SQL(op), l=sql.SQL(left), r=sql.SQL(right), fn=sql.Identifier(fn)))
        yield log
    finally:
        with psycopg.connect(empty_db, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_migration_runs_no_operator_another_role_put_on_its_search_path(empty_db: str, attacker: str) -> None:
    on_path = psycopg.conninfo.make_conninfo(empty_db, options="-c search_path=public,pg_catalog")
    with psycopg.connect(on_path, autocommit=True) as c:
        # The control: on this path, an unqualified comparison of the superuser's runs the shadow.
        c.execute("SELECT count(*) FROM pg_catalog.pg_class c WHERE c.relnamespace = 'pg_catalog'::regnamespace")
        assert c.execute(sql.SQL("SELECT count(*) FROM public.{}").format(sql.Identifier(attacker))).fetchone()[0] > 0
        c.execute(sql.SQL("TRUNCATE public.{}").format(sql.Identifier(attacker)))
    # Base to the first revision, then on to head (the second run takes the queue tables first).
    migrate.upgrade(on_path, "0100")
    migrate.upgrade(on_path)
    with psycopg.connect(empty_db, autocommit=True) as c:
        assert c.execute("SELECT version_num FROM queue.skiplock_version").fetchone()[0] is not None
        ran = c.execute(sql.SQL("SELECT who, what FROM public.{}").format(sql.Identifier(attacker))).fetchall()
    assert ran == [], ran
