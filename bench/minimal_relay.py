"""The hand-written references of the drain and latency figures (docs/performance.md, "The references").

    python bench/minimal_relay.py DSN [--same-table] [--listen CHANNEL --udp-port PORT]

It relays a twin of the message table with a primary key and one partial index on pending ids, the physical
limit of "claim, deliver, acknowledge" on PostgreSQL, or (``--same-table``) the project's table, paying every
cost its schema imposes (the statements differ only in form: a materialized CTE, a fence on the status).
Prints ``ready``; idle, it polls every 5 ms or waits for a NOTIFY (``--listen``: the latency figure's
reference, reporting ``m<id> <time>`` per row to ``--udp-port``).
"""

import argparse
import os
import socket
import time

import psycopg

TABLE = "bench_minimal_message"
#: The twin: the project's columns, defaults and identity, none of its indexes or constraints but NOT NULL.
CREATE = [
    f"DROP TABLE IF EXISTS {TABLE}",
    f"CREATE TABLE {TABLE} (LIKE django_outbox_message INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING GENERATED)",
    f"ALTER TABLE {TABLE} ADD PRIMARY KEY (id)",
    f"CREATE INDEX {TABLE}_pending ON {TABLE} (id) WHERE status = 'pending'",
]


def insert(source: str = "", payload: str = "%s::jsonb", table: str = TABLE) -> str:
    """An ``INSERT`` of pending rows as ``outbox.send()`` writes them: ``payload`` per row of ``source`` (none: one)."""
    return (
        f"INSERT INTO {table} (uuid, topic, key, payload, headers, idempotency_key, status, attempts, max_attempts,"
        f" available_at, created_at, last_error) SELECT gen_random_uuid(), 'bench.noop', NULL, {payload},"
        f" '{{}}'::jsonb, NULL, 'pending', 0, 5, now(), now(), '' {source}"
    )


#: The send() floor: one hand-written row, one statement.
INSERT_ONE = insert()
#: The bulk floor: a row per payload of one array, one statement.
INSERT_MANY = insert("FROM unnest(%s::jsonb[]) AS p", "p")
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
SAME_TABLE_CLAIM = """
WITH picked AS MATERIALIZED (
    SELECT id FROM django_outbox_message WHERE status = 'pending' AND available_at <= now()
    ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
UPDATE django_outbox_message AS m SET status = 'processing', locked_by = %(me)s,
    locked_until = now() + make_interval(secs => %(lease)s), attempts = m.attempts + 1
FROM picked WHERE m.id = picked.id
RETURNING m.id, m.uuid, m.topic, m.key, m.payload, m.headers, m.attempts
"""
SAME_TABLE_ACK = """
UPDATE django_outbox_message SET status = 'delivered', delivered_at = now(), locked_by = NULL, locked_until = NULL
WHERE id = ANY(%(ids)s) AND locked_by = %(me)s AND status = 'processing'
"""


def handle(row: tuple[object, ...]) -> None:
    """The no-op destination."""


def main() -> None:
    """Relay until SIGTERM ends the process."""
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--same-table", action="store_true", help="relay the project's own table")
    parser.add_argument("--listen", metavar="CHANNEL", help="idle, wait for a NOTIFY on CHANNEL (1 s at most)")
    parser.add_argument("--udp-port", type=int, help="report 'm<id> <time>' per row over UDP")
    args = parser.parse_args()
    claim, ack = (SAME_TABLE_CLAIM, SAME_TABLE_ACK) if args.same_table else (CLAIM, ACK)
    me = f"{socket.gethostname()}:{os.getpid()}:{'baseline' if args.same_table else 'minimal'}"
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
