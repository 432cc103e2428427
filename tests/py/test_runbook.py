"""Every ```sql block of docs/runbook.md runs, through psql as a DBA runs it, and does what it says.

Each block runs in a transaction that is rolled back, against one database holding tasks in every
state, with the psql variables the runbook tells the reader to set (stage, id). Blocks whose
result is meaningful have a check below, keyed by a fragment of their text; a check whose block
disappeared fails, so a rewrite of the runbook cannot drop its test silently.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass
from typing import Iterator

import psycopg
import pytest

import skiplock.testrun
from skiplock import migrate
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
def world(admin_url: str) -> Iterator[Fixture]:
    url = skiplock.testrun.create_database(admin_url, "test_runbook")
    migrate.upgrade(url)  # alembic upgrade head: what we ship
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
        skiplock.testrun.drop_database(admin_url, url)


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
    "AS retried\n": (["2"], "SELECT bool_and(status = 'ready' AND attempt = 0) AND count(*) = 2 FROM queue.tasks "
                             "WHERE id IN ({fatal1}, {fatal2})"),
    "AS retried_now": (["1"], "SELECT status = 'ready' AND run_at <= now() FROM queue.tasks WHERE id = {error}"),
    "paused => true": (["rb.main|t"], "SELECT NOT EXISTS (SELECT FROM queue.take_next('rb.main'))"),
    "GROUP BY worker": (["busy-worker|1|", "dead-worker|1|"], None),
    "status IN ('ready', 'running', 'error')\n ORDER BY status": (["ready|3|2|", "running|2|0|"], None),
    "AS drained": (["f"], None),
    "AS cancelled": (["4"], "SELECT NOT EXISTS (SELECT 1 FROM queue.tasks WHERE stage = 'rb.main' "
                            "AND status IN ('ready', 'error'))"),
    "set_priority(:id, -10)": ([], "SELECT priority = -10 FROM queue.tasks WHERE id = {ready2}"),
    "AS changed": (["1"], "SELECT array_agg(id ORDER BY id) = ARRAY[{ready}]::bigint[] FROM queue.tasks "
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


def psql(url: str, script: str, **variables: str) -> str:
    args = ["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", url]
    for name, value in variables.items():
        args += ["-v", f"{name}={value}"]
    proc = subprocess.run(args, input=script, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"psql failed:\n{proc.stderr}\n--- script:\n{script}"
    assert "ERROR" not in proc.stderr, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("section, sql", BLOCKS,
                         ids=[f"{i:02d}-{re.sub(r'[^a-z]+', '-', s.lower()).strip('-')}" for i, (s, _) in enumerate(BLOCKS)])
def test_runbook_block(world: Fixture, section: str, sql: str) -> None:
    expected, after = check_for(sql)
    script = "BEGIN;\n" + sql + "\n\\echo ==after==\n"
    if after:
        script += after.format(**world.ids) + ";\n"
    script += "ROLLBACK;\n"
    out = psql(world.url, script, stage=STAGE, id=str(world.ids["ready2"]))
    result, _, checked = out.partition("==after==\n")
    for fragment in expected:
        assert fragment.format(**world.ids) in result, f"{section}: {fragment!r} not in output:\n{result}"
    if after:
        assert checked.strip() == "t", f"{section}: after the block, {after!r} gave {checked!r}"


def test_exporter_query_and_dashboard_match_queue_metrics(world: Fixture) -> None:
    """contrib/: postgres_exporter's query runs as skiplock_monitor and maps every column it returns;
    the Grafana dashboard asks only for series that query exports."""
    text = (ROOT / "contrib" / "postgres_exporter" / "queries.yaml").read_text()
    namespace = re.search(r"^(\w+):\s*$", text, re.M).group(1)
    query = re.search(r'^\s+query:\s*"(.*)"\s*$', text, re.M).group(1)
    mapped = dict(re.findall(r'^\s+- (\w+):\s*\n\s+usage:\s*"(\w+)"', text, re.M))
    with psycopg.connect(world.url, autocommit=True) as c:
        c.execute("SET ROLE skiplock_monitor")
        cur = c.execute(query)
        columns = [d.name for d in cur.description]
        rows = cur.fetchall()
    assert columns == list(mapped), "every column of the query needs a mapping, in order"
    assert {mapped["stage"], mapped["status"]} == {"LABEL"}
    assert ("rb.main", "fatal", 0, 0.0, 2) in rows
    exported = {f"{namespace}_{name}" for name, usage in mapped.items() if usage != "LABEL"}
    dashboard = json.loads((ROOT / "contrib" / "grafana" / "skiplock.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b(skiplock_\w+)\{", e)}
    assert used and used <= exported, used - exported


def test_metrics_reads_only_the_last_minute_of_history(world: Fixture) -> None:
    """history is read with (stage, finished) range scans, never by a scan of a whole partition."""
    with psycopg.connect(world.url, autocommit=True) as c:
        plan = "\n".join(r[0] for r in c.execute("EXPLAIN SELECT * FROM queue.metrics"))
    scans = [line for line in plan.splitlines() if re.search(r"Scan .*\bon history", line)]
    assert scans, plan
    assert not [line for line in scans if "Seq Scan" in line or "Bitmap Heap Scan" in line], plan
    assert "finished > (now() - '00:01:00'::interval)" in plan
