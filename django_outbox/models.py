"""The outbox tables.

``Message`` is the hot table: workers claim from it through partial indexes that only cover rows still
in play, so its size is what is pending, not what was ever sent. ``Attempt`` is the audit log.
"""

from __future__ import annotations

import uuid

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .limits import (
    IDEMPOTENCY_KEY_MAX_LENGTH,
    INBOX_MESSAGE_ID_MAX_LENGTH,
    INBOX_SOURCE_MAX_LENGTH,
    KEY_MAX_LENGTH,
    REQUEST_KEY_MAX_LENGTH,
    REQUEST_SCOPE_MAX_LENGTH,
    TOPIC_MAX_LENGTH,
    WORKER_ID_MAX_LENGTH,
)

__all__ = ["Attempt", "IdempotencyRecord", "InboxMessage", "Message", "Worker"]


class Message(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", _("pending")
        PROCESSING = "processing", _("processing")
        DELIVERED = "delivered", _("delivered")
        DEAD = "dead", _("dead")
        CANCELLED = "cancelled", _("cancelled")

    id = models.BigAutoField(primary_key=True)
    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    topic = models.CharField(max_length=TOPIC_MAX_LENGTH)
    # NULL, not "": a message without a key is not ordered with the other keyless ones.
    key = models.CharField(max_length=KEY_MAX_LENGTH, null=True, blank=True)  # noqa: DJ001
    payload = models.JSONField(encoder=DjangoJSONEncoder)
    headers = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    # Unique among the messages that have one (the partial constraint below): a NULL costs no index entry.
    idempotency_key = models.CharField(  # noqa: DJ001
        max_length=IDEMPOTENCY_KEY_MAX_LENGTH, null=True, blank=True
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField()
    available_at = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)
    locked_by = models.CharField(max_length=WORKER_ID_MAX_LENGTH, null=True, blank=True)  # noqa: DJ001
    locked_until = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    # PostgreSQL, keyed messages only: set by the first claim that sees the row, to the first transaction
    # id not yet assigned then. The message is claimable once no transaction below it is still running,
    # so it cannot overtake a lower id of its key whose transaction is still open (see docs/ordering.md).
    visible_after_xid = models.BigIntegerField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-id"]
        verbose_name = _("outbox message")
        verbose_name_plural = _("outbox messages")
        permissions = [
            ("retry_message", _("Can retry outbox messages")),
            ("cancel_message", _("Can cancel outbox messages")),
            # Payloads of sensitive topics, email bodies, HTML, attachments, Bcc, secret headers (docs/admin.md).
            ("view_message_content", _("Can view the content of outbox messages")),
        ]
        # Every index is one more entry to write per send() and per status change, so the hot table keeps
        # only those a query needs (docs/performance.md measures what that buys).
        constraints = [
            models.UniqueConstraint(
                fields=["idempotency_key"],
                name="outbox_msg_idempotency_key_uniq",
                condition=models.Q(idempotency_key__isnull=False),
            ),
        ]
        indexes = [
            # The claim walks this in id order and stops after a batch: cost stays flat however much
            # history the table holds, because delivered rows are not in it.
            models.Index(fields=["id"], name="outbox_msg_pending_idx", condition=models.Q(status="pending")),
            # "When is the next message due?" for a sleeping worker.
            models.Index(fields=["available_at"], name="outbox_msg_due_idx", condition=models.Q(status="pending")),
            # The reaper looks for expired leases only among rows in flight.
            models.Index(fields=["locked_until"], name="outbox_msg_lease_idx", condition=models.Q(status="processing")),
            models.Index(fields=["status", "topic"], name="outbox_msg_status_topic_idx"),
            models.Index(fields=["key", "id"], name="outbox_msg_key_idx", condition=models.Q(key__isnull=False)),
            # The admin's created-date filter: its bounded count would otherwise scan the table.
            models.Index(fields=["created_at"], name="outbox_msg_created_idx"),
            # The admin's default views, newest first: filtered by status or by topic, then ordered by id,
            # so a page of a million-row table is read straight off an index.
            models.Index(fields=["status", "id"], name="outbox_msg_status_id_idx"),
            models.Index(fields=["topic", "id"], name="outbox_msg_topic_id_idx"),
            # Per-key order: "is an earlier message of this key still open?" probes only open rows, so the
            # answer costs the same however many delivered messages the key has had.
            models.Index(
                fields=["key", "id"],
                name="outbox_msg_key_open_idx",
                condition=models.Q(key__isnull=False, status__in=["pending", "processing", "dead"]),
            ),
            # Keyed rows no claim has fenced yet (PostgreSQL): a handful at any time.
            models.Index(
                fields=["id"],
                name="outbox_msg_unfenced_idx",
                condition=models.Q(status="pending", key__isnull=False, visible_after_xid__isnull=True),
            ),
            # Housekeeping takes finished messages oldest first and stops at the cutoff.
            models.Index(
                fields=["created_at"],
                name="outbox_msg_finished_idx",
                condition=models.Q(status__in=["delivered", "cancelled"]),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.topic} #{self.pk} ({self.status})"


class Attempt(models.Model):
    class Outcome(models.TextChoices):
        DELIVERED = "delivered", _("delivered")
        FAILED = "failed", _("failed")
        ABANDONED = "abandoned", _("abandoned")

    id = models.BigAutoField(primary_key=True)
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=WORKER_ID_MAX_LENGTH, blank=True, default="")
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["message_id", "number", "id"]
        verbose_name = _("delivery attempt")
        verbose_name_plural = _("delivery attempts")
        indexes = [
            # The overview's per-minute chart reads only the last hour of attempts.
            models.Index(fields=["finished_at"], name="outbox_attempt_finished_idx"),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of message #{self.message_id}: {self.outcome}"

    @property
    def duration_seconds(self) -> float | None:
        if self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


class Worker(models.Model):
    """One row per running ``outbox_worker`` process, refreshed by its heartbeat.

    Operators read it to see who is alive; nothing in the delivery path depends on it.
    """

    worker_id = models.CharField(max_length=WORKER_ID_MAX_LENGTH, primary_key=True)
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    last_seen = models.DateTimeField()
    in_flight = models.PositiveIntegerField(default=0)
    delivered = models.PositiveBigIntegerField(default=0)
    failed = models.PositiveBigIntegerField(default=0)
    stopped_at = models.DateTimeField(null=True, blank=True)
    #: Housekeeping rounds of this worker that raised, and the last one's error ("" once a round succeeds).
    housekeeping_failures = models.PositiveBigIntegerField(default=0)
    housekeeping_error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-last_seen"]
        verbose_name = _("outbox worker")
        verbose_name_plural = _("outbox workers")

    def __str__(self) -> str:
        return self.worker_id


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


from .archive_models import ArchivedAttempt, ArchivedMessage  # noqa: E402, F401  (the audit archive)
from .mail.models import OutboxEmail  # noqa: E402, F401  (the email log proxy; defined there, registered here)
