"""Plain regressions for what the property tests of send() found or decided (tests/test_send_properties.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings

from django_outbox import PayloadTooLargeError, outbox
from django_outbox.limits import PAYLOAD_MAX_DEPTH
from django_outbox.models import Message
from testproject.shop.models import Order

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
    deep: Any = 1
    for _ in range(PAYLOAD_MAX_DEPTH):
        deep = [deep]
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
