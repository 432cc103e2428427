"""`make profile` (python -m bench.profile): where the hot path's calls spend their time.

One session on a throwaway cluster runs each worker loop below many times, with
synchronous_commit=off so that a commit waits for nothing and what is left is CPU. For each loop
it reports:
- per function: µs a call, in all and in its own body (pg_stat_user_functions, track_functions);
- per statement inside the functions: µs of execution a call (pg_stat_statements, track = all).
  That leaves out each statement's executor start-up and shutdown, so the statements add up to
  less than their function;
- per PL/pgSQL line: plprofiler's time for each statement, in a second pass so that it does
  not weigh on the first two. A line that opens an IF or a LOOP counts the statements inside
  it. This is what a statement costs at one call per transaction, start-up included: a PL/pgSQL
  expression is compiled again in each new transaction (a hint check of a few comparisons took
  1.1 µs in a loop inside one transaction and 5.8 µs with a commit between calls), so a loop of
  calls inside one transaction understates it. The profiler's own timing adds little; the
  report gives each function's time a call with it beside the time without, and the two have
  differed by up to 29 % from noise alone. Read one run's shares; to compare two versions of a
  function, time them in interleaved rounds instead.

    python -m bench.profile                  # 20,000 calls a loop, about a minute and a half
    python -m bench.profile --calls 5000

It prints Markdown and writes it to bench/out/profile.md. `make profile` installs Debian's
postgresql-15-plprofiler when it is missing.
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import psycopg

from bench.designs import PAYLOAD
from bench.progress import log
from skiplock import devdb, migrate

OUT_DIR = Path(__file__).resolve().parent / "out"
ROLE = "skiplock_profile"
# The same, with plprofiler loaded into its sessions: only a superuser may LOAD it.
LINES_ROLE = "skiplock_profile_lines"
WARM_UP = 2_000  # calls before measuring: every plan cached, every function compiled


def enqueue(conn: psycopg.Connection, n: int, stage: str) -> None:
    conn.autocommit = True
    for _ in range(n):
        conn.execute("SELECT queue.enqueue(%s::jsonb, %s)", (PAYLOAD, stage), prepare=True)


def take_locked(conn: psycopg.Connection, n: int, stage: str) -> None:
    conn.autocommit = False
    for _ in range(n):
        (task,) = conn.execute("SELECT t.id FROM queue.take_locked(%s) AS t", (stage,), prepare=True).fetchone()
        conn.execute("SELECT queue.finish_locked(%s, stage => %s)", (task, stage), prepare=True)
        conn.commit()


def finish_and_take(conn: psycopg.Connection, n: int, stage: str) -> None:
    conn.autocommit = True
    task, lease = None, None
    for _ in range(n):
        task, lease = conn.execute("SELECT t.id, t.lease FROM queue.finish_and_take(%s, %s, %s) AS t",
                                   (task, lease, stage), prepare=True).fetchone()


def take_next_finish(conn: psycopg.Connection, n: int, stage: str) -> None:
    conn.autocommit = True
    for _ in range(n):
        task, lease = conn.execute("SELECT t.id, t.lease FROM queue.take_next(%s) AS t", (stage,),
                                   prepare=True).fetchone()
        conn.execute("SELECT queue.finish(%s, %s, stage => %s)", (task, lease, stage), prepare=True)


# name, the loop, whether it needs ready tasks
LOOPS: tuple[tuple[str, Callable[[psycopg.Connection, int, str], None], bool], ...] = (
    ("enqueue", enqueue, False),
    ("take_locked + finish_locked, one transaction", take_locked, True),
    ("finish_and_take", finish_and_take, True),
    ("take_next + finish", take_next_finish, True),
)


def setup(cluster: devdb.Cluster) -> str:
    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE profile")
    url = cluster.url("profile")
    migrate.upgrade(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pg_stat_statements")
        conn.execute("CREATE EXTENSION plprofiler")
        # The loops run as a client of the queue, not as a superuser, which skips the ACL checks.
        conn.execute(f"CREATE ROLE {ROLE} LOGIN IN ROLE skiplock_producer, skiplock_worker")
        for function in ("pg_stat_reset()", "pg_stat_force_next_flush()", "pg_stat_statements_reset(oid, oid, bigint)"):
            conn.execute(f"GRANT EXECUTE ON FUNCTION {function} TO {ROLE}")
        conn.execute(f"CREATE ROLE {LINES_ROLE} LOGIN IN ROLE skiplock_producer, skiplock_worker")
        conn.execute(f"ALTER ROLE {LINES_ROLE} SET session_preload_libraries = 'plprofiler'")
    return url


def preload(url: str, stage: str, n: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT count(*) FROM queue.enqueue_batch(array_fill(%s::jsonb, ARRAY[%s]), %s)",
                     (PAYLOAD, n, stage))
        conn.execute("VACUUM ANALYZE queue.live_tasks")


def flush_statistics(conn: psycopg.Connection) -> None:
    """Make the session's pending function statistics visible to others: they go out when it
    next becomes idle."""
    conn.autocommit = True
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")


def timings(url: str, calls: int) -> tuple[list[tuple], list[tuple]]:
    with psycopg.connect(url, autocommit=True) as conn:
        functions = conn.execute(
            "SELECT funcname, calls, total_time * 1000 / calls, self_time * 1000 / calls"
            "  FROM pg_stat_user_functions WHERE schemaname = 'queue' AND calls > 0"
            " ORDER BY total_time DESC").fetchall()
        # The statements inside the functions (toplevel false), run about once a call or more.
        statements = conn.execute(
            "SELECT calls, mean_exec_time * 1000, regexp_replace(query, '\\s+', ' ', 'g')"
            "  FROM pg_stat_statements WHERE NOT toplevel AND calls >= %s"
            " ORDER BY total_exec_time DESC LIMIT 8", (calls // 2,)).fetchall()
    return functions, statements


def line_profile(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute("""
        SELECT p.proname, s.line_number, s.exec_count, s.total_time, src.source
          FROM pl_profiler_linestats_local() s
          JOIN pg_catalog.pg_proc p ON p.oid = s.func_oid
          JOIN pl_profiler_funcs_source(ARRAY(SELECT DISTINCT func_oid FROM pl_profiler_linestats_local())) src
            ON src.func_oid = s.func_oid AND src.line_number = s.line_number
         WHERE s.exec_count > 0
         ORDER BY p.proname, s.line_number""").fetchall()


def clip(text: str, width: int) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= width else text[:width - 1] + "…"


def report_loop(name: str, calls: int, functions: list[tuple], statements: list[tuple],
                lines: list[tuple]) -> list[str]:
    out = [f"## {name}", "", f"{calls:,} calls, after {WARM_UP:,} to warm up.", "",
           "| function | calls | µs a call | of it, its own body |", "|---|--:|--:|--:|"]
    out += [f"| `{f}` | {c:,} | {total:.1f} | {own:.1f} |" for f, c, total, own in functions]
    out += ["", "| statement inside them | calls | µs of execution a call |", "|---|--:|--:|"]
    out += [f"| `{clip(q, 90)}` | {c:,} | {t:.1f} |" for c, t, q in statements]
    totals = {f: t for f, line, _, t, _ in lines if line == 0}
    runs_of = {f: runs for f, line, runs, _, _ in lines if line == 0}
    out += ["", "With plprofiler: " + ", ".join(f"`{f}` {t / runs_of[f]:.1f} µs a call" for f, t in totals.items()) + ".",
            "", "| function | line | runs | µs a run | share of the function | statement |",
            "|---|--:|--:|--:|--:|---|"]
    for f, line, runs, t, source in lines:
        if line == 0 or not source.strip() or source.strip() == "BEGIN":
            continue
        share = 100 * t / totals[f] if totals.get(f) else 0
        if share < 0.5:
            continue
        out.append(f"| `{f}` | {line} | {runs:,} | {t / runs:.1f} | {share:.0f} % | `{clip(source, 70)}` |")
    return out + [""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls a loop (default 20,000)")
    args = parser.parse_args(argv)
    settings = {"synchronous_commit": "off", "track_functions": "'pl'",
                "shared_preload_libraries": "'pg_stat_statements'", "pg_stat_statements.track": "all"}
    cluster = devdb.Cluster(durable=True, settings=settings).start()
    lines_out = ["# Where the hot path's calls spend their time", "",
                 f"`make profile` (`python -m bench.profile --calls {args.calls}`), "
                 f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node() or 'this machine'}: "
                 "one session, `synchronous_commit = off`, PostgreSQL's defaults otherwise. "
                 "How to read it: the docstring of `bench/profile.py`.", ""]
    try:
        url = setup(cluster)
        client_url = url.replace("postgres@", f"{ROLE}@", 1)
        lines_url = url.replace("postgres@", f"{LINES_ROLE}@", 1)
        for i, (name, loop, needs_tasks) in enumerate(LOOPS):
            stage = f"profile_{i}"
            if needs_tasks:
                preload(url, stage, 2 * (WARM_UP + args.calls))
            log(f"profile: {name}")
            with psycopg.connect(client_url) as conn:
                loop(conn, WARM_UP, stage)
                flush_statistics(conn)
                conn.execute("SELECT pg_stat_statements_reset(), pg_stat_reset()")
                loop(conn, args.calls, stage)
                flush_statistics(conn)
            functions, statements = timings(url, args.calls)
            with psycopg.connect(lines_url, autocommit=True) as conn:
                # Before the first call: plprofiler skips a function the session ran unprofiled.
                conn.execute("SELECT pl_profiler_set_enabled_local(true)")
                loop(conn, WARM_UP, stage)
                conn.autocommit = True
                conn.execute("SELECT pl_profiler_reset_local()")
                loop(conn, args.calls, stage)
                conn.autocommit = True
                conn.execute("SELECT pl_profiler_set_enabled_local(false)")
                lines = line_profile(conn)
            lines_out += report_loop(name, args.calls, functions, statements, lines)
    finally:
        cluster.stop()
    text = "\n".join(lines_out)
    print(text)
    OUT_DIR.mkdir(exist_ok=True)
    (OUT_DIR / "profile.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
