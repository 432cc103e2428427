"""The reference clients under clients/ (Python, Node.js, bash + psql) and wake-up latency.

Each language's producer enqueues a stage's tasks (some fail once, one is fatal, one outlives
its lease and needs heartbeats while a reaper runs), its worker drains the stage as a
subprocess, SIGTERM stops it with exit code 0, and every task ends exactly once. The Node
package's own tests (clients/node/test/) run through `npm ci` + `npm test`. Wake-ups: an idle
worker takes a new task within milliseconds of the enqueue's commit through LISTEN/NOTIFY, and
within its slow poll when the stage turned NOTIFY off.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator
from urllib.parse import quote, urlencode

import psycopg
import pytest

from dev.testrun import create_database, drop_database
from skiplock.sqlfiles import ROOT
from skiplock.worker import Fail, Outcome, Task, Worker

CLIENTS = ROOT / "clients"
NODE_DIR = CLIENTS / "node"


@pytest.fixture(scope="module")
def url(admin_url: str, template_db: str) -> Iterator[str]:
    """A database built by the migrations, for this module."""
    db = create_database(admin_url, "test_clients", template=template_db)  # alembic upgrade head: what we ship
    try:
        yield db
    finally:
        drop_database(admin_url, db)


def as_uri(conninfo: str) -> str:
    """A postgresql:// URI for a libpq conninfo: node-postgres reads only URIs."""
    p = psycopg.conninfo.conninfo_to_dict(conninfo)
    auth = quote(str(p.get("user", "")), safe="")
    if p.get("password"):
        auth += ":" + quote(str(p["password"]), safe="")
    query = {k: str(p[k]) for k in ("host", "port") if p.get(k)}
    return f"postgresql://{auth}@/{quote(str(p['dbname']), safe='')}?{urlencode(query, quote_via=quote)}"


@pytest.fixture(scope="module")
def node_ready() -> None:
    """`npm ci` in clients/node. No node or npm fails the tests: it must never skip quietly."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not found: the Node client's tests need Node.js >= 18"
                    " and npm (Debian: apt-get install nodejs npm)", pytrace=False)
    # Once per checkout, under a file lock: `npm ci` empties node_modules first, and under
    # pytest-xdist another process's module may be running a Node client at that moment.
    lock = NODE_DIR / ".npm-ci.lock"
    marker = NODE_DIR / "node_modules" / f".skiplock-ci-{hashlib.sha256((NODE_DIR / 'package-lock.json').read_bytes()).hexdigest()[:16]}"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if marker.exists():
            return
        proc = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"npm ci failed:\n{proc.stdout}\n{proc.stderr}"
        marker.touch()


LANGUAGES = {
    "python": {"producer": [sys.executable, str(CLIENTS / "python" / "producer.py")],
               "worker": [sys.executable, str(CLIENTS / "python" / "worker.py")]},
    # the same script on AsyncWorker (asyncio, psycopg's AsyncConnection)
    "python_async": {"producer": [sys.executable, str(CLIENTS / "python" / "producer.py")],
                     "worker": ["env", "ASYNCIO=1", sys.executable, str(CLIENTS / "python" / "worker.py")]},
    "node": {"producer": ["node", str(NODE_DIR / "producer.js")],
             "worker": ["node", str(NODE_DIR / "worker.js")]},
    "bash": {"producer": [str(CLIENTS / "bash" / "producer.sh")],
             "worker": [str(CLIENTS / "bash" / "worker.sh"), str(CLIENTS / "bash" / "example-handler.sh")]},
}


@pytest.fixture(params=list(LANGUAGES))
def language(request: pytest.FixtureRequest) -> str:
    if request.param == "node":
        request.getfixturevalue("node_ready")
    return request.param


def client_env(url: str, stage: str, **settings: object) -> dict[str, str]:
    env = dict(os.environ)
    env.update(DATABASE_URL=as_uri(url), STAGE=stage)
    env.update({k: str(v) for k, v in settings.items()})
    return env


def produce(language: str, url: str, stage: str, payloads: list[dict]) -> list[int]:
    """Enqueue through the language's producer (payloads as JSON lines on stdin); its ids."""
    proc = subprocess.run(LANGUAGES[language]["producer"], env=client_env(url, stage),
                          input="".join(json.dumps(p) + "\n" for p in payloads),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [int(line) for line in proc.stdout.split()]


class ClientWorker:
    """A client worker as a subprocess; its output is collected for the failure message."""

    def __init__(self, language: str, url: str, stage: str, command: list[str] | None = None, **settings: object) -> None:
        self.proc = subprocess.Popen(command or LANGUAGES[language]["worker"], env=client_env(url, stage, **settings),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.output: list[str] = []
        self.reader = threading.Thread(target=lambda: self.output.extend(self.proc.stdout), daemon=True)
        self.reader.start()

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, then its exit code; killed (and the test failed) if it hangs."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"worker ignored SIGTERM for {timeout} s:\n{self.log()}")
        self.reader.join(10)
        return code

    def log(self) -> str:
        return "".join(self.output)


class Reaper(threading.Thread):
    """Calls queue.reap_hung() every 0.2 s, as a deployment's supervisor would."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.halt, self.reaped = url, threading.Event(), 0

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.halt.wait(0.2):
                self.reaped += conn.execute("SELECT queue.reap_hung()").fetchone()[0]

    def stop(self) -> None:
        self.halt.set()
        self.join(10)


def wait_until(what: str, cond, timeout: float, worker: ClientWorker | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if worker is not None and worker.proc.poll() is not None:
            pytest.fail(f"the worker exited ({worker.proc.returncode}) before {what}:\n{worker.log()}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}" + (f":\n{worker.log()}" if worker else ""))
        time.sleep(0.05)


def live_count(conn: psycopg.Connection, stage: str) -> int:
    return conn.execute("SELECT count(*) FROM queue.live_tasks WHERE stage = %s", (stage,)).fetchone()[0]


def test_client_drains_a_stage(language: str, url: str) -> None:
    """Producer → worker: retries, a fatal task, a task kept alive by heartbeats; SIGTERM → exit 0."""
    stage = f"drain_{language}"
    lease = 6  # the long task works 8 s: only heartbeats keep the reaper off it (one every 2 s: room under load)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT queue.configure_stage(%s, backoff_base => interval '0', backoff_jitter => 0)",
                     (stage,))
        payloads = [{"n": n, "fail_attempts": 1 if n % 5 == 0 else 0} for n in range(25)]
        payloads += [{"n": 25, "fatal": True}, {"n": 26, "sleep": 8}]
        ids = produce(language, url, stage, payloads)
        assert len(ids) == len(payloads)

        reaper = Reaper(url)
        reaper.start()
        worker = ClientWorker(language, url, stage, BATCH=4, LEASE=lease, IDLE_WAIT=0.5)
        try:
            wait_until("the stage to drain", lambda: live_count(conn, stage) == 0, 120, worker)
        finally:
            code = worker.stop()
            reaper.stop()
        assert code == 0, worker.log()

        rows = conn.execute("SELECT id, status::text, attempt, error_text FROM queue.history WHERE stage = %s",
                            (stage,)).fetchall()
        assert sorted(r[0] for r in rows) == sorted(ids), "every task ends exactly once:\n" + worker.log()
        by_n = {ids.index(r[0]): r[1:] for r in rows}
        for n, (status, attempt, error) in by_n.items():
            if n == 25:
                assert (status, attempt) == ("fatal", 1)
                assert "fatal by request" in error
            else:
                expected = 2 if n % 5 == 0 else 1
                assert (status, attempt) == ("done", expected), f"task {n}:\n{worker.log()}"
        assert reaper.reaped == 0, "a lease ran out: heartbeats did not keep the long task (or its batch)"


def test_client_snoozes_a_task_without_counting_the_attempt(language: str, url: str) -> None:
    """A handler that cannot run a task yet snoozes it (queue.release with retry_in): done later,
    at attempt 1, with no error, though the stage allows a single attempt."""
    # The worker first (it starts while the stage is empty), then the tasks, due to run from `until`
    # on: the worker must take them before then (at once: NOTIFY; the poll is 0.3 s). A machine busy
    # enough that the take comes after `until` snoozes nothing and proves nothing: then again, with
    # a longer window (waiting for the event, not betting on a time).
    with psycopg.connect(url, autocommit=True) as conn:
        for window in (5, 20, 60):
            stage = f"snooze_{language}_{window}"
            conn.execute("SELECT queue.configure_stage(%s, max_attempts => 1)", (stage,))
            worker = ClientWorker(language, url, stage, BATCH=3, IDLE_WAIT=0.3, SNOOZE=0.3)
            try:
                until = time.time() + window
                ids = produce(language, url, stage, [{"n": n, "snooze_until": until} for n in range(3)])
                wait_until("the stage to drain", lambda: live_count(conn, stage) == 0, window + 60, worker)
            finally:
                code = worker.stop()
            assert code == 0, worker.log()
            if all(f"snoozed {i} for" in worker.log() for i in ids):
                break
        rows = conn.execute("SELECT id, status::text, attempt, error_text, extract(epoch FROM finished)::float8"
                            "  FROM queue.history WHERE stage = %s", (stage,)).fetchall()
    assert sorted(r[0] for r in rows) == sorted(ids), worker.log()
    assert all(r[1:4] == ("done", 1, None) for r in rows), f"{rows}\n{worker.log()}"
    # finished, not started: a batch's tasks are all started at its take, and a handler may run
    # just past the snooze's end though the take came just before it.
    assert all(r[4] >= until for r in rows), f"a task was done before its snooze ended: {rows}"
    assert all(f"snoozed {i} for" in worker.log() for i in ids), worker.log()


def test_client_drops_a_task_whose_lease_is_lost(language: str, url: str) -> None:
    """Cancelled while it runs: the next heartbeat gets SK001 and the worker drops its result."""
    stage = f"lost_{language}"
    with psycopg.connect(url, autocommit=True) as conn:
        (task_id,) = produce(language, url, stage, [{"sleep": 3}])
        worker = ClientWorker(language, url, stage, LEASE=1.5, IDLE_WAIT=0.5)
        try:
            wait_until("the task to start", lambda: conn.execute(
                "SELECT 1 FROM queue.live_tasks WHERE id = %s AND status = 'running'", (task_id,)).fetchone(),
                60, worker)
            conn.execute("SELECT queue.cancel(%s)", (task_id,))
            wait_until("the worker to notice", lambda: f"lease lost on {task_id}" in worker.log(), 60, worker)
        finally:
            code = worker.stop()
        assert code == 0, worker.log()
        rows = conn.execute("SELECT status::text FROM queue.history WHERE id = %s", (task_id,)).fetchall()
        assert rows == [("cancelled",)], worker.log()


def test_client_finishes_its_batch_on_sigterm(language: str, url: str) -> None:
    """SIGTERM in the middle of a task: the worker finishes the batch in hand, then exits 0."""
    stage = f"stop_{language}"
    with psycopg.connect(url, autocommit=True) as conn:
        ids = produce(language, url, stage, [{"sleep": 2}, {"n": 1}])
        worker = ClientWorker(language, url, stage, BATCH=2, IDLE_WAIT=0.5)
        try:
            wait_until("the batch to be taken", lambda: conn.execute(
                "SELECT count(*) = 2 FROM queue.live_tasks WHERE stage = %s AND status = 'running'",
                (stage,)).fetchone()[0], 60, worker)
        finally:
            code = worker.stop()
        assert code == 0, worker.log()
        rows = conn.execute("SELECT id, status::text FROM queue.history WHERE stage = %s ORDER BY id",
                            (stage,)).fetchall()
        assert rows == [(ids[0], "done"), (ids[1], "done")], worker.log()


@pytest.fixture(params=["python", "python_async", "node"])
def reconnecting_language(request: pytest.FixtureRequest) -> str:
    """The clients whose workers reconnect after a lost connection (bash's has its own tests)."""
    if request.param == "node":
        request.getfixturevalue("node_ready")
    return request.param


def backends(conn: psycopg.Connection, app: str) -> set[int]:
    """The pids of the worker's backends: its connections carry application_name (PGAPPNAME)."""
    return {r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                                       (app,)).fetchall()}


def terminate(conn: psycopg.Connection, app: str) -> set[int]:
    """pg_terminate_backend on every backend of the worker; the pids it terminated."""
    # pids first: in one WHERE, pg_terminate_backend could run before the application_name test
    return {pid for pid in backends(conn, app)
            if conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]}


def test_client_survives_its_backends_being_terminated_mid_batch(reconnecting_language: str, url: str) -> None:
    """pg_terminate_backend on the worker's backends, twice, while its batch of three 2.5 s tasks
    runs (lease 6 s, a reaper running): it logs the loss, reconnects, reports the results it has
    with their leases, runs the rest of the batch with heartbeats, and goes on taking tasks."""
    language = reconnecting_language
    stage, app = f"terminated_{language}", f"skiplock-test-terminated-{language}"
    with psycopg.connect(url, autocommit=True) as conn:
        # The batch (3 × 2.5 s) outlives the lease (6 s): heartbeats keep it; a heartbeat every 2 s
        # leaves a reconnection 4 s on a loaded machine.
        ids = produce(language, url, stage, [{"n": n, "sleep": 2.5} for n in range(3)])
        reaper = Reaper(url)
        reaper.start()
        worker = ClientWorker(language, url, stage, BATCH=3, LEASE=6, IDLE_WAIT=0.5, PGAPPNAME=app)
        try:
            wait_until("the batch to be taken", lambda: conn.execute(
                "SELECT count(*) = 3 FROM queue.live_tasks WHERE stage = %s AND status = 'running'",
                (stage,)).fetchone()[0], 60, worker)
            assert terminate(conn, app), "no backend of the worker found to terminate"
            wait_until("the first task to be done", lambda: conn.execute(
                "SELECT count(*) >= 1 FROM queue.history WHERE stage = %s", (stage,)).fetchone()[0], 60, worker)
            assert terminate(conn, app), "the worker did not reconnect"  # again, mid-batch
            wait_until("the batch to be done", lambda: conn.execute(
                "SELECT count(*) = 3 FROM queue.history WHERE stage = %s", (stage,)).fetchone()[0], 60, worker)
            (later,) = conn.execute("SELECT queue.enqueue('{}', stage => %s)", (stage,)).fetchone()
            wait_until("a task enqueued afterwards to be done", lambda: conn.execute(
                "SELECT 1 FROM queue.history WHERE id = %s", (later,)).fetchone(), 60, worker)
            assert worker.proc.poll() is None, worker.log()
        finally:
            code = worker.stop()
            reaper.stop()
        assert code == 0, worker.log()
        rows = conn.execute("SELECT id, status::text, attempt FROM queue.history WHERE stage = %s ORDER BY id",
                            (stage,)).fetchall()
    assert rows == [(i, "done", 1) for i in [*ids, later]], f"each task done once, never retaken:\n{worker.log()}"
    assert reaper.reaped == 0, f"a lease ran out: heartbeats stopped after the reconnection:\n{worker.log()}"
    assert "connection lost" in worker.log(), worker.log()
    assert "Traceback" not in worker.log() and "Unhandled" not in worker.log(), worker.log()


def test_idle_client_reconnects_and_listens_again_after_its_backends_are_terminated(
        reconnecting_language: str, url: str) -> None:
    """Asleep on LISTEN (slow poll 30 s), its backends terminated: the worker reconnects, LISTENs
    again, and a task enqueued then is taken at once, not at the next poll."""
    language = reconnecting_language
    stage, app = f"idle_terminated_{language}", f"skiplock-test-idle-terminated-{language}"
    with psycopg.connect(url, autocommit=True) as conn:
        worker = ClientWorker(language, url, stage, IDLE_WAIT=30, PGAPPNAME=app)
        try:
            wait_until("the worker to connect", lambda: backends(conn, app), 60, worker)
            time.sleep(1.0)  # it found the stage empty and sleeps on LISTEN
            old = terminate(conn, app)
            assert old, "no backend of the worker found to terminate"
            wait_until("the worker to reconnect", lambda: len(backends(conn, app) - old) >= len(old), 60, worker)
            time.sleep(0.5)
            (task_id,) = conn.execute("SELECT queue.enqueue('{}', stage => %s)", (stage,)).fetchone()
            wait_until("the task to be done", lambda: conn.execute(
                "SELECT 1 FROM queue.history WHERE id = %s", (task_id,)).fetchone(), 5, worker)
            assert worker.proc.poll() is None, worker.log()
        finally:
            code = worker.stop()
        assert code == 0, worker.log()
    assert "connection lost" in worker.log(), worker.log()
    assert "Traceback" not in worker.log() and "Unhandled" not in worker.log(), worker.log()


@pytest.mark.parametrize("setting", ["BATCH=abc", "BATCH=0", "BATCH=1.5", "LEASE=-1", "IDLE_WAIT=soon", "CONCURRENCY=0"])
def test_client_rejects_a_bad_numeric_setting(reconnecting_language: str, url: str, setting: str) -> None:
    """A bad BATCH, LEASE, IDLE_WAIT or CONCURRENCY: a clear message naming it and exit 2, before any take."""
    name, value = setting.split("=")
    stage = f"bad_setting_{reconnecting_language}"
    proc = subprocess.run(LANGUAGES[reconnecting_language]["worker"], env=client_env(url, stage, **{name: value}),
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{name}=" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_node_package_tests(node_ready: None, url: str) -> None:
    """clients/node's own tests (node --test): full loop, heartbeat, lost lease, fail paths, wake-up."""
    env = dict(os.environ, SKIPLOCK_TEST_URL=as_uri(url))
    proc = subprocess.run(["npm", "test"], cwd=NODE_DIR, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"npm test failed:\n{proc.stdout}\n{proc.stderr}"


def test_client_wakes_on_notify(language: str, url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """An idle client worker (slow poll 30 s) takes a new task well within a second."""
    stage = f"wake_{language}"
    worker = ClientWorker(language, url, stage, IDLE_WAIT=30)
    latencies = []
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(5):
                time.sleep(1.0)  # the worker found the stage empty again and sleeps on LISTEN
                (task_id,) = conn.execute("SELECT queue.enqueue('{}', stage => %s)", (stage,)).fetchone()
                wait_until("the task to be done", lambda: conn.execute(
                    "SELECT 1 FROM queue.history WHERE id = %s", (task_id,)).fetchone(), 60, worker)
                # the server's clock at both ends: enqueue's and take_next's transaction starts
                latencies.append(conn.execute("SELECT extract(epoch FROM started - created)::float8"
                                              " FROM queue.history WHERE id = %s", (task_id,)).fetchone()[0])
    finally:
        code = worker.stop()
    assert code == 0, worker.log()
    with capsys.disabled():
        print(f"\n{language} client wake-up: median {statistics.median(latencies) * 1000:.0f} ms,"
              f" max {max(latencies) * 1000:.0f} ms ({len(latencies)} samples)")
    assert statistics.median(latencies) < 5.0, latencies  # milliseconds when quiet; the slow poll is 30 s


# -- the bash worker with several stages (issue 50 item 4) -----------------------------------------
def stage_logging_handler(tmp_path: Path) -> tuple[list[str], Path]:
    """The bash worker's command with a handler that appends TASK_ID, TASK_ATTEMPT and TASK_STAGE
    (last: it may hold a tab) to a file, then does what the example handler does with the payload; that file."""
    log = tmp_path / "handled.tsv"
    handler = tmp_path / "logging-handler.sh"
    handler.write_text("#!/usr/bin/env bash\npayload=$(cat)\n"
                       f"printf '%s\\t%s\\t%s\\n' \"$TASK_ID\" \"$TASK_ATTEMPT\" \"$TASK_STAGE\" >> '{log}'\n"
                       f"exec '{CLIENTS / 'bash' / 'example-handler.sh'}' <<< \"$payload\"\n")
    handler.chmod(0o755)
    return [str(CLIENTS / "bash" / "worker.sh"), str(handler)], log


def handled(log: Path) -> list[tuple[str, int, int]]:
    """(TASK_STAGE, TASK_ID, TASK_ATTEMPT) of each handler run, in order."""
    if not log.exists():
        return []
    return [(stage, int(task_id), int(attempt))
            for task_id, attempt, stage in (line.split("\t", 2) for line in log.read_text().splitlines())]


def bash_worker_waits(conn: psycopg.Connection, since: object) -> bool:
    """The bash worker is in wait_for_work: its listener's last query, begun after `since`, is the
    ping (drain_listener's last is SELECT 2) and no other psql session is open (no take)."""
    rows = conn.execute("SELECT query, query_start > %s FROM pg_stat_activity WHERE datname = current_database()"
                        " AND application_name = 'psql' AND pid <> pg_backend_pid()", (since,)).fetchall()
    return len(rows) == 1 and rows[0] == ("SELECT 1;", True)


def test_bash_worker_serves_several_stages(url: str, tmp_path: Path) -> None:
    """STAGE=x,y: one take (take_next(stages[])) serves both; each task is done exactly once, its
    handler sees its own stage in TASK_STAGE and its finish, fail and heartbeats name it (a wrong
    stage makes finish answer false and heartbeat raise SK001); an idle worker is woken by a NOTIFY
    on either stage, well within its 60 s slow poll."""
    x, y = "bash_multi.x", "bash_multi.y"
    command, log = stage_logging_handler(tmp_path)
    with psycopg.connect(url, autocommit=True) as conn:
        for stage in (x, y):
            conn.execute("SELECT queue.configure_stage(%s, backoff_base => interval '0', backoff_jitter => 0)", (stage,))
        stage_of, attempts = {}, {}
        for stage in (x, y):
            # n == 0 fails its first attempt (the fail names the stage); n == 1 works 3 s, past a
            # heartbeat (one every LEASE/3 = 2 s), so that the batch's heartbeats name both stages.
            payloads = [{"n": n, "fail_attempts": 1 if n == 0 else 0, **({"sleep": 3} if n == 1 else {})} for n in range(6)]
            for task_id, payload in zip(produce("bash", url, stage, payloads), payloads):
                stage_of[task_id], attempts[task_id] = stage, 2 if payload["fail_attempts"] else 1
        worker = ClientWorker("bash", url, f"{x}, {y}", command, BATCH=4, LEASE=6, IDLE_WAIT=60)
        try:
            wait_until("both stages to drain", lambda: live_count(conn, x) + live_count(conn, y) == 0, 120, worker)
            rows = conn.execute("SELECT id, stage, status::text, attempt FROM queue.history WHERE id = ANY(%s)",
                                (list(stage_of),)).fetchall()
            assert sorted(r[0] for r in rows) == sorted(stage_of), "every task ends exactly once:\n" + worker.log()
            assert sorted(rows) == sorted((i, stage_of[i], "done", attempts[i]) for i in stage_of), worker.log()
            runs = handled(log)
            assert sorted(runs) == sorted((stage_of[i], i, a) for i in stage_of for a in range(1, attempts[i] + 1)), \
                f"each run's TASK_STAGE is its task's stage:\n{runs}\n{worker.log()}"
            assert {stage for stage, _, _ in runs[:4]} == {x, y}, f"the first take served both stages: {runs}"
            # Idle: a task enqueued into either stage wakes the worker through its NOTIFY.
            for stage in (y, x):
                since = conn.execute("SELECT max(finished) FROM queue.history WHERE stage IN (%s, %s)", (x, y)).fetchone()[0]
                wait_until("the worker to wait", lambda: bash_worker_waits(conn, since), 60, worker)
                enqueued = time.monotonic()
                (task_id,) = conn.execute("SELECT queue.enqueue('{}', stage => %s)", (stage,)).fetchone()
                wait_until(f"the task enqueued into {stage} to be done", lambda: conn.execute(
                    "SELECT 1 FROM queue.history WHERE id = %s", (task_id,)).fetchone(), 45, worker)
                assert time.monotonic() - enqueued < 45
                assert handled(log)[-1] == (stage, task_id, 1), worker.log()
        finally:
            code = worker.stop()
    assert code == 0, worker.log()
    assert "lease lost" not in worker.log() and "SQLSTATE" not in worker.log(), worker.log()


def test_bash_worker_takes_several_stages_in_turn(url: str, tmp_path: Path) -> None:
    """BATCH=1, STAGE=x,y with a backlog in each: the round robin goes on from the last take's turn
    though each take is a new psql session (skiplock.turn carried over), so x and y alternate
    instead of x being drained first."""
    x, y = "bash_turns.x", "bash_turns.y"
    command, log = stage_logging_handler(tmp_path)
    with psycopg.connect(url, autocommit=True) as conn:
        ids = {stage: produce("bash", url, stage, [{"n": n} for n in range(3)]) for stage in (x, y)}
        worker = ClientWorker("bash", url, f"{x},{y}", command, BATCH=1, IDLE_WAIT=60)
        try:
            wait_until("both stages to drain", lambda: live_count(conn, x) + live_count(conn, y) == 0, 120, worker)
        finally:
            code = worker.stop()
    assert code == 0, worker.log()
    runs = handled(log)
    assert [stage for stage, _, _ in runs] == [x, y] * 3, f"{runs}\n{worker.log()}"
    assert [task_id for _, task_id, _ in runs] == [i for pair in zip(ids[x], ids[y]) for i in pair], runs


def test_bash_worker_serves_a_prefix(url: str, tmp_path: Path) -> None:
    """STAGE=prefix.*: the stages it finds are served, a name with a tab, a backslash and an é
    among them (the take sends each task's stage in hex); with a prefix alone there is no listener,
    the slow poll takes a task enqueued later."""
    stages = ["bash_pfx.a", "bash_pfx.t\tb\\\u00e9"]
    command, log = stage_logging_handler(tmp_path)
    with psycopg.connect(url, autocommit=True) as conn:
        stage_of = {conn.execute("SELECT queue.enqueue('{}', stage => %s)", (stage,)).fetchone()[0]: stage
                    for stage in stages * 2}
        worker = ClientWorker("bash", url, "bash_pfx.*", command, IDLE_WAIT=0.5)
        try:
            wait_until("the prefix's stages to drain", lambda: sum(live_count(conn, s) for s in stages) == 0, 120, worker)
            later = conn.execute("SELECT queue.enqueue('{}', stage => %s)", (stages[1],)).fetchone()[0]
            stage_of[later] = stages[1]
            wait_until("a task enqueued later to be done", lambda: conn.execute(
                "SELECT 1 FROM queue.history WHERE id = %s", (later,)).fetchone(), 60, worker)
            assert conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                " AND query LIKE 'LISTEN%%'").fetchone()[0] == 0, "a prefix alone has no listener"
            assert sorted(conn.execute("SELECT id, stage, status::text FROM queue.history WHERE id = ANY(%s)",
                                       (list(stage_of),)).fetchall()) == sorted((i, s, "done") for i, s in stage_of.items())
        finally:
            code = worker.stop()
    assert code == 0, worker.log()
    assert sorted(handled(log)) == sorted((s, i, 1) for i, s in stage_of.items()), worker.log()


def measure_wakeups(url: str, stage: str, samples: int, idle_wait: float) -> list[float]:
    """Seconds from each enqueue's commit until skiplock.worker.Worker, idle on the stage, took it."""
    taken: dict[int, float] = {}
    seen = threading.Condition()

    def handler(task: Task) -> None:
        with seen:
            taken[task.id] = time.monotonic()
            seen.notify_all()

    worker = Worker(url, {stage: handler}, idle_wait=idle_wait)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    latencies = []
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(samples):
                time.sleep(0.3)  # the worker has found the stage empty and sleeps on LISTEN
                (task_id,) = conn.execute("SELECT queue.enqueue('{}', stage => %s)", (stage,)).fetchone()
                committed = time.monotonic()  # autocommit: execute returned, the commit is done
                with seen:
                    assert seen.wait_for(lambda: task_id in taken, idle_wait + 60), "task never taken"
                latencies.append(taken[task_id] - committed)
    finally:
        worker.stop()
        thread.join(idle_wait + 60)
    return latencies


def test_wakeup_latency_with_notify(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """LISTEN/NOTIFY: an idle worker with a 5 s slow poll takes a new task within milliseconds."""
    latencies = measure_wakeups(url, "wake_notify", samples=10, idle_wait=5.0)
    median = statistics.median(latencies)
    with capsys.disabled():
        print(f"\nwake-up with NOTIFY: median {median * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms"
              f" ({len(latencies)} samples, slow poll 5 s)")
    assert median < 2.0, latencies  # milliseconds when quiet; without NOTIFY about 4.7 s (the slow poll)


def test_wakeup_falls_back_to_slow_poll_without_notify(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """notify => false: no NOTIFY is sent, yet the slow poll takes every task within its interval."""
    stage, idle_wait = "wake_poll", 1.5
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT queue.configure_stage(%s, notify => false)", (stage,))
        listener = psycopg.connect(url, autocommit=True)
        try:
            listener.execute(f'LISTEN "skiplock.{stage}"')
            # A worker waits (take_next found the stage empty): only the setting keeps enqueue quiet.
            assert conn.execute("SELECT count(*) FROM queue.take_next(%s)", (stage,)).fetchone()[0] == 0
            conn.execute("SELECT queue.enqueue('{}', stage => %s)", (stage,))
            assert list(listener.notifies(timeout=0.5)) == [], "enqueue notified a stage with notify off"
        finally:
            listener.close()
        conn.execute("DELETE FROM queue.live_tasks WHERE stage = %s", (stage,))
    latencies = measure_wakeups(url, stage, samples=4, idle_wait=idle_wait)
    with capsys.disabled():
        print(f"\nwake-up without NOTIFY: median {statistics.median(latencies) * 1000:.0f} ms,"
              f" max {max(latencies) * 1000:.0f} ms (slow poll {idle_wait} s)")
    assert max(latencies) < idle_wait + 1.0, latencies


def test_reference_worker_fails_the_attempt_whatever_the_handler_raises(url: str) -> None:
    """skiplock.worker.Worker (the demo's): a KeyError once escaped run(), leaving the rest of the
    batch running for its lease; an error text with NUL or a lone surrogate was refused."""
    stage = "ref_raises"
    raised = {0: KeyError("image"), 1: Fail("binary\0output"), 2: RuntimeError(os.fsdecode(b"caf\xe9.jpg"))}

    def handler(task: Task) -> None:
        raise raised[task.payload["n"]]

    with psycopg.connect(url, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute("SELECT queue.enqueue_batch(%s::jsonb[], stage => %s)",
                                          ([json.dumps({"n": n}) for n in raised], stage))]
        worker = Worker(url, {stage: handler}, batch=10, idle_wait=0.1)
        counters = worker.run(should_stop=lambda: worker.counters.taken >= len(ids))
        assert (counters.failed, counters.lost) == (3, 0)
        assert conn.execute("SELECT status::text, attempt, error_text FROM queue.tasks WHERE id = ANY(%s) ORDER BY id",
                            (ids,)).fetchall() == [("error", 1, "KeyError: 'image'"), ("error", 1, "binary\\0output"),
                                                   ("error", 1, "RuntimeError: caf\\udce9.jpg")]


def test_reference_worker_keeps_the_result_a_handler_returns(url: str) -> None:
    """skiplock.worker.Worker: Outcome(result=…) is the run's result in queue.history; with
    next_stage it is the payload the next stage's handler gets."""
    stage, nxt = "ref_result", "ref_result.next"
    seen: list[object] = []

    def first(task: Task) -> Outcome:
        return Outcome(next_stage=nxt if task.payload["n"] else None, result={"double": task.payload["n"] * 2})

    def second(task: Task) -> None:
        seen.append(task.payload)

    with psycopg.connect(url, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute("SELECT queue.enqueue_batch(ARRAY['{\"n\": 0}', '{\"n\": 4}']::jsonb[], stage => %s)",
                                          (stage,))]
        worker = Worker(url, {stage: first, nxt: second}, batch=10, idle_wait=0.1)
        worker.run(should_stop=lambda: worker.counters.finished >= 3)
        assert conn.execute("SELECT stage, status::text, result FROM queue.tasks WHERE id = ANY(%s) ORDER BY id, finished",
                            (ids,)).fetchall() == [(stage, "done", {"double": 0}), (stage, "done", {"double": 8}),
                                                   (nxt, "done", None)]
    assert seen == [{"double": 8}]


CRASHING_HANDLER = {
    # The reference worker with handle() replaced, as its header says to use it.
    "python": ("crash.py", """
import os, sys
sys.path.insert(0, sys.argv[1])
import worker
def handle(task_id, payload, attempt):
    raise RuntimeError("tool output: abc\\0def " + os.fsdecode(b"caf\\xe9.jpg"))
worker.handle = handle
sys.exit(worker.main())
"""),
    "node": ("crash.js", """
const { Worker } = require(process.argv[2] + '/worker.js');
const w = new Worker({ url: process.env.DATABASE_URL, stage: process.env.STAGE, idleWait: 0.2,
                       handler: async () => { throw new Error('tool output: abc\\u0000def'); } });
process.on('SIGTERM', () => w.stop());
w.run().then(() => process.exit(0), (err) => { console.error(err); process.exit(1); });
"""),
}


@pytest.mark.parametrize("lang", list(CRASHING_HANDLER))
def test_client_records_a_crash_whose_error_text_the_driver_refuses(lang: str, url: str, tmp_path: Path,
                                                                    request: pytest.FixtureRequest) -> None:
    """A handler's error quoting binary output (NUL; a lone surrogate in Python) once stopped the
    worker with its whole batch leased: now each attempt fails with the text made storable."""
    if lang == "node":
        request.getfixturevalue("node_ready")
    stage = f"crash_{lang}"
    name, source = CRASHING_HANDLER[lang]
    (tmp_path / name).write_text(source)
    command = [sys.executable] if lang == "python" else ["node"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT queue.configure_stage(%s, max_attempts => 1)", (stage,))
        ids = [r[0] for r in conn.execute("SELECT queue.enqueue_batch(%s::jsonb[], stage => %s)",
                                          (['{"n": 1}', '{"n": 2}', '{"n": 3}'], stage))]
        worker = ClientWorker(lang, url, stage, [*command, str(tmp_path / name), str(CLIENTS / lang)], IDLE_WAIT=0.2)
        try:
            wait_until("the batch to fail", lambda: live_count(conn, stage) == 0, 60, worker)
        finally:
            code = worker.stop()
        assert code == 0, worker.log()
        errors = conn.execute("SELECT status::text, attempt, error_text FROM queue.history WHERE id = ANY(%s)"
                              " ORDER BY id", (ids,)).fetchall()
    expected = ("RuntimeError: tool output: abc\\0def caf\\udce9.jpg" if lang == "python"
                else "Error: tool output: abc\\0def")
    assert [e[:2] for e in errors] == [("fatal", 1)] * 3, worker.log()
    assert all(e[2].startswith(expected) for e in errors), errors


# -- the clients' life under faults (issue 54 item 9, issue 50 item 5) ----------------------------
def fault_login(conn: psycopg.Connection, url: str, name: str, *settings: str) -> str:
    """A login that is a skiplock_worker, with these role settings; its URL."""
    conn.execute(f"DROP ROLE IF EXISTS {name}")
    conn.execute(f"CREATE ROLE {name} LOGIN IN ROLE skiplock_worker")
    for s in settings:
        conn.execute(f"ALTER ROLE {name} SET {s}")
    return psycopg.conninfo.make_conninfo(url, user=name)


def test_client_waits_out_a_share_lock_past_its_statement_timeout(reconnecting_language: str, url: str) -> None:
    """A DBA holds SHARE on queue.live_tasks for 5 s while the worker's login has statement_timeout
    = 1s: its takes, finishes and heartbeats time out (57014) and are tried again; none is lost,
    none runs twice, the worker goes on."""
    language = reconnecting_language
    stage = f"faults_share_{language}"
    with psycopg.connect(url, autocommit=True) as conn:
        w_url = fault_login(conn, url, f"faults_share_{language}", "statement_timeout = '1s'")
        ids = produce(language, url, stage, [{"sleep": 0.01} for _ in range(300)])
        worker = ClientWorker(language, w_url, stage, BATCH=5, LEASE=60, IDLE_WAIT=0.5, MAINTAIN_EVERY=0)
        try:
            wait_until("some tasks done", lambda: conn.execute(
                "SELECT count(*) >= 10 FROM queue.history WHERE stage = %s", (stage,)).fetchone()[0], 60, worker)
            with conn.transaction():
                conn.execute("LOCK TABLE queue.live_tasks IN SHARE MODE")
                time.sleep(5)
            wait_until("every task done", lambda: conn.execute(
                "SELECT count(*) = 300 FROM queue.history WHERE stage = %s", (stage,)).fetchone()[0], 120, worker)
        finally:
            code = worker.stop()
        rows = conn.execute("SELECT count(*), max(attempt) FROM queue.history WHERE stage = %s AND status = 'done'",
                            (stage,)).fetchone()
    assert code == 0, worker.log()
    assert rows == (len(ids), 1), worker.log()
    assert "statement timeout" in worker.log() and "retrying" in worker.log(), worker.log()


def test_client_retries_a_lock_timeout_against_compact(reconnecting_language: str, url: str) -> None:
    """lock_timeout = 10ms for the worker's login while an admin compacts (ACCESS EXCLUSIVE held
    0.2 s, every 0.5 s): 55P03 on a take, a heartbeat or a finish is tried again; every task done
    once, at attempt 1 (issue 54, item 9, as skiplock worker's test_a_lock_timeout_against_compact_is_retried)."""
    language = reconnecting_language
    stage = f"faults_compact_{language}"
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

    with psycopg.connect(url, autocommit=True) as conn:
        w_url = fault_login(conn, url, f"faults_compact_{language}", "lock_timeout = '10ms'")
        ids = produce(language, url, stage, [{"sleep": 0.01} for _ in range(300)])
        worker = ClientWorker(language, w_url, stage, BATCH=5, LEASE=60, IDLE_WAIT=0.5, MAINTAIN_EVERY=0)
        t = threading.Thread(target=compact, daemon=True)
        t.start()
        try:
            wait_until("every task done", lambda: conn.execute(
                "SELECT count(*) = 300 FROM queue.history WHERE stage = %s", (stage,)).fetchone()[0], 300, worker)
        finally:
            halt.set()
            t.join(60)
            code = worker.stop()
        rows = conn.execute("SELECT count(*), max(attempt) FROM queue.history WHERE stage = %s AND status = 'done'",
                            (stage,)).fetchone()
    assert code == 0, worker.log()
    assert compactions >= 2, compactions
    assert rows == (len(ids), 1), worker.log()
    assert "lock timeout" in worker.log() and "retrying" in worker.log(), worker.log()


def test_client_retries_a_finish_on_a_full_disk_while_the_lease_holds(reconnecting_language: str, url: str) -> None:
    """53100 on every finish of the stage for 4 s (a trigger raising the server's SQLSTATE on the
    history insert, as test_worker_faults.py's disk-full test does), then space again: the finishes
    are tried again while their leases hold; every task done once, at attempt 1 (issue 54, item 9)."""
    language = reconnecting_language
    stage = f"faults_disk_{language}"
    flag = f"faults_disk_{language}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS public.{flag} (is_full boolean)")
        conn.execute(f"TRUNCATE public.{flag}; INSERT INTO public.{flag} VALUES (false)")
        conn.execute(f"GRANT SELECT ON public.{flag} TO skiplock_owner")  # the trigger runs as finish's owner
        conn.execute(f"""
            CREATE OR REPLACE FUNCTION public.{flag}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF (SELECT d.is_full FROM public.{flag} d) AND NEW.stage = '{stage}' THEN
                    RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = '53100';
                END IF;
                RETURN NEW;
            END $$""")
        conn.execute(f"DROP TRIGGER IF EXISTS {flag} ON queue.history")
        conn.execute(f"CREATE TRIGGER {flag} BEFORE INSERT ON queue.history FOR EACH ROW EXECUTE FUNCTION public.{flag}()")
        try:
            ids = produce(language, url, stage, [{"sleep": 0.01} for _ in range(300)])
            worker = ClientWorker(language, url, stage, BATCH=5, LEASE=60, IDLE_WAIT=0.5, MAINTAIN_EVERY=0)
            try:
                wait_until("some tasks done", lambda: conn.execute(
                    "SELECT count(*) >= 20 FROM queue.history WHERE stage = %s", (stage,)).fetchone()[0], 60, worker)
                conn.execute(f"UPDATE public.{flag} SET is_full = true")
                time.sleep(4)
                conn.execute(f"UPDATE public.{flag} SET is_full = false")
                wait_until("every task done", lambda: conn.execute(
                    "SELECT count(*) = 300 FROM queue.history WHERE stage = %s", (stage,)).fetchone()[0], 120, worker)
            finally:
                code = worker.stop()
        finally:
            conn.execute(f"DROP TRIGGER IF EXISTS {flag} ON queue.history")
        rows = conn.execute("SELECT count(*), max(attempt) FROM queue.history WHERE stage = %s AND status = 'done'",
                            (stage,)).fetchone()
    assert code == 0, worker.log()
    assert rows == (len(ids), 1), worker.log()
    assert "No space left on device" in worker.log() and "retrying" in worker.log(), worker.log()


def test_client_ends_in_one_line_on_a_revoked_grant(reconnecting_language: str, url: str) -> None:
    language = reconnecting_language
    with psycopg.connect(url, autocommit=True) as conn:
        w_url = fault_login(conn, url, f"faults_revoked_{language}")
        conn.execute(f"REVOKE skiplock_worker FROM faults_revoked_{language}")
    worker = ClientWorker(language, w_url, f"faults_revoked_{language}", MAINTAIN_EVERY=0)
    code = worker.proc.wait(60)
    worker.reader.join(10)
    assert code == 1, worker.log()
    assert "permission denied" in worker.log() and "waiting does not cure this" in worker.log(), worker.log()
    assert "Traceback" not in worker.log(), worker.log()


def test_client_maintains_the_queue_so_a_killed_workers_task_comes_back(reconnecting_language: str, url: str) -> None:
    """No `skiplock maintain` runs: worker B's own maintenance reaps the lease of worker A, killed
    with -9, and B runs the task (within the lease and a round of maintenance)."""
    language = reconnecting_language
    stage = f"faults_kill9_{language}"
    lease, every = 3, 1
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT queue.configure_stage(%s, backoff_base => '0')", (stage,))  # due again once reaped
        (task,) = produce(language, url, stage, [{"sleep": 600}])
        a = ClientWorker(language, url, stage, BATCH=1, LEASE=lease, IDLE_WAIT=0.5, MAINTAIN_EVERY=every)
        b = None
        try:
            wait_until("A to take the task", lambda: conn.execute(
                "SELECT worker FROM queue.live_tasks WHERE id = %s AND status = 'running'", (task,)).fetchone(), 60, a)
            b = ClientWorker(language, url, stage, BATCH=1, LEASE=lease, IDLE_WAIT=0.5, MAINTAIN_EVERY=every)
            time.sleep(1)
            a.proc.kill()
            a.proc.wait(30)
            killed = time.monotonic()
            wait_until("B to run the task", lambda: conn.execute(
                "SELECT worker FROM queue.live_tasks WHERE id = %s AND status = 'running'",
                (task,)).fetchone() == (f"{socket.gethostname()}:{b.proc.pid}",), 120, b)
            took = time.monotonic() - killed
        finally:
            if b is not None:
                b.proc.kill()
                b.proc.wait()
            a.proc.kill()
    assert took < lease + every + 20, took



def test_client_fails_a_handler_past_the_stages_task_timeout(reconnecting_language: str, url: str) -> None:
    """configure_stage(task_timeout => 1 s): a handler still running is failed "timed out", and
    the worker goes on to the next task."""
    language = reconnecting_language
    stage = f"faults_timeout_{language}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT queue.configure_stage(%s, max_attempts => 1, task_timeout => '1 second')", (stage,))
        hung, quick = produce(language, url, stage, [{"sleep": 600}, {}])
        worker = ClientWorker(language, url, stage, BATCH=1, LEASE=30, IDLE_WAIT=0.5, MAINTAIN_EVERY=0)
        try:
            wait_until("both tasks to end", lambda: conn.execute(
                "SELECT count(*) = 2 FROM queue.history WHERE stage = %s", (stage,)).fetchone()[0], 90, worker)
        finally:
            worker.stop()
        rows = dict(conn.execute("SELECT id, status::text || ': ' || coalesce(error_text, '') FROM queue.history "
                                 "WHERE stage = %s", (stage,)).fetchall())
    assert rows[hung].startswith("fatal: ") and "timed out after 1 s" in rows[hung], (rows, worker.log())
    assert rows[quick] == "done: ", (rows, worker.log())


@pytest.mark.parametrize("producer", ["python", "node", "bash"])
def test_producer_gives_up_on_a_server_that_never_answers(producer: str, request: pytest.FixtureRequest,
                                                          silent_server: tuple[int, list[socket.socket]]) -> None:
    """A server that accepts connections and never answers: with no PGCONNECT_TIMEOUT and no
    connect_timeout in the URL, each producer gives up after 10 s and says so on one line (exit 1;
    2 from psql), within the 60 s this test gives it (psycopg alone waits 130 s, node-postgres and
    psql for ever)."""
    if producer == "node":
        request.getfixturevalue("node_ready")
    port, held = silent_server
    env = client_env(f"host=127.0.0.1 port={port} dbname=nothing user=nobody sslmode=disable", "faults_hang")
    env.pop("PGCONNECT_TIMEOUT", None)
    proc = subprocess.run(LANGUAGES[producer]["producer"], env=env, input='{"n": 1}\n',
                          capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode in (1, 2) and len(lines) == 1 and "timeout" in lines[0], (proc.returncode, proc.stderr)
    assert held, "no connection attempt reached the server"


def test_client_times_out_a_connection_attempt_that_hangs(reconnecting_language: str,
                                                          silent_server: tuple[int, list[socket.socket]]) -> None:
    """A server that accepts connections and never answers: each attempt ends at the connect
    timeout (PGCONNECT_TIMEOUT here; 10 s by default, where the URL and the environment set none)
    and is retried, said in the worker's log; SIGTERM then ends the worker, exit 1. Without a
    timeout of its own node-postgres waited on the first attempt for ever, and Python 130 s."""
    port, held = silent_server
    hole = f"host=127.0.0.1 port={port} dbname=nothing user=nobody sslmode=disable"
    worker = ClientWorker(reconnecting_language, hole, "faults_hang", MAINTAIN_EVERY=0, PGCONNECT_TIMEOUT=1)
    deadline = time.monotonic() + 60
    while len(held) < 3 and worker.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(held) >= 3, f"{len(held)} connection attempt(s) in 60 s:\n{worker.log()}"
    assert worker.stop() == 1, worker.log()
    assert "timeout" in worker.log().lower() and "retrying" in worker.log(), worker.log()
    assert "Traceback" not in worker.log(), worker.log()
