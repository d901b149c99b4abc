"""MariaDB/MySQL only: what Django's ``mysql`` backend leaves out, and the producers' per-key lock rows.

Django drops conditional ``UniqueConstraint``s there without a word, so after 0004 nothing kept
``idempotency_key`` unique and a repeated key would have written a second message. MariaDB and MySQL let a
unique index hold many NULLs, so a plain one serves. ``django_outbox_key_lock`` holds one row per message
key: ``send()`` of a keyed message locks its row until the producer's transaction ends, which keeps each
key's commit order equal to its id order (store/mysql.py). Keys, topics and the inbox's and
``Idempotency-Key`` records' keys are compared byte for byte (a binary NO PAD collation), as on the other
databases.
Nothing happens on other databases.

The claim's ``(status, id)`` index is made here too: 0008 dropped the full ``(status, id)`` index that
PostgreSQL and SQLite replace with partial ones (Django's ``mysql`` backend makes those indexes without
their conditions), and the claim names its index (``FORCE INDEX``): without an index behind its
``ORDER BY``, a ``SKIP LOCKED`` claim on InnoDB gives a second session no rows (docs/databases.md).
"""

from typing import Any

from django.db import migrations

KEY_LOCK = (
    "CREATE TABLE django_outbox_key_lock (`key` varchar(200) COLLATE {collation} NOT NULL PRIMARY KEY)"
    " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
)
#: Columns compared as opaque strings: byte for byte, as on PostgreSQL and SQLite. The server's default
#: collation (utf8mb4_general_ci on MariaDB) calls "Ab3x" and "ab3X", or "é" and "e", equal: a second
#: message whose idempotency key differed only in case was taken for a repeat and never written, and
#: two keys of that kind shared their order. (table, column, definition without the collation)
BYTEWISE = [
    ("django_outbox_message", "topic", "varchar(200) NOT NULL"),
    ("django_outbox_message", "`key`", "varchar(200) NULL"),
    ("django_outbox_message", "idempotency_key", "varchar(200) NULL"),
    ("django_outbox_inboxmessage", "source", "varchar(200) NOT NULL"),
    ("django_outbox_inboxmessage", "message_id", "varchar(255) NOT NULL"),
    ("django_outbox_idempotencyrecord", "scope", "varchar(255) NOT NULL"),
    ("django_outbox_idempotencyrecord", "`key`", "varchar(255) NOT NULL"),
]


def bytewise_collation(connection: Any) -> str:
    """Binary and NO PAD: ``utf8mb4_bin`` still ignores trailing spaces ("k" and "k " collide)."""
    return "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"


def _collate(schema_editor: Any, collation: str) -> None:
    for table, column, definition in BYTEWISE:
        kind, _, nullable = definition.partition(" ")
        schema_editor.execute(
            f"ALTER TABLE {table} MODIFY {column} {kind} CHARACTER SET utf8mb4 COLLATE {collation} {nullable}"
        )


IDEMPOTENCY_INDEX = "CREATE UNIQUE INDEX outbox_msg_idem_key_uniq ON django_outbox_message (idempotency_key)"
CLAIM_INDEX = "CREATE INDEX outbox_msg_status_id_idx ON django_outbox_message (status, id)"


def forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "mysql":
        return
    collation = bytewise_collation(schema_editor.connection)
    _collate(schema_editor, collation)
    schema_editor.execute(IDEMPOTENCY_INDEX)
    schema_editor.execute(CLAIM_INDEX)
    schema_editor.execute(KEY_LOCK.format(collation=collation))


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute("DROP TABLE django_outbox_key_lock")
    schema_editor.execute("DROP INDEX outbox_msg_status_id_idx ON django_outbox_message")
    schema_editor.execute("DROP INDEX outbox_msg_idem_key_uniq ON django_outbox_message")
    _collate(schema_editor, "utf8mb4_general_ci")


class Migration(migrations.Migration):
    dependencies = [
        ("django_outbox", "0008_hot_table_indexes"),
    ]

    operations = [migrations.RunPython(forwards, backwards, atomic=False, elidable=False)]
