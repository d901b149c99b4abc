"""The check of ``safe/0004_check`` as ``makemigrations`` writes it."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = (("django_outbox", "0003_column"),)

    operations = (
        migrations.AddConstraint(
            "message", models.CheckConstraint(condition=models.Q(priority__gte=0), name="outbox_msg_priority_check")
        ),
    )
