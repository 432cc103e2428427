"""`make test`: lint (ruff, mypy), the pgTAP suite through pg_prove, then pytest, on a cluster of
the tests' own, with the other PostgreSQL majors running beside them. A lint finding stops the
run before any database starts.

It never reads DATABASE_URL: tests drop and rebuild schema queue. It starts a throwaway cluster,
or uses TEST_DATABASE_URL, a server where it may create and drop its own databases.
The last line printed is the verdict of the whole run.
"""

from __future__ import annotations

import compileall
import os
import subprocess
import sys
import tempfile

from dev import citus, lint, versions
from dev.testdb import (
    TEMPLATE_ENV,
    chooses_workers,
    create_database,
    drop_database,
    drop_template,
    prepare_tap_database,
    prepare_tap_databases,
    prepare_template,
    run_pg_prove,
    run_pytest,
)
from skiplock import devdb
from skiplock.sqlfiles import ROOT

# Tests import these from here (`from dev.testrun import create_database, drop_database`).
__all__ = ["TEMPLATE_ENV", "create_database", "drop_database", "drop_template", "main", "prepare_tap_database",
           "prepare_tap_databases", "prepare_template", "run_pg_prove", "run_pytest"]


# pytest's processes (pytest-xdist), each with a cluster of its own: much of a test's time is
# waiting (subprocesses starting, leases running out, held snapshots), and three processes on two
# cores keep the CPU busy through it. `TEST_ARGS="-n 0"` runs one process; `-n N` another count.
PYTEST_WORKERS = 3


def with_workers(extra: list[str]) -> list[str]:
    """pytest's arguments, with `-n PYTEST_WORKERS` unless they choose a count, and the ten slowest
    tests listed unless they ask for another count."""
    chosen = chooses_workers(extra)
    durations = any(a.startswith("--durations") for a in extra)
    return [*([] if chosen else ["-n", str(PYTEST_WORKERS)]), *([] if durations else ["--durations=10"]), *extra]


def compile_bytecode() -> None:
    """Bytecode for the checkout's own modules, written once. The suite starts hundreds of Python
    processes (pytest's, the CLI, spawned workers); where PYTHONDONTWRITEBYTECODE is set, as in
    many CI images, each of them would compile these modules again (0.2 s of CPU for the CLI)."""
    for folder in ("skiplock", "dev", "tests", "clients/python", "alembic", "bench"):
        compileall.compile_dir(ROOT / folder, quiet=1, workers=1)


def main(argv: list[str] | None = None) -> int:
    extra = list(sys.argv[1:] if argv is None else argv)
    if lint.run() != 0:
        return 1
    compile_bytecode()
    explicit = os.environ.get("TEST_DATABASE_URL")
    cluster = None
    template = None
    others: subprocess.Popen | None = None
    codes: dict[str, int] = {}
    pytest_summary: list[str] = []
    with devdb.stopped_on_signals(), tempfile.TemporaryFile("w+") as others_log:
        try:
            if explicit:
                admin_url = explicit
            else:
                print("starting a throwaway PostgreSQL cluster for the tests", flush=True)
                cluster = devdb.Cluster(durable=False).start()
                admin_url = cluster.url()
            major = versions.major_at(admin_url)
            # The other supported majors (dev/versions.py), pgTAP and a set of pytest modules
            # each, in clusters of their own, run beside this major's suites: much of pytest's time
            # is spent waiting (subprocesses starting, leases running out, a held snapshot), and
            # the CPU it leaves idle runs them. Their output comes after pytest's.
            majors = versions.others(major)
            if majors:
                others = subprocess.Popen([sys.executable, "-m", "dev.versions", *map(str, majors)],
                                          cwd=ROOT, stdin=subprocess.DEVNULL, stdout=others_log,
                                          stderr=subprocess.STDOUT)
            template = prepare_template(admin_url)  # migrated once; every test database is a copy
            codes[f"pgTAP on {major}"] = run_pg_prove(prepare_tap_databases(admin_url, template))
            if not citus.installed():
                print(citus.skipped_line(), flush=True)  # the file skips itself too
            codes[f"pytest on {major}"] = run_pytest(admin_url, with_workers(extra), template, summary=pytest_summary)
            if others is not None:
                if others.poll() is None:
                    print(f"\nwaiting for the other majors ({', '.join(map(str, majors))})", flush=True)
                codes[f"other majors ({' '.join(map(str, majors))})"] = others.wait()
                others = None
                others_log.seek(0)
                sys.stdout.write(others_log.read())
        finally:
            if others is not None:  # interrupted: it stops its clusters on SIGTERM
                others.terminate()
                others.wait()
            if cluster is not None:
                cluster.stop()
            elif template is not None:
                drop_template(admin_url, template)
    failed = [what for what, code in codes.items() if code != 0]
    # The verdict of the whole run, then pytest's summary again: the last line printed.
    print(f"\nmake test: {'FAILED: ' + ', '.join(failed) if failed else 'PASS'} ({', '.join(codes)})", flush=True)
    for line in pytest_summary:
        print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
