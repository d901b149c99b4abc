"""The reference: a minimal hand-written relay on psycopg, on the very table the outbox uses.

    python bench/baseline_relay.py postgres://postgres@127.0.0.1:5432/bench_outbox [--batch 100]

Each round: claim up to ``--batch`` due rows with ``FOR UPDATE SKIP LOCKED`` and a lease (one statement,
committed at once), call a no-op for each, then acknowledge the batch in one statement fenced by
``locked_by``. No attempt log, no retries, no reaper: what a careful engineer writes by hand in an
afternoon, and the speed the outbox is measured against. Prints ``ready`` once connected; idle, it
polls every 5 ms. Stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import time
from typing import Any

import psycopg

TABLE = "django_outbox_message"
CLAIM = f"""
WITH picked AS MATERIALIZED (
    SELECT id FROM {TABLE} WHERE status = 'pending' AND available_at <= now()
    ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
UPDATE {TABLE} AS m SET status = 'processing', locked_by = %(me)s,
    locked_until = now() + make_interval(secs => %(lease)s), attempts = m.attempts + 1
FROM picked WHERE m.id = picked.id
RETURNING m.id, m.uuid, m.topic, m.key, m.payload, m.headers, m.attempts
"""
ACK = f"""
UPDATE {TABLE} SET status = 'delivered', delivered_at = now(), locked_by = NULL, locked_until = NULL
WHERE id = ANY(%(ids)s) AND locked_by = %(me)s AND status = 'processing'
"""


def handle(row: tuple[Any, ...]) -> None:
    """The no-op destination."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--lease", type=float, default=60.0)
    args = parser.parse_args()
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    me = f"{socket.gethostname()}:{os.getpid()}:baseline"
    params = {"limit": args.batch, "me": me, "lease": args.lease}
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        print("ready", flush=True)
        while not stopping:
            rows = conn.execute(CLAIM, params).fetchall()
            if not rows:
                time.sleep(0.005)
                continue
            for row in rows:
                handle(row)
            conn.execute(ACK, {"ids": [r[0] for r in rows], "me": me})


if __name__ == "__main__":
    main()
