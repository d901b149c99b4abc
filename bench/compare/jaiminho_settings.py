"""Settings for django-jaiminho (a Django outbox) with the keep-order strategy: every event is stored and
relayed by its ``events_relay`` command (the publish-on-commit strategy stores only failed events)."""

from bench.compare import databases

SECRET_KEY = "bench-only"
USE_TZ = True
INSTALLED_APPS = ["jaiminho"]
DATABASES = databases()
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
JAIMINHO_CONFIG = {"PUBLISH_STRATEGY": "keep-order", "DEFAULT_CAPTURE_EXCEPTION": lambda exc: None}
LOGGING = {"version": 1, "disable_existing_loggers": False, "root": {"level": "WARNING"}}
