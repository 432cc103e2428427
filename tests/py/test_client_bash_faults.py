"""The bash reference worker (clients/bash/worker.sh) under faults.

Its connections killed (pg_terminate_backend), idle and while a handler runs: it restarts its
LISTEN session and keeps taking tasks. Ctrl-C (SIGINT to the whole process group, as a terminal
sends it) does not reach the running handler: the batch is finished and the worker exits 0. The
server stopped while a handler runs: the finish is retried until the server is back, and the task
ends done at its first attempt. A finish that answers false (the lease lost) is not retried. A
setting that is not a number stops it at start with exit code 2. A server that never answers:
each take gives up at the worker's connect timeout and is retried.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from skiplock import devdb, migrate
from skiplock.sqlfiles import ROOT

BASH = ROOT / "clients" / "bash"
WORKER = [str(BASH / "worker.sh"), str(BASH / "example-handler.sh")]


# Starts a command with SIGINT as argv[1] says ("default" or "ignored"), whatever this process
# inherited: pytest started from a background job of a shell runs with SIGINT ignored, and a test
# must not depend on how it was launched.
WITH_SIGINT = ("import os, signal, sys; "
               "signal.signal(signal.SIGINT, signal.SIG_IGN if sys.argv[1] == 'ignored' else signal.SIG_DFL); "
               "os.execv(sys.argv[2], sys.argv[2:])")


class BashWorker:
    """worker.sh as a subprocess in a process group of its own (its pid is the group's id)."""

    def __init__(self, url: str, stage: str, handler: str | None = None, sigint: str = "default",
                 **settings: object) -> None:
        env = dict(os.environ, DATABASE_URL=url, STAGE=stage, **{k: str(v) for k, v in settings.items()})
        command = WORKER if handler is None else [WORKER[0], handler]
        command = [sys.executable, "-c", WITH_SIGINT, sigint, *command]
        self.proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, errors="replace", start_new_session=True)
        self.output: list[str] = []
        self.reader = threading.Thread(target=lambda: self.output.extend(self.proc.stdout), daemon=True)
        self.reader.start()

    def log(self) -> str:
        return "".join(self.output)

    def signal_and_wait(self, sig: int, group: bool = False, timeout: float = 60) -> int:
        """Send sig (to the whole process group, as a terminal does, when group), then its exit code."""
        if self.proc.poll() is None:
            if group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"worker did not stop {timeout} s after signal {sig}:\n{self.log()}")
        self.reader.join(5)
        return code

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.reader.join(5)


def wait_until(what: str, cond, timeout: float, worker: BashWorker) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if cond():
                return
        except psycopg.OperationalError:
            pass  # the server is restarting
        if worker.proc.poll() is not None:
            pytest.fail(f"the worker exited ({worker.proc.returncode}) before {what}:\n{worker.log()}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}:\n{worker.log()}")
        time.sleep(0.05)


def enqueue(url: str, stage: str, payload: dict) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT queue.enqueue(%s::jsonb, stage => %s)", (json.dumps(payload), stage)).fetchone()[0]


def running(url: str, task_id: int) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM queue.live_tasks WHERE id = %s AND status = 'running'",
                            (task_id,)).fetchone() is not None


def ended(url: str, task_id: int) -> tuple | None:
    """(status, attempt) once the task is in queue.history."""
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT status::text, attempt FROM queue.history WHERE id = %s", (task_id,)).fetchone()


def terminate_psql_backends(url: str) -> int:
    """pg_terminate_backend of every psql session on the database: the worker's, all of them."""
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                            " WHERE datname = current_database() AND application_name = 'psql'"
                            "   AND pid <> pg_backend_pid()").fetchone()[0]


def listening(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database()"
                            " AND application_name = 'psql' AND query LIKE 'SELECT 1;%'").fetchone()[0]


@pytest.mark.parametrize("setting", [{"BATCH": "abc"}, {"BATCH": "0"}, {"BATCH": "2.5"}, {"LEASE": "ten"},
                                     {"IDLE_WAIT": "-1"}, {"PING": "0"}, {"SNOOZE": "5s"}])
def test_bash_worker_rejects_a_setting_that_is_not_a_number(db: str, setting: dict[str, str]) -> None:
    """BATCH=abc once looped on "take_next failed": now a clear message and exit code 2 at start."""
    env = dict(os.environ, DATABASE_URL=db, STAGE="bad_setting", **setting)
    proc = subprocess.run(WORKER, env=env, capture_output=True, text=True, timeout=60)
    (name,) = setting
    assert proc.returncode == 2, f"{proc.returncode}\n{proc.stderr}"
    assert name in proc.stderr and setting[name] in proc.stderr, proc.stderr


def test_bash_worker_survives_losing_its_connections(db: str) -> None:
    """pg_terminate_backend of the worker's sessions, idle and while a handler runs: it restarts
    its listener and takes the tasks enqueued afterwards."""
    stage = "lost_connections"
    worker = BashWorker(db, stage, IDLE_WAIT=1, LEASE=30)
    try:
        for _ in range(2):  # idle: the listener dies under wait_for_work's read
            wait_until("the worker to listen", lambda: listening(db), 60, worker)
            assert terminate_psql_backends(db) >= 1
            time.sleep(0.3)
        # while a handler runs: the listener dies unseen, drain_listener finds it dead
        wait_until("the worker to listen again", lambda: listening(db), 60, worker)
        slow = enqueue(db, stage, {"sleep": 1.5})
        wait_until("the slow task to start", lambda: running(db, slow), 60, worker)
        time.sleep(0.2)
        assert terminate_psql_backends(db) >= 1
        wait_until("the slow task to end", lambda: ended(db, slow), 60, worker)
        later = enqueue(db, stage, {"n": 1})
        wait_until("a task enqueued later to be done", lambda: ended(db, later), 60, worker)
        assert ended(db, slow) == ("done", 1), worker.log()
        assert ended(db, later) == ("done", 1), worker.log()
    finally:
        code = worker.signal_and_wait(signal.SIGTERM)
    assert code == 0, worker.log()
    assert "unbound variable" not in worker.log(), worker.log()
    assert "the listener died; restarting it" in worker.log(), worker.log()


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_bash_worker_finishes_the_batch_on_ctrl_c(db: str, sigint: str) -> None:
    """SIGINT to the whole process group mid-handler: the handler is not interrupted, the batch is
    finished (no attempt failed), the worker exits 0. Also when the worker was started with SIGINT
    ignored (a background job of a non-interactive shell is): bash cannot trap a signal ignored
    at its start, so the worker starts itself again with the default disposition."""
    stage = f"ctrl_c_{sigint}"
    ids = [enqueue(db, stage, {"sleep": 2}), enqueue(db, stage, {"n": 1})]
    worker = BashWorker(db, stage, sigint=sigint, BATCH=2, IDLE_WAIT=0.5)
    try:
        wait_until("the batch to be taken", lambda: all(running(db, i) for i in ids), 60, worker)
        time.sleep(0.5)  # the first handler is sleeping
    finally:
        code = worker.signal_and_wait(signal.SIGINT, group=True)
    assert code == 0, worker.log()
    assert [ended(db, i) for i in ids] == [("done", 1), ("done", 1)], worker.log()


def test_bash_worker_does_not_retry_a_finish_whose_lease_is_lost(db: str) -> None:
    """The task cancelled while its handler runs and before any heartbeat: finish answers false,
    which is final (not a failed call to retry); the worker goes on with the next task."""
    stage = "lease_lost"
    first = enqueue(db, stage, {"sleep": 1.5})
    worker = BashWorker(db, stage, BATCH=1, LEASE=30, IDLE_WAIT=0.5)
    try:
        wait_until("the task to start", lambda: running(db, first), 60, worker)
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("SELECT queue.cancel(%s)", (first,))
        second = enqueue(db, stage, {"n": 2})
        wait_until("the next task to be done", lambda: ended(db, second), 60, worker)
    finally:
        code = worker.signal_and_wait(signal.SIGTERM)
    assert code == 0, worker.log()
    assert ended(db, first) == ("cancelled", 1), worker.log()
    assert f"lease lost on {first}: its result was not recorded" in worker.log(), worker.log()
    assert "retrying" not in worker.log(), worker.log()


def test_bash_worker_records_a_failure_whose_stderr_is_not_utf8(db: str, tmp_path: Path) -> None:
    """tail -c 2000 cut a two-byte character (and Latin-1 output is no UTF-8 either): psql could
    not pass the text (42601), the fail was never recorded and the task stayed running until its
    lease ran out. Now what is not UTF-8 is dropped and the attempt fails with the rest."""
    handler = tmp_path / "handler.sh"
    # 3,007 bytes: the last 2,000 start inside an é; \xe9 is a Latin-1 é.
    handler.write_text("#!/usr/bin/env bash\ncat > /dev/null\n"
                       "for i in $(seq 1500); do printf '\u00e9' >&2; done\n"
                       "printf ' caf\\xe9 x' >&2\nexit 1\n", encoding="utf-8")
    handler.chmod(0o755)
    stage = "not_utf8"
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SELECT queue.configure_stage(%s, max_attempts => 1)", (stage,))
    task = enqueue(db, stage, {"n": 1})
    worker = BashWorker(db, stage, handler=str(handler), LEASE=30, IDLE_WAIT=0.5)
    try:
        wait_until("the failure to be recorded", lambda: ended(db, task), 60, worker)
    finally:
        code = worker.signal_and_wait(signal.SIGTERM)
    assert code == 0, worker.log()
    assert ended(db, task) == ("fatal", 1), worker.log()
    with psycopg.connect(db, autocommit=True) as conn:
        (error,) = conn.execute("SELECT error_text FROM queue.history WHERE id = %s", (task,)).fetchone()
    assert error == "\u00e9" * 996 + " caf x", error[-40:]


def test_bash_worker_retries_a_finish_while_the_database_restarts(restart_cluster: devdb.Cluster) -> None:
    """The server is down when the handler ends: the finish is retried until it is back, and the
    task is done at its first attempt (not left running until its lease runs out, then rerun).
    The worker's listener died with the server: a task enqueued afterwards is taken too."""
    url = restart_cluster.createdb("bash_restart")
    migrate.upgrade(url)
    stage = "restart"
    task = enqueue(url, stage, {"sleep": 1})
    worker = BashWorker(url, stage, LEASE=20, IDLE_WAIT=1)
    try:
        wait_until("the task to start", lambda: running(url, task), 60, worker)
        restart_cluster.stop(mode="fast", remove=False)
        # the handler ends, its finish fails while the server is down
        wait_until("the finish to fail", lambda: f"finish on {task} failed; retrying" in worker.log(), 60, worker)
        restart_cluster._run(devdb.pg_bin() / "pg_ctl", "-D", restart_cluster.datadir,
                             "-l", restart_cluster.logfile, "-w", "-t", "60", "start")
        wait_until("the task to end", lambda: ended(url, task), 60, worker)
        assert ended(url, task) == ("done", 1), worker.log()
        later = enqueue(url, stage, {"n": 1})
        wait_until("a task enqueued after the restart to be done", lambda: ended(url, later), 60, worker)
    finally:
        code = worker.signal_and_wait(signal.SIGTERM)
    assert code == 0, worker.log()
    assert f"finish on {task} failed; retrying" in worker.log(), worker.log()


def test_bash_worker_times_out_a_connection_attempt_that_hangs(silent_server: tuple[int, list]) -> None:
    """A server that accepts connections and never answers: psql's take fails after the worker's
    default PGCONNECT_TIMEOUT (10 s; libpq alone waits for ever) and is retried; SIGTERM ends it."""
    port, held = silent_server
    # PGCONNECT_TIMEOUT empty counts as unset: the worker's own default is tested. No listener
    # (SKIPLOCK_POOLER=transaction): the takes alone connect.
    worker = BashWorker(f"postgresql://nobody@127.0.0.1:{port}/nothing?sslmode=disable", "bash_hang",
                        SKIPLOCK_POOLER="transaction", PGCONNECT_TIMEOUT="")
    deadline = time.monotonic() + 90
    while worker.log().count("take_next failed") < 2 and worker.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert worker.log().count("take_next failed") >= 2, f"{len(held)} attempt(s) in 90 s:\n{worker.log()}"
    assert "timeout expired" in worker.log(), worker.log()
    assert worker.signal_and_wait(signal.SIGTERM) == 0, worker.log()
