"""MariaDB/MySQL: an index of open keyed messages by key, built without blocking writes.

PostgreSQL and SQLite claim a key's messages in runs off a partial index of the open keyed rows
(``outbox_msg_key_open_idx``). MariaDB and MySQL have no partial index: the claim walked every pending
row in id order and asked each keyed one whether an earlier message of its key was open, one message per
key per claim, each ask walking back through the key's delivered history. A virtual column that holds the
key while the message is open (pending, processing or dead) and NULL otherwise gives them the same
index: NULL for unkeyed and finished messages, so a status change of an unkeyed message leaves its entry
as it was.

The column is added in place (a virtual column takes no storage and no table copy) and the index is built
``ALGORITHM=INPLACE, LOCK=NONE``: the server refuses rather than block ``send()`` or the claims. Nothing
happens on PostgreSQL or SQLite. The previous release's code neither reads nor writes the column.
"""

from typing import Any

from django.db import migrations

from django_outbox.store.mysql import OPEN_KEY_COLUMN, OPEN_KEY_INDEX, open_key_column_sql


def add(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(
        f"ALTER TABLE django_outbox_message ADD COLUMN {open_key_column_sql(schema_editor.connection)},"
        " ALGORITHM=INPLACE, LOCK=NONE"
    )
    schema_editor.execute(
        f"ALTER TABLE django_outbox_message ADD INDEX {OPEN_KEY_INDEX} ({OPEN_KEY_COLUMN}), ALGORITHM=INPLACE, LOCK=NONE"
    )


def remove(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(f"ALTER TABLE django_outbox_message DROP INDEX {OPEN_KEY_INDEX}, ALGORITHM=INPLACE, LOCK=NONE")
    schema_editor.execute(f"ALTER TABLE django_outbox_message DROP COLUMN {OPEN_KEY_COLUMN}, ALGORITHM=INPLACE, LOCK=NONE")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_outbox", "0002_pending_unkeyed_index")]

    operations = [migrations.RunPython(add, remove, elidable=False)]
