"""The worker's delivery spans (extra ``[otel]``): one ``process <topic>`` span per delivery attempt.

A message sent alone is delivered in a span that is a child of the span that sent it (the
``traceparent`` ``send()`` stored); a group a transport delivers in one call gets one span with a link
to each message's sender. During the call the messages' ``traceparent`` and ``tracestate`` headers are
the delivery span's, so the transports that pass headers on (webhook, RabbitMQ, NATS, Kafka, Redis)
hand the receiver the delivery span as its parent; the stored headers are not changed.

Attributes follow OpenTelemetry's messaging conventions: ``messaging.system`` ("django_outbox"),
``messaging.operation.type`` and ``.name`` ("process"), ``messaging.destination.name`` (the topic),
``messaging.message.id`` (the uuid), ``messaging.batch.message_count`` for a group, and ``error.type``
(the exception's class) when the attempt failed. The spans go wherever the process's tracer provider
sends them: configure the SDK in the worker's settings (docs/operating.md#tracing).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..worker.observer import Delivery, Observer
from .propagation import TRACEPARENT, TRACESTATE

if TYPE_CHECKING:
    from ..store.models import Message

logger = logging.getLogger("django_outbox.relay")

SYSTEM = "django_outbox"
_propagator = TraceContextTextMapPropagator()


def _sender_context(message: Message) -> Any:
    headers = message.headers if isinstance(message.headers, dict) else {}
    carrier = {k.lower(): v for k, v in headers.items() if isinstance(k, str) and isinstance(v, str)}
    return _propagator.extract(carrier) if TRACEPARENT in carrier else None


def _has_trace_headers(message: Message) -> bool:
    headers = message.headers
    if not headers and type(headers) is dict:  # most messages: no header at all
        return False
    if not isinstance(headers, dict):
        return True  # a row edited by hand: the span path decides what the call sees
    return any(not isinstance(k, str) or k.lower() in (TRACEPARENT, TRACESTATE) for k in headers)


class DeliveryTracer(Observer):
    def __init__(self) -> None:
        self.tracer = trace.get_tracer("django_outbox")
        self._provider_set = False
        self._local = threading.local()  # per delivery thread: whether this batch's spans are void

    def batch_started(self, batch: Sequence[Message]) -> None:
        """Decide once per batch, on its delivery thread, whether a span can change anything."""
        self._local.void = self._spans_are_void()

    def _spans_are_void(self) -> bool:
        """Whether every span of this thread's batch would be a no-op one: no tracer provider is configured
        (the API's own proxy stands in) and no span is active on this thread.

        The no-op span path cost about a fifth of a worker process's CPU per message (measured by profiling a drain,
        docs/performance.md). A provider can be set once per process, at any time: the batches that start
        after it get their spans, and the test stops for good.
        """
        if self._provider_set:
            return False
        if not isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
            self._provider_set = True
            return False
        return not trace.get_current_span().get_span_context().is_valid

    def wrap_delivery(self, group: Sequence[Message], transport: str, call: Delivery) -> Delivery:
        # A message with a trace header still takes the span path, which passes its sender's context on.
        if getattr(self._local, "void", False) and not any(_has_trace_headers(m) for m in group):
            return call
        topics = {m.topic for m in group}
        topic = next(iter(topics)) if len(topics) == 1 else None
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "outbox.transport": transport,
        }
        if topic is not None:
            attributes["messaging.destination.name"] = topic
        if len(group) == 1:
            attributes["messaging.message.id"] = str(group[0].uuid)
            attributes["outbox.attempt"] = group[0].attempts
            parent, links = _sender_context(group[0]), None
        else:
            attributes["messaging.batch.message_count"] = len(group)
            contexts = [_sender_context(m) for m in group]
            spans = [trace.get_current_span(c).get_span_context() for c in contexts if c is not None]
            parent, links = None, [Link(s) for s in spans if s.is_valid]
        name = f"process {topic}" if topic is not None else "process"

        def traced() -> Sequence[BaseException | None]:
            # The tracing's own failures must not become the attempt's: without a span, the call runs bare.
            with contextlib.ExitStack() as stack:
                try:
                    span = stack.enter_context(
                        self.tracer.start_as_current_span(
                            name,
                            context=parent,
                            kind=SpanKind.CONSUMER,
                            attributes=attributes,
                            links=links,
                            record_exception=False,
                            set_status_on_exception=False,
                        )
                    )
                    stack.callback(_swap_headers(group))
                except Exception:
                    logger.exception("could not start the delivery span; delivering without it")
                    stack.close()
                    return call()
                try:
                    results = call()
                except BaseException as exc:
                    _failed(span, exc)
                    raise
                failure = next((r for r in results if r is not None), None)
                if failure is not None:
                    _failed(span, failure)
                return results

        return traced


def _swap_headers(group: Sequence[Message]) -> Callable[[], None]:
    """Give the messages the current (delivery) span's trace headers; returns what puts theirs back.

    Headers that are not a dict (a row edited by hand) are left alone: nothing to add the context to.
    """
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    stored = [m.headers for m in group]

    def restore() -> None:
        for m, headers in zip(group, stored, strict=True):
            m.headers = headers

    try:
        for m in group:
            if isinstance(m.headers, dict) or m.headers is None:
                own = {k: v for k, v in (m.headers or {}).items() if str(k).lower() not in (TRACEPARENT, TRACESTATE)}
                m.headers = {**own, **carrier}
    except Exception:
        restore()
        raise
    return restore


def _failed(span: trace.Span, exc: BaseException) -> None:
    span.set_attribute("error.type", type(exc).__qualname__)
    span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
