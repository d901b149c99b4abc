"""Recording outcomes: what happened to each claimed message, and its attempt row, fenced on the lease.

Attempt start and finish times are the worker's own (docs/worker.md); a retry's due time and
``delivered_at`` are the database's.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from .cursors import unprepared_on_loss, worker_cursor
from .db import (
    ARCHIVED_ATTEMPT,
    ARCHIVED_MESSAGE,
    ATTEMPT,
    DELIVERED,
    MESSAGE,
    PROCESSING,
    SERVER_NOW,
    connection,
    decision_now,
    is_mysql,
    is_pg,
    literal,
    prep_dt,
    storable_text,
)
from .models import Attempt


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
    conn = connection(alias)
    if is_pg(conn):
        return unprepared_on_loss(conn, lambda: _record_pg(conn, worker, outcomes))
    return _record_generic(conn, worker, outcomes, decision_now(conn))


_LEASE_LOST = "lease lost before this outcome was recorded; the message was requeued and may be delivered again"
_LEFT_THE_TABLE = (
    "the message had left the message table (archived) before this outcome was recorded, so it is kept beside "
    "the archived message; the message was not changed"
)


#: The record of a batch, one statement. The outcomes travel as one JSON document: psycopg dumped eight
#: parameter arrays element by element in Python (~1.4 ms per batch of 100, more than the statement's own
#: execution), where ``json.dumps`` takes ~0.4 ms. Each outcome is an array, not an object: without the
#: eight keys ``json.dumps`` takes less than half as long (docs/performance.md), and ``jsonb`` reads an
#: array element by its position in constant time. A retry's delay is seconds, added to the server's clock
#: in the statement. Attempt times are ISO 8601 text, which PostgreSQL reads as it read a bound timestamp
#: (a naive one, under ``USE_TZ = False``, in the session's time zone). Statuses are literals, so the
#: prepared statement settles on its generic plan (primary-key lookups).
_RECORD_PG = f"""
    WITH o AS (
        SELECT (e->>0)::bigint AS id, (e->>1)::int AS number, e->>2 AS status, (e->>3)::float8 AS retry_delay,
               e->>4 AS error, (e->>5)::timestamptz AS started_at, (e->>6)::timestamptz AS finished_at,
               e->>7 AS outcome
        FROM jsonb_array_elements(%s::jsonb) AS e
    ), upd AS (
        UPDATE {MESSAGE} AS m SET
            status = o.status,
            available_at = COALESCE({SERVER_NOW} + o.retry_delay * interval '1 second', m.available_at),
            delivered_at = CASE WHEN o.status = {literal(DELIVERED)} THEN {SERVER_NOW} ELSE m.delivered_at END,
            last_error = CASE WHEN o.status = {literal(DELIVERED)} THEN m.last_error ELSE o.error END,
            locked_by = NULL, locked_until = NULL
        FROM o
        WHERE m.id = o.id AND m.attempts = o.number AND m.locked_by = %s AND m.status = {literal(PROCESSING)}
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


_UNSEEN = ""  # never an ISO timestamp


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _record_pg(conn: BaseDatabaseWrapper, worker: str, outcomes: Sequence[Outcome]) -> set[int]:
    # The columns of ``_RECORD_PG``'s ``o``, in order. A time shared by several outcomes (a batch's
    # delivery) is formatted once.
    times: dict[dt.datetime | None, str | None] = {}

    def iso(value: dt.datetime | None) -> str | None:
        text = times.get(value, _UNSEEN)
        if text is _UNSEEN:
            text = times[value] = _iso(value)
        return text

    rows = [
        [
            o.message_id,
            o.number,
            o.status,
            None if o.retry_delay is None else retry_seconds(o.retry_delay),
            storable_text(o.error) if o.error else "",
            iso(o.started_at),
            iso(o.finished_at),
            o.attempt_outcome,
        ]
        for o in outcomes
    ]
    with worker_cursor(conn) as cursor:
        cursor.execute(
            _RECORD_PG, [json.dumps(rows, ensure_ascii=False), worker, worker, _LEASE_LOST, worker, _LEFT_THE_TABLE]
        )
        return {row[0] for row in cursor.fetchall()}


def _record_generic(conn: BaseDatabaseWrapper, worker: str, outcomes: Sequence[Outcome], now: dt.datetime) -> set[int]:
    lost: set[int] = set()
    with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
        one_by_one = outcomes
        if is_mysql(conn):
            lost |= _record_delivered_mysql(cursor, worker, [o for o in outcomes if o.status == DELIVERED], now, conn)
            one_by_one = [o for o in outcomes if o.status != DELIVERED]
        for o in one_by_one:
            if o.status == DELIVERED:
                cursor.execute(
                    f"UPDATE {MESSAGE} SET status = %s, delivered_at = %s, locked_by = NULL, locked_until = NULL"
                    f" WHERE id = %s AND attempts = %s AND locked_by = %s AND status = %s",
                    [DELIVERED, prep_dt(conn, now), o.message_id, o.number, worker, PROCESSING],
                )
            else:
                cursor.execute(
                    f"UPDATE {MESSAGE} SET status = %s, available_at = COALESCE(%s, available_at),"
                    f" last_error = %s, locked_by = NULL, locked_until = NULL"
                    f" WHERE id = %s AND attempts = %s AND locked_by = %s AND status = %s",
                    [
                        o.status,
                        None if o.retry_delay is None else prep_dt(conn, _after(now, o.retry_delay)),
                        storable_text(o.error),
                        o.message_id,
                        o.number,
                        worker,
                        PROCESSING,
                    ],
                )
            if cursor.rowcount != 1:
                lost.add(o.message_id)
        gone = _gone(cursor, lost)
        rows = [
            _attempt_row(conn, worker, o, note=_LEASE_LOST if o.message_id in lost else "")
            for o in outcomes
            if o.message_id not in gone
        ]
        if is_mysql(conn) and rows:
            _insert_attempts_mysql(cursor, conn, worker, rows)
        else:
            cursor.executemany(_INSERT_ATTEMPT, rows)
        for o in outcomes:
            if o.message_id in gone:
                _keep_beside_the_archived(conn, cursor, worker, o)
    return lost


def _record_delivered_mysql(
    cursor: Any, worker: str, delivered: Sequence[Outcome], now: dt.datetime, conn: BaseDatabaseWrapper
) -> set[int]:
    """MariaDB/MySQL: the batch's deliveries in one fenced ``UPDATE``, not one each; the lost ids.

    There is no ``UPDATE ... RETURNING`` there. The statement's fence is each message's own: held by
    this worker, still processing, at this attempt's number (a ``CASE`` on the id). Its row count (the
    rows it matched: Django sets ``CLIENT.FOUND_ROWS``) says whether it missed any, which is rare (a
    reaped lease); only then does a second statement ask which rows carry this very record's mark
    (delivered at its time, at the attempt's number), under the locks the ``UPDATE`` took. Per-outcome
    statements made the record three quarters of a MariaDB drain (104 statements per batch of 100); a
    ``SELECT ... FOR UPDATE`` of the held rows before the ``UPDATE`` cost a statement per batch more.
    """
    if not delivered:
        return set()
    # Integers from the claim, written into the text: a hundred escaped parameters were a third of the
    # record's Python time.
    ids = ", ".join(str(int(o.message_id)) for o in delivered)
    numbers = " ".join(f"WHEN {int(o.message_id)} THEN {int(o.number)}" for o in delivered)
    stamp = prep_dt(conn, now)
    cursor.execute(
        f"UPDATE {MESSAGE} SET status = %s, delivered_at = %s, locked_by = NULL, locked_until = NULL"
        f" WHERE id IN ({ids}) AND locked_by = %s AND status = %s AND attempts = CASE id {numbers} END",
        [DELIVERED, stamp, worker, PROCESSING],
    )
    if cursor.rowcount == len(delivered):
        return set()
    cursor.execute(
        f"SELECT id FROM {MESSAGE} WHERE id IN ({ids}) AND status = %s AND delivered_at = %s"
        f" AND attempts = CASE id {numbers} END",
        [DELIVERED, stamp],
    )
    ours = {int(row[0]) for row in cursor.fetchall()}
    return {o.message_id for o in delivered if o.message_id not in ours}


def _insert_attempts_mysql(
    cursor: Any, conn: BaseDatabaseWrapper, worker: str, rows: Sequence[tuple[Any, ...]]
) -> None:
    """MariaDB/MySQL: a batch's attempt rows in one statement with one parameter, a JSON document read
    with ``JSON_TABLE`` (MariaDB 10.6+, MySQL 8.0.4+), where ``executemany`` escaped seven values a row
    (a quarter of the worker's Python time per message on MariaDB)."""
    document = json.dumps([[r[0], r[1], r[2], r[3], r[5], r[6]] for r in rows], ensure_ascii=False)
    cursor.execute(
        f"INSERT INTO {ATTEMPT} (message_id, number, started_at, finished_at, worker, outcome, error)"
        f" SELECT j.message_id, j.number, j.started_at, j.finished_at, %s, j.outcome, j.error"
        f" FROM JSON_TABLE(%s, '$[*]' COLUMNS (message_id BIGINT PATH '$[0]', number INT PATH '$[1]',"
        f" started_at DATETIME(6) PATH '$[2]', finished_at DATETIME(6) PATH '$[3]',"
        f" outcome VARCHAR(16) PATH '$[4]', error LONGTEXT PATH '$[5]')) AS j",
        [worker, document],
    )


_INSERT_ATTEMPT = (
    f"INSERT INTO {ATTEMPT} (message_id, number, started_at, finished_at, worker, outcome, error)"
    f" VALUES (%s, %s, %s, %s, %s, %s, %s)"
)


def _attempt_row(conn: BaseDatabaseWrapper, worker: str, o: Outcome, *, note: str) -> tuple[Any, ...]:
    """The parameters of ``_INSERT_ATTEMPT`` for one outcome, ``note`` (if any) before its error."""
    return (
        o.message_id,
        o.number,
        prep_dt(conn, o.started_at),
        prep_dt(conn, o.finished_at),
        worker,
        o.attempt_outcome,
        storable_text("\n".join(filter(None, [note, o.error]))),
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
    if conn.vendor == "mysql":
        # InnoDB checks foreign keys at once, not at commit: for this one row, whose message is archived, the
        # session's check is off (the row leaves the table again below, in the same transaction).
        cursor.execute("SET SESSION foreign_key_checks = 0")
        try:
            cursor.execute(_INSERT_ATTEMPT, _attempt_row(conn, worker, o, note=_LEFT_THE_TABLE))
            attempt_id = cursor.lastrowid  # before the next statement resets it
        finally:
            cursor.execute("SET SESSION foreign_key_checks = 1")
    else:
        cursor.execute(_INSERT_ATTEMPT, _attempt_row(conn, worker, o, note=_LEFT_THE_TABLE))
        attempt_id = cursor.lastrowid
    cursor.execute(
        f"INSERT INTO {ARCHIVED_ATTEMPT} (id, message_id, number, started_at, finished_at, worker, outcome, error,"
        f" archived_at) SELECT id, message_id, number, started_at, finished_at, worker, outcome, error, %s"
        f" FROM {ATTEMPT} WHERE id = %s",
        [row[0], attempt_id],
    )
    cursor.execute(f"DELETE FROM {ATTEMPT} WHERE id = %s", [attempt_id])
