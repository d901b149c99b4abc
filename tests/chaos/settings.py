"""Settings of the chaos run's producers and workers: the test settings (probe app), the chaos consumer
app (tests/chaos/consumer: the inbox consumer and its business tables) and, when ``CHAOS_REDIS_URL`` is
set, a Redis Streams transport for the ``chaos.broker`` topic (a Kafka transport when
``CHAOS_KAFKA_BOOTSTRAP`` is set instead).

The runner (tests/chaos/run.py) points ``DATABASE_URL`` at its private PostgreSQL cluster, or at a SQLite
file of its own with ``--database sqlite``.
"""

import os

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.chaos.consumer"]  # noqa: F405

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":  # noqa: F405
    # As the private PostgreSQL runs with fsync=off: the faults kill processes, not the machine, and in WAL
    # mode synchronous=NORMAL keeps every commit across a process crash (only a power cut could lose one).
    DATABASES["default"]["OPTIONS"]["init_command"] = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"  # noqa: F405

OUTBOX = {
    **OUTBOX,  # noqa: F405
    "LEASE_SECONDS": 2.0,
    # the retry budget (25 attempts, see tests/chaos/run.py) must outlast the 10 s broker outage
    "BACKOFF_MAX_SECONDS": 3.0,
    "HANDLER_TIMEOUT_SECONDS": 2.0,
}
if os.environ.get("CHAOS_REDIS_URL"):
    OUTBOX["TRANSPORTS"] = {
        "broker": {
            "BACKEND": "django_outbox.transports.redis.RedisStreamsTransport",
            "OPTIONS": {"URL": os.environ["CHAOS_REDIS_URL"], "STREAM": os.environ["CHAOS_STREAM"]},
        }
    }
    OUTBOX["ROUTES"] = {"chaos.broker": "broker"}
elif os.environ.get("CHAOS_KAFKA_BOOTSTRAP"):
    OUTBOX["TRANSPORTS"] = {
        "broker": {
            "BACKEND": "django_outbox.transports.kafka.KafkaTransport",
            # HANDLER_TIMEOUT_SECONDS (2 s, above) bounds each batch first: one caught by the broker's restart
            # is abandoned and retried, its late reports explained by the "timed out" attempt
            "OPTIONS": {"BOOTSTRAP_SERVERS": os.environ["CHAOS_KAFKA_BOOTSTRAP"], "DELIVERY_TIMEOUT": 5.0},
        }
    }
    OUTBOX["ROUTES"] = {"chaos.broker": "broker"}
