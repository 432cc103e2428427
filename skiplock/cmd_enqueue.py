"""`skiplock enqueue`: payloads from the arguments or JSON lines on stdin, in batches.

One payload with --key, and payloads with --after (tasks that wait for others, all in one
transaction), go through queue.enqueue (keys, modes, after); everything else through
queue.enqueue_batch, one call and one commit per --batch payloads, so a long load makes progress
visible to workers as it goes. A line that is not JSON stops the load before its batch is sent.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from typing import Iterable, Iterator

import psycopg
from psycopg.types.json import Jsonb
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from skiplock import connect
from skiplock.db import one
from skiplock.errors import describe_error


class BadPayload(Exception):
    pass


def parse_payloads(lines: Iterable[str], source: str) -> Iterator[object]:
    """JSON values, one per non-blank line (or argument); raises BadPayload naming the line."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as e:
            raise BadPayload(f"{source} {number}: not JSON ({e.msg})") from None


def batches(items: Iterable[object], size: int) -> Iterator[list[object]]:
    it = iter(items)
    while batch := list(itertools.islice(it, size)):
        yield batch


def run(url: str, args: argparse.Namespace) -> int:
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    from_args = bool(args.payloads)
    print_ids = from_args if args.print_ids is None else args.print_ids
    if not from_args and sys.stdin.isatty():
        err.print("reading JSON lines from stdin (Ctrl-D to end)")
    payloads = parse_payloads(args.payloads, "argument") if from_args else parse_payloads(sys.stdin, "line")
    delay = args.delay

    with connect.connect(url) as conn:
        if args.key is not None or args.after is not None:
            items = list(payloads)
            if args.key is not None and len(items) != 1:
                err.print("skiplock enqueue: --key takes exactly one payload")
                return 2
            try:
                with conn.transaction():
                    ids = [one(conn.execute(
                        "SELECT queue.enqueue(payload => %s, stage => %s, priority => %s, "
                        "run_at => now() + %s::float8 * interval '1 second', key => %s, mode => %s, "
                        "after => %s, after_failed => %s)",
                        (Jsonb(item), args.stage, args.priority, delay, args.key, args.mode, args.after,
                         args.after_failed)))[0] for item in items]
            except psycopg.Error as e:
                err.print(f"skiplock enqueue: {describe_error(e)}; nothing was enqueued", markup=False)
                return 1
            print("\n".join(map(str, ids)) if print_ids else len(ids))
            return 0

        total = len(args.payloads) if from_args else None
        done = 0
        progress: Progress | None = None
        bar = None
        try:
            for number, batch in enumerate(batches(payloads, args.batch), 1):
                if number == 2:  # more than one batch: show progress on stderr
                    progress = Progress(SpinnerColumn(), TextColumn(f"enqueue into {args.stage}"), BarColumn(),
                                        MofNCompleteColumn(), TimeElapsedColumn(), console=err)
                    progress.start()
                    bar = progress.add_task("enqueue", total=total, completed=done)
                ids = [r[0] for r in conn.execute(
                    "SELECT id FROM queue.enqueue_batch(payloads => %s::jsonb[], stage => %s, priority => %s, "
                    "run_at => now() + %s::float8 * interval '1 second') AS id",
                    ([Jsonb(p) for p in batch], args.stage, args.priority, delay))]
                done += len(ids)
                if print_ids:
                    sys.stdout.write("".join(f"{i}\n" for i in ids))
                if progress is not None and bar is not None:
                    progress.update(bar, completed=done)
        except BadPayload as e:
            err.print(f"skiplock enqueue: {e}; {done} tasks were enqueued before it")
            return 2
        except psycopg.Error as e:
            before = f"; {done} tasks were enqueued before this batch" if done else ""
            err.print(f"skiplock enqueue: {describe_error(e)}{before}", markup=False)
            return 1
        finally:
            if progress is not None:
                progress.stop()
    if not print_ids:
        print(done)
    return 0
