"""The demo's settings plus a probe app whose handlers record every delivery for the tests to inspect."""

import os

from testproject.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.probe"]  # noqa: F405
ROOT_URLCONF = "tests.urls"
OUTBOX = {
    # The demo's routes (orders.created goes to the shop's own webhook endpoint), with quick retries.
    "TRANSPORTS": OUTBOX["TRANSPORTS"],  # noqa: F405
    "ROUTES": OUTBOX["ROUTES"],  # noqa: F405
    "MAX_ATTEMPTS": 5,
    "BACKOFF_BASE_SECONDS": 0.05,
    "BACKOFF_MAX_SECONDS": 0.5,
    "POLL_INTERVAL_SECONDS": 0.5,
}
# The demo sends its email through the outbox; tests choose their email setup themselves.
for _name in ("MAILERS", "EMAIL_BACKEND", "EMAIL_FILE_PATH"):
    globals().pop(_name, None)
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOGGING["loggers"]["django_outbox"]["level"] = os.environ.get("OUTBOX_LOG_LEVEL", "ERROR")  # type: ignore[index]  # noqa: F405

# A second database, to test send(using=...) and per-database workers.
_other = dict(DATABASES["default"])  # noqa: F405
if _other["ENGINE"] == "django.db.backends.sqlite3":
    _other["NAME"] = str(BASE_DIR / "other.sqlite3")  # noqa: F405
    _other["TEST"] = {"NAME": str(BASE_DIR / "test-other.sqlite3")}  # noqa: F405
else:
    _other["NAME"] = f"{_other['NAME']}_other"
    _other["TEST"] = {k: v for k, v in _other.get("TEST", {}).items() if k in ("CHARSET", "COLLATION")}
    # Named, so a test can tell whether the session made it (tests/support/processes.py), also when
    # pytest-xdist gives each of its processes databases of their own (``_gw0``, ``_gw1``, ...).
    _other["TEST"]["NAME"] = f"test_{_other['NAME']}"
# A process a test starts is handed the test session's "other" database by name: its settings cannot
# derive it from the default's once pytest-xdist has suffixed both.
if os.environ.get("TEST_OTHER_DATABASE_NAME"):
    _other["NAME"] = os.environ["TEST_OTHER_DATABASE_NAME"]
DATABASES["other"] = _other  # noqa: F405
# A process a test starts (tests/support/processes.py) leaves "other" out when the test session made no
# test database for it: on Django 6, a command's checks open every alias (MariaDB asks the server its
# version), and a worker would die on a database that does not exist.
if os.environ.get("TEST_WITHOUT_OTHER") == "1":
    del DATABASES["other"]  # noqa: F405

# Worker processes started by a test may run with other connection settings (Django's pool, CONN_MAX_AGE).
if os.environ.get("TEST_DB_SETTINGS"):
    import json

    _extra = json.loads(os.environ["TEST_DB_SETTINGS"])
    DATABASES["default"].setdefault("OPTIONS", {}).update(_extra.pop("OPTIONS", {}))  # noqa: F405
    DATABASES["default"].update(_extra)  # noqa: F405

# TEST_POOLER=transaction|session: the run reaches PostgreSQL through a private PgBouncer (tests/support/pooled.py).
from tests.support import pooled  # noqa: E402

pooled.route(DATABASES)  # noqa: F405

# TEST_DATABASE_SUFFIX: test databases of their own for each run the test command starts side by side
# (``dev.py test`` runs the Django 5.2 and 6.x cells on one server at once); pytest-xdist then adds its own
# suffix per process (``test_test_dj6_gw0``).
if os.environ.get("TEST_DATABASE_SUFFIX"):
    for _db in DATABASES.values():  # noqa: F405
        _test = _db.setdefault("TEST", {})
        _test["NAME"] = f"{_test.get('NAME') or 'test_' + _db['NAME']}_{os.environ['TEST_DATABASE_SUFFIX']}"

# Worker processes behind a pooler may LISTEN on a direct alias (OUTBOX["LISTEN_DATABASE"]).
if os.environ.get("LISTEN_DATABASE_URL"):
    DATABASES["listen"] = env.db_url_config(os.environ["LISTEN_DATABASE_URL"])  # noqa: F405
    OUTBOX["LISTEN_DATABASE"] = "listen"

# TEST_USE_TZ=0 runs the suite (or part of it) with naive datetimes, as projects with USE_TZ = False do.
# A zone away from UTC, so a naive time mistaken for UTC (or the reverse) shows.
if os.environ.get("TEST_USE_TZ", "1") == "0":
    USE_TZ = False
    TIME_ZONE = "America/New_York"

# Django 6.x: the task backend under test (tests/db/test_tasks.py), a queue of its own for the emails, and
# a second alias that retries. Django 5.2 has no django.tasks and ignores the setting.
import django  # noqa: E402

if django.VERSION >= (6, 0):
    TASKS = {
        "default": {"BACKEND": "django_outbox.tasks.OutboxBackend", "QUEUES": ["default", "emails"]},
        "retrying": {
            "BACKEND": "django_outbox.tasks.OutboxBackend",
            "QUEUES": ["default"],
            "OPTIONS": {"MAX_ATTEMPTS": 3},
        },
    }

# Tracing tests: a worker process exports its spans to this file, one JSON line each (tests/support/tracing.py).
if os.environ.get("OUTBOX_TEST_SPANS"):
    from tests.support.tracing import export_spans_to

    export_spans_to(os.environ["OUTBOX_TEST_SPANS"])

# Transports and routes a test adds for its worker processes (JSON {"TRANSPORTS": ..., "ROUTES": ...}),
# matched before the demo's.
if os.environ.get("OUTBOX_TEST_EXTRA_ROUTES"):
    import json as _json

    _routes = _json.loads(os.environ["OUTBOX_TEST_EXTRA_ROUTES"])
    OUTBOX["TRANSPORTS"] = {**OUTBOX["TRANSPORTS"], **_routes.get("TRANSPORTS", {})}
    OUTBOX["ROUTES"] = {**_routes.get("ROUTES", {}), **OUTBOX["ROUTES"]}
