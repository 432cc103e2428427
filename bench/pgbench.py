"""Running pgbench with a custom script against a throwaway cluster, and reading its summary."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from skiplock import devdb

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@dataclass
class Summary:
    """What pgbench printed at the end of a run."""
    script: str
    clients: int
    transactions: int
    failed: int
    tps: float
    progress: list[dict] = field(default_factory=list)   # one row per --progress interval


def environment(cluster: devdb.Cluster, dbname: str) -> dict[str, str]:
    """libpq variables pointing pgbench at the cluster's unix socket."""
    env = dict(os.environ)
    env.update(PGHOST=str(cluster.directory), PGPORT=str(cluster.port), PGUSER="postgres", PGDATABASE=dbname)
    return env


def command(script: str, clients: int, seconds: float, variables: dict[str, str] | None = None,
            rate: float | None = None, progress: float | None = None) -> list[str]:
    threads = max(1, min(clients, os.cpu_count() or 1))
    cmd = [str(devdb.pg_bin() / "pgbench"), "--no-vacuum", "--protocol=prepared",
           f"--client={clients}", f"--jobs={threads}", f"--time={max(1, round(seconds))}",
           f"--file={SCRIPTS / script}"]
    if rate is not None:
        cmd.append(f"--rate={rate:.0f}")
    if progress is not None:
        cmd.append(f"--progress={max(1, round(progress))}")
    for name, value in (variables or {}).items():
        cmd.append(f"--define={name}={value}")
    return cmd


def start(cluster: devdb.Cluster, dbname: str, script: str, clients: int, seconds: float,
          variables: dict[str, str] | None = None, rate: float | None = None,
          progress: float | None = None) -> subprocess.Popen:
    """pgbench in the background (the workers of W3 and W4); read it with finish().
    rate: transactions a second for all clients together (--rate; latency then counts from the
    scheduled start, so it grows if the workers fall behind). progress: seconds between the
    progress lines that finish() returns in Summary.progress."""
    return subprocess.Popen(command(script, clients, seconds, variables, rate, progress), env=environment(cluster, dbname),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")


def finish(proc: subprocess.Popen, script: str, clients: int) -> Summary:
    try:
        out, err = proc.communicate()
    except BaseException:  # interrupted: do not leave pgbench running
        stop(proc)
        raise
    return parse(out + err, proc.returncode, script, clients)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        proc.wait()


def run(cluster: devdb.Cluster, dbname: str, script: str, clients: int, seconds: float,
        variables: dict[str, str] | None = None) -> Summary:
    """pgbench in the foreground for `seconds`."""
    return finish(start(cluster, dbname, script, clients, seconds, variables), script, clients)


def parse(output: str, returncode: int, script: str, clients: int) -> Summary:
    if returncode != 0 or "aborted" in output:
        lines = output.strip().splitlines()
        first_error = next((line for line in lines if "ERROR:" in line or "error:" in line), "")
        tail = "\n".join(lines[-15:])
        raise RuntimeError(f"pgbench {script}, {clients} clients, failed (exit {returncode}): {first_error}\n{tail}")
    transactions = int(_find(r"number of transactions actually processed: (\d+)", output))
    failed = re.search(r"number of failed transactions: (\d+)", output)
    tps = float(_find(r"tps = ([\d.]+) \(without initial connection time\)", output))
    return Summary(script, clients, transactions, int(failed.group(1)) if failed else 0, tps, parse_progress(output))


PROGRESS = re.compile(r"^progress: ([\d.]+) s, ([\d.]+) tps, lat ([\d.]+) ms stddev ([\d.]+|NaN)"
                      r"(?:, \d+ failed)?(?:, lag ([\d.]+) ms)?", re.MULTILINE)


def parse_progress(output: str) -> list[dict]:
    """pgbench's --progress lines: seconds, tps, mean latency and (with --rate) schedule lag."""
    return [{"t": float(m.group(1)), "tps": float(m.group(2)), "latency_ms": float(m.group(3)),
             "lag_ms": float(m.group(5)) if m.group(5) else None} for m in PROGRESS.finditer(output)]


def _find(pattern: str, text: str) -> str:
    m = re.search(pattern, text)
    if m is None:
        raise RuntimeError(f"pgbench output lacks /{pattern}/:\n{text}")
    return m.group(1)


def version() -> str:
    out = subprocess.run([str(devdb.pg_bin() / "pgbench"), "--version"], capture_output=True, text=True)
    return out.stdout.strip()
