"""The worker's background upkeep: leases, the reaper, the heartbeat row, and housekeeping rounds.

Each runs in a thread of its own, beside the delivery threads, so a slow delivery never delays a lease
renewal, and a slow housekeeping round never delays either.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
from collections.abc import Callable

from django.db import DatabaseError, connections

from .. import store
from ..retention import housekeeping
from .config import RelayConfig
from .errors import describe_error
from .stats import Counts, Stats

logger = logging.getLogger("django_outbox.relay")


class Keeper:
    """Extends the leases of what this worker holds (so a slow but healthy delivery is not taken away),
    reaps the leases of dead workers (``ring`` then wakes a delivery thread for what came back) and
    writes the worker's heartbeat row, until ``done`` is set; and, if asked, runs housekeeping."""

    def __init__(
        self,
        config: RelayConfig,
        stats: Stats,
        *,
        done: threading.Event,
        ring: Callable[[], None],
        started_at: dt.datetime,
    ) -> None:
        self.config = config
        self.stats = stats
        self.done = done
        self.ring = ring
        self.started_at = started_at
        self._hostname, self._pid = socket.gethostname(), os.getpid()
        #: The counts of the last heartbeat, written once ``done`` is set: what the closing line prints.
        self.final: Counts | None = None

    def beat(self, counts: Counts | None = None, *, stopped: bool = False) -> store.WorkerBeat:
        cfg, stats = self.config, self.stats
        counts = counts or stats.counts()
        return store.WorkerBeat(
            worker_id=cfg.worker_id,
            hostname=self._hostname,
            pid=self._pid,
            started_at=self.started_at,
            in_flight=0 if stopped else counts.in_flight,
            delivered=counts.delivered,
            failed=counts.failed,
            stopped=stopped,
            housekeeping_failures=stats.housekeeping_failures,
            housekeeping_error=stats.housekeeping_error,
        )

    def keep(self) -> None:
        cfg = self.config
        interval = max(0.2, min(cfg.lease_seconds / 3, 5.0))
        try:
            while not self.done.is_set():
                store.refresh_connections()
                try:
                    if self.stats.in_flight:
                        store.extend_leases(cfg.database, worker=cfg.worker_id, lease_seconds=cfg.lease_seconds)
                    reaped = store.reap(cfg.database)
                    if reaped:
                        self.stats.reaped += len(reaped)
                        logger.warning(
                            "requeued %d messages whose worker's lease expired: %s",
                            len(reaped),
                            ", ".join(f"#{r.message_id}->{r.status}" for r in reaped[:20]),
                        )
                        self.ring()
                    store.heartbeat(cfg.database, self.beat())
                except DatabaseError as exc:
                    logger.warning("keeper could not reach the database (%s)", exc)
                    try:
                        connections[cfg.database].close()
                    except DatabaseError:
                        pass
                self.done.wait(interval)
            self.final = self.stats.counts()
            try:
                store.heartbeat(cfg.database, self.beat(self.final, stopped=True))
            except DatabaseError:
                pass
        finally:
            connections.close_all()

    def housekeep(self) -> None:
        """Retention in its own thread, so a slow round never delays the keeper's lease renewals.

        Every worker runs this loop; on PostgreSQL an advisory lock lets one of them work per round. No
        error ends it: a round that raises is logged with its traceback, counted and reported in the
        worker's heartbeat row (the admin overview and ``outbox_status`` show it), and the next round runs
        on schedule. A thread that died here would leave a worker that delivers but never cleans up, with
        nothing to say so.
        """
        cfg = self.config
        wait = min(cfg.housekeeping_interval, 5.0)  # a first round soon after start, then every interval
        try:
            while not self.done.wait(wait):
                wait = cfg.housekeeping_interval
                store.refresh_connections()
                try:
                    report = housekeeping.run(cfg.database, time_budget=max(1.0, cfg.housekeeping_interval / 2))
                except Exception as exc:
                    self.stats.housekeeping_failures += 1
                    self.stats.housekeeping_error = describe_error(exc)
                    if isinstance(exc, DatabaseError):
                        logger.warning("housekeeping could not run (%s); trying again in %.0fs", exc, wait)
                    else:
                        logger.exception("housekeeping round failed; trying again in %.0fs", wait)
                    try:
                        connections[cfg.database].close()
                    except Exception:  # the round's error is what matters; the next round reconnects
                        pass
                    continue
                self.stats.housekeeping_error = ""
                if report.archived or report.deleted or report.partitions_dropped or report.archive_deleted:
                    logger.info("housekeeping: %s", report)
        finally:
            connections.close_all()
