"""skiplock behind PgBouncer (Debian's pgbouncer), in transaction and in session pooling mode.

The test starts pgbouncer itself on a port of its own in front of the test server, with a pool of
2 server connections in transaction mode and many more clients. Through it: the API (enqueue,
batches, take_next + finish/fail, finish_and_take, take_locked + finish_locked inside BEGIN …
COMMIT), the CLI (worker, enqueue, maintain, stats) and the three reference clients, each with
SKIPLOCK_POOLER=transaction (no server-side prepares, poll instead of LISTEN). Every task ends
exactly once, and claim order holds while claim hints travel between clients with the server
connections. Without the setting psycopg's prepared statements break, as the issue saw.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import psycopg
import pytest

from dev.testrun import create_database, drop_database
from skiplock import connect, migrate

sys.path.insert(0, str(Path(__file__).parent))
from test_clients import LANGUAGES, ClientWorker, node_ready, produce, wait_until  # noqa: E402,F401

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
TRANSACTION_POOL = 2      # server connections per database and user, in transaction mode
SESSION_POOL = 30         # in session mode a client holds one for its whole life
SKIPLOCK = [sys.executable, "-m", "skiplock"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Bouncer:
    """pgbouncer in front of the server of `server_url`; as root it switches to the postgres OS
    user (-u: pgbouncer refuses to run as root), like the test cluster."""

    def __init__(self, server_url: str, mode: str, pool_size: int) -> None:
        info = psycopg.conninfo.conninfo_to_dict(server_url)
        self.user = str(info.get("user") or "postgres")
        self.mode = mode
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"skiplock-bouncer-{mode}-", dir="/tmp"))
        (self.dir / "userlist.txt").write_text(f'"{self.user}" ""\n')
        (self.dir / "pgbouncer.ini").write_text(f"""\
[databases]
* = host={info.get('host') or '127.0.0.1'} port={info.get('port') or 5432}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir}/userlist.txt
pool_mode = {mode}
default_pool_size = {pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
max_db_connections = {pool_size}
server_reset_query = DISCARD ALL
ignore_startup_parameters = extra_float_digits,options
logfile = {self.dir}/pgbouncer.log
pidfile = {self.dir}/pgbouncer.pid
admin_users = {self.user}
""")
        cmd = [PGBOUNCER, str(self.dir / "pgbouncer.ini")]
        if os.geteuid() == 0:  # its own -u, not runuser: the signals of stop() must reach pgbouncer itself
            pw = pwd.getpwnam("postgres")
            for p in (self.dir, *self.dir.iterdir()):
                os.chown(p, pw.pw_uid, pw.pw_gid)
            cmd = [PGBOUNCER, "-u", "postgres", str(self.dir / "pgbouncer.ini")]
        self.proc = subprocess.Popen(cmd, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not start:\n{self.proc.stdout.read()}\n{self.log()}")
                time.sleep(0.05)

    def url(self, dbname: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)   # immediate shutdown (SIGINT waits for the clients)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def direct(admin_url: str) -> Iterator[str]:
    """A database built by the migrations, reached directly (for setup and checks)."""
    db = create_database(admin_url, "test_pgbouncer")
    try:
        migrate.upgrade(db)
        yield db
    finally:
        drop_database(admin_url, db)


@pytest.fixture(scope="module")
def bouncers(direct: str) -> Iterator[dict[str, Bouncer]]:
    started: dict[str, Bouncer] = {}
    try:
        started["transaction"] = Bouncer(direct, "transaction", TRANSACTION_POOL)
        started["session"] = Bouncer(direct, "session", SESSION_POOL)
        yield started
    finally:
        for b in started.values():
            b.stop()


def pooled_url(bouncers: dict[str, Bouncer], mode: str, direct: str) -> str:
    return bouncers[mode].url(psycopg.conninfo.conninfo_to_dict(direct)["dbname"])


def pooled_connect(url: str, mode: str) -> psycopg.Connection:
    """What skiplock.connect does for SKIPLOCK_POOLER=mode."""
    return psycopg.connect(url, autocommit=True, prepare_threshold=None if mode == "transaction" else 5)


def configure(direct: str, stage: str) -> None:
    with psycopg.connect(direct, autocommit=True) as conn:
        conn.execute("SELECT queue.configure_stage(%s, backoff_base => interval '0', backoff_jitter => 0,"
                      " max_attempts => 5)", (stage,))


def history(direct: str, stage: str) -> list[tuple]:
    with psycopg.connect(direct, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM queue.live_tasks WHERE stage = %s", (stage,)).fetchone()[0] == 0
        return conn.execute("SELECT id, status::text, attempt FROM queue.history WHERE stage = %s ORDER BY id",
                            (stage,)).fetchall()


# -- the failure the issue reported, and that the setting removes ------------------------------------

def test_statements_are_prepared_under_names_of_the_connections_own(bouncers: dict[str, Bouncer], direct: str) -> None:
    """psycopg names what it prepares _pg3_0, _pg3_1, … on every connection. skiplock's connections
    start at a random number, so that through a pooler in transaction mode nobody announced, a name
    of ours never meets another client's statement on a server connection (which would run their
    statement with our parameters: a wrong answer, not an error). Two clients that prepare a
    statement each of the same shape through the pooler get only right answers."""
    def own(url: str) -> psycopg.Connection:   # what skiplock.connect and the worker library open
        return connect.unique_statement_names(psycopg.connect(url, autocommit=True))

    names = []
    for _ in range(2):
        with own(direct) as conn:
            for n in range(6):
                conn.execute("SELECT %s::int + 1", (n,)).fetchone()
            names += [r[0] for r in conn.execute("SELECT name FROM pg_catalog.pg_prepared_statements")]
    assert len(names) == 2 and len(set(names)) == 2 and "_pg3_0" not in names, names
    url = pooled_url(bouncers, "transaction", direct)
    wrong, errors = [], []
    with own(url) as a, own(url) as b:
        for n in range(40):
            for conn, add in ((a, 1), (b, 2)):
                try:
                    got = conn.execute(f"SELECT %s::int + {add}", (n,)).fetchone()
                    if got != (n + add,):
                        wrong.append((n, add, got))
                except psycopg.Error as e:
                    errors.append(e.sqlstate)
    assert not wrong, wrong
    assert set(errors) <= {"26000", "42P05"}, errors   # what the worker takes for a pooler (prepared_lost)


def test_prepared_statements_break_through_transaction_pooling(bouncers: dict[str, Bouncer], direct: str) -> None:
    """Two psycopg clients with default settings: the sixth run of a statement prepares it on a
    server connection the other client then uses. prepare_threshold=None (SKIPLOCK_POOLER=
    transaction) runs the same loop cleanly."""
    url = pooled_url(bouncers, "transaction", direct)
    errors: list[str] = []
    with psycopg.connect(url, autocommit=True) as a, psycopg.connect(url, autocommit=True) as b:
        for n in range(20):
            for conn, query in ((a, "SELECT %s::int + 1"), (b, "SELECT %s::int + 2")):
                try:
                    conn.execute(query, (n,)).fetchone()
                except psycopg.Error as e:
                    errors.append(str(e))
    assert any("prepared statement" in e for e in errors), errors
    with pooled_connect(url, "transaction") as a, pooled_connect(url, "transaction") as b:
        for n in range(20):
            assert a.execute("SELECT %s::int + 1", (n,)).fetchone() == (n + 1,)
            assert b.execute("SELECT %s::int + 2", (n,)).fetchone() == (n + 2,)


# -- the API from many more clients than server connections ------------------------------------------

def _loop_take_finish(conn: psycopg.Connection, stage: str, done: list[int]) -> bool:
    rows = conn.execute("SELECT id, lease, payload, attempt FROM queue.take_next(stage => %s, batch => 3)",
                        (stage,)).fetchall()
    for task_id, lease, payload, attempt in rows:
        if payload.get("fail") and attempt == 1:
            assert conn.execute("SELECT queue.fail(%s, %s, 'once')", (task_id, lease)).fetchone()[0]
        elif conn.execute("SELECT queue.finish(%s, %s)", (task_id, lease)).fetchone()[0]:
            done.append(task_id)
    return bool(rows)


def _loop_finish_and_take(conn: psycopg.Connection, stage: str, done: list[int]) -> bool:
    row = conn.execute("SELECT id, lease FROM queue.take_next(stage => %s)", (stage,)).fetchone()
    if row is None:
        return False
    while row is not None:
        rows = conn.execute("SELECT finished, id, lease FROM queue.finish_and_take(%s, %s, %s)",
                            (row[0], row[1], stage)).fetchall()
        if rows[0][0]:
            done.append(row[0])
        row = rows[0][1:] if rows[0][1] is not None else None
    return True


def _loop_take_locked(conn: psycopg.Connection, stage: str, done: list[int]) -> bool:
    with conn.transaction():
        rows = conn.execute("SELECT id FROM queue.take_locked(%s, 2)", (stage,)).fetchall()
        finished = [r[0] for r in rows if conn.execute("SELECT queue.finish_locked(%s)", (r[0],)).fetchone()[0]]
    done.extend(finished)   # committed: only now are they done
    return bool(rows)


LOOPS: list[Callable[[psycopg.Connection, str, list[int]], bool]] = [_loop_take_finish, _loop_finish_and_take,
                                                                     _loop_take_locked]


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_api_with_many_clients(bouncers: dict[str, Bouncer], direct: str, mode: str) -> None:
    """18 worker clients and 4 producers over 2 server connections (transaction mode): every task
    ends exactly once, whichever loop took it."""
    stage = f"api_{mode}"
    configure(direct, stage)
    url = pooled_url(bouncers, mode, direct)
    ids: list[int] = []
    done: list[int] = []
    errors: list[BaseException] = []
    producing = threading.Event()
    producing.set()
    lock = threading.Lock()

    def producer(n: int) -> None:
        try:
            with pooled_connect(url, mode) as conn:
                for k in range(25):
                    new = [conn.execute("SELECT queue.enqueue(%s::jsonb, %s)",
                                        ('{"fail": %s}' % ("true" if k % 7 == 0 else "false"), stage)).fetchone()[0]]
                    new += [r[0] for r in conn.execute(
                        "SELECT queue.enqueue_batch(ARRAY['{}', '{}', '{}']::jsonb[], %s)", (stage,)).fetchall()]
                    with lock:
                        ids.extend(new)
        except BaseException as e:
            errors.append(e)

    def worker(n: int) -> None:
        mine: list[int] = []
        try:
            with pooled_connect(url, mode) as conn:
                loop = LOOPS[n % len(LOOPS)]
                idle_since = None
                while True:
                    if loop(conn, stage, mine):
                        idle_since = None
                    elif producing.is_set():
                        time.sleep(0.02)
                    elif idle_since is None:
                        idle_since = time.monotonic()
                    elif time.monotonic() - idle_since > 1.0:
                        return
                    else:
                        time.sleep(0.05)
        except BaseException as e:
            errors.append(e)
        finally:
            with lock:
                done.extend(mine)

    producers = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
    workers = [threading.Thread(target=worker, args=(n,)) for n in range(18)]
    for t in producers + workers:
        t.start()
    for t in producers:
        t.join(120)
    producing.clear()
    for t in workers:
        t.join(120)
    assert not errors, errors[:3]
    assert len(ids) == 4 * 25 * 4 == len(set(ids))
    assert sorted(done) == sorted(ids), "every task finished once, by exactly one client"
    rows = history(direct, stage)
    assert [r[0] for r in rows] == sorted(ids)
    assert {r[1] for r in rows} == {"done"}


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_claim_order_across_clients(bouncers: dict[str, Bouncer], direct: str, mode: str) -> None:
    """Takes from several clients in turn, two stages interleaved: the claim hint one client's
    take leaves on a server connection is seen by the next client's, and the order is exact
    (priority, run_at, id), as the README promises for takes that do not race."""
    url = pooled_url(bouncers, mode, direct)
    stages = [f"order_{mode}_a", f"order_{mode}_b"]
    expected: dict[str, list[int]] = {}
    with psycopg.connect(direct, autocommit=True) as conn:
        for s in stages:
            rows = conn.execute(
                "SELECT queue.enqueue(jsonb_build_object('n', n), %s, priority => (n * 7) %% 5) "
                "  FROM generate_series(1, 40) n", (s,)).fetchall()
            expected[s] = [r[0] for r in conn.execute(
                "SELECT id FROM queue.live_tasks WHERE stage = %s ORDER BY priority, run_at, id", (s,))]
            assert len(rows) == 40
    clients = [pooled_connect(url, mode) for _ in range(5)]
    taken: dict[str, list[int]] = {s: [] for s in stages}
    try:
        for n in range(80):
            s = stages[n % 2]
            conn = clients[n % len(clients)]
            row = conn.execute("SELECT id, lease FROM queue.take_next(%s)", (s,)).fetchone()
            taken[s].append(row[0])
            assert conn.execute("SELECT queue.finish(%s, %s)", row).fetchone()[0]
            if n == 40:  # a higher-priority task lands behind every hint: taken next, by anyone
                with psycopg.connect(direct, autocommit=True) as d:
                    urgent = d.execute("SELECT queue.enqueue('{}', %s, priority => -1)", (stages[1],)).fetchone()[0]
                expected[stages[1]].insert(20, urgent)
        s = stages[1]
        taken[s].append(clients[0].execute("SELECT id FROM queue.take_next(%s)", (s,)).fetchone()[0])
    finally:
        for c in clients:
            c.close()
    assert taken == expected


# -- the command line --------------------------------------------------------------------------------

def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*SKIPLOCK, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_cli_worker_through_the_pooler(bouncers: dict[str, Bouncer], direct: str, mode: str) -> None:
    """150 tasks, 6 slots over 2 server connections: all done once (the issue saw 21 of 300 in
    60 s and 'prepared statement "_pg3_1" already exists'). enqueue, stats and maintain too."""
    stage = f"cli_{mode}"
    url = pooled_url(bouncers, mode, direct)
    configure(direct, stage)
    payloads = "".join('{"n": %d}\n' % n for n in range(150))
    proc = subprocess.run([*SKIPLOCK, "--pooler", mode, "enqueue", "--db", url, "--stage", stage, "--batch", "7"],
                          input=payloads, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("--pooler", mode, "worker", "--db", url, "--stage", stage, "-c", "6", "--until-empty",
                   "--quiet", "--", "sh", "-c", "cat > /dev/null")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "prepared statement" not in proc.stderr
    rows = history(direct, stage)
    assert len(rows) == 150 and {r[1:] for r in rows} == {("done", 1)}
    for _ in range(2):  # run twice: a repeated statement would be prepared by default
        proc = run_cli("--pooler", mode, "stats", "--db", url, "--stage", stage)
        assert proc.returncode == 0 and "queue.stats" in proc.stdout, proc.stderr
    proc = run_cli("maintain", "--db", url, "--every", "0.05", "--once", env={"SKIPLOCK_POOLER": mode})
    assert proc.returncode == 0, proc.stderr


def test_cli_worker_polls_through_transaction_pooling(bouncers: dict[str, Bouncer], direct: str) -> None:
    """An idle worker does not LISTEN through a transaction pooler: a task enqueued while it
    sleeps is taken at the next poll."""
    stage = "cli_poll"
    url = pooled_url(bouncers, "transaction", direct)
    proc = subprocess.Popen([*SKIPLOCK, "worker", "--db", url, "--stage", stage, "--poll", "0.3", "--", "true"],
                            env={**os.environ, "SKIPLOCK_POOLER": "transaction"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(1.5)   # idle, polling
        with psycopg.connect(direct, autocommit=True) as conn:
            conn.execute("SELECT queue.enqueue('{}', %s)", (stage,))
            deadline = time.monotonic() + 20
            while conn.execute("SELECT count(*) FROM queue.history WHERE stage = %s", (stage,)).fetchone()[0] < 1:
                assert proc.poll() is None and time.monotonic() < deadline, "the worker did not take the task"
                time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "prepared statement" not in out


def test_run_sql_refuses_transaction_pooling(bouncers: dict[str, Bouncer], direct: str) -> None:
    """run-sql runs requests on its session and cancels them by backend pid: it needs a session."""
    url = pooled_url(bouncers, "transaction", direct)
    proc = run_cli("--pooler", "transaction", "run-sql", "--db", url, "--stage", "sql")
    assert proc.returncode == 2
    assert "needs a session" in proc.stderr


def test_a_bad_pooler_setting_is_refused() -> None:
    proc = run_cli("stats", env={"SKIPLOCK_POOLER": "statement", "DATABASE_URL": "postgresql:///nowhere"})
    assert proc.returncode == 2 and "SKIPLOCK_POOLER" in proc.stderr


# -- the reference clients ---------------------------------------------------------------------------

@pytest.fixture(params=list(LANGUAGES))
def language(request: pytest.FixtureRequest) -> str:
    if request.param == "node":
        request.getfixturevalue("node_ready")
    return request.param


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_client_through_the_pooler(language: str, mode: str, bouncers: dict[str, Bouncer], direct: str) -> None:
    """Two workers of a language drain what its producer enqueued while they were idle (so they
    must poll, or be woken by NOTIFY in session mode); SIGTERM ends them with 0; every task once."""
    stage = f"client_{language}_{mode}"
    url = pooled_url(bouncers, mode, direct)
    configure(direct, stage)
    settings = {"BATCH": 3, "LEASE": 30, "IDLE_WAIT": 0.5, "SKIPLOCK_POOLER": mode}
    workers = [ClientWorker(language, url, stage, **settings) for _ in range(2)]
    try:
        time.sleep(1.0)  # idle: the tasks come after
        payloads = [{"n": n, "fail_attempts": 1 if n % 6 == 0 else 0} for n in range(30)]
        ids = []
        for k in range(0, 30, 10):   # several producer runs: each repeats its statements
            ids += produce(language, url, stage, payloads[k:k + 10])
        with psycopg.connect(direct, autocommit=True) as conn:
            wait_until("the stage to drain", lambda: conn.execute(
                "SELECT count(*) FROM queue.live_tasks WHERE stage = %s", (stage,)).fetchone()[0] == 0
                       and conn.execute("SELECT count(*) FROM queue.history WHERE stage = %s",
                                        (stage,)).fetchone()[0] == 30, 90, workers[0])
    finally:
        codes = [w.stop() for w in workers]
    logs = "\n".join(w.log() for w in workers)
    assert codes == [0, 0], logs
    assert "prepared statement" not in logs
    rows = history(direct, stage)
    assert [r[0] for r in rows] == sorted(ids), logs
    assert all(r[1] == "done" and r[2] == (2 if ids.index(r[0]) % 6 == 0 else 1) for r in rows), (rows, logs)


# -- a transaction pooler nobody announced (issue 54 item 8) -----------------------------------------
def _env_without_pooler() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SKIPLOCK_POOLER", None)
    return env


def test_cli_worker_finds_the_transaction_pooler_by_itself(bouncers: dict[str, Bouncer], direct: str) -> None:
    """2,000 tasks through PgBouncer in transaction mode, no --pooler: the first statement psycopg
    prepared goes missing on another server connection (26000, or 42P05); the worker says so once,
    goes on unprepared and polling, and every task is done once (the issue saw 21 of 300)."""
    stage = "cli_unannounced"
    url = pooled_url(bouncers, "transaction", direct)
    configure(direct, stage)
    with psycopg.connect(direct, autocommit=True) as conn:
        conn.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[2000]), %s)", (stage,))
    proc = subprocess.run([*SKIPLOCK, "worker", "--db", url, "--stage", stage, "-c", "4", "--until-empty",
                           "--quiet", "--", "true"],
                          capture_output=True, text=True, timeout=900, env=_env_without_pooler())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("a pooler in transaction mode?") == 1, proc.stderr[-3000:]
    rows = history(direct, stage)
    assert len(rows) == 2000 and {r[1:] for r in rows} == {("done", 1)}


@pytest.mark.parametrize("lang", ["python", "python_async", "node"])
def test_client_finds_the_transaction_pooler_by_itself(lang: str, bouncers: dict[str, Bouncer], direct: str,
                                                       request: pytest.FixtureRequest) -> None:
    """The same for the Python and Node clients (300 tasks, two workers): no task lost or done twice."""
    if lang == "node":
        request.getfixturevalue("node_ready")
    stage = f"client_unannounced_{lang}"
    url = pooled_url(bouncers, "transaction", direct)
    configure(direct, stage)
    with psycopg.connect(direct, autocommit=True) as conn:
        conn.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[300]), %s)", (stage,))
    settings = {"BATCH": 3, "LEASE": 30, "IDLE_WAIT": 0.5, "MAINTAIN_EVERY": 0}
    env_pooler = os.environ.pop("SKIPLOCK_POOLER", None)
    try:
        workers = [ClientWorker(lang, url, stage, **settings) for _ in range(2)]
    finally:
        if env_pooler is not None:
            os.environ["SKIPLOCK_POOLER"] = env_pooler
    try:
        with psycopg.connect(direct, autocommit=True) as conn:
            wait_until("the stage to drain", lambda: conn.execute(
                "SELECT count(*) FROM queue.history WHERE stage = %s", (stage,)).fetchone()[0] == 300, 300, workers[0])
    finally:
        codes = [w.stop() for w in workers]
    logs = "\n".join(w.log() for w in workers)
    assert codes == [0, 0], logs
    rows = history(direct, stage)
    assert len(rows) == 300 and {r[1:] for r in rows} == {("done", 1)}, logs
    assert "Traceback" not in logs, logs


def test_async_worker_finds_the_transaction_pooler_by_itself(bouncers: dict[str, Bouncer], direct: str,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """AsyncWorker (asyncio, AsyncConnection) through PgBouncer in transaction mode, no pooler
    setting, 2,000 tasks: a statement it prepared goes missing; it says so once, goes on unprepared
    and polling, and every task is done once."""
    import asyncio
    import logging

    from skiplock.worker import AsyncWorker
    stage = "async_unannounced"
    url = pooled_url(bouncers, "transaction", direct)
    configure(direct, stage)
    with psycopg.connect(direct, autocommit=True) as conn:
        conn.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[2000]), %s)", (stage,))
    caplog.set_level(logging.WARNING, logger="skiplock.worker")

    threads: set[str] = set()   # the worker's own (Worker names them skiplock-*): none in AsyncWorker

    async def handler(task: object) -> None:
        threads.update(t.name for t in threading.enumerate() if t.name.startswith("skiplock"))
        await asyncio.sleep(0)

    worker = AsyncWorker(url, {stage: handler}, batch=10, concurrency=4, until_empty=True, idle_wait=0.5)
    counters = asyncio.run(asyncio.wait_for(worker.run(), 600))
    assert counters.finished == 2000, (counters, caplog.text[-3000:])
    assert caplog.text.count("a pooler in transaction mode?") == 1, caplog.text[-3000:]
    rows = history(direct, stage)
    assert len(rows) == 2000 and {r[1:] for r in rows} == {("done", 1)}
    assert threads == set(), threads
