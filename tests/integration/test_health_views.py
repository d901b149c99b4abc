"""``health/`` and ``metrics/`` in ``django_outbox.urls``: who may see them, and what they answer."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import urllib.error
import urllib.request

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from django_outbox import outbox, store
from django_outbox.models import Message
from django_outbox.observability import views

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "a1" * 20
HEALTH, METRICS = "/outbox/health/", "/outbox/metrics/"
WITH_TOKEN = {"OUTBOX": {"HEALTH_TOKEN": TOKEN}}


@pytest.fixture(autouse=True)
def _fresh_sample(monkeypatch):
    """The metrics view keeps its sample for a few seconds per process: each test starts without one."""
    monkeypatch.setattr(views, "_backlog", None)


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def beat(worker_id: str = "w-1") -> None:
    """A live worker's heartbeat, written by the statement the worker's keeper uses."""
    store.heartbeat(
        "default",
        store.WorkerBeat(
            worker_id=worker_id,
            hostname="host",
            pid=os.getpid(),
            started_at=timezone.now(),
            in_flight=0,
            delivered=0,
            failed=0,
            stopped=False,
            housekeeping_failures=0,
            housekeeping_error="",
        ),
    )


def waiting_for(seconds: float) -> Message:
    message = outbox.send("probe.x", {})
    then = timezone.now() - dt.timedelta(seconds=seconds)
    Message.objects.filter(pk=message.pk).update(available_at=then, created_at=then)
    return message


@override_settings(**WITH_TOKEN)
def test_ok_with_a_live_worker_and_no_lag(client):
    beat()
    response = client.get(HEALTH, **bearer())
    assert response.status_code == 200
    assert response["Cache-Control"].startswith("max-age=0")
    assert response.json() == {"status": "ok", "lag_seconds": 0.0, "blocked_keys": 0, "workers_alive": 1}


@override_settings(OUTBOX={"HEALTH_TOKEN": TOKEN, "HEALTH_LAG_SECONDS": 30, "HEALTH_STALLED_SECONDS": 300})
def test_lagging_then_stalled_as_the_oldest_message_ages(client):
    beat()
    message = waiting_for(60)
    response = client.get(HEALTH, **bearer())
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "lagging"
    assert 59 <= body["lag_seconds"] < 120
    Message.objects.filter(pk=message.pk).update(available_at=timezone.now() - dt.timedelta(seconds=400))
    response = client.get(HEALTH, **bearer())
    assert (response.status_code, response.json()["status"]) == (503, "stalled")


@override_settings(**WITH_TOKEN)
def test_stalled_without_a_live_worker(client):
    response = client.get(HEALTH, **bearer())
    assert response.status_code == 503
    assert response.json() == {"status": "stalled", "lag_seconds": 0.0, "blocked_keys": 0, "workers_alive": 0}


@override_settings(**WITH_TOKEN)
def test_blocked_keys_are_counted(client):
    beat()
    dead = outbox.send("probe.x", {}, key="order-1")
    Message.objects.filter(pk=dead.pk).update(status="dead")
    outbox.send("probe.x", {}, key="order-1")  # held behind the dead one: not lag
    body = client.get(HEALTH, **bearer()).json()
    assert (body["blocked_keys"], body["status"], body["lag_seconds"]) == (1, "ok", 0.0)


def test_anonymous_without_a_token_configured_gets_403_and_no_figures(client):
    beat()
    for url in (HEALTH, METRICS):
        response = client.get(url)
        assert response.status_code == 403
        assert "workers_alive" not in response.content.decode()
        assert "outbox_" not in response.content.decode()


@override_settings(**WITH_TOKEN)
@pytest.mark.parametrize(
    "authorization", ["", "Bearer", f"Bearer {TOKEN[:-1]}", f"Bearer {TOKEN}x", f"Basic {TOKEN}", f"Bearer  {'é' * 40}"]
)
def test_a_missing_or_wrong_token_gets_401(client, authorization, caplog):
    caplog.set_level(logging.DEBUG)
    headers = {"HTTP_AUTHORIZATION": authorization} if authorization else {}
    for url in (HEALTH, METRICS):
        response = client.get(url, **headers)
        assert response.status_code == 401
        assert response["WWW-Authenticate"].startswith("Bearer")
        assert "lag_seconds" not in response.content.decode()
        assert TOKEN not in response.content.decode()
    assert all(TOKEN not in r.getMessage() for r in caplog.records)


def test_a_token_is_refused_when_none_is_configured(client):
    assert client.get(HEALTH, **bearer()).status_code == 401


def test_staff_sessions_see_it_other_users_do_not(client):
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    client.force_login(user)
    assert client.get(HEALTH).status_code == 503  # no worker: stalled, but shown
    assert client.get(METRICS).status_code == 200
    user.is_staff = False
    user.save()
    assert client.get(HEALTH).status_code == 403
    user.is_staff, user.is_active = True, False
    user.save()
    client.force_login(User.objects.create_user("ops2", password="pw"))
    assert client.get(HEALTH).status_code == 403


@pytest.mark.parametrize("configured", [{}, WITH_TOKEN["OUTBOX"]], ids=["no token", "token"])
@pytest.mark.parametrize("authorization", ["Basic b3BzOnN0YWdpbmc=", "Negotiate YIIabc", "Bearer", "Digest x"])
def test_a_staff_session_is_honoured_whatever_authorization_header_a_proxy_adds(client, configured, authorization):
    """A proxy in front of the site (basic auth on a staging host, say) adds its own header to every
    request: the operator's session still opens the figures, and anonymous requests still do not."""
    beat()
    anonymous = 401 if configured or authorization.startswith("Bearer") else 403  # a token to present, or not
    with override_settings(OUTBOX=configured):
        assert client.get(HEALTH, HTTP_AUTHORIZATION=authorization).status_code == anonymous
        client.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
        response = client.get(HEALTH, HTTP_AUTHORIZATION=authorization)
        assert (response.status_code, response.json()["status"]) == (200, "ok")
        assert client.get(METRICS, HTTP_AUTHORIZATION=authorization).status_code == 200


@override_settings(**WITH_TOKEN)
def test_a_wrong_bearer_token_without_a_session_is_refused_and_a_staff_session_still_opens(client):
    beat()
    assert client.get(HEALTH, **bearer("x" * 40)).status_code == 401
    client.force_login(User.objects.create_user("ops", password="pw"))
    assert client.get(HEALTH, **bearer("x" * 40)).status_code == 401  # a session, but not staff
    client.force_login(User.objects.create_user("ops2", password="pw", is_staff=True))
    assert client.get(HEALTH, **bearer("x" * 40)).status_code == 200


@override_settings(**WITH_TOKEN)
def test_a_staff_session_behind_a_basic_auth_proxy_over_a_real_server(live_server, client):
    """The session cookie and a proxy's ``Basic`` header, sent over HTTP to a real server."""
    beat()
    client.force_login(User.objects.create_user("ops", password="pw", is_staff=True))
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"

    def get(headers: dict[str, str]) -> int:
        request = urllib.request.Request(live_server.url + HEALTH, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return int(error.code)

    basic = {"Authorization": "Basic b3BzOnN0YWdpbmc="}
    assert get(basic) == 401
    assert get({**basic, "Cookie": cookie}) == 200
    assert get({"Authorization": "Bearer " + "x" * 40}) == 401


@override_settings(**WITH_TOKEN)
def test_only_reads(client):
    assert client.post(HEALTH, **bearer()).status_code == 405
    assert client.head(HEALTH, **bearer()).status_code in (200, 503)


@override_settings(**WITH_TOKEN)
def test_metrics_serves_the_backlog_and_lag_gauges(client):
    beat()
    waiting_for(30)
    outbox.send("probe.y", {})
    response = client.get(METRICS, **bearer())
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(response.content.decode())
        for s in f.samples
    }
    assert samples[("outbox_backlog_messages", (("status", "pending"),))] == 2
    assert samples[("outbox_backlog_messages", (("status", "dead"),))] == 0
    assert 29 <= samples[("outbox_lag_seconds", ())] < 90
    assert samples[("outbox_blocked_keys", ())] == 0
    assert samples[("outbox_workers_alive", ())] == 1


@override_settings(**WITH_TOKEN)
def test_over_a_real_server(live_server):
    beat()

    def get(path: str, token: str | None) -> tuple[int, bytes]:
        request = urllib.request.Request(live_server.url + path)
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    status, body = get(HEALTH, TOKEN)
    assert (status, json.loads(body)["status"]) == (200, "ok")
    status, body = get(METRICS, TOKEN)
    assert status == 200 and b"outbox_lag_seconds 0.0" in body
    status, body = get(HEALTH, None)
    assert status == 401 and b"lag_seconds" not in body
    status, body = get(HEALTH, "x" * 40)
    assert status == 401 and TOKEN.encode() not in body


@pytest.fixture
def unreachable_database(tmp_path):
    """The outbox's database made unreachable for real: the next connection goes to a closed port
    (PostgreSQL, MariaDB) or to a file in a directory that does not exist (SQLite)."""
    from django.db import connection

    from tests.support.servers import free_port

    saved = dict(connection.settings_dict)
    connection.close()
    if connection.vendor == "sqlite":
        connection.settings_dict["NAME"] = str(tmp_path / "missing" / "db.sqlite3")
    else:
        connection.settings_dict["HOST"], connection.settings_dict["PORT"] = "127.0.0.1", str(free_port())
    yield
    connection.close()
    connection.settings_dict.clear()
    connection.settings_dict.update(saved)


def test_health_answers_503_json_when_the_database_cannot_be_read(client, settings, unreachable_database, caplog):
    """A probe asks exactly when things are wrong: a database it cannot reach is an outbox that delivers
    nothing, answered as JSON with 503 (not Django's 500 page), and without the server's error text."""
    settings.OUTBOX = {**settings.OUTBOX, "HEALTH_TOKEN": TOKEN}
    with caplog.at_level(logging.WARNING, logger="django_outbox"):
        response = client.get(HEALTH, **bearer())
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "stalled"
    assert body["lag_seconds"] is None and body["workers_alive"] is None and body["blocked_keys"] is None
    assert "could not be read" in body["error"]
    assert set(body) == {"status", "lag_seconds", "blocked_keys", "workers_alive", "error"}
    assert "127.0.0.1" not in json.dumps(body) and "sqlite3" not in json.dumps(body)  # no connection details
    assert any("health" in r.getMessage() for r in caplog.records)


def test_metrics_answers_503_at_once_when_the_database_cannot_be_read(client, settings, unreachable_database, caplog):
    """A scrape during an outage gets a clear status (the scraper's ``up`` goes to 0 and every series is
    absent), not Django's 500 page or a traceback, and without the driver's text (host, port, user)."""
    settings.OUTBOX = {**settings.OUTBOX, "HEALTH_TOKEN": TOKEN}
    with caplog.at_level(logging.WARNING, logger="django_outbox"):
        response = client.get(METRICS, **bearer())
    assert response.status_code == 503
    assert response["Content-Type"].startswith("text/plain")
    body = response.content.decode()
    assert "could not be read" in body
    assert "outbox_lag_seconds" not in body  # no stale figure served as if it were current
    assert "127.0.0.1" not in body and "sqlite3" not in body and "Traceback" not in body
    assert any("metrics" in r.getMessage() for r in caplog.records)


def test_a_stale_sample_is_not_served_once_the_database_is_gone(client, settings, tmp_path, caplog):
    """A web process that sampled before the outage must not keep answering with that sample once it has
    expired: the figures would say all is well while nothing can be read."""
    from django.db import connection

    from tests.support.servers import free_port

    settings.OUTBOX = {**settings.OUTBOX, "HEALTH_TOKEN": TOKEN}
    beat()
    assert client.get(METRICS, **bearer()).status_code == 200
    assert views._backlog is not None
    views._backlog._taken -= views._backlog.interval  # the sample has expired
    saved = dict(connection.settings_dict)
    connection.close()
    if connection.vendor == "sqlite":
        connection.settings_dict["NAME"] = str(tmp_path / "missing" / "db.sqlite3")
    else:
        connection.settings_dict["HOST"], connection.settings_dict["PORT"] = "127.0.0.1", str(free_port())
    try:
        with caplog.at_level(logging.WARNING, logger="django_outbox"):
            response = client.get(METRICS, **bearer())
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
    assert response.status_code == 503
    assert b"outbox_workers_alive" not in response.content


@pytest.fixture
def staff_client(client):
    """A client with an active staff session, stored in the database before the outage."""
    client.force_login(User.objects.create_user("ops", is_staff=True))
    return client


def test_a_staff_session_during_an_outage_gets_the_503_not_a_500(staff_client, unreachable_database, caplog):
    """Operators open the probes with their staff session, whose lookup needs the database: during an
    outage that lookup fails before any figure is read. The answer is the probes' 503 (no figure: who
    asks cannot be told), not Django's 500 page with the driver's error."""
    with caplog.at_level(logging.WARNING, logger="django_outbox"):
        health = staff_client.get(HEALTH)
        metrics = staff_client.get(METRICS)
    assert health.status_code == 503
    body = health.json()
    assert body["status"] == "stalled" and body["lag_seconds"] is None and "could not be read" in body["error"]
    assert metrics.status_code == 503 and b"could not be read" in metrics.content
    assert b"127.0.0.1" not in health.content + metrics.content
