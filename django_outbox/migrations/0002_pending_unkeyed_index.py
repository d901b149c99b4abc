"""The index the claim walks for unkeyed messages, built without blocking writes.

A claim finds keyed messages per key, on the index of open keyed messages, and unkeyed ones in id order.
On the index of all pending messages that walk passed every keyed message queued before the first
unkeyed one, so its cost grew with a keyed backlog; this index holds only pending unkeyed messages.

PostgreSQL builds it ``CONCURRENTLY`` (``send()`` and the claims go on meanwhile), SQLite as usual;
MariaDB/MySQL get nothing: they ignore an index's condition, and their claim has its own index.
"""

from django.db import migrations, models

from django_outbox.store.online import AddIndexOnline


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_outbox", "0001_initial")]

    operations = [
        AddIndexOnline(
            model_name="message",
            index=models.Index(
                condition=models.Q(("key__isnull", True), ("status", "pending")),
                fields=["id"],
                name="outbox_msg_unkeyed_idx",
            ),
        ),
    ]
