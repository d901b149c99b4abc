"""The MariaDB reference: a hand-written relay with the two-statement claim, on a minimal twin table.

    python bench/mariadb_relay.py mysql://root@127.0.0.1:3306/bench_outbox_mariadb [--batch 100]

MariaDB has no ``UPDATE ... RETURNING`` and refuses ``LIMIT`` in an ``UPDATE``'s ``IN`` subquery, so the
least a relay there can do per batch is what this one does: in one transaction, select up to ``--batch``
due pending rows in id order with ``FOR UPDATE SKIP LOCKED``, lease them with one ``UPDATE`` by id, commit;
a no-op per row; one fenced acknowledgement (delivered where ``locked_by`` is this relay and ``attempts``
is the number it claimed), committed. No validation, no per-key order, no records of attempts.

It runs on ``bench_minimal_message``, the twin of the project's table that ``bench/mariadb.py`` creates.
Prints ``ready`` once connected; idle, it polls every 5 ms. Stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import tables

TABLE = "bench_minimal_message"
SOURCE = "django_outbox_message"
#: InnoDB's "Deadlock found when trying to get lock": the transaction was rolled back whole.
ER_LOCK_DEADLOCK = 1213
CLAIM = (
    f"SELECT id, uuid, topic, `key`, payload, headers, attempts FROM {TABLE}"
    " WHERE status = 'pending' AND available_at <= UTC_TIMESTAMP(6) ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED"
)
LEASE = (
    f"UPDATE {TABLE} SET status = 'processing', locked_by = %s,"
    " locked_until = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND, attempts = attempts + 1 WHERE id IN ({ids})"
)
ACK = (
    f"UPDATE {TABLE} SET status = 'delivered', delivered_at = UTC_TIMESTAMP(6), locked_by = NULL,"
    " locked_until = NULL WHERE id IN ({ids}) AND locked_by = %s AND attempts = %s"
)


def connect(dsn: str, *, autocommit: bool = False) -> Any:
    """A mysqlclient connection in utf8mb4 and ``READ COMMITTED`` (Django's default for the backend)."""
    conn = tables.mysql(dsn, charset="utf8mb4", autocommit=autocommit)
    conn.cursor().execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    return conn


def handle(row: tuple[Any, ...]) -> None:
    """The no-op destination."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--lease", type=float, default=60.0)
    args = parser.parse_args()
    import MySQLdb

    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    me = f"{socket.gethostname()}:{os.getpid()}:mariadb-reference"
    lease = round(args.lease * 1_000_000)
    conn = connect(args.dsn)
    cursor = conn.cursor()
    print("ready", flush=True)
    try:
        while not stopping.is_set():
            cursor.execute(CLAIM, [args.batch])
            rows = cursor.fetchall()
            if not rows:
                conn.commit()
                time.sleep(0.005)
                continue
            ids = [r[0] for r in rows]
            marks = ", ".join(["%s"] * len(ids))
            try:
                cursor.execute(LEASE.format(ids=marks), [me, lease, *ids])
            except MySQLdb.OperationalError as exc:
                if exc.args[0] != ER_LOCK_DEADLOCK:
                    raise
                # InnoDB rolled the claim back whole: nothing was leased, claim again (seen on the
                # project's table, whose status-led indexes the lease rewrites, at two relays).
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
                cursor.execute(ACK.format(ids=marks), [*group, me, attempt])
            conn.commit()
    finally:
        conn.close()


if __name__ == "__main__":
    main()
