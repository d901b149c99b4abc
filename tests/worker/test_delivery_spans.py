"""The delivery span in process: what a handler sees during the call, and rows the tracing cannot use."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from django_outbox import outbox
from django_outbox.models import Message
from django_outbox.observability.tracing import DeliveryTracer
from django_outbox.worker import Relay, RelayConfig
from tests.support.tracing import memory_exporter, traceparent

pytestmark = pytest.mark.django_db


def drain() -> None:
    Relay(RelayConfig.from_settings(until_empty=True, notify=False), observers=[DeliveryTracer()]).drain()


def test_during_the_call_the_message_carries_the_delivery_spans_context(handler):
    exporter = memory_exporter()
    seen: list[dict[str, str]] = []
    handler("spans.*", lambda m: seen.append(dict(m.headers)))
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # the caller's pair, kept as given
    with trace.get_tracer("tests").start_as_current_span("view") as view:
        message = outbox.send("spans.one", {}, headers={"tenant": "7", "traceparent": own, "tracestate": "x=1"})
    exporter.clear()
    drain()
    (span,) = exporter.get_finished_spans()
    assert span.name == "process spans.one"
    assert span.parent is not None and span.parent.span_id == int(own.split("-")[2], 16)
    assert span.get_span_context().trace_id != view.get_span_context().trace_id
    # The delivery span inherits the sender's tracestate, as W3C trace context asks.
    assert seen == [{"tenant": "7", "tracestate": "x=1", "traceparent": traceparent(span)}]
    message.refresh_from_db()
    assert message.status == "delivered"
    assert message.headers == {"tenant": "7", "traceparent": own, "tracestate": "x=1"}


def test_headers_the_tracing_cannot_use_are_left_alone(handler):
    exporter = memory_exporter()
    seen: list[object] = []
    handler("spans.*", lambda m: seen.append(m.headers))
    message = outbox.send("spans.odd", {})
    Message.objects.filter(pk=message.pk).update(headers=["edited", "by", "hand"])
    broken = outbox.send("spans.broken", {})
    Message.objects.filter(pk=broken.pk).update(headers={"traceparent": "00-not-a-trace-01"})
    exporter.clear()
    drain()
    assert seen[0] == ["edited", "by", "hand"]
    assert set(Message.objects.values_list("status", flat=True)) == {"delivered"}
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["process spans.broken"].parent is None  # an unreadable traceparent starts a new trace


@pytest.fixture
def no_tracer_provider(monkeypatch):
    """The process as a worker without an SDK sees it: the API's proxy provider, whatever a test set before."""
    monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER", raising=False)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)


def test_without_a_tracer_provider_the_call_runs_bare(no_tracer_provider, handler):
    seen: list[dict[str, str]] = []
    handler("spans.*", lambda m: seen.append(dict(m.headers)))
    tracer = DeliveryTracer()
    plain = outbox.send("spans.plain", {}, headers={"tenant": "7"})
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    sent = outbox.send("spans.sent", {}, headers={"TraceParent": parent})

    def call() -> list[BaseException | None]:
        return [None]

    tracer.batch_started([plain, sent])
    assert tracer.wrap_delivery([plain], "handler", call) is call
    # A trace header is the span path's to pass on: the no-op span carries the sender's context.
    assert tracer.wrap_delivery([plain, sent], "handler", call) is not call
    drain()
    assert sorted(seen, key=len) == [
        {"tenant": "7"},
        {"traceparent": parent},
    ]
    assert set(Message.objects.values_list("status", flat=True)) == {"delivered"}


def test_an_active_span_or_a_provider_set_later_gets_the_span_path(no_tracer_provider, monkeypatch):
    tracer = DeliveryTracer()
    message = Message(topic="spans.late", headers={})

    def call() -> list[BaseException | None]:
        return [None]

    tracer.batch_started([message])
    assert tracer.wrap_delivery([message], "handler", call) is call
    remote = trace.NonRecordingSpan(
        trace.SpanContext(trace_id=1, span_id=2, is_remote=True, trace_flags=trace.TraceFlags(1))
    )
    with trace.use_span(remote):
        tracer.batch_started([message])
        assert tracer.wrap_delivery([message], "handler", call) is not call
    tracer.batch_started([message])
    assert tracer.wrap_delivery([message], "handler", call) is call
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", TracerProvider())  # what set_tracer_provider() leaves
    tracer.batch_started([message])
    assert tracer.wrap_delivery([message], "handler", call) is not call
    # A tracer whose batches were never announced keeps the span path.
    assert DeliveryTracer().wrap_delivery([message], "handler", call) is not call
