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


def _worker_url(db: str, conn: psycopg.Connection) -> str:
    """db as a login role of skiplock_worker (what a consumer runs as), made once per cluster."""
    conn.execute("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'cs_results_worker') THEN"
                 " CREATE ROLE cs_results_worker LOGIN IN ROLE skiplock_worker; END IF; END $$")
    params = psycopg.conninfo.conninfo_to_dict(db)
    params.update(user="cs_results_worker")
    params.pop("password", None)
    return psycopg.conninfo.make_conninfo("", **params)


def test_record_results_sets_only_what_this_transaction_consumed(db: str, conn: psycopg.Connection):
    """Two sessions of one worker role: B may record results for the tasks it consumed, never for
    the runs A consumed (committed, or still open), nor for a run B ended but took in an earlier
    transaction."""
    worker = _worker_url(db, conn)
    conn.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[9]), 'cs.results')")
    with psycopg.connect(worker, autocommit=True) as a, psycopg.connect(worker, autocommit=True) as b:
        a.execute("SET lock_timeout = '60s'")
        b.execute("SET lock_timeout = '60s'")
        # A consumes three and commits without results.
        a.execute("BEGIN")
        a_ids = [r[0] for r in a.execute("SELECT id FROM queue.consume('cs.results', 3)")]
        a.execute("COMMIT")
        # A consumes three more and keeps its transaction open.
        a.execute("BEGIN")
        a_open = [r[0] for r in a.execute("SELECT id FROM queue.consume('cs.results', 3)")]
        # B, another transaction of the same role, consumes the rest and names A's runs too.
        b.execute("BEGIN")
        b_ids = [r[0] for r in b.execute("SELECT id FROM queue.consume('cs.results', 3)")]
        assert len(a_ids) == len(a_open) == len(b_ids) == 3 and not (set(a_ids) | set(a_open)) & set(b_ids)
        forged = ['{"forged": true}'] * 3
        assert b.execute("SELECT queue.record_results('cs.results', %s, %s::jsonb[])", (a_ids, forged)).fetchone() == (0,)
        assert b.execute("SELECT queue.record_results('cs.results', %s, %s::jsonb[])", (a_open, forged)).fetchone() == (0,)
        mine = [f'{{"by": "b", "id": {i}}}' for i in b_ids]
        assert b.execute("SELECT queue.record_results('cs.results', %s, %s::jsonb[])", (b_ids, mine)).fetchone() == (3,)
        b.execute("COMMIT")
        # A's open transaction records its own.
        assert a.execute("SELECT queue.record_results('cs.results', %s, %s::jsonb[])",
                         (a_open, ['{"by": "a"}'] * 3)).fetchone() == (3,)
        a.execute("COMMIT")
    results = dict(conn.execute("SELECT id, result FROM queue.tasks WHERE stage = 'cs.results'").fetchall())
    assert [results[i] for i in a_ids] == [None, None, None], "another transaction's consumed runs are unchanged"
    assert [results[i] for i in a_open] == [{"by": "a"}] * 3
    assert [results[i] for i in b_ids] == [{"by": "b", "id": i} for i in b_ids]


def test_record_results_skips_a_run_ended_now_but_taken_in_an_earlier_transaction(db: str, conn: psycopg.Connection):
    """finish in this transaction of a task taken in an earlier one writes a done row of this
    transaction without a result; it was not consumed here (its started is the take's): skipped."""
    worker = _worker_url(db, conn)
    task = conn.execute("SELECT queue.enqueue('{}', 'cs.taken')").fetchone()[0]
    with psycopg.connect(worker, autocommit=True) as w:
        lease = w.execute("SELECT lease FROM queue.take_next('cs.taken')").fetchone()[0]
        w.execute("BEGIN")
        assert w.execute("SELECT queue.finish(%s, %s, stage => 'cs.taken')", (task, lease)).fetchone() == (True,)
        assert w.execute("SELECT queue.record_results('cs.taken', %s, ARRAY['{\"x\": 1}'::jsonb])", ([task],)).fetchone() == (0,)
        w.execute("COMMIT")
    assert conn.execute("SELECT result FROM queue.tasks WHERE id = %s", (task,)).fetchone() == (None,)
