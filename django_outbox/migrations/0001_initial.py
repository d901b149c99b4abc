"""The outbox's schema, made in one step on PostgreSQL, MariaDB/MySQL and SQLite.

The operations first create what the models declare, which Django makes alike on every database; the
last one, ``vendor_shapes``, adds what a model cannot say, per database, in one place:

- PostgreSQL: the archive tables range-partitioned by ``archived_at`` (one partition a day, made ahead
  by housekeeping, so retention drops whole days), and the message table's storage parameters: room on
  each page for a row's next version (``fillfactor``), so extending a lease is a HOT update, and
  autovacuum after a fixed number of changes instead of a fifth of the table (docs/performance.md,
  "Autovacuum").
- MariaDB/MySQL: keys, topics and the inbox's and ``Idempotency-Key`` records' keys compared byte for
  byte (a binary NO PAD collation, as on the other databases); a plain unique index on the idempotency
  key, since Django leaves out conditional unique constraints there; the claim's ``(status, id)`` index,
  which its ``FORCE INDEX`` names; the producers' per-key lock rows (``django_outbox_key_lock``); and
  none of the two partial indexes that Django would make there as copies of other indexes
  (docs/databases.md).
- SQLite, MariaDB and MySQL: the archive tables as plain tables, with an index on ``archived_at``.

Django's migration state is the same on every database and lists the model's indexes as the model
declares them: a later migration that removes or renames ``outbox_msg_pending_idx`` or
``outbox_msg_key_open_idx`` must skip MariaDB/MySQL, where they are not there.

This one migration replaced ten written before the first release. A database migrated to the last of
them (``0010_mysql_index_copies``) has exactly this schema and has this migration's name recorded, so
Django counts it as applied (docs/upgrading.md).
"""

import uuid
from typing import Any

import django.core.serializers.json
import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

import django_outbox.store.models

#: PostgreSQL: the archive, partitioned by day. Its primary keys include ``archived_at``, as a partitioned
#: table's unique keys must.
PG_ARCHIVE = """
CREATE TABLE django_outbox_archived_message (
    id bigint NOT NULL,
    uuid uuid NOT NULL,
    topic varchar(200) NOT NULL,
    key varchar(200) NULL,
    payload jsonb NOT NULL,
    headers jsonb NOT NULL,
    idempotency_key varchar(200) NULL,
    status varchar(16) NOT NULL,
    attempts integer NOT NULL CHECK (attempts >= 0),
    max_attempts integer NOT NULL CHECK (max_attempts >= 0),
    available_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    delivered_at timestamptz NULL,
    last_error text NOT NULL,
    archived_at timestamptz NOT NULL,
    PRIMARY KEY (id, archived_at)
) PARTITION BY RANGE (archived_at);
CREATE INDEX outbox_arch_msg_uuid_idx ON django_outbox_archived_message (uuid);
CREATE INDEX outbox_arch_msg_idem_idx ON django_outbox_archived_message (idempotency_key);
CREATE INDEX outbox_arch_msg_key_idx ON django_outbox_archived_message (key, id);
CREATE INDEX outbox_arch_msg_topic_idx ON django_outbox_archived_message (topic, id);
CREATE TABLE django_outbox_archived_attempt (
    id bigint NOT NULL,
    message_id bigint NOT NULL,
    number integer NOT NULL CHECK (number >= 0),
    started_at timestamptz NOT NULL,
    finished_at timestamptz NULL,
    worker varchar(200) NOT NULL,
    outcome varchar(16) NOT NULL,
    error text NOT NULL,
    archived_at timestamptz NOT NULL,
    PRIMARY KEY (id, archived_at)
) PARTITION BY RANGE (archived_at);
CREATE INDEX outbox_arch_att_message_idx ON django_outbox_archived_attempt (message_id);
"""

#: PostgreSQL: the message table's storage parameters. Every message is inserted once and updated at
#: least twice (claim, outcome); the defaults vacuum after a fifth of the table changed, which with a long
#: history is millions of dead row versions for the claim's index scan to walk past.
PG_MESSAGE_STORAGE = {
    "autovacuum_vacuum_scale_factor": "0.0",
    "autovacuum_vacuum_threshold": "5000",
    "autovacuum_vacuum_insert_scale_factor": "0.0",
    "autovacuum_vacuum_insert_threshold": "20000",
    "autovacuum_analyze_scale_factor": "0.0",
    "autovacuum_analyze_threshold": "20000",
    "autovacuum_vacuum_cost_delay": "0",
    "fillfactor": "80",
}

#: MariaDB/MySQL: columns compared as opaque strings. The server's default collation (utf8mb4_general_ci
#: on MariaDB) calls "Ab3x" and "ab3X", or "é" and "e", equal. (table, column, type, nullability)
MYSQL_BYTEWISE = [
    ("django_outbox_message", "topic", "varchar(200)", "NOT NULL"),
    ("django_outbox_message", "`key`", "varchar(200)", "NULL"),
    ("django_outbox_message", "idempotency_key", "varchar(200)", "NULL"),
    ("django_outbox_inboxmessage", "source", "varchar(200)", "NOT NULL"),
    ("django_outbox_inboxmessage", "message_id", "varchar(255)", "NOT NULL"),
    ("django_outbox_idempotencyrecord", "scope", "varchar(255)", "NOT NULL"),
    ("django_outbox_idempotencyrecord", "`key`", "varchar(255)", "NOT NULL"),
]
#: MariaDB/MySQL: the indexes that take the place of what Django makes there, and the two it would make as
#: copies: ``outbox_msg_pending_idx (id)`` repeats the primary key, ``outbox_msg_key_open_idx (key, id)``
#: repeats ``outbox_msg_key_idx``; each was one more entry to write per ``send()``.
MYSQL_MESSAGE_INDEXES = [
    "ADD UNIQUE INDEX outbox_msg_idem_key_uniq (idempotency_key)",
    "ADD INDEX outbox_msg_status_id_idx (status, id)",
    "DROP INDEX outbox_msg_pending_idx",
    "DROP INDEX outbox_msg_key_open_idx",
]
MYSQL_KEY_LOCK = (
    "CREATE TABLE django_outbox_key_lock (`key` varchar(200) COLLATE {collation} NOT NULL PRIMARY KEY)"
    " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
)


def bytewise_collation(connection: Any) -> str:
    """Binary and NO PAD: ``utf8mb4_bin`` still ignores trailing spaces ("k" and "k " collide)."""
    return "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"


def vendor_shapes(apps: Any, schema_editor: Any) -> None:
    """What the models cannot declare, per database (see the module's docstring)."""
    # Django makes the models' indexes and constraints when the schema editor closes, at the end of the
    # migration: make them now, for the shapes below to change them.
    for statement in schema_editor.deferred_sql:
        schema_editor.execute(statement)
    schema_editor.deferred_sql.clear()
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_ARCHIVE)
        options = ", ".join(f"{name} = {value}" for name, value in PG_MESSAGE_STORAGE.items())
        schema_editor.execute(f"ALTER TABLE django_outbox_message SET ({options})")
        return
    schema_editor.create_model(apps.get_model("django_outbox", "ArchivedMessage"))
    schema_editor.create_model(apps.get_model("django_outbox", "ArchivedAttempt"))
    schema_editor.execute("CREATE INDEX outbox_arch_msg_archived_idx ON django_outbox_archived_message (archived_at)")
    schema_editor.execute("CREATE INDEX outbox_arch_att_archived_idx ON django_outbox_archived_attempt (archived_at)")
    if vendor == "mysql":
        collation = bytewise_collation(schema_editor.connection)
        for table, column, kind, nullable in MYSQL_BYTEWISE:
            schema_editor.execute(
                f"ALTER TABLE {table} MODIFY {column} {kind} CHARACTER SET utf8mb4 COLLATE {collation} {nullable}"
            )
        schema_editor.execute(f"ALTER TABLE django_outbox_message {', '.join(MYSQL_MESSAGE_INDEXES)}")
        schema_editor.execute(MYSQL_KEY_LOCK.format(collation=collation))


def drop_vendor_shapes(apps: Any, schema_editor: Any) -> None:
    """Backwards: the tables no model manages; the others go with their models."""
    if schema_editor.connection.vendor == "mysql":
        schema_editor.execute("DROP TABLE django_outbox_key_lock")
    schema_editor.execute("DROP TABLE django_outbox_archived_attempt")
    schema_editor.execute("DROP TABLE django_outbox_archived_message")


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Worker",
            fields=[
                ("worker_id", models.CharField(max_length=200, primary_key=True, serialize=False)),
                ("hostname", models.CharField(max_length=255)),
                ("pid", models.PositiveIntegerField()),
                ("started_at", models.DateTimeField()),
                ("last_seen", models.DateTimeField()),
                ("in_flight", models.PositiveIntegerField(default=0)),
                ("delivered", models.PositiveBigIntegerField(default=0)),
                ("failed", models.PositiveBigIntegerField(default=0)),
                ("stopped_at", models.DateTimeField(blank=True, null=True)),
                ("housekeeping_error", models.TextField(blank=True, default="")),
                ("housekeeping_failures", models.PositiveBigIntegerField(default=0)),
            ],
            options={
                "verbose_name": "outbox worker",
                "verbose_name_plural": "outbox workers",
                "ordering": ["-last_seen"],
            },
        ),
        migrations.CreateModel(
            name="IdempotencyRecord",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("scope", models.CharField(max_length=255)),
                ("key", models.CharField(max_length=255)),
                ("fingerprint", models.CharField(max_length=64)),
                (
                    "state",
                    models.CharField(
                        choices=[("in_progress", "in progress"), ("completed", "completed")], max_length=16
                    ),
                ),
                ("lock_token", models.CharField(blank=True, max_length=32, null=True)),
                ("locked_until", models.DateTimeField(blank=True, null=True)),
                ("response_status", models.PositiveSmallIntegerField(blank=True, null=True)),
                ("response_headers", models.JSONField(blank=True, null=True)),
                ("response_body", models.BinaryField(blank=True, null=True)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("completed_at", models.DateTimeField(blank=True, null=True)),
                ("expires_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "idempotency record",
                "verbose_name_plural": "idempotency records",
                "ordering": ["-id"],
                "indexes": [models.Index(fields=["expires_at"], name="outbox_idem_expires_idx")],
                "constraints": [models.UniqueConstraint(fields=("scope", "key"), name="outbox_idem_scope_key_uniq")],
            },
        ),
        migrations.CreateModel(
            name="InboxMessage",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("source", models.CharField(max_length=200)),
                ("message_id", models.CharField(max_length=255)),
                ("received_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={
                "verbose_name": "inbox message",
                "verbose_name_plural": "inbox messages",
                "ordering": ["-id"],
                "indexes": [models.Index(fields=["received_at"], name="outbox_inbox_received_idx")],
                "constraints": [
                    models.UniqueConstraint(fields=("source", "message_id"), name="outbox_inbox_source_message_uniq")
                ],
            },
        ),
        migrations.CreateModel(
            name="Message",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("uuid", models.UUIDField(default=uuid.uuid4, editable=False, unique=True)),
                ("topic", models.CharField(max_length=200)),
                ("key", models.CharField(blank=True, max_length=200, null=True)),
                ("payload", models.JSONField(encoder=django.core.serializers.json.DjangoJSONEncoder)),
                (
                    "headers",
                    models.JSONField(blank=True, default=dict, encoder=django.core.serializers.json.DjangoJSONEncoder),
                ),
                ("idempotency_key", models.CharField(blank=True, max_length=200, null=True)),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("pending", "pending"),
                            ("processing", "processing"),
                            ("delivered", "delivered"),
                            ("dead", "dead"),
                            ("cancelled", "cancelled"),
                        ],
                        default="pending",
                        max_length=16,
                    ),
                ),
                ("attempts", models.PositiveIntegerField(default=0)),
                ("max_attempts", models.PositiveIntegerField()),
                ("available_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("delivered_at", models.DateTimeField(blank=True, null=True)),
                ("locked_by", models.CharField(blank=True, max_length=200, null=True)),
                ("locked_until", models.DateTimeField(blank=True, null=True)),
                ("last_error", models.TextField(blank=True, default="")),
            ],
            options={
                "verbose_name": "outbox message",
                "verbose_name_plural": "outbox messages",
                "ordering": ["-id"],
                "permissions": [
                    ("retry_message", "Can retry outbox messages"),
                    ("cancel_message", "Can cancel outbox messages"),
                    ("view_message_content", "Can view the content of outbox messages"),
                ],
                "indexes": [
                    models.Index(
                        condition=models.Q(("status", "pending")), fields=["id"], name="outbox_msg_pending_idx"
                    ),
                    models.Index(
                        condition=models.Q(("status", "pending")), fields=["available_at"], name="outbox_msg_due_idx"
                    ),
                    models.Index(
                        condition=models.Q(("status", "processing")), fields=["locked_by"], name="outbox_msg_lease_idx"
                    ),
                    models.Index(
                        condition=models.Q(("key__isnull", False)), fields=["key", "id"], name="outbox_msg_key_idx"
                    ),
                    django_outbox.store.models.BlockRangeIndex(fields=["created_at"], name="outbox_msg_created_idx"),
                    models.Index(
                        condition=models.Q(("status__in", ["delivered", "dead", "cancelled"])),
                        fields=["status", "id", "topic"],
                        name="outbox_msg_settled_idx",
                    ),
                    models.Index(fields=["topic", "id"], name="outbox_msg_topic_id_idx"),
                    models.Index(
                        condition=models.Q(("key__isnull", False), ("status__in", ["pending", "processing", "dead"])),
                        fields=["key", "id"],
                        name="outbox_msg_key_open_idx",
                    ),
                    models.Index(
                        condition=models.Q(("status__in", ["delivered", "cancelled"])),
                        fields=["created_at"],
                        name="outbox_msg_finished_idx",
                    ),
                ],
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("idempotency_key__isnull", False)),
                        fields=("idempotency_key",),
                        name="outbox_msg_idempotency_key_uniq",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="OutboxEmail",
            fields=[],
            options={
                "verbose_name": "email",
                "verbose_name_plural": "email log",
                "proxy": True,
                "indexes": [],
                "constraints": [],
            },
            bases=("django_outbox.message",),
        ),
        migrations.CreateModel(
            name="Attempt",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("number", models.PositiveIntegerField()),
                ("started_at", models.DateTimeField()),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                ("worker", models.CharField(blank=True, default="", max_length=200)),
                (
                    "outcome",
                    models.CharField(
                        choices=[("delivered", "delivered"), ("failed", "failed"), ("abandoned", "abandoned")],
                        max_length=16,
                    ),
                ),
                ("error", models.TextField(blank=True, default="")),
                (
                    "message",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="attempt_log",
                        to="django_outbox.message",
                    ),
                ),
            ],
            options={
                "verbose_name": "delivery attempt",
                "verbose_name_plural": "delivery attempts",
                "ordering": ["message_id", "number", "id"],
                "indexes": [
                    django_outbox.store.models.BlockRangeIndex(
                        fields=["finished_at"], name="outbox_attempt_finished_idx"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="ArchivedMessage",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("uuid", models.UUIDField()),
                ("topic", models.CharField(max_length=200)),
                ("key", models.CharField(blank=True, max_length=200, null=True)),
                ("payload", models.JSONField(encoder=django.core.serializers.json.DjangoJSONEncoder)),
                (
                    "headers",
                    models.JSONField(blank=True, default=dict, encoder=django.core.serializers.json.DjangoJSONEncoder),
                ),
                ("idempotency_key", models.CharField(blank=True, max_length=200, null=True)),
                (
                    "status",
                    models.CharField(choices=[("delivered", "delivered"), ("cancelled", "cancelled")], max_length=16),
                ),
                ("attempts", models.PositiveIntegerField()),
                ("max_attempts", models.PositiveIntegerField()),
                ("available_at", models.DateTimeField()),
                ("created_at", models.DateTimeField()),
                ("delivered_at", models.DateTimeField(blank=True, null=True)),
                ("last_error", models.TextField(blank=True, default="")),
                ("archived_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "archived message",
                "verbose_name_plural": "archived messages",
                "db_table": "django_outbox_archived_message",
                "ordering": ("-id",),
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="ArchivedAttempt",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("number", models.PositiveIntegerField()),
                ("started_at", models.DateTimeField()),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                ("worker", models.CharField(blank=True, default="", max_length=200)),
                ("outcome", models.CharField(max_length=16)),
                ("error", models.TextField(blank=True, default="")),
                ("archived_at", models.DateTimeField()),
                (
                    "message",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="attempt_log",
                        to="django_outbox.archivedmessage",
                    ),
                ),
            ],
            options={
                "verbose_name": "archived attempt",
                "verbose_name_plural": "archived attempts",
                "db_table": "django_outbox_archived_attempt",
                "ordering": ("message_id", "number", "id"),
                "managed": False,
            },
        ),
        # atomic=False: MariaDB/MySQL cannot roll DDL back, and Django refuses DDL inside a transaction there
        # (PostgreSQL and SQLite run the whole migration in one transaction anyway).
        migrations.RunPython(vendor_shapes, drop_vendor_shapes, atomic=False, elidable=False),
    ]
