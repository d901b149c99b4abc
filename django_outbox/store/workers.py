"""The workers' own rows (heartbeats), and the clock the outbox's decisions use."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from . import mysql
from .db import (
    MYSQL_NOW,
    SERVER_NOW,
    WORKER,
    connection,
    decision_now,
    is_mysql,
    is_pg,
    mysql_server_clock,
    prep_dt,
    storable_text,
)


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
    conn = connection(alias)
    params: list[Any]
    if mysql_server_clock(conn):  # the server's times, as on PostgreSQL
        started, seen = MYSQL_NOW, MYSQL_NOW
        stopped = MYSQL_NOW if beat.stopped else "NULL"
        params = [beat.worker_id, beat.hostname, beat.pid, beat.in_flight, beat.delivered, beat.failed]
    elif is_pg(conn):
        started, seen = SERVER_NOW, SERVER_NOW  # started: the first beat's time, kept by later ones
        stopped = SERVER_NOW if beat.stopped else "NULL"
        params = [beat.worker_id, beat.hostname, beat.pid, beat.in_flight, beat.delivered, beat.failed]
    else:
        now = prep_dt(conn, timezone.now())
        started, seen, stopped = "%s", "%s", "%s"
        params = [
            beat.worker_id,
            beat.hostname,
            beat.pid,
            prep_dt(conn, beat.started_at),
            now,
            beat.in_flight,
            beat.delivered,
            beat.failed,
            now if beat.stopped else None,
        ]
    if is_mysql(conn):
        with conn.cursor() as cursor:
            cursor.execute(
                mysql.heartbeat_sql(started, seen, stopped),
                [*params, beat.housekeeping_failures, storable_text(beat.housekeeping_error)],
            )
        return
    with conn.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {WORKER} (worker_id, hostname, pid, started_at, last_seen, in_flight, delivered, failed,"
            f" stopped_at, housekeeping_failures, housekeeping_error)"
            f" VALUES (%s, %s, %s, {started}, {seen}, %s, %s, %s, {stopped}, %s, %s)"
            f" ON CONFLICT (worker_id) DO UPDATE SET last_seen = EXCLUDED.last_seen,"
            f" in_flight = EXCLUDED.in_flight, delivered = EXCLUDED.delivered, failed = EXCLUDED.failed,"
            f" stopped_at = EXCLUDED.stopped_at, housekeeping_failures = EXCLUDED.housekeeping_failures,"
            f" housekeeping_error = EXCLUDED.housekeeping_error",
            [*params, beat.housekeeping_failures, storable_text(beat.housekeeping_error)],
        )


def database_now(alias: str) -> dt.datetime:
    """The clock the outbox's decisions use: the server's on PostgreSQL, this host's on SQLite. For views
    that compare stored times with "now" (the overview, ``outbox_status``): one query, off the hot path."""
    conn = connection(alias)
    if is_mysql(conn):
        return decision_now(conn)
    if not is_pg(conn):
        return timezone.now()
    with conn.cursor() as cursor:
        cursor.execute(f"SELECT {SERVER_NOW}")
        row = cursor.fetchone()
    value: dt.datetime = row[0]
    return value
