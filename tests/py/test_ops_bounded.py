"""The dashboard's reads that stay bounded on a large queue (skiplock/ops.py), against real rows:
- task lists filtered by a rare final status (fatal, cancelled) read history hour by hour where
  queue.hourly counts such runs, then, on the "older" page, history older than those 7 days; paging
  must still walk every such run once, newest first, whatever hours they fell in;
- the overview's runs per minute count at most RECENT_ROWS rows a stage, a busier stage's rate
  scaled from the span of its newest runs (marked estimated)."""

from __future__ import annotations

from typing import Any

import psycopg

from skiplock import ops

HISTORY = """
    INSERT INTO queue.history (id, stage, status, priority, run_at, payload, attempt, created, started, finished)
    SELECT %(first)s + g, %(stage)s, %(status)s::queue.task_status, 0, f, '{}', 1, f, f, f
      FROM generate_series(1, %(n)s) g,
           LATERAL (SELECT pg_catalog.now() - %(from)s::interval
                           - (%(span)s::interval * ((g * 7919) %% 1000) / 1000.0) AS f) t"""


def add(conn: psycopg.Connection, stage: str, status: str, n: int, first: int, ago: str, span: str) -> None:
    """n history rows of the stage ending in status, spread over `span` ending `ago` before now."""
    conn.execute(HISTORY, {"stage": stage, "status": status, "n": n, "first": first, "from": ago, "span": span})


def walk(conn: psycopg.Connection, stage: str, status: str, limit: int = 7) -> tuple[list[tuple[Any, int]], int]:
    """Every page of the filtered list, following the cursors: (finished, id) in order, and the pages read."""
    seen: list[tuple[Any, int]] = []
    before, pages = "", 0
    while True:
        rows, before = ops.tasks(conn, stage, ops.Filters(status=status, before=before), limit=limit)
        pages += 1
        seen += [(r["finished"], r["id"]) for r in rows]
        if not before:
            return seen, pages
        assert pages < 1000, f"the cursor does not move: {before}"


def expected(conn: psycopg.Connection, stage: str, status: str) -> list[tuple[Any, int]]:
    return [(f, i) for f, i in conn.execute(
        "SELECT finished, id FROM queue.history WHERE stage = %s AND status = %s::queue.task_status"
        " ORDER BY finished DESC, id DESC", (stage, status))]


def test_a_rare_status_is_paged_through_every_hour_it_fell_in_and_the_older_history(conn: psycopg.Connection) -> None:
    add(conn, "pg.rare", "done", 3000, 0, "1 minute", "6 days 20 hours")
    add(conn, "pg.rare", "fatal", 40, 10_000, "2 minutes", "6 days 12 hours")    # in the 7 days, many hours
    add(conn, "pg.rare", "fatal", 9, 20_000, "8 days", "3 days")                  # older: the "older" pages
    add(conn, "pg.rare", "cancelled", 5, 30_000, "30 minutes", "1 hour")
    for status, limit in (("fatal", 7), ("cancelled", 2), ("done", 200)):
        seen, _ = walk(conn, "pg.rare", status, limit)
        assert seen == expected(conn, "pg.rare", status), status


def test_a_stage_without_the_status_reads_an_empty_page_and_offers_only_what_is_older(conn: psycopg.Connection) -> None:
    add(conn, "pg.clean", "done", 500, 40_000, "1 minute", "5 days")
    assert ops.tasks(conn, "pg.clean", ops.Filters(status="fatal")) == ([], "")
    add(conn, "pg.old", "done", 500, 50_000, "1 minute", "5 days")
    add(conn, "pg.old", "fatal", 3, 60_000, "9 days", "1 day")
    rows, cursor = ops.tasks(conn, "pg.old", ops.Filters(status="fatal"))
    assert rows == [] and cursor, "the 7 days hold none: an empty page, and a link to the older history"
    seen, pages = walk(conn, "pg.old", "fatal")
    assert seen == expected(conn, "pg.old", "fatal") and len(seen) == 3 and pages == 2


def test_the_overview_counts_a_quiet_stage_and_scales_a_busy_one(conn: psycopg.Connection) -> None:
    for stage in ("ov.quiet", "ov.busy"):    # listed as configured (runs are listed once rolled up)
        conn.execute("SELECT queue.configure_stage(%s, max_attempts => 5)", (stage,))
    add(conn, "ov.quiet", "done", 7, 70_000, "1 second", "40 seconds")
    add(conn, "ov.quiet", "fatal", 2, 71_000, "1 second", "40 seconds")
    busy = 4 * ops.RECENT_ROWS    # finished over the last 40 s: 6 a minute for every 1 of them
    add(conn, "ov.busy", "done", busy, 80_000, "0 seconds", "40 seconds")
    rows = {r["stage"]: r for r in ops.overview(conn)}
    quiet, loud = rows["ov.quiet"], rows["ov.busy"]
    assert (quiet["done_per_min"], quiet["failed_per_min"], quiet["estimated"]) == (7, 2, False)
    assert loud["estimated"] is True
    assert 0.75 * busy * 1.5 <= loud["done_per_min"] <= 1.25 * busy * 1.5, loud
