"""The outbox's own tables: ``Message`` (the hot table), ``Attempt`` (the audit log), ``Worker``.

``Message`` is the hot table: workers claim from it through partial indexes that only cover rows still
in play, so its size is what is pending, not what was ever sent. ``Attempt`` is the audit log.

A leaf: it imports no other module of the project but ``limits``, so the proxies and the archive built
on these tables (``mail.models``, ``retention.models``) import them from here, and ``django_outbox.models``
(the app's models module, which Django imports) re-exports them all without a circle.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..limits import (
    IDEMPOTENCY_KEY_MAX_LENGTH,
    KEY_MAX_LENGTH,
    TOPIC_MAX_LENGTH,
    WORKER_ID_MAX_LENGTH,
)


class BlockRangeIndex(models.Index):
    """A BRIN index on PostgreSQL, a B-tree elsewhere.

    For a column that follows the insertion order (a creation or finish time): a BRIN index holds one
    summary per range of table pages, so a new row version costs it next to nothing, where a B-tree
    takes one entry per version (docs/performance.md, "The hot table's indexes").
    """

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        if schema_editor.connection.vendor == "postgresql":
            using = " USING brin"
        return super().create_sql(model, schema_editor, using=using, **kwargs)


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
            # The claim's walk for unkeyed messages (keyed ones are found per key, on the open keys' index):
            # without it, a deep keyed backlog sat in front of every unkeyed message on the pending index.
            models.Index(
                fields=["id"],
                name="outbox_msg_unkeyed_idx",
                condition=models.Q(status="pending", key__isnull=True),
            ),
            # "When is the next message due?" for a sleeping worker.
            models.Index(fields=["available_at"], name="outbox_msg_due_idx", condition=models.Q(status="pending")),
            # The rows in flight, by holder: the heartbeat extends a worker's leases through it, and the
            # reaper reads the (few) rows in flight for expired ones. Not on ``locked_until``, which the
            # heartbeat rewrites: with no index on it, extending a lease is a HOT update.
            models.Index(fields=["locked_by"], name="outbox_msg_lease_idx", condition=models.Q(status="processing")),
            # The admin's search by key and a message's page (the other messages of its key), newest first.
            models.Index(fields=["key", "id"], name="outbox_msg_key_idx", condition=models.Q(key__isnull=False)),
            # The admin's created-date filter. A block-range index: a handful of entries per thousand rows,
            # not one per row version, so the claim and the record do not pay for it (PostgreSQL; a
            # B-tree elsewhere).
            BlockRangeIndex(fields=["created_at"], name="outbox_msg_created_idx"),
            # The admin's views of finished messages by status, newest first, their counts, and the dead
            # messages per topic: an entry is written once, when the message is finished, where an index
            # on (status, id) of every row took one at send, at claim and at the outcome. Pending rows
            # are listed through the pending index, rows in flight through the lease index. ``topic`` is a
            # key column, not an ``INCLUDE`` one: SQLite and MySQL have no non-key columns, and Django
            # warns (models.W040) on every command there.
            models.Index(
                fields=["status", "id", "topic"],
                name="outbox_msg_settled_idx",
                condition=models.Q(status__in=["delivered", "dead", "cancelled"]),
            ),
            # The admin's topic filter and search, newest first (every status: the one full index the
            # admin keeps besides the primary key and the uuid).
            models.Index(fields=["topic", "id"], name="outbox_msg_topic_id_idx"),
            # Per-key order: "is an earlier message of this key still open?" probes only open rows, so the
            # answer costs the same however many delivered messages the key has had.
            models.Index(
                fields=["key", "id"],
                name="outbox_msg_key_open_idx",
                condition=models.Q(key__isnull=False, status__in=["pending", "processing", "dead"]),
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

    @classmethod
    def check(cls, **kwargs: Any) -> list[Any]:
        """Django's own checks, less its warnings that MariaDB/MySQL ignore the conditions of this
        model's partial indexes and unique constraint (``models.W036``, ``models.W037``): the initial
        migration gives those their shapes there (a plain unique index for the idempotency key, the claim's
        ``(status, id)`` index), and check E114 reports a database without them. Left in, a new
        MariaDB project got eight warnings on every command; other models' warnings are untouched."""
        return [e for e in super().check(**kwargs) if e.id not in _MYSQL_SHAPED_BY_MIGRATION]


#: Django's warnings about conditions MariaDB/MySQL ignore, answered for ``Message`` by the initial migration.
_MYSQL_SHAPED_BY_MIGRATION = frozenset({"models.W036", "models.W037"})


class Attempt(models.Model):
    class Outcome(models.TextChoices):
        DELIVERED = "delivered", _("delivered")
        FAILED = "failed", _("failed")
        ABANDONED = "abandoned", _("abandoned")

    id = models.BigAutoField(primary_key=True)
    # No foreign key in the database: the record inserts an attempt only for a message it finds in the
    # table, in the same statement (or beside the archived one), so the per-row check and the lock it
    # takes on the message row bought nothing on the hot path. The ORM relation (``attempt_log``) stays.
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="attempt_log", db_constraint=False)
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
            # Attempts are only ever appended, so a block-range index on their time is exact enough.
            BlockRangeIndex(fields=["finished_at"], name="outbox_attempt_finished_idx"),
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
