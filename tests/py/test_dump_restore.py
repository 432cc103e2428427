"""pg_dump / pg_restore of a database with skiplock in use, into a fresh cluster.

The source holds tasks ready, running with leases, in error with a retry due, periodic (repeat
and a cron schedule) and planned for tomorrow; history over several daily partitions; a stage
granted to one tenant role; an SQL task of a role in skiplock_sql. Roles go first
(`pg_dumpall --roles-only`), then `pg_restore` of a `pg_dump -Fc`, into a second cluster. Then:
every table of schema queue reads the same, the functions are still SECURITY DEFINER with the
same owner, ACLs and settings, `skiplock upgrade` has nothing to apply, a running task's lease
still heartbeats and finishes, the tenant grant still holds, workers drain the rest, the SQL task
runs, and rotate_partitions creates and drops partitions of the restored table. The same for the
single-schema dump (`pg_dump -n queue`) a DBA makes to move only the queue.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Iterator

import psycopg
import pytest

from dev.testrun import create_database, drop_database
from skiplock import devdb, migrate

BIN = devdb.pg_bin()
SKIPLOCK = [sys.executable, "-m", "skiplock"]
ROLES = ("dr_app", "dr_tenant", "dr_reporting")


def as_role(url: str, role: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["user"] = role
    return psycopg.conninfo.make_conninfo(**info)


def run(*cmd: object, **kw: object) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, **kw)
    assert proc.returncode == 0, f"{cmd[0]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def source(admin_url: str) -> Iterator[dict]:
    """The database in use, and what a check later needs to know about it."""
    url = create_database(admin_url, "test_dump_src")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for role in ROLES:
            conn.execute(f"DROP ROLE IF EXISTS {role}")
            conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        migrate.upgrade(url)
        state: dict = {"url": url}
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("GRANT skiplock_worker, skiplock_producer TO dr_app, dr_tenant")
            conn.execute("GRANT skiplock_sql TO dr_reporting")
            conn.execute("SELECT queue.grant_stage('dr.tenant', 'dr_tenant')")
            for stage in ("dr.ready", "dr.running", "dr.error", "dr.tenant", "dr.later"):
                conn.execute("SELECT queue.configure_stage(%s, backoff_base => interval '0', backoff_jitter => 0)",
                             (stage,))
            # History over four daily partitions: made for the last 3 days, then rows moved there.
            conn.execute("SELECT queue.configure_history(retention => '30 days')")
            conn.execute("SELECT * FROM queue.rotate_partitions(now() - interval '3 days')")
            conn.execute("SELECT * FROM queue.rotate_partitions()")
            conn.execute("SELECT queue.enqueue_batch(array_agg(jsonb_build_object('n', n)), 'dr.done')"
                         "  FROM generate_series(1, 40) n")
            for task_id, lease in conn.execute("SELECT id, lease FROM queue.take_next('dr.done', 40)").fetchall():
                assert conn.execute("SELECT queue.finish(%s, %s)", (task_id, lease)).fetchone()[0]
            conn.execute("UPDATE queue.history SET finished = finished - (id % 4) * interval '1 day'"
                         " WHERE stage = 'dr.done'")
            assert conn.execute("SELECT count(DISTINCT tableoid) FROM queue.history"
                                " WHERE tableoid <> 'queue.history_default'::regclass").fetchone()[0] == 4
            # Ready, running with leases, in error with a retry due, planned for tomorrow, periodic.
            conn.execute("SELECT queue.enqueue_batch(array_agg(jsonb_build_object('n', n)), 'dr.ready')"
                         "  FROM generate_series(1, 30) n")
            conn.execute("SELECT queue.enqueue_batch(array_agg(jsonb_build_object('n', n)), 'dr.running')"
                         "  FROM generate_series(1, 3) n")
            state["running"] = conn.execute("SELECT id, lease FROM queue.take_next('dr.running', 3,"
                                            " lease_for => interval '1 hour')").fetchall()
            conn.execute("SELECT queue.enqueue_batch(array_agg(jsonb_build_object('n', n)), 'dr.error')"
                         "  FROM generate_series(1, 4) n")
            for task_id, lease in conn.execute("SELECT id, lease FROM queue.take_next('dr.error', 4)").fetchall():
                assert conn.execute("SELECT queue.fail(%s, %s, 'try again', retry_in => interval '0')",
                                    (task_id, lease)).fetchone()[0]
            conn.execute("SELECT queue.enqueue('{\"later\": true}', 'dr.later', run_at => now() + interval '1 day')")
            state["periodic"] = conn.execute("SELECT queue.enqueue('{\"every\": \"hour\"}', 'dr.ready',"
                                             " repeat => interval '1 hour')").fetchone()[0]
            conn.execute("SELECT queue.schedule('dr_nightly', '0 3 * * *', 'dr.later')")
        with psycopg.connect(as_role(url, "dr_tenant"), autocommit=True) as conn:
            conn.execute("SELECT queue.enqueue_batch(ARRAY['{}', '{}']::jsonb[], 'dr.tenant')")
        with psycopg.connect(as_role(url, "dr_reporting"), autocommit=True) as conn:
            state["sql_task"] = conn.execute(
                "SELECT queue.enqueue_sql('SELECT 1', 'dr.sql')").fetchone()[0]
        with psycopg.connect(url, autocommit=True) as conn:
            counts = dict(conn.execute("SELECT status::text, count(*) FROM queue.live_tasks GROUP BY 1").fetchall())
            assert counts == {"ready": 30 + 1 + 2 + 1 + 1, "running": 3, "error": 4}, counts
        yield state
    finally:
        drop_database(admin_url, url)
        with psycopg.connect(admin_url, autocommit=True) as conn:
            for role in ROLES:
                conn.execute(f"DROP ROLE IF EXISTS {role}")


@pytest.fixture(scope="module")
def target() -> Iterator[devdb.Cluster]:
    """A fresh cluster: no skiplock roles until the roles dump is restored."""
    c = devdb.Cluster(durable=False).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def dumps(source: dict, admin_url: str, target: devdb.Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The dumps, taken while nothing runs, and the roles restored into the target cluster."""
    d = tmp_path_factory.mktemp("dumps")
    run(BIN / "pg_dumpall", "--roles-only", "-f", d / "roles.sql", "-d", admin_url)
    run(BIN / "pg_dump", "-Fc", "-f", d / "all.dump", "-d", source["url"])
    run(BIN / "pg_dump", "-Fc", "-n", "queue", "-f", d / "queue.dump", "-d", source["url"])
    # The target's superuser (postgres) exists already: that one error is expected, no other.
    proc = subprocess.run([BIN / "psql", "-X", "-q", "-d", target.url(), "-f", d / "roles.sql"],
                          capture_output=True, text=True, timeout=120)
    errors = [line for line in proc.stderr.splitlines() if "ERROR" in line]
    assert all('role "postgres" already exists' in e for e in errors), proc.stderr
    return {"all": d / "all.dump", "queue": d / "queue.dump"}


def restore(target: devdb.Cluster, dump: Path, name: str) -> str:
    url = target.createdb(name)
    run(BIN / "pg_restore", "--exit-on-error", "-d", url, dump)
    return url


def catalog(url: str) -> dict[str, list[tuple]]:
    """What must survive: every table's rows, and the functions', tables' and schema's owners,
    ACLs, settings and security."""
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT c.oid::regclass::text FROM pg_class c WHERE c.relnamespace = 'queue'::regnamespace"
            "   AND c.relkind IN ('r', 'p') ORDER BY 1")]
        out = {t: conn.execute(f"SELECT t::text FROM {t} t ORDER BY 1").fetchall() for t in tables}
        out["functions"] = conn.execute(
            "SELECT p.oid::regprocedure::text, p.proowner::regrole::text, p.prosecdef, p.proacl::text,"
            "       p.proconfig::text, md5(p.prosrc) FROM pg_proc p"
            " WHERE p.pronamespace = 'queue'::regnamespace ORDER BY 1").fetchall()
        out["relations"] = conn.execute(
            "SELECT c.oid::regclass::text, c.relkind::text, c.relowner::regrole::text, c.relacl::text"
            "  FROM pg_class c WHERE c.relnamespace = 'queue'::regnamespace ORDER BY 1").fetchall()
        out["schema"] = conn.execute(
            "SELECT nspowner::regrole::text, nspacl::text FROM pg_namespace WHERE nspname = 'queue'").fetchall()
        out["memberships"] = conn.execute(
            "SELECT m.roleid::regrole::text, m.member::regrole::text FROM pg_auth_members m"
            " WHERE m.roleid::regrole::text LIKE 'skiplock%' ORDER BY 1, 2").fetchall()
    return out


def upgrade_says_at_head(url: str) -> None:
    from alembic.script import ScriptDirectory
    head = ScriptDirectory.from_config(migrate.alembic_config(url)).get_current_head()
    proc = run(*SKIPLOCK, "upgrade", "--db", url)
    assert f"already at {head}: nothing to apply" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("kind", ["all", "queue"])
def test_restore_keeps_everything(kind: str, source: dict, dumps: dict, target: devdb.Cluster) -> None:
    url = restore(target, dumps[kind], f"restored_{kind}")
    before, after = catalog(source["url"]), catalog(url)
    assert before.keys() == after.keys()
    for key in before:
        assert after[key] == before[key], f"{key} differs after the restore"
    assert any(f[2] for f in after["functions"]), "SECURITY DEFINER kept"
    upgrade_says_at_head(url)


@pytest.mark.parametrize("kind", ["all", "queue"])
def test_the_restored_queue_works(kind: str, source: dict, dumps: dict, target: devdb.Cluster) -> None:
    url = restore(target, dumps[kind], f"working_{kind}")
    with psycopg.connect(url, autocommit=True) as conn:
        # The leases taken before the dump are still the running tasks' own.
        (first, lease1), (second, lease2), (third, _) = source["running"]
        assert conn.execute("SELECT queue.heartbeat(%s, %s)", (first, lease1)).fetchone()[0] is not None
        assert conn.execute("SELECT queue.finish(%s, %s)", (first, lease1)).fetchone()[0]
        assert conn.execute("SELECT queue.fail(%s, %s, 'after restore', fatal => true)",
                            (second, lease2)).fetchone()[0]
        assert not conn.execute("SELECT queue.finish(%s, gen_random_uuid())", (third,)).fetchone()[0]
        # Expired leases still come back through reap_hung.
        conn.execute("UPDATE queue.live_tasks SET lease_expires = now() - interval '1 second' WHERE id = %s", (third,))
        assert conn.execute("SELECT queue.reap_hung()").fetchone()[0] == 1

    # The tenant grant: the tenant takes its stage, another worker role may not.
    with psycopg.connect(as_role(url, "dr_app"), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM queue.take_next('dr.tenant')")
    with psycopg.connect(as_role(url, "dr_tenant"), autocommit=True) as conn:
        for task_id, lease in conn.execute("SELECT id, lease FROM queue.take_next('dr.tenant', 10)").fetchall():
            assert conn.execute("SELECT queue.finish(%s, %s)", (task_id, lease)).fetchone()[0]

    # The SQL task runs as the role that enqueued it.
    with psycopg.connect(as_role(url, "dr_reporting"), autocommit=True) as conn:
        assert conn.execute("CALL queue.run_sql_tasks('dr.sql', 10)").fetchone()[0] == 1

    # Workers (the CLI, as the application's login) drain the rest: ready, the due retries, the
    # task the reaper handed back.
    for stage in ("dr.ready", "dr.error", "dr.running"):
        run(*SKIPLOCK, "worker", "--db", as_role(url, "dr_app"), "--stage", stage, "-c", "2", "--until-empty",
            "--quiet", "--", "true")

    with psycopg.connect(url, autocommit=True) as conn:
        live = conn.execute("SELECT stage, status::text FROM queue.live_tasks ORDER BY 1").fetchall()
        # Left: tomorrow's task and the periodic task, re-armed for its next hour.
        assert live == [("dr.later", "ready"), ("dr.ready", "ready")], live
        source_ids = {r[0] for r in psycopg.connect(source["url"]).execute(
            "SELECT id FROM queue.live_tasks WHERE stage IN ('dr.ready', 'dr.error', 'dr.running', 'dr.tenant', 'dr.sql')")}
        ended = dict(conn.execute(
            "SELECT id, count(*) FROM queue.history WHERE id = ANY(%s) GROUP BY id", (list(source_ids),)).fetchall())
        periodic = source["periodic"]
        assert set(ended) - {periodic} == source_ids - {periodic}, "every task kept and ended"
        assert all(n == 1 for n in ended.values()), "no task ended twice"
        assert conn.execute("SELECT status::text FROM queue.history WHERE id = %s", (source["sql_task"],)).fetchone()[0] == "done"
        # New tasks get new ids: the identity sequence came along.
        new = conn.execute("SELECT queue.enqueue('{}', 'dr.new')").fetchone()[0]
        assert new > max(source_ids)

        # Rotation on the restored partitions: makes the next days, drops what retention expires.
        actions = conn.execute("SELECT action, partition FROM queue.rotate_partitions(now() + interval '3 days')").fetchall()
        assert any(a == "created" for a, _ in actions), actions
        assert not any(a.startswith("skipped") for a, _ in actions), actions
        conn.execute("SELECT queue.configure_history(retention => '2 days')")
        actions = conn.execute("SELECT action, partition FROM queue.rotate_partitions()").fetchall()
        assert sum(a == "dropped" for a, _ in actions) >= 1, actions
        assert not any(a.startswith("skipped") for a, _ in actions), actions
