"""finish, fail, release and consume plan each statement once a session, even on a hot table that
was never analyzed (revision 0108). Without `plan_cache_mode = force_generic_plan` PostgreSQL
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


def test_the_worker_calls_plan_once_on_a_table_never_analyzed(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[1000]), %s) FROM generate_series(1, 10)",
                     (STAGE,))
        never = conn.execute("SELECT reltuples < 0 FROM pg_class WHERE oid = 'queue.live_tasks'::regclass").fetchone()[0]
        assert never, "live_tasks was analyzed: the test would not see the state it is about"
        conn.execute("SELECT pg_stat_statements_reset()")
        for _ in range(ROUNDS):
            tasks = conn.execute("SELECT id, lease FROM queue.take_next(%s, 4)", (STAGE,)).fetchall()
            (a, la), (b, lb), (c, lc), (d, ld) = tasks
            conn.execute("SELECT queue.finish(%s, %s, stage => %s)", (a, la, STAGE))
            conn.execute("SELECT queue.finish(%s, %s)", (b, lb))
            conn.execute("SELECT queue.fail(%s, %s, 'failed', stage => %s)", (c, lc, STAGE))
            conn.execute("SELECT queue.release(%s, %s, stage => %s)", (d, ld, STAGE))
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
                   "t.ctid = ANY"):                                            # consume
        assert needle in texts, f"{needle!r} not among the statements seen: {texts}"
    replanned = [(calls, plans, text[:90]) for calls, plans, text in rows if plans > 3]
    assert not replanned, f"planned again call after call (calls, plans, statement): {replanned}"
