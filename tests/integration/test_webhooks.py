from __future__ import annotations

import datetime as dt
import email.utils
import json
import time

import pytest
import standardwebhooks
from django.test import RequestFactory
from django.utils import timezone

from django_outbox import outbox
from django_outbox.checks import check_settings
from django_outbox.models import Message
from django_outbox.webhooks import WebhookVerificationError, new_secret, sign, verify
from django_outbox.webhooks.ssrf import is_public_address as _is_public
from django_outbox.webhooks.transport import WebhookTarget, retry_after_seconds
from django_outbox.worker import Relay, RelayConfig
from tests.support.servers import Reply, free_port

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "whsec_8X64pTf2VJY6eApZYqEgNu+kEOBTpP9F"
OTHER_SECRET = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"
BACKEND = "django_outbox.transports.webhook.WebhookTransport"


@pytest.fixture
def hooks(settings, server):
    """Route orders.* to a webhook transport aimed at the loopback server; returns a way to change OPTIONS."""

    def configure(**options: object) -> None:
        settings.OUTBOX = {
            **settings.OUTBOX,
            "TRANSPORTS": {
                "hooks": {
                    "BACKEND": BACKEND,
                    "OPTIONS": {
                        "URL": server.url(),
                        "SECRET": SECRET,
                        "TIMEOUT": 2,
                        "ALLOWED_HOSTS": ["127.0.0.1"],
                        **options,
                    },
                }
            },
            "ROUTES": {"orders.*": "hooks"},
        }

    configure()
    return configure


def relay(**overrides: object) -> Relay:
    worker = Relay(RelayConfig.from_settings(until_empty=True, poll_interval=0.05, notify=False, **overrides))
    worker.run()
    return worker


def test_delivers_signed_request_that_standardwebhooks_verifies(hooks, server):
    keyed = outbox.send("orders.created", {"id": 1, "total": "9.90", "name": "Ann ✓"}, idempotency_key="order-1")
    plain = outbox.send("orders.paid", {"id": 1})
    assert relay().stats.delivered == 2
    # several delivery threads: the two requests may arrive in either order
    by_key = {r.headers["idempotency-key"]: r for r in server.requests}
    assert set(by_key) == {"order-1", str(plain.uuid)}
    first, second = by_key["order-1"], by_key[str(plain.uuid)]
    assert first.path == second.path == "/hook"
    assert first.headers["content-type"] == "application/json"
    keyed.refresh_from_db()
    assert json.loads(first.body) == {
        "type": "orders.created",
        "timestamp": keyed.created_at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "data": {"id": 1, "total": "9.90", "name": "Ann ✓"},
    }
    assert first.headers["webhook-id"] == str(keyed.uuid)
    assert second.headers["webhook-id"] == str(plain.uuid)
    assert json.loads(second.body)["type"] == "orders.paid"
    assert abs(int(first.headers["webhook-timestamp"]) - time.time()) < 60
    assert first.headers["webhook-signature"].startswith("v1,")
    # Another implementation of the specification accepts what we send.
    for request in server.requests:
        assert standardwebhooks.Webhook(SECRET).verify(request.body, request.headers) == json.loads(request.body)
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(OTHER_SECRET).verify(first.body, first.headers)
    assert Message.objects.filter(status=Message.Status.DELIVERED).count() == 2


def test_one_pooled_connection_per_worker_thread(hooks, server):
    for n in range(3):
        outbox.send("orders.created", {"n": n})
    relay(concurrency=1)  # one delivery thread: its three requests share one pooled connection
    assert len(server.requests) == 3
    assert len({r.client_port for r in server.requests}) == 1


@pytest.mark.parametrize("status", [500, 502, 503, 408, 429])
def test_retryable_statuses_are_retried(settings, hooks, server, status):
    # a backoff longer than the run: with the test settings' 50 ms, a loaded machine retried within it
    settings.OUTBOX = {**settings.OUTBOX, "BACKOFF_BASE_SECONDS": 60, "BACKOFF_MAX_SECONDS": 60}
    server.default = Reply(status=status, body=b"upstream is having a bad day")
    message = outbox.send("orders.created", {"id": 1})
    relay()
    message.refresh_from_db()
    assert message.status == Message.Status.PENDING
    assert message.attempts == 1
    assert f"HTTP {status}" in message.last_error
    assert "upstream is having a bad day" in message.last_error


def test_retry_after_is_honoured(settings, hooks, server):
    # tests/settings.py caps backoff at 0.5 s, and a Retry-After at that unless RETRY_AFTER_MAX_SECONDS says
    settings.OUTBOX = {**settings.OUTBOX, "RETRY_AFTER_MAX_SECONDS": 600}
    server.replies = [Reply(status=429, headers={"Retry-After": "120"})]
    message = outbox.send("orders.created", {"id": 1})
    relay()
    message.refresh_from_db()
    assert message.status == Message.Status.PENDING
    assert message.available_at >= timezone.now() + dt.timedelta(seconds=110)


def test_retry_after_accepts_http_dates():
    later = email.utils.format_datetime(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=300), usegmt=True)
    assert 290 <= (retry_after_seconds(later) or 0) <= 300
    assert retry_after_seconds("7") == 7
    assert retry_after_seconds("soon") is None
    assert retry_after_seconds(None) is None


@pytest.mark.parametrize("status", [400, 401, 404, 410, 422])
def test_other_4xx_are_dead_at_once_with_status_and_excerpt(hooks, server, status):
    server.default = Reply(status=status, body=b'{"error": "unknown event type"}' + b"x" * 5000)
    message = outbox.send("orders.created", {"id": 1})
    relay()
    message.refresh_from_db()
    assert message.status == Message.Status.DEAD
    assert message.attempts == 1
    assert f"answered HTTP {status}" in message.last_error
    assert '{"error": "unknown event type"}' in message.last_error
    assert "x" * 2000 not in message.last_error  # an excerpt, not the whole body


def test_redirects_are_not_followed(hooks, server):
    server.default = Reply(status=302, headers={"Location": server.url("/elsewhere")})
    message = outbox.send("orders.created", {"id": 1})
    relay()
    message.refresh_from_db()
    assert message.status == Message.Status.DEAD
    assert "redirect to" in message.last_error and "not followed" in message.last_error
    assert [r.path for r in server.requests] == ["/hook"]


def test_timeout_is_retried(hooks, server):
    hooks(TIMEOUT=0.3)
    server.default = Reply(delay=1.5)
    message = outbox.send("orders.created", {"id": 1})
    relay()
    message.refresh_from_db()
    assert message.status == Message.Status.PENDING
    assert "timed out" in message.last_error


def test_connection_refused_is_retried(hooks):
    hooks(URL=f"http://127.0.0.1:{free_port()}/hook")
    message = outbox.send("orders.created", {"id": 1})
    relay()
    message.refresh_from_db()
    assert message.status == Message.Status.PENDING
    assert "ConnectError" in message.last_error


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_private_targets_are_refused_unless_allowed(hooks, server, host):
    hooks(URL=server.url().replace("127.0.0.1", host), ALLOWED_HOSTS=[])
    message = outbox.send("orders.created", {"id": 1})
    relay()
    message.refresh_from_db()
    assert message.status == Message.Status.DEAD
    assert "not a public address" in message.last_error
    assert "ALLOWED_HOSTS" in message.last_error
    assert server.requests == []

    hooks(URL=server.url().replace("127.0.0.1", host), ALLOWED_HOSTS=[host])
    outbox.send("orders.created", {"id": 2})
    relay()
    assert [json.loads(r.body)["data"] for r in server.requests] == [{"id": 2}]


def test_address_classification():
    for address in ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0"]:
        assert not _is_public(address), address
    for address in ["::1", "fe80::1", "fc00::1", "::ffff:127.0.0.1", "ff02::1"]:
        assert not _is_public(address), address
    assert _is_public("93.184.216.34")
    assert _is_public("2606:2800:220:1:248:1893:25c8:1946")


SUBSCRIBERS = {"a": ("/a", SECRET), "b": ("/b", OTHER_SECRET)}
RESOLVER_PORT: list[int] = []


def resolve_subscriber(message: Message) -> WebhookTarget | tuple[str, str]:
    path, secret = SUBSCRIBERS[message.payload["subscriber"]]
    url = f"http://127.0.0.1:{RESOLVER_PORT[-1]}{path}"
    return WebhookTarget(url=url, secret=secret) if path == "/a" else (url, secret)


def test_resolver_picks_url_and_secret_per_message(settings, server, monkeypatch):
    monkeypatch.setattr(f"{__name__}.RESOLVER_PORT", [server.port])
    settings.OUTBOX = {
        **settings.OUTBOX,
        "TRANSPORTS": {
            "fanout": {
                "BACKEND": BACKEND,
                "OPTIONS": {"RESOLVER": f"{__name__}.resolve_subscriber", "ALLOWED_HOSTS": ["127.0.0.1"]},
            }
        },
        "ROUTES": {"events.*": "fanout"},
    }
    assert check_settings() == []
    outbox.send("events.order", {"subscriber": "a", "id": 1})
    outbox.send("events.order", {"subscriber": "b", "id": 1})
    relay()
    by_path = {r.path: r for r in server.requests}
    assert set(by_path) == {"/a", "/b"}
    standardwebhooks.Webhook(SECRET).verify(by_path["/a"].body, by_path["/a"].headers)
    standardwebhooks.Webhook(OTHER_SECRET).verify(by_path["/b"].body, by_path["/b"].headers)
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(SECRET).verify(by_path["/b"].body, by_path["/b"].headers)


def signed_request(body: bytes, headers: dict[str, str]):
    return RequestFactory().post(
        "/in", data=body, content_type="application/json", headers={k: v for k, v in headers.items()}
    )


def test_verify_accepts_requests_signed_by_another_implementation():
    body = b'{"id":1,"ok":true}'
    now = dt.datetime.now(dt.UTC)
    signature = standardwebhooks.Webhook(SECRET).sign("msg_1", now, body.decode())
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(int(now.timestamp())), "webhook-signature": signature}
    assert verify(signed_request(body, headers), SECRET) == {"id": 1, "ok": True}
    assert verify(signed_request(body, headers), [OTHER_SECRET, SECRET]) == {"id": 1, "ok": True}  # rotation


def test_verify_rejects_with_clear_errors():
    body = b'{"id":1}'
    stamp = int(time.time())
    good = {"webhook-id": "m1", "webhook-timestamp": str(stamp), "webhook-signature": sign(SECRET, "m1", stamp, body)}
    assert verify(signed_request(body, good), SECRET) == {"id": 1}
    with pytest.raises(WebhookVerificationError, match="body was altered"):
        verify(signed_request(b'{"id":2}', good), SECRET)
    with pytest.raises(WebhookVerificationError, match="wrong secret"):
        verify(signed_request(body, good), OTHER_SECRET)
    with pytest.raises(WebhookVerificationError, match="missing webhook-id"):
        verify(signed_request(body, {}), SECRET)
    old = stamp - 3600
    stale = {**good, "webhook-timestamp": str(old), "webhook-signature": sign(SECRET, "m1", old, body)}
    with pytest.raises(WebhookVerificationError, match="in the past, beyond the 300s tolerance"):
        verify(signed_request(body, stale), SECRET)
    assert verify(signed_request(body, stale), SECRET, tolerance=7200) == {"id": 1}
    with pytest.raises(WebhookVerificationError, match="not usable"):
        verify(signed_request(body, good), "not-a-secret")


def test_new_secrets_work_with_standardwebhooks():
    secret = new_secret()
    body = "{}"
    stamp = int(time.time())
    headers = {"webhook-id": "x", "webhook-timestamp": str(stamp), "webhook-signature": sign(secret, "x", stamp, b"{}")}
    standardwebhooks.Webhook(secret).verify(body, headers)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"URL": "https://h.example.com/in", "SECRET": SECRET}, set()),
        ({"URL": "https://h.example.com/in"}, {"django_outbox.E048"}),
        ({"URL": "ftp://h.example.com/in", "SECRET": SECRET}, {"django_outbox.E042"}),
        ({"URL": "https://h.example.com/in", "SECRET": "plain-text"}, {"django_outbox.E043"}),
        ({"RESOLVER": "no.such.resolver"}, {"django_outbox.E044"}),
        ({"RESOLVER": f"{__name__}.SECRET"}, {"django_outbox.E044"}),
        ({"URL": "https://h.example.com/in", "SECRET": SECRET, "TIMEOUT": 0}, {"django_outbox.E045"}),
        ({"URL": "https://h.example.com/in", "SECRET": SECRET, "ALLOWED_HOSTS": "localhost"}, {"django_outbox.E046"}),
        ({"URL": "https://h.example.com/in", "SECRET": SECRET, "URLS": []}, {"django_outbox.E047"}),
    ],
)
def test_checks(settings, options, expected):
    settings.OUTBOX = {"TRANSPORTS": {"hooks": {"BACKEND": BACKEND, "OPTIONS": options}}}
    assert {m.id for m in check_settings()} == expected


def test_an_idempotency_key_outside_ascii_is_sent_percent_encoded(hooks, server):
    """HTTP header values are ASCII; a key any other transport carries as it is must not fail every attempt."""
    from urllib.parse import unquote

    message = outbox.send("orders.created", {"id": 7}, idempotency_key="заказ-7 ✓")
    assert relay().stats.delivered == 1
    (request,) = server.requests
    sent = request.headers["idempotency-key"]
    assert sent.isascii() and unquote(sent) == "заказ-7 ✓"
    outbox.send("orders.created", {"id": 8}, idempotency_key="plain-8%")  # ASCII stays as it is
    relay()
    assert server.requests[-1].headers["idempotency-key"] == "plain-8%"
    assert Message.objects.get(pk=message.pk).status == Message.Status.DELIVERED
