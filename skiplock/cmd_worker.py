"""`skiplock worker --stage S -- COMMAND …`: run a command once per task.

Each of --concurrency slots is a thread with its own connection that loops: take one task
(queue.take_next), run COMMAND with the payload on stdin and SKIPLOCK_TASK_ID, SKIPLOCK_ATTEMPT and
SKIPLOCK_STAGE in its environment, heartbeat every third of the lease while it runs, then
queue.finish (exit 0), queue.release with retry_in (--snooze-exit-code: not now, due --snooze
seconds later, the attempt not counted) or queue.fail (other exits; fatal for --fatal-exit-code). An idle slot sleeps
on LISTEN "skiplock.<stage>" with a slow poll. Commands run in their own session, so a Ctrl-C on
the terminal reaches the worker only, which then drains: it stops taking, lets running commands
end within --grace, then kills the rest and releases their tasks (queue.release: ready again at once,
the attempt not counted).
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import psycopg
import psycopg.sql
from rich.console import Console

from skiplock.worker import channel

STDERR_LINES = 20      # lines of stderr kept as the error of a failed attempt
STDERR_CHARS = 1900    # and at most this much of their end (the database keeps 2,000 characters)
KILL_WAIT = 5.0        # seconds between SIGTERM and SIGKILL of a command's process group


@dataclass
class Taken:
    id: int
    payload: str
    attempt: int
    lease: str
    lease_seconds: float


class Shared:
    """What the slots share: the stop flags, the counters, the console."""

    def __init__(self, args: argparse.Namespace, url: str, argv: list[str]) -> None:
        self.args, self.url, self.argv = args, url, argv
        self.name = args.name or f"{socket.gethostname()}:{os.getpid()}"
        self.stopping = threading.Event()   # take no more tasks
        self.abort = threading.Event()      # grace is over: kill running commands
        self.lock = threading.Lock()
        self.counts = collections.Counter()
        self.running = 0
        self.console = Console(stderr=True, highlight=False, soft_wrap=True)

    def log(self, message: str) -> None:
        self.console.print(f"{time.strftime('%H:%M:%S')} skiplock worker {self.args.stage}: {message}", markup=False)

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1


def error_text(returncode: int, tail: collections.deque[str]) -> str:
    if returncode < 0:
        try:
            how = f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"killed by signal {-returncode}"
    else:
        how = f"exit status {returncode}"
    lines = "".join(tail).rstrip("\n")
    if not lines:
        return how
    if len(lines) > STDERR_CHARS:
        lines = "…" + lines[-STDERR_CHARS:]
    return f"{how}; last lines of stderr:\n{lines}"


class Slot(threading.Thread):
    def __init__(self, shared: Shared, index: int) -> None:
        super().__init__(name=f"slot-{index}", daemon=True)
        self.shared = shared
        self.worker_name = f"{shared.name}:{index}" if shared.args.concurrency > 1 else shared.name
        self.conn: psycopg.Connection | None = None
        self.error: BaseException | None = None

    # -- connection ---------------------------------------------------------------------------
    def connect(self) -> psycopg.Connection:
        delay = 0.1
        while True:
            try:
                conn = psycopg.connect(self.shared.url, autocommit=True)
                conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel(self.shared.args.stage))))
                return conn
            except psycopg.OperationalError as e:
                if self.shared.stopping.is_set():
                    raise
                self.shared.log(f"cannot connect ({e.__class__.__name__}); retrying in {delay:.1f} s")
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def reconnect(self) -> None:
        self.shared.count("reconnects")
        try:
            if self.conn is not None:
                self.conn.close()
        except Exception:
            pass
        self.conn = self.connect()

    # -- loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self.conn = self.connect()
            while not self.shared.stopping.is_set():
                try:
                    task = self.take()
                except psycopg.OperationalError:
                    self.reconnect()
                    continue
                if task is None:
                    if self.shared.args.until_empty:
                        return
                    self.idle()
                    continue
                self.work(task)
        except BaseException as e:  # reported by the main thread, which exits 1
            self.error = e
        finally:
            if self.conn is not None:
                self.conn.close()

    def take(self) -> Taken | None:
        a = self.shared.args
        row = self.conn.execute(
            "SELECT t.id, t.payload::text, t.attempt, t.lease::text, "
            "       extract(epoch FROM t.lease_expires - now())::float8 "
            "  FROM queue.take_next(stage => %s, batch => 1, "
            "                       lease_for => %s::float8 * interval '1 second', worker => %s) t",
            (a.stage, a.lease, self.worker_name)).fetchone()
        return Taken(*row) if row else None

    def idle(self) -> None:
        """Sleep until an enqueue notifies the stage or the slow poll comes round (or we stop)."""
        deadline = time.monotonic() + self.shared.args.poll
        try:
            while not self.shared.stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                for _ in self.conn.notifies(timeout=min(left, 0.25), stop_after=1):
                    return
        except psycopg.OperationalError:
            self.reconnect()

    # -- one task -----------------------------------------------------------------------------
    def work(self, task: Taken) -> None:
        sh, a = self.shared, self.shared.args
        started = time.monotonic()
        env = dict(os.environ, SKIPLOCK_TASK_ID=str(task.id), SKIPLOCK_ATTEMPT=str(task.attempt),
                   SKIPLOCK_STAGE=a.stage)
        with sh.lock:
            sh.running += 1
        try:
            try:
                proc = subprocess.Popen(sh.argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                        start_new_session=True)
            except OSError as e:  # not found, not executable: this attempt fails like a crash would
                self.end(task, "fail", f"cannot run {sh.argv[0]}: {e}", started)
                return
            tail: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
            feeder = threading.Thread(target=self._feed, args=(proc, task.payload), daemon=True)
            reader = threading.Thread(target=self._read_stderr, args=(proc, tail), daemon=True)
            feeder.start()
            reader.start()
            outcome = self._supervise(proc, task)
            reader.join(timeout=2.0)
            feeder.join(timeout=1.0)
            if outcome == "lost":
                sh.count("lost")
                if not a.quiet:
                    sh.log(f"task {task.id}: lease lost (reaped, cancelled or retaken): command killed, not finished")
                return
            if outcome == "aborted":
                self.end(task, "shutdown", f"worker shut down: command killed after the grace of {a.grace:g} s; "
                                           + error_text(proc.returncode, tail), started)
            elif proc.returncode == 0:
                self.end(task, "finish", None, started)
            elif a.fatal_exit_code is not None and proc.returncode == a.fatal_exit_code:
                self.end(task, "fatal", error_text(proc.returncode, tail), started)
            elif a.snooze_exit_code is not None and proc.returncode == a.snooze_exit_code:
                self.end(task, "snooze", None, started)
            else:
                self.end(task, "fail", error_text(proc.returncode, tail), started)
        finally:
            with sh.lock:
                sh.running -= 1

    @staticmethod
    def _feed(proc: subprocess.Popen, payload: str) -> None:
        try:
            proc.stdin.write(payload.encode())
            proc.stdin.close()
        except OSError:  # the command does not read its stdin: fine
            pass

    @staticmethod
    def _read_stderr(proc: subprocess.Popen, tail: collections.deque[str]) -> None:
        for line in proc.stderr:
            tail.append(line.decode(errors="replace"))
            sys.stderr.buffer.write(line)
            sys.stderr.flush()

    def _supervise(self, proc: subprocess.Popen, task: Taken) -> str:
        """Wait for the command, heartbeating; returns 'exited', 'lost' or 'aborted'."""
        sh, a = self.shared, self.shared.args
        every = max(task.lease_seconds / 3.0, 0.05)
        next_beat = time.monotonic() + every
        outcome, killed_at = "exited", None
        while True:
            try:
                proc.wait(timeout=0.1)
                return outcome
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if killed_at is not None:
                if now - killed_at > KILL_WAIT:
                    _signal_group(proc, signal.SIGKILL)
                continue
            if sh.abort.is_set():
                outcome, killed_at = "aborted", now
                _signal_group(proc, signal.SIGTERM)
                continue
            if now >= next_beat:
                try:
                    self.conn.execute("SELECT queue.heartbeat(%s, %s, lease_for => %s::float8 * interval '1 second')",
                                      (task.id, task.lease, a.lease))
                    next_beat = now + every
                except psycopg.OperationalError:
                    self.reconnect()           # try again soon on the new connection
                    next_beat = time.monotonic() + min(every, 1.0)
                except psycopg.Error as e:
                    if e.sqlstate != "SK001":
                        _signal_group(proc, signal.SIGKILL)
                        raise
                    outcome, killed_at = "lost", now
                    _signal_group(proc, signal.SIGTERM)

    def end(self, task: Taken, how: str, error: str | None, started: float) -> None:
        """finish or fail the attempt; a connection lost on the way is retried once on a new one."""
        sh, a = self.shared, self.shared.args
        if how == "finish":
            sql, params = "SELECT queue.finish(%s, %s)", (task.id, task.lease)
        elif how == "shutdown":
            # Not the task's fault: hand it back without using up an attempt.
            sql, params = "SELECT queue.release(%s, %s)", (task.id, task.lease)
        elif how == "snooze":
            sql = "SELECT queue.release(%s, %s, retry_in => %s::float8 * interval '1 second')"
            params = (task.id, task.lease, a.snooze)
        else:
            sql = ("SELECT queue.fail(%s, %s, %s, fatal => %s, "
                   "retry_in => %s::float8 * interval '1 second')")
            params = (task.id, task.lease, error, how == "fatal", None)
        for attempt in (1, 2):
            try:
                ok = self.conn.execute(sql, params).fetchone()[0]
                break
            except psycopg.OperationalError:
                self.reconnect()
                if attempt == 2:
                    raise
        took = time.monotonic() - started
        if not ok:
            sh.count("lost")
            if not a.quiet:
                sh.log(f"task {task.id}: lease lost before {how}: nothing recorded")
            return
        word = {"finish": "done", "fail": "failed", "fatal": "fatal", "snooze": "snoozed",
                "shutdown": "released (shutdown)"}[how]
        sh.count(word)
        if not a.quiet:
            first = (error or "").splitlines()[0] if error else ""
            sh.log(f"task {task.id} attempt {task.attempt}: {word} in {took:.2f} s" + (f" ({first})" if first else ""))


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run(url: str, args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("skiplock worker: give the command after --, e.g. skiplock worker --stage resize -- ./resize.sh",
              file=sys.stderr)
        return 2
    if args.grace < 0:
        print("skiplock worker: --grace must not be negative", file=sys.stderr)
        return 2
    sh = Shared(args, url, argv)
    try:  # fail fast on a wrong URL or a database without skiplock
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT 'queue.take_next(text,integer,interval,text)'::regprocedure")
    except psycopg.Error as e:
        print(f"skiplock worker: {str(e).strip()}", file=sys.stderr)
        return 1

    deadline: list[float] = []

    def on_signal(signum: int, frame: object) -> None:
        if not sh.stopping.is_set():
            sh.stopping.set()
            deadline.append(time.monotonic() + args.grace)
            with sh.lock:
                running = sh.running
            sh.log(f"{signal.Signals(signum).name}: draining, {running} command(s) running, grace {args.grace:g} s")
        elif not sh.abort.is_set():
            sh.log(f"{signal.Signals(signum).name} again: killing running commands now")
            sh.abort.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    slots = [Slot(sh, i) for i in range(args.concurrency)]
    if not args.quiet:
        sh.log(f"{args.concurrency} slot(s) running {' '.join(argv)}")
    try:
        for s in slots:
            s.start()
        last_report = time.monotonic()
        while any(s.is_alive() for s in slots):
            for s in slots:
                s.join(timeout=0.1)
            now = time.monotonic()
            if deadline and not sh.abort.is_set():
                if now >= deadline[0]:
                    sh.log("grace over: killing running commands, their tasks are released (ready again, attempt not counted)")
                    sh.abort.set()
                elif now - last_report >= 5.0:
                    last_report = now
                    sh.log(f"draining: {sh.running} command(s) still running, "
                           f"{max(deadline[0] - now, 0):.0f} s of grace left")
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    errors = [s.error for s in slots if s.error is not None]
    c = sh.counts
    if not args.quiet or errors:
        sh.log(f"stopped: {c['done']} done, {c['failed']} failed, {c['fatal']} fatal, {c['snoozed']} snoozed, "
               f"{c['released (shutdown)']} interrupted, {c['lost']} lease lost")
    for e in errors[:1]:
        message = e.diag.message_primary if isinstance(e, psycopg.Error) and e.diag.message_primary else str(e)
        sh.log(f"error: {message}")
    return 1 if errors else 0
