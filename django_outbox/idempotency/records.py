"""Every statement on ``IdempotencyRecord``: claim a key, hold it, complete or release it, purge.

The HTTP side (``endpoints.py``) never queries; it asks this module what a key's state means for
the request in hand. A claim is committed at once in its own short transaction, so a concurrent
retry sees it; the view then runs in a second transaction that locks the claimed row (PostgreSQL),
and stores the response only if the claim is still ours (the ``lock_token`` fence).
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

from django.db import IntegrityError, OperationalError, connections, transaction
from django.db.models import QuerySet
from django.utils import timezone

from ..models import IdempotencyRecord

TABLE = IdempotencyRecord._meta.db_table
IN_PROGRESS = IdempotencyRecord.State.IN_PROGRESS.value
COMPLETED = IdempotencyRecord.State.COMPLETED.value
#: MySQL's duplicate entry in a unique index (ER_DUP_ENTRY).
DUPLICATE_ENTRY = 1062


@dataclass(frozen=True, kw_only=True, slots=True)
class Claimed:
    """This request owns the key and must run the view; ``token`` fences its later writes."""

    token: str
    takeover: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class Busy:
    """Another request with this key is still running (409)."""

    retry_after: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Mismatch:
    """The key was used for a different request (422)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Stored:
    """The key's request completed: replay this response."""

    status: int
    headers: dict[str, str]
    body: bytes


Decision = Claimed | Busy | Mismatch | Stored


def _rows(alias: str, scope: str, key: str) -> QuerySet[IdempotencyRecord]:
    return IdempotencyRecord.objects.using(alias).filter(scope=scope, key=key)


def _insert(
    alias: str,
    *,
    scope: str,
    key: str,
    fingerprint: str,
    token: str,
    now: dt.datetime,
    lock_until: dt.datetime,
    expires_at: dt.datetime,
) -> bool:
    conn = connections[alias]
    adapt = conn.ops.adapt_datetimefield_value
    if conn.vendor == "mysql":  # no ON CONFLICT; a duplicate undoes this statement only, not the transaction
        try:
            with conn.cursor() as cursor:
                cursor.execute(
                    f"INSERT INTO {TABLE} (scope, `key`, fingerprint, state, lock_token, locked_until, created_at,"
                    " expires_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                    [scope, key, fingerprint, IN_PROGRESS, token, adapt(lock_until), adapt(now), adapt(expires_at)],
                )
        except IntegrityError as exc:
            if connection_vendor_error(exc.__cause__) == DUPLICATE_ENTRY:
                return False
            raise
        return True
    with conn.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (scope, key, fingerprint, state, lock_token, locked_until, created_at, expires_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (scope, key) DO NOTHING",
            [scope, key, fingerprint, IN_PROGRESS, token, adapt(lock_until), adapt(now), adapt(expires_at)],
        )
        return bool(cursor.rowcount == 1)


def _decide(record: IdempotencyRecord, fingerprint: str, now: dt.datetime) -> Decision | None:
    """What an existing record means for this request; None when the record may be taken over."""
    if record.expires_at <= now:
        return None
    if record.fingerprint != fingerprint:
        return Mismatch()
    if record.state == COMPLETED:
        return Stored(
            status=int(record.response_status or 200),
            headers=dict(record.response_headers or {}),
            body=bytes(record.response_body or b""),
        )
    if record.locked_until is not None and record.locked_until > now:
        return Busy(retry_after=(record.locked_until - now).total_seconds())
    return None  # in progress, but its claim lapsed: the request that made it died before committing


def _lock_not_available(exc: OperationalError) -> bool:
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) == "55P03" or getattr(cause, "pgcode", None) == "55P03":
        return True
    # MariaDB answers NOWAIT with a lock wait timeout (1205), MySQL with ER_LOCK_NOWAIT (3572).
    return connection_vendor_error(cause) in (1205, 3572)


def connection_vendor_error(cause: BaseException | None) -> int | None:
    """The MySQL error number of a driver exception, if it is one of mysqlclient's."""
    args = getattr(cause, "args", ())
    return args[0] if type(cause).__module__.startswith("MySQLdb") and args and isinstance(args[0], int) else None


def claim(alias: str, *, scope: str, key: str, fingerprint: str, ttl: dt.timedelta, lock_for: dt.timedelta) -> Decision:
    """Claim ``key`` for this request, or say why not. Commits before returning.

    A lapsed claim is taken over only if no transaction holds its row (``FOR UPDATE NOWAIT``): on
    PostgreSQL a view that is still running holds it, so a slow request is never run twice at once.
    """
    token = uuid.uuid4().hex
    for _ in range(3):  # a purge deleting the row between our statements is the only reason to loop
        now = timezone.now()
        try:
            with transaction.atomic(using=alias):
                if _insert(
                    alias,
                    scope=scope,
                    key=key,
                    fingerprint=fingerprint,
                    token=token,
                    now=now,
                    lock_until=now + lock_for,
                    expires_at=now + ttl,
                ):
                    return Claimed(token=token)
                record = _rows(alias, scope, key).first()
                if record is None:
                    continue
                decision = _decide(record, fingerprint, now)
                if decision is not None:
                    return decision
                record = _rows(alias, scope, key).select_for_update(nowait=True).first()
                if record is None:
                    continue
                decision = _decide(record, fingerprint, now)
                if decision is not None:
                    return decision
                expired = record.expires_at <= now
                _rows(alias, scope, key).update(
                    fingerprint=fingerprint,
                    state=IN_PROGRESS,
                    lock_token=token,
                    locked_until=now + lock_for,
                    response_status=None,
                    response_headers=None,
                    response_body=None,
                    completed_at=None,
                    **({"created_at": now, "expires_at": now + ttl} if expired else {}),
                )
                return Claimed(token=token, takeover=not expired)
        except OperationalError as exc:
            if _lock_not_available(exc):
                return Busy(retry_after=lock_for.total_seconds())
            raise
    return Busy(retry_after=1.0)


def hold(alias: str, *, scope: str, key: str, token: str) -> bool:
    """In the view's transaction: lock our claimed row for the rest of it; False if the claim was lost."""
    rows = _rows(alias, scope, key).filter(lock_token=token, state=IN_PROGRESS).select_for_update()
    return bool(list(rows.values_list("id", flat=True)[:1]))


def complete(
    alias: str, *, scope: str, key: str, token: str, status: int, headers: dict[str, str], body: bytes
) -> bool:
    """In the view's transaction: store the response; False if the claim was lost meanwhile."""
    updated = (
        _rows(alias, scope, key)
        .filter(lock_token=token, state=IN_PROGRESS)
        .update(
            state=COMPLETED,
            lock_token=None,
            locked_until=None,
            response_status=status,
            response_headers=headers,
            response_body=body,
            completed_at=timezone.now(),
        )
    )
    return updated == 1


def release(alias: str, *, scope: str, key: str, token: str) -> None:
    """Forget our claim after the view failed and rolled back, so that a retry runs the view again."""
    _rows(alias, scope, key).filter(lock_token=token, state=IN_PROGRESS).delete()


def purge(alias: str, *, batch_size: int = 1000) -> int:
    """Delete expired records in batches; returns how many."""
    rows = IdempotencyRecord.objects.using(alias)
    total = 0
    while True:
        now = timezone.now()
        ids = list(rows.filter(expires_at__lte=now).order_by("id").values_list("id", flat=True)[:batch_size])
        if not ids:
            return total
        total += rows.filter(id__in=ids, expires_at__lte=now).delete()[0]
