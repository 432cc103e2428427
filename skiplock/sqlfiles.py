"""Running skiplock's SQL files: the build order of schema/, and executing files verbatim.

Every file runs as the connecting user, in one transaction and one role: on a Citus coordinator
the DDL goes to the workers over Citus's own connections as the current user, and a `SET ROLE`
in between would open a second connection per node that neither sees the uncommitted roles and
schema nor shares the first one's locks (a distributed deadlock). After the files, TAKE_OWNERSHIP
hands every object of schema queue to skiplock_owner, so that it owns them and the SECURITY
DEFINER functions run with its rights, never with the rights of whoever ran the migration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

PACKAGE = Path(__file__).resolve().parent
# A checkout keeps schema/ and alembic/ beside the package; an installed wheel carries them inside it.
ROOT = PACKAGE if (PACKAGE / "schema").is_dir() else PACKAGE.parent
SCHEMA_DIR = ROOT / "schema"

# Build order: the server version check, roles and schema first, then what later files depend on.
BOOTSTRAP = ("bootstrap/server_version.sql", "bootstrap/roles.sql", "bootstrap/schema.sql")
KINDS = ("types", "tables", "functions", "views")


def sort_key(relpath: str) -> tuple[int, str]:
    """Where a file of schema/ goes in a build: bootstrap files first, then by kind, then by name."""
    if relpath in BOOTSTRAP:
        return (0, f"{BOOTSTRAP.index(relpath):03d}")
    kind = relpath.split("/", 1)[0]
    return (1 + KINDS.index(kind), relpath)


def schema_files(schema_dir: Path = SCHEMA_DIR) -> list[str]:
    """Every SQL file of schema/, as paths relative to it, in build order."""
    files = [p.relative_to(schema_dir).as_posix() for p in schema_dir.rglob("*.sql")]
    return sorted(files, key=sort_key)


# Gives skiplock_owner every object of schema queue the migrating user created (Alembic's
# version table stays its creator's). Grants move with the ownership: a grant made by the
# creator (or by a superuser, which PostgreSQL records as the owner's) becomes skiplock_owner's.
# Partitions, composite types and functions one by one: ALTER TABLE on a partitioned table does not
# recurse, and an identity's sequence follows its table.
TAKE_OWNERSHIP = """
DO $own$
DECLARE
    v_object record;
BEGIN
    FOR v_object IN
        SELECT pg_catalog.format('ALTER %s %s OWNER TO skiplock_owner',
                   CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                                  WHEN 'S' THEN 'SEQUENCE' WHEN 'c' THEN 'TYPE' ELSE 'TABLE' END,
                   c.oid::regclass) AS ddl
          FROM pg_catalog.pg_class c
         WHERE c.relnamespace = 'queue'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'c')
           AND c.relowner <> 'skiplock_owner'::regrole AND c.relname NOT LIKE 'skiplock\\_version%'
           AND (c.relkind <> 'S' OR NOT EXISTS (SELECT FROM pg_catalog.pg_depend d
                                                 WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                                                   AND d.deptype IN ('a', 'i')))
        UNION ALL
        SELECT pg_catalog.format('ALTER TYPE %s OWNER TO skiplock_owner', t.oid::regtype)
          FROM pg_catalog.pg_type t
         WHERE t.typnamespace = 'queue'::regnamespace AND t.typowner <> 'skiplock_owner'::regrole
           AND t.typtype IN ('e', 'd') AND t.typelem = 0
        UNION ALL
        SELECT pg_catalog.format('ALTER ROUTINE %s OWNER TO skiplock_owner', p.oid::regprocedure)
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'queue'::regnamespace AND p.proowner <> 'skiplock_owner'::regrole
    LOOP
        EXECUTE v_object.ddl;
    END LOOP;
END
$own$;
"""


def run_files(conn: Any, base: Path, files: Iterable[str]) -> None:
    """Execute each file as it is, inside the caller's transaction and as the connecting user,
    then hand what they created to skiplock_owner (TAKE_OWNERSHIP).

    conn is a psycopg 3 connection. Executing a query without parameters sends it verbatim
    (no placeholder parsing), so `%` and `:name` in function bodies reach PostgreSQL untouched.
    The files run with search_path pinned to pg_catalog, pg_temp for the transaction (the
    migrating role is often a superuser, and a schema others create in may be on its path: a
    shadowing operator or function would run with its rights); the caller's path is put back
    after them, for an embedding application's own revisions in the same transaction.
    """
    with conn.cursor() as cur:
        cur.execute("SELECT pg_catalog.current_setting('search_path')")
        caller_path = cur.fetchone()[0]
        cur.execute("SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true)")
        for rel in files:
            sql = (base / rel).read_text()
            try:
                cur.execute(sql)
            except Exception as e:
                e.add_note(f"while running {base / rel}")
                raise
        # After a downgrade to base there is no schema left to hand over.
        cur.execute("SELECT pg_catalog.to_regnamespace('queue') IS NOT NULL"
                    " AND pg_catalog.to_regrole('skiplock_owner') IS NOT NULL")
        row = cur.fetchone()
        if row is not None and row[0]:
            cur.execute(TAKE_OWNERSHIP)
        cur.execute("SELECT pg_catalog.set_config('search_path', %s, true)", (caller_path,))


def build_from_schema(conn: Any, schema_dir: Path = SCHEMA_DIR) -> None:
    """Build skiplock from schema/ directly (what migrations must reproduce)."""
    run_files(conn, schema_dir, schema_files(schema_dir))
