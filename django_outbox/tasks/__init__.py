"""Django's own task API (``django.tasks``, Django 6.0+) on the outbox: ``TASKS = {"default": {"BACKEND":
"django_outbox.tasks.OutboxBackend"}}``.

A task becomes a message written in the caller's transaction (topic ``tasks.<queue_name>``), run by
``outbox_worker`` like any other; see docs/tasks.md. Django 5.2 has no ``django.tasks``: importing this
package there raises ``ImproperlyConfigured`` naming what to upgrade, rather than an ``ImportError`` from
deep inside.
"""

from __future__ import annotations

import django
from django.core.exceptions import ImproperlyConfigured

if django.VERSION < (6, 0):
    raise ImproperlyConfigured(
        "django_outbox.tasks needs Django 6.0 or later (django.tasks is new in Django 6.0); this is Django "
        f"{django.get_version()}. Upgrade Django, or remove 'django_outbox.tasks.OutboxBackend' from TASKS."
    )

from .backend import OutboxBackend  # only once the version is known to have django.tasks

__all__ = ["OutboxBackend"]
