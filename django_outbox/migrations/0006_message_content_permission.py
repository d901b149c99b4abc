"""The ``view_message_content`` permission: in the admin, ``view_message`` alone no longer shows email
bodies, Bcc lists, secret headers or the payloads of sensitive topics (docs/admin.md)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_outbox", "0005_worker_housekeeping"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="message",
            options={
                "ordering": ["-id"],
                "permissions": [
                    ("retry_message", "Can retry outbox messages"),
                    ("cancel_message", "Can cancel outbox messages"),
                    ("view_message_content", "Can view the content of outbox messages"),
                ],
                "verbose_name": "outbox message",
                "verbose_name_plural": "outbox messages",
            },
        ),
    ]
