"""The demo is the main job: it must drain every task it enqueues, on a database it did not start."""

from __future__ import annotations

import psycopg

from skiplock import demo


def test_demo_accounts_for_every_task_in_an_existing_database(db: str, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", db)  # an existing database: the demo must leave it running
    assert demo.main(tasks=400, workers=3) == 0
    out = capsys.readouterr().out
    assert "every task accounted for (done + fatal = enqueued, none live): yes" in out
    with psycopg.connect(db) as conn:  # still up, and the demo's tasks all left the hot table
        assert conn.execute("SELECT count(*) FROM queue.live_tasks").fetchone()[0] == 0


def test_demo_summary_counts_retries_and_fatal_tasks(db: str):
    summary = demo.run(db, tasks=600, workers=2, seed=7)
    assert summary.accounted
    assert summary.fatal > 0 and summary.failed_attempts > summary.fatal
    assert summary.done + summary.fatal == 600
