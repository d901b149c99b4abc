"""The worker: what ``manage.py outbox_worker`` and ``relay_all()`` run.

- ``config``: ``RelayConfig``, from ``OUTBOX`` and the command's options;
- ``loop``: ``Relay``, the delivery threads (waiting, claiming, shutdown, database outages);
- ``pipeline``: one claimed batch, delivered, recorded and announced, with no thread of its own;
- ``keeper``: leases, the reaper, the heartbeat row, housekeeping rounds;
- ``backoff``: when a failed message is tried again; ``stats``: the counters and their snapshots;
- ``doorbell``, ``listener`` (``LISTEN``), ``timeouts`` (a bound on each delivery call).
"""

from .backoff import MAX_DELAY_SECONDS, backoff_seconds
from .config import RelayConfig, default_concurrency, new_worker_id
from .errors import ERROR_MAX_CHARS, describe_error
from .loop import Relay
from .pipeline import Pipeline
from .stats import Counts, Stats

__all__ = [
    "ERROR_MAX_CHARS",
    "MAX_DELAY_SECONDS",
    "Counts",
    "Pipeline",
    "Relay",
    "RelayConfig",
    "Stats",
    "backoff_seconds",
    "default_concurrency",
    "describe_error",
    "new_worker_id",
]
