"""The test and development harness: `make test` (dev.testrun), `make lint`, `make revision`, the
other PostgreSQL majors, Citus. Run from a checkout (`python -m dev.testrun`); not in the wheel,
which carries only what a `skiplock` command reaches (tests/py/test_python_layout.py checks it)."""
