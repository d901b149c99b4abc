"""The no-op task of bench/tasks.py, imported by path by both systems' workers, after ``django.setup()``:
from the django-tasks backport with ``BENCH_TASKS_SYSTEM=django-tasks-db``, else from Django 6's own."""

import os

if os.environ.get("BENCH_TASKS_SYSTEM") == "django-tasks-db":
    from django_tasks import task
else:
    from django.tasks import task


@task()
def noop(n: int) -> None:
    """The no-op task."""
