"""The operator's reads and actions, shared by `skiplock web` and the CLI verbs (cmd_ops).

Every read is one or two queries on what skiplock_monitor may read (queue.tasks,
queue.stage_config, queue.hourly, queue.schedules, queue.live_counts(), queue.workers(),
queue.recent_errors(), and
queue._history_stages(), which the views call); every action is a call of a
queue.* function (retry, cancel, set_priority, configure_stage, run_schedule_now) in one short
transaction on the caller's connection, as the login the user gave: the database decides who may
do what, and a role without the right gets its 42501.

Lists of live tasks filter on `finished IS NULL`: in queue.tasks the live branch has finished
NULL by construction and history is partitioned by finished, so the history branch is pruned to
its default partition. Lists of finished tasks filter on `finished IS NOT NULL`, which drops the
live branch, and page by (finished, id) along history's (stage, finished) index.

The web and the CLI often run as an admin or a superuser whose search_path holds a schema other
roles may create in (PostgreSQL 14's public): a comparison for whose types pg_catalog has no exact
operator (the enum queue.task_status against a literal) is written OPERATOR(pg_catalog.=) with a
cast, or another role's exact-typed `=` there would run with the caller's rights (issue 54, item 1).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from skiplock.db import one

LIVE = ("ready", "scheduled", "running", "error")
FINAL = ("done", "fatal", "cancelled")
PAGE = 50                  # rows of a task list
PAYLOAD_SHOWN = 20_000     # characters of a payload or result a page shows
BULK_CHUNK = 500           # tasks one bulk transaction retries or cancels
SAMPLE_PAGES = 250         # pages of live tasks the overview's counts read on a large queue (queue.live_counts)
RECENT_ROWS = 200          # a stage's newest runs the overview counts; more in the last minute: scaled from their span

# The stages the login may not see: restricted ones (grant_stage) unless it is a member of a role
# granted on them, or of skiplock_admin. The views leave their rows out themselves
# (queue._hidden_stages); every read here filters its stages with `NOT IN hidden` as well, and a
# page of a hidden stage says "No such stage" rather than showing it empty.
HIDDEN = """
    hidden AS (
        SELECT h.stage FROM pg_catalog.unnest(queue._hidden_stages()) AS h(stage))
"""


@dataclass
class Who:
    user: str
    admin: bool              # may act: a member of skiplock_admin (the database checks again on each call)
    run_now: bool            # queue.run_schedule_now(text) exists in this database


def who(conn: psycopg.Connection) -> Who:
    user, admin, run_now = one(conn.execute(
        "SELECT current_user::text, pg_catalog.pg_has_role(current_user, 'skiplock_admin', 'MEMBER'),"
        "       pg_catalog.to_regprocedure('queue.run_schedule_now(text)') IS NOT NULL"))
    return Who(user, admin, run_now)


def overview(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """One row a visible stage (configured, with live tasks or schedules, or with runs in the last
    day): live counts and lag (queue.live_counts: exact on a small table, from a block sample of
    SAMPLE_PAGES pages on a large one, with estimated true), the last minute's finishes (a range of
    history's (stage, finished) index, at most RECENT_ROWS rows a stage: a busier stage's rate is
    scaled from the span of its newest RECENT_ROWS runs, estimated true), pause and limits."""
    cur = conn.cursor(row_factory=dict_row)
    return cur.execute(f"""
        WITH {HIDDEN},
        config AS MATERIALIZED (   -- read once (it probes every stage of the live tasks), not once a join
            SELECT c.stage, c.paused, c.max_running, c.group_limit, c.restricted FROM queue.stage_config c),
        live AS MATERIALIZED (   -- estimated from a sample on a large table (queue.live_counts), running exact
            SELECT l.stage, l.ready, l.scheduled, l.running, l.error, l.lag, l.estimated
              FROM queue.live_counts(%(sample_pages)s) l),
        stages AS (
            SELECT st.stage, coalesce(c.paused, d.paused) AS paused, coalesce(c.max_running, d.max_running) AS max_running,
                   coalesce(c.group_limit, d.group_limit) AS group_limit, coalesce(c.restricted, false) AS restricted
              FROM (SELECT c.stage FROM config c WHERE c.stage <> '*'
                    UNION
                    SELECT l.stage FROM live l) st
              LEFT JOIN config c ON c.stage = st.stage
              LEFT JOIN config d ON d.stage = '*'
             WHERE st.stage NOT IN (SELECT x.stage FROM hidden x)),
        recent AS (   -- each stage's newest runs of the last minute, at most RECENT_ROWS of them
            SELECT s.stage, r.runs, r.oldest, r.done, r.fatal, r.cancelled
              FROM stages s
              CROSS JOIN LATERAL (
                    SELECT pg_catalog.count(*) AS runs, pg_catalog.min(t.finished) AS oldest,
                           pg_catalog.count(*) FILTER (WHERE t.status OPERATOR(pg_catalog.=) 'done'::queue.task_status) AS done,
                           pg_catalog.count(*) FILTER (WHERE t.status OPERATOR(pg_catalog.=) 'fatal'::queue.task_status) AS fatal,
                           pg_catalog.count(*) FILTER (WHERE t.status OPERATOR(pg_catalog.=) 'cancelled'::queue.task_status) AS cancelled
                      FROM (SELECT t.status, t.finished
                              FROM queue.tasks t
                             WHERE t.stage = s.stage
                               AND t.finished > pg_catalog.now() - interval '1 minute'
                               AND t.finished <= pg_catalog.now()     -- prunes the partitions made ahead
                             ORDER BY t.finished DESC
                             LIMIT %(recent_rows)s) t) r),
        rate AS (   -- per minute: counted, or scaled from the span of the newest RECENT_ROWS
            SELECT r.stage, r.runs >= %(recent_rows)s AS scaled,
                   CASE WHEN r.runs >= %(recent_rows)s
                        THEN 60 / GREATEST(pg_catalog.date_part('epoch', pg_catalog.now() - r.oldest), 0.001)
                        ELSE 1 END AS per_min,
                   r.done, r.fatal, r.cancelled
              FROM recent r)
        SELECT s.stage, s.paused, s.max_running, s.group_limit, s.restricted,
               coalesce(l.ready, 0) AS ready, coalesce(l.scheduled, 0) AS scheduled, coalesce(l.running, 0) AS running,
               coalesce(l.error, 0) AS error, l.lag, coalesce(l.estimated, false) OR r.scaled AS estimated,
               pg_catalog.round(r.done * r.per_min)::bigint AS done_per_min,
               pg_catalog.round(r.fatal * r.per_min)::bigint AS failed_per_min,
               pg_catalog.round(r.cancelled * r.per_min)::bigint AS cancelled_per_min
          FROM stages s
          LEFT JOIN live l ON l.stage = s.stage
          JOIN rate r ON r.stage = s.stage
         ORDER BY s.stage""", {"recent_rows": RECENT_ROWS, "sample_pages": SAMPLE_PAGES}).fetchall()


def hourly(conn: psycopg.Connection, hours: int = 24, stage: str | None = None) -> list[dict[str, Any]]:
    """Finished runs per hour over the last `hours` (visible stages, or one), from queue.hourly."""
    cur = conn.cursor(row_factory=dict_row)
    return cur.execute(f"""
        WITH {HIDDEN}
        SELECT h.hour, pg_catalog.sum(h.done)::bigint AS done, pg_catalog.sum(h.fatal)::bigint AS fatal,
               pg_catalog.sum(h.cancelled)::bigint AS cancelled
          FROM queue.hourly h
         WHERE h.hour > pg_catalog.now() - pg_catalog.make_interval(hours => %(hours)s)
           AND h.stage NOT IN (SELECT x.stage FROM hidden x)
           AND (%(stage)s::text IS NULL OR h.stage = %(stage)s)
         GROUP BY h.hour ORDER BY h.hour""", {"hours": hours, "stage": stage}).fetchall()


def stage_visible(conn: psycopg.Connection, stage: str) -> dict[str, Any] | None:
    cur = conn.cursor(row_factory=dict_row)
    return cur.execute(f"""
        WITH {HIDDEN}
        SELECT %(stage)s AS stage, coalesce(c.paused, d.paused) AS paused, coalesce(c.max_running, d.max_running) AS max_running,
               coalesce(c.group_limit, d.group_limit) AS group_limit, coalesce(c.restricted, false) AS restricted
          FROM queue.stage_config d
          LEFT JOIN queue.stage_config c ON c.stage = %(stage)s
         WHERE d.stage = '*' AND %(stage)s NOT IN (SELECT x.stage FROM hidden x)""", {"stage": stage}).fetchone()


@dataclass
class Filters:
    status: str = "live"     # live (every live status), one of LIVE or one of FINAL
    key: str = ""
    group: str = ""
    error: str = ""          # a substring of the error text
    id: int | None = None
    before: str = ""         # keyset cursor: "id" for live lists, "finished|id" for finished ones


COLUMNS = ("t.id, t.stage, t.status::text AS status, t.priority, t.key, t.group_key, t.attempt, t.run_at, "
           "t.created, t.updated, t.started, t.finished, t.worker, t.lease_expires, "
           "pg_catalog.left(t.error_text, 300) AS error, pg_catalog.left(t.payload::text, 200) AS payload_head")


def tasks(conn: psycopg.Connection, stage: str, f: Filters, limit: int = PAGE) -> tuple[list[dict[str, Any]], str]:
    """A page of the stage's tasks under the filters, newest first, and the cursor of the next page ('' at the end).

    A final status other than 'done' reads history only in the hours queue.hourly counts runs of
    that status in (the last 7 days): a stage with no fatal run reads no history row at all. Past
    those hours the next page ("older") reads what is older than the 7 days, unbounded."""
    final = f.status in FINAL
    args: dict[str, Any] = {"stage": stage, "key": f.key or None, "grp": f.group or None, "err": f.error or None,
                            "id": f.id, "limit": limit + 1}
    where = ["t.stage = %(stage)s",
             "t.finished IS NOT NULL" if final else "t.finished IS NULL",
             "(%(key)s::text IS NULL OR t.key = %(key)s)",
             "(%(grp)s::text IS NULL OR t.group_key = %(grp)s)",
             "(%(err)s::text IS NULL OR pg_catalog.strpos(t.error_text, %(err)s) > 0)",
             "(%(id)s::bigint IS NULL OR t.id = %(id)s)"]
    if f.status == "scheduled":
        where.append("t.status OPERATOR(pg_catalog.=) 'ready'::queue.task_status AND t.run_at > pg_catalog.now()")
    elif f.status == "ready":
        where.append("t.status OPERATOR(pg_catalog.=) 'ready'::queue.task_status AND t.run_at <= pg_catalog.now()")
    elif f.status != "live":
        args["status"] = f.status
        where.append("t.status OPERATOR(pg_catalog.=) %(status)s::queue.task_status")
    if final:
        order = "t.finished DESC, t.id DESC"
        if f.before:
            at, _, last = f.before.partition("|")
            args["at"], args["last"] = dt.datetime.fromisoformat(at), int(last)
            where.append("t.finished <= %(at)s AND (t.finished < %(at)s OR t.id < %(last)s)")
        if f.status != "done":
            return _rare_final(conn, stage, f.status, where, args, limit)
    else:
        order = "t.id DESC"
        if f.before:
            args["last"] = int(f.before)
            where.append("t.id < %(last)s")
    rows = _page(conn, where, args, order)
    cursor = ""
    if len(rows) > limit:
        rows = rows[:limit]
        last_row = rows[-1]
        cursor = f"{last_row['finished'].isoformat()}|{last_row['id']}" if final else str(last_row["id"])
    return rows, cursor


def _page(conn: psycopg.Connection, where: list[str], args: dict[str, Any], order: str) -> list[dict[str, Any]]:
    cur = conn.cursor(row_factory=dict_row)
    return cur.execute(f"SELECT {COLUMNS} FROM queue.tasks t WHERE {' AND '.join(where)} ORDER BY {order} LIMIT %(limit)s",
                       args).fetchall()


def _rare_final(conn: psycopg.Connection, stage: str, status: str, where: list[str], args: dict[str, Any],
                limit: int) -> tuple[list[dict[str, Any]], str]:
    """tasks() for fatal or cancelled: history read hour by hour where queue.hourly counts such runs,
    enough hours at a time for a page; then, on the next page, what is older than those 7 days."""
    order = "t.finished DESC, t.id DESC"
    at = args.get("at")
    start, hours, counts = one(conn.execute(
        "SELECT pg_catalog.date_trunc('hour', pg_catalog.now(), 'UTC') - interval '7 days',"
        "       coalesce(pg_catalog.array_agg(h.hour ORDER BY h.hour DESC), '{}'),"
        "       coalesce(pg_catalog.array_agg(h.runs ORDER BY h.hour DESC), '{}')"
        "  FROM (SELECT h.hour, CASE %(status)s WHEN 'fatal' THEN h.fatal ELSE h.cancelled END AS runs"
        "          FROM queue.hourly h WHERE h.stage = %(stage)s) h"
        " WHERE h.runs > 0 AND (%(at)s::timestamptz IS NULL OR h.hour <= %(at)s)",
        {"status": status, "stage": stage, "at": at}))
    if at is not None and at <= start:           # the "older" pages: what the 7 days do not cover
        return _unbounded_page(conn, where, args, order, limit)
    rows: list[dict[str, Any]] = []
    i = 0
    while i < len(hours) and len(rows) <= limit:
        n, j = counts[i], i + 1
        while n <= limit - len(rows) and j < len(hours):   # enough hours for the page, by their counts
            n, j = n + counts[j], j + 1
        window = {**args, "lo": hours[j - 1], "hi": hours[i] + dt.timedelta(hours=1), "limit": limit + 1 - len(rows)}
        rows += _page(conn, where + ["t.finished >= %(lo)s AND t.finished < %(hi)s"], window, order)
        i = j
    if len(rows) > limit:
        rows = rows[:limit]
        return rows, f"{rows[-1]['finished'].isoformat()}|{rows[-1]['id']}"
    older = one(conn.execute("SELECT EXISTS (SELECT FROM queue.tasks t WHERE t.stage = %s AND t.finished IS NOT NULL"
                             "                AND t.finished < %s)", (stage, start)))[0]
    return rows, (f"{start.isoformat()}|0" if older else "")


def _unbounded_page(conn: psycopg.Connection, where: list[str], args: dict[str, Any], order: str,
                    limit: int) -> tuple[list[dict[str, Any]], str]:
    rows = _page(conn, where, args, order)
    if len(rows) <= limit:
        return rows, ""
    rows = rows[:limit]
    return rows, f"{rows[-1]['finished'].isoformat()}|{rows[-1]['id']}"


def task(conn: psycopg.Connection, task_id: int) -> list[dict[str, Any]]:
    """Every row of the task (its live row and each finished run or stage), oldest first, payload and result bounded."""
    cur = conn.cursor(row_factory=dict_row)
    return cur.execute(f"""
        WITH {HIDDEN}
        SELECT t.id, t.stage, t.status::text AS status, t.priority, t.key, t.group_key, t.attempt, t.run_at,
               t.created, t.updated, t.started, t.finished, t.worker, t.lease_expires, t.repeat, t.run_as::text AS run_as,
               t.error_text AS error, t.finished - t.started AS run_time,
               pg_catalog.left(t.payload::text, {PAYLOAD_SHOWN}) AS payload,
               pg_catalog.length(t.payload::text) AS payload_length,
               pg_catalog.left(t.result::text, {PAYLOAD_SHOWN}) AS result,
               pg_catalog.length(t.result::text) AS result_length
          FROM queue.tasks t
         WHERE t.id = %s AND t.stage NOT IN (SELECT x.stage FROM hidden x)
         ORDER BY t.finished NULLS LAST, t.created""", (task_id,)).fetchall()


def errors(conn: psycopg.Connection, stage: str | None = None, limit: int = 200,
           since: dt.timedelta = dt.timedelta(hours=1)) -> list[dict[str, Any]]:
    """Failures grouped by stage and error text, most recent first: live tasks waiting for a retry
    and fatal runs of the last `since` (queue.recent_errors: bounded on a large queue; the live part
    estimated from a sample there unless a stage is given)."""
    cur = conn.cursor(row_factory=dict_row)
    return cur.execute(f"""
        WITH {HIDDEN}
        SELECT e.stage, e.error, e.tasks, e.last_seen, e.estimated FROM queue.recent_errors(%(stage)s, %(since)s) e
         WHERE e.stage NOT IN (SELECT x.stage FROM hidden x)
         ORDER BY e.last_seen DESC LIMIT %(limit)s""", {"stage": stage, "since": since, "limit": limit}).fetchall()


def schedules(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Cron schedules (queue.schedules) with their stage's pause, and periodic tasks (repeat) that are live."""
    cur = conn.cursor(row_factory=dict_row)
    return cur.execute(f"""
        WITH {HIDDEN}
        SELECT 'cron' AS kind, s.name, s.cron AS every, s.stage, s.timezone, s.next_fire AS next_run,
               s.last_fired AS last_run, NULL::bigint AS id, v.paused
          FROM queue.schedules s JOIN queue.stage_config v ON v.stage = s.stage
         WHERE s.stage NOT IN (SELECT x.stage FROM hidden x)
        UNION ALL
        SELECT 'repeat', NULL, t.repeat::text, t.stage, NULL, t.run_at, t.started, t.id, v.paused
          FROM queue.tasks t JOIN queue.stage_config v ON v.stage = t.stage
         WHERE t.finished IS NULL AND t.repeat IS NOT NULL AND t.stage NOT IN (SELECT x.stage FROM hidden x)
         ORDER BY 1, 2, 8""").fetchall()


def sql_tasks(conn: psycopg.Connection, stage: str, limit: int = PAGE) -> list[dict[str, Any]]:
    """A stage's SQL tasks (enqueue_sql): the live ones, then the latest finished with their results (bounded)."""
    cur = conn.cursor(row_factory=dict_row)
    return cur.execute(f"""
        WITH {HIDDEN}
        (SELECT t.id, t.status::text AS status, t.run_as::text AS run_as, t.run_at, t.finished,
                pg_catalog.left(t.payload ->> 'sql', 500) AS request, t.error_text AS error,
                pg_catalog.left(t.result::text, 2000) AS result
           FROM queue.tasks t
          WHERE t.stage = %(stage)s AND t.stage NOT IN (SELECT x.stage FROM hidden x)
            AND t.finished IS NULL AND t.run_as IS NOT NULL
          ORDER BY t.id DESC LIMIT %(limit)s)
        UNION ALL
        (SELECT t.id, t.status::text, t.run_as::text, t.run_at, t.finished,
                pg_catalog.left(t.payload ->> 'sql', 500), t.error_text, pg_catalog.left(t.result::text, 2000)
           FROM queue.tasks t
          WHERE t.stage = %(stage)s AND t.stage NOT IN (SELECT x.stage FROM hidden x)
            AND t.finished IS NOT NULL AND t.run_as IS NOT NULL
          ORDER BY t.finished DESC LIMIT %(limit)s)""", {"stage": stage, "limit": limit}).fetchall()


def workers(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Workers holding leases now: their running tasks per stage, the oldest start and the first lease to expire."""
    cur = conn.cursor(row_factory=dict_row)
    return cur.execute(f"""
        WITH {HIDDEN}
        SELECT w.worker, w.stage, w.running, w.since, w.lease_expires, w.expired
          FROM queue.workers() w   -- the running index (queue.tasks' status can use none)
         WHERE w.stage NOT IN (SELECT x.stage FROM hidden x)
         ORDER BY w.worker, w.stage""").fetchall()


# ---- actions: each one short transaction of queue.* calls, as the login ----

def retry(conn: psycopg.Connection, ids: list[int], stage: str | None = None) -> int:
    with conn.transaction():
        for task_id in ids:
            conn.execute("SELECT queue.retry(%s, %s)", (task_id, stage))
    return len(ids)


def cancel(conn: psycopg.Connection, ids: list[int], stage: str | None = None) -> int:
    with conn.transaction():
        for task_id in ids:
            conn.execute("SELECT queue.cancel(%s, %s)", (task_id, stage))
    return len(ids)


def set_priority(conn: psycopg.Connection, ids: list[int], priority: int, stage: str | None = None) -> int:
    with conn.transaction():
        for task_id in ids:
            conn.execute("SELECT queue.set_priority(%s, %s, %s)", (task_id, priority, stage))
    return len(ids)


def pause(conn: psycopg.Connection, stage: str, paused: bool = True) -> None:
    conn.execute("SELECT queue.configure_stage(%s, paused => %s)", (stage, paused))


def run_schedule_now(conn: psycopg.Connection, name: str) -> Any:
    return one(conn.execute("SELECT queue.run_schedule_now(%s)", (name,)))[0]


def retry_where(conn: psycopg.Connection, stage: str, error: str | None = None, status: str | None = None,
                exact: bool = False) -> int:
    """Retry every failed task of a stage (status error or fatal, or only `status`) whose error text
    holds `error` (equals it when exact): the ids are read first, then retried in transactions of
    BULK_CHUNK calls, so none holds locks for long. Returns how many were retried."""
    statuses = [status] if status else ["error", "fatal"]
    done = 0
    last: int | None = None
    while True:
        ids = [r[0] for r in conn.execute(
            "SELECT DISTINCT t.id FROM queue.tasks t"
            " WHERE t.stage = %(stage)s AND t.status::text = ANY(%(statuses)s)"
            "   AND (%(err)s::text IS NULL OR CASE WHEN %(exact)s THEN t.error_text = %(err)s"
            "                                       ELSE pg_catalog.strpos(t.error_text, %(err)s) > 0 END)"
            "   AND (%(last)s::bigint IS NULL OR t.id > %(last)s)"
            "   AND NOT EXISTS (SELECT FROM queue.tasks l WHERE l.id = t.id AND l.stage = t.stage"
            "                      AND ((l.finished IS NULL AND l.status OPERATOR(pg_catalog.<>) 'error'::queue.task_status) OR l.finished > t.finished))"
            " ORDER BY t.id LIMIT %(chunk)s",
            {"stage": stage, "statuses": statuses, "err": error, "exact": exact, "last": last,
             "chunk": BULK_CHUNK}).fetchall()]
        if not ids:
            return done
        done += retry(conn, ids, stage)
        last = ids[-1]
