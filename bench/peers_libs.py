"""python -m bench.peers_libs: skiplock and its peers each driven through its own worker library, a
no-op handler, in ONE throwaway cluster (as bench.peers: PostgreSQL's default durability,
autovacuum_naptime 1 s), each system in its own database preloaded with the same number of no-op
jobs. Appends (or replaces) the section "## Through the worker libraries" of bench/PEERS.md and
writes bench/out/peers-libs-*.json.

Systems, each as N worker processes (N = the concurrency of the cell), every process one worker of
its library with that library's defaults:
- skiplock: its reference client clients/python/worker.py (one task at a time a process, batch 10),
  handle() replaced by a no-op, in skiplock's venv;
- PgQueuer: a QueueManager with an entrypoint "noop" (bench/peers_pgqueuer.py), in .peers/venv;
- Procrastinate: its `procrastinate worker --concurrency 1` on an app with a task "noop", in .peers/venv.

A cell starts the N processes, waits until every one is connected (pg_stat_activity, by the
application_name PGAPPNAME gives each) and the database shows the first job processed, waits
--warmup seconds more, then counts the jobs processed (from the database) at the start and at the
end of a window of --seconds: jobs/s is their difference over the window, so interpreter start-up
and connection set-up are not charged. Then SIGTERM, and the next system. Rounds interleave: every
system at every concurrency, then again.

    python -m bench.peers_libs                                  # 2 rounds, 4 and 16 workers, 5 s, 30,000 jobs
    python -m bench.peers_libs --seconds 3 --jobs 20000 --rounds 1   # a quick look
    python -m bench.peers_libs --report bench/out/peers-libs-….json    # the section again from a run's figures
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import psycopg

from bench import designs
from bench.peers import (
    BENCH_DIR,
    OUT_DIR,
    PEERS_DIR,
    PEERS_PY,
    ROOT,
    SETTINGS,
    _libpq_env,
    _procrastinate_preload,
    _run,
    commit,
    machine,
    py_version,
)
from bench.progress import log
from skiplock import devdb

SECTION = "## Through the worker libraries"
STAGE = "peers"
APPNAME = "peers-libs-"                          # + the worker's number: its connections' application_name
PGQUEUER_SCRIPT = BENCH_DIR / "peers_pgqueuer.py"
PROCRASTINATE_APP = "peers_libs_procrastinate_app"
# skiplock's reference client as its docstring says to use it: its handle() replaced, nothing else.
SKIPLOCK_WORKER = ("import sys; sys.path.insert(0, 'clients/python'); import worker; "
                   "worker.handle = lambda task_id, payload, attempt: None; sys.exit(worker.main())")


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


@dataclass
class System:
    name: str
    label: str
    dbname: str
    version: str = ""
    driven: str = ""                               # what a worker process is, for the table


def _count(cluster: devdb.Cluster, dbname: str, sql: str) -> int:
    with psycopg.connect(cluster.url(dbname), autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
        assert row is not None
        return int(row[0])


class Skiplock:
    system = System("skiplock", "skiplock", designs.SKIPLOCK.dbname,
                    driven="clients/python/worker.py, handle() a no-op (batch 10)")

    def install(self, cluster: devdb.Cluster) -> None:
        designs.create_databases(cluster.url(), cluster.url, from_schema=False)
        with psycopg.connect(cluster.url(self.system.dbname)) as conn:
            row = conn.execute("SELECT version_num FROM queue.skiplock_version").fetchone()
            assert row is not None
            self.system.version = f"revision {row[0]}"

    def preload(self, cluster: devdb.Cluster, n: int) -> None:
        with psycopg.connect(cluster.url(self.system.dbname), autocommit=True) as conn:
            conn.execute(designs.SKIPLOCK.reset_sql)
            designs.SKIPLOCK.preload(conn, STAGE, n)

    def command(self, cluster: devdb.Cluster) -> tuple[list[str], dict[str, str]]:
        return ([sys.executable, "-c", SKIPLOCK_WORKER],
                {"DATABASE_URL": cluster.url(self.system.dbname), "STAGE": STAGE})

    def done(self, cluster: devdb.Cluster, preloaded: int) -> int:
        return _count(cluster, self.system.dbname, "SELECT count(*) FROM queue.history")

    def left(self, cluster: devdb.Cluster) -> int:
        return _count(cluster, self.system.dbname,
                      f"SELECT count(*) FROM queue.live_tasks WHERE stage = '{STAGE}' AND status = 'ready'")


class PgQueuer:
    system = System("pgqueuer", "PgQueuer", "pgqueuer",
                    driven="QueueManager, entrypoint `noop` (bench/peers_pgqueuer.py), run() defaults (batch 10)")

    def install(self, cluster: devdb.Cluster) -> None:
        """Its own CLI: `pgq install` (durability durable, its default)."""
        cluster.createdb(self.system.dbname)
        _run([str(PEERS_PY / "pgq"), "install"], env=_libpq_env(cluster, self.system.dbname))
        self.system.version = py_version("pgqueuer")

    def preload(self, cluster: devdb.Cluster, n: int) -> None:
        with psycopg.connect(cluster.url(self.system.dbname), autocommit=True) as conn:
            conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
        _run([str(PEERS_PY / "python"), str(PGQUEUER_SCRIPT), "preload", str(n)],
             env=_libpq_env(cluster, self.system.dbname))

    def command(self, cluster: devdb.Cluster) -> tuple[list[str], dict[str, str]]:
        return [str(PEERS_PY / "python"), str(PGQUEUER_SCRIPT), "worker"], _libpq_env(cluster, self.system.dbname)

    def done(self, cluster: devdb.Cluster, preloaded: int) -> int:
        # Completion deletes the job from its queue table (and logs it): processed = preloaded − left.
        return preloaded - _count(cluster, self.system.dbname, "SELECT count(*) FROM pgqueuer")

    def left(self, cluster: devdb.Cluster) -> int:
        return _count(cluster, self.system.dbname, "SELECT count(*) FROM pgqueuer WHERE status = 'queued'")


class Procrastinate:
    system = System("procrastinate", "Procrastinate", "procrastinate_libs",
                    driven="`procrastinate worker --concurrency 1`, task `noop` an async no-op")

    def install(self, cluster: devdb.Cluster) -> None:
        """Its own CLI: `procrastinate schema --apply`, on an app module written into .peers/."""
        (PEERS_DIR / f"{PROCRASTINATE_APP}.py").write_text(
            "import procrastinate\n\napp = procrastinate.App(connector=procrastinate.PsycopgConnector())\n\n\n"
            "@app.task(name='noop')\nasync def noop(**kwargs):\n    return None\n")
        cluster.createdb(self.system.dbname)
        _run(self._cli("schema", "--apply"), env=self._env(cluster))
        self.system.version = py_version("procrastinate")

    def _cli(self, *args: str) -> list[str]:
        return [str(PEERS_PY / "procrastinate"), f"--app={PROCRASTINATE_APP}.app", *args]

    def _env(self, cluster: devdb.Cluster) -> dict[str, str]:
        return {**_libpq_env(cluster, self.system.dbname), "PYTHONPATH": str(PEERS_DIR)}

    def preload(self, cluster: devdb.Cluster, n: int) -> None:
        with psycopg.connect(cluster.url(self.system.dbname), autocommit=True) as conn:
            conn.execute("TRUNCATE procrastinate_jobs CASCADE")
            _procrastinate_preload(conn, n)

    def command(self, cluster: devdb.Cluster) -> tuple[list[str], dict[str, str]]:
        return self._cli("worker", "--concurrency", "1"), self._env(cluster)

    def done(self, cluster: devdb.Cluster, preloaded: int) -> int:
        return _count(cluster, self.system.dbname, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")

    def left(self, cluster: devdb.Cluster) -> int:
        return _count(cluster, self.system.dbname, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'")


Driver = Skiplock | PgQueuer | Procrastinate
DRIVERS: dict[str, Callable[[], Driver]] = {"skiplock": Skiplock, "pgqueuer": PgQueuer, "procrastinate": Procrastinate}


def connected(cluster: devdb.Cluster, dbname: str) -> int:
    """Worker processes with a connection to dbname (by the application_name each was given)."""
    return _count(cluster, dbname, "SELECT count(DISTINCT application_name) FROM pg_stat_activity "
                  f"WHERE datname = '{dbname}' AND application_name LIKE '{APPNAME}%'")


def run_cell(cluster: devdb.Cluster, driver: Driver, workers: int, seconds: float, jobs: int,
             warmup: float) -> dict:
    name = driver.system.name
    t = time.monotonic()
    driver.preload(cluster, jobs)
    with psycopg.connect(cluster.url(driver.system.dbname), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
    log(f"    preloaded {jobs:,} jobs into {name} in {time.monotonic() - t:.1f} s")
    cmd, env = driver.command(cluster)
    errs = [tempfile.TemporaryFile() for _ in range(workers)]
    # PGAPPNAME: libpq names each process's connections, so the cell can wait for every worker.
    procs = [subprocess.Popen(cmd, env={**os.environ, **env, "PGAPPNAME": f"{APPNAME}{i}"}, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=err)
             for i, err in enumerate(errs)]
    cell: dict = {"system": name, "workers": workers, "seconds": seconds, "preloaded": jobs, "note": ""}
    try:
        started = time.monotonic()
        # Every worker connected and the first job processed: every library is up.
        while connected(cluster, driver.system.dbname) < workers or driver.done(cluster, jobs) == 0:
            if any(p.poll() is not None for p in procs) or time.monotonic() - started > 120:
                raise RuntimeError(f"{name}: {connected(cluster, driver.system.dbname)} of {workers} workers "
                                   f"connected, {driver.done(cluster, jobs)} jobs processed after "
                                   f"{time.monotonic() - started:.0f} s")
            time.sleep(0.1)
        cell["startup_s"] = round(time.monotonic() - started, 2)
        time.sleep(warmup)
        load = loadavg()
        t0, d0 = time.monotonic(), driver.done(cluster, jobs)
        time.sleep(seconds)
        t1, d1 = time.monotonic(), driver.done(cluster, jobs)
        left = driver.left(cluster)
        dead = [p.returncode for p in procs if p.poll() is not None]
        cell.update(jobs_per_s=(d1 - d0) / (t1 - t0), done_in_window=d1 - d0, window_s=round(t1 - t0, 2),
                    left=left, load=load)
        if dead:
            cell["note"] = f"{len(dead)} worker(s) exited during the window"
        elif left == 0:
            cell["note"] = "backlog ran out: a lower bound"
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        failed = [p.returncode for p in procs if p.returncode not in (0, -signal.SIGTERM)]
        if failed:
            errs[0].seek(0)
            tail = errs[0].read().decode(errors="replace").strip().splitlines()[-3:]
            log(f"    {name}: {len(failed)} worker(s) exited with {sorted(set(failed))}: {' | '.join(tail)}")
        for e in errs:
            e.close()
    log(f"  {name:13} {workers:2} workers: {cell['jobs_per_s']:8,.0f} jobs/s (load {cell['load']})"
        + (f"  ({cell['note']})" if cell["note"] else ""))
    return cell


def parse_args(argv: list[str]) -> argparse.Namespace:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(prog="python -m bench.peers_libs", description=doc.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5, help="measured window of a cell (default 5 s)")
    parser.add_argument("--workers", default="4,16", help="worker processes a cell, comma-separated (default 4,16)")
    parser.add_argument("--jobs", type=int, default=30_000, help="no-op jobs preloaded before each cell (default 30,000)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds after the first job, before the window")
    parser.add_argument("--systems", default="skiplock,pgqueuer,procrastinate", help="out of " + ",".join(DRIVERS))
    parser.add_argument("--no-publish", action="store_true", help="leave bench/PEERS.md alone")
    parser.add_argument("--report", metavar="JSON", help="only write the section again from a run's bench/out/peers-libs-*.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.report:
        publish(markdown(json.loads(Path(args.report).read_text())))
        return 0
    workers = [int(w) for w in args.workers.split(",")]
    drivers = [DRIVERS[s]() for s in args.systems.split(",")]
    started = datetime.now(timezone.utc)
    began = time.monotonic()
    result: dict = {"started": started.strftime("%Y-%m-%d %H:%M UTC"), "seconds": args.seconds, "jobs": args.jobs,
                    "rounds": args.rounds, "workers": workers, "warmup": args.warmup, "cells": [], "errors": {},
                    "command": "python -m bench.peers_libs" + (" " + " ".join(argv or sys.argv[1:])
                                                                if (argv or sys.argv[1:]) else ""),
                    "load_before": loadavg(), "commit": commit(), "versions": {}}
    with devdb.stopped_on_signals():
        cluster = devdb.Cluster(durable=True, settings=SETTINGS).start()
        try:
            ok = []
            for d in drivers:
                try:
                    d.install(cluster)
                    ok.append(d)
                    log(f"installed {d.system.label} {d.system.version} into database {d.system.dbname}")
                except (RuntimeError, psycopg.Error, OSError) as e:
                    result["errors"][f"install {d.system.name}"] = str(e).strip()
                    log(f"{d.system.name}: install FAILED, going on without it: {str(e).strip().splitlines()[0]}")
            with psycopg.connect(cluster.url()) as conn:
                row = conn.execute("SELECT version()").fetchone()
                result["postgres"] = row[0] if row else "?"
            result["versions"] = {d.system.name: d.system.version for d in ok}
            result["versions"]["psycopg (peers' venv)"] = py_version("psycopg")
            result["versions"]["psycopg (skiplock's venv)"] = psycopg.__version__
            result["driven"] = {d.system.name: d.system.driven for d in ok}
            for r in range(1, args.rounds + 1):
                log(f"round {r} of {args.rounds}")
                for n in workers:
                    for d in ok:
                        try:
                            cell = run_cell(cluster, d, n, args.seconds, args.jobs, args.warmup)
                            cell["round"] = r
                            result["cells"].append(cell)
                        except (RuntimeError, psycopg.Error, OSError) as e:
                            result["errors"][f"round {r} {d.system.name} {n}"] = str(e).strip()
                            log(f"  {d.system.name} {n} workers FAILED: {str(e).strip().splitlines()[0]}")
        finally:
            cluster.stop()
    result["elapsed_min"] = (time.monotonic() - began) / 60
    result["machine"] = machine()
    OUT_DIR.mkdir(exist_ok=True)
    (OUT_DIR / f"peers-libs-{started.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(result, indent=2))
    text = markdown(result)
    if args.no_publish:
        print(text)
    else:
        publish(text)
    return 0


def publish(text: str) -> None:
    print(text)
    path = BENCH_DIR / "PEERS.md"
    path.write_text(with_section(path.read_text(), text))
    log("bench/PEERS.md: section written")


def with_section(document: str, section: str) -> str:
    """document with its SECTION replaced by section (up to the next "## " heading), or appended."""
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(document):
        return pattern.sub(lambda _: section.rstrip("\n") + "\n\n", document).rstrip("\n") + "\n"
    return document.rstrip("\n") + "\n\n" + section


LABELS = {"skiplock": "skiplock (its Python client)", "pgqueuer": "PgQueuer", "procrastinate": "Procrastinate"}
ABOUT = {
    "skiplock": "its reference client, `clients/python/worker.py`, run as it is meant to be (one process a worker, "
                "copied with `handle()` replaced: here the module imported and `worker.handle` set to a no-op before "
                "`worker.main()`), its defaults: `queue.take_next` in batches of 10, then `queue.finish` per task "
                "with its lease, a heartbeat thread, LISTEN when idle. Processed: rows in `queue.history`.",
    "pgqueuer": "its `QueueManager` on one psycopg async connection (its `PsycopgDriver`; asyncpg is not "
                "installed), one entrypoint `noop` whose handler returns at once, `run()` with its defaults (batches "
                "of 10, completions buffered and flushed by its log buffer, heartbeats, LISTEN). Schema by its own "
                "`pgq install`; jobs preloaded through its `Queries.enqueue` (lists). Processed: jobs gone from its "
                "queue table `pgqueuer` (completion deletes them and logs them).",
    "procrastinate": "its own worker, `procrastinate worker --concurrency 1`, on an app whose task `noop` is an "
                     "async no-op, its defaults otherwise (finished jobs kept, LISTEN/NOTIFY). Schema by "
                     "`procrastinate schema --apply`; jobs preloaded through `procrastinate_defer_jobs_v1`. "
                     "Processed: jobs `succeeded`.",
}


def markdown(result: dict) -> str:
    cells = result["cells"]
    workers = result["workers"]
    versions = result["versions"]
    systems = [s for s in ("skiplock", "pgqueuer", "procrastinate") if s in versions]
    rates: dict[tuple[str, int], list[float]] = {}
    for c in cells:
        rates.setdefault((c["system"], c["workers"]), []).append(c["jobs_per_s"])

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    lines = [
        SECTION,
        "",
        f"Written by `{result['command']}` (`bench/peers_libs.py`), started {result['started']}, "
        f"{result['elapsed_min']:.1f} min, skiplock at commit {result['commit']}. The same cluster settings as above, "
        "each system in its own database, driven this time through its own worker library with a no-op handler, "
        f"N worker processes a cell, each preloaded with {result['jobs']:,} no-op jobs; jobs/s counted from the "
        f"database over a {result['seconds']:g} s window opened {result['warmup']:g} s after the first job was "
        f"processed and every worker connected (start-up not charged); {result['rounds']} interleaved rounds (every system at every N, then again).",
        "",
        f"- Server: {result.get('postgres', '?')}",
        f"- Machine: {result.get('machine', '?')}; load average when the run began {result['load_before']}",
        "- Versions: " + ", ".join(f"{LABELS[k].split(' (')[0] if k in LABELS else k} {v}" for k, v in versions.items())
        + " (PgQueuer and Procrastinate from PyPI into .peers/venv by `make peers-packages`, each schema by its own CLI)",
        "",
        "Jobs a second, the mean of the rounds (each round's figure after it); in brackets the ratio to skiplock's "
        "client at the same N; ⚠ a cell with a note below.",
        "",
        "| system | driven through | " + " | ".join(f"{n} workers" for n in workers) + " |",
        "|---|---|" + "--:|" * len(workers),
    ]
    for s in systems:
        values = []
        for n in workers:
            got = rates.get((s, n))
            if not got:
                values.append("–")
                continue
            ours = rates.get(("skiplock", n))
            ratio = f" ({mean(got) / mean(ours):.2f}×)" if ours and s != "skiplock" else ""
            flag = " ⚠" if any(c["note"] for c in cells if c["system"] == s and c["workers"] == n) else ""
            each = " / ".join(f"{v:,.0f}" for v in got)
            values.append(f"{mean(got):,.0f}{ratio}{flag} ({each})" if len(got) > 1 else f"{mean(got):,.0f}{ratio}{flag}")
        label = LABELS[s] + (f" {versions[s]}" if versions.get(s) else "")
        lines.append(f"| {label} | {result['driven'][s]} | " + " | ".join(values) + " |")
    loads = [f"{c['system']} {c['workers']} round {c['round']}: {c['load']}" for c in cells]
    notes = [f"- {c['system']}, {c['workers']} workers, round {c['round']}: {c['note']}" for c in cells if c["note"]]
    if notes:
        lines += ["", "⚠ cells:", *notes]
    lines += ["", "Load average as each window opened: " + "; ".join(loads) + ".", "", "What each driver does:", ""]
    lines += [f"- **{LABELS[s].split(' (')[0]}**: {ABOUT[s]}" for s in systems]
    lines += ["", "Every system runs N processes of its own worker with that worker's defaults (each opens the "
              "connections its library opens): the same number of workers and of Python interpreters, on the "
              "same 2 cores as the server, so at 16 workers the clients' own CPU weighs on every figure."]
    if result["errors"]:
        lines += ["", "Errors:", ""] + [f"- {k}: `{v.splitlines()[0] if v else ''}`" for k, v in result["errors"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
