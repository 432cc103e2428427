"""Seed 004's workload (`--only seed004`): its article's design against skiplock, in one pass.

The article's pgbench scripts, at 16 clients: insert one task for a random tenant of 1,000, and
consume a random tenant's tasks in batches (of 1,000 here; 10,000 in the article, whose server
had 64 cores). Its design: a task table and a history table per tenant, an insert function that
picks the table, a consume that moves a batch to the tenant's history in one statement
(bench/seed004.sql, its own database `seed004`). skiplock: a stage per tenant, `enqueue` and
`consume`, or `drain` (design skiplock-drain: one consumer a tenant at a time, no row lock a task;
skiplock-drain-none: the same with every tenant's stage at `history => 'none'`)
(bench/scripts/skiplock004_*.sql). Each consume point starts from a backlog preloaded
into every tenant, sized for the design's expected rate over the point with a margin, vacuumed
and checkpointed; it counts the tasks the database shows consumed (moved to history, or gone from skiplock's live
table for a stage that keeps none).
"""

from __future__ import annotations

import psycopg

from bench import pgbench
from bench.designs import BENCH_DIR, SKIPLOCK
from bench.points import Point
from bench.progress import log
from skiplock import devdb

DBNAME = "seed004"
TENANTS = 1000
BATCH = 1000
CLIENTS = 16
# tasks/s each design is expected to consume at most: the preload is sized from it
# (the seed's was 400,000: it emptied its preload within the point, so its rate was a lower bound)
EXPECTED_CONSUME = {"seed004": 1_000_000, "skiplock": 150_000, "skiplock-drain": 300_000,
                    "skiplock-drain-none": 400_000, "bound": 150_000}
SEED_SQL = "seed004.sql"


def create_database(cluster: devdb.Cluster) -> None:
    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{DBNAME}"')
    with psycopg.connect(cluster.url(DBNAME), autocommit=True) as conn:
        conn.execute((BENCH_DIR / SEED_SQL).read_text())


def _tables(prefix: str) -> str:
    return ", ".join(f"{prefix}_{i}" for i in range(1, TENANTS + 1))


def _reset(conn: psycopg.Connection, design: str) -> None:
    if design == "seed004":
        conn.execute(f"TRUNCATE {_tables('task_init')}, {_tables('task_hist')}")
    else:
        conn.execute("TRUNCATE queue.live_tasks, queue.history, queue.finished_counts")
        conn.execute("DELETE FROM queue.stage_settings WHERE stage LIKE 's004.%'")
        if design.endswith("-none"):
            conn.execute("SELECT count(*) FROM generate_series(1, %s) i, "
                         "LATERAL queue.configure_stage('s004.' || i, history => 'none')", (TENANTS,))


def _count_consumed(conn: psycopg.Connection, design: str, preloaded: int) -> int:
    if design != "seed004":
        return preloaded - conn.execute("SELECT count(*) FROM queue.live_tasks").fetchone()[0]
    # one count per tenant table, summed in the server
    union = " UNION ALL ".join(f"SELECT count(*) AS n FROM task_hist_{i}" for i in range(1, TENANTS + 1))
    return conn.execute(f"SELECT sum(n)::bigint FROM ({union}) c").fetchone()[0]


def _preload(conn: psycopg.Connection, design: str, per_tenant: int) -> None:
    if design == "seed004":
        conn.execute(f"""DO $$ BEGIN FOR i IN 1..{TENANTS} LOOP
            EXECUTE format('INSERT INTO %I (uid, info, ts) SELECT %s, ''test'', now()::timestamp
                             FROM generate_series(1, {per_tenant})', 'task_init_' || i, i);
            END LOOP; END $$""")
        conn.execute("VACUUM (ANALYZE)")
    else:
        conn.execute("SELECT count(*) FROM generate_series(1, %s) i, LATERAL queue.enqueue_batch("
                     "array_fill('{\"info\": \"test\"}'::jsonb, ARRAY[%s]), 's004.' || i)", (TENANTS, per_tenant))
        conn.execute("VACUUM (ANALYZE) queue.live_tasks")
    conn.execute("CHECKPOINT")


def _dbname(design: str) -> str:
    return DBNAME if design == "seed004" else SKIPLOCK.dbname


def insert(cluster: devdb.Cluster, design: str, seconds: float, clients: int = CLIENTS) -> Point:
    with psycopg.connect(cluster.url(_dbname(design)), autocommit=True) as conn:
        _reset(conn, design)
        conn.execute("CHECKPOINT")
    script = {"seed004": "seed004_insert.sql", "skiplock": "skiplock004_insert.sql", "bound": "bounds/s004_insert.sql"}[design]
    s = pgbench.run(cluster, _dbname(design), script, clients, seconds)
    log(f"  S4  {design:8} insert  {clients:2} clients: {s.tps:9,.0f} tasks/s")
    return Point("S4-insert", design, clients, seconds, s.tps, s.tps, s.transactions, s.failed)


def consume(cluster: devdb.Cluster, design: str, seconds: float, clients: int = CLIENTS) -> Point:
    per_tenant = max(BATCH, int(EXPECTED_CONSUME[design] * seconds * 1.5 / TENANTS))
    with psycopg.connect(cluster.url(_dbname(design)), autocommit=True) as conn:
        _reset(conn, design)
        log(f"  S4  {design:8} consume {clients:2} clients: preloading {per_tenant:,} tasks into each of {TENANTS:,} tenants")
        _preload(conn, design, per_tenant)
    script = {"seed004": "seed004_consume.sql", "skiplock": "skiplock004_consume.sql",
              "skiplock-drain": "skiplock004_drain.sql", "skiplock-drain-none": "skiplock004_drain.sql",
              "bound": "bounds/s004_consume.sql"}[design]
    s = pgbench.run(cluster, _dbname(design), script, clients, seconds, {"batch": str(BATCH)})
    with psycopg.connect(cluster.url(_dbname(design)), autocommit=True) as conn:
        moved = _count_consumed(conn, design, per_tenant * TENANTS)
    jobs = s.tps * moved / s.transactions if s.transactions else 0.0
    # With most tenants drained, calls find little: the rate is then a lower bound.
    drained = moved > 0.67 * per_tenant * TENANTS
    log(f"  S4  {design:8} consume {clients:2} clients: {jobs:9,.0f} tasks/s"
        + ("  (two thirds of the backlog consumed: a lower bound)" if drained else ""))
    return Point("S4-consume", design, clients, seconds, jobs, s.tps, s.transactions, s.failed, moved, drained)
