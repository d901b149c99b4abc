"""Operator actions (admin, management commands): retry, cancel, requeue."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models.functions import Now

from .db import CANCELLED, DEAD, PENDING, connection, decision_now, is_pg
from .models import Message
from .notify import notify_on_commit


@dataclass(frozen=True, slots=True)
class ActionResult:
    changed: list[int]
    refused: list[int]


def retry(alias: str, message_ids: Iterable[int], *, reset_attempts: bool = False) -> ActionResult:
    """Make pending or dead messages deliverable now. Leased, delivered or cancelled ones are refused."""
    ids = list(message_ids)
    with transaction.atomic(using=alias):
        allowed = list(
            Message.objects.using(alias)
            .select_for_update()
            .filter(id__in=ids, status__in=[PENDING, DEAD])
            .values_list("id", flat=True)
        )
        changes: dict[str, Any] = {
            "status": PENDING,
            # due now on the clock the claim uses: the server's on PostgreSQL (statement_timestamp())
            "available_at": _now(alias),
            "locked_by": None,
            "locked_until": None,
        }
        if reset_attempts:
            changes["attempts"] = 0
        Message.objects.using(alias).filter(id__in=allowed).update(**changes)
        if allowed:
            notify_on_commit(alias)  # idle workers pick the retried messages up at once, not at the next poll
    return ActionResult(changed=sorted(allowed), refused=sorted(set(ids) - set(allowed)))


def cancel(alias: str, message_ids: Iterable[int], *, reason: str) -> ActionResult:
    """Give up on pending or dead messages for good, keeping the reason.

    ``available_at`` becomes the time of the cancel: a cancelled message is never due again, and
    retention counts from when it became final (housekeeping), not from when it was sent, so a dead
    message cancelled long after it was created keeps its reason and attempts for ``RETENTION``.
    """
    ids = list(message_ids)
    with transaction.atomic(using=alias):
        allowed = list(
            Message.objects.using(alias)
            .select_for_update()
            .filter(id__in=ids, status__in=[PENDING, DEAD])
            .values_list("id", flat=True)
        )
        Message.objects.using(alias).filter(id__in=allowed).update(
            status=CANCELLED,
            last_error=f"cancelled: {reason}" if reason else "cancelled",
            available_at=_now(alias),
            locked_by=None,
            locked_until=None,
        )
        if allowed:
            notify_on_commit(alias)  # a cancelled head lets its key's next message go: wake idle workers
    return ActionResult(changed=sorted(allowed), refused=sorted(set(ids) - set(allowed)))


def _now(alias: str) -> Any:
    """The "now" of the clock the claim uses: the server's on PostgreSQL (``statement_timestamp()``) and on
    MariaDB/MySQL (read first: Django's ``Now()`` there is the session's local ``CURRENT_TIMESTAMP``)."""
    conn = connection(alias)
    return Now() if is_pg(conn) else decision_now(conn)


def requeue_dead(alias: str, *, topic: str, reset_attempts: bool = True) -> ActionResult:
    """Retry every dead message of one topic (after the destination was fixed)."""
    ids = list(Message.objects.using(alias).filter(status=DEAD, topic=topic).values_list("id", flat=True))
    changed: list[int] = []
    refused: list[int] = []
    for start in range(0, len(ids), 500):  # stay under SQLite's limit on query parameters
        result = retry(alias, ids[start : start + 500], reset_attempts=reset_attempts)
        changed += result.changed
        refused += result.refused
    return ActionResult(changed=changed, refused=refused)
