"""Every ```sql block of docs/runbook.md runs, through psql as a DBA runs it, and does what it says.

Each block runs in a transaction that is rolled back, against one database holding tasks in every
state, with the psql variables the runbook tells the reader to set (stage, id). Blocks whose
result is meaningful have a check below, keyed by a fragment of their text (output or NOTICE); a
check whose block disappeared fails, so a rewrite of the runbook cannot drop its test silently.

The bulk blocks (retry, cancel, priorities) also run as they are meant to, committed, while workers
take and finish the stage's tasks: each completes, skips the tasks that ended or were taken
meanwhile, and loses none (the tests at the end).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import psycopg
import pytest

import dev.testrun
from skiplock.sqlfiles import ROOT

RUNBOOK = ROOT / "docs" / "runbook.md"
STAGE = "rb.main"


def sql_blocks() -> list[tuple[str, str]]:
    """(section title, sql) of every ```sql block, in order."""
    blocks, section = [], ""
    for match in re.finditer(r"^## ([^\n]+)$|^```sql\n(.*?)^```", RUNBOOK.read_text(), re.M | re.S):
        if match.group(1):
            section = match.group(1).strip()
        else:
            blocks.append((section, match.group(2)))
    return blocks


BLOCKS = sql_blocks()


@dataclass
class Fixture:
    url: str
    ids: dict[str, int]


@pytest.fixture(scope="module")
def world(admin_url: str, template_db: str) -> Iterator[Fixture]:
    url = dev.testrun.create_database(admin_url, "test_runbook", template=template_db)  # alembic upgrade head: what we ship
    ids: dict[str, int] = {}
    with psycopg.connect(url, autocommit=True) as c:
        def enqueue(payload: str = "{}", stage: str = STAGE, run_at: str = "now()") -> int:
            return c.execute(f"SELECT queue.enqueue(%s::jsonb, %s, run_at => {run_at})", (payload, stage)).fetchone()[0]

        def take(stage: str = STAGE, lease: str = "5 minutes", worker: str = "w1") -> tuple[int, str]:
            row = c.execute("SELECT id, lease FROM queue.take_next(%s, lease_for => %s::interval, worker => %s)",
                            (stage, lease, worker)).fetchone()
            return row[0], row[1]

        # Everything that is taken is taken while it is the stage's only due task.
        enqueue()
        t, lease = take()
        c.execute("SELECT queue.finish(%s, %s)", (t, lease))
        ids["fast"] = t
        enqueue()
        t, lease = take()
        time.sleep(0.3)
        c.execute("SELECT queue.finish(%s, %s)", (t, lease))
        ids["slow"] = t
        for name in ("fatal1", "fatal2"):
            enqueue()
            t, lease = take()
            c.execute("SELECT queue.fail(%s, %s, 'bad input: not an image', fatal => true)", (t, lease))
            ids[name] = t
        enqueue()
        t, lease = take()
        c.execute("SELECT queue.fail(%s, %s, 'timeout talking to S3', retry_in => interval '1 hour')", (t, lease))
        ids["error"] = t
        enqueue()
        t, lease = take(lease="1 millisecond", worker="dead-worker")
        ids["expired"] = t
        enqueue()
        t, lease = take(worker="busy-worker")
        ids["running"] = t
        ids["cancelled"] = enqueue()
        c.execute("SELECT queue.cancel(%s)", (ids["cancelled"],))
        ids["ready"] = enqueue('{"customer": 7}')
        ids["ready2"] = enqueue('{"customer": 8}')
        ids["future"] = enqueue(run_at="now() + interval '1 hour'")
        enqueue(stage="rb.other")
        t, lease = take(stage="rb.other")
        c.execute("SELECT queue.finish(%s, %s)", (t, lease))
        enqueue(stage="rb.other")
        time.sleep(0.05)  # the 1 ms lease has expired
    try:
        yield Fixture(url, ids)
    finally:
        dev.testrun.drop_database(admin_url, url)


# fragment of a block -> (strings its output must contain, a query whose output must be 't' after it)
CHECKS: dict[str, tuple[list[str], str | None]] = {
    "FROM queue.stats\n ORDER BY stage, status": (["rb.main|fatal|2", "rb.other|done|1"], None),
    "lease_expires < now()\n": (["{expired}|rb.main|dead-worker"], None),
    "SELECT queue.reap_hung();": (["1"], "SELECT status = 'error' FROM queue.tasks WHERE id = {expired}"),
    "interval '10 minutes'": ([], None),
    "DISTINCT ON (stage)": (["rb.main|{ready}|ready|0|"], None),  # not the future one, not the error one (backoff)
    "FROM queue.errors": (["2|", "bad input: not an image", "timeout talking to S3"], None),
    "status IN ('error', 'fatal')\n ORDER BY updated DESC": (["{fatal2}|fatal|1", "{error}|error|1"], None),
    "AS fatal\n": (["2"], None),
    "'retried %, skipped %": (["retried 2, skipped 0 (not fatal any more), key taken: {{}}"],
                              "SELECT bool_and(status = 'ready' AND attempt = 0) AND count(*) = 2 FROM queue.tasks "
                              "WHERE id IN ({fatal1}, {fatal2})"),
    "'retried now %": (["retried now 1, skipped 0"],
                       "SELECT status = 'ready' AND run_at <= now() FROM queue.tasks WHERE id = {error}"),
    "paused => true": (["rb.main|t"], "SELECT NOT EXISTS (SELECT FROM queue.take_next('rb.main'))"),
    "GROUP BY worker": (["busy-worker|1|", "dead-worker|1|"], None),
    "status IN ('ready', 'running', 'error')\n ORDER BY status": (["ready|3|2|", "running|2|0|"], None),
    "AS drained": (["f"], None),
    "'cancelled %": (["cancelled 4, skipped 0"], "SELECT NOT EXISTS (SELECT 1 FROM queue.tasks WHERE stage = 'rb.main' "
                            "AND status IN ('ready', 'error'))"),
    "set_priority(:id, -10)": ([], "SELECT priority = -10 FROM queue.tasks WHERE id = {ready2}"),
    "'changed %": (["changed 1, skipped 0"], "SELECT array_agg(id ORDER BY id) = ARRAY[{ready}]::bigint[] FROM queue.tasks "
                          "WHERE stage = 'rb.main' AND priority = -10"),
    "finished - started DESC": (["{slow}|done|1|w1|"], None),
    "percentile_cont": (["rb.main|4|", "rb.other|1|"], None),
    "FROM queue.metrics": (["rb.main|done|0|0|2", "rb.main|ready|3|", "rb.main|fatal|0|0|2"], None),
    "FROM queue.compact()": ([], "SELECT status = 'ready' AND attempt = 0 FROM queue.live_tasks WHERE id = {ready}"),
}


def check_for(sql: str) -> tuple[list[str], str | None]:
    found = [key for key in CHECKS if key in sql]
    assert len(found) <= 1, f"a block matches several checks: {found}"
    return CHECKS[found[0]] if found else ([], None)


def test_every_check_has_its_block() -> None:
    assert BLOCKS, "no ```sql block found in docs/runbook.md"
    for key in CHECKS:
        assert sum(key in sql for _, sql in BLOCKS) == 1, f"no single runbook block holds {key!r}"


def psql(url: str, script: str, appname: str = "runbook", **variables: str) -> tuple[str, str]:
    """(stdout, stderr: the NOTICEs) of the script, run by psql; fails on any error."""
    args = ["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", url]
    for name, value in variables.items():
        args += ["-v", f"{name}={value}"]
    proc = subprocess.run(args, input=script, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PGAPPNAME": appname})
    assert proc.returncode == 0, f"psql failed:\n{proc.stderr}\n--- script:\n{script}"
    assert "ERROR" not in proc.stderr, proc.stderr
    return proc.stdout, proc.stderr


@pytest.mark.parametrize("section, sql", BLOCKS,
                         ids=[f"{i:02d}-{re.sub(r'[^a-z]+', '-', s.lower()).strip('-')}" for i, (s, _) in enumerate(BLOCKS)])
def test_runbook_block(world: Fixture, section: str, sql: str) -> None:
    expected, after = check_for(sql)
    script = "BEGIN;\n" + sql + "\n\\echo ==after==\n"
    if after:
        script += after.format(**world.ids) + ";\n"
    script += "ROLLBACK;\n"
    out, notices = psql(world.url, script, stage=STAGE, id=str(world.ids["ready2"]))
    result, _, checked = out.partition("==after==\n")
    for fragment in expected:
        assert fragment.format(**world.ids) in result + notices, \
            f"{section}: {fragment!r} not in output:\n{result}{notices}"
    if after:
        assert checked.strip() == "t", f"{section}: after the block, {after!r} gave {checked!r}"


def exporter_queries() -> dict[str, tuple[str, dict[str, str]]]:
    """contrib/postgres_exporter/queries.yaml as {namespace: (query, {column: usage})}: each top-level
    key, its query (one quoted line or a `|` block) and its metrics in order (no YAML library needed)."""
    text = (ROOT / "contrib" / "postgres_exporter" / "queries.yaml").read_text()
    found = {}
    for block in re.split(r"^(?=\w+:\s*$)", text, flags=re.M):
        head = re.match(r"(\w+):\s*$", block, re.M)
        if not head:
            continue
        quoted = re.search(r'^\s+query:\s*"(.*)"\s*$', block, re.M)
        literal = re.search(r"^\s+query:\s*\|\s*\n((?:\s{4,}.*\n)+)", block, re.M)
        query = quoted.group(1) if quoted else literal.group(1)
        found[head.group(1)] = (query, dict(re.findall(r'^\s+- (\w+):\s*\n\s+usage:\s*"(\w+)"', block, re.M)))
    return found


def test_exporter_query_and_dashboard_match_queue_metrics(world: Fixture) -> None:
    """contrib/: each of postgres_exporter's queries runs as skiplock_monitor and maps every column it
    returns; the Grafana dashboard asks only for series those queries export."""
    queries = exporter_queries()
    assert {"skiplock", "skiplock_tasks", "skiplock_stage"} <= set(queries)
    exported = set()
    for namespace, (query, mapped) in queries.items():
        with psycopg.connect(world.url, autocommit=True) as c:
            c.execute("SET ROLE skiplock_monitor")
            cur = c.execute(query)
            columns = [d.name for d in cur.description]
            rows = cur.fetchall()
        assert columns == list(mapped), f"{namespace}: every column of the query needs a mapping, in order"
        assert mapped["stage"] == "LABEL"
        if namespace == "skiplock":
            assert mapped["status"] == "LABEL" and ("rb.main", "fatal", 0, 0.0, 2) in rows
        if namespace == "skiplock_tasks":
            assert mapped["finished_total"] == "COUNTER" and ("rb.main", "fatal", 2) in rows, rows
        exported |= {f"{namespace}_{name}" for name, usage in mapped.items() if usage != "LABEL"}
    dashboard = json.loads((ROOT / "contrib" / "grafana" / "skiplock.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b(skiplock_\w+)\{", e)}
    assert used and used <= exported, used - exported
    assert "skiplock_tasks_finished_total" in used  # rates come from the counter


def test_metrics_reads_only_the_last_minute_of_history(world: Fixture) -> None:
    """history is read with (stage, finished) range scans, never by a scan of a whole partition."""
    with psycopg.connect(world.url, autocommit=True) as c:
        plan = "\n".join(r[0] for r in c.execute("EXPLAIN SELECT * FROM queue.metrics"))
    scans = [line for line in plan.splitlines() if re.search(r"Scan .*\bon history", line)]
    assert scans, plan
    assert not [line for line in scans if "Seq Scan" in line or "Bitmap Heap Scan" in line], plan
    assert "finished > (now() - '00:01:00'::interval)" in plan


# --- The bulk blocks under load -------------------------------------------------------------------
# Each runs committed, as a DBA runs it, while worker threads take and finish the stage's tasks
# (take_next, finish_batch), and while one task is held by a take_locked worker that finishes it
# only once the block waits for its row: that task ends between the block's scan and its call, every
# time. A single statement over queue.tasks (the runbook before) raised 55000 there and changed
# nothing at all.

N_LOAD = 5000
# Tasks due in an hour, enqueued after the N_LOAD due ones: the workers cannot take them, so the
# block always finds some still waiting, however fast the workers drain the rest (on a loaded
# machine they drained all N_LOAD before psql started, and the block changed none).
LATER = 50
BULK_APP = "runbook-bulk"


def bulk_block(*fragments: str) -> str:
    """The one ```sql block of the runbook that holds every fragment."""
    found = [sql for _, sql in BLOCKS if all(f in sql for f in fragments)]
    assert len(found) == 1, f"{len(found)} runbook blocks hold {fragments!r}"
    return found[0]


@pytest.fixture(scope="module")
def load_url(admin_url: str, template_db: str) -> Iterator[str]:
    url = dev.testrun.create_database(admin_url, "test_runbook_load", template=template_db)
    try:
        yield url
    finally:
        dev.testrun.drop_database(admin_url, url)


class Workers:
    """Threads that take (batch 10) and finish a stage's due tasks until stopped."""

    def __init__(self, url: str, stage: str, n: int = 3, warm_up: int = 50) -> None:
        self.url, self.stage, self.stop, self.finished, self.errors = url, stage, threading.Event(), [0], []
        self.warm_up = warm_up
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]

    def _run(self, i: int) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as c:
                while not self.stop.is_set():
                    rows = c.execute("SELECT id, lease FROM queue.take_next(%s, batch => 10, worker => %s)",
                                     (self.stage, f"w{i}")).fetchall()
                    if not rows:
                        time.sleep(0.002)
                        continue
                    n = c.execute("SELECT queue.finish_batch(%s::bigint[], %s::uuid[])",
                                  ([r[0] for r in rows], [r[1] for r in rows])).fetchone()[0]
                    self.finished[0] += n
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(e)

    def __enter__(self) -> "Workers":
        for t in self.threads:
            t.start()
        deadline = time.monotonic() + 10
        while self.finished[0] < self.warm_up and time.monotonic() < deadline:  # the workers are at it
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)
        assert not self.errors, self.errors


class LockedHolder:
    """A take_locked worker holding the stage's first due task; it finishes it (and commits) as soon
    as the session named BULK_APP waits for that task's row, so the task ends after the block's scan
    and before its call returns."""

    def __init__(self, url: str, stage: str) -> None:
        self.conn = psycopg.connect(url)
        self.pid = self.conn.info.backend_pid
        self.id = self.conn.execute("SELECT id FROM queue.take_locked(%s)", (stage,)).fetchone()[0]
        self.url, self.waited, self.errors = url, False, []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as watch:
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and not self.waited:
                    self.waited = watch.execute(
                        "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = %s "
                        "AND %s = ANY (pg_blocking_pids(pid)))", (BULK_APP, self.pid)).fetchone()[0]
                    time.sleep(0.005)
            assert self.conn.execute("SELECT queue.finish_locked(%s)", (self.id,)).fetchone()[0]
            self.conn.commit()
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(e)
        finally:
            self.conn.close()

    def join(self) -> None:
        self.thread.join(20)
        assert not self.errors, self.errors
        assert self.waited, "the block never waited for the held task"


def run_bulk(url: str, block: str, stage: str) -> tuple[int, int]:
    """Runs the block (committed); returns the two counts of its NOTICE (changed, skipped)."""
    _, notices = psql(url, block, appname=BULK_APP, stage=stage)
    m = re.search(r"NOTICE:\s+\D*?(\d+), skipped (\d+)", notices)
    assert m, notices
    return int(m.group(1)), int(m.group(2))


def enqueue_many(c: psycopg.Connection, stage: str, payloads: list[str], later: bool = False) -> list[int]:
    """The tasks, due now (or in an hour: later)."""
    ids: list[int] = []
    for i in range(0, len(payloads), 1000):
        ids += [r[0] for r in c.execute("SELECT * FROM queue.enqueue_batch(%s::jsonb[], %s, "
                                        "run_at => CASE WHEN %s THEN now() + interval '1 hour' END)",
                                        (payloads[i:i + 1000], stage, later))]
    return ids


def statuses(c: psycopg.Connection, stage: str) -> dict[str, int]:
    return dict(c.execute("SELECT status::text, count(*) FROM queue.tasks WHERE stage = %s GROUP BY 1",
                          (stage,)).fetchall())


def test_bulk_cancel_under_load(load_url: str) -> None:
    """Cancel what is waiting while workers drain the stage: every task ends cancelled or done."""
    stage = "rb.load.cancel"
    block = bulk_block("queue.cancel(")
    with psycopg.connect(load_url, autocommit=True) as c:
        enqueue_many(c, stage, ["{}"] * N_LOAD)
        enqueue_many(c, stage, ["{}"] * LATER, later=True)
        holder = LockedHolder(load_url, stage)
        with Workers(load_url, stage):
            cancelled, skipped = run_bulk(load_url, block, stage)
        holder.join()
        counts = statuses(c, stage)
        distinct = c.execute("SELECT count(DISTINCT id) FROM queue.tasks WHERE stage = %s", (stage,)).fetchone()[0]
    assert set(counts) <= {"cancelled", "done"}, counts  # nothing left waiting, nothing lost
    assert counts.get("cancelled", 0) + counts.get("done", 0) == distinct == N_LOAD + LATER, counts
    assert counts["cancelled"] == cancelled >= LATER, (counts, cancelled)
    assert skipped >= 1, skipped  # the held task, at least


def test_bulk_set_priority_under_load(load_url: str) -> None:
    """Reprioritise one customer's waiting tasks while workers drain the stage: each one still
    waiting gets the priority, the others are skipped, and the block's counts say so."""
    stage = "rb.load.priority"
    block = bulk_block("queue.set_priority(", "payload @>")
    payloads = ['{"customer": 7}' if i % 4 else '{"customer": 8}' for i in range(N_LOAD)]
    payloads[0] = '{"customer": 7}'  # the held task matches
    with psycopg.connect(load_url, autocommit=True) as c:
        enqueue_many(c, stage, payloads)
        enqueue_many(c, stage, ['{"customer": 7}'] * LATER, later=True)
        holder = LockedHolder(load_url, stage)
        with Workers(load_url, stage):
            changed, skipped = run_bulk(load_url, block, stage)
        holder.join()
        rows = c.execute("SELECT payload->>'customer', status::text, priority, count(*), count(DISTINCT id) "
                         "FROM queue.tasks WHERE stage = %s GROUP BY 1, 2, 3", (stage,)).fetchall()
    assert sum(r[4] for r in rows) == sum(r[3] for r in rows) == N_LOAD + LATER, rows  # none lost, none twice
    assert all(r[2] == 0 for r in rows if r[0] == "8"), rows
    assert all(r[2] == -10 for r in rows if r[0] == "7" and r[1] == "ready"), rows  # waiting all along
    assert sum(r[3] for r in rows if r[2] == -10) == changed >= LATER, (rows, changed)
    assert skipped >= 1, skipped
    assert {r[1] for r in rows} <= {"ready", "done"}, rows


def test_bulk_retry_now_under_load(load_url: str) -> None:
    """Retry the tasks waiting in error while workers take them as they come due: each is retried
    (run again from attempt 0) or was taken meanwhile; all of them end done, none twice."""
    stage = "rb.load.error"
    block = bulk_block("queue.retry(", "'error'")
    with psycopg.connect(load_url, autocommit=True) as c:
        c.execute("SELECT queue.configure_stage(%s, max_attempts => 5)", (stage,))
        enqueue_many(c, stage, ["{}"] * N_LOAD)
        rows = c.execute("SELECT id, lease FROM queue.take_next(%s, batch => %s)", (stage, N_LOAD)).fetchall()
        c.execute("SELECT count(queue.fail(t.id, t.lease, 'flaky', retry_in => interval '0')) "
                  "FROM unnest(%s::bigint[], %s::uuid[]) AS t(id, lease)",
                  ([r[0] for r in rows], [r[1] for r in rows]))  # due again at once
        assert statuses(c, stage) == {"error": N_LOAD}
        holder = LockedHolder(load_url, stage)
        # The workers start once the block runs (not before: on a loaded machine they drained the
        # stage before psql started, and nothing was left to retry); from then on they race it.
        bulk: dict[str, tuple[int, int]] = {}
        runner = threading.Thread(target=lambda: bulk.update(counts=run_bulk(load_url, block, stage)), daemon=True)
        runner.start()
        deadline = time.monotonic() + 60
        while not c.execute("SELECT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = %s "
                            "AND state = 'active' AND query LIKE 'DO%%')", (BULK_APP,)).fetchone()[0]:
            assert time.monotonic() < deadline and runner.is_alive(), "the block never ran"
            time.sleep(0.002)
        with Workers(load_url, stage, warm_up=0):
            runner.join(120)
            assert "counts" in bulk, "the block did not finish"
            retried, skipped = bulk["counts"]
            while statuses(c, stage) != {"done": N_LOAD}:  # the workers drain the stage
                time.sleep(0.05)
        holder.join()
        by_attempt = dict(c.execute("SELECT attempt, count(*) FROM queue.tasks WHERE stage = %s GROUP BY 1",
                                    (stage,)).fetchall())
        distinct = c.execute("SELECT count(DISTINCT id) FROM queue.tasks WHERE stage = %s", (stage,)).fetchone()[0]
    assert distinct == N_LOAD
    # retried: ran from attempt 0 again; the others were taken meanwhile (a worker or the holder)
    assert by_attempt == {1: retried, 2: N_LOAD - retried}, (by_attempt, retried)
    assert retried > 0
    assert skipped >= 1, skipped


def test_bulk_retry_fatal_skips_live_periodic_and_taken_keys(load_url: str) -> None:
    """Retry the fatal tasks of a stage whose periodic task had a fatal run and runs again now (live,
    re-armed), and where a live task took the key of one fatal task, while workers take the retried
    ones: every other fatal task is retried, the periodic one is left running, the key's owner listed."""
    stage = "rb.load.fatal"
    block = bulk_block("queue.retry(", "'fatal'")
    n = N_LOAD // 5
    with psycopg.connect(load_url, autocommit=True) as c:
        periodic = c.execute("SELECT queue.enqueue('{}', %s, repeat => interval '1 second', key => 'tick')",
                             (stage,)).fetchone()[0]
        pid, lease = c.execute("SELECT id, lease FROM queue.take_next(%s)", (stage,)).fetchone()
        assert pid == periodic
        c.execute("SELECT queue.fail(%s, %s, 'bad run', fatal => true)", (periodic, lease))  # re-armed
        keyed = c.execute("SELECT queue.enqueue('{}', %s, key => 'k')", (stage,)).fetchone()[0]
        ids = [keyed] + enqueue_many(c, stage, ["{}"] * n)
        while rows := c.execute("SELECT id, lease FROM queue.take_next(%s, batch => 1000)", (stage,)).fetchall():
            c.execute("SELECT count(queue.fail(t.id, t.lease, 'bad input', fatal => true)) "
                      "FROM unnest(%s::bigint[], %s::uuid[]) AS t(id, lease)",
                      ([r[0] for r in rows], [r[1] for r in rows]))
        with psycopg.connect(load_url, autocommit=True) as cron:  # a session of its own: no claim position
            while not (row := cron.execute("SELECT id, lease FROM queue.take_next(%s, worker => 'cron')",
                                           (stage,)).fetchone()):
                time.sleep(0.05)  # its next slot, within a second
        pid, p_lease = row
        assert pid == periodic  # live and running, with a fatal run in its history
        # takes the fatal task's key; due later, so that the workers leave it live
        c.execute("SELECT queue.enqueue('{}', %s, key => 'k', run_at => now() + interval '1 hour')", (stage,))
        with Workers(load_url, stage, warm_up=0):
            _, notices = psql(load_url, block, appname=BULK_APP, stage=stage)
            m = re.search(r"retried (\d+), skipped (\d+) \(not fatal any more\), key taken: \{(\d*)\}", notices)
            assert m, notices
        # the periodic task, live again, is no longer picked: nothing skipped
        assert (int(m.group(1)), int(m.group(2)), m.group(3)) == (n, 0, str(keyed)), notices
        assert c.execute("SELECT queue.heartbeat(%s, %s)", (periodic, p_lease)).fetchone() is not None
        retried = c.execute("SELECT count(*) FILTER (WHERE finished IS NULL OR status = 'done'), "
                            "count(*) FILTER (WHERE status = 'fatal') FROM queue.tasks WHERE id = ANY(%s)",
                            (ids[1:],)).fetchone()
        assert retried == (n, 0), retried  # live again, or already run and done
        assert c.execute("SELECT status FROM queue.tasks WHERE id = %s ORDER BY finished DESC LIMIT 1",
                         (keyed,)).fetchone()[0] == "fatal"
        assert c.execute("SELECT status, worker FROM queue.tasks WHERE id = %s AND finished IS NULL",
                         (periodic,)).fetchone() == ("running", "cron")


# --- Slices, and a task held by a take_locked worker ------------------------------------------------
# The runbook's advice for very many tasks: add LIMIT n to the FOR query and run the block again
# until its first count is 0. Each run must pick only what is left to do, and try last what it
# cannot do, so that the first 0 comes only when nothing retriable is left.

def sliced(block: str, n: int) -> str:
    """The block with LIMIT n at the end of its FOR query, as the runbook says."""
    new, k = re.subn(r"\n(\s*)LOOP\n", f" LIMIT {n}\n\\1LOOP\n", block, count=1)
    assert k == 1
    return new


def run_slices(url: str, block: str, stage: str, n: int, most: int = 8) -> list[tuple[int, int]]:
    """Runs the sliced block until its first count is 0 (at most `most` runs); their counts."""
    counts: list[tuple[int, int]] = []
    while len(counts) < most:
        counts.append(run_bulk(url, sliced(block, n), stage))
        if counts[-1][0] == 0:
            return counts
    raise AssertionError(f"{most} slices and the first count never reached 0: {counts}")


def test_sliced_priority_change_reaches_every_task_and_stops(load_url: str) -> None:
    stage = "rb.slice.priority"
    with psycopg.connect(load_url, autocommit=True) as c:
        enqueue_many(c, stage, ['{"customer": 7}'] * 7 + ['{"customer": 8}'])
        counts = run_slices(load_url, bulk_block("queue.set_priority(", "payload @>"), stage, 3)
        rows = dict(c.execute("SELECT payload->>'customer', array_agg(DISTINCT priority) FROM queue.tasks "
                              "WHERE stage = %s GROUP BY 1", (stage,)).fetchall())
    assert rows == {"7": [-10], "8": [0]}, rows
    assert counts == [(3, 0), (3, 0), (1, 0), (0, 0)], counts


def test_sliced_fatal_retry_retries_every_retriable_task_before_its_first_zero(load_url: str) -> None:
    """Three fatal tasks whose keys live tasks took (the lowest ids), then three plain ones: slices
    of 3 retry the plain ones, then list the others, and only then report 0."""
    stage = "rb.slice.fatal"
    with psycopg.connect(load_url, autocommit=True) as c:
        keyed, plain = [], []
        for k in range(6):
            tid = c.execute("SELECT queue.enqueue('{}', %s, key => %s)", (stage, f"doc-{k}" if k < 3 else None)).fetchone()[0]
            t, lease = c.execute("SELECT id, lease FROM queue.take_next(%s)", (stage,)).fetchone()
            assert t == tid
            c.execute("SELECT queue.fail(%s, %s, 'bad input', fatal => true)", (t, lease))
            (keyed if k < 3 else plain).append(t)
        for k in range(3):  # the producer enqueued those documents again, same key, for later
            c.execute("SELECT queue.enqueue('{}', %s, key => %s, run_at => now() + interval '1 day')", (stage, f"doc-{k}"))
        counts = run_slices(load_url, bulk_block("queue.retry(", "'fatal'"), stage, 3)
        retried = c.execute("SELECT array_agg(id ORDER BY id) FROM queue.tasks WHERE stage = %s "
                            "AND finished IS NULL AND key IS NULL", (stage,)).fetchone()[0]
    assert retried == plain, (retried, plain, counts)
    assert counts[-1] == (0, 0) and len(counts) == 2, counts


@pytest.mark.parametrize("fragments, status", [
    (("queue.cancel(",), "ready"),
    (("queue.set_priority(", "payload @>"), "ready"),
    (("queue.retry(", "'error'"), "error"),
], ids=["cancel", "priorities", "retry-now"])
def test_bulk_block_skips_a_task_held_by_take_locked_instead_of_waiting(
        load_url: str, fragments: tuple[str, ...], status: str) -> None:
    """A take_locked worker holds one due task for as long as the block runs: the block gives up on
    it after its lock_timeout, counts it as skipped and changes the others."""
    stage = f"rb.held.{fragments[0][6:-1]}"
    with psycopg.connect(load_url, autocommit=True) as c:
        ids = enqueue_many(c, stage, ['{"customer": 7}'] * 4)
        if status == "error":
            rows = c.execute("SELECT id, lease FROM queue.take_next(%s, batch => 4)", (stage,)).fetchall()
            for tid, lease in rows:
                c.execute("SELECT queue.fail(%s, %s, 'flaky', retry_in => interval '0')", (tid, lease))
        holder = psycopg.connect(load_url)
        try:
            held = holder.execute("SELECT id FROM queue.take_locked(%s)", (stage,)).fetchone()[0]
            args = ["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", load_url, "-v", f"stage={stage}"]
            t0 = time.monotonic()
            try:
                proc = subprocess.run(args, input=bulk_block(*fragments), capture_output=True, text=True, timeout=90)
            except subprocess.TimeoutExpired:
                raise AssertionError("the block waited for the task held by take_locked") from None
            elapsed = time.monotonic() - t0
        finally:
            holder.rollback()
            holder.close()
        assert proc.returncode == 0, proc.stderr
        m = re.search(r"NOTICE:\s+\D*?(\d+), skipped (\d+)", proc.stderr)
        assert m, proc.stderr
        assert (int(m.group(1)), int(m.group(2))) == (3, 1), proc.stderr
        assert elapsed < 60, elapsed  # the holder lets go only after the block: waiting for it never ends
        row = c.execute("SELECT status::text, priority FROM queue.tasks WHERE id = %s", (held,)).fetchone()
    assert row == (status, 0), row  # the held task is as it was
    assert held in ids
