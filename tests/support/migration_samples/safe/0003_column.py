"""A column that may be NULL (the previous release's INSERT does not name it), added under a bounded lock
wait with retries."""

from django.db import migrations, models

from django_outbox.store.online import WithLockTimeout


class Migration(migrations.Migration):
    atomic = False
    dependencies = (("django_outbox", "0002_index"),)

    operations = (WithLockTimeout([migrations.AddField("message", "priority", models.IntegerField(null=True))]),)
