"""The no-op task of bench/tasks.py, imported by path by both systems' workers.

``BENCH_TASKS_SYSTEM=django-tasks-db`` takes ``task`` from the django-tasks backport (what django-tasks-db
runs on); otherwise from Django 6's own ``django.tasks`` (what ``django_outbox.tasks`` runs on). Imported
only after ``django.setup()``: building the backend may need the models.
"""

from __future__ import annotations

import os

if os.environ.get("BENCH_TASKS_SYSTEM") == "django-tasks-db":
    from django_tasks import task
else:
    from django.tasks import task


@task()
def noop(n: int) -> None:
    """The no-op task."""
