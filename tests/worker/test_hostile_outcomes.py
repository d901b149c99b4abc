"""No single message can stop a worker.

Whatever a destination answers, whatever a handler raises and whatever the stored row holds, the
outcome is recorded as a failed attempt with its reason, the retry time stays bounded, and the
delivery thread goes on with the rest of its batch. Each trigger found in the issue has its test here,
against a real HTTP server on loopback and the real database.
"""

from __future__ import annotations

import datetime as dt
import math
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

import pytest
from django.db import DataError
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from django_outbox import TransientDeliveryError, conf, outbox, store
from django_outbox.models import Attempt, Message
from django_outbox.transports.base import BatchTransport
from django_outbox.worker import MAX_DELAY_SECONDS, Relay, RelayConfig, backoff_seconds
from tests.probe.models import Delivery
from tests.support.servers import HTTPServer, Reply
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "whsec_8X64pTf2VJY6eApZYqEgNu+kEOBTpP9F"
HOSTILE_RETRY_AFTER = ["99999999999999", "300000000000", "9" * 400]


@pytest.fixture(autouse=True)
def slow_retries(settings: Any) -> None:
    """Retries 15 to 30 s later: a worker run until empty never sees the retry of what failed in it."""
    settings.OUTBOX = {**settings.OUTBOX, "BACKOFF_BASE_SECONDS": 30, "BACKOFF_MAX_SECONDS": 30}


def outbox_with_hooks(settings: Any, server: HTTPServer, **extra: object) -> None:
    """orders.* to a webhook on the loopback server; probe.* stays with the probe app's handler."""
    settings.OUTBOX = {
        **settings.OUTBOX,
        "TRANSPORTS": {
            "hooks": {
                "BACKEND": "django_outbox.transports.webhook.WebhookTransport",
                "OPTIONS": {"URL": server.url(), "SECRET": SECRET, "TIMEOUT": 5, "ALLOWED_HOSTS": ["127.0.0.1"]},
            }
        },
        "ROUTES": {"orders.*": "hooks"},
        **extra,
    }


def run_one_batch(**overrides: Any) -> Relay:
    """A real worker (delivery and keeper threads) with one delivery thread, until nothing is due now."""
    config: dict[str, Any] = {"until_empty": True, "poll_interval": 0.05, "notify": False, "concurrency": 1}
    relay = Relay(RelayConfig.from_settings(**{**config, **overrides}))
    relay.run()
    return relay


def batch_around(first: Message, others: int = 4) -> list[Message]:
    """Handler messages claimed in the same batch as ``first`` (higher ids: delivered after it)."""
    return [outbox.send("probe.created", {"n": n}) for n in range(others)]


def assert_rest_of_batch_delivered(relay: Relay, others: Sequence[Message]) -> None:
    assert not relay.crashed, "one message must not stop the worker"
    for message in others:
        message.refresh_from_db()
        assert message.status == Message.Status.DELIVERED, message.last_error
        assert list(message.attempt_log.values_list("outcome", flat=True)) == ["delivered"]
    assert Delivery.objects.filter(message_id__in=[m.pk for m in others]).count() == len(others)
    assert not Message.objects.filter(status=Message.Status.PROCESSING).exists()


#: Seconds between an attempt's end and its record, under load (the retry time counts from the record).
RECORD_SLACK = 5


def assert_failed_once(message: Message, *, error: str, retry_within: float) -> Attempt:
    """One failed attempt with its reason, and the retry no later than ``retry_within`` seconds after it."""
    message.refresh_from_db()
    assert message.status == Message.Status.PENDING
    assert message.locked_by is None
    assert error in message.last_error
    attempt = message.attempt_log.get(number=message.attempts)
    assert attempt.outcome == Attempt.Outcome.FAILED
    assert error in attempt.error
    finished = attempt.finished_at
    assert finished is not None
    # The record adds the delay to the database's clock when it runs, a moment after the attempt ended.
    assert finished <= message.available_at <= finished + dt.timedelta(seconds=retry_within + RECORD_SLACK)
    return attempt


# --- a receiver's Retry-After ----------------------------------------------------------------------


@pytest.mark.parametrize("retry_after", HOSTILE_RETRY_AFTER, ids=["14-digits", "3e11", "400-nines"])
def test_a_receivers_huge_retry_after_is_capped_and_the_batch_goes_on(settings, server, retry_after):
    outbox_with_hooks(settings, server)
    server.default = Reply(status=503, body=b"come back much later", headers={"Retry-After": retry_after})
    hostile = outbox.send("orders.created", {"id": 1})
    others = batch_around(hostile)
    relay = run_one_batch()
    assert len(server.requests) == 1
    # RETRY_AFTER_MAX_SECONDS defaults to BACKOFF_MAX_SECONDS (30 here)
    assert_failed_once(hostile, error="HTTP 503", retry_within=30)
    assert_rest_of_batch_delivered(relay, others)


@pytest.mark.parametrize("retry_after", ["120", *HOSTILE_RETRY_AFTER])
def test_retry_after_is_honoured_up_to_retry_after_max_seconds(settings, server, retry_after):
    outbox_with_hooks(settings, server, RETRY_AFTER_MAX_SECONDS=600)
    server.default = Reply(status=429, headers={"Retry-After": retry_after})
    hostile = outbox.send("orders.created", {"id": 1})
    before = timezone.now()
    relay = run_one_batch()
    assert not relay.crashed
    attempt = assert_failed_once(hostile, error="HTTP 429", retry_within=600)
    asked = min(float(retry_after), 600)
    assert hostile.available_at >= before + dt.timedelta(seconds=asked - 1)
    assert hostile.available_at >= attempt.finished_at + dt.timedelta(seconds=asked - 1)


# --- attempt numbers and settings the backoff formula must survive ----------------------------------


@pytest.mark.parametrize("attempts_before", [1024, 5000, 2**31 - 10])
def test_a_late_attempt_of_a_message_with_huge_max_attempts_gets_a_bounded_retry(attempts_before):
    hostile = outbox.send("probe.created", {"always_fail": True}, max_attempts=2**31 - 1)
    Message.objects.filter(pk=hostile.pk).update(attempts=attempts_before)  # its 1,025th (or later) attempt
    others = batch_around(hostile)
    relay = run_one_batch()
    attempt = assert_failed_once(hostile, error="probe: failure requested", retry_within=30)
    assert attempt.number == attempts_before + 1
    assert_rest_of_batch_delivered(relay, others)


def test_backoff_max_seconds_nan_does_not_stop_the_worker(settings):
    settings.OUTBOX = {**settings.OUTBOX, "BACKOFF_MAX_SECONDS": float("nan")}
    if conf.problems():
        pytest.skip("the settings check refuses BACKOFF_MAX_SECONDS = nan, so no worker starts with it")
    hostile = outbox.send("probe.created", {"always_fail": True})
    others = batch_around(hostile)
    relay = run_one_batch()
    # A NaN cap means nothing: the delay falls back to the default cap (OutboxSettings.BACKOFF_MAX_SECONDS)
    default_cap = conf.OutboxSettings().BACKOFF_MAX_SECONDS
    assert_failed_once(hostile, error="probe: failure requested", retry_within=default_cap)
    assert_rest_of_batch_delivered(relay, others)


FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**80), max_value=2**1100),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e308, 5e-324, sys.float_info.max]),
)


@given(
    attempt=st.integers(min_value=-(2**63), max_value=2**63),
    base=FLOATS,
    cap=FLOATS,
    retry_after=st.one_of(st.none(), FLOATS),
    retry_after_cap=st.one_of(st.none(), FLOATS),
)
def test_backoff_is_finite_and_bounded_for_any_input(attempt, base, cap, retry_after, retry_after_cap):
    delay = backoff_seconds(attempt, base=base, cap=cap, retry_after=retry_after, retry_after_cap=retry_after_cap)
    assert type(delay) is float
    assert math.isfinite(delay)
    assert 0 <= delay <= MAX_DELAY_SECONDS
    dt.datetime.now(dt.UTC) + dt.timedelta(seconds=delay)  # a retry time datetime can hold


def test_backoff_honours_retry_after_up_to_its_cap_and_ignores_nonsense():
    assert backoff_seconds(1, base=1, cap=30, retry_after=120, retry_after_cap=60) == 60
    assert backoff_seconds(1, base=1, cap=30, retry_after=float("inf"), retry_after_cap=600) == 600
    for nonsense in (float("nan"), -5, -float("inf")):
        assert 0.5 <= backoff_seconds(1, base=1, cap=30, retry_after=nonsense, retry_after_cap=600) <= 1
    # the exponent is capped before it is computed: the delay is the cap, whatever the attempt number
    assert 15 <= backoff_seconds(10**9, base=1, cap=30) <= 30


# --- hostile handlers and transports -----------------------------------------------------------------


class Unprintable(Exception):
    """An exception whose description itself raises, as a careless (or hostile) library's might."""

    def __str__(self) -> str:
        raise RuntimeError("no description for you")

    def __getattribute__(self, name: str) -> Any:
        if name == "__notes__":  # traceback.format_exception reads this, and lets its error through
            raise RuntimeError("no notes either")
        return super().__getattribute__(name)


class LyingRetryAfter(TransientDeliveryError):
    """A delivery error whose ``retry_after`` raises when the relay reads it."""

    def __getattribute__(self, name: str) -> Any:
        if name == "retry_after":
            raise ValueError("retry_after cannot be read")
        return super().__getattribute__(name)


def raise_unprintable(message: Message) -> None:
    raise Unprintable()


def raise_lying_retry_after(message: Message) -> None:
    raise LyingRetryAfter("busy", retry_after=5)


def raise_text_retry_after(message: Message) -> None:
    raise TransientDeliveryError("busy", retry_after="tomorrow")  # type: ignore[arg-type]


def raise_system_exit(message: Message) -> None:
    sys.exit("a handler called sys.exit()")


@pytest.mark.parametrize(
    ("func", "error"),
    [
        (raise_unprintable, "Unprintable"),
        (raise_lying_retry_after, "LyingRetryAfter"),
        (raise_text_retry_after, "busy"),
        (raise_system_exit, "sys.exit()"),
    ],
)
def test_a_hostile_handler_exception_is_a_failed_attempt_and_the_batch_goes_on(handler, func, error):
    handler("hostile.raise", func)
    hostile = outbox.send("hostile.raise", {})
    others = batch_around(hostile)
    relay = run_one_batch()
    assert_failed_once(hostile, error=error, retry_within=30)
    assert_rest_of_batch_delivered(relay, others)


class MiscountingTransport(BatchTransport):
    """A batch transport that breaks its contract: one result too few, and one that is not an exception."""

    def deliver_batch(self, messages: Sequence[Message]) -> list[BaseException | None]:
        results: list[Any] = ["sure"] * len(messages)
        return results if len(messages) == 1 else results[:-1]


@pytest.mark.parametrize("count", [1, 3])
def test_a_batch_transport_that_breaks_its_contract_fails_its_own_messages_only(settings, count):
    settings.OUTBOX = {
        **settings.OUTBOX,
        "TRANSPORTS": {"liar": {"BACKEND": f"{__name__}.MiscountingTransport"}},
        "ROUTES": {"lies.*": "liar"},
    }
    lies = [outbox.send("lies.told", {"n": n}) for n in range(count)]
    others = batch_around(lies[0])
    relay = run_one_batch()
    for message in lies:
        assert_failed_once(message, error="MiscountingTransport", retry_within=30)
    assert_rest_of_batch_delivered(relay, others)


# --- the record step ---------------------------------------------------------------------------------


@pytest.mark.parametrize("error", [TypeError, DataError], ids=["TypeError", "DataError"])
def test_an_outcome_that_cannot_be_recorded_fails_alone(monkeypatch, error):
    """An unexpected error (not a database outage) while recording one message's outcome: the others of
    its batch are recorded, the worker goes on, and that message gets a recorded failed attempt. A
    ``DataError`` says the data is wrong, not that the database is away: it is not ridden out as an
    outage (which would hold the whole batch, then leave it to the reaper)."""
    sent = [outbox.send("probe.created", {"n": n}) for n in range(5)]
    bad = sent[2]
    real_record = store.record

    def record(alias: str, *, worker: str, outcomes: Sequence[store.Outcome]) -> set[int]:
        if any(o.message_id == bad.pk and o.status == store.DELIVERED for o in outcomes):
            raise error(f"cannot adapt the outcome of message {bad.pk}")
        lost: set[int] = real_record(alias, worker=worker, outcomes=outcomes)
        return lost

    monkeypatch.setattr(store, "record", record)
    started = time.monotonic()
    relay = run_one_batch()
    assert time.monotonic() - started < 30, "no outage back-off for an error in the data"
    assert_failed_once(bad, error=f"{error.__name__}: cannot adapt the outcome of message {bad.pk}", retry_within=30)
    assert "could not be recorded" in bad.last_error
    assert_rest_of_batch_delivered(relay, [m for m in sent if m.pk != bad.pk])
    assert relay.stats.delivered == 4 and relay.stats.failed == 1


# --- a real worker process -----------------------------------------------------------------------------


def test_a_real_worker_process_survives_every_hostile_retry_after(server, worker_process):
    """``manage.py outbox_worker`` against a receiver answering 503 with each hostile ``Retry-After``: it
    records every attempt, keeps delivering the rest, and stops cleanly when asked."""
    server.replies = [Reply(status=503, headers={"Retry-After": value}) for value in HOSTILE_RETRY_AFTER]
    server.default = Reply(status=503, headers={"Retry-After": HOSTILE_RETRY_AFTER[-1]})
    # tests/settings.py routes orders.created to the shop's webhook transport, whose URL this sets; five
    # attempts, and backoff (so Retry-After too) capped at 0.5 s: the hostile messages go dead quickly
    hostile = [outbox.send("orders.created", {"id": n}) for n in range(len(HOSTILE_RETRY_AFTER))]
    others = batch_around(hostile[0])
    worker = worker_process("--poll-interval", "0.2", "--concurrency", "1", env={"SHOP_WEBHOOK_URL": server.url()})
    ids = [m.pk for m in hostile]
    wait_for(lambda: Message.objects.filter(pk__in=ids, status=Message.Status.DEAD).count() == len(ids), timeout=60)
    assert worker.proc.poll() is None, "the worker must stay alive"
    for message in hostile:
        message.refresh_from_db()
        attempts = list(message.attempt_log.order_by("number").values_list("number", "outcome", "error"))
        assert [(n, outcome) for n, outcome, _ in attempts] == [(n, "failed") for n in range(1, 6)]
        assert all("HTTP 503" in error for _, _, error in attempts)
        assert message.available_at < timezone.now() + dt.timedelta(seconds=1)
    wait_for(lambda: Delivery.objects.filter(message_id__in=[m.pk for m in others]).count() == len(others))
    worker.send_signal(signal.SIGTERM)
    code, output = worker.wait(timeout=60)
    assert code == 0, output
    assert "Traceback" not in output and "OverflowError" not in output, output
    assert len(server.requests) == 5 * len(hostile)


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), -1, "600", True, 10**400, 10**5000, [600]],
    ids=["nan", "inf", "negative", "text", "bool", "int-beyond-float", "int-beyond-str", "list"],
)
def test_retry_after_max_seconds_must_be_a_finite_number(settings, value):
    settings.OUTBOX = {"RETRY_AFTER_MAX_SECONDS": value}
    (problem,) = conf.problems()
    assert problem.id == "django_outbox.E003"
    assert "RETRY_AFTER_MAX_SECONDS" in problem.msg and "finite number" in problem.msg


@pytest.mark.parametrize("value", [None, 0, 0.5, 600, 86400 * 30])
def test_retry_after_max_seconds_accepts_none_and_numbers(settings, value):
    settings.OUTBOX = {"RETRY_AFTER_MAX_SECONDS": value}
    assert conf.problems() == ()
    assert conf.get_settings().RETRY_AFTER_MAX_SECONDS == (None if value is None else float(value))


def test_a_row_at_the_largest_attempt_count_is_claimed_and_goes_dead():
    """A stored row whose attempts reached the column's maximum (2**31-1, e.g. retried without a reset
    or edited by hand) made every claim fail on PostgreSQL with "integer out of range", which the
    worker took for an outage: nothing was claimed any more. It is claimed once more and goes dead."""
    stuck = outbox.send("probe.created", {"always_fail": True}, max_attempts=2**31 - 1)
    Message.objects.filter(pk=stuck.pk).update(attempts=2**31 - 1)
    others = batch_around(stuck)
    relay = run_one_batch()
    stuck.refresh_from_db()
    assert stuck.status == Message.Status.DEAD
    assert stuck.attempts == 2**31 - 1
    assert stuck.attempt_log.get().number == 2**31 - 1
    assert_rest_of_batch_delivered(relay, others)
