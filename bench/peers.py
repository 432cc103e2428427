"""`make bench-peers` (python -m bench.peers): skiplock side by side with the queues a user would
otherwise pick, in ONE throwaway cluster, each system in its own database, every cell a pgbench run
(`-M prepared`) of a script written for this benchmark from the system's public SQL interface
(bench/scripts/peers/), with PostgreSQL's default durability. Writes bench/PEERS.md and
bench/out/peers-*.json.

The peers are installed by the Makefile target from this machine's registries (npm, PyPI, Debian),
into .peers/ (not committed): Graphile Worker's schema goes in through its own CLI, Procrastinate's
through `procrastinate schema --apply`, PgQ as the extension. PgQueuer (installed beside
Procrastinate) has no SQL API, its queries exist only inside its Python library: it is not in
these cells but in bench/peers_libs.py's (python -m bench.peers_libs), which drives skiplock's
Python client, PgQueuer's QueueManager and Procrastinate's worker with no-op handlers and writes
the section "## Through the worker libraries" of bench/PEERS.md; a run of this module keeps that
section as it was.

    python -m bench.peers                      # W1, W2, W2b at 4 and 16 clients, 10 s a cell
    python -m bench.peers --seconds 3 --clients 4 --only W1   # a quick look
    python -m bench.peers --only W2 --clients 16 --seconds 60 --systems skiplock,graphile   # long cells
    python -m bench.peers --report bench/out/peers-….json   # PEERS.md again from a run's figures
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import psycopg

from bench import designs, pgbench
from bench.progress import log
from skiplock import devdb

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
PEERS_DIR = ROOT / ".peers"                  # what the Makefile installs: node/, venv/
NODE_DIR = PEERS_DIR / "node"
PEERS_PY = PEERS_DIR / "venv" / "bin"
OUT_DIR = BENCH_DIR / "out"
WORKLOADS = ("W1", "W2", "W2b")
SETTINGS = {"autovacuum_naptime": "'1s'"}     # as bench.run: the README's advice, else defaults
BATCH = 100
GRAPHILE_WORKER = "bench-peers"              # locked_by of the Graphile driver's claims


@dataclass
class Cell:
    workload: str        # W1 (enqueue), W2 (take one + finish), W2b (batches of 100), ceiling
    system: str          # ceiling, skiplock, graphile, procrastinate, pgq
    variant: str         # what was driven, as the table shows it
    clients: int
    seconds: float
    jobs_per_s: float
    tps: float
    transactions: int
    failed: int
    done: int | None = None        # jobs the database shows processed after the cell
    left: int | None = None        # jobs still waiting after the cell (0: a lower bound)
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class System:
    """One peer: its database, how to empty it, preload it, and count what a cell did."""
    name: str
    dbname: str
    version: str = ""
    reset_sql: tuple[str, ...] = ()
    preload: Callable[[psycopg.Connection, int], None] | None = None
    count_done: Callable[[psycopg.Connection, int], int] | None = None   # (conn, preloaded) -> processed
    count_left: Callable[[psycopg.Connection], int] | None = None
    variables: dict[str, str] = field(default_factory=dict)


# -- installing schemas ------------------------------------------------------------------------

def _run(cmd: list[str], env: dict[str, str] | None = None) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out.stdout


def _libpq_env(cluster: devdb.Cluster, dbname: str) -> dict[str, str]:
    return {"PGHOST": str(cluster.directory), "PGPORT": str(cluster.port), "PGUSER": "postgres",
            "PGDATABASE": dbname}


def node_version(package: str) -> str:
    path = NODE_DIR / "node_modules" / package / "package.json"
    return json.loads(path.read_text())["version"] if path.exists() else ""


def py_version(package: str) -> str:
    out = subprocess.run([str(PEERS_PY / "python"), "-c",
                          f"import importlib.metadata as m; print(m.version('{package}'))"],
                         capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def install_graphile(cluster: devdb.Cluster, system: System) -> None:
    """Its own CLI: `graphile-worker --schema-only` runs its migrations and exits."""
    cli = NODE_DIR / "node_modules" / ".bin" / "graphile-worker"
    _run([str(cli), "--connection", _tcp_url(cluster, system.dbname), "--schema-only"])
    with psycopg.connect(cluster.url(system.dbname), autocommit=True) as conn:
        # The task identifier the jobs name: add_job creates it; its id is what the worker claims by.
        conn.execute("SELECT graphile_worker.add_job('noop', '{}'::json)")
        task = conn.execute("SELECT id FROM graphile_worker._private_tasks WHERE identifier = 'noop'").fetchone()[0]
        conn.execute("DELETE FROM graphile_worker._private_jobs")
    system.variables = {"tasks": "{%d}" % task, "worker": GRAPHILE_WORKER}


def install_procrastinate(cluster: devdb.Cluster, system: System) -> None:
    """Its own CLI: `procrastinate --app=… schema --apply`; the app (a PsycopgConnector on libpq's
    environment) is a two-line module written into .peers/, as its CLI needs one."""
    (PEERS_DIR / "peers_procrastinate_app.py").write_text(
        "import procrastinate\n\napp = procrastinate.App(connector=procrastinate.PsycopgConnector())\n")
    _run([str(PEERS_PY / "procrastinate"), "--app=peers_procrastinate_app.app", "schema", "--apply"],
         env={**_libpq_env(cluster, system.dbname), "PYTHONPATH": str(PEERS_DIR)})


def install_pgq(cluster: devdb.Cluster, system: System) -> None:
    with psycopg.connect(cluster.url(system.dbname), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pgq")
        system.version = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'pgq'").fetchone()[0]
    system.variables = {"queue": "bench", "consumer": "bench"}


def _tcp_url(cluster: devdb.Cluster, dbname: str) -> str:
    return f"postgresql://postgres@127.0.0.1:{cluster.port}/{dbname}"


# -- the systems -------------------------------------------------------------------------------

def _chunks(n: int, size: int = 100_000) -> list[int]:
    return [min(size, n - i) for i in range(0, n, size)]


def _graphile_preload(conn: psycopg.Connection, n: int) -> None:
    """Through its bulk API, graphile_worker.add_jobs (add_job row by row takes minutes here)."""
    for k in _chunks(n):
        conn.execute("SELECT count(*) FROM graphile_worker.add_jobs((SELECT array_agg(ROW('noop', '{\"doc\": 42}'::json, "
                     "NULL, NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec) FROM generate_series(1, %s)))", (k,))


def _procrastinate_preload(conn: psycopg.Connection, n: int) -> None:
    for k in _chunks(n):
        conn.execute("SELECT procrastinate_defer_jobs_v1(array_agg(ROW('default', 'noop', 0, NULL, NULL, "
                     "'{\"doc\": 42}'::jsonb, NULL)::procrastinate_job_to_defer_v1)) FROM generate_series(1, %s)", (k,))


def _pgq_reset(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.drop_queue('bench', true) FROM pgq.queue WHERE queue_name = 'bench'")
    conn.execute("SELECT pgq.create_queue('bench')")
    conn.execute("SELECT pgq.register_consumer('bench', 'bench')")


def _pgq_preload(conn: psycopg.Connection, n: int) -> None:
    """Events in transactions of BATCH, a tick after each: the batches the consumer then reads."""
    for _ in range(0, n, BATCH):
        conn.execute("SELECT count(pgq.insert_event('bench', 'noop', '{\"doc\": 42}')) FROM generate_series(1, %s)",
                     (BATCH,))
        conn.execute("SELECT pgq.force_tick('bench')")
        conn.execute("SELECT pgq.ticker('bench')")


def _pgq_done(conn: psycopg.Connection) -> int:
    """Events of the batches the consumer finished: visible in the snapshot of its last tick (the
    queue is made anew for each cell; its first tick precedes every event). pending_events of
    pgq.get_consumer_info counts sequence numbers, which force_tick inflates."""
    return conn.execute("""
        SELECT count(*) FROM pgq.event_template e, pgq.tick t, pgq.subscription s, pgq.queue q, pgq.consumer c
         WHERE q.queue_name = 'bench' AND c.co_name = 'bench' AND s.sub_queue = q.queue_id
           AND s.sub_consumer = c.co_id AND t.tick_queue = q.queue_id AND t.tick_id = s.sub_last_tick
           AND txid_visible_in_snapshot(e.ev_txid, t.tick_snapshot)""").fetchone()[0]


def _pgq_left(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM pgq.event_template").fetchone()[0] - _pgq_done(conn)


SKIPLOCK = System(
    "skiplock", designs.SKIPLOCK.dbname,
    reset_sql=(designs.SKIPLOCK.reset_sql,),
    preload=lambda conn, n: designs.SKIPLOCK.preload(conn, "peers", n),
    count_done=lambda conn, n: conn.execute("SELECT count(*) FROM queue.history").fetchone()[0],
    count_left=lambda conn: conn.execute("SELECT count(*) FROM queue.live_tasks WHERE status = 'ready'").fetchone()[0],
    variables={"stage": "peers"})
GRAPHILE = System(
    "graphile", "graphile",
    reset_sql=("TRUNCATE graphile_worker._private_jobs",),
    preload=_graphile_preload,
    # Completion deletes the job: processed = preloaded − what is left.
    count_done=lambda conn, n: n - conn.execute("SELECT count(*) FROM graphile_worker._private_jobs").fetchone()[0],
    count_left=lambda conn: conn.execute("SELECT count(*) FROM graphile_worker._private_jobs WHERE is_available")
    .fetchone()[0])
PROCRASTINATE = System(
    "procrastinate", "procrastinate",
    reset_sql=("TRUNCATE procrastinate_jobs CASCADE",),
    preload=_procrastinate_preload,
    count_done=lambda conn, n: conn.execute("SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'").fetchone()[0],
    count_left=lambda conn: conn.execute("SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'").fetchone()[0])
PGQ = System(
    "pgq", "pgq",
    preload=_pgq_preload,
    count_done=lambda conn, n: _pgq_done(conn),
    count_left=_pgq_left)
CEILING = System("ceiling", designs.SKIPLOCK.dbname, reset_sql=("TRUNCATE ceiling",))
# skiplock's own statements as bare SQL, no function (bench/scripts/bounds/): not a system a user runs,
# the floor under skiplock's loops, in the same run as the peers, so that a gap can be read as the
# price of the functions' guarantees or of the design's statements themselves.
BOUNDS = System(
    "bounds", designs.SKIPLOCK.dbname,
    reset_sql=(designs.SKIPLOCK.reset_sql,),
    preload=lambda conn, n: designs.SKIPLOCK.preload(conn, "peers", n),
    # Every bound's finish deletes the task (and only some move it to history): processed = preloaded − left.
    count_done=lambda conn, n: n - conn.execute("SELECT count(*) FROM queue.live_tasks").fetchone()[0],
    count_left=SKIPLOCK.count_left,
    variables={"stage": "peers"})

LABELS = {"ceiling": "plain INSERT", "skiplock": "skiplock", "bounds": "bound: skiplock's statements, bare SQL", "graphile": "Graphile Worker",
          "procrastinate": "Procrastinate", "pgq": "PgQ"}


@dataclass(frozen=True)
class Plan:
    workload: str
    system: System
    variant: str
    script: str
    extra: tuple[tuple[str, str], ...] = ()
    clients: tuple[int, ...] | None = None      # None: every client count of the run


W2B_CLIENTS = (1, 4, 16)


def plans() -> list[Plan]:
    zero = "00000000-0000-0000-0000-000000000000"
    batch = (("batch", str(BATCH)),)
    return [
        Plan("W1", CEILING, "INSERT one row", "ceiling_insert.sql"),
        Plan("W1", SKIPLOCK, "queue.enqueue", "enqueue.sql"),
        Plan("W1", BOUNDS, "INSERT INTO queue.live_tasks, no function", "bounds/enqueue.sql"),
        Plan("W1", BOUNDS, "that INSERT in a minimal SECURITY DEFINER function", "bounds/enqueue_wrapped.sql"),
        Plan("W1", BOUNDS, "that function with enqueue's tests of stage and payload", "bounds/enqueue_checked.sql"),
        Plan("W1", GRAPHILE, "graphile_worker.add_job", "peers/graphile_enqueue.sql"),
        Plan("W1", PROCRASTINATE, "procrastinate_defer_jobs_v1", "peers/procrastinate_enqueue.sql"),
        Plan("W1", PGQ, "pgq.insert_event", "peers/pgq_enqueue.sql"),
        Plan("W2", SKIPLOCK, "take_next + finish", "process.sql"),
        Plan("W2", SKIPLOCK, "finish_and_take", "process_combined.sql", (("id", "0"), ("lease", zero))),
        Plan("W2", SKIPLOCK, "take_locked + finish_locked, one transaction", "process_locked.sql"),
        Plan("W2", BOUNDS, "their claim + move to history, one transaction, no function", "bounds/process_history.sql"),
        Plan("W2", BOUNDS, "their claim + DELETE, no history, no function", "bounds/process_delete.sql"),
        Plan("W2", BOUNDS, "their claim + move to history, each in a minimal SECURITY DEFINER function",
             "bounds/process_wrapped.sql"),
        Plan("W2", BOUNDS, "take_next's claim under a lease, then finish's move, two transactions, no function",
             "bounds/process_leased.sql"),
        Plan("W2", BOUNDS, "finish_and_take's move and claim under a lease, one transaction, no function",
             "bounds/process_leased_combined.sql", (("id", "0"), ("lease", zero))),
        Plan("W2", GRAPHILE, "claim + delete (its worker's statements)", "peers/graphile_process.sql"),
        Plan("W2", PROCRASTINATE, "fetch_job_v2 + finish_job_v1", "peers/procrastinate_process.sql"),
        # W2b also at 1 client: PgQ's one consumer runs there, and the others beside it.
        Plan("W2b", SKIPLOCK, "take_next(batch 100) + finish_batch", "process_batch.sql", batch, W2B_CLIENTS),
        Plan("W2b", SKIPLOCK, "consume(batch 100), work done in its transaction", "consume_batch.sql", batch,
             W2B_CLIENTS),
        Plan("W2b", BOUNDS, "consume's statement (claim 100 + move to history by row address), no function",
             "bounds/process_batch.sql",
             batch, W2B_CLIENTS),
        Plan("W2b", GRAPHILE, "claim 100 + delete 100", "peers/graphile_process_batch.sql", batch, W2B_CLIENTS),
        # PgQ: one consumer reads every event, so one client (more clients would read the same batches).
        Plan("W2b", PGQ, "next_batch + get_batch_events + finish_batch (1 consumer)", "peers/pgq_process_batch.sql",
             clients=(1,)),
    ]


# -- running cells -----------------------------------------------------------------------------

def preload_size(workload: str, seconds: float, system: System) -> int:
    """Enough for the fastest system's expected rate over the cell, with a margin (PgQ's one
    consumer read 30,000 events/s here and ran out of 20,000 a second's worth, and skiplock's
    consume(100) at 4 clients ran out of 50,000 at revision 0108: a cell that still runs out says so)."""
    rate = 6_000 if workload == "W2" else 100_000
    return int(rate * seconds * 1.5) // BATCH * BATCH


def run_cell(cluster: devdb.Cluster, plan: Plan, clients: int, seconds: float) -> Cell:
    system = plan.system
    variables = {**system.variables, **dict(plan.extra)}
    with psycopg.connect(cluster.url(system.dbname), autocommit=True) as conn:
        for sql in system.reset_sql:
            conn.execute(sql)
        if system is PGQ:
            _pgq_reset(conn)
        preloaded = 0
        if plan.workload != "W1":
            assert system.preload is not None
            preloaded = preload_size(plan.workload, seconds, system)
            t0 = time.monotonic()
            system.preload(conn, preloaded)
            log(f"    preloaded {preloaded:,} jobs into {system.name} in {time.monotonic() - t0:.0f} s")
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
    s = pgbench.run(cluster, system.dbname, plan.script, clients, seconds, variables)
    cell = Cell(plan.workload, system.name, plan.variant, clients, seconds, s.tps, s.tps, s.transactions, s.failed)
    if plan.workload != "W1":
        assert system.count_done is not None and system.count_left is not None
        with psycopg.connect(cluster.url(system.dbname), autocommit=True) as conn:
            cell.done = system.count_done(conn, preloaded)
            cell.left = system.count_left(conn)
        cell.jobs_per_s = s.tps * cell.done / s.transactions if s.transactions else 0.0
        if cell.done == 0:
            cell.note = "processed nothing"
        elif cell.left == 0:
            cell.note = "backlog ran out: a lower bound"
    else:
        with psycopg.connect(cluster.url(system.dbname), autocommit=True) as conn:
            cell.done = enqueued(conn, system)
        if cell.done < s.transactions:
            cell.note = f"only {cell.done:,} jobs found for {s.transactions:,} transactions"
    log(f"  {plan.workload:3} {system.name:13} {clients:2} clients: {cell.jobs_per_s:9,.0f} jobs/s  {plan.variant}"
        + (f"  ({cell.note})" if cell.note else ""))
    return cell


def enqueued(conn: psycopg.Connection, system: System) -> int:
    """Jobs a W1 cell left in the database (what it claims to have enqueued)."""
    sql = {"ceiling": "SELECT count(*) FROM ceiling",
           "skiplock": "SELECT count(*) FROM queue.live_tasks",
           "bounds": "SELECT count(*) FROM queue.live_tasks",
           "graphile": "SELECT count(*) FROM graphile_worker._private_jobs",
           "procrastinate": "SELECT count(*) FROM procrastinate_jobs",
           # a queue's event tables inherit from pgq.event_template (one queue, made anew each cell)
           "pgq": "SELECT count(*) FROM pgq.event_template"}[system.name]
    return conn.execute(sql).fetchone()[0]


# -- the run and the report --------------------------------------------------------------------

INSTALLERS: dict[str, Callable[[devdb.Cluster, System], None]] = {
    "graphile": install_graphile, "procrastinate": install_procrastinate, "pgq": install_pgq}


def setup(cluster: devdb.Cluster, errors: dict[str, str]) -> list[str]:
    """skiplock from its migrations (and the ceiling table), then each peer in its own database.
    Returns the systems that installed; a peer that fails to install is reported and skipped."""
    designs.create_databases(cluster.url(), cluster.url, from_schema=False)
    with psycopg.connect(cluster.url(designs.SKIPLOCK.dbname), autocommit=True) as conn:
        conn.execute((pgbench.SCRIPTS / "bounds" / "wrapped.sql").read_text())  # the wrapped bound's functions
    GRAPHILE.version = node_version("graphile-worker")
    PROCRASTINATE.version = py_version("procrastinate")
    with psycopg.connect(cluster.url(designs.SKIPLOCK.dbname)) as conn:
        SKIPLOCK.version = "revision " + conn.execute("SELECT version_num FROM queue.skiplock_version").fetchone()[0]
    ok = ["ceiling", "skiplock", "bounds"]
    for system in (GRAPHILE, PROCRASTINATE, PGQ):
        try:
            cluster.createdb(system.dbname)
            INSTALLERS[system.name](cluster, system)
            ok.append(system.name)
            log(f"installed {LABELS[system.name]} {system.version} into database {system.dbname}")
        except (RuntimeError, psycopg.Error, OSError) as e:
            errors[f"install {system.name}"] = str(e).strip()
            log(f"{system.name}: install FAILED, going on without it: {str(e).strip().splitlines()[0]}")
    if "procrastinate" in ok:
        with psycopg.connect(cluster.url(PROCRASTINATE.dbname), autocommit=True) as conn:
            worker = conn.execute("SELECT worker_id FROM procrastinate_register_worker_v1()").fetchone()[0]
        PROCRASTINATE.variables = {"worker_id": str(worker)}
    return ok


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10, help="length of a cell (default 10 s)")
    parser.add_argument("--clients", default="4,16", help="client counts, comma-separated (default 4,16)")
    parser.add_argument("--only", help=f"workloads out of {','.join(WORKLOADS)}")
    parser.add_argument("--systems", help="systems out of skiplock,graphile,procrastinate,pgq,bounds (default all)")
    parser.add_argument("--reverse", action="store_true",
                        help="run each workload's cells in the reverse order (the first cells of a run measured lower)")
    parser.add_argument("--no-publish", action="store_true", help="write bench/out/PEERS.md only")
    parser.add_argument("--report", metavar="JSON", help="only write PEERS.md again from a run's bench/out/peers-*.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.report:
        text = markdown(json.loads(Path(args.report).read_text()))
        (BENCH_DIR / "PEERS.md").write_text(text + libs_section(BENCH_DIR / "PEERS.md"))
        print(text)
        return 0
    clients = tuple(int(c) for c in args.clients.split(","))
    only = set(args.only.split(",")) if args.only else set(WORKLOADS)
    started = datetime.now(timezone.utc)
    began = time.monotonic()
    result: dict = {"started": started.strftime("%Y-%m-%d %H:%M UTC"), "seconds": args.seconds,
                    "clients": list(clients), "cells": [], "errors": {},
                    "command": "make bench-peers" + (f" PEERS_ARGS='{' '.join(argv or sys.argv[1:])}'"
                                                     if (argv or sys.argv[1:]) else "")}
    result["load_before"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    result["commit"] = commit()
    with devdb.stopped_on_signals():
        cluster = devdb.Cluster(durable=True, settings=SETTINGS).start()
        try:
            ok = setup(cluster, result["errors"])
            with psycopg.connect(cluster.url()) as conn:
                result["postgres"] = conn.execute("SELECT version()").fetchone()[0]
            result["versions"] = {s.name: s.version for s in (SKIPLOCK, GRAPHILE, PROCRASTINATE, PGQ)
                                  if s.name in ok}
            for workload in WORKLOADS:
                if workload not in only:
                    continue
                mine = [p for p in plans() if p.workload == workload and p.system.name in ok
                        and (not args.systems or p.system.name in args.systems.split(","))]
                if args.reverse:
                    mine.reverse()
                for n in sorted({c for p in mine for c in (p.clients or clients)}):
                    for plan in mine:
                        if n not in (plan.clients or clients):
                            continue
                        try:
                            result["cells"].append(run_cell(cluster, plan, n, args.seconds).as_dict())
                        except (RuntimeError, psycopg.Error) as e:
                            result["errors"][f"{workload} {plan.system.name} {plan.variant} {n}"] = str(e).strip()
                            log(f"  {workload} {plan.system.name} FAILED: {str(e).strip().splitlines()[0]}")
        finally:
            cluster.stop()
    result["elapsed_min"] = (time.monotonic() - began) / 60
    result["machine"] = machine()
    OUT_DIR.mkdir(exist_ok=True)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    (OUT_DIR / f"peers-{stamp}.json").write_text(json.dumps(result, indent=2))
    text = markdown(result)
    (OUT_DIR / "PEERS.md").write_text(text)
    if not args.no_publish:
        (BENCH_DIR / "PEERS.md").write_text(text + libs_section(BENCH_DIR / "PEERS.md"))
    print(text)
    log(f"done in {result['elapsed_min']:.1f} min: " + ("bench/PEERS.md" if not args.no_publish else "bench/out/PEERS.md"))
    return 0


def libs_section(path: Path) -> str:
    """bench.peers_libs' section of the PEERS.md about to be replaced (with a blank line before it),
    or nothing: its own run writes it, this one keeps it."""
    old = path.read_text() if path.exists() else ""
    at = old.find("\n## Through the worker libraries\n")
    return "\n" + old[at + 1:] if at >= 0 else ""


def commit() -> str:
    """The checkout's commit, as the migrations' revision alone does not change with every edit."""
    out = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=ROOT)
    return out.stdout.strip() if out.returncode == 0 else "?"


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return f"{os.cpu_count()} CPUs ({cpu}), load average at the end {' '.join(Path('/proc/loadavg').read_text().split()[:3])}"


WORKLOAD_NAMES = {"W1": "W1 enqueue, one a transaction", "W2": "W2 take one + finish",
                  "W2b": f"W2b take {BATCH} + finish {BATCH}"}


def markdown(result: dict) -> str:
    cells = result["cells"]
    clients = sorted({c["clients"] for c in cells} | set(result["clients"]))
    insert = {c["clients"]: c["jobs_per_s"] for c in cells if c["system"] == "ceiling"}
    versions = result.get("versions", {})
    graphile_w2 = {c["clients"]: c["jobs_per_s"] for c in cells if c["workload"] == "W2" and c["system"] == "graphile"}

    def name(system: str) -> str:
        v = versions.get(system)
        return LABELS[system] + (f" {v}" if v else "")

    lines = [
        "# skiplock and its peers, side by side",
        "",
        f"Written by `{result['command']}` (`python -m bench.peers`), started {result['started']}, "
        f"{result['elapsed_min']:.1f} min. One throwaway cluster, PostgreSQL's default durability "
        "(autovacuum_naptime 1 s), each system in its own database, every cell a pgbench run "
        f"(`-M prepared`, {result['seconds']:.0f} s) of a script written for this benchmark from the system's "
        "public SQL interface (`bench/scripts/peers/`, skiplock's in `bench/scripts/`). Cells interleaved: for each "
        "workload and client count every system in turn, so the ratios are of one run; absolute figures move "
        "±20 % run to run on this shared machine.",
        "",
        f"- Server: {result.get('postgres', '?')}",
        f"- Machine: {result.get('machine', '?')}",
        "- Versions: " + ", ".join(name(s) for s in ("skiplock", "graphile", "procrastinate", "pgq") if s in versions)
        + (f" (skiplock at commit {result['commit']})" if result.get("commit") else "")
        + " (Graphile Worker from npm, Procrastinate from PyPI, PgQ from Debian's postgresql-15-pgq3; "
        "each installed by `make bench-peers`, its schema by its own tool)",
        f"- Client counts: {', '.join(map(str, result['clients']))}; W2b also at 1 (PgQ's one consumer, see below)",
        f"- Load average when the run began: {result.get('load_before', '?')} (other engineers' tests share these "
        "2 cores: read ratios, not absolute figures)",
        "",
        "Jobs a second; in brackets the ratio to Graphile Worker's W2 at the same client count (W1 rows also: "
        "to the plain INSERT at the same count); ⚠ marks a cell with a note below; – not measured. Processing cells "
        "count the jobs the database shows processed after the cell (skiplock: rows in `queue.history`; Graphile: "
        "rows its completion deleted; Procrastinate: jobs `succeeded`; PgQ: events of finished batches), over "
        "pgbench's measured time, so empty polls never count as work.",
        "",
        "| workload | system | driven through | " + " | ".join(f"{c} client{'s' if c > 1 else ''}" for c in clients) + " |",
        "|---|---|---|" + "--:|" * len(clients),
    ]
    rows: dict[tuple[str, str, str], dict[int, dict]] = {}
    for c in cells:
        rows.setdefault((c["workload"], c["system"], c["variant"]), {})[c["clients"]] = c
    for (workload, system, variant), by_clients in rows.items():
        values = []
        for n in clients:
            c = by_clients.get(n)
            if c is None:
                values.append("–")
                continue
            ratio = f" ({c['jobs_per_s'] / graphile_w2[n]:.2f}×)" if graphile_w2.get(n) else ""
            if workload == "W1" and system != "ceiling" and insert.get(n):
                ratio += f", {c['jobs_per_s'] / insert[n]:.2f}× INSERT"
            flag = " ⚠" if c["note"] else ""
            values.append(f"{c['jobs_per_s']:,.0f}{ratio}{flag}")
        lines.append(f"| {WORKLOAD_NAMES[workload]} | {name(system) if system != 'ceiling' else 'plain INSERT (ceiling)'} "
                     f"| {variant} | " + " | ".join(values) + " |")
    notes = [f"- {c['workload']} {c['system']} ({c['variant']}), {c['clients']} clients: {c['note']}"
             for c in cells if c["note"]]
    if notes:
        lines += ["", "⚠ cells:", *notes]
    lines += ["", "## Where a peer is ahead", ""]
    ahead = peers_ahead(cells)
    lines += ahead or ["Nowhere in this run: skiplock's best variant leads every workload at every client count measured."]
    lines += ["", "## What each driver sends", "",
              "- **Graphile Worker**: W1 `graphile_worker.add_job` (its public SQL API). W2: the claim its worker "
              "sends (a `FOR UPDATE SKIP LOCKED` pick of an available job of its task ids, an UPDATE that sets "
              "`locked_at`, `locked_by` and counts the attempt), then the DELETE its completion sends; two "
              "statements, two commits; the claim keeps its worker's clause for named job queues (none are used). W2b: the same claim with a limit of 100, one DELETE "
              "of the 100 ids. Nothing is kept after completion.",
              "- **Procrastinate**: W1 `procrastinate_defer_jobs_v1`; W2 `procrastinate_fetch_job_v2` then "
              "`procrastinate_finish_job_v1(id, 'succeeded', false)`: its worker's calls with its default of "
              "keeping finished jobs (its event triggers fire). It has no batch fetch: no W2b.",
              "- **PgQ**: W1 `pgq.insert_event`; W2b one consumer: `next_batch`, `get_batch_events`, "
              "`finish_batch`, the preload cutting a tick every 100 events. PgQ acknowledges batches, never a "
              "single event, and every registered consumer reads every event: more clients would read the same "
              "batches, so it runs at 1 client (W2b is measured at 1 client for the others too) and has no W2.",
              "- **skiplock**: `queue.enqueue`; `take_next` + `finish`; `finish_and_take`; `take_locked` + "
              "`finish_locked` in one transaction; `take_next(batch => 100)` + `finish_batch`; `consume(batch => 100)` "
              "(tasks recorded done in the statement that takes them, for work done in that transaction). Finished tasks "
              "are kept in `queue.history`.",
              "- **bound: skiplock's statements, bare SQL** is not a system a user runs: skiplock's own "
              "statements with no function around them (`bench/scripts/bounds/`, in skiplock's database, as the "
              "superuser). W1: the INSERT into `queue.live_tasks` that `enqueue` runs, none of its checks, bare and "
              "inside a minimal PL/pgSQL function, `SECURITY DEFINER` with a pinned `search_path` and nothing else "
              "(`bounds/wrapped.sql`), and that function with `enqueue`'s tests of its stage and payload. W2: the "
              "claim `take_locked` runs (the claim index, `FOR UPDATE SKIP LOCKED`), then the move to "
              "`queue.history`, one transaction, the move and COMMIT in one round trip; and the same with a "
              "DELETE and no history; and the claim and the move each inside such a minimal function: what the "
              "calls alone cost; and `take_next`'s claim, which marks the task running under a lease in a "
              "transaction of its own, then `finish`'s move to history by that lease in another (`bounds/process_leased.sql`), "
              "the floor under `take_next` + `finish`; and the same move and claim in one statement, one "
              "transaction a task (`bounds/process_leased_combined.sql`), the floor under `finish_and_take`. W2b: `consume`'s own statement, a claim of 100 and their move to history by row address, with no function around it. What "
              "skiplock's functions take below these rows is the price of their guarantees (argument checks, the "
              "stage's settings: pause, access, limits; the claim position; the fence; `SECURITY DEFINER`); where "
              "a peer is ahead of these rows too, the gap is the design's own statements, not its functions.",
              "- **PgQueuer** is not in this table: it has no SQL API (its queries are built by its Python "
              "library), so it is driven through its own worker library, its `QueueManager` with a no-op "
              "entrypoint, beside skiplock's Python client: see \"Through the worker libraries\" below "
              "(`python -m bench.peers_libs`)."]
    if result["errors"]:
        lines += ["", "## Errors", ""] + [f"- {k}: `{v.splitlines()[0] if v else ''}`" for k, v in result["errors"].items()]
    return "\n".join(lines) + "\n"


def peers_ahead(cells: list[dict]) -> list[str]:
    """One sentence per workload and client count where a peer beat skiplock's best variant."""
    out = []
    keys = sorted({(c["workload"], c["clients"]) for c in cells})
    for workload, n in keys:
        here = [c for c in cells if c["workload"] == workload and c["clients"] == n]
        ours = [c for c in here if c["system"] == "skiplock"]
        if not ours:
            continue
        best = max(ours, key=lambda c: c["jobs_per_s"])
        for c in here:
            if c["system"] in ("skiplock", "ceiling", "bounds") or c["jobs_per_s"] <= best["jobs_per_s"]:
                continue
            out.append(f"- {WORKLOAD_NAMES[workload]}, {n} client{'s' if n > 1 else ''}: **{LABELS[c['system']]}** "
                       f"{c['jobs_per_s']:,.0f} jobs/s against skiplock's best ({best['variant']}) "
                       f"{best['jobs_per_s']:,.0f}: {c['jobs_per_s'] / best['jobs_per_s']:.2f}×.")
    return out


if __name__ == "__main__":
    sys.exit(main())
