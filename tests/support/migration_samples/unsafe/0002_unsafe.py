"""What a migration of the hot table must not do: each operation blocks send() on a live table."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = (("django_outbox", "0001_initial"),)

    operations = (
        # A plain CREATE INDEX: inserts wait until the whole table has been read.
        migrations.AddIndex("message", models.Index(fields=["topic"], name="outbox_msg_topic_idx")),
        # NOT NULL without a default: fails on a table with rows, and the previous release's INSERT
        # (which does not name the column) fails after it.
        migrations.AddField("message", "priority", models.IntegerField(), preserve_default=False),
    )
