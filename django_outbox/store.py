"""Every statement that reads or changes outbox rows.

The relay loop never builds a query: it calls these functions. Each runs in autocommit as one statement
where the database allows (PostgreSQL data-modifying CTEs, SQLite ``UPDATE ... RETURNING``), so a claim
or an ack is one round trip and no transaction outlives the function. Rows come back as ``Message``
instances built straight from the cursor (no per-row queries), with Django's own converters applied.

Time, on PostgreSQL, is the database server's: every statement that sets or tests a lease, a due time
or a heartbeat reads ``statement_timestamp()`` itself, so workers on many hosts never compare one host's
clock with another's (a host ahead would reap live leases, one behind would hold dead ones). Durations
(a lease, a backoff delay) travel as seconds and are added on the server. SQLite serves one host, whose
clock (``timezone.now()``) it keeps. Attempt start and finish times are the worker's own (docs/worker.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import json
import logging
import uuid as uuid_module
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from django.conf import settings
from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.base import ModelState
from django.db.models.functions import Now
from django.db.models.signals import post_init, pre_init
from django.db.utils import NotSupportedError
from django.utils import timezone

from .archive_models import ArchivedAttempt, ArchivedMessage
from .models import Attempt, Message, Worker
from .wakeup import notify_on_commit

try:
    import psycopg
except ImportError:  # pragma: no cover - an install without the postgres extra
    psycopg = None  # type: ignore[assignment]

MESSAGE = Message._meta.db_table
ATTEMPT = Attempt._meta.db_table
WORKER = Worker._meta.db_table
ARCHIVED_MESSAGE = ArchivedMessage._meta.db_table
ARCHIVED_ATTEMPT = ArchivedAttempt._meta.db_table
_FIELDS = Message._meta.concrete_fields
_COLUMN_NAMES = [str(f.column) for f in _FIELDS]
_ATTNAMES = [f.attname for f in _FIELDS]  # the same names today; from_db() and instances go by these
COLUMNS = ", ".join(_COLUMN_NAMES)
PENDING = Message.Status.PENDING.value
PROCESSING = Message.Status.PROCESSING.value
DELIVERED = Message.Status.DELIVERED.value
DEAD = Message.Status.DEAD.value
CANCELLED = Message.Status.CANCELLED.value
SUPPORTED_VENDORS = ("postgresql", "sqlite")


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """What happened to one claimed message; ``status`` is where the message goes next."""

    message_id: int
    number: int
    status: str  # delivered | pending (retry) | dead
    started_at: dt.datetime
    finished_at: dt.datetime
    error: str = ""
    #: Seconds from the record until a retry is due, added to the database's clock by ``record()``.
    retry_delay: float | None = None

    @property
    def attempt_outcome(self) -> str:
        return Attempt.Outcome.DELIVERED if self.status == DELIVERED else Attempt.Outcome.FAILED

    @property
    def retry_at(self) -> dt.datetime | None:
        """When the retry is due, as the worker's clock sees it (for logs and signals; the row has the
        database's)."""
        if self.retry_delay is None:
            return None
        return self.finished_at + dt.timedelta(seconds=retry_seconds(self.retry_delay))


#: A bound on any retry delay the store writes (about 100 years): a last safety net, so that no value
#: can overflow a timestamp, whatever policy computed it.
MAX_RETRY_DELAY_SECONDS = 100 * 365.25 * 86400.0


def retry_seconds(delay: float) -> float:
    """``delay`` as a storable number of seconds: NaN and negatives are 0, infinity and more the bound."""
    if not delay >= 0:  # NaN too
        return 0.0
    return min(float(delay), MAX_RETRY_DELAY_SECONDS)


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


@dataclass(frozen=True, kw_only=True, slots=True)
class Reaped:
    message_id: int
    status: str
    previous_worker: str


def _connection(alias: str) -> BaseDatabaseWrapper:
    conn = connections[alias]
    if conn.vendor not in SUPPORTED_VENDORS:
        raise NotSupportedError(f"django_outbox supports PostgreSQL and SQLite; database {alias!r} is {conn.vendor}.")
    return conn


def _is_pg(conn: BaseDatabaseWrapper) -> bool:
    return bool(conn.vendor == "postgresql")


@functools.cache
def _decoders(alias: str, vendor: str) -> list[tuple[int, Any, tuple[Callable[..., Any], ...]]]:
    """For each column of ``COLUMNS`` that needs it, the converters Django's compiler would apply."""
    conn = connections[alias]
    decoders = []
    for i, field in enumerate(_FIELDS):
        col = field.get_col(MESSAGE)
        converters = tuple(conn.ops.get_db_converters(col) + field.get_db_converters(conn))
        if converters:
            decoders.append((i, col, converters))
    return decoders


def _to_message(alias: str, conn: BaseDatabaseWrapper, row: Sequence[Any]) -> Message:
    return _to_messages(alias, conn, [row])[0]


def _to_messages(alias: str, conn: BaseDatabaseWrapper, rows: Iterable[Sequence[Any]]) -> list[Message]:
    decoders = _decoders(alias, conn.vendor)
    build = _instance_builder(alias)
    messages = []
    for row in rows:
        values = list(row)
        for i, col, converters in decoders:
            value = values[i]
            for convert in converters:
                value = convert(value, col, conn)
            values[i] = value
        messages.append(build(values))
    return messages


def _instance_builder(alias: str) -> Callable[[Sequence[Any]], Message]:
    """What ``Message.from_db()`` returns, without running ``Model.__init__`` over every field.

    A claim builds one per message and ``send()`` one per call; ``__init__`` cost about 30 µs of each
    when it ran cold after a round trip (docs/performance.md). Django's own ``from_db()`` is used
    whenever something listens for the model's init signals, so they keep firing. Asked once per batch.
    """
    if pre_init.has_listeners(Message) or post_init.has_listeners(Message):
        return functools.partial(Message.from_db, alias, _ATTNAMES)

    def build(values: Sequence[Any]) -> Message:
        message = Message.__new__(Message)
        state = ModelState()
        state.adding = False
        state.db = alias
        attributes = message.__dict__
        attributes.update(zip(_ATTNAMES, values, strict=True))
        attributes["_state"] = state
        return message

    return build


def _prep_dt(conn: BaseDatabaseWrapper, value: dt.datetime | None) -> Any:
    # With USE_TZ = False the backends take naive times in TIME_ZONE (SQLite refuses aware ones).
    if value is not None and not settings.USE_TZ and timezone.is_aware(value):
        value = timezone.make_naive(value)
    return conn.ops.adapt_datetimefield_value(value)


def _prep_uuid(conn: BaseDatabaseWrapper, value: uuid_module.UUID) -> Any:
    return value if conn.features.has_native_uuid_field else value.hex


def _topic_filter(topics: Sequence[str] | None, column: str = "topic") -> tuple[str, list[str]]:
    """SQL for ``--topics``: exact names, or shell patterns whose ``*`` becomes ``LIKE``'s ``%``."""
    if not topics:
        return "", []
    parts, params = [], []
    for topic in topics:
        if "*" in topic or "?" in topic:
            escaped = topic.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            parts.append(f"{column} LIKE %s ESCAPE '\\'")
            params.append(escaped.replace("*", "%").replace("?", "_"))
        else:
            parts.append(f"{column} = %s")
            params.append(topic)
    return " AND (" + " OR ".join(parts) + ")", params


if psycopg is not None:
    _loader = psycopg.adapters.get_loader(psycopg.adapters.types["timestamptz"].oid, psycopg.pq.Format.TEXT)
    if _loader is None:  # pragma: no cover - psycopg registers one for every built-in type
        raise ImportError("psycopg has no timestamptz loader")
    #: psycopg's own (compiled where its binary package is installed), not Django's subclass of it.
    _TIMESTAMPTZ_LOADER: type[psycopg.abc.Loader] = _loader

    class _PreparingCursor(psycopg.Cursor[Any]):
        """Binds parameters server-side and prepares every statement it runs."""

        def execute(
            self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool | None = None
        ) -> Any:
            return super().execute(query, params, prepare=True if prepare is None else prepare, binary=binary)


T = TypeVar("T")

#: Aliases whose prepared statements did not survive in this process: a pooler in transaction pooling
#: (PgBouncer before 1.21) hands each transaction any server connection, so a statement prepared on one
#: is missing on the next, or a second client's name collides with it.
_UNPREPARED: set[str] = set()
_logger = logging.getLogger("django_outbox.store")


def _prepared_statements_lost(exc: BaseException) -> bool:
    cause = exc.__cause__ if isinstance(exc, DatabaseError) and exc.__cause__ is not None else exc
    return psycopg is not None and isinstance(
        cause, psycopg.errors.DuplicatePreparedStatement | psycopg.errors.InvalidSqlStatementName
    )


def _unprepared_on_loss(conn: BaseDatabaseWrapper, run: Callable[[], T]) -> T:
    """``run()``, and once more unprepared if its prepared statement did not survive (a pooler).

    Both errors come before the statement runs (PostgreSQL refuses the PREPARE or the EXECUTE of an
    unknown name), so running it again is safe: nothing was claimed or recorded twice. From then on this
    process prepares nothing on that alias, which is what ``OUTBOX["PREPARED_STATEMENTS"] = False``
    would have said; it is logged once. Treated as an outage instead, it cost a backoff per batch and,
    for a record, a duplicate delivery.
    """
    try:
        return run()
    except DatabaseError as exc:
        if not _prepared_statements_lost(exc) or conn.in_atomic_block:
            raise  # in the caller's own transaction (drain()), nothing can be retried here
        if conn.alias not in _UNPREPARED:
            _UNPREPARED.add(conn.alias)
            _logger.warning(
                "prepared statements do not survive on database %r (%s): a connection pooler in "
                "transaction pooling is in the way; carrying on without them. Set "
                "OUTBOX['PREPARED_STATEMENTS'] = False to say so, or connect workers directly "
                "(docs/deploying.md).",
                conn.alias,
                str(exc).strip(),
            )
        conn.close()  # psycopg's own bookkeeping of what it prepared is wrong now: start afresh
        return run()


def _worker_cursor(conn: BaseDatabaseWrapper) -> Any:
    """A cursor for the claim and the record, which a worker runs all day with the same text.

    Parsing and analysing the claim (three CTEs) took about 2 ms of its 5 ms for a one-message claim,
    every time: Django binds parameters client-side and leaves preparing off, for the sake of connection
    poolers. With ``OUTBOX["PREPARED_STATEMENTS"]`` (on by default) these statements are bound
    server-side and prepared once per connection (docs/performance.md); the record then runs a cached
    generic plan, the claim is still planned for each execution (see ``_claim_text``). The wrapper is
    Django's own, so execute wrappers and error translation see them as any other (the claim's errors
    reach its wrappers late: see ``_walking_plan``). Off PostgreSQL or psycopg 3, with the setting off
    (PgBouncer in transaction pooling before 1.21), or while Django logs queries: Django's usual cursor.
    """
    from .conf import get_settings

    if (
        psycopg is None
        or not _is_pg(conn)
        or not get_settings().PREPARED_STATEMENTS
        or conn.queries_logged  # with DEBUG or a query capture on, the log gets the statements' full text
        or conn.alias in _UNPREPARED
    ):
        return conn.cursor()
    conn.ensure_connection()
    raw = conn.connection
    if not isinstance(raw, psycopg.Connection):  # psycopg2
        return conn.cursor()
    conn.validate_thread_sharing()
    if raw.prepare_threshold is None:
        # Django turns preparing off for the whole connection. A threshold no statement reaches by
        # repetition lets exactly these, which ask for it (prepare=True), be prepared.
        raw.prepare_threshold = 2**31 - 1
    cursor = _PreparingCursor(raw)
    if conn.timezone is dt.UTC and raw.info.parameter_status("TimeZone") == "UTC":
        # Django reads timestamps with a loader of its own, in Python (~5 µs each, three per claimed
        # message), to pin their time zone. When that zone is UTC, which is also the session's, psycopg's
        # own loader (compiled, where psycopg's binary package is installed) returns the same values.
        cursor.adapters.register_loader("timestamptz", _TIMESTAMPTZ_LOADER)
    return conn.make_cursor(cursor)  # type: ignore[arg-type]


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


# --- producing ---------------------------------------------------------------------------------


#: Writes of one message tried when its idempotency key's holder keeps vanishing in between (archiving).
_INSERT_TRIES = 5


def insert(alias: str, new: NewMessage, *, notify: str | None = None) -> tuple[Message, bool]:
    """Write one pending message in the caller's transaction; returns (message, created).

    A repeated idempotency key returns the stored message and writes nothing. ``ON CONFLICT DO
    NOTHING`` keeps the caller's transaction usable: a plain unique violation would poison it.
    With ``notify`` (PostgreSQL), the same statement queues a ``NOTIFY`` on that channel if it wrote a row.
    """
    conn = _connection(alias)
    pg = _is_pg(conn)
    params = [
        _prep_uuid(conn, new.uuid),
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
        params += [_prep_dt(conn, new.available_at), _prep_dt(conn, new.created_at)]
    elif new.delay_seconds is None:
        params.append(_prep_dt(conn, new.available_at))
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
                return _to_message(alias, conn, stored), False
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
    return _instance_builder(alias)([values[name] for name in _ATTNAMES])


# --- relaying ----------------------------------------------------------------------------------


def claim(
    alias: str, *, worker: str, limit: int, lease_seconds: float, topics: Sequence[str] | None = None
) -> list[Message]:
    """Lease up to ``limit`` due messages to ``worker`` and count the attempt; committed on return.

    A keyed message is claimed only at the head of its key (see ``claim_sql``), so a batch holds at most
    one message per key. On PostgreSQL a claim that fenced newly visible keyed messages and came back
    short looks once more: those messages usually became claimable the moment the first statement ended.
    """
    conn = _connection(alias)
    messages, fenced = _unprepared_on_loss(
        conn,
        lambda: _claim_once(alias, conn, worker=worker, limit=limit, lease_seconds=lease_seconds, topics=topics),
    )
    if fenced and len(messages) < limit:
        more, _ = _unprepared_on_loss(
            conn,
            lambda: _claim_once(
                alias, conn, worker=worker, limit=limit - len(messages), lease_seconds=lease_seconds, topics=topics
            ),
        )
        messages += more
    messages.sort(key=lambda m: m.id)
    return messages


def blocking_statuses() -> tuple[str, ...]:
    """Statuses of an earlier message that hold back the later messages of its key."""
    from .conf import get_settings

    return (PENDING, PROCESSING) if get_settings().ORDERING == "skip_dead" else (PENDING, PROCESSING, DEAD)


def claim_sql(
    conn: BaseDatabaseWrapper, *, worker: str, limit: int, lease_seconds: float, topics: Sequence[str] | None = None
) -> tuple[str, list[Any]]:
    """The claim statement and its parameters (public so a test can ``EXPLAIN`` it).

    Due pending rows are walked in id order on the partial index of pending rows. A keyed row qualifies
    only when no earlier row of its key is open (pending, processing, or dead under ORDERING "block"),
    probed on the partial index of open keyed rows; keyless rows skip both tests.

    PostgreSQL adds a fence, because ids are taken at insert but rows appear at commit: a lower id of the
    same key may still be invisible in an open transaction. The statement first stamps keyed rows it sees
    for the first time with the claiming transaction's own id (assigned after every id already in use; the
    snapshot's xmax is only "latest completed + 1", below ids still running, so it would not do); every
    transaction that could hold a lower id of their key was running by then, and had its id (insert()
    takes it before the row id). A stamped row is claimable once the snapshot's xmin has reached the stamp:
    no transaction below it is still running, so any lower id of its key is visible or rolled back.

    On PostgreSQL "due" and the lease's end are the server's ``statement_timestamp()`` (plus the lease's
    seconds): a worker whose clock is off neither claims early nor leases for minutes too long or short.
    """
    topic_sql, topic_params = _topic_filter(topics)
    pg = _is_pg(conn)
    sql = _claim_text(pg, topic_sql, blocking_statuses())
    if pg:
        return sql, [*topic_params, limit, worker, float(lease_seconds)]
    now = timezone.now()
    lease = [worker, _prep_dt(conn, now + dt.timedelta(seconds=lease_seconds))]
    return sql, [*lease, _prep_dt(conn, now), *topic_params, limit]


#: The database server's clock in every PostgreSQL statement that decides by time. Not ``now()``, which
#: stands still for a whole transaction (a caller's, in tests and ``relay_all()``); the statement's
#: start, which Django's ``Now()`` also uses.
_SERVER_NOW = "statement_timestamp()"


def _literal(status: str) -> str:
    if not status.isidentifier():  # pragma: no cover - statuses are this module's own constants
        raise ValueError(f"not a status: {status!r}")
    return f"'{status}'"


@functools.cache
def _claim_text(pg: bool, topic_sql: str, blocking: tuple[str, ...]) -> str:
    """The claim's text, built once per shape (building it cost ~40 µs of every wake-up).

    The prepared claim is still planned afresh for each execution, on purpose: only with the actual
    time and limit does the planner see that walking the pending index in id order is cheapest, and a
    generic plan chosen while few messages were pending (a sort of every due row) would be kept for the
    connection's life, however large the backlog grew. Statuses are literals, which the partial
    indexes' predicates can be matched against in any plan.
    """
    pending, processing = _literal(PENDING), _literal(PROCESSING)
    head = (
        f"NOT EXISTS (SELECT 1 FROM {MESSAGE} AS b WHERE b.key = c.key AND b.id < c.id"
        f" AND b.key IS NOT NULL AND b.status IN ({', '.join(map(_literal, blocking))}))"
    )
    if not pg:
        set_lease = f"status = {processing}, locked_by = %s, locked_until = %s"
        return (
            f"UPDATE {MESSAGE} SET {set_lease}, attempts = {_next_attempt('attempts')}"
            f" WHERE id IN (SELECT c.id FROM {MESSAGE} AS c WHERE c.status = {pending} AND c.available_at <= %s"
            f"{topic_sql} AND (c.key IS NULL OR {head}) ORDER BY c.id LIMIT %s) RETURNING {COLUMNS}, 0"
        )
    # The claim's commit waits for the disk like any other. Committing it asynchronously saved ~0.2 ms
    # per claim, but a crash could then forget a claim whose attempt number the record's fence relies
    # on: re-issued to another delivery thread of the same worker, it let a late record of the first
    # delivery land on the second's lease (docs/performance.md, rejected optimisations).
    set_lease = f"status = {processing}, locked_by = %s, locked_until = {_SERVER_NOW} + %s * interval '1 second'"
    return (
        f"WITH fence AS (UPDATE {MESSAGE} SET visible_after_xid ="
        f" (SELECT pg_current_xact_id()::text::bigint)"
        f" WHERE id IN (SELECT id FROM {MESSAGE} WHERE status = {pending} AND key IS NOT NULL"
        f" AND visible_after_xid IS NULL ORDER BY id LIMIT {FENCE_BATCH} FOR UPDATE SKIP LOCKED) RETURNING 1),"
        f" picked AS MATERIALIZED (SELECT c.id FROM {MESSAGE} AS c"
        f" WHERE c.status = {pending} AND c.available_at <= {_SERVER_NOW}{topic_sql}"
        f" AND (c.key IS NULL OR (c.visible_after_xid"
        f" <= (SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint) AND {head}))"
        f" ORDER BY c.id LIMIT %s FOR UPDATE OF c SKIP LOCKED),"
        f" claimed AS (UPDATE {MESSAGE} AS m SET {set_lease},"
        f" attempts = {_next_attempt('m.attempts')} FROM picked WHERE m.id = picked.id"
        f" RETURNING {', '.join('m.' + c for c in _COLUMN_NAMES)})"
        f" SELECT claimed.*, (SELECT count(*) FROM fence)"
        f" FROM (SELECT 1) AS one LEFT JOIN claimed ON true"
    )


#: The attempt counter stops at the integer column's largest value: past it, ``attempts + 1`` failed the
#: whole claim on PostgreSQL ("integer out of range"), so one row kept every worker from claiming
#: anything. A message claimed at this count has used up any ``max_attempts`` and goes dead.
ATTEMPTS_MAX = 2**31 - 1


def _next_attempt(column: str) -> str:
    """The claim's new attempt count; a CASE, since ``LEAST(attempts + 1, ...)`` overflows before LEAST."""
    return f"CASE WHEN {column} < {ATTEMPTS_MAX} THEN {column} + 1 ELSE {column} END"


#: Keyed rows one claim stamps at most; each is stamped once in its life.
FENCE_BATCH = 1000


def _claim_once(
    alias: str,
    conn: BaseDatabaseWrapper,
    *,
    worker: str,
    limit: int,
    lease_seconds: float,
    topics: Sequence[str] | None,
) -> tuple[list[Message], int]:
    sql, params = claim_sql(conn, worker=worker, limit=limit, lease_seconds=lease_seconds, topics=topics)
    with _worker_cursor(conn) as cursor:
        with _walking_plan(conn):
            cursor.execute(sql, params)
        rows = cursor.fetchall()
    fenced = int(rows[0][-1]) if rows and _is_pg(conn) else 0
    return _to_messages(alias, conn, (row[:-1] for row in rows if row[0] is not None)), fenced


_PLAN_AS_A_WALK = (
    "SELECT set_config('enable_sort', 'off', true), set_config('plan_cache_mode', 'force_custom_plan', true)"
)


@contextlib.contextmanager
def _walking_plan(conn: BaseDatabaseWrapper) -> Iterator[None]:
    """Plan the claim with sorting disabled, in the same round trip, so it walks the pending index.

    The claim takes the first due messages in id order. Walking the partial index of pending rows
    reads about one batch however long the backlog. Whenever its estimates say few rows are pending,
    the planner prefers to collect every due row and sort them: on a table PostgreSQL has not analyzed
    yet (a new deployment, or after ``pg_upgrade``, which keeps no statistics), each claim sorted the
    whole backlog (18 ms per batch of 100 from a 40,000-message backlog, against 4 ms;
    docs/performance.md), until autovacuum analyzed the table.

    ``enable_sort = off`` is set for the claim's transaction only (``SET LOCAL``), with
    ``plan_cache_mode = force_custom_plan`` so that the prepared claim never settles on a generic plan
    made under either setting: sent in the same pipeline, the statements share PostgreSQL's implicit
    transaction and one round trip. Inside a transaction of the caller's (tests, ``relay_all()``) the
    claim is planned as usual. In the pipeline a failing claim raises when the pipeline closes, after
    Django's execute wrappers have returned: they see the claim sent, not its outcome.
    """
    raw = conn.connection
    if (
        psycopg is None
        or not _is_pg(conn)
        or not isinstance(raw, psycopg.Connection)
        or conn.in_atomic_block
        or not conn.get_autocommit()
        or not psycopg.Pipeline.is_supported()
    ):
        yield
        return
    with conn.wrap_database_errors, raw.pipeline():
        raw.execute(_PLAN_AS_A_WALK)
        yield


def record(alias: str, *, worker: str, outcomes: Sequence[Outcome]) -> set[int]:
    """Store the outcomes of a batch and their attempt rows; returns the ids whose lease was lost.

    An outcome changes its message only while ``worker`` still holds the lease for that very attempt
    (fencing on ``locked_by`` and ``attempts``). The attempt row is written either way: the audit log
    keeps what really happened, including a delivery whose lease had already been taken away.

    A retry is due ``retry_delay`` seconds after the record, on the database server's clock (PostgreSQL),
    and ``delivered_at`` is the server's time of the record.
    """
    if not outcomes:
        return set()
    conn = _connection(alias)
    if _is_pg(conn):
        return _unprepared_on_loss(conn, lambda: _record_pg(conn, worker, outcomes))
    return _record_generic(conn, worker, outcomes, timezone.now())


_LEASE_LOST = "lease lost before this outcome was recorded; the message was requeued and may be delivered again"
_LEFT_THE_TABLE = (
    "the message had left the message table (archived) before this outcome was recorded, so it is kept beside "
    "the archived message; the message was not changed"
)


#: The record of a batch, one statement. The outcomes travel as one JSON document: psycopg dumped eight
#: parameter arrays element by element in Python (~1.4 ms per batch of 100, more than the statement's own
#: execution), where ``json.dumps`` takes ~0.4 ms. A retry's delay is seconds, added to the server's clock
#: in the statement. Attempt times are ISO 8601 text, which PostgreSQL reads as it read a bound timestamp
#: (a naive one, under ``USE_TZ = False``, in the session's time zone). Statuses are literals, so the
#: prepared statement settles on its generic plan (primary-key lookups).
_RECORD_PG = f"""
    WITH o AS (
        SELECT * FROM json_to_recordset(%s::json)
            AS o(id bigint, number int, status text, retry_delay float8, error text,
                 started_at timestamptz, finished_at timestamptz, outcome text)
    ), upd AS (
        UPDATE {MESSAGE} AS m SET
            status = o.status,
            available_at = COALESCE({_SERVER_NOW} + o.retry_delay * interval '1 second', m.available_at),
            delivered_at = CASE WHEN o.status = {_literal(DELIVERED)} THEN {_SERVER_NOW} ELSE m.delivered_at END,
            last_error = CASE WHEN o.status = {_literal(DELIVERED)} THEN m.last_error ELSE o.error END,
            locked_by = NULL, locked_until = NULL
        FROM o
        WHERE m.id = o.id AND m.attempts = o.number AND m.locked_by = %s AND m.status = {_literal(PROCESSING)}
        RETURNING m.id
    ), here AS (
        SELECT o.*, upd.id IS NULL AS lost,
               upd.id IS NOT NULL OR EXISTS (SELECT 1 FROM {MESSAGE} AS h WHERE h.id = o.id) AS in_table
        FROM o LEFT JOIN upd ON upd.id = o.id
    ), ins AS (
        INSERT INTO {ATTEMPT} (message_id, number, started_at, finished_at, worker, outcome, error)
        SELECT id, number, started_at, finished_at, %s, outcome,
               CASE WHEN lost THEN concat_ws(E'\\n', %s::text, NULLIF(error, '')) ELSE error END
        FROM here WHERE in_table
    ), beside_the_archived AS (
        INSERT INTO {ARCHIVED_ATTEMPT} (id, message_id, number, started_at, finished_at, worker, outcome, error,
                                        archived_at)
        SELECT nextval(pg_get_serial_sequence('{ATTEMPT}', 'id')), here.id, here.number, here.started_at,
               here.finished_at, %s, here.outcome, concat_ws(E'\\n', %s::text, NULLIF(here.error, '')),
               a.archived_at
        FROM here JOIN {ARCHIVED_MESSAGE} AS a ON a.id = here.id WHERE NOT here.in_table
    )
    SELECT id FROM here WHERE lost
"""


def _after(now: dt.datetime, delay: float) -> dt.datetime:
    """``now`` plus a retry delay, capped at the last time a ``DateTimeField`` holds."""
    try:
        return now + dt.timedelta(seconds=retry_seconds(delay))
    except OverflowError:
        return dt.datetime.max.replace(tzinfo=now.tzinfo)


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _storable_text(text: str) -> str:
    """Text PostgreSQL stores as given: a NUL (refused in text) and lone surrogates (not UTF-8) become
    visible escapes. Error texts come from exceptions, which may carry either; left in, they made the
    record fail and the message stay leased. Applied here, where every outcome passes."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _record_pg(conn: BaseDatabaseWrapper, worker: str, outcomes: Sequence[Outcome]) -> set[int]:
    rows = [
        {
            "id": o.message_id,
            "number": o.number,
            "status": o.status,
            "retry_delay": None if o.retry_delay is None else retry_seconds(o.retry_delay),
            "error": _storable_text(o.error),
            "started_at": _iso(o.started_at),
            "finished_at": _iso(o.finished_at),
            "outcome": o.attempt_outcome,
        }
        for o in outcomes
    ]
    with _worker_cursor(conn) as cursor:
        cursor.execute(
            _RECORD_PG, [json.dumps(rows, ensure_ascii=False), worker, worker, _LEASE_LOST, worker, _LEFT_THE_TABLE]
        )
        return {row[0] for row in cursor.fetchall()}


def _record_generic(conn: BaseDatabaseWrapper, worker: str, outcomes: Sequence[Outcome], now: dt.datetime) -> set[int]:
    lost: set[int] = set()
    with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
        for o in outcomes:
            if o.status == DELIVERED:
                cursor.execute(
                    f"UPDATE {MESSAGE} SET status = %s, delivered_at = %s, locked_by = NULL, locked_until = NULL"
                    f" WHERE id = %s AND attempts = %s AND locked_by = %s AND status = %s",
                    [DELIVERED, _prep_dt(conn, now), o.message_id, o.number, worker, PROCESSING],
                )
            else:
                cursor.execute(
                    f"UPDATE {MESSAGE} SET status = %s, available_at = COALESCE(%s, available_at),"
                    f" last_error = %s, locked_by = NULL, locked_until = NULL"
                    f" WHERE id = %s AND attempts = %s AND locked_by = %s AND status = %s",
                    [
                        o.status,
                        None if o.retry_delay is None else _prep_dt(conn, _after(now, o.retry_delay)),
                        _storable_text(o.error),
                        o.message_id,
                        o.number,
                        worker,
                        PROCESSING,
                    ],
                )
            if cursor.rowcount != 1:
                lost.add(o.message_id)
        gone = _gone(cursor, lost)
        cursor.executemany(
            _INSERT_ATTEMPT,
            [
                _attempt_row(conn, worker, o, note=_LEASE_LOST if o.message_id in lost else "")
                for o in outcomes
                if o.message_id not in gone
            ],
        )
        for o in outcomes:
            if o.message_id in gone:
                _keep_beside_the_archived(conn, cursor, worker, o)
    return lost


_INSERT_ATTEMPT = (
    f"INSERT INTO {ATTEMPT} (message_id, number, started_at, finished_at, worker, outcome, error)"
    f" VALUES (%s, %s, %s, %s, %s, %s, %s)"
)


def _attempt_row(conn: BaseDatabaseWrapper, worker: str, o: Outcome, *, note: str) -> tuple[Any, ...]:
    """The parameters of ``_INSERT_ATTEMPT`` for one outcome, ``note`` (if any) before its error."""
    return (
        o.message_id,
        o.number,
        _prep_dt(conn, o.started_at),
        _prep_dt(conn, o.finished_at),
        worker,
        o.attempt_outcome,
        _storable_text("\n".join(filter(None, [note, o.error]))),
    )


def _gone(cursor: Any, lost: set[int]) -> set[int]:
    """Of the messages whose lease was lost, those no longer in the message table (archived meanwhile)."""
    if not lost:
        return set()
    ids = sorted(lost)
    cursor.execute(f"SELECT id FROM {MESSAGE} WHERE id IN ({', '.join(['%s'] * len(ids))})", ids)
    return set(ids) - {row[0] for row in cursor.fetchall()}


def _keep_beside_the_archived(conn: BaseDatabaseWrapper, cursor: Any, worker: str, o: Outcome) -> None:
    """SQLite: the attempt of a message archived meanwhile goes to the archive, with an attempt id of its own.

    The id comes from the attempt table's own sequence (a row inserted there and moved at once, inside
    this transaction, whose foreign keys SQLite checks only at commit), so it never collides with the id
    of an attempt archived later. A message deleted outright (delete mode) has nothing to keep it beside.
    """
    cursor.execute(f"SELECT archived_at FROM {ARCHIVED_MESSAGE} WHERE id = %s", [o.message_id])
    row = cursor.fetchone()
    if row is None:
        return
    cursor.execute(_INSERT_ATTEMPT, _attempt_row(conn, worker, o, note=_LEFT_THE_TABLE))
    attempt_id = cursor.lastrowid
    cursor.execute(
        f"INSERT INTO {ARCHIVED_ATTEMPT} (id, message_id, number, started_at, finished_at, worker, outcome, error,"
        f" archived_at) SELECT id, message_id, number, started_at, finished_at, worker, outcome, error, %s"
        f" FROM {ATTEMPT} WHERE id = %s",
        [row[0], attempt_id],
    )
    cursor.execute(f"DELETE FROM {ATTEMPT} WHERE id = %s", [attempt_id])


def release(alias: str, *, worker: str, message_ids: Iterable[int]) -> int:
    """Hand claimed messages that were never started back, as if they had not been claimed."""
    ids = list(message_ids)
    if not ids:
        return 0
    conn = _connection(alias)
    placeholders = ", ".join(["%s"] * len(ids))
    with conn.cursor() as cursor:
        cursor.execute(
            f"UPDATE {MESSAGE} SET status = %s, attempts = attempts - 1, locked_by = NULL, locked_until = NULL"
            f" WHERE id IN ({placeholders}) AND locked_by = %s AND status = %s",
            [PENDING, *ids, worker, PROCESSING],
        )
        return int(cursor.rowcount)


def extend_leases(alias: str, *, worker: str, lease_seconds: float) -> int:
    """Keep a healthy worker's slow deliveries from being reaped: one statement for all it holds."""
    conn = _connection(alias)
    if _is_pg(conn):  # the lease's end on the server's clock, as the claim set it
        until_sql, until = f"{_SERVER_NOW} + %s * interval '1 second'", float(lease_seconds)
    else:
        until_sql, until = "%s", _prep_dt(conn, timezone.now() + dt.timedelta(seconds=lease_seconds))
    with conn.cursor() as cursor:
        cursor.execute(
            f"UPDATE {MESSAGE} SET locked_until = {until_sql} WHERE locked_by = %s AND status = %s",
            [until, worker, PROCESSING],
        )
        return int(cursor.rowcount)


def reap(alias: str, *, limit: int = 500) -> list[Reaped]:
    """Requeue messages whose lease expired (their worker died) and log the lost attempt as abandoned.

    Messages that used up their attempts go ``dead`` instead. Safe to run from every worker at once.
    On PostgreSQL "expired" is judged on the server's clock, which also set the lease: a reaper whose
    clock runs ahead takes no live lease, one whose clock runs behind leaves no dead one waiting.
    """
    conn = _connection(alias)
    if _is_pg(conn):
        sql = f"""
            WITH e AS MATERIALIZED (
                SELECT id, locked_by, locked_until FROM {MESSAGE}
                WHERE status = %s AND locked_until < {_SERVER_NOW} ORDER BY locked_until LIMIT %s
                FOR UPDATE SKIP LOCKED
            ), upd AS (
                UPDATE {MESSAGE} AS m SET
                    status = CASE WHEN m.attempts >= m.max_attempts THEN %s ELSE %s END,
                    available_at = {_SERVER_NOW}, locked_by = NULL, locked_until = NULL,
                    last_error = 'abandoned: lease of worker ' || COALESCE(e.locked_by, '?') || ' expired at '
                                 || to_char(e.locked_until AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC'
                FROM e WHERE m.id = e.id
                RETURNING m.id, m.attempts, m.status, e.locked_by, m.last_error
            ), ins AS (
                INSERT INTO {ATTEMPT} (message_id, number, started_at, finished_at, worker, outcome, error)
                SELECT id, attempts, {_SERVER_NOW}, {_SERVER_NOW}, COALESCE(locked_by, ''), %s,
                       last_error || ': the worker stopped without recording an outcome'
                FROM upd
            )
            SELECT id, status, locked_by FROM upd
        """
        params = [PROCESSING, limit, DEAD, PENDING, Attempt.Outcome.ABANDONED]
        with conn.cursor() as cursor:
            cursor.execute(sql, params)  # type: ignore[arg-type]
            return [Reaped(message_id=r[0], status=r[1], previous_worker=r[2] or "") for r in cursor.fetchall()]
    reaped = []
    now = timezone.now()
    with transaction.atomic(using=alias), conn.cursor() as cursor:
        cursor.execute(
            f"SELECT id, attempts, max_attempts, locked_by, locked_until FROM {MESSAGE}"
            f" WHERE status = %s AND locked_until < %s ORDER BY locked_until LIMIT %s",
            [PROCESSING, _prep_dt(conn, now), limit],
        )
        for message_id, attempts, max_attempts, locked_by, locked_until in cursor.fetchall():
            status = DEAD if attempts >= max_attempts else PENDING
            error = f"abandoned: lease of worker {locked_by or '?'} expired at {str(locked_until)[:19]} UTC"
            cursor.execute(
                f"UPDATE {MESSAGE} SET status = %s, available_at = %s, locked_by = NULL, locked_until = NULL,"
                f" last_error = %s WHERE id = %s AND status = %s AND attempts = %s",
                [status, _prep_dt(conn, now), error, message_id, PROCESSING, attempts],
            )
            if cursor.rowcount != 1:
                continue
            cursor.execute(
                f"INSERT INTO {ATTEMPT} (message_id, number, started_at, finished_at, worker, outcome, error)"
                f" VALUES (%s, %s, %s, %s, %s, %s, %s)",
                [
                    message_id,
                    attempts,
                    _prep_dt(conn, now),
                    _prep_dt(conn, now),
                    locked_by or "",
                    Attempt.Outcome.ABANDONED,
                    error + ": the worker stopped without recording an outcome",
                ],
            )
            reaped.append(Reaped(message_id=message_id, status=status, previous_worker=locked_by or ""))
    return reaped


#: How soon an idle worker looks again while a due keyed message waits only for the commit-order fence:
#: it becomes claimable when older transactions end, and nothing announces that.
FENCE_RECHECK = dt.timedelta(milliseconds=100)


def next_due(alias: str, *, topics: Sequence[str] | None = None) -> float | None:
    """Seconds until an idle worker should look again: until the earliest future ``available_at`` of a
    pending message, or, on PostgreSQL, ``FENCE_RECHECK`` while a due keyed message waits only for the
    fence. None when nothing is scheduled.

    On PostgreSQL the wait is measured on the server's clock, which the claim's "due" test uses, so a
    worker sleeps the right time whatever its own clock says.
    """
    conn = _connection(alias)
    topic_sql, topic_params = _topic_filter(topics)
    pg = _is_pg(conn)
    now = None if pg else timezone.now()
    # Only the future counts: a message due now that the claim left behind is held behind an earlier
    # message of its key, and is woken by that message's outcome, not by the clock.
    if pg:
        sql = (
            f"SELECT extract(epoch FROM MIN(available_at) - {_SERVER_NOW})::float8 FROM {MESSAGE}"
            f" WHERE status = %s AND available_at > {_SERVER_NOW}{topic_sql}"
        )
        fenced_sql, fenced_params = _fenced_heads_sql(conn, topics)
        sql = f"SELECT ({sql}), EXISTS ({fenced_sql})"
        params: list[Any] = [PENDING, *topic_params, *fenced_params]
    else:
        sql = f"SELECT MIN(available_at) FROM {MESSAGE} WHERE status = %s AND available_at > %s{topic_sql}"
        params = [PENDING, _prep_dt(conn, now), *topic_params]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    value = row[0] if row else None
    wait: float | None
    if value is None:
        wait = None
    elif pg:
        wait = max(0.0, float(value))
    else:
        if isinstance(value, str):  # SQLite returns the stored text for an aggregate
            from django.utils.dateparse import parse_datetime

            value = parse_datetime(value)
        if value is not None and settings.USE_TZ and timezone.is_naive(value):  # SQLite's text is UTC
            value = timezone.make_aware(value, dt.UTC)
        wait = None if value is None or now is None else max(0.0, (value - now).total_seconds())
    if row is not None and len(row) > 1 and row[1]:
        recheck = FENCE_RECHECK.total_seconds()
        wait = recheck if wait is None else min(wait, recheck)
    return wait


def _fenced_heads_sql(conn: BaseDatabaseWrapper, topics: Sequence[str] | None) -> tuple[str, list[Any]]:
    """PostgreSQL: a due keyed message at the head of its key that only the commit-order fence holds
    back (not yet stamped, or stamped above the oldest running transaction)."""
    topic_sql, topic_params = _topic_filter(topics, column="c.topic")
    blocking = blocking_statuses()
    sql = (
        f"SELECT 1 FROM {MESSAGE} AS c WHERE c.status = %s AND c.available_at <= {_SERVER_NOW}{topic_sql}"
        f" AND c.key IS NOT NULL"
        f" AND (c.visible_after_xid IS NULL"
        f" OR c.visible_after_xid > pg_snapshot_xmin(pg_current_snapshot())::text::bigint)"
        f" AND NOT EXISTS (SELECT 1 FROM {MESSAGE} AS b WHERE b.key = c.key AND b.id < c.id"
        f" AND b.status IN ({', '.join(['%s'] * len(blocking))})) LIMIT 1"
    )
    return sql, [PENDING, *topic_params, *blocking]


def work_in_progress(alias: str, *, topics: Sequence[str] | None = None) -> bool:
    """Whether a worker that found nothing to claim must still wait rather than call the outbox empty.

    True while a message is being processed (it may fail and come back), and on PostgreSQL while a due
    keyed message at the head of its key waits only for the commit-order fence: it becomes claimable as
    soon as the transactions that were open when it was first seen have ended. Messages scheduled for
    later, or held behind an earlier message of their key, do not count.
    """
    conn = _connection(alias)
    topic_sql, topic_params = _topic_filter(topics)
    with conn.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {MESSAGE} WHERE status = %s{topic_sql} LIMIT 1", [PROCESSING, *topic_params])
        if cursor.fetchone() is not None:
            return True
        if not _is_pg(conn):
            return False
        fenced_sql, fenced_params = _fenced_heads_sql(conn, topics)
        cursor.execute(fenced_sql, fenced_params)
        return cursor.fetchone() is not None


# --- workers -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerBeat:
    worker_id: str
    hostname: str
    pid: int
    started_at: dt.datetime
    in_flight: int
    delivered: int
    failed: int
    stopped: bool = False
    housekeeping_failures: int = 0
    housekeeping_error: str = ""


def heartbeat(alias: str, beat: WorkerBeat) -> None:
    """Upsert the worker's row. On PostgreSQL its times are the server's: liveness (``last_seen``) is then
    judged against the server's clock by ``outbox_status`` and the admin, whatever the hosts' clocks."""
    conn = _connection(alias)
    params: list[Any]
    if _is_pg(conn):
        started, seen = _SERVER_NOW, _SERVER_NOW  # started: the first beat's time, kept by later ones
        stopped = _SERVER_NOW if beat.stopped else "NULL"
        params = [beat.worker_id, beat.hostname, beat.pid, beat.in_flight, beat.delivered, beat.failed]
    else:
        now = _prep_dt(conn, timezone.now())
        started, seen, stopped = "%s", "%s", "%s"
        params = [
            beat.worker_id,
            beat.hostname,
            beat.pid,
            _prep_dt(conn, beat.started_at),
            now,
            beat.in_flight,
            beat.delivered,
            beat.failed,
            now if beat.stopped else None,
        ]
    with conn.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {WORKER} (worker_id, hostname, pid, started_at, last_seen, in_flight, delivered, failed,"
            f" stopped_at, housekeeping_failures, housekeeping_error)"
            f" VALUES (%s, %s, %s, {started}, {seen}, %s, %s, %s, {stopped}, %s, %s)"
            f" ON CONFLICT (worker_id) DO UPDATE SET last_seen = EXCLUDED.last_seen,"
            f" in_flight = EXCLUDED.in_flight, delivered = EXCLUDED.delivered, failed = EXCLUDED.failed,"
            f" stopped_at = EXCLUDED.stopped_at, housekeeping_failures = EXCLUDED.housekeeping_failures,"
            f" housekeeping_error = EXCLUDED.housekeeping_error",
            [*params, beat.housekeeping_failures, _storable_text(beat.housekeeping_error)],
        )


def database_now(alias: str) -> dt.datetime:
    """The clock the outbox's decisions use: the server's on PostgreSQL, this host's on SQLite. For views
    that compare stored times with "now" (the overview, ``outbox_status``): one query, off the hot path."""
    conn = _connection(alias)
    if not _is_pg(conn):
        return timezone.now()
    with conn.cursor() as cursor:
        cursor.execute(f"SELECT {_SERVER_NOW}")
        row = cursor.fetchone()
    value: dt.datetime = row[0]
    return value


# --- operator actions (admin, management commands) ---------------------------------------------


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
            "available_at": Now() if _is_pg(_connection(alias)) else timezone.now(),
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
            available_at=Now() if _is_pg(_connection(alias)) else timezone.now(),
            locked_by=None,
            locked_until=None,
        )
        if allowed:
            notify_on_commit(alias)  # a cancelled head lets its key's next message go: wake idle workers
    return ActionResult(changed=sorted(allowed), refused=sorted(set(ids) - set(allowed)))


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
