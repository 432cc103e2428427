"""`make test`: lint (ruff, mypy), then the pgTAP suite through pg_prove, then pytest, on a cluster
of the tests' own. A lint finding stops the run before any database starts.

It never reads DATABASE_URL: tests drop and rebuild schema queue. It starts a throwaway cluster,
or uses TEST_DATABASE_URL, a server where it may create and drop its own databases.
pytest runs last so that its summary is the last line printed.
"""

from __future__ import annotations

import os
import sys

from skiplock import devdb, lint, versions
from skiplock.testdb import (
    create_database,
    drop_database,
    prepare_tap_database,
    run_pg_prove,
    run_pytest,
)

# Tests import these from here: `from skiplock.testrun import create_database, drop_database`.
__all__ = ["create_database", "drop_database", "main", "prepare_tap_database", "run_pg_prove", "run_pytest"]

def main(argv: list[str] | None = None) -> int:
    extra = list(sys.argv[1:] if argv is None else argv)
    if lint.run() != 0:
        return 1
    explicit = os.environ.get("TEST_DATABASE_URL")
    cluster = None
    code = 1
    with devdb.stopped_on_signals():
        try:
            if explicit:
                admin_url = explicit
            else:
                print("starting a throwaway PostgreSQL cluster for the tests", flush=True)
                cluster = devdb.Cluster(durable=False).start()
                admin_url = cluster.url()
            tap_code = run_pg_prove(prepare_tap_database(admin_url))
            # The other supported majors (skiplock/versions.py): pgTAP and a set of pytest modules
            # each, before this major's pytest, so that pytest's summary is the last line printed.
            others_code = versions.run_others(versions.major_at(admin_url))
            py_code = run_pytest(admin_url, extra)
            code = tap_code or others_code or py_code
        finally:
            if cluster is not None:
                cluster.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
