"""What one worker process is told to do: ``RelayConfig``, built from ``OUTBOX`` and command options.

Each field's default is read from the settings object (``conf.get_settings()``) when the config is made,
so a setting is declared once, in ``conf``; the field names are the command's (``--lease`` is
``lease_seconds``), and an option given on the command line overrides the setting.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import connections

from ..conf import get_settings


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def default_concurrency(alias: str) -> int:
    """Delivery threads when neither ``--concurrency`` nor ``OUTBOX["CONCURRENCY"]`` says.

    On PostgreSQL and MariaDB/MySQL, two: a delivery thread spends most of a batch waiting for the
    database (the claim, the record, their commits) and the rest in Python, and a second thread fills
    those waits, which about doubled one worker process's drain rate on PostgreSQL and took it from
    0.38x to 0.47x of the hand-written relay on MariaDB (docs/performance.md). More threads than that
    did not pay on a 2-core machine. On SQLite, one: its writers queue for one lock, and a second thread
    would only wait in SQLite's busy handler.
    """
    return 2 if connections[alias].vendor in ("postgresql", "mysql") else 1


def _setting(name: str) -> Any:
    """A field default: ``OUTBOX[name]`` as the settings object has it when the config is made."""

    def read() -> Any:
        return getattr(get_settings(), name)

    return field(default_factory=read)


#: ``concurrency`` left to ``OUTBOX["CONCURRENCY"]``, or when that is unset too, to ``default_concurrency``.
AUTO_CONCURRENCY = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class RelayConfig:
    database: str = _setting("DATABASE")
    batch_size: int = _setting("BATCH_SIZE")
    concurrency: int = AUTO_CONCURRENCY
    topics: tuple[str, ...] = ()
    #: Only these messages (``OUTBOX["EAGER"]``: what one transaction sent); None: any due message.
    ids: tuple[int, ...] | None = None
    lease_seconds: float = _setting("LEASE_SECONDS")
    poll_interval: float = _setting("POLL_INTERVAL_SECONDS")
    until_empty: bool = False
    grace_period: float = _setting("GRACE_PERIOD_SECONDS")
    notify: bool = _setting("NOTIFY")
    #: Seconds a delivery call may take; None: no limit.
    handler_timeout: float | None = _setting("HANDLER_TIMEOUT_SECONDS")
    #: Seconds between housekeeping rounds; 0: never (cron does it).
    housekeeping_interval: float = _setting("HOUSEKEEPING_INTERVAL_SECONDS")
    worker_id: str = field(default_factory=new_worker_id)

    def __post_init__(self) -> None:
        if self.concurrency == AUTO_CONCURRENCY:
            threads: int = get_settings().CONCURRENCY or default_concurrency(self.database)
            object.__setattr__(self, "concurrency", threads)

    @classmethod
    def from_settings(cls, **overrides: object) -> RelayConfig:
        """The settings, with the options given (an option that is None was not given)."""
        build: Callable[..., RelayConfig] = cls
        return build(**{name: value for name, value in overrides.items() if value is not None})
