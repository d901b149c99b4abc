from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connections
from django.test import Client, override_settings
from django.utils import timezone

from django_outbox import conf
from django_outbox.idempotency import IdempotencyOptions, idempotent
from django_outbox.models import IdempotencyRecord, Message
from testproject.shop.models import Order

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/probe/orders/"


def post(client: Client, url: str = URL, body: object = None, key: str | None = "key-1", **extra: Any):
    headers = {"Idempotency-Key": key} if key is not None else {}
    return client.post(
        url, json.dumps(body or {"email": "a@example.com"}), "application/json", headers=headers, **extra
    )


def test_first_request_runs_the_view_and_a_retry_replays_the_stored_response(client):
    first = post(client)
    assert first.status_code == 201
    assert "Idempotent-Replayed" not in first
    again = post(client)
    assert again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert again["Content-Type"] == "application/json"
    assert again["Location"] == first["Location"]
    assert again["X-Probe"] == "yes"  # listed in replay_headers
    assert Order.objects.count() == 1
    assert Message.objects.count() == 1
    record = IdempotencyRecord.objects.get()
    assert record.state == IdempotencyRecord.State.COMPLETED
    assert (record.key, record.scope, record.response_status) == ("key-1", "client:127.0.0.1", 201)
    assert record.lock_token is None
    assert record.expires_at - record.created_at == dt.timedelta(hours=24)


def test_headers_not_listed_are_not_replayed(client):
    url = "/probe/orders-optional/"
    first = post(client, url)
    again = post(client, url)
    assert first["X-Probe"] == "yes"
    assert "X-Probe" not in again
    assert again["Location"] == first["Location"]


@pytest.mark.parametrize(
    ("url", "body"),
    [(URL, {"email": "other@example.com"}), ("/probe/orders/?x=1", {"email": "a@example.com"})],
    ids=["other-body", "other-path"],
)
def test_same_key_for_a_different_request_is_422(client, url, body):
    assert post(client).status_code == 201
    response = post(client, url, body)
    assert response.status_code == 422
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["title"] == "Idempotency-Key reused"
    assert Order.objects.count() == 1


def test_missing_key_on_an_endpoint_that_requires_one_is_400(client):
    response = post(client, key=None)
    assert response.status_code == 400
    assert response.json() == {
        "type": "about:blank",
        "title": "Idempotency-Key is missing",
        "status": 400,
        "detail": "This endpoint requires an Idempotency-Key header (a unique value per operation).",
    }
    assert Order.objects.count() == 0


def test_missing_key_on_an_optional_endpoint_runs_the_view_unprotected(client):
    assert post(client, "/probe/orders-optional/", key=None).status_code == 201
    assert post(client, "/probe/orders-optional/", key=None).status_code == 201
    assert Order.objects.count() == 2
    assert IdempotencyRecord.objects.count() == 0


@pytest.mark.parametrize("key", ["", "x" * 256, "clé", "a\tb"])
def test_invalid_key_is_400(client, key):
    response = post(client, key=key)
    assert response.status_code == 400
    assert response.json()["title"] == "Idempotency-Key is not valid"
    assert Order.objects.count() == 0


def test_quoted_structured_field_key_is_the_same_key_as_bare(client):
    assert post(client, key='"8e03978e-40d5"').status_code == 201
    again = post(client, key="8e03978e-40d5")
    assert again["Idempotent-Replayed"] == "true"


def test_safe_methods_are_not_affected(client):
    response = client.get(URL, headers={"Idempotency-Key": "key-1"})
    assert response.status_code == 200
    assert IdempotencyRecord.objects.count() == 0


def test_keys_are_scoped_per_user():
    alice, bob = (User.objects.create_user(name, password="pw") for name in ("alice", "bob"))
    clients = []
    for user in (alice, bob):
        c = Client()
        c.force_login(user)
        clients.append(c)
    assert [post(c).status_code for c in clients] == [201, 201]
    assert Order.objects.count() == 2
    assert sorted(IdempotencyRecord.objects.values_list("scope", flat=True)) == [
        f"user:{alice.pk}",
        f"user:{bob.pk}",
    ]
    assert post(clients[0])["Idempotent-Replayed"] == "true"


def test_anonymous_keys_are_scoped_per_client_address(client):
    assert post(client, REMOTE_ADDR="10.0.0.1").status_code == 201
    assert post(client, REMOTE_ADDR="10.0.0.2").status_code == 201
    assert post(client, REMOTE_ADDR="10.0.0.1")["Idempotent-Replayed"] == "true"
    assert Order.objects.count() == 2


def test_expired_key_runs_the_view_again(client):
    assert post(client).status_code == 201
    IdempotencyRecord.objects.update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    again = post(client, body={"email": "new@example.com"})  # an expired key is free for any request
    assert again.status_code == 201
    assert "Idempotent-Replayed" not in again
    assert Order.objects.count() == 2
    record = IdempotencyRecord.objects.get()
    assert record.expires_at > timezone.now()


@override_settings(OUTBOX={"IDEMPOTENCY_KEY_TTL": 120})
def test_key_ttl_setting(client):
    assert post(client).status_code == 201
    record = IdempotencyRecord.objects.get()
    assert record.expires_at - record.created_at == dt.timedelta(minutes=2)


def test_view_exception_rolls_back_and_releases_the_key(client):
    client.raise_request_exception = True
    with pytest.raises(RuntimeError, match="failure requested"):
        post(client, body={"fail": "raise"})
    assert Order.objects.count() == 0
    assert Message.objects.count() == 0
    assert IdempotencyRecord.objects.count() == 0


def test_server_error_response_is_not_stored_and_its_writes_roll_back(client):
    response = post(client, body={"fail": "503"})
    assert response.status_code == 503
    assert Order.objects.count() == 0
    assert Message.objects.count() == 0
    assert IdempotencyRecord.objects.count() == 0
    assert post(client, body={"fail": "503"}).status_code == 503  # runs again, not replayed


def test_in_progress_key_is_409_with_retry_after(client):
    now = timezone.now()
    assert post(client).status_code == 201
    record = IdempotencyRecord.objects.get()
    IdempotencyRecord.objects.create(
        scope=record.scope,
        key="key-2",
        fingerprint=record.fingerprint,
        state=IdempotencyRecord.State.IN_PROGRESS,
        lock_token="t" * 32,
        locked_until=now + dt.timedelta(seconds=30),
        expires_at=now + dt.timedelta(hours=1),
    )
    response = post(client, key="key-2")
    assert response.status_code == 409
    assert 28 <= int(response["Retry-After"]) <= 30
    assert response.json()["title"] == "Request in progress"


def test_lapsed_claim_of_a_dead_request_is_taken_over(client):
    now = timezone.now()
    post(client, key="seed")
    fingerprint = IdempotencyRecord.objects.get().fingerprint  # same body and path, so same request
    IdempotencyRecord.objects.all().delete()
    IdempotencyRecord.objects.create(
        scope="client:127.0.0.1",
        key="seed",
        fingerprint=fingerprint,
        state=IdempotencyRecord.State.IN_PROGRESS,
        lock_token="dead" * 8,
        locked_until=now - dt.timedelta(seconds=1),
        expires_at=now + dt.timedelta(hours=1),
    )
    Order.objects.all().delete()
    response = post(client, key="seed")
    assert response.status_code == 201
    assert "Idempotent-Replayed" not in response
    assert Order.objects.count() == 1
    assert IdempotencyRecord.objects.get().state == IdempotencyRecord.State.COMPLETED


@pytest.mark.parametrize(
    "url", ["/probe/orders-cbv/", "/probe/orders-cbv-decorated/"], ids=["mixin", "method_decorator"]
)
def test_class_based_views(client, url):
    assert post(client, url, key=None).status_code == 400
    first = post(client, url)
    assert first.status_code == 201
    assert post(client, url)["Idempotent-Replayed"] == "true"
    assert Order.objects.count() == 1


def test_streaming_response_is_refused_and_rolled_back(client):
    client.raise_request_exception = True
    with pytest.raises(TypeError, match="streaming"):
        post(client, "/probe/stream/")
    assert Order.objects.count() == 0
    assert IdempotencyRecord.objects.count() == 0


def test_claim_commits_before_the_view_even_with_atomic_requests(client, monkeypatch):
    monkeypatch.setitem(connections["default"].settings_dict, "ATOMIC_REQUESTS", True)
    response = post(client, "/probe/claim-visible/")
    assert response.json() == {"visible": True}


def test_decorator_options_are_validated():
    with pytest.raises(ValueError, match="ttl"):
        idempotent(ttl=0)
    with pytest.raises(ValueError, match="lock_timeout"):
        IdempotencyOptions(lock_timeout=dt.timedelta(seconds=-1))
    with pytest.raises(TypeError, match="list of names"):
        idempotent(methods="POST")


def test_purge_command_deletes_expired_records(client, capsys):
    post(client, key="old")
    post(client, key="new", body={"email": "new@example.com"})
    IdempotencyRecord.objects.filter(key="old").update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    call_command("outbox_purge_idempotency")
    assert capsys.readouterr().out.strip() == "deleted 1 expired idempotency record"
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["new"]


@pytest.mark.parametrize("value", [0, "1 day", dt.timedelta(seconds=-1)])
def test_invalid_key_ttl_is_reported_by_manage_py_check(value):
    with override_settings(OUTBOX={"IDEMPOTENCY_KEY_TTL": value}):
        assert [e.id for e in run_checks() if (e.id or "").startswith("django_outbox.E06")] == ["django_outbox.E061"]
        assert conf.problems()[0].id == "django_outbox.E061"
