"""One worker loop, two builds of skiplock, one cluster, interleaved cells: is the new build slower?

    python -m bench.ab --old-tree /path/to/old/checkout [--loop locked|next|consume] [--rounds 5]
                       [--seconds 15] [--clients 16]

Each build is a database migrated by its own checkout's `skiplock upgrade` (this checkout is
"new"), filled with the same number of tasks. Each round runs the loop once on each build, the
order alternating, so that a machine whose load drifts favours neither. The loops call only what
both builds have (no `stage` argument): `locked` is take_locked + finish_locked in one
transaction, `next` is take_next + finish, `consume` is consume(batch 100). Prints tasks/s per cell
and the median ratio new/old.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg

from bench import pgbench
from bench.progress import log
from skiplock import devdb

ROOT = Path(__file__).resolve().parents[1]
LOOPS = {
    "locked": """BEGIN;
SELECT coalesce((SELECT t.id FROM queue.take_locked('ab') AS t), 0) AS id
\\gset
\\if :id = 0
ROLLBACK;
\\sleep 10 ms
\\else
\\startpipeline
SELECT queue.finish_locked(:id);
COMMIT;
\\endpipeline
\\endif
""",
    "next": """SELECT coalesce(t.id, 0) AS id,
       coalesce(t.lease, '00000000-0000-0000-0000-000000000000') AS lease
  FROM (VALUES (1)) AS one LEFT JOIN queue.take_next('ab') AS t ON true
\\gset
\\if :id > 0
SELECT queue.finish(:id, :lease);
\\else
\\sleep 10 ms
\\endif
""",
    "consume": """SELECT count(*) FROM queue.consume('ab', 100);
""",
}
TASKS_PER_TRANSACTION = {"consume": 100}  # a full batch; the others end one task a transaction


def build(cluster: devdb.Cluster, dbname: str, tree: Path, tasks: int) -> None:
    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    url = cluster.url(dbname)
    subprocess.run([sys.executable, "-m", "skiplock", "--db", url, "upgrade"], cwd=tree, check=True,
                   capture_output=True, timeout=600)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[10000]), 'ab') "
                     "FROM generate_series(1, %s)", (tasks // 10000,))
        conn.execute("VACUUM ANALYZE")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--old-tree", required=True, type=Path, help="a checkout of the build to compare against")
    parser.add_argument("--loop", choices=sorted(LOOPS), default="locked")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--tasks", type=int, default=400_000, help="tasks enqueued in each build first")
    args = parser.parse_args(argv)
    load = lambda: " ".join(Path("/proc/loadavg").read_text().split()[:3])  # noqa: E731
    log(f"load average before: {load()}")
    tps: dict[str, list[float]] = {"old": [], "new": []}
    with devdb.stopped_on_signals(), tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
        script.write(LOOPS[args.loop])
        script.flush()
        Path(script.name).chmod(0o644)
        cluster = devdb.Cluster(durable=True).start()
        try:
            build(cluster, "old", args.old_tree, args.tasks)
            build(cluster, "new", ROOT, args.tasks)
            for r in range(args.rounds):
                for db in (("old", "new") if r % 2 == 0 else ("new", "old")):
                    s = pgbench.run(cluster, db, script.name, args.clients, args.seconds)
                    tps[db].append(s.tps * TASKS_PER_TRANSACTION.get(args.loop, 1))
                    log(f"  round {r + 1} {db}: {tps[db][-1]:,.0f} tasks/s")
        finally:
            cluster.stop()
    ratios = [n / o for n, o in zip(tps["new"], tps["old"])]
    print(f"\n{args.loop} loop, {args.clients} clients, {args.seconds:g} s cells, {args.rounds} interleaved rounds, "
          f"load after {load()}")
    print(f"old {statistics.median(tps['old']):,.0f} tasks/s, new {statistics.median(tps['new']):,.0f}; "
          f"new/old per round {[round(x, 3) for x in ratios]}, median {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
