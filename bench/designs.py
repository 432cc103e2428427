"""The two queues the benchmark drives: skiplock, and the seed 001 queue it improves on.

Each design is its database, its pgbench scripts, and the few SQL statements the harness needs
around a run (reset, preload, counts, sizes). The queue logic itself stays in SQL: skiplock's
functions, and the article's statements quoted in seed_baseline.sql and scripts/seed_*.sql.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import psycopg

from skiplock import migrate, sqlfiles

BENCH_DIR = Path(__file__).resolve().parent
PAYLOAD = '{"doc": 42}'  # every workload and the ceiling write this payload
PRELOAD_CHUNK = 100_000  # enqueue_batch takes at most 100,000 payloads a call


@dataclass(frozen=True)
class Design:
    name: str
    dbname: str
    hot_table: str         # the table workers take from
    enqueue_script: str    # W1
    process_script: str    # W2 and the workers of W3/W4
    reset_sql: str         # empty every table the design writes
    preload_sql: str       # %(n)s tasks, ready in %(stage)s
    done_sql: str          # exact count of finished tasks (after a run)
    ready_sql: str         # tasks still waiting in %(stage)s
    processed_sql: str     # cheap running count of finished tasks, from the statistics collector
    claim_sql: str         # one take, run with auto_explain to capture the claim query's plan
    has_history: bool      # whether finished tasks are kept in a history table

    def preload(self, conn: psycopg.Connection, stage: str, n: int) -> None:
        left = n
        while left > 0:
            chunk = min(left, PRELOAD_CHUNK)
            conn.execute(self.preload_sql, {"n": chunk, "stage": stage, "payload": PAYLOAD})
            left -= chunk

    def count(self, conn: psycopg.Connection, sql: str, stage: str = "") -> int:
        return conn.execute(sql, {"stage": stage}).fetchone()[0]


SKIPLOCK = Design(
    name="skiplock",
    dbname="bench",
    hot_table="queue.live_tasks",
    enqueue_script="enqueue.sql",
    process_script="process.sql",
    reset_sql="TRUNCATE queue.live_tasks, queue.history, ceiling",
    preload_sql="SELECT count(*) FROM queue.enqueue_batch(array_fill(%(payload)s::jsonb, ARRAY[%(n)s]), %(stage)s)",
    done_sql="SELECT count(*) FROM queue.history",
    ready_sql="SELECT count(*) FROM queue.live_tasks WHERE stage = %(stage)s AND status = 'ready'",
    # finish() deletes the task from the hot table: deletions count finished tasks.
    processed_sql="SELECT n_tup_del FROM pg_stat_user_tables WHERE relid = 'queue.live_tasks'::regclass",
    claim_sql="SELECT * FROM queue.take_next(%(stage)s)",
    has_history=True,
)

# The article's take, verbatim (seed_baseline.sql quotes it too).
SEED_TAKE = """with next_task as (
select id from task
where status = 0
limit 1
for update skip locked
)
update task
set
status = 1
from next_task
where task.id = next_task.id
returning task.id"""

SEED = Design(
    name="seed",
    dbname="seed",
    hot_table="task",
    enqueue_script="seed_enqueue.sql",
    process_script="seed_process.sql",
    reset_sql="TRUNCATE task",
    # The article's add, many ids per statement; ids continue after the largest one.
    preload_sql="insert into task (id) select g from generate_series("
                "(select coalesce(max(id), 0) + 1 from task), (select coalesce(max(id), 0) from task) + %(n)s) g "
                "on conflict (id) do nothing",
    done_sql="SELECT count(*) FROM task WHERE status = 2",
    ready_sql="SELECT count(*) FROM task WHERE status = 0",
    # take and finish are one UPDATE each: half the updates are finished tasks.
    processed_sql="SELECT n_tup_upd / 2 FROM pg_stat_user_tables WHERE relid = 'task'::regclass",
    claim_sql=SEED_TAKE,
    has_history=False,
)


def create_databases(admin_url: str, url_of: Callable[[str], str], from_schema: bool) -> None:
    """The bench database (skiplock from its migrations, or from schema/) and the seed database."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for design in (SKIPLOCK, SEED):
            conn.execute(f'CREATE DATABASE "{design.dbname}"')
    bench_url = url_of(SKIPLOCK.dbname)
    if from_schema:
        with psycopg.connect(bench_url) as conn:
            sqlfiles.build_from_schema(conn)
    else:
        migrate.upgrade(bench_url)
    with psycopg.connect(bench_url, autocommit=True) as conn:
        conn.execute((BENCH_DIR / "ceiling.sql").read_text())
    with psycopg.connect(url_of(SEED.dbname), autocommit=True) as conn:
        conn.execute((BENCH_DIR / "seed_baseline.sql").read_text())


def reset(conn: psycopg.Connection, design: Design) -> None:
    conn.execute(design.reset_sql)


def settle(conn: psycopg.Connection, design: Design) -> None:
    """After a preload: visibility map and statistics up to date, and a checkpoint, so that a
    run starts from the same state every time and is not charged for the preload's flush."""
    conn.execute(f"VACUUM (ANALYZE) {design.hot_table}")
    conn.execute("CHECKPOINT")


def plant_old_history(conn: psycopg.Connection, days_ago: int = 40, days: int = 3,
                      per_day: int = 100_000) -> str | None:
    """For W4: history partitions older than the retention, with rows in them, so that the soak's
    rotations have partitions to drop while the workers finish tasks into history. A real soak of
    10 minutes cannot age a partition past a retention of at least an hour. rotate_partitions()
    makes the partitions as of `days_ago` (and records that as its last rotation, so the next
    maintain() call rotates). None without queue.rotate_partitions(now)."""
    exists = conn.execute("SELECT to_regprocedure('queue.rotate_partitions(timestamptz)') IS NOT NULL").fetchone()[0]
    if not exists:
        return None
    retention = conn.execute("SELECT retention::text FROM queue.history_policy").fetchone()[0]
    made = conn.execute("SELECT count(*) FROM queue.rotate_partitions(now() - %s * interval '1 day')"
                        " WHERE action = 'created'", (days_ago,)).fetchone()[0]
    conn.execute("""
        INSERT INTO queue.history (id, stage, status, priority, run_at, payload, attempt, created, started, finished)
        SELECT -g, 'w4-old', 'done', 0, t, jsonb_build_object('n', g), 1, t, t, t
          FROM generate_series(1, %(rows)s) g,
               LATERAL (SELECT date_trunc('day', now() - %(days_ago)s * interval '1 day')
                               + (g %% %(days)s) * interval '1 day' + (g %% 86400) * interval '1 second') AS x(t)""",
                 {"rows": days * per_day, "days_ago": days_ago, "days": days})
    conn.execute("VACUUM (ANALYZE) queue.history")
    conn.execute("CHECKPOINT")
    return (f"{days * per_day:,} finished tasks in {days} daily partitions {days_ago} to {days_ago - days + 1} "
            f"days old, beyond the retention of {retention}, among {made} partitions made as of {days_ago} days ago")


def maintenance_function(conn: psycopg.Connection) -> str:
    """queue.maintain() when it exists and can be called without arguments; else queue.reap_hung()."""
    exists = conn.execute("""
        SELECT EXISTS (SELECT FROM pg_proc
                        WHERE pronamespace = 'queue'::regnamespace AND proname = 'maintain'
                          AND pronargs = pronargdefaults)""").fetchone()[0]
    return "queue.maintain()" if exists else "queue.reap_hung()"


def soak_policy(conn: psycopg.Connection) -> str | None:
    """For W4: let maintain() run the partition rotation every minute of the soak (the default is
    every 10 minutes), so that rotation runs under load several times. None if there is no policy."""
    exists = conn.execute("SELECT to_regprocedure('queue.configure_history(interval, integer, interval, text, interval)')"
                          " IS NOT NULL").fetchone()[0]
    if not exists:
        return None
    row = conn.execute("SELECT partition_interval::text, premake, retention::text, rotate_every::text"
                       "  FROM queue.configure_history(rotate_every => interval '1 minute')").fetchone()
    return f"partition_interval {row[0]}, premake {row[1]}, retention {row[2]}, rotate_every {row[3]}"
