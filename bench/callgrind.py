"""Instructions a loop costs in one backend, counted by valgrind's callgrind: is a variant cheaper?

    python -m bench.callgrind [--loop locked|next|enqueue|consume|drain] [--loops 300] [--tree PATH] [--top N] [--keep DIR]
                              [NAME=variant.sql ...]

One database, migrated by a checkout's `skiplock upgrade` (this one, or --tree: e.g. an older
revision) and filled with 60,000 tasks. For each NAME=file in turn (none: the build as it is), the
file is run as skiplock_owner (CREATE OR REPLACE the functions of a variant; make each file whole,
since variants run one after the other in the same database), then a single-user backend runs the
loop 50 times and, under a second valgrind, 50 + --loops times; the difference divided by --loops
is one loop. Printed: the total, the claim's index walk (index_getnext_slot), and the rest. Compare
the rest: under valgrind a loop takes milliseconds, so the claim position's rescan from the
beginning (every 5 s of wall clock) walks a number of dead index entries that varies from run to
run by ±20 k instructions a loop, while the rest repeats within ±3 k. Only statement execution is
counted (not start-up, shutdown or the checkpoint); the top-level statements are parsed each time,
as they are not in a prepared pgbench run (about 48 k a loop, the same in every variant).
Needs valgrind and callgrind_annotate; root, as the backend runs as the postgres user.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg

from skiplock import devdb

ROOT = Path(__file__).resolve().parents[1]
LOOPS = {
    "locked": "BEGIN\nSELECT queue.finish_locked(t.id) FROM queue.take_locked('cg') t\nCOMMIT\n",
    "next": "SELECT queue.finish(t.id, t.lease) FROM queue.take_next('cg') t\n",
    "enqueue": "SELECT queue.enqueue('{}'::jsonb, 'cg.in')\n",
    # 100 tasks a loop (divide by 100 for one task); a variant uses (2 x 50 + --loops) x 100 of the 60,000
    # preloaded tasks: --loops 100 for two variants.
    "consume": "SELECT count(*) FROM queue.consume('cg', 100)\n",
    "drain": "SELECT count(*) FROM queue.drain('cg', 100)\n",
}
COUNTED = ("PortalRun", "CommitTransactionCommand", "StartTransactionCommand", "pg_parse_query",
           "pg_analyze_and_rewrite_fixedparams", "pg_plan_queries")
WARM = 50


def inclusive(out: Path) -> dict[str, int]:
    """Inclusive instructions by function name, and the run's total under "TOTAL"."""
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
                          capture_output=True, text=True, check=True).stdout
    found: dict[str, int] = {}
    for line in text.splitlines():
        if "PROGRAM TOTALS" in line:
            found["TOTAL"] = int(line.split()[0].replace(",", ""))
        m = re.match(r"\s*([\d,]+) \([ \d.]+%\)\s+\S*?:(\w+)", line)
        if m:
            found[m.group(2)] = found.get(m.group(2), 0) + int(m.group(1).replace(",", ""))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.callgrind", description=__doc__.split("\n\n")[0])
    parser.add_argument("--loop", choices=sorted(LOOPS), default="locked")
    parser.add_argument("--loops", type=int, default=300)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose migrations build the database")
    parser.add_argument("--top", type=int, default=0, metavar="N",
                        help="also print the N functions of most inclusive instructions a loop")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="keep callgrind's output files there (NAME.LOOPS.out), for callgrind_annotate --tree=caller")
    parser.add_argument("variants", nargs="*", help="NAME=file.sql, applied in turn")
    args = parser.parse_args(argv)
    variants = [v.split("=", 1) for v in args.variants] or [["as-built", ""]]
    cluster = devdb.Cluster(durable=False).start()
    try:
        url = cluster.createdb("cg")
        subprocess.run([sys.executable, "-m", "skiplock", "--db", url, "upgrade"], cwd=args.tree,
                       check=True, capture_output=True, timeout=600)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[10000]), 'cg') FROM generate_series(1, 6)")
        binaries = cluster._bin()
        as_postgres = ["runuser", "-u", "postgres", "--"]
        pg_ctl = [*as_postgres, str(binaries / "pg_ctl"), "-D", str(cluster.datadir), "-w"]
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            os.chmod(work, 0o777)
            for name, variant in variants:
                with psycopg.connect(url, autocommit=True) as conn:
                    if variant:
                        conn.execute("SET ROLE skiplock_owner")
                        conn.execute(Path(variant).read_text())
                        conn.execute("RESET ROLE")
                    conn.execute("VACUUM ANALYZE")
                subprocess.run([*pg_ctl, "-m", "fast", "stop"], check=True, capture_output=True, cwd="/")
                counts: dict[int, dict[str, int]] = {}
                for loops in (WARM, WARM + args.loops):
                    script = work / f"loop{loops}.sql"
                    script.write_text(LOOPS[args.loop] * loops)
                    out = work / f"cg.{loops}.out"
                    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                                *(f"--toggle-collect={f}" for f in COUNTED)]
                    backend = [str(binaries / "postgres"), "--single", "-D", str(cluster.datadir),
                               "-c", "fsync=off", "-c", "wal_init_zero=off", "cg"]
                    with script.open() as stdin:
                        subprocess.run([*as_postgres, *valgrind, *backend], stdin=stdin, capture_output=True,
                                       check=True, cwd="/")
                    counts[loops] = inclusive(out)
                    if args.keep:
                        args.keep.mkdir(parents=True, exist_ok=True)
                        shutil.copy(out, args.keep / f"{name}.{loops}.out")
                subprocess.run([*pg_ctl, "-l", str(work / "server.log"), "start"], check=True, capture_output=True, cwd="/")
                per = {k: (counts[WARM + args.loops].get(k, 0) - counts[WARM].get(k, 0)) / args.loops / 1000
                       for k in ("TOTAL", "index_getnext_slot")}
                print(f"{name:>12}: {args.loop} loop {per['TOTAL']:7.1f} k instructions, of which the claim's "
                      f"index walk {per['index_getnext_slot']:6.1f} k, the rest {per['TOTAL'] - per['index_getnext_slot']:7.1f} k",
                      flush=True)
                if args.top:
                    diff = {k: (v - counts[WARM].get(k, 0)) / args.loops / 1000 for k, v in counts[WARM + args.loops].items()}
                    ranked = sorted((kv for kv in diff.items() if kv[0] != "TOTAL"), key=lambda kv: -kv[1])
                    for k, v in ranked[:args.top]:
                        print(f"{'':>14}{v:7.1f} k  {k}")
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
