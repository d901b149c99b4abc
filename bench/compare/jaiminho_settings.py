"""Settings for django-jaiminho (a Django outbox) with the keep-order strategy: every event is stored and
relayed by its ``events_relay`` command (the publish-on-commit strategy stores only failed events)."""

from bench.compare.tasks_settings import *  # noqa: F403

INSTALLED_APPS = ["jaiminho"]
JAIMINHO_CONFIG = {"PUBLISH_STRATEGY": "keep-order", "DEFAULT_CAPTURE_EXCEPTION": lambda exc: None}
LOGGING = {"version": 1, "disable_existing_loggers": False, "root": {"level": "WARNING"}}
