"""One claimed batch, from delivery to announcement, with no thread of its own.

``Pipeline.process()`` is what a delivery thread (or ``relay_all()``) does with a batch: resolve each
message's transport once, group consecutive messages for a transport that delivers in batches, deliver
each group with no transaction open, turn every result or exception into a ``store.Outcome`` (the retry
policy is ``backoff``), record them all in one statement (riding out an outage, and falling back to one
by one when something in them cannot be stored), hand back what was never started, and announce the
outcomes (logs and signals). It builds no SQL: every statement is the store's.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time
from collections.abc import Sequence

from django.db import DatabaseError, DataError, IntegrityError, NotSupportedError, ProgrammingError
from django.utils import timezone

from .. import signals, store
from ..exceptions import PermanentDeliveryError
from ..routing import resolve_transport
from ..store.models import Message
from ..transports.base import checked_results
from ..transports.deadlines import time_limit
from ..transports.registry import TransportSet
from .backoff import retry_delay
from .config import RelayConfig
from .errors import describe_error
from .observer import Observer, Observers, log_fields
from .outages import database_down
from .stats import Stats
from .timeouts import BoundedCaller

logger = logging.getLogger("django_outbox.relay")

#: Database errors that say what was sent is wrong, not that the database is away: retrying the same
#: outcomes cannot help, so they are not ridden out as an outage (``Pipeline._store``).
_DATA_ERRORS = (DataError, IntegrityError, ProgrammingError, NotSupportedError)

#: Where a message goes: the name of its transport, or why it has none (the attempt's failure).
Route = str | BaseException


class Pipeline:
    """The per-batch work of one worker, shared by its delivery threads (each with its own transports).

    ``halt`` set: start no further delivery of a batch (the rest is released), and stop riding out an
    outage of the record. ``stopping`` cuts an outage's wait short. ``wakes_others`` (the worker has a
    listener and serves only some topics) makes a finished keyed message wake the other workers.
    """

    def __init__(
        self,
        config: RelayConfig,
        stats: Stats,
        *,
        halt: threading.Event | None = None,
        stopping: threading.Event | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.config = config
        self.stats = stats
        #: Metrics and traces (``worker.observer``); the base class's no-ops when nothing observes.
        self.observer = observer or Observers()
        self.halt = halt or threading.Event()
        self.stopping = stopping or threading.Event()
        self.wakes_others = False
        self._local = threading.local()  # each delivery thread's BoundedCaller, with a handler timeout

    # --- the batch -------------------------------------------------------------------------------

    def process(self, batch: Sequence[Message], transports: TransportSet) -> None:
        with self.stats.lock:
            self.stats.in_flight += len(batch)
        self.observer.batch_started(batch)
        outcomes: list[store.Outcome] = []
        unstarted: list[int] = []
        routes: list[Route] = []
        try:
            routes = [self._route(m) for m in batch]  # once per message: grouping, delivery, observers share it
            stopped: set[str] = set()  # keys whose delivery failed in this batch: their later messages wait
            index = 0
            while index < len(batch):
                if self.halt.is_set():
                    unstarted += [m.id for m in batch[index:]]
                    break
                end = self._group_end(routes, index, transports)
                group = [m for m in batch[index:end] if m.key is None or m.key not in stopped]
                unstarted += [m.id for m in batch[index:end] if m.key is not None and m.key in stopped]
                if group:
                    delivered = self.deliver_group(group, routes[index], transports)
                    outcomes += self._stop_keys(group, delivered, stopped)
                index = end
        finally:
            recorded, lost = self.record(outcomes, batch)
            if unstarted:
                self._release(unstarted)
            with self.stats.lock:
                self.stats.in_flight -= len(batch)
            # routes is empty if the batch failed before they were resolved: the observers learn no names
            names = {m.id: route for m, route in zip(batch, routes, strict=False) if isinstance(route, str)}
            self.observer.batch_done(batch, recorded, lost, names)
        if self._hands_off_keys(batch, recorded, lost):
            try:
                store.notify_now(self.config.database)
            except DatabaseError as exc:  # the others poll: late, not lost
                logger.warning("could not wake the workers of other topics (%s)", exc)
        try:
            self.announce(batch, recorded, lost)
        except Exception:  # logging or a signal's plumbing failed: the outcomes are stored, go on
            logger.exception("announcing the outcomes of a batch failed")

    @staticmethod
    def _stop_keys(
        group: Sequence[Message], outcomes: Sequence[store.Outcome], stopped: set[str]
    ) -> list[store.Outcome]:
        """The outcomes to record, noting the keys whose first failure stops the rest of their messages.

        A claim hands over a key's consecutive messages in id order; once one of them fails, the ones
        after it must wait for its retry. Delivered one by one, they are never started (``process``
        skips them, and releases them: no attempt). A batch transport was handed them all at once, so
        each was attempted and keeps its own outcome. One the destination took anyway is recorded as
        delivered, since it was, and said out loud, since its key's order now rests on the destination's
        own guarantees (docs/ordering.md, batch transports). One that failed too is a failed attempt of
        its own: its outcome is unknown to the outbox (a Kafka report that timed out, a connection lost
        after the write), so the destination may hold it, and the attempt row is what explains the
        second copy its retry makes; released as if never claimed, that copy had no trace in the audit.
        """
        kept: list[store.Outcome] = []
        for message, outcome in zip(group, outcomes, strict=True):
            key = message.key
            if key is not None and key in stopped:
                if outcome.status == store.DELIVERED:
                    logger.warning(
                        "%s #%d was delivered after an earlier message of its key failed in the same batch",
                        message.topic,
                        message.id,
                    )
            elif key is not None and outcome.status != store.DELIVERED:
                stopped.add(key)
            kept.append(outcome)
        return kept

    @staticmethod
    def _route(message: Message) -> Route:
        try:
            return resolve_transport(message.topic)
        except Exception as exc:
            return exc  # reported as this message's failure by deliver_group

    @staticmethod
    def _group_end(routes: Sequence[Route], start: int, transports: TransportSet) -> int:
        """Where the group starting at ``start`` ends: the next message alone, or with the ones after it
        for the same transport when that transport batches."""
        name = routes[start]
        if not isinstance(name, str):
            return start + 1
        try:
            batching = transports.get(name).supports_batch()
        except Exception:
            return start + 1
        end = start + 1
        while batching and end < len(routes) and routes[end] == name:
            end += 1
        return end

    # --- delivery --------------------------------------------------------------------------------

    def deliver_group(self, group: Sequence[Message], route: Route, transports: TransportSet) -> list[store.Outcome]:
        """Deliver messages of one transport (``route``) and say what happened to each."""
        started = timezone.now()
        results: Sequence[BaseException | None]
        try:
            if not isinstance(route, str):
                raise route
            transport = transports.get(route)

            def call() -> Sequence[BaseException | None]:
                with time_limit(self.config.handler_timeout):  # lets an async handler be cancelled in time
                    if len(group) == 1:
                        transport.deliver(group[0])
                        return [None]
                    return checked_results(transport, group, transport.deliver_batch(group))

            call = self.observer.wrap_delivery(group, route, call)
            caller = self._caller()
            if caller is None:
                results = call()
            else:  # a hung call leaves its transports to its abandoned thread, which closes them
                results = caller.call(call, on_timeout=lambda: transports.detach().close)
        except KeyboardInterrupt:  # Ctrl-C in relay_all() (the caller's thread) stops it, as it should
            raise
        except BaseException as exc:  # SystemExit, CancelledError...: whatever a destination raises
            results = [exc] * len(group)
        finished = timezone.now()
        return [
            store.Outcome(
                message_id=m.id, number=m.attempts, status=store.DELIVERED, started_at=started, finished_at=finished
            )
            if result is None
            else self.failure(m, result, started)
            for m, result in zip(group, results, strict=True)
        ]

    def run_direct(self) -> None:
        """Deliver on this thread (``drain()``): handlers run on the caller's connection, no timeout thread."""
        self._local.direct = True

    def _caller(self) -> BoundedCaller | None:
        timeout = self.config.handler_timeout
        if timeout is None or getattr(self._local, "direct", False):
            return None
        caller: BoundedCaller | None = getattr(self._local, "caller", None)
        if caller is None:
            caller = self._local.caller = BoundedCaller(timeout, name=threading.current_thread().name)
        return caller

    def close_caller(self) -> None:
        caller: BoundedCaller | None = getattr(self._local, "caller", None)
        if caller is not None:
            caller.close()
            self._local.caller = None

    @staticmethod
    def failure(message: Message, exc: BaseException, started: dt.datetime) -> store.Outcome:
        """The failed attempt to record, for any exception: building it must not raise (nothing else
        would record this message's outcome, and the rest of its batch would wait for the reaper)."""
        error = describe_error(exc)
        finished = timezone.now()
        if isinstance(exc, PermanentDeliveryError) or message.attempts >= message.max_attempts:
            return store.Outcome(
                message_id=message.id,
                number=message.attempts,
                status=store.DEAD,
                started_at=started,
                finished_at=finished,
                error=error,
            )
        delay = retry_delay(message, exc)
        return store.Outcome(
            message_id=message.id,
            number=message.attempts,
            status=store.PENDING,
            started_at=started,
            finished_at=finished,
            error=error,
            retry_delay=delay,  # the record adds it to the database's clock
        )

    # --- recording -------------------------------------------------------------------------------

    def record(
        self, outcomes: Sequence[store.Outcome], batch: Sequence[Message]
    ) -> tuple[Sequence[store.Outcome], set[int]]:
        """Store the outcomes; returns them as stored, and the ids whose lease was lost.

        A database outage is ridden out (``_store``). Any other error means something in the outcomes
        could not be stored: they are then stored one by one, and one that still fails is replaced by a
        failed attempt that says why (``_unrecordable``), so one message cannot keep the others of its
        batch leased until the reaper, nor itself forever.
        """
        if not outcomes:
            return outcomes, set()
        try:
            lost = self._store(outcomes)
        except Exception:
            logger.exception("could not record %d outcomes at once; recording them one by one", len(outcomes))
            outcomes, lost = self._record_one_by_one(outcomes, batch)
        with self.stats.lock:
            for o in outcomes:
                if o.message_id in lost:
                    self.stats.lost_leases += 1
                elif o.status == store.DELIVERED:
                    self.stats.delivered += 1
                elif o.status == store.DEAD:
                    self.stats.dead += 1
                else:
                    self.stats.failed += 1
        if lost:
            by_id = {m.id: m for m in batch}
            for o in outcomes:
                if o.message_id in lost:
                    logger.warning(
                        "lease lost for %s #%d (attempt %d) before its outcome was recorded",
                        by_id[o.message_id].topic,
                        o.message_id,
                        o.number,
                        extra=log_fields(by_id[o.message_id], o.number, self.config.worker_id),
                    )
        return outcomes, lost

    def _store(self, outcomes: Sequence[store.Outcome]) -> set[int]:
        """``store.record()``, riding out a database outage: a late record is still fenced, so it is safe.

        Errors that say the data is wrong rather than the database away are raised to the caller.
        """
        cfg = self.config
        give_up_at = time.monotonic() + max(2 * cfg.lease_seconds, 60.0)
        failures = 0
        while True:
            try:
                return store.record(cfg.database, worker=cfg.worker_id, outcomes=outcomes)
            except _DATA_ERRORS:
                raise
            except DatabaseError as exc:
                failures += 1
                if time.monotonic() > give_up_at or self.halt.is_set():
                    logger.error(
                        "could not record %d outcomes (%s); their leases will expire and the "
                        "messages will be delivered again",
                        len(outcomes),
                        exc,
                    )
                    return {o.message_id for o in outcomes}
                database_down(cfg.database, exc, failures, self.stopping)

    def _record_one_by_one(
        self, outcomes: Sequence[store.Outcome], batch: Sequence[Message]
    ) -> tuple[list[store.Outcome], set[int]]:
        by_id = {m.id: m for m in batch}
        stored: list[store.Outcome] = []
        lost: set[int] = set()
        for outcome in outcomes:
            try:
                lost |= self._store([outcome])
                stored.append(outcome)
                continue
            except Exception as exc:
                substitute = self._unrecordable(outcome, by_id[outcome.message_id], exc)
            try:
                lost |= self._store([substitute])
                stored.append(substitute)
            except Exception:
                logger.exception(
                    "could not record even a failed attempt for message #%d; its lease will expire and the "
                    "reaper will requeue it",
                    outcome.message_id,
                    extra=log_fields(by_id[outcome.message_id], outcome.number, self.config.worker_id),
                )
                lost.add(outcome.message_id)
                stored.append(outcome)
        return stored, lost

    def _unrecordable(self, outcome: store.Outcome, message: Message, exc: BaseException) -> store.Outcome:
        """A failed attempt in place of an outcome the store refused: retried (or dead) like any failure."""
        failure = self.failure(message, exc, outcome.started_at)
        note = (
            f"the outcome of this attempt ({outcome.attempt_outcome}) could not be recorded, so it is "
            "recorded as failed and the message will be retried (it may have been delivered already):"
        )
        return dataclasses.replace(failure, error=f"{note}\n{failure.error}")

    def _release(self, message_ids: list[int]) -> None:
        try:
            released = store.release(self.config.database, worker=self.config.worker_id, message_ids=message_ids)
        except DatabaseError as exc:
            logger.warning(
                "could not release %d unstarted messages (%s); their leases will expire", len(message_ids), exc
            )
            return
        logger.info("released %d claimed but unstarted messages", released)

    # --- after the record ------------------------------------------------------------------------

    def _hands_off_keys(self, batch: Sequence[Message], outcomes: Sequence[store.Outcome], lost: set[int]) -> bool:
        """Whether recording this batch may have made a message of a topic this worker does not serve
        claimable: it serves only some topics (``--topics``), and a keyed message of it is finished.

        A worker that serves every topic claims the key's next message itself (the loop's
        ``_claim_again_at_once``); one that does not must wake the others, or they wait for their poll
        (NOTIFY wakes every listener; the ones with nothing to claim go back to sleep after one claim).
        """
        if not self.config.topics or not self.wakes_others:
            return False
        keyed = {m.id for m in batch if m.key is not None}
        return any(
            o.message_id in keyed and o.message_id not in lost and o.status in (store.DELIVERED, store.DEAD)
            for o in outcomes
        )

    def announce(self, batch: Sequence[Message], outcomes: Sequence[store.Outcome], lost: set[int]) -> None:
        by_id = {m.id: m for m in batch}
        # Asked once per batch: per message, these two questions cost more than the rest of this loop.
        debug = logger.isEnabledFor(logging.DEBUG)
        delivered_listeners = signals.message_delivered.has_listeners(Message)
        worker = self.config.worker_id
        for o in outcomes:
            message = by_id[o.message_id]
            if o.message_id in lost:
                continue
            if o.status == store.DELIVERED:
                if debug:
                    logger.debug(
                        "delivered %s #%d (attempt %d)",
                        message.topic,
                        message.id,
                        o.number,
                        extra=log_fields(message, o.number, worker),
                    )
                if delivered_listeners:
                    signals.message_delivered.send_robust(Message, message=message, attempt=o.number)
            elif o.status == store.DEAD:
                logger.error(
                    "message %s #%d is dead after attempt %d: %s",
                    message.topic,
                    message.id,
                    o.number,
                    o.error.splitlines()[-1] if o.error else "",
                    extra=log_fields(message, o.number, worker),
                )
                signals.message_dead.send_robust(Message, message=message, attempt=o.number, error=o.error)
            else:
                logger.warning(
                    "attempt %d of %s #%d failed, retrying at %s: %s",
                    o.number,
                    message.topic,
                    message.id,
                    o.retry_at,
                    o.error.splitlines()[-1] if o.error else "",
                    extra=log_fields(message, o.number, worker),
                )
                signals.message_failed.send_robust(
                    Message, message=message, attempt=o.number, error=o.error, retry_at=o.retry_at
                )
