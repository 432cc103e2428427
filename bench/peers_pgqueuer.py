"""PgQueuer through its own library, for bench.peers_libs: run by .peers/venv's interpreter (PgQueuer
and its dependencies stay out of skiplock's venv), never imported by skiplock's.

    .peers/venv/bin/python bench/peers_pgqueuer.py preload N    # N no-op jobs through Queries.enqueue
    .peers/venv/bin/python bench/peers_pgqueuer.py worker       # one QueueManager, entrypoint "noop"

The connection comes from libpq's environment (PGHOST, PGPORT, PGUSER, PGDATABASE). The worker is
the QueueManager its documentation shows: one psycopg async connection (autocommit, as its
PsycopgDriver requires; asyncpg is not installed), an entrypoint "noop" whose handler returns at
once, `run()` with its defaults (batch_size 10, dequeue_timeout 30 s); SIGTERM sets its shutdown
event, and the run returns after flushing the completions it buffered.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import psycopg
from pgqueuer import PsycopgDriver, Queries, QueueManager
from pgqueuer.models import Job

ENTRYPOINT = "noop"
PAYLOAD = b'{"doc": 42}'     # what bench.peers preloads for the others
CHUNK = 10_000


async def preload(n: int) -> None:
    """n jobs through its public enqueue (lists: one statement a chunk)."""
    async with await psycopg.AsyncConnection.connect(autocommit=True) as conn:
        queries = Queries(PsycopgDriver(conn))
        for start in range(0, n, CHUNK):
            k = min(CHUNK, n - start)
            await queries.enqueue([ENTRYPOINT] * k, [PAYLOAD] * k, [0] * k)


async def worker() -> None:
    async with await psycopg.AsyncConnection.connect(autocommit=True) as conn:
        qm = QueueManager(Queries(PsycopgDriver(conn)))

        @qm.entrypoint(ENTRYPOINT)
        async def noop(job: Job) -> None:
            return None

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, qm.shutdown.set)
        loop.add_signal_handler(signal.SIGINT, qm.shutdown.set)
        print("ready", flush=True)
        await qm.run()


def main(argv: list[str]) -> int:
    if argv[:1] == ["preload"] and len(argv) == 2:
        asyncio.run(preload(int(argv[1])))
    elif argv == ["worker"]:
        asyncio.run(worker())
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
