from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Callable, Mapping

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import override_settings
from django.utils import timezone

from django_outbox import conf, inbox
from django_outbox.models import InboxMessage
from testproject.shop.models import Order
from tests.support.database import is_postgres
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


def place(email: str = "a@example.com") -> Order:
    return Order.objects.create(customer_email=email, item="mug")


def test_first_delivery_runs_and_records_the_receipt_with_the_consumers_writes():
    with inbox.receive("shop", "evt-1") as receipt:
        assert not receipt.duplicate
        place()
    assert (receipt.source, receipt.message_id) == ("shop", "evt-1")
    row = InboxMessage.objects.get()
    assert (row.source, row.message_id, row.received_at) == ("shop", "evt-1", receipt.received_at)
    assert Order.objects.count() == 1


def test_redelivery_is_reported_as_duplicate_with_the_first_receipt_time():
    with inbox.receive("shop", "evt-1") as first:
        place()
    with inbox.receive("shop", "evt-1") as again:
        if not again.duplicate:
            place()
    assert again.duplicate
    assert again.received_at == first.received_at
    assert Order.objects.count() == 1
    assert InboxMessage.objects.count() == 1


def test_same_message_id_from_another_source_is_a_different_message():
    with inbox.receive("shop", "evt-1"):
        pass
    with inbox.receive("billing", "evt-1") as receipt:
        pass
    assert not receipt.duplicate
    assert InboxMessage.objects.count() == 2


def test_failed_processing_rolls_back_the_receipt_so_a_redelivery_runs_again():
    with pytest.raises(Boom), inbox.receive("shop", "evt-1"):
        place()
        raise Boom
    assert InboxMessage.objects.count() == 0
    assert Order.objects.count() == 0
    with inbox.receive("shop", "evt-1") as receipt:
        place()
    assert not receipt.duplicate
    assert Order.objects.count() == 1


def test_receipt_joins_the_callers_transaction_and_rolls_back_with_it():
    with pytest.raises(Boom), transaction.atomic():
        with inbox.receive("shop", "evt-1"):
            place()
        raise Boom
    assert InboxMessage.objects.count() == 0
    assert Order.objects.count() == 0


def test_receive_is_a_savepoint_inside_an_outer_transaction():
    with transaction.atomic():
        place("outer@example.com")
        try:
            with inbox.receive("shop", "evt-1"):
                place("inner@example.com")
                raise Boom
        except Boom:
            pass
        with inbox.receive("shop", "evt-2"):
            place("second@example.com")
    assert list(Order.objects.order_by("id").values_list("customer_email", flat=True)) == [
        "outer@example.com",
        "second@example.com",
    ]
    assert list(InboxMessage.objects.values_list("message_id", flat=True)) == ["evt-2"]


def test_consumer_decorator_runs_once_and_returns_receipts():
    calls = []

    @inbox.consumer("orders", message_id=lambda event: event["id"])
    def on_event(event: dict[str, str]) -> int:
        calls.append(event["id"])
        return place().pk

    first = on_event({"id": "e-1"})
    second = on_event({"id": "e-1"})
    assert calls == ["e-1"]
    assert not first.duplicate and first.result == Order.objects.get().pk
    assert second.duplicate and second.result is None


def test_uuid_message_ids_are_accepted():
    message_id = uuid.uuid4()
    with inbox.receive("shop", message_id):
        pass
    with inbox.receive("shop", str(message_id)) as receipt:
        pass
    assert receipt.duplicate


@pytest.mark.parametrize(
    ("source", "message_id", "error"),
    [
        ("", "x", ValueError),
        (" shop", "x", ValueError),
        ("shop", 12, TypeError),
        ("shop", "x" * 256, ValueError),
        (None, "x", TypeError),
    ],
)
def test_bad_source_or_id_raises_before_anything_is_written(source, message_id, error):
    with pytest.raises(error, match="inbox"), inbox.receive(source, message_id):
        pass
    assert InboxMessage.objects.count() == 0


def run_threads(*targets: Callable[[], None]) -> tuple[list[threading.Thread], list[BaseException]]:
    """Start each target in a thread with its own database connection; errors are collected."""
    errors: list[BaseException] = []

    def wrap(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:
                errors.append(exc)
            finally:
                connections.close_all()

        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    return threads, errors


def assert_second_is_waiting(outcomes: Mapping[str, object]) -> None:
    """The second delivery is blocked on the first's uncommitted receipt (PostgreSQL: a lock wait)."""
    if is_postgres():

        def blocked_on_a_lock() -> bool:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'"
                )
                return bool(cursor.fetchone()[0] >= 1)

        wait_for(blocked_on_a_lock, timeout=10)
    else:
        # SQLite: its BEGIN IMMEDIATE waits for the single write lock; give it time to (not) finish.
        threading.Event().wait(0.5)
    assert "second" not in outcomes


@pytest.mark.parametrize("first_fails", [False, True], ids=["first-commits", "first-rolls-back"])
def test_concurrent_duplicate_waits_for_the_first_delivery_and_follows_its_outcome(first_fails):
    entered, release = threading.Event(), threading.Event()
    outcomes: dict[str, inbox.Receipt[None]] = {}

    def first() -> None:
        try:
            with inbox.receive("shop", "evt-1") as receipt:
                place("first@example.com")
                entered.set()
                assert release.wait(20)
                if first_fails:
                    raise Boom
            outcomes["first"] = receipt
        except Boom:
            pass

    def second() -> None:
        assert entered.wait(20)
        with inbox.receive("shop", "evt-1") as receipt:
            if not receipt.duplicate:
                place("second@example.com")
        outcomes["second"] = receipt

    threads, errors = run_threads(first, second)
    assert entered.wait(20)
    assert_second_is_waiting(outcomes)
    release.set()
    for t in threads:
        t.join(30)
    assert errors == []
    emails = list(Order.objects.values_list("customer_email", flat=True))
    if first_fails:
        assert not outcomes["second"].duplicate
        assert emails == ["second@example.com"]
    else:
        assert outcomes["second"].duplicate
        assert outcomes["second"].received_at == outcomes["first"].received_at
        assert emails == ["first@example.com"]
    assert InboxMessage.objects.count() == 1


def add_receipt(message_id: str, age: dt.timedelta) -> None:
    InboxMessage.objects.create(source="shop", message_id=message_id, received_at=timezone.now() - age)


def test_purge_deletes_receipts_older_than_the_retention():
    add_receipt("old", dt.timedelta(days=8))
    add_receipt("recent", dt.timedelta(days=6))
    assert inbox.purge() == 1
    assert list(InboxMessage.objects.values_list("message_id", flat=True)) == ["recent"]


@override_settings(OUTBOX={"INBOX_RETENTION": 3600})
def test_retention_setting_in_seconds_bounds_the_dedupe_window():
    assert conf.get_settings().INBOX_RETENTION == dt.timedelta(hours=1)
    add_receipt("old", dt.timedelta(hours=2))
    add_receipt("recent", dt.timedelta(minutes=30))
    assert inbox.purge(batch_size=1) == 1
    # once purged, a redelivery of the old message is processed again
    with inbox.receive("shop", "old") as receipt:
        pass
    assert not receipt.duplicate


def test_purge_command_reports_what_it_deleted(capsys):
    for n in range(3):
        add_receipt(f"old-{n}", dt.timedelta(hours=2))
    add_receipt("recent", dt.timedelta(minutes=1))
    call_command("outbox_purge_inbox", "--older-than", "3600")
    assert capsys.readouterr().out.strip() == "deleted 3 inbox receipts"
    assert InboxMessage.objects.count() == 1


@pytest.mark.parametrize("value", [0, -5, "7 days", dt.timedelta(0), float("inf"), True])
def test_invalid_retention_is_reported_by_manage_py_check(value):
    with override_settings(OUTBOX={"INBOX_RETENTION": value}):
        errors = [e for e in run_checks() if e.id == "django_outbox.E060"]
        assert len(errors) == 1
        assert "INBOX_RETENTION" in errors[0].msg


def test_retention_shorter_than_the_retry_span_is_a_warning():
    with override_settings(OUTBOX={"INBOX_RETENTION": 60, "MAX_ATTEMPTS": 5, "LEASE_SECONDS": 30}):
        (warning,) = [w for w in run_checks() if w.id == "django_outbox.W060"]
        assert "INBOX_RETENTION" in warning.msg
    with override_settings(OUTBOX={"INBOX_RETENTION": 3600, "MAX_ATTEMPTS": 5, "LEASE_SECONDS": 30}):
        assert not [w for w in run_checks() if w.id == "django_outbox.W060"]


def test_outbox_handler_deduped_on_the_message_uuid_applies_a_redelivery_once(handler):
    from django_outbox import outbox
    from django_outbox.models import Message
    from django_outbox.testing import relay_all

    @inbox.consumer("outbox", message_id=lambda message: message.uuid)
    def ship(message: Message) -> None:
        place(message.payload["email"])

    handler("t.inbox", ship)
    message = outbox.send("t.inbox", {"email": "once@example.com"})
    relay_all()
    # A redelivery, as after a worker crash between delivering and recording:
    Message.objects.filter(pk=message.pk).update(status=Message.Status.PENDING, delivered_at=None)
    relay_all()
    assert Message.objects.get(pk=message.pk).attempts == 2
    assert Order.objects.count() == 1
    assert InboxMessage.objects.get().message_id == str(message.uuid)
