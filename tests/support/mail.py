"""Django email through the outbox to a real SMTP server on loopback, for the mail, admin and browser tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import django
import pytest

from django_outbox.worker import Relay, RelayConfig

from .servers import SMTPServer

#: Django 6.1 configures mail as named MAILERS; before it, EMAIL_BACKEND and its EMAIL_* settings.
MAILERS = django.VERSION >= (6, 1)


def smtp_options(port: int) -> dict[str, object]:
    return {"host": "127.0.0.1", "port": port, "timeout": 5}


@pytest.fixture
def mail_via_outbox(settings) -> Callable[[int], None]:
    """Route Django email through the outbox; returns a function pointing the worker at an SMTP port."""

    def point_at(port: int) -> None:
        if MAILERS:
            settings.MAILERS = {
                "default": {"BACKEND": "django_outbox.mail.EmailBackend"},
                "smtp": {"BACKEND": "django.core.mail.backends.smtp.EmailBackend", "OPTIONS": smtp_options(port)},
            }
            settings.OUTBOX = {**settings.OUTBOX, "EMAIL_MAILER": "smtp"}
        else:
            settings.EMAIL_BACKEND = "django_outbox.mail.EmailBackend"
            settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", port, 5
            settings.OUTBOX = {**settings.OUTBOX, "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend"}

    return point_at


@pytest.fixture
def smtp(mail_via_outbox: Callable[[int], None]) -> Iterator[SMTPServer]:
    server = SMTPServer()
    mail_via_outbox(server.port)
    yield server
    server.stop()


def relay() -> Relay:
    """One in-process worker run until the outbox is empty, as the mail tests deliver what they sent."""
    worker = Relay(RelayConfig.from_settings(until_empty=True, poll_interval=0.05, notify=False))
    worker.run()
    return worker
