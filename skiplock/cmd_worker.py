"""`skiplock worker --stage S -- COMMAND …`: run a command once per task, over skiplock.worker.

The loop is the library's (skiplock/worker.py, Worker): it takes the tasks of the stages named
(queue.take_next), at most --concurrency at a time, heartbeats their leases, reads the stages'
task_timeout and pause (queue.worker_settings), maintains the queue (queue.maintain_now()),
retries what passes by waiting (a finish while its lease holds), finds a transaction pooler,
LISTENs or polls, drains on SIGTERM or SIGINT and, with --until-empty, stops once nothing is due.
This module only parses the options and supplies the handler: it runs COMMAND with the payload
on stdin and SKIPLOCK_TASK_ID, SKIPLOCK_ATTEMPT and SKIPLOCK_STAGE in its environment; exit 0
finishes the task, --snooze-exit-code hands it back (due --snooze seconds later, the attempt not
counted), --fatal-exit-code fails it for good, any other exit fails the attempt with the last
lines of stderr. When the library cancels the task (Task.cancelled(): its time limit passed, its
lease was lost, or the grace after the stop is over) the handler kills the command's process group
(SIGTERM, SIGKILL KILL_WAIT later) and says how it ended. Commands run in their own session, so a
Ctrl-C on the terminal reaches the worker only. On Linux a command also gets SIGKILL when its
worker dies (prctl PR_SET_PDEATHSIG), so a worker killed with -9 leaves no command behind (its task
waits for its lease to expire; processes the command started itself are not covered). Each task's
end is one log line (Worker(on_end=…)), the library's own lines go to the same console.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable

import psycopg
from rich.console import Console

from skiplock import connect
from skiplock.errors import describe_error
from skiplock.worker import Ending, Fail, Fatal, Interrupted, Refused, Snooze, Task, Unreachable, Worker, storable

STDERR_LINES = 20      # lines of stderr kept as the error of a failed attempt
STDERR_PIECE = 65536   # a longer line of stderr is read (and kept) in pieces of this many bytes
STDERR_CHARS = 1900    # and at most this much of their end (the database keeps 2,000 characters)
KILL_WAIT = 5.0        # seconds between SIGTERM and SIGKILL of a command's process group
MAINTAIN_EVERY = 10.0  # seconds between a worker's tries at queue.maintain_now() (maintain_every)

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
        # The death signal goes with the thread that forked (the library's handler thread, which
        # outlives its command) and is kept across exec. A worker that died before prctl: do not run it.
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
        if getppid() != parent:
            kill_self(1)
    return die_with_the_worker


DIE_WITH_THE_WORKER = _death_signal()


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
    """How often a worker tries to run queue.maintain_now(): 0 with --no-maintain, --maintain-every,
    else every MAINTAIN_EVERY seconds or a third of --lease if shorter, so that the task of a worker
    that died is back within its lease and a round."""
    if args.no_maintain:
        return 0.0
    if args.maintain_every is not None:
        return float(args.maintain_every)
    return min(MAINTAIN_EVERY, args.lease / 3.0) if args.lease else MAINTAIN_EVERY


class ToConsole(logging.Handler):
    """The library's log lines (logger skiplock.worker) on the console, as the command's own."""

    def __init__(self, say: Callable[[str], None]) -> None:
        super().__init__()
        self.say = say

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.say(record.getMessage())
        except Exception:  # noqa: BLE001 - logging must not raise
            self.handleError(record)


class Command:
    """The handler: COMMAND once per task; its counts and log lines (on_end)."""

    def __init__(self, args: argparse.Namespace, argv: list[str]) -> None:
        self.args, self.argv = args, argv
        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.lock = threading.Lock()
        self.procs: dict[int, subprocess.Popen[bytes]] = {}   # task id -> its running command
        self.counts: collections.Counter[str] = collections.Counter()
        self.intent: dict[int, str] = {}   # task id -> what its end was to be ("finished", "released", …)
        self.worker: Worker | None = None

    def log(self, message: str) -> None:
        self.console.print(f"{time.strftime('%H:%M:%S')} skiplock worker {self.args.stage}: {message}", markup=False)

    def running(self) -> int:
        with self.lock:
            return len(self.procs)

    def kill_all(self) -> None:
        """SIGKILL what still runs (normally nothing) as the worker exits."""
        with self.lock:
            for proc in self.procs.values():
                if proc.returncode is None:
                    _signal_group(proc, signal.SIGKILL)

    # -- one task -----------------------------------------------------------------------------
    def __call__(self, task: Task) -> None:
        a = self.args
        self.intent[task.id] = "failed"
        env = dict(os.environ, SKIPLOCK_TASK_ID=str(task.id), SKIPLOCK_ATTEMPT=str(task.attempt),
                   SKIPLOCK_STAGE=task.stage)
        if task.cancelled():   # cut short before it started
            self.intent[task.id] = "released"
            raise Interrupted(f"worker shut down before the command ran ({task.cancel_reason})")
        try:
            proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                    start_new_session=True, preexec_fn=DIE_WITH_THE_WORKER)
        except OSError as e:  # not found, not executable: this attempt fails like a crash would
            raise Fail(f"cannot run {self.argv[0]}: {e}") from None
        with self.lock:
            self.procs[task.id] = proc
        tail: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)  # pieces of at most STDERR_PIECE bytes
        payload = task.payload   # the JSON text the server sent (raw_payload=True)
        feeder = threading.Thread(target=self._feed, args=(proc, payload), daemon=True)
        reader = threading.Thread(target=self._read_stderr, args=(proc, tail), daemon=True)
        feeder.start()
        reader.start()
        try:
            reason = self._supervise(proc, task)
        finally:
            if proc.returncode is None:  # an error left the supervision: the command goes too
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
            with self.lock:
                self.procs.pop(task.id, None)
        reader.join(timeout=2.0)
        feeder.join(timeout=1.0)
        rc = proc.returncode
        if reason == "lost":
            self.intent[task.id] = "lost"
            return None   # nothing is recorded: the lease is no longer ours
        if reason == "shutdown":
            self.intent[task.id] = "released"
            raise Interrupted(f"worker shut down: command killed {task.cancel_detail}; " + error_text(rc, tail))
        if reason == "timeout":
            raise Fail(error_text(rc, tail, timeout=task.timeout))
        if rc != 0 and self._stopped_with_us(rc):
            self.intent[task.id] = "released"
            raise Interrupted("command stopped with the worker: " + error_text(rc, tail))
        if rc == 0:
            self.intent[task.id] = "finished"
            return None
        if a.fatal_exit_code is not None and rc == a.fatal_exit_code:
            raise Fatal(error_text(rc, tail))
        if a.snooze_exit_code is not None and rc == a.snooze_exit_code:
            self.intent[task.id] = "handed back"
            raise Snooze(a.snooze)
        raise Fail(error_text(rc, tail))

    @staticmethod
    def _supervise(proc: subprocess.Popen, task: Task) -> str | None:
        """Wait for the command; once the task is cancelled, SIGTERM its process group and SIGKILL
        KILL_WAIT later. The reason it was cancelled (timeout, lost, shutdown), else None."""
        killed_at = None
        while True:
            try:
                proc.wait(timeout=0.1)
                if task.cancel_reason == "shutdown" and killed_at is None and proc.returncode == 0:
                    return None   # it ended well as the grace ran out: finished
                return task.cancel_reason
            except subprocess.TimeoutExpired:
                pass
            if killed_at is None:
                if task.cancelled():
                    killed_at = time.monotonic()
                    _signal_group(proc, signal.SIGTERM)
            elif time.monotonic() - killed_at > KILL_WAIT:
                _signal_group(proc, signal.SIGKILL)

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
        return self.worker is not None and self.worker.stopping(STOP_WAIT)

    @staticmethod
    def _read_stderr(proc: subprocess.Popen[bytes], tail: collections.deque[str]) -> None:
        """Copy the command's stderr to ours, keeping its last pieces: a line is read in pieces of
        at most STDERR_PIECE bytes, so one long line does not take the worker's memory up."""
        assert proc.stderr is not None  # Popen(stderr=PIPE)
        for piece in iter(lambda: proc.stderr.readline(STDERR_PIECE), b""):  # type: ignore[union-attr]
            tail.append(piece.decode(errors="replace"))
            sys.stderr.buffer.write(piece)
            sys.stderr.flush()

    # -- the log line per task ----------------------------------------------------------------
    def on_end(self, task: Task, end: Ending) -> None:
        intent = self.intent.pop(task.id, "failed")
        if task.cancel_reason == "shutdown" and intent != "finished":   # the library releases it
            intent = "released"
        word = {"finished": "done", "failed": "failed", "fatal": "fatal", "snoozed": "snoozed",
                "released": "released (shutdown)", "lost": "lost", "unrecorded": "unrecorded"}[end.what]
        with self.lock:
            self.counts[word] += 1
        if end.what == "unrecorded":
            why = describe_error(end.cause) if end.cause is not None else (end.error or "")
            self.log(f"task {task.id} could not be {intent}: {why}; it stays running until its lease expires "
                     "(then queue.reap_hung, run by `skiplock maintain` or a worker, hands it back)")
            return
        if self.args.quiet:
            return
        if end.what == "lost":
            if task.cancel_reason == "lost":
                self.log(f"task {task.id}: lease lost (reaped, cancelled or retaken): command killed, not finished")
            else:
                self.log(f"task {task.id}: lease lost before it was {intent}: nothing recorded")
            return
        first = _summary(end.error)
        self.log(f"task {task.id} attempt {task.attempt}: {word} in {end.seconds:.2f} s" + (f" ({first})" if first else ""))


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
    try:  # fail fast on a wrong URL or a database without skiplock
        with connect.connect(url) as conn:
            conn.execute("SELECT 'queue.take_next(text,integer,interval,text)'::regprocedure")
    except psycopg.Error as e:
        print(f"skiplock worker: {describe_error(e)}", file=sys.stderr)
        return 1
    command = Command(args, argv)
    worker = Worker(url, {stage: command for stage in args.stages}, batch=1, concurrency=args.concurrency,
                    lease=args.lease, idle_wait=args.poll, name=args.name, pooler=connect.pooler(),
                    maintain_every=maintain_every(args), task_timeout=args.timeout, shutdown_timeout=args.grace,
                    until_empty=args.until_empty, cancel_wait=KILL_WAIT + 5.0, on_end=command.on_end,
                    raw_payload=True)
    command.worker = worker
    library = logging.getLogger("skiplock.worker")
    console = ToConsole(command.log)
    library.addHandler(console)
    library.setLevel(logging.WARNING if args.quiet else logging.INFO)
    library.propagate = False
    logging.getLogger("skiplock.worker.task").disabled = True   # on_end says each task's end
    old = {s: signal.signal(s, worker.on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    error: BaseException | None = None
    try:
        if not args.quiet:
            command.log(f"{args.concurrency} slot(s) running {' '.join(argv)}")
        worker.run()
    except (Refused, Unreachable) as e:
        error = e
    finally:
        command.kill_all()   # none is left running when the worker exits (normally none is)
        for s, handler in old.items():
            signal.signal(s, handler)
        library.removeHandler(console)
    c = command.counts
    if not args.quiet or error is not None or c["unrecorded"]:
        command.log(f"stopped: {c['done']} done, {c['failed']} failed, {c['fatal']} fatal, {c['snoozed']} snoozed, "
                    f"{c['released (shutdown)']} interrupted, {c['lost']} lease lost"
                    + (f", {c['unrecorded']} not recorded (left to their leases)" if c["unrecorded"] else ""))
    if error is not None:
        cause = error.__cause__
        command.log("error: " + (describe_error(cause) if isinstance(cause, psycopg.Error) else str(error)))
    return 1 if error is not None or c["unrecorded"] else 0
