"""skiplock on Citus (issue 32): a coordinator and two workers of its own (dev.citus).

Migrations on the coordinator (up, down, up), `skiplock distribute` (and its refusal without
Citus), each hot-path call as one statement to one worker (citus.log_remote_commands), consume,
the admin calls, the views and rotation, the NULL stage guard, a per-stage limit with takes
inside and outside transactions, and a drain by four workers with pipelines and retries across
kill -9 of a worker's backend and a restart of a worker node. Skipped, with one line, where Citus
is not installed (`make test-citus` builds it).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Iterator

import psycopg
import pytest

from dev import citus
from skiplock import migrate
from skiplock.sqlfiles import ROOT
from skiplock.worker import Worker, require_stage

pytestmark = pytest.mark.skipif(not citus.installed(), reason=citus.skipped_line())


@pytest.fixture(scope="module")
def nodes() -> Iterator[citus.CitusCluster]:
    c = citus.CitusCluster().start()
    try:
        yield c
    finally:
        c.stop()


def skiplock_cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return subprocess.run([sys.executable, "-m", "skiplock", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def url(nodes: citus.CitusCluster) -> str:
    """The coordinator's database, migrated and distributed (idempotent: the first test did it)."""
    migrate.upgrade(nodes.url())
    done = skiplock_cli("distribute", "--db", nodes.url())
    assert done.returncode == 0, done.stderr
    return nodes.url()


def test_migrations_run_up_down_up_on_a_coordinator_and_distribute_is_idempotent(nodes: citus.CitusCluster) -> None:
    u = nodes.url()
    migrate.upgrade(u)
    migrate.downgrade(u, "base")
    migrate.upgrade(u)
    first = skiplock_cli("distribute", "--db", u)
    assert first.returncode == 0, first.stderr
    assert "distributed queue.live_tasks by stage" in first.stdout
    assert "made queue.stage_settings a reference table" in first.stdout
    assert "queue.take_next(text,integer,interval,text) runs on its stage's node" in first.stdout
    again = skiplock_cli("distribute", "--db", u)
    assert (again.returncode, again.stdout.strip()) == (0, "already distributed: nothing to do"), again.stderr
    # Down and up again once distributed: the distributed tables drop and come back.
    migrate.downgrade(u, "base")
    migrate.upgrade(u)
    third = skiplock_cli("distribute", "--db", u)
    assert third.returncode == 0 and "distributed queue.history by stage" in third.stdout, third.stderr
    with psycopg.connect(u) as conn:
        kinds = dict(conn.execute(
            "SELECT logicalrelid::text, partmethod::text FROM pg_dist_partition"
            " WHERE logicalrelid::text IN ('queue.live_tasks', 'queue.history', 'queue.stage_waiters',"
            " 'queue.rate_windows', 'queue.stage_settings', 'queue.fence_key')").fetchall())
        assert kinds == {"queue.live_tasks": "h", "queue.history": "h", "queue.stage_waiters": "h",
                         "queue.rate_windows": "h", "queue.stage_settings": "n", "queue.fence_key": "n"}
        groups = conn.execute("SELECT count(DISTINCT colocationid) FROM pg_dist_partition"
                              " WHERE logicalrelid::text IN ('queue.live_tasks', 'queue.history', 'queue.stage_waiters',"
                              " 'queue.rate_windows')").fetchone()
        assert groups == (1,)
    # A deployment's path: the last revision down and up again on the distributed database (as an
    # upgrade to it would run), then distribute again, as after every upgrade.
    migrate.downgrade(u, "-1")
    migrate.upgrade(u)
    fourth = skiplock_cli("distribute", "--db", u)
    assert fourth.returncode == 0, fourth.stderr
    with psycopg.connect(u) as conn:
        assert conn.execute("SELECT count(*) FROM queue.stage_config WHERE stage = '*'").fetchone() == (1,)
        conn.execute("SELECT count(*) FROM queue.metrics")


def test_distribute_refuses_a_database_without_citus_in_one_line(nodes: citus.CitusCluster) -> None:
    plain = nodes.coordinator.createdb("no_citus")
    migrate.upgrade(plain)
    refused = skiplock_cli("distribute", "--db", plain)
    assert refused.returncode == 1
    assert refused.stderr.strip() == "skiplock distribute: citus is not installed in this database (SQLSTATE 0A000)"


class Remote:
    """A coordinator session that logs what Citus sends to the workers."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.notices: list[tuple[str, str]] = []
        self.conn.add_notice_handler(lambda d: self.notices.append((d.message_primary or "", d.message_detail or "")))
        self.conn.execute("SET citus.log_remote_commands = on")

    def call(self, sql: str, params: tuple = ()) -> tuple[list[tuple], list[tuple[str, str]]]:
        """The rows, and the statements of schema queue that Citus sent to a node for them."""
        self.notices.clear()
        rows = self.conn.execute(sql, params).fetchall()
        return rows, [n for n in self.notices if n[0].startswith("issuing") and "queue." in n[0]]


def one_worker(sent: list[tuple[str, str]], function: str, workers: list[int]) -> int:
    """Assert that exactly one statement, the call itself, went to one worker; its port."""
    assert len(sent) == 1, sent
    statement, detail = sent[0]
    assert f"queue.{function}(" in statement, statement
    found = re.search(r"@[^:]+:(\d+)", detail)
    assert found is not None, detail
    port = int(found.group(1))
    assert port in workers, detail
    return port


def test_each_hot_path_call_is_one_statement_on_its_stages_worker(url: str, nodes: citus.CitusCluster) -> None:
    workers = [w.port for w in nodes.workers if w.port is not None]
    r = Remote(url)
    ports = set()
    for stage in ("hot.a", "hot.b"):
        [(task_id,)], sent = r.call("SELECT queue.enqueue(%s::jsonb, %s)", ('{"n": 1}', stage))
        port = one_worker(sent, "enqueue", workers)
        ports.add(port)
        _, sent = r.call("SELECT queue.enqueue_batch(%s::jsonb[], %s)", (['{"n": 2}', '{"n": 3}', '{"n": 4}', '{"n": 5}'], stage))
        assert one_worker(sent, "enqueue_batch", workers) == port
        calls = []
        [(tid, lease)], sent = r.call("SELECT id, lease FROM queue.take_next(%s)", (stage,))
        calls.append(("take_next", sent))
        _, sent = r.call("SELECT queue.heartbeat(%s, %s, stage => %s)", (tid, lease, stage))
        calls.append(("heartbeat", sent))
        [(released,)], sent = r.call("SELECT queue.release(%s, %s, stage => %s)", (tid, lease, stage))
        calls.append(("release", sent))
        [(tid, lease)], sent = r.call("SELECT id, lease FROM queue.take_next(%s)", (stage,))
        [(failed,)], sent = r.call("SELECT queue.fail(%s, %s, 'boom', retry_in => interval '0', stage => %s)", (tid, lease, stage))
        calls.append(("fail", sent))
        [(tid, lease)], sent = r.call("SELECT id, lease FROM queue.take_next(%s)", (stage,))
        [(finished,)], sent = r.call("SELECT queue.finish(%s, %s, stage => %s)", (tid, lease, stage))
        calls.append(("finish", sent))
        rows, _ = r.call("SELECT id, lease FROM queue.take_next(%s, 2)", (stage,))
        _, sent = r.call("SELECT queue.finish_batch(%s, %s::uuid[], %s)", ([x[0] for x in rows], [x[1] for x in rows], stage))
        calls.append(("finish_batch", sent))
        [(tid, lease)], _ = r.call("SELECT id, lease FROM queue.take_next(%s)", (stage,))
        rows, sent = r.call("SELECT * FROM queue.finish_and_take(%s, %s, %s)", (tid, lease, stage))
        calls.append(("finish_and_take", sent))
        assert rows and rows[0][0] is True  # finished, and took the last one
        # A pipeline step: the task moves to the other stage (perhaps on the other node), one call.
        other = "hot.b" if stage == "hot.a" else "hot.a"
        _, sent = r.call("SELECT queue.finish(%s, %s, %s, stage => %s)", (rows[0][1], rows[0][4], other, stage))
        calls.append(("finish", sent))
        assert (released, failed, finished) == (True, True, True)
        for function, sent in calls:
            assert one_worker(sent, function, workers) == port, function
    # Inside a transaction the worker calls go to the stage's node too (forced delegation); finish
    # is not forced (its move writes another stage's shard): it ends the task in autocommit.
    with r.conn.transaction():
        rows, sent = r.call("SELECT id, lease FROM queue.take_next('hot.a')")
        port = one_worker(sent, "take_next", workers)
        _, sent = r.call("SELECT queue.heartbeat(%s, %s, stage => 'hot.a')", rows[0])
        assert one_worker(sent, "heartbeat", workers) == port
    _, sent = r.call("SELECT queue.finish(%s, %s, stage => 'hot.a')", rows[0])
    assert one_worker(sent, "finish", workers) == port
    with psycopg.connect(url) as conn:
        # hot.a's last task moved to hot.b and hot.b's to hot.a, which the transaction finished:
        # what is left is hot.b's sixth task (its own five and the one that moved in), one of them failed once.
        left = conn.execute("SELECT stage, status::text FROM queue.live_tasks WHERE stage LIKE 'hot.%'").fetchall()
        done = conn.execute("SELECT stage, count(*) FROM queue.history WHERE stage LIKE 'hot.%' GROUP BY 1 ORDER BY 1").fetchall()
    assert [s for s, _ in left] == ["hot.b"]
    assert done == [("hot.a", 6), ("hot.b", 5)]
    r.conn.close()


def test_take_locked_and_finish_locked_in_one_transaction_on_the_stages_worker(url: str, nodes: citus.CitusCluster) -> None:
    """The issue saw take_locked hand the same task twice in one transaction and finish_locked
    answer false unless delegation was forced: both run on the stage's node, each task once."""
    workers = [w.port for w in nodes.workers if w.port is not None]
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[5]), 'locked')")
    r = Remote(url)
    with r.conn.transaction():
        first, sent = r.call("SELECT id FROM queue.take_locked('locked', 2)")
        port = one_worker(sent, "take_locked", workers)
        second, sent = r.call("SELECT id FROM queue.take_locked('locked', 2)")
        assert one_worker(sent, "take_locked", workers) == port
        ids = [row[0] for row in first + second]
        assert len(ids) == 4 and len(set(ids)) == 4, ids
        for tid in ids[:3]:
            [(ok,)], sent = r.call("SELECT queue.finish_locked(%s, stage => 'locked')", (tid,))
            assert ok is True and one_worker(sent, "finish_locked", workers) == port
        [(ok,)], sent = r.call("SELECT queue.fail_locked(%s, 'no', stage => 'locked')", (ids[3],))
        assert ok is True and one_worker(sent, "fail_locked", workers) == port
        # a task already ended in this transaction is not ended again
        assert r.call("SELECT queue.finish_locked(%s, stage => 'locked')", (ids[0],))[0] == [(False,)]
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM queue.history WHERE stage = 'locked' AND status = 'done'").fetchone() == (3,)
        assert conn.execute("SELECT status::text, count(*) FROM queue.live_tasks WHERE stage = 'locked'"
                            " GROUP BY 1 ORDER BY 1").fetchall() == [("error", 1), ("ready", 1)]
    r.conn.close()


def test_a_null_stage_never_reaches_a_delegated_call(url: str) -> None:
    for bad in (None, ""):
        with pytest.raises(ValueError, match="non-empty name"):
            require_stage(bad)
        with pytest.raises(ValueError):
            Worker(url, {bad: lambda task: None})  # type: ignore[dict-item]
    # A call that leaves the stage out: distribute made its default '' (a NULL one would crash the
    # coordinator), so it is routed like a task of another stage and finds nothing; the
    # coordinator's sessions live on, and the call with the stage finishes the task.
    with psycopg.connect(url, autocommit=True) as watcher, psycopg.connect(url, autocommit=True) as conn:
        started = watcher.execute("SELECT pg_postmaster_start_time()").fetchone()
        conn.execute("SELECT queue.enqueue('{}', 'null.guard')")
        tid, lease = conn.execute("SELECT id, lease FROM queue.take_next('null.guard')").fetchone()
        assert conn.execute("SELECT queue.finish(%s, %s)", (tid, lease)).fetchone() == (False,)
        assert conn.execute("SELECT queue.release(%s, %s)", (tid, lease)).fetchone() == (False,)
        with pytest.raises(psycopg.Error) as lost:
            conn.execute("SELECT queue.heartbeat(%s, %s)", (tid, lease))
        assert lost.value.sqlstate == "SK001"
        assert conn.execute("SELECT queue.finish(%s, %s, stage => 'null.guard')", (tid, lease)).fetchone() == (True,)
        assert watcher.execute("SELECT pg_postmaster_start_time()").fetchone() == started


def test_multi_stage_takes_refuse_in_one_line_on_citus(url: str) -> None:
    """take_next, take_locked and consume with stages[] would cross shards: 0A000, saying so."""
    with psycopg.connect(url, autocommit=True) as conn:
        for call in ("SELECT * FROM queue.take_next(ARRAY['multi.a', 'multi.b'])",
                     "SELECT * FROM queue.take_locked(ARRAY['multi.*'])",
                     "SELECT * FROM queue.consume(ARRAY['multi.a'])"):
            with pytest.raises(psycopg.Error) as refused:
                conn.execute(call)
            assert refused.value.sqlstate == "0A000"
            assert refused.value.diag.message_primary == "multi-stage takes are not supported on Citus"


def test_max_running_holds_for_takes_inside_and_outside_transactions(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT queue.configure_stage('limited', max_running => 3)")
        admin.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[20]), 'limited')")
    holder = psycopg.connect(url)          # a take inside BEGIN holds the stage's lock to its commit
    other = psycopg.connect(url, autocommit=True)
    try:
        first = holder.execute("SELECT id FROM queue.take_next('limited', 2)").fetchall()
        assert len(first) == 2
        result: dict[str, Any] = {}

        def take() -> None:
            result["rows"] = other.execute("SELECT id FROM queue.take_next('limited', 5)").fetchall()

        t = threading.Thread(target=take)
        t.start()
        t.join(1.0)
        assert t.is_alive(), "the autocommit take did not wait for the transaction's take of the same stage"
        holder.commit()
        t.join(60)
        assert not t.is_alive()
        assert len(result["rows"]) == 1  # 3 - 2
        assert other.execute("SELECT id FROM queue.take_next('limited', 5)").fetchall() == []
        assert other.execute("SELECT count(*) FROM queue.live_tasks WHERE stage = 'limited' AND status = 'running'").fetchone() == (3,)
    finally:
        holder.close()
        other.close()



def test_enqueue_after_refuses_in_one_line_on_citus(url: str) -> None:
    """A task and the tasks it waits for can live on different shards: 0A000, saying so, nothing written."""
    with psycopg.connect(url, autocommit=True) as conn:
        [(first,)] = conn.execute("SELECT queue.enqueue('{}', 'after.a')").fetchall()
        with pytest.raises(psycopg.Error) as refused:
            conn.execute("SELECT queue.enqueue('{}', 'after.b', after => ARRAY[%s::bigint])", (first,))
        assert refused.value.sqlstate == "0A000"
        assert refused.value.diag.message_primary == "after is not supported on Citus"
        assert conn.execute("SELECT count(*) FROM queue.live_tasks WHERE stage = 'after.b'").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM queue.dependencies").fetchone() == (0,)


def test_results_progress_rate_limits_schedules_and_totals_on_citus(url: str, nodes: citus.CitusCluster) -> None:
    """Revision 0110's worker-facing calls on Citus: heartbeat with progress and finish with a
    result (one statement on the stage's worker each), a rate-limited and a grouped take (also
    inside a transaction), task_timeout, a schedule without overlap and run_schedule_now, and
    finished_totals across a retry that takes a run out of history (queue.finished_dropped)."""
    workers = [w.port for w in nodes.workers if w.port is not None]
    r = Remote(url)
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT queue.configure_stage('res.a', task_timeout => interval '90 seconds')")
        assert admin.execute("SELECT queue.task_timeout('res.a')").fetchone() == (timedelta(seconds=90),)
        [(tid,)], sent = r.call("SELECT queue.enqueue('{}', 'res.a')")
        port = one_worker(sent, "enqueue", workers)
        [(tid, lease)], _ = r.call("SELECT id, lease FROM queue.take_next('res.a')")
        _, sent = r.call("SELECT queue.heartbeat(%s, %s, stage => 'res.a', progress => %s::jsonb)", (tid, lease, '{"done": 5}'))
        assert one_worker(sent, "heartbeat", workers) == port
        assert admin.execute("SELECT progress FROM queue.tasks WHERE id = %s", (tid,)).fetchone() == ({"done": 5},)
        [(ok,)], sent = r.call("SELECT queue.finish(%s, %s, stage => 'res.a', result => %s::jsonb)", (tid, lease, '{"rows": 7}'))
        assert ok is True and one_worker(sent, "finish", workers) == port
        assert admin.execute("SELECT status::text, result FROM queue.tasks WHERE id = %s", (tid,)).fetchone() == ("done", {"rows": 7})
        # finish_batch carries a result per task into the same shard.
        admin.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[2]), 'res.a')")
        rows, _ = r.call("SELECT id, lease FROM queue.take_next('res.a', 2)")
        _, sent = r.call("SELECT queue.finish_batch(%s, %s::uuid[], 'res.a', %s::jsonb[])",
                         ([x[0] for x in rows], [x[1] for x in rows], ['{"k": 1}', '{"k": 2}']))
        assert one_worker(sent, "finish_batch", workers) == port
        assert admin.execute("SELECT result FROM queue.history WHERE id = ANY(%s) ORDER BY id",
                             ([x[0] for x in rows],)).fetchall() == [({"k": 1},), ({"k": 2},)]

        # A rate limit counts in queue.rate_windows on the stage's node: 3 an hour, however asked.
        admin.execute("SELECT queue.configure_stage('rate.a', rate_limit => 3, rate_window => interval '1 hour')")
        admin.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[10]), 'rate.a')")
        taken, sent = r.call("SELECT id FROM queue.take_next('rate.a', 2)")
        rate_port = one_worker(sent, "take_next", workers)
        assert len(taken) == 2
        with r.conn.transaction():
            assert len(r.call("SELECT id FROM queue.take_next('rate.a', 5)")[0]) == 1
        assert r.call("SELECT id FROM queue.take_next('rate.a', 5)")[0] == []
        assert admin.execute("SELECT taken FROM queue.rate_windows WHERE stage = 'rate.a' AND group_key = ''").fetchone() == (3,)
        assert admin.execute("SELECT count(*) FROM queue.live_tasks WHERE stage = 'rate.a' AND status = 'running'").fetchone() == (3,)
        assert rate_port in workers
        # group_limit: one running task per group (the same grouped claim as rate_per_group).
        admin.execute("SELECT queue.configure_stage('grp.a', group_limit => 1)")
        admin.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[3]), 'grp.a', group_key => 'g')")
        assert len(r.call("SELECT id FROM queue.take_next('grp.a', 3)")[0]) == 1
        assert r.call("SELECT id FROM queue.take_next('grp.a', 3)")[0] == []

        # A schedule without overlap: run now enqueues, a second run and a due tick skip while it is live.
        admin.execute("SELECT queue.schedule('citus.once', '* * * * *', 'sched.b', overlap => false)")
        [(first,)] = admin.execute("SELECT queue.run_schedule_now('citus.once')").fetchall()
        assert first is not None
        assert admin.execute("SELECT queue.run_schedule_now('citus.once')").fetchone() == (None,)
        assert admin.execute("SELECT queue.fire_schedules(now => now() + interval '2 minutes')").fetchone() == (0,)
        assert admin.execute("SELECT count(*) FROM queue.live_tasks WHERE stage = 'sched.b'").fetchone() == (1,)
        admin.execute("SELECT queue.unschedule('citus.once')")

        # finished_totals reads history and finished_dropped on every node; a retry takes a
        # cancelled run out of history and the total stays.
        [(cid,)] = admin.execute("SELECT queue.enqueue('{}', 'tot.a')").fetchall()
        admin.execute("SELECT queue.cancel(%s, 'tot.a')", (cid,))
        totals = "SELECT status, total FROM queue.finished_totals WHERE stage IN ('tot.a', 'res.a') ORDER BY stage, status"
        assert admin.execute(totals).fetchall() == [("done", 3), ("cancelled", 1)]
        admin.execute("SELECT queue.retry(%s, 'tot.a')", (cid,))
        assert admin.execute("SELECT count(*) FROM queue.history WHERE stage = 'tot.a'").fetchone() == (0,)
        assert admin.execute("SELECT status::text, total FROM queue.finished_dropped WHERE stage = 'tot.a'").fetchall() == [("cancelled", 1)]
        assert admin.execute(totals).fetchall() == [("done", 3), ("cancelled", 1)]
    r.conn.close()


def test_maintain_now_reaps_an_expired_lease_with_the_reaper_clock_on_citus(url: str) -> None:
    """maintain() and maintain_now() on Citus: reap_hung records the clock in the reference table
    queue.reaper_clock and gives back a task whose lease expired; one session at a time."""
    with psycopg.connect(url, autocommit=True) as admin, psycopg.connect(url, autocommit=True) as worker:
        steps = {row[0] for row in admin.execute("SELECT task FROM queue.maintain()").fetchall()}
        assert {"reap_hung", "fire_schedules", "rotate_partitions", "stage_waiters", "compact"} <= steps
        [(observed,)] = admin.execute("SELECT observed FROM queue.reaper_clock").fetchall()
        assert observed is not None
        worker.execute("SELECT queue.enqueue('{}', 'reap.a')")
        [(tid, lease)] = worker.execute("SELECT id, lease FROM queue.take_next('reap.a', 1, interval '1 second')").fetchall()
        # another session holding maintain_now's lock: this one returns no row at once
        with psycopg.connect(url) as holder:
            holder.execute("SELECT pg_advisory_xact_lock(hashtextextended('skiplock.worker_maintain', 0))")
            assert worker.execute("SELECT * FROM queue.maintain_now()").fetchall() == []
        reaped: list[int] = []

        def reaped_it() -> bool:
            rows = dict((t, c) for t, c, _ in worker.execute("SELECT * FROM queue.maintain_now()").fetchall())
            reaped.append(rows.get("reap_hung", 0))
            return admin.execute("SELECT status::text FROM queue.live_tasks WHERE id = %s", (tid,)).fetchone() == ("error",)
        wait_for("maintain_now to reap the expired lease", reaped_it)
        assert sum(reaped) >= 1
        with pytest.raises(psycopg.Error) as lost:
            worker.execute("SELECT queue.heartbeat(%s, %s, stage => 'reap.a')", (tid, lease))
        assert lost.value.sqlstate == "SK001"
        assert admin.execute("SELECT observed >= %s FROM queue.reaper_clock", (observed,)).fetchone() == (True,)


# -- the drain -------------------------------------------------------------------------------------
FIRST = [f"drain.a{k}" for k in range(4)]
SECOND = [f"drain.b{k}" for k in range(4)]
TASKS_PER_STAGE = 500          # 2,000 tasks; a quarter move on to a second stage, a fifth fail once
WORKERS = 4
DEADLINE = 600.0               # a bound against a hang, not a verdict


def drain_worker(url: str, stop: threading.Event, stats: dict[str, Any], lock: threading.Lock) -> None:
    """Take, fail once when the payload says so, finish (moving on when it says so); on any error
    reconnect and go on: a task whose outcome was lost comes back by lease expiry (reap_hung)."""
    rng = random.Random()
    conn: psycopg.Connection | None = None
    while not stop.is_set():
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(url, autocommit=True, connect_timeout=5)
            stages = FIRST + SECOND
            rng.shuffle(stages)
            for stage in stages:
                rows = conn.execute("SELECT id, payload, attempt, lease FROM queue.take_next(%s, 10, interval '3 seconds')",
                                    (require_stage(stage),)).fetchall()
                for tid, payload, attempt, lease in rows:
                    if payload.get("flaky") and attempt == 1:
                        conn.execute("SELECT queue.fail(%s, %s, 'flaky', retry_in => interval '0', stage => %s)",
                                     (tid, lease, stage))
                        continue
                    nxt = payload.get("next") if stage in FIRST else None
                    ok = conn.execute("SELECT queue.finish(%s, %s, %s, stage => %s)", (tid, lease, nxt, stage)).fetchone()[0]
                    with lock:
                        stats["finished" if ok else "stale"] += 1
        except psycopg.Error as e:
            with lock:
                stats["errors"] += 1
                stats["last_error"] = str(e).splitlines()[0] if str(e) else repr(e)
            if conn is not None:
                conn.close()
            conn = None
            time.sleep(0.2)
    if conn is not None:
        conn.close()


def test_consume_admin_calls_and_the_views_work_on_citus(url: str, nodes: citus.CitusCluster) -> None:
    """What the first Citus stops left out: consume (one statement on its stage's node; record_results
    after it in one transaction, on the same node), cancel,
    set_priority and retry (retry needs the stage: 0A000 with a hint without it), the views
    metrics and stage_config (which find stages without a recursive CTE)."""
    workers = [w.port for w in nodes.workers if w.port is not None]
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[5]), 'cons.a')")
        r = Remote(url)
        taken, sent = r.call("SELECT id FROM queue.consume('cons.a', 3)")
        one_worker(sent, "consume", workers)
        assert len(taken) == 3
        with r.conn.transaction(force_rollback=True):
            assert len(r.call("SELECT id FROM queue.consume('cons.a', 5)")[0]) == 2
        assert len(r.call("SELECT id FROM queue.consume('cons.a', 5)")[0]) == 2  # the rollback gave them back
        # record_results beside consume in one transaction: both on the stage's node, where the
        # consumed rows carry that node's transaction id.
        admin.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[2]), 'cons.r')")
        with r.conn.transaction():
            got, sent = r.call("SELECT id FROM queue.consume('cons.r', 2)")
            port = one_worker(sent, "consume", workers)
            consumed = [row[0] for row in got]
            recorded, sent = r.call("SELECT queue.record_results('cons.r', %s, %s::jsonb[])",
                                    (consumed, ['{"ok": 1}', '{"ok": 2}']))
            assert one_worker(sent, "record_results", workers) == port
            assert recorded == [(2,)]
        assert admin.execute("SELECT queue.record_results('cons.r', %s, %s::jsonb[])",
                             (consumed, ['{"late": 1}', '{"late": 2}'])).fetchone() == (0,)  # another transaction's
        assert admin.execute("SELECT result FROM queue.tasks WHERE stage = 'cons.r' ORDER BY id").fetchall() == [
            ({"ok": 1},), ({"ok": 2},)]
        r.conn.close()
        assert admin.execute("SELECT count(*) FROM queue.history WHERE stage = 'cons.a' AND status = 'done'").fetchone() == (5,)

        ids = [row[0] for row in admin.execute(
            "SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[3]), 'admin.a')").fetchall()]
        admin.execute("SELECT queue.set_priority(%s, 5, 'admin.a')", (ids[0],))
        admin.execute("SELECT queue.set_priority(%s, 7)", (ids[1],))
        admin.execute("SELECT queue.cancel(%s, 'admin.a')", (ids[0],))
        admin.execute("SELECT queue.cancel(%s)", (ids[1],))
        with pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
            admin.execute("SELECT queue.retry(%s)", (ids[0],))
        assert refused.value.diag.message_hint is not None and "retry(id, stage)" in refused.value.diag.message_hint
        admin.execute("SELECT queue.retry(%s, 'admin.a')", (ids[0],))
        admin.execute("SELECT queue.retry(%s, 'admin.a')", (ids[1],))
        assert admin.execute("SELECT id, status::text, priority FROM queue.live_tasks WHERE stage = 'admin.a' ORDER BY id"
                             ).fetchall() == [(ids[0], "ready", 5), (ids[1], "ready", 7), (ids[2], "ready", 0)]

        metrics = {(st, status): (tasks, fin) for st, status, tasks, _, fin in admin.execute(
            "SELECT stage, status, tasks, oldest_age_seconds, finished_last_minute FROM queue.metrics"
            " WHERE stage IN ('cons.a', 'admin.a')").fetchall()}
        assert metrics[("admin.a", "ready")] == (3, 0)
        assert metrics[("cons.a", "done")][0] == 0  # listed for its history alone: no live task
        assert len(metrics) == 2 * 7  # every status of both stages (waiting too)
        stages = {row[0] for row in admin.execute("SELECT stage FROM queue.stage_config").fetchall()}
        assert {"*", "admin.a"} <= stages and "cons.a" not in stages  # no live task, no settings

        for view in ("tasks", "stats", "errors", "hourly"):
            admin.execute(f"SELECT count(*) FROM queue.{view}")
        # A schedule fires into its stage; maintain and compact run.
        admin.execute("SELECT queue.schedule('citus.tick', '* * * * *', 'sched.a')")
        assert admin.execute("SELECT queue.fire_schedules(now => now() + interval '2 minutes')").fetchone() == (1,)
        assert admin.execute("SELECT count(*) FROM queue.live_tasks WHERE stage = 'sched.a'").fetchone() == (1,)
        admin.execute("SELECT queue.unschedule('citus.tick')")
        assert {row[0] for row in admin.execute("SELECT task FROM queue.maintain()").fetchall()} >= {"reap_hung", "compact"}
        admin.execute("SELECT queue.compact()")

        # Rotation makes the partitions ahead (a day each, on every node's shards).
        made = admin.execute("SELECT action, partition FROM queue.rotate_partitions(now => now() + interval '20 days')").fetchall()
        assert made and {a for a, _ in made} == {"created"}, made
        distributed = admin.execute("SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = ANY(%s::regclass[])",
                                    ([p for _, p in made],)).fetchone()
        assert distributed == (len(made),)


def backend_pids(node_url: str) -> list[int]:
    with psycopg.connect(node_url, autocommit=True) as conn:
        return [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend' AND state = 'active'").fetchall()]


def wait_for(what: str, check: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
        time.sleep(0.05)


def test_a_drain_by_four_workers_across_a_killed_backend_and_a_restarted_node_loses_nothing(
        url: str, nodes: citus.CitusCluster) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        for stage in FIRST + SECOND:
            admin.execute("SELECT queue.configure_stage(%s, max_attempts => 20, backoff_base => interval '0')", (stage,))
        expected: dict[str, int] = {s: 0 for s in FIRST + SECOND}
        for k, stage in enumerate(FIRST):
            payloads = []
            for n in range(TASKS_PER_STAGE):
                p: dict[str, Any] = {"n": n}
                if n % 4 == 0:
                    p["next"] = SECOND[k]
                    expected[SECOND[k]] += 1
                if n % 5 == 0:
                    p["flaky"] = True
                payloads.append(json.dumps(p))
            expected[stage] = TASKS_PER_STAGE
            admin.execute("SELECT queue.enqueue_batch(%s::jsonb[], %s)", (payloads, stage))
        total_done = sum(expected.values())

        stop = threading.Event()
        lock = threading.Lock()
        stats: dict[str, Any] = {"finished": 0, "stale": 0, "errors": 0, "last_error": None}
        threads = [threading.Thread(target=drain_worker, args=(url, stop, stats, lock)) for _ in range(WORKERS)]
        for t in threads:
            t.start()
        try:
            # kill -9 of a worker node's backend that serves a call, once a third is done
            wait_for("a third of the drain", lambda: stats["finished"] >= total_done // 3, DEADLINE)
            victim = nodes.url(nodes.workers[0])
            pids: list[int] = []

            def serving() -> bool:
                pids[:] = backend_pids(victim)
                return bool(pids)
            wait_for("an active backend on worker 1", serving)
            os.kill(pids[0], signal.SIGKILL)
            # a restart of the other worker node (immediate: a crash), once two thirds are done
            wait_for("two thirds of the drain", lambda: stats["finished"] >= 2 * total_done // 3, DEADLINE)
            nodes.workers[1].restart_after_crash()

            def drained() -> bool:
                try:
                    # A step into a stage on another node commits there in two phases; one whose node
                    # crashed in between shows once Citus recovers it, which its maintenance daemon
                    # does every citus.recover_2pc_interval: recover now, on every node.
                    for node in nodes.nodes:
                        with psycopg.connect(nodes.url(node), autocommit=True) as c:
                            c.execute("SELECT recover_prepared_transactions()")
                    admin.execute("SELECT queue.reap_hung()")  # tasks whose outcome was lost in the faults
                    return admin.execute("SELECT count(*) FROM queue.live_tasks WHERE stage LIKE 'drain.%'").fetchone() == (0,)
                except psycopg.Error:  # the restarted node is not back yet
                    return False
            wait_for("the queue to drain", drained, DEADLINE)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        done = dict(admin.execute("SELECT stage, count(*) FROM queue.history WHERE stage LIKE 'drain.%'"
                                  " AND status = 'done' GROUP BY stage").fetchall())
        twice = admin.execute("SELECT id, stage, count(*) FROM queue.history WHERE stage LIKE 'drain.%'"
                              " GROUP BY id, stage HAVING count(*) > 1").fetchall()
        other = admin.execute("SELECT status, count(*) FROM queue.history WHERE stage LIKE 'drain.%'"
                              " AND status <> 'done' GROUP BY 1").fetchall()
    assert twice == [], f"finished twice ({stats})"
    assert other == [], f"ended other than done ({stats})"
    assert done == expected, f"lost tasks ({stats})"
    assert stats["errors"] >= 1, "the faults reached no worker: they proved nothing"


def test_rotation_drops_history_partitions_on_citus(url: str) -> None:
    """Last in this file: it drops the partitions that hold the earlier tests' history."""
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT queue.configure_history(retention => '1 day')")
        actions = admin.execute("SELECT action, partition FROM queue.rotate_partitions(now => now() + interval '40 days')").fetchall()
        dropped = [p for a, p in actions if a == "dropped"]
        assert dropped and not [a for a, _ in actions if a.startswith("skipped")], actions
        assert [admin.execute("SELECT to_regclass(%s)", (p,)).fetchone()[0] for p in dropped] == [None] * len(dropped)
        assert admin.execute("SELECT count(*) FROM queue.history WHERE finished < now() + interval '39 days'").fetchone() == (0,)
