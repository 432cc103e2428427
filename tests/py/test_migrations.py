"""schema/ is the source of truth; the migrations must ship exactly it."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Iterator

import psycopg
import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory

from dev import revision
from dev.testrun import create_database, drop_database
from skiplock import migrate
from skiplock.sqlfiles import ROOT, build_from_schema, run_files, sort_key

# Everything a DBA or a caller can observe about schema queue, minus Alembic's own version table.
CATALOG_QUERIES = {
    "schema": """
        SELECT n.nspname, pg_get_userbyid(n.nspowner), n.nspacl::text, obj_description(n.oid, 'pg_namespace')
          FROM pg_namespace n WHERE n.nspname = 'queue'""",
    "functions": """
        SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid), p.proacl::text,
               p.proconfig::text, p.prosecdef, p.provolatile, pg_get_userbyid(p.proowner),
               obj_description(p.oid, 'pg_proc')
          FROM pg_proc p WHERE p.pronamespace = 'queue'::regnamespace""",
    "relations": """
        SELECT c.relname, c.relkind, c.relpersistence, c.relispartition, pg_get_userbyid(c.relowner),
               c.relacl::text, obj_description(c.oid, 'pg_class'),
               pg_get_expr(c.relpartbound, c.oid), pg_get_partkeydef(c.oid), c.reloptions::text
          FROM pg_class c
         WHERE c.relnamespace = 'queue'::regnamespace AND c.relname NOT LIKE 'skiplock_version%'""",
    "columns": """
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               a.attidentity, pg_get_expr(d.adbin, d.adrelid), col_description(c.oid, a.attnum)
          FROM pg_class c
          JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
          LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
         WHERE c.relnamespace = 'queue'::regnamespace AND c.relname NOT LIKE 'skiplock_version%'""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
          FROM pg_constraint WHERE connamespace = 'queue'::regnamespace
           AND conrelid::regclass::text NOT LIKE 'queue.skiplock_version%'""",
    "indexes": """
        SELECT indexname, indexdef FROM pg_indexes
         WHERE schemaname = 'queue' AND tablename <> 'skiplock_version'""",
    "views": """
        SELECT viewname, definition FROM pg_views WHERE schemaname = 'queue'""",
    "types": """
        SELECT t.typname, t.typtype, pg_get_userbyid(t.typowner), obj_description(t.oid, 'pg_type'),
               (SELECT array_agg(e.enumlabel ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = t.oid)::text
          FROM pg_type t
         WHERE t.typnamespace = 'queue'::regnamespace AND t.typtype IN ('e', 'd', 'c')
           AND NOT EXISTS (SELECT FROM pg_class c WHERE c.reltype = t.oid)""",
    "data": """
        SELECT stage, lease_duration::text, max_attempts, backoff, backoff_base::text, backoff_cap::text,
               backoff_jitter, notify FROM queue.stage_settings""",
}


def undated(value: object) -> object:
    """The build creates history partitions for the day it runs (history_20261122, bounds
    '2026-11-22 …', comments): two builds either side of midnight must still compare equal."""
    if not isinstance(value, str):
        return value
    value = re.sub(r"history_\d{8,10}", "history_<dated>", value)
    value = re.sub(r"'\d{4}-\d{2}-\d{2}[^']*'", "'<date>'", value)
    return re.sub(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}", "<date>", value)  # partitions' comments


def catalog(url: str) -> dict[str, list[tuple]]:
    with psycopg.connect(url) as conn:
        exists = conn.execute("SELECT to_regclass('queue.stage_settings') IS NOT NULL").fetchone()[0]
        return {name: sorted((tuple(undated(v) for v in row) for row in conn.execute(q).fetchall()), key=repr)
                for name, q in CATALOG_QUERIES.items() if exists or name != "data"}


def assert_same_catalog(got: dict, want: dict) -> None:
    for name in want:
        extra = [r for r in got[name] if r not in want[name]]
        missing = [r for r in want[name] if r not in got[name]]
        assert not extra and not missing, (
            f"{name} differ between the migrated database and schema/:\n"
            f"  only in migrated: {extra}\n  only in schema/: {missing}")


@pytest.fixture(scope="module")
def db(empty_db: str) -> str:
    """Built by `alembic upgrade head` here, not copied from the session's template: what the
    migrations build is what this module proves."""
    migrate.upgrade(empty_db)
    return empty_db


@pytest.fixture(scope="module")
def schema_db(admin_url: str):
    """A database built straight from schema/."""
    url = create_database(admin_url, "from_schema")
    with psycopg.connect(url) as conn:
        build_from_schema(conn)
    yield url
    drop_database(admin_url, url)


def test_revisions_form_one_linear_history():
    script = ScriptDirectory.from_config(migrate.alembic_config("postgresql://unused"))
    assert len(script.get_heads()) == 1, "more than one head: merge or re-parent the revisions"
    for rev in script.walk_revisions():
        assert not rev.is_merge_point, f"revision {rev.revision} is a merge point"


def test_every_schema_file_is_shipped_by_a_revision():
    pending = revision.unshipped() + revision.removed()
    assert not pending, f"unshipped change in schema/: {pending}; run make revision m=\"…\""


def test_a_revision_that_removes_a_file_retires_its_frozen_copy(tmp_path):
    first, second = tmp_path / "0001_a", tmp_path / "0002_b"
    for path, text in [(first / "functions/kept.sql", "kept"), (first / "functions/gone.sql", "gone"),
                       (second / "alter/drop_functions/gone.sql", "DROP"),
                       (second / "downgrade/functions/gone.sql", "gone")]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert sorted(revision.latest_frozen([("0001", first), ("0002", second)])) == ["functions/kept.sql"]


def test_upgrade_head_builds_exactly_what_schema_describes(db: str, schema_db: str):
    assert_same_catalog(catalog(db), catalog(schema_db))


def test_upgrade_downgrade_upgrade_round_trips(admin_url: str, schema_db: str):
    url = create_database(admin_url, "round_trip")
    try:
        migrate.upgrade(url)
        migrate.downgrade(url, "base")
        leftovers = catalog(url)
        assert all(not rows for name, rows in leftovers.items() if name != "schema"), \
            f"downgrade to base left objects behind: { {k: v for k, v in leftovers.items() if v and k != 'schema'} }"
        migrate.upgrade(url)
        assert_same_catalog(catalog(url), catalog(schema_db))
    finally:
        drop_database(admin_url, url)


def build_frozen(url: str, chain: list[tuple[str, Path]]) -> bool:
    """Rebuild schema queue of url from the frozen copies the history up to chain[-1] leaves, as
    build_from_schema builds schema/; False (nothing built) when a table or type of that state
    exists only as an ALTER (its text recorded by digest, no copy): the state then has no build."""
    frozen, digests = revision.latest_frozen(chain), revision.latest_digests(chain)
    if any(rel not in frozen or hashlib.sha256(frozen[rel].read_bytes()).hexdigest() != d
           for rel, d in digests.items()):
        return False
    with psycopg.connect(url) as conn:
        conn.execute("DROP SCHEMA IF EXISTS queue CASCADE")
        run_files(conn, revision.VERSIONS,
                  [frozen[rel].relative_to(revision.VERSIONS).as_posix() for rel in sorted(frozen, key=sort_key)])
    return True


def enum_labels_kept(got: dict, want: dict) -> dict:
    """got, less the enum labels a downgrade cannot remove (PostgreSQL has no ALTER TYPE … DROP
    VALUE; 0110's downgrade keeps 'waiting', unused): an enum of got whose labels hold want's, in
    their order, is counted as want's."""
    wanted = {row[0]: row for row in want["types"] if row[1] == "e"}
    types = []
    for row in got["types"]:
        w = wanted.get(row[0])
        if w is not None and row[:4] == w[:4] and row[4] != w[4]:
            kept = iter(row[4].strip("{}").split(","))
            if all(label in kept for label in w[4].strip("{}").split(",")):  # a subsequence
                row = w
        types.append(row)
    return dict(got, types=types)


def test_downgrade_step_by_step_reaches_each_revision_as_its_frozen_files_build_it(admin_url: str):
    """head → each earlier revision → base, one revision at a time: each state equals a build of
    that revision's frozen files (or, where a table exists only as an ALTER, a database upgraded
    straight to that revision)."""
    chain = revision.revisions()
    url, ref = create_database(admin_url, "step_down"), create_database(admin_url, "step_ref")
    try:
        migrate.upgrade(url)
        for i in range(len(chain) - 2, -1, -1):
            rev = chain[i][0]
            migrate.downgrade(url, rev)
            if not build_frozen(ref, chain[:i + 1]):
                with psycopg.connect(ref, autocommit=True) as conn:
                    conn.execute("DROP SCHEMA IF EXISTS queue CASCADE")
                migrate.upgrade(ref, rev)
            got, want = enum_labels_kept(catalog(url), catalog(ref)), catalog(ref)
            try:
                assert_same_catalog(got, want)
            except AssertionError as e:
                raise AssertionError(f"downgrade {chain[i + 1][0]} → {rev}: {e}") from None
        migrate.downgrade(url, "base")
        leftovers = catalog(url)
        assert all(not rows for name, rows in leftovers.items() if name != "schema"), leftovers
    finally:
        drop_database(admin_url, url)
        drop_database(admin_url, ref)


def test_concurrent_upgrades_do_not_interleave(admin_url: str, schema_db: str):
    url = create_database(admin_url, "concurrent")
    try:
        # Separate processes, as three CI jobs would run them (Alembic's API is not thread-safe).
        procs = [subprocess.Popen([sys.executable, "-m", "skiplock", "--db", url, "upgrade"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for _ in range(3)]
        outputs = [p.communicate(timeout=120)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], outputs
        with psycopg.connect(url) as conn:
            versions = conn.execute("SELECT version_num FROM queue.skiplock_version").fetchall()
        assert len(versions) == 1
        assert_same_catalog(catalog(url), catalog(schema_db))
    finally:
        drop_database(admin_url, url)


def test_alembic_current_reports_the_head_and_changes_nothing(db: str):
    heads = ScriptDirectory.from_config(Config(str(ROOT / "alembic.ini"))).get_heads()
    before = catalog(db)
    proc = subprocess.run([str(Path(sys.executable).parent / "alembic"), "-x", f"url={db}", "current"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"{heads[0]} (head)" in proc.stdout, proc.stdout + proc.stderr
    assert_same_catalog(catalog(db), before)


def test_version_table_lives_in_schema_queue(db: str):
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT to_regclass('queue.skiplock_version') IS NOT NULL").fetchone()[0]
        assert conn.execute("SELECT to_regclass('public.alembic_version') IS NULL").fetchone()[0]


def shipped_sources() -> set[str]:
    """What the wheel must carry: every file of schema/ and of alembic/ that a migration reads."""
    files = {f"schema/{p.relative_to(ROOT / 'schema').as_posix()}" for p in (ROOT / "schema").rglob("*.sql")}
    alembic_dir = ROOT / "alembic"
    files |= {f"alembic/{p.relative_to(alembic_dir).as_posix()}" for p in alembic_dir.rglob("*")
              if p.is_file() and "__pycache__" not in p.parts}
    return files


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # From a copy: setuptools reuses a checkout's build/ directory, whose stale files would hide a
    # file missing from the package list.
    source, out = tmp_path_factory.mktemp("source") / "skiplock", tmp_path_factory.mktemp("wheel")
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".pg", "build", "*.egg-info", "__pycache__", "out", "node_modules"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
                    "-w", str(out), str(source)], check=True, cwd=out, timeout=300)
    return next(out.glob("skiplock-*.whl"))


def test_wheel_carries_every_schema_and_migration_file(wheel: Path):
    with zipfile.ZipFile(wheel) as z:
        carried = {n.removeprefix("skiplock/") for n in z.namelist()
                   if n.startswith(("skiplock/schema/", "skiplock/alembic/"))}
    missing, extra = sorted(shipped_sources() - carried), sorted(carried - shipped_sources())
    assert not missing and not extra, (
        f"{len(missing)} files missing from the wheel, such as {missing[:5]}; "
        f"{len(extra)} only in the wheel, such as {extra[:5]}")


# The harness (dev/): make test, lint, revision, the other majors, Citus. No `skiplock` command reaches it.
HARNESS = {"testrun", "testdb", "versions", "citus", "lint", "revision"}


def test_wheel_holds_only_the_user_facing_modules_and_the_migrations(wheel: Path):
    """The installed package is what users run: the modules of skiplock/ (each reached by a command,
    tests/py/test_python_layout.py), schema/ and alembic/ inside it, the dashboard's templates and
    static files (skiplock/web_assets/, exactly those in the checkout), the metadata; no harness, no tests."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    modules = {n.removeprefix("skiplock/").removesuffix(".py") for n in names
               if n.startswith("skiplock/") and n.count("/") == 1}
    assert modules == {p.stem for p in (ROOT / "skiplock").glob("*.py")}
    assert modules & HARNESS == set() and {"cli", "migrate", "sqlfiles", "devdb", "worker"} <= modules
    assets = {n for n in names if n.startswith("skiplock/web_assets/") and not n.endswith("/")}
    assert assets == {f"skiplock/{p.relative_to(ROOT / 'skiplock').as_posix()}"
                      for p in (ROOT / "skiplock" / "web_assets").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    others = [n for n in names if not n.startswith(("skiplock/schema/", "skiplock/alembic/", "skiplock-"))
              and not (n.startswith("skiplock/") and n.count("/") == 1) and n not in assets]
    assert others == [], f"the wheel holds more than the package and its migrations: {others[:10]}"
    assert all(".dist-info/" in n for n in names if n.startswith("skiplock-"))


def test_installed_wheel_upgrades_a_database_to_what_schema_describes(
        wheel: Path, admin_url: str, schema_db: str, tmp_path: Path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
                    "--target", str(site), str(wheel)], check=True, timeout=300)
    # Run from outside the checkout, with the installed copy first on the path.
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("DATABASE_URL", None)
    where = subprocess.run([sys.executable, "-c", "import skiplock.sqlfiles as s; print(s.ROOT)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where) == site / "skiplock", f"skiplock read its SQL from {where}, not from the installed wheel"
    url = create_database(admin_url, "from_wheel")
    try:
        proc = subprocess.run([sys.executable, "-m", "skiplock", "--db", url, "upgrade"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert_same_catalog(catalog(url), catalog(schema_db))
    finally:
        drop_database(admin_url, url)


def test_a_later_revision_ships_only_what_changed_and_points_back_for_its_downgrade(tmp_path, monkeypatch):
    versions, schema = tmp_path / "versions", tmp_path / "schema"
    shutil.copytree(ROOT / "alembic" / "versions", versions, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "schema", schema)
    monkeypatch.setattr(revision, "VERSIONS", versions)
    monkeypatch.setattr(revision, "SCHEMA_DIR", schema)
    (schema / "functions" / "take_next.sql").write_text((schema / "functions" / "take_next.sql").read_text() + "-- x\n")
    (schema / "functions" / "brand_new.sql").write_text("SELECT 1;\n")
    head = revision.revisions()[-1][1].name  # the latest revision, which the new one follows
    number = f"{int(head[:4]) + 1:04d}"
    shipped_in = [d.name for _, d in revision.revisions() if (d / "functions" / "take_next.sql").exists()][-1]
    directory = revision.make_revision("claim position\nkept  simple, and a message longer than forty characters")
    assert directory is not None and directory.name == f"{number}_claim_position_kept_simple_and_a_message"
    text = (versions / f"{number}_claim_position_kept_simple_and_a_message.py").read_text()
    assert text.splitlines()[0] == '"""claim position kept simple, and a message longer than forty characters'
    copies = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*.sql"))
    assert copies == ["downgrade/drop/functions/brand_new.sql", "functions/brand_new.sql", "functions/take_next.sql"]
    assert f"'{shipped_in}/functions/take_next.sql'" in text.split("DOWNGRADE =")[1], text
    assert revision.unshipped() == [] and revision.removed() == []


def test_the_baseline_is_not_rewritten_once_a_revision_follows_it(tmp_path, monkeypatch):
    versions = tmp_path / "versions"
    shutil.copytree(ROOT / "alembic" / "versions", versions, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(revision, "VERSIONS", versions)
    monkeypatch.setattr(revision, "RELEASES", {})  # as before 0.1.0: the other guard
    head = revision.revisions()[-1][0]  # a revision after the head, whatever the history holds
    (versions / "9999_x.py").write_text(f"revision = '9999'\ndown_revision = '{head}'\n")
    with pytest.raises(SystemExit, match="revisions after the baseline"):
        revision.make_baseline()
    monkeypatch.setattr(revision, "RELEASES", {"0.1.0": "0100"})
    with pytest.raises(SystemExit, match="never rewritten"):
        revision.make_baseline()


def test_a_database_from_the_pre_release_history_is_refused_in_one_line(admin_url: str):
    url = create_database(admin_url, "pre_release")
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA queue")
            conn.execute("CREATE TABLE queue.skiplock_version (version_num varchar(32) PRIMARY KEY)")
            conn.execute("INSERT INTO queue.skiplock_version VALUES ('0029')")
        proc = subprocess.run([sys.executable, "-m", "skiplock", "--db", url, "upgrade"],
                              capture_output=True, text=True, timeout=120)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out
        assert "Traceback" not in out, out
        assert "pre-release history" in out and "DROP SCHEMA queue CASCADE" in out, out
    finally:
        drop_database(admin_url, url)


def copy_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """alembic/versions and schema/ copied under tmp_path, and dev.revision pointed at the copies."""
    versions, schema = tmp_path / "versions", tmp_path / "schema"
    shutil.copytree(ROOT / "alembic" / "versions", versions, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "schema", schema)
    monkeypatch.setattr(revision, "VERSIONS", versions)
    monkeypatch.setattr(revision, "SCHEMA_DIR", schema)
    return versions, schema


def listed(py: Path, name: str) -> list[str]:
    found = re.search(rf"^{name} = (\[.*?\])$", py.read_text(), re.M | re.S)
    assert found, f"{py} has no {name}"
    return eval(found.group(1))  # noqa: S307 - a list of strings the generator wrote


def test_a_changed_table_ships_its_alter_and_no_copy_of_the_table(tmp_path, monkeypatch):
    """A revision stores only files it runs: the table's text is recorded by digest (ALTERED)."""
    versions, schema = copy_history(tmp_path, monkeypatch)
    table = schema / "tables" / "schedules.sql"
    table.write_text(table.read_text() + "-- changed\n")
    directory = revision.make_revision("schedules change")
    assert directory is not None
    copies = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*.sql"))
    assert copies == ["alter/tables/schedules.sql", "downgrade/alter/tables/schedules.sql"]
    assert revision.altered(directory) == {"tables/schedules.sql": hashlib.sha256(table.read_bytes()).hexdigest()}
    assert revision.unshipped() == [] and revision.removed() == []
    # No build from frozen files reaches that state (the step-by-step test upgrades straight to it).
    assert not build_frozen("postgresql://unused", revision.revisions())
    table.write_text(table.read_text() + "-- again\n")
    assert revision.unshipped() == ["tables/schedules.sql"]


def test_the_signature_of_a_routine_is_read_from_its_create_statement():
    text = """-- f(a int): CREATE FUNCTION queue.not_this(x int) in a comment
CREATE OR REPLACE FUNCTION queue.f(id bigint, lease uuid, at timestamp with time zone DEFAULT now(),
                                   VARIADIC tags text[] DEFAULT '{a,b}', OUT n integer)
    RETURNS integer LANGUAGE sql AS $$ SELECT 1 $$;
CREATE PROCEDURE queue.p() LANGUAGE sql AS $$ SELECT 1 $$;"""
    assert revision.routines(text) == {
        "queue.f(bigint, uuid, timestamp with time zone, variadic text[])":
            ("FUNCTION", "id,lease,at,tags", "2", "n integer", "returns integer"),
        "queue.p()": ("PROCEDURE", "", "0", "", ""),
    }


def test_a_changed_signature_gets_a_generated_drop_and_its_reverse(tmp_path, monkeypatch):
    """The old form is dropped before the new copy runs, the new form before the downgrade's copy:
    schema/ needs no DROP FUNCTION of an old signature."""
    versions, schema = copy_history(tmp_path, monkeypatch)
    f = schema / "functions" / "release.sql"
    old = revision.routines(f.read_text())
    f.write_text(f.read_text().replace("stage text DEFAULT NULL)", "stage text DEFAULT NULL, why text DEFAULT NULL)"))
    # A changed body, same signature: nothing dropped.
    g = schema / "functions" / "retry.sql"
    g.write_text(g.read_text() + "-- body only\n")
    directory = revision.make_revision("release says why")
    assert directory is not None
    (sig,) = [s for s in old if s.startswith("queue.release(")]
    assert sig.endswith("(bigint, uuid, interval, text)")
    assert f"DROP ROUTINE IF EXISTS {sig};" in (directory / "signature/functions/release.sql").read_text()
    back = (directory / "downgrade/signature/functions/release.sql").read_text()
    assert "DROP ROUTINE IF EXISTS queue.release(bigint, uuid, interval, text, text);" in back
    assert not (directory / "signature/functions/retry.sql").exists()
    py = directory.with_suffix(".py")
    up, down = listed(py, "UPGRADE"), listed(py, "DOWNGRADE")
    name = directory.name
    assert up.index(f"{name}/signature/functions/release.sql") == up.index(f"{name}/functions/release.sql") - 1
    at = down.index(f"{name}/downgrade/signature/functions/release.sql")
    assert down[at + 1].endswith("/functions/release.sql") and not down[at + 1].startswith(name)


@pytest.fixture(scope="module")
def squashed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`make release --dry-run` of the next release: alembic/ copied with its versions squashed.
    Right after a cut (no revision follows the last release) the last release is made again from
    the one before it, as if it were not recorded: the generator must build it the same way."""
    releases = revision.RELEASES
    if revision.revisions()[-1][0] == list(releases.values())[-1]:
        revision.RELEASES = dict(list(releases.items())[:-1])
    try:
        directory = revision.make_release("99.0.0", dry_run=True)
        assert directory is not None
        script = tmp_path_factory.mktemp("alembic") / "alembic"
        shutil.copytree(ROOT / "alembic", script, ignore=shutil.ignore_patterns("__pycache__", "versions"))
        shutil.copytree(directory.parent, script / "versions")
        shutil.rmtree(directory.parent.parent)  # the dry run's temporary copy
        yield script
    finally:
        revision.RELEASES = releases


def test_a_release_squashes_the_unreleased_revisions_into_one(squashed: Path):
    versions = squashed / "versions"
    release_head = list(revision.RELEASES.values())[-1]
    pys = sorted(p.stem for p in versions.glob("*.py"))
    kept = [d.name for r, d in revision.revisions() if int(r) <= int(release_head)]
    assert pys[:-1] == kept and len(pys) == len(kept) + 1, pys
    py = versions / f"{pys[-1]}.py"
    assert f"down_revision = '{release_head}'" in py.read_text()
    up, down = listed(py, "UPGRADE"), listed(py, "DOWNGRADE")
    for entry in up + down:
        assert (versions / entry).is_file(), f"{entry} is listed but not written"
    # Only files it runs: no copy of a table or type beside the ALTERs that bring them up to date.
    assert not list((versions / pys[-1]).glob("tables/*.sql")) or all(
        f"{pys[-1]}/tables/{p.name}" in up for p in (versions / pys[-1]).glob("tables/*.sql"))
    # The hand-written ALTERs of the squashed revisions, types, tables, the others, each in the
    # order they ran (the revision they came from names their folder).
    # (None when no squashed revision has one: the first revisions after a release may alter no table.)
    carried = [e.split("/alter/", 1)[1].split("/") for e in up if "/alter/" in e]
    kinds = ["types", "tables"]
    altering = any(any(d.glob("alter/**/*.sql")) for r, d in revision.revisions() if int(r) > int(release_head))
    assert bool(carried) == altering
    assert carried == sorted(carried, key=lambda e: (kinds.index(e[1]) if e[1] in kinds else 2, e[0]))


def squashed_config(script: Path, url: str) -> Config:
    cfg = migrate.alembic_config(url)
    cfg.set_main_option("script_location", str(script))
    return cfg


def test_the_squashed_history_builds_schema_and_downgrades_to_the_last_release(
        squashed: Path, admin_url: str, schema_db: str):
    from alembic import command
    release_head = list(revision.RELEASES.values())[-1]
    chain = [(r, d) for r, d in revision.revisions() if int(r) <= int(release_head)]
    url, ref = create_database(admin_url, "squashed"), create_database(admin_url, "squashed_ref")
    try:
        command.upgrade(squashed_config(squashed, url), "head")
        assert_same_catalog(catalog(url), catalog(schema_db))
        command.downgrade(squashed_config(squashed, url), release_head)
        if not build_frozen(ref, chain):  # a release's tables exist only as ALTERs: its own upgrade builds it
            command.upgrade(migrate.alembic_config(ref), release_head)
        assert_same_catalog(enum_labels_kept(catalog(url), catalog(ref)), catalog(ref))
        command.downgrade(squashed_config(squashed, url), "base")
        assert all(not rows for name, rows in catalog(url).items() if name != "schema")
    finally:
        drop_database(admin_url, url)
        drop_database(admin_url, ref)


def test_a_database_at_a_squashed_revision_is_refused_in_one_line(admin_url: str, monkeypatch):
    from alembic.util import CommandError
    monkeypatch.setattr(migrate, "SQUASHED", {"0.2.0": ("0101", "0110", "0100")})
    url = create_database(admin_url, "squashed_id")
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA queue")
            conn.execute("CREATE TABLE queue.skiplock_version (version_num varchar(32) PRIMARY KEY)")
            conn.execute("INSERT INTO queue.skiplock_version VALUES ('0105')")
        with pytest.raises(CommandError) as e:
            migrate.upgrade(url)
        assert "\n" not in str(e.value)
        assert "revision 0105, never released: 0.2.0 replaced it" in str(e.value)
        assert "skiplock downgrade 0100" in str(e.value) and "DROP SCHEMA queue CASCADE" in str(e.value)
    finally:
        drop_database(admin_url, url)


def test_schema_keeps_no_drop_of_an_old_signature():
    """The generator writes the DROP ROUTINE of a changed signature into the revision (signature/),
    and the release squashes them: schema/ describes what is, and keeps no DROP of what was."""
    found = [str(f.relative_to(ROOT)) for f in (ROOT / "schema").rglob("*.sql")
             if re.search(r"^\s*DROP\s+(FUNCTION|ROUTINE|PROCEDURE)\b", f.read_text(), re.M | re.I)]
    assert not found, f"hand-kept DROPs in schema/ (make revision writes them): {found}"
