"""The `skiplock` command, run as a user runs it: a subprocess against a real database."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import psycopg
import pytest

import dev.testrun
from skiplock import cli, migrate
from skiplock.sqlfiles import ROOT

ENV = dict(os.environ, COLUMNS="200")  # rich wraps tables at 80 columns when not on a terminal
ENV.pop("DATABASE_URL", None)


@pytest.fixture(scope="module")
def url(admin_url: str, template_db: str) -> Iterator[str]:
    u = dev.testrun.create_database(admin_url, "test_cli", template=template_db)  # alembic upgrade head: what we ship
    try:
        yield u
    finally:
        dev.testrun.drop_database(admin_url, u)


@pytest.fixture
def conn(url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(url, autocommit=True) as c:
        yield c


def skiplock_cmd(url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "skiplock", "--db", url, *args]


def run(url: str, *args: str, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(skiplock_cmd(url, *args), input=input, capture_output=True, text=True,
                          timeout=timeout, env=ENV, cwd=ROOT)


def rows(conn: psycopg.Connection, stage: str) -> list[tuple]:
    return conn.execute("SELECT id, status::text, attempt, error_text FROM queue.tasks WHERE stage = %s ORDER BY id",
                        (stage,)).fetchall()


def enqueue(conn: psycopg.Connection, stage: str, *payloads: dict) -> list[int]:
    return [r[0] for r in conn.execute("SELECT queue.enqueue_batch(%s::jsonb[], %s)",
                                       ([json.dumps(p) for p in payloads], stage))]


def wait_for(predicate, timeout: float = 90.0, every: float = 0.1) -> None:
    """Until predicate() holds; `timeout` only bounds a hang (it returns as soon as it holds)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(every)


# -- help ---------------------------------------------------------------------------------------

def test_help_on_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    commands = sorted(subparsers.choices)
    assert {"upgrade", "enqueue", "worker", "stats", "top", "maintain", "devdb"} <= set(commands)
    for argv in [["--help"]] + [[name, "--help"] for name in commands]:
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 0, argv
        out = capsys.readouterr().out
        assert out.startswith("usage: skiplock"), argv
    # and the installed way of running it
    proc = subprocess.run([sys.executable, "-m", "skiplock", "worker", "--help"], capture_output=True, text=True,
                          env=ENV, cwd=ROOT, timeout=60)
    assert proc.returncode == 0 and "--fatal-exit-code" in proc.stdout


# -- enqueue ------------------------------------------------------------------------------------

def test_enqueue_from_arguments_prints_ids(url: str, conn: psycopg.Connection) -> None:
    proc = run(url, "enqueue", "--stage", "cli.args", '{"a": 1}', '[2, 3]')
    assert proc.returncode == 0, proc.stderr
    ids = [int(x) for x in proc.stdout.split()]
    assert [(r[0], r[1]) for r in rows(conn, "cli.args")] == [(ids[0], "ready"), (ids[1], "ready")]
    assert conn.execute("SELECT payload FROM queue.tasks WHERE id = %s", (ids[1],)).fetchone()[0] == [2, 3]


def test_enqueue_json_lines_from_stdin_in_batches(url: str, conn: psycopg.Connection) -> None:
    lines = "".join(json.dumps({"n": i}) + "\n" for i in range(2500))
    proc = run(url, "enqueue", "--stage", "cli.stdin", "--batch", "1000", input=lines)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "2500"
    assert "2500" in proc.stderr  # the progress bar (more than one batch)
    assert conn.execute("SELECT count(*), count(DISTINCT payload) FROM queue.tasks WHERE stage = 'cli.stdin'"
                        ).fetchone() == (2500, 2500)


def test_enqueue_key_priority_and_delay(url: str, conn: psycopg.Connection) -> None:
    first = run(url, "enqueue", "-s", "cli.key", "--key", "k1", "--priority", "-3", "--delay", "60", '{"v": 1}')
    again = run(url, "enqueue", "-s", "cli.key", "--key", "k1", '{"v": 2}')
    assert first.returncode == again.returncode == 0
    assert first.stdout == again.stdout  # mode ignore: the same task
    # Measured from the enqueue's own time, not from now(): under load the second command's start
    # took more than the 10 s a comparison with now() allowed (2026-11-27, load 14).
    assert conn.execute("SELECT priority, run_at - created = interval '60 seconds', payload FROM queue.tasks "
                        "WHERE stage = 'cli.key'").fetchall() == [(-3, True, {"v": 1})]


def test_enqueue_after_waits_for_the_tasks_given(url: str, conn: psycopg.Connection) -> None:
    parents = [int(x) for x in run(url, "enqueue", "-s", "cli.parent", "{}", "{}").stdout.split()]
    proc = run(url, "enqueue", "-s", "cli.child", "--after", ",".join(map(str, parents)), "--after-failed", "run",
               '{"c": 1}', '{"c": 2}')
    assert proc.returncode == 0, proc.stderr
    children = [int(x) for x in proc.stdout.split()]
    assert conn.execute("SELECT array_agg(status::text ORDER BY id), array_agg(waits_for ORDER BY id) FROM queue.tasks"
                        " WHERE stage = 'cli.child'").fetchone() == (["waiting", "waiting"], [parents, parents])
    assert conn.execute("SELECT bool_and(run_if_failed) FROM queue.dependencies WHERE task = ANY(%s)",
                        (children,)).fetchone()[0] is True
    unknown = run(url, "enqueue", "-s", "cli.child", "--after", "999999999", "{}")
    assert unknown.returncode == 1 and "P0002" in unknown.stderr and "nothing was enqueued" in unknown.stderr
    bad = run(url, "enqueue", "-s", "cli.child", "--after", "1,x", "{}")
    assert bad.returncode == 2 and "comma-separated" in bad.stderr


def test_enqueue_rejects_bad_input(url: str, conn: psycopg.Connection) -> None:
    proc = run(url, "enqueue", "-s", "cli.bad", input='{"ok": 1}\nnot json\n')
    assert proc.returncode == 2 and "line 2" in proc.stderr
    proc = run(url, "enqueue", "-s", "cli.bad", "42")  # a scalar: the database says no (22023)
    assert proc.returncode == 1 and "22023" in proc.stderr
    assert rows(conn, "cli.bad") == []


def test_enqueue_refuses_a_priority_outside_the_integer_range(url: str, conn: psycopg.Connection) -> None:
    """3000000000 once reached the server, whose "function does not exist" read as "not installed"."""
    for key in ([], ["--key", "k-prio"]):
        proc = run(url, "enqueue", "-s", "cli.prio", "--priority", "3000000000", *key, '{"d": 1}')
        assert proc.returncode == 2, (key, proc.returncode, proc.stderr)
        assert "argument --priority: 3000000000 is out of range" in proc.stderr, (key, proc.stderr)
    assert rows(conn, "cli.prio") == []


# -- worker -------------------------------------------------------------------------------------

def test_worker_exit_zero_finishes(url: str, conn: psycopg.Connection) -> None:
    ids = enqueue(conn, "cli.ok", {"a": 1}, {"a": 2}, {"a": 3})
    proc = run(url, "worker", "--stage", "cli.ok", "-c", "2", "--until-empty", "--", "sh", "-c", "cat > /dev/null; exit 0")
    assert proc.returncode == 0, proc.stderr
    assert rows(conn, "cli.ok") == [(i, "done", 1, None) for i in ids]


def test_worker_fatal_exit_code(url: str, conn: psycopg.Connection) -> None:
    (task,) = enqueue(conn, "cli.fatal", {})
    proc = run(url, "worker", "--stage", "cli.fatal", "--fatal-exit-code", "3", "--until-empty",
               "--", "sh", "-c", "echo bad input >&2; exit 3")
    assert proc.returncode == 0, proc.stderr
    assert rows(conn, "cli.fatal") == [(task, "fatal", 1, "exit status 3; last lines of stderr:\nbad input")]


def test_worker_snooze_exit_code_hands_the_task_back_without_counting_the_attempt(url: str, conn: psycopg.Connection,
                                                                                    tmp_path: Path) -> None:
    (task,) = enqueue(conn, "cli.snooze", {})
    conn.execute("SELECT queue.configure_stage('cli.snooze', max_attempts => 1)")
    # The first run snoozes (exit 75), the second works: one attempt in all, though two runs.
    script = f'cat > /dev/null; [ -e "{tmp_path}/ran" ] && exit 0; touch "{tmp_path}/ran"; exit 75'
    proc = run(url, "worker", "--stage", "cli.snooze", "--snooze-exit-code", "75", "--snooze", "0.5", "--until-empty",
               "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert "1 snoozed" in proc.stderr, proc.stderr
    ((task_id, status, attempt, error, run_at, updated),) = conn.execute(
        "SELECT id, status::text, attempt, error_text, run_at, updated FROM queue.live_tasks WHERE stage = 'cli.snooze'").fetchall()
    assert (task_id, status, attempt, error) == (task, "ready", 0, None)  # handed back, nothing counted
    assert 0.45 < (run_at - updated).total_seconds() < 0.55
    wait_for(lambda: conn.execute("SELECT run_at <= clock_timestamp() FROM queue.live_tasks WHERE id = %s",
                                  (task,)).fetchone()[0])  # the snooze is over
    proc = run(url, "worker", "--stage", "cli.snooze", "--snooze-exit-code", "75", "--until-empty", "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert rows(conn, "cli.snooze") == [(task, "done", 1, None)]


def test_worker_failure_keeps_the_last_stderr_lines(url: str, conn: psycopg.Connection) -> None:
    (task,) = enqueue(conn, "cli.fail", {})
    script = 'for i in $(seq 1 30); do echo "line $i" >&2; done; exit 1'
    proc = run(url, "worker", "--stage", "cli.fail", "--until-empty", "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    ((task_id, status, attempt, error),) = rows(conn, "cli.fail")
    assert (task_id, status, attempt) == (task, "error", 1)  # retried later, per the stage's backoff
    assert error.startswith("exit status 1; last lines of stderr:\n")
    assert "line 11\n" in error and error.endswith("line 30") and "line 10\n" not in error


def test_worker_records_a_failure_whose_stderr_holds_a_nul_byte(url: str, conn: psycopg.Connection) -> None:
    """The server refuses NUL in text (22021): it once killed the slot, the task stayed running
    under its lease and the worker exited 1. NUL is kept as \\0; both tasks fail normally."""
    ids = enqueue(conn, "cli.nul", {"n": 1}, {"n": 2})
    proc = run(url, "worker", "--stage", "cli.nul", "--until-empty", "--",
               "bash", "-c", 'printf "binary\\0garbage\\n" >&2; exit 1')
    assert proc.returncode == 0, proc.stderr
    assert rows(conn, "cli.nul") == [(i, "error", 1, "exit status 1; last lines of stderr:\nbinary\\0garbage")
                                     for i in ids]


def test_worker_gives_payload_on_stdin_and_task_in_env(url: str, conn: psycopg.Connection, tmp_path: Path) -> None:
    payload = {"image": "a.png", "sizes": [1, 2]}
    (task,) = enqueue(conn, "cli.env", payload)
    script = ('cat > "$OUT/$SKIPLOCK_TASK_ID.json"; '
              'echo "$SKIPLOCK_TASK_ID $SKIPLOCK_ATTEMPT $SKIPLOCK_STAGE" > "$OUT/$SKIPLOCK_TASK_ID.env"')
    proc = subprocess.run(skiplock_cmd(url, "worker", "--stage", "cli.env", "--until-empty", "--", "sh", "-c", script),
                          capture_output=True, text=True, timeout=60, env=dict(ENV, OUT=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / f"{task}.json").read_text()) == payload
    assert (tmp_path / f"{task}.env").read_text().split() == [str(task), "1", "cli.env"]


def test_heartbeat_keeps_a_long_command_alive(url: str, conn: psycopg.Connection) -> None:
    (task,) = enqueue(conn, "cli.long", {})
    stop = threading.Event()
    reaped = []

    def reaper() -> None:  # what `maintain` does on a real system, only much more often
        with psycopg.connect(url, autocommit=True) as c:
            while not stop.is_set():
                reaped.append(c.execute("SELECT queue.reap_hung()").fetchone()[0])
                time.sleep(0.2)

    t = threading.Thread(target=reaper)
    t.start()
    try:
        # A command that outlives two leases; a lease of 3 s (a heartbeat every second) leaves a
        # heartbeat 2 s of slack on a loaded machine.
        proc = run(url, "worker", "--stage", "cli.long", "--lease", "3", "--until-empty", "--", "sleep", "7")
    finally:
        stop.set()
        t.join()
    assert proc.returncode == 0, proc.stderr
    assert rows(conn, "cli.long") == [(task, "done", 1, None)]  # done once, never reaped
    assert sum(reaped) == 0 and len(reaped) > 10


def test_lease_lost_kills_the_command_and_records_nothing(url: str, conn: psycopg.Connection) -> None:
    (task,) = enqueue(conn, "cli.lost", {})
    started = time.monotonic()
    proc = subprocess.Popen(skiplock_cmd(url, "worker", "--stage", "cli.lost", "--lease", "1.5", "--until-empty",
                                         "--", "sleep", "60"), stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        wait_for(lambda: rows(conn, "cli.lost")[0][1] == "running")
        conn.execute("SELECT queue.cancel(%s)", (task,))
        _, err = proc.communicate(timeout=50)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert time.monotonic() - started < 50  # the command (sleep 60) was killed, not waited for
    assert "lease lost" in err
    assert rows(conn, "cli.lost") == [(task, "cancelled", 1, None)]


def _start_worker(url: str, stage: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(skiplock_cmd(url, "worker", "--stage", stage, *args), stderr=subprocess.PIPE,
                            text=True, env=ENV)


def _running(conn: psycopg.Connection, stage: str) -> int:
    return conn.execute("SELECT count(*) FROM queue.tasks WHERE stage = %s AND status = 'running'",
                        (stage,)).fetchone()[0]


def test_sigterm_drains_running_commands(url: str, conn: psycopg.Connection) -> None:
    ids = enqueue(conn, "cli.drain", {}, {}, {})
    proc = _start_worker(url, "cli.drain", "-c", "2", "--grace", "30", "--", "sleep", "2")
    try:
        wait_for(lambda: _running(conn, "cli.drain") == 2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "draining" in err
    statuses = sorted(r[1] for r in rows(conn, "cli.drain"))
    assert statuses == ["done", "done", "ready"], err  # the two running ones finished; the third never taken
    assert len(ids) == 3


def test_sigterm_past_the_grace_releases_the_tasks_without_using_an_attempt(url: str, conn: psycopg.Connection) -> None:
    enqueue(conn, "cli.grace", {}, {})
    proc = _start_worker(url, "cli.grace", "-c", "2", "--grace", "1", "--", "sleep", "60")
    try:
        wait_for(lambda: _running(conn, "cli.grace") == 2)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=50)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert time.monotonic() - sent < 50  # the grace (1 s) ended the commands (sleep 60)
    result = conn.execute("SELECT status::text, attempt, run_at <= now(), error_text "
                          "FROM queue.tasks WHERE stage = 'cli.grace'").fetchall()
    assert result == [("ready", 0, True, None)] * 2
    assert "2 interrupted" in err, err  # the summary counts them (it once read a counter never written)


def test_worker_errors(url: str) -> None:
    proc = run(url, "worker", "--stage", "cli.none", "--until-empty")
    assert proc.returncode == 2 and "give the command" in proc.stderr
    proc = run(url, "worker", "--stage", "*", "--until-empty", "--", "true")
    assert proc.returncode == 1 and "stage" in proc.stderr


# -- stats, top, maintain, upgrade -------------------------------------------------------------

def test_stats_and_top_print_the_stages(url: str, conn: psycopg.Connection) -> None:
    enqueue(conn, "cli.stats.one", {}, {})
    enqueue(conn, "cli.stats.two", {})
    conn.execute("SELECT queue.finish(id, lease) FROM queue.take_next('cli.stats.two')")
    proc = run(url, "stats")
    assert proc.returncode == 0, proc.stderr
    assert "cli.stats.one" in proc.stdout and "cli.stats.two" in proc.stdout and "done" in proc.stdout
    proc = run(url, "top", "--iterations", "2", "--interval", "0.2", "-s", "cli.stats.one", "-s", "cli.stats.two")
    assert proc.returncode == 0, proc.stderr
    assert "cli.stats.one" in proc.stdout and "cli.stats.two" in proc.stdout
    assert "ready" in proc.stdout and "done" in proc.stdout


def test_maintain(url: str) -> None:
    if not (ROOT / "schema" / "functions" / "maintain.sql").exists():
        pytest.skip("queue.maintain() is not in schema/ yet (another change is adding it)")
    proc = run(url, "maintain", "--once")
    assert proc.returncode == 0, proc.stderr
    assert "maintain" in proc.stdout
    loop = subprocess.Popen(skiplock_cmd(url, "maintain", "--every", "0.2"), stdout=subprocess.PIPE, text=True, env=ENV)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(loop.stdout), daemon=True)
    reader.start()
    try:
        # Two calls printed: the loop runs, and its handlers are in place (installed before the
        # first call). A fixed sleep sent SIGTERM before that on a loaded machine.
        def two_calls() -> bool:
            assert loop.poll() is None, f"maintain exited with {loop.returncode} before SIGTERM: {lines}"
            return sum("maintain" in line for line in lines) >= 2
        wait_for(two_calls)
        loop.send_signal(signal.SIGTERM)
        loop.wait(timeout=60)
        reader.join(timeout=60)
    finally:
        loop.kill()
    out = "".join(lines)
    assert loop.returncode == 0
    assert out.count("maintain") >= 2


def test_maintain_loop_survives_calls_that_fail_and_reaps_once_they_stop(url: str, conn: psycopg.Connection) -> None:
    # A history policy whose retention reaches before year 1 makes every rotation raise 22008
    # (timestamp out of range), so each call of queue.maintain() fails and rolls back, reaping
    # included. Written to the table directly as the superuser (not through configure_history,
    # which may refuse it), and only the data: no function of skiplock is redefined.
    before = conn.execute("SELECT retention, last_rotated FROM queue.history_policy").fetchone()
    conn.execute("UPDATE queue.history_policy SET retention = interval '10000 years', last_rotated = NULL")
    loop = None
    try:
        with pytest.raises(psycopg.Error) as raised:  # the provocation still works: one call fails
            conn.execute("SELECT * FROM queue.maintain()")
        assert raised.value.sqlstate == "22008", raised.value
        line = _one_clear_line(run(url, "maintain", "--once"), "maintain")  # --once still exits 1 on it
        assert "SQLSTATE 22008" in line and "next call" not in line, line
        # A hung task: taken, its lease expired.
        (task,) = enqueue(conn, "cli.maintain.err", {})
        conn.execute("SELECT * FROM queue.take_next('cli.maintain.err', lease_for => interval '1 second')")
        conn.execute("UPDATE queue.live_tasks SET lease_expires = now() - interval '1 minute' WHERE id = %s", (task,))

        loop = subprocess.Popen(skiplock_cmd(url, "maintain", "--every", "0.2"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=ENV)
        out: list[str] = []
        err: list[str] = []
        readers = [threading.Thread(target=lambda s=s, into=into: into.extend(s), daemon=True)
                   for s, into in ((loop.stdout, out), (loop.stderr, err))]
        for r in readers:
            r.start()

        def alive_and(predicate):
            def check() -> bool:
                assert loop.poll() is None, f"maintain exited with {loop.returncode}: {''.join(err)}"
                return predicate()
            return check

        wait_for(alive_and(lambda: len(err) >= 2))  # failed twice and is still there
        assert all(line.startswith("skiplock maintain: ") and "SQLSTATE 22008" in line for line in err), err
        assert "Traceback" not in "".join(err)
        assert rows(conn, "cli.maintain.err")[0][1] == "running"  # the failed calls reaped nothing

        conn.execute("UPDATE queue.history_policy SET retention = %s", (before[0],))  # the setting fixed
        wait_for(alive_and(lambda: rows(conn, "cli.maintain.err")[0][1] != "running"))
        wait_for(alive_and(lambda: any("reap_hung" in line and "count=1" in line for line in out)))
        assert rows(conn, "cli.maintain.err")[0][3].startswith("lease expired")
        time.sleep(0.5)
        assert loop.poll() is None  # still looping
        loop.send_signal(signal.SIGTERM)
        loop.wait(timeout=60)
        for r in readers:
            r.join(timeout=60)
        assert loop.returncode == 0, "".join(err)
    finally:
        if loop is not None:
            loop.kill()
            loop.wait()
        conn.execute("UPDATE queue.history_policy SET retention = %s, last_rotated = %s", before)


def test_upgrade_on_an_empty_database(admin_url: str) -> None:
    u = dev.testrun.create_database(admin_url, "test_cli_upgrade")
    try:
        proc = run(u, "upgrade")
        assert proc.returncode == 0, proc.stderr
        assert "to apply: 0100" in proc.stdout
        with psycopg.connect(u) as c:
            assert c.execute("SELECT count(*) FROM queue.skiplock_version").fetchone()[0] == 1
        again = run(u, "upgrade")
        assert again.returncode == 0 and "nothing to apply" in again.stdout
    finally:
        dev.testrun.drop_database(admin_url, u)


# -- failures said in one line, the database down, the worker's end ---------------------------

def _unreachable_url() -> str:
    from skiplock.devdb import _free_port
    return f"postgresql://postgres@127.0.0.1:{_free_port()}/nothing_listens_here"


def _one_clear_line(proc: subprocess.CompletedProcess, command: str) -> str:
    assert proc.returncode == 1, (command, proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, (command, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"skiplock {command}: "), (command, proc.stderr)
    return lines[0]


def test_commands_on_an_unreachable_database_exit_1_with_one_line(tmp_path: Path) -> None:
    down = _unreachable_url()
    for args in (["enqueue", "{}"], ["stats"], ["top", "--iterations", "1"], ["upgrade"], ["downgrade", "-1"]):
        line = _one_clear_line(run(down, *args), args[0])
        assert "cannot reach the database" in line, line


@pytest.mark.parametrize("command", ["stats", "upgrade"])
def test_commands_on_a_server_that_never_answers_give_up_in_one_line(command: str, silent_server: tuple[int, list]) -> None:
    """A server that accepts connections and never answers: each connection attempt of a command
    ends after 10 s (skiplock.connect.CONNECT_TIMEOUT; psycopg alone waits 130 s), and the command
    says so in one line, exit 1, well within the 90 s this test gives it. `upgrade` connects
    through Alembic's env.py as well."""
    port, held = silent_server
    hole = f"host=127.0.0.1 port={port} dbname=nothing user=nobody sslmode=disable"
    env = {k: v for k, v in ENV.items() if k != "PGCONNECT_TIMEOUT"}
    proc = subprocess.run(skiplock_cmd(hole, command), capture_output=True, text=True, timeout=90, env=env, cwd=ROOT)
    line = _one_clear_line(proc, command)
    assert "cannot reach the database" in line and "timeout expired" in line, line
    assert held, "no connection attempt reached the server"


def test_maintain_once_on_an_unreachable_database_fails_without_promising_a_retry() -> None:
    proc = run(_unreachable_url(), "maintain", "--once")
    line = _one_clear_line(proc, "maintain")
    assert "cannot reach the database" in line and "retrying" not in line, line


def test_commands_on_a_database_without_skiplock_say_run_upgrade(admin_url: str) -> None:
    bare = dev.testrun.create_database(admin_url, "test_cli_bare")
    try:
        for args in (["stats"], ["top", "--iterations", "1"], ["maintain", "--once"], ["enqueue", "{}"]):
            line = _one_clear_line(run(bare, *args), args[0])
            assert "run `skiplock upgrade`" in line, line
    finally:
        dev.testrun.drop_database(admin_url, bare)


def test_upgrade_and_downgrade_to_an_unknown_revision_say_so(url: str) -> None:
    for command in ("upgrade", "downgrade"):
        line = _one_clear_line(run(url, command, "nosuchrev"), command)
        assert "nosuchrev" in line, line


def test_demo_rejects_a_count_below_one() -> None:
    env = dict(ENV, DATABASE_URL=_unreachable_url())  # were they accepted, no cluster would be started
    for args in (["--tasks", "-5"], ["--workers", "0"]):
        proc = subprocess.run([sys.executable, "-m", "skiplock", "demo", *args], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=60)
        assert proc.returncode == 2 and "must be positive" in proc.stderr, (args, proc.stderr)


def test_demo_takes_db_like_the_other_commands(url: str) -> None:
    """`demo --db URL` was refused and `--db URL demo` ignored (a throwaway cluster instead)."""
    for argv in (["demo", "--db", url], ["--db", url, "demo"]):
        proc = subprocess.run([sys.executable, "-m", "skiplock", *argv, "--tasks", "10", "--workers", "1"],
                              capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=120)
        assert proc.returncode == 0, (argv, proc.stderr)
        assert "using the given database" in proc.stdout and "throwaway" not in proc.stdout, (argv, proc.stdout)


def test_upgrade_with_a_bad_lock_attempts_setting_says_so_in_one_line(admin_url: str) -> None:
    """SKIPLOCK_MIGRATION_LOCK_ATTEMPTS=abc once ended `skiplock upgrade` with a traceback."""
    bare = dev.testrun.create_database(admin_url, "test_cli_attempts")
    try:
        for value in ("abc", "0"):
            proc = subprocess.run(skiplock_cmd(bare, "upgrade"), capture_output=True, text=True, timeout=60, cwd=ROOT,
                                  env=dict(ENV, SKIPLOCK_MIGRATION_LOCK_ATTEMPTS=value))
            assert proc.returncode == 1 and "Traceback" not in proc.stderr, (value, proc.stderr)
            last = proc.stderr.strip().splitlines()[-1]
            assert last == (f"skiplock upgrade: SKIPLOCK_MIGRATION_LOCK_ATTEMPTS must be a whole number of tries, "
                            f"at least 1, not {value!r}"), (value, proc.stderr)
    finally:
        dev.testrun.drop_database(admin_url, bare)


def test_seconds_options_reject_what_is_not_a_sane_number_of_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    for option in ("--lease", "--snooze", "--poll", "--grace"):
        for value, said in (("abc", "'abc' is not a number of seconds"), ("nan", "is not a number of seconds"),
                            ("inf", "is not a number of seconds"), ("1e20", "too long")):
            with pytest.raises(SystemExit) as exit_:
                cli.main(["worker", "-s", "x", option, value, "--", "true"])
            assert exit_.value.code == 2, (option, value)
            err = capsys.readouterr().err
            assert f"argument {option}: " in err and said in err, (option, value, err)
    with pytest.raises(SystemExit):
        cli.main(["top", "--help"])
    assert "since the previous refresh" not in capsys.readouterr().out  # the rate is last minute's count / 60


def test_run_sql_as_a_login_outside_skiplock_sql_gets_the_grant_hint(url: str, conn: psycopg.Connection) -> None:
    role = f"cli_plain_{os.getpid()}"
    conn.execute(f"CREATE ROLE {role} LOGIN")  # no skiplock role: not even USAGE on schema queue
    try:
        proc = run(psycopg.conninfo.make_conninfo(url, user=role), "run-sql", "--stage", "cli.sql")
        line = _one_clear_line(proc, "run-sql")
        assert f"GRANT skiplock_sql TO {role}" in line and "permission denied" not in line, line
    finally:
        conn.execute(f"DROP ROLE {role}")


def test_worker_log_line_keeps_the_last_line_of_stderr(url: str, conn: psycopg.Connection) -> None:
    (task,) = enqueue(conn, "cli.logline", {})
    proc = run(url, "worker", "--stage", "cli.logline", "--until-empty", "--",
               "sh", "-c", "echo first >&2; echo the real reason >&2; exit 7")
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if f"task {task} attempt 1: failed" in x]
    assert line.endswith("(exit status 7; last line of stderr: the real reason)"), line


def test_sigterm_with_nothing_running_does_not_report_draining(url: str) -> None:
    proc = _start_worker(url, "cli.idle", "--poll", "0.5", "--", "true")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        wait_for(lambda: any("slot(s) running" in line for line in lines))  # its handlers are in place
        time.sleep(5.5)  # the progress line came every 5 s, counted from the start: at once on the signal
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        reader.join(timeout=60)
    finally:
        proc.kill()
    err = "".join(lines)
    assert proc.returncode == 0, err
    assert "draining" not in err and "0 command(s)" not in err, err


def _gone(pid: int) -> bool:
    """The process ended (a zombie waiting for its new parent counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not _gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _pid_from(path: Path) -> int:
    wait_for(lambda: path.exists() and path.read_text().strip() != "")
    return int(path.read_text())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_worker_killed_with_sigkill_takes_its_command_with_it(url: str, conn: psycopg.Connection,
                                                              tmp_path: Path) -> None:
    enqueue(conn, "cli.kill9", {})
    pidfile = tmp_path / "command.pid"
    proc = _start_worker(url, "cli.kill9", "--lease", "3", "--", "sh", "-c", f'echo $$ > "{pidfile}"; exec sleep 60')
    command = None
    try:
        command = _pid_from(pidfile)
        proc.kill()  # SIGKILL: the worker cannot clean up; its command must not outlive it
        proc.communicate(timeout=60)
        assert _wait_gone(command, 30), "the command outlived its worker"
    finally:
        proc.kill()
        if command is not None and not _gone(command):
            os.kill(command, signal.SIGKILL)


def test_worker_sigterm_with_the_database_down_kills_the_command_and_exits_1(tmp_path: Path) -> None:
    from skiplock import devdb
    cluster = devdb.Cluster(durable=False).start()  # its own server, which this test stops
    command = None
    proc = None
    try:
        u = cluster.createdb("down")
        migrate.upgrade(u)
        with psycopg.connect(u, autocommit=True) as c:
            (task,) = enqueue(c, "cli.down", {})
        pidfile = tmp_path / "command.pid"
        proc = _start_worker(u, "cli.down", "--lease", "3", "--grace", "1",
                             "--", "sh", "-c", f'echo $$ > "{pidfile}"; exec sleep 60')
        command = _pid_from(pidfile)
        cluster.stop(mode="fast", remove=False)
        time.sleep(1.0)  # a heartbeat or two fails
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=90)  # grace 1 s, the kill, retries of the release (bounded)
        assert _wait_gone(command, 30), f"the command outlived its worker:\n{err}"
        assert proc.returncode == 1, err
        assert f"task {task} could not be released: cannot reach the database" in err, err
    finally:
        if proc is not None:
            proc.kill()
        if command is not None and not _gone(command):
            os.kill(command, signal.SIGKILL)
        cluster.stop()
