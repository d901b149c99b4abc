"""Plain regressions for what the property tests of send() found or decided (tests/db/test_send_properties.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings

from django_outbox import OutboxImproperlyConfigured, PayloadTooLargeError, UnknownTopicError, outbox, routing
from django_outbox.checks import check_settings
from django_outbox.limits import PAYLOAD_MAX_DEPTH
from django_outbox.models import Message
from testproject.shop.models import Order
from tests.support.checks import outbox_errors

pytestmark = pytest.mark.django_db(transaction=True)


def refused(error: type[Exception], match: str, *args: Any, **kwargs: Any) -> None:
    messages, orders = Message.objects.count(), Order.objects.count()
    with transaction.atomic():
        with pytest.raises(error, match=match):
            outbox.send(*args, **kwargs)
        Order.objects.create(customer_email="a@example.com", item="mug")  # the transaction goes on
    assert Message.objects.count() == messages
    assert Order.objects.count() == orders + 1


@pytest.mark.parametrize(
    ("headers", "match"),
    [
        ({"X-A": "v\r\nNats-Msg-Id: fixed"}, "line break"),
        ({"X-A": "v\nw"}, "line break"),
        ({"X-A": "v\x00"}, "line break or NUL"),
        ({"": "v"}, "header name ''"),
        ({"X A": "v"}, "without spaces"),
        ({"X:A": "v"}, "':'"),
        ({"X\x01": "v"}, "control characters"),
    ],
)
def test_headers_that_transports_cannot_carry_are_refused(headers, match):
    refused(ValueError, match, "probe.created", {}, headers=headers)


def test_header_types_are_named_in_the_error():
    refused(TypeError, "1: 'v' is int to str", "probe.created", {}, headers={1: "v"})
    refused(TypeError, "not list", "probe.created", {}, headers=[("a", "b")])


def test_values_with_tabs_and_unicode_are_fine_headers():
    sent = outbox.send("probe.created", {}, headers={"X-Tenant": "caf\u00e9\tbar", "traceparent": "00-ab-cd-01"})
    assert Message.objects.get(pk=sent.pk).headers == {"X-Tenant": "caf\u00e9\tbar", "traceparent": "00-ab-cd-01"}


def test_headers_count_towards_the_payload_limit():
    with override_settings(OUTBOX={"MAX_PAYLOAD_BYTES": 1000}):
        refused(
            PayloadTooLargeError,
            r"headers of 'probe.created' are 1008 bytes",
            "probe.created",
            {},
            headers={"a": "v" * 1000},
        )


def test_payload_nesting_is_limited_below_what_decoders_can_read():
    from django.db import connection

    if connection.vendor == "mysql":  # MariaDB's JSON_VALID(), the JSON columns' CHECK, stops at 31 levels
        from django_outbox.store.mysql import JSON_MAX_DEPTH

        deepest: Any = 1
        for _ in range(JSON_MAX_DEPTH):
            deepest = [deepest]
        outbox.send("probe.created", deepest)
        refused(ValueError, f"32 levels deep; MariaDB stores JSON up to {JSON_MAX_DEPTH}", "probe.created", [deepest])
        Message.objects.all().delete()
    deep: Any = 1
    for _ in range(PAYLOAD_MAX_DEPTH):
        deep = [deep]
    if connection.vendor != "mysql":
        outbox.send("probe.created", deep)
        Message.objects.all().delete()
    refused(ValueError, f"101 levels deep; the limit is {PAYLOAD_MAX_DEPTH}", "probe.created", [deep])
    brackets_in_text = {"text": "[" * 5000, "list": [[[1]]]}  # brackets inside strings do not nest
    assert outbox.send("probe.created", brackets_in_text).payload == brackets_in_text


def test_encoding_errors_other_than_nan_say_what_they_are():
    loop: dict[str, Any] = {}
    loop["self"] = loop
    refused(TypeError, r"JSON-serialisable: Circular reference detected\.$", "probe.created", loop)
    refused(TypeError, r"4300 digits", "probe.created", {"n": 10**5000})
    refused(TypeError, r"\(NaN and infinity are not JSON\)", "probe.created", {"n": float("nan")})


class _Unencodable:
    pass


@pytest.mark.parametrize(
    "bad",
    [_Unencodable(), float("inf"), 10**5000],
    ids=["no-default", "infinity", "too-many-digits"],
)
def test_a_payload_refused_mid_container_leaves_the_next_sends_encoding_whole(bad):
    """The JSON encoder's C function is kept between sends; an error raised inside nested containers leaves
    them in its circular-reference table, so a kept function would refuse those containers, sent again, as
    circular. After the error the next send encodes them."""
    shared = {"items": [{"sku": "a"}]}
    shared["items"].append({"bad": bad})
    refused(TypeError, "JSON-serialisable", "probe.created", shared)
    shared["items"].pop()
    assert outbox.send("probe.created", shared).payload == {"items": [{"sku": "a"}]}
    loop: dict[str, Any] = {"n": 1}
    loop["self"] = loop  # and a real cycle is still refused as one
    refused(TypeError, r"Circular reference detected", "probe.created", loop)


def test_big_floats_stay_floats():
    payload = {"a": 1e16, "b": -1.5e300, "c": [2.0**63], "s": "1e+16"}
    sent = outbox.send("probe.created", payload)
    stored = Message.objects.get(pk=sent.pk).payload
    assert stored == payload and [type(stored[k]) for k in "ab"] == [float, float] and type(stored["c"][0]) is float
    assert sent.payload == payload


@pytest.mark.parametrize(
    "available_at",
    [
        dt.datetime.max.replace(tzinfo=dt.timezone(-dt.timedelta(hours=5))),
        dt.datetime.max.replace(tzinfo=dt.UTC),
        dt.datetime.min.replace(tzinfo=dt.UTC),
        dt.datetime.min.replace(tzinfo=dt.timezone(dt.timedelta(hours=5))),
    ],
)
def test_available_at_must_leave_a_day_of_the_datetime_range(available_at):
    refused(ValueError, "outside the years 1 to 9999", "probe.created", {}, available_at=available_at)


def test_available_at_with_any_offset_is_stored_as_the_same_instant():
    for offset in (dt.timedelta(hours=-23, minutes=-59), dt.timedelta(microseconds=1), dt.timedelta(hours=15)):
        when = dt.datetime(2030, 1, 1, 12, tzinfo=dt.timezone(offset))
        sent = outbox.send("probe.created", {}, available_at=when)
        assert Message.objects.get(pk=sent.pk).available_at == when == sent.available_at


@pytest.mark.parametrize(("delay", "match"), [(10**400, "past the year 9999"), (-(10**400), "non-negative")])
def test_delays_beyond_any_float_are_refused(delay, match):
    refused(ValueError, match, "probe.created", {}, delay=delay)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"topic": "probe.\x00"}, r"topic contains a NUL"),
        ({"key": "k\x00"}, r"key contains a NUL"),
        ({"idempotency_key": "\x00"}, r"idempotency_key contains a NUL"),
        ({"key": "\ud800"}, r"key contains a lone UTF-16 surrogate"),
        ({"idempotency_key": "a\udfffb"}, r"idempotency_key contains a lone UTF-16 surrogate"),
    ],
)
def test_names_the_database_cannot_store_are_refused(kwargs, match):
    args = {"topic": "probe.created"} | kwargs
    refused(ValueError, match, args.pop("topic"), {}, **args)


# --- bad input to send() and to OUTBOX -------------------------------------------------------------------
# Bad input to ``send()`` and to ``OUTBOX``: a clear error at the earliest point, and nothing written.
#
# tests/db/test_send.py and tests/unit/test_checks.py hold the first cases; these are the ones the fault-injection
# work added (docs/reliability.md lists them all). Each send case runs inside a transaction that must stay
# usable afterwards: an error the database raised instead would have poisoned it on PostgreSQL.


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (("probe.created", {1, 2}), {}, TypeError, "JSON-serialisable.*set"),
        (("probe.created", b"bytes"), {}, TypeError, "JSON-serialisable.*bytes"),
        (("probe.created", {(1, 2): "tuple key"}), {}, TypeError, "keys must be"),
        (("probe.created", {"text": "half \ud800 an emoji"}), {}, ValueError, "lone UTF-16 surrogate"),
        (("probe.created", {"text": "\udc00 low half first"}), {}, ValueError, "lone UTF-16 surrogate"),
        (("probe.created", {}), {"headers": {"h": "\ud83d"}}, ValueError, "headers contains a lone"),
        ((None, {}), {}, TypeError, "topic must be a string"),
        ((" probe.created", {}), {}, ValueError, "surrounding spaces"),
        (("nobody.listens", {}), {}, UnknownTopicError, "No route or handler serves topic 'nobody.listens'"),
        (("probe.created", {}), {"key": 5}, TypeError, "key must be a string or None"),
        (("probe.created", {}), {"idempotency_key": ""}, ValueError, "idempotency_key must be a non-empty"),
        (("probe.created", {}), {"delay": float("nan")}, ValueError, "finite, non-negative"),
        (("probe.created", {}), {"delay": float("inf")}, ValueError, "finite, non-negative"),
        (("probe.created", {}), {"delay": 10**12}, ValueError, "past the year 9999"),
        (("probe.created", {}), {"delay": dt.timedelta.max}, ValueError, "past the year 9999"),
        (
            ("probe.created", {}),
            {"delay": dt.timedelta(seconds=-1)},
            ValueError,
            "finite, non-negative number of seconds",
        ),
        (("probe.created", {}), {"available_at": dt.date(2030, 1, 1)}, TypeError, "available_at must be a datetime"),
        (("probe.created", {}), {"max_attempts": 2**31}, ValueError, "max_attempts must be a positive integer"),
        (("probe.created", {}), {"max_attempts": True}, ValueError, "max_attempts must be a positive integer"),
    ],
)
def test_bad_send_raises_before_writing_and_leaves_the_transaction_usable(args, kwargs, error, match):
    with transaction.atomic():
        with pytest.raises(error, match=match):
            outbox.send(*args, **kwargs)
        Order.objects.create(customer_email="a@example.com", item="mug")  # the transaction goes on
    assert Message.objects.count() == 0
    assert Order.objects.count() == 1


@pytest.mark.parametrize(
    "payload",
    [
        {"emoji": "\U0001f600 fine"},
        {"text": "a literal backslash-u0000: \\u0000"},
        {"text": "a literal backslash-ud800: \\ud800"},
    ],
)
def test_valid_text_that_looks_like_the_refused_escapes_is_stored(payload):
    message = outbox.send("probe.created", payload)
    assert Message.objects.get(pk=message.pk).payload == payload


def test_payload_limit_counts_utf8_bytes_not_characters():
    one_kb = "\u00e9" * 500  # 500 characters, 1,000 bytes in UTF-8 (JSON keeps them escaped: 3,000 bytes)
    with override_settings(OUTBOX={"MAX_PAYLOAD_BYTES": 2000}):
        with pytest.raises(PayloadTooLargeError, match=r"3002 bytes as JSON; OUTBOX\['MAX_PAYLOAD_BYTES'\] is 2000"):
            outbox.send("probe.created", one_kb)
    assert Message.objects.count() == 0


@pytest.mark.parametrize(
    ("outbox_setting", "expected"),
    [
        ({"HANDLER_TIMEOUT_SECONDS": 0}, "django_outbox.E090"),
        ({"HANDLER_TIMEOUT_SECONDS": -5}, "django_outbox.E090"),
        ({"HANDLER_TIMEOUT_SECONDS": "30"}, "django_outbox.E090"),
        ({"HANDLER_TIMEOUT_SECONDS": True}, "django_outbox.E090"),
        ({"HANDLER_TIMEOUT_SECONDS": float("inf")}, "django_outbox.E090"),
        ({"HANDLER_TIMEOUT_SECONDS": float("nan")}, "django_outbox.E090"),
        ({"MAX_PAYLOAD_BYTES": 0}, "django_outbox.E003"),
        ({"MAX_PAYLOAD_BYTES": 1.5}, "django_outbox.E003"),
        ({"TRANSPORTS": ["hooks"]}, "django_outbox.E010"),
        ({"ROUTES": {"": "handler"}}, "django_outbox.E020"),
    ],
)
def test_more_malformed_settings_are_reported_with_stable_ids(outbox_setting, expected):
    with override_settings(OUTBOX=outbox_setting):
        assert expected in outbox_errors()
        with pytest.raises(OutboxImproperlyConfigured, match=expected):
            outbox.send("probe.created", {})
    assert Message.objects.count() == 0


# --- a topic routed to a transport that cannot be loaded -------------------------------------------------
# ``send()`` refuses a topic routed to a transport that cannot be loaded, as ``check`` (E011) and the
# worker do, instead of writing messages that no worker will start to deliver.


HANDLER = "django_outbox.transports.handler.HandlerTransport"


def routed_to(backend: str) -> override_settings:
    return override_settings(
        OUTBOX={"TRANSPORTS": {"billing": {"BACKEND": backend}}, "ROUTES": {"billing.*": "billing"}}
    )


@pytest.mark.parametrize(
    ("backend", "reason"),
    [
        ("no.such.Transport", "Cannot import transport backend 'no.such.Transport'"),
        ("django_outbox.transports.pigeon.CarrierPigeonTransport", "Cannot import transport backend"),  # no such module
        ("django_outbox.api.Outbox", "is not a subclass of django_outbox.transports.BaseTransport"),
        ("django_outbox.api.MAX_ATTEMPTS_LIMIT", "is not a subclass"),
    ],
)
def test_a_topic_routed_to_a_transport_that_cannot_be_loaded_is_refused(backend, reason):
    with routed_to(backend):
        assert [e.id for e in check_settings()] == ["django_outbox.E011"]
        with transaction.atomic():
            with pytest.raises(OutboxImproperlyConfigured, match="routed to transport 'billing'") as raised:
                outbox.send("billing.charged", {"n": 1})
            Order.objects.create(customer_email="a@example.com", item="mug")  # the transaction goes on
        assert reason in str(raised.value) and "E011" in str(raised.value)
        outbox.send("probe.created", {"n": 2})  # topics routed elsewhere are not affected
    assert list(Message.objects.values_list("topic", flat=True)) == ["probe.created"]
    assert Order.objects.count() == 1


def test_the_import_is_tried_once_per_setting_and_again_when_the_setting_changes():
    with routed_to("no.such.Transport"):
        for _ in range(3):
            with pytest.raises(OutboxImproperlyConfigured):
                outbox.send("billing.charged", {})
        assert routing._load_error.cache_info().misses == 1
    with routed_to(HANDLER):  # fixed: setting_changed clears what was cached
        routing.registry.register("billing.*", lambda message: None)
        try:
            outbox.send("billing.charged", {})
            for _ in range(3):
                outbox.send("billing.charged", {})
            assert routing.sending_transport.cache_info().hits >= 3
        finally:
            routing.registry.unregister("billing.*")
    assert Message.objects.count() == 4


def test_a_transport_whose_optional_package_is_missing_may_still_be_sent_to():
    """A web process need not install a broker's client; its workers refuse to start instead (E012)."""
    with routed_to("tests.support.transport_needing_extra.ImaginaryTransport"):
        assert [e.id for e in check_settings()] == ["django_outbox.E012"]
        outbox.send("billing.charged", {"n": 1})
    assert Message.objects.count() == 1
