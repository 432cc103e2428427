"""The pgTAP suite on a server whose clock reads another date (libfaketime, Debian's libfaketime,
installed by `make test`).

The SQL tests take now() from the server: partitions are named for the day a migration runs,
schedules fire at injected times, views group by the hour. A test that only passes before some
date, or not across midnight, is a time bomb: 100_rotate_partitions injected 2030 dates and would
have failed from May 2030 on. Only the server's clock is faked; pg_prove and Python keep the real one.
"""

from __future__ import annotations

import glob
from datetime import datetime

import psycopg
import pytest

from skiplock import devdb, testrun

CLOCKS = {
    "2000 days ahead": "+2000d",
    "past 2100, a century year that is not a leap year": "+30000d",
    "across midnight, a month's and a year's end": "@2030-12-31 23:59:57",
}


@pytest.mark.parametrize("clock", CLOCKS.values(), ids=CLOCKS.keys())
def test_the_pgtap_suite_passes_whatever_the_date(clock: str, capsys: pytest.CaptureFixture[str]) -> None:
    libs = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
    assert libs, "libfaketime is missing: install libfaketime (make test does)"
    cluster = devdb.Cluster(environment={"LD_PRELOAD": libs[0], "FAKETIME": clock,
                                         "FAKETIME_DONT_FAKE_MONOTONIC": "1"}).start()
    try:
        url = testrun.prepare_tap_database(cluster.url())
        began = server_clock(url)
        code = testrun.run_pg_prove(url)
        ended = server_clock(url)
        out = capsys.readouterr().out
    finally:
        cluster.stop()
    with capsys.disabled():
        print(f"\npgTAP from {began} to {ended} by the server's clock")
    assert began.year >= 2030, f"the server's clock is not faked: it reads {began}"
    if clock.startswith("@"):
        assert began.date() < ended.date(), f"the suite did not run across midnight ({began} to {ended}): move the clock's start"
    assert code == 0 and "Result: PASS" in out, out[-4000:]


def server_clock(url: str) -> datetime:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT clock_timestamp() AT TIME ZONE 'UTC'").fetchone()[0]
