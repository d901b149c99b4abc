"""Real deliveries, verified by the Standard Webhooks reference libraries: Python's and Node's.

Each test sends messages through ``outbox.send()``, relays them with the real worker code and the real
webhook transport to a real HTTP server on loopback, and lets a library that is not ours verify what
arrived: the signature must cover the exact bytes sent, and the body must be the envelope (or the bare
payload with ``FORMAT = "payload"``).
"""

from __future__ import annotations

import datetime as dt
import json
import zoneinfo
from collections.abc import Iterator
from typing import Any

import pytest
import standardwebhooks
from django.conf import settings as django_settings
from django.test import RequestFactory

from django_outbox import outbox
from django_outbox.models import Message
from django_outbox.testing import relay_all
from django_outbox.webhooks import verify
from django_outbox.worker import Relay, RelayConfig
from tests.support.receivers import NodeReceiver
from tests.support.servers import Reply

pytestmark = [pytest.mark.database_independent, pytest.mark.django_db(transaction=True)]

SECRET = "whsec_8X64pTf2VJY6eApZYqEgNu+kEOBTpP9F"
BACKEND = "django_outbox.transports.webhook.WebhookTransport"

#: (topic, payload): every kind of JSON a payload may be, non-ASCII topics, and a large one.
MESSAGES: list[tuple[str, Any]] = [
    ("orders.created", {"id": 1, "total": "9.90", "name": "Ann ✓"}),
    ("orders.list", [1, "two", None, {"three": 3.5}]),
    ("orders.text", "just a string"),
    ("orders.number", 42),
    ("orders.null", None),
    ("orders.заказ ✓ 🚚", {"città": "Zürich", "emoji": "📦"}),
    # just under OUTBOX["MAX_PAYLOAD_BYTES"] (1 MB as JSON, each é escaped to 6 bytes), then the envelope on top
    ("orders.large", {"rows": ["é" * 1000] * 165}),
]


def configure(settings: Any, url: str, **options: object) -> None:
    settings.OUTBOX = {
        **settings.OUTBOX,
        "TRANSPORTS": {
            "hooks": {
                "BACKEND": BACKEND,
                "OPTIONS": {"URL": url, "SECRET": SECRET, "TIMEOUT": 30, "ALLOWED_HOSTS": ["127.0.0.1"], **options},
            }
        },
        "ROUTES": {"orders.*": "hooks"},
    }


def send_all() -> list[Message]:
    sent = [outbox.send(topic, payload) for topic, payload in MESSAGES]
    worker = Relay(RelayConfig.from_settings(until_empty=True, poll_interval=0.05, notify=False, concurrency=1))
    worker.run()
    assert worker.stats.delivered == len(MESSAGES)
    for message in sent:
        message.refresh_from_db()
        assert message.status == Message.Status.DELIVERED, message.last_error
    return sent


def expected_timestamp(message: Message) -> str:
    """The message's created_at in UTC, worked out apart from the transport's code."""
    created = message.created_at
    if created.tzinfo is None:  # USE_TZ = False: wall-clock time in TIME_ZONE
        created = created.replace(tzinfo=zoneinfo.ZoneInfo(django_settings.TIME_ZONE))
    return created.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def assert_envelope(body: Any, message: Message) -> None:
    assert body == {"type": message.topic, "timestamp": expected_timestamp(message), "data": message.payload}
    # the real time in UTC, also under TEST_USE_TZ=0 (America/New_York): a naive time read as UTC is hours off
    sent_at = dt.datetime.strptime(body["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
    assert abs((dt.datetime.now(dt.UTC) - sent_at).total_seconds()) < 300


@pytest.mark.parametrize("body_format", ["standard-webhooks", "payload", None])
def test_pythons_standardwebhooks_verifies_real_deliveries(settings, server, body_format):
    options = {} if body_format is None else {"FORMAT": body_format}  # None: the option left out (the default)
    configure(settings, server.url(), **options)
    sent = send_all()
    assert len(server.requests) == len(sent)
    for request, message in zip(server.requests, sent, strict=True):
        assert request.headers["webhook-id"] == str(message.uuid)
        verified = standardwebhooks.Webhook(SECRET).verify(request.body, request.headers)
        # our own verify() returns the same: the body as sent
        django_request = RequestFactory().post(
            "/in", data=request.body, content_type="application/json", headers=dict(request.headers)
        )
        assert verify(django_request, SECRET) == verified
        if body_format == "payload":
            assert verified == message.payload
        else:
            assert_envelope(verified, message)
        with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
            standardwebhooks.Webhook(SECRET).verify(request.body + b" ", request.headers)  # a byte more


@pytest.fixture
def node_receiver() -> Iterator[NodeReceiver]:
    receiver = NodeReceiver(SECRET)
    yield receiver
    receiver.stop()


@pytest.mark.parametrize("body_format", ["standard-webhooks", "payload", None])
def test_nodes_standardwebhooks_verifies_real_deliveries(settings, node_receiver, body_format):
    options = {} if body_format is None else {"FORMAT": body_format}  # None: the option left out (the default)
    configure(settings, node_receiver.url(), **options)
    sent = send_all()
    seen = node_receiver.requests(len(sent))
    for line, message in zip(seen, sent, strict=True):
        assert line["ok"], line.get("error")
        assert line["headers"]["webhook-id"] == str(message.uuid)
        assert line["headers"]["content-type"] == "application/json"
        if body_format == "payload":
            assert line["verified"] == message.payload
        else:
            assert_envelope(line["verified"], message)


def test_node_refuses_what_is_not_signed_with_its_secret(settings, node_receiver):
    """The receiver is not a rubber stamp: a request signed with another secret is refused (400), and the
    transport records the refusal as a permanent failure."""
    configure(settings, node_receiver.url(), SECRET="whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY")
    message = outbox.send("orders.created", {"id": 1})
    Relay(RelayConfig.from_settings(until_empty=True, poll_interval=0.05, notify=False)).run()
    (line,) = node_receiver.requests(1)
    assert not line["ok"]
    message.refresh_from_db()
    assert message.status == Message.Status.DEAD
    assert "HTTP 400" in message.last_error


def test_a_redelivery_keeps_the_envelope_and_the_webhook_id(settings, server):
    """A retry sends the same body (the timestamp is the message's, not the attempt's), so a receiver that
    stores the first body and compares sees one event; only webhook-timestamp and the signature change."""
    configure(settings, server.url())
    server.replies = [Reply(status=503)]
    message = outbox.send("orders.created", {"id": 1})
    stats = relay_all(ignore_backoff=True, until_settled=True)
    assert (stats.failed, stats.delivered) == (1, 1)
    first, second = server.requests
    assert first.body == second.body
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == str(message.uuid)
    assert_envelope(json.loads(second.body), message)
    standardwebhooks.Webhook(SECRET).verify(second.body, second.headers)
