"""Writing messages: one ``INSERT`` in the caller's transaction (``send()``, ``send_many()``)."""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import sqlite3
import uuid as uuid_module
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any, Literal

from django.conf import settings
from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from . import mysql
from .db import (
    MESSAGE,
    PENDING,
    connection,
    decision_now,
    is_mysql,
    is_pg,
    mysql_server_clock,
    prep_dt,
    prep_uuid,
)
from .models import Message
from .rows import ATTNAMES, COLUMNS, instance_builder, to_message, to_messages


# Not frozen: a frozen dataclass sets each field through object.__setattr__, 1.3 µs per message against
# 0.45 (send_many() builds one per item); nothing changes one after _prepare() built it.
@dataclass(kw_only=True, slots=True)
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
    keyed, idempotent, headed, params = _shape_params(new, prep_uuid(conn, new.uuid))
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
    if pg and keyed:
        params.append(new.key)  # the key's lock, taken before the row's id (see _insert_sql)
    notifying = notify is not None and pg
    if notifying:
        params.append(notify)
    sql = _insert_sql(pg, keyed=keyed, idempotent=idempotent, notify=notifying, schedule=schedule, headers=headed)
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
            raise _taken_and_freed(new)
    if pg:  # the times the server gave the row: created_at, then available_at when it was computed too
        created_at = _read_text_time(row[1])
        if schedule == "delay":
            available_at = _as_read(row[2])
        else:
            available_at = created_at if schedule == "now" else _as_read(new.available_at)
        return _new_message(alias, int(row[0]), new, times=(created_at, available_at)), True
    return _new_message(alias, int(row[0]), new), True


def _taken_and_freed(new: NewMessage) -> RuntimeError:
    return RuntimeError(
        f"outbox.send(): idempotency key {new.idempotency_key!r} was taken and freed {_INSERT_TRIES} "
        "times while this message was written; send again"
    )


def _shape_params(new: NewMessage, uuid_value: object) -> tuple[bool, bool, bool, list[Any]]:
    """The statement's shape (keyed, idempotent, with headers) and the values it binds, for ``insert()``.

    What a message of the shape lacks (no key, no idempotency key, no headers) is written into the
    statement's text, not bound: each bound value costs the driver a quoting and the server a parse. The
    times, which differ by database, follow.
    """
    keyed, idempotent, headed = new.key is not None, new.idempotency_key is not None, new.headers_json != "{}"
    params: list[Any] = [uuid_value, new.topic]
    if keyed:
        params.append(new.key)
    params.append(new.payload_json)
    if headed:
        params.append(new.headers_json)
    if idempotent:
        params.append(new.idempotency_key)
    params.append(new.max_attempts)
    return keyed, idempotent, headed, params


def _row_params(conn: BaseDatabaseWrapper, new: NewMessage) -> list[Any]:
    """The values of a row's first columns, in the order every ``INSERT`` here names them (uuid, topic,
    key, payload, headers, idempotency_key, max_attempts); the times, which differ, follow."""
    return [
        prep_uuid(conn, new.uuid),
        new.topic,
        new.key,
        new.payload_json,
        new.headers_json,
        new.idempotency_key,
        new.max_attempts,
    ]


def _refuse_deep_json(new: NewMessage, caller: str = "outbox.send()") -> None:
    mysql.refuse_deep_json("payload", new.payload_json, caller=caller)
    if new.headers_json != "{}":
        mysql.refuse_deep_json("headers", new.headers_json, caller=caller)


def _insert_mysql(alias: str, conn: Any, new: NewMessage, *, batch: bool = False) -> tuple[Message, bool]:
    """MariaDB/MySQL: the key's lock row first (commit order, see store.mysql), then the row.

    On MariaDB (``INSERT ... RETURNING``) and the server's clock, the row is created at the server's now and
    due at it plus the delay, as on PostgreSQL; MySQL, which cannot return them, takes the sender's times.
    Only the times the server computed come back: without a delay the row is due when created (one
    ``UTC_TIMESTAMP(6)`` per statement), and a given time is the sender's. ``batch``: ``send_many()``
    checked every item's JSON and locked every key of the batch first.
    """
    if not batch:
        _refuse_deep_json(new)
    # The uuid as hex: the text of a CHAR(32) column (Django's, without a native type) and read as such by
    # MariaDB's uuid type; a UUID object the driver would format through str() and escape.
    keyed, idempotent, headed, params = _shape_params(new, new.uuid.hex)
    server_times = mysql_server_clock(conn) and conn.features.can_return_columns_from_insert
    if not server_times:
        schedule = "host"
        params += [prep_dt(conn, new.available_at), prep_dt(conn, new.created_at)]
    elif new.delay_seconds is None:
        schedule = "given"
        params.append(prep_dt(conn, new.available_at))
    elif new.delay_seconds > 0:
        schedule = "delay"
        params.append(mysql.interval(new.delay_seconds))
    else:
        schedule = "now"
    shape = (keyed, idempotent, headed, schedule)
    sql = mysql.insert_sql(shape)
    with conn.cursor() as cursor:
        if keyed and not batch:
            cursor.execute(mysql.LOCK_KEY_SQL, [new.key])
        for _ in range(_INSERT_TRIES):
            row = mysql.insert_row(cursor, sql, params, returning=server_times)
            if row is not None:
                break
            assert new.idempotency_key is not None  # only a taken idempotency key refuses the row
            stored = mysql.stored_by_idempotency_key(conn, new.idempotency_key)
            if stored is not None:
                return to_message(alias, conn, stored), False
        else:  # pragma: no cover - only if the key is taken and freed again on every try
            raise _taken_and_freed(new)
    if server_times:  # naive UTC, as read under USE_TZ (which the server's clock requires)
        created_at = row[1].replace(tzinfo=dt.UTC)
        if schedule == "delay":
            available_at = row[2].replace(tzinfo=dt.UTC)
        else:
            available_at = created_at if schedule == "now" else new.available_at
        return _new_message(alias, int(row[0]), new, times=(created_at, available_at)), True
    return _new_message(alias, int(row[0]), new), True


_Schedule = Literal["given", "now", "delay"]

#: The latest time a ``DateTimeField`` reads back, for a delay computed here (``_write_many_mariadb``).
_LAST_TIME = dt.datetime.max.replace(tzinfo=dt.UTC)
_MICROSECOND = dt.timedelta(microseconds=1)

#: The latest time a ``DateTimeField`` reads back into Python: a delay that the sender's clock kept within
#: year 9999 may pass it on a server whose clock is ahead.
_LAST_PYTHON_TIME = "timestamptz '9999-12-31 23:59:59.999999+00'"


#: The first half of the two-int advisory lock a keyed ``send()`` takes on PostgreSQL
#: (``pg_advisory_xact_lock(KEY_LOCK_CLASS, hashtext(key))``): "outb" in ASCII, so the outbox's locks
#: stand apart from an application's own in ``pg_locks`` and do not collide with its one-bigint ones.
KEY_LOCK_CLASS = 0x6F757462
#: The lock that stands for every key at once (``pg_advisory_xact_lock(BATCH_LOCK_CLASS, 0)``, "outB"):
#: every keyed producer takes it shared beside its keys' locks, and a ``send_many()`` of more than
#: ``MANY_KEYS`` distinct keys takes it alone, exclusively, instead of one lock per key. Locks live in a
#: table of the server's shared memory that every session shares (``max_locks_per_transaction`` times
#: the connections): one lock per key of a batch of 50,000 keys filled it, and the application's own
#: queries in other sessions failed with "out of shared memory" until the batch ended.
BATCH_LOCK_CLASS = 0x6F757442
#: Distinct keys above which a batch takes the one exclusive lock: a lock per key up to here, as a few
#: concurrent batches fit in the lock table's default room (64 a connection), and keyed producers of other
#: keys go on beside them.
MANY_KEYS = 64
_SHARED_KEYS_LOCK = f"pg_advisory_xact_lock_shared({BATCH_LOCK_CLASS}, 0)"


@functools.cache
def _insert_sql(
    pg: bool, *, keyed: bool, idempotent: bool, notify: bool, schedule: _Schedule = "given", headers: bool = True
) -> str:
    # PostgreSQL, keyed messages: the row is projected over a subquery that takes the key's advisory lock
    # for the rest of the transaction, so the lock comes before the identity default gives the row its
    # id. A second sender of the key waits there until the first transaction ends: a key's ids are taken
    # in the order their transactions commit, and a worker never sees a later id of a key while an
    # earlier one is still invisible (docs/ordering.md). In autocommit the statement is the transaction,
    # so the lock is released the moment the row is committed. OFFSET 0 keeps the subquery (and its
    # volatile call) where it is. A message without a key is not ordered, and takes no lock.
    lock_first = (
        f" FROM (SELECT {_SHARED_KEYS_LOCK}, pg_advisory_xact_lock({KEY_LOCK_CLASS}, hashtext(%s)) OFFSET 0)"
        " AS key_lock"
    )
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
        # created_at as text: a timestamptz column has psycopg build Django's time-zone loader for the
        # cursor, about 20 µs of every send(); the text (ISO, as psycopg itself requires) parses in 1.
        # Not available_at, which can lie at the edge of year 9999, where the text of a zone east of
        # UTC would read 10000.
        times, returning = f"{available}, statement_timestamp()", "id, created_at::text"
        if schedule == "delay":
            returning += ", available_at"
    # The key, headers and idempotency key are bound only where the shape has them (insert()).
    key = "%s" if keyed else "NULL"
    header_values = jsonb if headers else ("'{}'::jsonb" if pg else "'{}'")
    idempotency_key = "%s" if idempotent else "NULL"
    values = f"%s, %s, {key}, {jsonb}, {header_values}, {idempotency_key}, '{PENDING}', 0, %s, {times}, ''"
    # Unkeyed: a plain VALUES row, which PostgreSQL parses and plans faster than a SELECT over nothing.
    source = f" SELECT {values}{lock_first}" if lock_first else f" VALUES ({values})"
    # The NOTIFY rides in the RETURNING list: evaluated once per row written, so not at all when ON
    # CONFLICT skipped the row, and with no CTE around the INSERT to parse and plan (docs/performance.md,
    # "What each change bought").
    wake = ", pg_notify(%s, '')" if notify else ""
    return (
        f"INSERT INTO {MESSAGE} (uuid, topic, key, payload, headers, idempotency_key, status, attempts,"
        f" max_attempts, available_at, created_at, last_error){source}{conflict} RETURNING {returning}{wake}"
    )


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
    nothing of the batch stays written. On PostgreSQL the rows travel as one jsonb document
    (``_batch_document``), so the statement has the same few parameters for any number of rows; every key of
    the batch is locked first, once each, in the order of its lock's number, before any row takes its
    id (``_insert_sql``), and the rows take their ids in the batch's order. Rows with idempotency keys are
    written in the order of those keys (``_insert_many_pg_sql``: no deadlock between batches sharing
    them). If a key's holder leaves the table between the ``INSERT`` that skipped its item and the
    lookup, the batch is taken back to its savepoint and written again whole, so the freed item keeps
    its place among its key's messages. SQLite binds each value: a
    batch larger than the connection's limit on bound variables (``SQLITE_LIMIT_VARIABLE_NUMBER``, 32766
    by default since SQLite 3.32) is written in several statements of as many rows as fit.
    """
    conn = connection(alias)
    if is_mysql(conn):
        return _insert_many_mysql(alias, conn, news, check)
    pg = is_pg(conn)
    sqlite_rows = None if pg else max(1, _sqlite_variable_limit(conn) // _SQLITE_PARAMS_PER_ROW)
    statements = _statements(news, sqlite_rows)
    # The batch must stay whole: a conflict found after the INSERT, or a failing later statement,
    # takes back what was written (a savepoint in the caller's transaction, a transaction in autocommit).
    idempotent = any(new.idempotency_key is not None for new in news)
    if not idempotent:
        with transaction.atomic(using=alias) if len(statements) > 1 else contextlib.nullcontext():
            return _insert_many(alias, conn, pg, statements, notify, check)
    for _ in range(_INSERT_TRIES):
        try:
            with transaction.atomic(using=alias):
                return _insert_many(alias, conn, pg, statements, notify, check)
        except _HolderVanished:
            # Written again whole, rather than only the items whose key came free: those would take ids
            # after the batch's later items of their key, out of the batch's order.
            continue
    raise RuntimeError(  # pragma: no cover - only if a key is taken and freed again on every try
        f"outbox.send_many(): idempotency keys were taken and freed {_INSERT_TRIES} times while these messages "
        "were written; send again"
    )


class _HolderVanished(Exception):
    """An idempotency key's holder left the table between the ``INSERT`` that skipped an item for it and
    the lookup (housekeeping archived or deleted it, or its transaction rolled back)."""


#: The most payload and header text one PostgreSQL statement of ``insert_many()`` carries: its rows
#: travel as one ``jsonb`` document, which PostgreSQL caps at 256 MiB; a larger batch is written in
#: several statements (in one transaction, so it stays whole).
_PG_DOCUMENT_BYTES = 64 * 1024 * 1024


def _statements(news: Sequence[NewMessage], sqlite_rows: int | None) -> list[Sequence[NewMessage]]:
    """The batch cut into the rows of each statement: as many as SQLite may bind, or as fit in one
    PostgreSQL document."""
    if sqlite_rows is not None:
        return [news[start : start + sqlite_rows] for start in range(0, len(news), sqlite_rows)] or [news]
    chunks: list[Sequence[NewMessage]] = []
    start = size = 0
    for index, new in enumerate(news):
        grown = size + len(new.payload_json) + len(new.headers_json) + 512  # 512: the row's other fields
        if index > start and grown > _PG_DOCUMENT_BYTES:
            chunks.append(news[start:index])
            start, grown = index, len(new.payload_json) + len(new.headers_json) + 512
        size = grown
    chunks.append(news[start:])
    return chunks


def _insert_many(
    alias: str,
    conn: BaseDatabaseWrapper,
    pg: bool,
    statements: Sequence[Sequence[NewMessage]],
    notify: str | None,
    check: Callable[[Message, NewMessage], Exception | None],
) -> list[tuple[Message, bool]]:
    news = [new for chunk in statements for new in chunk]
    # By the item's place in the batch: a uuid as the key cost a hash in Python per item and lookup.
    results: list[tuple[Message, bool] | None] = [None] * len(news)
    build = instance_builder(alias)
    offset = 0
    with conn.cursor() as cursor:
        for chunk in statements:
            sql, params = _insert_many_sql(conn, pg, chunk, notify)
            cursor.execute(sql, params)
            rows = cursor.fetchall()
            if pg and not any(new.idempotency_key is not None for new in chunk):
                # Every row was written, and PostgreSQL hands them back in id order, which is the
                # batch's (_insert_many_pg_sql): no uuid to read back and match.
                if len(rows) != len(chunk):  # pragma: no cover - only if the statement lost its ORDER BY
                    raise RuntimeError(f"outbox.send_many(): {len(chunk)} rows sent, {len(rows)} written")
                matched: Iterable[tuple[NewMessage, Any]] = zip(chunk, rows, strict=True)
            else:
                written = {_as_uuid(row[0]): row for row in rows}
                matched = ((new, written.get(new.uuid)) for new in chunk)
            # PostgreSQL: the server's times, as for send(); the statement's one created_at comes in
            # the first row only, and available_at only where it differs (fewer values to convert).
            created_at = next((row[3] for row in rows if row[3] is not None), None) if pg else None
            # converted once for the statement: most rows are due at their creation
            created_read = _as_read(created_at) if created_at is not None else None
            for place, (new, row) in enumerate(matched, offset):
                if row is not None:
                    times = None
                    if created_read is not None:
                        times = (created_read, _as_read(row[2]) if row[2] is not None else created_read)
                    results[place] = (_new_message(alias, int(row[1]), new, build, times), True)
            offset += len(chunk)
        skipped = [place for place, result in enumerate(results) if result is None]
        if skipped:
            keys = [news[place].idempotency_key for place in skipped]
            where = "idempotency_key = ANY(%s)" if pg else "idempotency_key IN (SELECT value FROM json_each(%s))"
            cursor.execute(f"SELECT {COLUMNS} FROM {MESSAGE} WHERE {where}", [keys if pg else json.dumps(keys)])
            stored = {message.idempotency_key: message for message in to_messages(alias, conn, cursor.fetchall())}
            for place in skipped:
                new = news[place]
                holder = stored.get(new.idempotency_key)
                if holder is None:
                    raise _HolderVanished
                error = check(holder, new)
                if error is not None:
                    raise error
                results[place] = (holder, False)
    if None in results:  # pragma: no cover - every place is written or held by its key's message
        raise RuntimeError("outbox.send_many(): an item was neither written nor found")
    return results  # type: ignore[return-value]  # no None left


def _insert_many_mysql(
    alias: str,
    conn: BaseDatabaseWrapper,
    news: Sequence[NewMessage],
    check: Callable[[Message, NewMessage], Exception | None],
) -> list[tuple[Message, bool]]:
    """MariaDB/MySQL: the batch's keys locked first, in sorted order (two batches sharing keys never wait
    on each other in a cycle), then the rows, all in one transaction (a savepoint in the caller's), so a
    conflict takes the whole batch back.

    On MariaDB the rows are one ``INSERT ... RETURNING`` per statement's worth of text
    (``_write_many_mariadb``); MySQL, which returns nothing from an ``INSERT``, writes them one by one.
    """
    # Every item is checked before the first lock or row: a batch refused for its last item must not
    # have waited for (and held) the keys of the others.
    for index, new in enumerate(news):
        _refuse_deep_json(new, f"outbox.send_many(): item {index}")
    keys = sorted({new.key for new in news if new.key is not None})
    if conn.features.can_return_columns_from_insert:
        for attempt in range(_INSERT_TRIES):
            try:
                with transaction.atomic(using=alias):
                    if keys:
                        mysql.lock_keys(conn, keys)
                    return _write_many_mariadb(alias, conn, news, check, latest=attempt > 0)
            except mysql.IdempotencyKeyTaken:
                continue  # taken back to the savepoint; the holders are read again, as last committed
        raise RuntimeError(  # pragma: no cover - only if keys are taken and freed again on every try
            f"outbox.send_many(): idempotency keys were taken and freed {_INSERT_TRIES} times while these "
            "messages were written; send again"
        )
    results: list[tuple[Message, bool]] = []
    with transaction.atomic(using=alias):
        if keys:
            mysql.lock_keys(conn, keys)
        for new in news:
            message, created = _insert_mysql(alias, conn, new, batch=True)
            if not created:
                error = check(message, new)
                if error is not None:
                    raise error
            results.append((message, created))
    return results


def _write_many_mariadb(
    alias: str,
    conn: BaseDatabaseWrapper,
    news: Sequence[NewMessage],
    check: Callable[[Message, NewMessage], Exception | None],
    *,
    latest: bool,
) -> list[tuple[Message, bool]]:
    """The rows of a batch whose keys are locked, in as few ``INSERT`` statements as fit the server's
    packet, in the batch's order (ids follow it).

    Items whose idempotency key is already stored are looked up first and left out: a taken key would fail
    the whole statement. ``latest``: a concurrent producer took one since, so the lookup reads the latest
    committed holders (``mysql.stored_by_idempotency_keys``) rather than the transaction's snapshot.
    """
    results: list[tuple[Message, bool] | None] = [None] * len(news)
    idempotency = [new.idempotency_key for new in news if new.idempotency_key is not None]
    if idempotency:
        stored: dict[str, Message] = {}
        key_sizes = [mysql.text_bytes(key) + 8 for key in idempotency]
        for start, stop in mysql.batch_chunks(conn, key_sizes):
            chunk = idempotency[start:stop]
            if latest:
                rows = mysql.stored_by_idempotency_keys(conn, chunk)
            else:
                with conn.cursor() as cursor:
                    cursor.execute(
                        f"SELECT {mysql.COLUMNS} FROM {MESSAGE}"
                        f" WHERE idempotency_key IN ({', '.join(['%s'] * len(chunk))})",
                        chunk,
                    )
                    rows = list(cursor.fetchall())
            stored.update((m.idempotency_key, m) for m in to_messages(alias, conn, rows) if m.idempotency_key)
        for place, new in enumerate(news):
            holder = stored.get(new.idempotency_key) if new.idempotency_key is not None else None
            if holder is not None:
                error = check(holder, new)
                if error is not None:
                    raise error
                results[place] = (holder, False)
    places = [place for place, result in enumerate(results) if result is None]
    if not places:
        return results  # type: ignore[return-value]  # every item is held by its key's message
    # One reading of the server's clock for the batch (its UTC, as send() writes it), or the sender's
    # times: every row's times are then known here, so only ids come back, and a row writes into its text
    # what the batch shares (the creation time) or what it lacks (key, headers, idempotency key).
    server_clock = mysql_server_clock(conn)
    now = decision_now(conn) if server_clock else None
    now_text = f"'{prep_dt(conn, now)}'" if now is not None else ""
    values: list[str] = []
    params: list[Any] = []
    widths = [0]
    sizes: list[int] = []
    times: list[tuple[dt.datetime, dt.datetime]] = []
    for place in places:
        new = news[place]
        params += (new.uuid.hex, new.topic)
        row = f"(%s, %s, {'NULL' if new.key is None else '%s'}, %s"
        if new.key is not None:
            params.append(new.key)
        params.append(new.payload_json)
        if new.headers_json == "{}":
            row += ", '{}'"
        else:
            row += ", %s"
            params.append(new.headers_json)
        if new.idempotency_key is None:
            row += ", NULL"
        else:
            row += ", %s"
            params.append(new.idempotency_key)
        row += f", '{PENDING}', 0, {int(new.max_attempts)}"
        if now is None:
            row += ", %s, %s, '')"
            params += (prep_dt(conn, new.available_at), prep_dt(conn, new.created_at))
            times.append((_as_read(new.created_at), _as_read(new.available_at)))
        else:
            if new.delay_seconds is None:
                available_at = new.available_at
            else:
                delay = min(mysql.interval(max(new.delay_seconds, 0.0)), (_LAST_TIME - now) // _MICROSECOND)
                available_at = now + dt.timedelta(microseconds=delay)
            if available_at == now:
                row += f", {now_text}, {now_text}, '')"
            else:
                row += f", %s, {now_text}, '')"
                params.append(prep_dt(conn, available_at))
            times.append((now, available_at))
        values.append(row)
        widths.append(len(params))
        sizes.append(
            mysql.text_bytes(new.topic, new.key, new.payload_json, new.headers_json, new.idempotency_key) + 200
        )
    build = instance_builder(alias)
    with conn.cursor() as cursor:
        for start, stop in mysql.batch_chunks(conn, sizes):
            written = mysql.insert_rows(cursor, values[start:stop], params[widths[start] : widths[stop]])
            if len(written) != stop - start:  # pragma: no cover - only if the server lost rows of its RETURNING
                raise RuntimeError(f"outbox.send_many(): {stop - start} rows sent, {len(written)} written")
            for index, (row_id, row_uuid) in enumerate(written, start):
                place = places[index]
                new = news[place]
                if str(row_uuid).replace("-", "") != new.uuid.hex:  # pragma: no cover - RETURNING out of order
                    raise RuntimeError("outbox.send_many(): the rows came back out of the batch's order")
                results[place] = (_new_message(alias, int(row_id), new, build, times[index]), True)
    return results  # type: ignore[return-value]  # every place is written or held by its key's message


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
        keys = {new.key for new in news if new.key is not None}
        bulk = len(keys) > MANY_KEYS
        sql = _insert_many_pg_sql(keyed=bool(keys), idempotent=idempotent, notify=notifying, bulk=bulk)
        return sql, params
    values = []
    params = []
    for new in news:
        values.append(f"(%s, %s, %s, %s, %s, %s, '{PENDING}', 0, %s, %s, %s, '')")
        params += [*_row_params(conn, new), prep_dt(conn, new.available_at), prep_dt(conn, new.created_at)]
    conflict = " ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING" if idempotent else ""
    sql = (
        f"INSERT INTO {MESSAGE} (uuid, topic, key, payload, headers, idempotency_key, status, attempts,"
        f" max_attempts, available_at, created_at, last_error) VALUES {', '.join(values)}{conflict}"
        " RETURNING uuid, id"
    )
    return sql, params


def _batch_document(conn: BaseDatabaseWrapper, news: Sequence[NewMessage]) -> str:
    """The batch as one JSON array of rows, one object per row keyed by the statement's column
    definitions (``_insert_many_pg_sql``). One text parameter: arrays bound one per column cost psycopg
    about 100 µs per message to quote (client-side binding, Django's default), more than the rows cost
    the server. Payloads and headers are spliced in as the JSON text ``send()`` validated, so the server
    parses each once, with the document, as ``jsonb`` (the ``%s::jsonb`` of ``send()``); the names are
    validated text, encoded as JSON strings here."""
    rows = []
    for new in news:
        if new.delay_seconds is None:
            schedule = f'"a":"{prep_dt(conn, new.available_at).isoformat()}"'
        else:
            schedule = f'"d":{float(new.delay_seconds)!r}'
        rows.append(
            f'{{"u":"{new.uuid.hex}","t":{_string(new.topic)},"k":{_string(new.key)},"p":{new.payload_json},'
            f'"h":{new.headers_json},"i":{_string(new.idempotency_key)},"m":{int(new.max_attempts)},{schedule}}}'
        )
    return f"[{','.join(rows)}]"


def _string(value: str | None) -> str:
    return "null" if value is None else encode_basestring_ascii(value)


@functools.cache
def _insert_many_pg_sql(*, keyed: bool, idempotent: bool, notify: bool, bulk: bool = False) -> str:
    # The batch is read once (a materialized CTE over the JSON document). The keys' locks: one per
    # distinct lock number, taken in ascending order of it (the subquery's ORDER BY, kept by OFFSET 0),
    # so two batches with overlapping keys lock them in the same order and never deadlock each other;
    # the aggregate has taken all of them before the join yields its first row, so before the first id
    # is drawn. The rows are sorted by their place in the batch before the ids are projected over them:
    # a key's messages take their ids, and so their order, as listed.
    # The document is parsed once, as jsonb, and split into typed columns by one function: the payloads
    # and headers come out as jsonb values, not as text to parse a second time (json_array_elements and
    # ->> per column cost the server 1.3 ms per 100 rows against 0.8 ms; docs/performance.md).
    batch = (
        "batch AS MATERIALIZED (SELECT r.place, r.u AS uuid, r.t AS topic, r.k AS key,"
        # a JSON null comes out of the recordset as SQL NULL: the payload null is JSON's, as in send()
        " COALESCE(r.p, 'null'::jsonb) AS payload,"
        " r.h AS headers, r.i AS idempotency_key, r.m AS max_attempts, r.a AS available_at, r.d AS delay"
        " FROM ROWS FROM (jsonb_to_recordset(%s::jsonb) AS (u uuid, t text, k text, p jsonb, h jsonb, i text,"
        " m int, a timestamptz, d float8)) WITH ORDINALITY AS r(u, t, k, p, h, i, m, a, d, place))"
    )
    # More keys than MANY_KEYS: the one lock that stands for every key, exclusively (BATCH_LOCK_CLASS).
    locks = (
        f" (SELECT pg_advisory_xact_lock({BATCH_LOCK_CLASS}, 0) OFFSET 0) AS key_locks CROSS JOIN"
        if bulk
        else f" (SELECT {_SHARED_KEYS_LOCK} OFFSET 0) AS keys_lock CROSS JOIN"
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
    columns = (
        "uuid, topic, key, payload, headers, idempotency_key, status, attempts, max_attempts, available_at,"
        " created_at, last_error"
    )
    values = (
        f"r.uuid, r.topic, r.key, r.payload, r.headers, r.idempotency_key, '{PENDING}', 0, r.max_attempts,"
        f" {available}, statement_timestamp(), ''"
    )
    if idempotent:
        # Rows with idempotency keys can wait at the unique index for another transaction that is writing
        # the same key. Written in the batch's order, [i1, i2] and [i2, i1] would each write their first
        # and wait for the other's: a deadlock. So the rows are written in the order of their idempotency
        # key, the same for every batch, while their ids are drawn first, in the batch's order (after the
        # keys' locks, as above), so a key's messages still take their ids as listed. No lock per
        # idempotency key: a big batch would fill the server's lock table, and batches would queue.
        ids = (
            f", ids AS MATERIALIZED (SELECT s.place, nextval(pg_get_serial_sequence('{MESSAGE}', 'id')) AS id"
            f" FROM{locks} (SELECT place FROM batch ORDER BY place OFFSET 0) AS s)"
        )
        insert = (
            f"INSERT INTO {MESSAGE} (id, {columns}) SELECT i.id, {values}"
            " FROM batch AS r JOIN ids AS i ON i.place = r.place ORDER BY r.idempotency_key, r.place"
            " ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
            " RETURNING uuid, id, created_at, available_at"
        )
    else:
        ids = ""
        insert = (
            f"INSERT INTO {MESSAGE} ({columns}) SELECT {values}"
            f" FROM{locks} batch AS r ORDER BY r.place RETURNING uuid, id, created_at, available_at"
        )
    # An uncorrelated subquery for the NOTIFY: evaluated once, and only if a row was written.
    wake = ", (SELECT pg_notify(%s, ''))" if notify else ""
    # Without idempotency keys every row is written, and the rows come back in id order, which is the
    # batch's: _insert_many() pairs them with the items by position, without reading the uuids back.
    uuid, order = ("m.uuid", "") if idempotent else ("NULL::uuid", " ORDER BY m.id")
    return (
        f"WITH {batch}{ids}, m AS ({insert}) SELECT {uuid}, m.id, NULLIF(m.available_at, m.created_at),"
        f" CASE WHEN row_number() OVER () = 1 THEN m.created_at END{wake} FROM m{order}"
    )


def _read_text_time(text: str) -> dt.datetime:
    """A ``timestamptz`` the server wrote as text, as Django's loader would have read it: in UTC, or
    under ``USE_TZ = False`` the wall time of the session's zone (``TIME_ZONE``), naive."""
    value = dt.datetime.fromisoformat(text)
    return value.astimezone(dt.UTC) if settings.USE_TZ else value.replace(tzinfo=None)


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
    # ``times``: (created_at, available_at) as the database gave them back and already as read.
    """The row just inserted, built from what was sent rather than read back: ``RETURNING`` every column
    and converting it cost about 80 µs per ``send()`` (docs/performance.md). JSON is decoded from the
    text written, and times are in UTC, so it equals what a read from the database returns."""
    if times is None:
        times = (_as_read(new.created_at), _as_read(new.available_at))
    headers = new.headers_json
    values = [  # in the order of _NEW_ROW_FIELDS, which is ATTNAMES'
        message_id,
        new.uuid,
        new.topic,
        new.key,
        _decode(new.payload_json, 0)[0],
        {} if headers == "{}" else _decode(headers, 0)[0],
        new.idempotency_key,
        PENDING,
        0,
        new.max_attempts,
        times[1],
        times[0],
        None,
        None,
        None,
        "",
    ]
    return (build or instance_builder(alias))(values)


#: ``json.loads()`` without its wrapper (the stray whitespace and trailing data it refuses, which the
#: encoder's own text never holds): the scanner ``json.loads()`` itself shares between threads. 0.7 µs a
#: payload against 2.0, paid once per message sent.
_decode: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]

#: The fields of ``_new_message()``'s list, by position: a list is built faster than a dict then a list.
_NEW_ROW_FIELDS = (
    "id",
    "uuid",
    "topic",
    "key",
    "payload",
    "headers",
    "idempotency_key",
    "status",
    "attempts",
    "max_attempts",
    "available_at",
    "created_at",
    "delivered_at",
    "locked_by",
    "locked_until",
    "last_error",
)
if list(_NEW_ROW_FIELDS) != ATTNAMES:  # pragma: no cover - a field added to Message without updating this
    raise ImportError(f"_new_message() builds {_NEW_ROW_FIELDS}, Message has {ATTNAMES}")
