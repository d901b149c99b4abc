"""The column of ``safe/0003_column`` as ``makemigrations`` writes it."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = (("django_outbox", "0002_index"),)

    operations = (migrations.AddField("message", "priority", models.IntegerField(null=True)),)
