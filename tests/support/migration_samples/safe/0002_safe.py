"""The same changes done the safe way: a bounded wait for the lock, an index built concurrently (outside a
transaction), and a column that may be NULL."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False
    dependencies = (("django_outbox", "0001_initial"),)

    operations = (
        migrations.RunSQL("SET lock_timeout = '2s'", "SET lock_timeout = '2s'"),
        AddIndexConcurrently("message", models.Index(fields=["topic"], name="outbox_msg_topic_idx")),
        migrations.AddField("message", "priority", models.IntegerField(null=True)),
        migrations.RunSQL("RESET lock_timeout", "RESET lock_timeout"),
    )
