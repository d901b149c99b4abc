"""The demo's webhook consumer: Standard Webhooks signature check, then the inbox against redeliveries."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest
from django.conf import settings
from django.test import Client

from django_outbox.models import InboxMessage
from django_outbox.webhooks import new_secret, sign
from testproject.shop.models import Shipment
from testproject.shop.webhooks import INBOX_SOURCE

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/webhooks/orders/"
#: What the shop's webhook transport sends (the Standard Webhooks envelope, its default FORMAT).
EVENT = {
    "type": "orders.created",
    "timestamp": "2026-12-01T12:00:00.123456Z",
    "data": {"order_id": 7, "item": "mug", "quantity": 2},
}


def signed_headers(body: bytes, webhook_id: str, *, timestamp: int | None = None, secret: str | None = None):
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret or settings.SHOP_WEBHOOK_SECRET, webhook_id, timestamp, body),
    }


def deliver(client: Client, webhook_id: str, body: bytes | None = None, **kwargs):
    body = json.dumps(EVENT).encode() if body is None else body
    return client.post(URL, body, "application/json", headers=signed_headers(body, webhook_id, **kwargs))


def test_signature_matches_the_standard_webhooks_example_vector():
    # The example from the Standard Webhooks specification; also checked with `openssl dgst -mac HMAC`.
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    expected = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    assert sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body) == expected


def test_a_redelivered_webhook_ships_once(client):
    webhook_id = f"msg_{uuid.uuid4()}"
    first = deliver(client, webhook_id)
    again = deliver(client, webhook_id)
    assert first.status_code == again.status_code == 200
    assert first.json() == {"status": "processed"}
    assert again.json()["status"] == "duplicate"
    shipment = Shipment.objects.get()
    assert (shipment.order_id, shipment.item, shipment.quantity, shipment.webhook_id) == (7, "mug", 2, webhook_id)
    assert InboxMessage.objects.get().source == INBOX_SOURCE


def test_distinct_webhooks_each_ship(client):
    deliver(client, "msg_a")
    deliver(client, "msg_b")
    assert Shipment.objects.count() == 2


@pytest.mark.parametrize(
    "tamper",
    ["wrong-secret", "changed-body", "stale-timestamp", "missing-headers"],
)
def test_unverified_webhooks_are_refused_and_change_nothing(client, tamper):
    body = json.dumps(EVENT).encode()
    if tamper == "wrong-secret":
        headers = signed_headers(body, "msg_x", secret=new_secret())
    elif tamper == "changed-body":
        headers = signed_headers(body, "msg_x")
        body = body.replace(b"mug", b"car")
    elif tamper == "stale-timestamp":
        headers = signed_headers(body, "msg_x", timestamp=int(time.time()) - 600)
    else:
        headers = {}
    response = client.post(URL, body, "application/json", headers=headers)
    assert response.status_code == 401
    assert Shipment.objects.count() == 0
    assert InboxMessage.objects.count() == 0


def test_any_of_several_signatures_may_match(client):
    body = json.dumps(EVENT).encode()
    headers = signed_headers(body, "msg_rot")
    headers["webhook-signature"] = "v1,bm90LXRoaXMtb25l " + headers["webhook-signature"]  # key rotation
    assert client.post(URL, body, "application/json", headers=headers).status_code == 200


def test_concurrent_redeliveries_over_http_ship_once(live_server):
    body = json.dumps(EVENT).encode()
    headers = {"Content-Type": "application/json", **signed_headers(body, "msg_race")}
    barrier = threading.Barrier(5)
    statuses: list[str] = []

    def post() -> None:
        barrier.wait(30)
        request = urllib.request.Request(f"{live_server.url}{URL}", data=body, headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            statuses.append(json.loads(response.read())["status"])

    threads = [threading.Thread(target=post) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(statuses) == ["duplicate"] * 4 + ["processed"]
    assert Shipment.objects.count() == 1


@pytest.mark.parametrize(
    "event",
    [
        {**EVENT, "type": "orders.cancelled"},
        {"order_id": 7, "item": "mug", "quantity": 2},  # a bare payload: FORMAT "payload" names no type
        [EVENT],
        None,
    ],
)
def test_events_of_other_types_are_acknowledged_and_change_nothing(client, event):
    """One endpoint may be sent several topics: it acts on those it knows and answers 2xx to the rest."""
    response = deliver(client, "msg_other", json.dumps(event).encode())
    assert response.status_code == 200
    assert response.json() == {"status": "ignored"}
    assert Shipment.objects.count() == 0
    assert InboxMessage.objects.count() == 0


def test_the_shops_own_outbox_delivers_to_its_receiver_through_a_real_worker(settings, live_server):
    """End to end, as the demo runs: the shop's order event, the real relay, its webhook transport (default
    FORMAT), over HTTP to the receiver, which verifies the envelope and ships once."""
    from django_outbox import outbox
    from django_outbox.models import Message
    from django_outbox.worker import Relay, RelayConfig

    hooks = settings.OUTBOX["TRANSPORTS"]["shop-webhooks"]
    options = {**hooks["OPTIONS"], "URL": f"{live_server.url}{URL}"}
    settings.OUTBOX = {**settings.OUTBOX, "TRANSPORTS": {"shop-webhooks": {**hooks, "OPTIONS": options}}}
    message = outbox.send("orders.created", {"order_id": 9, "item": "teapot", "quantity": 1}, key="order-9")
    Relay(RelayConfig.from_settings(until_empty=True, poll_interval=0.05, notify=False)).run()
    message.refresh_from_db()
    assert message.status == Message.Status.DELIVERED, message.last_error
    shipment = Shipment.objects.get()
    assert (shipment.order_id, shipment.item, shipment.quantity) == (9, "teapot", 1)
    assert shipment.webhook_id == str(message.uuid)
