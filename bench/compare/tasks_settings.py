"""Settings for django-tasks with the django-tasks-db backend and its ``db_worker``."""

from bench.compare import databases

SECRET_KEY = "bench-only"
USE_TZ = True
INSTALLED_APPS = ["django_tasks", "django_tasks_db"]
DATABASES = databases()
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
