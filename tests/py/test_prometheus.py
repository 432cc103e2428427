"""Prometheus: queue.finished_totals only grows (rotation and retry take rows out of history, not
out of the count), and Debian's prometheus-postgres-exporter with contrib/postgres_exporter/queries.yaml,
scraped by Debian's prometheus, gives rate(skiplock_tasks_finished_total[1m]) for tasks drained
by a worker. Both servers listen on 127.0.0.1 only and are started and stopped here."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import psycopg
import pytest

from skiplock.sqlfiles import ROOT

EXPORTER, PROMETHEUS = "/usr/bin/prometheus-postgres-exporter", "/usr/bin/prometheus"
WAIT = 120.0


def wait_for(check: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.25)


def totals(conn: psycopg.Connection, stage: str) -> dict[str, int]:
    return dict(conn.execute("SELECT status, total FROM queue.finished_totals WHERE stage = %s", (stage,)).fetchall())


def drain(conn: psycopg.Connection, stage: str, n: int, fatal: int = 0) -> None:
    conn.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[%s]), %s)", (n + fatal, stage))
    if fatal:
        conn.execute("SELECT queue.fail(t.id, t.lease, 'bad', fatal => true) FROM queue.take_next(%s, %s) t", (stage, fatal))
    conn.execute("SELECT queue.finish(t.id, t.lease) FROM queue.take_next(%s, %s) t", (stage, n))


def test_finished_totals_never_go_down_across_retry_and_rotation(conn: psycopg.Connection) -> None:
    drain(conn, "prom.mono", 5, fatal=2)
    assert totals(conn, "prom.mono") == {"done": 5, "fatal": 2}
    fatal_id = conn.execute("SELECT id FROM queue.tasks WHERE stage = 'prom.mono' AND status = 'fatal' LIMIT 1").fetchone()[0]
    conn.execute("SELECT queue.retry(%s)", (fatal_id,))  # its history row goes back to live_tasks
    assert totals(conn, "prom.mono") == {"done": 5, "fatal": 2}
    conn.execute("SELECT queue.finish(t.id, t.lease) FROM queue.take_next('prom.mono') t")
    assert totals(conn, "prom.mono") == {"done": 6, "fatal": 2}
    # Far past the retention: every partition holding these rows is dropped, the default emptied.
    actions = conn.execute("SELECT action FROM queue.rotate_partitions(now() + interval '3 years')").fetchall()
    assert ("dropped",) in actions or ("truncated",) in actions, actions
    assert conn.execute("SELECT count(*) FROM queue.history WHERE stage = 'prom.mono'").fetchone() == (0,)
    assert totals(conn, "prom.mono") == {"done": 6, "fatal": 2}
    assert conn.execute("SELECT has_table_privilege('skiplock_monitor', 'queue.finished_totals', 'SELECT'),"
                        "       has_table_privilege('skiplock_monitor', 'queue.finished_dropped', 'SELECT')").fetchone() == (True, False)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)
    except OSError:
        return None


@pytest.fixture
def monitor_url(db: str) -> Iterator[str]:
    role = f"prom_exporter_{os.getpid()}"
    with psycopg.connect(db, autocommit=True) as c:
        c.execute(f"CREATE ROLE {role} LOGIN IN ROLE skiplock_monitor")
    try:
        yield psycopg.conninfo.make_conninfo(db, user=role)
    finally:
        with psycopg.connect(db, autocommit=True) as c:
            c.execute(f"DROP ROLE {role}")


def test_prometheus_rates_the_drained_tasks_from_the_exporter(monitor_url: str, conn: psycopg.Connection, tmp_path: Path) -> None:
    if not (shutil.which(EXPORTER) and shutil.which(PROMETHEUS)):
        pytest.skip("prometheus and prometheus-postgres-exporter are not installed: "
                    "apt-get install prometheus prometheus-postgres-exporter")
    stage = "prom.rate"
    conn.execute("SELECT queue.configure_stage('prom.paused', paused => true)")
    drain(conn, stage, 1)  # the series exists before the drain, so its first samples are the baseline
    exporter_port, prometheus_port = _port(), _port()
    # The exporter wants a key=value DSN or a URL with a host: give the socket directory as host.
    info = psycopg.conninfo.conninfo_to_dict(monitor_url)
    dsn = " ".join(f"{k}={v}" for k, v in info.items() if v is not None) + " sslmode=disable"
    exporter = subprocess.Popen(
        [EXPORTER, f"--web.listen-address=127.0.0.1:{exporter_port}", "--disable-default-metrics",
         "--disable-settings-metrics", f"--extend.query-path={ROOT / 'contrib' / 'postgres_exporter' / 'queries.yaml'}"],
        env=dict(os.environ, DATA_SOURCE_NAME=dsn), stdout=subprocess.DEVNULL, stderr=open(tmp_path / "exporter.log", "w"))
    config = tmp_path / "prometheus.yml"
    config.write_text(f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
                      f"  - job_name: skiplock\n    static_configs:\n      - targets: ['127.0.0.1:{exporter_port}']\n")
    prometheus = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prometheus_port}"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"))
    api = f"http://127.0.0.1:{prometheus_port}/api/v1/query?query="

    def query(promql: str) -> list[dict[str, Any]]:
        answer = _get_json(api + urllib.parse.quote(promql))
        return answer["data"]["result"] if answer and answer.get("status") == "success" else []

    try:
        series = f'skiplock_tasks_finished_total{{stage="{stage}",status="done"}}'
        wait_for(lambda: query(f"count_over_time({series}[1m]) >= 3"),
                 f"three scrapes of {series} (see {tmp_path}/exporter.log)")
        drain(conn, stage, 40)
        wait_for(lambda: [r for r in query(series) if float(r["value"][1]) == 41], "the drained tasks in the counter")
        rate = wait_for(lambda: query(f"rate({series}[1m]) > 0"), "a rate above 0")
        assert float(rate[0]["value"][1]) > 0
        grown = query(f"max_over_time({series}[1m]) - min_over_time({series}[1m])")
        assert grown and float(grown[0]["value"][1]) == 40, grown  # exactly the drained tasks
        types = _get_json(f"http://127.0.0.1:{prometheus_port}/api/v1/metadata?metric=skiplock_tasks_finished_total")
        assert types and types["data"]["skiplock_tasks_finished_total"][0]["type"] == "counter", types
        assert query('skiplock_stage_paused{stage="prom.paused"} == 1')
    finally:
        for process in (prometheus, exporter):
            process.terminate()
            process.wait(30)
