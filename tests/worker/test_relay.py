from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import zoneinfo

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone
from psycopg import pq

from django_outbox import PermanentDeliveryError, outbox, signals, store
from django_outbox.models import Attempt, Message
from django_outbox.testing import relay_all
from django_outbox.worker import Relay, RelayConfig, backoff_seconds
from tests.support.database import neighbour_transaction
from tests.support.factories import MessageFactory
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def run_until_empty(**overrides) -> Relay:
    relay = Relay(RelayConfig.from_settings(until_empty=True, poll_interval=0.05, **overrides))
    relay.run()
    return relay


def test_worker_delivers_and_records_the_attempt(handler):
    seen = []
    handler("t.ok", lambda m: seen.append((m.topic, m.payload, m.uuid, m.attempts)))
    message = outbox.send("t.ok", {"n": 1}, idempotency_key="idem-1")
    relay = run_until_empty()
    message.refresh_from_db()
    assert seen == [("t.ok", {"n": 1}, message.uuid, 1)]
    assert message.status == Message.Status.DELIVERED
    assert message.delivered_at is not None
    assert message.locked_by is None and message.locked_until is None
    (attempt,) = message.attempt_log.all()
    assert attempt.number == 1
    assert attempt.outcome == Attempt.Outcome.DELIVERED
    assert attempt.worker == relay.config.worker_id
    assert attempt.finished_at >= attempt.started_at
    assert relay.stats.delivered == 1


def test_failure_is_retried_with_backoff_then_delivered(handler):
    calls = []

    def flaky(message):
        calls.append(message.attempts)
        if message.attempts < 3:
            raise ConnectionError(f"destination down (attempt {message.attempts})")

    handler("t.flaky", flaky)
    message = outbox.send("t.flaky", {})
    run_until_empty()
    # --until-empty does not wait for retries scheduled later; keep relaying until done
    wait_for(lambda: run_until_empty() and Message.objects.get(pk=message.pk).status == "delivered", timeout=20)
    message.refresh_from_db()
    assert calls == [1, 2, 3]
    outcomes = list(message.attempt_log.values_list("number", "outcome"))
    assert outcomes == [(1, "failed"), (2, "failed"), (3, "delivered")]
    failed = message.attempt_log.filter(outcome="failed").first()
    assert "ConnectionError: destination down (attempt 1)" in failed.error
    assert "Traceback" in failed.error


def test_failed_attempt_schedules_retry_in_the_future(handler, settings):
    # A retry a minute away: with the suite's 0.05 s backoff, a loaded machine's next claim came after the
    # retry was due, and the test saw a second attempt (it failed so in CI).
    settings.OUTBOX = {**settings.OUTBOX, "BACKOFF_BASE_SECONDS": 60, "BACKOFF_MAX_SECONDS": 120}
    handler("t.fail", lambda m: 1 / 0)
    with connection.cursor():
        pass
    message = outbox.send("t.fail", {})
    before = timezone.now()
    run_until_empty()
    message.refresh_from_db()
    assert message.status == Message.Status.PENDING
    assert message.attempts == 1
    assert message.available_at > before
    assert "ZeroDivisionError" in message.last_error


def test_dead_after_max_attempts_with_last_error(handler):
    handler("t.fail", lambda m: 1 / 0)
    message = outbox.send("t.fail", {}, max_attempts=2)
    wait_for(lambda: run_until_empty() and Message.objects.get(pk=message.pk).status == "dead", timeout=20)
    message.refresh_from_db()
    assert message.attempts == 2
    assert "ZeroDivisionError" in message.last_error
    assert list(message.attempt_log.values_list("outcome", flat=True)) == ["failed", "failed"]


def test_permanent_error_is_dead_at_once(handler):
    def reject(message):
        raise PermanentDeliveryError("422: invalid address")

    handler("t.reject", reject)
    dead = []
    signals.message_dead.connect(lambda sender, message, **kw: dead.append(message.pk), weak=False, dispatch_uid="t")
    try:
        message = outbox.send("t.reject", {})
        run_until_empty()
    finally:
        signals.message_dead.disconnect(dispatch_uid="t")
    message.refresh_from_db()
    assert message.status == Message.Status.DEAD
    assert message.attempts == 1
    assert "422: invalid address" in message.last_error
    assert dead == [message.pk]


def test_backoff_is_exponential_capped_and_jittered():
    delays = [backoff_seconds(n, base=1, cap=30) for n in range(1, 10)]
    for n, d in enumerate(delays, start=1):
        ceiling = min(30, 2 ** (n - 1))
        assert ceiling / 2 <= d <= ceiling
    assert len({round(backoff_seconds(5, base=1, cap=30), 6) for _ in range(20)}) > 1
    assert backoff_seconds(1, base=1, cap=30, retry_after=120) == 120


def test_claim_leases_and_counts_the_attempt():
    MessageFactory.create_batch(3)
    claimed = store.claim("default", worker="w1", limit=2, lease_seconds=30)
    assert [m.attempts for m in claimed] == [1, 1]
    rows = Message.objects.filter(pk__in=[m.pk for m in claimed])
    for row in rows:
        assert row.status == Message.Status.PROCESSING
        assert row.locked_by == "w1"
        assert row.locked_until > timezone.now() + dt.timedelta(seconds=25)
    # a second claimer gets only what is left
    assert [m.pk for m in store.claim("default", worker="w2", limit=10, lease_seconds=30)] == [
        Message.objects.order_by("id").last().pk
    ]


def test_claim_skips_messages_not_yet_due():
    MessageFactory(available_at=timezone.now() + dt.timedelta(hours=1))
    assert store.claim("default", worker="w1", limit=10, lease_seconds=30) == []


def test_record_is_fenced_by_the_lease():
    message = MessageFactory()
    (claimed,) = store.claim("default", worker="w1", limit=1, lease_seconds=30)
    now = timezone.now()
    outcome = store.Outcome(message_id=claimed.pk, number=1, status="delivered", started_at=now, finished_at=now)
    lost = store.record("default", worker="someone-else", outcomes=[outcome])
    assert lost == {message.pk}
    message.refresh_from_db()
    assert message.status == Message.Status.PROCESSING  # untouched
    assert "lease lost" in message.attempt_log.get().error
    assert store.record("default", worker="w1", outcomes=[outcome]) == set()
    message.refresh_from_db()
    assert message.status == Message.Status.DELIVERED


def test_record_keeps_every_time_to_the_microsecond_and_any_error_text():
    delivered, retried = MessageFactory(), MessageFactory()
    store.claim("default", worker="w1", limit=2, lease_seconds=30)
    paris = zoneinfo.ZoneInfo("Europe/Paris")
    started = dt.datetime(2026, 3, 29, 1, 59, 59, 999999, tzinfo=paris)  # the hour a DST change skips
    finished = dt.datetime(2026, 3, 29, 3, 0, 0, 1, tzinfo=paris)
    retry_delay = 86400 * 365 * 50 + 0.5  # seconds; the record adds them to the database's clock
    error = 'Traceback:\n  "quoted" \\ back\\slash, tab\t, emoji \U0001f600, accents éà'
    outcomes = [
        store.Outcome(message_id=delivered.pk, number=1, status="delivered", started_at=started, finished_at=finished),
        store.Outcome(
            message_id=retried.pk,
            number=1,
            status="pending",
            started_at=started,
            finished_at=finished,
            error=error,
            retry_delay=retry_delay,
        ),
    ]
    before = store.database_now("default")
    assert store.record("default", worker="w1", outcomes=outcomes) == set()
    after = store.database_now("default")

    def read_back(value: dt.datetime) -> dt.datetime:  # how Django returns it: naive in TIME_ZONE without USE_TZ
        return value if settings.USE_TZ else timezone.make_naive(value)

    for message in (delivered, retried):
        attempt = Attempt.objects.get(message=message)
        assert (attempt.started_at, attempt.finished_at) == (read_back(started), read_back(finished))
    retried.refresh_from_db()
    due_in = (retried.available_at - before).total_seconds()
    assert retry_delay <= due_in <= retry_delay + (after - before).total_seconds()
    assert retried.last_error == error
    assert Attempt.objects.get(message=retried).error == error


def test_reaper_requeues_expired_leases_as_abandoned_attempts():
    alive, dead_worker, exhausted = MessageFactory(), MessageFactory(), MessageFactory(max_attempts=1)
    store.claim("default", worker="crashed", limit=3, lease_seconds=30)
    past = timezone.now() - dt.timedelta(seconds=1)
    Message.objects.filter(pk__in=[dead_worker.pk, exhausted.pk]).update(locked_until=past)
    reaped = {r.message_id: r for r in store.reap("default")}
    assert set(reaped) == {dead_worker.pk, exhausted.pk}
    assert reaped[dead_worker.pk].previous_worker == "crashed"
    dead_worker.refresh_from_db()
    exhausted.refresh_from_db()
    alive.refresh_from_db()
    assert dead_worker.status == Message.Status.PENDING and dead_worker.locked_by is None
    assert exhausted.status == Message.Status.DEAD
    assert alive.status == Message.Status.PROCESSING
    attempt = dead_worker.attempt_log.get()
    assert attempt.outcome == Attempt.Outcome.ABANDONED
    assert attempt.number == 1
    assert attempt.worker == "crashed"
    assert "lease" in attempt.error
    # the next claim counts a second attempt
    (again,) = [m for m in store.claim("default", worker="w2", limit=5, lease_seconds=30) if m.pk == dead_worker.pk]
    assert again.attempts == 2


def test_release_returns_unstarted_messages_without_counting_an_attempt():
    message = MessageFactory()
    store.claim("default", worker="w1", limit=1, lease_seconds=30)
    assert store.release("default", worker="w1", message_ids=[message.pk]) == 1
    message.refresh_from_db()
    assert message.status == Message.Status.PENDING
    assert message.attempts == 0
    assert not message.attempt_log.exists()


def test_topics_option_limits_what_a_worker_claims(handler):
    handler("a.*", lambda m: None)
    handler("b.*", lambda m: None)
    a = outbox.send("a.one", {})
    b = outbox.send("b.one", {})
    run_until_empty(topics=("a.*",))
    assert Message.objects.get(pk=a.pk).status == "delivered"
    assert Message.objects.get(pk=b.pk).status == "pending"


def test_until_empty_ignores_messages_scheduled_later(handler):
    handler("t.later", lambda m: None)
    outbox.send("t.later", {}, delay=3600)
    started = time.monotonic()
    run_until_empty()
    assert time.monotonic() - started < 10
    assert Message.objects.get().status == "pending"


def test_slow_delivery_keeps_its_lease_alive(handler):
    handler("t.slow", lambda m: time.sleep(3))
    message = outbox.send("t.slow", {})
    relay = Relay(RelayConfig.from_settings(until_empty=True, poll_interval=0.05, lease_seconds=1))
    thread = threading.Thread(target=relay.run)
    thread.start()
    try:
        wait_for(lambda: Message.objects.filter(pk=message.pk, locked_by=relay.config.worker_id).exists())
        # meanwhile a second worker reaps and claims: it must find nothing to take over
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            assert store.reap("default") == []
            assert store.claim("default", worker="thief", limit=10, lease_seconds=1) == []
            time.sleep(0.2)
    finally:
        thread.join(timeout=30)
    message.refresh_from_db()
    assert message.status == Message.Status.DELIVERED
    assert list(message.attempt_log.values_list("outcome", flat=True)) == ["delivered"]


def test_relay_all_helper_delivers_inside_a_test_transaction(handler):
    seen = []
    handler("t.helper", lambda m: seen.append(m.payload))
    outbox.send("t.helper", {"a": 1})
    outbox.send("t.helper", {"a": 2})
    stats = relay_all()
    assert stats.delivered == 2
    assert seen == [{"a": 1}, {"a": 2}]


def test_a_crashing_delivery_thread_stops_the_worker_with_an_error(monkeypatch):
    from django.core.management import CommandError, call_command

    def broken_claim(*args, **kwargs):
        raise RuntimeError("a bug in the claim")

    monkeypatch.setattr(store, "claim", broken_claim)
    with pytest.raises(CommandError, match="unexpected error"):
        call_command("outbox_worker", "--until-empty", verbosity=0)


def test_worker_command_restores_signal_handlers(handler):
    import signal

    from django.core.management import call_command

    before = signal.getsignal(signal.SIGTERM)
    call_command("outbox_worker", "--until-empty", verbosity=0)
    assert signal.getsignal(signal.SIGTERM) is before


def test_until_empty_delivers_keyed_messages_while_another_database_holds_a_transaction_open(postgres, handler):
    """An unrelated open transaction, even one of another database on the server, once held keyed
    messages back (the commit-order fence) and kept --until-empty waiting for it; it holds nothing now."""
    handler("t.keyed", lambda m: None)
    with neighbour_transaction() as neighbour:
        message = outbox.send("t.keyed", {}, key="order-1")
        relay = Relay(RelayConfig.from_settings(until_empty=True, poll_interval=0.05))
        thread = threading.Thread(target=relay.run)
        thread.start()
        thread.join(timeout=30)
        assert not thread.is_alive(), "--until-empty waited for another database's transaction"
        assert Message.objects.get(pk=message.pk).status == "delivered"
        assert neighbour.info.transaction_status == pq.TransactionStatus.INTRANS, "still open"


def test_an_error_text_the_database_cannot_store_is_recorded_readably(handler):
    """A NUL or a lone surrogate in an exception must not make the record fail (and the message stick)."""

    def odd(message):
        raise ValueError("bad \x00 byte and \udcff half a pair")

    handler("t.odd", odd)
    message = outbox.send("t.odd", {}, max_attempts=1)
    run_until_empty()
    message.refresh_from_db()
    assert message.status == Message.Status.DEAD
    assert "bad \\x00 byte and \\udcff half a pair" in message.last_error
    assert "bad \\x00 byte" in message.attempt_log.get().error


def test_delivered_signal_and_debug_log_name_every_delivered_message(handler, caplog):
    handler("t.sig", lambda m: None)
    sent = [outbox.send("t.sig", {"n": n}) for n in range(3)]
    seen = []

    def on_delivered(sender, message, attempt, **kwargs):
        seen.append((message.pk, attempt))

    signals.message_delivered.connect(on_delivered, weak=False, dispatch_uid="t-delivered")
    try:
        with caplog.at_level(logging.DEBUG, logger="django_outbox.relay"):
            run_until_empty()
    finally:
        signals.message_delivered.disconnect(dispatch_uid="t-delivered")
    assert sorted(seen) == [(m.pk, 1) for m in sent]
    for m in sent:
        assert f"delivered t.sig #{m.pk} (attempt 1)" in caplog.text


def test_record_stores_any_error_text_it_is_given():
    """Whatever produced it, an error text reaches the audit log: NUL and lone surrogates as escapes."""
    message = MessageFactory()
    (claimed,) = store.claim("default", worker="w1", limit=1, lease_seconds=30)
    now = timezone.now()
    outcome = store.Outcome(
        message_id=claimed.pk,
        number=1,
        status="pending",
        started_at=now,
        finished_at=now,
        error='nul \x00, half \udcff, accents éà, quote "',
        retry_delay=0.0,
    )
    assert store.record("default", worker="w1", outcomes=[outcome]) == set()
    expected = 'nul \\x00, half \\udcff, accents éà, quote "'
    assert message.attempt_log.get().error == expected
    message.refresh_from_db()
    assert message.last_error == expected


@pytest.mark.parametrize(
    ("delay", "due_in"),
    [
        (float("nan"), 0.0),
        (-5.0, 0.0),
        (float("-inf"), 0.0),
        (float("inf"), store.MAX_RETRY_DELAY_SECONDS),
        (1e308, store.MAX_RETRY_DELAY_SECONDS),
        (float(2**63), store.MAX_RETRY_DELAY_SECONDS),
    ],
)
def test_record_stores_any_retry_delay_as_a_bounded_time(delay, due_in):
    """Whatever a retry policy computed, the record writes a time the database and Python both hold: NaN
    and negatives are "now", anything past about a century is capped there; the record never fails."""
    message = MessageFactory()
    (claimed,) = store.claim("default", worker="w1", limit=1, lease_seconds=30)
    now = timezone.now()
    outcome = store.Outcome(
        message_id=claimed.pk, number=1, status="pending", started_at=now, finished_at=now, retry_delay=delay
    )
    before = store.database_now("default")
    assert store.record("default", worker="w1", outcomes=[outcome]) == set()
    after = store.database_now("default")
    message.refresh_from_db()
    assert message.status == Message.Status.PENDING
    assert before + dt.timedelta(seconds=due_in) <= message.available_at <= after + dt.timedelta(seconds=due_in)
    assert outcome.retry_at is not None  # the signal's estimate is bounded too
