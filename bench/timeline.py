"""W3 and W4: workers and a producer running together, sampled over time.

The workers are one pgbench process (16 clients running the design's take-and-finish script, as
fast as they can). The producer is a thread that keeps the backlog constant: it enqueues, in
batches, as many tasks as the workers finished (read from the statistics collector, which lags
by about a second), so that it enqueues at the workers' rate and the hot table holds the same
number of waiting tasks throughout. Throughput is therefore the workers' capacity at each moment.

W3 opens, at hold_start, a session that runs `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;`
and stays idle in that transaction until hold_end: VACUUM cannot remove anything deleted or
updated after it started. W4 calls the maintenance function every few seconds instead.
At chosen moments the harness captures the claim query's plan with EXPLAIN ANALYZE, BUFFERS
(auto_explain, so that the statement inside take_next is what gets explained) in a transaction
it rolls back.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import psycopg

from bench import designs, pgbench
from bench.designs import Design
from bench.progress import log
from skiplock import devdb

PRODUCER_MAX_BATCH = 5000
# W4 soaks at this share of the workers' capacity measured just before: a steady rate with the
# headroom a queue is run with. Falling behind it (capacity down by a quarter) shows as lower
# throughput and growing latency in the soak's last minutes.
W4_LOAD = 0.75
# The finished-task counts come from pg_stat_user_tables, where each backend adds its counts at
# most once a second: under load they lag the truth by about a second of work (about 5,000 tasks
# at 16 workers, 2026-11-24). That lag cancels out of an interval that starts and ends under load,
# but not out of one that starts before the workers do: the first 10 s sample used to read about
# 10 % low, which flattered W3's hold ratio and W4's last-over-first. So the clock (t = 0, and the
# count every rate is measured from) starts after the workers have run this long.
WARMUP_S = 3.0

SIZES_SQL = """
SELECT pg_table_size(s.relid), pg_indexes_size(s.relid), s.n_dead_tup, s.n_live_tup,
       s.autovacuum_count, s.autoanalyze_count
  FROM pg_stat_user_tables s
 WHERE s.relid = %(table)s::regclass
"""
# Cumulative WAL written and checkpoints done, cluster-wide (one design runs at a time): the
# WAL a task costs rises with the full-page images of pages changed for the first time since
# the last checkpoint.
WAL_SQL = """
SELECT w.wal_bytes::bigint, w.wal_fpi, b.checkpoints_timed + b.checkpoints_req
  FROM pg_stat_wal w, pg_stat_bgwriter b
"""

PARTITIONS_SQL = """
SELECT coalesce(array_agg(i.inhrelid::regclass::text ORDER BY i.inhrelid::regclass::text), '{}')
  FROM pg_inherits i
 WHERE i.inhparent = 'queue.history'::regclass
"""


@dataclass
class Sample:
    t: float                 # seconds since the clock started (WARMUP_S after the workers)
    phase: str               # W3: before, hold, after; W4: soak
    processed: int           # tasks finished since the start
    rate: float              # tasks finished per second since the previous sample
    enqueued: int            # tasks the producer added since the start
    table_bytes: int         # hot table (heap, TOAST, maps)
    index_bytes: int         # all its indexes
    dead_tuples: int
    live_tuples: int
    autovacuums: int
    partitions: list[str] | None = None   # history partitions (skiplock)
    cpu: dict[str, float] | None = None   # CPU-seconds of the interval by kind (CPU_KINDS)
    waits: dict[str, int] | None = None   # active backends seen waiting, by wait event, over the polls
    wal: dict[str, int] | None = None     # cumulative: WAL bytes, full-page images, checkpoints


@dataclass
class Plan:
    moment: str
    duration_ms: float | None
    shared_hit: int
    shared_read: int
    text: str


@dataclass
class Timeline:
    workload: str
    design: str
    workers: int
    backlog: int
    seconds: float
    sample_every: float
    hold_start: float | None = None
    hold_end: float | None = None
    maintenance: dict | None = None
    samples: list[Sample] = field(default_factory=list)
    plans: list[Plan] = field(default_factory=list)
    producer: dict = field(default_factory=dict)
    pgbench_tps: float = 0.0
    rate: float | None = None          # W4's steady rate (pgbench --rate); None: as fast as they can
    progress: list[dict] = field(default_factory=list)   # pgbench's progress lines (latency, lag)

    def as_dict(self) -> dict:
        return asdict(self)


class Producer(threading.Thread):
    """Enqueues as many tasks as the workers finished, so the backlog stays where it started."""

    def __init__(self, url: str, design: Design, stage: str, base: int) -> None:
        super().__init__(daemon=True, name=f"producer-{design.name}")
        self.url, self.design, self.stage, self.base = url, design, stage, base
        self.stop = threading.Event()
        self.enqueued = 0
        self.calls = 0
        self.error: str | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while not self.stop.is_set():
                    finished = self.design.count(conn, self.design.processed_sql) - self.base
                    want = finished - self.enqueued
                    if want <= 0:
                        self.stop.wait(0.05)
                        continue
                    n = min(want, PRODUCER_MAX_BATCH)
                    self.design.preload(conn, self.stage, n)
                    self.enqueued += n
                    self.calls += 1
        except psycopg.Error as e:
            self.error = str(e)


ACTIVITY_SQL = """
SELECT a.pid, a.backend_type, a.query, a.state, a.wait_event_type || ':' || a.wait_event
  FROM pg_stat_activity a
"""
TICK = os.sysconf("SC_CLK_TCK")
# Where the CPU of an interval went, in CPU-seconds (2 cores give 20 in a 10 s interval).
CPU_KINDS = ("backends", "autovacuum hot table", "autovacuum history", "autovacuum other",
             "other postgres", "outside postgres", "idle")


def _process_cpu(pid: int) -> tuple[int, int, int] | None:
    """(own CPU ticks, reaped children's CPU ticks, parent pid) from /proc, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # after the name: state ppid ... utime(12) stime(13) cutime(14) cstime(15)
    return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14]), int(fields[1])


def _machine_cpu() -> tuple[int, int]:
    """(busy, idle) ticks of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]   # idle, iowait
    return sum(values[:8]) - idle, idle


class CpuWatch(threading.Thread):
    """Polls the cluster's processes (/proc and pg_stat_activity) and adds up, between two samples,
    the CPU of the client backends, of autovacuum (by table: the hot table, history, the rest),
    of the other server processes, of everything outside PostgreSQL (pgbench, this harness) and
    the idle time. On 2 cores the workers only get what vacuum and the rest leave them, which
    the throughput samples alone cannot show. A process that exits between two polls is counted
    from its parent's total of reaped children, under the kind it last had."""

    EVERY = 0.25

    def __init__(self, url: str, hot_table: str) -> None:
        super().__init__(daemon=True, name="cpu-watch")
        self.url, self.hot_table = url, hot_table
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ticks = dict.fromkeys(CPU_KINDS, 0)
        self.waits: Counter[str] = Counter()
        self.error: str | None = None

    def _kind(self, backend_type: str, query: str) -> str:
        if backend_type == "client backend":
            return "backends"
        if backend_type == "autovacuum worker":
            if query.endswith(" " + self.hot_table) or f" {self.hot_table} " in query:
                return "autovacuum hot table"
            if " queue.history" in query:
                return "autovacuum history"
            return "autovacuum other"
        return "other postgres"

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                # autovacuum's query names the table with its schema: 'autovacuum: VACUUM public.task'
                self.hot_table = conn.execute(
                    "SELECT format('%%I.%%I', n.nspname, c.relname) FROM pg_class c"
                    " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s::regclass",
                    (self.hot_table,)).fetchone()[0]
                me = _process_cpu(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
                postmaster = me[2] if me else 0
                seen: dict[int, tuple[str, int]] = {}   # pid: (kind, ticks when last polled)
                reaped = (_process_cpu(postmaster) or (0, 0, 0))[1]
                machine = _machine_cpu()
                while not self.stop.wait(self.EVERY):
                    rows = conn.execute(ACTIVITY_SQL).fetchall()
                    add = dict.fromkeys(CPU_KINDS, 0)
                    now: dict[int, tuple[str, int]] = {}
                    waits: Counter[str] = Counter()
                    for pid, backend_type, query, state, wait in rows:
                        # Where the active workers wait: locks, buffer contention, the WAL flush.
                        if backend_type == "client backend" and state == "active" and wait:
                            waits[wait] += 1
                        cpu = _process_cpu(pid)
                        if cpu is None:
                            continue
                        kind = self._kind(backend_type or "", query or "")
                        add[kind] += cpu[0] - (seen[pid][1] if pid in seen else 0)
                        now[pid] = (kind, cpu[0])
                    # Children gone since the last poll: their totals moved into the postmaster's.
                    reaped_now = (_process_cpu(postmaster) or (0, reaped, 0))[1]
                    gone = [seen[p] for p in seen if p not in now]
                    rest = reaped_now - reaped - sum(ticks for _, ticks in gone)
                    if rest > 0:
                        add[gone[0][0] if gone else "other postgres"] += rest
                    reaped, seen = reaped_now, now
                    busy, idle = _machine_cpu()
                    add["idle"] = idle - machine[1]
                    add["outside postgres"] = max(0, busy - machine[0] - sum(
                        v for k, v in add.items() if k not in ("idle", "outside postgres")))
                    machine = (busy, idle)
                    with self.lock:
                        for k, v in add.items():
                            self.ticks[k] += v
                        self.waits.update(waits)
        except psycopg.Error as e:
            self.error = str(e)

    def take(self) -> tuple[dict[str, float], dict[str, int]]:
        """CPU-seconds of each kind, and the waits seen, since the last take."""
        with self.lock:
            ticks, self.ticks = self.ticks, dict.fromkeys(CPU_KINDS, 0)
            waits, self.waits = self.waits, Counter()
        return {k: round(v / TICK, 2) for k, v in ticks.items()}, dict(waits.most_common())


# maintain() rows that say nothing was due (every call says one of these)
QUIET = ("not due", "no schedule due", "not needed", "waiting for a snapshot")


class Maintenance(threading.Thread):
    """Calls the maintenance function every `every` seconds, as a cron job would."""

    def __init__(self, url: str, function: str, every: float, policy: str | None) -> None:
        super().__init__(daemon=True, name="maintenance")
        self.url, self.function, self.every, self.policy = url, function, every, policy
        self.stop = threading.Event()
        self.calls = 0
        self.seconds = 0.0
        self.longest = 0.0
        self.errors: list[str] = []
        self.actions: list[str] = []   # what maintain() reported doing, other than reaping
        self.started = time.monotonic()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.wait(self.every):
                began = time.monotonic()
                try:
                    rows = conn.execute(f"SELECT * FROM {self.function}").fetchall()
                except psycopg.Error as e:
                    self.errors.append(str(e).strip().splitlines()[0])
                    rows = []
                took = time.monotonic() - began
                self.calls += 1
                self.seconds += took
                self.longest = max(self.longest, took)
                for row in rows:
                    # maintain() rows: (task, count, detail); keep every rotation that ran
                    if len(row) == 3 and row[0] != "reap_hung" and (row[1] or not str(row[2]).startswith(QUIET)):
                        self.actions.append(f"{began - self.started:.0f} s: {row[0]}: {row[2]} ({1000 * took:.0f} ms)")

    def summary(self) -> dict:
        return {"function": self.function, "every_s": self.every, "policy": self.policy, "calls": self.calls,
                "mean_ms": round(1000 * self.seconds / self.calls, 2) if self.calls else None,
                "longest_ms": round(1000 * self.longest, 1), "actions": self.actions,
                "errors": self.errors[:5], "error_count": len(self.errors)}


def capture_plan(conn: psycopg.Connection, design: Design, stage: str, moment: str) -> Plan:
    """EXPLAIN (ANALYZE, BUFFERS) of one real take, through auto_explain, rolled back."""
    messages: list[str] = []
    handler = lambda diag: messages.append(diag.message_primary or "")  # noqa: E731
    conn.add_notice_handler(handler)
    try:
        with conn.transaction(force_rollback=True):
            for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_analyze = on",
                            "auto_explain.log_buffers = on", "auto_explain.log_nested_statements = on",
                            "client_min_messages = log"):
                conn.execute(f"SET LOCAL {setting}")
            conn.execute(design.claim_sql, {"stage": stage}).fetchall()
    finally:
        conn.remove_notice_handler(handler)
    claim = next((m for m in messages if "skip locked" in m.lower()), "")
    duration = re.search(r"duration: ([\d.]+) ms", claim)
    first_buffers = re.search(r"Buffers: shared( hit=(\d+))?( read=(\d+))?", claim)
    return Plan(moment, float(duration.group(1)) if duration else None,
                int(first_buffers.group(2) or 0) if first_buffers else 0,
                int(first_buffers.group(4) or 0) if first_buffers else 0, claim)


def run(cluster: devdb.Cluster, design: Design, workload: str, seconds: float, sample_every: float,
        backlog: int, workers: int = 16, hold: tuple[float, float] | None = None,
        maintain_every: float | None = None, rate: float | None = None, fresh: bool = True,
        progress_every: float | None = None, label: str = "soak") -> Timeline:
    """One stretch of workers and producer. fresh=False goes on from where the previous stretch
    left the tables (no reset, no preload): W4 runs three stretches back to back."""
    stage = workload.lower()
    url = cluster.url(design.dbname)
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("LOAD 'auto_explain'")
    tl = Timeline(workload, design.name, workers, backlog, seconds, sample_every, rate=rate)
    if hold:
        tl.hold_start, tl.hold_end = hold
    if fresh:
        designs.reset(conn, design)
        design.preload(conn, stage, backlog)
        designs.settle(conn, design)
    else:
        # The producer lags the workers by the statistics' second: top the backlog up to where the
        # stretch before began, so that back-to-back stretches start alike (and never from empty).
        design.preload(conn, stage, max(0, backlog - design.count(conn, design.ready_sql, stage)))

    maintenance = None
    if maintain_every:
        function = designs.maintenance_function(conn)
        # W4 shortens the rotation interval so that rotation runs under load; W3 keeps the default.
        policy = designs.soak_policy(conn) if function == "queue.maintain()" and workload == "W4" else None
        if function != "queue.maintain()":
            log(f"  {workload}: queue.maintain() does not exist yet; calling {function} in its place")
        else:
            log(f"  {workload}: queue.maintain() every {maintain_every:g} s; history policy: {policy}")
        maintenance = Maintenance(url, function, maintain_every, policy)

    producer = Producer(url, design, stage, design.count(conn, design.processed_sql))
    cpu = CpuWatch(url, design.hot_table)
    hold_conn: psycopg.Connection | None = None
    # pgbench runs 2 s past the last sample, so that every sampled interval is full of work.
    proc = pgbench.start(cluster, design.dbname, design.process_script, workers, WARMUP_S + seconds + 2,
                         {"stage": stage}, rate=rate, progress=progress_every)
    producer.start()
    cpu.start()
    if maintenance:
        maintenance.start()
    try:
        # The clock starts once every worker has reported its counts: see WARMUP_S.
        time.sleep(WARMUP_S)
        base = design.count(conn, design.processed_sql)
        t0 = time.monotonic()
        cpu.take()
        if maintenance:
            maintenance.started = t0   # its actions on the samples' clock (negative: in the warm-up)
        tl.plans.append(capture_plan(conn, design, stage, "start"))
        tl.samples.append(_sample(conn, design, 0.0, "before" if hold else label, base, producer, None))
        steps = int(round(seconds / sample_every))
        for k in range(1, steps + 1):
            t = k * sample_every
            time.sleep(max(0.0, t0 + t - time.monotonic()))
            phase = _phase(t, hold, label)
            s = _sample(conn, design, time.monotonic() - t0, phase, base, producer, tl.samples[-1])
            s.cpu, s.waits = cpu.take()
            tl.samples.append(s)
            log(f"  {workload} {design.name:8} {t:5.0f} s {s.rate:9,.0f} jobs/s  hot table "
                f"{s.table_bytes / 2**20:7.1f} MB + indexes {s.index_bytes / 2**20:6.1f} MB, "
                f"{s.dead_tuples:,} dead; CPU s: backends {s.cpu['backends']:.1f}, autovacuum "
                f"{s.cpu['autovacuum hot table']:.1f}/{s.cpu['autovacuum history']:.1f}, idle {s.cpu['idle']:.1f}  [{phase}]")
            if hold and abs(t - hold[0]) < 1e-6:
                tl.plans.append(capture_plan(conn, design, stage, "before hold"))
                hold_conn = psycopg.connect(url, autocommit=True)
                hold_conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                hold_conn.execute("SELECT 1")
                log(f"  {workload}: a session now idles in a REPEATABLE READ transaction for {hold[1] - hold[0]:.0f} s")
            if hold and abs(t - hold[1]) < 1e-6 and hold_conn is not None:
                tl.plans.append(capture_plan(conn, design, stage, "end of hold"))
                hold_conn.execute("COMMIT")
                hold_conn.close()
                hold_conn = None
                log(f"  {workload}: the idle transaction committed")
        tl.plans.append(capture_plan(conn, design, stage, "end"))
        # The producer goes on until the workers stop, so they do not drain the backlog meanwhile.
        summary = pgbench.finish(proc, design.process_script, workers)
    finally:
        producer.stop.set()
        cpu.stop.set()
        if maintenance:
            maintenance.stop.set()
        if hold_conn is not None:
            hold_conn.close()
        if sys.exc_info()[0] is not None:  # interrupted or failed: do not wait for pgbench's end
            pgbench.stop(proc)
        producer.join()
        cpu.join()
        if maintenance:
            maintenance.join()
        conn.close()
    tl.pgbench_tps = summary.tps
    tl.progress = summary.progress
    tl.producer = {"enqueued": producer.enqueued, "calls": producer.calls, "error": producer.error}
    tl.maintenance = maintenance.summary() if maintenance else None
    if producer.error:
        raise RuntimeError(f"{workload} producer failed: {producer.error}")
    if cpu.error:
        raise RuntimeError(f"{workload} CPU watch failed: {cpu.error}")
    return tl


def _phase(t: float, hold: tuple[float, float] | None, label: str) -> str:
    if hold is None:
        return label
    if t <= hold[0] + 1e-6:
        return "before"
    return "hold" if t <= hold[1] + 1e-6 else "after"


def _sample(conn: psycopg.Connection, design: Design, t: float, phase: str, base: int,
            producer: Producer, previous: Sample | None) -> Sample:
    processed = design.count(conn, design.processed_sql) - base
    table, index, dead, live, vacuums, _ = conn.execute(SIZES_SQL, {"table": design.hot_table}).fetchone()
    partitions = conn.execute(PARTITIONS_SQL).fetchone()[0] if design.has_history else None
    wal_bytes, fpi, checkpoints = conn.execute(WAL_SQL).fetchone()
    rate = 0.0
    if previous is not None and t > previous.t:
        rate = (processed - previous.processed) / (t - previous.t)
    return Sample(round(t, 2), phase, processed, rate, producer.enqueued, table, index, dead, live, vacuums, partitions,
                  wal={"bytes": wal_bytes, "fpi": fpi, "checkpoints": checkpoints})


# -- summaries -------------------------------------------------------------------------------------

def w3_summary(tl: Timeline) -> dict:
    """Throughput before, during and after the hold; recovery time; sizes at the three moments."""
    before = [s for s in tl.samples[1:] if s.phase == "before"]
    if len(before) >= 3:
        before = before[1:]  # the first interval includes the workers' start
    hold = [s for s in tl.samples if s.phase == "hold"]
    after = [s for s in tl.samples if s.phase == "after"]
    rate_before = statistics.fmean(s.rate for s in before) if before else 0.0
    rate_hold = statistics.fmean(s.rate for s in hold) if hold else 0.0
    recovery = next((s.t - tl.hold_end for s in after if s.rate >= 0.95 * rate_before), None)

    def at(t: float) -> Sample:
        return min(tl.samples, key=lambda s: abs(s.t - t))

    sizes = {}
    for name, s in (("before", at(tl.hold_start)), ("end of hold", at(tl.hold_end)), ("after", tl.samples[-1])):
        sizes[name] = {"t": s.t, "table_bytes": s.table_bytes, "index_bytes": s.index_bytes,
                       "total_bytes": s.table_bytes + s.index_bytes, "dead_tuples": s.dead_tuples}
    return {
        "rate_before": rate_before,
        "rate_hold": rate_hold,
        "rate_hold_min": min((s.rate for s in hold), default=0.0),
        "rate_after": statistics.fmean(s.rate for s in after) if after else 0.0,
        "hold_ratio": rate_hold / rate_before if rate_before else 0.0,
        "recovery_s": recovery,
        "sizes": sizes,
        "size_ratio_after": sizes["after"]["total_bytes"] / sizes["before"]["total_bytes"],
        "size_ratio_end_of_hold": sizes["end of hold"]["total_bytes"] / sizes["before"]["total_bytes"],
    }


def capacity(tl: Timeline) -> float:
    """Mean jobs/s of a stretch (its clock starts after the workers' warm-up, see WARMUP_S)."""
    rates = [s.rate for s in tl.samples[1:]]
    return statistics.fmean(rates) if rates else 0.0


def w4_summary(tl: Timeline, bucket: float, before: Timeline | None = None, after: Timeline | None = None,
               load: float | None = None) -> dict:
    """Throughput, latency and hot-table size per bucket (a minute in a full run) of the steady
    soak, and the workers' capacity (as fast as they can) just before and just after it."""
    rows = []
    edges = [s for s in tl.samples if abs(s.t / bucket - round(s.t / bucket)) * bucket < tl.sample_every / 2]
    # pgbench's progress lines count from its own start, WARMUP_S before the clock: near enough.
    progress = {round(p["t"] / bucket): p for p in tl.progress}
    for prev, cur in zip(edges, edges[1:]):
        p = progress.get(round(cur.t / bucket), {})
        rows.append({"until_s": round(cur.t), "rate": (cur.processed - prev.processed) / (cur.t - prev.t),
                     "latency_ms": p.get("latency_ms"), "lag_ms": p.get("lag_ms"),
                     "total_bytes": cur.table_bytes + cur.index_bytes, "dead_tuples": cur.dead_tuples,
                     "partitions": len(cur.partitions or [])})
    first, last = (rows[0], rows[-1]) if rows else ({"rate": 0.0, "total_bytes": 1}, {"rate": 0.0, "total_bytes": 0})
    # Bounded: over the second half of the soak the hot table (with its indexes) hardly grows.
    # The first minutes do not count: the table grows until autovacuum's rhythm (a minute) sets in.
    middle = min(tl.samples, key=lambda s: abs(s.t - tl.seconds / 2))
    end = tl.samples[-1]
    size_middle, size_end = middle.table_bytes + middle.index_bytes, end.table_bytes + end.index_bytes
    capacity_before = capacity(before) if before else None
    capacity_after = capacity(after) if after else None
    return {
        "bucket_s": bucket,
        "buckets": rows,
        "rate_target": tl.rate,
        "load": load,
        "capacity_before": capacity_before,
        "capacity_after": capacity_after,
        "capacity_ratio": capacity_after / capacity_before if capacity_before and capacity_after is not None else None,
        "rate_first": first["rate"],
        "rate_last": last["rate"],
        "rate_ratio": last["rate"] / first["rate"] if first["rate"] else 0.0,
        "latency_first_ms": first.get("latency_ms"),
        "latency_last_ms": last.get("latency_ms"),
        "size_first": first["total_bytes"],
        "size_max": max((r["total_bytes"] for r in rows), default=0),
        "size_last": last["total_bytes"],
        "size_middle": size_middle,
        "size_end": size_end,
        "size_growth_second_half": size_end / size_middle if size_middle else 0.0,
        "partitions_seen": sorted({p for s in tl.samples for p in (s.partitions or [])}),
    }
