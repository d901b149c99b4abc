"""An index built without blocking writes: outside a transaction on PostgreSQL (``atomic = False``)."""

from django.db import migrations, models

from django_outbox.store.online import AddIndexOnline


class Migration(migrations.Migration):
    atomic = False
    dependencies = (("django_outbox", "0003_mysql_claim_key_index"),)

    operations = (AddIndexOnline("message", models.Index(fields=["topic"], name="outbox_msg_topic_idx")),)
