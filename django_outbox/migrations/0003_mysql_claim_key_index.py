"""MariaDB/MySQL: the column and index the claim finds its messages on, added by one copy of the table.

PostgreSQL and SQLite claim a key's messages in runs off a partial index of the open keyed rows
(``outbox_msg_key_open_idx``) and unkeyed ones off another (``outbox_msg_unkeyed_idx``). MariaDB and MySQL
have no partial index: the claim walked every pending row in id order and asked each keyed one whether an
earlier message of its key was open, one message per key per claim, each ask walking back through the
key's delivered history. A generated column gives them both indexes in one: the key while a keyed message
is open (pending, processing or dead), an empty string while an unkeyed one is pending (no key is
empty), NULL otherwise.

The column is stored, not virtual: beside an indexed virtual column MariaDB can neither add a column
instantly nor rebuild the table without blocking writes, so every later release's expand step would stop
``send()`` for as long as a copy of the table takes. Adding a stored column copies the table once, here,
with the index built in the same copy (``ALGORITHM=COPY, LOCK=SHARED``: reads go on, writes wait for the
copy). A new install's table is empty; on a large table, ``send()`` waits for the whole copy
(docs/upgrading.md), and the migration says so in the log. Nothing happens on PostgreSQL or SQLite. The
previous release's code neither reads nor writes the column.
"""

import logging
from typing import Any

from django.db import migrations

from django_outbox.store.mysql import CLAIM_KEY_COLUMN, CLAIM_KEY_INDEX, claim_key_column_sql

TABLE = "django_outbox_message"
#: A stored generated column can only be added by a copy; the index is built in the same one.
COPY = "ALGORITHM=COPY, LOCK=SHARED"
#: Dropping both rebuilds the table in place, writes going on.
ONLINE = "ALGORITHM=INPLACE, LOCK=NONE"
#: Rows (the server's estimate) above which the copy keeps ``send()`` waiting for seconds.
LARGE = 100_000

logger = logging.getLogger("django_outbox.migrations")


def add(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "mysql":
        return
    if not schema_editor.collect_sql:
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(
                "SELECT table_rows FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = %s",
                [TABLE],
            )
            row = cursor.fetchone()
        if row is not None and int(row[0] or 0) > LARGE:
            logger.warning(
                "adding the claim's column copies the table of about %s messages, and every send() waits "
                "for the copy to end; run this migration when the application can pause sending "
                "(docs/upgrading.md)",
                f"{int(row[0]):,}",
            )
    column = claim_key_column_sql(schema_editor.connection)
    schema_editor.execute(
        f"ALTER TABLE {TABLE} ADD COLUMN {column}, ADD INDEX {CLAIM_KEY_INDEX} ({CLAIM_KEY_COLUMN}), {COPY}"
    )


def remove(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(f"ALTER TABLE {TABLE} DROP INDEX {CLAIM_KEY_INDEX}, DROP COLUMN {CLAIM_KEY_COLUMN}, {ONLINE}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_outbox", "0002_pending_unkeyed_index")]

    operations = [migrations.RunPython(add, remove, elidable=False)]
