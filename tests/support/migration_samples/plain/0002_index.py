"""The index of ``safe/0002_index`` as ``makemigrations`` writes it: the benchmark's reference."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = (("django_outbox", "0003_mysql_claim_key_index"),)

    operations = (migrations.AddIndex("message", models.Index(fields=["topic"], name="outbox_msg_topic_idx")),)
