"""`skiplock web`: the dashboard, a Starlette app on uvicorn with Jinja templates.

Thin by design: each page is one or two reads of skiplock.ops on the views, each action one call
of a queue.* function in one short transaction, on a connection logged in as the login of --db
(so the database decides who may do what: a skiplock_monitor login gets 42501 for an action,
and the page says so). Connections run in autocommit and hold no snapshot between requests.

Safety: state changes are POST only and carry a CSRF token (an HMAC of a per-browser cookie with a
per-process secret); every page sends a Content-Security-Policy that allows only the app's own
script and styles; Jinja escapes everything it prints. The server binds to localhost unless an
authentication option is given (--password-file: HTTP Basic or Bearer with that secret).
The live parts (the overview's table) are refreshed by a dozen lines of script (static/app.js)
that fetch a fragment every few seconds while the page is visible.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import hmac
import ipaddress
import secrets
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from skiplock import ops
from skiplock.connect import timeout_args
from skiplock.errors import describe_error

# Starlette, Jinja and uvicorn (the extra skiplock[web]) are imported where the app is made, so
# that the CLI loads without them and says what to install.
if TYPE_CHECKING:
    from jinja2 import Environment
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

ASSETS = Path(__file__).parent / "web_assets"
CSRF_COOKIE = "skiplock_csrf"
REFRESH_MS = 2000
CHART_TTL = 300  # seconds a computed chart is served again: it reads a day of history
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


class Pool:
    """A few idle autocommit connections as the given login, reused; a broken or busy one is dropped."""

    def __init__(self, url: str, keep: int = 4) -> None:
        self.url, self.keep = url, keep
        self.idle: list[psycopg.Connection] = []
        self.lock = threading.Lock()

    def get(self) -> psycopg.Connection:
        with self.lock:
            if self.idle:
                return self.idle.pop()
        conn = psycopg.connect(self.url, autocommit=True, application_name="skiplock web", **timeout_args(self.url))
        # The pages' queries are short; the planner's cost of the views' stage lists would make
        # PostgreSQL compile some of them (JIT), which costs far more than it saves.
        conn.execute("SET jit = off")
        return conn

    def put(self, conn: psycopg.Connection) -> None:
        ok = not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        with self.lock:
            if ok and len(self.idle) < self.keep:
                self.idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self.lock:
            for conn in self.idle:
                conn.close()
            self.idle.clear()


# ---- formatting helpers for the templates ----

def _age(value: Any) -> str:
    if value is None or value == "":
        return ""
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else float(value)
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    if seconds < 86400:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    return f"{int(seconds // 86400)}d{int(seconds % 86400 // 3600):02d}h"


def _ts(value: dt.datetime | None) -> str:
    return value.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if value else ""


def chart(rows: list[dict[str, Any]], hours: int = 24, width: int = 720, height: int = 120) -> dict[str, Any]:
    """Bars per hour (done stacked under fatal) for an inline SVG: the template draws the rects."""
    now = dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0)
    slots = [now - dt.timedelta(hours=h) for h in range(hours - 1, -1, -1)]
    by_hour = {r["hour"].astimezone(dt.timezone.utc): r for r in rows}
    top = max([(r["done"] or 0) + (r["fatal"] or 0) + (r["cancelled"] or 0) for r in rows] + [1])
    bar_w = width / hours
    bars = []
    for i, hour in enumerate(slots):
        r = by_hour.get(hour, {})
        done, fatal, cancelled = r.get("done") or 0, r.get("fatal") or 0, r.get("cancelled") or 0
        h_done = (height - 14) * done / top
        h_fail = (height - 14) * (fatal + cancelled) / top
        bars.append({"x": round(i * bar_w + 1, 1), "w": round(bar_w - 2, 1),
                     "done_y": round(height - 14 - h_done, 1), "done_h": round(h_done, 1),
                     "fail_y": round(height - 14 - h_done - h_fail, 1), "fail_h": round(h_fail, 1),
                     "label": hour.strftime("%H:00"), "done": done, "fatal": fatal, "cancelled": cancelled})
    return {"bars": bars, "width": width, "height": height, "top": top}


def _env() -> Environment:
    from jinja2 import Environment, FileSystemLoader
    env = Environment(loader=FileSystemLoader(ASSETS / "templates"), autoescape=True)
    env.filters["age"] = _age
    env.filters["ts"] = _ts
    return env


def _local(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_listen(host: str, password: str | None) -> None:
    """Refuse to serve on anything but loopback without an authentication option."""
    if not _local(host) and not password:
        raise SystemExit(f"skiplock web: refusing to listen on {host} without --password-file: anyone who reaches "
                         "the port would act as the database login of --db. Give a password file, or listen on "
                         "127.0.0.1 behind a reverse proxy that authenticates.")


def _safe_next(value: str | None, default: str = "/") -> str:
    """A redirect target inside the app only (a path, never //host or a scheme)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return default
    return value


LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


def _host_name(header: str) -> str:
    """The name in a Host header, without its port (and without the brackets of an IPv6 address)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def create_app(url: str, password: str | None = None, refresh_ms: int = REFRESH_MS,
               allowed_hosts: tuple[str, ...] = ()) -> Starlette:
    """The app, as the login of url. Without a password it answers only requests whose Host is a
    loopback name or one of allowed_hosts: a page of another site that resolves its own name to
    127.0.0.1 (DNS rebinding) gets nothing."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.middleware import Middleware
    from starlette.middleware.base import BaseHTTPMiddleware
    from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    pool = Pool(url)
    env = _env()
    secret = secrets.token_bytes(32)

    def csrf_token(request: Request) -> str:
        cookie = request.cookies.get(CSRF_COOKIE) or request.state.new_cookie
        return hmac.new(secret, cookie.encode(), hashlib.sha256).hexdigest()

    def with_db(fn: Callable[[psycopg.Connection], Any]) -> Any:
        conn = pool.get()
        try:
            return fn(conn)
        finally:
            pool.put(conn)

    async def page(request: Request, template: str, fn: Callable[[psycopg.Connection], dict[str, Any]],
                   status: int = 200) -> Response:
        def read(conn: psycopg.Connection) -> dict[str, Any]:
            return {"who": ops.who(conn), **fn(conn)}
        try:
            context = await run_in_threadpool(with_db, read)
        except psycopg.Error as e:
            return error_page(request, e)
        context.update(request=request, csrf=csrf_token(request), refresh_ms=refresh_ms,
                       msg=request.query_params.get("msg", ""), path=request.url.path)
        return HTMLResponse(env.get_template(template).render(**context), status_code=status)

    def error_page(request: Request, e: BaseException) -> Response:
        status = 403 if isinstance(e, psycopg.errors.InsufficientPrivilege) else 400
        html = env.get_template("error.html").render(request=request, error=describe_error(e), status=status,
                                                     who=None, csrf="", path="")
        return HTMLResponse(html, status_code=status)

    chart_cache: dict[str, Any] = {"at": -CHART_TTL, "rows": []}
    chart_lock = threading.Lock()

    def cached_chart(c: psycopg.Connection) -> dict[str, Any]:
        """The hourly chart, read again only when older than CHART_TTL (one reader at a time): all
        requests run as the same login, so they all see the same chart."""
        with chart_lock:
            if time.monotonic() - chart_cache["at"] >= CHART_TTL:
                chart_cache["rows"] = ops.hourly(c, 24)
                chart_cache["at"] = time.monotonic()
            return chart(chart_cache["rows"])

    async def overview(request: Request) -> Response:
        return await page(request, "overview.html", lambda c: {"stages": ops.overview(c), "chart_ttl": CHART_TTL})

    async def chart_fragment(request: Request) -> Response:
        return await page(request, "_chart.html", lambda c: {"chart": cached_chart(c), "chart_ttl": CHART_TTL})

    async def overview_fragment(request: Request) -> Response:
        return await page(request, "_stages.html", lambda c: {"stages": ops.overview(c)})

    async def stage(request: Request) -> Response:
        name = request.path_params["stage"]
        q = request.query_params
        status = q.get("status", "live")
        if status not in ("live", *ops.LIVE, *ops.FINAL):
            status = "live"
        raw_id = q.get("id", "").strip()
        f = ops.Filters(status=status, key=q.get("key", ""), group=q.get("group", ""), error=q.get("error", ""),
                        id=int(raw_id) if raw_id.isdigit() else None, before=q.get("before", ""))

        def read(c: psycopg.Connection) -> dict[str, Any]:
            config = ops.stage_visible(c, name)
            rows, cursor = ops.tasks(c, name, f) if config else ([], "")  # a hidden stage: not even read
            return {"stage": name, "config": config, "rows": rows, "next_cursor": cursor,
                    "f": f, "statuses": ("live", *ops.LIVE, *ops.FINAL),
                    "query": {k: v for k, v in q.items() if k != "before"}}
        try:
            return await page(request, "stage.html", read)
        except ValueError:
            return PlainTextResponse("bad cursor", status_code=400)

    async def task(request: Request) -> Response:
        task_id = request.path_params["id"]
        return await page(request, "task.html", lambda c: {"id": task_id, "rows": ops.task(c, task_id),
                                                            "shown": ops.PAYLOAD_SHOWN})

    async def failures(request: Request) -> Response:
        stage_name = request.query_params.get("stage") or None
        return await page(request, "failures.html", lambda c: {"groups": ops.errors(c, stage_name), "stage": stage_name})

    async def schedules(request: Request) -> Response:
        return await page(request, "schedules.html", lambda c: {"rows": ops.schedules(c)})

    async def sql_tasks(request: Request) -> Response:
        stage_name = request.query_params.get("stage") or "sql"
        return await page(request, "sql.html", lambda c: {"rows": ops.sql_tasks(c, stage_name), "stage": stage_name})

    async def workers(request: Request) -> Response:
        return await page(request, "workers.html", lambda c: {"rows": ops.workers(c)})

    async def action(request: Request) -> Response:
        body = (await request.body()).decode("utf-8", "replace")
        form = urllib.parse.parse_qs(body, keep_blank_values=True)

        def field(name: str) -> str:
            return (form.get(name) or [""])[0]

        cookie = request.cookies.get(CSRF_COOKIE, "")
        expected = hmac.new(secret, cookie.encode(), hashlib.sha256).hexdigest()
        if not cookie or not hmac.compare_digest(field("csrf"), expected):
            return PlainTextResponse("refused: the form's CSRF token is missing or wrong (reload the page)",
                                     status_code=403)
        name = request.path_params["name"]
        stage_name = field("stage") or None
        try:
            ids = [int(v) for v in form.get("id", []) if v.strip()]
        except ValueError:
            return PlainTextResponse("bad id", status_code=400)

        def act(c: psycopg.Connection) -> str:
            if name == "retry":
                return f"retried {ops.retry(c, ids, stage_name)}"
            if name == "cancel":
                return f"cancelled {ops.cancel(c, ids, stage_name)}"
            if name == "priority":
                return f"priority set on {ops.set_priority(c, ids, int(field('priority')), stage_name)}"
            if name in ("pause", "resume") and stage_name:
                ops.pause(c, stage_name, name == "pause")
                return f"{name}d {stage_name}"
            if name == "retry-group" and stage_name:
                return f"retried {ops.retry_where(c, stage_name, error=field('error'), exact=True)}"
            if name == "run-now":
                return f"ran {field('name')}: {ops.run_schedule_now(c, field('name'))}"
            raise LookupError(name)
        try:
            msg = await run_in_threadpool(with_db, act)
        except psycopg.Error as e:
            return error_page(request, e)
        except (LookupError, ValueError):
            return PlainTextResponse("unknown action or bad argument", status_code=400)
        target = _safe_next(field("next"))
        sep = "&" if "?" in target else "?"
        return RedirectResponse(f"{target}{sep}msg={urllib.parse.quote(msg)}", status_code=303)

    async def refuse_get(request: Request) -> Response:
        return PlainTextResponse("actions are POST only", status_code=405)

    routes = [
        Route("/", overview),
        Route("/fragment/overview", overview_fragment),
        Route("/fragment/chart", chart_fragment),
        Route("/stage/{stage:path}", stage),
        Route("/task/{id:int}", task),
        Route("/failures", failures),
        Route("/schedules", schedules),
        Route("/sql", sql_tasks),
        Route("/workers", workers),
        Route("/action/{name}", action, methods=["POST"]),
        Route("/action/{name}", refuse_get, methods=["GET"]),
        Mount("/static", StaticFiles(directory=ASSETS / "static"), name="static"),
    ]
    hosts = {h.lower().strip("[]") for h in (*LOCAL_NAMES, *allowed_hosts)}

    async def guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if password is None and _host_name(request.headers.get("host", "")) not in hosts:
            return PlainTextResponse("refused: unexpected Host header (skiplock web --allow-host NAME, "
                                     "for a name a reverse proxy passes)", status_code=421)
        if password is not None and not _authorized(request.headers.get("authorization", ""), password):
            return PlainTextResponse("authentication required", status_code=401,
                                     headers={"WWW-Authenticate": 'Basic realm="skiplock", charset="UTF-8"'})
        request.state.new_cookie = "" if request.cookies.get(CSRF_COOKIE) else secrets.token_hex(16)
        response = await call_next(request)
        if request.state.new_cookie:
            response.set_cookie(CSRF_COOKIE, request.state.new_cookie, httponly=True, samesite="strict", path="/")
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers["Cache-Control"] = "no-store"
        return response

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        pool.close()

    return Starlette(routes=routes, middleware=[Middleware(BaseHTTPMiddleware, dispatch=guard)], lifespan=lifespan)


def _authorized(header: str, password: str) -> bool:
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        given = value.strip()
    elif scheme.lower() == "basic":
        try:
            given = base64.b64decode(value.strip()).decode("utf-8").partition(":")[2]
        except (ValueError, UnicodeDecodeError):
            return False
    else:
        return False
    return hmac.compare_digest(given.encode(), password.encode())


def serve(url: str, listen: str, password_file: str | None = None, allow_hosts: tuple[str, ...] = ()) -> int:
    import uvicorn
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"skiplock web: --listen wants HOST:PORT, not {listen!r}")
    password = None
    if password_file:
        password = Path(password_file).read_text().strip().splitlines()[0] if Path(password_file).read_text().strip() else ""
        if not password:
            raise SystemExit(f"skiplock web: {password_file} is empty")
    check_listen(host.strip("[]"), password)
    with psycopg.connect(url, autocommit=True, **timeout_args(url)) as conn:  # fail now, not on the first page
        conn.execute("SELECT 1 FROM queue.stage_config LIMIT 1")
    print(f"skiplock web: http://{host}:{port}/ (as the login of --db; Ctrl-C stops)", flush=True)
    uvicorn.run(create_app(url, password, allowed_hosts=(host, *allow_hosts)), host=host.strip("[]"), port=int(port), log_level="warning")
    return 0
