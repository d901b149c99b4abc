"""The column of ``0003_column`` taken away in a later release, marked post-deploy: no release that can
still be running uses it."""

from django.db import migrations

from django_outbox.store.online import WithLockTimeout


class Migration(migrations.Migration):
    atomic = False
    post_deploy = True
    dependencies = (("django_outbox", "0003_column"),)

    operations = (WithLockTimeout([migrations.RemoveField("message", "priority")]),)
