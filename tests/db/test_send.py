from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import time
import uuid
import zoneinfo

import pytest
from django.db import IntegrityError, transaction
from django.db.models.signals import post_init, pre_init
from django.test import override_settings
from django.utils import timezone

from django_outbox import IdempotencyConflictError, PayloadTooLargeError, UnknownTopicError, outbox, store
from django_outbox.models import Message
from testproject.shop.models import Order

pytestmark = pytest.mark.django_db(transaction=True)


def test_send_writes_a_pending_row_in_the_callers_transaction():
    with transaction.atomic():
        order = Order.objects.create(customer_email="a@example.com", item="mug")
        message = outbox.send("probe.created", {"order": order.pk, "price": decimal.Decimal("9.50")}, key="k1")
        assert Message.objects.filter(pk=message.pk).exists()
    stored = Message.objects.get(pk=message.pk)
    assert stored.status == Message.Status.PENDING
    assert stored.payload == {"order": order.pk, "price": "9.50"}
    assert stored.key == "k1"
    assert stored.attempts == 0
    assert stored.max_attempts == 5
    assert isinstance(stored.uuid, uuid.UUID)
    assert message.uuid == stored.uuid
    assert message.payload == stored.payload


def test_messages_without_idempotency_key_never_conflict():
    for _ in range(3):
        outbox.send("probe.created", {}, idempotency_key=None)
    assert Message.objects.filter(idempotency_key__isnull=True).count() == 3


def test_rollback_removes_message_and_business_data_together():
    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        Order.objects.create(customer_email="a@example.com", item="mug")
        outbox.send("probe.created", {"x": 1})
        raise Boom
    assert Message.objects.count() == 0
    assert Order.objects.count() == 0


def test_rolled_back_savepoint_removes_only_its_messages():
    with transaction.atomic():
        outbox.send("probe.created", {"kept": True})
        try:
            with transaction.atomic():
                outbox.send("probe.created", {"kept": False})
                raise ValueError
        except ValueError:
            pass
    assert list(Message.objects.values_list("payload", flat=True)) == [{"kept": True}]


def test_send_outside_atomic_commits_at_once():
    message = outbox.send("probe.created", [1, 2, 3])
    assert Message.objects.get(pk=message.pk).payload == [1, 2, 3]


def test_non_json_payload_is_a_type_error_naming_the_type_and_writes_nothing():
    class Thing:
        pass

    with transaction.atomic():
        with pytest.raises(TypeError, match="Thing"):
            outbox.send("probe.created", {"thing": Thing()})
        # the caller's transaction is still usable
        Order.objects.create(customer_email="a@example.com", item="mug")
    assert Message.objects.count() == 0
    assert Order.objects.count() == 1


@pytest.mark.parametrize("payload", [float("nan"), {"x": float("inf")}])
def test_nan_and_infinity_are_rejected(payload):
    with pytest.raises(TypeError, match="JSON"):
        outbox.send("probe.created", payload)
    assert Message.objects.count() == 0


def test_nul_character_is_rejected_before_the_database_sees_it():
    with transaction.atomic():
        with pytest.raises(ValueError, match="NUL"):
            outbox.send("probe.created", {"text": "a\x00b"})
        outbox.send("probe.created", {"text": "fine"})
    assert Message.objects.count() == 1


def test_unknown_topic_raises_at_send_time():
    with pytest.raises(UnknownTopicError, match=r"nobody\.listens"):
        outbox.send("nobody.listens", {})
    assert Message.objects.count() == 0


def test_route_makes_a_topic_known():
    with override_settings(
        OUTBOX={
            "TRANSPORTS": {"hooks": {"BACKEND": "django_outbox.transports.handler.HandlerTransport"}},
            "ROUTES": {"billing.*": "hooks"},
        }
    ):
        outbox.send("billing.charged", {})
    assert Message.objects.filter(topic="billing.charged").exists()


def test_idempotency_key_returns_the_existing_message_without_breaking_the_transaction():
    with transaction.atomic():
        first = outbox.send("probe.created", {"n": 1}, idempotency_key="order-1")
        second = outbox.send("probe.created", {"n": 1}, idempotency_key="order-1")
        # no IntegrityError was raised, and the transaction can go on
        Order.objects.create(customer_email="a@example.com", item="mug")
    assert second.pk == first.pk
    assert second.payload == {"n": 1}
    assert Message.objects.count() == 1
    assert Order.objects.count() == 1


def test_idempotency_key_with_another_payload_is_a_conflict_that_leaves_the_transaction_usable():
    """It silently returned the first message, where the HTTP side answers 422 for the same mistake."""
    with transaction.atomic():
        first = outbox.send("probe.created", {"n": 1}, idempotency_key="order-1")
        with pytest.raises(IdempotencyConflictError, match="'order-1' already belongs to message") as raised:
            outbox.send("probe.created", {"n": 2}, idempotency_key="order-1")
        Order.objects.create(customer_email="a@example.com", item="mug")
    assert raised.value.existing.pk == first.pk
    assert list(Message.objects.values_list("payload", flat=True)) == [{"n": 1}]
    assert Order.objects.count() == 1


def test_idempotency_key_is_unique_in_the_table():
    outbox.send("probe.created", {}, idempotency_key="dup")
    with pytest.raises(IntegrityError), transaction.atomic():
        Message.objects.create(topic="probe.created", payload={}, max_attempts=1, idempotency_key="dup")


def test_delay_and_available_at():
    before = timezone.now()
    a = outbox.send("probe.created", {}, delay=dt.timedelta(minutes=5))
    b = outbox.send("probe.created", {}, delay=30)
    when = timezone.now() + dt.timedelta(hours=1)
    c = outbox.send("probe.created", {}, available_at=when)
    assert a.available_at >= before + dt.timedelta(minutes=5)
    assert b.available_at >= before + dt.timedelta(seconds=30)
    assert Message.objects.get(pk=c.pk).available_at == when


@pytest.mark.parametrize("send_many", [False, True], ids=["send", "send_many"])
def test_a_delay_of_thousands_of_years_is_kept_not_shortened(send_many):
    """The longest delay send() accepts ends a minute before its latest time (about year 9999). MariaDB
    once capped the delay at 400 years (to keep its date arithmetic from overflowing, an error in strict
    mode): the message came due in the 2420s, and the returned Message said so too."""
    from django_outbox.api import LATEST_AVAILABLE_AT

    delay = (LATEST_AVAILABLE_AT - timezone.now()).total_seconds() - 60
    if send_many:
        (sent,) = outbox.send_many([{"topic": "probe.created", "payload": {}, "delay": delay}])
    else:
        sent = outbox.send("probe.created", {}, delay=delay)
    stored = Message.objects.get(pk=sent.pk).available_at
    assert abs((stored - (LATEST_AVAILABLE_AT - dt.timedelta(minutes=1))).total_seconds()) < 60
    assert sent.available_at == stored


def test_headers_and_max_attempts_are_stored():
    m = outbox.send("probe.created", {}, headers={"x-tenant": "acme"}, max_attempts=2)
    stored = Message.objects.get(pk=m.pk)
    assert stored.headers == {"x-tenant": "acme"}
    assert stored.max_attempts == 2


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"topic": ""}, ValueError, "topic"),
        ({"topic": "x" * 201}, ValueError, "topic.*201"),
        ({"topic": 5}, TypeError, "topic"),
        ({"key": ""}, ValueError, "key"),
        ({"key": "k" * 201}, ValueError, "key"),
        ({"idempotency_key": " padded "}, ValueError, "idempotency_key"),
        ({"idempotency_key": "i" * 201}, ValueError, "idempotency_key"),
        ({"delay": "soon"}, TypeError, "delay"),
        ({"delay": True}, TypeError, "delay"),
        ({"delay": -1}, ValueError, "negative"),
        ({"available_at": "tomorrow"}, TypeError, "available_at"),
        ({"available_at": dt.datetime(2030, 1, 1)}, ValueError, "timezone-aware"),
        ({"delay": 1, "available_at": dt.datetime(2030, 1, 1, tzinfo=dt.UTC)}, ValueError, "not both"),
        ({"max_attempts": 0}, ValueError, "max_attempts"),
        ({"headers": {"a": 1}}, TypeError, "headers"),
        ({"using": "nope"}, ValueError, "nope"),
    ],
)
def test_bad_arguments_raise_clear_errors_and_write_nothing(kwargs, error, match):
    args = {"topic": "probe.created", "payload": {}} | kwargs
    topic = args.pop("topic")
    payload = args.pop("payload")
    with pytest.raises(error, match=match):
        outbox.send(topic, payload, **args)
    assert Message.objects.count() == 0


def test_payload_over_the_limit_is_refused():
    with override_settings(OUTBOX={"MAX_PAYLOAD_BYTES": 100}):
        with pytest.raises(PayloadTooLargeError, match="MAX_PAYLOAD_BYTES"):
            outbox.send("probe.created", {"blob": "x" * 200})
        outbox.send("probe.created", {"blob": "x" * 10})
    assert Message.objects.count() == 1


def test_the_smallest_accepted_limit_takes_the_smallest_payload_without_headers():
    """MAX_PAYLOAD_BYTES = 1 is accepted (the checks' minimum), so a 1-byte payload must go: absent headers
    are stored as {}, which is not the caller's and must not count against the limit (hypothesis found
    it in test_check_properties: "the headers are 2 bytes as JSON")."""
    with override_settings(OUTBOX={"MAX_PAYLOAD_BYTES": 1}):
        assert outbox.send("probe.created", 1).payload == 1
        assert [m.payload for m in outbox.send_many([{"topic": "probe.created", "payload": 2}])] == [2]
        with pytest.raises(PayloadTooLargeError, match="MAX_PAYLOAD_BYTES"):
            outbox.send("probe.created", 12)
        with pytest.raises(PayloadTooLargeError, match="headers"):
            outbox.send("probe.created", 1, headers={"h": "v"})
    assert Message.objects.count() == 2


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_using_writes_in_that_databases_transaction():
    with transaction.atomic(using="other"):
        message = outbox.send("probe.created", {"db": "other"}, using="other")
        assert Message.objects.using("other").filter(pk=message.pk).exists()
    assert Message.objects.using("other").count() == 1
    assert Message.objects.using("default").count() == 0
    with pytest.raises(ValueError), transaction.atomic(using="other"):
        outbox.send("probe.created", {"db": "other", "n": 2}, using="other")
        raise ValueError
    assert Message.objects.using("other").count() == 1


@override_settings(USE_TZ=False)
def test_without_time_zones_available_at_takes_naive_times():
    """With USE_TZ = False Django's datetimes are naive (in TIME_ZONE); send() takes them as the ORM does."""
    later = timezone.now() + dt.timedelta(hours=1)
    assert timezone.is_naive(later)
    with transaction.atomic():
        message = outbox.send("orders.created", {"n": 1}, available_at=later)
    message.refresh_from_db()
    assert message.available_at == later


@override_settings(USE_TZ=False)
def test_without_time_zones_delays_and_far_times_are_checked_too():
    with transaction.atomic():
        message = outbox.send("orders.created", {"n": 1}, delay=60)
    assert timezone.is_naive(message.available_at)
    with pytest.raises(ValueError, match="9999"):
        outbox.send("orders.created", {"n": 2}, delay=dt.timedelta(days=365 * 9000))
    with pytest.raises(ValueError, match="9999"):
        outbox.send("orders.created", {"n": 3}, available_at=dt.datetime.max)


@pytest.mark.django_db
@pytest.mark.parametrize("use_tz", [True, False], ids=["aware", "naive"])
@pytest.mark.parametrize(
    "schedule",
    [
        {},
        {"delay": 90},
        {"key": "k-times"},
        # a given time is the sender's (on MariaDB only the times the server computed come back)
        {"available_at": dt.datetime(2031, 5, 6, 7, 8, 9, 123457, tzinfo=zoneinfo.ZoneInfo("America/Lima"))},
    ],
    ids=["now", "delay", "keyed", "given"],
)
def test_returned_times_equal_the_stored_row_in_any_time_zone(handler, use_tz, schedule):
    """send() reads the server's created_at back as text (cheaper than the cursor's time-zone loader): it must
    read as Django's own loader does, aware UTC or, without USE_TZ, naive wall time in a zone away from UTC."""
    handler("t.times", lambda m: None)
    with override_settings(USE_TZ=use_tz, TIME_ZONE="Asia/Kolkata"), transaction.atomic():
        sent = outbox.send("t.times", {"n": 1}, **schedule)
        stored = Message.objects.get(pk=sent.pk)
        assert (sent.created_at, sent.available_at) == (stored.created_at, stored.available_at)
        assert timezone.is_naive(sent.created_at) is not use_tz
        assert abs(sent.created_at - timezone.now()) < dt.timedelta(minutes=1)


# --- the returned message --------------------------------------------------------------------------------
# send() builds the returned Message from what it wrote; it must equal the row read back.


FIELDS = [f.attname for f in Message._meta.concrete_fields]


@pytest.mark.django_db  # in a test transaction, as when this was a module of its own
@pytest.mark.parametrize("headers", [None, {"h": "v"}])
@pytest.mark.parametrize("in_transaction", [False, True])
def test_returned_message_equals_the_stored_row(handler, in_transaction, headers):
    handler("t.back", lambda m: None)
    paris = zoneinfo.ZoneInfo("Europe/Paris")
    payload = {"z": 1, "a": [1.5, "x", None], "when": dt.datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)}
    with transaction.atomic() if in_transaction else contextlib.nullcontext():
        sent = outbox.send(
            "t.back",
            payload,
            key="k-1",
            headers=headers,
            idempotency_key=f"back-{in_transaction}-{headers is None}",
            available_at=dt.datetime(2031, 6, 1, 12, 0, 0, 123456, tzinfo=paris),
            max_attempts=3,
        )
    stored = Message.objects.get(pk=sent.pk)
    assert {f: getattr(sent, f) for f in FIELDS} == {f: getattr(stored, f) for f in FIELDS}
    assert sent.available_at.utcoffset() == dt.timedelta(0)
    assert sent.status == Message.Status.PENDING
    assert sent._state.adding is False and sent._state.db == "default"
    assert vars(sent).keys() == vars(stored).keys()  # nothing more or less than a loaded instance


@pytest.mark.django_db
def test_init_signal_listeners_still_see_every_message_the_outbox_builds(handler):
    """send() and the claim skip Model.__init__ for speed, except when something listens to it."""
    handler("t.signal", lambda m: None)
    seen: list[tuple[str, Message]] = []

    def on_pre_init(sender, args, kwargs, **extra):
        seen.append(("pre", sender))

    def on_post_init(sender, instance, **extra):
        seen.append(("post", instance))

    for signal, receiver in ((pre_init, on_pre_init), (post_init, on_post_init)):
        signal.connect(receiver, sender=Message)
        try:
            seen.clear()
            sent = outbox.send("t.signal", {"n": 1})
            (claimed,) = store.claim("default", worker="w1", limit=10, lease_seconds=30)
        finally:
            signal.disconnect(receiver, sender=Message)
        assert claimed.pk == sent.pk
        if signal is post_init:
            assert [instance for _, instance in seen] == [sent, claimed]
            assert seen[0][1] is sent and seen[1][1] is claimed
        else:
            assert seen == [("pre", Message), ("pre", Message)]
        Message.objects.filter(pk=sent.pk).delete()


def test_message_uuids_are_version_7_and_sort_by_time():
    """Time-ordered uuids (RFC 9562 version 7) put each new entry of the uuid index beside the last one."""
    first = outbox.send("probe.created", {"n": 1})
    batch = outbox.send_many([{"topic": "probe.created", "payload": {"n": n}} for n in range(3)])
    time.sleep(0.002)
    later = outbox.send("probe.created", {"n": 2})
    for message in [first, *batch, later]:
        assert message.uuid.version == 7 and message.uuid.variant == uuid.RFC_4122
    assert first.uuid.int >> 80 <= batch[0].uuid.int >> 80 < later.uuid.int >> 80
    assert abs((first.uuid.int >> 80) - first.created_at.timestamp() * 1000) < 60_000
    assert len({m.uuid for m in [first, *batch, later]}) == 5
