"""A migration that would hold a long lock on a busy table is refused: squawk (PyPI squawk-cli,
installed in .venv by `make test`) lints every upgrade SQL file under alembic/versions/*/ and any
finding fails the test.

Linted: the SQL files a revision runs on upgrade, i.e. everything under alembic/versions/<rev>/
except <rev>/downgrade/. Downgrade files are not linted: they drop skiplock's objects on purpose
(squawk's ban-drop-table and friends would fire on every one), and a downgrade is an operator's
deliberate act, never part of a rolling deploy. SQL written inline in a revision's .py file is not
seen by this check: revisions keep their SQL in files beside them (frozen copies of schema/ plus
hand-written ALTERs), and those files are what is linted.

squawk runs with --assume-in-transaction, which is true: alembic/env.py runs the whole upgrade in
one transaction (transactional_ddl). squawk then knows that a table created in the same file is
new and empty, so the first revision's CREATE INDEX on its own new tables is not flagged, while
CREATE INDEX (without CONCURRENTLY) on an existing table in a later revision is. squawk looks at
one file at a time: create a table and its indexes in the same file (as schema/tables/*.sql do).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ROOT / "alembic" / "versions"
SQUAWK = Path(sys.executable).parent / "squawk"
PG_VERSION = "15.0"

# Rules left out, and why. Everything else squawk checks by default stays on.
EXCLUDED_RULES = {
    # Both want `SET lock_timeout` / `SET statement_timeout` at the top of every file. Our files are
    # byte-for-byte frozen copies of schema/ (which also builds test databases) and fire on every
    # CREATE FUNCTION and CREATE VIEW; timeouts belong to whoever runs `alembic upgrade`.
    "require-lock-timeout": "alembic/env.py sets lock_timeout (2 s, retried) for every run, not per frozen file",
    "require-statement-timeout": "same as require-lock-timeout",
    # Wants IF NOT EXISTS so that a half-run migration can be re-run. Ours never half-run: the
    # whole upgrade is one transaction (alembic/env.py, transactional_ddl=True).
    "prefer-robust-stmts": "the upgrade is one transaction: nothing is ever half-applied",
    # A style preference (int columns: priority, attempt, max_attempts), not a locking hazard.
    "prefer-bigint-over-int": "priority and attempt counts are integer by design; no lock involved",
}


def upgrade_sql_files() -> list[Path]:
    files = []
    for revision in sorted(p for p in VERSIONS.iterdir() if p.is_dir() and not p.name.startswith("__")):
        files += [f for f in sorted(revision.rglob("*.sql"))
                  if "downgrade" not in f.relative_to(revision).parts]
    return files


def squawk(paths: list[Path]) -> list[dict]:
    """squawk's findings for the files, as dicts (file, line, rule_name, message)."""
    if not SQUAWK.exists():
        pytest.fail(f"{SQUAWK} not found: install the test extras (pip install -e '.[test]', squawk-cli)")
    proc = subprocess.run(
        [str(SQUAWK), f"--pg-version={PG_VERSION}", "--assume-in-transaction", "--reporter", "json",
         f"--exclude={','.join(sorted(EXCLUDED_RULES))}", *map(str, paths)],
        capture_output=True, text=True, cwd=ROOT)
    try:
        findings = json.loads(proc.stdout or "[]")
    except json.JSONDecodeError:
        pytest.fail(f"squawk did not answer in JSON (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    assert (proc.returncode != 0) == bool(findings), (proc.returncode, proc.stderr)
    return findings


def test_every_upgrade_sql_file_passes_squawk():
    files = upgrade_sql_files()
    assert files, "no upgrade SQL files found under alembic/versions/*/"
    findings = squawk(files)
    report = "\n".join(f"{Path(f['file']).relative_to(ROOT)}:{f['line'] + 1}: {f['rule_name']}: {f['message']}"
                       for f in findings)
    assert not findings, f"squawk refuses these migration statements:\n{report}"
    print(f"\nsquawk: {len(files)} upgrade files clean (excluded rules: {', '.join(sorted(EXCLUDED_RULES))})")


BAD_MIGRATIONS = {
    # A volatile default rewrites the whole hot table under ACCESS EXCLUSIVE.
    "volatile_default.sql": ("ALTER TABLE queue.live_tasks ADD COLUMN x int NOT NULL DEFAULT random();\n",
                             "adding-field-with-default"),
    # A plain CREATE INDEX blocks every enqueue, take_next and finish until it is built.
    "blocking_index.sql": ("CREATE INDEX live_tasks_worker ON queue.live_tasks (worker);\n",
                           "require-concurrent-index-creation"),
    # Changing a column's type rewrites the table.
    "column_type.sql": ("ALTER TABLE queue.live_tasks ALTER COLUMN priority TYPE bigint;\n",
                        "changing-column-type"),
    # A new NOT NULL column without a default fails on a non-empty table, after waiting for its lock.
    "required_field.sql": ("ALTER TABLE queue.live_tasks ADD COLUMN y text NOT NULL;\n", "adding-required-field"),
    # A constraint validated in place scans the table under a lock that blocks writes.
    "check_constraint.sql": ("ALTER TABLE queue.live_tasks ADD CONSTRAINT live_tasks_p CHECK (priority > -100);\n",
                             "constraint-missing-not-valid"),
}


@pytest.mark.parametrize("name", sorted(BAD_MIGRATIONS))
def test_a_migration_that_locks_the_hot_table_is_flagged(name: str, tmp_path: Path):
    """The check can fail: a later revision's statements that would lock queue.live_tasks are flagged."""
    sql, rule = BAD_MIGRATIONS[name]
    path = tmp_path / "0099_bad" / "tables" / name
    path.parent.mkdir(parents=True)
    path.write_text(sql)
    rules = {f["rule_name"] for f in squawk([path])}
    assert rule in rules, f"squawk did not flag {sql.strip()!r} with {rule} (found {rules or 'nothing'})"


def test_the_first_revision_pattern_is_not_flagged(tmp_path: Path):
    """CREATE TABLE and its indexes in one file: the table is new, so the index is harmless."""
    path = tmp_path / "new_table.sql"
    path.write_text("CREATE TABLE queue.t (id bigint PRIMARY KEY, stage text NOT NULL);\n"
                    "CREATE INDEX t_stage ON queue.t (stage);\n")
    assert squawk([path]) == []


# -- docs/reliability.md stays true to the tests that produce it ---------------------------------
RELIABILITY_MD = ROOT / "docs" / "reliability.md"
RELIABILITY_MODULES = ["test_upgrade_under_load", "test_server_crash", "test_long_transaction", "test_enqueue_faults", "test_model_based",
                       "test_hostile_input", "test_migration_lint", "test_crashes", "test_concurrency",
                       "test_rotation_under_load", "test_compaction", "test_hot_table_bound",
                       "test_take_locked", "test_calendar", "test_client_bash_faults",
                       "test_admin_races", "test_clock_jump", "test_rate_limits", "test_take_stages",
                       "test_worker_faults", "test_web", "test_prometheus", "test_cli_ops", "test_consume"]


def test_reliability_doc_lists_every_reliability_test():
    """Every test docs/reliability.md names exists, and every test of its modules is named there."""
    import re
    text = RELIABILITY_MD.read_text()
    named = set(re.findall(r"`(?:tests/py/(\w+)\.py::)?(test_\w+)", text))
    defined: dict[str, set[str]] = {}
    for module in RELIABILITY_MODULES:
        source = (ROOT / "tests" / "py" / f"{module}.py").read_text()
        defined[module] = set(re.findall(r"^def (test_\w+)", source, re.M))
    all_defined = {t for tests in defined.values() for t in tests}
    unknown = sorted(t for m, t in named if t not in (defined.get(m, set()) if m else all_defined))
    assert not unknown, f"docs/reliability.md names tests that do not exist: {unknown}"
    named_tests = {t for _, t in named}
    missing = sorted(f"{m}::{t}" for m, tests in defined.items() for t in tests if t not in named_tests)
    assert not missing, f"tests missing from docs/reliability.md: {missing}"
