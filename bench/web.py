"""What `skiplock web` costs (`make bench-web`, or `python -m bench.web`; `make bench` runs it after
the pgbench workloads and writes bench/WEB.md): each page's time and a live refresh's database
time on a large queue, and what an open dashboard takes from workers running at full speed.

The database: --live tasks (default 1,000,000) in --stages stages (100), mostly ready, some
scheduled later, running (5 %, leases a day long) and waiting for a retry, and --history finished
rows (10,000,000) spread evenly over the last 7 days (the default retention keeps 30), a few of
them fatal with a handful of error texts. Rows are written straight into the tables (as the
superuser) and analyzed, then maintain() rolls history up (queue.finished_hours): the seeding is
not what is measured. --db URL --reuse keeps the database for the next run with the same sizes.

Measured, --rounds times each (median and worst), as the login of an admin:
  - every page, through the app in-process (Starlette's TestClient: routing, the queries as the
    login, the templates), the overview's refresh fragment and the chart's (uncached) among them;
  - the database time of one live refresh (the overview's queries, run on one connection).
With --throughput SECONDS: --workers processes take and finish tasks in batches of 10 (each from
its own stages, enqueueing as many as they finish, so the backlog keeps its size) for that long,
alone and while a client fetches the overview's refresh fragment every 2 s, --pairs times, which
goes first alternating; the ratio of tasks per second with and without is the dashboard's cost to
the workers (the app runs in this process, on the same machine).

The issue's targets: pages under 200 ms, a refresh under 20 ms of database time, the workers
slowed by under 5 %. Timed, so run it on an otherwise idle machine (not in `make test`).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import threading
import time
from typing import Any, Callable

import psycopg
import psycopg.sql

from skiplock import devdb, migrate, ops

DBNAME = "bench_web"
CHART_TTL_NOTE = "5 min"  # skiplock.web.CHART_TTL; the bench reads the chart uncached
HISTORY_DAYS = 7  # the history rows are spread evenly over this many days up to now


def seed(url: str, live: int, history: int, stages: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        # The partitions of the last HISTORY_DAYS days, today's and those ahead.
        conn.execute("SELECT count(*) FROM queue.rotate_partitions(pg_catalog.now() - %s * interval '1 day')",
                     (HISTORY_DAYS,))
        conn.execute("SELECT count(*) FROM queue.rotate_partitions()")
        conn.execute("ALTER TABLE queue.live_tasks DROP CONSTRAINT IF EXISTS live_tasks_valid")
        conn.execute("""
            INSERT INTO queue.live_tasks (stage, status, priority, run_at, payload, attempt, lease, lease_expires,
                                          worker, error_text, started)
            SELECT pg_catalog.format('stage-%%s', pg_catalog.lpad((g %% %(stages)s)::text, 3, '0')),
                   s.status::queue.task_status_live, g %% 3, s.run_at,
                   pg_catalog.jsonb_build_object('n', g, 'file', pg_catalog.format('doc-%%s.pdf', g)),
                   CASE WHEN s.status = 'error' THEN 1 + g %% 4 WHEN s.status = 'running' THEN 1 ELSE 0 END,
                   CASE WHEN s.status = 'running' THEN pg_catalog.gen_random_uuid() END,
                   CASE WHEN s.status = 'running' THEN pg_catalog.now() + interval '1 day' END,  -- not reaped by a later run
                   CASE WHEN s.status = 'running' THEN pg_catalog.format('worker-%%s', g %% 16) END,
                   CASE WHEN s.status = 'error' THEN pg_catalog.format('TimeoutError: call %%s timed out', g %% 7) END,
                   CASE WHEN s.status = 'running' THEN pg_catalog.now() - interval '3 seconds' END
              FROM pg_catalog.generate_series(1, %(live)s) g,
                   LATERAL (SELECT CASE WHEN g %% 20 = 0 THEN 'running' WHEN g %% 10 = 1 THEN 'error' ELSE 'ready' END AS status,
                                   CASE WHEN g %% 10 = 2 THEN pg_catalog.now() + interval '1 hour'
                                        ELSE pg_catalog.now() - interval '1 minute' END AS run_at) s""",
                     {"live": live, "stages": stages})
        conn.execute("""
            INSERT INTO queue.history (id, stage, status, priority, run_at, payload, attempt, worker, error_text,
                                       created, started, finished)
            SELECT %(live)s + g, pg_catalog.format('stage-%%s', pg_catalog.lpad((g %% %(stages)s)::text, 3, '0')),
                   CASE WHEN g %% 50 = 0 THEN 'fatal' WHEN g %% 97 = 0 THEN 'cancelled' ELSE 'done' END::queue.task_status,
                   0, f.at, '{"n": 1}', 1, 'worker-1',
                   CASE WHEN g %% 50 = 0 THEN pg_catalog.format('ValueError: bad input %%s', g %% 5) END,
                   f.at - interval '2 seconds', f.at - interval '1 second', f.at
              FROM pg_catalog.generate_series(1, %(history)s) g,
                   LATERAL (SELECT pg_catalog.now() - %(days)s * interval '1 day' * (1 - g::float8 / %(history)s) AS at) f""",
                     {"live": live, "history": history, "stages": stages, "days": HISTORY_DAYS})
        conn.execute("VACUUM ANALYZE queue.live_tasks")
        conn.execute("VACUUM ANALYZE queue.history")


def timed(fn: Callable[[], Any], rounds: int) -> tuple[float, float]:
    fn()  # warm: plans, caches, a pooled connection
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), max(times)


def pages(url: str, rounds: int) -> list[tuple[str, float, float]]:
    from starlette.testclient import TestClient

    from skiplock import web
    with psycopg.connect(url, autocommit=True) as conn:
        live_id = conn.execute("SELECT id FROM queue.live_tasks WHERE stage = 'stage-001' AND status = 'error' LIMIT 1").fetchone()[0]
        done_id = conn.execute("SELECT id FROM queue.history WHERE stage = 'stage-001' LIMIT 1").fetchone()[0]
        rows, cursor = ops.tasks(conn, "stage-001", ops.Filters())
    results = []
    web.CHART_TTL = 0  # the chart's fragment computed on every request, as it is every 5 minutes
    with TestClient(web.create_app(url, allowed_hosts=("testserver",))) as client:
        for path in ("/", "/fragment/overview", "/fragment/chart", "/stage/stage-001", f"/stage/stage-001?before={cursor}",
                     "/stage/stage-001?status=error", "/stage/stage-001?status=scheduled", "/stage/stage-001?status=done",
                     "/stage/stage-001?status=fatal", "/stage/stage-001?error=timed+out", f"/task/{live_id}",
                     f"/task/{done_id}", "/failures", "/failures?stage=stage-001", "/schedules", "/sql", "/workers"):
            def get(p: str = path) -> None:
                r = client.get(p)
                assert r.status_code == 200, (p, r.status_code, r.text[:500])
            median, worst = timed(get, rounds)
            results.append((path, median, worst))
    return results


def refresh_db_time(url: str, rounds: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """The live refresh's queries, and the chart's (which the app reads at most every web.CHART_TTL s)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET jit = off")  # as the app's connections
        return (timed(lambda: (ops.who(conn), ops.overview(conn)), rounds),
                timed(lambda: ops.hourly(conn, 24), max(1, rounds // 2)))


def _worker(url: str, stages: list[str], stop_at: float, counter: Any) -> None:
    """Takes and finishes batches of 10 from one of its stages, the next one when that is empty, and
    enqueues as many into the stage as it finished: the backlog keeps its size over every run (it
    ran out in the later runs before, and each run with the dashboard came after one without)."""
    done = at = 0
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < stop_at:
            got = conn.execute("SELECT count(queue.finish(t.id, t.lease)) FROM queue.take_next(%s, 10) t",
                               (stages[at],)).fetchone()[0]
            done += got
            if got:
                conn.execute("SELECT count(*) FROM queue.enqueue_batch(pg_catalog.array_fill('{}'::jsonb, ARRAY[%s]), %s)",
                             (got, stages[at]))
            else:
                at = (at + 1) % len(stages)
    with counter.get_lock():
        counter.value += done


def throughput(url: str, workers: int, seconds: float, dashboard: bool, stages: int = 100) -> float:
    counter = multiprocessing.Value("q", 0)
    stop_at = time.monotonic() + seconds
    procs = [multiprocessing.Process(target=_worker, args=(url, [f"stage-{k:03d}" for k in range(i, stages, workers)] or
                                                           [f"stage-{i % stages:03d}"], stop_at, counter))
             for i in range(workers)]
    for p in procs:
        p.start()
    refresher = None
    if dashboard:
        def refresh() -> None:
            from starlette.testclient import TestClient

            from skiplock import web
            with TestClient(web.create_app(url, allowed_hosts=("testserver",))) as client:
                while time.monotonic() < stop_at:
                    client.get("/fragment/overview")
                    time.sleep(2)
        refresher = threading.Thread(target=refresh)
        refresher.start()
    for p in procs:
        p.join()
    if refresher:
        refresher.join()
    return counter.value / seconds


def _machine() -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} CPUs, {platform.platform()}; load average (1, 5, 15 min) at the start: {load}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.web", description=__doc__.split("\n\n")[0])
    parser.add_argument("--live", type=int, default=1_000_000, help="live tasks (default 1,000,000)")
    parser.add_argument("--history", type=int, default=10_000_000, help="finished rows (default 10,000,000)")
    parser.add_argument("--stages", type=int, default=100, help="stages (default 100)")
    parser.add_argument("--rounds", type=int, default=5, help="timed requests per page (default 5)")
    parser.add_argument("--throughput", type=float, default=0, metavar="SECONDS",
                        help="also measure workers' throughput without and with the dashboard open, SECONDS each")
    parser.add_argument("--pairs", type=int, default=2,
                        help="--throughput: alternate that many runs without and with the dashboard (default 2)")
    parser.add_argument("--workers", type=int, default=16, help="worker processes for --throughput (default 16)")
    parser.add_argument("--db", help="a server URL to create the database on (default: a throwaway cluster)")
    parser.add_argument("--reuse", action="store_true",
                        help=f"with --db: keep the database {DBNAME} of an earlier run with the same sizes (upgraded, not seeded again)")
    parser.add_argument("--out", help="also write the report (markdown) to this file, e.g. bench/WEB.md")
    args = parser.parse_args(argv)

    report: list[str] = []

    def say(line: str = "") -> None:
        print(line, flush=True)
        report.append(line)

    cluster = None if args.db else devdb.Cluster(durable=False).start()
    admin = args.db or cluster.url()  # type: ignore[union-attr]
    try:
        sizes = f"bench.web seeded: live {args.live} history {args.history} stages {args.stages}"
        with psycopg.connect(admin, autocommit=True) as conn:
            seeded = conn.execute("SELECT pg_catalog.shobj_description(d.oid, 'pg_database') FROM pg_catalog.pg_database d"
                                  " WHERE d.datname = %s", (DBNAME,)).fetchone()
            reuse = args.reuse and seeded is not None and seeded[0] == sizes
            if not reuse:
                conn.execute(f'DROP DATABASE IF EXISTS "{DBNAME}" WITH (FORCE)')
                conn.execute(f'CREATE DATABASE "{DBNAME}"')
            server = conn.execute("SELECT pg_catalog.version()").fetchone()[0]
        url = psycopg.conninfo.make_conninfo(admin, dbname=DBNAME)
        migrate.upgrade(url)
        start = time.perf_counter()
        if not reuse:
            seed(url, args.live, args.history, args.stages)
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'COMMENT ON DATABASE "{DBNAME}" IS {psycopg.sql.quote(sizes)}')
        with psycopg.connect(url, autocommit=True) as conn:
            # What the workers' maintain() keeps doing: the hourly rollup, at most a day a call.
            while conn.execute("SELECT m.count FROM queue.maintain() m WHERE m.task = 'roll_up_hours'").fetchone()[0]:
                pass
        say("# What the dashboard costs (`python -m bench.web`)")
        say()
        say(f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {' '.join(['python -m bench.web', *(argv or [])])}")
        say()
        say(f"- {_machine()}")
        if os.getloadavg()[0] > (os.cpu_count() or 1) / 2:
            say("- the machine was busy with other work when the run began: read the times as upper bounds")
        say(f"- {server}")
        say(f"- {'reused' if reuse else 'seeded'} {args.live:,} live tasks in {args.stages} stages and {args.history:,} "
            f"history rows over {HISTORY_DAYS} days, rolled up by maintain(), in {time.perf_counter() - start:.0f} s")
        say()
        say(f"| page | median ms | worst ms (of {args.rounds}) |\n|---|---:|---:|")
        for path, median, worst in pages(url, args.rounds):
            say(f"| `{path}` | {median:.1f} | {worst:.1f} |")
        (median, worst), (chart_median, chart_worst) = refresh_db_time(url, args.rounds)
        say()
        say(f"- a live refresh (the overview's queries), database round trips: median {median:.1f} ms, worst {worst:.1f} ms")
        say(f"- the chart's query (queue.hourly, last 24 h; the app reads it at most every {CHART_TTL_NOTE}): "
            f"median {chart_median:.1f} ms, worst {chart_worst:.1f} ms")
        if args.throughput:
            with psycopg.connect(admin, autocommit=True) as conn:  # the workers take from the backlog: seed again next time
                conn.execute(f'COMMENT ON DATABASE "{DBNAME}" IS NULL')
            ratios, totals = [], [0.0, 0.0]
            for i in range(args.pairs):  # alternately first: what a run leaves behind (dead rows) weighs on both
                if i % 2 == 0:
                    alone = throughput(url, args.workers, args.throughput, False, args.stages)
                    watched = throughput(url, args.workers, args.throughput, True, args.stages)
                else:
                    watched = throughput(url, args.workers, args.throughput, True, args.stages)
                    alone = throughput(url, args.workers, args.throughput, False, args.stages)
                ratios.append(watched / alone)
                totals[0], totals[1] = totals[0] + alone, totals[1] + watched
                say(f"- {args.workers} workers, {args.throughput:.0f} s each: {alone:,.0f} tasks/s alone, {watched:,.0f} tasks/s "
                    f"with the dashboard refreshing every 2 s: ratio {watched / alone:.3f}")
            say(f"- ratio with / without the dashboard, median of {len(ratios)}: {statistics.median(ratios):.3f} "
                f"({(1 - statistics.median(ratios)) * 100:+.1f} % slower); all runs with over all without: "
                f"{totals[1] / totals[0]:.3f}")
        if args.out:
            with open(args.out, "w") as f:
                f.write("\n".join(report) + "\n")
    finally:
        if cluster is not None:
            cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
