"""Cost as the work grows (`make bench-scale`, or `python -m bench.scale`; issue 55, item 4).

Each point is one database on one cluster (default durability, autovacuum_naptime 1 s), seeded
by writing rows straight into the tables (the seeding is not what is measured), then measured:
  - W1: 16 clients enqueue one task a transaction into a random stage (the backlog grows by what
    they enqueue: the table says how much);
  - W2: 16 clients take one task of a random stage by row lock (take_locked), finish it
    (finish_locked) and enqueue its replacement in the same transaction, so that the backlog
    keeps its size however long the cell runs (scripts/scale_w2.sql; the enqueue is in every
    point, so the ratios compare like with like);
  - throughput and p99 latency of each, from pgbench's per-transaction log;
  - the time of maintain(), rotate_partitions() and of reading each monitoring view whole, and a
    page of queue.tasks (one stage, newest 50), median of three.
The points: a live backlog of 10 thousand, 1 million and 10 million tasks in one stage (one
database, grown between points); 1 million tasks in 1,000 and in 100,000 stages (seed 004's
tenants); 1 million live tasks beside a history of --history rows (default 50 million).
Sizes are options: `--live 10000,1000000 --stage-counts 1000 --history 5000000` where the disk or
the time does not allow the full run. Targets: W2 at the largest backlog >= 0.8x W2 at the
smallest; at the most stages >= 0.8x at one stage; every monitoring view under 1 s.
Writes bench/out/scale.json, the section "Cost as the work grows" of bench/RESULTS.md and
bench/scale.png. Timed: run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import psycopg

from bench import pgbench
from bench.progress import log
from skiplock import devdb, migrate

BENCH_DIR = Path(__file__).resolve().parent
OUT = BENCH_DIR / "out" / "scale.json"
RESULTS = BENCH_DIR / "RESULTS.md"
PLOT = BENCH_DIR / "scale.png"
BEGIN, END = "<!-- scale: written by bench/scale.py -->", "<!-- /scale -->"
SETTINGS = {"autovacuum_naptime": "'1s'"}
VIEWS = ("stats", "hourly", "metrics", "errors", "finished_totals", "stage_config")
CHUNK = 1_000_000


@dataclass
class Point:
    name: str
    live: int
    stages: int
    history: int
    w1_tps: float = 0.0
    w1_p99_ms: float = 0.0
    w1_enqueued: int = 0
    w2_tps: float = 0.0
    w2_p99_ms: float = 0.0
    seconds_ms: dict[str, float] = field(default_factory=dict)  # maintain, rotate, each view, the page


def add_live(conn: psycopg.Connection, count: int, stages: int) -> None:
    """count ready tasks, due a minute ago, spread over stages s1 … s<stages>, in chunks."""
    done = 0
    while done < count:
        n = min(CHUNK, count - done)
        conn.execute("""
            INSERT INTO queue.live_tasks (stage, run_at, payload)
            SELECT 's' || (1 + (g %% %(stages)s::bigint))::text, pg_catalog.now() - interval '1 minute', '{"doc": 42}'
              FROM pg_catalog.generate_series(%(first)s::bigint, %(last)s::bigint) g""",
                     {"stages": stages, "first": done, "last": done + n - 1})
        done += n
    conn.execute("VACUUM ANALYZE queue.live_tasks")


def add_history(conn: psycopg.Connection, count: int, stages: int) -> None:
    """count finished runs (one in 50 fatal) over today's history partition, in chunks."""
    conn.execute("SELECT count(*) FROM queue.rotate_partitions()")
    done = 0
    while done < count:
        n = min(CHUNK, count - done)
        conn.execute("""
            INSERT INTO queue.history (id, stage, status, priority, run_at, payload, attempt, worker, error_text,
                                       created, started, finished)
            SELECT 1000000000 + g, 's' || (1 + (g %% %(stages)s::bigint))::text,
                   CASE WHEN g %% 50 = 0 THEN 'fatal' ELSE 'done' END::queue.task_status,
                   0, f.at, '{"doc": 42}', 1, 'worker-1',
                   CASE WHEN g %% 50 = 0 THEN 'ValueError: bad input ' || (g %% 5)::text END,
                   f.at - interval '2 seconds', f.at - interval '1 second', f.at
              FROM pg_catalog.generate_series(%(first)s::bigint, %(last)s::bigint) g,
                   LATERAL (SELECT pg_catalog.date_trunc('day', pg_catalog.now())
                                   + (pg_catalog.now() - pg_catalog.date_trunc('day', pg_catalog.now()))
                                     * (g::float8 / %(total)s::float8) AS at) f""",
                     {"stages": stages, "first": done, "last": done + n - 1, "total": count})
        done += n
    conn.execute("VACUUM ANALYZE queue.history")
    # What the workers' maintain() keeps doing: the hourly roll-up, at most a day a call (rows
    # written straight into history are rolled up as a day of finishes would have been).
    while conn.execute("SELECT m.count FROM queue.maintain() m WHERE m.task = 'roll_up_hours'").fetchone()[0]:
        pass


def cell(cluster: devdb.Cluster, dbname: str, script: str, stages: int, clients: int,
         seconds: float) -> tuple[float, float]:
    """pgbench for `seconds`: transactions a second and the p99 latency (ms) from its log."""
    with tempfile.TemporaryDirectory(prefix="skiplock-scale-") as logs:
        cmd = pgbench.command(script, clients, seconds, {"stages": str(stages)})
        cmd += ["--log", f"--log-prefix={logs}/tx"]
        out = subprocess.run(cmd, env=pgbench.environment(cluster, dbname), capture_output=True, text=True, cwd="/")
        summary = pgbench.parse(out.stdout + out.stderr, out.returncode, script, clients)
        latencies = sorted(int(line.split()[2]) for f in Path(logs).iterdir() for line in f.read_text().splitlines()
                           if line.strip())
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] / 1000 if latencies else float("nan")
    return summary.tps, p99


def timed(conn: psycopg.Connection, sql: str, rounds: int = 3) -> float:
    """Median wall time (ms) of running sql and fetching all its rows."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        conn.execute(sql).fetchall()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def measure(cluster: devdb.Cluster, dbname: str, point: Point, clients: int, seconds: float) -> Point:
    url = cluster.url(dbname)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        before = conn.execute("SELECT count(*) FROM queue.live_tasks").fetchone()[0]
    point.w2_tps, point.w2_p99_ms = cell(cluster, dbname, "scale_w2.sql", point.stages, clients, seconds)
    point.w1_tps, point.w1_p99_ms = cell(cluster, dbname, "scale_w1.sql", point.stages, clients, seconds)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET jit = off")
        point.w1_enqueued = conn.execute("SELECT count(*) FROM queue.live_tasks").fetchone()[0] - before
        point.seconds_ms["maintain()"] = timed(conn, "SELECT * FROM queue.maintain()")
        point.seconds_ms["rotate_partitions()"] = timed(conn, "SELECT * FROM queue.rotate_partitions()")
        for view in VIEWS:
            point.seconds_ms[f"queue.{view}"] = timed(conn, f"SELECT * FROM queue.{view}")
        point.seconds_ms["a page of queue.tasks"] = timed(
            conn, "SELECT id, status, run_at FROM queue.tasks WHERE stage = 's1' ORDER BY id DESC LIMIT 50")
    log(f"  {point.name}: W2 {point.w2_tps:,.0f}/s p99 {point.w2_p99_ms:.1f} ms, W1 {point.w1_tps:,.0f}/s "
        f"p99 {point.w1_p99_ms:.1f} ms; slowest read {max(point.seconds_ms.values()):,.0f} ms")
    return point


def database(cluster: devdb.Cluster, name: str) -> str:
    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    migrate.upgrade(cluster.url(name))
    return name


def run(live: list[int], stage_counts: list[int], history: int, clients: int, seconds: float) -> list[Point]:
    cluster = devdb.Cluster(durable=True, settings=SETTINGS).start()
    points: list[Point] = []
    try:
        db = database(cluster, "scale_live")
        have = 0
        for size in sorted(live):
            log(f"scale: {size:,} live tasks in one stage (seeding {size - have:,})")
            with psycopg.connect(cluster.url(db), autocommit=True) as conn:
                conn.execute("SET synchronous_commit = off")
                add_live(conn, size - have, 1)
                have = conn.execute("SELECT count(*) FROM queue.live_tasks").fetchone()[0]
            points.append(measure(cluster, db, Point(f"{size:,} live, 1 stage", size, 1, 0), clients, seconds))
        middle = 1_000_000 if 1_000_000 in live else sorted(live)[len(live) // 2]
        for stages in stage_counts:
            log(f"scale: {middle:,} live tasks in {stages:,} stages")
            db = database(cluster, f"scale_stages_{stages}")
            with psycopg.connect(cluster.url(db), autocommit=True) as conn:
                conn.execute("SET synchronous_commit = off")
                add_live(conn, middle, stages)
            points.append(measure(cluster, db, Point(f"{middle:,} live, {stages:,} stages", middle, stages, 0),
                                  clients, seconds))
        if history:
            log(f"scale: {middle:,} live tasks and {history:,} history rows")
            db = database(cluster, "scale_history")
            with psycopg.connect(cluster.url(db), autocommit=True) as conn:
                conn.execute("SET synchronous_commit = off")
                add_live(conn, middle, 1)
                add_history(conn, history, 1)
            points.append(measure(cluster, db, Point(f"{middle:,} live, {history:,} history", middle, 1, history),
                                  clients, seconds))
    finally:
        cluster.stop()
    return points


def verdicts(points: list[Point]) -> list[str]:
    one = [p for p in points if p.stages == 1 and not p.history]
    lines = []
    if len(one) > 1:
        small, large = one[0], one[-1]
        ratio = large.w2_tps / small.w2_tps
        lines.append(f"- W2 at {large.live:,} live tasks / at {small.live:,}: **{ratio:.2f}x** (target >= 0.8x: "
                     f"{'met' if ratio >= 0.8 else 'missed'})")
    many = [p for p in points if p.stages > 1]
    base = next((p for p in one if many and p.live == many[-1].live), None)
    if many and base:
        ratio = many[-1].w2_tps / base.w2_tps
        lines.append(f"- W2 with {many[-1].stages:,} stages / with one: **{ratio:.2f}x** (target >= 0.8x: "
                     f"{'met' if ratio >= 0.8 else 'missed'})")
    slowest = max(((ms, name, p.name) for p in points for name, ms in p.seconds_ms.items()
                   if name.startswith("queue.") and name != "a page of queue.tasks"), default=None)
    if slowest:
        ms, name, where = slowest
        lines.append(f"- Slowest monitoring view: {name}, {ms:,.0f} ms at {where} (target < 1 s: "
                     f"{'met' if ms < 1000 else 'missed'})")
    return lines


def markdown(points: list[Point], clients: int, seconds: float) -> str:
    reads = list(points[0].seconds_ms) if points else []
    lines = [BEGIN, "## Cost as the work grows", "",
             f"`python -m bench.scale` ({clients} clients, {seconds:g} s cells, default durability; "
             f"written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}). W2 takes, finishes and enqueues a "
             "replacement in one transaction (the backlog keeps its size); W1 enqueues. Reads: median ms of three.",
             "", "| point | W2 /s | W2 p99 ms | W1 /s | W1 p99 ms | W1 added | " + " | ".join(reads) + " |",
             "|---" * (6 + len(reads)) + "|"]
    for p in points:
        lines.append(f"| {p.name} | {p.w2_tps:,.0f} | {p.w2_p99_ms:.1f} | {p.w1_tps:,.0f} | {p.w1_p99_ms:.1f} | "
                     f"{p.w1_enqueued:,} | " + " | ".join(f"{p.seconds_ms.get(r, float('nan')):,.1f}" for r in reads) + " |")
    lines += ["", *verdicts(points), "", "![W2 and W1 as the work grows](scale.png)", END]
    return "\n".join(lines) + "\n"


def plot(points: list[Point], path: Path = PLOT) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (by_live, by_stages) = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, chosen, x, label in ((by_live, [p for p in points if p.stages == 1 and not p.history], "live",
                                  "live tasks (one stage)"),
                                 (by_stages, [p for p in points if not p.history and p.live == (
                                     [q.live for q in points if q.stages > 1] or [0])[0]], "stages", "stages")):
        xs = [getattr(p, x) for p in chosen]
        ax.plot(xs, [p.w2_tps for p in chosen], marker="o", label="W2 (take, finish, enqueue)")
        ax.plot(xs, [p.w1_tps for p in chosen], marker="s", label="W1 (enqueue)")
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("transactions/s")
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def write(points: list[Point], clients: int, seconds: float, results: Path = RESULTS) -> None:
    """The JSON, the section of results (replaced where it is already), and the plot beside it."""
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps([asdict(p) for p in points], indent=1))
    section = markdown(points, clients, seconds)
    text = results.read_text() if results.exists() else ""
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END) + 1:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    results.write_text(text)
    plot(points, results.parent / PLOT.name)


def main(argv: list[str] | None = None) -> None:
    ints: Callable[[str], list[int]] = lambda s: [int(x.replace("_", "")) for x in s.split(",") if x]  # noqa: E731
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--live", type=ints, default=[10_000, 1_000_000, 10_000_000])
    ap.add_argument("--stage-counts", type=ints, default=[1_000, 100_000])
    ap.add_argument("--history", type=int, default=50_000_000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--no-write", action="store_true", help="print the table; leave RESULTS.md alone")
    a = ap.parse_args(argv)
    points = run(a.live, a.stage_counts, a.history, a.clients, a.seconds)
    if a.no_write:
        print(markdown(points, a.clients, a.seconds))
    else:
        write(points, a.clients, a.seconds)
        print(markdown(points, a.clients, a.seconds))


if __name__ == "__main__":
    main()
