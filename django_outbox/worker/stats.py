"""A worker's counters, shared by its threads, shown by ``outbox_worker`` and its heartbeat row."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass(kw_only=True)
class Stats:
    started: float = field(default_factory=time.monotonic)
    delivered: int = 0
    failed: int = 0
    dead: int = 0
    in_flight: int = 0
    lost_leases: int = 0
    reaped: int = 0
    housekeeping_failures: int = 0  # rounds that raised
    housekeeping_error: str = ""  # the last round's error; "" once a round succeeds
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.delivered / elapsed if elapsed > 0 else 0.0
