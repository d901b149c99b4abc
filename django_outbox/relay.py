"""The worker loop: wait, claim, deliver, record, shut down. No query is built here; ``store`` has them.

Threads:
- ``concurrency`` delivery threads, each claiming its own batch, delivering it in id order with no
  transaction open, then recording every outcome in one statement;
- one keeper thread that extends the leases of what this worker holds (so a slow but healthy delivery
  is not taken away), reaps the leases of dead workers and writes the worker's heartbeat row;
- on PostgreSQL, one listener thread that turns each ``NOTIFY`` into a ring of the doorbell, which wakes
  one idle delivery thread (a thread whose claim came back full rings it again for the next).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
import os
import random
import secrets
import socket
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from django.db import DatabaseError, DataError, IntegrityError, NotSupportedError, ProgrammingError, connections
from django.utils import timezone

from . import signals, store
from .conf import OutboxSettings, get_settings
from .doorbell import Doorbell
from .exceptions import DeliveryError, PermanentDeliveryError
from .models import Message
from .routing import resolve_transport
from .timeouts import BoundedCaller, time_limit
from .transports.base import checked_results
from .transports.registry import TransportSet
from .wakeup import Listener, notify_now

logger = logging.getLogger("django_outbox.relay")

ERROR_MAX_CHARS = 4000
#: Database errors that say what was sent is wrong, not that the database is away: retrying the same
#: outcomes cannot help, so they are not ridden out as an outage (``Relay._store``).
_DATA_ERRORS = (DataError, IntegrityError, ProgrammingError, NotSupportedError)


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclass(frozen=True, kw_only=True, slots=True)
class RelayConfig:
    database: str = "default"
    batch_size: int = 100
    concurrency: int = 1
    topics: tuple[str, ...] = ()
    lease_seconds: float = 60.0
    poll_interval: float = 5.0
    until_empty: bool = False
    grace_period: float = 30.0
    notify: bool = True
    handler_timeout: float | None = None  # seconds a delivery call may take; None: no limit
    housekeeping_interval: float = 0.0  # seconds between housekeeping rounds; 0: never (cron does it)
    worker_id: str = field(default_factory=new_worker_id)

    @classmethod
    def from_settings(cls, **overrides: object) -> RelayConfig:
        conf = get_settings()
        values: dict[str, object] = {
            "database": conf.DATABASE,
            "batch_size": conf.BATCH_SIZE,
            "lease_seconds": conf.LEASE_SECONDS,
            "poll_interval": conf.POLL_INTERVAL_SECONDS,
            "grace_period": conf.GRACE_PERIOD_SECONDS,
            "notify": conf.NOTIFY,
            "handler_timeout": conf.HANDLER_TIMEOUT_SECONDS,
            "housekeeping_interval": conf.HOUSEKEEPING_INTERVAL_SECONDS,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "concurrency" not in values:
            values["concurrency"] = conf.CONCURRENCY or default_concurrency(str(values["database"]))
        return cls(**values)  # type: ignore[arg-type]


def default_concurrency(alias: str) -> int:
    """Delivery threads when neither ``--concurrency`` nor ``OUTBOX["CONCURRENCY"]`` says.

    On PostgreSQL, two: a delivery thread spends most of a batch waiting for the database (the claim,
    the record, their commits) and the rest in Python, and a second thread fills those waits, which
    about doubled one worker process's drain rate (docs/performance.md). More threads than that did not
    pay on a 2-core machine. On SQLite, one: its writers queue for one lock, and a second thread would
    only wait in SQLite's busy handler.
    """
    return 2 if connections[alias].vendor == "postgresql" else 1


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


#: The longest retry delay the relay ever computes, whatever the settings, the attempt number or a
#: destination's ``Retry-After`` say: ten years, beyond any sensible cap and far inside what a datetime
#: and the databases hold, so that ``finished + timedelta(seconds=delay)`` cannot overflow.
MAX_DELAY_SECONDS = 10 * 365.25 * 24 * 3600.0
#: Beyond this the exponential part stops growing: ``2.0 ** 1024`` overflows a float, while any base
#: times ``2.0 ** 1023`` is a float (or infinity), which the cap then bounds.
_MAX_EXPONENT = 1023


def _seconds(value: object) -> float | None:
    """A number of seconds clamped into [0, MAX_DELAY_SECONDS]; None for NaN and for what is no number.

    Settings, a transport's ``retry_after`` or a stored value may be anything (an int too big for a
    float, infinity, a string): each is judged here, so the arithmetic after it cannot raise.
    """
    try:
        number = float(value)  # type: ignore[arg-type]
    except OverflowError:  # an int beyond a float's range: the far end of its sign
        return MAX_DELAY_SECONDS if value > 0 else 0.0  # type: ignore[operator]
    except (TypeError, ValueError):
        return None
    if math.isnan(number):
        return None
    return min(max(number, 0.0), MAX_DELAY_SECONDS)


def backoff_seconds(
    attempt: int,
    *,
    base: float,
    cap: float,
    retry_after: float | None = None,
    retry_after_cap: float | None = None,
) -> float:
    """Capped exponential backoff with jitter (half fixed, half random), at least ``retry_after``.

    ``retry_after`` (a destination's wish) is honoured up to ``retry_after_cap``. The result is finite
    and within [0, MAX_DELAY_SECONDS] for any input: the exponent is capped before it is computed, NaN
    and non-numbers fall back to the defaults (a NaN ``retry_after`` is ignored), infinities and
    negatives are clamped. A worker must never die on a message because of the arithmetic of its retry.
    """
    defaults = OutboxSettings()
    base_s = _seconds(base)
    cap_s = _seconds(cap)
    base_s = defaults.BACKOFF_BASE_SECONDS if base_s is None else base_s
    cap_s = defaults.BACKOFF_MAX_SECONDS if cap_s is None else cap_s
    exponent = min(max(attempt - 1, 0), _MAX_EXPONENT)
    ceiling = min(cap_s, base_s * 2.0**exponent)
    delay = ceiling / 2 + random.uniform(0, ceiling / 2)
    wish = _seconds(retry_after)
    if wish is not None:
        wish_cap = MAX_DELAY_SECONDS if retry_after_cap is None else _seconds(retry_after_cap)
        delay = max(delay, min(wish, cap_s if wish_cap is None else wish_cap))
    return min(float(delay), MAX_DELAY_SECONDS)


def _type_name(obj: object) -> str:
    try:
        return str(type(obj).__qualname__)
    except Exception:  # a metaclass may hide even this
        return "an exception"


def describe_error(exc: BaseException) -> str:
    """The error and the tail of its traceback: what an operator needs, bounded in size.

    The text stays as the exception wrote it; ``store.record()`` escapes what the database cannot store.
    It never raises: an exception whose ``__notes__`` (or anything else formatting reads) raises is
    described by its type, since a failure to describe one attempt must not stop the worker.
    """
    try:
        text = "".join(traceback.format_exception(exc, limit=-8)).strip()
    except Exception as problem:
        text = f"{_type_name(exc)} (the exception could not be formatted: {_type_name(problem)})"
    if len(text) > ERROR_MAX_CHARS:
        text = "...\n" + text[-ERROR_MAX_CHARS:]
    return text


class Relay:
    def __init__(self, config: RelayConfig) -> None:
        self.config = config
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
        self._local = threading.local()  # each delivery thread's BoundedCaller, with a handler timeout

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

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def run(self, *, progress: Callable[[Stats], None] | None = None, progress_every: float = 2.0) -> None:
        """Relay until stopped (or, with ``until_empty``, until nothing is left to do now)."""
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
        keeper = threading.Thread(target=self._keep, name="outbox-keeper", daemon=True)
        keeper.start()
        if cfg.housekeeping_interval > 0 and not cfg.until_empty:
            threading.Thread(target=self._housekeep, name="outbox-housekeeper", daemon=True).start()
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
                progress(self.stats)
                next_progress = time.monotonic() + progress_every
        self._stopping.set()
        self._done.set()
        keeper.join(timeout=10)
        if progress is not None:
            progress(self.stats)
        logger.info(
            "worker %s stopped: delivered=%d failed=%d dead=%d",
            cfg.worker_id,
            self.stats.delivered,
            self.stats.failed,
            self.stats.dead,
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
        self._local.direct = True  # handlers must run here, on the caller's connection: no timeout thread
        try:
            while self._cycle(transports):
                pass
        finally:
            self._close_caller()
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
                batch = store.claim(
                    cfg.database,
                    worker=cfg.worker_id,
                    limit=cfg.batch_size,
                    lease_seconds=cfg.lease_seconds,
                    topics=cfg.topics,
                )
            finally:
                with self._activity:
                    self._claiming -= 1
                    self._holding += bool(batch)
                    self._activity.notify_all()
            if not batch:
                return None
            if len(batch) >= cfg.batch_size:
                self._bell.ring()  # more may be due: a peer claims the next batch while this one is delivered
            self._process(batch, transports)
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
                    self._database_down(exc, failures)
        except Exception:
            # A bug or a broken configuration, not an outage: stop the whole worker loudly rather than
            # leave a process that looks alive and relays nothing. Leased messages return via the reaper.
            logger.exception("delivery thread crashed; stopping the worker")
            self.crashed = True
            self.stop()
        finally:
            self._close_caller()
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

    def _database_down(self, exc: BaseException, failures: int) -> None:
        delay = min(10.0, 0.2 * 2 ** min(failures, 6))
        logger.warning(
            "database %r unavailable (%s); retrying in %.1fs",
            self.config.database,
            str(exc).strip() or type(exc).__name__,
            delay,
        )
        try:
            connections[self.config.database].close()
        except DatabaseError:
            pass
        self._stopping.wait(delay)

    def _process(self, batch: Sequence[Message], transports: TransportSet) -> None:
        with self.stats.lock:
            self.stats.in_flight += len(batch)
        outcomes: list[store.Outcome] = []
        unstarted: list[int] = []
        try:
            index = 0
            while index < len(batch):
                if self._halt.is_set():
                    unstarted = [m.id for m in batch[index:]]
                    break
                group = self._next_group(batch, index, transports)
                outcomes += self._deliver_group(group, transports)
                index += len(group)
        finally:
            recorded, lost = self._record(outcomes, batch)
            if unstarted:
                self._release(unstarted)
            with self.stats.lock:
                self.stats.in_flight -= len(batch)
        if self._hands_off_keys(batch, recorded, lost):
            try:
                notify_now(self.config.database)
            except DatabaseError as exc:  # the others poll: late, not lost
                logger.warning("could not wake the workers of other topics (%s)", exc)
        try:
            self._announce(batch, recorded, lost)
        except Exception:  # logging or a signal's plumbing failed: the outcomes are stored, go on
            logger.exception("announcing the outcomes of a batch failed")

    def _hands_off_keys(self, batch: Sequence[Message], outcomes: Sequence[store.Outcome], lost: set[int]) -> bool:
        """Whether recording this batch may have made a message of a topic this worker does not serve
        claimable: it serves only some topics (``--topics``), and a keyed message of it is finished.

        A worker that serves every topic claims the key's next message itself (``_claim_again_at_once``);
        one that does not must wake the others, or they wait for their poll (NOTIFY wakes every
        listener; the ones with nothing to claim go back to sleep after one claim).
        """
        cfg = self.config
        if not cfg.topics or self.listener is None:
            return False
        keyed = {m.id for m in batch if m.key is not None}
        return any(
            o.message_id in keyed and o.message_id not in lost and o.status in (store.DELIVERED, store.DEAD)
            for o in outcomes
        )

    @staticmethod
    def _transport_name(message: Message) -> str | None:
        try:
            return resolve_transport(message.topic)
        except Exception:
            return None  # reported as this message's failure by _deliver_group

    def _next_group(self, batch: Sequence[Message], start: int, transports: TransportSet) -> Sequence[Message]:
        """The next message, with the ones after it for the same transport when that transport batches."""
        name = self._transport_name(batch[start])
        if name is None:
            return batch[start : start + 1]
        try:
            batching = transports.get(name).supports_batch()
        except Exception:
            return batch[start : start + 1]
        end = start + 1
        while batching and end < len(batch) and self._transport_name(batch[end]) == name:
            end += 1
        return batch[start:end]

    def _deliver_group(self, group: Sequence[Message], transports: TransportSet) -> list[store.Outcome]:
        started = timezone.now()
        results: Sequence[BaseException | None]
        try:
            transport = transports.get(resolve_transport(group[0].topic))

            def call() -> Sequence[BaseException | None]:
                with time_limit(self.config.handler_timeout):  # lets an async handler be cancelled in time
                    if len(group) == 1:
                        transport.deliver(group[0])
                        return [None]
                    return checked_results(transport, group, transport.deliver_batch(group))

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
            else self._failure(m, result, started)
            for m, result in zip(group, results, strict=True)
        ]

    def _caller(self) -> BoundedCaller | None:
        timeout = self.config.handler_timeout
        if timeout is None or getattr(self._local, "direct", False):
            return None
        caller: BoundedCaller | None = getattr(self._local, "caller", None)
        if caller is None:
            caller = self._local.caller = BoundedCaller(timeout, name=threading.current_thread().name)
        return caller

    def _close_caller(self) -> None:
        caller: BoundedCaller | None = getattr(self._local, "caller", None)
        if caller is not None:
            caller.close()
            self._local.caller = None

    def _failure(self, message: Message, exc: BaseException, started: dt.datetime) -> store.Outcome:
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
        delay = self._retry_delay(message, exc)
        return store.Outcome(
            message_id=message.id,
            number=message.attempts,
            status=store.PENDING,
            started_at=started,
            finished_at=finished,
            error=error,
            retry_delay=delay,  # the record adds it to the database's clock
        )

    @staticmethod
    def _retry_delay(message: Message, exc: BaseException) -> float:
        """Seconds until the retry, bounded (``backoff_seconds``); a destination's ``retry_after`` is
        honoured up to ``RETRY_AFTER_MAX_SECONDS``. Settings that cannot be read now, or a
        ``retry_after`` that raises when read, give the default backoff rather than no outcome."""
        try:
            conf = get_settings()
            base, cap = conf.BACKOFF_BASE_SECONDS, conf.BACKOFF_MAX_SECONDS
            retry_after_cap = conf.RETRY_AFTER_MAX_SECONDS
        except Exception:
            logger.exception("OUTBOX settings unreadable while scheduling a retry; using the default backoff")
            defaults = OutboxSettings()
            base, cap, retry_after_cap = defaults.BACKOFF_BASE_SECONDS, defaults.BACKOFF_MAX_SECONDS, None
        try:
            retry_after = exc.retry_after if isinstance(exc, DeliveryError) else None
        except Exception:
            retry_after = None  # a property that raises: no wish to honour
        return backoff_seconds(
            message.attempts,
            base=base,
            cap=cap,
            retry_after=retry_after,
            retry_after_cap=cap if retry_after_cap is None else retry_after_cap,
        )

    def _record(
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
            logger.warning("lease lost for messages %s before their outcome was recorded", sorted(lost))
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
                if time.monotonic() > give_up_at or self._halt.is_set():
                    logger.error(
                        "could not record %d outcomes (%s); their leases will expire and the "
                        "messages will be delivered again",
                        len(outcomes),
                        exc,
                    )
                    return {o.message_id for o in outcomes}
                self._database_down(exc, failures)

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
                )
                lost.add(outcome.message_id)
                stored.append(outcome)
        return stored, lost

    def _unrecordable(self, outcome: store.Outcome, message: Message, exc: BaseException) -> store.Outcome:
        """A failed attempt in place of an outcome the store refused: retried (or dead) like any failure."""
        failure = self._failure(message, exc, outcome.started_at)
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

    def _announce(self, batch: Sequence[Message], outcomes: Sequence[store.Outcome], lost: set[int]) -> None:
        by_id = {m.id: m for m in batch}
        # Asked once per batch: per message, these two questions cost more than the rest of this loop.
        debug = logger.isEnabledFor(logging.DEBUG)
        delivered_listeners = signals.message_delivered.has_listeners(Message)
        for o in outcomes:
            message = by_id[o.message_id]
            if o.message_id in lost:
                continue
            if o.status == store.DELIVERED:
                if debug:
                    logger.debug("delivered %s #%d (attempt %d)", message.topic, message.id, o.number)
                if delivered_listeners:
                    signals.message_delivered.send_robust(Message, message=message, attempt=o.number)
            elif o.status == store.DEAD:
                logger.error(
                    "message %s #%d is dead after attempt %d: %s",
                    message.topic,
                    message.id,
                    o.number,
                    o.error.splitlines()[-1] if o.error else "",
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
                )
                signals.message_failed.send_robust(
                    Message, message=message, attempt=o.number, error=o.error, retry_at=o.retry_at
                )

    # --- keeper ----------------------------------------------------------------------------------

    def _keep(self) -> None:
        cfg = self.config
        interval = max(0.2, min(cfg.lease_seconds / 3, 5.0))
        hostname, pid = socket.gethostname(), os.getpid()

        def beat(*, stopped: bool = False) -> store.WorkerBeat:
            return store.WorkerBeat(
                worker_id=cfg.worker_id,
                hostname=hostname,
                pid=pid,
                started_at=self.started_at,
                in_flight=0 if stopped else self.stats.in_flight,
                delivered=self.stats.delivered,
                failed=self.stats.failed + self.stats.dead,
                stopped=stopped,
                housekeeping_failures=self.stats.housekeeping_failures,
                housekeeping_error=self.stats.housekeeping_error,
            )

        try:
            while not self._done.is_set():
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
                        self._bell.ring()
                    store.heartbeat(cfg.database, beat())
                except DatabaseError as exc:
                    logger.warning("keeper could not reach the database (%s)", exc)
                    try:
                        connections[cfg.database].close()
                    except DatabaseError:
                        pass
                self._done.wait(interval)
            try:
                store.heartbeat(cfg.database, beat(stopped=True))
            except DatabaseError:
                pass
        finally:
            connections.close_all()

    # --- housekeeper -----------------------------------------------------------------------------

    def _housekeep(self) -> None:
        """Retention in its own thread, so a slow round never delays the keeper's lease renewals.

        Every worker runs this loop; on PostgreSQL an advisory lock lets one of them work per round. No
        error ends it: a round that raises is logged with its traceback, counted and reported in the
        worker's heartbeat row (the admin overview and ``outbox_status`` show it), and the next round runs
        on schedule. A thread that died here would leave a worker that delivers but never cleans up, with
        nothing to say so.
        """
        from . import housekeeping

        cfg = self.config
        wait = min(cfg.housekeeping_interval, 5.0)  # a first round soon after start, then every interval
        try:
            while not self._done.wait(wait):
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
