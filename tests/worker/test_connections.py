"""The worker keeps its database connection between batches (it used to reconnect for every batch)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from django_outbox import outbox
from django_outbox.store import refresh_connections
from django_outbox.worker import Relay, RelayConfig

pytestmark = pytest.mark.django_db(transaction=True)


def test_one_connection_serves_every_batch(handler):
    """Each delivery thread keeps one connection for all its batches (two threads by default on PostgreSQL)."""
    used: list[tuple[str, int]] = []
    handler("t.conn", lambda m: used.append((threading.current_thread().name, id(connection.connection))))
    for n in range(6):
        outbox.send("t.conn", {"n": n})
    # batch size 1: six claims, six records, and a refresh before each
    Relay(RelayConfig.from_settings(until_empty=True, batch_size=1, poll_interval=0.05)).run()
    assert len(used) == 6
    by_thread: dict[str, set[int]] = {}
    for thread, conn_id in used:
        by_thread.setdefault(thread, set()).add(conn_id)
    assert all(len(ids) == 1 for ids in by_thread.values()), by_thread
    # some thread ran several batches, so keeping one connection across batches was really tested
    assert max(sum(1 for t, _ in used if t == name) for name in by_thread) >= 3


def test_a_connection_that_saw_an_error_is_replaced_when_unusable():
    conn = connections["default"]
    conn.ensure_connection()
    assert conn.settings_dict["CONN_MAX_AGE"] == 0
    refresh_connections()
    assert conn.connection is not None  # healthy: kept, whatever CONN_MAX_AGE says
    conn.errors_occurred = True
    if conn.vendor == "mysql":  # the server drops it (mysqlclient refuses to close a connection twice)
        from tests.support.database import connect_raw_mysql

        other = connect_raw_mysql()
        other.cursor().execute(f"KILL {int(conn.connection.thread_id())}")
        other.close()
    else:
        conn.connection.close()  # as if the server had gone away
    refresh_connections()
    assert conn.connection is None
    conn.ensure_connection()  # and the next query opens a fresh one
    with conn.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone()[0] == 1
