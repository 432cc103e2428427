"""W1 with and without a waiting worker, interleaved, for two builds of skiplock in one cluster.

    python -m bench.notify_ab --old /work/main/schema [--rounds 3] [--seconds 10] [--clients 16]

Each build is a database built from a schema/ directory (this checkout's is "new"). Each round
runs, for each build in turn: W1 with no worker waiting (stage w1), W1 while a worker LISTENs
and drains the stage whenever it is woken (bench.waiter), and W1 after a single empty take only
marked the stage (the way `make bench` measured "waiting" before: nobody drains, so the mark is
never renewed); and, as the control for the worker's own CPU, W1 with the same worker on a stage
whose wake-ups are off (configure_stage(notify => false)). Medians over the rounds are printed with the load average; bench/NOTIFY.md
records a run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import psycopg

from bench import pgbench
from bench.progress import log
from bench.waiter import WaitingWorker
from skiplock import devdb, sqlfiles

BENCH_DIR = Path(__file__).resolve().parent
MODES = ("none", "worker", "quiet", "mark")


def build(cluster: devdb.Cluster, dbname: str, schema_dir: Path) -> None:
    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    with psycopg.connect(cluster.url(dbname)) as conn:
        sqlfiles.build_from_schema(conn, schema_dir)
        conn.commit()


def cell(cluster: devdb.Cluster, dbname: str, mode: str, clients: int, seconds: float) -> dict:
    stage = "w1" if mode == "none" else f"w1.{mode}"
    url = cluster.url(dbname)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE queue.live_tasks, queue.history")
        conn.execute("DELETE FROM queue.stage_waiters")
        if mode == "mark":
            conn.execute("SELECT count(*) FROM queue.take_next(%s)", (stage,))
        if mode == "quiet":  # the same worker, the stage's wake-ups off: it finds tasks by its poll
            conn.execute("SELECT queue.configure_stage(%s, notify => false)", (stage,))
        conn.execute("CHECKPOINT")
    worker = WaitingWorker(url, stage) if mode in ("worker", "quiet") else None
    if worker:
        worker.__enter__()
    try:
        s = pgbench.run(cluster, dbname, "enqueue.sql", clients, seconds, {"stage": stage})
    finally:
        if worker:
            worker.__exit__(None, None, None)
    row = {"db": dbname, "mode": mode, "tps": s.tps}
    if worker:
        if worker.error:
            raise worker.error
        row.update(notifies=worker.notifies, waits=worker.waits, finished=worker.finished)
    log(f"  {dbname:4} {mode:6} {s.tps:8,.0f} enqueues/s"
        + (f"  (worker: {worker.notifies} notifications, {worker.waits} waits, {worker.finished} finished)"
           if worker else ""))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.notify_ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, type=Path, help="schema/ directory of the build to compare against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args(argv)
    load = lambda: " ".join(Path("/proc/loadavg").read_text().split()[:3])  # noqa: E731
    log(f"load average before: {load()}")
    rows = []
    with devdb.stopped_on_signals():
        cluster = devdb.Cluster(durable=True, settings={"autovacuum_naptime": "'1s'"}).start()
        try:
            build(cluster, "old", args.old)
            build(cluster, "new", sqlfiles.SCHEMA_DIR)
            for r in range(args.rounds):
                log(f"round {r + 1} of {args.rounds}")
                order = ("old", "new") if r % 2 == 0 else ("new", "old")
                for mode in MODES:
                    for db in order:
                        rows.append(cell(cluster, db, mode, args.clients, args.seconds) | {"round": r + 1})
        finally:
            cluster.stop()
    print(f"\nW1, {args.clients} clients, {args.seconds:g} s cells, {args.rounds} interleaved rounds; "
          f"load average before/after: see above / {load()}; nproc {os.cpu_count()}\n")
    print("| build | no worker | a worker waits (drains, LISTENs) | ratio | same worker, notify off | ratio | marked once, never drained | ratio |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for db in ("old", "new"):
        med = {m: statistics.median(x["tps"] for x in rows if x["db"] == db and x["mode"] == m) for m in MODES}
        print(f"| {db} | {med['none']:,.0f} | {med['worker']:,.0f} | {med['worker'] / med['none']:.2f}x "
              f"| {med['quiet']:,.0f} | {med['quiet'] / med['none']:.2f}x "
              f"| {med['mark']:,.0f} | {med['mark'] / med['none']:.2f}x |")
    for db in ("old", "new"):
        for mode in ("worker", "quiet"):
            ws = [x for x in rows if x["db"] == db and x["mode"] == mode]
            print(f"{db} {mode}: notifications per round {[x['notifies'] for x in ws]}, waits {[x['waits'] for x in ws]}")
    print("per round:", [(x["round"], x["db"], x["mode"], round(x["tps"])) for x in rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
