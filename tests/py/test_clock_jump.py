"""A jump of the server's clock (libfaketime on the server only; Python keeps the real clock).

Stepped forward an hour while workers hold leases and heartbeat, maintain() must not reap them:
time nobody saw pass (no record of reap_hung's clock, no take) does not count against a lease
(docs/reliability.md, "Clock jumps"). A lease whose worker is gone is reaped all the same, once the
time it had left when the gap began has passed on the new clock. Set back, the clock only makes
leases longer, and `skiplock stats` shows the ages of tasks made meanwhile as negative.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg

from skiplock import devdb, migrate

JUMP = timedelta(hours=1)


def server_clock(conn: psycopg.Connection) -> datetime:
    return conn.execute("SELECT clock_timestamp()").fetchone()[0]


def jump_to(conn: psycopg.Connection, rc: Path, offset: timedelta) -> None:
    """Move the server's clock to the real time plus offset; wait until this session reads it
    (libfaketime rereads the file every second)."""
    rc.write_text(f"{round(offset.total_seconds()):+d}")
    deadline = time.monotonic() + 120
    while abs(server_clock(conn) - datetime.now(timezone.utc) - offset) > timedelta(minutes=5):
        assert time.monotonic() < deadline, "the server's clock did not move within 120 s"
        time.sleep(0.1)


def statuses(conn: psycopg.Connection, ids: list[int]) -> dict[int, str]:
    return dict(conn.execute("SELECT id, status::text FROM queue.live_tasks WHERE id = ANY(%s)", (ids,)).fetchall())


def test_a_forward_jump_of_the_servers_clock_reaps_no_lease_whose_worker_heartbeats():
    libs = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
    assert libs, "libfaketime is missing: install libfaketime (make test does)"
    rcdir = Path(tempfile.mkdtemp(prefix="skiplock-faketime-", dir="/tmp"))
    rcdir.chmod(0o755)  # the server runs as user postgres when the tests run as root
    rc = rcdir / "faketime.rc"
    rc.write_text("+0")
    rc.chmod(0o644)
    cluster = devdb.Cluster(environment={"LD_PRELOAD": libs[0], "FAKETIME_TIMESTAMP_FILE": str(rc),
                                         "FAKETIME_CACHE_DURATION": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
    try:
        url = cluster.start().createdb("jump")
        migrate.upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[9]), 'jump')")
            conn.execute("SELECT * FROM queue.maintain()")  # reap_hung records the clock
            live = [r[0] for r in conn.execute(
                "SELECT id, lease FROM queue.take_next('jump', 8, lease_for => interval '60 seconds')")]
            leases = dict(conn.execute("SELECT id, lease FROM queue.live_tasks WHERE id = ANY(%s)", (live,)).fetchall())
            gone = conn.execute("SELECT id FROM queue.take_next('jump', 1, lease_for => interval '10 seconds')"
                                ).fetchone()[0]
            jump_to(conn, rc, JUMP)
            reaped = dict(conn.execute("SELECT task, count FROM queue.maintain()").fetchall())["reap_hung"]
            assert reaped == 0, f"maintain reaped {reaped} leases at the jump"
            assert set(statuses(conn, [*live, gone]).values()) == {"running"}
            # The live workers heartbeat on the new clock; the one that is gone does not, and its
            # lease runs out once the 10 s it had left have passed on the new clock.
            deadline = time.monotonic() + 120
            while statuses(conn, [gone])[gone] == "running":
                for task_id in live:
                    conn.execute("SELECT queue.heartbeat(%s, %s)", (task_id, leases[task_id]))
                conn.execute("SELECT * FROM queue.maintain()")
                assert time.monotonic() < deadline, "the lease of the worker that is gone was never reaped"
                time.sleep(0.5)
            assert statuses(conn, [gone])[gone] == "error"
            assert "lease expired" in conn.execute("SELECT error_text FROM queue.live_tasks WHERE id = %s",
                                                   (gone,)).fetchone()[0]
            assert set(statuses(conn, live).values()) == {"running"}
            # A task made while the clock is ahead; then the clock is set right: leases only get
            # longer, every live worker finishes its task once, and stats shows a negative age.
            conn.execute("SELECT queue.enqueue('{}', 'jump.ahead')")
            jump_to(conn, rc, timedelta(0))
            assert dict(conn.execute("SELECT task, count FROM queue.maintain()").fetchall())["reap_hung"] == 0
            for task_id in live:
                assert conn.execute("SELECT queue.finish(%s, %s)", (task_id, leases[task_id])).fetchone()[0]
            stats = subprocess.run([sys.executable, "-m", "skiplock", "--db", url, "stats"], capture_output=True,
                                   text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
            assert stats.returncode == 0, stats.stderr
            row = next(line for line in stats.stdout.splitlines() if "jump.ahead" in line)
            assert re.search(r" -5\dm\d\ds ", row) and "negative age" in stats.stdout, stats.stdout
    finally:
        cluster.stop()
        shutil.rmtree(rcdir, ignore_errors=True)
