"""What the webhook transport POSTs: the Standard Webhooks envelope or the bare payload, byte for byte."""

from __future__ import annotations

import datetime as dt
import json
import zoneinfo

import pytest
from django.core.checks import run_checks
from django.test import override_settings

from django_outbox.models import Message
from django_outbox.webhooks.transport import FORMATS, PAYLOAD, STANDARD_WEBHOOKS, utc_timestamp, webhook_body

BACKEND = "django_outbox.transports.webhook.WebhookTransport"
SECRET = "whsec_8X64pTf2VJY6eApZYqEgNu+kEOBTpP9F"
SENT_AT = dt.datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)


def message(payload: object, topic: str = "orders.created", created_at: dt.datetime = SENT_AT) -> Message:
    return Message(topic=topic, payload=payload, created_at=created_at)


def test_the_default_body_is_the_standard_webhooks_envelope():
    body = webhook_body(message({"id": 7, "total": "9.90"}))
    assert body == b'{"type":"orders.created","timestamp":"2026-12-01T12:00:00.123456Z","data":{"id":7,"total":"9.90"}}'
    assert webhook_body(message({"id": 7}), STANDARD_WEBHOOKS) == webhook_body(message({"id": 7}))


def test_the_payload_format_is_the_bare_payload_as_before():
    assert webhook_body(message({"id": 7, "total": "9.90"}), PAYLOAD) == b'{"id":7,"total":"9.90"}'


@pytest.mark.parametrize("payload", [[1, "two", None], "just a string", 0, -1.5, 10**30, True, None, {}, []])
def test_any_json_payload_is_the_data(payload):
    """A payload need not be an object: lists, strings, numbers and null go in "data" as they are."""
    envelope = json.loads(webhook_body(message(payload)))
    assert envelope == {"type": "orders.created", "timestamp": "2026-12-01T12:00:00.123456Z", "data": payload}
    assert json.loads(webhook_body(message(payload), PAYLOAD)) == payload


def test_non_ascii_topics_and_payloads_are_escaped_and_read_back_the_same():
    topic = "заказы.создан ✓ 🚚"
    body = webhook_body(message({"name": "Ann ✓", "città": "Zürich"}, topic=topic))
    assert body.isascii()  # escaped: the bytes signed are the bytes sent, whatever the receiver's decoding
    envelope = json.loads(body)
    assert envelope["type"] == topic
    assert envelope["data"] == {"name": "Ann ✓", "città": "Zürich"}


def test_a_huge_payload_is_wrapped_whole():
    payload = {"rows": ["x" * 1000] * 5000}  # 5 MB
    body = webhook_body(message(payload))
    assert len(body) > 5_000_000
    assert json.loads(body)["data"] == payload


@pytest.mark.parametrize(
    ("when", "expected"),
    [
        (SENT_AT, "2026-12-01T12:00:00.123456Z"),
        (dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC), "2026-12-01T12:00:00.000000Z"),  # always 6 digits
        (
            dt.datetime(2026, 12, 1, 7, 0, 0, 5, tzinfo=zoneinfo.ZoneInfo("America/New_York")),
            "2026-12-01T12:00:00.000005Z",
        ),
        (dt.datetime(2026, 7, 1, 23, 30, tzinfo=dt.timezone(dt.timedelta(hours=-3))), "2026-07-02T02:30:00.000000Z"),
    ],
)
def test_timestamps_are_utc_iso_8601_with_microseconds(when, expected):
    assert utc_timestamp(when) == expected


@override_settings(USE_TZ=False, TIME_ZONE="America/New_York")
def test_a_naive_time_is_read_in_time_zone_as_django_stores_it():
    """With USE_TZ = False, created_at is wall-clock time in TIME_ZONE: not UTC, five hours off in winter."""
    assert utc_timestamp(dt.datetime(2026, 12, 1, 7, 0)) == "2026-12-01T12:00:00.000000Z"
    assert utc_timestamp(dt.datetime(2026, 7, 1, 8, 0)) == "2026-07-01T12:00:00.000000Z"  # daylight saving time
    envelope = json.loads(webhook_body(message({"id": 1}, created_at=dt.datetime(2026, 12, 1, 7, 0, 0, 42))))
    assert envelope["timestamp"] == "2026-12-01T12:00:00.000042Z"


@override_settings(USE_TZ=False, TIME_ZONE="Asia/Kolkata")
def test_a_naive_time_in_a_half_hour_zone():
    assert utc_timestamp(dt.datetime(2026, 12, 1, 17, 30)) == "2026-12-01T12:00:00.000000Z"


def check_ids(options: dict[str, object]) -> list[tuple[str, str, str]]:
    transports = {
        "hooks": {"BACKEND": BACKEND, "OPTIONS": {"URL": "https://h.example.com/in", "SECRET": SECRET, **options}}
    }
    with override_settings(OUTBOX={"TRANSPORTS": transports}):
        return [(m.id, m.msg, m.hint or "") for m in run_checks() if m.id and m.id.startswith("django_outbox.")]


@pytest.mark.parametrize("value", FORMATS)
def test_every_format_passes_the_check(value):
    assert check_ids({"FORMAT": value}) == []


@pytest.mark.parametrize(
    "value",
    [
        "CloudEvents",
        "cloudevents-binary",
        "Standard-Webhooks",
        "standard_webhooks",
        "",
        " payload",
        1,
        None,
        True,
        ["payload"],
        {"payload": 1},
        b"payload",
    ],
)
def test_a_bad_format_is_e049_naming_the_choices(value):
    ((check_id, text, hint),) = check_ids({"FORMAT": value})
    assert check_id == "django_outbox.E049"
    assert "['FORMAT'] must be one of 'standard-webhooks', 'payload', 'cloudevents', 'cloudevents-structured'" in text
    assert "'cloudevents' (CloudEvents binary mode)" in hint
