"""A physical standby (streaming replication, synchronous) and a failover.

A primary with default durability and `synchronous_standby_names` naming a standby made by
`pg_basebackup -R`. On the standby, skiplock_monitor reads the monitoring views. Then workers take
and finish tasks through a multi-host URL (`target_session_attrs=read-write`), the primary's
postmaster is killed with SIGKILL and the standby promoted: the workers reconnect to it, and every
finish the primary acknowledged is there, none twice; the tasks that were running come back when
their leases expire (reap_hung) and are finished on the new primary.
"""

from __future__ import annotations

import os
import pwd
import random
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import psycopg
import pytest

from skiplock import devdb, migrate

TASKS = 400
LEASE = "2 seconds"


class Standby(devdb.Cluster):
    """A streaming standby of `primary`, made by pg_basebackup -R (no initdb)."""

    def __init__(self, primary: devdb.Cluster, name: str) -> None:
        super().__init__(durable=True)
        self.primary, self.name = primary, name

    def start(self) -> "Standby":
        self.directory = Path(tempfile.mkdtemp(prefix="skiplock-standby-", dir="/tmp"))
        if self.as_root:
            pw = pwd.getpwnam("postgres")
            os.chown(self.directory, pw.pw_uid, pw.pw_gid)
        os.chmod(self.directory, 0o700)
        self.port = devdb._free_port()
        source = f"host={self.primary.directory} port={self.primary.port} user=postgres application_name={self.name}"
        self._run(devdb.pg_bin() / "pg_basebackup", "-D", self.datadir, "-R", "-X", "stream", "-c", "fast",
                  "-d", source)
        with open(self.datadir / "postgresql.auto.conf", "a") as f:   # later lines win
            f.write(f"port = {self.port}\nunix_socket_directories = '{self.directory}'\n")
        self._run(devdb.pg_bin() / "pg_ctl", "-D", self.datadir, "-l", self.logfile, "-w", "-t", "60", "start")
        return self

    def promote(self) -> None:
        self._run(devdb.pg_bin() / "pg_ctl", "-D", self.datadir, "-w", "-t", "60", "promote")


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[devdb.Cluster, Standby]]:
    primary = devdb.Cluster(durable=True, settings={"synchronous_commit": "on", "wal_level": "replica"}).start()
    standby = None
    try:
        with psycopg.connect(primary.url(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE app")
            conn.execute("CREATE ROLE monitor LOGIN")
        migrate.upgrade(primary.url("app"))
        with psycopg.connect(primary.url("app"), autocommit=True) as conn:
            conn.execute("GRANT skiplock_monitor TO monitor")
        standby = Standby(primary, "standby1").start()
        devdb.wait_ready(standby.url("app"))
        # Synchronous only now: with no standby yet, every commit (the migration's) would wait.
        with psycopg.connect(primary.url(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby1'")
            conn.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + 30
            while conn.execute("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'").fetchone()[0] < 1:
                assert time.monotonic() < deadline, "the standby did not become synchronous"
                time.sleep(0.1)
        yield primary, standby
    finally:
        if standby is not None:
            standby.stop(mode="immediate")
        primary.stop(mode="immediate")


def both(primary: devdb.Cluster, standby: Standby, user: str = "postgres") -> str:
    """One URL for both servers: libpq connects to whichever accepts writes."""
    return (f"host={primary.directory},{standby.directory} port={primary.port},{standby.port} "
            f"dbname=app user={user} target_session_attrs=read-write connect_timeout=3")


def test_monitoring_views_on_the_standby(pair: tuple[devdb.Cluster, Standby]) -> None:
    primary, standby = pair
    with psycopg.connect(primary.url("app"), autocommit=True) as conn:
        conn.execute("SELECT queue.enqueue_batch(ARRAY['{}', '{}']::jsonb[], 'mon')")
        lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    mon = psycopg.conninfo.make_conninfo(standby.url("app"), user="monitor")
    with psycopg.connect(mon, autocommit=True) as conn:
        deadline = time.monotonic() + 30
        while conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)).fetchone()[0] is not True:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]
        stats = conn.execute("SELECT status::text, tasks FROM queue.stats WHERE stage = 'mon'").fetchall()
        assert stats == [("ready", 2)], stats
        assert conn.execute("SELECT count(*) FROM queue.tasks WHERE stage = 'mon'").fetchone()[0] == 2
        conn.execute("SELECT * FROM queue.metrics").fetchall()
        conn.execute("SELECT * FROM queue.errors").fetchall()
        conn.execute("SELECT * FROM queue.stage_config").fetchall()
    # Writing is the primary's: an enqueue or a take on the standby is refused, not half done.
    with psycopg.connect(standby.url("app"), autocommit=True) as conn:
        for call in ("SELECT queue.enqueue('{}', 'mon')", "SELECT * FROM queue.take_next('mon')"):
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                conn.execute(call)


def test_failover_loses_no_acknowledged_finish(pair: tuple[devdb.Cluster, Standby]) -> None:
    primary, standby = pair
    url = both(primary, standby)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT queue.configure_stage('fo', lease_duration => %s)", (LEASE,))
        ids = [r[0] for r in conn.execute("SELECT queue.enqueue_batch(array_agg(jsonb_build_object('n', n)), 'fo')"
                                          "  FROM generate_series(1, %s) n", (TASKS,)).fetchall()]
    acked: list[int] = []
    lock = threading.Lock()
    halt = threading.Event()
    reconnected = [0]

    def worker(n: int) -> None:
        rng = random.Random(n)
        conn = None
        while not halt.is_set():
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(url, autocommit=True)
                conn.execute("SELECT queue.reap_hung()")
                rows = conn.execute("SELECT id, lease FROM queue.take_next('fo', 2)").fetchall()
                if not rows:
                    time.sleep(0.1)
                    continue
                for task_id, lease in rows:
                    time.sleep(rng.random() * 0.01)
                    if conn.execute("SELECT queue.finish(%s, %s)", (task_id, lease)).fetchone()[0]:
                        with lock:
                            acked.append(task_id)   # the commit returned: the server acknowledged it
            except psycopg.OperationalError:
                if conn is not None:
                    conn.close()
                conn = None
                with lock:
                    reconnected[0] += 1
                time.sleep(0.2)
        if conn is not None:
            conn.close()

    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while len(acked) < TASKS // 4:
        assert time.monotonic() < deadline, f"only {len(acked)} finished before the failover"
        time.sleep(0.02)
    pid = int((primary.datadir / "postmaster.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    with lock:
        before = list(acked)  # acknowledged by the old primary
    standby.promote()
    deadline = time.monotonic() + 180
    with psycopg.connect(standby.url("app"), autocommit=True) as conn:
        while conn.execute("SELECT count(*) FROM queue.live_tasks WHERE stage = 'fo'").fetchone()[0] > 0:
            assert time.monotonic() < deadline, "the promoted standby was not drained"
            assert any(t.is_alive() for t in threads)
            time.sleep(0.1)
        halt.set()
        for t in threads:
            t.join(30)
        rows = conn.execute("SELECT id, count(*) FROM queue.history WHERE stage = 'fo' GROUP BY id").fetchall()
    ended = dict(rows)
    assert set(before) <= set(ended), f"{len(set(before) - set(ended))} acknowledged finishes lost"
    # A finish that committed while the primary died may never have been acknowledged: a subset.
    assert set(acked) <= set(ended) and len(acked) == len(set(acked)), "acknowledged once each, none lost"
    assert sorted(ended) == sorted(ids), "every task ended"
    assert all(n == 1 for n in ended.values()), "no task finished twice"
    assert reconnected[0] >= 1
