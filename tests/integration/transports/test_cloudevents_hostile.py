"""CloudEvents with hostile attributes and payloads, read back by parsers that are not ours.

Topics, keys and idempotency keys at their longest and full of non-ASCII text, a long source, and
payloads that are not JSON objects (a list, a string, a number, a boolean, null): each goes through the
real worker to a real Kafka-protocol broker, HTTP server and NATS server, and what arrives is parsed
by the CloudEvents SDK for Python (NATS, which no SDK binds, is held to the binding's text). A line
break in any value that becomes a header is refused by ``send()``, before anything is written.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from cloudevents.core.base import BaseCloudEvent
from cloudevents.core.bindings import http as ce_http
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from django.db import transaction

from django_outbox import outbox
from django_outbox.limits import IDEMPOTENCY_KEY_MAX_LENGTH, KEY_MAX_LENGTH, TOPIC_MAX_LENGTH
from django_outbox.models import Message
from tests.integration.transports.test_cloudevents import (
    FORMATS,
    expected_time,
    read_kafka,
    relay,
    settings_for,
    webhook_options,
)
from tests.support.brokers import unique_prefix
from tests.support.services import require_service
from tests.support.tansu import Tansu, running_tansu

pytestmark = [pytest.mark.database_independent, pytest.mark.django_db(transaction=True)]

#: Payloads that are JSON but not an object: each is the event's ``data`` exactly.
PAYLOADS: list[Any] = [[1, "x", None], "just text ✓", 42, -0.5, True, None, [], {}]


def _longest(prefix: str, limit: int, filler: str) -> str:
    """``prefix`` padded with ``filler`` (non-ASCII, 4-byte UTF-8 included) to exactly ``limit`` characters."""
    text = prefix + (filler * limit)
    return text[:limit]


def send_hostile(prefix: str) -> list[Message]:
    """One message per payload, each with the longest non-ASCII topic, key and idempotency key send() takes."""
    topic = _longest(f"{prefix}.", TOPIC_MAX_LENGTH, "é📦")
    with transaction.atomic():
        return [
            outbox.send(
                topic,
                payload,
                key=_longest(f"{n}-", KEY_MAX_LENGTH, "ключ✓"),
                idempotency_key=_longest(f"{prefix}-{n}-", IDEMPOTENCY_KEY_MAX_LENGTH, "ü-🔑"),
            )
            for n, payload in enumerate(PAYLOADS)
        ]


#: A long source, as a URI reference (percent-encoded where it must be): 2,000 characters.
SOURCE = "https://shop.example.com/" + "caf%C3%A9/" * 197


def hostile_settings(backend: str, options: dict[str, Any], pattern: str) -> Any:
    override = settings_for(backend, options, pattern)
    override.options["OUTBOX"] = {**override.options["OUTBOX"], "CLOUDEVENTS_SOURCE": SOURCE}
    return override


def assert_hostile_event(event: BaseCloudEvent, message: Message, body_format: str) -> None:
    assert event.get_id() == str(message.uuid)
    assert event.get_source() == SOURCE
    assert event.get_type() == message.topic
    assert event.get_subject() == message.key
    assert event.get_extension("idempotencykey") == message.idempotency_key
    assert event.get_time() == expected_time(message)
    # The SDK decodes the data by its datacontenttype (application/json) in both modes: whatever JSON
    # value the payload is (a list, a string, a number, null), the event's data is that value.
    assert event.get_data() == message.payload, body_format


# --- Kafka -----------------------------------------------------------------------------------------------


@pytest.fixture
def tansu() -> Iterator[Tansu]:
    with running_tansu() as broker:
        yield broker


@pytest.mark.parametrize("body_format", FORMATS)
def test_the_python_sdk_reads_hostile_kafka_records(tansu, body_format):
    prefix = unique_prefix()
    kafka_topic = f"{prefix}.all"
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    for future in admin.create_topics([NewTopic(kafka_topic, 1, 1)]).values():
        future.result(10)
    options = {"BOOTSTRAP_SERVERS": tansu.bootstrap, "FORMAT": body_format, "TOPIC": kafka_topic}
    with hostile_settings("django_outbox.transports.kafka.KafkaTransport", options, f"{prefix}.*"):
        sent = send_hostile(prefix)
        relay(sent)
    records = read_kafka(tansu, [kafka_topic], len(sent))
    assert len(records) == len(sent)
    by_id = {str(m.uuid): m for m in sent}
    for record in records:
        message = by_id[record.headers["Outbox-Message-Id"].decode()]
        assert_hostile_event(ce_kafka.from_kafka(record, JSONFormat()), message, body_format)
        assert record.key == message.key.encode()
        assert record.headers["Outbox-Topic"].decode() == message.topic


# --- webhooks --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("body_format", FORMATS)
def test_the_python_sdk_reads_hostile_webhooks(server, body_format):
    prefix = unique_prefix()
    backend = "django_outbox.transports.webhook.WebhookTransport"
    with hostile_settings(backend, webhook_options(server.url(), body_format), f"{prefix}.*"):
        sent = send_hostile(prefix)
        relay(sent)
    assert len(server.requests) == len(sent)
    by_id = {str(m.uuid): m for m in sent}
    for request in server.requests:
        message = by_id[request.headers["webhook-id"]]
        assert all(value.isascii() and value.isprintable() for value in request.headers.values())
        event = ce_http.from_http(ce_http.HTTPMessage(headers=request.headers, body=request.body), JSONFormat())
        assert_hostile_event(event, message, body_format)


# --- NATS ------------------------------------------------------------------------------------------------


async def _read_nats(stream: str, count: int) -> list[tuple[dict[str, str], bytes]]:
    import nats

    nc = await nats.connect("nats://127.0.0.1:4222")
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe("", stream=stream)
        msgs = await sub.fetch(count, timeout=5)
        for msg in msgs:
            await msg.ack()
        await js.delete_stream(stream)
        return [(dict(msg.headers or {}), msg.data) for msg in msgs]
    finally:
        await nc.close()


@pytest.mark.parametrize("body_format", FORMATS)
def test_hostile_nats_messages_carry_every_attribute_unchanged(body_format):
    require_service("NATS", "127.0.0.1", 4222)
    prefix = unique_prefix()
    stream = f"CEH_{prefix.upper()}"
    options = {
        "SERVERS": "nats://127.0.0.1:4222",
        "SUBJECT": f"{prefix}.all",
        "STREAM": stream,
        "CREATE_STREAM": True,
        "STREAM_SUBJECTS": [f"{prefix}.>"],
        "FORMAT": body_format,
    }
    with hostile_settings("django_outbox.transports.nats.NATSTransport", options, f"{prefix}.*"):
        sent = send_hostile(prefix)
        relay(sent)
    received = asyncio.run(_read_nats(stream, len(sent)))
    assert len(received) == len(sent)
    by_id = {str(m.uuid): m for m in sent}
    for headers, data in received:
        message = by_id[headers["Nats-Msg-Id"]]
        assert headers["Outbox-Key"] == message.key and headers["Outbox-Topic"] == message.topic
        assert headers["Idempotency-Key"] == message.idempotency_key
        if body_format == "cloudevents":
            assert headers["ce-subject"] == message.key and headers["ce-type"] == message.topic
            assert headers["ce-source"] == SOURCE
            assert json.loads(data) == message.payload
        else:
            event = json.loads(data)
            assert (event["subject"], event["type"], event["data"]) == (message.key, message.topic, message.payload)


# --- line breaks -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["topic", "key", "idempotency_key"])
@pytest.mark.parametrize("brk", ["\r\n", "\n", "\r"])
def test_a_line_break_in_a_value_carried_as_a_header_is_refused_by_send(field, brk):
    """Topic, key and idempotency key travel as header values on every transport (``Outbox-Topic``,
    ``ce-subject``, ...). NATS's client turns a line break there into a space, so the consumer would read
    another key than the one sent: refused at ``send()``, like a line break in a header's value."""
    values = {"topic": "orders.created", "key": "order-1", "idempotency_key": "order-1:created"}
    values[field] = f"{values[field]}{brk}Nats-Msg-Id: forged"
    with pytest.raises(ValueError, match="line break"), transaction.atomic():
        outbox.send(values["topic"], {"id": 1}, key=values["key"], idempotency_key=values["idempotency_key"])
    assert not Message.objects.exists()
