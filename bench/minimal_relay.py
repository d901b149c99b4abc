"""The minimal reference: a hand-written relay on a minimal twin of the message table.

    python bench/minimal_relay.py DSN [--listen CHANNEL --udp-port PORT]

The twin, ``bench_minimal_message``, has the columns of ``django_outbox_message`` (copied with ``LIKE``, so
it follows the project's schema), a primary key and one partial index on the ids of pending rows: the
physical limit of "claim a batch, deliver, acknowledge" on PostgreSQL for a hand-written relay
(bench/baseline_relay.py runs the same loop on the project's own table). Each round claims up to 100
pending rows with ``FOR UPDATE SKIP LOCKED`` and a lease in one ``UPDATE ... RETURNING``, committed at
once, calls a no-op per row, and acknowledges them in one statement fenced by ``locked_by`` and the
attempt it claimed. Prints ``ready`` once connected; idle, it polls every 5 ms, or with ``--listen`` waits
for a NOTIFY (the latency figure's reference, reporting ``m<id> <time>`` per row to ``--udp-port``).
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from typing import Any

import psycopg

TABLE = "bench_minimal_message"
#: The twin: the project's columns, defaults and identity, none of its indexes or constraints but NOT NULL.
CREATE = [
    f"DROP TABLE IF EXISTS {TABLE}",
    f"CREATE TABLE {TABLE} (LIKE django_outbox_message INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING GENERATED)",
    f"ALTER TABLE {TABLE} ADD PRIMARY KEY (id)",
    f"CREATE INDEX {TABLE}_pending ON {TABLE} (id) WHERE status = 'pending'",
]
COLUMNS = (
    "uuid, topic, key, payload, headers, idempotency_key, status, attempts, max_attempts, available_at,"
    " created_at, last_error"
)
#: ``n`` pending rows as ``outbox.send()`` writes them (the values of ``bench.tables.PENDING``).
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
#: The bulk floor: a row per payload of one array, one statement.
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


def handle(row: tuple[Any, ...]) -> None:
    """The no-op destination."""


def main(claim: str = CLAIM, ack: str = ACK, name: str = "minimal") -> None:
    """Relay with ``claim`` and ``ack`` until SIGTERM ends the process."""
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--listen", metavar="CHANNEL", help="idle, wait for a NOTIFY on CHANNEL (1 s at most)")
    parser.add_argument("--udp-port", type=int, help="report 'm<id> <time>' per row over UDP")
    args = parser.parse_args()
    me = f"{socket.gethostname()}:{os.getpid()}:{name}"
    params = {"limit": 100, "me": me, "lease": 60.0}
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        if args.listen:
            conn.execute(f'LISTEN "{args.listen}"')
        print("ready", flush=True)
        while True:
            rows = conn.execute(claim, params).fetchall()
            if not rows:
                if args.listen:
                    for _ in conn.notifies(timeout=1.0, stop_after=1):
                        pass
                else:
                    time.sleep(0.005)
                continue
            for row in rows:
                if args.udp_port:
                    udp.sendto(f"m{row[0]} {time.time()!r}".encode(), ("127.0.0.1", args.udp_port))
                handle(row)
            conn.execute(ack, {"ids": [r[0] for r in rows], "attempts": [r[6] for r in rows], "me": me})


if __name__ == "__main__":
    main()
