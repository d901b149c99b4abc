"""The worker loop: wait, claim, hand the batch to the pipeline, shut down. No query is built here.

Threads:
- ``concurrency`` delivery threads, each claiming its own batch and handing it to the ``Pipeline``
  (delivered in id order with no transaction open, then every outcome recorded in one statement);
- the keeper (``Keeper.keep``), which extends the leases of what this worker holds, reaps the leases of
  dead workers and writes the worker's heartbeat row; and, when asked, a housekeeper (``Keeper.housekeep``);
- on PostgreSQL, one listener thread that turns each ``NOTIFY`` into a ring of the doorbell, which wakes
  one idle delivery thread (a thread whose claim came back full rings it again for the next).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Literal

from django.db import DatabaseError, connections
from django.utils import timezone

from .. import store
from ..store.models import Message
from ..transports.registry import TransportSet
from .config import RelayConfig
from .doorbell import Doorbell
from .keeper import Keeper
from .listener import Listener
from .observer import Observer, Observers
from .outages import database_down
from .pipeline import Pipeline
from .stats import Counts, Stats

logger = logging.getLogger("django_outbox.relay")


class Relay:
    def __init__(self, config: RelayConfig, *, observers: Sequence[Observer] = ()) -> None:
        self.config = config
        self.observer = Observers(observers)  # metrics and traces (``worker.observer``)
        self.stats = Stats()
        self._stopping = threading.Event()  # no new claims
        self._halt = threading.Event()  # do not start another delivery of a claimed batch either
        self._force = threading.Event()  # do not wait for deliveries in progress
        self._bell = Doorbell(config.concurrency)  # wake-ups: one delivery thread per ring
        # What the delivery threads are doing, for --until-empty's decision to stop (``_nothing_left``).
        self._activity = threading.Condition()
        self._claiming = 0  # claims running now
        self._holding = 0  # claimed batches not processed yet
        self._progress = 0  # batches processed so far
        self._done = threading.Event()
        self._threads: list[threading.Thread] = []
        self.listener: Listener | None = None
        self.crashed = False
        self.started_at = timezone.now()
        self.pipeline = Pipeline(config, self.stats, halt=self._halt, stopping=self._stopping, observer=self.observer)
        self.keeper = Keeper(config, self.stats, done=self._done, ring=self._bell.ring, started_at=self.started_at)

    # --- control ---------------------------------------------------------------------------------

    def stop(self, *, graceful: bool = True) -> None:
        """Stop claiming and starting deliveries; claimed but unstarted messages are released.

        Deliveries in progress get the grace period to finish, unless ``graceful`` is false.
        """
        self._halt.set()
        self._stopping.set()
        if not graceful:
            self._force.set()
        self._bell.open()
        if self.listener is not None:
            self.listener.stop()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def wait_for_stop(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds, woken at once by ``stop()``; True when stopped."""
        return self._stopping.wait(timeout)

    def run(self, *, progress: Callable[[Counts], None] | None = None, progress_every: float = 2.0) -> None:
        """Relay until stopped (or, with ``until_empty``, until nothing is left to do now).

        On the way out every thread is woken at once (the doorbell opened, the keeper's and housekeeper's
        ``done``, the listener's pipe) and joined, so an idle worker stops in the time a bare process takes.
        The last ``progress`` call gets the counts the last heartbeat wrote.
        """
        cfg = self.config
        logger.info(
            "worker %s starting: database=%s concurrency=%d batch=%d topics=%s",
            cfg.worker_id,
            cfg.database,
            cfg.concurrency,
            cfg.batch_size,
            ",".join(cfg.topics) or "*",
        )
        if cfg.notify and connections[cfg.database].vendor == "postgresql":
            self.listener = Listener(
                cfg.database, self._bell.ring, lambda: self._stopping.is_set(), poll_interval=cfg.poll_interval
            )
            self.listener.start()
            self.pipeline.wakes_others = True
        keeper = threading.Thread(target=self.keeper.keep, name="outbox-keeper", daemon=True)
        keeper.start()
        housekeeper: threading.Thread | None = None
        if cfg.housekeeping_interval > 0 and not cfg.until_empty:
            housekeeper = threading.Thread(target=self.keeper.housekeep, name="outbox-housekeeper", daemon=True)
            housekeeper.start()
        self._threads = [
            threading.Thread(target=self._deliver_loop, name=f"outbox-delivery-{i}", daemon=True)
            for i in range(cfg.concurrency)
        ]
        for thread in self._threads:
            thread.start()
        next_progress = time.monotonic() + progress_every
        while any(t.is_alive() for t in self._threads):
            if self._stopping.is_set():
                self._await_threads(cfg.grace_period)
                break
            self._stopping.wait(0.2)
            if progress is not None and time.monotonic() >= next_progress:
                progress(self.stats.counts())
                next_progress = time.monotonic() + progress_every
        self._stopping.set()
        self._done.set()
        if self.listener is not None:
            self.listener.stop()
        keeper.join(timeout=10)
        # Idle, they end at once; a housekeeping round under way is not waited for (the next worker's
        # round picks up where it stopped), nor a listener still connecting.
        for waiting in (self.listener, housekeeper):
            if waiting is not None:
                waiting.join(timeout=0.5)
        final = self.keeper.final or self.stats.counts()  # the keeper's own: what its last heartbeat wrote
        if progress is not None:
            progress(final)
        logger.info(
            "worker %s stopped: delivered=%d failed=%d dead=%d",
            cfg.worker_id,
            final.delivered,
            final.failed,
            final.dead,
        )

    def _await_threads(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        for thread in self._threads:
            while thread.is_alive() and time.monotonic() < deadline and not self._force.is_set():
                thread.join(timeout=0.1)
        if any(t.is_alive() for t in self._threads):
            logger.warning(
                "grace period of %.0fs over with deliveries still running; their leases will "
                "expire and other workers will retry them",
                grace,
            )

    # --- delivery threads ------------------------------------------------------------------------

    def drain(self) -> Stats:
        """Relay everything due now in the calling thread and its connection (no threads, no keeper).

        For tests and scripts: it sees what the caller's own transaction sees.
        """
        transports = TransportSet()
        self.pipeline.run_direct()  # handlers must run here, on the caller's connection: no timeout thread
        try:
            while self._cycle(transports):
                pass
        finally:
            self.pipeline.close_caller()
            transports.close()
        return self.stats

    def _cycle(self, transports: TransportSet) -> bool:
        """Claim one batch and process it; False when nothing was claimable."""
        return self._claim_and_process(transports) is not None

    def _claim_and_process(self, transports: TransportSet) -> Sequence[Message] | None:
        """The batch claimed and processed, or None when nothing was claimable (or the worker is stopping)."""
        cfg = self.config
        with self._activity:
            if self._stopping.is_set():  # asked under the lock: a thread stopping the worker sees this claim
                return None
            self._claiming += 1
        batch: Sequence[Message] = []
        try:
            try:
                claim_started = time.perf_counter()
                batch = store.claim(
                    cfg.database,
                    worker=cfg.worker_id,
                    limit=cfg.batch_size,
                    lease_seconds=cfg.lease_seconds,
                    topics=cfg.topics,
                    ids=cfg.ids,
                )
                if self.observer:
                    self.observer.claimed(batch, time.perf_counter() - claim_started)
            finally:
                with self._activity:
                    self._claiming -= 1
                    self._holding += bool(batch)
                    self._activity.notify_all()
            if not batch:
                return None
            if len(batch) >= cfg.batch_size:
                self._bell.ring()  # more may be due: a peer claims the next batch while this one is delivered
            self.pipeline.process(batch, transports)
            return batch
        finally:
            if batch:
                with self._activity:
                    self._holding -= 1
                    self._progress += 1

    def _claim_again_at_once(self, batch: Sequence[Message]) -> bool:
        """Whether to claim right after this batch, rather than wait for a wake-up or the next due time.

        A full batch may have left messages behind. A short one took every message claimable when it
        was claimed, so with a live listener (whose rings ``_bell`` keeps while we are busy) an empty
        claim would only add a round trip before the worker is idle again, and delay the next message's
        wake-up by as much (docs/performance.md, latency). Keyed messages are the exception: recording
        the head of a key makes its next message claimable, and nothing announces that.
        """
        if len(batch) >= self.config.batch_size or self.config.until_empty:
            return True
        listening = self.listener is not None and self.listener.connected.is_set()
        return not listening or any(m.key is not None for m in batch)

    def _deliver_loop(self) -> None:
        cfg = self.config
        transports = TransportSet()
        failures = 0
        try:
            while not self._stopping.is_set():
                store.refresh_connections()
                try:
                    self._bell.take()  # this claim answers a ring that came while we were busy
                    seen = self._progress
                    batch = self._claim_and_process(transports)
                    if self._stopping.is_set():
                        break
                    if batch is not None:
                        failures = 0
                        if self._claim_again_at_once(batch):
                            continue
                        self._idle()
                        continue
                    if cfg.until_empty:
                        verdict = self._nothing_left(transports, seen)
                        if verdict == "stop":
                            logger.info("nothing left to claim now and nothing in flight: stopping")
                            break
                        if verdict == "again":
                            continue
                    self._idle()
                    failures = 0
                except DatabaseError as exc:
                    failures += 1
                    database_down(self.config.database, exc, failures, self._stopping)
        except Exception:
            # A bug or a broken configuration, not an outage: stop the whole worker loudly rather than
            # leave a process that looks alive and relays nothing. Leased messages return via the reaper.
            logger.exception("delivery thread crashed; stopping the worker")
            self.crashed = True
            self.stop()
        finally:
            self.pipeline.close_caller()
            transports.close()
            connections.close_all()

    def _nothing_left(self, transports: TransportSet, seen: int) -> Literal["stop", "again", "wait"]:
        """``--until-empty``, after an empty claim: stop the worker now, claim again at once, or wait.

        Not while a message is processing anywhere (it may fail and come back): wait. Then one more look,
        since between the empty claim and that check a message may have become claimable (a fence
        lifted, a lease reaped): if it found a batch, claim again. Last, the other delivery threads of
        this worker: none may hold a batch, or have processed one since this thread's empty claim
        (``seen`` counts batches processed), because its record can make more messages claimable (a
        key's next message); a claim of theirs still running is waited for, since it may come back with
        messages.
        """
        cfg = self.config
        if store.work_in_progress(cfg.database, topics=cfg.topics):
            return "wait"
        if self._cycle(transports):
            return "again"
        with self._activity:
            if self._stopping.is_set():
                return "again"  # stopped meanwhile (a signal): the loop ends without claiming
            if not self._activity.wait_for(lambda: self._claiming == 0, timeout=5.0):
                return "wait"
            if self._holding or self._progress != seen:
                return "wait"
            self._stopping.set()
        self._bell.open()  # the other threads stop waiting and end
        return "stop"

    def _idle(self) -> None:
        cfg = self.config
        timeout = cfg.poll_interval
        if cfg.until_empty:
            timeout = min(timeout, 0.2)  # nothing may be claimable only because a lease is expiring
        if self._bell.take():
            return  # a wake-up came while we were busy: no need to ask when the next message is due
        due_in = store.next_due(cfg.database, topics=cfg.topics)  # measured on the database's clock
        if due_in is not None:
            timeout = max(0.0, min(timeout, due_in))
        self._bell.wait(timeout)
