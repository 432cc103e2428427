"""The operator's verbs: `skiplock task ID`, `retry`, `cancel`, `pause`, `resume`, `priority`,
`schedules` (and `schedules run-now NAME`), and `web`, the dashboard.

Each verb is what the dashboard does (skiplock.ops): a read of the views, or calls of queue.*
functions in one short transaction, as the login of --db, so the database decides who may act.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from skiplock import connect, ops
from skiplock import web as web_app
from skiplock.cmd_stats import _age


def _ts(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S%z") if value else ""


def task(url: str, args: argparse.Namespace) -> int:
    with connect.connect(url) as conn:
        rows = ops.task(conn, args.id)
    if not rows:
        print(f"skiplock task: no task {args.id} (or not one this login may see)")
        return 1
    table = Table(title=f"task {args.id}: its live row and each finished run or stage", title_justify="left")
    for name in ("stage", "status", "attempt", "priority", "created", "started", "finished", "run time", "worker", "error"):
        table.add_column(name, overflow="fold")
    for r in rows:
        table.add_row(r["stage"], r["status"], str(r["attempt"]), str(r["priority"]), _ts(r["created"]), _ts(r["started"]),
                      _ts(r["finished"]), _age(r["run_time"]), r["worker"] or "", r["error"] or "",
                      style="red" if r["status"] == "fatal" else None)
    console = Console()
    console.print(table)
    cur = rows[-1]
    facts = {"run at": _ts(cur["run_at"]), "key": cur["key"], "group": cur["group_key"],
             "lease expires": _ts(cur["lease_expires"]), "repeat": cur["repeat"], "runs as": cur["run_as"]}
    for name, value in facts.items():
        if value:
            print(f"{name}: {value}")
    shown = f" (first {ops.PAYLOAD_SHOWN} of {cur['payload_length']} characters)" if cur["payload_length"] > ops.PAYLOAD_SHOWN else ""
    print(f"payload{shown}: {cur['payload']}")
    if cur["result"]:
        print(f"result: {cur['result']}")
    return 0


def retry(url: str, args: argparse.Namespace) -> int:
    if not args.ids and not args.stage:
        print("skiplock retry: give task ids, or --stage (with --error TEXT and/or --status fatal)")
        return 2
    with connect.connect(url) as conn:
        if args.ids:
            n = ops.retry(conn, args.ids, args.stage)
        else:
            n = ops.retry_where(conn, args.stage, error=args.error, status=args.status)
    print(f"retried {n}")
    return 0


def cancel(url: str, args: argparse.Namespace) -> int:
    with connect.connect(url) as conn:
        n = ops.cancel(conn, args.ids, args.stage)
    print(f"cancelled {n}")
    return 0


def priority(url: str, args: argparse.Namespace) -> int:
    with connect.connect(url) as conn:
        n = ops.set_priority(conn, args.ids, args.priority, args.stage)
    print(f"priority {args.priority} set on {n}")
    return 0


def pause(url: str, args: argparse.Namespace) -> int:
    paused = args.command == "pause"
    with connect.connect(url) as conn:
        for stage in args.stages:
            ops.pause(conn, stage, paused)
            print(f"{'paused' if paused else 'resumed'} {stage}")
    return 0


def schedules(url: str, args: argparse.Namespace) -> int:
    with connect.connect(url) as conn:
        if args.action == "run-now":
            if not args.name:
                print("skiplock schedules run-now: name the schedule")
                return 2
            if not ops.who(conn).run_now:
                print("skiplock schedules run-now: this database has no queue.run_schedule_now(name): upgrade it")
                return 1
            print(json.dumps(ops.run_schedule_now(conn, args.name), default=str))
            return 0
        rows = ops.schedules(conn)
    table = Table(title="schedules (queue.schedules) and periodic tasks", title_justify="left")
    for name in ("kind", "name / task", "every", "stage", "next run", "last run", "stage state"):
        table.add_column(name, overflow="fold")
    for r in rows:
        table.add_row(r["kind"], r["name"] or f"task {r['id']}", r["every"], r["stage"], _ts(r["next_run"]),
                      _ts(r["last_run"]), "paused" if r["paused"] else "", style="yellow" if r["paused"] else None)
    if not rows:
        table.caption = "no schedules"
    Console().print(table)
    return 0


def web(url: str, args: argparse.Namespace) -> int:
    try:
        return web_app.serve(url, args.listen, args.password_file, tuple(args.allow_host or ()))
    except ImportError as e:  # the extra skiplock[web]: Starlette, uvicorn, Jinja
        print(f"skiplock web: {e.name} is missing: pip install 'skiplock[web]'")
        return 1


def add_parsers(sub: Any, parents: list[argparse.ArgumentParser],
                url_of: Callable[[argparse.Namespace], str], int4: Callable[[str], int]) -> None:
    """The verbs' subcommands; url_of resolves --db as every other command does."""
    def runner(fn: Callable[[str, argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        return lambda args: fn(url_of(args), args)

    p = sub.add_parser("task", parents=parents, help="show a task: its runs, errors, lease, worker, payload",
                       description="Show a task from queue.tasks: its live row and every finished run or stage "
                                   "(a pipeline's place), with errors, timings, worker, lease, payload (bounded).")
    p.add_argument("id", type=int)
    p.set_defaults(func=runner(task))

    p = sub.add_parser("retry", parents=parents, help="queue failed tasks again (queue.retry): ids, or --stage with --error/--status",
                       description="Retry failed tasks (error, fatal or cancelled) through queue.retry: the ids given, "
                                   "or with --stage and no ids every failed task of the stage (status error or fatal, "
                                   "or --status) whose error text holds --error, in transactions of "
                                   f"{ops.BULK_CHUNK} tasks.")
    p.add_argument("ids", nargs="*", type=int, metavar="ID")
    p.add_argument("--stage", "-s", help="the tasks' stage (required without ids)")
    p.add_argument("--error", help="without ids: only tasks whose error text contains this")
    p.add_argument("--status", choices=["error", "fatal"], help="without ids: only this status (default both)")
    p.set_defaults(func=runner(retry))

    p = sub.add_parser("cancel", parents=parents, help="cancel live tasks (queue.cancel)",
                       description="Cancel live tasks through queue.cancel, all in one transaction.")
    p.add_argument("ids", nargs="+", type=int, metavar="ID")
    p.add_argument("--stage", "-s", help="the tasks' stage (routes the calls on Citus)")
    p.set_defaults(func=runner(cancel))

    p = sub.add_parser("priority", parents=parents, help="set live tasks' priority (queue.set_priority)",
                       description="Set the priority of live tasks (lower runs first) through queue.set_priority.")
    p.add_argument("priority", type=int4)
    p.add_argument("ids", nargs="+", type=int, metavar="ID")
    p.add_argument("--stage", "-s", help="the tasks' stage (routes the calls on Citus)")
    p.set_defaults(func=runner(priority))

    for verb, what in (("pause", "workers take nothing of it until resumed"), ("resume", "workers take its tasks again")):
        p = sub.add_parser(verb, parents=parents, help=f"{verb} stages: {what}",
                           description=f"{verb.capitalize()} stages through queue.configure_stage(stage, paused => ...): {what}.")
        p.add_argument("stages", nargs="+", metavar="STAGE")
        p.set_defaults(func=runner(pause))

    p = sub.add_parser("schedules", parents=parents, help="list cron schedules and periodic tasks; run-now NAME",
                       description="List cron schedules (queue.schedules) and periodic tasks with next and last run and "
                                   "their stage's pause; `run-now NAME` enqueues a schedule's task now "
                                   "(queue.run_schedule_now, where the database has it).")
    p.add_argument("action", nargs="?", choices=["list", "run-now"], default="list")
    p.add_argument("name", nargs="?")
    p.set_defaults(func=runner(schedules))

    p = sub.add_parser("web", parents=parents, help="the dashboard: stages, tasks, failures, schedules, actions (skiplock[web])",
                       description="Serve the dashboard. Every query runs as the login of --db: a skiplock_monitor "
                                   "login gets a read-only dashboard, skiplock_admin the actions. Binds to localhost; "
                                   "another address needs --password-file (or a reverse proxy that authenticates).")
    p.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT", help="address (default 127.0.0.1:8080)")
    p.add_argument("--password-file", metavar="FILE",
                   help="require HTTP Basic (any user name) or Bearer auth with the first line of FILE as the password")
    p.add_argument("--allow-host", action="append", metavar="NAME",
                   help="without --password-file, also answer requests for this Host name (the one a reverse proxy "
                        "passes); loopback names always (repeatable)")
    p.set_defaults(func=runner(web))
