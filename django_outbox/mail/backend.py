"""``EMAIL_BACKEND = "django_outbox.mail.EmailBackend"``: emails become outbox messages.

``send_mail()`` and friends then write to the outbox in the caller's transaction instead of talking to
a mail server: the email goes out only if the transaction commits, and a mail server that is down
delays it instead of failing the request. The worker sends it with the backend named by
``OUTBOX["EMAIL_BACKEND"]`` (or the ``OUTBOX["EMAIL_MAILER"]`` alias on Django 6.1+).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.mail import EmailMessage
from django.core.mail.backends.base import BaseEmailBackend
from django.db import transaction

from ..api import outbox
from ..conf import EMAIL_TOPIC, get_settings
from ..exceptions import IdempotencyConflictError
from .links import IDEMPOTENCY_PREFIX, find_view_id, new_view_id
from .password_reset import PASSWORD_RESET, sent_by_password_reset_form
from .payload import header, html_of, to_payload


class ReusedBrowserLinkError(ValueError):
    """Two different emails carried the same view-in-browser link."""


class EmailBackend(BaseEmailBackend):
    def __init__(self, fail_silently: bool = False, *, using: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: Database alias to write to; default ``OUTBOX["DATABASE"]``.
        self.using = using
        self.fail_silently = fail_silently

    def send_messages(self, email_messages: Sequence[EmailMessage]) -> int:
        """Write one outbox message per email with recipients; returns how many were written."""
        written = 0
        for message in email_messages:
            if not message.recipients():
                continue  # as Django's SMTP backend: nobody to send to
            try:
                self._write(message)
            except ImproperlyConfigured:
                raise
            except Exception:
                if not self.fail_silently:
                    raise
            else:
                written += 1
        return written

    def _write(self, message: EmailMessage) -> None:
        view_id = None
        payload = to_payload(message, view_id=None)
        # A reset link is a login: the admin shows it only with the content permission (as every email
        # body), and it gets no view-in-browser page, which anyone holding the link could open.
        password_reset = sent_by_password_reset_form()
        if password_reset:
            payload["protected"] = PASSWORD_RESET
        html = html_of(payload)
        if html is not None and not password_reset:
            view_id = find_view_id(html) or new_view_id()
            payload["view_id"] = view_id
        key = None if view_id is None else IDEMPOTENCY_PREFIX + view_id
        alias = self.using if self.using is not None else get_settings().DATABASE
        try:
            if self.fail_silently:
                # A savepoint, so a failed write that is swallowed leaves the caller's transaction usable.
                with transaction.atomic(using=alias):
                    stored = outbox.send(EMAIL_TOPIC, payload, idempotency_key=key, using=alias)
            else:
                stored = outbox.send(EMAIL_TOPIC, payload, idempotency_key=key, using=alias)
        except IdempotencyConflictError as exc:  # the link's key is taken: the same email or another one?
            if exc.existing is None:  # pragma: no cover - send() always names the message holding the key
                raise
            stored = exc.existing
        if header(stored.payload, "Message-ID") != header(payload, "Message-ID"):
            raise ReusedBrowserLinkError(
                f"This email's view-in-browser link already belongs to outbox message {stored.uuid} "
                f"({stored.payload.get('subject', '')!r}); call browser_link() once for each email."
            )
