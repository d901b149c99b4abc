"""The idempotent consumer: process a received message at most once per (source, message id).

Delivery is at least once, so a consumer sees redeliveries. Recording the receipt in the *same*
transaction as the consumer's own writes makes "did I process this?" and "what did it do?" commit or
roll back together: there is no window where one exists without the other.

On PostgreSQL the receipt is ``INSERT ... ON CONFLICT DO NOTHING``. A second delivery of a message
whose first delivery is still running blocks on that insert until the first transaction ends, then
sees the committed row and skips (or, if the first rolled back, runs the effects itself). That needs
READ COMMITTED, PostgreSQL's default: under REPEATABLE READ or SERIALIZABLE the second delivery gets a
serialization error instead, which the caller should treat as "retry later". SQLite has one writer at
a time, so the second delivery waits for the first to commit before it even starts.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, ParamSpec, TypeVar

from django.db import IntegrityError, connections, transaction
from django.utils import timezone

from ..conf import get_settings
from ..limits import INBOX_MESSAGE_ID_MAX_LENGTH, INBOX_SOURCE_MAX_LENGTH
from ..models import InboxMessage

__all__ = ["Receipt", "consumer", "purge", "receive"]

logger = logging.getLogger("django_outbox.inbox")

T = TypeVar("T")
P = ParamSpec("P")
TABLE = InboxMessage._meta.db_table


@dataclass(frozen=True, kw_only=True, slots=True)
class Receipt(Generic[T]):
    """What ``receive()`` found. ``duplicate`` means: already processed, do nothing.

    ``received_at`` is when the message was first processed (for a duplicate, the earlier delivery).
    ``result`` is the handler's return value when a ``@consumer`` ran it; None for a duplicate.
    """

    source: str
    message_id: str
    duplicate: bool
    received_at: dt.datetime
    result: T | None = None


def _check(what: str, value: object, max_length: int) -> str:
    if isinstance(value, uuid.UUID):
        value = str(value)
    if not isinstance(value, str):
        raise TypeError(f"inbox: {what} must be a string (or UUID), not {type(value).__name__}.")
    if not value or value != value.strip():
        raise ValueError(f"inbox: {what} must be a non-empty string without surrounding spaces, got {value!r}.")
    if len(value) > max_length:
        raise ValueError(f"inbox: {what} is {len(value)} characters long; the limit is {max_length}.")
    return value


def _record(alias: str, source: str, message_id: str, now: dt.datetime) -> dt.datetime | None:
    """Insert the receipt; None if it is new, else when the existing one was recorded.

    ``ON CONFLICT DO NOTHING`` rather than a plain insert: a unique violation would poison the
    caller's transaction, and this is where PostgreSQL makes a concurrent duplicate wait.
    """
    conn = connections[alias]
    if conn.vendor == "mysql":  # no ON CONFLICT; a duplicate undoes this statement only (and waits, as here)
        try:
            with conn.cursor() as cursor:
                cursor.execute(
                    f"INSERT INTO {TABLE} (source, message_id, received_at) VALUES (%s, %s, %s)",
                    [source, message_id, conn.ops.adapt_datetimefield_value(now)],
                )
            return None
        except IntegrityError as exc:
            args = getattr(exc.__cause__, "args", ())
            if not (args and args[0] == 1062):  # ER_DUP_ENTRY
                raise
    else:
        with conn.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {TABLE} (source, message_id, received_at) VALUES (%s, %s, %s)"
                " ON CONFLICT (source, message_id) DO NOTHING",
                [source, message_id, conn.ops.adapt_datetimefield_value(now)],
            )
            if cursor.rowcount == 1:
                return None
    first = (
        InboxMessage.objects.using(alias)
        .filter(source=source, message_id=message_id)
        .values_list("received_at", flat=True)
        .first()
    )
    return first or now  # a purge may have removed it in between; it was still a duplicate


@contextmanager
def receive(source: str, message_id: str | uuid.UUID, *, using: str | None = None) -> Iterator[Receipt[None]]:
    """Open a transaction (a savepoint inside one) that records the receipt, and yield a ``Receipt``.

    The block must do nothing when ``receipt.duplicate`` is true::

        with inbox.receive("billing", event_id) as receipt:
            if receipt.duplicate:
                return
            Invoice.objects.create(...)

    If the block raises, the receipt is rolled back with the block's writes, so a redelivery runs
    it again. ``using`` is the database of the consumer's writes (default ``OUTBOX["DATABASE"]``).
    """
    source = _check("source", source, INBOX_SOURCE_MAX_LENGTH)
    message_id = _check("message_id", message_id, INBOX_MESSAGE_ID_MAX_LENGTH)
    alias = using or get_settings().DATABASE
    with transaction.atomic(using=alias):
        now = timezone.now()
        first = _record(alias, source, message_id, now)
        if first is not None:
            logger.info("inbox: skipped duplicate %s %s (first received %s)", source, message_id, first.isoformat())
        yield Receipt(source=source, message_id=message_id, duplicate=first is not None, received_at=first or now)


def consumer(
    source: str, *, message_id: Callable[P, str | uuid.UUID], using: str | None = None
) -> Callable[[Callable[P, T]], Callable[P, Receipt[T]]]:
    """Decorate a function so that it runs at most once per message; it then returns a ``Receipt``.

    ``message_id`` is called with the function's own arguments and returns the id to dedupe on::

        @inbox.consumer("shop", message_id=lambda event: event["id"])
        def on_order_created(event): ...

        receipt = on_order_created(event)   # receipt.duplicate, receipt.result
    """

    def decorate(func: Callable[P, T]) -> Callable[P, Receipt[T]]:
        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> Receipt[T]:
            with receive(source, message_id(*args, **kwargs), using=using) as receipt:
                result = None if receipt.duplicate else func(*args, **kwargs)
            return Receipt(
                source=receipt.source,
                message_id=receipt.message_id,
                duplicate=receipt.duplicate,
                received_at=receipt.received_at,
                result=result,
            )

        return wrapper

    return decorate


def purge(*, older_than: dt.timedelta | None = None, using: str | None = None, batch_size: int = 1000) -> int:
    """Delete receipts older than ``older_than`` (default ``OUTBOX["INBOX_RETENTION"]``); returns how many.

    The retention is the dedupe window: a message redelivered after its receipt was purged is
    processed again. Keep it longer than the longest time a producer may keep retrying.
    Deletes in batches so that a large backlog does not hold one long transaction.
    """
    settings = get_settings()
    alias = using or settings.DATABASE
    cutoff = timezone.now() - (older_than if older_than is not None else settings.INBOX_RETENTION)
    rows = InboxMessage.objects.using(alias)
    total = 0
    while True:
        ids = list(rows.filter(received_at__lt=cutoff).order_by("id").values_list("id", flat=True)[:batch_size])
        if not ids:
            return total
        total += rows.filter(id__in=ids).delete()[0]
