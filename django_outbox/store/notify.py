"""Waking idle workers the moment a producing transaction commits: the sending side (``NOTIFY``).

On PostgreSQL a committed transaction that sent messages issues one ``NOTIFY`` (however many messages
it sent; none if it rolled back), and workers ``LISTEN`` on a dedicated connection (``worker.listener``).
``send()`` queues it inside the transaction, in the very statement that inserts the message
(``producing.insert(notify=...)``): PostgreSQL folds the identical notifications of one transaction into
one, delivers it at commit and drops it on rollback (of a savepoint too). That costs no round trip and no
second commit, where a ``NOTIFY`` issued after the commit costs both, and no bookkeeping of which
transaction already asked (see docs/performance.md). Elsewhere, or with ``OUTBOX["NOTIFY"] = False``,
workers poll, so a lost notification never delays delivery by more than the poll interval.

The operator actions call ``notify_on_commit()``; a worker that finished a keyed message other workers
wait for calls ``notify_now()``.
"""

from __future__ import annotations

import functools
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ..conf import get_settings


def notify_now(alias: str) -> None:
    """Wake idle workers now (autocommit), for a change that is already committed."""
    _notify(alias)


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
