"""One worker loop, two builds of skiplock, one cluster: is the new build slower?

    python -m bench.ab --old-tree /path/to/old/checkout [--loop locked|next|consume|enqueue] [--rounds 5]
                       [--seconds 15] [--clients 16] [--together] [--async-commit] [--tasks 400000]

Each build is a database migrated by its own checkout's `skiplock upgrade` (this checkout is
"new"). Every cell starts from the same state: the build's queue topped up to --tasks due tasks,
vacuumed, and a checkpoint (a queue that a cell could drain, or a vacuum or checkpoint that falls
into one build's cell, decides a round by itself). By default a round runs the loop on each build
in turn, the order alternating; --together runs both builds at once with half the clients each,
so that both share the machine's drift (about 10 % within seconds here), and --async-commit keeps
the disk's flush times out of the ratio. `--old-tree` at this checkout measures the harness's own
spread (an A/A run). The loops call only what both builds have (no `stage` argument): `locked` is
take_locked + finish_locked in one transaction, `next` is take_next + finish, `consume` is
consume(batch 100), `enqueue` one enqueue into another stage (W1). Prints tasks/s per cell and
the median and geometric mean of the ratios new/old.
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
    "enqueue": """SELECT queue.enqueue('{}', 'ab.in');
""",
}
TASKS_PER_TRANSACTION = {"consume": 100}  # a full batch; the others end one task a transaction


def build(cluster: devdb.Cluster, dbname: str, tree: Path) -> None:
    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    subprocess.run([sys.executable, "-m", "skiplock", "--db", cluster.url(dbname), "upgrade"], cwd=tree,
                   check=True, capture_output=True, timeout=600)


def reset(cluster: devdb.Cluster, dbname: str, tasks: int) -> None:
    """The build's queue back to `tasks` due tasks, vacuumed, and a checkpoint: a cell's start."""
    with psycopg.connect(cluster.url(dbname), autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM queue.live_tasks WHERE stage = 'ab'").fetchone()
        missing = tasks - (row[0] if row else 0)
        while missing > 0:
            n = min(missing, 10000)
            conn.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[%s]), 'ab')", (n,))
            missing -= n
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--old-tree", required=True, type=Path, help="a checkout of the build to compare against")
    parser.add_argument("--loop", choices=sorted(LOOPS), default="locked")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--async-commit", action="store_true",
                        help="synchronous_commit off: CPU decides, not the disk's flush times, which vary cell to cell")
    parser.add_argument("--together", action="store_true",
                        help="both builds at once, half the clients each: the machine's speed, which drifts by "
                             "10 %% over seconds here, is the same for both")
    parser.add_argument("--tasks", type=int, default=400_000, help="due tasks in each build at the start of each cell")
    args = parser.parse_args(argv)
    load = lambda: " ".join(Path("/proc/loadavg").read_text().split()[:3])  # noqa: E731
    log(f"load average before: {load()}")
    tps: dict[str, list[float]] = {"old": [], "new": []}
    with devdb.stopped_on_signals(), tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
        script.write(LOOPS[args.loop])
        script.flush()
        Path(script.name).chmod(0o644)
        cluster = devdb.Cluster(durable=True, settings={"synchronous_commit": "off"} if args.async_commit else None).start()
        try:
            build(cluster, "old", args.old_tree)
            build(cluster, "new", ROOT)
            for r in range(args.rounds):
                order = ("old", "new") if r % 2 == 0 else ("new", "old")
                if args.together:
                    for db in order:
                        reset(cluster, db, args.tasks)
                    procs = {db: pgbench.start(cluster, db, script.name, args.clients // 2, args.seconds)
                             for db in order}
                    for db in order:
                        s = pgbench.finish(procs[db], script.name, args.clients // 2)
                        tps[db].append(s.tps * TASKS_PER_TRANSACTION.get(args.loop, 1))
                    log(f"  round {r + 1} old: {tps['old'][-1]:,.0f} tasks/s, new: {tps['new'][-1]:,.0f}")
                    continue
                for db in order:
                    reset(cluster, db, args.tasks)
                    s = pgbench.run(cluster, db, script.name, args.clients, args.seconds)
                    tps[db].append(s.tps * TASKS_PER_TRANSACTION.get(args.loop, 1))
                    log(f"  round {r + 1} {db}: {tps[db][-1]:,.0f} tasks/s")
        finally:
            cluster.stop()
    ratios = [n / o for n, o in zip(tps["new"], tps["old"])]
    print(f"\n{args.loop} loop, {args.clients} clients, {args.seconds:g} s cells, {args.rounds} "
          f"{'rounds, both builds at once' if args.together else 'interleaved rounds'}, "
          f"synchronous_commit {'off' if args.async_commit else 'on'}, "
          f"load after {load()}")
    print(f"old {statistics.median(tps['old']):,.0f} tasks/s, new {statistics.median(tps['new']):,.0f}; "
          f"new/old per round {[round(x, 3) for x in ratios]}, median {statistics.median(ratios):.3f}, "
          f"geometric mean {statistics.geometric_mean(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
