"""Citus for the tests: build it from ../shared/citus/ when it is not installed, and run a
coordinator with two workers as throwaway clusters (skiplock.devdb.Cluster each).

`make test-citus` builds Citus when `citus.so` is absent (Debian's build dependencies first,
installed only when missing), then runs tests/py/test_citus.py, which starts its own
coordinator and workers. `make test` runs that file when Citus is installed and prints one line
saying it skipped it when not. Nothing here is queue logic: the distribution itself is
`skiplock distribute` (queue.distribute()).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg

from skiplock import devdb
from skiplock.sqlfiles import ROOT

# The source and its build note (../shared/citus/README.md); SKIPLOCK_CITUS_SOURCE overrides.
SOURCE_DIR = Path(os.environ.get("SKIPLOCK_CITUS_SOURCE") or ROOT.parent / "shared" / "citus")
VERSION = "13.2.2"
TARBALL = f"citus-{VERSION}.tar.gz"
# Debian 15.20's headers export have_createdb_privilege, which v13.2.2 defines as static.
PATCH = f"citus-{VERSION}-pg15.20.patch"
APT_PACKAGES = ("postgresql-server-dev-15", "libcurl4-openssl-dev", "liblz4-dev", "libzstd-dev",
                "libkrb5-dev", "libssl-dev", "libselinux1-dev", "libxslt1-dev", "libpam0g-dev",
                "libreadline-dev", "autoconf", "flex", "bison")
TEST_FILE = "tests/py/test_citus.py"
WORKERS = 2


def pg_config() -> str:
    """The pg_config of the server the tests run (Debian's 15 unless PG_BIN says otherwise)."""
    beside = devdb.pg_bin() / "pg_config"
    return str(beside) if beside.exists() else (shutil.which("pg_config") or "pg_config")


def installed() -> bool:
    """Whether citus.so is in the test server's library directory."""
    try:
        libdir = subprocess.run([pg_config(), "--pkglibdir"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return False
    return (Path(libdir) / "citus.so").exists()


def _apt_install(packages: tuple[str, ...]) -> None:
    """The Makefile's system-packages pattern: install what dpkg does not list, as root or with sudo."""
    missing = [p for p in packages if "install ok installed" not in subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True).stdout]
    if not missing:
        return
    print(f"installing: {' '.join(missing)}", flush=True)
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([*sudo, "apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
                   check=True, env=env, stdout=subprocess.DEVNULL)


def _needs_patch(includedir: Path) -> bool:
    header = includedir / "commands" / "dbcommands.h"
    return header.exists() and "have_createdb_privilege" in header.read_text()


def build() -> None:
    """Build Citus from SOURCE_DIR out of tree and install it into the server's tree (about 5
    minutes on 2 cores). Raises RuntimeError with the build's log tail when a step fails."""
    tarball = SOURCE_DIR / TARBALL
    if not tarball.exists():
        raise RuntimeError(f"Citus source not found: {tarball} (set SKIPLOCK_CITUS_SOURCE)")
    _apt_install(APT_PACKAGES)
    includedir = Path(subprocess.run([pg_config(), "--includedir-server"], capture_output=True,
                                     text=True, check=True).stdout.strip())
    work = Path(tempfile.mkdtemp(prefix="skiplock-citus-build-", dir="/tmp"))
    try:
        subprocess.run(["tar", "-xzf", str(tarball), "-C", str(work)], check=True)
        src = work / f"citus-{VERSION}"
        if _needs_patch(includedir) and (SOURCE_DIR / PATCH).exists():
            subprocess.run(["patch", "-p1", "-i", str(SOURCE_DIR / PATCH)], cwd=src, check=True,
                           stdout=subprocess.DEVNULL)
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        for step in (["./configure", f"PG_CONFIG={pg_config()}"], ["make", "-j2", "with_llvm=no"],
                     [*sudo, "make", "install", "with_llvm=no"]):
            print(f"citus build: {' '.join(step)}", flush=True)
            done = subprocess.run(step, cwd=src, capture_output=True, text=True)
            if done.returncode != 0:
                tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
                raise RuntimeError(f"Citus build step {' '.join(step)} failed:\n{tail}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


class CitusCluster:
    """A coordinator and `workers` worker nodes, each a throwaway devdb.Cluster with Citus
    preloaded; `database` is created with the citus extension on every node. Nodes reach each
    other over TCP on 127.0.0.1 (initdb's trust)."""

    def __init__(self, workers: int = WORKERS, database: str = "skiplock") -> None:
        settings = {"shared_preload_libraries": "'citus'", "max_connections": "300",
                    "max_prepared_transactions": "100", "shared_buffers": "64MB",
                    "citus.max_shared_pool_size": "200"}
        self.database = database
        # Durable, unlike the other test clusters: a finish that moves a task to a stage on another
        # node commits on both in two phases, and a crash that loses one node's asynchronous
        # commit (fsync or synchronous_commit off) would let that step run twice.
        self.coordinator = devdb.Cluster(durable=True, settings=settings)
        self.workers = [devdb.Cluster(durable=True, settings=settings) for _ in range(workers)]

    @property
    def nodes(self) -> list[devdb.Cluster]:
        return [self.coordinator, *self.workers]

    def url(self, node: devdb.Cluster | None = None) -> str:
        return (node or self.coordinator).url(self.database)

    def start(self) -> "CitusCluster":
        try:
            for node in self.nodes:
                node.start()
                with psycopg.connect(node.url(), autocommit=True) as conn:
                    conn.execute(f'CREATE DATABASE "{self.database}"')
                with psycopg.connect(node.url(self.database), autocommit=True) as conn:
                    conn.execute("CREATE EXTENSION citus")
            with psycopg.connect(self.url(), autocommit=True) as conn:
                conn.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)", (self.coordinator.port,))
                for worker in self.workers:
                    conn.execute("SELECT citus_add_node('127.0.0.1', %s)", (worker.port,))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()

    def __enter__(self) -> "CitusCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def skipped_line() -> str:
    return f"citus: not installed, {TEST_FILE} skipped (make test-citus builds Citus {VERSION} and runs it)"


def main(argv: list[str] | None = None) -> int:
    """`make test-citus`: build Citus when missing, then pytest on tests/py/test_citus.py
    (`--build-only`: only the build, for CI before `make test`, which then runs the file)."""
    extra = list(sys.argv[1:] if argv is None else argv)
    if not installed():
        print(f"citus: citus.so not found, building Citus {VERSION} from {SOURCE_DIR}", flush=True)
        build()
    if extra == ["--build-only"]:
        return 0
    env = dict(os.environ)
    for name in ("DATABASE_URL", "TEST_DATABASE_URL", "SKIPLOCK_TEST_ADMIN_URL"):
        env.pop(name, None)  # test_citus.py starts its own coordinator and workers
    return subprocess.run([sys.executable, "-m", "pytest", TEST_FILE, *extra], cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
