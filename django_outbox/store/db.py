"""The database under every statement: table names, statuses, the connection, values as bound.

Shared by every module of the store, and by ``retention`` (which prunes the same tables): public names,
so nothing outside imports a private one.

Time, on PostgreSQL, is the database server's: every statement that sets or tests a lease, a due time
or a heartbeat reads ``statement_timestamp()`` (``SERVER_NOW``) itself, so workers on many hosts never
compare one host's clock with another's (a host ahead would reap live leases, one behind would hold dead
ones). Durations (a lease, a backoff delay) travel as seconds and are added on the server. SQLite serves
one host, whose clock (``timezone.now()``) it keeps. MariaDB/MySQL statements read ``UTC_TIMESTAMP(6)``
(``MYSQL_NOW``) where Django stores UTC there (``USE_TZ = True``, no ``DATABASES[...]["TIME_ZONE"]``), or take
the server's time first in one query (``decision_now()``); otherwise the host's clock, as on SQLite.
"""

from __future__ import annotations

import datetime as dt
import uuid as uuid_module
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import NotSupportedError
from django.utils import timezone

from ..retention.models import ArchivedAttempt, ArchivedMessage
from .models import Attempt, Message, Worker

MESSAGE = Message._meta.db_table
ATTEMPT = Attempt._meta.db_table
WORKER = Worker._meta.db_table
ARCHIVED_MESSAGE = ArchivedMessage._meta.db_table
ARCHIVED_ATTEMPT = ArchivedAttempt._meta.db_table
PENDING = Message.Status.PENDING.value
PROCESSING = Message.Status.PROCESSING.value
DELIVERED = Message.Status.DELIVERED.value
DEAD = Message.Status.DEAD.value
CANCELLED = Message.Status.CANCELLED.value
SUPPORTED_VENDORS = ("mysql", "postgresql", "sqlite")


#: The database server's clock in every PostgreSQL statement that decides by time. Not ``now()``, which
#: stands still for a whole transaction (a caller's, in tests and ``relay_all()``); the statement's
#: start, which Django's ``Now()`` also uses.
SERVER_NOW = "statement_timestamp()"


def connection(alias: str) -> BaseDatabaseWrapper:
    conn = connections[alias]
    if conn.vendor not in SUPPORTED_VENDORS:
        raise NotSupportedError(
            f"django_outbox supports PostgreSQL, SQLite and MariaDB/MySQL; database {alias!r} is {conn.vendor}."
        )
    return conn


def is_pg(conn: BaseDatabaseWrapper) -> bool:
    return bool(conn.vendor == "postgresql")


def is_mysql(conn: BaseDatabaseWrapper) -> bool:
    """MariaDB or MySQL (Django's ``mysql`` backend): no ``UPDATE ... RETURNING``, no NOTIFY (store.mysql)."""
    return bool(conn.vendor == "mysql")


#: The MariaDB/MySQL server's clock, in the naive UTC Django stores in ``DATETIME(6)`` columns.
MYSQL_NOW = "UTC_TIMESTAMP(6)"


def mysql_server_clock(conn: BaseDatabaseWrapper) -> bool:
    """Whether ``MYSQL_NOW`` reads as the columns are stored: UTC, which Django writes with ``USE_TZ``
    unless ``DATABASES[...]["TIME_ZONE"]`` names another zone. Without it, naive local times are stored,
    and the host's clock decides (as on SQLite): the server's zone tables may not even be loaded."""
    return is_mysql(conn) and bool(settings.USE_TZ) and conn.timezone_name == "UTC"


def decision_now(conn: BaseDatabaseWrapper) -> dt.datetime:
    """The "now" of a statement that decides by time and takes it as a parameter: the server's clock on
    MariaDB/MySQL (one query; ``mysql_server_clock``), the host's elsewhere (PostgreSQL statements read
    their own)."""
    if not mysql_server_clock(conn):
        return timezone.now()
    with conn.cursor() as cursor:
        cursor.execute(f"SELECT {MYSQL_NOW}")
        row = cursor.fetchone()
    return timezone.make_aware(row[0], dt.UTC)


def prep_dt(conn: BaseDatabaseWrapper, value: dt.datetime | None) -> Any:
    # With USE_TZ = False the backends take naive times in TIME_ZONE (SQLite refuses aware ones).
    if value is not None and not settings.USE_TZ and timezone.is_aware(value):
        value = timezone.make_naive(value)
    return conn.ops.adapt_datetimefield_value(value)


def prep_uuid(conn: BaseDatabaseWrapper, value: uuid_module.UUID) -> Any:
    return value if conn.features.has_native_uuid_field else value.hex


def topic_filter(topics: Sequence[str] | None, column: str = "topic", *, escape: str = "\\") -> tuple[str, list[str]]:
    """SQL for ``--topics``: exact names, or shell patterns whose ``*`` becomes ``LIKE``'s ``%``.

    MariaDB/MySQL read a backslash in a string literal as an escape (``'\\'`` never ends): they pass
    ``escape="!"``."""
    if not topics:
        return "", []
    parts, params = [], []
    for topic in topics:
        if "*" in topic or "?" in topic:
            escaped = topic.replace(escape, escape * 2).replace("%", escape + "%").replace("_", escape + "_")
            parts.append(f"{column} LIKE %s ESCAPE '{escape}'")
            params.append(escaped.replace("*", "%").replace("?", "_"))
        else:
            parts.append(f"{column} = %s")
            params.append(topic)
    return " AND (" + " OR ".join(parts) + ")", params


def literal(status: str) -> str:
    if not status.isidentifier():  # pragma: no cover - statuses are this module's own constants
        raise ValueError(f"not a status: {status!r}")
    return f"'{status}'"


def storable_text(text: str) -> str:
    """Text PostgreSQL stores as given: a NUL (refused in text) and lone surrogates (not UTF-8) become
    visible escapes. Error texts come from exceptions, which may carry either; left in, they made the
    record fail and the message stay leased. Applied here, where every outcome passes."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def refresh_connections() -> None:
    """Django's ``close_old_connections()`` for a long-lived worker: keep a healthy connection.

    ``CONN_MAX_AGE = 0`` (Django's default) means one connection per request. Applied around each batch
    it made the worker open a new PostgreSQL connection for every batch and every wake-up, which cost
    most of its throughput and several milliseconds of latency (docs/performance.md). A connection that
    saw an error, or whose positive ``CONN_MAX_AGE`` ran out, is still checked and replaced.
    """
    for conn in connections.all(initialized_only=True):
        if conn.settings_dict["CONN_MAX_AGE"] == 0 and not conn.errors_occurred:
            continue
        conn.close_if_unusable_or_obsolete()
