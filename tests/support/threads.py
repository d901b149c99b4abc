"""Work on a connection of its own: a second producer, a racing housekeeper, a holder of a lock."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection, connections


def in_thread(target: Callable[[], Any], errors: list[BaseException] | None = None) -> threading.Thread:
    """Start ``target`` in a daemon thread, which opens Django connections of its own and closes them when
    it ends. With ``errors``, what it raises is kept there for the test to report (a thread's exception
    would otherwise only be printed); without, it is raised in the thread."""

    def run() -> None:
        try:
            target()
        except BaseException as exc:
            if errors is None:
                raise
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def key_lock_waiters() -> int:
    """Sessions of the test database now waiting for a key's lock: a producer queued behind another.

    PostgreSQL: ungranted locks in this database. MariaDB/MySQL: statements of other sessions inserting
    into the key-lock table (``innodb_lock_waits`` and ``innodb_trx`` miss a wait on a lock the holder
    has only implicitly).
    """
    from django_outbox.store.mysql import KEY_LOCK

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE NOT granted"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
        else:
            cursor.execute(
                "SELECT count(*) FROM information_schema.processlist WHERE id <> CONNECTION_ID()"
                " AND db = DATABASE() AND info LIKE %s",
                [f"INSERT INTO {KEY_LOCK}%"],
            )
        return int(cursor.fetchone()[0])
