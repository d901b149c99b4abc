"""A check added without reading the rows, then validated apart, each under a bounded lock wait."""

from django.db import migrations, models

from django_outbox.store.online import AddCheckNotValid, ValidateCheck, WithLockTimeout

CHECK = models.CheckConstraint(condition=models.Q(priority__gte=0), name="outbox_msg_priority_check")


class Migration(migrations.Migration):
    atomic = False
    dependencies = (("django_outbox", "0003_column"),)

    operations = (
        WithLockTimeout([AddCheckNotValid("message", CHECK)]),
        WithLockTimeout([ValidateCheck("message", CHECK.name)]),
    )
