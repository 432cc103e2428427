"""The client libraries as a team installs them (issue 52): the Python wheel in a fresh venv, the
npm tarball in a fresh folder, each running workers and producers against a real cluster.

Python: `pip wheel --no-deps .`, installed with --no-deps into a new venv that sees this venv's
site-packages only for its dependencies (psycopg; OpenTelemetry for the tracing test): the
`skiplock` it imports is the wheel's (asserted). Each scenario is a small program run by that
venv's interpreter. Node: `npm pack` of clients/node, `npm install` of the tarball into an empty
project (pg from npm's cache or registry), a producer and a worker there.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import psycopg
import pytest
from test_clients import ClientWorker, as_uri, node_ready, wait_until  # noqa: F401 (node_ready: a fixture)

from dev.testrun import create_database, drop_database
from skiplock.sqlfiles import ROOT

NODE_DIR = ROOT / "clients" / "node"


@pytest.fixture(scope="module")
def url(admin_url: str, template_db: str) -> Iterator[str]:
    db = create_database(admin_url, "test_client_packages", template=template_db)
    try:
        yield db
    finally:
        drop_database(admin_url, db)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the skiplock wheel built from this tree; its python."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"   # a copy, as tests/py/test_migrations.py builds it: no stale build/ files
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".pg", "build", "*.egg-info", "__pycache__", "out", "node_modules"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
                    "-w", str(tmp), str(source)], check=True, cwd=tmp, timeout=600)
    (wheel,) = tmp.glob("skiplock-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, timeout=600)
    # The dependencies from this venv, after the new venv's own site-packages (so skiplock is the wheel's).
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "zz_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    where = subprocess.run([str(python), "-c", "import skiplock.worker; print(skiplock.worker.__file__)"],
                           check=True, capture_output=True, text=True, cwd=tmp).stdout.strip()
    assert where.startswith(str(venv)), f"skiplock imported from {where}, not from the installed wheel"
    return python


def run_program(python: Path, source: str, url: str, tmp_path: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(source))
    return subprocess.run([str(python), str(program)], env=dict(os.environ, DATABASE_URL=url), cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout)


def test_installed_library_runs_several_stages_in_threads_with_results_and_progress(installed: Path, url: str,
                                                                                      tmp_path: Path) -> None:
    """Handlers registered by decorator for two stages; four handlers must run at once (a barrier
    of four that would time out otherwise); results kept, progress stored, Fatal and a crash
    failed (logged with the task's fields), Snooze released without counting the attempt."""
    proc = run_program(installed, """
        import json, logging, os, threading
        import psycopg
        from skiplock.worker import Worker, Fatal, Snooze

        url = os.environ["DATABASE_URL"]
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT queue.configure_stage('lib.crash', max_attempts => 1)")
            conn.execute("SELECT queue.enqueue_batch(%s::jsonb[], stage => 'lib.wide')",
                         ([json.dumps({"n": n}) for n in range(4)],))
            conn.execute("SELECT queue.enqueue_batch(ARRAY['{\\"n\\": 1}', '{\\"fatal\\": true}', '{\\"snooze\\": true}']::jsonb[],"
                         " stage => 'lib.crash')")
        seen = []

        class Fields(logging.Handler):
            def emit(self, record):
                if hasattr(record, "task_id") and hasattr(record, "error"):
                    seen.append((record.stage, record.attempt, record.error))
        logging.getLogger("skiplock.worker").addHandler(Fields())

        worker = Worker(url, concurrency=4, batch=4, idle_wait=0.2, maintain_every=0)
        together = threading.Barrier(4, timeout=60)

        @worker.handler("lib.wide")
        def wide(task):
            task.progress({"step": "waiting"})
            with psycopg.connect(url) as c:
                assert c.execute("SELECT progress FROM queue.tasks WHERE id = %s", (task.id,)).fetchone() == ({"step": "waiting"},)
            together.wait()            # four at once, or BrokenBarrierError after 60 s
            return {"double": task.payload["n"] * 2}

        snoozed = set()

        @worker.handler("lib.crash")
        def crash(task):
            if task.payload.get("fatal"):
                raise Fatal("no such customer")
            if task.payload.get("snooze") and task.id not in snoozed:
                snoozed.add(task.id)
                raise Snooze(0.1)
            if "n" in task.payload:
                raise KeyError("image")

        counters = worker.run(should_stop=lambda: worker.counters.finished + worker.counters.failed >= 7)
        print(json.dumps({"finished": counters.finished, "failed": counters.failed, "snoozed": counters.snoozed,
                          "seen": sorted(seen)}))
    """, url, tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert (out["finished"], out["failed"], out["snoozed"]) == (5, 2, 1), (out, proc.stderr)
    assert out["seen"] == [["lib.crash", 1, "KeyError: 'image'"], ["lib.crash", 1, "no such customer"]], out
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT status::text, attempt, result, error_text FROM queue.tasks WHERE stage LIKE 'lib.%%'"
                            " ORDER BY stage DESC, id").fetchall()
    assert rows == [("done", 1, {"double": 0}, None), ("done", 1, {"double": 2}, None), ("done", 1, {"double": 4}, None),
                    ("done", 1, {"double": 6}, None),
                    ("fatal", 1, None, "KeyError: 'image'"), ("fatal", 1, None, "no such customer"),
                    ("done", 1, None, None)], rows


def test_installed_library_runs_async_handlers_together(installed: Path, url: str, tmp_path: Path) -> None:
    """async def handlers, concurrency 20: all twenty wait at once on the worker's event loop (each
    waits for the twentieth, or times out after 60 s and fails)."""
    proc = run_program(installed, """
        import asyncio, json, os
        import psycopg
        from skiplock.worker import Worker
        url = os.environ["DATABASE_URL"]
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[20]), stage => 'lib.async')")
        worker = Worker(url, concurrency=20, batch=20, idle_wait=0.2, maintain_every=0)
        arrived = []
        everyone = None

        @worker.handler("lib.async")
        async def wait_for_all(task):
            global everyone
            everyone = everyone or asyncio.Event()
            arrived.append(task.id)
            if len(arrived) == 20:
                everyone.set()
            await asyncio.wait_for(everyone.wait(), 60)
            return {"arrived": len(arrived)}

        counters = worker.run(should_stop=lambda: worker.counters.finished + worker.counters.failed >= 20)
        print(json.dumps({"finished": counters.finished, "failed": counters.failed}))
    """, url, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {"finished": 20, "failed": 0}, (proc.stdout, proc.stderr)


def test_installed_async_worker_runs_handlers_on_the_callers_loop_and_cancels_one_at_shutdown(
        installed: Path, url: str, tmp_path: Path) -> None:
    """AsyncWorker, `await worker.run()`: twenty async handlers wait for each other on the caller's
    event loop (each fails after 60 s otherwise), no thread of the worker's running (its loop is
    asyncio on AsyncConnection); a twenty-first that never ends is cancelled once shutdown_timeout
    passes after the stop, and its task released (ready, the attempt not counted)."""
    with psycopg.connect(url, autocommit=True) as conn:
        forever = conn.execute("SELECT queue.enqueue('{}', stage => 'aw.forever')").fetchone()[0]
    proc = run_program(installed, """
        import asyncio, json, os, threading
        import psycopg
        from skiplock.worker import AsyncWorker
        url = os.environ["DATABASE_URL"]
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[20]), stage => 'aw.wait')")

        async def main():
            loop = asyncio.get_running_loop()
            worker = AsyncWorker(url, concurrency=21, batch=21, idle_wait=0.2, maintain_every=0, shutdown_timeout=1)
            everyone, started = asyncio.Event(), asyncio.Event()
            arrived, on_loop, cancelled, threads = [], [], [], set()

            @worker.handler("aw.wait")
            async def wait_for_all(task):
                on_loop.append(asyncio.get_running_loop() is loop)
                threads.update(t.name for t in threading.enumerate() if t.name.startswith("skiplock"))
                arrived.append(task.id)
                if len(arrived) == 20:
                    everyone.set()
                await asyncio.wait_for(everyone.wait(), 60)
                return {"arrived": len(arrived)}

            @worker.handler("aw.forever")
            async def never_ends(task):
                started.set()
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    cancelled.append(task.id)
                    raise

            counters = await worker.run(should_stop=lambda: worker.counters.finished >= 20 and started.is_set())
            for _ in range(600):   # the cancellation reaches the coroutine on the loop's next turn
                if cancelled:
                    break
                await asyncio.sleep(0.1)
            print(json.dumps({"finished": counters.finished, "failed": counters.failed, "on_loop": all(on_loop),
                              "cancelled": cancelled, "threads": sorted(threads)}))

        asyncio.run(main())
    """, url, tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out == {"finished": 20, "failed": 0, "on_loop": True, "cancelled": [forever], "threads": []}, \
        (out, proc.stderr)
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT status::text, attempt FROM queue.tasks WHERE id = %s", (forever,)).fetchone() == ("ready", 0)
        assert conn.execute("SELECT count(*) FROM queue.tasks WHERE stage = 'aw.wait' AND status = 'done'").fetchone() == (20,)


def test_installed_library_transactional_mode_commits_a_handlers_writes_with_the_finish(installed: Path, url: str,
                                                                                         tmp_path: Path) -> None:
    """transactional=True: the row a handler writes through task.conn commits with finish_locked;
    the write of a handler that raises is rolled back and the attempt failed."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE lib_orders (n int PRIMARY KEY)")
        conn.execute("GRANT ALL ON lib_orders TO PUBLIC")
        conn.execute("SELECT queue.configure_stage('lib.tx', max_attempts => 1)")
        ids = [r[0] for r in conn.execute("SELECT queue.enqueue_batch(ARRAY['{\"n\": 1}', '{\"n\": 2}']::jsonb[],"
                                          " stage => 'lib.tx')")]
    proc = run_program(installed, """
        import os
        from skiplock.worker import Worker, Fail
        worker = Worker(os.environ["DATABASE_URL"], transactional=True, idle_wait=0.2, maintain_every=0)

        @worker.handler("lib.tx")
        def order(task):
            task.conn.execute("INSERT INTO lib_orders VALUES (%s)", (task.payload["n"],))
            if task.payload["n"] == 2:
                raise Fail("card declined")
            return {"ordered": task.payload["n"]}

        worker.run(should_stop=lambda: worker.counters.taken >= 2)
    """, url, tmp_path)
    assert proc.returncode == 0, proc.stderr
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT n FROM lib_orders").fetchall() == [(1,)]
        assert conn.execute("SELECT status::text, result, error_text FROM queue.tasks WHERE id = ANY(%s) ORDER BY id",
                            (ids,)).fetchall() == [("done", {"ordered": 1}, None), ("fatal", None, "card declined")]


def test_installed_library_releases_what_outlives_the_shutdown_timeout(installed: Path, url: str, tmp_path: Path) -> None:
    """stop() with a handler that never ends: after shutdown_timeout its task is released (due
    again, the attempt not counted) and run() returns."""
    proc = run_program(installed, """
        import os, threading
        import psycopg
        from skiplock.worker import Worker
        url = os.environ["DATABASE_URL"]
        with psycopg.connect(url, autocommit=True) as conn:
            (task,) = conn.execute("SELECT queue.enqueue('{}', stage => 'lib.hang')").fetchone()
        worker = Worker(url, shutdown_timeout=1, idle_wait=0.2, maintain_every=0)
        started = threading.Event()

        @worker.handler("lib.hang")
        def hang(task):
            started.set()
            threading.Event().wait()

        threading.Thread(target=lambda: (started.wait(60), worker.stop()), daemon=True).start()
        worker.run()
        with psycopg.connect(url, autocommit=True) as conn:
            print(conn.execute("SELECT status::text, attempt, worker FROM queue.live_tasks WHERE id = %s", (task,)).fetchone())
    """, url, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "('ready', 0, None)", (proc.stdout, proc.stderr)
    assert "still running after the shutdown timeout (1 s): released" in proc.stderr, proc.stderr


def test_installed_library_ends_at_once_on_a_refused_login(installed: Path, url: str, tmp_path: Path) -> None:
    """A login the server refuses (no such role) is not retried: run() raises Refused, logged in one line."""
    bad = psycopg.conninfo.make_conninfo(url, user="lib_no_such_role")
    proc = run_program(installed, """
        import logging, os
        from skiplock.worker import Worker, Refused
        logging.basicConfig(format="%(message)s")
        worker = Worker(os.environ["DATABASE_URL"], {"lib.auth": lambda task: None}, maintain_every=0)
        try:
            worker.run()
        except Refused as e:
            print("refused:", e)
    """, bad, tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("refused: main connection: ") and "lib_no_such_role" in proc.stdout, proc.stdout
    assert "waiting does not cure this" in proc.stderr and "retrying" not in proc.stderr, proc.stderr


def test_installed_library_carries_one_trace_from_enqueue_to_finish(installed: Path, url: str, tmp_path: Path) -> None:
    """OpenTelemetry (opentelemetry-sdk): the producer's span context travels in the payload
    ("_trace"); the worker's span per task is its child, with stage, id and attempt."""
    proc = run_program(installed, """
        import json, os
        import psycopg
        from psycopg.types.json import Jsonb
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from skiplock.tracing import with_trace
        from skiplock.worker import Worker

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        url = os.environ["DATABASE_URL"]
        with trace.get_tracer("app").start_as_current_span("checkout") as parent, \\
                psycopg.connect(url, autocommit=True) as conn:
            (task,) = conn.execute("SELECT queue.enqueue(%s, stage => 'lib.traced')",
                                   (Jsonb(with_trace({"order": 7})),)).fetchone()
        worker = Worker(url, {"lib.traced": lambda task: {"seen": task.payload["order"]}}, idle_wait=0.2, maintain_every=0)
        worker.run(should_stop=lambda: worker.counters.finished >= 1)
        spans = {s.name: s for s in exporter.get_finished_spans()}
        span = spans["skiplock.task lib.traced"]
        print(json.dumps({"same_trace": span.context.trace_id == parent.get_span_context().trace_id,
                          "parent": span.parent.span_id == parent.get_span_context().span_id,
                          "attributes": dict(span.attributes), "task": task, "status": span.status.status_code.name}))
    """, url, tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["same_trace"] and out["parent"], out
    assert out["attributes"] == {"skiplock.stage": "lib.traced", "skiplock.task_id": out["task"], "skiplock.attempt": 1}, out
    assert out["status"] == "UNSET", out


def test_npm_tarball_installs_and_runs_a_producer_and_a_multi_stage_worker(url: str, tmp_path: Path) -> None:
    """`npm pack` of clients/node, installed into an empty project: enqueue into two stages, a
    worker with a handler per stage keeps results, stops on its own; the types ship with it."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: the Node package's test needs Node.js >= 18 and npm", pytrace=False)
    packed = subprocess.run(["npm", "pack", "--pack-destination", str(tmp_path), "--json"], cwd=NODE_DIR,
                            capture_output=True, text=True, timeout=300)
    assert packed.returncode == 0, packed.stderr
    info = json.loads(packed.stdout)[0]
    assert {f["path"] for f in info["files"]} >= {"index.js", "index.d.ts", "worker.js", "producer.js", "README.md",
                                                  "package.json"}, info["files"]
    project = tmp_path / "app"
    project.mkdir()
    (project / "package.json").write_text('{"name": "app", "version": "1.0.0", "private": true}\n')
    install = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefer-offline", str(tmp_path / info["filename"])],
                             cwd=project, capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    (project / "main.js").write_text(textwrap.dedent("""
        const { Worker, Outcome, enqueue } = require('skiplock');
        const url = process.env.DATABASE_URL;
        (async () => {
          await enqueue(url, 'npm.a', [{ n: 1 }, { n: 2 }]);
          await enqueue(url, 'npm.b', [{ n: 3 }]);
          const worker = new Worker({ url, idleWait: 0.2, maintainEvery: 0, handlers: {
            'npm.a': async (task) => { await task.progress({ half: true }); return { double: task.payload.n * 2 }; },
            'npm.b': async (task) => new Outcome({ result: { stage: task.stage } }),
          } });
          const timer = setInterval(() => { if (worker.counters.finished >= 3) worker.stop(); }, 50);
          const counters = await worker.run();
          clearInterval(timer);
          console.log(JSON.stringify(counters));
        })().catch((err) => { console.error(err); process.exit(1); });
    """))
    proc = subprocess.run(["node", "main.js"], cwd=project, env=dict(os.environ, DATABASE_URL=as_uri(url)),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["finished"] == 3, proc.stdout
    assert (project / "node_modules" / "skiplock" / "index.d.ts").exists()
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT stage, status::text, result FROM queue.tasks WHERE stage LIKE 'npm.%%' ORDER BY id").fetchall()
    assert rows == [("npm.a", "done", {"double": 2}), ("npm.a", "done", {"double": 4}),
                    ("npm.b", "done", {"stage": "npm.b"})], rows


def test_npm_package_carries_one_trace_from_enqueue_to_finish(url: str, tmp_path: Path) -> None:
    """With @opentelemetry/api (and the SDK) installed beside the package: the producer's span
    context travels in the payload ("_trace"), the worker's span is its child with stage, id, attempt."""
    packed = subprocess.run(["npm", "pack", "--pack-destination", str(tmp_path), "--json"], cwd=NODE_DIR,
                            capture_output=True, text=True, timeout=300)
    assert packed.returncode == 0, packed.stderr
    project = tmp_path / "app"
    project.mkdir()
    (project / "package.json").write_text('{"name": "app", "version": "1.0.0", "private": true}\n')
    install = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefer-offline",
                              str(tmp_path / json.loads(packed.stdout)[0]["filename"]),
                              "@opentelemetry/api@1", "@opentelemetry/sdk-trace-base@2", "@opentelemetry/core@2"],
                             cwd=project, capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    (project / "main.js").write_text(textwrap.dedent("""
        const otel = require('@opentelemetry/api');
        const { W3CTraceContextPropagator } = require('@opentelemetry/core');
        const { BasicTracerProvider, SimpleSpanProcessor, InMemorySpanExporter } = require('@opentelemetry/sdk-trace-base');
        const { Worker, withTrace, enqueue } = require('skiplock');
        const exporter = new InMemorySpanExporter();
        otel.trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
        otel.propagation.setGlobalPropagator(new W3CTraceContextPropagator());
        const url = process.env.DATABASE_URL;
        (async () => {
          const parent = otel.trace.getTracer('app').startSpan('checkout');
          const [id] = await enqueue(url, 'npm.traced', [withTrace({ order: 7 }, otel.trace.setSpan(otel.context.active(), parent))]);
          parent.end();
          const worker = new Worker({ url, stage: 'npm.traced', idleWait: 0.2, maintainEvery: 0, handler: async () => ({ ok: 1 }) });
          const timer = setInterval(() => { if (worker.counters.finished >= 1) worker.stop(); }, 50);
          await worker.run();
          clearInterval(timer);
          const span = exporter.getFinishedSpans().find((s) => s.name === 'skiplock.task npm.traced');
          console.log(JSON.stringify({ sameTrace: span.spanContext().traceId === parent.spanContext().traceId,
                                       parent: (span.parentSpanContext || {}).spanId === parent.spanContext().spanId,
                                       attributes: span.attributes, id: Number(id) }));
        })().catch((err) => { console.error(err); process.exit(1); });
    """))
    proc = subprocess.run(["node", "main.js"], cwd=project, env=dict(os.environ, DATABASE_URL=as_uri(url)),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["sameTrace"] and out["parent"], out
    assert out["attributes"] == {"skiplock.stage": "npm.traced", "skiplock.task_id": out["id"], "skiplock.attempt": 1}, out


@pytest.fixture(scope="module")
def npm_app(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty project with the `npm pack` tarball of clients/node installed; its folder."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: the Node package's test needs Node.js >= 18 and npm", pytrace=False)
    tmp = tmp_path_factory.mktemp("npm")
    packed = subprocess.run(["npm", "pack", "--pack-destination", str(tmp), "--json"], cwd=NODE_DIR,
                            capture_output=True, text=True, timeout=300)
    assert packed.returncode == 0, packed.stderr
    project = tmp / "app"
    project.mkdir()
    (project / "package.json").write_text('{"name": "app", "version": "1.0.0", "private": true}\n')
    install = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefer-offline",
                              str(tmp / json.loads(packed.stdout)[0]["filename"])],
                             cwd=project, capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    return project


def run_node(project: Path, name: str, source: str, url: str) -> subprocess.CompletedProcess:
    (project / name).write_text(textwrap.dedent(source))
    return subprocess.run(["node", name], cwd=project, env=dict(os.environ, DATABASE_URL=as_uri(url)),
                          capture_output=True, text=True, timeout=300)


def test_npm_package_runs_concurrency_handlers_at_once_each_heartbeated(npm_app: Path, url: str) -> None:
    """concurrency: 4: four handlers of one batch wait for each other (each fails after 60 s
    otherwise), then outlive their 6 s lease by half again: every lease is still ahead (heartbeated)."""
    proc = run_node(npm_app, "concurrent.js", """
        const { Client } = require('pg');
        const { Worker, enqueue } = require('skiplock');
        const url = process.env.DATABASE_URL;
        (async () => {
          await enqueue(url, 'npm.wide', [{ n: 0 }, { n: 1 }, { n: 2 }, { n: 3 }]);
          let arrived = 0;
          let everyone;
          const together = new Promise((resolve) => { everyone = resolve; });
          const ahead = [];
          const worker = new Worker({ url, concurrency: 4, batch: 4, lease: 6, idleWait: 0.2, maintainEvery: 0, handlers: {
            'npm.wide': async (task) => {
              arrived += 1;
              if (arrived === 4) everyone();
              await Promise.race([together, new Promise((_, reject) => setTimeout(() => reject(new Error('alone')), 60000))]);
              await new Promise((resolve) => setTimeout(resolve, 9000));
              const c = new Client({ connectionString: url });
              await c.connect();
              const { rows } = await c.query('SELECT lease_expires > now() AS ahead FROM queue.tasks WHERE id = $1', [task.id]);
              await c.end();
              ahead.push(rows[0].ahead);
              return { n: task.payload.n };
            },
          } });
          const timer = setInterval(() => { if (worker.counters.finished + worker.counters.failed >= 4) worker.stop(); }, 50);
          const counters = await worker.run();
          clearInterval(timer);
          console.log(JSON.stringify({ finished: counters.finished, failed: counters.failed, ahead }));
        })().catch((err) => { console.error(err); process.exit(1); });
    """, url)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {"finished": 4, "failed": 0, "ahead": [True] * 4}, proc.stderr
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT status::text, attempt, result FROM queue.tasks WHERE stage = 'npm.wide'"
                            " ORDER BY id").fetchall() == [("done", 1, {"n": n}) for n in range(4)]


def test_npm_package_transactional_mode_commits_a_handlers_writes_with_the_finish(npm_app: Path, url: str) -> None:
    """transactional: true: the row a handler writes through task.client commits with finish_locked;
    the write of a handler that throws, or whose statement fails (the transaction's other tasks
    go on), is rolled back to the task's savepoint and the attempt failed."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE npm_orders (n int PRIMARY KEY)")
        conn.execute("GRANT ALL ON npm_orders TO PUBLIC")
        conn.execute("SELECT queue.configure_stage('npm.tx', max_attempts => 1)")
        ids = [r[0] for r in conn.execute("SELECT queue.enqueue_batch(ARRAY['{\"n\": 1}', '{\"n\": 2}', '{\"n\": 1}',"
                                          " '{\"n\": 3}']::jsonb[], stage => 'npm.tx')")]
    proc = run_node(npm_app, "transactional.js", """
        const { Worker, Fail } = require('skiplock');
        (async () => {
          const worker = new Worker({ url: process.env.DATABASE_URL, transactional: true, idleWait: 0.2, maintainEvery: 0,
                                      handlers: { 'npm.tx': async (task) => {
            await task.client.query('INSERT INTO npm_orders VALUES ($1)', [task.payload.n]);  // n = 1 twice: 23505
            if (task.payload.n === 2) throw new Fail('card declined');
            return { ordered: task.payload.n };
          } } });
          const timer = setInterval(() => { if (worker.counters.taken >= 4) worker.stop(); }, 50);
          console.log(JSON.stringify(await worker.run()));
          clearInterval(timer);
        })().catch((err) => { console.error(err); process.exit(1); });
    """, url)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["finished"] == 2, proc.stdout + proc.stderr
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT n FROM npm_orders ORDER BY n").fetchall() == [(1,), (3,)]
        rows = conn.execute("SELECT status::text, result, error_text FROM queue.tasks WHERE id = ANY(%s) ORDER BY id",
                            (ids,)).fetchall()
    assert rows[:2] == [("done", {"ordered": 1}, None), ("fatal", None, "card declined")], rows
    assert rows[2][:2] == ("fatal", None) and "duplicate key" in rows[2][2], rows
    assert rows[3] == ("done", {"ordered": 3}, None), rows


@pytest.mark.parametrize("language", ["python", "node"])
def test_client_script_takes_a_list_of_stages(language: str, url: str, request: pytest.FixtureRequest) -> None:
    """STAGE=a,b (issue 50 item 4): the Python and Node worker scripts drain both stages, each task
    finished in its own stage."""
    if language == "node":
        request.getfixturevalue("node_ready")
    a, b = f"list_{language}.a", f"list_{language}.b"
    with psycopg.connect(url, autocommit=True) as conn:
        ids = [r[0] for stage in (a, b) for r in conn.execute(
            "SELECT queue.enqueue_batch(array_fill('{}'::jsonb, ARRAY[3]), stage => %s)", (stage,))]
        worker = ClientWorker(language, url, f"{a},{b}", IDLE_WAIT=0.5, MAINTAIN_EVERY=0)
        try:
            wait_until("both stages to drain", lambda: conn.execute(
                "SELECT count(*) FROM queue.history WHERE id = ANY(%s)", (ids,)).fetchone()[0] == 6, 120, worker)
        finally:
            code = worker.stop()
        assert code == 0, worker.log()
        rows = conn.execute("SELECT stage, count(*) FROM queue.history WHERE id = ANY(%s) AND status = 'done'"
                            " GROUP BY stage ORDER BY stage", (ids,)).fetchall()
    assert rows == [(a, 3), (b, 3)], worker.log()
