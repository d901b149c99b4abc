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
import time
import weakref
from collections.abc import Sequence

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger("django_outbox.testing")

#: The open delivery of each connection (one per thread and alias), until its transaction ends.
_open: weakref.WeakKeyDictionary[BaseDatabaseWrapper, _Delivery] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
#: How long a delivery waits for the commit-order fence to let its keyed messages go (PostgreSQL).
FENCE_WAIT_SECONDS = 5.0
FENCE_RECHECK_SECONDS = 0.01


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

    On PostgreSQL a keyed message is claimable only once every transaction that was open when a claim
    first saw it has ended (the commit-order fence, docs/ordering.md): a lower id of its key may still be
    in one of them. Any transaction of the server counts, other test databases' too, so right after the
    commit the fence may still hold; this waits for it up to :data:`FENCE_WAIT_SECONDS`, as a worker
    would, then leaves what is still held to ``relay_all()`` or a worker, and says so in the log.
    """
    from .. import store
    from ..worker import Relay, RelayConfig

    if not ids:
        return
    relay = Relay(RelayConfig.from_settings(database=alias, ids=tuple(ids), notify=False))
    relay.drain()
    deadline = time.monotonic() + FENCE_WAIT_SECONDS
    while store.held_by_the_fence(alias, ids):
        if time.monotonic() >= deadline:
            logger.warning(
                "OUTBOX['EAGER']: keyed messages among %s wait for transactions older than theirs to end (the"
                " commit-order fence); not delivered now",
                list(ids)[:20],
            )
            return
        time.sleep(FENCE_RECHECK_SECONDS)
        relay.drain()
