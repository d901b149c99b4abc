"""The peers of the ``compare`` and ``tasks`` sections, run from a virtualenv of their own (bench/compare_setup.sh)
by its interpreter, so that their packages never enter the project's.

Each peer's module (``<peer>_app``, or ``tasks_peer`` for the Django ones), ``python -m bench.compare.<module>
migrate|fill N`` with ``BENCH_COMPARE_DSN`` set, makes its tables, or commits N no-op jobs through the
library's own API in one transaction and prints the time right after the commit; each peer drains them with
its own worker command and defaults.
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
