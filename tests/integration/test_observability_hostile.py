"""Hostile conditions for ``health/`` and ``metrics/``: the outbox's table locked by another session, a
table of a million rows under a DBA's timeouts. Against the real server, over a real HTTP server."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import override_settings

from django_outbox.admin import overview
from django_outbox.observability import views
from tests.support.database import connect_raw, connect_raw_mysql

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "b2" * 20
HEALTH, METRICS = "/outbox/health/", "/outbox/metrics/"


@pytest.fixture(autouse=True)
def _fresh_sample(monkeypatch):
    """The metrics view keeps its sample for a few seconds per process: each test starts without one."""
    monkeypatch.setattr(views, "_backlog", None)


def get(url: str, *, timeout: float = 30.0) -> tuple[int, bytes, float]:
    """Status, body and seconds of one request with the bearer token."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read(), time.monotonic() - started
    except urllib.error.HTTPError as error:
        return error.code, error.read(), time.monotonic() - started


@pytest.fixture
def table_locked_by_another_session(server_database) -> Iterator[None]:
    """Another real session holds the message table locked against reads, as a migration rewriting it
    (``ALTER TABLE`` on PostgreSQL, ``LOCK TABLES ... WRITE`` or a copying ``ALTER`` on MariaDB) does
    for as long as it runs. Released after the test, whatever happened."""
    other: Any
    if connection.vendor == "postgresql":
        other = connect_raw()
        other.execute("LOCK TABLE django_outbox_message IN ACCESS EXCLUSIVE MODE")
    else:
        other = connect_raw_mysql()
        other.cursor().execute("LOCK TABLES django_outbox_message WRITE")
    try:
        yield
    finally:
        if connection.vendor == "postgresql":
            other.rollback()
        else:
            other.cursor().execute("UNLOCK TABLES")
        other.close()


@override_settings(OUTBOX={"HEALTH_TOKEN": TOKEN})
@pytest.mark.parametrize("path", [HEALTH, METRICS])
def test_a_probe_answers_503_within_seconds_while_the_table_is_locked(
    live_server, table_locked_by_another_session, path
):
    """A probe or a scrape during a migration that locks the table answers with a clear status within a
    few seconds; it does not queue behind the lock (a request thread held, the prober's own timeout the
    only answer) for as long as the migration runs."""
    status, body, seconds = get(live_server.url + path)
    assert status == 503, body
    assert seconds < 10, f"answered after {seconds:.1f} s"
    if path == HEALTH:
        assert json.loads(body)["status"] == "stalled"
    else:
        assert b"could not be read" in body and b"outbox_lag_seconds" not in body


def test_the_probes_bound_keeps_a_dbas_shorter_timeout_and_leaves_the_session_as_it_was(postgres):
    """The probes' bound only ever shortens: a DBA's 200 ms ``statement_timeout`` stays 200 ms inside it,
    and a caller's transaction (``ATOMIC_REQUESTS``) finds its own settings again afterwards."""
    with connection.cursor() as cursor:

        def show(name: str) -> str:
            cursor.execute(f"SHOW {name}")
            return str(cursor.fetchone()[0])

        cursor.execute("SET statement_timeout = '200ms'")
        try:
            with transaction.atomic():
                with overview.bounded_waits("default"):
                    assert (show("statement_timeout"), show("lock_timeout")) == ("200ms", "2s")
                    assert show("enable_bitmapscan") == "off"
                assert (show("statement_timeout"), show("lock_timeout")) == ("200ms", "0")
                assert show("enable_bitmapscan") == "on"
        finally:
            cursor.execute("RESET statement_timeout")
