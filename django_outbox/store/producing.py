"""Writing messages: one ``INSERT`` in the caller's transaction (``send()``, ``send_many()``)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import json
import sqlite3
import uuid as uuid_module
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from django.conf import settings
from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from . import mysql
from .db import MESSAGE, MYSQL_NOW, PENDING, connection, is_mysql, is_pg, mysql_server_clock, prep_dt, prep_uuid
from .models import Message
from .rows import ATTNAMES, COLUMNS, instance_builder, to_message, to_messages


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
        if new.key is not None and not conn.in_atomic_block:
            # In autocommit the key's lock row would be released (committed) before the row is written,
            # and a producer of the same key in a transaction could take the next id in between.
            with transaction.atomic(using=alias):
                return _insert_mysql(alias, conn, new)
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
    if pg and new.key is not None:
        params.append(new.key)  # the key's lock, taken before the row's id (see _insert_sql)
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
        # Capped at the latest time a DateTimeField reads back, as on PostgreSQL, by capping the interval
        # itself: a sum past year 9999 is an error in strict mode (1441), not a NULL to COALESCE.
        times = (
            f"{MYSQL_NOW} + INTERVAL LEAST(%s, TIMESTAMPDIFF(MICROSECOND, {MYSQL_NOW}, {mysql.LAST_TIME}))"
            f" MICROSECOND, {MYSQL_NOW}"
        )
        params.append(mysql.interval(new.delay_seconds))
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


#: The first half of the two-int advisory lock a keyed ``send()`` takes on PostgreSQL
#: (``pg_advisory_xact_lock(KEY_LOCK_CLASS, hashtext(key))``): "outb" in ASCII, so the outbox's locks
#: stand apart from an application's own in ``pg_locks`` and do not collide with its one-bigint ones.
KEY_LOCK_CLASS = 0x6F757462


@functools.cache
def _insert_sql(pg: bool, *, keyed: bool, idempotent: bool, notify: bool, schedule: _Schedule = "given") -> str:
    # PostgreSQL, keyed messages: the row is projected over a subquery that takes the key's advisory lock
    # for the rest of the transaction, so the lock comes before the identity default gives the row its
    # id. A second sender of the key waits there until the first transaction ends: a key's ids are taken
    # in the order their transactions commit, and a worker never sees a later id of a key while an
    # earlier one is still invisible (docs/ordering.md). In autocommit the statement is the transaction,
    # so the lock is released the moment the row is committed. OFFSET 0 keeps the subquery (and its
    # volatile call) where it is. A message without a key is not ordered, and takes no lock.
    lock_first = f" FROM (SELECT pg_advisory_xact_lock({KEY_LOCK_CLASS}, hashtext(%s)) OFFSET 0) AS key_lock"
    lock_first = lock_first if pg and keyed else ""
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
        f" SELECT %s, %s, %s, {jsonb}, {jsonb}, %s, '{PENDING}', 0, %s, {times}, ''{lock_first}{conflict}"
        f" RETURNING {returning}"
    )
    if notify:
        sql = f"WITH m AS ({sql}) SELECT {returning}, pg_notify(%s, '') FROM m"
    return sql


#: Columns bound per row of ``insert_many()``'s statement on SQLite.
_SQLITE_PARAMS_PER_ROW = 9


def insert_many(
    alias: str,
    news: Sequence[NewMessage],
    *,
    notify: str | None = None,
    check: Callable[[Message, NewMessage], Exception | None],
) -> list[tuple[Message, bool]]:
    """Write pending messages in the caller's transaction with one ``INSERT``; (message, created) per item.

    The items' idempotency keys are distinct (``send_many()`` folds repeats). A key already stored is
    handed to ``check`` with the stored message: it returns the error to raise for a conflict, and then
    nothing of the batch stays written. On PostgreSQL the rows travel as one array per column
    (``unnest``), so the statement has the same dozen parameters for any number of rows; every key of
    the batch is locked first, once each, in the order of its lock's number, before any row takes its
    id (``_insert_sql``), and the rows take their ids in the batch's order. SQLite binds each value: a
    batch larger than the connection's limit on bound variables (``SQLITE_LIMIT_VARIABLE_NUMBER``, 32766
    by default since SQLite 3.32) is written in several statements of as many rows as fit.
    """
    conn = connection(alias)
    if is_mysql(conn):
        return _insert_many_mysql(alias, conn, news, check)
    pg = is_pg(conn)
    rows_per_statement = len(news) or 1
    if not pg:
        rows_per_statement = max(1, _sqlite_variable_limit(conn) // _SQLITE_PARAMS_PER_ROW)
    # The batch must stay whole: a conflict found after the INSERT, or a failing later statement,
    # takes back what was written (a savepoint in the caller's transaction, a transaction in autocommit).
    whole = any(new.idempotency_key is not None for new in news) or len(news) > rows_per_statement
    with transaction.atomic(using=alias) if whole else contextlib.nullcontext():
        return _insert_many(alias, conn, pg, news, notify, check, rows_per_statement)


def _insert_many(
    alias: str,
    conn: BaseDatabaseWrapper,
    pg: bool,
    news: Sequence[NewMessage],
    notify: str | None,
    check: Callable[[Message, NewMessage], Exception | None],
    rows_per_statement: int,
) -> list[tuple[Message, bool]]:
    results: dict[uuid_module.UUID, tuple[Message, bool]] = {}
    pending = list(news)
    build = instance_builder(alias)
    with conn.cursor() as cursor:
        for _ in range(_INSERT_TRIES):
            for start in range(0, len(pending), rows_per_statement):
                chunk = pending[start : start + rows_per_statement]
                sql, params = _insert_many_sql(conn, pg, chunk, notify)
                cursor.execute(sql, params)
                rows = cursor.fetchall()
                written = {_as_uuid(row[0]): row for row in rows}
                # PostgreSQL: the server's times, as for send(); the statement's one created_at comes in
                # the first row only, and available_at only where it differs (fewer values to convert).
                created_at = next((row[3] for row in rows if row[3] is not None), None) if pg else None
                for new in chunk:
                    row = written.get(new.uuid)
                    if row is not None:
                        times = (created_at, row[2] or created_at) if created_at is not None else None
                        results[new.uuid] = (_new_message(alias, int(row[1]), new, build, times), True)
            skipped = [new for new in pending if new.uuid not in results]
            if not skipped:
                break
            keys = [new.idempotency_key for new in skipped]
            where = "idempotency_key = ANY(%s)" if pg else "idempotency_key IN (SELECT value FROM json_each(%s))"
            cursor.execute(f"SELECT {COLUMNS} FROM {MESSAGE} WHERE {where}", [keys if pg else json.dumps(keys)])
            stored = {message.idempotency_key: message for message in to_messages(alias, conn, cursor.fetchall())}
            for new in skipped:
                holder = stored.get(new.idempotency_key)
                if holder is not None:
                    error = check(holder, new)
                    if error is not None:
                        raise error
                    results[new.uuid] = (holder, False)
            # A holder that left the table in between (archived, deleted, rolled back) freed its key.
            pending = [new for new in skipped if new.uuid not in results]
            if not pending:
                break
        else:  # pragma: no cover - only if a key is taken and freed again on every try
            raise RuntimeError(
                f"outbox.send_many(): idempotency keys {[n.idempotency_key for n in pending][:5]} were taken "
                f"and freed {_INSERT_TRIES} times while these messages were written; send again"
            )
    return [results[new.uuid] for new in news]


def _insert_many_mysql(
    alias: str,
    conn: BaseDatabaseWrapper,
    news: Sequence[NewMessage],
    check: Callable[[Message, NewMessage], Exception | None],
) -> list[tuple[Message, bool]]:
    """MariaDB/MySQL: the batch's keys locked first, in sorted order (two batches sharing keys never wait
    on each other in a cycle), then one ``INSERT`` per row, all in one transaction (a savepoint in the
    caller's), so a conflict takes the whole batch back. Not one statement, as on PostgreSQL and SQLite:
    there a taken idempotency key fails a multi-row ``INSERT`` whole, and ``INSERT IGNORE`` would also
    swallow every other error (docs/databases.md).
    """
    results: list[tuple[Message, bool]] = []
    with transaction.atomic(using=alias):
        for key in sorted({new.key for new in news if new.key is not None}):
            mysql.lock_key(conn, key)
        for new in news:
            message, created = _insert_mysql(alias, conn, new)
            if not created:
                error = check(message, new)
                if error is not None:
                    raise error
            results.append((message, created))
    return results


def _as_uuid(value: Any) -> uuid_module.UUID:
    return value if isinstance(value, uuid_module.UUID) else uuid_module.UUID(str(value))


def _sqlite_variable_limit(conn: BaseDatabaseWrapper) -> int:
    conn.ensure_connection()
    return int(conn.connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER))


def _insert_many_sql(
    conn: BaseDatabaseWrapper, pg: bool, news: Sequence[NewMessage], notify: str | None
) -> tuple[str, list[Any]]:
    idempotent = any(new.idempotency_key is not None for new in news)
    if pg:
        params: list[Any] = [_batch_document(conn, news)]
        notifying = notify is not None
        if notifying:
            params.append(notify)
        keyed = any(new.key is not None for new in news)
        return _insert_many_pg_sql(keyed=keyed, idempotent=idempotent, notify=notifying), params
    values = []
    params = []
    for new in news:
        values.append(f"(%s, %s, %s, %s, %s, %s, '{PENDING}', 0, %s, %s, %s, '')")
        params += [
            prep_uuid(conn, new.uuid),
            new.topic,
            new.key,
            new.payload_json,
            new.headers_json,
            new.idempotency_key,
            new.max_attempts,
            prep_dt(conn, new.available_at),
            prep_dt(conn, new.created_at),
        ]
    conflict = " ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING" if idempotent else ""
    sql = (
        f"INSERT INTO {MESSAGE} (uuid, topic, key, payload, headers, idempotency_key, status, attempts,"
        f" max_attempts, available_at, created_at, last_error) VALUES {', '.join(values)}{conflict}"
        " RETURNING uuid, id"
    )
    return sql, params


def _batch_document(conn: BaseDatabaseWrapper, news: Sequence[NewMessage]) -> str:
    """The batch as one JSON array of rows (each an array, in the statement's column order), encoded in
    one call. One text parameter: arrays bound one per column cost psycopg about 100 µs per message to
    quote (client-side binding, Django's default), more than the rows cost the server. Payloads and
    headers travel as their JSON text, which the server parses as ``send()``'s ``%s::jsonb`` does."""
    return _ENCODER.encode(
        [
            [
                new.uuid.hex,
                new.topic,
                new.key,
                new.payload_json,
                new.headers_json,
                new.idempotency_key,
                new.max_attempts,
                None if new.delay_seconds is not None else prep_dt(conn, new.available_at).isoformat(),
                new.delay_seconds,
            ]
            for new in news
        ]
    )


_ENCODER = json.JSONEncoder(separators=(",", ":"))


@functools.cache
def _insert_many_pg_sql(*, keyed: bool, idempotent: bool, notify: bool) -> str:
    # The batch is read once (a materialized CTE over the JSON document). The keys' locks: one per
    # distinct lock number, taken in ascending order of it (the subquery's ORDER BY, kept by OFFSET 0),
    # so two batches with overlapping keys lock them in the same order and never deadlock each other;
    # the aggregate has taken all of them before the join yields its first row, so before the first id
    # is drawn. The rows are sorted by their place in the batch before the ids are projected over them:
    # a key's messages take their ids, and so their order, as listed.
    batch = (
        "batch AS MATERIALIZED (SELECT e.place, (e.r->>0)::uuid AS uuid, e.r->>1 AS topic, e.r->>2 AS key,"
        " (e.r->>3)::jsonb AS payload, (e.r->>4)::jsonb AS headers, e.r->>5 AS idempotency_key,"
        " (e.r->>6)::int AS max_attempts, (e.r->>7)::timestamptz AS available_at, (e.r->>8)::float8 AS delay"
        " FROM json_array_elements(%s::json) WITH ORDINALITY AS e(r, place))"
    )
    locks = (
        f" (SELECT count(pg_advisory_xact_lock({KEY_LOCK_CLASS}, s.lock)) FROM (SELECT DISTINCT hashtext(key) AS lock"
        " FROM batch WHERE key IS NOT NULL ORDER BY 1 OFFSET 0) AS s) AS key_locks CROSS JOIN"
        if keyed
        else ""
    )
    available = (
        "CASE WHEN r.available_at IS NOT NULL THEN r.available_at"
        f" WHEN r.delay > 0 THEN LEAST(statement_timestamp() + r.delay * interval '1 second', {_LAST_PYTHON_TIME})"
        " ELSE statement_timestamp() END"
    )
    conflict = " ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING" if idempotent else ""
    insert = (
        f"INSERT INTO {MESSAGE} (uuid, topic, key, payload, headers, idempotency_key, status, attempts,"
        f" max_attempts, available_at, created_at, last_error)"
        f" SELECT r.uuid, r.topic, r.key, r.payload, r.headers, r.idempotency_key, '{PENDING}', 0,"
        f" r.max_attempts, {available}, statement_timestamp(), ''"
        f" FROM{locks} batch AS r ORDER BY r.place{conflict} RETURNING uuid, id, created_at, available_at"
    )
    # An uncorrelated subquery for the NOTIFY: evaluated once, and only if a row was written.
    wake = ", (SELECT pg_notify(%s, ''))" if notify else ""
    return (
        f"WITH {batch}, m AS ({insert}) SELECT m.uuid, m.id, NULLIF(m.available_at, m.created_at),"
        f" CASE WHEN row_number() OVER () = 1 THEN m.created_at END{wake} FROM m"
    )


def _as_read(value: dt.datetime) -> dt.datetime:
    """A time as the database hands it back: in UTC, or naive in ``TIME_ZONE`` under ``USE_TZ = False``."""
    return value.astimezone(dt.UTC) if settings.USE_TZ else value


def _new_message(
    alias: str,
    message_id: int,
    new: NewMessage,
    build: Callable[[Sequence[Any]], Message] | None = None,
    times: tuple[dt.datetime, dt.datetime] | None = None,
) -> Message:
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
        "available_at": _as_read(new.available_at if times is None else times[1]),
        "created_at": _as_read(new.created_at if times is None else times[0]),
        "delivered_at": None,
        "locked_by": None,
        "locked_until": None,
        "last_error": "",
    }
    return (build or instance_builder(alias))([values[name] for name in ATTNAMES])
