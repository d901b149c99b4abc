"""Every statement that reads or changes outbox rows, one module per job.

The worker never builds a query: it calls these functions (``from django_outbox import store``, then
``store.claim(...)``). Each runs in autocommit as one statement where the database allows, so a claim or
an ack is one round trip and no transaction outlives the function. The store decides nothing: what a
failure means (retry when, or give up) is the worker's policy, handed in as an ``Outcome``.

- ``producing``: ``insert`` (``send()``), ``insert_many`` (``send_many()``), ``KEY_LOCK_CLASS`` (the
  advisory lock a keyed send takes);
- ``claiming``: ``claim``, ``claim_sql``, ``next_due``, ``work_in_progress``;
- ``recording``: ``record`` and ``Outcome``;
- ``leases``: ``release``, ``extend_leases``, ``reap``;
- ``workers``: ``heartbeat``, ``database_now``;
- ``actions``: ``retry``, ``cancel``, ``requeue_dead`` (admin, management commands);
- ``notify``: the ``NOTIFY`` that wakes idle workers;
- shared by them (and by ``retention``): ``db`` (tables, statuses, the connection, values as bound),
  ``rows`` (rows as ``Message`` instances), ``cursors`` (prepared statements and their fallback).
"""

from .actions import ActionResult, cancel, requeue_dead, retry
from .claiming import (
    ATTEMPTS_MAX,
    blocking_statuses,
    claim,
    claim_sql,
    next_due,
    work_in_progress,
)
from .db import (
    ARCHIVED_ATTEMPT,
    ARCHIVED_MESSAGE,
    ATTEMPT,
    CANCELLED,
    DEAD,
    DELIVERED,
    MESSAGE,
    PENDING,
    PROCESSING,
    SUPPORTED_VENDORS,
    WORKER,
    refresh_connections,
)
from .leases import Reaped, extend_leases, reap, release
from .notify import notify_now, notify_on_commit
from .producing import BATCH_LOCK_CLASS, KEY_LOCK_CLASS, NewMessage, insert, insert_many
from .recording import MAX_RETRY_DELAY_SECONDS, Outcome, record, retry_seconds
from .rows import COLUMNS
from .workers import WorkerBeat, database_now, heartbeat

__all__ = [
    "ARCHIVED_ATTEMPT",
    "ARCHIVED_MESSAGE",
    "ATTEMPT",
    "ATTEMPTS_MAX",
    "BATCH_LOCK_CLASS",
    "CANCELLED",
    "COLUMNS",
    "DEAD",
    "DELIVERED",
    "KEY_LOCK_CLASS",
    "MAX_RETRY_DELAY_SECONDS",
    "MESSAGE",
    "PENDING",
    "PROCESSING",
    "SUPPORTED_VENDORS",
    "WORKER",
    "ActionResult",
    "NewMessage",
    "Outcome",
    "Reaped",
    "WorkerBeat",
    "blocking_statuses",
    "cancel",
    "claim",
    "claim_sql",
    "database_now",
    "extend_leases",
    "heartbeat",
    "insert",
    "insert_many",
    "next_due",
    "notify_now",
    "notify_on_commit",
    "reap",
    "record",
    "refresh_connections",
    "release",
    "requeue_dead",
    "retry",
    "retry_seconds",
    "work_in_progress",
]
