"""`skiplock web` in a real browser: headless Chromium (Debian's chromium and chromium-driver,
driven by Selenium; no browser is downloaded) against the app served by uvicorn on loopback,
logged in to a real database as an admin, a monitor and a tenant; real workers (`skiplock worker`)
take what the pages change.

SKIPLOCK_SCREENSHOTS=DIR (set by `make screenshots`) also writes the overview and a task page as
PNG files into DIR.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterator

import psycopg
import pytest

from skiplock.sqlfiles import ROOT

uvicorn = pytest.importorskip("uvicorn", reason="skiplock[web] is not installed")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra)")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

from skiplock import web  # noqa: E402

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ENV = dict(os.environ, COLUMNS="200")
ENV.pop("DATABASE_URL", None)
WAIT = 90.0  # seconds: a bound against hangs on a loaded machine, never a pace


def wait_for(check: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


class Server:
    """The dashboard on a free loopback port, in a thread of this process."""

    def __init__(self, url: str, password: str | None = None) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(web.create_app(url, password, refresh_ms=500), host="127.0.0.1",
                                                    port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, "the dashboard to listen")
        self.base = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def roles(db: str) -> Iterator[dict[str, str]]:
    """Logins: an admin, a monitor, and a tenant (a monitor that may use only its own restricted stage)."""
    suffix = os.getpid()
    names = {"admin": f"web_admin_{suffix}", "monitor": f"web_monitor_{suffix}", "tenant": f"web_tenant_{suffix}",
             "tenant_group": f"web_tenant_group_{suffix}"}
    with psycopg.connect(db, autocommit=True) as c:
        c.execute(f"CREATE ROLE {names['admin']} LOGIN IN ROLE skiplock_admin")
        c.execute(f"CREATE ROLE {names['monitor']} LOGIN IN ROLE skiplock_monitor")
        c.execute(f"CREATE ROLE {names['tenant_group']} NOLOGIN")
        c.execute(f"CREATE ROLE {names['tenant']} LOGIN IN ROLE skiplock_monitor, {names['tenant_group']}")
    try:
        yield {k: psycopg.conninfo.make_conninfo(db, user=v) for k, v in names.items() if k != "tenant_group"} | {
            "tenant_group": names["tenant_group"]}
    finally:
        with psycopg.connect(db, autocommit=True) as c:
            c.execute("DELETE FROM queue.stage_access")
            for name in names.values():
                c.execute(f"DROP ROLE {name}")


@pytest.fixture(scope="module")
def servers(roles: dict[str, str]) -> Iterator[dict[str, Server]]:
    started = {k: Server(roles[k]) for k in ("admin", "monitor", "tenant")}
    try:
        yield started
    finally:
        for s in started.values():
            s.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip(f"{CHROMIUM} and {CHROMEDRIVER} are needed: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def conn(db: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db, autocommit=True) as c:
        yield c


def enqueue(conn: psycopg.Connection, stage: str, *payloads: dict) -> list[int]:
    return [r[0] for r in conn.execute("SELECT queue.enqueue_batch(%s::jsonb[], %s)",
                                       ([json.dumps(p) for p in payloads], stage))]


def fail(conn: psycopg.Connection, stage: str, error: str, fatal: bool = True) -> int:
    row = conn.execute("SELECT t.id, queue.fail(t.id, t.lease, %s, fatal => %s) FROM queue.take_next(%s) t",
                       (error, fatal, stage)).fetchone()
    assert row is not None and row[1], f"no task of {stage} to fail"
    return int(row[0])


def status(conn: psycopg.Connection, task_id: int, stage: str) -> str:
    """The task's current status in a stage: its live row, else its latest finished one."""
    row = conn.execute("SELECT status::text FROM queue.tasks WHERE id = %s AND stage = %s"
                       " ORDER BY finished DESC NULLS FIRST LIMIT 1", (task_id, stage)).fetchone()
    return row[0] if row else ""


def work(db: str, stage: str) -> subprocess.CompletedProcess:
    """A real worker drains the stage's due tasks and exits (`skiplock worker --until-empty`)."""
    proc = subprocess.run([sys.executable, "-m", "skiplock", "--db", db, "worker", "--stage", stage, "--until-empty",
                           "-q", "--", "true"], capture_output=True, text=True, timeout=WAIT, env=ENV, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return proc


def post_from_page(driver: Any, path: str, fields: dict[str, str]) -> dict[str, Any]:
    """A POST sent by script from the current page (same origin, its cookies): what a forged form would send."""
    return driver.execute_async_script("""
        const [path, fields, done] = arguments;
        fetch(path, {method: "POST", body: new URLSearchParams(fields), redirect: "manual", credentials: "same-origin"})
          .then(r => r.text().then(t => done({status: r.status, type: r.type, text: t})))
          .catch(e => done({status: -1, text: String(e)}));""", path, fields)


def stages_shown(driver: Any) -> list[str]:
    """The overview's stages, read in one script call (the table is replaced while it refreshes)."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('tr[data-stage]'), r => r.dataset.stage)")


def ready_shown(driver: Any, stage: str) -> str:
    return driver.execute_script(
        "const c = document.querySelector(`tr[data-stage=\"${arguments[0]}\"] td:nth-child(2)`); return c && c.textContent",
        stage)


def csrf_of_page(driver: Any) -> str:
    return driver.find_element(By.CSS_SELECTOR, "meta[name=csrf-token]").get_attribute("content")


def test_overview_shows_the_stages_of_the_database(servers: dict[str, Server], browser: Any, conn: psycopg.Connection) -> None:
    enqueue(conn, "web.alpha", {"n": 1}, {"n": 2}, {"n": 3})
    enqueue(conn, "web.beta", {"n": 1})
    browser.get(servers["admin"].base + "/")
    assert {"web.alpha", "web.beta"} <= set(stages_shown(browser))
    assert ready_shown(browser, "web.alpha") == "3"
    # The live part refreshes itself: a task enqueued now shows without a reload.
    enqueue(conn, "web.alpha", {"n": 4})
    wait_for(lambda: ready_shown(browser, "web.alpha") == "4", "the overview's refresh to show the fourth task")


def test_a_failed_task_shows_its_error_and_retry_puts_it_back_for_a_worker(
        db: str, servers: dict[str, Server], browser: Any, conn: psycopg.Connection) -> None:
    enqueue(conn, "web.fail", {"image": "cat.png"})
    task_id = fail(conn, "web.fail", "ImageError: cat.png is not an image")
    browser.get(f"{servers['admin'].base}/task/{task_id}")
    assert "ImageError: cat.png is not an image" in browser.find_element(By.ID, "last-error").text
    assert browser.find_element(By.ID, "task-status").text == "fatal"
    browser.find_element(By.CSS_SELECTOR, "form[action='/action/retry'] button").click()
    wait_for(lambda: "retried 1" in browser.page_source, "the retry's confirmation")
    assert status(conn, task_id, "web.fail") == "ready"
    work(db, "web.fail")
    assert status(conn, task_id, "web.fail") == "done"


def test_retry_all_of_an_error_group_from_the_failures_page(
        servers: dict[str, Server], browser: Any, conn: psycopg.Connection) -> None:
    enqueue(conn, "web.group", *({"n": i} for i in range(3)))
    ids = [fail(conn, "web.group", "Timeout talking to S3") for _ in range(2)]
    other = fail(conn, "web.group", "a different error")
    browser.get(servers["admin"].base + "/failures?stage=web.group")
    groups = browser.find_elements(By.CSS_SELECTOR, "tr.group")
    (s3,) = [g for g in groups if "Timeout talking to S3" in g.text]
    browser.execute_script("window.confirm = () => true")
    s3.find_element(By.CSS_SELECTOR, "form[action='/action/retry-group'] button").click()
    wait_for(lambda: "retried 2" in browser.page_source, "the group's retry")
    assert [status(conn, i, "web.group") for i in ids] == ["ready", "ready"]
    assert status(conn, other, "web.group") == "fatal"


def test_bulk_retry_and_cancel_of_selected_tasks_on_a_stage_page(
        servers: dict[str, Server], browser: Any, conn: psycopg.Connection) -> None:
    enqueue(conn, "web.bulk", *({"n": i} for i in range(4)))
    failed = [fail(conn, "web.bulk", f"error {i}") for i in range(3)]
    browser.get(servers["admin"].base + "/stage/web.bulk?status=fatal")
    for box in browser.find_elements(By.CSS_SELECTOR, "tr.task input[name=id]"):
        if int(box.get_attribute("value")) in failed[:2]:
            box.click()
    browser.find_element(By.CSS_SELECTOR, "button[formaction='/action/retry']").click()
    wait_for(lambda: "retried 2" in browser.page_source, "the bulk retry's confirmation")
    assert [status(conn, i, "web.bulk") for i in failed] == ["ready", "ready", "fatal"]
    browser.get(servers["admin"].base + "/stage/web.bulk?status=ready")
    browser.execute_script("window.confirm = () => true")
    browser.find_element(By.ID, "select-all").click()
    browser.find_element(By.CSS_SELECTOR, "button[formaction='/action/cancel']").click()
    wait_for(lambda: "cancelled 3" in browser.page_source, "the bulk cancel's confirmation")
    assert conn.execute("SELECT count(*) FROM queue.tasks WHERE stage = 'web.bulk' AND finished IS NULL").fetchone() == (0,)


def test_run_now_runs_a_schedule_for_an_admin_and_is_not_offered_to_a_monitor(
        servers: dict[str, Server], browser: Any, conn: psycopg.Connection) -> None:
    """queue.run_schedule_now ships in 0110: the admin gets the button and it runs the schedule; a
    database without it (the function renamed away here, as in an older revision) gets none."""
    conn.execute("SELECT queue.schedule('web-nightly', '0 3 * * *', 'web.cron')")
    browser.get(servers["admin"].base + "/schedules")
    browser.find_element(By.CSS_SELECTOR, "form[action='/action/run-now'] button").click()
    wait_for(lambda: "ran web-nightly" in browser.page_source, "the run-now's confirmation")
    assert conn.execute("SELECT count(*) FROM queue.tasks WHERE stage = 'web.cron'").fetchone() == (1,)
    # queue.run_schedule_now left the timetable alone.
    assert conn.execute("SELECT last_fired FROM queue.schedules WHERE name = 'web-nightly'").fetchone() == (None,)
    browser.get(servers["monitor"].base + "/schedules")
    assert browser.find_elements(By.CSS_SELECTOR, "form[action='/action/run-now']") == []
    conn.execute("ALTER FUNCTION queue.run_schedule_now(text) RENAME TO run_schedule_now_away")
    try:  # a database without the function: no button
        browser.get(servers["admin"].base + "/schedules")
        assert "web-nightly" in browser.page_source
        assert browser.find_elements(By.CSS_SELECTOR, "form[action='/action/run-now']") == []
    finally:
        conn.execute("ALTER FUNCTION queue.run_schedule_now_away(text) RENAME TO run_schedule_now")


def test_pause_and_resume_change_what_a_worker_takes(
        db: str, servers: dict[str, Server], browser: Any, conn: psycopg.Connection) -> None:
    (task_id,) = enqueue(conn, "web.pause", {"n": 1})
    browser.get(servers["admin"].base + "/stage/web.pause")
    browser.find_element(By.CSS_SELECTOR, "form[action='/action/pause'] button").click()
    wait_for(lambda: "paused web.pause" in browser.page_source, "the pause's confirmation")
    assert conn.execute("SELECT paused FROM queue.stage_config WHERE stage = 'web.pause'").fetchone() == (True,)
    work(db, "web.pause")
    assert status(conn, task_id, "web.pause") == "ready", "a worker took a task of a paused stage"
    browser.find_element(By.CSS_SELECTOR, "form[action='/action/resume'] button").click()
    wait_for(lambda: "resumed web.pause" in browser.page_source, "the resume's confirmation")
    work(db, "web.pause")
    assert status(conn, task_id, "web.pause") == "done"


def test_the_monitor_sees_no_buttons_and_the_database_refuses_its_forged_post(
        servers: dict[str, Server], browser: Any, conn: psycopg.Connection) -> None:
    enqueue(conn, "web.mon", {"n": 1}, {"n": 2})  # one stays live: the stage is in queue.stage_config
    task_id = fail(conn, "web.mon", "monitor must not retry me")
    base = servers["monitor"].base
    for path in ("/", "/failures", "/schedules", "/stage/web.mon?status=fatal", f"/task/{task_id}"):
        browser.get(base + path)
        assert browser.find_elements(By.CSS_SELECTOR, "form[method=post]") == [], path
        assert "read-only" in browser.find_element(By.TAG_NAME, "header").text
    assert "monitor must not retry me" in browser.page_source  # it reads everything
    # The page's own CSRF token, so that only the database stands in the way.
    for action, fields in (("retry", {"id": str(task_id)}), ("pause", {"stage": "web.mon"})):
        answer = post_from_page(browser, f"/action/{action}", {"csrf": csrf_of_page(browser), **fields})
        assert answer["status"] == 403 and "permission denied" in answer["text"], answer
    assert status(conn, task_id, "web.mon") == "fatal"
    assert conn.execute("SELECT paused FROM queue.stage_config WHERE stage = 'web.mon'").fetchone() == (False,)


def test_posts_without_the_csrf_token_are_refused(servers: dict[str, Server], browser: Any, conn: psycopg.Connection) -> None:
    enqueue(conn, "web.csrf", {"n": 1})
    task_id = fail(conn, "web.csrf", "stays fatal")
    browser.get(servers["admin"].base + "/")
    for fields in ({"id": str(task_id)}, {"id": str(task_id), "csrf": "0" * 64}):
        answer = post_from_page(browser, "/action/retry", fields)
        assert answer["status"] == 403 and "CSRF" in answer["text"], answer
    answer = post_from_page(browser, "/action/retry", {"id": str(task_id), "csrf": csrf_of_page(browser)})
    assert answer["type"] == "opaqueredirect", answer  # the same request with the token goes through (303)
    assert status(conn, task_id, "web.csrf") == "ready"
    # A GET never changes state.
    browser.get(f"{servers['admin'].base}/action/cancel?id={task_id}")
    assert "POST only" in browser.page_source and status(conn, task_id, "web.csrf") == "ready"


def test_a_script_in_a_payload_or_an_error_is_shown_as_text(
        servers: dict[str, Server], browser: Any, conn: psycopg.Connection) -> None:
    evil = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"
    enqueue(conn, "web.xss", {"html": evil})
    task_id = fail(conn, "web.xss", evil)
    for path in (f"/task/{task_id}", "/stage/web.xss?status=fatal", "/failures?stage=web.xss"):
        browser.get(servers["admin"].base + path)
        assert browser.title != "pwned" and browser.find_elements(By.CSS_SELECTOR, "main img") == [], path
        assert "<script>document.title='pwned'</script>" in browser.find_element(By.TAG_NAME, "main").text, path
    browser.get(f"{servers['admin'].base}/task/{task_id}")
    assert "<script>" in browser.find_element(By.ID, "payload").text


def test_a_tenant_sees_only_the_stages_granted_to_it(
        roles: dict[str, str], servers: dict[str, Server], browser: Any, conn: psycopg.Connection) -> None:
    (mine,) = enqueue(conn, "web.tenant_mine", {"secret": "ours"})
    (theirs,) = enqueue(conn, "web.tenant_theirs", {"secret": "not yours"})
    conn.execute("SELECT queue.grant_stage('web.tenant_mine', %s::regrole)", (roles["tenant_group"],))
    conn.execute("SELECT queue.grant_stage('web.tenant_theirs', 'skiplock_admin')")
    browser.get(servers["tenant"].base + "/")
    stages = set(stages_shown(browser))
    assert "web.tenant_mine" in stages and "web.tenant_theirs" not in stages, stages
    browser.get(f"{servers['tenant'].base}/task/{theirs}")
    assert "not yours" not in browser.page_source and "No such task" in browser.page_source
    browser.get(f"{servers['tenant'].base}/stage/web.tenant_theirs")
    assert "not yours" not in browser.page_source and "No such stage" in browser.page_source
    browser.get(f"{servers['tenant'].base}/task/{mine}")
    assert "ours" in browser.find_element(By.ID, "payload").text
    browser.get(servers["admin"].base + "/")  # the admin sees both
    stages = set(stages_shown(browser))
    assert {"web.tenant_mine", "web.tenant_theirs"} <= stages


def test_keyset_paging_walks_every_task_once(servers: dict[str, Server], browser: Any, conn: psycopg.Connection) -> None:
    ids = set(enqueue(conn, "web.page", *({"n": i} for i in range(120))))
    seen: list[int] = []
    browser.get(servers["admin"].base + "/stage/web.page")
    while True:
        seen += [int(a.text) for a in browser.find_elements(By.CSS_SELECTOR, "tr.task td:nth-child(2) a")]
        more = browser.find_elements(By.ID, "next-page")
        if not more:
            break
        more[0].click()
    assert sorted(seen) == sorted(ids) and len(seen) == len(ids)


def test_a_non_local_listen_needs_a_password_and_the_password_is_checked(db: str, tmp_path: Any) -> None:
    with pytest.raises(SystemExit, match="refusing to listen on 0.0.0.0"):
        web.check_listen("0.0.0.0", None)
    web.check_listen("0.0.0.0", "s3cret")
    web.check_listen("127.0.0.1", None)
    web.check_listen("::1", None)
    import httpx
    server = Server(db, password="s3cret")
    try:
        assert httpx.get(server.base + "/", timeout=WAIT).status_code == 401
        assert httpx.get(server.base + "/", auth=("any", "wrong"), timeout=WAIT).status_code == 401
        assert httpx.get(server.base + "/", auth=("any", "s3cret"), timeout=WAIT).status_code == 200
        assert httpx.get(server.base + "/", headers={"Authorization": "Bearer s3cret"}, timeout=WAIT).status_code == 200
    finally:
        server.stop()
    # Without a password, only loopback names (or --allow-host ones) are answered: no DNS rebinding.
    server = Server(db)
    try:
        assert httpx.get(server.base + "/", timeout=WAIT).status_code == 200
        assert httpx.get(f"http://localhost:{server.port}/", timeout=WAIT).status_code == 200
        rebound = httpx.get(server.base + "/", headers={"Host": f"evil.example:{server.port}"}, timeout=WAIT)
        assert rebound.status_code == 421 and "Host" in rebound.text
    finally:
        server.stop()
    proc = subprocess.run([sys.executable, "-m", "skiplock", "--db", db, "web", "--listen", "0.0.0.0:1"],
                          capture_output=True, text=True, timeout=WAIT, env=ENV, cwd=ROOT)
    assert proc.returncode != 0 and "without --password-file" in proc.stderr + proc.stdout


def test_screenshots(db: str, servers: dict[str, Server], browser: Any, conn: psycopg.Connection) -> None:
    """`make screenshots`: the overview and a task page as PNG files (SKIPLOCK_SCREENSHOTS names the folder)."""
    folder = os.environ.get("SKIPLOCK_SCREENSHOTS")
    if not folder:
        pytest.skip("SKIPLOCK_SCREENSHOTS is not set (make screenshots sets it)")
    for stage, n in (("thumbnails", 40), ("ocr", 12), ("notify-email", 5)):
        enqueue(conn, stage, *({"document": f"doc-{i}.pdf", "page": i} for i in range(n)))
    conn.execute("SELECT queue.finish(t.id, t.lease) FROM queue.take_next('thumbnails', 25) t")
    conn.execute("SELECT queue.take_next('ocr', 3, worker => 'ocr-worker-1:4211')")
    for _ in range(2):
        fail(conn, "thumbnails", "PIL.UnidentifiedImageError: cannot identify image file 'doc-7.pdf'", fatal=False)
    fail(conn, "ocr", "TimeoutError: OCR service did not answer within 30 s")
    # A task through a pipeline: rendered, then its OCR fails and waits for a retry.
    (task_id,) = [r[0] for r in conn.execute(
        "SELECT queue.enqueue('{\"document\": \"invoice-2291.pdf\", \"pages\": 3}', stage => 'render', priority => -10)")]
    conn.execute("SELECT queue.finish(t.id, t.lease, next_stage => 'ocr') FROM queue.take_next('render', worker => 'render-2:811') t")
    conn.execute("SELECT queue.fail(t.id, t.lease, 'TimeoutError: OCR service did not answer within 30 s') "
                 "  FROM queue.take_next('ocr', worker => 'ocr-worker-1:4211') t")
    conn.execute("SELECT queue.enqueue('{}', stage => 'notify-email', run_at => now() + interval '1 hour') FROM generate_series(1, 3)")
    conn.execute("SELECT queue.configure_stage('notify-email', paused => true, max_running => 4)")
    conn.execute("SELECT queue.schedule('nightly-report', '0 3 * * *', 'reports')")
    # A day of finished runs for the chart (the dashboard reads them from queue.hourly).
    conn.execute("""
        INSERT INTO queue.history (id, stage, status, priority, run_at, payload, attempt, created, started, finished, error_text)
        SELECT 900000 + g, (ARRAY['thumbnails', 'ocr', 'render'])[1 + g % 3],
               CASE WHEN g % 23 = 0 THEN 'fatal' ELSE 'done' END::queue.task_status, 0, f, '{}', 1, f, f, f,
               CASE WHEN g % 23 = 0 THEN 'TimeoutError: OCR service did not answer within 30 s' END
          FROM generate_series(1, 4000) g,
               LATERAL (SELECT now() - interval '23 hours' * (g % 97 / 97.0) ^ 1.6 AS f) t""")
    browser.get(servers["admin"].base + "/")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#chart svg"), "the chart, loaded after the page")
    os.makedirs(folder, exist_ok=True)
    browser.save_screenshot(os.path.join(folder, "dashboard-overview.png"))
    browser.get(f"{servers['admin'].base}/task/{task_id}")
    browser.save_screenshot(os.path.join(folder, "dashboard-task.png"))


def test_sql_tasks_and_workers_pages(servers: dict[str, Server], browser: Any, conn: psycopg.Connection) -> None:
    conn.execute("SELECT queue.enqueue_sql('SELECT 41 + 1 AS answer', stage => 'web.sql')")
    browser.get(servers["monitor"].base + "/sql?stage=web.sql")
    assert "SELECT 41 + 1 AS answer" in browser.find_element(By.TAG_NAME, "main").text
    enqueue(conn, "web.busy", {"n": 1}, {"n": 2})
    conn.execute("SELECT count(*) FROM queue.take_next('web.busy', 2, worker => 'resizer-7:1234')")
    browser.get(servers["monitor"].base + "/workers")
    row = [r for r in browser.find_elements(By.CSS_SELECTOR, "main tr") if "resizer-7:1234" in r.text]
    assert row and "web.busy" in row[0].text and " 2 " in f" {row[0].text} ", [r.text for r in row]
