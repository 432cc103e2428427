"""`skiplock stats` (queue.stats as a table) and `skiplock top` (queue.metrics, refreshing live).

top's rates are queue.metrics' finished_last_minute / 60: a count over a sliding window read with
one index range scan per stage, exact whatever the refresh interval and cheap on a large history.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time

import psycopg
from rich.console import Console
from rich.live import Live
from rich.table import Table

from skiplock import connect
from skiplock.db import one

# Statuses in the order a task lives through them.
ORDER = ("ready", "running", "error", "done", "fatal", "cancelled")
LIVE = ("ready", "running", "error")
FINAL = ("done", "fatal", "cancelled")


NEGATIVE_AGE = ("a negative age: tasks made in the future by the server's clock now, which was set back "
                "since (docs/reliability.md, \"Clock jumps\")")


def _age(value: dt.timedelta | float | None) -> str:
    if value is None:
        return ""
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else float(value)
    if seconds < 0:  # made later than now by the server's clock: it was set back since (NEGATIVE_AGE)
        return "-" + _age(-seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    if seconds < 86400:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    return f"{int(seconds // 86400)}d{int(seconds % 86400 // 3600):02d}h"


def _when(at: dt.datetime | None, now: dt.datetime) -> str:
    if at is None:
        return ""
    return "now" if at <= now else "in " + _age(at - now)


def _sort(rows: list[tuple]) -> list[tuple]:
    return sorted(rows, key=lambda r: (r[0], ORDER.index(r[1]) if r[1] in ORDER else 99))


def paused_stages(conn: psycopg.Connection) -> set[str]:
    """Stages that workers take nothing of (queue.stage_config.paused); '*' when the defaults are paused."""
    return {r[0] for r in conn.execute("SELECT stage FROM queue.stage_config WHERE paused").fetchall()}


def _mark_paused(table: Table, paused: set[str], shown: set[str]) -> None:
    """A caption naming the paused stages: their due tasks wait as ready, and nothing else says why."""
    named = sorted(paused & shown) + (["'*' (the defaults: every stage without its own row)"] if "*" in paused else [])
    if named:
        note = f"paused: {', '.join(named)} (workers take nothing of them; skiplock resume STAGE)"
        table.caption = f"{table.caption}; {note}" if table.caption else note


def _stage_label(stage: str, paused: set[str]) -> str:
    return f"{stage} (paused)" if stage in paused else stage


def stats_table(conn: psycopg.Connection, stages: list[str] | None) -> Table:
    now = one(conn.execute("SELECT now()"))[0]
    rows = conn.execute(
        "SELECT stage, status::text, tasks, due, oldest_age, next_run_at, lease_expired "
        "  FROM queue.stats WHERE %(stages)s::text[] IS NULL OR stage = ANY(%(stages)s::text[])",
        {"stages": stages}).fetchall()
    table = Table(title="skiplock: tasks per stage and status (queue.stats)", title_justify="left")
    table.add_column("stage", overflow="fold")
    table.add_column("status")
    for name in ("tasks", "due", "oldest age", "next run at", "lease expired"):
        table.add_column(name, justify="right")
    paused = paused_stages(conn)
    for stage, status, tasks, due, oldest, next_run, expired in _sort(rows):
        table.add_row(_stage_label(stage, paused), status, str(tasks), str(due) if status in LIVE else "", _age(oldest),
                      _when(next_run, now),
                      str(expired) if status == "running" else "",
                      style="red" if (status == "fatal" or expired) else None)
    if not rows:
        table.caption = "no tasks"
    elif any(r[4] is not None and r[4] < dt.timedelta(0) for r in rows):
        table.caption = NEGATIVE_AGE
    _mark_paused(table, paused, {r[0] for r in rows} | set(stages or ()))
    return table


def stats(url: str, args: argparse.Namespace) -> int:
    with connect.connect(url) as conn:
        Console().print(stats_table(conn, args.stage))
    return 0


def top_table(rows: list[tuple], interval: float, paused: set[str] | None = None) -> Table:
    table = Table(title=f"skiplock top (queue.metrics, every {interval:g} s)  {time.strftime('%H:%M:%S')}",
                  title_justify="left")
    table.add_column("stage", overflow="fold")
    table.add_column("status")
    table.add_column("tasks", justify="right")
    table.add_column("oldest / lag", justify="right")
    table.add_column("last min", justify="right")
    table.add_column("per second", justify="right")
    paused = paused or set()
    for stage, status, tasks, oldest, last_minute in _sort(rows):
        label = _stage_label(stage, paused)
        if status in LIVE:
            if not tasks:
                continue
            table.add_row(label, status, str(tasks), _age(oldest) if oldest else "", "", "",
                          style="yellow" if stage in paused else None)
        else:
            if not last_minute:
                continue
            table.add_row(label, status, "", "", str(last_minute), f"{last_minute / 60:.2f}",
                          style="red" if status == "fatal" else None)
    shown = {r[0] for r in rows if (r[1] in LIVE and r[2]) or (r[1] in FINAL and r[4])}
    for stage in sorted({r[0] for r in rows} - shown):
        table.add_row(_stage_label(stage, paused), "idle", "", "", "", "", style="dim")
    if not rows:
        table.caption = "no stages"
    _mark_paused(table, paused, {r[0] for r in rows})
    return table


def top(url: str, args: argparse.Namespace) -> int:
    done = 0
    with connect.connect(url) as conn:
        def frame() -> Table:
            rows = conn.execute(
                "SELECT stage, status, tasks, oldest_age_seconds, finished_last_minute FROM queue.metrics "
                " WHERE %(stages)s::text[] IS NULL OR stage = ANY(%(stages)s::text[])",
                {"stages": args.stage}).fetchall()
            return top_table(rows, args.interval, paused_stages(conn))

        try:
            with Live(frame(), console=Console(), auto_refresh=False) as live:
                done = 1
                while args.iterations is None or done < args.iterations:
                    time.sleep(args.interval)
                    live.update(frame(), refresh=True)
                    done += 1
        except KeyboardInterrupt:
            pass
    return 0
