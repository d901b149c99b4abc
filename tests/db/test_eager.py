"""``OUTBOX["EAGER"] = True``: ``send()`` delivers at commit, in process, for tests."""

from __future__ import annotations

import datetime as dt
import io
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import DatabaseError, transaction
from django.test import RequestFactory, TestCase, override_settings
from django.utils import timezone
from psycopg import pq

from django_outbox import outbox, signals
from django_outbox.conf import BAD_VALUE, EAGER_WORKER, _parse
from django_outbox.models import Message
from django_outbox.routing import registry
from django_outbox.testing import eager, relay_all
from django_outbox.worker import Relay
from tests.support.database import neighbour_transaction

Register = Callable[[str, Callable[..., object]], None]
Seen = list[tuple[str, Any]]


@pytest.fixture
def eager_on(settings: Any) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "EAGER": True}


@pytest.fixture
def seen(handler: Register) -> list[tuple[str, Any]]:
    """What the probe handlers were called with: ``eager.ok`` succeeds, ``eager.fails`` raises."""
    calls: list[tuple[str, Any]] = []

    def ok(message: Message) -> None:
        calls.append((message.topic, message.payload))

    def fails(message: Message) -> None:
        calls.append((message.topic, message.payload))
        raise RuntimeError("warehouse is down")

    handler("eager.ok", ok)
    handler("eager.fails", fails)
    return calls


def statuses() -> dict[int, str]:
    return dict(Message.objects.values_list("id", "status"))


# --- the setting ------------------------------------------------------------------------------------------


def test_eager_is_off_by_default_and_takes_true_or_false_only() -> None:
    parsed, problems = _parse({})
    assert (parsed.EAGER, problems) == (False, [])
    assert _parse({"EAGER": True})[0].EAGER is True
    for wrong in ("yes", 1, 0, None, "True"):
        _, problems = _parse({"EAGER": wrong})
        assert [p.id for p in problems] == [BAD_VALUE], wrong
        assert "OUTBOX['EAGER'] must be True or False" in problems[0].msg


# --- delivered at commit ----------------------------------------------------------------------------------

committed = pytest.mark.django_db(transaction=True)


@committed
def test_a_transaction_delivers_what_it_sent_right_after_its_commit(eager_on: None, seen: Seen) -> None:
    with transaction.atomic():
        first = outbox.send("eager.ok", {"n": 1})
        outbox.send("eager.ok", {"n": 2})
        assert seen == [], "delivered before the commit"
    assert seen == [("eager.ok", {"n": 1}), ("eager.ok", {"n": 2})]
    message = Message.objects.get(id=first.id)
    assert (message.status, message.attempts) == (Message.Status.DELIVERED, 1)
    assert list(message.attempt_log.values_list("outcome", flat=True)) == ["delivered"]


@committed
def test_one_delivery_per_transaction_not_one_per_message(
    eager_on: None, seen: Seen, monkeypatch: pytest.MonkeyPatch
) -> None:
    drains: list[tuple[int, ...]] = []
    real = eager.deliver

    def counted(alias: str, ids: Any) -> None:
        drains.append(tuple(ids))
        real(alias, ids)

    monkeypatch.setattr(eager, "deliver", counted)
    with transaction.atomic():
        sent = [outbox.send("eager.ok", {"n": n}).id for n in range(5)]
    assert drains == [tuple(sent)]
    assert len(seen) == 5


@committed
def test_autocommit_delivers_at_once(eager_on: None, seen: Seen) -> None:
    message = outbox.send("eager.ok", {"n": 1})
    assert seen == [("eager.ok", {"n": 1})]
    assert Message.objects.get(id=message.id).status == Message.Status.DELIVERED


@committed
def test_a_rollback_delivers_nothing(eager_on: None, seen: Seen) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        outbox.send("eager.ok", {"n": 1})
        raise RuntimeError("payment refused")
    assert (seen, Message.objects.count()) == ([], 0)
    with transaction.atomic():  # the next transaction starts afresh
        outbox.send("eager.ok", {"n": 2})
    assert seen == [("eager.ok", {"n": 2})]


@committed
def test_a_savepoint_delivers_at_the_outer_commit_only(eager_on: None, seen: Seen) -> None:
    with transaction.atomic():
        with transaction.atomic():
            outbox.send("eager.ok", {"n": 1})
        assert seen == [], "the savepoint's release is no commit"
        with pytest.raises(RuntimeError), transaction.atomic():
            outbox.send("eager.ok", {"n": "rolled back"})
            raise RuntimeError
        outbox.send("eager.ok", {"n": 2})
        assert seen == []
    assert seen == [("eager.ok", {"n": 1}), ("eager.ok", {"n": 2})]
    assert set(statuses().values()) == {Message.Status.DELIVERED}


@committed
def test_a_transaction_whose_only_sends_were_in_a_rolled_back_savepoint_delivers_later_ones(
    eager_on: None, seen: Seen
) -> None:
    with transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            outbox.send("eager.ok", {"n": "rolled back"})
            raise RuntimeError
        outbox.send("eager.ok", {"n": 1})
    assert seen == [("eager.ok", {"n": 1})]


def place_order(request: Any) -> str:
    """A view: it sends in its transaction and returns; the delivery happens after its commit."""
    with transaction.atomic():
        outbox.send("eager.fails", {"order": 7}, max_attempts=3)
    return "ok"


@committed
def test_a_failed_delivery_is_recorded_with_its_backoff_and_the_view_does_not_raise(
    eager_on: None, seen: Seen, settings: Any
) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "BACKOFF_BASE_SECONDS": 60, "BACKOFF_MAX_SECONDS": 60}
    before = timezone.now()
    assert place_order(RequestFactory().post("/orders/")) == "ok"
    message = Message.objects.get()
    assert seen == [("eager.fails", {"order": 7})]
    assert (message.status, message.attempts) == (Message.Status.PENDING, 1)
    assert message.available_at >= before + dt.timedelta(seconds=29), "no backoff"
    attempt = message.attempt_log.get()
    assert attempt.outcome == "failed" and "warehouse is down" in attempt.error
    assert relay_all(ignore_backoff=True, until_settled=True).dead == 1  # the retries go on as usual


@committed
def test_a_last_failed_attempt_is_dead_as_in_a_worker(eager_on: None, seen: Seen) -> None:
    dead: list[int] = []

    def on_dead(sender: object, message: Message, **kwargs: object) -> None:
        dead.append(message.id)

    signals.message_dead.connect(on_dead)
    try:
        message = outbox.send("eager.fails", {}, max_attempts=1)
    finally:
        signals.message_dead.disconnect(on_dead)
    assert Message.objects.get(id=message.id).status == Message.Status.DEAD
    assert dead == [message.id]


@committed
def test_an_error_outside_the_handlers_is_logged_not_raised(
    eager_on: None, seen: Seen, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: Relay) -> None:
        raise DatabaseError("the database went away")

    monkeypatch.setattr(Relay, "drain", broken)
    with caplog.at_level(logging.ERROR, logger="django_outbox.testing"), transaction.atomic():
        message = outbox.send("eager.ok", {})
    assert Message.objects.get(id=message.id).status == Message.Status.PENDING  # a worker delivers it later
    assert "after their commit failed" in caplog.text and "the database went away" in caplog.text


# --- only what the transaction sent: keys, schedules, other messages ----------------------------------------


@committed
def test_only_the_transactions_own_messages_are_delivered(eager_on: None, seen: Seen, settings: Any) -> None:
    with override_settings(OUTBOX={**settings.OUTBOX, "EAGER": False}):
        left = outbox.send("eager.ok", {"n": "sent without eager"})
    mine = outbox.send("eager.ok", {"n": "mine"})
    assert statuses() == {left.id: Message.Status.PENDING, mine.id: Message.Status.DELIVERED}
    assert Message.objects.get(id=left.id).attempts == 0


@committed
def test_a_scheduled_message_is_not_delivered_early(eager_on: None, seen: Seen) -> None:
    with transaction.atomic():
        later = outbox.send("eager.ok", {"n": "later"}, delay=3600)
        now = outbox.send("eager.ok", {"n": "now"})
    assert statuses() == {later.id: Message.Status.PENDING, now.id: Message.Status.DELIVERED}
    assert Message.objects.get(id=later.id).attempts == 0


@committed
def test_keyed_messages_of_one_transaction_are_delivered_in_order(eager_on: None, seen: Seen) -> None:
    with transaction.atomic():
        for n in range(3):
            outbox.send("eager.ok", {"n": n}, key="order-7")
    assert seen == [("eager.ok", {"n": 0}), ("eager.ok", {"n": 1}), ("eager.ok", {"n": 2})]


@committed
def test_a_keyed_message_is_delivered_at_commit_while_another_database_holds_a_transaction_open(
    postgres: None, eager_on: None, seen: Seen
) -> None:
    """Once the commit-order fence held keyed messages until every older transaction of the server had
    ended: EAGER waited up to five seconds for it, then left the message undelivered."""
    with neighbour_transaction() as neighbour:
        with transaction.atomic():
            outbox.send("eager.ok", {"n": 1}, key="order-7")
        assert seen == [("eager.ok", {"n": 1})]
        assert neighbour.info.transaction_status == pq.TransactionStatus.INTRANS


@committed
def test_a_keyed_message_behind_an_undelivered_one_stays_behind_it(eager_on: None, seen: Seen, settings: Any) -> None:
    with override_settings(OUTBOX={**settings.OUTBOX, "EAGER": False}):
        head = outbox.send("eager.ok", {"n": "head"}, key="order-7")
    behind = outbox.send("eager.ok", {"n": "behind"}, key="order-7")
    other_key = outbox.send("eager.ok", {"n": "other key"}, key="order-8")
    assert statuses() == {
        head.id: Message.Status.PENDING,
        behind.id: Message.Status.PENDING,  # not delivered out of order, and not reached for either
        other_key.id: Message.Status.DELIVERED,
    }
    assert Message.objects.get(id=behind.id).attempts == 0
    relay_all()
    assert seen[1:] == [("eager.ok", {"n": "head"}), ("eager.ok", {"n": "behind"})]


@committed
def test_a_failing_head_holds_back_the_rest_of_its_key(eager_on: None, seen: Seen, settings: Any) -> None:
    settings.OUTBOX = {**settings.OUTBOX, "BACKOFF_BASE_SECONDS": 60, "BACKOFF_MAX_SECONDS": 60}
    with transaction.atomic():
        head = outbox.send("eager.fails", {"n": 1}, key="order-7")
        behind = outbox.send("eager.ok", {"n": 2}, key="order-7")
    assert seen == [("eager.fails", {"n": 1})]
    assert statuses() == {head.id: Message.Status.PENDING, behind.id: Message.Status.PENDING}


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_another_database_delivers_at_its_own_commit(eager_on: None, seen: Seen) -> None:
    with transaction.atomic(using="other"):
        with transaction.atomic():  # a commit of "default" is not the commit of "other"
            message = outbox.send("eager.ok", {"db": "other"}, using="other")
        assert seen == []
    assert seen == [("eager.ok", {"db": "other"})]
    assert Message.objects.using("other").get(id=message.id).status == Message.Status.DELIVERED


@committed
def test_eager_off_send_delivers_nothing(seen: Seen) -> None:
    with transaction.atomic():
        message = outbox.send("eager.ok", {})
    outbox.send("eager.ok", {})
    assert seen == []
    assert Message.objects.get(id=message.id).status == Message.Status.PENDING


# --- inside a test's own transaction: on_commit callbacks run only when captured --------------------------------


@pytest.mark.django_db
def test_the_pytest_django_capture_fixture_runs_the_delivery(
    eager_on: None, seen: Seen, django_capture_on_commit_callbacks: Any
) -> None:
    outbox.send("eager.ok", {"n": "not captured"})
    assert seen == [], "the db fixture's transaction never commits"
    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():
            outbox.send("eager.ok", {"n": "captured"})
    # The capture ran the delivery of the test's whole transaction, the message sent before it included.
    assert seen == [("eager.ok", {"n": "not captured"}), ("eager.ok", {"n": "captured"})]
    assert set(statuses().values()) == {Message.Status.DELIVERED}


class CapturedDeliveryTests(TestCase):
    def setUp(self) -> None:
        from django.conf import settings

        self.enterContext(override_settings(OUTBOX={**settings.OUTBOX, "EAGER": True}))
        self.seen: list[Any] = []
        registry.register("eager.ok", lambda message: self.seen.append(message.payload))
        self.addCleanup(registry.unregister, "eager.ok")

    def test_capture_on_commit_callbacks_delivers(self) -> None:
        with self.captureOnCommitCallbacks(execute=True) as callbacks:
            with transaction.atomic():
                message = outbox.send("eager.ok", {"n": 1}, key="order-7")
                outbox.send("eager.ok", {"n": 2}, key="order-7")
        self.assertGreaterEqual(len(callbacks), 1)
        self.assertEqual(self.seen, [{"n": 1}, {"n": 2}])
        self.assertEqual(Message.objects.get(id=message.id).status, Message.Status.DELIVERED)

    def test_without_a_capture_nothing_is_delivered(self) -> None:
        message = outbox.send("eager.ok", {"n": 1})
        self.assertEqual(self.seen, [])
        self.assertEqual(Message.objects.get(id=message.id).status, Message.Status.PENDING)

    def test_a_capture_without_execute_delivers_when_the_test_runs_the_callbacks(self) -> None:
        with self.captureOnCommitCallbacks() as callbacks:
            outbox.send("eager.ok", {"n": 1})
        self.assertEqual(self.seen, [])
        for callback in callbacks:
            callback()
        self.assertEqual(self.seen, [{"n": 1}])


# --- the worker command warns ----------------------------------------------------------------------------------


@pytest.fixture
def worker_stderr() -> Iterator[Callable[[], str]]:
    def run() -> str:
        err = io.StringIO()
        call_command("outbox_worker", "--until-empty", verbosity=0, stderr=err)
        return err.getvalue()

    yield run


@committed
def test_the_worker_warns_when_eager_is_on(
    eager_on: None, worker_stderr: Callable[[], str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="django_outbox.relay"):
        text = worker_stderr()
    assert f"WARNING ({EAGER_WORKER}): OUTBOX['EAGER'] is on, a setting for tests" in text
    assert "HINT: Remove OUTBOX['EAGER']" in text
    assert EAGER_WORKER in caplog.text


@committed
def test_the_worker_says_nothing_when_eager_is_off_or_silenced(worker_stderr: Callable[[], str], settings: Any) -> None:
    assert EAGER_WORKER not in worker_stderr()
    settings.OUTBOX = {**settings.OUTBOX, "EAGER": True}
    settings.SILENCED_SYSTEM_CHECKS = [EAGER_WORKER]
    assert EAGER_WORKER not in worker_stderr()
