"""Prometheus metrics (extra ``[prometheus]``): what a worker counts, what the table holds, and the server.

Counted by the worker as it records outcomes (``WorkerMetrics``, a ``worker.observer.Observer``):
``outbox_messages_delivered_total``, ``outbox_messages_failed_total`` (every failed attempt, those that
made their message dead included), ``outbox_messages_dead_total`` (labels ``topic``, ``transport``),
``outbox_delivery_duration_seconds`` (by ``transport``), ``outbox_claim_duration_seconds``,
``outbox_worker_threads_busy``.

Sampled from the table (``Backlog``): ``outbox_backlog_messages`` (by ``status``), ``outbox_lag_seconds``,
``outbox_blocked_keys``, ``outbox_workers_alive``: the bounded queries of the admin's overview, at most
every ``BACKLOG_SAMPLE_SECONDS``, and on PostgreSQL by one worker at a time (the one holding a
session-level advisory lock; the others leave these series out, so ``max()`` over the workers is the
value). A sample that fails leaves them out too, so an alert on ``absent()`` fires rather than on a
stale number.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from django.db import DatabaseError, connections
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..admin import overview
from ..worker.observer import Observer
from .labels import TopicLabels

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from .. import store
    from ..store.models import Message

logger = logging.getLogger("django_outbox.relay")

BACKLOG_SAMPLE_SECONDS = 5.0
#: Arbitrary but fixed (housekeeping's is another): the worker holding it samples the backlog.
BACKLOG_LOCK_ID = 0x6F75_7462_6D74  # "outbmt"
#: Delivery calls take from a millisecond (a local handler) to the transports' longest timeouts.
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
#: The label of a message whose topic no route serves (its attempt failed for that reason).
NO_TRANSPORT = "none"


def multiprocess_dir() -> str | None:
    """prometheus-client's multiprocess mode, on when its documented variable names a directory."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir") or None


class WorkerMetrics(Observer):
    """The worker's counters and histograms, counted from what the pipeline recorded."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("topic", "transport")
        self.topic_label = TopicLabels()
        self.delivered = Counter("outbox_messages_delivered", "Messages delivered.", labels, registry=registry)
        self.failed = Counter(
            "outbox_messages_failed",
            "Failed delivery attempts (retried, or the last one of a dead message).",
            labels,
            registry=registry,
        )
        self.dead = Counter("outbox_messages_dead", "Messages that became dead.", labels, registry=registry)
        self.duration = Histogram(
            "outbox_delivery_duration_seconds",
            "Time of one delivery call (a batch's call counts once per message).",
            ("transport",),
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.claim = Histogram(
            "outbox_claim_duration_seconds",
            "Time of one claim statement, empty ones included.",
            buckets=CLAIM_BUCKETS,
            registry=registry,
        )
        self.busy = Gauge(
            "outbox_worker_threads_busy",
            "Delivery threads processing a claimed batch.",
            registry=registry,
            multiprocess_mode="livesum",
        )

    def claimed(self, batch: Sequence[Message], seconds: float) -> None:
        self.claim.observe(seconds)

    def batch_started(self, batch: Sequence[Message]) -> None:
        self.busy.inc()

    def batch_done(
        self,
        batch: Sequence[Message],
        outcomes: Sequence[store.Outcome],
        lost: set[int],
        transports: Mapping[int, str],
    ) -> None:
        from .. import store

        self.busy.dec()
        topics = {m.id: m.topic for m in batch}
        for o in outcomes:
            if o.message_id in lost:  # another worker holds it now: its outcome is that worker's to count
                continue
            topic = topics[o.message_id]
            transport = transports.get(o.message_id, NO_TRANSPORT)
            labels = (self.topic_label(topic), transport)
            self.duration.labels(transport).observe(max(0.0, (o.finished_at - o.started_at).total_seconds()))
            if o.status == store.DELIVERED:
                self.delivered.labels(*labels).inc()
                continue
            self.failed.labels(*labels).inc()
            if o.status == store.DEAD:
                self.dead.labels(*labels).inc()


class Backlog(Collector):
    """The table's gauges, from the last sample; ``sample_forever`` takes one every ``interval`` seconds."""

    def __init__(self, database: str, *, interval: float = BACKLOG_SAMPLE_SECONDS) -> None:
        self.database = database
        self.interval = interval
        self.latest: overview.Gauges | None = None
        self.sampled = threading.Event()  # set after each sample, taken or declined (tests wait on it)
        self._leader = False
        self._lock = threading.Lock()
        self._taken = 0.0

    def collect(self) -> Iterator[Metric]:
        latest = self.latest
        if latest is None:
            return
        backlog = GaugeMetricFamily(
            "outbox_backlog_messages", "Messages by status (exact up to 10,000, estimated above).", labels=["status"]
        )
        for status, tally in latest.counts.items():
            backlog.add_metric([status], tally.value)
        yield backlog
        yield GaugeMetricFamily(
            "outbox_lag_seconds", "Age of the oldest message a worker could claim now.", value=latest.lag_seconds
        )
        yield GaugeMetricFamily(
            "outbox_blocked_keys", "Keys held behind a dead message (ORDERING 'block').", value=latest.blocked_keys
        )
        yield GaugeMetricFamily(
            "outbox_workers_alive", "Workers whose heartbeat is recent.", value=latest.workers_alive
        )

    def refresh(self) -> None:
        """For the web process's view: a sample at most every ``interval`` seconds, whoever asks."""
        with self._lock:
            if self.latest is not None and time.monotonic() - self._taken < self.interval:
                return
            try:
                self.latest = overview.gauges(self.database)
            except DatabaseError:
                self.latest = None  # an expired sample is not served as if it were current
                raise
            self._taken = time.monotonic()

    def sample(self) -> None:
        """One sample, if this process is the one that samples; runs on the sampling thread's connection."""
        try:
            if not self._leads():
                self.latest = None
                return
            self.latest = overview.gauges(self.database)
        except DatabaseError as exc:
            logger.warning("could not sample the backlog for the metrics (%s)", exc)
            self.latest, self._leader = None, False
            try:
                connections[self.database].close()  # the lock goes with the session, if it held it
            except DatabaseError:
                pass
        finally:
            self.sampled.set()

    def _leads(self) -> bool:
        """Whether this process samples: on PostgreSQL the holder of the lock (kept by this thread's session)."""
        connection = connections[self.database]
        if connection.vendor != "postgresql":
            return True  # one host (SQLite); MariaDB workers each sample, which is as cheap as the admin page
        if self._leader and connection.connection is not None:
            return True
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [BACKLOG_LOCK_ID])
            (self._leader,) = cursor.fetchone()
        return self._leader

    def sample_forever(self, done: threading.Event) -> None:
        try:
            while not done.is_set():
                self.sample()
                done.wait(self.interval)
        finally:
            connections.close_all()


_process_lock = threading.Lock()


@functools.cache
def process_registry() -> CollectorRegistry:
    """The counters of deliveries made in this process outside a worker command (``relay_all()``,
    ``OUTBOX["EAGER"]``): a registry of their own, read with ``get_sample_value()`` or served by a
    collector of the caller's; the worker command counts into its ``/metrics`` server's."""
    return CollectorRegistry()


def process_metrics() -> WorkerMetrics:
    """This process's ``WorkerMetrics`` on ``process_registry()``, made once (its series can be
    registered only once per registry)."""
    with _process_lock:
        return _process_metrics()


@functools.cache
def _process_metrics() -> WorkerMetrics:
    return WorkerMetrics(process_registry())


class MetricsServer:
    """The worker's ``/metrics``: its own counters (or, in multiprocess mode, every process's) and the backlog."""

    def __init__(
        self, database: str, *, addr: str, port: int | None, sample_interval: float = BACKLOG_SAMPLE_SECONDS
    ) -> None:
        """``port`` None: count only (multiprocess mode, for the worker that serves); ``start()`` binds nothing."""
        self.addr, self.requested_port = addr, port
        counted = CollectorRegistry()
        self.observer = WorkerMetrics(counted)
        self.backlog = Backlog(database, interval=sample_interval)
        served = counted
        if multiprocess_dir():
            from prometheus_client import multiprocess

            served = CollectorRegistry()
            multiprocess.MultiProcessCollector(served)  # type: ignore[no-untyped-call]
        served.register(self.backlog)
        self.registry = served
        self._server: WSGIServer | None = None
        self._done = threading.Event()
        self._sampler: threading.Thread | None = None

    @property
    def port(self) -> int | None:
        """The bound port (the requested one, or the one the system chose for port 0)."""
        return self._server.server_port if self._server is not None else self.requested_port

    def start(self) -> None:
        """Bind and serve; ``OSError`` (port taken, address not on this host) is the caller's to report."""
        if self.requested_port is None:
            return
        self._server, _ = start_http_server(self.requested_port, self.addr, registry=self.registry)
        self._sampler = threading.Thread(
            target=self.backlog.sample_forever, args=(self._done,), name="outbox-metrics-sampler", daemon=True
        )
        self._sampler.start()

    def stop(self) -> None:
        self._done.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._sampler is not None:
            self._sampler.join(timeout=5)
        if multiprocess_dir():
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]
