"""Fixed-length pgbench runs at one client count: the ceilings, W1, W1b, W2, W2b.

Every run starts from emptied tables (and, for W2 and W2b, a preloaded backlog that has been
vacuumed and checkpointed). Jobs per second: for enqueues pgbench's transactions per second times
the tasks per transaction; for processing, the tasks the database shows finished, over pgbench's
measured time (tps × finished / transactions), so that empty polls never count as work.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import psycopg

from bench import designs, pgbench
from bench.designs import PAYLOAD, Design
from bench.progress import log
from bench.waiter import WaitingWorker
from skiplock import devdb

ENQUEUE_BATCH = 1000
PROCESS_BATCH = 100


@dataclass
class Point:
    workload: str        # ceiling-insert, ceiling-insert-again, ceiling-select1, W1, W1b, W2, W2b
    design: str          # skiplock, seed, ceiling
    clients: int
    seconds: float
    jobs_per_s: float
    tps: float
    transactions: int
    failed: int
    finished: int | None = None   # processing runs: tasks finished, counted in the database
    drained: bool = False         # the preloaded backlog ran out: jobs_per_s is a lower bound

    def as_dict(self) -> dict:
        return asdict(self)


def _connect(cluster: devdb.Cluster, design: Design) -> psycopg.Connection:
    return psycopg.connect(cluster.url(design.dbname), autocommit=True)


def ceilings(cluster: devdb.Cluster, clients: int, seconds: float, again: bool = False) -> list[Point]:
    """The single-row INSERT and SELECT 1 ceilings. again=True: the INSERT ceiling only, measured a
    second time after the workloads (ceiling-insert-again), because the disk's fsync time moves
    within a run and every ratio depends on it."""
    with _connect(cluster, designs.SKIPLOCK) as conn:
        designs.reset(conn, designs.SKIPLOCK)
        conn.execute("CHECKPOINT")
    scripts = ((("ceiling-insert-again", "ceiling_insert.sql"),) if again else
               (("ceiling-insert", "ceiling_insert.sql"), ("ceiling-select1", "select1.sql")))
    points = []
    for workload, script in scripts:
        s = pgbench.run(cluster, designs.SKIPLOCK.dbname, script, clients, seconds)
        points.append(Point(workload, "ceiling", clients, seconds, s.tps, s.tps, s.transactions, s.failed))
        log(f"  {workload:20} {clients:2} clients: {s.tps:9,.0f} tx/s")
    return points


def enqueue(cluster: devdb.Cluster, design: Design, clients: int, seconds: float, waiting: bool = False) -> Point:
    """W1: one task per transaction. No worker waits on the stage, so skiplock sends no NOTIFY
    (as on a busy stage). waiting=True: a worker LISTENs on the stage and drains it whenever it
    is woken (bench.waiter), so enqueues pay for the wake-ups as deployed: one NOTIFY each time
    the worker found the stage empty (bench/NOTIFY.md)."""
    stage, name = ("w1.waiting", f"{design.name}-waiting") if waiting else ("w1", design.name)
    with _connect(cluster, design) as conn:
        designs.reset(conn, design)
        conn.execute("CHECKPOINT")
    worker = WaitingWorker(cluster.url(design.dbname), stage) if waiting else None
    if worker:
        worker.__enter__()
    try:
        s = pgbench.run(cluster, design.dbname, design.enqueue_script, clients, seconds, {"stage": stage, "n": "1"})
    finally:
        if worker:
            worker.__exit__(None, None, None)
    if worker and worker.error:
        raise RuntimeError(f"the waiting worker failed: {worker.error}")
    log(f"  W1  {name:8} {clients:2} clients: {s.tps:9,.0f} jobs/s"
        + (f"  (the worker waited {worker.waits} times, was notified {worker.notifies})" if worker else ""))
    return Point("W1", name, clients, seconds, s.tps, s.tps, s.transactions, s.failed)


def enqueue_batch(cluster: devdb.Cluster, clients: int, seconds: float) -> Point:
    """W1b: batches of 1,000 tasks per call (skiplock only: the seed has no batch enqueue)."""
    design = designs.SKIPLOCK
    with _connect(cluster, design) as conn:
        designs.reset(conn, design)
        conn.execute("CHECKPOINT")
    element = '"' + PAYLOAD.replace('"', '\\"') + '"'
    payloads = "{" + ",".join([element] * ENQUEUE_BATCH) + "}"
    s = pgbench.run(cluster, design.dbname, "enqueue_batch.sql", clients, seconds,
                    {"stage": "w1b", "payloads": payloads})
    jobs = s.tps * ENQUEUE_BATCH
    log(f"  W1b {design.name:8} {clients:2} clients: {jobs:9,.0f} jobs/s")
    return Point("W1b", design.name, clients, seconds, jobs, s.tps, s.transactions, s.failed)


def process(cluster: devdb.Cluster, design: Design, clients: int, seconds: float, preload: int) -> Point:
    """W2: take one task, finish it; a round trip and a commit each."""
    return _process(cluster, design, "W2", design.process_script, {"stage": "w2"}, clients, seconds, preload)


def process_combined(cluster: devdb.Cluster, clients: int, seconds: float, preload: int) -> Point:
    """W2 with finish_and_take: finish the previous task and take the next in one call, one commit."""
    return _process(cluster, designs.SKIPLOCK, "W2", "process_combined.sql",
                    {"stage": "w2", "id": "0", "lease": "00000000-0000-0000-0000-000000000000"},
                    clients, seconds, preload, name="skiplock-combined")


def process_locked(cluster: devdb.Cluster, clients: int, seconds: float, preload: int) -> Point:
    """W2 with take_locked: take by row lock and finish_locked in one transaction, one commit."""
    return _process(cluster, designs.SKIPLOCK, "W2", "process_locked.sql", {"stage": "w2"},
                    clients, seconds, preload, name="skiplock-locked")


def process_batch(cluster: devdb.Cluster, clients: int, seconds: float, preload: int) -> Point:
    """W2b: take 100, finish 100 in one call (skiplock only)."""
    return _process(cluster, designs.SKIPLOCK, "W2b", "process_batch.sql",
                    {"stage": "w2b", "batch": str(PROCESS_BATCH)}, clients, seconds, preload)


def _process(cluster: devdb.Cluster, design: Design, workload: str, script: str, variables: dict[str, str],
             clients: int, seconds: float, preload: int, name: str | None = None) -> Point:
    name = name or design.name
    stage = variables["stage"]
    with _connect(cluster, design) as conn:
        designs.reset(conn, design)
        log(f"  {workload:3} {design.name:8} {clients:2} clients: preloading {preload:,} tasks")
        design.preload(conn, stage, preload)
        designs.settle(conn, design)
    s = pgbench.run(cluster, design.dbname, script, clients, seconds, variables)
    with _connect(cluster, design) as conn:
        finished = design.count(conn, design.done_sql)
        left = design.count(conn, design.ready_sql, stage)
    jobs = s.tps * finished / s.transactions if s.transactions else 0.0
    drained = left == 0
    log(f"  {workload:3} {name:8} {clients:2} clients: {jobs:9,.0f} jobs/s"
        + ("  (backlog ran out: a lower bound)" if drained else ""))
    return Point(workload, name, clients, seconds, jobs, s.tps, s.transactions, s.failed, finished, drained)
