"""The webhook's ``TIMEOUT`` is one deadline for the whole request, against real misbehaving servers.

httpx bounds each read; a receiver that sends a byte now and then, or accepts and never answers, would
otherwise hold the delivery thread, its whole batch and their leases for as long as it likes. Each test
runs the real relay over a batch of two: the webhook to the slow server, then a local handler message
that must not wait past the deadline.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from django_outbox import outbox
from django_outbox.models import Attempt, Message
from django_outbox.worker import Relay, RelayConfig
from tests.support.servers import HTTPServer, Reply, SlowServer

pytestmark = [pytest.mark.database_independent, pytest.mark.django_db(transaction=True)]

SECRET = "whsec_8X64pTf2VJY6eApZYqEgNu+kEOBTpP9F"
BACKEND = "django_outbox.transports.webhook.WebhookTransport"
TIMEOUT = 1.0
#: Generous on a loaded machine; without a whole-request deadline each server holds the request 30 s.
MARGIN = 4.0


def configure(settings: object, url: str, **options: object) -> None:
    settings.OUTBOX = {  # type: ignore[attr-defined]
        **settings.OUTBOX,  # type: ignore[attr-defined]
        "BACKOFF_BASE_SECONDS": 60,  # the failed webhook is not retried within the run
        "BACKOFF_MAX_SECONDS": 60,
        "TRANSPORTS": {
            "hooks": {
                "BACKEND": BACKEND,
                "OPTIONS": {
                    "URL": url,
                    "SECRET": SECRET,
                    "TIMEOUT": TIMEOUT,
                    "ALLOWED_HOSTS": ["127.0.0.1"],
                    **options,
                },
            }
        },
        "ROUTES": {"orders.*": "hooks"},
    }


@pytest.fixture(params=["drip-headers", "drip-body", "silent", "drip-tls"])
def slow(request: pytest.FixtureRequest) -> Iterator[SlowServer]:
    server = SlowServer(request.param, interval=0.2, limit=30)
    yield server
    server.stop()


def test_a_slow_receiver_is_cut_off_at_the_deadline_and_the_batch_goes_on(settings, handler, slow):
    url = slow.url()
    configure(settings, url.replace("http:", "https:") if slow.mode == "drip-tls" else url)
    handled: list[str] = []
    handler("audit.*", lambda m: handled.append(str(m.uuid)))
    hook = outbox.send("orders.created", {"id": 1})
    local = outbox.send("audit.logged", {"id": 2})  # same batch, after the webhook in id order

    started = time.monotonic()
    Relay(RelayConfig.from_settings(until_empty=True, concurrency=1, poll_interval=0.05, notify=False)).run()
    elapsed = time.monotonic() - started

    assert elapsed < TIMEOUT + MARGIN, f"the batch took {elapsed:.1f} s with TIMEOUT = {TIMEOUT} s"
    assert slow.accepted == 1
    hook.refresh_from_db()
    assert hook.status == Message.Status.PENDING  # retried later, like any timeout
    assert hook.attempts == 1
    assert "did not complete within 1 s" in hook.last_error
    (attempt,) = hook.attempt_log.all()
    assert attempt.outcome == Attempt.Outcome.FAILED
    assert "did not complete within 1 s" in attempt.error
    assert (attempt.finished_at - attempt.started_at).total_seconds() < TIMEOUT + 1.0
    local.refresh_from_db()
    assert local.status == Message.Status.DELIVERED
    assert [a.outcome for a in local.attempt_log.all()] == [Attempt.Outcome.DELIVERED]
    assert handled == [str(local.uuid)]
    assert slow.closed_by_client.wait(5), "the transport did not close the connection it gave up on"


def test_a_slow_but_timely_receiver_is_delivered_and_the_connection_is_reused(settings):
    """The deadline is per request: a pooled connection gets a fresh one for each request."""
    server = HTTPServer()
    try:
        server.default = Reply(delay=0.4)
        configure(settings, server.url())
        for n in range(3):  # 3 x 0.4 s: more than TIMEOUT together, each well within it
            outbox.send("orders.created", {"n": n})
        Relay(RelayConfig.from_settings(until_empty=True, concurrency=1, poll_interval=0.05, notify=False)).run()
        assert Message.objects.filter(status=Message.Status.DELIVERED).count() == 3
        assert len({r.client_port for r in server.requests}) == 1
    finally:
        server.stop()


def test_a_large_success_body_is_not_read_to_the_end(settings):
    """A 2xx is delivered after at most DRAIN_MAX_BYTES of its body; the rest is never read."""
    server = HTTPServer()
    try:
        server.default = Reply(body=b"x" * (8 * 1024 * 1024))
        configure(settings, server.url(), TIMEOUT=5)
        message = outbox.send("orders.created", {"id": 1})
        Relay(RelayConfig.from_settings(until_empty=True, concurrency=1, poll_interval=0.05, notify=False)).run()
        message.refresh_from_db()
        assert message.status == Message.Status.DELIVERED
    finally:
        server.stop()
