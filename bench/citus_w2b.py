"""W2b-style batches (take_next 100 + finish_batch 100) on one server against a Citus coordinator
with two workers, in one run: `python -m bench.citus_w2b [--seconds 10] [--clients 4]`.

Each pgbench client works its own stage; on Citus the stages are chosen so that half of them
live on each worker. Jobs/s is counted from the history rows written during the run. Both sides
run with default durability (Citus nodes must be: a cross-node finish commits in two phases). On a
2-core machine the three Citus servers and pgbench share the two cores: the ratio shows the
overhead of routing, not the speed-up of more machines. Writes nothing; prints a table.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from dev import citus
from skiplock import devdb, migrate

SCRIPT = """SELECT count(*) AS n, array_agg(t.id) AS ids, array_agg(t.lease) AS leases
  FROM queue.take_next('w2b_:k', batch => 100) AS t
\\gset
\\if :n > 0
SELECT queue.finish_batch(':ids', ':leases', stage => 'w2b_:k');
\\else
\\sleep 10 ms
\\endif
"""


def stages(base: int, step: int, clients: int) -> list[str]:
    return [f"w2b_{base + i * step}" for i in range(clients)]


def spread(url: str, clients: int) -> tuple[int, int]:
    """base and step such that the clients' stages alternate between the two workers."""
    with psycopg.connect(url) as conn:
        def node(stage: str) -> int:
            return conn.execute(
                "SELECT nodeport FROM pg_dist_shard_placement"
                " WHERE shardid = get_shard_id_for_distribution_column('queue.live_tasks', %s::text)", (stage,)).fetchone()[0]
        for step in range(1, 50):
            for base in range(0, 50):
                ports = [node(s) for s in stages(base, step, clients)]
                if all(ports[i] != ports[i + 1] for i in range(len(ports) - 1)):
                    return base, step
    raise RuntimeError("no spread of stages found")


def preload(url: str, names: list[str], per_stage: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for stage in names:
            conn.execute("INSERT INTO queue.live_tasks (stage, payload) SELECT %s, jsonb_build_object('n', g)"
                         " FROM generate_series(1, %s) g", (stage, per_stage))
        conn.execute("ANALYZE queue.live_tasks")


def run(node: devdb.Cluster, url: str, base: int, step: int, clients: int, seconds: int) -> tuple[float, float]:
    """(jobs/s, pgbench transactions/s)."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(SCRIPT)
    params = psycopg.conninfo.conninfo_to_dict(url)
    env = {"PGHOST": str(params["host"]), "PGPORT": str(params["port"]), "PGUSER": "postgres",
           "PGDATABASE": str(params["dbname"]), "PATH": "/usr/bin:/bin"}
    with psycopg.connect(url, autocommit=True) as conn:
        before = conn.execute("SELECT count(*) FROM queue.history").fetchone()[0]
        started = time.monotonic()
        out = subprocess.run([str(devdb.pg_bin() / "pgbench"), "--no-vacuum", "--protocol=simple",
                              f"--client={clients}", "--jobs=2", f"--time={seconds}", f"--file={f.name}",
                              f"--define=base={base}", f"--define=step={step}"],
                             env=env, capture_output=True, text=True, cwd="/")
        elapsed = time.monotonic() - started
        after = conn.execute("SELECT count(*) FROM queue.history").fetchone()[0]
        left = conn.execute("SELECT count(*) FROM queue.live_tasks WHERE status = 'ready'").fetchone()[0]
    Path(f.name).unlink()
    if out.returncode != 0:
        raise RuntimeError(out.stdout + out.stderr)
    if left == 0:
        raise RuntimeError("the backlog ran out: preload more")
    tps = float(out.stdout.split("tps = ")[1].split()[0])
    return (after - before) / elapsed, tps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--per-stage", type=int, default=150_000)
    args = ap.parse_args()
    global SCRIPT
    # each client's stage: w2b_<base + client_id * step>
    SCRIPT = "\\set k :base + :client_id * :step\n" + SCRIPT
    results = {}
    with citus.CitusCluster() as c:
        migrate.upgrade(c.url())
        subprocess.run([sys.executable, "-m", "skiplock", "distribute", "--db", c.url()], check=True, capture_output=True)
        base, step = spread(c.url(), args.clients)
        preload(c.url(), stages(base, step, args.clients), args.per_stage)
        results["citus"] = run(c.coordinator, c.url(), base, step, args.clients, args.seconds)
    with devdb.Cluster(durable=True) as one:
        url = one.createdb("skiplock")
        migrate.upgrade(url)
        preload(url, stages(base, step, args.clients), args.per_stage)
        results["one"] = run(one, url, base, step, args.clients, args.seconds)
    one_jobs, one_tps = results["one"]
    citus_jobs, citus_tps = results["citus"]
    print(f"| setup | jobs/s | pgbench tx/s | ratio |\n|---|--:|--:|--:|\n"
          f"| one server | {one_jobs:,.0f} | {one_tps:,.0f} | 1.00 |\n"
          f"| coordinator + 2 workers | {citus_jobs:,.0f} | {citus_tps:,.0f} | {citus_jobs / one_jobs:.2f} |")
    print(f"{args.clients} clients, {args.seconds} s each, one stage per client, batches of 100")


if __name__ == "__main__":
    main()
