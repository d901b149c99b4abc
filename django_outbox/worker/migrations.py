"""What a new release's worker waits for before its first claim: the outbox's migrations on its database.

The command loops on this (say once, check again, start); the question itself is the store's.
"""

from __future__ import annotations

from typing import NamedTuple

from django.db import DatabaseError, connections

from django_outbox.store import schema


class Wait(NamedTuple):
    reason: str
    #: True when migrations are missing; False when the database could not be read (it may come back).
    unapplied: bool


def waiting_reason(alias: str) -> Wait | None:
    """Why the relay cannot start on database ``alias`` yet, or None when it can.

    A database that cannot be read is a reason too (said once, asked again), not a crash: the supervisor
    of a crash-looping worker fills the logs and hides the one line that says what to do. The connection
    is closed after a failure so that the next question reconnects.
    """
    try:
        missing = schema.unapplied(alias)
    except DatabaseError as exc:
        close(alias)
        return Wait(f"cannot read the applied migrations of database {alias!r}: {exc}", unapplied=False)
    if not missing:
        return None
    more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
    reason = f"database {alias!r} lacks the outbox migration {missing[0]}{more}: waiting for manage.py migrate"
    return Wait(reason, unapplied=True)


def close(alias: str) -> None:
    """Close this thread's connection to ``alias``, unless a caller's transaction holds it (``call_command``
    in a test): closing it there would mark that transaction for rollback."""
    if not connections[alias].in_atomic_block:
        connections[alias].close()
