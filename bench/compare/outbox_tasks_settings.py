"""bench/tasks.py: the benchmark's settings with Django 6's tasks on ``django_outbox.tasks.OutboxBackend``."""

from bench.settings import *  # noqa: F403

TASKS = {"default": {"BACKEND": "django_outbox.tasks.OutboxBackend"}}
