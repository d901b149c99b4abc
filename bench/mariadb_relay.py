"""The MariaDB reference: the least a relay can do per batch there, on the twin table bench/mariadb.py makes.

    python bench/mariadb_relay.py DSN

MariaDB has no ``UPDATE ... RETURNING`` and refuses ``LIMIT`` in an ``UPDATE``'s ``IN`` subquery, so the claim
takes two statements: select up to 100 due pending rows in id order ``FOR UPDATE SKIP LOCKED``, lease them by
id, commit; then a no-op per row and one fenced acknowledgement. No validation, no per-key order, no records
of attempts. Prints ``ready``; idle, it polls every 5 ms; stops on SIGTERM.
"""

import os
import signal
import socket
import sys
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import tables

TABLE = "bench_minimal_message"
SOURCE = "django_outbox_message"
BATCH, LEASE_US = 100, 60_000_000
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


def handle(row: tuple[Any, ...]) -> None:
    """The no-op destination."""


def main(dsn: str) -> None:
    import MySQLdb

    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    me = f"{socket.gethostname()}:{os.getpid()}:mariadb-reference"
    with closing(tables.mysql(dsn)) as conn:
        cursor = conn.cursor()
        print("ready", flush=True)
        while not stopping.is_set():
            cursor.execute(CLAIM, [BATCH])
            rows = cursor.fetchall()
            if not rows:
                conn.commit()
                time.sleep(0.005)
                continue
            ids = [r[0] for r in rows]
            try:
                cursor.execute(LEASE.format(ids=", ".join(["%s"] * len(ids))), [me, LEASE_US, *ids])
            except MySQLdb.OperationalError as exc:
                if exc.args[0] != ER_LOCK_DEADLOCK:
                    raise
                conn.rollback()  # nothing was leased: claim again
                continue
            conn.commit()
            # Fenced on the attempt each row was claimed with; a fresh backlog has one value, so one UPDATE.
            by_attempt: dict[int, list[int]] = {}
            for row in rows:
                handle(row)
                by_attempt.setdefault(int(row[6]) + 1, []).append(int(row[0]))
            for attempt, group in by_attempt.items():
                cursor.execute(ACK.format(ids=", ".join(["%s"] * len(group))), [*group, me, attempt])
            conn.commit()


if __name__ == "__main__":
    main(sys.argv[1])
