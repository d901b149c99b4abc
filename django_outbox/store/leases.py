"""Leases: handing back what was never started, keeping a live worker's, taking a dead worker's."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from . import mysql
from .db import ATTEMPT, DEAD, MESSAGE, PENDING, PROCESSING, SERVER_NOW, connection, is_mysql, is_pg, prep_dt
from .models import Attempt


@dataclass(frozen=True, kw_only=True, slots=True)
class Reaped:
    message_id: int
    status: str
    previous_worker: str


def release(alias: str, *, worker: str, message_ids: Iterable[int]) -> int:
    """Hand claimed messages that were never started back, as if they had not been claimed."""
    ids = list(message_ids)
    if not ids:
        return 0
    conn = connection(alias)
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
    conn = connection(alias)
    if is_mysql(conn):
        return mysql.extend_leases(conn, worker=worker, lease_seconds=lease_seconds)
    if is_pg(conn):  # the lease's end on the server's clock, as the claim set it
        until_sql, until = f"{SERVER_NOW} + %s * interval '1 second'", float(lease_seconds)
    else:
        until_sql, until = "%s", prep_dt(conn, timezone.now() + dt.timedelta(seconds=lease_seconds))
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
    conn = connection(alias)
    if is_pg(conn):
        sql = f"""
            WITH e AS MATERIALIZED (
                SELECT id, locked_by, locked_until FROM {MESSAGE}
                WHERE status = %s AND locked_until < {SERVER_NOW} ORDER BY locked_until LIMIT %s
                FOR UPDATE SKIP LOCKED
            ), upd AS (
                UPDATE {MESSAGE} AS m SET
                    status = CASE WHEN m.attempts >= m.max_attempts THEN %s ELSE %s END,
                    available_at = {SERVER_NOW}, locked_by = NULL, locked_until = NULL,
                    last_error = 'abandoned: lease of worker ' || COALESCE(e.locked_by, '?') || ' expired at '
                                 || to_char(e.locked_until AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC'
                FROM e WHERE m.id = e.id
                RETURNING m.id, m.attempts, m.status, e.locked_by, m.last_error
            ), ins AS (
                INSERT INTO {ATTEMPT} (message_id, number, started_at, finished_at, worker, outcome, error)
                SELECT id, attempts, {SERVER_NOW}, {SERVER_NOW}, COALESCE(locked_by, ''), %s,
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
    with transaction.atomic(using=alias), conn.cursor() as cursor:
        if is_mysql(conn):  # locked with SKIP LOCKED, on the server's clock
            now, expired = mysql.reap_candidates(conn, limit)
        else:
            now = timezone.now()
            cursor.execute(
                f"SELECT id, attempts, max_attempts, locked_by, locked_until FROM {MESSAGE}"
                f" WHERE status = %s AND locked_until < %s ORDER BY locked_until LIMIT %s",
                [PROCESSING, prep_dt(conn, now), limit],
            )
            expired = cursor.fetchall()
        for message_id, attempts, max_attempts, locked_by, locked_until in expired:
            status = DEAD if attempts >= max_attempts else PENDING
            error = f"abandoned: lease of worker {locked_by or '?'} expired at {str(locked_until)[:19]} UTC"
            cursor.execute(
                f"UPDATE {MESSAGE} SET status = %s, available_at = %s, locked_by = NULL, locked_until = NULL,"
                f" last_error = %s WHERE id = %s AND status = %s AND attempts = %s",
                [status, prep_dt(conn, now), error, message_id, PROCESSING, attempts],
            )
            if cursor.rowcount != 1:
                continue
            cursor.execute(
                f"INSERT INTO {ATTEMPT} (message_id, number, started_at, finished_at, worker, outcome, error)"
                f" VALUES (%s, %s, %s, %s, %s, %s, %s)",
                [
                    message_id,
                    attempts,
                    prep_dt(conn, now),
                    prep_dt(conn, now),
                    locked_by or "",
                    Attempt.Outcome.ABANDONED,
                    error + ": the worker stopped without recording an outcome",
                ],
            )
            reaped.append(Reaped(message_id=message_id, status=status, previous_worker=locked_by or ""))
    return reaped
