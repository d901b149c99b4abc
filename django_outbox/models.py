"""Every model of the app, as Django and users import them (``django_outbox.models.Message``).

The outbox's own tables live in ``store.models``, the archive in ``retention.models``, the email log
proxy in ``mail.models``; each is imported here, so this is still the one module to import models from.
The inbox's and idempotency's tables are defined here.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .limits import (
    INBOX_MESSAGE_ID_MAX_LENGTH,
    INBOX_SOURCE_MAX_LENGTH,
    REQUEST_KEY_MAX_LENGTH,
    REQUEST_SCOPE_MAX_LENGTH,
)
from .mail.models import OutboxEmail
from .retention.models import ArchivedAttempt, ArchivedMessage
from .store.models import Attempt, Message, Worker

__all__ = [
    "ArchivedAttempt",
    "ArchivedMessage",
    "Attempt",
    "IdempotencyRecord",
    "InboxMessage",
    "Message",
    "OutboxEmail",
    "Worker",
]


class InboxMessage(models.Model):
    """One row per message a consumer has processed, written in the consumer's own transaction.

    The unique (source, message_id) pair is the deduplication: a redelivery finds the row and is
    skipped. Rows older than ``OUTBOX["INBOX_RETENTION"]`` are purged, which bounds the dedupe window.
    """

    id = models.BigAutoField(primary_key=True)
    source = models.CharField(max_length=INBOX_SOURCE_MAX_LENGTH)
    message_id = models.CharField(max_length=INBOX_MESSAGE_ID_MAX_LENGTH)
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-id"]
        verbose_name = _("inbox message")
        verbose_name_plural = _("inbox messages")
        constraints = [
            models.UniqueConstraint(fields=["source", "message_id"], name="outbox_inbox_source_message_uniq"),
        ]
        indexes = [models.Index(fields=["received_at"], name="outbox_inbox_received_idx")]

    def __str__(self) -> str:
        return f"{self.source}:{self.message_id}"


class IdempotencyRecord(models.Model):
    """The stored outcome of one ``Idempotency-Key`` request, or the claim of a request still running.

    An in-progress row is committed before the view runs, so concurrent retries see it and get 409;
    the view's writes and the completed response then commit together in one transaction.
    """

    class State(models.TextChoices):
        IN_PROGRESS = "in_progress", _("in progress")
        COMPLETED = "completed", _("completed")

    id = models.BigAutoField(primary_key=True)
    scope = models.CharField(max_length=REQUEST_SCOPE_MAX_LENGTH)
    key = models.CharField(max_length=REQUEST_KEY_MAX_LENGTH)
    fingerprint = models.CharField(max_length=64)
    state = models.CharField(max_length=16, choices=State.choices)
    # Fences the request that owns an in-progress row: whoever takes over an abandoned claim changes it.
    lock_token = models.CharField(max_length=32, null=True, blank=True)  # noqa: DJ001
    locked_until = models.DateTimeField(null=True, blank=True)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_headers = models.JSONField(null=True, blank=True)
    response_body = models.BinaryField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    completed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["-id"]
        verbose_name = _("idempotency record")
        verbose_name_plural = _("idempotency records")
        constraints = [
            models.UniqueConstraint(fields=["scope", "key"], name="outbox_idem_scope_key_uniq"),
        ]
        indexes = [models.Index(fields=["expires_at"], name="outbox_idem_expires_idx")]

    def __str__(self) -> str:
        return f"{self.scope} {self.key} ({self.state})"
