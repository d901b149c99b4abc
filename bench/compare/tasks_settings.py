"""Settings for django-tasks with the django-tasks-db backend and its ``db_worker``, on the comparison
database ``BENCH_COMPARE_DSN`` (jaiminho_settings.py starts from them)."""

import os
from urllib.parse import urlparse

_url = urlparse(os.environ.get("BENCH_COMPARE_DSN", "postgres://postgres@127.0.0.1:5432/bench_outbox_compare"))
SECRET_KEY = "bench-only"
USE_TZ = True
INSTALLED_APPS = ["django_tasks", "django_tasks_db"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/"),
        "USER": _url.username or "postgres",
        "HOST": _url.hostname or "127.0.0.1",
        "PORT": _url.port or 5432,
    }
}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
