"""CloudEvents on the wire, read by parsers that are not ours.

The webhook, Kafka and RabbitMQ transports' output is parsed with the CloudEvents SDK for Python
(``cloudevents.core.bindings``), the webhook's also with the SDK for JavaScript; the NATS binding has no
SDK here, so what the NATS transport published is held to the binding's text by a test of its own.
Each message goes through the real worker to the real service on loopback.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Iterator
from typing import Any, cast
from urllib.parse import unquote

import pika
import pytest
import standardwebhooks
from cloudevents.core.base import BaseCloudEvent
from cloudevents.core.bindings import http as ce_http
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.bindings import rabbitmq as ce_rabbitmq
from cloudevents.core.formats.json import JSONFormat
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from django.db import transaction
from django.test import override_settings

from django_outbox import outbox
from django_outbox.models import Message
from tests.support.brokers import relay_until_empty, unique_prefix
from tests.support.receivers import NodeReceiver
from tests.support.services import require_service
from tests.support.tansu import Tansu, running_tansu

pytestmark = [pytest.mark.database_independent, pytest.mark.django_db(transaction=True)]

SECRET = "whsec_8X64pTf2VJY6eApZYqEgNu+kEOBTpP9F"
SOURCE = "https://shop.example.com/orders"
FORMATS = ["cloudevents", "cloudevents-structured"]


def settings_for(backend: str, options: dict[str, Any], pattern: str) -> override_settings:
    return override_settings(
        OUTBOX={
            "CLOUDEVENTS_SOURCE": SOURCE,
            "BACKOFF_BASE_SECONDS": 0.05,
            "BACKOFF_MAX_SECONDS": 0.2,
            "TRANSPORTS": {"out": {"BACKEND": backend, "OPTIONS": options}},
            "ROUTES": {pattern: "out"},
        }
    )


def send_three(prefix: str) -> list[Message]:
    """A keyed message with an idempotency key and a header, a bare one, and one with non-ASCII everywhere."""
    with transaction.atomic():
        return [
            outbox.send(
                f"{prefix}.created",
                {"id": 1, "total": "9.90"},
                key="order-1",
                idempotency_key="order-1:created",
                headers={"tenant": "7"},
            ),
            outbox.send(f"{prefix}.bare", [1, None, "x"]),
            outbox.send(f"{prefix}.created", {"name": "Zürich 📦"}, key="clé ✓", idempotency_key="k é"),
        ]


def relay(sent: list[Message]) -> None:
    relay_until_empty(concurrency=1)
    for message in sent:
        message.refresh_from_db()
        assert message.status == Message.Status.DELIVERED, message.last_error


def expected_time(message: Message) -> dt.datetime:
    created = message.created_at
    if created.tzinfo is None:
        from django.utils import timezone

        created = timezone.make_aware(created, timezone.get_default_timezone())
    return created.astimezone(dt.UTC)


def assert_event(event: BaseCloudEvent, message: Message) -> None:
    """The mapping: id = uuid, source, type = topic, subject = key, time = created_at, data = payload."""
    assert event.get_specversion() == "1.0"
    assert event.get_id() == str(message.uuid)
    assert event.get_source() == SOURCE
    assert event.get_type() == message.topic
    assert event.get_subject() == message.key
    assert event.get_time() == expected_time(message)
    assert (event.get_datacontenttype() or "").startswith("application/json")
    assert event.get_extension("idempotencykey") == message.idempotency_key
    data = event.get_data()
    assert (json.loads(data) if isinstance(data, bytes | str) else data) == message.payload


# --- webhooks --------------------------------------------------------------------------------------------


def webhook_options(url: str, body_format: str) -> dict[str, Any]:
    return {"URL": url, "SECRET": SECRET, "ALLOWED_HOSTS": ["127.0.0.1"], "FORMAT": body_format}


@pytest.mark.parametrize("body_format", FORMATS)
def test_the_python_sdk_reads_the_webhooks_cloudevents_and_the_signature_covers_the_body(server, body_format):
    prefix = unique_prefix()
    backend = "django_outbox.transports.webhook.WebhookTransport"
    with settings_for(backend, webhook_options(server.url(), body_format), f"{prefix}.*"):
        sent = send_three(prefix)
        relay(sent)
    assert len(server.requests) == len(sent)
    by_id = {str(m.uuid): m for m in sent}
    for request in server.requests:
        message = by_id[request.headers["webhook-id"]]
        event = ce_http.from_http(ce_http.HTTPMessage(headers=request.headers, body=request.body), JSONFormat())
        assert_event(event, message)
        # the Standard Webhooks signature and the outbox's headers stay, over the very bytes sent
        standardwebhooks.Webhook(SECRET).verify(request.body, request.headers)
        assert request.headers["webhook-id"] == str(message.uuid)
        assert "idempotency-key" in request.headers
        if body_format == "cloudevents":
            assert request.headers["content-type"] == "application/json"
            assert json.loads(request.body) == message.payload
        else:
            assert request.headers["content-type"] == "application/cloudevents+json"
            assert not any(name.startswith("ce-") for name in request.headers)


@pytest.fixture
def node_receiver() -> Iterator[NodeReceiver]:
    receiver = NodeReceiver(SECRET)
    yield receiver
    receiver.stop()


@pytest.mark.parametrize("body_format", FORMATS)
def test_the_javascript_sdk_reads_the_webhooks_cloudevents(node_receiver, body_format):
    prefix = unique_prefix()
    backend = "django_outbox.transports.webhook.WebhookTransport"
    with settings_for(backend, webhook_options(node_receiver.url(), body_format), f"{prefix}.*"):
        sent = send_three(prefix)
        relay(sent)
    by_id = {str(m.uuid): m for m in sent}
    for line in node_receiver.requests(len(sent)):
        assert line["ok"], line.get("error")  # the signature verified in Node too
        message = by_id[line["headers"]["webhook-id"]]
        event = line["cloudevent"]
        assert event is not None and event["ok"], event
        attributes = event["attributes"]
        if body_format == "cloudevents":
            # The HTTP binding percent-encodes header values outside printable ASCII; the JavaScript SDK (10.0)
            # hands them over still encoded (the Python SDK decodes them), so a Node consumer unquotes.
            attributes = {k: unquote(v) if isinstance(v, str) else v for k, v in attributes.items()}
        assert attributes["specversion"] == "1.0"
        assert attributes["id"] == str(message.uuid)
        assert attributes["source"] == SOURCE
        assert attributes["type"] == message.topic
        assert attributes.get("subject") == message.key
        assert attributes.get("idempotencykey") == message.idempotency_key
        assert dt.datetime.fromisoformat(attributes["time"].replace("Z", "+00:00")) == expected_time(message).replace(
            microsecond=expected_time(message).microsecond // 1000 * 1000
        )
        assert event["data"] == message.payload


# --- Kafka -----------------------------------------------------------------------------------------------


@pytest.fixture
def tansu() -> Iterator[Tansu]:
    with running_tansu() as broker:
        yield broker


def read_kafka(broker: Tansu, topics: list[str], count: int) -> list[ce_kafka.KafkaMessage]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": unique_prefix()})
    consumer.assign([TopicPartition(topic, 0, -2) for topic in topics])
    out: list[ce_kafka.KafkaMessage] = []
    try:
        for _ in range(40):
            for record in consumer.consume(100, timeout=0.5):
                assert record.error() is None
                pairs = cast(list[tuple[str, bytes]], record.headers() or [])
                out.append(ce_kafka.KafkaMessage(headers=dict(pairs), key=record.key(), value=record.value() or b""))
            if len(out) >= count:
                break
    finally:
        consumer.close()
    return out


@pytest.mark.parametrize("body_format", FORMATS)
def test_the_python_sdk_reads_the_kafka_records(tansu, body_format):
    prefix = unique_prefix()
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    topics = [f"{prefix}.created", f"{prefix}.bare"]
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in topics]).values():
        future.result(10)
    options = {"BOOTSTRAP_SERVERS": tansu.bootstrap, "FORMAT": body_format}
    with settings_for("django_outbox.transports.kafka.KafkaTransport", options, f"{prefix}.*"):
        sent = send_three(prefix)
        relay(sent)
    records = read_kafka(tansu, topics, len(sent))
    by_id = {str(m.uuid): m for m in sent}
    assert len(records) == len(sent)
    for record in records:
        message = by_id[record.headers["Outbox-Message-Id"].decode()]
        assert_event(ce_kafka.from_kafka(record, JSONFormat()), message)
        assert record.key == (message.key.encode() if message.key else None)
        assert record.headers["Outbox-Topic"].decode() == message.topic
        if body_format == "cloudevents":
            assert record.headers["content-type"] == b"application/json"
            assert record.headers["ce_id"] == str(message.uuid).encode()
        else:
            assert record.headers["content-type"] == b"application/cloudevents+json"
            assert json.loads(record.value)["data"] == message.payload


# --- RabbitMQ --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("body_format", FORMATS)
def test_the_python_sdk_reads_the_rabbitmq_messages(body_format):
    require_service("RabbitMQ", "127.0.0.1", 5672)
    prefix = unique_prefix()
    url = "amqp://guest:guest@127.0.0.1:5672/%2F"
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel: Any = cast(Any, connection.channel())
    try:
        channel.exchange_declare(prefix, "topic", durable=False, auto_delete=True)
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.queue_bind(queue, prefix, f"{prefix}.#")
        options = {"URL": url, "EXCHANGE": prefix, "FORMAT": body_format}
        with settings_for("django_outbox.transports.amqp.AMQPTransport", options, f"{prefix}.*"):
            sent = send_three(prefix)
            relay(sent)
        received = []
        for method, properties, body in channel.consume(queue, auto_ack=True, inactivity_timeout=3):
            if method is None:
                break
            received.append((properties, body))
            if len(received) == len(sent):
                break
    finally:
        connection.close()
    assert len(received) == len(sent)
    by_id = {str(m.uuid): m for m in sent}
    for properties, body in received:
        message = by_id[properties.message_id]
        headers = {str(k): v.decode() if isinstance(v, bytes) else str(v) for k, v in properties.headers.items()}
        rabbit = ce_rabbitmq.RabbitMQMessage(headers=headers, content_type=properties.content_type, body=body)
        assert_event(ce_rabbitmq.from_rabbitmq(rabbit, JSONFormat()), message)
        assert headers["Outbox-Message-Id"] == properties.message_id == str(message.uuid)
        if body_format == "cloudevents":
            assert properties.content_type == "application/json"
            assert headers["ce-type"] == message.topic
        else:
            assert properties.content_type == "application/cloudevents+json"


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
def test_the_nats_messages_follow_the_nats_binding(body_format):
    """The NATS binding (1.0.x): binary mode puts each attribute in a ``ce-`` header and
    ``datacontenttype`` in ``Content-Type``, the data as the payload; structured mode puts the JSON event
    format in the payload, with ``Content-Type: application/cloudevents+json``."""
    require_service("NATS", "127.0.0.1", 4222)
    prefix = unique_prefix()
    stream = f"CE_{prefix.upper()}"
    options = {
        "SERVERS": "nats://127.0.0.1:4222",
        "STREAM": stream,
        "CREATE_STREAM": True,
        "STREAM_SUBJECTS": [f"{prefix}.>"],
        "FORMAT": body_format,
    }
    with settings_for("django_outbox.transports.nats.NATSTransport", options, f"{prefix}.*"):
        sent = send_three(prefix)
        relay(sent)
    received = asyncio.run(_read_nats(stream, len(sent)))
    assert len(received) == len(sent)
    by_id = {str(m.uuid): m for m in sent}
    for headers, data in received:
        message = by_id[headers["Nats-Msg-Id"]]
        time = expected_time(message).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        expected = {"specversion": "1.0", "id": str(message.uuid), "source": SOURCE, "type": message.topic}
        expected |= {"time": time} | ({"subject": message.key} if message.key else {})
        expected |= {"idempotencykey": message.idempotency_key} if message.idempotency_key else {}
        assert headers["Outbox-Message-Id"] == headers["Nats-Msg-Id"] == str(message.uuid)
        if body_format == "cloudevents":
            attributes = {k[3:]: v for k, v in headers.items() if k.startswith("ce-")}
            assert attributes == expected
            assert headers["Content-Type"] == "application/json"
            assert json.loads(data) == message.payload
        else:
            assert headers["Content-Type"] == "application/cloudevents+json"
            assert not any(k.startswith("ce-") for k in headers)
            event = json.loads(data)
            assert event == {**expected, "datacontenttype": "application/json", "data": message.payload}
