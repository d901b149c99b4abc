"""The Redis Streams transport against the real server on loopback; the consumer is plain redis-py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_outbox.models import Message
from django_outbox.transports.redis import RedisStreamsTransport
from tests.support.brokers import (
    KEYS,
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

HOST, PORT = "127.0.0.1", 6379
BACKEND = "django_outbox.transports.redis.RedisStreamsTransport"


def url(port: int = PORT) -> str:
    return f"redis://{HOST}:{port}/0"


@pytest.fixture
def streams() -> Iterator[tuple[str, Any]]:
    require_service("Redis", HOST, PORT)
    prefix = unique_prefix()
    client: Any = redis.Redis.from_url(url(), decode_responses=True)
    yield prefix, client
    for key in client.scan_iter(f"test:{prefix}.*"):
        client.delete(key)
    client.close()


def read_stream(client: Any, stream: str) -> list[Received]:
    received = []
    for _, fields in client.xrange(stream, "-", "+"):
        received.append(
            Received(
                message_id=fields["id"],
                payload=json.loads(fields["payload"]),
                key=fields.get("key"),
                idempotency_key=fields.get("idempotency_key"),
                headers=json.loads(fields["headers"]),
            )
        )
        assert fields["topic"] == stream.removeprefix("test:")
    return received


def test_worker_relays_1000_messages_with_ids_headers_payload_and_key_order(streams):
    prefix, client = streams
    with outbox_settings("streams", BACKEND, {"URL": url(), "STREAM": "test:{topic}"}, f"{prefix}.*"):
        sent = send_many(f"{prefix}.orders", 1000)
        relay = relay_until_empty()
    assert relay.stats.delivered == 1000
    assert count_status(Message.Status.DELIVERED) == 1000
    assert_all_received(sent, read_stream(client, f"test:{prefix}.orders"))


def test_stream_name_comes_from_the_topic_template(streams):
    prefix, client = streams
    with outbox_settings("streams", BACKEND, {"URL": url(), "STREAM": "test:{topic}:v1"}, f"{prefix}.*"):
        orders = send_many(f"{prefix}.orders", 3)
        refunds = send_many(f"{prefix}.refunds", 2, start=3)
        relay_until_empty()
    # Each message in its topic's stream, once. (These have one key each: order across keys is not kept
    # when delivery threads relay keys side by side.)
    assert sorted(r.message_id for r in read_stream_raw(client, f"test:{prefix}.orders:v1")) == sorted(
        str(m.uuid) for m in orders
    )
    assert sorted(r.message_id for r in read_stream_raw(client, f"test:{prefix}.refunds:v1")) == sorted(
        str(m.uuid) for m in refunds
    )


def read_stream_raw(client: Any, stream: str) -> list[Received]:
    return [
        Received(
            message_id=f["id"], payload=json.loads(f["payload"]), key=f.get("key"), idempotency_key=None, headers={}
        )
        for _, f in client.xrange(stream, "-", "+")
    ]


def test_approximate_maxlen_trims_the_stream(streams):
    prefix, client = streams
    options = {"URL": url(), "STREAM": "test:{topic}", "MAXLEN": 100}
    with outbox_settings("streams", BACKEND, options, f"{prefix}.*"):
        sent = send_many(f"{prefix}.orders", 1000)
        relay_until_empty()
    length = client.xlen(f"test:{prefix}.orders")
    assert 100 <= length < 1000  # approximate: trimmed in whole macro nodes, never below MAXLEN
    newest = client.xrevrange(f"test:{prefix}.orders", "+", "-", count=1)[0][1]
    # Trimming kept the newest end. Keys are ordered, not the messages of different keys (delivery
    # threads relay keys side by side), so the newest entry is the last message of one of the keys.
    assert newest["id"] in {str(m.uuid) for m in sent[-len(KEYS) :]}


def test_an_error_reply_fails_only_that_message(streams):
    prefix, client = streams
    client.set(f"test:{prefix}.clash", "not a stream")
    with outbox_settings("streams", BACKEND, {"URL": url(), "STREAM": "test:{topic}"}, f"{prefix}.*"):
        good = send_many(f"{prefix}.orders", 2)
        (bad,) = send_many(f"{prefix}.clash", 1, start=2)
        transport = RedisStreamsTransport(name="streams", options={"URL": url(), "STREAM": "test:{topic}"})
        try:
            results = transport.deliver_batch([good[0], bad, good[1]])
        finally:
            transport.close()
    assert results[0] is None and results[2] is None
    assert "WRONGTYPE" in str(results[1])


def test_outage_fails_attempts_then_the_worker_reconnects_and_nothing_is_lost(streams):
    prefix, client = streams
    proxy = FlakyProxy(HOST, PORT)
    try:
        options = {"URL": url(proxy.port), "STREAM": "test:{topic}", "SOCKET_TIMEOUT": 1.0}
        sent = relay_through_outage(proxy, "streams", BACKEND, options, prefix)
    finally:
        proxy.close()
    assert_all_received(sent, read_stream(client, f"test:{prefix}.orders"), once=False, in_order=False)
