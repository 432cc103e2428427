"""The `skiplock` command: devdb, upgrade, downgrade, demo."""

from __future__ import annotations

import argparse
import os
import sys

from skiplock import devdb, migrate


def _url(args: argparse.Namespace) -> str:
    url = args.db or os.environ.get("DATABASE_URL")
    if not url:
        current = devdb.devdb_current()
        if current is None:
            sys.exit("skiplock: no database: pass --db, set DATABASE_URL, or run `skiplock devdb start`")
        url = current.url()
    return url


def cmd_devdb(args: argparse.Namespace) -> int:
    if args.action == "start":
        c = devdb.devdb_start(durable=not args.fast)
        print(c.url())
    elif args.action == "stop":
        print("stopped" if devdb.devdb_stop() else "no dev cluster running")
    else:
        c = devdb.devdb_current()
        if c is None:
            print("no dev cluster running: skiplock devdb start", file=sys.stderr)
            return 1
        print(c.url())
    return 0


def cmd_upgrade(args: argparse.Namespace) -> int:
    migrate.upgrade(_url(args), args.revision)
    return 0


def cmd_downgrade(args: argparse.Namespace) -> int:
    migrate.downgrade(_url(args), args.revision)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from skiplock import demo
    return demo.main(tasks=args.tasks, workers=args.workers)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="skiplock", description="A task queue that lives inside PostgreSQL.")
    parser.add_argument("--db", help="libpq URL of the database (default: DATABASE_URL, else the dev cluster)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("devdb", help="a throwaway local cluster: start, stop, url")
    p.add_argument("action", choices=["start", "stop", "url"])
    p.add_argument("--fast", action="store_true", help="fsync off (tests); default keeps real durability")
    p.set_defaults(func=cmd_devdb)

    p = sub.add_parser("upgrade", help="run the migrations (alembic upgrade)")
    p.add_argument("revision", nargs="?", default="head")
    p.set_defaults(func=cmd_upgrade)

    p = sub.add_parser("downgrade", help="undo migrations (alembic downgrade)")
    p.add_argument("revision", help="target revision, e.g. -1 or base")
    p.set_defaults(func=cmd_downgrade)

    p = sub.add_parser("demo", help="enqueue tasks and drain them with worker processes, then summarise")
    p.add_argument("--tasks", type=int, default=3000)
    p.add_argument("--workers", type=int, default=4)
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
