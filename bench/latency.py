"""Latency (`make bench BENCH_ARGS="--only latency"`): enqueue-to-start time with workers waiting on
LISTEN, at 10 %, 50 % and 90 % of the capacity measured first in the same run.

Workers, one process each, of two loops in turn (LOOPS): skiplock's own reference worker
(skiplock.worker.Worker, a no-op handler, its defaults: batches of up to 10, a finish a task,
LISTEN on `skiplock.<stage>` when the stage is empty, a 1 s slow poll), and a finish_and_take loop
that commits once a task (the same LISTEN and poll). Producers: pgbench running scripts/enqueue.sql (one task a transaction), first
unthrottled (capacity: tasks the workers finished a second while producers ran flat out, over a
backlog preloaded so that they never run dry: without one, a run either kept a backlog, where the
reference worker takes full batches and nobody is woken, or caught up and woke its workers by
NOTIFY at every task, and one build's capacity moved 2× between runs), then at a fixed --rate. Enqueue-to-start is read from the database: history.started (the take's
transaction time) minus history.created (the enqueue's transaction time), so it includes the
enqueue's commit, the NOTIFY, the worker's wake-up and its take, and no clock is shared across
processes. The first second of each rate is left out (connections starting).
"""

from __future__ import annotations

import multiprocessing
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from multiprocessing.synchronize import Event
from pathlib import Path

import psycopg

from bench import designs, pgbench
from bench.designs import SKIPLOCK
from bench.progress import log
from skiplock import devdb
from skiplock.worker import Task, Worker

STAGE = "latency"
LOADS = (0.10, 0.50, 0.90)
TARGET_P99_MS = 10.0        # issue 30: p99 below 10 ms at 50 % of capacity
BACKLOG_PER_S = 4_000       # tasks preloaded for each second of the capacity run (see above)


@dataclass
class LatencyPoint:
    load: float              # share of capacity asked for (0 for the capacity run)
    rate: float              # tasks/s asked for (pgbench --rate); 0: unthrottled
    seconds: float
    enqueued: int
    measured: int            # tasks in the percentiles (created after the first second)
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    finished_per_s: float
    left: int                # tasks not started when the workers were stopped
    floor_p50_ms: float | None = None   # a plain INSERT's own transaction at the same rate (see floor())
    floor_p99_ms: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _noop(task: Task) -> None:
    return None


def _work(url: str, stop: Event) -> None:
    Worker(url, {STAGE: _noop}).run(should_stop=stop.is_set)


def _work_combined(url: str, stop: Event) -> None:
    """The one-commit-a-task loop: finish_and_take ends the task just run and takes the next in one
    call, so a busy worker commits once a task (the reference worker commits its take and each
    finish); LISTEN and the same 1 s slow poll when nothing is due."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'LISTEN "skiplock.{STAGE}"')
        done: tuple[int, str] | None = None
        while not stop.is_set():
            row = conn.execute(
                "SELECT id, lease FROM queue.finish_and_take(%s, %s, %s, worker => 'latency')",
                (done[0] if done else None, done[1] if done else None, STAGE)).fetchone()
            if row is not None and row[0] is not None:
                done = (row[0], str(row[1]))   # run (a no-op), to be finished by the next call
                continue
            done = None
            for _ in conn.notifies(timeout=1.0, stop_after=1):
                pass
        if done:
            conn.execute("SELECT queue.finish(%s, %s, stage => %s)", (done[0], done[1], STAGE))


LOOPS = {"reference": _work, "finish_and_take": _work_combined}


class Workers:
    """N workers of a loop of LOOPS in processes of their own, until the context ends."""

    def __init__(self, url: str, n: int, loop: str = "reference") -> None:
        ctx = multiprocessing.get_context("fork")
        self._stop = ctx.Event()
        self._procs = [ctx.Process(target=LOOPS[loop], args=(url, self._stop), daemon=True) for _ in range(n)]

    def __enter__(self) -> "Workers":
        for p in self._procs:
            p.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for p in self._procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join()


def _wait_drained(conn: psycopg.Connection, timeout: float = 300.0) -> int:
    """Until the workers have started every task (a backlog left by the capacity run would be
    measured as the next load's latency), bounded generously; the tasks still waiting then."""
    deadline = time.monotonic() + timeout
    while True:
        left = conn.execute("SELECT count(*) FROM queue.live_tasks WHERE stage = %s", (STAGE,)).fetchone()[0]
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def floor(cluster: devdb.Cluster, rate: float, producers: int, seconds: float) -> tuple[float, float]:
    """p50 and p99 (ms) of a plain single-row INSERT's own transaction, send to commit acknowledged,
    by the same producers at the same rate (pgbench's per-transaction log, its time less its
    schedule lag): a task cannot be taken before its enqueue has committed, so this part of
    enqueue-to-start is no queue's to save."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = pgbench.command("ceiling_insert.sql", producers, seconds, rate=rate) + ["--log", f"--log-prefix={tmp}/floor"]
        out = subprocess.run(cmd, env=pgbench.environment(cluster, SKIPLOCK.dbname), capture_output=True, text=True,
                             cwd=tmp)
        if out.returncode != 0:
            raise RuntimeError(f"pgbench floor failed: {(out.stderr or out.stdout).strip()}")
        # Each line: client transaction time(us) script epoch epoch_us schedule_lag(us)
        own = sorted(int(f[2]) - int(f[6]) for path in Path(tmp).glob("floor*")
                     for f in (line.split() for line in path.read_text().splitlines()) if len(f) >= 7)
    if not own:
        raise RuntimeError("pgbench floor logged no transaction")
    return own[len(own) // 2] / 1000, own[min(len(own) - 1, int(len(own) * 0.99))] / 1000


def _percentiles(conn: psycopg.Connection, since: float) -> tuple[int, float | None, float | None, float | None]:
    return conn.execute("""
        SELECT count(*),
               1000 * percentile_cont(0.5) WITHIN GROUP (ORDER BY d),
               1000 * percentile_cont(0.99) WITHIN GROUP (ORDER BY d),
               1000 * max(d)
          FROM (SELECT extract(epoch FROM started - created)::float8 AS d
                  FROM queue.history
                 WHERE stage = %s AND created >= to_timestamp(%s)) x""", (STAGE, since)).fetchone()


def run(cluster: devdb.Cluster, seconds: float, workers: int = 4, producers: int = 4,
        loop: str = "reference") -> dict:
    """Capacity, then each load in LOADS, with `workers` processes of LOOPS[loop]; one dict for
    the results JSON and the report."""
    url = cluster.url(SKIPLOCK.dbname)
    points: list[LatencyPoint] = []
    with psycopg.connect(url, autocommit=True) as conn:
        designs.reset(conn, SKIPLOCK)
        conn.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[1000]), %s) FROM generate_series(1, %s)",
                     (STAGE, max(1, int(BACKLOG_PER_S * seconds) // 1000)))
        conn.execute("CHECKPOINT")
        with Workers(url, workers, loop):
            time.sleep(1.0)   # the workers are connected and busy with the backlog
            done0 = conn.execute("SELECT count(*) FROM queue.history").fetchone()[0]
            t0 = time.monotonic()
            s = pgbench.run(cluster, SKIPLOCK.dbname, "enqueue.sql", producers, seconds, {"stage": STAGE})
            elapsed = time.monotonic() - t0
            done1 = conn.execute("SELECT count(*) FROM queue.history").fetchone()[0]
            backlog = conn.execute("SELECT count(*) FROM queue.live_tasks WHERE stage = %s", (STAGE,)).fetchone()[0]
            capacity = (done1 - done0) / elapsed
            left = _wait_drained(conn)
            points.append(LatencyPoint(0.0, 0.0, seconds, s.transactions, 0, None, None, None, capacity, left))
            log(f"  latency: capacity {capacity:,.0f} tasks/s finished while {producers} producers enqueued "
                f"{s.tps:,.0f}/s flat out ({workers} workers, {loop} loop; {backlog:,} tasks still waiting at the end"
                + ("" if backlog else ": the backlog ran out, a lower bound") + ")")
            for load in LOADS:
                conn.execute("TRUNCATE queue.history")
                rate = load * capacity
                since = conn.execute("SELECT extract(epoch FROM now())::float8 + 1").fetchone()[0]
                t0 = time.monotonic()
                proc = pgbench.start(cluster, SKIPLOCK.dbname, "enqueue.sql", producers, seconds, {"stage": STAGE},
                                     rate=rate)
                s = pgbench.finish(proc, "enqueue.sql", producers)
                elapsed = time.monotonic() - t0
                left = _wait_drained(conn)
                n, p50, p99, mx = _percentiles(conn, since)
                finished = conn.execute("SELECT count(*) FROM queue.history").fetchone()[0]
                # The floor after the point, the workers idle and waiting, as during the point.
                f50, f99 = floor(cluster, rate, producers, seconds)
                points.append(LatencyPoint(load, rate, seconds, s.transactions, n, p50, p99, mx,
                                           finished / elapsed, left, f50, f99))
                log(f"  latency at {load:.0%} ({rate:,.0f}/s): p50 {_ms(p50)}, p99 {_ms(p99)}, max {_ms(mx)} "
                    f"over {n:,} tasks" + (f"; {left} not started" if left else "")
                    + f"; a plain INSERT's commit at that rate: p50 {_ms(f50)}, p99 {_ms(f99)}")
    half = next(p for p in points if p.load == 0.5)
    return {"loop": loop, "workers": workers, "producers": producers, "capacity": capacity,
            "points": [p.as_dict() for p in points],
            "target_p99_ms": TARGET_P99_MS,
            "target_met": half.p99_ms is not None and half.p99_ms < TARGET_P99_MS and half.left == 0}


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f} ms"


def markdown(passes: list[tuple[str, dict]], started: str, machine: str) -> str:
    """The latency sections, one a pass (its durability), each one table, and whether the issue's
    target holds in it."""
    first = passes[0][1]
    lines = [
        f"Enqueue-to-start, measured {started} on {machine}: {first['workers']} worker processes of one of two "
        "loops, each with a no-op handler and LISTEN when idle: the reference worker (`skiplock.worker.Worker`: "
        "`take_next` of up to 10, then `finish` each, a commit for the take and one a task) and a `finish_and_take` "
        "loop (`bench/latency.py`: one call and one commit a task); "
        f"{first['producers']} pgbench producers "
        "(`enqueue`, one task a transaction) at a fixed rate; `history.started − history.created` of every task "
        "created after each rate's first second. A rate starts only once the workers have started every task "
        "of the one before.",
    ]
    for name, result in passes:
        lines += [
            "",
            f"## {name}",
            "",
            "| load | rate asked (tasks/s) | finished/s | tasks measured | p50 | p99 | max | not started at the end "
            "| floor: a plain INSERT's commit, p50 / p99 |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for p in result["points"]:
            if p["load"] == 0:
                lines.append(f"| capacity (producers flat out, over a backlog) | – | {p['finished_per_s']:,.0f} | – | – | – | – "
                             f"| {p['left']:,} | – |")
                continue
            lines.append(f"| {p['load']:.0%} | {p['rate']:,.0f} | {p['finished_per_s']:,.0f} | {p['measured']:,} | "
                         f"{_ms(p['p50_ms'])} | {_ms(p['p99_ms'])} | {_ms(p['max_ms'])} | {p['left']:,} | "
                         f"{_ms(p.get('floor_p50_ms'))} / {_ms(p.get('floor_p99_ms'))} |")
        half = next(p for p in result["points"] if p["load"] == 0.5)
        verdict = "holds" if result["target_met"] else "does not hold"
        lines += ["", f"Target (issue 30): p99 < {result['target_p99_ms']:.0f} ms at 50 % of capacity: **{verdict}** "
                  f"(p99 {_ms(half['p99_ms'])}; a plain INSERT's own commit at that rate p99 "
                  f"{_ms(half.get('floor_p99_ms'))})."]
    lines += ["",
              "Every task counts from its enqueue's transaction start to its take's, so the figure holds the "
              "enqueue's commit (with default durability, its wait for the disk's flush), the NOTIFY, the worker "
              "process's wake-up, its `take_next` round trip, and every wait for a CPU on the way. The "
              "`synchronous_commit = off` pass is the same run without the flushes' waits: the difference between "
              "the two is what the flushes' waits add. The floor column is a plain single-row INSERT sent by the same "
              "producers at the same rate just after the point, the workers idle (pgbench's per-transaction log, its "
              "time less its schedule lag): the part of enqueue-to-start that no queue committing its enqueues this way "
              "avoids; the rest is the queue's own work, the workers' commits (a take and a finish a task, each "
              "flushed) sharing the one WAL with the producers', and the waits for a CPU. With more runnable processes than cores (a load average above 2 "
              "here) the waits for a CPU are part of every percentile; compare runs only at a like load."]
    return "\n".join(lines) + "\n"
