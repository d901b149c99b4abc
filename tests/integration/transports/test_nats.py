"""The NATS JetStream transport against the real server on loopback; the consumer is plain nats-py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import nats
import nats.js.errors
import pytest
from opentelemetry import trace

from django_outbox.models import Message
from django_outbox.observability.tracing import DeliveryTracer
from django_outbox.transports.nats import NATSTransport
from django_outbox.worker import Relay, RelayConfig
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
from tests.support.checks import NATS_STREAMS
from tests.support.services import require_service
from tests.support.tracing import memory_exporter, traceparent

pytestmark = [pytest.mark.database_independent, pytest.mark.django_db(transaction=True)]

HOST, PORT = "127.0.0.1", 4222
BACKEND = "django_outbox.transports.nats.NATSTransport"


def server(port: int = PORT) -> str:
    return f"nats://{HOST}:{port}"


async def _read(stream: str) -> list[tuple[str, dict[str, str], bytes]]:
    nc = await nats.connect(server())
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        sub = await js.pull_subscribe("", stream=stream)
        out: list[tuple[str, dict[str, str], bytes]] = []
        while len(out) < info.state.messages:
            for msg in await sub.fetch(min(500, info.state.messages - len(out)), timeout=5):
                out.append((msg.subject, dict(msg.headers or {}), msg.data))
                await msg.ack()
        return out
    finally:
        await nc.close()


def read_stream(stream: str) -> list[Received]:
    received = []
    for subject, headers, data in asyncio.run(_read(stream)):
        assert headers["Nats-Msg-Id"] == headers["Outbox-Message-Id"]
        assert subject == headers["Outbox-Topic"]
        received.append(
            Received(
                message_id=headers["Nats-Msg-Id"],
                payload=json.loads(data),
                key=headers.get("Outbox-Key"),
                idempotency_key=headers.get("Idempotency-Key"),
                headers=headers,
            )
        )
    return received


async def _delete_stream(stream: str) -> None:
    nc = await nats.connect(server())
    try:
        await nc.jetstream().delete_stream(stream)
    except nats.js.errors.NotFoundError:
        pass
    finally:
        await nc.close()


@pytest.fixture
def jetstream() -> Iterator[tuple[str, str]]:
    require_service("NATS", HOST, PORT)
    prefix = unique_prefix()
    stream = f"OUTBOX_TEST_{prefix.upper()}"
    yield prefix, stream
    asyncio.run(_delete_stream(stream))


def options(prefix: str, stream: str, **more: Any) -> dict[str, Any]:
    return {
        "SERVERS": server(),
        "STREAM": stream,
        "CREATE_STREAM": True,
        "STREAM_SUBJECTS": [f"{prefix}.>"],
        **more,
    }


def test_worker_relays_1000_messages_with_ids_headers_payload_and_key_order(jetstream):
    prefix, stream = jetstream
    with outbox_settings("js", BACKEND, options(prefix, stream), f"{prefix}.*"):
        sent = send_many(f"{prefix}.orders", 1000)
        relay = relay_until_empty()
    assert relay.stats.delivered == 1000
    assert count_status(Message.Status.DELIVERED) == 1000
    assert_all_received(sent, read_stream(stream))


def test_server_drops_a_republished_message_by_its_msg_id(jetstream):
    prefix, stream = jetstream
    with outbox_settings("js", BACKEND, options(prefix, stream), f"{prefix}.*"):
        sent = send_many(f"{prefix}.orders", 5)
        transport = NATSTransport(name="js", options=options(prefix, stream))
        try:
            assert transport.deliver_batch(sent) == [None] * 5
            # as after a lost PubAck: the worker publishes the same messages again
            assert transport.deliver_batch(sent[:3]) == [None] * 3
        finally:
            transport.close()
    assert_all_received(sent, read_stream(stream))


def test_missing_stream_is_a_clear_failed_attempt(jetstream):
    prefix, _ = jetstream
    with outbox_settings("js", BACKEND, {"SERVERS": server()}, f"{prefix}.*"):
        (message,) = send_many(f"{prefix}.orders", 1)
        relay_until_empty()
    message.refresh_from_db()
    assert message.status == Message.Status.PENDING
    assert f"no JetStream stream captures subject '{prefix}.orders'" in message.last_error
    assert "CREATE_STREAM" in message.last_error


def test_outage_fails_attempts_then_the_worker_reconnects_and_nothing_is_lost(jetstream):
    prefix, stream = jetstream
    proxy = FlakyProxy(HOST, PORT)
    try:
        settings = options(prefix, stream, SERVERS=server(proxy.port), CONNECT_TIMEOUT=1.0, ACK_TIMEOUT=2.0)
        sent = relay_through_outage(proxy, "js", BACKEND, settings, prefix)
    finally:
        proxy.close()
    # the server's duplicate window absorbs republished messages, so even here each arrives once
    assert_all_received(sent, read_stream(stream), in_order=False)


@pytest.mark.parametrize(("stream", "works"), [s for s in NATS_STREAMS if s[0]])
def test_the_nats_stream_verdicts_match_the_real_server(stream, works):
    require_service("NATS", "127.0.0.1", 4222)

    async def create() -> bool:
        nc = await nats.connect("nats://127.0.0.1:4222", connect_timeout=5)
        try:
            js = nc.jetstream()
            try:
                await js.add_stream(name=stream, subjects=["outbox-check-probe.x"])
            except Exception:
                return False
            await js.delete_stream(stream)
            return True
        finally:
            await nc.close()

    assert asyncio.run(create()) == works


def test_the_delivery_spans_trace_context_travels_in_the_nats_headers(jetstream):
    """W3C trace context over NATS: the published messages' ``traceparent`` is the worker's delivery span,
    which links each sender's span (a batch published in one call is one span), so a consumer's span
    continues from the delivery and reaches the view through the links."""
    prefix, stream = jetstream
    exporter = memory_exporter()
    with outbox_settings("js", BACKEND, options(prefix, stream), f"{prefix}.*"):
        with trace.get_tracer("tests").start_as_current_span("POST /orders") as view:
            sent = send_many(f"{prefix}.orders", 2)
        assert all(m.headers["traceparent"] == traceparent(view) for m in sent)
        exporter.clear()
        Relay(RelayConfig.from_settings(until_empty=True, notify=False), observers=[DeliveryTracer()]).drain()
    (span,) = [s for s in exporter.get_finished_spans() if s.name == f"process {prefix}.orders"]
    assert span.attributes["messaging.batch.message_count"] == 2
    assert [link.context.span_id for link in span.links] == [view.get_span_context().span_id] * 2
    received = read_stream(stream)
    assert len(received) == 2
    assert {r.headers["traceparent"] for r in received} == {traceparent(span)}
    assert count_status(Message.Status.DELIVERED) == 2
