"""What moves a W2 cell's rate as it goes on (issue 55, item 3): `python -m bench.claim_walk`.

Graphile Worker's W2 driver and skiplock's take_locked + finish_locked loop, one after the other
on one cluster (bench-peers' settings), each a cell of --seconds at --clients over a preload of
--preload jobs. Every --every seconds a separate session reads pg_stat_statements: the shared
buffers that the workers' take statement touched per call over the interval (a count, not a
time: the machine's load does not change it), beside the table's dead tuples and its autovacuums;
pgbench's progress lines give the rate over the same intervals. A claim that walks the index
entries of the rows deleted since the last vacuum touches more buffers as the cell
goes on, and fewer after each vacuum: that is what a short cell does not see.
Needs the peers installed (`make peers-packages`); prints a table per system and writes
bench/out/claim_walk.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import psycopg

from bench import designs, peers, pgbench
from bench.progress import log
from skiplock import devdb

OUT = Path(__file__).resolve().parent / "out" / "claim_walk.json"


SETTINGS = {**peers.SETTINGS, "shared_preload_libraries": "'pg_stat_statements'"}
SYSTEMS = {
    # name: (database, pgbench script, the take statement's text in pg_stat_statements, its table)
    "graphile": (peers.GRAPHILE.dbname, "peers/graphile_process.sql", "%SET attempts = jobs.attempts +%",
                 "_private_jobs"),
    "skiplock": (designs.SKIPLOCK.dbname, "process_locked.sql", "%queue.take_locked(%", "live_tasks"),
}


def sample(conn: psycopg.Connection, take: str, table: str) -> dict:
    calls, buffers = conn.execute(
        "SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(shared_blks_hit + shared_blks_read), 0)::bigint "
        "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND query LIKE %s", (take,)).fetchone()
    dead, vacuums = conn.execute(
        "SELECT n_dead_tup, autovacuum_count FROM pg_stat_user_tables WHERE relname = %s", (table,)).fetchone()
    return {"calls": calls, "buffers": buffers, "dead": dead, "autovacuums": vacuums}


def cell(cluster: devdb.Cluster, name: str, preload: int, clients: int, seconds: float, every: float) -> dict:
    dbname, script, take, table = SYSTEMS[name]
    system = peers.GRAPHILE if name == "graphile" else peers.SKIPLOCK
    url = cluster.url(dbname)
    with psycopg.connect(url, autocommit=True) as conn:
        for sql in system.reset_sql:
            conn.execute(sql)
        assert system.preload is not None
        system.preload(conn, preload)
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    samples = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_reset()")
        conn.execute("SELECT pg_stat_statements_reset()")
        begun, last = time.monotonic(), {"calls": 0, "buffers": 0}
        proc = pgbench.start(cluster, dbname, script, clients, seconds, {**system.variables}, progress=every)
        while proc.poll() is None:
            time.sleep(every)
            if proc.poll() is None:
                now = sample(conn, take, table)
                calls = now["calls"] - last["calls"]
                samples.append({"t": round(time.monotonic() - begun, 1), "takes": calls, "dead": now["dead"],
                                "autovacuums": now["autovacuums"],
                                "buffers": (now["buffers"] - last["buffers"]) / calls if calls else 0.0})
                last = now
        summary = pgbench.finish(proc, script, clients)
    rates = summary.progress
    log(f"  {name}: {summary.tps:,.0f} tx/s over {seconds:g} s; buffers a take "
        + ", ".join(f"{s['buffers']:.0f}" for s in samples))
    return {"system": name, "preload": preload, "clients": clients, "seconds": seconds, "tps": summary.tps,
            "progress": rates, "samples": samples}


def table(result: dict) -> str:
    lines = [f"### {result['system']}: {result['tps']:,.0f} tx/s over {result['seconds']:g} s, preload "
             f"{result['preload']:,}, {result['clients']} clients", "",
             "| t (s) | tx/s (pgbench's progress) | takes in the interval | buffers a take | dead tuples | autovacuums |",
             "|---|---|---|---|---|---|"]
    for s in result["samples"]:
        rate = next((p["tps"] for p in result["progress"] if abs(p["t"] - s["t"]) <= 2.5), None)
        lines.append(f"| {s['t']:g} | {rate if rate is not None else '—'} | {s['takes']:,} | {s['buffers']:.1f} | "
                     f"{s['dead']:,} | {s['autovacuums']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--preload", type=int, default=540_000)
    ap.add_argument("--every", type=float, default=5)
    ap.add_argument("--systems", default="graphile,skiplock")
    a = ap.parse_args(argv)
    errors: dict[str, str] = {}
    results = []
    with devdb.stopped_on_signals():
        cluster = devdb.Cluster(durable=True, settings=SETTINGS).start()
        try:
            ok = peers.setup(cluster, errors)
            for name in a.systems.split(","):
                if name not in ok:
                    raise SystemExit(f"{name} did not install: {errors}")
                results.append(cell(cluster, name, a.preload, a.clients, a.seconds, a.every))
        finally:
            cluster.stop()
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(results, indent=1))
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"load average at the end: {load}\n")
    for r in results:
        print(table(r))


if __name__ == "__main__":
    main()
