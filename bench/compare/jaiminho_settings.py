"""Settings for django-jaiminho (a Django outbox) with the keep-order strategy: every event is stored and
relayed by its ``events_relay`` command (the publish-on-commit strategy stores only failed events)."""

import os
from urllib.parse import urlparse

_url = urlparse(os.environ.get("BENCH_COMPARE_DSN", "postgres://postgres@127.0.0.1:5432/bench_outbox_compare"))
SECRET_KEY = "bench-only"
USE_TZ = True
INSTALLED_APPS = ["jaiminho"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/"),
        "USER": _url.username or "postgres",
        "HOST": _url.hostname or "127.0.0.1",
        "PORT": _url.port or 5432,
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
JAIMINHO_CONFIG = {"PUBLISH_STRATEGY": "keep-order", "DEFAULT_CAPTURE_EXCEPTION": lambda exc: None}
LOGGING = {"version": 1, "disable_existing_loggers": False, "root": {"level": "WARNING"}}
