"""The benchmark's settings: the demo's, and an app with a no-op handler.

``default`` is PostgreSQL from ``DATABASE_URL`` (a database of its own, never a test one). Django reads its
settings once a process, so the scripts vary them per process through the ``BENCH_*`` variables below.
"""

import json
import os

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_outbox")

from testproject.settings import *  # noqa: F403

DEBUG = False
INSTALLED_APPS = [*INSTALLED_APPS, "bench.noop"]  # noqa: F405
OUTBOX = {
    "MAX_ATTEMPTS": 5,
    "POLL_INTERVAL_SECONDS": float(os.environ.get("BENCH_POLL_INTERVAL", "1.0")),
    "LEASE_SECONDS": 60.0,
    "PREPARED_STATEMENTS": os.environ.get("BENCH_PREPARED_STATEMENTS", "1") == "1",
}
if "BENCH_HOUSEKEEPING_INTERVAL" in os.environ:  # bench/autovacuum.py keeps its history: no archiving
    OUTBOX["HOUSEKEEPING_INTERVAL_SECONDS"] = float(os.environ["BENCH_HOUSEKEEPING_INTERVAL"])
# bench/topology.py: the warnings it counts (the prepared-statement fallback's), OPTIONS for the default alias
# (Django's pool), and a direct alias for the listener alone.
LOGGING["loggers"]["django_outbox"]["level"] = os.environ.get("BENCH_LOG_LEVEL", "ERROR")  # type: ignore[index]  # noqa: F405
if os.environ.get("BENCH_DB_OPTIONS"):
    DATABASES["default"].setdefault("OPTIONS", {}).update(json.loads(os.environ["BENCH_DB_OPTIONS"]))  # noqa: F405
if os.environ.get("BENCH_LISTEN_DATABASE_URL"):
    DATABASES["listen"] = env.db_url_config(os.environ["BENCH_LISTEN_DATABASE_URL"])  # noqa: F405
    OUTBOX["LISTEN_DATABASE"] = "listen"
if os.environ.get("BENCH_TASKS_SYSTEM") == "outbox-tasks":  # bench/tasks.py: Django 6's tasks on the outbox
    TASKS = {"default": {"BACKEND": "django_outbox.tasks.OutboxBackend"}}
if os.environ.get("BENCH_MIGRATION_MODULE"):  # bench/online_migrations.py: a sample module's migrations
    MIGRATION_MODULES = {"django_outbox": os.environ["BENCH_MIGRATION_MODULE"]}
