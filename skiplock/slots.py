"""The threads of `skiplock run-sql`, and their stop on SIGTERM or SIGINT (`skiplock worker` runs
on skiplock.worker, the one worker loop; run-sql's executors call a procedure per task, not a
take/finish, so they keep these slots).

A slot is a thread with its own autocommit connection that LISTENs on the stage's channel
"skiplock.<stage>": connect() waits for the database (0.1 s, doubling up to 5 s) unless the
process is stopping, idle() sleeps until a notification or the slow poll (--poll). The slots of
one process share a Shared: the stop flags, a lock, the counters and the console.

stop_signals(): the first SIGTERM or SIGINT sets `stopping` (take or call no more) and the end
of the grace (`deadline`); a second one sets `abort` (kill or cancel what still runs). Each
command's main thread watches the deadline and sets `abort` itself when the grace is over.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import socket
import threading
import time
from contextlib import contextmanager
from typing import Callable, Generic, Iterator, TypeVar

import psycopg
import psycopg.sql
from rich.console import Console

from skiplock import connect
from skiplock.errors import one_line, primary_message, refused_login
from skiplock.worker import channel

BACKOFF_FIRST, BACKOFF_MAX = 0.1, 5.0   # seconds between connection attempts


class Shared:
    """What the slots of one process share: the stop flags, the counters, the console."""

    def __init__(self, args: argparse.Namespace, url: str, command: str) -> None:
        self.args, self.url, self.command = args, url, command
        self.name = args.name or f"{socket.gethostname()}:{os.getpid()}"
        self.stopping = threading.Event()   # take (or call) no more
        self.abort = threading.Event()      # grace is over: kill (or cancel) what still runs
        self.deadline: float | None = None  # when the grace ends, once stopping (time.monotonic())
        self.abort_why = "on a second signal"   # what the log says of a command the abort killed
        self.lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()
        self.running = 0
        self.console = Console(stderr=True, highlight=False, soft_wrap=True)

    def label(self) -> str:
        """What each log line starts with, after the time."""
        return f"skiplock {self.command} {self.args.stage}"

    def log(self, message: str) -> None:
        self.console.print(f"{time.strftime('%H:%M:%S')} {self.label()}: {message}", markup=False)

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1

    def give_up(self, why: str) -> None:
        """An error that waiting does not cure: say why at once, then stop as on a first SIGTERM
        (take no more, let what runs end within the grace)."""
        self.log(f"error: {why}; stopping")
        with self.lock:
            if not self.stopping.is_set():
                self.deadline = time.monotonic() + self.args.grace
                self.stopping.set()


S = TypeVar("S", bound=Shared)


class Slot(threading.Thread, Generic[S]):
    """A thread with its own connection, LISTENing on the stage's channel; run() is the command's."""

    def __init__(self, shared: S, index: int, thread_name: str) -> None:
        super().__init__(name=thread_name, daemon=True)
        self.shared = shared
        self.index = index
        self.worker_name = f"{shared.name}:{index}" if shared.args.concurrency > 1 else shared.name
        self.conn: psycopg.Connection | None = None
        self.listening = False  # LISTENs on the stage's channel (not through a transaction pooler)
        self.error: BaseException | None = None

    @property
    def db(self) -> psycopg.Connection:
        """The connection, which run() opens first. Once any slot found a transaction pooler
        (connect.detected_transaction_pooler), it prepares no more: a statement it prepared
        may meet another client's statement of the same name on the next server connection."""
        assert self.conn is not None, "the slot has no connection yet"
        if self.conn.prepare_threshold is not None and not connect.has_sessions():
            self.conn.prepare_threshold = None
            self.listening = False
        return self.conn

    def listen(self, conn: psycopg.Connection) -> None:
        """LISTEN on the stage's channel where the connection keeps a session (skiplock/connect.py)."""
        stages = getattr(self.shared.args, "stages", None) or [self.shared.args.stage]
        # Each stage named (a prefix's stages are found at the poll): an enqueue into any wakes it.
        self.listening = all([connect.listen(conn, channel(s)) for s in dict.fromkeys(stages) if not s.endswith("*")])

    def connect(self) -> psycopg.Connection:
        """A new connection that LISTENs; waits for the database unless we are stopping."""
        delay = BACKOFF_FIRST
        while True:
            try:
                conn = connect.connect(self.shared.url)
                self.listen(conn)
                return conn
            except psycopg.OperationalError as e:
                if self.shared.stopping.is_set() or refused_login(e):
                    raise
                self.shared.log(f"{self.name}: cannot connect ({connection_error(e)}); retrying in {delay:.1f} s")
                time.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)

    def drop_connection(self) -> None:
        self.shared.count("reconnects")
        try:
            if self.conn is not None:
                self.conn.close()
        except Exception:
            pass

    def reconnect(self) -> None:
        self.drop_connection()
        self.conn = self.connect()

    def idle(self) -> None:
        """Sleep until an enqueue notifies the stage or the slow poll comes round (or we stop)."""
        if not self.listening:  # through a transaction pooler: the poll alone
            self.shared.stopping.wait(self.shared.args.poll)
            return
        deadline = time.monotonic() + self.shared.args.poll
        try:
            while not self.shared.stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                for _ in self.db.notifies(timeout=min(left, 0.25), stop_after=1):
                    return
        except psycopg.OperationalError:
            self.reconnect()


def connection_error(e: BaseException) -> str:
    """The reason the server or the network gave, on one line (not only the exception's class)."""
    if isinstance(e, psycopg.Error) and e.sqlstate:
        return primary_message(e)
    return one_line(str(e).removeprefix("connection failed: ")) or e.__class__.__name__


@contextmanager
def stop_signals(shared: Shared, grace: float, stopping: Callable[[str], str], abort: str) -> Iterator[None]:
    """SIGTERM and SIGINT stop in two steps while the block runs (the previous handlers come back
    after it). The first sets shared.stopping and shared.deadline, then logs stopping(signal name);
    a second logs "<signal> again: <abort>" and sets shared.abort."""

    def on_signal(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if not shared.stopping.is_set():
            shared.stopping.set()
            shared.deadline = time.monotonic() + grace
            shared.log(stopping(name))
        elif not shared.abort.is_set():
            shared.log(f"{name} again: {abort}")
            shared.abort_why = f"on a second {name}"
            shared.abort.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
