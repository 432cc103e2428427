"""skiplock.worker.AsyncWorker: the worker loop on psycopg's AsyncConnection in the caller's event
loop (issue 52 item 1). The rules are Worker's (written once in skiplock/worker.py); these tests
run the asyncio I/O through what matters of the library's: results, progress and several stages,
async handlers overlapping in time with no thread of the worker's own, transactional mode, the
shutdown timeout, a refused login, task_timeout, until_empty, and a server restart mid-task. The
faults shared with the reference clients (kill -9, terminated backends, PgBouncer) run the
reference client on AsyncWorker (ASYNCIO=1, "python_async" in test_clients.py and
test_pgbouncer.py).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import psycopg
import psycopg.conninfo
import pytest

from skiplock import devdb, migrate
from skiplock.worker import AsyncWorker, Fail, Outcome, Refused, Task


@pytest.fixture(scope="module")
def url(db: str) -> str:
    """The module's database (conftest's db); conftest's conn connects to it."""
    return db


def enqueue(conn: psycopg.Connection, stage: str, payloads: list[dict]) -> list[int]:
    return [r[0] for r in conn.execute("SELECT queue.enqueue_batch(%s::jsonb[], stage => %s)",
                                       ([psycopg.types.json.Jsonb(p) for p in payloads], stage)).fetchall()]


def run(worker: AsyncWorker, timeout: float = 120, **kwargs: Any) -> Any:
    """await worker.run(**kwargs) in a new event loop, bounded against hangs."""
    async def main() -> Any:
        return await asyncio.wait_for(worker.run(**kwargs), timeout)
    return asyncio.run(main())


def worker_threads() -> list[str]:
    """The threads of a worker of our own: Worker names them skiplock-*."""
    return [t.name for t in threading.enumerate() if t.name.startswith("skiplock")]


def test_async_worker_results_progress_and_several_stages_on_the_callers_loop(url: str, conn: psycopg.Connection) -> None:
    """Two stages in one AsyncWorker: the first moves its task on with a result (Outcome), the
    second stores progress (awaited) and returns a result; both handlers run on the caller's loop,
    and while they run no thread of the worker's exists (the loop is asyncio, not threads)."""
    ids = enqueue(conn, "aw.first", [{"n": 1}, {"n": 2}])
    seen: dict[str, Any] = {"loops": [], "threads": [], "progress": []}

    async def main() -> AsyncWorker:
        loop = asyncio.get_running_loop()
        worker = AsyncWorker(url, batch=5, concurrency=2, idle_wait=0.2, maintain_every=0)

        @worker.handler("aw.first")
        async def first(task: Task) -> Outcome:
            seen["loops"].append(asyncio.get_running_loop() is loop)
            seen["threads"].append(worker_threads())
            return Outcome(next_stage="aw.second", result={"doubled": task.payload["n"] * 2})

        @worker.handler("aw.second")
        async def second(task: Task) -> dict:
            seen["loops"].append(asyncio.get_running_loop() is loop)
            assert await task.progress({"half": task.payload["doubled"]}) is True
            with psycopg.connect(url, autocommit=True) as c:
                seen["progress"].append(c.execute("SELECT progress FROM queue.tasks WHERE id = %s",
                                                  (task.id,)).fetchone()[0])
            return {"n": task.payload["doubled"] + 1}

        await asyncio.wait_for(worker.run(should_stop=lambda: worker.counters.finished >= 4), 120)
        return worker

    worker = asyncio.run(main())
    assert worker.counters.finished == 4 and worker.counters.failed == 0, worker.counters
    assert seen["loops"] == [True] * 4, seen
    assert seen["threads"] == [[], []], seen
    assert sorted(p["half"] for p in seen["progress"]) == [2, 4], seen
    rows = conn.execute("SELECT id, stage, status::text, result FROM queue.history WHERE id = ANY(%s)"
                        " ORDER BY id, finished", (ids,)).fetchall()
    assert [(r[0], r[1], r[2]) for r in rows] == [(ids[0], "aw.first", "done"), (ids[0], "aw.second", "done"),
                                                  (ids[1], "aw.first", "done"), (ids[1], "aw.second", "done")], rows
    assert [r[3] for r in rows] == [{"doubled": 2}, {"n": 3}, {"doubled": 4}, {"n": 5}], rows


def test_async_handlers_overlap_in_time(url: str, conn: psycopg.Connection) -> None:
    """concurrency=6: six async handlers are running at once (each one's start before any one's
    end, from their own timestamps); a sync handler beside them runs in a thread (asyncio.to_thread)."""
    enqueue(conn, "aw.overlap", [{}] * 6)
    enqueue(conn, "aw.sync", [{}])
    spans: list[tuple[float, float]] = []
    sync_threads: list[bool] = []
    threads: list[list[str]] = []

    async def main() -> AsyncWorker:
        worker = AsyncWorker(url, batch=7, concurrency=7, idle_wait=0.2, maintain_every=0)
        arrived = asyncio.Event()
        started: list[float] = []

        @worker.handler("aw.overlap")
        async def wait_for_all(task: Task) -> None:
            threads.append(worker_threads())
            began = time.monotonic()
            started.append(began)
            if len(started) == 6:
                arrived.set()
            await asyncio.wait_for(arrived.wait(), 60)   # bounded: without overlap it fails, not hangs
            spans.append((began, time.monotonic()))

        @worker.handler("aw.sync")
        def in_a_thread(task: Task) -> None:
            sync_threads.append(threading.current_thread() is not threading.main_thread())

        await asyncio.wait_for(worker.run(should_stop=lambda: worker.counters.finished
                                          + worker.counters.failed >= 7), 120)
        return worker

    worker = asyncio.run(main())
    assert worker.counters.finished == 7 and worker.counters.failed == 0, worker.counters
    assert max(s for s, _ in spans) < min(e for _, e in spans), spans
    assert sync_threads == [True]
    assert threads == [[]] * 6, threads


def test_async_transactional_mode_commits_a_handlers_writes_with_the_finish(url: str, conn: psycopg.Connection) -> None:
    """transactional=True: task.conn is the batch's AsyncConnection; the row a handler writes
    commits with finish_locked; the write of a handler that raises is rolled back (its savepoint)
    and the attempt failed."""
    conn.execute("CREATE TABLE aw_orders (n int PRIMARY KEY)")
    conn.execute("SELECT queue.configure_stage('aw.tx', max_attempts => 1)")
    ok, bad = enqueue(conn, "aw.tx", [{"n": 1}, {"n": 2}])

    async def main() -> AsyncWorker:
        worker = AsyncWorker(url, transactional=True, idle_wait=0.2, maintain_every=0)

        @worker.handler("aw.tx")
        async def write(task: Task) -> None:
            assert isinstance(task.conn, psycopg.AsyncConnection)
            await task.conn.execute("INSERT INTO aw_orders VALUES (%s)", (task.payload["n"],))
            if task.payload["n"] == 2:
                raise Fail("no second order")

        await asyncio.wait_for(worker.run(should_stop=lambda: worker.counters.finished
                                          + worker.counters.failed >= 2), 120)
        return worker

    worker = asyncio.run(main())
    assert (worker.counters.finished, worker.counters.failed) == (1, 1), worker.counters
    assert conn.execute("SELECT n FROM aw_orders").fetchall() == [(1,)]
    rows = dict(conn.execute("SELECT id, status::text || ':' || coalesce(error_text, '') FROM queue.history"
                             " WHERE stage = 'aw.tx'").fetchall())
    assert rows == {ok: "done:", bad: "fatal:no second order"}, rows


@pytest.mark.parametrize("now", [False, True])
def test_async_shutdown_timeout_cancels_a_long_handler_and_releases_its_task(url: str, conn: psycopg.Connection,
                                                                            now: bool) -> None:
    """stop() while an async handler never ends: past shutdown_timeout (stop(now=True): at once,
    the timeout an hour) it is cancelled and its task released (ready, the attempt not counted)."""
    (task_id,) = enqueue(conn, f"aw.long.{now}", [{}])
    cancelled: list[int] = []
    threads: list[list[str]] = []

    async def main() -> AsyncWorker:
        worker = AsyncWorker(url, idle_wait=0.2, maintain_every=0, shutdown_timeout=3600 if now else 0.5)
        started = asyncio.Event()

        @worker.handler(f"aw.long.{now}")
        async def forever(task: Task) -> None:
            threads.append(worker_threads())
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.append(task.id)
                raise

        async def stopper() -> None:
            await asyncio.wait_for(started.wait(), 60)
            worker.stop(now=now)

        await asyncio.wait_for(asyncio.gather(worker.run(), stopper()), 120)
        return worker

    worker = asyncio.run(main())
    assert cancelled == [task_id] and threads == [[]], threads
    assert worker.counters.released == 1, worker.counters
    assert conn.execute("SELECT status::text, attempt FROM queue.tasks WHERE id = %s",
                        (task_id,)).fetchone() == ("ready", 0)


def test_async_worker_ends_at_once_on_a_refused_login(url: str) -> None:
    """A login the server refuses (no such role) is not retried: run() raises Refused."""
    bad = psycopg.conninfo.make_conninfo(url, user="aw_no_such_role")
    worker = AsyncWorker(bad, {"aw.refused": lambda task: None}, idle_wait=0.2, maintain_every=0)
    began = time.monotonic()

    async def main() -> list[str]:
        with pytest.raises(Refused, match="main connection: .*aw_no_such_role"):
            await asyncio.wait_for(worker.run(), 60)
        # no thread ran the loop: the default executor (where a loop in a thread would run) is unused
        return [t.name for t in threading.enumerate() if t.name.startswith(("asyncio_", "skiplock"))]

    assert asyncio.run(main()) == []
    assert time.monotonic() - began < 30


def test_async_task_timeout_cancels_the_handler_and_fails_the_attempt(url: str, conn: psycopg.Connection) -> None:
    """task_timeout=0.5: an async handler still running is cancelled and its attempt failed
    ("timed out"); the next task runs."""
    conn.execute("SELECT queue.configure_stage('aw.timeout', max_attempts => 1)")
    hung, quick = enqueue(conn, "aw.timeout", [{"hang": True}, {}])
    cancelled: list[int] = []
    threads: list[list[str]] = []

    async def handler(task: Task) -> None:
        threads.append(worker_threads())
        if task.payload.get("hang"):
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.append(task.id)
                raise

    worker = AsyncWorker(url, {"aw.timeout": handler}, batch=1, task_timeout=0.5, idle_wait=0.2, maintain_every=0)
    run(worker, should_stop=lambda: worker.counters.finished + worker.counters.failed >= 2)
    assert cancelled == [hung] and worker.counters.timed_out == 1, worker.counters
    assert threads == [[], []], threads
    rows = dict(conn.execute("SELECT id, status::text || ':' || coalesce(error_text, '') FROM queue.history"
                             " WHERE stage = 'aw.timeout'").fetchall())
    assert rows[hung].startswith("fatal:timed out after 0.5 s (task_timeout)"), rows
    assert rows[quick] == "done:", rows


def test_async_until_empty_returns_once_nothing_is_due(url: str, conn: psycopg.Connection) -> None:
    """until_empty=True: run() returns by itself once the stage is drained (a retried task included);
    on_end hears of each end."""
    ids = enqueue(conn, "aw.empty", [{"n": n} for n in range(5)])
    conn.execute("SELECT queue.configure_stage('aw.empty', backoff_base => '0')")

    threads: list[list[str]] = []

    async def handler(task: Task) -> None:
        threads.append(worker_threads())
        if task.payload["n"] == 0 and task.attempt == 1:
            raise Fail("once")

    ends: list[str] = []
    worker = AsyncWorker(url, {"aw.empty": handler}, batch=2, concurrency=2, until_empty=True, idle_wait=30,
                         on_end=lambda task, ending: ends.append(ending.what))
    counters = run(worker)
    assert (counters.finished, counters.failed) == (5, 1), counters
    assert sorted(ends) == ["failed"] + ["finished"] * 5, ends
    assert threads == [[]] * 6, threads
    assert conn.execute("SELECT count(*) FROM queue.history WHERE id = ANY(%s) AND status = 'done'",
                        (ids,)).fetchone() == (5,)


def test_async_worker_finishes_a_task_while_the_server_restarts(restart_cluster: devdb.Cluster,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """The server stops while an async handler runs: the finish is retried (the lease still holds)
    until the server is back, the task done at its first attempt; the listener reconnects and a
    task enqueued afterwards is done too."""
    url = restart_cluster.createdb("aw_restart")
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True) as c:
        (first,) = enqueue(c, "aw.restart", [{"first": True}])
    caplog.set_level(logging.WARNING, logger="skiplock.worker")
    threads: list[list[str]] = []

    async def main() -> AsyncWorker:
        worker = AsyncWorker(url, lease=60, idle_wait=0.5, maintain_every=0)
        started, down = asyncio.Event(), asyncio.Event()

        @worker.handler("aw.restart")
        async def handler(task: Task) -> None:
            threads.append(worker_threads())
            if task.payload.get("first"):
                started.set()
                await asyncio.wait_for(down.wait(), 60)

        async def restart() -> None:
            await asyncio.wait_for(started.wait(), 60)
            await asyncio.to_thread(restart_cluster.stop, mode="fast", remove=False)
            down.set()
            await asyncio.sleep(1.5)   # the finish fails meanwhile (logged), then is retried
            await asyncio.to_thread(restart_cluster._run, devdb.pg_bin() / "pg_ctl", "-D", restart_cluster.datadir,
                                    "-l", restart_cluster.logfile, "-w", "-t", "60", "start")
            while worker.counters.finished < 1:
                await asyncio.sleep(0.1)
            with psycopg.connect(url, autocommit=True) as c:
                enqueue(c, "aw.restart", [{}])

        await asyncio.wait_for(asyncio.gather(worker.run(should_stop=lambda: worker.counters.finished >= 2),
                                              restart()), 180)
        return worker

    worker = asyncio.run(main())
    assert worker.counters.finished == 2 and worker.counters.reconnects >= 1, worker.counters
    with psycopg.connect(url, autocommit=True) as c:
        rows = c.execute("SELECT id, status::text, attempt FROM queue.history WHERE stage = 'aw.restart'"
                         " ORDER BY id").fetchall()
    assert rows[0] == (first, "done", 1) and len(rows) == 2 and rows[1][1:] == ("done", 1), rows
    assert "connection lost" in caplog.text or "cannot connect" in caplog.text, caplog.text
    assert threads == [[], []], threads
