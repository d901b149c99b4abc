"""Hostile conditions for ``health/`` and ``metrics/``: the outbox's table locked by another session, a
table of a million rows under a DBA's timeouts. Against the real server, over a real HTTP server."""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from django_outbox.admin import overview
from django_outbox.observability import views
from tests.support.database import connect_raw, connect_raw_mysql
from tests.support.processes import web_process, worker_env
from tests.support.servers import free_port

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "b2" * 20
HEALTH, METRICS = "/outbox/health/", "/outbox/metrics/"


@pytest.fixture(autouse=True)
def _fresh_sample(monkeypatch):
    """The metrics view keeps its sample for a few seconds per process: each test starts without one."""
    monkeypatch.setattr(views, "_backlog", None)


def get(url: str, *, timeout: float = 30.0, headers: dict[str, str] | None = None) -> tuple[int, bytes, float]:
    """Status, body and seconds of one request, with the bearer token unless other headers are given."""
    request = urllib.request.Request(url, headers=headers or {"Authorization": f"Bearer {TOKEN}"})
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


#: A web process of one thread that serves request after request, as a sync worker of a WSGI server does:
#: with ``CONN_MAX_AGE`` its session outlives each request. (Django's test servers and its ASGI handler
#: run each request on a thread of its own, so their sessions never do.)
ONE_THREAD_SERVER = """
import sys
from wsgiref.simple_server import WSGIRequestHandler, make_server
from django.core.wsgi import get_wsgi_application
class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass
make_server("127.0.0.1", int(sys.argv[1]), get_wsgi_application(), handler_class=Quiet).serve_forever()
"""


@pytest.fixture
def persistent_web_process() -> Iterator[str]:
    """The tests' application in a real single-threaded WSGI server whose session persists (``CONN_MAX_AGE``)."""
    port = free_port()
    env = {**worker_env(), "TEST_DB_SETTINGS": json.dumps({"CONN_MAX_AGE": 600})}
    with web_process([sys.executable, "-c", ONE_THREAD_SERVER, str(port)], port, env) as url:
        yield url


def test_a_probe_after_the_server_ended_its_session_answers_at_once_and_the_next_is_ok(
    persistent_web_process, postgres, client
):
    """The server ends the web process's persistent session (a failover, ``pg_terminate_backend``, an idle
    timeout): the next probe answers at once, with the JSON a probe parses, and the probe after it is 200
    again: the dead session is not kept."""
    from django.contrib.auth.models import User

    from django_outbox import store

    staff = User.objects.create_user("ops", is_staff=True)
    client.force_login(staff)
    cookie = {"Cookie": f"sessionid={client.cookies['sessionid'].value}"}
    store.heartbeat(
        "default",
        store.WorkerBeat(
            worker_id="w-1", hostname="host", pid=1, started_at=timezone.now(), in_flight=0,
            delivered=0, failed=0, stopped=False, housekeeping_failures=0, housekeeping_error="",
        ),
    )  # fmt: skip
    url = persistent_web_process + HEALTH
    status, body, _ = get(url, headers=cookie)
    assert status == 200, body
    with connect_raw(autocommit=True) as killer:
        ended = killer.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid() AND pid <> %s",
            [connection.cursor().connection.info.backend_pid],
        ).fetchone()[0]
    assert ended >= 1, "the web process kept no session to end"
    status, body, seconds = get(url, headers=cookie)
    assert seconds < 5, f"answered after {seconds:.1f} s"
    assert (status, json.loads(body)["status"]) == (503, "stalled"), body
    status, body, _ = get(url, headers=cookie)
    assert (status, json.loads(body)["status"]) == (200, "ok"), body


@pytest.fixture
def silent_database(server_database) -> Iterator[None]:
    """The outbox's database host accepts connections and never answers (a host under a SYN flood, a
    stuck proxy): the next connection goes there, with ``connect_timeout`` 2 s in its options, as the
    operating docs ask for the alias the probes read. Without one the driver waits for ever."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict["HOST"], connection.settings_dict["PORT"] = "127.0.0.1", str(listener.getsockname()[1])
    connection.settings_dict["OPTIONS"] = {**saved.get("OPTIONS", {}), "connect_timeout": 2}
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
        listener.close()


@override_settings(OUTBOX={"HEALTH_TOKEN": TOKEN})
def test_a_database_host_that_never_answers_gets_a_503_within_the_connect_timeout(client, silent_database):
    started = time.monotonic()
    health = client.get(HEALTH, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    metrics = client.get(METRICS, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    seconds = time.monotonic() - started
    assert seconds < 15, f"answered after {seconds:.1f} s"
    assert health.status_code == 503 and health.json()["status"] == "stalled"
    assert metrics.status_code == 503 and b"could not be read" in metrics.content
