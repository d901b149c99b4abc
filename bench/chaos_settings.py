"""Settings of the chaos run's producers and workers: the test settings (probe app) plus, when
``CHAOS_REDIS_URL`` is set, a Redis Streams transport for the ``chaos.broker`` topic.

The runner (bench/chaos.py) points ``DATABASE_URL`` at its private PostgreSQL cluster.
"""

import os

from tests.settings import *  # noqa: F403

OUTBOX = {
    **OUTBOX,  # noqa: F405
    "LEASE_SECONDS": 2.0,
    # the retry budget (25 attempts, see bench/chaos.py) must outlast the 10 s broker outage
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
