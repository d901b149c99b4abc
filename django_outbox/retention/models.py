"""The archive: finished messages and their attempts, kept for audit after they leave the hot table.

The tables are created by migration SQL, not by Django (``managed = False``): on PostgreSQL they are
range-partitioned by ``archived_at``, one partition per UTC day, so retention drops whole partitions
instead of deleting rows; their primary keys therefore include ``archived_at``. On SQLite they are
plain tables. ``id`` is the id the message had in the hot table, unique in practice, which is all the
read-only admin needs.
"""

from __future__ import annotations

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils.translation import gettext_lazy as _

from ..limits import IDEMPOTENCY_KEY_MAX_LENGTH, KEY_MAX_LENGTH, TOPIC_MAX_LENGTH, WORKER_ID_MAX_LENGTH


class ArchivedMessage(models.Model):
    class Status(models.TextChoices):
        DELIVERED = "delivered", _("delivered")
        CANCELLED = "cancelled", _("cancelled")

    id = models.BigIntegerField(primary_key=True)
    uuid = models.UUIDField()
    topic = models.CharField(max_length=TOPIC_MAX_LENGTH)
    key = models.CharField(max_length=KEY_MAX_LENGTH, null=True, blank=True)  # noqa: DJ001
    payload = models.JSONField(encoder=DjangoJSONEncoder)
    headers = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    idempotency_key = models.CharField(max_length=IDEMPOTENCY_KEY_MAX_LENGTH, null=True, blank=True)  # noqa: DJ001
    status = models.CharField(max_length=16, choices=Status.choices)
    attempts = models.PositiveIntegerField()
    max_attempts = models.PositiveIntegerField()
    available_at = models.DateTimeField()
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    archived_at = models.DateTimeField()

    class Meta:
        managed = False
        db_table = "django_outbox_archived_message"
        ordering = ("-id",)
        verbose_name = _("archived message")
        verbose_name_plural = _("archived messages")

    def __str__(self) -> str:
        return f"{self.topic} #{self.pk} ({self.status}, archived)"


class ArchivedAttempt(models.Model):
    id = models.BigIntegerField(primary_key=True)
    message = models.ForeignKey(
        ArchivedMessage, on_delete=models.DO_NOTHING, db_constraint=False, related_name="attempt_log"
    )
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=WORKER_ID_MAX_LENGTH, blank=True, default="")
    outcome = models.CharField(max_length=16)
    error = models.TextField(blank=True, default="")
    archived_at = models.DateTimeField()

    class Meta:
        managed = False
        db_table = "django_outbox_archived_attempt"
        ordering = ("message_id", "number", "id")
        verbose_name = _("archived attempt")
        verbose_name_plural = _("archived attempts")

    def __str__(self) -> str:
        return f"attempt {self.number} of archived message #{self.message_id}: {self.outcome}"
