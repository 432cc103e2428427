"""`skiplock maintain`: the maintenance loop, SELECT * FROM queue.maintain() every N seconds.

What maintenance does (reaping hung tasks, history partitions, retention) is decided inside
queue.maintain(); this loop only calls it and prints the rows it returns.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time

import psycopg
from rich.console import Console


def run(url: str, args: argparse.Namespace) -> int:
    out = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        conn: psycopg.Connection | None = None
        while True:
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(url, autocommit=True)
                cur = conn.execute("SELECT * FROM queue.maintain()")
                names = [d.name for d in cur.description]
                rows = cur.fetchall()
                stamp = time.strftime("%H:%M:%S")
                if not rows:
                    out.print(f"{stamp} maintain: nothing to do", markup=False)
                for row in rows:
                    out.print(f"{stamp} maintain: " + "  ".join(f"{n}={v}" for n, v in zip(names, row)), markup=False)
            except (psycopg.errors.UndefinedFunction, psycopg.errors.InvalidSchemaName):
                err.print("skiplock maintain: queue.maintain() does not exist in this database: run `skiplock upgrade`",
                          markup=False)
                return 1
            except psycopg.OperationalError as e:  # the server went away: try again next round
                from skiplock.cli import describe_error
                if conn is not None:
                    conn.close()
                conn = None
                if args.once:
                    err.print(f"skiplock maintain: {describe_error(e)}", markup=False)
                    return 1
                err.print(f"skiplock maintain: {describe_error(e)}; retrying in {args.every:g} s", markup=False)
            if args.once or stop.wait(args.every):
                return 0
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if conn is not None:
            conn.close()
