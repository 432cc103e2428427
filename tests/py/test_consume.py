"""consume: concurrent consumers get disjoint tasks and never wait on each other; a consumer that
rolls back gives its tasks to the next one. (One session: tests/sql/059_consume.sql.)"""

from __future__ import annotations

import threading
import time

import psycopg


def test_concurrent_consumers_take_disjoint_tasks_without_waiting(db: str, conn: psycopg.Connection):
    conn.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[500]), 'cs.race')")
    with psycopg.connect(db) as holder:
        held = [r[0] for r in holder.execute("SELECT id FROM queue.consume('cs.race', 100)")]
        conn.execute("SET lock_timeout = '3s'")  # a wait shows as an error, not a hang
        started = time.monotonic()
        other = [r[0] for r in conn.execute("SELECT id FROM queue.consume('cs.race', 100)")]
        assert time.monotonic() - started < 0.5, "consume waited on another consumer's open transaction"
        conn.execute("RESET lock_timeout")
        assert len(held) == len(other) == 100 and not set(held) & set(other)
        assert min(other) > max(held), "the second consumer skipped the held tasks and went on in order"
        holder.rollback()
    # The rolled-back batch is due again, first in order.
    again = [r[0] for r in conn.execute("SELECT id FROM queue.consume('cs.race', 100)")]
    assert again == sorted(held)


def test_many_consumers_drain_a_stage_exactly_once(db: str, conn: psycopg.Connection):
    conn.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[2000]), 'cs.drain')")
    got: list[list[int]] = []
    errors: list[BaseException] = []

    def consumer() -> None:
        try:
            mine: list[int] = []
            with psycopg.connect(db, autocommit=True) as c:
                while ids := [r[0] for r in c.execute("SELECT id FROM queue.consume('cs.drain', 37)")]:
                    mine += ids
            got.append(mine)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=consumer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    everything = [i for ids in got for i in ids]
    assert len(everything) == len(set(everything)) == 2000
    assert conn.execute("SELECT count(*) FROM queue.history WHERE stage = 'cs.drain' AND status = 'done'"
                        ).fetchone()[0] == 2000
    assert conn.execute("SELECT count(*) FROM queue.live_tasks WHERE stage = 'cs.drain'").fetchone()[0] == 0
