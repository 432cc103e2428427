"""`make test` as root from a checkout in a directory the postgres OS user cannot enter (/root, a
`mktemp -d`): the server runs as postgres, so whatever it executes or reads (the other majors'
server builds, pgTAP's files copied into them, data and socket directories) lives where it can
reach it (skiplock/devdb.py's CACHE), not in the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from dev import versions
from skiplock import devdb
from skiplock.sqlfiles import ROOT

# What the copy runs: the suite's cluster start (a migrated template, as `make test` makes it),
# then a cluster of another major from its npm build, with pgTAP from the files copied into it.
SCRIPT = """
import sys
from pathlib import Path
import psycopg
from dev import testdb, versions
from skiplock import devdb
from skiplock.sqlfiles import ROOT
assert ROOT == Path(sys.argv[1]), ROOT
print("cache", devdb.CACHE)
cluster = devdb.Cluster(durable=False).start()
try:
    print("template", testdb.prepare_template(cluster.url()))
finally:
    cluster.stop()
if sys.argv[2] != "none":
    cluster = devdb.Cluster(durable=False, bin_dir=versions.install(int(sys.argv[2]))).start()
    try:
        with psycopg.connect(cluster.url(), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pgtap")
            print("other major", int(conn.execute("SHOW server_version_num").fetchone()[0]) // 10000)
    finally:
        cluster.stop()
"""


@pytest.fixture
def private_checkout() -> Iterator[Path]:
    """This checkout's packages (skiplock, dev) copied into a mode-700 directory, its SQL beside it (links)."""
    if os.geteuid() != 0:
        pytest.skip("as root only: otherwise the server runs as the checkout's own user")
    private = Path(tempfile.mkdtemp(prefix="skiplock-private-"))
    assert private.stat().st_mode & 0o777 == 0o700
    checkout = private / "clone"
    try:
        for package in ("skiplock", "dev"):
            shutil.copytree(ROOT / package, checkout / package, ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("schema", "alembic", "alembic.ini"):
            (checkout / name).symlink_to(ROOT / name)
        yield checkout
    finally:
        shutil.rmtree(private, ignore_errors=True)


def test_the_suites_clusters_start_from_a_checkout_in_a_private_directory(private_checkout: Path):
    other = min(m for m in versions.BUILDS if m >= versions.MINIMUM and m != 15)
    if not (versions.bin_dir(other) / "postgres").exists() and shutil.which("npm") is None:
        other = 0  # no build and no npm: the Debian cluster alone
    env = {k: v for k, v in os.environ.items() if k not in ("SKIPLOCK_PG_CACHE", "PG_BIN")}
    env["PYTHONPATH"] = str(private_checkout)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(private_checkout), str(other or "none")],
                          cwd=private_checkout, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    said = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.startswith(("cache", "template")))
    assert not Path(said["cache"]).is_relative_to(private_checkout.parent), said
    if other:
        assert f"other major {other}" in proc.stdout, proc.stdout


def test_a_build_the_server_user_cannot_run_is_said_in_one_line(private_checkout: Path):
    """A server build where postgres cannot reach it (PG_BIN pointing into a private directory):
    the cluster start says so and what to change, not only initdb's "Permission denied"."""
    bindir = private_checkout / "bin"
    bindir.mkdir()
    for program in ("initdb", "pg_ctl", "postgres"):
        (bindir / program).symlink_to(devdb.pg_bin() / program)
    cluster = devdb.Cluster(durable=False, bin_dir=bindir)
    try:
        with pytest.raises(RuntimeError) as raised:
            cluster.start()
    finally:
        cluster.stop()
    first = str(raised.value).splitlines()[0]
    assert first == (f"the postgres OS user cannot run {bindir / 'initdb'}: put the server build where it can "
                     "enter every directory (SKIPLOCK_PG_CACHE or PG_BIN)"), str(raised.value)
