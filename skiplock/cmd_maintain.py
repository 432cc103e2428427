"""`skiplock maintain`: the maintenance loop, SELECT * FROM queue.maintain() every N seconds.

What maintenance does (reaping hung tasks, history partitions, retention) is decided inside
queue.maintain(); this loop only calls it and prints the rows it returns.

The loop outlives a call that fails: a lost connection is opened again at the next call, and an
error the server raised for one call (a bad setting, a lock timeout, ...) is printed on one line
and the loop goes on, so that one failure does not stop the reaping of hung tasks for good.
`--once` exits 1 on either.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time

import psycopg
from rich.console import Console

from skiplock.errors import describe_error

# While calls keep failing with an error from the server, the wait before the next one doubles
# from --every up to this many seconds (or --every, if longer): a broken setting is then said
# about once a minute, not every second. The first call that succeeds goes back to --every.
BACKOFF_CAP = 60.0


def run(url: str, args: argparse.Namespace) -> int:
    out = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    wait = args.every
    failed = 0  # calls in a row the server raised an error for
    try:
        conn: psycopg.Connection | None = None
        while True:
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(url, autocommit=True)
                cur = conn.execute("SELECT * FROM queue.maintain()")
                names = [d.name for d in cur.description or ()]
                rows = cur.fetchall()
                stamp = time.strftime("%H:%M:%S")
                if not rows:
                    out.print(f"{stamp} maintain: nothing to do", markup=False)
                for row in rows:
                    out.print(f"{stamp} maintain: " + "  ".join(f"{n}={v}" for n, v in zip(names, row)), markup=False)
                wait, failed = args.every, 0
            except (psycopg.errors.UndefinedFunction, psycopg.errors.InvalidSchemaName):
                err.print("skiplock maintain: queue.maintain() does not exist in this database: run `skiplock upgrade`",
                          markup=False)
                return 1
            except psycopg.Error as e:
                if args.once:
                    err.print(f"skiplock maintain: {describe_error(e)}", markup=False)
                    return 1
                if conn is None or conn.closed:  # the server went away (or never answered): try again next round
                    if conn is not None:
                        conn.close()
                    conn = None
                    wait = args.every
                    err.print(f"skiplock maintain: {describe_error(e)}; retrying in {wait:g} s", markup=False)
                else:  # the server raised an error for this call, which it rolled back: go on
                    conn.rollback()  # autocommit: no transaction is left open, but make sure
                    failed += 1
                    wait = args.every if failed == 1 else min(wait * 2, max(args.every, BACKOFF_CAP))
                    err.print(f"skiplock maintain: {describe_error(e)}; next call in {wait:g} s", markup=False)
            if args.once or stop.wait(wait):
                return 0
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if conn is not None:
            conn.close()
