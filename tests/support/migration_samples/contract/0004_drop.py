"""The column of ``0003_column`` taken away in a migration that is not marked post-deploy: the previous
release's processes, which may still use it, run while ``migrate`` does."""

from django.db import migrations

from django_outbox.store.online import WithLockTimeout


class Migration(migrations.Migration):
    atomic = False
    dependencies = (("django_outbox", "0003_column"),)

    operations = (WithLockTimeout([migrations.RemoveField("message", "priority")]),)
