"""finish, fail, release, consume and finish_batch plan each statement once a session, even on a hot
table that was never analyzed (revisions 0108 and 0109), and finish_batch and reap_hung find their
tasks through an index there. Without `plan_cache_mode = force_generic_plan` PostgreSQL
guessed that `id = $1` matches 0.5 % of such a table, judged the generic plan dearer than a custom
one, and planned finish's statement again on every call: six times the statement's own work.

Its own cluster, with pg_stat_statements loaded (it counts plans as well as calls) and autovacuum
off, so that nothing analyzes the table behind the test's back.
"""

from __future__ import annotations

from typing import Iterator

import psycopg
import pytest

from skiplock import devdb, migrate

STAGE = "plan.once"
ROUNDS = 60
SETTINGS = {"shared_preload_libraries": "'pg_stat_statements'", "pg_stat_statements.track": "all",
            "pg_stat_statements.track_planning": "on", "autovacuum": "off"}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    cluster = devdb.Cluster(durable=False, settings=SETTINGS).start()
    try:
        url = cluster.createdb("plan_once")
        migrate.upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        yield url
    finally:
        cluster.stop()


def fill_never_analyzed(conn: psycopg.Connection, stage: str, tasks: int) -> None:
    """Enqueue `tasks` tasks into `stage`, and check that live_tasks has still never been analyzed."""
    conn.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[1000]), %s) FROM generate_series(1, %s)",
                 (stage, tasks // 1000))
    never = conn.execute("SELECT reltuples < 0 FROM pg_class WHERE oid = 'queue.live_tasks'::regclass").fetchone()[0]
    assert never, "live_tasks was analyzed: the test would not see the state it is about"


def test_the_worker_calls_plan_once_on_a_table_never_analyzed(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        fill_never_analyzed(conn, STAGE, 10_000)
        conn.execute("SELECT pg_stat_statements_reset()")
        for _ in range(ROUNDS):
            tasks = conn.execute("SELECT id, lease FROM queue.take_next(%s, 6)", (STAGE,)).fetchall()
            (a, la), (b, lb), (c, lc), (d, ld), (e, le), (f, lf) = tasks
            conn.execute("SELECT queue.finish(%s, %s, stage => %s)", (a, la, STAGE))
            conn.execute("SELECT queue.finish(%s, %s)", (b, lb))
            conn.execute("SELECT queue.fail(%s, %s, 'failed', stage => %s)", (c, lc, STAGE))
            conn.execute("SELECT queue.release(%s, %s, stage => %s)", (d, ld, STAGE))
            assert conn.execute("SELECT queue.finish_batch(%s, %s, %s)", ([e, f], [le, lf], STAGE)).fetchone()[0] == 2
            assert len(conn.execute("SELECT * FROM queue.consume(%s, 2)", (STAGE,)).fetchall()) == 2
        # Statements inside those functions that ran every round, and how often each was planned.
        rows = conn.execute("""
            SELECT s.calls, s.plans, regexp_replace(s.query, '\\s+', ' ', 'g')
              FROM pg_stat_statements s
             WHERE s.toplevel = false AND s.calls >= %s
               AND s.query ~ 'queue\\.live_tasks'""", (ROUNDS,)).fetchall()
    texts = " | ".join(r[2] for r in rows)
    assert rows, "no statement on queue.live_tasks ran every round"

    for needle in ("DELETE FROM queue.live_tasks t WHERE t.id = finish.id",   # finish
                   "WHERE t.id = fail.id",                                     # fail
                   "WHERE t.id = release.id",                                   # release
                   "t.ctid = ANY",                                             # consume
                   "USING pairs p"):                                           # finish_batch
        assert needle in texts, f"{needle!r} not among the statements seen: {texts}"
    replanned = [(calls, plans, text[:90]) for calls, plans, text in rows if plans > 3]
    assert not replanned, f"planned again call after call (calls, plans, statement): {replanned}"


def test_finish_batch_probes_the_index_on_a_table_never_analyzed(url: str) -> None:
    """Without revision 0109's clauses the plan cache settled, from the sixth call, on a generic plan
    that read all of live_tasks for every call (a nested loop over a Seq Scan: 418 ms a call of 100
    pairs on 40,000 tasks). pg_stat_xact_user_tables counts the scans of the current transaction
    (with those of earlier ones not yet reported: the test takes the difference)."""
    stage = "plan.batch"
    with psycopg.connect(url, autocommit=True) as conn:
        fill_never_analyzed(conn, stage, 5_000)
        batches = [conn.execute("SELECT array_agg(id), array_agg(lease) FROM queue.take_next(%s, 10)", (stage,)).fetchone()
                   for _ in range(12)]
        scans = """SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables WHERE relid = 'queue.live_tasks'::regclass"""
        with conn.transaction():  # counts not yet reported: within a transaction only its own come in
            seq0, idx0 = conn.execute(scans).fetchone()
            finished = [conn.execute("SELECT queue.finish_batch(%s, %s)", b).fetchone()[0] for b in batches]
            seq1, idx1 = conn.execute(scans).fetchone()
        seq, idx = seq1 - seq0, idx1 - idx0
    assert finished == [10] * 12
    assert seq == 0, f"finish_batch read live_tasks sequentially {seq} times in 12 calls"
    assert idx >= 120, f"finish_batch probed the index {idx} times for 120 pairs"


def test_reap_hung_reads_the_index_of_running_tasks_on_a_table_never_analyzed(url: str) -> None:
    """Without revision 0109's clause reap_hung read all of live_tasks for its expired leases, and
    again for the join that moves them: 15 sequential scans in 10 calls on 40,000 tasks."""
    stage = "plan.reap"
    scans = """SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relid = 'queue.live_tasks'::regclass"""
    with psycopg.connect(url, autocommit=True) as conn:
        fill_never_analyzed(conn, stage, 5_000)
        conn.execute("SELECT queue.reap_hung()")  # what earlier tests left running
        ends = conn.execute("SELECT max(lease_expires) FROM queue.take_next(%s, 7, lease_for => '1 millisecond')",
                            (stage,)).fetchone()[0]
        # Wait for the leases' end (a transaction's now() is its start), bounded.
        for _ in range(10_000):
            if conn.execute("SELECT now() > %s", (ends,)).fetchone()[0]:
                break
        else:
            raise AssertionError("the leases of 1 ms did not expire")
        with conn.transaction():
            seq0 = conn.execute(scans).fetchone()[0]
            reaped = [conn.execute("SELECT queue.reap_hung()").fetchone()[0] for _ in range(10)]
            seq = conn.execute(scans).fetchone()[0] - seq0
    assert reaped[0] == 7 and reaped[1:] == [0] * 9, reaped
    assert seq == 0, f"reap_hung read live_tasks sequentially {seq} times in 10 calls"
