"""The pgTAP suite on a server whose clock reads another date (libfaketime, Debian's libfaketime,
installed by `make test`).

The SQL tests take now() from the server: partitions are named for the day a migration runs,
schedules fire at injected times, views group by the hour. A test that only passes before some
date, or not across midnight, is a time bomb: 100_rotate_partitions injected 2030 dates and would
have failed from May 2030 on. Only the server's clock is faked; pg_prove and Python keep the real one.
"""

from __future__ import annotations

import glob
import shutil
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest

from dev import testrun
from skiplock import devdb

# Each clock is a whole pgTAP run. The year's end of 2030 is also the date past which the time bomb
# above went off; a run at "2000 days ahead" (2032) found nothing these two do not, and was dropped
# to keep the suite's time.
CLOCKS = {
    "past 2100, a century year that is not a leap year": "+30000d",
    "across midnight, a month's and a year's end": "@2030-12-31 23:59:57",
}


@pytest.mark.parametrize("clock", CLOCKS.values(), ids=CLOCKS.keys())
def test_the_pgtap_suite_passes_whatever_the_date(clock: str, capsys: pytest.CaptureFixture[str]) -> None:
    libs = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
    assert libs, "libfaketime is missing: install libfaketime (make test does)"
    # An absolute start ("@…") is set through a file the server rereads (every second at most), and
    # only once the pgTAP database is built: starting the cluster and migrating take seconds, which
    # on a loaded machine ate the 3 s before midnight (the suite then began on the next day).
    at = datetime.fromisoformat(clock[1:]).replace(tzinfo=timezone.utc) if clock.startswith("@") else None
    rcdir = Path(tempfile.mkdtemp(prefix="skiplock-faketime-", dir="/tmp"))
    rcdir.chmod(0o755)  # the server runs as user postgres when the tests run as root
    rc = rcdir / "faketime.rc"
    rc.write_text(offset_to(at - timedelta(minutes=5)) if at else clock)
    rc.chmod(0o644)
    cluster = devdb.Cluster(environment={"LD_PRELOAD": libs[0], "FAKETIME_TIMESTAMP_FILE": str(rc),
                                         "FAKETIME_CACHE_DURATION": "1",
                                         "FAKETIME_DONT_FAKE_MONOTONIC": "1"}).start()
    try:
        # Migrated once under the faked clock (partitions are named for its day), then copied.
        urls = testrun.prepare_tap_databases(cluster.url(), testrun.prepare_template(cluster.url()))
        url = urls[0]
        began = set_clock(url, rc, at) if at else server_clock(url)
        code = testrun.run_pg_prove(urls)
        ended = server_clock(url)
        out = capsys.readouterr().out
    finally:
        cluster.stop()
        shutil.rmtree(rcdir, ignore_errors=True)
    with capsys.disabled():
        print(f"\npgTAP from {began} to {ended} by the server's clock")
    assert began.year >= 2030, f"the server's clock is not faked: it reads {began}"
    if clock.startswith("@"):
        assert began.date() < ended.date(), f"the suite did not run across midnight ({began} to {ended}): move the clock's start"
    assert code == 0 and "Result: PASS" in out, out[-4000:]


def server_clock(url: str) -> datetime:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT clock_timestamp() AT TIME ZONE 'UTC'").fetchone()[0]


def offset_to(target: datetime) -> str:
    """libfaketime's relative offset (whole seconds) that makes the clock read `target` now."""
    return f"{round((target - datetime.now(timezone.utc)).total_seconds()):+d}"


def set_clock(url: str, rc: Path, at: datetime, window: timedelta = timedelta(seconds=2)) -> datetime:
    """Set the server's clock to `at` and return what it reads, a moment later, on a new session:
    a time within `window` after `at`. Aims again when it has missed (a reread of the file comes up
    to a second late, and a loaded machine may take longer than `window` to answer)."""
    deadline = time.monotonic() + 120
    while True:
        rc.write_text(offset_to(at))
        aimed = time.monotonic()
        while time.monotonic() < aimed + 3:
            now = server_clock(url).replace(tzinfo=timezone.utc)
            if at <= now < at + window:
                return now.replace(tzinfo=None)
            if now >= at + window:
                break  # too late: aim again
            time.sleep(0.05)
        assert time.monotonic() < deadline, f"could not set the server's clock to {at} within 120 s"
