"""Running skiplock's SQL files: the build order of schema/, and executing files verbatim.

Files under bootstrap/ create the roles and the schema and run as the connecting user; every
other file runs as skiplock_owner, so that skiplock_owner owns every object and the SECURITY
DEFINER functions run with its rights, never with the rights of whoever ran the migration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

PACKAGE = Path(__file__).resolve().parent
# A checkout keeps schema/ and alembic/ beside the package; an installed wheel carries them inside it.
ROOT = PACKAGE if (PACKAGE / "schema").is_dir() else PACKAGE.parent
SCHEMA_DIR = ROOT / "schema"

# Build order: roles and schema first, then what later files depend on.
BOOTSTRAP = ("bootstrap/roles.sql", "bootstrap/schema.sql")
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


def run_files(conn: Any, base: Path, files: Iterable[str]) -> None:
    """Execute each file as it is, inside the caller's transaction.

    conn is a psycopg 3 connection. Executing a query without parameters sends it verbatim
    (no placeholder parsing), so `%` and `:name` in function bodies reach PostgreSQL untouched.
    """
    with conn.cursor() as cur:
        for rel in files:
            sql = (base / rel).read_text()
            as_owner = "bootstrap" not in Path(rel).parts[:-1]  # schema/bootstrap/ or a revision's copy of it
            if as_owner:
                cur.execute("SET LOCAL ROLE skiplock_owner")
            try:
                cur.execute(sql)
            except Exception as e:
                e.add_note(f"while running {base / rel}")
                raise
            if as_owner:
                cur.execute("RESET ROLE")


def build_from_schema(conn: Any, schema_dir: Path = SCHEMA_DIR) -> None:
    """Build skiplock from schema/ directly (what migrations must reproduce)."""
    run_files(conn, schema_dir, schema_files(schema_dir))
