"""`skiplock run-sql --stage S`: the executor of one role's SQL tasks (queue.enqueue_sql).

The login of --db / DATABASE_URL is the role whose tasks it runs: run_sql_tasks claims only the
tasks that the session's login role enqueued, and refuses to run under SET ROLE, so a request has
exactly that role's privileges. One process per enqueuing role (a member of skiplock_sql).

Each of --concurrency executors is a thread with its own autocommit connection that loops
`CALL queue.run_sql_tasks(stage, K, worker)`: the procedure claims, runs and records up to K due
tasks, committing after each. A call that ran fewer than K found no more due tasks of the role
(or the stage at its max_running): the executor then sleeps on LISTEN "skiplock.<stage>" with a
slow poll, so a lost notification, or a task planned for later, waits at most --poll seconds.
A request runs on the executor's own session: after a call the executor LISTENs again (the
request may have run UNLISTEN *) and never prepares the CALL (it may have run DEALLOCATE ALL).

PostgreSQL's statement_timeout covers a whole CALL, so a task's own timeout needs someone outside:
one more connection (the same login) calls queue.cancel_overdue_sql_tasks() every
--watchdog-interval seconds, which cancels the statements that ran past their timeout (recorded
as 57014) and, 5 s on, terminates the session of a request that ignored the cancel (the executor
then reconnects; the task is recorded as timed out).

SIGTERM or SIGINT: stop calling; running calls may end on their own within --grace; then the
watchdog connection cancels (pg_cancel_backend) each call still running: run_sql_tasks hands the
task it was running back with release() (ready again, the attempt not counted) and returns. A
signal that lands between two statements of the procedure (while it records a task or cleans up)
is absorbed there, so a call still running RECANCEL seconds later is cancelled again. A second
SIGTERM cancels at once. The executors' connection, LISTEN, reconnect and idle code and the
two-step stop are skiplock/slots.py's (once shared with `skiplock worker`, which now runs on
skiplock.worker).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import psycopg
import psycopg.errors

from skiplock import connect, slots
from skiplock.db import one
from skiplock.errors import describe_error, primary_message

RECANCEL = 0.5   # seconds before a call still running after a stop cancel is cancelled again (the first was absorbed)
CALL = "CALL queue.run_sql_tasks(%s, %s, %s)"


class Shared(slots.Shared):
    """The stop flags, counters and console of the slots (slots.Shared), plus the calls in flight."""

    def __init__(self, args: argparse.Namespace, url: str) -> None:
        super().__init__(args, url, "run-sql")
        self.in_call: dict[int, tuple[int, int]] = {}   # executor index -> (backend pid, call number) of its running CALL
        self.stop_cancelled: set[int] = set()   # executor indexes whose running CALL got a stop cancel
        self.calls = 0
        self.role = "?"   # the login, whose tasks these are (set by run())

    def label(self) -> str:
        return f"{super().label()} ({self.role})"


class Executor(slots.Slot[Shared]):
    """One connection looping CALL queue.run_sql_tasks; connect, reconnect and idle as a worker slot."""

    def __init__(self, shared: Shared, index: int) -> None:
        super().__init__(shared, index, f"executor-{index}")

    def run(self) -> None:
        sh = self.shared
        try:
            self.conn = self.connect()
            while not sh.stopping.is_set():
                try:
                    ran = self.call()
                except psycopg.Error as e:
                    if self.after_failed_call(e):
                        continue
                    return
                if ran:
                    self.listen_again()
                if ran < sh.args.max_tasks_per_call:
                    self.idle()
        except psycopg.OperationalError as e:
            if not sh.stopping.is_set():
                self.error = e
        except BaseException as e:  # reported by the main thread, which exits 1
            self.error = e
        finally:
            if self.error is not None:
                sh.stopping.set()
            if self.conn is not None:
                self.conn.close()

    def call(self) -> int:
        sh, a = self.shared, self.shared.args
        with sh.lock:
            sh.calls += 1
            sh.in_call[self.index] = (self.db.info.backend_pid, sh.calls)
            sh.stop_cancelled.discard(self.index)
            sh.running += 1
        try:
            # prepare=False: a request may DEALLOCATE ALL on this session.
            ran = one(self.db.execute(CALL, (a.stage, a.max_tasks_per_call, self.worker_name), prepare=False))[0]
        finally:
            with sh.lock:
                del sh.in_call[self.index]
                sh.running -= 1
        with sh.lock:
            # A stop cancel that hit a request made run_sql_tasks hand that task back and return
            # (counted in ran); one that hit the claim made it return without it. The server does
            # not say which: a call cancelled at stop that ran tasks is taken to have handed back
            # its last one (wrong only if the signal landed in the milliseconds of a claim, or of
            # recording the call's last task).
            released = 1 if ran and self.index in sh.stop_cancelled else 0
            sh.counts["ran"] += ran - released
            sh.counts["released"] += released
            sh.counts["calls"] += 1
            total = sh.counts["ran"]
        if ran and not a.quiet:
            sh.log(f"{self.name}: ran {ran - released} task(s), {total} in all"
                   + ("; handed one back at stop" if released else ""))
        return ran

    def after_failed_call(self, e: psycopg.Error) -> bool:
        """Deal with a CALL that raised; False when this executor should end (we are stopping)."""
        sh = self.shared
        if self.db.broken or self.db.closed:  # the connection is gone: the server restarted, ...
            if sh.stopping.is_set():
                return False
            self.reconnect()
            return True
        if isinstance(e, psycopg.errors.QueryCanceled):
            # A cancel that reached the CALL outside the procedure's handlers (between two of its
            # statements): our stop, or a watchdog signal that came late.
            sh.count("cancelled calls")
            if sh.stopping.is_set():
                return False
            sh.log(f"{self.name}: call cancelled outside a task; calling again on a new connection")
            self.fresh_session()
            return True
        # The call failed outside a task's own error handling (the login lost skiplock_sql, a
        # lock or resource error in the procedure itself, ...): a task it had claimed stays
        # running until its lease expires. Keep serving the stage.
        sh.count("failed calls")
        if sh.stopping.is_set():
            return False
        sh.log(f"{self.name}: call failed ({primary_message(e)}); calling again on a new connection "
               "(a task the call had claimed stays running until its lease expires)")
        self.fresh_session()
        self.idle()
        return True

    def fresh_session(self) -> None:
        """Reconnect after a call that ended in an error: a task left running under this backend's
        pid would draw the watchdog's cancels onto whatever this session runs next."""
        try:
            self.reconnect()
        except psycopg.OperationalError:
            if not self.shared.stopping.is_set():
                raise

    def listen_again(self) -> None:
        """A request runs on this session and may have run UNLISTEN *: LISTEN again (a no-op if not)."""
        try:
            self.listen(self.db)
        except psycopg.errors.QueryCanceled:
            pass  # a late cancel; the slow poll covers this round
        except psycopg.OperationalError:
            if not self.shared.stopping.is_set():
                self.reconnect()


class Watchdog(threading.Thread):
    """The extra connection (the same login): SELECT queue.cancel_overdue_sql_tasks() every
    --watchdog-interval; after the grace, pg_cancel_backend of each executor still in a call."""

    def __init__(self, shared: Shared) -> None:
        super().__init__(name="watchdog", daemon=True)
        self.shared = shared
        self.done = threading.Event()      # every executor has ended
        self.error: BaseException | None = None
        self.cancelled_overdue = 0
        self.cancelled_at_stop = 0
        self.conn: psycopg.Connection | None = None

    def connect(self) -> psycopg.Connection:
        delay = slots.BACKOFF_FIRST
        while True:
            try:
                return connect.connect(self.shared.url)
            except psycopg.OperationalError as e:
                if self.done.is_set():
                    raise
                self.shared.log(f"watchdog cannot connect ({e.__class__.__name__}); retrying in {delay:.1f} s")
                self.done.wait(delay)
                delay = min(delay * 2, slots.BACKOFF_MAX)

    def run(self) -> None:
        sh, a = self.shared, self.shared.args
        next_check = 0.0
        last_cancel: dict[int, float] = {}   # call number -> when we last cancelled it at stop
        try:
            self.conn = self.connect()
            while not self.done.is_set():
                try:
                    now = time.monotonic()
                    if now >= next_check:
                        n = one(self.conn.execute("SELECT queue.cancel_overdue_sql_tasks()"))[0]
                        next_check = now + a.watchdog_interval
                        if n:
                            self.cancelled_overdue += n
                            if not a.quiet:
                                sh.log(f"watchdog: cancelled (or terminated) {n} statement(s) past their timeout")
                    if sh.abort.is_set():
                        with sh.lock:
                            calls = list(sh.in_call.items())
                        for index, (pid, number) in calls:
                            # A stop cancel makes the call hand its task back and return; one that
                            # landed between statements was absorbed: again after RECANCEL.
                            if now - last_cancel.get(number, -RECANCEL) >= RECANCEL:
                                last_cancel[number] = now
                                with sh.lock:
                                    if sh.in_call.get(index) != (pid, number):
                                        continue  # the call has just returned
                                    sh.stop_cancelled.add(index)
                                self.conn.execute("SELECT queue.stop_sql_executor(%s)", (pid,))
                                self.cancelled_at_stop += 1
                except psycopg.Error:
                    if not (self.conn.broken or self.conn.closed):
                        raise  # the server said no: reported, and the process stops
                    sh.count("reconnects")
                    try:
                        self.conn.close()
                    except Exception:
                        pass
                    self.conn = self.connect()
                    continue
                self.done.wait(min(0.05, a.watchdog_interval))
        except psycopg.OperationalError as e:
            if not self.done.is_set():
                self.error = e
        except BaseException as e:
            self.error = e
        finally:
            if self.error is not None:
                sh.stopping.set()
                sh.abort.set()
            if self.conn is not None:
                self.conn.close()


def run(url: str, args: argparse.Namespace) -> int:
    if args.grace < 0:
        print("skiplock run-sql: --grace must not be negative", file=sys.stderr)
        return 2
    try:
        connect.require_session("skiplock run-sql")
    except connect.PoolerError as e:
        print(f"skiplock run-sql: {e}", file=sys.stderr)
        return 2
    try:  # fail fast on a wrong URL, a database without SQL tasks, or a login that may not run them
        with connect.connect(url) as conn:
            # Membership first, on its own: looking the functions up needs USAGE on schema queue,
            # which only skiplock's roles have, so a login outside them would get "permission denied".
            role, current, installed, member = one(conn.execute(
                # Qualified and exact-typed, as all SQL on this session (its search_path is the
                # role's, which may hold a schema others create operators in).
                "SELECT session_user::pg_catalog.text, current_user::pg_catalog.text, r.oid IS NOT NULL, "
                "       pg_catalog.pg_has_role(session_user, r.oid, 'MEMBER'::pg_catalog.text) "
                "  FROM (SELECT) AS one LEFT JOIN pg_catalog.pg_roles r"
                "    ON r.rolname OPERATOR(pg_catalog.=) 'skiplock_sql'::pg_catalog.name"))
            if current != role:
                print(f"skiplock run-sql: the session is {role} acting as {current} (SET ROLE): connect as the role whose "
                      f"SQL tasks to run, e.g. with {current}'s own login (run_sql_tasks refuses SET ROLE)", file=sys.stderr)
                return 1
            if not installed:
                print("skiplock run-sql: role skiplock_sql does not exist: skiplock (with SQL tasks) is not installed "
                      "on this server: run `skiplock upgrade`", file=sys.stderr)
                return 1
            if member:
                try:
                    member = one(conn.execute(
                        "SELECT pg_catalog.has_function_privilege("
                        "           'queue.run_sql_tasks(text,integer,text,integer)'::pg_catalog.regprocedure::pg_catalog.oid,"
                        "           'EXECUTE'::pg_catalog.text) "
                        "   AND pg_catalog.has_function_privilege("
                        "           'queue.cancel_overdue_sql_tasks()'::pg_catalog.regprocedure::pg_catalog.oid,"
                        "           'EXECUTE'::pg_catalog.text)"
                    ))[0]
                except psycopg.errors.InsufficientPrivilege:
                    member = False
    except psycopg.Error as e:
        print(f"skiplock run-sql: {describe_error(e)}", file=sys.stderr)
        return 1
    if not member:
        print(f"skiplock run-sql: role {role} may not run SQL tasks: GRANT skiplock_sql TO {role} "
              "(an executor runs the tasks that its login role enqueued, as that role)", file=sys.stderr)
        return 1

    sh = Shared(args, url)
    sh.role = role

    def stopping(signal_name: str) -> str:
        with sh.lock:
            running = len(sh.in_call)
        return f"{signal_name}: stopping, {running} call(s) running, grace {args.grace:g} s"

    with slots.stop_signals(sh, args.grace, stopping, "cancelling running calls now"):
        watchdog = Watchdog(sh)
        executors = [Executor(sh, i) for i in range(args.concurrency)]
        if not args.quiet:
            sh.log(f"running the SQL tasks that role {role} enqueued: {args.concurrency} executor(s), "
                   f"up to {args.max_tasks_per_call} task(s) a call, watchdog every {args.watchdog_interval:g} s")
        try:
            watchdog.start()
            for x in executors:
                x.start()
            last_report = time.monotonic()
            while any(x.is_alive() for x in executors):
                for x in executors:
                    x.join(timeout=0.1)
                now = time.monotonic()
                if sh.stopping.is_set() and sh.deadline is None:  # an executor or the watchdog failed
                    sh.deadline = now + args.grace
                if sh.deadline is not None and not sh.abort.is_set():
                    if now >= sh.deadline:
                        with sh.lock:
                            running = len(sh.in_call)
                        if running:
                            sh.log(f"grace over: cancelling {running} running call(s); their tasks are released "
                                   "(ready again, attempt not counted)")
                        sh.abort.set()
                    elif now - last_report >= 5.0:
                        last_report = now
                        sh.log(f"stopping: {len(sh.in_call)} call(s) still running, "
                               f"{max(sh.deadline - now, 0):.0f} s of grace left")
        finally:
            watchdog.done.set()
            watchdog.join(timeout=5.0)
    threads: list[Executor | Watchdog] = [*executors, watchdog]
    errors = [x.error for x in threads if x.error is not None]
    c = sh.counts
    sh.log(f"stopped: {c['ran']} task(s) of role {role} run, {c['released']} handed back at stop, in {c['calls']} call(s) "
           f"by {args.concurrency} executor(s); {watchdog.cancelled_overdue} cancelled past their timeout; "
           f"{c['cancelled calls'] + c['failed calls']} call(s) ended in an error")
    for error in errors[:1]:
        sh.log(f"error: {primary_message(error)}")
    return 1 if errors else 0
