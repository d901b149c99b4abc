"""The worker keeps its database connection between batches (it used to reconnect for every batch)."""

from __future__ import annotations

import pytest
from django.db import connection, connections

from django_outbox import outbox
from django_outbox.relay import Relay, RelayConfig
from django_outbox.store import refresh_connections

pytestmark = pytest.mark.django_db(transaction=True)


def test_one_connection_serves_every_batch(handler):
    raw_connections = []
    handler("t.conn", lambda m: raw_connections.append(id(connection.connection)))
    for n in range(5):
        outbox.send("t.conn", {"n": n})
    # batch size 1: five claims, five records, and a refresh before each
    Relay(RelayConfig.from_settings(until_empty=True, batch_size=1, poll_interval=0.05)).run()
    assert len(raw_connections) == 5
    assert len(set(raw_connections)) == 1


def test_a_connection_that_saw_an_error_is_replaced_when_unusable():
    conn = connections["default"]
    conn.ensure_connection()
    assert conn.settings_dict["CONN_MAX_AGE"] == 0
    refresh_connections()
    assert conn.connection is not None  # healthy: kept, whatever CONN_MAX_AGE says
    conn.errors_occurred = True
    conn.connection.close()  # as if the server had gone away
    refresh_connections()
    assert conn.connection is None
    conn.ensure_connection()  # and the next query opens a fresh one
    with conn.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone()[0] == 1
