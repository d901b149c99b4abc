"""The figures an operator checks first: backlog per status, lag, throughput, dead letters, live workers.

One function gathers them for both the admin's overview page and ``manage.py outbox_status``, so the
page and the health check can never disagree. Every query is served by an index and bounded, so the
page stays fast on a table of millions of rows (see ``counting``).
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db import connections, transaction
from django.db.models import (
    Count,
    Exists,
    Max,
    Min,
    OuterRef,
    Q,
    QuerySet,
)
from django.db.models.functions import TruncMinute

from .. import store
from ..models import Attempt, Message, Worker
from .counting import EXACT_COUNT_CAP, Tally, tally
from .errors import error_summary

#: A worker whose heartbeat is older than this is shown as gone. Workers beat every 5 seconds at most.
STALE_AFTER_SECONDS = 30.0
#: Stopped or vanished workers stay listed this long, so a crash is still visible in the morning.
GONE_WORKERS_SHOWN_FOR = dt.timedelta(hours=24)
MAX_WORKERS_SHOWN = 50
MAX_DEAD_TOPICS_SHOWN = 50
MAX_BLOCKED_KEYS_SHOWN = 50
WINDOW_MINUTES = 60
#: The lag and the held-by-key count look at most this many due messages (plus one), oldest first: one
#: key probe each. 10,000 cost up to 200 ms on the first read of freshly written rows (hint bits, heap
#: fetches) on a million-row table, as much as a DBA's statement_timeout allows; 2,000 cost a fifth.
DUE_WINDOW = 2_000


@dataclass(frozen=True, kw_only=True, slots=True)
class Minute:
    start: dt.datetime
    delivered: int
    failed: int


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerState:
    worker_id: str
    hostname: str
    pid: int
    started_at: dt.datetime
    last_seen: dt.datetime
    in_flight: int
    delivered: int
    failed: int
    state: str  # alive | stopped | gone
    housekeeping_failures: int = 0  # rounds of this worker's housekeeping that raised
    housekeeping_error: str = ""  # the last round's error, "" when it succeeded

    @property
    def housekeeping_failing(self) -> bool:
        return bool(self.housekeeping_error)

    @property
    def housekeeping_summary(self) -> str:
        """The last round's error in one line: its exception's own, as an attempt's error is summed up."""
        return error_summary(self.housekeeping_error)

    @property
    def alive(self) -> bool:
        return self.state == "alive"


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockedKey:
    """A key held back by a dead message (ORDERING "block") until an operator retries or cancels it."""

    key: str
    dead_message_id: int  # the earliest dead message of the key: retry or cancel it to unblock
    dead: int
    waiting: int  # pending messages of the key
    #: False when the listed keys' waiting messages passed the count's cap: ``waiting`` is a lower bound.
    waiting_exact: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class Overview:
    generated_at: dt.datetime
    counts: dict[str, Tally]
    oldest_deliverable_at: dt.datetime | None
    minutes: list[Minute]
    dead_by_topic: list[tuple[str, int]]
    workers: list[WorkerState] = field(default_factory=list)
    blocked_keys: list[BlockedKey] = field(default_factory=list)
    #: Pending messages that wait by design, apart from the lag: not due yet, or due but behind an
    #: earlier open (or, under ORDERING "block", dead) message of their key.
    held_by_schedule: Tally = field(default_factory=lambda: Tally(0, exact=True))
    held_by_key: Tally = field(default_factory=lambda: Tally(0, exact=True))
    #: False when more than ``DUE_WINDOW`` due messages at the head of the due index are all held
    #: behind their keys: the walk stops there, and ``lag_seconds`` is an upper bound (their wait).
    lag_exact: bool = True

    @property
    def lag_seconds(self) -> float:
        """How long the oldest message that a worker could claim now has been waiting (0 when none).

        Only messages a claim would take count: due, and first of their key. A message held by its
        schedule or behind its key waits by design, and is reported in ``held_by_*`` instead.
        """
        if self.oldest_deliverable_at is None:
            return 0.0
        return max(0.0, (self.generated_at - self.oldest_deliverable_at).total_seconds())

    @property
    def alive_workers(self) -> list[WorkerState]:
        return [w for w in self.workers if w.alive]

    @property
    def housekeeping_failing(self) -> list[WorkerState]:
        """Live workers whose last housekeeping round raised."""
        return [w for w in self.alive_workers if w.housekeeping_failing]

    @property
    def delivered_last_hour(self) -> int:
        return sum(m.delivered for m in self.minutes)

    @property
    def failed_last_hour(self) -> int:
        return sum(m.failed for m in self.minutes)

    def as_json(self) -> dict[str, Any]:
        def when(value: dt.datetime | None) -> str | None:
            return value.isoformat() if value else None

        return {
            "generated_at": when(self.generated_at),
            "counts": {status: t.value for status, t in self.counts.items()},
            "counts_exact": {status: t.exact for status, t in self.counts.items()},
            "lag_seconds": round(self.lag_seconds, 3),
            "lag_exact": self.lag_exact,
            "oldest_deliverable_at": when(self.oldest_deliverable_at),
            "held_by_schedule": self.held_by_schedule.value,
            "held_by_key": self.held_by_key.value,
            "delivered_last_hour": self.delivered_last_hour,
            "failed_last_hour": self.failed_last_hour,
            "per_minute": [
                {"minute": when(m.start), "delivered": m.delivered, "failed": m.failed} for m in self.minutes
            ],
            "dead_by_topic": [{"topic": topic, "dead": n} for topic, n in self.dead_by_topic],
            "blocked_keys": [asdict(b) for b in self.blocked_keys],
            "workers_alive": len(self.alive_workers),
            "housekeeping_failing": [w.worker_id for w in self.housekeeping_failing],
            "workers": [
                {**asdict(w), "started_at": when(w.started_at), "last_seen": when(w.last_seen)} for w in self.workers
            ],
        }


def collect(
    using: str = "default", *, now: dt.datetime | None = None, stale_after: float = STALE_AFTER_SECONDS
) -> Overview:
    # The clock the stored times come from: the database server's on PostgreSQL (leases, due times,
    # heartbeats), so liveness and lag do not depend on this host's clock or the workers'.
    now = now or store.database_now(using)
    messages = Message.objects.using(using)
    counts = {status: tally(messages.filter(status=status)) for status in Message.Status.values}
    due = messages.filter(status=Message.Status.PENDING, available_at__lte=now)
    head = _due_head(due)
    dead_by_topic = [
        (row["topic"], row["n"])
        for row in messages.filter(status=Message.Status.DEAD)
        .values("topic")
        .annotate(n=Count("id"))
        .order_by("-n", "topic")[:MAX_DEAD_TOPICS_SHOWN]
    ]
    return Overview(
        generated_at=now,
        counts=counts,
        oldest_deliverable_at=head.oldest,
        lag_exact=head.oldest_exact,
        minutes=_minutes(using, now),
        dead_by_topic=dead_by_topic,
        workers=_workers(using, now, stale_after),
        blocked_keys=blocked_keys(using),
        held_by_schedule=tally(messages.filter(status=Message.Status.PENDING, available_at__gt=now)),
        held_by_key=head.held,
    )


#: The blocked keys a gauge counts at most (the health view and ``outbox_blocked_keys``).
MAX_BLOCKED_KEYS_COUNTED = 1_000


@dataclass(frozen=True, kw_only=True, slots=True)
class Gauges:
    """The figures a probe or a scraper asks for every few seconds: the part of ``collect`` that is cheap.

    The same functions as the overview page's, so the metrics, the health view and ``outbox_status``
    cannot disagree; without the per-minute history and the dead topics.
    """

    generated_at: dt.datetime
    counts: dict[str, Tally]
    lag_seconds: float
    lag_exact: bool
    blocked_keys: int  # at most MAX_BLOCKED_KEYS_COUNTED
    workers_alive: int


#: The longest the gauges wait for a lock, or (PostgreSQL) run a statement: a probe or a scrape must
#: answer while a migration holds the table locked, not queue behind it for as long as it runs. A
#: shorter timeout already set on the session (a DBA's) is kept.
GAUGES_TIMEOUT_SECONDS = 2


@contextlib.contextmanager
def bounded_waits(using: str) -> Iterator[None]:
    """Reads that give up after ``GAUGES_TIMEOUT_SECONDS`` rather than wait for a lock (``DatabaseError``).

    PostgreSQL: ``lock_timeout`` and ``statement_timeout``, and no bitmap scans, for this transaction only
    (a savepoint's inside the caller's, undone with it on error, put back on success). MariaDB/MySQL: the
    session's
    ``lock_wait_timeout`` (a year by default), put back afterwards. SQLite's readers do not wait on a
    writer in WAL mode, and its own ``timeout`` bounds the rest.
    """
    conn = connections[using]
    limit = GAUGES_TIMEOUT_SECONDS
    if conn.vendor == "postgresql":
        with transaction.atomic(using=using), conn.cursor() as cursor:
            # Both settings are in milliseconds; 0 means none, so it is replaced too.
            cursor.execute(
                "SELECT name, setting, set_config(name, CASE WHEN setting::bigint = 0 OR setting::bigint > %s"
                " THEN %s ELSE setting END, true) FROM pg_settings"
                " WHERE name IN ('lock_timeout', 'statement_timeout')",
                [limit * 1000, str(limit * 1000)],
            )
            saved = [(name, setting) for name, setting, _ in cursor.fetchall()]
            # Every count of the probes stops at EXACT_COUNT_CAP + 1 rows; a bitmap scan cannot stop and
            # reads every entry of its index first (a whole status of the table), and PostgreSQL plans one
            # for a table without statistics (new, restored, after pg_upgrade).
            cursor.execute("SELECT current_setting('enable_bitmapscan'), set_config('enable_bitmapscan', 'off', true)")
            saved.append(("enable_bitmapscan", cursor.fetchone()[0]))
            yield
            for name, setting in saved:
                cursor.execute("SELECT set_config(%s, %s, true)", [name, setting])
        return
    if conn.vendor != "mysql":
        yield
        return
    with conn.cursor() as cursor:
        cursor.execute("SELECT @@SESSION.lock_wait_timeout")
        (saved_wait,) = cursor.fetchone()
        cursor.execute("SET SESSION lock_wait_timeout = %s", [min(int(saved_wait), limit)])
        try:
            yield
        finally:
            cursor.execute("SET SESSION lock_wait_timeout = %s", [int(saved_wait)])


def gauges(using: str = "default", *, stale_after: float = STALE_AFTER_SECONDS) -> Gauges:
    """The probes' figures, within ``bounded_waits``: ``DatabaseError`` rather than a wait behind a lock."""
    with bounded_waits(using):
        return _gauges(using, stale_after)


def _gauges(using: str, stale_after: float) -> Gauges:
    now = store.database_now(using)
    messages = Message.objects.using(using)
    due = messages.filter(status=Message.Status.PENDING, available_at__lte=now)
    head = _due_head(due)
    lag = 0.0 if head.oldest is None else max(0.0, (now - head.oldest).total_seconds())
    return Gauges(
        generated_at=now,
        counts={status: tally(messages.filter(status=status)) for status in Message.Status.values},
        lag_seconds=lag,
        lag_exact=head.oldest_exact,
        blocked_keys=len(blocked_keys(using, limit=MAX_BLOCKED_KEYS_COUNTED)),
        workers_alive=sum(w.alive for w in _workers(using, now, stale_after)),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class DueHead:
    """What one bounded walk of the due messages, oldest first, tells: the lag's start and what is held."""

    oldest: dt.datetime | None  # the oldest due message a claim would take, or the walk's bound
    oldest_exact: bool
    held: Tally  # due messages held behind an earlier message of their key


def _due_head(due: QuerySet[Message], *, cap: int | None = None) -> DueHead:
    """The lag's start and the held-by-key count, from the ``cap + 1`` (``DUE_WINDOW``) oldest due messages.

    The statement walks the due index oldest first and stops after ``cap + 1`` messages whatever is behind
    them. Unbounded, the lag alone (the first message not held) walked every held message first: with
    200,000 messages behind one dead key, 2.3 s on a million-row table, past a DBA's 200 ms
    ``statement_timeout``; and the held count was planned as a sequential scan of the whole table (160 to
    500 ms). Past the window the held count is a lower bound (shown as an estimate), and when every message
    of the window is held the lag is that of the window's newest one, an upper bound, flagged
    ``lag_exact = False``.
    """
    cap = DUE_WINDOW if cap is None else cap
    window = due.order_by("available_at")[: cap + 1]
    if connections[due.db].vendor == "postgresql":
        scanned, held_n, oldest, newest = _window_against_key_heads(window)
    else:
        row = window.annotate(is_held=_behind_their_key(Message.objects.using(due.db))).aggregate(
            scanned=Count("pk"),
            held=Count("pk", filter=Q(is_held=True)),
            oldest=Min("available_at", filter=Q(is_held=False)),
            newest=Max("available_at"),
        )
        scanned, held_n, oldest, newest = row["scanned"], row["held"], row["oldest"], row["newest"]
    complete = scanned <= cap
    held = Tally(held_n, exact=complete)
    if oldest is not None or complete:
        return DueHead(oldest=oldest, oldest_exact=True, held=held)
    return DueHead(oldest=newest, oldest_exact=False, held=held)


def _window_against_key_heads(window: QuerySet[Message]) -> tuple[int, int, dt.datetime | None, dt.datetime | None]:
    """The window's figures on PostgreSQL, each distinct key of the window probed once, not each message.

    A message is held when its key's head (the first open row of the key, read off the index of open keyed
    rows as the claim reads it, ``store.claiming``) is another message. Probed per message, a window of
    2,001 messages on five keys made 2,001 probes, and while any session of the database holds a snapshot
    older than the last drain (a long report, an ``ANALYZE``), each probe steps over every delivered row's
    entry of its key still in that index: 221,937 pages for 500 messages on five keys, against 4,500 when
    each of the five keys is probed once.
    """
    from ..store import blocking_statuses

    conn = connections[window.db]
    qn = conn.ops.quote_name
    sql, params = window.values("id", "key", "available_at").query.sql_with_params()
    statuses = blocking_statuses()
    text = f"""
        WITH w AS MATERIALIZED ({sql}),
        h AS (
            SELECT k.key, (
                SELECT b.id FROM {qn(Message._meta.db_table)} b
                WHERE b.{qn("key")} >= k.key AND b.status IN ({", ".join(["%s"] * len(statuses))})
                ORDER BY b.{qn("key")}, b.id LIMIT 1
            ) AS head
            FROM (SELECT DISTINCT w.{qn("key")} AS key FROM w WHERE w.{qn("key")} IS NOT NULL) AS k
        )
        SELECT count(*),
               count(*) FILTER (WHERE h.head <> w.id),
               min(w.available_at) FILTER (WHERE h.head IS NULL OR h.head = w.id),
               max(w.available_at)
        FROM w LEFT JOIN h ON h.key = w.{qn("key")}
    """
    with conn.cursor() as cursor:
        cursor.execute(text, [*params, *statuses])
        scanned, held, oldest, newest = cursor.fetchone()
    return scanned, held, oldest, newest


def _held_by_key(due: QuerySet[Message], *, cap: int | None = None) -> Tally:
    """Due keyed messages held behind their key, among the ``cap + 1`` oldest due ones (see ``_due_head``)."""
    return _due_head(due, cap=cap).held


def _behind_their_key(messages: QuerySet[Message]) -> Exists:
    """A keyed message with an earlier open message of its key: the claim's own rule (other databases)."""
    from ..store import blocking_statuses

    open_rows = messages.filter(status__in=blocking_statuses())
    return Exists(open_rows.filter(key=OuterRef("key"), id__lt=OuterRef("id")).values("id"))


def blocked_keys(using: str = "default", *, limit: int = MAX_BLOCKED_KEYS_SHOWN) -> list[BlockedKey]:
    """Keys whose delivery stopped at a dead message, oldest first; none under ORDERING "skip_dead"."""
    from ..conf import get_settings

    if get_settings().ORDERING != "block":
        return []
    messages = Message.objects.using(using)
    heads = list(
        messages.filter(status=Message.Status.DEAD, key__isnull=False)
        .values("key")
        .annotate(head=Min("id"), dead=Count("id"))
        .order_by("head")[:limit]
    )
    # Bounded like the rest: a key can hold hundreds of thousands of messages behind its dead head. Pending
    # or processing, not pending alone: a plan may then not filter every pending row's heap page for the
    # listed keys through the due index (10,000 page reads for a backlog spread over a million rows, past
    # a DBA's 200 ms under load); it reads the listed keys' open rows on the open keys' index.
    listed = [h["key"] for h in heads]
    open_rows = list(
        messages.filter(status__in=[Message.Status.PENDING, Message.Status.PROCESSING], key__in=listed)
        .order_by()
        .values_list("key", "status")[: EXACT_COUNT_CAP + 1]
    )
    exact = len(open_rows) <= EXACT_COUNT_CAP
    waiting = collections.Counter(key for key, status in open_rows if status == Message.Status.PENDING)
    return [
        BlockedKey(
            key=str(h["key"]),
            dead_message_id=h["head"],
            dead=h["dead"],
            waiting=waiting.get(h["key"], 0),
            waiting_exact=exact,
        )
        for h in heads
    ]


def _minutes(using: str, now: dt.datetime) -> list[Minute]:
    """Delivered and failed (or abandoned) attempts per minute over the last hour, empty minutes included."""
    end = now.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    start = end - dt.timedelta(minutes=WINDOW_MINUTES)
    rows = (
        Attempt.objects.using(using)
        .filter(finished_at__gte=start, finished_at__lt=end)
        .annotate(minute=TruncMinute("finished_at"))
        .values("minute")
        .annotate(
            delivered=Count("id", filter=Q(outcome=Attempt.Outcome.DELIVERED)),
            failed=Count("id", filter=~Q(outcome=Attempt.Outcome.DELIVERED)),
        )
        .order_by("minute")
    )
    by_minute = {row["minute"]: (row["delivered"], row["failed"]) for row in rows}
    minutes = []
    for i in range(WINDOW_MINUTES):
        minute = start + dt.timedelta(minutes=i)
        delivered, failed = by_minute.get(minute, (0, 0))
        minutes.append(Minute(start=minute, delivered=delivered, failed=failed))
    return minutes


def _workers(using: str, now: dt.datetime, stale_after: float) -> list[WorkerState]:
    stale_before = now - dt.timedelta(seconds=stale_after)
    rows = Worker.objects.using(using).filter(last_seen__gte=now - GONE_WORKERS_SHOWN_FOR)[:MAX_WORKERS_SHOWN]
    states = []
    for w in rows:
        state = "stopped" if w.stopped_at else ("gone" if w.last_seen < stale_before else "alive")
        states.append(
            WorkerState(
                worker_id=w.worker_id,
                hostname=w.hostname,
                pid=w.pid,
                started_at=w.started_at,
                last_seen=w.last_seen,
                in_flight=w.in_flight if state == "alive" else 0,
                delivered=w.delivered,
                failed=w.failed,
                state=state,
                housekeeping_failures=w.housekeeping_failures,
                housekeeping_error=w.housekeeping_error,
            )
        )
    states.sort(key=lambda w: (not w.alive, w.hostname, w.worker_id))
    return states
