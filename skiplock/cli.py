"""The `skiplock` command: one entry point, a subcommand per job, `--help` on each.

Parsing is argparse; the commands live in small modules (cmd_*.py) and every queue decision they
make is a call to a function of schema `queue`.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any, Callable

import psycopg

import skiplock
from skiplock import (
    cmd_enqueue,
    cmd_maintain,
    cmd_migrate,
    cmd_ops,
    cmd_run_sql,
    cmd_stats,
    cmd_worker,
    connect,
    demo,
    devdb,
    reference,
)
from skiplock.errors import describe_error, reportable


def database_url(args: argparse.Namespace, check_revision: bool = True) -> str:
    """--db, else DATABASE_URL, else the dev cluster started by `skiplock devdb start`; warns in one
    line when that database's skiplock is older than this package's (see warn_if_behind)."""
    url = getattr(args, "db", None) or os.environ.get("DATABASE_URL")
    if not url:
        current = devdb.devdb_current()
        if current is None:
            sys.exit("skiplock: no database: pass --db, set DATABASE_URL, or run `skiplock devdb start`")
        url = current.url()
    if check_revision:
        warn_if_behind(url, args.command)
    return url


def warn_if_behind(url: str, command: str) -> None:
    """One line on stderr when the database's revision is older than the newest this package ships.
    Says nothing when it cannot tell (no server, no skiplock, a login that may not read
    queue.skiplock_version): the command itself reports what matters there."""
    try:
        with connect.connect(url, autocommit=True, connect_timeout=10) as conn:
            # Qualified: the executor of SQL tasks (run-sql) runs this as a privileged role.
            row = conn.execute("SELECT CASE WHEN pg_catalog.has_table_privilege("
                               "pg_catalog.to_regclass('queue.skiplock_version'), 'SELECT') THEN 1 END").fetchone()
            if row is None or row[0] is None:
                return
            found = conn.execute("SELECT version_num FROM queue.skiplock_version").fetchone()
    except psycopg.Error:
        return
    head = cmd_migrate.head_revision()
    if found and found[0].isdigit() and found[0] < head:
        print(f"skiplock {command}: warning: the database is at revision {found[0]}, this skiplock "
              f"({skiplock.__version__}) ships {head}: run `skiplock upgrade`", file=sys.stderr)


def run_devdb(args: argparse.Namespace) -> int:
    if args.action == "start":
        cluster, done = devdb.devdb_start(durable=not args.fast)
        if done == "restarted":
            print(f"skiplock devdb: its server had stopped: started it again on {cluster.directory}", file=sys.stderr)
        print(cluster.url())
    elif args.action == "stop":
        print("stopped" if devdb.devdb_stop() else "no dev cluster running")
    else:
        c = devdb.devdb_current()
        if c is None:
            print("no dev cluster running: skiplock devdb start", file=sys.stderr)
            return 1
        print(c.url())
    return 0


def run_upgrade(args: argparse.Namespace) -> int:
    return cmd_migrate.upgrade(database_url(args, check_revision=False), args.revision)


def run_downgrade(args: argparse.Namespace) -> int:
    return cmd_migrate.downgrade(database_url(args, check_revision=False), args.revision)


def run_enqueue(args: argparse.Namespace) -> int:
    return cmd_enqueue.run(database_url(args), args)


def run_worker(args: argparse.Namespace) -> int:
    return cmd_worker.run(database_url(args), args)


def run_run_sql(args: argparse.Namespace) -> int:
    return cmd_run_sql.run(database_url(args), args)


def run_stats(args: argparse.Namespace) -> int:
    return cmd_stats.stats(database_url(args), args)


def run_top(args: argparse.Namespace) -> int:
    return cmd_stats.top(database_url(args), args)


def run_maintain(args: argparse.Namespace) -> int:
    return cmd_maintain.run(database_url(args), args)


def run_distribute(args: argparse.Namespace) -> int:
    """queue.distribute() on a Citus coordinator: what it changed, one line each (nothing: already done)."""
    with connect.connect(database_url(args)) as conn:
        changes = [row[0] for row in conn.execute("SELECT * FROM queue.distribute()").fetchall()]
    for change in changes:
        print(change)
    if not changes:
        print("already distributed: nothing to do")
    return 0


def run_demo(args: argparse.Namespace) -> int:
    # No dev-cluster fallback here: without --db or DATABASE_URL the demo starts its own cluster.
    return demo.main(tasks=args.tasks, workers=args.workers, url=getattr(args, "db", None))


MAX_SECONDS = 365 * 86400.0   # the largest duration an option takes: a year
INT4 = 2**31 - 1               # an integer column's range (priority)


def _int4(text: str) -> int:
    """A whole number that fits an integer column: a bigger one would not match the function's
    signature, and the server's "function does not exist" would say nothing useful."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not -INT4 - 1 <= value <= INT4:
        raise argparse.ArgumentTypeError(f"{text} is out of range ({-INT4 - 1} to {INT4})")
    return value


def _ids(text: str) -> list[int]:
    """Task ids, comma-separated ("12,15,20")."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of task ids") from None


def _positive(kind: Callable[[str], Any], zero: bool = False) -> Callable[[str], Any]:
    """A whole number above zero (or zero and above), with a message that names the option's kind."""
    def whole_number(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"must be {'zero or more' if zero else 'positive'}: {text}")
        return value
    return whole_number


def _seconds(zero: bool = False, negative: bool = False) -> Callable[[str], float]:
    """A finite number of seconds, at most MAX_SECONDS either way (the database keeps it as an interval)."""
    def seconds(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds")
        if abs(value) > MAX_SECONDS:
            raise argparse.ArgumentTypeError(f"{text} seconds is too long (at most {MAX_SECONDS:.0f}, a year)")
        if not negative and (value < 0 or (value == 0 and not zero)):
            raise argparse.ArgumentTypeError(f"must be {'zero or more' if zero else 'positive'}: {text}")
        return value
    return seconds


POOLER_HELP = ("what sits between us and the server (default: SKIPLOCK_POOLER, else none): transaction "
               "(PgBouncer pool_mode=transaction) turns server-side prepared statements off and makes idle "
               "workers poll instead of LISTEN; session and none change nothing")


def build_parser() -> argparse.ArgumentParser:
    # --db is accepted before or after the command; SUPPRESS keeps a later default from
    # overwriting a value given earlier.
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--db", default=argparse.SUPPRESS,
                    help="libpq URL of the database (default: DATABASE_URL, else the dev cluster)")
    db.add_argument("--pooler", choices=connect.MODES, default=argparse.SUPPRESS,
                    help=POOLER_HELP)

    parser = argparse.ArgumentParser(prog="skiplock", description="A task queue that lives inside PostgreSQL.")
    parser.add_argument("--db", help="libpq URL of the database (default: DATABASE_URL, else the dev cluster)")
    parser.add_argument("--pooler", choices=connect.MODES, help=POOLER_HELP)
    parser.add_argument("--version", action="version", version=f"skiplock {skiplock.__version__} (schema revision {cmd_migrate.head_revision()})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("devdb", help="a throwaway local cluster: start, stop, url",
                       description="Start, stop or show a throwaway local PostgreSQL cluster for development.")
    p.add_argument("action", choices=["start", "stop", "url"],
                   help="start: start it, or start its server again when it stopped (its data kept), or leave it running; "
                        "stop: stop it and delete it; url: print its URL. Found from any directory (SKIPLOCK_DEVDB_STATE)")
    p.add_argument("--fast", action="store_true", help="fsync off (tests); default keeps real durability")
    p.set_defaults(func=run_devdb)

    p = sub.add_parser("upgrade", parents=[db], help="run the migrations (alembic upgrade), showing each revision",
                       description="Apply skiplock's migrations to the database, in one transaction.")
    p.add_argument("revision", nargs="?", default="head", help="target revision (default: head)")
    p.set_defaults(func=run_upgrade)

    p = sub.add_parser("downgrade", parents=[db], help="undo migrations (alembic downgrade)",
                       description="Undo skiplock's migrations down to a revision (base drops schema queue's objects).")
    p.add_argument("revision", help="target revision, e.g. -1 or base")
    p.set_defaults(func=run_downgrade)

    p = sub.add_parser("enqueue", parents=[db], help="add tasks: JSON payloads as arguments or JSON lines on stdin",
                       description="Add tasks to a stage. Payloads (JSON objects or arrays) come from the arguments, "
                                   "or one per line on stdin when there are none. Stdin is sent in batches "
                                   "(queue.enqueue_batch), each batch committed on its own.")
    p.add_argument("payloads", nargs="*", metavar="JSON", help="payloads; none: read JSON lines from stdin")
    p.add_argument("--stage", "-s", default="default", help="stage to add to (default: default)")
    p.add_argument("--priority", type=_int4, default=0, help="lower runs first (default 0)")
    p.add_argument("--delay", type=_seconds(negative=True), default=None, metavar="SECONDS", help="run no earlier than this many seconds from now")
    p.add_argument("--key", help="idempotency key (one payload only; uses queue.enqueue)")
    p.add_argument("--mode", choices=["ignore", "rerun"], default="ignore",
                   help="with --key, when a live task has the key: keep it (ignore) or re-run it with the new payload")
    p.add_argument("--after", type=_ids, metavar="ID,ID,...",
                   help="each task waits until these tasks have ended (queue.enqueue(after => ...), one transaction)")
    p.add_argument("--after-failed", choices=["cancel", "run"], default="cancel",
                   help="with --after, when one of them ends fatal or cancelled: cancel the task (default) or run it anyway")
    p.add_argument("--batch", type=_positive(int), default=1000, help="payloads per enqueue_batch call (default 1000)")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--ids", dest="print_ids", action="store_true", default=None,
                       help="print the new ids, one a line (default for payloads given as arguments)")
    shown.add_argument("--count", dest="print_ids", action="store_false",
                       help="print only how many were enqueued (default for stdin)")
    p.set_defaults(func=run_enqueue)

    p = sub.add_parser("worker", parents=[db], help="run a command once per task of a stage",
                       usage="skiplock worker [options] --stage STAGE -- COMMAND [ARG ...]",
                       description="Take tasks of a stage and run COMMAND once per task: the payload on its stdin, "
                                   "SKIPLOCK_TASK_ID, SKIPLOCK_ATTEMPT and SKIPLOCK_STAGE in its environment. "
                                   "Exit 0 finishes the task; --fatal-exit-code fails it for good; --snooze-exit-code hands it back "
                                   "for later without counting the attempt; any other exit "
                                   "fails it (retried per the stage's policy) with the last lines of stderr as the "
                                   "error. The lease is extended every third of its length while the command runs. "
                                   "SIGTERM or SIGINT: stop taking, let running commands finish (up to --grace), exit 0.")
    p.add_argument("--stage", "-s", required=True, action="append",
                   help="stage to work on; several (repeat it, or a comma list, or a prefix such as 'tenant.*') "
                        "are served round robin by queue.take_next(stages[])")
    p.add_argument("--concurrency", "-c", type=_positive(int), default=1, help="commands run at once (default 1)")
    p.add_argument("--lease", type=_seconds(), default=None, metavar="SECONDS",
                   help="lease per attempt, renewed by heartbeats (default: the stage's lease_duration)")
    p.add_argument("--fatal-exit-code", type=int, default=None, metavar="N", help="this exit code fails the task for good (no retry)")
    p.add_argument("--snooze-exit-code", type=int, default=None, metavar="N",
                   help="this exit code means 'not now' (a rate limit, a resource not ready): the task goes back, "
                        "due --snooze seconds later, the attempt not counted")
    p.add_argument("--snooze", type=_seconds(zero=True), default=10.0, metavar="SECONDS",
                   help="how long a task handed back by --snooze-exit-code waits (default 10)")
    p.add_argument("--grace", type=_seconds(zero=True), default=30.0, metavar="SECONDS",
                   help="on SIGTERM, how long running commands may take before they are killed and their tasks "
                        "released (ready again, the attempt not counted; default 30)")
    p.add_argument("--poll", type=_seconds(), default=5.0, metavar="SECONDS",
                   help="slow poll when idle, besides LISTEN (default 5)")
    p.add_argument("--until-empty", action="store_true",
                   help="exit 0 once the stage has no due task left (drain and stop); expired leases are recovered first")
    p.add_argument("--timeout", type=_seconds(), default=None, metavar="SECONDS",
                   help="a command running longer is killed and its attempt failed (retried by the stage's policy)")
    p.add_argument("--no-maintain", action="store_true",
                   help="do not run queue.maintain() from this worker (when pg_cron or `skiplock maintain` runs it)")
    p.add_argument("--maintain-every", type=_seconds(), default=None, metavar="SECONDS",
                   help="seconds between this worker's tries at queue.maintain(), one worker at a time "
                        "(default 10, or a third of --lease if shorter)")
    p.add_argument("--name", help="worker name recorded on each task (default host:pid)")
    p.add_argument("--quiet", "-q", action="store_true", help="no line per task on stderr")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command and its arguments, after --")
    p.set_defaults(func=run_worker)

    p = sub.add_parser("run-sql", parents=[db], help="run one role's SQL tasks of a stage (queue.enqueue_sql) in N connections",
                       description="Run the due SQL tasks of a stage that the login role enqueued: the login of "
                                   "--db / DATABASE_URL is the role whose tasks run, with exactly its privileges "
                                   "(it must be a member of skiplock_sql, e.g. GRANT skiplock_sql TO reporting, and "
                                   "must not act under SET ROLE; run one process per enqueuing role). Each of "
                                   "--concurrency connections loops CALL queue.run_sql_tasks(stage, K), which runs "
                                   "the requests and commits after each; an idle connection sleeps on LISTEN with a "
                                   "slow poll. One more connection is the watchdog: queue.cancel_overdue_sql_tasks() "
                                   "every --watchdog-interval seconds cancels statements past their timeout. "
                                   "SIGTERM or SIGINT: stop calling, let running calls end (up to --grace), then "
                                   "cancel them: each hands its task back (ready again, attempt not counted); exit 0.")
    p.add_argument("--stage", "-s", required=True, help="stage whose SQL tasks to run")
    p.add_argument("--concurrency", "-c", type=_positive(int), default=1,
                   help="calls at once (default 1), each with its own connection; the stage's max_running still caps the tasks")
    p.add_argument("--max-tasks-per-call", type=_positive(int), default=1, metavar="K",
                   help="tasks one CALL may run before it returns (default 1)")
    p.add_argument("--grace", type=_seconds(zero=True), default=10.0, metavar="SECONDS",
                   help="on SIGTERM, how long running tasks may take before they are cancelled and released (default 10)")
    p.add_argument("--watchdog-interval", type=_seconds(), default=0.5, metavar="SECONDS",
                   help="seconds between calls of queue.cancel_overdue_sql_tasks() (default 0.5)")
    p.add_argument("--poll", type=_seconds(), default=1.0, metavar="SECONDS",
                   help="slow poll when idle, besides LISTEN (default 1)")
    p.add_argument("--name", help="worker name recorded on each task (default host:pid)")
    p.add_argument("--quiet", "-q", action="store_true", help="no line per call on stderr (the summary is still printed)")
    p.set_defaults(func=run_run_sql)

    p = sub.add_parser("stats", parents=[db], help="a table of tasks per stage and status (queue.stats)",
                       description="Print queue.stats: tasks per stage and status, due, oldest age, expired leases.")
    p.add_argument("--stage", "-s", action="append", help="only this stage (repeatable)")
    p.set_defaults(func=run_stats)

    p = sub.add_parser("top", parents=[db], help="stats refreshing live, with rates",
                       description="queue.metrics refreshed live: live tasks per stage and status, lag, and finished "
                                   "tasks in the last minute, with their rate per second (that count / 60).")
    p.add_argument("--stage", "-s", action="append", help="only this stage (repeatable)")
    p.add_argument("--interval", type=_seconds(), default=1.0, metavar="SECONDS", help="refresh every (default 1)")
    p.add_argument("--iterations", type=_positive(int), default=None, metavar="N", help="stop after N refreshes (default: until Ctrl-C)")
    p.set_defaults(func=run_top)

    p = sub.add_parser("maintain", parents=[db], help="the maintenance loop: SELECT * FROM queue.maintain() every N seconds",
                       description="Call queue.maintain() (reaping, partitions, retention) every --every seconds and "
                                   "print what it did. SIGTERM or SIGINT stops it after the current call.")
    p.add_argument("--every", type=_seconds(), default=60.0, metavar="SECONDS", help="seconds between calls (default 60)")
    p.add_argument("--once", action="store_true", help="call it once and exit")
    p.set_defaults(func=run_maintain)

    p = sub.add_parser("distribute", parents=[db], help="Citus: distribute schema queue by stage over the cluster (queue.distribute())",
                       description="On a Citus coordinator (the citus extension and its workers in place), as a superuser: "
                                   "distribute the hot table and the history by stage, make the small tables reference "
                                   "tables and route the worker calls to their stage's node. Run it again after each "
                                   "`skiplock upgrade`; a run with nothing to change says so. Refused without Citus.")
    p.set_defaults(func=run_distribute)

    p = sub.add_parser("demo", parents=[db], help="enqueue tasks and drain them with worker processes, then summarise",
                       description="The demo: a throwaway cluster (or the database of --db or DATABASE_URL), "
                                   "a two-stage pipeline drained by workers.")
    p.add_argument("--tasks", type=_positive(int), default=3000, help="tasks to enqueue (default 3000)")
    p.add_argument("--workers", type=_positive(int), default=4, help="worker processes (default 4)")
    p.set_defaults(func=run_demo)

    cmd_ops.add_parsers(sub, [db], database_url, _int4)  # task, retry, cancel, priority, pause, resume, schedules, web
    reference.add_parser(sub, [db])
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "pooler", None):  # for skiplock.connect, and for the processes a command starts
        os.environ["SKIPLOCK_POOLER"] = args.pooler
    try:
        connect.pooler()
    except connect.PoolerError as e:
        print(f"skiplock {args.command}: {e}", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"skiplock {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if not reportable(e):
            raise  # a bug: the traceback says where
        print(f"skiplock {args.command}: {describe_error(e)}", file=sys.stderr)
        for note in getattr(e, "__notes__", ()):  # e.g. why a migration gave up (alembic/env.py)
            print(note, file=sys.stderr)
        return 1
