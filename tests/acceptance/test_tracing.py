"""OpenTelemetry across a real worker process: the sender's context stored by ``send()``, continued by the
worker's delivery spans, and passed on to a real HTTP receiver and a real RabbitMQ broker."""

from __future__ import annotations

import json
from typing import Any

import pika
import pytest
from django.conf import settings
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from django_outbox import outbox
from django_outbox.models import Message
from django_outbox.webhooks import new_secret
from tests.support.brokers import unique_prefix
from tests.support.servers import HTTPServer
from tests.support.services import require_service
from tests.support.tracing import memory_exporter, read_spans, traceparent
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


@pytest.fixture
def tracer() -> trace.Tracer:
    memory_exporter().clear()
    return trace.get_tracer("tests")


def test_send_stores_the_active_span_as_traceparent(tracer):
    with tracer.start_as_current_span("POST /orders") as span:
        message = outbox.send("probe.ok", {}, headers={"tenant": "7"})
    assert message.headers == {"tenant": "7", "traceparent": traceparent(span)}
    message.refresh_from_db()
    assert message.headers["traceparent"] == traceparent(span)
    assert [s.name for s in memory_exporter().get_finished_spans()] == ["POST /orders"]


def test_no_active_span_no_header(tracer):
    assert "traceparent" not in outbox.send("probe.ok", {}).headers


def test_a_traceparent_of_the_caller_is_kept(tracer):
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with tracer.start_as_current_span("view"):
        message = outbox.send("probe.ok", {}, headers={"Traceparent": own, "tracestate": "k=v"})
    assert message.headers == {"Traceparent": own, "tracestate": "k=v"}


def remote_parent(tracestate: str) -> Any:
    """A context continuing a trace from elsewhere, so the spans started in it carry that tracestate."""
    carrier = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": tracestate}
    return TraceContextTextMapPropagator().extract(carrier)


@pytest.mark.parametrize("span_state", ["vendor=abc", ""], ids=["span with tracestate", "span without"])
@pytest.mark.parametrize("name", ["tracestate", "TraceState"])
def test_a_tracestate_without_its_traceparent_is_discarded_for_the_active_spans_pair(tracer, span_state, name):
    """W3C trace context: a tracestate received without a traceparent is invalid and must be discarded.
    The message stores the active span's pair whole, never a caller's tracestate beside the span's
    traceparent (a state that belongs to no parent), whether or not the span has a tracestate."""
    with tracer.start_as_current_span("view", context=remote_parent(span_state)) as span:
        message = outbox.send("probe.ok", {}, headers={"tenant": "7", name: "mine=1"})
    expected = {"tenant": "7", "traceparent": traceparent(span)} | ({"tracestate": span_state} if span_state else {})
    assert message.headers == expected
    message.refresh_from_db()
    assert message.headers == expected


def test_a_callers_pair_is_kept_even_in_a_span_with_its_own_tracestate(tracer):
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with tracer.start_as_current_span("view", context=remote_parent("vendor=abc")):
        message = outbox.send("probe.ok", {}, headers={"traceparent": own, "TraceState": "mine=1"})
    message.refresh_from_db()
    assert message.headers == {"traceparent": own, "TraceState": "mine=1"}


def test_no_active_span_headers_are_stored_as_given(tracer):
    """send() takes no part in a trace outside a span; a lone tracestate is the receiver's to discard."""
    message = outbox.send("probe.ok", {}, headers={"tracestate": "mine=1"})
    message.refresh_from_db()
    assert message.headers == {"tracestate": "mine=1"}


def test_bad_headers_are_still_refused_by_send(tracer):
    with tracer.start_as_current_span("view"), pytest.raises(TypeError, match="headers must be a dict"):
        outbox.send("probe.ok", {}, headers=["traceparent"])


def by_name(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return sorted((s for s in spans if s["name"] == name), key=lambda s: s["start_time"])


def span_id(span: dict[str, Any]) -> str:
    return str(span["context"]["span_id"]).removeprefix("0x")


def trace_id(span: dict[str, Any]) -> str:
    return str(span["context"]["trace_id"]).removeprefix("0x")


def test_the_worker_continues_the_senders_trace_to_a_receiver_and_a_broker(tracer, worker_process, tmp_path):
    require_service("RabbitMQ", "127.0.0.1", 5672)
    prefix = unique_prefix()
    exchange = f"outbox.test.{prefix}"
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel: Any = connection.channel()
    channel.exchange_declare(exchange, "topic", durable=False, auto_delete=True)
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, exchange, f"{prefix}.#")
    receiver = HTTPServer()
    routes = {
        "TRANSPORTS": {
            "trace-hook": {
                "BACKEND": "django_outbox.transports.webhook.WebhookTransport",
                "OPTIONS": {"URL": receiver.url(), "SECRET": new_secret(), "ALLOWED_HOSTS": ["127.0.0.1"]},
            },
            "trace-rabbit": {
                "BACKEND": "django_outbox.transports.amqp.AMQPTransport",
                "OPTIONS": {"URL": AMQP_URL, "EXCHANGE": exchange},
            },
        },
        "ROUTES": {f"{prefix}.hook": "trace-hook", f"{prefix}.amqp.*": "trace-rabbit"},
    }
    outbox_settings = {
        **settings.OUTBOX,
        "TRANSPORTS": {**settings.OUTBOX["TRANSPORTS"], **routes["TRANSPORTS"]},
        "ROUTES": {**routes["ROUTES"], **settings.OUTBOX["ROUTES"]},  # what the worker's settings make of them
    }
    try:
        with override_settings(OUTBOX=outbox_settings), tracer.start_as_current_span("POST /orders") as view:
            ok = outbox.send("probe.ok", {})
            flaky = outbox.send("probe.flaky", {"fail_until": 1})
            hook = outbox.send(f"{prefix}.hook", {"n": 1})
        with (
            override_settings(OUTBOX=outbox_settings),
            tracer.start_as_current_span("POST /bulk") as bulk,
            transaction.atomic(),
        ):
            batch = [outbox.send(f"{prefix}.amqp.{n}", {"n": n}) for n in range(2)]
        spans_file = tmp_path / "spans.jsonl"
        env = {"OUTBOX_TEST_SPANS": str(spans_file), "OUTBOX_TEST_EXTRA_ROUTES": json.dumps(routes)}
        code, output = worker_process("--until-empty", "--batch-size", "10", env=env).wait(timeout=120)
        assert code == 0, output
        # --until-empty leaves what is scheduled for later: the failed attempt's retry, due after its backoff.
        wait_for(lambda: Message.objects.filter(pk=flaky.pk, available_at__lte=timezone.now()).exists(), timeout=10)
        code, output = worker_process("--until-empty", env=env).wait(timeout=120)  # a second worker retries it
        assert code == 0, output
        spans = read_spans(spans_file)
        view_trace, view_id = f"{view.get_span_context().trace_id:032x}", f"{view.get_span_context().span_id:016x}"

        (delivered,) = by_name(spans, "process probe.ok")
        assert trace_id(delivered) == view_trace
        assert delivered["parent_id"].removeprefix("0x") == view_id  # a child of the span that sent it
        assert delivered["kind"] == "SpanKind.CONSUMER"
        assert delivered["status"]["status_code"] == "UNSET"
        attributes = delivered["attributes"]
        assert attributes["messaging.system"] == "django_outbox"
        assert attributes["messaging.destination.name"] == "probe.ok"
        assert attributes["messaging.message.id"] == str(ok.uuid)
        assert attributes["messaging.operation.type"] == "process"
        assert "error.type" not in attributes

        flaky.refresh_from_db()
        assert flaky.status == "delivered", (flaky.status, flaky.attempts, output)
        failed, retried = by_name(spans, "process probe.flaky")  # one span per attempt
        assert [s["attributes"]["outbox.attempt"] for s in (failed, retried)] == [1, 2]
        assert failed["attributes"]["error.type"] == "ProbeFailure"
        assert failed["status"]["status_code"] == "ERROR"
        assert "error.type" not in retried["attributes"]
        assert {s["parent_id"].removeprefix("0x") for s in (failed, retried)} == {view_id}
        assert failed["attributes"]["messaging.message.id"] == str(flaky.uuid)

        (hook_span,) = by_name(spans, f"process {prefix}.hook")
        assert hook_span["attributes"]["messaging.message.id"] == str(hook.uuid)
        assert trace_id(hook_span) == view_trace
        (request,) = receiver.requests
        # The receiver's parent is the delivery span (the flags after it say it was sampled).
        assert request.headers["traceparent"].startswith(f"00-{view_trace}-{span_id(hook_span)}-")
        hook.refresh_from_db()
        assert hook.headers["traceparent"] == traceparent(view)  # what was stored is unchanged

        (batch_span,) = [s for s in spans if s["attributes"].get("messaging.batch.message_count") == 2]
        assert {(link["context"]["trace_id"], link["context"]["span_id"]) for link in batch_span["links"]} == {
            (f"0x{bulk.get_span_context().trace_id:032x}", f"0x{bulk.get_span_context().span_id:016x}")
        }
        assert len(batch_span["links"]) == 2  # one link per message delivered together
        received = []
        for method, properties, _ in channel.consume(queue, auto_ack=True, inactivity_timeout=5):
            if method is None:
                break
            received.append(properties.headers)
            if len(received) == 2:
                break
        channel.cancel()
        assert sorted(h["Outbox-Message-Id"] for h in received) == sorted(str(m.uuid) for m in batch)
        batch_context = f"00-{trace_id(batch_span)}-{span_id(batch_span)}-"
        assert [h["traceparent"][: len(batch_context)] for h in received] == [batch_context, batch_context]
    finally:
        receiver.stop()
        channel.exchange_delete(exchange)
        connection.close()
