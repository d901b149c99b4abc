"""The cursor the worker's hot statements run on, and the fallback when prepared statements are lost."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper

from .db import is_pg

try:
    import psycopg
except ImportError:  # pragma: no cover - an install without the postgres extra
    psycopg = None  # type: ignore[assignment]

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
    """The server refused one of our prepared statements before running it.

    Its name is taken (PREPARE), unknown (EXECUTE), or names another client's statement on the server
    connection a pooler lent this transaction: then the Bind is refused as a protocol violation ("bind
    message supplies 6 parameters, but prepared statement "_pg3_0" requires 3", or a parameter that does
    not parse as that statement's type).
    """
    cause = exc.__cause__ if isinstance(exc, DatabaseError) and exc.__cause__ is not None else exc
    return psycopg is not None and isinstance(
        cause,
        psycopg.errors.DuplicatePreparedStatement
        | psycopg.errors.InvalidSqlStatementName
        | psycopg.errors.ProtocolViolation,
    )


def unprepared_on_loss(conn: BaseDatabaseWrapper, run: Callable[[], T]) -> T:
    """``run()``, and once more unprepared if its prepared statement did not survive (a pooler).

    These errors come before the statement runs (PostgreSQL refuses the PREPARE, or the Bind of an unknown
    or foreign statement), so running it again is safe: nothing was claimed or recorded twice. From then on this
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


def worker_cursor(conn: BaseDatabaseWrapper) -> Any:
    """A cursor for the claim and the record, which a worker runs all day with the same text.

    Parsing and analysing the claim (three CTEs) took about 2 ms of its 5 ms for a one-message claim,
    every time: Django binds parameters client-side and leaves preparing off, for the sake of connection
    poolers. With ``OUTBOX["PREPARED_STATEMENTS"]`` (on by default) these statements are bound
    server-side and prepared once per connection (docs/performance.md); the record then runs a cached
    generic plan, and so does the claim, whose walking plan's settings leave it no other plan than the walk
    (``claiming.walking_plan``). The wrapper is
    Django's own, so execute wrappers and error translation see them as any other (the claim's errors
    reach its wrappers late: see ``claiming.walking_plan``). Off PostgreSQL or psycopg 3, with the setting off
    (PgBouncer in transaction pooling before 1.21), or while Django logs queries: Django's usual cursor.
    """
    from ..conf import get_settings

    if (
        psycopg is None
        or not is_pg(conn)
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
