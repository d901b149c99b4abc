"""The MariaDB reference: a hand-written relay with the two-statement claim, on a minimal twin table.

    python bench/mariadb_relay.py mysql://root@127.0.0.1:3306/bench_outbox_mariadb [--batch 100]

MariaDB has no ``UPDATE ... RETURNING`` and refuses ``LIMIT`` in an ``UPDATE``'s ``IN`` subquery, so the
least a relay there can do per batch is what this one does: in one transaction, select up to ``--batch``
due pending rows in id order with ``FOR UPDATE SKIP LOCKED``, lease them with one ``UPDATE`` by id, commit;
a no-op per row; one fenced acknowledgement (delivered where ``locked_by`` is this relay and ``attempts``
is the number it claimed), committed. No validation, no per-key order, no records of attempts.

It runs on ``bench_minimal_message``, a twin of the message table: the project's columns (copied with
``CREATE TABLE ... LIKE``), its primary key and one index on ``(status, id)``, which backs the claim's
``ORDER BY`` (without one, InnoDB locks what it scans and a second relay gets nothing). Prints ``ready``
once connected; idle, it polls every 5 ms. Stops on SIGTERM.

The harness (``bench/mariadb.py``) creates the twin with :func:`create_twin` and fills it with :data:`FILL`.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import tables

TABLE = "bench_minimal_message"
#: InnoDB's "Deadlock found when trying to get lock": the transaction was rolled back whole.
ER_LOCK_DEADLOCK = 1213
SOURCE = "django_outbox_message"
COLUMNS = (
    "uuid, topic, `key`, payload, headers, idempotency_key, status, attempts, max_attempts, available_at,"
    " created_at, last_error"
)
#: ``n`` pending rows as ``outbox.send()`` writes them, from MariaDB's sequence engine (no Python per row).
FILL = (
    "INSERT INTO {table} (" + COLUMNS + ") SELECT REPLACE(UUID(), '-', ''), 'bench.noop', NULL,"
    " JSON_OBJECT('order_id', seq, 'item', 'book'), '{{}}', NULL, 'pending', 0, 5, UTC_TIMESTAMP(6),"
    " UTC_TIMESTAMP(6), '' FROM seq_1_to_{n}"
)
CLAIM = (
    "SELECT id, uuid, topic, `key`, payload, headers, attempts FROM {table}"
    " WHERE status = 'pending' AND available_at <= UTC_TIMESTAMP(6) ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED"
)
LEASE = (
    "UPDATE {table} SET status = 'processing', locked_by = %s,"
    " locked_until = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND, attempts = attempts + 1 WHERE id IN ({ids})"
)
ACK = (
    "UPDATE {table} SET status = 'delivered', delivered_at = UTC_TIMESTAMP(6), locked_by = NULL,"
    " locked_until = NULL WHERE id IN ({ids}) AND locked_by = %s AND attempts = %s"
)


def connect(dsn: str, *, autocommit: bool = False) -> Any:
    """A mysqlclient connection in utf8mb4 and ``READ COMMITTED`` (Django's default for the backend)."""
    conn = tables.mysql(dsn, charset="utf8mb4", autocommit=autocommit)
    conn.cursor().execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    return conn


def create_twin(conn: Any) -> None:
    """The twin: the project's columns as they are now, the primary key and the claim's index only."""
    cursor = conn.cursor()
    cursor.execute(f"DROP TABLE IF EXISTS {TABLE}")
    cursor.execute(f"CREATE TABLE {TABLE} LIKE {SOURCE}")
    cursor.execute(
        "SELECT DISTINCT index_name FROM information_schema.statistics"
        " WHERE table_schema = DATABASE() AND table_name = %s AND index_name <> 'PRIMARY'",
        [TABLE],
    )
    for (name,) in cursor.fetchall():
        cursor.execute(f"ALTER TABLE {TABLE} DROP INDEX `{name}`")
    cursor.execute(f"CREATE INDEX {TABLE}_status_id ON {TABLE} (status, id)")


def handle(row: tuple[Any, ...]) -> None:
    """The no-op destination."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--lease", type=float, default=60.0)
    args = parser.parse_args()
    import MySQLdb

    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    me = f"{socket.gethostname()}:{os.getpid()}:mariadb-reference"
    lease = round(args.lease * 1_000_000)
    claim = CLAIM.format(table=TABLE)
    conn = connect(args.dsn)
    cursor = conn.cursor()
    print("ready", flush=True)
    try:
        while not stopping:
            cursor.execute(claim, [args.batch])
            rows = cursor.fetchall()
            if not rows:
                conn.commit()
                time.sleep(0.005)
                continue
            ids = [r[0] for r in rows]
            marks = ", ".join(["%s"] * len(ids))
            try:
                cursor.execute(LEASE.format(table=TABLE, ids=marks), [me, lease, *ids])
            except MySQLdb.OperationalError as exc:
                if exc.args[0] != ER_LOCK_DEADLOCK:
                    raise
                # InnoDB rolled the claim back whole: nothing was leased, claim again.
                conn.rollback()
                continue
            conn.commit()
            for row in rows:
                handle(row)
            # Fenced on the attempt each row was claimed with; a fresh backlog has one value, so one UPDATE.
            by_attempt: dict[int, list[int]] = {}
            for row in rows:
                by_attempt.setdefault(int(row[6]) + 1, []).append(int(row[0]))
            for attempt, group in by_attempt.items():
                marks = ", ".join(["%s"] * len(group))
                cursor.execute(ACK.format(table=TABLE, ids=marks), [*group, me, attempt])
            conn.commit()
    finally:
        conn.close()


if __name__ == "__main__":
    main()
