"""The CloudEvents envelope the four transports share: attributes, encodings, and the checks of its settings."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import pytest
from django.test import override_settings

from django_outbox.models import Message
from django_outbox.transports import cloudevents
from tests.support.checks import outbox_ids

SENT_AT = dt.datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)
ID = uuid.UUID("0193a1b2-0000-7000-8000-000000000001")


def message(**fields: Any) -> Message:
    values: dict[str, Any] = {"uuid": ID, "topic": "orders.created", "payload": {"id": 7}, "created_at": SENT_AT}
    return Message(**{**values, **fields})


def test_the_attributes_map_the_message_in_the_specifications_order():
    found = cloudevents.attributes(message(key="order-7", idempotency_key="order-7:created"))
    assert found == {
        "specversion": "1.0",
        "id": str(ID),
        "source": "/django-outbox",
        "type": "orders.created",
        "subject": "order-7",
        "time": "2026-12-01T12:00:00.123456Z",
        "datacontenttype": "application/json",
        "idempotencykey": "order-7:created",
    }


def test_without_key_or_idempotency_key_there_is_no_subject_nor_extension():
    assert set(cloudevents.attributes(message())) == {"specversion", "id", "source", "type", "time", "datacontenttype"}


@override_settings(OUTBOX={"CLOUDEVENTS_SOURCE": "https://shop.example.com/orders"})
def test_the_source_is_the_setting():
    assert cloudevents.attributes(message())["source"] == "https://shop.example.com/orders"


@override_settings(USE_TZ=False, TIME_ZONE="America/New_York")
def test_a_naive_created_at_is_wall_clock_time_in_time_zone():
    naive = dt.datetime(2026, 12, 1, 7, 0, 0)
    assert cloudevents.attributes(message(created_at=naive))["time"] == "2026-12-01T12:00:00.000000Z"


def test_the_structured_event_carries_the_payload_as_data():
    event = json.loads(cloudevents.structured(message(payload=["é", None, 1.5])))
    assert event["data"] == ["é", None, 1.5]
    assert event["id"] == str(ID) and event["datacontenttype"] == "application/json"


def test_binary_headers_leave_the_content_type_to_the_protocol_and_take_its_prefix():
    headers = cloudevents.binary_headers(message(key="k"), "ce_")
    assert "ce_datacontenttype" not in headers
    assert headers["ce_subject"] == "k" and headers["ce_id"] == str(ID)


def test_http_header_values_are_percent_encoded_outside_printable_ascii():
    headers = cloudevents.binary_headers(message(key='clé "a" 100%'), "ce-", percent_encode=True)
    assert headers["ce-subject"] == "cl%C3%A9%20%22a%22%20100%25"
    # and a broker header keeps the text as it is
    assert cloudevents.binary_headers(message(key="clé"), "ce-")["ce-subject"] == "clé"


@pytest.mark.parametrize("source", ["/django-outbox", "https://shop.example.com/orders?x=1#y", "urn:uuid:1", "/a%20b"])
def test_a_uri_reference_passes_the_check(source):
    assert outbox_ids(CLOUDEVENTS_SOURCE=source) == []


@pytest.mark.parametrize("source", ["", "a b", "é", "100%", "/a%zz", "x" * 2049, 5, None, "/a\nb", "/a\x00"])
def test_what_is_not_a_uri_reference_is_e091(source):
    assert outbox_ids(CLOUDEVENTS_SOURCE=source) == ["django_outbox.E091"]


@pytest.mark.parametrize(
    ("backend", "options"),
    [
        ("django_outbox.transports.amqp.AMQPTransport", {"URL": "amqp://h", "EXCHANGE": "x"}),
        ("django_outbox.transports.nats.NATSTransport", {"SERVERS": "nats://h"}),
        ("django_outbox.transports.kafka.KafkaTransport", {"BOOTSTRAP_SERVERS": "h:9092"}),
    ],
)
@pytest.mark.parametrize(
    ("value", "ids"),
    [
        *((f, []) for f in cloudevents.BROKER_FORMATS),
        ("standard-webhooks", ["django_outbox.E051"]),
        ("CloudEvents", ["django_outbox.E051"]),
        (None, ["django_outbox.E051"]),
    ],
)
def test_the_brokers_format_option(backend, options, value, ids):
    with override_settings(OUTBOX={"TRANSPORTS": {"b": {"BACKEND": backend, "OPTIONS": {**options, "FORMAT": value}}}}):
        from django_outbox.checks import check_settings

        assert [c.id for c in check_settings()] == ids
