"""Rate limits under real concurrency: 16 takers for a minute, counted per window afterwards.

Stage rate.stage has rate_limit 20 a second; stage rate.group 5 a second for each of its 4 groups
(rate_per_group). Both have a backlog far beyond what a minute lets through. 16 takers, each on its
own connection, take batches from both stages and finish each task at once. A taker whose take
came back short (the window is used up) sleeps until the next second starts, plus a few ms: the
load stays a handful of calls a window, and the window's share is claimed in its first moments.

Verdicts, both from the tasks' start times (history, plus any task still running at the stop):
- exact: no window (a whole second since the epoch, as the limit counts them) holds more than
  the limit, for the stage and for each group;
- not starved: over the windows wholly inside the run, the takes reach at least 90 % of the
  limit. What this measures is the limiter's admission (it refuses no task the window still has
  room for), not the machine's speed: takers ask at every window's start, a window's 20 tasks take
  4 calls of 5, and a loaded machine delays those calls by milliseconds of a 1,000 ms window.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from typing import Iterator

import psycopg
import pytest

import workload
from dev.testrun import create_database, drop_database

STAGE, GROUP_STAGE = "rate.stage", "rate.group"
LIMIT, GROUP_LIMIT, GROUPS = 20, 5, 4
TAKERS = 16
RUN = 60.0                      # seconds of taking
BATCH = 5
BACKLOG = 2000                  # per stage: more than a minute lets through (1,200)

TAKE = "SELECT id, lease FROM queue.take_next(stage => %s, batch => %s, worker => %s)"
FINISH = "SELECT queue.finish(%s, %s)"
# Start times per window of 1 s, of the tasks that ran (history) and of those running still.
PER_WINDOW = """
SELECT coalesce(s.group_key, '') AS grp, date_bin('1 second', s.started, timestamptz 'epoch') AS w, count(*)
  FROM (SELECT h.group_key, h.started FROM queue.history h WHERE h.stage = %(stage)s AND h.started IS NOT NULL
        UNION ALL
        SELECT t.group_key, t.started FROM queue.live_tasks t WHERE t.stage = %(stage)s AND t.status = 'running') s
 GROUP BY 1, 2
"""


@pytest.fixture(scope="module")
def rate_db(admin_url: str, template_db: str) -> Iterator[str]:
    """A database built by the migrations, for this module."""
    url = create_database(admin_url, "rates", template=template_db)
    try:
        yield url
    finally:
        drop_database(admin_url, url)


class Taker(threading.Thread):
    """Takes from both stages in turn until `until` (time.time()), finishing each task at once."""

    def __init__(self, url: str, index: int, until: float) -> None:
        super().__init__(name=f"taker-{index}", daemon=True)
        self.url, self.index, self.until = url, index, until
        self.taken = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        name = f"taker-{self.index}"
        stages = [STAGE, GROUP_STAGE] if self.index % 2 else [GROUP_STAGE, STAGE]
        try:
            with psycopg.connect(workload.with_application_name(self.url, name), autocommit=True) as conn:
                while time.time() < self.until:
                    short = False
                    for stage in stages:
                        rows = conn.execute(TAKE, (stage, BATCH, name)).fetchall()
                        short |= len(rows) < BATCH
                        for task_id, lease in rows:
                            assert conn.execute(FINISH, (task_id, lease)).fetchone()[0]
                        self.taken += len(rows)
                    if short:  # a window used up: ask again as the next second starts
                        now = time.time()
                        time.sleep(math.floor(now) + 1 - now + 0.002 * (self.index % 8))
        except BaseException as e:  # reported by the test, not lost in the thread
            self.error = e


def test_rate_limits_hold_exactly_and_are_reached_under_sixteen_takers(rate_db: str) -> None:
    db = rate_db
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SELECT queue.configure_stage(%s, rate_limit => %s, rate_window => '1 second')", (STAGE, LIMIT))
        conn.execute("SELECT queue.configure_stage(%s, rate_limit => %s, rate_window => '1 second', rate_per_group => true)",
                     (GROUP_STAGE, GROUP_LIMIT))
        conn.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[%s]), stage => %s)", (BACKLOG, STAGE))
        # The groups interleaved in claim order, as tenants' tasks arrive.
        conn.execute("SELECT count(queue.enqueue('{}', stage => %s, group_key => 'tenant-' || (i %% %s)))"
                     "  FROM generate_series(1, %s) i", (GROUP_STAGE, GROUPS, BACKLOG))
        start = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]
    until = start + RUN
    takers = [Taker(db, i, until) for i in range(TAKERS)]
    for t in takers:
        t.start()
    for t in takers:
        t.join(RUN + 120)  # generous: a hang fails instead of blocking
    assert not any(t.is_alive() for t in takers), "a taker hangs"
    errors = [t.error for t in takers if t.error is not None]
    assert not errors, f"a taker failed: {errors[0]!r}"

    with psycopg.connect(db, autocommit=True) as conn:
        stage_counts = {w: n for _, w, n in conn.execute(PER_WINDOW, {"stage": STAGE}).fetchall()}
        group_counts = {(g, w): n for g, w, n in conn.execute(PER_WINDOW, {"stage": GROUP_STAGE}).fetchall()}
        end = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]

    # Exact: no window over the limit, for the stage and for each group.
    over = {w: n for w, n in stage_counts.items() if n > LIMIT}
    assert not over, f"windows of {STAGE} over {LIMIT}: {sorted(over.items())[:5]}"
    group_over = {k: n for k, n in group_counts.items() if n > GROUP_LIMIT}
    assert not group_over, f"windows of a group over {GROUP_LIMIT}: {sorted(group_over.items())[:5]}"
    assert {g for g, _ in group_counts} == {f"tenant-{g}" for g in range(GROUPS)}

    # Not starved: the windows wholly inside the run reach 90 % of the limit.
    first, last = math.ceil(start), math.floor(min(until, end)) - 1
    inside = [w for w in range(first, last + 1)]
    assert len(inside) >= RUN - 3
    seconds = Counter({int(w.timestamp()): n for w, n in stage_counts.items()})
    taken = sum(seconds[w] for w in inside)
    print(f"\n{STAGE}: {taken} of {LIMIT * len(inside)} in {len(inside)} windows ({taken / (LIMIT * len(inside)):.1%})")
    assert taken >= 0.9 * LIMIT * len(inside), \
        f"{STAGE}: {taken} taken in {len(inside)} windows of {LIMIT} ({taken / (LIMIT * len(inside)):.0%})"
    group_seconds: Counter[int] = Counter()
    for (g, w), n in group_counts.items():
        group_seconds[int(w.timestamp())] += n
    group_taken = sum(group_seconds[w] for w in inside)
    print(f"{GROUP_STAGE}: {group_taken} of {GROUP_LIMIT * GROUPS * len(inside)} in {len(inside)} windows")
    assert group_taken >= 0.9 * GROUP_LIMIT * GROUPS * len(inside), \
        f"{GROUP_STAGE}: {group_taken} taken in {len(inside)} windows of {GROUPS} x {GROUP_LIMIT}"
