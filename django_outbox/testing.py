"""Helpers for users' own tests: relay what a test sent, synchronously, in the test's process."""

from __future__ import annotations

from collections.abc import Sequence

from .relay import Relay, RelayConfig, Stats

__all__ = ["relay_all"]


def relay_all(*, database: str | None = None, topics: Sequence[str] = (), batch_size: int = 100) -> Stats:
    """Deliver every message that is due now, in this thread, and return the counts.

    It runs on the caller's database connection, so inside a ``TestCase`` it sees the test's own
    uncommitted messages. Handlers run synchronously, here; an ``async def`` handler is awaited here too,
    its async ORM calls on this connection (so it sees the test's transaction), and cancelled after
    ``HANDLER_TIMEOUT_SECONDS`` when that is set (a sync handler is not bounded here: it cannot be
    stopped, and must run on this thread). Failures are recorded and retried later as usual.
    """
    relay = Relay(
        RelayConfig.from_settings(database=database, topics=tuple(topics), batch_size=batch_size, notify=False)
    )
    return relay.drain()
