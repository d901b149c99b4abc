"""The RabbitMQ transport against the real broker on loopback; the consumer is plain pika."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, cast

import pika
import pytest

from django_outbox.models import Message
from django_outbox.transports.amqp import AMQPTransport
from tests.support.brokers import (
    FlakyProxy,
    Received,
    assert_all_received,
    count_status,
    outbox_settings,
    relay_through_outage,
    relay_until_empty,
    send_many,
    unique_prefix,
)
from tests.support.services import require_service

pytestmark = [pytest.mark.database_independent, pytest.mark.django_db(transaction=True)]

HOST, PORT = "127.0.0.1", 5672
BACKEND = "django_outbox.transports.amqp.AMQPTransport"


def url(port: int = PORT) -> str:
    return f"amqp://guest:guest@{HOST}:{port}/%2F"


class Consumer:
    """An exclusive queue bound to the test's exchange for the test's topics."""

    def __init__(self, exchange: str, binding: str) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(url()))
        self.channel: Any = cast(Any, self.connection.channel())  # the stubs are stricter than pika
        self.channel.exchange_declare(exchange, "topic", durable=False, auto_delete=True)
        self.queue = self.channel.queue_declare("", exclusive=True).method.queue
        self.channel.queue_bind(self.queue, exchange, binding)
        self.exchange = exchange

    def read(self, expected: int, idle: float = 3.0) -> list[Received]:
        received: list[Received] = []
        for method, properties, body in self.channel.consume(self.queue, auto_ack=True, inactivity_timeout=idle):
            if method is None:
                break
            assert properties.content_type == "application/json"
            assert properties.delivery_mode == 2
            headers = properties.headers or {}
            assert headers["Outbox-Message-Id"] == properties.message_id
            assert method.routing_key == headers["Outbox-Topic"]
            received.append(
                Received(
                    message_id=properties.message_id,
                    payload=json.loads(body),
                    key=headers.get("Outbox-Key"),
                    idempotency_key=headers.get("Idempotency-Key"),
                    headers=headers,
                )
            )
            if len(received) >= expected:
                break
        self.channel.cancel()
        return received

    def close(self) -> None:
        self.channel.exchange_delete(self.exchange)
        self.connection.close()


@pytest.fixture
def rabbit() -> Iterator[tuple[str, Consumer]]:
    require_service("RabbitMQ", HOST, PORT)
    prefix = unique_prefix()
    consumer = Consumer(f"outbox.test.{prefix}", f"{prefix}.#")
    yield prefix, consumer
    consumer.close()


def options(exchange: str, **more: Any) -> dict[str, Any]:
    return {"URL": url(), "EXCHANGE": exchange, **more}


def test_worker_relays_1000_messages_with_ids_headers_payload_and_key_order(rabbit):
    prefix, consumer = rabbit
    with outbox_settings("rabbit", BACKEND, options(consumer.exchange), f"{prefix}.*"):
        sent = send_many(f"{prefix}.orders", 1000)
        relay = relay_until_empty()
    assert relay.stats.delivered == 1000
    assert count_status(Message.Status.DELIVERED) == 1000
    assert_all_received(sent, consumer.read(1000))


SLOW_RETRY = {"BACKOFF_BASE_SECONDS": 60, "BACKOFF_MAX_SECONDS": 120}


def test_unroutable_message_is_a_failed_attempt(rabbit):
    _, consumer = rabbit
    # a retry a minute away: with 50 ms, a loaded machine's next claim came after it and saw attempt 2
    with outbox_settings("rabbit", BACKEND, options(consumer.exchange), "*", **SLOW_RETRY):
        (message,) = send_many("nobody.listens", 1)
        relay_until_empty()
    message.refresh_from_db()
    assert message.status == Message.Status.PENDING
    assert message.attempts == 1
    assert "unroutable" in message.last_error and "312 NO_ROUTE" in message.last_error


def test_missing_exchange_fails_the_attempt_and_declare_exchange_creates_it(rabbit):
    prefix, consumer = rabbit
    missing = f"outbox.test.{prefix}.missing"
    with outbox_settings("rabbit", BACKEND, options(missing), f"{prefix}.*"):
        (message,) = send_many(f"{prefix}.orders", 1)
        relay_until_empty()
    message.refresh_from_db()
    assert message.status == Message.Status.PENDING
    assert "NOT_FOUND" in message.last_error and missing in message.last_error

    declared = options(missing, DECLARE_EXCHANGE=True, MANDATORY=False)
    transport = AMQPTransport(name="rabbit", options=declared)
    try:
        assert transport.deliver_batch([message]) == [None]
    finally:
        transport.close()
    consumer.channel.exchange_delete(missing)


def test_connection_is_reused_across_batches(rabbit):
    prefix, consumer = rabbit
    with outbox_settings("rabbit", BACKEND, options(consumer.exchange), f"{prefix}.*"):
        messages = send_many(f"{prefix}.orders", 6)
        transport = AMQPTransport(name="rabbit", options=options(consumer.exchange))
        try:
            assert transport.deliver_batch(messages[:3]) == [None] * 3
            first = transport._connection
            assert transport.deliver_batch(messages[3:]) == [None] * 3
            assert transport._connection is first
        finally:
            transport.close()
    assert_all_received(messages, consumer.read(6))


def test_outage_fails_attempts_then_the_worker_reconnects_and_nothing_is_lost(rabbit):
    prefix, consumer = rabbit
    proxy = FlakyProxy(HOST, PORT)
    try:
        settings = options(consumer.exchange, URL=url(proxy.port), CONNECT_TIMEOUT=1.0, CONFIRM_TIMEOUT=2.0)
        sent = relay_through_outage(proxy, "rabbit", BACKEND, settings, prefix)
    finally:
        proxy.close()
    assert_all_received(sent, consumer.read(100), once=False, in_order=False)
