"""Retention: finished messages leave the hot table, and the archive forgets them after ``RETENTION``.

Every statement runs in small batches (``BATCH_SIZE`` messages per transaction, locking only those rows
with ``SKIP LOCKED``), so housekeeping never holds a long lock and never competes with the relay.

- ``RETENTION_MODE = "archive"``: delivered and cancelled messages older than ``ARCHIVE_AFTER`` move,
  with their attempts, into the archive tables in one statement per batch. On PostgreSQL the archive is
  partitioned by day of ``archived_at``; partitions are created a few days ahead, and a day whose end
  is more than ``RETENTION`` ago is dropped whole: no mass ``DELETE``, no bloat. On SQLite the archive
  is two plain tables, pruned by batched deletes.
- ``RETENTION_MODE = "delete"``: finished messages stay in the message table until ``RETENTION`` has
  passed, then are deleted in batches with their attempts.

Whatever the mode, the archive forgets what is older than ``RETENTION``: an archive left by an earlier
archive mode is emptied on schedule after a switch to delete mode. Worker rows (heartbeats) not seen for
``WORKER_ROWS_KEPT_FOR`` or ``RETENTION``, whichever is longer, are deleted too. On MariaDB/MySQL the
per-key lock rows a keyed ``send()`` leaves behind are deleted once their key has no open message
(``store.mysql.prune_key_locks``: without it the table keeps one row per key ever sent).

Dead messages are never touched: they stay until an operator retries or cancels them. On PostgreSQL one
process at a time does the work: every unit of work (a batch, a partition's DDL, the worker-row prune) is
a transaction that first takes a *transaction-scoped* advisory lock; a process that finds it taken skips
the round (or stops its own there). A session lock would not hold behind a pooler in transaction pooling
(PgBouncer): taken on one server session and released on another, it stayed held for good, and a second
client on the first session was granted it again.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from ..conf import get_settings
from ..store import mysql
from ..store.db import (  # the archive's table names are part of this module's interface too
    ARCHIVED_ATTEMPT as ARCHIVED_ATTEMPT,
)
from ..store.db import (
    ARCHIVED_MESSAGE as ARCHIVED_MESSAGE,
)
from ..store.db import (
    ATTEMPT,
    CANCELLED,
    DELIVERED,
    MESSAGE,
    WORKER,
    connection,
    is_mysql,
    is_pg,
    prep_dt,
)

logger = logging.getLogger("django_outbox.housekeeping")

#: Messages moved or deleted per transaction.
BATCH_SIZE = 1000
#: Partitions created ahead of today (and one behind, for clocks a little late).
DAYS_AHEAD = 3
#: Arbitrary but fixed: the advisory lock that lets one process at a time do housekeeping.
ADVISORY_LOCK_ID = 0x6F7574626F78  # "outbox"
#: DDL (partition create/drop) gives up rather than queue behind a long reader; the next round retries.
DDL_LOCK_TIMEOUT = "5s"
#: Heartbeat rows of workers not seen for this long (or ``RETENTION``, if longer) are deleted.
WORKER_ROWS_KEPT_FOR = dt.timedelta(days=7)

_PARTITION = re.compile(r"_p(\d{8})$")
_MESSAGE_COLUMNS = (
    "id, uuid, topic, key, payload, headers, idempotency_key, status, attempts, max_attempts,"
    " available_at, created_at, delivered_at, last_error"
)
_ATTEMPT_COLUMNS = "id, message_id, number, started_at, finished_at, worker, outcome, error"


class _Busy(Exception):
    """Another process holds the housekeeping lock: this round stops at the unit it was about to do."""


def _take_turn(conn: BaseDatabaseWrapper, cursor: Any) -> None:
    """Within a unit's transaction (PostgreSQL): this process's turn, held until that transaction ends."""
    if is_pg(conn):
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ADVISORY_LOCK_ID])
        if not cursor.fetchone()[0]:
            raise _Busy


@dataclass(kw_only=True)
class Report:
    skipped: bool = False  # another process holds the housekeeping lock
    archived: int = 0
    deleted: int = 0
    archive_deleted: int = 0  # SQLite: rows pruned from the archive
    partitions_created: list[str] = field(default_factory=list)
    partitions_dropped: list[str] = field(default_factory=list)
    workers_pruned: int = 0  # heartbeat rows of long-gone workers
    key_locks_pruned: int = 0  # MariaDB/MySQL: lock rows of keys with no open message
    finished: bool = True  # False when the time budget ran out with work left

    def __str__(self) -> str:
        if self.skipped:
            return "skipped: another process is doing housekeeping"
        parts = [f"archived {self.archived}", f"deleted {self.deleted}"]
        if self.archive_deleted:
            parts.append(f"pruned {self.archive_deleted} archived")
        if self.partitions_created:
            parts.append(f"created partitions {', '.join(self.partitions_created)}")
        if self.partitions_dropped:
            parts.append(f"dropped partitions {', '.join(self.partitions_dropped)}")
        if self.workers_pruned:
            parts.append(f"pruned {self.workers_pruned} worker rows")
        if self.key_locks_pruned:
            parts.append(f"pruned {self.key_locks_pruned} key lock rows")
        if not self.finished:
            parts.append("(time budget used up; more next round)")
        return ", ".join(parts)


def run(
    alias: str, *, now: dt.datetime | None = None, batch_size: int = BATCH_SIZE, time_budget: float | None = None
) -> Report:
    """One round of housekeeping; ``time_budget`` (seconds) bounds it for a worker's background thread."""
    conn = connection(alias)
    now = _aware(now or timezone.now())
    deadline = None if time_budget is None else time.monotonic() + time_budget
    # SQLite serialises writers: concurrent rounds take turns batch by batch, and each batch is atomic.
    report = Report()
    try:
        _run(conn, now, batch_size, deadline, report)
    except _Busy:
        # Busy at the first unit: another process does this round. Later: it has taken over (ours paused
        # between two units), and goes on from where we stopped.
        done = (report.archived, report.deleted, report.archive_deleted, report.partitions_created)
        if any(done) or report.partitions_dropped or report.workers_pruned or report.key_locks_pruned:
            report.finished = False
        else:
            report.skipped = True
    return report


def _aware(value: dt.datetime) -> dt.datetime:
    """``now`` as an aware datetime: with ``USE_TZ = False`` Django's times are naive, in ``TIME_ZONE``.

    Every comparison below is made on aware values; ``prep_dt`` turns them back into what the
    connection expects.
    """
    return timezone.make_aware(value) if timezone.is_naive(value) else value


def _run(conn: BaseDatabaseWrapper, now: dt.datetime, batch_size: int, deadline: float | None, report: Report) -> None:
    conf = get_settings()
    retention_cutoff = now - conf.RETENTION
    if conf.RETENTION_MODE == "delete":
        report.finished = _batches(conn, retention_cutoff, batch_size, deadline, report, archive=None)
    else:
        if is_pg(conn):
            report.partitions_created = ensure_partitions(conn, now)
        report.finished = _batches(conn, now - conf.ARCHIVE_AFTER, batch_size, deadline, report, archive=now)
    # The archive is emptied in either mode: it may hold messages archived before a switch to "delete".
    if is_pg(conn):
        keep_from = _first_kept_day(now)
        report.partitions_dropped = drop_partitions(conn, older_than=retention_cutoff, keep_from=keep_from)
        # Days whose partitions are kept (see _first_kept_day) may still hold rows older than a short
        # RETENTION: those go row by row, in batches.
        if retention_cutoff > dt.datetime.combine(keep_from, dt.time(), tzinfo=dt.UTC):
            _prune_archive(conn, retention_cutoff, batch_size, deadline, report)
    else:
        _prune_archive(conn, retention_cutoff, batch_size, deadline, report)
    report.workers_pruned = _prune_workers(conn, now - max(conf.RETENTION, WORKER_ROWS_KEPT_FOR))
    if is_mysql(conn) and not _prune_key_locks(conn, batch_size, deadline, report):
        report.finished = False


def _prune_key_locks(conn: BaseDatabaseWrapper, batch_size: int, deadline: float | None, report: Report) -> bool:
    """MariaDB/MySQL: ``send()`` leaves one row per key in ``django_outbox_key_lock`` (store.mysql); the
    rows of keys with no open message go, batch by batch, in key order. Returns whether the walk ended."""
    after: str | None = None
    while True:
        deleted, after = mysql.prune_key_locks(conn, after=after, limit=batch_size)
        report.key_locks_pruned += deleted
        if after is None:
            return True
        if deadline is not None and time.monotonic() > deadline:
            return False


def _first_kept_day(now: dt.datetime) -> dt.date:
    """The first day whose partition ``ensure_partitions`` keeps: dropping it would only recreate it."""
    return now.astimezone(dt.UTC).date() - dt.timedelta(days=1)


def _prune_workers(conn: BaseDatabaseWrapper, cutoff: dt.datetime) -> int:
    with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
        _take_turn(conn, cursor)
        cursor.execute(f"DELETE FROM {WORKER} WHERE last_seen < %s", [prep_dt(conn, cutoff)])
        return int(cursor.rowcount)


def _batches(
    conn: BaseDatabaseWrapper,
    cutoff: dt.datetime,
    batch_size: int,
    deadline: float | None,
    report: Report,
    *,
    archive: dt.datetime | None,
) -> bool:
    """Move (``archive`` = the archiving time) or delete finished messages older than ``cutoff``.

    Counted into ``report`` batch by batch, so that a round stopped half-way reports what it did.
    Returns whether nothing is left.
    """
    while True:
        if is_pg(conn):
            done = _batch_pg(conn, cutoff, batch_size, archive)
        elif is_mysql(conn):
            done = _batch_mysql(conn, cutoff, batch_size, archive)
        else:
            done = _batch_sqlite(conn, cutoff, batch_size, archive)
        if archive is None:
            report.deleted += done
        else:
            report.archived += done
        if done < batch_size:
            return True
        if deadline is not None and time.monotonic() > deadline:
            return False


def _finished_sql(limit_sql: str) -> str:
    # created_at bounds the walk of the partial index; what must be old is when the message became final:
    # delivered_at, or for a cancelled message its available_at, which the cancel set to its own time.
    return (
        f"SELECT id FROM {MESSAGE} WHERE status IN (%s, %s) AND created_at < %s"
        f" AND COALESCE(delivered_at, available_at) < %s ORDER BY created_at {limit_sql}"
    )


def _batch_pg(conn: BaseDatabaseWrapper, cutoff: dt.datetime, batch_size: int, archive: dt.datetime | None) -> int:
    copy = ""
    params: list[Any] = [DELIVERED, CANCELLED, cutoff, cutoff, batch_size]
    if archive is not None:
        copy = (
            f", copied_attempts AS (INSERT INTO {ARCHIVED_ATTEMPT} ({_ATTEMPT_COLUMNS}, archived_at)"
            f" SELECT {_ATTEMPT_COLUMNS}, %s FROM gone_attempts),"
            f" copied AS (INSERT INTO {ARCHIVED_MESSAGE} ({_MESSAGE_COLUMNS}, archived_at)"
            f" SELECT {_MESSAGE_COLUMNS}, %s FROM gone)"
        )
        params += [archive, archive]
    sql = (
        f"WITH doomed AS MATERIALIZED ({_finished_sql('LIMIT %s FOR UPDATE SKIP LOCKED')}),"
        f" gone_attempts AS (DELETE FROM {ATTEMPT} WHERE message_id IN (SELECT id FROM doomed) RETURNING *),"
        f" gone AS (DELETE FROM {MESSAGE} WHERE id IN (SELECT id FROM doomed) RETURNING *){copy}"
        f" SELECT count(*) FROM gone"
    )
    with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
        _take_turn(conn, cursor)
        cursor.execute(sql, params)
        return int(cursor.fetchone()[0])


def _batch_sqlite(conn: BaseDatabaseWrapper, cutoff: dt.datetime, batch_size: int, archive: dt.datetime | None) -> int:
    # Every statement re-reads the same batch: the write lock is held from the first one to the commit.
    batch = _finished_sql("LIMIT %s")
    ids = [DELIVERED, CANCELLED, prep_dt(conn, cutoff), prep_dt(conn, cutoff), batch_size]
    with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
        return _archive_and_delete(conn, cursor, batch, ids, archive)


def _batch_mysql(conn: BaseDatabaseWrapper, cutoff: dt.datetime, batch_size: int, archive: dt.datetime | None) -> int:
    """MariaDB/MySQL: the batch's ids first, locked with ``SKIP LOCKED`` (concurrent rounds share the work
    out); an ``IN`` subquery with ``LIMIT`` is refused there, and a statement may not read the table it
    deletes from."""
    with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
        cursor.execute(
            _finished_sql("LIMIT %s FOR UPDATE SKIP LOCKED"),
            [DELIVERED, CANCELLED, prep_dt(conn, cutoff), prep_dt(conn, cutoff), batch_size],
        )
        ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            return 0
        return _archive_and_delete(conn, cursor, ", ".join(["%s"] * len(ids)), ids, archive)


def _archive_and_delete(
    conn: BaseDatabaseWrapper, cursor: Any, batch: str, params: list[Any], archive: dt.datetime | None
) -> int:
    """The batch's rows copied to the archive (``archive`` = the archiving time; None: deleted only), then
    deleted with their attempts, inside the caller's transaction; returns the messages deleted.

    ``batch`` is what ``id IN (...)`` holds, with ``params`` its values: on SQLite the batch's query,
    re-read by every statement; on MariaDB/MySQL the ids it already locked, one placeholder each.
    """
    if archive is not None:
        when = prep_dt(conn, archive)
        columns = ", ".join(conn.ops.quote_name(c.strip()) for c in _MESSAGE_COLUMNS.split(","))  # `key`
        cursor.execute(
            f"INSERT INTO {ARCHIVED_MESSAGE} ({columns}, archived_at)"
            f" SELECT {columns}, %s FROM {MESSAGE} WHERE id IN ({batch})",
            [when, *params],
        )
        cursor.execute(
            f"INSERT INTO {ARCHIVED_ATTEMPT} ({_ATTEMPT_COLUMNS}, archived_at)"
            f" SELECT {_ATTEMPT_COLUMNS}, %s FROM {ATTEMPT} WHERE message_id IN ({batch})",
            [when, *params],
        )
    cursor.execute(f"DELETE FROM {ATTEMPT} WHERE message_id IN ({batch})", params)
    cursor.execute(f"DELETE FROM {MESSAGE} WHERE id IN ({batch})", params)
    return int(cursor.rowcount)


def _prune_archive_mysql(
    conn: BaseDatabaseWrapper, cutoff: dt.datetime, batch_size: int, deadline: float | None, report: Report
) -> None:
    when = prep_dt(conn, cutoff)
    while True:
        with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
            cursor.execute(
                f"SELECT id FROM {ARCHIVED_MESSAGE} WHERE archived_at < %s ORDER BY archived_at LIMIT %s"
                " FOR UPDATE SKIP LOCKED",
                [when, batch_size],
            )
            ids = [row[0] for row in cursor.fetchall()]
            done = 0
            if ids:
                batch = ", ".join(["%s"] * len(ids))
                cursor.execute(f"DELETE FROM {ARCHIVED_ATTEMPT} WHERE message_id IN ({batch})", ids)
                cursor.execute(f"DELETE FROM {ARCHIVED_MESSAGE} WHERE id IN ({batch})", ids)
                done = int(cursor.rowcount)
        report.archive_deleted += done
        if done < batch_size or (deadline is not None and time.monotonic() > deadline):
            return


def _prune_archive(
    conn: BaseDatabaseWrapper, cutoff: dt.datetime, batch_size: int, deadline: float | None, report: Report
) -> None:
    if is_mysql(conn):
        _prune_archive_mysql(conn, cutoff, batch_size, deadline, report)
        return
    when = prep_dt(conn, cutoff)
    while True:
        with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
            _take_turn(conn, cursor)
            old = f"SELECT id FROM {ARCHIVED_MESSAGE} WHERE archived_at < %s ORDER BY archived_at LIMIT %s"
            cursor.execute(f"DELETE FROM {ARCHIVED_ATTEMPT} WHERE message_id IN ({old})", [when, batch_size])
            cursor.execute(f"DELETE FROM {ARCHIVED_MESSAGE} WHERE id IN ({old})", [when, batch_size])
            done = int(cursor.rowcount)
        report.archive_deleted += done
        if done < batch_size or (deadline is not None and time.monotonic() > deadline):
            return


# --- PostgreSQL partitions ---------------------------------------------------------------------


def partition_name(table: str, day: dt.date) -> str:
    return f"{table}_p{day:%Y%m%d}"


def ensure_partitions(conn: BaseDatabaseWrapper, now: dt.datetime, *, days_ahead: int = DAYS_AHEAD) -> list[str]:
    """Create the daily partitions from yesterday to ``days_ahead`` days on (UTC); returns those created."""
    first = _first_kept_day(_aware(now))
    wanted = [first + dt.timedelta(days=n) for n in range(days_ahead + 2)]
    existing = set(partitions(conn, ARCHIVED_MESSAGE)) | set(partitions(conn, ARCHIVED_ATTEMPT))
    created = []
    for day in wanted:
        for table in (ARCHIVED_MESSAGE, ARCHIVED_ATTEMPT):
            name = partition_name(table, day)
            if name in existing:
                continue
            start, end = day.isoformat(), (day + dt.timedelta(days=1)).isoformat()
            # Made apart, then attached: ``CREATE TABLE ... PARTITION OF`` takes the archive to itself, so
            # it waits behind any read of the archive (a report, the admin) while every later read queues
            # behind it; ATTACH takes a lock that readers and writers of the archive do not conflict with.
            # The indexes and the primary key come with the attach, as they came with PARTITION OF.
            _ddl(
                conn,
                f"CREATE TABLE IF NOT EXISTS {name} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
                f"ALTER TABLE {table} ATTACH PARTITION {name}"
                f" FOR VALUES FROM ('{start} 00:00:00+00') TO ('{end} 00:00:00+00')",
            )
            created.append(name)
    return created


def drop_partitions(
    conn: BaseDatabaseWrapper, *, older_than: dt.datetime, keep_from: dt.date | None = None
) -> list[str]:
    """Drop every daily partition whose whole day ended before ``older_than``, except days from ``keep_from``."""
    older_than = _aware(older_than)
    dropped = []
    for table in (ARCHIVED_ATTEMPT, ARCHIVED_MESSAGE):
        for name, day in partitions(conn, table).items():
            end = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), tzinfo=dt.UTC)
            if end <= older_than and (keep_from is None or day < keep_from):
                _ddl(conn, f"DROP TABLE IF EXISTS {name}")
                dropped.append(name)
    return dropped


def partitions(conn: BaseDatabaseWrapper, table: str) -> dict[str, dt.date]:
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = %s AND p.relnamespace = c.relnamespace"
            " AND pg_table_is_visible(p.oid)",
            [table],
        )
        names = [row[0] for row in cursor.fetchall()]
    found = {}
    for name in names:
        match = _PARTITION.search(name)
        if match and name == partition_name(table, dt.datetime.strptime(match.group(1), "%Y%m%d").date()):
            found[name] = dt.datetime.strptime(match.group(1), "%Y%m%d").date()
    return dict(sorted(found.items()))


def _ddl(conn: BaseDatabaseWrapper, *statements: str) -> None:
    """The statements in one transaction: a partition is made and attached, or neither."""
    with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
        _take_turn(conn, cursor)
        cursor.execute(f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'")
        for sql in statements:
            cursor.execute(sql)
