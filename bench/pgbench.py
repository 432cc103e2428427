"""Running pgbench with a custom script against a throwaway cluster, and reading its summary."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
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


def environment(cluster: devdb.Cluster, dbname: str) -> dict[str, str]:
    """libpq variables pointing pgbench at the cluster's unix socket."""
    env = dict(os.environ)
    env.update(PGHOST=str(cluster.directory), PGPORT=str(cluster.port), PGUSER="postgres", PGDATABASE=dbname)
    return env


def command(script: str, clients: int, seconds: float, variables: dict[str, str] | None = None,
            rate: float | None = None) -> list[str]:
    threads = max(1, min(clients, os.cpu_count() or 1))
    cmd = [str(devdb.pg_bin() / "pgbench"), "--no-vacuum", "--protocol=prepared",
           f"--client={clients}", f"--jobs={threads}", f"--time={max(1, round(seconds))}",
           f"--file={SCRIPTS / script}"]
    if rate is not None:
        cmd.append(f"--rate={rate:.0f}")
    for name, value in (variables or {}).items():
        cmd.append(f"--define={name}={value}")
    return cmd


def start(cluster: devdb.Cluster, dbname: str, script: str, clients: int, seconds: float,
          variables: dict[str, str] | None = None, rate: float | None = None) -> subprocess.Popen:
    """pgbench in the background (the workers of W3 and W4); read it with finish()."""
    return subprocess.Popen(command(script, clients, seconds, variables, rate), env=environment(cluster, dbname),
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
    return Summary(script, clients, transactions, int(failed.group(1)) if failed else 0, tps)


def _find(pattern: str, text: str) -> str:
    m = re.search(pattern, text)
    if m is None:
        raise RuntimeError(f"pgbench output lacks /{pattern}/:\n{text}")
    return m.group(1)


def version() -> str:
    out = subprocess.run([str(devdb.pg_bin() / "pgbench"), "--version"], capture_output=True, text=True)
    return out.stdout.strip()
