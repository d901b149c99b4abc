"""Per-key commit order without the cluster-wide fence: ``send()`` with a key now takes a transaction-scoped
advisory lock on the key before its row takes an id (docs/ordering.md), so claims no longer stamp keyed
rows with a transaction id and wait for every older transaction of the server. The stamp's column and its
partial index go.

Workers of an earlier version write that column in their claim: once this has run their claims fail (and
are retried, nothing is lost) until they are restarted with this version, which works with the schema
before and after it. Upgrade web processes first, then workers (see the changelog).
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_outbox", "0006_message_content_permission"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="message", name="outbox_msg_unfenced_idx"),
        migrations.RemoveField(model_name="message", name="visible_after_xid"),
    ]
