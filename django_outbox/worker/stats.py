"""A worker's counters, shared by its threads; ``Counts`` is what ``outbox_worker`` prints and its heartbeat
row (``outbox_status``, the admin overview) shows: one snapshot, one definition of each number."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True, slots=True)
class Counts:
    """The counters at one moment. ``failed`` counts every failed attempt, those that made their message
    dead included; ``dead`` is that part of it. The closing line and the last heartbeat are the same
    ``Counts``, so they cannot disagree."""

    delivered: int
    failed: int
    dead: int
    in_flight: int
    elapsed: float  # seconds since the worker started

    @property
    def rate(self) -> float:
        """Deliveries per second since the start."""
        return self.delivered / self.elapsed if self.elapsed > 0 else 0.0

    def line(self) -> str:
        return (
            f"delivered {self.delivered}  failed {self.failed} (dead {self.dead})  "
            f"in flight {self.in_flight}  {self.rate:.1f} msg/s"
        )


@dataclass(kw_only=True)
class Stats:
    """Counted by the pipeline as outcomes are recorded: ``failed`` the attempts to be retried, ``dead``
    the ones that made their message dead. Read them through ``counts()``."""

    started: float = field(default_factory=time.monotonic, repr=False)  # on time.monotonic(): meaningless shown
    delivered: int = 0
    failed: int = 0
    dead: int = 0
    in_flight: int = 0
    lost_leases: int = 0
    reaped: int = 0
    housekeeping_failures: int = 0  # rounds that raised
    housekeeping_error: str = ""  # the last round's error; "" once a round succeeds
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def elapsed(self) -> float:
        return max(0.0, time.monotonic() - self.started)

    def rate(self) -> float:
        return self.counts().rate

    def counts(self) -> Counts:
        return Counts(
            delivered=self.delivered,
            failed=self.failed + self.dead,
            dead=self.dead,
            in_flight=self.in_flight,
            elapsed=self.elapsed(),
        )

    def __repr__(self) -> str:
        c = self.counts()
        extra = "".join(
            f" {name}={value!r}"
            for name, value in (
                ("lost_leases", self.lost_leases),
                ("reaped", self.reaped),
                ("housekeeping_failures", self.housekeeping_failures),
                ("housekeeping_error", self.housekeeping_error),
            )
            if value
        )
        return (
            f"<Stats delivered={c.delivered} failed={self.failed} dead={self.dead} in_flight={c.in_flight}"
            f"{extra} elapsed={c.elapsed:.1f}s rate={c.rate:.1f}/s>"
        )
