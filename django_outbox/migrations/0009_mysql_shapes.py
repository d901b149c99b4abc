"""MariaDB/MySQL only: what Django's ``mysql`` backend leaves out, and the producers' per-key lock rows.

Django drops conditional ``UniqueConstraint``s there without a word, so after 0004 nothing kept
``idempotency_key`` unique and a repeated key would have written a second message. MariaDB and MySQL let a
unique index hold many NULLs, so a plain one serves. ``django_outbox_key_lock`` holds one row per message
key: ``send()`` of a keyed message locks its row until the producer's transaction ends, which keeps each
key's commit order equal to its id order (store/mysql.py). Nothing happens on other databases.

The claim's ``(status, id)`` index is made here too: 0008 dropped the full ``(status, id)`` index that
PostgreSQL and SQLite replace with partial ones (Django's ``mysql`` backend makes those indexes without
their conditions), and the claim names its index (``FORCE INDEX``): without an index behind its
``ORDER BY``, a ``SKIP LOCKED`` claim on InnoDB gives a second session no rows (docs/databases.md).
"""

from django.db import migrations

KEY_LOCK = (
    "CREATE TABLE django_outbox_key_lock (`key` varchar(200) NOT NULL PRIMARY KEY)"
    " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
)
IDEMPOTENCY_INDEX = (
    "CREATE UNIQUE INDEX outbox_msg_idem_key_uniq ON django_outbox_message (idempotency_key)"
)
CLAIM_INDEX = "CREATE INDEX outbox_msg_status_id_idx ON django_outbox_message (status, id)"


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(IDEMPOTENCY_INDEX)
    schema_editor.execute(CLAIM_INDEX)
    schema_editor.execute(KEY_LOCK)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute("DROP TABLE django_outbox_key_lock")
    schema_editor.execute("DROP INDEX outbox_msg_status_id_idx ON django_outbox_message")
    schema_editor.execute("DROP INDEX outbox_msg_idem_key_uniq ON django_outbox_message")


class Migration(migrations.Migration):
    dependencies = [
        ("django_outbox", "0008_hot_table_indexes"),
    ]

    operations = [migrations.RunPython(forwards, backwards, atomic=False, elidable=False)]
