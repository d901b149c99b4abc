"""Settings for the benchmark: the demo's, plus an app with a no-op handler and an SQLite database beside PostgreSQL.

``default`` is PostgreSQL from ``DATABASE_URL`` (its own database, never a test one); ``sqlite`` is a file
under ``bench/results/`` used only for the polling-latency figure.
"""

import os
from pathlib import Path

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_outbox")

from testproject.settings import *  # noqa: F403

RESULTS = Path(__file__).resolve().parent / "results"
RESULTS.mkdir(exist_ok=True)

DEBUG = False
INSTALLED_APPS = [*INSTALLED_APPS, "bench.noop"]  # noqa: F405
DATABASES["sqlite"] = {  # noqa: F405
    "ENGINE": "django.db.backends.sqlite3",
    "NAME": os.environ.get("BENCH_SQLITE_PATH", str(RESULTS / "bench.sqlite3")),
    "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20, "init_command": "PRAGMA journal_mode=WAL;"},
}
OUTBOX = {
    "MAX_ATTEMPTS": 5,
    "POLL_INTERVAL_SECONDS": float(os.environ.get("BENCH_POLL_INTERVAL", "1.0")),
    "LEASE_SECONDS": 60.0,
    "PREPARED_STATEMENTS": os.environ.get("BENCH_PREPARED_STATEMENTS", "1") == "1",
}
if "BENCH_HOUSEKEEPING_INTERVAL" in os.environ:  # bench/autovacuum.py keeps its history: no archiving
    OUTBOX["HOUSEKEEPING_INTERVAL_SECONDS"] = float(os.environ["BENCH_HOUSEKEEPING_INTERVAL"])
# BENCH_LOG_LEVEL=WARNING: bench/topology.py counts the warnings (the prepared-statement fallback's)
LOGGING["loggers"]["django_outbox"]["level"] = os.environ.get("BENCH_LOG_LEVEL", "ERROR")  # type: ignore[index]  # noqa: F405
# bench/topology.py: OPTIONS for the default alias (Django's pool), and a direct alias for the listener alone.
if os.environ.get("BENCH_DB_OPTIONS"):
    import json

    DATABASES["default"].setdefault("OPTIONS", {}).update(json.loads(os.environ["BENCH_DB_OPTIONS"]))  # noqa: F405
if os.environ.get("BENCH_LISTEN_DATABASE_URL"):
    DATABASES["listen"] = env.db_url_config(os.environ["BENCH_LISTEN_DATABASE_URL"])  # noqa: F405
    OUTBOX["LISTEN_DATABASE"] = "listen"
# bench/online_migrations.py: the migrate it times reads a sample migration module (tests/support/migration_samples)
if os.environ.get("BENCH_MIGRATION_MODULE"):
    MIGRATION_MODULES = {"django_outbox": os.environ["BENCH_MIGRATION_MODULE"]}
