"""Filling and emptying the benchmark tables fast, with ``generate_series`` (no Python per row)."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlparse

import psycopg

MESSAGE = "django_outbox_message"
ATTEMPT = "django_outbox_attempt"

# Rows as outbox.send() writes them: pending, no key, a small JSON payload.
PENDING = f"""
INSERT INTO {MESSAGE} (uuid, topic, key, payload, headers, idempotency_key, status, attempts, max_attempts,
    available_at, created_at, last_error)
SELECT gen_random_uuid(), 'bench.noop', NULL, jsonb_build_object('order_id', i, 'item', 'book'), '{{}}'::jsonb,
    NULL, 'pending', 0, 5, now(), now(), ''
FROM generate_series(1, %(n)s) AS i
"""
# History: delivered messages, as a busy outbox that keeps them (no archiving) would hold.
HISTORY = f"""
INSERT INTO {MESSAGE} (uuid, topic, key, payload, headers, idempotency_key, status, attempts, max_attempts,
    available_at, created_at, delivered_at, last_error)
SELECT gen_random_uuid(), 'bench.noop', NULL, jsonb_build_object('order_id', i, 'item', 'book'), '{{}}'::jsonb,
    NULL, 'delivered', 1, 5, now() - make_interval(secs => %(n)s - i), now() - make_interval(secs => %(n)s - i),
    now() - make_interval(secs => %(n)s - i), ''
FROM generate_series(1, %(n)s) AS i
"""


def mysql(dsn: str, *, database: bool = True, **options: Any) -> Any:
    """A mysqlclient connection to the server of ``dsn`` (and its database, unless ``database=False``)."""
    import MySQLdb

    url = urlparse(dsn)
    if database:
        options["database"] = url.path.lstrip("/")
    return MySQLdb.connect(
        host=url.hostname or "127.0.0.1",
        port=url.port or 3306,
        user=url.username or "root",
        password=url.password or "",
        **options,
    )


def ensure_database(dsn: str, *, fresh: bool = False) -> None:
    """Create the database ``dsn`` names (PostgreSQL or MariaDB) if it is missing; ``fresh``: drop it first."""
    parsed = urlparse(dsn)
    name = parsed.path.lstrip("/")
    if parsed.scheme.startswith("mysql"):
        conn = mysql(dsn, database=False, autocommit=True)
        try:
            if fresh:
                conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
            conn.cursor().execute(
                f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
            )
        finally:
            conn.close()
        return
    with psycopg.connect(parsed._replace(path="/postgres").geturl(), autocommit=True) as conn:
        if fresh:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def connect(dsn: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(dsn, autocommit=True)


def truncate(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    conn.execute(f"TRUNCATE {MESSAGE}, {ATTEMPT} RESTART IDENTITY CASCADE")
    conn.execute("TRUNCATE django_outbox_worker")


def fill_pending(
    conn: psycopg.Connection[tuple[object, ...]], n: int, *, channel: str = "django_outbox", analyze: bool = False
) -> float:
    """Commit ``n`` pending messages in one transaction with one NOTIFY; returns the time after the commit.

    ``analyze``: the same transaction analyzes the table, so every relay starts with statistics of the
    backlog (without, the hand-written relay's claim sometimes scanned the whole table: 2x between runs).
    """
    with conn.transaction():
        conn.execute(PENDING, {"n": n})
        if analyze:
            conn.execute(f"ANALYZE {MESSAGE}")
        conn.execute("SELECT pg_notify(%s, '')", [channel])
    return time.time()


def fill_history(conn: psycopg.Connection[tuple[object, ...]], n: int) -> None:
    conn.execute(HISTORY, {"n": n})


def vacuum(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    conn.execute(f"VACUUM ANALYZE {MESSAGE}")
    conn.execute(f"VACUUM ANALYZE {ATTEMPT}")


def count(conn: psycopg.Connection[tuple[object, ...]], status: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM {MESSAGE} WHERE status = %s", [status]).fetchone()
    return int(str(row[0])) if row else 0
