"""Multi-stage takes: fair under a huge backlog, and woken by an enqueue into any of the stages.

A stage of 100,000 tasks beside 50 stages of 10: take_next(ARRAY['fair.*']) serves every small
stage within its first round of 51 takes in one session, and four concurrent sessions (each going
on with its own round robin) take the rest of the small stages' tasks within 600 takes; every task
is taken once. A worker that waits on
several stages (LISTEN on each stage's channel, after a multi-stage take found them all empty) is
woken by an enqueue into either of them. The CLI worker takes several stages (`--stage a --stage
b,c`, or a prefix) and finishes each task in its own stage.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import workload

BIG, SMALL, PER_SMALL = 100_000, 50, 10
TAKE = "SELECT stage, id, lease FROM queue.take_next(ARRAY['fair.*'], 1, worker => %s)"


@pytest.fixture(scope="module")
def backlog(db: str) -> str:
    """The stages of the fairness tests, filled once for the module."""
    with psycopg.connect(db, autocommit=True) as conn:
        for _ in range(BIG // 10_000):
            conn.execute("SELECT count(*) FROM queue.enqueue_batch("
                         "  (SELECT array_agg('{}'::jsonb) FROM generate_series(1, 10000)), 'fair.big')")
        conn.execute("SELECT count(*) FROM generate_series(0, %s - 1) s"
                     "  CROSS JOIN LATERAL queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[%s]),"
                     "                                         'fair.small.' || lpad(s::text, 2, '0')) e",
                     (SMALL, PER_SMALL))
        conn.execute("ANALYZE queue.live_tasks")
    return db


def first_takes(stages: list[str]) -> dict[str, int]:
    """The index of each stage's first take in the list of taken stages."""
    first: dict[str, int] = {}
    for n, stage in enumerate(stages):
        first.setdefault(stage, n)
    return first


def test_a_large_backlog_starves_no_stage_of_one_session(backlog: str) -> None:
    taken: list[str] = []
    with psycopg.connect(backlog, autocommit=True) as conn:
        for _ in range(300):
            rows = conn.execute(TAKE, ("one",)).fetchall()
            assert len(rows) == 1
            stage, task_id, lease = rows[0]
            assert conn.execute("SELECT queue.finish(%s, %s, stage => %s)", (task_id, lease, stage)).fetchone()[0]
            taken.append(stage)
    first = first_takes(taken)
    small = {s: n for s, n in first.items() if s.startswith("fair.small.")}
    assert len(small) == SMALL, f"small stages never served in 300 takes: {SMALL - len(small)}"
    assert max(small.values()) < SMALL + 1, f"a small stage waited {max(small.values())} takes (a round is {SMALL + 1})"
    # The big stage gets its turn like any other, not the whole of it.
    assert taken.count("fair.big") <= 300 // (SMALL + 1) + 1


def test_a_large_backlog_starves_no_stage_of_four_concurrent_sessions(backlog: str) -> None:
    per_session = 150
    results: list[list[str]] = [[] for _ in range(4)]
    errors: list[BaseException] = []

    def take(index: int) -> None:
        try:
            with psycopg.connect(workload.with_application_name(backlog, f"fair-{index}"), autocommit=True) as conn:
                for _ in range(per_session):
                    rows = conn.execute(TAKE, (f"fair-{index}",)).fetchall()
                    for stage, task_id, lease in rows:
                        assert conn.execute("SELECT queue.finish(%s, %s, stage => %s)",
                                            (task_id, lease, stage)).fetchone()[0]
                        results[index].append(stage)
        except BaseException as e:  # reported by the test
            errors.append(e)

    threads = [threading.Thread(target=take, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a taker hangs"
    assert not errors, f"a taker failed: {errors[0]!r}"
    # The small stages' tasks left by the first test (about 200) all went in these 600 takes: the
    # big stage took its turns, never the whole of a session's takes.
    with psycopg.connect(backlog) as conn:
        left = conn.execute("SELECT count(*) FROM queue.live_tasks WHERE stage LIKE 'fair.small.%%'").fetchone()[0]
        twice = conn.execute("SELECT count(*) FROM (SELECT id FROM queue.history WHERE stage LIKE 'fair.%%'"
                             " GROUP BY id HAVING count(*) > 1) d").fetchone()[0]
    assert left == 0, f"{left} tasks of small stages still waiting after 600 takes"
    assert all(len(r) == per_session for r in results)
    assert twice == 0, "a task was taken twice"


@pytest.fixture
def listener(db: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db, autocommit=True) as conn:
        yield conn


def test_a_multi_stage_waiter_is_woken_by_an_enqueue_into_any_of_its_stages(conn: psycopg.Connection,
                                                                             listener: psycopg.Connection) -> None:
    listener.execute('LISTEN "skiplock.multi.a"')
    listener.execute('LISTEN "skiplock.multi.b"')
    for stage in ("multi.b", "multi.a"):
        # The worker's loop: a take from both stages finds nothing, so it waits on both channels.
        assert listener.execute("SELECT count(*) FROM queue.take_next(ARRAY['multi.a', 'multi.b'])").fetchone()[0] == 0
        conn.execute("SELECT queue.enqueue('{}', %s)", (stage,))
        woke = [n.channel for n in listener.notifies(timeout=60, stop_after=1)]
        assert woke == [f"skiplock.{stage}"]
        rows = listener.execute("SELECT stage FROM queue.take_next(ARRAY['multi.a', 'multi.b'])").fetchall()
        assert rows == [(stage,)]


def test_the_cli_worker_serves_several_stages(db: str, conn: psycopg.Connection, tmp_path: Path) -> None:
    """`skiplock worker --stage a --stage b,c` (and a prefix) runs the tasks of every stage named,
    each command told its task's stage, and finishes each in its own stage."""
    for stage in ("cliw.a", "cliw.b", "cliw.c", "cliw.p.x", "cliw.p.y"):
        conn.execute("SELECT queue.enqueue_batch(ARRAY['{}', '{}']::jsonb[], %s)", (stage,))
    log = tmp_path / "stages"
    for stages in (["--stage", "cliw.a", "--stage", "cliw.b,cliw.c"], ["--stage", "cliw.p.*"]):
        proc = subprocess.run([sys.executable, "-m", "skiplock", "worker", "--db", db, *stages, "--until-empty", "-q",
                               "--", "sh", "-c", f'cat > /dev/null; echo "$SKIPLOCK_STAGE" >> "{log}"'],
                              capture_output=True, text=True, timeout=120, env=dict(os.environ, COLUMNS="200"))
        assert proc.returncode == 0, proc.stderr
    done = conn.execute("SELECT stage, count(*) FROM queue.tasks WHERE stage LIKE 'cliw.%%' AND status = 'done'"
                        " GROUP BY stage ORDER BY stage").fetchall()
    assert done == [(s, 2) for s in ("cliw.a", "cliw.b", "cliw.c", "cliw.p.x", "cliw.p.y")]
    assert sorted(log.read_text().split()) == sorted(["cliw.a", "cliw.b", "cliw.c", "cliw.p.x", "cliw.p.y"] * 2)
