"""`make demo`: real workers drain real tasks through a two-stage pipeline, then a summary.

A throwaway cluster with PostgreSQL's default durability is started and stopped, unless --db or
DATABASE_URL names a database: then the demo migrates it, uses the stages demo.resize and
demo.publish there, and leaves it running. It watches and counts only the tasks it enqueued, and
reaps expired leases (queue.reap_hung, which covers every stage) only in its own throwaway cluster:
in a database of yours, that is the job of your `skiplock maintain`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing as mp
import os
import random
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from skiplock import connect, devdb, migrate
from skiplock.db import one
from skiplock.worker import Fail, Outcome, Task, Worker

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event

RESIZE, PUBLISH = "demo.resize", "demo.publish"


def resize(task: Task) -> Outcome:
    p = task.payload
    if p.get("corrupt"):
        raise Fail("bad input: not an image", fatal=True)
    if p.get("flaky") and task.attempt == 1:
        raise Fail("timeout talking to the image store")
    digest = p["image"].encode()
    for _ in range(200):  # a little real work per task
        digest = hashlib.sha256(digest).digest()
    return Outcome(next_stage=PUBLISH)


def publish(task: Task) -> Outcome:
    if task.payload.get("flaky_publish") and task.attempt == 1:
        raise Fail("CDN answered 503")
    return Outcome()


def _work(url: str, stop: Event, results: mp.Queue, index: int, parent: int) -> None:
    # A terminal's Ctrl-C reaches the whole process group; only the parent acts on it, through
    # `stop`, so each worker ends its batch instead of dying mid-batch with its tasks leased. It
    # was born with SIGINT blocked (see run), so none slips in before it is ignored. The fork also
    # copied the parent's SIGTERM and SIGHUP handlers (KeyboardInterrupt, devdb.stopped_on_signals):
    # terminate() should simply end it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # The demo's failed attempts are part of the show and counted in its summary: the library's
    # line per failed attempt (a warning) would bury it; errors still print.
    logging.getLogger("skiplock.worker").setLevel(logging.ERROR)
    worker = Worker(url, {RESIZE: resize, PUBLISH: publish}, batch=10, idle_wait=0.2,
                    name=f"demo-worker-{index}")
    counters = worker.run(should_stop=lambda: stop.is_set() or os.getppid() != parent)
    results.put((counters.taken, counters.finished, counters.failed, counters.lost))


@dataclass
class Summary:
    enqueued: int
    done: int
    fatal: int
    failed_attempts: int
    live: int
    elapsed: float
    workers: int
    errors: list[tuple[str, str, int]]   # (stage, error, tasks) of this run's fatal tasks, most first

    @property
    def accounted(self) -> bool:
        return self.live == 0 and self.done + self.fatal == self.enqueued


def run(url: str, tasks: int = 3000, workers: int = 4, seed: int | None = None, reap: bool = False) -> Summary:
    """Enqueue `tasks` and drain them; reap=True calls queue.reap_hung() (every stage's expired
    leases) as it waits: only for a database that holds nothing but the demo."""
    rng = random.Random(seed)
    run_id = uuid.uuid4().hex[:8]
    with connect.connect(url) as conn:
        # A dev cluster's superuser: its own queries below resolve nothing on a path others create in.
        conn.execute("SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', false)")
        for stage in (RESIZE, PUBLISH):
            conn.execute("SELECT queue.configure_stage(%s, lease_duration => '30 seconds', max_attempts => 3,"
                          " backoff => 'exponential', backoff_base => '50 milliseconds', backoff_cap => '1 second')",
                          (stage,))
        payloads = []
        for n in range(tasks):
            roll = rng.random()
            payloads.append(json.dumps({
                "run": run_id, "n": n, "image": f"img-{n:05d}.jpg",
                "corrupt": roll < 0.01, "flaky": 0.01 <= roll < 0.11, "flaky_publish": rng.random() < 0.05,
            }))
        started = time.monotonic()
        ids = [r[0] for r in conn.execute(
            "SELECT queue.enqueue_batch(%s::jsonb[], stage => %s)", (payloads, RESIZE)).fetchall()]
        print(f"enqueued {len(ids)} tasks into {RESIZE}; {workers} worker processes draining "
              f"{RESIZE} -> {PUBLISH}", flush=True)

        stop = mp.Event()
        results: mp.Queue = mp.Queue()
        procs = [mp.Process(target=_work, args=(url, stop, results, i, os.getpid())) for i in range(workers)]
        # The demo's own tasks by id: other applications' tasks, enqueued meanwhile, take ids
        # between the demo's.
        mine = "id = ANY(%(ids)s) AND stage IN (%(resize)s, %(publish)s)"
        params = {"ids": ids, "resize": RESIZE, "publish": PUBLISH}
        last_report = 0.0
        try:
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # inherited by the workers
            try:
                for p in procs:
                    p.start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            while True:
                live = one(conn.execute(f"SELECT count(*) FROM queue.tasks WHERE {mine} AND finished IS NULL",
                                        params))[0]
                if live == 0:
                    break
                now = time.monotonic()
                if now - last_report >= 1.0:
                    print(f"  {now - started:5.1f} s  {tasks - live:>6} of {tasks} through the pipeline "
                          f"or fatal", flush=True)
                    last_report = now
                if reap:  # the demo is also its own supervisor
                    conn.execute("SELECT queue.reap_hung()")
                time.sleep(0.1)
        finally:
            stop.set()
            for p in procs:
                if p.pid is None:  # never started
                    continue
                p.join(timeout=30)
                if p.is_alive():
                    p.terminate()
        elapsed = time.monotonic() - started
        failed = 0
        while not results.empty():
            failed += results.get()[2]
        row = one(conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'done' AND stage = %(publish)s),"
            "       count(*) FILTER (WHERE status = 'fatal'),"
            "       count(*) FILTER (WHERE finished IS NULL)"
            f"  FROM queue.tasks WHERE {mine}", params))
        errors = conn.execute(
            f"SELECT stage, error_text, count(*) FROM queue.tasks WHERE {mine} AND status = 'fatal'"
            " GROUP BY stage, error_text ORDER BY count(*) DESC, stage, error_text LIMIT 3", params).fetchall()
    return Summary(enqueued=len(ids), done=row[0], fatal=row[1], failed_attempts=failed, live=row[2],
                   elapsed=elapsed, workers=workers, errors=errors)


def print_summary(s: Summary) -> None:
    print()
    print(f"skiplock demo: {s.enqueued} tasks through {RESIZE} -> {PUBLISH}, {s.workers} worker processes")
    print(f"  enqueued        {s.enqueued:>7}")
    print(f"  done            {s.done:>7}   finished both stages")
    print(f"  fatal           {s.fatal:>7}   bad input, never retried")
    print(f"  retried         {s.failed_attempts - s.fatal:>7}   failed attempts that were retried")
    print(f"  still live      {s.live:>7}")
    print(f"  throughput      {s.enqueued / s.elapsed:>7.0f}   tasks/s through both stages ({s.elapsed:.1f} s)")
    verdict = "yes" if s.accounted else "NO"
    print(f"  every task accounted for (done + fatal = enqueued, none live): {verdict}")
    if s.errors:
        print("  why tasks failed for good (this run's fatal tasks):")
        for stage, error, count in s.errors:
            print(f"    {count:>5}  {stage}: {error}")


def main(tasks: int = 3000, workers: int = 4, url: str | None = None) -> int:
    """The demo on url (else DATABASE_URL, else a throwaway cluster)."""
    url = url or os.environ.get("DATABASE_URL")
    cluster = None
    with devdb.stopped_on_signals():
        try:
            if url:
                print("using the given database (it stays running; reaping expired leases is left to "
                      "its `skiplock maintain`)", flush=True)
            else:
                print("starting a throwaway PostgreSQL cluster (default durability)", flush=True)
                cluster = devdb.Cluster(durable=True).start()
                url = cluster.url()
            print("alembic upgrade head", flush=True)
            migrate.upgrade(url)
            summary = run(url, tasks, workers, reap=cluster is not None)
            print_summary(summary)
            return 0 if summary.accounted else 1
        finally:
            if cluster is not None:
                cluster.stop()
                print("throwaway cluster stopped and removed")


if __name__ == "__main__":
    sys.exit(main())
