"""Waking idle workers the moment a producing transaction commits.

On PostgreSQL a committed transaction that sent messages issues one ``NOTIFY`` (however many messages
it sent; none if it rolled back), and workers ``LISTEN`` on a dedicated connection. ``send()`` queues it
inside the transaction, in the very statement that inserts the message: PostgreSQL folds the identical
notifications of one transaction into one, delivers it at commit and drops it on rollback (of a
savepoint too). That costs no round trip and no second commit, where a ``NOTIFY`` issued after the
commit costs both, and no bookkeeping of which transaction already asked (see docs/performance.md).
Elsewhere, or with ``OUTBOX["NOTIFY"] = False`` (PgBouncer in transaction pooling cannot LISTEN),
workers poll, so a lost notification never delays delivery by more than the poll interval.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from .conf import get_settings

logger = logging.getLogger("django_outbox.wakeup")


def _notify(alias: str) -> None:
    settings = get_settings()
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [settings.NOTIFY_CHANNEL])


def _already_notified(conn: BaseDatabaseWrapper) -> bool:
    # Django drops the entries of a rolled-back savepoint, as PostgreSQL drops the NOTIFY queued in it.
    return any(getattr(entry[1], "outbox_wake", False) for entry in conn.run_on_commit)


def notify_on_commit(alias: str) -> None:
    """Arrange one wake-up for when the current transaction commits (now, in autocommit)."""
    conn = connections[alias]
    if conn.vendor != "postgresql" or not get_settings().NOTIFY:
        return
    if conn.in_atomic_block and _already_notified(conn):
        return  # this transaction already asked; PostgreSQL would fold a second one anyway
    callback: Any = functools.partial(_notify, alias)
    callback.outbox_wake = True
    transaction.on_commit(callback, using=alias, robust=True)


class Listener(threading.Thread):
    """LISTENs on its own autocommit connection and calls ``wake()`` on every notification.

    A dropped connection (database restart, network cut) is re-opened with capped backoff; after each
    reconnect ``wake()`` is called once, since notifications sent while we were away are lost.
    """

    def __init__(self, alias: str, wake: Callable[[], None], stopping: Callable[[], bool]) -> None:
        super().__init__(name="outbox-listener", daemon=True)
        self.alias = alias
        self.wake = wake
        self.stopping = stopping
        self.connected = threading.Event()

    def run(self) -> None:
        import psycopg

        channel = get_settings().NOTIFY_CHANNEL
        delay = 0.1
        while not self.stopping():
            try:
                params = connections[self.alias].get_connection_params()
                params.pop("cursor_factory", None)
                params.pop("context", None)
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
                    self.connected.set()
                    self.wake()
                    delay = 0.1
                    while not self.stopping():
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            self.wake()
            except Exception as exc:  # any failure means: reconnect, and poll meanwhile
                self.connected.clear()
                if self.stopping():
                    return
                logger.warning("outbox listener lost its connection (%s); reconnecting in %.1fs", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
