"""The email transport's ``OPTIONS["TIMEOUT"]``: one deadline per email, against real misbehaving servers.

Django's SMTP backend waits for ever by default (``EMAIL_TIMEOUT = None``) and, with a timeout, per
socket operation only. Each test runs the real relay over two emails and a local handler message of
the same batch: the emails fail within the deadline (the second without waiting again), the handler
message is delivered.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import django
import pytest
from django.core import mail

from django_outbox import outbox
from django_outbox.checks import check_settings
from django_outbox.conf import EMAIL_TOPIC
from django_outbox.exceptions import OutboxImproperlyConfigured
from django_outbox.mail.transport import EmailTransport
from django_outbox.models import Attempt, Message
from django_outbox.worker import Relay, RelayConfig
from tests.support.servers import SlowServer, SMTPServer

pytestmark = [pytest.mark.database_independent, pytest.mark.django_db(transaction=True)]

TIMEOUT = 1.0
MARGIN = 4.0  # without the deadline each of these servers holds an email for 10 to 30 s
TRANSPORT = "django_outbox.mail.transport.EmailTransport"


def point_at(settings, port: int, **options: object) -> None:
    """Emails through the outbox to ``port``, with no EMAIL_TIMEOUT (Django's default: none)."""
    if django.VERSION >= (6, 1):
        settings.MAILERS = {
            "default": {"BACKEND": "django_outbox.mail.EmailBackend"},
            "smtp": {
                "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
                "OPTIONS": {"host": "127.0.0.1", "port": port},
            },
        }
        extra: dict[str, object] = {"EMAIL_MAILER": "smtp"}
    else:
        settings.EMAIL_BACKEND = "django_outbox.mail.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", port, None
        extra = {"EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend"}
    settings.OUTBOX = {
        **settings.OUTBOX,
        **extra,
        "BACKOFF_BASE_SECONDS": 60,
        "BACKOFF_MAX_SECONDS": 60,
        "TRANSPORTS": {
            **settings.OUTBOX.get("TRANSPORTS", {}),
            "django_outbox.email": {"BACKEND": TRANSPORT, "OPTIONS": {"TIMEOUT": TIMEOUT, **options}},
        },
    }


def send_batch(handler) -> tuple[list[Message], Message, list[str]]:
    handled: list[str] = []
    handler("audit.*", lambda m: handled.append(str(m.uuid)))
    mail.send_mail("first", "body", "shop@example.com", ["ann@example.com"])
    mail.send_mail("second", "body", "shop@example.com", ["bob@example.com"])
    local = outbox.send("audit.logged", {"id": 1})
    return list(Message.objects.filter(topic=EMAIL_TOPIC).order_by("id")), local, handled


def run_relay() -> float:
    started = time.monotonic()
    Relay(RelayConfig.from_settings(until_empty=True, concurrency=1, poll_interval=0.05, notify=False)).run()
    return time.monotonic() - started


def assert_cut_off(emails: list[Message], local: Message, handled: list[str], elapsed: float) -> None:
    assert elapsed < TIMEOUT + MARGIN, f"the batch took {elapsed:.1f} s with TIMEOUT = {TIMEOUT} s"
    first, second = emails
    for email in emails:
        email.refresh_from_db()
        assert email.status == Message.Status.PENDING  # retried later
        assert [a.outcome for a in email.attempt_log.all()] == [Attempt.Outcome.FAILED]
    assert "did not complete the email within 1 s" in first.last_error
    assert "not tried: an earlier email of this batch" in second.last_error
    local.refresh_from_db()
    assert local.status == Message.Status.DELIVERED
    assert handled == [str(local.uuid)]


@pytest.fixture(params=["silent", "drip-greeting"])
def slow(request: pytest.FixtureRequest) -> Iterator[SlowServer]:
    server = SlowServer(request.param, interval=0.2, limit=30)
    yield server
    server.stop()


def test_a_hung_or_dripping_smtp_server_is_cut_off_at_the_deadline(settings, handler, slow):
    point_at(settings, slow.port)
    emails, local, handled = send_batch(handler)
    elapsed = run_relay()
    assert_cut_off(emails, local, handled, elapsed)
    assert slow.accepted == 1  # the second email did not wait for the same server again
    assert slow.closed_by_client.wait(5)


def test_a_slow_data_reply_is_cut_off_at_the_deadline(settings, handler):
    server = SMTPServer()
    server.handler.data_delay = 10
    try:
        point_at(settings, server.port)
        emails, local, handled = send_batch(handler)
        elapsed = run_relay()
        assert_cut_off(emails, local, handled, elapsed)
    finally:
        server.handler.data_delay = 0
        server.stop()


def test_a_timely_server_gets_every_email_of_the_batch_on_one_connection(settings, handler):
    server = SMTPServer()
    server.handler.data_delay = 0.3  # 3 x 0.3 s: beyond TIMEOUT together, each well within it
    try:
        point_at(settings, server.port)
        for n in range(3):
            mail.send_mail(f"n{n}", "body", "shop@example.com", ["ann@example.com"])
        run_relay()
        assert Message.objects.filter(status=Message.Status.DELIVERED).count() == 3
        assert len(server.received) == 3
    finally:
        server.stop()


@pytest.mark.parametrize(
    "options",
    [
        {"TIMEOUT": 0},
        {"TIMEOUT": -1},
        {"TIMEOUT": float("nan")},
        {"TIMEOUT": float("inf")},
        {"TIMEOUT": 10**20},
        {"TIMEOUT": "10"},
        {"TIMEOUT": True},
        {"TIMEOUT": 5, "HOST": "smtp.example.com"},
    ],
)
def test_check_reports_a_bad_timeout_or_option(settings, options):
    point_at(settings, 25, **options)
    messages = [m for m in check_settings() if m.id == "django_outbox.E041"]
    assert len(messages) == 1, check_settings()
    assert "OPTIONS" in messages[0].msg


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0, "60"])
def test_the_transport_refuses_a_bad_timeout_even_without_check(value):
    with pytest.raises(OutboxImproperlyConfigured, match="TIMEOUT"):
        EmailTransport(name="django_outbox.email", options={"TIMEOUT": value})


def test_check_accepts_a_good_timeout(settings):
    point_at(settings, 25, TIMEOUT=30)
    assert [m for m in check_settings() if m.id.startswith("django_outbox.E")] == []
