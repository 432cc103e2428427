"""The demo is the main job: it must drain every task it enqueues, on a database it did not start,
and leave that database's other tasks alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg

from skiplock import demo
from skiplock.sqlfiles import ROOT


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


def _cancel_live(conn: psycopg.Connection, stage_like: str) -> None:
    conn.execute("SELECT queue.cancel(id) FROM queue.live_tasks WHERE stage LIKE %s", (stage_like,))


def test_demo_waits_only_for_its_own_tasks_on_a_busy_database(db: str):
    """It once waited for every task whose id fell between its first and last: another
    application's tasks, enqueued meanwhile into a stage nobody works, kept it waiting for ever."""
    with psycopg.connect(db, autocommit=True) as conn:
        before = conn.execute("SELECT coalesce(max(id), 0) FROM queue.tasks").fetchone()[0]
        # Hold the demo's enqueue halfway (its first 201 rows have their ids) so that the
        # application's enqueues surely take ids among the demo's, as they may on a busy database.
        conn.execute("""
            CREATE FUNCTION public.slow_demo_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.stage = 'demo.resize' AND NEW.payload->>'n' = '200' THEN
                    PERFORM pg_sleep(0.5);
                END IF;
                RETURN NEW;
            END $$""")
        conn.execute("CREATE TRIGGER slow_demo_enqueue BEFORE INSERT ON queue.live_tasks"
                     " FOR EACH ROW EXECUTE FUNCTION public.slow_demo_enqueue()")
        producing = threading.Event()

        def application() -> None:
            with psycopg.connect(db, autocommit=True) as app:
                while producing.is_set():
                    app.execute("SELECT queue.enqueue('{\"mail\": 1}', stage => 'app.mail')")

        producing.set()
        producer = threading.Thread(target=application, daemon=True)
        producer.start()
        result: list[demo.Summary] = []
        runner = threading.Thread(target=lambda: result.append(demo.run(db, tasks=400, workers=2, seed=3)),
                                  daemon=True)
        runner.start()
        try:
            deadline = time.monotonic() + 120
            while conn.execute("SELECT count(DISTINCT id) FROM queue.tasks WHERE stage LIKE 'demo.%%' AND id > %s",
                               (before,)).fetchone()[0] < 400:  # the demo's enqueue is done
                assert runner.is_alive() and time.monotonic() < deadline, "the demo did not enqueue its 400 tasks"
                time.sleep(0.05)
            producing.clear()
            producer.join(60)
            runner.join(120)  # it drains 400 tasks in seconds; a demo waiting for the others waits for ever
            hung = runner.is_alive()
        finally:
            producing.clear()
            _cancel_live(conn, "app.mail")  # lets a demo that waits for them end
            runner.join(60)
            conn.execute("DROP FUNCTION public.slow_demo_enqueue() CASCADE")
        lo, hi = conn.execute("SELECT min(id), max(id) FROM queue.tasks WHERE stage LIKE 'demo.%%' AND id > %s",
                              (before,)).fetchone()
        inside = conn.execute("SELECT count(*) FROM queue.tasks WHERE stage = 'app.mail' AND id BETWEEN %s AND %s",
                              (lo, hi)).fetchone()[0]
    assert inside > 0, "no application task took an id among the demo's: the test proved nothing"
    assert not hung, f"the demo waited for {inside} application tasks with ids among its own"
    assert result[0].accounted and result[0].done + result[0].fatal == 400


def test_demo_on_a_given_database_leaves_other_stages_and_past_runs_alone(db: str, monkeypatch, capsys):
    """It called queue.reap_hung() (every stage) every 0.1 s, reaping another application's
    task, and its "why tasks failed for good" listed the failures of earlier runs."""
    with psycopg.connect(db, autocommit=True) as conn:
        (other,) = conn.execute("SELECT queue.enqueue('{\"x\": 1}', stage => 'app.billing')").fetchone()
        conn.execute("SELECT queue.take_next('app.billing', lease_for => '0.1 seconds')")
        (old,) = conn.execute("SELECT queue.enqueue('{\"earlier\": 1}', stage => %s)", (demo.RESIZE,)).fetchone()
        (lease,) = conn.execute("SELECT lease FROM queue.take_next(%s)", (demo.RESIZE,)).fetchone()
        assert conn.execute("SELECT queue.fail(%s, %s, 'from an earlier run', fatal => true)",
                            (old, lease)).fetchone()[0]
        time.sleep(0.2)  # the application's lease has run out: its own maintenance decides when to reap
        try:
            monkeypatch.setenv("DATABASE_URL", db)
            assert demo.main(tasks=300, workers=1) == 0
            out = capsys.readouterr().out
            status = conn.execute("SELECT status::text, attempt FROM queue.tasks WHERE id = %s", (other,)).fetchone()
        finally:
            _cancel_live(conn, "app.billing")
    assert status == ("running", 1), "the demo reaped another stage's task"
    assert "from an earlier run" not in out, out


def test_ctrl_c_stops_the_demo_workers_in_order(db: str, tmp_path: Path):
    """SIGINT to the whole process group (a terminal's Ctrl-C) once raised KeyboardInterrupt in
    every worker mid-batch: tracebacks, and tasks left running under their leases. The workers
    now ignore it; the parent stops them, and each ends its batch."""
    log = tmp_path / "demo.log"
    with open(log, "w") as out:
        # SIGINT at its default whatever pytest inherited: Python leaves an ignored SIGINT ignored
        # (a background job of a non-interactive shell starts so), and Ctrl-C would then do nothing.
        proc = subprocess.Popen([sys.executable, "-c", "import signal, runpy, sys; signal.signal(signal.SIGINT, "
                                 "signal.default_int_handler); sys.argv[0] = 'skiplock'; "
                                 "runpy.run_module('skiplock', run_name='__main__')",
                                 "demo", "--tasks", "3000", "--workers", "2"],
                                cwd=ROOT, env=dict(os.environ, DATABASE_URL=db), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "through the pipeline" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        time.sleep(0.5)  # the workers are busy
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    with psycopg.connect(db, autocommit=True) as conn:
        running = conn.execute("SELECT count(*) FROM queue.live_tasks WHERE stage LIKE 'demo.%%' AND status = 'running'"
                               ).fetchone()[0]
        _cancel_live(conn, "demo.%")  # what the interrupted demo left
    assert "Traceback" not in text, text
    assert code == 130 and "skiplock demo: interrupted" in text, (code, text)
    assert running == 0, f"{running} tasks left running:\n{text}"
