"""The benchmark's databases and tables: made, filled fast by the server (no Python per row), emptied."""

import time
from contextlib import closing
from typing import Any
from urllib.parse import urlparse

import psycopg

MESSAGE = "django_outbox_message"
ATTEMPT = "django_outbox_attempt"
Conn = psycopg.Connection[tuple[object, ...]]


def fill_sql(
    vendor: str, n: int | str, *, table: str = MESSAGE, status: str = "pending", key: str = "NULL", spread: bool = False
) -> str:
    """``n`` rows as ``outbox.send()`` writes them (``delivered``: as a worker leaves them), made by the server
    (PostgreSQL's ``generate_series``, MariaDB's sequence engine). ``key``: an SQL expression of the row's
    number ``i``; ``spread`` (PostgreSQL): one row a second up to now, a busy outbox's history."""
    pg = vendor == "postgresql"
    now = f"now() - make_interval(secs => {n} - i)" if spread else "now()" if pg else "UTC_TIMESTAMP(6)"
    uuid, json, headers = (
        ("gen_random_uuid()", "jsonb_build_object", "'{}'::jsonb")
        if pg
        else ("REPLACE(UUID(), '-', '')", "JSON_OBJECT", "'{}'")
    )
    rows = f"generate_series(1, {n}) AS i" if pg else f"(SELECT seq AS i FROM seq_1_to_{n}) AS s"
    return (
        f"INSERT INTO {table} (uuid, topic, {'key' if pg else '`key`'}, payload, headers, idempotency_key, status,"
        " attempts, max_attempts, available_at, created_at, delivered_at, last_error)"
        f" SELECT {uuid}, 'bench.noop', {key}, {json}('order_id', i, 'item', 'book'), {headers}, NULL, '{status}',"
        f" {int(status == 'delivered')}, 5, {now}, {now}, {now if status == 'delivered' else 'NULL'}, '' FROM {rows}"
    )


PENDING = fill_sql("postgresql", "%(n)s")


def fill(vendor: str, n: int, *, chunk: int = 1_000_000, **options: Any) -> None:
    """:func:`fill_sql` on Django's default connection in chunks of ``chunk`` rows, then the table analyzed."""
    from django.db import connection

    with connection.cursor() as cursor:
        for start in range(0, n, chunk):
            cursor.execute(fill_sql(vendor, min(chunk, n - start), **options))
        cursor.execute(f"ANALYZE {'' if vendor == 'postgresql' else 'TABLE '}{MESSAGE}")


def mysql(dsn: str, *, database: bool = True, **options: Any) -> Any:
    """A mysqlclient connection to the server of ``dsn`` (and its database, unless ``database=False``), in
    utf8mb4 and ``READ COMMITTED`` (Django's default for the backend)."""
    import MySQLdb

    url = urlparse(dsn)
    options |= {"host": url.hostname or "127.0.0.1", "port": url.port or 3306, "user": url.username or "root"}
    if database:
        options["database"] = url.path.lstrip("/")
    conn = MySQLdb.connect(password=url.password or "", charset="utf8mb4", **options)
    conn.cursor().execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    return conn


def ensure_database(dsn: str, *, fresh: bool = False) -> None:
    """Create the database ``dsn`` names (PostgreSQL or MariaDB) if it is missing; ``fresh``: drop it first."""
    parsed = urlparse(dsn)
    name = parsed.path.lstrip("/")
    if parsed.scheme.startswith("mysql"):
        with closing(mysql(dsn, database=False, autocommit=True)) as server:
            if fresh:
                server.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
            charset = "CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
            server.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{name}` {charset}")
        return
    with psycopg.connect(parsed._replace(path="/postgres").geturl(), autocommit=True) as conn:
        if fresh:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def connect(dsn: str) -> Conn:
    return psycopg.connect(dsn, autocommit=True)


def truncate(conn: Conn) -> None:
    conn.execute(f"TRUNCATE {MESSAGE}, {ATTEMPT} RESTART IDENTITY CASCADE")
    conn.execute("TRUNCATE django_outbox_worker")


def fill_pending(
    conn: Conn, n: int, *, channel: str = "django_outbox", analyze: bool = False, table: str = MESSAGE
) -> float:
    """Commit ``n`` pending messages into ``table`` with one NOTIFY on ``channel``; the time after the commit.
    ``analyze`` in the same transaction, so that every relay starts with the backlog's statistics (without,
    the hand-written relay's claim sometimes scanned the whole table: 2x between runs)."""
    with conn.transaction():
        conn.execute(fill_sql("postgresql", "%(n)s", table=table), {"n": n})
        if analyze:
            conn.execute(f"ANALYZE {table}")
        conn.execute("SELECT pg_notify(%s, '')", [channel])
    return time.time()


def fill_history(conn: Conn, n: int) -> None:
    conn.execute(fill_sql("postgresql", "%(n)s", status="delivered", spread=True), {"n": n})


def vacuum(conn: Conn) -> None:
    conn.execute(f"VACUUM ANALYZE {MESSAGE}")
    conn.execute(f"VACUUM ANALYZE {ATTEMPT}")


def count(conn: Conn, status: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM {MESSAGE} WHERE status = %s", [status]).fetchone()
    return int(str(row[0])) if row else 0
