"""What runs outside a pinned function resolves nothing through a schema others create in (issue 54,
item 1): the migrations. The SQL tasks' executor has its own test in test_sql_tasks.py.

A role with CREATE on public (PostgreSQL 14's default) shadows, for the exact types, operators that
the migration's own statements compare (`relnamespace = 'queue'::regnamespace` is oid = regnamespace,
for which pg_catalog has no exact operator, so the shadow wins wherever public is on the path), and
logs each call. The superuser then migrates with public first on its path: not one call may run.
The operator's reads (skiplock/ops.py: `skiplock web`, the CLI verbs) and the exporter's queries
(contrib/postgres_exporter) run on the caller's own path: an exact `=` for the enum
queue.task_status, which a role with any skiplock role can make, must not run there either.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
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


@contextlib.contextmanager
def shadowing_login(db: str, prefix: str, shadows: list[tuple[str, str, str, str, str]],
                    member_of: str = "") -> Iterator[str]:
    """A login (a member of member_of, if given) with CREATE on public whose operators shadow, for
    the exact types (op, left, right), pg_catalog's (compared as l2 op r2) and log each call in a
    table of its own; yields the log table's name."""
    role = f"{prefix}_{uuid.uuid4().hex[:8]}"
    log = f"{prefix}_log"
    with psycopg.connect(db, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN" + (" IN ROLE " + member_of if member_of else ""))
                      .format(sql.Identifier(role)))
        admin.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(role)))
    try:
        with psycopg.connect(psycopg.conninfo.make_conninfo(db, user=role), autocommit=True) as c:
            c.execute(sql.SQL("CREATE TABLE public.{} (who text, what text)").format(sql.Identifier(log)))
            c.execute(sql.SQL("GRANT INSERT ON public.{} TO PUBLIC").format(sql.Identifier(log)))
            for n, (op, left, right, l2, r2) in enumerate(shadows):
                fn = f"{prefix}_{n}"
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
        with psycopg.connect(db, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.fixture
def attacker(empty_db: str) -> Iterator[str]:
    """A login with CREATE on public, its shadows in place; yields the log table's name."""
    with shadowing_login(empty_db, "sp_shadow", SHADOWED) as log:
        yield log


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


# The operator's reads (skiplock/ops.py, for `skiplock web` and the CLI verbs) and the exporter's
# queries run as a monitor, an admin or a superuser on its own search_path. queue.task_status is an
# enum: pg_catalog compares it only with anyenum's operators, so a role with USAGE on schema queue
# (any skiplock role) and CREATE on public makes an exact `=` and `<>` for it that win on any path
# holding public, pg_catalog first or not.
ENUM_SHADOWS = [(op, "queue.task_status", "queue.task_status", "text", "text") for op in ("=", "<>")]


@pytest.fixture
def enum_attacker(db: str) -> Iterator[str]:
    """A skiplock_producer login with CREATE on public and its enum shadows; yields the log table."""
    with shadowing_login(db, "sp_enum_shadow", ENUM_SHADOWS, member_of="skiplock_producer") as log:
        yield log


def exporter_queries() -> list[str]:
    """The SQL of each query in contrib/postgres_exporter/queries.yaml (`query: "…"` or `query: |` blocks)."""
    lines = (Path(__file__).resolve().parents[2] / "contrib" / "postgres_exporter" / "queries.yaml").read_text().splitlines()
    queries = []
    for n, line in enumerate(lines):
        head = line.strip()
        if head.startswith("query: |"):
            block = []
            for more in lines[n + 1:]:
                if more.strip() and len(more) - len(more.lstrip()) <= len(line) - len(line.lstrip()):
                    break
                block.append(more)
            queries.append("\n".join(block))
        elif head.startswith("query: \""):
            queries.append(head[len("query: \""):-1])
    return queries


def test_the_operators_reads_and_the_exporters_queries_run_no_operator_another_role_put_on_the_path(
        db: str, enum_attacker: str) -> None:
    from skiplock import ops
    stage = "sp.ops"
    with psycopg.connect(db, autocommit=True) as c:  # a superuser, its path "$user", public
        # Something for every status the reads compare: ready, running, error; done, fatal, cancelled within the minute.
        for _ in range(6):
            c.execute("SELECT queue.enqueue('{}', %s)", (stage,))
        c.execute("SELECT queue.configure_stage(%s, max_attempts => 5)", (stage,))
        taken = c.execute("SELECT id, lease FROM queue.take_next(%s, 4)", (stage,)).fetchall()
        c.execute("SELECT queue.finish(%s, %s)", taken[0])
        c.execute("SELECT queue.fail(%s, %s, 'boom', fatal => true)", taken[1])
        c.execute("SELECT queue.fail(%s, %s, 'again')", taken[2])
        c.execute("SELECT queue.cancel(%s)", (taken[3][0],))
        log = sql.Identifier(enum_attacker)
        # The control: an unqualified comparison of the enum with a literal runs the shadow on this path.
        c.execute("SELECT count(*) FROM queue.tasks t WHERE t.status = 'ready'")
        assert c.execute(sql.SQL("SELECT count(*) FROM public.{}").format(log)).fetchone()[0] > 0
        c.execute(sql.SQL("TRUNCATE public.{}").format(log))
        overview = {r["stage"]: r for r in ops.overview(c)}
        assert (overview[stage]["done_per_min"], overview[stage]["failed_per_min"],
                overview[stage]["cancelled_per_min"]) == (1, 1, 1), overview[stage]
        seen = {status: len(ops.tasks(c, stage, ops.Filters(status=status))[0])
                for status in ("live", "ready", "scheduled", "running", "error", "done", "fatal", "cancelled")}
        assert seen["ready"] == 2 and seen["error"] == 1 and seen["fatal"] == 1, seen
        assert ops.retry_where(c, stage) == 2  # the error task (live) and the fatal one
        c.execute("SELECT queue.take_next(%s)", (stage,))  # a running task at attempt 1 (the exporter's `<>`)
        queries = exporter_queries()
        assert len(queries) >= 3 and any("t.status" in q for q in queries), queries
        for query in queries:
            c.execute(query).fetchall()
        ran = c.execute(sql.SQL("SELECT who, what FROM public.{}").format(log)).fetchall()
    assert ran == [], ran
