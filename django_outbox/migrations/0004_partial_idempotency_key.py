"""Two fewer index entries per message written (docs/performance.md, "What each optimisation bought").

The idempotency key becomes unique only where it is set: a NULL key no longer costs an entry in a unique
index and in the ``varchar_pattern_ops`` index Django adds beside every unique ``CharField``. The new
constraint is created before the old one goes, so uniqueness never lapses.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_outbox", "0003_message_autovacuum"),
    ]

    operations = [
        migrations.AddConstraint(
            model_name="message",
            constraint=models.UniqueConstraint(
                condition=models.Q(("idempotency_key__isnull", False)),
                fields=("idempotency_key",),
                name="outbox_msg_idempotency_key_uniq",
            ),
        ),
        migrations.AlterField(
            model_name="message",
            name="idempotency_key",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
    ]
