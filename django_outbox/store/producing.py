"""Writing messages: one ``INSERT`` in the caller's transaction (``send()``, ``send_many()``)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import uuid as uuid_module
from dataclasses import dataclass
from typing import Any, Literal

from django.conf import settings

from . import mysql
from .db import MESSAGE, MYSQL_NOW, PENDING, connection, is_mysql, is_pg, mysql_server_clock, prep_dt, prep_uuid
from .models import Message
from .rows import ATTNAMES, COLUMNS, instance_builder, to_message


@dataclass(frozen=True, kw_only=True, slots=True)
class NewMessage:
    uuid: uuid_module.UUID
    topic: str
    key: str | None
    payload_json: str
    headers_json: str
    idempotency_key: str | None
    max_attempts: int
    available_at: dt.datetime
    created_at: dt.datetime
    #: Set when the sender gave no ``available_at``: on PostgreSQL the row is then due this many seconds
    #: after the database's now, and created at it, whatever the sending host's clock says.
    delay_seconds: float | None = None


#: Writes of one message tried when its idempotency key's holder keeps vanishing in between (archiving).
_INSERT_TRIES = 5


def insert(alias: str, new: NewMessage, *, notify: str | None = None) -> tuple[Message, bool]:
    """Write one pending message in the caller's transaction; returns (message, created).

    A repeated idempotency key returns the stored message and writes nothing. ``ON CONFLICT DO
    NOTHING`` keeps the caller's transaction usable: a plain unique violation would poison it.
    With ``notify`` (PostgreSQL), the same statement queues a ``NOTIFY`` on that channel if it wrote a row.
    """
    conn = connection(alias)
    if is_mysql(conn):
        return _insert_mysql(alias, conn, new)
    pg = is_pg(conn)
    params = [
        prep_uuid(conn, new.uuid),
        new.topic,
        new.key,
        new.payload_json,
        new.headers_json,
        new.idempotency_key,
        new.max_attempts,
    ]
    # PostgreSQL: created at the server's now, and due at it plus the delay unless a time was given.
    schedule: _Schedule = "given"
    if not pg:
        params += [prep_dt(conn, new.available_at), prep_dt(conn, new.created_at)]
    elif new.delay_seconds is None:
        params.append(prep_dt(conn, new.available_at))
    elif new.delay_seconds > 0:
        schedule = "delay"
        params.append(float(new.delay_seconds))
    else:
        schedule = "now"
    notifying = notify is not None and pg
    if notifying:
        params.append(notify)
    sql = _insert_sql(
        pg, keyed=new.key is not None, idempotent=new.idempotency_key is not None, notify=notifying, schedule=schedule
    )
    with conn.cursor() as cursor:
        for _ in range(_INSERT_TRIES):
            cursor.execute(sql, params)
            row = cursor.fetchone()
            if row is not None:
                break
            cursor.execute(f"SELECT {COLUMNS} FROM {MESSAGE} WHERE idempotency_key = %s", [new.idempotency_key])
            stored = cursor.fetchone()
            if stored is not None:
                return to_message(alias, conn, stored), False
            # The conflicting message left the table in between (housekeeping archived or deleted it,
            # or its own transaction rolled back): the key is free again, so this message is written.
        else:  # pragma: no cover - only if the key is taken and freed again on every try
            raise RuntimeError(
                f"outbox.send(): idempotency key {new.idempotency_key!r} was taken and freed {_INSERT_TRIES} "
                "times while this message was written; send again"
            )
    if pg:  # the times the server gave the row: created_at, then available_at when it was computed too
        created_at = row[1]
        available_at = row[2] if schedule == "delay" else created_at if schedule == "now" else new.available_at
        new = dataclasses.replace(new, created_at=created_at, available_at=available_at)
    return _new_message(alias, int(row[0]), new), True


def _insert_mysql(alias: str, conn: Any, new: NewMessage) -> tuple[Message, bool]:
    """MariaDB/MySQL: the key's lock row first (commit order, see store.mysql), then the row.

    On MariaDB (``INSERT ... RETURNING``) and the server's clock, the row is created at the server's now and
    due at it plus the delay, as on PostgreSQL; MySQL, which cannot return them, takes the sender's times.
    """
    mysql.refuse_deep_json("payload", new.payload_json)
    mysql.refuse_deep_json("headers", new.headers_json)
    if new.key is not None:
        mysql.lock_key(conn, new.key)
    params: list[Any] = [
        prep_uuid(conn, new.uuid),
        new.topic,
        new.key,
        new.payload_json,
        new.headers_json,
        new.idempotency_key,
        new.max_attempts,
    ]
    server_times = mysql_server_clock(conn) and bool(conn.features.can_return_columns_from_insert)
    if not server_times:
        times = "%s, %s"
        params += [prep_dt(conn, new.available_at), prep_dt(conn, new.created_at)]
    elif new.delay_seconds is None:
        times = f"%s, {MYSQL_NOW}"
        params.append(prep_dt(conn, new.available_at))
    elif new.delay_seconds > 0:
        # past year 9999 the sum is NULL: the latest time a DateTimeField reads back, as on PostgreSQL
        times = f"COALESCE({MYSQL_NOW} + INTERVAL %s MICROSECOND, {mysql.LAST_TIME}), {MYSQL_NOW}"
        params.append(mysql.interval(min(new.delay_seconds, 400 * 365.25 * 86400)))
    else:
        times = f"{MYSQL_NOW}, {MYSQL_NOW}"
    for _ in range(_INSERT_TRIES):
        row = mysql.insert_row(conn, params, returning=server_times, times=times)
        if row is not None:
            break
        assert new.idempotency_key is not None  # only a taken idempotency key refuses the row
        stored = mysql.stored_by_idempotency_key(conn, new.idempotency_key)
        if stored is not None:
            return to_message(alias, conn, stored), False
    else:  # pragma: no cover - only if the key is taken and freed again on every try
        raise RuntimeError(
            f"outbox.send(): idempotency key {new.idempotency_key!r} was taken and freed {_INSERT_TRIES} "
            "times while this message was written; send again"
        )
    if server_times:
        created_at, available_at = (value.replace(tzinfo=dt.UTC) for value in row[1:3])
        new = dataclasses.replace(new, created_at=created_at, available_at=available_at)
    return _new_message(alias, int(row[0]), new), True


_Schedule = Literal["given", "now", "delay"]

#: The latest time a ``DateTimeField`` reads back into Python: a delay that the sender's clock kept within
#: year 9999 may pass it on a server whose clock is ahead.
_LAST_PYTHON_TIME = "timestamptz '9999-12-31 23:59:59.999999+00'"


@functools.cache
def _insert_sql(pg: bool, *, keyed: bool, idempotent: bool, notify: bool, schedule: _Schedule = "given") -> str:
    # PostgreSQL, keyed messages: the subquery row, computed and filtered before the identity default is
    # projected over it, gives the transaction its id before the row takes its own. Per-key ordering
    # relies on that (docs/ordering.md); a message without a key is not ordered, and is spared the
    # subquery. OFFSET 0 and the filter keep the planner from dropping the (stable) call.
    xact_first = " FROM (SELECT pg_current_xact_id() AS xid OFFSET 0) AS xact WHERE xact.xid IS NOT NULL"
    xact_first = xact_first if pg and keyed else ""
    jsonb = "%s::jsonb" if pg else "%s"
    # The conflict target names the partial unique index by its column and predicate.
    conflict = " ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING" if idempotent else ""
    # On PostgreSQL the row's times are the server's (statement_timestamp(), which, unlike now(), moves on
    # inside the caller's transaction) and come back with the id: one timestamp to read, two with a delay.
    times, returning = "%s, %s", "id"
    if pg:
        available = {
            "given": "%s",
            "now": "statement_timestamp()",
            "delay": f"LEAST(statement_timestamp() + %s * interval '1 second', {_LAST_PYTHON_TIME})",
        }[schedule]
        times, returning = f"{available}, statement_timestamp()", "id, created_at"
        if schedule == "delay":
            returning += ", available_at"
    sql = (
        f"INSERT INTO {MESSAGE} (uuid, topic, key, payload, headers, idempotency_key, status, attempts,"
        f" max_attempts, available_at, created_at, last_error)"
        f" SELECT %s, %s, %s, {jsonb}, {jsonb}, %s, '{PENDING}', 0, %s, {times}, ''{xact_first}{conflict}"
        f" RETURNING {returning}"
    )
    if notify:
        sql = f"WITH m AS ({sql}) SELECT {returning}, pg_notify(%s, '') FROM m"
    return sql


def _as_read(value: dt.datetime) -> dt.datetime:
    """A time as the database hands it back: in UTC, or naive in ``TIME_ZONE`` under ``USE_TZ = False``."""
    return value.astimezone(dt.UTC) if settings.USE_TZ else value


def _new_message(alias: str, message_id: int, new: NewMessage) -> Message:
    """The row just inserted, built from what was sent rather than read back: ``RETURNING`` every column
    and converting it cost about 80 µs per ``send()`` (docs/performance.md). JSON is decoded from the
    text written, and times are in UTC, so it equals what a read from the database returns."""
    values = {
        "id": message_id,
        "uuid": new.uuid,
        "topic": new.topic,
        "key": new.key,
        "payload": json.loads(new.payload_json),
        "headers": {} if new.headers_json == "{}" else json.loads(new.headers_json),
        "idempotency_key": new.idempotency_key,
        "status": PENDING,
        "attempts": 0,
        "max_attempts": new.max_attempts,
        "available_at": _as_read(new.available_at),
        "created_at": _as_read(new.created_at),
        "delivered_at": None,
        "locked_by": None,
        "locked_until": None,
        "last_error": "",
        "visible_after_xid": None,  # stamped by the first claim that sees a keyed row
    }
    return instance_builder(alias)([values[name] for name in ATTNAMES])
