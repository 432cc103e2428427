"""`skiplock worker --stage S -- COMMAND …`: run a command once per task.

Each of --concurrency slots is a thread with its own connection that loops: take one task
(queue.take_next), run COMMAND with the payload on stdin and SKIPLOCK_TASK_ID, SKIPLOCK_ATTEMPT and
SKIPLOCK_STAGE in its environment, heartbeat every third of the lease while it runs, then
queue.finish (exit 0), queue.release with retry_in (--snooze-exit-code: not now, due --snooze
seconds later, the attempt not counted) or queue.fail (other exits; fatal for --fatal-exit-code). An idle slot sleeps
on LISTEN "skiplock.<stage>" with a slow poll. Commands run in their own session, so a Ctrl-C on
the terminal reaches the worker only, which then drains: it stops taking, lets running commands
end within --grace, then kills the rest and releases their tasks (queue.release: ready again at once,
the attempt not counted). The kill comes from the main thread and does not wait for the database:
a command is never left running because the server is down (its task then stays running until its
lease expires, and the worker exits 1). On Linux a command also gets SIGKILL when its worker dies
(prctl PR_SET_PDEATHSIG), so a worker killed with -9 leaves no command behind (its task waits for
its lease to expire; processes the command started itself are not covered).
The slot's connection, LISTEN, reconnect and idle and the two-step stop are skiplock/slots.py's,
shared with `skiplock run-sql`.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import psycopg

from skiplock import connect, slots
from skiplock.db import one
from skiplock.errors import describe_error, prepared_lost, transient
from skiplock.worker import storable

STDERR_LINES = 20      # lines of stderr kept as the error of a failed attempt
STDERR_PIECE = 65536   # a longer line of stderr is read (and kept) in pieces of this many bytes
STDERR_CHARS = 1900    # and at most this much of their end (the database keeps 2,000 characters)
KILL_WAIT = 5.0        # seconds between SIGTERM and SIGKILL of a command's process group
RELEASE_WAIT = 15.0    # after the kill, how long the slots may take to hand their tasks back
MAINTAIN_EVERY = 10.0  # seconds between a worker's tries at queue.maintain() (maintain_every)
TIMEOUT_READ = 30.0    # seconds between reads of the stage's task_timeout


class Unrecorded(Exception):
    """A task's outcome could not be written while its lease held (the database could not be
    reached, or kept failing with errors that pass by waiting)."""


# A command that ends by these signals (or exits 128 + one of them, as a shell does) while the
# worker stops got the stop itself: systemd's KillMode=control-group signals every process of the
# service at once. Its task is handed back like one the worker stopped, not failed.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
STOP_WAIT = 1.0   # how long a command killed by one of them waits for the worker's own signal


def _death_signal() -> Callable[[], None] | None:
    """preexec_fn for a command: SIGKILL when the worker dies (Linux prctl PR_SET_PDEATHSIG), else None.

    Everything is looked up here, in the parent; the child only calls prctl and getppid (no
    import, no lookup, nothing that takes a lock another thread might hold at fork time)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    PR_SET_PDEATHSIG, SIGKILL, parent = 1, int(signal.SIGKILL), os.getpid()
    getppid, kill_self = os.getppid, os._exit

    def die_with_the_worker() -> None:
        # The death signal goes with the thread that forked (a slot, which outlives its command)
        # and is kept across exec. A worker that died before prctl: do not run the command.
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
        if getppid() != parent:
            kill_self(1)
    return die_with_the_worker


DIE_WITH_THE_WORKER = _death_signal()


@dataclass
class Taken:
    id: int
    payload: str
    attempt: int
    lease: str
    lease_seconds: float
    stage: str
    expires: float = 0.0     # when the lease runs out (time.monotonic()), renewed by each heartbeat
    next_beat: float = 0.0   # when the next heartbeat is due
    timeout: float | None = None  # the command's time limit (--timeout, else the stage's task_timeout)

    def __post_init__(self) -> None:
        now = time.monotonic()
        self.expires = now + self.lease_seconds
        self.next_beat = now + self.every()

    def every(self) -> float:
        return max(self.lease_seconds / 3.0, 0.05)


class Shared(slots.Shared):
    """What the slots share (slots.Shared), plus the command and the processes running it."""

    def __init__(self, args: argparse.Namespace, url: str, argv: list[str]) -> None:
        super().__init__(args, url, "worker")
        self.argv = argv
        self.procs: dict[int, subprocess.Popen[bytes]] = {}   # slot index -> its running command
        # What a stage's settings tell a worker (queue.worker_settings), read per stage at most every
        # TIMEOUT_READ seconds: stage -> (task_timeout in seconds or None, paused, when read,
        # time.monotonic()). A command's time limit is --timeout, else its stage's task_timeout.
        self.settings: dict[str, tuple[float | None, bool, float]] = {}
        self.maintains = not args.no_maintain                 # run queue.maintain() (slots.Maintainer)

    def kill_commands(self, sig: signal.Signals) -> int:
        """Signal the process group of every command still running; how many were signalled."""
        with self.lock:
            procs = [p for p in self.procs.values() if p.returncode is None]
            for proc in procs:
                _signal_group(proc, sig)
        return len(procs)


def error_text(returncode: int, tail: collections.deque[str], timeout: float | None = None) -> str:
    if returncode < 0:
        try:
            how = f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"killed by signal {-returncode}"
    else:
        how = f"exit status {returncode}"
    if timeout is not None:
        how = f"timed out after {timeout:g} s: {how}"
    # A NUL in stderr (binary output) would make the server refuse the whole text (22021).
    lines = storable("".join(tail).rstrip("\n"))
    if not lines:
        return how
    if len(lines) > STDERR_CHARS:
        lines = "…" + lines[-STDERR_CHARS:]
    return f"{how}; last lines of stderr:\n{lines}"


class Slot(slots.Slot[Shared]):
    """Takes a task, runs the command on it, heartbeats, ends the attempt; over again."""

    def __init__(self, shared: Shared, index: int) -> None:
        super().__init__(shared, index, f"slot-{index}")
        self.limit: float | None = None   # the time limit of the command running (_supervise)

    def run(self) -> None:
        sh = self.shared
        try:
            self.conn = self.connect()
            delay, recovered = slots.BACKOFF_FIRST, False
            while not sh.stopping.is_set():
                try:
                    task = self.take()
                    if task is not None:
                        task.timeout = self.read_timeout(task.stage)
                except psycopg.Error as e:
                    if not transient(e):
                        raise
                    delay = self.recover(e, "take", delay)
                    continue
                delay = slots.BACKOFF_FIRST
                if task is None:
                    if sh.args.until_empty:
                        # Expired leases first: a task whose worker died is not done.
                        if not recovered and sh.maintains:
                            recovered = True
                            try:
                                slots.maintain_once(self.db)
                            except psycopg.Error as e:
                                if e.sqlstate != "42501" and not transient(e):
                                    raise
                            continue
                        return
                    try:
                        self.check_paused()
                    except psycopg.Error as e:
                        if not transient(e):
                            raise
                    self.idle()
                    continue
                recovered = False
                try:
                    self.work(task)
                except Unrecorded as e:
                    sh.count("unrecorded")
                    sh.log(f"{self.name}: {e}")
        except psycopg.OperationalError as e:
            # Between tasks (work() reports its own): nothing is held, and when we are stopping,
            # a database that cannot be reached has nothing left to be told.
            if not sh.stopping.is_set():
                self.error = e
                sh.give_up(f"{self.name}: {describe_error(e)}")
        except BaseException as e:  # said now; the main thread exits 1
            self.error = e
            sh.give_up(f"{self.name}: " + (describe_error(e) if isinstance(e, psycopg.Error) else repr(e)))
        finally:
            if self.conn is not None:
                self.conn.close()

    def read_timeout(self, stage: str) -> float | None:
        """A task of this stage's time limit: --timeout, else the stage's task_timeout."""
        sh = self.shared
        if sh.args.timeout is not None:
            return float(sh.args.timeout)
        return self.read_settings(stage, taken=True)[0]

    def read_settings(self, stage: str, taken: bool = False) -> tuple[float | None, bool]:
        """The stage's task_timeout (seconds, or None) and whether it is paused, from
        queue.worker_settings, read at most every TIMEOUT_READ seconds a stage so that the takes
        pay nothing for it (and again at once when a task was `taken` from a stage last seen
        paused). Logs the time limit when it changes, and one line when the stage is paused or
        resumed. A passing error keeps what was known."""
        sh = self.shared
        with sh.lock:
            known = sh.settings.get(stage)
            if known is not None and time.monotonic() < known[2] + TIMEOUT_READ and not (taken and known[1]):
                return known[0], known[1]
        try:
            seconds, paused = one(self.db.execute(
                "SELECT extract(epoch FROM s.task_timeout)::float8, s.paused FROM queue.worker_settings(%s) s", (stage,)))
        except psycopg.errors.UndefinedFunction:  # a database older than worker_settings
            try:
                seconds, paused = one(self.db.execute("SELECT extract(epoch FROM queue.task_timeout(%s))::float8", (stage,)))[0], False
            except psycopg.errors.UndefinedFunction:  # older than the time limit too
                seconds, paused = None, False
        except psycopg.Error as e:  # a passing error keeps the last settings known
            if not transient(e):
                raise
            return (known[0], known[1]) if known is not None else (None, False)
        with sh.lock:
            if not sh.args.quiet:
                if known is None or seconds != known[0]:
                    sh.log(f"task timeout of {stage}: " + (f"{seconds:g} s (the stage's task_timeout)" if seconds else "none"))
                if paused and (known is None or not known[1]):
                    sh.log(f"stage {stage} is paused: its tasks wait until it is resumed (configure_stage(paused => false))")
                elif not paused and known is not None and known[1]:
                    sh.log(f"stage {stage} is resumed")
            sh.settings[stage] = (seconds, bool(paused), time.monotonic())
        return seconds, bool(paused)

    def check_paused(self) -> None:
        """Idle: read the settings of each stage served by name (not a prefix's, whose stages are
        known only by their tasks) when TIMEOUT_READ has passed, so that the log says when one is
        paused or resumed although no task of it comes."""
        for stage in self.shared.args.stages:
            if not stage.endswith("*"):
                self.read_settings(stage)

    def take(self) -> Taken | None:
        a = self.shared.args
        if len(a.stages) > 1 or a.stage.endswith("*"):  # several, or a prefix: round robin, each row names its stage
            row = self.db.execute(
                "SELECT t.id, t.payload::text, t.attempt, t.lease::text, "
                "       extract(epoch FROM t.lease_expires - now())::float8, t.stage "
                "  FROM queue.take_next(stages => %s::text[], batch => 1, "
                "                       lease_for => %s::float8 * interval '1 second', worker => %s) t",
                (a.stages, a.lease, self.worker_name)).fetchone()
            return Taken(*row) if row else None
        row = self.db.execute(
            "SELECT t.id, t.payload::text, t.attempt, t.lease::text, "
            "       extract(epoch FROM t.lease_expires - now())::float8 "
            "  FROM queue.take_next(stage => %s, batch => 1, "
            "                       lease_for => %s::float8 * interval '1 second', worker => %s) t",
            (a.stage, a.lease, self.worker_name)).fetchone()
        return Taken(row[0], row[1], row[2], row[3], row[4], a.stage) if row else None

    # -- one task -----------------------------------------------------------------------------
    def work(self, task: Taken) -> None:
        sh, a = self.shared, self.shared.args
        started = time.monotonic()
        env = dict(os.environ, SKIPLOCK_TASK_ID=str(task.id), SKIPLOCK_ATTEMPT=str(task.attempt),
                   SKIPLOCK_STAGE=task.stage)
        with sh.lock:
            sh.running += 1
        try:
            try:
                with sh.lock:
                    if sh.abort.is_set():  # taken as the grace ended: hand it back unrun
                        proc = None
                    else:
                        proc = subprocess.Popen(sh.argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                                start_new_session=True, preexec_fn=DIE_WITH_THE_WORKER)
                        sh.procs[self.index] = proc
                if proc is None:
                    self.end(task, "shutdown", None, started)
                    return
            except OSError as e:  # not found, not executable: this attempt fails like a crash would
                self.end(task, "fail", f"cannot run {sh.argv[0]}: {e}", started)
                return
            tail: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)  # pieces of at most STDERR_PIECE bytes
            feeder = threading.Thread(target=self._feed, args=(proc, task.payload), daemon=True)
            reader = threading.Thread(target=self._read_stderr, args=(proc, tail), daemon=True)
            feeder.start()
            reader.start()
            try:
                outcome = self._supervise(proc, task)
            finally:
                if proc.returncode is None:  # an error left the supervision: the command goes too
                    _signal_group(proc, signal.SIGKILL)
                    proc.wait()
                with sh.lock:
                    sh.procs.pop(self.index, None)
            reader.join(timeout=2.0)
            feeder.join(timeout=1.0)
            if outcome == "lost":
                sh.count("lost")
                if not a.quiet:
                    sh.log(f"task {task.id}: lease lost (reaped, cancelled or retaken): command killed, not finished")
                return
            if outcome == "aborted":
                self.end(task, "shutdown", f"worker shut down: command killed {sh.abort_why}; "
                                           + error_text(proc.returncode, tail), started)
            elif outcome == "timeout":
                self.end(task, "fail", error_text(proc.returncode, tail, timeout=self.limit), started)
            elif proc.returncode != 0 and self._stopped_with_us(proc.returncode):
                self.end(task, "shutdown", None, started)
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
    def _feed(proc: subprocess.Popen[bytes], payload: str) -> None:
        assert proc.stdin is not None  # Popen(stdin=PIPE)
        try:
            proc.stdin.write(payload.encode())
            proc.stdin.close()
        except OSError:  # the command does not read its stdin: fine
            pass

    def _stopped_with_us(self, returncode: int) -> bool:
        """Did the command end by the signal that stops the worker (STOP_SIGNALS)? Then it waits
        STOP_WAIT for the worker's own handler, which may run after the command has died."""
        if -returncode not in STOP_SIGNALS and returncode - 128 not in STOP_SIGNALS:
            return False
        return self.shared.stopping.wait(STOP_WAIT)

    @staticmethod
    def _read_stderr(proc: subprocess.Popen[bytes], tail: collections.deque[str]) -> None:
        """Copy the command's stderr to ours, keeping its last pieces: a line is read in pieces of
        at most STDERR_PIECE bytes, so one long line does not take the worker's memory up."""
        assert proc.stderr is not None  # Popen(stderr=PIPE)
        for piece in iter(lambda: proc.stderr.readline(STDERR_PIECE), b""):  # type: ignore[union-attr]
            tail.append(piece.decode(errors="replace"))
            sys.stderr.buffer.write(piece)
            sys.stderr.flush()

    def _supervise(self, proc: subprocess.Popen, task: Taken) -> str:
        """Wait for the command, heartbeating; returns 'exited', 'lost', 'aborted' or 'timeout'."""
        sh = self.shared
        self.limit = task.timeout   # the time limit this command runs under (the stage's may change meanwhile)
        deadline = None if self.limit is None else time.monotonic() + self.limit
        outcome, killed_at = "exited", None
        while True:
            try:
                proc.wait(timeout=0.1)
                if outcome == "exited" and proc.returncode != 0 and sh.abort.is_set():
                    outcome = "aborted"  # the main thread's kill at the end of the grace got there first
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
            if deadline is not None and now >= deadline:
                outcome, killed_at = "timeout", now
                _signal_group(proc, signal.SIGTERM)
                continue
            try:
                alive = self.beat(task)
            except psycopg.Error:
                _signal_group(proc, signal.SIGKILL)
                raise
            if not alive:
                outcome, killed_at = "lost", now
                _signal_group(proc, signal.SIGTERM)

    def beat(self, task: Taken) -> bool:
        """Heartbeat the task if one is due; False once its lease is lost (SK001). An error that
        passes by waiting is tried again within a second, on a new connection (one bounded try,
        never the waiting reconnect loop: a command is supervised meanwhile) if this one broke;
        any other is raised."""
        now = time.monotonic()
        if now < task.next_beat:
            return True
        a = self.shared.args
        try:
            left = one(self.db.execute(
                "SELECT extract(epoch FROM queue.heartbeat(%s, %s, lease_for => %s::float8 * interval '1 second', "
                "stage => %s) - now())::float8", (task.id, task.lease, a.lease, task.stage)))[0]
            task.expires = now + left
            task.next_beat = now + task.every()
            return True
        except psycopg.Error as e:
            if e.sqlstate == "SK001":
                return False
            if not transient(e):
                raise
            if self.conn is None or self.conn.closed or self.conn.broken or prepared_lost(e):
                self.reconnect_once()
            task.next_beat = time.monotonic() + min(task.every(), 1.0)
            return True

    def end(self, task: Taken, how: str, error: str | None, started: float) -> None:
        """finish, fail or release the attempt. An error that passes by waiting is retried with
        backoff while the task's lease holds (heartbeating meanwhile); then Unrecorded. A fail
        whose error text the server refuses is sent once more with a plain text instead."""
        sh, a = self.shared, self.shared.args
        params: tuple[Any, ...]
        if how == "finish":
            sql, params = "SELECT queue.finish(%s, %s, stage => %s)", (task.id, task.lease, task.stage)
        elif how == "shutdown":
            # Not the task's fault: hand it back without using up an attempt.
            sql, params = "SELECT queue.release(%s, %s, stage => %s)", (task.id, task.lease, task.stage)
        elif how == "snooze":
            sql = "SELECT queue.release(%s, %s, retry_in => %s::float8 * interval '1 second', stage => %s)"
            params = (task.id, task.lease, a.snooze, task.stage)
        else:
            sql = ("SELECT queue.fail(%s, %s, %s, fatal => %s, "
                   "retry_in => %s::float8 * interval '1 second', stage => %s)")
            params = (task.id, task.lease, error, how == "fatal", None, task.stage)
        what = {"finish": "finished", "shutdown": "released", "snooze": "handed back",
                "fail": "failed", "fatal": "failed"}[how]
        delay, replaced = slots.BACKOFF_FIRST, False
        while True:
            try:
                ok = one(self.db.execute(sql, params))[0]
                break
            except psycopg.Error as e:
                if transient(e):
                    # Give up when the next wait would outlast the lease: then reap_hung hands it back.
                    if time.monotonic() + delay >= task.expires or (sh.abort.is_set() and not self.db_alive()):
                        raise Unrecorded(f"task {task.id} could not be {what}: {describe_error(e)}; it stays "
                                         "running until its lease expires (then queue.reap_hung, run by "
                                         "`skiplock maintain` or a worker, hands it back)") from e
                    delay = self.recover(e, f"task {task.id} not {what} yet", delay, bounded=True)
                    try:
                        alive = self.beat(task)
                    except psycopg.Error:
                        alive = True   # said by the next try of the statement itself
                    if not alive:
                        ok = False
                        break
                    continue
                # The server answered, so the connection is fine: an error text it cannot
                # store must not kill the slot and leave the task running under its lease.
                if how not in ("fail", "fatal") or replaced:
                    raise
                replaced = True
                why = f"SQLSTATE {e.sqlstate}" if e.sqlstate else type(e).__name__
                error = f"{(error or '').partition(';')[0]} (stderr not storable: {why})"
                params = (task.id, task.lease, error, how == "fatal", None, task.stage)
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
            first = _summary(error)
            sh.log(f"task {task.id} attempt {task.attempt}: {word} in {took:.2f} s" + (f" ({first})" if first else ""))

    def db_alive(self) -> bool:
        return self.conn is not None and not self.conn.closed and not self.conn.broken


def _summary(error: str | None) -> str:
    """The error on one line for the per-task log: how it ended and the last line of stderr."""
    if not error:
        return ""
    how, _, lines = error.partition("\n")
    last = lines.rstrip().rsplit("\n", 1)[-1].strip()
    if not last:
        return how
    if len(last) > 200:
        last = last[:199] + "…"
    return how.replace("last lines of stderr:", "last line of stderr:") + " " + last


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def maintain_every(args: argparse.Namespace) -> float:
    """How often a worker tries to run queue.maintain(): --maintain-every, else every
    MAINTAIN_EVERY seconds or a third of --lease if shorter, so that the task of a worker that
    died is back within its lease and a round."""
    if args.maintain_every is not None:
        return float(args.maintain_every)
    return min(MAINTAIN_EVERY, args.lease / 3.0) if args.lease else MAINTAIN_EVERY


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
    # --stage a --stage b, or --stage a,b: several stages, taken with take_next(stages[]), as a prefix 'x*' is.
    args.stages = list(dict.fromkeys(s.strip() for given in args.stage for s in given.split(",") if s.strip()))
    if not args.stages:
        print("skiplock worker: give a stage, e.g. --stage resize", file=sys.stderr)
        return 2
    args.stage = ",".join(args.stages)
    sh = Shared(args, url, argv)
    try:  # fail fast on a wrong URL or a database without skiplock
        with connect.connect(url) as conn:
            conn.execute("SELECT 'queue.take_next(text,integer,interval,text)'::regprocedure")
    except psycopg.Error as e:
        print(f"skiplock worker: {describe_error(e)}", file=sys.stderr)
        return 1

    def stopping(signal_name: str) -> str:
        with sh.lock:
            running = sh.running
        if running:
            return f"{signal_name}: draining, {running} command(s) running, grace {args.grace:g} s"
        return f"{signal_name}: stopping, no command running"

    gave_up = 0
    with slots.stop_signals(sh, args.grace, stopping, "killing running commands now"):
        workers = [Slot(sh, i) for i in range(args.concurrency)]
        if not args.quiet:
            sh.log(f"{args.concurrency} slot(s) running {' '.join(argv)}")
        if sh.maintains and not args.until_empty:
            slots.Maintainer(sh, maintain_every(args)).start()
        try:
            for w in workers:
                w.start()
            last_report = time.monotonic()
            killed_at: float | None = None
            while any(w.is_alive() for w in workers):
                for w in workers:
                    w.join(timeout=0.1)
                now = time.monotonic()
                if sh.deadline is not None and not sh.abort.is_set():
                    if now >= sh.deadline:
                        with sh.lock:
                            running = sh.running
                        if running:
                            sh.log(f"grace over: killing {running} running command(s), then releasing their tasks "
                                   "(ready again, attempt not counted)")
                        sh.abort_why = f"after the grace of {args.grace:g} s"
                        sh.abort.set()
                    elif now - max(last_report, sh.deadline - args.grace) >= 5.0:
                        last_report = now
                        with sh.lock:
                            running = sh.running
                        if running:
                            sh.log(f"draining: {running} command(s) still running, "
                                   f"{max(sh.deadline - now, 0):.0f} s of grace left")
                if sh.abort.is_set():
                    # The kill comes from here, whatever the slots are doing (waiting for a database that
                    # is down, say): first the commands, then their slots may release the tasks.
                    if killed_at is None:
                        killed_at = now
                        sh.kill_commands(signal.SIGTERM)
                    elif now - killed_at > KILL_WAIT:
                        sh.kill_commands(signal.SIGKILL)
                    if now - killed_at > KILL_WAIT + RELEASE_WAIT:
                        gave_up = sum(w.is_alive() for w in workers)
                        break
        finally:
            sh.kill_commands(signal.SIGKILL)  # none is left running when the worker exits (normally none is)
    errors = [w.error for w in workers if w.error is not None]
    c = sh.counts
    if not args.quiet or errors or gave_up or c["unrecorded"]:
        sh.log(f"stopped: {c['done']} done, {c['failed']} failed, {c['fatal']} fatal, {c['snoozed']} snoozed, "
               f"{c['released (shutdown)']} interrupted, {c['lost']} lease lost"
               + (f", {c['unrecorded']} not recorded (left to their leases)" if c["unrecorded"] else ""))
    for error in errors[:1]:
        sh.log("error: " + (describe_error(error) if isinstance(error, psycopg.Error) else repr(error)))
    if gave_up:
        sh.log(f"error: {gave_up} slot(s) could not reach the database within {RELEASE_WAIT:g} s of the kill: "
               "their tasks stay running until their leases expire")
        return 1
    return 1 if errors or c["unrecorded"] else 0
