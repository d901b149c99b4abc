"""``OUTBOX["EAGER"] = True``, for tests: what a transaction sent is delivered right after it commits.

In the sending process and thread, through the worker's own code (``Relay.drain()`` on the caller's
connection, as ``relay_all()``), so an attempt is recorded, a failure gets its backoff and a message
can end dead exactly as with a worker; nothing raises into the code that sent. Only the messages the
transaction itself sent are claimed (by id): a test does not deliver what other tests or a fixture left
pending, nor anything sent for later, and a keyed message behind an undelivered one of its key stays
behind it (the claim's head-of-key rule still looks at every message).

One delivery per transaction and database: each ``send()`` joins the delivery of its connection's open
transaction. It also registers that delivery with ``transaction.on_commit`` again, because a
``captureOnCommitCallbacks()`` block sees only the callbacks registered inside it, and a transaction
may have started sending before the block; the first of these callbacks to run delivers everything,
the others find nothing left to do.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Sequence

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger("django_outbox.testing")

#: The open delivery of each connection (one per thread and alias), until its transaction ends.
_open: weakref.WeakKeyDictionary[BaseDatabaseWrapper, _Delivery] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class _Delivery:
    """The messages one transaction sent on one database, delivered once, when it commits."""

    __slots__ = ("alias", "done", "ids")

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.ids: list[int] = []
        self.done = False

    def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            deliver(self.alias, self.ids)
        except Exception:  # as in a worker: logged, and the messages wait for the next attempt
            logger.exception("OUTBOX['EAGER']: delivering messages %s after their commit failed", self.ids[:20])


def deliver_at_commit(alias: str, ids: Sequence[int]) -> None:
    """Deliver ``ids`` (just written on ``alias``) once the transaction that wrote them commits.

    Outside ``atomic()`` (autocommit) they are committed already and are delivered at once. Under
    manual transaction management (``set_autocommit(False)``) no commit can be waited for: nothing is
    delivered here (``relay_all()`` or a worker will).
    """
    conn = connections[alias]
    if not conn.in_atomic_block and not conn.get_autocommit():
        logger.warning("OUTBOX['EAGER']: no atomic block and autocommit off on %r; not delivered eagerly", alias)
        return
    with _lock:
        delivery = _open.get(conn)
        if delivery is None or delivery.done or not _registered(conn, delivery):
            # The last transaction's delivery ran, or was dropped with a rollback (of a savepoint too).
            delivery = _open[conn] = _Delivery(alias)
        delivery.ids.extend(ids)
    transaction.on_commit(delivery, using=alias)


def _registered(conn: BaseDatabaseWrapper, delivery: _Delivery) -> bool:
    """Whether ``delivery`` still waits for this connection's commit (a rollback discards it)."""
    return any(entry[1] is delivery for entry in conn.run_on_commit)


def deliver(alias: str, ids: Sequence[int]) -> None:
    """Relay the messages ``ids`` of ``alias`` that are due and claimable now, in this thread.

    Right after the commit every message the transaction sent is visible, and a keyed one is claimable
    unless an earlier message of its key is still open: that one stays behind, as with a worker, and is
    left to ``relay_all()`` or a worker (docs/ordering.md).
    """
    from ..observability import delivery
    from ..worker import Relay, RelayConfig

    if not ids:
        return
    config = RelayConfig.from_settings(database=alias, ids=tuple(ids), notify=False)
    Relay(config, observers=delivery.observers()).drain()  # the spans and counters a worker records
