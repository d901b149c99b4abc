"""Other Python options, run by the same harness in their own virtualenv (installed from the registry).

Nothing here is imported by the main environment: ``bench/run.py`` calls these modules with the
comparison environment's interpreter (``--compare-python``), so their packages never enter the project.
"""

import os
from urllib.parse import urlparse


def databases() -> dict[str, dict[str, object]]:
    """Django's ``DATABASES`` for the comparison database, ``BENCH_COMPARE_DSN``."""
    url = urlparse(os.environ.get("BENCH_COMPARE_DSN", "postgres://postgres@127.0.0.1:5432/bench_outbox_compare"))
    return {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": url.path.lstrip("/"),
            "USER": url.username or "postgres",
            "HOST": url.hostname or "127.0.0.1",
            "PORT": url.port or 5432,
        }
    }
