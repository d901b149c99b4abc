"""The minimal reference: a hand-written relay on a minimal twin of the message table.

    python bench/minimal_relay.py postgres://postgres@127.0.0.1:5432/bench_outbox [--batch 100]

``bench/baseline_relay.py`` runs on the outbox's own table, so it pays every cost the project's schema
imposes (its indexes, its wider updates) and hides them. This one runs on ``bench_minimal_message``:
the same columns as ``django_outbox_message`` (copied from it with ``LIKE``, so it follows the project's
schema), a primary key and one partial index on the ids of pending rows, nothing else. It is the
physical limit of "claim a batch, deliver, acknowledge" on PostgreSQL for a hand-written relay.

Each round: claim up to ``--batch`` pending rows with ``FOR UPDATE SKIP LOCKED`` and a lease in one
``UPDATE ... RETURNING``, committed at once; a no-op per row; one fenced acknowledgement (delivered where
``locked_by`` is this relay and ``attempts`` is the number it claimed). Prints ``ready`` once connected;
idle, it polls every 5 ms, as the same-table relay does (with ``--listen``, it waits for a NOTIFY instead:
the latency figure's reference). Stops on SIGTERM.

The harness (``bench/figures.py``) creates the table with :data:`CREATE` and fills it with :data:`FILL`.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import time
from typing import Any

import psycopg

TABLE = "bench_minimal_message"
SOURCE = "django_outbox_message"
#: The twin: the project's columns, defaults and identity, none of its indexes or constraints but NOT NULL.
CREATE = [
    f"DROP TABLE IF EXISTS {TABLE}",
    f"CREATE TABLE {TABLE} (LIKE {SOURCE} INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING GENERATED)",
    f"ALTER TABLE {TABLE} ADD PRIMARY KEY (id)",
    f"CREATE INDEX {TABLE}_pending ON {TABLE} (id) WHERE status = 'pending'",
]
COLUMNS = (
    "uuid, topic, key, payload, headers, idempotency_key, status, attempts, max_attempts, available_at,"
    " created_at, last_error"
)
#: ``n`` pending rows as ``outbox.send()`` writes them (the same values as ``bench.tables.PENDING``).
FILL = f"""
INSERT INTO {TABLE} ({COLUMNS})
SELECT gen_random_uuid(), 'bench.noop', NULL, jsonb_build_object('order_id', i, 'item', 'book'), '{{}}'::jsonb,
    NULL, 'pending', 0, 5, now(), now(), ''
FROM generate_series(1, %(n)s) AS i
"""
#: The send() floor: one hand-written row, one statement.
INSERT_ONE = f"""
INSERT INTO {TABLE} ({COLUMNS})
VALUES (gen_random_uuid(), 'bench.noop', NULL, %s::jsonb, '{{}}', NULL, 'pending', 0, 5, now(), now(), '')
"""
#: The bulk floor: ``n`` hand-written rows from one array of payloads, one statement.
INSERT_MANY = f"""
INSERT INTO {TABLE} ({COLUMNS})
SELECT gen_random_uuid(), 'bench.noop', NULL, p, '{{}}', NULL, 'pending', 0, 5, now(), now(), ''
FROM unnest(%s::jsonb[]) AS p
"""
CLAIM = f"""
UPDATE {TABLE} AS m SET status = 'processing', locked_by = %(me)s,
    locked_until = now() + make_interval(secs => %(lease)s), attempts = m.attempts + 1
FROM (
    SELECT id FROM {TABLE} WHERE status = 'pending' AND available_at <= now()
    ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
) AS picked
WHERE m.id = picked.id
RETURNING m.id, m.uuid, m.topic, m.key, m.payload, m.headers, m.attempts
"""
ACK = f"""
UPDATE {TABLE} AS m SET status = 'delivered', delivered_at = now(), locked_by = NULL, locked_until = NULL
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS a(id, n)
WHERE m.id = a.id AND m.locked_by = %(me)s AND m.attempts = a.n
"""
BUSY = f"SELECT EXISTS (SELECT 1 FROM {TABLE} WHERE status IN ('pending', 'processing'))"


def handle(row: tuple[Any, ...]) -> None:
    """The no-op destination."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--lease", type=float, default=60.0)
    parser.add_argument("--listen", metavar="CHANNEL", help="idle, wait for a NOTIFY on CHANNEL (1 s at most)")
    parser.add_argument("--udp-port", type=int, help="report 'm<id> <time>' per row over UDP (latency figure)")
    args = parser.parse_args()
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    me = f"{socket.gethostname()}:{os.getpid()}:minimal"
    params = {"limit": args.batch, "me": me, "lease": args.lease}
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM) if args.udp_port else None
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        if args.listen:
            conn.execute(f'LISTEN "{args.listen}"')
        print("ready", flush=True)
        while not stopping:
            rows = conn.execute(CLAIM, params).fetchall()
            if not rows:
                if args.listen:
                    for _ in conn.notifies(timeout=1.0, stop_after=1):
                        pass
                else:
                    time.sleep(0.005)
                continue
            for row in rows:
                if udp is not None:
                    udp.sendto(f"m{row[0]} {time.time()!r}".encode(), ("127.0.0.1", args.udp_port))
                handle(row)
            conn.execute(ACK, {"ids": [r[0] for r in rows], "attempts": [r[6] for r in rows], "me": me})


if __name__ == "__main__":
    main()
