"""Riding out a database outage: the wait before a worker thread tries the database again."""

from __future__ import annotations

import logging
import threading

from django.db import DatabaseError, connections

logger = logging.getLogger("django_outbox.relay")


def database_down(alias: str, exc: BaseException, failures: int, stopping: threading.Event) -> None:
    """Log the outage, drop the broken connection and wait (capped exponential, cut short by a stop)."""
    delay = min(10.0, 0.2 * 2 ** min(failures, 6))
    logger.warning(
        "database %r unavailable (%s); retrying in %.1fs",
        alias,
        str(exc).strip() or type(exc).__name__,
        delay,
    )
    try:
        connections[alias].close()
    except DatabaseError:
        pass
    stopping.wait(delay)
