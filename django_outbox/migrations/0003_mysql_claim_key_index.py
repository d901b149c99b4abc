"""MariaDB/MySQL: the index the claim finds its messages on, built without blocking writes.

PostgreSQL and SQLite claim a key's messages in runs off a partial index of the open keyed rows
(``outbox_msg_key_open_idx``) and unkeyed ones off another (``outbox_msg_unkeyed_idx``). MariaDB and MySQL
have no partial index: the claim walked every pending row in id order and asked each keyed one whether an
earlier message of its key was open, one message per key per claim, each ask walking back through the
key's delivered history. A virtual column gives them both indexes in one: the key while a keyed message
is open (pending, processing or dead), an empty string while an unkeyed one is pending (no key is
empty), NULL otherwise.

The column is added in place (a virtual column takes no storage and no table copy) and the index is built
``ALGORITHM=INPLACE, LOCK=NONE``: the server refuses rather than block ``send()`` or the claims. But every
status change touches the column, and InnoDB applies the changes logged during the build under a lock at
its end: on a large table with workers draining, ``send()`` waited 13 s at 10,000,000 messages (40 ms
with the workers stopped; docs/upgrading.md). The migration says so in the log when the table is large.
Nothing happens on PostgreSQL or SQLite. The previous release's code neither reads nor writes the column.
"""

import logging
from typing import Any

from django.db import migrations

from django_outbox.store.mysql import CLAIM_KEY_COLUMN, CLAIM_KEY_INDEX, claim_key_column_sql

TABLE = "django_outbox_message"
ONLINE = "ALGORITHM=INPLACE, LOCK=NONE"
#: Rows (the server's estimate) above which the build's final lock is long if workers drain meanwhile.
LARGE = 1_000_000

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
                "building the claim's index on about %s messages: with outbox workers draining meanwhile, "
                "send() can wait seconds at the build's end; stop the workers while this migration runs "
                "(docs/upgrading.md)",
                f"{int(row[0]):,}",
            )
    schema_editor.execute(f"ALTER TABLE {TABLE} ADD COLUMN {claim_key_column_sql(schema_editor.connection)}, {ONLINE}")
    schema_editor.execute(f"ALTER TABLE {TABLE} ADD INDEX {CLAIM_KEY_INDEX} ({CLAIM_KEY_COLUMN}), {ONLINE}")


def remove(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(f"ALTER TABLE {TABLE} DROP INDEX {CLAIM_KEY_INDEX}, {ONLINE}")
    schema_editor.execute(f"ALTER TABLE {TABLE} DROP COLUMN {CLAIM_KEY_COLUMN}, {ONLINE}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_outbox", "0002_pending_unkeyed_index")]

    operations = [migrations.RunPython(add, remove, elidable=False)]
