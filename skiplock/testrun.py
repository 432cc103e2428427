"""`make test`: lint (ruff, mypy), the pgTAP suite through pg_prove, the other PostgreSQL majors,
then pytest, on a cluster of the tests' own. A lint finding stops the run before any database starts.

It never reads DATABASE_URL: tests drop and rebuild schema queue. It starts a throwaway cluster,
or uses TEST_DATABASE_URL, a server where it may create and drop its own databases.
pytest runs last so that its summary is the last line printed.
"""

from __future__ import annotations

import os
import sys

from skiplock import citus, devdb, lint, versions
from skiplock.testdb import (
    TEMPLATE_ENV,
    create_database,
    drop_database,
    drop_template,
    prepare_tap_database,
    prepare_tap_databases,
    prepare_template,
    run_pg_prove,
    run_pytest,
)

# Tests import these from here (`from skiplock.testrun import create_database, drop_database`).
__all__ = ["TEMPLATE_ENV", "create_database", "drop_database", "drop_template", "main", "prepare_tap_database",
           "prepare_tap_databases", "prepare_template", "run_pg_prove", "run_pytest"]


def main(argv: list[str] | None = None) -> int:
    extra = list(sys.argv[1:] if argv is None else argv)
    if lint.run() != 0:
        return 1
    explicit = os.environ.get("TEST_DATABASE_URL")
    cluster = None
    template = None
    code = 1
    with devdb.stopped_on_signals():
        try:
            if explicit:
                admin_url = explicit
            else:
                print("starting a throwaway PostgreSQL cluster for the tests", flush=True)
                cluster = devdb.Cluster(durable=False).start()
                admin_url = cluster.url()
            template = prepare_template(admin_url)  # migrated once; every test database is a copy
            tap_code = run_pg_prove(prepare_tap_databases(admin_url, template))
            # The other supported majors (skiplock/versions.py): pgTAP and a set of pytest modules
            # each, before this major's pytest, so that pytest's summary is the last line printed.
            others_code = versions.run_others(versions.major_at(admin_url))
            if not citus.installed():
                print(citus.skipped_line(), flush=True)  # the file skips itself too
            py_code = run_pytest(admin_url, extra, template)
            code = tap_code or others_code or py_code
        finally:
            if cluster is not None:
                cluster.stop()
            elif template is not None:
                drop_template(admin_url, template)
    return code


if __name__ == "__main__":
    sys.exit(main())
