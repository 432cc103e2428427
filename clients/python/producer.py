#!/usr/bin/env python3
"""Enqueue tasks with plain psycopg 3: one JSON payload per line of stdin, or per argument.

    DATABASE_URL=postgresql://... python producer.py '{"n": 1}' '{"n": 2}'
    seq 1000 | jq -c '{n: .}' | DATABASE_URL=... STAGE=resize python producer.py

All payloads go in one call to queue.enqueue_batch (one transaction, one NOTIFY), and the new
ids are printed, one a line. Use queue.enqueue(payload, stage, key => ...) for keyed tasks.
"""

from __future__ import annotations

import json
import os
import sys

import psycopg
from psycopg.types.json import Jsonb


def main(argv: list[str]) -> int:
    lines = argv or [line for line in sys.stdin if line.strip()]
    payloads = [Jsonb(json.loads(line)) for line in lines]
    # One statement: nothing is prepared. A producer that repeats statements through a transaction
    # pooler (PgBouncer pool_mode=transaction) connects with prepare_threshold=None.
    pooled = os.environ.get("SKIPLOCK_POOLER", "").strip().lower() == "transaction"
    # A server that accepts and never answers: give up after 10 s, not psycopg's 130 s (a
    # connect_timeout in the URL, or PGCONNECT_TIMEOUT, sets another bound).
    os.environ.setdefault("PGCONNECT_TIMEOUT", "10")
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True,
                         prepare_threshold=None if pooled else 5) as conn:
        rows = conn.execute("SELECT queue.enqueue_batch(payloads => %s::jsonb[], stage => %s)",
                            (payloads, os.environ.get("STAGE", "default"))).fetchall()
    for (task_id,) in rows:
        print(task_id)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (psycopg.Error, ValueError) as err:  # one line: the server's words, or the bad payload's
        sys.exit(f"producer: {str(err).strip()}")
