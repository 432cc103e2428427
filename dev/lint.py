"""`make lint`: ruff over every Python file of the checkout, mypy over the package.

Their settings are in pyproject.toml. `make test` (dev.testrun) runs this first and stops
on a finding. `ruff check --fix .` sorts imports.
"""

from __future__ import annotations

import subprocess
import sys

from skiplock.sqlfiles import ROOT

CHECKS = (
    ("ruff", [sys.executable, "-m", "ruff", "check", "."]),
    ("mypy", [sys.executable, "-m", "mypy"]),
)


def run() -> int:
    """Run every check (all of them, so one run shows every finding); 0 when all pass."""
    failed = []
    for name, command in CHECKS:
        print(f"lint: {name}", flush=True)
        if subprocess.run(command, cwd=ROOT).returncode != 0:
            failed.append(name)
    if failed:
        print(f"lint: {' and '.join(failed)} found problems (see above)", flush=True)
        return 1
    return 0


def main() -> int:
    return run()


if __name__ == "__main__":
    sys.exit(main())
