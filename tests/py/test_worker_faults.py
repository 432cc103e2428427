"""The CLI worker's life under faults (issues 54 items 9-10, 50 item 5): a slot never dies
silently. Errors that pass by waiting (a statement or lock timeout, a full disk, too many
connections) are retried with backoff, a finish while its lease holds; a hung command meets
--timeout; a stop that reaches the commands too hands their tasks back; the workers maintain the
queue themselves, so the task of a worker killed with -9 comes back with no other process running.
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
from typing import IO, Callable, Iterator

import psycopg
import psycopg.conninfo
import pytest

import dev.testrun
from skiplock.sqlfiles import ROOT

ENV = dict(os.environ, COLUMNS="200")
ENV.pop("DATABASE_URL", None)
ENV.pop("SKIPLOCK_POOLER", None)


@pytest.fixture(scope="module")
def url(admin_url: str, template_db: str) -> Iterator[str]:
    u = dev.testrun.create_database(admin_url, "test_worker_faults", template=template_db)
    try:
        yield u
    finally:
        dev.testrun.drop_database(admin_url, u)


@pytest.fixture
def conn(url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(url, autocommit=True) as c:
        yield c


def login(conn: psycopg.Connection, url: str, name: str, *settings: str, limit: int = -1) -> str:
    """A login that is a skiplock_worker, with these role settings; its URL."""
    conn.execute(f"DROP ROLE IF EXISTS {name}")
    conn.execute(f"CREATE ROLE {name} LOGIN CONNECTION LIMIT {limit} IN ROLE skiplock_worker")
    for s in settings:
        conn.execute(f"ALTER ROLE {name} SET {s}")
    return psycopg.conninfo.make_conninfo(url, user=name)


def worker(url: str, stage: str, *args: str, stderr: int | IO = subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "skiplock", "--db", url, "worker", "--stage", stage, *args],
                            stderr=stderr, text=True, env=ENV, cwd=ROOT, start_new_session=True)


def enqueue(conn: psycopg.Connection, stage: str, n: int, payload: dict | None = None) -> None:
    conn.execute("SELECT queue.enqueue_batch(array_fill(%s::jsonb, ARRAY[%s]), %s)",
                 (json.dumps(payload or {}), n, stage))


def counts(conn: psycopg.Connection, stage: str) -> dict[str, int]:
    return dict(conn.execute("SELECT status::text, count(*) FROM queue.tasks WHERE stage = %s GROUP BY 1",
                             (stage,)).fetchall())


def wait_for(predicate, timeout: float = 120.0, every: float = 0.1, state: Callable[[], str] | None = None) -> None:
    """Wait for predicate(); past the timeout, fail with what state() says (why it did not come)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting" + (f"; {state()}" if state is not None else ""))
        time.sleep(every)


def worker_state(conn: psycopg.Connection, stage: str, proc: subprocess.Popen, log: Path | None = None) -> str:
    """The stage's tasks not done, the worker's processes (a command stuck before its exec shows
    as a child that is still python) and its log's last lines (when it writes to a file): what a
    timed-out wait reports."""
    rows = conn.execute("SELECT id, status::text, attempt, lease_expires - now(), worker, error_text FROM queue.tasks"
                        " WHERE stage = %s AND status::text <> 'done' ORDER BY id", (stage,)).fetchall()
    children = subprocess.run(["ps", "-o", "pid,stat,wchan:24,args", "--ppid", str(proc.pid)],
                              capture_output=True, text=True).stdout
    threads = Path(f"/proc/{proc.pid}/task")
    waits = sorted({(t / "wchan").read_text() for t in threads.iterdir()}) if threads.exists() else []
    tail = log.read_text().splitlines()[-15:] if log is not None else ["(its stderr is a pipe, read at its end)"]
    return (f"worker exit code {proc.poll()}; tasks not done: {rows}; the worker's threads wait in {waits};"
            f" its children:\n{children}its log's end:\n" + "\n".join(tail))


def stop(proc: subprocess.Popen) -> str:
    """SIGTERM, then its stderr; it must exit 0."""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    return err


def all_done_once(conn: psycopg.Connection, stage: str, n: int) -> None:
    assert counts(conn, stage) == {"done": n}
    # Each finished once, on its first attempt: no lease ran out, nothing ran twice.
    assert conn.execute("SELECT max(attempt) FROM queue.tasks WHERE stage = %s", (stage,)).fetchone()[0] == 1


def test_a_share_lock_past_the_statement_timeout_stops_no_slot(url: str, conn: psycopg.Connection,
                                                               tmp_path: Path) -> None:
    """A DBA holds SHARE on queue.live_tasks for 5 s while the worker's login has
    statement_timeout = 1s: takes and finishes time out (57014), are retried, and the worker goes on
    with all its slots: afterwards four commands run at once."""
    w_url = login(conn, url, "wf_timeout", "statement_timeout = '1s'")
    enqueue(conn, "wf.share", 400)
    # A task {"block": 1} marks that its command runs, then waits for the file "go".
    script = (f'p=$(cat); case "$p" in *block*) touch "{tmp_path}/$SKIPLOCK_TASK_ID"; '
              f'while [ ! -e "{tmp_path}/go" ]; do sleep 0.05; done;; *) sleep 0.02;; esac')
    proc = worker(w_url, "wf.share", "-c", "4", "-q", "--", "sh", "-c", script)
    try:
        wait_for(lambda: counts(conn, "wf.share").get("done", 0) >= 20)
        with conn.transaction():
            conn.execute("LOCK TABLE queue.live_tasks IN SHARE MODE")
            time.sleep(5)
        wait_for(lambda: counts(conn, "wf.share") == {"done": 400}, state=lambda: worker_state(conn, "wf.share", proc))
        # No slot was lost: four commands run at once after the lock (the CLI once had a thread
        # per slot, each with its worker name; the library runs them in one worker).
        enqueue(conn, "wf.share", 4, {"block": 1})
        wait_for(lambda: len(list(tmp_path.iterdir())) == 4)
        (tmp_path / "go").touch()
        wait_for(lambda: counts(conn, "wf.share") == {"done": 404}, state=lambda: worker_state(conn, "wf.share", proc))
        assert proc.poll() is None
    finally:
        (tmp_path / "go").touch()
        err = stop(proc) if proc.poll() is None else proc.communicate()[1]
    assert "canceling statement due to statement timeout" in err and "retrying" in err, err
    all_done_once(conn, "wf.share", 404)


def test_a_lock_timeout_against_compact_is_retried(url: str, conn: psycopg.Connection) -> None:
    """lock_timeout = 10ms for the worker while an admin runs compact() over and over: 55P03 on a
    take or a finish is retried; the worker drains the stage and exits 0."""
    w_url = login(conn, url, "wf_lock", "lock_timeout = '10ms'")
    enqueue(conn, "wf.compact", 1500)
    halt = threading.Event()
    compactions = 0

    def compact() -> None:
        nonlocal compactions
        with psycopg.connect(url, autocommit=True) as c:
            while not halt.wait(0.3):
                with c.transaction():
                    c.execute("LOCK TABLE queue.live_tasks IN ACCESS EXCLUSIVE MODE")
                    c.execute("SELECT queue.compact()")
                    time.sleep(0.2)
                compactions += 1

    t = threading.Thread(target=compact, daemon=True)
    t.start()
    try:
        proc = worker(w_url, "wf.compact", "-c", "4", "-q", "--until-empty", "--", "true")
        _, err = proc.communicate(timeout=600)
    finally:
        halt.set()
        t.join(timeout=60)
    assert proc.returncode == 0, err
    assert compactions >= 2
    assert "lock timeout" in err, err
    all_done_once(conn, "wf.compact", 1500)


def test_a_disk_full_on_finish_is_retried_while_the_lease_holds(url: str, conn: psycopg.Connection) -> None:
    """53100 (disk full) on every finish for 4 s, then space again. A real full disk needs a mount
    of its own (root): a trigger raises the server's own SQLSTATE 53100 on the history insert that
    a finish makes, which is what the worker sees of a full disk."""
    conn.execute("CREATE TABLE IF NOT EXISTS public.wf_disk (is_full boolean)")
    conn.execute("TRUNCATE public.wf_disk; INSERT INTO public.wf_disk VALUES (false)")
    conn.execute("GRANT SELECT ON public.wf_disk TO skiplock_owner")  # the trigger runs as finish's owner
    conn.execute("""
        CREATE OR REPLACE FUNCTION public.wf_disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF (SELECT d.is_full FROM public.wf_disk d) AND NEW.stage = 'wf.disk' THEN
                RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = '53100';
            END IF;
            RETURN NEW;
        END $$""")
    conn.execute("DROP TRIGGER IF EXISTS wf_disk_full ON queue.history")
    conn.execute("CREATE TRIGGER wf_disk_full BEFORE INSERT ON queue.history FOR EACH ROW "
                 "EXECUTE FUNCTION public.wf_disk_full()")
    try:
        enqueue(conn, "wf.disk", 300)
        proc = worker(url, "wf.disk", "-c", "4", "-q", "--", "true")
        try:
            wait_for(lambda: counts(conn, "wf.disk").get("done", 0) >= 20)
            conn.execute("UPDATE public.wf_disk SET is_full = true")
            time.sleep(4)
            conn.execute("UPDATE public.wf_disk SET is_full = false")
            wait_for(lambda: counts(conn, "wf.disk") == {"done": 300}, state=lambda: worker_state(conn, "wf.disk", proc))
        finally:
            err = stop(proc) if proc.poll() is None else proc.communicate()[1]
    finally:
        conn.execute("DROP TRIGGER IF EXISTS wf_disk_full ON queue.history")
    assert "No space left on device" in err and "retrying" in err, err
    all_done_once(conn, "wf.disk", 300)


def test_too_many_connections_are_waited_out_and_the_reason_is_logged(url: str, conn: psycopg.Connection,
                                                                      tmp_path: Path) -> None:
    """A login limited to one connection: the worker takes on its first, then cannot open the one
    it finishes on (53300); it says the server's reason and retries; once the limit is lifted
    every task is done once. (The CLI's slots, one connection each, once worked on one
    connection; the library's worker needs one to take, one to finish and one to heartbeat.)"""
    w_url = login(conn, url, "wf_limit", limit=1)
    enqueue(conn, "wf.limit", 50)
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        proc = worker(w_url, "wf.limit", "-c", "2", "-q", "--no-maintain", "--", "true", stderr=out)
        try:
            wait_for(lambda: "too many connections for role" in log.read_text())
            assert counts(conn, "wf.limit").get("done", 0) < 50
            conn.execute("ALTER ROLE wf_limit CONNECTION LIMIT -1")
            enqueue(conn, "wf.limit", 2, {"sleep": 1})
            wait_for(lambda: counts(conn, "wf.limit") == {"done": 52},
                     state=lambda: worker_state(conn, "wf.limit", proc, log))
        finally:
            stop(proc) if proc.poll() is None else proc.wait()
    err = log.read_text()
    assert "cannot connect (" in err and "too many connections for role" in err, err
    assert "(OperationalError)" not in err
    all_done_once(conn, "wf.limit", 52)


def test_a_login_that_cannot_pass_ends_the_worker_in_one_line(url: str, conn: psycopg.Connection) -> None:
    """A revoked grant does not pass by waiting: the worker says why, once, and exits 1."""
    w_url = login(conn, url, "wf_revoked")
    enqueue(conn, "wf.revoked", 3)
    conn.execute("REVOKE skiplock_worker FROM wf_revoked")
    proc = worker(w_url, "wf.revoked", "-c", "2", "--", "true")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "permission denied" in err and "SQLSTATE 42501" in err, err
    assert counts(conn, "wf.revoked") == {"ready": 3}


def test_a_refused_login_and_a_database_without_skiplock_end_the_worker_in_one_line(url: str, admin_url: str) -> None:
    """The other two cases that do not pass by waiting (issue 54, item 9): a login the server refuses
    and a database without skiplock. Exit 1 at once (no retry), one line that says why."""
    bare = dev.testrun.create_database(admin_url, "test_worker_faults_bare")
    try:
        for db, why in ((psycopg.conninfo.make_conninfo(url, user="wf_no_such_role"), 'role "wf_no_such_role" does not exist'),
                        (bare, "run `skiplock upgrade`")):
            proc = worker(db, "wf.refused", "-c", "2", "--", "true")
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 1, err
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("skiplock worker: ") and why in lines[0], err
            assert "retrying" not in err, err
    finally:
        dev.testrun.drop_database(admin_url, bare)


def test_timeout_kills_a_hung_command_and_fails_its_attempt(url: str, conn: psycopg.Connection) -> None:
    conn.execute("SELECT queue.configure_stage('wf.hung', max_attempts => 2, backoff_base => '0')")
    enqueue(conn, "wf.hung", 1)
    proc = worker(url, "wf.hung", "--timeout", "1", "--no-maintain", "--", "sleep", "infinity")
    try:
        wait_for(lambda: counts(conn, "wf.hung") == {"fatal": 1}, state=lambda: worker_state(conn, "wf.hung", proc))
    finally:
        err = stop(proc) if proc.poll() is None else proc.communicate()[1]
    (attempt, error), = conn.execute("SELECT attempt, error_text FROM queue.tasks WHERE stage = 'wf.hung'").fetchall()
    assert attempt == 2 and error.startswith("timed out after 1 s: killed by SIGTERM"), (error, err)


def test_the_stages_task_timeout_kills_a_hung_command(url: str, conn: psycopg.Connection) -> None:
    """configure_stage(task_timeout => …) without --timeout: the worker reads it and enforces it."""
    conn.execute("SELECT queue.configure_stage('wf.stagelimit', max_attempts => 1, task_timeout => '1 second')")
    enqueue(conn, "wf.stagelimit", 1)
    proc = worker(url, "wf.stagelimit", "--no-maintain", "--", "sleep", "infinity")
    try:
        wait_for(lambda: counts(conn, "wf.stagelimit") == {"fatal": 1}, state=lambda: worker_state(conn, "wf.stagelimit", proc))
    finally:
        err = stop(proc) if proc.poll() is None else proc.communicate()[1]
    error = conn.execute("SELECT error_text FROM queue.tasks WHERE stage = 'wf.stagelimit'").fetchone()[0]
    assert error.startswith("timed out after 1 s: killed by SIGTERM"), (error, err)
    assert "task timeout of wf.stagelimit: 1 s (the stage's task_timeout)" in err, err


def test_the_log_says_when_a_stage_is_paused_and_resumed(url: str, conn: psycopg.Connection, tmp_path: Path) -> None:
    """A worker role cannot read stage_config: the worker reads queue.worker_settings and logs one
    line when its stage is paused (while idle: no task of it comes) and one when it is resumed."""
    conn.execute("SELECT queue.configure_stage('wf.paused', paused => true)")
    enqueue(conn, "wf.paused", 1)
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        proc = worker(url, "wf.paused", "--no-maintain", "--poll", "0.2", "--", "true", stderr=out)
        try:
            wait_for(lambda: "stage wf.paused is paused" in log.read_text())
            assert counts(conn, "wf.paused") == {"ready": 1}
            conn.execute("SELECT queue.configure_stage('wf.paused', paused => false)")
            wait_for(lambda: counts(conn, "wf.paused") == {"done": 1})
            wait_for(lambda: "stage wf.paused is resumed" in log.read_text())
        finally:
            stop(proc) if proc.poll() is None else proc.wait()
    text = log.read_text()
    assert text.count("stage wf.paused is paused") == 1 and text.count("stage wf.paused is resumed") == 1, text


def test_sigterm_to_the_whole_group_hands_the_tasks_back(url: str, conn: psycopg.Connection, tmp_path: Path) -> None:
    """systemd's KillMode=control-group: SIGTERM reaches the worker and its commands at once.
    The tasks go back (release, attempt not counted) as on a stop of the worker; not failed."""
    conn.execute("SELECT queue.configure_stage('wf.group', max_attempts => 1)")
    enqueue(conn, "wf.group", 2)
    pids = tmp_path / "pids"
    pids.mkdir()
    proc = worker(url, "wf.group", "-c", "2", "--no-maintain", "--",
                  "sh", "-c", f'echo > "{pids}/$$"; exec sleep 60')
    try:
        wait_for(lambda: len(list(pids.iterdir())) == 2)
        commands = [int(p.name) for p in pids.iterdir()]
        for pid in [proc.pid, *commands]:
            os.kill(pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    result = conn.execute("SELECT status::text, attempt, error_text FROM queue.tasks WHERE stage = 'wf.group'").fetchall()
    assert result == [("ready", 0, None)] * 2, err
    assert "2 interrupted" in err, err


def test_a_second_sigint_does_not_claim_the_grace_ran_out(url: str, conn: psycopg.Connection) -> None:
    enqueue(conn, "wf.twice", 1)
    proc = worker(url, "wf.twice", "--no-maintain", "--", "sleep", "60")
    try:
        wait_for(lambda: counts(conn, "wf.twice") == {"running": 1})
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert "after the grace of 30 s" not in err, err
    assert "killed on a second SIGINT" in err, err
    assert counts(conn, "wf.twice") == {"ready": 1}


def test_a_long_line_of_stderr_does_not_take_the_workers_memory(url: str, conn: psycopg.Connection,
                                                                tmp_path: Path) -> None:
    """200 MB of stderr on one line: the worker reads it in pieces and keeps a bounded tail."""
    enqueue(conn, "wf.stderr", 1)
    log = tmp_path / "stderr"
    with open(log, "w") as f:
        proc = worker(url, "wf.stderr", "--no-maintain", "--", "sh", "-c",
                      "head -c 200000000 /dev/zero | tr '\\0' x >&2; echo >&2 the end; exit 3", stderr=f)
        try:
            wait_for(lambda: counts(conn, "wf.stderr") == {"error": 1}, timeout=300)
            status = Path(f"/proc/{proc.pid}/status").read_text()
            peak_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM")))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=90)
    log.unlink()
    assert peak_kb < 150_000, peak_kb   # the worker alone is ~40 MB; the line is 200 MB
    error = conn.execute("SELECT error_text FROM queue.tasks WHERE stage = 'wf.stderr'").fetchone()[0]
    assert error.startswith("exit status 3") and error.rstrip().endswith("the end"), error[-100:]


def test_a_worker_killed_with_kill_9_has_its_task_back_elsewhere(url: str, conn: psycopg.Connection) -> None:
    """No `skiplock maintain` runs: the other worker's own maintenance reaps the expired lease."""
    lease, every = 4.0, 1.0
    conn.execute("SELECT queue.configure_stage('wf.kill9', backoff_base => '0')")  # due again once reaped
    enqueue(conn, "wf.kill9", 1)
    a = worker(url, "wf.kill9", "--name", "a", "--lease", str(lease), "--maintain-every", str(every), "--",
               "sleep", "600")
    b = None
    try:
        wait_for(lambda: counts(conn, "wf.kill9") == {"running": 1})
        b = worker(url, "wf.kill9", "--name", "b", "--lease", str(lease), "--maintain-every", str(every), "--",
                   "sleep", "600")
        time.sleep(1)
        os.kill(a.pid, signal.SIGKILL)
        killed = time.monotonic()
        a.wait(timeout=30)
        wait_for(lambda: conn.execute("SELECT worker FROM queue.tasks WHERE stage = 'wf.kill9' AND status = 'running'")
                 .fetchone() == ("b",), timeout=120)
        took = time.monotonic() - killed
    finally:
        a.kill()
        if b is not None:
            b.kill()
            b.wait()
    # Back within its lease and a round of maintenance (bounded generously for a loaded machine).
    assert took < lease + every + 20, took
    assert conn.execute("SELECT attempt FROM queue.tasks WHERE stage = 'wf.kill9'").fetchone()[0] == 2


def dead_worker_holding(conn: psycopg.Connection, url: str, stage: str) -> None:
    """One task of the stage taken by a worker (lease 1 s, no maintenance) killed with SIGKILL; returns
    once its lease has expired (the task still running: nobody maintains the queue yet)."""
    conn.execute("SELECT queue.configure_stage(%s, backoff_base => '0')", (stage,))  # due again at once
    enqueue(conn, stage, 1)
    a = worker(url, stage, "--lease", "1", "--no-maintain", "--", "sleep", "600")
    try:
        wait_for(lambda: counts(conn, stage) == {"running": 1})
        os.kill(a.pid, signal.SIGKILL)
        a.wait(timeout=30)
    finally:
        a.kill()
    wait_for(lambda: conn.execute("SELECT lease_expires < now() FROM queue.live_tasks WHERE stage = %s",
                                  (stage,)).fetchone()[0] is True)


def test_until_empty_recovers_expired_leases_first(url: str, conn: psycopg.Connection) -> None:
    dead_worker_holding(conn, url, "wf.expired")
    proc = worker(url, "wf.expired", "--until-empty", "--", "true")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert counts(conn, "wf.expired") == {"done": 1}, err


def test_until_empty_waits_for_a_maintain_now_another_session_runs(url: str, conn: psycopg.Connection) -> None:
    """--until-empty while another session holds maintain_now()'s lock (its reap may have begun
    before the dead worker's lease ran out): the worker tries again once the lock is free, instead
    of taking "no row" for "nothing to recover" and exiting with the task still running."""
    dead_worker_holding(conn, url, "wf.busy")
    with psycopg.connect(url) as holder:   # a transaction holding the lock maintain_now() tries
        holder.execute("SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('skiplock.worker_maintain', 0))")
        proc = worker(url, "wf.busy", "--until-empty", "--", "true")
        try:
            wait_for(lambda: proc.poll() is not None or conn.execute(
                "SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE query LIKE '%%queue.maintain_now()%%'"
                "   AND pid <> pg_catalog.pg_backend_pid()").fetchone()[0] > 0)
            assert proc.poll() is None, "the worker exited while maintain_now() was busy: " + proc.communicate()[1]
        finally:
            holder.rollback()
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert counts(conn, "wf.busy") == {"done": 1}, err


def test_no_maintain_leaves_an_expired_lease_to_whoever_maintains_the_queue(url: str, conn: psycopg.Connection) -> None:
    """--no-maintain (pg_cron or `skiplock maintain` does it): even --until-empty, which otherwise
    recovers expired leases first, leaves the dead worker's task running and exits 0."""
    dead_worker_holding(conn, url, "wf.nomaint")
    proc = worker(url, "wf.nomaint", "--until-empty", "--no-maintain", "--", "true")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert conn.execute("SELECT status::text, attempt, lease_expires < now() FROM queue.live_tasks "
                        "WHERE stage = 'wf.nomaint'").fetchone() == ("running", 1, True), err
    # Whoever maintains the queue gets it back (reap_hung counts every stage of the module's
    # database, where another test's dead worker may have left an expired lease too).
    assert conn.execute("SELECT queue.reap_hung()").fetchone()[0] >= 1
    assert counts(conn, "wf.nomaint") == {"error": 1}


def test_maintain_now_runs_in_one_session_at_a_time_and_a_worker_login_may_call_it(url: str, conn: psycopg.Connection) -> None:
    """queue.maintain_now(), what workers call to maintain the queue themselves: a skiplock_worker
    login may call it; while another session holds the workers' lock it returns no row at once,
    and once that session ends it runs maintain() (a row per step)."""
    conn.execute("DROP ROLE IF EXISTS wf_maintainer")
    conn.execute("CREATE ROLE wf_maintainer LOGIN IN ROLE skiplock_worker")
    worker_url = psycopg.conninfo.make_conninfo(url, user="wf_maintainer")
    try:
        with psycopg.connect(url) as holder, psycopg.connect(worker_url, autocommit=True) as worker:
            assert holder.execute("SELECT pg_catalog.pg_try_advisory_xact_lock("
                                  "pg_catalog.hashtextextended('skiplock.worker_maintain', 0))").fetchone()[0]
            assert worker.execute("SELECT * FROM queue.maintain_now()").fetchall() == []
            holder.rollback()
            steps = [r[0] for r in worker.execute("SELECT task FROM queue.maintain_now()").fetchall()]
            assert "reap_hung" in steps, steps
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                worker.execute("SELECT * FROM queue.maintain(now() + interval '1 day')")
    finally:
        conn.execute("DROP ROLE wf_maintainer")


def test_the_library_takes_a_prepared_statement_name_reused_under_it_for_a_pooler(url: str) -> None:
    """c80cf68's CI hang, in the library: behind an unannounced transaction pooler, a statement
    psycopg prepared meets, on another server connection, another client's statement of the same
    name: 08P01 "bind message supplies 3 parameters, but prepared statement … requires 1". Here the
    name is reused on the worker's own server session, which is what the pooler's swap looks like
    to it. The worker must take it for the pooler (unprepared statements and polling from now on),
    not for a lost connection (it once reconnected and went on preparing)."""
    from skiplock.worker import Worker, _Db

    w = Worker(url, {"wf.prepared": lambda task: None})
    db = _Db(w, "main", threading.Event())
    query = "SELECT %s::int + %s::int + %s::int"
    try:
        for _ in range(8):   # psycopg prepares a statement run 5 times
            assert db.query(query, (1, 2, 3)) == [(6,)]
        assert db.conn is not None
        (name,) = db.conn.execute("SELECT name FROM pg_prepared_statements WHERE cardinality(parameter_types) = 3",
                                  prepare=False).fetchone()
        db.conn.execute(f'DEALLOCATE "{name}"', prepare=False)
        db.conn.execute(f'PREPARE "{name}"(int) AS SELECT $1', prepare=False)   # another client's, same name
        assert db.query(query, (1, 2, 3)) == [(6,)]
        assert w.sessions is False, "08P01 on a prepared statement was not taken for a transaction pooler"
        assert w.counters.reconnects == 0
        assert db.conn.prepare_threshold is None
    finally:
        db.close()


@pytest.mark.parametrize("kind", ["Worker", "AsyncWorker"])
def test_a_connection_attempt_that_hangs_times_out_and_a_stop_ends_the_worker(
        kind: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        silent_server: tuple[int, list]) -> None:
    """A server that accepts the connection and never answers (a proxy in front of a dead server, a
    host that drops packets looks the same): each attempt ends at the worker's connect timeout and
    is retried, and stop() ends run() (Unreachable). Its default applies where the URL sets none;
    here 2 s instead of 10. Without it, psycopg's bound of 130 s held each attempt."""
    import asyncio

    import skiplock.connect
    import skiplock.worker as library

    monkeypatch.setattr(skiplock.connect, "CONNECT_TIMEOUT", 2)
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    port, held = silent_server
    url = f"host=127.0.0.1 port={port} dbname=nothing user=nobody sslmode=disable"
    cls = getattr(library, kind)
    w = cls(url, {"wf.hole": lambda task: None}, maintain_every=0)
    ended: list[BaseException | None] = []

    def run() -> None:
        try:
            asyncio.run(w.run()) if kind == "AsyncWorker" else w.run()
            ended.append(None)
        except BaseException as e:  # noqa: BLE001 - what run() raised is the verdict
            ended.append(e)

    runner = threading.Thread(target=run, daemon=True)
    with caplog.at_level("WARNING", logger="skiplock.worker"):
        runner.start()
        wait_for(lambda: len(held) >= 3, timeout=60)   # three attempts: two of them timed out
        w.stop()
        runner.join(60)
    assert not runner.is_alive(), "run() did not return after stop() while the server never answered"
    assert len(ended) == 1 and isinstance(ended[0], library.Unreachable), ended
    assert "cannot connect (connection timeout expired" in caplog.text, caplog.text
